/* envd's port connections (docs/e2b.md "Ports"): the host opens a
 * connection to a TCP port a process listens on inside the guest, and the
 * bytes flow both ways as PORT_DATA frames over envd's channel: the guest
 * has no network interface for it. Each direction has its window
 * (EPROTO_WINDOW unacknowledged bytes): a server that writes faster than the
 * client reads is simply not read, one that never reads holds what the host
 * sent in its queue (guest/inq.c, at most the window) and the host sends no
 * more. A connection ends when both sides have shut their sending half, on
 * a reset, or when the host abandons it (PORT_CLOSE); PORT_CLOSED then frees
 * its id. PORTS lists the listening ports (/proc/net/tcp and tcp6). */
#include "envd_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "init.h"

struct envd_conn *envd_conn_find(struct envd *e, uint32_t id)
{
	for (int i = 0; i < ENVD_MAX_CONNS; i++)
		if (e->conns[i] && e->conns[i]->id == id)
			return e->conns[i];
	return NULL;
}

static void envd_conn_free(struct envd *e, struct envd_conn *c)
{
	for (int i = 0; i < ENVD_MAX_CONNS; i++)
		if (e->conns[i] == c)
			e->conns[i] = NULL;
	inq_close(&c->in);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

/* Frees c and tells the host (code 0 or a negative errno). */
static void envd_conn_end(struct envd *e, struct envd_conn *c, int code)
{
	uint32_t v[2] = { c->id, (uint32_t)code };

	envd_send_u32s(e, EP_PORT_CLOSED, v, 2);
	envd_conn_free(e, c);
}

void envd_conns_drop(struct envd *e)
{
	for (int i = 0; i < ENVD_MAX_CONNS; i++)
		if (e->conns[i])
			envd_conn_free(e, e->conns[i]);
}

/* Starts a connection to the port on loopback, IPv4 first; 0 (connected or
 * connecting) or a negative errno. */
static int envd_conn_connect(struct envd_conn *c)
{
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons(c->port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(c->port), .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	int v6 = c->tried_v4;

	if (c->fd >= 0)
		close(c->fd);
	c->fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -errno;
	c->tried_v4 = 1;
	/* A relay: what the host sent leaves at once. With Nagle, a request
	 * whose headers and body came in two frames waited for the server's
	 * delayed ACK (40 ms) before its body went out. */
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	if (connect(c->fd, v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4, v6 ? sizeof(a6) : sizeof(a4)) == 0) {
		c->connecting = 0;
		return 0;
	}
	if (errno == EINPROGRESS) {
		c->connecting = 1;
		return 0;
	}
	return -errno;
}

/* The connection is up: the queue for the server writes to a duplicate of
 * the socket, so that its end can shut the sending half and nothing else. */
static int envd_conn_up(struct envd *e, struct envd_conn *c)
{
	int w = fcntl(c->fd, F_DUPFD_CLOEXEC, 3);

	if (w < 0)
		return -errno;
	c->connecting = 0;
	inq_init(&c->in, w, EPROTO_WINDOW);
	c->in.shut = 1;
	envd_send_u32s(e, EP_PORT_OPENED, &c->id, 1);
	if (c->host_shut)
		inq_end(&c->in);
	return 0;
}

/* A connect that failed: the other loopback once, then the error. */
static void envd_conn_failed(struct envd *e, struct envd_conn *c, int err)
{
	if (!c->tried_v6 && (err == -ECONNREFUSED || err == -EADDRNOTAVAIL || err == -EAFNOSUPPORT)) {
		c->tried_v6 = 1;
		err = envd_conn_connect(c);
		if (!err && !c->connecting)
			err = envd_conn_up(e, c);
		if (!err)
			return;
		if (err == -EAFNOSUPPORT || err == -EADDRNOTAVAIL)
			err = -ECONNREFUSED; /* no IPv6 here: the answer is IPv4's */
	}
	envd_conn_end(e, c, err);
}

void envd_port_open(struct envd *e, uint32_t id, uint32_t port)
{
	struct envd_conn *c;
	int slot = -1, r;

	if (envd_conn_find(e, id)) {
		uint32_t v[2] = { id, (uint32_t)-EEXIST };

		/* The host's ids are its own to keep apart: the live one stays. */
		envd_send_u32s(e, EP_PORT_CLOSED, v, 2);
		return;
	}
	for (int i = 0; i < ENVD_MAX_CONNS && slot < 0; i++)
		if (!e->conns[i])
			slot = i;
	c = slot >= 0 ? calloc(1, sizeof(*c)) : NULL;
	if (!c) {
		uint32_t v[2] = { id, (uint32_t)(slot < 0 ? -EMFILE : -ENOMEM) };

		envd_send_u32s(e, EP_PORT_CLOSED, v, 2);
		return;
	}
	c->id = id;
	c->port = (uint16_t)port;
	c->fd = -1;
	inq_init(&c->in, -1, EPROTO_WINDOW);
	e->conns[slot] = c;
	r = envd_conn_connect(c);
	if (!r && !c->connecting)
		r = envd_conn_up(e, c);
	if (r < 0)
		envd_conn_failed(e, c, r);
}

/* POLLOUT on a connecting socket: connected, or the next try. */
static void envd_conn_connected(struct envd *e, struct envd_conn *c)
{
	int err = 0, r;
	socklen_t len = sizeof(err);

	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err == EINPROGRESS)
		return;
	r = err ? -err : envd_conn_up(e, c);
	if (r < 0)
		envd_conn_failed(e, c, r);
}

/* Bytes the server took since the last look: owed to the host as an ACK. */
static void envd_conn_taken(struct envd_conn *c, size_t before, size_t arrived)
{
	size_t now = c->in.fd >= 0 ? c->in.len : 0;

	if (before + arrived > now)
		c->ack_due += before + arrived - now;
}

void envd_port_data(struct envd *e, uint32_t id, const uint8_t *raw, size_t n)
{
	struct envd_conn *c = envd_conn_find(e, id);
	size_t before;

	if (!c || c->connecting || c->host_shut)
		return; /* crossed on the wire, or the host broke its own rule: dropped */
	if (c->in.fd < 0) {
		c->ack_due += n; /* the server stopped reading (EPIPE): taken, as dropped */
		return;
	}
	before = c->in.len;
	if (inq_put(&c->in, raw, n, inq_room(&c->in))) {
		/* Past the window: the host did not wait for ACKs. */
		envd_conn_end(e, c, -ENOBUFS);
		return;
	}
	envd_conn_taken(c, before, n);
}

static void envd_conn_flush(struct envd_conn *c)
{
	size_t before = c->in.len;

	inq_flush(&c->in);
	envd_conn_taken(c, before, 0);
}

void envd_port_shut(struct envd *e, uint32_t id)
{
	struct envd_conn *c = envd_conn_find(e, id);

	if (!c || c->host_shut)
		return;
	c->host_shut = 1;
	if (c->connecting)
		return; /* shut once up */
	inq_end(&c->in);
}

void envd_port_ack(struct envd *e, uint32_t id, uint32_t bytes)
{
	struct envd_conn *c = envd_conn_find(e, id);

	if (c)
		c->unacked -= bytes < c->unacked ? bytes : c->unacked;
}

void envd_port_close(struct envd *e, uint32_t id)
{
	struct envd_conn *c = envd_conn_find(e, id);
	struct linger l = { .l_onoff = 1, .l_linger = 0 };

	if (!c) {
		uint32_t v[2] = { id, 0 };

		envd_send_u32s(e, EP_PORT_CLOSED, v, 2); /* it ended already: the id is free */
		return;
	}
	if (c->fd >= 0)
		setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)); /* a reset, as the client's */
	envd_conn_end(e, c, 0);
}

