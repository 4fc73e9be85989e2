/* tref: the template reference (TREF) kiln-api sends with every task,
 * session create and resume on a non-default template, and kiln-host
 * reports in build results (docs/templates.md). Pure functions over
 * jansson; any thread. */
#ifndef KILN_TREF_H
#define KILN_TREF_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"

#define TREF_MAX_JSON   (256u << 10)      /* a TREF document, at most */
#define TREF_MAX_ENV    128               /* env entries */
#define TREF_MAX_ENV_LEN 32768            /* bytes of one "K=V" */
#define TREF_MAX_SIZE   (64ull << 30)     /* an image, at most */
#define TREF_S3_PREFIX  "_templates/"

struct tref {
	char name[64];          /* spec_template_name_check */
	int builtin;
	char sha256[65];        /* 64 lowercase hex; "" for a built-in */
	uint64_t size;          /* bytes of the image (customer templates) */
	char s3_key[128];       /* "_templates/<sha256>.ext4"; "" for a built-in */
	json_t *env;            /* array of "K=V" strings or NULL (kiln-api merges it into specs) */
	char workdir[4097];     /* "" when absent */
	int user_set;           /* uid/gid given */
	uint32_t uid, gid;
};

/* Parse a TREF object (see docs/templates.md): unknown keys, nulls, wrong
 * types and out-of-range values are refused with err invalid_request naming
 * the field ("template.sha256: ..."). A built-in has no sha256/s3_key/size;
 * a customer template needs sha256, size and s3_key, and its s3_key must be
 * _templates/<sha256>.ext4. out is zeroed first; tref_free it on success. */
int tref_parse_json(json_t *j, struct tref *out, struct kiln_err *err);
/* The same from text (at most TREF_MAX_JSON bytes; duplicate keys refused). */
int tref_parse(const char *text, size_t len, struct tref *out, struct kiln_err *err);
/* The TREF as JSON (a new reference; NULL when out of memory). */
json_t *tref_json(const struct tref *t);
void tref_free(struct tref *t);
/* A built-in TREF for name. */
void tref_builtin(struct tref *t, const char *name);

/* Whether s is exactly 64 lowercase hex digits (a SHA-256). */
int tref_hex64_ok(const char *s);

#endif
