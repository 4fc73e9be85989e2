/* envd_http_proc: process.Process's RPCs over a session's envd channel:
 * the unary ones (List, SendInput, SendSignal, Update, CloseStdin) and the
 * server streams Start and Connect (5-byte Connect envelopes, keep-alives,
 * the process's deadline). Every field is checked before it reaches the
 * guest. */
#include "envd_http_int.h"

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
#include "connect_call.h"
#include "connectrpc.h"
#include "envd/envd.h"
#include "eproto.h"
#include "multipart.h"
#include "proto.h"
#include "reply.h"
#include "session/session.h"

/* ---- processes ---------------------------------------------------------------- */

/* LIST: the rows as ProcessInfo JSON (processes may be NULL: only look for
 * want_pid / want_tag, *found set). */
int envd_http_proc_list(struct envd *ch, json_t *processes, uint32_t want_pid, const char *want_tag, uint32_t *found,
		     int64_t deadline, struct envd_err *e)
{
	uint8_t buf[8];
	ssize_t len = eproto_u32s_encode(buf, sizeof(buf), (uint32_t[]){ 0 }, 1);
	struct envd_req *req = envd_req_begin(ch, EP_LIST, buf, (size_t)len, deadline, e);
	struct eproto_proc *p;
	struct envd_reply rep;
	int n, ret = -1;

	*found = 0;
	if (!req)
		return -1;
	p = malloc(sizeof(*p));
	if (!p) {
		envd_http_eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	while ((n = envd_req_next(req, &rep, deadline, e)) == 1) {
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
	envd_req_free(req);
	return ret;
}

/* The ProcessSelector {pid} | {tag}: the pid, checked against LIST. */
static int selector_pid(struct envd *ch, json_t *sel, uint32_t *pid, int64_t deadline, struct envd_err *e)
{
	uint32_t want = 0, found;
	int bad = 0;
	const char *tag = envd_http_jstr(sel, "tag", EPROTO_MAX_TAG, &bad);

	envd_http_juint(sel, "pid", &want, &bad);
	if (bad || !json_is_object(sel) || (!want && !tag)) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "process: expected {\"pid\": N} or {\"tag\": \"...\"}");
		return -1;
	}
	if (envd_http_proc_list(ch, NULL, want, want ? NULL : tag, &found, deadline, e) < 0)
		return -1;
	if (!found) {
		if (want)
			envd_http_eset(e, CONNECT_NOT_FOUND, "process with pid %u not found", want);
		else
			envd_http_eset(e, CONNECT_NOT_FOUND, "process with tag %.100s not found", tag);
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
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "%s: expected base64", k);
		return -1;
	}
	return 0;
}

/* Send bytes as INPUT frames. */
static int send_input(struct envd *ch, uint32_t pid, const uint8_t *d, size_t n, int64_t deadline, struct envd_err *e)
{
	uint8_t *buf = malloc(4 + EPROTO_MAX_CHUNK);
	int rc = 0;

	if (!buf) {
		envd_http_eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		return -1;
	}
	buf[0] = (uint8_t)pid;
	buf[1] = (uint8_t)(pid >> 8);
	buf[2] = (uint8_t)(pid >> 16);
	buf[3] = (uint8_t)(pid >> 24);
	for (size_t off = 0; off < n && rc == 0;) {
		size_t k = n - off > EPROTO_MAX_CHUNK ? EPROTO_MAX_CHUNK : n - off;

		memcpy(buf + 4, d + off, k);
		rc = envd_send(ch, EP_INPUT, buf, 4 + k, deadline, e);
		off += k;
	}
	free(buf);
	return rc;
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
json_t *envd_http_process_unary(struct envd *ch, const char *method, json_t *req, int64_t deadline, struct envd_err *e)
{
	json_t *sel = json_object_get(req, "process");
	uint32_t pid, found, v[3];
	uint8_t buf[16];
	ssize_t len;

	if (!strcmp(method, "List")) {
		json_t *a = json_array();

		if (envd_http_proc_list(ch, a, 0, NULL, &found, deadline, e) < 0) {
			json_decref(a);
			return NULL;
		}
		return json_pack("{s:o}", "processes", a);
	}
	if (strcmp(method, "SendInput") && strcmp(method, "CloseStdin") && strcmp(method, "SendSignal") &&
	    strcmp(method, "Update")) {
		envd_http_eset(e, CONNECT_UNIMPLEMENTED, "process.Process/%.40s is not supported", method);
		return NULL;
	}
	if (selector_pid(ch, sel, &pid, deadline, e) < 0)
		return NULL;
	if (!strcmp(method, "SendInput")) {
		json_t *in = json_object_get(req, "input");
		uint8_t *d = NULL;
		size_t n = 0;
		int present = 0, rc;

		if (!json_is_object(in)) {
			envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "input: expected {\"stdin\"|\"pty\": base64}");
			return NULL;
		}
		if (jbytes(in, "stdin", &d, &n, &present, e) < 0)
			return NULL;
		if (!present && jbytes(in, "pty", &d, &n, &present, e) < 0)
			return NULL;
		rc = send_input(ch, pid, d, n, deadline, e);
		free(d);
		return rc < 0 ? NULL : json_object();
	}
	v[0] = pid;
	if (!strcmp(method, "CloseStdin")) {
		len = eproto_u32s_encode(buf, sizeof(buf), v, 1);
		return envd_send(ch, EP_CLOSE_STDIN, buf, (size_t)len, deadline, e) < 0 ? NULL : json_object();
	}
	if (!strcmp(method, "SendSignal")) {
		if (parse_signal(json_object_get(req, "signal"), &v[1]) < 0) {
			envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "signal: expected SIGNAL_SIGKILL or SIGNAL_SIGTERM");
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
		envd_http_juint(size, "rows", &v[1], &bad);
		envd_http_juint(size, "cols", &v[2], &bad);
		if (bad || v[1] < 1 || v[1] > PROTO_MAX_TTY_DIM || v[2] < 1 || v[2] > PROTO_MAX_TTY_DIM) {
			envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "pty.size: rows and cols 1-%d", PROTO_MAX_TTY_DIM);
			return NULL;
		}
		len = eproto_u32s_encode(buf, sizeof(buf), v, 3);
		return envd_send(ch, EP_RESIZE, buf, (size_t)len, deadline, e) < 0 ? NULL : json_object();
	}
}

