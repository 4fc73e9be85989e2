/* eproto: the protocol of the guest's process and file daemon (envd), spoken
 * over the second virtio-serial port, `kiln.envd`. It carries E2B-style work
 * that kiln-init's one-task-at-a-time agent cannot: many processes at once,
 * each with its own output stream, stdin and signals, and file operations
 * beside them. Framing is lib/proto's (8-byte header, payload <= 128 KiB,
 * little-endian, every length bounded); the types are 0x80 and up so that a
 * frame sent to the wrong port is refused, never misread. docs/e2b.md has the
 * message table and the rules. Shared by guest/envd.c and host/envd*.c; no
 * allocation, no I/O. */
#ifndef KILN_EPROTO_H
#define KILN_EPROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"

#define EPROTO_VERSION 1
/* Unacknowledged OUT bytes per process (and DATA bytes per READ) the guest
 * may have sent: past it, it stops reading that process's pipe (the process
 * blocks as on a full pipe) until an ACK gives room. */
#define EPROTO_WINDOW (1024 * 1024)
#define EPROTO_MAX_USER 32       /* a user name */
#define EPROTO_MAX_TAG 256       /* a process tag */
#define EPROTO_MAX_CHUNK (64 * 1024) /* OUT, DATA and WDATA bytes per frame */

enum eproto_type {
	/* guest -> host */
	EP_HELLO = 0x80,   /* u32 version, u32 features: sent on every (re)connection; the host drops all it had pending.
			    * Also host -> guest as u32 version, u32 req: the guest resets as on a new connection and
			    * answers HELLO then DONE{req} (a restored VM's port may not show the host's new connection;
			    * docs/protocol.md "The kiln.envd port") */
	EP_STARTED = 0x81, /* u32 req, u32 pid: a START succeeded */
	EP_OUT = 0x82,     /* u32 pid, u8 stream (enum eproto_stream), then raw bytes (<= EPROTO_MAX_CHUNK) */
	EP_END = 0x83,     /* u32 pid, u8 how (PROTO_EXITED / PROTO_SIGNALED), u32 status: after its last OUT */
	EP_ERROR = 0x84,   /* u32 req, i32 code (negative errno), str message (<= PROTO_MAX_MSG): the request failed */
	EP_DONE = 0x85,    /* u32 req: the request succeeded (or a LIST / LISTDIR / READ ended) */
	EP_ENTRY = 0x86,   /* u32 req, struct eproto_entry (then bytes meta when the file has metadata) */
	EP_PROC = 0x87,    /* u32 req, struct eproto_proc: one LIST row */
	EP_DATA = 0x88,    /* u32 req, then raw bytes (<= EPROTO_MAX_CHUNK): a READ's content */
	EP_PORT_OPENED = 0x89, /* u32 conn: PORT_OPEN connected */
	EP_PORT_CLOSED = 0x8a, /* u32 conn, u32 code (0, or a negative errno as u32): the connection is gone and its id free
				* again (after both sides' SHUT, a reset, a refused connect, or the host's PORT_CLOSE) */
	EP_PORTS_LIST = 0x8b,  /* u32 req, u32 n (<= EPROTO_MAX_PORTS), n x u32 port: the TCP ports listened on, ascending */
	EP_WATCH_EVENT = 0x8c, /* u32 id, u8 event (enum eproto_wevent), str name: one change under a WATCH (eproto_wevent_*) */
	EP_WATCH_END = 0x8d,   /* u32 id, u32 code (0: UNWATCH asked; else a negative errno as u32), str message: the
				* watch is gone and its id free (eproto_wend_*) */

