/* httpd: what kiln-api and kiln-host share around libmicrohttpd's access
 * handler: a bounded request-body collector (Content-Length refused at
 * header time, a chunked body past the cap dropped and refused at its end)
 * and a {method, pattern, handler} route table with path parameters that
 * answers 404 and 405 (with Allow) itself. Replies are in reply.h. */
#ifndef KILN_HTTPD_H
#define KILN_HTTPD_H

#include <stddef.h>

#include <microhttpd.h>

#include "buf.h"

/* GnuTLS priorities of kiln-api's and kiln-host's TLS listeners: TLS 1.2
 * and 1.3 only, AEAD ciphers, ECDHE key exchange (forward secrecy). */
#define HTTPD_TLS_PRIORITIES                                                                                 \
	"SECURE128:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM:+AES-128-GCM:+CHACHA20-POLY1305:" \
	"-KX-ALL:+ECDHE-RSA:+ECDHE-ECDSA"

/* ---- request bodies ---- */

/* One request's body, collected across the access handler's calls. */
struct httpd_body {
	struct buf b;         /* b.p NULL until a byte arrived; b.max is the cap */
	int too_big;          /* a part went past the cap: answer 413 at the end */
	size_t dropped;       /* bytes thrown away since */
	size_t drop_max;      /* close the connection once dropped passes it (0: never) */
};

/* Start collecting at most max bytes; past that, drop up to drop_max more
 * bytes (0: any number) before closing the connection. */
void httpd_body_init(struct httpd_body *hb, size_t max, size_t drop_max);

/* Whether the request declares (Content-Length) a body over hb's cap: it can
 * be refused with 413 on the first call, before any of it is read (and
 * before "100 Continue"). */
int httpd_body_declared_too_big(const struct httpd_body *hb, struct MHD_Connection *conn);

/* Take one part of the upload (libmicrohttpd's upload_data, *upload_size,
 * which is set to 0). A part past the cap sets too_big and is dropped
 * (libmicrohttpd takes no reply in the middle of a body). MHD_NO (close the
 * connection) when out of memory or past drop_max. */
enum MHD_Result httpd_body_feed(struct httpd_body *hb, const char *upload, size_t *upload_size);

/* The bytes collected (NULL when none) and their count. */
static inline const char *httpd_body_data(const struct httpd_body *hb)
{
	return hb->b.p;
}

static inline size_t httpd_body_len(const struct httpd_body *hb)
{
	return hb->b.len;
}

void httpd_body_free(struct httpd_body *hb);

/* ---- routes ---- */

#define HTTPD_MAX_PARAMS 4

/* What a handler gets: the connection, the request line, the values of the
 * pattern's {name} segments in order (pointers into the path copy), the
 * body, and the server's own per-request data. */
struct httpd_req {
	struct MHD_Connection *conn;
	const char *method, *url;
	const char *param[HTTPD_MAX_PARAMS];
	size_t nparam;
	const struct httpd_body *body;
	void *app;
	char path_[512];      /* the split copy param[] points into */
};

typedef enum MHD_Result (*httpd_handler)(void *ctx, struct httpd_req *r);

/* One row: method NULL matches every method. pattern is literal segments and
 * {name} segments, each of which matches one non-empty segment; no
 * trailing-slash folding ("/v1/tasks/" is not "/v1/tasks"). */
struct httpd_route {
	const char *method;
	const char *pattern;
	httpd_handler handler;
};

struct httpd_routes {
	const struct httpd_route *rows;
	size_t n;
	const char *not_found;  /* 404 message ("no such endpoint") */
	const char *or;         /* between methods in the 405 message: ", " or " or " */
};

enum httpd_match_result { HTTPD_MATCH, HTTPD_NOT_FOUND, HTTPD_NOT_ALLOWED };

/* Match method and path against the table: HTTPD_MATCH with *row and
 * r->param[] set (the first matching row wins), HTTPD_NOT_ALLOWED with the
 * matching rows' methods in allow ("GET, POST", in table order, no
 * repeats; HEAD is only what a row says), or HTTPD_NOT_FOUND. path is
 * copied into r. Pure; any thread. */
enum httpd_match_result httpd_route_match(const struct httpd_routes *t, const char *method, const char *path,
					  struct httpd_req *r, const struct httpd_route **row, char *allow,
					  size_t allow_size);

/* Match, then call the row's handler with ctx, or answer 404 not_found
 * (t->not_found) or 405 method_not_allowed ("use GET or POST", with Allow:
 * GET, POST). r->conn, method, url, body and app are the caller's. */
enum MHD_Result httpd_dispatch(const struct httpd_routes *t, void *ctx, struct httpd_req *r);

#endif
