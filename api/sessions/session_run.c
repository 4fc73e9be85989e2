/* session_run: creating and resuming a session, for POST /v1/sessions,
 * POST /v1/sessions/{id}/resume and E2B's create, connect and resume
 * (e2b.c) alike: admission (quotas, the submit rate), the template
 * resolved to its TREF, the volumes by name (the host's spec gets their ids
 * and sizes; the mounts go in with the row under the one-writer rule),
 * placement on a host with retries (session_place.c) and the row kept in
 * the store (see sessions_int.h). */
#include "sessions_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "base/base.h"
#include "reply.h"
#include "templates/templates.h"

static enum MHD_Result no_room(const struct sessions_request *rq, int r, const struct sched_need *need)
{
	char msg[200];

	if (r == -EBUSY) {
		snprintf(msg, sizeof(msg), "no host has room for %u vCPUs and %u MiB now: retry later", need->vcpus,
			 need->memory_mib);
		return sessions_answer(rq, 0, KERR_NO_CAPACITY, msg, "Retry-After", RETRY_AFTER_S);
	}
	if (r == -ENOENT)
		return sessions_answer(rq, 0, KERR_NO_HOST, "no host is live", "Retry-After", RETRY_AFTER_S);
	snprintf(msg, sizeof(msg), "no registered host has %u vCPUs and %u MiB of memory%s%s%s", need->vcpus,
		 need->memory_mib, need->egress ? " and offers network egress" : "",
		 need->tkey && need->tkey[0] == '@' ? " and the built-in template " : "",
		 need->tkey && need->tkey[0] == '@' ? need->tkey + 1 : "");
	return sessions_answer(rq, 0, KERR_NO_HOST_FITS, msg, NULL, NULL);
}

/* Submit rate and the running quota, checked before a host is picked (the
 * store checks the quota again, in the transaction that takes it). */
static enum MHD_Result admit(struct sessions *ss, const struct sessions_request *r, const struct quota *q,
			     unsigned vcpus, unsigned memory_mib, int *refused)
{
	struct kiln_err err = { .code = "" };
	struct usage u;
	int64_t retry_ms;

	*refused = 1;
	if (!quota_limiter_take(r->lim, r->customer, q->submit_rate, q->submit_burst, kclock_mono_ms(ss->clock), &retry_ms)) {
		char ra[24], msg[160];

		snprintf(ra, sizeof(ra), "%lld", (long long)(retry_ms > 1000 ? (retry_ms + 999) / 1000 : 1));
		snprintf(msg, sizeof(msg), "more than %g submissions per second (burst %u): retry in %s s", q->submit_rate,
			 q->submit_burst, ra);
		return sessions_answer(r, 0, KERR_RATE_LIMITED, msg, "Retry-After", ra);
	}
	if (store_customer_usage(ss->st, r->customer, &u) < 0)
		return sessions_answer(r, 0, KERR_INTERNAL, "cannot read the usage", NULL, NULL);
	if (quota_check_start(q, &u, vcpus, memory_mib, &err) < 0)
		return sessions_answer_err(r, MHD_HTTP_TOO_MANY_REQUESTS, &err, r->e2b ? "Retry-After" : NULL, RETRY_AFTER_S);
	*refused = 0;
	return MHD_YES;
}

/* The scheduler's key of a resolved template (store_task.tkey) in buf, or
 * NULL for the default. */
static const char *tkey_of(const struct template_use *u, char buf[72])
{
	if (!u->template_ref)
		return NULL;
	if (u->use.builtin)
		snprintf(buf, 72, "@%s", u->row.name);
	else
		snprintf(buf, 72, "%s", u->row.sha256);
	return buf;
}

/* A host request body gets the TREF (text; NULL: none) as "template". */
static void with_template_ref(json_t *body, const char *ref)
{
	json_t *j = ref ? json_loads(ref, 0, NULL) : NULL;

	if (body && j)
		json_object_set_new(body, "template", j);
	else
		json_decref(j);
}

/* The scheduler's key of a TREF's text (ref may be NULL: none) in buf, or
 * NULL for the default: its sha256, or "@" + a built-in's name. */
