/* template_builds: template builds on kiln-host (see template_builds.h). One mutex guards the
 * table and every build's mutable fields; each build runs on a detached
 * thread of its own that takes the lock only to log and to change state.
 * The event log of a build uses the table's mutex and condition variable
 * (lib/evlog.h). A build holds its VM's vCPUs and memory (hostd_reserve)
 * from acceptance to its end, and its scratch directory is removed on every
 * path. */
#include "template_builds.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "condwait.h"
#include "fsutil.h"
#include "recipe.h"
#include "s3.h"
#include "spec.h"
#include "task/task.h"
#include "template/template.h"
#include "template_build.h"

#define BUILD_LOG_TAIL     4096          /* bytes of log_tail */
#define BUILD_EVENTS_MAX   (4u << 20)    /* per build's event log */
#define BUILD_LINE_MAX     4096          /* a log line is cut there */
#define BUILD_KEEP_MS      (3600 * 1000) /* finished builds are forgotten after */
#define BUILD_TIMEOUT_S    1800
#define BUILD_MAX_BYTES    (4ull << 30)

enum build_state { BS_BUILDING, BS_READY, BS_FAILED };
static const char *const state_names[] = { "building", "ready", "failed" };

struct template_build_job {
	char id[65], customer[65], name[64];
	struct recipe recipe;
	int is_recipe;
	char oci_key[1100];
	uint64_t oci_size;
	unsigned timeout_s;
	uint64_t max_bytes;
	enum build_state state;
	struct template_ref ref;            /* once ready */
	struct kiln_err err;         /* once failed */
	char tail[BUILD_LOG_TAIL + 1];
	size_t tail_len;
	struct evlog ev;
	int cancel_pipe[2];
	int cancelled;
	int64_t ended_ms;
	unsigned refs;               /* table + thread + streams */
	struct template_builds *owner;
	struct template_build_job *next;
};

struct template_builds {
	struct template_builds_config cfg;
	char work[PATH_MAX];
	char mirror[512];
	pthread_mutex_t lock;
	pthread_cond_t changed;
	struct template_build_job *list;
	unsigned threads;
	int stopping;
};

static void build_free(struct template_build_job *x)
{
	recipe_free(&x->recipe);
	template_ref_free(&x->ref);
	evlog_free(&x->ev);
	if (x->cancel_pipe[0] >= 0)
		close(x->cancel_pipe[0]);
	if (x->cancel_pipe[1] >= 0)
		close(x->cancel_pipe[1]);
	free(x);
}

static void unref_locked(struct template_build_job *x)
{
	if (--x->refs == 0)
		build_free(x);
}

void template_builds_host_mirror(const char *root, char *out, size_t cap)
{
	char path[PATH_MAX], line[1024];
	DIR *d;
	struct dirent *e;
	FILE *f;

	snprintf(out, cap, "http://deb.debian.org/debian");
	snprintf(path, sizeof(path), "%s/etc/apt/sources.list.d", root);
	if ((d = opendir(path))) {
		while ((e = readdir(d))) {
			size_t n = strlen(e->d_name);

			if (n < 9 || strcmp(e->d_name + n - 8, ".sources"))
				continue;
			snprintf(path, sizeof(path), "%s/etc/apt/sources.list.d/%s", root, e->d_name);
			if (!(f = fopen(path, "r")))
				continue;
			while (fgets(line, sizeof(line), f)) {
				char url[512];
				size_t ul;

				if (sscanf(line, "URIs: %511s", url) != 1 || strncmp(url, "http", 4))
					continue;
				ul = strlen(url);
				if ((ul >= 6 && !strcmp(url + ul - 6, "debian")) || (ul >= 7 && !strcmp(url + ul - 7, "debian/"))) {
					snprintf(out, cap, "%s", url);
					fclose(f);
					closedir(d);
					return;
				}
			}
			fclose(f);
		}
		closedir(d);
	}
	snprintf(path, sizeof(path), "%s/etc/apt/sources.list", root);
	if ((f = fopen(path, "r"))) {
		while (fgets(line, sizeof(line), f)) {
			char url[512], suite[64];

			if (sscanf(line, "deb %511s %63s", url, suite) == 2 && !strncmp(url, "http", 4) &&
			    strstr(url, "debian") && !strcmp(suite, "bookworm")) {
				snprintf(out, cap, "%s", url);
				break;
			}
		}
		fclose(f);
	}
}

