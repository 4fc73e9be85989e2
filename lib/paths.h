/* paths: where a kiln binary finds the files it ships with, relative to
 * itself, so that the same binary works from the build tree (build/kiln-host
 * beside build/image/) and from an install (PREFIX/bin/kiln-host with
 * PREFIX/lib/kiln/image/; `make install`, docs/operations.md). */
#ifndef KILN_PATHS_H
#define KILN_PATHS_H

#include <stddef.h>

/* The directory of the running binary (/proc/self/exe) into buf: 0, or
 * -errno (-ENAMETOOLONG when it does not fit). Any thread. */
int paths_exe_dir(char *buf, size_t size);

/* The built-in images' directory (vmlinux, initramfs.cpio, rootfs*.ext4):
 * <binary dir>/image when it is a directory (the build tree), else
 * <binary dir>/../lib/kiln/image when that is one (an install), else
 * <binary dir>/image (for the error that names what is missing). Into buf;
 * returns buf, or NULL when the binary's path cannot be read. */
const char *paths_image_dir(char *buf, size_t size);

#endif
