/* Unit tests for what a hostile guest's /output can cost the host: a fake
 * guest on a socketpair answers COLLECT with more entries, deeper paths and
 * names JSON cannot carry than kiln-init ever sends, and trees deeper than
 * PATH_MAX are removed completely. No VM, no root needed. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fsutil.h"
#include "proto.h"
#include "run.h"
#include "session.h"

/* ---- tree removal ---- */

static char tmpdir[64];

/* On tmpfs where there is one: ext4 hunts for an inode not recently
 * deleted on every create once a directory has seen many deletes (perf:
 * recently_deleted, half the time), which made the 101,000 files of
 * collect_default_limit_is_bounded take 15-37 s of system time and overrun
 * the host's 30 s collect deadline on a busy machine. */
static int tmp_setup(void **state)
{
	snprintf(tmpdir, sizeof(tmpdir), "%s/kiln-collect.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int tmp_teardown(void **state)
{
	char cmd[128];

	/* rm -rf itself gives up on very deep trees: fs_rmtree is what we test,
	 * this only catches leftovers of a failed run. */
	fs_rmtree(tmpdir);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* levels nested directories named name under dir, a file in each. */
static void make_deep(const char *dir, const char *name, int levels)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);

	assert_true(fd >= 0);
	for (int i = 0; i < levels; i++) {
		int f, sub;

		assert_int_equal(mkdirat(fd, name, 0755), 0);
		f = openat(fd, "file", O_WRONLY | O_CREAT | O_EXCL, 0644);
		assert_true(f >= 0);
		close(f);
		sub = openat(fd, name, O_RDONLY | O_DIRECTORY);
		assert_true(sub >= 0);
		close(fd);
		fd = sub;
	}
	close(fd);
}

static void rmtree_removes_100_levels(void **state)
{
	char top[128];
	struct stat st;

	snprintf(top, sizeof(top), "%s/t", tmpdir);
	assert_int_equal(mkdir(top, 0755), 0);
	make_deep(top, "a", 100);
	assert_int_equal(fs_rmtree(top), 0);
	assert_int_equal(lstat(top, &st), -1);
	assert_int_equal(errno, ENOENT);
}

static void rmtree_removes_beyond_path_max(void **state)
{
	char top[128], name[201];
	struct stat st;

	/* 2,100 levels of "a" (what a 4 KiB a/a/…/a path makes), then 40 levels
	 * of 200-byte names: about 12 KiB of path, three times PATH_MAX. */
	snprintf(top, sizeof(top), "%s/t", tmpdir);
	assert_int_equal(mkdir(top, 0755), 0);
	make_deep(top, "a", 2100);
	memset(name, 'n', 200);
	name[200] = '\0';
	{
		int fd = open(top, O_RDONLY | O_DIRECTORY);

		for (int i = 0; i < 2100; i++) {
			int sub = openat(fd, "a", O_RDONLY | O_DIRECTORY);

			assert_true(sub >= 0);
			close(fd);
			fd = sub;
		}
		for (int i = 0; i < 40; i++) {
			int sub;

			assert_int_equal(mkdirat(fd, name, 0700), 0);
			sub = openat(fd, name, O_RDONLY | O_DIRECTORY);
			assert_true(sub >= 0);
			close(fd);
			fd = sub;
		}
		assert_int_equal(symlinkat("/", fd, "root"), 0);
		close(fd);
	}
	assert_int_equal(fs_rmtree(top), 0);
	assert_int_equal(lstat(top, &st), -1);
	assert_int_equal(errno, ENOENT);
}

static void rmtree_never_follows_links(void **state)
{
	char top[128], outside[128], keep[160], link[160];
	struct stat st;
	int fd;

	snprintf(top, sizeof(top), "%s/t", tmpdir);
	snprintf(outside, sizeof(outside), "%s/outside", tmpdir);
	snprintf(keep, sizeof(keep), "%s/keep", outside);
	snprintf(link, sizeof(link), "%s/a/link", top);
	assert_int_equal(mkdir(outside, 0755), 0);
	fd = open(keep, O_WRONLY | O_CREAT, 0644);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(mkdir(top, 0755), 0);
	make_deep(top, "a", 40); /* the link sits below the levels kept open */
	snprintf(link, sizeof(link), "%s/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/link", top);
	assert_int_equal(symlink(outside, link), 0);
	assert_int_equal(fs_rmtree(top), 0);
	assert_int_equal(lstat(top, &st), -1);
	assert_int_equal(stat(keep, &st), 0);
}

/* ---- COLLECT from a hostile guest ---- */

enum fake_kind { FAKE_EMPTY_FILES, FAKE_DEEP_DIR, FAKE_BAD_NAMES, FAKE_DIR_FILES };

struct fake_guest {
	int fd;
	enum fake_kind kind;
	unsigned n; /* entries to send */
	unsigned sent;
};

static int send_out_file(int fd, const char *path, uint64_t size)
{
	struct proto_out_file m = { .mode = 0644, .size = size };
	uint8_t buf[PROTO_MAX_PATH + 64];
	ssize_t n;

	snprintf(m.path, sizeof(m.path), "%s", path);
	n = proto_out_file_encode(buf, sizeof(buf), &m);
	if (n < 0)
		return (int)n;
	return proto_send(fd, PROTO_OUT_FILE, buf, (size_t)n, 0);
}

/* The empty files of FAKE_EMPTY_FILES, framed into one buffer and written
 * in 64 KiB pieces: 101,000 frames one write each made the thread switches,
 * not the host's collect, the test's cost (15-37 s of system time). */
static int send_empty_files(int fd, unsigned n, unsigned *sent)
{
	static uint8_t buf[1 << 16];
	size_t used = 0;

	for (*sent = 0; *sent < n; (*sent)++) {
		struct proto_out_file m = { .mode = 0644 };
		ssize_t len;

		snprintf(m.path, sizeof(m.path), "f%u", *sent);
		if (used + PROTO_HDR_SIZE + PROTO_MAX_PATH + 64 > sizeof(buf)) {
			if (proto_write_all(fd, buf, used, 0) < 0)
				return -1;
			used = 0;
		}
		len = proto_out_file_encode(buf + used + PROTO_HDR_SIZE, sizeof(buf) - used - PROTO_HDR_SIZE, &m);
		if (len < 0)
			return -1;
		proto_frame_header(buf + used, PROTO_OUT_FILE, (uint32_t)len);
		used += PROTO_HDR_SIZE + (size_t)len;
	}
	return used ? proto_write_all(fd, buf, used, 0) : 0;
}

static void *fake_guest_main(void *arg)
{
	struct fake_guest *g = arg;
	uint8_t req[64], buf[PROTO_MAX_PATH + 64];
	struct proto_out_end end = { 0 };
	ssize_t n;

	/* The COLLECT request: read it, whatever it says. */
	if (read(g->fd, req, sizeof(req)) <= 0)
		return NULL;
	switch (g->kind) {
	case FAKE_EMPTY_FILES:
		if (send_empty_files(g->fd, g->n, &g->sent) < 0)
			return NULL;
		end.files = g->n;
		break;
	case FAKE_DIR_FILES:
		/* Each file in a directory of its own that the host must make. */
		for (g->sent = 0; g->sent < g->n; g->sent++) {
			char path[48];

			snprintf(path, sizeof(path), "d%u/e/f/x", g->sent);
			if (send_out_file(g->fd, path, 0) < 0)
				return NULL;
		}
		end.files = g->n;
		break;
	case FAKE_DEEP_DIR: {
		/* One OUT_DIR of 2,048 components (4 KiB), then a file in it. */
		char path[PROTO_MAX_PATH + 1];
		struct proto_writer w = { .buf = buf, .cap = sizeof(buf) };

		for (int i = 0; i < 2048; i++) {
			path[2 * i] = 'a';
			path[2 * i + 1] = '/';
		}
		path[4095] = '\0';
		proto_put_str(&w, path);
		if (proto_send(g->fd, PROTO_OUT_DIR, buf, w.len, 0) < 0)
			return NULL;
		path[4092] = 'f'; /* …/a/f */
		path[4093] = '\0';
		if (send_out_file(g->fd, path, 0) < 0)
			return NULL;
		g->sent = 2;
		break;
	}
	case FAKE_BAD_NAMES:
		/* A name that is not UTF-8, then a good one with two bytes. */
		if (send_out_file(g->fd, "bad-\xff\xfe.txt", 0) < 0 || send_out_file(g->fd, "good.txt", 2) < 0 ||
		    proto_send(g->fd, PROTO_OUT_DATA, "hi", 2, 0) < 0)
			return NULL;
		g->sent = 2;
		break;
	}
	n = proto_out_end_encode(buf, sizeof(buf), &end);
	if (n > 0)
		proto_send(g->fd, PROTO_OUT_END, buf, (size_t)n, 0);
	return NULL;
}

/* Entries (files and directories, recursively) under dir. */
static unsigned count_entries(const char *dir)
{
	char cmd[256];
	unsigned n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "find %s -mindepth 1 | wc -l", dir);
	p = popen(cmd, "r");
	assert_non_null(p);
	assert_int_equal(fscanf(p, "%u", &n), 1);
	pclose(p);
	return n;
}

