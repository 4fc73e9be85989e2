/* buf: the growable byte buffer (lib/buf.h). */
#include "buf.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int buf_reserve(struct buf *b, size_t n)
{
	size_t need, cap;
	char *p;

	if (b->max && (n > b->max || b->len > b->max - n))
		return -E2BIG;
	if (n > SIZE_MAX - 1 - b->len)
		return -ENOMEM;
	need = b->len + n + 1;
	if (need <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 4096;
	while (cap < need) {
		if (cap > SIZE_MAX / 2) {
			cap = need;
			break;
		}
		cap *= 2;
	}
	p = realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

int buf_add(struct buf *b, const void *data, size_t n)
{
	int rc = buf_reserve(b, n);

	if (rc < 0)
		return rc;
	if (n)
		memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = 0;
	return 0;
}

int buf_adds(struct buf *b, const char *s)
{
	return buf_add(b, s, strlen(s));
}

int buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
	va_list ap2;
	int n, rc;

	va_copy(ap2, ap);
	n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap2);
	va_end(ap2);
	if (n < 0)
		return -EINVAL;
	if (b->p && (size_t)n < b->cap - b->len) {
		if (b->max && b->len + (size_t)n > b->max) {
			b->p[b->len] = 0;
			return -E2BIG;
		}
		b->len += (size_t)n;
		return 0;
	}
	rc = buf_reserve(b, (size_t)n);
	if (rc < 0) {
		if (b->p)
			b->p[b->len] = 0;
		return rc;
	}
	vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	b->len += (size_t)n;
	return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = buf_vprintf(b, fmt, ap);
	va_end(ap);
	return rc;
}

void buf_consume(struct buf *b, size_t n)
{
	if (n >= b->len) {
		buf_reset(b);
		return;
	}
	memmove(b->p, b->p + n, b->len - n);
	b->len -= n;
	b->p[b->len] = 0;
}

char *buf_steal(struct buf *b, size_t *len)
{
	char *p = b->p;

	if (!p && !(p = calloc(1, 1)))
		return NULL;
	if (len)
		*len = b->len;
	b->p = 0;
	b->len = b->cap = 0;
	return p;
}

void buf_free(struct buf *b)
{
	free(b->p);
	b->p = 0;
	b->len = b->cap = 0;
}
