/* oci_cmd: `kiln-host template import`, a thin command over template_build_oci. */
#include "oci_cmd.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "template_build/template_build.h"

static void import_usage(FILE *f)
{
	fputs("usage: kiln-host template import ARCHIVE --out FILE [--work-dir DIR] [--max-mib N]\n"
	      "                                [--timeout S] [--run-dir DIR]\n"
	      "  ARCHIVE   docker-archive (docker save, podman save) or OCI image layout tar\n"
	      "  --out     the ext4 root file system made (mode 0444)\n"
	      "  --work-dir scratch directory, created and removed (default: FILE.work)\n"
	      "  --max-mib cap of the unpacked tree and of the image (default 4096)\n"
	      "  --timeout seconds for the whole import (default 1800)\n"
	      "SIGINT/SIGTERM cancel the import.\n",
	      f);
}

static void log_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "%s\n", line);
}

int oci_cmd_import(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "out", required_argument, 0, 'o' },     { "work-dir", required_argument, 0, 'w' },
		{ "max-mib", required_argument, 0, 'm' }, { "timeout", required_argument, 0, 't' },
		{ "run-dir", required_argument, 0, 'r' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	struct template_build_oci_req req = { .max_bytes = 4096ull << 20, .timeout_s = 1800, .cancel_fd = -1 };
	struct template_build_meta meta;
	struct kiln_err err = { 0 };
	const char *out = NULL;
	char work[PATH_MAX];
	struct stat st;
	sigset_t mask;
	json_t *res;
	int c, rc;

	req.run_dir = getenv("KILN_RUN_DIR") && *getenv("KILN_RUN_DIR") ? getenv("KILN_RUN_DIR") : "/run/kiln";
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end;
		unsigned long long v;

		switch (c) {
		case 'o': out = optarg; break;
		case 'w': req.work_dir = optarg; break;
		case 'r': req.run_dir = optarg; break;
		case 'm':
		case 't':
			errno = 0;
			v = strtoull(optarg, &end, 10);
			if (errno || *end || v == 0 || v > (c == 'm' ? 1ull << 20 : 86400)) {
				fprintf(stderr, "kiln-host: --%s: bad value \"%s\"\n", c == 'm' ? "max-mib" : "timeout", optarg);
				return 2;
			}
			if (c == 'm')
				req.max_bytes = v << 20;
			else
				req.timeout_s = (unsigned)v;
			break;
		case 'h': import_usage(stdout); return 0;
		default: import_usage(stderr); return 2;
		}
	}
	if (optind + 1 != argc || !out) {
		import_usage(stderr);
		return 2;
	}
	req.archive = argv[optind];
	if (!req.work_dir) {
		snprintf(work, sizeof(work), "%s.work", out);
		req.work_dir = work;
	}
	if (lstat(req.work_dir, &st) == 0) {
		fprintf(stderr, "kiln-host: %s exists: the work directory must be new\n", req.work_dir);
		return 2;
	}
	/* SIGINT/SIGTERM become cancel_fd: the import cleans up before exiting. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	req.cancel_fd = signalfd(-1, &mask, SFD_CLOEXEC);

	rc = template_build_oci(&req, out, &meta, log_line, NULL, &err);
	if (rc == 0) {
		if (stat(out, &st) < 0)
			st.st_size = 0;
		res = json_pack("{s:O?, s:s, s:I, s:I, s:I}", "env", meta.env, "workdir", meta.workdir, "uid",
				(json_int_t)meta.uid, "gid", (json_int_t)meta.gid, "size", (json_int_t)st.st_size);
		json_decref(meta.env);
	} else {
		res = json_pack("{s:{s:s, s:s}}", "error", "code", err.code, "message", err.message);
		fprintf(stderr, "kiln-host: %s\n", err.message);
	}
	json_dumpf(res, stdout, JSON_COMPACT);
	putchar('\n');
	json_decref(res);
	if (req.cancel_fd >= 0)
		close(req.cancel_fd);
	if (rc == 0)
		return 0;
	return err.errc == KERR_HOST_ERROR ? 3 : 1;
}
