/* session_pause: pause a session to S3 and resume it on any host with the
 * same image (see session.h, docs/architecture.md
 * "Sessions").
 *
 * Pause (manifest version 2): QEMU migrates the stopped VM into a pipe; a
 * thread filters the stream (migfilter) so that it keeps only the RAM pages
 * that differ from the template snapshot's RAM (the session's base: its
 * RAM is that file mapped copy-on-write), cuts it into chunks that a few
 * threads compress (zstd), hash and upload while the migration still runs,
 * and keeps a local copy for a retry. The disk layer follows as chunks too,
 * then a manifest naming the base by its SHA-256 and every chunk with its
 * SHA-256 (written last: a snapshot without one does not exist). Chunks go
 * under a fresh generation prefix per pause, so an interrupted pause never
 * touches what the previous manifest names; the previous generation is
 * deleted once the new manifest is in.
 *
 * The base itself goes to S3 once (PBASE_DIR "<sha256>/", chunks then
 * its own manifest) before the first manifest that names it, so that any
 * host can resume the session.
 *
 * Resume: the manifest, then every chunk in parallel, each checked before
 * use; the base is this host's snapshot RAM when its SHA-256 matches, else
 * its copy from S3 (every chunk checked, then the whole), shared by the
 * sessions on it here; QEMU starts on the base mapped copy-on-write and
 * loads the filtered stream over it. Manifest version 1 (whole files) still resumes.
 * Clock and entropy are set anew afterwards, as after any restore.
 *
 * This file is the pause; session_resume.c the resume; session_s3.c what
 * both keep in S3 (manifests, the shared base RAM, deleting old
 * generations). */
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

/* ---- pause: the filtered stream and the disk layer as chunks ------------- */

/* The filter thread's end of the pipe from QEMU, and the chunker after it. */
struct pause_stream {
	int rfd;                 /* the pipe QEMU writes the stream into */
	int local_fd;            /* the filtered stream's local copy (for a retry) */
	struct pchunk_up *up;    /* NULL or failed: local copy only */
	int up_ok;
	struct migfilter_base base;
	uint8_t *cur;
	size_t len;
	int rc;
	struct kiln_err err;
	struct migfilter_stats st;
	/* Layers (manifest version 3): the stream is cut where the RAM's pages
	 * end (cut: that happened), so that the devices are the last chunks; a
	 * delta drops what comes before the pages (the layers hold it). */
	int delta, cut;
	size_t flushed, tail_at;    /* chunks handed on; of them, before the devices */
	uint64_t local_off, tail_off; /* bytes in the local copy; where the devices begin */
	/* A fork's copy of the stream without the RAM block's pages (the
	 * children on this host map the RAM instead): -1, none. */
	int fork_fd, in_pages;
};

static ssize_t ps_read(void *ctx, void *buf, size_t len)
{
	struct pause_stream *p = ctx;
	ssize_t n;

	while ((n = read(p->rfd, buf, len)) < 0 && errno == EINTR)
		;
	return n;
}

/* Hand the current chunk to the uploader (and the local copy). */
static int ps_flush(struct pause_stream *p)
{
	if (!p->len)
		return 0;
	if (p->local_fd >= 0 && io_write_all(p->local_fd, p->cur, p->len) < 0)
		return -1;
	p->local_off += p->len;
	p->flushed++;
	if (p->up_ok && pchunk_up_add(p->up, 0, p->cur, p->len) < 0)
		p->up_ok = 0; /* the failure is reported by pchunk_up_finish */
	else if (!p->up_ok)
		pchunk_buf_free(p->cur);
	p->cur = NULL;
	p->len = 0;
	return 0;
}

static int ps_write(void *ctx, const void *buf, size_t len)
{
	struct pause_stream *p = ctx;
	const uint8_t *b = buf;

	if (p->fork_fd >= 0 && !p->in_pages && io_write_all(p->fork_fd, buf, len) < 0)
		return -1;
	while (len) {
		size_t n;

		if (!p->cur && !(p->cur = pchunk_buf_alloc()))
			return -1;
		n = PCHUNK_RAW_MAX - p->len < len ? PCHUNK_RAW_MAX - p->len : len;
		memcpy(p->cur + p->len, b, n);
		p->len += n;
		b += n;
		len -= n;
		if (p->len == PCHUNK_RAW_MAX && ps_flush(p) < 0)
			return -1;
	}
	return 0;
}

/* vmmem's marks: 0 before the RAM's pages, 1 after them. */
static int ps_mark(void *ctx, int phase)
{
	struct pause_stream *p = ctx;

	p->in_pages = phase == 0;
	if (phase == 0) {
		if (p->delta) {
			if (p->flushed) /* a prefix longer than a chunk: not this layout */
				return -1;
			p->len = 0; /* the header, configuration and firmware: in the layers */
		}
		return 0;
	}
	if (ps_flush(p) < 0)
		return -1;
	p->tail_at = p->flushed;
	p->tail_off = p->local_off;
	p->cut = 1;
	return 0;
}

static void *ps_thread(void *arg)
{
	struct pause_stream *p = arg;
	char sink[65536];

	p->rc = migfilter_run(ps_read, p, ps_write, p, &p->base, &p->st, &p->err);
	if (p->rc == 0 && ps_flush(p) < 0)
		p->rc = kiln_err_set(&p->err, KERR_HOST_ERROR, "writing the session's state: %s", strerror(errno));
	pchunk_buf_free(p->cur);
	p->cur = NULL;
	/* Whatever happened, QEMU must be able to finish writing. */
	while (ps_read(p, sink, sizeof(sink)) > 0)
		;
	return NULL;
}

/* Queue a local file (the disk layer; or the state on a retry) as chunks.
 * 0; -1 with err set (the file); -2 when an upload failed (the reason comes
 * from pchunk_up_finish). */
static int queue_range(struct pchunk_up *up, int stream, const char *path, uint64_t from, uint64_t to,
		       struct kiln_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
	if (from && lseek(fd, (off_t)from, SEEK_SET) < 0) {
		close(fd);
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
	}
	for (;;) {
		uint8_t *b = pchunk_buf_alloc();
		size_t want = to - from < PCHUNK_RAW_MAX ? (size_t)(to - from) : PCHUNK_RAW_MAX;
		ssize_t n = b ? (want ? io_read_all(fd, b, want) : 0) : -1;

		if (n <= 0) {
			pchunk_buf_free(b);
			close(fd);
			if (n < 0)
				return kiln_err_set(err, KERR_HOST_ERROR, "reading %s: %s", path, strerror(errno));
			return 0;
		}
		from += (uint64_t)n;
		if (pchunk_up_add(up, stream, b, (size_t)n) < 0) {
			close(fd);
			return -2;
		}
	}
}

