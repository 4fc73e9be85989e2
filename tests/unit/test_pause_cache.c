/* test_pause_cache: unit tests for host/pause_cache.c in a temporary spool:
 * a session's directory is made empty for a new pause and found for a
 * resume; ids that would leave the cache make no path; drop removes a
 * session's files; prune removes files past the age limit, then whole
 * sessions, least recently written first, until the rest fit the budget,
 * never the one being paused; a cache turned off leaves nothing behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "pause_cache.h"

static char spool[PATH_MAX];

static int setup(void **state)
{
	snprintf(spool, sizeof(spool), "/tmp/test-pause-cache.XXXXXX");
	return mkdtemp(spool) ? 0 : -1;
}

static int teardown(void **state)
{
	return fs_rmtree(spool);
}

/* A file of n bytes in dir, written ago_s seconds ago. */
static void put(const char *dir, const char *name, size_t n, int ago_s)
{
	char path[PATH_MAX * 2];
	char *b = calloc(1, n ? n : 1);
	struct timespec t[2];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, b, n), (ssize_t)n);
	close(fd);
	free(b);
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= ago_s;
	t[1] = t[0];
	assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

static int exists(const char *path)
{
	return access(path, F_OK) == 0;
}

static void test_dirs(void **state)
{
	struct pause_cache pc;
	char d[PATH_MAX], again[PATH_MAX], f[PATH_MAX * 2];

	assert_int_equal(pcache_init(&pc, spool, 16, 3600), 0);
	/* Not there yet: a resume finds nothing. */
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 0, d, sizeof(d)), -1);
	assert_string_equal(d, "");
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 1, d, sizeof(d)), 0);
	put(d, "aa", 10, 0);
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 0, again, sizeof(again)), 0);
	assert_string_equal(again, d);
	/* A new pause starts from an empty directory. */
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 1, again, sizeof(again)), 0);
	snprintf(f, sizeof(f), "%s/aa", d);
	assert_false(exists(f));
	/* Ids that would leave the cache make no path. */
	assert_int_equal(pcache_dir(&pc, "..", "s1", 1, d, sizeof(d)), -1);
	assert_int_equal(pcache_dir(&pc, "acme", "a/b", 1, d, sizeof(d)), -1);
	assert_int_equal(pcache_dir(&pc, "acme", ".x", 0, d, sizeof(d)), -1);
	assert_string_equal(d, "");
	/* Drop. */
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 0, d, sizeof(d)), 0);
	pcache_drop(&pc, "acme", "s1");
	assert_false(exists(d));
}

static void test_prune(void **state)
{
	struct pause_cache pc;
	char a[PATH_MAX], b[PATH_MAX], c[PATH_MAX], old[PATH_MAX], f[PATH_MAX * 2];

	assert_int_equal(pcache_init(&pc, spool, 1, 600), 0); /* 1 MiB, 10 minutes */
	assert_int_equal(pcache_dir(&pc, "acme", "a", 1, a, sizeof(a)), 0);
	assert_int_equal(pcache_dir(&pc, "acme", "b", 1, b, sizeof(b)), 0);
	assert_int_equal(pcache_dir(&pc, "beta", "c", 1, c, sizeof(c)), 0);
	assert_int_equal(pcache_dir(&pc, "beta", "old", 1, old, sizeof(old)), 0);
	put(a, "a1", 400 << 10, 300); /* the least recently written */
	put(b, "b1", 400 << 10, 200);
	put(c, "c1", 400 << 10, 100);
	put(old, "o1", 10, 700);      /* past the age limit */
	put(b, "b0", 10, 700);        /* one file of b too */
	/* 1.2 MiB over a 1 MiB budget: the oldest session goes, unless it is
	 * the one being paused, then the next oldest. */
	pcache_prune(&pc, "acme", "a");
	assert_false(exists(old));
	snprintf(f, sizeof(f), "%s/b0", b);
	assert_false(exists(f));
	assert_true(exists(a));
	assert_false(exists(b));
	assert_true(exists(c));
	pcache_prune(&pc, NULL, NULL); /* within budget now: nothing more goes */
	assert_true(exists(a));
	assert_true(exists(c));
	put(c, "c2", 400 << 10, 0);
	pcache_prune(&pc, NULL, NULL); /* 1.2 MiB again: a (older) goes */
	assert_false(exists(a));
	assert_true(exists(c));
}

static void test_off(void **state)
{
	struct pause_cache pc;
	char d[PATH_MAX], root[PATH_MAX + 16];

	assert_int_equal(pcache_init(&pc, spool, 16, 3600), 0);
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 1, d, sizeof(d)), 0);
	put(d, "aa", 10, 0);
	/* Turned off: what an earlier run kept goes, and nothing is kept. */
	assert_int_equal(pcache_init(&pc, spool, 0, 3600), 0);
	snprintf(root, sizeof(root), "%s/pause-cache", spool);
	assert_false(exists(root));
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 1, d, sizeof(d)), -1);
	pcache_drop(&pc, "acme", "s1");
	pcache_prune(&pc, NULL, NULL);
	assert_false(exists(root));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_dirs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
		cmocka_unit_test_setup_teardown(test_off, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
