/* server: kiln-api's HTTP API over the store (see server.h, docs/api.md).
 *
 * Threads: libmicrohttpd runs one thread per connection, so a long-poll
 * (GET /v1/tasks/{id}?wait=S) simply blocks in its handler on the store's
 * change counter (store_wait_change) and an event stream blocks in its
 * reader on the event hub's condition variable. Every handler answers on the
 * second call of the access handler (answering on the first makes
 * libmicrohttpd close the connection), except for 413: a body whose
 * Content-Length is over the limit is refused before any of it is read (and
 * the connection closes). A chunked body that grows past the limit is
 * dropped as it arrives and refused at its end, or the connection is closed
 * once it passes twice the limit (libmicrohttpd accepts no reply while a
 * body is arriving).
 *
 * This file: authentication, the route table and the access handler that
 * dispatches to it (and to the sessions, templates and E2B rooms), health
 * and metrics, start and stop. The task routes are in server_tasks.c, the
 * destination, admin and host routes in server_admin.c; server_int.h is
 * what they share. The event hub (per-task event lists, fed by the store's
 * listener and by server_task_event) is in events.c. */
#include "server_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "artifacts.h"
#include "base/base.h"
#include "events.h"
#include "httpd.h"
#include "metrics.h"
#include "version.h"
#include "ports/ports.h"
#include "reply.h"
#include "sessions/sessions.h"
#include "store/store.h"
#include "templates/templates.h"
#include "ui.h"

/* ---- authentication ---- */

static const char *bearer(struct MHD_Connection *conn)
{
	const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);

	if (!h || strncmp(h, "Bearer ", 7))
		return NULL;
	return h + 7;
}

/* Hash both sides so that the comparison takes the same time whatever the
 * presented secret's length or content. */
static int secret_matches(const char *got, const unsigned char want[SHA256_DIGEST_LENGTH])
{
	unsigned char h[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *)got, strlen(got), h);
	return CRYPTO_memcmp(h, want, sizeof(h)) == 0;
}

/* The E2B API (/e2b/...) takes the key in X-API-KEY, as E2B's SDK sends it. */
static int is_e2b(const char *url)
{
	return !strncmp(url, "/e2b/", 5);
}

static const char *api_key(struct MHD_Connection *conn, const char *url)
{
	const char *k = is_e2b(url) ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-API-KEY") : NULL;

	return k ? k : bearer(conn);
}

static int authenticate(struct server *s, struct MHD_Connection *conn, const char *url, struct caller *c)
{
	const char *key = api_key(conn, url);

	memset(c, 0, sizeof(*c));
	if (!key)
		return 0;
	if (s->have_admin && secret_matches(key, s->admin_hash)) {
		c->admin = 1;
		return 1;
	}
	if (!store_key_check(s->st, key, c->customer, &c->admin))
		return 0;
	if (c->admin)
		c->customer[0] = '\0';
	return 1;
}

/* ---- events ---- */

void server_task_event(struct server *s, const char *task_id, const char *event, json_t *data)
{
	events_task_event(s->ev, task_id, event, data);
}

void server_relay_event(void *server, const char *task_id, const char *event, json_t *data)
{
	server_task_event(server, task_id, event, data);
}


/* ---- the links kiln-api signs itself ---- */

/* Where clients reach kiln-api, for the links it signs itself: public_url,
 * else http:// and the address it listens on (the port it was given, or the
 * one it got for port 0), 127.0.0.1 for the wildcard 0.0.0.0. From the
 * configuration only, never from a request: a Host header is the client's to
 * write, and a link built from it would send the next reader (and the link's
 * signature) wherever that client said. Set once at start. */
static void base_url_set(struct server *s, const struct sockaddr_in *sa)
{
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	unsigned port = info && info->port ? info->port : ntohs(sa->sin_port);
	char addr[INET_ADDRSTRLEN] = "127.0.0.1";

	if (s->cfg->public_url) {
		snprintf(s->base_url, sizeof(s->base_url), "%s", s->cfg->public_url);
		return;
	}
	if (sa->sin_addr.s_addr != htonl(INADDR_ANY))
		inet_ntop(AF_INET, &sa->sin_addr, addr, sizeof(addr));
	snprintf(s->base_url, sizeof(s->base_url), "http://%s:%u", addr, port);
}

