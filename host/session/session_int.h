/* session_int: what kiln-host's session files share (session.c: the
 * session table, its launcher thread, create and delete; session_io.c:
 * commands, interactive input, files and outputs over the agent channel;
 * session_pause.c, session_resume.c, session_s3.c: pause to S3 and resume;
 * session_ref.c: the last reference frees the record). Not for other rooms:
 * they use session.h.
 *
 * Locking: ss->lock guards the list, every session's refs, exec_id and
 * input_wr; s->op is held for the whole of one operation (session_take).
 * s->wake (session_idle.c) orders the idle stop against everything that
 * wakes the VM: taken before s->op, never while holding it or ss->lock. */
#ifndef KILN_SESSION_INT_H
#define KILN_SESSION_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "base_book.h"
#include "clock.h"
#include "net/net.h"
#include "pause_cache.h"
#include "pause_manifest.h"
#include "session.h"
#include "template/template.h"
#include "vm/vm.h"
#include "volume.h"

enum session_state { SS_RUNNING, SS_PAUSING, SS_GONE };

/* One measurement of a running session (GET .../metrics?start=&end=). */
#define SESSION_SAMPLE_MS 5000
#define SESSION_SAMPLES 720      /* an hour of them */
struct session_sample {
	int64_t t_ms;            /* wall clock */
	float cpu_pct;
	uint32_t vcpus;
	uint64_t mem_used, mem_total, disk_used, disk_total;
};

struct session {
	char id[65], customer[65];
	enum session_state state;
	struct vm vm;
	struct net_sandbox *net;
	json_t *spec;            /* {"limits","network"}: kept for the manifest */
	unsigned vcpus, memory_mib, output_mib;
	const struct snapshot *snap;
	struct template_use tu;  /* the session's template while it runs here */
	int has_tu;
	char release[65];
	/* The RAM the VM maps copy-on-write when it is not the snapshot's: a
	 * base fetched from S3 on resume (a sealed memfd shared by the
	 * sessions on that base, see session_base_release); -1: snap->mem_fd. */
	int base_fd;
	char base_sha[65];
	/* On a fetched base: the stream this session was resumed from without
	 * its RAM block's pages (header, configuration, block list, firmware
	 * pages, devices), kept by the resume as a fast pause's template: the
	 * firmware pages are then the ones the session began with, not this
	 * host's template's. "": none (the pause goes through QEMU). */
	char resumed_tpl[PATH_MAX + 16];
	/* The layers its RAM came from (session_resume.c; phash.h): what each
	 * page the load wrote held, the manifest's generation and delta depth.
	 * layers_ok: the next pause may be a delta over that manifest. */
	struct phash layers;
	char layers_gen[48];
	int layers_depth, layers_ok;
	/* A pause saved here but not yet in S3 (SS_PAUSING; retried from the
	 * local copy): where the devices begin in that copy, and for a delta
	 * the generation whose layers it goes over and its depth. */
	uint64_t saved_tail_off;
	int saved_cut, saved_delta, saved_depth;
	char saved_over[48];
	/* A fork child started on its parent's host: the parent's RAM at the
	 * copy, which its VM maps instead of base_fd/snap->mem_fd (those stay
	 * the base its manifests name); NULL: none (session_fork.c). */
	struct fork_base *fork;
	/* Started before its fork's upload ended: its manifest comes then
	 * (fork_children_adopt, or its own pause first); under adopt_mu,
	 * which that PUT holds (not the op lock: a client's exec goes on). */
	int adopt_pending;
	pthread_mutex_t adopt_mu;
	/* The snapshot it was started from ("": none): its manifests carry it,
	 * and may name that snapshot's chunks (never deleted by its pauses). */
	char from_snapshot[65];
	char dir[PATH_MAX], disk[PATH_MAX + 16], state_path[PATH_MAX + 16];
	/* Its volumes (the spec's "volumes", session_volume.c): slot i holds
	 * vols[i], filled from the volume's generation vol_gen[i] ("": new),
	 * which its next upload expects to replace. */
	struct vol_mount vols[VOL_SLOTS];
	size_t nvols;
	char vol_gen[VOL_SLOTS][48];
	int vol_fresh[VOL_SLOTS];
	int vol_failed;          /* session_boot failed on a volume (not the state) */
	/* Every slot was filled (session_vols_fill); the read-write ones are
	 * in S3 as this session last saw them (a pause's, a destroy's upload,
	 * or a stale copy that must not write): the teardown has nothing to
	 * upload. Otherwise a teardown (a VM that broke, a failed resume)
	 * uploads them, best effort. */
	int vols_filled, vols_done;
	int vols_live;           /* created or resumed: its guest has used them */
	/* A resume's: the generation of each volume its manifest names (the
	 * one the paused guest saw; {"id":"gen"}, NULL: none). A read-write
	 * volume that has moved on since is not mounted under that guest. */
	json_t *vol_expect;
	int64_t created_ms, last_active_ms;
	pthread_mutex_t op;      /* one operation at a time */
	int refs;                /* under ss->lock */
	/* The interactive command running now (under ss->lock): its id and the
	 * write end of its input pipe (-1: none). */
	char exec_id[33];
	int input_wr;
	/* The VM's envd channel (session_envd.c; under ss->lock): opened on
	 * first use while envd_ok (the VM runs and is not being saved). */
	struct envd *envd;
	int envd_ok;
	/* Idle stop (session_idle.c): stopped (written under wake and
	 * ss->lock: the vCPUs are stopped, the guest clock lags), when the
	 * idler may look at it next (under ss->lock), and the wake lock. */
	pthread_mutex_t wake;
	int stopped;
	/* Its vCPUs hostd counts as idle while stopped (hostd_vcpus_idle;
	 * under ss->lock): 0 when they count as active. */
	unsigned vcpus_idle;
	int64_t idle_check_ms;
	/* The last CPU sample for GET .../metrics (under ss->lock). */
	uint64_t cpu_prev_ns;
	int64_t cpu_prev_us;
	/* Its metrics over time (session_envd.c's sampler, every
	 * SESSION_SAMPLE_MS; under ss->lock): a ring of the last
	 * SESSION_SAMPLES, and the sampler's own CPU baseline. */
	struct session_sample *samples;
	unsigned nsamples, sample_head;
	int64_t sample_next_ms;
	uint64_t sample_prev_ns;
	int64_t sample_prev_us;
	int prestarted;          /* its QEMU was started ahead (session_prestart.c) */
	int64_t boot_ms[3];      /* session_boot's last: QEMU started or taken, state loaded, SETUP */
	/* Called by session_boot once QEMU is there, before its state loads
	 * (a resume's page loader; NULL: none). */
	void (*booted)(void *ctx, struct session *s);
	void *booted_ctx;
	struct session *next;
};

