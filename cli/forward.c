/* forward: `kiln session forward ID PORT [LOCAL_PORT]`, like kubectl
 * port-forward: listens on 127.0.0.1:LOCAL_PORT (default PORT; 0: any) and
 * carries each connection to PORT inside session ID through kiln-api
 * (`GET /v1/sessions/{id}/ports/{port}` with `Upgrade: kiln-tunnel`,
 * docs/api.md "Ports"): any TCP protocol, bytes both ways, half closes
 * passed on. One thread per connection; Ctrl-C stops it. */
#include "forward.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FWD_BUF (64u << 10)
#define FWD_HEAD_MAX 16384

struct fwd {
	const struct cli_conn *conn;
	const char *id;
	unsigned port;
	char host[256], hport[8];
};

struct fwd_conn {
	const struct fwd *f;
	int client;
};

/* kiln-api's address from its URL (http://HOST:PORT only: the tunnel is
 * plain TCP). */
static int api_addr(const char *api, char host[256], char port[8])
{
	const char *h, *colon, *end;

	if (strncmp(api, "http://", 7))
		return -1;
	h = api + 7;
	end = h + strcspn(h, "/");
	colon = memchr(h, ':', (size_t)(end - h));
	if (!colon) {
		if ((size_t)(end - h) >= 256)
			return -1;
		memcpy(host, h, (size_t)(end - h));
		host[end - h] = 0;
		strcpy(port, "80");
		return 0;
	}
	if ((size_t)(colon - h) >= 256 || end - colon - 1 < 1 || end - colon - 1 > 5)
		return -1;
	memcpy(host, h, (size_t)(colon - h));
	host[colon - h] = 0;
	memcpy(port, colon + 1, (size_t)(end - colon - 1));
	port[end - colon - 1] = 0;
	return 0;
}

static int dial(const struct fwd *f)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	int fd = -1;

	if (getaddrinfo(f->host, f->hport, &hints, &ai))
		return -1;
	for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	return fd;
}

/* The tunnel through kiln-api, after its 101 (bytes past the head in
 * extra); -1 with the refusal printed. */
static int open_tunnel(const struct fwd *f, char *extra, size_t *extra_len)
{
	char req[1024], head[FWD_HEAD_MAX + 1];
	size_t n = 0;
	int fd = dial(f), k;
	char *end = NULL;

	*extra_len = 0;
	if (fd < 0) {
		fprintf(stderr, "kiln: session forward: cannot reach kiln-api at %s:%s\n", f->host, f->hport);
		return -1;
	}
	k = snprintf(req, sizeof(req),
		     "GET /v1/sessions/%s/ports/%u HTTP/1.1\r\nHost: %s:%s\r\nAuthorization: Bearer %s\r\n"
		     "Connection: Upgrade\r\nUpgrade: kiln-tunnel\r\n\r\n",
		     f->id, f->port, f->host, f->hport, f->conn->key ? f->conn->key : "");
	if (k <= 0 || (size_t)k >= sizeof(req) || send(fd, req, (size_t)k, MSG_NOSIGNAL) != k)
		goto fail;
	while (!end && n < FWD_HEAD_MAX) {
		ssize_t r = recv(fd, head + n, FWD_HEAD_MAX - n, 0);

		if (r <= 0)
			break;
		n += (size_t)r;
		head[n] = 0;
		end = strstr(head, "\r\n\r\n");
	}
	if (end && !strncmp(head, "HTTP/1.1 101 ", 13)) {
		*extra_len = n - (size_t)(end + 4 - head);
		memcpy(extra, end + 4, *extra_len);
		return fd;
	}
	head[n] = 0;
	/* kiln-api's refusal: its status line and JSON error, as they came. */
	fprintf(stderr, "kiln: session forward: %.*s\n", (int)strcspn(head, "\r\n"), n ? head : "no answer");
	if (end)
		fprintf(stderr, "  %.400s\n", end + 4);
fail:
	close(fd);
	return -1;
}

