/* cli: the kiln command-line client's commands (one module each) and the
 * helpers they share. Every command takes its own argv (argv[0] is the
 * command's name) and returns the process exit status:
 *   0 success, 1 refused by the API (HTTP error) or a task that failed,
 *   2 bad usage or missing configuration, 3 API unreachable or a task error. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stddef.h>
#include <sys/types.h>

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
int cmd_session(int argc, char **argv);
int cmd_shell(int argc, char **argv);

/* The exit status for a session command's result: the command's exit code,
 * 1 when it failed without one (signal, timeout), 3 when kiln could not run
 * it. */
int cli_exec_status(json_t *res);

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

/* Read a whole regular local file of at most max bytes: malloc'd, with a
 * NUL after the *len bytes; *mode (may be NULL) gets its permission bits.
 * NULL with the reason printed. */
unsigned char *cli_read_file(const char *path, size_t max, size_t *len, mode_t *mode);

/* ---- kiln session: the parts with logic of their own (pure functions) ---- */

/* `kiln session exec ID [--env K=V]... [--cwd DIR] [--timeout S] [--stdin FILE|-]
 * [--json] (-- ARGV... | --code FILE.py|FILE.sh)`. Pointers borrow from argv. */
struct cli_exec_args {
	const char *id;
	char **cmd;                 /* the command after "--" (ncmd entries), or NULL */
	int ncmd;
	const char *code_file;      /* --code */
	const char *language;       /* from code_file's extension: "python" or "bash" */
	const char *cwd;
	const char *stdin_file;     /* --stdin FILE ("-": kiln's own stdin), or NULL: at EOF */
	long timeout_s;             /* 0: the API's default */
	char *env[64];              /* "K=V" */
	int nenv;
	int json;                   /* print the result JSON instead of streaming */
};

/* Parse argv[1..argc) of `kiln session exec`. Options come before "--";
 * everything after it is the command, taken as is. 0, or -1 with why in msg. */
int cli_session_exec_args(int argc, char **argv, struct cli_exec_args *out, char *msg, size_t msg_size);

/* A guest path as given on the command line: absolute as is, relative ones
 * under /work (as kiln run --file does). 0, or -1 when empty or too long. */
int cli_guest_path(const char *arg, char *out, size_t size);

/* Where `kiln session get ID GUEST [LOCAL]` writes: LOCAL ("-": stdout); a
 * LOCAL that is a directory gets GUEST's last component inside; no LOCAL:
 * that component in the current directory. 0, or -1 when GUEST names no
 * file (ends in "/", ".", "..") and LOCAL does not either. */
int cli_session_get_target(const char *guest, const char *local, char *out, size_t size);

/* Print a JSON value indented on stdout. */
void cli_print_json(json_t *v);

#endif
