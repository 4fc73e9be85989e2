/* sessions_int.h: what api/sessions/sessions.c (the endpoints), session_core.c
 * (struct sessions, requests in flight, pause and destroy),
 * session_place.c (placing a create or resume on a host, with retries),
 * session_snapshots.c, session_volumes.c and session_reap.c (the reaper)
 * share. Not for other modules; unit tests
 * include it to drive placement and the reaper's decisions by hand. */
#ifndef KILN_API_SESSIONS_INT_H
#define KILN_API_SESSIONS_INT_H

#include <pthread.h>
#include <stdint.h>

#include "base/base.h"
#include "clock.h"
#include "hostcall/host_ops.h"
#include "sessions.h"

#define REAP_TICK_MS 500
#define RECONCILE_EVERY_MS 10000
#define KEEPALIVE_MS 15000
#define MAX_ATTEMPTS 4              /* hosts tried for one create or resume */
/* A create or resume that finds no host with room waits this long for
 * one: sessions go idle (and stop counting against a host's active vCPUs)
 * ~2 s after their last request, and the next heartbeat says so. */
#define PLACE_WAIT_MS 4000
#define CREATE_TIMEOUT_MS 120000
#define SNAPSHOT_TIMEOUT_MS 900000  /* pause and resume move the VM's memory and disk through S3 */
#define FILES_TIMEOUT_MS 300000
#define INPUT_TIMEOUT_MS 10000 /* the host only queues input */
#define SHORT_TIMEOUT_MS 10000
#define EXEC_MARGIN_MS 60000        /* beyond the exec's own timeout */
#define HOST_REPLY_MAX (128u << 20) /* a file or an exec result with its output */
#define RETRY_AFTER_S "5"
#define MAX_HOLDING 4096
#define MAX_ENDERS 16               /* reaper threads pausing/destroying at once */
/* Leases (session_core.c): renewed this often while held; one lapses this
 * long after its last write, so a killed replica's leftovers are settled
 * that long after it died (its renewals, on a thread of their own, would
 * have to stall several periods in a row for a live one's to lapse). */
#define LEASE_RENEW_MS 1000
#define LEASE_TTL_MS 5000
#define LEASE_GC_EVERY_MS 60000     /* lapsed rows (a killed replica's) removed this often */
#define LEASE_GC_AFTER_MS 60000     /* once lapsed this long */

/* A session with requests (or a reaper action) in flight in this process
 * (and, while n > 0, its lease in the store). */
struct op {
	char id[40];
	unsigned n;                  /* requests (and reaper actions) in flight */
	int ending;                  /* one of them is the reaper ending it */
	struct op *next;
};

struct sessions {
	const struct api_config *cfg;
	struct store *st;
	struct sched *sched;
	const struct host_ops *host; /* how hosts are called */
	const struct kiln_clock *clock;
	char *token;
	pthread_t reaper;
	int reaping;                 /* the reaper thread runs (sessions_start) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stopping;
	unsigned enders;             /* detached threads ending sessions */
	unsigned users;              /* HTTP requests and event-stream relays using ss */
	struct op *inflight;         /* sessions with a request in flight here */
	/* Leases: every change of an op's count is written to the store under
	 * lease_lock (taken before lock, never the other way round). */
	pthread_mutex_t lease_lock;
	char owner[96];              /* this process's lease owner id (host/pid/random) */
	int64_t lease_ttl_ms;        /* LEASE_TTL_MS; unit tests shorten it */
	int lease_resync;            /* a lease write failed: the renewer rewrites them all (lock) */
	pthread_t renewer;
	int renewing;                /* the renewer thread runs (sessions_start) */
	int64_t store_down_ms;       /* the reaper last found the store unreachable (monotonic; 0 never) */
	unsigned char e2b_key[32];   /* E2B envd tokens are HMAC-SHA256(e2b_key, session id) */
};

/* ---- session_core.c ---- */

/* sessions_start without the reaper thread (unit tests drive
 * sessions_reap_once by hand). sessions_stop frees it. */
