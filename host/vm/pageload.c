/* pageload: a resume's page loader, writing from two threads (see
 * pageload.h).
 *
 * Why process_vm_writev at all: QEMU's own load takes a user-mode page
 * fault for each page it copies into its copy-on-write RAM, ~15 us apiece
 * on the virtualised hosts measured (17,900 pages: 270 ms), where
 * process_vm_writev faults them in the kernel (~2 us a page).
 *
 * Two batches: the filter's thread fills one; when it is full and the
 * helper is idle, the helper takes it and the filter fills the other;
 * when the helper is still busy, the filter writes its batch itself. So at
 * most two writes run at once, into distinct pages (each page is handed
 * over once per flush), and a flush waits for the helper's. The batches
 * hold the pages where the caller keeps them (no copy), as offsets into
 * the block until the target is known. */
#include "pageload.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

struct pl_batch {
	struct iovec liov[PAGELOAD_BATCH], riov[PAGELOAD_BATCH];
	int n, nr; /* pages; remote ranges (neighbouring pages merge) */
};

struct pageload {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int state;              /* 0: no target yet; 1: pid and ram set; -1: given up */
	pid_t pid;
	uintptr_t ram;
	uint64_t size;
	int failed;             /* a write failed: every later call is -1 */
	int stop;
	struct pl_batch *handed; /* the helper's, until written (NULL: helper idle) */
	pthread_t th;
	uint64_t pages, helped;
	struct pl_batch b[2];
	int cur;                /* the batch the caller fills */
};

/* Write batch b (the target known): its ranges become addresses first. */
static int write_batch(struct pageload *pl, struct pl_batch *b)
{
	ssize_t want = (ssize_t)b->n * 4096, got;

	for (int i = 0; i < b->nr; i++)
		b->riov[i].iov_base = (void *)(pl->ram + (uintptr_t)b->riov[i].iov_base);
	got = process_vm_writev(pl->pid, b->liov, (unsigned long)b->n, b->riov, (unsigned long)b->nr, 0);
	if (got != want) {
		fprintf(stderr, "kiln-host: loading pages into QEMU %d: %s\n", (int)pl->pid,
			got < 0 ? strerror(errno) : "short write");
		return -1;
	}
	return 0;
}

/* Write b with the lock dropped meanwhile (held on entry and on return),
 * and count it. */
static int write_counted(struct pageload *pl, struct pl_batch *b, int by_helper)
{
	int r;

	pthread_mutex_unlock(&pl->mu);
	r = write_batch(pl, b);
	pthread_mutex_lock(&pl->mu);
	if (r < 0) {
		pl->failed = 1;
	} else {
		pl->pages += (uint64_t)b->n;
		pl->helped += (uint64_t)by_helper;
	}
	return r;
}

static void *helper(void *arg)
{
	struct pageload *pl = arg;

	pthread_mutex_lock(&pl->mu);
	for (;;) {
		while (!pl->handed && !pl->stop)
			pthread_cond_wait(&pl->cv, &pl->mu);
		if (!pl->handed)
			break;
		write_counted(pl, pl->handed, 1);
		pl->handed = NULL;
		pthread_cond_broadcast(&pl->cv);
	}
	pthread_mutex_unlock(&pl->mu);
	return NULL;
}

struct pageload *pageload_new(uint64_t size, struct kiln_err *err)
{
	struct pageload *pl = calloc(1, sizeof(*pl));

	if (!pl) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	pl->size = size;
	pthread_mutex_init(&pl->mu, NULL);
	pthread_cond_init(&pl->cv, NULL);
	if (pthread_create(&pl->th, NULL, helper, pl) != 0) {
		pthread_mutex_destroy(&pl->mu);
		pthread_cond_destroy(&pl->cv);
		free(pl);
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the page loader's thread");
		return NULL;
	}
	return pl;
}

void pageload_target(struct pageload *pl, pid_t pid, uintptr_t ram)
{
	pthread_mutex_lock(&pl->mu);
	if (pl->state == 0) {
		pl->pid = pid;
		pl->ram = ram;
		pl->state = pid > 0 ? 1 : -1;
	}
	pthread_cond_broadcast(&pl->cv);
	pthread_mutex_unlock(&pl->mu);
}

/* Wait for the target; 0 once it is known and nothing failed. */
static int wait_target(struct pageload *pl)
{
	int r;

	pthread_mutex_lock(&pl->mu);
	while (pl->state == 0)
		pthread_cond_wait(&pl->cv, &pl->mu);
	r = pl->state < 0 || pl->failed ? -1 : 0;
	pthread_mutex_unlock(&pl->mu);
	return r;
}

/* The caller's batch is full or must be written: to the helper when it is
 * idle (the caller goes on with the other batch), else written here. */
static int submit(struct pageload *pl, int may_hand)
{
	struct pl_batch *b = &pl->b[pl->cur];
	int r;

	if (wait_target(pl) < 0)
		return -1;
	pthread_mutex_lock(&pl->mu);
	if (may_hand && !pl->handed) {
		pl->handed = b;
		pl->cur ^= 1;
		/* The helper is idle: it is done with the other batch. */
		pl->b[pl->cur].n = pl->b[pl->cur].nr = 0;
		pthread_cond_broadcast(&pl->cv);
		pthread_mutex_unlock(&pl->mu);
		return 0;
	}
	r = write_counted(pl, b, 0);
	pthread_mutex_unlock(&pl->mu);
	b->n = b->nr = 0;
	return r;
}

int pageload_page(void *ctx, uint64_t addr, const uint8_t *data)
{
	struct pageload *pl = ctx;
	struct pl_batch *b = &pl->b[pl->cur];

	if (addr >= pl->size || addr % 4096)
		return -1; /* the filter checks this; a loader never writes outside its block */
	b->liov[b->n++] = (struct iovec){ .iov_base = (void *)data, .iov_len = 4096 };
	/* Neighbouring pages: one remote range (an offset into the block until
	 * the batch is written). */
	if (b->nr && (uintptr_t)b->riov[b->nr - 1].iov_base + b->riov[b->nr - 1].iov_len == addr)
		b->riov[b->nr - 1].iov_len += 4096;
	else
		b->riov[b->nr++] = (struct iovec){ .iov_base = (void *)(uintptr_t)addr, .iov_len = 4096 };
	return b->n == PAGELOAD_BATCH ? submit(pl, 1) : 0;
}

int pageload_flush(void *ctx)
{
	struct pageload *pl = ctx;
	int r = 0;

	/* The caller's part while the helper finishes its own. */
	if (pl->b[pl->cur].n)
		r = submit(pl, 0);
	pthread_mutex_lock(&pl->mu);
	while (pl->handed)
		pthread_cond_wait(&pl->cv, &pl->mu);
	if (pl->failed)
		r = -1;
	pthread_mutex_unlock(&pl->mu);
	return r;
}

void pageload_stats(struct pageload *pl, uint64_t *pages, uint64_t *helped)
{
	pthread_mutex_lock(&pl->mu);
	*pages = pl->pages;
	*helped = pl->helped;
	pthread_mutex_unlock(&pl->mu);
}

void pageload_free(struct pageload *pl)
{
	if (!pl)
		return;
	pthread_mutex_lock(&pl->mu);
	pl->stop = 1;
	pthread_cond_broadcast(&pl->cv);
	pthread_mutex_unlock(&pl->mu);
	pthread_join(pl->th, NULL);
	pthread_mutex_destroy(&pl->mu);
	pthread_cond_destroy(&pl->cv);
	free(pl);
}
