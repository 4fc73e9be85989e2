/* plan: the mount-point layout of a jail, worked out in the parent so that
 * the cloned child only replays it (spawn.c). A plan is an ordered list of
 * ops: directories and empty files of the tmpfs root, symbolic links
 * recreated as on the host, binds and /proc. Every path inside the jail is
 * the host path, so command lines need no rewriting. */
#include "jail_int.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_bind(enum op_kind k)
{
	return k == OP_BIND_RO || k == OP_BIND_RW || k == OP_BIND_DEV;
}

/* Room for one more op. */
static int plan_grow(struct jail_plan *p)
{
	size_t cap;
	struct op *ops;

	if (p->n < p->cap)
		return 0;
	cap = p->cap ? p->cap * 2 : 64;
	ops = realloc(p->ops, cap * sizeof(*ops));
	if (!ops)
		return -ENOMEM;
	p->ops = ops;
	p->cap = cap;
	return 0;
}

static int plan_push(struct jail_plan *p, enum op_kind kind, int dir, const char *path, const char *arg)
{
	struct op *o;

	if (plan_grow(p) < 0)
		return -ENOMEM;
	o = &p->ops[p->n];
	o->kind = kind;
	o->dir = dir;
	o->owned = 1;
	o->path = strdup(path);
	o->arg = arg ? strdup(arg) : NULL;
	if (!o->path || (arg && !o->arg)) {
		free(o->path);
		free(o->arg);
		return -ENOMEM;
	}
	p->n++;
	return 0;
}

void plan_free(struct jail_plan *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		if (p->ops[i].owned) {
			free(p->ops[i].path);
			free(p->ops[i].arg);
		}
	free(p->ops);
	buf_free(&p->ld_path);
	memset(p, 0, sizeof(*p));
}

/* Copy base's ops into p without copying their strings (base outlives p). */
static int plan_extend(struct jail_plan *p, const struct jail_plan *base)
{
	for (size_t i = 0; base && i < base->n; i++) {
		if (plan_grow(p) < 0)
			return -ENOMEM;
		p->ops[p->n] = base->ops[i];
		p->ops[p->n++].owned = 0;
	}
	return 0;
}

/* The op that creates something at path (a directory, file, link or mount), or NULL. */
static const struct op *plan_find(const struct jail_plan *p, const char *path)
{
	for (size_t i = 0; i < p->n; i++)
		if (!strcmp(p->ops[i].path, path))
			return &p->ops[i];
	return NULL;
}

/* 1 when path is below a directory bind of the plan: it is visible already. */
static int plan_covered(const struct jail_plan *p, const char *path)
{
	for (size_t i = 0; i < p->n; i++) {
		const struct op *o = &p->ops[i];
		size_t l = strlen(o->path);

		if (is_bind(o->kind) && o->dir && !strncmp(path, o->path, l) && path[l] == '/')
			return 1;
	}
	return 0;
}

/* Directories of the tmpfs root down to (and including) dir, a canonical
 * path that exists on the host. */
static int plan_dirs(struct jail_plan *p, const char *dir)
{
	char tmp[PATH_MAX];

	if (strlen(dir) >= sizeof(tmp))
		return -ENAMETOOLONG;
	strcpy(tmp, dir);
	for (char *s = tmp + 1;; s++) {
		if (*s == '/' || *s == '\0') {
			char c = *s;
			const struct op *o;
			int r;

			*s = '\0';
			if (tmp[1] && !plan_covered(p, tmp)) {
				o = plan_find(p, tmp);
				if (!o) {
					if ((r = plan_push(p, OP_DIR, 1, tmp, NULL)) < 0)
						return r;
				} else if (!(o->kind == OP_DIR || (is_bind(o->kind) && o->dir))) {
					return -ENOTDIR;
				}
			}
			*s = c;
			if (!c)
				break;
		}
	}
	return 0;
}

/* Follows the host's symbolic links one component at a time, recreating
 * each link in the jail, the way the kernel will resolve the path inside it. */
