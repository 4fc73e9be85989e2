/* test_apilist: kiln-host's list of kiln-api URLs (host/serve/apilist.h): the
 * flag's comma-separated form and the config's string or array, what is
 * refused, and the rotation the heartbeat makes when a replica stops
 * answering (a fake send standing for each replica). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "apilist.h"

static void test_parse(void **state)
{
	struct apilist l = { .n = 0 };
	struct kiln_err err = { .code = "" };

	/* One URL, as before: trailing slashes dropped. */
	assert_int_equal(apilist_add(&l, "http://10.0.0.1:8080/", "--api", &err), 0);
	assert_int_equal(l.n, 1);
	assert_string_equal(l.url[0], "http://10.0.0.1:8080");
	/* A list, appended to what is there; a path prefix is kept. */
	assert_int_equal(apilist_add(&l, "https://a.example//,http://b:1/kiln", "--api", &err), 0);
	assert_int_equal(l.n, 3);
	assert_string_equal(l.url[1], "https://a.example");
	assert_string_equal(l.url[2], "http://b:1/kiln");
	apilist_free(&l);
	assert_int_equal(l.n, 0);
}

static void refused(const char *s, const char *want)
{
	struct apilist l = { .n = 0 };
	struct kiln_err err = { .code = "" };

	assert_int_equal(apilist_add(&l, "http://first", "--api", &err), 0);
	assert_int_equal(apilist_add(&l, s, "--api", &err), -1);
	if (!strstr(err.message, want))
		fail_msg("'%s': got '%s', wanted '%s'", s, err.message, want);
	assert_string_equal(err.code, "usage");
	assert_int_equal(l.n, 1); /* unchanged: nothing of a refused list stays */
	apilist_free(&l);
}

