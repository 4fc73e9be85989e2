/* test_base_ensure: session_base_ensure (host/session/session_s3.c) against
 * a small in-process S3 (libmicrohttpd on loopback: PUT stores a key, HEAD
 * answers for it, every PUT slowed so that uploads overlap): a missing base
 * goes up as its chunks then its manifest, once; two threads ensuring the
 * same base at once (a pause racing the preparation ahead of it) make one
 * upload, the other finding it there after waiting; a base already there
 * costs one HEAD; the preparation ahead gives up once the book is stopping
 * and writes no manifest; S3 away is an error that leaves the base's lock
 * free. No VM, no real S3. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <microhttpd.h>

#include "base_book.h"
#include "s3.h"
#include "session_int.h"

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define BASE_SIZE (20u << 20) /* two chunks of at most 16 MiB */

/* The fake S3: keys stored (no bodies), PUTs and HEADs counted. */
struct fake_s3 {
	struct MHD_Daemon *d;
	unsigned port;
	pthread_mutex_t lock;
	char keys[64][256];
	int nkeys;
	int puts, heads, manifest_puts;
	int put_delay_ms;
};

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static int have_key(struct fake_s3 *f, const char *url)
{
	for (int i = 0; i < f->nkeys; i++)
		if (!strcmp(f->keys[i], url))
			return 1;
	return 0;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	MHD_add_response_header(r, "ETag", "\"0\"");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result fake_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				    const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct fake_s3 *f = cls;
	static int started;
	int have;

	if (!*con_cls) {
		*con_cls = &started;
		return MHD_YES;
	}
	if (*upload_size) {
		*upload_size = 0; /* the bodies are not kept */
		return MHD_YES;
	}
	if (!strcmp(method, "HEAD")) {
		pthread_mutex_lock(&f->lock);
		f->heads++;
		have = have_key(f, url);
		pthread_mutex_unlock(&f->lock);
		return reply(conn, have ? 200 : 404);
	}
	if (!strcmp(method, "PUT")) {
		if (strchr(url + 1, '/'))
			sleep_ms(f->put_delay_ms); /* an object, not the bucket */
		pthread_mutex_lock(&f->lock);
		f->puts++;
		if (strstr(url, "/manifest.json"))
			f->manifest_puts++;
		if (!have_key(f, url) && f->nkeys < 64)
			snprintf(f->keys[f->nkeys++], sizeof(f->keys[0]), "%s", url);
		pthread_mutex_unlock(&f->lock);
		return reply(conn, 200);
	}
	return reply(conn, 405);
}

static struct fake_s3 *fake_start(void)
{
	struct fake_s3 *f = calloc(1, sizeof(*f));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = 0 };
	const union MHD_DaemonInfo *info;

	assert_non_null(f);
	pthread_mutex_init(&f->lock, NULL);
	f->put_delay_ms = 150;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
				fake_handler, f, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_END);
	assert_non_null(f->d);
	info = MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_BIND_PORT);
	assert_non_null(info);
	f->port = info->port;
	return f;
}

