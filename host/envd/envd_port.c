/* envd_port: kiln-host's end of the port connections carried over a
 * session's envd channel (envd.h "port connections", docs/protocol.md "The
 * kiln.envd port"). A connection is a struct envd_port on the channel's
 * list, under the channel's lock like everything else here: the I/O thread
 * files what the guest sends (OPENED, CLOSED, DATA within our window, ACK,
 * SHUT) and signals the connection's eventfd; the caller (a tunnel's splice
 * loop, host/serve/tunnel.c) polls that eventfd beside its socket and moves
 * bytes with envd_port_read/_write, which never block.
 *
 * Windows: the guest may send EPROTO_WINDOW bytes we have not acknowledged;
 * we acknowledge what the caller reads. We send at most EPROTO_WINDOW bytes
 * the guest has not acknowledged (it acknowledges what the server took).
 * A guest that sends past our window broke the protocol: the connection is
 * reset (PORT_CLOSE), the rest of the channel goes on. Ids come from a
 * counter that does not repeat while the channel lives, so a late frame of
 * an abandoned connection is never taken for a new one's. */
#include "envd_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "condwait.h"

struct envd_port {
	struct envd *e;
	uint32_t id;
	uint16_t port;
	int efd;               /* eventfd: readable after any change */
	int opened;            /* PORT_OPENED came */
	int closed;            /* PORT_CLOSED came, or we reset it, or the channel died */
	int code;              /* why it closed: 0 or a negative errno */
	int rx_eof;            /* the guest's PORT_SHUT: the server sends no more */
	int tx_shut;           /* we sent PORT_SHUT */
	struct buf rx;         /* DATA not read yet (at most the window) */
	size_t rx_off;
	uint64_t unacked;      /* bytes sent the guest has not acknowledged */
	struct envd_port *next;
};

static void port_signal(struct envd_port *c)
{
	uint64_t one = 1;

	if (write(c->efd, &one, sizeof(one)) < 0) {
		/* The counter is full: the caller wakes anyway. */
	}
}

static struct envd_port *port_find(struct envd *e, uint32_t id)
{
	for (struct envd_port *c = e->ports; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

static void port_unlink(struct envd *e, struct envd_port *c)
{
	for (struct envd_port **pp = &e->ports; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			return;
		}
}

static void port_closed(struct envd_port *c, int code)
{
	if (!c->closed) {
		c->closed = 1;
		c->code = code;
	}
	port_signal(c);
}

int envd_port_frame(struct envd *e, const struct proto_frame *f)
{
	struct envd_port *c;
	const uint8_t *raw;
	uint32_t v[2];
	size_t n;

	switch (f->type) {
	case EP_PORT_DATA:
		if (eproto_idraw_decode(f->payload, f->len, &v[0], &raw, &n) < 0)
			return -1;
		c = port_find(e, v[0]);
		if (!c || c->closed || c->rx_eof)
			return 0; /* crossed our reset on the wire: dropped */
		if (c->rx.len - c->rx_off + n > EPROTO_WINDOW || buf_add(&c->rx, raw, n) < 0) {
			uint32_t id = c->id;

			fprintf(stderr, "kiln-host: %s: port connection %u sent past its window; reset\n", e->name, id);
			envd_queue_u32s(e, EP_PORT_CLOSE, &id, 1);
			port_closed(c, -ENOBUFS);
			return 0;
		}
		port_signal(c);
		return 0;
	case EP_PORT_ACK:
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0)
			return -1;
		c = port_find(e, v[0]);
		if (c) {
			c->unacked -= v[1] < c->unacked ? v[1] : c->unacked;
			port_signal(c);
		}
		return 0;
	case EP_PORT_OPENED:
	case EP_PORT_SHUT:
		if (eproto_u32s_decode(f->payload, f->len, v, 1) < 0)
			return -1;
		c = port_find(e, v[0]);
		if (c && f->type == EP_PORT_OPENED)
			c->opened = 1;
		else if (c)
			c->rx_eof = 1;
		if (c) {
			port_signal(c);
			pthread_cond_broadcast(&e->cond); /* envd_port_open waits */
		}
		return 0;
	case EP_PORT_CLOSED:
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0)
			return -1;
		c = port_find(e, v[0]);
		if (c) {
			/* A code is a negative errno; anything else is a plain end. */
			int32_t code = (int32_t)v[1];

			port_closed(c, code < 0 && code > -4096 ? code : 0);
			pthread_cond_broadcast(&e->cond);
		}
		return 0;
	default:
		return -1;
	}
}

