/* connectrpc: Connect protocol pieces for kiln's envd (lib/connectrpc.h): the
 * streaming envelope, end-of-stream and error messages, code <-> HTTP status,
 * the timeout header, and protobuf JSON's base64. The envelope parser reads
 * bytes from clients and is fuzzed (fuzz_connect). */
#include "connectrpc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const code_names[] = {
	[CONNECT_OK] = "ok",
	[CONNECT_CANCELED] = "canceled",
	[CONNECT_UNKNOWN] = "unknown",
	[CONNECT_INVALID_ARGUMENT] = "invalid_argument",
	[CONNECT_DEADLINE_EXCEEDED] = "deadline_exceeded",
	[CONNECT_NOT_FOUND] = "not_found",
	[CONNECT_ALREADY_EXISTS] = "already_exists",
	[CONNECT_PERMISSION_DENIED] = "permission_denied",
	[CONNECT_RESOURCE_EXHAUSTED] = "resource_exhausted",
	[CONNECT_FAILED_PRECONDITION] = "failed_precondition",
	[CONNECT_ABORTED] = "aborted",
	[CONNECT_OUT_OF_RANGE] = "out_of_range",
	[CONNECT_UNIMPLEMENTED] = "unimplemented",
	[CONNECT_INTERNAL] = "internal",
	[CONNECT_UNAVAILABLE] = "unavailable",
	[CONNECT_DATA_LOSS] = "data_loss",
	[CONNECT_UNAUTHENTICATED] = "unauthenticated",
};

const char *connect_code_name(enum connect_code c)
{
	if ((unsigned)c >= sizeof(code_names) / sizeof(code_names[0]))
		return "unknown";
	return code_names[c];
}

unsigned connect_code_status(enum connect_code c)
{
	switch (c) {
	case CONNECT_OK:
		return 200;
	case CONNECT_CANCELED:
		return 499;
	case CONNECT_INVALID_ARGUMENT:
	case CONNECT_FAILED_PRECONDITION:
	case CONNECT_OUT_OF_RANGE:
		return 400;
	case CONNECT_DEADLINE_EXCEEDED:
		return 504;
	case CONNECT_NOT_FOUND:
		return 404;
	case CONNECT_ALREADY_EXISTS:
	case CONNECT_ABORTED:
		return 409;
	case CONNECT_PERMISSION_DENIED:
		return 403;
	case CONNECT_RESOURCE_EXHAUSTED:
		return 429;
	case CONNECT_UNIMPLEMENTED:
		return 501;
	case CONNECT_UNAVAILABLE:
		return 503;
	case CONNECT_UNAUTHENTICATED:
		return 401;
	default:
		return 500;
	}
}

enum connect_code connect_code_from_errno(int e)
{
	switch (e) {
	case -ENOENT:
	case -ESRCH:
		return CONNECT_NOT_FOUND;
	case -EEXIST:
	case -ENOTEMPTY:
		return CONNECT_ALREADY_EXISTS;
	case -EACCES:
	case -EPERM:
	case -EROFS:
		return CONNECT_PERMISSION_DENIED;
	case -EINVAL:
	case -ENOTDIR:
	case -EISDIR:
	case -ENAMETOOLONG:
	case -ELOOP:
	case -EXDEV:
		return CONNECT_INVALID_ARGUMENT;
	case -ECANCELED:
		return CONNECT_CANCELED;
	case -ETIMEDOUT:
		return CONNECT_DEADLINE_EXCEEDED;
	case -ENOSPC:
	case -EDQUOT:
	case -EMFILE:
	case -ENFILE:
	case -EAGAIN:
		return CONNECT_RESOURCE_EXHAUSTED;
	default:
		return CONNECT_INTERNAL;
	}
}

ssize_t connect_env_parse(const uint8_t *buf, size_t len, size_t max, uint8_t *flags, const uint8_t **msg,
			  size_t *msg_len)
{
	uint32_t n;

	if (len < CONNECT_ENV_HDR)
		return 0;
	if (buf[0] & ~(CONNECT_FLAG_COMPRESSED | CONNECT_FLAG_END))
		return -EPROTO;
	n = (uint32_t)buf[1] << 24 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 8 | (uint32_t)buf[4];
	if (n > max)
		return -EMSGSIZE;
	if (len - CONNECT_ENV_HDR < n)
		return 0;
	*flags = buf[0];
	*msg = buf + CONNECT_ENV_HDR;
	*msg_len = n;
	return CONNECT_ENV_HDR + (ssize_t)n;
}

