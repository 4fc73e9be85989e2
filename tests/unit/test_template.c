/* test_template: kiln-host's template store without VMs or S3: the TREF
 * parser's acceptances and refusals, the LRU choice, verification of an
 * image against its reference, installing an image, and eviction over fake
 * template directories in a temporary cache (a cold store: no snapshots),
 * never of a template in use or a built-in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "buf.h"
#include "template_builds.h"
#include "fsutil.h"
#include "template.h"

static char root[] = "/tmp/kiln-test-template.XXXXXX";

static int setup(void **state)
{
	char p[256];

	assert_non_null(mkdtemp(root));
	snprintf(p, sizeof(p), "%s/image", root);
	assert_int_equal(fs_mkdir_p(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/cache", root);
	assert_int_equal(fs_mkdir_p(p, 0755), 0);
	return 0;
}

static int teardown(void **state)
{
	fs_rmtree(root);
	return 0;
}

static void write_file(const char *path, const char *text, size_t len)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, len, f), len);
	fclose(f);
}

static int parse(const char *text, struct template_ref *t, struct kiln_err *err)
{
	return template_ref_parse(text, strlen(text), t, err);
}

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

static void test_template_ref_parse(void **state)
{
	struct kiln_err err = { .code = "" };
	struct template_ref t;
	static const struct {
		const char *text, *msg;
	} bad[] = {
		{ "{\"builtin\":true}", "template.name: required" },
		{ "{\"name\":\"Data\",\"builtin\":true}", "template.name" },
		{ "{\"name\":\"d\",\"builtin\":true,\"sha256\":\"" SHA_A "\"}", "a built-in has no sha256" },
		{ "{\"name\":\"d\",\"sha256\":\"" SHA_A "\",\"size\":1}", "template.s3_key: required" },
		{ "{\"name\":\"d\",\"sha256\":\"" SHA_A "\",\"size\":1,\"s3_key\":\"_templates/x.ext4\"}",
		  "template.s3_key: expected _templates/" SHA_A ".ext4" },
		{ "{\"name\":\"d\",\"sha256\":\"AAAA\",\"size\":1,\"s3_key\":\"k\"}", "template.sha256: expected 64" },
		{ "{\"name\":\"d\",\"sha256\":\"" SHA_A "\",\"size\":0,\"s3_key\":\"_templates/" SHA_A ".ext4\"}",
		  "template.size" },
		{ "{\"name\":\"d\",\"builtin\":true,\"uid\":5}", "template.gid: required with uid" },
		{ "{\"name\":\"d\",\"builtin\":true,\"uid\":-1,\"gid\":0}", "template.uid" },
		{ "{\"name\":\"d\",\"builtin\":true,\"env\":[\"1A=b\"]}", "template.env[0]" },
		{ "{\"name\":\"d\",\"builtin\":true,\"workdir\":\"work\"}", "template.workdir" },
		{ "{\"name\":\"d\",\"builtin\":true,\"colour\":1}", "template.colour: unknown field" },
		{ "{\"name\":\"d\",\"builtin\":null}", "template.builtin" },
		{ "{\"name\":\"d\",\"name\":\"e\",\"builtin\":true}", "duplicate" },
	};

	assert_int_equal(parse("{\"name\":\"python-data\",\"builtin\":true}", &t, &err), 0);
	assert_string_equal(t.name, "python-data");
	assert_true(t.builtin);
	assert_false(t.user_set);
	template_ref_free(&t);

	assert_int_equal(parse("{\"name\":\"data\",\"sha256\":\"" SHA_A "\",\"size\":123,\"s3_key\":\"_templates/" SHA_A
			       ".ext4\",\"env\":[\"LANG=C.UTF-8\"],\"workdir\":\"/work\",\"uid\":0,\"gid\":0}",
			       &t, &err),
			 0);
	assert_false(t.builtin);
	assert_int_equal(t.size, 123);
	assert_true(t.user_set);
	assert_int_equal(t.uid, 0);
	assert_string_equal(t.workdir, "/work");
	assert_int_equal(json_array_size(t.env), 1);
	{
		/* It round-trips (meta.json, build results). */
		json_t *j = template_ref_json(&t);
		char *s = json_dumps(j, JSON_COMPACT);
		struct template_ref b;

		assert_int_equal(parse(s, &b, &err), 0);
		assert_string_equal(b.sha256, t.sha256);
		assert_int_equal(b.uid, 0);
		assert_true(b.user_set);
		template_ref_free(&b);
		free(s);
		json_decref(j);
	}
	template_ref_free(&t);

	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		memset(&err, 0, sizeof(err));
		assert_int_equal(parse(bad[i].text, &t, &err), -1);
		if (!strstr(err.message, bad[i].msg))
			fail_msg("%s: message \"%s\" lacks \"%s\"", bad[i].text, err.message, bad[i].msg);
		assert_null(t.env);
	}
}