/* ---- dispatch ---- */

/* The routes that need no key: health and metrics. */
static int keyless(const char *url)
{
	return !strcmp(url, "/healthz") || !strcmp(url, "/metrics");
}

/* 503 when the store's database does not answer (PostgreSQL down or out
 * of reach): a load balancer then sends requests to another replica. */
static enum MHD_Result rt_healthz(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;

	if (store_ping(s->st) < 0)
		return reply_json(r->conn, MHD_HTTP_SERVICE_UNAVAILABLE,
				  json_pack("{s:s, s:s, s:s}", "status", "unavailable", "reason",
					    "the database is unreachable", "version", kiln_version()));
	/* leader: this replica runs the scheduler now (always, on SQLite). */
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:b, s:s}", "status", "ok", "leader", store_is_leader(s->st), "version",
				    kiln_version()));
}

/* GET /metrics (no key, like /healthz): this replica's view, Prometheus
 * text. Each replica answers for itself: scrape them all; exactly one says
 * kiln_api_leader 1. */
static const struct metric m_leader = {
	.name = "kiln_api_leader", .type = METRIC_GAUGE,
	.help = "1 when this kiln-api runs the scheduler (one replica at a time)",
};
static const struct metric m_store_up = {
	.name = "kiln_api_store_up", .type = METRIC_GAUGE,
	.help = "1 when the store's database answers",
};
static const struct metric m_store_info = {
	.name = "kiln_api_store_info", .type = METRIC_GAUGE, .labels = { "backend" },
	.help = "the store's backend",
};

static const struct metric m_port_requests = {
	.name = "kiln_api_port_requests_total", .type = METRIC_COUNTER, .labels = { "way" },
	.help = "requests to sandboxes' ports, by the way they came (kiln's path, or E2B's names and headers)",
};
static const struct metric m_port_refused = {
	.name = "kiln_api_port_refused_total", .type = METRIC_COUNTER,
	.help = "port requests answered with an error before reaching a server (not found, paused, nothing listens, ...)",
};
static const struct metric m_port_upgrades = {
	.name = "kiln_api_port_upgrades_total", .type = METRIC_COUNTER,
	.help = "WebSockets and raw tunnels spliced to sandboxes' ports",
};
static const struct metric m_port_open = {
	.name = "kiln_api_port_connections", .type = METRIC_GAUGE,
	.help = "port requests and spliced connections open now",
};

static const struct metric m_hosts = {
	.name = "kiln_api_hosts", .type = METRIC_GAUGE, .labels = { "state" },
	.help = "registered hosts by state (live, draining: no new work, lost: no heartbeat)",
};
static const struct metric m_host_draining = {
	.name = "kiln_api_host_draining", .type = METRIC_GAUGE, .labels = { "host" },
	.help = "1 for each registered host that is draining (docs/api.md \"Drain\"), 0 for the others",
};

/* The hosts' states as GET /v1/admin/hosts shows them (lost once quiet for
 * host_lost_after_s), by state and per host. */
static int metrics_hosts(struct server *s, struct buf *b)
{
	static const char *const states[] = { "live", "draining", "lost" };
	int64_t cutoff = clock_wall_ms() - (int64_t)s->cfg->host_lost_after_s * 1000;
	json_t *hosts = store_host_list(s->st), *h;
	uint64_t count[3] = { 0 };
	size_t i;
	int e;

	json_array_foreach(hosts, i, h) {
		const char *st = json_string_value(json_object_get(h, "state")) ?: "";

		if (json_integer_value(json_object_get(h, "last_heartbeat_ms")) < cutoff || !strcmp(st, "lost"))
			count[2]++;
		else
			count[!strcmp(st, "draining")]++;
	}
	e = metric_write_by(b, &m_hosts, states, count, 3);
	if (!e)
		e = metric_head(b, &m_host_draining);
	json_array_foreach(hosts, i, h) {
		const char *id = json_string_value(json_object_get(h, "id")) ?: "";

		if (!e)
			e = metric_sample(b, &m_host_draining, &id, json_is_true(json_object_get(h, "draining")));
	}
	json_decref(hosts);
	return e;
}

