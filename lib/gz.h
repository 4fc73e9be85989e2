/* gz: gzip content coding for HTTP bodies (RFC 9110 8.4.1), streamed and
 * bounded, over zlib. gz_in inflates a request body as it arrives and stops
 * at a limit on the bytes it gives out (a decompression bomb ends there, as
 * a plain body would); gz_out deflates an answer piece by piece;
 * gz_accept reads Accept-Encoding as E2B's envd does. */
#ifndef KILN_GZ_H
#define KILN_GZ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <zlib.h>

/* Inflate. Members may follow one another (RFC 1952; Go's reader, which
 * E2B's envd uses, takes them too). */
#define GZ_BLOCK (64 * 1024)

struct gz_in {
	z_stream z;
	uint64_t out, max; /* bytes given out, and the limit */
	int inited, ended; /* ended: the last member is complete */
	uint8_t *buf;      /* GZ_BLOCK bytes of output */
};

/* 0, or -ENOMEM. max: the most bytes gz_in_feed may give out in all. */
int gz_in_init(struct gz_in *g, uint64_t max);
/* Inflate p[0..n) and pass what comes out to sink (at most 64 KiB at a
 * time; a negative return stops and is returned). 0, -EFBIG past max (no
 * byte past it reaches sink), -EBADMSG for data that is not gzip, or the
 * sink's error. After an error, call only gz_in_free. */
int gz_in_feed(struct gz_in *g, const uint8_t *p, size_t n, int (*sink)(void *cls, const uint8_t *p, size_t n),
	       void *cls);
/* The body ended: 0 when its last member was whole, else -EBADMSG (an
 * empty body is not gzip either). */
int gz_in_finish(struct gz_in *g);
void gz_in_free(struct gz_in *g);

/* Deflate, gzip-framed. */
struct gz_out {
	z_stream z;
	int inited, ended;
};

int gz_out_init(struct gz_out *g);
/* Compress in[0..n) (*used: how much was taken) into out[0..cap); fin: no
 * input follows this one's, so the stream is ended once all of it is out
 * (call again with fin until gz_out_ended). The number of bytes written
 * to out (0 is possible while zlib gathers input), or -EIO. */
ssize_t gz_out_step(struct gz_out *g, const uint8_t *in, size_t n, size_t *used, int fin, uint8_t *out, size_t cap);
int gz_out_ended(const struct gz_out *g);
void gz_out_free(struct gz_out *g);

/* Accept-Encoding, as E2B's envd reads it: codings by quality (q=0 refuses
 * one; names in any case); the best of gzip, identity and "*" wins
 * ("*" means gzip only when identity is refused). 1: answer in gzip; 0:
 * as is (also with no header); -1: identity is refused and gzip is not
 * acceptable either (406). */
int gz_accept(const char *accept_encoding);

/* Content-Encoding of a request body: 0 none or identity, 1 gzip, -1
 * another (unsupported). */
int gz_content_encoding(const char *content_encoding);

#endif
