/* recipe: parse and validate a template recipe (docs/templates.md). The
 * files and env take the task spec's shapes and rules (lib/spec_json.h),
 * with the recipe's own, tighter, limits on top. */
#include "recipe.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proto.h"
#include "spec.h"
#include "spec_json.h"

static const char *const recipe_keys[] = { "name", "from", "packages", "files", "run", "preload", "env", "workdir",
					   NULL };

static int nomem(struct kiln_err *err)
{
	return kiln_err_set(err, KERR_INTERNAL, "out of memory while parsing the recipe");
}

/* A Debian package name (policy 5.6.1): [a-z0-9][a-z0-9+.-]+. */
static int package_ok(const char *s, size_t n)
{
	size_t i;

	if (n < 2 || n > RECIPE_MAX_PACKAGE || !(islower((unsigned char)s[0]) || isdigit((unsigned char)s[0])))
		return 0;
	for (i = 1; i < n; i++)
		if (!islower((unsigned char)s[i]) && !isdigit((unsigned char)s[i]) && !strchr("+.-", s[i]))
			return 0;
	return 1;
}

/* A dotted Python module name: identifiers of [A-Za-z_][A-Za-z0-9_]*. */
static int module_ok(const char *s, size_t n)
{
	size_t i;
	int start = 1;

	if (n == 0 || n > RECIPE_MAX_MODULE)
		return 0;
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '.') {
			if (start)
				return 0;
			start = 1;
		} else if (isalpha(c) || c == '_' || (!start && isdigit(c))) {
			start = 0;
		} else {
			return 0;
		}
	}
	return !start;
}

enum strings_kind { PACKAGES, RUN, PRELOAD };

/* An optional array of strings into *out (NULL-terminated, *n entries). */
static int parse_strings(json_t *j, const char *key, enum strings_kind kind, size_t max, char ***out, size_t *n,
			 struct kiln_err *err)
{
	char path[32];
	size_t i, cnt;

	*n = 0;
	*out = calloc(j && json_is_array(j) ? json_array_size(j) + 1 : 1, sizeof(**out));
	if (!*out)
		return nomem(err);
	if (!j)
		return 0;
	if (!json_is_array(j))
		return spec_json_fail(err, key, "must be an array of strings (got %s)", spec_json_kind(j));
	cnt = json_array_size(j);
	if (cnt > max)
		return spec_json_fail(err, key, "must have at most %zu entries (got %zu)", max, cnt);
	for (i = 0; i < cnt; i++) {
		const char *s;
		size_t len;

		snprintf(path, sizeof(path), "%s[%zu]", key, i);
		if (spec_json_str(json_array_get(j, i), path, &s, &len, err))
			return -1;
		switch (kind) {
		case PACKAGES:
			if (!package_ok(s, len))
				return spec_json_fail(err, path,
						      "must be a Debian package name: 2-%d characters of a-z, 0-9, '+', "
						      "'.' and '-', starting with a letter or digit",
						      RECIPE_MAX_PACKAGE);
			break;
		case RUN:
			if (len == 0 || len > RECIPE_MAX_RUN_BYTES)
				return spec_json_fail(err, path, "must be a shell command of 1 to %u bytes (got %zu)",
						      RECIPE_MAX_RUN_BYTES, len);
			break;
		case PRELOAD:
			if (!module_ok(s, len))
				return spec_json_fail(err, path,
						      "must be a Python module name (identifiers joined by '.', at most %d "
						      "bytes)",
						      RECIPE_MAX_MODULE);
			break;
		}
		(*out)[i] = strndup(s, len);
		if (!(*out)[i])
			return nomem(err);
		(*n)++;
	}
	return 0;
}

