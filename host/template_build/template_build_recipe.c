/* template_build_recipe: a recipe template built in a build VM (docs/templates.md).
 * The customer's `run` steps and every package's maintainer scripts are
 * hostile code: they run only inside a jailed VM like any task's, as root of
 * that VM. The package steps reach only the Debian mirror; then the VM's
 * network is cut (net_sandbox_cut) and the files, `run` steps and image step
 * reach nothing: the mirror's addresses may be a CDN's, shared with any
 * site on it (a recipe carries no network policy of its own). The image the
 * guest writes is hostile data: the host never mounts or parses it, it only
 * truncates it to the size the guest names (bounded by max_bytes) and hands
 * it on.
 *
 * The VM boots from a qcow2 overlay over the base image (read-only backing)
 * whose virtual size is max_bytes; the guest grows its mounted ext4 online
 * (resize2fs), installs, writes, runs, then makes a fresh ext4 of its root
 * (a non-recursive bind mount: none of /proc, /dev, /tmp, /run, /kiln) with
 * mkfs.ext4 -d onto a second raw disk of max_bytes, sparse, made here. */
#include "template_build.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "net/net.h"
#include "proto.h"
#include "run/run.h"
#include "spec.h"
#include "vm/vm.h"

/* Free space the built image has on top of what it holds (+20%): what a
 * task of the template may write to its disk. */
#define BUILD_VM_FREE_MIB        256
#define BUILD_VM_BOOT_TIMEOUT_MS 120000
#define BUILD_VM_LINE_MAX        2048   /* longer lines of build output are cut */
#define BUILD_VM_OUTPUT_MIB      256    /* output one step may print (kiln-init's cap) */
#define BUILD_VM_STAGE           "/tmp/kiln-build"
#define BUILD_VM_SUITE           "bookworm"
/* How many bytes of paths one EXEC that installs staged files carries. */
#define BUILD_VM_INSTALL_BATCH   (64 * 1024)

static const char build_vm_size_tag[] = "KILN_IMAGE_BYTES=";
static const char build_vm_large_tag[] = "KILN_TOO_LARGE=";

struct build_vm {
	const struct template_build_recipe_req *req;
	template_build_log_fn log;
	void *ctx;
	int64_t t0, deadline_ms;
	struct vm vm;
	struct net_sandbox *net;
	char scratch[PATH_MAX];   /* <out_ext4>.build/: the overlay and the second disk */
	char overlay[PATH_MAX], disk2[PATH_MAX];
	/* The step running now, for messages and its output lines. */
	const char *step;
	char line[BUILD_VM_LINE_MAX + 1];
	size_t line_len;
	char last_error[512];     /* apt's last "E: ..." line of the current step */
	char last_line[512];      /* its last non-empty line */
	int final_step;           /* the image step: its stdout carries the size */
	uint64_t image_bytes;     /* from build_vm_size_tag (0: none seen) */
	uint64_t too_large;       /* from build_vm_large_tag */
};

