/* test_lib: the small shared pieces in lib/: the growable buffer (buf.h), the
 * clocks (clock.h) and the write-all / read-all loops (io.h). */
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fsutil.h"
#include "buf.h"
#include "clock.h"
#include "io.h"

/* Appends grow past the first 4 KiB, the bytes stay NUL-terminated. */
static void buf_grows_terminated(void **state)
{
	struct buf b = BUF_INIT;
	char chunk[1000];

	memset(chunk, 'x', sizeof(chunk));
	for (int i = 0; i < 50; i++)
		assert_int_equal(buf_add(&b, chunk, sizeof(chunk)), 0);
	assert_int_equal(b.len, 50000);
	assert_true(b.cap > b.len);
	assert_int_equal(b.p[b.len], 0);
	assert_int_equal(buf_adds(&b, "end"), 0);
	assert_string_equal(b.p + 50000, "end");
	buf_free(&b);
	assert_null(b.p);
	assert_int_equal(b.len, 0);
}

/* printf text, including text longer than what is left, and an empty add
 * still leaves a C string. */
static void buf_printf_fits(void **state)
{
	struct buf b = BUF_INIT;
	char big[6000];

	assert_int_equal(buf_add(&b, "", 0), 0);
	assert_non_null(b.p);
	assert_string_equal(b.p, "");
	assert_int_equal(buf_printf(&b, "%d-%s", 42, "x"), 0);
	assert_string_equal(b.p, "42-x");
	memset(big, 'y', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	assert_int_equal(buf_printf(&b, "[%s]", big), 0);
	assert_int_equal(b.len, 4 + 2 + sizeof(big) - 1);
	assert_int_equal(b.p[4], '[');
	assert_int_equal(b.p[b.len - 1], ']');
	assert_int_equal(b.p[b.len], 0);
	buf_free(&b);
}

/* Past max nothing is appended, by buf_add or by buf_printf, whether the
 * text would have fit the allocation or not. */
static void buf_max_refuses(void **state)
{
	struct buf b;

	buf_init(&b, 10);
	assert_int_equal(buf_adds(&b, "0123456789"), 0);
	assert_int_equal(buf_add(&b, "a", 1), -E2BIG);
	assert_int_equal(b.len, 10);
	buf_reset(&b);
	assert_int_equal(b.len, 0);
	assert_string_equal(b.p, "");
	assert_int_equal(buf_adds(&b, "abcde"), 0);
	assert_int_equal(buf_printf(&b, "%s", "fghijk"), -E2BIG); /* allocation has room, max does not */
	assert_int_equal(b.len, 5);
	assert_string_equal(b.p, "abcde");
	assert_int_equal(buf_printf(&b, "%s", "fghij"), 0);
	assert_string_equal(b.p, "abcdefghij");
	assert_int_equal(b.max, 10);
	buf_free(&b);
	assert_int_equal(b.max, 10); /* kept for reuse */
	assert_int_equal(buf_reserve(&b, 11), -E2BIG);
	assert_int_equal(buf_reserve(&b, SIZE_MAX), -E2BIG);
	buf_free(&b);
}

/* Consume moves the rest to the front; steal hands the bytes over. */
static void buf_consume_steal(void **state)
{
	struct buf b = BUF_INIT;
	size_t len = 99;
	char *s;

	s = buf_steal(&b, &len); /* empty: "" */
	assert_non_null(s);
	assert_string_equal(s, "");
	assert_int_equal(len, 0);
	free(s);
	assert_int_equal(buf_adds(&b, "hello world"), 0);
	buf_consume(&b, 6);
	assert_string_equal(b.p, "world");
	assert_int_equal(b.len, 5);
	buf_consume(&b, 100);
	assert_int_equal(b.len, 0);
	assert_string_equal(b.p, "");
	assert_int_equal(buf_adds(&b, "kept"), 0);
	s = buf_steal(&b, &len);
	assert_string_equal(s, "kept");
	assert_int_equal(len, 4);
	assert_null(b.p);
	assert_int_equal(b.len, 0);
	assert_int_equal(b.cap, 0);
	free(s);
}

/* The clocks: wall time is epoch milliseconds, the monotonic ones agree with
 * each other and never go back; the seam calls the given clock. */
static int64_t fake_ms(void *ctx)
{
	return *(int64_t *)ctx;
}

static void clock_values(void **state)
{
	int64_t w = clock_wall_ms(), m1 = clock_mono_ms(), u = clock_mono_us(), m2 = clock_mono_ms();
	int64_t t = 1234;
	struct kiln_clock fake = { fake_ms, fake_ms, &t };

	assert_true(w > 1600000000000LL); /* after 2020 */
	assert_true(m2 >= m1);
	assert_true(u / 1000 >= m1 && u / 1000 <= m2);
	assert_true(kclock_wall_ms(NULL) >= w);
	assert_true(kclock_mono_ms(&clock_system) >= m2);
	assert_int_equal(kclock_mono_ms(&fake), 1234);
	t = 5678;
	assert_int_equal(kclock_wall_ms(&fake), 5678);
}

/* Whole writes through a pipe, and a full non-blocking pipe times out at
 * the deadline instead of spinning or blocking. */
static void io_pipe_roundtrip(void **state)
{
	int fds[2];
	char out[200000], in[200000];
	pid_t pid;

	for (size_t i = 0; i < sizeof(out); i++)
		out[i] = (char)(i * 7);
	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) { /* more than the pipe holds: short writes happen */
		close(fds[0]);
		_exit(io_write_all(fds[1], out, sizeof(out)) == 0 ? 0 : 1);
	}
	close(fds[1]);
	assert_int_equal(io_read_all(fds[0], in, sizeof(in)), sizeof(in));
	assert_int_equal(io_read_all(fds[0], in, 1), 0); /* end of file */
	assert_memory_equal(in, out, sizeof(out));
	close(fds[0]);
}

