/* textbuf: a growable byte buffer for captured stdout/stderr, and the
 * conversion of arbitrary task bytes into valid UTF-8 for JSON. */
#ifndef KILN_TEXTBUF_H
#define KILN_TEXTBUF_H

#include <stddef.h>

struct textbuf {
	char *p;
	size_t len, cap;
};

/* Append n bytes. Returns 0 or -ENOMEM. */
int textbuf_append(struct textbuf *b, const void *data, size_t n);
void textbuf_free(struct textbuf *b);

/* A NUL-terminated copy of p[0..n) that is valid UTF-8: each byte that does not
 * start a well-formed sequence becomes U+FFFD, NUL bytes become U+FFFD too (a C
 * string cannot hold them). Caller frees; NULL on allocation failure. */
char *textbuf_to_utf8(const char *p, size_t n);

/* 1 when p[0..n) is well-formed UTF-8 without NUL bytes (what jansson takes
 * as a string), else 0. */
int textbuf_utf8_valid(const char *p, size_t n);

#endif
