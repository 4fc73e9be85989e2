/* session_pause: pause a session to S3 and resume it on any host with the
 * same image (see session.h).
 *
 * Pause: QEMU migrates the stopped VM into a file (its RAM is private, so
 * the stream holds all of it; x-ignore-shared only leaves out RAM shared
 * with a file), which also flushes and releases the overlay. Both go to S3,
 * then a manifest naming their sizes and SHA-256 (written last: a snapshot
 * without one does not exist). Resume: the manifest, then the files, each
 * checked against it; the overlay is re-pointed at this host's copy of the
 * same template (the template key is part of the manifest and must match),
 * and a QEMU with plain RAM loads the stream. Clock and entropy are set anew
 * afterwards, as after any restore. */
#include "session_priv.h"
#include "qcow2.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "proto.h"
#include "spool.h"

#define SESSION_SAVE_MS    300000 /* pausing a VM into its file */
#define SESSION_MANIFEST_V 1

/* ---- pause and resume --------------------------------------------------- */

static const char *const snap_files[] = { "state", "disk.qcow2" };

void session_s3_key(char *out, size_t cap, const char *customer, const char *id, const char *name)
{
	snprintf(out, cap, "%s/sessions/%s/%s", customer, id, name);
}

/* Upload the saved files, then the manifest that makes them a snapshot. */
static int pause_upload(struct session_table *ss, struct session *s, uint64_t *bytes, struct kiln_err *err)
{
	struct hostd_s3 s3;
	json_t *m, *files = json_object();
	char key[512], path[PATH_MAX + 32];
	char *text;
	int r = -1;

	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	*bytes = 0;
	if (s3_ensure_bucket(&s3.c, err) < 0)
		goto out;
	for (size_t i = 0; i < sizeof(snap_files) / sizeof(*snap_files); i++) {
		char sha[65];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", s->dir, snap_files[i]);
		session_s3_key(key, sizeof(key), s->customer, s->id, snap_files[i]);
		if (stat(path, &st) < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
			goto out;
		}
		if (s3_put_file(&s3.c, key, path, "application/octet-stream", sha, NULL, err) < 0)
			goto out;
		json_object_set_new(files, snap_files[i], json_pack("{s:I, s:s}", "size", (json_int_t)st.st_size, "sha256", sha));
		*bytes += (uint64_t)st.st_size;
	}
	m = json_pack("{s:i, s:s, s:s, s:s, s:b, s:i, s:i, s:O, s:s, s:O, s:I, s:s}", "version", SESSION_MANIFEST_V, "id",
		      s->id, "customer", s->customer, "template", s->snap->key, "net", s->snap->net, "memory_mib",
		      (int)s->memory_mib, "vcpus", (int)s->vcpus, "spec", s->spec, "guest_kernel", s->release, "files",
		      files, "paused_ms", (json_int_t)clock_wall_ms(), "host_id", ss->host_id);
	text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	session_s3_key(key, sizeof(key), s->customer, s->id, "manifest.json");
	if (!text) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	r = s3_put_buffer(&s3.c, key, text, strlen(text), "application/json", err);
	free(text);
out:
	json_decref(files);
	hostd_s3_free(&s3);
	return r;
}