struct sessions *sessions_create(const struct api_config *cfg, struct store *st, struct sched *sched,
				 const struct host_ops *host, const struct kiln_clock *clock, struct kiln_err *err);

/* Requests in flight (any thread): enter/leave count one for session id
 * and write this process's lease on it to the store (every replica's
 * reaper leaves a leased session alone); the _touch pair also marks the
 * session active (last_active_ms) in the same write; the _ending pair
 * marks the reaper's end of it (enter returns 0, and enters nothing, when
 * one is under way); busy: anything in flight in this process (the store's
 * store_session.leased says it for every replica). Blocking (a store
 * write). */
void sessions_op_enter(struct sessions *ss, const char *id);
void sessions_op_leave(struct sessions *ss, const char *id);
void sessions_op_enter_touch(struct sessions *ss, const char *id);
void sessions_op_leave_touch(struct sessions *ss, const char *id);
int sessions_op_enter_ending(struct sessions *ss, const char *id);
void sessions_op_leave_ending(struct sessions *ss, const char *id);
int sessions_op_busy(struct sessions *ss, const char *id);

/* store_session_create with this process's lease on the new session taken
 * in the same transaction and one request entered (the caller leaves it
 * with sessions_op_leave): no replica's reaper can take the new session
 * in starting for a leftover. n's lease fields are set here. Blocking. */
int sessions_op_create(struct sessions *ss, struct store_session_new *n, char id[40], struct kiln_err *err);

/* One pass of the lease renewer (its thread runs it every LEASE_RENEW_MS;
 * unit tests call it by hand): this process's leases renewed, or all
 * rewritten when a write failed or one went missing. */
void sessions_leases_renew(struct sessions *ss);


/* ss->host's call and raw, with the cluster token. */
int sessions_host_call(struct sessions *ss, const char *url, const char *method, const char *path, json_t *body,
		       long timeout_ms, json_t **reply, struct kiln_err *err);
int sessions_host_raw(struct sessions *ss, const char *url, const char *method, const char *path, const void *body,
		      size_t len, const char *content_type, long timeout_ms, size_t max_reply,
		      struct hostclient_reply *r, struct kiln_err *err);

/* A host's JSON error's code / message, into buf ("" when it has none). */
const char *sessions_host_error_code(const struct hostclient_reply *r, char *buf, size_t cap);
const char *sessions_host_error_message(const struct hostclient_reply *r, char *buf, size_t cap);

/* Whether the host confirms it has no such session (GET answered 404). */
int sessions_host_lacks(struct sessions *ss, const char *url, const char *id);

/* The session's VM is gone from its host: from `from` to error/vm_lost. */
void sessions_vm_lost(struct sessions *ss, const char *id, enum session_state from);

/* Outcome of pausing or destroying, as an HTTP answer would say it. */
struct sessions_outcome {
	unsigned status;
	struct kiln_err err;
};

/* Pause a running session (running -> pausing -> paused, end_reason
 * reason); destroy one in any state but a transient one. Blocking (a pause
 * moves the VM through S3); any thread. */
void sessions_pause(struct sessions *ss, const char *id, const char *reason, struct sessions_outcome *o);
void sessions_destroy(struct sessions *ss, const char *id, const char *reason, struct sessions_outcome *o);
/* A deleted snapshot (store.h "Snapshots") whose last session (any state
 * but destroyed) is gone: its objects are deleted (DELETE
 * /v1/snapshots/ID?customer= on the host it was taken on when live, else
 * any live host), then its row. 1 done, 0 not deleted or still used, -1
 * failed (no live host, the host refused, the store: the reaper retries).
 * Blocking (one host call); any thread. */
int sessions_snapshot_release(struct sessions *ss, const char *id);
/* A session paused on host_id resumed on another host: ask host_id (when
 * live) to remove its pause-cache copies of the session's memory. Best
 * effort, logged; blocking (one short host call). */
void sessions_pcache_cleanup(struct sessions *ss, const char *host_id, const char *id, const char *customer);

