/* fsutil: directory trees, removed without following links. */
#include "fsutil.h"

#include <openssl/evp.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"

/* ---- tree removal ----
 *
 * A tree a VM or a guest wrote can be deeper than PATH_MAX and than the fds
 * we may hold (a hostile guest sent a 2,048-level a/a/…/a), so the walk is
 * iterative and never builds a path. The top RMTREE_KEPT levels keep their
 * directory stream open (a wide tree is read once); below that only the
 * current directory is open, the walk climbs back with openat("..") and
 * re-reads the parent, whose removed entries are gone. Every level's
 * (st_dev, st_ino) is remembered and checked on the way up: a directory
 * renamed away under the walk makes it stop there rather than follow ".."
 * out of the tree. Symbolic links are removed, never followed. */
#define RMTREE_KEPT 32

struct rm_level {
	DIR *d;       /* levels < RMTREE_KEPT: the open stream */
	dev_t dev;
	ino_t ino;
	char child[NAME_MAX + 1]; /* levels < RMTREE_KEPT: the subdirectory being emptied */
};

struct rm_walk {
	struct rm_level *lv;
	size_t cap, top; /* lv[0..top] is the path from the root of the walk */
	int deep_fd;     /* top >= RMTREE_KEPT: the current directory */
	int err;         /* first error (negative errno) */
};

static void rm_note(struct rm_walk *w, int e)
{
	if (!w->err)
		w->err = -e;
}

/* Push the directory fd (taken over) as level top + 1. */
static int rm_push(struct rm_walk *w, int fd)
{
	struct stat st;
	size_t n = w->top + 1;

	if (fstat(fd, &st) < 0) {
		close(fd);
		return -errno;
	}
	if (n >= w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 64;
		struct rm_level *lv = realloc(w->lv, cap * sizeof(*lv));

		if (!lv) {
			close(fd);
			return -ENOMEM;
		}
		w->lv = lv;
		w->cap = cap;
	}
	w->lv[n].dev = st.st_dev;
	w->lv[n].ino = st.st_ino;
	w->lv[n].d = NULL;
	w->lv[n].child[0] = '\0';
	if (n < RMTREE_KEPT) {
		if (!(w->lv[n].d = fdopendir(fd))) {
			close(fd);
			return -errno;
		}
	} else {
		if (w->deep_fd >= 0)
			close(w->deep_fd);
		w->deep_fd = fd;
	}
	w->top = n;
	return 0;
}

/* The current level's directory fd. */
static int rm_fd(struct rm_walk *w)
{
	return w->top < RMTREE_KEPT ? dirfd(w->lv[w->top].d) : w->deep_fd;
}

/* Leave every deep level: back to the deepest level with an open stream,
 * which then moves on past the subdirectory it was emptying. */
static void rm_unwind_deep(struct rm_walk *w)
{
	if (w->deep_fd >= 0)
		close(w->deep_fd);
	w->deep_fd = -1;
	w->top = RMTREE_KEPT - 1;
	w->lv[w->top].child[0] = '\0';
}

