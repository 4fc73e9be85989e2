/* port_tunnel: kiln-api's end of kiln-host's port tunnel (docs/api.md,
 * "kiln-host: ports"): a connection to the session's host (TCP, or TLS
 * for an https:// host: hostclient_connect), `GET
 * /v1/sessions/{id}/ports/{port}/connect` with `Upgrade: kiln-tunnel` and
 * the cluster token, and after the host's 101 a raw byte pipe to the port in
 * the sandbox. The host's answer head is read with port_resp (bounded); an
 * error answer's JSON body is kept (at most 1 KiB) for the caller to pass
 * on. */
#include "ports_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "hostcall/host_ops.h"
#include "io.h"

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
		if ((k = io_wait(fd, POLLOUT, deadline_ms)) < 0)
			return (int)k;
	}
	return 0;
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
	fd = hostclient_connect(base, deadline_ms, f->why, sizeof(f->why));
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
			if (io_wait(fd, POLLIN, deadline_ms) < 0) {
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
