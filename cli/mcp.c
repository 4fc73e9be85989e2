/* mcp: `kiln mcp` (mcp.h, docs/mcp.md): reads MCP messages from stdin, one a
 * line, answers on stdout, logs on stderr; its tools call kiln-api with the
 * caller's key (KILN_API/KILN_KEY, else `kiln up`'s credentials file). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "buf.h"
#include "cli.h"
#include "follow.h"
#include "mcp.h"

#define READ_MAX (16u << 20) /* read_file answers at most this much */

struct mcp_ctx {
	struct creds cr;
	struct cli_conn conn;
	char config_error[600]; /* why there is no API or key: every tool says so */
};

/* An API answer that is not 2xx (or none) as a tool error. Steals reply. */
static json_t *api_error(const char *what, int status, json_t *reply, const struct kiln_err *err)
{
	char msg[700];

	if (status < 0)
		snprintf(msg, sizeof(msg), "%s", err->message);
	else
		http_describe_error(status, reply, msg, sizeof(msg));
	json_decref(reply);
	fprintf(stderr, "kiln mcp: %s: %s\n", what, msg);
	return mcp_text_result(1, "%s failed: %s%s", what, msg,
			       status == 401 ? " (check KILN_KEY: kiln-api does not accept this key)" : "");
}

/* One JSON request: 0 with *reply, or -1 with *res the tool error. */
static int request(struct mcp_ctx *c, const char *what, const char *method, const char *path, json_t *body,
		   long timeout_s, json_t **reply, json_t **res)
{
	struct kiln_err err = { .code = "" };
	int st;

	*reply = NULL;
	st = http_call(&c->conn, method, path, body, timeout_s, reply, &err);
	if (st < 200 || st > 299 || !*reply) {
		if (st >= 200 && st <= 299) {
			snprintf(err.message, sizeof(err.message), "HTTP %d with a reply that is not JSON", st);
			st = -1;
		}
		*res = api_error(what, st, *reply, &err);
		*reply = NULL;
		return -1;
	}
	return 0;
}

/* ---- arguments ---- */

/* A string argument: 0 with *out (NULL when absent and optional), or -1
 * with *res the tool error. */
static int arg_str(json_t *args, const char *tool, const char *name, int required, const char **out, json_t **res)
{
	json_t *v = json_object_get(args, name);

	*out = NULL;
	if (!v && !required)
		return 0;
	if (!json_is_string(v)) {
		*res = mcp_text_result(1, "%s: bad argument: \"%s\" %s", tool, name,
				       v ? "must be a string" : "is required");
		return -1;
	}
	*out = json_string_value(v);
	return 0;
}

/* An integer argument in [lo, hi]: 0 with *out (0 when absent), or -1. */
static int arg_int(json_t *args, const char *tool, const char *name, long lo, long hi, long *out, json_t **res)
{
	json_t *v = json_object_get(args, name);

	*out = 0;
	if (!v)
		return 0;
	if (json_is_real(v) && json_real_value(v) == (double)(long)json_real_value(v))
		*out = (long)json_real_value(v);
	else if (json_is_integer(v))
		*out = (long)json_integer_value(v);
	else
		*out = lo - 1;
	if (*out < lo || *out > hi) {
		*res = mcp_text_result(1, "%s: bad argument: \"%s\" must be an integer from %ld to %ld", tool, name,
				       lo, hi);
		return -1;
	}
	return 0;
}

static int arg_sandbox(json_t *args, const char *tool, const char **id, json_t **res)
{
	if (arg_str(args, tool, "sandbox_id", 1, id, res) < 0)
		return -1;
	if (!cli_id_ok(*id)) {
		*res = mcp_text_result(1, "%s: bad argument: \"sandbox_id\" \"%.60s\" is not a sandbox id (s_...)",
				       tool, *id);
		return -1;
	}
	return 0;
}

/* "/v1/sessions/ID/files?KEY=<guest path, escaped>", relative paths under /work. */
static int files_path(const char *tool, const char *id, const char *key, const char *arg, char *out, size_t size,
		      json_t **res)
{
	char guest[4200];
	char *enc;
	int n;

	if (cli_guest_path(arg, guest, sizeof(guest)) < 0 || !(enc = curl_easy_escape(NULL, guest, 0))) {
		*res = mcp_text_result(1, "%s: bad argument: \"path\" is empty or too long", tool);
		return -1;
	}
	n = snprintf(out, size, "/v1/sessions/%s/files?%s=%s", id, key, enc);
	curl_free(enc);
	if (n < 0 || (size_t)n >= size) {
		*res = mcp_text_result(1, "%s: bad argument: \"path\" is too long", tool);
		return -1;
	}
	return 0;
}

static char *b64(const unsigned char *p, size_t n)
{
	char *out = malloc(4 * ((n + 2) / 3) + 1);

	if (out)
		EVP_EncodeBlock((unsigned char *)out, p, (int)n);
	return out;
}

/* ---- what a command's result shows ---- */

