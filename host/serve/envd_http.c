/* envd_http: the E2B-compatible envd endpoints of kiln-host (see
 * envd_http.h). Connect's JSON codec as @connectrpc/connect 2.x expects it:
 * unary calls answer application/json (errors: the code's HTTP status and
 * {"code","message"}); server streams answer 200 application/connect+json
 * with 5-byte envelopes, the last one the end-of-stream message (flag 0x02,
 * {} or {"error":{...}}). Protobuf JSON: lowerCamelCase names, int64 as
 * strings, bytes as base64, enums as names, default values left out.
 *
 * Every request body and query comes from a client: each field is checked
 * (type, length, characters) before it reaches the guest, whose answers are
 * decoded by lib/eproto's checked decoders (envd.c). */
#include "envd_http.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "buf.h"
#include "connect.h"
#include "connect_call.h"
#include "envd/envd.h"
#include "eproto.h"
#include "multipart.h"
#include "proto.h"
#include "reply.h"
#include "session/session.h"

#define UNARY_DEFAULT_MS   60000   /* a unary call without Connect-Timeout-Ms */
#define STREAM_KEEPALIVE_S 50      /* without Keepalive-Ping-Interval */
#define UPLOAD_STALL_MS    120000  /* the guest takes no upload bytes for this long */
#define STREAM_BLOCK       (256u << 10)
#define MAX_MSG            (4u << 20) /* a Connect request message */

/* ---- small helpers ---------------------------------------------------------- */

static int64_t now_ms(void)
{
	return proto_now_ms();
}

