/* version: kiln's version string (version.h) and its build-info gauge. */
#include "version.h"

#include "metrics.h"

#ifndef KILN_VERSION
#error "KILN_VERSION is not defined: the Makefile passes it (from VERSION)"
#endif

const char *kiln_version(void)
{
	return KILN_VERSION;
}

static const struct metric m_build_info = {
	.name = "kiln_build_info", .type = METRIC_GAUGE, .labels = { "version" },
	.help = "always 1; its version label is the running binary's version",
};

int version_metric(struct buf *b)
{
	const char *v = KILN_VERSION;

	return metric_write_by(b, &m_build_info, &v, (uint64_t[]){ 1 }, 1);
}