struct template_builds *template_builds_open(const struct template_builds_config *cfg, struct kiln_err *err)
{
	struct template_builds *b = calloc(1, sizeof(*b));

	if (!b) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	b->cfg = *cfg;
	if (!b->cfg.vcpus)
		b->cfg.vcpus = 1;
	if (!b->cfg.memory_mib)
		b->cfg.memory_mib = 1024;
	snprintf(b->work, sizeof(b->work), "%s", cfg->work_dir);
	if (cfg->mirror)
		snprintf(b->mirror, sizeof(b->mirror), "%s", cfg->mirror);
	else
		template_builds_host_mirror("", b->mirror, sizeof(b->mirror));
	pthread_mutex_init(&b->lock, NULL);
	condwait_init(&b->changed);
	/* Builds of an earlier process died with it (kiln-api re-queues them). */
	fs_rmtree(b->work);
	if (fs_mkdir_p(b->work, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", b->work, strerror(errno));
		pthread_mutex_destroy(&b->lock);
		pthread_cond_destroy(&b->changed);
		free(b);
		return NULL;
	}
	return b;
}

void template_builds_stop(struct template_builds *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->lock);
	b->stopping = 1;
	for (struct template_build_job *x = b->list; x; x = x->next)
		if (x->state == BS_BUILDING && x->cancel_pipe[1] >= 0)
			(void)!write(x->cancel_pipe[1], "x", 1);
	pthread_cond_broadcast(&b->changed);
	pthread_mutex_unlock(&b->lock);
}

void template_builds_close(struct template_builds *b)
{
	if (!b)
		return;
	template_builds_stop(b);
	pthread_mutex_lock(&b->lock);
	while (b->threads)
		pthread_cond_wait(&b->changed, &b->lock);
	while (b->list) {
		struct template_build_job *x = b->list;

		b->list = x->next;
		unref_locked(x);
	}
	pthread_mutex_unlock(&b->lock);
	fs_rmtree(b->work);
	pthread_mutex_destroy(&b->lock);
	pthread_cond_destroy(&b->changed);
	free(b);
}

static struct template_build_job *find_locked(struct template_builds *b, const char *id)
{
	for (struct template_build_job *x = b->list; x; x = x->next)
		if (!strcmp(x->id, id))
			return x;
	return NULL;
}

/* Forget finished builds older than BUILD_KEEP_MS (lock held). */
static void prune_locked(struct template_builds *b)
{
	int64_t now = clock_mono_ms();

	for (struct template_build_job **pp = &b->list; *pp;) {
		struct template_build_job *x = *pp;

		if (x->state != BS_BUILDING && now - x->ended_ms > BUILD_KEEP_MS) {
			*pp = x->next;
			unref_locked(x);
		} else {
			pp = &x->next;
		}
	}
}

/* One line of build output: an event, and the tail (lock held). */
static void log_locked(struct template_build_job *x, const char *line)
{
	char cut[BUILD_LINE_MAX + 1];
	size_t n = strnlen(line, BUILD_LINE_MAX);
	json_t *j;

	memcpy(cut, line, n);
	cut[n] = '\0';
	j = json_pack("{s:s%}", "line", cut, n);
	if (j) {
		evlog_append_locked(&x->ev, "log", j);
		json_decref(j);
	}
	if (n + 1 > BUILD_LOG_TAIL)
		n = BUILD_LOG_TAIL - 1;
	if (x->tail_len + n + 1 > BUILD_LOG_TAIL) {
		size_t drop = x->tail_len + n + 1 - BUILD_LOG_TAIL;

		memmove(x->tail, x->tail + drop, x->tail_len - drop);
		x->tail_len -= drop;
	}
	memcpy(x->tail + x->tail_len, cut, n);
	x->tail_len += n;
	x->tail[x->tail_len++] = '\n';
	x->tail[x->tail_len] = '\0';
}

