/* s3: a small S3 client over libcurl's SigV4 signing (see s3.h): single and
 * multipart uploads streamed from disk with their SHA-256 checked by the
 * server, head/get/delete, bucket creation, presigned GET URLs signed here,
 * retries with backoff, and a bounded extractor for S3's XML replies (the
 * server's bytes are treated as hostile: they end up in error messages).
 * One file on purpose: one protocol client; signing, the retrying call,
 * multipart and presigning share its private hashing, encoding and XML code. */
#include "s3.h"
#include "io.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "httpc.h"

#define S3_MAX_KEY 1024            /* S3's own limit, in bytes */
#define S3_MAX_BODY (64u << 10)    /* response bytes kept for error reporting */
#define S3_MAX_UPLOAD_ID 1024
#define S3_MAX_ETAG 128
#define S3_MAX_PARTS 10000u        /* S3's limit on parts per upload */
#define S3_MIN_PART (5u << 20)     /* S3's minimum part size (all but the last) */
#define S3_IO_CHUNK (1u << 20)
#define S3_BACKOFF_FIRST_MS 100
#define S3_BACKOFF_MAX_MS 5000
#define S3_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* ---- hashing -------------------------------------------------------------- */

static void hex_encode(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	size_t i;

	for (i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

static int sha256_hex(const void *buf, size_t len, char out[65])
{
	unsigned char md[32];
	unsigned int mdlen = 0;

	if (!EVP_Digest(buf, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
		return -1;
	hex_encode(md, 32, out);
	return 0;
}

static int digest_final_hex(EVP_MD_CTX *ctx, char out[65])
{
	unsigned char md[32];
	unsigned int mdlen = 0;

	if (!EVP_DigestFinal_ex(ctx, md, &mdlen) || mdlen != 32)
		return -1;
	hex_encode(md, 32, out);
	return 0;
}

static int hmac_sha256(const void *key, size_t keylen, const char *msg, unsigned char out[32])
{
	unsigned int n = 0;

	return HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)msg, strlen(msg), out, &n) && n == 32
		       ? 0
		       : -1;
}

/* SHA-256 of len bytes of fd from offset, into part_hex; each block is also
 * fed to whole (may be NULL). 0, or -errno (-EIO: the file is shorter). */
static int sha256_fd_region(int fd, off_t offset, uint64_t len, EVP_MD_CTX *whole, char part_hex[65])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char *buf = malloc(S3_IO_CHUNK);
	int rc = -ENOMEM;

	if (!ctx || !buf || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL))
		goto out;
	while (len > 0) {
		size_t want = len < S3_IO_CHUNK ? (size_t)len : S3_IO_CHUNK;
		ssize_t n = pread(fd, buf, want, offset);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			goto out;
		}
		if (!EVP_DigestUpdate(ctx, buf, (size_t)n) || (whole && !EVP_DigestUpdate(whole, buf, (size_t)n)))
			goto out;
		offset += n;
		len -= (uint64_t)n;
	}
	rc = digest_final_hex(ctx, part_hex) == 0 ? 0 : -ENOMEM;
out:
	free(buf);
	EVP_MD_CTX_free(ctx);
	return rc;
}

/* ---- messages ------------------------------------------------------------------ */

/* s (an object key or a file path, which may come from a guest) as it goes
 * into a message: printable ASCII, other bytes as '?', cut to 200 bytes with
 * "...", so that messages stay valid UTF-8 and one line. Returns buf. */
#define SHOWN_MAX 208
static const char *shown(const char *s, char buf[SHOWN_MAX])
{
	size_t i;

	for (i = 0; s && s[i] && i < 200; i++)
		buf[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
	strcpy(buf + i, s && s[i] ? "..." : "");
	return buf;
}

/* ---- encoding --------------------------------------------------------------- */

static int unreserved(unsigned char ch)
{
	return isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~';
}

/* Percent-encode s (uppercase hex, as SigV4 requires); '/' kept if keep_slash. */
static char *pct_encode(const char *s, int keep_slash)
{
	static const char digits[] = "0123456789ABCDEF";
	size_t n = strlen(s), i, o = 0;
	char *out;

	if (n > (SIZE_MAX - 1) / 3)
		return NULL;
	out = malloc(3 * n + 1);
	if (!out)
		return NULL;
	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (unreserved(ch) || (keep_slash && ch == '/')) {
			out[o++] = (char)ch;
		} else {
			out[o++] = '%';
			out[o++] = digits[ch >> 4];
			out[o++] = digits[ch & 15];
		}
	}
	out[o] = '\0';
	return out;
}

char *s3_encode_key(const char *key)
{
	return pct_encode(key, 1);
}

static int param_cmp(const void *a, const void *b)
{
	const struct s3_param *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	return c ? c : strcmp(x->value ? x->value : "", y->value ? y->value : "");
}

/* Sorting is on the raw names; SigV4 sorts the encoded ones. They agree as
 * long as names are unreserved characters only, which every S3 parameter
 * name is (asserted for our own callers by the tests). */
char *s3_canonical_query(const struct s3_param *params, size_t n)
{
	struct s3_param *sorted;
	char *out = NULL, *name = NULL, *value = NULL;
	size_t len = 0, cap = 1, i;

	if (n > 64)
		return NULL;
	sorted = malloc((n ? n : 1) * sizeof(*sorted));
	if (!sorted)
		return NULL;
	if (n) {
		memcpy(sorted, params, n * sizeof(*sorted));
		qsort(sorted, n, sizeof(*sorted), param_cmp);
	}
	out = calloc(1, cap);
	for (i = 0; out && i < n; i++) {
		char *grown;
		size_t need;

		name = pct_encode(sorted[i].name, 0);
		value = pct_encode(sorted[i].value ? sorted[i].value : "", 0);
		if (!name || !value)
			goto fail;
		need = len + strlen(name) + strlen(value) + 3;
		grown = realloc(out, need);
		if (!grown)
			goto fail;
		out = grown;
		len += (size_t)sprintf(out + len, "%s%s=%s", i ? "&" : "", name, value);
		free(name);
		free(value);
		name = value = NULL;
	}
	free(sorted);
	return out;
fail:
	free(name);
	free(value);
	free(out);
	free(sorted);
	return NULL;
}

/* ---- XML replies -------------------------------------------------------------- */

/* Decode the entity at p[0..n) (p[0] == '&') into *ch; returns the bytes it
 * spans, or 0 when it is not one we know (the '&' is then taken literally). */
static size_t xml_entity(const char *p, size_t n, unsigned char *ch)
{
	static const struct {
		const char *name;
		char ch;
	} named[] = { { "&lt;", '<' }, { "&gt;", '>' }, { "&amp;", '&' }, { "&quot;", '"' }, { "&apos;", '\'' } };
	size_t i, k;
	unsigned long v = 0;
	int hex;

	for (i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
		k = strlen(named[i].name);
		if (n >= k && memcmp(p, named[i].name, k) == 0) {
			*ch = (unsigned char)named[i].ch;
			return k;
		}
	}
	if (n < 4 || p[1] != '#')
		return 0;
	hex = p[2] == 'x' || p[2] == 'X';
	/* At most 8 digits: bounded work, no overflow. */
	for (k = hex ? 3 : 2; k < n && k < 12 && p[k] != ';'; k++) {
		int d = isdigit((unsigned char)p[k])    ? p[k] - '0'
			: hex && isxdigit((unsigned char)p[k]) ? tolower((unsigned char)p[k]) - 'a' + 10
							       : -1;
		if (d < 0)
			return 0;
		v = v * (hex ? 16 : 10) + (unsigned long)d;
	}
	if (k >= n || p[k] != ';' || k == (hex ? 3u : 2u))
		return 0;
	*ch = v >= 0x20 && v < 0x7f ? (unsigned char)v : '?';
	return k + 1;
}

