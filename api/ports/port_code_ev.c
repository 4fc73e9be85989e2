/* port_code_ev: the code interpreter's answer to POST /execute, one JSON
 * event a line (guest/interpreter.py), read into kiln's result model
 * (docs/api.md "Code"): each line is checked and normalised into one event
 * (stdout, stderr, result, error, execution_count, end) handed to the
 * caller as it ends, and, for an answer returned whole, kept in the model
 * {results, logs{stdout,stderr}, error, execution_count}. The lines come
 * from the sandbox and are not trusted: a line is held up to line_max bytes,
 * the model up to held_max, and a line that is not one of the known events
 * is skipped. Also the check of POST /code's body (ports_code_request) and
 * of a context id. Pure: no I/O. */
#include "ports_int.h"

#include <errno.h>
#include <string.h>

#include "err.h"

void code_exec_init(struct code_exec *x, size_t held_max, size_t line_max)
{
	memset(x, 0, sizeof(*x));
	buf_init(&x->line, line_max);
	x->held_max = held_max;
	x->count = -1;
	if (held_max) {
		x->results = json_array();
		x->out = json_array();
		x->err = json_array();
	}
}

void code_exec_free(struct code_exec *x)
{
	buf_free(&x->line);
	json_decref(x->results);
	json_decref(x->out);
	json_decref(x->err);
	json_decref(x->error);
	x->results = x->out = x->err = x->error = NULL;
}

static const char *str_or(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s ? s : "";
}

/* One line: 0 (handled or skipped), or fn's negative return, or -E2BIG. */
static int take_line(struct code_exec *x, const char *p, size_t n, code_ev_fn fn, void *cls)
{
	json_t *j, *ev = NULL;
	const char *type, *name = NULL;
	int rc = 0;

	if (x->ended)
		return 0; /* nothing belongs to this cell after its end */
	while (n && (p[n - 1] == '\r' || p[n - 1] == ' '))
		n--;
	if (!n)
		return 0;
	j = json_loadb(p, n, 0, NULL);
	type = json_string_value(json_object_get(j, "type"));
	if (!json_is_object(j) || !type) {
		x->skipped++;
		json_decref(j);
		return 0;
	}
	if (!strcmp(type, "stdout") || !strcmp(type, "stderr")) {
		const char *t = json_string_value(json_object_get(j, "text"));

		if (t) {
			/* Not type itself: it is j's, freed below. */
			name = type[3] == 'o' ? "stdout" : "stderr";
			ev = json_pack("{s:s}", "text", t);
		}
	} else if (!strcmp(type, "result")) {
		json_t *v = json_object_get(j, "is_main_result");

		name = "result";
		ev = json_deep_copy(j);
		json_object_del(ev, "type");
		/* Always present, and a boolean. */
		json_object_set_new(ev, "is_main_result", json_boolean(json_is_true(v)));
	} else if (!strcmp(type, "error")) {
		name = "error";
		ev = json_pack("{s:s, s:s, s:s}", "name", str_or(j, "name"), "value", str_or(j, "value"), "traceback",
			       str_or(j, "traceback"));
	} else if (!strcmp(type, "number_of_executions")) {
		json_t *c = json_object_get(j, "execution_count");

		if (json_is_integer(c) && json_integer_value(c) >= 0) {
			name = "execution_count";
			x->count = json_integer_value(c);
			ev = json_pack("{s:I}", "execution_count", (json_int_t)x->count);
		}
	} else if (!strcmp(type, "end_of_execution")) {
		x->ended = 1;
		name = "end";
		ev = json_object();
	}
	json_decref(j);
	if (!name || !ev) {
		x->skipped++;
		json_decref(ev);
		return 0;
	}
	x->events++;
	if (x->held_max && strcmp(name, "end") && strcmp(name, "execution_count")) {
		if (x->held + n > x->held_max) {
			json_decref(ev);
			x->too_big = 1;
			return -E2BIG;
		}
		x->held += n;
		if (!strcmp(name, "stdout"))
			json_array_append(x->out, json_object_get(ev, "text"));
		else if (!strcmp(name, "stderr"))
			json_array_append(x->err, json_object_get(ev, "text"));
		else if (!strcmp(name, "result"))
			json_array_append(x->results, ev);
		else if (!strcmp(name, "error")) {
			json_decref(x->error);
			x->error = json_incref(ev);
		}
	}
	if (fn)
		rc = fn(cls, name, ev);
	json_decref(ev);
	return rc;
}

