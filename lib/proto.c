/* proto: framing, bounded payload readers/writers and message codecs for the
 * host-guest protocol (docs/protocol.md). Both ends treat the other's bytes as
 * hostile: every decoder checks every length against the remaining payload
 * and against a fixed bound before touching memory. */
#include "proto.h"

#include "io.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = v;
	p[1] = v >> 8;
	p[2] = v >> 16;
	p[3] = v >> 24;
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Header: u8 version, u8 type, u16 reserved (zero), u32 payload length. */
ssize_t proto_frame_parse(const uint8_t *buf, size_t len, struct proto_frame *f)
{
	uint32_t plen;

	if (len < PROTO_HDR_SIZE)
		return 0;
	if (buf[0] != PROTO_VERSION || buf[2] != 0 || buf[3] != 0 || buf[1] == 0)
		return -EPROTO;
	plen = get_le32(buf + 4);
	if (plen > PROTO_MAX_PAYLOAD)
		return -EPROTO;
	if (len - PROTO_HDR_SIZE < plen)
		return 0;
	f->type = buf[1];
	f->len = plen;
	f->payload = buf + PROTO_HDR_SIZE;
	return PROTO_HDR_SIZE + (ssize_t)plen;
}

void proto_frame_header(uint8_t hdr[PROTO_HDR_SIZE], uint8_t type, uint32_t len)
{
	hdr[0] = PROTO_VERSION;
	hdr[1] = type;
	hdr[2] = 0;
	hdr[3] = 0;
	put_le32(hdr + 4, len);
}

/* ---- writer ------------------------------------------------------------- */

static uint8_t *put_space(struct proto_writer *w, size_t n)
{
	uint8_t *p;

	if (w->err || w->cap - w->len < n) {
		w->err = -ENOSPC;
		return NULL;
	}
	p = w->buf + w->len;
	w->len += n;
	return p;
}

void proto_put_u8(struct proto_writer *w, uint8_t v)
{
	uint8_t *p = put_space(w, 1);

	if (p)
		*p = v;
}

void proto_put_u32(struct proto_writer *w, uint32_t v)
{
	uint8_t *p = put_space(w, 4);

	if (p)
		put_le32(p, v);
}

void proto_put_u64(struct proto_writer *w, uint64_t v)
{
	proto_put_u32(w, (uint32_t)v);
	proto_put_u32(w, (uint32_t)(v >> 32));
}

void proto_put_bytes(struct proto_writer *w, const void *src, size_t n)
{
	uint8_t *p;

	if (n > UINT32_MAX) {
		w->err = -ENOSPC;
		return;
	}
	proto_put_u32(w, (uint32_t)n);
	p = put_space(w, n);
	if (p && n)
		memcpy(p, src, n);
}

void proto_put_str(struct proto_writer *w, const char *s)
{
	proto_put_bytes(w, s, strlen(s));
}

/* ---- reader ------------------------------------------------------------- */

void proto_reader_init(struct proto_reader *r, const uint8_t *p, size_t len)
{
	r->p = p;
	r->len = len;
	r->off = 0;
	r->err = 0;
}

static const uint8_t *get_space(struct proto_reader *r, size_t n)
{
	const uint8_t *p;

	if (r->err || r->len - r->off < n) {
		r->err = -EPROTO;
		return NULL;
	}
	p = r->p + r->off;
	r->off += n;
	return p;
}

uint8_t proto_get_u8(struct proto_reader *r)
{
	const uint8_t *p = get_space(r, 1);

	return p ? *p : 0;
}

uint32_t proto_get_u32(struct proto_reader *r)
{
	const uint8_t *p = get_space(r, 4);

	return p ? get_le32(p) : 0;
}

uint64_t proto_get_u64(struct proto_reader *r)
{
	uint64_t lo = proto_get_u32(r);
	uint64_t hi = proto_get_u32(r);

	return lo | hi << 32;
}

const uint8_t *proto_get_bytes(struct proto_reader *r, size_t max, size_t *n)
{
	uint32_t len = proto_get_u32(r);
	const uint8_t *p;

	*n = 0;
	if (r->err)
		return NULL;
	if (len > max) {
		r->err = -EPROTO;
		return NULL;
	}
	p = get_space(r, len);
	if (p)
		*n = len;
	return p;
}

