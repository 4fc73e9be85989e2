/* volume: `kiln volume create|list|get|delete` over kiln-api's volumes
 * (docs/api.md, "Volumes"): a customer's named persistent filesystem, kept
 * in S3 between uses and mounted into sessions with
 * `kiln session create --volume NAME:PATH[:ro]`. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void volume_usage(FILE *f)
{
	fprintf(f,
		"usage: kiln volume create NAME [--size MIB] [--json]\n"
		"       kiln volume list [--name NAME] [--json]\n"
		"       kiln volume get ID|NAME [--json]\n"
		"       kiln volume delete ID|NAME\n"
		"  A volume is a filesystem of your own that outlives sessions: mount it with\n"
		"  kiln session create --volume NAME:PATH[:ro]. One session at a time mounts it\n"
		"  read-write, any number read-only; what a session wrote and synced is there in the\n"
		"  next one (it is kept in S3 when the session pauses or ends). --size: 16-65536 MiB,\n"
		"  default 1024, at most your max_volume_mib. create prints the volume's id alone on\n"
		"  stdout. delete refuses a volume that a session (even a paused one) mounts.\n");
}

static const char *str_or(json_t *v, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(v, key));

	return s && *s ? s : dflt;
}

/* "s_1 (rw), s_2 (ro)" from "mounted_by"; "-" when none. */
static void mounts_of(json_t *v, char *out, size_t size)
{
	json_t *m;
	size_t i, len = 0;

	out[0] = '\0';
	json_array_foreach(json_object_get(v, "mounted_by"), i, m) {
		int n = snprintf(out + len, size - len, "%s%s (%s)", i ? ", " : "", str_or(m, "session_id", "?"),
				 json_is_true(json_object_get(m, "read_only")) ? "ro" : "rw");

		if (n < 0 || (size_t)n >= size - len) {
			/* Too many to show: say so rather than cut one in half. */
			snprintf(out + (len < size - 5 ? len : size - 5), 5, " ...");
			return;
		}
		len += (size_t)n;
	}
	if (!len)
		snprintf(out, size, "-");
}

static void describe(json_t *v)
{
	char when[64], mounts[1024], sz[32];
	json_t *b = json_object_get(v, "bytes");

	cli_format_ms(json_object_get(v, "created_ms"), when, sizeof(when));
	mounts_of(v, mounts, sizeof(mounts));
	cli_human_size(json_is_integer(b) ? (long long)json_integer_value(b) : -1, sz, sizeof(sz));
	printf("id          %s\n"
	       "name        %s\n"
	       "size        %lld MiB\n"
	       "stored      %s\n"
	       "mounted by  %s\n"
	       "created     %s\n",
	       str_or(v, "id", "?"), str_or(v, "name", "-"), (long long)json_integer_value(json_object_get(v, "size_mib")),
	       json_is_integer(b) ? sz : "- (never written, or no host reachable)", mounts, when);
}

static int volume_create(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = { { "size", required_argument, 0, 's' }, { "json", no_argument, 0, 'j' },
					      { 0, 0, 0, 0 } };
	json_t *body = NULL, *reply = NULL;
	long size = 0;
	char *end;
	int opt, json = 0, rc = EXIT_USAGE;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:j", opts, NULL)) != -1) {
		if (opt == 's') {
			errno = 0;
			size = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || size < 16 || size > 65536) {
				fprintf(stderr, "kiln: volume create: --size: expected 16 to 65536 (MiB), got \"%s\"\n",
					optarg);
				return EXIT_USAGE;
			}
		} else if (opt == 'j') {
			json = 1;
		} else {
			volume_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		volume_usage(stderr);
		return EXIT_USAGE;
	}
	if (!cli_volume_name_ok(argv[optind])) {
		fprintf(stderr, "kiln: volume create: \"%.80s\" is not a volume name (1-63 of A-Z a-z 0-9 . _ -)\n",
			argv[optind]);
		return EXIT_USAGE;
	}
	body = json_pack("{s:s}", "name", argv[optind]);
	if (size)
		json_object_set_new(body, "size_mib", json_integer(size));
	if ((rc = cli_request(conn, "volume create", "POST", "/v1/volumes", body, 60, &reply)))
		goto out;
	if (json) {
		cli_print_json(reply);
	} else {
		/* The id alone on stdout, so that a script can capture it. */
		printf("%s\n", str_or(reply, "id", "?"));
		fprintf(stderr, "kiln: volume %s %s: %lld MiB\n", str_or(reply, "id", "?"), str_or(reply, "name", "?"),
			(long long)json_integer_value(json_object_get(reply, "size_mib")));
	}
