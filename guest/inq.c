/* Input for a child's stdin that it has not taken yet: see inq.h. */
#include "inq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void inq_init(struct inq *q, int fd, size_t cap)
{
	*q = (struct inq){ .fd = fd, .cap = cap };
}

void inq_close(struct inq *q)
{
	if (q->fd >= 0 && q->shut)
		shutdown(q->fd, SHUT_WR);
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	free(q->buf);
	q->buf = NULL;
	q->len = 0;
}

/* Writes as much of data as fd takes now: the bytes written, or -1 when the
 * reader is gone (fd is closed then). */
static ssize_t inq_write(struct inq *q, const uint8_t *data, size_t n)
{
	size_t off = 0;

	while (off < n) {
		ssize_t w = write(q->fd, data + off, n - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			break;
		if (w <= 0) {
			q->failed = 1;
			inq_close(q); /* EPIPE, EIO: nobody reads any more; the rest is moot */
			return -1;
		}
		off += (size_t)w;
	}
	return (ssize_t)off;
}

void inq_flush(struct inq *q)
{
	ssize_t w;

	if (q->fd < 0)
		return;
	if (q->len) {
		w = inq_write(q, q->buf, q->len);
		if (w < 0)
			return;
		memmove(q->buf, q->buf + w, q->len - (size_t)w);
		q->len -= (size_t)w;
	}
	if (q->len)
		return;
	if (q->eof) {
		inq_close(q);
		return;
	}
	/* Most input is taken at once: hold no buffer while idle. */
	free(q->buf);
	q->buf = NULL;
}

size_t inq_room(const struct inq *q)
{
	return q->fd >= 0 && q->cap > q->len ? q->cap - q->len : 0;
}

size_t inq_put(struct inq *q, const uint8_t *data, size_t n, size_t room)
{
	if (q->fd < 0 || q->eof || n == 0)
		return 0; /* no input, or closed: crossed on the wire */
	if (!q->len) { /* straight into the pipe when nothing waits before it */
		ssize_t w = inq_write(q, data, n);

		if (w < 0)
			return 0;
		data += w;
		n -= (size_t)w;
		if (n == 0)
			return 0;
	}
	if (room > inq_room(q))
		room = inq_room(q);
	if (!q->buf && room) {
		q->buf = malloc(q->cap);
		if (!q->buf)
			return n;
	}
	if (n <= room) {
		memcpy(q->buf + q->len, data, n);
		q->len += n;
		return 0;
	}
	if (room)
		memcpy(q->buf + q->len, data, room);
	q->len += room;
	return n - room;
}

void inq_end(struct inq *q)
{
	if (q->fd < 0)
		return;
	q->eof = 1;
	inq_flush(q);
}
