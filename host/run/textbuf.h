/* textbuf: the bounded capture of a task's stdout/stderr (struct textcap,
 * built on lib/buf.h's struct buf), and the conversion of arbitrary task
 * bytes into valid UTF-8 for JSON. */
#ifndef KILN_TEXTBUF_H
#define KILN_TEXTBUF_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* A bounded capture of one output stream: its first `keep` bytes (head), its
 * last `keep` bytes (tail, a ring) and its total length. keep 0 keeps
 * everything in head. Memory: at most 2 * keep bytes, whatever the stream's
 * length (the whole stream is the caller's to spool, e.g. to a log file). */
struct textcap {
	struct buf head;
	char *ring;
	size_t keep, ring_len, ring_pos; /* ring_pos: where the next byte goes */
	uint64_t total;
};

/* Append n bytes. Returns 0 or -ENOMEM. */
int textcap_append(struct textcap *c, const void *data, size_t n);

/* Whether the head and tail together are not the whole stream. */
int textcap_cut(const struct textcap *c);

/* The stream when it is not cut (head then tail), else its head: bytes into
 * out (freshly allocated, caller frees with buf_free). 0 or -ENOMEM. */
int textcap_head(const struct textcap *c, struct buf *out);

/* The last `keep` bytes when the stream is cut (else empty), in order. */
int textcap_tail(const struct textcap *c, struct buf *out);

void textcap_free(struct textcap *c);

/* A NUL-terminated copy of p[0..n) that is valid UTF-8: each byte that does not
 * start a well-formed sequence becomes U+FFFD, NUL bytes become U+FFFD too (a C
 * string cannot hold them). Caller frees; NULL on allocation failure. */
char *textbuf_to_utf8(const char *p, size_t n);

/* 1 when p[0..n) is well-formed UTF-8 without NUL bytes (what jansson takes
 * as a string), else 0. */
int textbuf_utf8_valid(const char *p, size_t n);

#endif
