/* request: parsers for kiln-api's request bodies (see request.h). */
#include "request.h"

#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "store/store.h"

/* Printable ASCII only in messages: jansson may quote raw input. */
static void scrub(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			*s = '?';
}

/* Parse a body that must be one JSON object. Small bodies only (admin,
 * heartbeat): the caller bounds len. */
static json_t *load_object(const char *body, size_t len, struct kiln_err *err)
{
	json_error_t je;
	json_t *j;

	if (spec_json_nodes(body ? body : "", len, 1024) > 1024) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "body: too many JSON values");
		return NULL;
	}
	j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
	if (!j) {
		scrub(je.text);
		kiln_err_set(err, KERR_INVALID_JSON, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
		return NULL;
	}
	if (!json_is_object(j)) {
		json_decref(j);
		kiln_err_set(err, KERR_INVALID_REQUEST, "body: must be a JSON object");
		return NULL;
	}
	return j;
}

void api_task_request_free(struct api_task_request *r)
{
	if (!r)
		return;
	free(r->spec_json);
	json_decref(r->metadata);
	free(r->egress);
	memset(r, 0, sizeof(*r));
}

/* Check probe (the part of a request that follows the task spec's rules)
 * with spec_parse, messages and all: 0 and the parsed spec in *ts (free
 * with spec_free), or -1 with err set. probe NULL: out of memory. */
static int spec_probe(json_t *probe, struct task_spec *ts, struct kiln_err *err)
{
	char *text = probe ? json_dumps(probe, JSON_COMPACT) : NULL;
	int r;

	if (!text)
		return kiln_err_set(err, KERR_INTERNAL, "out of memory");
	r = spec_parse(text, strlen(text), ts, err);
	free(text);
	return r < 0 ? -1 : 0;
}

/* A request's "metadata" md (a task's, a session's): an object of at most
 * API_METADATA_MAX bytes as compact JSON. 0 and that text in *text (caller
 * frees), or -1 with err set. */
static int metadata_text(json_t *md, char **text, struct kiln_err *err)
{
	if (!json_is_object(md))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "metadata: must be an object");
	*text = json_dumps(md, JSON_COMPACT);
	if (!*text || strlen(*text) > API_METADATA_MAX) {
		free(*text);
		*text = NULL;
		return kiln_err_set(err, KERR_INVALID_REQUEST, "metadata: must be at most %d bytes as compact JSON",
				    API_METADATA_MAX);
	}
	return 0;
}

