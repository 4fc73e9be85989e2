/* net: the network of a sandbox whose task asked for egress. Each such VM
 * gets its own network namespace holding the VM's tap, one end of a veth pair
 * to the host, NAT, and an nftables ruleset that drops everything but the
 * task's allowlist; host names resolve only through a resolver kiln-host runs
 * for that sandbox, which answers allowlisted names and lets exactly the
 * answered addresses through for their TTL. Operator deny ranges (private
 * networks, metadata, loopback, the host's own addresses, other sandboxes)
 * win over any rule. The namespace lives as long as its thread and tap: it
 * and everything in it go with net_sandbox_stop, or with the process. See
 * docs/architecture.md, "Network egress". Tasks without egress get no NIC.
 *
 * Room: the net room's one header (host/net/: a sandbox's namespace, veth,
 * tap, nftables and resolver). It may call lib/ only. */
#ifndef KILN_NET_H
#define KILN_NET_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "spec.h"

#define NET_MAX_RANGES 128

struct net_range {
	uint32_t addr;  /* host byte order, host bits zero */
	uint8_t prefix; /* 0..32 */
};

/* Host-wide egress settings and totals. Filled by net_host_init; read-only
 * afterwards except for the totals, which are updated under lock. */
struct net_host {
	int enabled;
	struct net_range link;             /* sandboxes' veth links, a /30 each (10.200.0.0/16) */
	struct net_range deny[NET_MAX_RANGES]; /* built-in + operator's + the host's own addresses */
	size_t ndeny;
	uint64_t bandwidth_bytes_s;        /* per sandbox and direction; 0: no cap */
	struct sockaddr_in dns_upstream;   /* where allowlisted names are resolved */
	int root_nsfd;                     /* the network namespace kiln-host started in */
	pthread_mutex_t lock;
	unsigned next_link;                /* allocation hint */
	uint64_t active, started;          /* sandboxes now, in all */
	uint64_t allowed, blocked, bytes_out, bytes_in, dns_queries, dns_refused; /* finished sandboxes' totals */
};

/* Per-sandbox counters (the result's "network" object). */
struct net_stats {
	uint64_t allowed;     /* connections let through (new flows matching a rule) */
	uint64_t blocked;     /* distinct flows dropped (a TCP retry of one connect counts once) */
	uint64_t bytes_out, bytes_in; /* IP bytes through the sandbox's NIC that were let through */
	uint64_t dns_queries, dns_refused;
};

/* Parse "A.B.C.D/P" or "A.B.C.D" (= /32) strictly, host bits zero.
 * Returns 0 or -1. */
int net_range_parse(const char *s, struct net_range *r);

/* Fill h from the "network" config section (NULL: defaults) without
 * touching the system: for checking a configuration file. 0 or -1 with err. */
int net_config_check(json_t *config, struct net_host *h, struct kiln_err *err);

/* Whether libnftables works here: `list ruleset` in the current network
 * namespace (needs CAP_NET_ADMIN), nothing changed. 0 or -1 with err set
 * to nftables' own words. For `kiln-host check-config`. */
int net_nft_check(struct kiln_err *err);

/* Set up host-wide egress from the "network" config section (NULL: the
 * defaults; settings listed in README "Configuration"): parse and check it,
 * open the current network namespace, turn on IPv4 forwarding, install the
 * host's own nftables table (inet kiln_host: nothing from sandboxes to the
 * host, between sandboxes or to denied ranges; masquerade out) and add the
 * host's own addresses to the deny ranges. Returns 0 or -1 with err set. */
int net_host_init(struct net_host *h, json_t *config, struct kiln_err *err);

/* Remove the host's table and release what net_host_init took. */
void net_host_fini(struct net_host *h);

/* Called on the sandbox's thread for each new blocked destination (a task's
 * first few hundred; later ones are only counted). proto: "tcp", "udp",
 * "icmp" or "other"; port 0 when there is none. */
typedef void (*net_blocked_fn)(void *ctx, const char *dst, unsigned port, const char *proto);

struct net_sandbox;

/* Create the network of one sandbox for rules[0..n) and start its thread
 * (resolver, counters). On success *out holds it and net_sandbox_tap_fd()
 * is the tap for QEMU (-netdev tap,fd=). Returns 0 or -1 with err set. */
int net_sandbox_start(struct net_host *h, const struct spec_net_rule *rules, size_t n, net_blocked_fn on_blocked,
		      void *ctx, struct net_sandbox **out, struct kiln_err *err);
int net_sandbox_tap_fd(const struct net_sandbox *s);

/* Take the sandbox off the network for good, the VM still running (a build
 * VM once its packages are in): every frame from the guest is dropped as it
 * enters the tap, the uplink to the host goes, the resolver stops listening.
 * Done in kiln-host's namespace, where neither the guest nor QEMU can undo
 * it. Waits for the sandbox's thread to have done it (up to 10 s). Returns 0
 * (also on NULL), or -1 with err: the network may still be up, so the caller
 * must stop the VM. Call from the thread that started the sandbox, before
 * net_sandbox_stop. */
int net_sandbox_cut(struct net_sandbox *s, struct kiln_err *err);

/* Replace the running sandbox's egress rules with rules[0..n) (0..
 * SPEC_MAX_NET_RULES, as spec_parse gives them; n 0: nothing is reachable,
 * every name is refused). Done on the sandbox's thread in its namespace, in
 * one nftables transaction (the old rules or the new, never a mix), after
 * which its resolver answers names by the new rules. Addresses resolved for
 * a host-name rule stay allowed when the rule at the same index names the
 * same host; otherwise they go. Established flows are checked again by
 * their guest's next packet: one the new rules let through goes on; a TCP
 * flow they do not is reset towards the guest, any other is dropped (both
 * counted and reported as blocked). Waits for the thread (up to 10 s).
 * Returns 0, or -1 with err: "not_running" when the sandbox was cut off
 * (net_sandbox_cut) or s is NULL, "busy" while an earlier update that timed
 * out is still pending, "net_error" when nftables refused (the old rules
 * stay). Any thread; rules are copied. */
int net_sandbox_update(struct net_sandbox *s, const struct spec_net_rule *rules, size_t n, struct kiln_err *err);

/* Stop the sandbox's thread, read its final counters into *st (may be NULL),
 * and free it; the namespace, tap, veth and rules go with it (the kernel
 * removes a namespace shortly after its last user). Call after QEMU exited.
 * Safe on NULL. */
void net_sandbox_stop(struct net_sandbox *s, struct net_stats *st);

/* The counters as a JSON object for the task result (new reference). */
json_t *net_stats_json(const struct net_stats *st);

#endif
