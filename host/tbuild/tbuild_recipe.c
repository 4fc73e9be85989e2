/* tbuild_recipe: a recipe template built in a build VM (docs/templates.md).
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
#include "tbuild.h"

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
#define TB_FREE_MIB        256
#define TB_BOOT_TIMEOUT_MS 120000
#define TB_LINE_MAX        2048   /* longer lines of build output are cut */
#define TB_OUTPUT_MIB      256    /* output one step may print (kiln-init's cap) */
#define TB_STAGE           "/tmp/kiln-build"
#define TB_SUITE           "bookworm"
/* How many bytes of paths one EXEC that installs staged files carries. */
#define TB_INSTALL_BATCH   (64 * 1024)

static const char tb_size_tag[] = "KILN_IMAGE_BYTES=";
static const char tb_large_tag[] = "KILN_TOO_LARGE=";

struct tb {
	const struct tbuild_recipe_req *req;
	tbuild_log_fn log;
	void *ctx;
	int64_t t0, deadline_ms;
	struct vm vm;
	struct net_sandbox *net;
	char scratch[PATH_MAX];   /* <out_ext4>.build/: the overlay and the second disk */
	char overlay[PATH_MAX], disk2[PATH_MAX];
	/* The step running now, for messages and its output lines. */
	const char *step;
	char line[TB_LINE_MAX + 1];
	size_t line_len;
	char last_error[512];     /* apt's last "E: ..." line of the current step */
	char last_line[512];      /* its last non-empty line */
	int final_step;           /* the image step: its stdout carries the size */
	uint64_t image_bytes;     /* from tb_size_tag (0: none seen) */
	uint64_t too_large;       /* from tb_large_tag */
};

