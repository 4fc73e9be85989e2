/* init: boot of the guest from an initramfs that holds only kiln-init: mount
 * the root disk, switch to it, set up the pseudo filesystems and find the host
 * channel. Every wait here has a deadline; failures end in init_die(). */
#include "init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"

/* How long boot waits for a device the kernel is still probing. */
#define INIT_WAIT_MS  10000
/* Pause between two looks at a device that is not there yet. Neither
 * devtmpfs nodes appearing nor sysfs attributes (the port name arrives in a
 * separate control message, after the port) can be waited on directly here,
 * so this is a short bounded retry, not a guess at readiness. */
#define INIT_RETRY_NS (5 * 1000 * 1000)
#define INIT_ROOT_DEV "/dev/vda"
#define INIT_NEWROOT  "/newroot"
#define INIT_PORTS    "/sys/class/virtio-ports"
#define INIT_NICE     -10

void init_log(const char *fmt, ...)
{
	static const char prefix[] = "kiln-init: ";
	char buf[1024];
	size_t n = sizeof(prefix) - 1;
	va_list ap;
	int m;

	memcpy(buf, prefix, n);
	va_start(ap, fmt);
	m = vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
	va_end(ap);
	if (m > 0)
		n += (size_t)m < sizeof(buf) - n - 1 ? (size_t)m : sizeof(buf) - n - 2;
	buf[n++] = '\n';
	/* One write so that messages from the agent and a dying child do not
	 * interleave mid-line. Nothing useful can be done if it fails. */
	if (write(2, buf, n) < 0)
		return;
}

void init_die(const char *fmt, ...)
{
	char msg[900];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	init_log("fatal: %s", msg);
	/* The UART is slower than the reboot: without this the message is lost. */
	tcdrain(2);
	reboot(RB_AUTOBOOT);
	/* Not PID 1 or not root (a test): exiting PID 1 would panic and, with
	 * panic=-1, reboot too. */
	_exit(1);
}

static int64_t init_deadline(void)
{
	return proto_now_ms() + INIT_WAIT_MS;
}

/* Sleeps one retry step; returns -ETIMEDOUT once the deadline has passed. */
static int init_retry(int64_t deadline_ms)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = INIT_RETRY_NS };

	if (proto_now_ms() >= deadline_ms)
		return -ETIMEDOUT;
	nanosleep(&ts, NULL);
	return 0;
}

static void init_mkdir(const char *path, mode_t mode)
{
	if (mkdir(path, mode) < 0 && errno != EEXIST)
		init_die("mkdir %s: %s", path, strerror(errno));
}

static void init_mount(const char *src, const char *dst, const char *type,
		       unsigned long flags, const char *data)
{
	init_mkdir(dst, 0755);
	if (mount(src, dst, type, flags, data) < 0)
		init_die("mount %s on %s: %s", type, dst, strerror(errno));
}

/* The kernel found no /dev/console in the initramfs, so PID 1 starts with
 * fds 0-2 closed: the first files opened later would land there and a task
 * child's dup2() onto 1 and 2 could close our own pipe ends. Pin 0 to
 * /dev/null and 1-2 to the console (needs devtmpfs mounted). */
static void init_stdio(void)
{
	int null = open("/dev/null", O_RDWR);
	int con = open("/dev/console", O_WRONLY | O_NOCTTY);
	int null_hi, con_hi;

	if (null < 0)
		init_die("open /dev/null: %s", strerror(errno)); /* logs nowhere, still reboots */
	if (con < 0)
		con = null;
	/* Move both above 2 first: either may have been given fd 0, 1 or 2. */
	null_hi = fcntl(null, F_DUPFD_CLOEXEC, 3);
	con_hi = fcntl(con, F_DUPFD_CLOEXEC, 3);
	if (null_hi < 0 || con_hi < 0)
		init_die("dup: %s", strerror(errno));
	close(null);
	if (con != null)
		close(con);
	if (dup2(null_hi, 0) < 0 || dup2(con_hi, 1) < 0 || dup2(con_hi, 2) < 0)
		init_die("dup2: %s", strerror(errno));
	close(null_hi);
	close(con_hi);
}

static void init_wait_root(void)
{
	int64_t deadline = init_deadline();
	struct stat st;

	for (;;) {
		if (stat(INIT_ROOT_DEV, &st) == 0) {
			if (!S_ISBLK(st.st_mode))
				init_die("%s is not a block device", INIT_ROOT_DEV);
			return;
		}
		if (errno != ENOENT)
			init_die("stat %s: %s", INIT_ROOT_DEV, strerror(errno));
		if (init_retry(deadline) < 0)
			init_die("no %s after %d ms", INIT_ROOT_DEV, INIT_WAIT_MS);
	}
}

/* The classic switch_root: the initramfs stays in memory underneath (it holds
 * only this binary), which spares walking and deleting it. */
