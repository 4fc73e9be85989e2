/* envd: kiln-host's end of a session VM's `kiln.envd` port (see envd.h).
 *
 * One mutex (e->lock) guards the whole channel: the request list, the
 * process table and its subscribers, the send queue and the state. The I/O
 * thread never waits for a caller: replies go into per-request queues,
 * output into per-subscriber queues (bounded by the guest's per-process
 * window, EPROTO_WINDOW: the guest sends no more until acknowledged), and
 * acknowledgements into the send queue, which it writes as the port takes
 * them. A caller never waits for the I/O thread except for room in the send
 * queue (uploads) and for replies.
 *
 * Everything the guest sends is bounded before use: frames by lib/proto's
 * parser (payload <= 128 KiB), payloads by lib/eproto's decoders; a
 * malformed frame kills the channel (the guest is not trusted to be in step
 * after one). Request ids start at 0x80000000 so that they never collide
 * with a guest pid in an ACK (the guest looks a READ's id up first). */
#include "envd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "buf.h"
#include "condwait.h"
#include "proto.h"

/* ---- helpers (lock held) ------------------------------------------------ */

void envd_set_err(struct envd_err *err, enum connect_code c, int errnum, const char *fmt, const char *arg)
{
	if (!err)
		return;
	err->code = c;
	err->errnum = errnum;
	snprintf(err->msg, sizeof(err->msg), fmt, arg);
}

static void wake_io(struct envd *e)
{
	uint64_t one = 1;

	if (write(e->wake, &one, sizeof(one)) < 0) {
		/* The counter is full: the thread is awake anyway. */
	}
}

/* Queue one frame for the guest (lock held). 0 or -ENOMEM. */
int envd_queue_frame(struct envd *e, uint8_t type, const void *p, size_t len)
{
	uint8_t hdr[PROTO_HDR_SIZE];

	if (len > PROTO_MAX_PAYLOAD)
		return -EMSGSIZE;
	if (buf_reserve(&e->out, PROTO_HDR_SIZE + len) < 0)
		return -ENOMEM;
	proto_frame_header(hdr, type, (uint32_t)len);
	buf_add(&e->out, hdr, sizeof(hdr));
	if (len)
		buf_add(&e->out, p, len);
	wake_io(e);
	return 0;
}

void envd_queue_u32s(struct envd *e, uint8_t type, const uint32_t *v, unsigned n)
{
	uint8_t p[16];
	ssize_t len = eproto_u32s_encode(p, sizeof(p), v, n);

	if (len >= 0)
		envd_queue_frame(e, type, p, (size_t)len);
}

static void put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

/* Append a record (type, bytes) to q; -E2BIG past max. */
static int rec_add(struct buf *q, size_t max, uint8_t type, const void *p, size_t n)
{
	uint8_t hdr[REC_HDR];
	uint32_t len = (uint32_t)n;

	if (q->len + REC_HDR + n > max || n > PROTO_MAX_PAYLOAD)
		return -E2BIG;
	if (buf_reserve(q, REC_HDR + n) < 0)
		return -ENOMEM;
	hdr[0] = type;
	memcpy(hdr + 1, &len, 4);
	buf_add(q, hdr, sizeof(hdr));
	if (n)
		buf_add(q, p, n);
	return 0;
}

/* Take the next record of q from q_off, copied into cur (PROTO_MAX_PAYLOAD
 * bytes: the I/O thread may move q as soon as the lock is let go): 1 with
 * it, 0 when none. */
static int rec_take(struct buf *q, size_t *q_off, uint8_t *cur, uint8_t *type, const uint8_t **p, size_t *n)
{
	uint32_t len;

	if (*q_off > 0 && (*q_off == q->len || *q_off > (1u << 20))) {
		buf_consume(q, *q_off);
		*q_off = 0;
	}
	if (q->len - *q_off < REC_HDR)
		return 0;
	*type = (uint8_t)q->p[*q_off];
	memcpy(&len, q->p + *q_off + 1, 4);
	if (len > PROTO_MAX_PAYLOAD)
		len = PROTO_MAX_PAYLOAD; /* rec_add never queues more */
	memcpy(cur, q->p + *q_off + REC_HDR, len);
	*p = cur;
	*n = len;
	*q_off += REC_HDR + len;
	return 1;
}