static void io_deadline(void **state)
{
	int fds[2];
	char block[4096] = { 0 };
	int64_t t0;

	assert_int_equal(pipe2(fds, O_NONBLOCK), 0);
	assert_int_equal(io_write_all_deadline(fds[1], "abc", 3, 0), 0);
	t0 = clock_mono_ms();
	for (int i = 0; i < 1000; i++) { /* fill it, whatever its size */
		int r = io_write_all_deadline(fds[1], block, sizeof(block), clock_mono_ms() + 50);

		if (r == -ETIMEDOUT)
			break;
		assert_int_equal(r, 0);
	}
	assert_int_equal(io_write_all_deadline(fds[1], "x", 1, clock_mono_ms() + 20), -ETIMEDOUT);
	assert_true(clock_mono_ms() - t0 >= 20);
	close(fds[0]);
	assert_int_equal(io_write_all(fds[1], "x", 1), -EPIPE);
	assert_int_equal(io_write_all_deadline(fds[1], "x", 1, 0), -EPIPE);
	close(fds[1]);
	assert_int_equal(io_write_all(fds[1], "x", 1), -EBADF);
}

/* A whole file comes back NUL-terminated; past max it is refused. */
static void io_files(void **state)
{
	char path[] = "/tmp/kiln-test-lib.XXXXXX";
	char data[10000];
	size_t len = 0;
	char *p;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	memset(data, 'z', sizeof(data));
	assert_int_equal(io_write_all(fd, data, sizeof(data)), 0);
	close(fd);
	p = io_read_file(path, sizeof(data), &len);
	assert_non_null(p);
	assert_int_equal(len, sizeof(data));
	assert_memory_equal(p, data, sizeof(data));
	assert_int_equal(p[len], 0);
	free(p);
	errno = 0;
	assert_null(io_read_file(path, sizeof(data) - 1, &len));
	assert_int_equal(errno, EFBIG);
	{
		char small[8];

		/* io_read_small: one read, cut to cap - 1, NUL-terminated. */
		assert_int_equal(io_read_small(path, small, sizeof(small)), 7);
		assert_string_equal(small, "zzzzzzz");
		assert_int_equal(io_read_small(path, small, 1), -1);
		assert_int_equal(io_read_small("/dev/null", small, sizeof(small)), -1);
		unlink(path);
		assert_int_equal(io_read_small(path, small, sizeof(small)), -1);
	}
	assert_null(io_read_file(path, 100, NULL));
	assert_int_equal(errno, ENOENT);
	p = io_read_file("/dev/null", 0, &len); /* empty is fine at max 0 */
	assert_non_null(p);
	assert_int_equal(len, 0);
	assert_string_equal(p, "");
	free(p);
}

/* fs_proc_stat: fields of this process's stat; a non-numeric field (3, the
 * state letter) and a process that does not exist are errors. */
static void proc_stat_fields(void **state)
{
	unsigned long long v[2], start;

	assert_int_equal(fs_proc_stat(getpid(), 22, 1, &start), 0);
	assert_true(start > 0);
	assert_int_equal(fs_proc_stat(getpid(), 4, 1, v), 0);
	assert_int_equal(v[0], (unsigned long long)getppid());
	assert_int_equal(fs_proc_stat(getpid(), 14, 2, v), 0);
	assert_int_equal(fs_proc_stat(getpid(), 3, 1, v), -1);
	assert_int_equal(fs_proc_stat(getpid(), 2, 1, v), -1);
	assert_int_equal(fs_proc_stat(getpid(), 60, 1, v), -1);
	assert_int_equal(fs_proc_stat(0x3fffffff, 22, 1, v), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(buf_grows_terminated), cmocka_unit_test(buf_printf_fits),
		cmocka_unit_test(proc_stat_fields),
		cmocka_unit_test(buf_max_refuses),      cmocka_unit_test(buf_consume_steal),
		cmocka_unit_test(clock_values),         cmocka_unit_test(io_pipe_roundtrip),
		cmocka_unit_test(io_deadline),          cmocka_unit_test(io_files),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests_name("lib", tests, NULL, NULL);
}
