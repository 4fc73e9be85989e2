/* session: `kiln session create|exec|put|get|ls|pause|resume|fork|rm|list|info`,
 * over kiln-api's /v1/sessions (docs/api.md, "Sessions"). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "cli.h"
#include "forward.h"
#include "spec.h"
#include "untar.h"

#define PUT_MAX (64u << 20)   /* kiln-api's default body limit */
#define CODE_MAX (1u << 20)
#define STDIN_MAX (16u << 20) /* kiln-host's bound for an exec's stdin */

static void session_usage(FILE *f)
{
	fprintf(f,
		"usage: kiln session create [--memory MiB] [--vcpus N] [--output MiB] [--allow DEST:PORTS]...\n"
		"                           [--idle S] [--lifetime S] [--template NAME] [--json]\n"
		"                           [--volume NAME:PATH[:ro]]...\n"
		"       kiln session create --snapshot SNAP_ID [--idle S] [--lifetime S] [--json]\n"
		"       kiln session exec ID [--env K=V]... [--cwd DIR] [--timeout S] [--stdin FILE|-] [--json]\n"
		"                            -- COMMAND [ARGS...]\n"
		"       kiln session exec ID [options] --code FILE.py|FILE.sh\n"
		"       kiln session put ID LOCAL GUEST        (a relative GUEST is under /work; a LOCAL\n"
		"                                              directory goes up whole, as tar, into GUEST)\n"
		"       kiln session get ID GUEST [LOCAL|-]    (default: GUEST's name in the current directory;\n"
		"                                              GUEST/ with a '/': the whole directory, as tar)\n"
		"       kiln session ls ID [DIR]               (default /work)\n"
		"       kiln session pause|resume|rm|info ID\n"
		"       kiln session fork ID [--count N] [--json]  (N new sessions, 1-20, default 1: one id a line)\n"
		"       kiln session forward ID PORT [LOCAL_PORT]  (127.0.0.1:LOCAL_PORT, default PORT, to PORT\n"
		"                                              in the session: any TCP, like kubectl port-forward)\n"
		"       kiln session list [--all] [--json]\n"
		"  A session is a sandbox that stays up between commands: files and the working\n"
		"  directory's contents persist, each exec is a new process. It ends after --idle\n"
		"  seconds without a command (default 600) or --lifetime seconds (default 3600);\n"
		"  pause saves it to S3 and frees its quota, resume brings it back on any host.\n"
		"  --template: the environment it runs in (default: default; kiln template list).\n"
		"  --volume: mount the volume NAME (kiln volume --help) at PATH, read-write (one session\n"
		"  at a time) or, with :ro, read-only (any number); at most 2.\n"
		"  --snapshot: start from a snapshot (kiln snapshot --help) with its memory, processes\n"
		"  and files; its vCPUs, memory, template and network are the snapshot's.\n"
		"  fork makes N new sessions with the running session's memory, processes and files\n"
		"  at one instant (the session goes on); it exits 1 when any of them was refused\n"
		"  (the others' ids are still printed). A session with a read-write --volume cannot\n"
		"  be forked or snapshotted (409 volume_attached).\n"
		"  --stdin gives the command a file (\"-\": kiln's own stdin, read to its end first) as\n"
		"  its stdin, at most 16 MiB; without it the command's stdin is at EOF.\n"
		"  For an interactive terminal in a session: kiln shell ID (kiln shell --help).\n"
		"  exec exits with the command's exit code (1 when it failed without one or timed\n"
		"  out, 3 when kiln could not run it).\n");
}

/* ---- pure parts (tests/unit/test_cli.c) ---- */