int api_task_request_parse(const char *body, size_t len, struct api_task_request *out, struct kiln_err *err)
{
	json_error_t je;
	json_t *root = NULL, *md, *net, *eg;
	char *md_text;

	memset(out, 0, sizeof(*out));
	if (!body)
		body = "";
	if (len > SPEC_MAX_JSON + API_METADATA_MAX)
		return kiln_err_set(err, KERR_INVALID_SPEC, "spec: must be at most %u bytes of JSON (got %zu)",
				    SPEC_MAX_JSON, len);
	/* jansson spends ~100 bytes per value: bound them before it runs, as
	 * spec_parse does (metadata counts too). */
	if (spec_json_nodes(body, len, SPEC_MAX_JSON_NODES) > SPEC_MAX_JSON_NODES)
		return kiln_err_set(err, KERR_INVALID_SPEC,
				    "spec: must have at most %d JSON arrays, objects and ',' separators outside strings",
				    SPEC_MAX_JSON_NODES);
	root = json_loadb(body, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
	if (!root) {
		scrub(je.text);
		return kiln_err_set(err, KERR_INVALID_JSON, "invalid JSON at line %d, column %d: %s", je.line, je.column,
				    je.text);
	}
	if (!json_is_object(root)) {
		json_decref(root);
		return kiln_err_set(err, KERR_INVALID_SPEC, "spec: must be a JSON object");
	}
	md = json_object_get(root, "metadata");
	if (md) {
		if (metadata_text(md, &md_text, err) < 0)
			goto fail;
		free(md_text);
		out->metadata = json_incref(md);
		json_object_del(root, "metadata");
	}
	net = json_object_get(root, "network");
	eg = json_is_object(net) ? json_object_get(net, "egress") : NULL;
	if (json_is_string(eg)) {
		out->egress = strndup(json_string_value(eg), 64);
		if (!out->egress)
			goto oom;
	}
	if (out->metadata) {
		/* Without metadata the body is the spec as sent; with it, the
		 * rest is written out again (same values, compact). */
		out->spec_json = json_dumps(root, JSON_COMPACT);
		if (!out->spec_json)
			goto oom;
		out->spec_len = strlen(out->spec_json);
	} else {
		out->spec_json = malloc(len + 1);
		if (!out->spec_json)
			goto oom;
		memcpy(out->spec_json, body, len);
		out->spec_json[len] = '\0';
		out->spec_len = len;
	}
	json_decref(root);
	return 0;
oom:
	kiln_err_set(err, KERR_INTERNAL, "out of memory");
fail:
	json_decref(root);
	api_task_request_free(out);
	return -1;
}

int api_id_ok(const char *id)
{
	size_t n = strlen(id);

	if (n < 1 || n > 64 || id[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
		      c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

static int check_keys(json_t *j, const char *const *allowed, struct kiln_err *err)
{
	const char *k;
	json_t *v;

	json_object_foreach(j, k, v) {
		const char *const *a = allowed;

		while (*a && strcmp(*a, k))
			a++;
		if (!*a) {
			char q[65];

			snprintf(q, sizeof(q), "%s", k);
			scrub(q);
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: unknown field", q);
		}
	}
	return 0;
}

int api_customer_request_parse(const char *body, size_t len, char *id, char *name, struct quota *q,
			       struct kiln_err *err)
{
	static const char *const keys[] = { "id", "name", "quotas", NULL };
	json_t *j = load_object(body, len, err), *v;
	struct quota nq = *q;
	int r = -1;

	if (!j)
		return -1;
	if (check_keys(j, keys, err))
		goto out;
	v = json_object_get(j, "id");
	if (!json_is_string(v) || !api_id_ok(json_string_value(v)) ||
	    strlen(json_string_value(v)) != json_string_length(v)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "id: required, 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
		goto out;
	}
	strcpy(id, json_string_value(v));
	v = json_object_get(j, "name");
	if (v) {
		const char *s = json_string_value(v);
		size_t n = json_string_length(v);

		if (!s || n < 1 || n > API_NAME_MAX || strlen(s) != n) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "name: must be a string of 1-%d bytes without NUL",
				     API_NAME_MAX);
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) {
				kiln_err_set(err, KERR_INVALID_REQUEST, "name: no control characters");
				goto out;
			}
		memcpy(name, s, n + 1);
	} else {
		strcpy(name, id);
	}
	v = json_object_get(j, "quotas");
	if (v && quota_from_json(v, "quotas", &nq, err) < 0)
		goto out;
	*q = nq;
	r = 0;
out:
	json_decref(j);
	return r;
}

int api_quota_request_parse(const char *body, size_t len, struct quota *q, struct kiln_err *err)
{
	json_t *j = load_object(body, len, err);
	int r;

	if (!j)
		return -1;
	r = quota_from_json(j, "", q, err);
	json_decref(j);
	return r;
}

int api_heartbeat_parse(const char *body, size_t len, char *url, json_t **capacity, struct kiln_err *err)
{
	static const char *const keys[] = { "url", "capacity", NULL };
	json_t *j = load_object(body, len, err), *v, *c;
	const char *s;
	size_t n;
	char *dump;

	*capacity = NULL;
	if (!j)
		return -1;
	if (check_keys(j, keys, err))
		goto fail;
	v = json_object_get(j, "url");
	s = json_string_value(v);
	n = s ? json_string_length(v) : 0;
	if (!s || n > API_URL_MAX || strlen(s) != n ||
	    (strncmp(s, "http://", 7) && strncmp(s, "https://", 8)) || n <= 8) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "url: required, an http:// or https:// URL of at most %d bytes",
			     API_URL_MAX);
		goto fail;
	}
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "url: no spaces, control or non-ASCII characters");
			goto fail;
		}
	c = json_object_get(j, "capacity");
	if (!json_is_object(c)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "capacity: required, an object (kiln-host's GET /v1/capacity)");
		goto fail;
	}
	dump = json_dumps(c, JSON_COMPACT);
	n = dump ? strlen(dump) : 0;
	free(dump);
	if (!n || n > API_CAPACITY_MAX) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "capacity: at most %d bytes", API_CAPACITY_MAX);
		goto fail;
	}
	memcpy(url, s, strlen(s) + 1);
	*capacity = json_incref(c);
	json_decref(j);
	return 0;