/* Find "<tag>" or "<tag attr...>" (not "<tagX>", not "</tag>") in x[0..n) from
 * *pos; returns the offset just past its '>' or -1. */
static long xml_find_open(const char *x, size_t n, const char *tag, size_t tl, size_t from)
{
	size_t i;

	for (i = from; i + tl + 2 <= n; i++) {
		if (x[i] != '<' || memcmp(x + i + 1, tag, tl) != 0)
			continue;
		char after = x[i + 1 + tl];

		if (after == '>')
			return (long)(i + tl + 2);
		if (after == ' ' || after == '\t' || after == '\r' || after == '\n') {
			const char *gt = memchr(x + i + 1 + tl, '>', n - (i + 1 + tl));

			if (!gt)
				return -1;
			if (gt[-1] == '/') /* <tag/>: empty, keep looking for a real one */
				continue;
			return (long)(gt - x + 1);
		}
	}
	return -1;
}

int s3_xml_text(const char *xml, size_t len, const char *tag, char *out, size_t out_size)
{
	size_t tl, i, o = 0, total = 0;
	long start;

	if (!out || out_size == 0)
		return -1;
	out[0] = '\0';
	if (!xml || !tag)
		return -1;
	tl = strnlen(tag, 65);
	if (tl == 0 || tl > 64 || len > S3_XML_MAX)
		return -1;
	start = xml_find_open(xml, len, tag, tl, 0);
	if (start < 0)
		return -1;
	/* Text up to the first '<', which must open the matching end tag: a value
	 * with markup inside is not one we want. */
	for (i = (size_t)start; i < len && xml[i] != '<';) {
		unsigned char ch = (unsigned char)xml[i];
		size_t used = 1;

		if (ch == '&' && (used = xml_entity(xml + i, len - i, &ch)) == 0) {
			used = 1;
			ch = '&';
		}
		/* Printable ASCII only: this text goes into messages, logs and JSON. */
		if (ch < 0x20 || ch >= 0x7f)
			ch = (ch == '\t' || ch == '\n' || ch == '\r') ? ' ' : '?';
		if (o + 1 < out_size)
			out[o++] = (char)ch;
		total++;
		i += used;
	}
	out[o] = '\0';
	if (i + tl + 3 > len || xml[i + 1] != '/' || memcmp(xml + i + 2, tag, tl) != 0 || xml[i + 2 + tl] != '>') {
		out[0] = '\0';
		return -1;
	}
	return total > INT32_MAX ? INT32_MAX : (int)total;
}

/* ---- configuration and URLs --------------------------------------------------- */

static int bucket_ok(const char *b)
{
	size_t n = strlen(b), i;

	if (n < 3 || n > 63)
		return 0;
	for (i = 0; i < n; i++)
		if (!(islower((unsigned char)b[i]) || isdigit((unsigned char)b[i]) || b[i] == '-' || b[i] == '.'))
			return 0;
	return 1;
}

static int region_ok(const char *r)
{
	size_t n = strlen(r), i;

	for (i = 0; i < n; i++)
		if (!(isalnum((unsigned char)r[i]) || r[i] == '-' || r[i] == '_'))
			return 0;
	return n > 0 && n <= 32;
}

static int check_config(const struct s3_config *c, struct kiln_err *err)
{
	if (!c || !c->endpoint || !c->region || !c->bucket || !c->access_key || !c->secret_key)
		return kiln_err_set(err, KERR_S3_ERROR, "S3 configuration incomplete (endpoint, region, bucket, keys)");
	if (strncmp(c->endpoint, "http://", 7) != 0 && strncmp(c->endpoint, "https://", 8) != 0)
		return kiln_err_set(err, KERR_S3_ERROR, "S3 endpoint %.200s: not an http:// or https:// URL", c->endpoint);
	if (strpbrk(c->endpoint, "?#@ \t\r\n"))
		return kiln_err_set(err, KERR_S3_ERROR, "S3 endpoint %.200s: only scheme://host[:port][/path]",
				    c->endpoint);
	if (!region_ok(c->region))
		return kiln_err_set(err, KERR_S3_ERROR, "S3 region \"%.40s\" is not a region name", c->region);
	if (c->bucket[0] && !bucket_ok(c->bucket))
		return kiln_err_set(err, KERR_S3_ERROR,
				    "S3 bucket \"%.80s\": 3-63 characters of a-z, 0-9, '.' and '-'", c->bucket);
	if (strpbrk(c->access_key, "\r\n") || strpbrk(c->secret_key, "\r\n"))
		return kiln_err_set(err, KERR_S3_ERROR, "S3 keys must not contain line breaks");
	if (c->part_size && c->part_size < S3_MIN_PART)
		return kiln_err_set(err, KERR_S3_ERROR, "S3 part size %llu is below the 5 MiB minimum",
				    (unsigned long long)c->part_size);
	return 0;
}

/* Object keys as kiln writes them: no empty, "." or ".." segments (libcurl
 * and servers normalise those differently), no control characters. */
int s3_key_check(const char *key, struct kiln_err *err)
{
	size_t n, i, seg = 0;
	char kb[SHOWN_MAX];

	if (!key || !key[0])
		return kiln_err_set(err, KERR_S3_ERROR, "S3 object key is empty");
	n = strnlen(key, S3_MAX_KEY + 1);
	if (n > S3_MAX_KEY)
		return kiln_err_set(err, KERR_S3_ERROR, "S3 object key longer than %d bytes", S3_MAX_KEY);
	for (i = 0; i <= n; i++) {
		unsigned char ch = (unsigned char)key[i];

		if (i < n && (ch < 0x20 || ch == 0x7f))
			return kiln_err_set(err, KERR_S3_ERROR, "S3 object key %s: control character at byte %zu",
					    shown(key, kb), i);
		if (i == n || ch == '/') {
			size_t sl = i - seg;

			if (sl == 0 || (sl == 1 && key[seg] == '.') || (sl == 2 && key[seg] == '.' && key[seg + 1] == '.'))
				return kiln_err_set(err, KERR_S3_ERROR,
						    "S3 object key %s: empty, \".\" or \"..\" path segment",
						    shown(key, kb));
			seg = i + 1;
		}
	}
	return 0;
}

