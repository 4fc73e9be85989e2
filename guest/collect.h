/* collect: answers COLLECT by walking the output directory and sending its
 * directories and regular files, never following a link out of it. */
#ifndef KILN_GUEST_COLLECT_H
#define KILN_GUEST_COLLECT_H

#include <stdint.h>

#include "agent.h"

#define COLLECT_MAX_DEPTH   32     /* directory levels below the root */
#define COLLECT_MAX_ENTRIES 100000 /* directory entries looked at, in all */

/* Walks `root` and sends OUT_DIR for each directory, OUT_FILE + OUT_DATA for
 * each regular file that fits in the remaining `budget` bytes, then OUT_END.
 * Symlinks, devices, FIFOs and sockets are counted as skipped, never opened.
 * A file that shrinks while being sent, or a read error after its OUT_FILE,
 * ends the walk with ERROR instead of OUT_END. A missing root yields an empty
 * OUT_END. Returns 0, or a negative errno when the channel failed (fatal). */
int collect_run(struct agent *a, const char *root, uint64_t budget);

#endif
