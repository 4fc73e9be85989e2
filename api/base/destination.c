/* destination: customers' own S3 destinations in kiln-api: the sealed
 * secret (AES-256-GCM, OpenSSL EVP) and the endpoints (destination.h). */
#include "destination.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "reply.h"
#include "store/store.h"

#define SEAL_VERSION 1
#define NONCE_LEN 12
#define TAG_LEN 16

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int destination_key_load(const char *path, unsigned char key[DESTINATION_KEY_LEN], struct kiln_err *err)
{
	FILE *f = fopen(path, "re");
	char buf[2 * DESTINATION_KEY_LEN + 4];
	size_t n;

	if (!f)
		return kiln_err_set(err, KERR_CONFIG, "destinations.key_file: cannot read %s: %s", path, strerror(errno));
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	if (n == 2 * DESTINATION_KEY_LEN + 1 && buf[n - 1] == '\n')
		n--;
	if (n != 2 * DESTINATION_KEY_LEN) {
		OPENSSL_cleanse(buf, sizeof(buf));
		return kiln_err_set(err, KERR_CONFIG,
				    "destinations.key_file: %s must hold 64 hex digits (32 random bytes), nothing else", path);
	}
	for (size_t i = 0; i < DESTINATION_KEY_LEN; i++) {
		int hi = hexval(buf[2 * i]), lo = hexval(buf[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			OPENSSL_cleanse(buf, sizeof(buf));
			OPENSSL_cleanse(key, DESTINATION_KEY_LEN);
			return kiln_err_set(err, KERR_CONFIG, "destinations.key_file: %s: not hex digits", path);
		}
		key[i] = (unsigned char)(hi << 4 | lo);
	}
	OPENSSL_cleanse(buf, sizeof(buf));
	return 0;
}

int destination_seal(const unsigned char key[DESTINATION_KEY_LEN], const char *customer, const char *secret,
		     unsigned char *out, size_t *out_len, struct kiln_err *err)
{
	size_t n = strlen(secret);
	EVP_CIPHER_CTX *c;
	int len = 0, fin = 0, ok;

	if (n > DEST_SECRET_MAX)
		return kiln_err_set(err, KERR_INTERNAL, "secret too long");
	c = EVP_CIPHER_CTX_new();
	out[0] = SEAL_VERSION;
	ok = c && RAND_bytes(out + 1, NONCE_LEN) == 1 &&
	     EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
	     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, NONCE_LEN, NULL) == 1 &&
	     EVP_EncryptInit_ex(c, NULL, NULL, key, out + 1) == 1 &&
	     EVP_EncryptUpdate(c, NULL, &len, (const unsigned char *)customer, (int)strlen(customer)) == 1 &&
	     EVP_EncryptUpdate(c, out + 1 + NONCE_LEN, &len, (const unsigned char *)secret, (int)n) == 1 &&
	     EVP_EncryptFinal_ex(c, out + 1 + NONCE_LEN + len, &fin) == 1 &&
	     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG_LEN, out + 1 + NONCE_LEN + len + fin) == 1;
	EVP_CIPHER_CTX_free(c);
	if (!ok)
		return kiln_err_set(err, KERR_INTERNAL, "cannot seal the secret (OpenSSL)");
	*out_len = 1 + NONCE_LEN + (size_t)len + (size_t)fin + TAG_LEN;
	return 0;
}

int destination_open(const unsigned char key[DESTINATION_KEY_LEN], const char *customer, const unsigned char *in,
		     size_t len, char secret[DEST_SECRET_MAX + 1], struct kiln_err *err)
{
	size_t ctlen;
	EVP_CIPHER_CTX *c;
	int n = 0, fin = 0, ok;
	unsigned char tag[TAG_LEN];

	secret[0] = '\0';
	if (len < DESTINATION_SEAL_OVERHEAD || len > DESTINATION_SEALED_MAX || in[0] != SEAL_VERSION)
		return kiln_err_set(err, KERR_DESTINATION_UNAVAILABLE, "the stored secret is not in a known sealed form");
	ctlen = len - DESTINATION_SEAL_OVERHEAD;
	memcpy(tag, in + len - TAG_LEN, TAG_LEN);
	c = EVP_CIPHER_CTX_new();
	ok = c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
	     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, NONCE_LEN, NULL) == 1 &&
	     EVP_DecryptInit_ex(c, NULL, NULL, key, in + 1) == 1 &&
	     EVP_DecryptUpdate(c, NULL, &n, (const unsigned char *)customer, (int)strlen(customer)) == 1 &&
	     EVP_DecryptUpdate(c, (unsigned char *)secret, &n, in + 1 + NONCE_LEN, (int)ctlen) == 1 &&
	     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG_LEN, tag) == 1 &&
	     EVP_DecryptFinal_ex(c, (unsigned char *)secret + n, &fin) == 1;
	EVP_CIPHER_CTX_free(c);
	if (!ok || memchr(secret, '\0', (size_t)n + (size_t)fin)) {
		OPENSSL_cleanse(secret, DEST_SECRET_MAX + 1);
		return kiln_err_set(err, KERR_DESTINATION_UNAVAILABLE,
				    "the destination's secret key does not decrypt with kiln-api's destinations key "
				    "(a different or rotated key_file?): set the destination again");
	}
	secret[n + fin] = '\0';
	return 0;
}

