/* common: configuration and request helpers shared by the kiln CLI's commands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

int cli_connect(struct creds *cr, int admin, struct cli_conn *conn)
{
	struct kiln_err err = { .code = "" };
	const char *key;

	if (creds_load(cr, &err) < 0) {
		fprintf(stderr, "kiln: %s\n", err.message);
		return EXIT_USAGE;
	}
	key = admin ? cr->admin_key : (cr->key[0] ? cr->key : cr->admin_key);
	if (!cr->api[0] || !key[0]) {
		fprintf(stderr,
			"kiln: no %s configured: set KILN_API and %s, or start a local stack with `kiln up` "
			"(credentials file %s%s)\n",
			!cr->api[0] ? "API" : "key", admin ? "KILN_ADMIN_KEY" : "KILN_KEY", cr->file,
			cr->file_found ? "" : ": not there");
		return EXIT_USAGE;
	}
	conn->api = cr->api;
	conn->key = key;
	return 0;
}

int cli_request(const struct cli_conn *conn, const char *what, const char *method, const char *path, json_t *body,
		long timeout_s, json_t **reply)
{
	struct kiln_err err = { .code = "" };
	char msg[700];
	int status = http_call(conn, method, path, body, timeout_s, reply, &err);

	if (status < 0) {
		fprintf(stderr, "kiln: %s: %s\n", what, err.message);
		return EXIT_INFRA;
	}
	if (status < 200 || status > 299) {
		http_describe_error(status, *reply, msg, sizeof(msg));
		fprintf(stderr, "kiln: %s: %s\n", what, msg);
		json_decref(*reply);
		*reply = NULL;
		return EXIT_REFUSED;
	}
	if (!*reply) {
		fprintf(stderr, "kiln: %s: HTTP %d with a reply that is not JSON\n", what, status);
		return EXIT_INFRA;
	}
	return 0;
}

int cli_request_print(const struct cli_conn *conn, const char *what, const char *method, const char *path,
		      json_t *body, long timeout_s)
{
	json_t *reply = NULL;
	int rc = cli_request(conn, what, method, path, body, timeout_s, &reply);

	if (!rc)
		cli_print_json(reply);
	json_decref(reply);
	return rc;
}

void cli_print_json(json_t *v)
{
	json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	putchar('\n');
}

unsigned char *cli_read_file(const char *path, size_t max, size_t *len, mode_t *mode)
{
	FILE *f = fopen(path, "re");
	struct stat st;
	unsigned char *p;

	if (!f || fstat(fileno(f), &st) < 0) {
		fprintf(stderr, "kiln: %s: %s\n", path, strerror(errno));
		if (f)
			fclose(f);
		return NULL;
	}
	if (!S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
		fprintf(stderr, "kiln: %s: %s\n", path, S_ISREG(st.st_mode) ? "too large" : "not a regular file");
		fclose(f);
		return NULL;
	}
	p = malloc((size_t)st.st_size + 1);
	if (!p || fread(p, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		fprintf(stderr, "kiln: %s: read failed\n", path);
		free(p);
		fclose(f);
		return NULL;
	}
	fclose(f);
	p[st.st_size] = '\0';
	*len = (size_t)st.st_size;
	if (mode)
		*mode = st.st_mode & 0777;
	return p;
}
