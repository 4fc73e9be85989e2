/* envd_int.h: what host/envd/'s files share: the channel's state (one
 * lock guards it all: envd.c says how) and the helpers they call with the
 * lock held. Not part of the room's door. */
#ifndef KILN_ENVD_INT_H
#define KILN_ENVD_INT_H

#include <pthread.h>

#include "buf.h"
#include "envd.h"
#include "proto.h"

#define ENVD_OUT_SOFT (1u << 20)   /* envd_req_send waits while the send queue holds more */
#define ENVD_REQ_Q_MAX (16u << 20) /* replies of one request not yet taken (a huge LISTDIR fails) */
#define ENVD_SUB_Q_MAX (2u * EPROTO_WINDOW + 4096)
#define ENVD_REQ_BASE 0x80000000u
#define REC_HDR 5                  /* queued record: u8 type, u32 length (host order) */

enum envd_state { ENVD_HELLO_WAIT, ENVD_READY, ENVD_DEAD };

struct envd_proc;

struct envd_sub {
	struct envd *e;
	uint32_t pid;
	struct envd_proc *p;   /* NULL once ended or failed */
	uint64_t taken;        /* offset in p's output up to which this one took */
	struct buf q;          /* records: u8 stream, u32 len, bytes */
	size_t q_off, last_len;
	uint8_t cur[PROTO_MAX_PAYLOAD]; /* the record handed out last */
	int ended, failed;
	uint8_t how;
	uint32_t status;
	struct envd_err err;
	struct envd_sub *next; /* in p->subs */
};

struct envd_proc {
	uint32_t pid;
	uint64_t total_in, acked;
	struct envd_sub *subs;
	struct envd_proc *next;
};

struct envd_req {
	struct envd *e;
	uint32_t id;
	uint8_t type;
	struct buf q;          /* records: u8 type, u32 len, payload */
	size_t q_off;
	uint8_t cur[PROTO_MAX_PAYLOAD];
	int ended, failed;
	struct envd_err err;
	struct envd_sub *start_sub; /* START: attached to the pid on STARTED */
	uint32_t pid;
	struct envd_req *next;
};

struct envd_port;
struct envd_watch;

struct envd {
	char name[80];
	int fd, wake;
	pthread_mutex_t lock;
	pthread_cond_t cond;   /* state, replies, output, room in the send queue */
	pthread_t th;
	int th_started, joined;
	int refs;
	enum envd_state state;
	uint32_t next_id, hello_req;
	struct buf out;        /* frames to write */
	uint8_t *rbuf;
	size_t rlen;
	struct envd_req *reqs;
	struct envd_proc *procs;
	uint32_t features;      /* the guest HELLO's (EPROTO_FEAT_*) */
	uint32_t next_conn;     /* port connection ids: never reused while the channel lives */
	struct envd_port *ports; /* open port connections (envd_port.c) */
	uint32_t next_watch;     /* watch ids: never reused while the channel lives */
	struct envd_watch *watches; /* directory watches (envd_watch.c) */
	int ports_blocked;      /* a port write found the send queue full: wake them as it drains */
	char why[200];         /* why it died */
};

/* Lock held, all of them. */
void envd_set_err(struct envd_err *err, enum connect_code c, int errnum, const char *fmt, const char *arg);
/* Queue one frame for the guest: 0 or a negative errno. */
int envd_queue_frame(struct envd *e, uint8_t type, const void *p, size_t len);
void envd_queue_u32s(struct envd *e, uint8_t type, const uint32_t *v, unsigned n);
/* Wait for the guest's HELLO answer: 0, or -1 with err (unavailable). */
int envd_wait_ready(struct envd *e, int64_t deadline_ms, struct envd_err *err);

/* Port connections (envd_port.c), lock held: a PORT_* frame from the guest
 * (0, or -1 when it is malformed), every connection failed (the channel
 * died or the guest's envd restarted), the send queue drained. */
int envd_port_frame(struct envd *e, const struct proto_frame *f);
void envd_ports_fail(struct envd *e);
void envd_ports_wake(struct envd *e);

/* Directory watches (envd_watch.c), lock held: a WATCH_EVENT or WATCH_END
 * (0, or -1 when malformed); every watch failed (the channel died or the
 * guest's envd restarted); every watch freed (the channel's last reference). */
int envd_watch_frame(struct envd *e, const struct proto_frame *f);
void envd_watches_fail(struct envd *e, const char *why);
void envd_watches_free(struct envd *e);

#endif
