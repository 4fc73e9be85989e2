/* session_resume: bring a paused session back on this host (session_pause.c
 * has the whole story): the manifest, every chunk fetched in parallel and
 * checked before use, the base RAM (this host's snapshot's or a verified
 * copy from S3), QEMU started on the base mapped copy-on-write and fed the
 * filtered state stream as it arrives. Manifest version 1 (whole files)
 * still resumes. */
#include "session_int.h"
#include "vm/vm.h"


#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "fsutil.h"
#include "io.h"
#include "pause_chunks.h"
#include "pause_manifest.h"
#include "proto.h"
#include "task/task.h"

/* A version 1 manifest's files, whole. */
static const char *const snap_files[] = { "state", "disk.qcow2" };

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

struct disk_fetch {
	const struct s3_config *c;
	const struct pchunk_list *l;
	const struct pcache_seal *cache;
	size_t hits;
	int fd, rc;
	struct kiln_err err;
};

static void *disk_fetch_thread(void *arg)
{
	struct disk_fetch *df = arg;

	df->rc = pchunk_get_all(df->c, df->l, df->fd, PAUSE_WORKERS / 2, df->cache, &df->hits, &df->err);
	return NULL;
}

/* The changed pages are written straight into the VM's RAM in QEMU's
 * address space (pageload.c) instead of through QEMU's own load; QEMU then
 * loads a stream without them: the configuration, the RAM section's block
 * list and the device state. The filter hands the pages over in stream
 * order, after the chunk they came in passed its SHA-256 check; the loader
 * batches them where they are in the chunk (the filter flushes before it
 * lets the chunk go) and waits for the VM to be there. */

/* Where the chunks' side hands the stream to the filter: the chunk being
 * handed over, parsed where it is (a pipe between them cost a copy in and
 * a copy out per byte and, on this 2-core VM, a thread wake-up per pipe's
 * worth: the filter waited on it for ~70-85 ms of a ~120 ms load). */
struct feed_slot {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const uint8_t *p; /* the chunk being handed over (NULL: none) */
	size_t len, pos;  /* pos: len once the filter is done with it */
	int viewed;       /* the filter holds a view of it */
	int end;         /* the chunks' side is done: the stream is whole, or cut short */
	int reader_gone; /* the filter stopped: the chunks' side stops too */
};

/* Version 2's state stream, fed to QEMU as it arrives rather than
 * downloaded whole first: one thread fetches, checks and decompresses the
 * chunks in order and hands each over (pchunk_stream_all, the slot);
 * another reads the stream from it, writes the changed pages into the VM
 * (the page loader) and the rest into QEMU's socket. */
struct state_feed {
	const struct s3_config *c;
	const struct pchunk_list *l;
	const struct pcache_seal *cache; /* this host's pause cache for the session, or NULL */
	size_t hits;       /* chunks read from it */
	struct feed_slot slot;
	int rc; /* the chunks' side */
	struct kiln_err err;
	pthread_t th;
	int started;
	int fd, frc; /* the filter's: to QEMU's socket */
	struct kiln_err ferr;
	pthread_t fth;
	int fstarted;
	struct pageload *pl; /* NULL: no loader (the stream goes to QEMU whole) */
	uint64_t pl_size;    /* the RAM block's */
	struct migfilter_stats st;
	/* A copy of what QEMU is fed (-1: none): the resumed template of a
	 * session on a fetched base. A failure to write it only drops it. */
	int tee_fd, tee_failed;
	int64_t chunks_done_ms; /* when the last chunk was fetched, checked and streamed */
	int locks;              /* the slot's mutex and condition are set up */
	/* Each loaded page's hash, for the next pause's delta (the filter
	 * thread's; ph_ok 0: out of memory, no delta). */
	struct phash ph;
	int ph_ok;
};

/* The loader's page, hashed on the way (phash.h: a later record of a page
 * replaces an earlier one, as its write does). */
