/* envd_int: what envd.c (channel, processes) and envd_fs.c (users, file
 * requests) share. Not for other modules. */
#ifndef KILN_GUEST_ENVD_INT_H
#define KILN_GUEST_ENVD_INT_H

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "envd.h"
#include "eproto.h"
#include "inq.h"
#include "proto.h"

/* Supplementary groups kept per user (more are ignored). */
#define ENVD_MAX_GROUPS 64
/* Send buffer: frames wait here until the channel takes them. Work that
 * makes a frame (a pipe read, a reply) waits until a whole frame fits. */
#define ENVD_TX_CAP (4 * PROTO_MAX_FRAME)
/* LISTDIR's deepest level (eproto: depth 1-16). */
#define ENVD_MAX_DEPTH 16
#define ENVD_LIST_MAX 100000 /* LISTDIR: names read from one directory; more are left out */

struct envd_user {
	char name[EPROTO_MAX_USER + 1];
	uid_t uid;
	gid_t gid;
	char home[PROTO_MAX_PATH + 1];
	char shell[256];
	int ngroups;
	gid_t groups[ENVD_MAX_GROUPS];
};

/* One process START began. Its slot is freed once its END has reached the
 * channel (a reconnection before that sends END again). */
struct envd_proc {
	pid_t pid;
	uint32_t flags;  /* START flags */
	int out, err;    /* our read ends, -1 at EOF (a pty: out is its master, err -1) */
	struct inq inq;  /* stdin: a pipe's write end or a dup of the master (fd -1: none), at most ENVD_STDIN_MAX waiting */
	uint64_t unacked; /* OUT bytes sent and not acknowledged */
	int exited;
	int wstatus;
	int64_t exit_ms;
	int draining;     /* the linger has passed: read only what was buffered */
	size_t drain_out, drain_err; /* bytes left to read then */
	int ended;        /* END is in the send buffer */
	uint64_t end_off; /* ... up to this stream offset */
	uint8_t *start;   /* the START payload, for LIST */
	size_t start_len;
};

enum envd_job_kind { ENVD_JOB_LIST = 1, ENVD_JOB_LISTDIR, ENVD_JOB_READ, ENVD_JOB_WRITE };

/* A request that outlives its frame. */
struct envd_job {
	enum envd_job_kind kind;
	uint32_t req;
	struct envd_user user;
	int fd;           /* READ: the file; WRITE: the temporary file (-1 after a failure) */
	uint64_t unacked; /* READ: DATA bytes not acknowledged */
	/* WRITE: dirfd of the target's directory, temporary and final names. */
	int dirfd;
	int created;                 /* WRITE: this write made the file (removed if it fails) */
	char name[256];
	/* LIST: the next process slot to look at. */
	int next;
	/* LISTDIR: open directories from the top (each with its names read
	 * and sorted, so entries go out in lexical order, depth first, as E2B's
	 * envd walks), and path lengths at each. */
	int depth_max, depth;
	struct envd_dirlevel {
		int fd;
		char **names;
		size_t n, next;
	} dirs[ENVD_MAX_DEPTH];
	size_t plen[ENVD_MAX_DEPTH];
	char path[PROTO_MAX_PATH + 1];
};

/* Names of uids and gids, looked up once per request. */
#define ENVD_NAME_CACHE 32
struct envd_name {
	int used, group;
	uint32_t id;
	char name[EPROTO_MAX_USER + 1];
};

/* One port connection (envd_port.c), by the host's id. */
struct envd_conn {
	uint32_t id;
	uint16_t port;
	int fd;             /* the socket to the server on loopback */
	int connecting;     /* connect() in progress: POLLOUT completes it */
	int tried_v4, tried_v6;
	struct inq in;      /* the host's bytes for the server (a duplicate of fd, shut at the end) */
	uint64_t unacked;   /* PORT_DATA bytes sent to the host and not acknowledged */
	uint64_t ack_due;   /* bytes the server took that the host has not been told of */
	int host_shut;      /* the host's client sends no more */
	int srv_eof;        /* the server sends no more: PORT_SHUT sent */
};

