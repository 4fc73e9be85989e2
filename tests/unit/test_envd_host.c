/* test_envd_host: host/envd/envd.c, kiln-host's end of the kiln.envd port,
 * against a fake guest on the other end of a socketpair (a thread that
 * answers frames as guest/envd.c does): the HELLO handshake before the
 * first request, replies routed by request id, START with its output
 * delivered to the subscriber and acknowledged as it is taken, output with
 * no subscriber acknowledged at once, a READ's window, a guest HELLO that
 * fails what is pending, envd_kill, a malformed frame, and directory
 * watches (events in order, errors, the bound, a queue overflow, a guest
 * without the feature, a hostile event name). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "envd.h"
#include "eproto.h"
#include "proto.h"

struct guest {
	int fd;
	pthread_t th;
	pthread_mutex_t lock;
	uint64_t acked[4];      /* by id: [0] pid 100, [1] pid 555, [2] READ reqs, [3] other */
	int hellos;             /* HELLOs asked by the host */
	int stop;
	int listdir_says_hello; /* answer a LISTDIR with a HELLO of its own */
	int send_garbage;       /* answer a STAT with a frame of an unknown type */
	uint32_t last_signal[2];
	uint32_t read_req;      /* a READ waiting for its first chunk's ACK */
	int start_how;          /* a START waiting for its first chunk's ACK (0: none) */
	int unwatched;          /* UNWATCHes seen */
};

/* What the fake guest's HELLO offers (test_watch_old_guest: nothing). */
static uint32_t g_features = EPROTO_FEAT_WATCH;

static void g_send(struct guest *g, uint8_t type, const void *p, size_t n)
{
	assert_int_equal(proto_send(g->fd, type, p, n, proto_now_ms() + 5000), 0);
}

static void g_u32s(struct guest *g, uint8_t type, const uint32_t *v, unsigned n)
{
	uint8_t b[32];
	ssize_t len = eproto_u32s_encode(b, sizeof(b), v, n);

	g_send(g, type, b, (size_t)len);
}

static void g_entry(struct guest *g, uint32_t req, const char *name, uint64_t size)
{
	static struct eproto_entry en;
	static uint8_t b[PROTO_MAX_PAYLOAD];
	ssize_t n;

	memset(&en, 0, sizeof(en));
	en.req = req;
	en.type = EP_FILE;
	en.mode = 0100644;
	en.size = size;
	snprintf(en.name, sizeof(en.name), "%s", name);
	snprintf(en.path, sizeof(en.path), "/home/user/%s", name);
	n = eproto_entry_encode(b, sizeof(b), &en);
	g_send(g, EP_ENTRY, b, (size_t)n);
}

static void g_out(struct guest *g, uint32_t pid, const char *s)
{
	uint8_t b[256];
	ssize_t n = eproto_out_encode(b, sizeof(b), pid, EP_STDOUT, s, strlen(s));

	g_send(g, EP_OUT, b, (size_t)n);
}

static void g_data(struct guest *g, uint32_t req, const char *s)
{
	uint8_t b[256];
	size_t n = strlen(s);

	memcpy(b, &req, 4);
	memcpy(b + 4, s, n);
	g_send(g, EP_DATA, b, 4 + n);
}

