/* connect_call: what a Connect call to envd is before any of it is read:
 * its kind, from one table of envd's methods (unary, server-streaming,
 * client-streaming: E2B's envd process.proto and filesystem.proto), and
 * whether its Content-Type is the one Connect's JSON codec gives that kind.
 * kiln-api's relay (which counts every stream against max_streams) and
 * kiln-host's envd endpoints (which serve them) both decide here, so that
 * the two cannot disagree about what is a stream. Pure; the Content-Type
 * parser reads client bytes and is fuzzed (fuzz_connect_call). */
#ifndef KILN_CONNECT_CALL_H
#define KILN_CONNECT_CALL_H

#include <stddef.h>

enum connect_kind {
	CONNECT_KIND_NONE = 0,       /* no method of envd's */
	CONNECT_KIND_UNARY,
	CONNECT_KIND_SERVER_STREAM,  /* process.Process/Start, Connect; filesystem.Filesystem/WatchDir */
	CONNECT_KIND_CLIENT_STREAM,  /* process.Process/StreamInput */
};

/* Whether a call of kind is a stream (either direction): one Connect
 * envelope in, held open, application/connect+... on the wire. */
static inline int connect_kind_streams(enum connect_kind k)
{
	return k == CONNECT_KIND_SERVER_STREAM || k == CONNECT_KIND_CLIENT_STREAM;
}

/* The kind of service's method (exact, case-sensitive names as Connect's
 * paths carry them: "process.Process", "Start"); CONNECT_KIND_NONE for a
 * method envd does not have. NULL arguments: NONE. */
enum connect_kind connect_call_kind(const char *service, const char *method);

/* The same for a request path "/SERVICE/METHOD" (no query, nothing after
 * the method): NONE for anything else. */
enum connect_kind connect_call_kind_path(const char *path);

/* What a Content-Type value names, read as RFC 9110's media-type: type and
 * subtype compared without regard to case, optional whitespace and
 * parameters (token=token or token="quoted") allowed; a charset parameter
 * other than utf-8 makes a Connect type OTHER (Connect's JSON is UTF-8). */
enum connect_media {
	CONNECT_MEDIA_INVALID = -1,  /* NULL, empty, or not a media-type by the grammar */
	CONNECT_MEDIA_OTHER = 0,     /* a media type, none of Connect's */
	CONNECT_MEDIA_JSON,          /* application/json: unary, JSON codec */
	CONNECT_MEDIA_PROTO,         /* application/proto: unary, binary codec */
	CONNECT_MEDIA_STREAM_JSON,   /* application/connect+json */
	CONNECT_MEDIA_STREAM_PROTO,  /* application/connect+proto */
};
enum connect_media connect_call_media(const char *content_type);

/* The Content-Type kiln takes for a call of kind: "application/json" for
 * unary, "application/connect+json" for streams (kiln speaks Connect's JSON
 * codec only); NULL for CONNECT_KIND_NONE. */
const char *connect_call_media_want(enum connect_kind kind);

/* Whether content_type (the request's header, NULL when absent) is
 * connect_call_media_want(kind) by connect_call_media: 0 yes; -1 no, with
 * why (a message for the 415 answer, NUL-terminated in why_size bytes,
 * quoting at most 60 printable characters of the header). */
int connect_call_check_media(enum connect_kind kind, const char *content_type, char *why, size_t why_size);

#endif
