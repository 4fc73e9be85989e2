/* s3: a small S3 client over libcurl (CURLOPT_AWS_SIGV4): put objects with
 * their SHA-256 checked by the server, multipart upload for large files,
 * head/get/delete, bucket creation, and presigned GET URLs. Every call is
 * synchronous and thread-safe (each uses its own curl handle); curl_global_init
 * must have run once before any thread calls in (s3_global_init). */
#ifndef KILN_S3_H
#define KILN_S3_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "err.h"
#include "netaddr.h"

#define S3_MULTIPART_THRESHOLD (16u << 20) /* files above this go up as multipart */
#define S3_PART_SIZE (16u << 20)

struct s3_config {
	const char *endpoint;   /* "http://127.0.0.1:8080" (path-style addressing) */
	const char *region;     /* "us-east-1" */
	const char *bucket;     /* "" when the endpoint itself names the bucket
				 * (virtual-hosted style: https://B.s3.amazonaws.com) */
	const char *access_key; /* may contain ':' (Swift's "test:tester") */
	const char *secret_key;
	long timeout_s;         /* per HTTP request; 0: 60 s. For requests that
				 * move a file (PUT of a file or part, GET to a
				 * file) it bounds a stall instead (below 1 KiB/s
				 * for this long), so big files are not cut off */
	int attempts;           /* tries per request for transient failures (5xx,
				 * connection errors) with backoff; 0: 3 */
	uint64_t multipart_threshold; /* 0: S3_MULTIPART_THRESHOLD */
	uint64_t part_size;     /* 0: S3_PART_SIZE (>= 5 MiB) */
	/* A customer's destination (dest_s3_config sets it): before each
	 * attempt the endpoint's host is resolved and every address checked
	 * (lib/netaddr.h), and every socket is checked again, at the address
	 * it is about to connect to, so that a later DNS answer cannot send
	 * the request elsewhere; no proxy. A refusal is "destination_forbidden"
	 * and is not retried. allow: the operator's exceptions (may be NULL). */
	int guarded;
	const struct netaddr_allow *allow;
};

/* Error codes set in kiln_err.code by the calls below:
 *   "s3_auth"        the server refused the credentials or the signature (403)
 *   "s3_unavailable" no connection, timeout, or 5xx after every attempt
 *   "s3_not_found"   no such key or bucket (404)
 *   "s3_error"       any other failure (the message names the HTTP status and
 *                    the S3 error code and message from the XML body)
 *   "io_error"       reading or writing the local file failed
 *   "destination_forbidden" (guarded configs) the endpoint resolves to, or a
 *                    connection would go to, an address destinations may
 *                    not reach                                             */

/* Object keys, for every call: 1-1024 bytes, no control characters, no
 * empty, "." or ".." segments between slashes (refused with "s3_error":
 * libcurl and servers would normalise them differently); other bytes are
 * percent-encoded. A content_type may be NULL, else 1-127 printable ASCII
 * bytes. Keys and paths appear in messages as printable ASCII ('?' for other
 * bytes), so messages are always valid UTF-8. */

/* curl_global_init; call once from main before threads start. */
int s3_global_init(void);

/* Create the bucket if it does not exist (200 or 409 "owned by you" are fine). */
int s3_ensure_bucket(const struct s3_config *c, struct kiln_err *err);

/* Upload the file at path as key. The payload's SHA-256 is sent as
 * x-amz-content-sha256 so that the server checks it; files above the multipart
 * threshold go up as a multipart upload (each part's SHA-256 checked; the
 * upload is aborted on failure). The file is streamed from disk in two passes
 * per part (hash, then send; a multipart upload hashes the next part on a
 * helper thread meanwhile), never held in memory. sha256_hex (65 bytes, may be
 * NULL) receives the whole file's SHA-256. bytes_sent (may be NULL) is
 * incremented by the request bytes put on the wire, retries included, also
 * when the call fails. */
int s3_put_file(const struct s3_config *c, const char *key, const char *path, const char *content_type,
		char sha256_hex[65], uint64_t *bytes_sent, struct kiln_err *err);

/* Upload a memory buffer as key (single PUT, SHA-256 checked). */
int s3_put_buffer(const struct s3_config *c, const char *key, const void *buf, size_t len,
		  const char *content_type, struct kiln_err *err);

/* 1 if key exists (its size in *size, may be NULL), 0 if not, -1 on error. */
int s3_head(const struct s3_config *c, const char *key, uint64_t *size, struct kiln_err *err);

