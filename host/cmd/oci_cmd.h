/* oci_cmd: `kiln-host template import ARCHIVE --out FILE`, template_build_oci from
 * the command line (operators and tests/integration/83-oci.sh). */
#ifndef KILN_OCI_CMD_H
#define KILN_OCI_CMD_H

/* argv[0] is "import". Prints the template's meta as one JSON line on
 * stdout ({"env","workdir","uid","gid","size"}) and the build log on
 * stderr. Exit status: 0 made, 1 refused (invalid_image, too_large,
 * build_timeout, cancelled: the JSON error on stdout), 2 usage, 3 error. */
int oci_cmd_import(int argc, char **argv);

#endif