/* A QEMU dies with the thread that started it (PR_SET_PDEATHSIG), and HTTP
 * requests come on threads that end with them: session VMs are started on
 * this process-long thread instead. */
struct launch {
	const struct vm_config *cfg;
	struct vm *vm;
	struct kiln_err *err;
	int done, rc;
	struct launch *next;
};

/* Let go of the session's fetched base RAM (s->base_fd), if any: the last
 * session on it closes it. */
void session_base_release(struct session *s);

/* The session QEMU started ahead (session_prestart.c): what it was started
 * for, and a request for the next one. */
struct prestart_id {
	dev_t mem_dev;
	ino_t mem_ino;
	unsigned memory_mib, vcpus;
	char backing[600], backing2[600];
};

struct prestart_req {
	struct prestart_id id;
	struct vm_config cfg;  /* the host's run options; disk, RAM and backing from the request */
	int mem_fd;            /* owned: a dup of the snapshot's RAM fd */
	char mem_file[600];
};

struct session_prestart {
	int enabled;           /* sessions.prestart (under ss->lock) */
	int th_on, renice;
	pthread_t th;
	pthread_cond_t cond;   /* with ss->lock: a request, or stopping */
	int want;              /* req holds a request */
	struct prestart_req req;
	int ready;             /* vm waits in -incoming defer on disk */
	struct vm vm;
	struct prestart_id id;
	char dir[PATH_MAX], disk[PATH_MAX + 16];
	unsigned seq;
	uint64_t started_total, taken_total, missed_total;
};

