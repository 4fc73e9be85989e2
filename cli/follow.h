/* follow: a task's event stream (GET /v1/tasks/{id}/events) shown on the
 * terminal: output chunks written raw to stdout/stderr as they arrive, and,
 * optionally, state changes and the elapsed time on stderr. */
#ifndef KILN_CLI_FOLLOW_H
#define KILN_CLI_FOLLOW_H

#include "http.h"

struct follow_view {
	int progress;         /* show states and elapsed time on stderr */
	const char *task_id;
	/* filled in while following */
	char state[32];       /* the latest state seen */
	long long output_bytes;
	int cancel_sent;
	/* Where the output shown so far ends in stdout.log ([0]) and stderr.log
	 * ([1]): the offset + bytes of the last chunk (kiln-host's events carry
	 * them). log_gap: some output was not shown (the stream said
	 * `truncated`, or a chunk came without offsets); the rest is in the logs. */
	unsigned long long log_next[2];
	int log_gap;
	int log_unknown;      /* a chunk without offsets: log_next cannot be trusted */
};

/* Follow the task's events until the stream ends (0), or fails (-1, err
 * set). SIGINT while following sends a cancel request once (when
 * cancel_on_int); a second SIGINT returns 1 at once. */
int follow_task(const struct cli_conn *c, struct follow_view *v, int cancel_on_int, struct kiln_err *err);

/* A state name that is final. */
int follow_state_final(const char *state);

#endif
