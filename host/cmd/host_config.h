/* host_config: the kiln-host configuration file (JSON). Every setting is optional;
 * command-line flags override it. Unknown keys are errors, so that a typo
 * never silently leaves a default in place. See README "Configuration". */
#ifndef KILN_HOST_CONFIG_H
#define KILN_HOST_CONFIG_H

#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "netaddr.h"
#include "s3.h"
#include "serve/serve.h"

struct host_config {
	const char *listen;          /* "ADDR:PORT" */
	const char *host_id;
	const char *token;           /* cluster token (or read from token_file) */
	struct apilist api;          /* "api": kiln-api URL(s) to heartbeat to (n 0: unset) */
	const char *advertise_url;   /* how kiln-api reaches us */
	const char *api_ca_file;     /* PEM CA verifying https:// api URLs (NULL: the system's) */
	const char *tls_cert_file, *tls_key_file; /* "tls": serve HTTPS with these (PEM; both or none) */
	unsigned heartbeat_ms;
	const char *accel, *image_dir, *run_dir, *cache, *qemu, *spool_dir;
	unsigned vcpus;              /* 0: unset */
	unsigned idle_vcpus;         /* capacity.idle_vcpus; 0: unset */
	double cpu_overcommit;       /* 0: unset */
	double memory_overcommit;    /* 0: unset */
	uint64_t memory_mib;         /* 0: unset */
	int pool_size, pool_max, prestart, snapshot_memory_mib, snapshot_vcpus; /* -1: unset */
	int pool_refills;                                                     /* -1: unset */
	int cold;                    /* -1: unset */
	unsigned upload_workers, max_backoff_s, retention_s; /* 0: unset */
	unsigned upload_inline_max; /* "upload": {"inline_max"} */
	int upload_inline_set;
	uint32_t out_max_entries, out_max_depth; /* "outputs" section; 0: unset */
	int debug_console;           /* keep each VM's whole console in vm/console.log */
	int disk_set;                /* a "disk" section: its values replace the defaults */
	uint64_t disk_bps_mib, disk_iops; /* per VM; 0: no limit */
	unsigned max_connections, max_connections_per_address, connection_timeout_s; /* 0: unset */
	struct s3_config s3;         /* s3.endpoint NULL: no S3 section */
	/* "destinations": {"allow_addresses": [...]}: the operator's
	 * exceptions to the addresses a customer's destination may not reach
	 * (lib/netaddr.h), the same list as kiln-api's; empty by default. */
	struct netaddr_allow dest_allow;
	json_t *network;             /* the "network" section (egress), checked by net_host_init */
	/* "templates" section (docs/templates.md): */
	json_t *template_pools;      /* {"NAME": N} warm pool sizes (NULL: none) */
	uint64_t disk_budget_mib;    /* 0: unset (no budget) */
	unsigned snapshot_ttl_s;     /* 0: unset */
	int snapshot_ttl_set;        /* "snapshot_ttl_s" given (0 there: never expire) */
	const char *mirror;          /* Debian mirror for recipe builds */
	unsigned session_idle_stop_ms; /* "sessions": {"idle_stop_ms"} (0 there: never stop) */
	int session_idle_stop_set;
	int session_prestart;          /* "sessions": {"prestart"}: 0 or 1; -1: unset */
	int session_save_pages;        /* "sessions": {"save_pages"}: 0, 1 or 2 (checked); -1: unset (on) */
	int session_prepare_base;      /* "sessions": {"prepare_base"}: 0 or 1; -1: unset (on) */
	int session_pause_cache_mib;   /* "sessions": {"pause_cache_mib"} (0: off); -1: unset */
	int session_pause_cache_age_s; /* "sessions": {"pause_cache_max_age_s"}; -1: unset */
	int session_pause_cache_sweep_s; /* "sessions": {"pause_cache_sweep_s"}; -1: unset */
	json_t *root;                /* owns every string above */
	char *file_token, *file_secret; /* read from *_file settings */
};

/* Load and validate path into c (zeroed first). Returns 0 or -1 with err set
 * (code "config", the message naming the key and the file). */
int config_load(const char *path, struct host_config *c, struct kiln_err *err);
void config_free(struct host_config *c);

#endif
