/* io: whole reads and writes on file descriptors, the loops every module
 * needs once: EINTR retried, short writes continued, EAGAIN on a non-blocking
 * fd waited out with poll() up to a deadline. Used by the host, kiln-api, the
 * CLI and kiln-init (lib/io.c is linked into the static guest binary). */
#ifndef KILN_IO_H
#define KILN_IO_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* Write all n bytes of p to fd. On a non-blocking fd, EAGAIN waits for
 * POLLOUT until deadline_ms (clock_mono_ms(); 0: no deadline). Returns 0,
 * -ETIMEDOUT, -EIO (write returned 0) or the negative errno of write/poll. */
int io_write_all(int fd, const void *p, size_t n, int64_t deadline_ms);

/* Read fd to its end, appending to out (whose max, if any, bounds the read:
 * -E2BIG when fd holds more). Blocking fds only. Returns 0 or a negative
 * errno; out keeps what was read either way (the caller frees it). */
int io_read_fd(int fd, struct buf *out);

/* Open path (read-only, O_CLOEXEC; "-" is stdin) and io_read_fd() it, refusing
 * anything that is not a regular file, pipe or character device (a directory,
 * a socket) with -EINVAL. */
int io_read_path(const char *path, struct buf *out);

#endif