static const char *header(struct MHD_Connection *c, const char *name)
{
	return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

static const char *query(struct MHD_Connection *c, const char *name)
{
	return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

static void eset(struct envd_err *e, enum connect_code c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void eset(struct envd_err *e, enum connect_code c, const char *fmt, ...)
{
	va_list ap;

	e->code = c;
	e->errnum = 0;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
}

/* A unary Connect error: the code's status, {"code","message"}. */
static enum MHD_Result unary_error(struct MHD_Connection *conn, const struct envd_err *e)
{
	return reply_json(conn, connect_code_status(e->code), connect_error_json(e->code, e->msg));
}

static enum connect_code code_from_kiln(const struct kiln_err *k)
{
	switch (k->errc) {
	case KERR_NOT_FOUND:
		return CONNECT_NOT_FOUND;
	case KERR_UNAVAILABLE:
		return CONNECT_UNAVAILABLE;
	default:
		return CONNECT_INTERNAL;
	}
}

/* The E2B user: E2b-Authorization (kiln-api relays the SDK's Authorization
 * under it) or Authorization, "Basic base64(NAME:)"; "" (the default user)
 * when neither carries one. -1 for a malformed one. */
static int auth_user(struct MHD_Connection *conn, char user[EPROTO_MAX_USER + 1])
{
	const char *h = header(conn, "E2b-Authorization");
	uint8_t *dec = NULL;
	size_t n = 0, i;

	user[0] = '\0';
	if (!h) {
		h = header(conn, MHD_HTTP_HEADER_AUTHORIZATION);
		if (!h || strncasecmp(h, "Basic ", 6))
			return 0;
	}
	if (strncasecmp(h, "Basic ", 6))
		return -1;
	if (connect_b64_decode(h + 6, 256, &dec, &n) < 0)
		return -1;
	for (i = 0; i < n && dec[i] != ':'; i++)
		;
	if (i > EPROTO_MAX_USER) {
		free(dec);
		return -1;
	}
	memcpy(user, dec, i);
	user[i] = '\0';
	free(dec);
	for (i = 0; user[i]; i++)
		if (!(isalnum((unsigned char)user[i]) || user[i] == '.' || user[i] == '_' || user[i] == '-'))
			return -1;
	return user[0] == '-' ? -1 : 0;
}

static int user_name_ok(const char *u)
{
	size_t n = strlen(u);

	if (n > EPROTO_MAX_USER || u[0] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!(isalnum((unsigned char)u[i]) || u[i] == '.' || u[i] == '_' || u[i] == '-'))
			return 0;
	return 1;
}

/* A JSON string field: NULL when absent; *bad when present but not a
 * string, holding a NUL, or longer than max. */
static const char *jstr(json_t *o, const char *k, size_t max, int *bad)
{
	json_t *v = json_object_get(o, k);

	if (!v || json_is_null(v))
		return NULL;
	if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
	    json_string_length(v) > max) {
		*bad = 1;
		return NULL;
	}
	return json_string_value(v);
}

/* A uint32 field given as a number or a numeric string. */
static int juint(json_t *o, const char *k, uint32_t *out, int *bad)
{
	json_t *v = json_object_get(o, k);
	char *end;
	unsigned long long x;

	if (!v || json_is_null(v))
		return 0;
	if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 0xffffffffll) {
		*out = (uint32_t)json_integer_value(v);
		return 1;
	}
	if (json_is_string(v) && isdigit((unsigned char)json_string_value(v)[0])) {
		errno = 0;
		x = strtoull(json_string_value(v), &end, 10);
		if (!*end && !errno && x <= 0xffffffffull) {
			*out = (uint32_t)x;
			return 1;
		}
	}
	*bad = 1;
	return 0;
}

/* ---- the request message ---------------------------------------------------- */

/* The request's one message: the JSON body of a unary call, or the single
 * envelope of a server-stream call (its Content-Type was checked by
 * envd_http_rpc). NULL with e set. */
static json_t *request_json(struct httpd_req *r, int stream, struct envd_err *e)
{
	const uint8_t *body = (const uint8_t *)httpd_body_data(r->body), *msg;
	size_t len = httpd_body_len(r->body), mlen;
	json_error_t je;
	json_t *j;

	if (!body)
		body = (const uint8_t *)"";
	if (stream) {
		uint8_t flags;
		ssize_t n;

		n = connect_env_parse(body, len, MAX_MSG, &flags, &msg, &mlen);
		if (n <= 0 || (size_t)n != len || (flags & CONNECT_FLAG_COMPRESSED) || (flags & CONNECT_FLAG_END)) {
			eset(e, CONNECT_INVALID_ARGUMENT, "the request is not one uncompressed Connect envelope");
			return NULL;
		}
	} else {
		msg = body;
		mlen = len;
	}
	j = json_loadb((const char *)msg, mlen, JSON_REJECT_DUPLICATES, &je);
	if (!mlen && !j)
		j = json_object();
	if (!j || !json_is_object(j)) {
		json_decref(j);
		eset(e, CONNECT_INVALID_ARGUMENT, "the request message is not a JSON object");
		return NULL;
	}
	return j;
}

/* The session's channel, or NULL with e set. */
static struct envd *channel(struct session_table *ss, const char *id, json_t **env, struct envd_err *e)
{
	struct kiln_err k = { .code = "" };
	struct envd *ch;

	if (strlen(id) >= 80) {
		eset(e, CONNECT_NOT_FOUND, "no such sandbox");
		return NULL;
	}
	ch = session_envd(ss, id, env, &k);
	if (!ch)
		eset(e, code_from_kiln(&k), "%s", k.message);
	return ch;
}

/* ---- entries ------------------------------------------------------------------ */

/* Go's os.FileMode.String() of st_mode, which E2B's envd reports. */
static void mode_string(uint32_t m, char out[16])
{
	static const char rwx[] = "rwxrwxrwx";
	size_t n = 0;

	if (S_ISDIR(m))
		out[n++] = 'd';
	else if (S_ISLNK(m))
		out[n++] = 'L';
	else if (S_ISFIFO(m))
		out[n++] = 'p';
	else if (S_ISSOCK(m))
		out[n++] = 'S';
	else if (S_ISBLK(m))
		out[n++] = 'D';
	else if (S_ISCHR(m)) {
		out[n++] = 'D';
		out[n++] = 'c';
	}
	if (m & S_ISUID)
		out[n++] = 'u';
	if (m & S_ISGID)
		out[n++] = 'g';
	if (m & S_ISVTX)
		out[n++] = 't';
	if (!n)
		out[n++] = '-';
	for (int i = 0; i < 9; i++)
		out[n++] = (m & (1u << (8 - i))) ? rwx[i] : '-';
	out[n] = '\0';
}

static json_t *entry_json(const struct eproto_entry *en)
{
	static const char *const types[] = { NULL, "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY", "FILE_TYPE_SYMLINK", NULL };
	char perm[16], ts[64], size[24];
	struct tm tm;
	time_t t = (time_t)en->mtime_sec;
	json_t *j = json_object();

	mode_string(en->mode, perm);
	gmtime_r(&t, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	if (en->mtime_nsec && en->mtime_nsec < 1000000000u)
		snprintf(ts + strlen(ts), sizeof(ts) - strlen(ts), ".%09u", en->mtime_nsec);
	strcat(ts, "Z");
	snprintf(size, sizeof(size), "%llu", (unsigned long long)en->size);
	json_object_set_new(j, "name", json_string(en->name));
	if (en->type < 5 && types[en->type])
		json_object_set_new(j, "type", json_string(types[en->type]));
	json_object_set_new(j, "path", json_string(en->path));
	if (en->size)
		json_object_set_new(j, "size", json_string(size));
	if (en->mode & 07777)
		json_object_set_new(j, "mode", json_integer(en->mode & 07777));
	json_object_set_new(j, "permissions", json_string(perm));
	if (en->owner[0])
		json_object_set_new(j, "owner", json_string(en->owner));
	if (en->group[0])
		json_object_set_new(j, "group", json_string(en->group));
	json_object_set_new(j, "modifiedTime", json_string(ts));
	if (en->target[0])
		json_object_set_new(j, "symlinkTarget", json_string(en->target));
	return j;
}

/* ---- one guest request with replies ------------------------------------------- */

/* A file-system request (STAT, LISTDIR, MKDIR, MOVE, REMOVE, READ, WRITE). */
static struct envd_req *fs_begin(struct envd *ch, uint8_t type, const char *user, const char *path, const char *path2,
				 uint32_t depth, int64_t deadline, struct envd_err *e)
{
	struct eproto_fsreq *q = calloc(1, sizeof(*q));
	uint8_t *buf = malloc(PROTO_MAX_PAYLOAD);
	struct envd_req *r = NULL;
	ssize_t n;

	if (!q || !buf) {
		eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	if (!path || !*path || strlen(path) > PROTO_MAX_PATH || (path2 && (!*path2 || strlen(path2) > PROTO_MAX_PATH))) {
		eset(e, CONNECT_INVALID_ARGUMENT, "path: expected 1-%d bytes", PROTO_MAX_PATH);
		goto out;
	}
	snprintf(q->user, sizeof(q->user), "%s", user);
	snprintf(q->path, sizeof(q->path), "%s", path);
	if (path2)
		snprintf(q->path2, sizeof(q->path2), "%s", path2);
	q->depth = depth;
	n = eproto_fsreq_encode(buf, PROTO_MAX_PAYLOAD, type, q);
	if (n < 0) {
		eset(e, CONNECT_INVALID_ARGUMENT, "the request does not fit the guest protocol");
		goto out;
	}
	r = envd_req_begin(ch, type, buf, (size_t)n, deadline, e);
out:
	free(q);
	free(buf);
	return r;
}

/* The one ENTRY that answers STAT, MKDIR, MOVE or WEND. */
static json_t *one_entry(struct envd_req *r, int64_t deadline, struct envd_err *e)
{
	struct envd_reply rep;
	struct eproto_entry *en;
	json_t *j = NULL;
	int n = envd_req_next(r, &rep, deadline, e);

	if (n < 0)
		return NULL;
	if (n == 0 || rep.type != EP_ENTRY) {
		eset(e, CONNECT_INTERNAL, "the sandbox's envd answered unexpectedly");
		return NULL;
	}
	en = malloc(sizeof(*en));
	if (en && eproto_entry_decode(rep.payload, rep.len, en) == 0)
		j = entry_json(en);
	else
		eset(e, CONNECT_INTERNAL, "the sandbox's envd sent a malformed entry");
	free(en);
	return j;
}

/* Wait for DONE (REMOVE). */
static int wait_done(struct envd_req *r, int64_t deadline, struct envd_err *e)
{
	struct envd_reply rep;
	int n;

	while ((n = envd_req_next(r, &rep, deadline, e)) == 1)
		if (rep.type == EP_DONE)
			return 0;
	if (n == 0)
		return 0;
	return -1;
}

/* ---- processes ---------------------------------------------------------------- */

/* LIST: the rows as ProcessInfo JSON (processes may be NULL: only look for
 * want_pid / want_tag, *found set). */
static int proc_list(struct envd *ch, json_t *processes, uint32_t want_pid, const char *want_tag, uint32_t *found,
		     int64_t deadline, struct envd_err *e)
{
	uint8_t buf[8];
	ssize_t len = eproto_u32s_encode(buf, sizeof(buf), (uint32_t[]){ 0 }, 1);
	struct envd_req *r = envd_req_begin(ch, EP_LIST, buf, (size_t)len, deadline, e);
	struct eproto_proc *p;
	struct envd_reply rep;
	int n, ret = -1;

	*found = 0;
	if (!r)
		return -1;
	p = malloc(sizeof(*p));
	if (!p) {
		eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	while ((n = envd_req_next(r, &rep, deadline, e)) == 1) {
		json_t *cfg, *args, *envs;

		if (rep.type == EP_DONE)
			break;
		if (rep.type != EP_PROC || eproto_proc_decode(rep.payload, rep.len, p) < 0)
			continue;
		if ((want_pid && p->pid == want_pid) || (want_tag && !strcmp(want_tag, p->tag)))
			*found = p->pid;
		if (!processes)
			continue;
		args = json_array();
		for (uint32_t i = 1; i < p->argc; i++)
			json_array_append_new(args, json_string(p->argv[i]));
		envs = json_object();
		for (uint32_t i = 0; i < p->envc; i++) {
			const char *eq = strchr(p->env[i], '=');
			char k[PROTO_MAX_PATH];

			if (!eq || (size_t)(eq - p->env[i]) >= sizeof(k))
				continue;
			memcpy(k, p->env[i], (size_t)(eq - p->env[i]));
			k[eq - p->env[i]] = '\0';
			json_object_set_new(envs, k, json_string(eq + 1));
		}
		cfg = json_pack("{s:s, s:o, s:o}", "cmd", p->argc ? p->argv[0] : "", "args", args, "envs", envs);
		if (p->cwd[0])
			json_object_set_new(cfg, "cwd", json_string(p->cwd));
		{
			json_t *row = json_pack("{s:o, s:I}", "config", cfg, "pid", (json_int_t)p->pid);

			if (p->tag[0])
				json_object_set_new(row, "tag", json_string(p->tag));
			json_array_append_new(processes, row);
		}
	}
	if (n >= 0)
		ret = 0;
out:
	free(p);
	envd_req_free(r);
	return ret;
}

/* The ProcessSelector {pid} | {tag}: the pid, checked against LIST. */
static int selector_pid(struct envd *ch, json_t *sel, uint32_t *pid, int64_t deadline, struct envd_err *e)
{
	uint32_t want = 0, found;
	int bad = 0;
	const char *tag = jstr(sel, "tag", EPROTO_MAX_TAG, &bad);

	juint(sel, "pid", &want, &bad);
	if (bad || !json_is_object(sel) || (!want && !tag)) {
		eset(e, CONNECT_INVALID_ARGUMENT, "process: expected {\"pid\": N} or {\"tag\": \"...\"}");
		return -1;
	}
	if (proc_list(ch, NULL, want, want ? NULL : tag, &found, deadline, e) < 0)
		return -1;
	if (!found) {
		if (want)
			eset(e, CONNECT_NOT_FOUND, "process with pid %u not found", want);
		else
			eset(e, CONNECT_NOT_FOUND, "process with tag %.100s not found", tag);
		return -1;
	}
	*pid = found;
	return 0;
}

/* Protobuf JSON bytes field, decoded (malloc'd). */
static int jbytes(json_t *o, const char *k, uint8_t **out, size_t *n, int *present, struct envd_err *e)
{
	json_t *v = json_object_get(o, k);

	*out = NULL;
	*n = 0;
	*present = v && !json_is_null(v);
	if (!*present)
		return 0;
	if (!json_is_string(v) || connect_b64_decode(json_string_value(v), MAX_MSG, out, n) < 0) {
		eset(e, CONNECT_INVALID_ARGUMENT, "%s: expected base64", k);
		return -1;
	}
	return 0;
}

/* Send bytes as INPUT frames. */
static int send_input(struct envd *ch, uint32_t pid, const uint8_t *d, size_t n, int64_t deadline, struct envd_err *e)
{
	uint8_t *buf = malloc(4 + EPROTO_MAX_CHUNK);
	int r = 0;

	if (!buf) {
		eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		return -1;
	}
	buf[0] = (uint8_t)pid;
	buf[1] = (uint8_t)(pid >> 8);
	buf[2] = (uint8_t)(pid >> 16);
	buf[3] = (uint8_t)(pid >> 24);
	for (size_t off = 0; off < n && r == 0;) {
		size_t k = n - off > EPROTO_MAX_CHUNK ? EPROTO_MAX_CHUNK : n - off;

		memcpy(buf + 4, d + off, k);
		r = envd_send(ch, EP_INPUT, buf, 4 + k, deadline, e);
		off += k;
	}
	free(buf);
	return r;
}

static int parse_signal(json_t *v, uint32_t *sig)
{
	static const struct {
		const char *name;
		uint32_t sig;
	} names[] = { { "SIGNAL_SIGKILL", SIGKILL }, { "SIGNAL_SIGTERM", SIGTERM } };

	if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 64) {
		*sig = (uint32_t)json_integer_value(v);
		return 0;
	}
	for (size_t i = 0; json_is_string(v) && i < sizeof(names) / sizeof(*names); i++)
		if (!strcmp(json_string_value(v), names[i].name)) {
			*sig = names[i].sig;
			return 0;
		}
	return -1;
}

/* Unary process methods: List, SendInput, CloseStdin, SendSignal, Update. */
static json_t *process_unary(struct envd *ch, const char *method, json_t *req, int64_t deadline, struct envd_err *e)
{
	json_t *sel = json_object_get(req, "process");
	uint32_t pid, found, v[3];
	uint8_t buf[16];
	ssize_t len;

	if (!strcmp(method, "List")) {
		json_t *a = json_array();

		if (proc_list(ch, a, 0, NULL, &found, deadline, e) < 0) {
			json_decref(a);
			return NULL;
		}
		return json_pack("{s:o}", "processes", a);
	}
	if (strcmp(method, "SendInput") && strcmp(method, "CloseStdin") && strcmp(method, "SendSignal") &&
	    strcmp(method, "Update")) {
		eset(e, CONNECT_UNIMPLEMENTED, "process.Process/%.40s is not supported", method);
		return NULL;
	}
	if (selector_pid(ch, sel, &pid, deadline, e) < 0)
		return NULL;
	if (!strcmp(method, "SendInput")) {
		json_t *in = json_object_get(req, "input");
		uint8_t *d = NULL;
		size_t n = 0;
		int present = 0, r;

		if (!json_is_object(in)) {
			eset(e, CONNECT_INVALID_ARGUMENT, "input: expected {\"stdin\"|\"pty\": base64}");
			return NULL;
		}
		if (jbytes(in, "stdin", &d, &n, &present, e) < 0)
			return NULL;
		if (!present && jbytes(in, "pty", &d, &n, &present, e) < 0)
			return NULL;
		r = send_input(ch, pid, d, n, deadline, e);
		free(d);
		return r < 0 ? NULL : json_object();
	}
	v[0] = pid;
	if (!strcmp(method, "CloseStdin")) {
		len = eproto_u32s_encode(buf, sizeof(buf), v, 1);
		return envd_send(ch, EP_CLOSE_STDIN, buf, (size_t)len, deadline, e) < 0 ? NULL : json_object();
	}
	if (!strcmp(method, "SendSignal")) {
		if (parse_signal(json_object_get(req, "signal"), &v[1]) < 0) {
			eset(e, CONNECT_INVALID_ARGUMENT, "signal: expected SIGNAL_SIGKILL or SIGNAL_SIGTERM");
			return NULL;
		}
		len = eproto_u32s_encode(buf, sizeof(buf), v, 2);
		return envd_send(ch, EP_SIGNAL, buf, (size_t)len, deadline, e) < 0 ? NULL : json_object();
	}
	/* Update: the pty's size. */
	{
		json_t *size = json_object_get(json_object_get(req, "pty"), "size");
		int bad = 0;

		v[1] = v[2] = 0;
		juint(size, "rows", &v[1], &bad);
		juint(size, "cols", &v[2], &bad);
		if (bad || v[1] < 1 || v[1] > PROTO_MAX_TTY_DIM || v[2] < 1 || v[2] > PROTO_MAX_TTY_DIM) {
			eset(e, CONNECT_INVALID_ARGUMENT, "pty.size: rows and cols 1-%d", PROTO_MAX_TTY_DIM);
			return NULL;
		}
		len = eproto_u32s_encode(buf, sizeof(buf), v, 3);
		return envd_send(ch, EP_RESIZE, buf, (size_t)len, deadline, e) < 0 ? NULL : json_object();
	}
}

/* Unary filesystem methods. */
static json_t *fs_unary(struct envd *ch, const char *method, const char *user, json_t *req, int64_t deadline,
			struct envd_err *e)
{
	static const struct {
		const char *name;
		uint8_t type;
	} m[] = { { "Stat", EP_STAT }, { "ListDir", EP_LISTDIR }, { "MakeDir", EP_MKDIR }, { "Move", EP_MOVE },
		  { "Remove", EP_REMOVE } };
	uint8_t type = 0;
	const char *path, *path2 = NULL;
	uint32_t depth = 0;
	int bad = 0;
	struct envd_req *r;
	json_t *out = NULL;

	for (size_t i = 0; i < sizeof(m) / sizeof(*m); i++)
		if (!strcmp(method, m[i].name))
			type = m[i].type;
	if (!type) {
		eset(e, CONNECT_UNIMPLEMENTED, "filesystem.Filesystem/%.40s is not supported", method);
		return NULL;
	}
	if (type == EP_MOVE) {
		path = jstr(req, "source", PROTO_MAX_PATH, &bad);
		path2 = jstr(req, "destination", PROTO_MAX_PATH, &bad);
	} else {
		path = jstr(req, "path", PROTO_MAX_PATH, &bad);
	}
	if (type == EP_LISTDIR) {
		juint(req, "depth", &depth, &bad);
		if (!depth)
			depth = 1;
		if (depth > 16)
			depth = 16;
	}
	if (bad || !path || !*path || (type == EP_MOVE && (!path2 || !*path2))) {
		eset(e, CONNECT_INVALID_ARGUMENT, type == EP_MOVE ? "source and destination: expected paths" : "path: expected a path");
		return NULL;
	}
	r = fs_begin(ch, type, user, path, path2, depth, deadline, e);
	if (!r)
		return NULL;
	switch (type) {
	case EP_STAT:
	case EP_MKDIR:
	case EP_MOVE: {
		json_t *en = one_entry(r, deadline, e);

		if (en)
			out = json_pack("{s:o}", "entry", en);
		break;
	}
	case EP_REMOVE:
		if (wait_done(r, deadline, e) == 0)
			out = json_object();
		break;
	default: { /* LISTDIR */
		json_t *a = json_array();
		struct eproto_entry *en = malloc(sizeof(*en));
		struct envd_reply rep;
		int n = -1;

		while (en && (n = envd_req_next(r, &rep, deadline, e)) == 1) {
			if (rep.type == EP_DONE)
				break;
			if (rep.type == EP_ENTRY && eproto_entry_decode(rep.payload, rep.len, en) == 0)
				json_array_append_new(a, entry_json(en));
		}
		free(en);
		if (n >= 0)
			out = json_pack("{s:O}", "entries", a);
		json_decref(a);
		break;
	}
	}
	envd_req_free(r);
	/* E2B: MakeDir of an existing directory is already_exists; ListDir
	 * of a file is invalid_argument. */
	if (!out && type == EP_MKDIR && e->errnum == -EEXIST)
		e->code = CONNECT_ALREADY_EXISTS;
	return out;
}

/* ---- server streams: Start and Connect ------------------------------------------- */

struct pstream {
	struct envd *ch;
	struct envd_sub *sub;
	uint32_t pid;
	int64_t deadline;     /* Connect-Timeout-Ms: the stream ends then (0: none) */
	int kill_at_deadline; /* Start: the process group is killed then too (Connect: only the stream ends) */
	int64_t keepalive_ms; /* silence after which a keepalive event goes out */
	struct buf st;        /* envelopes not yet handed to libmicrohttpd */
	size_t st_off;
	int finished;         /* the end-of-stream message is in st */
};

static void pstream_event(struct pstream *p, json_t *ev)
{
	json_t *j = json_pack("{s:o}", "event", ev);

	if (j)
		connect_env_append_json(&p->st, j);
	json_decref(j);
}

static void pstream_end(struct pstream *p, enum connect_code c, const char *msg)
{
	connect_end_append(&p->st, c, msg);
	p->finished = 1;
}

static void signal_name(uint32_t sig, char *out, size_t cap)
{
	const char *s = sig >= 1 && sig <= 64 ? strsignal((int)sig) : NULL;

	snprintf(out, cap, "%s", s ? s : "unknown signal");
	out[0] = (char)tolower((unsigned char)out[0]);
}

/* The next events into p->st (at least one envelope unless it ended). */
static void pstream_fill(struct pstream *p)
{
	struct envd_event ev;
	int64_t until = now_ms() + p->keepalive_ms;

	if (p->deadline && p->deadline < until)
		until = p->deadline;
	envd_sub_next(p->sub, &ev, until);
	switch (ev.kind) {
	case ENVD_EV_DATA: {
		static const char *const names[] = { "stdout", "stdout", "stderr", "pty" };
		struct buf b = BUF_INIT;

		if (connect_b64_append(&b, ev.data, ev.len) == 0)
			pstream_event(p, json_pack("{s:{s:s}}", "data", names[ev.stream <= 3 ? ev.stream : 1], b.p ? b.p : ""));
		buf_free(&b);
		return;
	}
	case ENVD_EV_END: {
		char status[96], sig[64];
		json_t *end;

		if (ev.how == PROTO_SIGNALED) {
			signal_name(ev.status, sig, sizeof(sig));
			snprintf(status, sizeof(status), "signal: %s", sig);
			end = json_pack("{s:i, s:b, s:s}", "exitCode", -1, "exited", 1, "status", status);
		} else {
			snprintf(status, sizeof(status), "exit status %u", ev.status);
			end = json_pack("{s:b, s:s}", "exited", 1, "status", status);
			if (ev.status)
				json_object_set_new(end, "exitCode", json_integer(ev.status));
		}
		pstream_event(p, json_pack("{s:o}", "end", end));
		pstream_end(p, CONNECT_OK, NULL);
		return;
	}
	case ENVD_EV_ERROR:
		pstream_end(p, ev.err.code, ev.err.msg);
		return;
	default:
		break;
	}
	if (p->deadline && now_ms() >= p->deadline) {
		/* The command's deadline: its whole process group goes. */
		uint32_t v[2] = { p->pid, SIGKILL };
		uint8_t buf[8];
		ssize_t len = eproto_u32s_encode(buf, sizeof(buf), v, 2);
		struct envd_err e;

		if (p->kill_at_deadline)
			envd_send(p->ch, EP_SIGNAL, buf, (size_t)len, now_ms() + 1000, &e);
		pstream_end(p, CONNECT_DEADLINE_EXCEEDED, "the command's deadline (Connect-Timeout-Ms) passed");
		return;
	}
	pstream_event(p, json_pack("{s:{}}", "keepalive"));
}

static ssize_t pstream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct pstream *p = cls;
	size_t n;

	(void)pos;
	while (p->st.len == p->st_off) {
		if (p->finished)
			return MHD_CONTENT_READER_END_OF_STREAM;
		buf_reset(&p->st);
		p->st_off = 0;
		pstream_fill(p);
	}
	n = p->st.len - p->st_off;
	if (n > max)
		n = max;
	memcpy(buf, p->st.p + p->st_off, n);
	p->st_off += n;
	return (ssize_t)n;
}

/* A command whose client went away before its deadline still dies at the
 * deadline: a detached thread waits for it (holding the channel). */
struct deadline_kill {
	struct envd *ch;
	uint32_t pid;
	int64_t at;
};

static void *deadline_kill_main(void *arg)
{
	struct deadline_kill *k = arg;
	uint32_t v[2] = { k->pid, SIGKILL };
	uint8_t buf[8];
	ssize_t len = eproto_u32s_encode(buf, sizeof(buf), v, 2);
	struct envd_err e;

	while (now_ms() < k->at && envd_alive(k->ch)) {
		int64_t left = k->at - now_ms();
		struct timespec ts = { .tv_sec = left > 1000 ? 1 : 0, .tv_nsec = left > 1000 ? 0 : left * 1000000 };

		nanosleep(&ts, NULL);
	}
	if (envd_alive(k->ch))
		envd_send(k->ch, EP_SIGNAL, buf, (size_t)len, now_ms() + 1000, &e);
	envd_unref(k->ch);
	free(k);
	return NULL;
}

static void pstream_free(void *cls)
{
	struct pstream *p = cls;

	if (p->kill_at_deadline && p->deadline && !p->finished && p->sub && p->ch) {
		struct deadline_kill *k = malloc(sizeof(*k));
		pthread_attr_t a;
		pthread_t th;

		if (k) {
			*k = (struct deadline_kill){ .ch = p->ch, .pid = p->pid, .at = p->deadline };
			envd_ref(p->ch);
			pthread_attr_init(&a);
			pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
			if (pthread_create(&th, &a, deadline_kill_main, k) != 0) {
				envd_unref(p->ch);
				free(k);
			}
			pthread_attr_destroy(&a);
		}
	}
	/* A client that went away does not stop the process (E2B's disconnect). */
	envd_sub_free(p->sub);
	if (p->ch)
		envd_unref(p->ch);
	buf_free(&p->st);
	free(p);
}

/* 200 application/connect+json over p (taken). */
static enum MHD_Result pstream_reply(struct MHD_Connection *conn, struct pstream *p)
{
	struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, pstream_read, p,
								   pstream_free);
	enum MHD_Result ret;

	if (!r) {
		pstream_free(p);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "application/connect+json");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

/* A stream that is only its end-of-stream error. */
static enum MHD_Result stream_error(struct MHD_Connection *conn, const struct envd_err *e)
{
	struct buf b = BUF_INIT;
	struct MHD_Response *r;
	enum MHD_Result ret;

	connect_end_append(&b, e->code, e->msg);
	r = MHD_create_response_from_buffer(b.len, b.p ? b.p : "", MHD_RESPMEM_MUST_COPY);
	buf_free(&b);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", "application/connect+json");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static struct pstream *pstream_new(struct MHD_Connection *conn, struct envd *ch, struct envd_err *e)
{
	struct pstream *p = calloc(1, sizeof(*p));
	const char *ka = header(conn, "Keepalive-Ping-Interval");
	int64_t to = connect_timeout_ms(header(conn, "Connect-Timeout-Ms"));

	if (!p) {
		eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		return NULL;
	}
	p->ch = ch;
	buf_init(&p->st, 0);
	p->keepalive_ms = STREAM_KEEPALIVE_S * 1000;
	if (ka && atoi(ka) > 0 && atoi(ka) <= 3600)
		p->keepalive_ms = (int64_t)atoi(ka) * 1000;
	if (to < 0) {
		free(p);
		eset(e, CONNECT_INVALID_ARGUMENT, "Connect-Timeout-Ms: expected 1-10 digits");
		return NULL;
	}
	p->deadline = to ? now_ms() + to : 0;
	return p;
}

/* The START message for the request (process, pty, tag, stdin), env: the
 * session's then the request's. Encoded into buf. */
static ssize_t start_encode(json_t *req, json_t *session_env, const char *user, uint8_t *buf, struct envd_err *e)
{
	json_t *proc = json_object_get(req, "process"), *args, *envs, *pty, *env, *v;
	struct eproto_start *m = calloc(1, sizeof(*m));
	const char *cmd, *cwd, *tag, *k;
	int bad = 0;
	size_t i;
	ssize_t n = -1;
	char **kv = NULL;
	size_t nkv = 0;

	if (!m) {
		eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		return -1;
	}
	if (!json_is_object(proc)) {
		eset(e, CONNECT_INVALID_ARGUMENT, "process: expected an object");
		goto out;
	}
	cmd = jstr(proc, "cmd", PROTO_MAX_PATH, &bad);
	cwd = jstr(proc, "cwd", PROTO_MAX_PATH, &bad);
	tag = jstr(req, "tag", EPROTO_MAX_TAG, &bad);
	args = json_object_get(proc, "args");
	envs = json_object_get(proc, "envs");
	if (bad || !cmd || !*cmd || (args && !json_is_array(args) && !json_is_null(args)) ||
	    (envs && !json_is_object(envs) && !json_is_null(envs)) || json_array_size(args) + 1 > PROTO_MAX_ARGS) {
		eset(e, CONNECT_INVALID_ARGUMENT, "process: expected {cmd, args:[strings], envs:{string: string}, cwd}");
		goto out;
	}
	m->argv[m->argc++] = cmd;
	json_array_foreach(args, i, v) {
		if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
			eset(e, CONNECT_INVALID_ARGUMENT, "process.args: expected strings");
			goto out;
		}
		m->argv[m->argc++] = json_string_value(v);
	}
	m->argv[m->argc] = NULL;
	/* The request's variables win over the session's. */
	env = json_is_object(session_env) ? json_copy(session_env) : json_object();
	if (json_is_object(envs))
		json_object_update(env, envs);
	kv = calloc(json_object_size(env) + 1, sizeof(*kv));
	if (!kv || json_object_size(env) > PROTO_MAX_ENV) {
		json_decref(env);
		eset(e, CONNECT_INVALID_ARGUMENT, "process.envs: at most %d variables", PROTO_MAX_ENV);
		goto out;
	}
	json_object_foreach(env, k, v) {
		if (!*k || strchr(k, '=') || !json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
			json_decref(env);
			eset(e, CONNECT_INVALID_ARGUMENT, "process.envs: names without '=', string values without NUL");
			goto out;
		}
		if (asprintf(&kv[nkv], "%s=%s", k, json_string_value(v)) < 0) {
			json_decref(env);
			eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
			goto out;
		}
		m->env[m->envc++] = kv[nkv++];
	}
	json_decref(env);
	m->env[m->envc] = NULL;
	m->user = user;
	m->cwd = cwd ? cwd : "";
	m->tag = tag ? tag : "";
	if (json_is_true(json_object_get(req, "stdin")))
		m->flags |= EP_START_STDIN;
	pty = json_object_get(req, "pty");
	if (json_is_object(pty)) {
		json_t *size = json_object_get(pty, "size");

		juint(size, "rows", &m->rows, &bad);
		juint(size, "cols", &m->cols, &bad);
		if (bad || m->rows < 1 || m->rows > PROTO_MAX_TTY_DIM || m->cols < 1 || m->cols > PROTO_MAX_TTY_DIM) {
			eset(e, CONNECT_INVALID_ARGUMENT, "pty.size: rows and cols 1-%d", PROTO_MAX_TTY_DIM);
			goto out;
		}
		m->flags |= EP_START_PTY;
	}
	n = eproto_start_encode(buf, PROTO_MAX_PAYLOAD, m);
	if (n < 0)
		eset(e, CONNECT_INVALID_ARGUMENT, "the command, its arguments and env are too large together");
out:
	for (i = 0; i < nkv; i++)
		free(kv[i]);
	free(kv);
	free(m);
	return n;
}

static enum MHD_Result process_stream(struct session_table *ss, struct httpd_req *r, const char *method)
{
	struct envd_err e = { 0 };
	json_t *req, *env = NULL;
	struct envd *ch = NULL;
	struct pstream *p = NULL;
	char user[EPROTO_MAX_USER + 1];
	uint8_t *buf = NULL;

	req = request_json(r, 1, &e);
	if (!req)
		return stream_error(r->conn, &e);
	if (auth_user(r->conn, user) < 0) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:) with a valid user name");
		goto fail;
	}
	ch = channel(ss, r->param[0], &env, &e);
	if (!ch)
		goto fail;
	p = pstream_new(r->conn, ch, &e);
	if (!p)
		goto fail;
	ch = NULL; /* p's */
	if (!strcmp(method, "Start")) {
		ssize_t n;

		buf = malloc(PROTO_MAX_PAYLOAD);
		if (!buf) {
			eset(&e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
			goto fail;
		}
		n = start_encode(req, env, user, buf, &e);
		if (n < 0 || envd_start(p->ch, buf, (size_t)n, now_ms() + UNARY_DEFAULT_MS, &p->sub, &p->pid, &e) < 0)
			goto fail;
		p->kill_at_deadline = 1;
	} else {
		/* Connect: subscribe first, then make sure it exists: an END
		 * before the subscription means it is gone (not_found). */
		json_t *sel = json_object_get(req, "process");
		uint32_t want = 0, found;
		int bad = 0;
		const char *tag = jstr(sel, "tag", EPROTO_MAX_TAG, &bad);

		juint(sel, "pid", &want, &bad);
		if (bad || !json_is_object(sel) || (!want && !tag)) {
			eset(&e, CONNECT_INVALID_ARGUMENT, "process: expected {\"pid\": N} or {\"tag\": \"...\"}");
			goto fail;
		}
		if (!want) {
			if (proc_list(p->ch, NULL, 0, tag, &want, now_ms() + UNARY_DEFAULT_MS, &e) < 0)
				goto fail;
			if (!want) {
				eset(&e, CONNECT_NOT_FOUND, "process with tag %.100s not found", tag);
				goto fail;
			}
		}
		p->sub = envd_subscribe(p->ch, want, &e);
		if (!p->sub)
			goto fail;
		if (proc_list(p->ch, NULL, want, NULL, &found, now_ms() + UNARY_DEFAULT_MS, &e) < 0)
			goto fail;
		if (!found) {
			eset(&e, CONNECT_NOT_FOUND, "process with pid %u not found", want);
			goto fail;
		}
		p->pid = want;
	}
	pstream_event(p, json_pack("{s:{s:I}}", "start", "pid", (json_int_t)p->pid));
	free(buf);
	json_decref(req);
	json_decref(env);
	return pstream_reply(r->conn, p);
fail:
	free(buf);
	json_decref(req);
	json_decref(env);
	if (p)
		pstream_free(p);
	if (ch)
		envd_unref(ch);
	return stream_error(r->conn, &e);
}

enum MHD_Result envd_http_rpc(struct session_table *ss, struct httpd_req *r)
{
	const char *svc = r->param[1], *method = r->param[2];
	struct envd_err e = { 0 };
	int64_t to, deadline;
	json_t *req, *env = NULL, *out = NULL;
	struct envd *ch;
	char user[EPROTO_MAX_USER + 1];

	/* The method's kind from the table kiln-api's relay decides by too
	 * (lib/connect_call.c), and the Content-Type Connect's JSON codec gives
	 * it; anything else is refused before the body is looked at. */
	enum connect_kind kind = connect_call_kind(svc, method);

	if (kind == CONNECT_KIND_NONE) {
		eset(&e, CONNECT_UNIMPLEMENTED, "no method %.60s/%.40s", svc, method);
		return unary_error(r->conn, &e);
	}
	if (connect_call_check_media(kind, header(r->conn, MHD_HTTP_HEADER_CONTENT_TYPE), e.msg, sizeof(e.msg)) < 0) {
		e.code = CONNECT_UNIMPLEMENTED;
		return reply_json(r->conn, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, connect_error_json(e.code, e.msg));
	}
	if (kind == CONNECT_KIND_SERVER_STREAM && !strcmp(svc, "process.Process"))
		return process_stream(ss, r, method);
	/* Any other streaming call (WatchDir, StreamInput): Connect's clients
	 * read a streaming call's error from its end-of-stream message, not
	 * from an HTTP status, so the answer is a stream that ends at once. */
	if (connect_kind_streams(kind)) {
		eset(&e, CONNECT_UNIMPLEMENTED, "%.60s/%.40s is not supported by kiln", svc, method);
		return stream_error(r->conn, &e);
	}
	to = connect_timeout_ms(header(r->conn, "Connect-Timeout-Ms"));
	if (to < 0) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "Connect-Timeout-Ms: expected 1-10 digits");
		return unary_error(r->conn, &e);
	}
	deadline = now_ms() + (to ? to : UNARY_DEFAULT_MS);
	req = request_json(r, 0, &e);
	if (!req)
		return unary_error(r->conn, &e);
	if (auth_user(r->conn, user) < 0) {
		json_decref(req);
		eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:) with a valid user name");
		return unary_error(r->conn, &e);
	}
	ch = channel(ss, r->param[0], &env, &e);
	if (ch) {
		if (!strcmp(svc, "process.Process"))
			out = process_unary(ch, method, req, deadline, &e);
		else
			out = fs_unary(ch, method, user, req, deadline, &e);
		envd_unref(ch);
	}
	json_decref(req);
	json_decref(env);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : unary_error(r->conn, &e);
}

