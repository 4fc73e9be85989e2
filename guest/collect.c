/* collect: the COLLECT walk of /output. Everything in it was written by the
 * task, so every step is relative to an fd already inside it, opened with
 * O_NOFOLLOW: a symlink, a renamed directory or a FIFO cannot lead root out
 * of the tree or make it block. */
#include "collect.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto.h"

struct collect {
	struct agent *a;
	uint64_t budget; /* file bytes still allowed */
	uint32_t entries;
	int stop;   /* the walk ends: entry limit reached or ERROR sent */
	int failed; /* ERROR sent: no OUT_END */
	struct proto_out_end end;
	char path[PROTO_MAX_PATH + 1]; /* relative path of the current entry */
};

static int collect_dir(struct collect *c, int dfd, int depth, size_t plen);

static int collect_fail(struct collect *c, int code, const char *what)
{
	c->failed = 1;
	c->stop = 1;
	return agent_send_error(c->a, code, "COLLECT %s: %s", c->path, what);
}

static int collect_send_dir(struct collect *c)
{
	struct proto_writer w = { .buf = agent_payload(c->a), .cap = PROTO_MAX_PAYLOAD };

	proto_put_str(&w, c->path);
	if (w.err)
		return w.err; /* cannot happen: the path is bounded */
	return agent_send(c->a, PROTO_OUT_DIR, w.buf, w.len);
}

static int collect_subdir(struct collect *c, int dfd, const char *name, int depth, size_t plen)
{
	int fd, r;

	if (depth > COLLECT_MAX_DEPTH) {
		c->end.skipped++;
		return 0;
	}
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		c->end.skipped++;
		return 0;
	}
	r = collect_send_dir(c);
	if (r < 0) {
		close(fd);
		return r;
	}
	c->end.dirs++;
	return collect_dir(c, fd, depth, plen);
}

static int collect_file(struct collect *c, int dfd, const char *name)
{
	struct proto_out_file m;
	struct stat st;
	uint64_t left;
	ssize_t n;
	int fd, r;

	/* fstatat() said regular, but the entry may have been swapped since:
	 * O_NOFOLLOW refuses a symlink, O_NONBLOCK keeps a FIFO from blocking,
	 * and fstat() on what was opened decides. */
	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0) {
		c->end.skipped++;
		return 0;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		c->end.skipped++;
		r = 0;
		goto out;
	}
	m.size = (uint64_t)st.st_size;
	if (m.size > c->budget) {
		c->end.flags |= PROTO_OUT_TRUNCATED;
		r = 0;
		goto out;
	}
	m.mode = st.st_mode & 07777;
	memcpy(m.path, c->path, sizeof(m.path));
	n = proto_out_file_encode(agent_payload(c->a), PROTO_MAX_PAYLOAD, &m);
	if (n < 0) {
		r = (int)n;
		goto out;
	}
	r = agent_send(c->a, PROTO_OUT_FILE, agent_payload(c->a), (size_t)n);
	if (r < 0)
		goto out;
	c->budget -= m.size;
	c->end.files++;

	/* Exactly m.size bytes follow OUT_FILE, whatever the file does now. */
	for (left = m.size; left > 0; left -= (uint64_t)n) {
		size_t chunk = left < PROTO_MAX_PAYLOAD ? (size_t)left : PROTO_MAX_PAYLOAD;

		n = read(fd, agent_payload(c->a), chunk);
		if (n < 0 && errno == EINTR) {
			n = 0;
			continue;
		}
		if (n < 0) {
			r = collect_fail(c, -errno, strerror(errno));
			goto out;
		}
		if (n == 0) {
			r = collect_fail(c, -EIO, "the file shrank while it was being sent");
			goto out;
		}
		r = agent_send(c->a, PROTO_OUT_DATA, agent_payload(c->a), (size_t)n);
		if (r < 0)
			goto out;
	}
out:
	close(fd);
	return r;
}

/* One directory entry; c->path holds the entry's relative path (plen long). */
static int collect_entry(struct collect *c, int dfd, const char *name, int depth, size_t plen)
{
	struct stat st;

	/* Names cannot hold '/' or NUL; this refuses only an over-long path. */
	if (proto_relpath_ok(c->path) < 0 || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		c->end.skipped++;
		return 0;
	}
	if (S_ISDIR(st.st_mode))
		return collect_subdir(c, dfd, name, depth + 1, plen);
	if (S_ISREG(st.st_mode))
		return collect_file(c, dfd, name);
	c->end.skipped++; /* symlink, device, FIFO, socket: never followed */
	return 0;
}

/* Walks the directory open on dfd (which it closes), whose relative path is
 * the first plen bytes of c->path. */
static int collect_dir(struct collect *c, int dfd, int depth, size_t plen)
{
	struct dirent *de;
	DIR *d;
	int r = 0;

	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		c->end.skipped++;
		return 0;
	}
	while (!c->stop && (de = readdir(d))) {
		size_t nlen = strlen(de->d_name);
		size_t off = plen ? plen + 1 : 0;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (++c->entries > COLLECT_MAX_ENTRIES) {
			c->end.flags |= PROTO_OUT_TRUNCATED;
			c->stop = 1;
			break;
		}
		if (off + nlen > PROTO_MAX_PATH) {
			c->end.skipped++;
			continue;
		}
		if (plen)
			c->path[plen] = '/';
		memcpy(c->path + off, de->d_name, nlen + 1);
		r = collect_entry(c, dirfd(d), de->d_name, depth, off + nlen);
		c->path[plen] = '\0';
		if (r < 0)
			break;
	}
	closedir(d);
	return r;
}

int collect_run(struct agent *a, const char *root, uint64_t budget)
{
	struct collect c = { .a = a, .budget = budget };
	ssize_t n;
	int fd, r;

	fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno != ENOENT)
		return agent_send_error(a, -errno, "COLLECT %s: %s", root, strerror(errno));
	if (fd >= 0) {
		r = collect_dir(&c, fd, 0, 0);
		if (r < 0)
			return r;
		if (c.failed)
			return 0;
	}
	n = proto_out_end_encode(agent_payload(a), PROTO_MAX_PAYLOAD, &c.end);
	if (n < 0)
		return (int)n;
	return agent_send(a, PROTO_OUT_END, agent_payload(a), (size_t)n);
}
