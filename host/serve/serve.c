/* serve: kiln-host's HTTP API (libmicrohttpd, one thread per connection,
 * so that event streams may block) over hostd, which owns the tasks, and
 * the sessions: a route table (lib/httpd.h) of handlers. This file holds the
 * task, build, capacity and metrics routes and the dispatch; the session
 * routes are serve_sessions.c. The daemon's start-up and shutdown are in
 * main.c. */
#include "serve_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "buf.h"
#include "clock.h"
#include "condwait.h"
#include "envd_http.h"
#include "httpd.h"
#include "metrics.h"
#include "version.h"
#include "reply.h"
#include "run/run.h"
#include "session/session.h"
#include "spec.h"
#include "task/task.h"
#include "template/template.h"
#include "template_build/template_build.h"

/* 401 unless the request carries "Authorization: Bearer <cluster token>".
 * Both sides are hashed first so that the comparison takes the same time
 * whatever the token's length or content. */
static int authorized(struct serve_http *s, struct MHD_Connection *conn)
{
	const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	unsigned char got[SHA256_DIGEST_LENGTH];

	if (!h || strncmp(h, "Bearer ", 7))
		return 0;
	SHA256((const unsigned char *)h + 7, strlen(h + 7), got);
	return CRYPTO_memcmp(got, s->token_hash, sizeof(got)) == 0;
}

/* POST /v1/run: run synchronously and answer with the result (no spool, no
 * S3): for debugging a host and for benchmarks of the VM path alone. */
static enum MHD_Result handle_run(struct serve_http *s, struct MHD_Connection *conn, const struct httpd_body *req)
{
	struct task_spec spec;
	struct kiln_err err = { .code = "" };
	json_t *result, *e;

	if (spec_parse(httpd_body_data(req) ? httpd_body_data(req) : "", httpd_body_len(req), &spec, &err) < 0)
		return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
	result = run_task(&spec, s->ro);
	spec_free(&spec);
	/* Refused before anything started: say so with 503, not as a task result. */
	e = json_object_get(result, "error");
	if (e && kiln_err_lookup(json_string_value(json_object_get(e, "code"))) == KERR_NO_CAPACITY) {
		enum MHD_Result r = reply_error(conn, KERR_NO_CAPACITY,
				    json_string_value(json_object_get(e, "message")));

		json_decref(result);
		return r;
	}
	return reply_json(conn, MHD_HTTP_OK, result);
}

/* POST /v1/tasks {"id","customer","spec"} */
static enum MHD_Result handle_submit(struct serve_http *s, struct MHD_Connection *conn, const struct httpd_body *req)
{
	struct kiln_err err = { .code = "" };
	const char *id, *customer;
	json_t *body, *spec, *v, *template, *dj;
	struct template_ref ref;
	struct dest dest = { .endpoint = "" };
	int rc;

	body = hostd_request_parse(httpd_body_data(req) ? httpd_body_data(req) : "", httpd_body_len(req), &id, &customer,
				   &spec, &template, &err);
	if (!body)
		return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
	dj = json_object_get(body, "destination");
	if (dj && dest_from_json(dj, DEST_SECRET_REQUIRED, NULL, &dest, &err) < 0) {
		json_decref(body);
		return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
	}
	if (template && template_ref_parse_json(template, &ref, &err) < 0) {
		json_decref(body);
		dest_wipe(&dest);
		return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
	}
	rc = hostd_submit(s->hostd,
			  &(struct hostd_submission){ .id = id, .customer = customer, .spec = spec,
						      .ref = template ? &ref : NULL, .dest = dj ? &dest : NULL },
			  &err);
	dest_wipe(&dest);
	if (template)
		template_ref_free(&ref);
	if (rc < 0) {
		json_decref(body);
		return reply_err(conn, &err);
	}
	v = hostd_task_json(s->hostd, id);
	json_decref(body);
	return reply_json(conn, MHD_HTTP_ACCEPTED, v ? v : json_object());
}

/* GET /v1/tasks/{id}/events: server-sent events, from the task's first one. */
struct sse {
	struct serve_http *s;
	struct hostd_task *t;
	struct evlog_cursor cursor;
};

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct sse *e = cls;
	long n = hostd_events_read(e->s->hostd, e->t, &e->cursor, buf, max, clock_mono_ms() + 15000);

	if (n < 0)
		return MHD_CONTENT_READER_END_OF_STREAM;
	if (n == 0)
		return reply_sse_keepalive(buf, max);
	return n;
}

