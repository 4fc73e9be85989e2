/* cgroup: the cgroup v1 side of a jail. Each jail gets one directory per
 * controller (memory, cpu, pids) under <mount>/<our own cgroup>/kiln, named
 * after the jail; its limits are written before the child joins. Removal
 * kills whatever is still listed, and a record written before any cgroup
 * exists lets jail_reap clean up after an owner that crashed. */
#include "jail_int.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

const char *const cg_names[CG_N] = { "memory", "cpu", "pids" };

/* 1 when the comma-separated list has the token. */
static int has_token(const char *list, size_t len, const char *tok)
{
	size_t tl = strlen(tok);

	for (const char *s = list, *end = list + len; s < end;) {
		size_t l = strcspn(s, ",");

		if (l > (size_t)(end - s))
			l = (size_t)(end - s);
		if (l == tl && !strncmp(s, tok, tl))
			return 1;
		s += l + 1;
	}
	return 0;
}

int cg_parse_proc(const char *text, const char *ctrl, char *out, size_t cap)
{
	/* Lines are "hierarchy-id:controller,list:path". */
	for (const char *line = text; *line;) {
		size_t ll = strcspn(line, "\n");
		const char *c = memchr(line, ':', ll), *p;

		if (c && (p = memchr(c + 1, ':', ll - (size_t)(c + 1 - line))) && has_token(c + 1, (size_t)(p - c - 1), ctrl)) {
			size_t pl = ll - (size_t)(p + 1 - line);

			if (pl >= cap)
				return -ENAMETOOLONG;
			memcpy(out, p + 1, pl);
			out[pl] = '\0';
			return 0;
		}
		line += ll + (line[ll] == '\n');
	}
	return -ENOENT;
}

/* The path of pid's cgroup (v1) holding ctrl; pid 0 is this process. */
static int cg_of_pid(pid_t pid, const char *ctrl, char *out, size_t cap)
{
	char path[64], text[16384];
	size_t n;
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/cgroup");
	f = fopen(path, "re");
	if (!f)
		return -errno;
	n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	return cg_parse_proc(text, ctrl, out, cap);
}

int cg_path(char *out, size_t cap, const char *base, const char *name)
{
	if ((size_t)snprintf(out, cap, "%s/%s", base, name) >= cap) {
		out[0] = '\0';
		return -ENAMETOOLONG;
	}
	return 0;
}

int cg_config_init(struct jail_config *c, struct kiln_err *err)
{
	char *dirs[CG_N] = { c->cg_memory, c->cg_cpu, c->cg_pids };

	for (int i = 0; i < CG_N; i++) {
		char own[400], probe[600];

		/* Nest under our own cgroup: a kiln-host run by a service manager
		 * keeps its VMs inside its own limits and accounting. */
		if (cg_of_pid(0, cg_names[i], own, sizeof(own)) < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: no cgroup v1 \"%s\" controller in /proc/self/cgroup",
					    cg_names[i]);
		if (!strcmp(own, "/"))
			own[0] = '\0';
		snprintf(probe, sizeof(probe), "/sys/fs/cgroup/%s%s/cgroup.procs", cg_names[i], own);
		if (access(probe, W_OK) < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: %s (cgroup v1 \"%s\" hierarchy expected)", probe,
					    strerror(errno), cg_names[i]);
		snprintf(dirs[i], sizeof(c->cg_memory), "/sys/fs/cgroup/%s%s/kiln", cg_names[i], own);
	}
	return 0;
}

/* Write val to dir/file in one write(): cgroup files take a value per write. */
static int cg_write(const char *dir, const char *file, const char *val)
{
	char path[700];
	int fd, r = 0;
	size_t len = strlen(val);

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, val, len) != (ssize_t)len)
		r = -errno;
	close(fd);
	return r;
}

/* Up to cap - 1 bytes of dir/file, NUL-terminated: the count, or -1. */
static ssize_t cg_read(const char *dir, const char *file, char *buf, size_t cap)
{
	char path[700];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, cap - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return n;
}