static void g_frame(struct guest *g, const struct proto_frame *f)
{
	static struct eproto_fsreq q;
	static struct eproto_start st;
	uint32_t v[3];
	uint8_t how = PROTO_EXITED;

	switch (f->type) {
	case EP_HELLO:
		assert_int_equal(eproto_u32s_decode(f->payload, f->len, v, 2), 0);
		assert_int_equal(v[0], EPROTO_VERSION);
		pthread_mutex_lock(&g->lock);
		g->hellos++;
		pthread_mutex_unlock(&g->lock);
		/* Leftovers of an old connection first: the host must skip them. */
		g_out(g, 100, "stale");
		g_u32s(g, EP_HELLO, (uint32_t[]){ EPROTO_VERSION, g_features }, 2);
		g_u32s(g, EP_DONE, &v[1], 1);
		return;
	case EP_WATCH: {
		static struct eproto_watch w;
		static uint8_t b[PROTO_MAX_PAYLOAD];
		ssize_t n;

		assert_int_equal(eproto_watch_decode(f->payload, f->len, &w), 0);
		if (!strcmp(w.path, "missing") || !strcmp(w.path, "file")) {
			n = eproto_error_encode(b, sizeof(b), w.req, !strcmp(w.path, "missing") ? -ENOENT : -ENOTDIR, "no");
			g_send(g, EP_ERROR, b, (size_t)n);
			return;
		}
		g_u32s(g, EP_DONE, &w.req, 1);
		if (!strcmp(w.path, "evil")) {
			n = eproto_wevent_encode(b, sizeof(b), w.id, EP_WEV_CREATE, "ok");
			g_send(g, EP_WATCH_EVENT, b, (size_t)n);
			/* A name outside the watched directory: the encoder writes
			 * it, the host's decoder must refuse it. */
			n = eproto_wevent_encode(b, sizeof(b), w.id, EP_WEV_CREATE, "../../etc/passwd");
			g_send(g, EP_WATCH_EVENT, b, (size_t)n);
			return;
		}
		for (int i = 0; i < (!strcmp(w.path, "flood") ? (int)ENVD_WATCH_Q_EVENTS + 10 : 1); i++) {
			n = eproto_wevent_encode(b, sizeof(b), w.id, EP_WEV_CREATE, "a");
			g_send(g, EP_WATCH_EVENT, b, (size_t)n);
		}
		n = eproto_wevent_encode(b, sizeof(b), w.id, EP_WEV_WRITE, "sub/b");
		g_send(g, EP_WATCH_EVENT, b, (size_t)n);
		return;
	}
	case EP_UNWATCH: {
		uint8_t b[64];
		ssize_t n;

		assert_int_equal(eproto_u32s_decode(f->payload, f->len, v, 1), 0);
		pthread_mutex_lock(&g->lock);
		g->unwatched++;
		pthread_mutex_unlock(&g->lock);
		n = eproto_wend_encode(b, sizeof(b), v[0], 0, "");
		g_send(g, EP_WATCH_END, b, (size_t)n);
		return;
	}
	case EP_ACK:
		assert_int_equal(eproto_u32s_decode(f->payload, f->len, v, 2), 0);
		pthread_mutex_lock(&g->lock);
		g->acked[v[0] == 100 ? 0 : v[0] == 555 ? 1 : v[0] >= 0x80000000u ? 2 : 3] += v[1];
		pthread_mutex_unlock(&g->lock);
		/* The window reopened: the rest goes (as the guest's does). */
		if (g->read_req && v[0] == g->read_req) {
			g_data(g, g->read_req, "world");
			g_u32s(g, EP_DONE, &g->read_req, 1);
			g->read_req = 0;
		}
		if (g->start_how && v[0] == 100) {
			uint8_t b[32];
			ssize_t n = eproto_end_encode(b, sizeof(b), 100, (uint8_t)g->start_how,
						      g->start_how == PROTO_SIGNALED ? 9 : 3);

			g_out(g, 100, "two");
			g_send(g, EP_END, b, (size_t)n);
			g->start_how = 0;
		}
		return;
	case EP_STAT:
		assert_int_equal(eproto_fsreq_decode(f->payload, f->len, EP_STAT, &q), 0);
		if (g->send_garbage) {
			g_send(g, 0x7f, "x", 1);
			return;
		}
		if (!strcmp(q.path, "missing")) {
			uint8_t b[256];
			ssize_t n = eproto_error_encode(b, sizeof(b), q.req, -ENOENT, "no such file");

			g_send(g, EP_ERROR, b, (size_t)n);
			return;
		}
		assert_string_equal(q.user, "root");
		g_entry(g, q.req, q.path, 5);
		return;
	case EP_LISTDIR:
		assert_int_equal(eproto_fsreq_decode(f->payload, f->len, EP_LISTDIR, &q), 0);
		if (g->listdir_says_hello) {
			g_u32s(g, EP_HELLO, (uint32_t[]){ EPROTO_VERSION, 0 }, 2);
			return;
		}
		g_entry(g, q.req, "a", 1);
		g_entry(g, q.req, "b", 2);
		g_u32s(g, EP_DONE, &q.req, 1);
		return;
	case EP_READ:
		assert_int_equal(eproto_fsreq_decode(f->payload, f->len, EP_READ, &q), 0);
		g_data(g, q.req, "hello ");
		g->read_req = q.req;
		return;
	case EP_START:
		assert_int_equal(eproto_start_decode(f->payload, f->len, &st), 0);
		g_u32s(g, EP_STARTED, (uint32_t[]){ st.req, 100 }, 2);
		/* Output of a process nobody listens to. */
		g_out(g, 555, "nobody");
		g_out(g, 100, "one ");
		if (!strcmp(st.argv[0], "killme"))
			how = PROTO_SIGNALED;
		g->start_how = how; /* "two" and END once "one " is acknowledged */
		return;
	case EP_SIGNAL:
		assert_int_equal(eproto_u32s_decode(f->payload, f->len, v, 2), 0);
		pthread_mutex_lock(&g->lock);
		memcpy(g->last_signal, v, sizeof(g->last_signal));
		pthread_mutex_unlock(&g->lock);
		return;
	default:
		return;
	}
}

