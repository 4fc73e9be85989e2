/* admin: `kiln admin customer create | quota set | key create | key revoke
 * | hosts | drain | undrain`, over kiln-api's admin endpoints (admin key). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "spec.h"

static void admin_usage(FILE *f)
{
	fprintf(f, "usage: kiln admin customer create ID [--name NAME]\n"
		   "       kiln admin quota set CUSTOMER KEY=VALUE...   (e.g. max_running=8 allow_egress=false)\n"
		   "       kiln admin key create CUSTOMER\n"
		   "       kiln admin key revoke KEY_ID|KEY\n"
		   "       kiln admin hosts\n"
		   "       kiln admin drain HOST [--deadline S]   (no new work; sessions paused off it; docs/api.md \"Drain\")\n"
		   "       kiln admin undrain HOST\n"
		   "  Uses KILN_API and KILN_ADMIN_KEY (else the credentials file of `kiln up`).\n");
}

static int name_ok(const char *id)
{
	size_t n = strlen(id);

	return n && n <= 64 && id[0] != '.' &&
	       strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n;
}

/* "8" -> 8, "2.5" -> 2.5, "true"/"false" -> booleans; anything else: NULL. */
static json_t *quota_value(const char *s)
{
	char *end;
	long long n;
	double d;

	if (!strcmp(s, "true"))
		return json_true();
	if (!strcmp(s, "false"))
		return json_false();
	n = strtoll(s, &end, 10);
	if (*s && !*end)
		return json_integer(n);
	d = strtod(s, &end);
	if (*s && !*end)
		return json_real(d);
	return NULL;
}

static int customer_create(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = { { "name", required_argument, 0, 'n' }, { 0, 0, 0, 0 } };
	const char *name = NULL;
	json_t *body;
	int opt, rc;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
		if (opt != 'n') {
			admin_usage(stderr);
			return EXIT_USAGE;
		}
		name = optarg;
	}
	if (optind != argc - 1 || !name_ok(argv[optind])) {
		fprintf(stderr, "kiln: admin customer create: expected one ID of 1-64 [A-Za-z0-9_.-], not starting with '.'\n");
		return EXIT_USAGE;
	}
	body = json_pack("{s:s}", "id", argv[optind]);
	if (name)
		json_object_set_new(body, "name", json_string(name));
	rc = cli_request_print(conn, "admin customer create", "POST", "/v1/admin/customers", body, 30);
	json_decref(body);
	return rc;
}

static int hosts(const struct cli_conn *conn)
{
	json_t *reply = NULL, *h;
	size_t i;
	int rc = cli_request(conn, "admin hosts", "GET", "/v1/admin/hosts", NULL, 30, &reply);

	if (rc)
		return rc;
	printf("%-16s %-8s %-28s %-9s %-12s %-10s %s\n", "ID", "STATE", "URL", "VCPUS", "MEMORY_MIB", "POOL_READY",
	       "LEFT");
	json_array_foreach(json_object_get(reply, "hosts"), i, h) {
		json_t *cap = json_object_get(h, "capacity");
		json_t *v = json_object_get(cap, "vcpus"), *m = json_object_get(cap, "memory_mib");
		char vc[32], mem[48], left[64];

		snprintf(vc, sizeof(vc), "%lld/%lld", (long long)json_integer_value(json_object_get(v, "used")),
			 (long long)json_integer_value(json_object_get(v, "total")));
		snprintf(mem, sizeof(mem), "%lld/%lld", (long long)json_integer_value(json_object_get(m, "used")),
			 (long long)json_integer_value(json_object_get(m, "total")));
		/* A draining host: what it still holds, or "drained". */
		if (!json_is_true(json_object_get(h, "draining")))
			snprintf(left, sizeof(left), "-");
		else if (json_is_true(json_object_get(h, "drained")))
			snprintf(left, sizeof(left), "drained");
		else
			snprintf(left, sizeof(left), "%lld tasks, %lld sessions",
				 (long long)json_integer_value(json_object_get(h, "tasks_left")),
				 (long long)json_integer_value(json_object_get(h, "sessions_left")));
		printf("%-16s %-8s %-28s %-9s %-12s %-10lld %s\n", json_string_value(json_object_get(h, "id")),
		       json_string_value(json_object_get(h, "state")), json_string_value(json_object_get(h, "url")), vc,
		       mem, (long long)json_integer_value(json_object_get(json_object_get(cap, "pool"), "ready")), left);
	}
	json_decref(reply);
	return 0;
}

