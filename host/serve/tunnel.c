/* tunnel: kiln-host's end of a port connection (docs/api.md, "kiln-host:
 * ports"). kiln-api asks `GET /v1/sessions/{id}/ports/{port}/connect` with
 * `Connection: Upgrade`, `Upgrade: kiln-tunnel` and the cluster token;
 * kiln-host connects to the port inside the session's VM over its envd
 * channel (host/envd: PORT_OPEN), answers 101 Switching Protocols, and from
 * then on the HTTP connection is a raw byte pipe to the server in the guest:
 * both ways, half closes passed on, a reset when either side breaks.
 * kiln-host reads nothing of what flows (kiln-api speaks HTTP or WebSocket
 * to the guest's server through it).
 *
 * Errors before the 101 are ordinary JSON answers: 404 (no such session),
 * 502 port_closed (nothing listens), 409 ports_unsupported (an image built
 * before ports), 503 (paused, stopping, too many connections).
 *
 * A tunnel runs on a thread of its own (the splice loop polls the socket and
 * the port connection's eventfd); serve_http_stop waits for them after the
 * sessions' envd channels are closed, which ends every tunnel. */
#include "serve_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "condwait.h"
#include "envd/envd.h"
#include "proto.h"
#include "reply.h"
#include "session/session.h"

#define TUNNEL_BUF (64u << 10)
#define TUNNEL_OPEN_MS 10000

struct tunnel {
	struct serve_http *s;
	struct envd_port *c;
	char id[80];
	unsigned port;
	int refs;              /* the request's and the upgrade's (s->tun_lock) */
	int started;           /* the upgrade handler took it */
	/* the upgrade's */
	MHD_socket sock;
	struct MHD_UpgradeResponseHandle *urh;
	char *extra;
	size_t extra_len;
};

static void tunnel_unref(struct tunnel *t)
{
	struct serve_http *s = t->s;
	int last;

	pthread_mutex_lock(&s->tun_lock);
	last = --t->refs == 0;
	pthread_mutex_unlock(&s->tun_lock);
	if (!last)
		return;
	envd_port_close(t->c);
	free(t->extra);
	free(t);
}

/* Move bytes both ways until both sides are done or one breaks. */
static void splice_loop(struct tunnel *t)
{
	static const struct linger reset = { .l_onoff = 1, .l_linger = 0 };
	char *up = malloc(TUNNEL_BUF), *down = malloc(TUNNEL_BUF);
	size_t up_len = 0, up_off = 0, down_len = 0, down_off = 0;
	int client_eof = 0, guest_eof = 0, shut_sent = 0, broken = !up || !down;

	if (!broken && t->extra_len) {
		/* What the client sent right behind its request head. */
		memcpy(up, t->extra, t->extra_len);
		up_len = t->extra_len;
	}
	fcntl(t->sock, F_SETFL, fcntl(t->sock, F_GETFL) | O_NONBLOCK);
	while (!broken) {
		struct pollfd pf[2] = { { .fd = t->sock }, { .fd = envd_port_fd(t->c), .events = POLLIN } };
		ssize_t n;

		/* Client to guest: as the window lets it. */
		while (up_off < up_len) {
			n = envd_port_write(t->c, up + up_off, up_len - up_off);
			if (n == -EAGAIN)
				break;
			if (n < 0) {
				broken = 1;
				break;
			}
			up_off += (size_t)n;
		}
		if (up_off == up_len)
			up_off = up_len = 0;
		if (client_eof && !up_len && !shut_sent) {
			envd_port_shut(t->c);
			shut_sent = 1;
		}
		/* Guest to client. */
		while (!broken && !guest_eof) {
			if (down_off == down_len) {
				down_off = down_len = 0;
				n = envd_port_read(t->c, down, TUNNEL_BUF);
				if (n == -EAGAIN)
					break;
				if (n == 0) {
					guest_eof = 1;
					shutdown(t->sock, SHUT_WR);
					break;
				}
				if (n < 0) {
					broken = 1;
					break;
				}
				down_len = (size_t)n;
			}
			n = send(t->sock, down + down_off, down_len - down_off, MSG_NOSIGNAL);
			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				break;
			if (n <= 0) {
				broken = 1;
				break;
			}
			down_off += (size_t)n;
		}
		if (broken)
			break;
		/* The guest's side ended and all it sent is out: nothing more
		 * can go anywhere (it closes only after our half close, or on
		 * a reset). */
		if (guest_eof && down_off == down_len && envd_port_done(t->c))
			break;
		if (!client_eof && !up_len)
			pf[0].events |= POLLIN;
		if (down_off < down_len)
			pf[0].events |= POLLOUT;
		if (!pf[0].events)
			pf[0].fd = -1; /* a closed client's POLLHUP would not let poll wait */
		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			break;
		if (pf[1].revents & POLLIN)
			envd_port_clear(t->c);
		if ((pf[0].revents & (POLLIN | POLLHUP | POLLERR)) && !client_eof && !up_len) {
			n = recv(t->sock, up, TUNNEL_BUF, 0);
			if (n == 0)
				client_eof = 1;
			else if (n > 0)
				up_len = (size_t)n;
			else if (errno != EAGAIN && errno != EINTR)
				broken = 1;
		}
	}
	if (broken)
		setsockopt(t->sock, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)); /* the client sees a reset */
	free(up);
	free(down);
}