int plan_path(struct jail_plan *p, const char *path, enum op_kind kind)
{
	char cur[PATH_MAX] = "", rest[PATH_MAX], next[PATH_MAX], target[PATH_MAX];
	struct stat st;
	int links = 0, r;

	if (path[0] != '/')
		return -EINVAL; /* callers say "needs an absolute path" */
	if (strlen(path) >= sizeof(rest))
		return -ENAMETOOLONG;
	strcpy(rest, path);
	for (;;) {
		char *comp = rest, *slash;

		while (*comp == '/')
			comp++;
		if (!*comp)
			break;
		slash = strchr(comp, '/');
		if (slash)
			*slash++ = '\0';
		if (!strcmp(comp, ".")) {
			memmove(rest, slash ? slash : "", strlen(slash ? slash : "") + 1);
			continue;
		}
		if (!strcmp(comp, "..")) {
			char *last = strrchr(cur, '/');

			if (last)
				*last = '\0';
			memmove(rest, slash ? slash : "", strlen(slash ? slash : "") + 1);
			continue;
		}
		if ((size_t)snprintf(next, sizeof(next), "%s/%s", cur, comp) >= sizeof(next))
			return -ENAMETOOLONG;
		if (lstat(next, &st) < 0)
			return -errno;
		{
			/* What is left after this component. */
			char after[PATH_MAX];

			snprintf(after, sizeof(after), "%s", slash ? slash : "");
			if (S_ISLNK(st.st_mode)) {
				ssize_t n = readlink(next, target, sizeof(target) - 1);

				if (n < 0)
					return -errno;
				target[n] = '\0';
				if (++links > 40)
					return -ELOOP;
				if (!plan_covered(p, next)) {
					const struct op *o = plan_find(p, next);

					if ((r = plan_dirs(p, cur[0] ? cur : "/")) < 0)
						return r;
					if (!o) {
						if ((r = plan_push(p, OP_LINK, 0, next, target)) < 0)
							return r;
					} else if (o->kind != OP_LINK || strcmp(o->arg, target)) {
						return -EEXIST;
					}
				}
				if ((size_t)snprintf(rest, sizeof(rest), "%s/%s", target, after) >= sizeof(rest))
					return -ENAMETOOLONG;
				if (target[0] == '/')
					cur[0] = '\0';
				continue;
			}
			strcpy(cur, next);
			strcpy(rest, after);
			if (after[0] && !S_ISDIR(st.st_mode))
				return -ENOTDIR;
		}
	}
	if (!cur[0])
		return -EINVAL; /* "/" itself */
	if (stat(cur, &st) < 0)
		return -errno;
	if (plan_covered(p, cur))
		return 0;
	{
		const struct op *o = plan_find(p, cur);
		char parent[PATH_MAX];
		int isdir = S_ISDIR(st.st_mode);

		for (size_t i = 0; i < p->n; i++)
			if (is_bind(p->ops[i].kind) && !strcmp(p->ops[i].path, cur))
				return p->ops[i].kind == kind ? 0 : -EEXIST;
		if (kind == OP_BIND_DEV ? !S_ISCHR(st.st_mode) : !(isdir || S_ISREG(st.st_mode)))
			return -EINVAL;
		strcpy(parent, cur);
		*strrchr(parent, '/') = '\0';
		if (parent[0] && (r = plan_dirs(p, parent)) < 0)
			return r;
		if (!o) {
			if ((r = plan_push(p, isdir ? OP_DIR : OP_FILE, isdir, cur, NULL)) < 0)
				return r;
		} else if (o->kind != (isdir ? OP_DIR : OP_FILE)) {
			return -EEXIST;
		}
		return plan_push(p, kind, isdir, cur, cur);
	}
}

int plan_err(struct kiln_err *err, const char *path, int r)
{
	return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: %s", path,
			    path[0] != '/' ? "not an absolute path" : strerror(-r));
}

/* plan_path for path, with the error for it. */
static int plan_add(struct jail_plan *p, const char *path, enum op_kind kind, struct kiln_err *err)
{
	int r = plan_path(p, path, kind);

	return r < 0 ? plan_err(err, path, r) : 0;
}

int plan_build(struct jail_plan *p, const struct jail_plan *base, const struct jail_spec *spec,
	       struct kiln_err *err)
{
	/* Everything every jail sees, then this jail's own paths. */
	if (plan_extend(p, base) < 0)
		goto oom;
	for (int i = 0; i < JAIL_MAX_PATHS && spec->rw[i]; i++)
		if (plan_add(p, spec->rw[i], OP_BIND_RW, err) < 0)
			return -1;
	if (spec->work && plan_add(p, spec->work, OP_BIND_RW, err) < 0)
		return -1;
	for (int i = 0; i < JAIL_MAX_PATHS && spec->ro[i]; i++)
		if (plan_add(p, spec->ro[i], OP_BIND_RO, err) < 0)
			return -1;
	for (int i = 0; i < 4 && spec->dev[i]; i++)
		if (plan_add(p, spec->dev[i], OP_BIND_DEV, err) < 0)
			return -1;
	if (spec->proc && (plan_dirs(p, "/proc") < 0 || plan_push(p, OP_PROC, 1, "/proc", NULL) < 0))
		goto oom;
	return 0;
oom:
	return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
}