/* stdout, or its head and tail with what is left out between them named. */
static json_t *stream_text(json_t *result, const char *name)
{
	char key[32];
	const char *head = json_string_value(json_object_get(result, name)) ?: "";
	const char *tail;

	snprintf(key, sizeof(key), "%s_tail", name);
	tail = json_string_value(json_object_get(result, key));
	if (!tail)
		return json_string(head);
	snprintf(key, sizeof(key), "%s_bytes", name);
	return json_sprintf("%s\n[... %lld bytes in all: only the first and last 4 KiB are shown ...]\n%s", head,
			    (long long)json_integer_value(json_object_get(result, key)), tail);
}

/* {"state","exit_code","signal","stdout","stderr"} of a result; *failed when
 * the command did not exit 0. */
static json_t *command_summary(json_t *result, int *failed)
{
	const char *state = json_string_value(json_object_get(result, "state")) ?: "unknown";
	json_t *o = json_pack("{s:s, s:O?, s:O?, s:o, s:o}", "state", state, "exit_code",
			      json_object_get(result, "exit_code"), "signal", json_object_get(result, "signal"),
			      "stdout", stream_text(result, "stdout"), "stderr", stream_text(result, "stderr"));
	json_t *e = json_object_get(result, "error");

	if (json_object_get(result, "end_reason") && !json_is_null(json_object_get(result, "end_reason")))
		json_object_set(o, "end_reason", json_object_get(result, "end_reason"));
	if (e)
		json_object_set(o, "error", e);
	if (json_is_true(json_object_get(result, "stdout_truncated")) ||
	    json_is_true(json_object_get(result, "stderr_truncated")))
		json_object_set_new(o, "output_truncated", json_true());
	*failed = strcmp(state, "succeeded") != 0;
	return o;
}

/* ---- the tools ---- */

/* run_code with sandbox_id: one cell in the sandbox's code interpreter
 * (POST /v1/sessions/{id}/code, docs/api.md "Code"). The result: a JSON
 * text with stdout, stderr, each result's text and formats, the error and
 * the execution count; then each PNG or JPEG result as an image item, so
 * that the agent sees its chart. */
static json_t *run_cell(struct mcp_ctx *c, const char *sid, const char *lang, const char *code, long timeout)
{
	json_t *res = NULL, *body, *ex = NULL, *out, *results, *r, *images, *img, *e;
	char path[128];
	const char *k;
	json_t *v;
	size_t i;

	if (!cli_id_ok(sid))
		return mcp_text_result(1, "run_code: bad argument: \"sandbox_id\" is not a sandbox id");
	if (!timeout || timeout > 3600)
		timeout = timeout ? 3600 : 300; /* the code API's bound: an hour */
	body = json_pack("{s:s, s:I}", "code", code, "timeout_ms", (json_int_t)timeout * 1000);
	if (lang)
		json_object_set_new(body, "language", json_string(!strcmp(lang, "sh") ? "bash" : lang));
	snprintf(path, sizeof(path), "/v1/sessions/%s/code", sid);
	if (request(c, "run_code", "POST", path, body, timeout + 60, &ex, &res) < 0) {
		json_decref(body);
		return res;
	}
	json_decref(body);
	{
		struct buf so = BUF_INIT, se = BUF_INIT;

		json_array_foreach(json_object_get(json_object_get(ex, "logs"), "stdout"), i, v)
			buf_adds(&so, json_string_value(v) ?: "");
		json_array_foreach(json_object_get(json_object_get(ex, "logs"), "stderr"), i, v)
			buf_adds(&se, json_string_value(v) ?: "");
		out = json_pack("{s:s, s:s}", "stdout", so.p ? so.p : "", "stderr", se.p ? se.p : "");
		buf_free(&so);
		buf_free(&se);
	}
	results = json_array();
	images = json_array();
	json_array_foreach(json_object_get(ex, "results"), i, r) {
		json_t *o = json_pack("{s:O?, s:b}", "text", json_object_get(r, "text"), "is_main_result",
				      json_is_true(json_object_get(r, "is_main_result")));
		json_t *formats = json_array();

		json_object_foreach(r, k, v)
			if (strcmp(k, "text") && strcmp(k, "is_main_result") && !json_is_null(v))
				json_array_append_new(formats, json_string(k));
		json_object_set_new(o, "formats", formats);
		if (json_object_get(r, "data"))
			json_object_set(o, "data", json_object_get(r, "data"));
		if (json_is_string(json_object_get(r, "png")) || json_is_string(json_object_get(r, "jpeg"))) {
			int png = json_is_string(json_object_get(r, "png"));

			img = json_pack("{s:s, s:O, s:s}", "type", "image", "data", json_object_get(r, png ? "png" : "jpeg"),
					"mimeType", png ? "image/png" : "image/jpeg");
			json_array_append_new(images, img);
			json_object_set_new(o, "image", json_integer((json_int_t)json_array_size(images)));
		}
		json_array_append_new(results, o);
	}
	json_object_set_new(out, "results", results);
	e = json_object_get(ex, "error");
	json_object_set(out, "error", e ? e : json_null());
	json_object_set(out, "execution_count", json_object_get(ex, "execution_count") ?: json_null());
	if (json_array_size(images))
		json_object_set_new(out, "images", json_sprintf("%zu image(s) follow, in results' order (\"image\": n)",
								json_array_size(images)));
	json_decref(ex);
	res = mcp_json_result(e && !json_is_null(e), out);
	json_array_extend(json_object_get(res, "content"), images);
	json_decref(images);
	return res;
}

