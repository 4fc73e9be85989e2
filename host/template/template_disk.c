/* template_disk: the template store's on-disk pieces: a file's SHA-256 and
 * its check against a TREF, disk usage, the last_used file whose shared
 * flock marks a template or snapshot in use (and whose mtime says when it
 * was last used), removal of what nobody holds, and the LRU choice of what
 * to evict. See template.c for the store's invariants. */
#include "template_int.h"


#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "clock.h"
#include "fsutil.h"
#include "io.h"
#include "proto.h"
#include "run/run.h"
#include "spec.h"

/* ---- files ---- */

/* Not fs_sha256_file: the size returned is that of exactly the bytes hashed
 * (no stat racing a writer), links are not followed, and images of hundreds
 * of MiB are read 1 MiB at a time. */
int template_file_sha256(const char *path, char hex[65], uint64_t *size)
{
	static const char digits[] = "0123456789abcdef";
	unsigned char d[32], *buf;
	unsigned int dl = 0;
	EVP_MD_CTX *md;
	uint64_t total = 0;
	ssize_t n;
	int fd, r = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	md = EVP_MD_CTX_new();
	buf = malloc(1 << 20);
	if (!md || !buf) {
		r = -ENOMEM;
		goto out;
	}
	EVP_DigestInit_ex(md, EVP_sha256(), NULL);
	while ((n = read(fd, buf, 1 << 20)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			goto out;
		}
		EVP_DigestUpdate(md, buf, (size_t)n);
		total += (uint64_t)n;
	}
	EVP_DigestFinal_ex(md, d, &dl);
	for (unsigned i = 0; i < 32; i++) {
		hex[2 * i] = digits[d[i] >> 4];
		hex[2 * i + 1] = digits[d[i] & 15];
	}
	hex[64] = '\0';
	if (size)
		*size = total;
out:
	free(buf);
	EVP_MD_CTX_free(md);
	close(fd);
	return r;
}

int template_verify_file(const char *path, const struct template_ref *ref, struct kiln_err *err)
{
	char hex[65];
	uint64_t size = 0;
	int r = template_file_sha256(path, hex, &size);

	if (r < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(-r));
	if (size != ref->size)
		return kiln_err_set(err, KERR_INVALID_IMAGE,
				    "template %s: the image is %llu bytes, the reference says %llu (refused, not used)",
				    ref->name, (unsigned long long)size, (unsigned long long)ref->size);
	if (strcmp(hex, ref->sha256))
		return kiln_err_set(err, KERR_INVALID_IMAGE,
				    "template %s: sha256 mismatch: the image hashes to %s, the reference says %s (refused, not used)",
				    ref->name, hex, ref->sha256);
	return 0;
}

/* Bytes a directory tree occupies (allocated blocks), not following links. */
uint64_t template_du_at(int at, const char *name, int depth)
{
	struct stat st;
	uint64_t total = 0;
	DIR *d;
	struct dirent *e;
	int fd;

	if (fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	total = (uint64_t)st.st_blocks * 512;
	if (!S_ISDIR(st.st_mode) || depth > 4)
		return total;
	fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return total;
	}
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			total += template_du_at(dirfd(d), e->d_name, depth + 1);
	closedir(d);
	return total;
}

/* Open (creating it) dir/last_used, whose mtime is dir's last use and
 * whose flock marks it in use. -1 on failure. */
static int open_last_used(const char *dir, int flags)
{
	char p[PATH_MAX + 16];

	snprintf(p, sizeof(p), "%s/last_used", dir);
	return open(p, flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
}

/* Open dir/last_used and take a shared lock on it: the mark of "in use"
 * that another process's eviction respects. -1 on failure. */
int template_lock_shared(const char *dir)
{
	int fd = open_last_used(dir, O_RDWR);

	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_SH | LOCK_NB) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Mark dir used now (its last_used file's mtime). */
void template_touch_used(const char *dir)
{
	int fd = open_last_used(dir, O_WRONLY);

	if (fd >= 0) {
		futimens(fd, NULL);
		close(fd);
	}
}

/* dir's last use (ms since the epoch); a directory without a last_used
 * file gets one now (its clock starts at first sight: an older kiln-host
 * that does not touch would otherwise lose a snapshot it uses). */
int64_t template_last_used_ms(const char *dir)
{
	char p[PATH_MAX + 16];
	struct stat st;

	snprintf(p, sizeof(p), "%s/last_used", dir);
	if (stat(p, &st) < 0) {
		template_touch_used(dir);
		return clock_wall_ms();
	}
	return (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
}

/* Remove dir if no process holds its last_used lock: 1 removed, 0 in use. */
int template_remove_unlocked(const char *dir)
{
	int fd = open_last_used(dir, O_RDWR), r;

	if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
		close(fd);
		return 0;
	}
	r = fs_rmtree(dir);
	if (fd >= 0)
		close(fd);
	return r == 0;
}

size_t template_lru_choose(const struct template_lru *e, size_t n, uint64_t total, uint64_t budget, size_t *idx)
{
	size_t count = 0;
	char *taken = calloc(n ? n : 1, 1);

	if (!taken)
		return 0;
	while (total > budget) {
		size_t best = n;

		for (size_t i = 0; i < n; i++)
			if (!taken[i] && !e[i].in_use && e[i].evictable &&
			    (best == n || e[i].last_used_ms < e[best].last_used_ms))
				best = i;
		if (best == n)
			break;
		taken[best] = 1;
		idx[count++] = best;
		total = e[best].bytes >= total ? 0 : total - e[best].bytes;
	}
	free(taken);
	return count;
}
