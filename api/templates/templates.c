/* templates: the /v1/templates endpoints (see templates.h, docs/api.md
 * "Templates"): create (a JSON recipe, or an OCI archive streamed to a
 * spool file under the customer's max_template_mib and uploaded to S3),
 * list, get, delete, and the build's events stream. Everything is in the
 * store (the row is committed before the 202); an events stream reads the
 * row (its log is kept with a count of every byte ever written, so a reader
 * knows what it missed) and waits on t->cond, broadcast on every change.
 * The builder is template_build.c, resolution template_use.c. */
#include "templates_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "buf.h"
#include "condwait.h"
#include "httpd.h"
#include "recipe.h"
#include "reply.h"
#include "s3.h"
#include "spec.h"
#include "store/store.h"

#define KEEPALIVE_MS 15000

/* ---- endpoints ---- */

struct call {
	struct templates *t;
	const char *body;
	size_t len;
	const char *customer;
	int admin;
	struct quota_limiter *lim;
};

static enum MHD_Result reply_template(struct templates *t, struct MHD_Connection *conn, unsigned status,
				      const char *id, int log)
{
	json_t *j = store_template_json(t->st, id, log);

	return j ? reply_json(conn, status, j) : reply_internal(conn, "the template cannot be read back");
}

/* 202 with the new template as stored (queued), then the builder is woken:
 * the answer never shows a later state than the one committed for it. */
static enum MHD_Result reply_created(struct templates *t, struct MHD_Connection *conn, const char *id)
{
	json_t *j = store_template_json(t->st, id, 0);

	tpl_wake(t);
	return j ? reply_json(conn, MHD_HTTP_ACCEPTED, j) : reply_internal(conn, "the template cannot be read back");
}

/* The quotas that refuse a new template before anything is read or built:
 * MHD_YES and *ok 1 when it may go on. */
static enum MHD_Result admit(struct templates *t, struct MHD_Connection *conn, const char *customer, int *ok)
{
	struct kiln_err err = { .code = "" };
	struct quota q;
	unsigned count = 0;
	double build_s = 0;

	*ok = 0;
	if (store_customer_quota(t->st, customer, &q) < 0)
		return reply_error(conn, KERR_FORBIDDEN, "this key's customer no longer exists");
	if (store_template_usage(t->st, customer, &count, &build_s) < 0)
		return reply_internal(conn, "cannot read the usage");
	if (quota_check_build(&q, count, build_s, &err) < 0)
		return reply_err(conn, &err);
	*ok = 1;
	return MHD_YES;
}

/* POST /v1/templates with a JSON recipe */
static enum MHD_Result handle_create(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct templates *t = c->t;
	struct kiln_err err = { .code = "" };
	struct recipe r;
	struct quota q;
	char id[40];
	enum MHD_Result ret;
	char *text;
	int ok;

	if (c->admin)
		return reply_error(req->conn, KERR_FORBIDDEN, "an admin key cannot create templates: use a customer key");
	if (MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "name"))
		return reply_error(req->conn, KERR_INVALID_REQUEST,
				   "?name= is for OCI archives (Content-Type: application/x-tar); a recipe names itself");
	if (!c->body || !c->len)
		return reply_error(req->conn, KERR_INVALID_JSON, "the body must be a recipe (a JSON object)");
	if (c->len > RECIPE_MAX_JSON)
		return reply_error(req->conn, KERR_TOO_LARGE, "a recipe is at most 24 MiB");
	if (recipe_parse(c->body, c->len, &r, &err) < 0)
		return reply_err_status(req->conn, MHD_HTTP_BAD_REQUEST, &err);
	ret = admit(t, req->conn, c->customer, &ok);
	if (!ok) {
		recipe_free(&r);
		return ret;
	}
	tpl_customer_quota(t->st, c->customer, &q);
	{
		json_t *j = json_loadb(c->body, c->len, 0, NULL);

		text = j ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
	}
	if (!text || store_template_new_id(id) < 0) {
		free(text);
		recipe_free(&r);
		return reply_internal(req->conn, "out of memory");
	}
	{
		struct store_template_new n = {
			.customer = c->customer, .name = r.name, .kind = "recipe", .recipe_json = text,
			.max_templates = q.max_templates,
		};

		ok = store_template_create(t->st, id, &n, &err);
	}
	free(text);
	recipe_free(&r);
	if (ok < 0)
		return reply_err(req->conn, &err);
	return reply_created(t, req->conn, id);
}

