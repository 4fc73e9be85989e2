/* netaddr: the address classifier, the operator's allow-list and the
 * checked resolution of a destination's endpoint (see netaddr.h). */
#include "netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *netaddr_class_name(enum netaddr_class c)
{
	switch (c) {
	case NETADDR_PUBLIC:
		return "public";
	case NETADDR_UNSPECIFIED:
		return "unspecified";
	case NETADDR_LOOPBACK:
		return "loopback";
	case NETADDR_LINK_LOCAL:
		return "link-local";
	case NETADDR_PRIVATE:
		return "private";
	case NETADDR_CGNAT:
		return "CGNAT";
	case NETADDR_MULTICAST:
		return "multicast";
	case NETADDR_RESERVED:
		return "reserved";
	case NETADDR_OWN:
		return "this machine's own";
	}
	return "unknown";
}

static uint32_t v4_of(const uint8_t *b)
{
	return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static int in_v4(uint32_t x, uint32_t net, unsigned prefix)
{
	uint32_t mask = prefix ? ~(uint32_t)0 << (32 - prefix) : 0;

	return (x & mask) == net;
}

static enum netaddr_class classify_v4(uint32_t x)
{
	if (in_v4(x, 0x00000000, 8))
		return NETADDR_UNSPECIFIED;
	if (in_v4(x, 0x7f000000, 8))
		return NETADDR_LOOPBACK;
	if (in_v4(x, 0xa9fe0000, 16))
		return NETADDR_LINK_LOCAL;
	if (in_v4(x, 0x0a000000, 8) || in_v4(x, 0xac100000, 12) || in_v4(x, 0xc0a80000, 16))
		return NETADDR_PRIVATE;
	if (in_v4(x, 0x64400000, 10))
		return NETADDR_CGNAT;
	if (in_v4(x, 0xe0000000, 4))
		return NETADDR_MULTICAST;
	if (in_v4(x, 0xf0000000, 4) || in_v4(x, 0xc0000000, 24) || in_v4(x, 0xc6120000, 15))
		return NETADDR_RESERVED;
	return NETADDR_PUBLIC;
}

static const uint8_t zero12[12];
static const uint8_t mapped_pfx[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
static const uint8_t nat64_pfx[12] = { 0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0 };

/* An IPv6 address that is an IPv4 one written another way (v4-mapped, or
 * the deprecated v4-compatible form other than :: and ::1) as that IPv4
 * address; others unchanged. Allow-list and own-address comparisons are
 * made on this form. */
static struct netaddr norm(const struct netaddr *a)
{
	struct netaddr n = *a;

	if (a->family == AF_INET6 &&
	    (!memcmp(a->a, mapped_pfx, 12) || (!memcmp(a->a, zero12, 12) && v4_of(a->a + 12) > 1))) {
		memset(&n, 0, sizeof(n));
		n.family = AF_INET;
		memcpy(n.a, a->a + 12, 4);
	}
	return n;
}

enum netaddr_class netaddr_classify(const struct netaddr *a0)
{
	struct netaddr a = norm(a0);
	const uint8_t *b = a.a;

	if (a.family == AF_INET)
		return classify_v4(v4_of(b));
	if (a.family != AF_INET6)
		return NETADDR_RESERVED;
	if (!memcmp(b, zero12, 12) && v4_of(b + 12) == 0)
		return NETADDR_UNSPECIFIED;
	if (!memcmp(b, zero12, 12) && v4_of(b + 12) == 1)
		return NETADDR_LOOPBACK;
	/* Translators and tunnels that carry an IPv4 address onwards. */
	if (!memcmp(b, nat64_pfx, 12))
		return classify_v4(v4_of(b + 12));
	if (b[0] == 0x20 && b[1] == 0x02)
		return classify_v4(v4_of(b + 2));
	if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80)
		return NETADDR_LINK_LOCAL;
	if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) /* site-local, deprecated */
		return NETADDR_PRIVATE;
	if ((b[0] & 0xfe) == 0xfc)
		return NETADDR_PRIVATE;
	if (b[0] == 0xff)
		return NETADDR_MULTICAST;
	return NETADDR_PUBLIC;
}