static void *guest_main(void *arg)
{
	struct guest *g = arg;
	static uint8_t buf[2 * PROTO_MAX_FRAME];
	size_t len = 0;

	for (;;) {
		struct pollfd p = { .fd = g->fd, .events = POLLIN };
		struct proto_frame f;
		ssize_t n, k;
		size_t off = 0;

		pthread_mutex_lock(&g->lock);
		if (g->stop) {
			pthread_mutex_unlock(&g->lock);
			break;
		}
		pthread_mutex_unlock(&g->lock);
		if (poll(&p, 1, 50) <= 0)
			continue;
		n = read(g->fd, buf + len, sizeof(buf) - len);
		if (n <= 0)
			break;
		len += (size_t)n;
		while ((k = proto_frame_parse(buf + off, len - off, &f)) > 0) {
			g_frame(g, &f);
			off += (size_t)k;
		}
		memmove(buf, buf + off, len - off);
		len -= off;
	}
	return NULL;
}

static struct guest *g;
static struct envd *ch;
static int host_fd;

static int setup(void **state)
{
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	g = calloc(1, sizeof(*g));
	g->fd = sv[1];
	pthread_mutex_init(&g->lock, NULL);
	assert_int_equal(pthread_create(&g->th, NULL, guest_main, g), 0);
	host_fd = sv[0];
	ch = envd_open(host_fd, "test");
	assert_non_null(ch);
	return 0;
}

static int teardown(void **state)
{
	envd_kill(ch, "test over");
	envd_unref(ch);
	close(host_fd);
	pthread_mutex_lock(&g->lock);
	g->stop = 1;
	pthread_mutex_unlock(&g->lock);
	pthread_join(g->th, NULL);
	close(g->fd);
	free(g);
	return 0;
}

static struct envd_req *fs(uint8_t type, const char *user, const char *path, struct envd_err *e)
{
	static struct eproto_fsreq q;
	static uint8_t b[PROTO_MAX_PAYLOAD];
	ssize_t n;

	memset(&q, 0, sizeof(q));
	snprintf(q.user, sizeof(q.user), "%s", user);
	snprintf(q.path, sizeof(q.path), "%s", path);
	q.depth = 1;
	n = eproto_fsreq_encode(b, sizeof(b), type, &q);
	assert_true(n > 0);
	return envd_req_begin(ch, type, b, (size_t)n, proto_now_ms() + 5000, e);
}

static uint64_t acked(int i)
{
	uint64_t v;

	pthread_mutex_lock(&g->lock);
	v = g->acked[i];
	pthread_mutex_unlock(&g->lock);
	return v;
}

/* Wait (at most 5 s) for the guest to have seen acks of want bytes in slot i. */
static int wait_acked(int i, uint64_t want)
{
	for (int t = 0; t < 500; t++) {
		if (acked(i) >= want)
			return 1;
		usleep(10000);
	}
	return 0;
}