fail:
	json_decref(j);
	return -1;
}

/* ---- sessions ---- */

int api_volume_name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	return n >= 1 && n <= 63 &&
	       strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

int api_volume_path_ok(const char *p)
{
	/* kiln-host's rule, so that a refusal is a 400 here and not a host's
	 * invalid_spec after placement. */
	return spec_volume_path_ok(p);
}

/* "volumes": [{"name","path","read_only"?}] into out. 0 or -1 with err. */
static int volumes_parse(json_t *v, struct api_session_request *out, struct kiln_err *err)
{
	json_t *e;
	size_t i;

	if (!json_is_array(v))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "volumes: expected an array of {\"name\",\"path\",\"read_only\"?}");
	if (json_array_size(v) > API_SESSION_VOLUMES_MAX)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "volumes: a session mounts at most %d (got %zu)",
				    API_SESSION_VOLUMES_MAX, json_array_size(v));
	json_array_foreach(v, i, e) {
		struct api_volume_req *m = &out->volumes[i];
		const char *k, *name, *path;
		json_t *f, *ro;

		if (!json_is_object(e))
			return kiln_err_set(err, KERR_INVALID_REQUEST, "volumes[%zu]: expected an object", i);
		json_object_foreach(e, k, f)
			if (strcmp(k, "name") && strcmp(k, "path") && strcmp(k, "read_only")) {
				kiln_err_set(err, KERR_INVALID_REQUEST,
					     "volumes[%zu].%.64s: a volume mount has only \"name\", \"path\" and \"read_only\"",
					     i, k);
				scrub(err->message);
				return -1;
			}
		name = json_string_value(json_object_get(e, "name"));
		path = json_string_value(json_object_get(e, "path"));
		ro = json_object_get(e, "read_only");
		if (!name || strlen(name) != json_string_length(json_object_get(e, "name")) || !api_volume_name_ok(name))
			return kiln_err_set(err, KERR_INVALID_REQUEST,
					    "volumes[%zu].name: a volume's name (1-63 characters of A-Z, a-z, 0-9, '.', '_', '-')",
					    i);
		if (!path || strlen(path) != json_string_length(json_object_get(e, "path")) || !api_volume_path_ok(path))
			return kiln_err_set(err, KERR_INVALID_REQUEST,
					    "volumes[%zu].path: an absolute, normalised path of at most 255 characters (no"
					    " \"//\", \".\", \"..\" or trailing '/'), not \"/\" and not under /proc, /sys or /dev",
					    i);
		if (ro && !json_is_boolean(ro))
			return kiln_err_set(err, KERR_INVALID_REQUEST, "volumes[%zu].read_only: expected true or false", i);
		for (size_t j = 0; j < i; j++) {
			if (!strcmp(out->volumes[j].name, name))
				return kiln_err_set(err, KERR_INVALID_REQUEST, "volumes[%zu].name: volume %s is mounted twice",
						    i, name);
			if (spec_path_within(path, out->volumes[j].path) || spec_path_within(out->volumes[j].path, path))
				return kiln_err_set(err, KERR_INVALID_REQUEST,
						    "volumes[%zu].path: %s and %s: one volume would be mounted inside another",
						    i, path, out->volumes[j].path);
		}
		snprintf(m->name, sizeof(m->name), "%s", name);
		snprintf(m->path, sizeof(m->path), "%s", path);
		m->read_only = json_is_true(ro);
	}
	out->nvolumes = (unsigned)json_array_size(v);
	return 0;
}

void api_session_request_free(struct api_session_request *r)
{
	if (!r)
		return;
	free(r->spec_json);
	free(r->metadata_json);
	memset(r, 0, sizeof(*r));
}

/* An optional integer field in [1, max], default def. */
static int opt_uint(json_t *j, const char *key, unsigned max, unsigned def, unsigned *out, struct kiln_err *err)
{
	json_t *v = json_object_get(j, key);

	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > max)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: must be an integer from 1 to %u", key, max);
	*out = (unsigned)json_integer_value(v);
	return 0;
}

int api_session_request_parse(const char *body, size_t len, int allow_egress, struct api_session_request *out,
			      struct kiln_err *err)
{
	static const char *const keys[] = { "image", "limits", "network", "idle_timeout_s", "max_lifetime_s",
					    "metadata", "template", "snapshot", "volumes", NULL };
	static const char *const from_snapshot[] = { "image", "limits", "network", "template", "volumes", NULL };
	json_t *j, *v, *limits, *net, *probe = NULL, *spec = NULL;
	struct task_spec ts;
	int r = -1;

