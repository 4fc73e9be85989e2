/* test_config: kiln-host's configuration file: values land where they
 * should, typos and out-of-range values are refused naming the key, secrets
 * come from files. Also the shared field walker (lib/conf.h) on its own, and
 * kiln-api's file wording its errors as it always has. */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "api_config.h"
#include "conf.h"
#include "host_config.h"
#include "hostd.h"
#include "net.h"

static char dir[] = "/tmp/kiln-test-config.XXXXXX";

static const char *write_file(const char *name, const char *text)
{
	static char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return path;
}

static void test_full(void **state)
{
	struct host_config c;
	struct kiln_err err = { .code = "" };
	char secret[300], text[1024];

	snprintf(secret, sizeof(secret), "%s", write_file("secret", "s3cr3t\n"));
	snprintf(text, sizeof(text),
		 "{\"listen\":\"127.0.0.1:7070\",\"host_id\":\"h1\",\"token\":\"tok\",\"capacity\":{\"vcpus\":2,"
		 "\"cpu_overcommit\":2.5,\"memory_overcommit\":3},\"pool\":{\"size\":3},\"s3\":{\"endpoint\":\"http://127.0.0.1:1\","
		 "\"bucket\":\"b\",\"access_key\":\"a:b\",\"secret_key_file\":\"%s\"},\"retention_s\":3600}",
		 secret);
	assert_int_equal(config_load(write_file("full.json", text), &c, &err), 0);
	assert_string_equal(c.listen, "127.0.0.1:7070");
	assert_string_equal(c.token, "tok");
	assert_int_equal(c.vcpus, 2);
	assert_true(c.cpu_overcommit == 2.5);
	assert_true(c.memory_overcommit == 3);
	assert_int_equal(c.pool_size, 3);
	assert_int_equal(c.prestart, -1); /* unset: the flag default applies */
	assert_string_equal(c.s3.secret_key, "s3cr3t");
	assert_string_equal(c.s3.access_key, "a:b");
	assert_int_equal(c.retention_s, 3600);
	assert_int_equal(c.session_prepare_base, -1); /* unset: on */
	config_free(&c);
	assert_int_equal(config_load(write_file("s.json", "{\"sessions\":{\"prepare_base\":false}}"), &c, &err), 0);
	assert_int_equal(c.session_prepare_base, 0);
	config_free(&c);
}

static void refused(const char *text, const char *needle)
{
	struct host_config c;
	struct kiln_err err = { .code = "" };

	assert_int_equal(config_load(write_file("bad.json", text), &c, &err), -1);
	assert_string_equal(err.code, "config");
	if (!strstr(err.message, needle))
		fail_msg("message \"%s\" does not mention \"%s\"", err.message, needle);
}

static void test_refusals(void **state)
{
	refused("{\"tokn\":\"x\"}", "tokn: unknown setting");
	refused("{\"pool\":{\"sise\":1}}", "pool.sise: unknown setting");
	refused("{\"pool\":{\"size\":1000}}", "pool.size: expected 0..256");
	refused("{\"capacity\":{\"vcpus\":1.5}}", "capacity.vcpus: expected a number");
	refused("{\"capacity\":{\"memory_overcommit\":0.5}}", "capacity.memory_overcommit");
	refused("{\"s3\":{\"endpoint\":\"ftp://x\",\"bucket\":\"b\"}}", "s3.endpoint");
	refused("{\"s3\":{\"bucket\":\"b\"}}", "endpoint and bucket are required");
	refused("{\"token\":\"a\",\"token_file\":\"/x\"}", "not both");
	refused("{\"token_file\":\"/nonexistent/kiln-token\"}", "cannot read");
	refused("{\"listen\":\"x\",", "bad.json:");
	refused("{\"token\":\"a\",\"token\":\"b\"}", "duplicate");
	refused("{\"sessions\":{\"prepare_base\":1}}", "sessions.prepare_base: expected true or false");
	refused("{\"network\":{\"egres\":true}}", "network.egres: unknown setting");
	refused("{\"network\":{\"egress\":1}}", "network.egress: expected true or false");
	refused("{\"network\":{\"deny\":[\"10.0.0.1/8\"]}}", "network.deny[0]");
	refused("{\"network\":{\"deny\":[\"1.2.3.0/24\",\"300.1.1.1\"]}}", "network.deny[1]");
	refused("{\"network\":{\"link_range\":\"10.200.0.0/28\"}}", "network.link_range");
	refused("{\"network\":{\"bandwidth_mbit\":-1}}", "network.bandwidth_mbit");
	refused("{\"network\":{\"dns_upstream\":\"1.2.3.4\"}}", "network.dns_upstream");
	refused("{\"network\":{\"dns_upstream\":\"1.2.3.4:0\"}}", "network.dns_upstream");
	refused("{\"network\":[]}", "network: expected an object");
	refused("{\"api\":[]}", "api: expected a URL or a non-empty array");
	refused("{\"api\":\"ftp://x\"}", "api: expected http://");
	refused("{\"api\":[\"http://a\",\"http://b,\"]}", "api: an empty URL");
	refused("{\"destinations\":{\"allow\":[]}}", "destinations.allow: unknown setting");
	refused("{\"destinations\":{\"allow_addresses\":\"10.0.0.0/8\"}}", "destinations.allow_addresses: expected an array");
	refused("{\"destinations\":{\"allow_addresses\":[\"10.0.0.0/8\",\"minio\"]}}",
		"destinations.allow_addresses[1]: \"minio\": expected an IPv4 or IPv6 address");
}