static void build_log(void *ctx, const char *line)
{
	struct template_build_job *x = ctx;

	pthread_mutex_lock(&x->owner->lock);
	log_locked(x, line);
	pthread_mutex_unlock(&x->owner->lock);
}

static void build_logf(struct template_build_job *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void build_logf(struct template_build_job *x, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	build_log(x, line);
}

static json_t *end_json_locked(const struct template_build_job *x, int with_id)
{
	json_t *j = json_pack("{s:s}", "state", state_names[x->state]);

	if (!j)
		return NULL;
	if (with_id)
		json_object_set_new(j, "id", json_string(x->id));
	if (x->state == BS_READY)
		json_object_set_new(j, "template", template_ref_json(&x->ref));
	if (x->state == BS_FAILED)
		json_object_set_new(j, "error", json_pack("{s:s, s:s}", "code", x->err.code, "message", x->err.message));
	return j;
}

/* The build's work: make the image, hash it, upload it, install it. 0 with
 * x->ref set, or -1 with err. */
static int build_run(struct template_builds *b, struct template_build_job *x, const char *dir, struct kiln_err *err)
{
	char image[PATH_MAX + 32], archive[PATH_MAX + 32], scratch[PATH_MAX + 32], hex[65];
	struct template_build_meta meta = { 0 };
	struct hostd_s3 s3;
	uint64_t size = 0;
	int rc = -1;

	if (hostd_s3_take(b->cfg.d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	snprintf(image, sizeof(image), "%s/image.ext4", dir);
	if (x->is_recipe) {
		struct template_build_recipe_req req = {
			.recipe = &x->recipe, .base_rootfs = template_default_rootfs(b->cfg.templates),
			.ro = hostd_run_opts(b->cfg.d), .mirror = b->mirror, .timeout_s = x->timeout_s,
			.max_bytes = x->max_bytes, .vcpus = b->cfg.vcpus, .memory_mib = b->cfg.memory_mib,
			.cancel_fd = x->cancel_pipe[0],
		};

		build_logf(x, "building recipe template %s from %s (mirror %s)", x->name, req.base_rootfs, b->mirror);
		if (template_build_recipe(&req, image, &meta, build_log, x, err) < 0)
			goto out;
	} else {
		struct template_build_oci_req req = {
			.archive = archive, .work_dir = scratch, .max_bytes = x->max_bytes, .timeout_s = x->timeout_s,
			.cancel_fd = x->cancel_pipe[0], .run_dir = hostd_run_opts(b->cfg.d)->vm.run_dir,
		};

		snprintf(archive, sizeof(archive), "%s/archive.tar", dir);
		snprintf(scratch, sizeof(scratch), "%s/oci", dir);
		build_logf(x, "fetching the image archive %s (%llu bytes)", x->oci_key, (unsigned long long)x->oci_size);
		if (s3_get_file(&s3.c, x->oci_key, archive, err) < 0)
			goto out;
		{
			struct stat st;

			if (stat(archive, &st) == 0 && (uint64_t)st.st_size > x->max_bytes) {
				kiln_err_set(err, KERR_TOO_LARGE, "the archive is %lld bytes, past max_bytes %llu",
					     (long long)st.st_size, (unsigned long long)x->max_bytes);
				goto out;
			}
		}
		build_logf(x, "unpacking the image into template %s", x->name);
		if (template_build_oci(&req, image, &meta, build_log, x, err) < 0)
			goto out;
		unlink(archive);
	}
	if (template_file_sha256(image, hex, &size) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "the build made no readable image");
		goto out;
	}
	if (size > x->max_bytes) {
		kiln_err_set(err, KERR_TOO_LARGE, "the image is %llu bytes, past max_bytes %llu", (unsigned long long)size,
			     (unsigned long long)x->max_bytes);
		goto out;
	}
	memset(&x->ref, 0, sizeof(x->ref));
	snprintf(x->ref.name, sizeof(x->ref.name), "%s", x->name);
	snprintf(x->ref.sha256, sizeof(x->ref.sha256), "%s", hex);
	x->ref.size = size;
	snprintf(x->ref.s3_key, sizeof(x->ref.s3_key), TEMPLATE_REF_S3_PREFIX "%s.ext4", hex);
	x->ref.env = meta.env ? json_incref(meta.env) : NULL;
	snprintf(x->ref.workdir, sizeof(x->ref.workdir), "%s", meta.workdir);
	x->ref.user_set = 1;
	x->ref.uid = meta.uid;
	x->ref.gid = meta.gid;
	build_logf(x, "image %s: %llu bytes; uploading to S3 as %s", hex, (unsigned long long)size, x->ref.s3_key);
	if (s3_ensure_bucket(&s3.c, err) < 0 ||
	    s3_put_file(&s3.c, x->ref.s3_key, image, "application/octet-stream", NULL, NULL, err) < 0)
		goto out;
	if (template_install(b->cfg.templates, image, &x->ref, err) < 0)
		goto out;
	build_logf(x, "template %s ready", x->name);
	rc = 0;
out:
	json_decref(meta.env);
	hostd_s3_free(&s3);
	return rc;
}

static void *build_main(void *arg)
{
	struct template_build_job *x = arg;
	struct template_builds *b = x->owner;
	struct kiln_err err = { .code = "" };
	char dir[PATH_MAX + 80];
	int rc;
	json_t *end;

	snprintf(dir, sizeof(dir), "%s/%s", b->work, x->id);
	fs_rmtree(dir);
	if (mkdir(dir, 0700) < 0)
		rc = kiln_err_set(&err, KERR_HOST_ERROR, "cannot create %s: %s", dir, strerror(errno));
	else
		rc = build_run(b, x, dir, &err);
	fs_rmtree(dir);
	hostd_release(b->cfg.d, b->cfg.vcpus, b->cfg.memory_mib);

	pthread_mutex_lock(&b->lock);
	if (rc < 0 && x->cancelled)
		kiln_err_set(&err, KERR_CANCELLED, "cancelled by request");
	if (rc < 0 && !err.code[0])
		kiln_err_set(&err, KERR_BUILD_FAILED, "the build failed");
	if (rc < 0) {
		x->err = err;
		template_ref_free(&x->ref);
		x->state = BS_FAILED;
		log_locked(x, err.message);
		fprintf(stderr, "kiln-host: build %s (%s): failed: %s: %s\n", x->id, x->name, err.code, err.message);
	} else {
		x->state = BS_READY;
		fprintf(stderr, "kiln-host: build %s (%s): ready, %s\n", x->id, x->name, x->ref.sha256);
	}
	x->ended_ms = clock_mono_ms();
	end = end_json_locked(x, 0);
	if (end) {
		evlog_append_locked(&x->ev, "end", end);
		json_decref(end);
	}
	evlog_close_locked(&x->ev);
	unref_locked(x);
	b->threads--;
	pthread_cond_broadcast(&b->changed);
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

/* Parse the request into x (fields by name; unknown keys refused). */
static int parse_request(json_t *j, struct template_build_job *x, struct kiln_err *err)
{
	const char *k;
	json_t *v, *recipe = NULL, *oci = NULL;
	const char *name = NULL;

	if (!json_is_object(j))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "expected a JSON object");
	x->timeout_s = BUILD_TIMEOUT_S;
	x->max_bytes = BUILD_MAX_BYTES;
	json_object_foreach(j, k, v) {
		if (!strcmp(k, "id") || !strcmp(k, "customer")) {
			if (!json_is_string(v) || !spool_id_ok(json_string_value(v)))
				return kiln_err_set(err, KERR_INVALID_REQUEST,
						    "%s: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'", k);
			snprintf(!strcmp(k, "id") ? x->id : x->customer, 65, "%s", json_string_value(v));
		} else if (!strcmp(k, "recipe")) {
			recipe = v;
		} else if (!strcmp(k, "oci")) {
			oci = v;
		} else if (!strcmp(k, "name")) {
			if (!json_is_string(v) || spec_template_name_check(json_string_value(v), "name", err) < 0)
				return json_is_string(v) ? -1 : kiln_err_set(err, KERR_INVALID_REQUEST, "name: expected a string");
			name = json_string_value(v);
		} else if (!strcmp(k, "timeout_s")) {
			if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 86400)
				return kiln_err_set(err, KERR_INVALID_REQUEST, "timeout_s: expected 1..86400");
			x->timeout_s = (unsigned)json_integer_value(v);
		} else if (!strcmp(k, "max_bytes")) {
			if (!json_is_integer(v) || json_integer_value(v) < 1 ||
			    (uint64_t)json_integer_value(v) > TEMPLATE_REF_MAX_SIZE)
				return kiln_err_set(err, KERR_INVALID_REQUEST, "max_bytes: expected 1..%llu",
						    (unsigned long long)TEMPLATE_REF_MAX_SIZE);
			x->max_bytes = (uint64_t)json_integer_value(v);
		} else {
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%.64s: unknown field", k);
		}
	}
	if (!x->id[0] || !x->customer[0])
		return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: required", !x->id[0] ? "id" : "customer");
	if (!recipe == !oci)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "expected one of recipe and oci");
	if (recipe) {
		char *text = json_dumps(recipe, JSON_COMPACT);
		int r;

		if (name)
			return kiln_err_set(err, KERR_INVALID_REQUEST, "name: a recipe names itself (recipe.name)");
		if (!text)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		r = recipe_parse(text, strlen(text), &x->recipe, err);
		free(text);
		if (r < 0)
			return -1;
		x->is_recipe = 1;
		snprintf(x->name, sizeof(x->name), "%s", x->recipe.name);
		return 0;
	}
	if (!name)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "name: required with oci");
	snprintf(x->name, sizeof(x->name), "%s", name);
	if (!json_is_object(oci))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "oci: expected an object {\"s3_key\",\"size\"}");
	json_object_foreach(oci, k, v) {
		if (!strcmp(k, "s3_key")) {
			struct kiln_err kerr = { .code = "" };

			if (!json_is_string(v) || json_string_length(v) >= sizeof(x->oci_key) ||
			    s3_key_under(json_string_value(v), TEMPLATE_REF_S3_PREFIX "uploads/", &kerr) < 0)
				return kiln_err_set(err, KERR_INVALID_REQUEST, "oci.s3_key: expected a key under %suploads/",
						    TEMPLATE_REF_S3_PREFIX);
			snprintf(x->oci_key, sizeof(x->oci_key), "%s", json_string_value(v));
		} else if (!strcmp(k, "size")) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 ||
			    (uint64_t)json_integer_value(v) > TEMPLATE_REF_MAX_SIZE)
				return kiln_err_set(err, KERR_INVALID_REQUEST, "oci.size: expected 0..%llu",
						    (unsigned long long)TEMPLATE_REF_MAX_SIZE);
			x->oci_size = (uint64_t)json_integer_value(v);
		} else {
			return kiln_err_set(err, KERR_INVALID_REQUEST, "oci.%.64s: unknown field", k);
		}
	}
	if (!x->oci_key[0])
		return kiln_err_set(err, KERR_INVALID_REQUEST, "oci.s3_key: required");
	return 0;
}