static int hex_value(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

int s3_key_under(const char *key, const char *prefix, struct kiln_err *err)
{
	char kb[SHOWN_MAX], decoded[S3_MAX_KEY + 1];
	size_t plen = prefix ? strlen(prefix) : 0, i, n = 0;

	if (plen == 0 || prefix[plen - 1] != '/')
		return kiln_err_set(err, KERR_S3_KEY_OUTSIDE, "no prefix to check the key against");
	if (s3_key_check(key, err) < 0) {
		kiln_err_recode(err, KERR_S3_KEY_OUTSIDE);
		return -1;
	}
	if (strncmp(key, prefix, plen) || !key[plen])
		return kiln_err_set(err, KERR_S3_KEY_OUTSIDE, "S3 object key %s is not under %.200s", shown(key, kb), prefix);
	/* s3_key_check bounded key to S3_MAX_KEY bytes: so is its decoding. */
	for (i = 0; key[i]; i++) {
		int hi = key[i] == '%' ? hex_value(key[i + 1]) : -1, lo = hi >= 0 ? hex_value(key[i + 2]) : -1;

		if (hi >= 0 && lo >= 0) {
			decoded[n++] = (char)(hi << 4 | lo);
			i += 2;
		} else {
			decoded[n++] = key[i];
		}
	}
	decoded[n] = '\0';
	if (memchr(decoded, '\0', n) || s3_key_check(decoded, err) < 0 || strncmp(decoded, prefix, plen))
		return kiln_err_set(err, KERR_S3_KEY_OUTSIDE,
				    "S3 object key %s: its percent-decoded form leaves %.200s or is not a valid key",
				    shown(key, kb), prefix);
	return 0;
}

/* A Content-Type goes into a header: printable ASCII, bounded. */
static int check_content_type(const char *ct, struct kiln_err *err)
{
	size_t i;

	if (!ct)
		return 0;
	for (i = 0; ct[i] && i < 128; i++)
		if ((unsigned char)ct[i] < 0x20 || (unsigned char)ct[i] >= 0x7f)
			return kiln_err_set(err, KERR_S3_ERROR, "Content-Type: byte %zu is not printable ASCII", i);
	if (i == 0 || i >= 128)
		return kiln_err_set(err, KERR_S3_ERROR, "Content-Type: must be 1-127 bytes");
	return 0;
}

/* The endpoint without trailing slashes, its length in *n. */
static const char *endpoint_base(const struct s3_config *c, size_t *n)
{
	size_t len = strlen(c->endpoint);

	while (len > 0 && c->endpoint[len - 1] == '/')
		len--;
	*n = len;
	return c->endpoint;
}

/* ENDPOINT/BUCKET[/KEY][?QUERY] (path-style), or ENDPOINT/KEY when the bucket
 * is empty (the endpoint then names the bucket itself). malloc'd or NULL. */
static char *build_url(const struct s3_config *c, const char *key, const char *query)
{
	size_t blen;
	const char *base = endpoint_base(c, &blen);
	char *ekey = key ? s3_encode_key(key) : NULL, *url = NULL;

	if (key && !ekey)
		return NULL;
	if (asprintf(&url, "%.*s%s%s%s%s%s%s", (int)blen, base, c->bucket[0] ? "/" : "", c->bucket,
		     key ? "/" : "", key ? ekey : "", query && query[0] ? "?" : "",
		     query && query[0] ? query : "") < 0)
		url = NULL;
	free(ekey);
	return url;
}

/* ---- HTTP ------------------------------------------------------------------- */

struct s3_body {
	const char *mem; /* request body from memory, or */
	int fd;          /* from fd (when mem is NULL and fd >= 0) */
	off_t offset;
	uint64_t length;
	uint64_t pos;
	int io_errno;
	int shrunk; /* the file ended before length: it changed under us */
};

struct s3_request {
	const char *method; /* GET HEAD PUT POST DELETE */
	const char *key;    /* NULL: the bucket */
	const char *query;  /* canonical (s3_canonical_query) or NULL */
	const char *content_type;
	const char *payload_sha256; /* NULL: the empty payload's */
	int has_body;
	struct s3_body body;
	int out_fd; /* GET: a 2xx body goes here (else into the reply buffer) */
};

struct s3_reply {
	long status;
	char *body; /* first S3_MAX_BODY bytes of a body not sent to out_fd */
	size_t body_len;
	char etag[S3_MAX_ETAG + 1];
	int etag_too_long;
	int out_fd;
	uint64_t out_bytes;
	int io_errno;
	CURL *h;
};

static size_t read_cb(char *buf, size_t size, size_t nitems, void *arg)
{
	struct s3_body *b = arg;
	size_t want = size * nitems;
	ssize_t n;

	if (b->length - b->pos < want)
		want = (size_t)(b->length - b->pos);
	if (want == 0)
		return 0;
	if (b->mem) {
		memcpy(buf, b->mem + b->pos, want);
		b->pos += want;
		return want;
	}
	do
		n = pread(b->fd, buf, want, b->offset + (off_t)b->pos);
	while (n < 0 && errno == EINTR);
	if (n <= 0) {
		/* A file that shrank since we hashed it is an error, not an EOF. */
		b->io_errno = n < 0 ? errno : EIO;
		b->shrunk = n == 0;
		return CURL_READFUNC_ABORT;
	}
	b->pos += (uint64_t)n;
	return (size_t)n;
}

/* curl rewinds the body when it must send it again (e.g. after a 100-continue
 * that did not come or a reused connection that closed). */
static int seek_cb(void *arg, curl_off_t offset, int origin)
{
	struct s3_body *b = arg;

	if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > b->length)
		return CURL_SEEKFUNC_CANTSEEK;
	b->pos = (uint64_t)offset;
	return CURL_SEEKFUNC_OK;
}

static size_t write_cb(char *data, size_t size, size_t nmemb, void *arg)
{
	struct s3_reply *r = arg;
	size_t n = size * nmemb, keep;
	long status = 0;
	int rc;

	curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
	if (r->out_fd >= 0 && status >= 200 && status < 300) {
		rc = io_write_all(r->out_fd, data, n);
		if (rc < 0) {
			r->io_errno = -rc;
			return 0; /* CURLE_WRITE_ERROR */
		}
		r->out_bytes += n;
		return n;
	}
	/* Error bodies are kept up to a bound, the rest is dropped. */
	keep = S3_MAX_BODY - r->body_len;
	if (keep > n)
		keep = n;
	if (keep > 0) {
		if (!r->body && !(r->body = malloc(S3_MAX_BODY + 1))) {
			r->io_errno = ENOMEM;
			return 0;
		}
		memcpy(r->body + r->body_len, data, keep);
		r->body_len += keep;
		r->body[r->body_len] = '\0';
	}
	return n;
}

/* Keeps the ETag of the final response (a new status line resets it: the
 * callback also sees "100 Continue" responses). */
static size_t header_cb(char *data, size_t size, size_t nitems, void *arg)
{
	struct s3_reply *r = arg;
	size_t n = size * nitems, vlen;
	const char *v;

	if (n >= 5 && memcmp(data, "HTTP/", 5) == 0) {
		r->etag[0] = '\0';
		r->etag_too_long = 0;
	} else if (n > 5 && strncasecmp(data, "etag:", 5) == 0) {
		v = data + 5;
		vlen = n - 5;
		while (vlen > 0 && (*v == ' ' || *v == '\t'))
			v++, vlen--;
		while (vlen > 0 && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' '))
			vlen--;
		r->etag_too_long = vlen > S3_MAX_ETAG;
		if (!r->etag_too_long) {
			memcpy(r->etag, v, vlen);
			r->etag[vlen] = '\0';
		}
	}
	return n;
}

static void reply_reset(struct s3_reply *r)
{
	r->status = 0;
	r->body_len = 0;
	if (r->body)
		r->body[0] = '\0';
	r->etag[0] = '\0';
	r->etag_too_long = 0;
	r->out_bytes = 0;
	r->io_errno = 0;
}

static void reply_free(struct s3_reply *r)
{
	free(r->body);
	r->body = NULL;
}

struct s3_call {
	const struct s3_config *c;
	CURL *h;
	char errbuf[CURL_ERROR_SIZE];
	uint64_t bytes_sent; /* request body bytes put on the wire, retries included */
	/* guarded configs: this machine's addresses, read before each attempt,
	 * and the first address a socket was refused for (curl's callback) */
	struct netaddr_own own;
	char refused[200];
};

/* CURLOPT_OPENSOCKETFUNCTION of a guarded call: the address checked here
 * is the one connected to, whatever name lookup produced it (a second DNS
 * answer, curl's cache). Refused: no socket, and a note for perform(). */
static curl_socket_t guarded_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *sa)
{
	struct s3_call *call = arg;
	enum netaddr_class cl = netaddr_check_connect(&sa->addr, call->c->allow, &call->own);

	if (purpose != CURLSOCKTYPE_IPCXN || cl != NETADDR_PUBLIC) {
		struct netaddr a;
		char buf[64];

		if (!call->refused[0]) {
			if (netaddr_from_sockaddr(&sa->addr, &a) < 0)
				snprintf(call->refused, sizeof(call->refused), "a connection of address family %d",
					 sa->family);
			else
				snprintf(call->refused, sizeof(call->refused), "a connection to %s (%s)",
					 netaddr_str(&a, buf, sizeof(buf)), netaddr_class_name(cl));
		}
		return CURL_SOCKET_BAD;
	}
	return socket(sa->family, sa->socktype | SOCK_CLOEXEC, sa->protocol);
}

