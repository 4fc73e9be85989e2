/* kiln-jail: run one program in the jail kiln-host puts QEMU in (jail.h), for
 * operators and tests. This file only parses the command line. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "jail.h"

static void usage(FILE *f)
{
	fputs("usage: kiln-jail [options] -- PROGRAM [ARGS...]\n"
	      "Runs PROGRAM (an absolute path) as PID 1 of new mount, PID, IPC, UTS and network\n"
	      "namespaces, in a read-only root holding only PROGRAM, its libraries and the paths\n"
	      "given, under cgroup v1 limits and rlimits, as a slot uid with no capabilities.\n"
	      "options:\n"
	      "  --dir DIR        jail directory: DIR/root is the root's mount point, DIR/work is\n"
	      "                   writable by the program (default: a new /run/kiln/jail-XXXXXX,\n"
	      "                   removed at the end)\n"
	      "  --ro PATH        bind PATH (file or directory) read-only; repeatable\n"
	      "  --rw PATH        bind the file PATH read-write, chowned to the slot uid; repeatable\n"
	      "  --dev PATH       bind the device node PATH (/dev/null is always there)\n"
	      "  --fd N           pass descriptor N; passed descriptors become 3, 4, ... in order\n"
	      "  --memfd FILE     pass FILE's contents as a sealed memfd (as kiln-host passes a\n"
	      "                   snapshot's RAM to a clone), as the next descriptor\n"
	      "  --env NAME=VAL   add to the program's environment (empty by default); repeatable\n"
	      "  --memory MiB     memory.limit_in_bytes (default 256)\n"
	      "  --cpus N         cpu.cfs_quota_us = N periods (default 1)\n"
	      "  --pids N         pids.max and RLIMIT_NPROC (default 64)\n"
	      "  --nofile N       RLIMIT_NOFILE (default 256)\n"
	      "  --fsize MiB      RLIMIT_FSIZE (default 1024)\n"
	      "  --no-proc        no /proc in the jail\n"
	      "  --uid-base N     slot n runs as uid/gid N+n (default 64000)\n"
	      "  --slots N        number of slots (default 1000)\n"
	      "  --slot-dir DIR   slot lock files (default /run/kiln/slots)\n"
	      "exit status: PROGRAM's; 128+N when it was killed by signal N; 125 when the jail\n"
	      "could not be set up\n",
	      f);
}

static int parse_u(const char *s, unsigned long max, unsigned *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > max)
		return -1;
	*out = (unsigned)v;
	return 0;
}

int main(int argc, char **argv)
{
	enum { O_DIR = 1000, O_RO, O_RW, O_DEV, O_FD, O_MEMFD, O_ENV, O_MEM, O_CPUS, O_PIDS, O_NOFILE, O_FSIZE,
	       O_NOPROC, O_UIDBASE, O_SLOTS, O_SLOTDIR };
	static const struct option opts[] = {
		{ "dir", required_argument, 0, O_DIR },	       { "ro", required_argument, 0, O_RO },
		{ "rw", required_argument, 0, O_RW },	       { "dev", required_argument, 0, O_DEV },
		{ "fd", required_argument, 0, O_FD },	       { "memfd", required_argument, 0, O_MEMFD },
		{ "env", required_argument, 0, O_ENV },	       { "memory", required_argument, 0, O_MEM },
		{ "cpus", required_argument, 0, O_CPUS },      { "pids", required_argument, 0, O_PIDS },
		{ "nofile", required_argument, 0, O_NOFILE },  { "fsize", required_argument, 0, O_FSIZE },
		{ "no-proc", no_argument, 0, O_NOPROC },       { "uid-base", required_argument, 0, O_UIDBASE },
		{ "slots", required_argument, 0, O_SLOTS },    { "slot-dir", required_argument, 0, O_SLOTDIR },
		{ "help", no_argument, 0, 'h' },	       { 0, 0, 0, 0 },
	};
	static struct jail_config jc;
	static char *envp[64];
	struct jail_spec spec = { .proc = 1, .stdout_fd = 1, .stderr_fd = 2, .memory_bytes = 256ull << 20, .cpus = 1,
				  .pids = 64, .nofile = 256, .fsize_bytes = 1024ull << 20, .envp = envp };
	struct kiln_err err = { .code = "" };
	struct jail j = { 0 };
	char dir[PATH_MAX] = "", root[PATH_MAX + 8], work[PATH_MAX + 8], record[PATH_MAX + 8], name[64];
	const char *memfd_path[JAIL_MAX_FDS] = { 0 };
	int nro = 0, nrw = 0, ndev = 0, nenv = 0, made_dir = 0, c, pidfd = -1, sfd, status = 0, rc = 125;
	unsigned v, uid_base = 64000, slots = 1000;
	const char *slot_dir = NULL;
	sigset_t sigs;
	pid_t pid;

	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case O_DIR: snprintf(dir, sizeof(dir), "%s", optarg); break;
		case O_RO:
			if (nro == JAIL_MAX_PATHS - 1)
				goto too_many;
			spec.ro[nro++] = optarg;
			break;
		case O_RW:
			if (nrw == JAIL_MAX_PATHS - 1)
				goto too_many;
			spec.rw[nrw++] = optarg;
			break;
		case O_DEV:
			if (ndev == 3)
				goto too_many;
			spec.dev[ndev++] = optarg;
			break;
		case O_FD:
		case O_MEMFD:
			if (spec.nkeep == JAIL_MAX_FDS)
				goto too_many;
			if (c == O_MEMFD) {
				memfd_path[spec.nkeep] = optarg;
				spec.keep_fds[spec.nkeep++] = -1;
			} else if (parse_u(optarg, INT_MAX, &v) < 0 || v < 3 || fcntl((int)v, F_GETFD) < 0) {
				fprintf(stderr, "kiln-jail: --fd %s: not an open descriptor >= 3\n", optarg);
				return 125;
			} else {
				spec.keep_fds[spec.nkeep++] = (int)v;
			}
			break;
		case O_ENV:
			if (nenv == 62 || !strchr(optarg, '='))
				goto too_many;
			envp[nenv++] = optarg;
			break;
		case O_MEM:
		case O_FSIZE:
			if (parse_u(optarg, 1u << 30, &v) < 0 || !v) {
				fprintf(stderr, "kiln-jail: --%s: expected MiB > 0\n", c == O_MEM ? "memory" : "fsize");
				return 125;
			}
			if (c == O_MEM)
				spec.memory_bytes = (uint64_t)v << 20;
			else
				spec.fsize_bytes = (uint64_t)v << 20;
			break;
		case O_CPUS:
		case O_PIDS:
		case O_NOFILE:
			if (parse_u(optarg, 1u << 20, &v) < 0 || !v) {
				fprintf(stderr, "kiln-jail: --%s: expected a number > 0\n", opts[c - O_DIR].name);
				return 125;
			}
			*(c == O_CPUS ? &spec.cpus : c == O_PIDS ? &spec.pids : &spec.nofile) = v;
			break;
		case O_NOPROC: spec.proc = 0; break;
		case O_UIDBASE:
			if (parse_u(optarg, 1u << 30, &uid_base) < 0 || uid_base == 0) {
				fprintf(stderr, "kiln-jail: --uid-base: expected a uid > 0\n");
				return 125;
			}
			break;
		case O_SLOTS:
			if (parse_u(optarg, 1u << 20, &slots) < 0 || !slots) {
				fprintf(stderr, "kiln-jail: --slots: expected a number > 0\n");
				return 125;
			}
			break;
		case O_SLOTDIR: slot_dir = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 125;
		}
	}
	if (optind >= argc || argv[optind][0] != '/') {
		usage(stderr);
		return 125;
	}
	spec.exe = argv[optind];
	if (jail_config_init(&jc, &err) < 0 || jail_config_add_program(&jc, spec.exe, &err) < 0)
		goto fail;
	jc.uid_base = uid_base;
	jc.slots = slots;
	if (slot_dir)
		snprintf(jc.slot_dir, sizeof(jc.slot_dir), "%s", slot_dir);
	for (int i = 0; i < spec.nkeep; i++) {
		struct stat st;

		if (memfd_path[i] && (spec.keep_fds[i] = jail_sealed_memfd(memfd_path[i], &st, &err)) < 0)
			goto fail;
	}
	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "/run/kiln/jail-XXXXXX");
		mkdir("/run/kiln", 0755);
		if (!mkdtemp(dir)) {
			kiln_err_set(&err, KERR_HOST_ERROR, "mkdtemp %s: %s", dir, strerror(errno));
			goto fail;
		}
		made_dir = 1;
	}
	if (!made_dir && mkdir(dir, 0700) < 0 && errno != EEXIST) {
		kiln_err_set(&err, KERR_HOST_ERROR, "mkdir %s: %s", dir, strerror(errno));
		goto fail;
	}
	snprintf(root, sizeof(root), "%s/root", dir);
	snprintf(work, sizeof(work), "%s/work", dir);
	snprintf(record, sizeof(record), "%s/jail", dir);
	if ((mkdir(root, 0755) < 0 && errno != EEXIST) || (mkdir(work, 0700) < 0 && errno != EEXIST)) {
		kiln_err_set(&err, KERR_HOST_ERROR, "%s: %s", dir, strerror(errno));
		goto fail;
	}
	/* The cgroup name: unique among live jails (pid of this launcher). */
	snprintf(name, sizeof(name), "jail-%d", (int)getpid());
	spec.name = name;
	spec.root = root;
	spec.work = work;
	spec.record = record;

	/* Signals end the program (and with it the jail) before we clean up. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP);
	sigprocmask(SIG_BLOCK, &sigs, NULL);
	sfd = signalfd(-1, &sigs, SFD_CLOEXEC);
	pid = jail_spawn(&jc, &spec, argv + optind, &j, &pidfd, &err);
	if (pid < 0)
		goto fail;
	for (;;) {
		struct pollfd p[2] = { { .fd = pidfd, .events = POLLIN }, { .fd = sfd, .events = POLLIN } };

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[0].revents)
			break;
		if (p[1].revents) {
			kill(pid, SIGKILL);
			break;
		}
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	jail_release(&j);
	close(pidfd);
	goto out;
fail:
	fprintf(stderr, "kiln-jail: %s\n", err.message);
out:
	/* The directory we made, with what the program wrote (never following its links). */
	if (made_dir)
		fs_rmtree(dir);
	jail_config_free(&jc);
	return rc;
too_many:
	fprintf(stderr, "kiln-jail: too many (or malformed) %s options\n", argv[optind - 1]);
	return 125;
}