/* GET /v1/templates */
static enum MHD_Result handle_list(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	json_t *arr = store_template_list(c->t->st, c->customer);

	if (!arr)
		return reply_internal(req->conn, "cannot list the templates");
	return reply_json(req->conn, MHD_HTTP_OK, json_pack("{s:o}", "templates", arr));
}

/* The template {name} names for the caller (own, else public): 0, or -1
 * with the 404 answered (another customer's is exactly as missing). */
static int named(struct call *c, struct httpd_req *req, struct store_template *row, enum MHD_Result *ret)
{
	const char *name = req->param[0];

	if (spec_template_name_check(name, "name", NULL) < 0 || store_template_find(c->t->st, c->customer, name, row) < 0) {
		char msg[128];

		snprintf(msg, sizeof(msg), "no template named %.70s", name);
		*ret = reply_error(req->conn, KERR_NOT_FOUND, msg);
		return -1;
	}
	return 0;
}

/* GET /v1/templates/{name} */
static enum MHD_Result handle_get(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct store_template row;
	enum MHD_Result ret;

	if (named(c, req, &row, &ret) < 0)
		return ret;
	return reply_template(c->t, req->conn, MHD_HTTP_OK, row.id, 1);
}

/* DELETE /v1/templates/{name} */
static enum MHD_Result handle_delete(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct kiln_err err = { .code = "" };
	struct store_template row;
	enum MHD_Result ret;
	int r;

	if (named(c, req, &row, &ret) < 0)
		return ret;
	if (!row.customer[0])
		return reply_error(req->conn, KERR_FORBIDDEN, "public templates cannot be deleted");
	r = store_template_delete(c->t->st, row.id, &err);
	if (r == -EBUSY)
		return reply_err(req->conn, &err);
	if (r == -ENOENT) {
		char msg[128];

		snprintf(msg, sizeof(msg), "no template named %s", row.name);
		return reply_error(req->conn, KERR_NOT_FOUND, msg);
	}
	if (r < 0)
		return reply_internal(req->conn, "cannot delete the template");
	fprintf(stderr, "kiln-api: template %s (%s, %s) deleted\n", row.name, row.id, template_state_name(row.state));
	tpl_wake(c->t);
	return reply_json(req->conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:s, s:b, s:b}", "id", row.id, "name", row.name, "deleted", 1, "cancelled",
				    row.state == TEMPLATE_BUILDING || row.state == TEMPLATE_QUEUED));
}

/* GET /v1/templates/{name}/events: "state" on every change, "log"
 * {"line"} per line of build output, "truncated" {"skipped"} for lines no
 * longer kept, and a final "end" {"state","error"?,"sha256"?}. */
struct tsse {
	struct templates *t;
	char id[40];
	uint64_t pos;                /* log bytes sent (of log_total) */
	enum template_state sent;    /* last state sent (TEMPLATE_STATE_COUNT: none) */
	int done;
	struct buf out;              /* formatted, not yet handed to libmicrohttpd */
	size_t off;
	struct quota_limiter *lim;   /* counted there as one of customer's streams (NULL: not) */
	char customer[65];
};

/* Format what is new into e->out. 1 something added, 0 nothing, -1 the end
 * was added (or the row is gone). */
