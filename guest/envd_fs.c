/* envd_fs: envd's users and file requests (lib/eproto.h STAT .. CANCEL).
 * Every file operation runs with the user's file-system identity (fsuid,
 * fsgid, groups: the kernel then drops root's file capabilities), so it can
 * do exactly what the user could; what a user's process planted (symlinks,
 * odd permissions) can cost only the user. Users come from the passwd and
 * group files directly (no NSS in a static binary). */
#include "envd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "init.h"

/* REMOVE descends at most this deep (each level holds a descriptor). */
#define ENVD_RM_DEPTH 256

static int envd_mkdir_parents(const char *path);

/* ---- users --------------------------------------------------------------- */

static void envd_user_groups(const struct envd_config *cfg, struct envd_user *u)
{
	struct group *g;
	FILE *f;

	u->ngroups = 0;
	u->groups[u->ngroups++] = u->gid;
	f = fopen(cfg->group, "re");
	if (!f)
		return;
	while ((g = fgetgrent(f)) && u->ngroups < ENVD_MAX_GROUPS) {
		char **m;

		if (g->gr_gid == u->gid)
			continue;
		for (m = g->gr_mem; m && *m; m++)
			if (!strcmp(*m, u->name)) {
				u->groups[u->ngroups++] = g->gr_gid;
				break;
			}
	}
	fclose(f);
}

int envd_user_lookup(const struct envd_config *cfg, const char *name, struct envd_user *u)
{
	struct passwd *pw;
	FILE *f;
	int r = -ENOENT;

	if (!name[0])
		name = ENVD_DEFAULT_USER;
	f = fopen(cfg->passwd, "re");
	if (!f)
		return -errno;
	while ((pw = fgetpwent(f))) {
		if (strcmp(pw->pw_name, name))
			continue;
		if (strlen(pw->pw_name) > EPROTO_MAX_USER || !pw->pw_dir || strlen(pw->pw_dir) > PROTO_MAX_PATH ||
		    pw->pw_dir[0] != '/') {
			r = -EINVAL;
			break;
		}
		memset(u, 0, sizeof(*u));
		snprintf(u->name, sizeof(u->name), "%s", pw->pw_name);
		snprintf(u->home, sizeof(u->home), "%s", pw->pw_dir);
		snprintf(u->shell, sizeof(u->shell), "%s", pw->pw_shell ? pw->pw_shell : "");
		u->uid = pw->pw_uid;
		u->gid = pw->pw_gid;
		r = 0;
		break;
	}
	fclose(f);
	if (r == 0)
		envd_user_groups(cfg, u);
	return r;
}

/* Is id taken as a uid (passwd) or gid (group)? */
static int envd_id_used(const struct envd_config *cfg, unsigned id)
{
	struct passwd *pw;
	struct group *g;
	int used = 0;
	FILE *f;

	f = fopen(cfg->passwd, "re");
	if (f) {
		while (!used && (pw = fgetpwent(f)))
			used = pw->pw_uid == id;
		fclose(f);
	}
	f = fopen(cfg->group, "re");
	if (f) {
		while (!used && (g = fgetgrent(f)))
			used = g->gr_gid == id;
		fclose(f);
	}
	return used;
}

static int envd_group_gid(const struct envd_config *cfg, const char *name, gid_t *gid)
{
	struct group *g;
	int found = 0;
	FILE *f;

	f = fopen(cfg->group, "re");
	if (!f)
		return 0;
	while (!found && (g = fgetgrent(f)))
		if (!strcmp(g->gr_name, name)) {
			*gid = g->gr_gid;
			found = 1;
		}
	fclose(f);
	return found;
}

/* Appends a line, on a line of its own even when the file lacks its last
 * newline. */
static int envd_append_line(const char *path, const char *line)
{
	char last = '\n';
	struct stat st;
	int fd, r = 0;

	fd = open(path, O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) == 0 && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) != 1)
		last = '\n';
	if (last != '\n' && write(fd, "\n", 1) != 1)
		r = -EIO;
	if (r == 0 && write(fd, line, strlen(line)) != (ssize_t)strlen(line))
		r = -EIO;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	return r;
}

static int envd_make_home(const struct envd_user *u)
{
	struct stat st;

	if (lstat(u->home, &st) == 0)
		return 0;
	if (errno != ENOENT)
		return -errno;
	/* /home itself may be missing from a minimal image. */
	if (envd_mkdir_parents(u->home) < 0 || mkdir(u->home, 0750) < 0)
		return -errno;
	/* Outside root (tests) the home stays the caller's. */
	if (geteuid() == 0 && lchown(u->home, u->uid, u->gid) < 0)
		return -errno;
	return 0;
}

