/* uffd: what a lazy resume would pay per page (figures, not pass/fail).
 * A lazy resume starts the VM before its pages are in and serves each page
 * on first touch. QEMU 7.2 does that only as a postcopy destination: its
 * RAM is anonymous memory registered with userfaultfd, a fault thread reads
 * the fault, asks the migration source for the page over the return path,
 * and the load thread places the page (UFFDIO_COPY) when it arrives on the
 * stream. This times that round trip on this host, with the same hops:
 * - "vCPU": the main thread touches PAGES pages spread over 256 MiB, one at
 *   a time (a guest stalls on each);
 * - "QEMU's fault thread": reads the uffd event, writes the page's offset to
 *   a socket;
 * - "the source" (another process, as kiln-host would be): reads the
 *   offset, answers with the 4 KiB page;
 * - "QEMU's load thread": reads the page, UFFDIO_COPY.
 * And, as a floor, the same with the page served by the fault thread itself
 * (no socket, no other process). Against it, the eager way: the same pages
 * written ahead with process_vm_writev (kiln-host's page loader today).
 * Medians of ROUNDS (default 5); PAGES (default 3000). Needs root (or
 * vm.unprivileged_userfaultfd=1). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "io.h"

#define SIZE (256u << 20)
#define PG   4096u

static unsigned pages = 3000;

/* The i-th page touched: spread over the RAM, as a guest's first touches are. */
static size_t where(size_t i)
{
	return i * PG * 7 % SIZE;
}

struct faults {
	int uffd, req, pg; /* pg: where pages come back (-1: serve them here) */
	char *base;
	int stop;
};

/* QEMU's fault thread and load thread in one (the hops are the same:
 * request out, page in, place). */
static void *fault_thread(void *arg)
{
	struct faults *f = arg;
	static char page[PG] __attribute__((aligned(4096)));

	for (;;) {
		struct uffd_msg m;
		struct pollfd p = { .fd = f->uffd, .events = POLLIN };
		uint64_t off;

		if (poll(&p, 1, 100) <= 0) {
			if (__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE))
				return NULL;
			continue;
		}
		if (read(f->uffd, &m, sizeof(m)) != sizeof(m) || m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		off = (m.arg.pagefault.address & ~(uint64_t)(PG - 1)) - (uint64_t)(uintptr_t)f->base;
		if (f->pg >= 0) {
			if (io_write_all(f->req, &off, sizeof(off)) < 0 || io_read_all(f->pg, page, PG) != PG)
				return NULL;
		} else {
			memset(page, (int)(off >> 12) & 0xff, PG);
		}
		struct uffdio_copy c = { .dst = (uintptr_t)f->base + off, .src = (uintptr_t)page, .len = PG };

		if (ioctl(f->uffd, UFFDIO_COPY, &c) < 0 && errno != EEXIST)
			perror("UFFDIO_COPY");
	}
}

/* The source: answers each offset with its page. */
static void source(int req, int pg)
{
	static char page[PG];
	uint64_t off;

	while (io_read_all(req, &off, sizeof(off)) == sizeof(off)) {
		memset(page, (int)(off >> 12) & 0xff, PG);
		if (io_write_all(pg, page, PG) < 0)
			break;
	}
	_exit(0);
}

static double lazy(int remote)
{
	struct faults f = { .pg = -1, .req = -1 };
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg;
	int a[2] = { -1, -1 }, b[2] = { -1, -1 };
	pid_t src = -1;
	pthread_t th;
	double t = -1;
	volatile char sum = 0;

	f.uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (f.uffd < 0 || ioctl(f.uffd, UFFDIO_API, &api) < 0) {
		perror("userfaultfd");
		return -1;
	}
	f.base = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	reg = (struct uffdio_register){ .range = { .start = (uintptr_t)f.base, .len = SIZE },
					.mode = UFFDIO_REGISTER_MODE_MISSING };
	if (f.base == MAP_FAILED || ioctl(f.uffd, UFFDIO_REGISTER, &reg) < 0) {
		perror("UFFDIO_REGISTER");
		goto out;
	}
	if (remote) {
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, a) < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, b) < 0)
			goto out;
		src = fork();
		if (src == 0) {
			close(a[0]);
			close(b[0]);
			source(a[1], b[1]);
		}
		close(a[1]);
		close(b[1]);
		a[1] = b[1] = -1;
		f.req = a[0];
		f.pg = b[0];
	}
	if (pthread_create(&th, NULL, fault_thread, &f) != 0)
		goto out;
	t = bench_now_ms();
	for (size_t i = 0; i < pages; i++)
		sum += f.base[where(i)];
	t = bench_now_ms() - t;
	__atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	(void)sum;
out:
	for (int i = 0; i < 2; i++) {
		if (a[i] >= 0)
			close(a[i]);
		if (b[i] >= 0)
			close(b[i]);
	}
	if (src > 0)
		waitpid(src, NULL, 0);
	if (f.base != MAP_FAILED)
		munmap(f.base, SIZE);
	close(f.uffd);
	return t;
}

/* The eager way: every page written ahead into another process. */
static double eager(void)
{
	static char page[PG];
	char *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	double t;

	if (p == MAP_FAILED)
		return -1;
	memset(page, 7, sizeof(page));
	t = bench_writev_pages(p, pages, where, page);
	munmap(p, SIZE);
	return t;
}

int main(void)
{
	int rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 5;
	double in[64], out[64], ea[64];

	if (getenv("PAGES"))
		pages = (unsigned)atoi(getenv("PAGES"));
	if (rounds < 1 || rounds > 64 || pages < 1 || pages > SIZE / PG) {
		fprintf(stderr, "uffd: ROUNDS 1-64, PAGES 1-%u\n", SIZE / PG);
		return 2;
	}
	for (int i = 0; i < rounds; i++) {
		in[i] = lazy(0);
		out[i] = lazy(1);
		ea[i] = eager();
		if (in[i] < 0 || out[i] < 0 || ea[i] < 0)
			return 1;
	}
	qsort(in, (size_t)rounds, sizeof(double), bench_cmp_double);
	qsort(out, (size_t)rounds, sizeof(double), bench_cmp_double);
	qsort(ea, (size_t)rounds, sizeof(double), bench_cmp_double);
	printf("lazy pages: %u pages touched one at a time (medians of %d): served by the fault thread itself %.1f ms "
	       "(%.1f us a page); served by another process over sockets, as a postcopy source would %.1f ms (%.1f us "
	       "a page); written ahead with process_vm_writev %.1f ms (%.1f us a page)\n",
	       pages, rounds, in[rounds / 2], in[rounds / 2] * 1000 / pages, out[rounds / 2],
	       out[rounds / 2] * 1000 / pages, ea[rounds / 2], ea[rounds / 2] * 1000 / pages);
	return 0;
}
