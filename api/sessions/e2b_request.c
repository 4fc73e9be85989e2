/* e2b_request: the E2B control API's input, checked (docs/e2b.md): the create
 * body turned into a POST /v1/sessions body (what each E2B field becomes, or
 * why it is refused), a body's timeout, and the v2 list's metadata filter as
 * the SDK encodes it. Pure (jansson and the spec's env rules only), so that
 * fuzz_e2breq drives it without a server. */
#include "e2b.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "spec.h"

#define E2B_MAX_ENV 256
#define E2B_MAX_METADATA 1024

long e2b_timeout_of(json_t *body, long def)
{
	json_t *v = json_object_get(body, "timeout");

	if (!v || json_is_null(v))
		return def;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > E2B_MAX_TIMEOUT_S)
		return -1;
	/* 0 would end it at once: the shortest timeout there is. */
	return json_integer_value(v) ? (long)json_integer_value(v) : 1;
}

/* A string map (metadata, envVars): NULL, or what is wrong with it. */
static const char *string_map_bad(json_t *m, size_t max)
{
	const char *k;
	json_t *v;

	if (!json_is_object(m))
		return "must be an object of strings";
	if (json_object_size(m) > max)
		return "has too many entries";
	json_object_foreach(m, k, v)
		if (!json_is_string(v))
			return "must be an object of strings";
	return NULL;
}

/* envVars checked with a task's env rules (and at most E2B_MAX_ENV): NULL
 * (none) or compact JSON text in *out; -1 with msg. */
static int env_of(json_t *b, char **out, char *msg, size_t cap)
{
	json_t *v = json_object_get(b, "envVars"), *probe;
	struct kiln_err err = { .code = "" };
	struct task_spec ts;
	const char *bad;
	char *text;
	int r;

	*out = NULL;
	if (!v || json_is_null(v) || (json_is_object(v) && !json_object_size(v)))
		return 0;
	if ((bad = string_map_bad(v, E2B_MAX_ENV))) {
		snprintf(msg, cap, "envVars: %s (at most %d)", bad, E2B_MAX_ENV);
		return -1;
	}
	probe = json_pack("{s:[s], s:O}", "argv", "true", "env", v);
	text = probe ? json_dumps(probe, JSON_COMPACT) : NULL;
	json_decref(probe);
	if (!text) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	r = spec_parse(text, strlen(text), &ts, &err);
	free(text);
	if (r < 0) {
		snprintf(msg, cap, "envVars: %s", err.message);
		return -1;
	}
	spec_free(&ts);
	*out = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
	if (!*out) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	return 0;
}

/* ---- network: E2B's allowOut / denyOut as kiln's allowlist ---- */

#define E2B_ALL_TRAFFIC "0.0.0.0/0"
#define E2B_ALL_PORTS ":1-65535"

/* One allowOut / denyOut entry (a CIDR block, an IPv4 address or, in
 * allowOut only, a host name or "*." wildcard) as a kiln rule on every port,
 * checked by the spec's own parser: 0 with *r, or -1 with msg naming
 * field[i]. */
static int e2b_entry_rule(json_t *v, const char *field, size_t i, struct spec_net_rule *r, char *msg, size_t cap)
{
	struct kiln_err err = { .code = "" };
	struct task_spec ts;
	const char *e = json_string_value(v);
	char rule[SPEC_MAX_NET_RULE_BYTES + 16], *text, *m;
	json_t *probe;
	int rc;

	if (!e) {
		snprintf(msg, cap, "%s[%zu]: must be a string", field, i);
		return -1;
	}
	if (!e[0] || strlen(e) > SPEC_MAX_NET_RULE_BYTES - strlen(E2B_ALL_PORTS)) {
		snprintf(msg, cap, "%s[%zu]: must be 1 to %zu bytes", field, i,
			 SPEC_MAX_NET_RULE_BYTES - strlen(E2B_ALL_PORTS));
		return -1;
	}
	/* E2B's entries have no port; a ':' would be kiln's port (or IPv6). */
	if (strchr(e, ':')) {
		snprintf(msg, cap, "%s[%zu]: \"%.80s\": IPv6 and ports are not supported (an IPv4 CIDR block, an IPv4 "
			 "address or a host name, for every port)", field, i, e);
		return -1;
	}
	snprintf(rule, sizeof(rule), "%s" E2B_ALL_PORTS, e);
	probe = json_pack("{s:[s], s:{s:s, s:[s]}}", "argv", "true", "network", "egress", "allow", "allow", rule);
	text = probe ? json_dumps(probe, JSON_COMPACT) : NULL;
	json_decref(probe);
	if (!text) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	rc = spec_parse(text, strlen(text), &ts, &err);
	free(text);
	if (rc < 0) {
		/* network.allow[0]: "x:1-65535": why -> field[i]: "x": why */
		m = strstr(err.message, ": ");
		m = m ? m + 2 : err.message;
		{
			char *p = strstr(m, E2B_ALL_PORTS "\"");

			if (p)
				memmove(p, p + strlen(E2B_ALL_PORTS), strlen(p + strlen(E2B_ALL_PORTS)) + 1);
		}
		snprintf(msg, cap, "%s[%zu]: %s", field, i, m);
		return -1;
	}
	*r = ts.net_rules[0];
	spec_free(&ts);
	return 0;
}