static enum MHD_Result rt_metrics(void *ctx, struct httpd_req *r)
{
	struct ports_stats ps;
	const char *ways[] = { "native", "e2b" };
	struct server *s = ctx;
	struct MHD_Response *resp;
	struct buf b = BUF_INIT;
	enum MHD_Result ret;
	const char *backend = store_is_pg(s->st) ? "postgresql" : "sqlite";
	size_t n;
	char *text;
	int e;

	e = version_metric(&b);
	if (!e)
		e = metric_write(&b, &m_leader, store_is_leader(s->st) != 0);
	if (!e)
		e = metric_write(&b, &m_store_up, store_ping(s->st) == 0);
	if (!e)
		e = metric_write_by(&b, &m_store_info, &backend, (uint64_t[]){ 1 }, 1);
	ports_stats(&ps);
	if (!e)
		e = metric_write_by(&b, &m_port_requests, ways, (uint64_t[]){ ps.requests_native, ps.requests_e2b }, 2);
	if (!e)
		e = metric_write(&b, &m_port_refused, ps.refused);
	if (!e)
		e = metric_write(&b, &m_port_upgrades, ps.upgrades);
	if (!e)
		e = metric_write(&b, &m_port_open, ps.open);
	if (!e)
		e = metrics_hosts(s, &b);
	if (e || !(text = buf_steal(&b, &n))) {
		buf_free(&b);
		return reply_internal(r->conn, "out of memory");
	}
	resp = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* A signed link to an inline artifact (?expires=&sig=, artifacts.h): 1 and
 * the task's id and the artifact's name when url is one and its signature
 * holds, 0 when url is no such link (no sig: a key is needed as usual), -1
 * when it is one whose signature is wrong or expired. */
static int artifact_link(struct server *s, struct MHD_Connection *conn, const char *url, char *id, size_t id_size,
			 char name[ARTIFACT_NAME_MAX])
{
	const char *sig = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "sig");

	if (!sig || !artifacts_path(url, id, id_size, name))
		return 0;
	if (!s->have_art_key ||
	    !artifacts_sig_ok(s->art_key, id, name, MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "expires"),
			      sig, time(NULL)))
		return -1;
	return 1;
}

static enum MHD_Result reply_bad_link(struct MHD_Connection *conn)
{
	return reply_error(conn, KERR_FORBIDDEN,
			   "this artifact link has expired or its signature is wrong: get a fresh url from "
			   "GET /v1/tasks/{id}");
}

/* Every endpoint but /v1/sessions/..., which sessions.c routes. Customer
 * and admin routes are authenticated, admin routes checked for an admin
 * key and /v1/hosts/ routes for the cluster token before the table. */
