/* envd_http_fs: filesystem.Filesystem's unary RPCs over a session's envd
 * channel (Stat, MakeDir, Move, ListDir, Remove), and the entry JSON they
 * answer with. Every field is checked before it reaches the guest. */
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

/* ---- entries ------------------------------------------------------------------ */

/* Go's os.FileMode.String() of st_mode, which E2B's envd reports. */
static void mode_string(uint32_t m, char out[16])
{
	static const char rwx[] = "rwxrwxrwx";
	size_t n = 0;

	if (S_ISDIR(m))
		out[n++] = 'd';
	else if (S_ISLNK(m))
		out[n++] = 'L';
	else if (S_ISFIFO(m))
		out[n++] = 'p';
	else if (S_ISSOCK(m))
		out[n++] = 'S';
	else if (S_ISBLK(m))
		out[n++] = 'D';
	else if (S_ISCHR(m)) {
		out[n++] = 'D';
		out[n++] = 'c';
	}
	if (m & S_ISUID)
		out[n++] = 'u';
	if (m & S_ISGID)
		out[n++] = 'g';
	if (m & S_ISVTX)
		out[n++] = 't';
	if (!n)
		out[n++] = '-';
	for (int i = 0; i < 9; i++)
		out[n++] = (m & (1u << (8 - i))) ? rwx[i] : '-';
	out[n] = '\0';
}

static json_t *entry_json(const struct eproto_entry *en)
{
	static const char *const types[] = { NULL, "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY", "FILE_TYPE_SYMLINK", NULL };
	char perm[16], ts[64], size[24];
	struct tm tm;
	time_t t = (time_t)en->mtime_sec;
	json_t *j = json_object();

	mode_string(en->mode, perm);
	gmtime_r(&t, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	if (en->mtime_nsec && en->mtime_nsec < 1000000000u)
		snprintf(ts + strlen(ts), sizeof(ts) - strlen(ts), ".%09u", en->mtime_nsec);
	strcat(ts, "Z");
	snprintf(size, sizeof(size), "%llu", (unsigned long long)en->size);
	json_object_set_new(j, "name", json_string(en->name));
	if (en->type < 5 && types[en->type])
		json_object_set_new(j, "type", json_string(types[en->type]));
	json_object_set_new(j, "path", json_string(en->path));
	if (en->size)
		json_object_set_new(j, "size", json_string(size));
	if (en->mode & 07777)
		json_object_set_new(j, "mode", json_integer(en->mode & 07777));
	json_object_set_new(j, "permissions", json_string(perm));
	if (en->owner[0])
		json_object_set_new(j, "owner", json_string(en->owner));
	if (en->group[0])
		json_object_set_new(j, "group", json_string(en->group));
	json_object_set_new(j, "modifiedTime", json_string(ts));
	if (en->target[0])
		json_object_set_new(j, "symlinkTarget", json_string(en->target));
	if (en->meta_len) {
		json_t *md = json_object();
		const char *k, *v;
		size_t off = 0;

		/* Checked by eproto_entry_decode: printable ASCII, each key once. */
		while (eproto_meta_next(en->meta, en->meta_len, &off, &k, &v))
			json_object_set_new(md, k, json_string(v));
		json_object_set_new(j, "metadata", md);
	}
	return j;
}

/* ---- one guest request with replies ------------------------------------------- */

/* A file-system request (STAT, LISTDIR, MKDIR, MOVE, REMOVE, READ, WRITE). */
struct envd_req *envd_http_fs_begin(struct envd *ch, uint8_t type, const char *user, const char *path, const char *path2,
				 uint32_t depth, const char *meta, uint32_t meta_len, int64_t deadline,
				 struct envd_err *e)
{
	struct eproto_fsreq *q = calloc(1, sizeof(*q));
	uint8_t *buf = malloc(PROTO_MAX_PAYLOAD);
	struct envd_req *r = NULL;
	ssize_t n;

	if (!q || !buf) {
		envd_http_eset(e, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	if (!path || !*path || strlen(path) > PROTO_MAX_PATH || (path2 && (!*path2 || strlen(path2) > PROTO_MAX_PATH))) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "path: expected 1-%d bytes", PROTO_MAX_PATH);
		goto out;
	}
	snprintf(q->user, sizeof(q->user), "%s", user);
	snprintf(q->path, sizeof(q->path), "%s", path);
	if (path2)
		snprintf(q->path2, sizeof(q->path2), "%s", path2);
	q->depth = depth;
	if (meta_len > sizeof(q->meta)) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "metadata: more than %d bytes", EPROTO_MAX_META);
		goto out;
	}
	if (meta_len)
		memcpy(q->meta, meta, meta_len);
	q->meta_len = meta_len;
	n = eproto_fsreq_encode(buf, PROTO_MAX_PAYLOAD, type, q);
	if (n < 0) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "the request does not fit the guest protocol");
		goto out;
	}
	r = envd_req_begin(ch, type, buf, (size_t)n, deadline, e);
