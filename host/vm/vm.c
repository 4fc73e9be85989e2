/* vm: start, talk to and destroy one QEMU microvm. QEMU runs in a jail
 * (jail/jail.h: namespaces, a read-only root with only what it needs, cgroups,
 * rlimits, an unprivileged slot uid), gets its agent and QMP channels as
 * inherited socketpair ends (no socket files to race on or leak), dies with
 * its owner (PR_SET_PDEATHSIG), and leaves a locked per-VM directory that
 * vm_reap_stale cleans when an owner was killed before it could. One file on
 * purpose: one QEMU process's whole life over one struct vm (jail and argv,
 * the agent and QMP channels with their deadlines, teardown, log tails). */
#include "vm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "fsutil.h"
#include "io.h"
#include "qmp.h"

#define VM_MAX_ARGS 96
#define QMP_BUF_SIZE (QMP_MAX_LINE + 1)

/* QEMU's descriptors: the agent, QMP and envd socketpair ends, then the
 * snapshot memfd, always at these numbers (the jail and exec_qemu move them
 * there). */
#define QEMU_FD_AGENT 3
#define QEMU_FD_QMP   4
#define QEMU_FD_ENVD  5
#define QEMU_FD_MEM   6
#define QEMU_NKEEP    5 /* agent, QMP, envd, memfd, tap: passed compacted from fd 3 on */
/* A NIC's tap fd follows the memfd when there is one. */
#define QEMU_FD_NET(cfg) ((cfg)->mem_fd > 0 ? QEMU_FD_MEM + 1 : QEMU_FD_MEM)
/* Every sandbox's NIC has this address; each lives alone in its own network. */
#define VM_NET_MAC    "52:54:00:6b:6c:02"
/* The serial of vm_config.disk2 (/sys/block/vdX/serial in the guest). */
#define VM_DISK2_SERIAL "kiln-out"

/* Jail limits. Memory: the cgroup holds guest RAM plus QEMU's own use: under
 * TCG mostly the translation buffer (tb-size=64 MiB, filled as the guest runs
 * new code), QEMU's heap, thread stacks and softmmu TLBs, kernel memory
 * (page tables, page-cache metadata: grows with RAM) and the page cache of
 * QEMU's disk I/O, which the cgroup reclaims down to what is dirty. Measured
 * with the guest using all its RAM while writing 600 MB to disk (cold boot,
 * the worst case): peak anonymous memory RAM + 86 MiB (1 vCPU, 256 MiB) and
 * RAM + 93 MiB (2 vCPUs, 512 MiB), kernel memory 15 and 29 MiB; RAM + 64 MiB
 * was OOM-killed, RAM + 128 MiB passed. Margin on top: see
 * docs/architecture.md, "The jail". */
#define VM_JAIL_MEM_OVERHEAD_MIB(ram_mib) (192 + (ram_mib) / 16)
/* Threads: main loop, RCU, one per vCPU, up to 64 block-layer thread-pool
 * workers under heavy disk I/O, migration; a failed thread creation aborts
 * QEMU, so the margin is generous. */
#define VM_JAIL_PIDS(vcpus) (128 + (vcpus))
#define VM_JAIL_NOFILE 256
/* QEMU's /proc/PID/oom_score_adj: should the host itself run short of memory
 * (the VMs' common cgroup budget normally OOM-kills inside itself first), a
 * sandbox is the kernel's victim, not kiln-host, kiln-api or S3. */
#define VM_OOM_SCORE_ADJ 800
/* The largest file QEMU writes: the disk overlay (at most the disk's size
 * plus qcow2 metadata) or a template's RAM file. */
#define VM_JAIL_FSIZE_SLACK (256ull << 20)

enum vm_accel vm_accel_resolve(enum vm_accel want, struct kiln_err *err)
{
	int hw = access("/sys/module/kvm_intel", F_OK) == 0 || access("/sys/module/kvm_amd", F_OK) == 0;
	int fd;

	if (want == VM_ACCEL_TCG)
		return VM_ACCEL_TCG;
	fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (fd >= 0)
		close(fd);
	if (hw && fd >= 0)
		return VM_ACCEL_KVM;
	if (want == VM_ACCEL_KVM) {
		kiln_err_set(err, KERR_KVM_UNAVAILABLE, "--accel kvm: %s",
			     fd < 0 ? "/dev/kvm cannot be opened"
				    : "no hardware KVM module (kvm_intel/kvm_amd) is loaded; /dev/kvm is a software "
				      "hypervisor that cannot boot the guest");
		return VM_ACCEL_AUTO;
	}
	return VM_ACCEL_TCG;
}

const char *vm_cpu_model(enum vm_accel a)
{
	return a == VM_ACCEL_KVM ? "host" : "qemu64,vendor=GenuineIntel";
}

/* The host's TSC rate in kHz, or 0 when it is unknown or not constant.
 * Under TCG the guest's TSC is the host's (QEMU answers rdtsc with the
 * host's counter), but the guest kernel, with no HPET or ACPI PM timer on a
 * microvm, can only calibrate it against the emulated PIT: on a loaded host
 * that fails ("Unable to calibrate against PIT"), the kernel marks the TSC
 * unstable and runs on refined-jiffies, so every clone of that snapshot had
 * a 10 ms clock and 10 ms timers (time.sleep(0.001) slept 10 ms; 2 of 6
 * snapshots built on the 2-core development machine). The rate, handed over
 * as tsc_early_khz=, takes that guess away. Measured once: the counter
 * against CLOCK_MONOTONIC_RAW over 50 ms, each end the closest of five
 * (clock, rdtsc, clock) readings. Only for an invariant TSC (CPUID
 * 0x80000007 EDX bit 8), whose rate does not follow the CPU's frequency. */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <x86intrin.h>

static void tsc_sample(int64_t *ns, uint64_t *tsc)
{
	int64_t best = INT64_MAX;

	for (int i = 0; i < 5; i++) {
		struct timespec a, b;
		int64_t an, bn;
		uint64_t t;

		clock_gettime(CLOCK_MONOTONIC_RAW, &a);
		t = __rdtsc();
		clock_gettime(CLOCK_MONOTONIC_RAW, &b);
		an = (int64_t)a.tv_sec * 1000000000 + a.tv_nsec;
		bn = (int64_t)b.tv_sec * 1000000000 + b.tv_nsec;

		if (bn - an < best) {
			best = bn - an;
			*ns = an + (bn - an) / 2;
			*tsc = t;
		}
	}
}

static unsigned tsc_khz_value;

