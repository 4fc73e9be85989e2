/* Unit tests for the parts of the jail that need no root: the sealed memfd a
 * snapshot's RAM is handed to clones in, and removing a directory an
 * untrusted program wrote without following its links. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fsutil.h"
#include "jail.h"

static char dir[64];

static int dir_setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/kiln-unit-jail.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int dir_teardown(void **state)
{
	return fs_rmtree(dir);
}

/* A sparse file: 64 KiB of data at 1 MiB, holes elsewhere, 4 MiB long. */
static void make_sparse(const char *path)
{
	unsigned char data[65536];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (unsigned char)(i * 7 + 1);
	assert_int_equal(ftruncate(fd, 4 << 20), 0);
	assert_int_equal(pwrite(fd, data, sizeof(data), 1 << 20), (ssize_t)sizeof(data));
	close(fd);
}

static void memfd_same_contents_and_sealed(void **state)
{
	char path[128];
	struct stat st;
	struct kiln_err err = { .code = "" };
	unsigned char a[4096], b[4096], *p;
	int fd, in;

	snprintf(path, sizeof(path), "%s/mem", dir);
	make_sparse(path);
	fd = jail_sealed_memfd(path, &st, &err);
	assert_true(fd >= 0);
	assert_int_equal(st.st_size, 4 << 20);
	in = open(path, O_RDONLY);
	for (off_t off = 0; off < (4 << 20); off += sizeof(a)) {
		assert_int_equal(pread(in, a, sizeof(a), off), (ssize_t)sizeof(a));
		assert_int_equal(pread(fd, b, sizeof(b), off), (ssize_t)sizeof(b));
		assert_memory_equal(a, b, sizeof(a));
	}
	close(in);
	assert_int_equal(fcntl(fd, F_GET_SEALS) & 0xf, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
	/* Nobody changes it: not by write, truncation, hole punching or a shared mapping. */
	assert_int_equal(pwrite(fd, "x", 1, 0), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(ftruncate(fd, 0), -1);
	assert_int_equal(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 << 20, 4096), -1);
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, 0), -1);
	/* A private mapping is writable, and its writes stay private. */
	p = mmap(NULL, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	assert_true(p != MAP_FAILED);
	p[(1 << 20) + 5] ^= 0xff;
	p[3 << 20] = 0x42;
	assert_int_equal(pread(fd, b, 1, (1 << 20) + 5), 1);
	assert_int_equal(b[0], (unsigned char)(5 * 7 + 1));
	assert_int_equal(pread(fd, b, 1, 3 << 20), 1);
	assert_int_equal(b[0], 0);
	munmap(p, 4 << 20);
	/* Close-on-exec: only the jail passes it on, on purpose. */
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
}

static void memfd_refuses_non_regular(void **state)
{
	struct stat st;
	struct kiln_err err = { .code = "" };
	char path[128];

	assert_int_equal(jail_sealed_memfd(dir, &st, &err), -1);
	assert_non_null(strstr(err.message, "not a regular file"));
	snprintf(path, sizeof(path), "%s/missing", dir);
	assert_int_equal(jail_sealed_memfd(path, &st, &err), -1);
	/* A symbolic link is not followed (the path is the caller's own). */
	snprintf(path, sizeof(path), "%s/link", dir);
	assert_int_equal(symlink("/etc/hostname", path), 0);
	assert_int_equal(jail_sealed_memfd(path, &st, &err), -1);
}

static void rmtree_does_not_follow_links(void **state)
{
	char victim[128], tree[128], p[256];
	int fd;

	snprintf(victim, sizeof(victim), "%s/victim", dir);
	assert_int_equal(mkdir(victim, 0700), 0);
	snprintf(p, sizeof(p), "%s/keep", victim);
	fd = open(p, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	close(fd);
	/* What an untrusted program could leave in its directory. */
	snprintf(tree, sizeof(tree), "%s/work", dir);
	assert_int_equal(mkdir(tree, 0700), 0);
	snprintf(p, sizeof(p), "%s/a", tree);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/a/to-victim", tree);
	assert_int_equal(symlink(victim, p), 0);
	snprintf(p, sizeof(p), "%s/to-keep", tree);
	snprintf(victim + strlen(victim), sizeof(victim) - strlen(victim), "/keep");
	assert_int_equal(symlink(victim, p), 0);
	snprintf(p, sizeof(p), "%s/fifo", tree);
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_int_equal(fs_rmtree(tree), 0);
	assert_int_equal(access(tree, F_OK), -1);
	assert_int_equal(access(victim, F_OK), 0); /* .../victim/keep is still there */
	assert_int_equal(fs_rmtree(tree), 0);    /* gone already: fine */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(memfd_same_contents_and_sealed, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(memfd_refuses_non_regular, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(rmtree_does_not_follow_links, dir_setup, dir_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
