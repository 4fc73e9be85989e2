/* template_cmd: `kiln-host template build RECIPE.json --out FILE`: one recipe
 * template built in a build VM on this machine (template_build_recipe), for
 * operators and the integration tests. The build log goes to stderr, the
 * template's meta (env, workdir, uid, gid, size) as JSON to stdout. */
#include "template_cmd.h"

#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "host_config.h"
#include "io.h"
#include "net/net.h"
#include "paths.h"
#include "recipe.h"
#include "run/run.h"
#include "template_build/template_build.h"
#include "vm/vm.h"

static void template_cmd_usage(FILE *f)
{
	fputs("usage: kiln-host template build RECIPE.json --out FILE [--timeout S] [--max-mib N]\n"
	      "           [--vcpus N] [--memory MiB] [--mirror URL] [--config FILE]\n"
	      "           [--accel auto|kvm|tcg] [--image-dir DIR] [--run-dir DIR] [--qemu PATH] [--no-jail]\n"
	      "  --config FILE   kiln-host's configuration; its \"network\" section enables the\n"
	      "                  egress a recipe with packages needs (to the mirror only)\n"
	      "  --mirror URL    Debian mirror (default: this machine's apt sources, else deb.debian.org)\n"
	      "exit status: 0 built, 1 the build failed, 2 bad usage or recipe, 3 error\n",
	      f);
}

/* The Debian mirror this machine's apt uses, as image/build-rootfs.sh finds it. */
static void template_cmd_mirror(char *out, size_t cap)
{
	glob_t g;
	char line[1024];

	snprintf(out, cap, "http://deb.debian.org/debian");
	if (glob("/etc/apt/sources.list.d/*.sources", 0, NULL, &g) == 0) {
		for (size_t i = 0; i < g.gl_pathc; i++) {
			FILE *f = fopen(g.gl_pathv[i], "re");

			while (f && fgets(line, sizeof(line), f)) {
				char url[1024];
				size_t n;

				if (sscanf(line, "URIs: %1023s", url) != 1 || strncmp(url, "http", 4))
					continue;
				n = strlen(url);
				if (n > 0 && url[n - 1] == '/')
					url[--n] = '\0';
				if (n >= 6 && !strcmp(url + n - 6, "debian")) {
					snprintf(out, cap, "%s", url);
					fclose(f);
					globfree(&g);
					return;
				}
			}
			if (f)
				fclose(f);
		}
		globfree(&g);
	}
}

struct template_cmd_log {
	FILE *f;
};

static void template_cmd_log_line(void *ctx, const char *line)
{
	struct template_cmd_log *l = ctx;

	fprintf(l->f, "%s\n", line);
	fflush(l->f);
}

static int template_cmd_fail(const struct kiln_err *err, int status)
{
	json_t *r = json_pack("{s:{s:s, s:s}}", "error", "code", err->code, "message", err->message);

	fprintf(stderr, "kiln-host: %s: %s\n", err->code, err->message);
	json_dumpf(r, stdout, JSON_COMPACT);
	putchar('\n');
	json_decref(r);
	return status;
}

static int template_cmd_uint(const char *s, unsigned long min, unsigned long max, unsigned long *out)
{
	char *end;

	errno = 0;
	*out = strtoul(s, &end, 10);
	return errno || end == s || *end || *out < min || *out > max ? -1 : 0;
}

