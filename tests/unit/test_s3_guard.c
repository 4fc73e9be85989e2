/* test_s3_guard: lib/s3.c's guard for customers' destinations
 * (dest_s3_config): a refused endpoint is refused before any connection
 * (a listener on loopback counts none), the operator's allow-list admits
 * its address and port, and a connection curl would make to another
 * address than the one checked (a second DNS answer, here planted in the
 * process's shared DNS cache, as rebinding would) is refused at the socket
 * with destination_forbidden, the listener there seeing nothing. Loopback
 * only; no root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>

#include "dest.h"
#include "httpc.h"
#include "s3.h"

/* A non-blocking listener on addr (port 0: any); its port in *port. */
static int listener(const char *addr, unsigned *port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	socklen_t len = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;

	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	inet_pton(AF_INET, addr, &sin.sin_addr);
	sin.sin_port = htons((uint16_t)*port);
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, 16) < 0)
		fail_msg("cannot listen on %s:%u: %s", addr, *port, strerror(errno));
	getsockname(fd, (struct sockaddr *)&sin, &len);
	*port = ntohs(sin.sin_port);
	return fd;
}

/* Connections waiting on fd, accepted (and closed) now. */
static int accepted(int fd)
{
	int n = 0, c;

	while ((c = accept4(fd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
		close(c);
		n++;
	}
	return n;
}

static void dest_at(struct dest *d, const char *endpoint)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->endpoint, sizeof(d->endpoint), "%s", endpoint);
	snprintf(d->region, sizeof(d->region), "us-east-1");
	snprintf(d->bucket, sizeof(d->bucket), "acme-out");
	snprintf(d->access_key, sizeof(d->access_key), "AKIAEXAMPLE");
	snprintf(d->secret_key, sizeof(d->secret_key), "secret");
}

static void test_refused_before_connecting(void **state)
{
	struct kiln_err err = { .code = "" };
	struct netaddr_allow al = { 0 };
	struct s3_config c;
	struct dest d;
	unsigned port = 0;
	int fd = listener("127.0.0.1", &port);
	char ep[64], entry[32];

	(void)state;
	snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", port);
	dest_at(&d, ep);
	dest_s3_config(&d, NULL, &c);
	c.attempts = 1;
	c.timeout_s = 2;
	assert_int_equal(s3_put_buffer(&c, "k", "x", 1, NULL, &err), -1);
	assert_string_equal(err.code, "destination_forbidden");
	assert_non_null(strstr(err.message, "127.0.0.1 (loopback)"));
	assert_int_equal(accepted(fd), 0);
	/* Listed by the operator (address and port): the request is made. */
	snprintf(entry, sizeof(entry), "127.0.0.1:%u", port);
	assert_int_equal(netaddr_allow_add(&al, entry, &err), 0);
	dest_s3_config(&d, &al, &c);
	c.attempts = 1;
	c.timeout_s = 2;
	assert_int_equal(s3_put_buffer(&c, "k", "x", 1, NULL, &err), -1); /* the listener never answers */
	assert_string_not_equal(err.code, "destination_forbidden");
	assert_true(accepted(fd) >= 1);
	close(fd);
}

/* curl resolves the name itself: what it connects to must pass the same
 * rule, whatever the check before the request saw. */
static void test_second_answer_refused_at_socket(void **state)
{
	struct kiln_err err = { .code = "" };
	struct netaddr_allow al = { 0 };
	struct curl_slist *pin = NULL;
	struct httpc_limits lim = { .connect_timeout_ms = 1000, .timeout_ms = 2000 };
	struct s3_config c;
	struct dest d;
	unsigned port = 0, port2;
	int fd1 = listener("127.0.0.1", &port), fd2;
	char ep[64], entry[32], line[96], url[64];
	CURL *h;

	(void)state;
	port2 = port;
	fd2 = listener("127.0.0.2", &port2); /* the same port on another loopback address */
	/* The operator admits 127.0.0.1 on that port; "localhost" resolves
	 * there (/etc/hosts), so the check before the request passes. */
	snprintf(entry, sizeof(entry), "127.0.0.1:%u", port);
	assert_int_equal(netaddr_allow_add(&al, entry, &err), 0);
	/* A later answer for localhost, 127.0.0.2, in the shared DNS cache
	 * every kiln handle uses (lib/httpc.c). */
	snprintf(line, sizeof(line), "localhost:%u:127.0.0.2", port);
	pin = curl_slist_append(NULL, line);
	h = curl_easy_init();
	assert_non_null(h);
	snprintf(url, sizeof(url), "http://localhost:%u/", port);
	assert_int_equal(httpc_set_limits(h, &lim), CURLE_OK);
	curl_easy_setopt(h, CURLOPT_RESOLVE, pin);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_perform(h); /* reaches our listener on 127.0.0.2 and times out */
	curl_easy_cleanup(h);
	curl_slist_free_all(pin);
	assert_int_equal(accepted(fd2), 1); /* the planted answer is what curl uses */

	snprintf(ep, sizeof(ep), "http://localhost:%u", port);
	dest_at(&d, ep);
	dest_s3_config(&d, &al, &c);
	c.attempts = 1;
	c.timeout_s = 2;
	assert_int_equal(s3_put_buffer(&c, "k", "x", 1, NULL, &err), -1);
	assert_string_equal(err.code, "destination_forbidden");
	if (!strstr(err.message, "127.0.0.2 (loopback)"))
		fail_msg("message: %s", err.message);
	assert_int_equal(accepted(fd2), 0);
	assert_int_equal(accepted(fd1), 0);
	close(fd1);
	close(fd2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refused_before_connecting),
		cmocka_unit_test(test_second_answer_refused_at_socket),
	};

	s3_global_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
