/* e2b_relay: the envd relay (docs/e2b.md, "kiln-api: envd relay"). The E2B
 * SDK talks to envd at E2B_SANDBOX_URL, which is kiln-api: a call names its
 * sandbox in E2b-Sandbox-Id and proves it may use it with X-Access-Token
 * (the token create and connect gave out; only its SHA-256 is stored). The
 * call (method, path, query, the listed headers, the body kiln-api
 * collected, at most max_body_mib) goes to the session's kiln-host at
 * /v1/sessions/{id}/envd/<path> with the cluster token, and the answer
 * comes back as the host sends it: a Start stream may last minutes, read
 * from the host only as fast as the client takes it (64 KiB at a time).
 * Each call is session activity, and an open one keeps the session busy
 * (the reaper does not idle it out). An RPC is checked before it goes:
 * one of envd's methods, with Connect's JSON Content-Type for its kind
 * (lib/connect_call.h, the table kiln-host serves by); a streaming method
 * counts in the customer's max_streams. A gzip body goes as it came, with
 * its Content-Encoding: kiln-host inflates it on its way to the guest, at
 * most max_body_mib (sent as Kiln-Max-Body-Bytes), as a plain body. */
#include "e2b.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "buf.h"
#include "connect_call.h"
#include "connectrpc.h"
#include "reply.h"
#include "sessions_int.h"

#define RELAY_BLOCK (64u << 10)
#define RELAY_STATUS_MS FILES_TIMEOUT_MS /* an upload is written to the guest before the host answers */
#define RELAY_SILENCE_MS 600000          /* a host silent this long (no data, no keep-alive) is given up */
#define RELAY_QUERY_MAX 8192

int e2b_relay_path(const char *url)
{
	return !strncmp(url, "/process.Process/", 17) || !strncmp(url, "/filesystem.Filesystem/", 23) ||
	       !strcmp(url, "/files") || !strcmp(url, "/health");
}

static int rpc_path(const char *url)
{
	return !strncmp(url, "/process.Process/", 17) || !strncmp(url, "/filesystem.Filesystem/", 23);
}

/* An error in the path's own shape: Connect's {"code":NAME,"message"} for
 * the RPC paths, E2B's {"code":status,"message"} for /files and /health. */
static enum MHD_Result relay_error(struct MHD_Connection *conn, const char *url, unsigned status,
				   enum connect_code code, const char *msg)
{
	if (rpc_path(url)) {
		json_t *j = connect_error_json(code, msg);

		return j ? reply_json(conn, status, j) : reply_internal(conn, "out of memory");
	}
	return reply_e2b_error(conn, status, msg, NULL, NULL);
}

/* ---- the request to the host ---- */

struct query_b {
	struct buf *b;
	int bad;
};

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct query_b *q = cls;
	char *k = curl_easy_escape(NULL, key, 0), *v = value ? curl_easy_escape(NULL, value, 0) : NULL;

	(void)kind;
	if (!k || (value && !v) || buf_add(q->b, q->b->len ? "&" : "?", 1) < 0 || buf_add(q->b, k, strlen(k)) < 0 ||
	    (v && (buf_add(q->b, "=", 1) < 0 || buf_add(q->b, v, strlen(v)) < 0)))
		q->bad = 1;
	curl_free(k);
	curl_free(v);
	return q->bad ? MHD_NO : MHD_YES;
}

/* The headers relayed (docs/e2b.md); the E2B user's Authorization travels
 * as E2b-Authorization, the host's own Authorization being the cluster
 * token. */
static const char *const relayed[][2] = {
	{ "Connect-Protocol-Version", "Connect-Protocol-Version" },
	{ "Connect-Timeout-Ms", "Connect-Timeout-Ms" },
	{ "Keepalive-Ping-Interval", "Keepalive-Ping-Interval" },
	{ "Authorization", "E2b-Authorization" },
	{ "Content-Encoding", "Content-Encoding" },
	{ "Accept-Encoding", "Accept-Encoding" },
};
#define N_RELAYED (sizeof(relayed) / sizeof(relayed[0]))
/* X-Metadata-KEY headers (a file's metadata, at most 4 KiB in all, each
 * pair at least 10 bytes of it) go too. */
#define RELAY_MAX_META 416
#define RELAY_MAX_HEADERS (N_RELAYED + 1 + RELAY_MAX_META)
#define RELAY_HEADER_MAX 4400

struct relay_headers {
	char *line[RELAY_MAX_HEADERS + 1];
	size_t n;
	int bad;       /* out of memory */
	int bad_meta;  /* an X-Metadata-* header that could not go */
};

