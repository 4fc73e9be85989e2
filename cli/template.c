/* template: `kiln template build|list|get|rm` over kiln-api's templates
 * (docs/templates.md): a recipe sent as JSON (a file, or made from flags), or
 * an OCI archive streamed from disk as the body; then the build followed live
 * (GET /v1/templates/{name}/events) until it is ready or failed. */
#include <errno.h>
#include <getopt.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "recipe.h"
#include "spec.h"

#define POLL_MS 2000            /* GET between states when the event stream is lost */
#define EVENTS_STALL_S 60       /* kiln-api sends a keep-alive every 15 s */
#define UPLOAD_STALL_S 120      /* an upload that moves nothing for this long fails */

static void template_usage(FILE *f)
{
	fprintf(f,
		"usage: kiln template build RECIPE.json [--name N] [--no-wait] [--json]\n"
		"       kiln template build --name N [--packages P1,P2,...]... [--run CMD]...\n"
		"                           [--file LOCAL:/GUEST/PATH]... [--preload MOD,...]...\n"
		"                           [--env K=V]... [--workdir DIR] [--no-wait] [--json]\n"
		"       kiln template build --name N --oci IMAGE.tar [--no-wait] [--json]\n"
		"       kiln template list [--json]\n"
		"       kiln template get NAME [--json]\n"
		"       kiln template rm NAME\n"
		"  A template is the environment tasks and sessions run in (kiln run --template N,\n"
		"  kiln session create --template N; docs/templates.md). build sends a recipe (Debian\n"
		"  packages installed over the default image, files written, shell commands run as root\n"
		"  in a build VM, Python modules preloaded), or an OCI archive (docker save / podman\n"
		"  save / an OCI layout tar, streamed from disk), then prints the build log live and\n"
		"  ends with the template's state, size and sha256: exit 0 when it is ready, 1 when\n"
		"  the build failed (the error printed). --no-wait returns once the build is queued.\n"
		"  Packages come from the Debian mirror the host reaches: `kiln up --egress`.\n");
}

/* ---- the arguments of `kiln template build` (pure) ---- */

/* Split "a,b c" into words appended to arr (JSON strings); empty words are
 * skipped. -1 with msg when one is longer than max or there would be more than
 * limit. */
static int split_words(const char *arg, json_t *arr, size_t max, size_t limit, const char *what, char *msg,
		       size_t msg_size)
{
	const char *p = arg;

	while (*p) {
		size_t n;
		char w[256];

		p += strspn(p, ", \t\n");
		n = strcspn(p, ", \t\n");
		if (!n)
			break;
		if (n > max || n >= sizeof(w)) {
			snprintf(msg, msg_size, "--%s: \"%.*s...\" is longer than %zu bytes", what, 40, p, max);
			return -1;
		}
		if (json_array_size(arr) >= limit) {
			snprintf(msg, msg_size, "--%s: more than %zu", what, limit);
			return -1;
		}
		memcpy(w, p, n);
		w[n] = '\0';
		json_array_append_new(arr, json_string(w));
		p += n;
	}
	return 0;
}

static int count_add(int *n, int max, const char *what, char *msg, size_t msg_size)
{
	if (*n >= max) {
		snprintf(msg, msg_size, "--%s: at most %d", what, max);
		return -1;
	}
	(*n)++;
	return 0;
}

static int build_args(int argc, char **argv, struct cli_template_args *out, char *msg, size_t msg_size);

int cli_template_build_args(int argc, char **argv, struct cli_template_args *out, char *msg, size_t msg_size)
{
	int saved = opterr, r;

	opterr = 0; /* the message is ours (msg) */
	r = build_args(argc, argv, out, msg, msg_size);
	opterr = saved;
	return r;
}