int cli_session_exec_args(int argc, char **argv, struct cli_exec_args *out, char *msg, size_t msg_size)
{
	int i, end = argc;

	memset(out, 0, sizeof(*out));
	for (i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--")) {
			end = i;
			break;
		}
	if (end < argc) {
		out->cmd = argv + end + 1;
		out->ncmd = argc - end - 1;
		if (!out->ncmd) {
			snprintf(msg, msg_size, "nothing after \"--\": name the command to run");
			return -1;
		}
	}
	for (i = 1; i < end; i++) {
		const char *a = argv[i], *v = NULL;
		char name[16];
		size_t n;

		if (strncmp(a, "--", 2)) {
			if (out->id) {
				snprintf(msg, msg_size, "%s: unexpected (the command goes after \"--\")", a);
				return -1;
			}
			out->id = a;
			continue;
		}
		n = strcspn(a + 2, "=");
		snprintf(name, sizeof(name), "%.*s", (int)(n < sizeof(name) - 1 ? n : sizeof(name) - 1), a + 2);
		if (!strcmp(name, "json") && !a[2 + n]) {
			out->json = 1;
			continue;
		}
		if (strcmp(name, "env") && strcmp(name, "cwd") && strcmp(name, "timeout") && strcmp(name, "code") &&
		    strcmp(name, "stdin")) {
			snprintf(msg, msg_size, "%s: unknown option", a);
			return -1;
		}
		if (a[2 + n] == '=')
			v = a + 3 + n;
		else if (i + 1 < end)
			v = argv[++i];
		if (!v) {
			snprintf(msg, msg_size, "--%s: needs a value", name);
			return -1;
		}
		if (!strcmp(name, "env")) {
			const char *eq = strchr(v, '=');

			if (!eq || eq == v) {
				snprintf(msg, msg_size, "--env %s: expected NAME=VALUE", v);
				return -1;
			}
			if (out->nenv == (int)(sizeof(out->env) / sizeof(out->env[0]))) {
				snprintf(msg, msg_size, "--env: at most %d", out->nenv);
				return -1;
			}
			out->env[out->nenv++] = (char *)v;
		} else if (!strcmp(name, "cwd")) {
			out->cwd = v;
		} else if (!strcmp(name, "stdin")) {
			out->stdin_file = v;
		} else if (!strcmp(name, "timeout")) {
			char *e;

			errno = 0;
			out->timeout_s = strtol(v, &e, 10);
			if (errno || *e || e == v || out->timeout_s <= 0) {
				snprintf(msg, msg_size, "--timeout: expected a positive number of seconds, got \"%s\"", v);
				return -1;
			}
		} else {
			const char *ext = strrchr(v, '.');

			out->code_file = v;
			out->language = ext && !strcmp(ext, ".py") ? "python" : ext && !strcmp(ext, ".sh") ? "bash" : NULL;
			if (!out->language) {
				snprintf(msg, msg_size, "--code %s: the language comes from the extension: .py or .sh", v);
				return -1;
			}
		}
	}
	if (!out->id) {
		snprintf(msg, msg_size, "the session ID is missing");
		return -1;
	}
	if (!out->cmd == !out->code_file) {
		snprintf(msg, msg_size, out->cmd ? "give either a command after \"--\" or --code, not both"
						 : "no command: kiln session exec ID -- COMMAND [ARGS...] (or --code FILE)");
		return -1;
	}
	return 0;
}