static void test_hello_then_stat(void **state)
{
	struct envd_err e;
	struct envd_reply rep;
	struct eproto_entry en;
	struct envd_req *r = fs(EP_STAT, "root", "f.txt", &e);

	assert_non_null(r);
	assert_int_equal(g->hellos, 1);
	assert_int_equal(envd_req_next(r, &rep, proto_now_ms() + 5000, &e), 1);
	assert_int_equal(rep.type, EP_ENTRY);
	assert_int_equal(eproto_entry_decode(rep.payload, rep.len, &en), 0);
	assert_int_equal(en.req, envd_req_id(r));
	assert_string_equal(en.name, "f.txt");
	assert_int_equal(en.size, 5);
	/* STAT ends with its ENTRY. */
	assert_int_equal(envd_req_next(r, &rep, proto_now_ms() + 5000, &e), 0);
	envd_req_free(r);
	/* The stale OUT before the handshake's DONE was dropped unacknowledged. */
	assert_int_equal(acked(0), 0);
}

static void test_error_codes(void **state)
{
	struct envd_err e;
	struct envd_reply rep;
	struct envd_req *r = fs(EP_STAT, "root", "missing", &e);

	assert_non_null(r);
	assert_int_equal(envd_req_next(r, &rep, proto_now_ms() + 5000, &e), -1);
	assert_int_equal(e.code, CONNECT_NOT_FOUND);
	assert_int_equal(e.errnum, -ENOENT);
	assert_string_equal(e.msg, "no such file");
	envd_req_free(r);
}

static void test_listdir_many(void **state)
{
	struct envd_err e;
	struct envd_reply rep;
	struct eproto_entry en;
	struct envd_req *r = fs(EP_LISTDIR, "", "/home/user", &e);
	int n = 0;

	assert_non_null(r);
	while (envd_req_next(r, &rep, proto_now_ms() + 5000, &e) == 1 && rep.type == EP_ENTRY) {
		assert_int_equal(eproto_entry_decode(rep.payload, rep.len, &en), 0);
		n++;
	}
	assert_int_equal(rep.type, EP_DONE);
	assert_int_equal(n, 2);
	envd_req_free(r);
}

static void test_read_acks(void **state)
{
	struct envd_err e;
	struct envd_reply rep;
	struct envd_req *r = fs(EP_READ, "", "f", &e);
	size_t total = 0;

	assert_non_null(r);
	while (envd_req_next(r, &rep, proto_now_ms() + 5000, &e) == 1 && rep.type == EP_DATA) {
		total += rep.len - 4;
		envd_req_ack(r, rep.len - 4);
	}
	assert_int_equal(rep.type, EP_DONE);
	assert_int_equal(total, 11);
	assert_int_equal(acked(2), 6); /* "hello " was acked: only then did the rest come */
	envd_req_free(r);
}

static ssize_t start_msg(uint8_t *b, const char *prog)
{
	static struct eproto_start m;

	memset(&m, 0, sizeof(m));
	m.user = "";
	m.cwd = "";
	m.tag = "";
	m.argc = 1;
	m.argv[0] = prog;
	return eproto_start_encode(b, PROTO_MAX_PAYLOAD, &m);
}

static void test_start_stream(void **state)
{
	static uint8_t b[PROTO_MAX_PAYLOAD];
	ssize_t n = start_msg(b, "/bin/true");
	struct envd_err e;
	struct envd_sub *s;
	struct envd_event ev;
	uint32_t pid;
	char got[64] = "";

	assert_int_equal(envd_start(ch, b, (size_t)n, proto_now_ms() + 5000, &s, &pid, &e), 0);
	assert_int_equal(pid, 100);
	for (;;) {
		envd_sub_next(s, &ev, proto_now_ms() + 5000);
		if (ev.kind != ENVD_EV_DATA)
			break;
		assert_int_equal(ev.stream, EP_STDOUT);
		strncat(got, (const char *)ev.data, ev.len);
	}
	assert_int_equal(ev.kind, ENVD_EV_END);
	assert_int_equal(ev.how, PROTO_EXITED);
	assert_int_equal(ev.status, 3);
	assert_string_equal(got, "one two");
	/* "one " was acknowledged once taken (only then did "two" and END
	 * come: the fake guest waits for it); "two" is acknowledged when taken
	 * too, which the guest may or may not have seen yet (7 under load);
	 * the 6 bytes of pid 555, which nobody listened to, at once. */
	{
		uint64_t a = acked(0);

		if (a != 4 && a != 7)
			fail_msg("acked %llu bytes of pid 100's output, want 4 (\"one \") or 7 (and \"two\")",
				 (unsigned long long)a);
	}
	assert_true(wait_acked(1, 6));
	envd_sub_free(s);
}