static void test_refusals(void **state)
{
	char many[40 * APILIST_MAX], big[APILIST_URL_MAX + 64];

	refused("", "empty URL");
	refused("http://a,", "empty URL");
	refused(",http://a", "empty URL");
	refused("http://a,,http://b", "empty URL");
	refused("ftp://a", "expected http:// or https://");
	refused("http://a,b", "expected http:// or https://");
	refused("a.example:8080", "expected http:// or https://");
	refused("http://", "no host");
	refused("http:///", "no host");
	refused("http:///path", "no host");
	refused("http://a b", "space");
	refused("http://a\n", "control");
	refused("http://a?x=1", "'?'");
	refused("http://a#f", "'#'");
	/* At most APILIST_MAX in all: the one already there counts. */
	many[0] = 0;
	for (int i = 0; i < APILIST_MAX; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%shttp://h%d", i ? "," : "", i);
	refused(many, "at most 16");
	memset(big, 'a', sizeof(big) - 1);
	memcpy(big, "http://", 7);
	big[sizeof(big) - 1] = 0;
	refused(big, "longer than");
}

static void test_json(void **state)
{
	struct apilist l = { .n = 0 };
	struct kiln_err err = { .code = "" };
	json_t *v;

	v = json_string("http://one/");
	assert_int_equal(apilist_add_json(&l, v, "f.json: api", &err), 0);
	json_decref(v);
	v = json_pack("[s, s]", "http://two", "http://three,http://four");
	assert_int_equal(apilist_add_json(&l, v, "f.json: api", &err), 0);
	json_decref(v);
	assert_int_equal(l.n, 4);
	assert_string_equal(l.url[0], "http://one");
	assert_string_equal(l.url[3], "http://four");
	apilist_free(&l);

	const char *bad[][2] = {
		{ "[]", "non-empty array" }, { "5", "expected a URL" }, { "{}", "expected a URL" },
		{ "[\"http://a\", 1]", "array of strings" }, { "[\"http://a\", \"\"]", "empty URL" },
		{ "[\"http://a\", \"file:///x\"]", "http://" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = json_loads(bad[i][0], JSON_DECODE_ANY, NULL);
		assert_non_null(v);
		assert_int_equal(apilist_add_json(&l, v, "f.json: api", &err), -1);
		if (!strstr(err.message, bad[i][1]) || !strstr(err.message, "f.json: api"))
			fail_msg("%s: got '%s'", bad[i][0], err.message);
		assert_string_equal(err.code, "config");
		assert_int_equal(l.n, 0);
		json_decref(v);
	}
}

/* Replicas for apilist_try: what each URL answers, and the URLs sent to. */
struct fake {
	enum apilist_outcome answer[4];
	char sent[16][32];
	int nsent;
};

static enum apilist_outcome fake_send(void *ctx, const char *base)
{
	struct fake *f = ctx;
	int k = base[strlen(base) - 1] - '0'; /* "http://rK" */

	snprintf(f->sent[f->nsent++], sizeof(f->sent[0]), "%s", base);
	return f->answer[k];
}

static void test_rotation(void **state)
{
	struct apilist l = { .n = 0 };
	struct kiln_err err = { .code = "" };
	struct fake f = { .answer = { APILIST_OK, APILIST_OK, APILIST_OK } };

	assert_int_equal(apilist_add(&l, "http://r0,http://r1,http://r2", "--api", &err), 0);
	/* All answer: the first one is used, and only it. */
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_OK);
	assert_int_equal(f.nsent, 1);
	assert_string_equal(f.sent[0], "http://r0");
	/* r0 dies: the same round goes on to r1, which then stays in use. */
	f.answer[0] = APILIST_NEXT;
	f.nsent = 0;
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_OK);
	assert_int_equal(f.nsent, 2);
	assert_string_equal(f.sent[1], "http://r1");
	assert_int_equal(l.cur, 1);
	f.nsent = 0;
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_OK);
	assert_int_equal(f.nsent, 1); /* r0 is not tried again while r1 answers */
	assert_string_equal(f.sent[0], "http://r1");
	/* r0 back, r1 dies: r2, not r0 (the next in the list). */
	f.answer[0] = APILIST_OK;
	f.answer[1] = APILIST_NEXT;
	f.nsent = 0;
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_OK);
	assert_string_equal(f.sent[1], "http://r2");
	assert_int_equal(l.cur, 2);
	/* r2 dies: wraps around to r0. */
	f.answer[2] = APILIST_NEXT;
	f.nsent = 0;
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_OK);
	assert_string_equal(f.sent[1], "http://r0");
	assert_int_equal(l.cur, 0);
	/* A refusal (wrong token) is final: no other replica is tried. */
	f.answer[0] = APILIST_STOP;
	f.nsent = 0;
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_STOP);
	assert_int_equal(f.nsent, 1);
	assert_int_equal(l.cur, 0);
	/* None answers: each tried once, and the next round starts one further. */
	f.answer[0] = f.answer[1] = f.answer[2] = APILIST_NEXT;
	f.nsent = 0;
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_NEXT);
	assert_int_equal(f.nsent, 3);
	assert_string_equal(f.sent[0], "http://r0");
	assert_string_equal(f.sent[2], "http://r2");
	assert_int_equal(l.cur, 1);
	/* The copy is deep and keeps the URL in use. */
	{
		struct apilist c;

		assert_int_equal(apilist_copy(&c, &l), 0);
		assert_int_equal(c.n, 3);
		assert_int_equal(c.cur, 1);
		assert_ptr_not_equal(c.url[0], l.url[0]);
		assert_string_equal(c.url[2], "http://r2");
		apilist_free(&c);
	}
	apilist_free(&l);
	/* One URL: the single-URL behaviour of before, every round on it. */
	assert_int_equal(apilist_add(&l, "http://r0", "--api", &err), 0);
	f.answer[0] = APILIST_NEXT;
	f.nsent = 0;
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_NEXT);
	assert_int_equal(apilist_try(&l, fake_send, &f), APILIST_NEXT);
	assert_int_equal(f.nsent, 2);
	assert_int_equal(l.cur, 0);
	apilist_free(&l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_rotation),
	};

	return cmocka_run_group_tests_name("apilist", tests, NULL, NULL);
}
