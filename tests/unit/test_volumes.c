/* test_volumes: what needs no VM of volumes (host/session/volume.c). The
 * session spec's "volumes": a good list parses (read_only defaults to
 * false), and each rule refuses with a message naming the field: not an
 * array, more than VOL_SLOTS, unknown keys, bad ids, paths that are
 * relative, "/", not normalised, under /proc, /sys or /dev, with control
 * characters, too long, one inside another, the same id twice, size_mib
 * out of bounds or missing, read_only not a boolean; session_parse_spec
 * accepts "volumes" beside "limits" and applies the same rules. The
 * volume manifest: a good one parses with its offsets; wrong customer or
 * id, version, size, generation, keys outside the prefix or with "..",
 * unaligned, overlapping or out-of-bounds offsets, bad hashes are refused
 * as snapshot_corrupt; vmanifest_json's output parses back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session_int.h"
#include "volume.h"

#define SHA "67d33f0202d1a21a5b7dfc8cca1059f161721d2615c6bba33545299241985097"

static int parse(const char *text, struct vol_mount *v, size_t *n, struct kiln_err *err)
{
	json_error_t je;
	json_t *j = json_loads(text, 0, &je);
	int r;

	assert_non_null(j);
	*err = (struct kiln_err){ .code = "" };
	r = vol_spec_parse(j, v, n, err);
	json_decref(j);
	return r;
}

static void test_spec_good(void **state)
{
	struct vol_mount v[VOL_SLOTS];
	struct kiln_err err;
	size_t n = 9;

	assert_int_equal(parse("[{\"id\":\"v1\",\"path\":\"/data\",\"size_mib\":64},"
			       "{\"id\":\"vol_2.x-y\",\"path\":\"/mnt/ro data\",\"read_only\":true,\"size_mib\":65536}]",
			       v, &n, &err), 0);
	assert_int_equal(n, 2);
	assert_string_equal(v[0].id, "v1");
	assert_string_equal(v[0].path, "/data");
	assert_int_equal(v[0].read_only, 0);
	assert_int_equal(v[0].size_mib, 64);
	assert_string_equal(v[1].path, "/mnt/ro data");
	assert_int_equal(v[1].read_only, 1);
	assert_int_equal(v[1].size_mib, 65536);
	assert_int_equal(parse("[]", v, &n, &err), 0);
	assert_int_equal(n, 0);
	assert_int_equal(vol_spec_parse(NULL, v, &n, &err), 0);
	assert_int_equal(n, 0);
}

static void refused(const char *text, const char *needle)
{
	struct vol_mount v[VOL_SLOTS];
	struct kiln_err err;
	size_t n;

	assert_int_equal(parse(text, v, &n, &err), -1);
	assert_int_equal(err.errc, KERR_INVALID_SPEC);
	if (!strstr(err.message, needle))
		fail_msg("%s: message \"%s\" does not name \"%s\"", text, err.message, needle);
}

static void test_spec_refused(void **state)
{
	char longp[400] = "[{\"id\":\"v\",\"size_mib\":64,\"path\":\"/";

	refused("{}", "volumes: expected an array");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":64},{\"id\":\"b\",\"path\":\"/b\",\"size_mib\":64},"
		"{\"id\":\"c\",\"path\":\"/c\",\"size_mib\":64}]", "at most 2");
	refused("[1]", "volumes[0]: expected an object");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":64,\"name\":\"x\"}]", "volumes[0].name");
	refused("[{\"path\":\"/a\",\"size_mib\":64}]", "volumes[0].id");
	refused("[{\"id\":\".a\",\"path\":\"/a\",\"size_mib\":64}]", "volumes[0].id");
	refused("[{\"id\":\"a/b\",\"path\":\"/a\",\"size_mib\":64}]", "volumes[0].id");
	refused("[{\"id\":\"a\",\"path\":\"a\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/a/\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/a//b\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/a/./b\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/a/../etc\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/proc\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/sys/x\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/dev/shm\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/a\\nb\",\"size_mib\":64}]", "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":7,\"size_mib\":64}]", "volumes[0].path");
	for (size_t i = strlen(longp); i < 300; i++)
		longp[i] = 'x';
	snprintf(longp + 300, sizeof(longp) - 300, "\"}]");
	refused(longp, "volumes[0].path");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":64},{\"id\":\"b\",\"path\":\"/a/b\",\"size_mib\":64}]",
		"volumes[1].path");
	refused("[{\"id\":\"a\",\"path\":\"/a/b\",\"size_mib\":64},{\"id\":\"b\",\"path\":\"/a\",\"size_mib\":64}]",
		"volumes[1].path");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":64},{\"id\":\"a\",\"path\":\"/b\",\"size_mib\":64}]",
		"mounted twice");
	refused("[{\"id\":\"a\",\"path\":\"/a\"}]", "volumes[0].size_mib");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":15}]", "volumes[0].size_mib");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":65537}]", "volumes[0].size_mib");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":\"64\"}]", "volumes[0].size_mib");
	refused("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":64,\"read_only\":1}]", "volumes[0].read_only");
	/* Sibling paths sharing a prefix are not nested. */
	{
		struct vol_mount v[VOL_SLOTS];
		struct kiln_err err;
		size_t n;

		assert_int_equal(parse("[{\"id\":\"a\",\"path\":\"/a\",\"size_mib\":64},"
				       "{\"id\":\"b\",\"path\":\"/ab\",\"size_mib\":64}]", v, &n, &err), 0);
		assert_int_equal(n, 2);
		assert_true(vol_path_ok("/procx"));
	}
}