json_t *session_pause(struct session_table *ss, const char *id, struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	int64_t t0 = proto_now_ms();
	uint64_t bytes = 0;
	struct hostd_s3 s3;
	char prefix[512];
	json_t *out;

	if (!s)
		return NULL;
	if (s->state == SS_RUNNING) {
		int fd = open(s->state_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		int r;

		if (fd < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
			session_put(ss, s, 0);
			return NULL;
		}
		/* envd's streams end now (unavailable); its processes are saved
		 * with the VM and a resumed session's new channel lists them. */
		session_envd_close(ss, s, "the sandbox is being paused");
		r = snapshot_save_fd(&s->vm, fd, SESSION_SAVE_MS, err);
		if (r == 0 && (fsync(fd) < 0 || close(fd) < 0)) {
			fd = -1;
			r = kiln_err_set(err, KERR_HOST_ERROR, "writing %s: %s", s->state_path, strerror(errno));
		} else if (fd >= 0 && r < 0) {
			close(fd);
		}
		if (r < 0) {
			/* QEMU may have stopped the guest: it cannot be trusted to go on. */
			fprintf(stderr, "kiln-host: session %s: pause failed (%s); the session ends\n", id, err->message);
			session_teardown(ss, s);
			session_put(ss, s, 1);
			return NULL;
		}
		/* Saved: the VM and its network go now; the files stay until S3
		 * has them. */
		vm_destroy(&s->vm);
		if (s->net) {
			net_sandbox_stop(s->net, NULL);
			s->net = NULL;
		}
		hostd_release(ss->d, s->vcpus, s->memory_mib);
		s->vcpus = 0;
		if (s->has_tu) {
			/* Paused: the template is no longer in use here. */
			template_release(hostd_templates(ss->d), &s->tu);
			s->has_tu = 0;
		}
		s->state = SS_PAUSING;
	}
	if (pause_upload(ss, s, &bytes, err) < 0) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, kiln_err_is_s3(err->errc) ? KERR_S3_UNAVAILABLE : err->errc,
			     "the session is saved on this host but not yet in S3 (pause again to retry): %s", m);
		session_put(ss, s, 0);
		return NULL;
	}
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/", s->customer, s->id);
	out = json_pack("{s:s, s:s, s:{s:s, s:s, s:I, s:I}}", "id", s->id, "state", "paused", "snapshot", "bucket",
			hostd_s3_take(ss->d, &s3) == 0 ? s3.c.bucket : "", "prefix", prefix, "bytes", (json_int_t)bytes,
			"pause_ms", (json_int_t)(proto_now_ms() - t0));
	hostd_s3_free(&s3);
	session_teardown(ss, s);
	session_put(ss, s, 1);
	return out;
}

/* Check a downloaded file against the manifest's size and sha256. */
static int check_file(const char *path, json_t *want, const char *name, struct kiln_err *err)
{
	char sha[65];
	struct stat st;
	const char *ws = json_string_value(json_object_get(want, "sha256"));

	if (!ws || !json_is_integer(json_object_get(want, "size")))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest does not describe %s", name);
	if (stat(path, &st) < 0 || (json_int_t)st.st_size != json_integer_value(json_object_get(want, "size")))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: size differs from the manifest (S3 copy damaged)", name);
	if (fs_sha256_file(path, sha) < 0 || strcmp(sha, ws))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: sha256 differs from the manifest (S3 copy damaged)", name);
	return 0;
}

int session_resume(struct session_table *ss, const char *id, const char *customer, const struct tref *tref, json_t **out,
		   struct kiln_err *err)
{
	struct hostd_s3 s3;
	struct task_spec ts = { 0 };
	const struct snapshot *snap;
	struct session *s = NULL;
	json_t *m = NULL, *files;
	json_error_t je;
	char key[512], path[PATH_MAX + 32];
	int fd = -1, r = -1, have_ts = 0, reserved = 0;

