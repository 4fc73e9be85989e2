/* session_volumes: a customer's volumes (docs/api.md "Volumes"), for
 * kiln's /v1/volumes and E2B's /volumes (e2b.c) alike. A volume is a row
 * in the store (name, size) and, once a session that mounted it read-write
 * has paused or ended, objects in S3 under CUSTOMER/volumes/ID/ that the
 * sessions' hosts write; kiln-api reads their size from any live host (GET
 * /v1/volumes/{id}?customer=) and has one delete them when the customer
 * deletes the volume. Mounting is part of a session's create
 * (session_run.c); the one-writer rule is the store's. */
#include "sessions_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "httpd.h"
#include "reply.h"

#define VOLUME_DELETE_TIMEOUT_MS 60000 /* every object under its prefix */

/* Any live host's URL: 1, or 0 when none is live. */
static int live_host(struct sessions *ss, char url[256])
{
	char ids[1][65], urls[1][256];

	if (sched_live_hosts(ss->sched, ids, urls, 1) < 1)
		return 0;
	snprintf(url, 256, "%s", urls[0]);
	return 1;
}

int sessions_volume_create(struct sessions *ss, const struct sessions_request *r, const char *name, long size_mib,
			   struct store_volume *out, enum MHD_Result *ret)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	char id[40], msg[200];
	int cr;

	if (!api_volume_name_ok(name)) {
		*ret = sessions_answer(r, 0, KERR_INVALID_REQUEST,
				       "name: 1-63 characters of A-Z, a-z, 0-9, '.', '_' and '-'", NULL, NULL);
		return 0;
	}
	if (size_mib < SESSIONS_VOLUME_MIB_MIN || size_mib > SESSIONS_VOLUME_MIB_MAX) {
		snprintf(msg, sizeof(msg), "size_mib: an integer from %d to %d", SESSIONS_VOLUME_MIB_MIN,
			 SESSIONS_VOLUME_MIB_MAX);
		*ret = sessions_answer(r, 0, KERR_INVALID_REQUEST, msg, NULL, NULL);
		return 0;
	}
	if (store_customer_quota(ss->st, r->customer, &q) < 0) {
		*ret = sessions_answer(r, 0, KERR_FORBIDDEN, "this key's customer no longer exists", NULL, NULL);
		return 0;
	}
	if (q.max_volume_mib && (unsigned long)size_mib > q.max_volume_mib) {
		snprintf(msg, sizeof(msg), "size_mib: %ld MiB is over your quota's max_volume_mib (%u)", size_mib,
			 q.max_volume_mib);
		*ret = sessions_answer(r, 0, KERR_OVER_QUOTA, msg, NULL, NULL);
		return 0;
	}
	cr = store_volume_create(ss->st, r->customer, name, (unsigned)size_mib, q.max_volumes, id, &err);
	if (cr < 0) {
		*ret = sessions_answer_err(r, cr == -EDQUOT ? MHD_HTTP_TOO_MANY_REQUESTS : cr == -EEXIST ? MHD_HTTP_CONFLICT
												 : MHD_HTTP_INTERNAL_SERVER_ERROR,
					   &err, NULL, NULL);
		return 0;
	}
	if (store_volume_get(ss->st, id, r->customer, out) < 0) {
		*ret = sessions_answer(r, 0, KERR_STORE_ERROR, "the volume cannot be read back", NULL, NULL);
		return 0;
	}
	fprintf(stderr, "kiln-api: volume %s (%s, %u MiB) of %s created\n", out->id, out->name, out->size_mib,
		r->customer);
	return 1;
}

json_t *sessions_volume_bytes(struct sessions *ss, const struct store_volume *v)
{
	struct kiln_err err = { .code = "" };
	json_t *reply = NULL, *b;
	char url[256], path[200];
	int st;

	if (!live_host(ss, url))
		return json_null();
	snprintf(path, sizeof(path), "/v1/volumes/%s?customer=%s", v->id, v->customer);
	st = sessions_host_call(ss, url, "GET", path, NULL, SHORT_TIMEOUT_MS, &reply, &err);
	b = st == 200 && json_is_integer(json_object_get(reply, "bytes")) ? json_incref(json_object_get(reply, "bytes"))
									   : json_null();
	json_decref(reply);
	return b;
}