static int queue_file(struct pchunk_up *up, int stream, const char *path, struct kiln_err *err)
{
	return queue_range(up, stream, path, 0, UINT64_MAX, err);
}

/* A version 2 or 3 manifest naming the chunks (NULL: out of memory). */
static json_t *manifest_json(struct session_table *ss, struct session *s, const char *gen, const char *base_sha,
			     const struct pchunk_list *state, const struct pchunk_list *disk, size_t tail, int depth,
			     const struct migfilter_stats *fst, const struct pcache_seal *seal)
{
	json_t *m;

	m = json_pack("{s:i, s:s, s:s, s:s, s:s, s:b, s:i, s:i, s:O, s:s, s:I, s:s, s:s, s:{s:s, s:s, s:I}, s:o, s:o, "
		      "s:{s:I, s:I}}",
		      "version", tail ? PMANIFEST_V3 : PMANIFEST_V2, "id", s->id, "customer", s->customer, "template",
		      s->snap->key, "resume_key", s->snap->rkey, "net", s->snap->net, "memory_mib", (int)s->memory_mib, "vcpus", (int)s->vcpus, "spec", s->spec,
		      "guest_kernel", s->release, "paused_ms", (json_int_t)clock_wall_ms(), "host_id", ss->host_id,
		      "generation", gen, "base", "sha256", base_sha, "block", "mem", "size",
		      (json_int_t)s->snap->mem_size, "state", pchunk_list_json(state), "disk", pchunk_list_json(disk),
		      "pages", "seen", (json_int_t)fst->pages, "kept", (json_int_t)fst->pages_kept);
	/* The generation of each volume the saved guest has mounted: a resume
	 * refuses a read-write one that has moved on since. */
	if (m && s->nvols) {
		json_t *g = json_object();

		for (size_t i = 0; g && i < s->nvols; i++)
			json_object_set_new(g, s->vols[i].id, json_string(s->vol_gen[i]));
		json_object_set_new(m, "volume_generations", g);
	}
	if (m && tail) {
		json_object_set_new(m, "tail", json_integer((json_int_t)tail));
		json_object_set_new(m, "depth", json_integer(depth));
	}
	if (m && seal) {
		/* The pause cache's key: only here, in S3, never on this host's
		 * disk (pause_cache.h). */
		char hex[2 * PCACHE_KEY_LEN + 1];

		pcache_key_hex(seal->key, hex);
		json_object_set_new(m, "cache_key", json_string(hex));
		OPENSSL_cleanse(hex, sizeof(hex));
	}
	return m;
}

/* PUT the manifest m (taken) at key. */
static int put_manifest(const struct s3_config *c, const char *key, json_t *m, struct kiln_err *err)
{
	char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	int r;

	json_decref(m);
	if (!text)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r = s3_put_buffer(c, key, text, strlen(text), "application/json", err);
	free(text);
	return r;
}

/* Write the session's manifest naming the chunks (the last PUT of a pause). */
static int put_manifest_v2(struct session_table *ss, struct session *s, const struct s3_config *c, const char *gen,
			   const char *base_sha, const struct pchunk_list *state, const struct pchunk_list *disk,
			   size_t tail, int depth, const struct migfilter_stats *fst, const struct pcache_seal *seal,
			   struct kiln_err *err)
{
	json_t *m = manifest_json(ss, s, gen, base_sha, state, disk, tail, depth, fst, seal);
	char key[512];

	/* Started from a snapshot: its chunks may be among the layers. */
	if (m && s->from_snapshot[0])
		json_object_set_new(m, "from_snapshot", json_string(s->from_snapshot));
	session_s3_key(key, sizeof(key), s->customer, s->id, "manifest.json");
	return put_manifest(c, key, m, err);
}

/* Deltas layered over a full pause before the next pause is full again
 * (each is a few chunks a resume fetches and loads in turn). */
#define PAUSE_DELTA_MAX 8

/* May this pause send only the pages changed since the session's layers?
 * Its RAM was loaded from the manifest now in S3 (old: the same
 * generation), page by page with their hashes; the layers are not too
 * deep nor, with what was written over, more than twice the RAM; and the
 * pause is not the checked kind (sessions.save_pages 2 compares the whole
 * stream with QEMU's own save). */
static int pause_may_delta(const struct session_table *ss, const struct session *s, const struct pmanifest *old)
{
	uint64_t layers = 0;

	if (!s->layers_ok || !old || old->version < PMANIFEST_V3 || strcmp(old->generation, s->layers_gen) ||
	    old->depth >= PAUSE_DELTA_MAX || ss->save_pages == 2)
		return 0;
	for (size_t i = 0; i + old->tail < old->state.n; i++)
		layers += old->state.c[i].size;
	return layers <= 2 * s->snap->mem_size;
}

/* The state's chunk list of a delta: the layers of old (its chunks before
 * the devices), then this pause's own. 0, or -1 (out of memory). */
static int layer_over(struct pchunk_list *state, const struct pmanifest *old)
{
	size_t keep = old->state.n - old->tail;
	struct pchunk *c = malloc((keep + state->n) * sizeof(*c));

	if (!c)
		return -1;
	memcpy(c, old->state.c, keep * sizeof(*c));
	memcpy(c + keep, state->c, state->n * sizeof(*c));
	free(state->c);
	state->c = c;
	state->n += keep;
	state->total = 0;
	for (size_t i = 0; i < state->n; i++) {
		c[i].offset = state->total;
		state->total += c[i].size;
	}
	return 0;
}

static int named_in(const char *key, const struct pchunk_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		if (!strcmp(l->c[i].key, key))
			return 1;
	return 0;
}

/* Leave out of old's lists (what goes once the new manifest is in) every
 * chunk the new one names too (a layer, an unchanged disk chunk) and every
 * chunk that is not the session's own (a snapshot's: it goes with the
 * snapshot). */
static void keep_named(const struct session *s, struct pmanifest *old, const struct pchunk_list *state,
		       const struct pchunk_list *disk)
{
	struct pchunk_list *ls[2] = { &old->state, &old->disk };
	char own[512];
	size_t olen;

	olen = (size_t)snprintf(own, sizeof(own), "%s/sessions/%s/", s->customer, s->id);
	for (int j = 0; j < 2; j++) {
		size_t o = 0;

		for (size_t i = 0; i < ls[j]->n; i++)
			if (!strncmp(ls[j]->c[i].key, own, olen) && !named_in(ls[j]->c[i].key, state) &&
			    !named_in(ls[j]->c[i].key, disk))
				ls[j]->c[o++] = ls[j]->c[i];
		ls[j]->n = o;
	}
}

/* The pause cache holds exactly the copies of what the new manifest names
 * (a delta's layers kept by the resume, this pause's own; an older tail
 * or disk chunk goes). */