static json_t *t_run_code(struct mcp_ctx *c, json_t *args)
{
	const char *lang, *code, *tid;
	json_t *res = NULL, *body, *files, *f, *task = NULL, *out, *outputs, *o, *art;
	long timeout;
	char path[256];
	size_t i;
	int failed;

	const char *sid;

	if (arg_str(args, "run_code", "sandbox_id", 0, &sid, &res) < 0 ||
	    arg_str(args, "run_code", "language", !sid, &lang, &res) < 0 ||
	    arg_str(args, "run_code", "code", 1, &code, &res) < 0 ||
	    arg_int(args, "run_code", "timeout", 1, 86400, &timeout, &res) < 0)
		return res;
	if (sid && lang && strcmp(lang, "python") && strcmp(lang, "bash") && strcmp(lang, "sh"))
		return mcp_text_result(1, "run_code: bad argument: \"language\" must be python, bash or sh, not \"%.40s\"",
				       lang);
	if (sid)
		return run_cell(c, sid, lang, code, timeout);
	if (strcmp(lang, "python") && strcmp(lang, "bash") && strcmp(lang, "sh"))
		return mcp_text_result(1, "run_code: bad argument: \"language\" must be python, bash or sh, not \"%.40s\"",
				       lang);
	files = json_object_get(args, "files");
	if (files && !json_is_array(files))
		return mcp_text_result(1, "run_code: bad argument: \"files\" must be an array of {path, content}");
	body = json_pack("{s:s, s:s, s:[]}", "language", lang, "code", code, "files");
	json_array_foreach(files, i, f) {
		const char *p = json_string_value(json_object_get(f, "path"));
		const char *text = json_string_value(json_object_get(f, "content"));
		const char *raw = json_string_value(json_object_get(f, "content_base64"));
		char guest[4200], *enc;

		if (!p || cli_guest_path(p, guest, sizeof(guest)) < 0 || (!text == !raw)) {
			json_decref(body);
			return mcp_text_result(1, "run_code: bad argument: files[%zu] needs a \"path\" and either "
						  "\"content\" or \"content_base64\"", i);
		}
		enc = raw ? strdup(raw) : b64((const unsigned char *)text, json_string_length(json_object_get(f, "content")));
		json_array_append_new(json_object_get(body, "files"),
				      json_pack("{s:s, s:s}", "path", guest, "content_b64", enc ? enc : ""));
		free(enc);
	}
	if (timeout)
		json_object_set_new(body, "limits", json_pack("{s:i}", "timeout_s", (json_int_t)timeout));
	if (request(c, "run_code", "POST", "/v1/tasks", body, 60, &task, &res) < 0) {
		json_decref(body);
		return res;
	}
	json_decref(body);
	tid = json_string_value(json_object_get(task, "id"));
	if (!tid || !cli_id_ok(tid)) {
		json_decref(task);
		return mcp_text_result(1, "run_code: kiln-api answered without a task id");
	}
	snprintf(path, sizeof(path), "/v1/tasks/%s?wait=30", tid);
	for (;;) {
		const char *st = json_string_value(json_object_get(task, "state"));
		json_t *next;

		if (st && follow_state_final(st))
			break;
		if (request(c, "run_code: waiting for the task", "GET", path, NULL, 45, &next, &res) < 0) {
			json_decref(task);
			return res;
		}
		json_decref(task);
		task = next;
	}
	out = command_summary(json_object_get(task, "result") ?: task, &failed);
	json_object_set_new(out, "task_id", json_string(json_string_value(json_object_get(task, "id"))));
	if (!json_object_get(json_object_get(task, "result"), "state"))
		json_object_set(out, "state", json_object_get(task, "state"));
	if (json_object_get(task, "error") && !json_object_get(out, "error"))
		json_object_set(out, "error", json_object_get(task, "error"));
	outputs = json_array();
	json_array_foreach(json_object_get(task, "outputs"), i, o)
		json_array_append_new(outputs, json_pack("{s:O?, s:O?, s:O?}", "path", json_object_get(o, "path"), "size",
							 json_object_get(o, "size"), "url", json_object_get(o, "url")));
	json_object_set_new(out, "output_files", outputs);
	art = json_object_get(task, "artifacts");
	if (json_object_get(out, "output_truncated"))
		json_object_set_new(out, "logs", json_pack("{s:O?, s:O?}", "stdout",
							   json_object_get(json_object_get(art, "stdout.log"), "url"),
							   "stderr",
							   json_object_get(json_object_get(art, "stderr.log"), "url")));
	json_decref(task);
	return mcp_json_result(failed, out);
}