static const char *tkey_of_ref(const char *ref, char buf[72])
{
	json_t *tj = ref ? json_loads(ref, 0, NULL) : NULL;

	if (!tj)
		return NULL;
	if (json_is_true(json_object_get(tj, "builtin")))
		snprintf(buf, 72, "@%s", json_string_value(json_object_get(tj, "name")) ?: "");
	else
		snprintf(buf, 72, "%s", json_string_value(json_object_get(tj, "sha256")) ?: "");
	json_decref(tj);
	return buf;
}

/* What a new session is made of: the request's own spec and template, or
 * a snapshot's (sr->snapshot): its spec, limits, template and the host it
 * was taken on (placement prefers it: the chunks may be cached there). */
struct create_src {
	const char *spec;            /* borrowed from sr, or snap_spec */
	char *snap_spec;
	unsigned vcpus, memory_mib;
	int egress;
	struct template_use tu;      /* the request's template (no snapshot) */
	char *snap_ref;              /* the snapshot's TREF text (NULL: the default) */
	const char *ref;             /* the TREF sent to hosts: tu's or snap_ref */
	char tkey[72];
	char prefer[65];
	char *vol_spec;              /* the request's spec with its "volumes" for hosts (owned) */
	struct store_volume_mount mounts[STORE_SESSION_VOLUMES_MAX]; /* recorded with the row */
	unsigned nmounts;
};

static void create_src_free(struct create_src *c)
{
	template_use_free(&c->tu);
	free(c->snap_spec);
	free(c->snap_ref);
	free(c->vol_spec);
}

/* The request's volumes by name (the customer's, not deleted) into c's
 * mounts, and c->spec with the host's "volumes" [{"id","path","read_only",
 * "size_mib"}]: 1, or 0 with the error answered (400: no such volume). */
static int volumes_resolve(struct sessions *ss, const struct sessions_request *r,
			   const struct api_session_request *sr, struct create_src *c, enum MHD_Result *ret)
{
	json_t *spec, *vols;

	if (!sr->nvolumes)
		return 1;
	spec = json_loads(c->spec ? c->spec : "{}", 0, NULL);
	vols = json_array();
	for (unsigned i = 0; spec && vols && i < sr->nvolumes && i < STORE_SESSION_VOLUMES_MAX; i++) {
		struct store_volume_mount *m = &c->mounts[i];
		struct store_volume v;
		char msg[200];
		int g = store_volume_get(ss->st, sr->volumes[i].name, r->customer, &v);

		if (g < 0) {
			json_decref(spec);
			json_decref(vols);
			if (g == -ENOENT)
				snprintf(msg, sizeof(msg), "volumes[%u].name: no volume named %s (POST /v1/volumes first)", i,
					 sr->volumes[i].name);
			else
				snprintf(msg, sizeof(msg), "cannot read the volumes");
			*ret = sessions_answer(r, 0, g == -ENOENT ? KERR_INVALID_REQUEST : KERR_STORE_ERROR, msg, NULL, NULL);
			return 0;
		}
		memset(m, 0, sizeof(*m));
		snprintf(m->volume_id, sizeof(m->volume_id), "%s", v.id);
		snprintf(m->name, sizeof(m->name), "%s", v.name);
		snprintf(m->path, sizeof(m->path), "%s", sr->volumes[i].path);
		m->read_only = sr->volumes[i].read_only;
		c->nmounts++;
		json_array_append_new(vols, json_pack("{s:s, s:s, s:b, s:i}", "id", v.id, "path", m->path, "read_only",
						      m->read_only, "size_mib", (int)v.size_mib));
	}
	if (spec && vols)
		json_object_set_new(spec, "volumes", vols);
	else
		json_decref(vols);
	c->vol_spec = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
	json_decref(spec);
	if (!c->vol_spec) {
		*ret = sessions_answer(r, 0, KERR_INTERNAL, "out of memory", NULL, NULL);
		return 0;
	}
	c->spec = c->vol_spec;
	return 1;
}

/* A snapshot's spec's "volumes" (read-only ones: a checkpoint with a
 * read-write volume is refused) as c's mounts: its children mount them
 * too, and their rows say so. */