static void test_start_signaled(void **state)
{
	static uint8_t b[PROTO_MAX_PAYLOAD];
	ssize_t n = start_msg(b, "killme");
	struct envd_err e;
	struct envd_sub *s;
	struct envd_event ev;
	uint32_t pid;

	assert_int_equal(envd_start(ch, b, (size_t)n, proto_now_ms() + 5000, &s, &pid, &e), 0);
	do
		envd_sub_next(s, &ev, proto_now_ms() + 5000);
	while (ev.kind == ENVD_EV_DATA);
	assert_int_equal(ev.kind, ENVD_EV_END);
	assert_int_equal(ev.how, PROTO_SIGNALED);
	assert_int_equal(ev.status, 9);
	envd_sub_free(s);
	/* A frame without reply goes out. */
	{
		uint8_t sb[8];
		ssize_t len = eproto_u32s_encode(sb, sizeof(sb), (uint32_t[]){ 100, 15 }, 2);

		assert_int_equal(envd_send(ch, EP_SIGNAL, sb, (size_t)len, proto_now_ms() + 5000, &e), 0);
		for (int t = 0; t < 500 && g->last_signal[1] != 15; t++)
			usleep(10000);
		assert_int_equal(g->last_signal[0], 100);
		assert_int_equal(g->last_signal[1], 15);
	}
}

static void test_guest_hello_fails_pending(void **state)
{
	struct envd_err e;
	struct envd_reply rep;
	struct envd_req *r;
	struct envd_sub *s = envd_subscribe(ch, 4242, &e);

	assert_non_null(s);
	g->listdir_says_hello = 1;
	r = fs(EP_LISTDIR, "", "/", &e);
	assert_non_null(r);
	assert_int_equal(envd_req_next(r, &rep, proto_now_ms() + 5000, &e), -1);
	assert_int_equal(e.code, CONNECT_UNAVAILABLE);
	envd_req_free(r);
	{
		struct envd_event ev;

		envd_sub_next(s, &ev, proto_now_ms() + 5000);
		assert_int_equal(ev.kind, ENVD_EV_ERROR);
		assert_int_equal(ev.err.code, CONNECT_UNAVAILABLE);
	}
	envd_sub_free(s);
	/* The channel goes on: a new request is answered. */
	g->listdir_says_hello = 0;
	r = fs(EP_STAT, "root", "x", &e);
	assert_non_null(r);
	assert_int_equal(envd_req_next(r, &rep, proto_now_ms() + 5000, &e), 1);
	envd_req_free(r);
}

static void test_kill_fails_streams(void **state)
{
	struct envd_err e;
	struct envd_sub *s = envd_subscribe(ch, 4242, &e);
	struct envd_event ev;

	assert_non_null(s);
	envd_kill(ch, "the sandbox is being paused");
	envd_sub_next(s, &ev, proto_now_ms() + 5000);
	assert_int_equal(ev.kind, ENVD_EV_ERROR);
	assert_int_equal(ev.err.code, CONNECT_UNAVAILABLE);
	assert_string_equal(ev.err.msg, "the sandbox is being paused");
	envd_sub_free(s);
	assert_int_equal(envd_alive(ch), 0);
	assert_null(fs(EP_STAT, "root", "x", &e));
	assert_int_equal(e.code, CONNECT_UNAVAILABLE);
}

static void test_malformed_kills(void **state)
{
	struct envd_err e;
	struct envd_reply rep;
	struct envd_req *r;

	g->send_garbage = 1;
	r = fs(EP_STAT, "root", "x", &e);
	assert_non_null(r);
	assert_int_equal(envd_req_next(r, &rep, proto_now_ms() + 5000, &e), -1);
	assert_int_equal(e.code, CONNECT_UNAVAILABLE);
	envd_req_free(r);
	assert_int_equal(envd_alive(ch), 0);
}

