/* serve_int: what serve.c and serve_sessions.c share: the daemon's HTTP
 * state and the session routes serve.c's route table names. Not for other
 * files: they use serve.h. */
#ifndef KILN_SERVE_INT_H
#define KILN_SERVE_INT_H

#include <pthread.h>
#include <stdint.h>

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
	pthread_mutex_t tun_lock;
	pthread_cond_t tun_cond;
	int tunnels;                  /* tunnel threads running (tunnel.c) */
	uint64_t tunnels_total;       /* tunnels opened since start */
};

struct tunnel;

/* One request's state across the access handler's calls: its body, an
 * envd upload streamed to the guest, or a port tunnel being opened (the
 * request's httpd_req.app). */
struct serve_conn {
	struct httpd_body body;
	struct envd_upload *up;
	struct tunnel *tun;
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
enum MHD_Result serve_session_network_put(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_resume_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_checkpoint_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_snapshot_del(void *ctx, struct httpd_req *r);
enum MHD_Result serve_volume_get(void *ctx, struct httpd_req *r);
enum MHD_Result serve_volume_del(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_outputs_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_envd_rpc_post(void *ctx, struct httpd_req *r);
enum MHD_Result serve_envd_files_get(void *ctx, struct httpd_req *r);
enum MHD_Result serve_envd_health_get(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_metrics_get(void *ctx, struct httpd_req *r);

/* ---- tunnel.c: port connections (ctx: the serve_http; r->app: the serve_conn) ---- */

enum MHD_Result serve_session_port_connect(void *ctx, struct httpd_req *r);
enum MHD_Result serve_session_ports_get(void *ctx, struct httpd_req *r);
/* The request ended (its completed callback): drop its hold on t (NULL: none). */
void serve_tunnel_done(struct serve_http *s, struct tunnel *t);
/* Wait until every tunnel thread ended, at most until deadline_ms. */
void serve_tunnels_wait(struct serve_http *s, int64_t deadline_ms);

#endif
