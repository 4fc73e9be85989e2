/* session_prestart: one session QEMU started ahead of need (see
 * session_int.h).
 *
 * Starting QEMU (exec, ~50 libraries, its seccomp filter, the jail) is
 * 55-90 ms of every session create and resume under TCG. After a session
 * boots, this thread starts another QEMU with the same configuration in
 * `-incoming defer`, on a fresh overlay of the template's disk, at low
 * priority; the next create or resume on that template takes it and only
 * loads its state.
 *
 * The disk: QEMU opens its images inactive while it waits for an incoming
 * migration, and when the migration ends (`cont`: bdrv_activate) it re-reads
 * the qcow2 header and tables and the file's length. A create renames the
 * fresh overlay into the session's directory; a resume first copies the
 * fetched disk layer into that same inode, so QEMU's open file is the paused
 * session's disk by the time QEMU reads it. */
#include "session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fsutil.h"
#include "metrics.h"
#include "proto.h"

#define PRESTART_NICE 19

/* What makes two session VM configurations interchangeable before their
 * state is loaded: the RAM they map (by inode), its size, the vCPUs and the
 * template's disk chain. Everything else comes from the host's run options,
 * the same for every session. */
static int same_config(const struct prestart_id *a, const struct prestart_id *b)
{
	return a->mem_dev == b->mem_dev && a->mem_ino == b->mem_ino && a->memory_mib == b->memory_mib &&
	       a->vcpus == b->vcpus && !strcmp(a->backing, b->backing) && !strcmp(a->backing2, b->backing2);
}

/* cfg's identity; -1 when it is not one a prestarted VM can serve (a NIC,
 * RAM that is not a mapped file, or an unreadable RAM fd). */
static int config_id(const struct vm_config *cfg, struct prestart_id *id)
{
	struct stat st;

	if (cfg->net || cfg->mem_ram || cfg->mem_fd <= 0 || cfg->mem_share || !cfg->disk_backing ||
	    fstat(cfg->mem_fd, &st) < 0)
		return -1;
	memset(id, 0, sizeof(*id));
	id->mem_dev = st.st_dev;
	id->mem_ino = st.st_ino;
	id->memory_mib = cfg->memory_mib;
	id->vcpus = cfg->vcpus;
	if (snprintf(id->backing, sizeof(id->backing), "%s", cfg->disk_backing) >= (int)sizeof(id->backing) ||
	    snprintf(id->backing2, sizeof(id->backing2), "%s", cfg->disk_backing2 ? cfg->disk_backing2 : "") >=
		    (int)sizeof(id->backing2))
		return -1;
	return 0;
}

/* Destroy the waiting VM, if any (ss->lock not held). */
static void drop_ready(struct session_table *ss)
{
	struct session_prestart *p = &ss->pre;
	char dir[PATH_MAX];
	struct vm vm;

	pthread_mutex_lock(&ss->lock);
	if (!p->ready) {
		pthread_mutex_unlock(&ss->lock);
		return;
	}
	vm = p->vm;
	snprintf(dir, sizeof(dir), "%s", p->dir);
	p->ready = 0;
	pthread_mutex_unlock(&ss->lock);
	vm_destroy(&vm);
	fs_rmtree(dir);
}

