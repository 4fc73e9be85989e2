/* config: parse and validate kiln-host's JSON configuration file. */
#include "config.h"
#include "vm.h"
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers" /* field tables leave min/max unset for strings */

struct field {
	const char *name;
	char type;     /* 's' string, 'u' unsigned, 'b' bool, 'd' number, 'o' object */
	void *out;
	double min, max;
};

/* Check obj's keys against fields and store the values. */
static int take(json_t *obj, const char *where, const struct field *fields, const char *file, struct kiln_err *err)
{
	const char *k;
	json_t *v;

	if (!json_is_object(obj))
		return kiln_err_set(err, "config", "%s: %s: expected an object", file, where);
	json_object_foreach(obj, k, v) {
		const struct field *f = fields;

		while (f->name && strcmp(f->name, k))
			f++;
		if (!f->name)
			return kiln_err_set(err, "config", "%s: %s%s%s: unknown setting", file, where, *where ? "." : "", k);
		switch (f->type) {
		case 's':
			if (!json_is_string(v) || !json_string_length(v))
				return kiln_err_set(err, "config", "%s: %s%s%s: expected a non-empty string", file, where,
						    *where ? "." : "", k);
			*(const char **)f->out = json_string_value(v);
			break;
		case 'u':
		case 'i':
		case 'd': {
			double x;

			if (!json_is_number(v) || (f->type != 'd' && !json_is_integer(v)))
				return kiln_err_set(err, "config", "%s: %s%s%s: expected a number", file, where,
						    *where ? "." : "", k);
			x = json_number_value(v);
			if (x < f->min || x > f->max)
				return kiln_err_set(err, "config", "%s: %s%s%s: expected %g..%g", file, where,
						    *where ? "." : "", k, f->min, f->max);
			if (f->type == 'u')
				*(uint64_t *)f->out = (uint64_t)x;
			else if (f->type == 'i')
				*(int *)f->out = (int)x;
			else
				*(double *)f->out = x;
			break;
		}
		case 'b':
			if (!json_is_boolean(v))
				return kiln_err_set(err, "config", "%s: %s%s%s: expected true or false", file, where,
						    *where ? "." : "", k);
			*(int *)f->out = json_is_true(v);
			break;
		case 'o':
			*(json_t **)f->out = v;
			break;
		}
	}
	return 0;
}

