/* textbuf: bounded output capture and UTF-8 sanitising of task output. */
#include "textbuf.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int textcap_append(struct textcap *c, const void *data, size_t n)
{
	const char *p = data;
	size_t h = 0;

	if (!c->keep)
		return buf_add(&c->head, p, n) < 0 ? -ENOMEM : (c->total += n, 0);
	if (c->head.len < c->keep) {
		h = c->keep - c->head.len < n ? c->keep - c->head.len : n;
		if (buf_add(&c->head, p, h) < 0)
			return -ENOMEM;
	}
	c->total += n;
	p += h;
	n -= h;
	if (!n)
		return 0;
	if (!c->ring && !(c->ring = malloc(c->keep)))
		return -ENOMEM;
	if (n > c->keep) { /* only the last keep bytes of this piece can stay */
		p += n - c->keep;
		n = c->keep;
	}
	while (n) {
		size_t k = c->keep - c->ring_pos < n ? c->keep - c->ring_pos : n;

		memcpy(c->ring + c->ring_pos, p, k);
		c->ring_pos = (c->ring_pos + k) % c->keep;
		c->ring_len = c->ring_len + k > c->keep ? c->keep : c->ring_len + k;
		p += k;
		n -= k;
	}
	return 0;
}

int textcap_cut(const struct textcap *c)
{
	return c->total > (uint64_t)c->head.len + c->ring_len;
}

/* The ring's bytes in order (oldest first), appended to out. */
static int ring_copy(const struct textcap *c, struct buf *out)
{
	size_t start = c->ring_len < c->keep ? 0 : c->ring_pos;

	if (!c->ring_len)
		return 0;
	if (buf_add(out, c->ring + start, c->ring_len - (c->ring_len < c->keep ? 0 : start)) < 0 ||
	    buf_add(out, c->ring, c->ring_len < c->keep ? 0 : start) < 0)
		return -ENOMEM;
	return 0;
}

int textcap_head(const struct textcap *c, struct buf *out)
{
	buf_init(out, 0);
	if (buf_add(out, c->head.p, c->head.len) < 0)
		return -ENOMEM;
	return textcap_cut(c) ? 0 : ring_copy(c, out);
}

int textcap_tail(const struct textcap *c, struct buf *out)
{
	buf_init(out, 0);
	return textcap_cut(c) ? ring_copy(c, out) : 0;
}

void textcap_free(struct textcap *c)
{
	buf_free(&c->head);
	free(c->ring);
	memset(c, 0, sizeof(*c));
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];

	if (c >= 0x01 && c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
			return 0;
		if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))
			return 0;
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
			return 0;
		if ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
			return 0;
		return 4;
	}
	return 0;
}

int textbuf_utf8_valid(const char *p, size_t n)
{
	const unsigned char *s = (const unsigned char *)p;

	for (size_t i = 0; i < n;) {
		size_t k = utf8_seq(s + i, n - i);

		if (!k)
			return 0;
		i += k;
	}
	return 1;
}

char *textbuf_to_utf8(const char *p, size_t n)
{
	const unsigned char *s = (const unsigned char *)p;
	size_t out_len = 0;
	char *out, *o;

	/* Measure first: output may hold up to 64 MiB, and sizing for the worst
	 * case (every byte a 3-byte U+FFFD) would triple that. */
	for (size_t i = 0; i < n;) {
		size_t k = utf8_seq(s + i, n - i);

		out_len += k ? k : 3;
		i += k ? k : 1;
		if (out_len > SIZE_MAX - 4)
			return NULL;
	}
	out = malloc(out_len + 1);
	if (!out)
		return NULL;
	o = out;
	for (size_t i = 0; i < n;) {
		size_t k = utf8_seq(s + i, n - i);

		if (k) {
			memcpy(o, s + i, k);
			o += k;
			i += k;
		} else {
			memcpy(o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	*o = '\0';
	return out;
}