static void sse_free(void *cls)
{
	struct sse *e = cls;

	hostd_task_put(e->s->hostd, e->t);
	free(e);
}

static enum MHD_Result handle_events(struct serve_http *s, struct MHD_Connection *conn, const char *id)
{
	struct sse *e = calloc(1, sizeof(*e));

	if (!e)
		return MHD_NO;
	e->s = s;
	e->t = hostd_task_get(s->hostd, id);
	if (!e->t) {
		free(e);
		return reply_error(conn, KERR_NOT_FOUND, "no such task on this host");
	}
	/* Events carry output chunks of up to 128 KiB, JSON-escaped: room for one. */
	return reply_sse(conn, 1 << 20, sse_read, e, sse_free);
}

/* The task named by the path, or NULL when it cannot be one. */
static const char *task_id(struct httpd_req *r)
{
	return strlen(r->param[0]) < 80 ? r->param[0] : NULL;
}

static enum MHD_Result no_task(struct MHD_Connection *conn)
{
	return reply_error(conn, KERR_NOT_FOUND, "no such task on this host");
}

/* GET /v1/tasks[?all=1] */
static enum MHD_Result tasks_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	const char *all = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "all");

	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:o}", "tasks", hostd_task_list(s->hostd, !all || strcmp(all, "1"))));
}

/* GET /v1/tasks/{id} */
static enum MHD_Result task_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	const char *id = task_id(r);
	json_t *j = id ? hostd_task_json(s->hostd, id) : NULL;

	return j ? reply_json(r->conn, MHD_HTTP_OK, j) : no_task(r->conn);
}

/* DELETE /v1/tasks/{id} */
static enum MHD_Result task_cancel(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	const char *id = task_id(r);
	json_t *j;
	int rc;

	if (!id)
		return no_task(r->conn);
	rc = hostd_cancel(s->hostd, id);
	if (rc == -ENOENT)
		return no_task(r->conn);
	if (rc == -EALREADY)
		return reply_error(r->conn, KERR_NOT_CANCELLABLE, "the task's code has already ended");
	j = hostd_task_json(s->hostd, id);
	return reply_json(r->conn, MHD_HTTP_ACCEPTED, j ? j : json_object());
}

/* PUT /v1/tasks/{id}/destination {"destination":{...}}: new credentials
 * for the same place (kiln-api, after the customer set them). */
static enum MHD_Result task_dest_put(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	const char *id = task_id(r);
	struct kiln_err err = { .code = "" };
	struct dest dest;
	json_error_t je;
	json_t *j;
	int rc;

	if (!id)
		return no_task(r->conn);
	j = json_loadb(httpd_body_data(r->body) ? httpd_body_data(r->body) : "", httpd_body_len(r->body),
		       JSON_REJECT_DUPLICATES, &je);
	if (!j || json_object_size(j) != 1 || !json_object_get(j, "destination")) {
		json_decref(j);
		return reply_error(r->conn, KERR_INVALID_REQUEST, "expected {\"destination\":{...}}");
	}
	rc = dest_from_json(json_object_get(j, "destination"), DEST_SECRET_REQUIRED, NULL, &dest, &err);
	json_decref(j);
	if (rc == 0)
		rc = hostd_set_dest(s->hostd, id, &dest, &err);
	dest_wipe(&dest);
	if (rc < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:b}", "ok", 1));
}

/* GET /v1/tasks/{id}/events */
static enum MHD_Result task_events(void *ctx, struct httpd_req *r)
{
	const char *id = task_id(r);

	return id ? handle_events(ctx, r->conn, id) : no_task(r->conn);
}

static enum MHD_Result tasks_post(void *ctx, struct httpd_req *r)
{
	return handle_submit(ctx, r->conn, r->body);
}

static enum MHD_Result run_post(void *ctx, struct httpd_req *r)
{
	return handle_run(ctx, r->conn, r->body);
}

/* GET /v1/capacity */
static enum MHD_Result capacity_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;

	return reply_json(r->conn, MHD_HTTP_OK, hostd_capacity_json(s->hostd));
}

/* POST /v1/drain {"deadline_s": N optional} and POST /v1/undrain (kiln-host
 * drain / undrain, with the cluster token): the capacity, and so the next
 * heartbeat, says so; kiln-api does the rest (docs/api.md "Drain"). */
