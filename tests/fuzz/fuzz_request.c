/* fuzz_request: libFuzzer target for the host API's task request parser
 * (hostd_request_parse) followed by the spec parser, as POST /v1/tasks runs
 * them. Checks that an accepted request has its three fields, that ids the
 * spool accepts are safe path and key components, and that every refusal
 * says why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hostd.h"
#include "spec.h"
#include "template_ref.h"
#include "spool.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	const char *id, *customer;
	json_t *spec, *template, *j = hostd_request_parse((const char *)data, size, &id, &customer, &spec, &template, &err);

	if (!j) {
		check(err.code[0] && err.message[0]);
		check(!id && !customer && !spec);
		return 0;
	}
	check(id && customer && spec);
	if (template) {
		struct template_ref t;

		if (template_ref_parse_json(template, &t, &err) == 0)
			template_ref_free(&t);
		else
			check(err.message[0]);
	}
	if (spool_id_ok(id)) {
		check(!strchr(id, '/') && strcmp(id, ".") && strcmp(id, "..") && strlen(id) <= 64);
	}
	if (json_is_object(spec)) {
		char *s = json_dumps(spec, JSON_COMPACT);
		struct task_spec ts;

		if (s && spec_parse(s, strlen(s), &ts, &err) == 0)
			spec_free(&ts);
		else if (s)
			check(err.message[0]);
		free(s);
	}
	json_decref(j);
	return 0;
}
