/* spec_json: the JSON checks of lib/spec.c, shared with parsers of other
 * documents that embed the same shapes (lib/recipe.c: files and env). Errors
 * come out as invalid_spec with the field's JSON path; a caller with its
 * own error code recodes them (kiln_err_recode). Not a public interface. */
#ifndef KILN_SPEC_JSON_H
#define KILN_SPEC_JSON_H

#include <stddef.h>

#include <jansson.h>

#include "err.h"
#include "spec.h"

/* Load json[0..len) (at most max bytes, SPEC_MAX_JSON_NODES, duplicate keys
 * refused) as an object; what names the document in errors. NULL with err. */
json_t *spec_json_load(const char *json, size_t len, size_t max, const char *what, struct kiln_err *err);
/* "<path>: <message>", returns -1. */
int spec_json_fail(struct kiln_err *err, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *spec_json_kind(const json_t *j);
/* Keys of obj outside the NULL-terminated known are errors. */
int spec_json_keys(json_t *obj, const char *path, const char *const *known, struct kiln_err *err);
/* A string without NUL. */
int spec_json_str(json_t *j, const char *path, const char **s, size_t *n, struct kiln_err *err);
/* The spec's "files" (array or NULL) and "env" (object or NULL) into out's
 * files/env, with the spec's rules and limits. */
int spec_json_files_env(json_t *files, json_t *env, struct task_spec *out, struct kiln_err *err);

#endif