static enum MHD_Result drain_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	json_int_t deadline_s = 0;

	if (httpd_body_len(r->body)) {
		json_t *b = json_loadb(httpd_body_data(r->body), httpd_body_len(r->body), 0, NULL);
		json_t *d = json_object_get(b, "deadline_s");

		deadline_s = json_integer_value(d);
		if (!json_is_object(b) || (d && !json_is_null(d) && (!json_is_integer(d) || deadline_s < 1 ||
								      deadline_s > SPEC_DRAIN_DEADLINE_MAX_S))) {
			json_decref(b);
			return reply_error(r->conn, KERR_INVALID_REQUEST,
					   "expected {\"deadline_s\": N} (1..604800 seconds, optional)");
		}
		json_decref(b);
	}
	hostd_set_drain(s->hostd, 1, deadline_s ? clock_wall_ms() + (int64_t)deadline_s * 1000 : 0);
	return reply_json(r->conn, MHD_HTTP_OK, hostd_capacity_json(s->hostd));
}

static enum MHD_Result undrain_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;

	hostd_set_drain(s->hostd, 0, 0);
	return reply_json(r->conn, MHD_HTTP_OK, hostd_capacity_json(s->hostd));
}

static const struct metric m_tunnels = {
	.name = "kiln_host_port_tunnels", .type = METRIC_GAUGE,
	.help = "port tunnels open now (connections to sandboxes' ports, tunnel.c)",
};
static const struct metric m_tunnels_total = {
	.name = "kiln_host_port_tunnels_total", .type = METRIC_COUNTER,
	.help = "port tunnels opened since start",
};

/* GET /metrics (Prometheus text) */
static enum MHD_Result metrics_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	char *m = hostd_metrics(s->hostd);
	struct buf b = BUF_INIT;
	uint64_t open, total;

	if (!m)
		return MHD_NO;
	version_metric(&b);
	buf_adds(&b, m);
	free(m);
	if (s->sessions)
		sessions_metrics(s->sessions, &b);
	pthread_mutex_lock(&s->tun_lock);
	open = (uint64_t)s->tunnels;
	total = s->tunnels_total;
	pthread_mutex_unlock(&s->tun_lock);
	metric_write(&b, &m_tunnels, open);
	metric_write(&b, &m_tunnels_total, total);
	if (!b.len) {
		buf_free(&b);
		return MHD_NO;
	}
	m = buf_steal(&b, NULL);
	return reply_bytes(r->conn, MHD_HTTP_OK, m, strlen(m), "text/plain; version=0.0.4");
}


/* ---- builds (template_builds.c) ---- */

static enum MHD_Result no_builds(struct MHD_Connection *conn)
{
	return reply_error(conn, KERR_NOT_FOUND, "no such build on this host");
}

/* POST /v1/builds */
static enum MHD_Result builds_post(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	json_t *out;

	if (!s->builds)
		return reply_error(r->conn, KERR_UNAVAILABLE, "this host does not build templates");
	if (template_builds_submit(s->builds, httpd_body_data(r->body), httpd_body_len(r->body), &out, &err) < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_ACCEPTED, out);
}

/* GET /v1/builds/{id} */
static enum MHD_Result build_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	json_t *j = s->builds && strlen(r->param[0]) < 80 ? template_builds_get(s->builds, r->param[0]) : NULL;

	return j ? reply_json(r->conn, MHD_HTTP_OK, j) : no_builds(r->conn);
}

/* DELETE /v1/builds/{id}: cancel */
static enum MHD_Result build_cancel(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	json_t *j;

	if (!s->builds || strlen(r->param[0]) >= 80 || template_builds_cancel(s->builds, r->param[0]) < 0)
		return no_builds(r->conn);
	j = template_builds_get(s->builds, r->param[0]);
	return j ? reply_json(r->conn, MHD_HTTP_OK, j) : no_builds(r->conn);
}

struct build_sse {
	struct serve_http *s;
	struct template_build_job *x;
	struct evlog_cursor cursor;
};

static ssize_t build_sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct build_sse *e = cls;
	long n = template_builds_events_read(e->s->builds, e->x, &e->cursor, buf, max, clock_mono_ms() + 15000);

	if (n < 0)
		return MHD_CONTENT_READER_END_OF_STREAM;
	if (n == 0)
		return reply_sse_keepalive(buf, max);
	return n;
}

static void build_sse_free(void *cls)
{
	struct build_sse *e = cls;

	template_builds_unref(e->s->builds, e->x);
	free(e);
}

/* GET /v1/builds/{id}/events */
static enum MHD_Result build_events(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct build_sse *e;

	if (!s->builds || strlen(r->param[0]) >= 80)
		return no_builds(r->conn);
	e = calloc(1, sizeof(*e));
	if (!e)
		return MHD_NO;
	e->s = s;
	e->x = template_builds_ref(s->builds, r->param[0]);
	if (!e->x) {
		free(e);
		return no_builds(r->conn);
	}
	return reply_sse(r->conn, 64 << 10, build_sse_read, e, build_sse_free);
}

