/* task: runs an EXEC request as an unprivileged process tree, streams its
 * output, enforces the output cap, kills it on request, reports EXIT; and
 * reaps every child of PID 1. */
#ifndef KILN_GUEST_TASK_H
#define KILN_GUEST_TASK_H

#include <sys/resource.h>
#include <sys/types.h>

#include "agent.h"
#include "proto.h"

/* PATH a task gets (and is searched for argv[0]) when its env has none. */
#define TASK_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* Runs `e` to completion: STARTED, STDOUT/STDERR frames as output arrives,
 * then EXIT once the main process has exited, every other process of its uid
 * has been killed and both pipes are drained (bounded); or a single ERROR if
 * it could not be started. A KILL frame on the channel kills the task; any
 * other request meanwhile gets ERROR -EBUSY. `e` must stay valid throughout.
 * Returns 0, or a negative errno when the channel failed (fatal). */
int task_run(struct agent *a, const struct proto_exec *e);

/* The guest's OOM-kill count (oom_kill in /proc/vmstat), or -1. */
int64_t task_oom_kills(void);

/* Reaps every child that has exited, without blocking. If `watch` (> 0) is
 * among them, stores its wait status and rusage and returns 1; else 0. The
 * agent calls this whenever SIGCHLD arrives, since PID 1 inherits every
 * orphan and must not let zombies pile up. */
int task_reap(pid_t watch, int *status, struct rusage *ru);

#endif
