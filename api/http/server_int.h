/* server_int.h: what kiln-api's HTTP layer's files share: server.c
 * (authentication, dispatch, the route table, health and metrics, start and
 * stop), server_tasks.c (the task and usage routes) and server_admin.c (the
 * destination, admin and host routes): struct server and the routes the
 * table in server.c names. Not for other rooms. */
#ifndef KILN_API_SERVER_INT_H
#define KILN_API_SERVER_INT_H

#include <pthread.h>

#include <microhttpd.h>
#include <openssl/sha.h>

#include "httpd.h"
#include "server.h"

#define ADMIN_BODY_MAX (64u << 10)

struct server {
	const struct api_config *cfg;
	struct store *st;
	struct quota_limiter *lim;
	struct MHD_Daemon *d;
	size_t max_body;
	unsigned char admin_hash[SHA256_DIGEST_LENGTH], token_hash[SHA256_DIGEST_LENGTH];
	int have_admin, have_token;
	pthread_mutex_t hooks_lock;
	struct server_hooks hooks;
	struct sessions *sessions;   /* under hooks_lock */
	struct templates *templates; /* under hooks_lock */
	struct events *ev;           /* the event hub (events.h) */
	unsigned char art_key[32];   /* signs inline artifacts' URLs (artifacts.h) */
	int have_art_key;
	const char *ui_dir;          /* the web console's files (ui.h); NULL: none */
	char ui_dir_buf[4200];
	char base_url[300];          /* the links kiln-api signs start here (base_url_set) */
};

struct caller {
	char customer[65]; /* "" for the admin */
	int admin;
};

/* ---- the routes (ctx: the struct server; r->app: the struct caller) ---- */

/* server_tasks.c: /v1/tasks..., /v1/usage */
enum MHD_Result server_rt_list(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_submit(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_task_get(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_task_events(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_task_cancel(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_task_artifact(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_usage(void *ctx, struct httpd_req *r);

/* server_admin.c: /v1/destination..., /v1/admin/..., /v1/hosts/{id}/heartbeat */
enum MHD_Result server_rt_dest(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_dest_test(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_admin_dest(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_admin_dest_test(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_customer_create(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_customer_list(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_customer_get(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_customer_keys(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_customer_quotas(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_customer_key(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_key_revoke(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_hosts(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_host_heartbeat(void *ctx, struct httpd_req *r);

#endif
