/* ui: the web console's static files (see ui.h). The console is plain
 * JavaScript without a build step (ui/); every answer under /ui carries a
 * strict Content-Security-Policy, nosniff and no-referrer, and is revalidated
 * (ETag from size and mtime) so an upgrade is seen on the next load. */
#include "ui.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define UI_FILE_MAX (8u << 20)

static const struct {
	const char *ext, *type;
} types[] = {
	{ ".html", "text/html; charset=utf-8" },
	{ ".js", "text/javascript; charset=utf-8" },
	{ ".css", "text/css; charset=utf-8" },
	{ ".svg", "image/svg+xml" },
	{ ".png", "image/png" },
	{ ".ico", "image/x-icon" },
};

int ui_is_path(const char *url)
{
	return !strcmp(url, "/ui") || !strncmp(url, "/ui/", 4);
}

const char *ui_file_name(const char *url, const char **type)
{
	const char *name, *dot;
	size_t i;

	if (!strcmp(url, "/ui") || !strcmp(url, "/ui/"))
		name = "index.html";
	else if (!strncmp(url, "/ui/", 4))
		name = url + 4;
	else
		return NULL;
	dot = strrchr(name, '.');
	if (!dot || dot == name || strlen(name) > 64)
		return NULL;
	for (const char *p = name; p < dot; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
		      *p == '-'))
			return NULL;
	for (i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (!strcmp(dot, types[i].ext)) {
			if (type)
				*type = types[i].type;
			return name;
		}
	return NULL;
}

const char *ui_default_dir(char *buf, size_t size)
{
	char exe[4096], *d;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	struct stat st;

	if (n <= 0)
		return NULL;
	exe[n] = '\0';
	d = dirname(exe);
	if ((size_t)snprintf(buf, size, "%s/../ui", d) < size && !stat(buf, &st) && S_ISDIR(st.st_mode))
		return buf;
	if ((size_t)snprintf(buf, size, "%s/../share/kiln/ui", d) < size && !stat(buf, &st) && S_ISDIR(st.st_mode))
		return buf;
	return NULL;
}

static void secure_headers(struct MHD_Response *r)
{
	MHD_add_response_header(r, "Content-Security-Policy", UI_CSP);
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
	MHD_add_response_header(r, "X-Frame-Options", "DENY");
	MHD_add_response_header(r, "Cross-Origin-Opener-Policy", "same-origin");
}

static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned status, const char *text, const char *allow)
{
	struct MHD_Response *r =
		MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;
	secure_headers(r);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

enum MHD_Result ui_serve(const char *dir, struct MHD_Connection *conn, const char *method, const char *url)
{
	const char *type = NULL, *name, *inm;
	struct MHD_Response *r;
	enum MHD_Result ret;
	char etag[64];
	struct stat st;
	int dfd, fd;

	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", "GET, HEAD");
	name = ui_file_name(url, &type);
	if (!name || !dir)
		return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n", NULL);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n", NULL);
	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	close(dfd);
	if (fd < 0)
		return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n", NULL);
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > UI_FILE_MAX) {
		close(fd);
		return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n", NULL);
	}
	snprintf(etag, sizeof(etag), "\"%llx-%llx\"", (unsigned long long)st.st_size,
		 (unsigned long long)st.st_mtim.tv_sec * 1000000000ull + (unsigned long long)st.st_mtim.tv_nsec);
	inm = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
	if (inm && !strcmp(inm, etag)) {
		close(fd);
		r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
		if (!r)
			return MHD_NO;
		ret = MHD_NO;
		secure_headers(r);
		MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
		MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		ret = MHD_queue_response(conn, MHD_HTTP_NOT_MODIFIED, r);
		MHD_destroy_response(r);
		return ret;
	}
	r = MHD_create_response_from_fd((uint64_t)st.st_size, fd); /* owns fd */
	if (!r) {
		close(fd);
		return MHD_NO;
	}
	secure_headers(r);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
	/* Revalidate every time: the files change with kiln, and a stale
	 * app.js against a newer API is worse than one round trip. */
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}
