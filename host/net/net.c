/* net: a sandbox's own network namespace (tap, veth, NAT, nftables) and the
 * resolver kiln-host runs for it. See net.h and docs/architecture.md.
 *
 * Layout, per sandbox (every guest sees the same addresses):
 *
 *   guest eth0 10.0.2.2/30 ── tap0 10.0.2.1/30 [sandbox netns: nft kiln,
 *   resolver on 10.0.2.1:53] eth0 L+2/30 ── veth ── kvN L+1/30 [host netns:
 *   nft kiln_host, masquerade] ── the host's routes
 *
 * where L is the sandbox's /30 in the link range. The sandbox's namespace is
 * created by (and lives with) the sandbox's thread: unshare(CLONE_NEWNET)
 * changes only the calling thread, so the rest of kiln-host stays put.
 *
 * One file on purpose: the namespace plumbing, the nftables ruleset, the
 * counters and the resolver that opens the ruleset name by name all work on
 * one struct net_sandbox, most of it on that sandbox's own thread
 * (sandbox_main), which alone may enter its namespace. */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <net/route.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <nftables/libnftables.h>

#include "buf.h"
#include "dns.h"
#include "proto.h"

#define NET_TAP        "tap0"
#define NET_GUEST      "10.0.2.2"
#define NET_GW         "10.0.2.1"
/* The gateway's (tap0's) MAC, the same in every sandbox: a guest paused
 * and resumed (another tap, here or on another host) keeps the neighbour
 * entry it had for 10.0.2.1, which a random MAC would make stale for up to
 * a minute (locally administered, unicast). */
static const unsigned char net_gw_mac[6] = { 0x02, 0x6b, 0x69, 0x6c, 0x6e, 0x01 };
#define NET_UPLINK     "eth0"
#define NET_HOST_IFPFX "kv" /* host ends of the veth pairs: kv<index> */
#define NET_DNS_PORT   53
#define NET_POLL_MS    200   /* how often blocked flows are looked for */
#define NET_MAX_EVENTS 256   /* blocked destinations reported per sandbox */
#define NET_DNS_PENDING 16   /* upstream queries in flight per sandbox */
#define NET_DNS_TIMEOUT_MS 3000
#define NET_DNS_UDP_MAX 512  /* our replies carry no EDNS OPT record */
#define NET_TTL_MIN    5     /* answered addresses stay allowed at least this long */
#define NET_TTL_MAX    3600
#define NET_SETUP_MS   10000

/* libnftables keeps process-wide state (symbol tables, the parser's scanner
 * set-up); every call into it is serialised. */
static pthread_mutex_t nft_lock = PTHREAD_MUTEX_INITIALIZER;

/* Ranges no sandbox may ever reach, whatever its rules say. */
static const char *const default_deny[] = {
	"0.0.0.0/8",      "10.0.0.0/8",      "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12",  "192.0.0.0/24",    "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
	"240.0.0.0/4",
};

int net_range_parse(const char *s, struct net_range *range)
{
	unsigned part[4], prefix = 32;
	const char *p = s;
	int i;

	for (i = 0; i < 4; i++) {
		unsigned v = 0, digits = 0;

		while (*p >= '0' && *p <= '9' && digits < 4) {
			v = v * 10 + (unsigned)(*p++ - '0');
			digits++;
		}
		if (!digits || digits > 3 || v > 255 || (digits > 1 && p[-(int)digits] == '0'))
			return -1;
		part[i] = v;
		if (i < 3 && *p++ != '.')
			return -1;
	}
	if (*p == '/') {
		char *end;

		p++;
		if (*p < '0' || *p > '9' || (p[0] == '0' && p[1]))
			return -1;
		prefix = (unsigned)strtoul(p, &end, 10);
		if (*end || prefix > 32)
			return -1;
	} else if (*p) {
		return -1;
	}
	range->addr = part[0] << 24 | part[1] << 16 | part[2] << 8 | part[3];
	range->prefix = (uint8_t)prefix;
	if (prefix < 32 && (range->addr & (0xffffffffu >> prefix)))
		return -1;
	return 0;
}

static const char *range_str(const struct net_range *range, char *buf, size_t cap)
{
	snprintf(buf, cap, "%u.%u.%u.%u/%u", range->addr >> 24, (range->addr >> 16) & 255, (range->addr >> 8) & 255,
		 range->addr & 255, range->prefix);
	return buf;
}

static const char *ip_str(uint32_t a, char *buf, size_t cap)
{
	snprintf(buf, cap, "%u.%u.%u.%u", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255);
	return buf;
}

/* ---- growable text, for rulesets ---------------------------------------- */

/* A ruleset being written: lib/buf.h plus a sticky failure, so the many
 * text_add calls are checked once at the end. */
struct text {
	struct buf b;
	int oom;
};

__attribute__((format(printf, 2, 3))) static void text_add(struct text *t, const char *fmt, ...)
{
	va_list ap;

	if (t->oom)
		return;
	va_start(ap, fmt);
	if (buf_vprintf(&t->b, fmt, ap) < 0)
		t->oom = 1;
	va_end(ap);
}

/* ---- nftables ---------------------------------------------------------- */

/* Run cmd in ctx (whose netlink socket is in the namespace it was created
 * in). With out, the command's output (JSON) is parsed into *out. Returns 0
 * or -1 with err set to nftables' own message. */
static int nft_run(struct nft_ctx *ctx, const char *cmd, json_t **out, struct kiln_err *err)
{
	char *text = NULL;
	int r;

	pthread_mutex_lock(&nft_lock);
	r = nft_run_cmd_from_buffer(ctx, cmd);
	if (r != 0 && err) {
		const char *e = nft_ctx_get_error_buffer(ctx);

		kiln_err_set(err, KERR_NET_ERROR, "nftables: %.400s", e && *e ? e : "command failed");
	}
	if (r == 0 && out) {
		const char *o = nft_ctx_get_output_buffer(ctx);

		/* Copied out and parsed after the lock is released: every
		 * sandbox's set-up and DNS answers wait on this lock. */
		text = o && *o ? strdup(o) : NULL;
	} else {
		nft_ctx_get_output_buffer(ctx); /* reset it */
	}
	nft_ctx_get_error_buffer(ctx);
	pthread_mutex_unlock(&nft_lock);
	if (out) {
		*out = text ? json_loads(text, 0, NULL) : NULL;
		free(text);
	}
	return r == 0 ? 0 : -1;
}

/* A context for the calling thread's current network namespace. */
static struct nft_ctx *nft_open(int json)
{
	struct nft_ctx *ctx;

	pthread_mutex_lock(&nft_lock);
	ctx = nft_ctx_new(NFT_CTX_DEFAULT);
	if (ctx) {
		nft_ctx_buffer_output(ctx);
		nft_ctx_buffer_error(ctx);
		if (json)
			nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON);
	}
	pthread_mutex_unlock(&nft_lock);
	return ctx;
}

static void nft_close(struct nft_ctx *ctx)
{
	if (!ctx)
		return;
	pthread_mutex_lock(&nft_lock);
	nft_ctx_free(ctx);
	pthread_mutex_unlock(&nft_lock);
}

/* ---- interfaces (ioctl on a socket of the namespace concerned) ---------- */

static int if_addr(int sock, const char *ifname, uint32_t addr, uint8_t prefix)
{
	struct ifreq ifr;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;

	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
	sin->sin_family = AF_INET;
	sin->sin_addr.s_addr = htonl(addr);
	if (ioctl(sock, SIOCSIFADDR, &ifr) < 0)
		return -errno;
	sin->sin_addr.s_addr = htonl(prefix ? 0xffffffffu << (32 - prefix) : 0);
	if (ioctl(sock, SIOCSIFNETMASK, &ifr) < 0)
		return -errno;
	return 0;
}

static int if_up(int sock, const char *ifname)
{
	struct ifreq ifr;

	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
	if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0)
		return -errno;
	ifr.ifr_flags |= IFF_UP;
	if (ioctl(sock, SIOCSIFFLAGS, &ifr) < 0)
		return -errno;
	return 0;
}

