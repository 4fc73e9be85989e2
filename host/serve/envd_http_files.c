/* envd_http_files: E2B's file HTTP API over a session's envd channel:
 * GET .../envd/files (a download streamed from the guest under its window)
 * and POST .../envd/files (a multipart upload streamed to the guest as it
 * arrives, never held whole). Errors are {"code": status, "message"}. */
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

/* ---- files: E2B's HTTP API (errors {"code": status, "message"}) ------------------- */

static unsigned file_status(const struct envd_err *e)
{
	switch (e->errnum) {
	case -ENOENT:
		return 404;
	case -EISDIR:
	case -ENOTDIR:
	case -EINVAL:
	case -ENAMETOOLONG:
		return 400;
	case -EACCES:
	case -EPERM:
		return 403;
	case -ENOSPC:
	case -EDQUOT:
		return 507;
	default:
		break;
	}
	switch (e->code) {
	case CONNECT_NOT_FOUND:
		return 404;
	case CONNECT_INVALID_ARGUMENT:
		return 400;
	case CONNECT_UNAVAILABLE:
		return 502;
	default:
		return 500;
	}
}

static enum MHD_Result file_error(struct MHD_Connection *conn, const struct envd_err *e)
{
	unsigned st = file_status(e);

	return reply_json(conn, st, json_pack("{s:i, s:s}", "code", (int)st, "message", e->msg));
}

struct download {
	struct envd *ch;
	struct envd_req *req;
	uint8_t *first;       /* the first DATA's bytes, read before answering */
	size_t first_len, first_off;
	int done;
};

static ssize_t download_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct download *d = cls;
	struct envd_reply rep;
	struct envd_err e;
	size_t n;

	(void)pos;
	if (d->first_off < d->first_len) {
		n = d->first_len - d->first_off;
		if (n > max)
			n = max;
		memcpy(buf, d->first + d->first_off, n);
		d->first_off += n;
		if (d->first_off == d->first_len)
			envd_req_ack(d->req, d->first_len);
		return (ssize_t)n;
	}
	if (d->done)
		return MHD_CONTENT_READER_END_OF_STREAM;
	for (;;) {
		int k = envd_req_next(d->req, &rep, envd_http_now_ms() + UPLOAD_STALL_MS, &e);

		if (k < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (k == 0 || rep.type == EP_DONE) {
			d->done = 1;
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		if (rep.type != EP_DATA || rep.len <= 4)
			continue;
		/* Keep it whole for the next calls when it does not fit now. */
		free(d->first);
		d->first = malloc(rep.len - 4);
		if (!d->first)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		memcpy(d->first, rep.payload + 4, rep.len - 4);
		d->first_len = rep.len - 4;
		d->first_off = 0;
		return download_read(cls, pos, buf, max);
	}
}

static void download_free(void *cls)
{
	struct download *d = cls;

	envd_req_free(d->req);
	envd_unref(d->ch);
	free(d->first);
	free(d);
}

enum MHD_Result envd_http_files_get(struct session_table *ss, struct httpd_req *r)
{
	const char *path = envd_http_query(r->conn, "path"), *uname = envd_http_query(r->conn, "username");
	struct envd_err e = { 0 };
	json_t *env = NULL;
	struct download *d;
	struct envd_reply rep;
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char user[EPROTO_MAX_USER + 1] = "";
	int k;

	if (uname && *uname) {
		if (!envd_http_user_name_ok(uname)) {
			envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "username: not a valid user name");
			return file_error(r->conn, &e);
		}
		snprintf(user, sizeof(user), "%s", uname);
	} else if (envd_http_auth_user(r->conn, user) < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:)");
		return file_error(r->conn, &e);
	}
	if (!path || !*path) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "path: required");
		return file_error(r->conn, &e);
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return MHD_NO;
	d->ch = envd_http_channel(ss, r->param[0], &env, &e);
	json_decref(env);
	if (!d->ch) {
		free(d);
		return file_error(r->conn, &e);
	}
	d->req = envd_http_fs_begin(d->ch, EP_READ, user, path, NULL, 0, envd_http_now_ms() + UNARY_DEFAULT_MS, &e);
	/* The first reply decides the status: an error, or the start of the bytes. */
	k = d->req ? envd_req_next(d->req, &rep, envd_http_now_ms() + UNARY_DEFAULT_MS, &e) : -1;
	if (k < 0) {
		download_free(d);
		return file_error(r->conn, &e);
	}
	if (k == 1 && rep.type == EP_DATA && rep.len > 4) {
		d->first = malloc(rep.len - 4);
		if (!d->first) {
			download_free(d);
			return MHD_NO;
		}
		memcpy(d->first, rep.payload + 4, rep.len - 4);
		d->first_len = rep.len - 4;
	} else {
		d->done = 1; /* DONE: an empty file */
	}
	if (d->done) {
		download_free(d);
		resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
	} else {
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, download_read, d, download_free);
		if (!resp)
			download_free(d);
	}
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* ---- uploads ------------------------------------------------------------------------ */

