/* task: `kiln run` (submit a file, follow it, fetch its outputs) and
 * `kiln task get|list|cancel|logs`. */
#include <errno.h>
#include <getopt.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "cli.h"
#include "follow.h"
#include "fsutil.h"
#include "spec.h"

#define CODE_MAX (1u << 20)       /* the API's limit for code */
#define FILE_MAX (64u << 20)      /* the API's limit for all files together */

static void run_usage(FILE *f)
{
	fprintf(f, "usage: kiln run FILE.py|FILE.sh|-c CODE [--lang python|bash] [--memory MiB] [--vcpus N] [--timeout S]\n"
		   "                [--file LOCAL[:GUEST]]... [--env K=V]... [--allow DEST:PORTS]... [--out DIR]\n"
		   "                [--template NAME]\n"
		   "  Runs FILE in a fresh microVM through kiln-api, streams its output, downloads the\n"
		   "  files it wrote under /output into DIR (default ./kiln-out/TASK_ID/) and exits with\n"
		   "  its exit code (1: failed without one, timed out or cancelled; 3: kiln error).\n"
		   "  -c CODE runs CODE given on the command line instead of a file (Python, or bash\n"
		   "  with --lang bash).\n"
		   "  --allow gives the task network egress to DEST:PORTS only (203.0.113.0/24:443,\n"
		   "  example.org:443, *.example.org:8000-8100; docs/api.md \"Network policy\").\n"
		   "  --template runs it in that template's environment (default: default; kiln template\n"
		   "  list shows them).\n");
}

static json_t *file_entry(const char *arg)
{
	const char *colon = strrchr(arg, ':');
	char local[4096], guest[4096];
	unsigned char *data;
	char *b64;
	size_t len;
	mode_t mode;
	json_t *e;

	if (colon) {
		snprintf(local, sizeof(local), "%.*s", (int)(colon - arg), arg);
		if (colon[1] == '/')
			snprintf(guest, sizeof(guest), "%s", colon + 1);
		else
			snprintf(guest, sizeof(guest), "/work/%s", colon + 1);
	} else {
		const char *base = strrchr(arg, '/');

		snprintf(local, sizeof(local), "%s", arg);
		snprintf(guest, sizeof(guest), "/work/%s", base ? base + 1 : arg);
	}
	if (!local[0] || !strcmp(guest, "/work/")) {
		fprintf(stderr, "kiln: --file %s: expected LOCAL[:GUEST]\n", arg);
		return NULL;
	}
	data = cli_read_file(local, FILE_MAX, &len, &mode);
	if (!data)
		return NULL;
	b64 = malloc(4 * ((len + 2) / 3) + 1);
	if (!b64) {
		free(data);
		return NULL;
	}
	EVP_EncodeBlock((unsigned char *)b64, data, (int)len);
	free(data);
	e = json_pack("{s:s, s:s, s:i}", "path", guest, "content_b64", b64, "mode", (int)mode);
	free(b64);
	return e;
}