static int tsse_fill(struct tsse *e)
{
	enum template_state state;
	uint64_t total;
	char *log;
	json_t *error;
	int added = 0, r;

	r = store_template_progress(e->t->st, e->id, &state, &total, &log, &error);
	if (r == -ENOENT) {
		reply_sse_event(&e->out, "end", "{\"state\":\"deleted\"}");
		return -1;
	}
	if (r < 0)
		return 0;
	{
		size_t len = strlen(log);
		uint64_t first = total - len; /* the first byte still kept */
		const char *p, *nl;

		if (e->pos < first) {
			char d[64];

			snprintf(d, sizeof(d), "{\"skipped_bytes\":%llu}", (unsigned long long)(first - e->pos));
			reply_sse_event(&e->out, "truncated", d);
			e->pos = first;
			/* The kept part may start mid-line: resume at the next line. */
			if ((nl = memchr(log, '\n', len)))
				e->pos += (uint64_t)(nl + 1 - log);
		}
		p = log + (e->pos - first);
		while ((nl = strchr(p, '\n'))) {
			json_t *d = json_pack("{s:s%}", "line", p, (size_t)(nl - p));
			char *text = d ? json_dumps(d, JSON_COMPACT) : NULL;

			if (text)
				reply_sse_event(&e->out, "log", text);
			free(text);
			json_decref(d);
			e->pos += (uint64_t)(nl + 1 - p);
			p = nl + 1;
			added = 1;
		}
	}
	free(log);
	if (state != e->sent) {
		char d[48];

		snprintf(d, sizeof(d), "{\"state\":\"%s\"}", template_state_name(state));
		reply_sse_event(&e->out, "state", d);
		e->sent = state;
		added = 1;
	}
	if (state == TEMPLATE_READY || state == TEMPLATE_FAILED) {
		json_t *j = store_template_json(e->t->st, e->id, 0), *d;
		char *text;

		d = json_pack("{s:s, s:O?, s:O?, s:O?}", "state", template_state_name(state), "error",
			      json_is_object(error) ? error : NULL, "sha256", json_object_get(j, "sha256"), "size",
			      json_object_get(j, "size"));
		text = d ? json_dumps(d, JSON_COMPACT) : NULL;
		reply_sse_event(&e->out, "end", text ? text : "{}");
		free(text);
		json_decref(d);
		json_decref(j);
		json_decref(error);
		return -1;
	}
	json_decref(error);
	return added;
}

static ssize_t tsse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct tsse *e = cls;
	int64_t deadline = clock_mono_ms() + KEEPALIVE_MS;

	(void)pos;
	for (;;) {
		uint64_t gen;

		if (e->off < e->out.len) {
			size_t n = e->out.len - e->off < max ? e->out.len - e->off : max;

			memcpy(buf, e->out.p + e->off, n);
			e->off += n;
			if (e->off == e->out.len) {
				e->out.len = 0;
				e->off = 0;
			}
			return (ssize_t)n;
		}
		if (e->done || tpl_stopping(e->t))
			return MHD_CONTENT_READER_END_OF_STREAM;
		pthread_mutex_lock(&e->t->lock);
		gen = e->t->gen;
		pthread_mutex_unlock(&e->t->lock);
		if (tsse_fill(e) < 0)
			e->done = 1;
		if (e->out.len)
			continue;
		pthread_mutex_lock(&e->t->lock);
		while (e->t->gen == gen && !e->t->stopping && clock_mono_ms() < deadline)
			condwait_until(&e->t->cond, &e->t->lock, NULL, deadline);
		pthread_mutex_unlock(&e->t->lock);
		if (clock_mono_ms() >= deadline)
			return reply_sse_keepalive(buf, max);
	}
}

static void tsse_free(void *cls)
{
	struct tsse *e = cls;

	/* However the stream ends (its end, the client gone, the daemon
	 * stopping): the count goes back. */
	if (e->lim)
		quota_limiter_stream_close(e->lim, e->customer);
	buf_free(&e->out);
	free(e);
}

static enum MHD_Result handle_events(void *ctx, struct httpd_req *req)
{
	struct call *c = ctx;
	struct store_template row;
	enum MHD_Result ret;
	struct tsse *e;