static json_t *session_summary(json_t *s)
{
	json_t *o = json_pack("{s:O?, s:O?, s:O?, s:O?}", "sandbox_id", json_object_get(s, "id"), "state",
			      json_object_get(s, "state"), "template", json_object_get(s, "template"), "expires_at",
			      json_object_get(s, "expires_at"));

	json_t *vols = json_object_get(s, "volumes"), *v;
	size_t i;

	if (json_is_string(json_object_get(s, "snapshot_id")))
		json_object_set(o, "snapshot_id", json_object_get(s, "snapshot_id"));
	if (json_array_size(vols)) {
		json_t *out = json_array();

		json_array_foreach(vols, i, v)
			json_array_append_new(out, json_pack("{s:O?, s:O?, s:O?, s:b}", "name", json_object_get(v, "name"),
							     "volume_id", json_object_get(v, "id"), "path",
							     json_object_get(v, "path"), "read_only",
							     json_is_true(json_object_get(v, "read_only"))));
		json_object_set_new(o, "volumes", out);
	}
	return o;
}

/* A volume as the tools show it: kiln-api's JSON with "id" as "volume_id"
 * and each mount's "session_id" as "sandbox_id". */
static json_t *volume_summary(json_t *v)
{
	json_t *o = json_pack("{s:O?, s:O?, s:O?, s:O?}", "volume_id", json_object_get(v, "id"), "name",
			      json_object_get(v, "name"), "size_mib", json_object_get(v, "size_mib"), "created_ms",
			      json_object_get(v, "created_ms")),
	       *mounts = json_array(), *m;
	size_t i;

	json_array_foreach(json_object_get(v, "mounted_by"), i, m)
		json_array_append_new(mounts, json_pack("{s:O?, s:b}", "sandbox_id", json_object_get(m, "session_id"),
							"read_only", json_is_true(json_object_get(m, "read_only"))));
	json_object_set_new(o, "mounted_by", mounts);
	if (json_object_get(v, "bytes"))
		json_object_set(o, "bytes", json_object_get(v, "bytes"));
	return o;
}

/* create_sandbox's "volumes": at most 2 {"name","path","read_only"?}, as
 * kiln-api's session "volumes" into *out (caller decrefs; NULL when absent).
 * -1 with *res the bad-argument result. */
static int arg_volumes(json_t *args, json_t **out, json_t **res)
{
	json_t *vols = json_object_get(args, "volumes"), *v;
	size_t i;

	*out = NULL;
	if (!vols || json_is_null(vols))
		return 0;
	if (!json_is_array(vols) || json_array_size(vols) > 2) {
		*res = mcp_text_result(1, "create_sandbox: bad argument: \"volumes\" must be a list of at most 2 "
					  "{\"name\",\"path\",\"read_only\"}");
		return -1;
	}
	*out = json_array();
	json_array_foreach(vols, i, v) {
		const char *name = json_string_value(json_object_get(v, "name"));
		const char *path = json_string_value(json_object_get(v, "path"));
		json_t *ro = json_object_get(v, "read_only"), *m;

		if (!name || !cli_volume_name_ok(name)) {
			*res = mcp_text_result(1, "create_sandbox: bad argument: volumes[%zu].name must be a volume's name "
						  "(create_volume, list_volumes)", i);
			goto bad;
		}
		if (!path || path[0] != '/' || !path[1] || strlen(path) > 4095) {
			*res = mcp_text_result(1, "create_sandbox: bad argument: volumes[%zu].path must be an absolute "
						  "path other than /, such as /data", i);
			goto bad;
		}
		if (ro && !json_is_boolean(ro)) {
			*res = mcp_text_result(1, "create_sandbox: bad argument: volumes[%zu].read_only must be true or "
						  "false", i);
			goto bad;
		}
		m = json_pack("{s:s, s:s}", "name", name, "path", path);
		if (ro)
			json_object_set(m, "read_only", ro);
		json_array_append_new(*out, m);
	}
	return 0;
bad:
	json_decref(*out);
	*out = NULL;
	return -1;
}

/* A snapshot as the tools show it: kiln-api's JSON with "id" as
 * "snapshot_id" and "session_id" as "sandbox_id". */
static json_t *snapshot_summary(json_t *s)
{
	return json_pack("{s:O?, s:O?, s:O?, s:O?, s:O?, s:O?, s:O?, s:O?}", "snapshot_id", json_object_get(s, "id"),
			 "name", json_object_get(s, "name"), "sandbox_id", json_object_get(s, "session_id"), "template",
			 json_object_get(s, "template"), "memory_mib", json_object_get(s, "memory_mib"), "vcpus",
			 json_object_get(s, "vcpus"), "bytes", json_object_get(s, "bytes"), "created_ms",
			 json_object_get(s, "created_ms"));
}

