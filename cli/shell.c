/* shell: `kiln shell SESSION [-- COMMAND...]`, an interactive terminal in a
 * session: the command runs on a pseudo-terminal in the guest ("tty" exec),
 * its output comes over the exec's event stream (read on a thread of its
 * own), and what is typed goes up as input requests (docs/api.md, "POST
 * /v1/sessions/{id}/input"). The local terminal is raw while it runs. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "cli.h"

#define SHELL_READ      16384 /* most bytes per input request */
#define SHELL_START_S   60    /* the exec must start within this */
#define SHELL_RETRY_MS  20    /* input_full: the command has not read yet */
#define SHELL_RETRIES   500

static void shell_usage(FILE *f)
{
	fprintf(f,
		"usage: kiln shell SESSION [--timeout S] [--env K=V]... [--cwd DIR] [-- COMMAND [ARGS...]]\n"
		"  An interactive terminal in a running session: COMMAND (default: bash -l) on a\n"
		"  pseudo-terminal of your terminal's size, with what you type sent to it. It ends\n"
		"  when the command exits (kiln exits with its exit code), after --timeout seconds\n"
		"  (default: your quota's max_task_timeout_s), or when kiln is stopped, which ends\n"
		"  the command. Processes it started in the background may get SIGHUP when the\n"
		"  terminal closes, as on any terminal: start them with nohup or setsid to keep them.\n"
		"  Without a terminal on stdin, kiln forwards stdin as typed input and, at its end,\n"
		"  types ^D.\n");
}

static volatile sig_atomic_t winch_flag;
static int signal_pipe[2] = { -1, -1 };

static void on_signal(int sig)
{
	int saved = errno;
	char c = (char)sig;

	if (sig == SIGWINCH)
		winch_flag = 1;
	if (write(signal_pipe[1], &c, 1) < 0) {
		/* full: a wake-up is pending anyway */
	}
	errno = saved;
}

struct shell {
	const struct cli_conn *conn;
	const char *id;
	json_t *body;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char exec_id[80];   /* from the started event */
	int started, ended;
	json_t *result;
	char error[600];    /* why the stream ended without a result */
	int refused;        /* the API refused the exec (HTTP error) */
	int wake[2];        /* the stream thread writes here when it ends */
};

/* Output bytes of a stdout/stderr event: data_b64 (exact bytes) when the
 * host sent it, else the UTF-8 text. */
static void shell_output(json_t *data)
{
	const char *b = json_string_value(json_object_get(data, "data_b64"));
	const char *t = json_string_value(json_object_get(data, "data"));

	if (b) {
		size_t n = strlen(b);
		unsigned char *raw = malloc(n / 4 * 3 + 3);
		int got = raw && n % 4 == 0 ? EVP_DecodeBlock(raw, (const unsigned char *)b, (int)n) : -1;

		if (got >= 0) {
			/* EVP_DecodeBlock counts padding as data. */
			if (n && b[n - 1] == '=')
				got--;
			if (n > 1 && b[n - 2] == '=')
				got--;
			fwrite(raw, 1, (size_t)got, stdout);
		}
		free(raw);
	} else if (t) {
		fwrite(t, 1, strlen(t), stdout);
	}
	fflush(stdout);
}

static int shell_event(void *ctx, const char *name, json_t *data)
{
	struct shell *sh = ctx;

	if (!strcmp(name, "started")) {
		const char *id = json_string_value(json_object_get(data, "exec_id"));

		pthread_mutex_lock(&sh->lock);
		snprintf(sh->exec_id, sizeof(sh->exec_id), "%s", id ? id : "");
		sh->started = 1;
		pthread_cond_broadcast(&sh->cond);
		pthread_mutex_unlock(&sh->lock);
	} else if (!strcmp(name, "stdout") || !strcmp(name, "stderr")) {
		shell_output(data);
	} else if (!strcmp(name, "result")) {
		json_decref(sh->result);
		sh->result = json_incref(data);
	} else if (!strcmp(name, "error")) {
		snprintf(sh->error, sizeof(sh->error), "%s",
			 json_string_value(json_object_get(data, "message")) ?: "the stream failed");
	}
	return 0;
}