int sessions_volume_delete(struct sessions *ss, const struct sessions_request *r, const struct store_volume *v,
			   enum MHD_Result *ret)
{
	struct kiln_err err = { .code = "" };
	char url[256], path[200], msg[300];
	int m, st;

	/* No host to delete its objects: nothing changes. */
	if (!live_host(ss, url)) {
		*ret = sessions_answer(r, 0, KERR_HOST_UNAVAILABLE,
				       "no host is live to delete the volume's objects: nothing was changed, retry later",
				       "Retry-After", RETRY_AFTER_S);
		return 0;
	}
	/* Marked first (no session can mount it from now on), refused while
	 * a session that is not destroyed mounts it. */
	m = store_volume_mark_deleted(ss->st, v->id, r->customer, &err);
	if (m == -EBUSY) {
		*ret = sessions_answer_err(r, 0, &err, NULL, NULL);
		return 0;
	}
	if (m < 0) {
		*ret = sessions_answer(r, 0, KERR_STORE_ERROR, "cannot delete the volume", NULL, NULL);
		return 0;
	}
	if (m == 0) {
		*ret = sessions_answer(r, 0, KERR_NOT_FOUND, "no such volume", NULL, NULL);
		return 0;
	}
	snprintf(path, sizeof(path), "/v1/volumes/%s?customer=%s", v->id, v->customer);
	st = sessions_host_call(ss, url, "DELETE", path, NULL, VOLUME_DELETE_TIMEOUT_MS, NULL, &err);
	if (st != 200) {
		/* Its objects are still there: the volume is back as it was. */
		if (store_volume_unmark_deleted(ss->st, v->id) != 1)
			fprintf(stderr, "kiln-api: volume %s of %s: deleted, but its objects may be left in S3\n", v->id,
				v->customer);
		if (st < 0)
			snprintf(msg, sizeof(msg), "the volume's objects could not be deleted (%.200s): nothing was"
				 " changed, retry later", err.message);
		else
			snprintf(msg, sizeof(msg), "the volume's objects could not be deleted (its host answered HTTP %d):"
				 " nothing was changed, retry later", st);
		*ret = sessions_answer(r, MHD_HTTP_SERVICE_UNAVAILABLE, KERR_HOST_UNAVAILABLE, msg, "Retry-After",
				       RETRY_AFTER_S);
		return 0;
	}
	fprintf(stderr, "kiln-api: volume %s (%s) of %s deleted with its objects\n", v->id, v->name, v->customer);
	return 1;
}

/* ---- /v1/volumes ---- */

struct vol_call {
	struct sessions *ss;
	const struct sessions_request *r;
};

/* POST /v1/volumes {"name","size_mib"?} */
static enum MHD_Result vol_create(void *ctx, struct httpd_req *req)
{
	struct vol_call *c = ctx;
	struct store_volume v;
	enum MHD_Result ret;
	json_error_t je;
	const char *k;
	json_t *b, *x, *j;
	long size = SESSIONS_VOLUME_MIB_DEFAULT;
	char name[STORE_VOLUME_NAME_MAX + 1];

	if (c->r->len > API_SESSION_BODY_MAX)
		return reply_error(req->conn, KERR_TOO_LARGE, "the body is too large");
	b = json_loadb(c->r->body ? c->r->body : "", c->r->len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(b)) {
		ret = reply_error(req->conn, b ? KERR_INVALID_REQUEST : KERR_INVALID_JSON,
				  b ? "the body is not a JSON object" : "the body is not JSON");
		json_decref(b);
		return ret;
	}
	json_object_foreach(b, k, x)
		if (strcmp(k, "name") && strcmp(k, "size_mib")) {
			json_decref(b);
			return reply_error(req->conn, KERR_INVALID_REQUEST,
					   "a volume has only \"name\" and \"size_mib\": leave out the rest");
		}
	x = json_object_get(b, "name");
	if (!json_is_string(x) || strlen(json_string_value(x)) != json_string_length(x) ||
	    json_string_length(x) > STORE_VOLUME_NAME_MAX) {
		json_decref(b);
		return reply_error(req->conn, KERR_INVALID_REQUEST,
				   "name: 1-63 characters of A-Z, a-z, 0-9, '.', '_' and '-' (required)");
	}
	snprintf(name, sizeof(name), "%s", json_string_value(x));
	x = json_object_get(b, "size_mib");
	if (x && !json_is_null(x)) {
		if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1 << 30) {
			json_decref(b);
			return reply_error(req->conn, KERR_INVALID_REQUEST, "size_mib: an integer from 16 to 65536");
		}
		size = (long)json_integer_value(x);
	}
	json_decref(b);
	if (!sessions_volume_create(c->ss, c->r, name, size, &v, &ret))
		return ret;
	j = store_volume_json(c->ss->st, &v);
	return j ? reply_json(req->conn, MHD_HTTP_CREATED, j) : reply_internal(req->conn, "the volume cannot be read back");
}