int cli_output_path_ok(const char *p)
{
	const char *s = p;

	if (!*p || *p == '/' || strlen(p) > 1024)
		return 0;
	while (*s) {
		size_t n = strcspn(s, "/");

		if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return 0;
		s += n;
		if (*s == '/')
			s++;
		if (!*s && s[-1] == '/')
			return 0;
	}
	for (s = p; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return 0;
	return 1;
}

/* Download every output of the final task into dir; prints where each one is
 * in S3 and locally. Returns the number that failed. */
static int fetch_outputs(json_t *task, const char *dir, const struct creds *cr)
{
	json_t *outs = json_object_get(task, "outputs"), *o;
	size_t i;
	int failed = 0;

	if (!json_array_size(outs))
		return 0;
	fprintf(stderr, "kiln: outputs (in S3 %s%s):\n", cr->s3_bucket[0] ? "bucket " : "",
		cr->s3_bucket[0] ? cr->s3_bucket : "");
	json_array_foreach(outs, i, o) {
		const char *path = json_string_value(json_object_get(o, "path"));
		const char *key = json_string_value(json_object_get(o, "s3_key"));
		const char *url = json_string_value(json_object_get(o, "url"));
		struct kiln_err err = { .code = "" };
		char local[8192], *slash;
		int r;

		if (!path || !cli_output_path_ok(path)) {
			fprintf(stderr, "kiln:   refusing an output path from the server: %s\n", path ? path : "(none)");
			failed++;
			continue;
		}
		snprintf(local, sizeof(local), "%s/%s", dir, path);
		if (cr->s3_bucket[0])
			fprintf(stderr, "kiln:   s3://%s/%s", cr->s3_bucket, key ? key : "?");
		else
			fprintf(stderr, "kiln:   s3 key %s", key ? key : "?");
		if (!url) {
			fprintf(stderr, " (no presigned URL: kiln-api has no s3 settings)\n");
			failed++;
			continue;
		}
		slash = strrchr(local, '/');
		*slash = '\0';
		r = fs_mkdir_p(local, 0755);
		*slash = '/';
		if (r < 0) {
			fprintf(stderr, " -> %s: %s\n", local, strerror(-r));
			failed++;
			continue;
		}
		if (http_download(url, local, 60, &err) < 0) {
			fprintf(stderr, " -> %s: %s\n", local, err.message);
			failed++;
			continue;
		}
		fprintf(stderr, " -> %s\n", local);
	}
	return failed;
}

/* The task's output that the event stream did not show, for a final task:
 * with no stream at all (v NULL or nothing shown), the whole of each log
 * that the result holds only an excerpt of (else the result's text); after
 * a stream with a gap, each log from where the stream's last chunk ended.
 * The logs come from S3 through their presigned URLs (artifacts); without
 * one, the result's excerpt is shown with a line saying what is missing.
 * Returns the number of logs that could not be shown whole. */
static int show_missing_output(json_t *task, const struct follow_view *v)
{
	static const char *const names[2] = { "stdout", "stderr" };
	json_t *res = json_object_get(task, "result"), *arts = json_object_get(task, "artifacts");
	int streamed = v && v->output_bytes > 0, failed = 0;

	if (streamed && !v->log_gap)
		return 0;
	for (int k = 0; k < 2; k++) {
		FILE *out = k ? stderr : stdout;
		char key[32];
		const char *url, *head, *tail;
		int cut;
		struct kiln_err err = { .code = "" };

		snprintf(key, sizeof(key), "%s.log", names[k]);
		url = json_string_value(json_object_get(json_object_get(arts, key), "url"));
		head = json_string_value(json_object_get(res, names[k]));
		snprintf(key, sizeof(key), "%s_tail", names[k]);
		tail = json_string_value(json_object_get(res, key));
		cut = tail != NULL;
		if (!streamed && !cut) {
			fputs(head ? head : "", out); /* the result holds it all */
			continue;
		}
		if (streamed && v->log_unknown) {
			fprintf(stderr, "kiln: some %s was not shown; the whole log: %s\n", names[k],
				url ? url : "(no presigned URL: kiln-api has no s3 settings)");
			continue;
		}
		if (url && http_stream_url(url, streamed ? v->log_next[k] : 0, out, 60, &err) == 0)
			continue;
		fflush(out);
		failed++;
		if (streamed) {
			fprintf(stderr, "\nkiln: the rest of %s.log could not be fetched (%s); see kiln task get %s\n",
				names[k], url ? err.message : "kiln-api has no s3 settings",
				json_string_value(json_object_get(task, "id")) ?: "");
			continue;
		}
		fputs(head ? head : "", out);
		fflush(out);
		fprintf(stderr,
			"\nkiln: [%s: %lld bytes in all; only the first and last %zu shown: %s.log could not be "
			"fetched (%s)]\n",
			names[k],
			(long long)json_integer_value(
				json_object_get(res, names[k][3] == 'o' ? "stdout_bytes" : "stderr_bytes")),
			strlen(tail), names[k], url ? err.message : "kiln-api has no s3 settings");
		fputs(tail, out);
	}
	fflush(stdout);
	return failed;
}

/* GET the task, waiting (long-poll) until it is final. */
static int wait_final(const struct cli_conn *conn, const char *id, json_t **task)
{
	char path[256];
	int r;

	snprintf(path, sizeof(path), "/v1/tasks/%s?wait=30", id);
	for (;;) {
		const char *st;

		r = cli_request(conn, "task get", "GET", path, NULL, 45, task);
		if (r)
			return r;
		st = json_string_value(json_object_get(*task, "state"));
		if (st && follow_state_final(st))
			return 0;
		json_decref(*task);
	}
}

static int exit_code_of(json_t *task)
{
	const char *st = json_string_value(json_object_get(task, "state"));
	json_t *code = json_object_get(json_object_get(task, "result"), "exit_code");

	if (!st)
		return EXIT_INFRA;
	if (!strcmp(st, "succeeded"))
		return 0;
	if (!strcmp(st, "failed") && json_is_integer(code) && json_integer_value(code) > 0 &&
	    json_integer_value(code) < 256)
		return (int)json_integer_value(code);
	if (!strcmp(st, "error"))
		return EXIT_INFRA;
	return 1;
}

int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "memory", required_argument, 0, 'm' }, { "vcpus", required_argument, 0, 'V' },
		{ "timeout", required_argument, 0, 't' }, { "file", required_argument, 0, 'f' },
		{ "env", required_argument, 0, 'e' }, { "out", required_argument, 0, 'o' },
		{ "allow", required_argument, 0, 'a' }, { "template", required_argument, 0, 'T' },
		{ "code", required_argument, 0, 'c' }, { "lang", required_argument, 0, 'L' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	json_t *spec = NULL, *files = json_array(), *env = json_object(), *limits = json_object();
	json_t *allow = json_array();
	json_t *reply = NULL, *task = NULL;
	struct follow_view view = { .progress = 1 };
	struct kiln_err err = { .code = "" };
	struct cli_conn conn;
	struct creds cr;
	const char *out = NULL, *template = NULL, *inline_code = NULL, *inline_lang = NULL;
	const char *file, *ext, *lang, *id, *st;
	char outdir[4096];
	unsigned char *code = NULL;
	size_t len;
	long long t0;
	int opt, rc = EXIT_USAGE;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "m:t:f:e:o:a:T:c:L:h", opts, NULL)) != -1) {
		char *end;
		long n;

		switch (opt) {
		case 'm':
		case 'V':
		case 't':
			errno = 0;
			n = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || n <= 0) {
				fprintf(stderr, "kiln: --%s: expected a positive integer, got \"%s\"\n",
					opt == 'm' ? "memory" : opt == 'V' ? "vcpus" : "timeout", optarg);
				goto out;
			}
			json_object_set_new(limits, opt == 'm' ? "memory_mib" : opt == 'V' ? "vcpus" : "timeout_s",
					    json_integer(n));
			break;
		case 'f': {
			json_t *e = file_entry(optarg);

			if (!e)
				goto out;
			json_array_append_new(files, e);
			break;
		}
		case 'e': {
			char *eq = strchr(optarg, '=');

			if (!eq || eq == optarg) {
				fprintf(stderr, "kiln: --env %s: expected NAME=VALUE\n", optarg);
				goto out;
			}
			*eq = '\0';
			json_object_set_new(env, optarg, json_string(eq + 1));
			*eq = '=';
			break;
		}
		case 'o':
			out = optarg;
			break;
		case 'a':
			/* Checked by kiln-api (400 naming the rule). */
			json_array_append_new(allow, json_string(optarg));
			break;
		case 'c':
			inline_code = optarg;
			break;
		case 'L':
			if (strcmp(optarg, "python") && strcmp(optarg, "bash")) {
				fprintf(stderr, "kiln: --lang %s: expected python or bash\n", optarg);
				goto out;
			}
			inline_lang = optarg;
			break;
		case 'T': {
			struct kiln_err terr = { .code = "" };

			if (spec_template_name_check(optarg, "template", &terr) < 0) {
				fprintf(stderr, "kiln: --template %s: not a template name (1-63 of a-z 0-9 . _ - starting "
					"with a letter or digit)\n", optarg);
				goto out;
			}
			template = optarg;
			break;
		}
		case 'h':
			run_usage(stdout);
			rc = 0;
			goto out;
		default:
			run_usage(stderr);
			goto out;
		}
	}
	if (optind != argc - !inline_code) {
		if (inline_code)
			fprintf(stderr, "kiln: run: -c CODE or a FILE, not both\n");
		run_usage(stderr);
		goto out;
	}
	if (inline_lang && !inline_code) {
		fprintf(stderr, "kiln: run: --lang is for -c CODE (a file's extension names its language)\n");
		goto out;
	}
	file = inline_code ? "-c" : argv[optind];
	ext = strrchr(file, '.');
	if (inline_code) {
		lang = inline_lang ? inline_lang : "python";
	} else if (ext && !strcmp(ext, ".py")) {
		lang = "python";
	} else if (ext && !strcmp(ext, ".sh")) {
		lang = "bash";
	} else {
		fprintf(stderr, "kiln: %s: the language comes from the extension: .py (python) or .sh (bash)\n", file);
		goto out;
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		goto out;
	rc = EXIT_USAGE;
	if (inline_code) {
		len = strlen(inline_code);
		code = (unsigned char *)strdup(inline_code);
		if (!code || len > CODE_MAX) {
			fprintf(stderr, "kiln: -c: %s\n", code ? "longer than 1 MiB" : "out of memory");
			goto out;
		}
	} else {
		code = cli_read_file(file, CODE_MAX, &len, NULL);
		if (!code)
			goto out;
	}
	if (strlen((char *)code) != len) {
		fprintf(stderr, "kiln: %s: contains a NUL byte\n", file);
		goto out;
	}
	spec = json_pack("{s:s, s:s}", "language", lang, "code", (char *)code);
	if (!spec) {
		fprintf(stderr, "kiln: %s: not valid UTF-8\n", file);
		goto out;
	}
	if (json_array_size(files))
		json_object_set(spec, "files", files);
	if (json_object_size(env))
		json_object_set(spec, "env", env);
	if (json_object_size(limits))
		json_object_set(spec, "limits", limits);
	if (json_array_size(allow))
		json_object_set_new(spec, "network", json_pack("{s:s, s:O}", "egress", "allow", "allow", allow));
	if (template)
		json_object_set_new(spec, "template", json_string(template));

	t0 = clock_mono_ms();
	if ((rc = cli_request(&conn, "submit", "POST", "/v1/tasks", spec, 60, &reply)))
		goto out;
	id = json_string_value(json_object_get(reply, "id"));
	if (!id) {
		fprintf(stderr, "kiln: submit: the reply names no task id\n");
		rc = EXIT_INFRA;
		goto out;
	}
	view.task_id = id;
	fprintf(stderr, "kiln: task %s %s\n", id, json_string_value(json_object_get(reply, "state")) ?: "submitted");
	if (follow_task(&conn, &view, 1, &err) < 0) {
		if (err.errc == KERR_INTERRUPTED) {
			fprintf(stderr, "kiln: stopped waiting; the task goes on: kiln task get %s\n", id);
			rc = 130;
			goto out;
		}
		fprintf(stderr, "kiln: %s; waiting for the task instead\n", err.message);
		view.log_gap = 1; /* what the stream did not show comes from the logs */
	}
	if ((rc = wait_final(&conn, id, &task)))
		goto out;
	/* The stream was lost, started late or truncated: the rest from the logs. */
	show_missing_output(task, &view);
	st = json_string_value(json_object_get(task, "state"));
	{
		json_t *res = json_object_get(task, "result");
		json_t *ec = json_object_get(res, "exit_code");
		const char *sig = json_string_value(json_object_get(res, "signal"));
		const char *reason = json_string_value(json_object_get(task, "end_reason"));
		const char *emsg = json_string_value(json_object_get(json_object_get(res, "error"), "message"));

		fprintf(stderr, "kiln: task %s %s", id, st);
		if (json_is_integer(ec))
			fprintf(stderr, " (exit code %lld)", (long long)json_integer_value(ec));
		else if (sig)
			fprintf(stderr, " (signal %s)", sig);
		if (reason && strcmp(reason, "exited") && strcmp(reason, st))
			fprintf(stderr, ", %s", reason);
		fprintf(stderr, " in %.2f s\n", (double)(clock_mono_ms() - t0) / 1000.0);
		if (emsg && !strcmp(st, "error"))
			fprintf(stderr, "kiln: error: %s\n", emsg);
	}
	if (out)
		snprintf(outdir, sizeof(outdir), "%s", out);
	else
		snprintf(outdir, sizeof(outdir), "kiln-out/%s", id);
	if (json_array_size(json_object_get(task, "outputs")) && fetch_outputs(task, outdir, &cr)) {
		fprintf(stderr, "kiln: some outputs could not be downloaded\n");
		rc = exit_code_of(task);
		if (!rc)
			rc = EXIT_INFRA;
		goto out;
	}
	rc = exit_code_of(task);
out:
	free(code);
	json_decref(spec);
	json_decref(files);
	json_decref(env);
	json_decref(limits);
	json_decref(allow);
	json_decref(reply);
	json_decref(task);
	return rc;
}