static void build_vm_log(struct build_vm *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void build_vm_log(struct build_vm *b, const char *fmt, ...)
{
	char line[BUILD_VM_LINE_MAX + 1];
	va_list ap;

	if (!b->log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	b->log(b->ctx, line);
}

static double build_vm_elapsed_s(const struct build_vm *b)
{
	return (double)(proto_now_ms() - b->t0) / 1000.0;
}

/* One whole line of guest output: to the log (as valid UTF-8), and the
 * markers this file looks for. The guest controls every byte of it. */
static void build_vm_line(struct build_vm *b)
{
	char *s;

	b->line[b->line_len] = '\0';
	if (b->line_len && b->line[b->line_len - 1] == '\r')
		b->line[--b->line_len] = '\0';
	if (!strncmp(b->line, "E: ", 3))
		snprintf(b->last_error, sizeof(b->last_error), "%s", b->line);
	if (b->line_len)
		snprintf(b->last_line, sizeof(b->last_line), "%s", b->line);
	if (b->final_step && !strncmp(b->line, build_vm_size_tag, sizeof(build_vm_size_tag) - 1)) {
		char *end;
		unsigned long long v;

		errno = 0;
		v = strtoull(b->line + sizeof(build_vm_size_tag) - 1, &end, 10);
		b->image_bytes = errno || *end ? 0 : (uint64_t)v;
	}
	if (b->final_step && !strncmp(b->line, build_vm_large_tag, sizeof(build_vm_large_tag) - 1))
		b->too_large = strtoull(b->line + sizeof(build_vm_large_tag) - 1, NULL, 10);
	s = textbuf_to_utf8(b->line, b->line_len);
	if (s && b->log)
		b->log(b->ctx, s);
	free(s);
	b->line_len = 0;
}

/* run_opts.on_event: the step's stdout and stderr, cut into lines. */
static void build_vm_on_event(void *ctx, int event, const void *data, size_t len)
{
	struct build_vm *b = ctx;
	const char *p = data;

	if (event != RUN_EV_STDOUT && event != RUN_EV_STDERR)
		return;
	for (size_t i = 0; i < len; i++) {
		if (p[i] == '\n') {
			build_vm_line(b);
			continue;
		}
		if (b->line_len == BUILD_VM_LINE_MAX)
			build_vm_line(b); /* a line this long is cut in pieces */
		b->line[b->line_len++] = p[i];
	}
}

static int build_vm_cancelled(const struct build_vm *b)
{
	struct pollfd p = { .fd = b->req->cancel_fd, .events = POLLIN };

	return b->req->cancel_fd >= 0 && poll(&p, 1, 0) > 0;
}

/* The common error of a step whose VM failed, timed out or was cancelled. */
static int build_vm_vm_failed(struct build_vm *b, const struct kiln_err *e, struct kiln_err *err)
{
	if (build_vm_cancelled(b) || e->errc == KERR_INTERRUPTED)
		return kiln_err_set(err, KERR_CANCELLED, "the build was cancelled (during %s)", b->step);
	if (proto_now_ms() >= b->deadline_ms)
		return kiln_err_set(err, KERR_BUILD_TIMEOUT, "the build ran past its %u s timeout (during %s)",
				    b->req->timeout_s, b->step);
	*err = *e;
	return -1;
}

/* Seconds left of the build, at least 1. */
static uint32_t build_vm_left_s(const struct build_vm *b)
{
	int64_t left = (b->deadline_ms - proto_now_ms() + 999) / 1000;

	return left < 1 ? 1 : (uint32_t)left;
}

/* Run argv as root in the build VM, its output into the log. 0 when it exited
 * 0; else -1 with err: build_failed naming the step ("run[2] exited with
 * status 3"), build_timeout, cancelled, or the VM's error. */
static int build_vm_exec(struct build_vm *b, const char *step, char **argv, size_t argc, struct kiln_err *err)
{
	const struct recipe *recipe = b->req->recipe;
	char *env[RECIPE_MAX_ENV + 4];
	struct task_spec spec = { .argv = argv, .argc = argc, .env = env, .cwd = "/", .vcpus = b->req->vcpus,
				  .memory_mib = b->req->memory_mib, .output_mib = BUILD_VM_OUTPUT_MIB };
	struct run_opts ro = { .log_excerpt = 4096, .on_event = build_vm_on_event, .event_ctx = b, .user_set = 1,
			       .uid = 0, .gid = 0 };
	struct kiln_err e = { .code = "" };
	const char *state, *reason;
	json_t *res, *je;
	int rc = -1;

	if (build_vm_cancelled(b))
		return kiln_err_set(err, KERR_CANCELLED, "the build was cancelled (before %s)", step);
	if (proto_now_ms() >= b->deadline_ms)
		return kiln_err_set(err, KERR_BUILD_TIMEOUT, "the build ran past its %u s timeout (before %s)",
				    b->req->timeout_s, step);
	/* The recipe's env applies to its run steps, the build's own after it;
	 * never to the build's own steps. Before the network goes, those are
	 * apt's, and env is code there: APT_CONFIG names a file of hooks
	 * (APT::Update::Pre-Invoke), BASH_ENV and PERL5OPT run commands in any
	 * bash or perl a package's scripts start, so the customer's code would
	 * run while the mirror is reachable. */
	if (!strncmp(step, "run[", 4))
		for (size_t i = 0; i < recipe->nenv; i++)
			env[spec.nenv++] = recipe->env[i];
	env[spec.nenv++] = "DEBIAN_FRONTEND=noninteractive";
	env[spec.nenv++] = "HOME=/root";
	env[spec.nenv] = NULL;
	spec.timeout_s = build_vm_left_s(b);
	ro.vm.cancel_fd = b->req->cancel_fd;
	b->step = step;
	b->line_len = 0;
	b->last_error[0] = b->last_line[0] = '\0';
	res = run_session_exec(&b->vm, &spec, &ro);
	if (b->line_len)
		build_vm_line(b);
	state = json_string_value(json_object_get(res, "state"));
	reason = json_string_value(json_object_get(res, "end_reason"));
	je = json_object_get(res, "error");
	if (!state) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: no result", step);
	} else if (!strcmp(state, "succeeded")) {
		rc = 0;
	} else if (!strcmp(state, "timed_out")) {
		kiln_err_set(err, KERR_BUILD_TIMEOUT, "the build ran past its %u s timeout (during %s)",
			     b->req->timeout_s, step);
	} else if (!strcmp(state, "error")) {
		const char *code = json_string_value(json_object_get(je, "code"));

		kiln_err_set(&e, kiln_err_lookup(code) ?: KERR_VM_ERROR, "%s: %s", step,
			     json_string_value(json_object_get(je, "message")) ?: "the build VM failed");
		build_vm_vm_failed(b, &e, err);
	} else if (reason && !strcmp(reason, "exited")) {
		json_int_t st = json_integer_value(json_object_get(res, "exit_code"));
		/* apt's own error, else (for the build's own steps, not the
		 * recipe's run steps, whose output is the customer's) the last
		 * line the step printed. */
		const char *why = b->last_error[0] ? b->last_error : strncmp(step, "run[", 4) ? b->last_line : "";
		char *text = textbuf_to_utf8(why, strlen(why));

		kiln_err_set(err, KERR_BUILD_FAILED, "%s exited with status %d%s%s", step, (int)st,
			     text && *text ? ": " : "", text ? text : "");
		free(text);
	} else if (reason && !strcmp(reason, "signaled")) {
		kiln_err_set(err, KERR_BUILD_FAILED, "%s was killed by %s", step,
			     json_string_value(json_object_get(res, "signal")) ?: "a signal");
	} else {
		kiln_err_set(err, KERR_BUILD_FAILED, "%s failed (%s)", step, reason ? reason : state);
	}
	json_decref(res);
	return rc;
}

static int build_vm_sh(struct build_vm *b, const char *step, const char *script, struct kiln_err *err)
{
	char *argv[] = { "/bin/sh", "-c", (char *)script, NULL };

	return build_vm_exec(b, step, argv, 3, err);
}

/* Put data into the guest as a file of the task user (FILE), to be installed
 * as root by build_vm_install. */
static int build_vm_stage(struct build_vm *b, const char *staged, const void *data, size_t len, struct kiln_err *err)
{
	struct kiln_err e = { .code = "" };

	if (run_session_put(&b->vm, staged, data, len, 0600, &e) < 0)
		return build_vm_vm_failed(b, &e, err);
	return 0;
}

/* Install staged files as root: argv holds, after the script, triples of
 * mode, staged path and destination. */
static const char build_vm_install_sh[] =
	"set -e; while [ $# -gt 0 ]; do install -D -o 0 -g 0 -m \"$1\" -- \"$2\" \"$3\"; rm -f -- \"$2\"; shift 3; done";

/* The recipe's files (and the build's own: sources.list, preload), each
 * staged then installed as root with its mode, in batches of one EXEC. */
struct build_vm_file {
	const char *path;
	const void *data;
	size_t len;
	uint32_t mode;
};

static int build_vm_write_files(struct build_vm *b, const char *step, const struct build_vm_file *files, size_t n,
			  struct kiln_err *err)
{
	size_t i = 0;

	while (i < n) {
		char **argv = calloc(4 + 3 * 300 + 1, sizeof(char *));
		char (*names)[2][64] = calloc(300, sizeof(*names));
		size_t argc = 0, bytes = 0, k = 0;
		int rc = 0;

		if (!argv || !names) {
			free(argv);
			free(names);
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		}
		argv[argc++] = "/bin/sh";
		argv[argc++] = "-c";
		argv[argc++] = (char *)build_vm_install_sh;
		argv[argc++] = "sh";
		for (; i < n && k < 300 && (k == 0 || bytes + strlen(files[i].path) < BUILD_VM_INSTALL_BATCH); i++, k++) {
			snprintf(names[k][0], sizeof(names[k][0]), "%04o", (unsigned)(files[i].mode & 07777));
			snprintf(names[k][1], sizeof(names[k][1]), BUILD_VM_STAGE "/f%zu", i);
			if (build_vm_stage(b, names[k][1], files[i].data, files[i].len, err) < 0) {
				rc = -1;
				break;
			}
			argv[argc++] = names[k][0];
			argv[argc++] = names[k][1];
			argv[argc++] = (char *)files[i].path;
			bytes += strlen(files[i].path) + 80;
		}
		argv[argc] = NULL;
		if (rc == 0)
			rc = build_vm_exec(b, step, argv, argc, err);
		free(argv);
		free(names);
		if (rc < 0)
			return -1;
	}
	return 0;
}

/* Host and port of the mirror URL as an egress rule ("deb.debian.org:80"),
 * checked by the spec parser like any task's rule. */
static int build_vm_mirror_rule(const char *mirror, struct task_spec *rs, struct kiln_err *err)
{
	const char *p = mirror, *host, *end;
	unsigned port;
	char rule[300];
	json_t *j;
	char *text;
	int r;

	if (!strncmp(p, "http://", 7))
		p += 7, port = 80;
	else if (!strncmp(p, "https://", 8))
		p += 8, port = 443;
	else
		return kiln_err_set(err, KERR_CONFIG, "mirror %s: expected an http:// or https:// URL", mirror);
	host = p;
	end = host + strcspn(host, ":/");
	if (*end == ':')
		port = (unsigned)strtoul(end + 1, NULL, 10);
	if (end == host || end - host > SPEC_MAX_NET_HOST || !port || port > 65535)
		return kiln_err_set(err, KERR_CONFIG, "mirror %s: no host or a bad port", mirror);
	snprintf(rule, sizeof(rule), "%.*s:%u", (int)(end - host), host, port);
	j = json_pack("{s:[s], s:{s:s, s:[s]}}", "argv", "true", "network", "egress", "allow", "allow", rule);
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!text)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r = spec_parse(text, strlen(text), rs, err);
	free(text);
	if (r < 0)
		return kiln_err_set(err, KERR_CONFIG, "mirror %s: %s", mirror, err->message);
	return 0;
}

