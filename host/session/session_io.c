/* session_io: a session's commands, their interactive input, its files
 * and directories (as tar) and its outputs, all over the VM's agent
 * channel (see session.h). */
#include "session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "fsutil.h"
#include "proto.h"

#define SESSION_FILE_MAX   (64u << 20) /* a file read back with GET .../files */
#define SESSION_STDIN_MAX  (16u << 20) /* a command's stdin_b64, decoded */
#define SESSION_STDIN_PATH "/kiln/stdin"
/* Interactive commands: what one input request may carry, decoded, and the
 * pipe that holds input on its way to the guest. Each frame in the pipe is
 * at most PIPE_BUF bytes, so that it is written (and later read) whole. */
#define SESSION_INPUT_MAX   (256u << 10)
#define SESSION_INPUT_PIPE  (1u << 20)
#define SESSION_INPUT_CHUNK (PIPE_BUF - PROTO_HDR_SIZE)

/* ---- commands and files ------------------------------------------------- */

/* The session's command as a task spec: the session's limits plus the
 * command's own timeout, so that the spec parser checks everything. */
static int exec_spec(const struct session *s, json_t *req, struct task_spec *ts, struct kiln_err *err)
{
	const char *k;
	json_t *v, *j, *limits;
	char *text;
	int r;

	if (!json_is_object(req))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "expected a JSON object");
	j = json_object();
	json_object_foreach(req, k, v) {
		if (!strcmp(k, "timeout_s") || !strcmp(k, "stdin_b64") || !strcmp(k, "tty") || !strcmp(k, "interactive"))
			continue;
		if (strcmp(k, "argv") && strcmp(k, "language") && strcmp(k, "code") && strcmp(k, "env") &&
		    strcmp(k, "cwd") && strcmp(k, "files")) {
			json_decref(j);
			return kiln_err_set(err, KERR_INVALID_SPEC, "%s: not a field of a session command", k);
		}
		json_object_set(j, k, v);
	}
	limits = json_pack("{s:i, s:i, s:i}", "vcpus", (int)s->vcpus, "memory_mib", (int)s->memory_mib, "output_mib",
			   (int)s->output_mib);
	if (json_object_get(req, "timeout_s"))
		json_object_set(limits, "timeout_s", json_object_get(req, "timeout_s"));
	json_object_set_new(j, "limits", limits);
	text = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!text)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r = spec_parse(text, strlen(text), ts, err);
	free(text);
	return r;
}

/* The field `name` of req (standard base64, padded), decoded: *data is
 * malloc'd (NULL when there is none). At most max bytes. 0 or -1 with err. */
static int field_b64(json_t *req, const char *name, size_t max, unsigned char **data, size_t *len,
		     struct kiln_err *err)
{
	json_t *v = json_object_get(req, name);
	const char *b;
	size_t n;
	int got;

	*data = NULL;
	*len = 0;
	if (!v)
		return 0;
	b = json_string_value(v);
	n = b ? strlen(b) : 0;
	/* The decoded length: padding ('=') carries no data. */
	if (!b || n % 4 || n / 4 * 3 - (n && b[n - 1] == '=') - (n > 1 && b[n - 2] == '=') > max)
		return kiln_err_set(err, KERR_INVALID_SPEC, "%s: expected padded base64 of at most %zu KiB", name,
				    max >> 10);
	*data = malloc(n / 4 * 3 + 1);
	if (!*data)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	got = n ? EVP_DecodeBlock(*data, (const unsigned char *)b, (int)n) : 0;
	for (size_t i = 0; i < n; i++)
		if (b[i] == '=' && i < n - 2)
			got = -1; /* padding only at the end */
	if (got < 0) {
		free(*data);
		*data = NULL;
		return kiln_err_set(err, KERR_INVALID_SPEC, "%s: not valid base64", name);
	}
	if (n && b[n - 1] == '=')
		got--;
	if (n > 1 && b[n - 2] == '=')
		got--;
	*len = (size_t)got;
	return 0;
}

/* "interactive": true (stdin from input requests) or "tty": {"rows","cols"}
 * (a terminal, input typed into it): the PROTO_EXEC_* flag and size. */
