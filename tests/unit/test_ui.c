/* test_ui: the web console's static route (api/http/ui.c) over real HTTP: a
 * libmicrohttpd daemon on loopback answering with ui_serve from a temporary
 * directory, fetched with libcurl. Known files with their Content-Type, the
 * CSP and nosniff on every answer (404s too), 404 for unknown names, dot
 * segments (plain and percent-encoded), hidden files, subdirectories and
 * symlinks, 405 for other methods, 304 on a matching ETag. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "ui.h"

static char dir[] = "/tmp/kiln-test-ui.XXXXXX";
static char base[64];
static struct MHD_Daemon *d;

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			       const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	if (!*con_cls) {
		*con_cls = (void *)1;
		return MHD_YES;
	}
	if (*upload_size) {
		*upload_size = 0;
		return MHD_YES;
	}
	if (!ui_is_path(url))
		return MHD_NO;
	return ui_serve(dir, conn, method, url);
}

struct got {
	long status;
	char headers[4096];
	size_t hlen;
	char body[8192];
	size_t blen;
};

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
	struct got *g = arg;
	size_t len = size * n;

	if (g->hlen + len < sizeof(g->headers)) {
		memcpy(g->headers + g->hlen, p, len);
		g->hlen += len;
		g->headers[g->hlen] = '\0';
	}
	return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	struct got *g = arg;
	size_t len = size * n;

	if (g->blen + len < sizeof(g->body)) {
		memcpy(g->body + g->blen, p, len);
		g->blen += len;
		g->body[g->blen] = '\0';
	}
	return len;
}

static void get(const char *method, const char *path, const char *header, struct got *g)
{
	CURL *c = curl_easy_init();
	struct curl_slist *h = header ? curl_slist_append(NULL, header) : NULL;
	char url[512];

	memset(g, 0, sizeof(*g));
	snprintf(url, sizeof(url), "%s%s", base, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (!strcmp(method, "HEAD"))
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, g);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, g);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
	if (h)
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	assert_int_equal(curl_easy_perform(c), CURLE_OK);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &g->status);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
}

static int has(const struct got *g, const char *line)
{
	return strcasestr(g->headers, line) != NULL;
}

static void put(const char *name, const char *content)
{
	char p[256];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	f = fopen(p, "w");
	assert_non_null(f);
	fputs(content, f);
	fclose(f);
}

static int setup(void **state)
{
	char p[256];
	FILE *f;
	int port;

	if (!mkdtemp(dir))
		return -1;
	put("index.html", "<!doctype html><title>x</title>");
	put("app.js", "'use strict';");
	put("app.css", "body{}");
	put(".hidden.js", "hidden");
	snprintf(p, sizeof(p), "%s/sub", dir);
	mkdir(p, 0755);
	put("sub/x.js", "sub");
	snprintf(p, sizeof(p), "%s/link.js", dir);
	if (symlink("/etc/passwd", p) < 0)
		return -1;
	snprintf(p, sizeof(p), "%s/../kiln-test-ui-secret.js", dir);
	f = fopen(p, "w");
	if (!f)
		return -1;
	fputs("secret", f);
	fclose(f);
	d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL, 0, NULL,
			     NULL, handler, NULL, MHD_OPTION_SOCK_ADDR, NULL, MHD_OPTION_END);
	if (!d)
		return -1;
	port = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port;
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", port);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	return 0;
}

static int teardown(void **state)
{
	char cmd[512];

	MHD_stop_daemon(d);
	/* the file beside dir first: "dir/.." does not resolve once dir is gone */
	snprintf(cmd, sizeof(cmd), "rm -f '%s/../kiln-test-ui-secret.js' && rm -rf '%s'", dir, dir);
	return system(cmd) ? -1 : 0;
}