static void tsc_measure(void)
{
	unsigned eax, ebx, ecx, edx;
	int64_t n0, n1;
	uint64_t t0, t1;
	double khz;

	if (!__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 8)))
		return;
	tsc_sample(&n0, &t0);
	nanosleep(&(struct timespec){ .tv_nsec = 50 * 1000000 }, NULL);
	tsc_sample(&n1, &t1);
	if (n1 <= n0 || t1 <= t0)
		return;
	khz = (double)(t1 - t0) * 1e6 / (double)(n1 - n0);
	if (khz >= 100e3 && khz <= 10e6) /* 100 MHz to 10 GHz: anything else is a bad reading */
		tsc_khz_value = (unsigned)(khz + 0.5);
}

unsigned vm_host_tsc_khz(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, tsc_measure);
	return tsc_khz_value;
}
#else
unsigned vm_host_tsc_khz(void)
{
	return 0;
}
#endif

const char *vm_accel_name(enum vm_accel a)
{
	return a == VM_ACCEL_KVM ? "kvm" : a == VM_ACCEL_TCG ? "tcg" : "auto";
}

int vm_jail_config(struct jail_config *jc, const char *qemu, enum vm_accel accel, struct kiln_err *err)
{
	/* Where Debian's (and upstream's) QEMU looks, relative to its binary:
	 * firmware in ../share/qemu (microvm's qboot), modules in
	 * ../lib/<triplet>/qemu (TCG itself is a module: accel-tcg-x86_64.so). */
	static const char *const moddirs[] = { "../lib/x86_64-linux-gnu/qemu", "../lib64/qemu", "../lib/qemu" };
	char real[PATH_MAX], bindir[PATH_MAX], path[PATH_MAX + 64];
	int found = 0;

	if (qemu[0] != '/')
		return kiln_err_set(err, KERR_USAGE, "--qemu: the jail needs an absolute path, got \"%s\"", qemu);
	if (jail_config_init(jc, err) < 0)
		return -1;
	if (!realpath(qemu, real))
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", qemu, strerror(errno));
	snprintf(bindir, sizeof(bindir), "%s", real);
	*strrchr(bindir, '/') = '\0';
	snprintf(path, sizeof(path), "%s/../share/qemu", bindir);
	if (access(path, R_OK) < 0)
		snprintf(path, sizeof(path), "/usr/share/qemu");
	if (jail_config_add_ro(jc, path, err) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(moddirs) / sizeof(moddirs[0]) && !found; i++) {
		snprintf(path, sizeof(path), "%s/%s", bindir, moddirs[i]);
		if (access(path, R_OK) < 0)
			continue;
		found = 1;
		/* The module directory goes first: the modules in it need no bind of their own. */
		if (jail_config_add_ro(jc, path, err) < 0)
			return -1;
		if (accel == VM_ACCEL_TCG) {
			snprintf(path + strlen(path), sizeof(path) - strlen(path), "/accel-tcg-x86_64.so");
			if (access(path, R_OK) == 0 && jail_config_add_program(jc, path, err) < 0)
				return -1;
		}
	}
	return jail_config_add_program(jc, qemu, err);
}

/* Start time of a process in clock ticks since boot (field 22 of stat), or 0. */
static unsigned long long proc_start_time(pid_t pid)
{
	unsigned long long start;

	return fs_proc_stat(pid, 22, 1, &start) == 0 ? start : 0;
}

