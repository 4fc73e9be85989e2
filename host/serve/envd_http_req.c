/* envd_http_req: what every envd RPC family shares (envd_http.c has the
 * protocol's story): checked request fields (headers, query, the user from
 * Authorization, JSON fields of bounded length), the Connect request
 * message, the session's envd channel and Connect's unary error. Calls no
 * other envd_http file. */
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

/* ---- small helpers ---------------------------------------------------------- */

int64_t envd_http_now_ms(void)
{
	return proto_now_ms();
}

const char *envd_http_header(struct MHD_Connection *c, const char *name)
{
	return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

const char *envd_http_query(struct MHD_Connection *c, const char *name)
{
	return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

void envd_http_eset(struct envd_err *e, enum connect_code c, const char *fmt, ...)
{
	va_list ap;

	e->code = c;
	e->errnum = 0;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
}

/* A unary Connect error: the code's status, {"code","message"}. */
enum MHD_Result envd_http_unary_error(struct MHD_Connection *conn, const struct envd_err *e)
{
	return reply_json(conn, connect_code_status(e->code), connect_error_json(e->code, e->msg));
}

static enum connect_code code_from_kiln(const struct kiln_err *k)
{
	switch (k->errc) {
	case KERR_NOT_FOUND:
		return CONNECT_NOT_FOUND;
	case KERR_UNAVAILABLE:
		return CONNECT_UNAVAILABLE;
	default:
		return CONNECT_INTERNAL;
	}
}

/* The E2B user: E2b-Authorization (kiln-api relays the SDK's Authorization
 * under it) or Authorization, "Basic base64(NAME:)"; "" (the default user)
 * when neither carries one. -1 for a malformed one. */
int envd_http_auth_user(struct MHD_Connection *conn, char user[EPROTO_MAX_USER + 1])
{
	const char *h = envd_http_header(conn, "E2b-Authorization");
	uint8_t *dec = NULL;
	size_t n = 0, i;

	user[0] = '\0';
	if (!h) {
		h = envd_http_header(conn, MHD_HTTP_HEADER_AUTHORIZATION);
		if (!h || strncasecmp(h, "Basic ", 6))
			return 0;
	}
	if (strncasecmp(h, "Basic ", 6))
		return -1;
	if (connect_b64_decode(h + 6, 256, &dec, &n) < 0)
		return -1;
	for (i = 0; i < n && dec[i] != ':'; i++)
		;
	if (i > EPROTO_MAX_USER) {
		free(dec);
		return -1;
	}
	memcpy(user, dec, i);
	user[i] = '\0';
	free(dec);
	for (i = 0; user[i]; i++)
		if (!(isalnum((unsigned char)user[i]) || user[i] == '.' || user[i] == '_' || user[i] == '-'))
			return -1;
	return user[0] == '-' ? -1 : 0;
}

int envd_http_user_name_ok(const char *u)
{
	size_t n = strlen(u);

	if (n > EPROTO_MAX_USER || u[0] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!(isalnum((unsigned char)u[i]) || u[i] == '.' || u[i] == '_' || u[i] == '-'))
			return 0;
	return 1;
}

/* A JSON string field: NULL when absent; *bad when present but not a
 * string, holding a NUL, or longer than max. */
const char *envd_http_jstr(json_t *o, const char *k, size_t max, int *bad)
{
	json_t *v = json_object_get(o, k);

	if (!v || json_is_null(v))
		return NULL;
	if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
	    json_string_length(v) > max) {
		*bad = 1;
		return NULL;
	}
	return json_string_value(v);
}

/* A uint32 field given as a number or a numeric string. */
int envd_http_juint(json_t *o, const char *k, uint32_t *out, int *bad)
{
	json_t *v = json_object_get(o, k);
	char *end;
	unsigned long long x;

	if (!v || json_is_null(v))
		return 0;
	if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 0xffffffffll) {
		*out = (uint32_t)json_integer_value(v);
		return 1;
	}
	if (json_is_string(v) && isdigit((unsigned char)json_string_value(v)[0])) {
		errno = 0;
		x = strtoull(json_string_value(v), &end, 10);
		if (!*end && !errno && x <= 0xffffffffull) {
			*out = (uint32_t)x;
			return 1;
		}
	}
	*bad = 1;
	return 0;
}

/* ---- the request message ---------------------------------------------------- */

/* The request's one message: the JSON body of a unary call, or the single
 * envelope of a server-stream call (its Content-Type was checked by
 * envd_http_rpc). NULL with e set. */
json_t *envd_http_request_json(struct httpd_req *r, int stream, struct envd_err *e)
{
	const uint8_t *body = (const uint8_t *)httpd_body_data(r->body), *msg;
	size_t len = httpd_body_len(r->body), mlen;
	json_error_t je;
	json_t *j;

	if (!body)
		body = (const uint8_t *)"";
	if (stream) {
		uint8_t flags;
		ssize_t n;

		n = connect_env_parse(body, len, MAX_MSG, &flags, &msg, &mlen);
		if (n <= 0 || (size_t)n != len || (flags & CONNECT_FLAG_COMPRESSED) || (flags & CONNECT_FLAG_END)) {
			envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "the request is not one uncompressed Connect envelope");
			return NULL;
		}
	} else {
		msg = body;
		mlen = len;
	}
	j = json_loadb((const char *)msg, mlen, JSON_REJECT_DUPLICATES, &je);
	if (!mlen && !j)
		j = json_object();
	if (!j || !json_is_object(j)) {
		json_decref(j);
		envd_http_eset(e, CONNECT_INVALID_ARGUMENT, "the request message is not a JSON object");
		return NULL;
	}
	return j;
}

/* The session's envd_http_channel, or NULL with e set. */
struct envd *envd_http_channel(struct session_table *ss, const char *id, json_t **env, struct envd_err *e)
{
	struct kiln_err k = { .code = "" };
	struct envd *ch;

	if (strlen(id) >= 80) {
		envd_http_eset(e, CONNECT_NOT_FOUND, "no such sandbox");
		return NULL;
	}
	ch = session_envd(ss, id, env, &k);
	if (!ch)
		envd_http_eset(e, code_from_kiln(&k), "%s", k.message);
	return ch;
}