static int route_default(int sock, uint32_t gw)
{
	struct rtentry rt;
	struct sockaddr_in *s;

	memset(&rt, 0, sizeof(rt));
	s = (struct sockaddr_in *)&rt.rt_dst;
	s->sin_family = AF_INET;
	s = (struct sockaddr_in *)&rt.rt_genmask;
	s->sin_family = AF_INET;
	s = (struct sockaddr_in *)&rt.rt_gateway;
	s->sin_family = AF_INET;
	s->sin_addr.s_addr = htonl(gw);
	rt.rt_flags = RTF_UP | RTF_GATEWAY;
	return ioctl(sock, SIOCADDRT, &rt) < 0 ? -errno : 0;
}

static int write_sysctl(const char *path, const char *value)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, value, strlen(value)) != (ssize_t)strlen(value))
		r = -errno;
	close(fd);
	return r;
}

/* The netlink preamble: a socket on `bus` (NETLINK_ROUTE, NETLINK_NETFILTER)
 * bound to a port the kernel picks, whose id goes to *portid. Returns the
 * socket (mnl_socket_close it) or NULL with errno set. */
static struct mnl_socket *nl_open(int bus, unsigned *portid)
{
	struct mnl_socket *nl = mnl_socket_open2(bus, SOCK_CLOEXEC);
	int e;

	if (!nl)
		return NULL;
	if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
		e = errno;
		mnl_socket_close(nl);
		errno = e;
		return NULL;
	}
	*portid = mnl_socket_get_portid(nl);
	return nl;
}

/* A request's header at the start of buf: type, flags, sequence number 1
 * (one request a socket). */
static struct nlmsghdr *nl_request_header(char *buf, uint16_t type, uint16_t flags)
{
	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);

	nlh->nlmsg_type = type;
	nlh->nlmsg_flags = flags;
	nlh->nlmsg_seq = 1;
	return nlh;
}

/* Send one rtnetlink request (nlh, built in buf) from the calling thread's
 * namespace and read its acknowledgement into buf. Returns 0 or -errno (the
 * kernel's error for the request, e.g. -EEXIST, -ENODEV). */
static int rtnl_request(char *buf, size_t size, struct nlmsghdr *nlh)
{
	struct mnl_socket *nl;
	unsigned portid;
	ssize_t n;
	int r;

	nl = nl_open(NETLINK_ROUTE, &portid);
	if (!nl)
		return -errno;
	if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0) {
		r = -errno;
		goto out;
	}
	n = mnl_socket_recvfrom(nl, buf, size);
	if (n < 0) {
		r = -errno;
		goto out;
	}
	r = mnl_cb_run(buf, (size_t)n, nlh->nlmsg_seq, portid, NULL, NULL) < 0 ? -errno : 0;
out:
	mnl_socket_close(nl);
	return r;
}

/* Create a veth pair: `inner` in the calling thread's namespace, `outer` in
 * the namespace of outer_nsfd. Returns 0, -EEXIST when a name is taken, or
 * another -errno. */
static int veth_create(const char *inner, const char *outer, int outer_nsfd)
{
	char buf[1024];
	struct nlmsghdr *nlh;
	struct ifinfomsg *ifm;
	struct nlattr *info, *data, *peer;

	nlh = nl_request_header(buf, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK);
	ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
	ifm->ifi_family = AF_UNSPEC;
	mnl_attr_put_strz(nlh, IFLA_IFNAME, inner);
	info = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
	mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
	data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
	peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
	ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
	ifm->ifi_family = AF_UNSPEC;
	mnl_attr_put_strz(nlh, IFLA_IFNAME, outer);
	mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, (uint32_t)outer_nsfd);
	mnl_attr_nest_end(nlh, peer);
	mnl_attr_nest_end(nlh, data);
	mnl_attr_nest_end(nlh, info);
	return rtnl_request(buf, sizeof(buf), nlh);
}

/* Delete the link `name` of the calling thread's namespace (a veth: its
 * peer in the other namespace goes with it). Returns 0, -ENODEV when there is
 * none, or another -errno. */
static int link_delete(const char *name)
{
	char buf[512];
	struct nlmsghdr *nlh;
	struct ifinfomsg *ifm;

	nlh = nl_request_header(buf, RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK);
	ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
	ifm->ifi_family = AF_UNSPEC;
	mnl_attr_put_strz(nlh, IFLA_IFNAME, name);
	return rtnl_request(buf, sizeof(buf), nlh);
}

/* ---- host-wide set-up --------------------------------------------------- */

static int add_deny(struct net_host *h, const struct net_range *range, struct kiln_err *err)
{
	for (size_t i = 0; i < h->ndeny; i++)
		if (h->deny[i].addr == range->addr && h->deny[i].prefix == range->prefix)
			return 0;
	if (h->ndeny >= NET_MAX_RANGES)
		return kiln_err_set(err, KERR_CONFIG, "network.deny: more than %d ranges", NET_MAX_RANGES);
	h->deny[h->ndeny++] = *range;
	return 0;
}

/* The first nameserver in /etc/resolv.conf, else 127.0.0.53. */
static void default_upstream(struct sockaddr_in *sa)
{
	char line[256];
	FILE *f = fopen("/etc/resolv.conf", "re");

	sa->sin_family = AF_INET;
	sa->sin_port = htons(53);
	inet_pton(AF_INET, "127.0.0.53", &sa->sin_addr);
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char ip[64];

		if (sscanf(line, " nameserver %63s", ip) == 1 && inet_pton(AF_INET, ip, &sa->sin_addr) == 1)
			break;
	}
	fclose(f);
}

static int parse_config(struct net_host *h, json_t *c, struct kiln_err *err)
{
	const char *k;
	json_t *v;

	if (!c)
		return 0;
	if (!json_is_object(c))
		return kiln_err_set(err, KERR_CONFIG, "network: expected an object");
	json_object_foreach(c, k, v) {
		if (!strcmp(k, "egress")) {
			if (!json_is_boolean(v))
				return kiln_err_set(err, KERR_CONFIG, "network.egress: expected true or false");
			h->enabled = json_is_true(v);
		} else if (!strcmp(k, "deny")) {
			size_t i;
			json_t *e;

			if (!json_is_array(v))
				return kiln_err_set(err, KERR_CONFIG, "network.deny: expected an array of \"A.B.C.D/P\"");
			json_array_foreach(v, i, e) {
				struct net_range r;

				if (!json_is_string(e) || net_range_parse(json_string_value(e), &r) < 0)
					return kiln_err_set(err, KERR_CONFIG,
							    "network.deny[%zu]: expected \"A.B.C.D/P\" with the host bits zero", i);
				if (add_deny(h, &r, err) < 0)
					return -1;
			}
		} else if (!strcmp(k, "link_range")) {
			if (!json_is_string(v) || net_range_parse(json_string_value(v), &h->link) < 0 ||
			    h->link.prefix > 24 || h->link.prefix < 8)
				return kiln_err_set(err, KERR_CONFIG, "network.link_range: expected \"A.B.C.D/P\" with P 8..24");
		} else if (!strcmp(k, "bandwidth_mbit")) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100000)
				return kiln_err_set(err, KERR_CONFIG, "network.bandwidth_mbit: expected 0..100000 (0: no cap)");
			h->bandwidth_bytes_s = (uint64_t)json_integer_value(v) * 1000000 / 8;
		} else if (!strcmp(k, "dns_upstream")) {
			char ip[64];
			unsigned port = 53;
			const char *s = json_string_value(v), *colon;

			if (!s || !(colon = strrchr(s, ':')) || (size_t)(colon - s) >= sizeof(ip) ||
			    sscanf(colon + 1, "%u", &port) != 1 || !port || port > 65535)
				return kiln_err_set(err, KERR_CONFIG, "network.dns_upstream: expected \"A.B.C.D:PORT\"");
			memcpy(ip, s, (size_t)(colon - s));
			ip[colon - s] = 0;
			if (inet_pton(AF_INET, ip, &h->dns_upstream.sin_addr) != 1)
				return kiln_err_set(err, KERR_CONFIG, "network.dns_upstream: expected \"A.B.C.D:PORT\"");
			h->dns_upstream.sin_family = AF_INET;
			h->dns_upstream.sin_port = htons((uint16_t)port);
		} else {
			return kiln_err_set(err, KERR_CONFIG, "network.%s: unknown setting", k);
		}
	}
	return 0;
}