void envd_ports_fail(struct envd *e)
{
	for (struct envd_port *c = e->ports; c; c = c->next)
		port_closed(c, -ECONNRESET);
}

void envd_ports_wake(struct envd *e)
{
	for (struct envd_port *c = e->ports; c; c = c->next)
		port_signal(c);
}

struct envd_port *envd_port_open(struct envd *e, unsigned port, int64_t deadline_ms, struct envd_err *err)
{
	struct envd_port *c;
	uint32_t v[2];

	if (port < 1 || port > 65535) {
		envd_set_err(err, CONNECT_INVALID_ARGUMENT, 0, "%s", "a port is 1-65535");
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c || (c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		free(c);
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory or file descriptors");
		return NULL;
	}
	c->e = e;
	c->port = (uint16_t)port;
	buf_init(&c->rx, 0);
	pthread_mutex_lock(&e->lock);
	if (envd_wait_ready(e, deadline_ms, err) < 0)
		goto fail;
	if (!(e->features & EPROTO_FEAT_PORTS)) {
		envd_set_err(err, CONNECT_FAILED_PRECONDITION, 0, "%s",
			     "this sandbox's image predates port connections: rebuild its template");
		goto fail;
	}
	c->id = ++e->next_conn;
	v[0] = c->id;
	v[1] = port;
	envd_queue_u32s(e, EP_PORT_OPEN, v, 2);
	c->next = e->ports;
	e->ports = c;
	e->refs++; /* the connection keeps the channel, and so the session, busy */
	while (!c->opened && !c->closed)
		if (condwait_until(&e->cond, &e->lock, NULL, deadline_ms) == ETIMEDOUT && !c->opened && !c->closed) {
			uint32_t id = c->id;

			envd_queue_u32s(e, EP_PORT_CLOSE, &id, 1);
			port_closed(c, -ETIMEDOUT);
		}
	if (c->closed) {
		int code = c->code;
		char what[64];

		port_unlink(e, c);
		e->refs--; /* never the last: the caller holds one */
		snprintf(what, sizeof(what), "nothing listens on port %u in the sandbox", port);
		if (code == -ECONNREFUSED)
			envd_set_err(err, CONNECT_UNAVAILABLE, code, "%s", what);
		else if (code == -ETIMEDOUT)
			envd_set_err(err, CONNECT_DEADLINE_EXCEEDED, code, "%s", "the sandbox did not connect in time");
		else if (code == -EMFILE)
			envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, code, "%s",
				     "too many port connections open to this sandbox");
		else
			envd_set_err(err, CONNECT_UNAVAILABLE, code, "%s",
				     e->state == ENVD_DEAD && e->why[0] ? e->why : "the sandbox refused the connection");
		goto fail;
	}
	pthread_mutex_unlock(&e->lock);
	return c;
fail:
	pthread_mutex_unlock(&e->lock);
	close(c->efd);
	buf_free(&c->rx);
	free(c);
	return NULL;
}

int envd_port_fd(const struct envd_port *c)
{
	return c->efd;
}