static void cache_keep_named(const struct pcache_seal *seal, const struct pchunk_list *state,
			     const struct pchunk_list *disk)
{
	const char **shas = malloc((state->n + disk->n + 1) * sizeof(*shas));
	size_t n = 0;

	if (!shas)
		return;
	for (size_t i = 0; i < state->n; i++)
		shas[n++] = state->c[i].sha256;
	for (size_t i = 0; i < disk->n; i++)
		shas[n++] = disk->c[i].sha256;
	pcache_keep_only(seal, shas, n);
	free(shas);
}

/* The previous generation's manifest, fetched on a thread of its own while
 * the pause checks the bucket and the base and saves the VM: one round trip
 * off the pause's path. */
struct old_fetch {
	const struct s3_config *c;
	const char *customer, *id;
	struct pmanifest *pm;
	pthread_t th;
	int started;
};

static void *old_fetch_thread(void *arg)
{
	struct old_fetch *o = arg;

	o->pm = session_get_manifest(o->c, o->customer, o->id, &(struct kiln_err){ .code = "" });
	return NULL;
}

/* The manifest (NULL: none, unreadable, or already taken), the caller's
 * once the fetch is done. */
static struct pmanifest *old_fetch_join(struct old_fetch *o)
{
	struct pmanifest *pm;

	if (o->started) {
		pthread_join(o->th, NULL);
		o->started = 0;
	}
	pm = o->pm;
	o->pm = NULL;
	return pm;
}

/* A saved VM and its network, destroyed (pause_v2, on a thread while the
 * uploads finish; nothing else touches s->vm or s->net meanwhile: the pause
 * holds s->op and the session is SS_PAUSING). */
static void *vm_down_thread(void *arg)
{
	struct session *s = arg;

	vm_destroy(&s->vm);
	if (s->net) {
		net_sandbox_stop(s->net, NULL);
		s->net = NULL;
	}
	return NULL;
}

/* A pause's volume uploads (session_vols_save), on a thread beside the
 * session's own chunks; nothing else touches the session's volume fields
 * meanwhile (the pause holds s->op and the VM is saved). */
struct vols_job {
	struct session_table *ss;
	struct session *s;
	const struct s3_config *c;
	uint64_t bytes;
	int rc, started, ran;
	struct kiln_err err;
	pthread_t th;
};

static void *vols_thread(void *arg)
{
	struct vols_job *j = arg;

	j->rc = session_vols_save(j->ss, j->s, j->c, "pause", &j->bytes, &j->err);
	return NULL;
}

/* sessions.save_pages 2: the stream just composed checked page by page
 * against QEMU's own save of the same stopped VM (vmmem_verify). A
 * mismatch, or a check that cannot run, fails the pause (ps->rc): the VM,
 * whole and stopped, then goes on as after any stream failure. */
static void verify_pause(struct session *s, int base_fd, struct pause_stream *ps)
{
	struct vmmem_cmp cr;
	int64_t t0 = proto_now_ms();

	if (vmmem_verify(&s->vm, s->state_path, base_fd, s->snap->mem_size, s->dir, SESSION_SAVE_MS, &cr, &ps->err) <
	    0) {
		fprintf(stderr, "kiln-host: session %s: pause check failed: %s\n", s->id, ps->err.message);
		ps->rc = -1;
		return;
	}
	fprintf(stderr,
		"kiln-host: session %s: pause checked: all %llu pages match QEMU's own save (%llu carried by the "
		"stream, the rest the base's) in %lld ms\n",
		s->id, (unsigned long long)cr.pages, (unsigned long long)cr.in_stream, (long long)(proto_now_ms() - t0));
}

/* Stop the VM into the filter (running) or take the local copy (a retry),
 * upload the chunks, then the manifest. On success *bytes holds the
 * compressed bytes sent. */