static int feed_page(void *ctx, uint64_t addr, const uint8_t *data)
{
	struct state_feed *f = ctx;

	if (f->ph_ok && phash_add(&f->ph, (uint32_t)(addr / 4096), phash_page(data)) < 0) {
		phash_free(&f->ph);
		f->ph_ok = 0;
	}
	return pageload_page(f->pl, addr, data);
}

static int feed_flush(void *ctx)
{
	return pageload_flush(((struct state_feed *)ctx)->pl);
}

/* The chunks' side: hand buf over and wait until the filter is done with
 * it, or has stopped (-1). */
static int slot_sink(void *ctx, const void *buf, size_t len)
{
	struct feed_slot *sl = ctx;
	int r;

	pthread_mutex_lock(&sl->mu);
	sl->p = buf;
	sl->len = len;
	sl->pos = 0;
	sl->viewed = 0;
	pthread_cond_broadcast(&sl->cv);
	while (sl->pos < sl->len && !sl->reader_gone)
		pthread_cond_wait(&sl->cv, &sl->mu);
	sl->p = NULL;
	r = sl->reader_gone && sl->pos < sl->len ? -1 : 0;
	pthread_mutex_unlock(&sl->mu);
	return r;
}

/* End of stream (from the chunks' side) or of reading (the filter's). */
static void slot_close(struct feed_slot *sl, int reader)
{
	pthread_mutex_lock(&sl->mu);
	if (reader)
		sl->reader_gone = 1;
	else
		sl->end = 1;
	pthread_cond_broadcast(&sl->cv);
	pthread_mutex_unlock(&sl->mu);
}

static void *state_feed_thread(void *arg)
{
	struct state_feed *f = arg;

	f->rc = pchunk_stream_all(f->c, f->l, slot_sink, &f->slot, PAUSE_WORKERS, f->cache, &f->hits, &f->err);
	f->chunks_done_ms = proto_now_ms();
	slot_close(&f->slot, 0); /* end of stream: the filter sees it whole, or cut short */
	return NULL;
}

/* The filter's view: the chunk it held goes back (the filter has written
 * out every page it handed over from it), and it gets the next one, whole;
 * 0 at the end of the stream. */
static ssize_t feed_view(void *ctx, const uint8_t **p)
{
	struct feed_slot *sl = ctx;
	size_t n = 0;

	pthread_mutex_lock(&sl->mu);
	if (sl->p && sl->viewed) {
		sl->pos = sl->len;
		pthread_cond_broadcast(&sl->cv);
	}
	while (!(sl->p && sl->pos < sl->len) && !sl->end)
		pthread_cond_wait(&sl->cv, &sl->mu);
	if (sl->p && sl->pos < sl->len) {
		*p = sl->p + sl->pos;
		n = sl->len - sl->pos;
		sl->viewed = 1;
	}
	pthread_mutex_unlock(&sl->mu);
	return (ssize_t)n;
}

static int feed_write(void *ctx, const void *buf, size_t len)
{
	struct state_feed *f = ctx;

	if (io_write_all(f->fd, buf, len) < 0)
		return -1;
	if (f->tee_fd >= 0 && !f->tee_failed && io_write_all(f->tee_fd, buf, len) < 0)
		f->tee_failed = 1;
	return 0;
}

static void *state_filter_thread(void *arg)
{
	struct state_feed *f = arg;
	struct migfilter_base mb = { .block = "mem", .size = f->pl_size, .page = feed_page, .flush = feed_flush,
				     .ctx = f };

	/* Without the loader the stream passes through whole. */
	f->frc = migfilter_run_view(feed_view, &f->slot, feed_write, f, f->pl ? &mb : NULL, &f->st, &f->ferr);
	close(f->fd);            /* end of stream: QEMU sees it whole, or cut short */
	slot_close(&f->slot, 1); /* the chunks' side stops at once if this stopped early */
	return NULL;
}

/* The VM will not come: a loader waiting for it gives up. */
static void state_feed_cancel(struct state_feed *f)
{
	if (f->pl)
		pageload_target(f->pl, 0, 0);
}