int connect_env_append(struct buf *b, uint8_t flags, const void *msg, size_t len)
{
	uint8_t h[CONNECT_ENV_HDR];
	int rc;

	if (len > UINT32_MAX)
		return -EINVAL;
	h[0] = flags;
	h[1] = (uint8_t)(len >> 24);
	h[2] = (uint8_t)(len >> 16);
	h[3] = (uint8_t)(len >> 8);
	h[4] = (uint8_t)len;
	rc = buf_reserve(b, sizeof(h) + len);
	if (rc < 0)
		return rc;
	buf_add(b, h, sizeof(h));
	return len ? buf_add(b, msg, len) : 0;
}

int connect_env_append_json(struct buf *b, const json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	int rc;

	if (!s)
		return -EINVAL;
	rc = connect_env_append(b, 0, s, strlen(s));
	free(s);
	return rc;
}

json_t *connect_error_json(enum connect_code c, const char *msg)
{
	return json_pack("{s:s, s:s}", "code", connect_code_name(c), "message", msg ? msg : "");
}

int connect_end_append(struct buf *b, enum connect_code c, const char *msg)
{
	json_t *j;
	char *s;
	int rc;

	if (c == CONNECT_OK)
		return connect_env_append(b, CONNECT_FLAG_END, "{}", 2);
	j = json_pack("{s:o}", "error", connect_error_json(c, msg));
	if (!j)
		return -ENOMEM;
	s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!s)
		return -ENOMEM;
	rc = connect_env_append(b, CONNECT_FLAG_END, s, strlen(s));
	free(s);
	return rc;
}

int64_t connect_timeout_ms(const char *v)
{
	int64_t ms = 0;
	size_t i;

	if (!v)
		return 0;
	/* The protocol allows at most 10 digits; no sign, no spaces. */
	for (i = 0; v[i]; i++) {
		if (i >= 10 || v[i] < '0' || v[i] > '9')
			return -EINVAL;
		ms = ms * 10 + (v[i] - '0');
	}
	return i ? ms : -EINVAL;
}

/* ---- base64 ------------------------------------------------------------- */

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int connect_b64_append(struct buf *b, const void *src, size_t n)
{
	const uint8_t *p = src;
	char *o;
	size_t i, out = (n + 2) / 3 * 4;
	int rc = buf_reserve(b, out);

	if (rc < 0)
		return rc;
	o = b->p + b->len;
	for (i = 0; i + 2 < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
		*o++ = b64_alphabet[v >> 18];
		*o++ = b64_alphabet[(v >> 12) & 63];
		*o++ = b64_alphabet[(v >> 6) & 63];
		*o++ = b64_alphabet[v & 63];
	}
	if (i < n) {
		uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
		*o++ = b64_alphabet[v >> 18];
		*o++ = b64_alphabet[(v >> 12) & 63];
		*o++ = i + 1 < n ? b64_alphabet[(v >> 6) & 63] : '=';
		*o++ = '=';
	}
	b->len += out;
	b->p[b->len] = '\0';
	return 0;
}

/* Both alphabets: '+' or '-' is 62, '/' or '_' is 63. */
static int b64_value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+' || c == '-')
		return 62;
	if (c == '/' || c == '_')
		return 63;
	return -1;
}

int connect_b64_decode(const char *s, size_t max, uint8_t **out, size_t *n)
{
	size_t len = strlen(s), pad = 0, i, o = 0, full;
	uint32_t acc = 0;
	unsigned bits = 0;
	uint8_t *p;

	*out = NULL;
	*n = 0;
	while (pad < 2 && len > 0 && s[len - 1] == '=') {
		len--;
		pad++;
	}
	/* With padding the length must be a multiple of 4; without, a
	 * remainder of 1 can hold no whole byte. */
	if ((pad && (len + pad) % 4) || len % 4 == 1)
		return -EINVAL;
	full = len / 4 * 3 + (len % 4 ? len % 4 - 1 : 0);
	if (full > max)
		return -EMSGSIZE;
	p = malloc(full ? full : 1);
	if (!p)
		return -ENOMEM;
	for (i = 0; i < len; i++) {
		int v = b64_value((unsigned char)s[i]);
		if (v < 0) {
			free(p);
			return -EINVAL;
		}
		acc = acc << 6 | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			p[o++] = (uint8_t)(acc >> bits);
			acc &= (1u << bits) - 1;
		}
	}
	*out = p;
	*n = o;
	return 0;
}