struct session_table {
	struct hostd *d;
	char host_id[65];
	char root[PATH_MAX];
	pthread_mutex_t lock;
	struct session *list;
	pthread_t launcher;
	pthread_cond_t launch_cond, launched_cond;
	struct launch *queue;
	int stopping;
	int envd_stopped;        /* sessions_envd_stop: no envd channel opens any more */
	/* Idle stop (session_idle.c): the delay (0: off), the thread, its
	 * wake-up, and counters (under lock). */
	unsigned idle_stop_ms;           /* 0: the idler thread only samples metrics */
	int idler_on, idler_quit;
	pthread_t idler;
	pthread_cond_t idle_cond;
	uint64_t stops_total, wakes_total, wake_failures;
	struct session_prestart pre;
	int save_pages;          /* sessions_set_save_pages: 0, 1, 2 (checked) */
	struct pause_cache pcache; /* sessions_set_pause_cache (root "": off) */
	int pcache_hooked;         /* its sweep is on hostd's janitor timer */
	/* Bases in S3 ahead of the first pause (session_base_prep.c), and the
	 * lock per base that session_base_ensure takes. */
	struct base_book *bases;
	int prepare_base;        /* sessions_set_prepare_base */
	/* Fork checkpoints whose upload goes on, on threads of their own
	 * (session_pause.c): sessions_close waits for them (under lock). */
	int ckpt_jobs;
	pthread_cond_t ckpt_cond;
};

/* Forks' copies of their parent's RAM (session_fork.c) ------------------- */

struct fork_base {
	struct fork_base *next;
	int refs;
	char customer[65], snap_id[65], gen[48];
	char tpl_key[96];        /* the template the parent ran (its snapshot key) */
	uint64_t size;
	int mem_fd;              /* the parent's RAM at the copy: a sealed memfd */
	int stream_fd;           /* its state stream without the RAM block's pages */
	int disk_fd;             /* its disk layer (qcow2 over the template's) */
	uint64_t disk_size;
	struct phash pages;      /* the pages it holds apart from the template's RAM */
	int64_t used_ms;
	/* Its snapshot's upload goes on after the checkpoint answered (the
	 * children here start meanwhile): FORK_UPLOADING, then FORK_UPLOADED
	 * or FORK_FAILED (under the fork lock; fork_base_wait). manifest:
	 * while uploading, the snapshot's manifest without its chunk lists
	 * (what a child needs to start); once uploaded, as in S3. */
	int upload;
	json_t *manifest;
	char base_sha[65];
};

enum { FORK_UPLOADING, FORK_UPLOADED, FORK_FAILED };

/* A fork base of size bytes holding ram_fd's pages (the RAM file the
 * parent's VM maps), its stream and disk still empty; one reference. NULL
 * with err. */
struct fork_base *fork_base_new(int ram_fd, uint64_t size, const char *tpl_key, struct kiln_err *err);
/* Before the stop: the pages the parent holds apart from the file its RAM
 * maps are allocated in the copy (sv opened), so that the stop only copies
 * them (a page made private meanwhile is allocated then). 0 or -1 with
 * err (then the stop allocates them all). */
int fork_base_prepare(struct fork_base *fb, struct vmmem_save *sv, struct kiln_err *err);
/* Once its pages, stream and pages' hashes are written: the disk layer
 * copied in from the file disk, the table finished, the RAM sealed. */
int fork_base_seal(struct fork_base *fb, const char *disk, struct kiln_err *err);
/* Offer fb to the children of customer's snapshot snap_id (manifest
 * generation gen) started here; the caller keeps its own reference. */
void fork_base_publish(struct fork_base *fb, const char *customer, const char *snap_id, const char *gen);
/* The published base of that snapshot, referenced, or NULL. */
struct fork_base *fork_base_find(const char *customer, const char *snap_id);
/* The child s takes fb (found: its reference) and its manifest (a new
 * reference): *uploaded 1, the one in S3; 0, the one without its chunk
 * lists, and then s->adopt_pending is set in the same instant. */
json_t *fork_base_claim(struct fork_base *fb, struct session *s, int *uploaded);
/* pm as a child needs it from that incomplete manifest m (no chunks). */
int fork_pending_manifest(const struct fork_base *fb, json_t *m, struct pmanifest *pm, struct kiln_err *err);
/* The upload is over: state FORK_UPLOADED (manifest: the one in S3, taken)
 * or FORK_FAILED (manifest NULL); those waiting wake. */
void fork_base_finish(struct fork_base *fb, int state, json_t *manifest);
/* Wait up to timeout_ms for the upload to end: its state. */
int fork_base_wait(struct fork_base *fb, int timeout_ms);
/* The fork's upload ended: each child of fb started here before it ends
 * gets the snapshot's manifest as its own (or, on FORK_FAILED, pauses
 * whole), unless its own pause did that first (s->adopt_pending). */
