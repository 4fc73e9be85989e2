/* server_admin: kiln-api's destination, admin and host routes (docs/api.md,
 * "kiln-api"): a customer's own S3 destination (destination.h), for the
 * customer and for the admin; customers, their quotas and keys; the hosts'
 * list and their heartbeats (checked for the cluster token in server.c
 * before the table). */
#include "server_int.h"

#include "spec.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "base/base.h"
#include "clock.h"
#include "reply.h"
#include "store/store.h"
#include "templates/templates.h"

/* ---- the customer's own S3 destination (destination.h) ---- */

static void dest_changed_hook(void *ctx, const char *customer)
{
	struct server *s = ctx;

	pthread_mutex_lock(&s->hooks_lock);
	if (s->hooks.destination_changed)
		s->hooks.destination_changed(s->hooks.ctx, customer);
	pthread_mutex_unlock(&s->hooks_lock);
}

static enum MHD_Result dest_route(struct server *s, struct httpd_req *r, const char *customer, int test)
{
	struct destination_hooks h = { dest_changed_hook, s };

	return destination_handle(s->st, s->cfg->have_dest_key ? s->cfg->dest_key : NULL, &s->cfg->dest_allow, &h,
				  r->conn, r->method, customer, test, httpd_body_data(r->body),
				  httpd_body_len(r->body));
}

enum MHD_Result server_rt_dest(void *ctx, struct httpd_req *r)
{
	const struct caller *c = r->app;

	if (c->admin)
		return reply_error(r->conn, KERR_FORBIDDEN,
				   "an admin key has no destination: use /v1/admin/customers/{id}/destination");
	return dest_route(ctx, r, c->customer, 0);
}

enum MHD_Result server_rt_dest_test(void *ctx, struct httpd_req *r)
{
	const struct caller *c = r->app;

	if (c->admin)
		return reply_error(r->conn, KERR_FORBIDDEN,
				   "an admin key has no destination: use /v1/admin/customers/{id}/destination/test");
	return dest_route(ctx, r, c->customer, 1);
}

