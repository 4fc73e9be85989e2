/* envd_watch: directory watches for the host (lib/eproto.h WATCH, UNWATCH,
 * WATCH_EVENT, WATCH_END; docs/e2b.md "Watching directories"), E2B's
 * filesystem.WatchDir and its polling watchers. One inotify instance per
 * watch, its directories added with the user's file-system identity (a user
 * who cannot read a directory cannot watch it). Events are reported as E2B's
 * envd (fsnotify's inotify backend) reports them: the name relative to the
 * watched directory, one event per operation.
 *
 * Bounds: ENVD_MAX_WATCHES watches, ENVD_WATCH_DIRS directories per watch
 * (a recursive watch that would pass it fails, or ends with -EMFILE when a
 * later directory would), inotify events read only while the send buffer has
 * room (the kernel queue holds the rest; its overflow ends the watch with
 * -EOVERFLOW, as fsnotify's overflow error ends E2B's). */
#include "envd_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

/* What fsnotify asks inotify for. */
#define WATCH_MASK                                                                                             \
	(IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_MODIFY | IN_DELETE | IN_ATTRIB | IN_DELETE_SELF |        \
	 IN_MOVE_SELF)

static int watch_slot_of(struct envd *e, uint32_t id)
{
	for (int i = 0; i < ENVD_MAX_WATCHES; i++)
		if (e->watches[i] && e->watches[i]->id == id)
			return i;
	return -1;
}

int envd_watch_count(struct envd *e)
{
	int n = 0;

	for (int i = 0; i < ENVD_MAX_WATCHES; i++)
		n += e->watches[i] != NULL;
	return n;
}

static void watch_free(struct envd_watch *w)
{
	if (w->fd >= 0)
		close(w->fd);
	for (size_t i = 0; i < w->ndirs; i++)
		free(w->dirs[i].rel);
	free(w);
}

/* Ends watch `slot`: WATCH_END{id, code, msg} when send is set (the caller
 * made sure a frame fits). */
static void watch_end(struct envd *e, int slot, int send, int32_t code, const char *msg)
{
	struct envd_watch *w = e->watches[slot];

	if (send && envd_tx_ok(e)) {
		ssize_t n = eproto_wend_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, w->id, code, msg);

		if (n >= 0)
			envd_tx_commit(e, EP_WATCH_END, (size_t)n);
	}
	watch_free(w);
	e->watches[slot] = NULL;
}

/* root/rel into out: -ENAMETOOLONG when it does not fit. */
static int watch_path(const struct envd_watch *w, const char *rel, char out[PROTO_MAX_PATH + 1])
{
	int n = rel[0] ? snprintf(out, PROTO_MAX_PATH + 1, "%s%s%s", w->root, strcmp(w->root, "/") ? "/" : "", rel)
		       : snprintf(out, PROTO_MAX_PATH + 1, "%s", w->root);

	return n < 0 || n > PROTO_MAX_PATH ? -ENAMETOOLONG : 0;
}

/* Adds directory rel (relative to the root, "" for it) to w (user's identity
 * taken). 0, -EMFILE past ENVD_WATCH_DIRS, or inotify's negative errno. A
 * directory watched already (a wd seen before) is not added twice. */
static int watch_add_dir(struct envd_watch *w, const char *rel)
{
	char path[PROTO_MAX_PATH + 1];
	int wd;

	if (watch_path(w, rel, path) < 0)
		return -ENAMETOOLONG;
	if (w->ndirs == ENVD_WATCH_DIRS)
		return -EMFILE;
	/* The root may be a symlink to a directory (E2B resolves it); below
	 * it, a symlink is not followed out of the tree. */
	wd = inotify_add_watch(w->fd, path, WATCH_MASK | IN_ONLYDIR | (rel[0] ? IN_DONT_FOLLOW : 0));
	if (wd < 0)
		return -errno;
	for (size_t i = 0; i < w->ndirs; i++)
		if (w->dirs[i].wd == wd) {
			/* Seen before under another name (moved): the new name wins. */
			char *r = strdup(rel);

			if (!r)
				return -ENOMEM;
			free(w->dirs[i].rel);
			w->dirs[i].rel = r;
			return 0;
		}
	w->dirs[w->ndirs].rel = strdup(rel);
	if (!w->dirs[w->ndirs].rel) {
		inotify_rm_watch(w->fd, wd);
		return -ENOMEM;
	}
	w->dirs[w->ndirs++].wd = wd;
	return 0;
}

/* Adds rel and every directory under it, breadth first (one directory open
 * at a time; the dirs table is the queue). Directories the user cannot read
 * are left out; -EMFILE when there are more than ENVD_WATCH_DIRS. */
