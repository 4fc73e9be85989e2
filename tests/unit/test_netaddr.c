/* test_netaddr: lib/netaddr.c, the rule for where a customer's S3
 * destination may connect: the class of each kind of address (v4, v6,
 * v4-mapped, NAT64 and 6to4 carrying a v4 one), this machine's own
 * addresses, the operator's allow-list (its syntax, ranges, ports), the
 * endpoint split, and the resolved check (names that resolve to loopback
 * refused, literals too, the allow-list admitting one port). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "netaddr.h"

static struct netaddr addr(const char *s)
{
	struct netaddr a = { 0 };

	if (inet_pton(AF_INET, s, a.a) == 1)
		a.family = AF_INET;
	else if (inet_pton(AF_INET6, s, a.a) == 1)
		a.family = AF_INET6;
	else
		fail_msg("bad test address %s", s);
	return a;
}

static void expect_class(const char *s, enum netaddr_class want)
{
	struct netaddr a = addr(s);
	enum netaddr_class got = netaddr_classify(&a);

	if (got != want)
		fail_msg("%s: classed %s, expected %s", s, netaddr_class_name(got), netaddr_class_name(want));
}

static void test_classify_v4(void **state)
{
	(void)state;
	expect_class("0.0.0.0", NETADDR_UNSPECIFIED);
	expect_class("0.1.2.3", NETADDR_UNSPECIFIED);
	expect_class("127.0.0.1", NETADDR_LOOPBACK);
	expect_class("127.255.255.254", NETADDR_LOOPBACK);
	expect_class("169.254.169.254", NETADDR_LINK_LOCAL);
	expect_class("169.254.0.1", NETADDR_LINK_LOCAL);
	expect_class("10.0.0.1", NETADDR_PRIVATE);
	expect_class("10.255.255.255", NETADDR_PRIVATE);
	expect_class("172.16.0.1", NETADDR_PRIVATE);
	expect_class("172.31.255.255", NETADDR_PRIVATE);
	expect_class("192.168.1.1", NETADDR_PRIVATE);
	expect_class("100.64.0.1", NETADDR_CGNAT);
	expect_class("100.127.255.255", NETADDR_CGNAT);
	expect_class("224.0.0.1", NETADDR_MULTICAST);
	expect_class("239.255.255.250", NETADDR_MULTICAST);
	expect_class("255.255.255.255", NETADDR_RESERVED);
	expect_class("240.0.0.1", NETADDR_RESERVED);
	expect_class("198.18.0.1", NETADDR_RESERVED);
	/* The edges of each range are public. */
	expect_class("1.1.1.1", NETADDR_PUBLIC);
	expect_class("8.8.8.8", NETADDR_PUBLIC);
	expect_class("9.255.255.255", NETADDR_PUBLIC);
	expect_class("11.0.0.0", NETADDR_PUBLIC);
	expect_class("172.15.255.255", NETADDR_PUBLIC);
	expect_class("172.32.0.0", NETADDR_PUBLIC);
	expect_class("192.167.255.255", NETADDR_PUBLIC);
	expect_class("192.169.0.0", NETADDR_PUBLIC);
	expect_class("100.63.255.255", NETADDR_PUBLIC);
	expect_class("100.128.0.0", NETADDR_PUBLIC);
	expect_class("169.253.255.255", NETADDR_PUBLIC);
	expect_class("128.0.0.1", NETADDR_PUBLIC);
	expect_class("223.255.255.255", NETADDR_PUBLIC);
	expect_class("52.216.0.1", NETADDR_PUBLIC);
}

static void test_classify_v6(void **state)
{
	(void)state;
	expect_class("::", NETADDR_UNSPECIFIED);
	expect_class("::1", NETADDR_LOOPBACK);
	expect_class("fe80::1", NETADDR_LINK_LOCAL);
	expect_class("febf:ffff::1", NETADDR_LINK_LOCAL);
	expect_class("fc00::1", NETADDR_PRIVATE);
	expect_class("fd12:3456::1", NETADDR_PRIVATE);
	expect_class("fec0::1", NETADDR_PRIVATE);
	expect_class("ff02::1", NETADDR_MULTICAST);
	expect_class("ff05::1:3", NETADDR_MULTICAST);
	expect_class("2001:4860:4860::8888", NETADDR_PUBLIC);
	expect_class("2600::1", NETADDR_PUBLIC);
	expect_class("fbff:ffff::1", NETADDR_PUBLIC);
	expect_class("fe00::1", NETADDR_PUBLIC);
	/* IPv4 written as IPv6: classed by the IPv4 address. */
	expect_class("::ffff:127.0.0.1", NETADDR_LOOPBACK);
	expect_class("::ffff:169.254.169.254", NETADDR_LINK_LOCAL);
	expect_class("::ffff:10.1.2.3", NETADDR_PRIVATE);
	expect_class("::ffff:100.64.0.1", NETADDR_CGNAT);
	expect_class("::ffff:0.0.0.0", NETADDR_UNSPECIFIED);
	expect_class("::ffff:8.8.8.8", NETADDR_PUBLIC);
	expect_class("::127.0.0.1", NETADDR_LOOPBACK);
	expect_class("64:ff9b::169.254.169.254", NETADDR_LINK_LOCAL);
	expect_class("64:ff9b::8.8.8.8", NETADDR_PUBLIC);
	expect_class("2002:7f00:1::", NETADDR_LOOPBACK);
	expect_class("2002:0a00:0001::1", NETADDR_PRIVATE);
	expect_class("2002:0808:0808::1", NETADDR_PUBLIC);
}