void envd_port_clear(struct envd_port *c)
{
	uint64_t v;

	if (read(c->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing was signalled */
	}
}

ssize_t envd_port_read(struct envd_port *c, void *buf, size_t cap)
{
	struct envd *e = c->e;
	ssize_t ret;

	pthread_mutex_lock(&e->lock);
	if (c->rx.len > c->rx_off) {
		size_t n = c->rx.len - c->rx_off;

		if (n > cap)
			n = cap;
		memcpy(buf, c->rx.p + c->rx_off, n);
		c->rx_off += n;
		if (c->rx_off == c->rx.len) {
			buf_reset(&c->rx);
			c->rx_off = 0;
		}
		if (!c->closed && e->state == ENVD_READY) {
			uint32_t v[2] = { c->id, (uint32_t)n };

			envd_queue_u32s(e, EP_PORT_ACK, v, 2);
		}
		ret = (ssize_t)n;
	} else if (c->rx_eof) {
		ret = 0;
	} else if (c->closed) {
		ret = c->code ? c->code : 0;
	} else {
		ret = -EAGAIN;
	}
	pthread_mutex_unlock(&e->lock);
	return ret;
}

ssize_t envd_port_write(struct envd_port *c, const void *p, size_t n)
{
	struct envd *e = c->e;
	uint8_t frame[4 + EPROTO_MAX_CHUNK];
	ssize_t ret, len;
	size_t room;

	pthread_mutex_lock(&e->lock);
	if (c->closed || c->tx_shut || e->state != ENVD_READY) {
		ret = -EPIPE;
		goto out;
	}
	room = c->unacked < EPROTO_WINDOW ? EPROTO_WINDOW - (size_t)c->unacked : 0;
	if (!room || e->out.len >= ENVD_OUT_SOFT) {
		if (room)
			e->ports_blocked = 1;
		ret = -EAGAIN;
		goto out;
	}
	if (n > room)
		n = room;
	if (n > EPROTO_MAX_CHUNK)
		n = EPROTO_MAX_CHUNK;
	len = eproto_idraw_encode(frame, sizeof(frame), c->id, p, n);
	if (len < 0 || envd_queue_frame(e, EP_PORT_DATA, frame, (size_t)len) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	c->unacked += n;
	ret = (ssize_t)n;
out:
	pthread_mutex_unlock(&e->lock);
	return ret;
}

int envd_port_idle(struct envd_port *c)
{
	int idle;

	pthread_mutex_lock(&c->e->lock);
	idle = c->unacked == 0 || c->closed;
	pthread_mutex_unlock(&c->e->lock);
	return idle;
}

void envd_port_shut(struct envd_port *c)
{
	struct envd *e = c->e;

	pthread_mutex_lock(&e->lock);
	if (!c->tx_shut && !c->closed && e->state == ENVD_READY) {
		c->tx_shut = 1;
		envd_queue_u32s(e, EP_PORT_SHUT, &c->id, 1);
	}
	pthread_mutex_unlock(&e->lock);
}

int envd_port_done(struct envd_port *c)
{
	int done;

	pthread_mutex_lock(&c->e->lock);
	done = c->closed && c->rx.len == c->rx_off;
	pthread_mutex_unlock(&c->e->lock);
	return done;
}

void envd_port_close(struct envd_port *c)
{
	struct envd *e;

	if (!c)
		return;
	e = c->e;
	pthread_mutex_lock(&e->lock);
	port_unlink(e, c);
	if (!c->closed && e->state == ENVD_READY)
		envd_queue_u32s(e, EP_PORT_CLOSE, &c->id, 1); /* a reset; its CLOSED finds no one */
	pthread_mutex_unlock(&e->lock);
	close(c->efd);
	buf_free(&c->rx);
	free(c);
	envd_unref(e);
}

int envd_ports(struct envd *e, uint16_t *ports, uint32_t *n, int64_t deadline_ms, struct envd_err *err)
{
	uint8_t p[4] = { 0 };
	struct envd_reply rep;
	struct envd_req *r;
	uint32_t req;
	int rc;

	pthread_mutex_lock(&e->lock);
	rc = envd_wait_ready(e, deadline_ms, err);
	if (rc == 0 && !(e->features & EPROTO_FEAT_PORTS)) {
		envd_set_err(err, CONNECT_FAILED_PRECONDITION, 0, "%s",
			     "this sandbox's image predates port connections: rebuild its template");
		rc = -1;
	}
	pthread_mutex_unlock(&e->lock);
	if (rc < 0)
		return -1;
	r = envd_req_begin(e, EP_PORTS, p, sizeof(p), deadline_ms, err);
	if (!r)
		return -1;
	rc = envd_req_next(r, &rep, deadline_ms, err);
	if (rc == 1 && (rep.type != EP_PORTS_LIST || eproto_ports_decode(rep.payload, rep.len, &req, ports, n) < 0 ||
			req != envd_req_id(r))) {
		envd_set_err(err, CONNECT_INTERNAL, 0, "%s", "a malformed answer to PORTS");
		rc = -1;
	} else if (rc == 0) {
		envd_set_err(err, CONNECT_INTERNAL, 0, "%s", "no answer to PORTS");
		rc = -1;
	}
	envd_req_free(r);
	return rc < 0 ? -1 : 0;
}
