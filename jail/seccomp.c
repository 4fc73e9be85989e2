/* seccomp: the filter every jail loads before its exec.
 *
 * QEMU's own -sandbox is a short denylist: it leaves clone() with namespace
 * flags, unshare, setns, execveat, ptrace, bpf, keyctl and the new mount API
 * open. These are the ways out of (or around) the jail and the kernel's
 * largest attack surface for an unprivileged process, so the jail denies them
 * before the exec; QEMU's filter then stacks on top. Built once per process
 * (libseccomp allocates) and only loaded by the child. */
#include "jail_int.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <linux/filter.h>
#include <seccomp.h>

static const int denied[] = {
	SCMP_SYS(unshare), SCMP_SYS(setns), SCMP_SYS(execveat),
	SCMP_SYS(mount), SCMP_SYS(umount2), SCMP_SYS(pivot_root), SCMP_SYS(chroot),
	SCMP_SYS(open_tree), SCMP_SYS(move_mount), SCMP_SYS(fsopen), SCMP_SYS(fsconfig),
	SCMP_SYS(fsmount), SCMP_SYS(fspick), SCMP_SYS(mount_setattr),
	SCMP_SYS(ptrace), SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev),
	SCMP_SYS(bpf), SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd),
	SCMP_SYS(keyctl), SCMP_SYS(add_key), SCMP_SYS(request_key),
	SCMP_SYS(kexec_load), SCMP_SYS(kexec_file_load), SCMP_SYS(init_module),
	SCMP_SYS(finit_module), SCMP_SYS(delete_module), SCMP_SYS(reboot),
	SCMP_SYS(swapon), SCMP_SYS(swapoff), SCMP_SYS(acct), SCMP_SYS(quotactl),
	SCMP_SYS(syslog), SCMP_SYS(iopl), SCMP_SYS(ioperm), SCMP_SYS(personality),
};

/* io_uring: a large, often-patched kernel surface that also does I/O out of
 * the reach of seccomp's per-syscall view. QEMU falls back to its other
 * event loops when it is missing, so it gets ENOSYS, as on a kernel without. */
static const int denied_enosys[] = {
	SCMP_SYS(io_uring_setup), SCMP_SYS(io_uring_enter), SCMP_SYS(io_uring_register),
};

/* Threads yes, new namespaces no: clone() with any of these flags fails. */
static const unsigned long ns_flags[] = { CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
					  CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP };

#define N(a) (sizeof(a) / sizeof((a)[0]))

int seccomp_filter_build(struct sock_filter **out, unsigned *len)
{
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	struct sock_filter *f = NULL;
	int r = 0, mfd = -1;
	off_t size = 0;

	*out = NULL;
	*len = 0;
	if (!ctx)
		return -ENOMEM;
	for (size_t i = 0; i < N(denied) && r == 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), denied[i], 0);
	for (size_t i = 0; i < N(denied_enosys) && r == 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), denied_enosys[i], 0);
	for (size_t i = 0; i < N(ns_flags) && r == 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
				     SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
	/* clone3 takes its flags in memory, out of a filter's reach: ENOSYS
	 * makes glibc fall back to clone. */
	if (r == 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
	if (r == 0 && (mfd = memfd_create("kiln-seccomp", MFD_CLOEXEC)) < 0)
		r = -errno;
	if (r == 0)
		r = seccomp_export_bpf(ctx, mfd);
	if (r == 0 && ((size = lseek(mfd, 0, SEEK_END)) <= 0 || size % sizeof(struct sock_filter)))
		r = -EINVAL;
	if (r == 0 && !(f = malloc((size_t)size)))
		r = -ENOMEM;
	if (r == 0 && pread(mfd, f, (size_t)size, 0) != size)
		r = -EIO;
	if (r == 0) {
		*out = f;
		*len = (unsigned)(size / sizeof(struct sock_filter));
		f = NULL;
	}
	free(f);
	if (mfd >= 0)
		close(mfd);
	seccomp_release(ctx);
	return r;
}
