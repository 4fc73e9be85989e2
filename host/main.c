/* kiln-host: the per-machine daemon and its operator commands. This file only
 * parses the command line; the work is in run.c, vm.c and friends. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "clock.h"
#include "cmd/cmd.h"
#include "err.h"
#include "fsutil.h"
#include "io.h"
#include "net/net.h"
#include "paths.h"
#include "run/run.h"
#include "serve/serve.h"
#include "session/session.h"
#include "spec.h"
#include "task/task.h"
#include "template/template.h"
#include "template_build/template_build.h"
#include "version.h"
#include "vm/vm.h"

#define SPEC_MAX_BYTES SPEC_MAX_JSON

static void usage(FILE *f)
{
	fputs("usage: kiln-host run --spec FILE|- [--output-dir DIR] [--stream] [--cold] [options]\n"
	      "       kiln-host snapshot create [--image default] [--memory MiB] [--vcpus N] [--force] [options]\n"
	      "       kiln-host snapshot list | snapshot rm KEY... | snapshot prune\n"
	      "       kiln-host serve [--config FILE] [--token T] [--host-id ID] [--spool-dir DIR]\n"
	      "                       [--api URL[,URL...]] [--api-ca-file PEM] [--advertise URL]\n"
	      "                       [--tls-cert PEM --tls-key PEM]\n"
	      "                       [--listen ADDR:PORT] [--pool N] [--pool-max N] [--prestart N] [--memory-capacity MiB]\n"
	      "                       [--vcpus-capacity N] [--cpu-overcommit X] [--snapshot-memory MiB] [--cold] [options]\n"
	      "       kiln-host check-config FILE   check what serve --config FILE would use (starts nothing)\n"
	      "       kiln-host reap [--run-dir DIR]\n"
	      "       kiln-host drain [--deadline S] [--config FILE] [--url URL] [--token T] | undrain [...]\n"
	      "       kiln-host template build RECIPE.json --out FILE [--timeout S] [--max-mib N] [--config FILE] [options]\n"
	      "       kiln-host template import ARCHIVE --out FILE [--work-dir DIR] [--max-mib N] [--timeout S]\n"
	      "       kiln-host paths [--image-dir DIR] [--run-dir DIR] [--cache DIR]   the paths it would use (JSON)\n"
	      "       kiln-host --version\n"
	      "options:\n"
	      "  --accel auto|kvm|tcg   hypervisor (auto: KVM only with hardware virtualisation)\n"
	      "  --image-dir DIR        vmlinux, initramfs.cpio, rootfs.ext4 (default: <binary dir>/image, else\n"
	      "                         <binary dir>/../lib/kiln/image when installed)\n"
	      "  --run-dir DIR          per-VM state (default: $KILN_RUN_DIR or /run/kiln)\n"
	      "  --qemu PATH            QEMU binary (default: qemu-system-x86_64)\n"
	      "  --cache DIR            snapshot cache (default: $KILN_CACHE or /var/cache/kiln)\n"
	      "  --boot-timeout S       cold boot deadline in seconds (default 60)\n"
	      "  --no-jail              run QEMU unconfined, as root (debugging only; by default every\n"
	      "                         QEMU runs in its own namespaces, cgroups and slot uid)\n"
	      "exit status: 0 task succeeded, 1 task failed or timed out, 2 bad usage or spec, 3 error\n",
	      f);
}

static char *read_all(const char *path, size_t *len, struct kiln_err *err)
{
	char *text = io_read_file(path, SPEC_MAX_BYTES, len);

	if (!text) {
		if (errno == EFBIG)
			kiln_err_set(err, KERR_INVALID_SPEC, "spec is larger than %d MiB", SPEC_MAX_BYTES >> 20);
		else
			kiln_err_set(err, KERR_INVALID_SPEC, "cannot read %s: %s", path, strerror(errno));
	}
	return text;
}

static int print_error(const struct kiln_err *err, int status)
{
	json_t *r = json_pack("{s:s, s:n, s:n, s:s, s:{s:s, s:s}}", "state", "error", "exit_code", "signal",
			      "end_reason", err->code, "error", "code", err->code, "message", err->message);

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

static const char *default_cache(void)
{
	const char *d = getenv("KILN_CACHE");

	return d && *d ? d : "/var/cache/kiln";
}

static int image_path(char *out, size_t cap, const char *dir, const char *name, struct kiln_err *err)
{
	snprintf(out, cap, "%s/%s", dir, name);
	if (access(out, R_OK) < 0)
		return kiln_err_set(err, KERR_IMAGE_MISSING, "%s: %s (build it with `make image`)", out, strerror(errno));
	return 0;
}

/* Options every command that starts VMs shares. */
struct common {
	const char *image_dir, *accel, *cache;
	int no_jail;
	struct vm_config vm;
	struct jail_config jail;
	char kernel[PATH_MAX], initrd[PATH_MAX], disk[PATH_MAX], image_buf[PATH_MAX];
};

enum { OPT_ACCEL = 1000, OPT_IMAGE_DIR, OPT_RUN_DIR, OPT_QEMU, OPT_CACHE, OPT_NO_JAIL };
#define COMMON_OPTIONS                                                                                  \
	{ "accel", required_argument, 0, OPT_ACCEL }, { "image-dir", required_argument, 0, OPT_IMAGE_DIR }, \
	{ "run-dir", required_argument, 0, OPT_RUN_DIR }, { "qemu", required_argument, 0, OPT_QEMU },       \
	{ "cache", required_argument, 0, OPT_CACHE }, { "no-jail", no_argument, 0, OPT_NO_JAIL }

