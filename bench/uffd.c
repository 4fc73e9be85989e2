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
 * And the design a lazy resume of kiln's own would use ("held by the
 * host"): the VM's RAM a private mapping of the base's memfd in another
 * process (QEMU's), whose uffd that process made from a /dev/userfaultfd
 * handed to it and gave away; this process registers that mapping (MINOR
 * mode: a fault on every page not yet mapped, the base's too), places the
 * changed pages (UFFDIO_COPY, every other page here) and maps the base's
 * (UFFDIO_CONTINUE); it checks that each page reads as it should and that
 * a write to a base page stays private. Medians of ROUNDS (default 5);
 * PAGES (default 3000). Needs root (or vm.unprivileged_userfaultfd=1). */
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

/* ---- held by the host: MINOR faults of another process's private memfd
 * mapping ---- */

static int send_fd(int sock, int fd)
{
	char c = 0;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} u = { 0 };
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b) };
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);

	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(h), &fd, sizeof(int));
	return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
	char c;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b) };
	struct cmsghdr *h;
	int fd = -1;

	if (recvmsg(sock, &m, 0) != 1 || !(h = CMSG_FIRSTHDR(&m)) || h->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(&fd, CMSG_DATA(h), sizeof(int));
	return fd;
}

/* The base's page i holds (i & 0x7f) + 1; a changed page, 0x80 | that. */
static int want_byte(size_t off)
{
	size_t i = off / PG;

	return (i % 2 ? 0x80 : 0) | ((int)(i & 0x7f) + 1);
}

/* "QEMU": maps the base privately, makes a uffd from the /dev/userfaultfd
 * it is handed and gives it away, says where its RAM is, then (on "go")
 * touches the pages, checks each and a private write; answers with the
 * time taken, or -1. */
static void vm_process(int sock, int memfd)
{
	unsigned char *ram = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE, memfd, 0);
	int dev = recv_fd(sock), uffd;
	uint64_t addr = (uintptr_t)ram;
	double t = -1;
	unsigned char go;

	uffd = dev >= 0 ? ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK) : -1;
	if (dev >= 0)
		close(dev);
	if (ram == MAP_FAILED || uffd < 0 || send_fd(sock, uffd) < 0 || io_write_all(sock, &addr, sizeof(addr)) < 0)
		_exit(1);
	close(uffd); /* only the host holds it now */
	if (io_read_all(sock, &go, 1) != 1)
		_exit(1);
	t = bench_now_ms();
	for (size_t i = 0; i < pages; i++)
		if (ram[where(i)] != want_byte(where(i))) {
			t = -1;
			break;
		}
	if (t >= 0) {
		t = bench_now_ms() - t;
		/* A base page written: private to this process, the base unchanged. */
		ram[0] = 0x55;
		if (ram[0] != 0x55 || pread(memfd, &go, 1, 0) != 1 || go != (want_byte(0) & 0x7f))
			t = -1;
	}
	(void)io_write_all(sock, &t, sizeof(t));
	_exit(0);
}

struct host_faults {
	int uffd;
	uint64_t ram;
	int stop, bad;
};

static void *host_fault_thread(void *arg)
{
	struct host_faults *f = arg;
	static char page[PG] __attribute__((aligned(4096)));

	while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
		struct uffd_msg m;
		struct pollfd p = { .fd = f->uffd, .events = POLLIN };
		uint64_t off;

		if (poll(&p, 1, 100) <= 0 || read(f->uffd, &m, sizeof(m)) != sizeof(m) ||
		    m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		off = (m.arg.pagefault.address & ~(uint64_t)(PG - 1)) - f->ram;
		if (!(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR))
			f->bad = 1; /* every page is in the memfd: only MINOR faults */
		if (off / PG % 2) {
			struct uffdio_copy c = { .dst = f->ram + off, .src = (uintptr_t)page, .len = PG };

			memset(page, want_byte(off), PG);
			if (ioctl(f->uffd, UFFDIO_COPY, &c) < 0 && errno != EEXIST)
				f->bad = 1;
		} else {
			struct uffdio_continue c = { .range = { .start = f->ram + off, .len = PG } };

			if (ioctl(f->uffd, UFFDIO_CONTINUE, &c) < 0 && errno != EEXIST)
				f->bad = 1;
		}
	}
	return NULL;
}