int e2b_network_map(json_t *internet, json_t *allow_out, json_t *deny_out, json_t **out, char *msg, size_t cap)
{
	struct spec_net_rule r;
	json_t *allow = NULL, *v;
	size_t i, k;
	int deny_all = json_is_false(internet), partial = -1;

	*out = NULL;
	if (internet && !json_is_null(internet) && !json_is_boolean(internet)) {
		snprintf(msg, cap, "allow_internet_access: must be a boolean");
		return -1;
	}
	if (allow_out && !json_is_null(allow_out) &&
	    (!json_is_array(allow_out) || json_array_size(allow_out) > SPEC_MAX_NET_RULES)) {
		snprintf(msg, cap, "allowOut: an array of at most %d CIDR blocks, IPv4 addresses or host names",
			 SPEC_MAX_NET_RULES);
		return -1;
	}
	if (deny_out && !json_is_null(deny_out) &&
	    (!json_is_array(deny_out) || json_array_size(deny_out) > SPEC_MAX_NET_RULES)) {
		snprintf(msg, cap, "denyOut: an array of at most %d CIDR blocks or IPv4 addresses", SPEC_MAX_NET_RULES);
		return -1;
	}
	json_array_foreach(deny_out, i, v) {
		if (e2b_entry_rule(v, "denyOut", i, &r, msg, cap) < 0)
			return -1;
		if (r.kind != SPEC_NET_CIDR) {
			snprintf(msg, cap, "denyOut[%zu]: \"%.80s\": a CIDR block or an IPv4 address (host names are not "
				 "supported for deny rules)", i, json_string_value(v));
			return -1;
		}
		if (r.prefix == 0)
			deny_all = 1;
		else if (partial < 0)
			partial = (int)i;
	}
	allow = json_array();
	if (!allow) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	json_array_foreach(allow_out, i, v) {
		char text[SPEC_NET_RULE_TEXT];
		int dup = 0;

		if (e2b_entry_rule(v, "allowOut", i, &r, msg, cap) < 0)
			goto fail;
		/* The same destination twice is one rule (kiln refuses
		 * duplicates; E2B takes them). */
		spec_net_rule_format(&r, text, sizeof(text));
		for (k = 0; k < json_array_size(allow); k++)
			if (!strcmp(json_string_value(json_array_get(allow, k)), text))
				dup = 1;
		if (!dup)
			json_array_append_new(allow, json_string(text));
	}
	if (!deny_all) {
		/* Everything public is allowed: a deny list would have to win
		 * over that and lose to allowOut, which kiln's allowlist cannot
		 * say. */
		if (partial >= 0) {
			snprintf(msg, cap, "denyOut[%d]: \"%.80s\": kiln's egress policy is an allowlist, so a deny list "
				 "is supported only as [\"" E2B_ALL_TRAFFIC "\"] (everything but allowOut): list what "
				 "the sandbox may reach in allowOut and deny " E2B_ALL_TRAFFIC, partial,
				 json_string_value(json_array_get(deny_out, (size_t)partial)));
			goto fail;
		}
		json_array_clear(allow);
		json_array_append_new(allow, json_string(E2B_ALL_TRAFFIC E2B_ALL_PORTS));
	}
	*out = json_pack("{s:s, s:o}", "egress", "allow", "allow", allow);
	if (!*out) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	return 0;
fail:
	json_decref(allow);
	return -1;
}

