/* template_use: what tasks and sessions do with templates (see
 * templates.h): "template":NAME resolved to its row and TREF, the
 * template's env and workdir merged into a task's spec or a session's exec,
 * and the public built-in rows made from hosts' heartbeats. No thread, no
 * state: the store only. */
#include "templates_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"

/* ---- resolution (tasks and sessions) ---- */

int template_resolve(struct store *st, const char *customer, const char *name, struct template_use *u,
		     struct kiln_err *err)
{
	memset(u, 0, sizeof(*u));
	if (!name || !strcmp(name, "default"))
		return 0;
	if (store_template_find(st, customer, name, &u->row) < 0)
		return kiln_err_set(err, KERR_NOT_FOUND, "no template named %s", name);
	if (u->row.state != TEMPLATE_READY)
		return kiln_err_set(err, KERR_TEMPLATE_NOT_READY, "template %s is %s%s", name,
				    template_state_name(u->row.state),
				    u->row.state == TEMPLATE_FAILED ? " (see its build log; DELETE it and create it again)"
								    : ": wait until it is ready");
	if (!strcmp(u->row.kind, "builtin")) {
		json_t *j = json_pack("{s:s, s:b}", "name", u->row.name, "builtin", 1);

		u->template_ref = j ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
	} else {
		u->template_ref = store_template_ref(st, u->row.id);
	}
	if (!u->template_ref)
		return kiln_err_set(err, KERR_INTERNAL, "template %s has no image reference", name);
	u->use = (struct store_template_use){
		.template_id = u->row.id, .name = u->row.name, .sha256 = u->row.sha256[0] ? u->row.sha256 : NULL,
		.builtin = !strcmp(u->row.kind, "builtin"), .template_ref_json = u->template_ref,
	};
	return 1;
}

void template_use_free(struct template_use *u)
{
	free(u->template_ref);
	memset(u, 0, sizeof(*u));
}

char *template_merge_spec(const char *spec_json, size_t len, int cwd_set, const char *template_ref_json,
			  struct kiln_err *err)
{
	json_t *spec = json_loadb(spec_json, len, 0, NULL), *ref = json_loads(template_ref_json, 0, NULL), *env, *v;
	struct task_spec check;
	const char *workdir;
	char *out = NULL;
	size_t i;

	if (!json_is_object(spec) || !json_is_object(ref)) {
		kiln_err_set(err, KERR_INTERNAL, "cannot merge the template into the spec");
		goto out;
	}
	env = json_object_get(spec, "env");
	json_array_foreach(json_object_get(ref, "env"), i, v) {
		const char *kv = json_string_value(v), *eq = kv ? strchr(kv, '=') : NULL;
		char name[SPEC_MAX_ENV_KEY + 1];

		if (!eq || (size_t)(eq - kv) > SPEC_MAX_ENV_KEY || eq == kv)
			continue;
		memcpy(name, kv, (size_t)(eq - kv));
		name[eq - kv] = '\0';
		if (!env) {
			env = json_object();
			json_object_set_new(spec, "env", env);
		}
		if (!json_object_get(env, name)) /* the task's own value wins */
			json_object_set_new(env, name, json_string(eq + 1));
	}
	workdir = json_string_value(json_object_get(ref, "workdir"));
	if (!cwd_set && workdir && strcmp(workdir, SPEC_DEFAULT_CWD))
		json_object_set_new(spec, "cwd", json_string(workdir));
	out = json_dumps(spec, JSON_COMPACT);
	if (!out) {
		kiln_err_set(err, KERR_INTERNAL, "out of memory");
		goto out;
	}
	/* The merged env can pass the spec's bounds: check it all again. */
	if (spec_parse(out, strlen(out), &check, err) < 0) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, KERR_INVALID_SPEC, "with the template's env and workdir: %s", m);
		free(out);
		out = NULL;
		goto out;
	}
	spec_free(&check);
out:
	json_decref(spec);
	json_decref(ref);
	return out;
}

void template_merge_exec(json_t *body, const char *template_ref_json)
{
	json_t *ref = template_ref_json ? json_loads(template_ref_json, 0, NULL) : NULL, *env, *v;
	const char *workdir = json_string_value(json_object_get(ref, "workdir"));
	size_t i;

	if (!json_is_object(body) || !json_is_object(ref)) {
		json_decref(ref);
		return;
	}
	env = json_object_get(body, "env");
	json_array_foreach(json_object_get(ref, "env"), i, v) {
		const char *kv = json_string_value(v), *eq = kv ? strchr(kv, '=') : NULL;
		char name[SPEC_MAX_ENV_KEY + 1];

		if (!eq || eq == kv || (size_t)(eq - kv) > SPEC_MAX_ENV_KEY)
			continue;
		memcpy(name, kv, (size_t)(eq - kv));
		name[eq - kv] = '\0';
		if (!env) {
			env = json_object();
			json_object_set_new(body, "env", env);
		}
		if (!json_object_get(env, name))
			json_object_set_new(env, name, json_string(eq + 1));
	}
	if (workdir && !json_object_get(body, "cwd"))
		json_object_set_new(body, "cwd", json_string(workdir));
	json_decref(ref);
}

void templates_heartbeat(struct store *st, json_t *capacity)
{
	json_t *e;
	size_t i;

	json_array_foreach(json_object_get(capacity, "templates"), i, e) {
		const char *name = json_string_value(json_object_get(e, "name"));

		if (i >= 64)
			break;
		if (name && json_is_true(json_object_get(e, "builtin")) && spec_template_name_check(name, "name", NULL) == 0)
			store_template_builtin(st, name); /* a read when it exists: no write */
	}
}