static void test_session_spec(void **state)
{
	struct task_spec ts;
	struct kiln_err err = { .code = "" };
	json_error_t je;
	json_t *spec = json_loads("{\"limits\":{},\"volumes\":[{\"id\":\"v1\",\"path\":\"/data\",\"size_mib\":64}]}", 0,
				  &je);

	assert_int_equal(session_parse_spec(spec, &ts, &err), 0);
	spec_free(&ts);
	/* The caller's spec keeps its volumes (the pause manifest carries them). */
	assert_true(json_is_array(json_object_get(spec, "volumes")));
	json_decref(spec);
	spec = json_loads("{\"volumes\":[{\"id\":\"v1\",\"path\":\"/sys\",\"size_mib\":64}]}", 0, &je);
	assert_int_equal(session_parse_spec(spec, &ts, &err), -1);
	assert_int_equal(err.errc, KERR_INVALID_SPEC);
	assert_non_null(strstr(err.message, "volumes[0].path"));
	json_decref(spec);
}

static int mparse(const char *text, struct vmanifest *m)
{
	struct kiln_err err = { .code = "" };
	int r = vmanifest_parse(text, strlen(text), "acme", "v1", m, &err);

	if (r < 0)
		assert_int_equal(err.errc, KERR_SNAPSHOT_CORRUPT);
	return r;
}

/* A manifest with one chunk: key, offset and size as given. */
static char *one(const char *key, long long off, long long size, const char *extra)
{
	static char buf[2048];

	snprintf(buf, sizeof(buf),
		 "{\"version\":1,\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":64,\"generation\":\"g1\"%s,"
		 "\"chunks\":[{\"key\":\"%s\",\"offset\":%lld,\"size\":%lld,\"zsize\":100,\"sha256\":\"" SHA "\"}]}",
		 extra, key, off, size);
	return buf;
}