/* GET /v1/volumes?name= */
static enum MHD_Result vol_list(void *ctx, struct httpd_req *req)
{
	struct vol_call *c = ctx;
	const char *name = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "name");
	json_t *arr;

	if (name && !name[0])
		name = NULL;
	if (name && !api_volume_name_ok(name))
		return reply_error(req->conn, KERR_INVALID_REQUEST, "name: 1-63 characters of A-Z, a-z, 0-9, '.', '_' and '-'");
	arr = store_volume_list(c->ss->st, c->r->customer, name);
	if (!arr)
		return reply_error(req->conn, KERR_STORE_ERROR, "cannot list the volumes");
	return reply_json(req->conn, MHD_HTTP_OK, json_pack("{s:o}", "volumes", arr));
}

/* GET /v1/volumes/{id or name} */
static enum MHD_Result vol_get(void *ctx, struct httpd_req *req)
{
	struct vol_call *c = ctx;
	struct store_volume v;
	json_t *j;

	if (store_volume_get(c->ss->st, req->param[0], c->r->customer, &v) < 0)
		return reply_not_found(req->conn, "no such volume");
	j = store_volume_json(c->ss->st, &v);
	if (!j)
		return reply_internal(req->conn, "cannot read the volume");
	json_object_set_new(j, "bytes", sessions_volume_bytes(c->ss, &v));
	return reply_json(req->conn, MHD_HTTP_OK, j);
}

/* DELETE /v1/volumes/{id or name} */
static enum MHD_Result vol_delete(void *ctx, struct httpd_req *req)
{
	struct vol_call *c = ctx;
	struct store_volume v;
	enum MHD_Result ret;

	if (store_volume_get(c->ss->st, req->param[0], c->r->customer, &v) < 0)
		return reply_not_found(req->conn, "no such volume");
	if (!sessions_volume_delete(c->ss, c->r, &v, &ret))
		return ret;
	return reply_json(req->conn, MHD_HTTP_OK, json_pack("{s:s, s:b}", "id", v.id, "deleted", 1));
}

static const struct httpd_route volume_routes[] = {
	{ "GET", "/v1/volumes", vol_list },
	{ "POST", "/v1/volumes", vol_create },
	{ "GET", "/v1/volumes/{id}", vol_get },
	{ "DELETE", "/v1/volumes/{id}", vol_delete },
};

static const struct httpd_routes volume_table = {
	volume_routes, sizeof(volume_routes) / sizeof(volume_routes[0]), "no such endpoint", ", ",
};

enum MHD_Result sessions_volumes_handle(struct sessions *ss, const struct sessions_request *r)
{
	struct vol_call c = { .ss = ss, .r = r };
	struct httpd_req req = { .conn = r->conn, .method = r->method };
	char url[sizeof(req.path_)];
	enum MHD_Result ret;

	if (r->admin)
		ret = reply_error(r->conn, KERR_FORBIDDEN, "volumes are a customer's: use a customer key");
	else if ((size_t)snprintf(url, sizeof(url), "/v1/volumes%s", r->path) >= sizeof(url))
		ret = reply_not_found(r->conn, "no such endpoint");
	else {
		req.url = url;
		ret = httpd_dispatch(&volume_table, &c, &req);
	}
	sessions_release(ss);
	return ret;
}