/* 0, or -1 when the header is not relayed: a value that does not fit, or
 * would end the header line. */
static int headers_add(struct relay_headers *h, const char *name, const char *v)
{
	size_t len;

	if (!v || strlen(v) > RELAY_HEADER_MAX || strpbrk(v, "\r\n") || h->n >= RELAY_MAX_HEADERS)
		return -1;
	len = strlen(name) + strlen(v) + 3;
	h->line[h->n] = malloc(len);
	if (!h->line[h->n]) {
		h->bad = 1;
		return -1;
	}
	snprintf(h->line[h->n], len, "%s: %s", name, v);
	h->n++;
	h->line[h->n] = NULL;
	return 0;
}

static enum MHD_Result add_meta_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct relay_headers *h = cls;

	(void)kind;
	/* Metadata that cannot go is refused, never dropped: the file would
	 * be written without it. */
	if (!strncasecmp(key, "X-Metadata-", 11) &&
	    (strlen(key) > 11 + 256 || strpbrk(key, "\r\n:") || headers_add(h, key, value ? value : "") < 0))
		h->bad_meta = 1;
	return MHD_YES;
}

static void headers_free(struct relay_headers *h)
{
	for (size_t i = 0; i < h->n; i++)
		free(h->line[i]);
	h->n = 0;
}

/* ---- the answer, streamed ---- */

struct relay {
	struct sessions *ss;
	char id[40];
	struct quota_limiter *lim;
	char customer[65];           /* counted in lim's streams ("": not counted) */
	struct hostclient_stream *hs;
	int64_t quiet_since;         /* monotonic: the last bytes from the host */
};