static int watch_add_tree(struct envd_watch *w, const char *rel)
{
	size_t first = w->ndirs;
	int r = watch_add_dir(w, rel);

	if (r < 0)
		return r;
	for (size_t i = first; i < w->ndirs; i++) {
		char path[PROTO_MAX_PATH + 1], sub[PROTO_MAX_PATH + 1];
		struct dirent *de;
		DIR *d;
		int fd;

		if (watch_path(w, w->dirs[i].rel, path) < 0)
			continue;
		fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		d = fd >= 0 ? fdopendir(fd) : NULL;
		if (!d) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		while ((de = readdir(d))) {
			struct stat st;
			int n;

			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			if (de->d_type == DT_UNKNOWN) {
				if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
					continue;
			} else if (de->d_type != DT_DIR) {
				continue;
			}
			n = w->dirs[i].rel[0] ? snprintf(sub, sizeof(sub), "%s/%s", w->dirs[i].rel, de->d_name)
					      : snprintf(sub, sizeof(sub), "%s", de->d_name);
			if (n < 0 || n > PROTO_MAX_PATH)
				continue;
			r = watch_add_dir(w, sub);
			if (r == -EMFILE || r == -ENOMEM) {
				closedir(d);
				return r;
			}
		}
		closedir(d);
	}
	return 0;
}

/* A directory moved away from under a recursive watch: it and what is
 * under it are no longer followed here (its new place, if under the watch,
 * is added by its MOVED_TO). */
static void watch_drop_tree(struct envd_watch *w, const char *rel)
{
	size_t n = strlen(rel), i = 0;

	while (i < w->ndirs) {
		const char *r = w->dirs[i].rel;

		if (r[0] && !strncmp(r, rel, n) && (r[n] == '\0' || r[n] == '/')) {
			inotify_rm_watch(w->fd, w->dirs[i].wd);
			free(w->dirs[i].rel);
			w->dirs[i] = w->dirs[--w->ndirs];
			continue;
		}
		i++;
	}
}