int net_nft_check(struct kiln_err *err)
{
	struct nft_ctx *ctx = nft_open(0);
	int r;

	if (!ctx)
		return kiln_err_set(err, KERR_NET_ERROR, "nftables: cannot create a libnftables context");
	r = nft_run(ctx, "list ruleset", NULL, err);
	nft_ctx_free(ctx);
	return r;
}

int net_config_check(json_t *config, struct net_host *h, struct kiln_err *err)
{
	memset(h, 0, sizeof(*h));
	h->root_nsfd = -1;
	net_range_parse("10.200.0.0/16", &h->link);
	default_upstream(&h->dns_upstream);
	for (size_t i = 0; i < sizeof(default_deny) / sizeof(*default_deny); i++) {
		struct net_range d;

		net_range_parse(default_deny[i], &d);
		add_deny(h, &d, NULL);
	}
	return parse_config(h, config, err);
}

int net_host_init(struct net_host *h, json_t *config, struct kiln_err *err)
{
	struct ifaddrs *ifa = NULL;
	struct nft_ctx *ctx = NULL;
	struct text t = { 0 };
	char a[32];
	int r = -1;

	if (net_config_check(config, h, err) < 0)
		return -1;
	pthread_mutex_init(&h->lock, NULL);
	if (!h->enabled)
		return 0;
	if (add_deny(h, &h->link, err) < 0)
		return -1;
	/* The host's own addresses: a sandbox must not reach this machine's
	 * services through an address that is not in a private range. */
	if (getifaddrs(&ifa) == 0) {
		for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
			struct net_range own;

			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
				continue;
			own.addr = ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr);
			own.prefix = 32;
			if (add_deny(h, &own, err) < 0)
				goto out;
		}
	}
	h->root_nsfd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	if (h->root_nsfd < 0) {
		kiln_err_set(err, KERR_NET_ERROR, "/proc/self/ns/net: %s", strerror(errno));
		goto out;
	}
	if (write_sysctl("/proc/sys/net/ipv4/ip_forward", "1") < 0) {
		kiln_err_set(err, KERR_NET_ERROR, "cannot enable IPv4 forwarding: %s", strerror(errno));
		goto out;
	}
	/* Sandboxes reach the world through the host's routes, masqueraded;
	 * never the host itself (input), never each other, never a denied
	 * range, and nothing from outside reaches them unasked. The sandbox's
	 * own namespace enforces the same and more; this is the second wall. */
	text_add(&t, "table inet kiln_host {\n set deny { type ipv4_addr; flags interval; auto-merge; elements = { ");
	for (size_t i = 0; i < h->ndeny; i++)
		text_add(&t, "%s%s", i ? ", " : "", range_str(&h->deny[i], a, sizeof(a)));
	text_add(&t, " } }\n");
	text_add(&t,
		 " chain forward { type filter hook forward priority -10; policy accept;\n"
		 "  iifname \"" NET_HOST_IFPFX "*\" oifname \"" NET_HOST_IFPFX "*\" drop\n"
		 "  iifname \"" NET_HOST_IFPFX "*\" ip daddr @deny drop\n"
		 "  iifname \"" NET_HOST_IFPFX "*\" meta nfproto ipv6 drop\n"
		 "  oifname \"" NET_HOST_IFPFX "*\" ct state established,related accept\n"
		 "  oifname \"" NET_HOST_IFPFX "*\" drop\n }\n"
		 " chain input { type filter hook input priority -10; policy accept;\n"
		 "  iifname \"" NET_HOST_IFPFX "*\" drop\n }\n"
		 " chain postrouting { type nat hook postrouting priority 100; policy accept;\n"
		 "  ip saddr %s oifname != \"" NET_HOST_IFPFX "*\" masquerade\n }\n}\n",
		 range_str(&h->link, a, sizeof(a)));
	if (t.oom) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	ctx = nft_open(0);
	if (!ctx) {
		kiln_err_set(err, KERR_NET_ERROR, "cannot open nftables");
		goto out;
	}
	/* A table left by an earlier kiln-host in this namespace is replaced. */
	nft_run(ctx, "delete table inet kiln_host", NULL, NULL);
	if (nft_run(ctx, t.b.p, NULL, err) < 0)
		goto out;
	r = 0;
out:
	if (ifa)
		freeifaddrs(ifa);
	nft_close(ctx);
	buf_free(&t.b);
	if (r < 0 && h->root_nsfd >= 0) {
		close(h->root_nsfd);
		h->root_nsfd = -1;
	}
	return r;
}

void net_host_fini(struct net_host *h)
{
	struct nft_ctx *ctx;

	if (!h->enabled || h->root_nsfd < 0)
		return;
	ctx = nft_open(0);
	if (ctx) {
		nft_run(ctx, "delete table inet kiln_host", NULL, NULL);
		nft_close(ctx);
	}
	close(h->root_nsfd);
	h->root_nsfd = -1;
}

/* ---- one sandbox -------------------------------------------------------- */

struct dns_pending {
	int used;
	uint16_t up_id;
	int64_t deadline_ms;
	struct dns_query q;
	struct sockaddr_in from;
	uint64_t rules;           /* bit i: hostname rule i matched */
};

struct blocked_seen {
	uint32_t addr;
	uint16_t port;
	uint8_t proto;
};

struct net_sandbox {
	struct net_host *h;
	struct spec_net_rule *rules;
	size_t nrules;
	net_blocked_fn on_blocked;
	void *ctx;
	pthread_t thread;
	int thread_started;
	int tap_fd, stop_fd, cut_fd;
	unsigned link_idx;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int setup_done, setup_rc;
	struct kiln_err err;
	int cut_done, cut_rc;     /* net_sandbox_cut's answer (lock held) */
	struct kiln_err cut_err;
	int is_cut;               /* net_sandbox_cut took it off the network (its thread only) */
	/* net_sandbox_update's request and answer (lock held): the new rules
	 * (owned by whoever holds them: the request, then the thread), the
	 * request's number and the last one answered. */
	int upd_fd;
	struct spec_net_rule *upd_rules;
	size_t upd_n;
	uint64_t upd_seq, upd_done_seq;
	int upd_rc;
	struct kiln_err upd_err;
	/* The ruleset's generation (its thread only): every flow a rule lets
	 * through is marked with it (ct mark), and an established flow of an
	 * earlier generation is checked again against the rules of now. */
	uint32_t gen;
	struct net_stats st;      /* dns counters live here; nft ones filled from the kernel */
	struct nft_ctx *nft, *nft_json;
	int dns_fd, up_fd;
	struct dns_pending pending[NET_DNS_PENDING];
	struct blocked_seen seen[NET_MAX_EVENTS];
	size_t nseen;
};

static uint32_t link_base(const struct net_sandbox *s)
{
	return s->h->link.addr + s->link_idx * 4;
}

/* The rules of chain sbx_forward for rules[0..n) at generation gen, one a
 * line, each after pfx ("  " inside a chain's braces, "add rule inet kiln
 * sbx_forward " for a command). Host-name rule i lets through the addresses
 * in set host<i>, which the resolver fills. A flow a rule lets through is
 * marked with gen; established flows of that mark pass at once, replies of
 * an earlier generation's flows pass too, and the guest's side of such a
 * flow is checked against the rules again (net_sandbox_update): it is
 * marked anew when a rule still lets it through, else a TCP flow is reset
 * towards the guest (sbx_reset) and any other is dropped as blocked. */