static void init_switch_root(void)
{
	/* Drop the initramfs' own /dev and /proc: the new root gets fresh ones.
	 * Lazily, since fds 0-2 are still open on this devtmpfs mount. */
	umount2("/proc", MNT_DETACH);
	umount2("/dev", MNT_DETACH);
	if (chdir(INIT_NEWROOT) < 0)
		init_die("chdir %s: %s", INIT_NEWROOT, strerror(errno));
	if (mount(".", "/", NULL, MS_MOVE, NULL) < 0)
		init_die("move %s to /: %s", INIT_NEWROOT, strerror(errno));
	if (chroot(".") < 0)
		init_die("chroot: %s", strerror(errno));
	if (chdir("/") < 0)
		init_die("chdir /: %s", strerror(errno));
}

/* What udev would otherwise add to /dev: shells and Python use /dev/fd. */
static void init_dev_links(void)
{
	static const char *const links[][2] = {
		{ "/proc/self/fd", "/dev/fd" },
		{ "/proc/self/fd/0", "/dev/stdin" },
		{ "/proc/self/fd/1", "/dev/stdout" },
		{ "/proc/self/fd/2", "/dev/stderr" },
	};
	size_t i;

	for (i = 0; i < sizeof(links) / sizeof(links[0]); i++)
		if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
			init_log("symlink %s: %s", links[i][1], strerror(errno));
}

int init_write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	size_t n = strlen(text);
	ssize_t w;

	if (fd < 0)
		return -errno;
	w = write(fd, text, n);
	if (w < 0)
		w = -errno;
	close(fd);
	if (w < 0)
		return (int)w;
	return (size_t)w == n ? 0 : -EIO;
}

/* Root (this process) later writes task files and reads /output, both in
 * places the task could write to. With these, a task cannot hard-link a root
 * file (/etc/shadow) into /work for a FILE request to truncate and chown, nor
 * trap root with symlinks or FIFOs in /tmp. */
static void init_sysctls(void)
{
	static const char *const knobs[] = {
		"/proc/sys/fs/protected_hardlinks",
		"/proc/sys/fs/protected_symlinks",
		"/proc/sys/fs/protected_fifos",
		"/proc/sys/fs/protected_regular",
	};
	size_t i;
	int r;

	for (i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++) {
		r = init_write_file(knobs[i], "1");
		if (r < 0)
			init_log("%s: %s", knobs[i], strerror(-r));
	}
}

static int init_loopback(void)
{
	struct ifreq ifr;
	int fd, r = 0;

	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	memset(&ifr, 0, sizeof(ifr));
	strcpy(ifr.ifr_name, "lo");
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) {
		r = -errno;
		goto out;
	}
	/* The kernel gives lo 127.0.0.1/8 and ::1 by itself once it is up. */
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
		r = -errno;
out:
	close(fd);
	return r;
}

/* The sandbox's side of its network (only VMs of tasks with an egress policy
 * have a NIC; see docs/architecture.md, "Network egress"). Every sandbox sees
 * the same addresses: the host keeps each in its own network namespace, so
 * they never meet. The host's resolver for the sandbox listens on the gateway. */
#define INIT_NET_IF    "eth0"
#define INIT_NET_ADDR  "10.0.2.2"
#define INIT_NET_MASK  "255.255.255.252"
#define INIT_NET_GW    "10.0.2.1"

static void init_sin(struct sockaddr *sa, const char *ip)
{
	struct sockaddr_in *sin = (struct sockaddr_in *)sa;

	memset(sin, 0, sizeof(*sin));
	sin->sin_family = AF_INET;
	inet_pton(AF_INET, ip, &sin->sin_addr);
}

/* Configure eth0 when there is one. Returns 0 (also when there is no NIC) or
 * -errno. */
static int init_network(void)
{
	struct ifreq ifr;
	struct rtentry rt;
	int fd, r = 0, wfd;
	static const char resolv[] = "nameserver " INIT_NET_GW "\noptions timeout:2 attempts:2\n";

	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	memset(&ifr, 0, sizeof(ifr));
	strcpy(ifr.ifr_name, INIT_NET_IF);
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) {
		r = errno == ENODEV ? 0 : -errno; /* no NIC: a task without network */
		goto out;
	}
	init_sin(&ifr.ifr_addr, INIT_NET_ADDR);
	if (ioctl(fd, SIOCSIFADDR, &ifr) < 0)
		goto fail;
	init_sin(&ifr.ifr_netmask, INIT_NET_MASK);
	if (ioctl(fd, SIOCSIFNETMASK, &ifr) < 0)
		goto fail;
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
		goto fail;
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
		goto fail;
	memset(&rt, 0, sizeof(rt));
	init_sin(&rt.rt_dst, "0.0.0.0");
	init_sin(&rt.rt_genmask, "0.0.0.0");
	init_sin(&rt.rt_gateway, INIT_NET_GW);
	rt.rt_flags = RTF_UP | RTF_GATEWAY;
	if (ioctl(fd, SIOCADDRT, &rt) < 0 && errno != EEXIST)
		goto fail;
	wfd = open("/etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (wfd < 0 || write(wfd, resolv, sizeof(resolv) - 1) != (ssize_t)(sizeof(resolv) - 1))
		init_log("/etc/resolv.conf: %s", strerror(errno));
	if (wfd >= 0)
		close(wfd);
	goto out;
fail:
	r = -errno;
out:
	close(fd);
	return r;
}

