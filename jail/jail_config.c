/* jail_config: the host-wide jail settings (struct jail_config). Finds this
 * process's cgroups, builds the seccomp filter, and fills the base plan every
 * jail sees: programs with exactly the libraries their loader resolves,
 * and read-only paths. */
#include "jail_int.h"

#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int jail_config_init(struct jail_config *c, struct kiln_err *err)
{
	int r;

	memset(c, 0, sizeof(*c));
	c->uid_base = 64000;
	c->slots = 1000;
	snprintf(c->slot_dir, sizeof(c->slot_dir), "/run/kiln/slots");
	if (cg_config_init(c, err) < 0)
		return -1;
	c->base = calloc(1, sizeof(*c->base));
	if (!c->base)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	if ((r = seccomp_filter_build(&c->filter, &c->filter_len)) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: building the seccomp filter: %s", strerror(-r));
	/* Always there: QEMU and most programs open /dev/null. */
	if ((r = plan_path(c->base, "/dev/null", OP_BIND_DEV)) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: /dev/null: %s", strerror(-r));
	return 0;
}

void jail_config_free(struct jail_config *c)
{
	free(c->filter);
	c->filter = NULL;
	if (c->base) {
		plan_free(c->base);
		free(c->base);
	}
	c->base = NULL;
}

int jail_config_add_ro(struct jail_config *c, const char *path, struct kiln_err *err)
{
	int r = plan_path(c->base, path, OP_BIND_RO);

	return r < 0 ? plan_err(err, path, r) : 0;
}

int config_elf_interp(const char *path, char *out, size_t cap)
{
	Elf64_Ehdr eh;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = -ENOEXEC;

	out[0] = '\0';
	if (fd < 0)
		return -errno;
	if (pread(fd, &eh, sizeof(eh), 0) != sizeof(eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
	    eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 256)
		goto out;
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;

		if (pread(fd, &ph, sizeof(ph), (off_t)(eh.e_phoff + i * sizeof(ph))) != sizeof(ph))
			goto out;
		if (ph.p_type != PT_INTERP)
			continue;
		if (ph.p_filesz < 2 || ph.p_filesz > cap || pread(fd, out, ph.p_filesz, (off_t)ph.p_offset) != (ssize_t)ph.p_filesz)
			goto out;
		out[ph.p_filesz - 1] = '\0';
		if (out[0] != '/')
			goto out;
		break;
	}
	r = 0;
out:
	close(fd);
	return r;
}

int config_dir_list_add(struct buf *b, const char *dir)
{
	size_t dl = strlen(dir);

	for (const char *s = b->p; s && *s;) {
		const char *e = strchr(s, ':');
		size_t sl = e ? (size_t)(e - s) : strlen(s);

		if (sl == dl && !strncmp(s, dir, dl))
			return 0;
		s = e ? e + 1 : s + sl;
	}
	if (buf_reserve(b, dl + 1) < 0)
		return -ENOMEM;
	if (b->len)
		buf_add(b, ":", 1);
	return buf_add(b, dir, dl);
}

/* The loader itself says what it would load, so the jail gets exactly that
 * (its search rules, hwcaps subdirectories, RUNPATHs included). The
 * environment is empty: no LD_* variable from ours changes the answer. */
int jail_config_add_program(struct jail_config *c, const char *program, struct kiln_err *err)
{
	char interp[PATH_MAX], line[PATH_MAX + 128];
	char *argv[4];
	char *envp[] = { NULL };
	posix_spawn_file_actions_t fa;
	int pipefd[2], r, status;
	pid_t pid;
	FILE *f;

	if ((r = config_elf_interp(program, interp, sizeof(interp))) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: not an ELF program we can read (%s)", program, strerror(-r));
	if ((r = plan_path(c->base, program, OP_BIND_RO)) < 0)
		return plan_err(err, program, r);
	if (!interp[0]) /* static: nothing else to load */
		return 0;
	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "pipe: %s", strerror(errno));
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	argv[0] = interp;
	argv[1] = "--list";
	argv[2] = (char *)program;
	argv[3] = NULL;
	r = posix_spawn(&pid, interp, &fa, NULL, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	close(pipefd[1]);
	if (r) {
		close(pipefd[0]);
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: cannot run %s --list: %s", interp, strerror(r));
	}
	f = fdopen(pipefd[0], "r");
	r = 0;
	while (f && fgets(line, sizeof(line), f)) {
		char *arrow = strstr(line, "=> "), *path = arrow ? arrow + 3 : line, *end;

		while (*path == ' ' || *path == '\t')
			path++;
		if (strstr(line, "not found")) {
			line[strcspn(line, "\n")] = '\0';
			kiln_err_set(err, KERR_HOST_ERROR, "jail: %s needs a library the loader cannot find: %s", program, line);
			r = -1;
			continue;
		}
		if (path[0] != '/') /* linux-vdso.so.1 and the like */
			continue;
		end = strstr(path, " (");
		if (end)
			*end = '\0';
		path[strcspn(path, "\n")] = '\0';
		if (r == 0 && (r = plan_path(c->base, path, OP_BIND_RO)) < 0)
			r = plan_err(err, path, r);
		if (r == 0) {
			char *slash = strrchr(path, '/');

			*slash = '\0';
			if (config_dir_list_add(&c->base->ld_path, slash == path ? "/" : path) < 0)
				r = kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		}
	}
	if (f)
		fclose(f);
	else
		close(pipefd[0]);
	jail_waitpid(pid, &status);
	if (r == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s --list %s failed", interp, program);
	if (r == 0 && (r = plan_path(c->base, interp, OP_BIND_RO)) < 0)
		return plan_err(err, interp, r);
	return r;
}
