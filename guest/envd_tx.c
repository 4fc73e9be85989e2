/* envd_tx: envd's sending side: the bounded send buffer (never waited on:
 * a frame goes in only when envd_tx_ok says it fits), ERROR and DONE
 * replies, and flushing what the channel takes. envd.c and envd_fs.c both
 * call into it; it calls neither. */
#include "envd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "init.h"

/* ---- sending ------------------------------------------------------------ */

int envd_tx_ok(struct envd *e)
{
	return e->connected && sizeof(e->tx) - (e->tx_tail - e->tx_head) >= PROTO_MAX_FRAME;
}

uint8_t *envd_tx_payload(struct envd *e)
{
	/* Keep the unsent bytes at the front so that a whole frame fits after them. */
	if (sizeof(e->tx) - e->tx_tail < PROTO_MAX_FRAME) {
		memmove(e->tx, e->tx + e->tx_head, e->tx_tail - e->tx_head);
		e->tx_tail -= e->tx_head;
		e->tx_head = 0;
	}
	return e->tx + e->tx_tail + PROTO_HDR_SIZE;
}

void envd_tx_commit(struct envd *e, uint8_t type, size_t len)
{
	proto_frame_header(e->tx + e->tx_tail, type, (uint32_t)len);
	e->tx_tail += PROTO_HDR_SIZE + len;
	e->tx_appended += PROTO_HDR_SIZE + len;
}

void envd_send_error(struct envd *e, uint32_t req, int code, const char *fmt, ...)
{
	char msg[PROTO_MAX_MSG + 1];
	va_list ap;
	ssize_t n;

	if (!envd_tx_ok(e))
		return; /* callers check first; a lost reply beats an overflow */
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (code >= 0 || code < -4095)
		code = -EIO;
	n = eproto_error_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, req, code, msg);
	if (n >= 0)
		envd_tx_commit(e, EP_ERROR, (size_t)n);
}

void envd_send_u32s(struct envd *e, uint8_t type, const uint32_t *v, unsigned n)
{
	ssize_t len;

	if (!envd_tx_ok(e))
		return;
	len = eproto_u32s_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, v, n);
	if (len >= 0)
		envd_tx_commit(e, type, (size_t)len);
}

void envd_send_done(struct envd *e, uint32_t req)
{
	envd_send_u32s(e, EP_DONE, &req, 1);
}

/* Writes what the channel takes now. Returns 0 or a negative errno when the
 * channel failed. */
int envd_flush(struct envd *e)
{
	while (e->connected && e->tx_head < e->tx_tail) {
		ssize_t n = write(e->chan, e->tx + e->tx_head, e->tx_tail - e->tx_head);

		if (n > 0) {
			e->tx_head += (size_t)n;
			e->tx_sent += (uint64_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		/* EPIPE on a socketpair whose peer is gone (tests); a port
		 * whose host is away says EAGAIN instead. */
		return n < 0 ? -errno : -EIO;
	}
	if (e->tx_head == e->tx_tail)
		e->tx_head = e->tx_tail = 0;
	return 0;
}