static void test_own(void **state)
{
	struct netaddr_own own = { .n = 1 };
	struct netaddr a = addr("203.0.113.7"), mapped = addr("::ffff:203.0.113.7"), other = addr("203.0.113.8");

	(void)state;
	own.a[0] = a;
	assert_int_equal(netaddr_check(&a, 443, NULL, NULL), NETADDR_PUBLIC);
	assert_int_equal(netaddr_check(&a, 443, NULL, &own), NETADDR_OWN);
	assert_int_equal(netaddr_check(&mapped, 443, NULL, &own), NETADDR_OWN);
	assert_int_equal(netaddr_check(&other, 443, NULL, &own), NETADDR_PUBLIC);
	/* The machine's real interfaces: loopback is among them. */
	assert_int_equal(netaddr_own_load(&own), 0);
	{
		struct netaddr lo = addr("127.0.0.1");
		int found = 0;

		for (size_t i = 0; i < own.n; i++)
			found |= own.a[i].family == AF_INET && !memcmp(own.a[i].a, lo.a, 4);
		assert_true(found);
	}
}

static void expect_entry_refused(const char *entry, const char *why)
{
	struct netaddr_allow al = { 0 };
	struct kiln_err err = { .code = "" };

	if (netaddr_allow_add(&al, entry, &err) == 0)
		fail_msg("allow-list entry accepted: %s", entry);
	assert_string_equal(err.code, "config");
	if (!strstr(err.message, why))
		fail_msg("%s: \"%s\" does not say \"%s\"", entry, err.message, why);
	assert_int_equal(al.n, 0);
}