static void *shell_stream(void *arg)
{
	struct shell *sh = arg;
	struct kiln_err err = { .code = "" };
	char path[128];
	int rc;

	snprintf(path, sizeof(path), "/v1/sessions/%s/exec?stream=1", sh->id);
	/* The API sends a keep-alive at least every few seconds while the
	 * command is quiet: a longer silence is a lost connection. */
	rc = http_follow_body(sh->conn, "POST", path, sh->body, 90, shell_event, NULL, sh, &err);
	pthread_mutex_lock(&sh->lock);
	if (rc < 0) {
		snprintf(sh->error, sizeof(sh->error), "%s", err.message);
		sh->refused = err.errc == KERR_HTTP;
	}
	sh->ended = 1;
	pthread_cond_broadcast(&sh->cond);
	pthread_mutex_unlock(&sh->lock);
	if (write(sh->wake[1], "x", 1) < 0) {
		/* the main loop also sees `ended` on its next wake-up */
	}
	return NULL;
}

/* One input request: bytes typed (may be none), end of input, a new size.
 * 0 sent; 1 the command is gone (409; 404: the session too); -1 failed, with why printed. */
static int shell_input(struct shell *sh, const void *data, size_t len, int eof, const struct winsize *ws)
{
	struct kiln_err err = { .code = "" };
	json_t *body = json_pack("{s:s}", "exec_id", sh->exec_id), *reply = NULL;
	char path[128], msg[400];
	int st = -1;

	if (len) {
		char *b64 = malloc(4 * ((len + 2) / 3) + 1);

		if (!b64) {
			json_decref(body);
			return -1;
		}
		EVP_EncodeBlock((unsigned char *)b64, data, (int)len);
		json_object_set_new(body, "data_b64", json_string(b64));
		free(b64);
	}
	if (eof)
		json_object_set_new(body, "eof", json_true());
	if (ws)
		json_object_set_new(body, "resize", json_pack("{s:i, s:i}", "rows", ws->ws_row, "cols", ws->ws_col));
	snprintf(path, sizeof(path), "/v1/sessions/%s/input", sh->id);
	for (int i = 0; i < SHELL_RETRIES; i++) {
		json_decref(reply);
		reply = NULL;
		st = http_call(sh->conn, "POST", path, body, 30, &reply, &err);
		if (st != 503 ||
		    kiln_err_lookup(json_string_value(json_object_get(json_object_get(reply, "error"), "code"))) !=
			    KERR_INPUT_FULL)
			break;
		poll(NULL, 0, SHELL_RETRY_MS);
	}
	json_decref(body);
	if (st >= 200 && st < 300) {
		json_decref(reply);
		return 0;
	}
	if (st == 409 || st == 404) {
		json_decref(reply);
		return 1;
	}
	if (st < 0)
		snprintf(msg, sizeof(msg), "%s", err.message);
	else
		http_describe_error(st, reply, msg, sizeof(msg));
	json_decref(reply);
	fprintf(stderr, "\r\nkiln: shell: input: %s\r\n", msg);
	return -1;
}

/* The terminal's size, or 24 x 80 when stdout is not one. */
static void shell_size(struct winsize *ws)
{
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, ws) < 0 || !ws->ws_row || !ws->ws_col) {
		ws->ws_row = 24;
		ws->ws_col = 80;
	}
	if (ws->ws_row > 4096)
		ws->ws_row = 4096;
	if (ws->ws_col > 4096)
		ws->ws_col = 4096;
}

/* The quota's longest command, for the default timeout (3600 if unknown). */
static long shell_default_timeout(const struct cli_conn *conn)
{
	struct kiln_err err = { .code = "" };
	json_t *reply = NULL;
	long t = 3600;

	if (http_call(conn, "GET", "/v1/usage", NULL, 30, &reply, &err) == 200) {
		json_t *v = json_object_get(json_object_get(reply, "quotas"), "max_task_timeout_s");

		if (json_is_integer(v))
			t = json_integer_value(v) > 0 ? (long)json_integer_value(v) : 86400;
	}
	json_decref(reply);
	return t;
}

