/* check_config: `kiln-api check-config FILE` (server.h): everything kiln-api
 * would use, checked without serving: listen addresses, the store, the TLS
 * pair, S3 and the console's files. It opens no listener, creates no file
 * and changes no database: the store is only connected to. */
#include "server_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


#include "cfgcheck.h"
#include "s3.h"
#include "ui.h"

static void check_listen(struct cfgcheck *c, const char *setting, const char *listen, const char *scheme)
{
	struct sockaddr_in sa;

	if (server_parse_listen(listen, &sa) < 0)
		cfgcheck_error(c, setting, "expected IPv4-ADDRESS:PORT, got \"%s\"", listen);
	else
		cfgcheck_use(c, setting, "%s://%s", scheme, listen);
}

static void check_store(struct cfgcheck *c, const struct api_config *cfg)
{
	const char *pg = cfg->postgres;
	struct kiln_err err = { .code = "" };
	char dir[PATH_MAX], *slash;
	struct stat st;
	int version;

	/* store_open takes a postgresql:// URI in db too. */
	if (!pg && (!strncmp(cfg->db, "postgresql://", 13) || !strncmp(cfg->db, "postgres://", 11)))
		pg = cfg->db;
	if (pg) {
		const char *setting = pg == cfg->db ? "db" : "store.postgres";

		/* The conninfo may hold a password: it is not printed. */
		cfgcheck_use(c, "store", "postgresql (%s)", setting);
		if (store_pg_ping(pg, &version, &err) < 0)
			cfgcheck_error(c, setting, "cannot connect: %s", err.message);
		else
			cfgcheck_use(c, setting, "reachable (server version %d.%d)", version / 10000, version % 10000);
		return;
	}
	cfgcheck_use(c, "store", "sqlite");
	if (strlen(cfg->db) >= sizeof(dir)) {
		cfgcheck_error(c, "db", "path longer than %d bytes", PATH_MAX - 1);
		return;
	}
	if (!access(cfg->db, F_OK)) {
		if (access(cfg->db, R_OK | W_OK) < 0)
			cfgcheck_error(c, "db", "%s exists but is not readable and writable: %s", cfg->db, strerror(errno));
		else
			cfgcheck_use(c, "db", "%s (exists)", cfg->db);
		return;
	}
	/* SQLite creates the file (and its -wal and -shm beside it), not the
	 * directory: that must exist and be writable. */
	strcpy(dir, cfg->db);
	slash = strrchr(dir, '/');
	if (!slash)
		strcpy(dir, ".");
	else if (slash == dir)
		strcpy(dir, "/");
	else
		*slash = '\0';
	if (stat(dir, &st) < 0)
		cfgcheck_error(c, "db", "directory %s of %s: %s", dir, cfg->db, strerror(errno));
	else if (!S_ISDIR(st.st_mode))
		cfgcheck_error(c, "db", "%s (the directory of %s) is not a directory", dir, cfg->db);
	else if (access(dir, W_OK | X_OK) < 0)
		cfgcheck_error(c, "db", "directory %s of %s is not writable: %s", dir, cfg->db, strerror(errno));
	else
		cfgcheck_use(c, "db", "%s (will be created)", cfg->db);
}

static void check_tls(struct cfgcheck *c, const struct api_config *cfg)
{
	if (!cfg->tls_listen) {
		cfgcheck_use(c, "tls", "off");
	} else {
		check_listen(c, "tls.listen", cfg->tls_listen, "https");
		cfgcheck_tls_pair(c, "tls", cfg->tls_cert_file, cfg->tls_key_file);
	}
	if (cfg->hosts_ca_file)
		cfgcheck_ca_file(c, "hosts.ca_file", cfg->hosts_ca_file);
	else
		cfgcheck_use(c, "hosts.ca_file", "none: https:// hosts are verified with the system's CAs");
	if (cfg->hosts_require_tls)
		cfgcheck_use(c, "hosts.require_tls", "yes: a host that heartbeats an http:// URL is refused");
	else
		cfgcheck_use(c, "hosts.require_tls", "no: http:// hosts are accepted (the cluster token crosses in clear)");
}

int server_check_config(const struct api_config *cfg, const char *path)
{
	struct cfgcheck c = { .out = stdout, .problems = stderr };
	char buf[PATH_MAX];
	const char *ui;

	fprintf(stdout, "kiln-api: %s would use:\n", path);
	check_listen(&c, "listen", cfg->listen, "http");
	cfgcheck_use(&c, "public_url", "%s", cfg->public_url ? cfg->public_url : "(http://<listen>)");
	check_tls(&c, cfg);
	check_store(&c, cfg);
	if (cfg->s3.endpoint) {
		s3_global_init();
		cfgcheck_s3(&c, "s3", &cfg->s3);
	} else {
		cfgcheck_use(&c, "s3", "none (task outputs get no URL)");
	}
	ui = cfg->ui_dir ? cfg->ui_dir : ui_default_dir(buf, sizeof(buf));
	if (!ui)
		cfgcheck_warn(&c, "ui_dir", "no web console found beside the binary; /ui will answer 404");
	else if (access(ui, R_OK | X_OK) < 0)
		cfgcheck_error(&c, "ui_dir", "%s: %s", ui, strerror(errno));
	else
		cfgcheck_use(&c, "ui_dir", "%s", ui);
	cfgcheck_use(&c, "admin_key", "%s", cfg->admin_key ? "set" : "not set");
	if (!cfg->admin_key)
		cfgcheck_warn(&c, "admin_key", "not set: nobody can create customers or keys");
	cfgcheck_use(&c, "cluster_token", "%s", cfg->cluster_token ? "set" : "not set");
	if (!cfg->cluster_token)
		cfgcheck_warn(&c, "cluster_token", "not set: no host can register");
	cfgcheck_use(&c, "destinations.key_file", "%s", cfg->have_dest_key ? cfg->dest_key_file : "not set");
	cfgcheck_use(&c, "sandbox_domain", "%s", cfg->sandbox_domain ? cfg->sandbox_domain : "not set");
	cfgcheck_use(&c, "limits", "max_body_mib %u, max_connections %u (%u per address), timeout %u s",
		     cfg->max_body_mib, cfg->max_connections, cfg->max_connections_per_address, cfg->connection_timeout_s);
	if (c.errors)
		fprintf(stderr, "kiln-api: %s: %d problem(s)\n", path, c.errors);
	else
		fprintf(stdout, "kiln-api: %s: configuration ok (%d warning(s))\n", path, c.warnings);
	return c.errors;
}
