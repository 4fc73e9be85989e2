/* oci_tree: the walks over a tree that umoci unpacked from a customer's
 * image. Every step is relative to an open directory fd with O_NOFOLLOW /
 * AT_SYMLINK_NOFOLLOW: a symbolic link in the tree is an entry like any
 * other, never a way out of it (its target is resolved inside the guest
 * only). The tree never crosses into another file system: a different
 * st_dev is refused rather than walked. */
#include "oci_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* A DIR stream over the directory dfd names (its own descriptor: the
 * caller's dfd stays open). NULL with errno set. */
static DIR *dir_stream(int dfd)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;

	if (fd < 0)
		return NULL;
	if (!(d = fdopendir(fd))) {
		int e = errno;
		close(fd);
		errno = e;
	}
	return d;
}

/* The next entry of d other than "." and "..": NULL at the end (errno 0)
 * or on an error (errno set). */
static struct dirent *dir_next(DIR *d)
{
	struct dirent *de;

	do {
		errno = 0;
		de = readdir(d);
	} while (de && (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")));
	return de;
}

/* ---- usage: the watch while the jail unpacks ------------------------------- */

struct usage {
	dev_t dev;
	uint64_t max_bytes, bytes, inodes;
};

static int usage_dir(int dfd, struct usage *u, int depth)
{
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (depth > OCI_MAX_DEPTH)
		return 0; /* the final walk refuses it; the watch only counts */
	if (!(d = dir_stream(dfd)))
		return -errno;
	while (r == 0 && (de = dir_next(d))) {
		struct stat st;

		/* Entries vanish while the unpacker works (whiteouts, renames). */
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		u->bytes += (uint64_t)st.st_blocks * 512;
		u->inodes++;
		if (u->bytes > u->max_bytes || u->inodes > OCI_MAX_INODES)
			break;
		if (S_ISDIR(st.st_mode) && st.st_dev == u->dev) {
			int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub < 0)
				continue;
			r = usage_dir(sub, u, depth + 1);
			close(sub);
		}
	}
	closedir(d);
	return r;
}

int oci_tree_usage(int dirfd, uint64_t max_bytes, uint64_t *bytes, uint64_t *inodes)
{
	struct usage u = { .max_bytes = max_bytes };
	struct stat st;
	int r;

	if (fstat(dirfd, &st) < 0)
		return -errno;
	u.dev = st.st_dev;
	r = usage_dir(dirfd, &u, 0);
	*bytes = u.bytes;
	*inodes = u.inodes;
	return r;
}

/* ---- prepare: the tree made fit to be a kiln root ---------------------------- */

struct prep {
	dev_t dev;
	uint64_t max_bytes;
	struct oci_tree_stats *st;
	oci_log_fn log;
	void *ctx;
	struct kiln_err *err;
	char path[4096]; /* the entry's path in the image, for messages */
};

/* The xattr calls have no *at form in glibc: reach the entry through its
 * directory's fd in /proc/self/fd and the l* variants (which do not follow
 * a final symbolic link; name is one component, no '/'). */
static int fd_name(char *out, size_t cap, int dfd, const char *name)
{
	return snprintf(out, cap, "/proc/self/fd/%d/%s", dfd, name) < (int)cap ? 0 : -ENAMETOOLONG;
}

/* The owner umoci recorded, then every xattr removed: security.capability
 * would be a set-uid bit by another name, and kiln's guests need none. */
static int entry_owner_and_xattrs(struct prep *p, int dfd, const char *name, uint32_t *uid, uint32_t *gid)
{
	char path[4200], list[4096], val[64];
	ssize_t n, vn;

	*uid = *gid = 0;
	if (fd_name(path, sizeof(path), dfd, name) < 0)
		return kiln_err_set(p->err, KERR_INVALID_IMAGE, "%s: name too long", p->path);
	vn = lgetxattr(path, OCI_ROOTLESS_XATTR, val, sizeof(val));
	if (vn >= 0 && oci_rootless_owner((const uint8_t *)val, (size_t)vn, uid, gid) < 0)
		return kiln_err_set(p->err, KERR_INVALID_IMAGE, "%s: unreadable owner record", p->path);
	n = llistxattr(path, list, sizeof(list));
	if (n < 0 && errno == ERANGE)
		return kiln_err_set(p->err, KERR_INVALID_IMAGE, "%s: too many extended attributes", p->path);
	if (n > 0) {
		p->st->cleared_xattrs++;
		for (char *a = list; a < list + n; a += strlen(a) + 1)
			if (lremovexattr(path, a) < 0 && errno != ENODATA)
				return kiln_err_set(p->err, KERR_HOST_ERROR, "%s: removing xattr %s: %s", p->path, a,
						    strerror(errno));
	}
	return 0;
}

static int prep_dir(struct prep *p, int dfd, int depth);

static int prep_entry(struct prep *p, int dfd, const char *name, int depth)
{
	struct stat st;
	uint32_t uid, gid;
	size_t pl = strlen(p->path);
	int r = 0;

	if (pl + 1 + strlen(name) >= sizeof(p->path))
		return kiln_err_set(p->err, KERR_INVALID_IMAGE, "%s/...: path too long", p->path);
	snprintf(p->path + pl, sizeof(p->path) - pl, "/%s", name);
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: %s", p->path, strerror(errno));
		goto out;
	}
	if (st.st_dev != p->dev) {
		r = kiln_err_set(p->err, KERR_INVALID_IMAGE, "%s: on another file system", p->path);
		goto out;
	}
	if (++p->st->inodes > OCI_MAX_INODES) {
		r = kiln_err_set(p->err, KERR_INVALID_IMAGE, "the image has more than %d files", OCI_MAX_INODES);
		goto out;
	}
	if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
		/* The guest's /dev is a devtmpfs; a node in the image could only
		 * be a way to a device the kernel did not mean to expose. */
		if (unlinkat(dfd, name, 0) < 0)
			r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: %s", p->path, strerror(errno));
		else if (p->st->removed_nodes++ < 20)
			p->log(p->ctx, "removed %s (%s)", p->path,
			       S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device node" :
			       S_ISFIFO(st.st_mode) ? "a FIFO" : "a socket");
		goto out;
	}
	p->st->bytes += (uint64_t)st.st_blocks * 512;
	if (p->st->bytes > p->max_bytes) {
		r = kiln_err_set(p->err, KERR_TOO_LARGE, "the unpacked image is larger than %llu MiB",
				 (unsigned long long)(p->max_bytes >> 20));
		goto out;
	}
	if (S_ISLNK(st.st_mode)) {
		/* umoci cannot record a symbolic link's owner unprivileged: root's. */
		if (fchownat(dfd, name, 0, 0, AT_SYMLINK_NOFOLLOW) < 0)
			r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: chown: %s", p->path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
		r = kiln_err_set(p->err, KERR_INVALID_IMAGE, "%s: unsupported file type", p->path);
		goto out;
	}
	if ((r = entry_owner_and_xattrs(p, dfd, name, &uid, &gid)) < 0)
		goto out;
	if (fchownat(dfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) {
		r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: chown: %s", p->path, strerror(errno));
		goto out;
	}
	if (S_ISREG(st.st_mode)) {
		/* chown already drops the bits on Linux; chmod makes it explicit.
		 * A regular file stays one: nothing else writes to the tree now. */
		if ((st.st_mode & (S_ISUID | S_ISGID)) && p->st->cleared_suid++ < 20)
			p->log(p->ctx, "cleared the set-uid/set-gid bits of %s", p->path);
		if (fchmodat(dfd, name, st.st_mode & 01777, 0) < 0)
			r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: chmod: %s", p->path, strerror(errno));
		goto out;
	}
	/* A directory keeps set-gid (group inheritance, no privilege). */
	if (fchmodat(dfd, name, st.st_mode & 03777, 0) < 0) {
		r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: chmod: %s", p->path, strerror(errno));
		goto out;
	}
	{
		int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

		if (sub < 0) {
			r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: %s", p->path, strerror(errno));
			goto out;
		}
		r = prep_dir(p, sub, depth + 1);
		close(sub);
	}
out:
	p->path[pl] = '\0';
	return r;
}

