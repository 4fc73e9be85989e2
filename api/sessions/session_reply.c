/* session_reply: how the session endpoints (sessions.c, session_run.c and,
 * through them, e2b.c) answer: kiln's error shape, or E2B's for the /e2b
 * endpoints; a host's answer passed on as it is. */
#include "sessions_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reply.h"

/* ---- answers: kiln's error shape, or E2B's for the /e2b endpoints ---- */

/* e with status (0: the table's), and an optional header; E2B's
 * {"code","message"} when r->e2b (create and resume are shared with e2b.c). */
enum MHD_Result sessions_answer_err(const struct sessions_request *r, unsigned status, const struct kiln_err *e,
				    const char *hname, const char *hvalue)
{
	if (!status)
		status = kiln_err_status(e->errc);
	if (r->capture) {
		r->capture->status = status;
		r->capture->err = *e;
		return MHD_YES;
	}
	if (r->e2b)
		return reply_e2b_error(r->conn, status, e->message, hname, hvalue);
	return hname ? reply_err_status_h(r->conn, status, e, hname, hvalue) : reply_err_status(r->conn, status, e);
}

enum MHD_Result sessions_answer(const struct sessions_request *r, unsigned status, enum kiln_errc code,
				const char *msg, const char *hname, const char *hvalue)
{
	struct kiln_err e = { .code = "" };

	kiln_err_set(&e, code, "%s", msg);
	return sessions_answer_err(r, status, &e, hname, hvalue);
}

/* ---- host answers ---- */

/* Pass a host's answer on as it is: its status, bytes and content type.
 * An error that is not kiln-host's JSON error gets one. For E2B, a host's
 * error becomes E2B's shape with the host's message. */
enum MHD_Result sessions_relay_to(const struct sessions_request *rq, struct MHD_Connection *conn,
				  struct hostclient_reply *r)
{
	char *body = r->body;

	if (rq && rq->capture) {
		char code[64], m[256];

		sessions_host_error_code(r, code, sizeof(code));
		sessions_host_error_message(r, m, sizeof(m));
		rq->capture->status = r->status >= 500 ? MHD_HTTP_BAD_GATEWAY : (unsigned)r->status;
		kiln_err_relay(&rq->capture->err, code, KERR_HOST_ERROR, "%s", m[0] ? m : "the host refused it");
		return MHD_YES;
	}
	if (rq && rq->e2b && r->status >= 400) {
		char msg[300], m[256];

		sessions_host_error_message(r, m, sizeof(m));
		if (!m[0])
			snprintf(m, sizeof(m), "the sandbox's host answered HTTP %d", r->status);
		snprintf(msg, sizeof(msg), "%s", m);
		return reply_e2b_error(conn, r->status >= 500 ? MHD_HTTP_BAD_GATEWAY : (unsigned)r->status, msg, NULL,
				       NULL);
	}
	if (r->status >= 400) {
		json_t *j = body ? json_loadb(body, r->len, 0, NULL) : NULL;
		int ok = json_is_object(json_object_get(j, "error"));

		json_decref(j);
		if (!ok) {
			char msg[96];

			snprintf(msg, sizeof(msg), "the session's host answered HTTP %d", r->status);
			return reply_error_status(conn, r->status >= 500 ? MHD_HTTP_BAD_GATEWAY : (unsigned)r->status,
						  KERR_HOST_ERROR, msg);
		}
	}
	r->body = NULL;
	return reply_bytes(conn, (unsigned)r->status, body, r->len,
			   r->content_type[0] ? r->content_type : (body ? "application/json" : NULL));
}

enum MHD_Result sessions_relay(struct MHD_Connection *conn, struct hostclient_reply *r)
{
	return sessions_relay_to(NULL, conn, r);
}

enum MHD_Result sessions_host_unavailable(struct MHD_Connection *conn, const char *why)
{
	char msg[600];

	snprintf(msg, sizeof(msg), "the session's host cannot be reached: %s", why);
	return reply_error_h(conn, KERR_HOST_UNAVAILABLE, msg, "Retry-After",
			     RETRY_AFTER_S);
}
