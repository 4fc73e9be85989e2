/* vmmem: a session VM's RAM read and written from kiln-host, in QEMU's
 * address space (process_vm_readv/writev, /proc/<pid>/pagemap), where
 * QEMU's own save and load would take a user-mode page fault per page
 * (12-15 us each on the virtualised hosts measured). The resume's page
 * loader writes the changed pages in; a pause reads them out
 * (vmmem_save_fast): QEMU writes only its devices' state and the stream is
 * composed around it (migfilter_compose_run). */
#ifndef KILN_VMMEM_H
#define KILN_VMMEM_H

#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "phash.h"
#include "migfilter.h"
#include "vm.h"

/* Whether this host lets kiln-host read and write another process's memory
 * (Yama's ptrace_scope 3 or an LSM may not): probed once, on a child of its
 * own, and said once on stderr when not. Any thread. */
int vmmem_usable(void);

/* Where QEMU (pid) maps the RAM file fd (whole, from offset 0, size bytes):
 * the address, or 0. */
uintptr_t vmmem_find_ram(pid_t pid, int fd, uint64_t size);

/* A running session VM's pause without QEMU's walk of its RAM: */
struct vmmem_save {
	struct vm *vm;
	const char *tpl_path;  /* the session's snapshot's state stream (the template) */
	int base_fd;           /* the RAM file QEMU maps copy-on-write */
	uint64_t size;
	/* 1: QEMU keeps its disks active after saving its devices, for QEMU's
	 * own save of the same VM that follows (vmmem_verify: QEMU 7.2 aborts
	 * on releasing them twice); that save releases them. */
	int disks_stay;
	/* A delta pause (NULL: every private page goes): a private page whose
	 * hash is the table's is left out (the chunks already in S3 hold it);
	 * a page the table has that is no longer private goes as the base's
	 * (it reads as the base's now). */
	const struct phash *delta;
	/* The file QEMU maps the RAM from, when it is not base_fd (-1: it is):
	 * a fork child's maps its parent's RAM as it was at the copy, while
	 * base_fd stays the template's RAM that the manifests name. */
	int map_fd;
	/* Pages read even where QEMU holds no private copy (NULL: none): they
	 * read as map_fd's, which differs from the base there (a fork child's
	 * parent's pages). A finished table. */
	const struct phash *also;
	/* A copy of the RAM as it is saved, for a fork's children on this host
	 * (copy_fd -1: none): each page read is written to copy_fd at its
	 * offset (which holds map_fd's pages already) and its hash added to
	 * copy_pages (not finished). */
	int copy_fd;
	struct phash *copy_pages;
	/* Called with 0 just before the block's first page goes to the writer
	 * and with 1 just after its last: the writer cuts its chunks there. */
	int (*mark)(void *ctx, int phase);
	void *mark_ctx;
	/* filled by vmmem_save_open */
	uintptr_t ram;
	int pm_fd, tpl_fd;
	/* filled by vmmem_save_fast */
	uint64_t private_pages; /* pages QEMU holds a private copy of (read; sent unless the delta's) */
	uint64_t pages_same;    /* of those, left out of a delta: as in the table */
	uint64_t pages_gone;    /* the table's pages no longer private, sent as the base's */
	int64_t ms_devices, ms_pages; /* QEMU's device state; the pages read and composed */
};

/* Check everything the fast save needs while the VM still runs: access to
 * its memory, the RAM mapping in QEMU, the template stream (it lists the
 * block with this size). 0, or -1 with err (then save it the usual way). */
int vmmem_save_open(struct vmmem_save *sv, struct kiln_err *err);

/* Stop the VM, have QEMU write its devices' state (xen-save-devices-state
 * into a memfd; its disks flushed and released, as after a migration), and
 * write the composed stream to wr: the pages QEMU holds a private copy of
 * (every page the VM wrote), everything else from the template and the
 * device state. Returns 0;
 * -1 with *qemu_failed set when QEMU did not save its devices (the VM may be
 * stopped: save it the usual way, or give it up); -1 with *qemu_failed 0
 * when the stream could not be written (the VM is saved and stopped, whole:
 * it can go on). */
int vmmem_save_fast(struct vmmem_save *sv, int64_t deadline_ms, migfilter_write_fn wr, void *wctx,
		    struct migfilter_stats *st, int *qemu_failed, struct kiln_err *err);

void vmmem_save_close(struct vmmem_save *sv);

/* After vmmem_save_open, while the VM may still run: each run of pages
 * QEMU holds a private copy of now (or that `also` names), as fn(ctx,
 * offset, length) in address order (a fork prepares its copy's pages out
 * of the stop). 0, or -1 with err (fn's -1 stops the walk). */
int vmmem_private_runs(struct vmmem_save *sv, int (*fn)(void *ctx, uint64_t off, uint64_t len), void *ctx,
		       struct kiln_err *err);

/* ---- checking a fast save against QEMU's own (sessions.save_pages 2) ----
 * One RAM block, page by page: every page of QEMU's full stream (qemu_rd:
 * it must carry each page of the block) against the composed stream's page
 * (cmp_rd), or the base's where the composed stream leaves it out. Holds a
 * copy of QEMU's non-zero pages meanwhile (up to size bytes, anonymous). */
struct vmmem_cmp {
	uint64_t pages;      /* pages of the block compared */
	uint64_t in_stream;  /* of those, carried by the composed stream */
	uint64_t differ;     /* pages whose bytes differ */
	uint64_t first_diff; /* the first one's offset (when differ) */
};

/* 0 with res filled (res->differ may be nonzero: the caller decides), or -1
 * with err when a stream does not parse or QEMU's lacks a page. */
int vmmem_compare(migfilter_read_fn qemu_rd, void *qemu_ctx, migfilter_read_fn cmp_rd, void *cmp_ctx,
		  const char *block, const uint8_t *base, uint64_t size, struct vmmem_cmp *res, struct kiln_err *err);

/* Have QEMU save the stopped VM whole into an unnamed file in dir (up to
 * its RAM size on disk, gone when the call returns; the fast save must have
 * left its disks active: disks_stay), and compare it with the
 * composed stream in state_path and the base (base_fd, size bytes). 0 when
 * every page matches (res filled); -1 with err (KERR_SNAPSHOT_ERROR naming
 * how many pages differ and the first, or why the check could not run). */
int vmmem_verify(struct vm *vm, const char *state_path, int base_fd, uint64_t size, const char *dir,
		 int timeout_ms, struct vmmem_cmp *res, struct kiln_err *err);

#endif