/* Pump stdin and signals into input requests until the stream ends (0),
 * we are to leave (-1: a signal, input failed) or the command is gone (1:
 * its result is on its way). */
static int shell_loop(struct shell *sh, int tty_in)
{
	char buf[SHELL_READ];
	int in_open = 1, r;

	for (;;) {
		struct pollfd p[3] = { { .fd = in_open ? STDIN_FILENO : -1, .events = POLLIN },
				       { .fd = signal_pipe[0], .events = POLLIN },
				       { .fd = sh->wake[0], .events = POLLIN } };
		ssize_t n;

		if (poll(p, 3, -1) < 0 && errno != EINTR)
			return -1;
		if (p[2].revents)
			return 0;
		if (p[1].revents) {
			char sigs[16];
			ssize_t k = read(signal_pipe[0], sigs, sizeof(sigs));

			for (ssize_t i = 0; i < k; i++)
				if (sigs[i] != SIGWINCH)
					return -1; /* SIGTERM, SIGHUP, SIGINT: leave (the command ends with us) */
			if (winch_flag) {
				struct winsize ws;

				winch_flag = 0;
				shell_size(&ws);
				if ((r = shell_input(sh, NULL, 0, 0, &ws)))
					return r;
			}
		}
		if (p[0].revents) {
			n = read(STDIN_FILENO, buf, sizeof(buf));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				/* Not a terminal: the end of what was piped in. */
				in_open = 0;
				if (!tty_in && (r = shell_input(sh, NULL, 0, 1, NULL)))
					return r;
				continue;
			}
			if ((r = shell_input(sh, buf, (size_t)n, 0, NULL)))
				return r;
		}
	}
}