int cli_guest_path(const char *arg, char *out, size_t size)
{
	int n;

	if (!arg || !*arg)
		return -1;
	n = arg[0] == '/' ? snprintf(out, size, "%s", arg) : snprintf(out, size, "/work/%s", arg);
	return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* The last component of a guest path, or NULL when it names no file. */
static const char *base_name(const char *guest)
{
	const char *b = strrchr(guest, '/');

	b = b ? b + 1 : guest;
	if (!*b || !strcmp(b, ".") || !strcmp(b, ".."))
		return NULL;
	return b;
}

int cli_session_get_target(const char *guest, const char *local, char *out, size_t size)
{
	const char *b = base_name(guest);
	struct stat st;
	int n;

	if (local && strcmp(local, "-") && stat(local, &st) == 0 && S_ISDIR(st.st_mode)) {
		if (!b)
			return -1;
		n = snprintf(out, size, "%s/%s", local, b);
	} else if (local) {
		n = snprintf(out, size, "%s", local);
	} else {
		if (!b)
			return -1;
		n = snprintf(out, size, "%s", b);
	}
	return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* ---- commands ---- */

static void describe(json_t *s)
{
	json_t *lim = json_object_get(s, "limits"), *v;
	size_t i;

	const char *tpl = json_string_value(json_object_get(s, "template"));
	const char *snap = json_string_value(json_object_get(s, "snapshot_id"));

	fprintf(stderr, "kiln: session %s %s%s%s%s%s%s%s (%lld vCPU, %lld MiB; idle limit %lld s, lifetime %lld s)\n",
		json_string_value(json_object_get(s, "id")), json_string_value(json_object_get(s, "state")),
		json_string_value(json_object_get(s, "host")) ? " on " : "",
		json_string_value(json_object_get(s, "host")) ?: "", tpl ? ", template " : "", tpl ? tpl : "",
		snap ? ", from snapshot " : "", snap ? snap : "",
		(long long)json_integer_value(json_object_get(lim, "vcpus")),
		(long long)json_integer_value(json_object_get(lim, "memory_mib")),
		(long long)json_integer_value(json_object_get(s, "idle_timeout_s")),
		(long long)json_integer_value(json_object_get(s, "max_lifetime_s")));
	json_array_foreach(json_object_get(s, "volumes"), i, v)
		fprintf(stderr, "kiln: volume %s (%s) mounted at %s, %s\n",
			json_string_value(json_object_get(v, "name")) ?: "?", json_string_value(json_object_get(v, "id")) ?: "?",
			json_string_value(json_object_get(v, "path")) ?: "?",
			json_is_true(json_object_get(v, "read_only")) ? "read-only" : "read-write");
}

static int session_create(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = {
		{ "memory", required_argument, 0, 'm' }, { "vcpus", required_argument, 0, 'c' },
		{ "output", required_argument, 0, 'o' }, { "idle", required_argument, 0, 'i' },
		{ "lifetime", required_argument, 0, 'l' }, { "allow", required_argument, 0, 'a' },
		{ "template", required_argument, 0, 'T' }, { "snapshot", required_argument, 0, 'S' },
		{ "volume", required_argument, 0, 'V' }, { "json", no_argument, 0, 'j' }, { 0, 0, 0, 0 },
	};
	json_t *body = json_object(), *limits = json_object(), *allow = json_array(), *vols = json_array(), *reply = NULL;
	struct kiln_err terr = { .code = "" };
	int opt, json = 0, rc = EXIT_USAGE, shaped = 0; /* shaped: --memory, --vcpus, --template or --allow */

	optind = 1;
	while ((opt = getopt_long(argc, argv, "m:c:o:i:l:a:T:S:V:j", opts, NULL)) != -1) {
		if (opt == 'm' || opt == 'c' || opt == 'T' || opt == 'a')
			shaped = 1;
		const char *key = opt == 'm' ? "memory_mib" : opt == 'c' ? "vcpus" : opt == 'o' ? "output_mib"
				: opt == 'i' ? "idle_timeout_s" : "max_lifetime_s";
		char *end;
		long n;

		switch (opt) {
		case 'm':
		case 'c':
		case 'o':
		case 'i':
		case 'l':
			errno = 0;
			n = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || n <= 0) {
				fprintf(stderr, "kiln: session create: expected a positive integer, got \"%s\"\n", optarg);
				goto out;
			}
			json_object_set_new(opt == 'i' || opt == 'l' ? body : limits, key, json_integer(n));
			break;
		case 'a':
			json_array_append_new(allow, json_string(optarg));
			break;
		case 'T':
			if (spec_template_name_check(optarg, "template", &terr) < 0) {
				fprintf(stderr, "kiln: session create: --template %s: not a template name (1-63 of "
					"a-z 0-9 . _ - starting with a letter or digit)\n", optarg);
				goto out;
			}
			json_object_set_new(body, "template", json_string(optarg));
			break;
		case 'S':
			if (!cli_id_ok(optarg)) {
				fprintf(stderr, "kiln: session create: --snapshot %s: not a snapshot id (snap_...)\n", optarg);
				goto out;
			}
			json_object_set_new(body, "snapshot", json_string(optarg));
			break;
		case 'V': {
			char why[320];
			json_t *m = cli_volume_mount(optarg, why, sizeof(why));

			if (!m) {
				fprintf(stderr, "kiln: session create: --volume: %s\n", why);
				goto out;
			}
			json_array_append_new(vols, m);
			break;
		}
		case 'j':
			json = 1;
			break;
		default:
			session_usage(stderr);
			goto out;
		}
	}
	if (json_array_size(vols) > 2) {
		/* kiln-api's bound (every VM has two volume slots): say it before asking. */
		fprintf(stderr, "kiln: session create: at most 2 --volume\n");
		goto out;
	}
	if (optind != argc) {
		session_usage(stderr);
		goto out;
	}
	if (shaped && json_object_get(body, "snapshot")) {
		/* kiln-api refuses them too (400): say it before asking. */
		fprintf(stderr, "kiln: session create: --snapshot gives the session its vCPUs, memory, template and "
			"network: --memory, --vcpus, --template and --allow cannot go with it\n");
		goto out;
	}
	if (json_object_size(limits))
		json_object_set(body, "limits", limits);
	if (json_array_size(allow))
		json_object_set_new(body, "network", json_pack("{s:s, s:O}", "egress", "allow", "allow", allow));
	if (json_array_size(vols))
		json_object_set(body, "volumes", vols);
	if ((rc = cli_request(conn, "session create", "POST", "/v1/sessions", body, 180, &reply)))
		goto out;
	if (json) {
		cli_print_json(reply);
	} else {
		/* The id alone on stdout, so that a script can capture it. */
		printf("%s\n", json_string_value(json_object_get(reply, "id")));
		describe(reply);
	}
out:
	json_decref(body);
	json_decref(limits);
	json_decref(allow);
	json_decref(vols);
	json_decref(reply);
	return rc;
}

/* kiln session fork ID [--count N] [--json]: POST /v1/sessions/{id}/fork.
 * The children's ids on stdout, one a line; each refusal on stderr; exit 1
 * when any child was refused. */
static int session_fork(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = { { "count", required_argument, 0, 'n' }, { "json", no_argument, 0, 'j' },
					      { 0, 0, 0, 0 } };
	json_t *body, *reply = NULL, *v;
	const char *id;
	char path[128], *end;
	int opt, json = 0, rc;
	long count = 1;
	size_t i, made, refused;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "n:j", opts, NULL)) != -1) {
		if (opt == 'n') {
			errno = 0;
			count = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || count < 1 || count > 20) {
				fprintf(stderr, "kiln: session fork: --count: expected 1 to 20, got \"%s\"\n", optarg);
				return EXIT_USAGE;
			}
		} else if (opt == 'j') {
			json = 1;
		} else {
			session_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc - 1 || !cli_id_ok(argv[optind])) {
		session_usage(stderr);
		return EXIT_USAGE;
	}
	id = argv[optind];
	snprintf(path, sizeof(path), "/v1/sessions/%s/fork", id);
	body = json_pack("{s:i}", "count", (int)count);
	/* Children are admitted one by one, each a restore: allow them time. */
	rc = cli_request(conn, "session fork", "POST", path, body, 960, &reply);
	json_decref(body);
	if (rc)
		return rc;
	made = json_array_size(json_object_get(reply, "sessions"));
	refused = json_array_size(json_object_get(reply, "errors"));
	if (json) {
		cli_print_json(reply);
	} else {
		/* The ids alone on stdout, so that a script can read them. */
		json_array_foreach(json_object_get(reply, "sessions"), i, v)
			printf("%s\n", json_string_value(json_object_get(v, "id")) ?: "?");
		fprintf(stderr, "kiln: session fork: %s: %zu of %ld %s made (the parent stopped %lld ms)\n", id, made,
			count, count == 1 ? "child" : "children",
			(long long)json_integer_value(json_object_get(reply, "stop_ms")));
	}
	json_array_foreach(json_object_get(reply, "errors"), i, v)
		fprintf(stderr, "kiln: session fork: a child was refused: %s: %s\n",
			json_string_value(json_object_get(v, "code")) ?: "error",
			json_string_value(json_object_get(v, "message")) ?: "(no message)");
	json_decref(reply);
	return refused || !made ? EXIT_REFUSED : 0;
}

