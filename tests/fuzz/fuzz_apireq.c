/* fuzz_apireq: libFuzzer target for kiln-api's request-body parsers. The
 * first byte (& 7; 6 and 7 as 2 and 3) picks one: 0 POST /v1/tasks
 * (api_task_request_parse, then spec_parse on what it leaves, as the server
 * runs them), 1 POST /v1/admin/customers, 2 PUT .../quotas, 3 a host
 * heartbeat, 4 POST /v1/sessions, 5 POST /v1/sessions/{id}/exec. Checks that
 * metadata never reaches the spec, that accepted values are within their
 * bounds (a session's spec is one a host's spec_parse accepts; its volume
 * mounts have names and mount points kiln-host accepts), and that
 * every refusal says why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quota.h"
#include "request.h"
#include "spec.h"
#include "fuzz.h"

static void task_request(const char *body, size_t len)
{
	struct kiln_err err = { .code = "" };
	struct api_task_request r;
	struct task_spec spec;

	if (api_task_request_parse(body, len, &r, &err) < 0) {
		check(err.code[0] && err.message[0]);
		check(!r.spec_json && !r.metadata && !r.egress);
		return;
	}
	check(r.spec_json && strlen(r.spec_json) <= r.spec_len);
	if (r.metadata) {
		char *m = json_dumps(r.metadata, JSON_COMPACT);
		json_t *again = json_loadb(r.spec_json, r.spec_len, JSON_ALLOW_NUL, NULL);

		check(json_is_object(r.metadata) && m && strlen(m) <= API_METADATA_MAX);
		/* What spec_parse sees has no metadata any more. */
		check(again && !json_object_get(again, "metadata"));
		json_decref(again);
		free(m);
	}
	if (spec_parse(r.spec_json, r.spec_len, &spec, &err) == 0) {
		check(spec.vcpus >= SPEC_MIN_VCPUS && spec.vcpus <= SPEC_MAX_VCPUS);
		check(spec.memory_mib >= SPEC_MIN_MEMORY_MIB && spec.memory_mib <= SPEC_MAX_MEMORY_MIB);
		spec_free(&spec);
	} else {
		check(err.message[0]);
	}
	api_task_request_free(&r);
}

static void session_request(const char *body, size_t len, int allow_egress)
{
	struct kiln_err err = { .code = "" };
	struct api_session_request r;
	struct task_spec spec;
	json_t *sp, *probe;
	char *text;

	if (api_session_request_parse(body, len, allow_egress, &r, &err) < 0) {
		check(err.code[0] && err.message[0]);
		check(!r.spec_json && !r.metadata_json);
		return;
	}
	if (r.snapshot[0]) {
		/* From a snapshot: its id's form, none of what the snapshot decides. */
		check(strlen(r.snapshot) == 29 && !strncmp(r.snapshot, "snap_", 5) &&
		      strspn(r.snapshot + 5, "0123456789abcdef") == 24);
		check(!r.spec_json && !r.vcpus && !r.memory_mib && !r.egress && !r.template_name[0] && !r.nvolumes);
		check(r.idle_timeout_s >= 1 && r.idle_timeout_s <= API_SESSION_MAX_IDLE_S);
		check(r.max_lifetime_s >= 1 && r.max_lifetime_s <= API_SESSION_MAX_LIFETIME_S);
		check(!r.metadata_json || strlen(r.metadata_json) <= API_METADATA_MAX);
		api_session_request_free(&r);
		return;
	}
	check(r.vcpus >= SPEC_MIN_VCPUS && r.vcpus <= SPEC_MAX_VCPUS);
	check(r.memory_mib >= SPEC_MIN_MEMORY_MIB && r.memory_mib <= SPEC_MAX_MEMORY_MIB);
	check(r.output_mib >= SPEC_MIN_OUTPUT_MIB && r.output_mib <= SPEC_MAX_OUTPUT_MIB);
	check(r.idle_timeout_s >= 1 && r.idle_timeout_s <= API_SESSION_MAX_IDLE_S);
	check(r.max_lifetime_s >= 1 && r.max_lifetime_s <= API_SESSION_MAX_LIFETIME_S);
	check(allow_egress || !r.egress);
	check(!r.metadata_json || strlen(r.metadata_json) <= API_METADATA_MAX);
	/* Volumes: at most two, names and mount points as kiln-host takes
	 * them, each name once, neither path inside the other. */
	check(r.nvolumes <= API_SESSION_VOLUMES_MAX);
	for (unsigned i = 0; i < r.nvolumes; i++) {
		check(api_volume_name_ok(r.volumes[i].name) && api_volume_path_ok(r.volumes[i].path));
		check(r.volumes[i].read_only == 0 || r.volumes[i].read_only == 1);
		for (unsigned k = 0; k < i; k++) {
			size_t a = strlen(r.volumes[k].path), b = strlen(r.volumes[i].path);

			check(strcmp(r.volumes[k].name, r.volumes[i].name));
			check(strncmp(r.volumes[k].path, r.volumes[i].path, a < b ? a : b) ||
			      (a < b ? r.volumes[i].path[a] != '/' : a > b ? r.volumes[k].path[b] != '/' : 0));
		}
	}
	/* A template name, when given, is one the spec accepts. */
	check(!r.template_name[0] || spec_template_name_check(r.template_name, "template", NULL) == 0);
	/* What hosts get: only limits and network, and a spec with a command
	 * added parses to the same limits. */
	sp = json_loads(r.spec_json, 0, NULL);
	check(json_is_object(sp) && json_object_size(sp) == 2 && json_object_get(sp, "limits") &&
	      json_object_get(sp, "network"));
	probe = json_deep_copy(sp);
	json_object_set_new(probe, "argv", json_pack("[s]", "true"));
	text = json_dumps(probe, JSON_COMPACT);
	check(text && spec_parse(text, strlen(text), &spec, &err) == 0);
	check(spec.vcpus == r.vcpus && spec.memory_mib == r.memory_mib && spec.egress == r.egress);
	spec_free(&spec);
	free(text);
	json_decref(probe);
	json_decref(sp);
	api_session_request_free(&r);
}

