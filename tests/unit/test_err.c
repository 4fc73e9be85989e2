/* test_err: lib/err.h's error table against itself and against docs/api.md:
 * distinct wire strings, statuses in 400..599, every code and status the
 * document names (its error tables, "NNN code" mentions, kiln-host's list of
 * session codes) present with that status, the two kiln-api relay
 * translations the only exceptions; and the setters (set, relay, recode). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Where kiln-api answers another status than kiln-host's (the table's) for
 * the same code: it translates its host's answer (api/sessions/sessions.c). */
static const struct {
	const char *code;
	unsigned api_status;
} relay_exceptions[] = {
	{ "host_error", 502 },  /* relay(): a host answered what it never should */
	{ "no_snapshot", 409 }, /* resume: the host's 404 */
};

static char *doc;
static size_t host_part; /* offset of "## kiln-host serve" */
static unsigned mentions;

static int setup(void **state)
{
	const char *paths[] = { "docs/api.md", "../docs/api.md", "../../docs/api.md" };
	FILE *f = NULL;
	long n;

	(void)state;
	for (size_t i = 0; i < sizeof(paths) / sizeof(*paths) && !f; i++)
		f = fopen(paths[i], "r");
	if (!f) {
		fprintf(stderr, "test_err: docs/api.md not found (run from the tree: tests/run.sh unit)\n");
		return -1;
	}
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	doc = calloc(1, (size_t)n + 1);
	if (!doc || fread(doc, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		return -1;
	}
	fclose(f);
	host_part = (size_t)(strstr(doc, "\n## kiln-host serve") ? strstr(doc, "\n## kiln-host serve") - doc : 0);
	return host_part ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	free(doc);
	return 0;
}

static int api_exception(const char *code, unsigned status)
{
	for (size_t i = 0; i < sizeof(relay_exceptions) / sizeof(*relay_exceptions); i++)
		if (!strcmp(code, relay_exceptions[i].code) && status == relay_exceptions[i].api_status)
			return 1;
	return 0;
}

/* The document says `code` answers with status at offset at. */
static void check_mention(const char *code, unsigned status, size_t at)
{
	enum kiln_errc c = kiln_err_lookup(code);
	int in_api = at < host_part;

	mentions++;
	if (c == KERR_NONE)
		fail_msg("docs/api.md (offset %zu) documents \"%s\" (%u), lib/err.h has no such code", at, code, status);
	if (kiln_err_status(c) == status)
		return;
	if (in_api && api_exception(code, status))
		return;
	fail_msg("docs/api.md (%s part, offset %zu): %u %s, lib/err.h: %u", in_api ? "kiln-api" : "kiln-host", at,
		 status, code, kiln_err_status(c));
}

/* A backticked token at p ('`' included): copied into out; its length with
 * both backticks, 0 when it is not a code-like token. */
static size_t backticked(const char *p, char *out, size_t cap)
{
	size_t n = 0;

	if (*p != '`')
		return 0;
	while (p[1 + n] && p[1 + n] != '`' && n + 1 < cap) {
		out[n] = p[1 + n];
		n++;
	}
	out[n] = '\0';
	return p[1 + n] == '`' ? n + 2 : 0;
}

static int code_like(const char *s)
{
	if (!islower((unsigned char)*s))
		return 0;
	for (; *s; s++)
		if (!islower((unsigned char)*s) && !isdigit((unsigned char)*s) && *s != '_')
			return 0;
	return 1;
}

static int status_at(const char *p, unsigned *status)
{
	if (!isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1]) || !isdigit((unsigned char)p[2]) ||
	    isdigit((unsigned char)p[3]))
		return 0;
	*status = (unsigned)((p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0'));
	return *status >= 400 && *status <= 599;
}

/* The error tables: rows "| NNN | `a`, `b` | when |". */
static void check_table_rows(void)
{
	for (const char *line = doc; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		const char *p = line, *end;
		unsigned status;
		char tok[64];

		if (*p++ != '|')
			continue;
		while (*p == ' ')
			p++;
		if (!status_at(p, &status))
			continue;
		p += 3;
		while (*p == ' ')
			p++;
		if (*p++ != '|')
			continue;
		end = strchr(p, '|');
		for (; p < end; p++) {
			size_t n = backticked(p, tok, sizeof(tok));

			if (n && code_like(tok)) {
				check_mention(tok, status, (size_t)(p - doc));
				p += n - 1;
			}
		}
	}
}

/* "`409 busy`" and "409 `busy`" (also across a line break). */
static void check_inline(void)
{
	for (const char *p = doc; *p; p++) {
		unsigned status;
		char tok[64];
		const char *q;

		if (p > doc && isalnum((unsigned char)p[-1]))
			continue;
		if (*p == '`' && status_at(p + 1, &status) && isspace((unsigned char)p[4])) {
			size_t n = 0;

			for (q = p + 5; isspace((unsigned char)*q); q++)
				;
			while (q[n] && q[n] != '`' && n + 1 < sizeof(tok)) {
				tok[n] = q[n];
				n++;
			}
			tok[n] = '\0';
			if (q[n] == '`' && code_like(tok))
				check_mention(tok, status, (size_t)(p - doc));
		} else if (status_at(p, &status) && isspace((unsigned char)p[3])) {
			for (q = p + 3; isspace((unsigned char)*q); q++)
				;
			if (backticked(q, tok, sizeof(tok)) && code_like(tok))
				check_mention(tok, status, (size_t)(p - doc));
		}
	}
}

/* kiln-host's "session codes: `a`, `b` (400), ..., other `s3_*` (502), ...". */
static void check_host_session_codes(void)
{
	const char *p = strstr(doc, "session codes:"), *end;
	char pending[24][64], tok[64];
	size_t npending = 0, seen = 0;
	unsigned status;

	assert_non_null(p);
	end = strstr(p, ".\n");
	assert_non_null(end);
	for (; p < end; p++) {
		size_t n = backticked(p, tok, sizeof(tok));

		if (n) {
			assert_true(npending < 24);
			snprintf(pending[npending++], sizeof(pending[0]), "%s", tok);
			p += n - 1;
		} else if (*p == '(' && status_at(p + 1, &status) && p[4] == ')') {
			for (size_t i = 0; i < npending; i++) {
				if (!strcmp(pending[i], "s3_*")) {
					/* every other s3_ code of the table */
					for (unsigned c = KERR_NONE + 1; c < KERR_COUNT_; c++)
						if (kiln_err_is_s3(c) && kiln_err_status(c) != 503)
							check_mention(kiln_err_name(c), status, (size_t)(p - doc));
					continue;
				}
				check_mention(pending[i], status, (size_t)(p - doc));
				seen++;
			}
			npending = 0;
		}
	}
	assert_int_equal(npending, 0);
	assert_int_equal(seen, 18);
}

static void test_table_distinct(void **state)
{
	(void)state;
	for (unsigned a = KERR_NONE + 1; a < KERR_COUNT_; a++) {
		const char *n = kiln_err_name(a);

		assert_true(code_like(n));
		assert_true(strlen(n) < sizeof(((struct kiln_err *)0)->code));
		assert_int_equal(kiln_err_lookup(n), a);
		for (unsigned b = a + 1; b < KERR_COUNT_; b++)
			if (!strcmp(n, kiln_err_name(b)))
				fail_msg("codes %u and %u share the wire string \"%s\"", a, b, n);
	}
}

static void test_table_statuses(void **state)
{
	(void)state;
	for (unsigned c = KERR_NONE + 1; c < KERR_COUNT_; c++)
		if (kiln_err_status(c) < 400 || kiln_err_status(c) > 599)
			fail_msg("%s: status %u", kiln_err_name(c), kiln_err_status(c));
	/* Where host/serve/serve.c's two tables disagreed (sessions vs tasks), the
	 * documented session statuses (docs/api.md, kiln-host "Sessions"). */
	assert_int_equal(kiln_err_status(KERR_BUSY), 409);
	assert_int_equal(kiln_err_status(KERR_TOO_LARGE), 413);
	assert_int_equal(kiln_err_status(KERR_NOT_FOUND), 404);
	assert_int_equal(kiln_err_status(KERR_S3_UNAVAILABLE), 503);
	assert_int_equal(kiln_err_status(KERR_S3_AUTH), 502);
	assert_int_equal(kiln_err_status(KERR_S3_KEY_OUTSIDE), 502);
	assert_int_equal(kiln_err_status(KERR_HOST_ERROR), 500);
	assert_int_equal(kiln_err_status(KERR_VM_ERROR), 500);
	/* Not set, or not a code: a 500 "internal", as before the table. */
	assert_int_equal(kiln_err_status(KERR_NONE), 500);
	assert_int_equal(kiln_err_status(KERR_COUNT_), 500);
	assert_string_equal(kiln_err_name(KERR_NONE), "");
	assert_string_equal(kiln_err_name((enum kiln_errc)(KERR_COUNT_ + 7)), "internal");
	assert_int_equal(kiln_err_lookup("no_such_code"), KERR_NONE);
	assert_int_equal(kiln_err_lookup(""), KERR_NONE);
	assert_int_equal(kiln_err_lookup(NULL), KERR_NONE);
	assert_true(kiln_err_is_s3(KERR_S3_NOT_FOUND));
	assert_false(kiln_err_is_s3(KERR_NO_S3));
}

static void test_documented(void **state)
{
	(void)state;
	mentions = 0;
	check_table_rows();
	check_inline();
	check_host_session_codes();
	/* The parsers found the document's codes (not a vacuous pass). */
	assert_true(mentions >= 100);
	/* Each relay exception is documented with its kiln-api status and
	 * really differs from the table (else it should leave the list). */
	for (size_t i = 0; i < sizeof(relay_exceptions) / sizeof(*relay_exceptions); i++) {
		char a[80], b[80];

		assert_int_not_equal(kiln_err_status(kiln_err_lookup(relay_exceptions[i].code)),
				     relay_exceptions[i].api_status);
		snprintf(a, sizeof(a), "`%u %s`", relay_exceptions[i].api_status, relay_exceptions[i].code);
		snprintf(b, sizeof(b), "| %u | `%s`", relay_exceptions[i].api_status, relay_exceptions[i].code);
		if (!strstr(doc, a) && !strstr(doc, b))
			fail_msg("docs/api.md does not say %u %s", relay_exceptions[i].api_status,
				 relay_exceptions[i].code);
	}
}

static void test_set_relay_recode(void **state)
{
	struct kiln_err e = { .code = "" };

	(void)state;
	assert_int_equal(e.errc, KERR_NONE);
	assert_int_equal(kiln_err_set(&e, KERR_BUSY, "the session is %s", "pausing"), -1);
	assert_int_equal(e.errc, KERR_BUSY);
	assert_string_equal(e.code, "busy");
	assert_string_equal(e.message, "the session is pausing");
	/* The message may be built from itself. */
	kiln_err_set(&e, KERR_S3_UNAVAILABLE, "saved here, not in S3: %s", e.message);
	assert_string_equal(e.code, "s3_unavailable");
	assert_string_equal(e.message, "saved here, not in S3: the session is pausing");
	/* recode keeps the message */
	assert_int_equal(kiln_err_recode(&e, KERR_INVALID_REQUEST), -1);
	assert_int_equal(e.errc, KERR_INVALID_REQUEST);
	assert_string_equal(e.code, "invalid_request");
	assert_string_equal(e.message, "saved here, not in S3: the session is pausing");
	/* relay: a known wire code, an unknown one (kept verbatim), none */
	kiln_err_relay(&e, "snapshot_corrupt", KERR_HOST_ERROR, "HTTP %d", 422);
	assert_int_equal(e.errc, KERR_SNAPSHOT_CORRUPT);
	assert_string_equal(e.code, "snapshot_corrupt");
	assert_string_equal(e.message, "HTTP 422");
	kiln_err_relay(&e, "from_a_newer_host", KERR_HOST_ERROR, "x");
	assert_int_equal(e.errc, KERR_HOST_ERROR);
	assert_string_equal(e.code, "from_a_newer_host");
	kiln_err_relay(&e, e.code, KERR_HOST_ERROR, "y");
	assert_string_equal(e.code, "from_a_newer_host");
	kiln_err_relay(&e, "", KERR_HOST_ERROR, "z");
	assert_int_equal(e.errc, KERR_HOST_ERROR);
	assert_string_equal(e.code, "host_error");
	/* NULL drops the error and still returns -1 */
	assert_int_equal(kiln_err_set(NULL, KERR_INTERNAL, "x"), -1);
	assert_int_equal(kiln_err_relay(NULL, "busy", KERR_HOST_ERROR, "x"), -1);
	assert_int_equal(kiln_err_recode(NULL, KERR_BUSY), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_distinct),
		cmocka_unit_test(test_table_statuses),
		cmocka_unit_test(test_documented),
		cmocka_unit_test(test_set_relay_recode),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
