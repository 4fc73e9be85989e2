/* test_pause_layers: the pieces of a delta pause that need no VM.
 * host/vm/phash.c: a later record of a page replaces an earlier one (a
 * resume loads layers in order), the table comes out sorted with one entry
 * a page, the walk's cursor finds each page and reports the table's pages
 * it passed (no longer private: they go as the base's), an empty table
 * works. host/session/pause_manifest.c: version 3 keeps its tail, depth and
 * generation; a tail that leaves no page chunk, a tail of 0, a depth past
 * PMANIFEST_DEPTH_MAX or a missing generation is refused as corrupt;
 * version 2 still parses (tail 0: no delta over it); version 4 is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pause_manifest.h"
#include "phash.h"

static uint8_t page_a[4096], page_b[4096];

static int gone_log[16], ngone;

static int note_gone(void *ctx, uint32_t pg)
{
	if (ngone < 16)
		gone_log[ngone++] = (int)pg;
	return 0;
}

static void test_phash_later_wins(void **state)
{
	struct phash t = { 0 };

	memset(page_a, 'a', sizeof(page_a));
	memset(page_b, 'b', sizeof(page_b));
	assert_int_equal(phash_add(&t, 7, phash_page(page_a)), 0);
	assert_int_equal(phash_add(&t, 3, phash_page(page_a)), 0);
	assert_int_equal(phash_add(&t, 7, phash_page(page_b)), 0); /* a delta's record of page 7 */
	assert_int_equal(phash_add(&t, 5, phash_page(page_b)), 0);
	assert_int_equal(phash_finish(&t), 0);
	assert_int_equal(t.n, 3);
	assert_int_equal(t.e[0].pg, 3);
	assert_int_equal(t.e[1].pg, 5);
	assert_int_equal(t.e[2].pg, 7);
	assert_true(t.e[2].h == phash_page(page_b));
	assert_true(phash_page(page_a) != phash_page(page_b));
	phash_free(&t);
	assert_null(t.e);
}

static void test_phash_walk(void **state)
{
	struct phash t = { 0 };
	const struct phash_ent *e;
	size_t cur = 0;
	int rc;

	for (uint32_t pg = 10; pg <= 50; pg += 10)
		assert_int_equal(phash_add(&t, pg, pg), 0);
	phash_finish(&t);
	ngone = 0;
	/* Page 20 is private now: 10 was passed (no longer private). */
	e = phash_next(&t, &cur, 20, note_gone, NULL, &rc);
	assert_int_equal(rc, 0);
	assert_non_null(e);
	assert_int_equal(e->pg, 20);
	cur++;
	/* Page 25 is new: the next entry (30) is not it, nothing passed. */
	e = phash_next(&t, &cur, 25, note_gone, NULL, &rc);
	assert_int_equal(e->pg, 30);
	/* The end: 30, 40 and 50 were never found. */
	e = phash_next(&t, &cur, UINT32_MAX, note_gone, NULL, &rc);
	assert_null(e);
	assert_int_equal(ngone, 4);
	assert_int_equal(gone_log[0], 10);
	assert_int_equal(gone_log[1], 30);
	assert_int_equal(gone_log[3], 50);
	phash_free(&t);
	/* An empty table: nothing found, nothing passed. */
	cur = 0;
	ngone = 0;
	assert_null(phash_next(&t, &cur, 5, note_gone, NULL, &rc));
	assert_int_equal(ngone, 0);
}

#define SHA "67d33f0202d1a21a5b7dfc8cca1059f161721d2615c6bba33545299241985097"
#define CH(k) "{\"key\":\"acme/sessions/s1/" k "\",\"size\":4096,\"zsize\":100,\"sha256\":\"" SHA "\"}"

static int parse(const char *extra, int version, struct pmanifest *m)
{
	char text[4096];
	struct kiln_err err = { .code = "" };

	snprintf(text, sizeof(text),
		 "{\"version\":%d,\"id\":\"s1\",\"customer\":\"acme\",\"spec\":{},\"base\":{\"sha256\":\"" SHA
		 "\",\"size\":4096},\"state\":{\"chunks\":[" CH("g1/s0") "," CH("g2/s0") "," CH("g2/s1")
		 "]},\"disk\":{\"chunks\":[" CH("g2/d0") "]}%s}",
		 version, extra);
	return pmanifest_parse(text, strlen(text), "acme", "s1", m, &err);
}

static void test_manifest_v3(void **state)
{
	struct pmanifest m;

	assert_int_equal(parse(",\"tail\":1,\"depth\":2,\"generation\":\"123-abc\"", 3, &m), 0);
	assert_int_equal(m.version, PMANIFEST_V3);
	assert_int_equal(m.tail, 1);
	assert_int_equal(m.depth, 2);
	assert_string_equal(m.generation, "123-abc");
	assert_int_equal(m.state.n, 3);
	pmanifest_free(&m);
	assert_int_equal(parse(",\"tail\":2,\"depth\":0,\"generation\":\"g\"", 3, &m), 0);
	pmanifest_free(&m);
	/* Refused: no page chunk before the devices, none of them, too deep,
	 * no generation. */
	assert_int_equal(parse(",\"tail\":3,\"depth\":0,\"generation\":\"g\"", 3, &m), -1);
	pmanifest_free(&m);
	assert_int_equal(parse(",\"tail\":0,\"depth\":0,\"generation\":\"g\"", 3, &m), -1);
	pmanifest_free(&m);
	assert_int_equal(parse(",\"tail\":1,\"depth\":65,\"generation\":\"g\"", 3, &m), -1);
	pmanifest_free(&m);
	assert_int_equal(parse(",\"tail\":1,\"depth\":1", 3, &m), -1);
	pmanifest_free(&m);
	/* Version 2 still parses, with no layers known; 4 is not read. */
	assert_int_equal(parse("", 2, &m), 0);
	assert_int_equal(m.tail, 0);
	pmanifest_free(&m);
	assert_int_equal(parse(",\"tail\":1,\"depth\":0,\"generation\":\"g\"", 4, &m), -1);
	pmanifest_free(&m);
}

