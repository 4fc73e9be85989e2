/* envd_http_files: E2B's file HTTP API over a session's envd channel:
 * GET .../envd/files (a download streamed from the guest under its window,
 * gzip-compressed when Accept-Encoding asks) and POST .../envd/files (a
 * multipart or raw upload streamed to the guest as it arrives, never held
 * whole; a gzip body inflated on the way, bounded; X-Metadata-* headers
 * become the files' metadata). Errors are {"code": status, "message"}. */
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
#include "gz.h"
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
	case -EFBIG:
		return 413;
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
	uint8_t *first;       /* the latest DATA's bytes not yet answered */
	size_t first_len, first_off;
	int done;
	int gzip;             /* the answer is gzip-compressed (Accept-Encoding) */
	struct gz_out gz;
};

/* The next DATA into d->first (d->done at the guest's DONE): 0, or -1
 * when the transfer broke. */
static int download_next(struct download *d)
{
	struct envd_reply rep;
	struct envd_err e;

	for (;;) {
		int k = envd_req_next(d->req, &rep, envd_http_now_ms() + UPLOAD_STALL_MS, &e);

		if (k < 0)
			return -1;
		if (k == 0 || rep.type == EP_DONE) {
			d->done = 1;
			return 0;
		}
		if (rep.type != EP_DATA || rep.len <= 4)
			continue;
		free(d->first);
		d->first = malloc(rep.len - 4);
		if (!d->first)
			return -1;
		memcpy(d->first, rep.payload + 4, rep.len - 4);
		d->first_len = rep.len - 4;
		d->first_off = 0;
		return 0;
	}
}

/* The answer compressed: the guest's bytes through deflate, each DATA
 * acknowledged once deflate has taken all of it. */
static ssize_t download_read_gzip(struct download *d, char *buf, size_t max)
{
	for (;;) {
		size_t used = 0;
		ssize_t n;

		if (d->first_off < d->first_len) {
			n = gz_out_step(&d->gz, d->first + d->first_off, d->first_len - d->first_off, &used, 0,
					(uint8_t *)buf, max);
			if (n < 0)
				return MHD_CONTENT_READER_END_WITH_ERROR;
			d->first_off += used;
			if (d->first_off == d->first_len)
				envd_req_ack(d->req, d->first_len);
			if (n > 0)
				return n;
			continue;
		}
		if (!d->done) {
			if (download_next(d) < 0)
				return MHD_CONTENT_READER_END_WITH_ERROR;
			continue;
		}
		if (gz_out_ended(&d->gz))
			return MHD_CONTENT_READER_END_OF_STREAM;
		n = gz_out_step(&d->gz, NULL, 0, &used, 1, (uint8_t *)buf, max);
		if (n < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (n > 0)
			return n;
	}
}

static ssize_t download_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct download *d = cls;
	struct envd_reply rep;
	struct envd_err e;
	size_t n;

	(void)pos;
	if (d->gzip)
		return download_read_gzip(d, buf, max);
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
	gz_out_free(&d->gz);
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
	int k, gzip = gz_accept(envd_http_header(r->conn, "Accept-Encoding"));

	if (gzip < 0) {
		/* E2B's envd: identity refused and gzip not acceptable either. */
		return reply_json(r->conn, MHD_HTTP_NOT_ACCEPTABLE,
				  json_pack("{s:i, s:s}", "code", MHD_HTTP_NOT_ACCEPTABLE, "message",
					    "no acceptable encoding in Accept-Encoding: supported: gzip, identity"));
	}
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
	if (gzip && gz_out_init(&d->gz) < 0) {
		free(d);
		return MHD_NO;
	}
	d->gzip = gzip;
	d->ch = envd_http_channel(ss, r->param[0], &env, &e);
	json_decref(env);
	if (!d->ch) {
		gz_out_free(&d->gz);
		free(d);
		return file_error(r->conn, &e);
	}
	d->req = envd_http_fs_begin(d->ch, EP_READ, user, path, NULL, 0, NULL, 0, envd_http_now_ms() + UNARY_DEFAULT_MS,
				    &e);
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
	if (d->done && !d->gzip) {
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
	/* As E2B's envd: the answer varies with Accept-Encoding. */
	MHD_add_response_header(resp, "Vary", "Accept-Encoding");
	if (gzip)
		MHD_add_response_header(resp, "Content-Encoding", "gzip");
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
	json_t *written;       /* [{name, type, path, metadata?}] */
	json_t *asked;         /* the paths the parts named, as sent */
	int gzip;              /* Content-Encoding: gzip */
	struct gz_in gz;
	uint64_t max_body;     /* the most bytes a gzip body may inflate to */
	uint32_t meta_len;     /* X-Metadata-*: every file's metadata (lib/eproto.h) */
	char meta[EPROTO_MAX_META];
};

/* Without Kiln-Max-Body-Bytes (kiln-api sends its max_body_mib): kiln-api's
 * default limit. */
#define UPLOAD_DEFAULT_MAX_BODY (64ull << 20)

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

static int up_dup(struct envd_upload *u, const char *path)
{
	struct envd_err e;

	envd_http_eset(&e, CONNECT_INVALID_ARGUMENT,
		       "you cannot upload multiple files to the same path '%.300s' in one upload request, only the first "
		       "specified file was uploaded",
		       path);
	up_fail(u, &e);
	return -EINVAL;
}

static int up_begin_file(struct envd_upload *u, const char *path)
{
	struct envd_err e;

	size_t i;
	json_t *p;

	if (!path || !*path) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "no path: give ?path= or a file name in the part");
		up_fail(u, &e);
		return -EINVAL;
	}
	/* As E2B's envd: one upload writes a path once (?path= with several
	 * parts names one path for all); the first part's file stays. */
	json_array_foreach(u->asked, i, p)
		if (!strcmp(json_string_value(p), path))
			return up_dup(u, path);
	json_array_append_new(u->asked, json_string(path));
	u->w = envd_http_fs_begin(u->ch, EP_WRITE, u->user, path, NULL, 0, u->meta, u->meta_len,
				  envd_http_now_ms() + UNARY_DEFAULT_MS, &e);
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
	{
		json_t *one = json_pack("{s:O, s:s, s:O}", "name", json_object_get(en, "name"), "type", "file", "path",
					json_object_get(en, "path")),
		       *md = json_object_get(en, "metadata"), *prev;
		const char *at = json_string_value(json_object_get(en, "path"));
		size_t i;

		/* Two names for one file ("a" and "/home/user/a"): refused as
		 * E2B's envd refuses them, though the second is written by now. */
		json_array_foreach(u->written, i, prev)
			if (at && !strcmp(json_string_value(json_object_get(prev, "path")), at)) {
				json_decref(one);
				json_decref(en);
				return up_dup(u, at);
			}
		if (md)
			json_object_set(one, "metadata", md);
		json_array_append_new(u->written, one);
	}
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

