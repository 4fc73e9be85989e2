/* io: the one write-all / read-all loop over a file descriptor, shared by the
 * host, the API, the CLI and the static guest (kiln-init links lib/io.c).
 * io_write_all is for blocking fds; io_write_all_deadline also copes with
 * non-blocking fds (poll() for POLLOUT) and gives up at a CLOCK_MONOTONIC
 * deadline: it is the loop under proto_write_all/proto_send. No allocation
 * except in io_read_file. io_child_reset: a forked child's clean start. */
#ifndef KILN_IO_H
#define KILN_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Write all n bytes to a blocking fd, retrying on EINTR and short writes.
 * 0, or a negative errno (-EIO if write() returned 0). Any thread. */
int io_write_all(int fd, const void *p, size_t n);

/* Wait with poll() until fd has one of events (POLLIN, POLLOUT) or
 * deadline_ms (clock_mono_ms() milliseconds) passes. 0 when ready (or on
 * an error or hang-up of fd: the next read or write says which),
 * -ETIMEDOUT, or a negative errno. Any thread. */
int io_wait(int fd, short events, int64_t deadline_ms);

/* Write all n bytes to a blocking or non-blocking fd; on EAGAIN wait with
 * poll() until deadline_ms (clock_mono_ms() milliseconds; <= 0: no deadline).
 * 0, -ETIMEDOUT, or a negative errno. Any thread. */
int io_write_all_deadline(int fd, const void *p, size_t n, int64_t deadline_ms);

/* Read until n bytes are in p or end of file, retrying on EINTR. Returns the
 * number of bytes read (< n only at end of file) or a negative errno. */
ssize_t io_read_all(int fd, void *p, size_t n);

/* Read a small file (/proc, /sys) with one read() into buf[cap] and
 * NUL-terminate it. Returns the length (> 0), or -1: no such file, empty, or
 * unreadable. No allocation: safe in the guest and in hot paths. */
ssize_t io_read_small(const char *path, char *buf, size_t cap);

/* Read a whole file ("-": standard input) of at most max bytes into a malloc'd, NUL-terminated
 * buffer the caller frees; *len (may be NULL) gets its length. Returns NULL
 * with errno set (EFBIG past max). Any thread. */
char *io_read_file(const char *path, size_t max, size_t *len);

/* Copy len bytes of in from offset off to out at the same offset, in the
 * kernel: copy_file_range, or sendfile where that refuses (across file
 * systems: a file and a memfd). Neither fd's position is used but out's,
 * which the fallback moves. 0, or a negative errno (-EIO: in ended early).
 * Any thread. */
int io_copy_at(int in, int out, uint64_t off, uint64_t len);

/* In a forked child, before exec: no signal blocked (the parent may block
 * those it reads from a signalfd) and stdin on /dev/null (left as it is
 * when that cannot be opened). For the daemons the CLI starts and QEMU. */
void io_child_reset(void);

#endif
