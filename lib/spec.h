/* spec: parse and validate a task spec, the JSON document that says what to
 * run in a sandbox (code or argv, input files, env, cwd, limits, network).
 * The same JSON is the body of the HTTP API's task request. */
#ifndef KILN_SPEC_H
#define KILN_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Whole JSON document. Base64 costs 4/3 of the 64 MiB of file data, plus the
 * code and some room for JSON syntax and escapes. */
#define SPEC_MAX_JSON        (128u << 20)
/* Objects, arrays and ',' outside strings. jansson spends ~100 bytes on each
 * value, so 128 MiB of "[]," would cost gigabytes before any check of ours
 * ran; the largest valid spec (1000 files, 1024 argv, 1024 env) has ~6100. */
#define SPEC_MAX_JSON_NODES  16384

#define SPEC_MAX_CODE        (1u << 20)  /* bytes of "code" */
#define SPEC_MAX_ARGS        1024        /* entries of "argv" */
#define SPEC_MAX_ARGV_BYTES  (64u << 10) /* sum over argv of strlen + 1 */
#define SPEC_MAX_FILES       1000        /* entries of "files" (not counting the code file) */
#define SPEC_MAX_FILE_BYTES  (64u << 20) /* sum of decoded file sizes (not counting the code) */
#define SPEC_MAX_ENV         1024        /* entries of "env" */
#define SPEC_MAX_ENV_KEY     256         /* bytes of one env name */
#define SPEC_MAX_ENV_BYTES   (64u << 10) /* sum over env of strlen("K=V") + 1 */
/* argv, env and cwd travel in one PROTO_EXEC message; this much of its
 * payload is kept free for what the host adds (PATH, HOME, ...). A spec that
 * has both argv and env near their own bounds can fail this combined check. */
#define SPEC_EXEC_RESERVE    4096

#define SPEC_DEFAULT_MODE    0644
#define SPEC_MAX_MODE        0777        /* no setuid/setgid/sticky bits */
#define SPEC_DEFAULT_CWD     "/work"
/* "template": 1-63 bytes of [a-z0-9._-], starting with a letter or digit. */
#define SPEC_MAX_TEMPLATE_NAME 63

#define SPEC_MIN_VCPUS       1
#define SPEC_MAX_VCPUS       16
#define SPEC_DEFAULT_VCPUS   1
#define SPEC_MIN_MEMORY_MIB  128
#define SPEC_MAX_MEMORY_MIB  16384
#define SPEC_DEFAULT_MEMORY_MIB 256
#define SPEC_MIN_TIMEOUT_S   1
#define SPEC_MAX_TIMEOUT_S   86400
#define SPEC_DEFAULT_TIMEOUT_S 30
#define SPEC_MIN_OUTPUT_MIB  1
#define SPEC_MAX_OUTPUT_MIB  4096
#define SPEC_DEFAULT_OUTPUT_MIB 64

/* With "language" + "code", the code is delivered as this file (appended as
 * the last entry of files, mode 0644) and run with a fixed argv. The /kiln
 * tree is reserved, so user files can never collide with it. */
#define SPEC_RESERVED_DIR    "/kiln"
#define SPEC_CODE_PATH_PY    "/kiln/code/main.py"
#define SPEC_CODE_PATH_SH    "/kiln/code/main.sh"

struct spec_file {
	char *path;          /* absolute, checked with proto_abspath_ok() */
	unsigned char *data; /* decoded content; never NULL, even when size is 0 */
	size_t size;
	uint32_t mode;       /* 0 .. 0777 */
};

enum spec_language { SPEC_LANG_NONE, SPEC_LANG_PYTHON, SPEC_LANG_BASH, SPEC_LANG_SH };

/* Network policy ("network": {"egress": "allow", "allow": [...]}): each rule
 * lets the sandbox reach one destination on a port or port range, over TCP
 * and UDP alike. IPv4 only. */
#define SPEC_MAX_NET_RULES      64  /* entries of "network.allow" */
#define SPEC_MAX_NET_RULE_BYTES 300 /* bytes of one entry as written */
#define SPEC_MAX_NET_HOST       253 /* bytes of a host name or wildcard suffix */
/* Room for spec_net_rule_format()'s longest output ("*." + a 253-byte suffix
 * + ":65535-65535") and its NUL. */
#define SPEC_NET_RULE_TEXT      272

/* CIDR: "A.B.C.D/P:PORT" or "A.B.C.D:PORT" (= /32). HOST: "name.example:PORT",
 * that name only. WILDCARD: "*.example.org:PORT", names with at least one
 * more label in front of the suffix, never the suffix itself. */