static double held(void)
{
	int sv[2] = { -1, -1 }, memfd = memfd_create("uffd-base", MFD_CLOEXEC), dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	struct host_faults f = { .uffd = -1 };
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_MINOR_SHMEM };
	struct uffdio_register reg;
	static char page[PG];
	pthread_t th;
	int started = 0;
	double t = -1;
	pid_t vm = -1;

	if (memfd < 0 || dev < 0 || ftruncate(memfd, SIZE) < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("held: memfd, /dev/userfaultfd or socketpair");
		goto out;
	}
	for (size_t off = 0; off < SIZE; off += PG) {
		memset(page, want_byte(off) & 0x7f, PG);
		if (pwrite(memfd, page, PG, (off_t)off) != PG)
			goto out;
	}
	vm = fork();
	if (vm == 0) {
		close(sv[0]);
		vm_process(sv[1], memfd);
	}
	close(sv[1]);
	sv[1] = -1;
	if (vm < 0 || send_fd(sv[0], dev) < 0 || (f.uffd = recv_fd(sv[0])) < 0 ||
	    io_read_all(sv[0], &f.ram, sizeof(f.ram)) != sizeof(f.ram)) {
		fprintf(stderr, "held: no uffd from the VM process\n");
		goto out;
	}
	/* Registered from here, in the other process's address space. */
	reg = (struct uffdio_register){ .range = { .start = f.ram, .len = SIZE }, .mode = UFFDIO_REGISTER_MODE_MINOR };
	if (ioctl(f.uffd, UFFDIO_API, &api) < 0 || ioctl(f.uffd, UFFDIO_REGISTER, &reg) < 0) {
		perror("held: UFFDIO_API or UFFDIO_REGISTER (MINOR) of another process's mapping");
		goto out;
	}
	if (pthread_create(&th, NULL, host_fault_thread, &f) != 0)
		goto out;
	started = 1;
	if (io_write_all(sv[0], "g", 1) < 0 || io_read_all(sv[0], &t, sizeof(t)) != sizeof(t))
		t = -1;
out:
	if (started) {
		__atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
		pthread_join(th, NULL); /* f.bad is read after it */
		if (f.bad)
			fprintf(stderr, "held: a fault was not MINOR, or a page could not be placed\n");
		else if (t < 0)
			fprintf(stderr, "held: a page read wrong in the VM process, or its private write leaked\n");
		if (f.bad)
			t = -1;
	}
	if (vm > 0) {
		kill(vm, SIGKILL);
		waitpid(vm, NULL, 0);
	}
	if (f.uffd >= 0)
		close(f.uffd);
	if (dev >= 0)
		close(dev);
	if (memfd >= 0)
		close(memfd);
	for (int i = 0; i < 2; i++)
		if (sv[i] >= 0)
			close(sv[i]);
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
	double in[64], out[64], ea[64], ho[64];
	int held_ok = 1;

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
		ho[i] = held_ok ? held() : -1;
		if (in[i] < 0 || out[i] < 0 || ea[i] < 0)
			return 1;
		held_ok = held_ok && ho[i] >= 0;
	}
	qsort(in, (size_t)rounds, sizeof(double), bench_cmp_double);
	qsort(out, (size_t)rounds, sizeof(double), bench_cmp_double);
	qsort(ea, (size_t)rounds, sizeof(double), bench_cmp_double);
	qsort(ho, (size_t)rounds, sizeof(double), bench_cmp_double);
	printf("lazy pages: %u pages touched one at a time (medians of %d): served by the fault thread itself %.1f ms "
	       "(%.1f us a page); served by another process over sockets, as a postcopy source would %.1f ms (%.1f us "
	       "a page); written ahead with process_vm_writev %.1f ms (%.1f us a page)\n",
	       pages, rounds, in[rounds / 2], in[rounds / 2] * 1000 / pages, out[rounds / 2],
	       out[rounds / 2] * 1000 / pages, ea[rounds / 2], ea[rounds / 2] * 1000 / pages);
	if (!held_ok)
		printf("lazy pages, held by the host: not measured (said above why)\n");
	else
		printf("lazy pages, held by the host: another process's private mapping of a memfd base, its uffd made there "
	       "from /dev/userfaultfd and given away, registered MINOR from here, every other page placed "
	       "(UFFDIO_COPY) and the rest mapped from the base (UFFDIO_CONTINUE), each checked: %.1f ms for %u pages "
	       "(%.1f us a page; medians of %d)\n",
	       ho[rounds / 2], pages, ho[rounds / 2] * 1000 / pages, rounds);
	return 0;
}
