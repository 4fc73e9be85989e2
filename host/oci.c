/* oci: imports an OCI or docker-archive image (placeholder until the
 * implementation lands). */
#include "tbuild.h"

int tbuild_oci(const struct tbuild_oci_req *req, const char *out_ext4, struct tbuild_meta *meta,
	       tbuild_log_fn log, void *ctx, struct kiln_err *err)
{
	(void)req, (void)out_ext4, (void)meta, (void)log, (void)ctx;
	return kiln_err_set(err, KERR_INVALID_IMAGE, "OCI imports are not implemented yet"), -1;
}
