/* io: write-all / read-all loops over a file descriptor, and a forked
 * child's clean start (lib/io.h). Built into libkiln and into the static
 * guest, so it uses libc only. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include "clock.h"

int io_write_all(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n > 0) {
		ssize_t w = write(fd, c, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

int io_wait(int fd, short events, int64_t deadline_ms)
{
	for (;;) {
		int64_t left = deadline_ms - clock_mono_ms();
		struct pollfd pf = { .fd = fd, .events = events };
		int rc;

		if (left <= 0)
			return -ETIMEDOUT;
		/* Bounded so a clock that moved is noticed. */
		rc = poll(&pf, 1, left > 60000 ? 60000 : (int)left);
		if (rc > 0)
			return 0;
		if (rc < 0 && errno != EINTR)
			return -errno;
	}
}

int io_write_all_deadline(int fd, const void *p, size_t n, int64_t deadline_ms)
{
	const char *c = p;

	while (n > 0) {
		ssize_t w = write(fd, c, n);

		if (w > 0) {
			c += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };
			int timeout = -1;

			if (deadline_ms > 0) {
				int64_t left = deadline_ms - clock_mono_ms();

				if (left <= 0)
					return -ETIMEDOUT;
				/* Bounded so a clock that moved is noticed. */
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

ssize_t io_read_all(int fd, void *p, size_t n)
{
	char *c = p;
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, c + got, n - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

ssize_t io_read_small(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0 || cap < 2) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	do
		n = read(fd, buf, cap - 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return n;
}

char *io_read_file(const char *path, size_t max, size_t *len)
{
	size_t cap = 4096, got = 0;
	char *p = NULL, *np;
	int fd, saved;
	ssize_t r;

	fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
	if (fd < 0)
		return NULL;
	for (;;) {
		if (!p || got == cap - 1) {
			if (p)
				cap *= 2;
			np = realloc(p, cap);
			if (!np) {
				errno = ENOMEM;
				goto fail;
			}
			p = np;
		}
		r = io_read_all(fd, p + got, cap - 1 - got);
		if (r < 0) {
			errno = (int)-r;
			goto fail;
		}
		got += (size_t)r;
		if (got > max) {
			errno = EFBIG;
			goto fail;
		}
		if (got < cap - 1)
			break; /* end of file */
	}
	if (fd != STDIN_FILENO)
		close(fd);
	p[got] = 0;
	if (len)
		*len = got;
	return p;
fail:
	saved = errno;
	free(p);
	if (fd != STDIN_FILENO)
		close(fd);
	errno = saved;
	return NULL;
}

void io_child_reset(void)
{
	sigset_t none;
	int fd;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	fd = open("/dev/null", O_RDONLY);
	if (fd >= 0) {
		dup2(fd, 0);
		close(fd);
	}
}

int io_copy_at(int in, int out, uint64_t off, uint64_t len)
{
	off_t at_in = (off_t)off, at_out = (off_t)off;
	int fallback = 0;

	while (len) {
		size_t want = len > (1u << 30) ? 1u << 30 : (size_t)len;
		ssize_t n;

		if (!fallback) {
			n = copy_file_range(in, &at_in, out, &at_out, want, 0);
			if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
				fallback = 1;
				if (lseek(out, at_out, SEEK_SET) < 0)
					return -errno;
				continue;
			}
		} else {
			n = sendfile(out, in, &at_in, want);
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		len -= (uint64_t)n;
	}
	return 0;
}