/* Download key into the file at path: written to a temporary name beside it
 * (PATH.s3tmp.XXXXXX), fsync'd and renamed over path (mode 0644) on success,
 * removed on failure; path is untouched unless the whole object arrived. */
int s3_get_file(const struct s3_config *c, const char *key, const char *path, struct kiln_err *err);

/* Call fn(ctx, key) for every key under prefix (ListObjectsV2, page after
 * page; fn returning non-zero stops the walk with that value). 0, or -1 with
 * err set. */
int s3_list(const struct s3_config *c, const char *prefix, int (*fn)(void *ctx, const char *key), void *ctx,
	    struct kiln_err *err);

/* One ListObjectsV2 page: fn(ctx, key) for each <Key> (decoded as by
 * s3_xml_text; keys longer than 1024 bytes are refused); when
 * <IsTruncated>true, the NextContinuationToken goes to token (token_size
 * bytes). Returns 1 (more pages), 0 (the last), or -1 (malformed, or fn
 * returned non-zero). Pure, thread-safe. */
int s3_list_parse(const char *xml, size_t len, int (*fn)(void *ctx, const char *key), void *ctx, char *token,
		  size_t token_size);

/* Download key into fd (at its current offset; a memfd, say): no temporary
 * file, no fsync. On failure fd may hold part of the object. */
int s3_get_fd(const struct s3_config *c, const char *key, int fd, struct kiln_err *err);

/* Delete key (a missing key is not an error). */
int s3_delete(const struct s3_config *c, const char *key, struct kiln_err *err);

/* A presigned GET URL for key (SigV4 query signing, UNSIGNED-PAYLOAD, only
 * the host header signed), valid expires_s (1..604800) seconds from now
 * (the caller's clock; pass time(NULL)). Computed locally, no request made.
 * Returns a malloc'd string (caller frees) or NULL (err set). */
char *s3_presign_get(const struct s3_config *c, const char *key, unsigned expires_s, time_t now,
		     struct kiln_err *err);

/* 0 when key is one kiln can write: 1..S3_MAX_KEY bytes, no control
 * characters, no empty, "." or ".." segments; else -1 with err set
 * ("s3_error", naming the problem). Every call above checks its key so. */
int s3_key_check(const char *key, struct kiln_err *err);

/* 0 when key passes s3_key_check and lies under prefix (non-empty, ending
 * in '/'), and still does so once percent-decoded (a server or proxy on the
 * way that decodes a key once more must not find "..", an empty segment or
 * another prefix in it); else -1 with err ("s3_key_outside", naming the
 * problem). For keys someone else reports (a host's outputs), before
 * anything is signed for them. */
int s3_key_under(const char *key, const char *prefix, struct kiln_err *err);

/* Percent-encode an object key for a URL path: everything but unreserved
 * characters and '/'. Returns a malloc'd string or NULL. */
char *s3_encode_key(const char *key);

/* ---- building blocks, exported for the tests and the fuzzer ---- */

struct s3_param {
	const char *name;  /* unreserved characters only (every S3 parameter is) */
	const char *value; /* NULL or "" is written as "name=" */
};

/* The query string as SigV4 signs it (and as libcurl must send it, since
 * curl signs the query exactly as written): parameters sorted by name, then
 * value; names and values percent-encoded (everything but unreserved
 * characters, '/' too, uppercase hex); "name=" for empty values; joined with
 * '&'. At most 64 parameters. Returns a malloc'd string ("" for none) or NULL. */
char *s3_canonical_query(const struct s3_param *params, size_t n);

#define S3_XML_MAX (1u << 20) /* longest XML document s3_xml_text looks at */

/* The text of the first element <tag>...</tag> (attributes allowed, "<tag/>"
 * skipped) in xml[0..len), which need not be NUL-terminated, for S3's error
 * bodies (Code, Message) and InitiateMultipartUploadResult (UploadId). The
 * text must be character data only (no child elements or CDATA). The five
 * predefined entities and numeric references are decoded; every byte outside
 * printable ASCII becomes '?' (tab/CR/LF a space), so the result is safe in
 * messages, logs and JSON. Writes at most out_size-1 bytes and a NUL (out is
 * "" on failure). Returns the text's full decoded length (may exceed what
 * fitted) or -1 when there is no such element, it is not closed, len exceeds
 * S3_XML_MAX or tag is empty or longer than 64. Pure function, thread-safe. */
int s3_xml_text(const char *xml, size_t len, const char *tag, char *out, size_t out_size);

#endif