static const struct httpd_route api_routes[] = {
	{ "GET", "/healthz", rt_healthz },
	{ "GET", "/metrics", rt_metrics },
	{ "GET", "/v1/tasks", server_rt_list },
	{ "POST", "/v1/tasks", server_rt_submit },
	{ "GET", "/v1/tasks/{id}", server_rt_task_get },
	{ "GET", "/v1/tasks/{id}/events", server_rt_task_events },
	{ "POST", "/v1/tasks/{id}/cancel", server_rt_task_cancel },
	{ "GET", "/v1/tasks/{id}/artifacts/{name}", server_rt_task_artifact },
	{ "GET", "/v1/tasks/{id}/outputs/{n}", server_rt_task_output },
	{ "GET", "/v1/usage", server_rt_usage },
	{ "GET", "/v1/usage/history", server_rt_usage_history },
	{ "GET", "/v1/destination", server_rt_dest },
	{ "PUT", "/v1/destination", server_rt_dest },
	{ "DELETE", "/v1/destination", server_rt_dest },
	{ "POST", "/v1/destination/test", server_rt_dest_test },
	{ "GET", "/v1/admin/customers/{id}/destination", server_rt_admin_dest },
	{ "PUT", "/v1/admin/customers/{id}/destination", server_rt_admin_dest },
	{ "DELETE", "/v1/admin/customers/{id}/destination", server_rt_admin_dest },
	{ "POST", "/v1/admin/customers/{id}/destination/test", server_rt_admin_dest_test },
	{ "POST", "/v1/admin/customers", server_rt_customer_create },
	{ "GET", "/v1/admin/customers", server_rt_customer_list },
	{ "GET", "/v1/admin/customers/{id}", server_rt_customer_get },
	{ "GET", "/v1/admin/customers/{id}/keys", server_rt_customer_keys },
	{ "GET", "/v1/admin/customers/{id}/usage/history", server_rt_admin_usage_history },
	{ "PUT", "/v1/admin/customers/{id}/quotas", server_rt_customer_quotas },
	{ "POST", "/v1/admin/customers/{id}/keys", server_rt_customer_key },
	{ "DELETE", "/v1/admin/keys/{id}", server_rt_key_revoke },
	{ "GET", "/v1/admin/hosts", server_rt_hosts },
	{ "POST", "/v1/admin/hosts/{id}/drain", server_rt_host_drain },
	{ "POST", "/v1/admin/hosts/{id}/undrain", server_rt_host_undrain },
	{ "POST", "/v1/hosts/{id}/heartbeat", server_rt_host_heartbeat },
};

static const struct httpd_routes api_table = {
	api_routes, sizeof(api_routes) / sizeof(api_routes[0]), "no such endpoint", ", ",
};

static enum MHD_Result reply_too_large(struct server *s, struct MHD_Connection *conn)
{
	char msg[96];

	snprintf(msg, sizeof(msg), "the request body is larger than %zu MiB", s->max_body >> 20);
	return reply_error(conn, KERR_TOO_LARGE, msg);
}

static enum MHD_Result reply_no_key(struct MHD_Connection *conn, const char *url)
{
	if (is_e2b(url))
		return reply_e2b_error(conn, MHD_HTTP_UNAUTHORIZED,
				       api_key(conn, url) ? "unknown or revoked API key"
							  : "missing API key (X-API-KEY: kiln_...)",
				       "WWW-Authenticate", "Bearer");
	return reply_unauthorized(conn, bearer(conn) ? "unknown or revoked API key"
						     : "missing API key (Authorization: Bearer kiln_...)");
}

/* The sessions, held for one request; NULL when they are not served. */
static struct sessions *hold_sessions(struct server *s)
{
	struct sessions *ss;

	pthread_mutex_lock(&s->hooks_lock);
	ss = s->sessions;
	if (ss)
		sessions_hold(ss);
	pthread_mutex_unlock(&s->hooks_lock);
	return ss;
}

/* /e2b/...: E2B's control API (e2b.c). */
static enum MHD_Result handle_e2b(struct server *s, struct MHD_Connection *conn, const char *method,
				  const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct sessions_request sr = {
		.conn = conn, .method = method, .path = url + 4, .body = httpd_body_data(body),
		.len = httpd_body_len(body), .customer = c->customer, .admin = c->admin, .lim = s->lim, .e2b = 1,
	};
	struct sessions *ss = hold_sessions(s);

	if (!ss)
		return reply_e2b_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "sandboxes are not served now", NULL, NULL);
	return e2b_handle(ss, &sr);
}

/* The envd relay's root paths (e2b_relay.c): the sandbox's token, not a key. */
static enum MHD_Result handle_relay(struct server *s, struct MHD_Connection *conn, const char *method,
				    const char *url, const struct httpd_body *body, const char *host_id)
{
	struct e2b_relay_request rr = {
		.conn = conn, .method = method, .url = url, .body = httpd_body_data(body), .len = httpd_body_len(body),
		.lim = s->lim, .host_id = host_id,
	};
	struct sessions *ss = hold_sessions(s);

	if (!ss)
		return reply_e2b_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "sandboxes are not served now", NULL, NULL);
	return e2b_relay_handle(ss, &rr);
}

