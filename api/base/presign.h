/* presign: presigned GET URLs for the S3 objects a host reports (a task's
 * outputs and logs, a session's outputs), each signed only when its key lies
 * under the prefix kiln-api expects for that task or session: a host that
 * lies (compromised) must not get links to another customer's objects
 * minted, such as a paused session's RAM. */
#ifndef KILN_API_PRESIGN_H
#define KILN_API_PRESIGN_H

#include <time.h>

#include <jansson.h>

#include "s3.h"

/* Give o ({"s3_key",...}, from a host) a "url": the presigned GET of its
 * s3_key when that lies under prefix (s3_key_under); else "url": null and
 * "url_error" saying why (and a line on stderr naming what, e.g. "task t_1").
 * No s3_key, or c->endpoint NULL (no S3 configured): "url": null only.
 * Not an object: left alone. Thread-safe. */
void presign_entry(const struct s3_config *c, unsigned expires_s, json_t *o, const char *prefix, const char *what,
		   time_t now);

/* A task's JSON as kiln-api answers it ({"id","customer","outputs":[...],
 * "artifacts":{...}}): every entry of outputs and artifacts through
 * presign_entry with the prefix "BASE" "CUSTOMER/ID/" (base: "" for kiln's
 * own bucket, a customer's destination prefix for its own). Returns task. */
json_t *presign_task(const struct s3_config *c, unsigned expires_s, json_t *task, const char *base, time_t now);

/* Every entry of the task's outputs and artifacts that has an s3_key gets
 * "url": null and "url_error": why (no URL can be signed). Returns task. */
json_t *presign_task_unavailable(json_t *task, const char *why);

/* A session's outputs answer ({"outputs":[...]}): each entry through
 * presign_entry with the prefix BASE "CUSTOMER/sessions/ID/outputs/" (base
 * as for presign_task). */
void presign_session_outputs(const struct s3_config *c, unsigned expires_s, json_t *reply, const char *base,
			     const char *customer, const char *id, time_t now);

#endif