char *proto_get_str(struct proto_reader *r, char *out, size_t max)
{
	size_t n;
	const uint8_t *p = proto_get_bytes(r, max, &n);

	out[0] = '\0';
	if (!p)
		return NULL;
	if (memchr(p, '\0', n)) {
		r->err = -EPROTO;
		return NULL;
	}
	memcpy(out, p, n);
	out[n] = '\0';
	return out;
}

int proto_reader_end(struct proto_reader *r)
{
	if (!r->err && r->off != r->len)
		r->err = -EPROTO;
	return r->err;
}

/* ---- messages ----------------------------------------------------------- */

#define WRITER(name, b, c) struct proto_writer name = { .buf = (b), .cap = (c) }
#define FINISH(w) ((w).err ? (ssize_t)(w).err : (ssize_t)(w).len)

ssize_t proto_hello_encode(uint8_t *buf, size_t cap, const struct proto_hello *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->version);
	proto_put_u32(&w, m->features);
	proto_put_str(&w, m->release);
	return FINISH(w);
}

int proto_hello_decode(const uint8_t *p, size_t len, struct proto_hello *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->version = proto_get_u32(&r);
	m->features = proto_get_u32(&r);
	proto_get_str(&r, m->release, sizeof(m->release) - 1);
	return proto_reader_end(&r);
}

ssize_t proto_setup_encode(uint8_t *buf, size_t cap, const struct proto_setup *m)
{
	WRITER(w, buf, cap);
	if (m->entropy_len > PROTO_MAX_ENTROPY)
		return -E2BIG;
	proto_put_u64(&w, m->sec);
	proto_put_u32(&w, m->nsec);
	proto_put_bytes(&w, m->entropy, m->entropy_len);
	return FINISH(w);
}

int proto_setup_decode(const uint8_t *p, size_t len, struct proto_setup *m)
{
	struct proto_reader r;
	const uint8_t *e;

	proto_reader_init(&r, p, len);
	m->sec = proto_get_u64(&r);
	m->nsec = proto_get_u32(&r);
	e = proto_get_bytes(&r, PROTO_MAX_ENTROPY, &m->entropy_len);
	if (e)
		memcpy(m->entropy, e, m->entropy_len);
	if (m->nsec >= 1000000000u)
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

ssize_t proto_file_encode(uint8_t *buf, size_t cap, const struct proto_file *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->mode);
	proto_put_u64(&w, m->size);
	proto_put_str(&w, m->path);
	return FINISH(w);
}