/* ---- dispatch ---- */

/* Every endpoint but /healthz (no token, any method). Rows of one path are
 * in the order the 405 message names them ("use GET or POST"). */
static const struct httpd_route host_routes[] = {
	{ "GET", "/v1/tasks", tasks_get },
	{ "POST", "/v1/tasks", tasks_post },
	{ "GET", "/v1/tasks/{id}", task_get },
	{ "DELETE", "/v1/tasks/{id}", task_cancel },
	{ "GET", "/v1/tasks/{id}/events", task_events },
	{ "PUT", "/v1/tasks/{id}/destination", task_dest_put },
	{ "GET", "/v1/sessions", serve_sessions_get_list },
	{ "POST", "/v1/sessions", serve_sessions_post },
	{ "GET", "/v1/sessions/{id}", serve_session_get_one },
	{ "DELETE", "/v1/sessions/{id}", serve_session_del },
	{ "DELETE", "/v1/sessions/{id}/pause-cache", serve_session_pcache_del },
	{ "GET", "/v1/sessions/{id}/files", serve_session_files },
	{ "PUT", "/v1/sessions/{id}/files", serve_session_files },
	{ "POST", "/v1/sessions/{id}/exec", serve_session_exec_post },
	{ "POST", "/v1/sessions/{id}/input", serve_session_input_post },
	{ "POST", "/v1/sessions/{id}/pause", serve_session_pause_post },
	{ "PUT", "/v1/sessions/{id}/network", serve_session_network_put },
	{ "POST", "/v1/sessions/{id}/resume", serve_session_resume_post },
	{ "POST", "/v1/sessions/{id}/checkpoint", serve_session_checkpoint_post },
	{ "DELETE", "/v1/snapshots/{id}", serve_snapshot_del },
	{ "GET", "/v1/volumes/{id}", serve_volume_get },
	{ "DELETE", "/v1/volumes/{id}", serve_volume_del },
	{ "POST", "/v1/sessions/{id}/outputs", serve_session_outputs_post },
	{ "GET", "/v1/sessions/{id}/metrics", serve_session_metrics_get },
	{ "GET", "/v1/sessions/{id}/envd/health", serve_envd_health_get },
	{ "GET", "/v1/sessions/{id}/envd/files", serve_envd_files_get },
	{ "POST", "/v1/sessions/{id}/envd/files", serve_envd_files_get }, /* never reached: streamed in handler() */
	{ "POST", "/v1/sessions/{id}/envd/{service}/{method}", serve_envd_rpc_post },
	{ "GET", "/v1/sessions/{id}/ports", serve_session_ports_get },
	{ "GET", "/v1/sessions/{id}/ports/{port}/connect", serve_session_port_connect },
	{ "POST", "/v1/builds", builds_post },
	{ "GET", "/v1/builds/{id}", build_get },
	{ "DELETE", "/v1/builds/{id}", build_cancel },
	{ "GET", "/v1/builds/{id}/events", build_events },
	{ "GET", "/v1/capacity", capacity_get },
	{ "POST", "/v1/drain", drain_post },
	{ "POST", "/v1/undrain", undrain_post },
	{ "GET", "/metrics", metrics_get },
	{ "POST", "/v1/run", run_post },
};

static const struct httpd_routes host_table = {
	host_routes, sizeof(host_routes) / sizeof(host_routes[0]), "no such endpoint", " or ",
};

static enum MHD_Result reply_no_token(struct MHD_Connection *conn)
{
	return reply_unauthorized(conn, "missing or wrong cluster token (Authorization: Bearer ...)");
}

static enum MHD_Result reply_too_large(struct MHD_Connection *conn)
{
	return reply_error(conn, KERR_TOO_LARGE, "the request body is too large");
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			       const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct serve_http *s = cls;
	struct serve_conn *c = *con_cls;
	struct httpd_body *body;
	struct httpd_req r;

