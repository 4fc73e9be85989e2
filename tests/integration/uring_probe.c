/* uring-probe: tries io_uring_setup, io_uring_enter and io_uring_register
 * and prints what each returned ("ok" or the errno name), for
 * tests/integration/28-hardening.sh to run inside kiln-jail (which must
 * refuse them) and outside it (where they work, so the check can fail).
 * Static: the jail's root holds no libraries. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *name(long r)
{
	if (r >= 0)
		return "ok";
	return errno == ENOSYS ? "ENOSYS" : errno == EPERM ? "EPERM" : strerror(errno);
}

int main(void)
{
	unsigned char params[120]; /* struct io_uring_params */
	long fd, r;

	memset(params, 0, sizeof(params));
	fd = syscall(SYS_io_uring_setup, 1, params);
	printf("io_uring_setup %s\n", name(fd));
	r = syscall(SYS_io_uring_enter, fd >= 0 ? (int)fd : 0, 0, 0, 0, NULL, 0);
	printf("io_uring_enter %s\n", fd >= 0 && r >= 0 ? "ok" : r >= 0 ? "ok" : errno == EBADF ? "EBADF" : name(r));
	r = syscall(SYS_io_uring_register, fd >= 0 ? (int)fd : 0, 0, NULL, 0);
	printf("io_uring_register %s\n", errno == EINVAL || errno == EFAULT || r >= 0 ? "reached" : name(r));
	return 0;
}