static int pause_v2(struct session_table *ss, struct session *s, const struct s3_config *c, uint64_t *bytes,
		    uint64_t *base_bytes, struct migfilter_stats *fst, struct kiln_err *err)
{
	struct pause_stream ps = { .rfd = -1, .local_fd = -1, .fork_fd = -1 };
	struct pchunk_list state = { 0 }, disk = { 0 };
	struct pmanifest *old = NULL;
	char prefix[512], gen[48], base_sha[65];
	void *map = MAP_FAILED;
	pthread_t th;
	int pfd[2] = { -1, -1 }, started = 0, r = -1, fail_vm = 0, base_fd;
	/* Where a pause's time goes (logged): the bucket, the base and the
	 * previous manifest checked; QEMU's stream through the filter (chunks
	 * upload meanwhile); the VM torn down; the last uploads; the manifest. */
	int64_t t0 = proto_now_ms(), t_prep = 0, t_saved = 0, t_down = 0, t_up = 0, t_vols = 0;
	unsigned rnd = 0;
	struct old_fetch of = { .c = c, .customer = s->customer, .id = s->id };
	pthread_t down_tid;
	int down = 0, down_th = 0; /* the VM saved and going; on vm_down_thread */
	struct vmmem_save sv = { .pm_fd = -1, .tpl_fd = -1 };
	int fast = 0;
	struct pcache_seal seal = { .dir = "" };
	size_t tail = 0;
	int chain;
	struct vols_job vj = { .started = 0 };

	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (unsigned)getpid() ^ (unsigned)proto_now_ms();
	snprintf(gen, sizeof(gen), "%lld-%08x", (long long)clock_wall_ms(), rnd);
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/%s/", s->customer, s->id, gen);
	/* A fork's child started before the fork's upload ended: its manifest
	 * (the snapshot's, which a delta goes over) first. */
	if (s->state == SS_RUNNING)
		fork_child_settle(s, c);
	of.started = pthread_create(&of.th, NULL, old_fetch_thread, &of) == 0;
	if (!of.started)
		of.pm = session_get_manifest(c, s->customer, s->id, &(struct kiln_err){ .code = "" });
	/* The base: the snapshot's RAM (its hash cached after the first pause
	 * of this snapshot), or the base this session was resumed on. */
	if (s->base_fd >= 0)
		snprintf(base_sha, sizeof(base_sha), "%s", s->base_sha);
	else if (snapshot_mem_sha256(s->snap, base_sha, err) < 0)
		goto out;
	base_fd = s->base_fd >= 0 ? s->base_fd : s->snap->mem_fd;
	/* In S3 before any manifest names it (while the VM still runs: a
	 * failure here leaves it running). */
	if (session_base_ensure(ss->bases, c, base_fd, s->snap->mem_size, base_sha, s->snap->key, 0, base_bytes,
				err) < 0)
		goto out;
	t_prep = proto_now_ms();
	ps.up = pchunk_up_start(c, prefix, PAUSE_WORKERS);
	if (!ps.up) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the uploader");
		goto out;
	}
	ps.up_ok = 1;
	/* The previous manifest: what is in S3 already is not sent again, and
	 * a delta goes over its layers. */
	old = old_fetch_join(&of);
	if (old && pchunk_up_known(ps.up, &old->state, &old->disk) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	/* This pause's chunks are kept here too (an older pause's go), for a
	 * resume on this host, sealed with a key of this pause's own that only
	 * its manifest will hold. A delta keeps its layers' copies (the resume
	 * of a version 3 manifest left them) and their key: the new manifest
	 * holds it again. */
	chain = (s->state == SS_RUNNING ? pause_may_delta(ss, s, old) : s->saved_delta) && old && old->has_cache_key;
	if (pcache_dir(&ss->pcache, s->customer, s->id, !chain, seal.dir, sizeof(seal.dir)) == 0 ||
	    (chain && pcache_dir(&ss->pcache, s->customer, s->id, 1, seal.dir, sizeof(seal.dir)) == 0)) {
		if (chain) {
			memcpy(seal.key, old->cache_key, PCACHE_KEY_LEN);
			pchunk_up_cache(ps.up, &seal);
		} else if (pcache_key_new(seal.key) == 0) {
			pchunk_up_cache(ps.up, &seal);
		} else {
			pcache_drop(&ss->pcache, s->customer, s->id); /* no key: nothing kept */
			seal.dir[0] = '\0';
		}
	}
	if (s->state == SS_RUNNING) {
		ps.local_fd = open(s->state_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (ps.local_fd < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
			goto out;
		}
		/* The changed pages read out of QEMU (vmmem.c), not QEMU's walk
		 * of every page. On a base fetched from S3 the template is the
		 * stream the session was resumed from (its firmware pages are
		 * those of the template the session began on, not this host's):
		 * without it, QEMU saves. */
		sv = (struct vmmem_save){ .vm = &s->vm,
					  .tpl_path = s->base_fd >= 0 ? s->resumed_tpl : s->snap->state,
					  .base_fd = base_fd,
					  .size = s->snap->mem_size, .disks_stay = ss->save_pages == 2, .pm_fd = -1,
					  .tpl_fd = -1, .map_fd = s->fork ? s->fork->mem_fd : -1,
					  .also = s->fork ? &s->fork->pages : NULL, .copy_fd = -1 };
		if (ss->save_pages && (s->base_fd < 0 || s->resumed_tpl[0])) {
			struct kiln_err fe;

			fast = vmmem_save_open(&sv, &fe) == 0;
			if (!fast)
				fprintf(stderr, "kiln-host: session %s: saved through QEMU: %s\n", s->id, fe.message);
		}
		if (fast) {
			ps.delta = pause_may_delta(ss, s, old);
			sv.delta = ps.delta ? &s->layers : NULL;
			sv.mark = ps_mark;
			sv.mark_ctx = &ps;
		}
		/* envd's streams end now (unavailable); its processes are saved
		 * with the VM and a resumed session's new channel lists them. */
		session_envd_close(ss, s, "the sandbox is being paused");
		if (fast) {
			int qemu_failed = 0;

			r = vmmem_save_fast(&sv, proto_now_ms() + SESSION_SAVE_MS, ps_write, &ps, &ps.st, &qemu_failed,
					    &ps.err);
			vmmem_save_close(&sv);
			if (r < 0 && qemu_failed) {
				/* Nothing written yet: QEMU saves it whole instead
				 * (a stopped VM migrates as a running one does). */
				fprintf(stderr, "kiln-host: session %s: QEMU did not save its devices (%s): saving it whole\n",
					s->id, ps.err.message);
				fast = 0;
				ps.delta = 0; /* QEMU's stream is whole, and not cut */
			} else {
				ps.rc = r;
				if (r == 0 && ps_flush(&ps) < 0)
					ps.rc = kiln_err_set(&ps.err, KERR_HOST_ERROR, "writing the session's state: %s",
							     strerror(errno));
				pchunk_buf_free(ps.cur);
				ps.cur = NULL;
				r = 0;
			}
		}
		if (!fast) {
			/* Populated in the kernel: the filter compares every page the
			 * stream carries, and a user-mode fault per 64 KiB costs more. */
			map = mmap(NULL, s->snap->mem_size, PROT_READ, MAP_SHARED | MAP_POPULATE, base_fd, 0);
			if (map == MAP_FAILED) {
				kiln_err_set(err, KERR_HOST_ERROR, "mapping the base RAM: %s", strerror(errno));
				goto keep_running;
			}
			ps.base = (struct migfilter_base){ .block = "mem", .data = map, .size = s->snap->mem_size };
			if (pipe2(pfd, O_CLOEXEC) < 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "pipe: %s", strerror(errno));
				goto keep_running;
			}
			/* A large pipe: QEMU writes in bursts while the filter compares. */
			fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20);
			ps.rfd = pfd[0];
			if (pthread_create(&th, NULL, ps_thread, &ps) != 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "cannot start the stream filter");
				goto keep_running;
			}
			started = 1;
			r = snapshot_save_fd(&s->vm, pfd[1], SESSION_SAVE_MS, err);
			close(pfd[1]);
			pfd[1] = -1;
			if (r < 0) {
				/* QEMU may have stopped the guest: it cannot be trusted to go
				 * on. Its end of the pipe closes with it. */
				fail_vm = 1;
				vm_destroy(&s->vm);
			}
			pthread_join(th, NULL);
			started = 0;
		}
		t_saved = proto_now_ms();
		*fst = ps.st;
		if (close(ps.local_fd) < 0 && r == 0 && ps.rc == 0)
			ps.rc = kiln_err_set(&ps.err, KERR_HOST_ERROR, "writing %s: %s", s->state_path, strerror(errno));
		ps.local_fd = -1;
		if (fast && r == 0 && ps.rc == 0 && ss->save_pages == 2)
			verify_pause(s, base_fd, &ps);
		if (r == 0 && ps.rc < 0) {
			/* QEMU saved the VM but the stream could not be kept (a
			 * format the filter does not know, a full disk): the VM is
			 * whole and stopped, so it goes on instead of being lost. */
			*err = ps.err;
			r = -1;
			if (vm_qmp(&s->vm, "{\"execute\":\"cont\"}", proto_now_ms() + 10000, NULL,
				   &(struct kiln_err){ .code = "" }) == 0) {
				session_envd_enable(ss, s);
				goto out;
			}
		}
		if (r < 0) {
			fail_vm = 1;
			goto out;
		}
		r = -1;
		/* Saved: the VM and its network go now, on a thread of their own
		 * while the uploads finish (joined below, before its capacity is
		 * given back); the files stay until S3 has them. */
		down = 1;
		down_th = pthread_create(&down_tid, NULL, vm_down_thread, s) == 0;
		if (!down_th)
			vm_down_thread(s);
		s->state = SS_PAUSING;
		/* For a retry from the local copy, if S3 does not take it now. */
		s->saved_cut = ps.cut;
		s->saved_tail_off = ps.tail_off;
		s->saved_delta = ps.delta;
		s->saved_depth = ps.delta ? old->depth + 1 : 0;
		snprintf(s->saved_over, sizeof(s->saved_over), "%s", ps.delta ? old->generation : "");
		t_down = proto_now_ms();
	} else {
		/* A retry: the local copy, cut where its devices begin; a delta
		 * goes over the same layers, still what S3's manifest names. */
		ps.cut = s->saved_cut;
		ps.delta = s->saved_delta;
		if (ps.delta && (!old || strcmp(old->generation, s->saved_over))) {
			kiln_err_set(err, KERR_HOST_ERROR, "the layers this pause goes over are no longer the session's");
			goto out;
		}
		if (!ps.cut) {
			r = queue_file(ps.up, 0, s->state_path, err);
		} else if ((r = queue_range(ps.up, 0, s->state_path, 0, s->saved_tail_off, err)) == 0) {
			ps.tail_at = pchunk_up_count(ps.up, 0);
			r = queue_range(ps.up, 0, s->state_path, s->saved_tail_off, UINT64_MAX, err);
		}
		if (r == -1)
			goto out; /* a retry without the local copy of the stream */
	}
	/* The read-write volumes go up meanwhile, on a thread of their own
	 * (the VM is saved: its slots no longer change). */
	if (session_vols_rw(s)) {
		vj = (struct vols_job){ .ss = ss, .s = s, .c = c, .err = { .code = "" } };
		vj.started = pthread_create(&vj.th, NULL, vols_thread, &vj) == 0;
		if (!vj.started)
			vols_thread(&vj);
		vj.ran = 1;
	}
	/* -2: an upload failed; pchunk_up_finish says which. */
	if (r != -2 && (r = queue_file(ps.up, 1, s->disk, err)) == -1)
		goto out;
	r = pchunk_up_finish(ps.up, &state, &disk, bytes, err);
	ps.up = NULL;
	if (r < 0)
		goto out;
	if (down_th) {
		pthread_join(down_tid, NULL);
		down_th = 0;
	}
	t_up = proto_now_ms();
	r = -1;
	if (ps.cut && state.n <= ps.tail_at) {
		kiln_err_set(err, KERR_HOST_ERROR, "the session's state has no devices after its pages");
		goto out;
	}
	tail = ps.cut ? state.n - ps.tail_at : 0;
	if (ps.delta && layer_over(&state, old) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	/* Its read-write volumes as they were when the VM stopped (QEMU
	 * flushed them into their slots), in before the manifest that makes
	 * the pause: a resume fills the slots with exactly this. */
	if (vj.started) {
		pthread_join(vj.th, NULL);
		vj.started = 0;
	}
	t_vols = proto_now_ms();
	if (vj.ran && vj.rc < 0) {
		*err = vj.err;
		goto out;
	}
	*bytes += vj.bytes;
	r = put_manifest_v2(ss, s, c, gen, base_sha, &state, &disk, tail, ps.delta ? old->depth + 1 : 0, fst,
			    seal.dir[0] ? &seal : NULL, err);
	if (r == 0 && t_saved && fast)
		fprintf(stderr,
			"kiln-host: session %s saved from its pages: QEMU stopped and saved its devices in %lld ms; "
			"%llu private pages read and composed with them in %lld ms\n",
			s->id, (long long)sv.ms_devices, (unsigned long long)sv.private_pages, (long long)sv.ms_pages);
	if (r == 0 && t_saved)
		fprintf(stderr,
			"kiln-host: session %s paused in %lld ms: prepare %lld (bucket, base, previous manifest), "
			"save %lld (QEMU's stream through the filter, chunks uploading meanwhile), then %lld, "
			"uploads and VM teardown finish %lld, volumes (uploading meanwhile) %lld more, manifest %lld\n",
			s->id, (long long)(proto_now_ms() - t0), (long long)(t_prep - t0), (long long)(t_saved - t_prep),
			(long long)(t_down - t_saved), (long long)(t_up - t_down), (long long)(t_vols - t_up),
			(long long)(proto_now_ms() - t_vols));
	if (r == 0 && ps.delta)
		fprintf(stderr,
			"kiln-host: session %s: a delta over %zu chunks of layers (depth %d): %llu of %llu private pages "
			"unchanged, %llu back to the base's\n",
			s->id, old->state.n - old->tail, old->depth + 1, (unsigned long long)sv.pages_same,
			(unsigned long long)sv.private_pages, (unsigned long long)sv.pages_gone);
	if (r == 0 && old) {
		/* The new manifest is in: what the previous generation has that
		 * the new one does not name can go. */
		keep_named(s, old, &state, &disk);
		session_delete_old(ss, old);
		old = NULL;
	}
	if (r == 0 && seal.dir[0])
		cache_keep_named(&seal, &state, &disk);
	if (r == 0)
		pcache_prune(&ss->pcache, s->customer, s->id);
	goto out;
keep_running:
	/* Nothing saved, the VM whole (stopped if the save that reads pages
	 * stopped it before QEMU refused its part): it goes on. */
	if (vm_qmp(&s->vm, "{\"execute\":\"cont\"}", proto_now_ms() + 10000, NULL, &(struct kiln_err){ .code = "" }) == 0)
		session_envd_enable(ss, s);
	else
		fail_vm = 1;
out:
	if (vj.started)
		pthread_join(vj.th, NULL);
	if (started) {
		if (pfd[1] >= 0)
			close(pfd[1]);
		pfd[1] = -1;
		pthread_join(th, NULL);
	}
	if (down_th)
		pthread_join(down_tid, NULL);
	if (down) {
		session_reservation_release(ss, s);
		if (s->has_tu) {
			/* Paused: the template is no longer in use here. */
			template_release(hostd_templates(ss->d), &s->tu);
			s->has_tu = 0;
		}
	}
	if (ps.up) {
		struct kiln_err e2;

		pchunk_up_finish(ps.up, &state, &disk, bytes, &e2);
	}
	if (pfd[0] >= 0)
		close(pfd[0]);
	if (pfd[1] >= 0)
		close(pfd[1]);
	if (ps.local_fd >= 0)
		close(ps.local_fd);
	if (map != MAP_FAILED)
		munmap(map, s->snap->mem_size);
	free(state.c);
	free(disk.c);
	if (!old)
		old = old_fetch_join(&of);
	if (old) {
		pmanifest_free(old);
		free(old);
	}
	/* No new manifest: what this pause kept names nothing (the older
	 * pause's files went when it started; its resume fetches from S3). */
	if (r < 0 && seal.dir[0])
		pcache_drop(&ss->pcache, s->customer, s->id);
	OPENSSL_cleanse(&seal, sizeof(seal));
	return fail_vm ? -2 : r;
}

