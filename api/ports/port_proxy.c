/* port_proxy: one HTTP request to a server in a sandbox (ports.h). The
 * request goes out as libmicrohttpd parsed it: the request line with the
 * client's target, the client's headers minus hop-by-hop ones and kiln's own
 * credentials, and the body with kiln-api's framing (the same Content-Length,
 * or chunked again as it arrives), so that what the server reads is exactly
 * the request kiln-api checked. The answer is read with http-parser
 * (port_resp.c) and handed to libmicrohttpd as it comes: a download or an
 * event stream is never held whole. While the answer waits on a silent
 * server, a client that hung up is noticed (its socket is polled beside the
 * tunnel) and the call ends. */
#include "ports_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "reply.h"

#define PORT_OPEN_MS 15000        /* the tunnel and the server's connect */
#define PORT_SEND_MS 60000        /* a piece of the body written to the server */
#define PORT_HEAD_MS 300000       /* the server's answer head after the request */
#define PORT_DROP_MAX (1u << 20)  /* a refused request's body dropped before the connection closes */
#define PORT_READ 65536

struct ports_call {
	struct sessions *ss;
	int refs;                    /* the request's, the answer's, an upgrade's (atomic) */
	char id[40];
	unsigned port;
	int entered;                 /* sessions_port_enter done */
	int fd;                      /* the tunnel (-1: none) */
	int client_fd;               /* the client's socket, polled for its hang-up */
	struct kiln_err err;         /* failed: the refusal */
	int failed;
	size_t dropped;
	unsigned host_status;        /* kiln-host refused: its status and body are passed on */
	char host_body[1024];
	int up_chunked;              /* the request body goes chunked */
	int upgrade;                 /* the client asked for an Upgrade */
	int tunnel;                  /* Upgrade: kiln-tunnel (native): bytes both ways, no HTTP to the server */
	int e2b;                     /* reached E2B's way (header routing, host name) */
	int eof;                     /* the server's side ended */
	int upgrade_queued;          /* a 101 was queued: on_upgraded holds a reference ... */
	int upgraded;                /* ... which it took over (it ran) */
	struct buf body;             /* answer body bytes not yet handed out */
	size_t body_off;
	struct port_resp *r;
	char raw[PORT_READ];         /* read from the server, not yet fed (after the head of a 101) */
	size_t raw_len, raw_off;
};

/* What /metrics says (ports_stats). */
static uint64_t stat_requests[3], stat_refused, stat_upgrades, stat_open;

void ports_stats(struct ports_stats *out)
{
	out->requests_native = __atomic_load_n(&stat_requests[PORTS_NATIVE], __ATOMIC_RELAXED);
	out->requests_e2b = __atomic_load_n(&stat_requests[PORTS_E2B], __ATOMIC_RELAXED);
	out->refused = __atomic_load_n(&stat_refused, __ATOMIC_RELAXED);
	out->upgrades = __atomic_load_n(&stat_upgrades, __ATOMIC_RELAXED);
	out->open = __atomic_load_n(&stat_open, __ATOMIC_RELAXED);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void call_unref(struct ports_call *c)
{
	if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL))
		return;
	__atomic_sub_fetch(&stat_open, 1, __ATOMIC_RELAXED);
	if (c->fd >= 0)
		close(c->fd);
	if (c->entered)
		sessions_port_leave(c->ss, c->id);
	sessions_release(c->ss);
	buf_free(&c->body);
	free(c->r);
	free(c);
}

static void call_ref(struct ports_call *c)
{
	__atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
}

/* ---- the request ---- */

/* Headers that describe one hop, not the request, and kiln's own
 * credentials and routing: never sent to the sandbox's server. */
static const char *const dropped_headers[] = {
	"Host", "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "TE", "Trailer",
	"Transfer-Encoding", "Upgrade", "Content-Length", "Expect", "X-API-KEY", "E2b-Sandbox-Id",
	"E2b-Sandbox-Port", "X-Access-Token", "e2b-traffic-access-token", "X-Forwarded-For",
	"X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded",
};

