/* port_ws: an upgraded connection (a WebSocket, or any protocol the server
 * switched to) spliced between the client's socket and the tunnel to the
 * server: bytes both ways as they come, at most 64 KiB held each way, a
 * half close passed on, a reset when either side breaks. kiln-api reads
 * none of it. */
#include "ports_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SPLICE_BUF (64u << 10)

/* One direction: from -> to through buf. */
struct way {
	int from, to;
	char *buf;
	size_t len, off;
	int eof, shut;
};

/* Move what can move now: 0, or -1 when a socket broke. */
static int way_step(struct way *w)
{
	for (;;) {
		if (w->off < w->len) {
			ssize_t k = send(w->to, w->buf + w->off, w->len - w->off, MSG_NOSIGNAL | MSG_DONTWAIT);

			if (k < 0 && (errno == EAGAIN || errno == EINTR))
				return 0;
			if (k <= 0)
				return -1;
			w->off += (size_t)k;
			continue;
		}
		w->len = w->off = 0;
		if (w->eof) {
			if (!w->shut) {
				shutdown(w->to, SHUT_WR);
				w->shut = 1;
			}
			return 0;
		}
		{
			ssize_t k = recv(w->from, w->buf, SPLICE_BUF, MSG_DONTWAIT);

			if (k < 0 && (errno == EAGAIN || errno == EINTR))
				return 0;
			if (k < 0)
				return -1;
			if (k == 0)
				w->eof = 1;
			else
				w->len = (size_t)k;
		}
	}
}

void port_splice(int client, int server, const char *to_server, size_t to_server_len, const char *to_client,
		 size_t to_client_len)
{
	static const struct linger reset = { .l_onoff = 1, .l_linger = 0 };
	struct way up = { client, server, malloc(SPLICE_BUF), 0, 0, 0, 0 };
	struct way down = { server, client, malloc(SPLICE_BUF), 0, 0, 0, 0 };
	int broken = !up.buf || !down.buf;

	if (!broken && to_server_len <= SPLICE_BUF) {
		memcpy(up.buf, to_server, to_server_len);
		up.len = to_server_len;
	}
	if (!broken && to_client_len <= SPLICE_BUF) {
		memcpy(down.buf, to_client, to_client_len);
		down.len = to_client_len;
	}
	while (!broken) {
		struct pollfd pf[2] = { { .fd = client }, { .fd = server } };

		if (way_step(&up) < 0 || way_step(&down) < 0) {
			broken = 1;
			break;
		}
		if (up.shut && down.shut)
			break;
		/* Wait to read where its buffer is empty, to write where it is not. */
		if (!up.eof && up.off == up.len)
			pf[0].events |= POLLIN;
		if (down.off < down.len)
			pf[0].events |= POLLOUT;
		if (!down.eof && down.off == down.len)
			pf[1].events |= POLLIN;
		if (up.off < up.len)
			pf[1].events |= POLLOUT;
		if (!pf[0].events)
			pf[0].fd = -1;
		if (!pf[1].events)
			pf[1].fd = -1;
		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			broken = 1;
	}
	if (broken) {
		setsockopt(client, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
		setsockopt(server, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
	}
	close(server);
	free(up.buf);
	free(down.buf);
}