static json_t *t_create(struct mcp_ctx *c, json_t *args)
{
	const char *template, *snap;
	long mem, vcpus, idle, life;
	json_t *res = NULL, *body, *limits, *s, *vols;

	if (arg_str(args, "create_sandbox", "template", 0, &template, &res) < 0 ||
	    arg_int(args, "create_sandbox", "memory_mib", 128, 16384, &mem, &res) < 0 ||
	    arg_int(args, "create_sandbox", "vcpus", 1, 16, &vcpus, &res) < 0 ||
	    arg_int(args, "create_sandbox", "idle_timeout", 1, 86400, &idle, &res) < 0 ||
	    arg_int(args, "create_sandbox", "lifetime", 1, 604800, &life, &res) < 0 ||
	    arg_str(args, "create_sandbox", "snapshot_id", 0, &snap, &res) < 0)
		return res;
	if (snap && !cli_id_ok(snap))
		return mcp_text_result(1, "create_sandbox: bad argument: \"snapshot_id\" \"%.60s\" is not a snapshot id "
					  "(snap_...)", snap);
	if (snap && (template || mem || vcpus))
		return mcp_text_result(1, "create_sandbox: bad argument: with \"snapshot_id\" the sandbox has the "
					  "snapshot's template, memory and vCPUs: leave out \"template\", \"memory_mib\" "
					  "and \"vcpus\"");
	if (arg_volumes(args, &vols, &res) < 0)
		return res;
	body = json_object();
	if (vols)
		json_object_set_new(body, "volumes", vols);
	if (snap)
		json_object_set_new(body, "snapshot", json_string(snap));
	limits = json_object();
	if (mem)
		json_object_set_new(limits, "memory_mib", json_integer(mem));
	if (vcpus)
		json_object_set_new(limits, "vcpus", json_integer(vcpus));
	if (json_object_size(limits))
		json_object_set(body, "limits", limits);
	json_decref(limits);
	if (template)
		json_object_set_new(body, "template", json_string(template));
	if (idle)
		json_object_set_new(body, "idle_timeout_s", json_integer(idle));
	if (life)
		json_object_set_new(body, "max_lifetime_s", json_integer(life));
	if (request(c, "create_sandbox", "POST", "/v1/sessions", body, 300, &s, &res) < 0) {
		json_decref(body);
		return res;
	}
	json_decref(body);
	res = mcp_json_result(0, session_summary(s));
	json_decref(s);
	return res;
}

static json_t *t_exec(struct mcp_ctx *c, json_t *args)
{
	const char *id, *cmd, *cwd, *in;
	json_t *res = NULL, *body, *env = json_object_get(args, "env"), *r, *v;
	const char *k;
	long timeout;
	char path[128];
	int failed;

	if (arg_sandbox(args, "exec", &id, &res) < 0 || arg_str(args, "exec", "command", 1, &cmd, &res) < 0 ||
	    arg_str(args, "exec", "cwd", 0, &cwd, &res) < 0 || arg_str(args, "exec", "stdin", 0, &in, &res) < 0 ||
	    arg_int(args, "exec", "timeout", 1, 86400, &timeout, &res) < 0)
		return res;
	if (env && !json_is_object(env))
		return mcp_text_result(1, "exec: bad argument: \"env\" must be an object of strings");
	json_object_foreach(env, k, v)
		if (!json_is_string(v))
			return mcp_text_result(1, "exec: bad argument: env.%.60s must be a string", k);
	body = json_pack("{s:[s, s, s]}", "argv", "bash", "-c", cmd);
	if (cwd)
		json_object_set_new(body, "cwd", json_string(cwd));
	if (env && json_object_size(env))
		json_object_set(body, "env", env);
	if (timeout)
		json_object_set_new(body, "timeout_s", json_integer(timeout));
	if (in) {
		char *enc = b64((const unsigned char *)in, json_string_length(json_object_get(args, "stdin")));

		json_object_set_new(body, "stdin_b64", json_string(enc ? enc : ""));
		free(enc);
	}
	snprintf(path, sizeof(path), "/v1/sessions/%s/exec", id);
	if (request(c, "exec", "POST", path, body, (timeout ? timeout : 30) + 60, &r, &res) < 0) {
		json_decref(body);
		return res;
	}
	json_decref(body);
	res = mcp_json_result(0, command_summary(r, &failed));
	json_object_set_new(res, "isError", json_boolean(failed));
	json_decref(r);
	return res;
}

static json_t *t_write(struct mcp_ctx *c, json_t *args)
{
	struct kiln_err err = { .code = "" };
	const char *id, *p, *content, *enc;
	json_t *res = NULL, *reply = NULL;
	unsigned char *bytes = NULL;
	size_t len;
	char path[16384];
	int st;

	if (arg_sandbox(args, "write_file", &id, &res) < 0 || arg_str(args, "write_file", "path", 1, &p, &res) < 0 ||
	    arg_str(args, "write_file", "content", 1, &content, &res) < 0 ||
	    arg_str(args, "write_file", "encoding", 0, &enc, &res) < 0 ||
	    files_path("write_file", id, "path", p, path, sizeof(path), &res) < 0)
		return res;
	len = json_string_length(json_object_get(args, "content"));
	if (enc && !strcmp(enc, "base64")) {
		size_t n = len, pad = 0;
		int got;

		bytes = malloc(3 * (n / 4) + 3);
		got = bytes && n % 4 == 0 ? EVP_DecodeBlock(bytes, (const unsigned char *)content, (int)n) : -1;
		if (got < 0) {
			free(bytes);
			return mcp_text_result(1, "write_file: bad argument: \"content\" is not valid base64");
		}
		if (n && content[n - 1] == '=')
			pad++;
		if (n > 1 && content[n - 2] == '=')
			pad++;
		len = (size_t)got - pad;
	} else if (enc && strcmp(enc, "utf8")) {
		return mcp_text_result(1, "write_file: bad argument: \"encoding\" must be utf8 or base64");
	}
	st = http_send(&c->conn, "PUT", path, bytes ? (const void *)bytes : content, len, "application/octet-stream", 300,
		       &reply, &err);
	free(bytes);
	if (st != 200)
		return api_error("write_file", st, reply, &err);
	res = mcp_text_result(0, "wrote %lld bytes to %s", (long long)json_integer_value(json_object_get(reply, "size")),
			      json_string_value(json_object_get(reply, "path")) ?: p);
	json_decref(reply);
	return res;
}

