/* spec: parser and validator for task specs (see spec.h). The JSON comes
 * straight from an API client and is hostile: every size is bounded before
 * memory is allocated for it, every string is checked for embedded NUL, and
 * every error names the offending field by its JSON path. One file on
 * purpose: one ruleset for one input, every section on the same bounded
 * field readers and path-naming error helpers (fail, get_str, check_keys). */
#include "spec.h"

#include <assert.h>
#include <ctype.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "spec_json.h"

/* The spec is turned into one PROTO_EXEC message; never accept more than it
 * can carry. */
_Static_assert(SPEC_MAX_ARGS <= PROTO_MAX_ARGS, "argv bound exceeds the protocol's");
_Static_assert(SPEC_MAX_ENV <= PROTO_MAX_ENV, "env bound exceeds the protocol's");
_Static_assert(SPEC_EXEC_RESERVE < PROTO_MAX_PAYLOAD, "exec reserve exceeds a frame");

#define SPEC_ERR KERR_INVALID_SPEC

/* Room for the longest JSON path we build: "env." + a name of
 * SPEC_MAX_ENV_KEY bytes, or "files[<size_t>].content_b64". */
#define PATH_BUF (SPEC_MAX_ENV_KEY + 8)

/* Set err to "<path>: <message>" and return -1. */
__attribute__((format(printf, 3, 4)))
static int fail(struct kiln_err *err, const char *path, const char *fmt, ...)
{
	char msg[sizeof(err->message)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return kiln_err_set(err, SPEC_ERR, "%s: %s", path, msg);
}

static int fail_nomem(struct kiln_err *err)
{
	return kiln_err_set(err, KERR_HOST_ERROR, "out of memory while parsing the spec");
}

/* Client-provided strings echoed in an error message (unknown keys, bad
 * enum values) are cut short and reduced to printable ASCII, so a message
 * never carries control bytes or megabytes of input back to the user. */
#define QUOTE_MAX 48
struct quoted {
	char s[QUOTE_MAX * 4 + 4];
};

static const char *quote(struct quoted *q, const char *p, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t i, o = 0;

	for (i = 0; i < n && i < QUOTE_MAX; i++) {
		unsigned char c = (unsigned char)p[i];

		if (c == '"' || c == '\\') {
			q->s[o++] = '\\';
			q->s[o++] = (char)c;
		} else if (c >= 0x20 && c < 0x7f) {
			q->s[o++] = (char)c;
		} else {
			q->s[o++] = '\\';
			q->s[o++] = 'x';
			q->s[o++] = hex[c >> 4];
			q->s[o++] = hex[c & 15];
		}
	}
	if (i < n) {
		memcpy(q->s + o, "...", 3);
		o += 3;
	}
	q->s[o] = '\0';
	return q->s;
}

static const char *json_kind(const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
		return "an integer";
	case JSON_REAL:
		return "a real number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "a boolean";
	case JSON_NULL:
		return "null";
	}
	return "an unknown type";
}

static void *memdup_nul(const void *p, size_t n)
{
	char *s = malloc(n + 1);

	if (s) {
		memcpy(s, p, n);
		s[n] = '\0';
	}
	return s;
}

/* A string without NUL inside. The parser runs with JSON_ALLOW_NUL so that
 * "\u0000" reaches us and the error can name the field; from here on every
 * string is a proper C string. */
static int get_str(json_t *j, const char *path, const char **s, size_t *n, struct kiln_err *err)
{
	if (!json_is_string(j))
		return fail(err, path, "must be a string (got %s)", json_kind(j));
	*s = json_string_value(j);
	*n = json_string_length(j);
	if (memchr(*s, '\0', *n))
		return fail(err, path, "must not contain NUL characters");
	return 0;
}

/* Reject keys outside the NULL-terminated list `known`. Unknown keys are
 * errors rather than ignored: a misspelt "timout_s" must not silently run
 * with the default. */
static int check_keys(json_t *obj, const char *path, const char *const *known, struct kiln_err *err)
{
	const char *key;
	json_t *v;

	json_object_foreach(obj, key, v) {
		char list[256];
		struct quoted q;
		size_t i, o = 0;

		for (i = 0; known[i]; i++)
			if (strcmp(key, known[i]) == 0)
				break;
		if (known[i])
			continue;
		list[0] = '\0';
		for (i = 0; known[i] && o < sizeof(list); i++)
			o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "", known[i]);
		return fail(err, path, "unknown key \"%s\" (expected %s)",
			    quote(&q, key, strlen(key)), list);
	}
	return 0;
}

/* An optional integer in [min, max]; absent keys take def. */
static int get_uint(json_t *parent, const char *key, const char *path, long long min,
		    long long max, uint32_t def, const char *hint, uint32_t *out,
		    struct kiln_err *err)
{
	json_t *j = json_object_get(parent, key);
	long long v;

	if (!j) {
		*out = def;
		return 0;
	}
	if (!json_is_integer(j))
		return fail(err, path, "must be an integer from %lld to %lld%s (got %s)",
			    min, max, hint, json_kind(j));
	v = json_integer_value(j);
	if (v < min || v > max)
		return fail(err, path, "must be an integer from %lld to %lld%s (got %lld)",
			    min, max, hint, v);
	*out = (uint32_t)v;
	return 0;
}

/* path is dir itself or lies below it. */
static int path_under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* ---- files -------------------------------------------------------------- */