static int build_args(int argc, char **argv, struct cli_template_args *out, char *msg, size_t msg_size)
{
	static const struct option opts[] = {
		{ "name", required_argument, 0, 'n' },     { "packages", required_argument, 0, 'p' },
		{ "run", required_argument, 0, 'r' },      { "file", required_argument, 0, 'f' },
		{ "preload", required_argument, 0, 'P' },  { "env", required_argument, 0, 'e' },
		{ "workdir", required_argument, 0, 'w' },  { "oci", required_argument, 0, 'o' },
		{ "no-wait", no_argument, 0, 'W' },        { "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },           { 0, 0, 0, 0 },
	};
	struct kiln_err err = { .code = "" };
	int opt, recipe_flags = 0;

	memset(out, 0, sizeof(*out));
	msg[0] = '\0';
	optind = 1;
	while ((opt = getopt_long(argc, argv, ":n:p:r:f:P:e:w:o:Wjh", opts, NULL)) != -1) {
		switch (opt) {
		case 'n':
			out->name = optarg;
			break;
		case 'p':
			if (count_add(&out->npackages, CLI_TEMPLATE_MAX_ARGS, "packages", msg, msg_size) < 0)
				return -1;
			out->packages[out->npackages - 1] = optarg;
			recipe_flags = 1;
			break;
		case 'r':
			if (!*optarg) {
				snprintf(msg, msg_size, "--run: an empty command");
				return -1;
			}
			if (count_add(&out->nrun, RECIPE_MAX_RUN, "run", msg, msg_size) < 0)
				return -1;
			out->run[out->nrun - 1] = optarg;
			recipe_flags = 1;
			break;
		case 'f': {
			const char *colon = strrchr(optarg, ':');

			if (!colon || colon == optarg || colon[1] != '/') {
				snprintf(msg, msg_size, "--file %s: expected LOCAL:/ABSOLUTE/GUEST/PATH", optarg);
				return -1;
			}
			if (count_add(&out->nfiles, RECIPE_MAX_FILES, "file", msg, msg_size) < 0)
				return -1;
			out->files[out->nfiles - 1] = optarg;
			recipe_flags = 1;
			break;
		}
		case 'P':
			if (count_add(&out->npreload, CLI_TEMPLATE_MAX_ARGS, "preload", msg, msg_size) < 0)
				return -1;
			out->preload[out->npreload - 1] = optarg;
			recipe_flags = 1;
			break;
		case 'e':
			if (!strchr(optarg, '=') || optarg[0] == '=') {
				snprintf(msg, msg_size, "--env %s: expected NAME=VALUE", optarg);
				return -1;
			}
			if (count_add(&out->nenv, RECIPE_MAX_ENV, "env", msg, msg_size) < 0)
				return -1;
			out->env[out->nenv - 1] = optarg;
			recipe_flags = 1;
			break;
		case 'w':
			if (optarg[0] != '/') {
				snprintf(msg, msg_size, "--workdir %s: expected an absolute path", optarg);
				return -1;
			}
			out->workdir = optarg;
			recipe_flags = 1;
			break;
		case 'o':
			out->oci = optarg;
			break;
		case 'W':
			out->no_wait = 1;
			break;
		case 'j':
			out->json = 1;
			break;
		case 'h':
			out->help = 1;
			return 0;
		case ':':
			snprintf(msg, msg_size, "%s: expects a value", argv[optind - 1]);
			return -1;
		default:
			snprintf(msg, msg_size, "%s: unknown option", argv[optind - 1]);
			return -1;
		}
	}
	if (optind < argc)
		out->recipe_file = argv[optind++];
	if (optind < argc) {
		snprintf(msg, msg_size, "%s: one recipe file at most", argv[optind]);
		return -1;
	}
	if (out->name && spec_template_name_check(out->name, "--name", &err) < 0) {
		snprintf(msg, msg_size, "--name %s: a template name is 1-63 of a-z 0-9 . _ - starting with a letter "
			 "or digit", out->name);
		return -1;
	}
	if (out->oci && (out->recipe_file || recipe_flags)) {
		snprintf(msg, msg_size, "--oci: an image archive is the whole template: no recipe file or recipe flags");
		return -1;
	}
	if (out->recipe_file && recipe_flags) {
		snprintf(msg, msg_size, "%s: a recipe file, or recipe flags (--packages, --run, ...), not both",
			 out->recipe_file);
		return -1;
	}
	if (!out->oci && !out->recipe_file && !recipe_flags) {
		snprintf(msg, msg_size, "nothing to build: give RECIPE.json, --packages/--run/--file/... or --oci");
		return -1;
	}
	if (!out->name && !out->recipe_file) {
		snprintf(msg, msg_size, "--name is needed (the template's name)");
		return -1;
	}
	return 0;
}

/* A recipe "files" entry from "LOCAL:/GUEST": the local file's bytes in
 * base64, its permission bits as the mode. NULL with msg. */
static json_t *recipe_file_entry(const char *arg, size_t *total, char *msg, size_t msg_size)
{
	const char *colon = strrchr(arg, ':');
	char local[4096];
	unsigned char *data = NULL;
	char *b64 = NULL;
	json_t *e = NULL;
	struct stat st;
	FILE *f;

	snprintf(local, sizeof(local), "%.*s", (int)(colon - arg), arg);
	f = fopen(local, "re");
	if (!f || fstat(fileno(f), &st) < 0) {
		snprintf(msg, msg_size, "--file %s: %s", local, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(msg, msg_size, "--file %s: not a regular file", local);
		goto out;
	}
	if ((unsigned long long)st.st_size > RECIPE_MAX_FILE_BYTES - *total) {
		snprintf(msg, msg_size, "--file %s: the files of a recipe are at most %u MiB in all", local,
			 RECIPE_MAX_FILE_BYTES >> 20);
		goto out;
	}
	data = malloc((size_t)st.st_size + 1);
	b64 = malloc(4 * (((size_t)st.st_size + 2) / 3) + 1);
	if (!data || !b64 || fread(data, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		snprintf(msg, msg_size, "--file %s: %s", local, data && b64 ? "read failed" : "out of memory");
		goto out;
	}
	EVP_EncodeBlock((unsigned char *)b64, data, (int)st.st_size);
	*total += (size_t)st.st_size;
	e = json_pack("{s:s, s:s, s:i}", "path", colon + 1, "content_b64", b64, "mode", (int)(st.st_mode & 0777));
	if (!e)
		snprintf(msg, msg_size, "--file %s: the guest path is not valid UTF-8", arg);
out:
	if (f)
		fclose(f);
	free(data);
	free(b64);
	return e;
}

/* A recipe file: at most RECIPE_MAX_JSON bytes of one JSON object. */
static json_t *recipe_from_file(const char *path, char *msg, size_t msg_size)
{
	json_error_t je;
	struct stat st;
	json_t *r;

	if (stat(path, &st) < 0) {
		snprintf(msg, msg_size, "%s: %s", path, strerror(errno));
		return NULL;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > RECIPE_MAX_JSON) {
		snprintf(msg, msg_size, "%s: %s", path, S_ISREG(st.st_mode) ? "larger than a recipe may be (24 MiB)"
									    : "not a regular file");
		return NULL;
	}
	r = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!r) {
		snprintf(msg, msg_size, "%s: not valid JSON: line %d: %s", path, je.line, je.text);
		return NULL;
	}
	if (!json_is_object(r)) {
		snprintf(msg, msg_size, "%s: a recipe is a JSON object ({\"name\":..., \"packages\":[...], ...})", path);
		json_decref(r);
		return NULL;
	}
	return r;
}

json_t *cli_template_recipe(const struct cli_template_args *a, char *msg, size_t msg_size)
{
	json_t *r, *arr;
	size_t total = 0;

	msg[0] = '\0';
	if (a->recipe_file) {
		r = recipe_from_file(a->recipe_file, msg, msg_size);
		if (r && a->name)
			json_object_set_new(r, "name", json_string(a->name));
		if (r && !json_is_string(json_object_get(r, "name"))) {
			snprintf(msg, msg_size, "%s: the recipe has no \"name\": add one, or give --name", a->recipe_file);
			json_decref(r);
			r = NULL;
		}
		return r;
	}
	r = json_pack("{s:s, s:s}", "name", a->name, "from", "debian");
	if (!r) {
		snprintf(msg, msg_size, "out of memory");
		return NULL;
	}
	if (a->npackages) {
		arr = json_array();
		json_object_set_new(r, "packages", arr);
		for (int i = 0; i < a->npackages; i++)
			if (split_words(a->packages[i], arr, RECIPE_MAX_PACKAGE, RECIPE_MAX_PACKAGES, "packages", msg,
					msg_size) < 0)
				goto fail;
	}
	if (a->nfiles) {
		arr = json_array();
		json_object_set_new(r, "files", arr);
		for (int i = 0; i < a->nfiles; i++) {
			json_t *e = recipe_file_entry(a->files[i], &total, msg, msg_size);

			if (!e)
				goto fail;
			json_array_append_new(arr, e);
		}
	}
	if (a->nrun) {
		arr = json_array();
		json_object_set_new(r, "run", arr);
		for (int i = 0; i < a->nrun; i++) {
			json_t *s = json_string(a->run[i]);

			if (!s) {
				snprintf(msg, msg_size, "--run: not valid UTF-8");
				goto fail;
			}
			json_array_append_new(arr, s);
		}
	}
	if (a->npreload) {
		arr = json_array();
		json_object_set_new(r, "preload", arr);
		for (int i = 0; i < a->npreload; i++)
			if (split_words(a->preload[i], arr, RECIPE_MAX_MODULE, RECIPE_MAX_PRELOAD, "preload", msg,
					msg_size) < 0)
				goto fail;
	}
	if (a->nenv) {
		json_t *env = json_object();

		json_object_set_new(r, "env", env);
		for (int i = 0; i < a->nenv; i++) {
			const char *eq = strchr(a->env[i], '=');
			char k[256];

			if ((size_t)(eq - a->env[i]) >= sizeof(k)) {
				snprintf(msg, msg_size, "--env: a name longer than %zu bytes", sizeof(k) - 1);
				goto fail;
			}
			snprintf(k, sizeof(k), "%.*s", (int)(eq - a->env[i]), a->env[i]);
			if (json_object_set_new(env, k, json_string(eq + 1)) < 0) {
				snprintf(msg, msg_size, "--env %s: not valid UTF-8", a->env[i]);
				goto fail;
			}
		}
	}
	if (a->workdir)
		json_object_set_new(r, "workdir", json_string(a->workdir));
	return r;
fail:
	json_decref(r);
	return NULL;
}

/* ---- talking to kiln-api ---- */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	interrupted = 1;
}

static int stop_tick(void *ctx)
{
	return interrupted;
}

/* The template object of a reply ({"template":{...}} or the object itself). */
static json_t *template_of(json_t *reply)
{
	json_t *t = json_object_get(reply, "template");

	return json_is_object(t) && !json_object_get(reply, "name") ? t : reply;
}

static long long size_of(json_t *t)
{
	json_t *s = json_object_get(t, "size");

	if (!json_is_integer(s))
		s = json_object_get(t, "size_bytes");
	return json_is_integer(s) ? (long long)json_integer_value(s) : -1;
}

static void when_of(json_t *t, char *out, size_t size)
{
	cli_format_ms(json_object_get(t, "created_at"), out, size);
}

static const char *state_of(json_t *t)
{
	return json_string_value(json_object_get(t, "state")) ?: "?";
}

static int state_final(const char *st)
{
	return !strcmp(st, "ready") || !strcmp(st, "failed");
}

/* The last line of a build: "kiln: template N ready: 123.4 MiB, sha256 ..."
 * or "... failed: CODE: message". The exit status for it. */
static int say_final(const char *name, json_t *t)
{
	const char *st = state_of(t);
	json_t *e = json_object_get(t, "error");
	char sz[32];

	if (!strcmp(st, "ready")) {
		cli_human_size(size_of(t), sz, sizeof(sz));
		fprintf(stderr, "kiln: template %s ready: %s, sha256 %s\n", name, sz,
			json_string_value(json_object_get(t, "sha256")) ?: "-");
		return 0;
	}
	fprintf(stderr, "kiln: template %s %s", name, st);
	if (json_is_object(e))
		fprintf(stderr, ": %s: %s", json_string_value(json_object_get(e, "code")) ?: "error",
			json_string_value(json_object_get(e, "message")) ?: "(no message)");
	fputc('\n', stderr);
	return !strcmp(st, "failed") ? EXIT_REFUSED : EXIT_INFRA;
}

struct build_view {
	const char *name;
	char state[32];
	int ended;
	int deleted;  /* the stream ended with "deleted": removed while building */
};

static int on_build_event(void *ctx, const char *name, json_t *data)
{
	struct build_view *v = ctx;
	const char *st = json_string_value(json_object_get(data, "state"));

	if (!strcmp(name, "log")) {
		const char *line = json_string_value(json_object_get(data, "line"));

		if (line) {
			size_t n = strlen(line);

			fputs(line, stdout);
			if (!n || line[n - 1] != '\n')
				fputc('\n', stdout);
			fflush(stdout);
		}
		return interrupted;
	}
	if (!strcmp(name, "truncated")) {
		fprintf(stderr, "kiln: [%lld bytes of the build log were not kept: the log is capped]\n",
			(long long)json_integer_value(json_object_get(data, "skipped_bytes")));
		return interrupted;
	}
	if (st && strcmp(st, v->state)) {
		snprintf(v->state, sizeof(v->state), "%s", st);
		if (!state_final(st))
			fprintf(stderr, "kiln: template %s %s\n", v->name, st);
	}
	if (!strcmp(name, "end")) {
		v->ended = 1;
		v->deleted = st && !strcmp(st, "deleted");
		return 1;
	}
	return interrupted;
}

/* Wait until the build is final (events, else polling): 0 with *t the
 * final template, or an exit status (130 when interrupted). */
static int wait_build(const struct cli_conn *conn, const char *name, json_t **t)
{
	struct build_view v = { .name = name };
	struct kiln_err err = { .code = "" };
	char path[256];
	int rc, r;

	*t = NULL;
	snprintf(path, sizeof(path), "/v1/templates/%s/events", name);
	r = http_follow(conn, path, EVENTS_STALL_S, on_build_event, stop_tick, &v, &err);
	if (r < 0 && err.errc == KERR_HTTP) {
		/* e.g. 404: deleted meanwhile. */
		fprintf(stderr, "kiln: template events: %s\n", err.message);
	} else if (r < 0) {
		fprintf(stderr, "kiln: %s; waiting for the build instead\n", err.message);
	}
	if (v.deleted) {
		fprintf(stderr, "kiln: template %s was deleted before its build ended\n", name);
		return EXIT_REFUSED;
	}
	snprintf(path, sizeof(path), "/v1/templates/%s", name);
	for (;;) {
		json_t *reply = NULL;
		long long until;

		if (interrupted)
			break;
		if ((rc = cli_request(conn, "template get", "GET", path, NULL, 30, &reply)))
			return rc;
		if (state_final(state_of(template_of(reply)))) {
			*t = json_incref(template_of(reply));
			json_decref(reply);
			return 0;
		}
		json_decref(reply);
		until = clock_mono_ms() + POLL_MS;
		while (!interrupted && clock_mono_ms() < until)
			usleep(100000);
	}
	fprintf(stderr, "kiln: stopped waiting; the build goes on: kiln template get %s\n", name);
	return 130;
}

static int template_build(int argc, char **argv)
{
	struct cli_template_args a;
	struct kiln_err err = { .code = "" };
	struct cli_conn conn;
	struct creds cr;
	struct sigaction sa = { .sa_handler = on_sigint }, old;
	json_t *recipe = NULL, *reply = NULL, *t = NULL;
	char msg[600], path[512];
	const char *name;
	int rc, status;

	if (cli_template_build_args(argc, argv, &a, msg, sizeof(msg)) < 0) {
		fprintf(stderr, "kiln: template build: %s (kiln template --help)\n", msg);
		return EXIT_USAGE;
	}
	if (a.help) {
		template_usage(stdout);
		return 0;
	}
	if (!a.oci && !(recipe = cli_template_recipe(&a, msg, sizeof(msg)))) {
		fprintf(stderr, "kiln: template build: %s\n", msg);
		return EXIT_USAGE;
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		goto out;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old);
	if (a.oci) {
		struct stat st;

		if (stat(a.oci, &st) == 0 && S_ISREG(st.st_mode))
			fprintf(stderr, "kiln: uploading %s (%.1f MiB)\n", a.oci, (double)st.st_size / (1024 * 1024));
		snprintf(path, sizeof(path), "/v1/templates?name=%s", a.name);
		status = http_send_file(&conn, "POST", path, a.oci, "application/x-tar", 0, stop_tick, NULL, &reply,
					&err);
		if (status < 0) {
			fprintf(stderr, "kiln: template build: %s\n", err.message);
			rc = err.errc == KERR_IO_ERROR ? EXIT_USAGE : err.errc == KERR_INTERRUPTED ? 130 : EXIT_INFRA;
			goto out_sig;
		}
		if (status < 200 || status > 299) {
			http_describe_error(status, reply, msg, sizeof(msg));
			fprintf(stderr, "kiln: template build: %s\n", msg);
			rc = EXIT_REFUSED;
			goto out_sig;
		}
	} else if ((rc = cli_request(&conn, "template build", "POST", "/v1/templates", recipe, 120, &reply))) {
		goto out_sig;
	}
	name = json_string_value(json_object_get(template_of(reply), "name"));
	if (!name)
		name = a.name ? a.name : json_string_value(json_object_get(recipe, "name"));
	if (a.no_wait) {
		if (a.json)
			cli_print_json(template_of(reply));
		else
			printf("%s %s\n", name, state_of(template_of(reply)));
		rc = 0;
		goto out_sig;
	}
	fprintf(stderr, "kiln: template %s %s\n", name, state_of(template_of(reply)));
	if ((rc = wait_build(&conn, name, &t)))
		goto out_sig;
	if (a.json)
		cli_print_json(t);
	rc = say_final(name, t);
out_sig:
	sigaction(SIGINT, &old, NULL);
out:
	json_decref(recipe);
	json_decref(reply);
	json_decref(t);
	return rc;
}

static int template_list(int argc, char **argv, const struct cli_conn *conn)
{
	json_t *reply = NULL, *list, *t;
	size_t i;
	int rc, json = argc == 2;

	if ((rc = cli_request(conn, "template list", "GET", "/v1/templates", NULL, 30, &reply)))
		return rc;
	if (json) {
		cli_print_json(reply);
		json_decref(reply);
		return 0;
	}
	list = json_is_array(reply) ? reply : json_object_get(reply, "templates");
	printf("%-32s %-9s %-6s %-10s %s\n", "NAME", "STATE", "PUBLIC", "SIZE", "CREATED");
	json_array_foreach(list, i, t) {
		char sz[32], when[64];

		cli_human_size(size_of(t), sz, sizeof(sz));
		when_of(t, when, sizeof(when));
		printf("%-32s %-9s %-6s %-10s %s\n", json_string_value(json_object_get(t, "name")) ?: "?", state_of(t),
		       json_is_true(json_object_get(t, "public")) ? "yes" : "no", sz, when);
	}
	json_decref(reply);
	return 0;
}

static void describe_template(json_t *t)
{
	json_t *e = json_object_get(t, "error");
	const char *log = json_string_value(json_object_get(t, "build_log"));
	const char *kind = json_string_value(json_object_get(t, "kind"));
	char sz[32], when[64];

	if (!log)
		log = json_string_value(json_object_get(t, "log"));
	cli_human_size(size_of(t), sz, sizeof(sz));
	when_of(t, when, sizeof(when));
	printf("name     %s\n"
	       "kind     %s\n"
	       "state    %s\n"
	       "public   %s\n"
	       "size     %s\n"
	       "sha256   %s\n"
	       "created  %s\n",
	       json_string_value(json_object_get(t, "name")) ?: "?", kind ? kind : "-", state_of(t),
	       json_is_true(json_object_get(t, "public")) ? "yes" : "no", sz,
	       json_string_value(json_object_get(t, "sha256")) ?: "-", when);
	if (json_is_object(e))
		printf("error    %s: %s\n", json_string_value(json_object_get(e, "code")) ?: "error",
		       json_string_value(json_object_get(e, "message")) ?: "(no message)");
	if (log && *log) {
		size_t n = strlen(log);

		printf("build log (its end):\n%s%s", log, log[n - 1] == '\n' ? "" : "\n");
	}
}

int cmd_template(int argc, char **argv)
{
	struct kiln_err err = { .code = "" };
	struct cli_conn conn;
	struct creds cr;
	json_t *reply = NULL;
	const char *verb;
	char path[256];
	int rc, json = 0;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		template_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	verb = argv[1];
	if (!strcmp(verb, "build"))
		return template_build(argc - 1, argv + 1);
	/* Usage is checked before any configuration is looked for. */
	if (!strcmp(verb, "list")) {
		if (argc > 3 || (argc == 3 && strcmp(argv[2], "--json"))) {
			template_usage(stderr);
			return EXIT_USAGE;
		}
	} else if (!strcmp(verb, "get") || !strcmp(verb, "rm")) {
		json = argc == 4 && !strcmp(verb, "get") && !strcmp(argv[3], "--json");
		if (argc != 3 + json) {
			template_usage(stderr);
			return EXIT_USAGE;
		}
		if (spec_template_name_check(argv[2], "name", &err) < 0) {
			fprintf(stderr, "kiln: template %s: %s: not a template name (1-63 of a-z 0-9 . _ - starting "
				"with a letter or digit)\n", verb, argv[2]);
			return EXIT_USAGE;
		}
	} else {
		fprintf(stderr, "kiln: template %s: unknown command\n", verb);
		template_usage(stderr);
		return EXIT_USAGE;
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		return rc;
	if (!strcmp(verb, "list"))
		return template_list(argc - 1, argv + 1, &conn);
	snprintf(path, sizeof(path), "/v1/templates/%s", argv[2]);
	if (!strcmp(verb, "get")) {
		if ((rc = cli_request(&conn, "template get", "GET", path, NULL, 30, &reply)))
			return rc;
		if (json)
			cli_print_json(reply);
		else
			describe_template(template_of(reply));
	} else {
		/* 200 with the template, or 204 without a body: both are fine. */
		char msg[700];
		int status = http_call(&conn, "DELETE", path, NULL, 60, &reply, &err);

		if (status < 0) {
			fprintf(stderr, "kiln: template rm: %s\n", err.message);
			return EXIT_INFRA;
		}
		if (status < 200 || status > 299) {
			http_describe_error(status, reply, msg, sizeof(msg));
			fprintf(stderr, "kiln: template rm: %s\n", msg);
			json_decref(reply);
			return EXIT_REFUSED;
		}
		printf("%s deleted%s\n", argv[2],
		       json_is_true(json_object_get(reply, "cancelled")) ? " (its build was cancelled)" : "");
	}
	json_decref(reply);
	return 0;
}
