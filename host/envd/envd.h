/* envd: kiln-host's end of one session VM's `kiln.envd` port (lib/eproto.h,
 * docs/e2b.md "Guest: envd"). One I/O thread per channel reads every frame
 * the guest sends and writes what callers queued; callers (HTTP connection
 * threads, envd_http.c) run requests over it concurrently: unary ones
 * (STAT, LIST, ...) whose replies are queued per request id, file reads
 * (DATA under the guest's window, acknowledged as the caller takes it),
 * file writes, and process output streams (per guest pid, fanned out to
 * every subscriber, acknowledged once the slowest subscriber took it; with
 * no subscriber, output is dropped and acknowledged at once).
 *
 * Lifetime: envd_open when a session first needs it (it says HELLO and
 * waits for the guest's answer before the first request goes out);
 * envd_kill when the VM goes (pause, destroy): every pending request and
 * stream fails with CONNECT_UNAVAILABLE; the last envd_unref frees it. A
 * HELLO the guest sends on its own (its envd restarted) fails what is
 * pending the same way. Thread-safe.
 *
 * Room: the envd room's one header (host/envd/: the host end of a
 * session VM's envd channel). It may call lib/ only. */
#ifndef KILN_ENVD_H
#define KILN_ENVD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "connectrpc.h"
#include "eproto.h"

/* How long a request waits for the guest's HELLO before it is unavailable. */
#define ENVD_HELLO_MS 5000

struct envd;

/* A channel over a copy of fd (the VM's envd socketpair end; fd itself stays
 * the caller's). name is for log lines. NULL on ENOMEM or when the thread
 * cannot start. */
struct envd *envd_open(int fd, const char *name);
/* The VM is going: fail everything pending with `why` (CONNECT_UNAVAILABLE),
 * stop the I/O thread and close the copy. Idempotent. */
void envd_kill(struct envd *e, const char *why);
void envd_ref(struct envd *e);
void envd_unref(struct envd *e);
/* Wait until the caller's is the only reference left (every stream over
 * e has ended), at most until deadline_ms (monotonic). */
void envd_wait_idle(struct envd *e, int64_t deadline_ms);
/* 1 until envd_kill. */
int envd_alive(struct envd *e);
/* References held now: the owner's plus one per request or stream in
 * flight (a session is idle only with just its own). */
int envd_refs(struct envd *e);

/* An error a request ended with: a Connect code and a message. */
struct envd_err {
	enum connect_code code;
	int errnum;    /* the guest's negative errno, 0 when it is not the guest's */
	char msg[PROTO_MAX_MSG + 64];
};

/* ---- requests --------------------------------------------------------- */

struct envd_req;

/* A reply frame handed to the caller; payload valid until the next call on
 * the request. */
struct envd_reply {
	uint8_t type;          /* EP_ENTRY, EP_PROC, EP_DATA, EP_DONE, EP_STARTED */
	const uint8_t *payload;
	size_t len;
};

/* Begin a request of `type` whose payload (with the request id at its start
 * left for this call to fill: the first 4 bytes are overwritten) is p/len.
 * Waits for the channel's HELLO (at most until deadline_ms, monotonic).
 * NULL with err set (unavailable). */
struct envd_req *envd_req_begin(struct envd *e, uint8_t type, uint8_t *p, size_t len, int64_t deadline_ms,
				struct envd_err *err);
uint32_t envd_req_id(const struct envd_req *r);
/* The next reply of r: 1 with *out set, 0 when the request ended (DONE or
 * ENTRY/STARTED as its last reply: see envd_req_next's callers), -1 with err
 * set (the guest's ERROR, the channel died, or deadline_ms passed:
 * deadline_exceeded). A DONE is returned as a reply too, after which the
 * request has ended. */