static void common_init(struct common *c)
{
	memset(c, 0, sizeof(*c));
	c->accel = "auto";
	c->cache = default_cache();
	c->vm.qemu = "/usr/bin/qemu-system-x86_64";
	c->vm.run_dir = default_run_dir();
	c->vm.disk_bps = VM_DISK_BPS;
	c->vm.disk_iops = VM_DISK_IOPS;
}

/* Returns 1 when opt was a common option. */
static int common_opt(struct common *c, int opt, const char *arg)
{
	switch (opt) {
	case OPT_ACCEL: c->accel = arg; return 1;
	case OPT_IMAGE_DIR: c->image_dir = arg; return 1;
	case OPT_RUN_DIR: c->vm.run_dir = arg; return 1;
	case OPT_QEMU: c->vm.qemu = arg; return 1;
	case OPT_CACHE: c->cache = arg; return 1;
	case OPT_NO_JAIL: c->no_jail = 1; return 1;
	}
	return 0;
}

/* The image directory when none was given: <binary dir>/image. */
/* The image directory when none was given: beside the binary (the build
 * tree) or under its prefix (installed; lib/paths.c). NULL: none found. */
static const char *common_image_dir(struct common *c)
{
	if (!c->image_dir)
		c->image_dir = paths_image_dir(c->image_buf, sizeof(c->image_buf));
	return c->image_dir;
}

/* Resolve the accelerator and the image files. */
static int common_finish(struct common *c, struct kiln_err *err)
{
	if (!strcmp(c->accel, "auto"))
		c->vm.accel = VM_ACCEL_AUTO;
	else if (!strcmp(c->accel, "kvm"))
		c->vm.accel = VM_ACCEL_KVM;
	else if (!strcmp(c->accel, "tcg"))
		c->vm.accel = VM_ACCEL_TCG;
	else
		return kiln_err_set(err, KERR_USAGE, "--accel: expected auto, kvm or tcg, got \"%s\"", c->accel);
	c->vm.accel = vm_accel_resolve(c->vm.accel, err);
	if (c->vm.accel == VM_ACCEL_AUTO)
		return -1;
	if (!common_image_dir(c))
		return kiln_err_set(err, KERR_IMAGE_MISSING, "cannot find the image directory: give --image-dir");
	if (image_path(c->kernel, sizeof(c->kernel), c->image_dir, "vmlinux", err) < 0 ||
	    image_path(c->initrd, sizeof(c->initrd), c->image_dir, "initramfs.cpio", err) < 0 ||
	    image_path(c->disk, sizeof(c->disk), c->image_dir, "rootfs.ext4", err) < 0)
		return -1;
	c->vm.kernel = c->kernel;
	c->vm.initrd = c->initrd;
	c->vm.disk = c->disk;
	c->vm.disk_format = "raw";
	/* Every QEMU this process starts is jailed unless asked otherwise. */
	if (!c->no_jail) {
		if (vm_jail_config(&c->jail, c->vm.qemu, c->vm.accel, err) < 0) {
			snprintf(err->message + strlen(err->message), sizeof(err->message) - strlen(err->message),
				 " (the jail needs root and cgroup v1; --no-jail runs QEMU unconfined)");
			return -1;
		}
		c->vm.jail = &c->jail;
	}
	return 0;
}

static int parse_uint(const char *s, unsigned min, unsigned max, unsigned *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = (unsigned)v;
	return 0;
}

static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "spec", required_argument, 0, 's' }, { "output-dir", required_argument, 0, 'o' },
		{ "stream", no_argument, 0, 'S' },     { "boot-timeout", required_argument, 0, 'b' },
		{ "cold", no_argument, 0, 'c' },       { "help", no_argument, 0, 'h' },
		COMMON_OPTIONS,                        { 0, 0, 0, 0 },
	};
	static struct common cm;
	static struct snapshot snap;
	const char *spec_path = NULL;
	struct run_opts ro = { .boot_timeout_s = 60 };
	struct task_spec spec;
	struct kiln_err err = { .code = "" };
	json_t *result;
	const char *state;
	size_t len;
	char *text;
	int c, status, cold = 0;
	unsigned bt;

	common_init(&cm);
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (common_opt(&cm, c, optarg))
			continue;
		switch (c) {
		case 's': spec_path = optarg; break;
		case 'o': ro.output_dir = optarg; break;
		case 'S': ro.stream = stdout; break;
		case 'c': cold = 1; break;
		case 'b':
			if (parse_uint(optarg, 1, 3600, &bt) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--boot-timeout: expected 1..3600 seconds");
				return print_error(&err, 2);
			}
			ro.boot_timeout_s = (int)bt;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!spec_path || optind != argc) {
		usage(stderr);
		return 2;
	}
	if (common_finish(&cm, &err) < 0)
		return print_error(&err, err.errc == KERR_USAGE ? 2 : 3);
	ro.vm = cm.vm;

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
	/* SIGINT/SIGTERM/SIGHUP end the run cleanly (VM destroyed, its directory
	 * removed, a result with error "interrupted") instead of killing us
	 * mid-way; SIGKILL is left to vm_reap_stale. */
	{
		sigset_t set;

		sigemptyset(&set);
		sigaddset(&set, SIGINT);
		sigaddset(&set, SIGTERM);
		sigaddset(&set, SIGHUP);
		sigprocmask(SIG_BLOCK, &set, NULL);
		ro.vm.cancel_fd = signalfd(-1, &set, SFD_CLOEXEC);
	}
	if (!cold) {
		char key[17];
		struct kiln_err serr = { .code = "" };

		/* A matching, intact snapshot makes this a restore; a damaged one is
		 * rebuilt (never used half-working). */
		if (snapshot_key(&ro.vm, spec.memory_mib, spec.vcpus, key, &serr) == 0) {
			int r = snapshot_open(cm.cache, key, &snap, &serr);

			if (r == -EBADMSG) {
				fprintf(stderr, "kiln-host: %s; rebuilding it\n", serr.message);
				r = snapshot_create(&ro.vm, cm.cache, spec.memory_mib, spec.vcpus, 1, &snap, &serr);
				if (r < 0)
					fprintf(stderr, "kiln-host: snapshot rebuild failed (%s); cold boot\n", serr.message);
			}
			if (r == 0)
				ro.snap = &snap;
		}
	}
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

