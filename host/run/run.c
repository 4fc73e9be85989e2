/* run: one task, start to finish: start a VM, wait for kiln-init, set its
 * clock and entropy, send the files, run the command under a host-side
 * wall-clock deadline, collect /output (re-validating every path and size the
 * guest names), build the result JSON, destroy the VM. */
#include "run.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "net/net.h"
#include "outdir.h"
#include "proto.h"
#include "textbuf.h"

#define KILL_GRACE_MS    3000  /* after KILL, the guest has this long to report EXIT */
#define SETUP_TIMEOUT_MS 10000
#define COLLECT_BASE_MS  30000 /* plus 1 s per 8 MiB of output budget */

static const char *const default_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/work",
	"LANG=C.UTF-8",
	"PYTHONUNBUFFERED=1", /* stream output as it is produced */
	"PYTHONDONTWRITEBYTECODE=1",
	NULL,
};

struct run_ctx {
	const struct task_spec *spec;
	const struct run_opts *opts;
	struct vm vm;
	struct kiln_err err;
	uint64_t budget;            /* output_mib in bytes: stdout + stderr + files */
	struct textcap out, errb;   /* captured stdout / stderr (bounded: opts->log_excerpt) */
	int out_trunc, err_trunc;
	struct proto_exit exit;
	int have_exit, timed_out;
	int out_truncated;          /* COLLECT left files out (the budget, or a limit) */
	json_t *outputs;
	int64_t t0, t_ready, t_started, t_exit, t_collected;
	int outdir_fd;
	char hello_release[65];
	const char *start;          /* "cold", "restore" or "pool" */
	struct net_sandbox *net;    /* the sandbox's network, with an egress policy */
	struct net_stats net_st;
	int64_t t_net;              /* when the network was ready */
	unsigned reserved_mib;      /* held in opts->cap until the end */
	uint8_t *iobuf;             /* PROTO_MAX_PAYLOAD bytes for outgoing frames */
	struct proto_exec exec_msg; /* per task: run_task runs on many threads at once */
	unsigned exec_flags;        /* extra PROTO_EXEC_* (a session's PROTO_EXEC_KEEP) */
	/* Frames from opts->input_fd, being passed on: each at most PIPE_BUF
	 * bytes (the writer's bound), so a part frame always leaves room. */
	uint8_t in_buf[4 * 4096];
	size_t in_len;
};

static int wait_hello(struct run_ctx *c)
{
	struct proto_frame f;
	struct proto_hello h;
	int64_t deadline = proto_now_ms() + (int64_t)c->opts->boot_timeout_s * 1000;

	if (vm_recv(&c->vm, &f, deadline, &c->err) < 0) {
		if (c->err.errc == KERR_TIMEOUT) {
			char tail[700];

			vm_log_tail(&c->vm, tail, sizeof(tail));
			kiln_err_set(&c->err, KERR_VM_ERROR, "the guest did not become ready within %d s%s%s",
				     c->opts->boot_timeout_s, tail[0] ? ": " : "", tail);
		}
		return -1;
	}
	if (f.type != PROTO_HELLO || proto_hello_decode(f.payload, f.len, &h) < 0)
		return kiln_err_set(&c->err, KERR_VM_ERROR, "the guest's first frame was not a valid HELLO");
	if (h.version != PROTO_VERSION)
		return kiln_err_set(&c->err, KERR_VM_ERROR, "guest speaks protocol version %u, host %u", h.version,
				    PROTO_VERSION);
	memcpy(c->hello_release, h.release, sizeof(c->hello_release));
	c->t_ready = proto_now_us();
	return 0;
}

/* The task's files; with wait, each FILE's OK is read before the next
 * (else the caller reads them, with recv_files, after more requests). */
static int send_files(struct run_ctx *c, int wait)
{
	uint8_t *buf = c->iobuf;

	for (size_t i = 0; i < c->spec->nfiles; i++) {
		const struct spec_file *sf = &c->spec->files[i];
		struct proto_file m = { .mode = sf->mode, .size = sf->size };
		/* 1 s per 4 MiB on top of a fixed allowance: TCG guests write slowly. */
		int64_t deadline = proto_now_ms() + 10000 + (int64_t)(sf->size >> 22) * 1000;
		ssize_t n;

		snprintf(m.path, sizeof(m.path), "%s", sf->path);
		n = proto_file_encode(buf, PROTO_MAX_PAYLOAD, &m);
		if (n < 0 || vm_send(&c->vm, PROTO_FILE, buf, (size_t)n, deadline, &c->err) < 0)
			return n < 0 ? kiln_err_set(&c->err, KERR_HOST_ERROR, "file header too large") : -1;
		for (size_t off = 0; off < sf->size; off += PROTO_MAX_PAYLOAD) {
			size_t len = sf->size - off < PROTO_MAX_PAYLOAD ? sf->size - off : PROTO_MAX_PAYLOAD;

			if (vm_send(&c->vm, PROTO_FILE_DATA, sf->data + off, len, deadline, &c->err) < 0)
				return -1;
		}
		if (wait && vm_recv_ok(&c->vm, PROTO_FILE, deadline, sf->path, &c->err) < 0)
			return -1;
	}
	return 0;
}

