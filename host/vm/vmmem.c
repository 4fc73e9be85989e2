/* vmmem: a session VM's RAM read and written from kiln-host in QEMU's
 * address space (see vmmem.h). The fast save stands on one fact of the
 * session's RAM: QEMU maps the base (a sealed memfd) copy-on-write, so a
 * page the guest (or a device, or the resume's loader) ever wrote is a
 * private anonymous page of QEMU's, and every other page reads as the
 * base's. /proc/<pid>/pagemap says which is which without touching any. */
#include "vmmem.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "proto.h"
#include "snapshot.h"

#define VMMEM_PAGE     4096u
#define VMMEM_BATCH    256   /* pages per process_vm_readv */
#define VMMEM_PM_ENTS  8192  /* pagemap entries per read (64 KiB) */
#define PM_PRESENT     (1ull << 63)
#define PM_SWAP        (1ull << 62)
#define PM_FILE        (1ull << 61) /* a file page or shared anonymous: here, the base's */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_ok;

static void probe(void)
{
	static volatile char mark = 'k';
	char got = 0;
	struct iovec l = { .iov_base = &got, .iov_len = 1 }, r = { .iov_base = (void *)&mark, .iov_len = 1 };
	pid_t c = fork();

	if (c < 0)
		return;
	if (c == 0) {
		pause();
		_exit(0);
	}
	probe_ok = process_vm_readv(c, &l, 1, &r, 1, 0) == 1 && got == 'k';
	if (!probe_ok)
		fprintf(stderr, "kiln-host: process_vm_readv/writev are not allowed here (%s): sessions pause and "
				"resume through QEMU's own save and load, slower\n", strerror(errno));
	kill(c, SIGKILL);
	waitpid(c, NULL, 0);
}

int vmmem_usable(void)
{
	pthread_once(&probe_once, probe);
	return probe_ok;
}

uintptr_t vmmem_find_ram(pid_t pid, int fd, uint64_t size)
{
	char path[64], line[512];
	struct stat st;
	uintptr_t found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	if (fstat(fd, &st) < 0 || !(f = fopen(path, "re")))
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned long long a, b, off, ino;
		unsigned maj, mnr;

		if (sscanf(line, "%llx-%llx %*s %llx %x:%x %llu", &a, &b, &off, &maj, &mnr, &ino) == 6 && off == 0 &&
		    ino == (unsigned long long)st.st_ino && maj == major(st.st_dev) && mnr == minor(st.st_dev) &&
		    b - a == size)
			found = (uintptr_t)a;
	}
	fclose(f);
	return found;
}

static ssize_t fd_read(void *ctx, void *buf, size_t len)
{
	ssize_t n;

	while ((n = read(*(int *)ctx, buf, len)) < 0 && errno == EINTR)
		;
	return n;
}

static int discard(void *ctx, const void *buf, size_t len)
{
	return 0;
}

int vmmem_save_open(struct vmmem_save *sv, struct kiln_err *err)
{
	struct migfilter_compose c = { .block = "mem", .size = sv->size };
	struct migfilter_stats st;
	char path[64];

	sv->pm_fd = sv->tpl_fd = -1;
	if (!vmmem_usable())
		return kiln_err_set(err, KERR_HOST_ERROR, "process_vm_readv is not allowed here");
	if (sv->size % VMMEM_PAGE || !(sv->ram = vmmem_find_ram(sv->vm->pid, sv->map_fd >= 0 ? sv->map_fd : sv->base_fd,
								 sv->size)))
		return kiln_err_set(err, KERR_HOST_ERROR, "the VM's RAM is not in QEMU %d's address space",
				    (int)sv->vm->pid);
	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)sv->vm->pid);
	sv->pm_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (sv->pm_fd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
		goto fail;
	}
	sv->tpl_fd = open(sv->tpl_path, O_RDONLY | O_CLOEXEC);
	if (sv->tpl_fd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", sv->tpl_path, strerror(errno));
		goto fail;
	}
	if (migfilter_compose_run(fd_read, &sv->tpl_fd, &c, discard, NULL, &st, err) < 0)
		goto fail;
	if (lseek(sv->tpl_fd, 0, SEEK_SET) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", sv->tpl_path, strerror(errno));
		goto fail;
	}
	return 0;