static enum MHD_Result handle_sessions(struct server *s, struct MHD_Connection *conn, const char *method,
				       const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct sessions_request sr = {
		.conn = conn, .method = method, .path = url + 12, .body = httpd_body_data(body),
		.len = httpd_body_len(body), .customer = c->customer, .admin = c->admin, .lim = s->lim,
	};
	struct sessions *ss = hold_sessions(s);

	if (!ss)
		return reply_error(conn, KERR_UNAVAILABLE, "sessions are not served now");
	return sessions_handle(ss, &sr);
}

/* /v1/snapshots/...: session_snapshots.c */
static enum MHD_Result handle_snapshots(struct server *s, struct MHD_Connection *conn, const char *method,
					const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct sessions_request sr = {
		.conn = conn, .method = method, .path = url + 13, .body = httpd_body_data(body),
		.len = httpd_body_len(body), .customer = c->customer, .admin = c->admin, .lim = s->lim,
	};
	struct sessions *ss = hold_sessions(s);

	if (!ss)
		return reply_error(conn, KERR_UNAVAILABLE, "snapshots are not served now");
	return sessions_snapshots_handle(ss, &sr);
}

/* /v1/volumes/...: session_volumes.c */
static enum MHD_Result handle_volumes(struct server *s, struct MHD_Connection *conn, const char *method,
				      const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct sessions_request sr = {
		.conn = conn, .method = method, .path = url + 11, .body = httpd_body_data(body),
		.len = httpd_body_len(body), .customer = c->customer, .admin = c->admin, .lim = s->lim,
	};
	struct sessions *ss = hold_sessions(s);

	if (!ss)
		return reply_error(conn, KERR_UNAVAILABLE, "volumes are not served now");
	return sessions_volumes_handle(ss, &sr);
}

static enum MHD_Result handle_templates(struct server *s, struct MHD_Connection *conn, const char *method,
					const char *url, const struct httpd_body *body, const struct caller *c)
{
	struct templates *t;

	pthread_mutex_lock(&s->hooks_lock);
	t = s->templates;
	pthread_mutex_unlock(&s->hooks_lock);
	if (!t)
		return reply_error(conn, KERR_UNAVAILABLE, "templates are not served now");
	return templates_handle(t, conn, method, url, httpd_body_data(body), httpd_body_len(body), c->customer,
				c->admin, s->lim);
}

/* One request's state across the access handler's calls: its body, or, for
 * an OCI template upload, the spool it is streamed into. */
struct conn_state {
	struct httpd_body body;      /* first: completed() frees both */
	struct templates_upload *up;
	int relay_refused;           /* an envd call refused before its body: the body is dropped */
	int begun;                   /* the access handler was called for this request */
	struct ports_call *port;     /* a request to a sandbox's port (api/ports) */
	char *uri;                   /* the request target as sent (uri_log) */
	char envd_id[40];            /* the sandbox envd's host name names (49983-<id>.<domain>), or "" */
};

/* libmicrohttpd's URI log callback: the first thing it learns of a request.
 * The request target as the client wrote it is kept (the access handler
 * gets the path decoded, and a port request passes it on as sent). */
void *server_uri_log(void *cls, const char *uri, struct MHD_Connection *conn)
{
	struct conn_state *cs = calloc(1, sizeof(*cs));

	(void)cls;
	(void)conn;
	if (cs && uri && strlen(uri) < 16384)
		cs->uri = strdup(uri);
	return cs;
}