int envd_req_next(struct envd_req *r, struct envd_reply *out, int64_t deadline_ms, struct envd_err *err);
/* Acknowledge n DATA bytes of a READ taken by the caller. */
void envd_req_ack(struct envd_req *r, size_t n);
/* Send more frames of the same request (WDATA, WEND): the 4-byte id at p's
 * start is filled in. Waits while the channel's send queue is full, until
 * deadline_ms. 0 or -1 with err (an ERROR the guest already sent for this
 * request is returned here). */
int envd_req_send(struct envd_req *r, uint8_t type, uint8_t *p, size_t len, int64_t deadline_ms, struct envd_err *err);
/* Done with r; a READ or WRITE that has not ended is CANCELled. */
void envd_req_free(struct envd_req *r);

/* A frame with no reply (INPUT, CLOSE_STDIN, SIGNAL, RESIZE): queued.
 * 0 or -1 with err (unavailable). Waits for HELLO as envd_req_begin. */
int envd_send(struct envd *e, uint8_t type, const void *p, size_t len, int64_t deadline_ms, struct envd_err *err);

/* ---- process output ---------------------------------------------------- */

struct envd_sub;

/* What envd_sub_next hands out. */
enum envd_ev { ENVD_EV_NONE, ENVD_EV_DATA, ENVD_EV_END, ENVD_EV_ERROR };

struct envd_event {
	enum envd_ev kind;
	uint8_t stream;        /* DATA: EP_STDOUT, EP_STDERR, EP_PTY */
	const uint8_t *data;   /* DATA: valid until the next call */
	size_t len;
	uint8_t how;           /* END: PROTO_EXITED / PROTO_SIGNALED */
	uint32_t status;       /* END: exit status or signal */
	struct envd_err err;   /* ERROR */
};

/* START: req carries the encoded struct eproto_start (id filled in). On
 * STARTED, a subscriber is attached to the new pid before any of its
 * output is taken in; *sub gets it and *pid the pid. -1 with err (the
 * guest's ERROR, unavailable, deadline). */
int envd_start(struct envd *e, uint8_t *p, size_t len, int64_t deadline_ms, struct envd_sub **sub, uint32_t *pid,
	       struct envd_err *err);
/* Subscribe to pid's output from now on (Connect). The caller checks the
 * pid exists (LIST) after subscribing: an END that came before is not
 * seen. NULL with err. */
struct envd_sub *envd_subscribe(struct envd *e, uint32_t pid, struct envd_err *err);
/* The next event, waiting until deadline_ms: ENVD_EV_NONE when it passed. */
void envd_sub_next(struct envd_sub *s, struct envd_event *ev, int64_t deadline_ms);
/* Stop: what it did not take is acknowledged for it. */
void envd_sub_free(struct envd_sub *s);

/* ---- port connections --------------------------------------------------- */

/* A TCP connection to a port a process listens on inside the guest,
 * carried over the channel (the guest has no network interface for it).
 * Nothing here blocks but envd_port_open: a caller polls envd_port_fd
 * (readable after any change: data, room to send, an end) beside its own
 * socket, calls envd_port_clear, then reads and writes until -EAGAIN. An
 * open connection holds a reference on the channel (the session is busy). */
struct envd_port;

/* Connect to port (1-65535) on the guest's loopback; waits for the answer
 * until deadline_ms. NULL with err: unavailable with errnum -ECONNREFUSED
 * (nothing listens), resource_exhausted (-EMFILE: too many connections),
 * failed_precondition (the image predates ports), deadline_exceeded. */
struct envd_port *envd_port_open(struct envd *e, unsigned port, int64_t deadline_ms, struct envd_err *err);
int envd_port_fd(const struct envd_port *c);
void envd_port_clear(struct envd_port *c);
/* Bytes the server sent (> 0; each read is acknowledged to the guest), 0
 * when it sends no more (its half close, or a clean end), -EAGAIN when
 * nothing is there yet, or the negative errno it ended with (-ECONNRESET:
 * the channel died, -ENOBUFS: the guest broke its window). */