static void forward_rules(const struct net_host *h, const struct spec_net_rule *rules, size_t n, uint32_t gen,
			  const char *pfx, struct text *t)
{
	char a[32];

	text_add(t, "%siifname \"" NET_TAP "\" ip saddr != " NET_GUEST " drop\n", pfx);
	text_add(t, "%smeta nfproto ipv6 drop\n", pfx);
	if (h->bandwidth_bytes_s) {
		uint64_t burst = h->bandwidth_bytes_s / 8 < 16384 ? 16384 : h->bandwidth_bytes_s / 8;

		text_add(t, "%siifname \"" NET_TAP "\" limit rate over %llu bytes/second burst %llu bytes drop\n", pfx,
			 (unsigned long long)h->bandwidth_bytes_s, (unsigned long long)burst);
		text_add(t, "%soifname \"" NET_TAP "\" limit rate over %llu bytes/second burst %llu bytes drop\n", pfx,
			 (unsigned long long)h->bandwidth_bytes_s, (unsigned long long)burst);
	}
	text_add(t, "%sct state established,related ct mark %u goto sbx_pass\n", pfx, gen);
	text_add(t, "%sct state established,related iifname != \"" NET_TAP "\" goto sbx_pass\n", pfx);
	text_add(t, "%siifname != \"" NET_TAP "\" drop\n", pfx);
	text_add(t, "%sip daddr @deny goto sbx_block\n", pfx);
	for (size_t i = 0; i < n; i++) {
		const struct spec_net_rule *rule = &rules[i];
		char ports[16];

		if (rule->port_lo == rule->port_hi)
			snprintf(ports, sizeof(ports), "%u", rule->port_lo);
		else
			snprintf(ports, sizeof(ports), "%u-%u", rule->port_lo, rule->port_hi);
		if (rule->kind == SPEC_NET_CIDR) {
			struct net_range nr = { rule->addr, rule->prefix };

			text_add(t, "%sip daddr %s meta l4proto { tcp, udp } th dport %s ct mark set %u goto sbx_allow\n",
				 pfx, range_str(&nr, a, sizeof(a)), ports, gen);
		} else {
			text_add(t, "%sip daddr @host%zu meta l4proto { tcp, udp } th dport %s ct mark set %u goto sbx_allow\n",
				 pfx, i, ports, gen);
		}
	}
	text_add(t, "%sct state established,related meta l4proto tcp goto sbx_reset\n", pfx);
	text_add(t, "%sgoto sbx_block\n", pfx);
}

/* The sandbox's ruleset: see the comment at the top of the file. */
static char *sandbox_ruleset(const struct net_sandbox *s)
{
	const struct net_host *h = s->h;
	struct text t = { 0 };
	char a[32];

	text_add(&t, "table inet kiln {\n");
	text_add(&t, " counter allowed { }\n counter blocked { }\n counter bytes_out { }\n counter bytes_in { }\n");
	text_add(&t, " set deny { type ipv4_addr; flags interval; auto-merge; elements = { ");
	for (size_t i = 0; i < h->ndeny; i++)
		text_add(&t, "%s%s", i ? ", " : "", range_str(&h->deny[i], a, sizeof(a)));
	text_add(&t, " } }\n");
	for (size_t i = 0; i < s->nrules; i++)
		if (s->rules[i].kind != SPEC_NET_CIDR)
			text_add(&t, " set host%zu { type ipv4_addr; flags timeout; size 4096; }\n", i);
	/* bflows: one entry per blocked flow (a TCP connect's retries are
	 * one), so that the count is of attempts; it stays in the kernel and
	 * is never listed. bdest/bother: the blocked destinations, which
	 * kiln-host lists to report them; keyed by what is reported, at most
	 * NET_MAX_EVENTS entries each, so a guest rotating source ports (or
	 * destinations) cannot make that listing large. */
	text_add(&t,
		 " set bflows { type ipv4_addr . inet_proto . inet_service . inet_service; flags dynamic,timeout; size "
		 "65536; timeout 60s; }\n"
		 " set bdest { type ipv4_addr . inet_proto . inet_service; flags dynamic; size %d; }\n"
		 " set bother { type ipv4_addr . inet_proto; flags dynamic,timeout; size %d; timeout 60s; }\n",
		 NET_MAX_EVENTS, NET_MAX_EVENTS);
	text_add(&t, " chain sbx_forward { type filter hook forward priority 0; policy drop;\n");
	forward_rules(h, s->rules, s->nrules, s->gen, "  ", &t);
	text_add(&t, " }\n");
	/* A flow a rule let through: counted when it is new (not when an
	 * earlier generation's flow passes a check again). */
	text_add(&t, " chain sbx_allow {\n  ct state new counter name allowed\n  goto sbx_pass\n }\n");
	text_add(&t, " chain sbx_pass {\n  iifname \"" NET_TAP "\" counter name bytes_out accept\n"
		     "  counter name bytes_in accept\n }\n");
	text_add(&t, " chain sbx_block {\n"
		     "  meta l4proto { tcp, udp } ip daddr . meta l4proto . th sport . th dport @bflows drop\n"
		     /* no verdict: once bdest is full, the add fails and the next rule counts */
		     "  meta l4proto { tcp, udp } add @bdest { ip daddr . meta l4proto . th dport }\n"
		     "  meta l4proto { tcp, udp } add @bflows { ip daddr . meta l4proto . th sport . th dport } "
		     "counter name blocked drop\n"
		     "  meta l4proto { tcp, udp } counter name blocked drop\n"
		     "  ip daddr . meta l4proto @bother drop\n"
		     "  add @bother { ip daddr . meta l4proto } counter name blocked drop\n"
		     "  counter name blocked drop\n }\n");
	/* An established TCP flow the rules no longer let through (after an
	 * update): the guest's packet goes no further and the guest is told
	 * at once with a reset, rather than left to time out. Counted and
	 * reported as sbx_block does, once a flow. */
	text_add(&t, " chain sbx_reset {\n"
		     "  meta l4proto tcp add @bdest { ip daddr . meta l4proto . th dport }\n"
		     "  meta l4proto tcp ip daddr . meta l4proto . th sport . th dport @bflows reject with tcp reset\n"
		     "  meta l4proto tcp add @bflows { ip daddr . meta l4proto . th sport . th dport } counter name "
		     "blocked reject with tcp reset\n"
		     "  meta l4proto tcp reject with tcp reset\n"
		     "  goto sbx_block\n }\n");
	/* The namespace itself: only the resolver, only from the guest. */
	text_add(&t, " chain sbx_input { type filter hook input priority 0; policy drop;\n"
		     "  iif lo accept\n"
		     "  iifname \"" NET_TAP "\" ip saddr " NET_GUEST " ip daddr " NET_GW " udp dport %d accept\n"
		     "  ct state established,related accept\n }\n",
		 NET_DNS_PORT);
	text_add(&t, " chain sbx_post { type nat hook postrouting priority 100; policy accept;\n"
		     "  oifname \"" NET_UPLINK "\" masquerade\n }\n}\n");
	if (t.oom) {
		buf_free(&t.b);
		return NULL;
	}
	return t.b.p;
}

static int setup_fail(struct net_sandbox *s, const char *what, int e)
{
	return kiln_err_set(&s->err, KERR_NET_ERROR, "sandbox network: %s: %s", what, strerror(e < 0 ? -e : e));
}

/* Runs on the sandbox's thread: everything from here on happens in its new
 * namespace, except through root_sock and up_fd, made before it. */
