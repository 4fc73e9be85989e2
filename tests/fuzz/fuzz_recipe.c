/* fuzz_recipe: libFuzzer target for recipe_parse(). Besides memory safety,
 * checks that a recipe that parses satisfies what kiln-host's build relies
 * on (every field within its bounds, names well formed) and that a
 * rejection is an invalid_recipe error with a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "recipe.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { 0 };
	struct recipe r;
	size_t i, total = 0;

	if (recipe_parse((const char *)data, size, &r, &err) < 0) {
		check(err.errc == KERR_INVALID_RECIPE || err.errc == KERR_INTERNAL);
		check(err.message[0] != '\0');
		check(r.packages == NULL && r.nfiles == 0 && r.workdir == NULL);
		return 0;
	}
	check(r.name[0] && strlen(r.name) <= 63);
	check(r.packages && r.npackages <= RECIPE_MAX_PACKAGES && r.packages[r.npackages] == NULL);
	for (i = 0; i < r.npackages; i++)
		check(strlen(r.packages[i]) >= 2 && strlen(r.packages[i]) <= RECIPE_MAX_PACKAGE &&
		      strspn(r.packages[i], "abcdefghijklmnopqrstuvwxyz0123456789+.-") == strlen(r.packages[i]));
	check(r.run && r.nrun <= RECIPE_MAX_RUN && r.run[r.nrun] == NULL);
	for (i = 0; i < r.nrun; i++)
		check(strlen(r.run[i]) >= 1 && strlen(r.run[i]) <= RECIPE_MAX_RUN_BYTES);
	check(r.preload && r.npreload <= RECIPE_MAX_PRELOAD && r.preload[r.npreload] == NULL);
	for (i = 0; i < r.npreload; i++)
		check(strspn(r.preload[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") ==
		      strlen(r.preload[i]));
	check(r.nfiles <= RECIPE_MAX_FILES);
	for (i = 0; i < r.nfiles; i++) {
		check(proto_abspath_ok(r.files[i].path) == 0);
		check(r.files[i].mode <= 0777 && r.files[i].data != NULL);
		total += r.files[i].len;
	}
	check(total <= RECIPE_MAX_FILE_BYTES);
	check(r.env && r.nenv <= RECIPE_MAX_ENV && r.env[r.nenv] == NULL);
	for (i = 0; i < r.nenv; i++)
		check(strchr(r.env[i], '=') != NULL && r.env[i][0] != '=');
	check(r.workdir == NULL || proto_abspath_ok(r.workdir) == 0);
	recipe_free(&r);
	return 0;
}
