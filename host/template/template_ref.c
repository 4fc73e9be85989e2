/* template_ref: the template reference (TREF) kiln-api sends with tasks, sessions
 * and build results (docs/templates.md, "kiln-api -> kiln-host"): parsed
 * from hostile-ish JSON with every field bounded, and written back. */
#include "template_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "spec.h"

int template_ref_hex64_ok(const char *s)
{
	size_t i;

	for (i = 0; s[i]; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return i == 64;
}

static int template_ref_u32(json_t *v, const char *k, uint32_t *out, struct kiln_err *err)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0xfffffffeLL)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "template.%s: expected an integer 0..4294967294", k);
	*out = (uint32_t)json_integer_value(v);
	return 0;
}

static int template_ref_str(json_t *v, const char *k, char *out, size_t cap, struct kiln_err *err)
{
	size_t n;

	if (!json_is_string(v))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "template.%s: expected a string", k);
	n = json_string_length(v);
	if (n == 0 || n >= cap || memchr(json_string_value(v), '\0', n))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "template.%s: expected 1-%zu bytes", k, cap - 1);
	memcpy(out, json_string_value(v), n + 1);
	return 0;
}

static int template_ref_env(json_t *v, struct template_ref *out, struct kiln_err *err)
{
	size_t i;
	json_t *e;

	if (!json_is_array(v) || json_array_size(v) > TEMPLATE_REF_MAX_ENV)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "template.env: expected an array of at most %d strings",
				    TEMPLATE_REF_MAX_ENV);
	json_array_foreach(v, i, e) {
		const char *s = json_string_value(e);
		size_t n = json_string_length(e), k;

		if (!s || n == 0 || n > TEMPLATE_REF_MAX_ENV_LEN || memchr(s, '\0', n))
			return kiln_err_set(err, KERR_INVALID_REQUEST, "template.env[%zu]: expected \"NAME=VALUE\"", i);
		for (k = 0; k < n && s[k] != '='; k++)
			if (!(s[k] == '_' || (s[k] >= 'A' && s[k] <= 'Z') || (s[k] >= 'a' && s[k] <= 'z') ||
			      (k > 0 && s[k] >= '0' && s[k] <= '9')))
				break;
		if (k == 0 || k == n || s[k] != '=')
			return kiln_err_set(err, KERR_INVALID_REQUEST, "template.env[%zu]: expected \"NAME=VALUE\"", i);
	}
	out->env = json_incref(v);
	return 0;
}