int cmd_admin(int argc, char **argv)
{
	struct cli_conn conn;
	struct creds cr;
	json_t *reply = NULL, *body;
	char path[256];
	int rc;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		admin_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
#define IS(i, s) (argc > (i) && !strcmp(argv[i], s))
	if (IS(1, "customer") && IS(2, "create")) {
		if (argc < 4) {
			admin_usage(stderr);
			return EXIT_USAGE;
		}
		if ((rc = cli_connect(&cr, 1, &conn)))
			return rc;
		return customer_create(argc - 2, argv + 2, &conn);
	}
	if (IS(1, "hosts") && argc == 2) {
		if ((rc = cli_connect(&cr, 1, &conn)))
			return rc;
		return hosts(&conn);
	}
	if ((IS(1, "drain") || IS(1, "undrain")) && argc >= 3 && name_ok(argv[2])) {
		int drain = IS(1, "drain");
		long deadline = 0;
		char *end;

		if (argc == 5 && drain && !strcmp(argv[3], "--deadline")) {
			deadline = strtol(argv[4], &end, 10);
			if (!*argv[4] || *end || deadline < 1 || deadline > SPEC_DRAIN_DEADLINE_MAX_S) {
				fprintf(stderr, "kiln: admin drain: --deadline: expected seconds, 1-%d\n", SPEC_DRAIN_DEADLINE_MAX_S);
				return EXIT_USAGE;
			}
		} else if (argc != 3) {
			admin_usage(stderr);
			return EXIT_USAGE;
		}
		if ((rc = cli_connect(&cr, 1, &conn)))
			return rc;
		snprintf(path, sizeof(path), "/v1/admin/hosts/%s/%s", argv[2], drain ? "drain" : "undrain");
		body = deadline ? json_pack("{s:I}", "deadline_s", (json_int_t)deadline) : json_object();
		rc = cli_request_print(&conn, drain ? "admin drain" : "admin undrain", "POST", path, body, 30);
		json_decref(body);
		return rc;
	}
	if (IS(1, "quota") && IS(2, "set") && argc >= 5 && name_ok(argv[3])) {
		body = json_object();
		for (int i = 4; i < argc; i++) {
			char *eq = strchr(argv[i], '=');
			json_t *v = eq ? quota_value(eq + 1) : NULL;

			if (!v || eq == argv[i]) {
				fprintf(stderr, "kiln: admin quota set: %s: expected KEY=NUMBER or KEY=true|false\n",
					argv[i]);
				json_decref(body);
				return EXIT_USAGE;
			}
			*eq = '\0';
			json_object_set_new(body, argv[i], v);
			*eq = '=';
		}
		if ((rc = cli_connect(&cr, 1, &conn))) {
			json_decref(body);
			return rc;
		}
		snprintf(path, sizeof(path), "/v1/admin/customers/%s/quotas", argv[3]);
		rc = cli_request_print(&conn, "admin quota set", "PUT", path, body, 30);
		json_decref(body);
		return rc;
	}
	if (IS(1, "key") && (IS(2, "create") || IS(2, "revoke")) && argc == 4 && name_ok(argv[3])) {
		int create = IS(2, "create");

		if ((rc = cli_connect(&cr, 1, &conn)))
			return rc;
		if (create) {
			snprintf(path, sizeof(path), "/v1/admin/customers/%s/keys", argv[3]);
		} else {
			/* A whole key (kiln_<key id>_<secret>) names its id. */
			const char *id = argv[3];
			size_t n = strlen(id);

			if (!strncmp(id, "kiln_", 5) && strchr(id + 5, '_')) {
				id += 5;
				n = (size_t)(strchr(id, '_') - id);
			}
			snprintf(path, sizeof(path), "/v1/admin/keys/%.*s", (int)n, id);
		}
		rc = cli_request(&conn, create ? "admin key create" : "admin key revoke", create ? "POST" : "DELETE",
				 path, NULL, 30, &reply);
		if (!rc && create) {
			/* The key is shown this once: on stdout alone, so that it can be captured. */
			printf("%s\n", json_string_value(json_object_get(reply, "key")));
			fprintf(stderr, "kiln: key %s for customer %s (shown only now)\n",
				json_string_value(json_object_get(reply, "key_id")), argv[3]);
		} else if (!rc) {
			printf("%s revoked\n", argv[3]);
		}
		json_decref(reply);
		return rc;
	}
#undef IS
	admin_usage(stderr);
	return EXIT_USAGE;
}
