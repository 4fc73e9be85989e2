/* eproto: message codecs for the guest envd protocol (lib/eproto.h,
 * docs/e2b.md). Built on lib/proto's bounded readers and writers: every
 * decoder checks each length against the remaining payload and a fixed
 * bound, refuses NULs inside strings, unknown flags and trailing bytes. */
#include "eproto.h"

#include <errno.h>
#include <string.h>

#define WRITER(name, b, c) struct proto_writer name = { .buf = (b), .cap = (c) }

static ssize_t writer_done(const struct proto_writer *w)
{
	return w->err ? w->err : (ssize_t)w->len;
}

/* Copy a length-prefixed string of at most max bytes into the message's
 * strbuf (NUL-terminated) and return it; NULL (r->err set) when it is too
 * long, holds a NUL or does not fit what is left of strbuf. */
static const char *take_str(struct proto_reader *r, char *strbuf, size_t cap, size_t *used, size_t max)
{
	size_t n;
	const uint8_t *p = proto_get_bytes(r, max, &n);
	char *out;

	if (!p)
		return NULL;
	if (memchr(p, '\0', n) || cap - *used < n + 1) {
		r->err = -EPROTO;
		return NULL;
	}
	out = strbuf + *used;
	memcpy(out, p, n);
	out[n] = '\0';
	*used += n + 1;
	return out;
}

/* KEY=VALUE with a non-empty key. */
static int env_ok(const char *s)
{
	return s && s[0] != '=' && strchr(s, '=') != NULL;
}

/* A user name: 1-32 bytes of [A-Za-z0-9._-], not starting with '-', or "". */
static int user_ok(const char *s)
{
	size_t i;

	if (s[0] == '-')
		return 0;
	for (i = 0; s[i]; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-'))
			return 0;
	}
	return i <= EPROTO_MAX_USER;
}

static void put_strv(struct proto_writer *w, uint32_t n, const char *const *v)
{
	uint32_t i;

	proto_put_u32(w, n);
	for (i = 0; i < n; i++)
		proto_put_str(w, v[i] ? v[i] : "");
}

/* The argv and env that end START and PROC, then the frame's length (or
 * the writer's error): end_argv_env's counterpart. */
static ssize_t end_put_argv_env(struct proto_writer *w, uint32_t argc, const char *const *argv, uint32_t envc,
				const char *const *env)
{
	put_strv(w, argc, argv);
	put_strv(w, envc, env);
	return writer_done(w);
}

/* argc/argv then envc/env, into the message's strbuf. */
static void take_argv_env(struct proto_reader *r, char *strbuf, size_t *used, uint32_t *argc, const char **argv,
			  uint32_t *envc, const char **env)
{
	uint32_t i;

	*argc = proto_get_u32(r);
	if (*argc == 0 || *argc > PROTO_MAX_ARGS)
		r->err = -EPROTO;
	for (i = 0; !r->err && i < *argc; i++)
		argv[i] = take_str(r, strbuf, PROTO_MAX_PAYLOAD, used, PROTO_MAX_PAYLOAD);
	*envc = r->err ? 0 : proto_get_u32(r);
	if (*envc > PROTO_MAX_ENV)
		r->err = -EPROTO;
	for (i = 0; !r->err && i < *envc; i++) {
		env[i] = take_str(r, strbuf, PROTO_MAX_PAYLOAD, used, PROTO_MAX_PAYLOAD);
		if (!r->err && !env_ok(env[i]))
			r->err = -EPROTO;
	}
	if (!r->err && argv[0][0] == '\0')
		r->err = -EPROTO;
	if (r->err)
		*argc = *envc = 0;
	argv[*argc] = NULL;
	env[*envc] = NULL;
}

/* The argv and env that end START and PROC, then the end of the payload:
 * r's error; on an error argc and envc are 0 and the vectors empty. */
static int end_argv_env(struct proto_reader *r, char *strbuf, size_t *used, uint32_t *argc, const char **argv,
			uint32_t *envc, const char **env)
{
	*argc = *envc = 0;
	if (!r->err)
		take_argv_env(r, strbuf, used, argc, argv, envc, env);
	if (proto_reader_end(r)) {
		*argc = *envc = 0;
		argv[0] = env[0] = NULL;
	}
	return r->err;
}

