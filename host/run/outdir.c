/* outdir: safe creation of guest-named files under a host directory. */
#include "outdir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto.h"

int outdir_open(const char *path, struct kiln_err *err)
{
	int fd;

	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create output directory %s: %s", path, strerror(errno));
	fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot open output directory %s: %s", path, strerror(errno));
	return fd;
}

/* Walk the directory components of rel (all but the last when leaf is set),
 * creating them, and return an fd of the last directory reached; *last gets
 * the remaining leaf name. Never follows a symlink. */
static int walk(int dirfd, const char *rel, int leaf, char *namebuf, const char **last, unsigned *created,
		struct kiln_err *err)
{
	char *p, *slash;
	int fd;

	if (proto_relpath_ok(rel) < 0)
		return kiln_err_set(err, KERR_VM_ERROR, "refusing unsafe output path");
	snprintf(namebuf, PROTO_MAX_PATH + 1, "%s", rel);
	fd = dup(dirfd);
	if (fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "dup: %s", strerror(errno));
	for (p = namebuf;; p = slash + 1) {
		int next;

		slash = strchr(p, '/');
		if (!slash && leaf) {
			*last = p;
			return fd;
		}
		if (slash)
			*slash = '\0';
		if (mkdirat(fd, p, 0755) == 0) {
			if (created)
				++*created;
		} else if (errno != EEXIST) {
			kiln_err_set(err, KERR_HOST_ERROR, "cannot create output directory %s: %s", rel, strerror(errno));
			close(fd);
			return -1;
		}
		next = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		close(fd);
		if (next < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "cannot open output directory %s: %s", rel, strerror(errno));
		fd = next;
		if (!slash)
			return fd;
	}
}

int outdir_mkdir(int dirfd, const char *rel, unsigned *created, struct kiln_err *err)
{
	char name[PROTO_MAX_PATH + 1];
	int fd = walk(dirfd, rel, 0, name, NULL, created, err);

	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

int outdir_create(int dirfd, const char *rel, uint32_t mode, unsigned *created, struct kiln_err *err)
{
	char name[PROTO_MAX_PATH + 1];
	const char *leaf = NULL;
	int dfd = walk(dirfd, rel, 1, name, &leaf, created, err), fd;

	if (dfd < 0)
		return -1;
	fd = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode & 0755) | 0600);
	close(dfd);
	if (fd < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create output file %s: %s", rel, strerror(errno));
	if (created)
		++*created;
	return fd;
}

unsigned outdir_depth(const char *rel, int leaf)
{
	unsigned n = 1;

	for (const char *p = rel; *p; p++)
		n += *p == '/';
	return leaf ? n - 1 : n;
}
