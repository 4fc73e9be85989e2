/* connect_call: envd's methods and their kinds (one table), and the
 * Content-Type a Connect call of each kind must carry (lib/connect_call.h).
 * The Content-Type is a client's bytes: parsed by RFC 9110's media-type
 * grammar in place, never copied unbounded; fuzzed by fuzz_connect_call. */
#include "connect_call.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* E2B's envd (packages/envd/spec: process.proto, filesystem.proto): every
 * method, whether kiln implements it or not, so that one kiln does not
 * serve is still known for a stream (and counted as one) and refused in
 * its kind's shape by kiln-host. */
static const struct {
	const char *service, *method;
	enum connect_kind kind;
} envd_methods[] = {
	{ "process.Process", "List", CONNECT_KIND_UNARY },
	{ "process.Process", "Connect", CONNECT_KIND_SERVER_STREAM },
	{ "process.Process", "Start", CONNECT_KIND_SERVER_STREAM },
	{ "process.Process", "Update", CONNECT_KIND_UNARY },
	{ "process.Process", "StreamInput", CONNECT_KIND_CLIENT_STREAM },
	{ "process.Process", "SendInput", CONNECT_KIND_UNARY },
	{ "process.Process", "SendSignal", CONNECT_KIND_UNARY },
	{ "process.Process", "CloseStdin", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "Stat", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "MakeDir", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "Move", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "ListDir", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "Remove", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "WatchDir", CONNECT_KIND_SERVER_STREAM },
	{ "filesystem.Filesystem", "CreateWatcher", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "GetWatcherEvents", CONNECT_KIND_UNARY },
	{ "filesystem.Filesystem", "RemoveWatcher", CONNECT_KIND_UNARY },
};

enum connect_kind connect_call_kind(const char *service, const char *method)
{
	if (!service || !method)
		return CONNECT_KIND_NONE;
	for (size_t i = 0; i < sizeof(envd_methods) / sizeof(envd_methods[0]); i++)
		if (!strcmp(service, envd_methods[i].service) && !strcmp(method, envd_methods[i].method))
			return envd_methods[i].kind;
	return CONNECT_KIND_NONE;
}

enum connect_kind connect_call_kind_path(const char *path)
{
	char service[32];
	const char *slash;
	size_t n;

	if (!path || path[0] != '/')
		return CONNECT_KIND_NONE;
	slash = strchr(path + 1, '/');
	n = slash ? (size_t)(slash - path - 1) : 0;
	/* Longer than any service in the table: none of them. */
	if (!n || n >= sizeof(service) || strchr(slash + 1, '/'))
		return CONNECT_KIND_NONE;
	memcpy(service, path + 1, n);
	service[n] = '\0';
	return connect_call_kind(service, slash + 1);
}

/* ---- Content-Type ---- */

/* RFC 9110's tchar. */
static int tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

static const char *ows(const char *p)
{
	while (*p == ' ' || *p == '\t')
		p++;
	return p;
}

static const char *token(const char *p)
{
	while (tchar((unsigned char)*p))
		p++;
	return p;
}

/* A parameter's value at p (token or quoted-string): the end, or NULL when
 * it is neither. Its unescaped text goes to val (NUL-terminated), or *long_
 * is set when it does not fit: only short values (a charset) are compared. */
static const char *param_value(const char *p, char *val, size_t size, int *long_)
{
	size_t n = 0;

	*long_ = 0;
	if (*p != '"') {
		const char *e = token(p);

		if (e == p)
			return NULL;
		if ((size_t)(e - p) < size) {
			memcpy(val, p, (size_t)(e - p));
			val[e - p] = '\0';
		} else
			*long_ = 1;
		return e;
	}
	for (p++;; p++) {
		unsigned char c = (unsigned char)*p;

		if (c == '"')
			break;
		if (c == '\\') {
			/* quoted-pair: HTAB, SP, VCHAR or obs-text */
			c = (unsigned char)*++p;
			if (!(c == '\t' || c >= 0x20) || c == 0x7f)
				return NULL;
		} else if (!(c == '\t' || c >= 0x20) || c == 0x7f) {
			return NULL; /* the end of the string or a control byte: unclosed */
		}
		if (n + 1 < size)
			val[n++] = (char)c;
		else
			*long_ = 1;
	}
	val[n] = '\0';
	return p + 1;
}