static void volumes_of_snapshot(struct create_src *c)
{
	json_t *spec = json_loads(c->spec ? c->spec : "{}", 0, NULL), *e;
	size_t i;

	json_array_foreach(json_object_get(spec, "volumes"), i, e) {
		struct store_volume_mount *m;
		const char *id = json_string_value(json_object_get(e, "id"));
		const char *path = json_string_value(json_object_get(e, "path"));

		if (!id || !path || c->nmounts >= STORE_SESSION_VOLUMES_MAX)
			continue;
		m = &c->mounts[c->nmounts++];
		memset(m, 0, sizeof(*m));
		snprintf(m->volume_id, sizeof(m->volume_id), "%s", id);
		snprintf(m->path, sizeof(m->path), "%s", path);
		m->read_only = json_is_true(json_object_get(e, "read_only"));
	}
	json_decref(spec);
}

/* Fill c for sr: 1, or 0 with the error answered. */
static int create_src_get(struct sessions *ss, const struct sessions_request *r, const struct api_session_request *sr,
			  struct create_src *c, const char **tkey, enum MHD_Result *ret)
{
	struct kiln_err err = { .code = "" };
	struct store_snapshot k;

	memset(c, 0, sizeof(*c));
	*tkey = NULL;
	if (!sr->snapshot[0]) {
		/* Its template, resolved now and kept with it (docs/templates.md). */
		if (template_resolve(ss->st, r->customer, sr->template_name[0] ? sr->template_name : NULL, &c->tu,
				     &err) < 0) {
			*ret = sessions_answer_err(r, 0, &err, NULL, NULL);
			return 0;
		}
		c->spec = sr->spec_json;
		c->vcpus = sr->vcpus;
		c->memory_mib = sr->memory_mib;
		c->egress = sr->egress;
		c->ref = c->tu.template_ref;
		*tkey = tkey_of(&c->tu, c->tkey);
		if (!volumes_resolve(ss, r, sr, c, ret)) {
			create_src_free(c);
			return 0;
		}
		return 1;
	}
	/* Another customer's, or deleted: no such snapshot. */
	if (store_snapshot_get(ss->st, sr->snapshot, r->customer, 0, &k) < 0) {
		*ret = sessions_answer(r, MHD_HTTP_NOT_FOUND, KERR_NOT_FOUND, "snapshot: no such snapshot", NULL, NULL);
		return 0;
	}
	c->snap_spec = store_snapshot_spec(ss->st, k.id);
	if (!c->snap_spec) {
		*ret = sessions_answer(r, 0, KERR_STORE_ERROR, "cannot read the snapshot", NULL, NULL);
		return 0;
	}
	c->spec = c->snap_spec;
	c->vcpus = k.vcpus;
	c->memory_mib = k.memory_mib;
	c->egress = k.egress;
	c->snap_ref = store_template_use_ref(ss->st, k.id);
	c->ref = c->snap_ref;
	*tkey = tkey_of_ref(c->snap_ref, c->tkey);
	snprintf(c->prefer, sizeof(c->prefer), "%s", k.host_id);
	volumes_of_snapshot(c);
	return 1;
}

int sessions_create_run(struct sessions *ss, const struct sessions_request *r, const struct quota *qp,
			const struct api_session_request *sr, const struct sessions_e2b_new *e2b, char id[40],
			enum MHD_Result *ret)
{
	struct kiln_err err = { .code = "" };
	struct sched_need need;
	struct sessions_placement p;
	struct create_src src;
	struct quota q = *qp;
	char host[65], url[256], path[96];
	const char *tkey;
	int refused, pr;

