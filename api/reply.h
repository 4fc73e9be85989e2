/* reply: kiln-api's HTTP answers over libmicrohttpd: JSON bodies, the error
 * body {"error":{"code","message"}} (docs/api.md, "Errors"), raw bytes.
 * Shared by the HTTP layer (server.c) and the session endpoints
 * (sessions.c). Each call queues the response on conn; thread-safe. */
#ifndef KILN_API_REPLY_H
#define KILN_API_REPLY_H

#include <stddef.h>

#include <jansson.h>
#include <microhttpd.h>

#include "err.h"

/* j (stolen; NULL: {}) as compact JSON. An optional extra header (hname
 * NULL: none). */
enum MHD_Result reply_json_h(struct MHD_Connection *conn, unsigned status, json_t *j, const char *hname,
			     const char *hvalue);
enum MHD_Result reply_json(struct MHD_Connection *conn, unsigned status, json_t *j);

/* {"error":{"code","message"}}, optionally with one header (Retry-After, Allow, ...). */
enum MHD_Result reply_error_h(struct MHD_Connection *conn, unsigned status, const char *code, const char *msg,
			      const char *hname, const char *hvalue);
enum MHD_Result reply_error(struct MHD_Connection *conn, unsigned status, const char *code, const char *msg);
/* From a kiln_err ("internal" when it has no code). */
enum MHD_Result reply_err(struct MHD_Connection *conn, unsigned status, const struct kiln_err *e);
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

#endif