static int cmd_snapshot(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "image", required_argument, 0, 'i' }, { "memory", required_argument, 0, 'm' },
		{ "vcpus", required_argument, 0, 'v' }, { "force", no_argument, 0, 'f' },
		COMMON_OPTIONS, { 0, 0, 0, 0 },
	};
	static struct common cm;
	struct kiln_err err = { .code = "" };
	unsigned mem = 256, vcpus = 1;
	int force = 0;
	const char *sub;
	int c;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	sub = argv[1];
	common_init(&cm);
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (common_opt(&cm, c, optarg))
			continue;
		switch (c) {
		case 'i':
			if (strcmp(optarg, "default")) {
				kiln_err_set(&err, KERR_USAGE, "--image: only \"default\" exists");
				return print_error(&err, 2);
			}
			break;
		case 'm':
			if (parse_uint(optarg, 128, 16384, &mem) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--memory: expected 128..16384 MiB");
				return print_error(&err, 2);
			}
			break;
		case 'f':
			force = 1;
			break;
		case 'v':
			if (parse_uint(optarg, 1, 16, &vcpus) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--vcpus: expected 1..16");
				return print_error(&err, 2);
			}
			break;
		default: usage(stderr); return 2;
		}
	}
	if (!strcmp(sub, "list") && optind == argc) {
		snapshot_list(cm.cache, stdout);
		return 0;
	}
	if (!strcmp(sub, "rm") && optind < argc) {
		for (int i = optind; i < argc; i++)
			if (snapshot_rm(cm.cache, argv[i], &err) < 0) {
				fprintf(stderr, "kiln-host: %s\n", err.message);
				return 1;
			}
		return 0;
	}
	if (!strcmp(sub, "prune") && optind == argc) {
		if (common_finish(&cm, &err) < 0)
			return print_error(&err, 3);
		printf("%d snapshot(s) removed\n", snapshot_prune(&cm.vm, cm.cache, stdout));
		return 0;
	}
	if (!strcmp(sub, "create") && optind == argc) {
		struct snapshot s;

		char key[17];

		if (common_finish(&cm, &err) < 0)
			return print_error(&err, 3);
		/* An intact snapshot for these inputs is reused unless --force. */
		if (!force && snapshot_key(&cm.vm, mem, vcpus, key, &err) == 0 && snapshot_open(cm.cache, key, &s, &err) == 0) {
			fprintf(stderr, "[snapshot] %s is up to date (--force rebuilds it)\n", key);
			printf("%s\n", key);
			return 0;
		}
		vm_reap_stale(cm.vm.run_dir);
		if (snapshot_create(&cm.vm, cm.cache, mem, vcpus, 1, &s, &err) < 0) {
			fprintf(stderr, "kiln-host: snapshot create: %s\n", err.message);
			return 3;
		}
		printf("%s\n", s.key);
		return 0;
	}
	usage(stderr);
	return 2;
}

/* --listen / "listen": ADDRESS:PORT into host (cap bytes) and port. */
static int parse_listen(const char *arg, char *host, size_t cap, int *port)
{
	const char *colon = strrchr(arg, ':');
	unsigned p;

	if (!colon || (size_t)(colon - arg) >= cap || colon == arg || parse_uint(colon + 1, 1, 65535, &p) < 0)
		return -1;
	memcpy(host, arg, (size_t)(colon - arg));
	host[colon - arg] = '\0';
	*port = (int)p;
	return 0;
}

/* ---- serve: the daemon ---- */

/* What serve_main owns while the daemon runs. */
struct serve_state {
	const struct serve_opts *o;
	struct run_opts ro;
	struct capacity cap;
	struct template_store *templates;
	struct template_use def;     /* the default template, held for POST /v1/run and legacy callers */
	struct net_host net;
	struct hostd *hostd;
	struct session_table *sessions;
	struct template_builds *builds;
	struct heartbeat *heartbeat;
};

static uint64_t mem_total_mib(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

	return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize >> 20 : 1024;
}

/* SIGHUP: reread the configuration file's S3 settings (a fixed secret takes
 * effect without a restart; everything else needs one). */
static void reload_s3(struct serve_state *s)
{
	struct host_config c;
	struct kiln_err err = { .code = "" };

	if (!s->o->config_path) {
		fprintf(stderr, "kiln-host: SIGHUP: no configuration file to reread\n");
		return;
	}
	if (config_load(s->o->config_path, &c, &err) < 0) {
		fprintf(stderr, "kiln-host: SIGHUP: %s (keeping the current settings)\n", err.message);
		return;
	}
	if (!c.s3.endpoint) {
		fprintf(stderr, "kiln-host: SIGHUP: %s has no s3 section (keeping the current settings)\n",
			s->o->config_path);
	} else {
		hostd_set_s3(s->hostd, &c.s3);
		fprintf(stderr, "kiln-host: SIGHUP: S3 settings reloaded from %s\n", s->o->config_path);
	}
	config_free(&c);
}