void fork_children_adopt(struct session_table *ss, struct fork_base *fb, const struct s3_config *c);
/* A session started from a snapshot gets the snapshot's manifest (root)
 * as its own (its id, the snapshot named), so that its first pause may be
 * a delta over the snapshot's chunks and a resume finds it. Without it (a
 * failed PUT, said: -1) that pause is a whole one. */
int session_adopt_manifest(const struct s3_config *c, const struct session *s, json_t *root, const char *from_snapshot);
/* A child's side of that, at its pause: wait for the upload, then adopt. */
void fork_child_settle(struct session *s, const struct s3_config *c);
/* Its teardown: no adoption from now on (one under way ends first). */
void fork_child_cancel(struct session *s);
void fork_base_put(struct fork_base *fb);
/* Unpublish that snapshot's base (deleted; NULL, NULL: only those past
 * their time); all of them (shutting down). */
void fork_base_drop(const char *customer, const char *snap_id);
void fork_base_drop_all(void);
/* How many are published (the sweep and tests). */
int fork_base_count(void);
/* A copy of its finished pages table (a child's layers). 0 or -1. */
int fork_base_copy_pages(const struct fork_base *fb, struct phash *out);
/* A new read-only descriptor of its stream, with its own offset (QEMU
 * reads it). -1 with errno. */
int fork_base_open(const struct fork_base *fb);

/* Sessions of this host (session.c) ------------------------------------- */

/* Take the session for one operation: found, referenced, its op lock held.
 * NULL with err "not_found" or "busy". */
struct session *session_take(struct session_table *ss, const char *id, struct kiln_err *err);
/* End an operation; with gone, the session also leaves the list and is
 * freed by whoever holds the last reference. */
void session_put(struct session_table *ss, struct session *s, int gone);
/* Give back what a session holds on this host: its VM, its network, its
 * reservation and its directory (the caller holds s->op). */
void session_teardown(struct session_table *ss, struct session *s);
/* Free a session record (session_ref.c), its base RAM reference included. */
void session_free(struct session *s);
/* The public session object (see session.h). */
json_t *session_json(const struct session_table *ss, const struct session *s);

/* Parse a session spec ({"limits","network"}) as a task spec, so the same
 * rules and messages apply. */
int session_parse_spec(json_t *spec, struct task_spec *out, struct kiln_err *err);
/* The template a session of spec starts from (and is resumed against). */
const struct snapshot *session_template(const struct run_opts *ro, const struct task_spec *spec,
					struct kiln_err *err);
/* session_template for ref's template (NULL: default) taken from the
 * host's template store into *tu (*has_tu set; released by
 * session_teardown or pause). NULL with err. */
const struct snapshot *session_template_take(struct session_table *ss, const struct template_ref *ref,
					     const struct task_spec *spec, struct template_use *tu, int *has_tu,
					     struct kiln_err *err);
/* A new session, not yet registered (session_insert); NULL with err. */
struct session *session_new(struct session_table *ss, const char *id, const char *customer, json_t *spec,
			    const struct task_spec *ts, const struct snapshot *snap, struct kiln_err *err);
/* Register s, unless a session with its id is here already. */
int session_insert(struct session_table *ss, struct session *s, struct kiln_err *err);
/* Start the session's VM: its network (if any), then QEMU on the overlay
 * s->disk (backed by the template's disk; made here when it does not exist,
 * as for a new session), loading state_fd (a template's device state, or a
 * paused session's whole state with mem_ram). A QEMU started ahead for the
 * same configuration is taken when one waits (s->prestarted). */
int session_boot(struct session_table *ss, struct session *s, const struct task_spec *ts, int state_fd, int mem_ram,
		 struct kiln_err *err);

/* The QEMU started ahead (session_prestart.c) ---------------------------- */

/* Start / stop the prestart thread (sessions_open / sessions_close, after
 * every session's VM is gone: its QEMUs die with the thread). */
int session_prestart_open(struct session_table *ss, struct kiln_err *err);
void session_prestart_close(struct session_table *ss);
/* The VM started ahead for cfg, if one waits: moved into *vm (its priority
 * raised), with the path of the overlay it has open (*disk) and that
 * overlay's directory (*dir, for the caller to remove once the overlay is
 * moved). 0, or -1: none, start one as usual. */
int session_prestart_take(struct session_table *ss, const struct vm_config *cfg, struct vm *vm, char *disk,
			  size_t disk_cap, char *dir, size_t dir_cap);
/* A session booted with cfg: have a VM for the next one started ahead (in
 * the background; nothing for a configuration it cannot serve). */