fail:
	vmmem_save_close(sv);
	return -1;
}

void vmmem_save_close(struct vmmem_save *sv)
{
	if (sv->pm_fd >= 0)
		close(sv->pm_fd);
	if (sv->tpl_fd >= 0)
		close(sv->tpl_fd);
	sv->pm_fd = sv->tpl_fd = -1;
}

/* The walk over the block: the private pages, read in batches. */
struct walk {
	struct vmmem_save *sv;
	uint8_t *buf;                 /* VMMEM_BATCH pages */
	uint64_t addr[VMMEM_BATCH];   /* offsets into the block */
	uint64_t h[VMMEM_BATCH];      /* their hashes (a delta or a fork copy) */
	struct iovec liov[VMMEM_BATCH], riov[VMMEM_BATCH];
	int n, nr;
	struct kiln_err *err;
	size_t cur;                   /* the delta table's cursor */
	size_t acur;                  /* sv->also's cursor */
	uint8_t base_page[VMMEM_PAGE];
	struct migfilter_out *o;
};

/* A page the delta's table has that is no longer QEMU's private copy: it
 * reads as the mapped file's now (the base's), which the layers in S3 do
 * not say. */
static int walk_gone(void *ctx, uint32_t pg)
{
	struct walk *w = ctx;
	int fd = w->sv->map_fd >= 0 ? w->sv->map_fd : w->sv->base_fd;
	ssize_t n = pread(fd, w->base_page, VMMEM_PAGE, (off_t)pg * VMMEM_PAGE);

	if (n != VMMEM_PAGE)
		return kiln_err_set(w->err, KERR_HOST_ERROR, "reading the base RAM: %s",
				    n < 0 ? strerror(errno) : "short read");
	w->sv->pages_gone++;
	return migfilter_page_out(w->o, (uint64_t)pg * VMMEM_PAGE, w->base_page);
}

/* In a delta: is the page at addr (hash h) as the table has it? -1: the
 * walk fails. */
static int walk_same(struct walk *w, uint64_t addr, uint64_t h)
{
	const struct phash_ent *e;
	uint32_t pg = (uint32_t)(addr / VMMEM_PAGE);
	int rc;

	e = phash_next(w->sv->delta, &w->cur, pg, walk_gone, w, &rc);
	if (rc < 0)
		return -1;
	if (!e || e->pg != pg)
		return 0;
	w->cur++;
	return e->h == h;
}

/* The fork copy: the batch's pages at their offsets (runs of adjacent
 * pages in one write; the buffer holds them in address order), and their
 * hashes. */
static int walk_copy(struct walk *w, const uint64_t *h)
{
	struct vmmem_save *sv = w->sv;

	for (int i = 0, j; i < w->n; i = j) {
		ssize_t want, got;

		for (j = i + 1; j < w->n && w->addr[j] == w->addr[j - 1] + VMMEM_PAGE; j++)
			;
		want = (ssize_t)(j - i) * VMMEM_PAGE;
		got = pwrite(sv->copy_fd, w->buf + (size_t)i * VMMEM_PAGE, (size_t)want, (off_t)w->addr[i]);
		if (got != want)
			return kiln_err_set(w->err, KERR_HOST_ERROR, "writing the fork's copy of the RAM: %s",
					    got < 0 ? strerror(errno) : "short write");
	}
	for (int i = 0; i < w->n; i++)
		if (phash_add(sv->copy_pages, (uint32_t)(w->addr[i] / VMMEM_PAGE), h[i]) < 0)
			return kiln_err_set(w->err, KERR_HOST_ERROR, "out of memory");
	return 0;
}