int code_exec_feed(struct code_exec *x, const char *p, size_t n, code_ev_fn fn, void *cls)
{
	while (n) {
		const char *nl = memchr(p, '\n', n);
		size_t k = nl ? (size_t)(nl - p) : n;
		int rc;

		if (x->too_big)
			return -E2BIG;
		if (!nl) {
			if (buf_add(&x->line, p, k) < 0) {
				x->too_big = 1;
				return -E2BIG;
			}
			return 0;
		}
		if (x->line.len) {
			if (buf_add(&x->line, p, k) < 0) {
				x->too_big = 1;
				return -E2BIG;
			}
			rc = take_line(x, x->line.p, x->line.len, fn, cls);
			buf_reset(&x->line);
		} else if (k > x->line.max && x->line.max) {
			x->too_big = 1;
			return -E2BIG;
		} else {
			rc = take_line(x, p, k, fn, cls);
		}
		if (rc < 0)
			return rc;
		p += k + 1;
		n -= k + 1;
	}
	return 0;
}

json_t *code_exec_result(const struct code_exec *x)
{
	json_t *out = x->out ? json_incref(x->out) : json_array();
	json_t *err = x->err ? json_incref(x->err) : json_array();

	return json_pack("{s:o, s:{s:o, s:o}, s:O, s:o}", "results", x->results ? json_incref(x->results) : json_array(),
			 "logs", "stdout", out, "stderr", err, "error", x->error ? x->error : json_null(),
			 "execution_count", x->count >= 0 ? json_integer(x->count) : json_null());
}

/* ---- the request ---- */

/* A context id as a path segment: what the interpreter makes (UUIDs) and
 * nothing that could change the path it is put in. */
int code_cid_ok(const char *s, size_t n)
{
	if (!n || n > CODE_ID_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '-' || s[i] == '_' || (s[i] == '.' && i > 0)))
			return 0;
	return 1;
}

static int env_name_ok(const char *k)
{
	if (!k[0] || strlen(k) > 256 || (k[0] >= '0' && k[0] <= '9'))
		return 0;
	for (; *k; k++)
		if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') || *k == '_'))
			return 0;
	return 1;
}

/* The body of POST /code into the interpreter's request (a new string) and
 * the cell's timeout: NULL with err when it is not one. */
char *ports_code_request(const char *body, size_t len, unsigned *timeout_ms, struct kiln_err *err)
{
	json_error_t jerr;
	json_t *in = json_loadb(body ? body : "", len, 0, &jerr);
	json_t *code, *lang, *cid, *env, *tmo, *o;
	const char *k;
	json_t *v;
	char *s;

	*timeout_ms = CODE_DEFAULT_TIMEOUT_MS;
	if (!json_is_object(in)) {
		json_decref(in);
		kiln_err_set(err, KERR_INVALID_JSON, "the body is not a JSON object");
		return NULL;
	}
	code = json_object_get(in, "code");
	lang = json_object_get(in, "language");
	cid = json_object_get(in, "context_id");
	env = json_object_get(in, "env_vars");
	tmo = json_object_get(in, "timeout_ms");
	if (json_is_null(lang))
		lang = NULL;
	if (json_is_null(cid))
		cid = NULL;
	if (json_is_null(env))
		env = NULL;
	if (json_is_null(tmo))
		tmo = NULL;
	if (!json_is_string(code)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "code: a string is required");
		goto bad;
	}
	if (lang && (!json_is_string(lang) || json_string_length(lang) > 32 || !json_string_length(lang))) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "language: a string (python, bash)");
		goto bad;
	}
	if (cid && (!json_is_string(cid) || !code_cid_ok(json_string_value(cid), json_string_length(cid)))) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "context_id: a context's id");
		goto bad;
	}
	if (lang && cid) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "give context_id or language, not both (a context has its language)");
		goto bad;
	}
	if (env && !json_is_object(env)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "env_vars: an object of variable names to strings");
		goto bad;
	}
	json_object_foreach(env, k, v)
		if (!env_name_ok(k) || !json_is_string(v)) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "env_vars: %.64s: a variable name ([A-Za-z_][A-Za-z0-9_]*) "
				     "with a string value", k);
			goto bad;
		}
	if (tmo && (!json_is_integer(tmo) || json_integer_value(tmo) < 1 ||
		    json_integer_value(tmo) > CODE_MAX_TIMEOUT_MS)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "timeout_ms: an integer from 1 to %u", CODE_MAX_TIMEOUT_MS);
		goto bad;
	}
	if (tmo)
		*timeout_ms = (unsigned)json_integer_value(tmo);
	o = json_pack("{s:O}", "code", code);
	if (o && lang)
		json_object_set(o, "language", lang);
	if (o && cid)
		json_object_set(o, "context_id", cid);
	if (o && env)
		json_object_set(o, "env_vars", env);
	s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	json_decref(in);
	if (!s)
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
	return s;
bad:
	json_decref(in);
	return NULL;
}