/* ---- START -------------------------------------------------------------- */

ssize_t eproto_start_encode(uint8_t *buf, size_t cap, const struct eproto_start *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->req);
	proto_put_u32(&w, m->flags);
	proto_put_u32(&w, m->rows);
	proto_put_u32(&w, m->cols);
	proto_put_str(&w, m->user ? m->user : "");
	proto_put_str(&w, m->cwd ? m->cwd : "");
	proto_put_str(&w, m->tag ? m->tag : "");
	return end_put_argv_env(&w, m->argc, m->argv, m->envc, m->env);
}

int eproto_start_decode(const uint8_t *p, size_t len, struct eproto_start *m)
{
	struct proto_reader r;
	size_t used = 0;

	proto_reader_init(&r, p, len);
	m->req = proto_get_u32(&r);
	m->flags = proto_get_u32(&r);
	m->rows = proto_get_u32(&r);
	m->cols = proto_get_u32(&r);
	m->user = take_str(&r, m->strbuf, sizeof(m->strbuf), &used, EPROTO_MAX_USER);
	m->cwd = take_str(&r, m->strbuf, sizeof(m->strbuf), &used, PROTO_MAX_PATH);
	m->tag = take_str(&r, m->strbuf, sizeof(m->strbuf), &used, EPROTO_MAX_TAG);
	if (!r.err && (m->flags & ~EP_START_FLAGS || !user_ok(m->user)))
		r.err = -EPROTO;
	if (!r.err && (m->flags & EP_START_PTY) &&
	    (m->rows < 1 || m->rows > PROTO_MAX_TTY_DIM || m->cols < 1 || m->cols > PROTO_MAX_TTY_DIM))
		r.err = -EPROTO;
	if (!r.err && !(m->flags & EP_START_PTY) && (m->rows || m->cols))
		r.err = -EPROTO;
	return end_argv_env(&r, m->strbuf, &used, &m->argc, m->argv, &m->envc, m->env);
}

/* ---- PROC (a LIST row) -------------------------------------------------- */

ssize_t eproto_proc_encode(uint8_t *buf, size_t cap, const struct eproto_proc *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->req);
	proto_put_u32(&w, m->pid);
	proto_put_u32(&w, m->flags);
	proto_put_str(&w, m->tag ? m->tag : "");
	proto_put_str(&w, m->cwd ? m->cwd : "");
	return end_put_argv_env(&w, m->argc, m->argv, m->envc, m->env);
}

int eproto_proc_decode(const uint8_t *p, size_t len, struct eproto_proc *m)
{
	struct proto_reader r;
	size_t used = 0;

	proto_reader_init(&r, p, len);
	m->req = proto_get_u32(&r);
	m->pid = proto_get_u32(&r);
	m->flags = proto_get_u32(&r);
	m->tag = take_str(&r, m->strbuf, sizeof(m->strbuf), &used, EPROTO_MAX_TAG);
	m->cwd = take_str(&r, m->strbuf, sizeof(m->strbuf), &used, PROTO_MAX_PATH);
	if (!r.err && (m->flags & ~EP_START_FLAGS || m->pid == 0))
		r.err = -EPROTO;
	return end_argv_env(&r, m->strbuf, &used, &m->argc, m->argv, &m->envc, m->env);
}

/* ---- ENTRY -------------------------------------------------------------- */

ssize_t eproto_entry_encode(uint8_t *buf, size_t cap, const struct eproto_entry *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->req);
	proto_put_u8(&w, m->type);
	proto_put_u32(&w, m->mode);
	proto_put_u64(&w, m->size);
	proto_put_u32(&w, m->uid);
	proto_put_u32(&w, m->gid);
	proto_put_u64(&w, (uint64_t)m->mtime_sec);
	proto_put_u32(&w, m->mtime_nsec);
	proto_put_str(&w, m->owner);
	proto_put_str(&w, m->group);
	proto_put_str(&w, m->name);
	proto_put_str(&w, m->path);
	proto_put_str(&w, m->target);
	if (m->meta_len)
		proto_put_bytes(&w, m->meta, m->meta_len);
	return writer_done(&w);
}