/* ---- health and metrics ---------------------------------------------------------- */

enum MHD_Result envd_http_health(struct session_table *ss, struct httpd_req *r)
{
	struct envd_err e = { 0 };
	json_t *env = NULL;
	struct envd *ch = channel(ss, r->param[0], &env, &e);
	uint32_t found;
	int ok;

	json_decref(env);
	if (!ch)
		return reply_json(r->conn, e.code == CONNECT_NOT_FOUND ? 404 : 502,
				  json_pack("{s:i, s:s}", "code", e.code == CONNECT_NOT_FOUND ? 404 : 502, "message", e.msg));
	ok = proc_list(ch, NULL, 0, NULL, &found, now_ms() + ENVD_HELLO_MS + 1000, &e) == 0;
	envd_unref(ch);
	if (!ok)
		return reply_json(r->conn, 502, json_pack("{s:i, s:s}", "code", 502, "message", e.msg));
	return reply_bytes(r->conn, MHD_HTTP_NO_CONTENT, NULL, 0, NULL);
}

enum MHD_Result envd_http_metrics(struct session_table *ss, struct httpd_req *r)
{
	struct kiln_err err = { .code = "" };
	json_t *m = strlen(r->param[0]) < 80 ? session_metrics(ss, r->param[0], &err) : NULL;