enum spec_net_kind { SPEC_NET_CIDR, SPEC_NET_HOST, SPEC_NET_WILDCARD };

struct spec_net_rule {
	enum spec_net_kind kind;
	uint32_t addr;                    /* CIDR: network address, host byte order, host bits zero */
	uint8_t prefix;                   /* CIDR: 0..32 */
	char host[SPEC_MAX_NET_HOST + 1]; /* HOST: the name; WILDCARD: the suffix after "*."; lower-case */
	uint16_t port_lo, port_hi;        /* 1..65535, port_lo <= port_hi */
};

struct task_spec {
	enum spec_language language; /* SPEC_LANG_NONE with "argv" */
	char *code;                  /* NUL-terminated; NULL with "argv" */
	size_t code_len;
	char **argv;                 /* argc entries + NULL; from language+code or "argv" */
	size_t argc;
	struct spec_file *files;     /* NULL when nfiles is 0 */
	size_t nfiles;
	char **env;                  /* "K=V", nenv entries + NULL; never NULL itself */
	size_t nenv;
	char *cwd;                   /* default SPEC_DEFAULT_CWD */
	int cwd_set;                 /* "cwd" was given (a template's workdir applies otherwise) */
	char *template_name;         /* "template": a template name, NULL when absent (the default) */
	uint32_t vcpus, memory_mib, timeout_s, output_mib;
	int egress;                       /* 0: "none" (no NIC at all), 1: "allow" */
	struct spec_net_rule *net_rules;  /* nnet_rules entries (NULL with egress 0) */
	size_t nnet_rules;                /* 0 with egress 0, else 0..SPEC_MAX_NET_RULES, all distinct */
};

/*
 * Parse and validate the spec in json[0..len) (need not be NUL-terminated).
 *
 * Exactly one of "code" and "argv" is required. "language" is required with
 * "code" and rejected with "argv": there argv[0] names the program, and a
 * language that did nothing would only mislead. Unknown keys anywhere, null
 * values and duplicate keys are errors; absent optional keys take defaults.
 * File contents are standard base64 (RFC 4648 alphabet, padded to a multiple
 * of 4, no whitespace). "network.egress" is "none" (the default; "allow" must
 * then be absent) or "allow" with 0..SPEC_MAX_NET_RULES distinct rules in
 * "network.allow"; an error in a rule names it, e.g. network.allow[2]: "...": ...
 *
 * Returns 0 with *out filled (all memory owned by *out, release it with
 * spec_free()), or -1 with err set (code "invalid_spec", the message naming
 * the field by its JSON path, e.g. "files[2].path: ...") and *out zeroed.
 * Reentrant; no global state.
 */
int spec_parse(const char *json, size_t len, struct task_spec *out, struct kiln_err *err);

/* 0 when name is a valid template name (see SPEC_MAX_TEMPLATE_NAME), else -1
 * with err set (code "invalid_spec", field `field`). */
int spec_template_name_check(const char *name, const char *field, struct kiln_err *err);

/* Count '[', '{' and ',' outside strings in p[0..n), stopping once past max
 * (see SPEC_MAX_JSON_NODES): for callers that parse a body that embeds a spec
 * before spec_parse() does, so that they apply the same bound first.
 * Malformed JSON may be miscounted; jansson rejects it anyway. */
size_t spec_json_nodes(const char *p, size_t n, size_t max);

/* Free everything a successful spec_parse() allocated and zero *s. Safe on a
 * zeroed struct and when called twice. */
void spec_free(struct task_spec *s);

/* The rule in its normalized text form ("203.0.113.0/24:443",
 * "203.0.113.7:80" for a /32, "example.org:443", "*.example.org:8000-8100"),
 * which spec_parse() accepts back as the same rule. Writes at most cap bytes
 * including the NUL (SPEC_NET_RULE_TEXT always suffices); truncates beyond.
 * Reentrant. */
void spec_net_rule_format(const struct spec_net_rule *r, char *out, size_t cap);

/* A volume's mount point in the guest (kiln-api and kiln-host apply the
 * same rule): absolute, normalised (no "//", ".", ".." or trailing '/'), at
 * most SPEC_VOLUME_PATH_MAX bytes, no control characters, not "/" and not
 * under /proc, /sys or /dev. */
#define SPEC_VOLUME_PATH_MAX 255

/* A drain's deadline (kiln admin drain, kiln-host drain, both hosts' and
 * kiln-api's endpoints): 1 s to a week. */
#define SPEC_DRAIN_DEADLINE_MAX_S 604800
int spec_volume_path_ok(const char *path);
/* Path a is b, or under it (component-wise). */
int spec_path_within(const char *a, const char *b);

#endif
