/* http: the kiln CLI's client for kiln-api (docs/api.md, "kiln-api") over
 * libcurl: JSON requests, the task event stream (SSE) and downloads of
 * presigned URLs. Every call is synchronous; the CLI is single-threaded. */
#ifndef KILN_CLI_HTTP_H
#define KILN_CLI_HTTP_H

#include <jansson.h>

#include "err.h"

/* Where the API is and which key to present (both borrowed). */
struct cli_conn {
	const char *api; /* "http://127.0.0.1:8080", no trailing slash needed */
	const char *key; /* Bearer key, may be NULL */
	const char *ca_file; /* PEM CA verifying an https:// API (NULL: the system's) */
};

/* One request to api + path with an optional JSON body. Returns the HTTP
 * status, with the parsed reply in *reply (NULL when it is not JSON; caller
 * decrefs), or -1 with err set (code "unreachable") when no answer came. */
int http_call(const struct cli_conn *c, const char *method, const char *path, json_t *body, long timeout_s,
	      json_t **reply, struct kiln_err *err);

/* "HTTP 401 unauthorized: unknown key" from a status and an API error reply. */
void http_describe_error(int status, json_t *reply, char *out, size_t size);

/* Follow api + path as server-sent events: on_event gets each event's name
 * and parsed data until the stream ends (0), the callback returns nonzero
 * (1) or the connection fails or is silent for stall_s (-1, err set; an HTTP
 * error status sets err from the API's error body). tick (may be NULL) is
 * called about every 200 ms while waiting, for progress displays; a nonzero
 * return aborts the stream (returns 1). */
int http_follow(const struct cli_conn *c, const char *path, long stall_s,
		int (*on_event)(void *ctx, const char *name, json_t *data), int (*tick)(void *ctx), void *ctx,
		struct kiln_err *err);

/* http_follow for any method with an optional JSON body (POST
 * /v1/sessions/{id}/exec?stream=1). */
int http_follow_body(const struct cli_conn *c, const char *method, const char *path, json_t *body, long stall_s,
		     int (*on_event)(void *ctx, const char *name, json_t *data), int (*tick)(void *ctx), void *ctx,
		     struct kiln_err *err);

/* A request with a raw body (a file to PUT): the HTTP status, with the
 * reply parsed as JSON in *reply when it is JSON (may be NULL; caller
 * decrefs), or -1 with err set (code "unreachable"). */
int http_send(const struct cli_conn *c, const char *method, const char *path, const void *body, size_t len,
	      const char *content_type, long timeout_s, json_t **reply, struct kiln_err *err);

/* A request whose body is the local file `file`, streamed from disk as it
 * goes (never held in memory; its size, taken when opened, is sent as
 * Content-Length). The HTTP status with the reply parsed in *reply when it is
 * JSON (may be NULL; caller decrefs), or -1 with err set: KERR_IO_ERROR when
 * the file cannot be opened or read, KERR_UNREACHABLE when no answer came.
 * tick (may be NULL) as in http_follow: progress displays. */
int http_send_file(const struct cli_conn *c, const char *method, const char *path, const char *file,
		   const char *content_type, long timeout_s, int (*tick)(void *ctx), void *ctx, json_t **reply,
		   struct kiln_err *err);

/* GET api + path (with the key) into the local file `local` ("-": stdout):
 * written to a temporary file beside it and renamed over it only on a 200.
 * Returns the HTTP status (the error reply in *reply when it is JSON), or -1
 * with err set. */
int http_get_file(const struct cli_conn *c, const char *path, const char *local, long timeout_s, json_t **reply,
		  struct kiln_err *err);

/* GET url (no Authorization: a presigned URL) from byte `from` on (a Range
 * request when from > 0) and write it to out as it arrives. 0 (also when
 * there is nothing from `from` on: 416), or -1 with err set. */
int http_stream_url(const char *url, unsigned long long from, FILE *out, long timeout_s, struct kiln_err *err);

/* GET url (no Authorization: a presigned URL) into path: written to a
 * temporary file beside it and renamed over it once complete. 0 or -1 with
 * err set. */
int http_download(const char *url, const char *path, long timeout_s, struct kiln_err *err);

#endif