/* The body's bytes (inflated when it is gzip) into the raw file or the
 * multipart parser. */
static int up_body(void *cls, const uint8_t *p, size_t n)
{
	struct envd_upload *u = cls;

	if (u->failed)
		return -EIO;
	if (u->raw)
		return up_data(u, p, n);
	if (multipart_feed(u->mp, p, n) < 0) {
		struct envd_err e;

		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "malformed multipart/form-data body");
		up_fail(u, &e);
		return -EPROTO;
	}
	return 0;
}

/* One X-Metadata-KEY header: KEY (lowercased, as E2B's envd) and its value
 * join the upload's metadata; the first of a repeated one counts. */
static enum MHD_Result up_meta_header(void *cls, enum MHD_ValueKind kind, const char *name, const char *value)
{
	struct envd_upload *u = cls;
	char key[EPROTO_MAX_META_KEY + 2];
	size_t kl, off = 0;
	const char *k, *v;
	struct envd_err e;
	int r;

	(void)kind;
	if (u->failed || strncasecmp(name, "X-Metadata-", 11) || !name[11])
		return MHD_YES; /* not one, or an empty key (dropped, as E2B's envd) */
	kl = strlen(name + 11);
	if (kl > EPROTO_MAX_META_KEY) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "invalid metadata: a key is longer than %d bytes",
			       EPROTO_MAX_META_KEY);
		up_fail(u, &e);
		return MHD_NO;
	}
	for (size_t i = 0; i < kl; i++)
		key[i] = (char)tolower((unsigned char)name[11 + i]);
	key[kl] = '\0';
	while (eproto_meta_next(u->meta, u->meta_len, &off, &k, &v))
		if (!strcmp(k, key))
			return MHD_YES;
	r = eproto_meta_add(u->meta, &u->meta_len, key, kl, value ? value : "", value ? strlen(value) : 0);
	if (r < 0) {
		if (r == -E2BIG)
			envd_http_eset(&e, CONNECT_INVALID_ARGUMENT,
				       "invalid metadata: more than %d bytes in all (%s + key + value, summed)", EPROTO_MAX_META,
				       EPROTO_META_XATTR);
		else
			envd_http_eset(&e, CONNECT_INVALID_ARGUMENT,
				       "invalid metadata: key %.64s: keys and values are printable US-ASCII", key);
		up_fail(u, &e);
		return MHD_NO;
	}
	return MHD_YES;
}

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
	u->asked = json_array();
	if (!u->chunk || !u->written || !u->asked) {
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
	u->gzip = gz_content_encoding(enc);
	if (u->gzip < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "unsupported Content-Encoding: %.40s, supported: gzip", enc);
		up_fail(u, &e);
		return u;
	}
	{
		const char *mb = envd_http_header(conn, "Kiln-Max-Body-Bytes");
		char *end = NULL;
		unsigned long long v = mb ? strtoull(mb, &end, 10) : 0;

		u->max_body = mb && end != mb && !*end && v > 0 && v <= (1ull << 40) ? v : UPLOAD_DEFAULT_MAX_BODY;
	}
	if (u->gzip && gz_in_init(&u->gz, u->max_body) < 0) {
		envd_http_eset(&e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		up_fail(u, &e);
		return u;
	}
	MHD_get_connection_values(conn, MHD_HEADER_KIND, up_meta_header, u);
	if (u->failed)
		return u;
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
	if (u->gzip) {
		int r = gz_in_feed(&u->gz, (const uint8_t *)data, n, up_body, u);

		if (r < 0 && !u->failed) {
			struct envd_err e;

			if (r == -EFBIG) {
				envd_http_eset(&e, CONNECT_RESOURCE_EXHAUSTED,
					       "the request body is larger than %llu MiB once decompressed",
					       (unsigned long long)(u->max_body >> 20));
				e.errnum = -EFBIG;
			} else {
				envd_http_eset(&e, CONNECT_INVALID_ARGUMENT,
					       "error decompressing request body: not gzip data");
			}
			up_fail(u, &e);
		}
	} else {
		up_body(u, (const uint8_t *)data, n);
	}
	return MHD_YES;
}

enum MHD_Result envd_upload_finish(struct envd_upload *u, struct MHD_Connection *conn)
{
	struct envd_err e;

	if (!u->failed && u->gzip && gz_in_finish(&u->gz) < 0) {
		envd_http_eset(&e, CONNECT_INVALID_ARGUMENT, "error decompressing request body: the gzip data ended early");
		up_fail(u, &e);
	}
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
	json_decref(u->asked);
	gz_in_free(&u->gz);
	free(u->chunk);
	free(u->path);
	free(u);
}