ssize_t envd_port_read(struct envd_port *c, void *buf, size_t cap);
/* Send up to n bytes (at most one chunk, within the window): the count
 * taken, -EAGAIN when the window or the channel's queue is full, -EPIPE when
 * the connection ended or was shut. */
ssize_t envd_port_write(struct envd_port *c, const void *p, size_t n);
/* Whether every byte sent was acknowledged (or the connection ended). */
int envd_port_idle(struct envd_port *c);
/* We send no more (the client's half close). */
void envd_port_shut(struct envd_port *c);
/* The connection ended and everything it received was read. */
int envd_port_done(struct envd_port *c);
/* Done: a connection that has not ended is reset. Frees c. */
void envd_port_close(struct envd_port *c);

/* The TCP ports listened on inside the guest, ascending (at most
 * EPROTO_MAX_PORTS). 0, or -1 with err. */
int envd_ports(struct envd *e, uint16_t *ports, uint32_t *n, int64_t deadline_ms, struct envd_err *err);

/* ---- directory watches ---------------------------------------------------- */

/* A watch of a directory inside the guest (E2B's WatchDir and its polling
 * watchers): the guest's inotify, made with the user's permissions; events
 * named relative to the directory. Bounds (docs/e2b.md "Watching
 * directories"): ENVD_MAX_WATCHES per channel, streams and watchers
 * together; each holds at most ENVD_WATCH_Q_EVENTS events and
 * ENVD_WATCH_Q_BYTES bytes of names not taken, past which it fails
 * (internal: "queue overflow"). */
#define ENVD_MAX_WATCHES 16
#define ENVD_WATCH_Q_EVENTS 4096u
#define ENVD_WATCH_Q_BYTES (1u << 20)
#define ENVD_WATCHER_ID 24 /* "w" and 16 hex digits, NUL-terminated */

struct envd_watch;

struct envd_wevent {
	uint8_t type; /* enum eproto_wevent */
	char name[PROTO_MAX_PATH + 1];
};

/* Watch directory path (absolute, or relative to the user's home) as user
 * ("" = the default), its subdirectories too when recursive (those made
 * later included). Waits for the guest's answer until deadline_ms. NULL with
 * err: not_found, invalid_argument (not a directory), permission_denied,
 * resource_exhausted (ENVD_MAX_WATCHES), unimplemented (the image predates
 * watching), unavailable, deadline_exceeded. The watch holds a reference on
 * the channel (the session is busy) until envd_watch_close. */
struct envd_watch *envd_watch_open(struct envd *e, const char *user, const char *path, int recursive,
				   int64_t deadline_ms, struct envd_err *err);
/* The next event: 1 with *ev, 0 when deadline_ms passed first, -1 with err
 * when the watch ended (an overflow, the guest ended it, the channel died);
 * events queued before the end are handed out first. */
int envd_watch_next(struct envd_watch *w, struct envd_wevent *ev, int64_t deadline_ms, struct envd_err *err);
/* Done: the guest is told to stop watching. Frees w. */
void envd_watch_close(struct envd_watch *w);

/* A polling watcher (CreateWatcher): as envd_watch_open, but kept on the
 * channel (without keeping the session busy) until envd_watcher_remove or
 * the channel's end; *id names it. 0 or -1 with err. */
int envd_watcher_create(struct envd *e, const char *user, const char *path, int recursive, int64_t deadline_ms,
			char id[ENVD_WATCHER_ID], struct envd_err *err);
/* Hands every event queued on watcher id to fn (called with the channel's
 * lock held: fn must not call into e) and forgets them. -1 with err:
 * not_found, or the error the watcher failed with. */
int envd_watcher_events(struct envd *e, const char *id, void (*fn)(void *arg, uint8_t type, const char *name),
			void *arg, struct envd_err *err);
/* 0, or -1 with err (not_found). */
int envd_watcher_remove(struct envd *e, const char *id, struct envd_err *err);
/* Watches on the channel now, those the guest has not yet confirmed closed
 * included. */
int envd_watch_count(struct envd *e);

#endif
