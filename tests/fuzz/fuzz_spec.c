/* fuzz_spec: libFuzzer target for spec_parse(). Checks, besides memory safety
 * (ASan/LSan/UBSan), that a spec that parses satisfies the invariants the
 * rest of kiln relies on, and that a rejection always carries a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "spec.h"
#include "fuzz.h"

static int ldh(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
}

/* Parsed network rules are what kiln-host turns into firewall and resolver
 * state: every field in range, and each rule's normalized text parses back
 * to the same rule. */
static void check_network(const struct task_spec *s)
{
	size_t i, k;

	check(s->egress == 0 || s->egress == 1);
	if (s->egress == 0) {
		check(s->net_rules == NULL && s->nnet_rules == 0);
		return;
	}
	check(s->net_rules != NULL && s->nnet_rules >= 1 && s->nnet_rules <= SPEC_MAX_NET_RULES);
	for (i = 0; i < s->nnet_rules; i++) {
		const struct spec_net_rule *r = &s->net_rules[i];
		char text[SPEC_NET_RULE_TEXT], json[SPEC_NET_RULE_TEXT + 96];
		struct kiln_err err = { .code = "" };
		struct task_spec back;
		size_t hl = strnlen(r->host, sizeof(r->host));

		check(r->port_lo >= 1 && r->port_lo <= r->port_hi);
		check(hl <= SPEC_MAX_NET_HOST);
		switch (r->kind) {
		case SPEC_NET_CIDR:
			check(r->prefix <= 32 && hl == 0);
			check(r->prefix == 0 ? r->addr == 0 : (r->addr & ~(~0u << (32 - r->prefix))) == 0);
			break;
		case SPEC_NET_HOST:
		case SPEC_NET_WILDCARD:
			check(hl > 0 && r->addr == 0 && r->prefix == 0);
			check(r->host[0] != '.' && r->host[0] != '-' && r->host[hl - 1] != '.');
			check(strchr(r->host, '.') != NULL);
			for (k = 0; k < hl; k++)
				check(ldh(r->host[k]));
			break;
		default:
			check(!"unknown rule kind");
		}
		for (k = 0; k < i; k++)
			check(memcmp(&s->net_rules[k], r, sizeof(*r)) != 0);
		spec_net_rule_format(r, text, sizeof(text));
		check(strlen(text) < sizeof(text) - 1);
		snprintf(json, sizeof(json), "{\"argv\":[\"x\"],\"network\":{\"egress\":\"allow\",\"allow\":[\"%s\"]}}",
			 text);
		check(spec_parse(json, strlen(json), &back, &err) == 0);
		check(back.nnet_rules == 1 && memcmp(&back.net_rules[0], r, sizeof(*r)) == 0);
		spec_free(&back);
	}
}

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
	check_network(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct task_spec s;
	struct kiln_err err = { .code = "" };

	if (spec_parse((const char *)data, size, &s, &err) == 0) {
		check_ok(&s);
		spec_free(&s);
	} else {
		check(err.errc == KERR_INVALID_SPEC || err.errc == KERR_HOST_ERROR);
		check(err.message[0] != '\0' && strchr(err.message, ':') != NULL);
		/* spec_parse() leaves *out zeroed on failure. */
		check(s.argv == NULL && s.files == NULL && s.env == NULL && s.cwd == NULL &&
		      s.net_rules == NULL && s.nnet_rules == 0);
	}
	return 0;
}
