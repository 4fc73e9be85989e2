/* api_config: kiln-api's JSON configuration file (README, "kiln-api
 * configuration"). Every key but the secrets' is optional; unknown keys are
 * errors; command-line flags override the file. */
#ifndef KILN_API_CONFIG_H
#define KILN_API_CONFIG_H

#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "netaddr.h"
#include "s3.h"
#include "store/store.h"

struct api_config {
	const char *listen;          /* "ADDR:PORT", default 127.0.0.1:8080 */
	const char *db;              /* SQLite file, default /var/lib/kiln/api.db */
	/* store.postgres (or the file store.postgres_file names, which keeps
	 * a password out of the configuration): a libpq conninfo, a
	 * postgresql:// URI or key=value pairs. Set: the store is PostgreSQL
	 * and db is not used. */
	const char *postgres;
	const char *admin_key;       /* accepted as an admin key; may be NULL */
	const char *cluster_token;   /* hosts present it (heartbeats); may be NULL */
	struct s3_config s3;         /* s3.endpoint NULL: outputs get no url */
	unsigned presign_expiry_s;   /* default 3600 */
	const char *public_url;      /* clients reach kiln-api here (links it signs); NULL: http://<listen> */
	unsigned host_lost_after_s;  /* default 30 */
	struct quota quotas;         /* defaults for new customers */
	unsigned max_body_mib;       /* POST body limit, default 64 */
	unsigned max_connections;    /* open HTTP connections in all, default 2048 */
	unsigned max_connections_per_address; /* from one client IP address, default 64 */
	unsigned connection_timeout_s; /* an idle connection is closed after, default 300 */
	/* destinations.key_file: the key that seals customers' own S3
	 * destinations' secrets (api/base/destination.h); without it customers
	 * cannot set one, and tasks of those that have one fail. */
	const char *dest_key_file;
	/* destinations.allow_addresses: the operator's exceptions to the
	 * addresses a destination may not resolve to (lib/netaddr.h: an
	 * on-premises MinIO on a private network); empty by default. */
	struct netaddr_allow dest_allow;
	/* ui_dir: the web console's files (api/http/ui.h); NULL: looked up beside
	 * the binary. */
	const char *ui_dir;
	/* sandbox_domain: the domain of sandboxes' host names (E2B's
	 * `<port>-<id>.<domain>`: docs/api.md "Ports"); returned as `domain` by
	 * E2B's create and connect. NULL: none (host names are not routed). */
	const char *sandbox_domain;
	/* tls: a second listener that speaks TLS with the operator's
	 * certificate (PEM files, read again on SIGHUP). NULL: none. */
	const char *tls_listen, *tls_cert_file, *tls_key_file;
	/* hosts: how kiln-api reaches kiln-hosts. ca_file (PEM) verifies an
	 * https:// host (NULL: the system's CAs); require_tls refuses a
	 * heartbeat that names an http:// URL, so that the cluster token never
	 * goes to a host in clear. */
	const char *hosts_ca_file;
	int hosts_require_tls;
	unsigned char dest_key[32];
	int have_dest_key;
	json_t *root;                /* owns the strings above */
	char *file_admin_key, *file_token, *file_secret, *file_postgres;
};

/* Built-in defaults only (no file): for tests and flags-only runs. */
void api_config_defaults(struct api_config *c);

/* Defaults, then path over them. 0, or -1 with err set (code "config", the
 * message naming the file and the key); *c is freed then. */
int api_config_load(const char *path, struct api_config *c, struct kiln_err *err);
void api_config_free(struct api_config *c);

#endif