/* The guest's last step: clean up, then a fresh ext4 of its root onto the
 * second disk (found by its serial), sized to what it holds + 20% + free
 * space, with inodes for every file and then some. It prints the size, or
 * that it does not fit the disk. */
static const char build_vm_image_sh[] =
	"set -e\n"
	"if command -v apt-get > /dev/null; then apt-get clean; fi\n"
	"rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin " BUILD_VM_STAGE "\n"
	": > /etc/resolv.conf\n"
	"dev=\n"
	"for d in /sys/block/vd*; do\n"
	"  [ \"$(cat \"$d/serial\" 2> /dev/null)\" = \"$1\" ] && dev=/dev/${d##*/}\n"
	"done\n"
	"[ -n \"$dev\" ] || { echo 'no output disk' >&2; exit 1; }\n"
	"mnt=/run/kiln-build-root\n"
	"mkdir -p $mnt\n"
	"mount --bind / $mnt\n" /* not --rbind: no /proc, /dev, /tmp, /run or /kiln */
	"used=$(du -sxk $mnt | cut -f1)\n"
	"files=$(find $mnt -xdev | wc -l)\n"
	"kib=$(( (used + used / 5 + $2 * 1024 + 3) / 4 * 4 ))\n"
	"max=$(( $(blockdev --getsize64 $dev) / 1024 ))\n"
	"echo \"[build] root holds $((used / 1024)) MiB in $files files; image $((kib / 1024)) MiB\"\n"
	"if [ $kib -gt $max ]; then echo \"" "KILN_TOO_LARGE=" "$((kib * 1024))\"; exit 3; fi\n"
	"inodes=$(( files + files / 2 + 8192 ))\n"
	"mkfs.ext4 -q -F -L kiln-root -O ^has_journal -N $inodes -d $mnt $dev ${kib}k\n"
	"sync\n"
	"umount $mnt\n"
	"echo \"" "KILN_IMAGE_BYTES=" "$((kib * 1024))\"\n";

