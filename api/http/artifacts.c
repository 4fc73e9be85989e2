/* artifacts: small logs carried inside manifest.json, served and signed by
 * kiln-api (see artifacts.h). */
#include "artifacts.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "connectrpc.h"
#include "reply.h"

#define KEY_LABEL "kiln artifact url v1"

void artifacts_key(const char *secret, unsigned char key[32])
{
	unsigned int n = 32;

	HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)KEY_LABEL, strlen(KEY_LABEL), key, &n);
}

/* HMAC-SHA256 over "GET\nID\nNAME\nEXPIRES", as 64 hex digits. */
static void sign(const unsigned char key[32], const char *id, const char *name, const char *expires, char hex[65])
{
	unsigned char md[32];
	unsigned int n = 32;
	char msg[512];
	int len = snprintf(msg, sizeof(msg), "GET\n%s\n%s\n%s", id, name, expires);

	if (len < 0 || (size_t)len >= sizeof(msg))
		len = 0; /* too long to be one of ours: signs nothing anyone was given */
	HMAC(EVP_sha256(), key, 32, (const unsigned char *)msg, (size_t)len, md, &n);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

json_t *artifacts_sign(json_t *task, const char *base, const unsigned char *key, unsigned expires_s, time_t now)
{
	const char *id = json_string_value(json_object_get(task, "id"));
	const char *name;
	json_t *a;

	json_object_foreach(json_object_get(task, "artifacts"), name, a) {
		char expires[24], sig[65], *url = NULL;

		if (!json_is_string(json_object_get(a, "inline")))
			continue;
		json_object_set_new(a, "inline", json_true());
		if (key && base && id) {
			snprintf(expires, sizeof(expires), "%" PRId64, (int64_t)now + expires_s);
			sign(key, id, name, expires, sig);
			if (asprintf(&url, "%s/v1/tasks/%s/artifacts/%s?expires=%s&sig=%s", base, id, name, expires, sig) < 0)
				url = NULL;
		}
		json_object_set_new(a, "url", url ? json_string(url) : json_null());
		free(url);
	}
	return task;
}

/* A path segment of ours: [A-Za-z0-9._-], 1..size-1 characters. */
static int segment(const char *p, size_t n, char *out, size_t size)
{
	if (n == 0 || n >= size)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)p[i]) && p[i] != '.' && p[i] != '_' && p[i] != '-')
			return 0;
	memcpy(out, p, n);
	out[n] = '\0';
	return 1;
}

int artifacts_path(const char *url, char *id, size_t id_size, char name[ARTIFACT_NAME_MAX])
{
	static const char pre[] = "/v1/tasks/", mid[] = "/artifacts/";
	const char *p, *slash;

	if (strncmp(url, pre, sizeof(pre) - 1))
		return 0;
	p = url + sizeof(pre) - 1;
	slash = strchr(p, '/');
	if (!slash || strncmp(slash, mid, sizeof(mid) - 1) || !segment(p, (size_t)(slash - p), id, id_size))
		return 0;
	p = slash + sizeof(mid) - 1;
	return !strchr(p, '/') && segment(p, strlen(p), name, ARTIFACT_NAME_MAX);
}

int artifacts_sig_ok(const unsigned char key[32], const char *id, const char *name, const char *expires,
		     const char *sig, time_t now)
{
	char want[65], *end;
	long long e;

	if (!expires || !sig || strlen(sig) != 64 || !isdigit((unsigned char)expires[0]))
		return 0;
	errno = 0;
	e = strtoll(expires, &end, 10);
	if (errno || *end || e < (long long)now)
		return 0;
	sign(key, id, name, expires, want);
	return CRYPTO_memcmp(want, sig, 64) == 0;
}

/* A decimal number of at most 19 digits at *p: 0 and *v, *p past it; -1. */
static int number(const char **p, size_t *v)
{
	size_t n = 0;
	int digits = 0;

	while (isdigit((unsigned char)**p)) {
		if (++digits > 19)
			return -1;
		n = n * 10 + (size_t)(**p - '0');
		(*p)++;
	}
	*v = n;
	return digits ? 0 : -1;
}

int artifacts_range(const char *h, size_t len, size_t *first, size_t *last)
{
	const char *p = h;
	size_t a = 0, b = 0;
	int has_a, has_b;

	if (!h || strncmp(p, "bytes=", 6))
		return -1;
	p += 6;
	has_a = isdigit((unsigned char)*p);
	if (has_a && number(&p, &a) < 0)
		return -1;
	if (*p++ != '-')
		return -1;
	has_b = isdigit((unsigned char)*p);
	if (has_b && number(&p, &b) < 0)
		return -1;
	if (*p || (!has_a && !has_b))
		return -1; /* several ranges, or "bytes=-": the whole body */
	if (!has_a) { /* the last b bytes */
		if (b == 0)
			return 1;
		*first = b >= len ? 0 : len - b;
		*last = len ? len - 1 : 0;
		return len ? 0 : 1;
	}
	if (has_b && b < a)
		return -1;
	if (a >= len)
		return 1;
	*first = a;
	*last = has_b && b < len ? b : len - 1;
	return 0;
}

enum MHD_Result artifacts_reply(struct MHD_Connection *conn, json_t *task, const char *name)
{
	json_t *a = json_object_get(json_object_get(task, "artifacts"), name);
	const char *b64 = json_string_value(json_object_get(a, "inline"));
	const char *want = json_string_value(json_object_get(a, "sha256"));
	uint8_t *data = NULL;
	size_t len = 0, first, last;
	char sha[65] = "", etag[68], cr[96];
	unsigned char md[32];
	unsigned int mdlen = 0;
	struct MHD_Response *r;
	enum MHD_Result ret;
	int range;

	if (!json_is_object(a))
		return reply_not_found(conn, "this task has no such artifact");
	if (!b64)
		return reply_not_found(conn, "this artifact is in S3, not in kiln-api: use its url from GET /v1/tasks/{id}");
	if (connect_b64_decode(b64, 1 << 20, &data, &len) < 0)
		return reply_internal(conn, "this artifact's inline bytes are corrupt (not base64)");
	if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) && mdlen == 32)
		for (int i = 0; i < 32; i++)
			snprintf(sha + 2 * i, 3, "%02x", md[i]);
	if (!want || strcmp(want, sha) || json_integer_value(json_object_get(a, "size")) != (json_int_t)len) {
		free(data);
		return reply_internal(conn, "this artifact's inline bytes do not match its sha256 or size");
	}
	range = artifacts_range(MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_RANGE), len,
				&first, &last);
	if (range == 1) {
		free(data);
		snprintf(cr, sizeof(cr), "bytes */%zu", len);
		r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
		if (!r)
			return MHD_NO;
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
		ret = MHD_queue_response(conn, MHD_HTTP_RANGE_NOT_SATISFIABLE, r);
		MHD_destroy_response(r);
		return ret;
	}
	if (range == 0) {
		memmove(data, data + first, last - first + 1);
		snprintf(cr, sizeof(cr), "bytes %zu-%zu/%zu", first, last, len);
	}
	r = MHD_create_response_from_buffer(range == 0 ? last - first + 1 : len, data ? data : (void *)"",
					    data ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		free(data);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	MHD_add_response_header(r, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff"); /* a host's bytes: never HTML */
	snprintf(etag, sizeof(etag), "\"%s\"", sha);
	MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
	if (range == 0)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
	ret = MHD_queue_response(conn, range == 0 ? MHD_HTTP_PARTIAL_CONTENT : MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}