void envd_watch_start(struct envd *e, const struct eproto_watch *m)
{
	struct envd_watch *w;
	struct envd_user u;
	struct stat st;
	int r, slot = -1;

	r = envd_user_lookup(e->cfg, m->user, &u);
	if (r < 0)
		return envd_send_error(e, m->req, r, "WATCH: user %s: %s", m->user[0] ? m->user : ENVD_DEFAULT_USER,
				       r == -ENOENT ? "no such user" : strerror(-r));
	if (watch_slot_of(e, m->id) >= 0)
		return envd_send_error(e, m->req, -EBUSY, "WATCH: watch %u exists already", m->id);
	for (int i = 0; i < ENVD_MAX_WATCHES && slot < 0; i++)
		if (!e->watches[i])
			slot = i;
	if (slot < 0)
		return envd_send_error(e, m->req, -EMFILE, "WATCH: at most %d watches at once", ENVD_MAX_WATCHES);
	w = calloc(1, sizeof(*w));
	if (!w)
		return envd_send_error(e, m->req, -ENOMEM, "WATCH: out of memory");
	w->id = m->id;
	w->flags = m->flags;
	w->user = u;
	w->fd = -1;
	r = envd_resolve(&u, m->path, w->root);
	if (r < 0) {
		envd_send_error(e, m->req, r, "WATCH %s: %s", m->path, strerror(-r));
		watch_free(w);
		return;
	}
	r = envd_fs_enter(&u);
	if (r == 0) {
		if (stat(w->root, &st) < 0)
			r = -errno;
		else if (!S_ISDIR(st.st_mode))
			r = -ENOTDIR;
		if (r == 0 && (w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0)
			r = -errno;
		if (r == 0)
			r = (w->flags & EP_WATCH_RECURSIVE) ? watch_add_tree(w, "") : watch_add_dir(w, "");
		envd_fs_leave();
	}
	if (r < 0) {
		if (r == -EMFILE && w->ndirs == ENVD_WATCH_DIRS)
			envd_send_error(e, m->req, r, "WATCH %s: more than %d directories to watch", w->root,
					ENVD_WATCH_DIRS);
		else
			envd_send_error(e, m->req, r, "WATCH %s: %s", w->root,
					r == -ENOTDIR ? "not a directory" : strerror(-r));
		watch_free(w);
		return;
	}
	e->watches[slot] = w;
	envd_send_done(e, m->req);
}

void envd_unwatch(struct envd *e, uint32_t id)
{
	int slot = watch_slot_of(e, id);

	if (slot >= 0)
		watch_end(e, slot, 1, 0, "");
}

static struct envd_watch_dir *watch_dir_of(struct envd_watch *w, int wd)
{
	for (size_t i = 0; i < w->ndirs; i++)
		if (w->dirs[i].wd == wd)
			return &w->dirs[i];
	return NULL;
}

/* The operations of one inotify event, in the order E2B's envd sends them
 * (create, rename, chmod, write, remove); *n of them. Events on a directory
 * itself count only for the watched one (its parent's event covers the
 * others, as fsnotify does). */
static void watch_ops(uint32_t mask, int self_root, uint8_t ops[5], int *n)
{
	int self = !(mask & (IN_DELETE_SELF | IN_MOVE_SELF)) || self_root;

	*n = 0;
	if (mask & (IN_CREATE | IN_MOVED_TO))
		ops[(*n)++] = EP_WEV_CREATE;
	if ((mask & IN_MOVED_FROM) || ((mask & IN_MOVE_SELF) && self))
		ops[(*n)++] = EP_WEV_RENAME;
	if (mask & IN_ATTRIB && self)
		ops[(*n)++] = EP_WEV_CHMOD;
	if (mask & IN_MODIFY)
		ops[(*n)++] = EP_WEV_WRITE;
	if ((mask & IN_DELETE) || ((mask & IN_DELETE_SELF) && self))
		ops[(*n)++] = EP_WEV_REMOVE;
}

/* Sends what w has read, event by event, while the send buffer has room.
 * Returns -1 when w ended (its slot is free), else 0. */
static int watch_send(struct envd *e, int slot)
{
	struct envd_watch *w = e->watches[slot];

	if (w->ending) {
		char msg[128];

		if (!envd_tx_ok(e))
			return 0;
		if (w->ending == -EMFILE)
			snprintf(msg, sizeof(msg), "watcher error: more than %d directories to watch", ENVD_WATCH_DIRS);
		else
			snprintf(msg, sizeof(msg), "watcher error: %s", strerror(-w->ending));
		watch_end(e, slot, 1, w->ending, msg);
		return -1;
	}
	while (w->off < w->len) {
		const struct inotify_event *ev = (const void *)(w->buf + w->off);
		size_t size = sizeof(*ev) + ev->len;
		char name[PROTO_MAX_PATH + 1];
		struct envd_watch_dir *d;
		uint8_t ops[5];
		int nops, k;

		if (ev->mask & IN_Q_OVERFLOW) {
			if (!envd_tx_ok(e))
				return 0;
			watch_end(e, slot, 1, -EOVERFLOW, "watcher error: the sandbox's inotify queue overflowed");
			return -1;
		}
		d = watch_dir_of(w, ev->wd);
		if (!d || (ev->mask & IN_IGNORED)) {
			if (d) {
				free(d->rel);
				*d = w->dirs[--w->ndirs];
			}
			w->off += size;
			w->op_next = 0;
			continue;
		}
		/* A name from the kernel is one component; rel is ours. */
		k = ev->len && ev->name[0] ? (d->rel[0] ? snprintf(name, sizeof(name), "%s/%s", d->rel, ev->name)
							: snprintf(name, sizeof(name), "%s", ev->name))
					   : snprintf(name, sizeof(name), "%s", d->rel[0] ? d->rel : ".");
		watch_ops(ev->mask, !d->rel[0] && !(ev->len && ev->name[0]), ops, &nops);
		if (k < 0 || k > PROTO_MAX_PATH)
			nops = 0; /* a name too long for the protocol */
		if (!(ev->len && ev->name[0]) && d->rel[0])
			nops = 0; /* a subdirectory's own event: its parent reported it */
		for (; w->op_next < nops; w->op_next++) {
			ssize_t n;

			if (!envd_tx_ok(e))
				return 0;
			n = eproto_wevent_encode(envd_tx_payload(e), PROTO_MAX_PAYLOAD, w->id, ops[w->op_next], name);
			if (n >= 0)
				envd_tx_commit(e, EP_WATCH_EVENT, (size_t)n);
		}
		w->op_next = 0;
		w->off += size;
		if ((w->flags & EP_WATCH_RECURSIVE) && (ev->mask & IN_ISDIR) && nops) {
			int r = 0;

			if (ev->mask & IN_MOVED_FROM)
				watch_drop_tree(w, name);
			if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
				r = envd_fs_enter(&w->user);
				if (r == 0) {
					r = watch_add_tree(w, name);
					envd_fs_leave();
				}
			}
			if (r == -EMFILE || r == -ENOMEM) {
				/* The event is out; its WATCH_END goes when there is
				 * room (watch_send's first step), nothing before it. */
				w->ending = r;
				return watch_send(e, slot);
			}
		}
	}
	return 0;
}

void envd_watch_read(struct envd *e, struct envd_watch *w)
{
	int slot = -1;
	ssize_t n;

	for (int i = 0; i < ENVD_MAX_WATCHES; i++)
		if (e->watches[i] == w)
			slot = i;
	if (slot < 0 || w->off < w->len)
		return;
	n = read(w->fd, w->buf, sizeof(w->buf));
	if (n <= 0)
		return; /* EAGAIN, EINTR: poll says when */
	w->off = 0;
	w->len = (size_t)n;
	watch_send(e, slot);
}

int envd_watches_run(struct envd *e)
{
	for (int i = 0; i < ENVD_MAX_WATCHES; i++)
		if (e->watches[i] && (e->watches[i]->off < e->watches[i]->len || e->watches[i]->ending) && envd_tx_ok(e))
			watch_send(e, i);
	return 0;
}

void envd_watches_drop(struct envd *e)
{
	for (int i = 0; i < ENVD_MAX_WATCHES; i++)
		if (e->watches[i])
			watch_end(e, i, 0, 0, "");
}