/* Refill threads by default: half the CPUs, 1 to 4 (docs: pool.refills). */
static unsigned refills_for(long ncpu)
{
	long n = ncpu / 2;

	return (unsigned)(n < 1 ? 1 : n > 4 ? 4 : n);
}

/* A PEM file of at most 1 MiB for the TLS listener; malloc'd text or NULL
 * with err set. */
static char *read_pem(const char *path, const char *what, struct kiln_err *err)
{
	size_t n = 0;
	char *p = io_read_file(path, 1u << 20, &n);

	if (!p || !n || !strstr(p, "-----BEGIN ")) {
		kiln_err_set(err, KERR_CONFIG, "%s: %s %s", what, path, p && n ? "is not PEM" : "cannot be read");
		free(p);
		return NULL;
	}
	return p;
}

static int read_tls(const struct serve_opts *o, char **cert, char **key, struct kiln_err *err)
{
	if (!o->tls_cert_file || !o->tls_key_file)
		return kiln_err_set(err, KERR_USAGE, "TLS needs both a certificate and its key (--tls-cert, --tls-key)");
	if (!(*cert = read_pem(o->tls_cert_file, "tls.cert_file", err)) ||
	    !(*key = read_pem(o->tls_key_file, "tls.key_file", err))) {
		free(*cert);
		*cert = NULL;
		return -1;
	}
	return 0;
}

/* kiln-host serve: reap what a crashed predecessor left, prepare the default
 * snapshot (and the one with a NIC for egress) and the warm pool, open hostd
 * (which recovers the spool) and the sessions, serve HTTP, register with
 * kiln-api, and run until SIGINT/SIGTERM (SIGHUP rereads S3 settings).
 * Returns the process exit status. */