static int exec_interactive(json_t *req, unsigned *flags, uint32_t *rows, uint32_t *cols, struct kiln_err *err)
{
	json_t *tty = json_object_get(req, "tty"), *ia = json_object_get(req, "interactive"), *v;
	const char *k;

	*flags = 0;
	*rows = *cols = 0;
	if (ia && !json_is_boolean(ia))
		return kiln_err_set(err, KERR_INVALID_SPEC, "interactive: expected true or false");
	if (json_is_true(ia))
		*flags = PROTO_EXEC_STDIN;
	if (!tty || json_is_null(tty))
		goto done;
	if (!json_is_object(tty))
		return kiln_err_set(err, KERR_INVALID_SPEC, "tty: expected an object {\"rows\":N,\"cols\":N}");
	json_object_foreach(tty, k, v) {
		json_int_t n = json_integer_value(v);

		if (strcmp(k, "rows") && strcmp(k, "cols"))
			return kiln_err_set(err, KERR_INVALID_SPEC, "tty.%s: not a field (rows, cols)", k);
		if (!json_is_integer(v) || n < 1 || n > PROTO_MAX_TTY_DIM)
			return kiln_err_set(err, KERR_INVALID_SPEC, "tty.%s: expected an integer from 1 to %d", k,
					    PROTO_MAX_TTY_DIM);
		*(k[0] == 'r' ? rows : cols) = (uint32_t)n;
	}
	if (!*rows || !*cols)
		return kiln_err_set(err, KERR_INVALID_SPEC, "tty: both rows and cols are required");
	*flags = PROTO_EXEC_TTY;
done:
	if (*flags && json_object_get(req, "stdin_b64"))
		return kiln_err_set(err, KERR_INVALID_SPEC, "stdin_b64: not with an interactive command (send input instead)");
	return 0;
}

/* Run the command with its stdin from SESSION_STDIN_PATH: argv behind a
 * shell that redirects and execs it (the guest starts every command with
 * stdin at /dev/null). */
static int wrap_stdin(struct task_spec *ts, struct kiln_err *err)
{
	static const char *const pre[] = { "/bin/sh", "-c", "exec \"$@\" < " SESSION_STDIN_PATH, "sh" };
	char **argv = calloc(ts->argc + 5, sizeof(*argv));

	if (!argv)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	for (size_t i = 0; i < 4; i++)
		if (!(argv[i] = strdup(pre[i]))) {
			for (size_t j = 0; j < i; j++)
				free(argv[j]);
			free(argv);
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		}
	memcpy(argv + 4, ts->argv, ts->argc * sizeof(*argv));
	free(ts->argv);
	ts->argv = argv;
	ts->argc += 4;
	ts->language = SPEC_LANG_NONE; /* not the pre-started interpreter: it has no stdin */
	return 0;
}

/* The VM stopped answering, or the host's memory budget ran out and the
 * kernel killed it (end_reason host_memory): the session is over. */
static int vm_broken(json_t *result)
{
	const char *reason = json_string_value(json_object_get(result, "end_reason")) ?: "";

	return !strcmp(json_string_value(json_object_get(result, "state")) ?: "", "error") &&
	       (!strcmp(reason, "vm_error") || !strcmp(reason, "host_memory"));
}

/* The interactive command is over: no more input requests reach it. */
static void input_close(struct session_table *ss, struct session *s, int rd)
{
	pthread_mutex_lock(&ss->lock);
	if (s->input_wr >= 0)
		close(s->input_wr);
	s->input_wr = -1;
	s->exec_id[0] = '\0';
	pthread_mutex_unlock(&ss->lock);
	if (rd >= 0)
		close(rd);
}

/* One command in a session whose op lock the caller holds (session_take);
 * *gone says whether the VM broke and the session ended (for session_put). */
static json_t *exec_held(struct session_table *ss, struct session *s, json_t *req,
			 void (*on_event)(void *ctx, int event, const void *data, size_t len), void *ctx, int *gone,
			 struct kiln_err *err)
{
	struct run_opts opts;
	struct task_spec ts;
	json_t *result;
	unsigned char *in = NULL, rnd[16];
	size_t in_len = 0;
	unsigned flags;
	uint32_t rows, cols;
	int broken, pipe_fd[2] = { -1, -1 };
	char exec_id[33] = "";