/* Wait for the feed (its reader must be gone or reading: close the read
 * end first on a failure). 0, or -1 with err its failure: a chunk's first
 * (a damaged chunk cuts the stream, which the filter then finds short). */
static int state_feed_join(struct state_feed *f, struct kiln_err *err)
{
	int r = 0;

	if (f->fstarted) {
		pthread_join(f->fth, NULL);
		f->fstarted = 0;
	}
	if (f->started) {
		pthread_join(f->th, NULL);
		f->started = 0;
		if (f->rc < 0) {
			*err = f->err;
			r = -1;
		} else if (f->frc < 0) {
			*err = f->ferr;
			r = -1;
		}
	}
	if (f->pl) { /* both threads joined */
		pageload_free(f->pl);
		f->pl = NULL;
	}
	if (f->locks) {
		pthread_mutex_destroy(&f->slot.mu);
		pthread_cond_destroy(&f->slot.cv);
		f->locks = 0;
	}
	if (f->tee_fd >= 0) {
		if (close(f->tee_fd) < 0)
			f->tee_failed = 1;
		f->tee_fd = -1;
		if (r < 0)
			f->tee_failed = 1; /* the caller drops the file (state_feed_keep_tpl) */
	}
	return r;
}

/* After a resume that loaded: the resumed template is kept only if it was
 * written whole; else the session's pauses go through QEMU. */
static void state_feed_keep_tpl(struct state_feed *f, struct session *s)
{
	if (!s->resumed_tpl[0])
		return;
	if (f->tee_failed) {
		fprintf(stderr, "kiln-host: session %s: its resumed template could not be kept (its pauses go through "
				"QEMU)\n", s->id);
		unlink(s->resumed_tpl);
		s->resumed_tpl[0] = '\0';
	}
}

/* session_boot's hook once the VM's QEMU is there: the loader's target. */
static void feed_booted(void *ctx, struct session *s)
{
	struct state_feed *f = ctx;
	int fd = s->base_fd >= 0 ? s->base_fd : s->snap->mem_fd;
	uintptr_t ram = vmmem_find_ram(s->vm.pid, fd, s->snap->mem_size);

	if (!ram)
		fprintf(stderr, "kiln-host: session %s: the VM's RAM is not in QEMU %d's address space\n", s->id,
			(int)s->vm.pid);
	pageload_target(f->pl, ram ? s->vm.pid : 0, ram);
}

/* Version 2: the disk layer (into s->disk, whole, checked: QEMU opens it
 * at start) and the state stream (*state_fd: a socket that f feeds, chunk by
 * chunk, each checked before it is written), fetched in parallel. On
 * success the caller hands *state_fd to QEMU, closes it, then
 * state_feed_join(f). */
