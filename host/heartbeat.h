/* heartbeat: kiln-host registers with kiln-api and reports its capacity
 * every period (POST {api}/v1/hosts/{host_id}/heartbeat, cluster token as
 * Bearer). kiln-api marks a host lost when the heartbeats stop. */
#ifndef KILN_HEARTBEAT_H
#define KILN_HEARTBEAT_H

#include "hostd.h"

struct heartbeat;

/* Start the heartbeat thread: api is kiln-api's base URL, advertise the URL
 * kiln-api reaches this host's API at. The first heartbeat is sent at once.
 * Failures are logged (once per change of error) and retried next period.
 * Returns NULL with err set when the thread cannot start. */
struct heartbeat *heartbeat_start(struct hostd *d, const char *api, const char *host_id, const char *advertise,
				  const char *token, unsigned period_ms, struct kiln_err *err);
void heartbeat_stop(struct heartbeat *h);

#endif
