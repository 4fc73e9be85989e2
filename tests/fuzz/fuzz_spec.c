/* fuzz_spec: libFuzzer target for spec_parse(). Checks, besides memory safety
 * (ASan/LSan/UBSan), that a spec that parses satisfies the invariants the
 * rest of kiln relies on, and that a rejection always carries a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "spec.h"

/* An abort() with the failed condition, so a crash report says which
 * property broke. */
#define check(cond)                                                             \
	do {                                                                    \
		if (!(cond)) {                                                  \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                               \
			abort();                                                \
		}                                                               \
	} while (0)

static void check_ok(const struct task_spec *s)
{
	size_t i, files = 0;

	check(s->argc >= 1 && s->argc <= SPEC_MAX_ARGS && s->argv[s->argc] == NULL);
	check(s->argv[0][0] != '\0');
	check(s->env && s->env[s->nenv] == NULL && s->nenv <= SPEC_MAX_ENV);
	for (i = 0; i < s->nenv; i++)
		check(strchr(s->env[i], '=') != NULL && s->env[i][0] != '=');
	check(proto_abspath_ok(s->cwd) == 0);
	check(s->nfiles <= SPEC_MAX_FILES + 1);
	for (i = 0; i < s->nfiles; i++) {
		check(proto_abspath_ok(s->files[i].path) == 0);
		check(s->files[i].data != NULL && s->files[i].mode <= SPEC_MAX_MODE);
		files += s->files[i].size;
	}
	check(files <= SPEC_MAX_FILE_BYTES + SPEC_MAX_CODE);
	check((s->code != NULL) == (s->language != SPEC_LANG_NONE));
	if (s->code) {
		const struct spec_file *f = &s->files[s->nfiles - 1];

		check(strlen(s->code) == s->code_len && f->size == s->code_len);
		check(memcmp(f->data, s->code, s->code_len) == 0);
	}
	check(s->vcpus >= SPEC_MIN_VCPUS && s->vcpus <= SPEC_MAX_VCPUS);
	check(s->memory_mib >= SPEC_MIN_MEMORY_MIB && s->memory_mib <= SPEC_MAX_MEMORY_MIB);
	check(s->timeout_s >= SPEC_MIN_TIMEOUT_S && s->timeout_s <= SPEC_MAX_TIMEOUT_S);
	check(s->output_mib >= SPEC_MIN_OUTPUT_MIB && s->output_mib <= SPEC_MAX_OUTPUT_MIB);
	check(s->egress_none == 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct task_spec s;
	struct kiln_err err = { "", "" };

	if (spec_parse((const char *)data, size, &s, &err) == 0) {
		check_ok(&s);
		spec_free(&s);
	} else {
		check(strcmp(err.code, "invalid_spec") == 0 || strcmp(err.code, "host_error") == 0);
		check(err.message[0] != '\0' && strchr(err.message, ':') != NULL);
		/* spec_parse() leaves *out zeroed on failure. */
		check(s.argv == NULL && s.files == NULL && s.env == NULL && s.cwd == NULL);
	}
	return 0;
}
