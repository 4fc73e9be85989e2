/* reply: the HTTP answers of kiln-api and kiln-host over libmicrohttpd: JSON
 * bodies, the error body {"error":{"code","message"}} (docs/api.md,
 * "Errors"), raw bytes and server-sent event streams. Each call queues the
 * response on conn; callable from any connection thread. */
#ifndef KILN_REPLY_H
#define KILN_REPLY_H

#include <stddef.h>
#include <sys/types.h>

#include <jansson.h>
#include <microhttpd.h>

#include "err.h"

/* j (stolen; NULL: {}) as compact JSON. An optional extra header (hname
 * NULL: none). */
enum MHD_Result reply_json_h(struct MHD_Connection *conn, unsigned status, json_t *j, const char *hname,
			     const char *hvalue);
enum MHD_Result reply_json(struct MHD_Connection *conn, unsigned status, json_t *j);

/* E2B's error answer {"code":status,"message":msg} (docs/e2b.md), with an
 * optional header (hname NULL: none): kiln-api's /e2b control API, its envd
 * relay, and the session endpoints they share with /v1/sessions. */
enum MHD_Result reply_e2b_error(struct MHD_Connection *conn, unsigned status, const char *msg, const char *hname,
				const char *hvalue);

/* {"error":{"code","message"}} with the status lib/err.h's table gives the
 * code, optionally with one header (Retry-After, Allow, ...). */
enum MHD_Result reply_error_h(struct MHD_Connection *conn, enum kiln_errc code, const char *msg, const char *hname,
			      const char *hvalue);
enum MHD_Result reply_error(struct MHD_Connection *conn, enum kiln_errc code, const char *msg);
/* The same with a status of the caller's: for an answer that relays or
 * translates a host's (the table's status is kiln-host's own). */
enum MHD_Result reply_error_status(struct MHD_Connection *conn, unsigned status, enum kiln_errc code,
				   const char *msg);
/* From a kiln_err: its wire code ("internal" when it has none) and the
 * table's status for its code. */
enum MHD_Result reply_err(struct MHD_Connection *conn, const struct kiln_err *e);
/* From a kiln_err with a status of the caller's (a relayed answer's, or a
 * call site's that has always answered every code of its callee alike). */
enum MHD_Result reply_err_status(struct MHD_Connection *conn, unsigned status, const struct kiln_err *e);
enum MHD_Result reply_err_status_h(struct MHD_Connection *conn, unsigned status, const struct kiln_err *e,
				   const char *hname, const char *hvalue);
enum MHD_Result reply_not_found(struct MHD_Connection *conn, const char *what);
/* 405 with Allow: allowed. */
enum MHD_Result reply_method_not_allowed(struct MHD_Connection *conn, const char *allowed);
enum MHD_Result reply_internal(struct MHD_Connection *conn, const char *what);
/* 429 too_many_streams with Retry-After: the customer has max long-lived
 * requests (streams, long-polls) open already. */
enum MHD_Result reply_too_many_streams(struct MHD_Connection *conn, unsigned max);

/* Raw bytes: body (malloc'd, taken over and freed; NULL with len 0 for an
 * empty body) with content_type (NULL: none). */
enum MHD_Result reply_bytes(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
			    const char *content_type);

/* 401 unauthorized with WWW-Authenticate: Bearer. */
enum MHD_Result reply_unauthorized(struct MHD_Connection *conn, const char *msg);

/* 200 text/event-stream (Cache-Control: no-cache) whose body read() produces
 * until it returns MHD_CONTENT_READER_END_OF_STREAM, block bytes at most per
 * call. fini(cls) runs once however the stream ends (also when this fails:
 * cls is then freed through fini and MHD_NO returned). */
enum MHD_Result reply_sse(struct MHD_Connection *conn, size_t block, MHD_ContentReaderCallback read, void *cls,
			  MHD_ContentReaderFreeCallback fini);

/* The SSE comment line a quiet stream sends to show it is alive
 * (": keepalive\n\n") into buf when it fits in max: its length, else 0. */
ssize_t reply_sse_keepalive(char *buf, size_t max);

/* Append one event block "event: NAME\ndata: DATA\n\n" to b (DATA one line,
 * e.g. compact JSON). 0 or buf_add's negative errno (nothing appended). */
struct buf;
int reply_sse_event(struct buf *b, const char *event, const char *data);

#endif