struct exec_view {
	json_t *result;
	int at_line_start;
};

static int on_exec_event(void *ctx, const char *name, json_t *data)
{
	struct exec_view *v = ctx;

	if (!strcmp(name, "stdout") || !strcmp(name, "stderr")) {
		const char *d = json_string_value(json_object_get(data, "data"));
		size_t n = d ? strlen(d) : 0;
		FILE *out = name[3] == 'o' ? stdout : stderr;

		if (n) {
			fwrite(d, 1, n, out);
			fflush(out);
		}
	} else if (!strcmp(name, "result")) {
		json_decref(v->result);
		v->result = json_incref(data);
	} else if (!strcmp(name, "error")) {
		fprintf(stderr, "kiln: session exec: %s\n",
			json_string_value(json_object_get(data, "message")) ?: "the stream failed");
	}
	return 0;
}

int cli_exec_status(json_t *res)
{
	const char *st = json_string_value(json_object_get(res, "state"));
	json_t *code = json_object_get(res, "exit_code");

	if (!st || !strcmp(st, "error"))
		return EXIT_INFRA;
	if (!strcmp(st, "succeeded"))
		return 0;
	if (json_is_integer(code) && json_integer_value(code) > 0 && json_integer_value(code) < 256)
		return (int)json_integer_value(code);
	return 1;
}

/* The file ("-": our stdin, to its end) as base64 (malloc'd), or NULL with why printed. */
static char *stdin_b64(const char *file)
{
	unsigned char *data = NULL;
	size_t len = 0;
	char *b64;

	if (!strcmp(file, "-")) {
		size_t cap = 0, n;

		do {
			if (len == cap) {
				unsigned char *p;

				cap = cap ? cap * 2 : 65536;
				if (cap > STDIN_MAX + 1)
					cap = STDIN_MAX + 1;
				p = realloc(data, cap);
				if (!p) {
					free(data);
					return NULL;
				}
				data = p;
			}
			n = fread(data + len, 1, cap - len, stdin);
			len += n;
		} while (n && len <= STDIN_MAX);
		if (len > STDIN_MAX) {
			fprintf(stderr, "kiln: --stdin -: more than %u MiB\n", STDIN_MAX >> 20);
			free(data);
			return NULL;
		}
	} else if (!(data = cli_read_file(file, STDIN_MAX, &len, NULL))) {
		return NULL;
	}
	b64 = malloc(4 * ((len + 2) / 3) + 1);
	if (b64)
		EVP_EncodeBlock((unsigned char *)b64, data ? data : (unsigned char *)"", (int)len);
	free(data);
	return b64;
}