	if (!m && !err.code[0])
		kiln_err_set(&err, KERR_NOT_FOUND, "no such session on this host");
	return m ? reply_json(r->conn, MHD_HTTP_OK, m) : reply_err(r->conn, &err);
}

/* ---- files: E2B's HTTP API (errors {"code": status, "message"}) ------------------- */

static unsigned file_status(const struct envd_err *e)
{
	switch (e->errnum) {
	case -ENOENT:
		return 404;
	case -EISDIR:
	case -ENOTDIR:
	case -EINVAL:
	case -ENAMETOOLONG:
		return 400;
	case -EACCES:
	case -EPERM:
		return 403;
	case -ENOSPC:
	case -EDQUOT:
		return 507;
	default:
		break;
	}
	switch (e->code) {
	case CONNECT_NOT_FOUND:
		return 404;
	case CONNECT_INVALID_ARGUMENT:
		return 400;
	case CONNECT_UNAVAILABLE:
		return 502;
	default:
		return 500;
	}
}

static enum MHD_Result file_error(struct MHD_Connection *conn, const struct envd_err *e)
{
	unsigned st = file_status(e);

	return reply_json(conn, st, json_pack("{s:i, s:s}", "code", (int)st, "message", e->msg));
}

struct download {
	struct envd *ch;
	struct envd_req *r;
	uint8_t *first;       /* the first DATA's bytes, read before answering */
	size_t first_len, first_off;
	int done;
};

