/* check_cmd: `kiln-host check-config FILE`: what `kiln-host serve --config
 * FILE` would use, checked without starting anything (no QEMU, no VM, no
 * nftables table, no directory created). README "Checking a configuration". */
#ifndef KILN_CHECK_CMD_H
#define KILN_CHECK_CMD_H

#include "host_config.h"
#include "serve/serve.h"

/* The VM settings serve resolves beside its serve_opts (host/main.c's
 * struct common, before common_finish). */
struct check_cmd_vm {
	const char *accel;     /* "auto", "kvm" or "tcg" (anything else is reported) */
	const char *image_dir; /* vmlinux, initramfs.cpio, rootfs.ext4 */
	const char *run_dir, *cache, *qemu;
};

/* Check and print (settings on stdout, one line per problem on stderr)
 * what hc, applied over serve's defaults into so and vm, would use: the
 * listen address, image files, QEMU, KVM or TCG, run/cache/spool
 * directories and their free disk, capacity, S3, nftables, the jail's
 * cgroups, the kiln-api URLs' /healthz. path names the file in messages.
 * Returns the number of errors (0: fine). Main thread only. */
int check_cmd_run(const char *path, const struct host_config *hc, const struct serve_opts *so,
		  const struct check_cmd_vm *vm);

#endif