	memset(out, 0, sizeof(*out));
	if (len > API_SESSION_BODY_MAX)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "body: at most %d bytes", API_SESSION_BODY_MAX);
	/* Metadata may hold more values than load_object's bound for admin bodies. */
	if (spec_json_nodes(body ? body : "", len, SPEC_MAX_JSON_NODES) > SPEC_MAX_JSON_NODES)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "body: too many JSON values");
	{
		json_error_t je;

		j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
		if (!j) {
			scrub(je.text);
			return kiln_err_set(err, KERR_INVALID_JSON, "invalid JSON at line %d, column %d: %s", je.line,
					    je.column, je.text);
		}
		if (!json_is_object(j)) {
			json_decref(j);
			return kiln_err_set(err, KERR_INVALID_REQUEST, "body: must be a JSON object");
		}
	}
	if (check_keys(j, keys, err))
		goto out;
	v = json_object_get(j, "snapshot");
	if (v) {
		const char *k = json_string_value(v);

		/* "snap_" and 24 hex digits (store.h's STORE_SNAPSHOT_ID_LEN). */
		if (!k || json_string_length(v) != 29 || strncmp(k, "snap_", 5) ||
		    strspn(k + 5, "0123456789abcdef") != 24) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "snapshot: a snapshot id (\"snap_\" and 24 hex digits)");
			goto out;
		}
		for (const char *const *f = from_snapshot; *f; f++)
			if (json_object_get(j, *f)) {
				kiln_err_set(err, KERR_INVALID_REQUEST,
					     "%s: a session started from a snapshot has the snapshot's limits, network,"
					     " template and volumes: leave it out",
					     *f);
				goto out;
			}
		snprintf(out->snapshot, sizeof(out->snapshot), "%s", k);
		if (opt_uint(j, "idle_timeout_s", API_SESSION_MAX_IDLE_S, API_SESSION_DEFAULT_IDLE_S,
			     &out->idle_timeout_s, err) < 0 ||
		    opt_uint(j, "max_lifetime_s", API_SESSION_MAX_LIFETIME_S, API_SESSION_DEFAULT_LIFETIME_S,
			     &out->max_lifetime_s, err) < 0)
			goto out;
		v = json_object_get(j, "metadata");
		if (v && metadata_text(v, &out->metadata_json, err) < 0)
			goto out;
		r = 0;
		goto out;
	}
	v = json_object_get(j, "volumes");
	if (v && volumes_parse(v, out, err) < 0)
		goto out;
	v = json_object_get(j, "image");
	if (v && (!json_is_string(v) || strcmp(json_string_value(v), "default"))) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "image: only \"default\" exists");
		goto out;
	}
	v = json_object_get(j, "template");
	if (v) {
		if (!json_is_string(v)) {
			kiln_err_set(err, KERR_INVALID_SPEC, "template: must be a string");
			goto out;
		}
		if (spec_template_name_check(json_string_value(v), "template", err) < 0)
			goto out;
		snprintf(out->template_name, sizeof(out->template_name), "%s", json_string_value(v));
	}
	limits = json_object_get(j, "limits");
	if (limits && !json_is_object(limits)) {
		kiln_err_set(err, KERR_INVALID_SPEC, "limits: must be an object");
		goto out;
	}
	if (json_object_get(limits, "timeout_s")) {
		kiln_err_set(err, KERR_INVALID_SPEC,
			     "limits.timeout_s: a session has no timeout: use idle_timeout_s, max_lifetime_s and each "
			     "exec's timeout_s");
		goto out;
	}
	net = json_object_get(j, "network");
	v = json_is_object(net) ? json_object_get(net, "egress") : NULL;
	if (!allow_egress && json_is_string(v) && strcmp(json_string_value(v), "none")) {
		kiln_err_set(err, KERR_EGRESS_NOT_ALLOWED, "network.egress: network egress is not allowed for your account");
		goto out;
	}
	/* The limits and the network policy follow the task spec's rules: let
	 * its parser check them (and fill in the defaults), messages and all. */
	probe = json_pack("{s:[s]}", "argv", "true");
	if (limits)
		json_object_set(probe, "limits", limits);
	if (net)
		json_object_set(probe, "network", net);
	if (spec_probe(probe, &ts, err) < 0)
		goto out;
	out->vcpus = ts.vcpus;
	out->memory_mib = ts.memory_mib;
	out->output_mib = ts.output_mib;
	out->egress = ts.egress;
	spec_free(&ts);
	if (opt_uint(j, "idle_timeout_s", API_SESSION_MAX_IDLE_S, API_SESSION_DEFAULT_IDLE_S, &out->idle_timeout_s,
		     err) < 0 ||
	    opt_uint(j, "max_lifetime_s", API_SESSION_MAX_LIFETIME_S, API_SESSION_DEFAULT_LIFETIME_S,
		     &out->max_lifetime_s, err) < 0)
		goto out;
	v = json_object_get(j, "metadata");
	if (v && metadata_text(v, &out->metadata_json, err) < 0)
		goto out;
	spec = json_pack("{s:{s:i, s:i, s:i}, s:o}", "limits", "vcpus", (int)out->vcpus, "memory_mib",
			 (int)out->memory_mib, "output_mib", (int)out->output_mib, "network",
			 net ? json_incref(net) : json_pack("{s:s}", "egress", "none"));
	out->spec_json = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
	if (!out->spec_json) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		goto out;
	}
	r = 0;
