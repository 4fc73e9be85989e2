/* io: whole reads and writes on file descriptors (lib/io.h). */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"

int io_write_all(int fd, const void *buf, size_t n, int64_t deadline_ms)
{
	const uint8_t *p = buf;

	while (n > 0) {
		ssize_t w = write(fd, p, n);

		if (w > 0) {
			p += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };
			int timeout = -1;

			if (deadline_ms > 0) {
				int64_t left = deadline_ms - clock_mono_ms();

				if (left <= 0)
					return -ETIMEDOUT;
				timeout = left > 60000 ? 60000 : (int)left;
			}
			if (poll(&pfd, 1, timeout) < 0 && errno != EINTR)
				return -errno;
			continue;
		}
		return w < 0 ? -errno : -EIO;
	}
	return 0;
}

int io_read_fd(int fd, struct buf *out)
{
	for (;;) {
		size_t room;
		ssize_t r;
		int rc;

		/* Ask for 64 KiB of room, or what the cap leaves plus one byte
		 * to learn whether the file goes on past it. */
		room = 65536;
		if (out->max) {
			if (out->len >= out->max) {
				char probe;

				do
					r = read(fd, &probe, 1);
				while (r < 0 && errno == EINTR);
				if (r < 0)
					return -errno;
				return r == 0 ? 0 : -E2BIG;
			}
			if (room > out->max - out->len)
				room = out->max - out->len;
		}
		rc = buf_reserve(out, room);
		if (rc < 0)
			return rc;
		r = read(fd, out->p + out->len, room);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return 0;
		out->len += (size_t)r;
		out->p[out->len] = 0;
	}
}

int io_read_path(const char *path, struct buf *out)
{
	struct stat st;
	int fd, rc;

	if (path[0] == '-' && !path[1])
		fd = STDIN_FILENO;
	else if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
		rc = -EINVAL;
		goto out;
	}
	rc = io_read_fd(fd, out);
out:
	if (fd != STDIN_FILENO)
		close(fd);
	return rc;
}