/* COLLECT from a fake guest into tmpdir/out with lim; the outputs array. */
static json_t *collect_from(struct fake_guest *g, const struct run_opts *lim, int *truncated, struct kiln_err *err)
{
	int sv[2];
	pthread_t th;
	struct vm vm = { .pid = -1, .pidfd = -1, .qmp_fd = -1, .lock_fd = -1, .cancel_fd = -1, .input_fd = -1 };
	char out[128];
	json_t *outs;

	signal(SIGPIPE, SIG_IGN);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	vm.agent_fd = sv[0];
	vm.rbuf = malloc(PROTO_MAX_FRAME);
	assert_non_null(vm.rbuf);
	g->fd = sv[1];
	assert_int_equal(pthread_create(&th, NULL, fake_guest_main, g), 0);
	snprintf(out, sizeof(out), "%s/out", tmpdir);
	outs = run_session_collect(&vm, out, 1u << 20, lim, truncated, err);
	close(sv[0]); /* a guest still sending gets EPIPE */
	pthread_join(th, NULL);
	close(sv[1]);
	free(vm.rbuf);
	return outs;
}

static void collect_bounds_empty_files(void **state)
{
	struct fake_guest g = { .kind = FAKE_EMPTY_FILES, .n = 200000 };
	struct run_opts lim = { .out_max_entries = 5000 };
	struct kiln_err err = { .code = "" };
	char out[128];
	int truncated = 0;
	json_t *outs = collect_from(&g, &lim, &truncated, &err);

	assert_non_null(outs);
	snprintf(out, sizeof(out), "%s/out", tmpdir);
	/* 200,000 announced, 5,000 made: the rest read and dropped. */
	assert_int_equal(g.sent, 200000);
	assert_int_equal(json_array_size(outs), 5000);
	assert_int_equal(count_entries(out), 5000);
	assert_true(truncated);
	json_decref(outs);
}

