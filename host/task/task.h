/* task: the task room's door (host/task/: hostd, the task engine: its task
 * table, worker threads, spool, uploads to S3, recovery at start-up and
 * metrics). It may call the template, run, vm and net rooms and lib/. Other
 * rooms include this header only; hostd_int.h is the room's own. */
#ifndef KILN_TASK_H
#define KILN_TASK_H

#include "hostd.h"
#include "spool.h"

#endif
