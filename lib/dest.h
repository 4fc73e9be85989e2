/* dest: a customer's own S3 destination for its tasks' outputs, logs and
 * manifest (docs/api.md, "Destination"): its JSON form, validated the same
 * way where a customer registers it (kiln-api) and where a host receives it
 * with a task (kiln-host), and the s3_config it yields. Fixed-size fields,
 * so a struct dest is copied with `=`; dest_wipe clears the secret. */
#ifndef KILN_DEST_H
#define KILN_DEST_H

#include <stddef.h>

#include <jansson.h>

#include "err.h"
#include "s3.h"

#define DEST_ENDPOINT_MAX 256
#define DEST_REGION_MAX 32
#define DEST_BUCKET_MAX 63
#define DEST_PREFIX_MAX 256
#define DEST_ACCESS_MAX 128
#define DEST_SECRET_MAX 256

struct dest {
	char endpoint[DEST_ENDPOINT_MAX + 1]; /* http(s)://HOST[:PORT], no path */
	char region[DEST_REGION_MAX + 1];     /* default us-east-1 */
	char bucket[DEST_BUCKET_MAX + 1];     /* S3 bucket naming rules */
	char prefix[DEST_PREFIX_MAX + 1];     /* "" or a key prefix ending in '/' */
	char access_key[DEST_ACCESS_MAX + 1];
	char secret_key[DEST_SECRET_MAX + 1]; /* "" when not carried */
};

/* What dest_from_json requires of o. */
enum dest_secret {
	DEST_SECRET_REQUIRED, /* a customer's PUT, a task's destination on a host */
	DEST_SECRET_NONE,     /* stored form: no secret_key field allowed */
};

/* Fill d from o ({"endpoint","region","bucket","prefix","access_key",
 * "secret_key"}); unknown fields, wrong types and values outside the rules
 * above are refused: -1 with err ("invalid_request", the message naming the
 * field). extra, when not NULL, lists further field names the caller takes
 * itself (NULL-terminated); they are skipped here. Pure, thread-safe. */
int dest_from_json(json_t *o, enum dest_secret secret, const char *const *extra, struct dest *d,
		   struct kiln_err *err);

/* The same over a JSON text of len bytes (need not be NUL-terminated);
 * refuses invalid JSON ("invalid_json") and non-objects. The fuzzer's entry. */
int dest_parse(const char *text, size_t len, enum dest_secret secret, struct dest *d, struct kiln_err *err);

/* d as JSON; with_secret adds "secret_key" (only for the host channel and
 * the host's spool record: never in an answer to a customer). NULL when out
 * of memory. */
json_t *dest_to_json(const struct dest *d, int with_secret);

/* Whether a and b name the same place (endpoint, region, bucket, prefix). */
int dest_same_place(const struct dest *a, const struct dest *b);

/* An s3_config pointing into d (d must outlive it), guarded (s3.h): its
 * requests reach only addresses lib/netaddr.h allows, with the operator's
 * exceptions allow (may be NULL; must outlive c). Every connection to a
 * customer's destination is made through one of these. */
void dest_s3_config(const struct dest *d, const struct netaddr_allow *allow, struct s3_config *c);

/* The access key id for display: its first 4 characters, then '*'s
 * (out: at least DEST_ACCESS_MAX + 1 bytes). */
void dest_mask_access(const char *access_key, char *out, size_t out_size);

/* Clear the secret (and everything else) in memory. */
void dest_wipe(struct dest *d);

#endif
