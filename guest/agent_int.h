/* agent_int: what agent.c and agent_chan.c share: the agent itself and the
 * FILE being received. Not for other files: task.c and collect.c use
 * agent.h. */
#ifndef KILN_GUEST_AGENT_INT_H
#define KILN_GUEST_AGENT_INT_H

#include <limits.h>
#include <signal.h>
#include <stdint.h>

#include "agent.h"
#include "proto.h"
#include "zygote.h"

/* A FILE being received: its FILE_DATA frames are expected next. */
struct agent_file {
	int active;
	int fd;     /* -1 once a failure was reported: the rest is skipped */
	int dirfd;  /* the parent, to unlink a partial file */
	uint64_t left;
	char name[NAME_MAX + 1];
	char path[PROTO_MAX_PATH + 1];
};

struct agent {
	int chan;
	int sigfd;
	int connected; /* the host end of the port is open */
	sigset_t sigio;
	struct agent_config cfg;
	struct agent_file file;
	size_t rx_start, rx_end; /* unparsed bytes are rx[rx_start, rx_end) */
	uint8_t rx[PROTO_MAX_FRAME];
	uint8_t tx[PROTO_MAX_FRAME];
	struct proto_exec exec; /* ~150 KiB: too big for the stack */
	struct zygote zygote;   /* the pre-started interpreter (PREPARE), if any */
	int64_t oom_baseline;   /* guest OOM kills before the next task (task.c) */
	int refused;            /* an ERROR was sent since the last EXEC (PROTO_EXEC_IF_OK) */
};

/* ---- agent_chan.c ---- */

/* Sends OK {type}. Same return as agent_send(). */
int agent_send_ok(struct agent *a, uint8_t type);
/* A FILE's state back to idle (its fds closed). */
void agent_file_reset(struct agent_file *f);
/* Removes the partial file; the state stays active so that the FILE_DATA
 * frames still in flight are skipped. */
void agent_file_drop(struct agent_file *f);

#endif
