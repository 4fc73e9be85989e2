/* bench/boot: cold-boot time, process start to guest ready, for
 *   baseline - plain QEMU microvm, same kernel and machine flags, a busybox
 *              init that writes one line to the virtio-serial port;
 *   kiln     - kiln-host's VM driver (vm_start, QMP) to kiln-init's HELLO,
 *              with the real root disk mounted.
 * Runs them interleaved so machine noise hits both alike; prints median/p95.
 *   usage: boot IMAGE_DIR BASELINE_INITRD RUNS */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto.h"
#include "vm.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static int64_t pct(int64_t *v, int n, int p)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
	return v[(n - 1) * p / 100];
}

static int64_t boot_baseline(const char *kernel, const char *initrd)
{
	int sp[2];
	char chardev[64];
	int64_t t0 = proto_now_us(), t = -1;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0)
		return -1;
	snprintf(chardev, sizeof(chardev), "socket,id=agent,fd=%d", sp[1]);
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		close(sp[0]);
		execl("/usr/bin/qemu-system-x86_64", "qemu-system-x86_64", "-M",
		      "microvm,acpi=off,rtc=on,x-option-roms=off,isa-serial=on", "-accel", "tcg,tb-size=64", "-cpu",
		      "qemu64", "-m", "256", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-kernel",
		      kernel, "-initrd", initrd, "-append",
		      "console=ttyS0 quiet loglevel=3 acpi=off reboot=t panic=-1 nolapic_timer pty.legacy_count=0",
		      "-serial", "null", "-device", "virtio-serial-device,max_ports=2", "-chardev", chardev, "-device",
		      "virtserialport,chardev=agent,name=kiln.agent", (char *)NULL);
		_exit(127);
	}
	close(sp[1]);
	{
		struct pollfd p = { .fd = sp[0], .events = POLLIN };
		char c;

		if (poll(&p, 1, 60000) == 1 && read(sp[0], &c, 1) == 1)
			t = proto_now_us() - t0;
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(sp[0]);
	return t;
}

static int64_t boot_kiln(const struct vm_config *cfg)
{
	struct vm vm;
	struct kiln_err err;
	struct proto_frame f;
	int64_t t0 = proto_now_us(), t = -1;

	if (vm_start(cfg, &vm, &err) == 0 && vm_recv(&vm, &f, proto_now_ms() + 60000, &err) == 0 &&
	    f.type == PROTO_HELLO)
		t = proto_now_us() - t0;
	else
		fprintf(stderr, "kiln boot failed: %s\n", err.message);
	vm_destroy(&vm);
	return t;
}

int main(int argc, char **argv)
{
	static char kernel[4096], initrd[4096], disk[4096];
	struct vm_config cfg = { 0 };
	int runs, nb = 0, nk = 0;
	int64_t *b, *k;

	if (argc != 4) {
		fprintf(stderr, "usage: boot IMAGE_DIR BASELINE_INITRD RUNS\n");
		return 2;
	}
	runs = atoi(argv[3]);
	b = calloc((size_t)runs, sizeof(*b));
	k = calloc((size_t)runs, sizeof(*k));
	snprintf(kernel, sizeof(kernel), "%s/vmlinux", argv[1]);
	snprintf(initrd, sizeof(initrd), "%s/initramfs.cpio", argv[1]);
	snprintf(disk, sizeof(disk), "%s/rootfs.ext4", argv[1]);
	cfg.qemu = "/usr/bin/qemu-system-x86_64";
	cfg.kernel = kernel;
	cfg.initrd = initrd;
	cfg.disk = disk;
	cfg.disk_format = "raw";
	cfg.run_dir = getenv("KILN_RUN_DIR") ? getenv("KILN_RUN_DIR") : "/run/kiln";
	cfg.accel = VM_ACCEL_TCG;
	cfg.vcpus = 1;
	cfg.memory_mib = 256;
	for (int i = 0; i < runs; i++) {
		int64_t t = boot_baseline(kernel, argv[2]);

		if (t > 0)
			b[nb++] = t;
		t = boot_kiln(&cfg);
		if (t > 0)
			k[nk++] = t;
	}
	if (!nb || !nk) {
		fprintf(stderr, "boot: no successful runs (baseline %d, kiln %d)\n", nb, nk);
		return 1;
	}
	{
		int64_t bm = pct(b, nb, 50), bp = pct(b, nb, 95), km = pct(k, nk, 50), kp = pct(k, nk, 95);

		printf("cold boot to ready (%d runs each, interleaved)\n", runs);
		printf("  baseline: plain QEMU + busybox init   median %6.1f ms  p95 %6.1f ms\n", bm / 1e3, bp / 1e3);
		printf("  kiln:     vm driver + kiln-init ready median %6.1f ms  p95 %6.1f ms\n", km / 1e3, kp / 1e3);
		printf("  ratio kiln/baseline (median): %.2f\n", (double)km / (double)bm);
	}
	return 0;
}
