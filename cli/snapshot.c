/* snapshot: `kiln snapshot create|list|get|delete` over kiln-api's named
 * snapshots (docs/api.md, "Snapshots"): a running session's memory,
 * processes and disk kept in S3, from which `kiln session create --snapshot`
 * starts new sessions. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define LIST_MAX_PAGES 1000 /* 100 000 snapshots: past that, a server that loops */

static void snapshot_usage(FILE *f)
{
	fprintf(f,
		"usage: kiln snapshot create SESSION_ID [--name NAME] [--json]\n"
		"       kiln snapshot list [--name NAME] [--session SESSION_ID] [--json]\n"
		"       kiln snapshot get SNAP_ID [--json]\n"
		"       kiln snapshot delete SNAP_ID\n"
		"  A snapshot keeps a running session's memory, processes and files in S3; it outlives\n"
		"  the session, and any number of sessions start from it, on any host:\n"
		"  kiln session create --snapshot SNAP_ID. The session is stopped only while its\n"
		"  memory is read, then goes on. create prints the snapshot's id alone on stdout.\n"
		"  list shows every page, newest first (--name, --session: only those). Snapshots\n"
		"  count against the quotas max_snapshots and max_snapshot_mib until deleted.\n");
}

/* The snapshot's size: "bytes", "-" when absent. */
static void size_of(json_t *s, char *out, size_t size)
{
	json_t *b = json_object_get(s, "bytes");

	cli_human_size(json_is_integer(b) ? (long long)json_integer_value(b) : -1, out, size);
}

static const char *str_or(json_t *s, const char *key, const char *dflt)
{
	const char *v = json_string_value(json_object_get(s, key));

	return v && *v ? v : dflt;
}

/* The one-line account of a snapshot just made, on stderr. */
static void describe_made(json_t *s)
{
	char sz[32];

	size_of(s, sz, sizeof(sz));
	fprintf(stderr, "kiln: snapshot %s%s%s of session %s: %s, template %s, %lld vCPU, %lld MiB (the session "
		"stopped %lld ms)\n", str_or(s, "id", "?"), json_is_string(json_object_get(s, "name")) ? " " : "",
		str_or(s, "name", ""), str_or(s, "session_id", "?"), sz, str_or(s, "template", "-"),
		(long long)json_integer_value(json_object_get(s, "vcpus")),
		(long long)json_integer_value(json_object_get(s, "memory_mib")),
		(long long)json_integer_value(json_object_get(s, "stop_ms")));
}

static void describe(json_t *s)
{
	char sz[32], when[64];

	size_of(s, sz, sizeof(sz));
	cli_format_ms(json_object_get(s, "created_ms"), when, sizeof(when));
	printf("id        %s\n"
	       "name      %s\n"
	       "session   %s\n"
	       "template  %s\n"
	       "vcpus     %lld\n"
	       "memory    %lld MiB\n"
	       "size      %s\n"
	       "stop      %lld ms\n"
	       "created   %s\n",
	       str_or(s, "id", "?"), str_or(s, "name", "-"), str_or(s, "session_id", "-"), str_or(s, "template", "-"),
	       (long long)json_integer_value(json_object_get(s, "vcpus")),
	       (long long)json_integer_value(json_object_get(s, "memory_mib")), sz,
	       (long long)json_integer_value(json_object_get(s, "stop_ms")), when);
}

static int snapshot_create(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = { { "name", required_argument, 0, 'n' }, { "json", no_argument, 0, 'j' },
					      { 0, 0, 0, 0 } };
	json_t *body = json_object(), *reply = NULL;
	char path[128];
	int opt, json = 0, rc = EXIT_USAGE;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "n:j", opts, NULL)) != -1) {
		if (opt == 'n') {
			json_t *name = json_string(optarg);

			if (!name) { /* jansson takes only UTF-8 */
				fprintf(stderr, "kiln: snapshot create: --name: not UTF-8 text\n");
				goto out;
			}
			json_object_set_new(body, "name", name);
		} else if (opt == 'j') {
			json = 1;
		} else {
			snapshot_usage(stderr);
			goto out;
		}
	}
	if (optind != argc - 1 || !cli_id_ok(argv[optind])) {
		snapshot_usage(stderr);
		goto out;
	}
	snprintf(path, sizeof(path), "/v1/sessions/%s/snapshots", argv[optind]);
	/* The session's memory and disk go to S3: allow it the time a pause has. */
	if ((rc = cli_request(conn, "snapshot create", "POST", path, body, 960, &reply)))
		goto out;
	if (json) {
		cli_print_json(reply);
	} else {
		printf("%s\n", str_or(reply, "id", "?"));
		describe_made(reply);
	}
out:
	json_decref(body);
	json_decref(reply);
	return rc;
}

