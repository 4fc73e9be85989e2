/* reply: the JSON, error, raw and event-stream answers of both HTTP servers
 * (see reply.h). */
#include "reply.h"

#include "buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum MHD_Result reply_json_h(struct MHD_Connection *conn, unsigned status, json_t *j, const char *hname,
			     const char *hvalue)
{
	char *s = json_dumps(j ? j : json_object(), JSON_COMPACT);
	struct MHD_Response *r;
	enum MHD_Result ret;

	json_decref(j);
	if (!s)
		return MHD_NO;
	r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(s);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "application/json");
	if (hname)
		MHD_add_response_header(r, hname, hvalue);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

enum MHD_Result reply_e2b_error(struct MHD_Connection *conn, unsigned status, const char *msg, const char *hname,
				const char *hvalue)
{
	return reply_json_h(conn, status, json_pack("{s:i, s:s}", "code", (int)status, "message", msg ? msg : ""),
			    hname, hvalue);
}

enum MHD_Result reply_json(struct MHD_Connection *conn, unsigned status, json_t *j)
{
	return reply_json_h(conn, status, j, NULL, NULL);
}

/* The body, whatever decided the status and code. */
static enum MHD_Result reply_error_wire(struct MHD_Connection *conn, unsigned status, const char *code,
					const char *msg, const char *hname, const char *hvalue)
{
	return reply_json_h(conn, status, json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg), hname,
			    hvalue);
}

enum MHD_Result reply_error_h(struct MHD_Connection *conn, enum kiln_errc code, const char *msg, const char *hname,
			      const char *hvalue)
{
	return reply_error_wire(conn, kiln_err_status(code), kiln_err_name(code), msg, hname, hvalue);
}

enum MHD_Result reply_error(struct MHD_Connection *conn, enum kiln_errc code, const char *msg)
{
	return reply_error_h(conn, code, msg, NULL, NULL);
}

enum MHD_Result reply_error_status(struct MHD_Connection *conn, unsigned status, enum kiln_errc code,
				   const char *msg)
{
	return reply_error_wire(conn, status, kiln_err_name(code), msg, NULL, NULL);
}

enum MHD_Result reply_err_status_h(struct MHD_Connection *conn, unsigned status, const struct kiln_err *e,
				   const char *hname, const char *hvalue)
{
	return reply_error_wire(conn, status, e->code[0] ? e->code : kiln_err_name(KERR_INTERNAL), e->message, hname,
				hvalue);
}

enum MHD_Result reply_err_status(struct MHD_Connection *conn, unsigned status, const struct kiln_err *e)
{
	return reply_err_status_h(conn, status, e, NULL, NULL);
}

enum MHD_Result reply_err(struct MHD_Connection *conn, const struct kiln_err *e)
{
	return reply_err_status(conn, kiln_err_status(e->errc != KERR_NONE ? e->errc : KERR_INTERNAL), e);
}

enum MHD_Result reply_too_many_streams(struct MHD_Connection *conn, unsigned max)
{
	char msg[160];

	snprintf(msg, sizeof(msg),
		 "%u streams and long-polls are open, your quota's max_streams: close one or retry later", max);
	return reply_error_h(conn, KERR_TOO_MANY_STREAMS, msg, "Retry-After", "5");
}

enum MHD_Result reply_not_found(struct MHD_Connection *conn, const char *what)
{
	return reply_error(conn, KERR_NOT_FOUND, what);
}

enum MHD_Result reply_method_not_allowed(struct MHD_Connection *conn, const char *allowed)
{
	char msg[64];

	snprintf(msg, sizeof(msg), "use %s", allowed);
	return reply_error_h(conn, KERR_METHOD_NOT_ALLOWED, msg, "Allow", allowed);
}

enum MHD_Result reply_internal(struct MHD_Connection *conn, const char *what)
{
	return reply_error(conn, KERR_INTERNAL, what);
}

enum MHD_Result reply_bytes(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
			    const char *content_type)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	if (body)
		r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	else
		r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	if (content_type)
		MHD_add_response_header(r, "Content-Type", content_type);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

enum MHD_Result reply_unauthorized(struct MHD_Connection *conn, const char *msg)
{
	return reply_error_h(conn, KERR_UNAUTHORIZED, msg, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
			     "Bearer");
}

enum MHD_Result reply_sse(struct MHD_Connection *conn, size_t block, MHD_ContentReaderCallback read, void *cls,
			  MHD_ContentReaderFreeCallback fini)
{
	struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, block, read, cls, fini);
	enum MHD_Result ret;

	if (!r) {
		fini(cls);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

ssize_t reply_sse_keepalive(char *buf, size_t max)
{
	static const char keepalive[] = ": keepalive\n\n";

	if (max < sizeof(keepalive) - 1)
		return 0;
	memcpy(buf, keepalive, sizeof(keepalive) - 1);
	return (ssize_t)(sizeof(keepalive) - 1);
}

int reply_sse_event(struct buf *b, const char *event, const char *data)
{
	return buf_printf(b, "event: %s\ndata: %s\n\n", event, data);
}