static int sandbox_setup(struct net_sandbox *s, int root_sock)
{
	struct ifreq ifr;
	struct sockaddr_in sa;
	char outer[IFNAMSIZ];
	uint32_t nlinks = 1u << (32 - s->h->link.prefix - 2);
	int sock, r;
	char *rules;

	if (unshare(CLONE_NEWNET) < 0)
		return setup_fail(s, "unshare", errno);
	sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (sock < 0)
		return setup_fail(s, "socket", errno);
	r = if_up(sock, "lo");
	if (r < 0) {
		setup_fail(s, "lo", r);
		goto out;
	}
	/* The tap: made here, so it lives in this namespace; QEMU gets the fd
	 * and needs no privilege for it. */
	s->tap_fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
	if (s->tap_fd < 0) {
		r = setup_fail(s, "/dev/net/tun", errno);
		goto out;
	}
	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), NET_TAP);
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
	if (ioctl(s->tap_fd, TUNSETIFF, &ifr) < 0) {
		r = setup_fail(s, "TUNSETIFF", errno);
		goto out;
	}
	ifr.ifr_hwaddr.sa_family = ARPHRD_ETHER;
	memcpy(ifr.ifr_hwaddr.sa_data, net_gw_mac, sizeof(net_gw_mac));
	if (ioctl(sock, SIOCSIFHWADDR, &ifr) < 0) {
		r = setup_fail(s, "tap0's MAC", errno);
		goto out;
	}
	if ((r = if_addr(sock, NET_TAP, ntohl(inet_addr(NET_GW)), 30)) < 0 || (r = if_up(sock, NET_TAP)) < 0) {
		setup_fail(s, NET_TAP, r);
		goto out;
	}
	/* A /30 of the link range: the first free kv<index> name is ours (the
	 * kernel refuses a name taken by another sandbox or kiln-host). */
	for (uint32_t tries = 0;; tries++) {
		if (tries >= nlinks || tries >= 4096) {
			r = kiln_err_set(&s->err, KERR_NO_CAPACITY, "sandbox network: no free link in %s", "the link range");
			goto out;
		}
		pthread_mutex_lock(&s->h->lock);
		s->link_idx = s->h->next_link++ % nlinks;
		pthread_mutex_unlock(&s->h->lock);
		snprintf(outer, sizeof(outer), NET_HOST_IFPFX "%u", s->link_idx);
		r = veth_create(NET_UPLINK, outer, s->h->root_nsfd);
		if (r == 0)
			break;
		if (r != -EEXIST && r != -ENFILE) {
			setup_fail(s, "veth", r);
			goto out;
		}
	}
	if ((r = if_addr(sock, NET_UPLINK, link_base(s) + 2, 30)) < 0 || (r = if_up(sock, NET_UPLINK)) < 0 ||
	    (r = if_addr(root_sock, outer, link_base(s) + 1, 30)) < 0 || (r = if_up(root_sock, outer)) < 0 ||
	    (r = route_default(sock, link_base(s) + 1)) < 0) {
		setup_fail(s, "addresses", r);
		goto out;
	}
	/* /proc/sys/net is the opener's (this thread's) namespace. */
	if ((r = write_sysctl("/proc/sys/net/ipv4/ip_forward", "1")) < 0) {
		setup_fail(s, "ip_forward", r);
		goto out;
	}
	s->dns_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons(NET_DNS_PORT);
	sa.sin_addr.s_addr = inet_addr(NET_GW);
	if (s->dns_fd < 0 || bind(s->dns_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = setup_fail(s, "resolver socket", errno);
		goto out;
	}
	s->nft = nft_open(0);
	s->nft_json = nft_open(1);
	if (!s->nft || !s->nft_json) {
		r = kiln_err_set(&s->err, KERR_NET_ERROR, "sandbox network: cannot open nftables");
		goto out;
	}
	rules = sandbox_ruleset(s);
	if (!rules) {
		r = kiln_err_set(&s->err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	r = nft_run(s->nft, rules, NULL, &s->err);
	free(rules);
out:
	close(sock);
	return r < 0 ? -1 : 0;
}

static const char *proto_name(int p)
{
	return p == 6 ? "tcp" : p == 17 ? "udp" : p == 1 ? "icmp" : "other";
}

static int proto_value(json_t *v)
{
	const char *s = json_string_value(v);

	if (json_is_integer(v))
		return (int)json_integer_value(v);
	if (!s)
		return -1;
	return !strcmp(s, "tcp") ? 6 : !strcmp(s, "udp") ? 17 : !strcmp(s, "icmp") ? 1 : 255;
}

/* Report destinations in a blocked-flow set not reported before. */
static void report_blocked(struct net_sandbox *s, json_t *root)
{
	size_t i, j;
	json_t *e, *el;

	json_array_foreach(json_object_get(root, "nftables"), i, e) {
		json_t *set = json_object_get(e, "set");

		json_array_foreach(json_object_get(set, "elem"), j, el) {
			json_t *val = json_object_get(el, "elem") ? json_object_get(json_object_get(el, "elem"), "val") : el;
			json_t *cat = json_object_get(val, "concat");
			struct in_addr ia;
			struct blocked_seen b = { 0 };
			size_t k;
			char dst[32];

			if (!json_is_array(cat) || json_array_size(cat) < 2 || !json_is_string(json_array_get(cat, 0)) ||
			    inet_pton(AF_INET, json_string_value(json_array_get(cat, 0)), &ia) != 1)
				continue;
			b.addr = ntohl(ia.s_addr);
			b.proto = (uint8_t)proto_value(json_array_get(cat, 1));
			if (json_array_size(cat) == 3)
				b.port = (uint16_t)json_integer_value(json_array_get(cat, 2));
			for (k = 0; k < s->nseen; k++)
				if (s->seen[k].addr == b.addr && s->seen[k].port == b.port && s->seen[k].proto == b.proto)
					break;
			if (k < s->nseen || s->nseen >= NET_MAX_EVENTS)
				continue;
			s->seen[s->nseen++] = b;
			if (s->on_blocked)
				s->on_blocked(s->ctx, ip_str(b.addr, dst, sizeof(dst)), b.port, proto_name(b.proto));
		}
	}
}

/* The named counters of the calling thread's table inet kiln. */
struct kiln_counters {
	uint64_t allowed, blocked, bytes_out, bytes_in;
};

static int counter_cb(const struct nlmsghdr *nlh, void *arg)
{
	struct kiln_counters *c = arg;
	struct nlattr *a, *d, *name = NULL, *data = NULL, *table = NULL;
	uint64_t packets = 0, bytes = 0;
	const char *n;

	mnl_attr_for_each(a, nlh, sizeof(struct nfgenmsg)) {
		if (mnl_attr_get_type(a) == NFTA_OBJ_NAME && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0)
			name = a;
		else if (mnl_attr_get_type(a) == NFTA_OBJ_TABLE && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0)
			table = a;
		else if (mnl_attr_get_type(a) == NFTA_OBJ_DATA && mnl_attr_validate(a, MNL_TYPE_NESTED) == 0)
			data = a;
	}
	if (!name || !data || !table || strcmp(mnl_attr_get_str(table), "kiln"))
		return MNL_CB_OK;
	mnl_attr_for_each_nested(d, data) {
		if (mnl_attr_validate(d, MNL_TYPE_U64) < 0)
			continue;
		if (mnl_attr_get_type(d) == NFTA_COUNTER_PACKETS)
			packets = be64toh(mnl_attr_get_u64(d));
		else if (mnl_attr_get_type(d) == NFTA_COUNTER_BYTES)
			bytes = be64toh(mnl_attr_get_u64(d));
	}
	n = mnl_attr_get_str(name);
	if (!strcmp(n, "allowed"))
		c->allowed = packets;
	else if (!strcmp(n, "blocked"))
		c->blocked = packets;
	else if (!strcmp(n, "bytes_out"))
		c->bytes_out = bytes;
	else if (!strcmp(n, "bytes_in"))
		c->bytes_in = bytes;
	return MNL_CB_OK;
}

/* Read the counters straight from the kernel (a dump of table kiln's
 * counter objects). Not through libnftables: its cache would fetch every
 * set element of the table first (65,536 flows: ~1 s, under nft_lock).
 * Returns 0 or -errno. */
static int counters_read(struct kiln_counters *c)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct mnl_socket *nl;
	struct nlmsghdr *nlh;
	struct nfgenmsg *nfg;
	unsigned seq, portid;
	ssize_t n;
	int r;

	memset(c, 0, sizeof(*c));
	nl = nl_open(NETLINK_NETFILTER, &portid);
	if (!nl)
		return -errno;
	nlh = nl_request_header(buf, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ, NLM_F_REQUEST | NLM_F_DUMP);
	seq = nlh->nlmsg_seq; /* buf is reused for the answers */
	nfg = mnl_nlmsg_put_extra_header(nlh, sizeof(*nfg));
	nfg->nfgen_family = NFPROTO_INET;
	nfg->version = NFNETLINK_V0;
	nfg->res_id = 0;
	mnl_attr_put_strz(nlh, NFTA_OBJ_TABLE, "kiln");
	mnl_attr_put_u32(nlh, NFTA_OBJ_TYPE, htonl(NFT_OBJECT_COUNTER));
	if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0) {
		r = -errno;
		goto out;
	}
	for (;;) {
		n = mnl_socket_recvfrom(nl, buf, sizeof(buf));
		if (n < 0) {
			r = -errno;
			goto out;
		}
		r = mnl_cb_run(buf, (size_t)n, seq, portid, counter_cb, c);
		if (r <= MNL_CB_STOP) {
			r = r < 0 ? -errno : 0;
			goto out;
		}
	}
out:
	mnl_socket_close(nl);
	return r;
}

