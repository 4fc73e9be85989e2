/* request: the pure parsers behind kiln-api's request bodies (POST
 * /v1/tasks with its metadata, the admin bodies, host heartbeats). No store,
 * no HTTP: the server and the fuzzer (tests/fuzz/fuzz_apireq.c) link them
 * alike. Every function is reentrant. */
#ifndef KILN_API_REQUEST_H
#define KILN_API_REQUEST_H

#include <stddef.h>

#include <jansson.h>

#include "err.h"
#include "store/store.h"

#define API_METADATA_MAX  16384 /* bytes of compact JSON */
#define API_NAME_MAX      128
#define API_URL_MAX       256
#define API_CAPACITY_MAX  16384 /* bytes of a heartbeat's capacity JSON */

/* A POST /v1/tasks body split in two. */
struct api_task_request {
	char *spec_json;   /* the body without "metadata" (malloc'd), for spec_parse */
	size_t spec_len;
	json_t *metadata;  /* the "metadata" object, or NULL when absent */
	char *egress;      /* network.egress as given when it is a string, else NULL */
};

/* Split body[0..len): parse it (line/column on malformed JSON: code
 * "invalid_json"), take "metadata" out (an object of at most
 * API_METADATA_MAX bytes as compact JSON: else "invalid_request" naming
 * "metadata"), note network.egress. The spec itself is NOT validated: run
 * spec_parse() on spec_json. The same JSON-node bound as spec_parse applies
 * before anything is parsed ("invalid_spec"). Returns 0 with *out filled
 * (release with api_task_request_free) or -1 with err set and *out zeroed. */
int api_task_request_parse(const char *body, size_t len, struct api_task_request *out, struct kiln_err *err);
void api_task_request_free(struct api_task_request *r);

/* Customer and host ids: 1-64 of [A-Za-z0-9_.-], not starting with '.'
 * (they name S3 prefixes). 1 when ok. */
int api_id_ok(const char *id);

/* POST /v1/admin/customers {"id","name"?,"quotas"?}: id into id (65 bytes),
 * name (API_NAME_MAX+1 bytes; the id when absent), quotas applied over *q.
 * 0 or -1 with err set ("invalid_json", "invalid_request"). */
int api_customer_request_parse(const char *body, size_t len, char *id, char *name, struct quota *q,
			       struct kiln_err *err);

/* PUT /v1/admin/customers/{id}/quotas: a (partial) quotas object applied
 * over *q. 0 or -1 with err set. */
int api_quota_request_parse(const char *body, size_t len, struct quota *q, struct kiln_err *err);

/* POST /v1/hosts/{id}/heartbeat {"url":"http://...","capacity":{...}}: url
 * into url (API_URL_MAX+1 bytes), *capacity a new reference to the capacity
 * object. 0 or -1 with err set. */
int api_heartbeat_parse(const char *body, size_t len, char *url, json_t **capacity, struct kiln_err *err);

/* ---- sessions ---- */

#define API_SESSION_DEFAULT_IDLE_S      600
#define API_SESSION_MAX_IDLE_S          86400
#define API_SESSION_DEFAULT_LIFETIME_S  3600
#define API_SESSION_MAX_LIFETIME_S      604800
#define API_SESSION_BODY_MAX            (256 << 10) /* bytes of a POST /v1/sessions body */
#define API_EXEC_STDIN_MAX              (16u << 20) /* an exec's stdin_b64, decoded (kiln-host's bound) */
#define API_INPUT_MAX                   (256u << 10) /* one input request's data_b64, decoded (kiln-host's bound) */
#define API_TTY_MAX                     4096 /* a terminal's rows and cols (the guest protocol's bound) */
#define API_SESSION_VOLUMES_MAX         2    /* a VM's volume slots (kiln-host's VM_VOL_SLOTS) */

