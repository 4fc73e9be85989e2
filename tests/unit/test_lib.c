/* test_lib: the small shared pieces of lib/ every component builds on: the
 * growable buffer (growth, the cap, printf, consume, steal), whole-fd I/O
 * (short writes on a non-blocking pipe, the deadline, reads against a cap)
 * and the clocks (monotonic, the kiln_clock seam). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "clock.h"
#include "io.h"

static void test_buf_grow(void **state)
{
	struct buf b = BUF_INIT;
	char chunk[1000];

	memset(chunk, 'x', sizeof(chunk));
	assert_null(b.p);
	for (int i = 0; i < 100; i++)
		assert_int_equal(buf_add(&b, chunk, sizeof(chunk)), 0);
	assert_int_equal(b.len, 100000);
	assert_true(b.cap > b.len);
	assert_int_equal(b.p[b.len], 0);
	/* Doubling from 4 KiB: 131072 holds 100001. */
	assert_int_equal(b.cap, 131072);
	assert_int_equal(buf_adds(&b, "end"), 0);
	assert_string_equal(b.p + 100000, "end");
	buf_free(&b);
	assert_null(b.p);
	assert_int_equal(b.len, 0);
	/* Adding nothing to an empty buffer still gives a string. */
	assert_int_equal(buf_add(&b, "", 0), 0);
	assert_non_null(b.p);
	assert_string_equal(b.p, "");
	buf_free(&b);
}

static void test_buf_cap(void **state)
{
	struct buf b;

	buf_init(&b, 10);
	assert_int_equal(buf_adds(&b, "0123456789"), 0);
	assert_int_equal(buf_adds(&b, "x"), -E2BIG);
	assert_int_equal(b.len, 10);
	assert_string_equal(b.p, "0123456789");
	buf_reset(&b);
	assert_int_equal(buf_printf(&b, "%d-%s", 12345, "abcd"), 0);
	assert_string_equal(b.p, "12345-abcd");
	/* A printf past the cap fails whole and leaves the buffer as it was. */
	assert_int_equal(buf_printf(&b, "%s", "y"), -E2BIG);
	assert_string_equal(b.p, "12345-abcd");
	buf_reset(&b);
	assert_int_equal(buf_adds(&b, "abc"), 0);
	assert_int_equal(buf_printf(&b, "%s", "0123456789"), -E2BIG);
	assert_int_equal(b.len, 3);
	assert_string_equal(b.p, "abc");
	/* Huge sizes are refused, not wrapped. */
	assert_int_equal(buf_reserve(&b, SIZE_MAX), -E2BIG);
	buf_free(&b);
	assert_int_equal(b.max, 10);
}

static void test_buf_printf_consume_steal(void **state)
{
	struct buf b = BUF_INIT;
	size_t len = 0;
	char *s;

	/* Longer than the first allocation: the second vsnprintf pass. */
	for (int i = 0; i < 2000; i++)
		assert_int_equal(buf_printf(&b, "%04d,", i), 0);
	assert_int_equal(b.len, 10000);
	assert_memory_equal(b.p + 9995, "1999,", 5);
	buf_consume(&b, 9995);
	assert_string_equal(b.p, "1999,");
	buf_consume(&b, 100);
	assert_int_equal(b.len, 0);
	assert_string_equal(b.p, "");
	assert_int_equal(buf_adds(&b, "kept"), 0);
	s = buf_steal(&b, &len);
	assert_string_equal(s, "kept");
	assert_int_equal(len, 4);
	assert_null(b.p);
	free(s);
	s = buf_steal(&b, &len);
	assert_string_equal(s, "");
	assert_int_equal(len, 0);
	free(s);
}

struct drain {
	int fd;
	size_t got;
	int delay_ms;
};

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	char tmp[8192];
	ssize_t r;

	if (d->delay_ms)
		usleep((useconds_t)d->delay_ms * 1000);
	while ((r = read(d->fd, tmp, sizeof(tmp))) > 0)
		d->got += (size_t)r;
	return NULL;
}