struct envd_upload {
	struct envd *ch;
	char user[EPROTO_MAX_USER + 1];
	char *path;            /* ?path=, or NULL */
	int raw;               /* application/octet-stream */
	struct multipart *mp;
	struct envd_req *w;    /* the file being written */
	uint8_t *chunk;        /* 4 + EPROTO_MAX_CHUNK */
	size_t chunk_len;      /* bytes after the id */
	int skipping;          /* a part that is not a file */
	int failed;
	struct envd_err err;
	json_t *written;       /* [{name, type, path}] */
};

int envd_upload_match(const char *method, const char *url)
{
	const char *p;
	size_t n;

	if (strcmp(method, "POST") || strncmp(url, "/v1/sessions/", 13))
		return 0;
	p = url + 13;
	n = strcspn(p, "/");
	return n > 0 && !strcmp(p + n, "/envd/files");
}

static void up_fail(struct envd_upload *u, const struct envd_err *e)
{
	if (u->failed)
		return;
	u->failed = 1;
	u->err = *e;
	if (u->w) {
		envd_req_free(u->w); /* CANCELs the WRITE: no partial file is left */
		u->w = NULL;
	}
}

static int up_flush(struct envd_upload *u)
{
	struct envd_err e;

	if (!u->w || !u->chunk_len)
		return 0;
	if (envd_req_send(u->w, EP_WDATA, u->chunk, 4 + u->chunk_len, envd_http_now_ms() + UPLOAD_STALL_MS, &e) < 0) {
		up_fail(u, &e);
		return -1;
	}
	u->chunk_len = 0;
	return 0;
}

static int up_begin_file(struct envd_upload *u, const char *path)
{
	struct envd_err e;

	if (!path || !*path) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "no path: give ?path= or a file name in the part");
		up_fail(u, &e);
		return -EINVAL;
	}
	u->w = envd_http_fs_begin(u->ch, EP_WRITE, u->user, path, NULL, 0, envd_http_now_ms() + UNARY_DEFAULT_MS, &e);
	if (!u->w) {
		up_fail(u, &e);
		return -EIO;
	}
	u->chunk_len = 0;
	return 0;
}

static int up_data(struct envd_upload *u, const uint8_t *p, size_t n)
{
	while (n > 0 && u->w) {
		size_t k = EPROTO_MAX_CHUNK - u->chunk_len;

		if (k > n)
			k = n;
		memcpy(u->chunk + 4 + u->chunk_len, p, k);
		u->chunk_len += k;
		p += k;
		n -= k;
		if (u->chunk_len == EPROTO_MAX_CHUNK && up_flush(u) < 0)
			return -EIO;
	}
	return 0;
}

static int up_end_file(struct envd_upload *u)
{
	struct envd_err e;
	uint8_t id[4];
	json_t *en;

	if (!u->w || up_flush(u) < 0)
		return u->failed ? -EIO : 0;
	if (envd_req_send(u->w, EP_WEND, id, 4, envd_http_now_ms() + UPLOAD_STALL_MS, &e) < 0) {
		up_fail(u, &e);
		return -EIO;
	}
	en = envd_http_one_entry(u->w, envd_http_now_ms() + UPLOAD_STALL_MS, &e);
	envd_req_free(u->w);
	u->w = NULL;
	if (!en) {
		up_fail(u, &e);
		return -EIO;
	}
	json_array_append_new(u->written,
			      json_pack("{s:O, s:s, s:O}", "name", json_object_get(en, "name"), "type", "file", "path",
					json_object_get(en, "path")));
	json_decref(en);
	return 0;
}