/* A session's E2B envd access token (docs/e2b.md): 64 hex digits, HMAC-SHA256
 * of its id under ss->e2b_key (derived from the cluster token, else random
 * per process), so that GET and connect can return it while the store keeps
 * only its SHA-256. */
void sessions_e2b_token(struct sessions *ss, const char *id, char hex[65]);
/* A private sandbox's trafficAccessToken (its ports' e2b-traffic-access-token):
 * HMAC-SHA256(e2b_key, "traffic:" + id), hex. */
void sessions_traffic_token(struct sessions *ss, const char *id, char hex[65]);

/* ---- session_reply.c: the endpoints' answers ---- */

/* e with status (0: the table's), and an optional header (hname NULL:
 * none); E2B's {"code","message"} when r->e2b. */
enum MHD_Result sessions_answer_err(const struct sessions_request *r, unsigned status, const struct kiln_err *e,
				    const char *hname, const char *hvalue);

/* sessions_answer_err with an error of code and msg. */
enum MHD_Result sessions_answer(const struct sessions_request *r, unsigned status, enum kiln_errc code,
				const char *msg, const char *hname, const char *hvalue);

/* Pass a host's answer r on as it is (its status, bytes and content type;
 * an error that is not kiln-host's JSON error gets one; for E2B, E2B's
 * shape with the host's message). */
enum MHD_Result sessions_relay_to(const struct sessions_request *rq, struct MHD_Connection *conn,
				  struct hostclient_reply *r);

/* sessions_relay_to for kiln's own endpoints. */
enum MHD_Result sessions_relay(struct MHD_Connection *conn, struct hostclient_reply *r);

/* 503 with Retry-After: the session's host cannot be reached now (why). */
enum MHD_Result sessions_host_unavailable(struct MHD_Connection *conn, const char *why);

/* ---- session_network.c: egress rules changed while a session runs ---- */

/* Check network, a session spec's "network" object ("egress" absent is
 * "allow", set in it), as create checks it: the spec's rules and errors
 * (invalid_spec), egress "allow" required (a session with a network device
 * keeps it). 0 or -1 with err. */
int sessions_network_check(json_t *network, struct kiln_err *err);

/* Apply network (checked) to the running session cur through its host,
 * then store it in the session's spec (which every resume sends): 1, and
 * the caller answers; 0 with *ret answered (r->e2b: E2B's shape), in this
 * order: not_running, no_network (created without egress),
 * egress_not_allowed (the customer's allow_egress), host_unavailable, the
 * host's refusal as it came, store_error. Blocking. */
int sessions_network_run(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
			 json_t *network, enum MHD_Result *ret);

/* ---- session_run.c: create and resume, shared with the E2B API (e2b.c) ---- */

/* What an E2B create adds to a session. */
struct sessions_e2b_new {
	const char *template;        /* E2B's templateID as given ("base") */
	const char *env_json;        /* envVars (compact JSON) or NULL */
	int auto_pause;              /* -1 the customer's rule, 0, 1 */
	unsigned flags;              /* STORE_E2B_PRIVATE, STORE_E2B_AUTO_RESUME */
};

/* Create a session of r->customer from a parsed request (its quota q): the
 * quota checks, rate, placement and retries of POST /v1/sessions. Returns 1
 * with id filled (running; nothing answered: the caller answers), or 0 with
 * the error answered (*ret; E2B's shape when r->e2b). e2b (may be NULL)
 * stores E2B's fields and the token's hash before any host runs it. Blocking. */
int sessions_create_run(struct sessions *ss, const struct sessions_request *r, const struct quota *q,
			const struct api_session_request *sr, const struct sessions_e2b_new *e2b, char id[40],
			enum MHD_Result *ret);

/* Resume cur (paused, or error with a snapshot) on any host with room: 1
 * resumed (nothing answered), 0 answered (*ret). Blocking. */
int sessions_resume_run(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
			enum MHD_Result *ret);

