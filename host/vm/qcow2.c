/* qcow2: a strict reading of a qcow2 header (QEMU's docs/interop/qcow2.txt):
 * every offset and length is bounded by what was read, and anything a plain
 * overlay made by `qemu-img create -b` does not have is refused, so that
 * `qemu-img rebase -u`, run as root on a session's disk layer, meets only
 * the kind of image kiln itself makes. */
#include "qcow2.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define QCOW2_MAGIC 0x514649fbu

/* Header extensions a plain overlay carries. */
#define EXT_END            0x00000000u
#define EXT_BACKING_FORMAT 0xe2792acau
#define EXT_FEATURE_TABLE  0x6803f857u

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p)
{
	return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static int bad(struct kiln_err *err, const char *what)
{
	return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's disk layer is not a plain qcow2 overlay: %s",
			    what);
}

/* The last two '/'-separated components of s (all of s if it has fewer). */
static const char *tail2(const char *s, size_t len, size_t *tlen)
{
	size_t i = len, seen = 0;

	while (i > 0) {
		if (s[i - 1] == '/' && ++seen == 2)
			break;
		i--;
	}
	*tlen = len - i;
	return s + i;
}

int qcow2_header_check(const uint8_t *buf, size_t len, const char *backing_tail, struct kiln_err *err)
{
	uint32_t version, cluster_bits, hdr_len, bsize;
	uint64_t boff, cluster, limit, off;
	const char *want;
	size_t wlen, glen;

	if (len < 72 || be32(buf) != QCOW2_MAGIC)
		return bad(err, "no qcow2 magic");
	version = be32(buf + 4);
	if (version != 2 && version != 3)
		return bad(err, "version is not 2 or 3");
	boff = be64(buf + 8);
	bsize = be32(buf + 16);
	cluster_bits = be32(buf + 20);
	if (cluster_bits < 9 || cluster_bits > 16)
		return bad(err, "cluster size out of 512 B..64 KiB");
	cluster = 1ull << cluster_bits;
	limit = cluster < len ? cluster : len; /* everything below must lie here */
	if (be32(buf + 32) != 0)
		return bad(err, "encrypted");
	if (be32(buf + 60) != 0)
		return bad(err, "internal snapshots");
	hdr_len = 72;
	if (version == 3) {
		if (len < 104)
			return bad(err, "short version 3 header");
		if (be64(buf + 72) != 0)
			return bad(err, "incompatible feature bits set (external data file, dirty, corrupt, ...)");
		if (be64(buf + 88) != 0)
			return bad(err, "autoclear feature bits set");
		hdr_len = be32(buf + 100);
		if (hdr_len < 104 || hdr_len % 8 || hdr_len > limit)
			return bad(err, "header length out of bounds");
	}
	/* Extensions: from the header's end to the end marker, all in limit. */
	off = hdr_len;
	for (;;) {
		uint32_t type, elen;

		if (off + 8 > limit)
			return bad(err, "header extensions run past the first cluster");
		type = be32(buf + off);
		elen = be32(buf + off + 4);
		if (type == EXT_END)
			break;
		if (type != EXT_BACKING_FORMAT && type != EXT_FEATURE_TABLE)
			return bad(err, "a header extension a plain overlay does not have (data file, bitmaps, encryption, ...)");
		if (elen > limit || off + 8 + ((uint64_t)elen + 7) / 8 * 8 > limit)
			return bad(err, "a header extension runs past the first cluster");
		if (type == EXT_BACKING_FORMAT && !(elen == 5 && !memcmp(buf + off + 8, "qcow2", 5)))
			return bad(err, "the backing file's format is not qcow2");
		off += 8 + ((uint64_t)elen + 7) / 8 * 8;
	}
	/* The backing file: present, bounded, and the template it was made on. */
	if (!boff || !bsize || bsize > 1023 || boff < off + 8 || boff > limit || bsize > limit - boff)
		return bad(err, "no backing file name inside the first cluster");
	if (memchr(buf + boff, '\0', bsize))
		return bad(err, "a NUL in the backing file name");
	want = tail2(backing_tail, strlen(backing_tail), &wlen);
	tail2((const char *)buf + boff, bsize, &glen);
	if (glen != wlen || memcmp(buf + boff + bsize - glen, want, wlen))
		return bad(err, "its backing file is not this session's template");
	return 0;
}

int qcow2_file_check(const char *path, const char *backing, struct kiln_err *err)
{
	static __thread uint8_t buf[QCOW2_HEADER_MAX];
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	ssize_t n;
	size_t got = 0;

	if (fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
	while (got < sizeof(buf) && (n = read(fd, buf + got, sizeof(buf) - got)) > 0)
		got += (size_t)n;
	close(fd);
	return qcow2_header_check(buf, got, backing, err);
}