static int make_vm_dir(const struct vm_config *cfg, struct vm *vm, struct kiln_err *err)
{
	static unsigned counter; /* atomically incremented: VMs start from several threads */
	char path[600];

	if (mkdir(cfg->run_dir, 0700) < 0 && errno != EEXIST)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create run directory %s: %s", cfg->run_dir, strerror(errno));
	for (int tries = 0; tries < 100; tries++) {
		snprintf(vm->dir, sizeof(vm->dir), "%s/vm-%d-%u", cfg->run_dir, (int)getpid(),
			 __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
		if (mkdir(vm->dir, 0700) == 0)
			break;
		if (errno != EEXIST)
			return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", vm->dir, strerror(errno));
		vm->dir[0] = '\0';
	}
	if (!vm->dir[0])
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create a VM directory in %s", cfg->run_dir);
	snprintf(path, sizeof(path), "%s/lock", vm->dir);
	vm->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (vm->lock_fd < 0 || flock(vm->lock_fd, LOCK_EX | LOCK_NB) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot lock %s: %s", path, strerror(errno));
	return 0;
}

/* Build QEMU's command line into argv (strings in store). */
static void build_argv(const struct vm_config *cfg, const struct vm *vm, char **argv, char store[][1024])
{
	int n = 0, s = 0;
	char thr[96] = ""; /* the disks' throttling options */
	char tsc[32] = "";  /* the TSC's rate for the guest kernel (TCG) */

#define ARG(...) (snprintf(store[s], 1024, __VA_ARGS__), argv[n++] = store[s++])
	ARG("%s", cfg->qemu);
	ARG("-M");
	/* No ACPI (virtio-mmio devices come from the kernel command line), an RTC so
	 * the kernel does not wait a second for its clock, no option ROMs. */
	ARG("microvm,acpi=off,rtc=on,x-option-roms=off,isa-serial=on%s",
	    cfg->mem_file || cfg->mem_fd > 0 || cfg->mem_ram ? ",memory-backend=mem" : "");
	ARG("-accel");
	if (cfg->accel == VM_ACCEL_KVM)
		ARG("kvm");
	else
		ARG("tcg,tb-size=%u", cfg->tb_mib ? cfg->tb_mib : VM_TB_MIB);
	ARG("-cpu");
	ARG("%s", vm_cpu_model(cfg->accel));
	ARG("-m");
	ARG("%u", cfg->memory_mib);
	ARG("-smp");
	ARG("%u", cfg->vcpus);
	if (cfg->mem_fd > 0) {
		/* A clone: the template's RAM in a sealed memfd, reached through
		 * /proc/self/fd (QEMU opens mem-path itself, read-write even for
		 * share=off: the seals, not permissions, keep the template intact). */
		ARG("-object");
		ARG("memory-backend-file,id=mem,size=%uM,mem-path=/proc/self/fd/%d,share=off", cfg->memory_mib,
		    QEMU_FD_MEM);
	} else if (cfg->mem_ram) {
		ARG("-object");
		ARG("memory-backend-ram,id=mem,size=%uM", cfg->memory_mib);
	} else if (cfg->mem_file) {
		ARG("-object");
		ARG("memory-backend-file,id=mem,size=%uM,mem-path=%s,share=%s", cfg->memory_mib, cfg->mem_file,
		    cfg->mem_share ? "on" : "off");
	}
	ARG("-nodefaults");
	ARG("-no-user-config");
	ARG("-nographic");
	ARG("-no-reboot");
	ARG("-kernel");
	ARG("%s", cfg->kernel);
	ARG("-initrd");
	ARG("%s", cfg->initrd);
	ARG("-append");
	if (cfg->accel != VM_ACCEL_KVM && vm_host_tsc_khz())
		snprintf(tsc, sizeof(tsc), " tsc_early_khz=%u", vm_host_tsc_khz());
	ARG("console=ttyS0 quiet loglevel=3 acpi=off reboot=t panic=-1 nolapic_timer pty.legacy_count=0 "
	    "random.trust_cpu=off%s", tsc);
	/* The guest's serial console goes into a ring inside QEMU: a hostile
	 * guest kernel writing ttyS0 at full speed overwrites its own oldest
	 * bytes, never fills the host's run directory, and never waits for a
	 * reader. vm_log_tail reads it over QMP; console_file keeps the whole
	 * console in vm/console.log for debugging. */
	/* The VM's directory in QEMU's command line: operators (and the
	 * tests' leak counts) find a VM's QEMU by it with ps/pgrep. */
	ARG("-name");
	ARG("guest=kiln:%s", vm->dir);
	if (cfg->console_file) {
		ARG("-serial");
		ARG("file:%s/vm/console.log", vm->dir);
	} else {
		ARG("-chardev");
		ARG("ringbuf,id=con,size=%u", VM_CONSOLE_RING);
		ARG("-serial");
		ARG("chardev:con");
	}
	ARG("-drive");
	/* The base image is never written: snapshot=on puts this VM's writes in a
	 * temporary overlay that QEMU deletes; a template writes its own overlay. */
	{
		/* QEMU's own throttling: applied to the guest's requests, before
		 * any cache, so it holds under cache=unsafe where a cgroup v1 blkio
		 * limit would not see buffered writes. */
		if (cfg->disk_bps)
			snprintf(thr, sizeof(thr), ",throttling.bps-total=%llu", (unsigned long long)cfg->disk_bps);
		if (cfg->disk_iops)
			snprintf(thr + strlen(thr), sizeof(thr) - strlen(thr), ",throttling.iops-total=%u", cfg->disk_iops);
		ARG("id=root,if=none,file=%s,format=%s,%s%s", cfg->disk, cfg->disk_format,
		    cfg->disk_writable ? "cache=unsafe" : "snapshot=on,cache=unsafe", thr);
	}
	ARG("-device");
	ARG("virtio-blk-device,drive=root");
	ARG("-device");
	/* Port 0 is the (unused) console's; 1 the agent's, 2 envd's. The
	 * device layout is part of every snapshot (snapshot_key's format). */
	ARG("virtio-serial-device,max_ports=3");
	ARG("-chardev");
	ARG("socket,id=agent,fd=%d", QEMU_FD_AGENT);
	ARG("-device");
	ARG("virtserialport,chardev=agent,name=kiln.agent");
	ARG("-chardev");
	ARG("socket,id=envd,fd=%d", QEMU_FD_ENVD);
	ARG("-device");
	ARG("virtserialport,chardev=envd,name=kiln.envd");
	ARG("-object");
	ARG("rng-random,id=rng,filename=/dev/urandom");
	ARG("-device");
	ARG("virtio-rng-device,rng=rng");
	if (cfg->net) {
		/* After every other device, so that VMs without a NIC keep the same
		 * virtio-mmio layout. A template has no network to join: a hub port
		 * with nothing behind it stands in, and its clones get the tap. */
		ARG("-netdev");
		if (cfg->net_fd > 0)
			ARG("tap,id=net0,fd=%d", QEMU_FD_NET(cfg));
		else
			ARG("hubport,id=net0,hubid=0");
		ARG("-device");
		ARG("virtio-net-device,netdev=net0,mac=" VM_NET_MAC);
	}
	if (cfg->disk2) {
		/* Last, so that the root disk stays vda and a NIC's place is the same. */
		ARG("-drive");
		ARG("id=out,if=none,file=%s,format=raw,cache=unsafe%s", cfg->disk2, thr);
		ARG("-device");
		ARG("virtio-blk-device,drive=out,serial=" VM_DISK2_SERIAL);
	}
	/* The volume slots, after every other device (disk2 included): a
	 * template build's VM keeps its vda/vdb, and the slots are the same
	 * in every VM, so every snapshot has them (snapshot_key's format).
	 * writeback, not unsafe: the guest's flush (sync) reaches the file. */
	for (unsigned i = 0; i < VM_VOL_SLOTS; i++) {
		char vp[600];

		vm_vol_path(vp, sizeof(vp), cfg->vol_dir, vm, i);
		ARG("-drive");
		ARG("id=vol%u,if=none,file=%s,format=raw,cache=writeback%s%s", i, vp, vm_vol_readonly(cfg) ? ",readonly=on" : "",
		    thr);
		ARG("-device");
		ARG("virtio-blk-device,drive=vol%u,serial=" VM_VOL_SERIAL "%u", i, i);
	}
	ARG("-chardev");
	ARG("socket,id=qmp,fd=%d", QEMU_FD_QMP);
	ARG("-mon");
	ARG("chardev=qmp,mode=control");
	if (cfg->incoming) {
		ARG("-incoming");
		ARG("defer");
	}
	ARG("-sandbox");
	ARG("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
	argv[n] = NULL;
#undef ARG
}

/* Child side of fork, unjailed (--no-jail): never returns. Only
 * async-signal-safe calls. */
static void exec_qemu(char **argv, const char *dir, const int keep[QEMU_NKEEP], int log_fd, pid_t parent)
{
	char tmpdir[600];
	int tmp[QEMU_NKEEP], n = 0;

	/* QEMU must not outlive kiln-host, whatever kills kiln-host. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127);
	setpgid(0, 0);
	io_child_reset(); /* kiln-host may block signals it reads from a signalfd: QEMU starts clean */
	if (log_fd >= 0) {
		dup2(log_fd, 1);
		dup2(log_fd, 2);
	}
	/* Only the channel fds (and a clone's memfd, a NIC's tap) cross into
	 * QEMU, compacted from fd 3 on: the numbers its command line names. */
	for (int i = 0; i < QEMU_NKEEP; i++)
		if (keep[i] > 0)
			tmp[n++] = fcntl(keep[i], F_DUPFD_CLOEXEC, 3 + QEMU_NKEEP);
	for (int i = 0; i < n; i++)
		dup2(tmp[i], 3 + i);
	syscall(SYS_close_range, 3 + n, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */);
	/* TMPDIR: where QEMU puts the snapshot=on overlay (inside the VM directory). */
	snprintf(tmpdir, sizeof(tmpdir), "%s/vm", dir);
	setenv("TMPDIR", tmpdir, 1);
	execv(argv[0], argv);
	_exit(127);
}

void vm_vol_path(char *out, size_t cap, const char *dir, const struct vm *vm, unsigned slot)
{
	if (dir)
		snprintf(out, cap, "%s/vol%u.img", dir, slot);
	else
		snprintf(out, cap, "%s/vol/vol%u.img", vm->dir, slot);
}

int vm_vol_readonly(const struct vm_config *cfg)
{
	/* A clone that is no session's (a task's, a warm pool VM) never mounts
	 * a volume: its slots are read-only drives, so a guest that writes
	 * them gets I/O errors and takes no disk of the host's. The guest
	 * negotiated its features on a writable drive when the template was
	 * made; read-only adds one it did not take, which a restore accepts. */
	return !cfg->vol_dir && cfg->incoming && !cfg->disk_writable;
}

/* The VM's empty volume slots (sparse files of VM_VOL_SLOT_BYTES). */
static int make_vol_slots(const struct vm_config *cfg, const struct vm *vm, struct kiln_err *err)
{
	char path[600];

	if (!cfg->vol_dir) {
		snprintf(path, sizeof(path), "%s/vol", vm->dir);
		if (mkdir(path, 0700) < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", path, strerror(errno));
	}
	for (unsigned i = 0; i < VM_VOL_SLOTS; i++) {
		int fd;

		vm_vol_path(path, sizeof(path), cfg->vol_dir, vm, i);
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
		/* A read-only slot is bound as is (not given to the jail's uid):
		 * readable by all, and empty. */
		if (fd < 0 || ftruncate(fd, (off_t)VM_VOL_SLOT_BYTES) < 0 ||
		    (vm_vol_readonly(cfg) && fchmod(fd, 0644) < 0)) {
			kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", path, strerror(errno));
			if (fd >= 0)
				close(fd);
			return -1;
		}
		close(fd);
	}
	return 0;
}

/* Size of the file at path (0 when it cannot be read). */
static uint64_t file_size(const char *path)
{
	struct stat st;

	return path && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Start QEMU in its jail: the VM directory's root/ is the jail's root mount
 * point, vm/ its writable directory; everything QEMU reads is bound read-only
 * at its host path, so the command line is the same as unjailed. */
static int spawn_jailed(const struct vm_config *cfg, struct vm *vm, char **argv, const int keep[QEMU_NKEEP], int log_fd,
			struct kiln_err *err)
{
	struct jail_spec spec = { .proc = 1, .stdout_fd = log_fd, .stderr_fd = log_fd };
	char root[600], work[600], record[600], tmpdir[620], vps[VM_VOL_SLOTS][600];
	char *envp[] = { tmpdir, NULL };
	uint64_t fsize = file_size(cfg->disk),
		 back = file_size(cfg->disk_backing) > file_size(cfg->disk_backing2) ? file_size(cfg->disk_backing)
										     : file_size(cfg->disk_backing2),
		 mem = (uint64_t)cfg->memory_mib << 20;
	int nro = 0, nrw = 0;
	struct stat kvm;

	snprintf(root, sizeof(root), "%s/root", vm->dir);
	snprintf(work, sizeof(work), "%s/vm", vm->dir);
	snprintf(record, sizeof(record), "%s/jail", vm->dir);
	snprintf(tmpdir, sizeof(tmpdir), "TMPDIR=%s", work);
	if (mkdir(root, 0755) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", root, strerror(errno));
	spec.name = strrchr(vm->dir, '/') + 1;
	spec.root = root;
	spec.work = work;
	spec.exe = cfg->qemu;
	spec.record = record;
	spec.envp = envp;
	spec.ro[nro++] = cfg->kernel;
	spec.ro[nro++] = cfg->initrd;
	if (cfg->disk_backing)
		spec.ro[nro++] = cfg->disk_backing;
	if (cfg->disk_backing2)
		spec.ro[nro++] = cfg->disk_backing2;
	if (cfg->disk_writable)
		spec.rw[nrw++] = cfg->disk;
	else
		spec.ro[nro++] = cfg->disk;
	if (cfg->disk2) {
		spec.rw[nrw++] = cfg->disk2;
		if (file_size(cfg->disk2) > fsize)
			fsize = file_size(cfg->disk2);
	}
	for (unsigned i = 0; i < VM_VOL_SLOTS; i++) {
		vm_vol_path(vps[i], sizeof(vps[i]), cfg->vol_dir, vm, i);
		if (vm_vol_readonly(cfg))
			spec.ro[nro++] = vps[i];
		else
			spec.rw[nrw++] = vps[i];
	}
	/* A guest may write anywhere in a writable volume slot (a session's
	 * sampler stops one that writes past its volume: session_envd.c). */
	if (!vm_vol_readonly(cfg) && VM_VOL_SLOT_BYTES > fsize)
		fsize = VM_VOL_SLOT_BYTES;
	if (cfg->mem_file && cfg->mem_fd <= 0) {
		/* A template writes its RAM file: it must exist to be bound. */
		int fd = open(cfg->mem_file, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);

		if (fd < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", cfg->mem_file, strerror(errno));
		close(fd);
		spec.rw[nrw++] = cfg->mem_file;
	}
	spec.dev[0] = "/dev/urandom";
	if (cfg->accel == VM_ACCEL_KVM) {
		spec.dev[1] = "/dev/kvm";
		/* The slot uid reaches /dev/kvm through its group, when it is not world-writable. */
		if (stat("/dev/kvm", &kvm) == 0 && (kvm.st_mode & 0006) != 0006)
			spec.extra_gid = kvm.st_gid;
	}
	for (int i = 0; i < QEMU_NKEEP; i++)
		if (keep[i] > 0)
			spec.keep_fds[spec.nkeep++] = keep[i];
	spec.memory_bytes = ((uint64_t)cfg->memory_mib + VM_JAIL_MEM_OVERHEAD_MIB(cfg->memory_mib)) << 20;
	spec.cpus = cfg->vcpus;
	spec.pids = VM_JAIL_PIDS(cfg->vcpus);
	spec.oom_score_adj = VM_OOM_SCORE_ADJ;
	spec.nofile = VM_JAIL_NOFILE;
	if (back > fsize)
		fsize = back;
	if (cfg->mem_file && cfg->mem_fd <= 0 && mem > fsize)
		fsize = mem;
	spec.fsize_bytes = fsize + VM_JAIL_FSIZE_SLACK;
	vm->pid = jail_spawn(cfg->jail, &spec, argv, &vm->jail, &vm->pidfd, err);
	return vm->pid < 0 ? -1 : 0;
}

static int qmp_read_msg(struct vm *vm, struct qmp_msg *m, int64_t deadline_ms, struct kiln_err *err);

/* path made absolute into buf (the jail shows files at their absolute host
 * paths, and QEMU's working directory there is /). */
static const char *absolute(const char *path, char *buf, size_t cap)
{
	char cwd[PATH_MAX];

	if (!path || path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
		return path;
	snprintf(buf, cap, "%s/%s", cwd, path);
	return buf;
}

int vm_start(const struct vm_config *cfg_in, struct vm *vm, struct kiln_err *err)
{
	char *argv[VM_MAX_ARGS + 1];
	char (*store)[1024] = NULL;
	int agent[2] = { -1, -1 }, qmp[2] = { -1, -1 }, envd[2] = { -1, -1 }, log_fd = -1;
	struct qmp_msg m;
	pid_t parent = getpid();
	char path[600], abs[8][PATH_MAX];
	struct vm_config abs_cfg = *cfg_in, *cfg = &abs_cfg;
	FILE *f;

	abs_cfg.kernel = absolute(cfg_in->kernel, abs[0], sizeof(abs[0]));
	abs_cfg.initrd = absolute(cfg_in->initrd, abs[1], sizeof(abs[1]));
	abs_cfg.disk = absolute(cfg_in->disk, abs[2], sizeof(abs[2]));
	abs_cfg.disk_backing = absolute(cfg_in->disk_backing, abs[3], sizeof(abs[3]));
	abs_cfg.disk_backing2 = absolute(cfg_in->disk_backing2, abs[5], sizeof(abs[5]));
	abs_cfg.mem_file = absolute(cfg_in->mem_file, abs[4], sizeof(abs[4]));
	abs_cfg.disk2 = absolute(cfg_in->disk2, abs[6], sizeof(abs[6]));
	abs_cfg.vol_dir = absolute(cfg_in->vol_dir, abs[7], sizeof(abs[7]));
	memset(vm, 0, sizeof(*vm));
	vm->pidfd = vm->agent_fd = vm->qmp_fd = vm->envd_fd = vm->lock_fd = -1;
	vm->jail.slot_fd = -1;
	vm->pid = -1;
	vm->cancel_fd = cfg->cancel_fd > 0 ? cfg->cancel_fd : -1;
	vm->input_fd = -1;
	if (make_vm_dir(cfg, vm, err) < 0)
		goto fail;
	vm->rbuf = malloc(PROTO_MAX_FRAME);
	vm->qbuf = malloc(QMP_BUF_SIZE);
	if (!vm->rbuf || !vm->qbuf) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto fail;
	}
	/* QEMU's own directory: its logs, console and disk overlay. */
	snprintf(path, sizeof(path), "%s/vm", vm->dir);
	if (mkdir(path, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", path, strerror(errno));
		goto fail;
	}
	snprintf(path, sizeof(path), "%s/vm/qemu.log", vm->dir);
	log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (log_fd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", path, strerror(errno));
		goto fail;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, agent) < 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qmp) < 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, envd) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "socketpair: %s", strerror(errno));
		goto fail;
	}
	store = malloc(sizeof(*store) * VM_MAX_ARGS);
	if (!store) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto fail;
	}
	if (make_vol_slots(cfg, vm, err) < 0)
		goto fail;
	build_argv(cfg, vm, argv, store);
	vm->t_spawn_us = proto_now_us();
	{
		const int keep[QEMU_NKEEP] = { agent[1], qmp[1], envd[1], cfg->mem_fd > 0 ? cfg->mem_fd : -1,
					       cfg->net && cfg->net_fd > 0 ? cfg->net_fd : -1 };

		if (cfg->jail) {
			if (spawn_jailed(cfg, vm, argv, keep, log_fd, err) < 0)
				goto fail;
			/* The log belongs to the uid that writes it. */
			if (fchown(log_fd, vm->jail.uid, vm->jail.gid) < 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "chown %s/vm/qemu.log: %s", vm->dir, strerror(errno));
				goto fail;
			}
		} else {
			vm->pid = fork();
			if (vm->pid < 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "fork: %s", strerror(errno));
				goto fail;
			}
			if (vm->pid == 0)
				exec_qemu(argv, vm->dir, keep, log_fd, parent);
			vm->pidfd = (int)syscall(SYS_pidfd_open, vm->pid, 0);
			if (vm->pidfd < 0) {
				kiln_err_set(err, KERR_HOST_ERROR, "pidfd_open: %s", strerror(errno));
				goto fail;
			}
		}
	}
	free(store);
	store = NULL;
	close(log_fd);
	log_fd = -1;
	close(agent[1]);
	close(qmp[1]);
	close(envd[1]);
	agent[1] = qmp[1] = envd[1] = -1;
	vm->agent_fd = agent[0];
	vm->qmp_fd = qmp[0];
	vm->envd_fd = envd[0];
	fcntl(vm->agent_fd, F_SETFL, O_NONBLOCK);
	fcntl(vm->qmp_fd, F_SETFL, O_NONBLOCK);
	/* Record who runs in this directory, for vm_reap_stale after a crash. */
	snprintf(path, sizeof(path), "%s/qemu.pid", vm->dir);
	f = fopen(path, "we");
	if (f) {
		fprintf(f, "%d %llu\n", (int)vm->pid, proc_start_time(vm->pid));
		fclose(f);
	}
	/* QMP: greeting, then capabilities negotiation. */
	if (qmp_read_msg(vm, &m, proto_now_ms() + 10000, err) < 0)
		goto fail;
	if (m.kind != QMP_GREETING) {
		qmp_msg_free(&m);
		kiln_err_set(err, KERR_VM_ERROR, "QEMU did not send a QMP greeting");
		goto fail;
	}
	qmp_msg_free(&m);
	if (vm_qmp(vm, "{\"execute\":\"qmp_capabilities\"}", proto_now_ms() + 10000, NULL, err) < 0)
		goto fail;
	return 0;
fail:
	free(store);
	if (log_fd >= 0)
		close(log_fd);
	if (agent[1] >= 0)
		close(agent[1]);
	if (qmp[1] >= 0)
		close(qmp[1]);
	if (agent[0] >= 0 && vm->agent_fd < 0)
		close(agent[0]);
	if (qmp[0] >= 0 && vm->qmp_fd < 0)
		close(qmp[0]);
	if (envd[1] >= 0)
		close(envd[1]);
	if (envd[0] >= 0 && vm->envd_fd < 0)
		close(envd[0]);
	return -1;
}

/* Wait until fd is readable or QEMU exits or the deadline passes (or, for
 * the agent channel, vm->input_fd is readable).
 * Returns 1 readable, 0 QEMU exited, -ETIMEDOUT, -EAGAIN (input), or -errno. */
static int wait_readable(struct vm *vm, int fd, int64_t deadline_ms)
{
	for (;;) {
		struct pollfd p[4] = { { .fd = fd, .events = POLLIN }, { .fd = vm->pidfd, .events = POLLIN },
				       { .fd = vm->cancel_fd, .events = POLLIN },
				       { .fd = fd == vm->agent_fd && vm->input_fd > 0 ? vm->input_fd : -1,
					 .events = POLLIN } };
		int64_t left = deadline_ms - proto_now_ms();
		int r;

		if (left <= 0)
			return -ETIMEDOUT;
		/* A negative fd is ignored by poll: cancel_fd -1 means "not cancellable". */
		r = poll(p, 4, left > 60000 ? 60000 : (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		/* Data first: QEMU may have written its last bytes and then exited. */
		if (p[0].revents & (POLLIN | POLLHUP | POLLERR))
			return 1;
		if (p[1].revents)
			return 0;
		if (p[2].revents)
			return -ECANCELED;
		if (p[3].revents)
			return -EAGAIN;
	}
}

static int vm_gone(struct vm *vm, struct kiln_err *err, const char *when)
{
	char tail[1024];
	int status = 0;

	if (vm->pid > 0 && waitpid(vm->pid, &status, WNOHANG) == vm->pid)
		vm->pid = -1;
	/* Killed by the kernel's OOM killer in its cgroup: the VMs' common
	 * memory budget ran out (or QEMU outgrew its own limit). Not the
	 * guest's own OOM, which kills a process inside and leaves the VM up. */
	if (vm->jail.active && jail_oom_kills(&vm->jail) > 0)
		return kiln_err_set(err, KERR_HOST_MEMORY,
				    "the host ran out of memory for its sandboxes: the kernel stopped this "
				    "sandbox's VM to protect the host and the other sandboxes (retry later, or "
				    "use less memory)");
	vm_log_tail(vm, tail, sizeof(tail));
	return kiln_err_set(err, KERR_VM_ERROR, "QEMU exited %s (%s %d)%s%s", when,
			    WIFSIGNALED(status) ? "signal" : "status",
			    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
			    tail[0] ? ": " : "", tail);
}

/* The kiln error for wait_readable's answer n (0 or negative): a timeout
 * while waiting for `peer`, a stop request, waiting input, QEMU gone (`when`
 * says during what) or poll's own failure. Returns -1. */
static int wait_err(struct vm *vm, int n, const char *peer, const char *when, struct kiln_err *err)
{
	if (n == -ETIMEDOUT)
		return kiln_err_set(err, KERR_TIMEOUT, "timed out waiting for %s", peer);
	if (n == -ECANCELED)
		return kiln_err_set(err, KERR_INTERRUPTED, "kiln-host was asked to stop");
	if (n == -EAGAIN)
		return kiln_err_set(err, KERR_INPUT, "input for the guest is waiting");
	if (n == 0)
		return vm_gone(vm, err, when);
	return kiln_err_set(err, KERR_HOST_ERROR, "poll: %s", strerror(-n));
}

/* One frame from the agent channel, whatever its type. */
static int recv_frame(struct vm *vm, struct proto_frame *f, int64_t deadline_ms, struct kiln_err *err)
{
	for (;;) {
		ssize_t n;

		/* Drop the frame handed out last time. */
		if (vm->rskip) {
			memmove(vm->rbuf, vm->rbuf + vm->rskip, vm->rlen - vm->rskip);
			vm->rlen -= vm->rskip;
			vm->rskip = 0;
		}
		n = proto_frame_parse(vm->rbuf, vm->rlen, f);
		if (n < 0)
			return kiln_err_set(err, KERR_VM_ERROR, "guest sent a malformed frame (protocol violation)");
		if (n > 0) {
			vm->rskip = (size_t)n;
			return 0;
		}
		n = wait_readable(vm, vm->agent_fd, deadline_ms);
		if (n <= 0)
			return wait_err(vm, (int)n, "the guest", "while the guest was running", err);
		n = read(vm->agent_fd, vm->rbuf + vm->rlen, PROTO_MAX_FRAME - vm->rlen);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n < 0)
			return kiln_err_set(err, KERR_VM_ERROR, "agent channel: %s", strerror(errno));
		if (n == 0)
			return vm_gone(vm, err, "(agent channel closed)");
		vm->rlen += (size_t)n;
	}
}

int vm_recv(struct vm *vm, struct proto_frame *f, int64_t deadline_ms, struct kiln_err *err)
{
	/* A PROCS that comes late (its vm_procs timed out and gave up) is
	 * nobody's answer: dropped, so the next request's reader is not
	 * thrown off by it. */
	for (;;) {
		if (recv_frame(vm, f, deadline_ms, err) < 0)
			return -1;
		if (f->type != PROTO_PROCS)
			return 0;
	}
}

int vm_send(struct vm *vm, uint8_t type, const void *payload, size_t len, int64_t deadline_ms,
	    struct kiln_err *err)
{
	int r = proto_send(vm->agent_fd, type, payload, len, deadline_ms);

	if (r == -ETIMEDOUT)
		return kiln_err_set(err, KERR_TIMEOUT, "timed out sending to the guest");
	if (r < 0)
		return kiln_err_set(err, KERR_VM_ERROR, "agent channel: %s", strerror(-r));
	return 0;
}

/* Read one QMP line into m. */
static int qmp_read_msg(struct vm *vm, struct qmp_msg *m, int64_t deadline_ms, struct kiln_err *err)
{
	for (;;) {
		char *nl = memchr(vm->qbuf, '\n', vm->qlen);
		ssize_t n;

		if (nl) {
			size_t len = (size_t)(nl - vm->qbuf);
			int r = qmp_parse(vm->qbuf, len, m);

			memmove(vm->qbuf, nl + 1, vm->qlen - len - 1);
			vm->qlen -= len + 1;
			if (r < 0)
				return kiln_err_set(err, KERR_VM_ERROR, "malformed QMP message from QEMU");
			return 0;
		}
		if (vm->qlen >= QMP_MAX_LINE)
			return kiln_err_set(err, KERR_VM_ERROR, "QMP message longer than %d bytes", QMP_MAX_LINE);
		n = wait_readable(vm, vm->qmp_fd, deadline_ms);
		if (n <= 0)
			return wait_err(vm, (int)n, "QMP", "during a QMP exchange", err);
		n = read(vm->qmp_fd, vm->qbuf + vm->qlen, QMP_MAX_LINE - vm->qlen);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0)
			return vm_gone(vm, err, "(QMP channel closed)");
		vm->qlen += (size_t)n;
	}
}

/* Wait for the answer to cmd, just sent: its "return" member into *ret (a
 * new reference; ret may be NULL), or err from its "error". Events and
 * stray greetings in between are skipped; a MIGRATION status is kept for
 * whoever waits for the migration's end. Returns 0 or -1 with err set. */
static int qmp_answer(struct vm *vm, const char *cmd, int64_t deadline_ms, json_t **ret, struct kiln_err *err)
{
	struct qmp_msg m;

	for (;;) {
		if (qmp_read_msg(vm, &m, deadline_ms, err) < 0)
			return -1;
		if (m.kind == QMP_RETURN) {
			if (ret)
				*ret = json_incref(m.ret);
			qmp_msg_free(&m);
			return 0;
		}
		if (m.kind == QMP_ERROR) {
			kiln_err_set(err, KERR_VM_ERROR, "QMP %s: %s: %s", cmd, m.errclass, m.errdesc);
			qmp_msg_free(&m);
			return -1;
		}
		if (m.kind == QMP_EVENT && !strcmp(m.event, "MIGRATION"))
			snprintf(vm->migration, sizeof(vm->migration), "%s",
				 json_string_value(json_object_get(json_object_get(m.root, "data"), "status")) ?: "");
		qmp_msg_free(&m);
	}
}

int vm_qmp(struct vm *vm, const char *cmd, int64_t deadline_ms, json_t **ret, struct kiln_err *err)
{
	size_t len = strlen(cmd);
	int r;

	if (ret)
		*ret = NULL;
	r = proto_write_all(vm->qmp_fd, cmd, len, deadline_ms);
	if (r == 0)
		r = proto_write_all(vm->qmp_fd, "\n", 1, deadline_ms);
	if (r < 0)
		return kiln_err_set(err, KERR_VM_ERROR, "QMP send: %s", strerror(-r));
	return qmp_answer(vm, cmd, deadline_ms, ret, err);
}

void vm_qmp_migration_reset(struct vm *vm)
{
	vm->migration[0] = '\0';
}

int vm_qmp_wait_event(struct vm *vm, const char *event, int64_t deadline_ms, json_t **data, struct kiln_err *err)
{
	struct qmp_msg m;

	if (data)
		*data = NULL;
	for (;;) {
		if (qmp_read_msg(vm, &m, deadline_ms, err) < 0)
			return -1;
		if (m.kind == QMP_EVENT && !strcmp(m.event, event)) {
			if (data)
				*data = json_incref(json_object_get(m.root, "data"));
			qmp_msg_free(&m);
			return 0;
		}
		qmp_msg_free(&m);
	}
}

int vm_qmp_fd(struct vm *vm, const char *cmd, int fd, int64_t deadline_ms, json_t **ret, struct kiln_err *err)
{
	char line[512];
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
			      .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *c;
	int n = snprintf(line, sizeof(line), "%s\n", cmd);

	if (ret)
		*ret = NULL;
	if (n < 0 || (size_t)n >= sizeof(line))
		return kiln_err_set(err, KERR_HOST_ERROR, "QMP command too long");
	iov.iov_base = line;
	iov.iov_len = (size_t)n;
	memset(ctl.buf, 0, sizeof(ctl.buf));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	/* The whole command goes in one sendmsg so the fd arrives with it. */
	for (;;) {
		ssize_t w = sendmsg(vm->qmp_fd, &msg, MSG_NOSIGNAL);

		if (w == n)
			break;
		if (w < 0 && (errno == EINTR || errno == EAGAIN)) {
			struct pollfd p = { .fd = vm->qmp_fd, .events = POLLOUT };

			if (proto_now_ms() >= deadline_ms)
				return kiln_err_set(err, KERR_TIMEOUT, "timed out sending %s", cmd);
			poll(&p, 1, 100);
			continue;
		}
		return kiln_err_set(err, KERR_VM_ERROR, "QMP %s: %s", cmd, w < 0 ? strerror(errno) : "short write");
	}
	return qmp_answer(vm, cmd, deadline_ms, ret, err);
}

int vm_qmp_getfd(struct vm *vm, const char *name, int fd, int64_t deadline_ms, struct kiln_err *err)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"%s\"}}", name);
	return vm_qmp_fd(vm, cmd, fd, deadline_ms, NULL, err);
}