/* ---- session_snapshots.c: named snapshots and forks ---- */

#define SESSIONS_FORK_MAX 20        /* children of one fork */
#define SNAPSHOT_GC_EVERY_MS 60000  /* the reaper retries deleted snapshots' objects this often */

/* Take a snapshot of the running session cur (fork: a fork's hidden one,
 * outside the snapshot quotas; else a named one, name may be NULL): its
 * host saves it to S3 (POST /v1/sessions/{id}/checkpoint), then the row
 * goes in under the customer's max_snapshots and max_snapshot_mib. 1 with
 * id (40 bytes) and *stop_ms (how long the VM was stopped); 0 with the
 * error answered (*ret; r->e2b, r->capture as sessions_answer does), in
 * this order: not_running (409), host_unavailable (503), quota_exceeded
 * (429, max_snapshots before the host is asked), the host's refusal as it
 * came (vm_lost: 409 not_running), quota_exceeded (max_snapshot_mib, once
 * the bytes are known), store_error. Nothing is recorded on failure, and
 * what the host may have written is deleted. Blocking. */
int sessions_snapshot_take(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
			   const char *name, int fork, char id[40], int64_t *stop_ms, enum MHD_Result *ret);

/* Fork cur into count sessions: its snapshot (sessions_snapshot_take with
 * fork), then count creates from it with child (its snapshot field set
 * here), each admitted as any create (e2b: an E2B create's fields, may be
 * NULL); the ids of those that run go into ids, each refusal into errors
 * ({"status","code","message"}); then the snapshot is deleted (its
 * objects once the last child is destroyed). 1 (the caller answers), or 0
 * with the snapshot's error answered (*ret). Blocking. */
int sessions_fork_run(struct sessions *ss, const struct sessions_request *r, const struct store_session *cur,
		      unsigned count, struct api_session_request *child, const struct sessions_e2b_new *e2b,
		      json_t *ids, json_t *errors, int64_t *stop_ms, enum MHD_Result *ret);

/* Delete the customer's (NULL: any) snapshot id: marked at once (gone for
 * the customer, out of its quota), its objects as sessions_snapshot_release
 * says. 1 deleted, 0 no such snapshot, -1 store error. Blocking. */
int sessions_snapshot_delete(struct sessions *ss, const char *id, const char *customer);

/* Whether name is a snapshot name: 1-63 characters of A-Z, a-z, 0-9 and
 * "._-:/", starting with a letter or digit. */
int sessions_snapshot_name_ok(const char *name);

/* POST /v1/sessions/{id}/snapshots and /fork (sessions.c routes them). */
enum MHD_Result sessions_rt_snapshot(struct sessions *ss, const struct sessions_request *r,
				     const struct store_session *cur);
enum MHD_Result sessions_rt_fork(struct sessions *ss, const struct sessions_request *r,
				 const struct store_session *cur);

/* The reaper's pass over deleted snapshots whose objects are still there
 * (a host was unreachable, or the last session ended elsewhere). */
void sessions_snapshots_gc(struct sessions *ss);

/* ---- session_volumes.c: volumes (docs/api.md "Volumes") ---- */

#define SESSIONS_VOLUME_MIB_DEFAULT 1024
#define SESSIONS_VOLUME_MIB_MIN 16         /* kiln-host's VOL_SIZE_MIB_MIN: ext4 with a journal */
#define SESSIONS_VOLUME_MIB_MAX 65536      /* kiln-host's slot: VM_VOL_SLOT_BYTES */

/* Create r->customer's volume name of size_mib: the name's form, the size
 * (16-65536: 400 invalid_request; over max_volume_mib: 400 over_quota),
 * a name taken (409 conflict), max_volumes (429 quota_exceeded). 1 with
 * *out, or 0 with the error answered (*ret; r->e2b: E2B's shape).
 * Blocking (the store). */
int sessions_volume_create(struct sessions *ss, const struct sessions_request *r, const char *name, long size_mib,
			   struct store_volume *out, enum MHD_Result *ret);