struct head_b {
	struct buf *b;
	const char *connection;      /* the client's Connection header: its tokens are hop-by-hop too */
	int native;                  /* Authorization is the caller's kiln key */
	int bad;
};

/* Whether name is one of the comma-separated tokens of list. */
static int in_token_list(const char *list, const char *name)
{
	size_t n = strlen(name);

	while (list && *list) {
		const char *end;
		size_t len;

		list += strspn(list, " \t,");
		end = list + strcspn(list, ",");
		len = (size_t)(end - list);
		while (len && (list[len - 1] == ' ' || list[len - 1] == '\t'))
			len--;
		if (len == n && !strncasecmp(list, name, n))
			return 1;
		list = end;
	}
	return 0;
}

static enum MHD_Result add_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct head_b *h = cls;

	(void)kind;
	for (size_t i = 0; i < sizeof(dropped_headers) / sizeof(dropped_headers[0]); i++)
		if (!strcasecmp(key, dropped_headers[i]))
			return MHD_YES;
	if ((h->native && !strcasecmp(key, "Authorization")) || in_token_list(h->connection, key))
		return MHD_YES;
	/* libmicrohttpd hands out what it parsed: a CR or LF cannot be in it,
	 * but a NUL-cut value or an empty name is refused rather than sent. */
	if (!key[0] || strpbrk(key, "\r\n: \t") || (value && strpbrk(value, "\r\n")))
		return MHD_YES;
	if (buf_printf(h->b, "%s: %s\r\n", key, value ? value : "") < 0)
		h->bad = 1;
	return h->bad ? MHD_NO : MHD_YES;
}

struct count_b {
	const char *name;
	unsigned n;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct count_b *c = cls;

	(void)kind;
	(void)value;
	if (!strcasecmp(key, c->name))
		c->n++;
	return MHD_YES;
}

static unsigned header_count(struct MHD_Connection *conn, const char *name)
{
	struct count_b c = { name, 0 };

	MHD_get_connection_values(conn, MHD_HEADER_KIND, count_header, &c);
	return c.n;
}

static int digits(const char *s)
{
	if (!s || !*s || strlen(s) > 19)
		return 0;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/* The request head for the server; -1 with c->err set when the request's
 * framing is one kiln does not pass on (it would be read differently by
 * different parsers). */
static int build_head(struct ports_call *c, struct MHD_Connection *conn, const char *method,
		      const struct ports_match *m, struct buf *b)
{
	const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
	const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
	const char *connection = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION);
	const char *upgrade = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_UPGRADE);
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	char addr[64] = "unknown";
	struct head_b h = { b, connection, m->way == PORTS_NATIVE, 0 };

	/* Smuggling: two lengths, a length and chunking, or a coding other
	 * than chunked would mean one thing to libmicrohttpd and perhaps
	 * another to the server; kiln frames the body itself, but refuses them
	 * so that no reading of them is guessed. */
	if (header_count(conn, MHD_HTTP_HEADER_CONTENT_LENGTH) > 1 || header_count(conn, "Transfer-Encoding") > 1 ||
	    (cl && te) || (cl && !digits(cl)) || (te && strcasecmp(te, "chunked")))
		return kiln_err_set(&c->err, KERR_INVALID_REQUEST,
				    "the request's framing is ambiguous (Content-Length and Transfer-Encoding)");
	if (!host || !host[0] || strpbrk(host, "\r\n"))
		host = "localhost";
	if (ci && ci->client_addr) {
		const struct sockaddr *sa = ci->client_addr;

		if (sa->sa_family == AF_INET)
			inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, addr, sizeof(addr));
		else if (sa->sa_family == AF_INET6)
			inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, addr, sizeof(addr));
	}
	c->upgrade = upgrade && upgrade[0] && !strpbrk(upgrade, "\r\n") && in_token_list(connection, "upgrade");
	if (buf_printf(b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, m->target, host) < 0)
		return kiln_err_set(&c->err, KERR_TOO_LARGE, "the request head is too large");
	MHD_get_connection_values(conn, MHD_HEADER_KIND, add_header, &h);
	if (h.bad || buf_printf(b, "X-Forwarded-For: %s\r\nX-Forwarded-Host: %s\r\nX-Forwarded-Proto: %s\r\n", addr,
				host, MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION) ? "https" : "http") < 0)
		return kiln_err_set(&c->err, KERR_TOO_LARGE, "the request head is too large");
	if (c->upgrade) {
		if (buf_printf(b, "Connection: Upgrade\r\nUpgrade: %s\r\n", upgrade) < 0)
			return kiln_err_set(&c->err, KERR_TOO_LARGE, "the request head is too large");
	} else if (buf_printf(b, "Connection: close\r\n") < 0) {
		return kiln_err_set(&c->err, KERR_TOO_LARGE, "the request head is too large");
	}
	if (cl && buf_printf(b, "Content-Length: %s\r\n", cl) < 0)
		return kiln_err_set(&c->err, KERR_TOO_LARGE, "the request head is too large");
	if (te) {
		c->up_chunked = 1;
		if (buf_printf(b, "Transfer-Encoding: chunked\r\n") < 0)
			return kiln_err_set(&c->err, KERR_TOO_LARGE, "the request head is too large");
	}
	return buf_add(b, "\r\n", 2) < 0 ? kiln_err_set(&c->err, KERR_TOO_LARGE, "the request head is too large") : 0;
}