/* An optional trailing metadata set (ENTRY, WRITE): read when bytes are
 * left, checked, copied into meta. */
static void take_meta(struct proto_reader *r, char meta[EPROTO_MAX_META], uint32_t *meta_len)
{
	const uint8_t *p;
	size_t n;

	*meta_len = 0;
	if (r->err || r->off >= r->len)
		return;
	p = proto_get_bytes(r, EPROTO_MAX_META, &n);
	if (!p)
		return;
	if (n == 0 || eproto_meta_check((const char *)p, n) < 0) {
		r->err = -EPROTO;
		return;
	}
	memcpy(meta, p, n);
	*meta_len = (uint32_t)n;
}

int eproto_entry_decode(const uint8_t *p, size_t len, struct eproto_entry *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->req = proto_get_u32(&r);
	m->type = proto_get_u8(&r);
	m->mode = proto_get_u32(&r);
	m->size = proto_get_u64(&r);
	m->uid = proto_get_u32(&r);
	m->gid = proto_get_u32(&r);
	m->mtime_sec = (int64_t)proto_get_u64(&r);
	m->mtime_nsec = proto_get_u32(&r);
	proto_get_str(&r, m->owner, EPROTO_MAX_USER);
	proto_get_str(&r, m->group, EPROTO_MAX_USER);
	proto_get_str(&r, m->name, sizeof(m->name) - 1);
	proto_get_str(&r, m->path, PROTO_MAX_PATH);
	proto_get_str(&r, m->target, PROTO_MAX_PATH);
	take_meta(&r, m->meta, &m->meta_len);
	/* The guest is hostile: a type out of range, a nanosecond field past a
	 * second, a size past what a signed 64-bit JSON string may say, or a
	 * name with a slash is refused here, once, for every user. */
	if (!r.err && (m->type < EP_FILE || m->type > EP_OTHER || m->mtime_nsec >= 1000000000u ||
		       m->size > (uint64_t)INT64_MAX || strchr(m->name, '/') || (m->path[0] && m->path[0] != '/')))
		r.err = -EPROTO;
	proto_reader_end(&r);
	if (r.err)
		memset(m, 0, sizeof(*m));
	return r.err;
}

/* ---- file-system requests ----------------------------------------------- */

enum eproto_fs_kind eproto_fs_kind_of(uint8_t type)
{
	switch (type) {
	case EP_STAT:
	case EP_LISTDIR:
	case EP_MKDIR:
	case EP_MOVE:
	case EP_REMOVE:
	case EP_READ:
	case EP_WRITE:
		return EPROTO_FS_REQ;
	case EP_WDATA:
	case EP_WEND:
	case EP_CANCEL:
		return EPROTO_FS_FOLLOW;
	default:
		return EPROTO_FS_NONE;
	}
}

static int fsreq_type_ok(uint8_t type)
{
	return eproto_fs_kind_of(type) == EPROTO_FS_REQ;
}

ssize_t eproto_fsreq_encode(uint8_t *buf, size_t cap, uint8_t type, const struct eproto_fsreq *m)
{
	WRITER(w, buf, cap);

	if (!fsreq_type_ok(type))
		return -EINVAL;
	proto_put_u32(&w, m->req);
	proto_put_str(&w, m->user);
	proto_put_str(&w, m->path);
	if (type == EP_MOVE)
		proto_put_str(&w, m->path2);
	if (type == EP_LISTDIR)
		proto_put_u32(&w, m->depth);
	if (type == EP_WRITE && m->meta_len)
		proto_put_bytes(&w, m->meta, m->meta_len);
	return writer_done(&w);
}