void sessions_set_save_pages(struct session_table *ss, int mode)
{
	ss->save_pages = mode;
}

json_t *session_pause(struct session_table *ss, const char *id, struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	int64_t t0 = proto_now_ms();
	struct migfilter_stats fst = { 0 };
	uint64_t bytes = 0, base_bytes = 0, disk_size = 0;
	struct hostd_s3 s3;
	struct stat st;
	char prefix[512];
	json_t *out;
	int r;

	if (!s)
		return NULL;
	if (hostd_s3_take(ss->d, &s3) < 0) {
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
		session_put(ss, s, 0);
		return NULL;
	}
	r = pause_v2(ss, s, &s3.c, &bytes, &base_bytes, &fst, err);
	if (r == -2) {
		fprintf(stderr, "kiln-host: session %s: pause failed (%s); the session ends\n", id, err->message);
		hostd_s3_free(&s3);
		session_teardown(ss, s);
		session_put(ss, s, 1);
		return NULL;
	}
	if (r < 0) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, kiln_err_is_s3(err->errc) ? KERR_S3_UNAVAILABLE : err->errc,
			     s->state == SS_PAUSING ? "the session is saved on this host but not yet in S3 (pause again to retry): %s"
						    : "the session could not be paused and still runs: %s",
			     m);
		hostd_s3_free(&s3);
		session_put(ss, s, 0);
		return NULL;
	}
	if (stat(s->disk, &st) == 0)
		disk_size = (uint64_t)st.st_size;
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/", s->customer, s->id);
	out = json_pack("{s:s, s:s, s:{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I}}", "id", s->id, "state", "paused",
			"snapshot", "bucket", s3.c.bucket, "prefix", prefix, "bytes", (json_int_t)bytes, "pause_ms",
			(json_int_t)(proto_now_ms() - t0), "pages_changed", (json_int_t)fst.pages_kept, "pages_total",
			(json_int_t)fst.pages, "disk_bytes", (json_int_t)disk_size, "base_bytes", (json_int_t)base_bytes);
	hostd_s3_free(&s3);
	session_teardown(ss, s);
	session_put(ss, s, 1);
	return out;
}