int proto_file_decode(const uint8_t *p, size_t len, struct proto_file *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->mode = proto_get_u32(&r);
	m->size = proto_get_u64(&r);
	proto_get_str(&r, m->path, PROTO_MAX_PATH);
	if (!r.err && (m->mode & ~07777u || proto_abspath_ok(m->path)))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

ssize_t proto_exec_encode(uint8_t *buf, size_t cap, const struct proto_exec *m)
{
	WRITER(w, buf, cap);
	uint32_t i;

	if (m->argc > PROTO_MAX_ARGS || m->envc > PROTO_MAX_ENV)
		return -E2BIG;
	proto_put_u32(&w, m->flags);
	proto_put_u64(&w, m->output_cap);
	proto_put_u32(&w, m->uid);
	proto_put_u32(&w, m->gid);
	proto_put_str(&w, m->cwd);
	proto_put_u32(&w, m->argc);
	for (i = 0; i < m->argc; i++)
		proto_put_str(&w, m->argv[i]);
	proto_put_u32(&w, m->envc);
	for (i = 0; i < m->envc; i++)
		proto_put_str(&w, m->env[i]);
	if (m->flags & PROTO_EXEC_TTY) {
		proto_put_u32(&w, m->rows);
		proto_put_u32(&w, m->cols);
	}
	return FINISH(w);
}

/* Copy a string from the payload into the exec's own string buffer. */
static char *exec_take_str(struct proto_reader *r, struct proto_exec *m, size_t *used)
{
	size_t n;
	const uint8_t *p = proto_get_bytes(r, PROTO_MAX_PAYLOAD, &n);
	char *s;

	if (!p)
		return NULL;
	if (memchr(p, '\0', n) || sizeof(m->strbuf) - *used < n + 1) {
		r->err = -EPROTO;
		return NULL;
	}
	s = m->strbuf + *used;
	memcpy(s, p, n);
	s[n] = '\0';
	*used += n + 1;
	return s;
}

int proto_exec_decode(const uint8_t *p, size_t len, struct proto_exec *m)
{
	struct proto_reader r;
	size_t used = 0;
	uint32_t i;

	proto_reader_init(&r, p, len);
	m->flags = proto_get_u32(&r);
	m->output_cap = proto_get_u64(&r);
	m->uid = proto_get_u32(&r);
	m->gid = proto_get_u32(&r);
	proto_get_str(&r, m->cwd, PROTO_MAX_PATH);
	m->argc = proto_get_u32(&r);
	if (m->argc == 0 || m->argc > PROTO_MAX_ARGS)
		r.err = -EPROTO;
	for (i = 0; !r.err && i < m->argc; i++)
		m->argv[i] = exec_take_str(&r, m, &used);
	m->envc = r.err ? 0 : proto_get_u32(&r);
	if (m->envc > PROTO_MAX_ENV)
		r.err = -EPROTO;
	for (i = 0; !r.err && i < m->envc; i++) {
		m->env[i] = exec_take_str(&r, m, &used);
		/* Every entry is KEY=VALUE with a non-empty key. */
		if (m->env[i] && (m->env[i][0] == '=' || !strchr(m->env[i], '=')))
			r.err = -EPROTO;
	}
	m->rows = m->cols = 0;
	if (!r.err && (m->flags & PROTO_EXEC_TTY)) {
		m->rows = proto_get_u32(&r);
		m->cols = proto_get_u32(&r);
		if (m->rows < 1 || m->rows > PROTO_MAX_TTY_DIM || m->cols < 1 || m->cols > PROTO_MAX_TTY_DIM)
			r.err = -EPROTO;
	}
	if (!r.err && (m->argv[0][0] == '\0' || proto_abspath_ok(m->cwd) || m->flags & ~PROTO_EXEC_FLAGS))
		r.err = -EPROTO;
	/* The pre-started interpreter's stdin is not a pipe or a terminal of
	 * the task's: an interactive command is always exec'd. */
	if (!r.err && (m->flags & PROTO_EXEC_ZYGOTE) && (m->flags & (PROTO_EXEC_STDIN | PROTO_EXEC_TTY)))
		r.err = -EPROTO;
	/* The pre-started interpreter runs argv[1]: there must be one. */
	if (!r.err && (m->flags & PROTO_EXEC_ZYGOTE) && m->argc < 2)
		r.err = -EPROTO;
	/* Trailing bytes are an error too: check before deciding what to keep. */
	if (proto_reader_end(&r)) {
		m->argc = 0;
		m->envc = 0;
	}
	m->argv[m->argc] = NULL;
	m->env[m->envc] = NULL;
	return r.err;
}

ssize_t proto_exit_encode(uint8_t *buf, size_t cap, const struct proto_exit *m)
{
	WRITER(w, buf, cap);
	proto_put_u8(&w, m->how);
	proto_put_u32(&w, m->status);
	proto_put_u32(&w, m->flags);
	proto_put_u64(&w, m->run_us);
	proto_put_u64(&w, m->user_us);
	proto_put_u64(&w, m->sys_us);
	proto_put_u64(&w, m->maxrss_kib);
	proto_put_u64(&w, m->stdout_bytes);
	proto_put_u64(&w, m->stderr_bytes);
	return FINISH(w);
}

int proto_exit_decode(const uint8_t *p, size_t len, struct proto_exit *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->how = proto_get_u8(&r);
	m->status = proto_get_u32(&r);
	m->flags = proto_get_u32(&r);
	m->run_us = proto_get_u64(&r);
	m->user_us = proto_get_u64(&r);
	m->sys_us = proto_get_u64(&r);
	m->maxrss_kib = proto_get_u64(&r);
	m->stdout_bytes = proto_get_u64(&r);
	m->stderr_bytes = proto_get_u64(&r);
	if (!r.err) {
		if (m->how == PROTO_EXITED && m->status > 255)
			r.err = -EPROTO;
		else if (m->how == PROTO_SIGNALED && (m->status == 0 || m->status > 64))
			r.err = -EPROTO;
		else if (m->how != PROTO_EXITED && m->how != PROTO_SIGNALED)
			r.err = -EPROTO;
		else if (m->flags & ~(PROTO_EXIT_OOM | PROTO_EXIT_OUTPUT_LIMIT | PROTO_EXIT_KILLED | PROTO_EXIT_STDIN_LOST))
			r.err = -EPROTO;
	}
	return proto_reader_end(&r);
}

ssize_t proto_out_file_encode(uint8_t *buf, size_t cap, const struct proto_out_file *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->mode);
	proto_put_u64(&w, m->size);
	proto_put_str(&w, m->path);
	return FINISH(w);
}

