/* bench.h: what the C benchmarks share (header-only: each C benchmark is one
 * program): the VM configuration of an image directory, and reading
 * /proc fields. */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vm.h"

/* The image's files and the base VM of every benchmark: TCG, 1 vCPU,
 * 256 MiB, the raw root disk, VMs under KILN_RUN_DIR (default /run/kiln).
 * The paths live in static storage: one image per program. */
static inline void bench_base(struct vm_config *base, const char *image_dir)
{
	static char kernel[4096], initrd[4096], disk[4096];

	snprintf(kernel, sizeof(kernel), "%s/vmlinux", image_dir);
	snprintf(initrd, sizeof(initrd), "%s/initramfs.cpio", image_dir);
	snprintf(disk, sizeof(disk), "%s/rootfs.ext4", image_dir);
	memset(base, 0, sizeof(*base));
	base->qemu = "/usr/bin/qemu-system-x86_64";
	base->kernel = kernel;
	base->initrd = initrd;
	base->disk = disk;
	base->disk_format = "raw";
	base->run_dir = getenv("KILN_RUN_DIR") ? getenv("KILN_RUN_DIR") : "/run/kiln";
	base->accel = VM_ACCEL_TCG;
	base->vcpus = 1;
	base->memory_mib = 256;
}

/* A "Field: N kB" line of /proc/PID/FILE (or of FILE when it is a path):
 * N, or -1. */
static inline long status_kib(pid_t pid, const char *file, const char *field)
{
	char path[64], line[256];
	size_t fl = strlen(field);
	long v = -1;
	FILE *f;

	if (file[0] == '/')
		snprintf(path, sizeof(path), "%s", file);
	else
		snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, fl) && line[fl] == ':')
			v = strtol(line + fl + 1, NULL, 10);
	fclose(f);
	return v;
}

static inline double bench_now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* qsort's comparison of doubles (for medians). */
static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Write n pages (each a copy of page) into p, a private mapping inherited
 * by a child, from this process with process_vm_writev, as kiln-host's page
 * loader writes a resumed session's pages into QEMU: the i-th page at
 * p + where(i). The milliseconds it took, or -1. */
static inline double bench_writev_pages(char *p, size_t n, size_t (*where)(size_t), const char *page)
{
	struct iovec l[1024], r[1024];
	double t0, ms;
	pid_t c = fork();

	if (c < 0)
		return -1;
	if (c == 0) {
		pause();
		_exit(0);
	}
	t0 = bench_now_ms();
	for (size_t done = 0; done < n;) {
		int k = 0;

		for (; k < 1024 && done < n; k++, done++) {
			l[k] = (struct iovec){ .iov_base = (void *)page, .iov_len = 4096 };
			r[k] = (struct iovec){ .iov_base = p + where(done), .iov_len = 4096 };
		}
		if (process_vm_writev(c, l, (unsigned long)k, r, (unsigned long)k, 0) != (ssize_t)k * 4096) {
			perror("process_vm_writev");
			kill(c, SIGKILL);
			waitpid(c, NULL, 0);
			return -1;
		}
	}
	ms = bench_now_ms() - t0;
	kill(c, SIGKILL);
	waitpid(c, NULL, 0);
	return ms;
}

#endif
