/* proto: the host-guest wire protocol spoken over the virtio-serial agent port.
 * Framed, versioned, little-endian, every length bounded; see docs/protocol.md.
 * Shared by kiln-init (guest) and kiln-host; no allocation, no I/O policy. */
#ifndef KILN_PROTO_H
#define KILN_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "clock.h"

#define PROTO_VERSION     1
#define PROTO_HDR_SIZE    8
/* Largest payload of one frame. Bulk data (files, stdout) is split into frames. */
#define PROTO_MAX_PAYLOAD (128 * 1024)
#define PROTO_MAX_FRAME   (PROTO_HDR_SIZE + PROTO_MAX_PAYLOAD)
#define PROTO_MAX_PATH    4096
#define PROTO_MAX_ARGS    1024
#define PROTO_MAX_ENV     1024
#define PROTO_MAX_ENTROPY 256
#define PROTO_MAX_MSG     1024

enum proto_type {
	/* guest -> host */
	PROTO_HELLO = 0x01,    /* u32 version, u32 features, str kernel release */
	PROTO_OK = 0x02,       /* u8 type of the request it acknowledges */
	PROTO_ERROR = 0x03,    /* i32 errno-style code, str message */
	PROTO_STARTED = 0x04,  /* empty: the task process has been exec'd */
	PROTO_STDOUT = 0x05,   /* raw bytes */
	PROTO_STDERR = 0x06,   /* raw bytes */
	PROTO_EXIT = 0x07,     /* struct proto_exit */
	PROTO_OUT_DIR = 0x08,  /* str relative path */
	PROTO_OUT_FILE = 0x09, /* u32 mode, u64 size, str relative path; then `size` bytes of OUT_DATA */
	PROTO_OUT_DATA = 0x0a, /* raw bytes */
	PROTO_OUT_END = 0x0b,  /* struct proto_out_end */
	PROTO_PROCS = 0x0c,    /* u32 count, u32 pid: answer to PROCS_QUERY */

	/* host -> guest */
	PROTO_SETUP = 0x40,     /* u64 sec, u32 nsec, bytes entropy: set the clock, reseed */
	PROTO_FILE = 0x41,      /* u32 mode, u64 size, str absolute path; then `size` bytes of FILE_DATA */
	PROTO_FILE_DATA = 0x42, /* raw bytes */
	PROTO_EXEC = 0x43,      /* struct proto_exec */
	PROTO_KILL = 0x44,      /* empty: kill the task (host-side timeout) */
	PROTO_COLLECT = 0x45,   /* u64 byte budget: send everything under /output */
	PROTO_PREPARE = 0x46,   /* empty: pre-start the Python interpreter (before a snapshot) */
	PROTO_WARM = 0x47,      /* empty: run a sample in a fork of that interpreter (pool warm-up) */
	PROTO_STDIN = 0x48,     /* raw bytes for the running task's stdin; empty: end of input */
	PROTO_RESIZE = 0x49,    /* u32 rows, u32 cols: the running task's terminal size */
	PROTO_HANGUP = 0x4a,    /* empty: the interactive task's client is gone (SIGHUP, then SIGKILL to its group) */
	PROTO_PROCS_QUERY = 0x4b, /* empty: how many processes run that are not kiln-init's own? (idle stop) */
};

/* Feature bits in HELLO. */
#define PROTO_FEAT_ZYGOTE 0x1u /* a pre-started Python interpreter is waiting */

struct proto_frame {
	uint8_t type;
	uint32_t len;
	const uint8_t *payload; /* points into the caller's buffer */
};

/* Parse one frame at the start of buf. Returns the number of bytes it occupies
 * (header + payload), 0 when more bytes are needed, or -EPROTO for a frame
 * that can never be valid (bad version, reserved bits, length over the bound). */
ssize_t proto_frame_parse(const uint8_t *buf, size_t len, struct proto_frame *f);

/* Write the 8-byte header for a frame of the given type and payload length. */
void proto_frame_header(uint8_t hdr[PROTO_HDR_SIZE], uint8_t type, uint32_t len);

/* A bounded payload writer over a caller-owned buffer. Overflow sets err and
 * makes every later put a no-op; check err once at the end. */
struct proto_writer {
	uint8_t *buf;
	size_t cap, len;
	int err;
};
void proto_put_u8(struct proto_writer *w, uint8_t v);
void proto_put_u32(struct proto_writer *w, uint32_t v);
void proto_put_u64(struct proto_writer *w, uint64_t v);
void proto_put_bytes(struct proto_writer *w, const void *p, size_t n); /* u32 length + bytes */
void proto_put_str(struct proto_writer *w, const char *s);

/* A bounded payload reader. Every get checks the remaining length; a short or
 * malformed payload sets err (-EPROTO) and yields zeros / NULL from then on. */
