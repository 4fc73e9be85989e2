/* heartbeat: kiln-host registers with kiln-api and reports its capacity
 * every period (POST {api}/v1/hosts/{host_id}/heartbeat, cluster token as
 * Bearer). kiln-api marks a host lost when the heartbeats stop. With several
 * kiln-api URLs (replicas) it uses one and moves to the next when that one
 * stops answering (apilist.h). */
#ifndef KILN_HEARTBEAT_H
#define KILN_HEARTBEAT_H

#include "apilist.h"
#include "task/task.h"

struct heartbeat;

/* Start the heartbeat thread: api the kiln-api base URLs (copied; at least
 * one), advertise the URL kiln-api reaches this host's API at, ca_file
 * (copied; NULL: the system's CAs) the PEM CA that verifies https:// API
 * URLs. The first
 * heartbeat is sent at once, to api's first URL. A beat that gets no
 * connection, times out or is answered 5xx is sent to the next URL at once
 * (each URL once per period); the URL that answered stays in use. Failures
 * are logged once per URL and change of error, and retried next period.
 * Returns NULL with err set when the thread cannot start. */
struct heartbeat *heartbeat_start(struct hostd *d, const struct apilist *api, const char *host_id,
				  const char *advertise, const char *token, const char *ca_file, unsigned period_ms,
				  struct kiln_err *err);
void heartbeat_stop(struct heartbeat *h);

#endif