static void test_no_hello_unavailable(void **state)
{
	int sv[2];
	struct envd *c2;
	struct envd_err e;
	uint8_t b[64];
	ssize_t n;
	int64_t t0 = proto_now_ms();

	/* A guest without envd never answers HELLO: unavailable, not a hang. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	c2 = envd_open(sv[0], "silent");
	n = eproto_u32s_encode(b, sizeof(b), (uint32_t[]){ 0 }, 1);
	assert_null(envd_req_begin(c2, EP_LIST, b, (size_t)n, proto_now_ms() + 300, &e));
	assert_int_equal(e.code, CONNECT_UNAVAILABLE);
	assert_true(proto_now_ms() - t0 < 3000);
	envd_unref(c2);
	close(sv[0]);
	close(sv[1]);
}

/* ---- directory watches ---- */

static int unwatched(void)
{
	int n;

	pthread_mutex_lock(&g->lock);
	n = g->unwatched;
	pthread_mutex_unlock(&g->lock);
	return n;
}

static int wait_watches(int want)
{
	for (int t = 0; t < 500; t++) {
		if (envd_watch_count(ch) == want)
			return 1;
		usleep(10000);
	}
	return 0;
}

static void test_watch_stream(void **state)
{
	static struct envd_wevent ev;
	struct envd_err e;
	struct envd_watch *w = envd_watch_open(ch, "user", "dir", 1, proto_now_ms() + 5000, &e);

	assert_non_null(w);
	assert_int_equal(envd_watch_count(ch), 1);
	assert_int_equal(envd_watch_next(w, &ev, proto_now_ms() + 5000, &e), 1);
	assert_int_equal(ev.type, EP_WEV_CREATE);
	assert_string_equal(ev.name, "a");
	assert_int_equal(envd_watch_next(w, &ev, proto_now_ms() + 5000, &e), 1);
	assert_int_equal(ev.type, EP_WEV_WRITE);
	assert_string_equal(ev.name, "sub/b");
	/* Nothing more: the deadline passes. */
	assert_int_equal(envd_watch_next(w, &ev, proto_now_ms() + 100, &e), 0);
	/* The channel is busy while the stream is open. */
	assert_int_equal(envd_refs(ch), 2);
	envd_watch_close(w);
	assert_int_equal(envd_refs(ch), 1);
	/* UNWATCH went; the watch is gone once the guest's WATCH_END came. */
	assert_true(wait_watches(0));
	assert_int_equal(unwatched(), 1);

	assert_null(envd_watch_open(ch, "user", "missing", 0, proto_now_ms() + 5000, &e));
	assert_int_equal(e.code, CONNECT_NOT_FOUND);
	assert_null(envd_watch_open(ch, "user", "file", 0, proto_now_ms() + 5000, &e));
	assert_int_equal(e.code, CONNECT_INVALID_ARGUMENT);
	assert_int_equal(envd_watch_count(ch), 0);
	assert_int_equal(envd_refs(ch), 1);
}

static void collect(void *arg, uint8_t type, const char *name)
{
	char *out = arg;

	snprintf(out + strlen(out), 256 - strlen(out), "%u %s,", type, name);
}

static void test_watchers(void **state)
{
	char ids[ENVD_MAX_WATCHES][ENVD_WATCHER_ID], id[ENVD_WATCHER_ID], got[256] = "";
	struct envd_err e;
	int i;

	assert_int_equal(envd_watcher_create(ch, "", "dir", 0, proto_now_ms() + 5000, ids[0], &e), 0);
	assert_int_equal(ids[0][0], 'w');
	/* A polling watcher does not keep the channel busy. */
	assert_int_equal(envd_refs(ch), 1);
	for (int t = 0; t < 500 && !strstr(got, "sub/b"); t++) {
		assert_int_equal(envd_watcher_events(ch, ids[0], collect, got, &e), 0);
		usleep(10000);
	}
	assert_string_equal(got, "1 a,2 sub/b,");
	got[0] = '\0';
	assert_int_equal(envd_watcher_events(ch, ids[0], collect, got, &e), 0);
	assert_string_equal(got, ""); /* drained */
	for (i = 1; i < ENVD_MAX_WATCHES; i++)
		assert_int_equal(envd_watcher_create(ch, "", "dir", 0, proto_now_ms() + 5000, ids[i], &e), 0);
	assert_int_equal(envd_watcher_create(ch, "", "dir", 0, proto_now_ms() + 5000, id, &e), -1);
	assert_int_equal(e.code, CONNECT_RESOURCE_EXHAUSTED);
	for (i = 0; i < ENVD_MAX_WATCHES; i++)
		assert_int_equal(envd_watcher_remove(ch, ids[i], &e), 0);
	assert_true(wait_watches(0));
	assert_int_equal(unwatched(), ENVD_MAX_WATCHES);
	assert_int_equal(envd_watcher_events(ch, ids[0], collect, got, &e), -1);
	assert_int_equal(e.code, CONNECT_NOT_FOUND);
	assert_int_equal(envd_watcher_remove(ch, ids[0], &e), -1);
	assert_int_equal(e.code, CONNECT_NOT_FOUND);
}

static void test_watcher_overflow(void **state)
{
	char id[ENVD_WATCHER_ID], got[256] = "";
	struct envd_err e;
	int rc = 0;

	/* More events than a watch may hold untaken: it fails, the guest is
	 * told to stop it, and every later look answers the error. */
	assert_int_equal(envd_watcher_create(ch, "", "flood", 0, proto_now_ms() + 5000, id, &e), 0);
	for (int t = 0; t < 500 && unwatched() == 0; t++)
		usleep(10000);
	assert_int_equal(unwatched(), 1);
	for (int k = 0; k < 2; k++) {
		rc = envd_watcher_events(ch, id, collect, got, &e);
		assert_int_equal(rc, -1);
		assert_int_equal(e.code, CONNECT_INTERNAL);
		assert_non_null(strstr(e.msg, "queue overflow"));
	}
	assert_int_equal(envd_watcher_remove(ch, id, &e), 0);
	assert_true(wait_watches(0));
}

static void test_watch_hostile_name(void **state)
{
	static struct envd_wevent ev;
	struct envd_err e;
	struct envd_watch *w = envd_watch_open(ch, "user", "evil", 0, proto_now_ms() + 5000, &e);
	int n;

	assert_non_null(w);
	/* The good event is handed out; the hostile one kills the channel. */
	while ((n = envd_watch_next(w, &ev, proto_now_ms() + 5000, &e)) == 1)
		assert_string_equal(ev.name, "ok");
	assert_int_equal(n, -1);
	assert_int_equal(e.code, CONNECT_UNAVAILABLE);
	assert_int_equal(envd_alive(ch), 0);
	envd_watch_close(w);
	assert_int_equal(envd_watch_count(ch), 0);
}

static int setup_old(void **state)
{
	g_features = 0;
	return setup(state);
}

static int teardown_old(void **state)
{
	g_features = EPROTO_FEAT_WATCH;
	return teardown(state);
}

static void test_watch_old_guest(void **state)
{
	struct envd_err e;
	char id[ENVD_WATCHER_ID];

	assert_null(envd_watch_open(ch, "user", "dir", 0, proto_now_ms() + 5000, &e));
	assert_int_equal(e.code, CONNECT_UNIMPLEMENTED);
	assert_int_equal(envd_watcher_create(ch, "", "dir", 0, proto_now_ms() + 5000, id, &e), -1);
	assert_int_equal(e.code, CONNECT_UNIMPLEMENTED);
	assert_int_equal(envd_refs(ch), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hello_then_stat, setup, teardown),
		cmocka_unit_test_setup_teardown(test_error_codes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listdir_many, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_acks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_start_stream, setup, teardown),
		cmocka_unit_test_setup_teardown(test_start_signaled, setup, teardown),
		cmocka_unit_test_setup_teardown(test_guest_hello_fails_pending, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kill_fails_streams, setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed_kills, setup, teardown),
		cmocka_unit_test(test_no_hello_unavailable),
		cmocka_unit_test_setup_teardown(test_watch_stream, setup, teardown),
		cmocka_unit_test_setup_teardown(test_watchers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_watcher_overflow, setup, teardown),
		cmocka_unit_test_setup_teardown(test_watch_hostile_name, setup, teardown),
		cmocka_unit_test_setup_teardown(test_watch_old_guest, setup_old, teardown_old),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