int eproto_fsreq_decode(const uint8_t *p, size_t len, uint8_t type, struct eproto_fsreq *m)
{
	struct proto_reader r;

	m->req = m->depth = m->meta_len = 0;
	m->user[0] = m->path[0] = m->path2[0] = '\0';
	if (!fsreq_type_ok(type))
		return -EPROTO;
	proto_reader_init(&r, p, len);
	m->req = proto_get_u32(&r);
	proto_get_str(&r, m->user, EPROTO_MAX_USER);
	proto_get_str(&r, m->path, PROTO_MAX_PATH);
	if (type == EP_MOVE)
		proto_get_str(&r, m->path2, PROTO_MAX_PATH);
	if (type == EP_LISTDIR) {
		m->depth = proto_get_u32(&r);
		if (!r.err && (m->depth < 1 || m->depth > 16))
			r.err = -EPROTO;
	}
	if (type == EP_WRITE)
		take_meta(&r, m->meta, &m->meta_len);
	if (!r.err && (!user_ok(m->user) || m->path[0] == '\0' || (type == EP_MOVE && m->path2[0] == '\0')))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

/* ---- metadata pairs ------------------------------------------------------ */

static int meta_text_ok(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
			return 0;
	return 1;
}

int eproto_meta_next(const char *p, size_t n, size_t *off, const char **key, const char **val)
{
	const char *k, *v, *e;

	if (*off >= n)
		return 0;
	k = p + *off;
	v = memchr(k, '\0', n - *off);
	if (!v)
		return 0;
	v++;
	e = v < p + n ? memchr(v, '\0', (size_t)(p + n - v)) : NULL;
	if (!e)
		return 0;
	*key = k;
	*val = v;
	*off = (size_t)(e + 1 - p);
	return 1;
}

int eproto_meta_check(const char *p, size_t n)
{
	size_t off = 0, cost = 0;
	const char *k, *v;

	if (n > EPROTO_MAX_META || (n && p[n - 1] != '\0'))
		return -EPROTO;
	while (off < n) {
		size_t start = off, kl, vl, o2 = 0;
		const char *k2, *v2;

		if (!eproto_meta_next(p, n, &off, &k, &v))
			return -EPROTO; /* an odd number of strings */
		kl = strlen(k);
		vl = strlen(v);
		if (kl == 0 || kl > EPROTO_MAX_META_KEY || !meta_text_ok(k, kl) || !meta_text_ok(v, vl))
			return -EPROTO;
		cost += strlen(EPROTO_META_XATTR) + kl + vl;
		if (cost > EPROTO_MAX_META)
			return -EPROTO;
		/* Each key once (at most a few hundred pairs fit the budget). */
		while (o2 < start && eproto_meta_next(p, start, &o2, &k2, &v2))
			if (!strcmp(k2, k))
				return -EPROTO;
	}
	return 0;
}

int eproto_meta_add(char *buf, uint32_t *len, const char *key, size_t klen, const char *val, size_t vlen)
{
	size_t off = 0, cost = strlen(EPROTO_META_XATTR) + klen + vlen;
	const char *k, *v;

	if (klen == 0 || klen > EPROTO_MAX_META_KEY || !meta_text_ok(key, klen) || !meta_text_ok(val, vlen))
		return -EINVAL;
	while (eproto_meta_next(buf, *len, &off, &k, &v)) {
		if (strlen(k) == klen && !memcmp(k, key, klen))
			return -EINVAL;
		cost += strlen(EPROTO_META_XATTR) + strlen(k) + strlen(v);
	}
	if (cost > EPROTO_MAX_META || *len + klen + vlen + 2 > EPROTO_MAX_META)
		return -E2BIG;
	memcpy(buf + *len, key, klen);
	buf[*len + klen] = '\0';
	memcpy(buf + *len + klen + 1, val, vlen);
	buf[*len + klen + 1 + vlen] = '\0';
	*len += (uint32_t)(klen + vlen + 2);
	return 0;
}

/* ---- small fixed messages ------------------------------------------------ */

ssize_t eproto_u32s_encode(uint8_t *buf, size_t cap, const uint32_t *v, unsigned n)
{
	WRITER(w, buf, cap);
	unsigned i;

	for (i = 0; i < n; i++)
		proto_put_u32(&w, v[i]);
	return writer_done(&w);
}

int eproto_u32s_decode(const uint8_t *p, size_t len, uint32_t *v, unsigned n)
{
	struct proto_reader r;
	unsigned i;

	proto_reader_init(&r, p, len);
	for (i = 0; i < n; i++)
		v[i] = proto_get_u32(&r);
	return proto_reader_end(&r);
}

int eproto_idraw_decode(const uint8_t *p, size_t len, uint32_t *id, const uint8_t **raw, size_t *n)
{
	*raw = NULL;
	*n = 0;
	if (len < 4 || len - 4 > EPROTO_MAX_CHUNK)
		return -EPROTO;
	*id = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
	*raw = p + 4;
	*n = len - 4;
	return 0;
}

ssize_t eproto_idraw_encode(uint8_t *buf, size_t cap, uint32_t id, const void *raw, size_t n)
{
	WRITER(w, buf, cap);

	if (n > EPROTO_MAX_CHUNK)
		return -EINVAL;
	proto_put_u32(&w, id);
	if (!w.err && cap - w.len < n)
		w.err = -ENOSPC;
	if (!w.err && n) {
		memcpy(buf + w.len, raw, n);
		w.len += n;
	}
	return writer_done(&w);
}

ssize_t eproto_ports_encode(uint8_t *buf, size_t cap, uint32_t req, const uint16_t *ports, uint32_t n)
{
	WRITER(w, buf, cap);
	uint32_t i;

	if (n > EPROTO_MAX_PORTS)
		return -EINVAL;
	proto_put_u32(&w, req);
	proto_put_u32(&w, n);
	for (i = 0; i < n; i++)
		proto_put_u32(&w, ports[i]);
	return writer_done(&w);
}

int eproto_ports_decode(const uint8_t *p, size_t len, uint32_t *req, uint16_t ports[EPROTO_MAX_PORTS], uint32_t *n)
{
	struct proto_reader r;
	uint32_t i, v;

	proto_reader_init(&r, p, len);
	*req = proto_get_u32(&r);
	*n = proto_get_u32(&r);
	if (!r.err && *n > EPROTO_MAX_PORTS)
		r.err = -EPROTO;
	for (i = 0; !r.err && i < *n; i++) {
		v = proto_get_u32(&r);
		if (!r.err && (v < 1 || v > 65535))
			r.err = -EPROTO;
		ports[i] = (uint16_t)v;
	}
	if (r.err)
		*n = 0;
	return proto_reader_end(&r);
}

ssize_t eproto_out_encode(uint8_t *buf, size_t cap, uint32_t pid, uint8_t stream, const void *raw, size_t n)
{
	WRITER(w, buf, cap);

	if (n > EPROTO_MAX_CHUNK)
		return -EINVAL;
	proto_put_u32(&w, pid);
	proto_put_u8(&w, stream);
	if (!w.err && cap - w.len < n)
		w.err = -ENOSPC;
	if (!w.err && n) {
		memcpy(buf + w.len, raw, n);
		w.len += n;
	}
	return writer_done(&w);
}

int eproto_out_decode(const uint8_t *p, size_t len, uint32_t *pid, uint8_t *stream, const uint8_t **raw, size_t *n)
{
	*raw = NULL;
	*n = 0;
	if (len < 5 || len - 5 > EPROTO_MAX_CHUNK)
		return -EPROTO;
	*pid = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
	*stream = p[4];
	if (*stream < EP_STDOUT || *stream > EP_PTY || *pid == 0)
		return -EPROTO;
	*raw = p + 5;
	*n = len - 5;
	return 0;
}

ssize_t eproto_end_encode(uint8_t *buf, size_t cap, uint32_t pid, uint8_t how, uint32_t status)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, pid);
	proto_put_u8(&w, how);
	proto_put_u32(&w, status);
	return writer_done(&w);
}