static void tb_log(struct tb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_log(struct tb *b, const char *fmt, ...)
{
	char line[TB_LINE_MAX + 1];
	va_list ap;

	if (!b->log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	b->log(b->ctx, line);
}

static double tb_elapsed_s(const struct tb *b)
{
	return (double)(proto_now_ms() - b->t0) / 1000.0;
}

/* One whole line of guest output: to the log (as valid UTF-8), and the
 * markers this file looks for. The guest controls every byte of it. */
static void tb_line(struct tb *b)
{
	char *s;

	b->line[b->line_len] = '\0';
	if (b->line_len && b->line[b->line_len - 1] == '\r')
		b->line[--b->line_len] = '\0';
	if (!strncmp(b->line, "E: ", 3))
		snprintf(b->last_error, sizeof(b->last_error), "%s", b->line);
	if (b->line_len)
		snprintf(b->last_line, sizeof(b->last_line), "%s", b->line);
	if (b->final_step && !strncmp(b->line, tb_size_tag, sizeof(tb_size_tag) - 1)) {
		char *end;
		unsigned long long v;

		errno = 0;
		v = strtoull(b->line + sizeof(tb_size_tag) - 1, &end, 10);
		b->image_bytes = errno || *end ? 0 : (uint64_t)v;
	}
	if (b->final_step && !strncmp(b->line, tb_large_tag, sizeof(tb_large_tag) - 1))
		b->too_large = strtoull(b->line + sizeof(tb_large_tag) - 1, NULL, 10);
	s = textbuf_to_utf8(b->line, b->line_len);
	if (s && b->log)
		b->log(b->ctx, s);
	free(s);
	b->line_len = 0;
}

/* run_opts.on_event: the step's stdout and stderr, cut into lines. */
static void tb_on_event(void *ctx, int event, const void *data, size_t len)
{
	struct tb *b = ctx;
	const char *p = data;

	if (event != RUN_EV_STDOUT && event != RUN_EV_STDERR)
		return;
	for (size_t i = 0; i < len; i++) {
		if (p[i] == '\n') {
			tb_line(b);
			continue;
		}
		if (b->line_len == TB_LINE_MAX)
			tb_line(b); /* a line this long is cut in pieces */
		b->line[b->line_len++] = p[i];
	}
}

static int tb_cancelled(const struct tb *b)
{
	struct pollfd p = { .fd = b->req->cancel_fd, .events = POLLIN };

	return b->req->cancel_fd >= 0 && poll(&p, 1, 0) > 0;
}

/* The common error of a step whose VM failed, timed out or was cancelled. */
static int tb_vm_failed(struct tb *b, const struct kiln_err *e, struct kiln_err *err)
{
	if (tb_cancelled(b) || e->errc == KERR_INTERRUPTED)
		return kiln_err_set(err, KERR_CANCELLED, "the build was cancelled (during %s)", b->step);
	if (proto_now_ms() >= b->deadline_ms)
		return kiln_err_set(err, KERR_BUILD_TIMEOUT, "the build ran past its %u s timeout (during %s)",
				    b->req->timeout_s, b->step);
	*err = *e;
	return -1;
}

/* Seconds left of the build, at least 1. */
static uint32_t tb_left_s(const struct tb *b)
{
	int64_t left = (b->deadline_ms - proto_now_ms() + 999) / 1000;

	return left < 1 ? 1 : (uint32_t)left;
}

/* Run argv as root in the build VM, its output into the log. 0 when it exited
 * 0; else -1 with err: build_failed naming the step ("run[2] exited with
 * status 3"), build_timeout, cancelled, or the VM's error. */
static int tb_exec(struct tb *b, const char *step, char **argv, size_t argc, struct kiln_err *err)
{
	const struct recipe *r = b->req->recipe;
	char *env[RECIPE_MAX_ENV + 4];
	struct task_spec spec = { .argv = argv, .argc = argc, .env = env, .cwd = "/", .vcpus = b->req->vcpus,
				  .memory_mib = b->req->memory_mib, .output_mib = TB_OUTPUT_MIB };
	struct run_opts ro = { .log_excerpt = 4096, .on_event = tb_on_event, .event_ctx = b, .user_set = 1,
			       .uid = 0, .gid = 0 };
	struct kiln_err e = { .code = "" };
	const char *state, *reason;
	json_t *res, *je;
	int rc = -1;

	if (tb_cancelled(b))
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
		for (size_t i = 0; i < r->nenv; i++)
			env[spec.nenv++] = r->env[i];
	env[spec.nenv++] = "DEBIAN_FRONTEND=noninteractive";
	env[spec.nenv++] = "HOME=/root";
	env[spec.nenv] = NULL;
	spec.timeout_s = tb_left_s(b);
	ro.vm.cancel_fd = b->req->cancel_fd;
	b->step = step;
	b->line_len = 0;
	b->last_error[0] = b->last_line[0] = '\0';
	res = run_session_exec(&b->vm, &spec, &ro);
	if (b->line_len)
		tb_line(b);
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
		tb_vm_failed(b, &e, err);
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

static int tb_sh(struct tb *b, const char *step, const char *script, struct kiln_err *err)
{
	char *argv[] = { "/bin/sh", "-c", (char *)script, NULL };

	return tb_exec(b, step, argv, 3, err);
}

/* Put data into the guest as a file of the task user (FILE), to be installed
 * as root by tb_install. */
static int tb_stage(struct tb *b, const char *staged, const void *data, size_t len, struct kiln_err *err)
{
	struct kiln_err e = { .code = "" };

	if (run_session_put(&b->vm, staged, data, len, 0600, &e) < 0)
		return tb_vm_failed(b, &e, err);
	return 0;
}

/* Install staged files as root: argv holds, after the script, triples of
 * mode, staged path and destination. */
static const char tb_install_sh[] =
	"set -e; while [ $# -gt 0 ]; do install -D -o 0 -g 0 -m \"$1\" -- \"$2\" \"$3\"; rm -f -- \"$2\"; shift 3; done";

/* The recipe's files (and the build's own: sources.list, preload), each
 * staged then installed as root with its mode, in batches of one EXEC. */
struct tb_file {
	const char *path;
	const void *data;
	size_t len;
	uint32_t mode;
};

static int tb_write_files(struct tb *b, const char *step, const struct tb_file *files, size_t n,
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
		argv[argc++] = (char *)tb_install_sh;
		argv[argc++] = "sh";
		for (; i < n && k < 300 && (k == 0 || bytes + strlen(files[i].path) < TB_INSTALL_BATCH); i++, k++) {
			snprintf(names[k][0], sizeof(names[k][0]), "%04o", (unsigned)(files[i].mode & 07777));
			snprintf(names[k][1], sizeof(names[k][1]), TB_STAGE "/f%zu", i);
			if (tb_stage(b, names[k][1], files[i].data, files[i].len, err) < 0) {
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
			rc = tb_exec(b, step, argv, argc, err);
		free(argv);
		free(names);
		if (rc < 0)
			return -1;
	}
	return 0;
}

/* Host and port of the mirror URL as an egress rule ("deb.debian.org:80"),
 * checked by the spec parser like any task's rule. */
static int tb_mirror_rule(const char *mirror, struct task_spec *rs, struct kiln_err *err)
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
static const char tb_image_sh[] =
	"set -e\n"
	"if command -v apt-get > /dev/null; then apt-get clean; fi\n"
	"rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin " TB_STAGE "\n"
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

static int tb_boot(struct tb *b, struct kiln_err *err)
{
	const struct tbuild_recipe_req *q = b->req;
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
		if (tb_mirror_rule(q->mirror, &rs, err) < 0)
			return -1;
		tb_log(b, "[build] network: the mirror only (%s)", q->mirror);
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
	tb_log(b, "[build] booting (%u vCPU, %u MiB)", q->vcpus, q->memory_mib);
	b->step = "boot";
	if (vm_start(&cfg, &b->vm, &e) < 0)
		return tb_vm_failed(b, &e, err);
	deadline = proto_now_ms() + TB_BOOT_TIMEOUT_MS;
	if (deadline > b->deadline_ms)
		deadline = b->deadline_ms;
	if (vm_recv(&b->vm, &f, deadline, &e) < 0)
		return tb_vm_failed(b, &e, err);
	if (f.type != PROTO_HELLO || proto_hello_decode(f.payload, f.len, &h) < 0 || h.version != PROTO_VERSION)
		return kiln_err_set(err, KERR_VM_ERROR, "the build VM's first frame was not a valid HELLO");
	if (vm_setup(&b->vm, proto_now_ms() + 10000, &e) < 0)
		return tb_vm_failed(b, &e, err);
	tb_log(b, "[build] booted in %.1f s", tb_elapsed_s(b));
	return 0;
}

/* The scratch directory next to out_ext4 (same file system: the image is
 * renamed into place, and the overlay and the second disk are not in the
 * run directory's tmpfs), the overlay over the base, the sparse second disk. */
static int tb_prepare(struct tb *b, const char *out_ext4, struct kiln_err *err)
{
	const struct tbuild_recipe_req *q = b->req;
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
static int tb_steps(struct tb *b, struct kiln_err *err)
{
	const struct recipe *r = b->req->recipe;
	char step[64], free_mib[16], serial[] = "kiln-out";
	int64_t t;

	t = proto_now_ms();
	tb_log(b, "[build] growing the root file system to %" PRIu64 " MiB", b->req->max_bytes >> 20);
	if (tb_sh(b, "resize2fs", "resize2fs /dev/vda 2>&1", err) < 0)
		return -1;
	if (r->npackages) {
		char sources[1200];
		struct tb_file f = { .path = "/etc/apt/sources.list", .data = sources, .mode = 0644 };
		char **argv = calloc(r->npackages + 16, sizeof(char *));
		size_t argc = 0;
		int rc;

		f.len = (size_t)snprintf(sources, sizeof(sources), "deb %s " TB_SUITE " main\n", b->req->mirror);
		if (f.len >= sizeof(sources)) {
			free(argv);
			return kiln_err_set(err, KERR_CONFIG, "mirror URL too long");
		}
		if (!argv)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		tb_log(b, "[build] apt-get update");
		if (tb_write_files(b, "sources.list", &f, 1, err) < 0 ||
		    tb_sh(b, "apt-get update",
			  "rm -f /etc/apt/sources.list.d/*; exec apt-get -q -o Dpkg::Use-Pty=0 -o Acquire::Languages=none update --error-on=any", err) < 0) {
			free(argv);
			return -1;
		}
		tb_log(b, "[build] apt-get install (%zu package%s)", r->npackages, r->npackages == 1 ? "" : "s");
		argv[argc++] = "apt-get";
		argv[argc++] = "-q";
		argv[argc++] = "-y";
		argv[argc++] = "-o";
		argv[argc++] = "Dpkg::Use-Pty=0";
		argv[argc++] = "install";
		argv[argc++] = "--no-install-recommends";
		argv[argc++] = "--";
		for (size_t i = 0; i < r->npackages; i++)
			argv[argc++] = r->packages[i];
		argv[argc] = NULL;
		rc = tb_exec(b, "apt-get install", argv, argc, err);
		free(argv);
		if (rc < 0)
			return -1;
		tb_log(b, "[build] packages installed in %.1f s", (double)(proto_now_ms() - t) / 1000.0);
		/* The mirror's addresses are shared (a CDN's): left up, the
		 * network would let a run step reach any site on that CDN with
		 * a Host header of its own. So nothing after the packages has
		 * a network; a failure to take it down ends the build. */
		b->step = "network off";
		if (net_sandbox_cut(b->net, err) < 0)
			return -1;
		tb_log(b, "[build] network: none from here on (files, run steps, image)");
	}
	if (r->nfiles) {
		struct tb_file *fs = calloc(r->nfiles, sizeof(*fs));

		if (!fs)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		for (size_t i = 0; i < r->nfiles; i++)
			fs[i] = (struct tb_file){ r->files[i].path, r->files[i].data, r->files[i].len, r->files[i].mode };
		tb_log(b, "[build] files: %zu", r->nfiles);
		if (tb_write_files(b, "files", fs, r->nfiles, err) < 0) {
			free(fs);
			return -1;
		}
		free(fs);
	}
	for (size_t i = 0; i < r->nrun; i++) {
		int64_t ts = proto_now_ms();

		snprintf(step, sizeof(step), "run[%zu]", i);
		tb_log(b, "[build] %s: %.200s%s", step, r->run[i], strlen(r->run[i]) > 200 ? "..." : "");
		{
			char *argv[] = { "/bin/sh", "-c", r->run[i], NULL };

			if (tb_exec(b, step, argv, 3, err) < 0)
				return -1;
		}
		tb_log(b, "[build] %s done in %.1f s", step, (double)(proto_now_ms() - ts) / 1000.0);
	}
	{
		/* Always written: an empty list imports nothing. */
		size_t len = 0;
		char *text;
		struct tb_file f = { .path = "/etc/kiln/preload", .mode = 0644 };

		for (size_t i = 0; i < r->npreload; i++)
			len += strlen(r->preload[i]) + 1;
		text = malloc(len + 1);
		if (!text)
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		len = 0;
		for (size_t i = 0; i < r->npreload; i++)
			len += (size_t)sprintf(text + len, "%s\n", r->preload[i]);
		f.data = text;
		f.len = len;
		if (tb_write_files(b, "preload", &f, 1, err) < 0) {
			free(text);
			return -1;
		}
		free(text);
	}
	tb_log(b, "[build] making the image");
	t = proto_now_ms();
	snprintf(free_mib, sizeof(free_mib), "%u", TB_FREE_MIB);
	b->final_step = 1;
	{
		char *argv[] = { "/bin/sh", "-c", (char *)tb_image_sh, "sh", serial, free_mib, NULL };

		if (tb_exec(b, "image", argv, 6, err) < 0) {
			b->final_step = 0;
			if (b->too_large)
				return kiln_err_set(err, KERR_TOO_LARGE, "the image needs %" PRIu64 " MiB, more than max_bytes (%" PRIu64 " MiB)",
						    b->too_large >> 20, b->req->max_bytes >> 20);
			return -1;
		}
	}
	b->final_step = 0;
	tb_log(b, "[build] image made in %.1f s", (double)(proto_now_ms() - t) / 1000.0);
	return 0;
}

/* The second disk becomes out_ext4: cut to the size the guest named (checked
 * here, never read), root's, 0444, renamed into place. Called with QEMU gone. */
static int tb_publish(struct tb *b, const char *out_ext4, struct kiln_err *err)
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

int tbuild_recipe(const struct tbuild_recipe_req *req, const char *out_ext4, struct tbuild_meta *meta,
		  tbuild_log_fn log, void *ctx, struct kiln_err *err)
{
	struct tb *b = calloc(1, sizeof(*b));
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
		kiln_err_set(err, KERR_USAGE, "tbuild_recipe: incomplete request");
		goto out;
	}
	if (tb_prepare(b, out_ext4, err) < 0 || tb_boot(b, err) < 0 || tb_steps(b, err) < 0)
		goto out;
	vm_destroy(&b->vm);
	if (tb_publish(b, out_ext4, err) < 0)
		goto out;
	meta->env = json_array();
	for (size_t i = 0; i < req->recipe->nenv; i++)
		json_array_append_new(meta->env, json_string(req->recipe->env[i]));
	snprintf(meta->workdir, sizeof(meta->workdir), "%s", req->recipe->workdir ? req->recipe->workdir : "");
	meta->uid = meta->gid = 1000;
	tb_log(b, "[build] done in %.1f s: image %" PRIu64 " MiB", tb_elapsed_s(b), b->image_bytes >> 20);
	rc = 0;
out:
	vm_destroy(&b->vm);
	if (b->net)
		net_sandbox_stop(b->net, NULL); /* after QEMU: nothing uses the tap any more */
	if (b->scratch[0])
		fs_rmtree(b->scratch);
	if (rc < 0)
		tb_log(b, "[build] failed after %.1f s: %s: %s", tb_elapsed_s(b), err->code, err->message);
	free(b);
	return rc;
}
