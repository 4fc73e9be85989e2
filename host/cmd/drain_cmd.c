/* drain_cmd: `kiln-host drain [--deadline S]` and `kiln-host undrain`. The
 * running kiln-host is reached at its configuration's "listen" address (a
 * wildcard one through loopback) or --url, with its "token" (or
 * "token_file", --token, $KILN_CLUSTER_TOKEN); it answers with its capacity,
 * whose "draining" the next heartbeat carries to kiln-api. */
#include "drain_cmd.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "host_config.h"
#include "httpc.h"
#include "spec.h"

static void drain_usage(FILE *f)
{
	fputs("usage: kiln-host drain [--deadline SECONDS] [--config FILE] [--url URL] [--token T]\n"
	      "       kiln-host undrain [--config FILE] [--url URL] [--token T]\n"
	      "  tells the kiln-host running here to take no new work (kiln-api pauses its sessions\n"
	      "  and lets its tasks finish; past --deadline they go back to the queue), or to take\n"
	      "  work again. --url: its API (default: the config's \"listen\", else\n"
	      "  http://127.0.0.1:7070); --token: the cluster token (default: the config's, else\n"
	      "  $KILN_CLUSTER_TOKEN).\n",
	      f);
}

/* The base URL of a "listen" ADDR:PORT: a wildcard address through loopback. */
static int listen_url(const char *listen, char *url, size_t cap)
{
	const char *colon = strrchr(listen, ':');
	int n;

	if (!colon || colon == listen)
		return -1;
	if ((colon - listen == 7 && !strncmp(listen, "0.0.0.0", 7)) || (colon - listen == 4 && !strncmp(listen, "[::]", 4)))
		n = snprintf(url, cap, "http://127.0.0.1%s", colon);
	else
		n = snprintf(url, cap, "http://%s", listen);
	return n > 0 && (size_t)n < cap ? 0 : -1;
}

int drain_cmd_main(int argc, char **argv)
{
	enum { O_CONFIG = 1, O_URL, O_TOKEN, O_DEADLINE };
	static const struct option opts[] = {
		{ "config", required_argument, 0, O_CONFIG }, { "url", required_argument, 0, O_URL },
		{ "token", required_argument, 0, O_TOKEN },   { "deadline", required_argument, 0, O_DEADLINE },
		{ "help", no_argument, 0, 'h' },              { 0, 0, 0, 0 },
	};
	int drain = !strcmp(argv[0], "drain"), c, rc = 3, have_config = 0;
	const char *config = NULL, *url = NULL, *flag_token = NULL, *token = getenv("KILN_CLUSTER_TOKEN");
	long deadline_s = 0;
	char base[300] = "http://127.0.0.1:7070", full[340];
	struct host_config hc;
	struct kiln_err err = { .code = "" };
	struct httpc_reply reply;
	json_t *body = NULL, *answer = NULL;

	memset(&hc, 0, sizeof(hc));
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_CONFIG: config = optarg; break;
		case O_URL: url = optarg; break;
		case O_TOKEN: flag_token = optarg; break;
		case O_DEADLINE: {
			char *end;

			deadline_s = strtol(optarg, &end, 10);
			if (!drain || *end || deadline_s < 1 || deadline_s > SPEC_DRAIN_DEADLINE_MAX_S) {
				fprintf(stderr, "kiln-host: --deadline: seconds, 1..%d, and only with drain\n",
					SPEC_DRAIN_DEADLINE_MAX_S);
				return 2;
			}
			break;
		}
		case 'h': drain_usage(stdout); return 0;
		default: drain_usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		drain_usage(stderr);
		return 2;
	}
	if (config) {
		if (config_load(config, &hc, &err) < 0) {
			fprintf(stderr, "kiln-host: %s\n", err.message);
			return 2;
		}
		have_config = 1;
		if (hc.token)
			token = hc.token;
		if (hc.listen && listen_url(hc.listen, base, sizeof(base)) < 0) {
			fprintf(stderr, "kiln-host: %s: listen: expected ADDRESS:PORT\n", config);
			goto out;
		}
	}
	if (flag_token)
		token = flag_token;
	if (url)
		snprintf(base, sizeof(base), "%s", url);
	while (strlen(base) > 1 && base[strlen(base) - 1] == '/')
		base[strlen(base) - 1] = '\0';
	snprintf(full, sizeof(full), "%s/v1/%s", base, drain ? "drain" : "undrain");
	if (drain && deadline_s)
		body = json_pack("{s:I}", "deadline_s", (json_int_t)deadline_s);
	else
		body = json_object();
	{
		struct httpc_req q = { .method = "POST", .url = full, .bearer = token && token[0] ? token : NULL };

		if (httpc_json(NULL, &q, body, &answer, &reply) < 0) {
			fprintf(stderr, "kiln-host: cannot reach the kiln-host at %s: %s\n", base, reply.error);
		} else if (reply.status != 200) {
			json_t *e = json_object_get(answer, "error");

			fprintf(stderr, "kiln-host: the kiln-host at %s answered HTTP %ld%s%s\n", base, reply.status,
				e ? ": " : "", e ? json_string_value(json_object_get(e, "message")) ?: "" : "");
		} else {
			printf("%s: %s\n", json_string_value(json_object_get(answer, "host_id")) ?: base,
			       json_is_true(json_object_get(answer, "draining")) ? "draining" : "not draining");
			rc = 0;
		}
		httpc_reply_free(&reply);
	}
out:
	json_decref(body);
	json_decref(answer);
	if (have_config)
		config_free(&hc);
	return rc;
}