enum MHD_Result server_rt_admin_dest(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;

	if (strlen(r->param[0]) >= 65 || store_customer_quota(s->st, r->param[0], &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	return dest_route(s, r, r->param[0], 0);
}

enum MHD_Result server_rt_admin_dest_test(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;

	if (strlen(r->param[0]) >= 65 || store_customer_quota(s->st, r->param[0], &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	return dest_route(s, r, r->param[0], 1);
}

/* ---- admin ---- */

/* POST /v1/admin/customers */
enum MHD_Result server_rt_customer_create(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	char id[65], name[API_NAME_MAX + 1];
	struct quota q = s->cfg->quotas;

	if (api_customer_request_parse(httpd_body_data(r->body), httpd_body_len(r->body), id, name, &q, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (store_customer_create(s->st, id, name, &q, &err) < 0)
		return reply_err(r->conn, &err);
	return reply_json(r->conn, MHD_HTTP_CREATED, store_customer_json(s->st, id));
}

/* The customer named by the path (r->param[0]) into id, with its quota:
 * 0, or -1 when there is no such customer. */
static int admin_customer(struct server *s, struct httpd_req *r, char id[65], struct quota *q)
{
	if (strlen(r->param[0]) >= 65)
		return -1;
	snprintf(id, 65, "%s", r->param[0]);
	return store_customer_quota(s->st, id, q) < 0 ? -1 : 0;
}

/* GET /v1/admin/customers/{id} */
enum MHD_Result server_rt_customer_get(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;
	struct usage u;
	unsigned snaps = 0, vols = 0;
	uint64_t snap_bytes = 0;
	char id[65];
	json_t *j;

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	j = store_customer_json(s->st, id);
	if (j && store_customer_usage(s->st, id, &u) == 0 && store_snapshot_usage(s->st, id, &snaps, &snap_bytes) == 0 &&
	    store_volume_count(s->st, id, &vols) == 0)
		json_object_set_new(j, "usage",
				    json_pack("{s:i, s:i, s:I, s:i, s:i, s:i, s:i, s:I, s:i}", "running", (int)u.running, "vcpus",
					      (int)u.vcpus, "memory_mib", (json_int_t)u.memory_mib, "queued", (int)u.queued,
					      "sessions", (int)u.sessions, "paused_sessions", (int)u.paused_sessions,
					      "snapshots", (int)snaps, "snapshot_bytes", (json_int_t)snap_bytes, "volumes",
					      (int)vols));
	return j ? reply_json(r->conn, MHD_HTTP_OK, j) : reply_internal(r->conn, "cannot read the customer");
}

/* GET /v1/admin/customers?limit=&cursor=: customers by id, with their quotas */
enum MHD_Result server_rt_customer_list(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const char *lim = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
	const char *cur = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "cursor");
	long limit = 100;
	char *end;
	json_t *list, *last;

	if (lim) {
		limit = strtol(lim, &end, 10);
		if (!*lim || *end || limit < 1 || limit > 1000)
			return reply_error(r->conn, KERR_INVALID_REQUEST, "limit: must be an integer from 1 to 1000");
	}
	if (cur && strlen(cur) > 64)
		return reply_error(r->conn, KERR_INVALID_REQUEST, "cursor: not one this server gave");
	list = store_customer_list(s->st, cur, (unsigned)limit);
	last = json_array_size(list) == (size_t)limit ? json_array_get(list, json_array_size(list) - 1) : NULL;
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:o, s:O}", "customers", list, "next_cursor",
				    last ? json_object_get(last, "id") : json_null()));
}

/* GET /v1/admin/customers/{id}/keys: its keys' ids and dates, never a secret */
enum MHD_Result server_rt_customer_keys(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;
	char id[65];

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	return reply_json(r->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:o}", "customer", id, "keys", store_key_list(s->st, id)));
}

/* PUT /v1/admin/customers/{id}/quotas */
enum MHD_Result server_rt_customer_quotas(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	struct quota q;
	char id[65];

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	if (api_quota_request_parse(httpd_body_data(r->body), httpd_body_len(r->body), &q, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (store_customer_set_quota(s->st, id, &q, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, &err);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:o}", "id", id, "quotas", quota_to_json(&q)));
}

/* POST /v1/admin/customers/{id}/keys */
enum MHD_Result server_rt_customer_key(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	char *key = NULL, key_id[32], id[65];
	struct quota q;
	json_t *j;

	if (admin_customer(s, r, id, &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	if (store_key_create(s->st, id, 0, &key, key_id, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, &err);
	j = json_pack("{s:s, s:s, s:s}", "key", key, "key_id", key_id, "customer", id);
	OPENSSL_cleanse(key, strlen(key));
	free(key);
	return reply_json(r->conn, MHD_HTTP_CREATED, j);
}

/* DELETE /v1/admin/keys/{id} */
enum MHD_Result server_rt_key_revoke(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const char *kid = r->param[0];
	int rc;

	if (strlen(kid) >= 32)
		return reply_not_found(r->conn, "no such key");
	rc = store_key_revoke(s->st, kid);
	if (rc == -ENOENT)
		return reply_not_found(r->conn, "no such key");
	if (rc < 0)
		return reply_internal(r->conn, "cannot revoke the key");
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:s, s:b}", "key_id", kid, "revoked", 1));
}

/* GET /v1/admin/hosts */
enum MHD_Result server_rt_hosts(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	int64_t cutoff = clock_wall_ms() - (int64_t)s->cfg->host_lost_after_s * 1000;
	json_t *hosts = store_host_list(s->st), *h;
	size_t i;

	/* A host the scheduler has not yet marked shows as lost once its
	 * heartbeat is older than host_lost_after_s. A draining one says what
	 * it still holds and, once nothing, that it is drained. */
	json_array_foreach(hosts, i, h) {
		unsigned tasks, sessions;

		if (json_integer_value(json_object_get(h, "last_heartbeat_ms")) < cutoff)
			json_object_set_new(h, "state", json_string("lost"));
		if (!json_is_true(json_object_get(h, "draining")) ||
		    store_host_load(s->st, json_string_value(json_object_get(h, "id")), &tasks, &sessions) < 0)
			continue;
		json_object_set_new(h, "tasks_left", json_integer(tasks));
		json_object_set_new(h, "sessions_left", json_integer(sessions));
		json_object_set_new(h, "drained", json_boolean(!tasks && !sessions));
	}
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:o}", "hosts", hosts));
}

/* The host of a drain route as store_host_list has it (caller decrefs), or
 * NULL: none by that id. */
static json_t *admin_host(struct server *s, const char *id)
{
	json_t *hosts = store_host_list(s->st), *h, *found = NULL;
	size_t i;

	json_array_foreach(hosts, i, h)
		if (!strcmp(json_string_value(json_object_get(h, "id")) ?: "", id))
			found = json_incref(h);
	json_decref(hosts);
	return found;
}

/* POST /v1/admin/hosts/{id}/drain: {"deadline_s": N} optional (1..604800):
 * past it, tasks still running there go back to the queue. */
enum MHD_Result server_rt_host_drain(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const char *id = r->param[0];
	json_int_t deadline_s = 0;
	json_t *h;
	int rc;

	if (strlen(id) >= 65 || !(h = admin_host(s, id)))
		return reply_not_found(r->conn, "no such host");
	json_decref(h);
	if (httpd_body_len(r->body) > ADMIN_BODY_MAX)
		return reply_error(r->conn, KERR_TOO_LARGE, "a drain request is at most 64 KiB");
	if (httpd_body_len(r->body)) {
		json_t *b = json_loadb(httpd_body_data(r->body), httpd_body_len(r->body), 0, NULL);
		json_t *d = json_object_get(b, "deadline_s");

		if (!json_is_object(b) || (d && !json_is_null(d) && !json_is_integer(d))) {
			json_decref(b);
			return reply_error(r->conn, KERR_INVALID_REQUEST,
					   "expected {\"deadline_s\": N} (seconds, optional)");
		}
		deadline_s = json_integer_value(d);
		json_decref(b);
		if (d && !json_is_null(d) && (deadline_s < 1 || deadline_s > SPEC_DRAIN_DEADLINE_MAX_S))
			return reply_error(r->conn, KERR_INVALID_REQUEST, "deadline_s: 1..604800 (seconds)");
	}
	rc = store_host_set_drain(s->st, id, 1, deadline_s ? clock_wall_ms() + (int64_t)deadline_s * 1000 : 0);
	if (rc == -ENOENT)
		return reply_not_found(r->conn, "no such host");
	if (rc < 0)
		return reply_internal(r->conn, "cannot record the drain");
	h = admin_host(s, id);
	return h ? reply_json(r->conn, MHD_HTTP_OK, h) : reply_internal(r->conn, "cannot read the host");
}

/* POST /v1/admin/hosts/{id}/undrain. A host that itself reports draining
 * (kiln-host drain) stays so until kiln-host undrain: 409. */
enum MHD_Result server_rt_host_undrain(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	const char *id = r->param[0];
	json_t *h;
	int rc;

	if (strlen(id) >= 65 || !(h = admin_host(s, id)))
		return reply_not_found(r->conn, "no such host");
	json_decref(h);
	rc = store_host_set_drain(s->st, id, 0, 0);
	if (rc == -ENOENT)
		return reply_not_found(r->conn, "no such host");
	if (rc < 0)
		return reply_internal(r->conn, "cannot record the undrain");
	h = admin_host(s, id);
	if (!h)
		return reply_internal(r->conn, "cannot read the host");
	if (json_is_true(json_object_get(json_object_get(h, "capacity"), "draining"))) {
		json_decref(h);
		return reply_error_status(r->conn, MHD_HTTP_CONFLICT, KERR_CONFLICT,
					  "the host itself reports draining (kiln-host drain): run kiln-host undrain on it");
	}
	return reply_json(r->conn, MHD_HTTP_OK, h);
}

/* POST /v1/hosts/{id}/heartbeat (the cluster token was checked before) */
enum MHD_Result server_rt_host_heartbeat(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct kiln_err err = { .code = "" };
	const char *id = r->param[0];
	char url[API_URL_MAX + 1];
	json_t *cap;

	if (strlen(id) >= 65)
		return reply_not_found(r->conn, "no such endpoint");
	if (!api_id_ok(id))
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   "host id: 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (httpd_body_len(r->body) > ADMIN_BODY_MAX)
		return reply_error(r->conn, KERR_TOO_LARGE, "heartbeats are at most 64 KiB");
	if (api_heartbeat_parse(httpd_body_data(r->body), httpd_body_len(r->body), url, &cap, &err) < 0)
		return reply_err_status(r->conn, MHD_HTTP_BAD_REQUEST, &err);
	if (s->cfg->hosts_require_tls && strncmp(url, "https://", 8)) {
		json_decref(cap);
		return reply_error(r->conn, KERR_INVALID_REQUEST,
				   "url: this kiln-api requires hosts to serve TLS (hosts.require_tls): expected an "
				   "https:// URL (set the host's tls section and advertise https://)");
	}
	if (store_host_heartbeat(s->st, id, url, cap, &err) < 0) {
		json_decref(cap);
		return reply_err_status(r->conn, MHD_HTTP_INTERNAL_SERVER_ERROR, &err);
	}
	templates_heartbeat(s->st, cap);
	json_decref(cap);
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:b}", "ok", 1));
}