static ssize_t relay_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct relay *rl = cls;
	struct kiln_err err = { .code = "" };

	(void)pos;
	for (;;) {
		long n = rl->ss->host->stream_read(rl->ss->host->ctx, rl->hs, buf, max, KEEPALIVE_MS, &err);

		if (n > 0) {
			rl->quiet_since = kclock_mono_ms(rl->ss->clock);
			return n;
		}
		if (n == -1)
			return MHD_CONTENT_READER_END_OF_STREAM;
		/* A broken transfer is broken for the client too: the
		 * connection is cut, so that it does not take a cut stream for
		 * a whole one. */
		if (n == -2 || kclock_mono_ms(rl->ss->clock) - rl->quiet_since > RELAY_SILENCE_MS) {
			fprintf(stderr, "kiln-api: sandbox %s: envd relay cut: %s\n", rl->id,
				n == -2 ? err.message : "the host went silent");
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
}

static void relay_free(void *cls)
{
	struct relay *rl = cls;

	/* However the answer ends: its end, an error, the client gone. */
	if (rl->customer[0])
		quota_limiter_stream_close(rl->lim, rl->customer);
	if (rl->hs)
		rl->ss->host->stream_close(rl->ss->host->ctx, rl->hs);
	sessions_op_leave_touch(rl->ss, rl->id);
	sessions_release(rl->ss);
	free(rl);
}

/* Whether the presented token is the session's: hashes compared in
 * constant time. */
static int token_ok(const struct store_session *c, const char *tok)
{
	unsigned char h[SHA256_DIGEST_LENGTH];

	if (!tok || !c->has_e2b_token)
		return 0;
	SHA256((const unsigned char *)tok, strlen(tok), h);
	return CRYPTO_memcmp(h, c->e2b_token_sha, sizeof(h)) == 0;
}

/* Whether the session's lifetime (E2B's timeout) has run out. */
static int ran_out(struct sessions *ss, const struct store_session *c)
{
	return c->max_lifetime_s && kclock_wall_ms(ss->clock) >= c->started_ms + (int64_t)c->max_lifetime_s * 1000;
}

/* Why a call is refused. */
struct refusal {
	unsigned status;
	enum connect_code code;
	char msg[112];
};

static const char *arg(struct MHD_Connection *conn, const char *name)
{
	return MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
}

/* A signed file URL (the SDK's uploadUrl/downloadUrl): /files with
 * signature = "v1_" + base64(SHA-256("path:operation:user:token[:expiry]"))
 * without its '=' padding, operation "read" for a GET, "write" for a POST,
 * path and user the URL's own `path` and `username` ("" when absent), token
 * the sandbox's envd token (derived, never stored: sessions_e2b_token), and
 * expiry the URL's `signature_expiration` (Unix seconds) when it has one.
 * So a signature opens one sandbox, one path, one user and one direction,
 * until its expiry. 1: it does; 0: no signature or a wrong one; -1: right
 * but expired. */
static int signature_ok(struct sessions *ss, struct MHD_Connection *conn, const char *method, const char *url,
			const struct store_session *c)
{
	const char *sig = arg(conn, "signature"), *exp = arg(conn, "signature_expiration");
	const char *path = arg(conn, "path"), *user = arg(conn, "username"), *op;
	unsigned char h[SHA256_DIGEST_LENGTH], want[48];
	char tok[65];
	struct buf raw;
	size_t n;
	int ok;

	if (!sig || !method || !url || strcmp(url, "/files") || !c->has_e2b_token)
		return 0;
	if (!strcmp(method, "GET") || !strcmp(method, "HEAD"))
		op = "read";
	else if (!strcmp(method, "POST"))
		op = "write";
	else
		return 0;
	if (exp && (!exp[0] || strlen(exp) > 18 || strspn(exp, "0123456789") != strlen(exp)))
		return 0;
	sessions_e2b_token(ss, c->id, tok);
	buf_init(&raw, 16384);
	if (buf_printf(&raw, "%s:%s:%s:%s%s%s", path ? path : "", op, user ? user : "", tok, exp ? ":" : "",
		       exp ? exp : "") < 0) {
		buf_free(&raw);
		OPENSSL_cleanse(tok, sizeof(tok));
		return 0;
	}
	SHA256((const unsigned char *)raw.p, raw.len, h);
	OPENSSL_cleanse(raw.p, raw.len);
	buf_free(&raw);
	OPENSSL_cleanse(tok, sizeof(tok));
	n = (size_t)EVP_EncodeBlock(want, h, sizeof(h));
	while (n && want[n - 1] == '=')
		n--;
	ok = strlen(sig) == n + 3 && !strncmp(sig, "v1_", 3) && CRYPTO_memcmp(sig + 3, want, n) == 0;
	if (!ok)
		return 0;
	return exp && strtoll(exp, NULL, 10) <= kclock_wall_ms(ss->clock) / 1000 ? -1 : 1;
}

/* The sandbox the call names (E2b-Sandbox-Id, else envd's host name), if
 * the token (X-Access-Token, or a signed file URL's signature) is its and
 * it runs on a live host (*cur, its host's url): 1, else 0 with *no saying
 * why. */
static int relay_check(struct sessions *ss, struct MHD_Connection *conn, const char *method, const char *path,
		       const char *host_id, struct store_session *cur, char url[256], struct refusal *no)
{
	const char *id = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "E2b-Sandbox-Id");
	const char *tok = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Access-Token");
	int sig = 0;

	if (!id)
		id = host_id;
	/* Unknown, killed, another's, a wrong token or signature: one answer
	 * for all. */
	if (!id || strlen(id) >= sizeof(cur->id) || store_session_get(ss->st, id, NULL, cur) < 0 ||
	    (!(tok ? token_ok(cur, tok) : (sig = signature_ok(ss, conn, method, path, cur)))) ||
	    (cur->state == SESSION_DESTROYED && !ran_out(ss, cur))) {
		*no = (struct refusal){ MHD_HTTP_UNAUTHORIZED, CONNECT_UNAUTHENTICATED,
					"missing or wrong X-Access-Token (or file URL signature) for this sandbox" };
		return 0;
	}
	/* Its time is up (E2B: the sandbox's timeout), ended by the reaper or
	 * about to be: not running, as E2B answers it (502, isRunning()
	 * false), to the holder of its token only. */
	if (cur->state == SESSION_DESTROYED || (cur->state == SESSION_RUNNING && ran_out(ss, cur))) {
		*no = (struct refusal){ MHD_HTTP_BAD_GATEWAY, CONNECT_UNAVAILABLE,
					"the sandbox reached its end of life (its timeout)" };
		return 0;
	}
	if (sig < 0) {
		*no = (struct refusal){ MHD_HTTP_UNAUTHORIZED, CONNECT_UNAUTHENTICATED,
					"signature is already expired" };
		return 0;
	}
	if (cur->state != SESSION_RUNNING) {
		*no = (struct refusal){ MHD_HTTP_BAD_GATEWAY, CONNECT_UNAVAILABLE, "" };
		snprintf(no->msg, sizeof(no->msg), "sandbox is %s",
			 cur->state == SESSION_PAUSING || cur->state == SESSION_PAUSED || cur->state == SESSION_ERROR
				 ? "paused"
				 : session_state_name(cur->state));
		return 0;
	}
	if (sched_host_state(ss->sched, cur->host_id, url) != 1) {
		*no = (struct refusal){ MHD_HTTP_BAD_GATEWAY, CONNECT_UNAVAILABLE, "the sandbox's host cannot be reached" };
		return 0;
	}
	return 1;
}

