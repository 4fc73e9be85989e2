/* envd_http: kiln-host's E2B-compatible envd endpoints (docs/e2b.md,
 * "kiln-host: /v1/sessions/{id}/envd/..."): Connect (JSON) RPCs of
 * process.Process and filesystem.Filesystem, file downloads and streamed
 * uploads, health, and the session's metrics, over the session's envd
 * channel (envd.h). Called on libmicrohttpd's connection threads (serve.c),
 * each of which may block. */
#ifndef KILN_ENVD_HTTP_H
#define KILN_ENVD_HTTP_H

#include <stddef.h>

#include <microhttpd.h>

#include "httpd.h"

struct session_table;

/* POST /v1/sessions/{id}/envd/{service}/{method} (r->param[0..2]). */
enum MHD_Result envd_http_rpc(struct session_table *ss, struct httpd_req *r);
/* GET /v1/sessions/{id}/envd/files?path=P&username=U */
enum MHD_Result envd_http_files_get(struct session_table *ss, struct httpd_req *r);
/* GET /v1/sessions/{id}/envd/health */
enum MHD_Result envd_http_health(struct session_table *ss, struct httpd_req *r);
/* GET /v1/sessions/{id}/metrics */
enum MHD_Result envd_http_metrics(struct session_table *ss, struct httpd_req *r);

/* POST /v1/sessions/{id}/envd/files: the body is streamed to the guest as
 * it arrives (never held whole), so serve.c hands it here instead of
 * collecting it. */
struct envd_upload;
/* Whether method and url are an upload. */
int envd_upload_match(const char *method, const char *url);
/* On the request's first call (headers and query known). NULL on ENOMEM. */
struct envd_upload *envd_upload_new(struct session_table *ss, struct MHD_Connection *conn, const char *url);
/* Each piece of the body (*size set to 0). MHD_NO closes the connection. */
enum MHD_Result envd_upload_feed(struct envd_upload *u, const char *data, size_t *size);
/* The body ended: answer. */
enum MHD_Result envd_upload_finish(struct envd_upload *u, struct MHD_Connection *conn);
void envd_upload_free(struct envd_upload *u);

#endif