static int template_cmd_build(int argc, char **argv)
{
	enum { O_OUT = 1, O_TIMEOUT, O_MAX, O_VCPUS, O_MEM, O_MIRROR, O_CONFIG, O_ACCEL, O_IMAGE, O_RUN, O_QEMU,
	       O_NOJAIL };
	static const struct option opts[] = {
		{ "out", required_argument, 0, O_OUT },       { "timeout", required_argument, 0, O_TIMEOUT },
		{ "max-mib", required_argument, 0, O_MAX },   { "vcpus", required_argument, 0, O_VCPUS },
		{ "memory", required_argument, 0, O_MEM },    { "mirror", required_argument, 0, O_MIRROR },
		{ "config", required_argument, 0, O_CONFIG }, { "accel", required_argument, 0, O_ACCEL },
		{ "image-dir", required_argument, 0, O_IMAGE }, { "run-dir", required_argument, 0, O_RUN },
		{ "qemu", required_argument, 0, O_QEMU },     { "no-jail", no_argument, 0, O_NOJAIL },
		{ "help", no_argument, 0, 'h' },             { 0, 0, 0, 0 },
	};
	static struct jail_config jc;
	static struct host_config hc;
	static struct net_host net;
	static char kernel[PATH_MAX], initrd[PATH_MAX], rootfs[PATH_MAX], base[PATH_MAX], image_buf[PATH_MAX], mirror[1024];
	const char *out = NULL, *config = NULL, *accel = "auto", *image_dir = NULL;
	struct kiln_err err = { .code = "" };
	struct run_opts ro = { .boot_timeout_s = 120 };
	struct template_build_recipe_req req = { .timeout_s = 1800, .max_bytes = 4096ull << 20, .vcpus = 2, .memory_mib = 1024,
					 .cancel_fd = -1 };
	struct template_build_meta meta;
	struct template_cmd_log log = { stderr };
	struct recipe recipe;
	unsigned long v;
	size_t len;
	char *text;
	int c, no_jail = 0, rc, have_net = 0;
	sigset_t set;

	ro.vm.qemu = "/usr/bin/qemu-system-x86_64";
	ro.vm.run_dir = getenv("KILN_RUN_DIR") && *getenv("KILN_RUN_DIR") ? getenv("KILN_RUN_DIR") : "/run/kiln";
	ro.vm.disk_bps = VM_DISK_BPS;
	ro.vm.disk_iops = VM_DISK_IOPS;
	template_cmd_mirror(mirror, sizeof(mirror));
	req.mirror = mirror;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_OUT: out = optarg; break;
		case O_TIMEOUT:
			if (template_cmd_uint(optarg, 1, 86400, &v) < 0)
				return kiln_err_set(&err, KERR_USAGE, "--timeout: expected 1..86400 seconds"), template_cmd_fail(&err, 2);
			req.timeout_s = (unsigned)v;
			break;
		case O_MAX:
			if (template_cmd_uint(optarg, 64, 1u << 20, &v) < 0)
				return kiln_err_set(&err, KERR_USAGE, "--max-mib: expected 64..1048576"), template_cmd_fail(&err, 2);
			req.max_bytes = (uint64_t)v << 20;
			break;
		case O_VCPUS:
			if (template_cmd_uint(optarg, 1, 64, &v) < 0)
				return kiln_err_set(&err, KERR_USAGE, "--vcpus: expected 1..64"), template_cmd_fail(&err, 2);
			req.vcpus = (unsigned)v;
			break;
		case O_MEM:
			if (template_cmd_uint(optarg, 256, 1u << 20, &v) < 0)
				return kiln_err_set(&err, KERR_USAGE, "--memory: expected 256.. MiB"), template_cmd_fail(&err, 2);
			req.memory_mib = (unsigned)v;
			break;
		case O_MIRROR: snprintf(mirror, sizeof(mirror), "%s", optarg); break;
		case O_CONFIG: config = optarg; break;
		case O_ACCEL: accel = optarg; break;
		case O_IMAGE: image_dir = optarg; break;
		case O_RUN: ro.vm.run_dir = optarg; break;
		case O_QEMU: ro.vm.qemu = optarg; break;
		case O_NOJAIL: no_jail = 1; break;
		case 'h': template_cmd_usage(stdout); return 0;
		default: template_cmd_usage(stderr); return 2;
		}
	}
	if (!out || optind != argc - 1) {
		template_cmd_usage(stderr);
		return 2;
	}
	text = io_read_file(argv[optind], RECIPE_MAX_JSON, &len);
	if (!text)
		return kiln_err_set(&err, KERR_INVALID_RECIPE, "cannot read %s: %s", argv[optind], strerror(errno)),
		       template_cmd_fail(&err, 2);
	rc = recipe_parse(text, len, &recipe, &err);
	free(text);
	if (rc < 0)
		return template_cmd_fail(&err, 2);
	req.recipe = &recipe;

	ro.vm.accel = !strcmp(accel, "kvm") ? VM_ACCEL_KVM : !strcmp(accel, "tcg") ? VM_ACCEL_TCG : VM_ACCEL_AUTO;
	ro.vm.accel = vm_accel_resolve(ro.vm.accel, &err);
	if (ro.vm.accel == VM_ACCEL_AUTO)
		goto fail3;
	if (!image_dir && !(image_dir = paths_image_dir(image_buf, sizeof(image_buf)))) {
		kiln_err_set(&err, KERR_IMAGE_MISSING, "cannot find the image directory: give --image-dir");
		goto fail3;
	}
	snprintf(kernel, sizeof(kernel), "%s/vmlinux", image_dir);
	snprintf(initrd, sizeof(initrd), "%s/initramfs.cpio", image_dir);
	snprintf(rootfs, sizeof(rootfs), "%s/rootfs.ext4", image_dir);
	if (access(kernel, R_OK) < 0 || access(initrd, R_OK) < 0 || !realpath(rootfs, base)) {
		kiln_err_set(&err, KERR_IMAGE_MISSING, "%s: no vmlinux, initramfs.cpio or rootfs.ext4 (make image)", image_dir);
		goto fail3;
	}
	ro.vm.kernel = kernel;
	ro.vm.initrd = initrd;
	req.base_rootfs = base;
	if (!no_jail) {
		if (vm_jail_config(&jc, ro.vm.qemu, ro.vm.accel, &err) < 0)
			goto fail3;
		ro.vm.jail = &jc;
	}
	if (config) {
		if (config_load(config, &hc, &err) < 0 || net_host_init(&net, hc.network, &err) < 0)
			goto fail3;
		have_net = 1;
		ro.net = &net;
	}
	req.ro = &ro;
	/* SIGINT/SIGTERM/SIGHUP cancel the build (the VM and every file go). */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	req.cancel_fd = signalfd(-1, &set, SFD_CLOEXEC);
	vm_reap_stale(ro.vm.run_dir);

	rc = template_build_recipe(&req, out, &meta, template_cmd_log_line, &log, &err);
	if (rc == 0) {
		struct stat st;
		json_t *j = json_pack("{s:O, s:s, s:i, s:i, s:I}", "env", meta.env, "workdir", meta.workdir, "uid",
				      (int)meta.uid, "gid", (int)meta.gid, "size",
				      (json_int_t)(stat(out, &st) == 0 ? st.st_size : 0));

		json_dumpf(j, stdout, JSON_COMPACT);
		putchar('\n');
		json_decref(j);
		json_decref(meta.env);
	}
	if (have_net)
		net_host_fini(&net);
	if (config)
		config_free(&hc);
	recipe_free(&recipe);
	if (req.cancel_fd >= 0)
		close(req.cancel_fd);
	if (rc < 0)
		return template_cmd_fail(&err, err.errc == KERR_BUILD_FAILED || err.errc == KERR_BUILD_TIMEOUT ||
					       err.errc == KERR_TOO_LARGE || err.errc == KERR_CANCELLED
				       ? 1 : 3);
	return 0;
fail3:
	recipe_free(&recipe);
	return template_cmd_fail(&err, 3);
}

int template_cmd_main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "build"))
		return template_cmd_build(argc - 1, argv + 1);
	template_cmd_usage(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
	return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
}
