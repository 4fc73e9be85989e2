/* err: kiln's one table of error codes (enum, wire string, HTTP status) and
 * the small error record higher layers carry up to the user; its code and
 * message become the HTTP APIs' JSON error {"error":{"code","message"}}
 * (docs/api.md, "Errors"). Low-level code returns negative errno instead and
 * leaves the wording to its caller.
 *
 * A code is an enum kiln_errc, so a misspelt code does not compile. Each row
 * of KILN_ERRORS says the code's wire string and the HTTP status an answer
 * carrying it has, as docs/api.md documents it for kiln-host and kiln-api.
 * The reply helpers take the status from here; a call site names a status
 * only when it relays another server's answer. Two codes carry a different
 * status in kiln-api's answers, at one documented relay site each (kiln-api
 * translates its host's answer; tests/unit/test_err.c checks the list):
 *   host_error   500 from kiln-host (its own failure); kiln-api answers 502
 *                when a host answered what kiln-host never should
 *   no_snapshot  404 from kiln-host; kiln-api's resume answers 409
 * Codes below "internal" never reach an HTTP answer as such: they name
 * failures in task results, logs and the command-line tools (500 if one
 * ever did, as every unmapped code was before the table). */
#ifndef KILN_ERR_H
#define KILN_ERR_H

/* KERR(ENUM, "wire_string", http_status): KERR_ENUM in enum kiln_errc. */
#define KILN_ERRORS                                                                                  \
	/* requests (docs/api.md, kiln-api "Errors" and kiln-host "Sessions") */                     \
	KERR(INVALID_JSON, "invalid_json", 400)                                                      \
	KERR(INVALID_SPEC, "invalid_spec", 400)                                                      \
	KERR(INVALID_REQUEST, "invalid_request", 400)                                                \
	KERR(INVALID_RECIPE, "invalid_recipe", 400)                                                  \
	KERR(OVER_QUOTA, "over_quota", 400)                                                          \
	KERR(EGRESS_NOT_ALLOWED, "egress_not_allowed", 400)                                          \
	KERR(DESTINATION_FORBIDDEN, "destination_forbidden", 400)                                    \
	KERR(UNAUTHORIZED, "unauthorized", 401)                                                      \
	KERR(FORBIDDEN, "forbidden", 403)                                                            \
	KERR(NOT_FOUND, "not_found", 404)                                                            \
	KERR(NO_SNAPSHOT, "no_snapshot", 404)                                                        \
	KERR(METHOD_NOT_ALLOWED, "method_not_allowed", 405)                                          \
	KERR(IDEMPOTENCY_CONFLICT, "idempotency_conflict", 409)                                      \
	KERR(NOT_CANCELLABLE, "not_cancellable", 409)                                                \
	KERR(DUPLICATE, "duplicate", 409)                                                            \
	KERR(BUSY, "busy", 409)                                                                      \
	KERR(NOT_RUNNING, "not_running", 409)                                                        \
	KERR(VOLUME_ATTACHED, "volume_attached", 409)                                                \
	KERR(VOLUME_BUSY, "volume_busy", 409)                                                        \
	KERR(CONFLICT, "conflict", 409)                                                              \
	KERR(NOT_PAUSED, "not_paused", 409)                                                          \
	KERR(INCOMPATIBLE_SNAPSHOT, "incompatible_snapshot", 409)                                    \
	KERR(NO_EXEC, "no_exec", 409)                                                                \
	KERR(PORTS_UNSUPPORTED, "ports_unsupported", 409)                                            \
	KERR(NO_NETWORK, "no_network", 409)                                                          \
	KERR(NO_INTERPRETER, "no_interpreter", 409)                                                  \
	KERR(TEMPLATE_NOT_READY, "template_not_ready", 409)                                          \
	KERR(TEMPLATE_IN_USE, "template_in_use", 409)                                                \
	KERR(CANCELLED, "cancelled", 409)                                                            \
	KERR(TOO_LARGE, "too_large", 413)                                                            \
	KERR(SNAPSHOT_CORRUPT, "snapshot_corrupt", 422)                                              \
	KERR(INVALID_IMAGE, "invalid_image", 422)                                                    \
	KERR(BUILD_FAILED, "build_failed", 422)                                                      \
	KERR(BUILD_TIMEOUT, "build_timeout", 422)                                                    \
	KERR(DESTINATION_REFUSED, "destination_refused", 422)                                        \
	KERR(RATE_LIMITED, "rate_limited", 429)                                                      \
	KERR(QUEUE_FULL, "queue_full", 429)                                                          \
	KERR(QUOTA_EXCEEDED, "quota_exceeded", 429)                                                  \
	KERR(TOO_MANY_STREAMS, "too_many_streams", 429)                                              \
	KERR(HOST_ERROR, "host_error", 500)                                                          \
	KERR(VM_ERROR, "vm_error", 500)                                                              \
	KERR(S3_AUTH, "s3_auth", 502)                                                                \
	KERR(S3_ERROR, "s3_error", 502)                                                              \
	KERR(S3_NOT_FOUND, "s3_not_found", 502)                                                      \
	KERR(S3_KEY_OUTSIDE, "s3_key_outside", 502)                                                  \
	KERR(PORT_CLOSED, "port_closed", 502)                                                        \
	KERR(NO_HOST_FITS, "no_host_fits", 503)                                                      \
	KERR(NO_CAPACITY, "no_capacity", 503)                                                        \
	KERR(NO_HOST, "no_host", 503)                                                                \
	KERR(HOST_UNAVAILABLE, "host_unavailable", 503)                                              \
	KERR(NO_S3, "no_s3", 503)                                                                    \
	KERR(EGRESS_UNAVAILABLE, "egress_unavailable", 503)                                          \
	KERR(S3_UNAVAILABLE, "s3_unavailable", 503)                                                  \
	KERR(INPUT_FULL, "input_full", 503)                                                          \
	KERR(NO_TEMPLATE, "no_template", 503)                                                        \
	KERR(UNAVAILABLE, "unavailable", 503)                                                        \
	KERR(DESTINATIONS_DISABLED, "destinations_disabled", 503)                                    \
	KERR(DESTINATION_UNAVAILABLE, "destination_unavailable", 503)                                \
	KERR(INTERNAL, "internal", 500)                                                              \
	/* inside the daemons and tools: task results, logs, exit codes */                           \
	KERR(STORE_ERROR, "store_error", 500)                                                        \
	KERR(IO_ERROR, "io_error", 500)                                                              \
	KERR(NET_ERROR, "net_error", 500)                                                            \
	KERR(GUEST_ERROR, "guest_error", 500)                                                        \
	KERR(HOST_MEMORY, "host_memory", 503)                                                        \
	KERR(SNAPSHOT_ERROR, "snapshot_error", 500)                                                  \
	KERR(SNAPSHOT_MISSING, "snapshot_missing", 500)                                              \
	KERR(IMAGE_MISSING, "image_missing", 500)                                                    \
	KERR(KVM_UNAVAILABLE, "kvm_unavailable", 500)                                                \
	KERR(EGRESS_DISABLED, "egress_disabled", 500)                                                \
	KERR(TIMEOUT, "timeout", 500)                                                                \
	KERR(INTERRUPTED, "interrupted", 500)                                                        \
	KERR(INPUT, "input", 500)                                                                    \
	KERR(HOST_UNREACHABLE, "host_unreachable", 500)                                              \
	KERR(API_ERROR, "api_error", 500)                                                            \
	KERR(CONFIG, "config", 500)                                                                  \
	KERR(LISTEN, "listen", 500)                                                                  \
	KERR(USAGE, "usage", 500)                                                                    \
	KERR(CLI, "cli", 500)                                                                        \
	KERR(HTTP, "http", 500)                                                                      \
	KERR(UNREACHABLE, "unreachable", 500)