	*gone = 0;
	if (s->state != SS_RUNNING) {
		kiln_err_set(err, KERR_BUSY, "session %s is being paused", s->id);
		return NULL;
	}
	if (exec_interactive(req, &flags, &rows, &cols, err) < 0 || exec_spec(s, req, &ts, err) < 0)
		return NULL;
	if (flags) {
		if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd) || pipe2(pipe_fd, O_CLOEXEC | O_NONBLOCK) < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "interactive command: %s", strerror(errno));
			spec_free(&ts);
			return NULL;
		}
		/* Room for a burst of typing or a pasted file; the default 64 KiB if refused. */
		fcntl(pipe_fd[1], F_SETPIPE_SZ, SESSION_INPUT_PIPE);
		for (size_t i = 0; i < sizeof(rnd); i++)
			sprintf(exec_id + 2 * i, "%02x", rnd[i]);
		pthread_mutex_lock(&ss->lock);
		memcpy(s->exec_id, exec_id, sizeof(exec_id));
		s->input_wr = pipe_fd[1];
		pthread_mutex_unlock(&ss->lock);
	}
	if (field_b64(req, "stdin_b64", SESSION_STDIN_MAX, &in, &in_len, err) < 0 ||
	    (in && (wrap_stdin(&ts, err) < 0 ||
		    run_session_put(&s->vm, SESSION_STDIN_PATH, in, in_len, 0600, err) < 0))) {
		free(in);
		spec_free(&ts);
		input_close(ss, s, pipe_fd[0]);
		return NULL;
	}
	free(in);
	opts = *hostd_run_opts(ss->d);
	if (s->has_tu && s->tu.user_set) {
		opts.user_set = 1;
		opts.uid = s->tu.uid;
		opts.gid = s->tu.gid;
	}
	opts.vm.cancel_fd = -1;
	opts.stream = NULL;
	opts.on_event = on_event;
	opts.event_ctx = ctx;
	opts.extra_flags = flags;
	opts.tty_rows = rows;
	opts.tty_cols = cols;
	opts.input_fd = pipe_fd[0];
	opts.exec_id = flags ? exec_id : NULL;
	result = run_session_exec(&s->vm, &ts, &opts);
	spec_free(&ts);
	input_close(ss, s, pipe_fd[0]);
	broken = vm_broken(result);
	if (broken) {
		fprintf(stderr, "kiln-host: session %s: its VM failed (%s); the session ends\n", s->id,
			json_string_value(json_object_get(result, "end_reason")));
		session_teardown(ss, s);
	}
	*gone = broken;
	return result;
}

json_t *session_exec(struct session_table *ss, const char *id, json_t *req,
		     void (*on_event)(void *ctx, int event, const void *data, size_t len), void *ctx,
		     struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	json_t *result;
	int gone;

	if (!s)
		return NULL;
	result = exec_held(ss, s, req, on_event, ctx, &gone, err);
	session_put(ss, s, gone);
	return result;
}

/* One frame into the input pipe, whole (the caller checked the room). */
static int input_frame(int fd, uint8_t type, const void *p, size_t n)
{
	uint8_t frame[PIPE_BUF];

	proto_frame_header(frame, type, (uint32_t)n);
	if (n)
		memcpy(frame + PROTO_HDR_SIZE, p, n);
	return write(fd, frame, PROTO_HDR_SIZE + n) == (ssize_t)(PROTO_HDR_SIZE + n) ? 0 : -1;
}