int cg_populated(const char *dir)
{
	char buf[16];

	return cg_read(dir, "cgroup.procs", buf, sizeof(buf)) > 0;
}

/* Kill every process in the cgroup at dir (it belongs to one jail only). */
static int cg_kill_all(const char *dir, const char *ctrl)
{
	char path[700], prefix[64];
	const char *rel;
	FILE *f;
	int pid, n = 0;

	/* dir is /sys/fs/cgroup/<ctrl>/<rel>: /proc/<pid>/cgroup shows /<rel>. */
	snprintf(prefix, sizeof(prefix), "/sys/fs/cgroup/%s/", ctrl);
	if (strncmp(dir, prefix, strlen(prefix)))
		return 0;
	rel = dir + strlen(prefix) - 1;
	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fscanf(f, "%d", &pid) == 1) {
		int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
		char now[1024];

		/* The pidfd pins the process; check it is still the one in the cgroup. */
		if (pfd >= 0 && cg_of_pid(pid, ctrl, now, sizeof(now)) == 0 && !strcmp(now, rel)) {
			syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
			n++;
		}
		if (pfd >= 0)
			close(pfd);
	}
	fclose(f);
	return n;
}

int cg_remove(const char *dir, const char *ctrl)
{
	for (int i = 0; i < 400; i++) {
		struct timespec ts = { 0, 5 * 1000 * 1000 };

		if (rmdir(dir) == 0 || errno == ENOENT)
			return 0;
		if (errno != EBUSY)
			return -errno;
		/* A just-reaped process may still be leaving its cgroup: only kill
		 * what is really listed, and give exits a moment. */
		cg_kill_all(dir, ctrl);
		nanosleep(&ts, NULL);
	}
	return -EBUSY;
}

void cg_remove_parent(const char *dir)
{
	char parent[600];
	char *slash;

	/* Another jail may still use it: then rmdir fails, which is fine. */
	snprintf(parent, sizeof(parent), "%s", dir);
	slash = strrchr(parent, '/');
	if (slash) {
		*slash = '\0';
		rmdir(parent);
	}
}

int cg_values(const struct jail_spec *spec, long long cpu_period, struct cg_value v[4])
{
	int n = 0;

	if (spec->memory_bytes) {
		v[n] = (struct cg_value){ CG_MEMORY, "memory.limit_in_bytes", "", 0 };
		snprintf(v[n++].val, sizeof(v->val), "%llu", (unsigned long long)spec->memory_bytes);
		/* With swap accounting, memory+swap gets the same limit: no swapping past it. */
		v[n] = v[n - 1];
		v[n].file = "memory.memsw.limit_in_bytes";
		v[n++].optional = 1;
	}
	if (spec->cpus) {
		v[n] = (struct cg_value){ CG_CPU, "cpu.cfs_quota_us", "", 0 };
		snprintf(v[n++].val, sizeof(v->val), "%lld", (cpu_period > 0 ? cpu_period : 100000) * spec->cpus);
	}
	if (spec->pids) {
		v[n] = (struct cg_value){ CG_PIDS, "pids.max", "", 0 };
		snprintf(v[n++].val, sizeof(v->val), "%u", spec->pids);
	}
	return n;
}

int cg_create(const struct jail_config *c, const struct jail_spec *spec, struct jail *j, int procs_fd[CG_N],
	      struct kiln_err *err)
{
	struct cg_value v[4];
	long long period = -1;
	char buf[64];
	int r, n;

