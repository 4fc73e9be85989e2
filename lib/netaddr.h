/* netaddr: which addresses a customer's S3 destination may resolve to. One
 * classifier (loopback, link-local, private v4/v6, CGNAT, unspecified,
 * multicast, reserved, this machine's own) used by kiln-api (PUT and test of
 * a destination) and kiln-host (each connection of an upload), the
 * operator's allow-list of exceptions (on-premises MinIO), and the check of
 * an endpoint's resolved addresses that lib/s3.c pins its connection to, so
 * that a second DNS answer cannot swap a checked address for another. */
#ifndef KILN_NETADDR_H
#define KILN_NETADDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <jansson.h>

#include "err.h"

/* Why an address is refused; NETADDR_PUBLIC is the one that is not. */
enum netaddr_class {
	NETADDR_PUBLIC = 0,
	NETADDR_UNSPECIFIED, /* 0.0.0.0/8, :: */
	NETADDR_LOOPBACK,    /* 127/8, ::1 */
	NETADDR_LINK_LOCAL,  /* 169.254/16 (cloud metadata), fe80::/10 */
	NETADDR_PRIVATE,     /* 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10 */
	NETADDR_CGNAT,       /* 100.64/10 */
	NETADDR_MULTICAST,   /* 224/4, ff00::/8 */
	NETADDR_RESERVED,    /* 192.0.0/24, 198.18/15, 240/4 (with broadcast) */
	NETADDR_OWN,         /* one of this machine's interface addresses */
};

/* One address as the classifier sees it: 4 or 16 bytes, network order. */
struct netaddr {
	int family; /* AF_INET or AF_INET6 */
	uint8_t a[16];
};

/* "loopback", "link-local", ... ("public" for NETADDR_PUBLIC). */
const char *netaddr_class_name(enum netaddr_class c);

/* The class of a by its address alone (not NETADDR_OWN). An IPv6 address
 * that carries an IPv4 one (v4-mapped ::ffff:0:0/96, v4-compatible ::/96,
 * NAT64 64:ff9b::/96, 6to4 2002::/16) is classed by that IPv4 address.
 * Pure, thread-safe. */
enum netaddr_class netaddr_classify(const struct netaddr *a);

/* a from a sockaddr (AF_INET or AF_INET6): 0, or -1 for another family. */
int netaddr_from_sockaddr(const struct sockaddr *sa, struct netaddr *a);

#define NETADDR_OWN_MAX 256

/* This machine's interface addresses (getifaddrs), read afresh at each call:
 * a new address on an interface counts from the next check. */
struct netaddr_own {
	size_t n;
	struct netaddr a[NETADDR_OWN_MAX];
};

/* Fill own from getifaddrs. 0, or -errno (own is then empty). Thread-safe. */
int netaddr_own_load(struct netaddr_own *own);

#define NETADDR_ALLOW_MAX 64

/* The operator's exceptions: address ranges (and optionally one port) a
 * destination may resolve to although their class is refused. */
struct netaddr_range {
	struct netaddr a;
	unsigned prefix; /* 0..32 or 0..128 */
	unsigned port;   /* 0: any port */
};
struct netaddr_allow {
	size_t n;
	struct netaddr_range r[NETADDR_ALLOW_MAX];
};

/* Add one entry: "10.1.2.3", "10.0.0.0/8", "10.1.2.3:9000",
 * "10.0.0.0/8:9000", "fd00::/8", "::1", "[::1]:9000", "[fd00::/8]:9000".
 * 0, or -1 with err ("config", naming the entry and the problem; the caller
 * adds the file and setting). */
int netaddr_allow_add(struct netaddr_allow *al, const char *entry, struct kiln_err *err);

/* Fill al from a JSON array of such strings (NULL or absent: empty). name is
 * the setting for messages ("destinations.allow_addresses"). 0 or -1 with err
 * ("config"). */
int netaddr_allow_from_json(struct netaddr_allow *al, const json_t *arr, const char *name, struct kiln_err *err);

/* Whether al admits a on port. */
int netaddr_allowed(const struct netaddr_allow *al, const struct netaddr *a, unsigned port);

/* The verdict on one address to be connected to on port: NETADDR_PUBLIC
 * when it may be (public and not own, or admitted by al, which may be
 * NULL), else its class. own may be NULL (not checked). Pure. */
enum netaddr_class netaddr_check(const struct netaddr *a, unsigned port, const struct netaddr_allow *al,
				 const struct netaddr_own *own);

/* An endpoint "http(s)://HOST[:PORT][/]" split: host without brackets
 * (an IPv6 literal as written inside them), the port (80/443 by the
 * scheme when absent). 0, or -1 when the text is not of that shape
 * (lib/dest.c validates destinations before: this must accept every
 * endpoint it accepts; tests/fuzz/fuzz_dest.c checks so). Pure. */
int netaddr_endpoint_split(const char *endpoint, char *host, size_t host_size, unsigned *port);

#define NETADDR_RESOLVED_MAX 16

/* An endpoint's host, port and the addresses its host resolved to. */
struct netaddr_resolved {
	char host[256];
	unsigned port;
	size_t n;
	struct netaddr a[NETADDR_RESOLVED_MAX]; /* the first ones, all checked */
};

/* Resolve endpoint's host (getaddrinfo, TCP, waiting at most timeout_ms:
 * a slow name server cannot hold the caller longer) and check every address it
 * resolves to with netaddr_check against al and own: one refused address
 * refuses the endpoint (a name whose answers mix a public and a private
 * address is refused, whichever one a client would pick). 0 with out
 * filled; -1 with err: "destination_forbidden" naming the address and its
 * class, "s3_unavailable" when the name does not resolve (DNS may be down),
 * "invalid_request" for a malformed endpoint. This gives the clear early
 * answer; the connection itself is held to the same rule by
 * netaddr_check_connect, whatever a later DNS answer says. Blocks on DNS;
 * any thread. */
int netaddr_check_endpoint(const char *endpoint, const struct netaddr_allow *al, const struct netaddr_own *own,
			   long timeout_ms, struct netaddr_resolved *out, struct kiln_err *err);

/* The same rule for the address a socket is about to connect to (its port
 * included): NETADDR_PUBLIC when it may. */
enum netaddr_class netaddr_check_connect(const struct sockaddr *sa, const struct netaddr_allow *al,
					 const struct netaddr_own *own);

/* The address as text (inet_ntop) into buf (at least 46 bytes). */
const char *netaddr_str(const struct netaddr *a, char *buf, size_t size);

#endif
