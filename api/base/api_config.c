/* api_config: parse and validate kiln-api's JSON configuration file. */
#include "api_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "conf.h"
#include "destination.h"
#include "fsutil.h"
#include "store/store.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers" /* field tables leave min/max unset for strings */

/* kiln-api's wording of bad values, as it has always been. */
#define API_CONF_FLAGS (CONF_TOP_NAMED | CONF_INT_ONE_MESSAGE)

void api_config_defaults(struct api_config *c)
{
	memset(c, 0, sizeof(*c));
	c->listen = "127.0.0.1:8080";
	c->db = "/var/lib/kiln/api.db";
	c->presign_expiry_s = 3600;
	c->host_lost_after_s = 30;
	c->max_body_mib = 64;
	c->max_connections = 2048;
	c->max_connections_per_address = 64;
	c->connection_timeout_s = 300;
	quota_defaults(&c->quotas);
}

/* "x" and "x_file": one of them, the file read. */
static int secret(const char *value, const char *file_path, const char *name, const char *file, const char **out,
		  char **owned, struct kiln_err *err)
{
	if (value && file_path)
		return kiln_err_set(err, KERR_CONFIG, "%s: %s and %s_file: give one, not both", file, name, name);
	if (file_path) {
		char key[64];

		snprintf(key, sizeof(key), "%s_file", name);
		*owned = fs_read_secret(file_path, key, file, err);
		if (!*owned)
			return -1;
		*out = *owned;
	} else if (value) {
		*out = value;
	}
	return 0;
}

/* A sandbox domain: a DNS name, perhaps with :PORT (E2B's SDK puts it after
 * "<port>-<id>." in the host names getHost returns). */
static int domain_ok(const char *d)
{
	size_t n = strlen(d), i = 0;

	if (!n || n > 200 || d[0] == '.' || d[0] == '-')
		return 0;
	for (; i < n && d[i] != ':'; i++)
		if (!((d[i] >= 'a' && d[i] <= 'z') || (d[i] >= 'A' && d[i] <= 'Z') || (d[i] >= '0' && d[i] <= '9') ||
		      d[i] == '-' || d[i] == '.'))
			return 0;
	if (i < n) {
		size_t k = n - i - 1;

		if (k < 1 || k > 5 || strspn(d + i + 1, "0123456789") != k || atoi(d + i + 1) > 65535 || !atoi(d + i + 1))
			return 0;
	}
	return d[i - 1] != '.';
}