int envd_ensure_user(const struct envd_config *cfg)
{
	char line[PROTO_MAX_PATH + 128], home[PROTO_MAX_PATH + 1];
	struct envd_user u;
	unsigned id;
	gid_t gid;
	int r, have_group;

	r = envd_user_lookup(cfg, ENVD_DEFAULT_USER, &u);
	if (r == 0)
		return envd_make_home(&u);
	if (r != -ENOENT)
		return r;
	for (id = ENVD_DEFAULT_UID; id < 60000 && envd_id_used(cfg, id); id++)
		;
	if (id >= 60000)
		return -EUSERS;
	if (snprintf(home, sizeof(home), "%s/%s", cfg->home_dir, ENVD_DEFAULT_USER) >= (int)sizeof(home))
		return -ENAMETOOLONG;
	have_group = envd_group_gid(cfg, ENVD_DEFAULT_USER, &gid);
	if (!have_group) {
		gid = id;
		snprintf(line, sizeof(line), "%s:x:%u:\n", ENVD_DEFAULT_USER, id);
		r = envd_append_line(cfg->group, line);
		if (r < 0)
			return r;
	}
	snprintf(line, sizeof(line), "%s:x:%u:%u::%s:/bin/bash\n", ENVD_DEFAULT_USER, id, (unsigned)gid, home);
	r = envd_append_line(cfg->passwd, line);
	if (r < 0)
		return r;
	if (cfg->shadow && access(cfg->shadow, F_OK) == 0) {
		snprintf(line, sizeof(line), "%s:!:19000:0:99999:7:::\n", ENVD_DEFAULT_USER);
		r = envd_append_line(cfg->shadow, line);
		if (r < 0)
			return r;
	}
	r = envd_user_lookup(cfg, ENVD_DEFAULT_USER, &u);
	return r < 0 ? r : envd_make_home(&u);
}

/* ---- identity and paths -------------------------------------------------- */

int envd_fs_enter(const struct envd_user *u)
{
	if (geteuid() != 0)
		return u->uid == geteuid() ? 0 : -EPERM;
	if (setgroups((size_t)u->ngroups, u->groups) < 0)
		return -errno;
	setfsgid(u->gid);
	setfsuid(u->uid);
	/* setfsuid() reports no error: ask again (-1 changes nothing). */
	if ((uid_t)setfsuid((uid_t)-1) != u->uid || (gid_t)setfsgid((gid_t)-1) != u->gid) {
		envd_fs_leave();
		return -EPERM;
	}
	return 0;
}

void envd_fs_leave(void)
{
	if (geteuid() != 0)
		return;
	setfsuid(0);
	setfsgid(0);
	setgroups(0, NULL);
}

