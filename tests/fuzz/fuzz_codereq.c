/* fuzz_codereq: libFuzzer target for the check of POST
 * /v1/sessions/{id}/code's body (ports_code_request, api/ports/
 * port_code_ev.c): anyone's JSON. Besides memory safety, checks that a
 * refusal is invalid_json or invalid_request, that an accepted body becomes
 * an object of only code, language, context_id and env_vars (code a string,
 * not both language and context_id, a context id kiln accepts) with a
 * timeout in 1..CODE_MAX_TIMEOUT_MS, and that the request it writes is
 * accepted again as itself (with the default timeout). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ports_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	unsigned t = 0, t2 = 0;
	char *s = ports_code_request((const char *)data, size, &t, &err), *s2;
	json_t *j, *cid;
	const char *k;
	json_t *v;

	if (!s) {
		check(!strcmp(err.code, "invalid_json") || !strcmp(err.code, "invalid_request"));
		return 0;
	}
	check(t >= 1 && t <= CODE_MAX_TIMEOUT_MS);
	j = json_loads(s, 0, NULL);
	check(json_is_object(j) && json_is_string(json_object_get(j, "code")));
	json_object_foreach(j, k, v)
		check(!strcmp(k, "code") || !strcmp(k, "language") || !strcmp(k, "context_id") || !strcmp(k, "env_vars"));
	check(!(json_object_get(j, "language") && json_object_get(j, "context_id")));
	cid = json_object_get(j, "context_id");
	check(!cid || code_cid_ok(json_string_value(cid), json_string_length(cid)));
	s2 = ports_code_request(s, strlen(s), &t2, &err);
	check(s2 && !strcmp(s, s2) && t2 == CODE_DEFAULT_TIMEOUT_MS);
	free(s2);
	json_decref(j);
	free(s);
	return 0;
}