static int call_open(struct s3_call *call, const struct s3_config *c, struct kiln_err *err)
{
	memset(call, 0, sizeof(*call));
	call->c = c;
	call->h = curl_easy_init();
	if (!call->h)
		return kiln_err_set(err, KERR_S3_ERROR, "curl_easy_init failed");
	return 0;
}

static void call_close(struct s3_call *call)
{
	if (call->h)
		curl_easy_cleanup(call->h);
	call->h = NULL;
}

/* Options for one attempt. The handle is reset each time but keeps its
 * connection cache, so a multipart upload reuses one connection. */
static int setup(struct s3_call *call, struct s3_request *q, struct s3_reply *r, struct curl_slist **hdrs,
		 char *url)
{
	const struct s3_config *c = call->c;
	CURL *h = call->h;
	char sigv4[64], line[128];
	long timeout = c->timeout_s > 0 ? c->timeout_s : 60;
	struct curl_slist *l = NULL, *t;
	struct httpc_limits lim = { 0 };
	CURLcode e = CURLE_OK;

	curl_easy_reset(h);
	snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:s3", c->region);
	snprintf(line, sizeof(line), "x-amz-content-sha256: %s",
		 q->payload_sha256 ? q->payload_sha256 : S3_EMPTY_SHA256);
	l = curl_slist_append(l, line);
	if (l && q->content_type) {
		char ct[160]; /* check_content_type: at most 127 bytes */

		snprintf(ct, sizeof(ct), "Content-Type: %s", q->content_type);
		t = curl_slist_append(l, ct);
		l = t ? t : (curl_slist_free_all(l), NULL);
	}
	if (!l)
		return -ENOMEM;
	*hdrs = l;

	e |= curl_easy_setopt(h, CURLOPT_URL, url);
	e |= curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	e |= curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
	e |= curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4);
	/* Not CURLOPT_USERPWD: access keys may contain ':' (Swift's "test:tester"). */
	e |= curl_easy_setopt(h, CURLOPT_USERNAME, c->access_key);
	e |= curl_easy_setopt(h, CURLOPT_PASSWORD, c->secret_key);
	e |= curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
	lim.connect_timeout_ms = (timeout < 10 ? timeout : 10L) * 1000;
	if ((q->has_body && !q->body.mem) || q->out_fd >= 0) {
		/* A file going up or down may rightly take longer than timeout_s
		 * (a 4 GiB download): what must not happen is a stall. */
		lim.stall_bytes = 1024;
		lim.stall_s = timeout;
	} else {
		lim.timeout_ms = timeout * 1000;
	}
	e |= httpc_set_limits(h, &lim);
	if (c->guarded) {
		e |= curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, guarded_socket);
		e |= curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, call);
		e |= curl_easy_setopt(h, CURLOPT_PROXY, ""); /* not the environment's */
	}
	e |= curl_easy_setopt(h, CURLOPT_ERRORBUFFER, call->errbuf);
	e |= curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
	e |= curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	e |= curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
	e |= curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
	if (strcmp(q->method, "HEAD") == 0) {
		e |= curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (strcmp(q->method, "PUT") == 0) {
		e |= curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		e |= curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->body.length);
	} else if (strcmp(q->method, "POST") == 0) {
		e |= curl_easy_setopt(h, CURLOPT_POST, 1L);
		e |= curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body.length);
	} else if (strcmp(q->method, "GET") != 0) {
		e |= curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
	}
	if (q->has_body) {
		e |= curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
		e |= curl_easy_setopt(h, CURLOPT_READDATA, &q->body);
		e |= curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
		e |= curl_easy_setopt(h, CURLOPT_SEEKDATA, &q->body);
	}
	return e == CURLE_OK ? 0 : -EINVAL;
}

static int transient_curl(CURLcode e)
{
	switch (e) {
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_CONNECT:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_WEIRD_SERVER_REPLY:
		return 1;
	default:
		return 0;
	}
}