static void test_lru_choose(void **state)
{
	/* Oldest first, skipping what is in use and built-ins, until it fits. */
	const struct template_lru e[] = {
		{ .id = "new", .last_used_ms = 500, .bytes = 100, .evictable = 1 },
		{ .id = "oldest-in-use", .last_used_ms = 100, .bytes = 100, .in_use = 1, .evictable = 1 },
		{ .id = "builtin", .last_used_ms = 50, .bytes = 100 },
		{ .id = "old", .last_used_ms = 200, .bytes = 100, .evictable = 1 },
		{ .id = "mid", .last_used_ms = 300, .bytes = 100, .evictable = 1 },
	};
	size_t idx[5], n;

	n = template_lru_choose(e, 5, 500, 350, idx);
	assert_int_equal(n, 2);
	assert_string_equal(e[idx[0]].id, "old");
	assert_string_equal(e[idx[1]].id, "mid");
	/* Under the budget: nothing. */
	assert_int_equal(template_lru_choose(e, 5, 500, 500, idx), 0);
	/* An impossible budget: every candidate, never the others. */
	n = template_lru_choose(e, 5, 500, 0, idx);
	assert_int_equal(n, 3);
	for (size_t i = 0; i < n; i++)
		assert_true(e[idx[i]].evictable && !e[idx[i]].in_use);
}

/* A fake image, its SHA-256 and a TREF for it. */
static void make_image(const char *path, const char *content, struct template_ref *t, const char *name)
{
	char hex[65];
	uint64_t size;

	write_file(path, content, strlen(content));
	assert_int_equal(template_file_sha256(path, hex, &size), 0);
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	snprintf(t->sha256, sizeof(t->sha256), "%s", hex);
	t->size = size;
	snprintf(t->s3_key, sizeof(t->s3_key), "_templates/%s.ext4", hex);
}