/* Read the kernel's counters into s->st and report new blocked flows. */
static void sandbox_poll(struct net_sandbox *s)
{
	json_t *root = NULL;
	struct kiln_counters c;
	uint64_t blocked;

	if (counters_read(&c) < 0)
		return;
	pthread_mutex_lock(&s->lock);
	s->st.allowed = c.allowed;
	blocked = c.blocked;
	s->st.bytes_out = c.bytes_out;
	s->st.bytes_in = c.bytes_in;
	pthread_mutex_unlock(&s->lock);
	if (blocked == s->st.blocked)
		return;
	s->st.blocked = blocked;
	if (s->nseen >= NET_MAX_EVENTS)
		return;
	root = NULL;
	if (nft_run(s->nft_json, "list set inet kiln bdest", &root, NULL) == 0 && root)
		report_blocked(s, root);
	json_decref(root);
	root = NULL;
	if (nft_run(s->nft_json, "list set inet kiln bother", &root, NULL) == 0 && root)
		report_blocked(s, root);
	json_decref(root);
}

/* The hostname rules that name matches, as a bit set. */
static uint64_t rules_matching(const struct net_sandbox *s, const char *name)
{
	uint64_t m = 0;

	for (size_t i = 0; i < s->nrules && i < 64; i++) {
		const struct spec_net_rule *rule = &s->rules[i];
		char pat[SPEC_MAX_NET_HOST + 3];

		if (rule->kind == SPEC_NET_HOST)
			snprintf(pat, sizeof(pat), "%s", rule->host);
		else if (rule->kind == SPEC_NET_WILDCARD)
			snprintf(pat, sizeof(pat), "*.%s", rule->host);
		else
			continue;
		if (dns_name_match(pat, name))
			m |= 1ull << i;
	}
	return m;
}

static void dns_reply(struct net_sandbox *s, const struct dns_query *q, const struct sockaddr_in *to, int rcode,
		      const uint32_t *addrs, size_t n, uint32_t ttl)
{
	uint8_t out[NET_DNS_UDP_MAX];
	size_t len = dns_build_reply(q, rcode, addrs, n, ttl, out, sizeof(out));

	if (len)
		sendto(s->dns_fd, out, len, MSG_DONTWAIT, (const struct sockaddr *)to, sizeof(*to));
}

/* One datagram from the guest. It is hostile: parsed strictly, answered
 * from our own records, never forwarded as it came. */