/* ---- checkpoint: a running session kept as a snapshot ---------------------- */

/* A fork's upload, after its checkpoint answered: the children on this
 * host run meanwhile on the fork's copy of the RAM (session_fork.c). */
struct ckpt_job {
	struct session_table *ss;
	struct hostd_s3 s3;          /* the uploader's S3 (its own: the request's goes) */
	struct pchunk_up *up;
	struct fork_base *fb;        /* a reference */
	json_t *m;                   /* the manifest, its chunk lists to come */
	size_t tail_at;
	char key[512], customer[65], snap_id[65], session[65];
	int64_t t0;
};

static void *ckpt_job_run(void *arg)
{
	struct ckpt_job *j = arg;
	struct session_table *ss = j->ss;
	struct pchunk_list state = { 0 }, disk = { 0 };
	struct kiln_err err = { .code = "" };
	uint64_t bytes = 0;
	int r = pchunk_up_finish(j->up, &state, &disk, &bytes, &err);

	if (r == 0) {
		json_object_set_new(j->m, "state", pchunk_list_json(&state));
		json_object_set_new(j->m, "disk", pchunk_list_json(&disk));
		json_object_set_new(j->m, "tail", json_integer((json_int_t)(state.n - j->tail_at)));
		r = put_manifest(&j->s3.c, j->key, json_incref(j->m), &err);
	}
	if (r == 0) {
		fprintf(stderr, "kiln-host: session %s: fork snapshot %s in S3 %lld ms after its copy (%llu bytes)\n",
			j->session, j->snap_id, (long long)(proto_now_ms() - j->t0), (unsigned long long)bytes);
		fork_base_finish(j->fb, FORK_UPLOADED, j->m);
		j->m = NULL;
	} else {
		struct kiln_err e2 = { .code = "" };

		fprintf(stderr, "kiln-host: session %s: fork snapshot %s did not reach S3 (its children here pause whole; "
				"none starts elsewhere): %s\n", j->session, j->snap_id, err.message);
		fork_base_finish(j->fb, FORK_FAILED, NULL);
		sessions_snapshot_delete(ss, j->customer, j->snap_id, &e2); /* its cache copies too */
	}
	fork_children_adopt(ss, j->fb, &j->s3.c);
	fork_base_put(j->fb);
	json_decref(j->m);
	free(state.c);
	free(disk.c);
	hostd_s3_free(&j->s3);
	pthread_mutex_lock(&ss->lock);
	ss->ckpt_jobs--;
	pthread_cond_broadcast(&ss->ckpt_cond);
	pthread_mutex_unlock(&ss->lock);
	free(j);
	return NULL;
}

/* Hand the rest of a fork's checkpoint to a thread: the fork's RAM copy
 * published with the manifest as far as it is known. Takes job, fb (a
 * reference) and m. */
static void ckpt_job_start(struct session_table *ss, struct ckpt_job *j, struct fork_base *fb, json_t *m)
{
	pthread_t th;
	pthread_attr_t a;

	j->ss = ss;
	j->fb = fb;
	j->m = m;
	snprintf(fb->base_sha, sizeof(fb->base_sha), "%s",
		 json_string_value(json_object_get(json_object_get(m, "base"), "sha256")) ?: "");
	fb->upload = FORK_UPLOADING;
	fb->manifest = json_deep_copy(m);
	fork_base_publish(fb, j->customer, j->snap_id, json_string_value(json_object_get(m, "generation")) ?: "");
	pthread_mutex_lock(&ss->lock);
	ss->ckpt_jobs++;
	pthread_mutex_unlock(&ss->lock);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &a, ckpt_job_run, j) != 0)
		ckpt_job_run(j);
	pthread_attr_destroy(&a);
}

/* Save the running session s to customer's snapshot snap_id: its pages read
 * out of the stopped VM and its disk layer copied, then the VM goes on
 * while the chunks upload (under "<customer>/snapshots/<snap_id>/", a whole
 * save: no layer of the session's own pauses is named, so those never
 * hold a snapshot's data) and the manifest last. *stop_ms: how long the VM
 * stood still. With fork (on this host's template), a copy of its RAM is
 * published for the children here and the upload ends after the return
 * (ckpt_job_run). */
