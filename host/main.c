/* kiln-host: the per-machine daemon and its operator commands. This file only
 * parses the command line; the work is in run.c, vm.c and friends. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "err.h"
#include "run.h"
#include "spec.h"
#include "vm.h"

#define SPEC_MAX_BYTES (96 << 20) /* 64 MiB of files, base64-encoded, plus code */

static void usage(FILE *f)
{
	fputs("usage: kiln-host run --spec FILE|- [--output-dir DIR] [--stream] [options]\n"
	      "       kiln-host reap [--run-dir DIR]\n"
	      "options:\n"
	      "  --accel auto|kvm|tcg   hypervisor (auto: KVM only with hardware virtualisation)\n"
	      "  --image-dir DIR        vmlinux, initramfs.cpio, rootfs.ext4 (default: <binary dir>/image)\n"
	      "  --run-dir DIR          per-VM state (default: $KILN_RUN_DIR or /run/kiln)\n"
	      "  --qemu PATH            QEMU binary (default: qemu-system-x86_64)\n"
	      "  --boot-timeout S       cold boot deadline in seconds (default 60)\n"
	      "exit status: 0 task succeeded, 1 task failed or timed out, 2 bad usage or spec, 3 error\n",
	      f);
}

static char *read_all(const char *path, size_t *len, struct kiln_err *err)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "re") : stdin;
	char *buf = NULL;
	size_t cap = 0, n = 0;

	if (!f) {
		kiln_err_set(err, "invalid_spec", "cannot open %s: %s", path, strerror(errno));
		return NULL;
	}
	for (;;) {
		size_t r;

		if (cap - n < 65536) {
			char *p;

			cap = cap ? cap * 2 : 1 << 20;
			p = realloc(buf, cap);
			if (!p)
				break;
			buf = p;
		}
		r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (n > SPEC_MAX_BYTES) {
			kiln_err_set(err, "invalid_spec", "spec is larger than %d MiB", SPEC_MAX_BYTES >> 20);
			goto fail;
		}
		if (r == 0)
			break;
	}
	if (ferror(f) || !buf) {
		kiln_err_set(err, "invalid_spec", "cannot read %s", path);
		goto fail;
	}
	if (f != stdin)
		fclose(f);
	*len = n;
	return buf;
fail:
	if (f != stdin)
		fclose(f);
	free(buf);
	return NULL;
}

static int print_error(const struct kiln_err *err, int status)
{
	json_t *r = json_pack("{s:s, s:n, s:n, s:s, s:{s:s, s:s}}", "state", "error", "exit_code", "signal",
			      "end_reason", "invalid_spec", "error", "code", err->code, "message", err->message);

	fprintf(stderr, "kiln-host: %s\n", err->message);
	json_dumpf(r, stdout, JSON_COMPACT);
	putchar('\n');
	json_decref(r);
	return status;
}

static const char *default_run_dir(void)
{
	const char *d = getenv("KILN_RUN_DIR");

	return d && *d ? d : "/run/kiln";
}

static int image_path(char *out, size_t cap, const char *dir, const char *name, struct kiln_err *err)
{
	snprintf(out, cap, "%s/%s", dir, name);
	if (access(out, R_OK) < 0)
		return kiln_err_set(err, "image_missing", "%s: %s (build it with `make image`)", out, strerror(errno));
	return 0;
}

static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "spec", required_argument, 0, 's' },     { "output-dir", required_argument, 0, 'o' },
		{ "stream", no_argument, 0, 'S' },         { "accel", required_argument, 0, 'a' },
		{ "image-dir", required_argument, 0, 'i' }, { "run-dir", required_argument, 0, 'r' },
		{ "qemu", required_argument, 0, 'q' },     { "boot-timeout", required_argument, 0, 'b' },
		{ "help", no_argument, 0, 'h' },           { 0, 0, 0, 0 },
	};
	static char kernel[PATH_MAX], initrd[PATH_MAX], disk[PATH_MAX], exe_dir[PATH_MAX];
	const char *spec_path = NULL, *image_dir = NULL, *accel = "auto";
	struct run_opts ro = { .boot_timeout_s = 60 };
	struct task_spec spec;
	struct kiln_err err = { { 0 } };
	json_t *result;
	const char *state;
	size_t len;
	char *text;
	int c, status;

	ro.vm.qemu = "/usr/bin/qemu-system-x86_64";
	ro.vm.run_dir = default_run_dir();
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': spec_path = optarg; break;
		case 'o': ro.output_dir = optarg; break;
		case 'S': ro.stream = stdout; break;
		case 'a': accel = optarg; break;
		case 'i': image_dir = optarg; break;
		case 'r': ro.vm.run_dir = optarg; break;
		case 'q': ro.vm.qemu = optarg; break;
		case 'b': ro.boot_timeout_s = atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!spec_path || optind != argc || ro.boot_timeout_s <= 0) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(accel, "auto"))
		ro.vm.accel = VM_ACCEL_AUTO;
	else if (!strcmp(accel, "kvm"))
		ro.vm.accel = VM_ACCEL_KVM;
	else if (!strcmp(accel, "tcg"))
		ro.vm.accel = VM_ACCEL_TCG;
	else {
		kiln_err_set(&err, "usage", "--accel: expected auto, kvm or tcg, got \"%s\"", accel);
		return print_error(&err, 2);
	}
	ro.vm.accel = vm_accel_resolve(ro.vm.accel, &err);
	if (ro.vm.accel == VM_ACCEL_AUTO)
		return print_error(&err, 3);
	if (!image_dir) {
		ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof(exe_dir) - 8);
		char *slash;

		exe_dir[n > 0 ? n : 0] = '\0';
		slash = strrchr(exe_dir, '/');
		if (slash)
			strcpy(slash, "/image");
		image_dir = exe_dir;
	}
	if (image_path(kernel, sizeof(kernel), image_dir, "vmlinux", &err) < 0 ||
	    image_path(initrd, sizeof(initrd), image_dir, "initramfs.cpio", &err) < 0 ||
	    image_path(disk, sizeof(disk), image_dir, "rootfs.ext4", &err) < 0)
		return print_error(&err, 3);
	ro.vm.kernel = kernel;
	ro.vm.initrd = initrd;
	ro.vm.disk = disk;
	ro.vm.disk_format = "raw";

	text = read_all(spec_path, &len, &err);
	if (!text)
		return print_error(&err, 2);
	if (spec_parse(text, len, &spec, &err) < 0) {
		free(text);
		return print_error(&err, 2);
	}
	free(text);

	/* VMs a killed kiln-host left behind go before this one starts. */
	vm_reap_stale(ro.vm.run_dir);
	result = run_task(&spec, &ro);
	spec_free(&spec);
	if (ro.stream)
		json_object_set_new(result, "stream", json_string("result"));
	json_dumpf(result, stdout, JSON_COMPACT);
	putchar('\n');
	fflush(stdout);
	state = json_string_value(json_object_get(result, "state"));
	status = !strcmp(state, "succeeded") ? 0 : !strcmp(state, "error") ? 3 : 1;
	json_decref(result);
	return status;
}

static int cmd_reap(int argc, char **argv)
{
	const char *run_dir = default_run_dir();

	if (argc == 3 && !strcmp(argv[1], "--run-dir"))
		run_dir = argv[2];
	else if (argc != 1) {
		usage(stderr);
		return 2;
	}
	printf("reaped %d VM(s) in %s\n", vm_reap_stale(run_dir), run_dir);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "reap"))
		return cmd_reap(argc - 1, argv + 1);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	fprintf(stderr, "kiln-host: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return 2;
}