/* Directory watches (envd_watch.c). */
#define ENVD_MAX_WATCHES 16   /* at once; WATCH past it: -EMFILE */
#define ENVD_WATCH_DIRS 1024  /* directories one (recursive) watch follows */
struct envd_watch_dir {
	int wd;
	char *rel; /* relative to the watched directory, "" for itself */
};
struct envd_watch {
	uint32_t id;    /* the host's */
	uint32_t flags; /* WATCH flags */
	int fd;         /* inotify */
	struct envd_user user;
	char root[PROTO_MAX_PATH + 1];
	struct envd_watch_dir dirs[ENVD_WATCH_DIRS];
	size_t ndirs;
	int op_next;    /* operations of the event at off already sent */
	int ending;     /* a negative errno: WATCH_END{id, ending} is due, nothing else */
	size_t off, len; /* inotify events read and not yet sent: buf[off, len) */
	uint8_t buf[16384];
};

struct envd {
	int chan, sigfd;
	int connected;
	const struct envd_config *cfg;
	struct rlimit nofile; /* the limit children get back */
	size_t rx_start, rx_end;
	size_t tx_head, tx_tail;  /* unsent bytes are tx[tx_head, tx_tail) */
	uint64_t tx_appended, tx_sent; /* stream offsets, for a proc's END */
	struct envd_proc *procs[ENVD_MAX_PROCS];
	struct envd_job *jobs[ENVD_MAX_JOBS];
	struct envd_conn *conns[ENVD_MAX_CONNS];
	struct envd_watch *watches[ENVD_MAX_WATCHES];
	uint32_t dead_writes[ENVD_MAX_JOBS]; /* reqs of failed WRITEs: their WDATA/WEND are ignored */
	unsigned dead_next;
	struct envd_name names[ENVD_NAME_CACHE];
	unsigned names_next;
	int64_t input_drop_log_ms;
	struct envd_user user;      /* START's */
	char env_defs[6][PROTO_MAX_PATH + 16];
	char *envp[6 + PROTO_MAX_ENV + 1];
#define ENVD_NPOLL (2 + 3 * ENVD_MAX_PROCS + ENVD_MAX_CONNS + ENVD_MAX_WATCHES)
	struct pollfd pfd[ENVD_NPOLL];
	struct envd_proc *pproc[ENVD_NPOLL];
	struct envd_conn *pconn[ENVD_NPOLL];
	struct envd_watch *pwatch[ENVD_NPOLL];
	uint8_t pkind[ENVD_NPOLL];
	struct eproto_start start;  /* scratch (~150 KiB) */
	struct eproto_proc proc;    /* scratch for LIST */
	struct eproto_fsreq fsreq;
	struct eproto_entry entry;
	uint8_t rx[PROTO_MAX_FRAME];
	uint8_t tx[ENVD_TX_CAP];
};

/* ---- envd_tx.c: sending ---- */

/* Room for one more frame of any size (and the host is connected). */
int envd_tx_ok(struct envd *e);
/* Where the next frame's payload goes (PROTO_MAX_PAYLOAD bytes); only
 * after envd_tx_ok(). */