static int serve_main(const struct serve_opts *o, const struct run_opts *ro)
{
	struct serve_state s = { .o = o, .ro = *ro };
	struct serve_http *http = NULL;
	struct serve_http_config http_cfg;
	struct kiln_err err = { .code = "" };
	struct hostd_config hc;
	char *tls_cert = NULL, *tls_key = NULL;
	sigset_t set;
	int sig, rc = 3;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	if (!o->token || !o->token[0]) {
		fprintf(stderr, "kiln-host: serve needs a cluster token (--token, or token/token_file in the config)\n");
		return 2;
	}
	/* TLS material is read first: a bad file is said before minutes of start-up. */
	if ((o->tls_cert_file || o->tls_key_file) && read_tls(o, &tls_cert, &tls_key, &err) < 0) {
		fprintf(stderr, "kiln-host: %s\n", err.message);
		return 2;
	}
	/* The host's TSC rate (50 ms, once per process) is measured here, not
	 * on whichever VM start comes first: that may be a task's restore. */
	(void)vm_host_tsc_khz();
	pthread_mutex_init(&s.cap.lock, NULL);
	s.ro.cap = &s.cap;
	s.cap.budget_mib = o->memory_capacity_mib ? o->memory_capacity_mib : mem_total_mib() * 8 / 10;
	s.cap.total_mib = (uint64_t)((double)s.cap.budget_mib * (o->memory_overcommit > 0 ? o->memory_overcommit : 1.0));
	s.cap.memcg = ro->vm.jail ? ro->vm.jail->cg_memory : NULL;
	/* Signals are taken synchronously below (sigwait). */
	fs_daemon_start(&set);
	if (o->s3 || (o->api && o->api->n))
		s3_global_init();

	vm_reap_stale(ro->vm.run_dir);
	if (net_host_init(&s.net, o->network, &err) < 0)
		goto fail;
	if (s.net.enabled)
		s.ro.net = &s.net;
	{
		/* Templates: the default one's snapshots (with a NIC too when
		 * egress is on) and pool are made now; others on first use. */
		struct template_store_config tc = {
			.image_dir = o->image_dir, .cache = o->cache, .base = &ro->vm, .snap_memory_mib = o->snap_memory_mib,
			.snap_vcpus = o->snap_vcpus, .cold = o->cold, .net = s.net.enabled, .pools = o->template_pools,
			.default_pool = o->pool_size,
			.default_pool_max = o->pool_max >= 0 ? (unsigned)o->pool_max : o->pool_size * 4, .prestart = o->prestart,
			/* A refill is CPU under TCG: by default half the cores may refill. */
			.pool_refills = o->pool_refills ? o->pool_refills : refills_for(ncpu),
			.disk_budget_mib = o->disk_budget_mib,
			.snapshot_ttl_s = o->snapshot_ttl_s, .cap = &s.cap, .ops = &vm_ops_real, .clk = &clock_system,
			.verbose = 1,
		};

		s.templates = template_store_open(&tc, &err);
		if (!s.templates)
			goto fail;
		if (template_acquire(s.templates, NULL, s.net.enabled, NULL, &s.def, &err) < 0)
			goto fail;
		s.ro.snap = s.def.snap;
		s.ro.net_snap = s.def.net_snap;
		s.ro.pool = s.def.pool;
		template_store_gc(s.templates, 1);
	}
	hc = (struct hostd_config){
		.host_id = o->host_id,
		.spool_dir = o->spool_dir,
		.vcpus_total = (unsigned)((o->vcpus_capacity ? o->vcpus_capacity : (unsigned)(ncpu > 0 ? ncpu : 1)) *
					  (o->cpu_overcommit > 0 ? o->cpu_overcommit : SERVE_CPU_OVERCOMMIT)),
		.vcpus_idle_max = o->idle_vcpus,
		.s3 = o->s3,
		.dest_allow = o->dest_allow,
		.upload_workers = o->upload_workers,
		.max_backoff_s = o->max_backoff_s,
		.inline_log_max = o->upload_inline_max,
		.retention_s = o->retention_s ? o->retention_s : 86400,
		.accel = vm_accel_name(ro->vm.accel),
		.templates = s.templates,
	};
	s.hostd = hostd_open(&hc, &s.ro, &s.cap, s.ro.pool, &vm_ops_real, &clock_system, &err);
	if (!s.hostd)
		goto fail;
	s.sessions = sessions_open(s.hostd, o->host_id, o->spool_dir, &err);
	if (!s.sessions || sessions_set_idle_stop(s.sessions, o->session_idle_stop_ms, &err) < 0)
		goto fail;
	/* Unset: as the host starts QEMUs ahead for restores (prestart). */
	sessions_set_prestart(s.sessions, o->session_prestart >= 0 ? o->session_prestart : o->prestart > 0);
	sessions_set_save_pages(s.sessions, o->session_save_pages < 0 ? 1 : o->session_save_pages);
	/* The default template's snapshots are ready: their base RAM goes to
	 * S3 now, in the background, rather than on the first pause. */
	sessions_set_prepare_base(s.sessions, o->session_prepare_base != 0);
	sessions_prepare_base(s.sessions, s.def.snap);
	sessions_prepare_base(s.sessions, s.def.net_snap);
	if (sessions_set_pause_cache(s.sessions, o->spool_dir, o->session_pause_cache_mib, o->session_pause_cache_age_s,
				     o->session_pause_cache_sweep_s) < 0)
		fprintf(stderr, "kiln-host: %s/pause-cache: %s (resumes fetch every chunk from S3)\n", o->spool_dir,
			strerror(errno));
	{
		char work[PATH_MAX];
		struct template_builds_config bc = { .d = s.hostd, .templates = s.templates, .mirror = o->mirror, .work_dir = work };

		snprintf(work, sizeof(work), "%s/builds", o->spool_dir);
		s.builds = template_builds_open(&bc, &err);
		if (!s.builds)
			goto fail;
	}
	http_cfg = (struct serve_http_config){
		.host_id = o->host_id, .token = o->token, .listen_host = o->listen_host, .addr = o->addr,
		.port = o->port, .connection_timeout_s = o->connection_timeout_s, .max_connections = o->max_connections,
		.max_connections_per_address = o->max_connections_per_address, .ro = &s.ro, .hostd = s.hostd,
		.sessions = s.sessions, .builds = s.builds, .tls_cert = tls_cert, .tls_key = tls_key,
	};
	http = serve_http_start(&http_cfg, &err);
	if (!http)
		goto fail;
	if (o->api && o->api->n) {
		char adv[128];

		snprintf(adv, sizeof(adv), "%s://%s:%d", tls_cert ? "https" : "http", o->listen_host, o->port);
		s.heartbeat = heartbeat_start(s.hostd, o->api, o->host_id, o->advertise ? o->advertise : adv, o->token,
					      o->api_ca_file, o->heartbeat_ms, &err);
		if (!s.heartbeat)
			goto fail;
	}
	fprintf(stderr,
		"kiln-host: %s serving on http://%s:%d (pool %u, pre-started %u, capacity %u vCPUs, %llu MiB (budget "
		"%llu MiB x %g), spool %s, S3 %s, egress %s)\n",
		o->host_id, o->listen_host, o->port, o->pool_size, o->prestart, hc.vcpus_total,
		(unsigned long long)s.cap.total_mib, (unsigned long long)s.cap.budget_mib,
		o->memory_overcommit > 0 ? o->memory_overcommit : 1.0, o->spool_dir, o->s3 ? o->s3->endpoint : "none",
		s.net.enabled ? "on" : "off");
	for (;;) {
		if (sigwait(&set, &sig) != 0)
			continue;
		if (sig != SIGHUP)
			break;
		reload_s3(&s);
	}
	fprintf(stderr, "kiln-host: %s: shutting down\n", strsignal(sig));
	rc = 0;
fail:
	/* Streams and running tasks end first, then the HTTP threads, then the rest. */
	heartbeat_stop(s.heartbeat);
	if (rc == 0)
		hostd_stop(s.hostd);
	template_builds_stop(s.builds);
	serve_http_stop(http);
	template_builds_close(s.builds);
	sessions_close(s.sessions);
	hostd_close(s.hostd);
	if (s.templates) {
		template_release(s.templates, &s.def);
		template_store_close(s.templates); /* its pools and snapshots */
	}
	net_host_fini(&s.net);
	free(tls_cert); /* after the daemon that served with them */
	free(tls_key);
	if (rc)
		fprintf(stderr, "kiln-host: %s\n", err.message);
	return rc;
}