static struct envd_req *req_find(struct envd *e, uint32_t id)
{
	for (struct envd_req *r = e->reqs; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

static struct envd_proc *proc_find(struct envd *e, uint32_t pid)
{
	for (struct envd_proc *p = e->procs; p; p = p->next)
		if (p->pid == pid)
			return p;
	return NULL;
}

static void proc_remove(struct envd *e, struct envd_proc *p)
{
	for (struct envd_proc **pp = &e->procs; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	free(p);
}

/* Acknowledge what every subscriber of p has taken (all of it when none). */
static void proc_ack(struct envd *e, struct envd_proc *p)
{
	uint64_t min = p->total_in;

	for (struct envd_sub *s = p->subs; s; s = s->next)
		if (s->taken < min)
			min = s->taken;
	if (min > p->acked) {
		uint32_t v[2] = { p->pid, (uint32_t)(min - p->acked) };

		envd_queue_u32s(e, EP_ACK, v, 2);
		p->acked = min;
	}
}

static void sub_attach(struct envd *e, struct envd_sub *s, uint32_t pid)
{
	struct envd_proc *p = proc_find(e, pid);

	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p) {
			s->failed = 1;
			envd_set_err(&s->err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
			return;
		}
		p->pid = pid;
		p->next = e->procs;
		e->procs = p;
	}
	s->pid = pid;
	s->p = p;
	s->taken = p->total_in;
	s->next = p->subs;
	p->subs = s;
}

static void sub_detach(struct envd *e, struct envd_sub *s)
{
	struct envd_proc *p = s->p;

	if (!p)
		return;
	for (struct envd_sub **pp = &p->subs; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	s->p = NULL;
	proc_ack(e, p);
	if (!p->subs)
		proc_remove(e, p);
}

/* Every pending request and stream ends with `why` (unavailable). */
static void fail_all(struct envd *e, const char *why)
{
	for (struct envd_req *r = e->reqs; r; r = r->next)
		if (!r->ended && !r->failed) {
			r->failed = 1;
			envd_set_err(&r->err, CONNECT_UNAVAILABLE, 0, "%s", why);
		}
	while (e->procs) {
		struct envd_proc *p = e->procs;

		for (struct envd_sub *s = p->subs; s; s = s->next) {
			s->failed = 1;
			s->p = NULL;
			envd_set_err(&s->err, CONNECT_UNAVAILABLE, 0, "%s", why);
		}
		e->procs = p->next;
		free(p);
	}
	envd_ports_fail(e);
	envd_watches_fail(e, why);
	pthread_cond_broadcast(&e->cond);
}

static void die(struct envd *e, const char *why)
{
	if (e->state == ENVD_DEAD)
		return;
	e->state = ENVD_DEAD;
	snprintf(e->why, sizeof(e->why), "%s", why);
	fail_all(e, why);
}

/* ---- what the guest sends (lock held) ------------------------------------ */

static void on_frame(struct envd *e, const struct proto_frame *f)
{
	uint32_t v[2], id, pid, status;
	const uint8_t *raw;
	uint8_t stream, how;
	struct envd_req *r;
	struct envd_proc *p;
	size_t n;

	if (e->state == ENVD_HELLO_WAIT) {
		/* Until our HELLO is answered, what comes is the old
		 * connection's (a restored VM's envd sends it again). */
		if (f->type == EP_HELLO && eproto_u32s_decode(f->payload, f->len, v, 2) == 0)
			e->features = v[1];
		if (f->type == EP_DONE && eproto_u32s_decode(f->payload, f->len, v, 1) == 0 && v[0] == e->hello_req) {
			e->state = ENVD_READY;
			pthread_cond_broadcast(&e->cond);
		}
		return;
	}
	switch (f->type) {
	case EP_HELLO:
		/* The guest's envd began anew: nothing pending will be answered. */
		fprintf(stderr, "kiln-host: %s: the guest's envd said HELLO again; pending requests fail\n", e->name);
		fail_all(e, "the sandbox's envd restarted");
		return;
	case EP_STARTED:
		if (eproto_u32s_decode(f->payload, f->len, v, 2) < 0)
			goto malformed;
		r = req_find(e, v[0]);
		if (!r || r->ended || r->failed)
			return;
		r->pid = v[1];
		r->ended = 1;
		if (r->start_sub)
			sub_attach(e, r->start_sub, v[1]);
		pthread_cond_broadcast(&e->cond);
		return;
	case EP_OUT:
		if (eproto_out_decode(f->payload, f->len, &pid, &stream, &raw, &n) < 0)
			goto malformed;
		p = proc_find(e, pid);
		if (!p) {
			/* Nobody listens: E2B does not replay output to a later Connect. */
			uint32_t a[2] = { pid, (uint32_t)n };

			if (n)
				envd_queue_u32s(e, EP_ACK, a, 2);
			return;
		}
		for (struct envd_sub *s = p->subs; s; s = s->next)
			if (rec_add(&s->q, ENVD_SUB_Q_MAX, stream, raw, n) < 0) {
				/* The window bounds it: only a guest past its window gets here. */
				s->taken += n;
			}
		p->total_in += n;
		proc_ack(e, p); /* for subscribers that dropped it */
		pthread_cond_broadcast(&e->cond);
		return;
	case EP_END:
		if (eproto_end_decode(f->payload, f->len, &pid, &how, &status) < 0)
			goto malformed;
		p = proc_find(e, pid);
		if (!p)
			return;
		for (struct envd_sub *s = p->subs; s; s = s->next) {
			s->ended = 1;
			s->how = how;
			s->status = status;
			s->p = NULL;
		}
		/* The guest forgets the process's window with its END. */
		proc_remove(e, p);
		pthread_cond_broadcast(&e->cond);
		return;
	case EP_ERROR: {
		char msg[PROTO_MAX_MSG + 1];
		int32_t code;

		if (eproto_error_decode(f->payload, f->len, &id, &code, msg) < 0)
			goto malformed;
		r = id ? req_find(e, id) : NULL;
		if (!r) {
			if (!id)
				fprintf(stderr, "kiln-host: %s: the guest's envd says: %s\n", e->name, msg);
			return;
		}
		if (r->failed)
			return;
		r->failed = 1;
		r->err.code = connect_code_from_errno(code);
		r->err.errnum = code;
		snprintf(r->err.msg, sizeof(r->err.msg), "%s", msg);
		pthread_cond_broadcast(&e->cond);
		return;
	}
	case EP_PORT_OPENED:
	case EP_PORT_CLOSED:
	case EP_PORT_DATA:
	case EP_PORT_ACK:
	case EP_PORT_SHUT:
		if (envd_port_frame(e, f) < 0)
			goto malformed;
		return;
	case EP_WATCH_EVENT:
	case EP_WATCH_END:
		if (envd_watch_frame(e, f) < 0)
			goto malformed;
		return;
	case EP_DONE:
	case EP_ENTRY:
	case EP_PROC:
	case EP_DATA:
	case EP_PORTS_LIST:
		if (f->len < 4)
			goto malformed;
		id = (uint32_t)f->payload[0] | (uint32_t)f->payload[1] << 8 | (uint32_t)f->payload[2] << 16 |
		     (uint32_t)f->payload[3] << 24;
		r = req_find(e, id);
		if (!r || r->failed) {
			if (f->type == EP_DATA && f->len > 4) {
				uint32_t a[2] = { id, (uint32_t)(f->len - 4) };

				envd_queue_u32s(e, EP_ACK, a, 2);
			}
			return;
		}
		if (rec_add(&r->q, ENVD_REQ_Q_MAX, f->type, f->payload, f->len) < 0) {
			r->failed = 1;
			envd_set_err(&r->err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "the answer is too large");
			if (r->type == EP_LISTDIR || r->type == EP_READ) {
				uint32_t c = r->id;

				envd_queue_u32s(e, EP_CANCEL, &c, 1);
			}
		} else if (f->type == EP_DONE || f->type == EP_PORTS_LIST ||
			   (f->type == EP_ENTRY && r->type != EP_LISTDIR)) {
			r->ended = 1;
		}
		pthread_cond_broadcast(&e->cond);
		return;
	default:
		goto malformed;
	}
malformed:
	fprintf(stderr, "kiln-host: %s: malformed frame of type 0x%02x from the guest's envd; the channel closes\n",
		e->name, f->type);
	die(e, "the sandbox's envd broke the protocol");
}

/* ---- the I/O thread ------------------------------------------------------- */

static void *io_main(void *arg)
{
	struct envd *e = arg;

	pthread_mutex_lock(&e->lock);
	while (e->state != ENVD_DEAD) {
		struct pollfd pf[2] = { { .fd = e->fd, .events = POLLIN | (e->out.len ? POLLOUT : 0) },
					{ .fd = e->wake, .events = POLLIN } };
		int rc;

		pthread_mutex_unlock(&e->lock);
		rc = poll(pf, 2, -1);
		pthread_mutex_lock(&e->lock);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0) {
			die(e, "the sandbox's envd channel failed");
			break;
		}
		if (pf[1].revents & POLLIN) {
			uint64_t c;

			if (read(e->wake, &c, sizeof(c)) < 0) {
				/* EAGAIN: already drained */
			}
		}
		if (e->state == ENVD_DEAD)
			break;
		if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t n = read(e->fd, e->rbuf + e->rlen, 2 * PROTO_MAX_FRAME - e->rlen);
			size_t off = 0;

			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
				die(e, "the sandbox is gone (its envd channel closed)");
				break;
			}
			if (n > 0)
				e->rlen += (size_t)n;
			while (e->state != ENVD_DEAD) {
				struct proto_frame f;
				ssize_t k = proto_frame_parse(e->rbuf + off, e->rlen - off, &f);

				if (k < 0) {
					fprintf(stderr, "kiln-host: %s: bad frame header from the guest's envd\n", e->name);
					die(e, "the sandbox's envd broke the protocol");
					break;
				}
				if (k == 0)
					break;
				on_frame(e, &f);
				off += (size_t)k;
			}
			memmove(e->rbuf, e->rbuf + off, e->rlen - off);
			e->rlen -= off;
		}
		if ((pf[0].revents & POLLOUT) && e->out.len) {
			ssize_t n = write(e->fd, e->out.p, e->out.len);

			if (n > 0) {
				buf_consume(&e->out, (size_t)n);
				pthread_cond_broadcast(&e->cond);
				if (e->ports_blocked && e->out.len < ENVD_OUT_SOFT) {
					e->ports_blocked = 0;
					envd_ports_wake(e);
				}
			} else if (n < 0 && errno != EAGAIN && errno != EINTR) {
				die(e, "the sandbox is gone (its envd channel closed)");
				break;
			}
		}
	}
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

/* ---- the channel ------------------------------------------------------------ */

/* Ask for HELLO (again): a new id, so that only the answer to this one counts. */
static void say_hello(struct envd *e)
{
	uint32_t v[2] = { EPROTO_VERSION, e->next_id++ };

	e->hello_req = v[1];
	envd_queue_u32s(e, EP_HELLO, v, 2);
}

struct envd *envd_open(int fd, const char *name)
{
	struct envd *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	e->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	e->rbuf = malloc(2 * PROTO_MAX_FRAME);
	if (e->fd < 0 || e->wake < 0 || !e->rbuf)
		goto fail;
	/* O_NONBLOCK is the file's, shared with fd: nobody else reads it. */
	fcntl(e->fd, F_SETFL, fcntl(e->fd, F_GETFL) | O_NONBLOCK);
	pthread_mutex_init(&e->lock, NULL);
	condwait_init(&e->cond);
	e->refs = 1;
	e->next_id = ENVD_REQ_BASE;
	buf_init(&e->out, 0);
	e->state = ENVD_HELLO_WAIT;
	say_hello(e);
	if (pthread_create(&e->th, NULL, io_main, e) != 0) {
		pthread_cond_destroy(&e->cond);
		pthread_mutex_destroy(&e->lock);
		buf_free(&e->out);
		goto fail;
	}
	e->th_started = 1;
	return e;
fail:
	if (e->fd >= 0)
		close(e->fd);
	if (e->wake >= 0)
		close(e->wake);
	free(e->rbuf);
	free(e);
	return NULL;
}

void envd_kill(struct envd *e, const char *why)
{
	int join;

	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	die(e, why);
	wake_io(e);
	join = e->th_started && !e->joined;
	e->joined = 1;
	pthread_mutex_unlock(&e->lock);
	if (join)
		pthread_join(e->th, NULL);
}

void envd_wait_idle(struct envd *e, int64_t deadline_ms)
{
	pthread_mutex_lock(&e->lock);
	while (e->refs > 1)
		if (condwait_until(&e->cond, &e->lock, NULL, deadline_ms) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&e->lock);
}

int envd_alive(struct envd *e)
{
	int a;

	pthread_mutex_lock(&e->lock);
	a = e->state != ENVD_DEAD;
	pthread_mutex_unlock(&e->lock);
	return a;
}

int envd_refs(struct envd *e)
{
	int n;

	pthread_mutex_lock(&e->lock);
	n = e->refs;
	pthread_mutex_unlock(&e->lock);
	return n;
}

void envd_ref(struct envd *e)
{
	pthread_mutex_lock(&e->lock);
	e->refs++;
	pthread_mutex_unlock(&e->lock);
}

void envd_unref(struct envd *e)
{
	int last;

	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	last = --e->refs == 0;
	pthread_cond_broadcast(&e->cond); /* envd_wait_idle */
	pthread_mutex_unlock(&e->lock);
	if (!last)
		return;
	envd_kill(e, "the sandbox's envd channel closed");
	/* No request or subscriber is left: each held a reference. */
	envd_watches_free(e); /* polling watchers: they hold no reference */
	close(e->fd);
	close(e->wake);
	buf_free(&e->out);
	free(e->rbuf);
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	free(e);
}

/* Wait for READY (lock held). 0 or -1 with err. */
int envd_wait_ready(struct envd *e, int64_t deadline_ms, struct envd_err *err)
{
	int64_t hello_until = proto_now_ms() + ENVD_HELLO_MS;

	if (hello_until > deadline_ms)
		hello_until = deadline_ms;
	while (e->state == ENVD_HELLO_WAIT)
		if (condwait_until(&e->cond, &e->lock, NULL, hello_until) == ETIMEDOUT && e->state == ENVD_HELLO_WAIT) {
			/* Ask again for whoever comes next: an envd that started
			 * since sees only a new HELLO. */
			say_hello(e);
			envd_set_err(err, CONNECT_UNAVAILABLE, 0, "%s", "the sandbox's envd does not answer");
			return -1;
		}
	if (e->state == ENVD_DEAD) {
		envd_set_err(err, CONNECT_UNAVAILABLE, 0, "%s", e->why[0] ? e->why : "the sandbox is gone");
		return -1;
	}
	return 0;
}

int envd_send(struct envd *e, uint8_t type, const void *p, size_t len, int64_t deadline_ms, struct envd_err *err)
{
	int rc = -1;

	pthread_mutex_lock(&e->lock);
	if (envd_wait_ready(e, deadline_ms, err) == 0) {
		/* Input for a guest that does not read waits here, not in memory. */
		while (e->state == ENVD_READY && e->out.len >= ENVD_OUT_SOFT)
			if (condwait_until(&e->cond, &e->lock, NULL, deadline_ms) == ETIMEDOUT)
				break;
		if (e->state != ENVD_READY)
			envd_set_err(err, CONNECT_UNAVAILABLE, 0, "%s", e->why[0] ? e->why : "the sandbox is gone");
		else if (e->out.len >= ENVD_OUT_SOFT)
			envd_set_err(err, CONNECT_DEADLINE_EXCEEDED, 0, "%s", "the sandbox's envd does not take the data");
		else if ((rc = envd_queue_frame(e, type, p, len)) < 0)
			envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
	}
	pthread_mutex_unlock(&e->lock);
	return rc < 0 ? -1 : 0;
}

/* ---- requests ------------------------------------------------------------- */

static struct envd_req *req_new(struct envd *e, uint8_t type, uint8_t *p, size_t len, int64_t deadline_ms,
				struct envd_sub *start_sub, struct envd_err *err)
{
	struct envd_req *r = calloc(1, sizeof(*r));