static json_t *t_read(struct mcp_ctx *c, json_t *args)
{
	struct kiln_err err = { .code = "" };
	const char *id, *p;
	json_t *res = NULL, *reply = NULL;
	char path[16384], tmp[] = "/tmp/kiln-mcp-XXXXXX";
	unsigned char *data;
	size_t len;
	int fd, st;

	if (arg_sandbox(args, "read_file", &id, &res) < 0 || arg_str(args, "read_file", "path", 1, &p, &res) < 0 ||
	    files_path("read_file", id, "path", p, path, sizeof(path), &res) < 0)
		return res;
	fd = mkstemp(tmp);
	if (fd < 0)
		return mcp_text_result(1, "read_file: a temporary file: %s", strerror(errno));
	close(fd);
	st = http_get_file(&c->conn, path, tmp, 300, &reply, &err);
	if (st != 200) {
		unlink(tmp);
		return api_error("read_file", st, reply, &err);
	}
	json_decref(reply);
	data = cli_read_file(tmp, READ_MAX, &len, NULL);
	unlink(tmp);
	if (!data)
		return mcp_text_result(1, "read_file: %s is larger than %u MiB (or could not be read)", p, READ_MAX >> 20);
	/* jansson takes only valid UTF-8 as a string: other bytes go as base64. */
	res = json_pack("{s:[{s:s, s:s%}], s:b}", "content", "type", "text", "text", (char *)data, len, "isError", 0);
	if (!res) {
		char *enc = b64(data, len);

		res = mcp_text_result(0, "%s is binary (%zu bytes); base64 follows in the next item", p, len);
		json_array_append_new(json_object_get(res, "content"),
				      json_pack("{s:s, s:s}", "type", "text", "text", enc ? enc : ""));
		free(enc);
	}
	free(data);
	return res ? res : mcp_text_result(1, "read_file: out of memory");
}

static json_t *t_list(struct mcp_ctx *c, json_t *args)
{
	const char *id, *p;
	json_t *res = NULL, *reply;
	char path[16384];

	if (arg_sandbox(args, "list_files", &id, &res) < 0 || arg_str(args, "list_files", "path", 0, &p, &res) < 0 ||
	    files_path("list_files", id, "dir", p ? p : "/work", path, sizeof(path), &res) < 0)
		return res;
	if (request(c, "list_files", "GET", path, NULL, 60, &reply, &res) < 0)
		return res;
	res = mcp_json_result(0, json_pack("{s:s, s:O}", "path", p ? p : "/work", "entries",
					    json_object_get(reply, "entries") ?: json_array()));
	json_decref(reply);
	return res;
}

static json_t *t_lifecycle(struct mcp_ctx *c, const char *tool, json_t *args)
{
	const char *id, *method = "POST", *verb;
	json_t *res = NULL, *s;
	char path[128];

	if (arg_sandbox(args, tool, &id, &res) < 0)
		return res;
	if (!strcmp(tool, "destroy_sandbox"))
		method = "DELETE", verb = "";
	else
		verb = !strcmp(tool, "pause_sandbox") ? "/pause" : "/resume";
	snprintf(path, sizeof(path), "/v1/sessions/%s%s", id, verb);
	if (request(c, tool, method, path, NULL, 600, &s, &res) < 0)
		return res;
	res = mcp_json_result(0, session_summary(s));
	json_decref(s);
	return res;
}

/* fork_sandbox: POST /v1/sessions/{id}/fork. An error result only when no
 * fork was made; refusals of some are listed in "errors" either way. */
