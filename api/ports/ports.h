/* ports: kiln-api's way into the TCP ports of a running sandbox (docs/api.md
 * "Ports", docs/e2b.md "Ports"). A request that names a session's port, by
 * E2B's headers (E2b-Sandbox-Id, E2b-Sandbox-Port), by its host name
 * (`<port>-<id>.<sandbox_domain>`, what E2B's getHost returns) or by kiln's
 * path (/v1/sessions/{id}/ports/{port}/...), is checked (the caller's key or a
 * public E2B sandbox; running; a live host), then carried to the server
 * listening on that port inside the VM through a tunnel kiln-host opens over
 * the VM's envd channel (the guest has no network interface for it). kiln-api
 * speaks HTTP/1.1 to that server itself: it writes the request head with
 * its own framing (the body as libmicrohttpd decoded it, so that no header
 * trick can make the server see a different request than kiln-api did),
 * streams the body both ways, and reads the answer with http-parser. A
 * WebSocket (any Upgrade) that the server accepts becomes a spliced pair of
 * sockets.
 *
 * Room: the ports room's door (api/ports/). It may call the sessions,
 * scheduler, base, hostcall and store rooms and lib/; ports_int.h is the
 * room's own. */
#ifndef KILN_API_PORTS_H
#define KILN_API_PORTS_H

#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "sessions/sessions.h"

/* envd's own port: E2B's header routing sends it to the envd relay. */
#define PORTS_ENVD_PORT 49983

enum ports_way { PORTS_NONE, PORTS_NATIVE, PORTS_E2B };

/* What a port request names. */
struct ports_match {
	enum ports_way way;
	char id[40];
	unsigned port;
	char target[8192];           /* the request target the server gets: "/path?query" */
};

/* Whether a request is for a sandbox's port, and which (before any of its
 * body is read). uri is the request target as the client sent it (the path
 * still percent-encoded, the query); domain the sandbox domain (NULL: host
 * names are not routed). 1 with *m filled; 0 when it is not a
 * port request (for envd's own host name `49983-<id>.<domain>`, with
 * m->port PORTS_ENVD_PORT and m->id the sandbox it names: the envd relay's,
 * which takes the id from there when the request has no E2b-Sandbox-Id, as
 * a signed file URL has none); -1 when it is one but malformed (a bad port, a target too
 * long): m->target then holds the message for a 400. */
int ports_match(struct MHD_Connection *conn, const char *url, const char *uri, const char *domain,
		struct ports_match *m);

struct ports_call;

/* Begin one proxied request (the first access-handler call). ss is held by
 * the caller (sessions_hold) and released by the call when it ends.
 * customer: the authenticated caller's for PORTS_NATIVE, NULL for
 * PORTS_E2B (public sandboxes, or private ones with the e2b-traffic-access-token
 * header); lim: the submit-rate buckets (an autoResume resume takes a token). Returns the call, or NULL (out of memory:
 * close the connection). A refusal (not found, paused, nothing listens) is
 * kept in the call and answered by ports_finish, after the body was dropped
 * (at most 1 MiB of it; past that the connection closes). */
struct ports_call *ports_begin(struct sessions *ss, struct MHD_Connection *conn, const char *method,
			       const struct ports_match *m, const char *customer, struct quota_limiter *lim);
/* A piece of the request body: sent to the server as it comes. */
enum MHD_Result ports_feed(struct ports_call *c, const char *data, size_t *size);
/* The body ended: queue the server's answer (streamed as it comes), the
 * upgrade, or the refusal. */
enum MHD_Result ports_finish(struct ports_call *c, struct MHD_Connection *conn);
/* The request is over (libmicrohttpd's completed callback). NULL: no-op. */
void ports_done(struct ports_call *c);

/* ---- the code interpreter (port_code.c; docs/api.md "Code") ---- */

/* Whether url is one of the code routes (/v1/sessions/{id}/code,
 * /v1/sessions/{id}/code/contexts[/{cid}[/restart]]), malformed ones too. */
int ports_code_path(const char *url);
/* Answer one code request of customer (its body read whole: body, len). ss
 * is held by the caller and released by the call (when a stream ends, for
 * one). A cell, whole or streamed, is a long-lived request: counted in lim
 * against max_streams (0: no limit) unless admin. Blocking: a connection
 * thread of its own. */
enum MHD_Result ports_code_handle(struct sessions *ss, struct MHD_Connection *conn, const char *method,
				  const char *url, const char *body, size_t len, const char *customer,
				  struct quota_limiter *lim, unsigned max_streams, int admin);
/* POST /code's body checked and written again as the interpreter's request
 * (a new string, free()), with the cell's timeout in *timeout_ms; NULL with
 * err (invalid_json, invalid_request). Pure. */
char *ports_code_request(const char *body, size_t len, unsigned *timeout_ms, struct kiln_err *err);

/* Counts since start, for /metrics. Any thread. */
struct ports_stats {
	uint64_t requests_native, requests_e2b; /* port requests by way in */
	uint64_t refused;                       /* answered with an error before reaching a server */
	uint64_t upgrades;                      /* WebSockets and raw tunnels spliced */
	uint64_t open;                          /* calls alive now (answers streaming, spliced connections) */
};
void ports_stats(struct ports_stats *out);

#endif