static ssize_t download_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct download *d = cls;
	struct envd_reply rep;
	struct envd_err e;
	size_t n;

	(void)pos;
	if (d->first_off < d->first_len) {
		n = d->first_len - d->first_off;
		if (n > max)
			n = max;
		memcpy(buf, d->first + d->first_off, n);
		d->first_off += n;
		if (d->first_off == d->first_len)
			envd_req_ack(d->r, d->first_len);
		return (ssize_t)n;
	}
	if (d->done)
		return MHD_CONTENT_READER_END_OF_STREAM;
	for (;;) {
		int k = envd_req_next(d->r, &rep, now_ms() + UPLOAD_STALL_MS, &e);

		if (k < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (k == 0 || rep.type == EP_DONE) {
			d->done = 1;
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		if (rep.type != EP_DATA || rep.len <= 4)
			continue;
		/* Keep it whole for the next calls when it does not fit now. */
		free(d->first);
		d->first = malloc(rep.len - 4);
		if (!d->first)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		memcpy(d->first, rep.payload + 4, rep.len - 4);
		d->first_len = rep.len - 4;
		d->first_off = 0;
		return download_read(cls, pos, buf, max);
	}
}

static void download_free(void *cls)
{
	struct download *d = cls;

	envd_req_free(d->r);
	envd_unref(d->ch);
	free(d->first);
	free(d);
}

enum MHD_Result envd_http_files_get(struct session_table *ss, struct httpd_req *r)
{
	const char *path = query(r->conn, "path"), *uname = query(r->conn, "username");
	struct envd_err e = { 0 };
	json_t *env = NULL;
	struct download *d;
	struct envd_reply rep;
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char user[EPROTO_MAX_USER + 1] = "";
	int k;

	if (uname && *uname) {
		if (!user_name_ok(uname)) {
			eset(&e, CONNECT_INVALID_ARGUMENT, "username: not a valid user name");
			return file_error(r->conn, &e);
		}
		snprintf(user, sizeof(user), "%s", uname);
	} else if (auth_user(r->conn, user) < 0) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:)");
		return file_error(r->conn, &e);
	}
	if (!path || !*path) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "path: required");
		return file_error(r->conn, &e);
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return MHD_NO;
	d->ch = channel(ss, r->param[0], &env, &e);
	json_decref(env);
	if (!d->ch) {
		free(d);
		return file_error(r->conn, &e);
	}
	d->r = fs_begin(d->ch, EP_READ, user, path, NULL, 0, now_ms() + UNARY_DEFAULT_MS, &e);
	/* The first reply decides the status: an error, or the start of the bytes. */
	k = d->r ? envd_req_next(d->r, &rep, now_ms() + UNARY_DEFAULT_MS, &e) : -1;
	if (k < 0) {
		download_free(d);
		return file_error(r->conn, &e);
	}
	if (k == 1 && rep.type == EP_DATA && rep.len > 4) {
		d->first = malloc(rep.len - 4);
		if (!d->first) {
			download_free(d);
			return MHD_NO;
		}
		memcpy(d->first, rep.payload + 4, rep.len - 4);
		d->first_len = rep.len - 4;
	} else {
		d->done = 1; /* DONE: an empty file */
	}
	if (d->done) {
		download_free(d);
		resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
	} else {
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, download_read, d, download_free);
		if (!resp)
			download_free(d);
	}
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* ---- uploads ------------------------------------------------------------------------ */