/* The current level is empty (or done with): go up one level. */
static void rm_pop(struct rm_walk *w)
{
	size_t n = w->top;

	if (n < RMTREE_KEPT) {
		closedir(w->lv[n].d);
		w->lv[n].d = NULL;
		w->top = n - 1;
		if (unlinkat(dirfd(w->lv[n - 1].d), w->lv[n - 1].child, AT_REMOVEDIR) < 0 && errno != ENOENT)
			rm_note(w, errno);
		w->lv[n - 1].child[0] = '\0';
		return;
	}
	if (n == RMTREE_KEPT) {
		close(w->deep_fd);
		w->deep_fd = -1;
		w->top = n - 1;
		if (unlinkat(dirfd(w->lv[n - 1].d), w->lv[n - 1].child, AT_REMOVEDIR) < 0 && errno != ENOENT)
			rm_note(w, errno);
		w->lv[n - 1].child[0] = '\0';
		return;
	}
	/* A deep level: climb with "..", which must be the directory we came
	 * from; the re-read of the parent removes the now empty child. */
	int up = openat(w->deep_fd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;

	if (up < 0 || fstat(up, &st) < 0 || st.st_dev != w->lv[n - 1].dev || st.st_ino != w->lv[n - 1].ino) {
		rm_note(w, up < 0 ? errno : ESTALE);
		if (up >= 0)
			close(up);
		rm_unwind_deep(w);
		return;
	}
	close(w->deep_fd);
	w->deep_fd = up;
	w->top = n - 1;
}

/* One step at the current level: remove the next entry, or descend into a
 * non-empty subdirectory. Returns 1 when the level has nothing left to
 * look at, 0 otherwise. */
static int rm_step(struct rm_walk *w)
{
	size_t n = w->top;
	int fd = rm_fd(w), is_dir, sub;
	DIR *d;
	struct dirent *e;

	if (n < RMTREE_KEPT) {
		d = w->lv[n].d;
	} else {
		/* A deep level is read afresh each time it is (re)entered. */
		int dup_fd = dup(fd);

		if (dup_fd < 0 || !(d = fdopendir(dup_fd))) {
			rm_note(w, errno);
			if (dup_fd >= 0)
				close(dup_fd);
			rm_unwind_deep(w);
			return 0;
		}
		rewinddir(d);
	}
	for (;;) {
		errno = 0;
		if (!(e = readdir(d))) {
			if (errno)
				rm_note(w, errno);
			if (n >= RMTREE_KEPT)
				closedir(d);
			return 1;
		}
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		is_dir = e->d_type == DT_DIR;
		if (!is_dir && unlinkat(fd, e->d_name, 0) == 0)
			continue;
		if (!is_dir && errno != EISDIR) {
			if (errno == ENOENT)
				continue;
			rm_note(w, errno);
			if (n >= RMTREE_KEPT) { /* a re-read would find it again */
				closedir(d);
				rm_unwind_deep(w);
				return 0;
			}
			continue;
		}
		if (unlinkat(fd, e->d_name, AT_REMOVEDIR) == 0 || errno == ENOENT)
			continue;
		if (errno != ENOTEMPTY && errno != EEXIST) {
			rm_note(w, errno);
			if (n >= RMTREE_KEPT) { /* a re-read would find it again: give up below the kept levels */
				closedir(d);
				rm_unwind_deep(w);
				return 0;
			}
			continue;
		}
		sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (n < RMTREE_KEPT)
			snprintf(w->lv[n].child, sizeof(w->lv[n].child), "%s", e->d_name);
		else
			closedir(d);
		if (sub < 0) {
			rm_note(w, errno);
			if (n >= RMTREE_KEPT)
				rm_unwind_deep(w);
			else
				w->lv[n].child[0] = '\0';
			return 0;
		}
		if ((sub = rm_push(w, sub)) < 0) {
			rm_note(w, -sub);
			if (n >= RMTREE_KEPT)
				rm_unwind_deep(w);
			else
				w->lv[n].child[0] = '\0';
		}
		return 0;
	}
}

int fs_rmtree_at(int dirfd, const char *name)
{
	struct rm_walk w = { .deep_fd = -1, .top = (size_t)-1 };
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), r;

	if (fd < 0)
		return unlinkat(dirfd, name, 0) == 0 || errno == ENOENT ? 0 : -errno;
	if ((r = rm_push(&w, fd)) < 0) {
		free(w.lv);
		return r;
	}
	for (;;) {
		if (!rm_step(&w))
			continue;
		if (w.top == 0)
			break;
		rm_pop(&w);
	}
	closedir(w.lv[0].d);
	free(w.lv);
	return unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? 0 : -errno;
}

int fs_rmtree(const char *path)
{
	return fs_rmtree_at(AT_FDCWD, path);
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
		kiln_err_set(err, KERR_CONFIG, "%s: %s: cannot read %s: %s", file, key, path, strerror(errno));
		return NULL;
	}
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	nl = strchr(buf, '\n');
	if (nl)
		*nl = '\0';
	if (!buf[0]) {
		kiln_err_set(err, KERR_CONFIG, "%s: %s: %s is empty", file, key, path);
		return NULL;
	}
	return strdup(buf);
}

static void sha256_hex(const unsigned char d[32], char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}

int fs_sha256_buf(const void *p, size_t len, char out[65])
{
	unsigned char d[32];
	unsigned int dl = 0;

	if (!EVP_Digest(p, len, d, &dl, EVP_sha256(), NULL) || dl != 32)
		return -1;
	sha256_hex(d, out);
	return 0;
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
		sha256_hex(d, out);
		r = 0;
	}
out:
	if (fd >= 0)
		close(fd);
	EVP_MD_CTX_free(md);
	return r;
}

int fs_proc_stat(pid_t pid, int first, int n, unsigned long long *v)
{
	char path[64], buf[1024], *p, *end;
	int i;

	if (first < 3 || n < 1)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (io_read_small(path, buf, sizeof(buf)) < 0)
		return -1;
	/* Fields start after the last ')': the command name is field 2. */
	p = strrchr(buf, ')');
	for (i = 2; p && i < first; i++)
		p = strchr(p + 1, ' ');
	for (i = 0; p && i < n; i++) {
		errno = 0;
		v[i] = strtoull(p + 1, &end, 10);
		if (errno || end == p + 1)
			return -1;
		p = *end == ' ' ? end : NULL;
		if (!p && i + 1 < n)
			return -1;
	}
	return p || i == n ? 0 : -1;
}

int fs_oom_score_adj(int adj)
{
	char v[16];
	int n = snprintf(v, sizeof(v), "%d", adj), fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, v, (size_t)n) != n)
		r = -errno;
	close(fd);
	return r;
}

void fs_daemon_start(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, set, NULL);
	signal(SIGPIPE, SIG_IGN);
	fs_oom_score_adj(DAEMON_OOM_SCORE_ADJ);
}
