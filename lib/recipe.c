/* recipe: parse and validate a template recipe (placeholder until the
 * implementation lands). */
#include "recipe.h"

#include <string.h>

int recipe_parse(const char *json, size_t len, struct recipe *out, struct kiln_err *err)
{
	(void)json, (void)len;
	memset(out, 0, sizeof(*out));
	return kiln_err_set(err, KERR_INVALID_RECIPE, "recipes are not implemented yet");
}

void recipe_free(struct recipe *r)
{
	memset(r, 0, sizeof(*r));
}
