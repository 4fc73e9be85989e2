/* httpd: the request-body collector and the route table shared by kiln-api
 * and kiln-host (see httpd.h). */
#include "httpd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reply.h"

void httpd_body_init(struct httpd_body *hb, size_t max, size_t drop_max)
{
	buf_init(&hb->b, max);
	hb->too_big = 0;
	hb->dropped = 0;
	hb->drop_max = drop_max;
}

int httpd_body_declared_too_big(const struct httpd_body *hb, struct MHD_Connection *conn)
{
	const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);

	return cl && strtoull(cl, NULL, 10) > hb->b.max;
}

enum MHD_Result httpd_body_feed(struct httpd_body *hb, const char *upload, size_t *upload_size)
{
	size_t n = *upload_size;
	int rc;

	*upload_size = 0;
	if (!hb->too_big) {
		rc = buf_add(&hb->b, upload, n);
		if (rc == 0)
			return MHD_YES;
		if (rc != -E2BIG)
			return MHD_NO;
		/* A chunked body has no length up front: drop the rest and
		 * answer 413 at its end. */
		hb->too_big = 1;
	}
	hb->dropped += n;
	return hb->drop_max && hb->dropped > hb->drop_max ? MHD_NO : MHD_YES;
}

void httpd_body_free(struct httpd_body *hb)
{
	buf_free(&hb->b);
}

/* Split path (after its leading '/') into r->path_, matching pattern segment
 * by segment. 1 on a match, with r->param[] set. */
static int pattern_match(const char *pattern, const char *path, struct httpd_req *r)
{
	const char *p = pattern, *u = path;

	r->nparam = 0;
	if (*p != '/' || *u != '/')
		return 0;
	for (;;) {
		const char *pe, *ue;
		size_t pn, un;

		p++;
		u++;
		pe = strchrnul(p, '/');
		ue = strchrnul(u, '/');
		pn = (size_t)(pe - p);
		un = (size_t)(ue - u);
		if (pn >= 2 && p[0] == '{' && p[pn - 1] == '}') {
			char *dst;

			if (un == 0 || r->nparam == HTTPD_MAX_PARAMS)
				return 0;
			/* Segments land in path_ at their own offset: path fits there. */
			dst = r->path_ + (u - path);
			memcpy(dst, u, un);
			dst[un] = '\0';
			r->param[r->nparam++] = dst;
		} else if (pn != un || memcmp(p, u, pn)) {
			return 0;
		}
		if (!*pe || !*ue)
			return !*pe && !*ue;
		p = pe;
		u = ue;
	}
}

static void allow_add(char *allow, size_t size, const char *method)
{
	size_t len = strlen(allow), mn = strlen(method);

	/* No repeats: look for the method as a whole item. */
	for (const char *a = allow; (a = strstr(a, method)); a += mn)
		if ((a == allow || a[-1] == ' ') && (a[mn] == ',' || !a[mn]))
			return;
	snprintf(allow + len, size - len, "%s%s", len ? ", " : "", method);
}

enum httpd_match_result httpd_route_match(const struct httpd_routes *t, const char *method, const char *path,
					  struct httpd_req *r, const struct httpd_route **row, char *allow,
					  size_t allow_size)
{
	int path_found = 0;

	if (allow_size)
		allow[0] = '\0';
	if (strlen(path) >= sizeof(r->path_))
		return HTTPD_NOT_FOUND;
	for (size_t i = 0; i < t->n; i++) {
		const struct httpd_route *rt = &t->rows[i];

		if (!pattern_match(rt->pattern, path, r))
			continue;
		if (!rt->method || !strcmp(rt->method, method)) {
			*row = rt;
			return HTTPD_MATCH;
		}
		path_found = 1;
		if (allow_size)
			allow_add(allow, allow_size, rt->method);
	}
	r->nparam = 0;
	return path_found ? HTTPD_NOT_ALLOWED : HTTPD_NOT_FOUND;
}

enum MHD_Result httpd_dispatch(const struct httpd_routes *t, void *ctx, struct httpd_req *r)
{
	const struct httpd_route *row = NULL;
	char allow[128], msg[160];
	size_t off;

	switch (httpd_route_match(t, r->method, r->url, r, &row, allow, sizeof(allow))) {
	case HTTPD_MATCH:
		return row->handler(ctx, r);
	case HTTPD_NOT_ALLOWED:
		/* "use GET, POST" or "use GET or POST": the message is each
		 * server's own wording; Allow is the HTTP list. */
		off = (size_t)snprintf(msg, sizeof(msg), "use ");
		for (const char *a = allow; *a && off < sizeof(msg);) {
			const char *comma = strstr(a, ", ");
			size_t n = comma ? (size_t)(comma - a) : strlen(a);

			off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%.*s%s", (int)n, a,
						comma ? (t->or ? t->or : ", ") : "");
			a = comma ? comma + 2 : a + n;
		}
		return reply_error_h(r->conn, KERR_METHOD_NOT_ALLOWED, msg, "Allow", allow);
	default:
		return reply_not_found(r->conn, t->not_found ? t->not_found : "no such endpoint");
	}
}