static void task_usage(FILE *f)
{
	fprintf(f, "usage: kiln task get ID\n"
		   "       kiln task list [--state S] [--limit N] [--json]\n"
		   "       kiln task cancel ID\n"
		   "       kiln task logs ID     (its stdout and stderr, replayed from the event stream)\n");
}

static int id_ok(const char *id)
{
	size_t n = strlen(id);

	return n && n <= 128 && strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n;
}

static int task_list(int argc, char **argv, const struct cli_conn *conn)
{
	static const struct option opts[] = {
		{ "state", required_argument, 0, 's' }, { "limit", required_argument, 0, 'l' },
		{ "json", no_argument, 0, 'j' }, { 0, 0, 0, 0 },
	};
	const char *state = NULL;
	long limit = 20;
	int opt, json = 0, rc;
	char path[512], *end;
	json_t *reply = NULL, *t;
	size_t i;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "s:l:j", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (!id_ok(optarg)) {
				fprintf(stderr, "kiln: --state %s: not a state name\n", optarg);
				return EXIT_USAGE;
			}
			state = optarg;
			break;
		case 'l':
			limit = strtol(optarg, &end, 10);
			if (*end || end == optarg || limit < 1 || limit > 100) {
				fprintf(stderr, "kiln: --limit: expected 1-100\n");
				return EXIT_USAGE;
			}
			break;
		case 'j':
			json = 1;
			break;
		default:
			task_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc) {
		task_usage(stderr);
		return EXIT_USAGE;
	}
	snprintf(path, sizeof(path), "/v1/tasks?limit=%ld%s%s", limit, state ? "&state=" : "", state ? state : "");
	if ((rc = cli_request(conn, "task list", "GET", path, NULL, 30, &reply)))
		return rc;
	if (json) {
		cli_print_json(reply);
	} else {
		printf("%-34s %-10s %-12s %-10s %s\n", "ID", "STATE", "END", "HOST", "CREATED");
		json_array_foreach(json_object_get(reply, "tasks"), i, t) {
			json_t *ca = json_object_get(t, "created_at");
			const char *host = json_string_value(json_object_get(t, "host"));
			const char *er = json_string_value(json_object_get(t, "end_reason"));
			time_t secs = (time_t)(json_integer_value(ca) / 1000);
			char when[64] = "";
			struct tm tm;

			if (localtime_r(&secs, &tm))
				strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
			printf("%-34s %-10s %-12s %-10s %s\n", json_string_value(json_object_get(t, "id")),
			       json_string_value(json_object_get(t, "state")), er ? er : "-", host ? host : "-", when);
		}
	}
	json_decref(reply);
	return 0;
}

