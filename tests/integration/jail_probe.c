/* jail-probe: look at a live jail from the inside, as its own uid. Enters the
 * mount, PID, network, IPC and UTS namespaces of PID (a jailed QEMU), takes
 * PID's uid and gid with no capabilities and no_new_privs, and reports what
 * that identity sees and may do, one "key value" line per check, for
 * tests/integration/25-jail.sh. Never writes anything it can open: a write
 * test reads a byte and writes the same byte back.
 *   usage: jail-probe PID [--open PATH]... [--write PATH]... [--memfd PATH]... */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/capability.h>

static int cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static const char *ename(int e)
{
	return e ? strerrorname_np(e) : "ok";
}

/* Sorted, comma-separated entries of a directory (without . and ..). */
static void list_dir(const char *key, const char *path)
{
	char *names[256];
	int n = 0;
	DIR *d = opendir(path);
	struct dirent *e;

	printf("%s ", key);
	if (!d) {
		printf("%s\n", ename(errno));
		return;
	}
	while ((e = readdir(d)) && n < 256)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			names[n++] = strdup(e->d_name);
	closedir(d);
	qsort(names, (size_t)n, sizeof(names[0]), cmp);
	for (int i = 0; i < n; i++) {
		printf("%s%s", i ? "," : "", names[i]);
		free(names[i]);
	}
	printf("\n");
}

/* Can this identity write the file? Same byte back, so nothing changes. */
static void try_write(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);

	printf("write %s %s\n", path, ename(fd < 0 ? errno : 0));
	if (fd >= 0)
		close(fd);
}

/* The template memfd: every way of changing it. */
static void try_memfd(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC), e;
	unsigned char b = 0;
	void *p;

	printf("memfd %s", path);
	if (fd < 0) {
		printf(" open=%s\n", ename(errno));
		return;
	}
	printf(" open=ok seals=0x%x", fcntl(fd, F_GET_SEALS));
	if (pread(fd, &b, 1, 4096) != 1)
		b = 0;
	e = pwrite(fd, &b, 1, 4096) == 1 ? 0 : errno;
	printf(" write=%s", ename(e));
	printf(" truncate=%s", ename(ftruncate(fd, 0) == 0 ? 0 : errno));
	printf(" punch=%s", ename(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0 ? 0 : errno));
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	printf(" mmap_shared=%s", ename(p == MAP_FAILED ? errno : 0));
	if (p != MAP_FAILED)
		munmap(p, 4096);
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	printf(" mmap_private=%s", ename(p == MAP_FAILED ? errno : 0));
	if (p != MAP_FAILED)
		munmap(p, 4096);
	printf(" unseal=%s\n", ename(fcntl(fd, F_ADD_SEALS, 0) == 0 ? 0 : errno));
	close(fd);
}

static int ids(pid_t pid, uid_t *uid, gid_t *gid)
{
	char path[64], line[256];
	FILE *f;
	int got = 0;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned v;

		if (sscanf(line, "Uid: %u", &v) == 1) {
			*uid = v;
			got++;
		}
		if (sscanf(line, "Gid: %u", &v) == 1) {
			*gid = v;
			got++;
		}
	}
	fclose(f);
	return got == 2 ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const char *const ns[] = { "net", "ipc", "uts", "pid", "mnt" };
	static const int nstype[] = { CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWPID, CLONE_NEWNS };
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct none[2];
	int fds[5], status;
	uid_t uid = 0;
	gid_t gid = 0;
	pid_t pid, child;
	char host[64];

	if (argc < 2 || (pid = atoi(argv[1])) <= 0) {
		fprintf(stderr, "usage: jail-probe PID [--open PATH]... [--write PATH]... [--memfd PATH]...\n");
		return 2;
	}
	if (ids(pid, &uid, &gid) < 0) {
		fprintf(stderr, "jail-probe: cannot read /proc/%d/status\n", (int)pid);
		return 1;
	}
	for (int i = 0; i < 5; i++) {
		char path[64];

		snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)pid, ns[i]);
		if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
			perror(path);
			return 1;
		}
	}
	/* The mount namespace last: it also moves our root and cwd into the jail. */
	for (int i = 0; i < 5; i++)
		if (setns(fds[i], nstype[i]) < 0) {
			fprintf(stderr, "jail-probe: setns %s: %s\n", ns[i], strerror(errno));
			return 1;
		}
	/* The PID namespace applies to children. */
	child = fork();
	if (child < 0)
		return 1;
	if (child > 0) {
		while (waitpid(child, &status, 0) < 0 && errno == EINTR)
			;
		return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
	}
	for (int cap = 0; cap < 64; cap++)
		prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0) {
		perror("jail-probe: dropping to the jail's uid");
		return 1;
	}
	memset(none, 0, sizeof(none));
	if (syscall(SYS_capset, &hdr, none) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		perror("jail-probe: dropping capabilities");
		return 1;
	}
	if (chdir("/") < 0)
		return 1;
	printf("uid %u\ngid %u\n", (unsigned)getuid(), (unsigned)getgid());
	list_dir("root", "/");
	list_dir("dev", "/dev");
	list_dir("proc_pids", "/proc");
	if (gethostname(host, sizeof(host)) == 0)
		printf("hostname %s\n", host);
	{
		struct if_nameindex *ifs = if_nameindex(), *i;

		printf("netifs ");
		for (i = ifs; i && i->if_index; i++)
			printf("%s%s", i == ifs ? "" : ",", i->if_name);
		printf("\n");
		if (ifs)
			if_freenameindex(ifs);
	}
	{
		/* Field 5 is the mount point, field 6 its per-mount options. */
		FILE *f = fopen("/proc/self/mountinfo", "re");
		char line[4096], rw[4096] = "";
		int n = 0;

		while (f && fgets(line, sizeof(line), f)) {
			char mnt[1024], opts[1024];

			n++;
			if (sscanf(line, "%*s %*s %*s %*s %1023s %1023s", mnt, opts) == 2 && !strncmp(opts, "rw", 2) &&
			    strlen(rw) + strlen(mnt) + 2 < sizeof(rw))
				snprintf(rw + strlen(rw), sizeof(rw) - strlen(rw), "%s%s", rw[0] ? "," : "", mnt);
		}
		if (f)
			fclose(f);
		printf("mounts %d\nrw_mounts %s\n", n, rw);
	}
	printf("mkdir_root %s\n", ename(mkdir("/kiln-probe", 0700) == 0 ? 0 : errno));
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--open")) {
			int fd = open(argv[i + 1], O_RDONLY | O_CLOEXEC);

			printf("open %s %s\n", argv[i + 1], ename(fd < 0 ? errno : 0));
			if (fd >= 0)
				close(fd);
		} else if (!strcmp(argv[i], "--write")) {
			try_write(argv[i + 1]);
		} else if (!strcmp(argv[i], "--memfd")) {
			try_memfd(argv[i + 1]);
		}
	}
	return 0;
}