static void test_verify(void **state)
{
	char p[256];
	struct template_ref t;
	struct kiln_err err = { .code = "" };

	snprintf(p, sizeof(p), "%s/img", root);
	make_image(p, "hello", &t, "v");
	assert_string_equal(t.sha256, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
	assert_int_equal(template_verify_file(p, &t, &err), 0);
	write_file(p, "hellO", 5); /* same size, other bytes */
	assert_int_equal(template_verify_file(p, &t, &err), -1);
	assert_string_equal(err.code, "invalid_image");
	assert_non_null(strstr(err.message, "sha256 mismatch"));
	write_file(p, "hello!", 6);
	assert_int_equal(template_verify_file(p, &t, &err), -1);
	assert_non_null(strstr(err.message, "6 bytes"));
	unlink(p);
}

static void set_last_used(const char *dir, time_t when)
{
	char p[512];
	struct timeval tv[2] = { { when, 0 }, { when, 0 } };

	snprintf(p, sizeof(p), "%s/last_used", dir);
	write_file(p, "", 0);
	assert_int_equal(utimes(p, tv), 0);
}

static void test_store_install_evict(void **state)
{
	char img[256], cache[256], p[512], d1[512], d2[512], d3[512];
	struct vm_config base = { .qemu = "/bin/true" };
	struct template_store_config cfg = { 0 };
	struct template_store *ts;
	struct kiln_err err = { .code = "" };
	struct template_ref a, b, c, bad;
	struct template_use use;
	json_t *list;
	static char big[400000];

	snprintf(img, sizeof(img), "%s/image", root);
	snprintf(cache, sizeof(cache), "%s/cache", root);
	snprintf(p, sizeof(p), "%s/rootfs.ext4", img);
	write_file(p, "default image", 13);
	snprintf(p, sizeof(p), "%s/rootfs-python-data.ext4", img);
	write_file(p, "python image", 12);
	snprintf(p, sizeof(p), "%s/rootfs-Bad_Name.ext4", img);
	write_file(p, "ignored", 7);
	cfg = (struct template_store_config){ .image_dir = img, .cache = cache, .base = &base, .cold = 1,
					      .snap_memory_mib = 256, .snap_vcpus = 1 };
	ts = template_store_open(&cfg, &err);
	if (!ts)
		fail_msg("template_store_open: %s", err.message);

	/* Three customer templates, installed as a build would. */
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	snprintf(p, sizeof(p), "%s/cache/new-a", root);
	big[0] = 'a';
	make_image(p, big, &a, "a");
	assert_int_equal(template_install(ts, p, &a, &err), 0);
	snprintf(p, sizeof(p), "%s/cache/new-b", root);
	big[0] = 'b';
	make_image(p, big, &b, "b");
	assert_int_equal(template_install(ts, p, &b, &err), 0);
	snprintf(p, sizeof(p), "%s/cache/new-c", root);
	big[0] = 'c';
	make_image(p, big, &c, "c");
	assert_int_equal(template_install(ts, p, &c, &err), 0);
	/* The same image again (another build of identical bytes), this time
	 * from another file system when /dev/shm is one: the file in place
	 * stays, the new one goes. */
	{
		char shm[64], fin[600];
		struct template_ref again;
		struct stat st1, st2;

		snprintf(shm, sizeof(shm), "/dev/shm/kiln-test-template-%d", (int)getpid());
		big[0] = 'a';
		make_image(shm, big, &again, "a");
		snprintf(fin, sizeof(fin), "%s/templates/%s/rootfs.ext4", cache, a.sha256);
		assert_int_equal(stat(fin, &st1), 0);
		assert_int_equal(template_install(ts, shm, &again, &err), 0);
		assert_int_equal(stat(fin, &st2), 0);
		assert_true(st1.st_ino == st2.st_ino);
		assert_int_equal(access(shm, F_OK), -1);
		template_ref_free(&again);
	}
	/* A file that is not what its reference says is refused. */
	snprintf(p, sizeof(p), "%s/cache/new-bad", root);
	make_image(p, "bad", &bad, "bad");
	bad.sha256[0] = bad.sha256[0] == '0' ? '1' : '0';
	assert_int_equal(template_install(ts, p, &bad, &err), -1);
	assert_string_equal(err.code, "invalid_image");
	unlink(p);

	snprintf(d1, sizeof(d1), "%s/templates/%s", cache, a.sha256);
	snprintf(d2, sizeof(d2), "%s/templates/%s", cache, b.sha256);
	snprintf(d3, sizeof(d3), "%s/templates/%s", cache, c.sha256);
	snprintf(p, sizeof(p), "%s/rootfs.ext4", d1);
	{
		struct stat st;

		assert_int_equal(stat(p, &st), 0);
		assert_int_equal(st.st_mode & 0777, 0444);
	}
	list = template_store_json(ts);
	assert_int_equal(json_array_size(list), 5); /* default, python-data, a, b, c */
	json_decref(list);

	/* Built-ins: the one it has, refused for the one it lacks. */
	{
		struct template_ref pd, none;

		template_ref_builtin(&pd, "python-data");
		template_ref_builtin(&none, "nope");
		assert_int_equal(template_check(ts, &pd, 0, &err), 0);
		assert_int_equal(template_check(ts, &none, 1, &err), -1);
		assert_string_equal(err.code, "no_template");
		assert_int_equal(template_acquire(ts, &none, 0, NULL, &use, &err), -1);
		assert_string_equal(err.code, "no_template");
	}
	/* Not here, no S3: refused without a trace in the store. */
	{
		struct template_ref far = a;
		char farp[600];

		memset(far.sha256, 'e', 64);
		snprintf(far.s3_key, sizeof(far.s3_key), "_templates/%s.ext4", far.sha256);
		assert_int_equal(template_check(ts, &far, 0, &err), -1);
		assert_string_equal(err.code, "no_s3");
		assert_int_equal(template_acquire(ts, &far, 0, NULL, &use, &err), -1);
		assert_string_equal(err.code, "no_s3");
		snprintf(farp, sizeof(farp), "%s/templates/%s", cache, far.sha256);
		assert_int_equal(access(farp, F_OK), -1);
	}

	/* a is oldest but in use; b next; c newest. */
	assert_int_equal(template_acquire(ts, &a, 0, NULL, &use, &err), 0);
	assert_non_null(strstr(use.rootfs, a.sha256));
	assert_null(use.snap); /* cold store */
	set_last_used(d1, 1000);
	set_last_used(d2, 2000);
	set_last_used(d3, time(NULL));
	template_store_close(ts);
	/* The budget: the three images are ~1.2 MB, fit in 1 MiB only
	 * without one of them: reopen with a budget. */
	cfg.disk_budget_mib = 1;
	ts = template_store_open(&cfg, &err);
	assert_non_null(ts);
	assert_int_equal(template_acquire(ts, &a, 0, NULL, &use, &err), 0);
	set_last_used(d1, 1000);
	assert_int_equal(template_store_gc(ts, 1), 1);
	assert_int_equal(access(d1, F_OK), 0); /* in use: stays though oldest */
	assert_int_equal(access(d2, F_OK), -1); /* least recently used of the rest */
	assert_int_equal(access(d3, F_OK), 0);
	snprintf(p, sizeof(p), "%s/rootfs.ext4", img);
	assert_int_equal(access(p, F_OK), 0); /* built-ins are never touched */
	/* Released, a is the oldest: a tighter pass takes it. */
	template_release(ts, &use);
	set_last_used(d1, 1000);
	assert_int_equal(template_store_gc(ts, 1), 0); /* fits now: nothing */
	template_store_close(ts);
	/* A new image from another file system: copied, then renamed. */
	cfg.disk_budget_mib = 0;
	ts = template_store_open(&cfg, &err);
	assert_non_null(ts);
	{
		char shm[64], fin[600];
		struct template_ref x;

		snprintf(shm, sizeof(shm), "/dev/shm/kiln-test-template-%d", (int)getpid());
		big[0] = 'x';
		make_image(shm, big, &x, "x");
		assert_int_equal(template_install(ts, shm, &x, &err), 0);
		snprintf(fin, sizeof(fin), "%s/templates/%s/rootfs.ext4", cache, x.sha256);
		assert_int_equal(template_verify_file(fin, &x, &err), 0);
		assert_int_equal(access(shm, F_OK), -1);
		template_ref_free(&x);
	}
	template_store_close(ts);
	template_ref_free(&a);
	template_ref_free(&b);
	template_ref_free(&c);
	template_ref_free(&bad);
}

static void test_snapshot_ttl(void **state)
{
	char img[256], cache[256], old[512], fresh[512], held[512], build[512], p[600];
	struct vm_config base = { .qemu = "/bin/true" };
	struct template_store_config cfg;
	struct template_store *ts;
	struct kiln_err err = { .code = "" };
	int fd;

	snprintf(img, sizeof(img), "%s/image", root);
	snprintf(cache, sizeof(cache), "%s/cache", root);
	snprintf(old, sizeof(old), "%s/snapshots/0123456789abcdef", cache);
	snprintf(fresh, sizeof(fresh), "%s/snapshots/1123456789abcdef", cache);
	snprintf(held, sizeof(held), "%s/snapshots/2123456789abcdef", cache);
	snprintf(build, sizeof(build), "%s/snapshots/.build-0123456789abcdef-1", cache);
	assert_int_equal(fs_mkdir_p(old, 0755), 0);
	assert_int_equal(fs_mkdir_p(fresh, 0755), 0);
	assert_int_equal(fs_mkdir_p(held, 0755), 0);
	assert_int_equal(fs_mkdir_p(build, 0755), 0);
	set_last_used(old, 1000);
	set_last_used(held, 1000);
	set_last_used(build, 1000);
	/* Another kiln-host uses "held": its shared lock. */
	snprintf(p, sizeof(p), "%s/last_used", held);
	fd = open(p, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_SH), 0);
	cfg = (struct template_store_config){ .image_dir = img, .cache = cache, .base = &base, .cold = 1,
					      .snapshot_ttl_s = 60 };
	ts = template_store_open(&cfg, &err);
	assert_non_null(ts);
	template_store_gc(ts, 1);
	assert_int_equal(access(old, F_OK), -1);   /* unused past the TTL: removed */
	assert_int_equal(access(fresh, F_OK), 0);  /* first seen now: its clock starts */
	snprintf(p, sizeof(p), "%s/last_used", fresh);
	assert_int_equal(access(p, F_OK), 0);
	assert_int_equal(access(held, F_OK), 0);   /* in use by another process */
	assert_int_equal(access(build, F_OK), 0);  /* a snapshot being made: not ours to judge */
	{
		/* The metrics count it. */
		struct buf b = BUF_INIT;

		template_store_metrics(ts, &b);
		assert_non_null(strstr(b.p, "kiln_host_snapshots_expired_total 1\n"));
		buf_free(&b);
	}
	template_store_close(ts);
	close(fd);
}