/* Delete r->customer's volume v: no live host 503 host_unavailable (nothing
 * changes); marked deleted unless a session that is not destroyed mounts
 * it (409 volume_busy); then a live host deletes its objects (DELETE
 * /v1/volumes/{id}?customer=), and when it cannot the mark is undone
 * (503 host_unavailable). 1 deleted, 0 answered (*ret). Blocking. */
int sessions_volume_delete(struct sessions *ss, const struct sessions_request *r, const struct store_volume *v,
			   enum MHD_Result *ret);

/* The data bytes of v's latest version in S3 as a live host reads them
 * from its manifest (GET /v1/volumes/{id}?customer=): an integer, or null
 * (no host live, never written, an error). New reference. Blocking. */
json_t *sessions_volume_bytes(struct sessions *ss, const struct store_volume *v);

/* ---- session_place.c ---- */

struct sessions_placement {
	char host[65];               /* in: the host sched_place picked first; out: the one that took it or refused */
	char url[256];
	struct hostclient_reply hr;  /* a refusing host's answer (caller frees with hostclient_reply_free) */
	char last[300];              /* why the last host did not take it ("" none tried after the first) */
};

/* POST body (JSON text) to path on p->host, then, while hosts are full (503,
 * which also marks the host full), already have the id (409) or cannot be
 * reached, on the next host sched_place picks for need (hosts tried before
 * excluded), MAX_ATTEMPTS hosts in all; each failed host's placement is
 * undone. Returns 1 taken (200/201) by p->host (still counted as placed
 * there); 0 refused outright by p->host (p->hr holds its answer, its status
 * in p->hr.status); -1 no host took it (p->last says why). The one retry
 * loop of create and resume. Blocking; any thread. */
int sessions_place_run(struct sessions *ss, const struct sched_need *need, const char *path, const char *body,
		       long timeout_ms, struct sessions_placement *p);

/* ---- session_reap.c ---- */

/* What the reaper does with one session that holds a VM. */
enum sessions_reap_action {
	REAP_KEEP,                   /* nothing now */
	REAP_SETTLE,                 /* a transient state no request (lease) is behind (a killed kiln-api's): ask its host */
	REAP_HOST_LOST,              /* running on a lost host: error/host_lost */
	REAP_MAX_LIFETIME,           /* past its lifetime: end it (pause or destroy) */
	REAP_IDLE_TIMEOUT,           /* idle too long: end it */
};

/* The reaper's decision for c (a session holding a VM), from its record,
 * its host's state (sched_host_state: 1 live, 0 lost, -1 unknown or no
 * host), whether a request is in flight for it (busy: a lease of any
 * replica, or one here), and the wall clock.
 * Pure. */
enum sessions_reap_action sessions_reap_decide(const struct store_session *c, int host_state, int busy,
					       int64_t now_ms);

/* After an automatic pause that did not succeed (o): 1 destroy the session
 * instead (the host failed: it would run past its limit), 0 leave it for
 * the next tick (busy, host unavailable, gone, not running). Pure. */
int sessions_reap_destroy_after_pause(const struct sessions_outcome *o);

/* A session a live host runs: 1 the store wants it gone from that host
 * (known 0: the store has no such session); *keep_snapshot: its snapshot in
 * S3 must stay (paused, resumable or running elsewhere). Pure. */
int sessions_reap_stale(int known, const struct store_session *cur, const char *host, int *keep_snapshot);

/* One pass of the reaper (its thread calls it every REAP_TICK_MS; with
 * reconcile, the live hosts' session lists are compared with the store
 * too). Ends are started on threads of their own. */
void sessions_reap_once(struct sessions *ss, int reconcile);

/* The reaper thread (sessions_start, in session_reap.c with it). */
void *sessions_reaper_main(void *arg);

/* The lease renewer thread (sessions_start; session_core.c): this
 * process's leases renewed every LEASE_RENEW_MS, now and then a killed
 * replica's lapsed rows removed. */
void *sessions_renewer_main(void *arg);

#endif
