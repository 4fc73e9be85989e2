/* Input for a child's stdin that it has not taken yet.
 *
 * kiln-init writes a process's input (a pipe's write end or a terminal's
 * master, non-blocking) as it arrives from the host; what the process does
 * not take at once waits here, bounded by the caller, and is written when
 * poll says the descriptor takes more. Used by the task runner (task.c)
 * and envd's processes (envd.c). Calls nothing above lib/. */
#ifndef KILN_GUEST_INQ_H
#define KILN_GUEST_INQ_H

#include <stddef.h>
#include <stdint.h>

struct inq {
	int fd;       /* the process's input, -1 once closed */
	int eof;      /* close fd once what waits is written (a pipe's end of input) */
	uint8_t *buf; /* what waits; allocated when needed, freed when drained */
	size_t len;
	size_t cap;   /* most that may wait (allocated at once, when needed) */
	int shut;     /* fd is a socket's duplicate: its end is shutdown(SHUT_WR), then close */
	int failed;   /* fd was closed because the reader went away (EPIPE, EIO) */
};

/* An empty queue for fd (-1: none) holding at most cap bytes. */
void inq_init(struct inq *q, int fd, size_t cap);

/* n bytes for the process: written at once as far as fd takes them, the
 * rest queued up to room more bytes (room <= what cap leaves: the caller's
 * own bound, such as a total over processes). Returns the bytes dropped for
 * want of room or memory; 0 when everything was written or queued. Nothing
 * is written or queued once fd is closed or eof is set. */
size_t inq_put(struct inq *q, const uint8_t *data, size_t n, size_t room);

/* Writes what waits, as far as fd takes it now. fd is closed (and what
 * waits dropped) when the reader is gone (EPIPE, EIO) and, with eof set,
 * once nothing waits. */
void inq_flush(struct inq *q);

/* The end of input: fd is closed once what waits is written. */
void inq_end(struct inq *q);

/* Closes fd and drops what waits. */
void inq_close(struct inq *q);

/* Bytes the queue can still take (cap less what waits); 0 once closed. */
size_t inq_room(const struct inq *q);

#endif
