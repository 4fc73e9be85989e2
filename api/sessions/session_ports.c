/* session_ports: what the ports room (api/ports) asks of a session before
 * it opens a connection to one of its ports: the session's row, whether the
 * caller may reach it, and its live host (sessions.h, "port traffic"). */
#include "sessions_int.h"

#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>

#include "reply.h"

/* Whether tok is the sandbox's traffic token (constant time). */
static int traffic_ok(struct sessions *ss, const char *id, const char *tok)
{
	char want[65];
	int ok;

	if (!tok || strlen(tok) != 64)
		return 0;
	sessions_traffic_token(ss, id, want);
	ok = CRYPTO_memcmp(want, tok, 64) == 0;
	OPENSSL_cleanse(want, sizeof(want));
	return ok;
}

int sessions_port_target(struct sessions *ss, const char *id, const char *customer, int public_only,
			 const char *traffic_token, struct sessions_port_target *t, struct kiln_err *err)
{
	struct store_session *cur = &t->row;

	memset(t, 0, sizeof(*t));
	/* Unknown, ended, another customer's, or not open to the public: one
	 * answer for all, so that a caller learns nothing of others' ids. */
	if (strlen(id) >= sizeof(cur->id) || store_session_get(ss->st, id, customer, cur) < 0 ||
	    cur->state == SESSION_DESTROYED || (public_only && !cur->has_e2b_token))
		return kiln_err_set(err, KERR_NOT_FOUND, "no such session");
	/* E2B's allowPublicTraffic false: the traffic token, or nothing. */
	if (public_only && cur->private_traffic && !traffic_ok(ss, cur->id, traffic_token))
		return kiln_err_set(err, KERR_FORBIDDEN,
				    "this sandbox's ports are private: send its trafficAccessToken in e2b-traffic-access-token");
	if (cur->state == SESSION_PAUSING || cur->state == SESSION_PAUSED || cur->state == SESSION_RESUMING)
		return kiln_err_set(err, KERR_NOT_RUNNING, "session %s is paused: resume it first", cur->id);
	if (cur->state != SESSION_RUNNING)
		return kiln_err_set(err, KERR_NOT_RUNNING, "session %s is %s", cur->id, session_state_name(cur->state));
	if (sched_host_state(ss->sched, cur->host_id, t->host_url) != 1)
		return kiln_err_set(err, KERR_HOST_UNAVAILABLE, "the session's host cannot be reached");
	t->token = ss->token;
	return 0;
}

int sessions_port_resume(struct sessions *ss, struct MHD_Connection *conn, struct quota_limiter *lim,
			 const struct store_session *cur, enum MHD_Result *ret)
{
	struct sessions_request r = { .conn = conn, .method = "POST", .path = "", .customer = cur->customer,
				      .lim = lim, .e2b = 1 };
	unsigned t = cur->max_lifetime_s ? cur->max_lifetime_s : E2B_DEFAULT_TIMEOUT_S;

	/* As a connect without a timeout: it runs its own timeout again. */
	if (store_session_set_limits(ss->st, cur->id, cur->customer, t, t) < 0) {
		*ret = reply_e2b_error(conn, 500, "cannot store the timeout", NULL, NULL);
		return 0;
	}
	return sessions_resume_run(ss, &r, cur, ret);
}

void sessions_port_enter(struct sessions *ss, const char *id)
{
	sessions_op_enter_touch(ss, id);
}

void sessions_port_leave(struct sessions *ss, const char *id)
{
	sessions_op_leave_touch(ss, id);
}
