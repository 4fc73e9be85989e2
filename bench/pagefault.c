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

#define SIZE  (256u << 20)
#define PAGES 17900u
#define PG    4096u

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The i-th page written: spread over the RAM, as a working set is. */
static size_t where(size_t i)
{
	return i * PG * 3 % SIZE;
}

static double by_faults(char *p)
{
	static char page[PG];
	double t = now_ms();

	memset(page, 7, sizeof(page));
	for (size_t i = 0; i < PAGES; i++)
		memcpy(p + where(i), page, PG);
	return now_ms() - t;
}

static double by_writev(int fd)
{
	static char page[PG];
	struct iovec l[1024], r[1024];
	char *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	pid_t c;
	double t;

	if (p == MAP_FAILED)
		return -1;
	c = fork();
	if (c == 0) {
		pause();
		_exit(0);
	}
	t = now_ms();
	for (size_t done = 0; done < PAGES;) {
		int k = 0;

		for (; k < 1024 && done < PAGES; k++, done++) {
			l[k] = (struct iovec){ .iov_base = page, .iov_len = PG };
			r[k] = (struct iovec){ .iov_base = p + where(done), .iov_len = PG };
		}
		if (process_vm_writev(c, l, (unsigned long)k, r, (unsigned long)k, 0) != (ssize_t)k * PG) {
			perror("process_vm_writev");
			break;
		}
	}
	t = now_ms() - t;
	kill(c, SIGKILL);
	waitpid(c, NULL, 0);
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
	qsort(a, (size_t)rounds, sizeof(double), cmp);
	qsort(b, (size_t)rounds, sizeof(double), cmp);
	qsort(c, (size_t)rounds, sizeof(double), cmp);
	printf("page faults: %u pages written (medians of %d): copy-on-write memfd mapping %.1f ms (%.1f us a page), "
	       "anonymous %.1f ms, process_vm_writev into another process %.1f ms (%.1f us a page; %.1fx)\n",
	       PAGES, rounds, a[rounds / 2], a[rounds / 2] * 1000 / PAGES, b[rounds / 2], c[rounds / 2],
	       c[rounds / 2] * 1000 / PAGES, a[rounds / 2] / c[rounds / 2]);
	return 0;
}
