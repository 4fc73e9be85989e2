/* run: execute one task spec in a fresh VM and build its result.
 *
 * Room: the run room's door (host/run/: one task in one VM, the warm pool and
 * its capacity, the vm_ops seam, the task's output directory and text caps).
 * It may call the vm and net rooms, lib/ and jail/. The headers included at
 * the end are part of this door. */
#ifndef KILN_RUN_H
#define KILN_RUN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "err.h"
#include "net/net.h"
#include "pool.h"
#include "spec.h"
#include "vm/vm.h"

struct run_opts {
	struct vm_config vm;       /* image paths, accel, run dir (vcpus/memory come from the spec) */
	const struct snapshot *snap; /* restore from it when its memory/vCPUs match the spec (NULL: cold) */
	const struct snapshot *net_snap; /* the same with a NIC, for tasks with egress (NULL: cold) */
	struct net_host *net;      /* egress set-up (NULL or disabled: tasks asking for egress fail) */
	struct pool *pool;         /* take a warm VM from it first when it matches (NULL: none) */
	struct capacity *cap;      /* reserve the task's memory here unless a pool VM brings its
				    * own reservation (NULL: no accounting); released at the end */
	const char *output_dir;    /* write /output files here (NULL: hash only) */
	FILE *stream;              /* NULL, or write stdout/stderr events here as JSON lines */
	int boot_timeout_s;        /* cold boot to kiln-init ready */
	/* 0: the result holds all of stdout/stderr (up to the output limit). N:
	 * only the first and the last N bytes of each (stdout, stdout_tail): the
	 * caller keeps the whole streams itself (on_event; kiln-host's spool and
	 * S3). run_task's memory for them is then at most 4 N bytes. */
	size_t log_excerpt;
	int prereserved;           /* the caller already reserved the task's memory in cap (and
				    * releases it): a pool VM's own reservation is dropped */
	/* NULL, or where run_task may leave the task's VM, already sent SIGKILL,
	 * instead of reaping it itself: the caller then destroys it (vm_destroy)
	 * while the outputs go up, and holds the task's reservation until then.
	 * Only with prereserved, without egress and when QEMU was started;
	 * otherwise the VM is destroyed inside and *keep_vm left as it was. */
	struct vm *keep_vm;
	/* NULL, or called on the running thread as the task progresses: RUN_EV_RUNNING
	 * (struct run_started) when the code has started, RUN_EV_STDOUT/STDERR with
	 * the raw bytes as they arrive (already bounded by the output limit),
	 * RUN_EV_EXITED when it ended; RUN_EV_BLOCKED (struct run_blocked) on
	 * another thread. The task's timeout is enforced on the running thread
	 * between calls: a callback must not wait past run_started.deadline_ms
	 * (it may, until then, to slow the task down for a slow consumer). */
	void (*on_event)(void *ctx, int event, const void *data, size_t len);
	void *event_ctx;
	/* A session's interactive command (run_session_exec only): extra_flags
	 * PROTO_EXEC_STDIN or PROTO_EXEC_TTY (with tty_rows x tty_cols); and
	 * input_fd (> 0), a non-blocking pipe of whole STDIN/RESIZE frames, each
	 * written at once, passed on to the guest while the command runs.
	 * exec_id is RUN_EV_RUNNING's exec_id (NUL-terminated), or NULL. */
	unsigned extra_flags;
	uint32_t tty_rows, tty_cols;
	int input_fd;
	const char *exec_id;
	/* What a guest's /output may make on this host, whatever the guest says:
	 * files plus directories, and path components (0: RUN_OUT_MAX_ENTRIES,
	 * RUN_OUT_MAX_DEPTH). Past either, nothing more is created, the rest of
	 * the walk is read and dropped, and the result says output_limit. */
	uint32_t out_max_entries, out_max_depth;
	/* The user every EXEC runs as: user_set 0 means the guest's unprivileged
	 * `sandbox` user (1000:1000); a template may name another (an OCI
	 * image's User, root in a build VM). */
	int user_set;
	uint32_t uid, gid;
};

/* Defaults of run_opts.out_max_*: what an honest kiln-init ever sends
 * (guest/collect.h: 100000 entries, directories 32 levels deep). */
#define RUN_OUT_MAX_ENTRIES 100000u
#define RUN_OUT_MAX_DEPTH   32u

enum run_event { RUN_EV_RUNNING, RUN_EV_STDOUT, RUN_EV_STDERR, RUN_EV_EXITED, RUN_EV_BLOCKED };
/* RUN_EV_RUNNING's data. */
struct run_started {
	const char *exec_id;  /* opts->exec_id (NULL: none) */
	int64_t deadline_ms;  /* when the task's timeout_s is up (CLOCK_MONOTONIC ms, proto_now_ms) */
};
/* RUN_EV_BLOCKED's data: a destination the sandbox's network dropped. It
 * comes from the network's own thread, not the task's. */
struct run_blocked {
	const char *destination; /* dotted quad */
	unsigned port;           /* 0 for ICMP and others */
	const char *protocol;    /* "tcp", "udp", "icmp" or "other" */
};

/* Run spec to completion and return the result object (see docs/api.md,
 * "Task result"): never NULL, also for infrastructure errors, which yield
 * state "error". The caller owns the returned reference. */
json_t *run_task(const struct task_spec *spec, const struct run_opts *opts);

/* Sessions (host/session/session.c): run one command of spec (its files, then its
 * argv; no COLLECT) in vm, a running VM that outlives it: processes the
 * command leaves running are kept (PROTO_EXEC_KEEP). Returns a result like
 * run_task's without "outputs"; state "error" with end_reason "vm_error"
 * means the VM is no longer usable. Uses opts->vm.cancel_fd, on_event and
 * stream. One caller per vm at a time. */
json_t *run_session_exec(struct vm *vm, const struct task_spec *spec, const struct run_opts *opts);

/* Write one file (absolute guest path, created with its directories, owned
 * by the task's user) into a session's VM. 0 or -1 with err set. */
int run_session_put(struct vm *vm, const char *path, const void *data, size_t len, uint32_t mode, struct kiln_err *err);

/* COLLECT vm's /output into outdir (created; at most budget bytes, and
 * lim's out_max_entries/out_max_depth, lim may be NULL): the outputs array
 * ({path, size, sha256}), or NULL with err set. *truncated (may be NULL) is
 * set when files were left out (the budget, the guest's or the host's
 * limits). */
json_t *run_session_collect(struct vm *vm, const char *outdir, uint64_t budget, const struct run_opts *lim,
			    int *truncated, struct kiln_err *err);

/* A host-side view of a finished task, shared with the result encoder. */
enum run_state { RUN_SUCCEEDED, RUN_FAILED, RUN_TIMED_OUT, RUN_ERROR };

/* The rest of the door: the room's other modules other rooms use. */
#include "outdir.h"
#include "textbuf.h"
#include "vm_ops.h"

#endif