enum MHD_Result server_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			     const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct server *s = cls;
	struct conn_state *cs = *con_cls;
	struct httpd_body *body = cs ? &cs->body : NULL;
	struct httpd_req r;
	struct caller c;

	if (!cs || !cs->begun) {
		struct ports_match pm;
		int pmr;

		if (!cs)
			cs = calloc(1, sizeof(*cs));
		if (!cs)
			return MHD_NO;
		cs->begun = 1;
		body = &cs->body;
		/* Past the cap a chunked body is dropped, and the connection
		 * closed once it goes on past twice the cap. */
		httpd_body_init(body, s->max_body, s->max_body);
		*con_cls = cs;
		/* A sandbox's port: its body streams to the server in the
		 * sandbox, whatever its size (api/ports). */
		pmr = ports_match(conn, url, cs->uri, s->cfg->sandbox_domain, &pm);
		if (pmr < 0)
			return reply_error(conn, pm.way == PORTS_NATIVE && !strcmp(pm.target, "no such session")
							 ? KERR_NOT_FOUND
							 : KERR_INVALID_REQUEST,
					   pm.target);
		if (pmr == 0 && pm.port == PORTS_ENVD_PORT)
			snprintf(cs->envd_id, sizeof(cs->envd_id), "%s", pm.id);
		if (pmr > 0) {
			struct sessions *ss;

			if (pm.way == PORTS_NATIVE && !authenticate(s, conn, url, &c))
				return reply_no_key(conn, url);
			if (pm.way == PORTS_NATIVE && store_down(s->st))
				return reply_error(conn, KERR_UNAVAILABLE, "the database is unreachable; retry");
			ss = hold_sessions(s);
			if (!ss)
				return reply_error(conn, KERR_UNAVAILABLE, "sandboxes are not served now");
			cs->port = ports_begin(ss, conn, method, &pm, pm.way == PORTS_NATIVE ? c.customer : NULL, s->lim);
			return cs->port ? MHD_YES : MHD_NO;
		}
		/* An OCI archive is streamed to a spool file under the
		 * customer's own cap (max_template_mib), not collected. */
		if (templates_is_upload(conn, method, url)) {
			struct templates *t;

			if (!authenticate(s, conn, url, &c))
				return reply_no_key(conn, url);
			pthread_mutex_lock(&s->hooks_lock);
			t = s->templates;
			pthread_mutex_unlock(&s->hooks_lock);
			if (!t)
				return reply_error(conn, KERR_UNAVAILABLE, "templates are not served now");
			return templates_upload_begin(t, conn, c.customer, c.admin, &cs->up);
		}
		if (httpd_body_declared_too_big(body, conn))
			return reply_too_large(s, conn);
		/* The web console's static files need no key (ui.c). */
		if (ui_is_path(url))
			return MHD_YES;
		/* Customer routes need a key: check it before reading any body,
		 * so an unauthenticated upload costs neither memory nor time
		 * (the host routes check the cluster token below). */
		/* The relay's token too, before the body (up to max_body_mib) is
		 * read: a refused call's body is dropped as it comes (answered
		 * at its end), at most max_body_mib of it. */
		if (e2b_relay_path(url)) {
			struct sessions *ss = hold_sessions(s);

			if (ss && !e2b_relay_allowed(ss, conn, method, url, cs->envd_id[0] ? cs->envd_id : NULL)) {
				cs->relay_refused = 1;
				body->too_big = 1;
				body->drop_max = s->max_body;
			}
			return MHD_YES;
		}
		if (!keyless(url) && strncmp(url, "/v1/hosts/", 10)) {
			char id[80], name[ARTIFACT_NAME_MAX];
			int link = artifact_link(s, conn, url, id, sizeof(id), name);

			if (link < 0)
				return reply_bad_link(conn);
			if (!link && !authenticate(s, conn, url, &c))
				return reply_no_key(conn, url);
		}
		return MHD_YES;
	}
	if (cs->port) {
		if (*upload_size)
			return ports_feed(cs->port, upload, upload_size);
		return ports_finish(cs->port, conn);
	}
	if (cs->up) {
		if (*upload_size)
			return templates_upload_feed(cs->up, upload, upload_size);
		return templates_upload_finish(cs->up, conn);
	}
	if (*upload_size)
		return httpd_body_feed(body, upload, upload_size);
	if (cs->relay_refused) {
		struct sessions *ss = hold_sessions(s);

		if (!ss)
			return reply_e2b_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "sandboxes are not served now", NULL,
					       NULL);
		return e2b_relay_refuse(ss, conn, method, url, cs->envd_id[0] ? cs->envd_id : NULL);
	}
	if (body->too_big)
		return reply_too_large(s, conn);
	if (ui_is_path(url))
		return ui_serve(s->ui_dir, conn, method, url);
	memset(&c, 0, sizeof(c));
	/* The database is out of reach (PostgreSQL): 503 at once rather than
	 * a store error from deep inside; store_down reconnects by itself. */
	if (!keyless(url) && store_down(s->st))
		return reply_error(conn, KERR_UNAVAILABLE, "the database is unreachable; retry");
	if (!strncmp(url, "/v1/hosts/", 10)) {
		const char *tok = bearer(conn);

		if (!s->have_token || !tok || !secret_matches(tok, s->token_hash))
			return reply_unauthorized(conn, "missing or wrong cluster token (Authorization: Bearer ...)");
	} else if (e2b_relay_path(url)) {
		return handle_relay(s, conn, method, url, body, cs->envd_id[0] ? cs->envd_id : NULL);
	} else if (!keyless(url)) {
		char id[80], name[ARTIFACT_NAME_MAX];
		int link = artifact_link(s, conn, url, id, sizeof(id), name);

		if (link < 0)
			return reply_bad_link(conn);
		if (link > 0 && strcmp(method, "GET"))
			return reply_error_h(conn, KERR_METHOD_NOT_ALLOWED, "use GET", "Allow", "GET");
		if (link > 0) {
			/* The signature names the task: any customer's. */
			json_t *j = store_task_json(s->st, id, NULL);
			enum MHD_Result ret;

			if (!j)
				return reply_not_found(conn, "no such task");
			ret = artifacts_reply(conn, j, name);
			json_decref(j);
			return ret;
		}
		if (!authenticate(s, conn, url, &c))
			return reply_no_key(conn, url);
		if (is_e2b(url))
			return handle_e2b(s, conn, method, url, body, &c);
		if (ports_code_path(url)) {
			struct sessions *ss;
			struct quota q;

			if (!c.admin && store_customer_quota(s->st, c.customer, &q) < 0)
				return reply_error(conn, KERR_STORE_ERROR, "cannot read the customer's quotas");
			ss = hold_sessions(s);
			if (!ss)
				return reply_error(conn, KERR_UNAVAILABLE, "sessions are not served now");
			return ports_code_handle(ss, conn, method, url, httpd_body_data(body), httpd_body_len(body),
						 c.customer, s->lim, c.admin ? 0 : q.max_streams, c.admin);
		}
		if (!strcmp(url, "/v1/sessions") || !strncmp(url, "/v1/sessions/", 13))
			return handle_sessions(s, conn, method, url, body, &c);
		if (!strcmp(url, "/v1/snapshots") || !strncmp(url, "/v1/snapshots/", 14))
			return handle_snapshots(s, conn, method, url, body, &c);
		if (!strcmp(url, "/v1/volumes") || !strncmp(url, "/v1/volumes/", 12))
			return handle_volumes(s, conn, method, url, body, &c);
		if (!strcmp(url, "/v1/templates") || !strncmp(url, "/v1/templates/", 14))
			return handle_templates(s, conn, method, url, body, &c);
		if (!strncmp(url, "/v1/admin/", 10)) {
			if (!c.admin)
				return reply_error(conn, KERR_FORBIDDEN, "admin endpoints need an admin key");
			if (httpd_body_len(body) > ADMIN_BODY_MAX)
				return reply_error(conn, KERR_TOO_LARGE,
						   "admin bodies are at most 64 KiB");
		}
	}
	r = (struct httpd_req){ .conn = conn, .method = method, .url = url, .body = body, .app = &c };
	return httpd_dispatch(&api_table, s, &r);
}