static void fake_stop(struct fake_s3 *f)
{
	MHD_stop_daemon(f->d);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

/* What every test uses: the fake S3, its settings, a book, and base RAM. */
struct fixture {
	struct fake_s3 *f;
	char endpoint[64];
	struct s3_config c;
	struct base_book *bk;
	int fd;
};

static int setup(void **state)
{
	struct fixture *x = calloc(1, sizeof(*x));
	uint8_t *m;

	if (!x)
		return -1;
	x->f = fake_start();
	snprintf(x->endpoint, sizeof(x->endpoint), "http://127.0.0.1:%u", x->f->port);
	x->c = (struct s3_config){ .endpoint = x->endpoint, .region = "us-east-1", .bucket = "kiln-test", .access_key = "ak",
				   .secret_key = "sk", .timeout_s = 10, .attempts = 1 };
	x->bk = base_book_new();
	x->fd = memfd_create("base", MFD_CLOEXEC);
	if (!x->bk || x->fd < 0 || ftruncate(x->fd, BASE_SIZE) < 0)
		return -1;
	m = mmap(NULL, BASE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, x->fd, 0);
	if (m == MAP_FAILED)
		return -1;
	for (size_t i = 0; i < BASE_SIZE; i += 4096)
		m[i] = (uint8_t)(i >> 12);
	munmap(m, BASE_SIZE);
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *x = *state;

	close(x->fd);
	base_book_unref(x->bk);
	fake_stop(x->f);
	free(x);
	return 0;
}

struct ensurer {
	struct fixture *x;
	int ahead, rc;
	uint64_t bytes;
	struct kiln_err err;
};

static void *ensure_main(void *arg)
{
	struct ensurer *e = arg;

	e->err = (struct kiln_err){ .code = "" };
	e->rc = session_base_ensure(e->x->bk, &e->x->c, e->x->fd, BASE_SIZE, SHA, "tplkey", e->ahead, &e->bytes,
				    &e->err);
	if (e->rc < 0)
		fprintf(stderr, "# session_base_ensure: %s: %s\n", e->err.code, e->err.message);
	return NULL;
}

static void test_once(void **state)
{
	struct fixture *x = *state;
	struct ensurer e = { .x = x };

	/* Missing: bucket, chunks, then the manifest. */
	ensure_main(&e);
	assert_int_equal(e.rc, 1);
	assert_true(e.bytes > 0);
	assert_int_equal(x->f->manifest_puts, 1);
	assert_int_equal(x->f->puts, 1 + 2 + 1);
	assert_true(have_key(x->f, "/kiln-test/.bases/" SHA "/manifest.json"));
	/* There: one HEAD, nothing sent. */
	x->f->heads = 0;
	e.bytes = 0;
	ensure_main(&e);
	assert_int_equal(e.rc, 0);
	assert_int_equal((int)e.bytes, 0);
	assert_int_equal(x->f->heads, 1);
	assert_int_equal(x->f->puts, 4);
}

static void test_race(void **state)
{
	struct fixture *x = *state;
	struct ensurer a = { .x = x, .ahead = 1 }, p = { .x = x };
	pthread_t ta, tp;

	/* The preparation and a pause at once: one upload; the pause waited
	 * for it and found the base there. */
	assert_int_equal(pthread_create(&ta, NULL, ensure_main, &a), 0);
	sleep_ms(20);
	assert_int_equal(pthread_create(&tp, NULL, ensure_main, &p), 0);
	pthread_join(ta, NULL);
	pthread_join(tp, NULL);
	assert_int_equal(a.rc + p.rc, 1);
	assert_int_equal(a.rc >= 0 && p.rc >= 0, 1);
	assert_int_equal(x->f->manifest_puts, 1);
	assert_int_equal(x->f->puts, 1 + 2 + 1);
	assert_true((a.bytes == 0) != (p.bytes == 0));
	/* Both missed it at first, the one that waited looked again. */
	assert_int_equal(x->f->heads, 4);
}

static void test_stopping(void **state)
{
	struct fixture *x = *state;
	struct ensurer a = { .x = x, .ahead = 1 }, p = { .x = x };

	/* Shutting down: the preparation writes nothing more (no manifest:
	 * no base), and leaves the base's lock free. */
	assert_int_equal(base_book_stop(x->bk, 0), 0);
	ensure_main(&a);
	assert_int_equal(a.rc, -1);
	assert_non_null(strstr(a.err.message, "shutting down"));
	assert_int_equal(x->f->manifest_puts, 0);
	/* A pause still uploads it. */
	ensure_main(&p);
	assert_int_equal(p.rc, 1);
	assert_int_equal(x->f->manifest_puts, 1);
}

static void test_s3_away(void **state)
{
	struct fixture *x = *state;
	struct ensurer p = { .x = x };

	/* Nothing listens there (the fake's port, once stopped). */
	MHD_stop_daemon(x->f->d);
	ensure_main(&p);
	assert_int_equal(p.rc, -1);
	assert_true(kiln_err_is_s3(p.err.errc));
	/* The base's lock is free: another ensure gets past it. */
	x->f->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
				   fake_handler, x->f, MHD_OPTION_END);
	assert_non_null(x->f->d);
	snprintf(x->endpoint, sizeof(x->endpoint), "http://127.0.0.1:%u",
		 MHD_get_daemon_info(x->f->d, MHD_DAEMON_INFO_BIND_PORT)->port);
	ensure_main(&p);
	assert_int_equal(p.rc, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_race, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stopping, setup, teardown),
		cmocka_unit_test_setup_teardown(test_s3_away, setup, teardown),
	};

	s3_global_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