static int session_exec(int argc, char **argv, const struct cli_conn *conn)
{
	struct cli_exec_args a;
	struct kiln_err err = { .code = "" };
	struct exec_view v = { .at_line_start = 1 };
	json_t *body, *reply = NULL;
	unsigned char *code = NULL;
	char msg[300], path[128];
	int rc;

	if (cli_session_exec_args(argc, argv, &a, msg, sizeof(msg)) < 0) {
		fprintf(stderr, "kiln: session exec: %s\n", msg);
		session_usage(stderr);
		return EXIT_USAGE;
	}
	if (!cli_id_ok(a.id)) {
		fprintf(stderr, "kiln: session exec: %s: not a session id\n", a.id);
		return EXIT_USAGE;
	}
	body = json_object();
	if (a.cmd) {
		json_t *argvj = json_array();

		for (int i = 0; i < a.ncmd; i++)
			json_array_append_new(argvj, json_string(a.cmd[i]));
		json_object_set_new(body, "argv", argvj);
	} else {
		size_t len;

		code = cli_read_file(a.code_file, CODE_MAX, &len, NULL);
		if (!code) {
			json_decref(body);
			return EXIT_USAGE;
		}
		json_object_set_new(body, "language", json_string(a.language));
		json_object_set_new(body, "code", json_stringn((char *)code, len));
		free(code);
		if (!json_string_value(json_object_get(body, "code"))) {
			fprintf(stderr, "kiln: %s: not valid UTF-8\n", a.code_file);
			json_decref(body);
			return EXIT_USAGE;
		}
	}
	if (a.nenv) {
		json_t *env = json_object();

		for (int i = 0; i < a.nenv; i++) {
			char *eq = strchr(a.env[i], '=');

			*eq = '\0';
			json_object_set_new(env, a.env[i], json_string(eq + 1));
			*eq = '=';
		}
		json_object_set_new(body, "env", env);
	}
	if (a.cwd)
		json_object_set_new(body, "cwd", json_string(a.cwd));
	if (a.stdin_file) {
		char *b64 = stdin_b64(a.stdin_file);

		if (!b64) {
			json_decref(body);
			return EXIT_USAGE;
		}
		json_object_set_new(body, "stdin_b64", json_string(b64));
		free(b64);
	}
	if (a.timeout_s)
		json_object_set_new(body, "timeout_s", json_integer(a.timeout_s));
	if (a.json) {
		snprintf(path, sizeof(path), "/v1/sessions/%s/exec", a.id);
		rc = cli_request(conn, "session exec", "POST", path, body, (a.timeout_s ? a.timeout_s : 30) + 120, &reply);
		json_decref(body);
		if (rc)
			return rc;
		cli_print_json(reply);
		rc = cli_exec_status(reply);
		json_decref(reply);
		return rc;
	}
	snprintf(path, sizeof(path), "/v1/sessions/%s/exec?stream=1", a.id);
	rc = http_follow_body(conn, "POST", path, body, 60, on_exec_event, NULL, &v, &err);
	json_decref(body);
	if (rc < 0) {
		fprintf(stderr, "kiln: session exec: %s\n", err.message);
		json_decref(v.result);
		return err.errc != KERR_HTTP ? EXIT_INFRA : EXIT_REFUSED;
	}
	if (!v.result) {
		fprintf(stderr, "kiln: session exec: the stream ended without a result\n");
		return EXIT_INFRA;
	}
	rc = cli_exec_status(v.result);
	if (rc) {
		const char *st = json_string_value(json_object_get(v.result, "state"));
		const char *reason = json_string_value(json_object_get(v.result, "end_reason"));

		fprintf(stderr, "kiln: %s%s%s\n", st ? st : "no state", reason ? ", " : "", reason ? reason : "");
	}
	json_decref(v.result);
	return rc;
}

/* "/v1/sessions/ID/files?KEY=<guest, escaped>" */
static int files_path(const char *id, const char *key, const char *guest, char *out, size_t size)
{
	char *enc = curl_easy_escape(NULL, guest, 0);
	int n;

	if (!enc)
		return -1;
	n = snprintf(out, size, "/v1/sessions/%s/files?%s=%s", id, key, enc);
	curl_free(enc);
	return n < 0 || (size_t)n >= size ? -1 : 0;
}

static int report(const char *what, int status, json_t *reply, const struct kiln_err *err)
{
	char msg[700];

	if (status < 0) {
		fprintf(stderr, "kiln: %s: %s\n", what, err->message);
		return EXIT_INFRA;
	}
	http_describe_error(status, reply, msg, sizeof(msg));
	fprintf(stderr, "kiln: %s: %s\n", what, msg);
	return EXIT_REFUSED;
}

extern char **environ;

/* Run tar with argv (argv[0] "tar"); with out, its stdout is read into a
 * malloc'd *out (at most max bytes). 0, or -1 with why printed. */