static int b64_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '+' || c == '/';
}

/*
 * Strict standard base64 (RFC 4648 section 4): length a multiple of 4, only
 * the alphabet, '=' only as the last one or two bytes. EVP_DecodeBlock() on
 * its own skips surrounding whitespace and counts padding as decoded zero
 * bytes, so the syntax is checked here first and the padding subtracted to
 * get the exact length. Decoded bytes are charged to *budget before anything
 * is allocated.
 */
static int b64_decode(const char *s, size_t n, const char *path, size_t *budget,
		      struct spec_file *f, struct kiln_err *err)
{
	size_t i, pad = 0, full;
	int r;

	if (n % 4)
		return fail(err, path, "must be base64 padded with '=' to a multiple of 4 bytes (got %zu bytes)", n);
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (b64_char(c) && !pad)
			continue;
		if (c == '=' && i >= n - 2) {
			pad++;
			continue;
		}
		if (c >= 0x20 && c < 0x7f)
			return fail(err, path, "is not valid base64 ('%c' at offset %zu)", c, i);
		return fail(err, path, "is not valid base64 (byte 0x%02x at offset %zu)", c, i);
	}
	full = n / 4 * 3;
	if (full - pad > *budget)
		return fail(err, path, "decoded files exceed %u bytes in total", SPEC_MAX_FILE_BYTES);
	/* n <= 4/3 * SPEC_MAX_FILE_BYTES + 4 here, well inside int. */
	f->data = malloc(full + 1);
	if (!f->data)
		return fail_nomem(err);
	r = EVP_DecodeBlock(f->data, (const unsigned char *)s, (int)n);
	if (r < 0 || (size_t)r != full)
		return fail(err, path, "is not valid base64");
	f->size = full - pad;
	*budget -= f->size;
	return 0;
}

static const char *const file_keys[] = { "path", "content_b64", "mode", NULL };
static const char *const reserved_dirs[] = { "/proc", "/sys", "/dev", SPEC_RESERVED_DIR, NULL };

static int parse_file(json_t *j, size_t idx, size_t *budget, struct spec_file *f,
		      struct kiln_err *err)
{
	char path[PATH_BUF];
	struct quoted q;
	json_t *v;
	const char *s;
	size_t n, i;

	snprintf(path, sizeof(path), "files[%zu]", idx);
	if (!json_is_object(j))
		return fail(err, path, "must be an object (got %s)", json_kind(j));
	if (check_keys(j, path, file_keys, err))
		return -1;

	snprintf(path, sizeof(path), "files[%zu].path", idx);
	v = json_object_get(j, "path");
	if (!v)
		return fail(err, path, "is required");
	if (get_str(v, path, &s, &n, err))
		return -1;
	if (proto_abspath_ok(s))
		return fail(err, path, "must be an absolute path without '.' or '..' components "
			    "(no empty components or trailing '/', components of at most 255 bytes, "
			    "at most %d bytes in all)", PROTO_MAX_PATH);
	if (n == 1)
		return fail(err, path, "must name a file, not \"/\"");
	for (i = 0; reserved_dirs[i]; i++)
		if (path_under(s, reserved_dirs[i]))
			return fail(err, path, "\"%s\" is under %s, which is reserved",
				    quote(&q, s, n), reserved_dirs[i]);
	f->path = memdup_nul(s, n);
	if (!f->path)
		return fail_nomem(err);

	snprintf(path, sizeof(path), "files[%zu].mode", idx);
	if (get_uint(j, "mode", path, 0, SPEC_MAX_MODE, SPEC_DEFAULT_MODE,
		     " (0 to 0777 octal; JSON has no octal, so 0644 is written 420)",
		     &f->mode, err))
		return -1;

	snprintf(path, sizeof(path), "files[%zu].content_b64", idx);
	v = json_object_get(j, "content_b64");
	if (!v)
		return fail(err, path, "is required (use \"\" for an empty file)");
	if (!json_is_string(v))
		return fail(err, path, "must be a string (got %s)", json_kind(v));
	return b64_decode(json_string_value(v), json_string_length(v), path, budget, f, err);
}

/* Order paths component by component: '/' sorts before every other byte, so
 * a path is immediately followed by the paths below it. */
struct path_ref {
	const char *path;
	size_t idx;
};

