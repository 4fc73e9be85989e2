/* ports: which requests are for a sandbox's port (ports.h). Three ways in:
 * a host name `<port>-<id>.<sandbox_domain>` (E2B's getHost), E2B's header
 * routing (E2b-Sandbox-Id and E2b-Sandbox-Port on any path) -- envd's own
 * port 49983 stays the envd relay's either way -- and kiln's native path
 * /v1/sessions/{id}/ports/{port}[/...], whose rest is the server's path. */
#include "ports_int.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* "1".."65535", digits only: the port, else 0. */
static unsigned port_of(const char *s, size_t n)
{
	unsigned v = 0;

	if (!n || n > 5)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return 0;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	return v <= 65535 ? v : 0;
}

static int bad(struct ports_match *m, const char *msg)
{
	snprintf(m->target, sizeof(m->target), "%s", msg);
	return -1;
}

static int id_ok(const char *id, size_t n)
{
	if (!n || n >= sizeof(((struct ports_match *)0)->id))
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
		      (id[i] >= '0' && id[i] <= '9') || id[i] == '_' || id[i] == '-'))
			return 0;
	return 1;
}

/* Host: "<port>-<id>.<domain>[:N]" (any case): 1 with port and id; 0 when
 * the name is not under the domain in that shape. */
static int host_route(const char *host, const char *domain, unsigned *port, char id[40])
{
	size_t hn, dn = strlen(domain), pn;
	const char *dot, *dash;
	const char *colon = strchr(domain, ':') ? NULL : strrchr(host, ':');

	/* A domain with its own :PORT is matched with the port; else the
	 * Host's port (if any) is not part of the name. */
	hn = colon ? (size_t)(colon - host) : strlen(host);
	if (hn <= dn + 1 || strncasecmp(host + hn - dn, domain, dn) || host[hn - dn - 1] != '.')
		return 0;
	dot = host + hn - dn - 1;
	dash = memchr(host, '-', (size_t)(dot - host));
	if (!dash)
		return 0;
	pn = (size_t)(dash - host);
	*port = port_of(host, pn);
	if (!*port || !id_ok(dash + 1, (size_t)(dot - dash - 1)))
		return 0;
	memcpy(id, dash + 1, (size_t)(dot - dash - 1));
	id[dot - dash - 1] = 0;
	return 1;
}

int ports_match(struct MHD_Connection *conn, const char *url, const char *uri, const char *domain,
		struct ports_match *m)
{
	const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
	const char *sid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "E2b-Sandbox-Id");
	const char *sport = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "E2b-Sandbox-Port");

	memset(m, 0, sizeof(*m));
	if (!uri)
		uri = url;
	if (domain && host && host_route(host, domain, &m->port, m->id)) {
		if (m->port == PORTS_ENVD_PORT)
			return 0; /* envd: the relay's, which reads m->id when no header names the sandbox */
		m->way = PORTS_E2B;
		if (uri[0] != '/' || strlen(uri) >= sizeof(m->target))
			return bad(m, "the request target is too long (8 KiB at most) or not a path");
		snprintf(m->target, sizeof(m->target), "%s", uri);
		return 1;
	}
	if (sid && sport) {
		unsigned p = port_of(sport, strlen(sport));

		if (p == PORTS_ENVD_PORT)
			return 0; /* envd: the relay's */
		m->way = PORTS_E2B;
		if (!p)
			return bad(m, "E2b-Sandbox-Port: expected a port, 1-65535");
		if (!id_ok(sid, strlen(sid)))
			return bad(m, "E2b-Sandbox-Id: not a sandbox id");
		if (uri[0] != '/' || strlen(uri) >= sizeof(m->target))
			return bad(m, "the request target is too long (8 KiB at most) or not a path");
		snprintf(m->id, sizeof(m->id), "%s", sid);
		m->port = p;
		snprintf(m->target, sizeof(m->target), "%s", uri);
		return 1;
	}
	if (!strncmp(url, "/v1/sessions/", 13)) {
		/* Match on the raw target: the rest of its path is the server's, as sent. */
		const char *p = uri + 13, *slash, *rest;
		size_t idn;
		unsigned port;

		if (strncmp(uri, "/v1/sessions/", 13))
			return 0;
		slash = strchr(p, '/');
		if (!slash || strncmp(slash, "/ports/", 7))
			return 0;
		idn = (size_t)(slash - p);
		rest = slash + 7;
		port = port_of(rest, strcspn(rest, "/?"));
		m->way = PORTS_NATIVE;
		if (!id_ok(p, idn))
			return bad(m, "no such session");
		if (!port)
			return bad(m, "a port is 1-65535");
		memcpy(m->id, p, idn);
		m->id[idn] = 0;
		m->port = port;
		rest += strcspn(rest, "/?");
		if (strlen(rest) + 2 >= sizeof(m->target))
			return bad(m, "the request target is too long (8 KiB at most)");
		snprintf(m->target, sizeof(m->target), "%s%s", rest[0] == '/' ? "" : "/", rest);
		return 1;
	}
	return 0;
}
