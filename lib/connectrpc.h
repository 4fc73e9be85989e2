/* connectrpc: the parts of the Connect RPC protocol (connectrpc.com) that
 * kiln's E2B-compatible envd speaks, JSON codec only: the 5-byte envelope of
 * streaming requests and answers (1 flag byte, 4-byte big-endian length),
 * the end-of-stream message, error codes with their HTTP statuses, and the
 * Connect-Timeout-Ms header. No I/O; the envelope parser is fuzzed. */
#ifndef KILN_CONNECTRPC_H
#define KILN_CONNECTRPC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "buf.h"

#define CONNECT_ENV_HDR 5
#define CONNECT_FLAG_COMPRESSED 0x01u
#define CONNECT_FLAG_END 0x02u

/* Connect's error codes (the numbers are gRPC's). 0 is "no error". */
enum connect_code {
	CONNECT_OK = 0,
	CONNECT_CANCELED = 1,
	CONNECT_UNKNOWN = 2,
	CONNECT_INVALID_ARGUMENT = 3,
	CONNECT_DEADLINE_EXCEEDED = 4,
	CONNECT_NOT_FOUND = 5,
	CONNECT_ALREADY_EXISTS = 6,
	CONNECT_PERMISSION_DENIED = 7,
	CONNECT_RESOURCE_EXHAUSTED = 8,
	CONNECT_FAILED_PRECONDITION = 9,
	CONNECT_ABORTED = 10,
	CONNECT_OUT_OF_RANGE = 11,
	CONNECT_UNIMPLEMENTED = 12,
	CONNECT_INTERNAL = 13,
	CONNECT_UNAVAILABLE = 14,
	CONNECT_DATA_LOSS = 15,
	CONNECT_UNAUTHENTICATED = 16,
};

/* "invalid_argument", ... ("ok" for CONNECT_OK). */
const char *connect_code_name(enum connect_code c);
/* The HTTP status a unary error answer carries (Connect's table:
 * connectrpc.com/docs/protocol#error-codes). */
unsigned connect_code_status(enum connect_code c);
/* A code from a negative errno: -ENOENT not_found, -EEXIST already_exists,
 * -EACCES/-EPERM permission_denied, -EINVAL/-ENOTDIR/-EISDIR/-ENAMETOOLONG
 * invalid_argument, -ECANCELED canceled, -ETIMEDOUT deadline_exceeded,
 * -ENOSPC/-EDQUOT resource_exhausted, -ESRCH not_found, else internal. */
enum connect_code connect_code_from_errno(int neg_errno);

/* Parse one envelope at the start of buf (len bytes). Returns the bytes it
 * occupies (5 + message length) and sets *flags, *msg, *msg_len (pointing
 * into buf); 0 when more bytes are needed; -EMSGSIZE when the declared
 * length passes max; -EPROTO for flag bits other than COMPRESSED and END.
 * A COMPRESSED message is returned as such: the caller refuses it (kiln
 * announces no compression). */
ssize_t connect_env_parse(const uint8_t *buf, size_t len, size_t max, uint8_t *flags, const uint8_t **msg,
			  size_t *msg_len);

/* Append one envelope (flags, then msg) to b. 0 or -ENOMEM. */
int connect_env_append(struct buf *b, uint8_t flags, const void *msg, size_t len);
/* Append a JSON message as one envelope (flags 0). 0, -ENOMEM or -EINVAL. */
int connect_env_append_json(struct buf *b, const json_t *j);
/* Append the end-of-stream envelope: `{}` for CONNECT_OK, else
 * `{"error":{"code":NAME,"message":msg}}`. */
int connect_end_append(struct buf *b, enum connect_code c, const char *msg);

/* `{"code":NAME,"message":msg}`, the body of a unary error answer (new
 * reference, NULL on ENOMEM). */
json_t *connect_error_json(enum connect_code c, const char *msg);

/* The Connect-Timeout-Ms header: NULL/absent gives 0 (no deadline); 1-10
 * ASCII digits give the milliseconds; anything else -EINVAL. */
int64_t connect_timeout_ms(const char *value);

/* Standard padded base64 (protobuf JSON's `bytes`): encode into b (appended);
 * decode a string into a fresh malloc'd buffer (*out, *n; protobuf JSON
 * decoders accept both the standard and the URL-safe alphabet, with or
 * without padding), at most max bytes decoded: 0, -EINVAL or -EMSGSIZE. */
int connect_b64_append(struct buf *b, const void *p, size_t n);
int connect_b64_decode(const char *s, size_t max, uint8_t **out, size_t *n);

#endif