int eproto_end_decode(const uint8_t *p, size_t len, uint32_t *pid, uint8_t *how, uint32_t *status)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	*pid = proto_get_u32(&r);
	*how = proto_get_u8(&r);
	*status = proto_get_u32(&r);
	if (!r.err && (*pid == 0 || (*how == PROTO_EXITED && *status > 255) ||
		       (*how == PROTO_SIGNALED && (*status < 1 || *status > 64)) ||
		       (*how != PROTO_EXITED && *how != PROTO_SIGNALED)))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

ssize_t eproto_error_encode(uint8_t *buf, size_t cap, uint32_t req, int32_t code, const char *msg)
{
	WRITER(w, buf, cap);
	size_t n = strlen(msg);

	proto_put_u32(&w, req);
	proto_put_u32(&w, (uint32_t)code);
	/* A message is cut at the bound rather than refused: an error must get out. */
	proto_put_bytes(&w, msg, n > PROTO_MAX_MSG ? PROTO_MAX_MSG : n);
	return writer_done(&w);
}

int eproto_error_decode(const uint8_t *p, size_t len, uint32_t *req, int32_t *code, char msg[PROTO_MAX_MSG + 1])
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	*req = proto_get_u32(&r);
	*code = (int32_t)proto_get_u32(&r);
	proto_get_str(&r, msg, PROTO_MAX_MSG);
	/* Codes are negative errnos: anything else would read as success. */
	if (!r.err && (*code >= 0 || *code < -4095))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}