static int walk_flush(struct walk *w, struct migfilter_out *o)
{
	ssize_t want = (ssize_t)w->n * VMMEM_PAGE, got;

	if (!w->n)
		return 0;
	for (int i = 0; i < w->nr; i++)
		w->riov[i].iov_base = (void *)(w->sv->ram + (uintptr_t)w->riov[i].iov_base);
	got = process_vm_readv(w->sv->vm->pid, w->liov, (unsigned long)w->n, w->riov, (unsigned long)w->nr, 0);
	if (got != want)
		return kiln_err_set(w->err, KERR_HOST_ERROR, "reading the VM's pages from QEMU %d: %s",
				    (int)w->sv->vm->pid, got < 0 ? strerror(errno) : "short read");
	/* Every private page goes, not compared with the base: one that
	 * matches it again is rare, and reading the base's page costs more
	 * (2 us a page here, cold) than the few bytes it compresses to. */
	if (w->sv->delta || w->sv->copy_fd >= 0)
		for (int i = 0; i < w->n; i++)
			w->h[i] = phash_page(w->buf + (size_t)i * VMMEM_PAGE);
	if (w->sv->copy_fd >= 0 && walk_copy(w, w->h) < 0)
		return -1;
	for (int i = 0; i < w->n; i++) {
		const uint8_t *page = w->buf + (size_t)i * VMMEM_PAGE;
		int same = w->sv->delta ? walk_same(w, w->addr[i], w->h[i]) : 0;

		if (same < 0)
			return -1;
		if (same)
			w->sv->pages_same++;
		else if (migfilter_page_out(o, w->addr[i], page) < 0)
			return -1;
	}
	w->sv->private_pages += (uint64_t)w->n;
	w->n = w->nr = 0;
	return 0;
}

/* Whether sv->also names page pg (asked in ascending order). */
static int walk_also(struct walk *w, uint64_t pg)
{
	const struct phash *a = w->sv->also;

	if (!a)
		return 0;
	while (w->acur < a->n && a->e[w->acur].pg < pg)
		w->acur++;
	return w->acur < a->n && a->e[w->acur].pg == pg;
}

static int walk_pages(void *ctx, struct migfilter_out *o)
{
	struct walk *w = ctx;
	struct vmmem_save *sv = w->sv;
	uint64_t npages = sv->size / VMMEM_PAGE, *ent = malloc(VMMEM_PM_ENTS * sizeof(uint64_t));
	int r = -1;

	if (!ent)
		return kiln_err_set(w->err, KERR_HOST_ERROR, "out of memory");
	w->o = o;
	if (sv->mark && sv->mark(sv->mark_ctx, 0) < 0) {
		kiln_err_set(w->err, KERR_HOST_ERROR, "writing the session's state: %s", strerror(errno));
		goto out;
	}
	for (uint64_t first = 0; first < npages; first += VMMEM_PM_ENTS) {
		uint64_t cnt = npages - first < VMMEM_PM_ENTS ? npages - first : VMMEM_PM_ENTS;
		off_t at = (off_t)((sv->ram / VMMEM_PAGE + first) * sizeof(uint64_t));
		ssize_t got = pread(sv->pm_fd, ent, cnt * sizeof(uint64_t), at);

		if (got != (ssize_t)(cnt * sizeof(uint64_t))) {
			kiln_err_set(w->err, KERR_HOST_ERROR, "reading QEMU %d's pagemap: %s", (int)sv->vm->pid,
				     got < 0 ? strerror(errno) : "short read");
			goto out;
		}
		for (uint64_t i = 0; i < cnt; i++) {
			uint64_t e = ent[i], addr = (first + i) * VMMEM_PAGE;

			/* Present and not the file's page: QEMU's private copy.
			 * Swapped out: read too (reading brings it back). And
			 * what `also` names, whatever it is. */
			if (!((e & PM_PRESENT && !(e & PM_FILE)) || e & PM_SWAP) && !walk_also(w, first + i))
				continue;
			w->addr[w->n] = addr;
			w->liov[w->n] = (struct iovec){ .iov_base = w->buf + (size_t)w->n * VMMEM_PAGE,
							.iov_len = VMMEM_PAGE };
			w->n++;
			if (w->nr && (uintptr_t)w->riov[w->nr - 1].iov_base + w->riov[w->nr - 1].iov_len == addr)
				w->riov[w->nr - 1].iov_len += VMMEM_PAGE;
			else
				w->riov[w->nr++] = (struct iovec){ .iov_base = (void *)(uintptr_t)addr,
								   .iov_len = VMMEM_PAGE };
			if (w->n == VMMEM_BATCH && walk_flush(w, o) < 0)
				goto out;
		}
	}
	r = walk_flush(w, o);
	if (r == 0 && sv->delta) {
		int rc;

		/* The table's pages past the last private one. */
		phash_next(sv->delta, &w->cur, UINT32_MAX, walk_gone, w, &rc);
		r = rc;
	}
	if (r == 0 && sv->mark && sv->mark(sv->mark_ctx, 1) < 0)
		r = kiln_err_set(w->err, KERR_HOST_ERROR, "writing the session's state: %s", strerror(errno));
out:
	free(ent);
	return r;
}

