/* console-flood: boots kiln's VM driver (host/vm/vm.c, jailed as kiln-host
 * runs it) on an initramfs whose init writes the serial console as fast as
 * it can, waits, and prints what that cost the host: the console file in
 * the VM's directory, the bytes QEMU's console ring holds, QEMU's RSS.
 * For tests/integration/27-console.sh.
 *   usage: console-flood IMAGE_DIR INITRD SECONDS */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "proto.h"
#include "vm.h"

static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (!(f = fopen(path, "re")))
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			kib = strtol(line + 6, NULL, 10);
	fclose(f);
	return kib;
}

int main(int argc, char **argv)
{
	static char kernel[4096], disk[4096], path[700];
	static struct jail_config jc;
	struct vm_config cfg = { 0 };
	struct kiln_err err = { .code = "" };
	struct vm vm;
	struct stat st;
	json_t *ret = NULL;
	char cmd[160];
	int secs;

	if (argc != 4) {
		fprintf(stderr, "usage: console-flood IMAGE_DIR INITRD SECONDS\n");
		return 2;
	}
	secs = atoi(argv[3]);
	snprintf(kernel, sizeof(kernel), "%s/vmlinux", argv[1]);
	snprintf(disk, sizeof(disk), "%s/rootfs.ext4", argv[1]);
	cfg.qemu = "/usr/bin/qemu-system-x86_64";
	cfg.kernel = kernel;
	cfg.initrd = argv[2];
	cfg.disk = disk;
	cfg.disk_format = "raw";
	cfg.run_dir = getenv("KILN_RUN_DIR") ? getenv("KILN_RUN_DIR") : "/run/kiln";
	cfg.accel = VM_ACCEL_TCG;
	cfg.vcpus = 1;
	cfg.memory_mib = 256;
	/* CONSOLE_FILE=1: the console as a file, as kiln-host's debug_console
	 * (and every VM before the ring): for comparison. */
	cfg.console_file = getenv("CONSOLE_FILE") && !strcmp(getenv("CONSOLE_FILE"), "1");
	if (vm_jail_config(&jc, cfg.qemu, cfg.accel, &err) < 0) {
		fprintf(stderr, "console-flood: %s\n", err.message);
		return 1;
	}
	cfg.jail = &jc;
	if (vm_start(&cfg, &vm, &err) < 0) {
		fprintf(stderr, "console-flood: %s\n", err.message);
		vm_destroy(&vm);
		return 1;
	}
	printf("rss_start_kib %ld\n", rss_kib(vm.pid));
	sleep((unsigned)secs);
	snprintf(path, sizeof(path), "%s/vm/console.log", vm.dir);
	printf("console_file_bytes %lld\n", stat(path, &st) == 0 ? (long long)st.st_size : 0LL);
	/* Stop the guest (nothing more is written), then read the ring empty
	 * in 8 KiB pieces (a QMP reply is bounded). */
	if (vm_qmp(&vm, "{\"execute\":\"stop\"}", proto_now_ms() + 5000, NULL, &err) < 0)
		printf("stop_error %s\n", err.message);
	{
		size_t total = 0;
		int ok = 1;

		snprintf(cmd, sizeof(cmd),
			 "{\"execute\":\"ringbuf-read\",\"arguments\":{\"device\":\"con\",\"size\":8192,\"format\":\"utf8\"}}");
		for (int i = 0; i < 4 * (int)(VM_CONSOLE_RING / 8192); i++) {
			if (vm_qmp(&vm, cmd, proto_now_ms() + 5000, &ret, &err) < 0 || !json_is_string(ret)) {
				ok = 0;
				break;
			}
			if (!json_string_length(ret))
				break;
			if (!total)
				printf("ring_sample %.200s\n", json_string_value(ret));
			total += json_string_length(ret);
			json_decref(ret);
			ret = NULL;
		}
		json_decref(ret);
		if (ok)
			printf("ring_bytes %zu\n", total);
		else
			printf("ring_bytes -1\nring_error %s\n", err.message);
	}
	printf("rss_end_kib %ld\nqemu_alive %d\n", rss_kib(vm.pid), kill(vm.pid, 0) == 0);
	vm_destroy(&vm);
	return 0;
}
