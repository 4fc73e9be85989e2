/* zygote: a Python interpreter pre-started before a snapshot is taken (PREPARE),
 * with the common modules imported, blocked on a pipe until an EXEC hands it
 * a script. It then becomes the task process itself: it drops to the task's
 * uid, takes the task's cwd and environment, reseeds `random`, and runs the
 * script as __main__. One zygote serves one task; the VM ends with it. */
#ifndef KILN_GUEST_ZYGOTE_H
#define KILN_GUEST_ZYGOTE_H

#include <stdint.h>
#include <sys/types.h>

#include "proto.h"

struct zygote {
	pid_t pid;    /* 0: none */
	int ctl;      /* write end: the request, then EOF */
	int out, err; /* read ends of its stdout/stderr pipes (non-blocking) */
	int ready;    /* read end of its acknowledgements */
};

/* Start the interpreter and wait (until deadline_ms) until it has imported
 * its modules. Returns 0 or a negative errno (the interpreter is then gone). */
int zygote_start(struct zygote *z, int64_t deadline_ms);

/* Whether z has a live interpreter that can take e (python3 + a script). */
int zygote_can_run(const struct zygote *z, const struct proto_exec *e);

/* Hand e (uid, gid, cwd, argv, envp) to the interpreter. On success the
 * interpreter is the task: its pid, the read ends of its stdout/stderr and
 * `done` (non-blocking), where it writes a struct proto_zdone line once the
 * task is over, right before it exits, go to the caller, and z is emptied.
 * Returns 0 or a negative errno (z is then stopped and emptied). */
int zygote_hand_off(struct zygote *z, const struct proto_exec *e, char *const envp[], pid_t *pid, int *out,
		    int *err, int *done);

/* Have the interpreter run a sample script in a throw-away fork, as the
 * task user, with its output discarded: TCG then has the task path
 * translated before a real task arrives (pool VMs). Returns 0 or -errno. */
int zygote_warm(struct zygote *z, int64_t deadline_ms);

/* Kill and forget the interpreter (its zombie is reaped by PID 1's loop). */
void zygote_stop(struct zygote *z);

#endif