out:
	free(q);
	free(buf);
	return r;
}

/* The one ENTRY that answers STAT, MKDIR, MOVE or WEND. */
json_t *envd_http_one_entry(struct envd_req *r, int64_t deadline, struct envd_err *e)
{
	struct envd_reply rep;
	struct eproto_entry *en;
	json_t *j = NULL;
	int n = envd_req_next(r, &rep, deadline, e);

	if (n < 0)
		return NULL;
	if (n == 0 || rep.type != EP_ENTRY) {
		envd_http_eset(e, CONNECT_INTERNAL, "the sandbox's envd answered unexpectedly");
		return NULL;
	}
	en = malloc(sizeof(*en));
	if (en && eproto_entry_decode(rep.payload, rep.len, en) == 0)
		j = entry_json(en);
	else
		envd_http_eset(e, CONNECT_INTERNAL, "the sandbox's envd sent a malformed entry");
	free(en);
	return j;
}

/* Wait for DONE (REMOVE). */
static int wait_done(struct envd_req *r, int64_t deadline, struct envd_err *e)
{
	struct envd_reply rep;
	int n;

	while ((n = envd_req_next(r, &rep, deadline, e)) == 1)
		if (rep.type == EP_DONE)
			return 0;
	if (n == 0)
		return 0;
	return -1;
}

json_t *envd_http_fs_unary(struct envd *ch, const char *method, const char *user, json_t *req, int64_t deadline,
			struct envd_err *e)
{
	static const struct {
		const char *name;
		uint8_t type;
	} m[] = { { "Stat", EP_STAT }, { "ListDir", EP_LISTDIR }, { "MakeDir", EP_MKDIR }, { "Move", EP_MOVE },
		  { "Remove", EP_REMOVE } };
	uint8_t type = 0;
	const char *path, *path2 = NULL;
	uint32_t depth = 0;
	int bad = 0;
	struct envd_req *r;
	json_t *out = NULL;

	for (size_t i = 0; i < sizeof(m) / sizeof(*m); i++)
		if (!strcmp(method, m[i].name))
			type = m[i].type;
	if (!type) {
		envd_http_eset(e, CONNECT_UNIMPLEMENTED, "filesystem.Filesystem/%.40s is not supported", method);
		return NULL;
	}
	if (type == EP_MOVE) {
		path = envd_http_jstr(req, "source", PROTO_MAX_PATH, &bad);
		path2 = envd_http_jstr(req, "destination", PROTO_MAX_PATH, &bad);
	} else {
		path = envd_http_jstr(req, "path", PROTO_MAX_PATH, &bad);
	}
	if (type == EP_LISTDIR) {
		envd_http_juint(req, "depth", &depth, &bad);
		if (!depth)
			depth = 1;
		if (depth > 16)
			depth = 16;
	}
	if (bad || !path || !*path || (type == EP_MOVE && (!path2 || !*path2))) {
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, type == EP_MOVE ? "source and destination: expected paths" : "path: expected a path");
		return NULL;
	}
	r = envd_http_fs_begin(ch, type, user, path, path2, depth, NULL, 0, deadline, e);
	if (!r)
		return NULL;
	switch (type) {
	case EP_STAT:
	case EP_MKDIR:
	case EP_MOVE: {
		json_t *en = envd_http_one_entry(r, deadline, e);

		if (en)
			out = json_pack("{s:o}", "entry", en);
		break;
	}
	case EP_REMOVE:
		if (wait_done(r, deadline, e) == 0)
			out = json_object();
		break;
	default: { /* LISTDIR */
		json_t *a = json_array();
		struct eproto_entry *en = malloc(sizeof(*en));
		struct envd_reply rep;
		int n = -1;

		while (en && (n = envd_req_next(r, &rep, deadline, e)) == 1) {
			if (rep.type == EP_DONE)
				break;
			if (rep.type == EP_ENTRY && eproto_entry_decode(rep.payload, rep.len, en) == 0)
				json_array_append_new(a, entry_json(en));
		}
		free(en);
		if (n >= 0)
			out = json_pack("{s:O}", "entries", a);
		json_decref(a);
		break;
	}
	}
	envd_req_free(r);
	/* E2B: MakeDir of an existing directory is already_exists; ListDir
	 * of a file is invalid_argument. */
	if (!out && type == EP_MKDIR && e->errnum == -EEXIST)
		e->code = CONNECT_ALREADY_EXISTS;
	return out;
}