/* Start one VM for the request (ss->lock not held). */
static void spawn(struct session_table *ss, struct session_prestart *p, const struct prestart_req *rq)
{
	struct vm_config cfg = rq->cfg;
	struct kiln_err err = { .code = "" };
	char dir[PATH_MAX], disk[PATH_MAX + 16];
	char *argv[] = { "/usr/bin/qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", (char *)rq->id.backing,
			 disk, NULL };
	struct vm vm;

	drop_ready(ss); /* another configuration's */
	snprintf(dir, sizeof(dir), "%s/.prestart-%u", ss->root, ++p->seq);
	snprintf(disk, sizeof(disk), "%s/disk.qcow2", dir);
	fs_rmtree(dir);
	if (mkdir(dir, 0700) < 0) {
		fprintf(stderr, "kiln-host: session prestart: cannot create %s: %s\n", dir, strerror(errno));
		return;
	}
	if (snapshot_run_cmd(argv) < 0) {
		fprintf(stderr, "kiln-host: session prestart: qemu-img create %s failed\n", disk);
		fs_rmtree(dir);
		return;
	}
	cfg.disk = disk;
	cfg.disk_backing = rq->id.backing;
	cfg.disk_backing2 = rq->id.backing2[0] ? rq->id.backing2 : NULL;
	cfg.mem_fd = rq->mem_fd;
	cfg.mem_file = rq->mem_file[0] ? rq->mem_file : NULL;
	cfg.incoming = 1;
	cfg.cancel_fd = -1;
	cfg.vol_dir = dir; /* its volume slots: moved with the overlay to the session that takes it */
	if (vm_start(&cfg, &vm, &err) < 0) {
		fprintf(stderr, "kiln-host: session prestart: %s\n", err.message);
		fs_rmtree(dir);
		return;
	}
	/* Its threads inherited PRESTART_NICE; its jail's CPU weight is what
	 * counts against other VMs' (vm_set_nice): lowered too while it waits. */
	if (__atomic_load_n(&p->renice, __ATOMIC_RELAXED) && vm_set_nice(&vm, PRESTART_NICE) < 0)
		fprintf(stderr, "kiln-host: session prestart: cannot lower a waiting VM's priority\n");
	pthread_mutex_lock(&ss->lock);
	/* A newer request, prestart turned off, or the table closing makes
	 * this one stale. */
	if (ss->stopping || p->want || !p->enabled) {
		pthread_mutex_unlock(&ss->lock);
		vm_destroy(&vm);
		fs_rmtree(dir);
		return;
	}
	p->vm = vm;
	p->id = rq->id;
	snprintf(p->dir, sizeof(p->dir), "%s", dir);
	snprintf(p->disk, sizeof(p->disk), "%s", disk);
	p->ready = 1;
	p->started_total++;
	pthread_mutex_unlock(&ss->lock);
}

static void *prestart_main(void *arg)
{
	struct session_table *ss = arg;
	struct session_prestart *p = &ss->pre;
	id_t self = (id_t)syscall(SYS_gettid);

	/* Its QEMUs inherit this: they wait at the lowest priority and are
	 * raised when taken (only if this process may raise them again). */
	if (setpriority(PRIO_PROCESS, self, 1) == 0 && setpriority(PRIO_PROCESS, self, 0) == 0 &&
	    setpriority(PRIO_PROCESS, self, PRESTART_NICE) == 0)
		__atomic_store_n(&p->renice, 1, __ATOMIC_RELAXED);
	pthread_mutex_lock(&ss->lock);
	for (;;) {
		struct prestart_req rq;

		while (!p->want && !ss->stopping)
			pthread_cond_wait(&p->cond, &ss->lock);
		if (ss->stopping)
			break;
		rq = p->req;
		p->want = 0;
		p->req.mem_fd = -1; /* now rq's */
		pthread_mutex_unlock(&ss->lock);
		spawn(ss, p, &rq);
		close(rq.mem_fd);
		pthread_mutex_lock(&ss->lock);
	}
	if (p->want) {
		close(p->req.mem_fd);
		p->want = 0;
	}
	pthread_mutex_unlock(&ss->lock);
	drop_ready(ss);
	return NULL;
}

int session_prestart_open(struct session_table *ss, struct kiln_err *err)
{
	struct session_prestart *p = &ss->pre;

	p->req.mem_fd = -1;
	pthread_cond_init(&p->cond, NULL);
	if (pthread_create(&p->th, NULL, prestart_main, ss) != 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot start the session prestart thread");
	p->th_on = 1;
	return 0;
}

void session_prestart_close(struct session_table *ss)
{
	struct session_prestart *p = &ss->pre;

	if (!p->th_on)
		return;
	pthread_mutex_lock(&ss->lock);
	ss->stopping = 1;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&ss->lock);
	pthread_join(p->th, NULL);
	pthread_cond_destroy(&p->cond);
	p->th_on = 0;
}

int session_prestart_take(struct session_table *ss, const struct vm_config *cfg, struct vm *vm, char *disk,
			  size_t disk_cap, char *dir, size_t dir_cap)
{
	struct session_prestart *p = &ss->pre;
	struct prestart_id id;
	int r = -1;

	if (config_id(cfg, &id) < 0)
		return -1;
	pthread_mutex_lock(&ss->lock);
	if (p->ready && poll(&(struct pollfd){ .fd = p->vm.pidfd, .events = POLLIN }, 1, 0) != 0) {
		/* It died while it waited (killed for memory, say): not usable. */
		pthread_mutex_unlock(&ss->lock);
		drop_ready(ss);
		pthread_mutex_lock(&ss->lock);
	}
	if (p->enabled && p->ready && same_config(&p->id, &id)) {
		*vm = p->vm;
		snprintf(disk, disk_cap, "%s", p->disk);
		snprintf(dir, dir_cap, "%s", p->dir);
		p->ready = 0;
		p->taken_total++;
		r = 0;
	} else if (p->enabled) {
		p->missed_total++;
	}
	pthread_mutex_unlock(&ss->lock);
	if (r == 0 && __atomic_load_n(&p->renice, __ATOMIC_RELAXED) && vm_set_nice(vm, 0) < 0)
		fprintf(stderr, "kiln-host: session prestart: cannot raise a taken VM's priority\n");
	return r;
}