struct envd_upload {
	struct envd *ch;
	char user[EPROTO_MAX_USER + 1];
	char *path;            /* ?path=, or NULL */
	int raw;               /* application/octet-stream */
	struct multipart *mp;
	struct envd_req *w;    /* the file being written */
	uint8_t *chunk;        /* 4 + EPROTO_MAX_CHUNK */
	size_t chunk_len;      /* bytes after the id */
	int skipping;          /* a part that is not a file */
	int failed;
	struct envd_err err;
	json_t *written;       /* [{name, type, path}] */
};

int envd_upload_match(const char *method, const char *url)
{
	const char *p;
	size_t n;

	if (strcmp(method, "POST") || strncmp(url, "/v1/sessions/", 13))
		return 0;
	p = url + 13;
	n = strcspn(p, "/");
	return n > 0 && !strcmp(p + n, "/envd/files");
}

static void up_fail(struct envd_upload *u, const struct envd_err *e)
{
	if (u->failed)
		return;
	u->failed = 1;
	u->err = *e;
	if (u->w) {
		envd_req_free(u->w); /* CANCELs the WRITE: no partial file is left */
		u->w = NULL;
	}
}

static int up_flush(struct envd_upload *u)
{
	struct envd_err e;

	if (!u->w || !u->chunk_len)
		return 0;
	if (envd_req_send(u->w, EP_WDATA, u->chunk, 4 + u->chunk_len, now_ms() + UPLOAD_STALL_MS, &e) < 0) {
		up_fail(u, &e);
		return -1;
	}
	u->chunk_len = 0;
	return 0;
}

