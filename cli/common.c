/* common: configuration and request helpers shared by the kiln CLI's commands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <curl/curl.h>

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
	conn->ca_file = cr->ca_file[0] ? cr->ca_file : NULL;
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

int cli_id_ok(const char *id)
{
	size_t n = id ? strlen(id) : 0;

	return n && n < 64 && strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n &&
	       strcmp(id, ".") && strcmp(id, "..");
}

int cli_snapshot_list_path(const char *name, const char *session_id, const char *after, char *out, size_t size)
{
	const char *keys[] = { "name", "session_id", "after" }, *vals[] = { name, session_id, after };
	size_t i, len;
	int n = snprintf(out, size, "/v1/snapshots?limit=100");

	if (n < 0 || (size_t)n >= size)
		return -1;
	len = (size_t)n;
	for (i = 0; i < 3; i++) {
		char *enc;

		if (!vals[i] || !*vals[i])
			continue;
		if (!(enc = curl_easy_escape(NULL, vals[i], 0)))
			return -1;
		n = snprintf(out + len, size - len, "&%s=%s", keys[i], enc);
		curl_free(enc);
		if (n < 0 || (size_t)n >= size - len)
			return -1;
		len += (size_t)n;
	}
	return 0;
}

int cli_volume_name_ok(const char *name)
{
	return cli_id_ok(name);
}

json_t *cli_volume_mount(const char *arg, char *msg, size_t msg_size)
{
	const char *colon = arg ? strchr(arg, ':') : NULL;
	char name[64], path[4096];
	size_t nlen, plen;
	int ro = -1;
	json_t *v;

	if (!colon) {
		snprintf(msg, msg_size, "expected NAME:PATH[:ro], got \"%.80s\"", arg ? arg : "");
		return NULL;
	}
	nlen = (size_t)(colon - arg);
	if (nlen >= sizeof(name)) {
		snprintf(msg, msg_size, "the volume name is longer than 63 characters");
		return NULL;
	}
	memcpy(name, arg, nlen);
	name[nlen] = '\0';
	if (!cli_volume_name_ok(name)) {
		snprintf(msg, msg_size, "\"%.63s\" is not a volume name (1-63 of A-Z a-z 0-9 . _ -)", name);
		return NULL;
	}
	plen = strlen(colon + 1);
	if (plen >= sizeof(path)) {
		snprintf(msg, msg_size, "the path is too long");
		return NULL;
	}
	memcpy(path, colon + 1, plen + 1);
	/* A trailing ":ro" or ":rw" is the mode (a path ending so needs it given). */
	if (plen >= 3 && (!strcmp(path + plen - 3, ":ro") || !strcmp(path + plen - 3, ":rw"))) {
		ro = path[plen - 1] == 'o';
		path[plen - 3] = '\0';
	}
	if (path[0] != '/' || !strcmp(path, "/") || strchr(path, ':')) {
		snprintf(msg, msg_size, "\"%.200s\": the path must be absolute, not \"/\", and the mode :ro or :rw",
			 path);
		return NULL;
	}
	if (ro < 0)
		v = json_pack("{s:s, s:s}", "name", name, "path", path);
	else
		v = json_pack("{s:s, s:s, s:b}", "name", name, "path", path, "read_only", ro);
	if (!v) /* jansson takes only UTF-8 */
		snprintf(msg, msg_size, "the path is not UTF-8 text");
	return v;
}

void cli_human_size(long long n, char *out, size_t size)
{
	if (n < 0)
		snprintf(out, size, "-");
	else if (n < 1024 * 1024)
		snprintf(out, size, "%.1f KiB", (double)n / 1024);
	else if (n < 1024LL * 1024 * 1024)
		snprintf(out, size, "%.1f MiB", (double)n / (1024 * 1024));
	else
		snprintf(out, size, "%.2f GiB", (double)n / (1024.0 * 1024 * 1024));
}

void cli_format_ms(json_t *ms, char *out, size_t size)
{
	time_t secs = (time_t)(json_integer_value(ms) / 1000);
	struct tm tm;

	out[0] = '\0';
	if (json_is_integer(ms) && localtime_r(&secs, &tm))
		strftime(out, size, "%Y-%m-%d %H:%M:%S", &tm);
	else
		snprintf(out, size, "-");
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