/* Unary filesystem methods. */
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
	int64_t until = envd_http_now_ms() + p->keepalive_ms;

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
	if (p->deadline && envd_http_now_ms() >= p->deadline) {
		/* The command's deadline: its whole process group goes. */
		uint32_t v[2] = { p->pid, SIGKILL };
		uint8_t buf[8];
		ssize_t len = eproto_u32s_encode(buf, sizeof(buf), v, 2);
		struct envd_err e;

		if (p->kill_at_deadline)
			envd_send(p->ch, EP_SIGNAL, buf, (size_t)len, envd_http_now_ms() + 1000, &e);
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
 * deadline: a detached thread waits for it (holding the envd_http_channel). */
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

	while (envd_http_now_ms() < k->at && envd_alive(k->ch)) {
		int64_t left = k->at - envd_http_now_ms();
		struct timespec ts = { .tv_sec = left > 1000 ? 1 : 0, .tv_nsec = left > 1000 ? 0 : left * 1000000 };

		nanosleep(&ts, NULL);
	}
	if (envd_alive(k->ch))
		envd_send(k->ch, EP_SIGNAL, buf, (size_t)len, envd_http_now_ms() + 1000, &e);
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
	struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, pstream_read, p,
								   pstream_free);
	enum MHD_Result ret;

	if (!resp) {
		pstream_free(p);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "application/connect+json");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* A stream that is only its end-of-stream error. */
enum MHD_Result envd_http_stream_error(struct MHD_Connection *conn, const struct envd_err *e)
{
	struct buf b = BUF_INIT;
	struct MHD_Response *resp;
	enum MHD_Result ret;

	connect_end_append(&b, e->code, e->msg);
	resp = MHD_create_response_from_buffer(b.len, b.p ? b.p : "", MHD_RESPMEM_MUST_COPY);
	buf_free(&b);
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, "Content-Type", "application/connect+json");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

static struct pstream *pstream_new(struct MHD_Connection *conn, struct envd *ch, struct envd_err *e)
{
	struct pstream *p = calloc(1, sizeof(*p));
	const char *ka = envd_http_header(conn, "Keepalive-Ping-Interval");
	int64_t to = connect_timeout_ms(envd_http_header(conn, "Connect-Timeout-Ms"));