void session_prestart_want(struct session_table *ss, const struct vm_config *cfg);
/* Prometheus lines about it (sessions_metrics). */
void session_prestart_metrics(struct session_table *ss, struct buf *b);
/* Copy the file fetched (a paused session's disk layer) into disk, the
 * overlay a prestarted QEMU holds open, in place. 0, or -1 with err. */
int session_prestart_disk(const char *fetched, const char *disk, struct kiln_err *err);

/* Idle stop (session_idle.c) ------------------------------------------ */

/* Give s's vCPUs and memory back to the host, once (s->vcpus becomes 0):
 * vCPUs the idler moved to idle move back first, under ss->lock, so hostd's
 * active and idle counts stay exact. Every release of a session's
 * reservation goes through here. The caller holds s->op, not ss->lock. */
void session_reservation_release(struct session_table *ss, struct session *s);

/* How long a new or resumed session waits for active vCPUs to go idle
 * before it is refused (hostd_reserve_wait): about one idle delay and the
 * idler's look; 0 with idle stop off. */
unsigned session_admit_wait_ms(const struct session_table *ss);

/* Drop a reference taken under ss->lock without an operation (the session
 * is freed when it was the last one and the session is gone; session_ref.c). */
void session_unref(struct session_table *ss, struct session *s);
/* The caller holds s->wake and s->op: if the idler stopped the VM, continue
 * it and set the guest's clock (it fell behind while stopped) before the
 * caller's request reaches it. 0, or -1 with err (the VM is broken). */
int session_wake_held(struct session_table *ss, struct session *s, struct kiln_err *err);
/* Stop the idler thread (sessions_close, before the VMs go). */
void session_idler_stop(struct session_table *ss);

/* What the idler knows of a session when it decides whether to ask the
 * guest (a pure function of it: unit-tested). */
struct session_idle_view {
	int running;        /* SS_RUNNING and booted (envd_ok) */
	int stopped;        /* already stopped */
	int interactive;    /* an interactive command is attached */
	int envd_busy;      /* envd requests or streams are in flight */
	int64_t last_active_ms, idle_check_ms;
};
/* 1 when the idler should ask the guest for its processes now. */
int session_idle_due(const struct session_idle_view *v, int64_t now_ms, unsigned idle_stop_ms);

/* The envd channel (session_envd.c) ---------------------------------- */

/* Sample the running sessions due for one (the idler's thread, every
 * pass; reads /proc, cgroups and disk layers without ss->lock). */
void sessions_sample(struct session_table *ss);

/* The VM runs: envd may be used from now on (session_boot's end). */
void session_envd_enable(struct session_table *ss, struct session *s);
/* The VM is going (pause, teardown): the channel closes, its streams end
 * with `unavailable`, and no new one opens. */
void session_envd_close(struct session_table *ss, struct session *s, const char *why);

/* Pause and resume (session_pause.c) ------------------------------------ */

/* Take the pause cache's sweep off the janitor's timer, waiting for one in
 * flight (session_pcache.c). Before the table goes. */
void session_pcache_close(struct session_table *ss);

/* The S3 key of a paused session's file name: CUSTOMER/sessions/ID/NAME
 * (session_s3.c). */
void session_s3_key(char *out, size_t cap, const char *customer, const char *id, const char *name);
/* Which host wrote the session's manifest in S3 (its "host_id") into host
 * ("" when it names none): 1; 0 when S3 says there is no manifest; -1 when
 * it cannot be read (S3 unreachable, or not JSON). Blocking. */
int session_pause_manifest_host(const struct s3_config *c, const char *customer, const char *id, char host[65]);
/* Delete a paused session's objects in S3: the chunks its manifest names,
 * the manifest, and version 1's fixed names (session_pause.c). dir: a
 * directory for the manifest meanwhile. Missing objects are fine. */
/* The pause-cache id of a snapshot's copies ("snapshot.<id>": a session id
 * of the same name would only miss, its key being another). */
void session_snapshot_cache_id(char *out, size_t cap, const char *snapshot_id);
void session_pause_delete_s3(const struct s3_config *c, const char *dir, const char *customer, const char *id);

/* Delete everything under prefix, the manifest mkey first (what: for the
 * log). The number of objects deleted (session_s3.c). */
int session_s3_delete_prefix(const struct s3_config *c, const char *prefix, const char *mkey, const char *what);

/* Volumes (session_volume.c) --------------------------------------------- */