static void test_manifest(void **state)
{
	struct vmanifest m;
	struct pchunk_list l;
	struct pchunk c[2] = { { .key = "acme/volumes/v1/g2/d0", .size = 4096, .zsize = 10, .offset = 0, .sha256 = SHA },
			       { .key = "acme/volumes/v1/g1/d1", .size = 16 << 20, .zsize = 99, .offset = 48 << 20,
				 .sha256 = SHA } };
	char *text;
	json_t *j;

	assert_int_equal(mparse(one("acme/volumes/v1/g1/d0", 8192, 4096, ""), &m), 0);
	assert_int_equal(m.size_mib, 64);
	assert_string_equal(m.generation, "g1");
	assert_int_equal(m.chunks.n, 1);
	assert_int_equal(m.chunks.c[0].offset, 8192);
	assert_int_equal(m.chunks.total, 4096);
	vmanifest_free(&m);
	/* The last byte of the volume, and not one past it. */
	assert_int_equal(mparse(one("acme/volumes/v1/g1/d0", (64 << 20) - 4096, 4096, ""), &m), 0);
	vmanifest_free(&m);
	assert_int_equal(mparse(one("acme/volumes/v1/g1/d0", (64 << 20) - 4096, 8192, ""), &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse(one("acme/volumes/v1/g1/d0", 100, 4096, ""), &m), -1); /* unaligned */
	vmanifest_free(&m);
	assert_int_equal(mparse(one("acme/volumes/v1/g1/d0", -4096, 4096, ""), &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse(one("acme/volumes/v2/g1/d0", 0, 4096, ""), &m), -1); /* another volume's */
	vmanifest_free(&m);
	assert_int_equal(mparse(one("acme/volumes/v1/../v2/d0", 0, 4096, ""), &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse(one("acme/volumes/v1/", 0, 4096, ""), &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse(one("acme/volumes/v1/g1/d0", 0, (16 << 20) + 1, ""), &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse("{\"version\":1,\"customer\":\"acme\",\"id\":\"v2\",\"size_mib\":64,\"generation\":\"g\","
				"\"chunks\":[]}", &m), -1);
	vmanifest_free(&m);
	{
		/* A later kiln's version: incompatible (the volume left as it is),
		 * named with both versions; none at all: the first release's. */
		const char *v2 = "{\"version\":2,\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":64,"
				 "\"generation\":\"g\",\"chunks\":[]}";
		struct kiln_err err = { .code = "" };

		assert_int_equal(vmanifest_parse(v2, strlen(v2), "acme", "v1", &m, &err), -1);
		assert_int_equal(err.errc, KERR_INCOMPATIBLE_SNAPSHOT);
		assert_non_null(strstr(err.message, "acme/volumes/v1/manifest.json has version 2"));
		assert_non_null(strstr(err.message, "reads (1)"));
		vmanifest_free(&m);
	}
	assert_int_equal(mparse("{\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":64,\"generation\":\"g\","
				"\"chunks\":[]}", &m), 0);
	vmanifest_free(&m);
	assert_int_equal(mparse("{\"version\":1,\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":8,\"generation\":\"g\","
				"\"chunks\":[]}", &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse("{\"version\":1,\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":64,\"generation\":\"\","
				"\"chunks\":[]}", &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse("{\"version\":1,\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":64,\"generation\":\"g\","
				"\"chunks\":[]}", &m), 0); /* an empty volume (all holes) */
	vmanifest_free(&m);
	/* Overlapping chunks. */
	assert_int_equal(mparse("{\"version\":1,\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":64,\"generation\":\"g\","
				"\"chunks\":[{\"key\":\"acme/volumes/v1/g/d0\",\"offset\":0,\"size\":8192,\"zsize\":1,"
				"\"sha256\":\"" SHA "\"},{\"key\":\"acme/volumes/v1/g/d1\",\"offset\":4096,\"size\":4096,"
				"\"zsize\":1,\"sha256\":\"" SHA "\"}]}", &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse("{\"version\":1,\"customer\":\"acme\",\"id\":\"v1\",\"size_mib\":64,\"generation\":\"g\","
				"\"chunks\":[{\"key\":\"acme/volumes/v1/g/d0\",\"offset\":0,\"size\":8192,\"zsize\":1,"
				"\"sha256\":\"ABC\"}]}", &m), -1);
	vmanifest_free(&m);
	assert_int_equal(mparse("not json", &m), -1);
	vmanifest_free(&m);

	/* What an upload writes parses back (chunks of two generations). */
	l = (struct pchunk_list){ .c = c, .n = 2, .total = c[0].size + c[1].size };
	j = vmanifest_json("acme", "v1", 64, "g2", "host-a", &l);
	assert_non_null(j);
	text = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	assert_int_equal(mparse(text, &m), 0);
	free(text);
	assert_int_equal(m.chunks.n, 2);
	assert_int_equal(m.chunks.c[1].offset, 48 << 20);
	assert_string_equal(m.chunks.c[1].key, "acme/volumes/v1/g1/d1");
	assert_string_equal(m.generation, "g2");
	vmanifest_free(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_spec_good),
		cmocka_unit_test(test_spec_refused),
		cmocka_unit_test(test_session_spec),
		cmocka_unit_test(test_manifest),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