/* ---- watches ------------------------------------------------------------- */

ssize_t eproto_watch_encode(uint8_t *buf, size_t cap, const struct eproto_watch *m)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, m->req);
	proto_put_u32(&w, m->id);
	proto_put_u32(&w, m->flags);
	proto_put_str(&w, m->user);
	proto_put_str(&w, m->path);
	return writer_done(&w);
}

int eproto_watch_decode(const uint8_t *p, size_t len, struct eproto_watch *m)
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	m->req = proto_get_u32(&r);
	m->id = proto_get_u32(&r);
	m->flags = proto_get_u32(&r);
	proto_get_str(&r, m->user, EPROTO_MAX_USER);
	proto_get_str(&r, m->path, PROTO_MAX_PATH);
	if (!r.err && (m->flags & ~EP_WATCH_FLAGS || !user_ok(m->user) || m->path[0] == '\0'))
		r.err = -EPROTO;
	if (proto_reader_end(&r)) {
		m->user[0] = m->path[0] = '\0';
		m->flags = 0;
	}
	return r.err;
}

ssize_t eproto_wevent_encode(uint8_t *buf, size_t cap, uint32_t id, uint8_t event, const char *name)
{
	WRITER(w, buf, cap);
	proto_put_u32(&w, id);
	proto_put_u8(&w, event);
	proto_put_str(&w, name);
	return writer_done(&w);
}

int eproto_wevent_decode(const uint8_t *p, size_t len, uint32_t *id, uint8_t *event, char name[PROTO_MAX_PATH + 1])
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	*id = proto_get_u32(&r);
	*event = proto_get_u8(&r);
	proto_get_str(&r, name, PROTO_MAX_PATH);
	/* The guest names what changed under the watched directory: never an
	 * absolute path or one that climbs out of it. */
	if (!r.err && (*event < EP_WEV_CREATE || *event > EP_WEV_CHMOD || (strcmp(name, ".") && proto_relpath_ok(name))))
		r.err = -EPROTO;
	if (proto_reader_end(&r))
		name[0] = '\0';
	return r.err;
}

ssize_t eproto_wend_encode(uint8_t *buf, size_t cap, uint32_t id, int32_t code, const char *msg)
{
	WRITER(w, buf, cap);
	size_t n = strlen(msg);

	proto_put_u32(&w, id);
	proto_put_u32(&w, (uint32_t)code);
	proto_put_bytes(&w, msg, n > PROTO_MAX_MSG ? PROTO_MAX_MSG : n);
	return writer_done(&w);
}

int eproto_wend_decode(const uint8_t *p, size_t len, uint32_t *id, int32_t *code, char msg[PROTO_MAX_MSG + 1])
{
	struct proto_reader r;

	proto_reader_init(&r, p, len);
	*id = proto_get_u32(&r);
	*code = (int32_t)proto_get_u32(&r);
	proto_get_str(&r, msg, PROTO_MAX_MSG);
	if (!r.err && (*code > 0 || *code < -4095))
		r.err = -EPROTO;
	return proto_reader_end(&r);
}