/* The operator's exceptions for customers' destinations (lib/netaddr.h). */
static void test_dest_allow(void **state)
{
	struct host_config c;
	struct kiln_err err = { .code = "" };
	struct netaddr a = { .family = AF_INET, .a = { 10, 0, 5, 20 } };

	assert_int_equal(config_load(write_file("d.json", "{}"), &c, &err), 0);
	assert_int_equal(c.dest_allow.n, 0);
	config_free(&c);
	assert_int_equal(config_load(write_file("d.json", "{\"destinations\":{\"allow_addresses\":"
							  "[\"10.0.5.20:9000\",\"[fd00::/8]:443\"]}}"),
				     &c, &err),
			 0);
	assert_int_equal(c.dest_allow.n, 2);
	assert_true(netaddr_allowed(&c.dest_allow, &a, 9000));
	assert_false(netaddr_allowed(&c.dest_allow, &a, 9001));
	config_free(&c);
}

/* "api": one URL as before, or a list (an array, or commas in a string). */
static void test_api_urls(void **state)
{
	struct host_config c;
	struct kiln_err err = { .code = "" };

	assert_int_equal(config_load(write_file("api1.json", "{\"api\":\"http://lb:8080/\"}"), &c, &err), 0);
	assert_int_equal(c.api.n, 1);
	assert_string_equal(c.api.url[0], "http://lb:8080");
	config_free(&c);
	assert_int_equal(config_load(write_file("api3.json", "{\"api\":[\"http://a:1\",\"http://b:2,http://c:3\"]}"),
				     &c, &err), 0);
	assert_int_equal(c.api.n, 3);
	assert_string_equal(c.api.url[2], "http://c:3");
	config_free(&c);
	assert_int_equal(config_load(write_file("api0.json", "{}"), &c, &err), 0);
	assert_int_equal(c.api.n, 0);
	config_free(&c);
}

/* The network section: values land, defaults fill the rest, the built-in
 * deny ranges are always there. */
static void test_network(void **state)
{
	struct host_config c;
	struct kiln_err err = { .code = "" };
	struct net_host h;
	struct net_range r;
	int found_meta = 0, found_extra = 0;

	assert_int_equal(config_load(write_file("net.json", "{\"network\":{\"egress\":true,\"deny\":[\"203.0.113.0/24\"],"
							   "\"bandwidth_mbit\":8,\"dns_upstream\":\"192.0.2.53:5353\","
							   "\"link_range\":\"10.201.0.0/16\"}}"),
					 &c, &err),
			 0);
	assert_non_null(c.network);
	assert_int_equal(net_config_check(c.network, &h, &err), 0);
	assert_int_equal(h.enabled, 1);
	assert_int_equal(h.bandwidth_bytes_s, 1000000);
	assert_int_equal(ntohs(h.dns_upstream.sin_port), 5353);
	assert_int_equal(h.link.addr, 0x0ac90000u);
	assert_int_equal(h.link.prefix, 16);
	for (size_t i = 0; i < h.ndeny; i++) {
		found_meta |= h.deny[i].addr == 0xa9fe0000u && h.deny[i].prefix == 16;
		found_extra |= h.deny[i].addr == 0xcb007100u && h.deny[i].prefix == 24;
	}
	assert_true(found_meta && found_extra);
	config_free(&c);

	assert_int_equal(net_range_parse("10.0.0.0/8", &r), 0);
	assert_int_equal(r.addr, 0x0a000000u);
	assert_int_equal(net_range_parse("192.0.2.7", &r), 0);
	assert_int_equal(r.prefix, 32);
	assert_int_equal(net_range_parse("0.0.0.0/0", &r), 0);
	assert_int_equal(net_range_parse("10.0.0.1/8", &r), -1);   /* host bits */
	assert_int_equal(net_range_parse("010.0.0.0/8", &r), -1);  /* leading zero */
	assert_int_equal(net_range_parse("10.0.0/8", &r), -1);
	assert_int_equal(net_range_parse("10.0.0.0/33", &r), -1);
	assert_int_equal(net_range_parse("10.0.0.0/08", &r), -1);
	assert_int_equal(net_range_parse("10.0.0.0/", &r), -1);
	assert_int_equal(net_range_parse("1.2.3.4 ", &r), -1);
	assert_int_equal(net_range_parse("1.2.3.1000", &r), -1);
}