out:
	json_decref(body);
	json_decref(reply);
	return rc;
}

static int volume_list(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = { { "name", required_argument, 0, 'n' }, { "json", no_argument, 0, 'j' },
					      { 0, 0, 0, 0 } };
	const char *name = NULL;
	json_t *reply = NULL, *v;
	char path[256];
	int opt, json = 0, rc;
	size_t i;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "n:j", opts, NULL)) != -1) {
		if (opt == 'n') {
			name = optarg;
		} else if (opt == 'j') {
			json = 1;
		} else {
			volume_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc || (name && !cli_volume_name_ok(name))) {
		volume_usage(stderr);
		return EXIT_USAGE;
	}
	/* A name is of URL-safe characters only (cli_volume_name_ok). */
	snprintf(path, sizeof(path), "/v1/volumes%s%s", name ? "?name=" : "", name ? name : "");
	if ((rc = cli_request(conn, "volume list", "GET", path, NULL, 30, &reply)))
		return rc;
	if (!json_is_array(json_object_get(reply, "volumes"))) {
		fprintf(stderr, "kiln: volume list: the reply has no \"volumes\" list\n");
		json_decref(reply);
		return EXIT_INFRA;
	}
	if (json) {
		cli_print_json(reply);
		json_decref(reply);
		return 0;
	}
	printf("%-28s %-24s %-8s %-19s %s\n", "ID", "NAME", "SIZE_MIB", "CREATED", "MOUNTED_BY");
	json_array_foreach(json_object_get(reply, "volumes"), i, v) {
		char when[64], mounts[1024];

		cli_format_ms(json_object_get(v, "created_ms"), when, sizeof(when));
		mounts_of(v, mounts, sizeof(mounts));
		printf("%-28s %-24s %-8lld %-19s %s\n", str_or(v, "id", "?"), str_or(v, "name", "-"),
		       (long long)json_integer_value(json_object_get(v, "size_mib")), when, mounts);
	}
	json_decref(reply);
	return 0;
}

int cmd_volume(int argc, char **argv)
{
	struct cli_conn conn;
	struct creds cr;
	json_t *reply = NULL;
	const char *verb;
	char path[128];
	int rc, json = 0;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		volume_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	verb = argv[1];
	/* Usage is checked before any configuration is looked for (create and
	 * list: their options by getopt, after). */
	if (!strcmp(verb, "get") || !strcmp(verb, "delete") || !strcmp(verb, "rm")) {
		json = argc == 4 && !strcmp(verb, "get") && !strcmp(argv[3], "--json");
		/* An id (vol_...) or a name: both go into the path as they are. */
		if (argc != 3 + json || !cli_volume_name_ok(argv[2])) {
			volume_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (strcmp(verb, "create") && strcmp(verb, "list") && strcmp(verb, "ls")) {
		fprintf(stderr, "kiln: volume %s: unknown command\n", verb);
		volume_usage(stderr);
		return EXIT_USAGE;
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		return rc;
	if (!strcmp(verb, "create"))
		return volume_create(argc - 1, argv + 1, &conn);
	if (!strcmp(verb, "list") || !strcmp(verb, "ls"))
		return volume_list(argc - 1, argv + 1, &conn);
	snprintf(path, sizeof(path), "/v1/volumes/%s", argv[2]);
	if (!strcmp(verb, "get")) {
		if ((rc = cli_request(&conn, "volume get", "GET", path, NULL, 30, &reply)))
			return rc;
		if (json)
			cli_print_json(reply);
		else
			describe(reply);
	} else {
		/* kiln-api first has a host delete the volume's objects in S3. */
		if ((rc = cli_request(&conn, "volume delete", "DELETE", path, NULL, 120, &reply)))
			return rc;
		printf("%s deleted\n", str_or(reply, "id", argv[2]));
	}
	json_decref(reply);
	return 0;
}