int api_config_load(const char *path, struct api_config *c, struct kiln_err *err)
{
	json_error_t je;
	json_t *s3 = NULL, *quotas = NULL, *dests = NULL, *store = NULL;
	json_t *tls = NULL, *hosts = NULL;
	const char *pg = NULL, *pg_file = NULL;
	const char *admin_key = NULL, *admin_key_file = NULL, *token = NULL, *token_file = NULL;
	const char *sk = NULL, *sk_file = NULL;
	struct kiln_err qerr;

	api_config_defaults(c);
	c->root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!c->root)
		return kiln_err_set(err, KERR_CONFIG, "%s:%d:%d: %s", path, je.line, je.column, je.text);
	{
		const struct conf_field top[] = {
			{ "listen", CONF_STR, &c->listen }, { "db", CONF_STR, &c->db },
			{ "admin_key", CONF_STR, &admin_key }, { "admin_key_file", CONF_STR, &admin_key_file },
			{ "cluster_token", CONF_STR, &token }, { "cluster_token_file", CONF_STR, &token_file },
			{ "s3", CONF_OBJ, &s3 }, { "presign_expiry_s", CONF_U32, &c->presign_expiry_s, 1, 604800 },
			{ "host_lost_after_s", CONF_U32, &c->host_lost_after_s, 1, 86400 },
			{ "quotas", CONF_OBJ, &quotas }, { "max_body_mib", CONF_U32, &c->max_body_mib, 1, 128 },
			{ "max_connections", CONF_U32, &c->max_connections, 16, 65536 },
			{ "max_connections_per_address", CONF_U32, &c->max_connections_per_address, 1, 65536 },
			{ "connection_timeout_s", CONF_U32, &c->connection_timeout_s, 5, 86400 },
			{ "destinations", CONF_OBJ, &dests }, { "public_url", CONF_STR, &c->public_url },
			{ "store", CONF_OBJ, &store }, { "ui_dir", CONF_STR, &c->ui_dir },
			{ "sandbox_domain", CONF_STR, &c->sandbox_domain }, { "tls", CONF_OBJ, &tls },
			{ "hosts", CONF_OBJ, &hosts }, { 0 },
		};
		if (conf_take(c->root, "", top, path, API_CONF_FLAGS, err) < 0)
			goto fail;
		if (c->public_url && ((strncmp(c->public_url, "http://", 7) && strncmp(c->public_url, "https://", 8)) ||
				      c->public_url[strlen(c->public_url) - 1] == '/' || strlen(c->public_url) > 255 ||
				      strpbrk(c->public_url, " \t\r\n\"<>\\^`{|}?#"))) {
			kiln_err_set(err, KERR_CONFIG,
				     "%s: public_url: expected an http:// or https:// URL of at most 255 characters, "
				     "without a query, fragment or trailing / (got \"%.300s\")",
				     path, c->public_url);
			goto fail;
		}
	}
	if (c->sandbox_domain && !domain_ok(c->sandbox_domain)) {
		kiln_err_set(err, KERR_CONFIG,
			     "%s: sandbox_domain: expected a DNS name (letters, digits, '-' and '.', at most 200 "
			     "characters), optionally with :PORT (got \"%.300s\")",
			     path, c->sandbox_domain);
		goto fail;
	}
	if (tls) {
		const struct conf_field f[] = { { "listen", CONF_STR, &c->tls_listen },
						{ "cert_file", CONF_STR, &c->tls_cert_file },
						{ "key_file", CONF_STR, &c->tls_key_file }, { 0 } };

		if (conf_take(tls, "tls", f, path, API_CONF_FLAGS, err) < 0)
			goto fail;
		if (!c->tls_listen || !c->tls_cert_file || !c->tls_key_file) {
			kiln_err_set(err, KERR_CONFIG, "%s: tls: listen, cert_file and key_file are required", path);
			goto fail;
		}
	}
	if (hosts) {
		const struct conf_field f[] = { { "ca_file", CONF_STR, &c->hosts_ca_file },
						{ "require_tls", CONF_BOOL, &c->hosts_require_tls }, { 0 } };

		if (conf_take(hosts, "hosts", f, path, API_CONF_FLAGS, err) < 0)
			goto fail;
		if (c->hosts_ca_file && access(c->hosts_ca_file, R_OK) < 0) {
			kiln_err_set(err, KERR_CONFIG, "%s: hosts.ca_file: cannot read %s: %s", path, c->hosts_ca_file,
				     strerror(errno));
			goto fail;
		}
	}
	if (s3) {
		const struct conf_field f[] = {
			{ "endpoint", CONF_STR, &c->s3.endpoint }, { "region", CONF_STR, &c->s3.region },
			{ "bucket", CONF_STR, &c->s3.bucket }, { "access_key", CONF_STR, &c->s3.access_key },
			{ "secret_key", CONF_STR, &sk }, { "secret_key_file", CONF_STR, &sk_file }, { 0 },
		};
		if (conf_take(s3, "s3", f, path, API_CONF_FLAGS, err) < 0)
			goto fail;
		if (!c->s3.endpoint || !c->s3.bucket || !c->s3.access_key || (!sk && !sk_file)) {
			kiln_err_set(err, KERR_CONFIG, "%s: s3: endpoint, bucket, access_key and secret_key are required", path);
			goto fail;
		}
		if (strncmp(c->s3.endpoint, "http://", 7) && strncmp(c->s3.endpoint, "https://", 8)) {
			kiln_err_set(err, KERR_CONFIG, "%s: s3.endpoint: expected an http:// or https:// URL", path);
			goto fail;
		}
		if (!c->s3.region)
			c->s3.region = "us-east-1";
		if (secret(sk, sk_file, "s3.secret_key", path, &c->s3.secret_key, &c->file_secret, err) < 0)
			goto fail;
	}
	if (dests) {
		json_t *allow = NULL;
		const struct conf_field f[] = { { "key_file", CONF_STR, &c->dest_key_file },
						{ "allow_addresses", CONF_OBJ, &allow }, { 0 } };
		struct kiln_err kerr = { .code = "" };

		if (conf_take(dests, "destinations", f, path, API_CONF_FLAGS, err) < 0)
			goto fail;
		if (netaddr_allow_from_json(&c->dest_allow, allow, "destinations.allow_addresses", &kerr) < 0) {
			kiln_err_set(err, KERR_CONFIG, "%s: %s", path, kerr.message);
			goto fail;
		}
		if (!c->dest_key_file) {
			kiln_err_set(err, KERR_CONFIG, "%s: destinations: key_file is required", path);
			goto fail;
		}
		if (destination_key_load(c->dest_key_file, c->dest_key, &kerr) < 0) {
			kiln_err_set(err, KERR_CONFIG, "%s: %s", path, kerr.message);
			goto fail;
		}
		c->have_dest_key = 1;
	}
	if (store) {
		const struct conf_field f[] = {
			{ "postgres", CONF_STR, &pg }, { "postgres_file", CONF_STR, &pg_file }, { 0 },
		};

		if (conf_take(store, "store", f, path, API_CONF_FLAGS, err) < 0)
			goto fail;
		if (!pg && !pg_file) {
			kiln_err_set(err, KERR_CONFIG, "%s: store: postgres or postgres_file is required", path);
			goto fail;
		}
		if (secret(pg, pg_file, "store.postgres", path, &c->postgres, &c->file_postgres, err) < 0)
			goto fail;
	}
	if (quotas && quota_from_json(quotas, "quotas", &c->quotas, &qerr) < 0) {
		kiln_err_set(err, KERR_CONFIG, "%s: %s", path, qerr.message);
		goto fail;
	}
	if (secret(admin_key, admin_key_file, "admin_key", path, &c->admin_key, &c->file_admin_key, err) < 0 ||
	    secret(token, token_file, "cluster_token", path, &c->cluster_token, &c->file_token, err) < 0)
		goto fail;
	if (c->admin_key && strlen(c->admin_key) < 16) {
		kiln_err_set(err, KERR_CONFIG, "%s: admin_key: at least 16 characters", path);
		goto fail;
	}
	return 0;
fail:
	api_config_free(c);
	return -1;
}

void api_config_free(struct api_config *c)
{
	OPENSSL_cleanse(c->dest_key, sizeof(c->dest_key));
	c->have_dest_key = 0;
	json_decref(c->root);
	free(c->file_admin_key);
	free(c->file_token);
	free(c->file_secret);
	free(c->file_postgres);
	c->root = NULL;
	c->file_admin_key = c->file_token = c->file_secret = c->file_postgres = NULL;
	c->postgres = NULL;
}
