/* test_pause_cache: unit tests for host/session/pause_cache.c in a temporary spool:
 * a session's directory is made empty for a new pause and found for a
 * resume; ids that would leave the cache make no path; drop removes a
 * session's files; prune removes files past the age limit, then whole
 * sessions, least recently written first, until the rest fit the budget,
 * never the one being paused; a cache turned off leaves nothing behind;
 * chunks are sealed (AES-256-GCM) with the pause's key: they open only with
 * that key and as the chunk they were written as, a flipped bit fails, the
 * file holds neither the bytes nor the hash in the clear; the sweep removes
 * exactly the sessions its question says are gone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
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

/* A file's whole content into out (at most cap bytes): its length. */
static size_t slurp(const char *path, char *out, size_t cap)
{
	int fd = open(path, O_RDONLY);
	ssize_t n;

	assert_true(fd >= 0);
	n = read(fd, out, cap);
	close(fd);
	assert_true(n >= 0);
	return (size_t)n;
}

/* The one regular file in dir, its path into out: 1, or the count. */
static int only_file(const char *dir, char *out, size_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && ++n == 1)
			snprintf(out, cap, "%s/%s", dir, e->d_name);
	closedir(d);
	return n;
}

static void test_seal(void **state)
{
	struct pause_cache pc;
	struct pcache_seal seal, other;
	const char *sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
	char msg[4096], back[4096], raw[8192], path[PATH_MAX * 2], hex[2 * PCACHE_KEY_LEN + 1];
	unsigned char k2[PCACHE_KEY_LEN];
	size_t n;

	for (size_t i = 0; i < sizeof(msg); i++)
		msg[i] = "customer memory "[i % 16];
	assert_int_equal(pcache_init(&pc, spool, 16, 3600), 0);
	assert_int_equal(pcache_dir(&pc, "acme", "s1", 1, seal.dir, sizeof(seal.dir)), 0);
	assert_int_equal(pcache_key_new(seal.key), 0);
	assert_int_equal(pcache_put(&seal, sha, msg, sizeof(msg)), 0);
	assert_int_equal(pcache_get(&seal, sha, back, sizeof(back)), 0);
	assert_memory_equal(back, msg, sizeof(msg));

	/* On disk: neither the bytes nor the manifest's hash in the clear. */
	assert_int_equal(only_file(seal.dir, path, sizeof(path)), 1);
	assert_null(strstr(path, sha));
	n = slurp(path, raw, sizeof(raw));
	assert_true(n > sizeof(msg));
	assert_null(memmem(raw, n, "customer memory ", 16));

	/* The key round-trips through the manifest's hex. */
	pcache_key_hex(seal.key, hex);
	assert_int_equal(strlen(hex), 64);
	assert_int_equal(pcache_key_parse(hex, k2), 0);
	assert_memory_equal(k2, seal.key, sizeof(k2));
	assert_int_equal(pcache_key_parse("00", k2), -1);
	assert_int_equal(pcache_key_parse(NULL, k2), -1);
	hex[5] = 'G';
	assert_int_equal(pcache_key_parse(hex, k2), -1);

	/* Another pause's key (the manifest replaced, or only the disk copy):
	 * nothing opens; the name it looks for is not even there. */
	other = seal;
	assert_int_equal(pcache_key_new(other.key), 0);
	assert_int_equal(pcache_get(&other, sha, back, sizeof(back)), -1);
	/* The wrong size asked for: refused, and the file goes. */
	assert_int_equal(pcache_get(&seal, sha, back, sizeof(back) - 1), -1);
	assert_int_equal(only_file(seal.dir, path, sizeof(path)), 0);

	/* A flipped bit: refused, removed. */
	assert_int_equal(pcache_put(&seal, sha, msg, sizeof(msg)), 0);
	assert_int_equal(only_file(seal.dir, path, sizeof(path)), 1);
	{
		int fd = open(path, O_RDWR);
		char c;

		assert_true(fd >= 0);
		assert_int_equal(pread(fd, &c, 1, 100), 1);
		c ^= 0x10;
		assert_int_equal(pwrite(fd, &c, 1, 100), 1);
		close(fd);
	}
	assert_int_equal(pcache_get(&seal, sha, back, sizeof(back)), -1);
	assert_false(exists(path));

	/* Sealed as one chunk, it does not open as another even when moved
	 * to that one's name (the hash is bound in). */
	{
		const char *sha2 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
		char p2[PATH_MAX * 2];

		assert_int_equal(pcache_put(&seal, sha, msg, sizeof(msg)), 0);
		assert_int_equal(only_file(seal.dir, path, sizeof(path)), 1);
		assert_int_equal(unlink(path), 0);
		assert_int_equal(pcache_put(&seal, sha2, msg, sizeof(msg)), 0);
		assert_int_equal(only_file(seal.dir, p2, sizeof(p2)), 1);
		assert_int_equal(rename(p2, path), 0);
		assert_int_equal(pcache_get(&seal, sha, back, sizeof(back)), -1);
		assert_int_equal(only_file(seal.dir, path, sizeof(path)), 0);
	}
	/* No directory: nothing kept, nothing read. */
	other.dir[0] = '\0';
	assert_int_equal(pcache_put(&other, sha, msg, sizeof(msg)), -1);
	assert_int_equal(pcache_get(&other, sha, back, sizeof(back)), -1);
}

/* The sweep's question in the test: sessions named in ctx are gone. */
static int gone_listed(void *ctx, const char *customer, const char *id)
{
	char key[160];

	snprintf(key, sizeof(key), " %s/%s ", customer, id);
	return strstr((const char *)ctx, key) != NULL;
}

static void test_sweep(void **state)
{
	struct pause_cache pc;
	char a[PATH_MAX], b[PATH_MAX], c[PATH_MAX], beta[PATH_MAX + 16];

	assert_int_equal(pcache_init(&pc, spool, 16, 3600), 0);
	assert_int_equal(pcache_dir(&pc, "acme", "a", 1, a, sizeof(a)), 0);
	assert_int_equal(pcache_dir(&pc, "acme", "b", 1, b, sizeof(b)), 0);
	assert_int_equal(pcache_dir(&pc, "beta", "c", 1, c, sizeof(c)), 0);
	put(a, "x", 10, 0);
	put(b, "x", 10, 0);
	put(c, "x", 10, 0);
	assert_int_equal(pcache_sweep(&pc, gone_listed, " acme/b  beta/c  acme/zz "), 2);
	assert_true(exists(a));
	assert_false(exists(b));
	assert_false(exists(c));
	/* The customer left with nothing has no directory either. */
	snprintf(beta, sizeof(beta), "%s/pause-cache/beta", spool);
	assert_false(exists(beta));
	assert_int_equal(pcache_sweep(&pc, gone_listed, " "), 0);
	assert_true(exists(a));
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
		cmocka_unit_test_setup_teardown(test_seal, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweep, setup, teardown),
		cmocka_unit_test_setup_teardown(test_off, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
