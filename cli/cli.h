/* cli: the kiln command-line client's commands (one module each) and the
 * helpers they share. Every command takes its own argv (argv[0] is the
 * command's name) and returns the process exit status:
 *   0 success, 1 refused by the API (HTTP error) or a task that failed,
 *   2 bad usage or missing configuration, 3 API unreachable or a task error. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <jansson.h>

#include "creds.h"
#include "http.h"

#define EXIT_REFUSED 1
#define EXIT_USAGE 2
#define EXIT_INFRA 3

int cmd_run(int argc, char **argv);
int cmd_task(int argc, char **argv);
int cmd_admin(int argc, char **argv);
int cmd_up(int argc, char **argv);

/* Resolve the API and key (admin: KILN_ADMIN_KEY, else KILN_KEY falling back
 * to KILN_ADMIN_KEY) into conn, borrowing from cr. Prints why and returns
 * EXIT_USAGE when something is missing, else 0. */
int cli_connect(struct creds *cr, int admin, struct cli_conn *conn);

/* http_call, then: an answer with status 2xx returns 0 with *reply set
 * (caller decrefs); an HTTP error prints "kiln: WHAT: HTTP 401 unauthorized:
 * message" and returns EXIT_REFUSED; no answer prints why and returns
 * EXIT_INFRA. what names the action in messages ("task get"). */
int cli_request(const struct cli_conn *conn, const char *what, const char *method, const char *path, json_t *body,
		long timeout_s, json_t **reply);

/* 1 when an output path from the server may be joined onto a local
 * directory: relative, at most 1024 bytes, no empty, "." or ".." components,
 * no control characters; else 0. Pure function. */
int cli_output_path_ok(const char *path);

/* Print a JSON value indented on stdout. */
void cli_print_json(json_t *v);

/* Milliseconds on the monotonic clock. */
long long cli_now_ms(void);

#endif
