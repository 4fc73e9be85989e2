/* agent_chan: the agent's channel to the host: the receive buffer and its
 * frames, sending (waiting as long as the host takes), the signalfd, a host
 * that hangs up and comes back, and a partial FILE dropped when it does.
 * agent.c, task.c and collect.c all call into it; it calls none of them. */
#include "agent_int.h"


#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/random.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "collect.h"
#include "io.h"
#include "init.h"
#include "task.h"
#include "zygote.h"

/* ---- sending ------------------------------------------------------------ */

/* Is the host end of the port open? A virtio-serial port whose host side is
 * closed polls POLLHUP (and POLLIN: reads return 0). */
static void agent_check_host(struct agent *a)
{
	struct pollfd p = { .fd = a->chan, .events = POLLIN };

	if (poll(&p, 1, 0) >= 0 && !(p.revents & POLLHUP))
		a->connected = 1;
}

/* Waits until the channel takes more bytes. While the host end is closed the
 * port polls POLLHUP without POLLOUT, so poll() cannot wait for it: wait for
 * the SIGIO the port raises on reconnection (the 1 s timeout is only a safety
 * net), then look again. */
static int agent_wait_writable(struct agent *a)
{
	static const struct timespec recheck = { .tv_sec = 1 };
	struct pollfd p = { .fd = a->chan, .events = POLLOUT };

	for (;;) {
		if (poll(&p, 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (p.revents & POLLOUT)
			return 0;
		if (p.revents & POLLNVAL)
			return -EBADF;
		if (p.revents & POLLERR)
			return -EIO;
		sigtimedwait(&a->sigio, NULL, &recheck);
	}
}

static int agent_write_all(struct agent *a, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(a->chan, p, n);
		int r;

		if (w > 0) {
			p += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN) {
			r = agent_wait_writable(a);
			if (r < 0)
				return r;
			continue;
		}
		return w < 0 ? -errno : -EIO;
	}
	return 0;
}

uint8_t *agent_payload(struct agent *a)
{
	return a->tx + PROTO_HDR_SIZE;
}

int agent_send(struct agent *a, uint8_t type, const void *payload, size_t len)
{
	if (len > PROTO_MAX_PAYLOAD)
		return -EMSGSIZE;
	/* Header and payload in one buffer: each write() to a virtio port is
	 * one virtqueue buffer, so a separate header would double them. */
	if (len && payload != agent_payload(a))
		memmove(agent_payload(a), payload, len);
	proto_frame_header(a->tx, type, (uint32_t)len);
	return agent_write_all(a, a->tx, PROTO_HDR_SIZE + len);
}

int agent_send_error(struct agent *a, int code, const char *fmt, ...)
{
	struct proto_error e;
	va_list ap;
	ssize_t n;

	e.code = code;
	va_start(ap, fmt);
	vsnprintf(e.message, sizeof(e.message), fmt, ap);
	va_end(ap);
	n = proto_error_encode(agent_payload(a), PROTO_MAX_PAYLOAD, &e);
	if (n < 0)
		return (int)n; /* cannot happen: the message is bounded */
	a->refused = 1;
	return agent_send(a, PROTO_ERROR, agent_payload(a), (size_t)n);
}

int agent_send_ok(struct agent *a, uint8_t type)
{
	return agent_send(a, PROTO_OK, &type, 1);
}

void agent_file_reset(struct agent_file *f)
{
	if (f->fd >= 0)
		close(f->fd);
	if (f->dirfd >= 0)
		close(f->dirfd);
	f->fd = -1;
	f->dirfd = -1;
	f->active = 0;
	f->left = 0;
}

/* Removes the partial file; the state stays active so that the FILE_DATA
 * frames still in flight are skipped. */
void agent_file_drop(struct agent_file *f)
{
	if (f->fd < 0)
		return;
	close(f->fd);
	f->fd = -1;
	if (unlinkat(f->dirfd, f->name, 0) < 0 && errno != ENOENT)
		init_log("FILE %s: removing the partial file: %s", f->path, strerror(errno));
}

/* ---- receiving and dispatch ------------------------------------------- */

int agent_chan_pollfd(struct agent *a)
{
	return a->connected ? a->chan : -1;
}

int agent_sigfd(struct agent *a)
{
	return a->sigfd;
}

int agent_signals(struct agent *a)
{
	struct signalfd_siginfo si[8];

	for (;;) {
		ssize_t n = read(a->sigfd, si, sizeof(si));

		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN)
			return -errno;
		break;
	}
	if (!a->connected)
		agent_check_host(a);
	return 0;
}

int agent_poll(struct agent *a, struct pollfd *p, nfds_t n, int timeout)
{
	int r;

	if (poll(p, n, timeout) < 0) {
		if (errno != EINTR)
			return -errno;
		for (nfds_t i = 0; i < n; i++)
			p[i].revents = 0;
		return 0;
	}
	if (!p[0].revents)
		return 0;
	r = agent_signals(a);
	return r < 0 ? r : 1;
}

/* The host closed its end. A restored snapshot clone may see this before
 * the new host connects, so it is not fatal: drop the partial state (the
 * next connection starts on a frame boundary) and wait for SIGIO. */
static void agent_hangup(struct agent *a)
{
	a->connected = 0;
	a->refused = 0;
	a->rx_start = 0;
	a->rx_end = 0;
	agent_file_drop(&a->file);
	agent_file_reset(&a->file);
}

int agent_read(struct agent *a)
{
	ssize_t n;

	if (!a->connected)
		return 0;
	if (a->rx_start > 0) {
		memmove(a->rx, a->rx + a->rx_start, a->rx_end - a->rx_start);
		a->rx_end -= a->rx_start;
		a->rx_start = 0;
	}
	/* Full: a whole frame is buffered (none exceeds the buffer) and must
	 * be taken first. */
	if (a->rx_end == sizeof(a->rx))
		return 0;
	n = read(a->chan, a->rx + a->rx_end, sizeof(a->rx) - a->rx_end);
	if (n > 0) {
		a->rx_end += (size_t)n;
		return 0;
	}
	if (n == 0) {
		agent_hangup(a);
		return 0;
	}
	if (errno == EAGAIN || errno == EINTR)
		return 0;
	return -errno;
}

int agent_next_frame(struct agent *a, struct proto_frame *f)
{
	ssize_t n = proto_frame_parse(a->rx + a->rx_start, a->rx_end - a->rx_start, f);
	int r;

	if (n == 0)
		return 0;
	if (n < 0) {
		/* Nothing after a bad header can be trusted to be aligned on a
		 * frame: drop it all, and any file it was feeding. */
		a->rx_start = 0;
		a->rx_end = 0;
		agent_file_drop(&a->file);
		agent_file_reset(&a->file);
		r = agent_send_error(a, -EPROTO, "bad frame header: receive buffer dropped");
		return r < 0 ? r : 0;
	}
	a->rx_start += (size_t)n;
	return 1;
}

int64_t *agent_oom_baseline(struct agent *a)
{
	return &a->oom_baseline;
}

struct zygote *agent_zygote(struct agent *a)
{
	return &a->zygote;
}