int template_builds_submit(struct template_builds *b, const char *body, size_t len, json_t **out, struct kiln_err *err)
{
	struct template_build_job *x;
	json_error_t je;
	json_t *j;
	struct hostd_s3 s3;
	const struct run_opts *ro = hostd_run_opts(b->cfg.d);
	pthread_t th;
	pthread_attr_t attr;
	int rc;

	*out = NULL;
	j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return kiln_err_set(err, KERR_INVALID_JSON, "line %d, column %d: %s", je.line, je.column, je.text);
	x = calloc(1, sizeof(*x));
	if (!x) {
		json_decref(j);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	x->cancel_pipe[0] = x->cancel_pipe[1] = -1;
	x->owner = b;
	rc = parse_request(j, x, err);
	json_decref(j);
	if (rc < 0)
		goto fail;
	if (x->is_recipe && x->recipe.npackages && !(ro->net && ro->net->enabled)) {
		kiln_err_set(err, KERR_EGRESS_UNAVAILABLE,
			     "recipe.packages: this host has no network egress to reach a Debian mirror");
		goto fail;
	}
	if (hostd_s3_take(b->cfg.d, &s3) < 0) {
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
		goto fail;
	}
	hostd_s3_free(&s3);
	if (pipe2(x->cancel_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot allocate the build");
		goto fail;
	}
	evlog_init(&x->ev, &(struct evlog_opts){ .lock = &b->lock, .cond = &b->changed, .stopping = &b->stopping,
						 .max_bytes = BUILD_EVENTS_MAX,
						 .truncated_data = "{\"message\":\"build log events past 4 MiB are not kept\"}" });
	pthread_mutex_lock(&b->lock);
	prune_locked(b);
	if (b->stopping) {
		pthread_mutex_unlock(&b->lock);
		kiln_err_set(err, KERR_NO_CAPACITY, "kiln-host is shutting down");
		goto fail;
	}
	if (find_locked(b, x->id)) {
		pthread_mutex_unlock(&b->lock);
		kiln_err_set(err, KERR_DUPLICATE, "build %s already exists on this host", x->id);
		goto fail;
	}
	if (hostd_reserve(b->cfg.d, b->cfg.vcpus, b->cfg.memory_mib, err) < 0) {
		pthread_mutex_unlock(&b->lock);
		goto fail;
	}
	x->state = BS_BUILDING;
	x->refs = 2; /* the table and the thread */
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&th, &attr, build_main, x);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		pthread_mutex_unlock(&b->lock);
		hostd_release(b->cfg.d, b->cfg.vcpus, b->cfg.memory_mib);
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start a build thread");
		goto fail;
	}
	b->threads++;
	x->next = b->list;
	b->list = x;
	*out = json_pack("{s:s, s:s}", "id", x->id, "state", "building");
	pthread_mutex_unlock(&b->lock);
	return 0;
fail:
	build_free(x);
	return -1;
}