json_t *session_input(struct session_table *ss, const char *id, json_t *req, struct kiln_err *err)
{
	json_t *resize = json_object_get(req, "resize"), *eof = json_object_get(req, "eof"), *v;
	const char *exec_id = json_string_value(json_object_get(req, "exec_id")), *k;
	unsigned char *data = NULL;
	uint8_t rs[8];
	uint32_t rows = 0, cols = 0;
	size_t len = 0, need = 0, room, frames;
	struct session *s;
	int r = -1, queued = 0, size;

	if (!json_is_object(req)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "expected a JSON object");
		return NULL;
	}
	json_object_foreach(req, k, v)
		if (strcmp(k, "exec_id") && strcmp(k, "data_b64") && strcmp(k, "eof") && strcmp(k, "resize")) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "%s: not a field of an input request", k);
			return NULL;
		}
	if (!exec_id) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "exec_id: expected the string the command's started event gave");
		return NULL;
	}
	if (eof && !json_is_boolean(eof)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "eof: expected true or false");
		return NULL;
	}
	if (resize && (!json_is_object(resize) || json_object_size(resize) != 2 ||
		       json_integer_value(json_object_get(resize, "rows")) < 1 ||
		       json_integer_value(json_object_get(resize, "rows")) > PROTO_MAX_TTY_DIM ||
		       json_integer_value(json_object_get(resize, "cols")) < 1 ||
		       json_integer_value(json_object_get(resize, "cols")) > PROTO_MAX_TTY_DIM)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "resize: expected {\"rows\":N,\"cols\":N}, each from 1 to %d",
			     PROTO_MAX_TTY_DIM);
		return NULL;
	}
	if (field_b64(req, "data_b64", SESSION_INPUT_MAX, &data, &len, err) < 0) {
		kiln_err_recode(err, KERR_INVALID_REQUEST);
		return NULL;
	}
	if (resize) {
		rows = (uint32_t)json_integer_value(json_object_get(resize, "rows"));
		cols = (uint32_t)json_integer_value(json_object_get(resize, "cols"));
		proto_resize_encode(rs, sizeof(rs), rows, cols);
		need += PROTO_HDR_SIZE + sizeof(rs);
	}
	frames = (len + SESSION_INPUT_CHUNK - 1) / SESSION_INPUT_CHUNK + (resize != NULL) + json_is_true(eof);
	need += len + (len + SESSION_INPUT_CHUNK - 1) / SESSION_INPUT_CHUNK * PROTO_HDR_SIZE;
	if (json_is_true(eof))
		need += PROTO_HDR_SIZE;

	pthread_mutex_lock(&ss->lock);
	for (s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id))
			break;
	if (!s || s->state == SS_GONE) {
		kiln_err_set(err, KERR_NOT_FOUND, "no session %s on this host", id);
		goto out;
	}
	if (s->input_wr < 0 || strcmp(s->exec_id, exec_id)) {
		kiln_err_set(err, KERR_NO_EXEC, "no interactive command %.40s runs in session %s (it ended?)", exec_id, id);
		goto out;
	}
	/* All of it or nothing: the pipe's free room, checked under the lock
	 * that every writer takes (the reader only makes more room). */
	size = fcntl(s->input_wr, F_GETPIPE_SZ);
	if (size < 0 || ioctl(s->input_wr, FIONREAD, &queued) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "input pipe: %s", strerror(errno));
		goto out;
	}
	room = (size_t)size > (size_t)queued ? (size_t)size - (size_t)queued : 0;
	/* A frame that does not fit the pipe's last page takes a page of its
	 * own: allow a page's slack per frame. */
	if (need + frames * PIPE_BUF > room) {
		kiln_err_set(err, KERR_INPUT_FULL, "the command has not yet taken the %d bytes sent before; retry", queued);
		goto out;
	}
	if (resize && input_frame(s->input_wr, PROTO_RESIZE, rs, sizeof(rs)) < 0)
		goto write_failed;
	for (size_t off = 0; off < len; off += SESSION_INPUT_CHUNK)
		if (input_frame(s->input_wr, PROTO_STDIN, data + off,
				len - off < SESSION_INPUT_CHUNK ? len - off : SESSION_INPUT_CHUNK) < 0)
			goto write_failed;
	if (json_is_true(eof) && input_frame(s->input_wr, PROTO_STDIN, NULL, 0) < 0)
		goto write_failed;
	s->last_active_ms = clock_wall_ms();
	r = 0;
	goto out;
write_failed:
	kiln_err_set(err, KERR_HOST_ERROR, "input pipe: %s", strerror(errno));
out:
	pthread_mutex_unlock(&ss->lock);
	free(data);
	return r < 0 ? NULL : json_pack("{s:s, s:I}", "exec_id", exec_id, "accepted", (json_int_t)len);
}