static int local_tar(char *const argv[], unsigned char **out, size_t *len, size_t max)
{
	posix_spawn_file_actions_t fa;
	int p[2] = { -1, -1 }, st, r = -1;
	size_t cap = 0;
	pid_t pid;

	if (out) {
		*out = NULL;
		*len = 0;
		if (pipe2(p, O_CLOEXEC) < 0)
			return -1;
	}
	posix_spawn_file_actions_init(&fa);
	if (out)
		posix_spawn_file_actions_adddup2(&fa, p[1], STDOUT_FILENO);
	st = posix_spawnp(&pid, "tar", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (out)
		close(p[1]);
	if (st) {
		fprintf(stderr, "kiln: cannot run tar: %s\n", strerror(st));
		if (out)
			close(p[0]);
		return -1;
	}
	while (out) {
		ssize_t n;

		if (*len == cap) {
			size_t ncap = cap ? cap * 2 : 65536;
			unsigned char *b;

			if (cap > max)
				break; /* over the bound: read no further (tar gets SIGPIPE) */
			if (ncap > max + 1)
				ncap = max + 1;
			b = realloc(*out, ncap);
			if (!b)
				break;
			*out = b;
			cap = ncap;
		}
		n = read(p[0], *out + *len, cap - *len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		*len += (size_t)n;
	}
	if (out)
		close(p[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (out && *len > max)
		fprintf(stderr, "kiln: the archive is larger than %zu MiB\n", max >> 20);
	else if (!WIFEXITED(st) || WEXITSTATUS(st))
		fprintf(stderr, "kiln: tar failed (see above)\n");
	else
		r = 0;
	if (r && out) {
		free(*out);
		*out = NULL;
	}
	return r;
}

/* put LOCALDIR GUESTDIR: the directory's contents as one tar archive. */
static int session_put_dir(const char *id, const char *local, const char *guest, const struct cli_conn *conn)
{
	struct kiln_err err = { .code = "" };
	char *argv[] = { "tar", "-C", (char *)local, "-cf", "-", ".", NULL };
	char path[16384];
	unsigned char *data;
	json_t *reply = NULL;
	size_t len;
	int st, rc = 0;

	if (files_path(id, "dir", guest, path, sizeof(path) - 16) < 0) {
		fprintf(stderr, "kiln: session put: %s: not a usable guest path\n", guest);
		return EXIT_USAGE;
	}
	strcat(path, "&format=tar");
	if (local_tar(argv, &data, &len, PUT_MAX) < 0)
		return EXIT_USAGE;
	st = http_send(conn, "PUT", path, data, len, "application/x-tar", 300, &reply, &err);
	free(data);
	if (st >= 200 && st < 300)
		fprintf(stderr, "kiln: %s/ -> %s:%s/ (%zu bytes of tar)\n", local, id, guest, len);
	else
		rc = report("session put", st, reply, &err);
	json_decref(reply);
	return rc;
}

/* get GUESTDIR/ [LOCALDIR]: the guest directory as tar, unpacked into
 * LOCALDIR (created; default: the guest directory's name here). */
static int session_get_dir(const char *id, const char *guest, const char *local_arg, const struct cli_conn *conn)
{
	struct kiln_err err = { .code = "" };
	char dir[4200], local[4300], tmp[4400], path[16384];
	const char *name;
	json_t *reply = NULL;
	int st, rc = 0;

	snprintf(dir, sizeof(dir), "%s", guest);
	while (strlen(dir) > 1 && dir[strlen(dir) - 1] == '/')
		dir[strlen(dir) - 1] = '\0';
	name = strrchr(dir, '/') + 1;
	snprintf(local, sizeof(local), "%s", local_arg ? local_arg : *name ? name : ".");
	if (files_path(id, "dir", dir, path, sizeof(path) - 16) < 0) {
		fprintf(stderr, "kiln: session get: %s: not a usable guest path\n", guest);
		return EXIT_USAGE;
	}
	strcat(path, "&format=tar");
	if (mkdir(local, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "kiln: session get: %s: %s\n", local, strerror(errno));
		return EXIT_USAGE;
	}
	snprintf(tmp, sizeof(tmp), "%s/.kiln-get.tar", local);
	st = http_get_file(conn, path, tmp, 300, &reply, &err);
	if (st == 200) {
		/* The archive is the guest's: only files and directories, no
		 * owners, no setuid bits, nothing outside local (untar.h). */
		struct untar_report rep;

		if (untar_safe(tmp, local, &rep, &err) < 0) {
			fprintf(stderr, "kiln: session get: %s\n", err.message);
			rc = EXIT_INFRA;
		} else {
			fprintf(stderr, "kiln: %s:%s/ -> %s/ (%zu files, %zu directories)\n", id, dir, local, rep.files,
				rep.dirs);
			if (rep.skipped)
				fprintf(stderr,
					"kiln: session get: %zu entries left out (links, devices, FIFOs, sockets or paths "
					"leaving %s/), the first: %s\n",
					rep.skipped, local, rep.first_skipped);
		}
		unlink(tmp);
	} else {
		rc = report("session get", st, reply, &err);
	}
	json_decref(reply);
	return rc;
}

static int session_put(const char *id, const char *local, const char *guest_arg, const struct cli_conn *conn)
{
	struct kiln_err err = { .code = "" };
	char guest[4200], path[16384];
	unsigned char *data;
	json_t *reply = NULL;
	size_t len;
	int st, rc = 0;

	struct stat stl;

	if (cli_guest_path(guest_arg, guest, sizeof(guest)) < 0 || files_path(id, "path", guest, path, sizeof(path)) < 0) {
		fprintf(stderr, "kiln: session put: %s: not a usable guest path\n", guest_arg);
		return EXIT_USAGE;
	}
	if (stat(local, &stl) == 0 && S_ISDIR(stl.st_mode))
		return session_put_dir(id, local, guest, conn);
	data = cli_read_file(local, PUT_MAX, &len, NULL);
	if (!data)
		return EXIT_USAGE;
	st = http_send(conn, "PUT", path, data, len, "application/octet-stream", 300, &reply, &err);
	free(data);
	if (st >= 200 && st < 300)
		fprintf(stderr, "kiln: %s -> %s:%s (%zu bytes)\n", local, id, guest, len);
	else
		rc = report("session put", st, reply, &err);
	json_decref(reply);
	return rc;
}

static int session_get(const char *id, const char *guest_arg, const char *local_arg, const struct cli_conn *conn)
{
	struct kiln_err err = { .code = "" };
	char guest[4200], local[4300], path[16384];
	json_t *reply = NULL;
	int st, rc = 0;

	if (cli_guest_path(guest_arg, guest, sizeof(guest)) < 0 || files_path(id, "path", guest, path, sizeof(path)) < 0) {
		fprintf(stderr, "kiln: session get: %s: not a usable guest path\n", guest_arg);
		return EXIT_USAGE;
	}
	/* A trailing '/' asks for the whole directory. */
	if (guest[strlen(guest) - 1] == '/' && (!local_arg || strcmp(local_arg, "-")))
		return session_get_dir(id, guest, local_arg, conn);
	if (cli_session_get_target(guest, local_arg, local, sizeof(local)) < 0) {
		fprintf(stderr, "kiln: session get: %s names no file: give LOCAL\n", guest_arg);
		return EXIT_USAGE;
	}
	st = http_get_file(conn, path, local, 300, &reply, &err);
	if (st == 200) {
		if (strcmp(local, "-"))
			fprintf(stderr, "kiln: %s:%s -> %s\n", id, guest, local);
	} else {
		rc = report("session get", st, reply, &err);
	}
	json_decref(reply);
	return rc;
}

static int session_ls(const char *id, const char *dir_arg, const struct cli_conn *conn)
{
	char dir[4200], path[16384];
	json_t *reply = NULL, *e;
	size_t i;
	int rc;

	if (cli_guest_path(dir_arg ? dir_arg : "/work", dir, sizeof(dir)) < 0 ||
	    files_path(id, "dir", dir, path, sizeof(path)) < 0) {
		fprintf(stderr, "kiln: session ls: %s: not a usable guest path\n", dir_arg);
		return EXIT_USAGE;
	}
	if ((rc = cli_request(conn, "session ls", "GET", path, NULL, 60, &reply)))
		return rc;
	json_array_foreach(json_object_get(reply, "entries"), i, e)
		printf("%-5s %12lld  %s\n", json_string_value(json_object_get(e, "type")) ?: "?",
		       (long long)json_integer_value(json_object_get(e, "size")),
		       json_string_value(json_object_get(e, "name")) ?: "?");
	json_decref(reply);
	return 0;
}

static int session_list(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = { { "all", no_argument, 0, 'a' }, { "json", no_argument, 0, 'j' },
					      { 0, 0, 0, 0 } };
	json_t *reply = NULL, *s;
	int opt, all = 0, json = 0, rc;
	size_t i;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "aj", opts, NULL)) != -1) {
		if (opt == 'a') {
			all = 1;
		} else if (opt == 'j') {
			json = 1;
		} else {
			session_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc) {
		session_usage(stderr);
		return EXIT_USAGE;
	}
	if ((rc = cli_request(conn, "session list", "GET", all ? "/v1/sessions?limit=100&state=all" : "/v1/sessions?limit=100",
			      NULL, 30, &reply)))
		return rc;
	if (json) {
		cli_print_json(reply);
		json_decref(reply);
		return 0;
	}
	printf("%-34s %-10s %-10s %-5s %-7s %-13s %s\n", "ID", "STATE", "HOST", "VCPUS", "MEM_MIB", "END", "CREATED");
	json_array_foreach(json_object_get(reply, "sessions"), i, s) {
		json_t *lim = json_object_get(s, "limits");
		const char *host = json_string_value(json_object_get(s, "host"));
		const char *er = json_string_value(json_object_get(s, "end_reason"));
		time_t secs = (time_t)(json_integer_value(json_object_get(s, "created_at")) / 1000);
		char when[64] = "";
		struct tm tm;

		if (localtime_r(&secs, &tm))
			strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
		printf("%-34s %-10s %-10s %-5lld %-7lld %-13s %s\n", json_string_value(json_object_get(s, "id")),
		       json_string_value(json_object_get(s, "state")), host ? host : "-",
		       (long long)json_integer_value(json_object_get(lim, "vcpus")),
		       (long long)json_integer_value(json_object_get(lim, "memory_mib")), er ? er : "-", when);
	}
	json_decref(reply);
	return 0;
}

int cmd_session(int argc, char **argv)
{
	struct cli_conn conn;
	struct creds cr;
	json_t *reply = NULL;
	const char *verb;
	char path[128];
	int rc;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		session_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	verb = argv[1];
#define VERB(s) (!strcmp(verb, s))
	/* Usage is checked before any configuration is looked for. */
	if (VERB("create") || VERB("list") || VERB("fork")) {
		/* options checked by getopt below */
	} else if (VERB("exec")) {
		if (argc < 3) {
			session_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (VERB("pause") || VERB("resume") || VERB("rm") || VERB("info")) {
		if (argc != 3 || !cli_id_ok(argv[2])) {
			session_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (VERB("put")) {
		if (argc != 5 || !cli_id_ok(argv[2])) {
			session_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (VERB("get")) {
		if ((argc != 4 && argc != 5) || !cli_id_ok(argv[2])) {
			session_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (VERB("ls")) {
		if ((argc != 3 && argc != 4) || !cli_id_ok(argv[2])) {
			session_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (VERB("forward")) {
		char *e1 = NULL, *e2 = NULL;
		long p = argc >= 4 ? strtol(argv[3], &e1, 10) : 0, lp = argc == 5 ? strtol(argv[4], &e2, 10) : -1;

		if ((argc != 4 && argc != 5) || !cli_id_ok(argv[2]) || !e1 || *e1 || p < 1 || p > 65535 ||
		    (argc == 5 && (!e2 || *e2 || lp < 0 || lp > 65535))) {
			session_usage(stderr);
			return EXIT_USAGE;
		}
		if ((rc = cli_connect(&cr, 0, &conn)))
			return rc;
		return session_forward(argv[2], (unsigned)p, (int)lp, &conn);
	} else if (VERB("shell")) {
		return cmd_shell(argc - 1, argv + 1);
	} else {
		fprintf(stderr, "kiln: session %s: unknown command\n", verb);
		session_usage(stderr);
		return EXIT_USAGE;
	}
	if (VERB("exec")) {
		/* Parse before connecting: bad usage is 2 even without configuration. */
		struct cli_exec_args a;
		char msg[300];

		if (cli_session_exec_args(argc - 1, argv + 1, &a, msg, sizeof(msg)) < 0) {
			fprintf(stderr, "kiln: session exec: %s\n", msg);
			session_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		return rc;
	if (VERB("create"))
		return session_create(argc - 1, argv + 1, &conn);
	if (VERB("list"))
		return session_list(argc - 1, argv + 1, &conn);
	if (VERB("fork"))
		return session_fork(argc - 1, argv + 1, &conn);
	if (VERB("exec"))
		return session_exec(argc - 1, argv + 1, &conn);
	if (VERB("put"))
		return session_put(argv[2], argv[3], argv[4], &conn);
	if (VERB("get"))
		return session_get(argv[2], argv[3], argc == 5 ? argv[4] : NULL, &conn);
	if (VERB("ls"))
		return session_ls(argv[2], argc == 4 ? argv[3] : NULL, &conn);
	if (VERB("info")) {
		snprintf(path, sizeof(path), "/v1/sessions/%s", argv[2]);
		if ((rc = cli_request(&conn, "session info", "GET", path, NULL, 30, &reply)))
			return rc;
		cli_print_json(reply);
		json_decref(reply);
		return 0;
	}
	if (VERB("rm"))
		snprintf(path, sizeof(path), "/v1/sessions/%s", argv[2]);
	else
		snprintf(path, sizeof(path), "/v1/sessions/%s/%s", argv[2], verb);
	/* pause and resume move the VM through S3: allow them time. */
	if ((rc = cli_request(&conn, VERB("rm") ? "session rm" : VERB("pause") ? "session pause" : "session resume",
			      VERB("rm") ? "DELETE" : "POST", path, NULL, 960, &reply)))
		return rc;
	printf("%s %s%s%s\n", argv[2], json_string_value(json_object_get(reply, "state")) ?: "?",
	       json_string_value(json_object_get(reply, "host")) ? " on " : "",
	       json_string_value(json_object_get(reply, "host")) ?: "");
	json_decref(reply);
	return 0;
#undef VERB
}
