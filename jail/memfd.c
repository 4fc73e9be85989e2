/* memfd: a file's contents in a sealed memfd, the way a snapshot's RAM is
 * handed to the clones started from it (each maps it privately,
 * copy-on-write, and none can change it for the others). */
#include "jail_int.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

int jail_sealed_memfd(const char *path, struct stat *st, struct kiln_err *err)
{
	int in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), fd = -1;
	off_t pos = 0;

	if (in < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(in, st) < 0 || !S_ISREG(st->st_mode)) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: not a regular file", path);
		goto fail;
	}
	/* MFD_NOEXEC_SEAL (Linux 6.3+) where the kernel has it. */
	fd = memfd_create("kiln-snapshot-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING | 0x0008U);
	if (fd < 0 && errno == EINVAL)
		fd = memfd_create("kiln-snapshot-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, st->st_size) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "memfd for %s: %s", path, strerror(errno));
		goto fail;
	}
	/* Every page is allocated here, holes too (zeroed), and so charged to
	 * the caller: a hole left in a shmem file would get a page allocated on
	 * a clone's first touch, charged to that clone's memory cgroup on top of
	 * its own copy-on-write page, and left in the memfd after it. Then only
	 * the data is copied (guest RAM never touched is a hole in the file). */
	if (fallocate(fd, 0, 0, st->st_size) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "memfd for %s: %s", path, strerror(errno));
		goto fail;
	}
	for (;;) {
		off_t data = lseek(in, pos, SEEK_DATA), hole;

		if (data < 0)
			break; /* ENXIO: no data after pos */
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			hole = st->st_size;
		for (off_t off = data; off < hole;) {
			off_t src = off;
			ssize_t n;

			if (lseek(fd, off, SEEK_SET) < 0 || (n = sendfile(fd, in, &src, (size_t)(hole - off))) <= 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "loading %s: %s", path, n == 0 ? "short read" : strerror(errno));
				goto fail;
			}
			off += n;
		}
		pos = hole;
	}
	/* From here nobody can change the contents, size or seals: write(),
	 * ftruncate, hole punching and shared writable mappings all fail with
	 * EPERM, whoever opens it (also through /proc/PID/fd). Private mappings
	 * stay writable: each clone's writes are copy-on-write in its own memory. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "sealing the memfd for %s: %s", path, strerror(errno));
		goto fail;
	}
	close(in);
	return fd;
fail:
	if (fd >= 0)
		close(fd);
	close(in);
	return -1;
}