static int recv_files(struct run_ctx *c)
{
	for (size_t i = 0; i < c->spec->nfiles; i++) {
		const struct spec_file *sf = &c->spec->files[i];

		if (vm_recv_ok(&c->vm, PROTO_FILE, proto_now_ms() + 10000 + (int64_t)(sf->size >> 22) * 1000, sf->path,
			       &c->err) < 0)
			return -1;
	}
	return 0;
}

/* Build the environment: defaults first, then the task's own (which wins). */
static size_t build_env(const struct task_spec *spec, char **env, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; default_env[i] && n < max; i++) {
		size_t klen = strchr(default_env[i], '=') - default_env[i] + 1;
		int overridden = 0;

		for (size_t j = 0; j < spec->nenv; j++)
			overridden |= !strncmp(spec->env[j], default_env[i], klen);
		if (!overridden)
			env[n++] = (char *)default_env[i];
	}
	for (size_t j = 0; j < spec->nenv && n < max; j++)
		env[n++] = spec->env[j];
	return n;
}

static int exec_send(struct run_ctx *c, uint32_t flags)
{
	struct proto_exec *mp = &c->exec_msg;
	uint8_t *buf = c->iobuf;
	int64_t deadline = proto_now_ms() + SETUP_TIMEOUT_MS;
	ssize_t n;

	memset(mp, 0, offsetof(struct proto_exec, argv));
	mp->output_cap = c->budget;
	/* A restored VM has a Python interpreter waiting with the common modules
	 * imported: python tasks run in it (kiln-init falls back to exec). */
	if (c->spec->language == SPEC_LANG_PYTHON && strcmp(c->start, "cold") &&
	    !(c->opts->extra_flags & (PROTO_EXEC_STDIN | PROTO_EXEC_TTY)))
		mp->flags |= PROTO_EXEC_ZYGOTE;
	mp->flags |= c->exec_flags | c->opts->extra_flags | flags;
	mp->rows = c->opts->tty_rows;
	mp->cols = c->opts->tty_cols;
	mp->uid = c->opts->user_set ? c->opts->uid : 1000; /* 1000: the guest's unprivileged `sandbox` user */
	mp->gid = c->opts->user_set ? c->opts->gid : 1000;
	snprintf(mp->cwd, sizeof(mp->cwd), "%s", c->spec->cwd);
	mp->argc = (uint32_t)c->spec->argc;
	if (mp->argc > PROTO_MAX_ARGS)
		return kiln_err_set(&c->err, KERR_INVALID_SPEC, "argv: too many arguments");
	for (size_t i = 0; i < c->spec->argc; i++)
		mp->argv[i] = c->spec->argv[i];
	mp->envc = (uint32_t)build_env(c->spec, mp->env, PROTO_MAX_ENV);
	n = proto_exec_encode(buf, PROTO_MAX_PAYLOAD, mp);
	if (n < 0)
		return kiln_err_set(&c->err, KERR_INVALID_SPEC, "argv and env together exceed %d bytes", PROTO_MAX_PAYLOAD);
	return vm_send(&c->vm, PROTO_EXEC, buf, (size_t)n, deadline, &c->err);
}

/* Free c and what it holds but its VM (the caller's to destroy or keep). */
static void run_ctx_free(struct run_ctx *c)
{
	if (c->outdir_fd >= 0)
		close(c->outdir_fd);
	json_decref(c->outputs);
	textcap_free(&c->out);
	textcap_free(&c->errb);
	free(c->iobuf);
	free(c);
}

/* When the running task's timeout_s is up (proto_now_ms clock). */
static int64_t run_deadline_ms(const struct run_ctx *c)
{
	return c->t_started / 1000 + (int64_t)c->spec->timeout_s * 1000;
}

static int exec_wait(struct run_ctx *c)
{
	struct proto_frame f;

	if (vm_recv(&c->vm, &f, proto_now_ms() + SETUP_TIMEOUT_MS, &c->err) < 0)
		return -1;
	if (f.type != PROTO_STARTED)
		return vm_frame_err(&f, "exec", &c->err);
	c->t_started = proto_now_us();
	if (c->opts->on_event) {
		struct run_started st = { .exec_id = c->opts->exec_id, .deadline_ms = run_deadline_ms(c) };

		c->opts->on_event(c->opts->event_ctx, RUN_EV_RUNNING, &st, sizeof(st));
	}
	return 0;
}

