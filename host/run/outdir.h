/* outdir: create the files a guest returns under a host output directory
 * without ever leaving it: paths are relative, '..'-free (checked again
 * here), walked component by component with O_NOFOLLOW. */
#ifndef KILN_OUTDIR_H
#define KILN_OUTDIR_H

#include <stdint.h>

#include "err.h"

/* Create (if needed) and open the output directory. Returns a dirfd or -1. */
int outdir_open(const char *path, struct kiln_err *err);

/* mkdir -p rel under dirfd. Adds the number of directories it made to
 * *created (when not NULL). Returns 0 or -1 with err set. */
int outdir_mkdir(int dirfd, const char *rel, unsigned *created, struct kiln_err *err);

/* Create rel (parents made as needed) for writing; it must not exist yet.
 * mode keeps only the permission bits 0755. Adds the directories and the
 * file it made to *created (when not NULL). Returns an fd or -1. */
int outdir_create(int dirfd, const char *rel, uint32_t mode, unsigned *created, struct kiln_err *err);

/* The directory levels below the output directory that rel occupies: its
 * components, less one for a file (leaf set): "a/b" is 2 as a directory,
 * 1 as a file. */
unsigned outdir_depth(const char *rel, int leaf);

#endif