int cmd_task(int argc, char **argv)
{
	struct cli_conn conn;
	struct creds cr;
	json_t *reply = NULL;
	char path[256];
	const char *verb;
	int rc;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		task_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	verb = argv[1];
	if (strcmp(verb, "list") && strcmp(verb, "get") && strcmp(verb, "cancel") && strcmp(verb, "logs")) {
		fprintf(stderr, "kiln: task %s: unknown command\n", verb);
		task_usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(verb, "list") && (argc != 3 || !id_ok(argv[2]))) {
		task_usage(stderr);
		return EXIT_USAGE;
	}
	if ((rc = cli_connect(&cr, 0, &conn)))
		return rc;
	if (!strcmp(verb, "list"))
		return task_list(argc - 1, argv + 1, &conn);
	if (!strcmp(verb, "get")) {
		snprintf(path, sizeof(path), "/v1/tasks/%s", argv[2]);
		if ((rc = cli_request(&conn, "task get", "GET", path, NULL, 30, &reply)))
			return rc;
		cli_print_json(reply);
	} else if (!strcmp(verb, "cancel")) {
		snprintf(path, sizeof(path), "/v1/tasks/%s/cancel", argv[2]);
		if ((rc = cli_request(&conn, "task cancel", "POST", path, NULL, 30, &reply)))
			return rc;
		printf("%s: %s%s\n", argv[2], json_string_value(json_object_get(reply, "state")),
		       json_is_true(json_object_get(reply, "cancel_requested")) ? " (cancel requested)" : "");
	} else {
		struct follow_view view = { .task_id = argv[2] };
		struct kiln_err err = { .code = "" };

		if (follow_task(&conn, &view, 0, &err) < 0) {
			fprintf(stderr, "kiln: task logs: %s\n", err.message);
			return err.errc != KERR_HTTP ? EXIT_INFRA : EXIT_REFUSED;
		}
		/* A final task's stream may have dropped output: the rest from the logs. */
		snprintf(path, sizeof(path), "/v1/tasks/%s", argv[2]);
		if (view.log_gap && (rc = cli_request(&conn, "task get", "GET", path, NULL, 30, &reply)) == 0 &&
		    follow_state_final(json_string_value(json_object_get(reply, "state")) ?: "") &&
		    show_missing_output(reply, &view))
			rc = EXIT_INFRA;
		json_decref(reply);
		return rc;
	}
	json_decref(reply);
	return 0;
}
