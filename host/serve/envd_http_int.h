/* envd_http_int: what envd_http's files share (envd_http_req.c: checked
 * request fields, the Connect request message, the channel; envd_http_fs.c,
 * envd_http_proc.c, envd_http_files.c, envd_http_watch.c: the RPC families; envd_http.c: the
 * dispatch over them).
 * Not for other files: serve.c uses envd_http.h. */
#ifndef KILN_ENVD_HTTP_INT_H
#define KILN_ENVD_HTTP_INT_H

#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#include "connectrpc.h"
#include "envd/envd.h"
#include "envd_http.h"
#include "eproto.h"
#include "httpd.h"

#define UNARY_DEFAULT_MS   60000   /* a unary call without Connect-Timeout-Ms */
#define STREAM_KEEPALIVE_S 50      /* without Keepalive-Ping-Interval */
#define UPLOAD_STALL_MS    120000  /* the guest takes no upload bytes for this long */
#define STREAM_BLOCK       (256u << 10)
#define MAX_MSG            (4u << 20) /* a Connect request message */

struct session_table;

/* ---- envd_http_req.c (calls no other envd_http file) ---- */

int64_t envd_http_now_ms(void);
enum MHD_Result envd_http_unary_error(struct MHD_Connection *conn, const struct envd_err *e);
const char *envd_http_header(struct MHD_Connection *c, const char *name);
const char *envd_http_query(struct MHD_Connection *c, const char *name);
void envd_http_eset(struct envd_err *e, enum connect_code c, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int envd_http_auth_user(struct MHD_Connection *conn, char user[EPROTO_MAX_USER + 1]);
int envd_http_user_name_ok(const char *u);
const char *envd_http_jstr(json_t *o, const char *k, size_t max, int *bad);
int envd_http_juint(json_t *o, const char *k, uint32_t *out, int *bad);
json_t *envd_http_request_json(struct httpd_req *r, int stream, struct envd_err *e);
struct envd *envd_http_channel(struct session_table *ss, const char *id, json_t **env, struct envd_err *e);

/* ---- envd_http_fs.c: filesystem.Filesystem (and one guest request with
 * replies, which downloads and uploads use too) ---- */

/* meta, meta_len: a WRITE's metadata pairs (lib/eproto.h), else NULL, 0. */
struct envd_req *envd_http_fs_begin(struct envd *ch, uint8_t type, const char *user, const char *path, const char *path2,
				 uint32_t depth, const char *meta, uint32_t meta_len, int64_t deadline,
				 struct envd_err *e);
json_t *envd_http_one_entry(struct envd_req *r, int64_t deadline, struct envd_err *e);
json_t *envd_http_fs_unary(struct envd *ch, const char *method, const char *user, json_t *req, int64_t deadline,
			   struct envd_err *e);

/* ---- envd_http_proc.c: process.Process ---- */

int envd_http_proc_list(struct envd *ch, json_t *processes, uint32_t want_pid, const char *want_tag, uint32_t *found,
		     int64_t deadline, struct envd_err *e);
json_t *envd_http_process_unary(struct envd *ch, const char *method, json_t *req, int64_t deadline, struct envd_err *e);
enum MHD_Result envd_http_stream_error(struct MHD_Connection *conn, const struct envd_err *e);
enum MHD_Result envd_http_process_stream(struct session_table *ss, struct httpd_req *r, const char *method);

/* ---- envd_http_watch.c: WatchDir and the polling watchers ---- */

enum MHD_Result envd_http_watch_stream(struct session_table *ss, struct httpd_req *r);
/* CreateWatcher, GetWatcherEvents, RemoveWatcher. */
int envd_http_watch_method(const char *method);
json_t *envd_http_watch_unary(struct envd *ch, const char *method, const char *user, json_t *req, int64_t deadline,
			      struct envd_err *e);

#endif