int cmd_shell(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_signal };
	struct shell sh = { .wake = { -1, -1 } };
	struct termios saved, raw;
	struct cli_conn conn;
	struct creds cr;
	struct winsize ws;
	struct timespec until;
	json_t *env, *cmd;
	const char *cwd = NULL, *term = getenv("TERM");
	long timeout_s = 0;
	pthread_t th;
	int i, rc, tty_in = isatty(STDIN_FILENO), is_raw = 0;

	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		shell_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	sh.id = argv[1];
	if (!*sh.id || strlen(sh.id) > 64 ||
	    strspn(sh.id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != strlen(sh.id)) {
		fprintf(stderr, "kiln: shell: %s: not a session id\n", sh.id);
		return EXIT_USAGE;
	}
	env = json_object();
	cmd = json_array();
	for (i = 2; i < argc; i++) {
		char *end;

		if (!strcmp(argv[i], "--")) {
			for (i++; i < argc; i++)
				json_array_append_new(cmd, json_string(argv[i]));
			if (!json_array_size(cmd)) {
				fprintf(stderr, "kiln: shell: nothing after \"--\": name the command to run\n");
				goto usage;
			}
			break;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "kiln: shell: %s: unknown option or missing value\n", argv[i]);
			goto usage;
		}
		if (!strcmp(argv[i], "--timeout")) {
			errno = 0;
			timeout_s = strtol(argv[++i], &end, 10);
			if (errno || *end || timeout_s <= 0) {
				fprintf(stderr, "kiln: shell: --timeout: expected a positive number of seconds\n");
				goto usage;
			}
		} else if (!strcmp(argv[i], "--cwd")) {
			cwd = argv[++i];
		} else if (!strcmp(argv[i], "--env") && strchr(argv[i + 1], '=') && argv[i + 1][0] != '=') {
			char *kv = argv[++i], *eq = strchr(kv, '=');

			*eq = '\0';
			json_object_set_new(env, kv, json_string(eq + 1));
			*eq = '=';
		} else {
			fprintf(stderr, "kiln: shell: %s: unknown option or missing value\n", argv[i]);
			goto usage;
		}
	}
	if ((rc = cli_connect(&cr, 0, &conn))) {
		json_decref(env);
		json_decref(cmd);
		return rc;
	}
	sh.conn = &conn;
	if (!json_array_size(cmd)) {
		json_array_append_new(cmd, json_string("/bin/bash"));
		json_array_append_new(cmd, json_string("-l"));
	}
	if (!json_object_get(env, "TERM"))
		json_object_set_new(env, "TERM", json_string(term && *term && strcmp(term, "dumb") ? term : "xterm-256color"));
	shell_size(&ws);
	sh.body = json_pack("{s:o, s:o, s:{s:i, s:i}, s:I}", "argv", cmd, "env", env, "tty", "rows", ws.ws_row, "cols",
			    ws.ws_col, "timeout_s", (json_int_t)(timeout_s ? timeout_s : shell_default_timeout(&conn)));
	if (cwd)
		json_object_set_new(sh.body, "cwd", json_string(cwd));
	pthread_mutex_init(&sh.lock, NULL);
	pthread_cond_init(&sh.cond, NULL);
	if (pipe2(sh.wake, O_CLOEXEC) < 0 || pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		fprintf(stderr, "kiln: shell: pipe: %s\n", strerror(errno));
		return EXIT_INFRA;
	}
	sigemptyset(&sa.sa_mask);
	sigaction(SIGWINCH, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	if (pthread_create(&th, NULL, shell_stream, &sh) != 0) {
		fprintf(stderr, "kiln: shell: cannot start a thread\n");
		return EXIT_INFRA;
	}

	/* Typing goes nowhere until the command runs and names its exec id. */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += SHELL_START_S;
	pthread_mutex_lock(&sh.lock);
	while (!sh.started && !sh.ended && pthread_cond_timedwait(&sh.cond, &sh.lock, &until) == 0)
		;
	rc = sh.started && sh.exec_id[0];
	pthread_mutex_unlock(&sh.lock);
	if (rc) {
		if (tty_in && tcgetattr(STDIN_FILENO, &saved) == 0) {
			raw = saved;
			cfmakeraw(&raw);
			is_raw = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
		}
		rc = shell_loop(&sh, tty_in);
		if (is_raw)
			tcsetattr(STDIN_FILENO, TCSANOW, &saved);
		if (rc > 0) {
			/* The command is gone: its result follows on the stream. */
			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_sec += 30;
			pthread_mutex_lock(&sh.lock);
			while (!sh.ended && pthread_cond_timedwait(&sh.cond, &sh.lock, &until) == 0)
				;
			pthread_mutex_unlock(&sh.lock);
		}
	}
	pthread_mutex_lock(&sh.lock);
	rc = sh.ended;
	pthread_mutex_unlock(&sh.lock);
	if (!rc) {
		/* We are leaving (a signal, or input failed): the command ends with
		 * its stream. */
		fprintf(stderr, "kiln: shell: leaving; the command in %s is ended\n", sh.id);
		json_decref(sh.body);
		fflush(stdout);
		_exit(EXIT_INFRA); /* the stream thread holds the connection: closing it is the point */
	}
	pthread_join(th, NULL);
	json_decref(sh.body);
	if (!sh.result) {
		fprintf(stderr, "kiln: shell: %s\n", sh.error[0] ? sh.error : "the stream ended without a result");
		return sh.refused ? EXIT_REFUSED : EXIT_INFRA;
	}
	rc = cli_exec_status(sh.result);
	if (rc && !json_is_integer(json_object_get(sh.result, "exit_code")))
		fprintf(stderr, "kiln: shell: %s%s%s\n", json_string_value(json_object_get(sh.result, "state")) ?: "?",
			json_object_get(sh.result, "end_reason") ? ", " : "",
			json_string_value(json_object_get(sh.result, "end_reason")) ?: "");
	json_decref(sh.result);
	return rc;

usage:
	json_decref(env);
	json_decref(cmd);
	shell_usage(stderr);
	return EXIT_USAGE;
}
