/* hostclient: kiln-api's HTTP client for the kiln-host API (docs/api.md,
 * "kiln-host serve"), over libcurl, authenticated with the cluster token.
 * Every call is synchronous and thread-safe. */
#ifndef KILN_HOSTCLIENT_H
#define KILN_HOSTCLIENT_H

#include <jansson.h>

#include "err.h"

/* One request: method, base URL + path, optional JSON body. Returns the
 * HTTP status (the response JSON in *reply when it parses; may be NULL), or
 * -1 with err set ("host_unreachable") when no answer came. */
int hostclient_call(const char *base, const char *token, const char *method, const char *path, json_t *body,
		    long timeout_ms, json_t **reply, struct kiln_err *err);

/* Follow GET base/v1/tasks/{id}/events: on_event is called with each event's
 * name and parsed data until the stream ends (returns 0), the callback
 * returns nonzero (returns 1), or the connection fails or stalls for
 * stall_s seconds (-1, err set). */
int hostclient_follow(const char *base, const char *token, const char *task_id, long stall_s,
		      int (*on_event)(void *ctx, const char *name, json_t *data), void *ctx, struct kiln_err *err);

#endif