/* template_builds_host_mirror reads the host's apt sources as build-rootfs.sh does. */
static void test_host_mirror(void **state)
{
	char r[256], p[512], m[512];

	snprintf(r, sizeof(r), "%s/etc-root", root);
	template_builds_host_mirror(r, m, sizeof(m));
	assert_string_equal(m, "http://deb.debian.org/debian");
	snprintf(p, sizeof(p), "%s/etc/apt/sources.list.d", r);
	assert_int_equal(fs_mkdir_p(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/etc/apt/sources.list", r);
	write_file(p, "deb http://old.example/ubuntu jammy main\ndeb http://mirror.example/debian bookworm main\n", 88);
	template_builds_host_mirror(r, m, sizeof(m));
	assert_string_equal(m, "http://mirror.example/debian");
	snprintf(p, sizeof(p), "%s/etc/apt/sources.list.d/debian.sources", r);
	write_file(p, "Types: deb\nURIs: http://deb822.example/debian/\nSuites: bookworm\n", 64);
	template_builds_host_mirror(r, m, sizeof(m));
	assert_string_equal(m, "http://deb822.example/debian/");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_template_ref_parse),
		cmocka_unit_test(test_lru_choose),
		cmocka_unit_test(test_verify),
		cmocka_unit_test(test_store_install_evict),
		cmocka_unit_test(test_snapshot_ttl),
		cmocka_unit_test(test_host_mirror),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