int vmmem_private_runs(struct vmmem_save *sv, int (*fn)(void *ctx, uint64_t off, uint64_t len), void *ctx,
		       struct kiln_err *err)
{
	uint64_t npages = sv->size / VMMEM_PAGE, *ent = malloc(VMMEM_PM_ENTS * sizeof(uint64_t)), run = 0, len = 0;
	size_t acur = 0;
	int r = -1;

	if (!ent)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	for (uint64_t first = 0; first < npages; first += VMMEM_PM_ENTS) {
		uint64_t cnt = npages - first < VMMEM_PM_ENTS ? npages - first : VMMEM_PM_ENTS;
		off_t at = (off_t)((sv->ram / VMMEM_PAGE + first) * sizeof(uint64_t));
		ssize_t got = pread(sv->pm_fd, ent, cnt * sizeof(uint64_t), at);

		if (got != (ssize_t)(cnt * sizeof(uint64_t))) {
			kiln_err_set(err, KERR_HOST_ERROR, "reading QEMU %d's pagemap: %s", (int)sv->vm->pid,
				     got < 0 ? strerror(errno) : "short read");
			goto out;
		}
		for (uint64_t i = 0; i < cnt; i++) {
			uint64_t e = ent[i], pg = first + i;
			int want = (e & PM_PRESENT && !(e & PM_FILE)) || e & PM_SWAP;

			if (!want && sv->also) {
				while (acur < sv->also->n && sv->also->e[acur].pg < pg)
					acur++;
				want = acur < sv->also->n && sv->also->e[acur].pg == pg;
			}
			if (want && len && run + len == pg) {
				len++;
				continue;
			}
			if (len && fn(ctx, run * VMMEM_PAGE, len * VMMEM_PAGE) < 0)
				goto out;
			run = pg;
			len = want;
		}
	}
	if (len && fn(ctx, run * VMMEM_PAGE, len * VMMEM_PAGE) < 0)
		goto out;
	r = 0;
out:
	free(ent);
	return r;
}

/* QEMU's devices into a memfd: add-fd hands it a write-only descriptor,
 * xen-save-devices-state opens it as /dev/fdset/N (live: of a stopped VM,
 * its disks flushed and released, as after a migration). The fd is returned
 * rewound, or -1 with err. */
