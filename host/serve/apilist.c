/* apilist: kiln-api URLs for the heartbeat, parsed from the flag or the
 * config, and the rotation over them when a replica stops answering. */
#include "apilist.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* One URL, s[0..len), checked; the result is malloc'd without trailing '/'. */
static int url_take(const char *s, size_t len, const char *what, char **out, struct kiln_err *err)
{
	size_t scheme = 0, i;

	if (len >= 7 && !strncmp(s, "http://", 7))
		scheme = 7;
	else if (len >= 8 && !strncmp(s, "https://", 8))
		scheme = 8;
	if (!scheme)
		return kiln_err_set(err, KERR_USAGE, "%s: expected http:// or https:// URLs, separated by commas", what);
	if (len > APILIST_URL_MAX)
		return kiln_err_set(err, KERR_USAGE, "%s: a URL is longer than %d bytes", what, APILIST_URL_MAX);
	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		/* The heartbeat path is appended: a query or fragment would swallow it. */
		if (c <= ' ' || c == 0x7f || c == '?' || c == '#')
			return kiln_err_set(err, KERR_USAGE, "%s: a URL holds a space, control character, '?' or '#'",
					    what);
	}
	while (len > scheme && s[len - 1] == '/')
		len--;
	if (len == scheme || s[scheme] == '/')
		return kiln_err_set(err, KERR_USAGE, "%s: a URL has no host", what);
	*out = strndup(s, len);
	return *out ? 0 : kiln_err_set(err, KERR_INTERNAL, "out of memory");
}

int apilist_add(struct apilist *l, const char *s, const char *what, struct kiln_err *err)
{
	char *got[APILIST_MAX];
	unsigned n = 0;
	const char *p = s;

	for (;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);

		if (!len) {
			kiln_err_set(err, KERR_USAGE, "%s: an empty URL (two commas, or one at an end)", what);
			goto fail;
		}
		if (l->n + n >= APILIST_MAX) {
			kiln_err_set(err, KERR_USAGE, "%s: at most %d URLs", what, APILIST_MAX);
			goto fail;
		}
		if (url_take(p, len, what, &got[n], err) < 0)
			goto fail;
		n++;
		if (!comma)
			break;
		p = comma + 1;
	}
	memcpy(&l->url[l->n], got, n * sizeof(got[0]));
	l->n += n;
	return 0;
fail:
	while (n)
		free(got[--n]);
	return -1;
}

int apilist_add_json(struct apilist *l, const json_t *v, const char *what, struct kiln_err *err)
{
	struct apilist tmp = { .n = 0 };
	const json_t *e;
	size_t i;

	if (json_is_string(v)) {
		if (apilist_add(&tmp, json_string_value(v), what, err) < 0)
			goto fail;
	} else if (json_is_array(v) && json_array_size(v) > 0) {
		json_array_foreach(v, i, e) {
			if (!json_is_string(e)) {
				kiln_err_set(err, KERR_USAGE, "%s: expected a string or an array of strings", what);
				goto fail;
			}
			if (apilist_add(&tmp, json_string_value(e), what, err) < 0)
				goto fail;
		}
	} else {
		kiln_err_set(err, KERR_USAGE, "%s: expected a URL or a non-empty array of URLs", what);
		goto fail;
	}
	if (l->n + tmp.n > APILIST_MAX) {
		kiln_err_set(err, KERR_USAGE, "%s: at most %d URLs", what, APILIST_MAX);
		goto fail;
	}
	memcpy(&l->url[l->n], tmp.url, tmp.n * sizeof(tmp.url[0]));
	l->n += tmp.n;
	return 0;
fail:
	apilist_free(&tmp);
	/* A config file's error has the config code, as conf_take's have. */
	return kiln_err_recode(err, KERR_CONFIG);
}

enum apilist_outcome apilist_try(struct apilist *l, enum apilist_outcome (*send)(void *ctx, const char *base),
				 void *ctx)
{
	unsigned start = l->cur, i;
	enum apilist_outcome o = APILIST_NEXT;

	for (i = 0; i < l->n; i++) {
		unsigned k = (start + i) % l->n;

		o = send(ctx, l->url[k]);
		if (o != APILIST_NEXT) {
			l->cur = k;
			return o;
		}
	}
	if (l->n)
		l->cur = (start + 1) % l->n;
	return o;
}

int apilist_copy(struct apilist *dst, const struct apilist *src)
{
	unsigned i;

	memset(dst, 0, sizeof(*dst));
	for (i = 0; i < src->n; i++) {
		if (!(dst->url[i] = strdup(src->url[i]))) {
			apilist_free(dst);
			return -ENOMEM;
		}
		dst->n = i + 1;
	}
	dst->cur = src->n ? src->cur % src->n : 0;
	return 0;
}

void apilist_free(struct apilist *l)
{
	unsigned i;

	for (i = 0; i < l->n; i++)
		free(l->url[i]);
	memset(l, 0, sizeof(*l));
}
