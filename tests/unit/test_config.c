/* test_config: kiln-host's configuration file: values land where they
 * should, typos and out-of-range values are refused naming the key, secrets
 * come from files. */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
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
		 "\"cpu_overcommit\":2.5},\"pool\":{\"size\":3},\"s3\":{\"endpoint\":\"http://127.0.0.1:1\","
		 "\"bucket\":\"b\",\"access_key\":\"a:b\",\"secret_key_file\":\"%s\"},\"retention_s\":3600}",
		 secret);
	assert_int_equal(config_load(write_file("full.json", text), &c, &err), 0);
	assert_string_equal(c.listen, "127.0.0.1:7070");
	assert_string_equal(c.token, "tok");
	assert_int_equal(c.vcpus, 2);
	assert_true(c.cpu_overcommit == 2.5);
	assert_int_equal(c.pool_size, 3);
	assert_int_equal(c.prestart, -1); /* unset: the flag default applies */
	assert_string_equal(c.s3.secret_key, "s3cr3t");
	assert_string_equal(c.s3.access_key, "a:b");
	assert_int_equal(c.retention_s, 3600);
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
	refused("{\"s3\":{\"endpoint\":\"ftp://x\",\"bucket\":\"b\"}}", "s3.endpoint");
	refused("{\"s3\":{\"bucket\":\"b\"}}", "endpoint and bucket are required");
	refused("{\"token\":\"a\",\"token_file\":\"/x\"}", "not both");
	refused("{\"token_file\":\"/nonexistent/kiln-token\"}", "cannot read");
	refused("{\"listen\":\"x\",", "bad.json:");
	refused("{\"token\":\"a\",\"token\":\"b\"}", "duplicate");
	refused("{\"network\":{\"egres\":true}}", "network.egres: unknown setting");
	refused("{\"network\":{\"egress\":1}}", "network.egress: expected true or false");
	refused("{\"network\":{\"deny\":[\"10.0.0.1/8\"]}}", "network.deny[0]");
	refused("{\"network\":{\"deny\":[\"1.2.3.0/24\",\"300.1.1.1\"]}}", "network.deny[1]");
	refused("{\"network\":{\"link_range\":\"10.200.0.0/28\"}}", "network.link_range");
	refused("{\"network\":{\"bandwidth_mbit\":-1}}", "network.bandwidth_mbit");
	refused("{\"network\":{\"dns_upstream\":\"1.2.3.4\"}}", "network.dns_upstream");
	refused("{\"network\":{\"dns_upstream\":\"1.2.3.4:0\"}}", "network.dns_upstream");
	refused("{\"network\":[]}", "network: expected an object");
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

	return hostd_request_parse(body, strlen(body), &id, &customer, &spec, err);
}

static void test_request_parse(void **state)
{
	struct kiln_err err = { .code = "" };
	const char *id, *customer;
	json_t *spec, *j;
	static const char ok[] = "{\"id\":\"t1\",\"customer\":\"c\",\"spec\":{\"argv\":[\"/bin/true\"]}}";

	j = hostd_request_parse(ok, strlen(ok), &id, &customer, &spec, &err);
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
		cmocka_unit_test(test_network),
		cmocka_unit_test(test_request_parse),
	};

	return cmocka_run_group_tests_name("config", tests, setup, teardown);
}
