/* fsutil: removing and making directory trees, shared by the host, the jail
 * and the spool. Neither follows symbolic links: a tree a VM or a guest
 * could have written into is removed without ever leaving it. */
#ifndef KILN_FSUTIL_H
#define KILN_FSUTIL_H

#include <sys/types.h>

/* Remove name (relative to dirfd, or AT_FDCWD) and everything below it,
 * depth-bounded (64 levels), never following links. A missing path is not an
 * error. Returns 0 or a negative errno from the final removal. */
int fs_rmtree_at(int dirfd, const char *name);
int fs_rmtree(const char *path);

/* mkdir -p: parents with 0755, the last component with mode. Returns 0 or a
 * negative errno. An existing directory is fine. */
int fs_mkdir_p(const char *path, mode_t mode);

#endif