int vm_setup_send(struct vm *vm, int64_t deadline_ms, struct kiln_err *err)
{
	struct proto_setup s = { .entropy_len = 64 };
	struct timespec now;
	uint8_t buf[512];
	ssize_t n;

	if (getrandom(s.entropy, s.entropy_len, 0) != (ssize_t)s.entropy_len)
		return kiln_err_set(err, KERR_HOST_ERROR, "getrandom: %s", strerror(errno));
	clock_gettime(CLOCK_REALTIME, &now);
	s.sec = (uint64_t)now.tv_sec;
	s.nsec = (uint32_t)now.tv_nsec;
	n = proto_setup_encode(buf, sizeof(buf), &s);
	if (n < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "SETUP does not encode");
	return vm_send(vm, PROTO_SETUP, buf, (size_t)n, deadline_ms, err);
}

int vm_frame_err(const struct proto_frame *f, const char *what, struct kiln_err *err)
{
	if (f->type == PROTO_ERROR) {
		struct proto_error e;

		if (proto_error_decode(f->payload, f->len, &e) == 0)
			return kiln_err_set(err, KERR_GUEST_ERROR, "%s: %s", what, e.message);
	}
	return kiln_err_set(err, KERR_VM_ERROR, "%s: unexpected frame type 0x%02x from the guest", what, f->type);
}