/* A manifest of a later kiln (a version past 3) is refused as incompatible
 * (409: the session stays paused), naming the object and both versions; one
 * without a version is the first release's (1). A base's manifest the same. */
static void test_manifest_versions(void **state)
{
	const char *newer = "{\"version\":4,\"id\":\"s1\",\"customer\":\"acme\",\"spec\":{}}";
	const char *none = "{\"id\":\"s1\",\"customer\":\"acme\",\"spec\":{}}";
	const char *base = "{\"version\":2,\"sha256\":\"" SHA "\",\"size\":4096,\"mem\":{\"chunks\":[]}}";
	struct kiln_err err = { .code = "" };
	struct pmanifest m;
	struct pchunk_list l;

	assert_int_equal(pmanifest_parse(newer, strlen(newer), "acme", "s1", &m, &err), -1);
	assert_int_equal(err.errc, KERR_INCOMPATIBLE_SNAPSHOT);
	assert_non_null(strstr(err.message, "acme/sessions/s1/manifest.json has version 4"));
	assert_non_null(strstr(err.message, "(1 to 3)"));
	pmanifest_free(&m);
	assert_int_equal(pmanifest_parse(none, strlen(none), "acme", "s1", &m, &err), 0);
	assert_int_equal(m.version, PMANIFEST_V1);
	pmanifest_free(&m);
	assert_int_equal(pbase_parse(base, strlen(base), SHA, 4096, &l, &err), -1);
	assert_int_equal(err.errc, KERR_INCOMPATIBLE_SNAPSHOT);
	assert_non_null(strstr(err.message, "has version 2"));
}

/* A session started from a snapshot names that snapshot's chunks and its
 * own, nothing else; a snapshot's own manifest its own. */
static void test_manifest_from_snapshot(void **state)
{
	struct kiln_err err = { .code = "" };
	struct pmanifest m;
	char text[4096];
	const char *fmt = "{\"version\":2,\"id\":\"%s\",\"customer\":\"acme\",\"spec\":{},%s\"base\":{\"sha256\":"
			  "\"" SHA "\",\"size\":4096},\"state\":{\"chunks\":[{\"key\":\"%s\",\"size\":4096,"
			  "\"zsize\":100,\"sha256\":\"" SHA "\"}]},\"disk\":{\"chunks\":[{\"key\":\"%s/d\",\"size\":4096,"
			  "\"zsize\":100,\"sha256\":\"" SHA "\"}]}}";

	snprintf(text, sizeof(text), fmt, "s1", "\"from_snapshot\":\"k1\",", "acme/snapshots/k1/g/s0", "acme/snapshots/k1/g/s0");
	assert_int_equal(pmanifest_parse(text, strlen(text), "acme", "s1", &m, &err), 0);
	assert_string_equal(m.from_snapshot, "k1");
	pmanifest_free(&m);
	/* Another snapshot's, another customer's, or one named by no
	 * from_snapshot: refused. */
	snprintf(text, sizeof(text), fmt, "s1", "\"from_snapshot\":\"k1\",", "acme/snapshots/k2/g/s0", "acme/snapshots/k2/g/s0");
	assert_int_equal(pmanifest_parse(text, strlen(text), "acme", "s1", &m, &err), -1);
	pmanifest_free(&m);
	snprintf(text, sizeof(text), fmt, "s1", "\"from_snapshot\":\"k1\",", "evil/snapshots/k1/g/s0", "evil/snapshots/k1/g/s0");
	assert_int_equal(pmanifest_parse(text, strlen(text), "acme", "s1", &m, &err), -1);
	pmanifest_free(&m);
	snprintf(text, sizeof(text), fmt, "s1", "", "acme/snapshots/k1/g/s0", "acme/snapshots/k1/g/s0");
	assert_int_equal(pmanifest_parse(text, strlen(text), "acme", "s1", &m, &err), -1);
	pmanifest_free(&m);
	snprintf(text, sizeof(text), fmt, "s1", "\"from_snapshot\":\"../x\",", "acme/snapshots/../x/g/s0", "acme/snapshots/../x/g/s0");
	assert_int_equal(pmanifest_parse(text, strlen(text), "acme", "s1", &m, &err), -1);
	pmanifest_free(&m);
	snprintf(text, sizeof(text), fmt, "s1", "\"from_snapshot\":\"k1\",", "acme/snapshots/k1/../../x", "acme/snapshots/k1/../../x");
	assert_int_equal(pmanifest_parse(text, strlen(text), "acme", "s1", &m, &err), -1);
	pmanifest_free(&m);
	/* The snapshot's own manifest, read where snapshots live. */
	snprintf(text, sizeof(text), fmt, "k1", "", "acme/snapshots/k1/g/s0", "acme/snapshots/k1/g/s0");
	assert_int_equal(pmanifest_parse_at(text, strlen(text), "acme", PMANIFEST_SNAPSHOTS, "k1", &m, &err), 0);
	pmanifest_free(&m);
	assert_int_equal(pmanifest_parse_at(text, strlen(text), "acme", PMANIFEST_SESSIONS, "k1", &m, &err), -1);
	pmanifest_free(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_phash_later_wins),
		cmocka_unit_test(test_phash_walk),
		cmocka_unit_test(test_manifest_v3),
		cmocka_unit_test(test_manifest_versions),
		cmocka_unit_test(test_manifest_from_snapshot),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