	id[0] = '\0';
	if (!create_src_get(ss, r, sr, &src, &tkey, ret))
		return 0;
	if (quota_check_task(&q, src.vcpus, src.memory_mib, 0, sr->output_mib, &err) < 0) {
		create_src_free(&src);
		*ret = sessions_answer_err(r, MHD_HTTP_BAD_REQUEST, &err, NULL, NULL);
		return 0;
	}
	if (src.egress && !q.allow_egress) {
		create_src_free(&src);
		*ret = sessions_answer(r, 0, KERR_EGRESS_NOT_ALLOWED,
				       "the snapshot's session has network egress, which your account is not allowed",
				       NULL, NULL);
		return 0;
	}
	*ret = admit(ss, r, &q, src.vcpus, src.memory_mib, &refused);
	if (refused) {
		create_src_free(&src);
		return 0;
	}
	need = (struct sched_need){ .vcpus = src.vcpus, .memory_mib = src.memory_mib, .egress = src.egress,
				    .tkey = tkey, .prefer = src.prefer[0] ? src.prefer : NULL };
	pr = sched_place_wait(ss->sched, &need, NULL, 0, host, url, PLACE_WAIT_MS);
	if (pr < 0) {
		create_src_free(&src);
		*ret = no_room(r, pr, &need);
		return 0;
	}
	{
		struct store_session_new n = {
			.customer = r->customer, .spec_json = src.spec, .metadata_json = sr->metadata_json,
			.vcpus = src.vcpus, .memory_mib = src.memory_mib, .idle_timeout_s = sr->idle_timeout_s,
			.max_lifetime_s = sr->max_lifetime_s, .egress = src.egress,
			.template_use = !sr->snapshot[0] && src.tu.template_ref ? &src.tu.use : NULL,
			.from_snapshot = sr->snapshot[0] ? sr->snapshot : NULL,
			.volumes = src.mounts, .nvolumes = src.nmounts,
		};
		/* With this process's lease (a request in flight) from the start:
		 * no replica's reaper takes it in starting for a leftover. */
		int cr = sessions_op_create(ss, &n, id, &err);

		if (cr < 0) {
			sched_unplace(ss->sched, host, &need);
			create_src_free(&src);
			/* -EBUSY volume_busy (409), -EINVAL a volume deleted meanwhile
			 * (400): the table's status. */
			*ret = sessions_answer_err(r, cr == -EDQUOT   ? MHD_HTTP_TOO_MANY_REQUESTS
						   : cr == -ENOENT ? MHD_HTTP_NOT_FOUND
						   : cr == -EBUSY || cr == -EINVAL ? 0
								   : MHD_HTTP_INTERNAL_SERVER_ERROR,
						   &err, cr == -EDQUOT && r->e2b ? "Retry-After" : NULL, RETRY_AFTER_S);
			return 0;
		}
	}
	if (e2b) {
		/* Its envd token, known before any host runs it (the relay checks it). */
		unsigned char sha[32];
		char tok[65];

		sessions_e2b_token(ss, id, tok);
		SHA256((const unsigned char *)tok, strlen(tok), sha);
		OPENSSL_cleanse(tok, sizeof(tok));
		if (store_session_set_e2b(ss->st, id, sha, e2b->template, e2b->env_json, e2b->auto_pause, e2b->flags) != 1) {
			store_session_discard(ss->st, id);
			sessions_op_leave(ss, id);
			sched_unplace(ss->sched, host, &need);
			create_src_free(&src);
			*ret = sessions_answer(r, 0, KERR_INTERNAL, "cannot store the sandbox", NULL, NULL);
			return 0;
		}
	}
	{
		json_t *spec = json_loads(src.spec, 0, NULL);
		json_t *body = json_pack("{s:s, s:o}", "customer", r->customer, "spec", spec ? spec : json_object());
		char *text;

		/* A new session from a snapshot is a resume of the snapshot under
		 * its new id (kiln-host's POST /v1/sessions/{id}/resume with
		 * "snapshot"); else a create. */
		if (sr->snapshot[0]) {
			json_object_set_new(body, "snapshot", json_string(sr->snapshot));
			if (sr->snapshot_wait_ms)
				json_object_set_new(body, "wait_ms", json_integer(sr->snapshot_wait_ms));
			snprintf(path, sizeof(path), "/v1/sessions/%s/resume", id);
		} else {
			json_object_set_new(body, "id", json_string(id));
			snprintf(path, sizeof(path), "/v1/sessions");
		}
		with_template_ref(body, src.ref);
		create_src_free(&src);
		text = body ? json_dumps(body, JSON_COMPACT) : NULL;
		json_decref(body);
		snprintf(p.host, sizeof(p.host), "%s", host);
		snprintf(p.url, sizeof(p.url), "%s", url);
		pr = sessions_place_run(ss, &need, path, text, sr->snapshot[0] ? SNAPSHOT_TIMEOUT_MS : CREATE_TIMEOUT_MS,
					&p);
		free(text);
	}
	if (pr == 1) {
		store_session_transition(ss->st, id, SESSION_STARTING, SESSION_RUNNING, p.host, "", NULL);
		sessions_op_leave(ss, id);
		fprintf(stderr, "kiln-api: session %s of %s running on %s%s%s\n", id, r->customer, p.host,
			sr->snapshot[0] ? " from snapshot " : "", sr->snapshot);
		return 1;
	}
	store_session_discard(ss->st, id);
	sessions_op_leave(ss, id);
	if (pr == 0) {
		char code[64], msg[256];

		fprintf(stderr, "kiln-api: session %s: host %s refused it: HTTP %d %s: %s\n", id, p.host, p.hr.status,
			sessions_host_error_code(&p.hr, code, sizeof(code)),
			sessions_host_error_message(&p.hr, msg, sizeof(msg)));
		*ret = sessions_relay_to(r, r->conn, &p.hr);
		hostclient_reply_free(&p.hr);
		return 0;
	}
	fprintf(stderr, "kiln-api: session %s: no host took it (%s)\n", id, p.last[0] ? p.last : "none with room");
	{
		char msg[400];

		snprintf(msg, sizeof(msg), "no host could take the session now%s%s", p.last[0] ? ": " : "", p.last);
		*ret = sessions_answer(r, 0, KERR_NO_CAPACITY, msg, "Retry-After", RETRY_AFTER_S);
		return 0;
	}
}

