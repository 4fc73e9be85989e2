/* agent: serves the host-guest protocol (lib/proto.h) on the host channel:
 * receive buffer and frame dispatch, SETUP, the FILE state machine, and the
 * helpers task.c and collect.c use to talk to the host. */
#ifndef KILN_GUEST_AGENT_H
#define KILN_GUEST_AGENT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "interp.h"

#include "proto.h"

/* Opaque: one per channel. */
struct agent;

/* Paths and owner the agent uses; tests can point them elsewhere. */
struct agent_config {
	const char *output_dir; /* COLLECT walks this ("/output") */
	uint32_t file_uid, file_gid; /* owner of FILE files and the dirs made for them (1000) */
	pid_t envd_sup;              /* envd's supervisor (envd_spawn); it and its children are ours */
	struct interp interp;        /* the template's code interpreter (interp_spawn), if any */
};

/* Takes over `chan` (a connected stream: the virtio-serial port, or one end
 * of a socketpair in a test; made non-blocking here) and blocks SIGCHLD and
 * SIGIO in the calling process, which must be single-threaded, to read them
 * from a signalfd. Returns NULL with errno set on failure. The agent owns
 * chan from then on; free it with agent_destroy(). */
struct agent *agent_create(int chan, const struct agent_config *cfg);

/* Closes the channel and the signalfd and frees the agent. */
void agent_destroy(struct agent *a);

/* Sends HELLO {PROTO_VERSION, features 0, uname -r}. Returns 0 or a negative
 * errno when the channel failed. */
int agent_hello(struct agent *a);

/* Serves requests until the channel fails; reaps every child meanwhile (the
 * agent may be PID 1). Returns only a negative errno: the caller should end
 * the VM. */
int agent_serve(struct agent *a);

/* ---- for task.c and collect.c ----------------------------------------- */

/* The guest's OOM-kill count to compare a task's end against (task.c). */
int64_t *agent_oom_baseline(struct agent *a);

/* The interpreter PREPARE pre-started (pid 0 when there is none). */
struct zygote *agent_zygote(struct agent *a);

/* A buffer of PROTO_MAX_PAYLOAD bytes in which a caller may build or read a
 * payload and then pass it to agent_send() without a copy. Its contents are
 * lost on any agent_send*() call. */
uint8_t *agent_payload(struct agent *a);

/* Sends one frame, waiting as long as it takes for the host to take it (the
 * host always reads; while it is disconnected the guest waits for it to come
 * back). payload may be agent_payload(a). Returns 0 or a negative errno only
 * when the channel failed (fatal). */
int agent_send(struct agent *a, uint8_t type, const void *payload, size_t len);

/* Sends ERROR {code, message}; code is a negative errno. Same return as
 * agent_send(). */
int agent_send_error(struct agent *a, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The channel fd to poll for POLLIN, or -1 while the host is disconnected
 * (a disconnected port polls as readable forever; the agent learns of the
 * reconnection from SIGIO on the signalfd instead). */
int agent_chan_pollfd(struct agent *a);

/* The signalfd (SIGCHLD, SIGIO) to poll for POLLIN. */
int agent_sigfd(struct agent *a);

/* Call when agent_sigfd() is readable: empties it and notices a host that
 * came back. The caller then reaps children. Returns 0 or a negative errno. */
int agent_signals(struct agent *a);

/* poll(p, n, timeout) where p[0] is agent_sigfd(), then agent_signals when
 * it is readable. 1: signals were read (the caller then reaps children);
 * 0: none (an interrupted poll is this too, every revents 0 as after a
 * timeout); or a negative errno. */
int agent_poll(struct agent *a, struct pollfd *p, nfds_t n, int timeout);

/* Call when agent_chan_pollfd() is readable: reads what the channel holds.
 * Returns 0 or a negative errno when the channel failed (fatal). A hang-up
 * is not an error: the agent waits for the host to reconnect. */
int agent_read(struct agent *a);

/* Takes the next complete frame out of the receive buffer into *f. Returns
 * 1 (f->payload stays valid until the next agent_read()), 0 when no complete
 * frame is buffered, or a negative errno when the channel failed. A frame
 * that can never be valid gets an ERROR and the receive buffer is dropped. */
int agent_next_frame(struct agent *a, struct proto_frame *f);

#endif
