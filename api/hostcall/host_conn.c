/* host_conn: a raw byte stream to a kiln-host for the port tunnel
 * (hostclient_connect). http:// is a TCP connection; https:// is a TLS
 * connection made and verified by libcurl (CONNECT_ONLY, the CA of
 * hostclient_set_ca), whose plaintext a pump thread moves to and from one
 * end of a socketpair, so that the tunnel's callers (port_proxy, port_code,
 * port_ws) read and write a plain socket either way. */
#include "hostclient.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "io.h"

#define PUMP_BUF (64u << 10)

/* "SCHEME://HOST:PORT[/...]" into host and port; -1 when it is not that. */
static int split_base(const char *base, size_t scheme_len, char host[256], char port[8])
{
	const char *h = base + scheme_len, *colon, *end = h + strcspn(h, "/");

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

static int connect_tcp(const char *base, int64_t deadline_ms, char *why, size_t why_len)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	char host[256], port[8];
	int fd = -1, rc;

	if (split_base(base, 7, host, port) < 0) {
		snprintf(why, why_len, "the host's URL %.120s is not http://HOST:PORT", base);
		return -1;
	}
	rc = getaddrinfo(host, port, &hints, &ai);
	if (rc) {
		snprintf(why, why_len, "%.120s: %s", host, gai_strerror(rc));
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
		if (errno == EINPROGRESS && io_wait(fd, POLLOUT, deadline_ms) == 0) {
			int err = 0;
			socklen_t len = sizeof(err);

			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && !err)
				break;
			errno = err ? err : ETIMEDOUT;
		}
		snprintf(why, why_len, "%.120s: %s", base, strerror(errno));
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

/* ---- TLS: the pump ---- */

struct pump {
	CURL *h;
	int sock;   /* the TLS connection's socket (curl's) */
	int local;  /* our end of the socketpair */
	char up[PUMP_BUF], down[PUMP_BUF];
	size_t up_len, up_off, down_len, down_off;
};

/* Moves bytes until either side fails or both have ended. curl's TLS layer
 * may hold decrypted bytes the socket no longer shows as readable, so it is
 * read whenever the down buffer is empty, before any wait. */
static void *pump_run(void *arg)
{
	struct pump *p = arg;
	int local_eof = 0, tls_eof = 0;

	for (;;) {
		struct pollfd pf[2] = { { .fd = p->local }, { .fd = p->sock } };
		int progress = 0;

		if (!tls_eof && p->down_off == p->down_len) {
			size_t n = 0;
			CURLcode e = curl_easy_recv(p->h, p->down, sizeof(p->down), &n);

			if (e == CURLE_OK && n) {
				p->down_len = n;
				p->down_off = 0;
				progress = 1;
			} else if (e == CURLE_OK) { /* the host closed */
				tls_eof = 1;
				shutdown(p->local, SHUT_WR);
				progress = 1;
			} else if (e != CURLE_AGAIN) {
				break;
			}
		}
		if (p->down_off < p->down_len) {
			ssize_t k = send(p->local, p->down + p->down_off, p->down_len - p->down_off,
					 MSG_NOSIGNAL | MSG_DONTWAIT);

			if (k > 0) {
				p->down_off += (size_t)k;
				progress = 1;
			} else if (k < 0 && errno != EAGAIN && errno != EINTR) {
				break;
			}
		}
		if (!local_eof && p->up_off == p->up_len) {
			ssize_t k = recv(p->local, p->up, sizeof(p->up), MSG_DONTWAIT);

			if (k > 0) {
				p->up_len = (size_t)k;
				p->up_off = 0;
				progress = 1;
			} else if (k == 0) {
				local_eof = 1; /* half closed or closed: TLS has no half close to pass on */
				progress = 1;
			} else if (errno != EAGAIN && errno != EINTR) {
				break;
			}
		}
		if (p->up_off < p->up_len) {
			size_t n = 0;
			CURLcode e = curl_easy_send(p->h, p->up + p->up_off, p->up_len - p->up_off, &n);

			if (e == CURLE_OK) {
				p->up_off += n;
				progress = progress || n;
			} else if (e != CURLE_AGAIN) {
				break;
			}
		}
		if (tls_eof && local_eof && p->down_off == p->down_len)
			break;
		if (progress)
			continue;
		/* Nothing moved: wait for what each side can do next. */
		if (p->down_off < p->down_len)
			pf[0].events |= POLLOUT;
		if (!local_eof && p->up_off == p->up_len)
			pf[0].events |= POLLIN;
		if (!tls_eof && p->down_off == p->down_len)
			pf[1].events |= POLLIN;
		if (p->up_off < p->up_len)
			pf[1].events |= POLLOUT;
		if (poll(pf, 2, 60000) < 0 && errno != EINTR)
			break;
		/* Our end closed whole (not half), all it sent passed on: nobody
		 * reads on. */
		if ((pf[0].revents & POLLHUP) && local_eof && p->up_off == p->up_len)
			break;
		if (pf[0].revents & (POLLERR | POLLNVAL))
			break;
	}
	curl_easy_cleanup(p->h);
	close(p->local);
	free(p);
	return NULL;
}

static int connect_tls(const char *base, int64_t deadline_ms, char *why, size_t why_len)
{
	char errbuf[CURL_ERROR_SIZE] = "", host[256], port[8];
	struct pump *p = calloc(1, sizeof(*p));
	int64_t left = deadline_ms - clock_mono_ms();
	curl_socket_t sock = CURL_SOCKET_BAD;
	int sv[2] = { -1, -1 };
	pthread_attr_t attr;
	pthread_t t;
	CURLcode e;

	if (!p || !(p->h = curl_easy_init())) {
		free(p);
		snprintf(why, why_len, "out of memory");
		return -1;
	}
	if (split_base(base, 8, host, port) < 0) {
		snprintf(why, why_len, "the host's URL %.120s is not https://HOST:PORT", base);
		goto fail;
	}
	e = curl_easy_setopt(p->h, CURLOPT_URL, base);
	e |= curl_easy_setopt(p->h, CURLOPT_CONNECT_ONLY, 1L);
	e |= curl_easy_setopt(p->h, CURLOPT_NOSIGNAL, 1L);
	e |= curl_easy_setopt(p->h, CURLOPT_ERRORBUFFER, errbuf);
	e |= curl_easy_setopt(p->h, CURLOPT_CONNECTTIMEOUT_MS, left > 1 ? (long)left : 1L);
	e |= curl_easy_setopt(p->h, CURLOPT_TCP_NODELAY, 1L);
	if (hostclient_ca())
		e |= curl_easy_setopt(p->h, CURLOPT_CAINFO, hostclient_ca());
	if (e != CURLE_OK) {
		snprintf(why, why_len, "%.120s: cannot set up the TLS connection", base);
		goto fail;
	}
	e = curl_easy_perform(p->h);
	if (e != CURLE_OK) {
		snprintf(why, why_len, "%.120s: %s", base, errbuf[0] ? errbuf : curl_easy_strerror(e));
		goto fail;
	}
	curl_easy_setopt(p->h, CURLOPT_ERRORBUFFER, NULL); /* errbuf is this frame's */
	if (curl_easy_getinfo(p->h, CURLINFO_ACTIVESOCKET, &sock) != CURLE_OK || sock == CURL_SOCKET_BAD ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0) {
		snprintf(why, why_len, "%.120s: %s", base, strerror(errno ? errno : EIO));
		goto fail;
	}
	p->sock = sock;
	p->local = sv[1];
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 64u << 10);
	if (pthread_create(&t, &attr, pump_run, p)) {
		pthread_attr_destroy(&attr);
		snprintf(why, why_len, "%.120s: no thread for the TLS pump", base);
		close(sv[0]);
		close(sv[1]);
		goto fail;
	}
	pthread_attr_destroy(&attr);
	return sv[0];
fail:
	curl_easy_cleanup(p->h);
	free(p);
	return -1;
}

int hostclient_connect(const char *base, int64_t deadline_ms, char *why, size_t why_len)
{
	if (!strncmp(base, "https://", 8))
		return connect_tls(base, deadline_ms, why, why_len);
	if (!strncmp(base, "http://", 7))
		return connect_tcp(base, deadline_ms, why, why_len);
	snprintf(why, why_len, "the host's URL %.120s is neither http:// nor https://", base);
	return -1;
}