int envd_resolve(const struct envd_user *u, const char *in, char out[PROTO_MAX_PATH + 1])
{
	char tmp[2 * PROTO_MAX_PATH + 2];
	size_t len = 0;
	char *comp, *save = NULL;

	if (!in[0])
		return -EINVAL;
	if (in[0] == '/')
		snprintf(tmp, sizeof(tmp), "%s", in);
	else
		snprintf(tmp, sizeof(tmp), "%s/%s", u->home, in);
	out[0] = '\0';
	for (comp = strtok_r(tmp, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
		size_t n = strlen(comp);

		if (!strcmp(comp, "."))
			continue;
		if (!strcmp(comp, "..")) {
			char *slash = strrchr(out, '/');

			if (slash) {
				*slash = '\0';
				len = (size_t)(slash - out);
			}
			continue;
		}
		if (n > NAME_MAX || len + 1 + n > PROTO_MAX_PATH)
			return -ENAMETOOLONG;
		out[len++] = '/';
		memcpy(out + len, comp, n + 1);
		len += n;
	}
	if (len == 0)
		strcpy(out, "/");
	return 0;
}

/* The last component of a clean absolute path ("" for "/"). */
static const char *envd_basename(const char *path)
{
	return strrchr(path, '/') + 1;
}

/* ---- entries ------------------------------------------------------------- */

static void envd_name_of(struct envd *e, int group, uint32_t id, char out[EPROTO_MAX_USER + 1])
{
	struct passwd *pw;
	struct group *g;
	struct envd_name *n;
	unsigned i;
	FILE *f;

	for (i = 0; i < ENVD_NAME_CACHE; i++)
		if (e->names[i].used && e->names[i].group == group && e->names[i].id == id) {
			memcpy(out, e->names[i].name, EPROTO_MAX_USER + 1);
			return;
		}
	out[0] = '\0';
	f = fopen(group ? e->cfg->group : e->cfg->passwd, "re");
	if (f) {
		if (group) {
			while ((g = fgetgrent(f)))
				if (g->gr_gid == id) {
					if (strlen(g->gr_name) <= EPROTO_MAX_USER)
						snprintf(out, EPROTO_MAX_USER + 1, "%s", g->gr_name);
					break;
				}
		} else {
			while ((pw = fgetpwent(f)))
				if (pw->pw_uid == id) {
					if (strlen(pw->pw_name) <= EPROTO_MAX_USER)
						snprintf(out, EPROTO_MAX_USER + 1, "%s", pw->pw_name);
					break;
				}
		}
		fclose(f);
	}
	n = &e->names[e->names_next++ % ENVD_NAME_CACHE];
	n->used = 1;
	n->group = group;
	n->id = id;
	memcpy(n->name, out, EPROTO_MAX_USER + 1);
}

/* Fills e->entry for name under dirfd, whose absolute path is path. A
 * symlink is reported as E2B's envd does: its own size, mode and times, the
 * type of what it leads to (EP_OTHER when that is not there), and as its
 * target the absolute path it resolves to (its own path when it does not
 * resolve). Returns 0 or a negative errno. */
static void envd_entry_meta(struct eproto_entry *m, const char *path);

static int envd_entry_at(struct envd *e, uint32_t req, int dirfd, const char *name, const char *path)
{
	struct eproto_entry *m = &e->entry;
	struct stat st;
	ssize_t n;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	memset(m, 0, sizeof(*m));
	m->req = req;
	m->type = S_ISREG(st.st_mode) ? EP_FILE : S_ISDIR(st.st_mode) ? EP_DIR : S_ISLNK(st.st_mode) ? EP_SYMLINK : EP_OTHER;
	m->mode = st.st_mode;
	m->size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
	m->uid = st.st_uid;
	m->gid = st.st_gid;
	m->mtime_sec = st.st_mtim.tv_sec;
	m->mtime_nsec = (uint32_t)st.st_mtim.tv_nsec;
	envd_name_of(e, 0, st.st_uid, m->owner);
	envd_name_of(e, 1, st.st_gid, m->group);
	snprintf(m->name, sizeof(m->name), "%s", envd_basename(path));
	snprintf(m->path, sizeof(m->path), "%s", path);
	if (S_ISLNK(st.st_mode)) {
		char *real = realpath(path, NULL);
		struct stat to;

		(void)n;
		if (real && strlen(real) <= PROTO_MAX_PATH)
			snprintf(m->target, PROTO_MAX_PATH + 1, "%s", real);
		else
			snprintf(m->target, PROTO_MAX_PATH + 1, "%s", path);
		free(real);
		m->type = fstatat(dirfd, name, &to, 0) < 0 ? EP_OTHER
			  : S_ISREG(to.st_mode)            ? EP_FILE
			  : S_ISDIR(to.st_mode)            ? EP_DIR
							   : EP_OTHER;
	}
	envd_entry_meta(m, path);
	return 0;
}

/* The file's metadata (xattrs EPROTO_META_XATTR + key) into m->meta, as
 * E2B's envd reads it back: a file system without xattrs, a pair that is
 * not printable ASCII (set inside the sandbox with setfattr) or one past
 * the budget is left out, never an error. Follows a symlink. */
static void envd_entry_meta(struct eproto_entry *m, const char *path)
{
	char names[8192], val[EPROTO_MAX_META + 1];
	ssize_t n = listxattr(path, names, sizeof(names));
	size_t plen = strlen(EPROTO_META_XATTR);

	m->meta_len = 0;
	for (ssize_t off = 0; n > 0 && off < n; off += (ssize_t)strlen(names + off) + 1) {
		const char *name = names + off;
		ssize_t vl;

		if (strncmp(name, EPROTO_META_XATTR, plen) || !name[plen])
			continue;
		vl = getxattr(path, name, val, sizeof(val) - 1);
		if (vl < 0)
			continue;
		(void)eproto_meta_add(m->meta, &m->meta_len, name + plen, strlen(name + plen), val, (size_t)vl);
	}
}

static void envd_send_entry(struct envd *e)
{
	ssize_t n = eproto_entry_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, &e->entry);

	if (n >= 0)
		envd_tx_commit(e, EP_ENTRY, (size_t)n);
}

