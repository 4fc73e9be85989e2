/* artifacts: a task's small logs, which its host put inside manifest.json
 * rather than in objects of their own (one PUT for a small task: see
 * host/task/upload.c), served by kiln-api itself.
 *
 * A host reports such a log as {"inline": base64, "size", "sha256",
 * "s3_key": null}. kiln-api keeps that with the task; in answers it becomes
 * {"inline": true, "size", "sha256", "s3_key": null, "url"}, where url is
 * kiln-api's own GET /v1/tasks/ID/artifacts/NAME?expires=E&sig=S: signed
 * like an S3 presigned URL (HMAC-SHA256, valid presign_expiry_s), so that
 * it works without an API key, as every artifact's url does. The signing
 * key is derived from kiln-api's S3 secret key, which every replica shares:
 * a URL signed by one replica is good on all, and rotating the S3 secret
 * revokes every URL signed with it. */
#ifndef KILN_API_ARTIFACTS_H
#define KILN_API_ARTIFACTS_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>
#include <microhttpd.h>

#define ARTIFACT_NAME_MAX 32 /* "stdout.log", "stderr.log" */

/* The signing key for secret (kiln-api's S3 secret key): 32 bytes. */
void artifacts_key(const char *secret, unsigned char key[32]);

/* Every artifact of task ({"id", "artifacts": {...}}) that carries its
 * bytes ("inline": a string) gets "inline": true and a "url" under base
 * ("http://host:port", no trailing slash) signed with key, valid expires_s
 * from now; key NULL or base NULL: "url": null. Returns task. */
json_t *artifacts_sign(json_t *task, const char *base, const unsigned char *key, unsigned expires_s, time_t now);

/* Split "/v1/tasks/ID/artifacts/NAME" (no query): 1 with id and name
 * copied out, 0 when url is not such a path (or a part is too long). */
int artifacts_path(const char *url, char *id, size_t id_size, char name[ARTIFACT_NAME_MAX]);

/* Does sig (hex) sign (id, name, expires) with key, and is expires (decimal
 * Unix seconds) still ahead of now? Constant-time in sig. */
int artifacts_sig_ok(const unsigned char key[32], const char *id, const char *name, const char *expires,
		     const char *sig, time_t now);

/* A Range header value against a body of len bytes: 0 and [*first, *last]
 * (inclusive) for one satisfiable byte range ("bytes=A-B", "bytes=A-",
 * "bytes=-N"), 1 when it cannot be satisfied (starts past the end; 416), -1
 * when it is not one byte range this parser knows (the whole body is
 * answered, as RFC 9110 allows). Pure. */
int artifacts_range(const char *h, size_t len, size_t *first, size_t *last);

/* Answer the artifact name of task (as the store keeps it: "inline" is the
 * base64 the host sent): 200 with its bytes, 206 for a Range (bytes=A-B,
 * A-, -N: one range), 416 past its end, 404 when the task has no such
 * artifact or it is in S3 (its url says where), 500 when its inline bytes
 * are corrupt (not base64, or a size or sha256 that does not match). */
enum MHD_Result artifacts_reply(struct MHD_Connection *conn, json_t *task, const char *name);

#endif
