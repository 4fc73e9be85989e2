/* session_network: a running session's egress rules changed in place
 * (PUT /v1/sessions/{id}/network, and E2B's PUT /e2b/sandboxes/{id}/network
 * through e2b.c): checked as create checks them, applied by the session's
 * host (its PUT /v1/sessions/{id}/network), then written into the stored
 * spec, which every resume sends on, so that the session keeps them
 * wherever it runs next. */
#include "sessions_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"

#define NETWORK_TIMEOUT_MS 15000 /* the host waits up to 10 s for the sandbox's thread */

int sessions_network_check(json_t *network, struct kiln_err *err)
{
	struct task_spec ts;
	json_t *probe;
	char *text;
	int r;

	if (!json_is_object(network))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "expected the network object {\"egress\":\"allow\",\"allow\":[...]}");
	if (!json_object_get(network, "egress"))
		json_object_set_new(network, "egress", json_string("allow"));
	probe = json_pack("{s:[s], s:O}", "argv", "true", "network", network);
	text = probe ? json_dumps(probe, JSON_COMPACT) : NULL;
	json_decref(probe);
	if (!text)
		return kiln_err_set(err, KERR_INTERNAL, "out of memory");
	r = spec_parse(text, strlen(text), &ts, err);
	free(text);
	if (r < 0)
		return -1;
	r = ts.egress;
	spec_free(&ts);
	if (!r)
		return kiln_err_set(err, KERR_INVALID_SPEC,
				    "network.egress: a session with a network device keeps egress \"allow\" (\"allow\": [] "
				    "reaches nothing)");
	return 0;
}

int sessions_network_run(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
			 json_t *network, enum MHD_Result *ret)
{
	struct kiln_err err = { .code = "" };
	struct hostclient_reply hr;
	char url[256], path[96], msg[300], *spec_text, *body;
	struct quota q;
	json_t *spec;
	int hs, sr;

	if (cur->state != SESSION_RUNNING) {
		snprintf(msg, sizeof(msg), "the %s is %s: its network can be changed while it runs",
			 r->e2b ? "sandbox" : "session", session_state_name(cur->state));
		*ret = sessions_answer(r, 0, KERR_NOT_RUNNING, msg, NULL, NULL);
		return 0;
	}
	if (!cur->egress) {
		snprintf(msg, sizeof(msg),
			 "the %s has no network device (created without egress): its egress rules cannot be changed",
			 r->e2b ? "sandbox" : "session");
		*ret = sessions_answer(r, 0, KERR_NO_NETWORK, msg, NULL, NULL);
		return 0;
	}
	/* The account's egress, after what the session itself says: a session
	 * without a device is told so whatever the account may do. */
	if (store_customer_quota(ss->st, cur->customer, &q) < 0)
		quota_defaults(&q);
	if (!q.allow_egress) {
		*ret = sessions_answer(r, 0, KERR_EGRESS_NOT_ALLOWED,
				       "network.egress: network egress is not allowed for your account", NULL, NULL);
		return 0;
	}
	hs = sched_host_state(ss->sched, cur->host_id, url);
	if (hs != 1) {
		kiln_err_set(&err, KERR_HOST_UNAVAILABLE, "the session's host cannot be reached: %s",
			     hs == 0 ? "it is lost" : "it has not been heard from yet");
		*ret = sessions_answer_err(r, 0, &err, "Retry-After", RETRY_AFTER_S);
		return 0;
	}
	body = json_dumps(network, JSON_COMPACT);
	if (!body) {
		*ret = sessions_answer(r, 500, KERR_INTERNAL, "out of memory", NULL, NULL);
		return 0;
	}
	snprintf(path, sizeof(path), "/v1/sessions/%s/network", cur->id);
	/* One operation: a pause cannot take the session between the host's
	 * change and the store's. */
	sessions_op_enter(ss, cur->id);
	sessions_host_raw(ss, url, "PUT", path, body, strlen(body), "application/json", NETWORK_TIMEOUT_MS,
			  HOST_REPLY_MAX, &hr, &err);
	free(body);
	if (hr.status != 200) {
		sessions_op_leave(ss, cur->id);
		if (hr.status < 0) {
			kiln_err_set(&err, KERR_HOST_UNAVAILABLE, "the session's host cannot be reached: %.400s",
				     err.message);
			*ret = sessions_answer_err(r, 0, &err, "Retry-After", RETRY_AFTER_S);
		} else {
			*ret = sessions_relay_to(r, r->conn, &hr);
		}
		hostclient_reply_free(&hr);
		return 0;
	}
	hostclient_reply_free(&hr);
	spec_text = store_session_spec(ss->st, cur->id);
	spec = spec_text ? json_loads(spec_text, 0, NULL) : NULL;
	free(spec_text);
	if (!json_is_object(spec)) {
		json_decref(spec);
		spec = json_object();
	}
	json_object_set(spec, "network", network);
	spec_text = json_dumps(spec, JSON_COMPACT);
	json_decref(spec);
	sr = spec_text ? store_session_set_spec(ss->st, cur->id, spec_text) : -1;
	free(spec_text);
	sessions_op_leave(ss, cur->id);
	if (sr != 1) {
		/* The host has the new rules; the stored spec would bring the
		 * old ones back on a resume. Said, not hidden. */
		fprintf(stderr, "kiln-api: session %s: its host applied new egress rules but the store did not take "
				"them (%s)\n", cur->id, sr == 0 ? "the session is gone" : "store error");
		*ret = sessions_answer(r, 500, KERR_STORE_ERROR,
				       "the host applied the rules but they could not be stored: send them again", NULL,
				       NULL);
		return 0;
	}
	return 1;
}
