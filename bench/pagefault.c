/* pagefault: what writing a resumed session's changed pages costs on this
 * host, three ways (figures, not pass/fail): 17,900 pages (what a 64 MiB
 * working set plus the guest kernel's own changes came to) written into a
 * private (copy-on-write) mapping of a memfd, as QEMU's own load of a
 * migration stream writes its RAM (a user-mode page fault each); into an
 * anonymous mapping; and with process_vm_writev into another process's
 * private mapping of the same memfd, as kiln-host's page loader does (the
 * kernel faults the pages in, no trap per page). Medians of ROUNDS
 * (default 5). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define SIZE  (256u << 20)
#define PAGES 17900u
#define PG    4096u

/* The i-th page written: spread over the RAM, as a working set is. */
static size_t where(size_t i)
{
	return i * PG * 3 % SIZE;
}

static double by_faults(char *p)
{
	static char page[PG];
	double t = bench_now_ms();

	memset(page, 7, sizeof(page));
	for (size_t i = 0; i < PAGES; i++)
		memcpy(p + where(i), page, PG);
	return bench_now_ms() - t;
}

static double by_writev(int fd)
{
	static char page[PG];
	char *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	double t;

	if (p == MAP_FAILED)
		return -1;
	t = bench_writev_pages(p, PAGES, where, page);
	munmap(p, SIZE);
	return t;
}

int main(void)
{
	int rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 5;
	double a[64], b[64], c[64];
	int fd = memfd_create("base", 0);
	char *base;

	if (rounds < 1 || rounds > 64 || fd < 0 || ftruncate(fd, SIZE) < 0)
		return 1;
	base = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
		return 1;
	for (size_t i = 0; i < SIZE; i += 5 * PG)
		base[i] = 1; /* a base with content, like a snapshot's RAM */
	for (int i = 0; i < rounds; i++) {
		char *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);

		a[i] = by_faults(p);
		munmap(p, SIZE);
		p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		b[i] = by_faults(p);
		munmap(p, SIZE);
		c[i] = by_writev(fd);
	}
	qsort(a, (size_t)rounds, sizeof(double), bench_cmp_double);
	qsort(b, (size_t)rounds, sizeof(double), bench_cmp_double);
	qsort(c, (size_t)rounds, sizeof(double), bench_cmp_double);
	printf("page faults: %u pages written (medians of %d): copy-on-write memfd mapping %.1f ms (%.1f us a page), "
	       "anonymous %.1f ms, process_vm_writev into another process %.1f ms (%.1f us a page; %.1fx)\n",
	       PAGES, rounds, a[rounds / 2], a[rounds / 2] * 1000 / PAGES, b[rounds / 2], c[rounds / 2],
	       c[rounds / 2] * 1000 / PAGES, a[rounds / 2] / c[rounds / 2]);
	return 0;
}
