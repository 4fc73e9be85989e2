/* test_pageload: unit tests for host/vm/pageload.c, writing into this
 * process's own memory (process_vm_writev to itself) mapped as QEMU maps a
 * session's RAM (a memfd, private): every page handed over lands where it
 * belongs and nothing else changes, the memfd included; a flush returns
 * only once both threads' writes are done (the pages are poisoned right
 * after each flush); the helper takes batches; pages handed over before the
 * target is known wait for it; a VM that never comes, a write that fails
 * and a page outside the block all fail, and keep failing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pageload.h"

#define PG    4096
#define PAGES 4096 /* a 16 MiB block */

struct block {
	int fd;
	uint8_t *ram; /* the memfd mapped private, as QEMU maps it */
};

static void block_open(struct block *b)
{
	b->fd = memfd_create("test-pageload", MFD_CLOEXEC);
	assert_true(b->fd >= 0);
	assert_int_equal(ftruncate(b->fd, (off_t)PAGES * PG), 0);
	{
		uint8_t *w = mmap(NULL, (size_t)PAGES * PG, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);

		assert_true(w != MAP_FAILED);
		memset(w, 'B', (size_t)PAGES * PG);
		munmap(w, (size_t)PAGES * PG);
	}
	b->ram = mmap(NULL, (size_t)PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, b->fd, 0);
	assert_true(b->ram != MAP_FAILED);
}

static void block_close(struct block *b)
{
	munmap(b->ram, (size_t)PAGES * PG);
	close(b->fd);
}

/* Page i's content as handed over: its index and a pattern. */
static void fill(uint8_t *p, unsigned i)
{
	for (unsigned k = 0; k < PG; k += 4)
		memcpy(p + k, &(uint32_t){ i * 2654435761u + k }, 4);
}

static uint64_t pages_of(struct pageload *pl)
{
	uint64_t pages, helped;

	pageload_stats(pl, &pages, &helped);
	return pages;
}

static void test_writes_every_page(void **state)
{
	struct kiln_err err = { .code = "" };
	struct block b;
	struct pageload *pl;
	uint8_t *src = malloc((size_t)PAGES * PG), *want = malloc(PG), *base;
	unsigned char *handed = calloc(PAGES, 1);
	unsigned n = 0, since = 0, full = 0;
	uint64_t pages, helped;

	assert_non_null(src);
	assert_non_null(want);
	assert_non_null(handed);
	block_open(&b);
	srandom(7);
	pl = pageload_new((uint64_t)PAGES * PG, &err);
	assert_non_null(pl);
	pageload_target(pl, getpid(), (uintptr_t)b.ram);
	/* Stream order with gaps (about 3 pages in 4), a flush every 1,500
	 * pages as at a chunk's end: full batches go to the helper or are
	 * written here, the rest at the flush. Four rounds over the block,
	 * each page's content naming its round. */
	for (unsigned r = 1; r <= 4; r++) {
		for (unsigned i = 0; i < PAGES; i++) {
			if (random() % 4 == 0)
				continue;
			fill(src + (size_t)i * PG, i + r * PAGES);
			assert_int_equal(pageload_page(pl, (uint64_t)i * PG, src + (size_t)i * PG), 0);
			handed[i] = (unsigned char)r;
			n++;
			if (++since == PAGELOAD_BATCH)
				full++; /* a segment with a full batch */
			if (since == 1500) {
				assert_int_equal(pageload_flush(pl), 0);
				/* Done means done: a write still under way would copy this. */
				memset(src, 0xee, (size_t)PAGES * PG);
				since = 0;
			}
		}
	}
	assert_int_equal(pageload_flush(pl), 0);
	pageload_stats(pl, &pages, &helped);
	assert_int_equal(pages, n);
	/* The first full batch after each flush finds the helper idle. */
	assert_true(full >= 8);
	assert_true(helped >= full);
	for (unsigned i = 0; i < PAGES; i++) {
		if (handed[i])
			fill(want, i + handed[i] * PAGES);
		else
			memset(want, 'B', PG);
		assert_memory_equal(b.ram + (size_t)i * PG, want, PG);
	}
	/* Copy-on-write: the base file is untouched. */
	base = mmap(NULL, (size_t)PAGES * PG, PROT_READ, MAP_SHARED, b.fd, 0);
	assert_true(base != MAP_FAILED);
	memset(want, 'B', PG);
	for (unsigned i = 0; i < PAGES; i++)
		assert_memory_equal(base + (size_t)i * PG, want, PG);
	munmap(base, (size_t)PAGES * PG);
	pageload_free(pl);
	block_close(&b);
	free(src);
	free(want);
	free(handed);
}