static void splice2(int a, int b, const char *to_a, size_t to_a_len)
{
	char *buf[2] = { malloc(FWD_BUF), malloc(FWD_BUF) };
	size_t len[2] = { 0, to_a_len }, off[2] = { 0, 0 }; /* [0]: a -> b, [1]: b -> a */
	int eof[2] = { 0, 0 }, shut[2] = { 0, 0 }, fds[2] = { a, b };

	if (!buf[0] || !buf[1])
		goto out;
	memcpy(buf[1], to_a, to_a_len);
	for (;;) {
		struct pollfd pf[2] = { { .fd = a }, { .fd = b } };

		for (int w = 0; w < 2; w++) {
			int from = fds[w], to = fds[!w];

			if (off[w] < len[w]) {
				ssize_t k = send(to, buf[w] + off[w], len[w] - off[w], MSG_NOSIGNAL | MSG_DONTWAIT);

				if (k < 0 && errno != EAGAIN && errno != EINTR)
					goto out;
				if (k > 0)
					off[w] += (size_t)k;
			}
			if (off[w] == len[w]) {
				off[w] = len[w] = 0;
				if (eof[w] && !shut[w]) {
					shutdown(to, SHUT_WR);
					shut[w] = 1;
				}
			}
			(void)from;
		}
		if (shut[0] && shut[1])
			break;
		for (int w = 0; w < 2; w++) {
			if (!eof[w] && !len[w])
				pf[w].events |= POLLIN;
			if (len[!w])
				pf[w].events |= POLLOUT;
			if (!pf[w].events)
				pf[w].fd = -1;
		}
		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			break;
		for (int w = 0; w < 2; w++)
			if ((pf[w].revents & (POLLIN | POLLHUP | POLLERR)) && !eof[w] && !len[w]) {
				ssize_t k = recv(fds[w], buf[w], FWD_BUF, MSG_DONTWAIT);

				if (k == 0)
					eof[w] = 1;
				else if (k > 0)
					len[w] = (size_t)k;
				else if (errno != EAGAIN && errno != EINTR)
					goto out;
			}
	}
out:
	free(buf[0]);
	free(buf[1]);
}

static void *conn_main(void *arg)
{
	struct fwd_conn *c = arg;
	char *extra = malloc(FWD_HEAD_MAX);
	size_t extra_len = 0;
	int t = extra ? open_tunnel(c->f, extra, &extra_len) : -1;

	if (t >= 0) {
		splice2(c->client, t, extra, extra_len);
		close(t);
	}
	close(c->client);
	free(extra);
	free(c);
	return NULL;
}

int session_forward(const char *id, unsigned port, int local_port, const struct cli_conn *conn)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	struct fwd f = { .conn = conn, .id = id, .port = port };
	int one = 1, lfd;

	if (api_addr(conn->api, f.host, f.hport) < 0) {
		fprintf(stderr, "kiln: session forward: KILN_API must be http://HOST:PORT (got %s)\n", conn->api);
		return 1;
	}
	a.sin_port = htons((uint16_t)(local_port < 0 ? port : (unsigned)local_port));
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 128) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &alen) < 0) {
		fprintf(stderr, "kiln: session forward: cannot listen on 127.0.0.1:%d: %s\n",
			local_port < 0 ? (int)port : local_port, strerror(errno));
		if (lfd >= 0)
			close(lfd);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	printf("Forwarding from 127.0.0.1:%u -> session %s port %u (Ctrl-C stops)\n", ntohs(a.sin_port), id, port);
	fflush(stdout);
	for (;;) {
		struct fwd_conn *c;
		pthread_attr_t at;
		pthread_t th;
		int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (cfd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE)
				continue;
			fprintf(stderr, "kiln: session forward: accept: %s\n", strerror(errno));
			close(lfd);
			return 1;
		}
		c = malloc(sizeof(*c));
		if (!c) {
			close(cfd);
			continue;
		}
		c->f = &f;
		c->client = cfd;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&th, &at, conn_main, c) != 0) {
			close(cfd);
			free(c);
		}
		pthread_attr_destroy(&at);
	}
}
