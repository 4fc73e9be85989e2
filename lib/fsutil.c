/* fsutil: directory trees, removed without following links. */
#include "fsutil.h"

#include <openssl/evp.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int rmtree_at(int dirfd, const char *name, int depth)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d;
	struct dirent *e;

	if (fd < 0)
		return unlinkat(dirfd, name, 0) == 0 || errno == ENOENT ? 0 : -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		/* DT_UNKNOWN (some filesystems): try it as a directory first. */
		if ((e->d_type == DT_DIR || e->d_type == DT_UNKNOWN) && depth < 64)
			rmtree_at(fd, e->d_name, depth + 1);
		else
			unlinkat(fd, e->d_name, 0);
	}
	closedir(d);
	return unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? 0 : -errno;
}

int fs_rmtree_at(int dirfd, const char *name)
{
	return rmtree_at(dirfd, name, 0);
}

int fs_rmtree(const char *path)
{
	return rmtree_at(AT_FDCWD, path, 0);
}

int fs_mkdir_p(const char *path, mode_t mode)
{
	char tmp[PATH_MAX];

	if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return mkdir(tmp, mode) < 0 && errno != EEXIST ? -errno : 0;
}

char *fs_read_secret(const char *path, const char *key, const char *file, struct kiln_err *err)
{
	FILE *f = fopen(path, "re");
	char buf[1024], *nl;

	if (!f) {
		kiln_err_set(err, "config", "%s: %s: cannot read %s: %s", file, key, path, strerror(errno));
		return NULL;
	}
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	nl = strchr(buf, '\n');
	if (nl)
		*nl = '\0';
	if (!buf[0]) {
		kiln_err_set(err, "config", "%s: %s: %s is empty", file, key, path);
		return NULL;
	}
	return strdup(buf);
}

int fs_sha256_file(const char *path, char out[65])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned char buf[65536], d[32];
	unsigned int dl = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = -1;
	ssize_t n;

	if (fd < 0 || !md)
		goto out;
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		EVP_DigestUpdate(md, buf, (size_t)n);
	if (n == 0 && EVP_DigestFinal_ex(md, d, &dl) && dl == 32) {
		for (int i = 0; i < 32; i++)
			snprintf(out + 2 * i, 3, "%02x", d[i]);
		r = 0;
	}
out:
	if (fd >= 0)
		close(fd);
	EVP_MD_CTX_free(md);
	return r;
}