static int resume_with(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
		       const struct sched_need *need_in, const char *ref, enum MHD_Result *ret);

int sessions_resume_run(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
			enum MHD_Result *ret)
{
	struct sched_need need = { .vcpus = cur->vcpus, .memory_mib = cur->memory_mib, .egress = cur->egress };
	char *ref = store_template_use_ref(ss->st, cur->id), tkey[72] = "", prefer[65] = "";
	json_t *sj = store_session_json(ss->st, cur->id, NULL);
	int done;

	/* Back to the host that paused it, when it has room: its pause cache
	 * holds the chunks (no GETs). */
	snprintf(prefer, sizeof(prefer), "%s",
		 json_string_value(json_object_get(json_object_get(sj, "snapshot"), "host_id")) ?: "");
	json_decref(sj);
	need.prefer = prefer;

	need.tkey = tkey_of_ref(ref, tkey);
	done = resume_with(ss, r, cur, &need, ref, ret);
	free(ref);
	return done;
}

static int resume_with(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
		       const struct sched_need *need_in, const char *ref, enum MHD_Result *ret)
{
	struct kiln_err err = { .code = "" };
	struct sched_need need = *need_in;
	enum session_state prev;
	struct sessions_placement p;
	struct quota q;
	char host[65], url[256], *spec_text;
	int refused, pr, br;

	if (!(cur->state == SESSION_PAUSED || (cur->state == SESSION_ERROR && cur->has_snapshot))) {
		char msg[160];

		snprintf(msg, sizeof(msg), "the session is %s%s: only a paused session can be resumed",
			 session_state_name(cur->state),
			 cur->state == SESSION_ERROR ? " and was never paused (no snapshot)" : "");
		*ret = sessions_answer(r, 0, KERR_NOT_PAUSED, msg, NULL, NULL);
		return 0;
	}
	if (store_customer_quota(ss->st, cur->customer, &q) < 0) {
		*ret = sessions_answer(r, 0, KERR_FORBIDDEN, "this key's customer no longer exists", NULL, NULL);
		return 0;
	}
	*ret = admit(ss, r, &q, cur->vcpus, cur->memory_mib, &refused);
	if (refused)
		return 0;
	pr = sched_place_wait(ss->sched, &need, NULL, 0, host, url, PLACE_WAIT_MS);
	if (pr < 0) {
		*ret = no_room(r, pr, &need);
		return 0;
	}
	/* The host is recorded only once one has it: a failed attempt leaves
	 * nothing to undo there. The lease comes first: no replica's reaper
	 * may see it resuming with no request behind it. */
	sessions_op_enter(ss, cur->id);
	br = store_session_resume_begin(ss->st, cur->id, cur->customer, "", &prev, &err);
	if (br != 1) {
		sessions_op_leave(ss, cur->id);
		sched_unplace(ss->sched, host, &need);
		if (br == -EDQUOT)
			*ret = sessions_answer_err(r, MHD_HTTP_TOO_MANY_REQUESTS, &err, r->e2b ? "Retry-After" : NULL,
						   RETRY_AFTER_S);
		else if (br == 0)
			*ret = sessions_answer(r, 0, KERR_NOT_PAUSED, "the session changed state meanwhile", NULL, NULL);
		else
			*ret = sessions_answer_err(r, MHD_HTTP_INTERNAL_SERVER_ERROR, &err, NULL, NULL);
		return 0;
	}
	spec_text = store_session_spec(ss->st, cur->id);
	{
		json_t *spec = spec_text ? json_loads(spec_text, 0, NULL) : NULL;
		json_t *body = json_pack("{s:s, s:o}", "customer", cur->customer, "spec", spec ? spec : json_object());
		char *text;
		char path[96];

		with_template_ref(body, ref);
		text = body ? json_dumps(body, JSON_COMPACT) : NULL;
		json_decref(body);
		free(spec_text);
		snprintf(path, sizeof(path), "/v1/sessions/%s/resume", cur->id);
		snprintf(p.host, sizeof(p.host), "%s", host);
		snprintf(p.url, sizeof(p.url), "%s", url);
		pr = sessions_place_run(ss, &need, path, text, SNAPSHOT_TIMEOUT_MS, &p);
		free(text);
	}
	if (pr == 1) {
		store_session_transition(ss->st, cur->id, SESSION_RESUMING, SESSION_RUNNING, p.host, "", NULL);
		sessions_op_leave(ss, cur->id);
		fprintf(stderr, "kiln-api: session %s resumed on %s\n", cur->id, p.host);
		/* Not where it paused: that host's cached copies of its memory
		 * are of no more use, and must not stay. */
		if (need.prefer && need.prefer[0] && strcmp(need.prefer, p.host))
			sessions_pcache_cleanup(ss, need.prefer, cur->id, cur->customer);
		return 1;
	}
	if (pr == 0 && (p.hr.status == 404 || p.hr.status == 422)) {
		/* Its snapshot is missing or damaged: nothing to resume, ever. */
		const char *reason = p.hr.status == 404 ? "snapshot_missing" : "snapshot_corrupt";
		char msg[256], why[400];

		sessions_host_error_message(&p.hr, msg, sizeof(msg));
		store_session_transition(ss->st, cur->id, SESSION_RESUMING, SESSION_ERROR, "", reason, NULL);
		sessions_op_leave(ss, cur->id);
		fprintf(stderr, "kiln-api: session %s: cannot resume: %s: %s\n", cur->id, reason, msg);
		snprintf(why, sizeof(why), "the session's snapshot is %s (%s): the session is error/%s",
			 p.hr.status == 404 ? "missing" : "damaged", msg, reason);
		/* kiln-host's 404 no_snapshot is kiln-api's 409 (docs/api.md). */
		*ret = sessions_answer(r, p.hr.status == 404 ? MHD_HTTP_CONFLICT : 422,
				       p.hr.status == 404 ? KERR_NO_SNAPSHOT : KERR_SNAPSHOT_CORRUPT, why, NULL, NULL);
		hostclient_reply_free(&p.hr);
		return 0;
	}
	/* Refused, or nobody took it: as it was. */
	store_session_transition(ss->st, cur->id, SESSION_RESUMING, prev, "", NULL, NULL);
	sessions_op_leave(ss, cur->id);
	if (pr == 0) {
		*ret = sessions_relay_to(r, r->conn, &p.hr);
		hostclient_reply_free(&p.hr);
		return 0;
	}
	{
		char msg[400];

		snprintf(msg, sizeof(msg), "no host could resume the session now%s%s", p.last[0] ? ": " : "", p.last);
		*ret = sessions_answer(r, 0, KERR_NO_CAPACITY, msg, "Retry-After", RETRY_AFTER_S);
		return 0;
	}
}