/* egressProxy and rules (transforms): refused when they ask for anything. */
static int e2b_network_unsupported(json_t *n, char *msg, size_t cap)
{
	json_t *v = json_object_get(n, "egressProxy");

	if (v && !json_is_null(v)) {
		snprintf(msg, cap, "egressProxy: an egress proxy is not supported by kiln");
		return -1;
	}
	v = json_object_get(n, "rules");
	if (v && !json_is_null(v) && (!json_is_object(v) || json_object_size(v))) {
		snprintf(msg, cap, "rules: per-domain transform rules are not supported by kiln");
		return -1;
	}
	return 0;
}

int e2b_network_update_parse(const char *body, size_t len, json_t **out, char *msg, size_t cap)
{
	json_error_t je;
	json_t *b;
	int r;

	*out = NULL;
	if (len > API_SESSION_BODY_MAX) {
		snprintf(msg, cap, "the body is larger than %d bytes", API_SESSION_BODY_MAX);
		return -1;
	}
	if (!body || !len) {
		b = json_object();
	} else if (spec_json_nodes(body, len, SPEC_MAX_JSON_NODES) > SPEC_MAX_JSON_NODES) {
		snprintf(msg, cap, "the body has too many JSON values");
		return -1;
	} else {
		b = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
		if (!json_is_object(b)) {
			snprintf(msg, cap, "the body is not a JSON object%s%.160s", b ? "" : ": ", b ? "" : je.text);
			json_decref(b);
			return -1;
		}
	}
	if (!b) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	r = e2b_network_unsupported(b, msg, cap);
	if (r == 0)
		r = e2b_network_map(json_object_get(b, "allow_internet_access"), json_object_get(b, "allowOut"),
				    json_object_get(b, "denyOut"), out, msg, cap);
	json_decref(b);
	return r;
}

json_t *e2b_network_info(json_t *network)
{
	json_t *allow = json_array(), *v;
	size_t i;

	json_array_foreach(json_object_get(network, "allow"), i, v) {
		const char *s = json_string_value(v);
		size_t n = s ? strlen(s) : 0, p = strlen(E2B_ALL_PORTS);

		if (!s)
			continue;
		/* A rule on every port is E2B's entry; others keep their port. */
		if (n > p && !strcmp(s + n - p, E2B_ALL_PORTS))
			json_array_append_new(allow, json_stringn(s, n - p));
		else
			json_array_append_new(allow, json_string(s));
	}
	return json_pack("{s:o, s:[s]}", "allowOut", allow, "denyOut", E2B_ALL_TRAFFIC);
}

/* msg (cap bytes) with pfx in front of it. */
static void msg_prefix(char *msg, size_t cap, const char *pfx)
{
	char tmp[1024];

	snprintf(tmp, sizeof(tmp), "%s%s", pfx, msg);
	snprintf(msg, cap, "%s", tmp);
}

void e2b_create_free(struct e2b_create *c)
{
	json_decref(c->native);
	free(c->env_json);
	memset(c, 0, sizeof(*c));
}