	if (!p) {
		envd_http_eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		return NULL;
	}
	p->ch = ch;
	buf_init(&p->st, 0);
	p->keepalive_ms = STREAM_KEEPALIVE_S * 1000;
	if (ka && atoi(ka) > 0 && atoi(ka) <= 3600)
		p->keepalive_ms = (int64_t)atoi(ka) * 1000;
	if (to < 0) {
		free(p);
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "Connect-Timeout-Ms: expected 1-10 digits");
		return NULL;
	}
	p->deadline = to ? envd_http_now_ms() + to : 0;
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
		envd_http_eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		return -1;
	}
	if (!json_is_object(proc)) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "process: expected an object");
		goto out;
	}
	cmd = envd_http_jstr(proc, "cmd", PROTO_MAX_PATH, &bad);
	cwd = envd_http_jstr(proc, "cwd", PROTO_MAX_PATH, &bad);
	tag = envd_http_jstr(req, "tag", EPROTO_MAX_TAG, &bad);
	args = json_object_get(proc, "args");
	envs = json_object_get(proc, "envs");
	if (bad || !cmd || !*cmd || (args && !json_is_array(args) && !json_is_null(args)) ||
	    (envs && !json_is_object(envs) && !json_is_null(envs)) || json_array_size(args) + 1 > PROTO_MAX_ARGS) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "process: expected {cmd, args:[strings], envs:{string: string}, cwd}");
		goto out;
	}
	m->argv[m->argc++] = cmd;
	json_array_foreach(args, i, v) {
		if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
			envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "process.args: expected strings");
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
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "process.envs: at most %d variables", PROTO_MAX_ENV);
		goto out;
	}
	json_object_foreach(env, k, v) {
		if (!*k || strchr(k, '=') || !json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
			json_decref(env);
			envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "process.envs: names without '=', string values without NUL");
			goto out;
		}
		if (asprintf(&kv[nkv], "%s=%s", k, json_string_value(v)) < 0) {
			json_decref(env);
			envd_http_eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
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

		envd_http_juint(size, "rows", &m->rows, &bad);
		envd_http_juint(size, "cols", &m->cols, &bad);
		if (bad || m->rows < 1 || m->rows > PROTO_MAX_TTY_DIM || m->cols < 1 || m->cols > PROTO_MAX_TTY_DIM) {
			envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "pty.size: rows and cols 1-%d", PROTO_MAX_TTY_DIM);
			goto out;
		}
		m->flags |= EP_START_PTY;
	}
	n = eproto_start_encode(buf, PROTO_MAX_PAYLOAD, m);
	if (n < 0)
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "the command, its arguments and env are too large together");
out:
	for (i = 0; i < nkv; i++)
		free(kv[i]);
	free(kv);
	free(m);
	return n;
}

enum MHD_Result envd_http_process_stream(struct session_table *ss, struct httpd_req *r, const char *method)
{
	struct envd_err e = { 0 };
	json_t *req, *env = NULL;
	struct envd *ch = NULL;
	struct pstream *p = NULL;
	char user[EPROTO_MAX_USER + 1];
	uint8_t *buf = NULL;

	req = envd_http_request_json(r, 1, &e);
	if (!req)
		return envd_http_stream_error(r->conn, &e);
	if (envd_http_auth_user(r->conn, user) < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:) with a valid user name");
		goto fail;
	}
	ch = envd_http_channel(ss, r->param[0], &env, &e);
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
			envd_http_eset(&e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
			goto fail;
		}
		n = start_encode(req, env, user, buf, &e);
		if (n < 0 || envd_start(p->ch, buf, (size_t)n, envd_http_now_ms() + UNARY_DEFAULT_MS, &p->sub, &p->pid, &e) < 0)
			goto fail;
		p->kill_at_deadline = 1;
	} else {
		/* Connect: subscribe first, then make sure it exists: an END
		 * before the subscription means it is gone (not_found). */
		json_t *sel = json_object_get(req, "process");
		uint32_t want = 0, found;
		int bad = 0;
		const char *tag = envd_http_jstr(sel, "tag", EPROTO_MAX_TAG, &bad);

		envd_http_juint(sel, "pid", &want, &bad);
		if (bad || !json_is_object(sel) || (!want && !tag)) {
			envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "process: expected {\"pid\": N} or {\"tag\": \"...\"}");
			goto fail;
		}
		if (!want) {
			if (envd_http_proc_list(p->ch, NULL, 0, tag, &want, envd_http_now_ms() + UNARY_DEFAULT_MS, &e) < 0)
				goto fail;
			if (!want) {
				envd_http_eset(&e, CONNECT_NOT_FOUND, "process with tag %.100s not found", tag);
				goto fail;
			}
		}
		p->sub = envd_subscribe(p->ch, want, &e);
		if (!p->sub)
			goto fail;
		if (envd_http_proc_list(p->ch, NULL, want, NULL, &found, envd_http_now_ms() + UNARY_DEFAULT_MS, &e) < 0)
			goto fail;
		if (!found) {
			envd_http_eset(&e, CONNECT_NOT_FOUND, "process with pid %u not found", want);
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
	return envd_http_stream_error(r->conn, &e);
}