int netaddr_from_sockaddr(const struct sockaddr *sa, struct netaddr *a)
{
	memset(a, 0, sizeof(*a));
	if (sa->sa_family == AF_INET) {
		a->family = AF_INET;
		memcpy(a->a, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		a->family = AF_INET6;
		memcpy(a->a, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
		return 0;
	}
	return -1;
}

static int same(const struct netaddr *x, const struct netaddr *y)
{
	struct netaddr a = norm(x), b = norm(y);

	return a.family == b.family && !memcmp(a.a, b.a, a.family == AF_INET ? 4 : 16);
}

int netaddr_own_load(struct netaddr_own *own)
{
	struct ifaddrs *ifa = NULL;

	own->n = 0;
	if (getifaddrs(&ifa) < 0)
		return -errno;
	for (struct ifaddrs *i = ifa; i && own->n < NETADDR_OWN_MAX; i = i->ifa_next)
		if (i->ifa_addr && netaddr_from_sockaddr(i->ifa_addr, &own->a[own->n]) == 0)
			own->n++;
	freeifaddrs(ifa);
	return 0;
}

const char *netaddr_str(const struct netaddr *a, char *buf, size_t size)
{
	if (!inet_ntop(a->family == AF_INET ? AF_INET : AF_INET6, a->a, buf, (socklen_t)size))
		snprintf(buf, size, "?");
	return buf;
}

/* ---- the allow-list ---- */

static int parse_port(const char *s, unsigned *port)
{
	unsigned long v = 0;

	if (!*s)
		return -1;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9' || p - s >= 5)
			return -1;
		v = v * 10 + (unsigned long)(*p - '0');
	}
	if (v < 1 || v > 65535)
		return -1;
	*port = (unsigned)v;
	return 0;
}

/* "ADDR" or "ADDR/PREFIX" (ADDR v4 or v6) into r (port untouched). */
static const char *parse_range(const char *s, struct netaddr_range *r)
{
	char addr[64];
	const char *slash = strchr(s, '/');
	size_t n = slash ? (size_t)(slash - s) : strlen(s);
	unsigned max;

	if (n == 0 || n >= sizeof(addr))
		return "expected an IPv4 or IPv6 address";
	memcpy(addr, s, n);
	addr[n] = '\0';
	memset(&r->a, 0, sizeof(r->a));
	if (inet_pton(AF_INET, addr, r->a.a) == 1)
		r->a.family = AF_INET;
	else if (inet_pton(AF_INET6, addr, r->a.a) == 1)
		r->a.family = AF_INET6;
	else
		return "expected an IPv4 or IPv6 address";
	max = r->a.family == AF_INET ? 32 : 128;
	r->prefix = max;
	if (slash) {
		const char *p = slash + 1;
		unsigned v = 0;

		if (!*p || (p[0] == '0' && p[1]) || strlen(p) > 3)
			return "the prefix length: a number";
		for (; *p; p++) {
			if (*p < '0' || *p > '9')
				return "the prefix length: a number";
			v = v * 10 + (unsigned)(*p - '0');
		}
		if (v > max)
			return r->a.family == AF_INET ? "the prefix length: 0-32" : "the prefix length: 0-128";
		r->prefix = v;
	}
	for (unsigned bit = r->prefix; bit < max; bit++)
		if (r->a.a[bit / 8] & (0x80 >> (bit % 8)))
			return "address bits set beyond the prefix length";
	/* A v4-mapped entry is the IPv4 range it names. */
	if (r->a.family == AF_INET6 && r->prefix >= 96 && norm(&r->a).family == AF_INET) {
		r->a = norm(&r->a);
		r->prefix -= 96;
	}
	return NULL;
}

int netaddr_allow_add(struct netaddr_allow *al, const char *entry, struct kiln_err *err)
{
	struct netaddr_range r = { .port = 0 };
	char range[96];
	const char *why = NULL, *colon;

	if (al->n >= NETADDR_ALLOW_MAX)
		return kiln_err_set(err, KERR_CONFIG, "at most %d entries", NETADDR_ALLOW_MAX);
	if (strlen(entry) >= sizeof(range)) {
		why = "too long";
	} else if (entry[0] == '[') {
		const char *close = strchr(entry, ']');

		if (!close || close == entry + 1)
			why = "expected [IPv6]:PORT";
		else if (close[1] && (close[1] != ':' || parse_port(close + 2, &r.port) < 0))
			why = "expected [IPv6]:PORT with a port of 1-65535";
		else {
			snprintf(range, sizeof(range), "%.*s", (int)(close - entry - 1), entry + 1);
			if (!strchr(range, ':'))
				why = "brackets are for IPv6 addresses";
			else
				why = parse_range(range, &r);
		}
	} else if ((colon = strchr(entry, ':')) && !strchr(colon + 1, ':')) {
		/* One colon: IPv4[/PREFIX]:PORT. */
		if (parse_port(colon + 1, &r.port) < 0)
			why = "the port: 1-65535";
		else {
			snprintf(range, sizeof(range), "%.*s", (int)(colon - entry), entry);
			why = parse_range(range, &r);
			if (!why && r.a.family != AF_INET)
				why = "write an IPv6 address with a port as [ADDR]:PORT";
		}
	} else {
		why = parse_range(entry, &r);
	}
	if (why)
		return kiln_err_set(err, KERR_CONFIG, "\"%.100s\": %s", entry, why);
	al->r[al->n++] = r;
	return 0;
}

int netaddr_allow_from_json(struct netaddr_allow *al, const json_t *arr, const char *name, struct kiln_err *err)
{
	size_t i;
	json_t *v;

	memset(al, 0, sizeof(*al));
	if (!arr)
		return 0;
	if (!json_is_array(arr))
		return kiln_err_set(err, KERR_CONFIG, "%s: expected an array of addresses", name);
	json_array_foreach(arr, i, v) {
		struct kiln_err e = { .code = "" };

		if (!json_is_string(v))
			return kiln_err_set(err, KERR_CONFIG, "%s[%zu]: expected a string", name, i);
		if (netaddr_allow_add(al, json_string_value(v), &e) < 0)
			return kiln_err_set(err, KERR_CONFIG, "%s[%zu]: %s", name, i, e.message);
	}
	return 0;
}

static int in_range(const struct netaddr_range *r, const struct netaddr *a)
{
	unsigned full = r->prefix / 8, rest = r->prefix % 8;

	if (a->family != r->a.family)
		return 0;
	if (memcmp(a->a, r->a.a, full))
		return 0;
	return !rest || ((a->a[full] ^ r->a.a[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

int netaddr_allowed(const struct netaddr_allow *al, const struct netaddr *a0, unsigned port)
{
	struct netaddr a = norm(a0);

	for (size_t i = 0; al && i < al->n; i++)
		if ((!al->r[i].port || al->r[i].port == port) && in_range(&al->r[i], &a))
			return 1;
	return 0;
}

enum netaddr_class netaddr_check(const struct netaddr *a, unsigned port, const struct netaddr_allow *al,
				 const struct netaddr_own *own)
{
	enum netaddr_class c = netaddr_classify(a);

	for (size_t i = 0; c == NETADDR_PUBLIC && own && i < own->n; i++)
		if (same(a, &own->a[i]))
			c = NETADDR_OWN;
	if (c != NETADDR_PUBLIC && netaddr_allowed(al, a, port))
		return NETADDR_PUBLIC;
	return c;
}

/* ---- endpoints ---- */

int netaddr_endpoint_split(const char *e, char *host, size_t host_size, unsigned *port)
{
	const char *h, *end;
	size_t n;

	if (!strncmp(e, "http://", 7)) {
		h = e + 7;
		*port = 80;
	} else if (!strncmp(e, "https://", 8)) {
		h = e + 8;
		*port = 443;
	} else {
		return -1;
	}
	if (*h == '[') {
		end = strchr(h, ']');
		if (!end)
			return -1;
		h++;
		n = (size_t)(end - h);
		end++;
	} else {
		end = h + strcspn(h, ":/");
		n = (size_t)(end - h);
	}
	if (!n || n >= host_size)
		return -1;
	if (*end == ':') {
		char p[8];
		size_t pl = strcspn(end + 1, "/");

		if (pl >= sizeof(p))
			return -1;
		memcpy(p, end + 1, pl);
		p[pl] = '\0';
		if (parse_port(p, port) < 0)
			return -1;
		end += 1 + pl;
	}
	if (*end == '/')
		end++;
	if (*end)
		return -1;
	memcpy(host, h, n);
	host[n] = '\0';
	return 0;
}

/* One name lookup run by glibc's getaddrinfo_a, so that the caller can stop
 * waiting: the waiter and the completion notification each hold a
 * reference; the last one frees it. */
struct lookup {
	pthread_mutex_t lock;
	int refs;
	struct gaicb cb;
	struct addrinfo hints;
	char name[256];
};

static void lookup_put(struct lookup *l)
{
	int left;

	pthread_mutex_lock(&l->lock);
	left = --l->refs;
	pthread_mutex_unlock(&l->lock);
	if (left)
		return;
	if (l->cb.ar_result)
		freeaddrinfo(l->cb.ar_result);
	pthread_mutex_destroy(&l->lock);
	free(l);
}

static void lookup_done(union sigval v)
{
	lookup_put(v.sival_ptr);
}

/* getaddrinfo(host) for TCP, waiting at most timeout_ms: 0 with *res (the
 * caller frees it), an EAI_* code, or 1 when the time ran out (the lookup
 * is left to finish on its own and frees itself). */
static int resolve_within(const char *host, long timeout_ms, struct addrinfo **res)
{
	struct lookup *l = calloc(1, sizeof(*l));
	struct sigevent sev = { .sigev_notify = SIGEV_THREAD, .sigev_notify_function = lookup_done };
	struct gaicb *list[1];
	struct timespec end, now, left;
	int r;

	*res = NULL;
	if (!l)
		return EAI_MEMORY;
	pthread_mutex_init(&l->lock, NULL);
	l->refs = 2;
	snprintf(l->name, sizeof(l->name), "%s", host);
	l->hints.ai_family = AF_UNSPEC;
	l->hints.ai_socktype = SOCK_STREAM;
	l->cb.ar_name = l->name;
	l->cb.ar_request = &l->hints;
	list[0] = &l->cb;
	sev.sigev_value.sival_ptr = l;
	r = getaddrinfo_a(GAI_NOWAIT, list, 1, &sev);
	if (r != 0) {
		pthread_mutex_destroy(&l->lock);
		free(l);
		return r;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += timeout_ms / 1000;
	end.tv_nsec += (timeout_ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	while ((r = gai_error(&l->cb)) == EAI_INPROGRESS) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		left.tv_sec = end.tv_sec - now.tv_sec;
		left.tv_nsec = end.tv_nsec - now.tv_nsec;
		if (left.tv_nsec < 0) {
			left.tv_sec--;
			left.tv_nsec += 1000000000L;
		}
		if (left.tv_sec < 0)
			break;
		gai_suspend((const struct gaicb *const *)list, 1, &left);
	}
	if (r == EAI_INPROGRESS) {
		/* Cancelled before it ran: no notification will come. */
		if (gai_cancel(&l->cb) == EAI_CANCELED)
			lookup_put(l);
		lookup_put(l);
		return 1;
	}
	pthread_mutex_lock(&l->lock);
	if (r == 0) {
		*res = l->cb.ar_result;
		l->cb.ar_result = NULL;
	}
	pthread_mutex_unlock(&l->lock);
	lookup_put(l);
	return r;
}

int netaddr_check_endpoint(const char *endpoint, const struct netaddr_allow *al, const struct netaddr_own *own,
			   long timeout_ms, struct netaddr_resolved *out, struct kiln_err *err)
{
	struct addrinfo *res = NULL;
	int r;

	memset(out, 0, sizeof(*out));
	if (netaddr_endpoint_split(endpoint, out->host, sizeof(out->host), &out->port) < 0)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "endpoint: not http(s)://HOST[:PORT]");
	r = resolve_within(out->host, timeout_ms > 0 ? timeout_ms : 1, &res);
	if (r == 1)
		return kiln_err_set(err, KERR_S3_UNAVAILABLE, "the endpoint's host %.100s did not resolve within %ld ms",
				    out->host, timeout_ms);
	if (r != 0)
		return kiln_err_set(err, KERR_S3_UNAVAILABLE, "the endpoint's host %.100s does not resolve: %s", out->host,
				    r == EAI_SYSTEM ? strerror(errno) : gai_strerror(r));
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		struct netaddr a;
		enum netaddr_class c;
		char buf[64];
		int dup = 0;

		if (netaddr_from_sockaddr(ai->ai_addr, &a) < 0)
			continue;
		c = netaddr_check(&a, out->port, al, own);
		if (c != NETADDR_PUBLIC) {
			netaddr_str(&a, buf, sizeof(buf));
			kiln_err_set(err, KERR_DESTINATION_FORBIDDEN,
				     "endpoint %.100s: %.100s%s%s (%s): a destination may not reach such an address unless "
				     "the operator lists it in destinations.allow_addresses",
				     endpoint, out->host, strcmp(out->host, buf) ? " resolves to " : "",
				     strcmp(out->host, buf) ? buf : "", netaddr_class_name(c));
			freeaddrinfo(res);
			return -1;
		}
		for (size_t i = 0; i < out->n; i++)
			dup |= same(&out->a[i], &a);
		if (!dup && out->n < NETADDR_RESOLVED_MAX)
			out->a[out->n++] = a;
	}
	freeaddrinfo(res);
	if (!out->n)
		return kiln_err_set(err, KERR_S3_UNAVAILABLE, "the endpoint's host %.100s has no IPv4 or IPv6 address",
				    out->host);
	return 0;
}

enum netaddr_class netaddr_check_connect(const struct sockaddr *sa, const struct netaddr_allow *al,
					 const struct netaddr_own *own)
{
	struct netaddr a;
	unsigned port;

	if (netaddr_from_sockaddr(sa, &a) < 0)
		return NETADDR_RESERVED;
	port = ntohs(sa->sa_family == AF_INET ? ((const struct sockaddr_in *)sa)->sin_port
					      : ((const struct sockaddr_in6 *)sa)->sin6_port);
	return netaddr_check(&a, port, al, own);
}