enum kiln_errc {
	KERR_NONE = 0, /* not set: a zeroed kiln_err; answered as "internal" */
#define KERR(e, wire, status) KERR_##e,
	KILN_ERRORS
#undef KERR
	KERR_COUNT_
};

struct kiln_err {
	enum kiln_errc errc; /* KERR_NONE until set */
	char code[48];       /* the wire string: kiln_err_name(errc), or the code a
			      * relayed answer carried (kiln_err_relay); read it,
			      * set it only through the calls below */
	char message[512];   /* human-readable, names the offending field */
};

/* The wire string of c ("" for KERR_NONE, "internal" for a value outside the
 * table). Static storage; any thread. */
const char *kiln_err_name(enum kiln_errc c);

/* The HTTP status an answer with code c has (500 for KERR_NONE and values
 * outside the table). Any thread. */
unsigned kiln_err_status(enum kiln_errc c);

/* The code whose wire string is name; KERR_NONE when none is (NULL too). */
enum kiln_errc kiln_err_lookup(const char *name);

/* Whether c is one of S3's (s3_*: lib/s3.h says which means what). */
int kiln_err_is_s3(enum kiln_errc c);

/* Set the code and the message; the message is printf-formatted and
 * truncated to fit. e may be NULL (the error is then dropped). Returns -1 so
 * that callers can write `return kiln_err_set(err, KERR_..., ...);`. The
 * message may be formatted from e's own message. Thread-safe for distinct e. */
int kiln_err_set(struct kiln_err *e, enum kiln_errc c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* As kiln_err_set, for an error another server answered with wire code
 * `wire`: code[] keeps that string as it came (so a relay passes it on
 * unchanged) and errc is its table entry, or `fallback` when wire is unknown.
 * An empty or NULL wire is fallback's. Returns -1. */
int kiln_err_relay(struct kiln_err *e, const char *wire, enum kiln_errc fallback, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Change e's code to c and keep its message (a caller that knows better
 * what kind of failure a callee's message describes). Returns -1. */
int kiln_err_recode(struct kiln_err *e, enum kiln_errc c);

#endif