static int mp_begin(void *cls, const char *name, const char *filename)
{
	struct envd_upload *u = cls;

	u->skipping = strcmp(name, "file") != 0;
	if (u->skipping || u->failed)
		return 0;
	return up_begin_file(u, u->path ? u->path : filename);
}

static int mp_data(void *cls, const uint8_t *p, size_t n)
{
	struct envd_upload *u = cls;

	return u->skipping || u->failed ? 0 : up_data(u, p, n);
}

static int mp_end(void *cls)
{
	struct envd_upload *u = cls;

	return u->skipping || u->failed ? 0 : up_end_file(u);
}

static const struct multipart_cb mp_cb = { mp_begin, mp_data, mp_end };

struct envd_upload *envd_upload_new(struct session_table *ss, struct MHD_Connection *conn, const char *url)
{
	struct envd_upload *u = calloc(1, sizeof(*u));
	const char *ct = envd_http_header(conn, MHD_HTTP_HEADER_CONTENT_TYPE), *path = envd_http_query(conn, "path"),
		   *uname = envd_http_query(conn, "username"), *enc = envd_http_header(conn, "Content-Encoding");
	char id[80], boundary[MULTIPART_MAX_BOUNDARY + 1];
	size_t n = strcspn(url + 13, "/");
	json_t *env = NULL;
	struct envd_err e;

	if (!u)
		return NULL;
	u->chunk = malloc(4 + EPROTO_MAX_CHUNK);
	u->written = json_array();
	if (!u->chunk || !u->written) {
		envd_upload_free(u);
		return NULL;
	}
	if (path && *path)
		u->path = strdup(path);
	if (uname && *uname) {
		if (!envd_http_user_name_ok(uname)) {
			envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "username: not a valid user name");
			up_fail(u, &e);
			return u;
		}
		snprintf(u->user, sizeof(u->user), "%s", uname);
	} else if (envd_http_auth_user(conn, u->user) < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Authorization: expected Basic base64(user:)");
		up_fail(u, &e);
		return u;
	}
	if (enc && strcasecmp(enc, "identity")) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Content-Encoding %.40s is not supported", enc);
		up_fail(u, &e);
		return u;
	}
	snprintf(id, sizeof(id), "%.*s", (int)(n < sizeof(id) ? n : sizeof(id) - 1), url + 13);
	u->ch = envd_http_channel(ss, id, &env, &e);
	json_decref(env);
	if (!u->ch) {
		up_fail(u, &e);
		return u;
	}
	if (ct && !strncasecmp(ct, "application/octet-stream", 24)) {
		u->raw = 1;
		up_begin_file(u, u->path);
	} else if (!ct || multipart_boundary(ct, boundary) < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "Content-Type: expected multipart/form-data or application/octet-stream");
		up_fail(u, &e);
	} else if (!(u->mp = multipart_new(boundary, &mp_cb, u))) {
		envd_http_eset(&e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		up_fail(u, &e);
	}
	return u;
}

enum MHD_Result envd_upload_feed(struct envd_upload *u, const char *data, size_t *size)
{
	size_t n = *size;

	*size = 0;
	if (u->failed)
		return MHD_YES; /* the rest is read and dropped; the answer says why */
	if (u->raw)
		up_data(u, (const uint8_t *)data, n);
	else if (multipart_feed(u->mp, (const uint8_t *)data, n) < 0 && !u->failed) {
		struct envd_err e;

		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "malformed multipart/form-data body");
		up_fail(u, &e);
	}
	return MHD_YES;
}

enum MHD_Result envd_upload_finish(struct envd_upload *u, struct MHD_Connection *conn)
{
	struct envd_err e;

	if (!u->failed) {
		if (u->raw)
			up_end_file(u);
		else if (multipart_finish(u->mp) < 0 && !u->failed) {
			envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "the multipart/form-data body ended early");
			up_fail(u, &e);
		}
	}
	if (!u->failed && json_array_size(u->written) == 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "no file part in the upload");
		up_fail(u, &e);
	}
	if (u->failed)
		return file_error(conn, &u->err);
	return reply_json(conn, MHD_HTTP_OK, json_incref(u->written));
}

void envd_upload_free(struct envd_upload *u)
{
	if (!u)
		return;
	envd_req_free(u->w);
	if (u->mp)
		multipart_free(u->mp);
	if (u->ch)
		envd_unref(u->ch);
	json_decref(u->written);
	free(u->chunk);
	free(u->path);
	free(u);
}