/* Settings from the configuration file first; flags parsed afterwards win. */
static int serve_apply_config(const struct host_config *hc, struct serve_opts *so, struct common *cm, char *host,
			      size_t hostcap, struct kiln_err *err)
{
	if (hc->listen && parse_listen(hc->listen, host, hostcap, &so->port) < 0)
		return kiln_err_set(err, KERR_USAGE, "config: listen: expected ADDRESS:PORT");
	if (hc->listen)
		so->listen_host = host;
	if (hc->host_id)
		so->host_id = hc->host_id;
	if (hc->token)
		so->token = hc->token;
	if (hc->spool_dir)
		so->spool_dir = hc->spool_dir;
	if (hc->api.n)
		so->api = &hc->api;
	if (hc->advertise_url)
		so->advertise = hc->advertise_url;
	if (hc->api_ca_file)
		so->api_ca_file = hc->api_ca_file;
	if (hc->tls_cert_file) {
		so->tls_cert_file = hc->tls_cert_file;
		so->tls_key_file = hc->tls_key_file;
	}
	so->heartbeat_ms = hc->heartbeat_ms;
	if (hc->accel)
		cm->accel = hc->accel;
	if (hc->image_dir)
		cm->image_dir = hc->image_dir;
	if (hc->run_dir)
		cm->vm.run_dir = hc->run_dir;
	if (hc->cache)
		cm->cache = hc->cache;
	if (hc->qemu)
		cm->vm.qemu = hc->qemu;
	if (hc->vcpus)
		so->vcpus_capacity = hc->vcpus;
	if (hc->cpu_overcommit > 0)
		so->cpu_overcommit = hc->cpu_overcommit;
	if (hc->idle_vcpus)
		so->idle_vcpus = hc->idle_vcpus;
	if (hc->memory_mib)
		so->memory_capacity_mib = hc->memory_mib;
	if (hc->memory_overcommit > 0)
		so->memory_overcommit = hc->memory_overcommit;
	if (hc->pool_size >= 0)
		so->pool_size = (unsigned)hc->pool_size;
	if (hc->pool_max >= 0)
		so->pool_max = hc->pool_max;
	if (hc->pool_refills >= 0)
		so->pool_refills = (unsigned)hc->pool_refills;
	if (hc->prestart >= 0)
		so->prestart = (unsigned)hc->prestart;
	if (hc->snapshot_memory_mib >= 0)
		so->snap_memory_mib = (unsigned)hc->snapshot_memory_mib;
	if (hc->snapshot_vcpus >= 0)
		so->snap_vcpus = (unsigned)hc->snapshot_vcpus;
	if (hc->cold >= 0)
		so->cold = hc->cold;
	if (hc->s3.endpoint)
		so->s3 = &hc->s3;
	so->dest_allow = &hc->dest_allow;
	so->network = hc->network;
	so->template_pools = hc->template_pools;
	so->disk_budget_mib = hc->disk_budget_mib;
	if (hc->snapshot_ttl_set)
		so->snapshot_ttl_s = hc->snapshot_ttl_s;
	if (hc->session_idle_stop_set)
		so->session_idle_stop_ms = hc->session_idle_stop_ms;
	if (hc->session_prestart >= 0)
		so->session_prestart = hc->session_prestart;
	if (hc->session_save_pages >= 0)
		so->session_save_pages = hc->session_save_pages;
	if (hc->session_prepare_base >= 0)
		so->session_prepare_base = hc->session_prepare_base;
	if (hc->session_pause_cache_mib >= 0)
		so->session_pause_cache_mib = (unsigned)hc->session_pause_cache_mib;
	if (hc->session_pause_cache_age_s >= 0)
		so->session_pause_cache_age_s = (unsigned)hc->session_pause_cache_age_s;
	if (hc->session_pause_cache_sweep_s >= 0)
		so->session_pause_cache_sweep_s = (unsigned)hc->session_pause_cache_sweep_s;
	so->mirror = hc->mirror;
	so->upload_workers = hc->upload_workers;
	so->max_backoff_s = hc->max_backoff_s;
	if (hc->upload_inline_set)
		so->upload_inline_max = hc->upload_inline_max;
	so->retention_s = hc->retention_s;
	so->max_connections = hc->max_connections;
	so->max_connections_per_address = hc->max_connections_per_address;
	so->connection_timeout_s = hc->connection_timeout_s;
	return 0;
}

/* serve's settings before the configuration file and the flags; host_id
 * (cap bytes) receives the default host id (the host name). */
static void serve_defaults(struct serve_opts *so, char *host_id, size_t cap)
{
	*so = (struct serve_opts){ .listen_host = "127.0.0.1", .port = 7070, .snap_memory_mib = 256, .snap_vcpus = 1,
				   .prestart = 1, .spool_dir = "/var/lib/kiln/spool", .snapshot_ttl_s = 7 * 86400,
				   .pool_max = -1, .session_idle_stop_ms = 1500, .session_prestart = -1,
				   .session_save_pages = -1, .session_prepare_base = -1,
				   .session_pause_cache_mib = 1024, .session_pause_cache_age_s = 3600,
				   .session_pause_cache_sweep_s = 60, .upload_inline_max = HOSTD_INLINE_MAX_DEFAULT };
	if (gethostname(host_id, cap - 1) < 0 || !host_id[0])
		snprintf(host_id, cap, "host");
	so->host_id = host_id;
	so->token = getenv("KILN_CLUSTER_TOKEN");
}

/* kiln-host check-config FILE: the file through the real loader and
 * serve_apply_config over serve's defaults, then check_cmd_run. Never
 * starts QEMU. */