int e2b_create_parse(const char *body, size_t len, int allow_egress, struct e2b_create *out, char *msg, size_t cap)
{
	json_t *b = NULL, *v, *n;
	json_error_t je;

	memset(out, 0, sizeof(*out));
	snprintf(out->template, sizeof(out->template), "base");
	if (len > API_SESSION_BODY_MAX) {
		snprintf(msg, cap, "the body is larger than %d bytes", API_SESSION_BODY_MAX);
		return -1;
	}
	/* An empty body is {} (the SDK sends one with every field absent). */
	if (!body || !len) {
		b = json_object();
	} else if (spec_json_nodes(body, len, SPEC_MAX_JSON_NODES) > SPEC_MAX_JSON_NODES) {
		snprintf(msg, cap, "the body has too many JSON values");
	} else {
		/* (json_is_object evaluates its argument twice: not around the load.) */
		b = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
		if (!json_is_object(b))
			snprintf(msg, cap, "the body is not a JSON object%s%.160s", b ? "" : ": ", b ? "" : je.text);
	}
	if (!json_is_object(b)) {
		json_decref(b);
		return -1;
	}
	n = out->native = json_object();
	if (!n)
		goto oom;
	v = json_object_get(b, "templateID");
	if (v && !json_is_null(v)) {
		if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) > SPEC_MAX_TEMPLATE_NAME) {
			snprintf(msg, cap, "templateID: a template name of 1 to %d characters", SPEC_MAX_TEMPLATE_NAME);
			goto fail;
		}
		snprintf(out->template, sizeof(out->template), "%s", json_string_value(v));
		/* base (E2B's default) and default are kiln's default template;
		 * so is mcp-gateway, the SDK's template for `mcp` (whose
		 * gateway kiln's images do not have: below); code-interpreter-v1
		 * (the Code Interpreter SDK's default) is the built-in
		 * code-interpreter. */
		/* A snapshot's id (Sandbox.create(snapshotId) sends it as the
		 * templateID): a sandbox started from that snapshot. */
		if (strlen(out->template) == 29 && !strncmp(out->template, "snap_", 5) &&
		    strspn(out->template + 5, "0123456789abcdef") == 24)
			json_object_set(n, "snapshot", v);
		else if (!strcmp(out->template, "code-interpreter-v1"))
			json_object_set_new(n, "template", json_string("code-interpreter"));
		else if (strcmp(out->template, "base") && strcmp(out->template, "default") &&
			 strcmp(out->template, "mcp-gateway"))
			json_object_set(n, "template", v);
	}
	out->timeout_s = e2b_timeout_of(b, E2B_DEFAULT_TIMEOUT_S);
	if (out->timeout_s < 0) {
		snprintf(msg, cap, "timeout: an integer from 0 to %d (seconds)", E2B_MAX_TIMEOUT_S);
		goto fail;
	}
	/* The timeout ends it whatever its activity: the lifetime, and an idle
	 * limit as long (which therefore never ends it first). */
	json_object_set_new(n, "idle_timeout_s", json_integer(out->timeout_s));
	json_object_set_new(n, "max_lifetime_s", json_integer(out->timeout_s));
	v = json_object_get(b, "autoPause");
	if (v && !json_is_null(v) && !json_is_boolean(v)) {
		snprintf(msg, cap, "autoPause: must be a boolean");
		goto fail;
	}
	/* E2B's default at the timeout is to kill the sandbox. */
	out->auto_pause = json_is_true(v);
	/* autoResume: {"enabled": bool} (the SDK allows it only with autoPause). */
	v = json_object_get(b, "autoResume");
	if (v && !json_is_null(v)) {
		json_t *en = json_object_get(v, "enabled");

		if (!json_is_object(v) || (en && !json_is_null(en) && !json_is_boolean(en))) {
			snprintf(msg, cap, "autoResume: expected {\"enabled\": true|false}");
			goto fail;
		}
		out->auto_resume = json_is_true(en);
		if (out->auto_resume && !out->auto_pause) {
			snprintf(msg, cap, "autoResume: needs autoPause (a sandbox that is killed at its timeout cannot resume)");
			goto fail;
		}
	}
	/* network.allowPublicTraffic (default true): false makes its ports need
	 * the trafficAccessToken create returns. */
	v = json_object_get(b, "network");
	if (v && !json_is_null(v)) {
		json_t *pub = json_object_get(v, "allowPublicTraffic");

		if (!json_is_object(v) || (pub && !json_is_null(pub) && !json_is_boolean(pub))) {
			snprintf(msg, cap, "network.allowPublicTraffic: must be a boolean");
			goto fail;
		}
		out->private_traffic = json_is_false(pub);
		if (e2b_network_unsupported(v, msg, cap) < 0) {
			msg_prefix(msg, cap, "network.");
			goto fail;
		}
	}
	v = json_object_get(b, "metadata");
	if (v && !json_is_null(v)) {
		const char *bad = string_map_bad(v, E2B_MAX_METADATA);

		if (bad) {
			snprintf(msg, cap, "metadata: %s", bad);
			goto fail;
		}
		json_object_set(n, "metadata", v);
	}
	/* Internet access and network.allowOut / denyOut are kiln's network
	 * egress (docs/e2b.md, "What create's other fields become"), which the
	 * account must allow. None of them said is kiln's default (no network
	 * device: hosts without egress take it); so is nothing allowed. */
	v = json_object_get(b, "allow_internet_access");
	if (v && !json_is_null(v) && !json_is_boolean(v)) {
		snprintf(msg, cap, "allow_internet_access: must be a boolean");
		goto fail;
	}
	{
		json_t *net = json_object_get(b, "network"), *ao = json_object_get(net, "allowOut");
		json_t *dn = json_object_get(net, "denyOut"), *kn = NULL;

		if ((json_is_boolean(v) || (ao && !json_is_null(ao)) || (dn && !json_is_null(dn))) &&
		    e2b_network_map(v, ao, dn, &kn, msg, cap) < 0) {
			if (strncmp(msg, "allow_internet_access", 21))
				msg_prefix(msg, cap, "network.");
			goto fail;
		}
		if (kn && json_array_size(json_object_get(kn, "allow"))) {
			if (!allow_egress) {
				json_decref(kn);
				snprintf(msg, cap, "%s: network egress is not allowed for your account",
					 json_is_true(v) ? "allow_internet_access" : "network.allowOut");
				goto fail;
			}
			json_object_set_new(n, "network", kn);
		} else {
			json_decref(kn);
		}
	}
	/* mcp: the SDK itself then runs `mcp-gateway --config ...` in the
	 * sandbox; kiln's images have only a stand-in that says MCP gateways
	 * are not supported and fails, so the SDK raises its own "Failed to
	 * start MCP gateway: ..." and kills the sandbox, as with E2B when a
	 * gateway cannot start (image/mcp-gateway). */
	v = json_object_get(b, "mcp");
	if (v && !json_is_null(v) && !json_is_object(v)) {
		snprintf(msg, cap, "mcp: must be an object (MCP server configurations)");
		goto fail;
	}
	/* volumeMounts [{name, path}]: read-write mounts of the customer's
	 * volumes by name, kiln's "volumes" (checked by its parser next). */
	v = json_object_get(b, "volumeMounts");
	if (v && !json_is_null(v)) {
		json_t *vols = json_array(), *e;
		size_t i;

		if (!json_is_array(v) || !vols) {
			json_decref(vols);
			snprintf(msg, cap, "volumeMounts: expected an array of {\"name\", \"path\"}");
			goto fail;
		}
		json_array_foreach(v, i, e) {
			json_t *name = json_object_get(e, "name"), *path = json_object_get(e, "path");

			if (!json_is_string(name) || !json_is_string(path)) {
				json_decref(vols);
				snprintf(msg, cap, "volumeMounts[%zu]: expected {\"name\", \"path\"} (strings)", i);
				goto fail;
			}
			json_array_append_new(vols, json_pack("{s:O, s:O}", "name", name, "path", path));
		}
		if (json_array_size(vols))
			json_object_set_new(n, "volumes", vols);
		else
			json_decref(vols);
	}
	if (env_of(b, &out->env_json, msg, cap) < 0)
		goto fail;
	json_decref(b);
	return 0;
