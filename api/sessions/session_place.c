/* session_place: putting a session's VM on a host, for create and resume
 * alike (see sessions_int.h). The first host is picked by the caller
 * (its answer when none fits is the caller's); from there one loop tries
 * hosts by the scheduler's rules until one takes it, one refuses it
 * outright, or MAX_ATTEMPTS hosts have been tried. */
#include "sessions_int.h"

#include <stdio.h>
#include <string.h>

int sessions_place_run(struct sessions *ss, const struct sched_need *need, const char *path, const char *body,
		       long timeout_ms, struct sessions_placement *p)
{
	struct kiln_err err = { .code = "" };
	char exclude[MAX_ATTEMPTS][65];
	int nex = 0;

	memset(&p->hr, 0, sizeof(p->hr));
	p->last[0] = '\0';
	for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
		char code[64], msg[256];
		int st;

		if (attempt && sched_place(ss->sched, need, exclude, nex, p->host, p->url) < 0)
			break;
		st = sessions_host_raw(ss, p->url, "POST", path, body, body ? strlen(body) : 0, "application/json",
				       timeout_ms, 1u << 20, &p->hr, &err);
		if (st == 201 || st == 200) {
			hostclient_reply_free(&p->hr);
			return 1;
		}
		sched_unplace(ss->sched, p->host, need);
		snprintf(exclude[nex++], sizeof(exclude[0]), "%s", p->host);
		if (st < 0) {
			/* A create may have happened there all the same: the reaper's
			 * reconciliation destroys it, since the store never says so. */
			snprintf(p->last, sizeof(p->last), "%s", err.message);
			hostclient_reply_free(&p->hr);
			continue;
		}
		if (st == 503 || st == 409) {
			/* Full (or an id it already has, from a request it answered
			 * too late): the next host. */
			sessions_host_error_code(&p->hr, code, sizeof(code));
			sessions_host_error_message(&p->hr, msg, sizeof(msg));
			if (st == 503)
				sched_host_full(ss->sched, p->host);
			snprintf(p->last, sizeof(p->last), "host %s: HTTP %d %s: %s", p->host, st, code, msg);
			hostclient_reply_free(&p->hr);
			continue;
		}
		/* Refused outright (a spec the host rejects, a snapshot it cannot
		 * read): not worth another host. */
		return 0;
	}
	memset(&p->hr, 0, sizeof(p->hr));
	return -1;
}
