/* no-vm-readv: runs a command (argv[1..]) where process_vm_readv and
 * process_vm_writev fail with EPERM, as on a host whose Yama ptrace_scope
 * or LSM refuses them, for tests/integration/78-pause-diff.sh: a kiln-host
 * run under it must pause and resume sessions through QEMU's own save and
 * load. A seccomp filter (libseccomp), inherited by everything it starts;
 * every other call is allowed. Exits 127 when the filter or the exec
 * fails. */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	scmp_filter_ctx f;

	if (argc < 2) {
		fprintf(stderr, "usage: no-vm-readv COMMAND [ARG...]\n");
		return 2;
	}
	f = seccomp_init(SCMP_ACT_ALLOW);
	if (!f || seccomp_rule_add(f, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(process_vm_readv), 0) < 0 ||
	    seccomp_rule_add(f, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(process_vm_writev), 0) < 0 ||
	    seccomp_load(f) < 0) {
		fprintf(stderr, "no-vm-readv: cannot install the seccomp filter\n");
		return 127;
	}
	seccomp_release(f);
	execvp(argv[1], argv + 1);
	fprintf(stderr, "no-vm-readv: %s: %s\n", argv[1], strerror(errno));
	return 127;
}