static int fetch_v2(const struct s3_config *c, struct session *s, const struct pmanifest *pm,
		    const struct pcache_seal *cache,
		    size_t *disk_hits, int *state_fd, struct state_feed *f, struct kiln_err *err)
{
	struct disk_fetch df = { .c = c, .l = &pm->disk, .cache = cache, .fd = -1, .rc = -1 };
	pthread_t th;
	int p[2];

	df.fd = open(s->disk, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (df.fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->disk, strerror(errno));
	/* A socket pair, not a pipe: QEMU (7.2) waits for its incoming stream
	 * to be readable, and a pipe whose writer closed while QEMU waited is
	 * only POLLHUP, never readable: QEMU would spin on it forever instead of
	 * failing. A socket whose peer closed reads as end of stream at once. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) < 0) {
		close(df.fd);
		return kiln_err_set(err, KERR_HOST_ERROR, "socketpair: %s", strerror(errno));
	}
	{
		int sz = 1 << 20; /* fewer wake-ups; the default works too */

		(void)setsockopt(p[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		shutdown(p[0], SHUT_WR); /* one way: kiln-host to QEMU */
	}
	*f = (struct state_feed){ .c = c, .l = &pm->state, .cache = cache, .rc = -1, .fd = p[1], .frc = -1, .tee_fd = -1,
				  .ph_ok = 1 };
	f->locks = 1;
	pthread_mutex_init(&f->slot.mu, NULL);
	pthread_cond_init(&f->slot.cv, NULL);
	f->pl_size = pm->base_size;
	if (vmmem_usable() && !(f->pl = pageload_new(pm->base_size, err))) {
		close(p[0]);
		close(p[1]);
		close(df.fd);
		return -1; /* the caller's state_feed_join releases the slot's locks */
	}
	/* On a fetched base, with the loader (the RAM block's pages leave the
	 * stream): what QEMU is fed is kept as the next fast pause's template. */
	if (s->base_fd >= 0 && f->pl) {
		snprintf(s->resumed_tpl, sizeof(s->resumed_tpl), "%s/resumed-template", s->dir);
		f->tee_fd = open(s->resumed_tpl, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (f->tee_fd < 0) {
			fprintf(stderr, "kiln-host: session %s: %s: %s (its pauses go through QEMU)\n", s->id,
				s->resumed_tpl, strerror(errno));
			s->resumed_tpl[0] = '\0';
		}
	}
	if (pthread_create(&th, NULL, disk_fetch_thread, &df) != 0) {
		close(p[0]);
		close(p[1]);
		close(df.fd);
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot start a download thread");
	}
	if (pthread_create(&f->fth, NULL, state_filter_thread, f) != 0) {
		close(p[1]);
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the stream filter");
	} else if (f->fstarted = 1, pthread_create(&f->th, NULL, state_feed_thread, f) != 0) {
		slot_close(&f->slot, 0); /* the filter sees a short stream and ends */
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start a download thread");
	} else {
		f->started = 1;
	}
	pthread_join(th, NULL);
	*disk_hits = df.hits;
	if (close(df.fd) < 0 && df.rc == 0)
		df.rc = kiln_err_set(&df.err, KERR_HOST_ERROR, "writing %s: %s", s->disk, strerror(errno));
	if (!f->started || df.rc < 0) {
		struct kiln_err ferr = { .code = "" };

		close(p[0]); /* a feed blocked on the socket ends (EPIPE) */
		state_feed_cancel(f);
		if (state_feed_join(f, &ferr) < 0 && ferr.errc == KERR_SNAPSHOT_CORRUPT)
			*err = ferr;
		else if (df.rc < 0)
			*err = df.err;
		return -1;
	}
	*state_fd = p[0];
	return 0;
}

/* Bytes of l's chunks in S3 (compressed). */
uint64_t session_zbytes(const struct pchunk_list *l)
{
	uint64_t n = 0;

	for (size_t i = 0; i < l->n; i++)
		n += l->c[i].zsize;
	return n;
}

/* A fork child's disk layer and state stream from its fork base: the
 * layer copied to s->disk, *state_fd the stream (its pages are in the RAM
 * the VM maps). */
static int fork_child_files(struct session *s, int *state_fd, struct kiln_err *err)
{
	int dst = open(s->disk, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), rc;

	if (dst < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->disk, strerror(errno));
	rc = io_copy_at(s->fork->disk_fd, dst, 0, s->fork->disk_size);
	if (close(dst) < 0 && rc == 0)
		rc = -errno;
	if (rc < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "writing %s: %s", s->disk, strerror(-rc));
	if ((*state_fd = fork_base_open(s->fork)) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "a fork's state: %s", strerror(errno));
	return 0;
}

int session_resume(struct session_table *ss, const char *id, const char *customer, const char *from_snapshot,
		   unsigned snapshot_wait_ms, const struct template_ref *ref, json_t **out, struct kiln_err *err)
{
	struct hostd_s3 s3;
	struct task_spec ts = { 0 };
	const struct snapshot *snap;
	struct session *s = NULL;
	json_t *m = NULL, *files;
	struct pmanifest pm = { 0 };
	char key[512], path[PATH_MAX + 32];
	int fd = -1, r = -1, have_ts = 0, reserved = 0, boot_failed = 0, paged = 0, made_cache = 0;
	/* Where a resume's time goes (logged): the manifest, the base when it
	 * comes from S3, the disk layer, the disk's rebase, QEMU starting and
	 * loading the state while it streams in. */
	int64_t t0 = proto_now_ms(), t_manifest = 0, t_base = 0, t_fetch = 0, t_disk = 0;
	struct state_feed feed = { .started = 0, .tee_fd = -1 };
	struct pcache_seal seal = { .dir = "" };
	size_t disk_hits = 0;

	*out = NULL;
	if (!spool_id_ok(id) || !spool_id_ok(customer) || (from_snapshot && !spool_id_ok(from_snapshot)))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "id, customer and snapshot: expected 1-64 characters of [A-Za-z0-9_.-], not starting "
				    "with '.'");
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
	if (from_snapshot)
		snprintf(key, sizeof(key), "%s/" PMANIFEST_SNAPSHOTS "/%s/manifest.json", customer, from_snapshot);
	else
		session_s3_key(key, sizeof(key), customer, id, "manifest.json");
	{
		char *text = NULL;
		ssize_t len = -1;
		struct fork_base *fb = from_snapshot ? fork_base_find(customer, from_snapshot) : NULL;
		int64_t wait_until = proto_now_ms() + (int64_t)(snapshot_wait_ms > SESSION_SNAPSHOT_WAIT_MAX_MS
									? SESSION_SNAPSHOT_WAIT_MAX_MS
									: snapshot_wait_ms);

		if (fb) {
			/* A fork's child on its parent's host: the manifest is
			 * here, complete or (its upload still going) without its
			 * chunk lists, which this child does not need. */
			int uploaded;
			json_t *fm = fork_base_claim(fb, s, &uploaded);

			if (!uploaded) {
				r = fork_pending_manifest(fb, fm, &pm, err);
				json_decref(fm);
				if (r < 0)
					goto fail;
				r = -1;
				m = json_incref(pm.root);
				goto have_manifest;
			}
			text = json_dumps(fm, JSON_COMPACT);
			json_decref(fm);
			len = text ? (ssize_t)strlen(text) : kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		}
		/* A fork's snapshot may still be uploading when its children on
		 * other hosts start (snapshot_wait_ms): its manifest comes last. */
		while (!text && (len = session_get_small(&s3.c, key, &text, err)) < 0 && err->errc == KERR_S3_NOT_FOUND &&
		       proto_now_ms() < wait_until)
			usleep(50000);
		if (len < 0) {
			if (err->errc == KERR_S3_NOT_FOUND)
				kiln_err_set(err, KERR_NO_SNAPSHOT, from_snapshot ? "no snapshot %s" : "no paused session %s",
					     from_snapshot ? from_snapshot : id);
			goto fail;
		}
		r = pmanifest_parse_at(text, (size_t)len, customer, from_snapshot ? PMANIFEST_SNAPSHOTS : PMANIFEST_SESSIONS,
				       from_snapshot ? from_snapshot : id, &pm, err);
		free(text);
		if (r < 0)
			goto fail;
		r = -1;
		m = json_incref(pm.root);
	}
have_manifest:
	t_manifest = proto_now_ms();
	if (session_parse_spec(json_object_get(m, "spec"), &ts, err) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's spec is invalid");
		goto fail;
	}
	have_ts = 1;
	snap = session_template_take(ss, ref, &ts, &s->tu, &s->has_tu, err);
	if (!snap)
		goto fail;
	/* Another template snapshot (a new kiln-init or kernel, say after an
	 * upgrade) will do when what the paused guest needs from the host is
	 * the same: its rootfs, QEMU and machine (snapshot_resume_key). */
	if (strcmp(json_string_value(json_object_get(m, "template")) ?: "", snap->key)) {
		const char *rk = json_string_value(json_object_get(m, "resume_key"));

		if (!rk || !rk[0] || strcmp(rk, snap->rkey)) {
			kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
				     "the session was paused on a host with another image (template %.20s, resume key "
				     "%.20s; this host's %s, %s): another rootfs, QEMU or machine",
				     json_string_value(json_object_get(m, "template")) ?: "?", rk ?: "none", snap->key,
				     snap->rkey[0] ? snap->rkey : "none");
			goto fail;
		}
		fprintf(stderr, "kiln-host: session %s: paused on template snapshot %.20s, resumed on %s (same rootfs, "
			"QEMU and machine: resume key %s)\n", s->id,
			json_string_value(json_object_get(m, "template")) ?: "?", snap->key, snap->rkey);
	}
	if (pm.version >= PMANIFEST_V2) {
		char base_sha[65];

		if (snapshot_mem_sha256(snap, base_sha, err) < 0)
			goto fail;
		if (pm.base_size != snap->mem_size) {
			kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
				     "the session was paused with %llu bytes of RAM, and this host's snapshot %s has %llu",
				     (unsigned long long)pm.base_size, snap->key, (unsigned long long)snap->mem_size);
			goto fail;
		}
		/* Another host's snapshot RAM: its copy in S3 becomes this VM's base. */
		if (strcmp(base_sha, pm.base_sha256)) {
			if ((s->base_fd = session_base_fetch(&s3.c, pm.base_sha256, pm.base_size, err)) < 0)
				goto fail;
			snprintf(s->base_sha, sizeof(s->base_sha), "%s", pm.base_sha256);
		}
	}
	t_base = proto_now_ms();
	if (hostd_reserve_wait(ss->d, ts.vcpus, ts.memory_mib, session_admit_wait_ms(ss), err) < 0)
		goto fail;
	reserved = 1;
	/* The real values, now that they are known. */
	json_decref(s->spec);
	s->spec = json_deep_copy(json_object_get(m, "spec"));
	if (json_is_object(json_object_get(m, "volume_generations")))
		s->vol_expect = json_incref(json_object_get(m, "volume_generations"));
	s->snap = snap;
	s->vcpus = ts.vcpus;
	s->memory_mib = ts.memory_mib;
	s->output_mib = ts.output_mib;
	snprintf(s->release, sizeof(s->release), "%s", snap->release);
	snprintf(s->from_snapshot, sizeof(s->from_snapshot), "%s", from_snapshot ? from_snapshot : pm.from_snapshot);
	if (pm.version >= PMANIFEST_V2) {
		/* Its chunks from this host's pause cache where they are there,
		 * opened with the key its manifest holds. */
		/* Version 3: what comes from S3 is kept here too (the layers a
		 * delta pause names again), in a directory made if missing. */
		/* A snapshot's: its copies, kept where the checkpoint ran, read only. */
		if (from_snapshot) {
			char cid[80];

			session_snapshot_cache_id(cid, sizeof(cid), from_snapshot);
			if (pm.has_cache_key && pcache_dir(&ss->pcache, customer, cid, 0, seal.dir, sizeof(seal.dir)) == 0)
				memcpy(seal.key, pm.cache_key, sizeof(seal.key));
		} else if (pm.has_cache_key && (pcache_dir(&ss->pcache, customer, id, 0, seal.dir, sizeof(seal.dir)) == 0 ||
					 (pm.version >= PMANIFEST_V3 &&
					  (made_cache = pcache_dir(&ss->pcache, customer, id, 1, seal.dir, sizeof(seal.dir)) == 0)))) {
			memcpy(seal.key, pm.cache_key, sizeof(seal.key));
			seal.keep = pm.version >= PMANIFEST_V3;
		}
		/* A fork's child on its parent's host: the parent's RAM mapped,
		 * only the devices loaded (session_fork.c). */
		if (s->fork && (pm.version < PMANIFEST_V3 || s->base_fd >= 0 || strcmp(s->fork->tpl_key, snap->key))) {
			if (s->adopt_pending) {
				kiln_err_set(err, KERR_HOST_ERROR,
					     "snapshot %s is still uploading and its copy here is of another template: "
					     "try again in a moment", from_snapshot);
				goto fail;
			}
			fork_base_put(s->fork); /* not this one's: loaded from the chunks */
			s->fork = NULL;
		}
		if (s->fork) {
			if (fork_child_files(s, &fd, err) < 0)
				goto fail;
		} else if (fetch_v2(&s3.c, s, &pm, seal.dir[0] ? &seal : NULL, &disk_hits, &fd, &feed, err) < 0) {
			goto fail;
		}
	} else {
		files = json_object_get(m, "files");
		for (size_t i = 0; i < sizeof(snap_files) / sizeof(*snap_files); i++) {
			snprintf(path, sizeof(path), "%s/%s", s->dir, snap_files[i]);
			session_s3_key(key, sizeof(key), customer, id, snap_files[i]);
			if (s3_get_file(&s3.c, key, path, err) < 0) {
				if (err->errc == KERR_S3_NOT_FOUND)
					kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s is missing from the paused session in S3",
						     snap_files[i]);
				goto fail;
			}
			if (check_file(path, json_object_get(files, snap_files[i]), snap_files[i], err) < 0)
				goto fail;
		}
	}
	t_fetch = proto_now_ms();
	/* Point the overlay at this host's copy of the template (same key: the
	 * same bytes); -u: only the header changes. qemu-img runs as root and
	 * the header came from S3 (written by a jailed QEMU): it must be a plain
	 * overlay of this template first, nothing that makes qemu-img open
	 * another host file (an external data file) or parse more than that.
	 * Paused on another template snapshot with this resume key (above): of
	 * that one's disk, which this host's has the same rootfs under. */
	{
		const char *mt = json_string_value(json_object_get(m, "template")) ?: "";
		char paused_on[64];

		snprintf(paused_on, sizeof(paused_on), "%.20s/disk.qcow2", mt);
		if (qcow2_file_check(s->disk, strcmp(mt, snap->key) ? paused_on : snap->disk, err) < 0)
			goto fail;
	}
	{
		char *argv[] = { "/usr/bin/qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-F", "qcow2", "-b",
				 (char *)snap->disk, s->disk, NULL };
		char cur[PATH_MAX];

		/* Already this host's path (the same snapshot cache): nothing to do. */
		if (snapshot_qcow2_backing(s->disk, cur, sizeof(cur)) == 0 && !strcmp(cur, snap->disk))
			;
		else if (snapshot_run_cmd(argv) < 0) {
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's disk layer is not a usable qcow2 image");
			goto fail;
		}
	}
	t_disk = proto_now_ms();
	if (pm.version < PMANIFEST_V2)
		fd = open(s->state_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
		goto fail;
	}
	/* Version 2: the base mapped copy-on-write, the changed pages over it,
	 * written in as they arrive once QEMU is there. */
	if (pm.version >= PMANIFEST_V2 && feed.pl) {
		s->booted = feed_booted;
		s->booted_ctx = &feed;
	}
	r = session_boot(ss, s, &ts, fd, pm.version < PMANIFEST_V2, err);
	s->booted = NULL;
	if (r < 0) {
		r = -1;
		boot_failed = 1;
		goto fail;
	}
	r = -1;
	close(fd);
	fd = -1;
	/* QEMU loaded a whole stream; the feed must agree that it was all checked. */
	paged = feed.pl != NULL; /* the join frees the loader */
	if (state_feed_join(&feed, err) < 0)
		goto fail;
	state_feed_keep_tpl(&feed, s);
	unlink(s->state_path); /* the RAM is in the VM now */
	/* A version 3 manifest loaded page by page: its next pause may send
	 * only what changes from here (session_pause.c). */
	phash_free(&s->layers);
	s->layers_ok = 0;
	if (pm.version >= PMANIFEST_V3 && paged && feed.ph_ok && phash_finish(&feed.ph) == 0) {
		s->layers = feed.ph;
		memset(&feed.ph, 0, sizeof(feed.ph));
		snprintf(s->layers_gen, sizeof(s->layers_gen), "%s", pm.generation);
		s->layers_depth = pm.depth;
		s->layers_ok = 1;
	}
	/* A fork's child: its pages are the fork base's, which the table says. */
	if (s->fork && fork_base_copy_pages(s->fork, &s->layers) == 0) {
		snprintf(s->layers_gen, sizeof(s->layers_gen), "%s", pm.generation);
		s->layers_depth = pm.depth;
		s->layers_ok = 1;
	}
	{
		int64_t now = proto_now_ms();

		fprintf(stderr,
			"kiln-host: session %s resumed in %lld ms: manifest %lld, base %lld, disk layer %lld "
			"(state %llu + disk %llu bytes in S3), disk rebase %lld, QEMU load %lld (the state streamed in "
			"meanwhile; %s: QEMU %lld, load %lld, setup %lld); state chunks all in at %lld; %zu of %zu "
			"chunks from this host's pause cache%s\n",
			id, (long long)(now - t0), (long long)(t_manifest - t0), (long long)(t_base - t_manifest),
			(long long)(t_fetch - t_base), (unsigned long long)session_zbytes(&pm.state),
			(unsigned long long)session_zbytes(&pm.disk), (long long)(t_disk - t_fetch),
			(long long)(now - t_disk), s->prestarted ? "QEMU started ahead" : "QEMU started now",
			(long long)s->boot_ms[0], (long long)s->boot_ms[1], (long long)s->boot_ms[2],
			(long long)(feed.chunks_done_ms ? feed.chunks_done_ms - t0 : 0), feed.hits + disk_hits,
			pm.state.n + pm.disk.n, s->fork ? "; a fork's child: its parent's RAM shared, no page loaded" : "");
	}
	/* Its memory is in the VM now: the kept chunks go (its next pause
	 * keeps its own), but for a version 3 manifest's: its next pause may
	 * be a delta over them, and a resume here then reads them here. */
	if (pm.version < PMANIFEST_V3)
		pcache_drop(&ss->pcache, customer, id);
	/* A fork's child started while the fork's upload goes on gets its
	 * manifest when that ends (fork_children_adopt). */
	if (from_snapshot && !s->adopt_pending)
		session_adopt_manifest(&s3.c, s, pm.root, from_snapshot);
	*out = session_json(ss, s);
	s->vols_live = 1;
	session_put(ss, s, 0);
	r = 0;
	goto out;