	if (!c) {
		c = calloc(1, sizeof(*c));
		if (!c)
			return MHD_NO;
		body = &c->body;
		/* Past the cap a body is dropped as it arrives, however long. */
		httpd_body_init(body, BODY_MAX, 0);
		*con_cls = c;
		/* Refuse before reading any body: a caller without the token,
		 * and a declared body over the cap (then the connection closes). */
		if (strcmp(url, "/healthz") && !authorized(s, conn))
			return reply_no_token(conn);
		/* An envd upload goes to the guest as it arrives, whatever its size. */
		if (envd_upload_match(method, url)) {
			c->up = envd_upload_new(s->sessions, conn, url);
			return c->up ? MHD_YES : MHD_NO;
		}
		if (httpd_body_declared_too_big(body, conn))
			return reply_too_large(conn);
		return MHD_YES;
	}
	body = &c->body;
	if (c->up) {
		if (*upload_size)
			return envd_upload_feed(c->up, upload, upload_size);
		return envd_upload_finish(c->up, conn);
	}
	if (*upload_size)
		return httpd_body_feed(body, upload, upload_size);
	if (!strcmp(url, "/healthz"))
		return reply_json(conn, MHD_HTTP_OK, json_pack("{s:s, s:s, s:s}", "status", "ok", "host_id", s->host_id, "version",
						       kiln_version()));
	if (!authorized(s, conn))
		return reply_no_token(conn);
	if (body->too_big)
		return reply_too_large(conn);
	r = (struct httpd_req){ .conn = conn, .method = method, .url = url, .body = body, .app = c };
	return httpd_dispatch(&host_table, s, &r);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct serve_conn *c = *con_cls;

	if (c) {
		httpd_body_free(&c->body);
		envd_upload_free(c->up);
		serve_tunnel_done(cls, c->tun);
		free(c);
	}
	*con_cls = NULL;
}

struct serve_http *serve_http_start(const struct serve_http_config *c, struct kiln_err *err)
{
	struct serve_http *s = calloc(1, sizeof(*s));

	if (!s) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	s->host_id = c->host_id;
	s->ro = c->ro;
	s->hostd = c->hostd;
	s->sessions = c->sessions;
	s->builds = c->builds;
	SHA256((const unsigned char *)c->token, strlen(c->token), s->token_hash);
	/* The idle timeout does not cut kiln-api's long requests: its event
	 * and exec streams get a keepalive every 10-15 s, its other calls give
	 * up after at most 60 s. poll(), not select(): each session holds
	 * several descriptors, and past ~200 sessions a new connection's fd is
	 * over FD_SETSIZE (1024), which select() refuses (connection reset). */
	pthread_mutex_init(&s->tun_lock, NULL);
	condwait_init(&s->tun_cond);
	/* With TLS (the cluster token and every session's traffic then never
	 * cross the network in clear) the same routes are served over HTTPS
	 * only; a tunnel's upgraded connection is then a socketpair that
	 * libmicrohttpd pumps through TLS. */
	{
		struct MHD_OptionItem tls[] = {
			{ MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)c->tls_cert },
			{ MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)c->tls_key },
			{ MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)HTTPD_TLS_PRIORITIES },
			{ MHD_OPTION_END, 0, NULL },
		};
		unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
				 MHD_USE_ERROR_LOG | MHD_ALLOW_UPGRADE;

		if (c->tls_cert && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
			kiln_err_set(err, KERR_CONFIG, "tls: this libmicrohttpd was built without TLS");
			free(s);
			return NULL;
		}
		if (c->tls_cert)
			flags |= MHD_USE_TLS;
		s->d = MHD_start_daemon(flags, (uint16_t)c->port, NULL, NULL, handler, s, MHD_OPTION_NOTIFY_COMPLETED,
					completed, s, MHD_OPTION_SOCK_ADDR, c->addr, MHD_OPTION_CONNECTION_TIMEOUT,
					c->connection_timeout_s ? c->connection_timeout_s : 300u,
					MHD_OPTION_CONNECTION_LIMIT, c->max_connections ? c->max_connections : 1024u,
					MHD_OPTION_PER_IP_CONNECTION_LIMIT,
					c->max_connections_per_address ? c->max_connections_per_address : 512u,
					MHD_OPTION_ARRAY, c->tls_cert ? tls : tls + 3, MHD_OPTION_END);
	}
	if (!s->d) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot listen on %s:%d%s", c->listen_host, c->port,
			     c->tls_cert ? " with TLS (is the key the certificate's?)" : "");
		free(s);
		return NULL;
	}
	return s;
}

void serve_http_stop(struct serve_http *s)
{
	if (!s)
		return;
	/* envd streams wait on their channels: ending those lets them finish. */
	if (s->sessions)
		sessions_envd_stop(s->sessions);
	/* Closing the channels ended every tunnel: wait for their threads. */
	serve_tunnels_wait(s, proto_now_ms() + 5000);
	MHD_stop_daemon(s->d);
	free(s);
}