/* ---- jobs ---------------------------------------------------------------- */

int envd_job_slot(struct envd *e)
{
	int i;

	for (i = 0; i < ENVD_MAX_JOBS; i++)
		if (!e->jobs[i])
			return i;
	return -1;
}

static int envd_job_find(struct envd *e, uint32_t req)
{
	int i;

	for (i = 0; i < ENVD_MAX_JOBS; i++)
		if (e->jobs[i] && e->jobs[i]->req == req)
			return i;
	return -1;
}

void envd_job_free(struct envd *e, int slot)
{
	struct envd_job *j = e->jobs[slot];
	int i;

	if (j->fd >= 0)
		close(j->fd);
	if (j->kind == ENVD_JOB_WRITE && j->fd >= 0 && j->dirfd >= 0 && j->created) {
		/* A new file abandoned or failed: it does not stay behind. */
		if (envd_fs_enter(&j->user) == 0) {
			unlinkat(j->dirfd, j->name, 0);
			envd_fs_leave();
		}
	}
	if (j->dirfd >= 0)
		close(j->dirfd);
	for (i = 0; i < j->depth; i++)
		envd_dirlevel_close(&j->dirs[i]);
	free(j);
	e->jobs[slot] = NULL;
}

static struct envd_job *envd_job_new(struct envd *e, uint32_t req, enum envd_job_kind kind, const struct envd_user *u,
				     int *slot)
{
	struct envd_job *j;

	if (envd_job_find(e, req) >= 0) {
		envd_send_error(e, req, -EBUSY, "request %u is in progress already", req);
		return NULL;
	}
	*slot = envd_job_slot(e);
	if (*slot < 0) {
		envd_send_error(e, req, -EAGAIN, "%d requests in progress already", ENVD_MAX_JOBS);
		return NULL;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		envd_send_error(e, req, -ENOMEM, "out of memory");
		return NULL;
	}
	j->kind = kind;
	j->req = req;
	j->user = *u;
	j->fd = j->dirfd = -1;
	e->jobs[*slot] = j;
	return j;
}

static void envd_dead_write(struct envd *e, uint32_t req)
{
	e->dead_writes[e->dead_next++ % ENVD_MAX_JOBS] = req;
}

static int envd_is_dead_write(struct envd *e, uint32_t req)
{
	unsigned i;

	for (i = 0; i < ENVD_MAX_JOBS; i++)
		if (e->dead_writes[i] == req && req)
			return 1;
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read directory fd's names (at most ENVD_LIST_MAX, without . and ..) and
 * sort them; lv keeps fd. 0, or a negative errno (fd closed). */
static int envd_dirlevel_open(struct envd_dirlevel *lv, int fd)
{
	DIR *d;
	struct dirent *de;
	size_t cap = 0;
	int r = 0;

	memset(lv, 0, sizeof(*lv));
	lv->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	d = lv->fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		r = -errno;
		if (lv->fd >= 0)
			close(lv->fd);
		close(fd);
		lv->fd = -1;
		return r;
	}
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			r = errno ? -errno : 0;
			break;
		}
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (lv->n == ENVD_LIST_MAX)
			break;
		if (lv->n == cap) {
			size_t nc = cap ? 2 * cap : 64;
			char **p = realloc(lv->names, nc * sizeof(*p));

			if (!p) {
				r = -ENOMEM;
				break;
			}
			lv->names = p;
			cap = nc;
		}
		if (!(lv->names[lv->n] = strdup(de->d_name))) {
			r = -ENOMEM;
			break;
		}
		lv->n++;
	}
	closedir(d);
	if (r < 0) {
		envd_dirlevel_close(lv);
		return r;
	}
	qsort(lv->names, lv->n, sizeof(*lv->names), name_cmp);
	return 0;
}

void envd_dirlevel_close(struct envd_dirlevel *lv)
{
	for (size_t i = 0; i < lv->n; i++)
		free(lv->names[i]);
	free(lv->names);
	if (lv->fd >= 0)
		close(lv->fd);
	memset(lv, 0, sizeof(*lv));
	lv->fd = -1;
}

