/* buf: the one growable byte buffer. Always NUL-terminated after its bytes
 * (p[len] == 0 once anything was added), so text can be used as a C string;
 * optionally capped (max > 0): an append past the cap fails with -E2BIG and
 * leaves the buffer as it was, so a caller reading from the network or the
 * guest bounds its memory by construction. Growth doubles from 4 KiB. Not
 * thread-safe; one owner. */
#ifndef KILN_BUF_H
#define KILN_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct buf {
	char *p;        /* NULL until something was added */
	size_t len;     /* bytes held, not counting the NUL */
	size_t cap;     /* bytes allocated */
	size_t max;     /* 0: unbounded; else len never exceeds max */
};

#define BUF_INIT {0, 0, 0, 0}

/* A buffer that will hold at most max bytes (0: no limit). */
static inline void buf_init(struct buf *b, size_t max)
{
	b->p = 0;
	b->len = b->cap = 0;
	b->max = max;
}

/* Make room for n more bytes (and the NUL). 0, -ENOMEM, or -E2BIG past max. */
int buf_reserve(struct buf *b, size_t n);

/* Append n bytes. 0, -ENOMEM or -E2BIG (nothing appended). */
int buf_add(struct buf *b, const void *data, size_t n);

/* Append a C string. */
int buf_adds(struct buf *b, const char *s);

/* Append printf-formatted text. 0, -ENOMEM, -E2BIG or -EINVAL (bad format). */
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int buf_vprintf(struct buf *b, const char *fmt, va_list ap);

/* Drop the first n bytes (n > len: all), moving the rest to the front. */
void buf_consume(struct buf *b, size_t n);

/* Empty it, keeping the allocation. */
static inline void buf_reset(struct buf *b)
{
	b->len = 0;
	if (b->p)
		b->p[0] = 0;
}

/* Hand the bytes to the caller (free() them; never NULL on success: an empty
 * buffer gives ""), leaving b empty. *len (may be NULL) gets the length.
 * NULL on allocation failure. */
char *buf_steal(struct buf *b, size_t *len);

/* Free the bytes; b is then empty and reusable (max kept). */
void buf_free(struct buf *b);

#endif