	*out = NULL;
	if (!spool_id_ok(id) || !spool_id_ok(customer))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "id and customer: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	s = session_new(ss, id, customer, NULL, &(struct task_spec){ .memory_mib = 0 }, &(struct snapshot){ .mem_fd = -1 },
			err);
	if (!s)
		goto out_s3;
	pthread_mutex_lock(&s->op);
	s->refs = 1;
	if (session_insert(ss, s, err) < 0) {
		pthread_mutex_unlock(&s->op);
		session_free(s);
		s = NULL;
		goto out_s3;
	}
	if (mkdir(s->dir, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", s->dir, strerror(errno));
		goto fail;
	}
	/* The manifest first: without it there is no paused session. */
	snprintf(path, sizeof(path), "%s/manifest.json", s->dir);
	session_s3_key(key, sizeof(key), customer, id, "manifest.json");
	if (s3_get_file(&s3.c, key, path, err) < 0) {
		if (err->errc == KERR_S3_NOT_FOUND)
			kiln_err_set(err, KERR_NO_SNAPSHOT, "no paused session %s", id);
		goto fail;
	}
	m = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!m || json_integer_value(json_object_get(m, "version")) != SESSION_MANIFEST_V ||
	    strcmp(json_string_value(json_object_get(m, "customer")) ?: "", customer) ||
	    strcmp(json_string_value(json_object_get(m, "id")) ?: "", id) || !json_is_object(json_object_get(m, "spec"))) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest is unreadable or not this session's");
		goto fail;
	}
	if (session_parse_spec(json_object_get(m, "spec"), &ts, err) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's spec is invalid");
		goto fail;
	}
	have_ts = 1;
	snap = session_template_take(ss, tref, &ts, &s->tu, &s->has_tu, err);
	if (!snap)
		goto fail;
	if (strcmp(json_string_value(json_object_get(m, "template")) ?: "", snap->key)) {
		kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
			     "the session was paused on a host with another image (template %.20s, this host's %s)",
			     json_string_value(json_object_get(m, "template")) ?: "?", snap->key);
		goto fail;
	}
	if (hostd_reserve(ss->d, ts.vcpus, ts.memory_mib, err) < 0)
		goto fail;
	reserved = 1;
	/* The real values, now that they are known. */
	json_decref(s->spec);
	s->spec = json_deep_copy(json_object_get(m, "spec"));
	s->snap = snap;
	s->vcpus = ts.vcpus;
	s->memory_mib = ts.memory_mib;
	s->output_mib = ts.output_mib;
	snprintf(s->release, sizeof(s->release), "%s", snap->release);
	files = json_object_get(m, "files");
	for (size_t i = 0; i < sizeof(snap_files) / sizeof(*snap_files); i++) {
		snprintf(path, sizeof(path), "%s/%s", s->dir, snap_files[i]);
		session_s3_key(key, sizeof(key), customer, id, snap_files[i]);
		if (s3_get_file(&s3.c, key, path, err) < 0) {
			if (err->errc == KERR_S3_NOT_FOUND)
				kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s is missing from the paused session in S3", snap_files[i]);
			goto fail;
		}
		if (check_file(path, json_object_get(files, snap_files[i]), snap_files[i], err) < 0)
			goto fail;
	}
	/* Point the overlay at this host's copy of the template (same key: the
	 * same bytes); -u: only the header changes. qemu-img runs as root and
	 * the header came from S3 (written by a jailed QEMU): it must be a plain
	 * overlay of this template first, nothing that makes qemu-img open
	 * another host file (an external data file) or parse more than that. */
	if (qcow2_file_check(s->disk, snap->disk, err) < 0)
		goto fail;
	{
		char *argv[] = { "/usr/bin/qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-F", "qcow2", "-b",
				 (char *)snap->disk, s->disk, NULL };

		if (snapshot_run_cmd(argv) < 0) {
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's disk layer is not a usable qcow2 image");
			goto fail;
		}
	}
	fd = open(s->state_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
		goto fail;
	}
	if (session_boot(ss, s, &ts, fd, 1, err) < 0)
		goto fail;
	close(fd);
	fd = -1;
	unlink(s->state_path); /* the RAM is in the VM now */
	*out = session_json(ss, s);
	session_put(ss, s, 0);
	r = 0;
	goto out;
fail:
	if (fd >= 0)
		close(fd);
	if (!reserved)
		s->vcpus = 0; /* nothing to give back */
	session_teardown(ss, s);
	session_put(ss, s, 1);
out:
	if (have_ts)
		spec_free(&ts);
	json_decref(m);
out_s3:
	hostd_s3_free(&s3);
	return r;
}
