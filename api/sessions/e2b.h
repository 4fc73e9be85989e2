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

#include <jansson.h>
#include <microhttpd.h>

#include "sessions.h"

/* The envdVersion kiln's sandboxes report: what the SDK 2.51.0 gates its
 * calls on (>= 0.4.0: no default user sent; >= 0.5.2: stdin can be closed;
 * >= 0.5.7: octet-stream uploads for streamed data and for gzip: true;
 * >= 0.6.2: files.write's metadata, as X-Metadata-* headers). Not 0.6.3:
 * watchDir's includeEntry and later gates are not served. */
#define E2B_ENVD_VERSION "0.6.2"
#define E2B_DEFAULT_TIMEOUT_S 300
#define E2B_MAX_TIMEOUT_S 86400
#define E2B_FORK_DEFAULT_TIMEOUT_S 15 /* E2B's API: a fork's children live 15 s unless told */

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
	const char *host_id;         /* the sandbox named by the host name (49983-<id>.<domain>), or NULL */
};

/* Before any of the body is read: whether the call's sandbox, token and
 * state let it through (as the relay checks them). A refused call's body is
 * dropped as it arrives, never buffered, and e2b_relay_refuse answers it at
 * its end (answering before the body would close the connection under a
 * client still sending it, which then sees no answer). Both release ss
 * (held with sessions_hold). */
int e2b_relay_allowed(struct sessions *ss, struct MHD_Connection *conn, const char *method, const char *url,
		      const char *host_id);
enum MHD_Result e2b_relay_refuse(struct sessions *ss, struct MHD_Connection *conn, const char *method,
				 const char *url, const char *host_id);

/* Relay r to its sandbox's host (e2b_relay.c), held with sessions_hold,
 * which this releases (a streamed answer holds ss until it ends). */
enum MHD_Result e2b_relay_handle(struct sessions *ss, const struct e2b_relay_request *r);

/* ---- e2b_request.c: the control API's input (pure; fuzz_e2breq) ---- */

/* A create body, checked. */
struct e2b_create {
	json_t *native;              /* the equivalent POST /v1/sessions body (owned) */
	char *env_json;              /* envVars, compact JSON, or NULL (owned) */
	char template[64];           /* templateID as given ("base" when absent) */
	long timeout_s;              /* 1..E2B_MAX_TIMEOUT_S */
	int auto_pause;              /* autoPause: pause at the timeout (else destroy) */
	int private_traffic;         /* network.allowPublicTraffic false: ports need the traffic token */
	int auto_resume;             /* autoResume.enabled: a port request resumes it when paused */
};

/* Parse E2B's create body (len bytes; empty: {}): what each field becomes is
 * in docs/e2b.md. 0 with *out filled (release with e2b_create_free), or -1
 * with msg (cap bytes) naming the field; allow_egress: the account may have
 * network egress (allow_internet_access: true). */
int e2b_create_parse(const char *body, size_t len, int allow_egress, struct e2b_create *out, char *msg, size_t cap);
void e2b_create_free(struct e2b_create *c);

/* E2B's egress settings as kiln's network object (new reference in *out):
 * internet is allow_internet_access (NULL or null: absent, E2B's default
 * true), allow_out / deny_out network.allowOut / denyOut (NULL or null:
 * absent). Exactly as docs/e2b.md "Network" says: denyOut ["0.0.0.0/0"] or
 * allow_internet_access false: {"egress":"allow","allow":[each allowOut
 * entry on ports 1-65535]} (duplicates dropped; [] when none); otherwise
 * every public address: ["0.0.0.0/0:1-65535"] (allowOut checked, adding
 * nothing). Refused (-1 with msg naming the field): a denyOut entry other
 * than a CIDR block or an address, any denyOut that is not all traffic
 * while all traffic is allowed (kiln's policy is an allowlist), an entry
 * with a ':' (a port or IPv6), one kiln's rule parser refuses, more than
 * SPEC_MAX_NET_RULES entries. */
int e2b_network_map(json_t *internet, json_t *allow_out, json_t *deny_out, json_t **out, char *msg, size_t cap);

/* An updateNetwork body (PUT /e2b/sandboxes/{id}/network: allowOut,
 * denyOut, allow_internet_access; egressProxy and non-empty rules refused;
 * omitted fields are cleared, so {} is all public traffic) as kiln's
 * network object (*out, new reference): 0, or -1 with msg. */
int e2b_network_update_parse(const char *body, size_t len, json_t **out, char *msg, size_t cap);

/* getInfo's network.allowOut / denyOut from kiln's network object (NULL or
 * egress "none": nothing allowed): {"allowOut":[rules, ":1-65535" dropped],
 * "denyOut":["0.0.0.0/0"]} (new reference): kiln always denies what its
 * rules do not allow. */
json_t *e2b_network_info(json_t *network);

/* A body's "timeout" in seconds: def when absent or null, 0 as 1,
 * 1..E2B_MAX_TIMEOUT_S; -1 when bad. */
long e2b_timeout_of(json_t *body, long def);

/* Percent-decode n bytes of s into out (cap bytes, NUL-terminated), '+' as a
 * space when plus; -1 when it does not fit, has a bad escape or decodes a NUL. */
int e2b_url_decode(const char *s, size_t n, int plus, char *out, size_t cap);

/* The v2 list's metadata filter as the SDK sends it (after the query's own
 * decoding: "k=v&k2=v2", each key and value form-encoded over
 * encodeURIComponent): {k: v, ...} (new reference), NULL when malformed. */
json_t *e2b_metadata_filter(const char *q);

#endif