static void *tunnel_main(void *arg)
{
	struct tunnel *t = arg;
	struct serve_http *s = t->s;

	splice_loop(t);
	MHD_upgrade_action(t->urh, MHD_UPGRADE_ACTION_CLOSE);
	tunnel_unref(t);
	pthread_mutex_lock(&s->tun_lock);
	s->tunnels--;
	pthread_cond_broadcast(&s->tun_cond);
	pthread_mutex_unlock(&s->tun_lock);
	return NULL;
}

static void upgraded(void *cls, struct MHD_Connection *conn, void *req_cls, const char *extra_in, size_t extra_in_size,
		     MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
	struct tunnel *t = cls;
	struct serve_http *s = t->s;
	pthread_attr_t a;
	pthread_t th;

	(void)conn;
	(void)req_cls;
	/* A relay: what the guest sent leaves at once. With Nagle, an answer
	 * written in two pieces waited for kiln-api's delayed ACK (40 ms). */
	setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	t->sock = sock;
	t->urh = urh;
	if (extra_in_size && (t->extra = malloc(extra_in_size))) {
		memcpy(t->extra, extra_in, extra_in_size);
		t->extra_len = extra_in_size;
	}
	pthread_mutex_lock(&s->tun_lock);
	t->started = 1;
	s->tunnels++;
	s->tunnels_total++;
	pthread_mutex_unlock(&s->tun_lock);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256u << 10);
	if (pthread_create(&th, &a, tunnel_main, t) != 0) {
		fprintf(stderr, "kiln-host: session %s port %u: cannot start a tunnel thread\n", t->id, t->port);
		tunnel_main(t);
	}
	pthread_attr_destroy(&a);
}

void serve_tunnel_done(struct serve_http *s, struct tunnel *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&s->tun_lock);
	if (!t->started && t->c) {
		/* The 101 never went out: the connection is dropped now. */
		struct envd_port *c = t->c;

		t->c = NULL;
		pthread_mutex_unlock(&s->tun_lock);
		envd_port_close(c);
	} else {
		pthread_mutex_unlock(&s->tun_lock);
	}
	tunnel_unref(t);
}

void serve_tunnels_wait(struct serve_http *s, int64_t deadline_ms)
{
	pthread_mutex_lock(&s->tun_lock);
	while (s->tunnels > 0)
		if (condwait_until(&s->tun_cond, &s->tun_lock, NULL, deadline_ms) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&s->tun_lock);
}

/* The port in the path: 1-65535, digits only. 0 when it is not one. */
static unsigned port_param(const char *p)
{
	unsigned v = 0;

	if (!p[0] || strlen(p) > 5)
		return 0;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		v = v * 10 + (unsigned)(*p - '0');
	}
	return v <= 65535 ? v : 0;
}