void session_interrupt(struct session_table *ss, const char *id, const char *exec_id)
{
	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id) && s->input_wr >= 0 && !strcmp(s->exec_id, exec_id) &&
		    input_frame(s->input_wr, PROTO_HANGUP, NULL, 0) == 0)
			fprintf(stderr, "kiln-host: session %s: interactive command %s lost its client: hung up\n", id,
				exec_id);
	pthread_mutex_unlock(&ss->lock);
}

int session_put_file(struct session_table *ss, const char *id, const char *path, const void *data, size_t len,
		     struct kiln_err *err)
{
	struct session *s;
	int r;

	if (!path || proto_abspath_ok(path) || !strncmp(path, SPEC_RESERVED_DIR "/", sizeof(SPEC_RESERVED_DIR)))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "path: expected an absolute path without '.', '..' or empty parts, outside /kiln");
	if (len > SESSION_FILE_MAX)
		return kiln_err_set(err, KERR_TOO_LARGE, "a file is at most %u MiB", SESSION_FILE_MAX >> 20);
	s = session_take(ss, id, err);
	if (!s)
		return -1;
	r = run_session_put(&s->vm, path, data, len, SPEC_DEFAULT_MODE, err);
	session_put(ss, s, 0);
	return r;
}

/* Run argv in the session and return its stdout decoded from base64 (the
 * command pipes through base64, so any bytes survive the text result). */
static int exec_base64(struct session_table *ss, const char *id, json_t *argv, unsigned char **data, size_t *len,
		       struct kiln_err *err)
{
	json_t *req = json_pack("{s:o}", "argv", argv), *res;
	const char *out, *errs;
	size_t n;
	int got;

	res = session_exec(ss, id, req, NULL, NULL, err);
	json_decref(req);
	if (!res)
		return -1;
	if (json_integer_value(json_object_get(res, "exit_code")) != 0 ||
	    !json_is_integer(json_object_get(res, "exit_code"))) {
		errs = json_string_value(json_object_get(res, "stderr")) ?: "";
		if (strstr(errs, "No such file") || strstr(errs, "Not a directory"))
			kiln_err_set(err, KERR_NOT_FOUND, "%.300s", errs);
		else
			kiln_err_set(err, KERR_INVALID_REQUEST, "%.300s", *errs ? errs : "the guest could not read it");
		json_decref(res);
		return -1;
	}
	if (json_is_true(json_object_get(res, "stdout_truncated"))) {
		json_decref(res);
		return kiln_err_set(err, KERR_TOO_LARGE, "larger than the session's output limit allows");
	}
	out = json_string_value(json_object_get(res, "stdout")) ?: "";
	n = strlen(out);
	*data = malloc(n / 4 * 3 + 4);
	if (!*data) {
		json_decref(res);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	got = n ? EVP_DecodeBlock(*data, (const unsigned char *)out, (int)n) : 0;
	if (got < 0 || n % 4) {
		free(*data);
		*data = NULL;
		json_decref(res);
		return kiln_err_set(err, KERR_VM_ERROR, "the guest's base64 did not decode");
	}
	/* EVP_DecodeBlock counts padding as data. */
	if (n >= 1 && out[n - 1] == '=')
		got--;
	if (n >= 2 && out[n - 2] == '=')
		got--;
	*len = (size_t)got;
	json_decref(res);
	return 0;
}

int session_get_file(struct session_table *ss, const char *id, const char *path, unsigned char **data, size_t *len,
		     struct kiln_err *err)
{
	if (!path || proto_abspath_ok(path))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "path: expected an absolute path without '.', '..' or empty parts");
	/* As the task's user: what the session's code could read, nothing more. */
	return exec_base64(ss, id, json_pack("[s, s, s, s]", "/usr/bin/base64", "-w0", "--", path), data, len, err);
}

