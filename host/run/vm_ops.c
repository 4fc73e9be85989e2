/* vm_ops: the real table, each entry forwarding to the module that does the
 * work (see vm_ops.h). */
#include "vm_ops.h"

#include "clock.h"
#include "pool.h"

#define QMP_PAUSE_TIMEOUT_MS 10000

static json_t *real_run_task(void *ctx, const struct task_spec *spec, const struct run_opts *ro)
{
	(void)ctx;
	return run_task(spec, ro);
}

static int real_restore(void *ctx, const struct snapshot *s, const struct vm_config *base, struct vm *vm,
			struct kiln_err *err)
{
	(void)ctx;
	return snapshot_restore(s, base, vm, err);
}

static int real_spawn(void *ctx, const struct snapshot *s, const struct vm_config *base, struct vm *vm,
		      struct kiln_err *err)
{
	(void)ctx;
	return snapshot_spawn(s, base, vm, err);
}

static int real_load(void *ctx, const struct snapshot *s, struct vm *vm, struct kiln_err *err)
{
	(void)ctx;
	return snapshot_load(s, vm, err);
}

static int real_warm_up(void *ctx, struct vm *vm, struct kiln_err *err)
{
	(void)ctx;
	return pool_warm_up(vm, err);
}

static int real_pause(void *ctx, struct vm *vm, struct kiln_err *err)
{
	(void)ctx;
	return vm_qmp(vm, "{\"execute\":\"stop\"}", clock_mono_ms() + QMP_PAUSE_TIMEOUT_MS, NULL, err);
}

static int real_resume(void *ctx, struct vm *vm, struct kiln_err *err)
{
	(void)ctx;
	return vm_qmp(vm, "{\"execute\":\"cont\"}", clock_mono_ms() + QMP_PAUSE_TIMEOUT_MS, NULL, err);
}

static int real_set_nice(void *ctx, const struct vm *vm, int nice)
{
	(void)ctx;
	return vm_set_nice(vm, nice);
}

static void real_destroy(void *ctx, struct vm *vm)
{
	(void)ctx;
	vm_destroy(vm);
}

static int real_ensure_bucket(void *ctx, const struct s3_config *s3, struct kiln_err *err)
{
	(void)ctx;
	return s3_ensure_bucket(s3, err);
}

static int real_put_file(void *ctx, const struct s3_config *s3, const char *key, const char *path,
			 const char *content_type, char sha256_hex[65], uint64_t *bytes_sent, struct kiln_err *err)
{
	(void)ctx;
	return s3_put_file(s3, key, path, content_type, sha256_hex, bytes_sent, err);
}

const struct vm_ops vm_ops_real = {
	.run_task = real_run_task,
	.restore = real_restore,
	.spawn = real_spawn,
	.load = real_load,
	.warm_up = real_warm_up,
	.pause = real_pause,
	.resume = real_resume,
	.set_nice = real_set_nice,
	.destroy = real_destroy,
	.ensure_bucket = real_ensure_bucket,
	.put_file = real_put_file,
	.ctx = 0,
};