	/* host -> guest */
	EP_START = 0x90,       /* struct eproto_start -> STARTED, then OUT* and END; or ERROR */
	EP_INPUT = 0x91,       /* u32 pid, then raw bytes: the process's stdin (or typed into its pty). No reply */
	EP_CLOSE_STDIN = 0x92, /* u32 pid. No reply */
	EP_SIGNAL = 0x93,      /* u32 pid, u32 signal (1-64): to the process's group. No reply */
	EP_RESIZE = 0x94,      /* u32 pid, u32 rows, u32 cols (1-4096): its pty. No reply */
	EP_ACK = 0x95,         /* u32 id (a pid for OUT, a req for DATA), u32 bytes consumed. No reply. A READ in
				* progress with req == id wins: the host keeps its reqs >= 1 << 22, above any pid */
	EP_LIST = 0x96,        /* u32 req -> PROC* then DONE */
	EP_STAT = 0x97,        /* u32 req, str user, str path -> ENTRY or ERROR */
	EP_LISTDIR = 0x98,     /* u32 req, str user, str path, u32 depth (1-16) -> ENTRY* then DONE, or ERROR */
	EP_MKDIR = 0x99,       /* u32 req, str user, str path -> ENTRY (created, with parents) or ERROR (-EEXIST) */
	EP_MOVE = 0x9a,        /* u32 req, str user, str src, str dst -> ENTRY (of dst) or ERROR */
	EP_REMOVE = 0x9b,      /* u32 req, str user, str path -> DONE or ERROR (recursive for a directory) */
	EP_READ = 0x9c,        /* u32 req, str user, str path -> DATA* then DONE, or ERROR (possibly after DATA) */
	EP_WRITE = 0x9d,       /* u32 req, str user, str path (then bytes meta, when given): begins a file; WDATA* and
				* WEND follow */
	EP_WDATA = 0x9e,       /* u32 req, then raw bytes (<= EPROTO_MAX_CHUNK) */
	EP_WEND = 0x9f,        /* u32 req -> ENTRY (the written file) or ERROR */
	EP_CANCEL = 0xa0,      /* u32 req: abandon a READ or WRITE (a partial file is removed) -> ERROR -ECANCELED, or
				* nothing if it already ended */
	EP_PORT_OPEN = 0xa1,   /* u32 conn (the host's id), u32 port (1-65535): connect to the port on loopback ->
				* PORT_OPENED or PORT_CLOSED (-ECONNREFUSED: nobody listens) */
	EP_PORTS = 0xa2,       /* u32 req -> PORTS_LIST */
	EP_WATCH = 0xa3,       /* struct eproto_watch -> DONE{req} (then WATCH_EVENT{id}* until WATCH_END{id}) or ERROR */
	EP_UNWATCH = 0xa4,     /* u32 id: stop watching -> WATCH_END{id, 0}, or nothing if it has ended already */

	/* both ways, for a port connection (docs/e2b.md "Ports") */
	EP_PORT_DATA = 0xb0,   /* u32 conn, then raw bytes (<= EPROTO_MAX_CHUNK), within the receiver's EPROTO_WINDOW */
	EP_PORT_ACK = 0xb1,    /* u32 conn, u32 bytes the receiver has taken (written to the server / sent to the client) */
	EP_PORT_SHUT = 0xb2,   /* u32 conn: the sender's side sends no more (a half close) */
	EP_PORT_CLOSE = 0xb3,  /* host -> guest, u32 conn: abandon it (a reset) -> PORT_CLOSED */
};

/* HELLO's features (guest -> host): what this envd offers beyond version 1. */
#define EPROTO_FEAT_PORTS 0x1u /* PORT_OPEN, PORTS and the port frames */
#define EPROTO_MAX_PORTS 1024  /* ports in one PORTS_LIST */
#define EPROTO_FEAT_WATCH 0x2u /* WATCH, UNWATCH and the watch frames */

/* A WATCH_EVENT's event: E2B's filesystem.EventType numbers. */
enum eproto_wevent { EP_WEV_CREATE = 1, EP_WEV_WRITE = 2, EP_WEV_REMOVE = 3, EP_WEV_RENAME = 4, EP_WEV_CHMOD = 5 };
#define EP_WATCH_RECURSIVE 0x1u /* WATCH flags: subdirectories too, those made later included */
#define EP_WATCH_FLAGS EP_WATCH_RECURSIVE

/* WATCH: watch directory path (absolute, or relative to the user's home) as
 * user ("" = the default user). id is the host's name for the watch, unique
 * among its watches on this connection. */
struct eproto_watch {
	uint32_t req, id, flags;
	char user[EPROTO_MAX_USER + 1];
	char path[PROTO_MAX_PATH + 1];
};

enum eproto_stream { EP_STDOUT = 1, EP_STDERR = 2, EP_PTY = 3 };

/* START flags. */
#define EP_START_STDIN 0x1u /* stdin is a pipe fed by INPUT (CLOSE_STDIN ends it); else /dev/null */
#define EP_START_PTY   0x2u /* stdin/stdout/stderr are a new pseudo-terminal of rows x cols; output comes as EP_PTY */
#define EP_START_FLAGS (EP_START_STDIN | EP_START_PTY)

/* START: argv/env/user/cwd/tag point into strbuf, a copy the decoder owns.
 * user "" is the default user (`user`, created by envd when the image lacks
 * it); cwd "" is the user's home; a relative cwd is relative to the home. env
 * is the whole set of variables the host adds (KEY=VALUE) on top of the
 * user's login defaults (HOME, USER, LOGNAME, SHELL, PATH). */