int destination_load(struct store *st, const unsigned char *key, const char *customer, struct dest *d, char id[40],
		     struct kiln_err *err)
{
	struct store_dest sd;
	int r = store_dest_get(st, customer, &sd);

	if (r < 0)
		return kiln_err_set(err, KERR_STORE_ERROR, "cannot read the destination");
	if (r == 0)
		return 0;
	return destination_unseal(key, customer, &sd, d, id, err);
}

int destination_unseal(const unsigned char *key, const char *customer, const struct store_dest *sd, struct dest *d,
		       char id[40], struct kiln_err *err)
{
	if (!key)
		return kiln_err_set(err, KERR_DESTINATION_UNAVAILABLE,
				    "the customer has an S3 destination but kiln-api has no destinations.key_file to "
				    "decrypt its secret key");
	*d = sd->d;
	snprintf(id, 40, "%s", sd->id);
	if (destination_open(key, customer, sd->sealed, sd->sealed_len, d->secret_key, err) < 0) {
		dest_wipe(d);
		return -1;
	}
	return 1;
}

int destination_probe(const struct dest *d, const struct netaddr_allow *allow, struct kiln_err *err)
{
	struct s3_config c;
	char key[DEST_PREFIX_MAX + 64], body[64];
	unsigned char rnd[8];

	dest_s3_config(d, allow, &c);
	/* One try of a few seconds per request: the customer waits on it. */
	c.attempts = 1;
	c.timeout_s = DESTINATION_PROBE_TIMEOUT_S;
	RAND_bytes(rnd, sizeof(rnd));
	snprintf(key, sizeof(key), "%skiln-destination-test-%02x%02x%02x%02x%02x%02x%02x%02x", d->prefix, rnd[0], rnd[1],
		 rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	snprintf(body, sizeof(body), "kiln destination test %lld\n", (long long)time(NULL));
	if (s3_put_buffer(&c, key, body, strlen(body), "text/plain", err) < 0)
		return -1;
	if (s3_delete(&c, key, err) < 0)
		return -1;
	return 0;
}

/* ---- HTTP ---- */

/* What GET shows: never the secret; the access key id masked. */
static json_t *dest_public_json(const struct store_dest *sd)
{
	char masked[DEST_ACCESS_MAX + 1];

	dest_mask_access(sd->d.access_key, masked, sizeof(masked));
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:I, s:I}", "id", sd->id, "endpoint", sd->d.endpoint,
			 "region", sd->d.region, "bucket", sd->d.bucket, "prefix", sd->d.prefix, "access_key", masked,
			 "secret_key_set", sd->sealed_len > 0, "created_at", (json_int_t)sd->created_ms, "updated_at",
			 (json_int_t)sd->updated_ms);
}

static enum MHD_Result reply_dest(struct store *st, struct MHD_Connection *conn, unsigned status,
				  const char *customer, const char *extra_name, json_t *extra)
{
	struct store_dest sd;
	json_t *j;
	int r = store_dest_get(st, customer, &sd);

	if (r < 0) {
		json_decref(extra);
		return reply_internal(conn, "cannot read the destination");
	}
	if (r == 0) {
		json_decref(extra);
		return reply_not_found(conn, "no destination is set: outputs go to kiln's own bucket");
	}
	j = dest_public_json(&sd);
	if (extra_name)
		json_object_set_new(j, extra_name, extra);
	return reply_json(conn, status, j);
}

int destination_check(const struct dest *d, const struct netaddr_allow *allow, struct kiln_err *err)
{
	struct netaddr_own own;
	struct netaddr_resolved res;
	int r = netaddr_own_load(&own);

	if (r < 0)
		return kiln_err_set(err, KERR_INTERNAL, "cannot list this machine's addresses: %s", strerror(-r));
	return netaddr_check_endpoint(d->endpoint, allow, &own, DESTINATION_PROBE_TIMEOUT_S * 1000L, &res, err);
}