	for (int i = 0; i < CG_N; i++) {
		for (int tries = 0;; tries++) {
			if (mkdir(cg_base(c, i), 0755) < 0 && errno != EEXIST)
				return kiln_err_set(err, KERR_HOST_ERROR, "jail: mkdir %s: %s", cg_base(c, i), strerror(errno));
			if (mkdir(j->cg[i], 0755) == 0)
				break;
			r = errno;
			if (tries > 5 || (r != ENOENT && r != EEXIST))
				return kiln_err_set(err, KERR_HOST_ERROR, "jail: mkdir %s: %s", j->cg[i], strerror(r));
			/* ENOENT: a releasing jail removed the empty parent; EEXIST:
			 * names are unique among live jails, so this one is stale. */
			if (r == EEXIST)
				cg_remove(j->cg[i], cg_names[i]);
		}
	}
	/* The budget of all jails together, on their common parent: written each
	 * time, as the parent is removed with its last jail. EBUSY (usage is
	 * above a lowered budget already) leaves the old limit: not an error. */
	if (c->memory_budget_bytes) {
		snprintf(buf, sizeof(buf), "%llu", (unsigned long long)c->memory_budget_bytes);
		if ((r = cg_write(cg_base(c, CG_MEMORY), "memory.limit_in_bytes", buf)) < 0 && r != -EBUSY)
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s/memory.limit_in_bytes: %s",
					    cg_base(c, CG_MEMORY), strerror(-r));
	}
	if (spec->cpus && cg_read(j->cg[CG_CPU], "cpu.cfs_period_us", buf, sizeof(buf)) > 0)
		period = strtoll(buf, NULL, 10);
	n = cg_values(spec, period, v);
	for (int i = 0; i < n; i++)
		if ((r = cg_write(j->cg[v[i].ctrl], v[i].file, v[i].val)) < 0 && !v[i].optional)
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s/%s: %s", j->cg[v[i].ctrl], v[i].file, strerror(-r));
	for (int i = 0; i < CG_N; i++) {
		char path[700];

		snprintf(path, sizeof(path), "%s/cgroup.procs", j->cg[i]);
		procs_fd[i] = open(path, O_WRONLY | O_CLOEXEC);
		if (procs_fd[i] < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: %s", path, strerror(errno));
	}
	return 0;
}

int jail_oom_kills(const struct jail *j)
{
	char buf[256];
	const char *p;

	if (!j->cg[CG_MEMORY][0])
		return -ENOENT;
	if (cg_read(j->cg[CG_MEMORY], "memory.oom_control", buf, sizeof(buf)) < 0)
		return -errno;
	/* "oom_kill_disable 0\nunder_oom 0\noom_kill N\n" (Linux >= 4.13). */
	p = strstr(buf, "oom_kill ");
	return p ? atoi(p + 9) : -ENOTSUP;
}

int jail_set_cpu_shares(const struct jail *j, unsigned shares)
{
	char buf[24];

	if (!j->cg[CG_CPU][0])
		return -ENOENT;
	snprintf(buf, sizeof(buf), "%u", shares < 2 ? 2 : shares > 262144 ? 262144 : shares);
	return cg_write(j->cg[CG_CPU], "cpu.shares", buf);
}

int cg_record_write(const struct jail *j, const char *path)
{
	FILE *f = fopen(path, "we");
	int r = 0;

	if (!f)
		return -errno;
	fprintf(f, "slot %d\n", j->slot);
	for (int i = 0; i < CG_N; i++)
		if (j->cg[i][0])
			fprintf(f, "cgroup %s %s\n", cg_names[i], j->cg[i]);
	if (fflush(f) != 0)
		r = -errno;
	if (fclose(f) != 0 && !r)
		r = -errno;
	return r;
}

int jail_reap(const char *record_path)
{
	FILE *f = fopen(record_path, "re");
	char line[800];
	int r = 0;

	if (!f)
		return errno == ENOENT ? 0 : -errno;
	while (fgets(line, sizeof(line), f)) {
		char ctrl[16], dir[700];

		if (sscanf(line, "cgroup %15s %699s", ctrl, dir) != 2)
			continue;
		/* Written by kiln-host into its own directory, but checked anyway:
		 * only a directory in a cgroup v1 hierarchy is removed. */
		if (strncmp(dir, "/sys/fs/cgroup/", 15) || strstr(dir, "/../") || strstr(dir, "/./"))
			continue;
		if (cg_remove(dir, ctrl) < 0)
			r = -EBUSY;
		else
			cg_remove_parent(dir);
	}
	fclose(f);
	return r;
}