int config_load(const char *path, struct host_config *c, struct kiln_err *err)
{
	json_error_t je;
	json_t *capacity = NULL, *pool = NULL, *s3 = NULL, *upload = NULL, *network = NULL, *outputs = NULL, *disk = NULL;
	const char *token_file = NULL, *secret_file = NULL;
	uint64_t heartbeat = 0, vcpus = 0, memory = 0, workers = 0, backoff = 0, retention = 0, timeout = 0;
	uint64_t out_entries = 0, out_depth = 0;
	uint64_t max_conns = 0, per_addr = 0, conn_timeout = 0;
	int attempts = 0;

	memset(c, 0, sizeof(*c));
	c->pool_size = c->prestart = c->snapshot_memory_mib = c->snapshot_vcpus = c->cold = -1;
	c->root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!c->root)
		return kiln_err_set(err, "config", "%s:%d:%d: %s", path, je.line, je.column, je.text);
	{
		const struct field top[] = {
			{ "listen", 's', &c->listen }, { "host_id", 's', &c->host_id }, { "token", 's', &c->token },
			{ "token_file", 's', &token_file }, { "accel", 's', &c->accel }, { "image_dir", 's', &c->image_dir },
			{ "run_dir", 's', &c->run_dir }, { "cache", 's', &c->cache }, { "qemu", 's', &c->qemu },
			{ "spool_dir", 's', &c->spool_dir }, { "cold", 'b', &c->cold }, { "capacity", 'o', &capacity },
			{ "pool", 'o', &pool }, { "s3", 'o', &s3 }, { "upload", 'o', &upload },
			{ "retention_s", 'u', &retention, 60, 365 * 86400 }, { "api", 's', &c->api },
			{ "advertise_url", 's', &c->advertise_url }, { "heartbeat_ms", 'u', &heartbeat, 100, 60000 },
			{ "network", 'o', &network }, { "outputs", 'o', &outputs }, { "disk", 'o', &disk },
			{ "debug_console", 'b', &c->debug_console },
			{ "max_connections", 'u', &max_conns, 16, 65536 },
			{ "max_connections_per_address", 'u', &per_addr, 1, 65536 },
			{ "connection_timeout_s", 'u', &conn_timeout, 5, 86400 }, { 0 },
		};
		if (take(c->root, "", top, path, err) < 0)
			goto fail;
	}
	if (disk) {
		const struct field f[] = {
			{ "bps_mib", 'u', &c->disk_bps_mib, 0, 1 << 20 }, { "iops", 'u', &c->disk_iops, 0, 10000000 }, { 0 },
		};
		c->disk_bps_mib = VM_DISK_BPS >> 20;
		c->disk_iops = VM_DISK_IOPS;
		if (take(disk, "disk", f, path, err) < 0)
			goto fail;
		c->disk_set = 1;
	}
	if (outputs) {
		const struct field f[] = {
			{ "max_entries", 'u', &out_entries, 1, 10000000 }, { "max_depth", 'u', &out_depth, 1, 1024 }, { 0 },
		};
		if (take(outputs, "outputs", f, path, err) < 0)
			goto fail;
		c->out_max_entries = (uint32_t)out_entries;
		c->out_max_depth = (uint32_t)out_depth;
	}
	if (capacity) {
		const struct field f[] = {
			{ "vcpus", 'u', &vcpus, 1, 4096 }, { "memory_mib", 'u', &memory, 128, 1 << 30 },
			{ "cpu_overcommit", 'd', &c->cpu_overcommit, 1, 64 }, { 0 },
		};
		if (take(capacity, "capacity", f, path, err) < 0)
			goto fail;
	}
	if (pool) {
		const struct field f[] = {
			{ "size", 'i', &c->pool_size, 0, 256 }, { "prestart", 'i', &c->prestart, 0, 256 },
			{ "memory_mib", 'i', &c->snapshot_memory_mib, 128, 16384 }, { "vcpus", 'i', &c->snapshot_vcpus, 1, 16 },
			{ 0 },
		};
		if (take(pool, "pool", f, path, err) < 0)
			goto fail;
	}
	if (s3) {
		const struct field f[] = {
			{ "endpoint", 's', &c->s3.endpoint }, { "region", 's', &c->s3.region }, { "bucket", 's', &c->s3.bucket },
			{ "access_key", 's', &c->s3.access_key }, { "secret_key", 's', &c->s3.secret_key },
			{ "secret_key_file", 's', &secret_file }, { "timeout_s", 'u', &timeout, 1, 3600 },
			{ "attempts", 'i', &attempts, 1, 20 }, { 0 },
		};
		if (take(s3, "s3", f, path, err) < 0)
			goto fail;
		if (!c->s3.endpoint || !c->s3.bucket) {
			kiln_err_set(err, "config", "%s: s3: endpoint and bucket are required", path);
			goto fail;
		}
		if (strncmp(c->s3.endpoint, "http://", 7) && strncmp(c->s3.endpoint, "https://", 8)) {
			kiln_err_set(err, "config", "%s: s3.endpoint: expected an http:// or https:// URL", path);
			goto fail;
		}
		c->s3.timeout_s = (long)timeout;
		c->s3.attempts = attempts;
	}
	if (upload) {
		const struct field f[] = {
			{ "workers", 'u', &workers, 1, 64 }, { "max_backoff_s", 'u', &backoff, 1, 3600 }, { 0 },
		};
		if (take(upload, "upload", f, path, err) < 0)
			goto fail;
	}
	if (token_file && c->token) {
		kiln_err_set(err, "config", "%s: token and token_file: give one, not both", path);
		goto fail;
	}
	if (token_file) {
		c->file_token = fs_read_secret(token_file, "token_file", path, err);
		if (!c->file_token)
			goto fail;
		c->token = c->file_token;
	}
	if (secret_file && c->s3.secret_key) {
		kiln_err_set(err, "config", "%s: s3: secret_key and secret_key_file: give one, not both", path);
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
			kiln_err_set(err, "config", "%s: network: expected an object", path);
			goto fail;
		}
		if (net_config_check(network, &probe, err) < 0) {
			char m[sizeof(err->message)];

			snprintf(m, sizeof(m), "%s", err->message);
			kiln_err_set(err, "config", "%s: %s", path, m);
			goto fail;
		}
		c->network = network;
	}
	c->heartbeat_ms = (unsigned)heartbeat;
	c->vcpus = (unsigned)vcpus;
	c->memory_mib = memory;
	c->upload_workers = (unsigned)workers;
	c->max_backoff_s = (unsigned)backoff;
	c->retention_s = (unsigned)retention;
	c->max_connections = (unsigned)max_conns;
	c->max_connections_per_address = (unsigned)per_addr;
	c->connection_timeout_s = (unsigned)conn_timeout;
	return 0;
fail:
	config_free(c);
	return -1;
}

void config_free(struct host_config *c)
{
	json_decref(c->root);
	free(c->file_token);
	free(c->file_secret);
	memset(c, 0, sizeof(*c));
}
