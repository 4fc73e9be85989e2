/* cmd: the cmd room's door (host/cmd/: kiln-host's configuration file and
 * its offline subcommands, template-build, oci-build and check-config, and
 * drain/undrain, which tell the running kiln-host). It may call every
 * other room and lib/; only host/main.c includes it. */
#ifndef KILN_CMD_H
#define KILN_CMD_H

#include "check_cmd.h"
#include "drain_cmd.h"
#include "host_config.h"
#include "oci_cmd.h"
#include "template_cmd.h"

#endif