struct eproto_start {
	uint32_t req;
	uint32_t flags;
	uint32_t rows, cols; /* with EP_START_PTY: 1-4096 each; else 0 */
	const char *user, *cwd, *tag;
	uint32_t argc, envc; /* argc 1-PROTO_MAX_ARGS, envc 0-PROTO_MAX_ENV */
	const char *argv[PROTO_MAX_ARGS + 1];
	const char *env[PROTO_MAX_ENV + 1];
	char strbuf[PROTO_MAX_PAYLOAD];
};

/* One LIST row: a process START began that has not ended. */
struct eproto_proc {
	uint32_t req;
	uint32_t pid;
	uint32_t flags; /* the START flags */
	const char *tag, *cwd;
	uint32_t argc, envc;
	const char *argv[PROTO_MAX_ARGS + 1];
	const char *env[PROTO_MAX_ENV + 1]; /* the env START carried, not the login defaults */
	char strbuf[PROTO_MAX_PAYLOAD];
};

enum eproto_ftype { EP_FILE = 1, EP_DIR = 2, EP_SYMLINK = 3, EP_OTHER = 4 };
/* File metadata (E2B's `metadata`, kept by the guest as xattrs named
 * EPROTO_META_XATTR + key, as E2B's envd keeps them): on the wire a `bytes`
 * of pairs "key\0value\0". Keys 1-EPROTO_MAX_META_KEY bytes, keys and
 * values printable ASCII (0x20-0x7e), each key once; the sum over the pairs
 * of strlen(EPROTO_META_XATTR) + key + value at most EPROTO_MAX_META (E2B's
 * budget: ext4 keeps a file's xattrs in one 4 KiB block). */
#define EPROTO_META_XATTR "user.e2b."
#define EPROTO_MAX_META 4096
#define EPROTO_MAX_META_KEY (255 - 9) /* an xattr name is at most 255 bytes */

/* A file's metadata, from lstat (a symlink is reported as itself, with its
 * target). path is absolute; name is its last component. */
struct eproto_entry {
	uint32_t req;
	uint8_t type;   /* enum eproto_ftype */
	uint32_t mode;  /* st_mode */
	uint64_t size;
	uint32_t uid, gid;
	int64_t mtime_sec;
	uint32_t mtime_nsec;
	char owner[EPROTO_MAX_USER + 1], group[EPROTO_MAX_USER + 1]; /* "" when unnamed */
	char name[256];
	char path[PROTO_MAX_PATH + 1];
	char target[PROTO_MAX_PATH + 1]; /* a symlink's target, else "" */
	uint32_t meta_len;               /* metadata pairs (see EPROTO_META_XATTR); 0: none */
	char meta[EPROTO_MAX_META];
};

/* A file-system request: STAT, LISTDIR, MKDIR, MOVE (path2 = dst), REMOVE,
 * READ, WRITE. */
struct eproto_fsreq {
	uint32_t req;
	char user[EPROTO_MAX_USER + 1];
	char path[PROTO_MAX_PATH + 1];
	char path2[PROTO_MAX_PATH + 1];
	uint32_t depth; /* LISTDIR only */
	uint32_t meta_len; /* WRITE only: the new file's metadata pairs; 0: none */
	char meta[EPROTO_MAX_META];
};

/* Encoders write a payload (no frame header) into buf and return its length,
 * or -ENOSPC. Decoders check every field (lengths, flags, ranges, no NUL in
 * strings, the payload consumed exactly) and return 0 or -EPROTO. */
ssize_t eproto_start_encode(uint8_t *buf, size_t cap, const struct eproto_start *m);
int eproto_start_decode(const uint8_t *p, size_t len, struct eproto_start *m);
ssize_t eproto_proc_encode(uint8_t *buf, size_t cap, const struct eproto_proc *m);
int eproto_proc_decode(const uint8_t *p, size_t len, struct eproto_proc *m);
ssize_t eproto_entry_encode(uint8_t *buf, size_t cap, const struct eproto_entry *m);
int eproto_entry_decode(const uint8_t *p, size_t len, struct eproto_entry *m);
/* Which file-system request a message type is (the guest's envd_fs serves
 * them all): FS_REQ, its payload a struct eproto_fsreq (STAT, LISTDIR,
 * MKDIR, MOVE, REMOVE, READ, WRITE); FS_FOLLOW, what follows a request
 * (WDATA, WEND, CANCEL: a u32 req first); FS_NONE, any other type. */