/* A POST /v1/sessions body, checked. */
struct api_session_request {
	char *spec_json;       /* {"limits":{"vcpus","memory_mib","output_mib"},"network":{...}}, every
				* limit filled in: what hosts get on create and resume (malloc'd) */
	char *metadata_json;   /* compact, or NULL when absent (malloc'd) */
	unsigned vcpus, memory_mib, output_mib, idle_timeout_s, max_lifetime_s;
	int egress;            /* network.egress is "allow" */
	char template_name[64]; /* "template" ("" when absent: the default) */
	char snapshot[40];     /* "snapshot": start from this snapshot ("" none); then spec_json is NULL
				* and vcpus, memory_mib, output_mib, egress 0: they are the snapshot's */
	unsigned snapshot_wait_ms; /* not from the body: a fork's children wait this long for the
				    * snapshot's manifest (its upload goes on while they start) */
	struct api_volume_req {
		char name[64];         /* a volume's name (or id): api_volume_name_ok */
		char path[256];        /* its mount point: api_volume_path_ok */
		int read_only;
	} volumes[API_SESSION_VOLUMES_MAX]; /* "volumes" (not with "snapshot") */
	unsigned nvolumes;
};

/* A volume's name: 1-63 characters of [A-Za-z0-9._-]. 1 when ok. */
int api_volume_name_ok(const char *name);

/* A volume's mount point as kiln-host accepts it: absolute, normalised (no
 * "//", ".", "..", trailing '/', control characters), at most 255 bytes,
 * not "/", not /proc, /sys, /dev or under them. 1 when ok. */
int api_volume_path_ok(const char *path);

/* Parse {"image","limits","network","idle_timeout_s","max_lifetime_s",
 * "metadata","template","snapshot","volumes"} (all optional; "snapshot", a
 * snapshot id, excludes image, limits, network, template and volumes: a
 * session from a snapshot has the snapshot's); volumes: at most
 * API_SESSION_VOLUMES_MAX {"name","path","read_only"?}, each name once, no
 * path inside another; image "default" only; limits vcpus, memory_mib
 * and output_mib with the task spec's ranges and defaults (no timeout_s:
 * sessions have idle and lifetime limits, and each exec its own timeout);
 * network as a task's (a network.egress other than "none" without
 * allow_egress is refused first, code "egress_not_allowed"); idle_timeout_s
 * 1..API_SESSION_MAX_IDLE_S, max_lifetime_s 1..API_SESSION_MAX_LIFETIME_S;
 * metadata as a task's. Returns 0 with *out filled (release with
 * api_session_request_free) or -1 with err set ("invalid_json",
 * "invalid_request", "invalid_spec" naming the field). */
int api_session_request_parse(const char *body, size_t len, int allow_egress, struct api_session_request *out,
			      struct kiln_err *err);
void api_session_request_free(struct api_session_request *r);

/* Parse a POST /v1/sessions/{id}/exec body: {"argv":[...]} or
 * {"language","code"}, optional "env" and "cwd", checked with the task
 * spec's rules (the message names the field), "stdin_b64" (padded standard
 * base64 of at most API_EXEC_STDIN_MAX bytes), "interactive" (boolean) or
 * "tty" ({"rows","cols"}, 1..API_TTY_MAX; neither with stdin_b64), "timeout_s" 1..86400
 * (default 30), at most max_timeout_s (the quota's max_task_timeout_s; 0: no
 * quota) else code "over_quota". *out: the body to send the host (a new
 * reference) with timeout_s filled in. 0, or -1 with err set. */
int api_exec_request_parse(const char *body, size_t len, unsigned max_timeout_s, json_t **out,
			   struct kiln_err *err);

/* Parse a POST /v1/sessions/{id}/input body: "exec_id" (required: lower-case
 * hex, at most 64), "data_b64" (padded standard base64 of at most
 * API_INPUT_MAX bytes), "eof" (boolean), "resize" ({"rows","cols"}, 1..4096).
 * *out: the body to relay (a new reference). 0, or -1 with err set. */
int api_input_request_parse(const char *body, size_t len, json_t **out, struct kiln_err *err);

/* A guest path in a query (?path= or ?dir=): absolute, 1-4096 bytes, no
 * control characters. 1 when ok. (The host checks it further.) */
int api_guest_path_ok(const char *p);

#endif
