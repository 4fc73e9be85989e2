/* tbuild_recipe: builds a recipe template in a build VM (placeholder until
 * the implementation lands). */
#include "tbuild.h"

int tbuild_recipe(const struct tbuild_recipe_req *req, const char *out_ext4, struct tbuild_meta *meta,
		  tbuild_log_fn log, void *ctx, struct kiln_err *err)
{
	(void)req, (void)out_ext4, (void)meta, (void)log, (void)ctx;
	return kiln_err_set(err, KERR_BUILD_FAILED, "recipe builds are not implemented yet"), -1;
}