static void exec_request(const char *body, size_t len, unsigned max_timeout_s)
{
	struct kiln_err err = { .code = "" };
	json_t *out = NULL, *t;

	if (api_exec_request_parse(body, len, max_timeout_s, &out, &err) < 0) {
		check(err.code[0] && err.message[0] && !out);
		return;
	}
	t = json_object_get(out, "timeout_s");
	check(json_is_integer(t) && json_integer_value(t) >= SPEC_MIN_TIMEOUT_S &&
	      json_integer_value(t) <= SPEC_MAX_TIMEOUT_S);
	check(!max_timeout_s || json_integer_value(t) <= max_timeout_s);
	check(json_object_get(out, "argv") || json_object_get(out, "code"));
	/* An interactive command has no stdin_b64; a terminal has a size in bounds. */
	t = json_object_get(out, "tty");
	check(!json_object_get(out, "interactive") || json_is_boolean(json_object_get(out, "interactive")));
	check(!t || json_is_null(t) ||
	      (json_integer_value(json_object_get(t, "rows")) >= 1 && json_integer_value(json_object_get(t, "rows")) <= API_TTY_MAX &&
	       json_integer_value(json_object_get(t, "cols")) >= 1 && json_integer_value(json_object_get(t, "cols")) <= API_TTY_MAX));
	check(!(json_is_true(json_object_get(out, "interactive")) || json_is_object(t)) || !json_object_get(out, "stdin_b64"));
	json_decref(out);
}

static void input_request(const char *body, size_t len)
{
	struct kiln_err err = { .code = "" };
	json_t *out = NULL, *v;
	const char *id;

	if (api_input_request_parse(body, len, &out, &err) < 0) {
		check(err.code[0] && err.message[0] && !out);
		return;
	}
	id = json_string_value(json_object_get(out, "exec_id"));
	check(id && *id && strlen(id) <= 64 && strspn(id, "0123456789abcdef") == strlen(id));
	v = json_object_get(out, "data_b64");
	/* At most API_INPUT_MAX decoded: padding carries no data. */
	check(!v || (json_is_string(v) && json_string_length(v) % 4 == 0 &&
		     json_string_length(v) / 4 * 3 <= API_INPUT_MAX + 2));
	check(!json_object_get(out, "eof") || json_is_boolean(json_object_get(out, "eof")));
	v = json_object_get(out, "resize");
	check(!v || (json_object_size(v) == 2 && json_integer_value(json_object_get(v, "rows")) >= 1 &&
		     json_integer_value(json_object_get(v, "rows")) <= API_TTY_MAX &&
		     json_integer_value(json_object_get(v, "cols")) >= 1 &&
		     json_integer_value(json_object_get(v, "cols")) <= API_TTY_MAX));
	json_decref(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	const char *body = (const char *)data + 1;
	size_t len = size ? size - 1 : 0;
	char id[65], name[API_NAME_MAX + 1], url[API_URL_MAX + 1];
	struct quota q, before;
	json_t *cap = NULL;

	if (!size)
		return 0;
	quota_defaults(&q);
	before = q;
	switch ((data[0] & 7) == 7 ? data[0] & 3 : data[0] & 7) {
	case 6:
		input_request(body, len);
		break;
	case 4:
		session_request(body, len, data[0] & 0x80);
		break;
	case 5:
		exec_request(body, len, data[0] & 0x80 ? 3600 : 0);
		break;
	case 0:
		task_request(body, len);
		break;
	case 1:
		if (api_customer_request_parse(body, len, id, name, &q, &err) == 0) {
			check(api_id_ok(id));
			check(strlen(name) >= 1 && strlen(name) <= API_NAME_MAX);
		} else {
			check(err.message[0]);
			check(!memcmp(&q, &before, sizeof(q)));
		}
		break;
	case 2:
		if (api_quota_request_parse(body, len, &q, &err) == 0) {
			check(q.max_task_vcpus <= SPEC_MAX_VCPUS && q.max_task_memory_mib <= SPEC_MAX_MEMORY_MIB);
			check(q.submit_rate >= 0 && q.allow_egress >= 0 && q.allow_egress <= 1);
			json_decref(quota_to_json(&q));
		} else {
			check(err.message[0]);
			check(!memcmp(&q, &before, sizeof(q)));
		}
		break;
	case 3:
		if (api_heartbeat_parse(body, len, url, &cap, &err) == 0) {
			check(json_is_object(cap));
			check(!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8));
			check(strlen(url) <= API_URL_MAX);
			json_decref(cap);
		} else {
			check(err.message[0] && !cap);
		}
		break;
	}
	return 0;
}