static int save_devices(struct vm *vm, int live, int64_t deadline_ms, struct kiln_err *err)
{
	char path[64], cmd[256];
	json_t *ret = NULL;
	int mfd = memfd_create("kiln-devices", MFD_CLOEXEC), wfd = -1, set = -1, r = -1;

	if (mfd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "memfd: %s", strerror(errno));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
	wfd = open(path, O_WRONLY | O_CLOEXEC);
	if (wfd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (vm_qmp_fd(vm, "{\"execute\":\"add-fd\",\"arguments\":{\"opaque\":\"kiln-devices\"}}", wfd, deadline_ms,
		      &ret, err) < 0)
		goto out;
	if (!json_is_integer(json_object_get(ret, "fdset-id"))) {
		kiln_err_set(err, KERR_VM_ERROR, "QMP add-fd: no fdset-id in its answer");
		goto out;
	}
	set = (int)json_integer_value(json_object_get(ret, "fdset-id"));
	snprintf(cmd, sizeof(cmd),
		 "{\"execute\":\"xen-save-devices-state\",\"arguments\":{\"filename\":\"/dev/fdset/%d\",\"live\":%s}}",
		 set, live ? "true" : "false");
	r = vm_qmp(vm, cmd, deadline_ms, NULL, err);
	snprintf(cmd, sizeof(cmd), "{\"execute\":\"remove-fd\",\"arguments\":{\"fdset-id\":%d}}", set);
	if (vm_qmp(vm, cmd, deadline_ms, NULL, r < 0 ? &(struct kiln_err){ .code = "" } : err) < 0)
		r = -1;
out:
	json_decref(ret);
	if (wfd >= 0)
		close(wfd);
	if (r == 0 && lseek(mfd, 0, SEEK_SET) == 0)
		return mfd;
	close(mfd);
	return -1;
}

int vmmem_save_fast(struct vmmem_save *sv, int64_t deadline_ms, migfilter_write_fn wr, void *wctx,
		    struct migfilter_stats *st, int *qemu_failed, struct kiln_err *err)
{
	struct walk *w = calloc(1, sizeof(*w));
	struct migfilter_compose c = { .block = "mem", .size = sv->size, .pages = walk_pages, .ctx = w };
	int64_t t0 = proto_now_ms(), t1;
	int dev = -1, r = -1;

	*qemu_failed = 0;
	sv->private_pages = sv->pages_same = sv->pages_gone = 0;
	if (!w)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	w->sv = sv;
	w->err = err;
	/* The batch buffer populated up front (one fault per page otherwise). */
	w->buf = mmap(NULL, (size_t)VMMEM_BATCH * VMMEM_PAGE, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (w->buf == MAP_FAILED) {
		w->buf = NULL;
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	/* Stopped first: nothing writes the RAM while it is read. */
	if (vm_qmp(sv->vm, "{\"execute\":\"stop\"}", deadline_ms, NULL, err) < 0 ||
	    (dev = save_devices(sv->vm, !sv->disks_stay, deadline_ms, err)) < 0) {
		*qemu_failed = 1;
		goto out;
	}
	t1 = proto_now_ms();
	sv->ms_devices = t1 - t0;
	c.dev_rd = fd_read;
	c.dev_ctx = &dev;
	r = migfilter_compose_run(fd_read, &sv->tpl_fd, &c, wr, wctx, st, err);
	/* Every page of the block counts as seen, as in a filtered stream. */
	st->pages += sv->size / VMMEM_PAGE;
	sv->ms_pages = proto_now_ms() - t1;
out:
	if (dev >= 0)
		close(dev);
	if (w->buf)
		munmap(w->buf, (size_t)VMMEM_BATCH * VMMEM_PAGE);
	free(w);
	return r;
}

/* ---- checking a fast save against QEMU's own ---- */

struct cmp_pass {
	uint8_t *copy;     /* QEMU's pages (size bytes, anonymous, untouched where zero) */
	uint8_t *seen;     /* a byte per page: carried by the pass's stream */
	uint64_t npages;
	int composed;      /* 0: QEMU's pass (copy in), 1: the composed one (compare) */
	struct vmmem_cmp *res;
};

static int cmp_page(void *ctx, uint64_t addr, const uint8_t *data)
{
	struct cmp_pass *p = ctx;
	uint8_t *mine = p->copy + addr;
	uint64_t i = addr / VMMEM_PAGE;

	if (i >= p->npages)
		return -1; /* migfilter checks addr < size: never here */
	p->seen[i] = 1;
	if (!p->composed) {
		/* A zero page is left untouched: reading it costs no memory. */
		if (memcmp(mine, data, VMMEM_PAGE))
			memcpy(mine, data, VMMEM_PAGE);
		return 0;
	}
	p->res->in_stream++;
	if (memcmp(mine, data, VMMEM_PAGE) && !p->res->differ++)
		p->res->first_diff = addr;
	return 0;
}

static int cmp_flush(void *ctx)
{
	return 0;
}

int vmmem_compare(migfilter_read_fn qemu_rd, void *qemu_ctx, migfilter_read_fn cmp_rd, void *cmp_ctx,
		  const char *block, const uint8_t *base, uint64_t size, struct vmmem_cmp *res, struct kiln_err *err)
{
	struct cmp_pass p = { .npages = size / VMMEM_PAGE, .res = res };
	struct migfilter_base mb = { .block = block, .size = size, .page = cmp_page, .flush = cmp_flush, .ctx = &p };
	struct migfilter_stats st;
	int r = -1;

	memset(res, 0, sizeof(*res));
	if (!size || size % VMMEM_PAGE)
		return kiln_err_set(err, KERR_HOST_ERROR, "a RAM block of %llu bytes cannot be compared",
				    (unsigned long long)size);
	p.copy = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	p.seen = calloc(p.npages, 1);
	if (p.copy == MAP_FAILED || !p.seen) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	if (migfilter_run(qemu_rd, qemu_ctx, discard, NULL, &mb, &st, err) < 0)
		goto out;
	for (uint64_t i = 0; i < p.npages; i++)
		if (!p.seen[i]) {
			kiln_err_set(err, KERR_SNAPSHOT_ERROR,
				     "QEMU's own save lacks page 0x%llx of %s: the fast save cannot be checked",
				     (unsigned long long)(i * VMMEM_PAGE), block);
			goto out;
		}
	memset(p.seen, 0, p.npages);
	p.composed = 1;
	if (migfilter_run(cmp_rd, cmp_ctx, discard, NULL, &mb, &st, err) < 0)
		goto out;
	for (uint64_t i = 0; i < p.npages; i++)
		if (!p.seen[i] && memcmp(base + i * VMMEM_PAGE, p.copy + i * VMMEM_PAGE, VMMEM_PAGE) &&
		    !res->differ++)
			res->first_diff = i * VMMEM_PAGE;
	res->pages = p.npages;
	r = 0;
out:
	if (p.copy != MAP_FAILED)
		munmap(p.copy, size);
	free(p.seen);
	return r;
}

int vmmem_verify(struct vm *vm, const char *state_path, int base_fd, uint64_t size, const char *dir,
		 int timeout_ms, struct vmmem_cmp *res, struct kiln_err *err)
{
	int qfd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600), cfd = -1, r = -1;
	void *base = MAP_FAILED;

	if (qfd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", dir, strerror(errno));
	if (snapshot_save_fd(vm, qfd, timeout_ms, err) < 0)
		goto out;
	cfd = open(state_path, O_RDONLY | O_CLOEXEC);
	base = mmap(NULL, size, PROT_READ, MAP_SHARED, base_fd, 0);
	if (cfd < 0 || base == MAP_FAILED || lseek(qfd, 0, SEEK_SET) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "opening the streams to compare: %s", strerror(errno));
		goto out;
	}
	if (vmmem_compare(fd_read, &qfd, fd_read, &cfd, "mem", base, size, res, err) < 0)
		goto out;
	if (res->differ) {
		kiln_err_set(err, KERR_SNAPSHOT_ERROR,
			     "the fast save differs from QEMU's own in %llu of %llu pages (the first at 0x%llx)",
			     (unsigned long long)res->differ, (unsigned long long)res->pages,
			     (unsigned long long)res->first_diff);
		goto out;
	}
	r = 0;
out:
	if (base != MAP_FAILED)
		munmap(base, size);
	if (cfd >= 0)
		close(cfd);
	close(qfd);
	return r;
}