struct ports_call *ports_begin(struct sessions *ss, struct MHD_Connection *conn, const char *method,
			       const struct ports_match *m, const char *customer, struct quota_limiter *lim)
{
	struct ports_call *c = calloc(1, sizeof(*c));
	const char *traffic = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "e2b-traffic-access-token");
	struct sessions_port_target t;
	struct port_tunnel_fail f;
	const union MHD_ConnectionInfo *ci;
	struct buf head;

	if (!c) {
		sessions_release(ss);
		return NULL;
	}
	c->ss = ss;
	c->refs = 1;
	__atomic_add_fetch(&stat_open, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&stat_requests[m->way == PORTS_NATIVE ? PORTS_NATIVE : PORTS_E2B], 1, __ATOMIC_RELAXED);
	c->fd = -1;
	c->client_fd = -1;
	c->port = m->port;
	snprintf(c->id, sizeof(c->id), "%s", m->id);
	c->e2b = m->way == PORTS_E2B;
	buf_init(&c->body, 0);
	c->r = malloc(sizeof(*c->r));
	if (!c->r) {
		call_unref(c);
		return NULL;
	}
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci)
		c->client_fd = ci->connect_fd;
	buf_init(&head, 16384 + sizeof(m->target));
	{
		const char *up = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_UPGRADE);

		c->tunnel = m->way == PORTS_NATIVE && up && !strcasecmp(up, "kiln-tunnel") && !strcmp(method, "GET");
	}
	if (!c->tunnel && build_head(c, conn, method, m, &head) < 0) {
		c->failed = 1;
		buf_free(&head);
		return c;
	}
	if (sessions_port_target(ss, m->id, customer, m->way == PORTS_E2B, traffic, &t, &c->err) < 0) {
		enum MHD_Result ret;

		/* E2B's autoResume: the request resumes its paused sandbox. */
		if (c->err.errc != KERR_NOT_RUNNING || !t.row.auto_resume ||
		    !(t.row.state == SESSION_PAUSED || (t.row.state == SESSION_ERROR && t.row.has_snapshot))) {
			c->failed = 1;
			buf_free(&head);
			return c;
		}
		if (!sessions_port_resume(ss, conn, lim, &t.row, &ret)) {
			c->failed = 3; /* answered */
			buf_free(&head);
			return c;
		}
		c->err = (struct kiln_err){ .code = "" };
		if (sessions_port_target(ss, m->id, customer, m->way == PORTS_E2B, traffic, &t, &c->err) < 0) {
			c->failed = 1;
			buf_free(&head);
			return c;
		}
	}
	c->fd = port_tunnel_open(t.host_url, t.token, t.row.id, m->port, now_ms() + PORT_OPEN_MS, &f);
	if (c->fd < 0) {
		port_tunnel_error(&f, &c->err);
		c->failed = 1;
		buf_free(&head);
		return c;
	}
	sessions_port_enter(ss, c->id);
	c->entered = 1;
	if (c->tunnel) {
		/* kiln session forward: the client speaks to the server itself. */
		buf_free(&head);
		return c;
	}
	if (port_send_all(c->fd, head.p, head.len, now_ms() + PORT_SEND_MS) < 0) {
		kiln_err_set(&c->err, KERR_PORT_CLOSED, "the server on port %u closed the connection", m->port);
		c->failed = 1;
	}
	port_resp_init(c->r, !strcmp(method, "HEAD"), &c->body);
	buf_free(&head);
	return c;
}