	if (named(c, req, &row, &ret) < 0)
		return ret;
	e = calloc(1, sizeof(*e));
	if (!e)
		return MHD_NO;
	if (c->lim && !c->admin) {
		struct quota q;

		tpl_customer_quota(c->t->st, c->customer, &q);
		if (!quota_limiter_stream_open(c->lim, c->customer, q.max_streams)) {
			free(e);
			return reply_too_many_streams(req->conn, q.max_streams);
		}
		e->lim = c->lim;
		snprintf(e->customer, sizeof(e->customer), "%s", c->customer);
	}
	e->t = c->t;
	snprintf(e->id, sizeof(e->id), "%s", row.id);
	e->sent = TEMPLATE_STATE_COUNT;
	buf_init(&e->out, 0);
	return reply_sse(req->conn, 16384, tsse_read, e, tsse_free);
}

static const struct httpd_route routes[] = {
	{ "GET", "/v1/templates", handle_list },
	{ "POST", "/v1/templates", handle_create },
	{ "GET", "/v1/templates/{name}", handle_get },
	{ "DELETE", "/v1/templates/{name}", handle_delete },
	{ "GET", "/v1/templates/{name}/events", handle_events },
};

static const struct httpd_routes table = { routes, sizeof(routes) / sizeof(routes[0]), "no such endpoint", " or " };

enum MHD_Result templates_handle(struct templates *t, struct MHD_Connection *conn, const char *method,
				 const char *url, const char *body, size_t len, const char *customer, int admin,
				 struct quota_limiter *lim)
{
	struct call c = { .t = t, .body = body, .len = len, .customer = customer, .admin = admin, .lim = lim };
	struct httpd_req r = { .conn = conn, .method = method, .url = url };

	return httpd_dispatch(&table, &c, &r);
}

/* ---- OCI uploads ---- */

struct templates_upload {
	struct templates *t;
	char customer[65], name[64], id[40];
	char path[256];
	int fd;
	uint64_t n, cap;
	int too_big, io_error;
	uint64_t dropped;
	unsigned cap_mib;
};

int templates_is_upload(struct MHD_Connection *conn, const char *method, const char *url)
{
	const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);

	if (strcmp(method, "POST") || strcmp(url, "/v1/templates"))
		return 0;
	return ct && strncasecmp(ct, "application/json", 16);
}

enum MHD_Result templates_upload_begin(struct templates *t, struct MHD_Connection *conn, const char *customer,
				       int admin, struct templates_upload **upp)
{
	const char *name = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "name");
	const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	struct kiln_err err = { .code = "" };
	struct templates_upload *up;
	const char *dir = getenv("TMPDIR");
	enum MHD_Result ret;
	struct quota q;
	int ok;

	*upp = NULL;
	if (admin)
		return reply_error(conn, KERR_FORBIDDEN, "an admin key cannot create templates: use a customer key");
	if (!name)
		return reply_error(conn, KERR_INVALID_REQUEST,
				   "an OCI archive needs ?name=NAME (a recipe is sent as Content-Type: application/json)");
	if (spec_template_name_check(name, "name", &err) < 0)
		return reply_error(conn, KERR_INVALID_REQUEST, err.message);
	if (!t->cfg->s3.endpoint)
		return reply_error(conn, KERR_NO_S3, "this kiln-api has no S3 configured: OCI archives cannot be stored");
	ret = admit(t, conn, customer, &ok);
	if (!ok)
		return ret;
	tpl_customer_quota(t->st, customer, &q);
	up = calloc(1, sizeof(*up));
	if (!up)
		return MHD_NO;
	up->t = t;
	up->fd = -1;
	up->cap_mib = q.max_template_mib;
	up->cap = q.max_template_mib ? (uint64_t)q.max_template_mib << 20 : UINT64_MAX / 2;
	snprintf(up->customer, sizeof(up->customer), "%s", customer);
	snprintf(up->name, sizeof(up->name), "%s", name);
	if (cl) {
		char *end;
		unsigned long long v = strtoull(cl, &end, 10);

		if (!*end && v > up->cap) {
			char msg[160];

			free(up);
			snprintf(msg, sizeof(msg), "the archive (%llu bytes) is larger than your quota's max_template_mib (%u MiB)",
				 v, q.max_template_mib);
			return reply_error(conn, KERR_TOO_LARGE, msg);
		}
	}
	snprintf(up->path, sizeof(up->path), "%s/kiln-api-upload-XXXXXX", dir && *dir ? dir : "/tmp");
	up->fd = mkostemp(up->path, O_CLOEXEC);
	if (up->fd < 0 || store_template_new_id(up->id) < 0) {
		templates_upload_free(up);
		return reply_internal(conn, "cannot create a spool file");
	}
	*upp = up;
	return MHD_YES;
}

