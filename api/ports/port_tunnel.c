/* port_tunnel: kiln-api's end of kiln-host's port tunnel (docs/api.md,
 * "kiln-host: ports"): a TCP connection to the session's host, `GET
 * /v1/sessions/{id}/ports/{port}/connect` with `Upgrade: kiln-tunnel` and
 * the cluster token, and after the host's 101 a raw byte pipe to the port in
 * the sandbox. The host's answer head is read with port_resp (bounded); an
 * error answer's JSON body is kept (at most 1 KiB) for the caller to pass
 * on. */
#include "ports_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int wait_fd(int fd, short ev, int64_t deadline_ms)
{
	for (;;) {
		int64_t left = deadline_ms - now_ms();
		struct pollfd pf = { .fd = fd, .events = ev };
		int rc;

		if (left <= 0)
			return -ETIMEDOUT;
		rc = poll(&pf, 1, left > 60000 ? 60000 : (int)left);
		if (rc > 0)
			return 0;
		if (rc < 0 && errno != EINTR)
			return -errno;
	}
}

int port_send_all(int fd, const void *p, size_t n, int64_t deadline_ms)
{
	const char *c = p;

	while (n) {
		ssize_t k = send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (k > 0) {
			c += k;
			n -= (size_t)k;
			continue;
		}
		if (k < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		if ((k = wait_fd(fd, POLLOUT, deadline_ms)) < 0)
			return (int)k;
	}
	return 0;
}

/* "http://HOST:PORT[/]" into host and port; -1 when it is not that. */
static int split_base(const char *base, char host[256], char port[8])
{
	const char *h, *colon, *end;

	if (strncmp(base, "http://", 7))
		return -1;
	h = base + 7;
	end = h + strcspn(h, "/");
	if (*h == '[') { /* [v6]:port */
		const char *rb = memchr(h, ']', (size_t)(end - h));

		if (!rb || rb[1] != ':')
			return -1;
		colon = rb + 1;
		h++;
		if ((size_t)(rb - h) >= 256)
			return -1;
		memcpy(host, h, (size_t)(rb - h));
		host[rb - h] = 0;
	} else {
		colon = memchr(h, ':', (size_t)(end - h));
		if (!colon || (size_t)(colon - h) >= 256 || colon == h)
			return -1;
		memcpy(host, h, (size_t)(colon - h));
		host[colon - h] = 0;
	}
	if (end - colon - 1 < 1 || end - colon - 1 > 5)
		return -1;
	memcpy(port, colon + 1, (size_t)(end - colon - 1));
	port[end - colon - 1] = 0;
	return 0;
}

static int connect_host(const char *base, int64_t deadline_ms, struct port_tunnel_fail *f)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	char host[256], port[8];
	int fd = -1, rc;

	if (split_base(base, host, port) < 0) {
		snprintf(f->why, sizeof(f->why), "the host's URL %.120s is not http://HOST:PORT", base);
		return -1;
	}
	rc = getaddrinfo(host, port, &hints, &ai);
	if (rc) {
		snprintf(f->why, sizeof(f->why), "%.120s: %s", host, gai_strerror(rc));
		return -1;
	}
	for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			continue;
		/* A relay: a request's head and body go out as they come. With
		 * Nagle the body (a second small write) waited for the host's
		 * delayed ACK: 40 ms on every POST to a port. */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
		if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
			break;
		if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline_ms) == 0) {
			int err = 0;
			socklen_t len = sizeof(err);

			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && !err)
				break;
			errno = err ? err : ETIMEDOUT;
		}
		snprintf(f->why, sizeof(f->why), "%.120s: %s", base, strerror(errno));
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

int port_tunnel_open(const char *base, const char *token, const char *id, unsigned port, int64_t deadline_ms,
		     struct port_tunnel_fail *f)
{
	struct port_resp *r = malloc(sizeof(*r));
	char req[1024], in[4096];
	struct buf body;
	int fd, n, rc = -1;

	memset(f, 0, sizeof(*f));
	buf_init(&body, sizeof(f->body) - 1);
	if (!r) {
		snprintf(f->why, sizeof(f->why), "out of memory");
		return -1;
	}
	fd = connect_host(base, deadline_ms, f);
	if (fd < 0)
		goto out;
	n = snprintf(req, sizeof(req),
		     "GET /v1/sessions/%s/ports/%u/connect HTTP/1.1\r\nHost: kiln-host\r\nAuthorization: Bearer %s\r\n"
		     "Connection: Upgrade\r\nUpgrade: kiln-tunnel\r\n\r\n",
		     id, port, token);
	if (n <= 0 || (size_t)n >= sizeof(req) || port_send_all(fd, req, (size_t)n, deadline_ms) < 0) {
		snprintf(f->why, sizeof(f->why), "%.120s: the request could not be sent", base);
		goto out;
	}
	/* The head one byte at a time up to its end on a 101: what follows is
	 * the server's, and must stay in the socket for the caller. An error
	 * answer is read whole (bounded). */
	port_resp_init(r, 0, &body);
	for (;;) {
		size_t want = r->head_done ? sizeof(in) : 1;
		ssize_t k = recv(fd, in, want, MSG_DONTWAIT);

		if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
			if (wait_fd(fd, POLLIN, deadline_ms) < 0) {
				snprintf(f->why, sizeof(f->why), "%.120s: no answer in time", base);
				goto out;
			}
			continue;
		}
		if (k <= 0) {
			if (r->head_done && port_resp_eof(r) == 0)
				break;
			snprintf(f->why, sizeof(f->why), "%.120s: the connection ended before an answer", base);
			f->status = 0;
			goto out;
		}
		if (port_resp_feed(r, in, (size_t)k) < 0) {
			if (r->head_done && body.len >= sizeof(f->body) - 1)
				break; /* an error body longer than we keep: what we have */
			snprintf(f->why, sizeof(f->why), "%.120s: a bad answer (%s)", base, r->why);
			goto out;
		}
		if (r->upgrade || r->done)
			break;
	}
	if (r->upgrade && r->status == 101) {
		int fl = fcntl(fd, F_GETFL);

		fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
		rc = fd;
		fd = -1;
		goto out;
	}
	f->status = (unsigned)r->status;
	if (body.len)
		memcpy(f->body, body.p, body.len);
	f->body[body.len] = 0;
out:
	if (fd >= 0)
		close(fd);
	buf_free(&body);
	free(r);
	return rc;
}

void port_tunnel_error(const struct port_tunnel_fail *f, struct kiln_err *err)
{
	json_t *j = f->status ? json_loads(f->body, 0, NULL) : NULL;
	json_t *e = json_object_get(j, "error");
	const char *code = json_string_value(json_object_get(e, "code"));
	const char *msg = json_string_value(json_object_get(e, "message"));
	enum kiln_errc k = code ? kiln_err_lookup(code) : KERR_NONE;

	if (!f->status)
		kiln_err_set(err, KERR_HOST_UNAVAILABLE, "the session's host cannot be reached: %s", f->why);
	else if (k == KERR_NONE)
		kiln_err_set(err, KERR_HOST_ERROR, "the session's host answered %u", f->status);
	else
		kiln_err_set(err, k, "%s", msg ? msg : code);
	json_decref(j);
}