static void test_names(void **state)
{
	const char *type = NULL;

	assert_string_equal(ui_file_name("/ui", &type), "index.html");
	assert_string_equal(type, "text/html; charset=utf-8");
	assert_string_equal(ui_file_name("/ui/", &type), "index.html");
	assert_string_equal(ui_file_name("/ui/app.js", &type), "app.js");
	assert_string_equal(type, "text/javascript; charset=utf-8");
	assert_string_equal(ui_file_name("/ui/app-2_x.css", &type), "app-2_x.css");
	assert_string_equal(type, "text/css; charset=utf-8");
	const char *bad[] = { "/ui/../x.js", "/ui/..", "/ui/.js", "/ui/.hidden.js", "/ui/a/b.js", "/ui//a.js",
			      "/ui/a.js/", "/ui/a.exe", "/ui/a", "/ui/a b.js", "/ui/a.JS", "/uix/a.js", "/v1/tasks",
			      "/ui/a.js.bak", "/ui/a\\b.js", NULL };
	for (int i = 0; bad[i]; i++)
		if (ui_file_name(bad[i], NULL))
			fail_msg("ui_file_name(\"%s\") is not NULL", bad[i]);
	assert_true(ui_is_path("/ui"));
	assert_true(ui_is_path("/ui/x"));
	assert_false(ui_is_path("/uix"));
	assert_false(ui_is_path("/v1/ui"));
}

static void expect_secure(const struct got *g)
{
	if (!has(g, "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self';") ||
	    !has(g, "frame-ancestors 'none'") || !has(g, "X-Content-Type-Options: nosniff"))
		fail_msg("headers without the CSP or nosniff:\n%s", g->headers);
}

static void test_serve(void **state)
{
	struct got g;
	char etag[128], inm[160];
	const char *e;

	get("GET", "/ui/", NULL, &g);
	assert_int_equal(g.status, 200);
	assert_true(has(&g, "Content-Type: text/html; charset=utf-8"));
	assert_string_equal(g.body, "<!doctype html><title>x</title>");
	expect_secure(&g);
	get("GET", "/ui", NULL, &g);
	assert_int_equal(g.status, 200);
	get("GET", "/ui/app.js", NULL, &g);
	assert_int_equal(g.status, 200);
	assert_true(has(&g, "Content-Type: text/javascript"));
	assert_true(has(&g, "Cache-Control: no-cache"));
	expect_secure(&g);
	e = strcasestr(g.headers, "ETag: ");
	assert_non_null(e);
	sscanf(e + 6, "%127[^\r\n]", etag);
	snprintf(inm, sizeof(inm), "If-None-Match: %s", etag);
	get("GET", "/ui/app.js", inm, &g);
	assert_int_equal(g.status, 304);
	assert_int_equal(g.blen, 0);
	expect_secure(&g);
	get("GET", "/ui/app.css", NULL, &g);
	assert_int_equal(g.status, 200);
	assert_true(has(&g, "Content-Type: text/css"));
	get("HEAD", "/ui/app.js", NULL, &g);
	assert_int_equal(g.status, 200);
	get("POST", "/ui/app.js", NULL, &g);
	assert_int_equal(g.status, 405);
	assert_true(has(&g, "Allow: GET, HEAD"));
	expect_secure(&g);
}

static void test_refused(void **state)
{
	const char *paths[] = { "/ui/nosuch.js", "/ui/../kiln-test-ui-secret.js", "/ui/..%2fkiln-test-ui-secret.js",
				"/ui/%2e%2e/kiln-test-ui-secret.js", "/ui/%2E%2E%2Fkiln-test-ui-secret.js",
				"/ui/../../etc/passwd", "/ui/.hidden.js", "/ui/sub/x.js", "/ui/sub%2fx.js",
				"/ui/link.js", "/ui/index.html.bak", "/ui/app.js/", NULL };
	struct got g;

	for (int i = 0; paths[i]; i++) {
		get("GET", paths[i], NULL, &g);
		if (g.status != 404 || strstr(g.body, "secret") || strstr(g.body, "root:") || strstr(g.body, "sub") ||
		    strstr(g.body, "hidden"))
			fail_msg("%s: HTTP %ld, body \"%s\"", paths[i], g.status, g.body);
		expect_secure(&g);
	}
}

static void test_no_dir(void **state)
{
	char saved[sizeof(dir)];
	struct got g;

	/* the directory gone: 404, not a crash */
	memcpy(saved, dir, sizeof(dir));
	strcpy(dir, "/nonexistent-kiln-ui");
	get("GET", "/ui/app.js", NULL, &g);
	memcpy(dir, saved, sizeof(dir));
	assert_int_equal(g.status, 404);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_serve),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_no_dir),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
