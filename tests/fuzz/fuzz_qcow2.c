/* fuzz_qcow2: a session's disk layer header (from S3, written by a jailed
 * QEMU) through qcow2_header_check: it must never read outside the buffer,
 * and what it accepts must be what it promises (checked again here). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	/* An exact-size heap copy: ASan catches any read past the end. */
	uint8_t *buf = malloc(size ? size : 1);

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	if (qcow2_header_check(buf, size, "/var/cache/kiln/snapshots/0123456789abcdef/disk.qcow2", &err) == 0) {
		if (size < 72 || be32(buf) != 0x514649fbu || be32(buf + 32) != 0 || be32(buf + 60) != 0)
			abort();
	} else if (err.errc != KERR_SNAPSHOT_CORRUPT) {
		abort();
	}
	free(buf);
	return 0;
}