/* POLLIN on the socket: what the server wrote, as one DATA frame within the
 * window; its end as SHUT; an error ends the connection. */
static void envd_conn_pump(struct envd *e, struct envd_conn *c)
{
	size_t want = EPROTO_MAX_CHUNK;
	uint8_t *buf;
	ssize_t n;

	if (!envd_tx_ok(e) || c->srv_eof || c->unacked >= EPROTO_WINDOW)
		return;
	if (want > EPROTO_WINDOW - c->unacked)
		want = EPROTO_WINDOW - c->unacked;
	buf = envd_tx_payload(e);
	n = read(c->fd, buf + 4, want);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n < 0) {
		envd_conn_end(e, c, -errno);
		return;
	}
	if (n == 0) {
		c->srv_eof = 1;
		envd_send_u32s(e, EP_PORT_SHUT, &c->id, 1);
		return;
	}
	buf[0] = (uint8_t)c->id;
	buf[1] = (uint8_t)(c->id >> 8);
	buf[2] = (uint8_t)(c->id >> 16);
	buf[3] = (uint8_t)(c->id >> 24);
	envd_tx_commit(e, EP_PORT_DATA, 4 + (size_t)n);
	c->unacked += (uint64_t)n;
}

void envd_conn_event(struct envd *e, struct envd_conn *c, short revents)
{
	if (c->connecting) {
		envd_conn_connected(e, c);
		return;
	}
	if (revents & (POLLOUT | POLLERR | POLLHUP))
		envd_conn_flush(c);
	if (revents & (POLLIN | POLLERR | POLLHUP))
		envd_conn_pump(e, c); /* last: it may end the connection */
}

