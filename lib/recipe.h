/* recipe: a template recipe (docs/templates.md, "The recipe"): Debian
 * packages, files, run steps, preloaded Python modules, env and workdir over
 * the default template's Debian base. Parsed by kiln-api (POST /v1/templates)
 * and again by kiln-host (POST /v1/builds); fuzzed (fuzz_recipe). */
#ifndef KILN_RECIPE_H
#define KILN_RECIPE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define RECIPE_MAX_JSON       (24u << 20) /* bytes of the whole document */
#define RECIPE_MAX_PACKAGES   200
#define RECIPE_MAX_PACKAGE    100         /* bytes of one package name */
#define RECIPE_MAX_FILES      100
#define RECIPE_MAX_FILE_BYTES (16u << 20) /* decoded, all files together */
#define RECIPE_MAX_RUN        50
#define RECIPE_MAX_RUN_BYTES  (16u << 10) /* one step */
#define RECIPE_MAX_PRELOAD    32
#define RECIPE_MAX_MODULE     128         /* bytes of one module name */
#define RECIPE_MAX_ENV        128
#define RECIPE_MAX_ENV_BYTES  (32u << 10) /* sum of "K=V" + NUL */

struct recipe_file {
	char *path;            /* absolute, proto_abspath_ok */
	unsigned char *data;
	size_t len;
	uint32_t mode;         /* 0-0777, default 0644 */
};

struct recipe {
	char name[64];         /* spec_template_name_check */
	char **packages;       /* npackages entries + NULL */
	size_t npackages;
	struct recipe_file *files;
	size_t nfiles;
	char **run;            /* nrun entries + NULL */
	size_t nrun;
	char **preload;        /* npreload entries + NULL */
	size_t npreload;
	char **env;            /* "K=V", nenv entries + NULL */
	size_t nenv;
	char *workdir;         /* NULL: not given (tasks' default, /work) */
};

/* Parse and validate json[0..len). Unknown keys, null values and duplicate
 * keys are errors. Returns 0 with *out filled (free with recipe_free), or -1
 * with err set (code "invalid_recipe", the message naming the field by its
 * JSON path, e.g. "packages[3]: ...") and *out zeroed. Reentrant. */
int recipe_parse(const char *json, size_t len, struct recipe *out, struct kiln_err *err);
void recipe_free(struct recipe *r);

#endif
