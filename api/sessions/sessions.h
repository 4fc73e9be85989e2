/* sessions: kiln-api's sessions, long-lived sandboxes on one kiln-host each
 * (docs/api.md, "Sessions"): the /v1/sessions endpoints (sessions.c), which
 * check quotas, place a session on a host with the scheduler's rules
 * (session_place.c), keep its row in the store and proxy exec, files, pause,
 * resume and outputs to its host, and take named snapshots and forks
 * (session_snapshots.c, with /v1/snapshots), and keep the customer's volumes
 * (session_volumes.c, /v1/volumes); and the reaper thread (session_reap.c),
 * which ends sessions past their idle or lifetime
 * limit (pausing them when the customer's session_auto_pause says so, else
 * destroying them), settles sessions whose host is lost (error/host_lost),
 * finishes what a killed kiln-api left half-done, and destroys sessions a
 * host still runs that the store has settled otherwise.
 *
 * Room: the sessions room's door (api/sessions/: kiln's sessions API and
 * its E2B-compatible face, e2b.c, e2b_relay.c and e2b_request.c, which
 * drive the same sessions through sessions_int.h). It may call the
 * templates, scheduler, base, hostcall and store rooms and lib/;
 * sessions_int.h is the room's own. */
#ifndef KILN_API_SESSIONS_H
#define KILN_API_SESSIONS_H

#include <stddef.h>

#include <microhttpd.h>

#include "base/base.h"
#include "clock.h"
#include "err.h"
#include "hostcall/host_ops.h"
#include "scheduler/scheduler.h"
#include "store/store.h"

struct sessions;

/* Start the reaper. cfg, st, sched, host and clock stay owned by the
 * caller and must outlive the sessions (sessions_stop first); hosts are
 * called through host (production: &host_ops_hostclient) and time is read
 * from clock (production: &clock_system; NULL means the real clocks too).
 * NULL with err set. */
struct sessions *sessions_start(const struct api_config *cfg, struct store *st, struct sched *sched,
				const struct host_ops *host, const struct kiln_clock *clock, struct kiln_err *err);

/* Stop the reaper, wait a moment (2 s) for the ends it started and the
 * requests held, then free: 0. -1 when some still run: ss is left to them
 * (and the caller should exit without freeing what they use). */
int sessions_stop(struct sessions *ss);

/* An error a request would have answered, kept instead (a fork's
 * children: each refusal is one entry of the fork's answer). */
struct sessions_capture {
	unsigned status;             /* 0: nothing captured */
	struct kiln_err err;
};

/* One authenticated request under /v1/sessions, with its whole body. */
struct sessions_request {
	struct MHD_Connection *conn;
	const char *method;
	const char *path;            /* after "/v1/sessions": "", "/ID", "/ID/exec", ... */
	const char *body;            /* may be NULL */
	size_t len;
	const char *customer;        /* the caller's customer; "" for an admin key */
	int admin;
	struct quota_limiter *lim;   /* the submit-rate buckets (create and resume take a token) */
	int e2b;                     /* an /e2b request (e2b.c): errors in E2B's shape */
	struct sessions_capture *capture; /* non-NULL: errors go there, nothing is answered */
};

/* Count one request about to be handled, under the lock that guards the
 * caller's pointer to ss, so that sessions_stop (called once that pointer is
 * cleared) waits for it. sessions_handle releases it. */
void sessions_hold(struct sessions *ss);

/* Answer a request held with sessions_hold (queues the response on
 * r->conn). Called from libmicrohttpd's connection threads; may block for as
 * long as the host takes (an exec). */
enum MHD_Result sessions_handle(struct sessions *ss, const struct sessions_request *r);

/* Answer a request under /v1/snapshots (r->path: what follows
 * "/v1/snapshots") held with sessions_hold, which this releases
 * (session_snapshots.c). */
enum MHD_Result sessions_snapshots_handle(struct sessions *ss, const struct sessions_request *r);

/* Answer a request under /v1/volumes (r->path: what follows "/v1/volumes")
 * held with sessions_hold, which this releases (session_volumes.c). */
enum MHD_Result sessions_volumes_handle(struct sessions *ss, const struct sessions_request *r);

/* The end of a sessions_hold (sessions_handle and e2b_handle release it
 * themselves; the ports room calls this). */
void sessions_release(struct sessions *ss);

/* ---- port traffic (api/ports: session_ports.c) ---- */

struct sessions_port_target {
	struct store_session row;
	char host_url[256];          /* the live host the session runs on */
	const char *token;           /* the cluster token the host wants (ss's) */
};

/* Whether a connection to one of session id's ports may go, and where: the
 * session must be the customer's (NULL: any customer's; public_only: then
 * only a sandbox made through /e2b, whose ports are public as E2B's are,
 * unless it was made with allowPublicTraffic false: then traffic_token
 * must be its trafficAccessToken), running, on a live host. 0 with *t
 * filled (t->row even on failure, when the row was read); -1 with err:
 * not_found (for every session the caller may not see), forbidden (no or a
 * wrong traffic token), not_running (409: paused, starting, in error),
 * host_unavailable. Blocking (a store read). */
int sessions_port_target(struct sessions *ss, const char *id, const char *customer, int public_only,
			 const char *traffic_token, struct sessions_port_target *t, struct kiln_err *err);
/* A paused sandbox made with E2B's autoResume, resumed for a port request
 * (as connect would, on any host with room): 1 resumed; 0 with the refusal
 * answered on conn (*ret). Blocking. */
int sessions_port_resume(struct sessions *ss, struct MHD_Connection *conn, struct quota_limiter *lim,
			 const struct store_session *cur, enum MHD_Result *ret);
/* A port connection opened / ended: the session is busy meanwhile (the
 * reaper does not end it for idleness) and active at both ends. */
void sessions_port_enter(struct sessions *ss, const char *id);
void sessions_port_leave(struct sessions *ss, const char *id);

/* The rest of the door. */
#include "e2b.h"

#endif
