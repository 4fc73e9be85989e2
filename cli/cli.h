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
int cmd_template(int argc, char **argv);
int cmd_destination(int argc, char **argv);
int cmd_mcp(int argc, char **argv);
int cmd_snapshot(int argc, char **argv);
int cmd_volume(int argc, char **argv);

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

/* cli_request with the reply printed (cli_print_json) on success and freed:
 * the exit status of a command whose output is the answer itself. body stays
 * the caller's. */
int cli_request_print(const struct cli_conn *conn, const char *what, const char *method, const char *path,
		      json_t *body, long timeout_s);

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

/* ---- kiln template build: the arguments and the recipe (pure functions) ---- */

#define CLI_TEMPLATE_MAX_ARGS 200 /* --packages and --preload options (each a list) */

/* `kiln template build [RECIPE.json] [--name N] [--packages P,...]... [--run CMD]...
 * [--file LOCAL:/GUEST]... [--preload M,...]... [--env K=V]... [--workdir DIR]
 * [--oci IMAGE.tar] [--no-wait] [--json]`. Pointers borrow from argv. */
struct cli_template_args {
	const char *name;
	const char *recipe_file;      /* RECIPE.json */
	const char *oci;              /* --oci: an image archive */
	const char *packages[CLI_TEMPLATE_MAX_ARGS]; /* each "a,b c" */
	int npackages;
	const char *run[50];          /* RECIPE_MAX_RUN */
	int nrun;
	const char *files[100];       /* "LOCAL:/GUEST", RECIPE_MAX_FILES */
	int nfiles;
	const char *preload[CLI_TEMPLATE_MAX_ARGS];
	int npreload;
	const char *env[128];         /* "K=V", RECIPE_MAX_ENV */
	int nenv;
	const char *workdir;
	int no_wait, json, help;
};

/* Parse argv[1..argc) of `kiln template build`: one of a recipe file, recipe
 * flags or --oci; --name needed unless the recipe file names it; a valid
 * template name. 0, or -1 with why in msg. */
int cli_template_build_args(int argc, char **argv, struct cli_template_args *out, char *msg, size_t msg_size);

/* The recipe to POST (docs/templates.md "The recipe"): the recipe file
 * (JSON, duplicate keys refused; --name replaces its name), or one made from
 * the flags: {"name","from":"debian","packages","files","run","preload","env",
 * "workdir"}, only the keys given; --packages/--preload split at commas and
 * blanks; --file reads the local file (base64, its permission bits as the
 * mode). NULL with why in msg. Caller decrefs. */
json_t *cli_template_recipe(const struct cli_template_args *a, char *msg, size_t msg_size);

/* "12.3 MiB" for a byte count ("-" when negative: unknown). */
void cli_human_size(long long n, char *out, size_t size);

/* A time in milliseconds since the epoch (a JSON integer) as local
 * "YYYY-MM-DD HH:MM:SS"; "-" when ms is not an integer. */
void cli_format_ms(json_t *ms, char *out, size_t size);

/* ---- kiln session fork, kiln snapshot (pure functions) ---- */

/* 1 when id may be put into a request path as a session or snapshot id
 * (s_..., snap_...): 1-63 of A-Z a-z 0-9 _ . - and not "." or ".."; else 0. */
int cli_id_ok(const char *id);

/* The path of one page of `kiln snapshot list`:
 * "/v1/snapshots?limit=100[&name=N][&session_id=S][&after=T]", each value
 * URL-escaped (NULL or "": left out). 0, or -1 when it does not fit in size
 * or cannot be escaped. */
int cli_snapshot_list_path(const char *name, const char *session_id, const char *after, char *out, size_t size);

/* ---- kiln volume, kiln session create --volume (pure functions) ---- */

/* 1 when name is a volume name kiln-api accepts: 1-63 of A-Z a-z 0-9 . _ -
 * (not "." or ".."); else 0. */
int cli_volume_name_ok(const char *name);

/* One `--volume NAME:PATH[:ro|:rw]` of kiln session create as kiln-api's
 * {"name","path","read_only"} (read_only only when ":ro" or ":rw" was
 * given). PATH must be absolute and not "/" (kiln-api checks the rest: not
 * under /proc, /sys, /dev, none inside another). NULL with why in msg.
 * Caller decrefs. */
json_t *cli_volume_mount(const char *arg, char *msg, size_t msg_size);

/* Print a JSON value indented on stdout. */
void cli_print_json(json_t *v);

#endif
