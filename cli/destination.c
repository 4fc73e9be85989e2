/* destination: `kiln destination set | show | test | delete`, the caller's
 * own S3 destination for its tasks' outputs, logs and manifest (docs/api.md,
 * "Destination"), over /v1/destination with the customer's key. The secret
 * key is read from a file or stdin, never taken on the command line (where
 * other users could see it in the process list). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "cli.h"

static void destination_usage(FILE *f)
{
	fprintf(f, "usage: kiln destination set --endpoint URL --bucket BUCKET [--region R] [--prefix P/]\n"
		   "                             --access-key ID --secret-key-file FILE|- [--no-verify]\n"
		   "       kiln destination show | test | delete\n"
		   "  Your tasks' outputs, logs and manifest then go to that bucket (it must exist); the\n"
		   "  secret key is read from FILE (or stdin with -), first line; it is never shown again.\n"
		   "  Uses KILN_API and KILN_KEY (else the credentials file of `kiln up`).\n");
}

/* The first line of path ("-": stdin), at most 256 bytes: malloc'd or NULL. */
static char *read_secret(const char *path)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "re") : stdin;
	char buf[300], *nl;

	if (!f) {
		perror(path);
		return NULL;
	}
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	if (f != stdin)
		fclose(f);
	nl = strchr(buf, '\n');
	if (nl)
		*nl = '\0';
	if (!buf[0]) {
		fprintf(stderr, "kiln: destination set: %s: no secret key in it\n", path);
		return NULL;
	}
	nl = strdup(buf);
	OPENSSL_cleanse(buf, sizeof(buf));
	return nl;
}

static int destination_set(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = {
		{ "endpoint", required_argument, 0, 'e' }, { "bucket", required_argument, 0, 'b' },
		{ "region", required_argument, 0, 'r' }, { "prefix", required_argument, 0, 'p' },
		{ "access-key", required_argument, 0, 'a' }, { "secret-key-file", required_argument, 0, 's' },
		{ "no-verify", no_argument, 0, 'n' }, { 0, 0, 0, 0 },
	};
	const char *endpoint = NULL, *bucket = NULL, *region = NULL, *prefix = NULL, *ak = NULL, *sk_file = NULL;
	int verify = 1, opt, rc;
	json_t *body;
	char *sk;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'e': endpoint = optarg; break;
		case 'b': bucket = optarg; break;
		case 'r': region = optarg; break;
		case 'p': prefix = optarg; break;
		case 'a': ak = optarg; break;
		case 's': sk_file = optarg; break;
		case 'n': verify = 0; break;
		default:
			destination_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc || !endpoint || !bucket || !ak || !sk_file) {
		fprintf(stderr, "kiln: destination set: --endpoint, --bucket, --access-key and --secret-key-file are required\n");
		return EXIT_USAGE;
	}
	sk = read_secret(sk_file);
	if (!sk)
		return EXIT_USAGE;
	body = json_pack("{s:s, s:s, s:s, s:s, s:b}", "endpoint", endpoint, "bucket", bucket, "access_key", ak,
			 "secret_key", sk, "verify", verify);
	OPENSSL_cleanse(sk, strlen(sk));
	free(sk);
	if (body && region)
		json_object_set_new(body, "region", json_string(region));
	if (body && prefix)
		json_object_set_new(body, "prefix", json_string(prefix));
	rc = cli_request_print(conn, "destination set", "PUT", "/v1/destination", body, 60);
	json_decref(body);
	return rc;
}

int cmd_destination(int argc, char **argv)
{
	struct cli_conn conn;
	struct creds cr;
	json_t *reply = NULL;
	int rc;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		destination_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	if (strcmp(argv[1], "set") && strcmp(argv[1], "show") && strcmp(argv[1], "test") && strcmp(argv[1], "delete")) {
		fprintf(stderr, "kiln: destination %s: unknown command\n", argv[1]);
		destination_usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[1], "set") && argc != 2) {
		destination_usage(stderr);
		return EXIT_USAGE;
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		return rc;
	if (!strcmp(argv[1], "set"))
		return destination_set(argc - 1, argv + 1, &conn);
	if (!strcmp(argv[1], "show"))
		rc = cli_request(&conn, "destination show", "GET", "/v1/destination", NULL, 30, &reply);
	else if (!strcmp(argv[1], "test"))
		rc = cli_request(&conn, "destination test", "POST", "/v1/destination/test", NULL, 60, &reply);
	else
		rc = cli_request(&conn, "destination delete", "DELETE", "/v1/destination", NULL, 30, &reply);
	if (!rc)
		cli_print_json(reply);
	/* A test whose write was refused: the answer says why; exit 1. */
	if (!rc && !strcmp(argv[1], "test") && !json_is_true(json_object_get(json_object_get(reply, "test"), "ok")))
		rc = EXIT_REFUSED;
	json_decref(reply);
	return rc;
}
