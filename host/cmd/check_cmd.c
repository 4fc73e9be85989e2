/* check_cmd: `kiln-host check-config FILE` (check_cmd.h). Every probe is
 * read-only: /dev/kvm is opened and asked its API version, nftables lists
 * the ruleset, the jail's cgroup directories are looked up, directories are
 * checked (not created), S3 gets one listing and kiln-api one GET /healthz. */
#include "check_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/kvm.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "cfgcheck.h"
#include "httpc.h"
#include "jail.h"
#include "net/net.h"
#include "task/task.h"
#include "vm/vm.h"

/* KVM's stable API version (Documentation/virt/kvm/api.rst). */
#define CHECK_KVM_API_VERSION 12

static void check_accel(struct cfgcheck *c, const char *accel)
{
	struct kiln_err err = { .code = "" };
	enum vm_accel want, got;
	int fd, version = -1;
	char why[160] = "";

	if (!strcmp(accel, "auto"))
		want = VM_ACCEL_AUTO;
	else if (!strcmp(accel, "kvm"))
		want = VM_ACCEL_KVM;
	else if (!strcmp(accel, "tcg"))
		want = VM_ACCEL_TCG;
	else {
		cfgcheck_error(c, "accel", "expected auto, kvm or tcg, got \"%s\"", accel);
		return;
	}
	fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		snprintf(why, sizeof(why), "/dev/kvm: %s", strerror(errno));
	} else {
		version = ioctl(fd, KVM_GET_API_VERSION, 0);
		if (version != CHECK_KVM_API_VERSION)
			snprintf(why, sizeof(why), "/dev/kvm: KVM_GET_API_VERSION answered %d, expected %d", version,
				 CHECK_KVM_API_VERSION);
		close(fd);
	}
	/* The daemon's own decision (it also wants a hardware KVM module). */
	got = vm_accel_resolve(want, &err);
	if (got == VM_ACCEL_AUTO) {
		cfgcheck_error(c, "accel", "%s%s%s", err.message, why[0] ? "; " : "", why);
		return;
	}
	if (got == VM_ACCEL_KVM && !why[0]) {
		cfgcheck_use(c, "accel", "kvm (%s; /dev/kvm API version %d)", accel, version);
		return;
	}
	if (got == VM_ACCEL_KVM) { /* vm_accel_resolve saw /dev/kvm open; the ioctl disagreed */
		cfgcheck_error(c, "accel", "%s", why);
		return;
	}
	cfgcheck_use(c, "accel", "tcg (%s%s%s)", accel, why[0] ? ": " : "", why[0] ? why : "no hardware KVM module");
	if (want == VM_ACCEL_AUTO)
		cfgcheck_warn(c, "accel", "no usable KVM: VMs run under TCG (software emulation, many times slower)");
}

/* QEMU as execvp would find it. */
static void check_qemu(struct cfgcheck *c, const char *qemu)
{
	char buf[PATH_MAX];
	const char *path = getenv("PATH");
	struct stat st;

	if (!strchr(qemu, '/')) {
		for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
			size_t n = strcspn(p, ":");

			snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, qemu);
			if (!access(buf, X_OK))
				break;
			buf[0] = '\0';
			p += n + (p[n] == ':');
		}
		if (!buf[0]) {
			cfgcheck_error(c, "qemu", "%s is not in PATH", qemu);
			return;
		}
		qemu = buf;
	}
	if (stat(qemu, &st) < 0 || access(qemu, X_OK) < 0) {
		cfgcheck_error(c, "qemu", "%s: %s", qemu, strerror(errno));
		return;
	}
	if (!S_ISREG(st.st_mode)) {
		cfgcheck_error(c, "qemu", "%s is not a regular file", qemu);
		return;
	}
	cfgcheck_use(c, "qemu", "%s", qemu);
}