int e2b_relay_allowed(struct sessions *ss, struct MHD_Connection *conn, const char *method, const char *path,
		      const char *host_id)
{
	struct store_session cur;
	struct refusal no;
	char url[256];
	int ok = relay_check(ss, conn, method, path, host_id, &cur, url, &no);

	sessions_release(ss);
	return ok;
}

enum MHD_Result e2b_relay_refuse(struct sessions *ss, struct MHD_Connection *conn, const char *method,
				 const char *path, const char *host_id)
{
	struct store_session cur;
	struct refusal no;
	enum MHD_Result ret;
	char url[256];

	/* Its body was dropped: a call that would pass now is not relayed
	 * without it (the sandbox changed state meanwhile). */
	if (relay_check(ss, conn, method, path, host_id, &cur, url, &no))
		no = (struct refusal){ MHD_HTTP_SERVICE_UNAVAILABLE, CONNECT_UNAVAILABLE,
				       "the sandbox changed state during the request: retry" };
	ret = relay_error(conn, path, no.status, no.code, no.msg);
	sessions_release(ss);
	return ret;
}

static enum MHD_Result relay_call(struct sessions *ss, const struct e2b_relay_request *r)
{
	struct MHD_Connection *conn = r->conn;
	const char *ctype = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
	enum connect_kind kind = CONNECT_KIND_NONE;
	int streaming;
	struct kiln_err err = { .code = "" };
	struct store_session cur;
	struct MHD_Response *resp;
	struct refusal no;
	struct relay *rl;
	struct query_b qb;
	struct buf path;
	struct relay_headers hh = { .n = 0 };
	char url[256];
	int st, get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD");
	enum MHD_Result ret;