static void test_allow(void **state)
{
	struct netaddr_allow al = { 0 };
	struct kiln_err err = { .code = "" };
	struct netaddr lo = addr("127.0.0.1"), lo2 = addr("127.0.0.2"), lo_m = addr("::ffff:127.0.0.1"),
		       ten = addr("10.9.8.7"), v6 = addr("fd00::5"), v6lo = addr("::1"), md = addr("169.254.169.254");

	(void)state;
	assert_int_equal(netaddr_allow_add(&al, "127.0.0.1:9000", &err), 0);
	assert_int_equal(netaddr_allow_add(&al, "10.0.0.0/8", &err), 0);
	assert_int_equal(netaddr_allow_add(&al, "[fd00::/8]:443", &err), 0);
	assert_int_equal(al.n, 3);
	/* One port of one address. */
	assert_true(netaddr_allowed(&al, &lo, 9000));
	assert_true(netaddr_allowed(&al, &lo_m, 9000));
	assert_false(netaddr_allowed(&al, &lo, 9001));
	assert_false(netaddr_allowed(&al, &lo2, 9000));
	assert_false(netaddr_allowed(&al, &v6lo, 9000));
	/* A range, any port. */
	assert_true(netaddr_allowed(&al, &ten, 1));
	assert_true(netaddr_allowed(&al, &v6, 443));
	assert_false(netaddr_allowed(&al, &v6, 80));
	assert_false(netaddr_allowed(&al, &md, 80));
	/* The verdict: refused classes become allowed only where listed. */
	assert_int_equal(netaddr_check(&lo, 9000, &al, NULL), NETADDR_PUBLIC);
	assert_int_equal(netaddr_check(&lo, 9001, &al, NULL), NETADDR_LOOPBACK);
	assert_int_equal(netaddr_check(&md, 80, &al, NULL), NETADDR_LINK_LOCAL);
	assert_int_equal(netaddr_check(&md, 80, NULL, NULL), NETADDR_LINK_LOCAL);
	/* More forms. */
	assert_int_equal(netaddr_allow_add(&al, "::1", &err), 0);
	assert_int_equal(netaddr_allow_add(&al, "[::1]:9000", &err), 0);
	assert_int_equal(netaddr_allow_add(&al, "192.168.0.0/16:9000", &err), 0);
	assert_int_equal(netaddr_allow_add(&al, "fd00::/8", &err), 0);
	assert_int_equal(netaddr_allow_add(&al, "::ffff:172.16.0.0/108", &err), 0);
	{
		struct netaddr p = addr("172.17.0.1");

		assert_true(netaddr_allowed(&al, &p, 5));
	}
	expect_entry_refused("", "expected an IPv4 or IPv6 address");
	expect_entry_refused("localhost", "expected an IPv4 or IPv6 address");
	expect_entry_refused("10.0.0.1/8", "bits set beyond the prefix");
	expect_entry_refused("10.0.0.0/33", "0-32");
	expect_entry_refused("fd00::/129", "0-128");
	expect_entry_refused("10.0.0.0/", "prefix length");
	expect_entry_refused("10.0.0.0/08", "prefix length");
	expect_entry_refused("127.0.0.1:0", "1-65535");
	expect_entry_refused("127.0.0.1:65536", "1-65535");
	expect_entry_refused("127.0.0.1:", "1-65535");
	expect_entry_refused("[::1", "[IPv6]:PORT");
	expect_entry_refused("[::1]9000", "[IPv6]:PORT");
	expect_entry_refused("[127.0.0.1]:80", "brackets are for IPv6");
	expect_entry_refused("1.2.3.4.5", "expected an IPv4 or IPv6 address");
	/* From the configuration's JSON. */
	{
		json_t *j = json_pack("[s, s]", "127.0.0.1:8080", "10.0.0.0/8");

		assert_int_equal(netaddr_allow_from_json(&al, j, "destinations.allow_addresses", &err), 0);
		assert_int_equal(al.n, 2);
		json_decref(j);
		j = json_pack("[s, i]", "127.0.0.1", 5);
		assert_int_equal(netaddr_allow_from_json(&al, j, "destinations.allow_addresses", &err), -1);
		assert_string_equal(err.message, "destinations.allow_addresses[1]: expected a string");
		json_decref(j);
		j = json_string("127.0.0.1");
		assert_int_equal(netaddr_allow_from_json(&al, j, "destinations.allow_addresses", &err), -1);
		json_decref(j);
		assert_int_equal(netaddr_allow_from_json(&al, NULL, "x", &err), 0);
		assert_int_equal(al.n, 0);
	}
}

static void test_endpoint_split(void **state)
{
	char host[256];
	unsigned port;

	(void)state;
	assert_int_equal(netaddr_endpoint_split("http://127.0.0.1:8080", host, sizeof(host), &port), 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 8080);
	assert_int_equal(netaddr_endpoint_split("https://s3.example.com", host, sizeof(host), &port), 0);
	assert_string_equal(host, "s3.example.com");
	assert_int_equal(port, 443);
	assert_int_equal(netaddr_endpoint_split("http://minio/", host, sizeof(host), &port), 0);
	assert_string_equal(host, "minio");
	assert_int_equal(port, 80);
	assert_int_equal(netaddr_endpoint_split("http://[::1]:9000", host, sizeof(host), &port), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 9000);
	assert_int_equal(netaddr_endpoint_split("ftp://x", host, sizeof(host), &port), -1);
	assert_int_equal(netaddr_endpoint_split("http://", host, sizeof(host), &port), -1);
	assert_int_equal(netaddr_endpoint_split("http://x:0", host, sizeof(host), &port), -1);
	assert_int_equal(netaddr_endpoint_split("http://x:80/path", host, sizeof(host), &port), -1);
	assert_int_equal(netaddr_endpoint_split("http://[::1", host, sizeof(host), &port), -1);
	assert_int_equal(netaddr_endpoint_split("http://x", host, 1, &port), -1);
}

static void expect_endpoint(const char *endpoint, const struct netaddr_allow *al, int want, const char *says)
{
	struct kiln_err err = { .code = "" };
	struct netaddr_resolved res;
	struct netaddr_own own;

	assert_int_equal(netaddr_own_load(&own), 0);
	if (netaddr_check_endpoint(endpoint, al, &own, 5000, &res, &err) != want)
		fail_msg("%s: expected %d (%s: %s)", endpoint, want, err.code, err.message);
	if (want < 0) {
		assert_string_equal(err.code, "destination_forbidden");
		if (!strstr(err.message, says))
			fail_msg("%s: \"%s\" does not say \"%s\"", endpoint, err.message, says);
	} else {
		assert_true(res.n >= 1);
	}
}

