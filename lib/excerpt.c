/* excerpt: bounding the stdout/stderr of a task result (see excerpt.h). */
#include "excerpt.h"

#include <stdio.h>
#include <string.h>

/* The largest n <= max with s[n] not inside a UTF-8 sequence (s is valid
 * UTF-8: jansson strings are). */
static size_t cut_before(const char *s, size_t len, size_t max)
{
	size_t n = max < len ? max : len;

	while (n > 0 && n < len && ((unsigned char)s[n] & 0xc0) == 0x80)
		n--;
	return n;
}

static int excerpt_stream(json_t *r, const char *name, size_t keep)
{
	json_t *v = json_object_get(r, name), *tv;
	char key[40];
	const char *s;
	size_t len, h;
	int cut = 0;

	if (!json_is_string(v))
		return 0;
	s = json_string_value(v);
	len = json_string_length(v);
	snprintf(key, sizeof(key), "%s_tail", name);
	tv = json_object_get(r, key);
	if (len > keep) {
		json_t *head;

		h = cut_before(s, len, keep);
		if (!json_is_string(tv)) {
			/* The tail starts at the first character boundary in the last keep bytes. */
			size_t t = len - keep;

			while (t < len && ((unsigned char)s[t] & 0xc0) == 0x80)
				t++;
			json_object_set_new(r, key, json_stringn(s + t, len - t));
		}
		snprintf(key, sizeof(key), "%s_bytes", name);
		if (!json_is_integer(json_object_get(r, key)))
			json_object_set_new(r, key, json_integer((json_int_t)len));
		head = json_stringn(s, h); /* before v goes: s is v's */
		json_object_set_new(r, name, head);
		cut = 1;
	}
	snprintf(key, sizeof(key), "%s_tail", name);
	tv = json_object_get(r, key);
	if (json_is_string(tv) && json_string_length(tv) > keep) {
		const char *ts = json_string_value(tv);
		size_t tl = json_string_length(tv), t = tl - keep;

		while (t < tl && ((unsigned char)ts[t] & 0xc0) == 0x80)
			t++;
		json_object_set_new(r, key, json_stringn(ts + t, tl - t));
		cut = 1;
	}
	if (cut) {
		snprintf(key, sizeof(key), "%s_truncated", name);
		json_object_set_new(r, key, json_true());
	}
	return cut;
}

int excerpt_result(json_t *result, size_t keep)
{
	if (!json_is_object(result))
		return 0;
	return excerpt_stream(result, "stdout", keep) + excerpt_stream(result, "stderr", keep);
}