enum MHD_Result ports_feed(struct ports_call *c, const char *data, size_t *size)
{
	size_t n = *size;
	char hdr[32];
	int rc = 0;

	*size = 0;
	if (c->failed) {
		c->dropped += n;
		return c->dropped > PORT_DROP_MAX ? MHD_NO : MHD_YES;
	}
	if (c->up_chunked) {
		int k = snprintf(hdr, sizeof(hdr), "%zx\r\n", n);

		rc = port_send_all(c->fd, hdr, (size_t)k, now_ms() + PORT_SEND_MS);
	}
	if (!rc)
		rc = port_send_all(c->fd, data, n, now_ms() + PORT_SEND_MS);
	if (!rc && c->up_chunked)
		rc = port_send_all(c->fd, "\r\n", 2, now_ms() + PORT_SEND_MS);
	if (rc < 0) {
		/* The server stopped reading (it may have answered already:
		 * what it said is read at the end). */
		shutdown(c->fd, SHUT_WR);
		c->dropped = n;
		c->up_chunked = 0;
		c->failed = 2;
	}
	return MHD_YES;
}

/* ---- the answer ---- */

/* Read more of the server's answer into the parser: 1 progress, 0 the
 * server's side ended, -1 a failure (r->why, or the client hung up), -2 the
 * wait passed. */