static int prep_dir(struct prep *p, int dfd, int depth)
{
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (depth > OCI_MAX_DEPTH)
		return kiln_err_set(p->err, KERR_INVALID_IMAGE, "%s: directories nested deeper than %d", p->path,
				    OCI_MAX_DEPTH);
	if (!(d = dir_stream(dfd)))
		return kiln_err_set(p->err, KERR_HOST_ERROR, "%s: %s", p->path, strerror(errno));
	while (r == 0 && (de = dir_next(d)))
		r = prep_entry(p, dfd, de->d_name, depth);
	if (r == 0 && errno)
		r = kiln_err_set(p->err, KERR_HOST_ERROR, "%s: readdir: %s", p->path, strerror(errno));
	closedir(d);
	return r;
}

/* Make sure path (relative, components separated by '/') is a directory,
 * replacing whatever else the image put there, then set its owner and mode. */
static int ensure_dir(struct prep *p, int root_fd, const char *path, mode_t mode, uint32_t uid, uint32_t gid)
{
	char comp[256];
	const char *c = path;
	int dfd = root_fd, r = 0;

	while (*c) {
		size_t n = strcspn(c, "/");
		struct stat st;
		int next;

		memcpy(comp, c, n);
		comp[n] = '\0';
		c += n + (c[n] == '/');
		if (fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode)) {
			p->log(p->ctx, "replaced \"%s\" on the way to /%s (not a directory) with a directory", comp,
			       path);
			if (unlinkat(dfd, comp, 0) < 0) {
				r = kiln_err_set(p->err, KERR_HOST_ERROR, "/%s: %s", path, strerror(errno));
				break;
			}
		}
		if (mkdirat(dfd, comp, 0755) < 0 && errno != EEXIST) {
			r = kiln_err_set(p->err, KERR_HOST_ERROR, "mkdir /%s: %s", path, strerror(errno));
			break;
		}
		next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			r = kiln_err_set(p->err, KERR_HOST_ERROR, "/%s: %s", path, strerror(errno));
			break;
		}
		if (dfd != root_fd)
			close(dfd);
		dfd = next;
	}
	if (r == 0 && (fchown(dfd, uid, gid) < 0 || fchmod(dfd, mode) < 0))
		r = kiln_err_set(p->err, KERR_HOST_ERROR, "/%s: %s", path, strerror(errno));
	if (dfd != root_fd)
		close(dfd);
	return r;
}

