/* serve: the kiln-host daemon (snapshot + warm pool + HTTP task endpoint). */
#ifndef KILN_SERVE_H
#define KILN_SERVE_H

#include <netinet/in.h>

#include "run.h"

struct serve_opts {
	const char *listen_host;      /* for messages */
	struct sockaddr_in *addr;     /* where to listen (loopback by default) */
	int port;
	unsigned pool_size;           /* warm VMs kept ready (0: none) */
	unsigned prestart;            /* QEMUs started ahead for restores (0: none) */
	unsigned snap_memory_mib, snap_vcpus; /* the snapshot (and pool) size */
	uint64_t memory_capacity_mib; /* 0: 80% of the host's RAM */
	const char *cache;            /* snapshot cache ($KILN_CACHE) */
	int cold;                     /* no snapshot, no pool: cold boot every task */
};

/* Run until SIGINT/SIGTERM. Returns the process exit status. */
int serve_main(const struct serve_opts *o, const struct run_opts *ro);

#endif