static enum MHD_Result envd_failure(struct MHD_Connection *conn, const struct envd_err *e, unsigned port)
{
	if (e->errnum == -ECONNREFUSED)
		return reply_error(conn, KERR_PORT_CLOSED, e->msg);
	if (e->code == CONNECT_FAILED_PRECONDITION)
		return reply_error(conn, KERR_PORTS_UNSUPPORTED, e->msg);
	if (e->code == CONNECT_NOT_FOUND)
		return reply_error(conn, KERR_NOT_FOUND, e->msg);
	if (e->code == CONNECT_INVALID_ARGUMENT)
		return reply_error(conn, KERR_INVALID_REQUEST, e->msg);
	(void)port;
	return reply_error(conn, KERR_UNAVAILABLE, e->msg[0] ? e->msg : "the sandbox cannot take the connection");
}

/* The envd channel of the session the path names, or NULL with err. */
static struct envd *channel(struct serve_http *s, struct httpd_req *r, struct kiln_err *err)
{
	json_t *env = NULL;
	struct envd *ch;

	if (strlen(r->param[0]) >= 80) {
		kiln_err_set(err, KERR_NOT_FOUND, "no such session on this host");
		return NULL;
	}
	ch = session_envd(s->sessions, r->param[0], &env, err);
	json_decref(env);
	return ch;
}

/* GET /v1/sessions/{id}/ports/{port}/connect (Upgrade: kiln-tunnel) */
enum MHD_Result serve_session_port_connect(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	const char *up = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_UPGRADE);
	unsigned port = port_param(r->param[1]);
	struct kiln_err err = { .code = "" };
	struct envd_err e = { 0 };
	struct MHD_Response *resp;
	struct tunnel *t;
	struct envd *ch;
	enum MHD_Result ret;

	if (!up || strcasecmp(up, "kiln-tunnel"))
		return reply_error(r->conn, KERR_INVALID_REQUEST, "expected Connection: Upgrade and Upgrade: kiln-tunnel");
	if (!port)
		return reply_error(r->conn, KERR_INVALID_REQUEST, "a port is 1-65535");
	ch = channel(s, r, &err);
	if (!ch)
		return reply_err(r->conn, &err);
	t = calloc(1, sizeof(*t));
	if (!t) {
		envd_unref(ch);
		return reply_internal(r->conn, "out of memory");
	}
	t->c = envd_port_open(ch, port, proto_now_ms() + TUNNEL_OPEN_MS, &e);
	envd_unref(ch); /* an open connection holds its own reference */
	if (!t->c) {
		free(t);
		return envd_failure(r->conn, &e, port);
	}
	t->s = s;
	t->port = port;
	t->refs = 2;
	snprintf(t->id, sizeof(t->id), "%s", r->param[0]);
	((struct serve_conn *)r->app)->tun = t; /* serve_tunnel_done drops the request's reference */
	resp = MHD_create_response_for_upgrade(upgraded, t);
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, "kiln-tunnel");
	ret = MHD_queue_response(r->conn, MHD_HTTP_SWITCHING_PROTOCOLS, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* GET /v1/sessions/{id}/ports: {"ports":[N,...]} the TCP ports listened on
 * inside the session's VM. */
enum MHD_Result serve_session_ports_get(void *ctx, struct httpd_req *r)
{
	struct serve_http *s = ctx;
	struct kiln_err err = { .code = "" };
	struct envd_err e = { 0 };
	uint16_t ports[EPROTO_MAX_PORTS];
	uint32_t n = 0;
	struct envd *ch;
	json_t *a;
	int rc;

	ch = channel(s, r, &err);
	if (!ch)
		return reply_err(r->conn, &err);
	rc = envd_ports(ch, ports, &n, proto_now_ms() + TUNNEL_OPEN_MS, &e);
	envd_unref(ch);
	if (rc < 0)
		return envd_failure(r->conn, &e, 0);
	a = json_array();
	for (uint32_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer(ports[i]));
	return reply_json(r->conn, MHD_HTTP_OK, json_pack("{s:o}", "ports", a ? a : json_array()));
}
