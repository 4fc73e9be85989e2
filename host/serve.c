/* serve: kiln-host as a long-running daemon. Keeps the default snapshot and
 * a warm pool ready, accounts memory capacity, and runs tasks posted over
 * HTTP (libmicrohttpd, one thread per connection). */
#include "serve.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "proto.h"
#include "run.h"
#include "spec.h"

struct server {
	const struct serve_opts *o;
	struct run_opts ro;
	struct capacity cap;
	struct pool *pool;
	struct snapshot snap;
	int have_snap;
};

struct request {
	char *body;
	size_t len, cap;
	int too_big;
};

static int reply_json(struct MHD_Connection *conn, unsigned status, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	struct MHD_Response *r;
	int ret;

	json_decref(j);
	if (!s)
		return MHD_NO;
	r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(r, "Content-Type", "application/json");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static int reply_error(struct MHD_Connection *conn, unsigned status, const char *code, const char *msg)
{
	return reply_json(conn, status, json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg));
}

static int handle_run(struct server *s, struct MHD_Connection *conn, struct request *req)
{
	struct task_spec spec;
	struct kiln_err err = { .code = "" };
	json_t *result, *e;

	if (spec_parse(req->body ? req->body : "", req->len, &spec, &err) < 0)
		return reply_error(conn, MHD_HTTP_BAD_REQUEST, err.code, err.message);
	result = run_task(&spec, &s->ro);
	spec_free(&spec);
	/* Refused before anything started: say so with 503, not as a task result. */
	e = json_object_get(result, "error");
	if (e && !strcmp(json_string_value(json_object_get(e, "code")) ?: "", "no_capacity")) {
		int r = reply_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "no_capacity",
				    json_string_value(json_object_get(e, "message")));

		json_decref(result);
		return r;
	}
	return reply_json(conn, MHD_HTTP_OK, result);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			       const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct server *s = cls;
	struct request *req = *con_cls;

	if (!req) {
		req = calloc(1, sizeof(*req));
		if (!req)
			return MHD_NO;
		*con_cls = req;
		return MHD_YES;
	}
	if (*upload_size) {
		if (req->len + *upload_size > SPEC_MAX_JSON) {
			req->too_big = 1;
		} else if (!req->too_big) {
			if (req->cap - req->len < *upload_size + 1) {
				size_t cap = (req->len + *upload_size + 1) * 2;
				char *b = realloc(req->body, cap);

				if (!b)
					return MHD_NO;
				req->body = b;
				req->cap = cap;
			}
			memcpy(req->body + req->len, upload, *upload_size);
			req->len += *upload_size;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (!strcmp(url, "/v1/health") && !strcmp(method, "GET")) {
		json_t *j;

		pthread_mutex_lock(&s->cap.lock);
		j = json_pack("{s:s, s:{s:I, s:I}, s:i, s:i, s:s?}", "status", "ok", "capacity", "total_mib",
			      (json_int_t)s->cap.total_mib, "used_mib", (json_int_t)s->cap.used_mib, "pool_ready",
			      s->pool ? (int)pool_ready(s->pool) : 0, "prestarted", s->pool ? (int)pool_prestarted(s->pool) : 0,
			      "snapshot", s->have_snap ? s->snap.key : NULL);
		pthread_mutex_unlock(&s->cap.lock);
		return reply_json(conn, MHD_HTTP_OK, j);
	}
	if (!strcmp(url, "/v1/run")) {
		if (strcmp(method, "POST"))
			return reply_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "use POST");
		if (req->too_big)
			return reply_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", "the spec is too large");
		return handle_run(s, conn, req);
	}
	return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such endpoint");
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct request *req = *con_cls;

	if (req) {
		free(req->body);
		free(req);
	}
	*con_cls = NULL;
}

static uint64_t mem_total_mib(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

	return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize >> 20 : 1024;
}

int serve_main(const struct serve_opts *o, const struct run_opts *ro)
{
	struct server s = { .o = o, .ro = *ro };
	struct MHD_Daemon *d;
	struct kiln_err err = { .code = "" };
	sigset_t set;
	int sig;
	char key[17];

	pthread_mutex_init(&s.cap.lock, NULL);
	s.ro.cap = &s.cap;
	s.cap.total_mib = o->memory_capacity_mib ? o->memory_capacity_mib : mem_total_mib() * 8 / 10;
	/* Signals are taken synchronously below; every thread inherits the mask. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	vm_reap_stale(ro->vm.run_dir);
	if (!o->cold) {
		int r;

		if (snapshot_key(&ro->vm, o->snap_memory_mib, o->snap_vcpus, key, &err) < 0)
			goto fail;
		r = snapshot_open(o->cache, key, &s.snap, &err);
		if (r < 0) {
			fprintf(stderr, "kiln-host: %s; creating it\n", err.message);
			if (snapshot_create(&ro->vm, o->cache, o->snap_memory_mib, o->snap_vcpus, 1, &s.snap, &err) < 0)
				goto fail;
		}
		s.have_snap = 1;
		s.ro.snap = &s.snap;
		if (o->pool_size || o->prestart) {
			s.pool = pool_start(&s.snap, &ro->vm, o->pool_size, o->prestart, &s.cap);
			if (!s.pool) {
				kiln_err_set(&err, "host_error", "cannot start the pool");
				goto fail;
			}
			s.ro.pool = s.pool;
		}
	}
	d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
			     (uint16_t)o->port, NULL, NULL, handler, &s, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
			     MHD_OPTION_SOCK_ADDR, o->addr, MHD_OPTION_CONNECTION_TIMEOUT, 0u, MHD_OPTION_END);
	if (!d) {
		kiln_err_set(&err, "host_error", "cannot listen on port %d", o->port);
		goto fail;
	}
	fprintf(stderr, "kiln-host: serving on http://%s:%d (pool %u, pre-started %u, capacity %llu MiB)\n",
		o->listen_host, o->port, o->pool_size, o->prestart, (unsigned long long)s.cap.total_mib);
	while (sigwait(&set, &sig) != 0)
		;
	fprintf(stderr, "kiln-host: %s: shutting down\n", strsignal(sig));
	MHD_stop_daemon(d);
	pool_stop(s.pool);
	return 0;
fail:
	pool_stop(s.pool);
	fprintf(stderr, "kiln-host: %s\n", err.message);
	return 3;
}