json_t *template_builds_get(struct template_builds *b, const char *id)
{
	struct template_build_job *x;
	json_t *j = NULL;

	pthread_mutex_lock(&b->lock);
	x = find_locked(b, id);
	if (x && (j = end_json_locked(x, 1)))
		json_object_set_new(j, "log_tail", json_stringn(x->tail, x->tail_len));
	pthread_mutex_unlock(&b->lock);
	return j;
}

int template_builds_cancel(struct template_builds *b, const char *id)
{
	struct template_build_job *x;

	pthread_mutex_lock(&b->lock);
	x = find_locked(b, id);
	if (!x) {
		pthread_mutex_unlock(&b->lock);
		return -ENOENT;
	}
	if (x->state == BS_BUILDING && !x->cancelled) {
		x->cancelled = 1;
		(void)!write(x->cancel_pipe[1], "x", 1);
		log_locked(x, "cancel requested");
	}
	pthread_mutex_unlock(&b->lock);
	return 0;
}

struct template_build_job *template_builds_ref(struct template_builds *b, const char *id)
{
	struct template_build_job *x;

	pthread_mutex_lock(&b->lock);
	x = find_locked(b, id);
	if (x)
		x->refs++;
	pthread_mutex_unlock(&b->lock);
	return x;
}

void template_builds_unref(struct template_builds *b, struct template_build_job *x)
{
	pthread_mutex_lock(&b->lock);
	unref_locked(x);
	pthread_mutex_unlock(&b->lock);
}

long template_builds_events_read(struct template_builds *b, struct template_build_job *x, struct evlog_cursor *cursor,
				 char *buf, size_t cap, int64_t deadline_ms)
{
	(void)b;
	return evlog_read(&x->ev, cursor, buf, cap, deadline_ms, 0);
}
