/* destination: a customer's own S3 destination as kiln-api keeps it: the
 * secret key sealed with AES-256-GCM under the key of kiln-api's
 * configuration (destinations.key_file), a random 96-bit nonce per record
 * and the customer id as additional authenticated data (a sealed secret
 * copied onto another customer's row does not open). The HTTP endpoints
 * that set, show, test and delete it (docs/api.md, "Destination").
 *
 * Sealed form: 0x01 (version) | nonce (12) | ciphertext | tag (16). */
#ifndef KILN_API_DESTINATION_H
#define KILN_API_DESTINATION_H

#include <stddef.h>

#include <microhttpd.h>

#include "dest.h"
#include "err.h"
#include "s3.h"

#define DESTINATION_KEY_LEN 32
#define DESTINATION_SEAL_OVERHEAD (1 + 12 + 16)
#define DESTINATION_SEALED_MAX (DEST_SECRET_MAX + DESTINATION_SEAL_OVERHEAD)

/* Read the key file: 64 hex digits (32 bytes), an optional newline, nothing
 * else. 0, or -1 with err ("config", naming the file and the problem). */
int destination_key_load(const char *path, unsigned char key[DESTINATION_KEY_LEN], struct kiln_err *err);

/* Seal secret for customer into out (DESTINATION_SEALED_MAX bytes); the
 * length in *out_len. 0 or -1 with err ("internal"). Thread-safe. */
int destination_seal(const unsigned char key[DESTINATION_KEY_LEN], const char *customer, const char *secret,
		     unsigned char *out, size_t *out_len, struct kiln_err *err);

/* Open a sealed secret of customer into secret (NUL-terminated, at most
 * DEST_SECRET_MAX bytes + 1). 0, or -1 with err ("destination_unavailable":
 * a wrong key, another customer's record, or altered bytes; nothing of the
 * plaintext is left in secret then). Thread-safe. */
int destination_open(const unsigned char key[DESTINATION_KEY_LEN], const char *customer, const unsigned char *in,
		     size_t len, char secret[DEST_SECRET_MAX + 1], struct kiln_err *err);

struct store;

struct store_dest;

/* A destination as stored (store_dest_get, store_task_push_get) with its
 * secret opened: 1 (d filled, id its id), or -1 with err as
 * destination_load's. */
int destination_unseal(const unsigned char *key, const char *customer, const struct store_dest *sd, struct dest *d,
		       char id[40], struct kiln_err *err);

/* The customer's destination with its secret opened, for a task's upload
 * or a presigned URL: 1 found (d filled, id its id), 0 none, -1 with err
 * ("destination_unavailable": no key configured, or the secret does not
 * open; "store_error"). key NULL: no key configured. Thread-safe. */
int destination_load(struct store *st, const unsigned char *key, const char *customer, struct dest *d,
		     char id[40], struct kiln_err *err);

#define DESTINATION_PROBE_TIMEOUT_S 5 /* per request of the test write */

/* Whether d's endpoint resolves only to addresses a destination may reach
 * (lib/netaddr.h; allow: the operator's destinations.allow_addresses, may
 * be NULL). Nothing is sent. 0, or -1 with err ("destination_forbidden"
 * naming the address and why; "s3_unavailable": the name does not resolve).
 * Blocks on DNS. */
int destination_check(const struct dest *d, const struct netaddr_allow *allow, struct kiln_err *err);

/* A small test write (and delete) with d's credentials, each request
 * bounded to DESTINATION_PROBE_TIMEOUT_S and only to allowed addresses
 * (dest_s3_config): 0, or -1 with err (destination_forbidden, s3_auth,
 * s3_unavailable, s3_not_found, s3_error from s3.h). */
int destination_probe(const struct dest *d, const struct netaddr_allow *allow, struct kiln_err *err);

/* Called after a destination changed (set with new credentials, or
 * deleted), so that tasks already on hosts get the new credentials. */
struct destination_hooks {
	void (*changed)(void *ctx, const char *customer);
	void *ctx;
};

/* /v1/destination (the caller's customer) and /v1/admin/customers/{id}/
 * destination (admin: customer given): GET, PUT, DELETE, and POST .../test.
 * key NULL: PUT and test answer 503 destinations_disabled. allow: the
 * operator's destinations.allow_addresses (may be NULL). A PUT whose
 * endpoint resolves to a refused address answers 400
 * destination_forbidden, whether or not it asked for the test write. */
enum MHD_Result destination_handle(struct store *st, const unsigned char *key, const struct netaddr_allow *allow,
				   const struct destination_hooks *hooks, struct MHD_Connection *conn, const char *method,
				   const char *customer, int test, const char *body, size_t len);

#endif