/* A LISTDIR step: one entry (and a descent), or the end of a directory. */
static int envd_listdir_step(struct envd *e, int slot)
{
	struct envd_job *j = e->jobs[slot];
	struct envd_dirlevel *lv = &j->dirs[j->depth - 1];
	size_t base = j->plen[j->depth - 1], nlen;
	const char *name;
	int r, fd;

	if (lv->next == lv->n) {
		envd_dirlevel_close(lv);
		j->depth--;
		if (j->depth == 0) {
			envd_send_done(e, j->req);
			envd_job_free(e, slot);
			return 0;
		}
		j->path[j->plen[j->depth - 1]] = '\0';
		return 1;
	}
	name = lv->names[lv->next++];
	nlen = strlen(name);
	if (base + 1 + nlen > PROTO_MAX_PATH)
		return 1; /* cannot be named in the protocol: left out */
	j->path[base] = '\0';
	if (base > 1)
		j->path[base++] = '/';
	else
		base = 1; /* the top is "/" */
	memcpy(j->path + base, name, nlen + 1);
	r = envd_entry_at(e, j->req, lv->fd, name, j->path);
	if (r < 0)
		return 1; /* gone meanwhile */
	envd_send_entry(e);
	if (e->entry.type != EP_DIR || j->depth >= j->depth_max)
		return 1;
	fd = openat(lv->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || envd_dirlevel_open(&j->dirs[j->depth], fd) < 0)
		return 1; /* not readable by the user: listed, not entered */
	j->plen[j->depth] = base + nlen;
	j->depth++;
	return 1;
}

static int envd_read_step(struct envd *e, int slot)
{
	struct envd_job *j = e->jobs[slot];
	size_t want = EPROTO_MAX_CHUNK;
	uint8_t *buf;
	ssize_t n;

	if (j->unacked >= EPROTO_WINDOW)
		return 0;
	if (EPROTO_WINDOW - j->unacked < want)
		want = (size_t)(EPROTO_WINDOW - j->unacked);
	buf = envd_tx_payload(e);
	n = read(j->fd, buf + 4, want);
	if (n < 0 && errno == EINTR)
		return 1;
	if (n < 0) {
		envd_send_error(e, j->req, -errno, "READ: %s", strerror(errno));
		envd_job_free(e, slot);
		return 0;
	}
	if (n == 0) {
		envd_send_done(e, j->req);
		envd_job_free(e, slot);
		return 0;
	}
	buf[0] = (uint8_t)j->req;
	buf[1] = (uint8_t)(j->req >> 8);
	buf[2] = (uint8_t)(j->req >> 16);
	buf[3] = (uint8_t)(j->req >> 24);
	j->unacked += (uint64_t)n;
	envd_tx_commit(e, EP_DATA, 4 + (size_t)n);
	return 1;
}

int envd_fs_jobs_run(struct envd *e)
{
	int i, more = 0;

	for (i = 0; i < ENVD_MAX_JOBS; i++) {
		struct envd_job *j = e->jobs[i];
		int steps = 0, go = 1;

		if (!j || (j->kind != ENVD_JOB_LISTDIR && j->kind != ENVD_JOB_READ))
			continue;
		/* A bounded number of steps each, so one job cannot starve the
		 * loop; runnable jobs make the loop poll without waiting. */
		while (go && steps++ < 64 && envd_tx_ok(e)) {
			if (j->kind == ENVD_JOB_LISTDIR) {
				if (envd_fs_enter(&j->user) < 0) {
					envd_send_error(e, j->req, -EPERM, "LISTDIR: cannot take the user's identity");
					envd_job_free(e, i);
					break;
				}
				go = envd_listdir_step(e, i);
				envd_fs_leave();
			} else {
				go = envd_read_step(e, i);
			}
		}
		if (go && e->jobs[i] && envd_tx_ok(e))
			more = 1;
	}
	return more;
}

int envd_fs_ack(struct envd *e, uint32_t req, uint32_t bytes)
{
	int slot = envd_job_find(e, req);
	struct envd_job *j;

	if (slot < 0 || e->jobs[slot]->kind != ENVD_JOB_READ)
		return 0;
	j = e->jobs[slot];
	j->unacked -= bytes < j->unacked ? bytes : j->unacked;
	return 1;
}

/* ---- the requests ---------------------------------------------------------- */

/* Creates the missing directories above path (which is clean and
 * absolute), as the current file-system identity. */