	if (!r) {
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
		return NULL;
	}
	r->e = e;
	r->type = type;
	r->start_sub = start_sub;
	buf_init(&r->q, 0);
	pthread_mutex_lock(&e->lock);
	if (envd_wait_ready(e, deadline_ms, err) < 0) {
		pthread_mutex_unlock(&e->lock);
		free(r);
		return NULL;
	}
	r->id = e->next_id++;
	if (r->id < ENVD_REQ_BASE)
		r->id = e->next_id = ENVD_REQ_BASE; /* wrapped */
	put_u32(p, r->id);
	if (envd_queue_frame(e, type, p, len) < 0) {
		pthread_mutex_unlock(&e->lock);
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
		free(r);
		return NULL;
	}
	e->refs++;
	r->next = e->reqs;
	e->reqs = r;
	pthread_mutex_unlock(&e->lock);
	return r;
}

struct envd_req *envd_req_begin(struct envd *e, uint8_t type, uint8_t *p, size_t len, int64_t deadline_ms,
				struct envd_err *err)
{
	return req_new(e, type, p, len, deadline_ms, NULL, err);
}

uint32_t envd_req_id(const struct envd_req *r)
{
	return r->id;
}

int envd_req_next(struct envd_req *r, struct envd_reply *out, int64_t deadline_ms, struct envd_err *err)
{
	struct envd *e = r->e;
	int ret;

	pthread_mutex_lock(&e->lock);
	for (;;) {
		if (rec_take(&r->q, &r->q_off, r->cur, &out->type, &out->payload, &out->len)) {
			ret = 1;
			break;
		}
		if (r->failed) {
			if (err)
				*err = r->err;
			ret = -1;
			break;
		}
		if (r->ended) {
			ret = 0;
			break;
		}
		if (e->state == ENVD_DEAD) {
			envd_set_err(err, CONNECT_UNAVAILABLE, 0, "%s", e->why);
			ret = -1;
			break;
		}
		if (condwait_until(&e->cond, &e->lock, NULL, deadline_ms) == ETIMEDOUT &&
		    !(r->q.len > r->q_off || r->failed || r->ended)) {
			envd_set_err(err, CONNECT_DEADLINE_EXCEEDED, 0, "%s", "the sandbox's envd did not answer in time");
			ret = -1;
			break;
		}
	}
	pthread_mutex_unlock(&e->lock);
	return ret;
}

void envd_req_ack(struct envd_req *r, size_t n)
{
	uint32_t v[2] = { r->id, (uint32_t)n };

	if (!n)
		return;
	pthread_mutex_lock(&r->e->lock);
	if (r->e->state == ENVD_READY && !r->ended && !r->failed)
		envd_queue_u32s(r->e, EP_ACK, v, 2);
	pthread_mutex_unlock(&r->e->lock);
}

int envd_req_send(struct envd_req *r, uint8_t type, uint8_t *p, size_t len, int64_t deadline_ms, struct envd_err *err)
{
	struct envd *e = r->e;
	int ret = -1;

	pthread_mutex_lock(&e->lock);
	for (;;) {
		if (r->failed) {
			if (err)
				*err = r->err;
			break;
		}
		if (e->state != ENVD_READY) {
			envd_set_err(err, CONNECT_UNAVAILABLE, 0, "%s", e->why[0] ? e->why : "the sandbox is gone");
			break;
		}
		if (e->out.len < ENVD_OUT_SOFT) {
			put_u32(p, r->id);
			if (envd_queue_frame(e, type, p, len) < 0)
				envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
			else
				ret = 0;
			break;
		}
		if (condwait_until(&e->cond, &e->lock, NULL, deadline_ms) == ETIMEDOUT && e->out.len >= ENVD_OUT_SOFT) {
			envd_set_err(err, CONNECT_DEADLINE_EXCEEDED, 0, "%s", "the sandbox's envd does not take the data");
			break;
		}
	}
	pthread_mutex_unlock(&e->lock);
	return ret;
}

static void sub_free_locked(struct envd *e, struct envd_sub *s);

void envd_req_free(struct envd_req *r)
{
	struct envd *e;

	if (!r)
		return;
	e = r->e;
	pthread_mutex_lock(&e->lock);
	for (struct envd_req **pp = &e->reqs; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	if (!r->ended && !r->failed && e->state == ENVD_READY && (r->type == EP_READ || r->type == EP_WRITE)) {
		uint32_t c = r->id;

		envd_queue_u32s(e, EP_CANCEL, &c, 1);
	}
	if (r->start_sub && !r->ended)
		sub_free_locked(e, r->start_sub); /* never attached, never handed out */
	pthread_mutex_unlock(&e->lock);
	buf_free(&r->q);
	free(r);
	envd_unref(e);
}

/* ---- process output ---------------------------------------------------------- */

static struct envd_sub *sub_new(struct envd *e)
{
	struct envd_sub *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->e = e;
	buf_init(&s->q, 0);
	envd_ref(e);
	return s;
}

/* Lock held; drops the reference without taking the lock again later:
 * the caller holds one of its own. */
static void sub_free_locked(struct envd *e, struct envd_sub *s)
{
	sub_detach(e, s);
	buf_free(&s->q);
	free(s);
	e->refs--; /* never the last: the caller's request holds one */
}

int envd_start(struct envd *e, uint8_t *p, size_t len, int64_t deadline_ms, struct envd_sub **sub, uint32_t *pid,
	       struct envd_err *err)
{
	struct envd_sub *s = sub_new(e);
	struct envd_req *r;
	struct envd_reply rep;
	int n;

	*sub = NULL;
	if (!s) {
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
		return -1;
	}
	r = req_new(e, EP_START, p, len, deadline_ms, s, err);
	if (!r) {
		pthread_mutex_lock(&e->lock);
		buf_free(&s->q);
		free(s);
		e->refs--;
		pthread_mutex_unlock(&e->lock);
		return -1;
	}
	n = envd_req_next(r, &rep, deadline_ms, err);
	if (n < 0 || n == 1) {
		if (n == 1)
			envd_set_err(err, CONNECT_INTERNAL, 0, "%s", "unexpected answer to START");
		envd_req_free(r); /* frees s too: not attached */
		return -1;
	}
	*pid = r->pid;
	r->start_sub = NULL; /* attached: the caller's now */
	envd_req_free(r);
	*sub = s;
	return 0;
}

struct envd_sub *envd_subscribe(struct envd *e, uint32_t pid, struct envd_err *err)
{
	struct envd_sub *s = sub_new(e);

	if (!s) {
		envd_set_err(err, CONNECT_RESOURCE_EXHAUSTED, 0, "%s", "out of memory");
		return NULL;
	}
	pthread_mutex_lock(&e->lock);
	if (e->state == ENVD_DEAD) {
		envd_set_err(err, CONNECT_UNAVAILABLE, 0, "%s", e->why);
		buf_free(&s->q);
		free(s);
		e->refs--;
		pthread_mutex_unlock(&e->lock);
		return NULL;
	}
	sub_attach(e, s, pid);
	pthread_mutex_unlock(&e->lock);
	return s;
}

void envd_sub_next(struct envd_sub *s, struct envd_event *ev, int64_t deadline_ms)
{
	struct envd *e = s->e;
	uint8_t type;

	memset(ev, 0, sizeof(*ev));
	pthread_mutex_lock(&e->lock);
	/* What was handed out last time has been taken. */
	if (s->last_len) {
		s->taken += s->last_len;
		s->last_len = 0;
		if (s->p)
			proc_ack(e, s->p);
	}
	for (;;) {
		if (rec_take(&s->q, &s->q_off, s->cur, &type, &ev->data, &ev->len)) {
			ev->kind = ENVD_EV_DATA;
			ev->stream = type;
			s->last_len = ev->len;
			break;
		}
		if (s->ended) {
			ev->kind = ENVD_EV_END;
			ev->how = s->how;
			ev->status = s->status;
			break;
		}
		if (s->failed) {
			ev->kind = ENVD_EV_ERROR;
			ev->err = s->err;
			break;
		}
		if (condwait_until(&e->cond, &e->lock, NULL, deadline_ms) == ETIMEDOUT &&
		    !(s->q.len > s->q_off || s->ended || s->failed))
			break; /* ENVD_EV_NONE */
	}
	pthread_mutex_unlock(&e->lock);
}

void envd_sub_free(struct envd_sub *s)
{
	struct envd *e;

	if (!s)
		return;
	e = s->e;
	pthread_mutex_lock(&e->lock);
	sub_detach(e, s);
	pthread_mutex_unlock(&e->lock);
	buf_free(&s->q);
	free(s);
	envd_unref(e);
}