/* Every page of GET /v1/snapshots, following "next" (as "after"), into all. */
static int list_all(const struct cli_conn *conn, const char *name, const char *session, json_t *all)
{
	char path[2048], after[512] = "";
	int pages, rc;

	for (pages = 0; pages < LIST_MAX_PAGES; pages++) {
		json_t *reply = NULL, *next;
		const char *tok;

		if (cli_snapshot_list_path(name, session, after, path, sizeof(path)) < 0) {
			fprintf(stderr, "kiln: snapshot list: the filters or the page token are too long\n");
			return EXIT_USAGE;
		}
		if ((rc = cli_request(conn, "snapshot list", "GET", path, NULL, 30, &reply)))
			return rc;
		if (!json_is_array(json_object_get(reply, "snapshots"))) {
			fprintf(stderr, "kiln: snapshot list: the reply has no \"snapshots\" list\n");
			json_decref(reply);
			return EXIT_INFRA;
		}
		json_array_extend(all, json_object_get(reply, "snapshots"));
		next = json_object_get(reply, "next");
		tok = json_string_value(next);
		if (!tok || !*tok) {
			json_decref(reply);
			return 0;
		}
		/* A token that does not move on would loop for ever. */
		if (strlen(tok) >= sizeof(after) || !strcmp(tok, after)) {
			fprintf(stderr, "kiln: snapshot list: kiln-api gave a page token that %s\n",
				strlen(tok) >= sizeof(after) ? "is too long" : "repeats the last one");
			json_decref(reply);
			return EXIT_INFRA;
		}
		snprintf(after, sizeof(after), "%s", tok);
		json_decref(reply);
	}
	fprintf(stderr, "kiln: snapshot list: more than %d pages: stopped\n", LIST_MAX_PAGES);
	return EXIT_INFRA;
}

static int snapshot_list(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = { { "name", required_argument, 0, 'n' },
					      { "session", required_argument, 0, 's' },
					      { "json", no_argument, 0, 'j' }, { 0, 0, 0, 0 } };
	const char *name = NULL, *session = NULL;
	json_t *all, *s;
	int opt, json = 0, rc;
	size_t i;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "n:s:j", opts, NULL)) != -1) {
		if (opt == 'n') {
			name = optarg;
		} else if (opt == 's') {
			session = optarg;
		} else if (opt == 'j') {
			json = 1;
		} else {
			snapshot_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc || (session && !cli_id_ok(session))) {
		snapshot_usage(stderr);
		return EXIT_USAGE;
	}
	all = json_array();
	if ((rc = list_all(conn, name, session, all))) {
		json_decref(all);
		return rc;
	}
	if (json) {
		json_t *out = json_pack("{s:O, s:n}", "snapshots", all, "next");

		cli_print_json(out);
		json_decref(out);
		json_decref(all);
		return 0;
	}
	printf("%-38s %-20s %-34s %-5s %-7s %-10s %s\n", "ID", "NAME", "SESSION", "VCPUS", "MEM_MIB", "SIZE",
	       "CREATED");
	json_array_foreach(all, i, s) {
		char sz[32], when[64];

		size_of(s, sz, sizeof(sz));
		cli_format_ms(json_object_get(s, "created_ms"), when, sizeof(when));
		printf("%-38s %-20s %-34s %-5lld %-7lld %-10s %s\n", str_or(s, "id", "?"), str_or(s, "name", "-"),
		       str_or(s, "session_id", "-"), (long long)json_integer_value(json_object_get(s, "vcpus")),
		       (long long)json_integer_value(json_object_get(s, "memory_mib")), sz, when);
	}
	json_decref(all);
	return 0;
}

int cmd_snapshot(int argc, char **argv)
{
	struct cli_conn conn;
	struct creds cr;
	json_t *reply = NULL;
	const char *verb;
	char path[128];
	int rc, json = 0;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		snapshot_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	verb = argv[1];
	/* Usage is checked before any configuration is looked for (create and
	 * list: their options by getopt, after). */
	if (!strcmp(verb, "get") || !strcmp(verb, "delete") || !strcmp(verb, "rm")) {
		json = argc == 4 && !strcmp(verb, "get") && !strcmp(argv[3], "--json");
		if (argc != 3 + json || !cli_id_ok(argv[2])) {
			snapshot_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (strcmp(verb, "create") && strcmp(verb, "list")) {
		fprintf(stderr, "kiln: snapshot %s: unknown command\n", verb);
		snapshot_usage(stderr);
		return EXIT_USAGE;
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		return rc;
	if (!strcmp(verb, "create"))
		return snapshot_create(argc - 1, argv + 1, &conn);
	if (!strcmp(verb, "list"))
		return snapshot_list(argc - 1, argv + 1, &conn);
	snprintf(path, sizeof(path), "/v1/snapshots/%s", argv[2]);
	if (!strcmp(verb, "get")) {
		if ((rc = cli_request(&conn, "snapshot get", "GET", path, NULL, 30, &reply)))
			return rc;
		if (json)
			cli_print_json(reply);
		else
			describe(reply);
	} else {
		if ((rc = cli_request(&conn, "snapshot delete", "DELETE", path, NULL, 120, &reply)))
			return rc;
		printf("%s deleted\n", argv[2]);
	}
	json_decref(reply);
	return 0;
}