static void free_strings(char **v, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static int parse_doc(json_t *root, struct recipe *out, struct kiln_err *err)
{
	struct task_spec fe = { 0 };
	json_t *j;
	const char *s;
	size_t n, i, total;
	int r = -1;

	if (spec_json_keys(root, "recipe", recipe_keys, err))
		return -1;
	j = json_object_get(root, "name");
	if (!j)
		return spec_json_fail(err, "name", "is required");
	if (spec_json_str(j, "name", &s, &n, err) || spec_template_name_check(s, "name", err))
		return -1;
	memcpy(out->name, s, n + 1);
	j = json_object_get(root, "from");
	if (j) {
		if (spec_json_str(j, "from", &s, &n, err))
			return -1;
		if (strcmp(s, "debian"))
			return spec_json_fail(err, "from", "must be \"debian\" (the default template's Debian base)");
	}
	if (parse_strings(json_object_get(root, "packages"), "packages", PACKAGES, RECIPE_MAX_PACKAGES,
			  &out->packages, &out->npackages, err) ||
	    parse_strings(json_object_get(root, "run"), "run", RUN, RECIPE_MAX_RUN, &out->run, &out->nrun, err) ||
	    parse_strings(json_object_get(root, "preload"), "preload", PRELOAD, RECIPE_MAX_PRELOAD, &out->preload,
			  &out->npreload, err))
		return -1;
	for (i = 1; i < out->npackages; i++)
		for (n = 0; n < i; n++)
			if (!strcmp(out->packages[i], out->packages[n]))
				return spec_json_fail(err, "packages", "lists \"%s\" twice", out->packages[i]);

	/* Files and env: the spec's shapes and rules, the recipe's limits. */
	if (spec_json_files_env(json_object_get(root, "files"), json_object_get(root, "env"), &fe, err))
		goto out;
	if (fe.nfiles > RECIPE_MAX_FILES) {
		spec_json_fail(err, "files", "must have at most %d entries (got %zu)", RECIPE_MAX_FILES, fe.nfiles);
		goto out;
	}
	for (i = 0, total = 0; i < fe.nfiles; i++)
		total += fe.files[i].size;
	if (total > RECIPE_MAX_FILE_BYTES) {
		spec_json_fail(err, "files", "decoded files exceed %u bytes in total", RECIPE_MAX_FILE_BYTES);
		goto out;
	}
	if (fe.nenv > RECIPE_MAX_ENV) {
		spec_json_fail(err, "env", "must have at most %d entries (got %zu)", RECIPE_MAX_ENV, fe.nenv);
		goto out;
	}
	for (i = 0, total = 0; i < fe.nenv; i++)
		total += strlen(fe.env[i]) + 1;
	if (total > RECIPE_MAX_ENV_BYTES) {
		spec_json_fail(err, "env", "takes %zu bytes as NAME=value strings, more than %u", total,
			       RECIPE_MAX_ENV_BYTES);
		goto out;
	}
	if (fe.nfiles) {
		out->files = calloc(fe.nfiles, sizeof(*out->files));
		if (!out->files) {
			nomem(err);
			goto out;
		}
		for (i = 0; i < fe.nfiles; i++) {
			out->files[i].path = fe.files[i].path;
			out->files[i].data = fe.files[i].data;
			out->files[i].len = fe.files[i].size;
			out->files[i].mode = fe.files[i].mode;
			fe.files[i].path = NULL;
			fe.files[i].data = NULL;
		}
		out->nfiles = fe.nfiles;
	}
	out->env = fe.env;
	out->nenv = fe.nenv;
	fe.env = NULL;
	fe.nenv = 0;
	if (!out->env) {
		out->env = calloc(1, sizeof(*out->env));
		if (!out->env) {
			nomem(err);
			goto out;
		}
	}

	j = json_object_get(root, "workdir");
	if (j) {
		if (spec_json_str(j, "workdir", &s, &n, err))
			goto out;
		if (proto_abspath_ok(s)) {
			spec_json_fail(err, "workdir",
				       "must be an absolute path without '.' or '..' components (no empty components "
				       "or trailing '/', at most %d bytes)",
				       PROTO_MAX_PATH);
			goto out;
		}
		out->workdir = strndup(s, n);
		if (!out->workdir) {
			nomem(err);
			goto out;
		}
	}
	r = 0;
out:
	spec_free(&fe);
	return r;
}

int recipe_parse(const char *json, size_t len, struct recipe *out, struct kiln_err *err)
{
	json_t *root;
	int r;

	memset(out, 0, sizeof(*out));
	root = spec_json_load(json, len, RECIPE_MAX_JSON, "recipe", err);
	if (!root)
		return kiln_err_recode(err, KERR_INVALID_RECIPE);
	r = parse_doc(root, out, err);
	json_decref(root);
	if (r) {
		if (err->errc == KERR_INVALID_SPEC)
			kiln_err_recode(err, KERR_INVALID_RECIPE);
		recipe_free(out);
	}
	return r;
}

void recipe_free(struct recipe *r)
{
	size_t i;

	if (!r)
		return;
	free_strings(r->packages, r->npackages);
	free_strings(r->run, r->nrun);
	free_strings(r->preload, r->npreload);
	free_strings(r->env, r->nenv);
	for (i = 0; i < r->nfiles; i++) {
		free(r->files[i].path);
		free(r->files[i].data);
	}
	free(r->files);
	free(r->workdir);
	memset(r, 0, sizeof(*r));
}