static int build_vm_boot(struct build_vm *b, struct kiln_err *err)
{
	const struct template_build_recipe_req *q = b->req;
	struct vm_config cfg = q->ro->vm;
	struct proto_frame f;
	struct proto_hello h;
	struct kiln_err e = { .code = "" };
	struct task_spec rs = { 0 };
	int64_t deadline;

	if (q->recipe->npackages) {
		if (!q->ro->net || !q->ro->net->enabled)
			return kiln_err_set(err, KERR_EGRESS_DISABLED,
					    "the recipe installs packages, which needs egress to the Debian mirror, "
					    "and egress is disabled on this host");
		if (build_vm_mirror_rule(q->mirror, &rs, err) < 0)
			return -1;
		build_vm_log(b, "[build] network: the mirror only (%s)", q->mirror);
		if (net_sandbox_start(q->ro->net, rs.net_rules, rs.nnet_rules, NULL, NULL, &b->net, &e) < 0) {
			spec_free(&rs);
			*err = e;
			return -1;
		}
		spec_free(&rs);
		cfg.net = 1;
		cfg.net_fd = net_sandbox_tap_fd(b->net);
	} else {
		cfg.net = 0;
	}
	cfg.disk = b->overlay;
	cfg.disk_format = "qcow2";
	cfg.disk_writable = 1;
	cfg.disk_backing = q->base_rootfs;
	cfg.disk_backing2 = NULL;
	cfg.disk2 = b->disk2;
	cfg.mem_file = NULL;
	cfg.mem_fd = 0;
	cfg.mem_ram = 0;
	cfg.incoming = 0;
	cfg.vcpus = q->vcpus;
	cfg.memory_mib = q->memory_mib;
	cfg.cancel_fd = q->cancel_fd;
	build_vm_log(b, "[build] booting (%u vCPU, %u MiB)", q->vcpus, q->memory_mib);
	b->step = "boot";
	if (vm_start(&cfg, &b->vm, &e) < 0)
		return build_vm_vm_failed(b, &e, err);
	deadline = proto_now_ms() + BUILD_VM_BOOT_TIMEOUT_MS;
	if (deadline > b->deadline_ms)
		deadline = b->deadline_ms;
	if (vm_recv(&b->vm, &f, deadline, &e) < 0)
		return build_vm_vm_failed(b, &e, err);
	if (f.type != PROTO_HELLO || proto_hello_decode(f.payload, f.len, &h) < 0 || h.version != PROTO_VERSION)
		return kiln_err_set(err, KERR_VM_ERROR, "the build VM's first frame was not a valid HELLO");
	if (vm_setup(&b->vm, proto_now_ms() + 10000, &e) < 0)
		return build_vm_vm_failed(b, &e, err);
	build_vm_log(b, "[build] booted in %.1f s", build_vm_elapsed_s(b));
	return 0;
}

