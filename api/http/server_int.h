/* server_int.h: what kiln-api's HTTP layer's files share: server.c
 * (authentication, dispatch, the route table, health and metrics, start and
 * stop), server_tasks.c (the task and usage routes), server_admin.c (the
 * destination, admin and host routes) and server_usage.c (usage history): struct server and the routes the
 * table in server.c names. Not for other rooms. */
#ifndef KILN_API_SERVER_INT_H
#define KILN_API_SERVER_INT_H

#include <netinet/in.h>
#include <pthread.h>

#include <microhttpd.h>
#include <openssl/sha.h>

#include "httpd.h"
#include "server.h"

#define ADMIN_BODY_MAX (64u << 10)
#define TLS_OLD_MAX 8              /* quiesced TLS daemons kept serving after reloads */

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
	/* The TLS listener (tls.c): the daemon taking new connections, and
	 * those a reload quiesced (serving the connections they had). */
	pthread_mutex_t tls_lock;
	struct MHD_Daemon *tls_d;
	int tls_lfd;                 /* the TLS listening socket every daemon accepts on (a dup each) */
	struct tls_old {
		struct MHD_Daemon *d;
		char *cert, *key;
	} tls_old[TLS_OLD_MAX];
	char *tls_cert, *tls_key;    /* the PEM text tls_d was started with */
};

/* server.c: libmicrohttpd's callbacks, shared by both listeners. */
enum MHD_Result server_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			     const char *version, const char *upload, size_t *upload_size, void **con_cls);
void server_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe);
void *server_uri_log(void *cls, const char *uri, struct MHD_Connection *conn);
/* "ADDR:PORT" (IPv4) into sa: 0 or -1. */
int server_parse_listen(const char *arg, struct sockaddr_in *sa);

/* tls.c: the PEM file path (tls.WHAT) read into a new string (caller frees),
 * or NULL with err set when it cannot be read or holds no PEM block. */
char *tls_read_pem(const char *path, const char *what, struct kiln_err *err);
/* tls.c: the TLS listener (cfg->tls_listen): started by server_start,
 * reloaded by server_reload (SIGHUP), stopped by server_stop. */
int server_tls_start(struct server *s, struct kiln_err *err);
void server_tls_stop(struct server *s);

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
enum MHD_Result server_rt_task_output(void *ctx, struct httpd_req *r);
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
enum MHD_Result server_rt_host_drain(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_host_undrain(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_host_heartbeat(void *ctx, struct httpd_req *r);

/* server_usage.c: /v1/usage/history, /v1/admin/customers/{id}/usage/history */
enum MHD_Result server_rt_usage_history(void *ctx, struct httpd_req *r);
enum MHD_Result server_rt_admin_usage_history(void *ctx, struct httpd_req *r);

#endif
