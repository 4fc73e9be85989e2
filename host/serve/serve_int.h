/* serve_int: what serve.c and serve_sessions.c share: the daemon's HTTP
 * state and the session routes serve.c's route table names. Not for other
 * files: they use serve.h. */
#ifndef KILN_SERVE_INT_H
#define KILN_SERVE_INT_H

#include <microhttpd.h>
#include <openssl/sha.h>

#include "httpd.h"
#include "serve.h"

/* A request body (a task spec, a session call) is at most this long. */
#define BODY_MAX (SPEC_MAX_JSON + 4096)

struct serve_http {
	struct MHD_Daemon *d;
	const char *host_id;
	const struct run_opts *ro;
	struct hostd *hostd;
	struct session_table *sessions;
	struct template_builds *builds;
	unsigned char token_hash[SHA256_DIGEST_LENGTH];
};

/* ---- serve_sessions.c: the session and envd routes (ctx: the serve_http) ---- */

enum MHD_Result serve_sessions_get_list(void *ctx, struct httpd_req *r);
enum MHD_Result serve_sessions_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_get_one(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_del(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_pcache_del(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_files(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_exec_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_input_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_pause_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_resume_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_outputs_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_envd_rpc_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_envd_files_get(void *ctx, struct httpd_req *r);
enum MHD_Result serve_envd_health_get(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_metrics_get(void *ctx, struct httpd_req *r);

#endif