/* Pass the whole STDIN/RESIZE/HANGUP frames waiting on vm.input_fd on to the
 * guest (frames the session's own input handler wrote; a part frame waits
 * in c->in_buf for the rest). */
static int send_exec(struct run_ctx *c)
{
	return exec_send(c, 0) < 0 ? -1 : exec_wait(c);
}

/* A fresh VM's way to its task: SETUP, the files and EXEC in one go, then
 * their replies (a round trip each saved). EXEC runs only if the others were
 * all accepted (PROTO_EXEC_IF_OK); the first refusal is the error. */
static int start_task(struct run_ctx *c)
{
	int64_t deadline = proto_now_ms() + SETUP_TIMEOUT_MS;

	if (vm_setup_send(&c->vm, deadline, &c->err) < 0 || send_files(c, 0) < 0 || exec_send(c, PROTO_EXEC_IF_OK) < 0)
		return -1;
	if (vm_setup_recv(&c->vm, deadline, &c->err) < 0 || recv_files(c) < 0)
		return -1;
	return exec_wait(c);
}

static int forward_input(struct run_ctx *c)
{
	for (;;) {
		struct proto_frame f;
		size_t off = 0;
		ssize_t n;

		if (c->in_len == sizeof(c->in_buf))
			return kiln_err_set(&c->err, KERR_HOST_ERROR, "an input frame is too large");
		n = read(c->vm.input_fd, c->in_buf + c->in_len, sizeof(c->in_buf) - c->in_len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return 0;
		if (n <= 0) {
			c->vm.input_fd = -1; /* the writer is gone: no more input */
			return 0;
		}
		c->in_len += (size_t)n;
		while ((n = proto_frame_parse(c->in_buf + off, c->in_len - off, &f)) > 0) {
			if ((f.type == PROTO_STDIN || f.type == PROTO_RESIZE || f.type == PROTO_HANGUP) &&
			    vm_send(&c->vm, f.type, f.payload, f.len, proto_now_ms() + SETUP_TIMEOUT_MS, &c->err) < 0)
				return -1;
			off += (size_t)n;
		}
		if (n < 0)
			return kiln_err_set(&c->err, KERR_HOST_ERROR, "malformed input frame");
		memmove(c->in_buf, c->in_buf + off, c->in_len - off);
		c->in_len -= off;
	}
}

/* Write ev (taken) as one line of opts->stream. The sandbox network's
 * thread writes here too (egress_blocked), hence the lock. */
static void stream_line(struct run_ctx *c, json_t *ev)
{
	flockfile(c->opts->stream);
	json_dumpf(ev, c->opts->stream, JSON_COMPACT);
	fputc('\n', c->opts->stream);
	fflush(c->opts->stream);
	funlockfile(c->opts->stream);
	json_decref(ev);
}

static void stream_event(struct run_ctx *c, const char *name, const uint8_t *p, size_t n)
{
	char *s;

	if (!c->opts->stream)
		return;
	s = textbuf_to_utf8((const char *)p, n);
	stream_line(c, json_pack("{s:s, s:s}", "stream", name, "data", s ? s : ""));
	free(s);
}

/* A destination the sandbox's network dropped (on the network's thread). */
static void on_blocked(void *ctx, const char *dst, unsigned port, const char *proto)
{
	struct run_ctx *c = ctx;
	struct run_blocked b = { .destination = dst, .port = port, .protocol = proto };

	if (c->opts->stream) {
		stream_line(c, json_pack("{s:s, s:s, s:i, s:s}", "event", "egress_blocked", "destination", dst, "port",
					 (int)port, "protocol", proto));
	}
	if (c->opts->on_event)
		c->opts->on_event(c->opts->event_ctx, RUN_EV_BLOCKED, &b, sizeof(b));
}

/* Run until EXIT, enforcing the wall-clock limit from the host. */
static int run_loop(struct run_ctx *c)
{
	int64_t deadline = run_deadline_ms(c);
	uint64_t received = 0;

	for (;;) {
		struct proto_frame f;

		if (vm_recv(&c->vm, &f, deadline, &c->err) < 0) {
			if (c->err.errc == KERR_INPUT) {
				if (forward_input(c) < 0)
					return -1;
				continue;
			}
			if (c->err.errc != KERR_TIMEOUT)
				return -1;
			/* No EXIT within the grace: the VM is destroyed without collecting. */
			if (c->timed_out)
				return 0;
			/* Time is up: ask kiln-init to kill the task, then give it a short grace. */
			c->timed_out = 1;
			c->t_exit = proto_now_us();
			if (vm_send(&c->vm, PROTO_KILL, NULL, 0, proto_now_ms() + KILL_GRACE_MS, &c->err) < 0)
				return -1;
			deadline = proto_now_ms() + KILL_GRACE_MS;
			continue;
		}
		switch (f.type) {
		case PROTO_STDOUT:
		case PROTO_STDERR:
			/* kiln-init enforces the cap; a guest that sends more is broken or hostile. */
			received += f.len;
			if (received > c->budget)
				return kiln_err_set(&c->err, KERR_VM_ERROR, "the guest sent more output than its limit");
			if (textcap_append(f.type == PROTO_STDOUT ? &c->out : &c->errb, f.payload, f.len) < 0)
				return kiln_err_set(&c->err, KERR_HOST_ERROR, "out of memory");
			stream_event(c, f.type == PROTO_STDOUT ? "stdout" : "stderr", f.payload, f.len);
			if (c->opts->on_event)
				c->opts->on_event(c->opts->event_ctx, f.type == PROTO_STDOUT ? RUN_EV_STDOUT : RUN_EV_STDERR,
						  f.payload, f.len);
			break;
		case PROTO_EXIT:
			if (proto_exit_decode(f.payload, f.len, &c->exit) < 0)
				return kiln_err_set(&c->err, KERR_VM_ERROR, "malformed EXIT from the guest");
			c->have_exit = 1;
			if (!c->timed_out)
				c->t_exit = proto_now_us();
			c->out_trunc = c->exit.stdout_bytes > c->out.total;
			c->err_trunc = c->exit.stderr_bytes > c->errb.total;
			if (c->opts->on_event)
				c->opts->on_event(c->opts->event_ctx, RUN_EV_EXITED, NULL, 0);
			return 0;
		default:
			return kiln_err_set(&c->err, KERR_VM_ERROR, "unexpected frame type 0x%02x while the task ran", f.type);
		}
	}
}

static int hex_digest(EVP_MD_CTX *md, char out[65])
{
	unsigned char d[32];
	unsigned int dl = 0;

	if (!EVP_DigestFinal_ex(md, d, &dl) || dl != 32)
		return -1;
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
	return 0;
}

/* Receive /output. Every path and size from the guest is checked again here:
 * the decoder refuses absolute paths and '..', the byte budget is counted on
 * this side, and files are created under the output directory without
 * following symlinks. A hostile guest kernel ignores kiln-init's limits, so
 * the host counts entries and depth itself: an OUT_DIR or an empty OUT_FILE
 * costs no bytes but an inode, a JSON entry and an S3 PUT. Past a limit
 * nothing more is created; the walk's remaining frames are read and dropped
 * until OUT_END (bounded by the deadline), so that a session's channel stays
 * in step, and the task ends with output_limit. */
static int collect(struct run_ctx *c)
{
	uint32_t max_entries = c->opts->out_max_entries ? c->opts->out_max_entries : RUN_OUT_MAX_ENTRIES;
	uint32_t max_depth = c->opts->out_max_depth ? c->opts->out_max_depth : RUN_OUT_MAX_DEPTH;
	unsigned created = 0; /* inodes made under the output directory, implicit parents too */
	int over = 0;     /* a host limit was reached: drop the rest */
	int bad_name = 0; /* the current file's name is not UTF-8: listed, not kept */
	uint64_t used = c->out.total + c->errb.total;
	uint64_t budget = c->budget > used ? c->budget - used : 0;
	int64_t deadline = proto_now_ms() + COLLECT_BASE_MS + (int64_t)(budget >> 23) * 1000;
	uint8_t req[8];
	struct proto_writer w = { .buf = req, .cap = sizeof(req) };
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	struct proto_out_file file;
	uint64_t left = 0; /* bytes still due for the current file */
	int fd = -1, in_file = 0, r = -1;

	if (!md)
		return kiln_err_set(&c->err, KERR_HOST_ERROR, "out of memory");
	proto_put_u64(&w, budget);
	if (vm_send(&c->vm, PROTO_COLLECT, req, w.len, deadline, &c->err) < 0)
		goto out;
	for (;;) {
		struct proto_frame f;
		char path[PROTO_MAX_PATH + 1];

		if (vm_recv(&c->vm, &f, deadline, &c->err) < 0)
			goto out;
		if (in_file && f.type != PROTO_OUT_DATA) {
			kiln_err_set(&c->err, KERR_VM_ERROR, "guest ended %s early", file.path);
			goto out;
		}
		switch (f.type) {
		case PROTO_OUT_DIR:
			if (proto_path_decode(f.payload, f.len, path) < 0) {
				kiln_err_set(&c->err, KERR_VM_ERROR, "guest named an invalid output directory");
				goto out;
			}
			/* Counted before: what the host makes is bounded by the limit
			 * plus one path's directories. */
			if (!over && (created >= max_entries || outdir_depth(path, 0) > max_depth))
				over = 1;
			if (!over && c->outdir_fd >= 0 && outdir_mkdir(c->outdir_fd, path, &created, &c->err) < 0)
				goto out;
			if (!over && c->outdir_fd < 0)
				created++; /* nothing made, but an entry in the result */
			break;
		case PROTO_OUT_FILE:
			if (proto_out_file_decode(f.payload, f.len, &file) < 0) {
				kiln_err_set(&c->err, KERR_VM_ERROR, "guest named an invalid output file");
				goto out;
			}
			if (file.size > budget) {
				kiln_err_set(&c->err, KERR_VM_ERROR, "guest sent %s beyond the output budget", file.path);
				goto out;
			}
			budget -= file.size;
			/* A file's directories count towards the depth, the file itself
			 * one level below the deepest directory. */
			if (!over && (created >= max_entries || outdir_depth(file.path, 1) > max_depth))
				over = 1;
			/* Names are bytes to the guest but strings in JSON and S3: a
			 * name that is not UTF-8 is listed (made readable) with the
			 * reason, never kept or uploaded under a name it does not have. */
			bad_name = !textbuf_utf8_valid(file.path, strlen(file.path));
			if (!over && !bad_name && c->outdir_fd >= 0 &&
			    (fd = outdir_create(c->outdir_fd, file.path, file.mode, &created, &c->err)) < 0)
				goto out;
			if (!over && (c->outdir_fd < 0 || bad_name))
				created++;
			EVP_DigestInit_ex(md, EVP_sha256(), NULL);
			left = file.size;
			in_file = 1;
			break;
		case PROTO_OUT_DATA:
			if (!in_file || f.len > left) {
				kiln_err_set(&c->err, KERR_VM_ERROR, "guest sent output data beyond the announced size");
				goto out;
			}
			EVP_DigestUpdate(md, f.payload, f.len);
			if (fd >= 0 && proto_write_all(fd, f.payload, f.len, 0) < 0) {
				kiln_err_set(&c->err, KERR_HOST_ERROR, "writing %s: %s", file.path, strerror(errno));
				goto out;
			}
			left -= f.len;
			break;
		case PROTO_OUT_END: {
			struct proto_out_end e;

			if (proto_out_end_decode(f.payload, f.len, &e) < 0) {
				kiln_err_set(&c->err, KERR_VM_ERROR, "malformed OUT_END");
				goto out;
			}
			if ((e.flags & PROTO_OUT_TRUNCATED) || over)
				c->exit.flags |= PROTO_EXIT_OUTPUT_LIMIT;
			c->out_truncated = (e.flags & PROTO_OUT_TRUNCATED) || over;
			r = 0;
			goto out;
		}
		case PROTO_ERROR: {
			struct proto_error e;

			if (proto_error_decode(f.payload, f.len, &e) == 0)
				kiln_err_set(&c->err, KERR_GUEST_ERROR, "collecting /output: %s", e.message);
			else
				kiln_err_set(&c->err, KERR_VM_ERROR, "malformed ERROR");
			goto out;
		}
		default:
			kiln_err_set(&c->err, KERR_VM_ERROR, "unexpected frame type 0x%02x while collecting", f.type);
			goto out;
		}
		if (in_file && left == 0) {
			char hex[65];

			if (hex_digest(md, hex) < 0) {
				kiln_err_set(&c->err, KERR_HOST_ERROR, "sha256 failed");
				goto out;
			}
			if (!over && !bad_name) {
				json_array_append_new(c->outputs, json_pack("{s:s, s:I, s:s}", "path", file.path, "size",
									     (json_int_t)file.size, "sha256", hex));
			} else if (!over) {
				char *shown = textbuf_to_utf8(file.path, strlen(file.path));

				json_array_append_new(c->outputs,
						      json_pack("{s:s?, s:I, s:s, s:n, s:s}", "path", shown, "size",
								(json_int_t)file.size, "sha256", hex, "s3_key", "skipped",
								"the file name is not valid UTF-8 (shown with U+FFFD)"));
				free(shown);
			}
			if (fd >= 0)
				close(fd);
			fd = -1;
			in_file = 0;
		}
	}
out:
	if (fd >= 0)
		close(fd);
	EVP_MD_CTX_free(md);
	c->t_collected = proto_now_us();
	return r;
}

static json_t *str_json(const struct buf *b)
{
	char *s = textbuf_to_utf8(b->p, b->len);
	json_t *j = json_string(s ? s : "");

	free(s);
	return j;
}

/* NAME ("stdout"/"stderr"), NAME_truncated, NAME_bytes and, when only an
 * excerpt is kept (opts->log_excerpt), NAME_tail: see docs/api.md. */
static void set_stream(json_t *r, const char *name, const struct textcap *cap, int guest_trunc)
{
	struct buf head, tail;
	char key[32];

	textcap_head(cap, &head);
	json_object_set_new(r, name, str_json(&head));
	if (textcap_cut(cap)) {
		textcap_tail(cap, &tail);
		snprintf(key, sizeof(key), "%s_tail", name);
		json_object_set_new(r, key, str_json(&tail));
		buf_free(&tail);
	}
	snprintf(key, sizeof(key), "%s_truncated", name);
	json_object_set_new(r, key, json_boolean(guest_trunc || textcap_cut(cap)));
	snprintf(key, sizeof(key), "%s_bytes", name);
	json_object_set_new(r, key, json_integer((json_int_t)cap->total));
	buf_free(&head);
}

static const char *signame(unsigned sig)
{
	static char other[16];

	switch (sig) {
	case SIGKILL: return "SIGKILL";
	case SIGTERM: return "SIGTERM";
	case SIGSEGV: return "SIGSEGV";
	case SIGABRT: return "SIGABRT";
	case SIGBUS: return "SIGBUS";
	case SIGFPE: return "SIGFPE";
	case SIGILL: return "SIGILL";
	case SIGINT: return "SIGINT";
	case SIGPIPE: return "SIGPIPE";
	case SIGHUP: return "SIGHUP";
	case SIGXCPU: return "SIGXCPU";
	case SIGXFSZ: return "SIGXFSZ";
	}
	snprintf(other, sizeof(other), "SIG%u", sig);
	return other;
}

static json_t *ms(int64_t a_us, int64_t b_us)
{
	return json_integer(a_us && b_us && b_us >= a_us ? (b_us - a_us + 500) / 1000 : 0);
}

static json_t *build_result(struct run_ctx *c, int failed)
{
	json_t *r = json_object();
	const char *state, *reason;
	json_t *exit_code = json_null(), *sig = json_null();

	if (failed) {
		state = "error";
		/* The host's memory budget ran out and this sandbox's VM was the
		 * kernel's victim: the customer is told so, not "vm_error". */
		reason = !strcmp(c->err.code, "host_memory") ? "host_memory" : "vm_error";
	} else if (c->timed_out) {
		state = "timed_out";
		reason = "timeout";
	} else if (c->exit.flags & PROTO_EXIT_OUTPUT_LIMIT) {
		state = "failed";
		reason = "output_limit";
	} else if (c->exit.flags & PROTO_EXIT_OOM) {
		state = "failed";
		reason = "oom";
	} else if (c->exit.how == PROTO_SIGNALED) {
		state = "failed";
		reason = "signaled";
	} else {
		state = c->exit.status == 0 ? "succeeded" : "failed";
		reason = "exited";
	}
	if (c->have_exit) {
		if (c->exit.how == PROTO_EXITED)
			exit_code = json_integer(c->exit.status);
		else
			sig = json_string(signame(c->exit.status));
	} else if (c->timed_out) {
		sig = json_string("SIGKILL");
	}
	json_object_set_new(r, "state", json_string(state));
	json_object_set_new(r, "exit_code", exit_code);
	json_object_set_new(r, "signal", sig);
	json_object_set_new(r, "end_reason", json_string(reason));
	set_stream(r, "stdout", &c->out, c->out_trunc);
	set_stream(r, "stderr", &c->errb, c->err_trunc);
	json_object_set(r, "outputs", c->outputs);
	if (c->have_exit)
		json_object_set_new(r, "usage",
				    json_pack("{s:I, s:I, s:I, s:I, s:I}", "user_ms", (json_int_t)(c->exit.user_us / 1000),
					      "sys_ms", (json_int_t)(c->exit.sys_us / 1000), "max_rss_kib",
					      (json_int_t)c->exit.maxrss_kib, "stdout_bytes",
					      (json_int_t)c->exit.stdout_bytes, "stderr_bytes",
					      (json_int_t)c->exit.stderr_bytes));
	json_object_set_new(r, "timings",
			    json_pack("{s:s, s:o, s:o, s:o, s:o}", "start", c->start ? c->start : "cold", "boot_ms", ms(c->t0, c->t_ready),
				      "run_ms", ms(c->t_started, c->t_exit), "collect_ms", ms(c->t_exit, c->t_collected),
				      "total_ms", ms(c->t0, proto_now_us())));
	if (c->hello_release[0])
		json_object_set_new(r, "guest_kernel", json_string(c->hello_release));
	if (c->spec->egress) {
		json_t *n = net_stats_json(&c->net_st);

		json_object_set_new(n, "setup_ms", ms(c->t0, c->t_net));
		json_object_set_new(r, "network", n);
	} else {
		json_object_set_new(r, "network", json_pack("{s:s}", "egress", "none"));
	}
	if (failed)
		json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", c->err.code, "message", c->err.message));
	return r;
}

/* Get a running VM whose kiln-init waits for requests: a warm pool VM, else a
 * clone of a matching snapshot, else a cold boot. */
static int acquire_vm(struct run_ctx *c, struct vm_config *cfg)
{
	const struct run_opts *o = c->opts;
	const struct task_spec *spec = c->spec;
	const struct snapshot *snap = o->snap;

	if (spec->egress) {
		/* Its own network first; then a clone of the template that has a
		 * NIC (pool VMs and the default template have none), else a cold
		 * boot with one. */
		if (net_sandbox_start(o->net, spec->net_rules, spec->nnet_rules, on_blocked, c, &c->net, &c->err) < 0)
			return -1;
		c->t_net = proto_now_us();
		cfg->net = 1;
		cfg->net_fd = net_sandbox_tap_fd(c->net);
		snap = o->net_snap;
	} else if (o->pool && pool_memory_mib(o->pool) == spec->memory_mib && pool_vcpus(o->pool) == spec->vcpus) {
		int r = pool_take(o->pool, &c->vm, &c->err);

		if (r == 0) {
			/* The pool VM's reservation moves to the task, or is dropped when
			 * the caller holds one for the task already. */
			if (o->prereserved)
				capacity_release(o->cap, spec->memory_mib);
			else
				c->reserved_mib = spec->memory_mib;
			c->start = "pool";
			snprintf(c->hello_release, sizeof(c->hello_release), "%s", pool_release(o->pool));
			c->t_ready = proto_now_us();
			return 0;
		}
		if (r != -EAGAIN) {
			/* A broken pool VM must not fail the task: fall through to a
			 * fresh clone or a cold boot. */
			fprintf(stderr, "kiln-host: pool VM unusable (%s); starting another\n", c->err.message);
			vm_destroy(&c->vm);
			if (o->cap)
				capacity_release(o->cap, spec->memory_mib); /* the pool VM's reservation */
			memset(&c->err, 0, sizeof(c->err));
		}
	}
	if (o->cap && !o->prereserved) {
		if (!capacity_reserve(o->cap, spec->memory_mib))
			return kiln_err_set(&c->err, KERR_NO_CAPACITY, "this host has no free memory for the task right now");
		c->reserved_mib = spec->memory_mib;
	}
	if (snap && snap->memory_mib == spec->memory_mib && snap->vcpus == spec->vcpus) {
		c->start = "restore";
		snprintf(c->hello_release, sizeof(c->hello_release), "%s", snap->release);
		if (!spec->egress && o->pool && pool_memory_mib(o->pool) == spec->memory_mib &&
		    pool_vcpus(o->pool) == spec->vcpus && pool_take_prestarted(o->pool, &c->vm) == 0) {
			if (snapshot_load(snap, &c->vm, &c->err) < 0)
				return -1;
		} else if (snapshot_restore(snap, cfg, &c->vm, &c->err) < 0) {
			return -1;
		}
		c->t_ready = proto_now_us();
		return 0;
	}
	c->start = "cold";
	if (vm_start(cfg, &c->vm, &c->err) < 0)
		return -1;
	return wait_hello(c);
}

json_t *run_task(const struct task_spec *spec, const struct run_opts *opts)
{
	struct run_ctx *c = calloc(1, sizeof(*c));
	struct vm_config cfg = opts->vm;
	int failed = 1;
	json_t *result;

	if (!c)
		return json_pack("{s:s, s:s, s:{s:s, s:s}}", "state", "error", "end_reason", "vm_error", "error", "code",
				 "host_error", "message", "out of memory");
	c->spec = spec;
	c->opts = opts;
	c->t0 = proto_now_us();
	c->budget = (uint64_t)spec->output_mib << 20;
	c->outputs = json_array();
	c->outdir_fd = -1;
	c->out.keep = c->errb.keep = opts->log_excerpt;
	c->iobuf = malloc(PROTO_MAX_PAYLOAD);
	c->vm.pid = c->vm.pidfd = c->vm.agent_fd = c->vm.qmp_fd = c->vm.envd_fd = c->vm.lock_fd = -1;
	cfg.vcpus = spec->vcpus;
	cfg.memory_mib = spec->memory_mib;

	if (!c->iobuf) {
		kiln_err_set(&c->err, KERR_HOST_ERROR, "out of memory");
		goto done;
	}
	if (opts->output_dir && (c->outdir_fd = outdir_open(opts->output_dir, &c->err)) < 0)
		goto done;
	if (acquire_vm(c, &cfg) < 0)
		goto done;
	/* Pool VMs were started before this task existed: its cancel fd applies now. */
	c->vm.cancel_fd = opts->vm.cancel_fd > 0 ? opts->vm.cancel_fd : -1;
	if (start_task(c) < 0 || run_loop(c) < 0)
		goto done;
	if (c->have_exit && collect(c) < 0)
		goto done;
	failed = 0;
done:
	if (opts->keep_vm && opts->prereserved && !c->net && !c->reserved_mib && c->vm.pid > 0) {
		/* Killed now, so that it stops taking CPU; reaped by the caller
		 * while the outputs go up. */
		kill(c->vm.pid, SIGKILL);
		*opts->keep_vm = c->vm;
		memset(&c->vm, 0, sizeof(c->vm));
	} else {
		vm_destroy(&c->vm);
	}
	if (c->net) {
		/* After QEMU is gone: nothing uses the tap any more. */
		net_sandbox_stop(c->net, &c->net_st);
		c->net = NULL;
	}
	if (c->reserved_mib && opts->cap)
		capacity_release(opts->cap, c->reserved_mib);
	result = build_result(c, failed);
	run_ctx_free(c);
	return result;
}

/* ---- sessions: commands in a VM that outlives them ---------------------- */

static struct run_ctx *session_ctx(struct vm *vm, const struct task_spec *spec, const struct run_opts *opts)
{
	struct run_ctx *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->spec = spec;
	c->opts = opts;
	c->t0 = proto_now_us();
	c->t_ready = c->t0;
	c->budget = (uint64_t)spec->output_mib << 20;
	c->outputs = json_array();
	c->outdir_fd = -1;
	c->iobuf = malloc(PROTO_MAX_PAYLOAD);
	c->start = "session";
	c->exec_flags = PROTO_EXEC_KEEP;
	c->vm = *vm; /* moved back by session_ctx_free: one owner at a time */
	if (!c->iobuf || !c->outputs) {
		json_decref(c->outputs);
		free(c->iobuf);
		free(c);
		return NULL;
	}
	return c;
}

static void session_ctx_free(struct run_ctx *c, struct vm *vm)
{
	*vm = c->vm;
	run_ctx_free(c);
}

json_t *run_session_exec(struct vm *vm, const struct task_spec *spec, const struct run_opts *opts)
{
	struct run_ctx *c = session_ctx(vm, spec, opts);
	int failed = 1;
	json_t *result;

	if (!c)
		return json_pack("{s:s, s:s, s:{s:s, s:s}}", "state", "error", "end_reason", "vm_error", "error", "code",
				 "host_error", "message", "out of memory");
	c->vm.cancel_fd = opts->vm.cancel_fd > 0 ? opts->vm.cancel_fd : -1;
	if (send_files(c, 1) == 0 && send_exec(c) == 0) {
		/* Input only once the guest runs the command: frames written
		 * earlier wait in the pipe. */
		c->vm.input_fd = opts->input_fd > 0 ? opts->input_fd : -1;
		if (run_loop(c) == 0)
			failed = 0;
	}
	c->vm.input_fd = -1;
	c->t_collected = c->t_exit;
	result = build_result(c, failed);
	json_object_del(result, "outputs");
	json_object_del(result, "network");
	if (opts->extra_flags & (PROTO_EXEC_STDIN | PROTO_EXEC_TTY))
		json_object_set_new(result, "stdin_lost", json_boolean(c->exit.flags & PROTO_EXIT_STDIN_LOST));
	c->vm.cancel_fd = -1;
	session_ctx_free(c, vm);
	return result;
}

json_t *run_session_collect(struct vm *vm, const char *outdir, uint64_t budget, const struct run_opts *lim,
			    int *truncated, struct kiln_err *err)
{
	struct task_spec spec = { .output_mib = (uint32_t)(budget >> 20) };
	struct run_opts opts = { .out_max_entries = lim ? lim->out_max_entries : 0,
				 .out_max_depth = lim ? lim->out_max_depth : 0 };
	struct run_ctx *c = session_ctx(vm, &spec, &opts);
	json_t *outputs = NULL;

	if (!c) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	c->budget = budget;
	if ((c->outdir_fd = outdir_open(outdir, &c->err)) >= 0 && collect(c) == 0) {
		outputs = json_incref(c->outputs);
		if (truncated)
			*truncated = c->out_truncated;
	} else
		*err = c->err;
	session_ctx_free(c, vm);
	return outputs;
}

int run_session_put(struct vm *vm, const char *path, const void *data, size_t len, uint32_t mode, struct kiln_err *err)
{
	struct spec_file f = { .path = (char *)path, .data = (unsigned char *)data, .size = len, .mode = mode };
	struct task_spec spec = { .files = &f, .nfiles = 1, .output_mib = 1 };
	struct run_opts opts = { 0 };
	struct run_ctx *c = session_ctx(vm, &spec, &opts);
	int r;

	if (!c)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r = send_files(c, 1);
	if (r < 0)
		*err = c->err;
	session_ctx_free(c, vm);
	return r;
}