static int envd_mkdir_parents(const char *path)
{
	char buf[PROTO_MAX_PATH + 1];
	char *slash;

	snprintf(buf, sizeof(buf), "%s", path);
	for (slash = strchr(buf + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		*slash = '/';
	}
	return 0;
}

/* The missing parents of path (and path itself when self) made the way
 * E2B's envd makes them: as root, then given to u, so that a user may write
 * /new/dir/file (the sandbox is theirs; E2B's `user` has sudo). Called
 * under u's identity (envd_fs_enter), which it leaves for the mkdirs and
 * takes again. An existing directory is left as it is. */
static int envd_mkdir_for(const struct envd_user *u, const char *path, int self)
{
	char buf[PROTO_MAX_PATH + 1];
	char *slash;
	int r = 0;

	if (geteuid() != 0) /* tests: no one to be but the caller */
		return self ? (envd_mkdir_parents(path) < 0 || mkdir(path, 0755) < 0 ? -errno : 0)
			    : envd_mkdir_parents(path);
	envd_fs_leave();
	snprintf(buf, sizeof(buf), "%s", path);
	for (slash = strchr(buf + 1, '/'); r == 0; slash = strchr(slash + 1, '/')) {
		if (slash)
			*slash = '\0';
		else if (!self)
			break;
		if (mkdir(buf, 0755) == 0) {
			if (lchown(buf, u->uid, u->gid) < 0)
				r = -errno;
		} else if (errno != EEXIST || !slash) {
			r = -errno;
		}
		if (!slash)
			break;
		*slash = '/';
	}
	if (envd_fs_enter(u) < 0 && r == 0)
		r = -EPERM;
	return r;
}

/* Removes name under dirfd and, for a directory, what it holds, never
 * following a symlink. */
static int envd_rm_at(int dfd, const char *name, int depth)
{
	struct dirent *de;
	struct stat st;
	DIR *d;
	int fd, r = 0;

	if (unlinkat(dfd, name, 0) == 0)
		return 0;
	if (errno != EISDIR && errno != EPERM)
		return -errno;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -EPERM;
	if (depth >= ENVD_RM_DEPTH)
		return -ELOOP;
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -ENOMEM;
	}
	while ((de = readdir(d))) {
		int rr;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		rr = envd_rm_at(dirfd(d), de->d_name, depth + 1);
		if (rr < 0 && rr != -ENOENT && r == 0)
			r = rr;
	}
	closedir(d);
	if (r < 0)
		return r;
	return unlinkat(dfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

/* Splits a clean absolute path into an open parent and the last name. */
static int envd_open_parent(const char *path, char name[256])
{
	char dir[PROTO_MAX_PATH + 1];
	const char *base = envd_basename(path);
	size_t dlen = (size_t)(base - path);
	int fd;

	if (!*base)
		return -EISDIR; /* "/" */
	memcpy(dir, path, dlen);
	dir[dlen > 1 ? dlen - 1 : 1] = '\0';
	snprintf(name, 256, "%s", base);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* The new file's metadata, on its temporary inode (so an overwrite keeps
 * none of the old file's). A file system without user xattrs takes none,
 * as E2B's envd: the answer's entry, read back, then shows none. */
static int envd_write_meta(int fd, const char *meta, size_t len)
{
	char name[sizeof(EPROTO_META_XATTR) + EPROTO_MAX_META_KEY];
	const char *k, *v;
	size_t off = 0;

	while (eproto_meta_next(meta, len, &off, &k, &v)) {
		snprintf(name, sizeof(name), "%s%s", EPROTO_META_XATTR, k);
		if (fsetxattr(fd, name, v, strlen(v), 0) < 0) {
			if (errno == ENOTSUP)
				return 0;
			return errno == ENOSPC || errno == E2BIG ? -ENOSPC : -errno;
		}
	}
	return 0;
}

/* E2B's metadata of an overwritten file goes (a write sets its own). */
static int envd_clear_meta(int fd)
{
	char names[4096], *n;
	ssize_t len = flistxattr(fd, names, sizeof(names));

	if (len < 0)
		return errno == ENOTSUP ? 0 : errno == ERANGE ? -E2BIG : -errno;
	for (n = names; n < names + len; n += strlen(n) + 1)
		if (!strncmp(n, EPROTO_META_XATTR, sizeof(EPROTO_META_XATTR) - 1) && fremovexattr(fd, n) < 0 &&
		    errno != ENODATA)
			return -errno;
	return 0;
}

static void envd_write_begin(struct envd *e, const struct envd_user *u, const char *path)
{
	struct envd_job *j;
	struct stat st;
	int slot, r;

	j = envd_job_new(e, e->fsreq.req, ENVD_JOB_WRITE, u, &slot);
	if (!j) {
		envd_dead_write(e, e->fsreq.req);
		return;
	}
	r = envd_mkdir_for(u, path, 0);
	if (r < 0)
		goto fail;
	r = envd_open_parent(path, j->name);
	if (r < 0)
		goto fail;
	j->dirfd = r;
	snprintf(j->path, sizeof(j->path), "%s", path);
	if (fstatat(j->dirfd, j->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
		r = -EISDIR;
		goto fail;
	}
	/* In place, as E2B's envd writes: a watcher sees CREATE (a new file)
	 * and WRITE of the file's own name, and an overwrite keeps the file's
	 * owner, mode and other attributes (E2B's metadata is replaced). A new
	 * file whose write fails or is cancelled is removed; an overwrite that
	 * fails leaves what was written, as E2B's does. Non-blocking open and
	 * a regular file only: a FIFO put there must not hold envd. */
	j->fd = openat(j->dirfd, j->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
	if (j->fd >= 0)
		j->created = 1;
	else if (errno == EEXIST)
		j->fd = openat(j->dirfd, j->name, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (j->fd < 0) {
		r = -errno;
		goto fail;
	}
	if (fstat(j->fd, &st) < 0) {
		r = -errno;
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		r = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		goto fail;
	}
	if (!j->created && (ftruncate(j->fd, 0) < 0 || (r = envd_clear_meta(j->fd)) < 0)) {
		r = r < 0 ? r : -errno;
		goto fail;
	}
	if (fcntl(j->fd, F_SETFL, 0) < 0) {
		r = -errno;
		goto fail;
	}
	r = envd_write_meta(j->fd, e->fsreq.meta, e->fsreq.meta_len);
	if (r < 0)
		goto fail;
	return;
fail:
	envd_send_error(e, j->req, r, "WRITE %s: %s", path, strerror(-r));
	envd_dead_write(e, j->req);
	envd_job_free(e, slot);
}

static void envd_write_data(struct envd *e, uint32_t req, const uint8_t *p, size_t n)
{
	int slot = envd_job_find(e, req);
	struct envd_job *j;
	int r;

	if (slot < 0 || e->jobs[slot]->kind != ENVD_JOB_WRITE) {
		if (!envd_is_dead_write(e, req)) {
			envd_send_error(e, req, -ENOENT, "WDATA: no WRITE %u in progress", req);
			envd_dead_write(e, req);
		}
		return;
	}
	j = e->jobs[slot];
	while (n > 0) {
		ssize_t w = write(j->fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			r = w < 0 ? -errno : -EIO;
			envd_send_error(e, req, r, "WRITE %s: %s", j->path, strerror(-r));
			envd_dead_write(e, req);
			envd_job_free(e, slot);
			return;
		}
		p += w;
		n -= (size_t)w;
	}
}

static void envd_write_end(struct envd *e, uint32_t req)
{
	int slot = envd_job_find(e, req), r;
	struct envd_job *j;

	if (slot < 0 || e->jobs[slot]->kind != ENVD_JOB_WRITE) {
		if (!envd_is_dead_write(e, req))
			envd_send_error(e, req, -ENOENT, "WEND: no WRITE %u in progress", req);
		return;
	}
	j = e->jobs[slot];
	r = close(j->fd) < 0 ? -errno : 0;
	j->fd = -1;
	if (r == 0 && (r = envd_fs_enter(&j->user)) == 0) {
		r = envd_entry_at(e, req, j->dirfd, j->name, j->path);
		envd_fs_leave();
	} else if (j->created) {
		envd_fs_enter(&j->user);
		unlinkat(j->dirfd, j->name, 0);
		envd_fs_leave();
	}
	if (r < 0)
		envd_send_error(e, req, r, "WRITE %s: %s", j->path, strerror(-r));
	else
		envd_send_entry(e);
	envd_job_free(e, slot);
}

static void envd_cancel(struct envd *e, uint32_t req)
{
	int slot = envd_job_find(e, req);

	if (slot < 0)
		return; /* it ended already: its reply crossed the CANCEL */
	envd_send_error(e, req, -ECANCELED, "cancelled");
	if (e->jobs[slot]->kind == ENVD_JOB_WRITE)
		envd_dead_write(e, req);
	envd_job_free(e, slot);
}

static const char *envd_fs_name(uint8_t type)
{
	switch (type) {
	case EP_STAT: return "STAT";
	case EP_LISTDIR: return "LISTDIR";
	case EP_MKDIR: return "MKDIR";
	case EP_MOVE: return "MOVE";
	case EP_REMOVE: return "REMOVE";
	case EP_READ: return "READ";
	default: return "WRITE";
	}
}

/* STAT .. WRITE once the user's identity is taken. */
static int envd_fs_op(struct envd *e, uint8_t type, const struct envd_user *u, const char *path, const char *path2)
{
	struct envd_job *j;
	struct stat st;
	int r, fd, slot;

	switch (type) {
	case EP_STAT:
		r = envd_entry_at(e, e->fsreq.req, AT_FDCWD, path, path);
		if (r == 0)
			envd_send_entry(e);
		return r;
	case EP_MKDIR:
		r = envd_mkdir_for(u, path, 1);
		if (r == 0)
			r = envd_entry_at(e, e->fsreq.req, AT_FDCWD, path, path);
		if (r == 0)
			envd_send_entry(e);
		return r;
	case EP_MOVE:
		r = envd_mkdir_for(u, path2, 0);
		if (r == 0 && rename(path, path2) < 0)
			r = -errno;
		if (r == 0)
			r = envd_entry_at(e, e->fsreq.req, AT_FDCWD, path2, path2);
		if (r == 0)
			envd_send_entry(e);
		return r;
	case EP_REMOVE:
		/* As E2B's envd: a path that is not there is removed already. */
		r = envd_rm_at(AT_FDCWD, path, 0);
		if (r == -ENOENT)
			r = 0;
		if (r == 0)
			envd_send_done(e, e->fsreq.req);
		return r;
	case EP_LISTDIR:
		fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		j = envd_job_new(e, e->fsreq.req, ENVD_JOB_LISTDIR, u, &slot);
		if (!j) {
			close(fd);
			return 0; /* answered */
		}
		r = envd_dirlevel_open(&j->dirs[0], fd);
		if (r < 0) {
			envd_job_free(e, slot);
			return r;
		}
		j->depth = 1;
		j->depth_max = (int)e->fsreq.depth;
		snprintf(j->path, sizeof(j->path), "%s", path);
		j->plen[0] = strlen(path);
		return 0;
	case EP_READ:
		fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			r = fstat(fd, &st) < 0 ? -errno : S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
			close(fd);
			return r;
		}
		j = envd_job_new(e, e->fsreq.req, ENVD_JOB_READ, u, &slot);
		if (!j) {
			close(fd);
			return 0;
		}
		j->fd = fd;
		return 0;
	default:
		envd_write_begin(e, u, path);
		return 0;
	}
}

void envd_fs_request(struct envd *e, uint8_t type, const uint8_t *p, size_t len)
{
	struct eproto_fsreq *q = &e->fsreq;
	char path[PROTO_MAX_PATH + 1], path2[PROTO_MAX_PATH + 1];
	struct envd_user u;
	const uint8_t *raw;
	uint32_t req;
	size_t n;
	int r;

	switch (type) {
	case EP_WDATA:
		if (eproto_idraw_decode(p, len, &req, &raw, &n) < 0)
			goto malformed;
		envd_write_data(e, req, raw, n);
		return;
	case EP_WEND:
	case EP_CANCEL:
		if (eproto_u32s_decode(p, len, &req, 1) < 0)
			goto malformed;
		if (type == EP_WEND)
			envd_write_end(e, req);
		else
			envd_cancel(e, req);
		return;
	default:
		break;
	}
	if (eproto_fsreq_decode(p, len, type, q) < 0)
		goto malformed;
	/* Owner names may have changed since the last request. */
	memset(e->names, 0, sizeof(e->names));
	r = envd_user_lookup(e->cfg, q->user, &u);
	if (r < 0) {
		if (type == EP_WRITE)
			envd_dead_write(e, q->req);
		envd_send_error(e, q->req, r, "%s: user %s: %s", envd_fs_name(type), q->user[0] ? q->user : ENVD_DEFAULT_USER,
				r == -ENOENT ? "no such user" : strerror(-r));
		return;
	}
	r = envd_resolve(&u, q->path, path);
	if (r == 0 && type == EP_MOVE)
		r = envd_resolve(&u, q->path2, path2);
	if (r < 0) {
		if (type == EP_WRITE)
			envd_dead_write(e, q->req);
		envd_send_error(e, q->req, r, "%s %s: %s", envd_fs_name(type), q->path, strerror(-r));
		return;
	}
	r = envd_fs_enter(&u);
	if (r == 0) {
		r = envd_fs_op(e, type, &u, path, type == EP_MOVE ? path2 : NULL);
		envd_fs_leave();
	}
	if (r < 0) {
		if (type == EP_WRITE)
			envd_dead_write(e, q->req);
		envd_send_error(e, q->req, r, "%s %s: %s", envd_fs_name(type), path, strerror(-r));
	}
	return;

malformed:
	e->rx_start = e->rx_end = 0;
	envd_send_error(e, 0, -EPROTO, "malformed frame of type 0x%02x: receive buffer dropped", type);
}