static int up_begin_file(struct envd_upload *u, const char *path)
{
	struct envd_err e;

	if (!path || !*path) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "no path: give ?path= or a file name in the part");
		up_fail(u, &e);
		return -EINVAL;
	}
	u->w = fs_begin(u->ch, EP_WRITE, u->user, path, NULL, 0, now_ms() + UNARY_DEFAULT_MS, &e);
	if (!u->w) {
		up_fail(u, &e);
		return -EIO;
	}
	u->chunk_len = 0;
	return 0;
}

static int up_data(struct envd_upload *u, const uint8_t *p, size_t n)
{
	while (n > 0 && u->w) {
		size_t k = EPROTO_MAX_CHUNK - u->chunk_len;

		if (k > n)
			k = n;
		memcpy(u->chunk + 4 + u->chunk_len, p, k);
		u->chunk_len += k;
		p += k;
		n -= k;
		if (u->chunk_len == EPROTO_MAX_CHUNK && up_flush(u) < 0)
			return -EIO;
	}
	return 0;
}

static int up_end_file(struct envd_upload *u)
{
	struct envd_err e;
	uint8_t id[4];
	json_t *en;

	if (!u->w || up_flush(u) < 0)
		return u->failed ? -EIO : 0;
	if (envd_req_send(u->w, EP_WEND, id, 4, now_ms() + UPLOAD_STALL_MS, &e) < 0) {
		up_fail(u, &e);
		return -EIO;
	}
	en = one_entry(u->w, now_ms() + UPLOAD_STALL_MS, &e);
	envd_req_free(u->w);
	u->w = NULL;
	if (!en) {
		up_fail(u, &e);
		return -EIO;
	}
	json_array_append_new(u->written,
			      json_pack("{s:O, s:s, s:O}", "name", json_object_get(en, "name"), "type", "file", "path",
					json_object_get(en, "path")));
	json_decref(en);
	return 0;
}