static json_t *parse(const char *body, struct kiln_err *err)
{
	const char *id, *customer;
	json_t *spec;

	return hostd_request_parse(body, strlen(body), &id, &customer, &spec, NULL, err);
}

static void test_request_parse(void **state)
{
	struct kiln_err err = { .code = "" };
	const char *id, *customer;
	json_t *spec, *j;
	static const char ok[] = "{\"id\":\"t1\",\"customer\":\"c\",\"spec\":{\"argv\":[\"/bin/true\"]}}";

	j = hostd_request_parse(ok, strlen(ok), &id, &customer, &spec, NULL, &err);
	assert_non_null(j);
	assert_string_equal(id, "t1");
	assert_string_equal(customer, "c");
	assert_true(json_is_object(spec));
	json_decref(j);
	assert_null(parse("{\"id\":\"t1\",\"spec\":{}}", &err));
	assert_string_equal(err.message, "customer: required");
	assert_null(parse("{\"id\":\"t\",\"customer\":\"c\",\"spec\":{},\"x\":1}", &err));
	assert_string_equal(err.message, "x: unknown field");
	assert_null(parse("{\"id\":", &err));
	assert_string_equal(err.code, "invalid_json");
}

/* ---- lib/conf: the walker itself ---- */

#pragma GCC diagnostic ignored "-Wmissing-field-initializers" /* tables leave min/max unset for strings */

struct walked {
	const char *s;
	uint32_t u32;
	uint64_t u64;
	int i, b;
	double d;
	json_t *o;
};

static int walk(const char *text, unsigned flags, struct walked *w, struct kiln_err *err)
{
	const struct conf_field f[] = {
		{ "s", CONF_STR, &w->s }, { "u32", CONF_U32, &w->u32, 1, 4294967295.0 },
		{ "small", CONF_U32, &w->u32, 10, 20 }, { "u64", CONF_U64, &w->u64, 0, 9223372036854775807.0 },
		{ "i", CONF_INT, &w->i, -5, 5 }, { "d", CONF_DOUBLE, &w->d, 0.5, 2 }, { "b", CONF_BOOL, &w->b },
		{ "o", CONF_OBJ, &w->o }, { 0 },
	};
	json_t *j = json_loads(text, 0, NULL);
	int r;

	assert_non_null(j);
	memset(w, 0, sizeof(*w));
	r = conf_take(j, "sec", f, "f.json", flags, err);
	json_decref(j); /* strings and objects are only looked at while j lives */
	return r;
}

static void walk_refused(const char *text, unsigned flags, const char *message)
{
	struct walked w;
	struct kiln_err err = { .code = "" };

	assert_int_equal(walk(text, flags, &w, &err), -1);
	assert_string_equal(err.code, "config");
	assert_string_equal(err.message, message);
}

static void test_conf_values(void **state)
{
	struct walked w;
	struct kiln_err err = { .code = "" };

	assert_int_equal(walk("{\"u32\":4294967295,\"u64\":9007199254740993,\"i\":-5,\"d\":2,\"b\":true}", 0, &w, &err), 0);
	assert_true(w.u32 == 4294967295u);
	assert_true(w.u64 == 9007199254740993ull); /* past 2^53: every bit kept */
	assert_int_equal(w.i, -5);
	assert_true(w.d == 2.0);
	assert_int_equal(w.b, 1);
	assert_int_equal(walk("{\"small\":10,\"d\":0.5,\"b\":false,\"i\":5}", 0, &w, &err), 0);
	assert_int_equal(w.u32, 10);
	assert_true(w.d == 0.5);
	assert_int_equal(w.b, 0);
	assert_int_equal(w.i, 5);
	/* An empty object stores nothing; a number field takes an integer
	 * for a double. */
	assert_int_equal(walk("{}", 0, &w, &err), 0);
	assert_int_equal(walk("{\"d\":1}", 0, &w, &err), 0);
	assert_true(w.d == 1.0);
}

