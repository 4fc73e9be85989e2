/* fuzz_template_ref: libFuzzer target for template_ref_parse() (the template reference
 * kiln-api sends with tasks and sessions). Besides memory safety, checks
 * that a TREF that parses satisfies what the template store relies on
 * (a name, a hex SHA-256 naming its s3_key, bounded sizes), that it
 * round-trips through template_ref_json, and that a refusal carries a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "template_ref.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	struct template_ref t, back;
	json_t *j;
	char *text;

	if (template_ref_parse((const char *)data, size, &t, &err) < 0) {
		check(err.code[0] && err.message[0]);
		check(t.env == NULL);
		return 0;
	}
	check(spec_template_name_check(t.name, "name", NULL) == 0);
	if (t.builtin) {
		check(!t.sha256[0] && !t.s3_key[0] && t.size == 0);
	} else {
		check(strlen(t.sha256) == 64 && strspn(t.sha256, "0123456789abcdef") == 64);
		check(t.size >= 1 && t.size <= TEMPLATE_REF_MAX_SIZE);
		check(!strncmp(t.s3_key, TEMPLATE_REF_S3_PREFIX, strlen(TEMPLATE_REF_S3_PREFIX)) && strstr(t.s3_key, t.sha256));
		check(!strstr(t.s3_key, ".."));
	}
	check(!t.env || json_array_size(t.env) <= TEMPLATE_REF_MAX_ENV);
	check(!t.workdir[0] || t.workdir[0] == '/');
	/* What we send on (meta.json, build results) parses back the same. */
	j = template_ref_json(&t);
	check(j);
	text = json_dumps(j, JSON_COMPACT);
	check(text);
	check(template_ref_parse(text, strlen(text), &back, &err) == 0);
	check(!strcmp(back.name, t.name) && back.builtin == t.builtin && !strcmp(back.sha256, t.sha256) &&
	      back.size == t.size && back.user_set == t.user_set && back.uid == t.uid && back.gid == t.gid &&
	      !strcmp(back.workdir, t.workdir));
	template_ref_free(&back);
	free(text);
	json_decref(j);
	template_ref_free(&t);
	return 0;
}
