/* follow: print a task's events as they happen (kiln run, kiln task logs). */
#include "follow.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"

static volatile sig_atomic_t interrupts; /* SIGINTs received while following */

static void on_sigint(int sig)
{
	interrupts++;
}

struct follow_ctx {
	const struct cli_conn *conn;
	struct follow_view *v;
	int tty;               /* stderr is a terminal: an updating elapsed-time line */
	int ticker_shown;      /* that line is on screen now */
	int at_line_start;     /* the last byte shown ended a line */
	int cancel_on_int;
	long long started_ms, running_ms;
	long long last_tick_ms;
	int cancel_shown;
};

static void clear_ticker(struct follow_ctx *f)
{
	if (f->ticker_shown) {
		fputs("\r\033[K", stderr);
		f->ticker_shown = 0;
	}
}

static void say(struct follow_ctx *f, const char *fmt, const char *arg, double secs)
{
	clear_ticker(f);
	if (!f->at_line_start) {
		fputc('\n', stderr);
		f->at_line_start = 1;
	}
	fprintf(stderr, fmt, arg, secs);
	fflush(stderr);
}

int follow_state_final(const char *s)
{
	return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "timed_out") ||
	       !strcmp(s, "cancelled") || !strcmp(s, "error");
}

static int on_event(void *ctx, const char *name, json_t *data)
{
	struct follow_ctx *f = ctx;
	struct follow_view *v = f->v;
	double secs = (double)(clock_mono_ms() - f->started_ms) / 1000.0;

	if (!strcmp(name, "stdout") || !strcmp(name, "stderr")) {
		const char *d = json_string_value(json_object_get(data, "data"));
		size_t n = d ? strlen(d) : 0;
		FILE *out = name[3] == 'o' ? stdout : stderr;

		json_t *off = json_object_get(data, "offset"), *len = json_object_get(data, "bytes");
		int k = name[3] == 'o' ? 0 : 1;

		if (json_is_integer(off) && json_is_integer(len) && json_integer_value(off) >= 0 &&
		    json_integer_value(len) >= 0) {
			if ((unsigned long long)json_integer_value(off) != v->log_next[k])
				v->log_gap = 1; /* a chunk went missing on the way */
			v->log_next[k] = (unsigned long long)json_integer_value(off) +
					 (unsigned long long)json_integer_value(len);
		} else {
			v->log_gap = v->log_unknown = 1; /* an older kiln-host */
		}
		if (!n)
			return 0;
		clear_ticker(f);
		fwrite(d, 1, n, out);
		fflush(out);
		v->output_bytes += (long long)n;
		f->at_line_start = d[n - 1] == '\n';
	} else if (!strcmp(name, "state")) {
		const char *s = json_string_value(json_object_get(data, "state"));

		if (!s)
			return 0;
		snprintf(v->state, sizeof(v->state), "%s", s);
		if (!strcmp(s, "running"))
			f->running_ms = clock_mono_ms();
		if (v->progress)
			say(f, "kiln: %s (%.1f s)\n", s, secs);
	} else if (!strcmp(name, "cancel")) {
		/* kiln-api records the request and relays the host's: say it once. */
		if (v->progress && !f->cancel_shown++)
			say(f, "kiln: %s (%.1f s)\n", "cancel requested", secs);
	} else if (!strcmp(name, "truncated")) {
		v->log_gap = 1;
		say(f, "kiln: %s (%.1f s)\n", "event stream truncated: the rest of the output is only in the logs",
		    secs);
	}
	return 0;
}

/* Called by curl about once a second while the stream is open. */
static int on_tick(void *ctx)
{
	struct follow_ctx *f = ctx;
	long long now = clock_mono_ms();

	if (interrupts >= 2)
		return 1;
	if (interrupts == 1 && f->cancel_on_int && !f->v->cancel_sent) {
		json_t *reply = NULL;
		char path[256];

		f->v->cancel_sent = 1;
		say(f, "kiln: %s (%.1f s)\n", "interrupted: cancelling the task (Ctrl-C again to stop waiting)",
		    (double)(now - f->started_ms) / 1000.0);
		snprintf(path, sizeof(path), "/v1/tasks/%s/cancel", f->v->task_id);
		if (cli_request(f->conn, "cancel", "POST", path, NULL, 10, &reply) == 0)
			json_decref(reply);
	} else if (interrupts == 1 && !f->cancel_on_int) {
		return 1;
	}
	if (f->v->progress && f->tty && f->at_line_start && now - f->last_tick_ms >= 900) {
		long long since = f->running_ms ? f->running_ms : f->started_ms;

		f->last_tick_ms = now;
		fprintf(stderr, "\r\033[Kkiln: %s %.0f s", f->v->state[0] ? f->v->state : "waiting",
			(double)(now - since) / 1000.0);
		fflush(stderr);
		f->ticker_shown = 1;
	}
	return 0;
}

int follow_task(const struct cli_conn *c, struct follow_view *v, int cancel_on_int, struct kiln_err *err)
{
	struct follow_ctx f = {
		.conn = c, .v = v, .tty = isatty(2), .at_line_start = 1, .cancel_on_int = cancel_on_int,
		.started_ms = clock_mono_ms(),
	};
	struct sigaction sa = { .sa_handler = on_sigint }, old;
	char path[256];
	int r;

	snprintf(path, sizeof(path), "/v1/tasks/%s/events", v->task_id);
	interrupts = 0;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old);
	r = http_follow(c, path, 40, on_event, on_tick, &f, err);
	sigaction(SIGINT, &old, NULL);
	clear_ticker(&f);
	if (!f.at_line_start)
		fputc('\n', stderr);
	if (r == 1)
		return kiln_err_set(err, KERR_INTERRUPTED, "interrupted");
	return r;
}