int vm_recv_ok(struct vm *vm, uint8_t want, int64_t deadline_ms, const char *what, struct kiln_err *err)
{
	struct proto_frame f;

	if (vm_recv(vm, &f, deadline_ms, err) < 0)
		return -1;
	if (f.type == PROTO_OK && f.len == 1 && f.payload[0] == want)
		return 0;
	return vm_frame_err(&f, what, err);
}

int vm_setup_recv(struct vm *vm, int64_t deadline_ms, struct kiln_err *err)
{
	return vm_recv_ok(vm, PROTO_SETUP, deadline_ms, "setup", err);
}

int vm_setup(struct vm *vm, int64_t deadline_ms, struct kiln_err *err)
{
	return vm_setup_send(vm, deadline_ms, err) < 0 ? -1 : vm_setup_recv(vm, deadline_ms, err);
}

int vm_procs(struct vm *vm, int64_t deadline_ms, uint32_t *count, uint32_t *pid, struct kiln_err *err)
{
	struct proto_frame f;

	if (vm_send(vm, PROTO_PROCS_QUERY, NULL, 0, deadline_ms, err) < 0 || recv_frame(vm, &f, deadline_ms, err) < 0)
		return -1;
	if (f.type == PROTO_PROCS && proto_procs_decode(f.payload, f.len, count, pid) == 0)
		return 0;
	return vm_frame_err(&f, "procs", err);
}

