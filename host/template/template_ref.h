/* template_ref: the template reference (TREF) kiln-api sends with every task,
 * session create and resume on a non-default template, and kiln-host
 * reports in build results (docs/templates.md). Pure functions over
 * jansson; any thread. */
#ifndef KILN_TEMPLATE_REF_H
#define KILN_TEMPLATE_REF_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"

#define TEMPLATE_REF_MAX_JSON   (256u << 10)      /* a TREF document, at most */
#define TEMPLATE_REF_MAX_ENV    128               /* env entries */
#define TEMPLATE_REF_MAX_ENV_LEN 32768            /* bytes of one "K=V" */
#define TEMPLATE_REF_MAX_SIZE   (64ull << 30)     /* an image, at most */
#define TEMPLATE_REF_S3_PREFIX  "_templates/"

struct template_ref {
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
 * _templates/<sha256>.ext4. out is zeroed first; template_ref_free it on success. */
int template_ref_parse_json(json_t *j, struct template_ref *out, struct kiln_err *err);
/* The same from text (at most TEMPLATE_REF_MAX_JSON bytes; duplicate keys refused). */
int template_ref_parse(const char *text, size_t len, struct template_ref *out, struct kiln_err *err);
/* The TREF as JSON (a new reference; NULL when out of memory). */
json_t *template_ref_json(const struct template_ref *t);
void template_ref_free(struct template_ref *t);
/* A built-in TREF for name. */
void template_ref_builtin(struct template_ref *t, const char *name);

/* Whether s is exactly 64 lowercase hex digits (a SHA-256). */
int template_ref_hex64_ok(const char *s);

#endif
