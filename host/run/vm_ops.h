/* vm_ops: the seam between kiln-host's daemon logic (hostd's task lifecycle
 * and recovery, the warm pool) and the modules that touch QEMU and S3
 * (run.c, snapshot.c, vm.c, lib/s3.c). hostd and the pool reach VMs, runs
 * and uploads only through the table they were opened with: kiln-host passes
 * vm_ops_real, which forwards to those modules; the unit tests
 * (tests/unit/test_hostd.c, test_pool.c) pass fakes that need no root, no
 * QEMU and no S3.
 *
 * Every callback gets the table's ctx first; the rest of the arguments and
 * the return values are exactly those of the function it stands for (see
 * run.h, snapshot.h, vm.h, pool.h, s3.h). A table is read-only once made
 * and may be used from any thread. */
#ifndef KILN_VM_OPS_H
#define KILN_VM_OPS_H

#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "run.h"
#include "s3.h"
#include "spec.h"
#include "vm/vm.h"

struct vm_ops {
	/* Tasks (hostd). Run spec to completion in a fresh VM (run_task):
	 * never NULL; the caller owns the result. */
	json_t *(*run_task)(void *ctx, const struct task_spec *spec, const struct run_opts *ro);

	/* VMs of a snapshot (the pool). restore: a running clone of s
	 * (snapshot_restore). spawn: a QEMU waiting in -incoming, no guest memory
	 * touched yet (snapshot_spawn); load: s loaded into such a QEMU, which
	 * then runs (snapshot_load). 0 or -1 with err set; on failure the caller
	 * still destroys vm. */
	int (*restore)(void *ctx, const struct snapshot *s, const struct vm_config *base, struct vm *vm,
		       struct kiln_err *err);
	int (*spawn)(void *ctx, const struct snapshot *s, const struct vm_config *base, struct vm *vm,
		     struct kiln_err *err);
	int (*load)(void *ctx, const struct snapshot *s, struct vm *vm, struct kiln_err *err);
	/* Walk a running VM through a task's paths, running no task code
	 * (pool_warm_up). 0 or -1 with err set. */
	int (*warm_up)(void *ctx, struct vm *vm, struct kiln_err *err);
	/* Stop / continue the guest's vCPUs (QMP stop / cont, 10 s deadline).
	 * resume failing is how a VM that died while paused shows. */
	int (*pause)(void *ctx, struct vm *vm, struct kiln_err *err);
	int (*resume)(void *ctx, struct vm *vm, struct kiln_err *err);
	/* Nice value of QEMU's threads (vm_set_nice): 0 or -errno. */
	int (*set_nice)(void *ctx, const struct vm *vm, int nice);
	/* Kill the VM and release what it took (vm_destroy): safe on a zeroed
	 * or half-started vm, idempotent. */
	void (*destroy)(void *ctx, struct vm *vm);

	/* Where a task's outputs go (hostd's uploads): s3_ensure_bucket and
	 * s3_put_file. 0 or -1 with err set. */
	int (*ensure_bucket)(void *ctx, const struct s3_config *s3, struct kiln_err *err);
	int (*put_file)(void *ctx, const struct s3_config *s3, const char *key, const char *path,
			const char *content_type, char sha256_hex[65], uint64_t *bytes_sent, struct kiln_err *err);

	void *ctx;
};

/* The real operations (vm_ops.c): run.c, snapshot.c, pool.c's warm-up,
 * vm.c and lib/s3.c. */
extern const struct vm_ops vm_ops_real;

#endif
