/* pause_cache: a session's latest pause chunks kept on this host (see
 * pause_cache.h). Every function is best effort: a cache that cannot be
 * written or read only sends the resume to S3. */
#include "pause_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "spool.h"

static int64_t wall_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int pcache_init(struct pause_cache *pc, const char *spool_dir, unsigned budget_mib, unsigned max_age_s)
{
	char root[PATH_MAX];

	memset(pc, 0, sizeof(*pc));
	if (snprintf(root, sizeof(root), "%s/pause-cache", spool_dir) >= (int)sizeof(root)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	if (!budget_mib) {
		fs_rmtree(root); /* turned off: nothing of an earlier run stays */
		return 0;
	}
	if (fs_mkdir_p(root, 0700) < 0)
		return -1;
	snprintf(pc->root, sizeof(pc->root), "%s", root);
	pc->budget = (uint64_t)budget_mib << 20;
	pc->max_age_ms = (int64_t)max_age_s * 1000;
	pcache_prune(pc, NULL, NULL);
	return 0;
}

int pcache_dir(const struct pause_cache *pc, const char *customer, const char *id, int create, char *out,
	       size_t cap)
{
	char cdir[PATH_MAX];

	out[0] = '\0';
	/* Ids checked as for every path kiln-host makes of them: no '/', no
	 * leading '.', bounded. */
	if (!pc->root[0] || !spool_id_ok(customer) || !spool_id_ok(id) ||
	    snprintf(cdir, sizeof(cdir), "%s/%s", pc->root, customer) >= (int)sizeof(cdir) ||
	    snprintf(out, cap, "%s/%s", cdir, id) >= (int)cap) {
		out[0] = '\0';
		return -1;
	}
	if (!create)
		return access(out, F_OK) == 0 ? 0 : (out[0] = '\0', -1);
	fs_rmtree(out);
	if ((mkdir(cdir, 0700) < 0 && errno != EEXIST) || mkdir(out, 0700) < 0) {
		out[0] = '\0';
		return -1;
	}
	return 0;
}

void pcache_drop(const struct pause_cache *pc, const char *customer, const char *id)
{
	char dir[PATH_MAX];

	if (pcache_dir(pc, customer, id, 0, dir, sizeof(dir)) == 0)
		fs_rmtree(dir);
}

struct pc_session {
	char path[PATH_MAX];
	uint64_t bytes;
	int64_t newest_ms;
	int keep;
};

static int older_first(const void *a, const void *b)
{
	const struct pc_session *x = a, *y = b;

	return (x->newest_ms > y->newest_ms) - (x->newest_ms < y->newest_ms);
}

/* One session's directory: files past the age limit go, the rest are
 * counted. */
static void scan_session(const struct pause_cache *pc, struct pc_session *s, int64_t now)
{
	DIR *d = opendir(s->path);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		struct stat st;
		int64_t mt;

		if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		mt = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
		if (!S_ISREG(st.st_mode) || now - mt > pc->max_age_ms) {
			fs_rmtree_at(dirfd(d), e->d_name);
			continue;
		}
		s->bytes += (uint64_t)st.st_size;
		if (mt > s->newest_ms)
			s->newest_ms = mt;
	}
	closedir(d);
}

void pcache_prune(const struct pause_cache *pc, const char *keep_customer, const char *keep_id)
{
	struct pc_session *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	int64_t now = wall_ms();
	DIR *cd;
	struct dirent *c;

	if (!pc->root[0] || !(cd = opendir(pc->root)))
		return;
	while ((c = readdir(cd))) {
		char cpath[PATH_MAX];
		DIR *sd;
		struct dirent *e;
		int any = 0;

		if (c->d_name[0] == '.' ||
		    snprintf(cpath, sizeof(cpath), "%s/%s", pc->root, c->d_name) >= (int)sizeof(cpath) ||
		    !(sd = opendir(cpath)))
			continue;
		while ((e = readdir(sd))) {
			struct pc_session s = { .newest_ms = 0 };

			if (e->d_name[0] == '.' ||
			    snprintf(s.path, sizeof(s.path), "%s/%s", cpath, e->d_name) >= (int)sizeof(s.path))
				continue;
			s.keep = keep_customer && keep_id && !strcmp(c->d_name, keep_customer) && !strcmp(e->d_name, keep_id);
			scan_session(pc, &s, now);
			if (!s.bytes && !s.keep) {
				rmdir(s.path); /* emptied by age (or never filled) */
				continue;
			}
			any = 1;
			total += s.bytes;
			if (n == cap) {
				struct pc_session *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof(*v));

				if (!nv)
					break;
				v = nv;
			}
			v[n++] = s;
		}
		closedir(sd);
		if (!any)
			rmdir(cpath);
	}
	closedir(cd);
	qsort(v, n, sizeof(*v), older_first);
	for (size_t i = 0; i < n && total > pc->budget; i++) {
		if (v[i].keep)
			continue;
		fs_rmtree(v[i].path);
		total -= v[i].bytes;
	}
	free(v);
}
