/* qcow2: checks the header of a qcow2 image that came from outside
 * kiln-host's trust (a session's disk layer, written by a jailed QEMU and
 * kept in S3) before anything running as root opens it. */
#ifndef KILN_QCOW2_H
#define KILN_QCOW2_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* How much of the file qcow2_header_check needs: the header, its
 * extensions and the backing file name must all lie in the first cluster,
 * and clusters larger than this are refused. */
#define QCOW2_HEADER_MAX 65536

/* Check buf (the first len bytes of an image) as a plain qcow2 overlay:
 * magic, version 2 or 3, cluster size 512 B..64 KiB, no encryption, no
 * internal snapshots, no incompatible or autoclear feature bits (the
 * external data file that would make qemu-img open a host path), only the
 * backing-format and feature-table header extensions, and a backing file
 * name inside the first cluster whose last two components equal
 * backing_tail's ("<snapshot key>/disk.qcow2": the template it was made
 * on). Returns 0, or -1 with err set (code "snapshot_corrupt"). Pure: no
 * I/O, any thread. */
int qcow2_header_check(const uint8_t *buf, size_t len, const char *backing_tail, struct kiln_err *err);

/* qcow2_header_check on the file at path, whose backing must end like
 * backing (a path). 0 or -1 with err set. */
int qcow2_file_check(const char *path, const char *backing, struct kiln_err *err);

#endif