static int pump(struct ports_call *c, int64_t deadline_ms)
{
	while (c->raw_off == c->raw_len) {
		struct pollfd pf[2] = { { .fd = c->fd, .events = POLLIN },
					{ .fd = c->client_fd, .events = POLLRDHUP } };
		int64_t left = deadline_ms - now_ms();
		ssize_t k;
		int rc;

		if (c->eof)
			return 0;
		k = recv(c->fd, c->raw, sizeof(c->raw), MSG_DONTWAIT);
		if (k > 0) {
			c->raw_len = (size_t)k;
			c->raw_off = 0;
			break;
		}
		if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
			c->eof = 1;
			return port_resp_eof(c->r) == 0 ? 0 : -1;
		}
		if (left <= 0)
			return -2;
		rc = poll(pf, c->client_fd >= 0 ? 2 : 1, left > 30000 ? 30000 : (int)left);
		if (rc > 0 && c->client_fd >= 0 && (pf[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
			snprintf(c->r->why, sizeof(c->r->why), "%s", "the client hung up");
			return -1;
		}
	}
	{
		long k = port_resp_feed(c->r, c->raw + c->raw_off, c->raw_len - c->raw_off);

		if (k < 0)
			return -1;
		c->raw_off += (size_t)k;
		if (c->r->done)
			c->raw_off = c->raw_len; /* past its end: not an answer to anything */
	}
	return 1;
}

static ssize_t answer_read(void *cls, uint64_t pos, char *out, size_t max)
{
	struct ports_call *c = cls;

	(void)pos;
	for (;;) {
		int rc;

		if (c->body.len > c->body_off) {
			size_t n = c->body.len - c->body_off;

			if (n > max)
				n = max;
			memcpy(out, c->body.p + c->body_off, n);
			c->body_off += n;
			if (c->body_off == c->body.len) {
				buf_reset(&c->body);
				c->body_off = 0;
			}
			return (ssize_t)n;
		}
		if (c->r->done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		rc = pump(c, INT64_MAX);
		if (rc == 0 && c->r->done)
			continue; /* its end, perhaps with the last bytes */
		if (rc <= 0) {
			if (rc == -1)
				fprintf(stderr, "kiln-api: session %s port %u: the answer was cut: %s\n", c->id, c->port,
					c->r->why);
			/* The client must not take a cut answer for a whole one. */
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
}

static void answer_free(void *cls)
{
	call_unref(cls);
}

/* Response headers that describe the server's hop (libmicrohttpd frames
 * the answer to the client itself). */
static int hop_header(const char *name, size_t n)
{
	static const char *const hop[] = { "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding",
					   "TE", "Trailer", "Upgrade", "Content-Length" };

	for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
		if (strlen(hop[i]) == n && !strncasecmp(name, hop[i], n))
			return 1;
	return 0;
}

static void copy_headers(struct ports_call *c, struct MHD_Response *resp)
{
	const char *name, *value;
	size_t nl, vl;
	char nbuf[256], vbuf[8192];

	for (size_t i = 0; port_resp_header(c->r, i, &name, &nl, &value, &vl); i++) {
		if (hop_header(name, nl) || nl >= sizeof(nbuf) || vl >= sizeof(vbuf))
			continue;
		memcpy(nbuf, name, nl);
		nbuf[nl] = 0;
		memcpy(vbuf, value, vl);
		vbuf[vl] = 0;
		if (memchr(vbuf, 0, vl) || memchr(nbuf, 0, nl))
			continue;
		MHD_add_response_header(resp, nbuf, vbuf);
	}
}

/* ---- an upgrade the server accepted ---- */

struct upgraded {
	struct ports_call *c;
	int sock;
	struct MHD_UpgradeResponseHandle *urh;
	char *extra;
	size_t extra_len;
};

static void *splice_main(void *arg)
{
	struct upgraded *u = arg;
	struct ports_call *c = u->c;
	int server = c->fd;

	c->fd = -1; /* port_splice closes it */
	port_splice(u->sock, server, u->extra, u->extra_len, c->raw + c->raw_off, c->raw_len - c->raw_off);
	MHD_upgrade_action(u->urh, MHD_UPGRADE_ACTION_CLOSE);
	free(u->extra);
	free(u);
	call_unref(c);
	return NULL;
}

static void on_upgraded(void *cls, struct MHD_Connection *conn, void *req_cls, const char *extra_in,
			size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
	struct upgraded *u = calloc(1, sizeof(*u));
	struct ports_call *c = cls;
	pthread_attr_t a;
	pthread_t th;

	c->upgraded = 1; /* on the connection's thread, before its completed callback */
	__atomic_add_fetch(&stat_upgrades, 1, __ATOMIC_RELAXED);
	(void)req_cls;
	{
		/* Every frame goes out as it comes: libmicrohttpd may have corked
		 * the client's TCP socket for the 101 (under TLS, sock is its
		 * socketpair and the TCP socket is the connection's). */
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		int one = 1, zero = 0;

		if (ci) {
			setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_CORK, &zero, sizeof(zero));
			setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		}
		setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	if (!u) {
		MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
		call_unref(c);
		return;
	}
	u->c = c;
	u->sock = sock;
	u->urh = urh;
	if (extra_in_size && (u->extra = malloc(extra_in_size))) {
		memcpy(u->extra, extra_in, extra_in_size);
		u->extra_len = extra_in_size;
	}
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256u << 10);
	if (pthread_create(&th, &a, splice_main, u) != 0)
		splice_main(u);
	pthread_attr_destroy(&a);
}

/* Answer 101 and hand the connection to on_upgraded: kiln session
 * forward's raw tunnel (Upgrade: kiln-tunnel), or the server's own 101 with
 * its headers (its Upgrade among them). */
static enum MHD_Result queue_upgrade(struct ports_call *c, struct MHD_Connection *conn)
{
	struct MHD_Response *resp = MHD_create_response_for_upgrade(on_upgraded, c);
	enum MHD_Result ret;

	if (!resp)
		return MHD_NO;
	if (c->tunnel) {
		MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, "kiln-tunnel");
	} else {
		const char *name, *value;
		size_t nl, vl;
		char v[256];

		copy_headers(c, resp); /* all but the hop's: Upgrade is added here */
		for (size_t i = 0; port_resp_header(c->r, i, &name, &nl, &value, &vl); i++)
			if (nl == 7 && !strncasecmp(name, "Upgrade", 7) && vl < sizeof(v)) {
				memcpy(v, value, vl);
				v[vl] = 0;
				MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, v);
			}
	}
	call_ref(c); /* on_upgraded's */
	ret = MHD_queue_response(conn, MHD_HTTP_SWITCHING_PROTOCOLS, resp);
	MHD_destroy_response(resp);
	if (ret != MHD_YES)
		call_unref(c);
	else
		c->upgrade_queued = 1;
	return ret;
}

enum MHD_Result ports_finish(struct ports_call *c, struct MHD_Connection *conn)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;
	int rc;

	if (c->failed == 1 || c->failed == 3)
		__atomic_add_fetch(&stat_refused, 1, __ATOMIC_RELAXED);
	if (c->failed == 3)
		return MHD_YES; /* the resume's refusal went out already */
	if (c->failed == 1 && c->e2b && c->err.errc == KERR_NOT_FOUND) {
		/* E2B's edge for a sandbox it does not know (killed, timed
		 * out, never was, or another's): its 502 and body. */
		json_t *j = json_pack("{s:i, s:s, s:s}", "code", 502, "message", "The sandbox was not found",
				      "sandboxId", c->id);

		return j ? reply_json(conn, MHD_HTTP_BAD_GATEWAY, j) : MHD_NO;
	}
	if (c->failed == 1)
		return reply_err(conn, &c->err);
	if (c->tunnel)
		return queue_upgrade(c, conn);
	if (c->up_chunked && port_send_all(c->fd, "0\r\n\r\n", 5, now_ms() + PORT_SEND_MS) < 0)
		shutdown(c->fd, SHUT_WR);
	/* The answer's head. */
	while (!c->r->head_done) {
		rc = pump(c, now_ms() + PORT_HEAD_MS);
		if (rc == 1)
			continue;
		if (rc == -2)
			kiln_err_set(&c->err, KERR_TIMEOUT, "the server on port %u did not answer in time", c->port);
		else
			kiln_err_set(&c->err, KERR_PORT_CLOSED, "the server on port %u gave no valid answer: %s", c->port,
				     c->r->why[0] ? c->r->why : "it closed the connection");
		return reply_err(conn, &c->err);
	}
	if (c->r->upgrade) {
		if (!c->upgrade) {
			kiln_err_set(&c->err, KERR_PORT_CLOSED, "the server on port %u switched protocols unasked",
				     c->port);
			return reply_err(conn, &c->err);
		}
		return queue_upgrade(c, conn);
	}
	resp = MHD_create_response_from_callback(c->r->has_length ? c->r->content_length : MHD_SIZE_UNKNOWN, PORT_READ,
						 answer_read, c, answer_free);
	if (!resp)
		return MHD_NO;
	call_ref(c); /* answer_free's */
	copy_headers(c, resp);
	ret = MHD_queue_response(conn, (unsigned)c->r->status, resp);
	MHD_destroy_response(resp);
	return ret;
}

void ports_done(struct ports_call *c)
{
	if (!c)
		return;
	/* libmicrohttpd calls on_upgraded before this; a 101 that never went
	 * out (the client left first) never will: its reference goes here. */
	if (c->upgrade_queued && !c->upgraded)
		call_unref(c);
	call_unref(c);
}