static int path_ref_cmp(const void *a, const void *b)
{
	const struct path_ref *x = a, *y = b;
	const unsigned char *p = (const unsigned char *)x->path;
	const unsigned char *q = (const unsigned char *)y->path;

	for (;; p++, q++) {
		unsigned kp = *p == '/' ? 1 : *p ? *p + 1u : 0;
		unsigned kq = *q == '/' ? 1 : *q ? *q + 1u : 0;

		if (kp != kq)
			return kp < kq ? -1 : 1;
		if (!*p)
			break;
	}
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Every file path must be distinct and none may lie below another: the guest
 * would have to create the same path twice, or one path as both a file and a
 * directory. Sorting keeps this O(n log n) for hostile inputs. */
static int check_file_paths(const struct spec_file *files, size_t n, struct kiln_err *err)
{
	struct path_ref *refs;
	char path[PATH_BUF];
	size_t i;
	int r = 0;

	if (n < 2)
		return 0;
	refs = calloc(n, sizeof(*refs));
	if (!refs)
		return fail_nomem(err);
	for (i = 0; i < n; i++) {
		refs[i].path = files[i].path;
		refs[i].idx = i;
	}
	qsort(refs, n, sizeof(*refs), path_ref_cmp);
	for (i = 0; i + 1 < n; i++) {
		const struct path_ref *a = &refs[i], *b = &refs[i + 1];
		size_t la = strlen(a->path);

		if (strcmp(a->path, b->path) == 0) {
			snprintf(path, sizeof(path), "files[%zu].path", b->idx);
			r = fail(err, path, "duplicates files[%zu].path", a->idx);
			break;
		}
		if (strncmp(a->path, b->path, la) == 0 && b->path[la] == '/') {
			snprintf(path, sizeof(path), "files[%zu].path", b->idx);
			r = fail(err, path, "is below files[%zu].path, which is a file, not a directory",
				 a->idx);
			break;
		}
	}
	free(refs);
	return r;
}

static int parse_files(json_t *j, struct task_spec *out, struct kiln_err *err)
{
	size_t budget = SPEC_MAX_FILE_BYTES;
	size_t i, n;

	if (!j)
		return 0;
	if (!json_is_array(j))
		return fail(err, "files", "must be an array (got %s)", json_kind(j));
	n = json_array_size(j);
	if (n > SPEC_MAX_FILES)
		return fail(err, "files", "must have at most %d entries (got %zu)", SPEC_MAX_FILES, n);
	if (n == 0)
		return 0;
	out->files = calloc(n, sizeof(*out->files));
	if (!out->files)
		return fail_nomem(err);
	for (i = 0; i < n; i++) {
		/* Count the entry first so that spec_free() releases a half-filled one. */
		out->nfiles = i + 1;
		if (parse_file(json_array_get(j, i), i, &budget, &out->files[i], err))
			return -1;
	}
	return check_file_paths(out->files, out->nfiles, err);
}

/* ---- code, argv --------------------------------------------------------- */

static const struct {
	const char *name;
	enum spec_language lang;
	const char *interp, *path;
} languages[] = {
	{ "python", SPEC_LANG_PYTHON, "python3", SPEC_CODE_PATH_PY },
	{ "bash", SPEC_LANG_BASH, "bash", SPEC_CODE_PATH_SH },
	{ "sh", SPEC_LANG_SH, "sh", SPEC_CODE_PATH_SH },
};
#define NLANGUAGES (sizeof(languages) / sizeof(languages[0]))

/* "language": an index into languages[]. */
static int parse_language(json_t *j, size_t *li, struct kiln_err *err)
{
	struct quoted q;
	const char *s;
	size_t n;

	if (get_str(j, "language", &s, &n, err))
		return -1;
	for (*li = 0; *li < NLANGUAGES; (*li)++)
		if (strlen(languages[*li].name) == n && memcmp(languages[*li].name, s, n) == 0)
			return 0;
	return fail(err, "language", "\"%s\" is not supported (one of \"python\", \"bash\", \"sh\")",
		    quote(&q, s, n));
}

/* "language" + "code": the code becomes the last file and argv runs it. */
static int parse_code(size_t li, json_t *jcode, struct task_spec *out, struct kiln_err *err)
{
	struct spec_file *files, *f;
	const char *s;
	size_t n;

	out->language = languages[li].lang;

	if (get_str(jcode, "code", &s, &n, err))
		return -1;
	if (n > SPEC_MAX_CODE)
		return fail(err, "code", "must be at most %u bytes (got %zu)", SPEC_MAX_CODE, n);
	out->code = memdup_nul(s, n);
	if (!out->code)
		return fail_nomem(err);
	out->code_len = n;

	out->argv = calloc(3, sizeof(*out->argv));
	if (!out->argv)
		return fail_nomem(err);
	out->argc = 2;
	out->argv[0] = strdup(languages[li].interp);
	out->argv[1] = strdup(languages[li].path);
	if (!out->argv[0] || !out->argv[1])
		return fail_nomem(err);

	files = realloc(out->files, (out->nfiles + 1) * sizeof(*files));
	if (!files)
		return fail_nomem(err);
	out->files = files;
	f = &files[out->nfiles++];
	memset(f, 0, sizeof(*f));
	f->mode = SPEC_DEFAULT_MODE;
	f->path = strdup(languages[li].path);
	f->data = memdup_nul(out->code, n);
	f->size = n;
	if (!f->path || !f->data)
		return fail_nomem(err);
	return 0;
}

static int parse_argv(json_t *j, struct task_spec *out, struct kiln_err *err)
{
	char path[PATH_BUF];
	size_t i, n, total = 0;

	if (!json_is_array(j))
		return fail(err, "argv", "must be an array of strings (got %s)", json_kind(j));
	n = json_array_size(j);
	if (n < 1 || n > SPEC_MAX_ARGS)
		return fail(err, "argv", "must have 1 to %d entries (got %zu)", SPEC_MAX_ARGS, n);
	out->argv = calloc(n + 1, sizeof(*out->argv));
	if (!out->argv)
		return fail_nomem(err);
	out->argc = n;
	for (i = 0; i < n; i++) {
		const char *s;
		size_t len;

		snprintf(path, sizeof(path), "argv[%zu]", i);
		if (get_str(json_array_get(j, i), path, &s, &len, err))
			return -1;
		if (i == 0 && len == 0)
			return fail(err, path, "must not be empty (it names the program)");
		total += len + 1;
		if (total > SPEC_MAX_ARGV_BYTES)
			return fail(err, "argv", "must total at most %u bytes (counting a NUL after each entry)",
				    SPEC_MAX_ARGV_BYTES);
		out->argv[i] = memdup_nul(s, len);
		if (!out->argv[i])
			return fail_nomem(err);
	}
	return 0;
}

/* ---- env, cwd, limits -------------------------------------------------- */

static int env_name_ok(const char *k, size_t n)
{
	size_t i;

	if (n == 0 || n > SPEC_MAX_ENV_KEY || (k[0] >= '0' && k[0] <= '9'))
		return 0;
	for (i = 0; i < n; i++) {
		char c = k[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
			return 0;
	}
	return 1;
}

static int parse_env(json_t *j, struct task_spec *out, struct kiln_err *err)
{
	char path[PATH_BUF];
	size_t n, total = 0;
	const char *key;
	json_t *v;

	if (j && !json_is_object(j))
		return fail(err, "env", "must be an object of name: string (got %s)", json_kind(j));
	n = j ? json_object_size(j) : 0;
	if (n > SPEC_MAX_ENV)
		return fail(err, "env", "must have at most %d entries (got %zu)", SPEC_MAX_ENV, n);
	out->env = calloc(n + 1, sizeof(*out->env));
	if (!out->env)
		return fail_nomem(err);
	if (!j)
		return 0;
	json_object_foreach(j, key, v) {
		size_t klen = strlen(key), vlen;
		struct quoted q;
		const char *s;
		char *e;

		if (!env_name_ok(key, klen))
			return fail(err, "env", "invalid name \"%s\": must match [A-Za-z_][A-Za-z0-9_]* "
				    "and be at most %d bytes", quote(&q, key, klen), SPEC_MAX_ENV_KEY);
		snprintf(path, sizeof(path), "env.%s", key);
		if (get_str(v, path, &s, &vlen, err))
			return -1;
		total += klen + 1 + vlen + 1;
		if (total > SPEC_MAX_ENV_BYTES)
			return fail(err, "env", "must total at most %u bytes (counting each entry as "
				    "NAME=value plus a NUL)", SPEC_MAX_ENV_BYTES);
		e = malloc(klen + 1 + vlen + 1);
		if (!e)
			return fail_nomem(err);
		memcpy(e, key, klen);
		e[klen] = '=';
		memcpy(e + klen + 1, s, vlen);
		e[klen + 1 + vlen] = '\0';
		out->env[out->nenv++] = e;
	}
	return 0;
}

static int parse_cwd(json_t *j, struct task_spec *out, struct kiln_err *err)
{
	const char *s = SPEC_DEFAULT_CWD;
	size_t n = strlen(s);

	if (j) {
		if (get_str(j, "cwd", &s, &n, err))
			return -1;
		if (proto_abspath_ok(s))
			return fail(err, "cwd", "must be an absolute path without '.' or '..' components "
				    "(no empty components or trailing '/', at most %d bytes)", PROTO_MAX_PATH);
	}
	out->cwd = memdup_nul(s, n);
	out->cwd_set = j != NULL;
	return out->cwd ? 0 : fail_nomem(err);
}

int spec_template_name_check(const char *name, const char *field, struct kiln_err *err)
{
	size_t i, n = strlen(name);

	if (n == 0 || n > SPEC_MAX_TEMPLATE_NAME || !(islower((unsigned char)name[0]) || isdigit((unsigned char)name[0])))
		return fail(err, field, "must be 1-%d characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
			    SPEC_MAX_TEMPLATE_NAME);
	for (i = 1; i < n; i++)
		if (!islower((unsigned char)name[i]) && !isdigit((unsigned char)name[i]) && !strchr("._-", name[i]))
			return fail(err, field, "must be 1-%d characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
				    SPEC_MAX_TEMPLATE_NAME);
	return 0;
}

static int parse_template(json_t *j, struct task_spec *out, struct kiln_err *err)
{
	const char *s;
	size_t n;

	if (!j)
		return 0;
	if (get_str(j, "template", &s, &n, err))
		return -1;
	if (spec_template_name_check(s, "template", err))
		return -1;
	out->template_name = memdup_nul(s, n);
	return out->template_name ? 0 : fail_nomem(err);
}

static const char *const limit_keys[] = { "vcpus", "memory_mib", "timeout_s", "output_mib", NULL };

static int parse_limits(json_t *j, struct task_spec *out, struct kiln_err *err)
{
	json_t *empty = NULL;
	int r = -1;

	if (j && !json_is_object(j))
		return fail(err, "limits", "must be an object (got %s)", json_kind(j));
	if (!j) {
		/* Absent: run the same code path over an empty object for the defaults. */
		empty = json_object();
		if (!empty)
			return fail_nomem(err);
		j = empty;
	}
	if (check_keys(j, "limits", limit_keys, err) ||
	    get_uint(j, "vcpus", "limits.vcpus", SPEC_MIN_VCPUS, SPEC_MAX_VCPUS,
		     SPEC_DEFAULT_VCPUS, "", &out->vcpus, err) ||
	    get_uint(j, "memory_mib", "limits.memory_mib", SPEC_MIN_MEMORY_MIB, SPEC_MAX_MEMORY_MIB,
		     SPEC_DEFAULT_MEMORY_MIB, "", &out->memory_mib, err) ||
	    get_uint(j, "timeout_s", "limits.timeout_s", SPEC_MIN_TIMEOUT_S, SPEC_MAX_TIMEOUT_S,
		     SPEC_DEFAULT_TIMEOUT_S, "", &out->timeout_s, err) ||
	    get_uint(j, "output_mib", "limits.output_mib", SPEC_MIN_OUTPUT_MIB, SPEC_MAX_OUTPUT_MIB,
		     SPEC_DEFAULT_OUTPUT_MIB, "", &out->output_mib, err))
		goto out;
	r = 0;
out:
	json_decref(empty);
	return r;
}

/* ---- network ----------------------------------------------------------- */

/* A rule's JSON path and its quoted text, for errors of the form
 * network.allow[2]: "exa mple.org:443": <why>. */
struct rule_ctx {
	const char *path;
	const char *text;
	struct kiln_err *err;
};

__attribute__((format(printf, 2, 3)))
static int rule_fail(const struct rule_ctx *c, const char *fmt, ...)
{
	char msg[sizeof(c->err->message)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return fail(c->err, c->path, "\"%s\": %s", c->text, msg);
}

/* p[0..n) is a decimal number of at most 5 digits, without sign or leading
 * zeros, and at most max. */
static int parse_dec(const char *p, size_t n, unsigned max, unsigned *out)
{
	unsigned v = 0;
	size_t i;

	if (n == 0 || n > 5 || (n > 1 && p[0] == '0'))
		return -1;
	for (i = 0; i < n; i++) {
		if (p[i] < '0' || p[i] > '9')
			return -1;
		v = v * 10 + (unsigned)(p[i] - '0');
	}
	if (v > max)
		return -1;
	*out = v;
	return 0;
}

/* Strict dotted quad: exactly four decimal parts 0..255, no leading zeros
 * (inet_aton() would read "010" as octal 8 and "1.2" as 1.0.0.2). */
static int parse_ipv4(const char *p, size_t n, uint32_t *out)
{
	uint32_t a = 0;
	size_t i = 0, part;

	for (part = 0; part < 4; part++) {
		size_t j = i;
		unsigned v;

		while (j < n && p[j] != '.')
			j++;
		if (parse_dec(p + i, j - i, 255, &v))
			return -1;
		a = (a << 8) | v;
		if (part < 3) {
			if (j == n)
				return -1;
			i = j + 1;
		} else if (j != n) {
			return -1;
		}
	}
	*out = a;
	return 0;
}

static int parse_cidr(const struct rule_ctx *c, const char *p, size_t n, struct spec_net_rule *r)
{
	const char *slash = memchr(p, '/', n);
	size_t an = slash ? (size_t)(slash - p) : n;
	unsigned prefix = 32;
	uint32_t mask, a;

	if (parse_ipv4(p, an, &r->addr))
		return rule_fail(c, "not a valid IPv4 address (four decimal numbers 0 to 255 without "
				 "leading zeros, e.g. 203.0.113.7 or 203.0.113.0/24)");
	if (slash && parse_dec(slash + 1, n - an - 1, 32, &prefix))
		return rule_fail(c, "the prefix length must be a number from 0 to 32 without leading zeros");
	mask = prefix ? ~0u << (32 - prefix) : 0;
	if (r->addr & ~mask) {
		a = r->addr & mask;
		return rule_fail(c, "the host bits are set (the network is %u.%u.%u.%u/%u)",
				 a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255, prefix);
	}
	r->kind = SPEC_NET_CIDR;
	r->prefix = (uint8_t)prefix;
	return 0;
}

/* An LDH host name (RFC 1123): dot-separated labels of 1..63 letters, digits
 * and '-', not starting or ending with '-'; at least two labels, the last not
 * all digits (so that it never reads as an address); no trailing dot. Written
 * lower-cased to out (SPEC_MAX_NET_HOST + 1 bytes). */
static int parse_hostname(const struct rule_ctx *c, const char *p, size_t n, const char *what,
			  char *out)
{
	size_t i, start = 0, labels = 0;
	int digits = 1;

	if (n == 0)
		return rule_fail(c, "the %s is empty", what);
	if (n > SPEC_MAX_NET_HOST)
		return rule_fail(c, "the %s is longer than %d bytes", what, SPEC_MAX_NET_HOST);
	if (p[n - 1] == '.')
		return rule_fail(c, "the %s must not end with '.'", what);
	for (i = 0; i <= n; i++) {
		unsigned char ch = i < n ? (unsigned char)p[i] : '.';

		if (ch == '.') {
			if (i == start)
				return rule_fail(c, "the %s has an empty label", what);
			if (i - start > 63)
				return rule_fail(c, "the %s has a label longer than 63 bytes", what);
			if (p[start] == '-' || p[i - 1] == '-')
				return rule_fail(c, "a label of the %s starts or ends with '-'", what);
			labels++;
			if (i < n) {
				out[i] = '.';
				digits = 1;
			}
			start = i + 1;
			continue;
		}
		if (ch >= 'A' && ch <= 'Z')
			ch = (unsigned char)(ch - 'A' + 'a');
		if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-')) {
			if (ch >= 0x20 && ch < 0x7f)
				return rule_fail(c, "'%c' is not allowed in a %s (letters, digits, '-' and '.')",
						 ch, what);
			return rule_fail(c, "byte 0x%02x is not allowed in a %s (letters, digits, '-' and '.')",
					 ch, what);
		}
		if (ch < '0' || ch > '9')
			digits = 0;
		out[i] = (char)ch;
	}
	out[n] = '\0';
	if (labels < 2)
		return rule_fail(c, "the %s needs at least two labels (e.g. example.org)", what);
	if (digits)
		return rule_fail(c, "the last label of the %s must not be all digits", what);
	return 0;
}

/* "PORT" or "LO-HI", each 1..65535 without leading zeros. */
static int parse_ports(const struct rule_ctx *c, const char *p, size_t n, struct spec_net_rule *r)
{
	const char *dash = memchr(p, '-', n);
	size_t ln = dash ? (size_t)(dash - p) : n;
	unsigned lo, hi;

	if (n == 0)
		return rule_fail(c, "the port is empty (e.g. example.org:443 or example.org:8000-8100)");
	if (parse_dec(p, ln, 65535, &lo) || lo == 0 ||
	    (dash && (parse_dec(dash + 1, n - ln - 1, 65535, &hi) || hi == 0)))
		return rule_fail(c, "the port must be a number from 1 to 65535 without leading zeros, "
				 "or a range LO-HI of two");
	if (!dash)
		hi = lo;
	if (lo > hi)
		return rule_fail(c, "the port range %u-%u is reversed (LO must not exceed HI)", lo, hi);
	r->port_lo = (uint16_t)lo;
	r->port_hi = (uint16_t)hi;
	return 0;
}

/* One entry of "network.allow": DESTINATION:PORTS, split at the last ':'. */
static int parse_net_rule(json_t *j, size_t idx, struct spec_net_rule *r, struct kiln_err *err)
{
	char path[PATH_BUF];
	struct quoted q;
	struct rule_ctx c;
	const char *s, *colon = NULL;
	size_t n, i, dn, colons = 0;
	int ip = 1, digits = 0;

	snprintf(path, sizeof(path), "network.allow[%zu]", idx);
	if (get_str(j, path, &s, &n, err))
		return -1;
	c.path = path;
	c.text = quote(&q, s, n);
	c.err = err;
	if (n > SPEC_MAX_NET_RULE_BYTES)
		return rule_fail(&c, "must be at most %d bytes (got %zu)", SPEC_MAX_NET_RULE_BYTES, n);
	for (i = 0; i < n; i++)
		if (s[i] == ':') {
			colons++;
			colon = s + i;
		}
	if (memchr(s, '[', n) || colons > 1)
		return rule_fail(&c, "IPv6 is not supported (IPv4 addresses and host names only)");
	if (!colon)
		return rule_fail(&c, "a port is required (e.g. example.org:443, 203.0.113.0/24:8000-8100)");
	dn = (size_t)(colon - s);
	if (dn == 0)
		return rule_fail(&c, "the destination before ':' is empty");

	if (dn >= 2 && s[0] == '*' && s[1] == '.' && !memchr(s + 2, '*', dn - 2)) {
		r->kind = SPEC_NET_WILDCARD;
		if (parse_hostname(&c, s + 2, dn - 2, "wildcard suffix", r->host))
			return -1;
	} else if (memchr(s, '*', dn)) {
		return rule_fail(&c, "only a leading \"*.\" wildcard is allowed (e.g. *.example.org)");
	} else {
		/* Digits and dots (or a '/') mean an address: no valid host name
		 * looks like that, and "1.2.3.256" deserves an address error. */
		for (i = 0; i < dn; i++) {
			if (s[i] >= '0' && s[i] <= '9')
				digits = 1;
			else if (s[i] != '.')
				ip = 0;
		}
		if ((ip && digits) || memchr(s, '/', dn)) {
			if (parse_cidr(&c, s, dn, r))
				return -1;
		} else {
			r->kind = SPEC_NET_HOST;
			if (parse_hostname(&c, s, dn, "host name", r->host))
				return -1;
		}
	}
	return parse_ports(&c, colon + 1, n - dn - 1, r);
}

static int net_rule_equal(const struct spec_net_rule *a, const struct spec_net_rule *b)
{
	return a->kind == b->kind && a->addr == b->addr && a->prefix == b->prefix &&
	       strcmp(a->host, b->host) == 0 && a->port_lo == b->port_lo && a->port_hi == b->port_hi;
}

static const char *const network_keys[] = { "egress", "allow", NULL };

static int parse_network(json_t *j, struct task_spec *out, struct kiln_err *err)
{
	struct quoted q;
	const char *s;
	size_t n, i, k;
	json_t *v, *allow;

	out->egress = 0;
	if (!j)
		return 0;
	if (!json_is_object(j))
		return fail(err, "network", "must be an object (got %s)", json_kind(j));
	if (check_keys(j, "network", network_keys, err))
		return -1;
	v = json_object_get(j, "egress");
	allow = json_object_get(j, "allow");
	if (v) {
		if (get_str(v, "network.egress", &s, &n, err))
			return -1;
		if (n == 5 && memcmp(s, "allow", 5) == 0)
			out->egress = 1;
		else if (n != 4 || memcmp(s, "none", 4) != 0)
			return fail(err, "network.egress", "\"%s\" is not supported (one of \"none\", \"allow\")",
				    quote(&q, s, n));
	}
	if (!out->egress) {
		/* Rules that would silently do nothing are a mistake worth naming. */
		if (allow)
			return fail(err, "network.allow", "is not allowed with egress \"none\"%s: "
				    "use \"egress\":\"allow\" for rules", v ? "" : " (the default)");
		return 0;
	}
	if (!allow)
		return fail(err, "network.allow", "is required with egress \"allow\" (0 to %d rules such as "
			    "\"example.org:443\"; [] reaches nothing until the rules are changed)", SPEC_MAX_NET_RULES);
	if (!json_is_array(allow))
		return fail(err, "network.allow", "must be an array of strings (got %s)", json_kind(allow));
	n = json_array_size(allow);
	/* [] is a network device that reaches nothing yet: its rules can be
	 * changed while it runs (a session's PUT .../network). */
	if (n > SPEC_MAX_NET_RULES)
		return fail(err, "network.allow", "must have 0 to %d entries (got %zu)", SPEC_MAX_NET_RULES, n);
	if (!n)
		return 0;
	out->net_rules = calloc(n, sizeof(*out->net_rules));
	if (!out->net_rules)
		return fail_nomem(err);
	out->nnet_rules = n;
	for (i = 0; i < n; i++) {
		if (parse_net_rule(json_array_get(allow, i), i, &out->net_rules[i], err))
			return -1;
		/* At most 64 * 63 / 2 comparisons. */
		for (k = 0; k < i; k++)
			if (net_rule_equal(&out->net_rules[k], &out->net_rules[i])) {
				char path[PATH_BUF];
				const char *t = json_string_value(json_array_get(allow, i));

				snprintf(path, sizeof(path), "network.allow[%zu]", i);
				return fail(err, path, "\"%s\": duplicates network.allow[%zu]",
					    quote(&q, t, strlen(t)), k);
			}
	}
	return 0;
}

void spec_net_rule_format(const struct spec_net_rule *r, char *out, size_t cap)
{
	char ports[16];
	uint32_t a = r->addr;

	if (r->port_lo == r->port_hi)
		snprintf(ports, sizeof(ports), "%u", (unsigned)r->port_lo);
	else
		snprintf(ports, sizeof(ports), "%u-%u", (unsigned)r->port_lo, (unsigned)r->port_hi);
	switch (r->kind) {
	case SPEC_NET_CIDR:
		if (r->prefix == 32)
			snprintf(out, cap, "%u.%u.%u.%u:%s", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255, ports);
		else
			snprintf(out, cap, "%u.%u.%u.%u/%u:%s", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255,
				 (unsigned)r->prefix, ports);
		return;
	case SPEC_NET_HOST:
		snprintf(out, cap, "%s:%s", r->host, ports);
		return;
	case SPEC_NET_WILDCARD:
		snprintf(out, cap, "*.%s:%s", r->host, ports);
		return;
	}
	snprintf(out, cap, "?:%s", ports);
}

/* ---- whole spec --------------------------------------------------------- */

/* argv, env and cwd must fit one PROTO_EXEC payload with room to spare
 * (see SPEC_EXEC_RESERVE); this is its exact encoded size. */
static size_t exec_payload_size(const struct task_spec *s)
{
	size_t i, n = 4 + 8 + 4 + 4 + 4 + strlen(s->cwd) + 4 + 4;

	for (i = 0; i < s->argc; i++)
		n += 4 + strlen(s->argv[i]);
	for (i = 0; i < s->nenv; i++)
		n += 4 + strlen(s->env[i]);
	return n;
}

static const char *const root_keys[] = {
	"language", "code", "argv", "files", "env", "cwd", "limits", "network", "template", NULL
};

static int parse_root(json_t *root, struct task_spec *out, struct kiln_err *err)
{
	json_t *jlang = json_object_get(root, "language");
	json_t *jcode = json_object_get(root, "code");
	json_t *jargv = json_object_get(root, "argv");
	struct quoted q, q2;
	size_t i, n, li = 0;

	if (check_keys(root, "spec", root_keys, err))
		return -1;
	/* An unsupported language is the most useful thing to hear first. */
	if (jlang && !jargv && parse_language(jlang, &li, err))
		return -1;
	if (jcode && jargv)
		return fail(err, "code", "cannot be combined with \"argv\" (give exactly one)");
	if (!jcode && !jargv)
		return fail(err, "spec", "one of \"code\" (with \"language\") or \"argv\" is required");
	if (jcode && !jlang)
		return fail(err, "language", "is required with \"code\" (one of \"python\", \"bash\", \"sh\")");
	if (jargv && jlang)
		return fail(err, "language", "is not allowed with \"argv\" (argv[0] names the program)");

	/* User files first: the code file is appended after them. */
	if (parse_files(json_object_get(root, "files"), out, err))
		return -1;
	if (jcode ? parse_code(li, jcode, out, err) : parse_argv(jargv, out, err))
		return -1;
	if (parse_env(json_object_get(root, "env"), out, err) ||
	    parse_cwd(json_object_get(root, "cwd"), out, err) ||
	    parse_limits(json_object_get(root, "limits"), out, err) ||
	    parse_network(json_object_get(root, "network"), out, err) ||
	    parse_template(json_object_get(root, "template"), out, err))
		return -1;

	n = exec_payload_size(out);
	if (n > PROTO_MAX_PAYLOAD - SPEC_EXEC_RESERVE)
		return fail(err, out->nenv ? "env" : "argv",
			    "argv, env and cwd together take %zu bytes, more than the %d that fit one exec message",
			    n, PROTO_MAX_PAYLOAD - SPEC_EXEC_RESERVE);
	/* The guest creates every file before it chdirs; a cwd that is a file
	 * (or below one) would fail there, later and less clearly. */
	for (i = 0; i < out->nfiles; i++)
		if (path_under(out->cwd, out->files[i].path))
			return fail(err, "cwd", "\"%s\" is or is below the file \"%s\"",
				    quote(&q, out->cwd, strlen(out->cwd)),
				    quote(&q2, out->files[i].path, strlen(out->files[i].path)));
	return 0;
}

/* Linear: each run of backslashes is looked at once. */
size_t spec_json_nodes(const char *p, size_t n, size_t max)
{
	size_t i = 0, count = 0;

	while (i < n && count <= max) {
		char c = p[i];

		if (c == '"') {
			/* Skip to the quote that ends the string: one not preceded
			 * by an odd number of backslashes. */
			for (;;) {
				const char *q = memchr(p + i + 1, '"', n - i - 1);
				size_t bs = 0;

				if (!q)
					return count;
				i = (size_t)(q - p);
				while (p[i - 1 - bs] == '\\')
					bs++;
				if (bs % 2 == 0)
					break;
			}
		} else if (c == '[' || c == '{' || c == ',') {
			count++;
		}
		i++;
	}
	return count;
}

/* Reduce jansson's error text to printable ASCII: it may quote raw input. */
static void scrub(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			*s = '?';
}

json_t *spec_json_load(const char *json, size_t len, size_t max, const char *what, struct kiln_err *err)
{
	json_error_t jerr;
	json_t *root;

	if (len > max)
		return fail(err, what, "must be at most %zu bytes of JSON (got %zu)", max, len), NULL;
	/* DECODE_ANY: a top-level non-object gets our message, not jansson's.
	 * REJECT_DUPLICATES: {"cwd":"/a","cwd":"/b"} is ambiguous, not last-wins.
	 * ALLOW_NUL: see get_str(). */
	assert(json || len == 0);
	if (spec_json_nodes(json, len, SPEC_MAX_JSON_NODES) > SPEC_MAX_JSON_NODES)
		return fail(err, what, "must have at most %d JSON arrays, objects and ',' separators "
			    "outside strings", SPEC_MAX_JSON_NODES), NULL;
	root = json_loadb(json ? json : "", len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
			  &jerr);
	if (!root) {
		scrub(jerr.text);
		return fail(err, what, "invalid JSON at line %d, column %d: %s", jerr.line, jerr.column,
			    jerr.text), NULL;
	}
	if (!json_is_object(root)) {
		fail(err, what, "must be a JSON object (got %s)", json_kind(root));
		json_decref(root);
		return NULL;
	}
	return root;
}

int spec_json_fail(struct kiln_err *err, const char *path, const char *fmt, ...)
{
	char msg[sizeof(err->message)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return fail(err, path, "%s", msg);
}

const char *spec_json_kind(const json_t *j)
{
	return json_kind(j);
}

int spec_json_keys(json_t *obj, const char *path, const char *const *known, struct kiln_err *err)
{
	return check_keys(obj, path, known, err);
}

int spec_json_str(json_t *j, const char *path, const char **s, size_t *n, struct kiln_err *err)
{
	return get_str(j, path, s, n, err);
}

int spec_json_files_env(json_t *files, json_t *env, struct task_spec *out, struct kiln_err *err)
{
	return parse_files(files, out, err) || parse_env(env, out, err) ? -1 : 0;
}

int spec_parse(const char *json, size_t len, struct task_spec *out, struct kiln_err *err)
{
	json_t *root;
	int r;

	memset(out, 0, sizeof(*out));
	root = spec_json_load(json, len, SPEC_MAX_JSON, "spec", err);
	if (!root)
		return -1;
	r = parse_root(root, out, err);
	json_decref(root);
	if (r)
		spec_free(out);
	return r;
}

void spec_free(struct task_spec *s)
{
	size_t i;

	if (!s)
		return;
	free(s->code);
	if (s->argv)
		for (i = 0; i < s->argc; i++)
			free(s->argv[i]);
	free(s->argv);
	for (i = 0; i < s->nfiles; i++) {
		free(s->files[i].path);
		free(s->files[i].data);
	}
	free(s->files);
	for (i = 0; i < s->nenv; i++)
		free(s->env[i]);
	free(s->env);
	free(s->cwd);
	free(s->template_name);
	free(s->net_rules);
	memset(s, 0, sizeof(*s));
}

int spec_volume_path_ok(const char *p)
{
	static const char *const refused[] = { "/proc", "/sys", "/dev" };
	size_t n = p ? strlen(p) : 0;

	if (n < 2 || n > SPEC_VOLUME_PATH_MAX || p[0] != '/' || p[n - 1] == '/')
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
			return 0;
	/* Every component is a name, not "", "." or "..". */
	for (const char *c = p + 1;;) {
		const char *e = strchr(c, '/');
		size_t len = e ? (size_t)(e - c) : strlen(c);

		if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
			return 0;
		if (!e)
			break;
		c = e + 1;
	}
	for (size_t i = 0; i < sizeof(refused) / sizeof(*refused); i++)
		if (spec_path_within(p, refused[i]))
			return 0;
	return 1;
}

int spec_path_within(const char *a, const char *b)
{
	size_t l = strlen(b);

	return !strncmp(a, b, l) && (a[l] == '\0' || a[l] == '/');
}