json_t *session_list_dir(struct session_table *ss, const char *id, const char *dir, struct kiln_err *err)
{
	unsigned char *raw = NULL;
	size_t len = 0, i = 0;
	json_t *entries;

	if (!dir || proto_abspath_ok(dir)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "dir: expected an absolute path without '.', '..' or empty parts");
		return NULL;
	}
	/* Type, size and name of each entry, NUL-terminated (a name may hold
	 * anything but NUL and '/'), as the task's user. */
	if (exec_base64(ss, id,
			json_pack("[s, s, s, s, s]", "/bin/sh", "-c",
				  "cd -- \"$1\" 2>/dev/null || { echo \"$1: No such file or directory\" >&2; exit 1; }; "
				  "find . -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%P\\0' | base64 -w0",
				  "sh", dir),
			&raw, &len, err) < 0)
		return NULL;
	entries = json_array();
	while (i < len) {
		char *e = (char *)raw + i, *t1, *t2;
		size_t n = strnlen(e, len - i);

		if (i + n >= len)
			break; /* no NUL: not an entry find wrote */
		i += n + 1;
		t1 = strchr(e, '\t');
		t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
		if (!t1 || !t2)
			continue;
		*t1 = *t2 = 0;
		json_array_append_new(entries,
				      json_pack("{s:s, s:s, s:I}", "name", t2 + 1, "type",
						e[0] == 'f' ? "file" : e[0] == 'd' ? "dir" : e[0] == 'l' ? "link" : "other",
						"size", (json_int_t)strtoll(t1 + 1, NULL, 10)));
	}
	free(raw);
	return json_pack("{s:o}", "entries", entries);
}

int session_get_tar(struct session_table *ss, const char *id, const char *dir, unsigned char **data, size_t *len,
		    struct kiln_err *err)
{
	if (!dir || proto_abspath_ok(dir))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "dir: expected an absolute path without '.', '..' or empty parts");
	/* As the task's user, paths relative to dir ("./..."); GNU tar keeps
	 * symlinks as links and reports what it cannot read (exit 2). */
	return exec_base64(ss, id,
			   json_pack("[s, s, s, s, s]", "/bin/bash", "-c",
				     "cd -- \"$1\" 2>/dev/null || { echo \"$1: No such file or directory\" >&2; exit 1; }; "
				     "set -o pipefail; tar -cf - --one-file-system . | base64 -w0",
				     "sh", dir),
			   data, len, err);
}

int session_put_tar(struct session_table *ss, const char *id, const char *dir, const void *data, size_t len,
		    struct kiln_err *err)
{
	unsigned char rnd[8];
	char tmp[64];
	json_t *req, *res;
	struct session *s;
	int r = -1, gone = 0;

	if (!dir || proto_abspath_ok(dir) || !strncmp(dir, SPEC_RESERVED_DIR "/", sizeof(SPEC_RESERVED_DIR)) ||
	    !strcmp(dir, SPEC_RESERVED_DIR))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "dir: expected an absolute path without '.', '..' or empty parts, outside /kiln");
	if (len > SESSION_FILE_MAX)
		return kiln_err_set(err, KERR_TOO_LARGE, "a tar archive is at most %u MiB", SESSION_FILE_MAX >> 20);
	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
		return kiln_err_set(err, KERR_HOST_ERROR, "getrandom: %s", strerror(errno));
	/* /tmp, not /kiln: the archive may be larger than /kiln's 16 MiB. */
	snprintf(tmp, sizeof(tmp), "/tmp/.kiln-put-%02x%02x%02x%02x%02x%02x%02x%02x.tar", rnd[0], rnd[1], rnd[2], rnd[3],
		 rnd[4], rnd[5], rnd[6], rnd[7]);
	/* Unpacked as the task's user, so it makes only what the session's
	 * own code could; files belong to that user, modes as archived (less
	 * the umask). The archive goes whatever tar made of it. */
	req = json_pack("{s:[s, s, s, s, s, s]}", "argv", "/bin/sh", "-c",
			"mkdir -p -- \"$1\" && tar -C \"$1\" -xf \"$2\" --no-same-owner; rc=$?; rm -f -- \"$2\"; exit $rc",
			"sh", dir, tmp);
	if (!req)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	/* Written and unpacked in one operation: no other request can take the
	 * session in between and leave the archive behind in the guest. */
	s = session_take(ss, id, err);
	if (!s) {
		json_decref(req);
		return -1;
	}
	if (s->state != SS_RUNNING) {
		kiln_err_set(err, KERR_BUSY, "session %s is being paused", id);
	} else if (run_session_put(&s->vm, tmp, data, len, 0600, err) < 0) {
		/* A part may have been written (the guest's /tmp filled up):
		 * remove it, in the same operation. */
		json_t *rm = json_pack("{s:[s, s, s]}", "argv", "/bin/rm", "-f", tmp);
		struct kiln_err ignore = { .code = "" };

		if (rm)
			json_decref(exec_held(ss, s, rm, NULL, NULL, &gone, &ignore));
		json_decref(rm);
	} else if ((res = exec_held(ss, s, req, NULL, NULL, &gone, err))) {
		if (json_integer_value(json_object_get(res, "exit_code")) == 0 &&
		    json_is_integer(json_object_get(res, "exit_code")))
			r = 0;
		else
			kiln_err_set(err, KERR_INVALID_REQUEST, "the archive did not unpack: %.300s",
				     json_string_value(json_object_get(res, "stderr")) ?: "tar failed");
		json_decref(res);
	}
	session_put(ss, s, gone);
	json_decref(req);
	return r;
}