static void backoff(int attempt)
{
	long ms = S3_BACKOFF_FIRST_MS;
	struct timespec ts;

	while (--attempt > 0 && ms < S3_BACKOFF_MAX_MS)
		ms *= 4;
	if (ms > S3_BACKOFF_MAX_MS)
		ms = S3_BACKOFF_MAX_MS;
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (ms % 1000) * 1000000L;
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* "Code: Message" from an S3 XML error body, or "" when there is none. */
static void s3_error_text(const struct s3_reply *r, char *out, size_t n)
{
	char code[64], msg[320];

	out[0] = '\0';
	if (!r->body || s3_xml_text(r->body, r->body_len, "Code", code, sizeof(code)) < 0)
		return;
	if (s3_xml_text(r->body, r->body_len, "Message", msg, sizeof(msg)) < 0)
		msg[0] = '\0';
	snprintf(out, n, "%s%s%s", code, msg[0] ? ": " : "", msg);
}

static const char *what(const struct s3_config *c, const struct s3_request *q, char *buf, size_t n)
{
	char kb[SHOWN_MAX];

	snprintf(buf, n, "%s %s%s%s", q->method, c->bucket[0] ? c->bucket : "(endpoint)", q->key ? "/" : "",
		 q->key ? shown(q->key, kb) : "");
	return buf;
}

/* Send q, retrying connection errors and 5xx replies with backoff. Returns
 * 0 with r->status set to the final (< 500) HTTP status, or -1 with err set:
 * s3_unavailable after the last attempt, io_error when our side of the body
 * failed, s3_error for anything else. */
static int perform(struct s3_call *call, struct s3_request *q, struct s3_reply *r, struct kiln_err *err)
{
	const struct s3_config *c = call->c;
	int attempts = c->attempts > 0 ? c->attempts : 3, i;
	char *url = build_url(c, q->key, q->query), desc[400], s3msg[400];
	CURLcode e = CURLE_OK;
	int rc = -1;

	if (!url)
		return kiln_err_set(err, KERR_S3_ERROR, "out of memory building the S3 URL");
	r->h = call->h;
	r->out_fd = q->out_fd;
	for (i = 1;; i++) {
		struct curl_slist *hdrs = NULL;
		curl_off_t up = 0;

		reply_reset(r);
		q->body.pos = 0;
		q->body.io_errno = 0;
		q->body.shrunk = 0;
		call->errbuf[0] = '\0';
		if (q->out_fd >= 0 && (ftruncate(q->out_fd, 0) < 0 || lseek(q->out_fd, 0, SEEK_SET) < 0)) {
			kiln_err_set(err, KERR_IO_ERROR, "truncating the download file: %s", strerror(errno));
			break;
		}
		if (c->guarded) {
			/* Checked afresh at each attempt: the clear answer when the
			 * name now resolves somewhere refused (guarded_socket holds
			 * the connection itself to the same rule). */
			struct netaddr_resolved res;
			struct kiln_err ce = { .code = "" };
			/* The name lookup within the connect timeout setup() gives curl. */
			long dns_ms = (c->timeout_s > 0 && c->timeout_s < 10 ? c->timeout_s : 10) * 1000;
			int lr = netaddr_own_load(&call->own);

			call->refused[0] = '\0';
			if (lr < 0) {
				kiln_err_set(err, KERR_S3_ERROR, "cannot list this machine's addresses: %s", strerror(-lr));
				break;
			}
			if (netaddr_check_endpoint(c->endpoint, c->allow, &call->own, dns_ms, &res, &ce) < 0) {
				if (ce.errc == KERR_S3_UNAVAILABLE && i < attempts) {
					backoff(i);
					continue;
				}
				if (err)
					*err = ce;
				break;
			}
		}
		if (setup(call, q, r, &hdrs, url) < 0) {
			curl_slist_free_all(hdrs);
			kiln_err_set(err, KERR_S3_ERROR, "setting up the curl request failed");
			break;
		}
		e = curl_easy_perform(call->h);
		curl_slist_free_all(hdrs);
		if (curl_easy_getinfo(call->h, CURLINFO_SIZE_UPLOAD_T, &up) == CURLE_OK && up > 0)
			call->bytes_sent += (uint64_t)up;
		curl_easy_getinfo(call->h, CURLINFO_RESPONSE_CODE, &r->status);
		if (call->refused[0]) {
			kiln_err_set(err, KERR_DESTINATION_FORBIDDEN,
				     "%s: refused %s: a destination may not reach such an address unless the operator "
				     "lists it in destinations.allow_addresses",
				     what(c, q, desc, sizeof(desc)), call->refused);
			break;
		}
		if (q->body.io_errno || r->io_errno) {
			kiln_err_set(err, KERR_IO_ERROR, "%s: %s the local file: %s", what(c, q, desc, sizeof(desc)),
				     q->body.io_errno ? "reading" : "writing",
				     q->body.shrunk ? "it is shorter than it was (changed during the upload)"
						    : strerror(q->body.io_errno ? q->body.io_errno : r->io_errno));
			break;
		}
		if (e == CURLE_OK && r->status < 500) {
			rc = 0;
			break;
		}
		if (e != CURLE_OK && !transient_curl(e)) {
			kiln_err_set(err, KERR_S3_ERROR, "%s: %s%s%s", what(c, q, desc, sizeof(desc)),
				     curl_easy_strerror(e), call->errbuf[0] ? ": " : "", call->errbuf);
			break;
		}
		if (i >= attempts) {
			s3_error_text(r, s3msg, sizeof(s3msg));
			if (e != CURLE_OK)
				kiln_err_set(err, KERR_S3_UNAVAILABLE, "S3 at %.100s unavailable after %d attempts: %s: %s%s%s",
					     c->endpoint, i, what(c, q, desc, sizeof(desc)), curl_easy_strerror(e),
					     call->errbuf[0] ? ": " : "", call->errbuf);
			else
				kiln_err_set(err, KERR_S3_UNAVAILABLE, "S3 at %.100s unavailable after %d attempts: %s: HTTP %ld%s%s",
					     c->endpoint, i, what(c, q, desc, sizeof(desc)), r->status,
					     s3msg[0] ? ": " : "", s3msg);
			break;
		}
		backoff(i);
	}
	free(url);
	return rc;
}

/* Turn a final non-2xx reply into err (always returns -1). */
static int fail_status(const struct s3_config *c, const struct s3_request *q, const struct s3_reply *r,
		       struct kiln_err *err)
{
	char s3msg[400], desc[400];

	s3_error_text(r, s3msg, sizeof(s3msg));
	what(c, q, desc, sizeof(desc));
	if (r->status == 403)
		return kiln_err_set(err, KERR_S3_AUTH, "S3 refused the credentials: %s (%s, access key %.60s)",
				    s3msg[0] ? s3msg : "HTTP 403 Forbidden", desc, c->access_key);
	if (r->status == 404)
		return kiln_err_set(err, KERR_S3_NOT_FOUND, "S3: not found: %s (%s)", desc,
				    s3msg[0] ? s3msg : "HTTP 404");
	return kiln_err_set(err, KERR_S3_ERROR, "S3 %s failed: HTTP %ld%s%s", desc, r->status, s3msg[0] ? ": " : "",
			    s3msg);
}

static int ok_status(long s)
{
	return s >= 200 && s < 300;
}

/* ---- public calls -------------------------------------------------------------- */

int s3_global_init(void)
{
	return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

/* One request with an optional in-memory body; the reply is left in *r
 * (caller frees). */
static int simple(const struct s3_config *c, const char *method, const char *key, const char *query,
		  const void *body, size_t len, const char *content_type, struct s3_reply *r, struct kiln_err *err)
{
	struct s3_call call;
	struct s3_request q = { .method = method, .key = key, .query = query, .content_type = content_type,
				.out_fd = -1, .body = { .fd = -1 } };
	char sha[65];
	int rc;

	memset(r, 0, sizeof(*r));
	if (body || strcmp(method, "PUT") == 0 || strcmp(method, "POST") == 0) {
		if (sha256_hex(body ? body : "", len, sha) < 0)
			return kiln_err_set(err, KERR_S3_ERROR, "SHA-256 failed");
		q.has_body = 1;
		q.body.mem = body ? body : "";
		q.body.length = len;
		q.payload_sha256 = sha;
	}
	if (call_open(&call, c, err) < 0)
		return -1;
	rc = perform(&call, &q, r, err);
	call_close(&call);
	return rc;
}

int s3_ensure_bucket(const struct s3_config *c, struct kiln_err *err)
{
	struct s3_reply r;
	char code[64], *body = NULL;
	int rc;

	if (check_config(c, err) < 0)
		return -1;
	if (!c->bucket[0])
		return kiln_err_set(err, KERR_S3_ERROR, "S3 bucket name is empty");
	/* us-east-1 is the default location; any other must be named. */
	if (strcmp(c->region, "us-east-1") != 0 &&
	    asprintf(&body, "<CreateBucketConfiguration><LocationConstraint>%s</LocationConstraint>"
			    "</CreateBucketConfiguration>", c->region) < 0)
		return kiln_err_set(err, KERR_S3_ERROR, "out of memory");
	rc = simple(c, "PUT", NULL, NULL, body, body ? strlen(body) : 0, body ? "application/xml" : NULL, &r, err);
	free(body);
	if (rc == 0 && !ok_status(r.status)) {
		struct s3_request q = { .method = "PUT" };

		if (!(r.status == 409 && r.body && s3_xml_text(r.body, r.body_len, "Code", code, sizeof(code)) >= 0 &&
		      strcmp(code, "BucketAlreadyOwnedByYou") == 0))
			rc = fail_status(c, &q, &r, err);
	}
	reply_free(&r);
	return rc;
}

int s3_put_buffer(const struct s3_config *c, const char *key, const void *buf, size_t len,
		  const char *content_type, struct kiln_err *err)
{
	struct s3_reply r;
	int rc;

	if (check_config(c, err) < 0 || s3_key_check(key, err) < 0 || check_content_type(content_type, err) < 0)
		return -1;
	rc = simple(c, "PUT", key, NULL, buf, len, content_type, &r, err);
	if (rc == 0 && !ok_status(r.status)) {
		struct s3_request q = { .method = "PUT", .key = key };

		rc = fail_status(c, &q, &r, err);
	}
	reply_free(&r);
	return rc;
}

static int hash_error(const char *key, int rc, struct kiln_err *err)
{
	char kb[SHOWN_MAX];

	return kiln_err_set(err, KERR_IO_ERROR, "reading %s for its SHA-256: %s", shown(key, kb),
			    rc == -EIO ? "the file is shorter than its size (changed during the upload)"
				       : strerror(-rc));
}

/* PUT of len bytes of fd from offset (whole file or one part) whose SHA-256
 * is sha (hex). The reply is left in *r. */
static int put_region(struct s3_call *call, const char *key, const char *query, const char *content_type, int fd,
		      off_t offset, uint64_t len, const char *sha, struct s3_reply *r, struct kiln_err *err)
{
	struct s3_request q = { .method = "PUT", .key = key, .query = query, .content_type = content_type,
				.out_fd = -1, .has_body = 1, .body = { .fd = fd, .offset = offset, .length = len },
				.payload_sha256 = sha };
	int rc;

	rc = perform(call, &q, r, err);
	if (rc == 0 && !ok_status(r->status))
		rc = fail_status(call->c, &q, r, err);
	return rc;
}

/* Hashing a part on a helper thread while the previous one is on the wire:
 * the SHA-256 pass over the file otherwise adds ~20% to a multipart upload. */
struct hash_job {
	int fd;
	off_t offset;
	uint64_t len;
	EVP_MD_CTX *whole; /* fed in part order: one job at a time */
	char hex[65];
	int rc;
	int threaded;
	pthread_t thread;
};

static void *hash_job_run(void *arg)
{
	struct hash_job *j = arg;

	j->rc = sha256_fd_region(j->fd, j->offset, j->len, j->whole, j->hex);
	return NULL;
}

/* Start hashing; on a machine that will not give us a thread, hash here. */
static void hash_job_start(struct hash_job *j, int fd, off_t offset, uint64_t len, EVP_MD_CTX *whole)
{
	j->fd = fd;
	j->offset = offset;
	j->len = len;
	j->whole = whole;
	j->rc = 0;
	j->threaded = pthread_create(&j->thread, NULL, hash_job_run, j) == 0;
	if (!j->threaded)
		hash_job_run(j);
}

static int hash_job_wait(struct hash_job *j)
{
	if (j->threaded)
		pthread_join(j->thread, NULL);
	j->threaded = 0;
	return j->rc;
}

/* POST ?uploads=: returns the UploadId in upload_id. */
static int mpu_create(struct s3_call *call, const char *key, const char *content_type, char *upload_id,
		      size_t n, struct kiln_err *err)
{
	static const struct s3_param p[] = { { "uploads", "" } };
	struct s3_request q = { .method = "POST", .key = key, .content_type = content_type, .out_fd = -1,
				.has_body = 1, .body = { .mem = "", .fd = -1 } };
	struct s3_reply r = { 0 };
	char *query = s3_canonical_query(p, 1), kb[SHOWN_MAX];
	int rc = -1, idlen;

	if (!query)
		return kiln_err_set(err, KERR_S3_ERROR, "out of memory");
	q.query = query;
	q.payload_sha256 = S3_EMPTY_SHA256;
	if (perform(call, &q, &r, err) < 0)
		goto out;
	if (!ok_status(r.status)) {
		fail_status(call->c, &q, &r, err);
		goto out;
	}
	idlen = r.body ? s3_xml_text(r.body, r.body_len, "UploadId", upload_id, n) : -1;
	if (idlen <= 0 || (size_t)idlen >= n || strchr(upload_id, '?')) {
		kiln_err_set(err, KERR_S3_ERROR, "S3 %s: CreateMultipartUpload reply has no usable UploadId",
			     shown(key, kb));
		goto out;
	}
	rc = 0;
out:
	free(query);
	reply_free(&r);
	return rc;
}

static void xml_escape_append(char *dst, const char *s)
{
	for (dst += strlen(dst); *s; s++) {
		const char *e = *s == '&' ? "&amp;" : *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : NULL;

		if (e)
			dst = stpcpy(dst, e);
		else
			*dst++ = *s;
	}
	*dst = '\0';
}

/* POST ?uploadId=: the part list. S3 may answer 200 with an <Error> body. */
static int mpu_complete(struct s3_call *call, const char *key, const char *upload_id, char (*etags)[S3_MAX_ETAG + 1],
			unsigned nparts, struct kiln_err *err)
{
	struct s3_param p[] = { { "uploadId", upload_id } };
	struct s3_request q = { .method = "POST", .key = key, .content_type = "application/xml", .out_fd = -1,
				.has_body = 1, .body = { .fd = -1 } };
	struct s3_reply r = { 0 };
	/* Per part: fixed tags (~60) + number (5) + an ETag of which every byte may
	 * become "&amp;" (5x). */
	size_t cap = 128 + (size_t)nparts * (80 + 5 * S3_MAX_ETAG);
	char *xml = malloc(cap), *query = s3_canonical_query(p, 1), sha[65], code[64], kb[SHOWN_MAX];
	unsigned i;
	int rc = -1;

	if (!xml || !query) {
		kiln_err_set(err, KERR_S3_ERROR, "out of memory");
		goto out;
	}
	strcpy(xml, "<CompleteMultipartUpload>");
	for (i = 0; i < nparts; i++) {
		sprintf(xml + strlen(xml), "<Part><PartNumber>%u</PartNumber><ETag>", i + 1);
		xml_escape_append(xml, etags[i]);
		strcat(xml, "</ETag></Part>");
	}
	strcat(xml, "</CompleteMultipartUpload>");
	if (sha256_hex(xml, strlen(xml), sha) < 0) {
		kiln_err_set(err, KERR_S3_ERROR, "SHA-256 failed");
		goto out;
	}
	q.query = query;
	q.body.mem = xml;
	q.body.length = strlen(xml);
	q.payload_sha256 = sha;
	if (perform(call, &q, &r, err) < 0)
		goto out;
	if (!ok_status(r.status)) {
		fail_status(call->c, &q, &r, err);
		goto out;
	}
	if (r.body && s3_xml_text(r.body, r.body_len, "Code", code, sizeof(code)) >= 0 &&
	    !strstr(r.body, "<CompleteMultipartUploadResult")) {
		char msg[320] = "";

		s3_xml_text(r.body, r.body_len, "Message", msg, sizeof(msg));
		kiln_err_set(err, KERR_S3_ERROR, "S3 %s: CompleteMultipartUpload failed: %s: %s", shown(key, kb), code,
			     msg);
		goto out;
	}
	rc = 0;
out:
	free(xml);
	free(query);
	reply_free(&r);
	return rc;
}

/* DELETE ?uploadId=: best effort, after a failure (which err already holds). */
static void mpu_abort(struct s3_call *call, const char *key, const char *upload_id)
{
	struct s3_param p[] = { { "uploadId", upload_id } };
	struct s3_request q = { .method = "DELETE", .key = key, .out_fd = -1, .body = { .fd = -1 } };
	struct s3_reply r = { 0 };
	struct kiln_err ignored;

	q.query = s3_canonical_query(p, 1);
	if (q.query)
		perform(call, &q, &r, &ignored);
	free((char *)q.query);
	reply_free(&r);
}

static uint64_t part_size_for(const struct s3_config *c, uint64_t size)
{
	uint64_t part = c->part_size ? c->part_size : S3_PART_SIZE;

	/* Grow the part size (in whole MiB) to stay within 10000 parts. */
	if ((size + part - 1) / part > S3_MAX_PARTS)
		part = ((size + S3_MAX_PARTS - 1) / S3_MAX_PARTS + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
	return part;
}

static int put_multipart(struct s3_call *call, const char *key, int fd, uint64_t size, const char *content_type,
			 EVP_MD_CTX *whole, struct kiln_err *err)
{
	uint64_t part = part_size_for(call->c, size);
	unsigned nparts = (unsigned)((size + part - 1) / part), i;
	char (*etags)[S3_MAX_ETAG + 1] = calloc(nparts ? nparts : 1, sizeof(*etags));
	char upload_id[S3_MAX_UPLOAD_ID + 1], num[16], kb[SHOWN_MAX];
	struct s3_reply r = { 0 };
	struct hash_job job = { .threaded = 0 };
	int rc = -1;

	if (!etags)
		return kiln_err_set(err, KERR_S3_ERROR, "out of memory");
	if (mpu_create(call, key, content_type, upload_id, sizeof(upload_id), err) < 0)
		goto out;
	hash_job_start(&job, fd, 0, size < part ? size : part, whole);
	for (i = 0; i < nparts; i++) {
		uint64_t off = (uint64_t)i * part, len = size - off < part ? size - off : part;
		struct s3_param p[] = { { "partNumber", num }, { "uploadId", upload_id } };
		char *query, sha[65];

		rc = hash_job_wait(&job);
		if (rc < 0) {
			hash_error(key, rc, err);
			goto abort;
		}
		memcpy(sha, job.hex, sizeof(sha));
		if (i + 1 < nparts)
			hash_job_start(&job, fd, (off_t)(off + part),
				       size - (off + part) < part ? size - (off + part) : part, whole);
		snprintf(num, sizeof(num), "%u", i + 1);
		query = s3_canonical_query(p, 2);
		rc = query ? put_region(call, key, query, NULL, fd, (off_t)off, len, sha, &r, err)
			   : kiln_err_set(err, KERR_S3_ERROR, "out of memory");
		free(query);
		if (rc == 0 && (!r.etag[0] || r.etag_too_long))
			rc = kiln_err_set(err, KERR_S3_ERROR, "S3 %s: part %u: the reply has no usable ETag",
					  shown(key, kb), i + 1);
		if (rc < 0)
			goto abort;
		memcpy(etags[i], r.etag, sizeof(etags[i]));
	}
	rc = mpu_complete(call, key, upload_id, etags, nparts, err);
	if (rc == 0)
		goto out;
abort:
	hash_job_wait(&job);
	/* No orphaned parts: they would be stored (and billed) until aborted. */
	mpu_abort(call, key, upload_id);
	rc = -1;
out:
	reply_free(&r);
	free(etags);
	return rc;
}

int s3_put_file(const struct s3_config *c, const char *key, const char *path, const char *content_type,
		char sha256_out[65], uint64_t *bytes_sent, struct kiln_err *err)
{
	uint64_t threshold = c && c->multipart_threshold ? c->multipart_threshold : S3_MULTIPART_THRESHOLD;
	EVP_MD_CTX *whole = NULL;
	struct s3_call call = { 0 };
	struct s3_reply r = { 0 };
	struct stat st;
	int fd = -1, rc = -1;
	char kb[SHOWN_MAX];

	if (check_config(c, err) < 0 || s3_key_check(key, err) < 0 || check_content_type(content_type, err) < 0)
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return kiln_err_set(err, KERR_IO_ERROR, "opening %s: %s", shown(path, kb), strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		kiln_err_set(err, KERR_IO_ERROR, "%s: not a regular file", shown(path, kb));
		goto out;
	}
	whole = EVP_MD_CTX_new();
	if (!whole || !EVP_DigestInit_ex(whole, EVP_sha256(), NULL)) {
		kiln_err_set(err, KERR_S3_ERROR, "out of memory");
		goto out;
	}
	if (call_open(&call, c, err) < 0)
		goto out;
	if ((uint64_t)st.st_size > threshold) {
		rc = put_multipart(&call, key, fd, (uint64_t)st.st_size, content_type, whole, err);
	} else {
		char sha[65];

		rc = sha256_fd_region(fd, 0, (uint64_t)st.st_size, whole, sha);
		rc = rc < 0 ? hash_error(key, rc, err)
			    : put_region(&call, key, NULL, content_type, fd, 0, (uint64_t)st.st_size, sha, &r, err);
	}
	if (rc == 0 && sha256_out && digest_final_hex(whole, sha256_out) < 0)
		rc = kiln_err_set(err, KERR_S3_ERROR, "SHA-256 failed");
out:
	if (bytes_sent)
		*bytes_sent += call.bytes_sent;
	call_close(&call);
	reply_free(&r);
	EVP_MD_CTX_free(whole);
	close(fd);
	return rc;
}

int s3_head(const struct s3_config *c, const char *key, uint64_t *size, struct kiln_err *err)
{
	struct s3_call call;
	struct s3_request q = { .method = "HEAD", .key = key, .out_fd = -1, .body = { .fd = -1 } };
	struct s3_reply r = { 0 };
	curl_off_t cl = -1;
	int rc;

	if (check_config(c, err) < 0 || s3_key_check(key, err) < 0)
		return -1;
	if (call_open(&call, c, err) < 0)
		return -1;
	rc = perform(&call, &q, &r, err);
	if (rc == 0) {
		if (r.status == 404) {
			rc = 0;
		} else if (!ok_status(r.status)) {
			rc = fail_status(c, &q, &r, err);
		} else {
			curl_easy_getinfo(call.h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
			if (size)
				*size = cl >= 0 ? (uint64_t)cl : 0;
			rc = 1;
		}
	}
	call_close(&call);
	reply_free(&r);
	return rc;
}

int s3_list_parse(const char *xml, size_t len, int (*fn)(void *ctx, const char *key), void *ctx, char *token,
		  size_t token_size)
{
	char key[1025], trunc[16];
	const char *p = xml, *end = xml + len;

	if (len > S3_XML_MAX || !memmem(xml, len, "<ListBucketResult", 17))
		return -1;
	for (;;) {
		const char *k = memmem(p, (size_t)(end - p), "<Key>", 5), *ke;
		int n;

		if (!k)
			break;
		ke = memmem(k, (size_t)(end - k), "</Key>", 6);
		if (!ke)
			return -1;
		n = s3_xml_text(k, (size_t)(ke + 6 - k), "Key", key, sizeof(key));
		if (n <= 0 || (size_t)n >= sizeof(key))
			return -1;
		if (fn(ctx, key) != 0)
			return -1;
		p = ke + 6;
	}
	token[0] = '\0';
	if (s3_xml_text(xml, len, "IsTruncated", trunc, sizeof(trunc)) < 0 || strcmp(trunc, "true"))
		return 0;
	{
		int n = s3_xml_text(xml, len, "NextContinuationToken", token, token_size);

		if (n <= 0 || (size_t)n >= token_size)
			return -1;
	}
	return 1;
}

int s3_list(const struct s3_config *c, const char *prefix, int (*fn)(void *ctx, const char *key), void *ctx,
	    struct kiln_err *err)
{
	char token[1024] = "";
	int more = 1, rc = 0;

	if (check_config(c, err) < 0)
		return -1;
	while (more && rc == 0) {
		struct s3_param p[] = { { "list-type", "2" }, { "max-keys", "100" }, { "prefix", prefix },
					{ "continuation-token", token } };
		struct s3_call call;
		struct s3_request q = { .method = "GET", .key = NULL, .out_fd = -1, .body = { .fd = -1 } };
		struct s3_reply r = { 0 };
		char *query = s3_canonical_query(p, token[0] ? 4 : 3);

		if (!query)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		q.query = query;
		if (call_open(&call, c, err) < 0) {
			free(query);
			return -1;
		}
		rc = perform(&call, &q, &r, err);
		if (rc == 0 && !ok_status(r.status))
			rc = fail_status(c, &q, &r, err);
		if (rc == 0) {
			more = r.body ? s3_list_parse(r.body, r.body_len, fn, ctx, token, sizeof(token)) : -1;
			if (more < 0)
				rc = kiln_err_set(err, KERR_S3_ERROR, "S3: listing %s: unreadable or stopped reply", prefix);
		}
		call_close(&call);
		reply_free(&r);
		free(query);
	}
	return rc;
}

int s3_get_file(const struct s3_config *c, const char *key, const char *path, struct kiln_err *err)
{
	struct s3_call call = { 0 };
	struct s3_request q = { .method = "GET", .key = key, .body = { .fd = -1 } };
	struct s3_reply r = { 0 };
	char *tmp = NULL, kb[SHOWN_MAX];
	int fd = -1, rc = -1;

	if (check_config(c, err) < 0 || s3_key_check(key, err) < 0)
		return -1;
	/* Same directory, so the rename is atomic. */
	if (asprintf(&tmp, "%s.s3tmp.XXXXXX", path) < 0)
		return kiln_err_set(err, KERR_S3_ERROR, "out of memory");
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		kiln_err_set(err, KERR_IO_ERROR, "creating %s: %s", shown(tmp, kb), strerror(errno));
		goto out;
	}
	q.out_fd = fd;
	if (call_open(&call, c, err) < 0)
		goto out;
	rc = perform(&call, &q, &r, err);
	if (rc == 0 && !ok_status(r.status))
		rc = fail_status(c, &q, &r, err);
	if (rc == 0 && (fchmod(fd, 0644) < 0 || fsync(fd) < 0 || rename(tmp, path) < 0))
		rc = kiln_err_set(err, KERR_IO_ERROR, "writing %s: %s", shown(path, kb), strerror(errno));
out:
	call_close(&call);
	reply_free(&r);
	if (fd >= 0)
		close(fd);
	if (rc < 0 && fd >= 0)
		unlink(tmp);
	free(tmp);
	return rc;
}

int s3_get_fd(const struct s3_config *c, const char *key, int fd, struct kiln_err *err)
{
	struct s3_call call = { 0 };
	struct s3_request q = { .method = "GET", .key = key, .body = { .fd = -1 }, .out_fd = fd };
	struct s3_reply r = { 0 };
	int rc = -1;

	if (check_config(c, err) < 0 || s3_key_check(key, err) < 0)
		return -1;
	if (call_open(&call, c, err) < 0)
		goto out;
	rc = perform(&call, &q, &r, err);
	if (rc == 0 && !ok_status(r.status))
		rc = fail_status(c, &q, &r, err);
out:
	call_close(&call);
	reply_free(&r);
	return rc;
}

int s3_delete(const struct s3_config *c, const char *key, struct kiln_err *err)
{
	struct s3_reply r;
	int rc;

	if (check_config(c, err) < 0 || s3_key_check(key, err) < 0)
		return -1;
	rc = simple(c, "DELETE", key, NULL, NULL, 0, NULL, &r, err);
	if (rc == 0 && !ok_status(r.status) && r.status != 404) {
		struct s3_request q = { .method = "DELETE", .key = key };

		rc = fail_status(c, &q, &r, err);
	}
	reply_free(&r);
	return rc;
}

/* ---- presigned URLs ------------------------------------------------------------ */

/* "host[:port]" as the Host header carries it: default ports dropped. The
 * part of the endpoint after the authority (a path prefix) goes to *path. */
static int endpoint_host(const struct s3_config *c, char *host, size_t n, const char **path, size_t *path_len)
{
	size_t blen, skip = strncmp(c->endpoint, "https://", 8) == 0 ? 8 : 7;
	const char *base = endpoint_base(c, &blen), *a = base + skip, *slash;
	size_t alen;

	slash = memchr(a, '/', blen - skip);
	alen = slash ? (size_t)(slash - a) : blen - skip;
	*path = slash ? slash : "";
	*path_len = slash ? blen - (size_t)(slash - base) : 0;
	if (skip == 7 && alen > 3 && memcmp(a + alen - 3, ":80", 3) == 0)
		alen -= 3;
	else if (skip == 8 && alen > 4 && memcmp(a + alen - 4, ":443", 4) == 0)
		alen -= 4;
	if (alen == 0 || alen >= n)
		return -1;
	memcpy(host, a, alen);
	host[alen] = '\0';
	for (size_t i = 0; i < alen; i++)
		host[i] = (char)tolower((unsigned char)host[i]);
	return 0;
}

/* SigV4 signing key: HMAC chain over date, region, "s3", "aws4_request". */
static int signing_key(const struct s3_config *c, const char *date, unsigned char key[32])
{
	char *k0 = NULL;
	int rc;

	if (asprintf(&k0, "AWS4%s", c->secret_key) < 0)
		return -1;
	rc = hmac_sha256(k0, strlen(k0), date, key);
	OPENSSL_cleanse(k0, strlen(k0));
	free(k0);
	if (rc < 0 || hmac_sha256(key, 32, c->region, key) < 0 || hmac_sha256(key, 32, "s3", key) < 0 ||
	    hmac_sha256(key, 32, "aws4_request", key) < 0)
		return -1;
	return 0;
}

char *s3_presign_get(const struct s3_config *c, const char *key, unsigned expires_s, time_t now,
		     struct kiln_err *err)
{
	char host[256], date[9], stamp[17], cred[512], exp[16], creq_hash[65], sig[65];
	char *ekey = NULL, *query = NULL, *creq = NULL, *sts = NULL, *url = NULL;
	const char *path;
	size_t path_len;
	unsigned char skey[32], mac[32];
	struct tm tm;

	if (check_config(c, err) < 0 || s3_key_check(key, err) < 0)
		return NULL;
	if (expires_s < 1 || expires_s > 604800) {
		kiln_err_set(err, KERR_S3_ERROR, "presigned URL lifetime %u s: must be 1..604800 (7 days)", expires_s);
		return NULL;
	}
	if (endpoint_host(c, host, sizeof(host), &path, &path_len) < 0 || !gmtime_r(&now, &tm)) {
		kiln_err_set(err, KERR_S3_ERROR, "S3 endpoint %.200s: no host", c->endpoint);
		return NULL;
	}
	strftime(date, sizeof(date), "%Y%m%d", &tm);
	strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
	snprintf(cred, sizeof(cred), "%s/%s/%s/s3/aws4_request", c->access_key, date, c->region);
	snprintf(exp, sizeof(exp), "%u", expires_s);
	struct s3_param p[] = {
		{ "X-Amz-Algorithm", "AWS4-HMAC-SHA256" }, { "X-Amz-Credential", cred }, { "X-Amz-Date", stamp },
		{ "X-Amz-Expires", exp },		    { "X-Amz-SignedHeaders", "host" },
	};
	ekey = s3_encode_key(key);
	query = s3_canonical_query(p, sizeof(p) / sizeof(p[0]));
	if (!ekey || !query)
		goto nomem;
	/* Canonical request: method, URI, query, headers, signed headers, payload. */
	if (asprintf(&creq, "GET\n%.*s%s%s/%s\n%s\nhost:%s\n\nhost\nUNSIGNED-PAYLOAD", (int)path_len, path,
		     c->bucket[0] ? "/" : "", c->bucket, ekey, query, host) < 0) {
		creq = NULL;
		goto nomem;
	}
	if (sha256_hex(creq, strlen(creq), creq_hash) < 0)
		goto nomem;
	if (asprintf(&sts, "AWS4-HMAC-SHA256\n%s\n%s/%s/s3/aws4_request\n%s", stamp, date, c->region, creq_hash) < 0) {
		sts = NULL;
		goto nomem;
	}
	if (signing_key(c, date, skey) < 0 || hmac_sha256(skey, 32, sts, mac) < 0)
		goto nomem;
	OPENSSL_cleanse(skey, sizeof(skey));
	hex_encode(mac, 32, sig);
	endpoint_base(c, &path_len);
	if (asprintf(&url, "%.*s%s%s/%s?%s&X-Amz-Signature=%s", (int)path_len, c->endpoint,
		     c->bucket[0] ? "/" : "", c->bucket, ekey, query, sig) < 0) {
		url = NULL;
		goto nomem;
	}
	goto out;
nomem:
	kiln_err_set(err, KERR_S3_ERROR, "out of memory signing the URL");
out:
	free(ekey);
	free(query);
	free(creq);
	free(sts);
	return url;
}