static int checkpoint_v3(struct session_table *ss, struct session *s, const struct s3_config *c, const char *snap_id,
			 int fork, uint64_t *bytes, int64_t *stop_ms, struct kiln_err *err)
{
	struct fork_base *fb = NULL;
	struct ckpt_job *job = NULL;
	int64_t t_begin = proto_now_ms();
	int queued = 0;
	struct pause_stream ps = { .rfd = -1, .local_fd = -1, .fork_fd = -1 };
	struct pchunk_list state = { 0 }, disk = { 0 };
	struct vmmem_save sv = { .pm_fd = -1, .tpl_fd = -1 };
	char prefix[512], gen[48], base_sha[65], ckdisk[PATH_MAX + 32], key[512], cid[80];
	int base_fd, qemu_failed = 0, r = -1, went_on = 0, dfd;
	uint64_t base_up = 0;
	struct pcache_seal seal = { .dir = "" };
	int64_t t_stop = 0;
	unsigned rnd = 0;
	json_t *m;

	/* A fork's upload goes on after the answer: its uploader has an S3 of
	 * its own. */
	if (fork && s->base_fd < 0 && (job = calloc(1, sizeof(*job)))) {
		if (hostd_s3_take(ss->d, &job->s3) == 0) {
			c = &job->s3.c;
		} else {
			free(job);
			job = NULL;
		}
	}
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (unsigned)getpid() ^ (unsigned)proto_now_ms();
	snprintf(gen, sizeof(gen), "%lld-%08x", (long long)clock_wall_ms(), rnd);
	snprintf(prefix, sizeof(prefix), "%s/" PMANIFEST_SNAPSHOTS "/%s/%s/", s->customer, snap_id, gen);
	snprintf(ckdisk, sizeof(ckdisk), "%s/checkpoint.qcow2", s->dir);
	if (s->base_fd >= 0)
		snprintf(base_sha, sizeof(base_sha), "%s", s->base_sha);
	else if (snapshot_mem_sha256(s->snap, base_sha, err) < 0)
		return -1;
	base_fd = s->base_fd >= 0 ? s->base_fd : s->snap->mem_fd;
	if (session_base_ensure(ss->bases, c, base_fd, s->snap->mem_size, base_sha, s->snap->key, 0, &base_up, err) < 0)
		return -1;
	sv = (struct vmmem_save){ .vm = &s->vm, .tpl_path = s->base_fd >= 0 ? s->resumed_tpl : s->snap->state,
				  .base_fd = base_fd, .size = s->snap->mem_size, .disks_stay = 1, .pm_fd = -1,
				  .tpl_fd = -1, .mark = ps_mark, .mark_ctx = &ps,
				  .map_fd = s->fork ? s->fork->mem_fd : -1, .also = s->fork ? &s->fork->pages : NULL,
				  .copy_fd = -1 };
	/* Only the save that reads pages leaves the VM able to go on (QEMU's
	 * own hands its disks over, as to a migration's target). */
	if (!ss->save_pages || (s->base_fd >= 0 && !s->resumed_tpl[0]))
		return kiln_err_set(err, KERR_HOST_ERROR,
				    "this session cannot be copied while it runs (sessions.save_pages is off, or it "
				    "was resumed from a base without its template stream)");
	if (vmmem_save_open(&sv, err) < 0)
		return -1;
	ps.up = pchunk_up_start(c, prefix, PAUSE_WORKERS);
	if (!ps.up) {
		vmmem_save_close(&sv);
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot start the uploader");
	}
	ps.up_ok = 1;
	/* Kept here too: sessions started from it on this host (a fork's
	 * children) read the chunks locally, with the key only its manifest
	 * holds. */
	session_snapshot_cache_id(cid, sizeof(cid), snap_id);
	if (pcache_dir(&ss->pcache, s->customer, cid, 1, seal.dir, sizeof(seal.dir)) == 0) {
		if (pcache_key_new(seal.key) == 0)
			pchunk_up_cache(ps.up, &seal);
		else
			seal.dir[0] = '\0';
	}
	dfd = open(ckdisk, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (dfd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", ckdisk, strerror(errno));
		vmmem_save_close(&sv);
		goto out;
	}
	close(dfd);
	/* A fork's children on this host map a copy of the parent's RAM: it
	 * holds the RAM file's pages now (while the VM runs), the walk below
	 * writes the parent's own over them. Only on this host's template
	 * (a session on a base fetched from S3 has its children load theirs). */
	if (fork && s->base_fd < 0) {
		struct kiln_err fe = { .code = "" };

		fb = fork_base_new(s->fork ? s->fork->mem_fd : base_fd, s->snap->mem_size, s->snap->key, &fe);
		if (!fb) {
			fprintf(stderr, "kiln-host: session %s: its children load their own RAM: %s\n", s->id, fe.message);
		} else {
			if (fork_base_prepare(fb, &sv, &fe) < 0)
				fprintf(stderr, "kiln-host: session %s: a fork's copy of its RAM is made in the stop: %s\n",
					s->id, fe.message);
			sv.copy_fd = fb->mem_fd;
			sv.copy_pages = &fb->pages;
			ps.fork_fd = fb->stream_fd;
		}
	}
	/* envd's streams end now, as at a pause: the copies must not hold a
	 * channel in the middle of a message (the session's own reopens). */
	session_envd_close(ss, s, "the sandbox is being copied (fork or snapshot): reconnect");
	/* Compressing and sending wait until the VM goes on: on a small host
	 * they would take the stand-still's CPU. */
	pchunk_up_hold(ps.up, 1);
	t_stop = proto_now_ms();
	r = vmmem_save_fast(&sv, proto_now_ms() + SESSION_SAVE_MS, ps_write, &ps, &ps.st, &qemu_failed, &ps.err);
	vmmem_save_close(&sv);
	if (r == 0 && ps_flush(&ps) < 0)
		r = kiln_err_set(&ps.err, KERR_HOST_ERROR, "writing the session's state: %s", strerror(errno));
	pchunk_buf_free(ps.cur);
	ps.cur = NULL;
	if (r == 0 && !ps.cut)
		r = kiln_err_set(&ps.err, KERR_HOST_ERROR, "the session's state has no devices after its pages");
	/* The disk layer as it is now (QEMU flushed it when it stopped). */
	if (r == 0)
		r = session_prestart_disk(s->disk, ckdisk, &ps.err);
	/* Queued while the uploader is held: once it goes on, a queue of the
	 * stream's chunks would make this wait for room. */
	if (r == 0 && (queued = queue_file(ps.up, 1, ckdisk, &ps.err)) == -1)
		r = -1;
	if (r == 0 && fb) {
		struct kiln_err fe = { .code = "" };

		if (fork_base_seal(fb, ckdisk, &fe) < 0) {
			fprintf(stderr, "kiln-host: session %s: its children load their own RAM: %s\n", s->id, fe.message);
			fork_base_put(fb);
			fb = NULL;
		}
	}
	/* The VM goes on, its clock set again (it stood still meanwhile). */
	if (vm_qmp(&s->vm, "{\"execute\":\"cont\"}", proto_now_ms() + 10000, NULL, err) == 0 &&
	    vm_setup(&s->vm, proto_now_ms() + 10000, &(struct kiln_err){ .code = "" }) == 0)
		went_on = 1;
	*stop_ms = proto_now_ms() - t_stop;
	if (job && fb)
		pchunk_up_background(ps.up, 10);
	pchunk_up_hold(ps.up, 0);
	if (went_on)
		session_envd_enable(ss, s);
	if (r < 0) {
		*err = ps.err;
		goto out;
	}
	if (!went_on) {
		r = -2; /* err: why it did not go on */
		goto out;
	}
	r = queued; /* -2: an upload failed, which pchunk_up_finish says */
	if (job && fb && r == 0) {
		/* The children here need only the fork's RAM copy and what the
		 * manifest says besides its chunks: the answer goes now, the
		 * chunks and the manifest follow (ckpt_job_run). */
		m = manifest_json(ss, s, gen, base_sha, &state, &disk, pchunk_up_count(ps.up, 0) - ps.tail_at, 0, &ps.st,
				  seal.dir[0] ? &seal : NULL);
		if (m) {
			json_object_set_new(m, "id", json_string(snap_id));
			json_object_set_new(m, "session", json_string(s->id));
			job->up = ps.up;
			ps.up = NULL;
			job->tail_at = ps.tail_at;
			job->t0 = proto_now_ms();
			snprintf(job->key, sizeof(job->key), "%s/" PMANIFEST_SNAPSHOTS "/%s/manifest.json", s->customer,
				 snap_id);
			snprintf(job->customer, sizeof(job->customer), "%s", s->customer);
			snprintf(job->snap_id, sizeof(job->snap_id), "%s", snap_id);
			snprintf(job->session, sizeof(job->session), "%s", s->id);
			*bytes = ps.st.out_bytes; /* the stream's, uncompressed: S3's comes later */
			fprintf(stderr, "kiln-host: session %s: fork %s ready here: %lld ms before the stop, %lld in it, %lld "
					"after\n", s->id, snap_id, (long long)(t_stop - t_begin), (long long)*stop_ms,
				(long long)(proto_now_ms() - t_stop - *stop_ms));
			ckpt_job_start(ss, job, fb, m);
			job = NULL;
			fb = NULL;
			goto out;
		}
	}
	r = pchunk_up_finish(ps.up, &state, &disk, bytes, err);
	ps.up = NULL;
	if (r < 0)
		goto out;
	m = manifest_json(ss, s, gen, base_sha, &state, &disk, state.n - ps.tail_at, 0, &ps.st,
			  seal.dir[0] ? &seal : NULL);
	if (m) {
		json_object_set_new(m, "id", json_string(snap_id));
		json_object_set_new(m, "session", json_string(s->id));
	}
	snprintf(key, sizeof(key), "%s/" PMANIFEST_SNAPSHOTS "/%s/manifest.json", s->customer, snap_id);
	r = put_manifest(c, key, m, err);
	if (r == 0 && fb)
		fork_base_publish(fb, s->customer, snap_id, gen);
out:
	fork_base_put(fb);
	if (ps.up) {
		struct kiln_err e2;

		pchunk_up_finish(ps.up, &state, &disk, bytes, &e2);
	}
	if (job) {
		hostd_s3_free(&job->s3);
		free(job);
	}
	pchunk_buf_free(ps.cur);
	unlink(ckdisk);
	free(state.c);
	free(disk.c);
	if (r < 0 && seal.dir[0])
		pcache_drop(&ss->pcache, s->customer, cid);
	OPENSSL_cleanse(&seal, sizeof(seal));
	return r;
}

json_t *session_checkpoint(struct session_table *ss, const char *id, const char *customer, const char *snapshot_id,
			   int fork, struct kiln_err *err)
{
	struct session *s;
	struct hostd_s3 s3;
	uint64_t bytes = 0;
	int64_t t0 = proto_now_ms(), stop_ms = 0;
	json_t *out;
	int r;

	if (!spool_id_ok(snapshot_id)) {
		kiln_err_set(err, KERR_INVALID_REQUEST,
			     "snapshot: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
		return NULL;
	}
	if (!(s = session_take(ss, id, err)))
		return NULL;
	if (customer && strcmp(customer, s->customer)) {
		session_put(ss, s, 0);
		kiln_err_set(err, KERR_NOT_FOUND, "no such session");
		return NULL;
	}
	if (s->state != SS_RUNNING) {
		session_put(ss, s, 0);
		kiln_err_set(err, KERR_NOT_RUNNING, "the session is not running");
		return NULL;
	}
	/* A copy would be a second writer of the same volume (read-only ones
	 * are fine: the copies fill their slots from S3 too). */
	if (session_vols_rw(s)) {
		session_put(ss, s, 0);
		kiln_err_set(err, KERR_VOLUME_ATTACHED,
			     "the session has a read-write volume mounted: it cannot be forked or snapshotted (mount it "
			     "read-only, or destroy the session and mount the volume in new ones)");
		return NULL;
	}
	if (hostd_s3_take(ss->d, &s3) < 0) {
		session_put(ss, s, 0);
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
		return NULL;
	}
	r = checkpoint_v3(ss, s, &s3.c, snapshot_id, fork, &bytes, &stop_ms, err);
	if (r < 0) {
		/* Whatever reached S3 goes: there is no snapshot. */
		sessions_snapshot_delete(ss, s->customer, snapshot_id, &(struct kiln_err){ .code = "" });
		if (kiln_err_is_s3(err->errc))
			kiln_err_set(err, KERR_S3_UNAVAILABLE, "the session could not be copied to S3 (it goes on): %s",
				     err->message);
	}
	if (r == -2) {
		fprintf(stderr, "kiln-host: session %s: did not go on after its copy (%s); the session ends\n", id,
			err->message);
		hostd_s3_free(&s3);
		session_teardown(ss, s);
		session_put(ss, s, 1);
		return NULL;
	}
	if (r < 0) {
		hostd_s3_free(&s3);
		session_put(ss, s, 0);
		return NULL;
	}
	fprintf(stderr, "kiln-host: session %s copied to snapshot %s in %lld ms (stopped %lld ms, %llu bytes)\n", id,
		snapshot_id, (long long)(proto_now_ms() - t0), (long long)stop_ms, (unsigned long long)bytes);
	out = json_pack("{s:s, s:{s:s, s:s, s:s+++, s:I, s:I, s:I}}", "id", s->id, "snapshot", "id", snapshot_id, "bucket",
			s3.c.bucket, "prefix", s->customer, "/" PMANIFEST_SNAPSHOTS "/", snapshot_id, "/", "bytes",
			(json_int_t)bytes, "stop_ms", (json_int_t)stop_ms, "ms", (json_int_t)(proto_now_ms() - t0));
	hostd_s3_free(&s3);
	session_put(ss, s, 0);
	return out;
}