char *session_output_key(const char *customer, const char *id, const char *rel, struct kiln_err *err)
{
	char *key = NULL;

	/* The guest names its files: the key is built whole, never cut short
	 * (where two long names would meet), and checked as S3 needs it. */
	if (asprintf(&key, "%s/sessions/%s/outputs/%s", customer, id, rel) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	if (s3_key_check(key, err) < 0) {
		free(key);
		return NULL;
	}
	return key;
}

json_t *session_outputs(struct session_table *ss, const char *id, struct kiln_err *err)
{
	return session_outputs_to(ss, id, NULL, err);
}

json_t *session_outputs_to(struct session_table *ss, const char *id, const struct dest *dest, struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	struct hostd_s3 s3 = { 0 };
	char dir[PATH_MAX + 16];
	json_t *outs, *o;
	size_t i;
	int truncated = 0;

	if (!s)
		return NULL;
	snprintf(dir, sizeof(dir), "%s/outputs", s->dir);
	fs_rmtree(dir);
	outs = run_session_collect(&s->vm, dir, (uint64_t)s->output_mib << 20, hostd_run_opts(ss->d), &truncated, err);
	if (outs && dest) {
		/* The customer's own bucket: no copy of the host's settings. */
		dest_s3_config(dest, hostd_dest_allow(ss->d), &s3.c);
	} else if (outs && hostd_s3_take(ss->d, &s3) < 0) {
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
		json_decref(outs);
		outs = NULL;
	}
	json_array_foreach(outs, i, o) {
		char *key = NULL, path[PATH_MAX * 2];
		const char *rel = json_string_value(json_object_get(o, "path"));

		if (json_object_get(o, "skipped")) /* collect left it out (its name) */
			continue;
		if (!rel || !(key = session_output_key(s->customer, s->id, rel, err))) {
			json_object_set_new(o, "skipped", json_string(rel ? err->message : "no path"));
			json_object_set_new(o, "s3_key", json_null());
			continue;
		}
		if (dest && dest->prefix[0]) {
			char *k2 = NULL;

			if (asprintf(&k2, "%s%s", dest->prefix, key) < 0 || s3_key_check(k2, err) < 0) {
				json_object_set_new(o, "skipped", json_string(k2 ? err->message : "out of memory"));
				json_object_set_new(o, "s3_key", json_null());
				free(k2);
				free(key);
				continue;
			}
			free(key);
			key = k2;
		}
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, rel) >= sizeof(path)) {
			json_object_set_new(o, "skipped", json_string("the path is too long for this host"));
			json_object_set_new(o, "s3_key", json_null());
			free(key);
			continue;
		}
		if (s3_put_file(&s3.c, key, path, "application/octet-stream", NULL, NULL, err) < 0) {
			free(key);
			json_decref(outs);
			outs = NULL;
			break;
		}
		json_object_set_new(o, "s3_key", json_string(key));
		free(key);
	}
	hostd_s3_free(&s3);
	fs_rmtree(dir);
	session_put(ss, s, 0);
	return outs ? json_pack("{s:o, s:b}", "outputs", outs, "truncated", truncated) : NULL;
}