	if (!relay_check(ss, conn, r->method, r->url, r->host_id, &cur, url, &no))
		return relay_error(conn, r->url, no.status, no.code, no.msg);
	/* An RPC is one of envd's methods (lib/connect_call.c's table, which
	 * kiln-host serves by too), and whether it streams is the method's
	 * kind, never the Content-Type's spelling: a stream holds a thread, a
	 * host connection and a guest process however its header is written,
	 * and is counted below. A Content-Type that is not Connect's JSON for
	 * that kind is refused here, before the host. Anything else is no
	 * method of envd's (and is not put into the host's URL). */
	if (rpc_path(r->url)) {
		char why[200];

		kind = connect_call_kind_path(r->url);
		if (kind == CONNECT_KIND_NONE)
			return relay_error(conn, r->url, MHD_HTTP_NOT_FOUND, CONNECT_UNIMPLEMENTED, "no such method");
		if (strcmp(r->method, "POST"))
			return relay_error(conn, r->url, MHD_HTTP_METHOD_NOT_ALLOWED, CONNECT_UNIMPLEMENTED,
					   "a Connect call is a POST");
		if (connect_call_check_media(kind, ctype, why, sizeof(why)) < 0)
			return relay_error(conn, r->url, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, CONNECT_UNIMPLEMENTED, why);
		/* Connect's own compression is not served (kiln-host inflates
		 * /files bodies only): refused rather than parsed compressed. */
		{
			const char *ce = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Encoding");

			if (ce && ce[0] && strcasecmp(ce, "identity"))
				return relay_error(conn, r->url, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, CONNECT_UNIMPLEMENTED,
						   "a compressed Connect request (Content-Encoding) is not supported");
		}
	}
	streaming = connect_kind_streams(kind);
	if (!ss->host->stream_open_raw)
		return relay_error(conn, r->url, MHD_HTTP_SERVICE_UNAVAILABLE, CONNECT_UNAVAILABLE,
				   "this kiln-api cannot relay envd calls");
	/* The path on the host, with the query as it came (re-encoded). */
	buf_init(&path, RELAY_QUERY_MAX + 512);
	if (buf_printf(&path, "/v1/sessions/%s/envd%s", cur.id, r->url) < 0) {
		buf_free(&path);
		return relay_error(conn, r->url, MHD_HTTP_INTERNAL_SERVER_ERROR, CONNECT_INTERNAL, "out of memory");
	}
	{
		struct buf q;

		buf_init(&q, RELAY_QUERY_MAX);
		qb = (struct query_b){ .b = &q };
		MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_arg, &qb);
		if (qb.bad || (q.len && buf_add(&path, q.p, q.len) < 0)) {
			buf_free(&q);
			buf_free(&path);
			return relay_error(conn, r->url, MHD_HTTP_BAD_REQUEST, CONNECT_INVALID_ARGUMENT,
					   "the query is too long");
		}
		buf_free(&q);
	}
	for (size_t i = 0; i < N_RELAYED; i++)
		(void)headers_add(&hh, relayed[i][1], MHD_lookup_connection_value(conn, MHD_HEADER_KIND, relayed[i][0]));
	if (!strcmp(r->url, "/files")) {
		char mb[32];

		/* The bound on a gzip body once inflated: kiln-api's own. */
		snprintf(mb, sizeof(mb), "%llu",
			 (unsigned long long)(ss->cfg && ss->cfg->max_body_mib ? ss->cfg->max_body_mib : 64) << 20);
		(void)headers_add(&hh, "Kiln-Max-Body-Bytes", mb);
		MHD_get_connection_values(conn, MHD_HEADER_KIND, add_meta_header, &hh);
		if (hh.bad_meta && !hh.bad) {
			headers_free(&hh);
			buf_free(&path);
			return relay_error(conn, r->url, MHD_HTTP_BAD_REQUEST, CONNECT_INVALID_ARGUMENT,
					   "invalid metadata: more than 4096 bytes, or more than 416 X-Metadata-* headers");
		}
	}
	rl = hh.bad ? NULL : calloc(1, sizeof(*rl));
	if (!rl) {
		headers_free(&hh);
		buf_free(&path);
		return reply_internal(conn, "out of memory");
	}
	if (streaming) {
		struct quota q;

		/* A stream holds a connection and a thread: counted per customer. */
		if (store_customer_quota(ss->st, cur.customer, &q) < 0)
			quota_defaults(&q);
		if (!quota_limiter_stream_open(r->lim, cur.customer, q.max_streams)) {
			char msg[128];

			free(rl);
			headers_free(&hh);
			buf_free(&path);
			snprintf(msg, sizeof(msg), "more than %u streams open at once", q.max_streams);
			return relay_error(conn, r->url, MHD_HTTP_TOO_MANY_REQUESTS, CONNECT_RESOURCE_EXHAUSTED, msg);
		}
		snprintf(rl->customer, sizeof(rl->customer), "%s", cur.customer);
	}
	rl->ss = ss;
	rl->lim = r->lim;
	snprintf(rl->id, sizeof(rl->id), "%s", cur.id);
	rl->quiet_since = kclock_mono_ms(ss->clock);
	sessions_hold(ss); /* the answer outlives the request's handler */
	sessions_op_enter_touch(ss, cur.id);
	rl->hs = ss->host->stream_open_raw(ss->host->ctx, url, ss->token, r->method, path.p,
					   (const char *const *)hh.line, get ? NULL : (r->body ? r->body : ""),
					   get ? 0 : r->len, ctype, &err);
	headers_free(&hh);
	buf_free(&path);
	st = rl->hs ? ss->host->stream_status(ss->host->ctx, rl->hs, RELAY_STATUS_MS, &err) : -1;
	if (st < 0) {
		char msg[600];

		snprintf(msg, sizeof(msg), "the sandbox's host cannot be reached: %s", err.message);
		relay_free(rl);
		return relay_error(conn, r->url, MHD_HTTP_BAD_GATEWAY, CONNECT_UNAVAILABLE, msg);
	}
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, RELAY_BLOCK, relay_read, rl, relay_free);
	if (!resp) {
		relay_free(rl);
		return MHD_NO;
	}
	{
		const char *ct = ss->host->stream_content_type ? ss->host->stream_content_type(ss->host->ctx, rl->hs)
							       : "";

		if (ct && ct[0])
			MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
	}
	/* A download compressed on the host (Accept-Encoding: gzip) says so. */
	if (ss->host->stream_header) {
		static const char *const back[] = { "Content-Encoding", "Vary" };

		for (size_t i = 0; i < sizeof(back) / sizeof(back[0]); i++) {
			const char *v = ss->host->stream_header(ss->host->ctx, rl->hs, back[i]);

			if (v && v[0] && !strpbrk(v, "\r\n"))
				MHD_add_response_header(resp, back[i], v);
		}
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	ret = MHD_queue_response(conn, (unsigned)st, resp);
	MHD_destroy_response(resp);
	return ret;
}

enum MHD_Result e2b_relay_handle(struct sessions *ss, const struct e2b_relay_request *r)
{
	enum MHD_Result ret = relay_call(ss, r);

	sessions_release(ss);
	return ret;
}
