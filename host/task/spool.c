/* spool: durable task records and their directories on the host's disk. */
#include "spool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "proto.h"

int spool_init(const char *spool, struct kiln_err *err)
{
	char path[4096];

	if (mkdir(spool, 0700) < 0 && errno != EEXIST)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create spool directory %s: %s", spool, strerror(errno));
	snprintf(path, sizeof(path), "%s/tasks", spool);
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", path, strerror(errno));
	return 0;
}

int spool_write_json(const char *dir, const char *name, json_t *j, int flags, struct kiln_err *err)
{
	char tmp[4096], path[4096];
	char *s = json_dumps(j, JSON_COMPACT);
	int fd = -1, dfd = -1, r = -1;

	if (!s)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot encode %s", name);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || proto_write_all(fd, s, strlen(s), 0) < 0 ||
	    ((flags & SPOOL_DURABLE) && fsync(fd) < 0)) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot write %s: %s", tmp, strerror(errno));
		goto out;
	}
	if (rename(tmp, path) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot rename %s: %s", tmp, strerror(errno));
		goto out;
	}
	if (!(flags & SPOOL_DURABLE)) {
		r = 0;
		goto out;
	}
	/* The rename is durable only once the directory is. */
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || fsync(dfd) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot sync %s: %s", dir, strerror(errno));
		goto out;
	}
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
	if (r < 0)
		unlink(tmp);
	free(s);
	return r;
}

int spool_rm_tree(const char *path)
{
	return fs_rmtree(path);
}

int spool_id_ok(const char *s)
{
	size_t n = 0;

	if (!s || !*s || *s == '.')
		return 0;
	for (; s[n]; n++) {
		char ch = s[n];

		if (n >= 64 || !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
				 ch == '_' || ch == '-' || ch == '.'))
			return 0;
	}
	return 1;
}