enum eproto_fs_kind { EPROTO_FS_NONE, EPROTO_FS_REQ, EPROTO_FS_FOLLOW };
enum eproto_fs_kind eproto_fs_kind_of(uint8_t type);
/* type is the request's: STAT, LISTDIR, MKDIR, MOVE, REMOVE, READ or WRITE. */
ssize_t eproto_fsreq_encode(uint8_t *buf, size_t cap, uint8_t type, const struct eproto_fsreq *m);
int eproto_fsreq_decode(const uint8_t *p, size_t len, uint8_t type, struct eproto_fsreq *m);

/* Metadata pairs (EPROTO_META_XATTR): meta_check: 0 when p[0..n) is a
 * well-formed set, else -EPROTO. meta_add: append key=value to the set
 * buf[0..*len) (EPROTO_MAX_META bytes): 0, -EINVAL for a key or value that
 * may not be one (empty or long key, a byte out of 0x20-0x7e, a key there
 * already), -E2BIG past the budget. meta_next: the pair at *off (then
 * moved past it): 1, or 0 at the end. */
int eproto_meta_check(const char *p, size_t n);
int eproto_meta_add(char *buf, uint32_t *len, const char *key, size_t klen, const char *val, size_t vlen);
int eproto_meta_next(const char *p, size_t n, size_t *off, const char **key, const char **val);

/* The small fixed messages. */
ssize_t eproto_u32s_encode(uint8_t *buf, size_t cap, const uint32_t *v, unsigned n);
/* Exactly n u32s and nothing else. */
int eproto_u32s_decode(const uint8_t *p, size_t len, uint32_t *v, unsigned n);
/* A u32 id followed by raw bytes (OUT also has a u8 stream between them:
 * use eproto_out_*). */
int eproto_idraw_decode(const uint8_t *p, size_t len, uint32_t *id, const uint8_t **raw, size_t *n);
ssize_t eproto_out_encode(uint8_t *buf, size_t cap, uint32_t pid, uint8_t stream, const void *raw, size_t n);
int eproto_out_decode(const uint8_t *p, size_t len, uint32_t *pid, uint8_t *stream, const uint8_t **raw, size_t *n);
ssize_t eproto_end_encode(uint8_t *buf, size_t cap, uint32_t pid, uint8_t how, uint32_t status);
int eproto_end_decode(const uint8_t *p, size_t len, uint32_t *pid, uint8_t *how, uint32_t *status);
/* PORTS_LIST: ports[0..n) (n <= EPROTO_MAX_PORTS, each 1-65535). */
ssize_t eproto_ports_encode(uint8_t *buf, size_t cap, uint32_t req, const uint16_t *ports, uint32_t n);
int eproto_ports_decode(const uint8_t *p, size_t len, uint32_t *req, uint16_t ports[EPROTO_MAX_PORTS], uint32_t *n);
/* PORT_DATA (and any u32 id + raw bytes <= EPROTO_MAX_CHUNK). */
ssize_t eproto_idraw_encode(uint8_t *buf, size_t cap, uint32_t id, const void *raw, size_t n);
/* WATCH. */
ssize_t eproto_watch_encode(uint8_t *buf, size_t cap, const struct eproto_watch *m);
int eproto_watch_decode(const uint8_t *p, size_t len, struct eproto_watch *m);
/* WATCH_EVENT: name is relative to the watched directory (proto_relpath_ok)
 * or "." for the directory itself. */
ssize_t eproto_wevent_encode(uint8_t *buf, size_t cap, uint32_t id, uint8_t event, const char *name);
int eproto_wevent_decode(const uint8_t *p, size_t len, uint32_t *id, uint8_t *event, char name[PROTO_MAX_PATH + 1]);
/* WATCH_END: code 0 or a negative errno (-4095..-1); msg cut at PROTO_MAX_MSG. */
ssize_t eproto_wend_encode(uint8_t *buf, size_t cap, uint32_t id, int32_t code, const char *msg);
int eproto_wend_decode(const uint8_t *p, size_t len, uint32_t *id, int32_t *code, char msg[PROTO_MAX_MSG + 1]);
ssize_t eproto_error_encode(uint8_t *buf, size_t cap, uint32_t req, int32_t code, const char *msg);
int eproto_error_decode(const uint8_t *p, size_t len, uint32_t *req, int32_t *code, char msg[PROTO_MAX_MSG + 1]);

#endif