static int cmd_check_config(int argc, char **argv)
{
	static struct common cm;
	static struct host_config hc;
	static char host[64], host_id[65];
	struct serve_opts so;
	struct kiln_err err = { .code = "" };
	struct check_cmd_vm vm;
	int problems;

	if (argc != 2 || argv[1][0] == '-') {
		usage(stderr);
		return 2;
	}
	/* The settings (stdout) and the problems (stderr) stay in order when
	 * both go to one terminal or file. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	common_init(&cm);
	serve_defaults(&so, host_id, sizeof(host_id));
	if (config_load(argv[1], &hc, &err) < 0 || serve_apply_config(&hc, &so, &cm, host, sizeof(host), &err) < 0) {
		fprintf(stderr, "error: %s\nkiln-host: %s: 1 problem(s)\n", err.message, argv[1]);
		return 1;
	}
	so.config_path = argv[1];
	so.cache = cm.cache;
	common_image_dir(&cm);
	vm = (struct check_cmd_vm){ .accel = cm.accel, .image_dir = cm.image_dir, .run_dir = cm.vm.run_dir,
				    .cache = cm.cache, .qemu = cm.vm.qemu };
	problems = check_cmd_run(argv[1], &hc, &so, &vm);
	config_free(&hc);
	return problems ? 1 : 0;
}

static int cmd_serve(int argc, char **argv)
{
	enum { O_CONFIG = 'C', O_TOKEN = 't', O_HOST_ID = 'h', O_SPOOL = 's', O_VCPUS = 'v', O_OVERCOMMIT = 'o',
	       O_API = 'A', O_ADVERTISE = 'a', O_POOL_MAX = 'X', O_MEM_OVERCOMMIT = 'O', O_API_CA = 0x100,
	       O_TLS_CERT, O_TLS_KEY };
	static const struct option opts[] = {
		{ "config", required_argument, 0, O_CONFIG }, { "token", required_argument, 0, O_TOKEN },
		{ "api", required_argument, 0, O_API }, { "advertise", required_argument, 0, O_ADVERTISE },
		{ "host-id", required_argument, 0, O_HOST_ID }, { "spool-dir", required_argument, 0, O_SPOOL },
		{ "vcpus-capacity", required_argument, 0, O_VCPUS }, { "cpu-overcommit", required_argument, 0, O_OVERCOMMIT },
		{ "listen", required_argument, 0, 'l' }, { "pool", required_argument, 0, 'p' },
		{ "prestart", required_argument, 0, 'P' }, { "pool-max", required_argument, 0, O_POOL_MAX },
		{ "memory-capacity", required_argument, 0, 'M' }, { "snapshot-memory", required_argument, 0, 'm' },
		{ "memory-overcommit", required_argument, 0, O_MEM_OVERCOMMIT },
		{ "api-ca-file", required_argument, 0, O_API_CA }, { "tls-cert", required_argument, 0, O_TLS_CERT },
		{ "tls-key", required_argument, 0, O_TLS_KEY },
		{ "cold", no_argument, 0, 'c' }, COMMON_OPTIONS, { 0, 0, 0, 0 },
	};
	static struct common cm;
	static struct sockaddr_in addr;
	static struct host_config hc;
	static struct apilist flag_api;
	static char host[64], host_id[65];
	struct serve_opts so;
	struct run_opts ro = { .boot_timeout_s = 60 };
	struct kiln_err err = { .code = "" };
	unsigned v;
	int c;

	common_init(&cm);
	serve_defaults(&so, host_id, sizeof(host_id));
	/* The configuration file comes first, wherever --config stands. */
	for (int i = 1; i < argc; i++) {
		const char *path = NULL;

		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			path = argv[i + 1];
		else if (!strncmp(argv[i], "--config=", 9))
			path = argv[i] + 9;
		if (!path)
			continue;
		if (config_load(path, &hc, &err) < 0 || serve_apply_config(&hc, &so, &cm, host, sizeof(host), &err) < 0)
			return print_error(&err, 2);
		so.config_path = path;
		ro.out_max_entries = hc.out_max_entries;
		ro.out_max_depth = hc.out_max_depth;
	}
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (common_opt(&cm, c, optarg))
			continue;
		switch (c) {
		case O_CONFIG: break; /* read above */
		case O_TOKEN: so.token = optarg; break;
		case O_HOST_ID: so.host_id = optarg; break;
		case O_SPOOL: so.spool_dir = optarg; break;
		case O_API: /* the flag's URLs replace the config's; a second --api adds to the first */
			if (apilist_add(&flag_api, optarg, "--api", &err) < 0)
				return print_error(&err, 2);
			so.api = &flag_api;
			break;
		case O_ADVERTISE: so.advertise = optarg; break;
		case O_API_CA: so.api_ca_file = optarg; break;
		case O_TLS_CERT: so.tls_cert_file = optarg; break;
		case O_TLS_KEY: so.tls_key_file = optarg; break;
		case O_VCPUS:
			if (parse_uint(optarg, 1, 4096, &so.vcpus_capacity) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--vcpus-capacity: expected 1..4096");
				return print_error(&err, 2);
			}
			break;
		case O_OVERCOMMIT: {
			char *end;

			so.cpu_overcommit = strtod(optarg, &end);
			if (*end || !(so.cpu_overcommit >= 1 && so.cpu_overcommit <= 64)) {
				kiln_err_set(&err, KERR_USAGE, "--cpu-overcommit: expected 1..64");
				return print_error(&err, 2);
			}
			break;
		}
		case 'l':
			if (parse_listen(optarg, host, sizeof(host), &so.port) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--listen: expected ADDRESS:PORT");
				return print_error(&err, 2);
			}
			so.listen_host = host;
			break;
		case 'p':
			if (parse_uint(optarg, 0, 256, &so.pool_size) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--pool: expected 0..256");
				return print_error(&err, 2);
			}
			break;
		case O_POOL_MAX:
			if (parse_uint(optarg, 0, 256, &v) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--pool-max: expected 0..256");
				return print_error(&err, 2);
			}
			so.pool_max = (int)v;
			break;
		case 'P':
			if (parse_uint(optarg, 0, 256, &so.prestart) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--prestart: expected 0..256");
				return print_error(&err, 2);
			}
			break;
		case O_MEM_OVERCOMMIT: {
			char *end;

			so.memory_overcommit = strtod(optarg, &end);
			if (*end || !(so.memory_overcommit >= 1 && so.memory_overcommit <= 32)) {
				kiln_err_set(&err, KERR_USAGE, "--memory-overcommit: expected 1..32");
				return print_error(&err, 2);
			}
			break;
		}
		case 'M':
			if (parse_uint(optarg, 128, 1u << 30, &v) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--memory-capacity: expected MiB >= 128");
				return print_error(&err, 2);
			}
			so.memory_capacity_mib = v;
			break;
		case 'm':
			if (parse_uint(optarg, 128, 16384, &so.snap_memory_mib) < 0) {
				kiln_err_set(&err, KERR_USAGE, "--snapshot-memory: expected 128..16384 MiB");
				return print_error(&err, 2);
			}
			break;
		case 'c': so.cold = 1; break;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (!spool_id_ok(so.host_id)) {
		kiln_err_set(&err, KERR_USAGE, "host id \"%s\": expected 1-64 characters of [A-Za-z0-9_.-]", so.host_id);
		return print_error(&err, 2);
	}
	addr.sin_family = AF_INET;
	addr.sin_port = htons((uint16_t)so.port);
	if (inet_pton(AF_INET, so.listen_host, &addr.sin_addr) != 1) {
		kiln_err_set(&err, KERR_USAGE, "--listen: \"%s\" is not an IPv4 address", so.listen_host);
		return print_error(&err, 2);
	}
	so.addr = &addr;
	so.cache = cm.cache;
	if (common_finish(&cm, &err) < 0)
		return print_error(&err, 3);
	so.image_dir = cm.image_dir;
	/* The memory budget is real memory: every VM's cgroup sits under one
	 * parent limited to it, so a stampede of sandboxes touching their
	 * memory is OOM-killed there, never kiln-host or its neighbours. */
	if (!so.memory_capacity_mib)
		so.memory_capacity_mib = mem_total_mib() * 8 / 10;
	if (cm.vm.jail)
		cm.jail.memory_budget_bytes = so.memory_capacity_mib << 20;
	ro.vm = cm.vm;
	ro.vm.console_file = hc.debug_console > 0;
	if (hc.disk_set) {
		ro.vm.disk_bps = hc.disk_bps_mib << 20;
		ro.vm.disk_iops = hc.disk_iops;
	}
	return serve_main(&so, &ro);
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

/* kiln-host paths: the directories it would use, resolved as the other
 * commands resolve them (flags, else the defaults), without starting
 * anything: one JSON object on stdout. */
static int cmd_paths(int argc, char **argv)
{
	static const struct option opts[] = { COMMON_OPTIONS, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 } };
	static struct common cm; /* large (the jail config): not on the stack, as in the other commands */
	char exe[PATH_MAX];
	json_t *r;
	int c;

	common_init(&cm);
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (common_opt(&cm, c, optarg))
			continue;
		if (c == 'h') {
			usage(stdout);
			return 0;
		}
		usage(stderr);
		return 2;
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	common_image_dir(&cm);
	r = json_pack("{s:s, s:s?, s:s?, s:s, s:s, s:s}", "version", kiln_version(), "binary_dir",
		      paths_exe_dir(exe, sizeof(exe)) ? NULL : exe, "image_dir", cm.image_dir, "run_dir", cm.vm.run_dir,
		      "cache", cm.cache, "qemu", cm.vm.qemu);
	json_dumpf(r, stdout, JSON_INDENT(2));
	putchar('\n');
	json_decref(r);
	return 0;
}

int main(int argc, char **argv)
{
	/* A guest channel closing under a write must be an error, not a death. */
	signal(SIGPIPE, SIG_IGN);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "reap"))
		return cmd_reap(argc - 1, argv + 1);
	if (!strcmp(argv[1], "snapshot"))
		return cmd_snapshot(argc - 1, argv + 1);
	if (!strcmp(argv[1], "serve"))
		return cmd_serve(argc - 1, argv + 1);
	if (!strcmp(argv[1], "check-config"))
		return cmd_check_config(argc - 1, argv + 1);
	if (!strcmp(argv[1], "drain") || !strcmp(argv[1], "undrain"))
		return drain_cmd_main(argc - 1, argv + 1);
	if (!strcmp(argv[1], "template") && argc > 2 && !strcmp(argv[2], "import"))
		return oci_cmd_import(argc - 2, argv + 2);
	if (!strcmp(argv[1], "template"))
		return template_cmd_main(argc - 1, argv + 1);
	if (!strcmp(argv[1], "paths"))
		return cmd_paths(argc - 1, argv + 1);
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
		printf("kiln-host %s\n", kiln_version());
		return 0;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	fprintf(stderr, "kiln-host: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return 2;
}