oom:
	snprintf(msg, cap, "out of memory");
fail:
	json_decref(b);
	e2b_create_free(out);
	return -1;
}

int e2b_url_decode(const char *s, size_t n, int plus, char *out, size_t cap)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		int ch = (unsigned char)s[i];

		if (ch == '%') {
			unsigned v;

			if (i + 2 >= n || !isxdigit((unsigned char)s[i + 1]) || !isxdigit((unsigned char)s[i + 2]) ||
			    sscanf(s + i + 1, "%2x", &v) != 1)
				return -1;
			ch = (int)v;
			i += 2;
		} else if (ch == '+' && plus) {
			ch = ' ';
		}
		/* A NUL decoded would cut the value short: refused. */
		if (!ch || o + 1 >= cap)
			return -1;
		out[o++] = (char)ch;
	}
	if (o >= cap)
		return -1;
	out[o] = '\0';
	return 0;
}

json_t *e2b_metadata_filter(const char *q)
{
	json_t *m = json_object();
	const char *p = q;

	while (m && *p) {
		size_t k = strcspn(p, "&");
		const char *eq = memchr(p, '=', k);
		char a[512], b[512], key[512], val[512];

		/* The form's encoding, then encodeURIComponent's. */
		if (!eq || e2b_url_decode(p, (size_t)(eq - p), 1, a, sizeof(a)) < 0 ||
		    e2b_url_decode(eq + 1, k - (size_t)(eq + 1 - p), 1, b, sizeof(b)) < 0 ||
		    e2b_url_decode(a, strlen(a), 0, key, sizeof(key)) < 0 ||
		    e2b_url_decode(b, strlen(b), 0, val, sizeof(val)) < 0 || !key[0] ||
		    json_object_size(m) >= E2B_MAX_METADATA) {
			json_decref(m);
			return NULL;
		}
		json_object_set_new(m, key, json_string(val));
		p += k;
		if (*p == '&')
			p++;
	}
	return m;
}
