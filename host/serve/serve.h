/* serve: the kiln-host daemon's HTTP layer (libmicrohttpd, one thread per
 * connection) over hostd and the sessions. struct serve_opts is the
 * daemon's settings, which main.c turns into a running daemon.
 *
 * Room: the serve room's door (host/serve/: the daemon's HTTP routes,
 * the envd HTTP API, the heartbeat to kiln-api and its list of API servers).
 * It may call every room below it (session, template_build, task, template, run,
 * vm, net, envd) and lib/. The headers included at the end are part of this
 * door. */
#ifndef KILN_SERVE_H
#define KILN_SERVE_H

/* vCPUs handed out per host CPU when the configuration names none. */
#define SERVE_CPU_OVERCOMMIT 4.0

#include <netinet/in.h>

#include "apilist.h"

#include "err.h"
#include "run/run.h"
#include "s3.h"

struct serve_opts {
	const char *listen_host;      /* for messages */
	struct sockaddr_in *addr;     /* where to listen (loopback by default) */
	int port;
	const char *config_path;      /* reread on SIGHUP (S3 settings), may be NULL */
	const char *host_id;
	const char *token;            /* cluster token callers present as Bearer (required) */
	const char *spool_dir;
	unsigned pool_size;           /* warm VMs kept ready (0: none) */
	int pool_max;                 /* the pool may grow to this with demand (-1: 4 x pool_size) */
	unsigned pool_refills;        /* refills under way at once, per pool (0: half the CPUs, 1 to 4) */
	unsigned prestart;            /* QEMUs started ahead for restores (0: none) */
	unsigned snap_memory_mib, snap_vcpus; /* the snapshot (and pool) size */
	uint64_t memory_capacity_mib; /* 0: 80% of the host's RAM */
	unsigned vcpus_capacity;      /* 0: the host's CPUs */
	double cpu_overcommit;        /* vCPUs handed out per host CPU (0: SERVE_CPU_OVERCOMMIT) */
	unsigned idle_vcpus;          /* vCPUs admitted in all, idle sessions' included (0: 64 x the active total) */
	double memory_overcommit;     /* nominal guest MiB admitted per MiB of memory budget (default 1) */
	const struct s3_config *s3;   /* NULL: no S3 (only POST /v1/run works) */
	const struct netaddr_allow *dest_allow; /* destinations.allow_addresses (NULL: none) */
	unsigned upload_workers, max_backoff_s, retention_s;
	unsigned upload_inline_max;   /* logs up to this many bytes go inside manifest.json (0: never) */
	const struct apilist *api;    /* kiln-api URLs to heartbeat to (NULL or none: standalone) */
	const char *advertise;        /* URL kiln-api reaches this host at (default http(s)://listen) */
	const char *api_ca_file;      /* PEM CA verifying https:// api URLs (NULL: the system's) */
	const char *tls_cert_file, *tls_key_file; /* serve HTTPS (both or none) */
	unsigned heartbeat_ms;        /* 0: 1000 */
	unsigned max_connections;     /* open HTTP connections in all (0: 1024) */
	unsigned max_connections_per_address; /* from one IP address (0: 512; kiln-api is one address) */
	unsigned connection_timeout_s; /* an idle connection is closed after (0: 300) */
	const char *cache;            /* snapshot cache ($KILN_CACHE) */
	int cold;                     /* no snapshot, no pool: cold boot every task */
	json_t *network;              /* the config's "network" section (NULL: no egress) */
	/* Templates (docs/templates.md, "kiln-host's template store"). */
	const char *image_dir;        /* built-in images */
	json_t *template_pools;       /* {"NAME": N} (NULL: only the default's --pool) */
	uint64_t disk_budget_mib;     /* 0: no budget */
	unsigned snapshot_ttl_s;      /* 0: snapshots never expire */
	const char *mirror;           /* Debian mirror for recipe builds (NULL: the host's apt sources) */
	unsigned session_idle_stop_ms; /* stop an idle session's vCPUs after (0: never) */
	int session_prestart;          /* keep a session QEMU started ahead (1) or not (0); -1: as prestart > 0 */
	int session_save_pages;        /* a pause reads the changed pages itself (1, -1; 2: and checks them) or QEMU saves all (0) */
	int session_prepare_base;      /* snapshots' base RAM goes to S3 ahead of the first pause (1, -1) or with it (0) */
	unsigned session_pause_cache_mib, session_pause_cache_age_s, session_pause_cache_sweep_s; /* sessions_set_pause_cache */
};

struct hostd;
struct session_table;
struct serve_http;
struct template_builds;

/* What the HTTP layer serves and where. Everything is borrowed and must
 * outlive the server. */
struct serve_http_config {
	const char *host_id;          /* /healthz says it */
	const char *token;            /* the cluster token callers present as Bearer */
	const char *listen_host;      /* for messages */
	struct sockaddr_in *addr;
	int port;
	unsigned connection_timeout_s, max_connections, max_connections_per_address; /* 0: 300, 1024, 512 */
	const char *tls_cert, *tls_key; /* PEM text: serve HTTPS only (NULL: plain HTTP) */
	const struct run_opts *ro;    /* POST /v1/run */
	struct hostd *hostd;
	struct session_table *sessions;
	struct template_builds *builds;        /* NULL: POST /v1/builds is 503 */
};

/* Listen and serve on threads of libmicrohttpd's. NULL with err set. */
struct serve_http *serve_http_start(const struct serve_http_config *c, struct kiln_err *err);

/* Stop serving: open streams end, then the connection threads. NULL: no-op. */
void serve_http_stop(struct serve_http *h);

/* The rest of the door: the room's other modules other rooms use. */
#include "heartbeat.h"

#endif