out:
	if (r < 0)
		api_session_request_free(out);
	json_decref(probe);
	json_decref(spec);
	json_decref(j);
	return r;
}

/* Bytes that n characters of padded base64 decode to ('=' carries none). */
static size_t b64_decoded_len(const char *b, size_t n)
{
	return n / 4 * 3 - (n && b[n - 1] == '=') - (n > 1 && b[n - 2] == '=');
}

/* j's member key, when present, must be a string of padded standard
 * base64 that decodes to at most max bytes (the host decodes and checks it
 * again): 0, or -1 with err set (code c, the bound in MiB or else KiB). */
static int b64_field_check(json_t *j, const char *key, size_t max, enum kiln_errc c, struct kiln_err *err)
{
	json_t *v = json_object_get(j, key);
	const char *b = json_string_value(v);
	size_t n = json_string_length(v);
	int mib = max % (1u << 20) == 0;

	if (!v || (b && n % 4 == 0 && b64_decoded_len(b, n) <= max &&
		   strspn(b, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == n))
		return 0;
	kiln_err_set(err, c, "%s: expected padded standard base64 of at most %zu %s", key, mib ? max >> 20 : max >> 10,
		     mib ? "MiB" : "KiB");
	return -1;
}

/* A terminal size {"rows":N,"cols":N} (field names it in messages). */
static int tty_size_check(json_t *v, const char *field, struct kiln_err *err)
{
	json_t *rows = json_object_get(v, "rows"), *cols = json_object_get(v, "cols");

	if (!json_is_object(v) || json_object_size(v) != 2 || !json_is_integer(rows) || !json_is_integer(cols) ||
	    json_integer_value(rows) < 1 || json_integer_value(rows) > API_TTY_MAX || json_integer_value(cols) < 1 ||
	    json_integer_value(cols) > API_TTY_MAX)
		return kiln_err_set(err, KERR_INVALID_SPEC, "%s: expected {\"rows\":N,\"cols\":N}, each an integer from 1 to %d",
				    field, API_TTY_MAX);
	return 0;
}

/* "interactive" (a boolean) and "tty" (a size) of an exec, not with stdin_b64. */
static int tty_check(json_t *j, struct kiln_err *err)
{
	json_t *ia = json_object_get(j, "interactive"), *tty = json_object_get(j, "tty");

	if (ia && !json_is_boolean(ia))
		return kiln_err_set(err, KERR_INVALID_SPEC, "interactive: must be true or false");
	if (tty && !json_is_null(tty) && tty_size_check(tty, "tty", err) < 0)
		return -1;
	if ((json_is_true(ia) || json_is_object(tty)) && json_object_get(j, "stdin_b64"))
		return kiln_err_set(err, KERR_INVALID_SPEC,
				    "stdin_b64: not with an interactive command (send its input to .../input)");
	return 0;
}

int api_exec_request_parse(const char *body, size_t len, unsigned max_timeout_s, json_t **out,
			   struct kiln_err *err)
{
	static const char *const keys[] = { "argv",	 "language", "code", "env", "cwd", "timeout_s", "stdin_b64",
					    "interactive", "tty",      NULL };
	json_error_t je;
	json_t *j, *v, *probe = NULL;
	struct task_spec ts;
	unsigned timeout_s = SPEC_DEFAULT_TIMEOUT_S;
	int r = -1;

	*out = NULL;
	if (!body)
		body = "";
	if (len > SPEC_MAX_JSON)
		return kiln_err_set(err, KERR_INVALID_SPEC, "body: must be at most %u bytes of JSON", SPEC_MAX_JSON);
	if (spec_json_nodes(body, len, SPEC_MAX_JSON_NODES) > SPEC_MAX_JSON_NODES)
		return kiln_err_set(err, KERR_INVALID_SPEC,
				    "body: must have at most %d JSON arrays, objects and ',' separators outside strings",
				    SPEC_MAX_JSON_NODES);
	j = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
	if (!j) {
		scrub(je.text);
		return kiln_err_set(err, KERR_INVALID_JSON, "invalid JSON at line %d, column %d: %s", je.line, je.column,
				    je.text);
	}
	if (!json_is_object(j)) {
		kiln_err_set(err, KERR_INVALID_SPEC, "body: must be a JSON object");
		goto out;
	}
	if (check_keys(j, keys, err)) {
		kiln_err_recode(err, KERR_INVALID_SPEC);
		goto out;
	}
	v = json_object_get(j, "timeout_s");
	if (v) {
		if (!json_is_integer(v) || json_integer_value(v) < SPEC_MIN_TIMEOUT_S ||
		    json_integer_value(v) > SPEC_MAX_TIMEOUT_S) {
			kiln_err_set(err, KERR_INVALID_SPEC, "timeout_s: must be an integer from %d to %d", SPEC_MIN_TIMEOUT_S,
				     SPEC_MAX_TIMEOUT_S);
			goto out;
		}
		timeout_s = (unsigned)json_integer_value(v);
	}
	if (max_timeout_s && timeout_s > max_timeout_s) {
		kiln_err_set(err, KERR_OVER_QUOTA, "timeout_s: %u exceeds your quota of %u", timeout_s, max_timeout_s);
		goto out;
	}
	/* stdin_b64: kiln-host decodes and checks it; bounded here. */
	if (b64_field_check(j, "stdin_b64", API_EXEC_STDIN_MAX, KERR_INVALID_SPEC, err) < 0)
		goto out;
	if (tty_check(j, err) < 0)
		goto out;
	/* argv or language+code, env, cwd: the task spec's rules and messages. */
	probe = json_deep_copy(j);
	json_object_del(probe, "timeout_s");
	json_object_del(probe, "stdin_b64");
	json_object_del(probe, "interactive");
	json_object_del(probe, "tty");
	if (spec_probe(probe, &ts, err) < 0)
		goto out;
	spec_free(&ts);
	json_object_set_new(j, "timeout_s", json_integer(timeout_s));
	*out = j;
	j = NULL;
	r = 0;
out:
	json_decref(probe);
	json_decref(j);
	return r;
}

int api_input_request_parse(const char *body, size_t len, json_t **out, struct kiln_err *err)
{
	static const char *const keys[] = { "exec_id", "data_b64", "eof", "resize", NULL };
	json_t *j = load_object(body, len, err), *v;
	const char *s;

	*out = NULL;
	if (!j)
		return -1;
	if (check_keys(j, keys, err))
		goto bad;
	s = json_string_value(json_object_get(j, "exec_id"));
	if (!s || !*s || strlen(s) > 64 || strspn(s, "0123456789abcdef") != strlen(s)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "exec_id: expected the id from the exec's started event");
		goto bad;
	}
	if (b64_field_check(j, "data_b64", API_INPUT_MAX, KERR_INVALID_REQUEST, err) < 0)
		goto bad;
	v = json_object_get(j, "eof");
	if (v && !json_is_boolean(v)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "eof: must be true or false");
		goto bad;
	}
	v = json_object_get(j, "resize");
	if (v && tty_size_check(v, "resize", err) < 0) {
		kiln_err_recode(err, KERR_INVALID_REQUEST);
		goto bad;
	}
	*out = j;
	return 0;
bad:
	json_decref(j);
	return -1;
}

int api_guest_path_ok(const char *p)
{
	size_t n = p ? strlen(p) : 0;

	if (n < 1 || n > 4096 || p[0] != '/')
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
			return 0;
	return 1;
}