static enum MHD_Result handle_put(struct store *st, const unsigned char *key, const struct netaddr_allow *allow,
				  const struct destination_hooks *hooks, struct MHD_Connection *conn,
				  const char *customer, const char *body, size_t len)
{
	static const char *const extra[] = { "verify", NULL };
	struct kiln_err err = { .code = "" };
	unsigned char sealed[DESTINATION_SEALED_MAX];
	size_t sealed_len = 0;
	char id[40];
	json_error_t je;
	json_t *j, *verify;
	struct dest d;
	int same = 0, r;

	if (!key)
		return reply_error(conn, KERR_DESTINATIONS_DISABLED,
				   "own S3 destinations are not enabled on this kiln-api (destinations.key_file)");
	j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
	if (!j) {
		kiln_err_set(&err, KERR_INVALID_JSON, "line %d, column %d: %s", je.line, je.column, je.text);
		return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
	}
	verify = json_object_get(j, "verify");
	if (verify && !json_is_boolean(verify)) {
		json_decref(j);
		return reply_error(conn, KERR_INVALID_REQUEST, "verify: expected true or false");
	}
	r = dest_from_json(j, DEST_SECRET_REQUIRED, extra, &d, &err);
	/* The request's copy of the secret goes with j; d holds it until wiped. */
	json_decref(j);
	if (r < 0)
		return reply_err_status(conn, MHD_HTTP_BAD_REQUEST, &err);
	/* Where the endpoint leads, before anything is sent there, with or
	 * without the test write. A name that does not resolve now is taken
	 * only without the test (its DNS may come later): every connection
	 * to it is checked again, here and on the hosts. */
	if (destination_check(&d, allow, &err) < 0 &&
	    (err.errc != KERR_S3_UNAVAILABLE || !verify || json_is_true(verify))) {
		struct kiln_err e2 = { .code = "" };

		if (err.errc != KERR_DESTINATION_FORBIDDEN)
			kiln_err_set(&e2, KERR_DESTINATION_REFUSED, "a test write to %s/%s/%s was refused: %s: %s",
				     d.endpoint, d.bucket, d.prefix, err.code, err.message);
		dest_wipe(&d);
		return reply_err(conn, err.errc == KERR_DESTINATION_FORBIDDEN ? &err : &e2);
	}
	if ((!verify || json_is_true(verify)) && destination_probe(&d, allow, &err) < 0) {
		struct kiln_err e2 = { .code = "" };

		kiln_err_set(&e2, KERR_DESTINATION_REFUSED, "a test write to %s/%s/%s was refused: %s: %s", d.endpoint,
			     d.bucket, d.prefix, err.code, err.message);
		dest_wipe(&d);
		return reply_err(conn, &e2);
	}
	r = destination_seal(key, customer, d.secret_key, sealed, &sealed_len, &err);
	if (r == 0)
		r = store_dest_put(st, customer, &d, sealed, sealed_len, id, &same, &err);
	dest_wipe(&d);
	if (r < 0)
		return reply_err(conn, &err);
	/* New credentials for the same place: tasks on hosts take them too
	 * (a destination that refused our writes may have been fixed). */
	if (same && hooks && hooks->changed)
		hooks->changed(hooks->ctx, customer);
	return reply_dest(st, conn, MHD_HTTP_OK, customer, NULL, NULL);
}

static enum MHD_Result handle_test(struct store *st, const unsigned char *key, const struct netaddr_allow *allow,
				   struct MHD_Connection *conn, const char *customer)
{
	struct kiln_err err = { .code = "" };
	struct dest d;
	char id[40];
	int r;

	if (!key)
		return reply_error(conn, KERR_DESTINATIONS_DISABLED,
				   "own S3 destinations are not enabled on this kiln-api (destinations.key_file)");
	r = destination_load(st, key, customer, &d, id, &err);
	if (r < 0)
		return reply_err(conn, &err);
	if (r == 0)
		return reply_not_found(conn, "no destination is set");
	r = destination_probe(&d, allow, &err);
	dest_wipe(&d);
	if (r < 0)
		return reply_dest(st, conn, MHD_HTTP_OK, customer, "test",
				  json_pack("{s:b, s:{s:s, s:s}}", "ok", 0, "error", "code", err.code, "message",
					    err.message));
	return reply_dest(st, conn, MHD_HTTP_OK, customer, "test", json_pack("{s:b}", "ok", 1));
}

enum MHD_Result destination_handle(struct store *st, const unsigned char *key, const struct netaddr_allow *allow,
				   const struct destination_hooks *hooks, struct MHD_Connection *conn, const char *method,
				   const char *customer, int test, const char *body, size_t len)
{
	if (test) {
		if (strcmp(method, "POST"))
			return reply_method_not_allowed(conn, "POST");
		return handle_test(st, key, allow, conn, customer);
	}
	if (!strcmp(method, "GET"))
		return reply_dest(st, conn, MHD_HTTP_OK, customer, NULL, NULL);
	if (!strcmp(method, "PUT"))
		return handle_put(st, key, allow, hooks, conn, customer, body, len);
	if (!strcmp(method, "DELETE")) {
		int r = store_dest_delete(st, customer);

		if (r < 0)
			return reply_internal(conn, "cannot delete the destination");
		if (r == 0)
			return reply_not_found(conn, "no destination is set");
		return reply_json(conn, MHD_HTTP_OK, json_pack("{s:b}", "deleted", 1));
	}
	return reply_method_not_allowed(conn, "GET, PUT, DELETE");
}