static int write_hostname(struct prep *p, int root_fd)
{
	static const char text[] = "kiln\n";
	struct stat st;
	int etc, fd, r = 0;

	if ((etc = openat(root_fd, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return kiln_err_set(p->err, KERR_HOST_ERROR, "/etc: %s", strerror(errno));
	if (fstatat(etc, "hostname", &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) &&
	    unlinkat(etc, "hostname", S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0) {
		r = kiln_err_set(p->err, KERR_INVALID_IMAGE, "/etc/hostname is not a file and cannot be replaced: %s",
				 strerror(errno));
		goto out;
	}
	fd = openat(etc, "hostname", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, text, sizeof(text) - 1) != (ssize_t)(sizeof(text) - 1) || fchown(fd, 0, 0) < 0 ||
	    fchmod(fd, 0644) < 0)
		r = kiln_err_set(p->err, KERR_HOST_ERROR, "/etc/hostname: %s", strerror(errno));
	if (fd >= 0)
		close(fd);
out:
	close(etc);
	return r;
}

int oci_tree_prepare(int root_fd, uint32_t uid, uint32_t gid, uint64_t max_bytes, struct oci_tree_stats *st,
		     oci_log_fn log, void *ctx, struct kiln_err *err)
{
	/* What kiln-init mounts on (guest/init.c), then the task's two. */
	static const struct {
		const char *path;
		mode_t mode;
		int task_owned;
	} dirs[] = {
		{ "dev", 0755, 0 },  { "dev/pts", 0755, 0 }, { "dev/shm", 01777, 0 }, { "proc", 0555, 0 },
		{ "sys", 0555, 0 },  { "tmp", 01777, 0 },    { "run", 0755, 0 },      { "kiln", 0755, 0 },
		{ "etc", 0755, 0 },  { "work", 0755, 1 },    { "output", 0755, 1 },
	};
	struct prep *p = calloc(1, sizeof(*p));
	struct stat rst;
	int r = 0;

	memset(st, 0, sizeof(*st));
	if (!p)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	if (fstat(root_fd, &rst) < 0) {
		r = kiln_err_set(err, KERR_HOST_ERROR, "the unpacked tree: %s", strerror(errno));
		goto out;
	}
	*p = (struct prep){ .dev = rst.st_dev, .max_bytes = max_bytes, .st = st, .log = log, .ctx = ctx, .err = err };
	st->inodes = 1;
	st->bytes = (uint64_t)rst.st_blocks * 512;
	if (fchown(root_fd, 0, 0) < 0 || fchmod(root_fd, 0755) < 0) {
		r = kiln_err_set(err, KERR_HOST_ERROR, "the unpacked tree: %s", strerror(errno));
		goto out;
	}
	if ((r = prep_dir(p, root_fd, 0)) < 0)
		goto out;
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]) && r == 0; i++)
		r = ensure_dir(p, root_fd, dirs[i].path, dirs[i].mode, dirs[i].task_owned ? uid : 0,
			       dirs[i].task_owned ? gid : 0);
	if (r == 0)
		r = write_hostname(p, root_fd);
	if (st->removed_nodes > 20)
		log(ctx, "removed %u device nodes, FIFOs and sockets in all", st->removed_nodes);
	if (st->cleared_suid > 20)
		log(ctx, "cleared the set-uid/set-gid bits of %u files in all", st->cleared_suid);
out:
	free(p);
	return r < 0 ? -1 : 0;
}


/* ---- open up: a tree one jail wrote, for the next jail's uid to read -------- */

static int open_up_dir(int dfd, int depth, uint64_t *n)
{
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (depth > OCI_MAX_DEPTH)
		return -ELOOP;
	if (!(d = dir_stream(dfd)))
		return -errno;
	while (r == 0 && (de = dir_next(d))) {
		struct stat st;

		if (++*n > OCI_MAX_INODES)
			r = -EMLINK;
		else if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			r = -errno;
		else if (S_ISREG(st.st_mode)) {
			if (fchmodat(dfd, de->d_name, 0644, 0) < 0)
				r = -errno;
		} else if (S_ISDIR(st.st_mode)) {
			int sub = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub < 0 || fchmod(sub, 0755) < 0)
				r = -errno;
			else
				r = open_up_dir(sub, depth + 1, n);
			if (sub >= 0)
				close(sub);
		} else if (!S_ISLNK(st.st_mode) && unlinkat(dfd, de->d_name, 0) < 0) {
			r = -errno;
		}
	}
	closedir(d);
	return r;
}

int oci_tree_open_up(int dirfd)
{
	uint64_t n = 0;

	if (fchmod(dirfd, 0755) < 0)
		return -errno;
	return open_up_dir(dirfd, 0, &n);
}