struct later {
	struct pageload *pl;
	uint8_t *ram;
};

static void *set_target(void *arg)
{
	struct later *l = arg;

	pageload_target(l->pl, getpid(), (uintptr_t)l->ram);
	return NULL;
}

/* Pages handed over before the VM is there: the flush waits for it. */
static void test_target_later(void **state)
{
	struct kiln_err err = { .code = "" };
	struct block b;
	struct pageload *pl;
	static uint8_t src[3 * PG];
	pthread_t th;

	block_open(&b);
	pl = pageload_new((uint64_t)PAGES * PG, &err);
	assert_non_null(pl);
	for (unsigned i = 0; i < 3; i++) {
		memset(src + i * PG, 'a' + (int)i, PG);
		assert_int_equal(pageload_page(pl, (uint64_t)(10 + 2 * i) * PG, src + i * PG), 0);
	}
	assert_int_equal(pthread_create(&th, NULL, set_target, &(struct later){ .pl = pl, .ram = b.ram }), 0);
	assert_int_equal(pageload_flush(pl), 0);
	pthread_join(th, NULL);
	for (unsigned i = 0; i < 3; i++)
		assert_memory_equal(b.ram + (size_t)(10 + 2 * i) * PG, src + i * PG, PG);
	assert_int_equal(b.ram[11 * PG], 'B');
	pageload_free(pl);
	block_close(&b);
}

/* The VM never comes: a full batch and a flush fail, and keep failing. */
static void test_no_vm(void **state)
{
	struct kiln_err err = { .code = "" };
	struct pageload *pl = pageload_new((uint64_t)PAGES * PG, &err);
	static uint8_t src[PG];
	int r = 0;

	assert_non_null(pl);
	pageload_target(pl, 0, 0);
	pageload_target(pl, getpid(), (uintptr_t)src); /* the first call counts */
	for (unsigned i = 0; i < PAGELOAD_BATCH && r == 0; i++)
		r = pageload_page(pl, (uint64_t)i * PG, src);
	assert_int_equal(r, -1);
	assert_int_equal(pageload_flush(pl), -1);
	assert_int_equal(pages_of(pl), 0);
	pageload_free(pl);
}

/* A write that fails (the block is not mapped there): -1 from then on,
 * whichever thread wrote. */
static void test_write_fails(void **state)
{
	struct kiln_err err = { .code = "" };
	struct pageload *pl = pageload_new((uint64_t)PAGES * PG, &err);
	uint8_t *gone = mmap(NULL, (size_t)PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	static uint8_t src[PG];
	int r = 0;

	assert_non_null(pl);
	assert_true(gone != MAP_FAILED);
	munmap(gone, (size_t)PAGES * PG);
	pageload_target(pl, getpid(), (uintptr_t)gone);
	for (unsigned i = 0; i < 3 * PAGELOAD_BATCH && r == 0; i++)
		r = pageload_page(pl, (uint64_t)i * PG, src);
	if (r == 0) /* every full batch went to the helper */
		r = pageload_flush(pl);
	assert_int_equal(r, -1);
	assert_int_equal(pageload_flush(pl), -1);
	assert_int_equal(pages_of(pl), 0);
	pageload_free(pl);
}

/* A page outside the block, or not on a page boundary: refused. */
static void test_outside_the_block(void **state)
{
	struct kiln_err err = { .code = "" };
	struct pageload *pl = pageload_new((uint64_t)PAGES * PG, &err);
	static uint8_t src[PG];

	assert_non_null(pl);
	assert_int_equal(pageload_page(pl, (uint64_t)PAGES * PG, src), -1);
	assert_int_equal(pageload_page(pl, 100, src), -1);
	assert_int_equal(pageload_page(pl, UINT64_MAX - PG + 1, src), -1);
	pageload_free(pl);
	/* Freed with nothing handed over and no target: no wait. */
	pageload_free(pageload_new(PG, &err));
	pageload_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_writes_every_page),
		cmocka_unit_test(test_target_later),
		cmocka_unit_test(test_no_vm),
		cmocka_unit_test(test_write_fails),
		cmocka_unit_test(test_outside_the_block),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