static int mp_begin(void *cls, const char *name, const char *filename)
{
	struct envd_upload *u = cls;

	u->skipping = strcmp(name, "file") != 0;
	if (u->skipping || u->failed)
		return 0;
	return up_begin_file(u, u->path ? u->path : filename);
}

static int mp_data(void *cls, const uint8_t *p, size_t n)
{
	struct envd_upload *u = cls;

	return u->skipping || u->failed ? 0 : up_data(u, p, n);
}

static int mp_end(void *cls)
{
	struct envd_upload *u = cls;

	return u->skipping || u->failed ? 0 : up_end_file(u);
}

static const struct multipart_cb mp_cb = { mp_begin, mp_data, mp_end };

struct envd_upload *envd_upload_new(struct session_table *ss, struct MHD_Connection *conn, const char *url)
{
	struct envd_upload *u = calloc(1, sizeof(*u));
	const char *ct = header(conn, MHD_HTTP_HEADER_CONTENT_TYPE), *path = query(conn, "path"),
		   *uname = query(conn, "username"), *enc = header(conn, "Content-Encoding");
	char id[80], boundary[MULTIPART_MAX_BOUNDARY + 1];
	size_t n = strcspn(url + 13, "/");
	json_t *env = NULL;
	struct envd_err e;

	if (!u)
		return NULL;
	u->chunk = malloc(4 + EPROTO_MAX_CHUNK);
	u->written = json_array();
	if (!u->chunk || !u->written) {
		envd_upload_free(u);
		return NULL;
	}
	if (path && *path)
		u->path = strdup(path);
	if (uname && *uname) {
		if (!user_name_ok(uname)) {
			eset(&e, CONNECT_INVALID_ARGUMENT, "username: not a valid user name");
			up_fail(u, &e);
			return u;
		}
		snprintf(u->user, sizeof(u->user), "%s", uname);
	} else if (auth_user(conn, u->user) < 0) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:)");
		up_fail(u, &e);
		return u;
	}
	if (enc && strcasecmp(enc, "identity")) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "Content-Encoding %.40s is not supported", enc);
		up_fail(u, &e);
		return u;
	}
	snprintf(id, sizeof(id), "%.*s", (int)(n < sizeof(id) ? n : sizeof(id) - 1), url + 13);
	u->ch = channel(ss, id, &env, &e);
	json_decref(env);
	if (!u->ch) {
		up_fail(u, &e);
		return u;
	}
	if (ct && !strncasecmp(ct, "application/octet-stream", 24)) {
		u->raw = 1;
		up_begin_file(u, u->path);
	} else if (!ct || multipart_boundary(ct, boundary) < 0) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "Content-Type: expected multipart/form-data or application/octet-stream");
		up_fail(u, &e);
	} else if (!(u->mp = multipart_new(boundary, &mp_cb, u))) {
		eset(&e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		up_fail(u, &e);
	}
	return u;
}

enum MHD_Result envd_upload_feed(struct envd_upload *u, const char *data, size_t *size)
{
	size_t n = *size;

	*size = 0;
	if (u->failed)
		return MHD_YES; /* the rest is read and dropped; the answer says why */
	if (u->raw)
		up_data(u, (const uint8_t *)data, n);
	else if (multipart_feed(u->mp, (const uint8_t *)data, n) < 0 && !u->failed) {
		struct envd_err e;

		eset(&e, CONNECT_INVALID_ARGUMENT, "malformed multipart/form-data body");
		up_fail(u, &e);
	}
	return MHD_YES;
}

enum MHD_Result envd_upload_finish(struct envd_upload *u, struct MHD_Connection *conn)
{
	struct envd_err e;

	if (!u->failed) {
		if (u->raw)
			up_end_file(u);
		else if (multipart_finish(u->mp) < 0 && !u->failed) {
			eset(&e, CONNECT_INVALID_ARGUMENT, "the multipart/form-data body ended early");
			up_fail(u, &e);
		}
	}
	if (!u->failed && json_array_size(u->written) == 0) {
		eset(&e, CONNECT_INVALID_ARGUMENT, "no file part in the upload");
		up_fail(u, &e);
	}
	if (u->failed)
		return file_error(conn, &u->err);
	return reply_json(conn, MHD_HTTP_OK, json_incref(u->written));
}

void envd_upload_free(struct envd_upload *u)
{
	if (!u)
		return;
	envd_req_free(u->w);
	if (u->mp)
		multipart_free(u->mp);
	if (u->ch)
		envd_unref(u->ch);
	json_decref(u->written);
	free(u->chunk);
	free(u->path);
	free(u);
}