uint8_t *envd_tx_payload(struct envd *e);
/* Appends the frame whose payload was written at envd_tx_payload(). */
void envd_tx_commit(struct envd *e, uint8_t type, size_t len);
void envd_send_error(struct envd *e, uint32_t req, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void envd_send_done(struct envd *e, uint32_t req);
/* Sends a frame of n u32s. */
void envd_send_u32s(struct envd *e, uint8_t type, const uint32_t *v, unsigned n);
/* Writes what the channel takes now: 0 or a negative errno when the channel
 * failed. */
int envd_flush(struct envd *e);

/* ---- envd_proc.c: processes ---- */

/* The slot of a live process (not ended) with this pid, or NULL. */
struct envd_proc *envd_proc_find(struct envd *e, uint32_t pid);
/* START: forks the child as its user; STARTED or an error. */
void envd_start(struct envd *e, const uint8_t *raw, size_t len);
/* STDIN bytes for p (queued within ENVD_STDIN_MAX and ENVD_STDIN_TOTAL),
 * and its end (a terminal gets its EOF character). */
void envd_input(struct envd *e, struct envd_proc *p, const uint8_t *data, size_t n);
void envd_close_stdin(struct envd_proc *p);
/* Reads one of p's pipes (*fd, out or err) into an OUT frame, within its
 * window; *drain counts down what is left to read once draining. */
void envd_pump(struct envd *e, struct envd_proc *p, int *fd, uint8_t stream, size_t *drain);
/* After exit: starts the drain once the linger is over, and sends END once
 * the pipes are closed. Returns the ms until p needs a look again, or -1. */
int envd_proc_tick(struct envd *e, struct envd_proc *p, int64_t now);
/* Collects exited children (SIGCHLD). */
void envd_reap(struct envd *e);
/* Frees process slot `slot` and closes what it holds. */
void envd_proc_free(struct envd *e, int slot);
/* Sends as much of LIST job j as the send buffer takes. */
void envd_list_step(struct envd *e, struct envd_job *j);
/* A LISTDIR level's names and descriptor freed (envd_fs.c). */
void envd_dirlevel_close(struct envd_dirlevel *lv);

/* ---- envd_port.c: port connections ---- */

struct envd_conn *envd_conn_find(struct envd *e, uint32_t id);
/* PORT_OPEN, PORT_DATA, PORT_SHUT, PORT_ACK, PORT_CLOSE and PORTS from the
 * host (decoded; the caller made sure a reply fits). */
void envd_port_open(struct envd *e, uint32_t id, uint32_t port);
void envd_port_data(struct envd *e, uint32_t id, const uint8_t *raw, size_t n);
void envd_port_shut(struct envd *e, uint32_t id);
void envd_port_ack(struct envd *e, uint32_t id, uint32_t bytes);
void envd_port_close(struct envd *e, uint32_t id);
void envd_ports(struct envd *e, uint32_t req);
/* Poll events on a connection's socket: connect done (POLLOUT while
 * connecting), the server's bytes (POLLIN), room for the host's (POLLOUT).
 * c may be gone afterwards. */
void envd_conn_event(struct envd *e, struct envd_conn *c, short revents);
/* ACKs owed and connections that are done; 1 when one ended. */
int envd_conns_tick(struct envd *e);
/* A new host (or the end): every connection is forgotten, nothing sent. */
void envd_conns_drop(struct envd *e);

/* ---- envd_watch.c: directory watches ---- */

/* WATCH (decoded; a reply fits): DONE{req} with the watch running, or ERROR. */
void envd_watch_start(struct envd *e, const struct eproto_watch *m);
/* UNWATCH: WATCH_END{id, 0}; nothing for an id that is not watching. */
void envd_unwatch(struct envd *e, uint32_t id);
/* POLLIN on w->fd: its events out as far as the send buffer takes them. */
void envd_watch_read(struct envd *e, struct envd_watch *w);
/* Sends the events watches read earlier, as room allows. Returns 0. */
int envd_watches_run(struct envd *e);
/* A new host (or the end): every watch is closed, nothing sent. */
void envd_watches_drop(struct envd *e);
/* Watches open now. */
int envd_watch_count(struct envd *e);

/* ---- envd_fs.c ---- */

/* Finds user `name` ("" = the default user) in cfg->passwd, with its groups
 * from cfg->group. Returns 0, -ENOENT, or another negative errno. */
int envd_user_lookup(const struct envd_config *cfg, const char *name, struct envd_user *u);
/* Switches the file-system identity (fsuid, fsgid, groups) to u, and back
 * to root. Outside root (tests) only u's own uid is possible. */
int envd_fs_enter(const struct envd_user *u);
void envd_fs_leave(void);
/* An absolute, lexically clean path for `in`: itself when absolute, else
 * under u's home. Returns 0 or -ENAMETOOLONG / -EINVAL. */
int envd_resolve(const struct envd_user *u, const char *in, char out[PROTO_MAX_PATH + 1]);

/* STAT, LISTDIR, MKDIR, MOVE, REMOVE, READ, WRITE, WDATA, WEND, CANCEL. The
 * caller made sure a frame fits (envd_tx_ok). */
void envd_fs_request(struct envd *e, uint8_t type, const uint8_t *p, size_t len);
/* Advances LISTDIR and READ jobs as far as the send buffer and windows
 * allow. Returns 1 if one of them could go on right away. */
int envd_fs_jobs_run(struct envd *e);
/* ACK for a READ's DATA; returns 0 if req is no READ. */
int envd_fs_ack(struct envd *e, uint32_t req, uint32_t bytes);
/* Ends a job (a WRITE's temporary file is removed) and frees its slot. */
void envd_job_free(struct envd *e, int slot);
/* A free job slot, or -1. */
int envd_job_slot(struct envd *e);

#endif
