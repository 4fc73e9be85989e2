/* e2b: kiln-api's E2B-compatible API (docs/e2b.md). The control API under
 * /e2b (e2b.c: sandboxes are kiln sessions, authenticated with a kiln key in
 * X-API-KEY, errors in E2B's {"code","message"} shape) and the envd relay at
 * the root paths /process.Process/..., /filesystem.Filesystem/..., /files and
 * /health (e2b_relay.c: the sandbox named by E2b-Sandbox-Id, its envd access
 * token in X-Access-Token, the call and its streamed answer relayed to the
 * session's kiln-host). Both run on libmicrohttpd's connection threads. */
#ifndef KILN_API_E2B_H
#define KILN_API_E2B_H

#include <stddef.h>

#include <microhttpd.h>

#include "sessions.h"

/* The envdVersion kiln's sandboxes report: what the SDK 2.51.0 gates its
 * calls on (>= 0.4.0: no default user sent; >= 0.5.2: stdin can be closed;
 * >= 0.5.7: octet-stream uploads for streamed data). */
#define E2B_ENVD_VERSION "0.5.7"
#define E2B_DEFAULT_TIMEOUT_S 300
#define E2B_MAX_TIMEOUT_S 86400

/* E2B's error answer {"code":status,"message":msg}, with an optional header
 * (hname NULL: none). */
enum MHD_Result e2b_reply_error(struct MHD_Connection *conn, unsigned status, const char *msg, const char *hname,
				const char *hvalue);

/* Answer a request under /e2b (r->path: what follows "/e2b"; r->e2b set)
 * held with sessions_hold, which this releases. Blocking (a create or a
 * resume waits for its host). */
enum MHD_Result e2b_handle(struct sessions *ss, const struct sessions_request *r);

/* Whether url is one of the envd relay's root paths. */
int e2b_relay_path(const char *url);

/* One envd call: the whole request body (max_body_mib at most) and the
 * connection's headers. */
struct e2b_relay_request {
	struct MHD_Connection *conn;
	const char *method;
	const char *url;             /* "/process.Process/Start", "/files", ... */
	const char *body;            /* may be NULL */
	size_t len;
	struct quota_limiter *lim;   /* a streamed answer counts in the customer's max_streams */
};

/* Before any of the body is read: the sandbox named, its token and its
 * state checked as the relay does (an unauthenticated caller makes kiln-api
 * buffer nothing). MHD_YES when the call may go on, else the error is
 * answered. Releases ss (held with sessions_hold). */
enum MHD_Result e2b_relay_precheck(struct sessions *ss, struct MHD_Connection *conn, const char *path);

/* Relay r to its sandbox's host (e2b_relay.c), held with sessions_hold,
 * which this releases (a streamed answer holds ss until it ends). */
enum MHD_Result e2b_relay_handle(struct sessions *ss, const struct e2b_relay_request *r);

/* Percent-decode s into out (cap bytes, NUL-terminated), '+' as a space
 * when plus; -1 when it does not fit or has a bad escape. For the v2 list's
 * metadata filter (unit-tested). */
int e2b_url_decode(const char *s, size_t n, int plus, char *out, size_t cap);

#endif