void init_boot(void)
{
	int r;

	/* No fd may be opened before this: 0-2 are closed (see init_stdio). */
	init_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, NULL);
	init_stdio();
	init_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);

	init_wait_root();
	/* rw: the host gives every VM its own throw-away overlay of the image. */
	init_mount(INIT_ROOT_DEV, INIT_NEWROOT, "ext4", MS_NOATIME, NULL);
	init_switch_root();

	init_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	init_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	/* devtmpfs is one shared superblock: a second mount takes no options. */
	init_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID | MS_NOEXEC, NULL);
	/* gid 5 is Debian's tty group. */
	init_mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
		   "newinstance,ptmxmode=0666,mode=0620,gid=5");
	init_mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
	init_mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
	init_mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
	/* The task's code file (/kiln/code/main.*) lives in memory: creating the
	 * first file on the ext4 root costs ~40 ms of block-layer work under TCG
	 * right on the start-up path, tmpfs ~3 ms. The host never puts anything
	 * else under /kiln (the spec reserves it). */
	init_mount("tmpfs", "/kiln", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m");
	init_dev_links();
	init_sysctls();

	/* The rest is comfort for tasks, not a reason to lose the VM. */
	r = init_loopback();
	if (r < 0)
		init_log("bringing lo up: %s", strerror(-r));
	r = init_network();
	if (r < 0)
		init_log("configuring " INIT_NET_IF ": %s", strerror(-r));
	if (sethostname("kiln", 4) < 0)
		init_log("sethostname: %s", strerror(errno));
	/* The kernel never OOM-kills the global init anyway; this also keeps
	 * PID 1 out of the OOM killer's scoring. Task children reset it to 0. */
	r = init_write_file("/proc/self/oom_score_adj", "-1000");
	if (r < 0)
		init_log("oom_score_adj: %s", strerror(-r));
	/* A task that saturates the vCPU (a fork bomb: thousands of runnable
	 * processes) must not delay PID 1 reading KILL or forking the killer.
	 * Task children reset it to 0. */
	if (setpriority(PRIO_PROCESS, 0, INIT_NICE) < 0)
		init_log("setpriority: %s", strerror(errno));
}

/* Reads /sys/class/virtio-ports/<port>/name into out. The attribute only
 * exists once the host has sent the port's name. */
static int init_port_name(const char *port, char *out, size_t cap)
{
	char path[128];
	ssize_t n;
	int fd;

	if (snprintf(path, sizeof(path), INIT_PORTS "/%s/name", port) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, out, cap - 1);
	if (n < 0)
		n = -errno;
	close(fd);
	if (n < 0)
		return (int)n;
	out[n] = '\0';
	if (n > 0 && out[n - 1] == '\n')
		out[n - 1] = '\0';
	return 0;
}

int init_find_port(const char *name)
{
	char want[128], dev[300];
	struct dirent *de;
	DIR *d;
	int fd = -ENOENT;

	d = opendir(INIT_PORTS);
	if (!d)
		return errno == ENOENT ? -ENOENT : -errno;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (init_port_name(de->d_name, want, sizeof(want)) < 0 || strcmp(want, name))
			continue;
		snprintf(dev, sizeof(dev), "/dev/%s", de->d_name);
		fd = open(dev, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (fd < 0)
			fd = -errno; /* -ENOENT: devtmpfs has not caught up yet */
		break;
	}
	closedir(d);
	return fd;
}

int init_ports_named(void)
{
	char name[128];
	struct dirent *de;
	int ports = 0, named = 0;
	DIR *d;

	d = opendir(INIT_PORTS);
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		ports++;
		if (init_port_name(de->d_name, name, sizeof(name)) == 0 && name[0])
			named++;
	}
	closedir(d);
	return ports > 0 && named == ports;
}

int init_open_port(const char *name)
{
	int64_t deadline = init_deadline();
	int fd;

	for (;;) {
		fd = init_find_port(name);
		if (fd >= 0)
			return fd;
		if (fd != -ENOENT)
			init_die("opening port %s: %s", name, strerror(-fd));
		if (init_retry(deadline) < 0)
			init_die("no virtio port named %s after %d ms", name, INIT_WAIT_MS);
	}
}

int init_channel_signals(int chan)
{
	sigset_t mask;
	int flags, fd, err;

	sigemptyset(&mask);
	sigaddset(&mask, SIGCHLD);
	sigaddset(&mask, SIGIO);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
		return -1;
	signal(SIGPIPE, SIG_IGN);
	fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (fd < 0)
		return -1;
	flags = fcntl(chan, F_GETFL);
	if (flags < 0 || fcntl(chan, F_SETOWN, getpid()) < 0 ||
	    fcntl(chan, F_SETFL, flags | O_NONBLOCK | O_ASYNC) < 0) {
		err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

void init_child_signals(void)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	sigset_t none;
	int sig;

	/* sigaction() fails harmlessly for SIGKILL, SIGSTOP and glibc's
	 * internal signals. */
	for (sig = 1; sig < NSIG; sig++)
		sigaction(sig, &dfl, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}
