/* multipart: a streaming multipart/form-data parser (RFC 7578) for uploads
 * that must not be held in memory whole: bytes go in as they arrive, part
 * headers and data come out through callbacks. Every header line and the
 * number of parts are bounded; the parser is fuzzed. */
#ifndef KILN_MULTIPART_H
#define KILN_MULTIPART_H

#include <stddef.h>
#include <stdint.h>

#define MULTIPART_MAX_BOUNDARY 70   /* RFC 2046 */
#define MULTIPART_MAX_HEADERS 8192  /* bytes of one part's header block */
#define MULTIPART_MAX_PARTS 1024
#define MULTIPART_MAX_NAME 4096     /* name= and filename= values */

/* Take the boundary out of a Content-Type value ("multipart/form-data;
 * boundary=..." , quoted or not, any case for the type and parameter name).
 * 0, or -EINVAL when it is not multipart/form-data or the boundary is
 * missing, empty, longer than 70 bytes or holds characters RFC 2046 does not
 * allow. out holds MULTIPART_MAX_BOUNDARY + 1 bytes. */
int multipart_boundary(const char *content_type, char out[MULTIPART_MAX_BOUNDARY + 1]);

/* Callbacks; each returns 0 to go on or a negative errno, which stops the
 * parse and is returned by multipart_feed. name and filename are the
 * Content-Disposition parameters ("" when absent; filename's directory part
 * is kept as sent: the caller decides what a path may be). */
struct multipart_cb {
	int (*part_begin)(void *cls, const char *name, const char *filename);
	int (*part_data)(void *cls, const uint8_t *p, size_t n);
	int (*part_end)(void *cls);
};

struct multipart;

/* A parser for one body. NULL on ENOMEM. */
struct multipart *multipart_new(const char *boundary, const struct multipart_cb *cb, void *cls);
/* Feed the next n bytes of the body. 0, -EPROTO for a malformed body (a
 * header block over the bound, a header line without a colon, no
 * Content-Disposition: form-data, more than MULTIPART_MAX_PARTS parts), or a
 * callback's error. Bytes after the closing boundary (the epilogue) are
 * ignored, as RFC 2046 says. After an error every later call returns it
 * again. */
int multipart_feed(struct multipart *m, const uint8_t *p, size_t n);
/* The body ended: 0 when the closing boundary was seen, else -EPROTO. */
int multipart_finish(struct multipart *m);
void multipart_free(struct multipart *m);

#endif
