/* host_config: parse and validate kiln-host's JSON configuration file. */
#include "host_config.h"
#include "net/net.h"
#include "vm/vm.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "fsutil.h"
#include "spec.h"
#include "task/task.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers" /* field tables leave min/max unset for strings */

int config_load(const char *path, struct host_config *c, struct kiln_err *err)
{
	json_error_t je;
	json_t *capacity = NULL, *pool = NULL, *s3 = NULL, *upload = NULL, *network = NULL, *outputs = NULL, *disk = NULL;
	json_t *templates = NULL, *sessions = NULL, *api = NULL, *dests = NULL, *tls = NULL;
	const char *token_file = NULL, *secret_file = NULL;
	uint64_t timeout = 0;
	int attempts = 0;

	memset(c, 0, sizeof(*c));
	c->pool_size = c->pool_max = c->prestart = c->snapshot_memory_mib = c->snapshot_vcpus = c->cold = -1;
	c->pool_refills = -1;
	c->session_prestart = c->session_save_pages = c->session_prepare_base = -1;
	c->session_pause_cache_mib = c->session_pause_cache_age_s = c->session_pause_cache_sweep_s = -1;
	c->root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!c->root)
		return kiln_err_set(err, KERR_CONFIG, "%s:%d:%d: %s", path, je.line, je.column, je.text);
	{
		const struct conf_field top[] = {
			{ "listen", CONF_STR, &c->listen }, { "host_id", CONF_STR, &c->host_id },
			{ "token", CONF_STR, &c->token }, { "token_file", CONF_STR, &token_file },
			{ "accel", CONF_STR, &c->accel }, { "image_dir", CONF_STR, &c->image_dir },
			{ "run_dir", CONF_STR, &c->run_dir }, { "cache", CONF_STR, &c->cache },
			{ "qemu", CONF_STR, &c->qemu }, { "spool_dir", CONF_STR, &c->spool_dir },
			{ "cold", CONF_BOOL, &c->cold }, { "capacity", CONF_OBJ, &capacity },
			{ "pool", CONF_OBJ, &pool }, { "s3", CONF_OBJ, &s3 }, { "upload", CONF_OBJ, &upload },
			{ "retention_s", CONF_U32, &c->retention_s, 60, 365 * 86400 }, { "api", CONF_OBJ, &api },
			{ "advertise_url", CONF_STR, &c->advertise_url }, { "api_ca_file", CONF_STR, &c->api_ca_file },
			{ "tls", CONF_OBJ, &tls },
			{ "heartbeat_ms", CONF_U32, &c->heartbeat_ms, 100, 60000 }, { "network", CONF_OBJ, &network },
			{ "outputs", CONF_OBJ, &outputs }, { "disk", CONF_OBJ, &disk },
			{ "debug_console", CONF_BOOL, &c->debug_console }, { "templates", CONF_OBJ, &templates },
			{ "max_connections", CONF_U32, &c->max_connections, 16, 65536 },
			{ "max_connections_per_address", CONF_U32, &c->max_connections_per_address, 1, 65536 },
			{ "connection_timeout_s", CONF_U32, &c->connection_timeout_s, 5, 86400 },
			{ "sessions", CONF_OBJ, &sessions }, { "destinations", CONF_OBJ, &dests }, { 0 },
		};
		if (conf_take(c->root, "", top, path, 0, err) < 0)
			goto fail;
	}
	if (dests) {
		json_t *allow = NULL;
		const struct conf_field f[] = { { "allow_addresses", CONF_OBJ, &allow }, { 0 } };
		struct kiln_err aerr = { .code = "" };

		if (conf_take(dests, "destinations", f, path, 0, err) < 0)
			goto fail;
		if (netaddr_allow_from_json(&c->dest_allow, allow, "destinations.allow_addresses", &aerr) < 0) {
			kiln_err_set(err, KERR_CONFIG, "%s: %s", path, aerr.message);
			goto fail;
		}
	}
	if (tls) {
		const struct conf_field f[] = { { "cert_file", CONF_STR, &c->tls_cert_file },
						{ "key_file", CONF_STR, &c->tls_key_file }, { 0 } };

		if (conf_take(tls, "tls", f, path, 0, err) < 0)
			goto fail;
		if (!c->tls_cert_file || !c->tls_key_file) {
			kiln_err_set(err, KERR_CONFIG, "%s: tls: cert_file and key_file are both required", path);
			goto fail;
		}
	}
	if (api) {
		char what[PATH_MAX + 8];

		snprintf(what, sizeof(what), "%s: api", path);
		if (apilist_add_json(&c->api, api, what, err) < 0)
			goto fail;
	}
	if (sessions) {
		const struct conf_field f[] = {
			{ "idle_stop_ms", CONF_U32, &c->session_idle_stop_ms, 0, 3600000 },
			{ "prestart", CONF_INT, &c->session_prestart, 0, 1 },
			{ "save_pages", CONF_INT, &c->session_save_pages, 0, 2 },
			{ "prepare_base", CONF_BOOL, &c->session_prepare_base },
			{ "pause_cache_mib", CONF_INT, &c->session_pause_cache_mib, 0, 1 << 20 },
			{ "pause_cache_max_age_s", CONF_INT, &c->session_pause_cache_age_s, 60, 30 * 86400 },
			{ "pause_cache_sweep_s", CONF_INT, &c->session_pause_cache_sweep_s, 1, 3600 }, { 0 },
		};
		if (conf_take(sessions, "sessions", f, path, 0, err) < 0)
			goto fail;
		c->session_idle_stop_set = json_object_get(sessions, "idle_stop_ms") != NULL;
	}
	if (disk) {
		const struct conf_field f[] = {
			{ "bps_mib", CONF_U64, &c->disk_bps_mib, 0, 1 << 20 },
			{ "iops", CONF_U64, &c->disk_iops, 0, 10000000 }, { 0 },
		};
		c->disk_bps_mib = VM_DISK_BPS >> 20;
		c->disk_iops = VM_DISK_IOPS;
		if (conf_take(disk, "disk", f, path, 0, err) < 0)
			goto fail;
		c->disk_set = 1;
	}
	if (outputs) {
		const struct conf_field f[] = {
			{ "max_entries", CONF_U32, &c->out_max_entries, 1, 10000000 },
			{ "max_depth", CONF_U32, &c->out_max_depth, 1, 1024 }, { 0 },
		};
		if (conf_take(outputs, "outputs", f, path, 0, err) < 0)
			goto fail;
	}
	if (templates) {
		json_t *pools = NULL, *ttl = NULL;
		const struct conf_field f[] = {
			{ "pools", CONF_OBJ, &pools }, { "disk_budget_mib", CONF_U64, &c->disk_budget_mib, 1, 1ull << 40 },
			{ "snapshot_ttl_s", CONF_OBJ, &ttl }, { "mirror", CONF_STR, &c->mirror }, { 0 },
		};
		const char *k;
		json_t *v;

		if (conf_take(templates, "templates", f, path, 0, err) < 0)
			goto fail;
		if (ttl) {
			if (!json_is_integer(ttl) || json_integer_value(ttl) < 0 || json_integer_value(ttl) > 365 * 86400) {
				kiln_err_set(err, KERR_CONFIG, "%s: templates.snapshot_ttl_s: expected 0..%d seconds (0: never)",
					     path, 365 * 86400);
				goto fail;
			}
			c->snapshot_ttl_s = (unsigned)json_integer_value(ttl);
			c->snapshot_ttl_set = 1;
		}
		if (pools && !json_is_object(pools)) {
			kiln_err_set(err, KERR_CONFIG, "%s: templates.pools: expected an object {\"NAME\": N}", path);
			goto fail;
		}
		json_object_foreach(pools, k, v) {
			/* N, or {"size": N, "max": M}: nothing else in the object. */
			json_t *n = json_is_object(v) ? json_object_get(v, "size") : v;
			json_t *m = json_is_object(v) ? json_object_get(v, "max") : NULL;
			size_t keys = json_is_object(v) ? json_object_size(v) : 1;

			if (spec_template_name_check(k, "templates.pools", NULL) < 0 || !json_is_integer(n) ||
			    json_integer_value(n) < 0 || json_integer_value(n) > 256 ||
			    (m && (!json_is_integer(m) || json_integer_value(m) < 0 || json_integer_value(m) > 256)) ||
			    keys != 1u + (m != NULL)) {
				kiln_err_set(err, KERR_CONFIG,
					     "%s: templates.pools.%.64s: expected a template name and 0..256, or "
					     "{\"size\": 0..256, \"max\": 0..256}",
					     path, k);
				goto fail;
			}
		}
		c->template_pools = pools;
		if (c->mirror && strncmp(c->mirror, "http://", 7) && strncmp(c->mirror, "https://", 8)) {
			kiln_err_set(err, KERR_CONFIG, "%s: templates.mirror: expected an http:// or https:// URL", path);
			goto fail;
		}
	}
	if (capacity) {
		const struct conf_field f[] = {
			{ "vcpus", CONF_U32, &c->vcpus, 1, 4096 },
			{ "idle_vcpus", CONF_U32, &c->idle_vcpus, 1, 1 << 24 },
			{ "memory_mib", CONF_U64, &c->memory_mib, 128, 1 << 30 },
			{ "cpu_overcommit", CONF_DOUBLE, &c->cpu_overcommit, 1, 64 },
			{ "memory_overcommit", CONF_DOUBLE, &c->memory_overcommit, 1, 32 }, { 0 },
		};
		if (conf_take(capacity, "capacity", f, path, 0, err) < 0)
			goto fail;
	}
	if (pool) {
		const struct conf_field f[] = {
			{ "size", CONF_INT, &c->pool_size, 0, 256 }, { "max", CONF_INT, &c->pool_max, 0, 256 },
			{ "prestart", CONF_INT, &c->prestart, 0, 256 }, { "refills", CONF_INT, &c->pool_refills, 1, 4 },
			{ "memory_mib", CONF_INT, &c->snapshot_memory_mib, 128, 16384 },
			{ "vcpus", CONF_INT, &c->snapshot_vcpus, 1, 16 }, { 0 },
		};
		if (conf_take(pool, "pool", f, path, 0, err) < 0)
			goto fail;
	}
	if (s3) {
		const struct conf_field f[] = {
			{ "endpoint", CONF_STR, &c->s3.endpoint }, { "region", CONF_STR, &c->s3.region },
			{ "bucket", CONF_STR, &c->s3.bucket }, { "access_key", CONF_STR, &c->s3.access_key },
			{ "secret_key", CONF_STR, &c->s3.secret_key }, { "secret_key_file", CONF_STR, &secret_file },
			{ "timeout_s", CONF_U64, &timeout, 1, 3600 }, { "attempts", CONF_INT, &attempts, 1, 20 }, { 0 },
		};
		if (conf_take(s3, "s3", f, path, 0, err) < 0)
			goto fail;
		if (!c->s3.endpoint || !c->s3.bucket) {
			kiln_err_set(err, KERR_CONFIG, "%s: s3: endpoint and bucket are required", path);
			goto fail;
		}
		if (strncmp(c->s3.endpoint, "http://", 7) && strncmp(c->s3.endpoint, "https://", 8)) {
			kiln_err_set(err, KERR_CONFIG, "%s: s3.endpoint: expected an http:// or https:// URL", path);
			goto fail;
		}
		c->s3.timeout_s = (long)timeout;
		c->s3.attempts = attempts;
	}
	if (upload) {
		const struct conf_field f[] = {
			{ "workers", CONF_U32, &c->upload_workers, 1, 64 },
			{ "max_backoff_s", CONF_U32, &c->max_backoff_s, 1, 3600 },
			{ "inline_max", CONF_U32, &c->upload_inline_max, 0, HOSTD_INLINE_MAX_LIMIT }, { 0 },
		};
		if (conf_take(upload, "upload", f, path, 0, err) < 0)
			goto fail;
		c->upload_inline_set = json_object_get(upload, "inline_max") != NULL;
	}
	if (token_file && c->token) {
		kiln_err_set(err, KERR_CONFIG, "%s: token and token_file: give one, not both", path);
		goto fail;
	}
	if (token_file) {
		c->file_token = fs_read_secret(token_file, "token_file", path, err);
		if (!c->file_token)
			goto fail;
		c->token = c->file_token;
	}
	if (secret_file && c->s3.secret_key) {
		kiln_err_set(err, KERR_CONFIG, "%s: s3: secret_key and secret_key_file: give one, not both", path);
		goto fail;
	}
	if (secret_file) {
		c->file_secret = fs_read_secret(secret_file, "s3.secret_key_file", path, err);
		if (!c->file_secret)
			goto fail;
		c->s3.secret_key = c->file_secret;
	}
	if (network) {
		/* Parsed and checked here, so that kiln-host refuses a bad file
		 * before it starts anything; used by serve. */
		struct net_host probe;

		if (!json_is_object(network)) {
			kiln_err_set(err, KERR_CONFIG, "%s: network: expected an object", path);
			goto fail;
		}
		if (net_config_check(network, &probe, err) < 0) {
			char m[sizeof(err->message)];

			snprintf(m, sizeof(m), "%s", err->message);
			kiln_err_set(err, KERR_CONFIG, "%s: %s", path, m);
			goto fail;
		}
		c->network = network;
	}
	return 0;
fail:
	config_free(c);
	return -1;
}

void config_free(struct host_config *c)
{
	json_decref(c->root);
	apilist_free(&c->api);
	free(c->file_token);
	free(c->file_secret);
	memset(c, 0, sizeof(*c));
}