int proto_out_file_decode(const uint8_t *p, size_t len, struct proto_out_file *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->mode = proto_get_u32(&r);
	m->size = proto_get_u64(&r);
	proto_get_str(&r, m->path, PROTO_MAX_PATH);
	if (!r.err && (m->mode & ~07777u || proto_relpath_ok(m->path)))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

ssize_t proto_out_end_encode(uint8_t *buf, size_t cap, const struct proto_out_end *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->files);
	proto_put_u32(&w, m->dirs);
	proto_put_u32(&w, m->skipped);
	proto_put_u32(&w, m->flags);
	return FINISH(w);
}

int proto_out_end_decode(const uint8_t *p, size_t len, struct proto_out_end *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->files = proto_get_u32(&r);
	m->dirs = proto_get_u32(&r);
	m->skipped = proto_get_u32(&r);
	m->flags = proto_get_u32(&r);
	if (!r.err && m->flags & ~PROTO_OUT_TRUNCATED)
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

ssize_t proto_error_encode(uint8_t *buf, size_t cap, const struct proto_error *m)
{
	WRITER(w, buf, cap);
	size_t n = strnlen(m->message, PROTO_MAX_MSG);

	proto_put_u32(&w, (uint32_t)m->code);
	proto_put_bytes(&w, m->message, n);
	return FINISH(w);
}

int proto_error_decode(const uint8_t *p, size_t len, struct proto_error *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->code = (int32_t)proto_get_u32(&r);
	proto_get_str(&r, m->message, PROTO_MAX_MSG);
	return proto_reader_end(&r);
}

ssize_t proto_resize_encode(uint8_t *buf, size_t cap, uint32_t rows, uint32_t cols)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, rows);
	proto_put_u32(&w, cols);
	return FINISH(w);
}

int proto_resize_decode(const uint8_t *p, size_t len, uint32_t *rows, uint32_t *cols)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	*rows = proto_get_u32(&r);
	*cols = proto_get_u32(&r);
	if (!r.err && (*rows < 1 || *rows > PROTO_MAX_TTY_DIM || *cols < 1 || *cols > PROTO_MAX_TTY_DIM))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

ssize_t proto_procs_encode(uint8_t *buf, size_t cap, uint32_t count, uint32_t pid)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, count);
	proto_put_u32(&w, pid);
	return FINISH(w);
}

int proto_procs_decode(const uint8_t *p, size_t len, uint32_t *count, uint32_t *pid)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	*count = proto_get_u32(&r);
	*pid = proto_get_u32(&r);
	/* A pid names one of the processes counted: none without a count. */
	if (!r.err && (*count == 0) != (*pid == 0))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

ssize_t proto_zdone_encode(char *buf, size_t cap, const struct proto_zdone *d)
{
	int n = snprintf(buf, cap, "X %u %llu %llu %llu\n", (unsigned)d->status, (unsigned long long)d->user_us,
			 (unsigned long long)d->sys_us, (unsigned long long)d->maxrss_kib);

	if (n < 0 || (size_t)n >= cap || n > PROTO_ZDONE_MAX)
		return -E2BIG;
	return n;
}