static void test_io_write_all(void **state)
{
	int p[2];
	size_t n = 1 << 20;
	char *data = malloc(n);
	struct drain d = { 0 };
	pthread_t th;

	assert_non_null(data);
	memset(data, 'k', n);
	/* Non-blocking writer into a pipe far smaller than 1 MiB: EAGAIN and
	 * short writes, waited out with poll(). */
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(fcntl(p[1], F_SETFL, O_NONBLOCK), 0);
	d.fd = p[0];
	d.delay_ms = 50;
	assert_int_equal(pthread_create(&th, NULL, drain_main, &d), 0);
	assert_int_equal(io_write_all(p[1], data, n, clock_mono_ms() + 30000), 0);
	close(p[1]);
	pthread_join(th, NULL);
	close(p[0]);
	assert_int_equal(d.got, n);

	/* Nobody reads: the deadline ends it. */
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(fcntl(p[1], F_SETFL, O_NONBLOCK), 0);
	assert_int_equal(io_write_all(p[1], data, n, clock_mono_ms() + 100), -ETIMEDOUT);
	close(p[0]);
	/* The reader is gone: EPIPE, not a hang (SIGPIPE ignored here). */
	signal(SIGPIPE, SIG_IGN);
	assert_int_equal(io_write_all(p[1], data, 10, 0), -EPIPE);
	close(p[1]);
	free(data);
}

static void test_io_read(void **state)
{
	char path[] = "/tmp/kiln-test-io.XXXXXX";
	int fd = mkstemp(path);
	struct buf b;
	char big[200000];

	assert_true(fd >= 0);
	memset(big, 'r', sizeof(big));
	assert_int_equal(io_write_all(fd, big, sizeof(big), 0), 0);
	close(fd);

	buf_init(&b, 0);
	assert_int_equal(io_read_path(path, &b), 0);
	assert_int_equal(b.len, sizeof(big));
	assert_memory_equal(b.p, big, sizeof(big));
	buf_free(&b);

	/* Exactly at the cap is fine; one byte more is -E2BIG. */
	buf_init(&b, sizeof(big));
	assert_int_equal(io_read_path(path, &b), 0);
	assert_int_equal(b.len, sizeof(big));
	buf_free(&b);
	buf_init(&b, sizeof(big) - 1);
	assert_int_equal(io_read_path(path, &b), -E2BIG);
	assert_true(b.len <= sizeof(big) - 1);
	buf_free(&b);

	buf_init(&b, 0);
	assert_int_equal(io_read_path("/tmp", &b), -EINVAL);
	assert_int_equal(io_read_path("/nonexistent/kiln", &b), -ENOENT);
	buf_free(&b);
	unlink(path);
}

static int64_t fake_ms(void *ctx)
{
	return *(int64_t *)ctx;
}

static void test_clock(void **state)
{
	int64_t a = clock_mono_ms(), us = clock_mono_us(), t = 42;
	struct kiln_clock fake = { fake_ms, fake_ms, &t };

	assert_true(a > 0);
	assert_true(us / 1000 >= a);
	assert_true(clock_mono_ms() >= a);
	/* After 2020 and before 2100. */
	assert_true(clock_wall_ms() > 1577836800000LL && clock_wall_ms() < 4102444800000LL);
	assert_int_equal(kclock_mono_ms(&fake), 42);
	t = 1000;
	assert_int_equal(kclock_wall_ms(&fake), 1000);
	assert_true(kclock_mono_ms(NULL) >= a);
	assert_true(kclock_mono_ms(&clock_system) >= a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_buf_grow),     cmocka_unit_test(test_buf_cap),
		cmocka_unit_test(test_buf_printf_consume_steal),
		cmocka_unit_test(test_io_write_all), cmocka_unit_test(test_io_read),
		cmocka_unit_test(test_clock),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
