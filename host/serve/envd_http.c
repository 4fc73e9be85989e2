/* envd_http: the E2B-compatible envd endpoints of kiln-host (see
 * envd_http.h): the RPC dispatch, health and metrics. The families:
 * envd_http_proc.c (process.Process), envd_http_fs.c
 * (filesystem.Filesystem), envd_http_watch.c (its directory watching),
 * envd_http_files.c (downloads and multipart uploads); what they all share
 * (checked request fields, the Connect request message, the session's
 * channel) is envd_http_req.c.
 *
 * Connect's JSON codec as @connectrpc/connect 2.x expects it: unary calls
 * answer application/json (errors: the code's HTTP status and
 * {"code","message"}); server streams answer 200 application/connect+json
 * with 5-byte envelopes, the last one the end-of-stream message (flag 0x02,
 * {} or {"error":{...}}). Protobuf JSON: lowerCamelCase names, int64 as
 * strings, bytes as base64, enums as names, default values left out.
 *
 * Every request body and query comes from a client: each field is checked
 * (type, length, characters) before it reaches the guest, whose answers are
 * decoded by lib/eproto's checked decoders (envd.c). */
#include "envd_http_int.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "buf.h"
#include "connect_call.h"
#include "connectrpc.h"
#include "envd/envd.h"
#include "eproto.h"
#include "multipart.h"
#include "proto.h"
#include "reply.h"
#include "session/session.h"

enum MHD_Result envd_http_rpc(struct session_table *ss, struct httpd_req *r)
{
	const char *svc = r->param[1], *method = r->param[2];
	struct envd_err e = { 0 };
	int64_t to, deadline;
	json_t *req, *env = NULL, *out = NULL;
	struct envd *ch;
	char user[EPROTO_MAX_USER + 1];

	/* The method's kind from the table kiln-api's relay decides by too
	 * (lib/connect_call.c), and the Content-Type Connect's JSON codec gives
	 * it; anything else is refused before the body is looked at. */
	enum connect_kind kind = connect_call_kind(svc, method);

	if (kind == CONNECT_KIND_NONE) {
		envd_http_eset(&e, CONNECT_UNIMPLEMENTED, "no method %.60s/%.40s", svc, method);
		return envd_http_unary_error(r->conn, &e);
	}
	if (connect_call_check_media(kind, envd_http_header(r->conn, MHD_HTTP_HEADER_CONTENT_TYPE), e.msg, sizeof(e.msg)) < 0) {
		e.code = CONNECT_UNIMPLEMENTED;
		return reply_json(r->conn, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, connect_error_json(e.code, e.msg));
	}
	if (kind == CONNECT_KIND_SERVER_STREAM && !strcmp(svc, "process.Process"))
		return envd_http_process_stream(ss, r, method);
	if (kind == CONNECT_KIND_SERVER_STREAM && !strcmp(svc, "filesystem.Filesystem") && !strcmp(method, "WatchDir"))
		return envd_http_watch_stream(ss, r);
	/* Any other streaming call (StreamInput): Connect's clients
	 * read a streaming call's error from its end-of-stream message, not
	 * from an HTTP status, so the answer is a stream that ends at once. */
	if (connect_kind_streams(kind)) {
		envd_http_eset(&e, CONNECT_UNIMPLEMENTED, "%.60s/%.40s is not supported by kiln", svc, method);
		return envd_http_stream_error(r->conn, &e);
	}
	to = connect_timeout_ms(envd_http_header(r->conn, "Connect-Timeout-Ms"));
	if (to < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Connect-Timeout-Ms: expected 1-10 digits");
		return envd_http_unary_error(r->conn, &e);
	}
	deadline = envd_http_now_ms() + (to ? to : UNARY_DEFAULT_MS);
	req = envd_http_request_json(r, 0, &e);
	if (!req)
		return envd_http_unary_error(r->conn, &e);
	if (envd_http_auth_user(r->conn, user) < 0) {
		json_decref(req);
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:) with a valid user name");
		return envd_http_unary_error(r->conn, &e);
	}
	ch = envd_http_channel(ss, r->param[0], &env, &e);
	if (ch) {
		if (!strcmp(svc, "process.Process"))
			out = envd_http_process_unary(ch, method, req, deadline, &e);
		else if (envd_http_watch_method(method))
			out = envd_http_watch_unary(ch, method, user, req, deadline, &e);
		else
			out = envd_http_fs_unary(ch, method, user, req, deadline, &e);
		envd_unref(ch);
	}
	json_decref(req);
	json_decref(env);
	return out ? reply_json(r->conn, MHD_HTTP_OK, out) : envd_http_unary_error(r->conn, &e);
}

/* ---- health and metrics ---------------------------------------------------------- */

enum MHD_Result envd_http_health(struct session_table *ss, struct httpd_req *r)
{
	struct envd_err e = { 0 };
	json_t *env = NULL;
	struct envd *ch = envd_http_channel(ss, r->param[0], &env, &e);
	uint32_t found;
	int ok;

	json_decref(env);
	if (!ch)
		return reply_json(r->conn, e.code == CONNECT_NOT_FOUND ? 404 : 502,
				  json_pack("{s:i, s:s}", "code", e.code == CONNECT_NOT_FOUND ? 404 : 502, "message", e.msg));
	ok = envd_http_proc_list(ch, NULL, 0, NULL, &found, envd_http_now_ms() + ENVD_HELLO_MS + 1000, &e) == 0;
	envd_unref(ch);
	if (!ok)
		return reply_json(r->conn, 502, json_pack("{s:i, s:s}", "code", 502, "message", e.msg));
	return reply_bytes(r->conn, MHD_HTTP_NO_CONTENT, NULL, 0, NULL);
}

/* A ?start= or ?end= of unix seconds (digits): 1 with *ms, 0 absent, -1 bad. */
static int query_seconds(struct MHD_Connection *conn, const char *name, int64_t *ms)
{
	const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);

	if (!v)
		return 0;
	if (!v[0] || strlen(v) > 12 || strspn(v, "0123456789") != strlen(v))
		return -1;
	*ms = strtoll(v, NULL, 10) * 1000;
	return 1;
}

enum MHD_Result envd_http_metrics(struct session_table *ss, struct httpd_req *r)
{
	struct kiln_err err = { .code = "" };
	int64_t start = 0, end = INT64_MAX / 2;
	int hs = query_seconds(r->conn, "start", &start), he = query_seconds(r->conn, "end", &end);
	json_t *m;

	if (hs < 0 || he < 0)
		return reply_error(r->conn, KERR_INVALID_REQUEST, "start, end: unix seconds");
	if (hs || he) {
		/* end is a whole second: samples within it count. */
		m = strlen(r->param[0]) < 80 ? session_metrics_range(ss, r->param[0], start, he ? end + 999 : end, &err)
					    : NULL;
	} else {
		m = strlen(r->param[0]) < 80 ? session_metrics(ss, r->param[0], &err) : NULL;
	}

	if (!m && !err.code[0])
		kiln_err_set(&err, KERR_NOT_FOUND, "no such session on this host");
	return m ? reply_json(r->conn, MHD_HTTP_OK, m) : reply_err(r->conn, &err);
}