int vm_set_nice(const struct vm *vm, int nice)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	int r = 0;

	if (vm->pid <= 0)
		return -ESRCH;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)vm->pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		char *end;
		long tid = strtol(e->d_name, &end, 10);

		if (e->d_name[0] == '.' || *end || tid <= 0)
			continue;
		/* A thread that has just ended is no failure. */
		if (setpriority(PRIO_PROCESS, (id_t)tid, nice) < 0 && errno != ESRCH && !r)
			r = -errno;
	}
	closedir(d);
	if (vm->jail.active) {
		int w = jail_set_cpu_shares(&vm->jail, nice > 0 ? 15 : 1024);

		if (w < 0 && w != -ENOENT && !r)
			r = w;
	}
	return r;
}

void vm_destroy(struct vm *vm)
{
	if (vm->pid > 0) {
		kill(vm->pid, SIGKILL);
		while (waitpid(vm->pid, NULL, 0) < 0 && errno == EINTR)
			;
		vm->pid = -1;
	}
	/* QEMU was its jail's init: with it reaped, the jail's namespaces and
	 * mounts are gone; what is left are its cgroups and slot. */
	jail_release(&vm->jail);
	if (vm->pidfd >= 0)
		close(vm->pidfd);
	if (vm->agent_fd >= 0)
		close(vm->agent_fd);
	if (vm->qmp_fd >= 0)
		close(vm->qmp_fd);
	/* fd 0 is never a socketpair end: a zeroed vm owns no envd fd. */
	if (vm->envd_fd > 0)
		close(vm->envd_fd);
	vm->pidfd = vm->agent_fd = vm->qmp_fd = vm->envd_fd = -1;
	if (vm->dir[0]) {
		char *slash = strrchr(vm->dir, '/');

		if (slash) {
			*slash = '\0';
			int dfd = open(vm->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

			*slash = '/';
			if (dfd >= 0) {
				fs_rmtree_at(dfd, slash + 1);
				close(dfd);
			}
		}
		vm->dir[0] = '\0';
	}
	/* The lock goes last: until the directory is gone, nobody may reap it. */
	if (vm->lock_fd >= 0)
		close(vm->lock_fd);
	vm->lock_fd = -1;
	free(vm->rbuf);
	free(vm->qbuf);
	vm->rbuf = NULL;
	vm->qbuf = NULL;
	vm->rlen = vm->rskip = vm->qlen = 0;
}

static void tail_file(const char *path, char *out, size_t cap)
{
	/* QEMU's directory belongs to its (untrusted) uid: no symbolic link, no
	 * FIFO to block on, only a regular file it wrote. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;
	off_t size;
	ssize_t n;
	size_t want = cap - 1;

	out[0] = '\0';
	if (fd < 0)
		return;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return;
	}
	size = lseek(fd, 0, SEEK_END);
	if (size > (off_t)want)
		lseek(fd, size - (off_t)want, SEEK_SET);
	else
		lseek(fd, 0, SEEK_SET);
	n = read(fd, out, want);
	close(fd);
	if (n < 0)
		n = 0;
	out[n] = '\0';
	/* Keep it one line and printable: it ends up inside a JSON message. */
	for (ssize_t i = 0; i < n; i++)
		if ((unsigned char)out[i] < 0x20 || (unsigned char)out[i] >= 0x7f)
			out[i] = out[i] == '\n' ? '|' : ' ';
}

/* The last bytes of the console ring (QEMU still running), made one
 * printable line as tail_file does. The ring is read in pieces: a QMP reply
 * is bounded (JSON may escape a byte into six), and reading empties it. */
#define RING_PIECE 8192u
static void tail_ring(struct vm *vm, char *out, size_t cap)
{
	char cmd[128];
	struct kiln_err err = { .code = "" };
	size_t have = 0, want = cap - 1;

	out[0] = '\0';
	if (vm->qmp_fd < 0)
		return;
	snprintf(cmd, sizeof(cmd),
		 "{\"execute\":\"ringbuf-read\",\"arguments\":{\"device\":\"con\",\"size\":%u,\"format\":\"utf8\"}}",
		 RING_PIECE);
	for (unsigned i = 0; i <= VM_CONSOLE_RING / RING_PIECE; i++) {
		json_t *ret = NULL;
		const char *s;
		size_t n;

		if (vm_qmp(vm, cmd, proto_now_ms() + 1000, &ret, &err) < 0 || !(s = json_string_value(ret)) || !*s) {
			json_decref(ret);
			break;
		}
		/* Keep the newest want bytes of what has been read so far. */
		n = strlen(s);
		if (n >= want) {
			memcpy(out, s + n - want, want);
			have = want;
		} else {
			size_t keep = have + n > want ? want - n : have;

			memmove(out, out + have - keep, keep);
			memcpy(out + keep, s, n);
			have = keep + n;
		}
		json_decref(ret);
	}
	out[have] = '\0';
	for (size_t i = 0; i < have; i++)
		if ((unsigned char)out[i] < 0x20 || (unsigned char)out[i] >= 0x7f)
			out[i] = out[i] == '\n' ? '|' : ' ';
}

void vm_log_tail(struct vm *vm, char *out, size_t cap)
{
	char path[600], con[512], qlog[512];

	out[0] = '\0';
	if (!vm->dir[0] || cap < 2)
		return;
	snprintf(path, sizeof(path), "%s/vm/console.log", vm->dir);
	tail_file(path, con, sizeof(con));
	if (!con[0])
		tail_ring(vm, con, sizeof(con));
	snprintf(path, sizeof(path), "%s/vm/qemu.log", vm->dir);
	tail_file(path, qlog, sizeof(qlog));
	snprintf(out, cap, "%s%s%s%s%s", qlog[0] ? "qemu: " : "", qlog, qlog[0] && con[0] ? "; " : "",
		 con[0] ? "console: " : "", con);
}

int vm_reap_stale(const char *run_dir)
{
	DIR *d = opendir(run_dir);
	struct dirent *e;
	int reaped = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char path[1024];
		int lock, pid = 0;
		unsigned long long start = 0;
		FILE *f;

		if (strncmp(e->d_name, "vm-", 3))
			continue;
		snprintf(path, sizeof(path), "%s/%s/lock", run_dir, e->d_name);
		lock = open(path, O_RDWR | O_CLOEXEC);
		if (lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) < 0) {
			close(lock); /* its owner is alive */
			continue;
		}
		snprintf(path, sizeof(path), "%s/%s/qemu.pid", run_dir, e->d_name);
		f = fopen(path, "re");
		if (f) {
			if (fscanf(f, "%d %llu", &pid, &start) != 2)
				pid = 0;
			fclose(f);
		}
		/* Only kill the process we started: same pid and same start time. */
		if (pid > 0 && start && proc_start_time(pid) == start) {
			int pfd = (int)syscall(SYS_pidfd_open, pid, 0);

			if (pfd >= 0 && proc_start_time(pid) == start) {
				struct pollfd p = { .fd = pfd, .events = POLLIN };

				syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
				poll(&p, 1, 5000);
			}
			if (pfd >= 0)
				close(pfd);
		}
		/* Its cgroups (anything still in them is killed first). */
		snprintf(path, sizeof(path), "%s/%s/jail", run_dir, e->d_name);
		jail_reap(path);
		fs_rmtree_at(dirfd(d), e->d_name);
		if (lock >= 0)
			close(lock);
		reaped++;
	}
	closedir(d);
	return reaped;
}