enum MHD_Result templates_upload_feed(struct templates_upload *up, const char *data, size_t *len)
{
	size_t n = *len;

	*len = 0;
	if (up->too_big || up->n + n > up->cap) {
		if (!up->too_big) {
			up->too_big = 1;
			/* Nothing of it will be kept: give the space back now. */
			if (ftruncate(up->fd, 0) < 0)
				up->io_error = 1;
		}
		up->dropped += n;
		/* libmicrohttpd takes no reply mid-body: drop up to another cap's
		 * worth for the 413 to arrive, then close. */
		return up->dropped > up->cap ? MHD_NO : MHD_YES;
	}
	if (!up->io_error) {
		const char *p = data;
		size_t left = n;

		while (left) {
			ssize_t w = write(up->fd, p, left);

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				up->io_error = 1;
				break;
			}
			p += w;
			left -= (size_t)w;
		}
	}
	up->n += n;
	return MHD_YES;
}

enum MHD_Result templates_upload_finish(struct templates_upload *up, struct MHD_Connection *conn)
{
	struct templates *t = up->t;
	struct kiln_err err = { .code = "" };
	char key[128], msg[200];
	struct quota q;
	int r;

	if (up->too_big) {
		snprintf(msg, sizeof(msg), "the archive is larger than your quota's max_template_mib (%u MiB)", up->cap_mib);
		return reply_error(conn, KERR_TOO_LARGE, msg);
	}
	if (up->io_error || fsync(up->fd) < 0)
		return reply_internal(conn, "cannot spool the archive");
	if (!up->n)
		return reply_error(conn, KERR_INVALID_REQUEST, "the body is empty: send the image archive (docker save)");
	snprintf(key, sizeof(key), "_templates/uploads/%s.tar", up->id);
	pthread_mutex_lock(&t->lock);
	r = t->bucket_ok;
	pthread_mutex_unlock(&t->lock);
	if (!r && s3_ensure_bucket(&t->cfg->s3, &err) == 0) {
		pthread_mutex_lock(&t->lock);
		t->bucket_ok = 1;
		pthread_mutex_unlock(&t->lock);
	}
	if (s3_put_file(&t->cfg->s3, key, up->path, "application/x-tar", NULL, NULL, &err) < 0) {
		snprintf(msg, sizeof(msg), "cannot store the archive in S3: %s", err.message);
		return reply_error_status(conn, MHD_HTTP_SERVICE_UNAVAILABLE, KERR_S3_UNAVAILABLE, msg);
	}
	tpl_customer_quota(t->st, up->customer, &q);
	{
		struct store_template_new n = {
			.customer = up->customer, .name = up->name, .kind = "oci", .oci_key = key, .oci_size = up->n,
			.max_templates = q.max_templates,
		};

		r = store_template_create(t->st, up->id, &n, &err);
	}
	if (r < 0) {
		struct kiln_err e2 = { .code = "" };

		s3_delete(&t->cfg->s3, key, &e2);
		return reply_err(conn, &err);
	}
	return reply_created(t, conn, up->id);
}

void templates_upload_free(struct templates_upload *up)
{
	if (!up)
		return;
	if (up->fd >= 0) {
		close(up->fd);
		unlink(up->path);
	}
	free(up);
}
