/* untar: unpack a tar archive that a guest made (hostile) into a local
 * directory, as root too, without letting it reach outside or plant
 * anything but plain files and directories. */
#ifndef KILN_UNTAR_H
#define KILN_UNTAR_H

#include <stddef.h>

#include "err.h"

struct untar_report {
	size_t files, dirs; /* extracted */
	size_t skipped;     /* entries left out: special files, links, escaping paths */
	char first_skipped[256]; /* the first of them, for the message */
};

/* Extract the tar archive at path into the existing directory dest with
 * libarchive: only regular files and directories are made; symlinks, hard
 * links, devices, FIFOs and sockets are skipped; absolute names and '..'
 * are refused, and nothing is written through a symlink already on disk;
 * owners are never restored and modes keep only the 0777 bits (no setuid,
 * setgid or sticky). Returns 0 (rep filled) or -1 with err set. */
int untar_safe(const char *path, const char *dest, struct untar_report *rep, struct kiln_err *err);

#endif
