/* version: kiln's one version string, shared by every binary. It comes from
 * the VERSION file at the top of the tree (plus "+g<commit>" when built in a
 * git checkout); the Makefile passes it to version.c alone as KILN_VERSION,
 * so a new commit recompiles one file. */
#ifndef KILN_VERSION_H
#define KILN_VERSION_H

#include "buf.h"

/* "0.42.0" or "0.42.0+gabc1234": a static string; any thread. */
const char *kiln_version(void);

/* The kiln_build_info{version="..."} 1 gauge (Prometheus text) into b;
 * 0 or buf's -ENOMEM/-E2BIG. b has one owner, as for metrics.h. */
int version_metric(struct buf *b);

#endif
