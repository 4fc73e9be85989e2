/* session_ports: what the ports room (api/ports) asks of a session before
 * it opens a connection to one of its ports: the session's row, whether the
 * caller may reach it, and its live host (sessions.h, "port traffic"). */
#include "sessions_int.h"

#include <stdio.h>
#include <string.h>

int sessions_port_target(struct sessions *ss, const char *id, const char *customer, int public_only,
			 struct sessions_port_target *t, struct kiln_err *err)
{
	struct store_session *cur = &t->row;

	memset(t, 0, sizeof(*t));
	/* Unknown, ended, another customer's, or not open to the public: one
	 * answer for all, so that a caller learns nothing of others' ids. */
	if (strlen(id) >= sizeof(cur->id) || store_session_get(ss->st, id, customer, cur) < 0 ||
	    cur->state == SESSION_DESTROYED || (public_only && !cur->has_e2b_token))
		return kiln_err_set(err, KERR_NOT_FOUND, "no such session");
	if (cur->state == SESSION_PAUSING || cur->state == SESSION_PAUSED || cur->state == SESSION_RESUMING)
		return kiln_err_set(err, KERR_NOT_RUNNING, "session %s is paused: resume it first", cur->id);
	if (cur->state != SESSION_RUNNING)
		return kiln_err_set(err, KERR_NOT_RUNNING, "session %s is %s", cur->id, session_state_name(cur->state));
	if (sched_host_state(ss->sched, cur->host_id, t->host_url) != 1)
		return kiln_err_set(err, KERR_HOST_UNAVAILABLE, "the session's host cannot be reached");
	t->token = ss->token;
	return 0;
}

void sessions_port_enter(struct sessions *ss, const char *id)
{
	sessions_op_enter_touch(ss, id);
}

void sessions_port_leave(struct sessions *ss, const char *id)
{
	sessions_op_leave_touch(ss, id);
}