static int eq(const char *p, size_t n, const char *lit)
{
	return strlen(lit) == n && !strncasecmp(p, lit, n);
}

enum connect_media connect_call_media(const char *ct)
{
	const char *p, *type, *sub;
	size_t tlen, slen;
	int charset_ok = 1;

	if (!ct)
		return CONNECT_MEDIA_INVALID;
	type = ows(ct);
	p = token(type);
	tlen = (size_t)(p - type);
	if (!tlen || *p != '/')
		return CONNECT_MEDIA_INVALID;
	sub = p + 1;
	p = token(sub);
	slen = (size_t)(p - sub);
	if (!slen)
		return CONNECT_MEDIA_INVALID;
	/* parameters = *( OWS ";" OWS [ parameter ] ) */
	for (;;) {
		const char *name;
		char val[16];
		int long_;

		p = ows(p);
		if (!*p)
			break;
		if (*p != ';')
			return CONNECT_MEDIA_INVALID;
		p = ows(p + 1);
		if (!*p || *p == ';')
			continue;
		name = p;
		p = token(p);
		if (p == name || *p != '=')
			return CONNECT_MEDIA_INVALID;
		{
			size_t nlen = (size_t)(p - name);

			p = param_value(p + 1, val, sizeof(val), &long_);
			if (!p)
				return CONNECT_MEDIA_INVALID;
			if (eq(name, nlen, "charset") && (long_ || strcasecmp(val, "utf-8")))
				charset_ok = 0;
		}
	}
	if (!eq(type, tlen, "application") || !charset_ok)
		return CONNECT_MEDIA_OTHER;
	if (eq(sub, slen, "json"))
		return CONNECT_MEDIA_JSON;
	if (eq(sub, slen, "proto"))
		return CONNECT_MEDIA_PROTO;
	if (eq(sub, slen, "connect+json"))
		return CONNECT_MEDIA_STREAM_JSON;
	if (eq(sub, slen, "connect+proto"))
		return CONNECT_MEDIA_STREAM_PROTO;
	return CONNECT_MEDIA_OTHER;
}

const char *connect_call_media_want(enum connect_kind kind)
{
	if (kind == CONNECT_KIND_UNARY)
		return "application/json";
	return connect_kind_streams(kind) ? "application/connect+json" : NULL;
}

int connect_call_check_media(enum connect_kind kind, const char *ct, char *why, size_t why_size)
{
	const char *want = connect_call_media_want(kind), *what = connect_kind_streams(kind) ? "streaming" : "unary";
	enum connect_media m = connect_call_media(ct);
	char q[64];
	size_t i;

	if (!want) {
		snprintf(why, why_size, "no such method");
		return -1;
	}
	if ((kind == CONNECT_KIND_UNARY && m == CONNECT_MEDIA_JSON) ||
	    (connect_kind_streams(kind) && m == CONNECT_MEDIA_STREAM_JSON))
		return 0;
	if (!ct) {
		snprintf(why, why_size, "no Content-Type: a %s method takes %s", what, want);
		return -1;
	}
	/* The header quoted, printable bytes only. */
	for (i = 0; ct[i] && i < 60; i++)
		q[i] = ct[i] >= 0x20 && ct[i] < 0x7f && ct[i] != '"' ? ct[i] : '?';
	q[i] = '\0';
	if (m == CONNECT_MEDIA_INVALID)
		snprintf(why, why_size, "Content-Type \"%s%s\" is not a media type: a %s method takes %s", q,
			 ct[i] ? "..." : "", what, want);
	else if (m == CONNECT_MEDIA_OTHER)
		snprintf(why, why_size, "Content-Type \"%s%s\" is not Connect's: a %s method takes %s", q,
			 ct[i] ? "..." : "", what, want);
	else if ((m == CONNECT_MEDIA_JSON || m == CONNECT_MEDIA_PROTO) != (kind == CONNECT_KIND_UNARY))
		snprintf(why, why_size, "Content-Type \"%s%s\" is for %s calls; this method is %s: send %s", q,
			 ct[i] ? "..." : "", kind == CONNECT_KIND_UNARY ? "streaming" : "unary", what, want);
	else /* the right kind, the binary codec */
		snprintf(why, why_size, "Content-Type \"%s%s\": kiln speaks Connect's JSON codec only: send %s", q,
			 ct[i] ? "..." : "", want);
	return -1;
}