void session_prestart_want(struct session_table *ss, const struct vm_config *cfg)
{
	struct session_prestart *p = &ss->pre;
	struct prestart_req rq = { .mem_fd = -1 };

	if (config_id(cfg, &rq.id) < 0)
		return;
	pthread_mutex_lock(&ss->lock);
	if (p->ready && same_config(&p->id, &rq.id) && p->want) {
		close(p->req.mem_fd); /* the waiting VM serves this one: no other */
		p->want = 0;
	}
	if (!p->enabled || !p->th_on || ss->stopping || (p->ready && same_config(&p->id, &rq.id)) ||
	    (p->want && same_config(&p->req.id, &rq.id))) {
		pthread_mutex_unlock(&ss->lock);
		return;
	}
	pthread_mutex_unlock(&ss->lock);
	rq.cfg = *cfg;
	if (snprintf(rq.mem_file, sizeof(rq.mem_file), "%s", cfg->mem_file ? cfg->mem_file : "") >=
	    (int)sizeof(rq.mem_file))
		return;
	/* The request outlives the caller's snapshot reference: its own fd. */
	rq.mem_fd = fcntl(cfg->mem_fd, F_DUPFD_CLOEXEC, 3);
	if (rq.mem_fd < 0)
		return;
	pthread_mutex_lock(&ss->lock);
	if (p->want)
		close(p->req.mem_fd);
	p->req = rq;
	p->want = 1;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&ss->lock);
}

void sessions_set_prestart(struct session_table *ss, int on)
{
	pthread_mutex_lock(&ss->lock);
	ss->pre.enabled = on;
	if (!on && ss->pre.want) {
		close(ss->pre.req.mem_fd);
		ss->pre.want = 0;
	}
	pthread_mutex_unlock(&ss->lock);
	if (!on)
		drop_ready(ss);
}

int session_prestart_disk(const char *fetched, const char *disk, struct kiln_err *err)
{
	int in = -1, out = -1, r = -1;
	struct stat st;
	off_t left;

	in = open(fetched, O_RDONLY | O_CLOEXEC);
	if (in < 0 || fstat(in, &st) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", fetched, strerror(errno));
		goto out;
	}
	/* The same inode QEMU holds open: truncated and written in place. */
	out = open(disk, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
	if (out < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", disk, strerror(errno));
		goto out;
	}
	for (left = st.st_size; left > 0;) {
		ssize_t n = copy_file_range(in, NULL, out, NULL, (size_t)left, 0);

		if (n <= 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "copying %s: %s", fetched, n < 0 ? strerror(errno) : "short");
			goto out;
		}
		left -= n;
	}
	r = 0;
out:
	if (in >= 0)
		close(in);
	if (out >= 0 && close(out) < 0 && r == 0)
		r = kiln_err_set(err, KERR_HOST_ERROR, "writing %s: %s", disk, strerror(errno));
	return r;
}

static const struct metric m_prestarted = {
	.name = "kiln_host_session_prestarted", .type = METRIC_GAUGE,
	.help = "Session QEMUs started ahead, waiting for a create or resume.",
};
static const struct metric m_prestart_total = {
	.name = "kiln_host_session_prestart_total", .type = METRIC_COUNTER, .labels = { "result" },
	.help = "Session boots by whether they found a prestarted QEMU.",
};

void session_prestart_metrics(struct session_table *ss, struct buf *b)
{
	static const char *const results[] = { "taken", "missed" };
	struct session_prestart *p = &ss->pre;

	pthread_mutex_lock(&ss->lock);
	metric_write(b, &m_prestarted, (uint64_t)p->ready);
	metric_write_by(b, &m_prestart_total, results, (uint64_t[]){ p->taken_total, p->missed_total }, 2);
	pthread_mutex_unlock(&ss->lock);
}