static void dns_from_guest(struct net_sandbox *s)
{
	uint8_t msg[DNS_MAX_MSG], out[64];
	struct sockaddr_in from;
	socklen_t fl = sizeof(from);
	struct dns_query q;
	uint16_t id = 0;
	uint64_t match;
	ssize_t n = recvfrom(s->dns_fd, msg, sizeof(msg), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
	struct dns_pending *p = NULL;

	if (n <= 0 || fl != sizeof(from) || from.sin_addr.s_addr != inet_addr(NET_GUEST))
		return;
	pthread_mutex_lock(&s->lock);
	s->st.dns_queries++;
	pthread_mutex_unlock(&s->lock);
	if (dns_parse_query(msg, (size_t)n, &q, &id) < 0) {
		size_t len = dns_build_formerr(id, out, sizeof(out));

		if (len && n >= 12)
			sendto(s->dns_fd, out, len, MSG_DONTWAIT, (struct sockaddr *)&from, sizeof(from));
		return;
	}
	match = q.qclass == DNS_CLASS_IN ? rules_matching(s, q.name) : 0;
	if (!match) {
		pthread_mutex_lock(&s->lock);
		s->st.dns_refused++;
		pthread_mutex_unlock(&s->lock);
		dns_reply(s, &q, &from, DNS_RCODE_NXDOMAIN, NULL, 0, 0);
		return;
	}
	if (q.qtype != DNS_TYPE_A) {
		/* The name exists, but only its IPv4 addresses are ever served. */
		dns_reply(s, &q, &from, DNS_RCODE_NOERROR, NULL, 0, 0);
		return;
	}
	for (size_t i = 0; i < NET_DNS_PENDING; i++)
		if (!s->pending[i].used) {
			p = &s->pending[i];
			break;
		}
	if (!p) {
		dns_reply(s, &q, &from, DNS_RCODE_SERVFAIL, NULL, 0, 0);
		return;
	}
	if (getrandom(&p->up_id, sizeof(p->up_id), 0) != sizeof(p->up_id))
		p->up_id = (uint16_t)rand();
	{
		uint8_t qb[DNS_MAX_NAME + 32];
		size_t len = dns_build_query(p->up_id, q.name, DNS_TYPE_A, qb, sizeof(qb));

		if (!len || s->up_fd < 0 || send(s->up_fd, qb, len, MSG_DONTWAIT) < 0) {
			dns_reply(s, &q, &from, DNS_RCODE_SERVFAIL, NULL, 0, 0);
			return;
		}
	}
	p->used = 1;
	p->q = q;
	p->from = from;
	p->rules = match;
	p->deadline_ms = proto_now_ms() + NET_DNS_TIMEOUT_MS;
}

/* Let addrs through for the hostname rules in match, for ttl seconds. */
static void allow_addresses(struct net_sandbox *s, uint64_t match, const struct dns_addr *addrs, size_t n,
			    uint32_t ttl)
{
	struct text t = { 0 };
	char a[32];

	/* Deleting first renews an entry's timeout; a missing one is no error
	 * worth stopping for, so the deletes run as their own commands. */
	for (size_t i = 0; i < s->nrules && i < 64; i++) {
		if (!(match & (1ull << i)))
			continue;
		for (size_t k = 0; k < n; k++) {
			char cmd[160];

			snprintf(cmd, sizeof(cmd), "delete element inet kiln host%zu { %s }", i,
				 ip_str(ntohl(addrs[k].addr), a, sizeof(a)));
			nft_run(s->nft, cmd, NULL, NULL);
			text_add(&t, "add element inet kiln host%zu { %s timeout %us }\n", i, a, ttl);
		}
	}
	if (t.b.p)
		nft_run(s->nft, t.b.p, NULL, NULL);
	buf_free(&t.b);
}

static void dns_from_upstream(struct net_sandbox *s)
{
	uint8_t msg[DNS_MAX_MSG];
	ssize_t n = recv(s->up_fd, msg, sizeof(msg), MSG_DONTWAIT);
	struct dns_addr addrs[32];
	uint32_t ips[32], ttl = NET_TTL_MAX;
	size_t na = 0;
	int rcode = 0;

	if (n < 12)
		return;
	for (size_t i = 0; i < NET_DNS_PENDING; i++) {
		struct dns_pending *p = &s->pending[i];
		uint64_t match;

		if (!p->used || ((uint16_t)(msg[0] << 8 | msg[1])) != p->up_id)
			continue;
		if (dns_parse_response(msg, (size_t)n, p->up_id, p->q.name, addrs, 32, &na, &rcode) < 0)
			return; /* not the answer (spoofed or broken): the query times out */
		p->used = 0;
		match = p->rules;
		if (rcode != DNS_RCODE_NOERROR) {
			dns_reply(s, &p->q, &p->from, rcode == DNS_RCODE_NXDOMAIN ? rcode : DNS_RCODE_SERVFAIL, NULL, 0, 0);
			return;
		}
		for (size_t k = 0; k < na; k++) {
			ips[k] = addrs[k].addr;
			if (addrs[k].ttl < ttl)
				ttl = addrs[k].ttl;
		}
		if (ttl < NET_TTL_MIN)
			ttl = NET_TTL_MIN;
		/* Plain UDP DNS (no EDNS in our replies): what fits 512 bytes. */
		while (na) {
			uint8_t probe[NET_DNS_UDP_MAX];

			if (dns_build_reply(&p->q, DNS_RCODE_NOERROR, ips, na, ttl, probe, sizeof(probe)))
				break;
			na--;
		}
		if (na)
			allow_addresses(s, match, addrs, na, ttl);
		dns_reply(s, &p->q, &p->from, DNS_RCODE_NOERROR, ips, na, ttl);
		return;
	}
}

static void dns_expire(struct net_sandbox *s)
{
	int64_t now = proto_now_ms();

	for (size_t i = 0; i < NET_DNS_PENDING; i++)
		if (s->pending[i].used && now >= s->pending[i].deadline_ms) {
			s->pending[i].used = 0;
			dns_reply(s, &s->pending[i].q, &s->pending[i].from, DNS_RCODE_SERVFAIL, NULL, 0, 0);
		}
}

/* The rules of a sandbox taken off the network: every frame the guest sends
 * is dropped as it enters tap0 (netdev ingress: before ARP, routing,
 * conntrack or table kiln's accepts, established flows included), and
 * nothing is forwarded or delivered to the namespace itself. A drop in any
 * base chain is final, so these tables win over table kiln, which stays for
 * its counters. */
static const char sandbox_cut_rules[] =
	"table netdev kiln_cut {\n"
	" chain guest { type filter hook ingress device \"" NET_TAP "\" priority -500; policy drop; }\n"
	"}\n"
	"table inet kiln_cut {\n"
	" chain forward { type filter hook forward priority -500; policy drop; }\n"
	" chain input { type filter hook input priority -500; policy drop; }\n"
	"}\n";

/* Runs on the sandbox's thread (in its namespace): net_sandbox_cut's work.
 * First the drop-all rules (one transaction), then the uplink veth goes, so
 * the namespace has no path to the host or anything beyond it even without
 * the rules, then the resolver's socket closes. All of it lives in kiln-host's
 * namespace: neither the guest (which has only its virtio-net frontend) nor
 * QEMU (an unprivileged uid in an empty namespace of its own, holding only
 * the tap's fd) can change any of it. Returns 0 or -1 with s->cut_err. */
static int sandbox_cut(struct net_sandbox *s)
{
	int r;

	if (nft_run(s->nft, sandbox_cut_rules, NULL, &s->cut_err) < 0)
		return -1;
	r = link_delete(NET_UPLINK);
	if (r < 0 && r != -ENODEV)
		return kiln_err_set(&s->cut_err, KERR_NET_ERROR, "sandbox network: removing %s: %s", NET_UPLINK,
				    strerror(-r));
	if (s->dns_fd >= 0) {
		close(s->dns_fd);
		s->dns_fd = -1;
	}
	/* Queries in flight get no answer: the guest could not receive it. */
	for (size_t i = 0; i < NET_DNS_PENDING; i++)
		s->pending[i].used = 0;
	s->is_cut = 1;
	return 0;
}

/* Runs on the sandbox's thread (in its namespace): net_sandbox_update's
 * work. One nftables transaction replaces chain sbx_forward's rules with
 * rules[0..n)'s at the next generation, adds the sets of new host-name
 * rules, empties those whose rule now names another host (a rule that keeps
 * its index and its name keeps the addresses resolved for it), and deletes
 * the sets no rule uses any more; the kernel applies all of it or none.
 * Then the resolver matches names against the new rules, and the queries
 * in flight are matched again (a name no rule takes any more is answered
 * NXDOMAIN now). On success rules become s->rules (owned), else they are
 * freed; returns 0 or -1 with s->upd_err. */
static int sandbox_update(struct net_sandbox *s, struct spec_net_rule *rules, size_t n)
{
	struct text t = { 0 };
	size_t most = n > s->nrules ? n : s->nrules;
	int r;

	if (s->is_cut) {
		free(rules);
		return kiln_err_set(&s->upd_err, KERR_NOT_RUNNING, "the sandbox was taken off the network for good");
	}
	text_add(&t, "flush chain inet kiln sbx_forward\n");
	for (size_t i = 0; i < most; i++) {
		int was = i < s->nrules && s->rules[i].kind != SPEC_NET_CIDR;
		int is = i < n && rules[i].kind != SPEC_NET_CIDR;

		if (is && !was)
			text_add(&t, "add set inet kiln host%zu { type ipv4_addr; flags timeout; size 4096; }\n", i);
		else if (is && (s->rules[i].kind != rules[i].kind || strcmp(s->rules[i].host, rules[i].host)))
			text_add(&t, "flush set inet kiln host%zu\n", i);
	}
	forward_rules(s->h, rules, n, s->gen + 1, "add rule inet kiln sbx_forward ", &t);
	for (size_t i = 0; i < s->nrules; i++)
		if (s->rules[i].kind != SPEC_NET_CIDR && !(i < n && rules[i].kind != SPEC_NET_CIDR))
			text_add(&t, "delete set inet kiln host%zu\n", i);
	if (t.oom) {
		buf_free(&t.b);
		free(rules);
		return kiln_err_set(&s->upd_err, KERR_HOST_ERROR, "out of memory");
	}
	r = nft_run(s->nft, t.b.p, NULL, &s->upd_err);
	buf_free(&t.b);
	if (r < 0) {
		free(rules);
		return -1;
	}
	free(s->rules);
	s->rules = rules;
	s->nrules = n;
	s->gen++;
	for (size_t i = 0; i < NET_DNS_PENDING; i++) {
		struct dns_pending *p = &s->pending[i];

		if (!p->used)
			continue;
		p->rules = rules_matching(s, p->q.name);
		if (!p->rules) {
			p->used = 0;
			pthread_mutex_lock(&s->lock);
			s->st.dns_refused++;
			pthread_mutex_unlock(&s->lock);
			dns_reply(s, &p->q, &p->from, DNS_RCODE_NXDOMAIN, NULL, 0, 0);
		}
	}
	return 0;
}

static void *sandbox_main(void *arg)
{
	struct net_sandbox *s = arg;
	int root_sock, rc;
	int64_t next_poll;

	/* Made before unshare: these stay in the host's namespace. An
	 * upstream that cannot be reached now only means SERVFAIL answers. */
	root_sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	s->up_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->up_fd >= 0 &&
	    connect(s->up_fd, (const struct sockaddr *)&s->h->dns_upstream, sizeof(s->h->dns_upstream)) < 0) {
		close(s->up_fd);
		s->up_fd = -1;
	}
	if (root_sock < 0)
		rc = setup_fail(s, "socket", errno);
	else
		rc = sandbox_setup(s, root_sock);
	if (root_sock >= 0)
		close(root_sock);
	pthread_mutex_lock(&s->lock);
	s->setup_done = 1;
	s->setup_rc = rc;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (rc < 0)
		return NULL;
	next_poll = proto_now_ms() + NET_POLL_MS;
	for (;;) {
		struct pollfd pf[5] = {
			{ .fd = s->stop_fd, .events = POLLIN },
			{ .fd = s->dns_fd, .events = POLLIN },
			{ .fd = s->up_fd, .events = POLLIN },
			{ .fd = s->cut_fd, .events = POLLIN },
			{ .fd = s->upd_fd, .events = POLLIN },
		};
		int64_t now = proto_now_ms();
		int wait = next_poll > now ? (int)(next_poll - now) : 0;

		if (poll(pf, 5, wait) < 0 && errno != EINTR)
			break;
		if (pf[0].revents)
			break;
		if (pf[3].revents & POLLIN) {
			uint64_t v;

			if (read(s->cut_fd, &v, sizeof(v)) == sizeof(v)) {
				int r = sandbox_cut(s);

				pthread_mutex_lock(&s->lock);
				s->cut_done = 1;
				s->cut_rc = r;
				pthread_cond_broadcast(&s->cond);
				pthread_mutex_unlock(&s->lock);
			}
			continue;
		}
		if (pf[4].revents & POLLIN) {
			uint64_t v;

			if (read(s->upd_fd, &v, sizeof(v)) == sizeof(v)) {
				struct spec_net_rule *rules;
				uint64_t seq;
				size_t n;
				int r;

				pthread_mutex_lock(&s->lock);
				rules = s->upd_rules;
				n = s->upd_n;
				seq = s->upd_seq;
				s->upd_rules = NULL;
				pthread_mutex_unlock(&s->lock);
				if (seq == s->upd_done_seq)
					continue; /* answered already */
				r = sandbox_update(s, rules, n);
				pthread_mutex_lock(&s->lock);
				s->upd_rc = r;
				s->upd_done_seq = seq;
				pthread_cond_broadcast(&s->cond);
				pthread_mutex_unlock(&s->lock);
			}
			continue;
		}
		if (pf[1].revents & POLLIN)
			dns_from_guest(s);
		if (pf[2].revents & POLLIN)
			dns_from_upstream(s);
		if (proto_now_ms() >= next_poll) {
			dns_expire(s);
			sandbox_poll(s);
			next_poll = proto_now_ms() + NET_POLL_MS;
		}
	}
	sandbox_poll(s);
	return NULL;
}