/* Resolution through the machine's resolver; localhost is in /etc/hosts
 * on every machine this runs on (no network needed). */
static void test_check_endpoint(void **state)
{
	struct netaddr_allow al = { 0 };
	struct kiln_err err = { .code = "" };

	(void)state;
	expect_endpoint("http://127.0.0.1:8080", NULL, -1, "127.0.0.1 (loopback)");
	expect_endpoint("http://localhost:8080", NULL, -1, "(loopback)");
	expect_endpoint("http://[::1]:8080", NULL, -1, "::1 (loopback)");
	expect_endpoint("http://169.254.169.254", NULL, -1, "169.254.169.254 (link-local)");
	expect_endpoint("http://10.1.2.3:9000", NULL, -1, "10.1.2.3 (private)");
	expect_endpoint("http://100.64.1.1:9000", NULL, -1, "100.64.1.1 (CGNAT)");
	expect_endpoint("http://0.0.0.0:9000", NULL, -1, "(unspecified)");
	/* Shorthand forms the resolver expands are checked as what they mean. */
	expect_endpoint("http://127.1:8080", NULL, -1, "127.0.0.1 (loopback)");
	expect_endpoint("http://2130706433:8080", NULL, -1, "127.0.0.1 (loopback)");
	/* A public literal needs no DNS and passes. */
	expect_endpoint("https://8.8.8.8", NULL, 0, NULL);
	/* The operator's exception: that address and port only. */
	assert_int_equal(netaddr_allow_add(&al, "127.0.0.1:8080", &err), 0);
	expect_endpoint("http://127.0.0.1:8080", &al, 0, NULL);
	expect_endpoint("http://127.0.0.1:8081", &al, -1, "(loopback)");
	expect_endpoint("http://10.1.2.3:8080", &al, -1, "(private)");
}

/* A lookup that has not answered in time is given up (s3_unavailable,
 * transient), and one that fails says so; either way nothing leaks
 * (the sanitizer build) and the abandoned lookup frees itself. */
static void test_check_endpoint_unresolved(void **state)
{
	struct kiln_err err = { .code = "" };
	struct netaddr_resolved res;

	(void)state;
	assert_int_equal(netaddr_check_endpoint("http://nonexistent.invalid", NULL, NULL, 1, &res, &err), -1);
	assert_string_equal(err.code, "s3_unavailable");
	assert_non_null(strstr(err.message, "nonexistent.invalid"));
	assert_int_equal(netaddr_check_endpoint("http://nonexistent.invalid", NULL, NULL, 5000, &res, &err), -1);
	assert_string_equal(err.code, "s3_unavailable");
	assert_int_equal(netaddr_check_endpoint("ftp://x", NULL, NULL, 5000, &res, &err), -1);
	assert_string_equal(err.code, "invalid_request");
}

static void test_check_connect(void **state)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(9000) };
	struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6, .sin6_port = htons(9000) };
	struct netaddr_allow al = { 0 };
	struct kiln_err err = { .code = "" };

	(void)state;
	inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
	inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6.sin6_addr);
	assert_int_equal(netaddr_check_connect((struct sockaddr *)&sin, NULL, NULL), NETADDR_LOOPBACK);
	assert_int_equal(netaddr_check_connect((struct sockaddr *)&sin6, NULL, NULL), NETADDR_LOOPBACK);
	assert_int_equal(netaddr_allow_add(&al, "127.0.0.1:9000", &err), 0);
	assert_int_equal(netaddr_check_connect((struct sockaddr *)&sin, &al, NULL), NETADDR_PUBLIC);
	assert_int_equal(netaddr_check_connect((struct sockaddr *)&sin6, &al, NULL), NETADDR_PUBLIC);
	sin.sin_port = htons(9001);
	assert_int_equal(netaddr_check_connect((struct sockaddr *)&sin, &al, NULL), NETADDR_LOOPBACK);
	inet_pton(AF_INET, "93.184.216.34", &sin.sin_addr);
	assert_int_equal(netaddr_check_connect((struct sockaddr *)&sin, NULL, NULL), NETADDR_PUBLIC);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_classify_v4),   cmocka_unit_test(test_classify_v6),
		cmocka_unit_test(test_own),           cmocka_unit_test(test_allow),
		cmocka_unit_test(test_endpoint_split), cmocka_unit_test(test_check_endpoint),
		cmocka_unit_test(test_check_endpoint_unresolved), cmocka_unit_test(test_check_connect),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
