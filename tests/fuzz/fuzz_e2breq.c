/* fuzz_e2breq: libFuzzer target for the E2B control API's input parsers
 * (api/sessions/e2b_request.c). The first byte picks the parser: 0/1 the create body
 * (1: the account allows egress), followed by kiln's own session request
 * parser on the body it made, as POST /e2b/v2/sandboxes runs them; 2 the
 * v2 list's metadata filter; 3 a percent-decode; with bits 3 and 4 both
 * set (0x18), an updateNetwork body instead. Checks that an accepted create
 * has a timeout in range mirrored in both session limits, a template name,
 * its volumeMounts as read-write mounts kiln-host accepts, and a refusal
 * says why; that decoding never grows its input; that an
 * accepted updateNetwork body is a network object with egress "allow" and
 * at most 64 rules, each accepted by the spec's parser (spec_parse on it),
 * and shows back in getInfo's form. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2b.h"
#include "request.h"
#include "spec.h"
#include "fuzz.h"

static void create(const char *p, size_t n, int egress)
{
	struct kiln_err err = { .code = "" };
	struct api_session_request sr;
	struct e2b_create c;
	char msg[600] = "";
	char *text;

	if (e2b_create_parse(p, n, egress, &c, msg, sizeof(msg)) < 0) {
		check(msg[0] && !c.native && !c.env_json);
		return;
	}
	check(json_is_object(c.native) && c.template[0]);
	check(c.timeout_s >= 1 && c.timeout_s <= E2B_MAX_TIMEOUT_S);
	check(json_integer_value(json_object_get(c.native, "max_lifetime_s")) == c.timeout_s);
	check(json_integer_value(json_object_get(c.native, "idle_timeout_s")) == c.timeout_s);
	if (c.env_json) {
		json_t *e = json_loads(c.env_json, 0, NULL);

		check(json_is_object(e) && json_object_size(e) > 0);
		json_decref(e);
	}
	text = json_dumps(c.native, JSON_COMPACT);
	check(text);
	if (api_session_request_parse(text, strlen(text), egress, &sr, &err) == 0) {
		check(sr.idle_timeout_s == (unsigned)c.timeout_s && sr.max_lifetime_s == (unsigned)c.timeout_s);
		/* volumeMounts: read-write mounts, as many as the body had. */
		check(sr.nvolumes == json_array_size(json_object_get(c.native, "volumes")));
		for (unsigned i = 0; i < sr.nvolumes; i++)
			check(!sr.volumes[i].read_only && api_volume_name_ok(sr.volumes[i].name) &&
			      api_volume_path_ok(sr.volumes[i].path));
		api_session_request_free(&sr);
	} else {
		check(err.message[0]);
	}
	free(text);
	e2b_create_free(&c);
}

static void network_update(const char *p, size_t n)
{
	struct kiln_err err = { .code = "" };
	struct task_spec ts;
	char msg[600] = "";
	json_t *net = NULL, *probe, *info;
	char *text;

	if (e2b_network_update_parse(p, n, &net, msg, sizeof(msg)) < 0) {
		check(msg[0] && !net);
		return;
	}
	check(json_is_object(net) && !strcmp(json_string_value(json_object_get(net, "egress")) ?: "", "allow"));
	check(json_array_size(json_object_get(net, "allow")) <= SPEC_MAX_NET_RULES);
	probe = json_pack("{s:[s], s:O}", "argv", "true", "network", net);
	text = probe ? json_dumps(probe, JSON_COMPACT) : NULL;
	check(text);
	check(spec_parse(text, strlen(text), &ts, &err) == 0);
	check(ts.egress == 1 && ts.nnet_rules == json_array_size(json_object_get(net, "allow")));
	spec_free(&ts);
	info = e2b_network_info(net);
	check(json_array_size(json_object_get(info, "allowOut")) == ts.nnet_rules || ts.nnet_rules == 0);
	json_decref(info);
	free(text);
	json_decref(probe);
	json_decref(net);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s;

	if (size < 1)
		return 0;
	s = malloc(size);
	if (!s)
		return 0;
	memcpy(s, data + 1, size - 1);
	s[size - 1] = '\0';
	if ((data[0] & 0x18) == 0x18) {
		network_update(s, size - 1);
		free(s);
		return 0;
	}
	switch (data[0] & 3) {
	case 0:
	case 1:
		create(s, size - 1, data[0] & 1);
		break;
	case 2: {
		json_t *m = strlen(s) == size - 1 ? e2b_metadata_filter(s) : NULL;

		check(!m || json_is_object(m));
		json_decref(m);
		break;
	}
	default: {
		char out[256];

		if (e2b_url_decode(s, size - 1, data[0] & 4, out, sizeof(out)) == 0)
			check(strlen(out) <= size - 1);
	}
	}
	free(s);
	return 0;
}