static json_t *t_fork(struct mcp_ctx *c, json_t *args)
{
	const char *id;
	json_t *res = NULL, *body, *r, *ids, *boxes, *errs, *v;
	long count;
	char path[128];
	size_t i;

	if (arg_sandbox(args, "fork_sandbox", &id, &res) < 0 ||
	    arg_int(args, "fork_sandbox", "count", 1, 20, &count, &res) < 0)
		return res;
	body = json_pack("{s:i}", "count", (int)(count ? count : 1));
	snprintf(path, sizeof(path), "/v1/sessions/%s/fork", id);
	if (request(c, "fork_sandbox", "POST", path, body, 960, &r, &res) < 0) {
		json_decref(body);
		return res;
	}
	json_decref(body);
	ids = json_array();
	boxes = json_array();
	json_array_foreach(json_object_get(r, "sessions"), i, v) {
		json_array_append(ids, json_object_get(v, "id") ?: json_null());
		json_array_append_new(boxes, session_summary(v));
	}
	errs = json_object_get(r, "errors");
	res = json_pack("{s:s, s:o, s:O?, s:o, s:o}", "parent", id, "sandbox_ids", ids, "stop_ms",
			json_object_get(r, "stop_ms"), "sandboxes", boxes, "errors",
			json_is_array(errs) ? json_incref(errs) : json_array());
	json_decref(r);
	return mcp_json_result(!json_array_size(ids), res);
}

static json_t *t_snapshot(struct mcp_ctx *c, json_t *args)
{
	const char *id, *name;
	json_t *res = NULL, *body, *r;
	char path[128];

	if (arg_sandbox(args, "snapshot_sandbox", &id, &res) < 0 ||
	    arg_str(args, "snapshot_sandbox", "name", 0, &name, &res) < 0)
		return res;
	body = name ? json_pack("{s:s}", "name", name) : json_object();
	snprintf(path, sizeof(path), "/v1/sessions/%s/snapshots", id);
	if (request(c, "snapshot_sandbox", "POST", path, body, 960, &r, &res) < 0) {
		json_decref(body);
		return res;
	}
	json_decref(body);
	res = mcp_json_result(0, snapshot_summary(r));
	json_decref(r);
	return res;
}

#define LIST_MAX_PAGES 100 /* 10 000 snapshots: more would not help an agent */

/* list_snapshots: every page of GET /v1/snapshots (following "next"). */
static json_t *t_list_snapshots(struct mcp_ctx *c, json_t *args)
{
	const char *name;
	json_t *res = NULL, *all, *r, *v;
	char path[2048], after[512] = "";
	size_t i;
	int pages;

	if (arg_str(args, "list_snapshots", "name", 0, &name, &res) < 0)
		return res;
	all = json_array();
	for (pages = 0; pages < LIST_MAX_PAGES; pages++) {
		const char *tok;

		if (cli_snapshot_list_path(name, NULL, after, path, sizeof(path)) < 0) {
			json_decref(all);
			return mcp_text_result(1, "list_snapshots: bad argument: \"name\" is too long");
		}
		if (request(c, "list_snapshots", "GET", path, NULL, 30, &r, &res) < 0) {
			json_decref(all);
			return res;
		}
		json_array_foreach(json_object_get(r, "snapshots"), i, v)
			json_array_append_new(all, snapshot_summary(v));
		tok = json_string_value(json_object_get(r, "next"));
		if (!tok || !*tok || strlen(tok) >= sizeof(after) || !strcmp(tok, after)) {
			/* The last page, or a token that would not move on. */
			json_decref(r);
			break;
		}
		snprintf(after, sizeof(after), "%s", tok);
		json_decref(r);
	}
	return mcp_json_result(0, json_pack("{s:o}", "snapshots", all));
}

static json_t *t_delete_snapshot(struct mcp_ctx *c, json_t *args)
{
	const char *id;
	json_t *res = NULL, *r;
	char path[128];

	if (arg_str(args, "delete_snapshot", "snapshot_id", 1, &id, &res) < 0)
		return res;
	if (!cli_id_ok(id))
		return mcp_text_result(1, "delete_snapshot: bad argument: \"snapshot_id\" \"%.60s\" is not a snapshot "
					  "id (snap_...)", id);
	snprintf(path, sizeof(path), "/v1/snapshots/%s", id);
	if (request(c, "delete_snapshot", "DELETE", path, NULL, 120, &r, &res) < 0)
		return res;
	json_decref(r);
	return mcp_text_result(0, "deleted snapshot %s", id);
}

static json_t *t_create_volume(struct mcp_ctx *c, json_t *args)
{
	const char *name;
	long size;
	json_t *res = NULL, *body, *r;

	if (arg_str(args, "create_volume", "name", 1, &name, &res) < 0 ||
	    arg_int(args, "create_volume", "size_mib", 16, 65536, &size, &res) < 0)
		return res;
	if (!cli_volume_name_ok(name))
		return mcp_text_result(1, "create_volume: bad argument: \"name\" \"%.60s\" is not a volume name (1-63 "
					  "of A-Z a-z 0-9 . _ -)", name);
	body = json_pack("{s:s}", "name", name);
	if (size)
		json_object_set_new(body, "size_mib", json_integer(size));
	if (request(c, "create_volume", "POST", "/v1/volumes", body, 60, &r, &res) < 0) {
		json_decref(body);
		return res;
	}
	json_decref(body);
	res = mcp_json_result(0, volume_summary(r));
	json_decref(r);
	return res;
}

