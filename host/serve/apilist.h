/* apilist: the kiln-api URLs a kiln-host heartbeats to (several replicas,
 * or one name behind a load balancer). One is used; on a failure that says
 * "this replica is not answering" (no connection, a timeout, a 5xx) the
 * next one is tried, so one dead replica does not make its hosts look lost.
 * Parsing and the rotation are pure: the heartbeat thread owns a list. */
#ifndef KILN_APILIST_H
#define KILN_APILIST_H

#include <jansson.h>

#include "err.h"

#define APILIST_MAX 16         /* URLs in one list */
#define APILIST_URL_MAX 1024   /* bytes of one URL */

struct apilist {
	char *url[APILIST_MAX];   /* base URLs, without a trailing '/' (owned) */
	unsigned n;               /* how many */
	unsigned cur;             /* the one in use */
};

/* Append the URLs of s, "URL[,URL...]", to l (the --api flag, and the
 * config's "api" when it is a string). Each is http:// or https://, has a
 * host, holds no space or control character and no '?' or '#'; trailing
 * '/' are dropped; empty items ("a,,b", a trailing comma) and more than
 * APILIST_MAX URLs in all are refused. what names the setting in messages.
 * Returns 0, or -1 with err (KERR_USAGE) set and l unchanged. */
int apilist_add(struct apilist *l, const char *s, const char *what, struct kiln_err *err);

/* The config's "api": a string as apilist_add takes, or an array of one or
 * more such strings. Returns 0, or -1 with err (KERR_CONFIG) set. */
int apilist_add_json(struct apilist *l, const json_t *v, const char *what, struct kiln_err *err);

/* What one attempt on one URL came to (the send callback of apilist_try). */
enum apilist_outcome {
	APILIST_OK = 0,     /* answered and accepted */
	APILIST_NEXT = 1,   /* not answering (connection, timeout, 5xx): try the next */
	APILIST_STOP = 2,   /* answered with a refusal (4xx: wrong token...): every
			     * replica would say the same, so do not move on */
};

/* One round: send on the URL in use; while it says APILIST_NEXT move to the
 * next URL (wrapping) and send there, each URL at most once. The URL in use
 * afterwards is the one that answered (OK or STOP), or after a round where
 * none did, the next after the one tried first, so the next round starts
 * elsewhere. Returns the last outcome. send gets the base URL. */
enum apilist_outcome apilist_try(struct apilist *l, enum apilist_outcome (*send)(void *ctx, const char *base),
				 void *ctx);

/* Copy src into dst (a deep copy; dst need not be initialised). 0 or -ENOMEM. */
int apilist_copy(struct apilist *dst, const struct apilist *src);
/* Free the URLs and zero l. */
void apilist_free(struct apilist *l);

#endif