/* One decimal field of at most 15 digits, no leading zero, then `end`. */
static int zdone_field(const char **p, const char *lim, char end, uint64_t *v)
{
	const char *s = *p;
	int digits = 0;

	*v = 0;
	while (s < lim && *s >= '0' && *s <= '9') {
		if (++digits > 15 || (digits == 2 && *v == 0))
			return -EPROTO;
		*v = *v * 10 + (uint64_t)(*s - '0');
		s++;
	}
	if (!digits || s >= lim || *s != end)
		return -EPROTO;
	*p = s + 1;
	return 0;
}

int proto_zdone_decode(const char *p, size_t len, struct proto_zdone *d)
{
	const char *lim = p + len;
	uint64_t status;

	memset(d, 0, sizeof(*d));
	if (len < 2 || len > PROTO_ZDONE_MAX || p[0] != 'X' || p[1] != ' ')
		return -EPROTO;
	p += 2;
	if (zdone_field(&p, lim, ' ', &status) < 0 || status > 255 || zdone_field(&p, lim, ' ', &d->user_us) < 0 ||
	    zdone_field(&p, lim, ' ', &d->sys_us) < 0 || zdone_field(&p, lim, '\n', &d->maxrss_kib) < 0 || p != lim) {
		memset(d, 0, sizeof(*d));
		return -EPROTO;
	}
	d->status = (uint32_t)status;
	return 0;
}

int proto_path_decode(const uint8_t *p, size_t len, char *out)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	proto_get_str(&r, out, PROTO_MAX_PATH);
	if (!r.err && proto_relpath_ok(out))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

/* ---- paths -------------------------------------------------------------- */

/* Components separated by single '/', none empty, '.' or '..', each at most
 * 255 bytes (NAME_MAX). */
static int components_ok(const char *s)
{
	const char *c = s;

	for (;;) {
		const char *e = strchr(c, '/');
		size_t n = e ? (size_t)(e - c) : strlen(c);

		if (n == 0 || n > 255)
			return -EINVAL;
		if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return -EINVAL;
		if (!e)
			return 0;
		c = e + 1;
	}
}

int proto_relpath_ok(const char *path)
{
	size_t n = strnlen(path, PROTO_MAX_PATH + 1);

	if (n == 0 || n > PROTO_MAX_PATH || path[0] == '/')
		return -EINVAL;
	return components_ok(path);
}

int proto_abspath_ok(const char *path)
{
	size_t n = strnlen(path, PROTO_MAX_PATH + 1);

	if (n == 0 || n > PROTO_MAX_PATH || path[0] != '/')
		return -EINVAL;
	if (n == 1)
		return 0; /* "/" itself */
	return components_ok(path + 1);
}

/* ---- I/O ---------------------------------------------------------------- */

int proto_write_all(int fd, const void *buf, size_t n, int64_t deadline_ms)
{
	return io_write_all_deadline(fd, buf, n, deadline_ms);
}

#define PROTO_SMALL_FRAME 4096

int proto_send(int fd, uint8_t type, const void *payload, size_t len, int64_t deadline_ms)
{
	uint8_t hdr[PROTO_HDR_SIZE];
	int r;

	if (len > PROTO_MAX_PAYLOAD)
		return -EMSGSIZE;
	if (len <= PROTO_SMALL_FRAME - PROTO_HDR_SIZE) {
		/* One write for a small frame: a per-file header on the way out of
		 * /output is two syscalls and two wake-ups of the reader otherwise. */
		uint8_t frame[PROTO_SMALL_FRAME];

		proto_frame_header(frame, type, (uint32_t)len);
		if (len)
			memcpy(frame + PROTO_HDR_SIZE, payload, len);
		return proto_write_all(fd, frame, PROTO_HDR_SIZE + len, deadline_ms);
	}
	proto_frame_header(hdr, type, (uint32_t)len);
	r = proto_write_all(fd, hdr, sizeof(hdr), deadline_ms);
	if (r == 0)
		r = proto_write_all(fd, payload, len, deadline_ms);
	return r;
}
