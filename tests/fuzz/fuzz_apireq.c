/* fuzz_apireq: libFuzzer target for kiln-api's request-body parsers. The
 * first byte picks one: 0 POST /v1/tasks (api_task_request_parse, then
 * spec_parse on what it leaves, as the server runs them), 1 POST
 * /v1/admin/customers, 2 PUT .../quotas, 3 a host heartbeat. Checks that
 * metadata never reaches the spec, that accepted values are within their
 * bounds, and that every refusal says why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quota.h"
#include "request.h"
#include "spec.h"

#define check(cond)                                                                              \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                                 \
		}                                                                                \
	} while (0)

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
	switch (data[0] & 3) {
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
	default:
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