fail:
	if (fd >= 0)
		close(fd);
	if (!reserved)
		s->vcpus = 0; /* nothing to give back */
	/* Teardown first: QEMU's copy of the state socket goes, so the feed
	 * ends (it uses pm: joined before pm is freed). */
	session_teardown(ss, s);
	state_feed_cancel(&feed);
	{
		struct kiln_err ferr = { .code = "" };

		/* A chunk that failed its check cut the stream: that is why. */
		if (state_feed_join(&feed, &ferr) < 0 && boot_failed && ferr.errc == KERR_SNAPSHOT_CORRUPT)
			*err = ferr;
		else if (boot_failed && !s->vol_failed && pm.version >= PMANIFEST_V2 &&
			 err->errc != KERR_SNAPSHOT_CORRUPT)
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's state does not load: %s", err->message);
	}
	/* What this resume kept in a directory it made goes with it: a
	 * failed resume holds nothing here. */
	if (made_cache)
		pcache_drop(&ss->pcache, customer, id);
	session_put(ss, s, 1);
out:
	phash_free(&feed.ph);
	OPENSSL_cleanse(&seal, sizeof(seal));
	if (have_ts)
		spec_free(&ts);
	json_decref(m);
	pmanifest_free(&pm);
out_s3:
	hostd_s3_free(&s3);
	return r;
}