static void sandbox_free(struct net_sandbox *s)
{
	nft_close(s->nft);
	nft_close(s->nft_json);
	if (s->dns_fd >= 0)
		close(s->dns_fd);
	if (s->up_fd >= 0)
		close(s->up_fd);
	if (s->tap_fd >= 0)
		close(s->tap_fd);
	if (s->stop_fd >= 0)
		close(s->stop_fd);
	if (s->cut_fd >= 0)
		close(s->cut_fd);
	if (s->upd_fd >= 0)
		close(s->upd_fd);
	free(s->upd_rules);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s->rules);
	free(s);
}

int net_sandbox_start(struct net_host *h, const struct spec_net_rule *rules, size_t n, net_blocked_fn on_blocked,
		      void *ctx, struct net_sandbox **out, struct kiln_err *err)
{
	struct net_sandbox *s;
	int64_t deadline = proto_now_ms() + NET_SETUP_MS;

	*out = NULL;
	if (!h || !h->enabled)
		return kiln_err_set(err, KERR_EGRESS_DISABLED,
				    "this host does not offer network egress (network.egress in its configuration)");
	if (n > SPEC_MAX_NET_RULES)
		return kiln_err_set(err, KERR_INVALID_SPEC, "network.allow: more than %d rules", SPEC_MAX_NET_RULES);
	s = calloc(1, sizeof(*s));
	if (!s)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	s->h = h;
	s->tap_fd = s->dns_fd = s->up_fd = -1;
	s->on_blocked = on_blocked;
	s->ctx = ctx;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	s->stop_fd = eventfd(0, EFD_CLOEXEC);
	s->cut_fd = eventfd(0, EFD_CLOEXEC);
	s->upd_fd = eventfd(0, EFD_CLOEXEC);
	s->gen = 1;
	s->rules = n ? calloc(n, sizeof(*rules)) : NULL;
	if (s->stop_fd < 0 || s->cut_fd < 0 || s->upd_fd < 0 || (n && !s->rules)) {
		sandbox_free(s);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	if (n)
		memcpy(s->rules, rules, n * sizeof(*rules));
	s->nrules = n;
	if (pthread_create(&s->thread, NULL, sandbox_main, s) != 0) {
		sandbox_free(s);
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot start the sandbox network thread");
	}
	s->thread_started = 1;
	pthread_mutex_lock(&s->lock);
	while (!s->setup_done) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
		if (proto_now_ms() > deadline && !s->setup_done) {
			pthread_mutex_unlock(&s->lock);
			kiln_err_set(err, KERR_NET_ERROR, "sandbox network: set-up took longer than %d ms", NET_SETUP_MS);
			net_sandbox_stop(s, NULL);
			return -1;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (s->setup_rc < 0) {
		*err = s->err;
		net_sandbox_stop(s, NULL);
		return -1;
	}
	pthread_mutex_lock(&h->lock);
	h->active++;
	h->started++;
	pthread_mutex_unlock(&h->lock);
	*out = s;
	return 0;
}

int net_sandbox_tap_fd(const struct net_sandbox *s)
{
	return s ? s->tap_fd : -1;
}

int net_sandbox_cut(struct net_sandbox *s, struct kiln_err *err)
{
	uint64_t one = 1;
	int64_t deadline = proto_now_ms() + NET_SETUP_MS;
	int rc;

	if (!s)
		return 0;
	pthread_mutex_lock(&s->lock);
	s->cut_done = 0;
	pthread_mutex_unlock(&s->lock);
	if (write(s->cut_fd, &one, sizeof(one)) != sizeof(one))
		return kiln_err_set(err, KERR_NET_ERROR, "sandbox network: cannot reach its thread: %s", strerror(errno));
	pthread_mutex_lock(&s->lock);
	while (!s->cut_done) {
		struct timespec ts;

		if (proto_now_ms() > deadline) {
			pthread_mutex_unlock(&s->lock);
			return kiln_err_set(err, KERR_NET_ERROR, "sandbox network: taking it down took longer than %d ms",
					    NET_SETUP_MS);
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
	}
	rc = s->cut_rc;
	if (rc < 0)
		*err = s->cut_err;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int net_sandbox_update(struct net_sandbox *s, const struct spec_net_rule *rules, size_t n, struct kiln_err *err)
{
	struct spec_net_rule *copy = NULL;
	int64_t deadline = proto_now_ms() + NET_SETUP_MS;
	uint64_t one = 1, seq;
	int rc;

	if (!s)
		return kiln_err_set(err, KERR_NOT_RUNNING, "the sandbox has no network");
	if (n > SPEC_MAX_NET_RULES)
		return kiln_err_set(err, KERR_INVALID_SPEC, "network.allow: more than %d rules", SPEC_MAX_NET_RULES);
	if (n && !(copy = malloc(n * sizeof(*rules))))
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	if (n)
		memcpy(copy, rules, n * sizeof(*rules));
	pthread_mutex_lock(&s->lock);
	if (s->upd_seq != s->upd_done_seq) {
		/* An earlier request timed out and the thread has yet to do it. */
		pthread_mutex_unlock(&s->lock);
		free(copy);
		return kiln_err_set(err, KERR_BUSY, "an earlier update of the sandbox's network is still being applied");
	}
	s->upd_rules = copy;
	s->upd_n = n;
	seq = ++s->upd_seq;
	pthread_mutex_unlock(&s->lock);
	if (write(s->upd_fd, &one, sizeof(one)) != sizeof(one)) {
		rc = errno;
		pthread_mutex_lock(&s->lock);
		free(s->upd_rules);
		s->upd_rules = NULL;
		s->upd_done_seq = seq;
		pthread_mutex_unlock(&s->lock);
		return kiln_err_set(err, KERR_NET_ERROR, "sandbox network: cannot reach its thread: %s", strerror(rc));
	}
	pthread_mutex_lock(&s->lock);
	while (s->upd_done_seq != seq) {
		struct timespec ts;

		if (proto_now_ms() > deadline) {
			pthread_mutex_unlock(&s->lock);
			return kiln_err_set(err, KERR_NET_ERROR, "sandbox network: the update took longer than %d ms",
					    NET_SETUP_MS);
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
	}
	rc = s->upd_rc;
	if (rc < 0)
		*err = s->upd_err;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void net_sandbox_stop(struct net_sandbox *s, struct net_stats *st)
{
	uint64_t one = 1;

	if (!s)
		return;
	if (s->thread_started) {
		if (write(s->stop_fd, &one, sizeof(one)) < 0) {
			/* an eventfd write only fails on overflow: it is readable then */
		}
		pthread_join(s->thread, NULL);
	}
	if (s->setup_done && s->setup_rc == 0) {
		struct net_host *h = s->h;

		pthread_mutex_lock(&h->lock);
		h->active--;
		h->allowed += s->st.allowed;
		h->blocked += s->st.blocked;
		h->bytes_out += s->st.bytes_out;
		h->bytes_in += s->st.bytes_in;
		h->dns_queries += s->st.dns_queries;
		h->dns_refused += s->st.dns_refused;
		pthread_mutex_unlock(&h->lock);
	}
	if (st)
		*st = s->st;
	sandbox_free(s);
}

json_t *net_stats_json(const struct net_stats *st)
{
	return json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "egress", "allow", "allowed_connections",
			 (json_int_t)st->allowed, "blocked_connections", (json_int_t)st->blocked, "bytes_out",
			 (json_int_t)st->bytes_out, "bytes_in", (json_int_t)st->bytes_in, "dns_queries",
			 (json_int_t)st->dns_queries, "dns_refused", (json_int_t)st->dns_refused);
}