/* The scratch directory next to out_ext4 (same file system: the image is
 * renamed into place, and the overlay and the second disk are not in the
 * run directory's tmpfs), the overlay over the base, the sparse second disk. */
static int build_vm_prepare(struct build_vm *b, const char *out_ext4, struct kiln_err *err)
{
	const struct template_build_recipe_req *q = b->req;
	char size[32];
	struct stat st;
	uint64_t vsize;
	int fd;

	if (snprintf(b->scratch, sizeof(b->scratch), "%s.build", out_ext4) >= (int)sizeof(b->scratch) - 16)
		return kiln_err_set(err, KERR_HOST_ERROR, "%s: path too long", out_ext4);
	snprintf(b->overlay, sizeof(b->overlay), "%s/root.qcow2", b->scratch);
	snprintf(b->disk2, sizeof(b->disk2), "%s/image.ext4", b->scratch);
	fs_rmtree(b->scratch);
	if (mkdir(b->scratch, 0700) < 0) {
		b->scratch[0] = '\0';
		return kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s.build: %s", out_ext4, strerror(errno));
	}
	if (stat(q->base_rootfs, &st) < 0)
		return kiln_err_set(err, KERR_IMAGE_MISSING, "%s: %s", q->base_rootfs, strerror(errno));
	/* Room for the build: as large as the image may be (QEMU's file size
	 * limit follows the second disk's size, which is max_bytes too). */
	vsize = q->max_bytes > (uint64_t)st.st_size ? q->max_bytes : (uint64_t)st.st_size;
	vsize = (vsize + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
	snprintf(size, sizeof(size), "%" PRIu64, vsize);
	{
		char *argv[] = { "/usr/bin/qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
				 (char *)q->base_rootfs, b->overlay, size, NULL };

		if (snapshot_run_cmd(argv) < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "qemu-img create %s failed", b->overlay);
	}
	fd = open(b->disk2, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)q->max_bytes) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", b->disk2, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* The guest's steps, in order. */
static int build_vm_steps(struct build_vm *b, struct kiln_err *err)
{
	const struct recipe *recipe = b->req->recipe;
	char step[64], free_mib[16], serial[] = "kiln-out";
	int64_t t;

	t = proto_now_ms();
	build_vm_log(b, "[build] growing the root file system to %" PRIu64 " MiB", b->req->max_bytes >> 20);
	if (build_vm_sh(b, "resize2fs", "resize2fs /dev/vda 2>&1", err) < 0)
		return -1;
	if (recipe->npackages) {
		char sources[1200];
		struct build_vm_file f = { .path = "/etc/apt/sources.list", .data = sources, .mode = 0644 };
		char **argv = calloc(recipe->npackages + 16, sizeof(char *));
		size_t argc = 0;
		int rc;

		f.len = (size_t)snprintf(sources, sizeof(sources), "deb %s " BUILD_VM_SUITE " main\n", b->req->mirror);
		if (f.len >= sizeof(sources)) {
			free(argv);
			return kiln_err_set(err, KERR_CONFIG, "mirror URL too long");
		}
		if (!argv)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		build_vm_log(b, "[build] apt-get update");
		if (build_vm_write_files(b, "sources.list", &f, 1, err) < 0 ||
		    build_vm_sh(b, "apt-get update",
				"rm -f /etc/apt/sources.list.d/*; exec apt-get -q -o Dpkg::Use-Pty=0"
				" -o Acquire::Languages=none update --error-on=any",
				err) < 0) {
			free(argv);
			return -1;
		}
		build_vm_log(b, "[build] apt-get install (%zu package%s)", recipe->npackages, recipe->npackages == 1 ? "" : "s");
		argv[argc++] = "apt-get";
		argv[argc++] = "-q";
		argv[argc++] = "-y";
		argv[argc++] = "-o";
		argv[argc++] = "Dpkg::Use-Pty=0";
		argv[argc++] = "install";
		argv[argc++] = "--no-install-recommends";
		argv[argc++] = "--";
		for (size_t i = 0; i < recipe->npackages; i++)
			argv[argc++] = recipe->packages[i];
		argv[argc] = NULL;
		rc = build_vm_exec(b, "apt-get install", argv, argc, err);
		free(argv);
		if (rc < 0)
			return -1;
		build_vm_log(b, "[build] packages installed in %.1f s", (double)(proto_now_ms() - t) / 1000.0);
		/* The mirror's addresses are shared (a CDN's): left up, the
		 * network would let a run step reach any site on that CDN with
		 * a Host header of its own. So nothing after the packages has
		 * a network; a failure to take it down ends the build. */
		b->step = "network off";
		if (net_sandbox_cut(b->net, err) < 0)
			return -1;
		build_vm_log(b, "[build] network: none from here on (files, run steps, image)");
	}
	if (recipe->nfiles) {
		struct build_vm_file *fs = calloc(recipe->nfiles, sizeof(*fs));

		if (!fs)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		for (size_t i = 0; i < recipe->nfiles; i++)
			fs[i] = (struct build_vm_file){ recipe->files[i].path, recipe->files[i].data, recipe->files[i].len,
							recipe->files[i].mode };
		build_vm_log(b, "[build] files: %zu", recipe->nfiles);
		if (build_vm_write_files(b, "files", fs, recipe->nfiles, err) < 0) {
			free(fs);
			return -1;
		}
		free(fs);
	}
	for (size_t i = 0; i < recipe->nrun; i++) {
		int64_t ts = proto_now_ms();

		snprintf(step, sizeof(step), "run[%zu]", i);
		build_vm_log(b, "[build] %s: %.200s%s", step, recipe->run[i], strlen(recipe->run[i]) > 200 ? "..." : "");
		{
			char *argv[] = { "/bin/sh", "-c", recipe->run[i], NULL };

			if (build_vm_exec(b, step, argv, 3, err) < 0)
				return -1;
		}
		build_vm_log(b, "[build] %s done in %.1f s", step, (double)(proto_now_ms() - ts) / 1000.0);
	}
	{
		/* Always written: an empty list imports nothing. */
		size_t len = 0;
		char *text;
		struct build_vm_file f = { .path = "/etc/kiln/preload", .mode = 0644 };

		for (size_t i = 0; i < recipe->npreload; i++)
			len += strlen(recipe->preload[i]) + 1;
		text = malloc(len + 1);
		if (!text)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		len = 0;
		for (size_t i = 0; i < recipe->npreload; i++)
			len += (size_t)sprintf(text + len, "%s\n", recipe->preload[i]);
		f.data = text;
		f.len = len;
		if (build_vm_write_files(b, "preload", &f, 1, err) < 0) {
			free(text);
			return -1;
		}
		free(text);
	}
	build_vm_log(b, "[build] making the image");
	t = proto_now_ms();
	snprintf(free_mib, sizeof(free_mib), "%u", BUILD_VM_FREE_MIB);
	b->final_step = 1;
	{
		char *argv[] = { "/bin/sh", "-c", (char *)build_vm_image_sh, "sh", serial, free_mib, NULL };

		if (build_vm_exec(b, "image", argv, 6, err) < 0) {
			b->final_step = 0;
			if (b->too_large)
				return kiln_err_set(err, KERR_TOO_LARGE, "the image needs %" PRIu64 " MiB, more than max_bytes (%" PRIu64 " MiB)",
						    b->too_large >> 20, b->req->max_bytes >> 20);
			return -1;
		}
	}
	b->final_step = 0;
	build_vm_log(b, "[build] image made in %.1f s", (double)(proto_now_ms() - t) / 1000.0);
	return 0;
}

/* The second disk becomes out_ext4: cut to the size the guest named (checked
 * here, never read), root's, 0444, renamed into place. Called with QEMU gone. */
static int build_vm_publish(struct build_vm *b, const char *out_ext4, struct kiln_err *err)
{
	uint64_t n = b->image_bytes;
	struct stat st;
	int fd;

	if (!n || n % 4096 || n > b->req->max_bytes)
		return kiln_err_set(err, n > b->req->max_bytes ? KERR_TOO_LARGE : KERR_VM_ERROR,
				    "the build VM named an image size of %" PRIu64 " bytes (max_bytes %" PRIu64 ")", n,
				    b->req->max_bytes);
	fd = open(b->disk2, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1)) {
		close(fd);
		fd = -1;
		errno = EINVAL;
	}
	if (fd < 0 || ftruncate(fd, (off_t)n) < 0 || fchown(fd, 0, 0) < 0 || fchmod(fd, 0444) < 0 || fsync(fd) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", b->disk2, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	if (rename(b->disk2, out_ext4) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "rename to %s: %s", out_ext4, strerror(errno));
	return 0;
}

int template_build_recipe(const struct template_build_recipe_req *req, const char *out_ext4,
			  struct template_build_meta *meta, template_build_log_fn log, void *ctx, struct kiln_err *err)
{
	struct build_vm *b = calloc(1, sizeof(*b));
	int rc = -1;

	memset(meta, 0, sizeof(*meta));
	if (!b)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	b->req = req;
	b->log = log;
	b->ctx = ctx;
	b->t0 = proto_now_ms();
	b->deadline_ms = b->t0 + (int64_t)req->timeout_s * 1000;
	b->vm.pid = b->vm.pidfd = b->vm.agent_fd = b->vm.qmp_fd = b->vm.envd_fd = b->vm.lock_fd = -1;
	b->vm.jail.slot_fd = -1;
	b->step = "prepare";
	if (!req->recipe || !req->base_rootfs || !req->ro || !req->max_bytes || req->max_bytes % 4096 || !req->timeout_s ||
	    !req->vcpus || !req->memory_mib || (req->recipe->npackages && !req->mirror)) {
		kiln_err_set(err, KERR_USAGE, "template_build_recipe: incomplete request");
		goto out;
	}
	if (build_vm_prepare(b, out_ext4, err) < 0 || build_vm_boot(b, err) < 0 || build_vm_steps(b, err) < 0)
		goto out;
	vm_destroy(&b->vm);
	if (build_vm_publish(b, out_ext4, err) < 0)
		goto out;
	meta->env = json_array();
	for (size_t i = 0; i < req->recipe->nenv; i++)
		json_array_append_new(meta->env, json_string(req->recipe->env[i]));
	snprintf(meta->workdir, sizeof(meta->workdir), "%s", req->recipe->workdir ? req->recipe->workdir : "");
	meta->uid = meta->gid = 1000;
	build_vm_log(b, "[build] done in %.1f s: image %" PRIu64 " MiB", build_vm_elapsed_s(b), b->image_bytes >> 20);
	rc = 0;
out:
	vm_destroy(&b->vm);
	if (b->net)
		net_sandbox_stop(b->net, NULL); /* after QEMU: nothing uses the tap any more */
	if (b->scratch[0])
		fs_rmtree(b->scratch);
	if (rc < 0)
		build_vm_log(b, "[build] failed after %.1f s: %s: %s", build_vm_elapsed_s(b), err->code, err->message);
	free(b);
	return rc;
}