void server_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct conn_state *cs = *con_cls;

	if (cs) {
		httpd_body_free(&cs->body);
		templates_upload_free(cs->up);
		ports_done(cs->port);
		free(cs->uri);
		free(cs);
	}
	*con_cls = NULL;
}

/* "ADDR:PORT" (IPv4) into sa. */
int server_parse_listen(const char *arg, struct sockaddr_in *sa)
{
	const char *colon = strrchr(arg, ':');
	char host[64];
	char *end;
	long port;

	if (!colon || (size_t)(colon - arg) >= sizeof(host))
		return -1;
	memcpy(host, arg, (size_t)(colon - arg));
	host[colon - arg] = '\0';
	port = strtol(colon + 1, &end, 10);
	if (!colon[1] || *end || port < 0 || port > 65535)
		return -1;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

struct server *server_start(const struct api_config *cfg, struct store *st, const struct server_hooks *hooks,
			    struct kiln_err *err)
{
	struct server *s = calloc(1, sizeof(*s));
	struct sockaddr_in sa;

	if (!s) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		return NULL;
	}
	if (server_parse_listen(cfg->listen, &sa) < 0) {
		free(s);
		kiln_err_set(err, KERR_CONFIG, "listen: expected IPv4-ADDRESS:PORT (got \"%s\")", cfg->listen);
		return NULL;
	}
	s->cfg = cfg;
	s->st = st;
	s->max_body = (size_t)(cfg->max_body_mib ? cfg->max_body_mib : 64) << 20;
	if (cfg->admin_key) {
		SHA256((const unsigned char *)cfg->admin_key, strlen(cfg->admin_key), s->admin_hash);
		s->have_admin = 1;
	}
	if (cfg->cluster_token) {
		SHA256((const unsigned char *)cfg->cluster_token, strlen(cfg->cluster_token), s->token_hash);
		s->have_token = 1;
	}
	if (cfg->s3.secret_key) {
		artifacts_key(cfg->s3.secret_key, s->art_key);
		s->have_art_key = 1;
	}
	if (hooks)
		s->hooks = *hooks;
	if (cfg->ui_dir)
		s->ui_dir = cfg->ui_dir;
	else
		s->ui_dir = ui_default_dir(s->ui_dir_buf, sizeof(s->ui_dir_buf));
	pthread_mutex_init(&s->hooks_lock, NULL);
	s->ev = events_new(st);
	s->lim = quota_limiter_new();
	if (!s->ev || !s->lim) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		goto fail;
	}
	store_set_listener(st, events_store_listener, s->ev);
	/* poll(), not select(): with max_connections past ~1000 a connection's
	 * fd can pass FD_SETSIZE (1024), which select() refuses. */
	s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
					MHD_USE_ERROR_LOG | MHD_ALLOW_UPGRADE,
				ntohs(sa.sin_port), NULL, NULL, server_access, s, MHD_OPTION_NOTIFY_COMPLETED, server_completed, NULL,
				MHD_OPTION_URI_LOG_CALLBACK, server_uri_log, NULL,
				MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_TIMEOUT, cfg->connection_timeout_s,
				MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, cfg->max_connections_per_address,
				MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
	if (!s->d) {
		kiln_err_set(err, KERR_LISTEN, "cannot listen on %s", cfg->listen);
		store_set_listener(st, NULL, NULL);
		goto fail;
	}
	base_url_set(s, &sa);
	if (cfg->tls_listen && server_tls_start(s, err) < 0) {
		MHD_stop_daemon(s->d);
		store_set_listener(st, NULL, NULL);
		goto fail;
	}
	return s;