/* s->vols from s->spec's "volumes". 0, or -1 with err (invalid_spec). */
int session_vols_parse(struct session *s, struct kiln_err *err);
/* 1 when the session has a read-write volume. */
int session_vols_rw(const struct session *s);
/* Fill the session's slots (<dir>/vol<N>.img, the files its QEMU holds
 * open) from S3, or make new volumes, before the guest runs; each slot's
 * record (vol<N>.json) after it. 0, or -1 with err. */
int session_vols_fill(struct session_table *ss, struct session *s, struct kiln_err *err);
/* Mount each volume in the guest (as its root; a new session's). */
int session_vols_mount(struct session_table *ss, struct session *s, struct kiln_err *err);
/* `sync` as the guest's root (before a destroy's upload). */
int session_vols_sync_guest(struct session_table *ss, struct session *s, struct kiln_err *err);
/* Upload each read-write volume's slot as the volume's new version (the
 * VM stopped or gone: QEMU flushed it); why: for the log; *bytes (may be
 * NULL) += bytes sent. 0, or -1 with err naming the volume. */
int session_vols_save(struct session_table *ss, struct session *s, const struct s3_config *c, const char *why,
		      uint64_t *bytes, struct kiln_err *err);
/* A destroy's first step (s->op held): with read-write volumes, `sync` in
 * the guest (if it runs), stop the VM, upload them. 0 (also: nothing to
 * do), or -1 with err (s3_unavailable, busy...): the VM goes on and the
 * session must stay. */
int session_vols_keep(struct session_table *ss, struct session *s, struct kiln_err *err);
/* session_teardown's: the VM is gone; unless the volumes were kept
 * already (vols_done), upload the read-write ones as the slots hold them
 * (best effort, logged). */
void session_vols_teardown(struct session_table *ss, struct session *s);
/* sessions_open, before it removes what an earlier kiln-host left: every
 * read-write volume slot with a record goes to S3. */
void sessions_vols_recover(struct session_table *ss);

/* The base ahead of the first pause (session_base_prep.c) ---------------- */

/* snap is ready for sessions here: unless it was done (or is under way, or
 * failed less than BASE_BOOK_RETRY_MS ago), hash its RAM and put its base
 * in S3 on a worker thread (one at a time, at low priority), so that its
 * first pause finds it there. Does nothing without S3 or with
 * prepare_base off. Never blocks on I/O; any thread; snap must stay valid
 * for the call only (its RAM fd is duplicated). */
void session_base_prep_want(struct session_table *ss, const struct snapshot *snap);
/* Stop preparing (sessions_close): waits up to BASE_PREP_STOP_MS for a
 * preparation under way, then leaves it to end with the process. */
#define BASE_PREP_STOP_MS 2000
void session_base_prep_stop(struct session_table *ss);

/* ---- pause and resume (session_pause.c, session_resume.c, session_s3.c) ---- */

#define SESSION_SAVE_MS    300000 /* pausing a VM into its file */
#define SESSION_MANIFEST_V 1
#define PAUSE_WORKERS      4  /* parallel chunk uploads and downloads */

struct pmanifest;
struct pchunk_list;

ssize_t session_get_small(const struct s3_config *c, const char *key, char **out, struct kiln_err *err);
struct pmanifest *session_get_manifest(const struct s3_config *c, const char *customer, const char *id,
				      struct kiln_err *err);
/* Make sure the base RAM (fd, size, sha; of the snapshot template_key) is
 * in S3 under PBASE_DIR "<sha>/" before a manifest names it: a HEAD of the
 * base's manifest (one round trip per pause: unlike a local marker it stays
 * true when someone empties the bucket); when missing, under bk's lock for
 * sha (one upload of a base at a time in this process: whoever waited
 * looks again), its chunks (zstd) then its manifest. ahead: the
 * preparation ahead of a pause (session_base_prep.c), which gives up once
 * bk is stopping and logs for itself. 1: uploaded (*uploaded += the
 * compressed bytes sent); 0: it was there; -1 with err. Blocking; any
 * thread. */
int session_base_ensure(struct base_book *bk, const struct s3_config *c, int fd, uint64_t size, const char *sha,
			const char *template_key, int ahead, uint64_t *uploaded, struct kiln_err *err);
int session_base_fetch(const struct s3_config *c, const char *sha, uint64_t size, struct kiln_err *err);
void session_delete_old(struct session_table *ss, struct pmanifest *old);
uint64_t session_zbytes(const struct pchunk_list *l);

#endif