int envd_conns_tick(struct envd *e)
{
	int busy = 0;

	for (int i = 0; i < ENVD_MAX_CONNS; i++) {
		struct envd_conn *c = e->conns[i];

		if (!c || c->connecting)
			continue;
		if (c->ack_due && envd_tx_ok(e)) {
			uint32_t v[2] = { c->id, c->ack_due > UINT32_MAX ? UINT32_MAX : (uint32_t)c->ack_due };

			envd_send_u32s(e, EP_PORT_ACK, v, 2);
			c->ack_due -= v[1];
		}
		/* Both halves shut and the host's bytes all written: done. A
		 * server that stopped reading (EPIPE closed the queue) ends it
		 * too once its own side is done. */
		if (c->srv_eof && c->in.fd < 0 && (c->host_shut || c->in.failed) && !c->ack_due && envd_tx_ok(e)) {
			envd_conn_end(e, c, 0);
			busy = 1;
		}
	}
	return busy;
}

/* ---- PORTS ---------------------------------------------------------------- */

static int port_cmp(const void *a, const void *b)
{
	return (int)*(const uint16_t *)a - (int)*(const uint16_t *)b;
}

/* Listening TCP ports in one /proc/net file ("sl local_address rem_address
 * st ...", the port in hex after the colon, LISTEN is state 0A). */
static void ports_from(const char *file, uint16_t *ports, uint32_t *n)
{
	char line[512];
	FILE *f = fopen(file, "re");

	if (!f)
		return;
	if (!fgets(line, sizeof(line), f)) { /* the header */
		fclose(f);
		return;
	}
	while (*n < EPROTO_MAX_PORTS && fgets(line, sizeof(line), f)) {
		char local[64], remote[64], *colon;
		unsigned st, port;

		if (sscanf(line, "%*s %63s %63s %x", local, remote, &st) != 3 || st != 0x0A)
			continue;
		colon = strrchr(local, ':');
		if (!colon || sscanf(colon + 1, "%x", &port) != 1 || port < 1 || port > 65535)
			continue;
		ports[(*n)++] = (uint16_t)port;
	}
	fclose(f);
}

void envd_ports(struct envd *e, uint32_t req)
{
	uint16_t ports[2 * EPROTO_MAX_PORTS];
	uint32_t n = 0, k = 0;
	ssize_t len;

	ports_from(e->cfg->proc_net_tcp ? e->cfg->proc_net_tcp : "/proc/net/tcp", ports, &n);
	ports_from(e->cfg->proc_net_tcp6 ? e->cfg->proc_net_tcp6 : "/proc/net/tcp6", ports + n, &k);
	n += k;
	qsort(ports, n, sizeof(ports[0]), port_cmp);
	k = 0;
	for (uint32_t i = 0; i < n; i++)
		if (!k || ports[k - 1] != ports[i])
			ports[k++] = ports[i];
	if (k > EPROTO_MAX_PORTS)
		k = EPROTO_MAX_PORTS;
	len = eproto_ports_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, req, ports, k);
	if (len < 0)
		return envd_send_error(e, req, (int)len, "PORTS: cannot encode");
	envd_tx_commit(e, EP_PORTS_LIST, (size_t)len);
}
