/* port_code_ev: the code interpreter's answer to POST /execute, one JSON
 * event a line (guest/interpreter.py), read into kiln's result model
 * (docs/api.md "Code"): each line is checked and normalised into one event
 * (stdout, stderr, result, error, execution_count, end) handed to the
 * caller as it ends, and, for an answer returned whole, kept in the model
 * {results, logs{stdout,stderr}, error, execution_count}. The lines come
 * from the sandbox and are not trusted: a line is held up to line_max bytes,
 * the model up to held_max, and a line that is not one of the known events
 * is skipped. Pure: no I/O. */
#include "ports_int.h"

#include <errno.h>
#include <string.h>

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