fail:
	quota_limiter_free(s->lim);
	events_free(s->ev);
	pthread_mutex_destroy(&s->hooks_lock);
	free(s);
	return NULL;
}

void server_set_hooks(struct server *s, const struct server_hooks *hooks)
{
	pthread_mutex_lock(&s->hooks_lock);
	if (hooks)
		s->hooks = *hooks;
	else
		memset(&s->hooks, 0, sizeof(s->hooks));
	pthread_mutex_unlock(&s->hooks_lock);
}

void server_set_sessions(struct server *s, struct sessions *ss)
{
	pthread_mutex_lock(&s->hooks_lock);
	s->sessions = ss;
	pthread_mutex_unlock(&s->hooks_lock);
}

void server_set_templates(struct server *s, struct templates *t)
{
	pthread_mutex_lock(&s->hooks_lock);
	s->templates = t;
	pthread_mutex_unlock(&s->hooks_lock);
}

void server_stop(struct server *s)
{
	if (!s)
		return;
	events_stop(s->ev);
	store_wake_all(s->st);
	server_tls_stop(s);
	MHD_stop_daemon(s->d);
	store_set_listener(s->st, NULL, NULL);
	events_free(s->ev);
	quota_limiter_free(s->lim);
	pthread_mutex_destroy(&s->hooks_lock);
	free(s);
}