/* Directories the host makes on the way to a file count too. */
static void collect_counts_implicit_dirs(void **state)
{
	struct fake_guest g = { .kind = FAKE_DIR_FILES, .n = 2000 };
	struct run_opts lim = { .out_max_entries = 500 };
	struct kiln_err err = { .code = "" };
	char out[128];
	int truncated = 0;
	json_t *outs = collect_from(&g, &lim, &truncated, &err);
	unsigned n;

	assert_non_null(outs);
	snprintf(out, sizeof(out), "%s/out", tmpdir);
	n = count_entries(out);
	assert_true(n >= 500 && n <= 500 + 4); /* the limit plus one path's directories */
	assert_int_equal(json_array_size(outs), 125);
	assert_true(truncated);
	json_decref(outs);
}

static void collect_default_limit_is_bounded(void **state)
{
	/* No configured limit: the default (what kiln-init ever sends) holds. */
	struct fake_guest g = { .kind = FAKE_EMPTY_FILES, .n = RUN_OUT_MAX_ENTRIES + 1000 };
	struct kiln_err err = { .code = "" };
	char out[128];
	int truncated = 0;
	json_t *outs = collect_from(&g, NULL, &truncated, &err);

	assert_non_null(outs);
	snprintf(out, sizeof(out), "%s/out", tmpdir);
	assert_int_equal(json_array_size(outs), RUN_OUT_MAX_ENTRIES);
	assert_int_equal(count_entries(out), RUN_OUT_MAX_ENTRIES);
	assert_true(truncated);
	json_decref(outs);
}