static void check_images(struct cfgcheck *c, const char *dir)
{
	static const char *const files[] = { "vmlinux", "initramfs.cpio", "rootfs.ext4" };
	char path[PATH_MAX], setting[64];

	cfgcheck_use(c, "image_dir", "%s", dir);
	for (size_t i = 0; i < sizeof(files) / sizeof(*files); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		snprintf(setting, sizeof(setting), "image_dir (%s)", files[i]);
		cfgcheck_file(c, setting, path);
	}
}

/* What the jail needs (jail_config_init: cgroup v1 memory, cpu and pids
 * hierarchies this process may write in), and what cgroup v2 offers. */
static void check_cgroups(struct cfgcheck *c)
{
	static const char *const v2[] = { "/sys/fs/cgroup", "/sys/fs/cgroup/unified" };
	struct jail_config jc;
	struct kiln_err err = { .code = "" };
	struct statfs fs;
	char ctl[256];

	if (jail_config_init(&jc, &err) < 0)
		cfgcheck_error(c, "cgroups", "%s", err.message);
	else
		cfgcheck_use(c, "cgroups", "v1 memory %s, cpu %s, pids %s (the jail's)", jc.cg_memory, jc.cg_cpu,
			     jc.cg_pids);
	jail_config_free(&jc);
	for (size_t i = 0; i < sizeof(v2) / sizeof(*v2); i++) {
		char path[64];
		FILE *f;

		if (statfs(v2[i], &fs) < 0 || fs.f_type != CGROUP2_SUPER_MAGIC)
			continue;
		snprintf(path, sizeof(path), "%s/cgroup.controllers", v2[i]);
		f = fopen(path, "re");
		ctl[0] = '\0';
		if (f) {
			if (!fgets(ctl, sizeof(ctl), f))
				ctl[0] = '\0';
			fclose(f);
		}
		ctl[strcspn(ctl, "\n")] = '\0';
		cfgcheck_use(c, "cgroup v2", "%s (controllers: %s)", v2[i], ctl[0] ? ctl : "none");
		return;
	}
	cfgcheck_use(c, "cgroup v2", "not mounted");
}

static void check_api(struct cfgcheck *c, const struct serve_opts *so)
{
	if (!so->api || !so->api->n) {
		cfgcheck_use(c, "api", "none (standalone: no heartbeat)");
		return;
	}
	for (unsigned i = 0; i < so->api->n; i++) {
		char url[APILIST_URL_MAX + 16];
		struct httpc_req q = { .url = url,
				       .ca_file = so->api_ca_file,
				       .lim = { .timeout_ms = CFGCHECK_TIMEOUT_S * 1000,
						.connect_timeout_ms = CFGCHECK_TIMEOUT_S * 1000 },
				       .max_reply = 4096 };
		struct httpc_reply r = { 0 };
		int rc;

		snprintf(url, sizeof(url), "%s/healthz", so->api->url[i]);
		rc = httpc_request(NULL, &q, &r);
		if (rc < 0)
			cfgcheck_error(c, "api", "%s: %s", url, r.error);
		else if (r.status != 200)
			cfgcheck_error(c, "api", "%s answered HTTP %ld", url, r.status);
		else
			cfgcheck_use(c, "api", "%s (healthz 200)", so->api->url[i]);
		httpc_reply_free(&r);
	}
}