static json_t *t_list_volumes(struct mcp_ctx *c, json_t *args)
{
	const char *name;
	json_t *res = NULL, *all, *r, *v;
	char path[128];
	size_t i;

	if (arg_str(args, "list_volumes", "name", 0, &name, &res) < 0)
		return res;
	if (name && !cli_volume_name_ok(name))
		return mcp_text_result(1, "list_volumes: bad argument: \"name\" \"%.60s\" is not a volume name", name);
	/* A name is of URL-safe characters only (cli_volume_name_ok). */
	snprintf(path, sizeof(path), "/v1/volumes%s%s", name ? "?name=" : "", name ? name : "");
	if (request(c, "list_volumes", "GET", path, NULL, 30, &r, &res) < 0)
		return res;
	all = json_array();
	json_array_foreach(json_object_get(r, "volumes"), i, v)
		json_array_append_new(all, volume_summary(v));
	json_decref(r);
	return mcp_json_result(0, json_pack("{s:o}", "volumes", all));
}

static json_t *t_delete_volume(struct mcp_ctx *c, json_t *args)
{
	const char *vol;
	json_t *res = NULL, *r;
	char path[128];

	if (arg_str(args, "delete_volume", "volume", 1, &vol, &res) < 0)
		return res;
	if (!cli_volume_name_ok(vol))
		return mcp_text_result(1, "delete_volume: bad argument: \"volume\" \"%.60s\" is not a volume's id or "
					  "name", vol);
	snprintf(path, sizeof(path), "/v1/volumes/%s", vol);
	if (request(c, "delete_volume", "DELETE", path, NULL, 120, &r, &res) < 0)
		return res;
	res = mcp_text_result(0, "deleted volume %s", json_string_value(json_object_get(r, "id")) ?: vol);
	json_decref(r);
	return res;
}

static json_t *call(void *ctx, const char *name, json_t *args)
{
	struct mcp_ctx *c = ctx;

	fprintf(stderr, "kiln mcp: tools/call %s\n", name);
	if (c->config_error[0])
		return mcp_text_result(1, "%s: %s", name, c->config_error);
	if (!strcmp(name, "run_code"))
		return t_run_code(c, args);
	if (!strcmp(name, "create_sandbox"))
		return t_create(c, args);
	if (!strcmp(name, "exec"))
		return t_exec(c, args);
	if (!strcmp(name, "write_file"))
		return t_write(c, args);
	if (!strcmp(name, "read_file"))
		return t_read(c, args);
	if (!strcmp(name, "list_files"))
		return t_list(c, args);
	if (!strcmp(name, "fork_sandbox"))
		return t_fork(c, args);
	if (!strcmp(name, "snapshot_sandbox"))
		return t_snapshot(c, args);
	if (!strcmp(name, "list_snapshots"))
		return t_list_snapshots(c, args);
	if (!strcmp(name, "delete_snapshot"))
		return t_delete_snapshot(c, args);
	if (!strcmp(name, "create_volume"))
		return t_create_volume(c, args);
	if (!strcmp(name, "list_volumes"))
		return t_list_volumes(c, args);
	if (!strcmp(name, "delete_volume"))
		return t_delete_volume(c, args);
	return t_lifecycle(c, name, args);
}

int cmd_mcp(int argc, char **argv)
{
	static struct mcp_ctx c;
	struct mcp_server s = { .call = call, .ctx = &c };
	struct kiln_err err = { .code = "" };
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	if (argc > 1) {
		FILE *f = strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? stderr : stdout;

		fprintf(f, "usage: kiln mcp\n"
			   "  A Model Context Protocol server on stdin/stdout (docs/mcp.md): tools to run code\n"
			   "  and use sandboxes through kiln-api with KILN_API and KILN_KEY (else the\n"
			   "  credentials file of `kiln up`). Logs go to stderr.\n");
		return f == stdout ? 0 : EXIT_USAGE;
	}
	signal(SIGPIPE, SIG_IGN);
	if (creds_load(&c.cr, &err) < 0)
		snprintf(c.config_error, sizeof(c.config_error), "%s", err.message);
	else if (!c.cr.api[0] || !(c.cr.key[0] ? c.cr.key : c.cr.admin_key)[0])
		snprintf(c.config_error, sizeof(c.config_error),
			 "no %s configured: set KILN_API and KILN_KEY in the MCP server's env", !c.cr.api[0] ? "API" : "key");
	c.conn.api = c.cr.api;
	c.conn.key = c.cr.key[0] ? c.cr.key : c.cr.admin_key;
	fprintf(stderr, "kiln mcp: serving on stdin/stdout (API %s)%s%s\n", c.cr.api[0] ? c.cr.api : "none",
		c.config_error[0] ? ": " : "", c.config_error);
	while ((n = getline(&line, &cap, stdin)) >= 0) {
		char *out;

		if ((size_t)n > MCP_MAX_LINE)
			out = strdup("{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"message too large\"}}");
		else
			out = mcp_handle(&s, line, (size_t)n);
		if (!out)
			continue;
		if (fprintf(stdout, "%s\n", out) < 0 || fflush(stdout)) {
			free(out);
			break;
		}
		free(out);
	}
	free(line);
	fprintf(stderr, "kiln mcp: stdin closed, exiting\n");
	return 0;
}