int template_ref_parse_json(json_t *j, struct template_ref *out, struct kiln_err *err)
{
	const char *k;
	json_t *v;
	int have_size = 0, have_uid = 0, have_gid = 0;

	memset(out, 0, sizeof(*out));
	if (!json_is_object(j))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "template: expected an object");
	json_object_foreach(j, k, v) {
		if (!strcmp(k, "name")) {
			if (!json_is_string(v) || json_string_length(v) != strlen(json_string_value(v)) ||
			    spec_template_name_check(json_string_value(v), "template.name", err) < 0) {
				if (!json_is_string(v))
					kiln_err_set(err, KERR_INVALID_REQUEST, "template.name: expected a string");
				goto fail;
			}
			snprintf(out->name, sizeof(out->name), "%s", json_string_value(v));
		} else if (!strcmp(k, "builtin")) {
			if (!json_is_boolean(v)) {
				kiln_err_set(err, KERR_INVALID_REQUEST, "template.builtin: expected a boolean");
				goto fail;
			}
			out->builtin = json_is_true(v);
		} else if (!strcmp(k, "sha256")) {
			if (template_ref_str(v, k, out->sha256, sizeof(out->sha256), err) < 0)
				goto fail;
			if (!template_ref_hex64_ok(out->sha256)) {
				kiln_err_set(err, KERR_INVALID_REQUEST, "template.sha256: expected 64 lowercase hex digits");
				goto fail;
			}
		} else if (!strcmp(k, "size")) {
			if (!json_is_integer(v) || json_integer_value(v) < 1 ||
			    (uint64_t)json_integer_value(v) > TEMPLATE_REF_MAX_SIZE) {
				kiln_err_set(err, KERR_INVALID_REQUEST, "template.size: expected 1..%llu bytes",
					     (unsigned long long)TEMPLATE_REF_MAX_SIZE);
				goto fail;
			}
			out->size = (uint64_t)json_integer_value(v);
			have_size = 1;
		} else if (!strcmp(k, "s3_key")) {
			if (template_ref_str(v, k, out->s3_key, sizeof(out->s3_key), err) < 0)
				goto fail;
		} else if (!strcmp(k, "env")) {
			if (template_ref_env(v, out, err) < 0)
				goto fail;
		} else if (!strcmp(k, "workdir")) {
			if (template_ref_str(v, k, out->workdir, sizeof(out->workdir), err) < 0)
				goto fail;
			if (proto_abspath_ok(out->workdir) != 0) {
				kiln_err_set(err, KERR_INVALID_REQUEST, "template.workdir: expected an absolute path");
				goto fail;
			}
		} else if (!strcmp(k, "uid")) {
			if (template_ref_u32(v, k, &out->uid, err) < 0)
				goto fail;
			have_uid = 1;
		} else if (!strcmp(k, "gid")) {
			if (template_ref_u32(v, k, &out->gid, err) < 0)
				goto fail;
			have_gid = 1;
		} else {
			kiln_err_set(err, KERR_INVALID_REQUEST, "template.%.64s: unknown field", k);
			goto fail;
		}
	}
	if (!out->name[0]) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "template.name: required");
		goto fail;
	}
	if (have_uid != have_gid) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "template.%s: required with %s", have_uid ? "gid" : "uid",
			     have_uid ? "uid" : "gid");
		goto fail;
	}
	out->user_set = have_uid;
	if (out->builtin) {
		if (out->sha256[0] || out->s3_key[0] || have_size) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "template: a built-in has no %s",
				     out->sha256[0] ? "sha256" : out->s3_key[0] ? "s3_key" : "size");
			goto fail;
		}
		return 0;
	}
	if (!out->sha256[0] || !have_size || !out->s3_key[0]) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "template.%s: required (not a built-in)",
			     !out->sha256[0] ? "sha256" : !have_size ? "size" : "s3_key");
		goto fail;
	}
	{
		char want[128];

		snprintf(want, sizeof(want), TEMPLATE_REF_S3_PREFIX "%s.ext4", out->sha256);
		if (strcmp(want, out->s3_key)) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "template.s3_key: expected %s", want);
			goto fail;
		}
	}
	return 0;
fail:
	template_ref_free(out);
	return -1;
}

int template_ref_parse(const char *text, size_t len, struct template_ref *out, struct kiln_err *err)
{
	json_error_t je;
	json_t *j;
	int r;

	memset(out, 0, sizeof(*out));
	if (len > TEMPLATE_REF_MAX_JSON)
		return kiln_err_set(err, KERR_INVALID_REQUEST, "template: larger than %u bytes", TEMPLATE_REF_MAX_JSON);
	j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return kiln_err_set(err, KERR_INVALID_JSON, "template: line %d, column %d: %s", je.line, je.column, je.text);
	r = template_ref_parse_json(j, out, err);
	json_decref(j);
	return r;
}

json_t *template_ref_json(const struct template_ref *t)
{
	json_t *j = json_pack("{s:s}", "name", t->name);

	if (!j)
		return NULL;
	if (t->builtin) {
		json_object_set_new(j, "builtin", json_true());
	} else {
		json_object_set_new(j, "sha256", json_string(t->sha256));
		json_object_set_new(j, "size", json_integer((json_int_t)t->size));
		json_object_set_new(j, "s3_key", json_string(t->s3_key));
	}
	if (t->env)
		json_object_set(j, "env", t->env);
	if (t->workdir[0])
		json_object_set_new(j, "workdir", json_string(t->workdir));
	if (t->user_set) {
		json_object_set_new(j, "uid", json_integer(t->uid));
		json_object_set_new(j, "gid", json_integer(t->gid));
	}
	return j;
}

void template_ref_free(struct template_ref *t)
{
	json_decref(t->env);
	t->env = NULL;
}

void template_ref_builtin(struct template_ref *t, const char *name)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->builtin = 1;
}

