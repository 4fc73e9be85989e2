/* ports_int.h: what api/ports/'s files share. Not part of the room's door
 * (ports.h). */
#ifndef KILN_API_PORTS_INT_H
#define KILN_API_PORTS_INT_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include <http_parser.h>
#include <jansson.h>

#include "buf.h"
#include "ports.h"

/* ---- port_resp.c: a server's HTTP answer (pure) ---- */

#define PORT_RESP_MAX_HEADERS 100
#define PORT_RESP_HEAD_MAX (32u << 10)

struct port_resp {
	http_parser p;
	int head_request;            /* the request was HEAD: no body follows the head */
	struct buf *body;            /* decoded body bytes are appended here */
	int status;                  /* once head_done */
	int head_done, done, upgrade, failed, too_big, interim, bad_status;
	int chunked, has_length;
	uint64_t content_length;
	char why[96];                /* failed: what was wrong */
	/* headers as read: offsets into hbuf */
	size_t nh, hlen;
	int last;                    /* 0 none, 1 a name, 2 a value was read last */
	size_t name_off[PORT_RESP_MAX_HEADERS], name_len[PORT_RESP_MAX_HEADERS];
	size_t value_off[PORT_RESP_MAX_HEADERS], value_len[PORT_RESP_MAX_HEADERS];
	char hbuf[PORT_RESP_HEAD_MAX];
};

/* Begin reading an answer (to a HEAD request: head_request). */
void port_resp_init(struct port_resp *r, int head_request, struct buf *body);
/* Feed n bytes: the count taken (all of them, except after the answer's end
 * or a 101's head, where the rest is not this answer's), -1 when the answer
 * is not valid HTTP (r->why). */
long port_resp_feed(struct port_resp *r, const char *p, size_t n);
/* The connection ended: 0 when the answer is whole (a body that runs to
 * the end of the connection ends here), -1 when it was cut (r->why). */
int port_resp_eof(struct port_resp *r);
/* Header i (0..nh): 1 with name and value (not NUL-terminated), 0 past the end. */
int port_resp_header(const struct port_resp *r, size_t i, const char **name, size_t *name_len, const char **value,
		     size_t *value_len);

/* ---- port_tunnel.c: the connection to kiln-host's tunnel ---- */

struct port_tunnel_fail {
	unsigned status;             /* kiln-host's answer (0: it could not be reached) */
	char body[1024];             /* its JSON error, NUL-terminated ("" when none) */
	char why[200];               /* status 0: why */
};

/* Connect to host base ("http://HOST:PORT") and open a tunnel to port of
 * session id with the cluster token: a connected blocking socket after the
 * 101 (>= 0), or -1 with *f filled. Waits until deadline_ms (monotonic)
 * at most. */
int port_tunnel_open(const char *base, const char *token, const char *id, unsigned port, int64_t deadline_ms,
		     struct port_tunnel_fail *f);

/* kiln-host's refusal of a tunnel (*f from port_tunnel_open) as kiln's
 * error: its own code and message when it gave one, host_unavailable when
 * it could not be reached, host_error otherwise. */
void port_tunnel_error(const struct port_tunnel_fail *f, struct kiln_err *err);

/* Write all of p to fd, waiting until deadline_ms: 0 or a negative errno. */
int port_send_all(int fd, const void *p, size_t n, int64_t deadline_ms);

/* ---- port_ws.c: upgraded connections (WebSocket) ---- */

/* Splice client and server sockets both ways until both ends are done;
 * what each already sent past its head (to_server, to_client) goes first.
 * Closes server; client is the caller's (MHD's). */
void port_splice(int client, int server, const char *to_server, size_t to_server_len, const char *to_client,
		 size_t to_client_len);

/* ---- port_code_ev.c: the code interpreter's event lines (pure) ---- */

/* An event as kiln hands it on: name (stdout, stderr, result, error,
 * execution_count, end) and its object (borrowed). A negative return stops
 * the feed with it. */
typedef int (*code_ev_fn)(void *cls, const char *name, json_t *ev);

struct code_exec {
	struct buf line;             /* a line not yet ended (at most line_max bytes) */
	size_t held_max, held;       /* the model's bytes: at most held_max (0: nothing kept, a stream) */
	json_t *results, *out, *err; /* the model (held_max > 0) */
	json_t *error;               /* the cell's error, or NULL */
	long long count;             /* the execution count (-1: none yet) */
	int ended;                   /* end_of_execution was read: later lines are ignored */
	int too_big;                 /* a line or the model passed its cap */
	unsigned events, skipped;    /* events handed on; lines that were none */
};

/* Begin reading one answer: held_max bytes of events kept for the whole
 * model (0: none kept), a line held up to line_max bytes (0: unbounded). */
void code_exec_init(struct code_exec *x, size_t held_max, size_t line_max);
/* Feed n bytes of the answer's body: each event that ends in them goes to
 * fn (NULL: none) and into the model. 0, -E2BIG (a cap passed: x->too_big),
 * or fn's negative return. */
int code_exec_feed(struct code_exec *x, const char *p, size_t n, code_ev_fn fn, void *cls);
/* The model so far, a new reference: {"results":[...], "logs":{"stdout":[...],
 * "stderr":[...]}, "error":{name,value,traceback}|null,
 * "execution_count":N|null}. */
json_t *code_exec_result(const struct code_exec *x);
void code_exec_free(struct code_exec *x);

#define CODE_DEFAULT_TIMEOUT_MS 300000
#define CODE_MAX_TIMEOUT_MS 3600000
#define CODE_ID_MAX 128              /* a context id */

/* Whether s (n bytes) is a context id: [A-Za-z0-9_-] and inner dots, 1 to
 * CODE_ID_MAX bytes (what the interpreter makes, UUIDs; nothing that could
 * change the path it is put in). */
int code_cid_ok(const char *s, size_t n);

#endif