struct proto_reader {
	const uint8_t *p;
	size_t len, off;
	int err;
};
void proto_reader_init(struct proto_reader *r, const uint8_t *p, size_t len);
uint8_t proto_get_u8(struct proto_reader *r);
uint32_t proto_get_u32(struct proto_reader *r);
uint64_t proto_get_u64(struct proto_reader *r);
/* A length-prefixed byte string of at most max bytes, pointing into the payload. */
const uint8_t *proto_get_bytes(struct proto_reader *r, size_t max, size_t *n);
/* A string of at most max bytes with no NUL inside, copied NUL-terminated into
 * out (which holds max + 1 bytes). Returns out, or NULL on error. */
char *proto_get_str(struct proto_reader *r, char *out, size_t max);
/* Fails with -EPROTO unless every payload byte was consumed. */
int proto_reader_end(struct proto_reader *r);

/* ---- messages ---------------------------------------------------------- */

struct proto_hello {
	uint32_t version;
	uint32_t features;
	char release[65];
};

struct proto_setup {
	uint64_t sec;
	uint32_t nsec;
	uint8_t entropy[PROTO_MAX_ENTROPY];
	size_t entropy_len;
};

struct proto_file {
	uint32_t mode;
	uint64_t size;
	char path[PROTO_MAX_PATH + 1];
};

/* EXEC: argv/env strings point into `strbuf`, a copy the decoder owns. */
/* Run argv[1] (a Python file) in the interpreter PREPARE pre-started, instead
 * of exec'ing argv[0]; the guest falls back to exec when there is none. */
#define PROTO_EXEC_ZYGOTE 0x1u
/* A session's command: when it exits, the processes it left running (its
 * daemons, background jobs) are not killed; they stay for later commands. A
 * KILL (timeout) still kills every process of the uid. */
#define PROTO_EXEC_KEEP   0x2u
/* stdin is a pipe fed by STDIN frames (an empty one closes it) instead of
 * /dev/null. */
#define PROTO_EXEC_STDIN  0x4u
/* stdin, stdout and stderr are a new pseudo-terminal of rows x cols (the
 * task's controlling terminal); STDIN frames are typed into it, RESIZE
 * changes its size, all output comes as STDOUT. */
#define PROTO_EXEC_TTY    0x8u
/* Run only if no request since the previous EXEC (SETUP, FILE, ...) was
 * answered with ERROR; else ERROR -ECANCELED and nothing runs. Lets the host
 * send SETUP, the files and EXEC in one go and read the replies after. */
#define PROTO_EXEC_IF_OK  0x10u
#define PROTO_EXEC_FLAGS  (PROTO_EXEC_ZYGOTE | PROTO_EXEC_KEEP | PROTO_EXEC_STDIN | PROTO_EXEC_TTY | PROTO_EXEC_IF_OK)
#define PROTO_MAX_TTY_DIM 4096 /* rows and cols: 1 to this */
struct proto_exec {
	uint32_t flags;
	uint64_t output_cap;  /* stdout + stderr bytes before the task is killed */
	uint32_t uid, gid;
	char cwd[PROTO_MAX_PATH + 1];
	uint32_t argc, envc;
	uint32_t rows, cols;  /* with PROTO_EXEC_TTY only (encoded after env) */
	char *argv[PROTO_MAX_ARGS + 1];
	char *env[PROTO_MAX_ENV + 1];
	char strbuf[PROTO_MAX_PAYLOAD];
};

enum proto_exit_how { PROTO_EXITED = 1, PROTO_SIGNALED = 2 };
#define PROTO_EXIT_OOM          0x1u
#define PROTO_EXIT_OUTPUT_LIMIT 0x2u
#define PROTO_EXIT_KILLED       0x4u /* killed on the host's request (KILL) */
#define PROTO_EXIT_STDIN_LOST   0x8u /* STDIN bytes dropped: the task did not read them fast enough */
struct proto_exit {
	uint8_t how;     /* enum proto_exit_how */
	uint32_t status; /* exit code or signal number */
	uint32_t flags;  /* PROTO_EXIT_* */
	uint64_t run_us, user_us, sys_us, maxrss_kib;
	uint64_t stdout_bytes, stderr_bytes; /* bytes the task wrote, sent or not */
};

struct proto_out_file {
	uint32_t mode;
	uint64_t size;
	char path[PROTO_MAX_PATH + 1];
};

#define PROTO_OUT_TRUNCATED 0x1u /* the byte budget ran out: files were left out */
struct proto_out_end {
	uint32_t files, dirs, skipped; /* skipped: symlinks, devices, unreadable */
	uint32_t flags;
};

struct proto_error {
	int32_t code;
	char message[PROTO_MAX_MSG + 1];
};