static void collect_bounds_depth(void **state)
{
	struct fake_guest g = { .kind = FAKE_DEEP_DIR };
	struct kiln_err err = { .code = "" };
	char out[128];
	int truncated = 0;
	json_t *outs = collect_from(&g, NULL, &truncated, &err);

	assert_non_null(outs);
	snprintf(out, sizeof(out), "%s/out", tmpdir);
	assert_int_equal(json_array_size(outs), 0);
	assert_int_equal(count_entries(out), 0); /* not one of the 2,048 levels */
	assert_true(truncated);
	json_decref(outs);
}

static void collect_lists_non_utf8_names(void **state)
{
	struct fake_guest g = { .kind = FAKE_BAD_NAMES };
	struct kiln_err err = { .code = "" };
	char out[128];
	int truncated = 1;
	json_t *outs = collect_from(&g, NULL, &truncated, &err), *bad, *good;

	assert_non_null(outs);
	snprintf(out, sizeof(out), "%s/out", tmpdir);
	/* Both listed: the bad one readable, with its reason and no key; only
	 * the good one kept on the host. */
	assert_int_equal(json_array_size(outs), 2);
	bad = json_array_get(outs, 0);
	good = json_array_get(outs, 1);
	assert_string_equal(json_string_value(json_object_get(bad, "path")), "bad-\xef\xbf\xbd\xef\xbf\xbd.txt");
	assert_non_null(json_string_value(json_object_get(bad, "skipped")));
	assert_true(json_is_null(json_object_get(bad, "s3_key")));
	assert_string_equal(json_string_value(json_object_get(good, "path")), "good.txt");
	assert_int_equal(json_integer_value(json_object_get(good, "size")), 2);
	assert_null(json_object_get(good, "skipped"));
	assert_int_equal(count_entries(out), 1);
	assert_false(truncated);
	json_decref(outs);
}

/* Two long names that differ only at their end never share a key: each
 * gets its own, or no key at all with a reason. */
static void session_keys_never_collide(void **state)
{
	char a[1101], b[1101];
	struct kiln_err err = { .code = "" };
	char *ka, *kb;

	memset(a, 'x', 1100);
	a[1100] = '\0';
	memcpy(b, a, sizeof(a));
	b[1099] = 'y';
	ka = session_output_key("cust", "s_0123456789abcdef", a, &err);
	assert_null(ka);
	assert_non_null(strstr(err.message, "longer than"));
	kb = session_output_key("cust", "s_0123456789abcdef", b, &err);
	assert_null(kb);
	/* Near the limit: both fit, and differ. */
	a[900] = b[900] = '\0';
	b[899] = 'y';
	ka = session_output_key("cust", "s_0123456789abcdef", a, &err);
	kb = session_output_key("cust", "s_0123456789abcdef", b, &err);
	assert_non_null(ka);
	assert_non_null(kb);
	assert_string_not_equal(ka, kb);
	assert_int_equal(strncmp(ka, "cust/sessions/s_0123456789abcdef/outputs/", 41), 0);
	free(ka);
	free(kb);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(rmtree_removes_100_levels, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(rmtree_removes_beyond_path_max, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(rmtree_never_follows_links, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(collect_bounds_empty_files, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(collect_counts_implicit_dirs, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(collect_default_limit_is_bounded, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(collect_bounds_depth, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(collect_lists_non_utf8_names, tmp_setup, tmp_teardown),
		cmocka_unit_test(session_keys_never_collide),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