/* u32 and u64: 2^32 overflows one, not the other. */
static void test_conf_overflow(void **state)
{
	struct walked w;
	struct kiln_err err = { .code = "" };

	walk_refused("{\"u32\":4294967296}", 0, "f.json: sec.u32: expected 1..4.29497e+09");
	walk_refused("{\"u32\":4294967296}", CONF_INT_ONE_MESSAGE, "f.json: sec.u32: expected an integer 1..4.29497e+09");
	assert_int_equal(walk("{\"u64\":4294967296}", 0, &w, &err), 0);
	assert_true(w.u64 == 4294967296ull);
	walk_refused("{\"u64\":-1}", 0, "f.json: sec.u64: expected 0..9.22337e+18");
	walk_refused("{\"u32\":-1}", 0, "f.json: sec.u32: expected 1..4.29497e+09");
}

static void test_conf_bounds(void **state)
{
	walk_refused("{\"small\":9}", 0, "f.json: sec.small: expected 10..20");
	walk_refused("{\"small\":21}", 0, "f.json: sec.small: expected 10..20");
	walk_refused("{\"small\":21}", CONF_INT_ONE_MESSAGE, "f.json: sec.small: expected an integer 10..20");
	walk_refused("{\"i\":-6}", 0, "f.json: sec.i: expected -5..5");
	walk_refused("{\"d\":0.4}", 0, "f.json: sec.d: expected 0.5..2");
	walk_refused("{\"d\":2.01}", 0, "f.json: sec.d: expected 0.5..2");
}

static void test_conf_types(void **state)
{
	walk_refused("{\"s\":\"\"}", 0, "f.json: sec.s: expected a non-empty string");
	walk_refused("{\"s\":1}", 0, "f.json: sec.s: expected a non-empty string");
	walk_refused("{\"small\":15.5}", 0, "f.json: sec.small: expected a number");
	walk_refused("{\"small\":\"15\"}", 0, "f.json: sec.small: expected a number");
	walk_refused("{\"small\":\"15\"}", CONF_INT_ONE_MESSAGE, "f.json: sec.small: expected an integer 10..20");
	walk_refused("{\"u64\":true}", 0, "f.json: sec.u64: expected a number");
	walk_refused("{\"i\":null}", 0, "f.json: sec.i: expected a number");
	walk_refused("{\"d\":\"1\"}", 0, "f.json: sec.d: expected a number");
	walk_refused("{\"b\":1}", 0, "f.json: sec.b: expected true or false");
	walk_refused("{\"b\":\"true\"}", 0, "f.json: sec.b: expected true or false");
}

static void test_conf_unknown_and_objects(void **state)
{
	const struct conf_field none[] = { { 0 } };
	struct kiln_err err = { .code = "" };
	json_t *j = json_loads("[1]", 0, NULL), *o = json_loads("{\"x\":1}", 0, NULL);
	struct walked w;

	walk_refused("{\"s\":\"a\",\"typo\":1}", 0, "f.json: sec.typo: unknown setting");
	walk_refused("{\"S\":\"a\"}", 0, "f.json: sec.S: unknown setting"); /* keys are case-sensitive */
	/* Not an object: named by where; at the top, "(top)" or nothing. */
	assert_int_equal(conf_take(j, "sec", none, "f.json", 0, &err), -1);
	assert_string_equal(err.message, "f.json: sec: expected an object");
	assert_int_equal(conf_take(j, "", none, "f.json", CONF_TOP_NAMED, &err), -1);
	assert_string_equal(err.message, "f.json: (top): expected an object");
	assert_int_equal(conf_take(j, "", none, "f.json", 0, &err), -1);
	assert_string_equal(err.message, "f.json: : expected an object");
	/* At the top, keys have no dot. */
	assert_int_equal(conf_take(o, "", none, "f.json", 0, &err), -1);
	assert_string_equal(err.message, "f.json: x: unknown setting");
	/* An object field takes any value, left to a nested walk. */
	assert_int_equal(walk("{\"o\":[1,2]}", 0, &w, &err), 0);
	json_decref(j);
	json_decref(o);
}

/* kiln-api's file: the same walker, its own wording. */
static void api_refused(const char *text, const char *message)
{
	struct api_config c;
	struct kiln_err err = { .code = "" };
	char want[512];

	assert_int_equal(api_config_load(write_file("api.json", text), &c, &err), -1);
	assert_string_equal(err.code, "config");
	snprintf(want, sizeof(want), "%s/api.json: %s", dir, message);
	assert_string_equal(err.message, want);
}