/* Encoders write a payload into buf (cap bytes) and return its length, or
 * -ENOSPC when it does not fit. Decoders validate every field and return 0 or
 * -EPROTO; they never read past len. */
ssize_t proto_hello_encode(uint8_t *buf, size_t cap, const struct proto_hello *m);
int proto_hello_decode(const uint8_t *p, size_t len, struct proto_hello *m);
ssize_t proto_setup_encode(uint8_t *buf, size_t cap, const struct proto_setup *m);
int proto_setup_decode(const uint8_t *p, size_t len, struct proto_setup *m);
ssize_t proto_file_encode(uint8_t *buf, size_t cap, const struct proto_file *m);
int proto_file_decode(const uint8_t *p, size_t len, struct proto_file *m);
ssize_t proto_exec_encode(uint8_t *buf, size_t cap, const struct proto_exec *m);
int proto_exec_decode(const uint8_t *p, size_t len, struct proto_exec *m);
ssize_t proto_exit_encode(uint8_t *buf, size_t cap, const struct proto_exit *m);
int proto_exit_decode(const uint8_t *p, size_t len, struct proto_exit *m);
ssize_t proto_out_file_encode(uint8_t *buf, size_t cap, const struct proto_out_file *m);
int proto_out_file_decode(const uint8_t *p, size_t len, struct proto_out_file *m);
ssize_t proto_out_end_encode(uint8_t *buf, size_t cap, const struct proto_out_end *m);
int proto_out_end_decode(const uint8_t *p, size_t len, struct proto_out_end *m);
ssize_t proto_error_encode(uint8_t *buf, size_t cap, const struct proto_error *m);
int proto_error_decode(const uint8_t *p, size_t len, struct proto_error *m);
/* RESIZE: both dimensions 1..PROTO_MAX_TTY_DIM. */
ssize_t proto_resize_encode(uint8_t *buf, size_t cap, uint32_t rows, uint32_t cols);
int proto_resize_decode(const uint8_t *p, size_t len, uint32_t *rows, uint32_t *cols);
/* PROCS: count of the guest's processes other than kiln-init and its
 * helpers (kernel threads and zombies not counted), and the pid of one of
 * them (0 when count is 0). */
ssize_t proto_procs_encode(uint8_t *buf, size_t cap, uint32_t count, uint32_t pid);
int proto_procs_decode(const uint8_t *p, size_t len, uint32_t *count, uint32_t *pid);

/* Inside the guest, not on the wire: the pre-started interpreter's word that
 * the task is done, written to PID 1 right before it exits (guest/zygote.c),
 * so that EXIT need not wait for the kernel to tear the process down. One
 * line, "X <status> <user_us> <sys_us> <maxrss_kib>\n", decimal without
 * leading zeros, at most PROTO_ZDONE_MAX bytes. The task's own code can
 * write to that pipe: a line that does not parse is refused, and what a
 * valid one says is what the task could have made its exit say anyway. */
#define PROTO_ZDONE_MAX 64
struct proto_zdone {
	uint32_t status; /* 0-255 */
	uint64_t user_us, sys_us, maxrss_kib; /* each below 10^15 */
};
ssize_t proto_zdone_encode(char *buf, size_t cap, const struct proto_zdone *d);
int proto_zdone_decode(const char *p, size_t len, struct proto_zdone *d);
/* OUT_DIR: one relative path, into out (PROTO_MAX_PATH + 1 bytes). */
int proto_path_decode(const uint8_t *p, size_t len, char *out);

/* Relative path check for paths the guest names under /output: non-empty, at
 * most PROTO_MAX_PATH bytes, no leading '/', no empty, '.' or '..' component,
 * no NUL. Returns 0 when safe to join under an output directory. */
int proto_relpath_ok(const char *path);
/* Absolute path check for task files: starts with '/', then as above. */
int proto_abspath_ok(const char *path);

/* Write one whole frame to a blocking or non-blocking fd, waiting with poll()
 * until deadline_ms (CLOCK_MONOTONIC milliseconds; <= 0: no deadline).
 * Returns 0, -ETIMEDOUT, or a negative errno. */
int proto_send(int fd, uint8_t type, const void *payload, size_t len, int64_t deadline_ms);

/* Write all n bytes, with the same deadline rules as proto_send (the loop is
 * io_write_all_deadline in lib/io.c; this name stays for its many callers). */
int proto_write_all(int fd, const void *buf, size_t n, int64_t deadline_ms);

/* CLOCK_MONOTONIC in milliseconds / microseconds: the deadline clock of every
 * proto_* call. Thin names over lib/clock.h, kept because host and guest use
 * them in many places. */
static inline int64_t proto_now_ms(void)
{
	return clock_mono_ms();
}

static inline int64_t proto_now_us(void)
{
	return clock_mono_us();
}

#endif