int check_cmd_run(const char *path, const struct host_config *hc, const struct serve_opts *so,
		  const struct check_cmd_vm *vm)
{
	struct cfgcheck c = { .out = stdout, .problems = stderr };
	struct kiln_err err = { .code = "" };
	struct net_host nh;
	struct in_addr a;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int nft;

	printf("kiln-host: %s would use:\n", path);
	if (inet_pton(AF_INET, so->listen_host, &a) != 1)
		cfgcheck_error(&c, "listen", "\"%s\" is not an IPv4 address", so->listen_host);
	else
		cfgcheck_use(&c, "listen", "%s:%d", so->listen_host, so->port);
	if (!spool_id_ok(so->host_id))
		cfgcheck_error(&c, "host_id", "\"%s\": expected 1-64 characters of [A-Za-z0-9_.-]", so->host_id);
	else
		cfgcheck_use(&c, "host_id", "%s", so->host_id);
	/* serve refuses to start without one (and kiln-api a host without it). */
	if (!so->token || !*so->token)
		cfgcheck_error(&c, "token", "not set: serve needs the cluster token (token or token_file, or "
					    "KILN_CLUSTER_TOKEN)");
	else
		cfgcheck_use(&c, "token", "set");
	cfgcheck_use(&c, "advertise_url", "%s", so->advertise ? so->advertise :
						    so->tls_cert_file ? "https://LISTEN" : "http://LISTEN");
	if (so->tls_cert_file || so->tls_key_file)
		cfgcheck_tls_pair(&c, "tls", so->tls_cert_file, so->tls_key_file);
	else
		cfgcheck_use(&c, "tls", "off: the host's API (and the cluster token) is served in clear");
	if (so->advertise && so->tls_cert_file && strncmp(so->advertise, "https://", 8))
		cfgcheck_error(&c, "advertise_url", "%s: the host serves TLS only, so it must be https://", so->advertise);
	if (so->api_ca_file)
		cfgcheck_ca_file(&c, "api_ca_file", so->api_ca_file);
	check_accel(&c, vm->accel);
	check_qemu(&c, vm->qemu);
	check_images(&c, vm->image_dir);
	cfgcheck_dir(&c, "run_dir", vm->run_dir);
	cfgcheck_dir(&c, "cache", vm->cache);
	cfgcheck_dir(&c, "spool_dir", so->spool_dir);
	{
		long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
		uint64_t ram_mib = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize >> 20 : 0;

		/* serve's default memory budget is 80% of RAM (host/main.c). */
		cfgcheck_use(&c, "capacity", "vcpus %u (x%.2g overcommit), memory %llu MiB%s",
			     so->vcpus_capacity ? so->vcpus_capacity : (unsigned)(ncpu > 0 ? ncpu : 1),
			     so->cpu_overcommit > 0 ? so->cpu_overcommit : SERVE_CPU_OVERCOMMIT,
			     (unsigned long long)(so->memory_capacity_mib ? so->memory_capacity_mib : ram_mib * 8 / 10),
			     so->memory_capacity_mib ? "" : " (80% of RAM)");
	}
	cfgcheck_use(&c, "pool", "%u warm VM(s), prestart %u, snapshot %u MiB x %u vCPU(s)", so->pool_size,
		     so->prestart, so->snap_memory_mib, so->snap_vcpus);
	if (so->s3) {
		s3_global_init();
		cfgcheck_s3(&c, "s3", so->s3);
	} else {
		cfgcheck_use(&c, "s3", "none (outputs stay in the spool)");
	}
	if (net_config_check(hc->network, &nh, &err) < 0)
		cfgcheck_error(&c, "network", "%s", err.message);
	else
		cfgcheck_use(&c, "network", "egress %s", nh.enabled ? "on" : "off");
	/* nftables is used for sandboxes' egress only: without it, a host
	 * with egress off still runs. */
	err = (struct kiln_err){ .code = "" };
	nft = net_nft_check(&err);
	if (nft < 0 && nh.enabled)
		cfgcheck_error(&c, "nftables", "%s (network egress needs it)", err.message);
	else if (nft < 0)
		cfgcheck_warn(&c, "nftables", "%s (needed once network egress is on)", err.message);
	else
		cfgcheck_use(&c, "nftables", "usable (libnftables lists the ruleset)");
	check_cgroups(&c);
	check_api(&c, so);
	if (c.errors)
		fprintf(stderr, "kiln-host: %s: %d problem(s)\n", path, c.errors);
	else
		printf("kiln-host: %s: configuration ok (%d warning(s))\n", path, c.warnings);
	return c.errors;
}