static void test_api_config(void **state)
{
	struct api_config c;
	struct kiln_err err = { .code = "" };

	assert_int_equal(api_config_load(write_file("api.json", "{\"max_body_mib\":128,\"listen\":\"127.0.0.1:1\","
							       "\"s3\":{\"endpoint\":\"http://x\",\"bucket\":\"b\","
							       "\"access_key\":\"a\",\"secret_key\":\"s\"}}"),
					 &c, &err),
			 0);
	assert_int_equal(c.max_body_mib, 128);
	assert_int_equal(c.presign_expiry_s, 3600); /* the default stays */
	assert_string_equal(c.listen, "127.0.0.1:1");
	assert_string_equal(c.s3.region, "us-east-1");
	api_config_free(&c);
	api_refused("[]", "(top): expected an object");
	api_refused("{\"max_body_mib\":129}", "max_body_mib: expected an integer 1..128");
	api_refused("{\"max_body_mib\":\"1\"}", "max_body_mib: expected an integer 1..128");
	api_refused("{\"max_connections\":15}", "max_connections: expected an integer 16..65536");
	api_refused("{\"lsten\":\"x\"}", "lsten: unknown setting");
	api_refused("{\"db\":\"\"}", "db: expected a non-empty string");
	api_refused("{\"s3\":{\"bucket\":\"b\",\"x\":1}}", "s3.x: unknown setting");
	api_refused("{\"s3\":3}", "s3: expected an object");
	api_refused("{\"destinations\":{\"key_file\":\"/x\",\"allow_addresses\":[\"localhost:9000\"]}}",
		    "destinations.allow_addresses[0]: \"localhost:9000\": expected an IPv4 or IPv6 address");
	api_refused("{\"destinations\":{\"key_file\":\"/x\",\"allow_addresses\":[\"127.0.0.1:0\"]}}",
		    "destinations.allow_addresses[0]: \"127.0.0.1:0\": the port: 1-65535");
	{
		char text[600];

		write_file("dest.key", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n");
		snprintf(text, sizeof(text),
			 "{\"destinations\":{\"key_file\":\"%s/dest.key\",\"allow_addresses\":[\"127.0.0.1:8780\"]}}",
			 dir);
		assert_int_equal(api_config_load(write_file("api.json", text), &c, &err), 0);
		assert_int_equal(c.dest_allow.n, 1);
		assert_int_equal(c.dest_allow.r[0].port, 8780);
		api_config_free(&c);
	}
	/* public_url starts the links kiln-api signs: a base to append a path to */
	assert_int_equal(api_config_load(write_file("api.json", "{\"public_url\":\"https://kiln.example.com:8443/k\"}"),
					 &c, &err),
			 0);
	assert_string_equal(c.public_url, "https://kiln.example.com:8443/k");
	api_config_free(&c);
#define PUBLIC_URL_WANT "public_url: expected an http:// or https:// URL of at most 255 characters, without a query, fragment or trailing / "
	api_refused("{\"public_url\":\"https://k.example/?x=1\"}", PUBLIC_URL_WANT "(got \"https://k.example/?x=1\")");
	api_refused("{\"public_url\":\"https://k.example#f\"}", PUBLIC_URL_WANT "(got \"https://k.example#f\")");
	api_refused("{\"public_url\":\"https://k.example/\"}", PUBLIC_URL_WANT "(got \"https://k.example/\")");
	api_refused("{\"public_url\":\"k.example\"}", PUBLIC_URL_WANT "(got \"k.example\")");
	{ /* 256 characters: one too many */
		char text[400], want[400], url[257];

		memset(url, 'a', 256);
		memcpy(url, "https://", 8);
		url[256] = '\0';
		snprintf(text, sizeof(text), "{\"public_url\":\"%s\"}", url);
		snprintf(want, sizeof(want), PUBLIC_URL_WANT "(got \"%s\")", url);
		api_refused(text, want);
	}
#undef PUBLIC_URL_WANT
}

static int setup(void **state)
{
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_dest_allow),
		cmocka_unit_test(test_api_urls),
		cmocka_unit_test(test_network),
		cmocka_unit_test(test_request_parse),
		cmocka_unit_test(test_conf_values),
		cmocka_unit_test(test_conf_overflow),
		cmocka_unit_test(test_conf_bounds),
		cmocka_unit_test(test_conf_types),
		cmocka_unit_test(test_conf_unknown_and_objects),
		cmocka_unit_test(test_api_config),
	};

	return cmocka_run_group_tests_name("config", tests, setup, teardown);
}
