/* bench/clones: the floor under kiln-host's idle sessions (figures, not
 * pass/fail): N plain jailed QEMU clones of the 256 MiB snapshot, restored
 * and SETUP as a session's VM is, with nothing of kiln-host's around them.
 *   - per step of N: PSS per clone (smaps_rollup, the snapshot's RAM pages
 *     shared between clones count once), host CPU of all of them while the
 *     guests idle (% of one core), the same with every clone's vCPUs stopped
 *     (QMP stop), and the time the step took to create;
 *   - the TCG translation buffer (tb-size): for each size, an idle clone's
 *     PSS after a busy workload (Python importing a dozen modules and
 *     running them) and that workload's time, median of RUNS, so that what
 *     a smaller buffer saves is weighed against what retranslation costs.
 *   usage: clones IMAGE_DIR
 *   env: CLONES_STEPS ("10 50 100"), CLONES_IDLE_S (5), CLONES_TB ("64 16 8 4"),
 *        RUNS (5), KILN_CACHE (/var/cache/kiln), KILN_RUN_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jail.h"
#include "pool.h"
#include "proto.h"
#include "snapshot.h"
#include "vm.h"

#include "bench.h"

#define MAX_CLONES 4096

/* utime + stime of a process, in clock ticks (fields 14 and 15 of stat,
 * counted after the command name's closing parenthesis). */
static long long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long long ut, st;
	FILE *f;
	char *p;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return 0;
	return (long long)(ut + st);
}

/* Host CPU of vms[0..n) over idle_s seconds, in % of one core. */
static double idle_cpu(struct vm *vms, int n, double idle_s)
{
	long long a = 0, b = 0;

	for (int i = 0; i < n; i++)
		a += cpu_ticks(vms[i].pid);
	usleep((useconds_t)(idle_s * 1e6));
	for (int i = 0; i < n; i++)
		b += cpu_ticks(vms[i].pid);
	return (double)(b - a) / (double)sysconf(_SC_CLK_TCK) / idle_s * 100.0;
}

static double pss_mib(struct vm *vms, int n)
{
	long kib = 0;

	for (int i = 0; i < n; i++)
		kib += status_kib(vms[i].pid, "smaps_rollup", "Pss");
	return (double)kib / 1024.0 / (n ? n : 1);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

/* Run `python3 -c CODE` as the task user and wait for its EXIT: returns the
 * microseconds from EXEC to EXIT, or -1 with err set. */
static int64_t run_python(struct vm *vm, const char *code, struct kiln_err *err)
{
	static uint8_t buf[PROTO_MAX_PAYLOAD];
	static struct proto_exec e;
	struct proto_frame f;
	int64_t t0 = proto_now_us();
	ssize_t n;

	memset(&e, 0, sizeof(e));
	e.output_cap = 1 << 20;
	e.uid = e.gid = 1000;
	snprintf(e.cwd, sizeof(e.cwd), "/work");
	e.argc = 3;
	e.argv[0] = "python3";
	e.argv[1] = "-c";
	e.argv[2] = (char *)code;
	e.envc = 1;
	e.env[0] = "PATH=/usr/bin:/bin";
	n = proto_exec_encode(buf, sizeof(buf), &e);
	if (n < 0 || vm_send(vm, PROTO_EXEC, buf, (size_t)n, proto_now_ms() + 20000, err) < 0)
		return -1;
	for (;;) {
		if (vm_recv(vm, &f, proto_now_ms() + 120000, err) < 0)
			return -1;
		if (f.type == PROTO_EXIT)
			return proto_now_us() - t0;
		if (f.type == PROTO_ERROR)
			return kiln_err_set(err, KERR_GUEST_ERROR, "the guest refused the command");
	}
}

static const char *busy_code =
	"import json, re, decimal, fractions, statistics, email.parser, http.client, urllib.parse, csv, io, "
	"sqlite3, hashlib, textwrap, difflib\n"
	"d = [{'k': i, 'v': str(decimal.Decimal(i) / 7)} for i in range(2000)]\n"
	"s = json.dumps(d); json.loads(s); statistics.mean(x['k'] for x in d)\n"
	"c = sqlite3.connect(':memory:'); c.execute('create table t(a, b)')\n"
	"c.executemany('insert into t values (?, ?)', ((i, str(i)) for i in range(2000)))\n"
	"list(difflib.unified_diff(s[:4000].split(','), s[100:4100].split(',')))\n"
	"print(hashlib.sha256(s.encode()).hexdigest(), re.sub(r'[0-9]+', '#', s[:100]))\n";

int main(int argc, char **argv)
{
	static struct vm vms[MAX_CLONES];
	static struct jail_config jc;
	struct vm_config base = { 0 };
	struct snapshot snap;
	struct kiln_err err = { .code = "" };
	const char *cache = getenv("KILN_CACHE") ? getenv("KILN_CACHE") : "/var/cache/kiln";
	const char *steps = getenv("CLONES_STEPS") ? getenv("CLONES_STEPS") : "10 50 100";
	const char *tbs = getenv("CLONES_TB") ? getenv("CLONES_TB") : "64 16 8 4";
	double idle_s = getenv("CLONES_IDLE_S") ? atof(getenv("CLONES_IDLE_S")) : 5;
	int runs = getenv("RUNS") ? atoi(getenv("RUNS")) : 5, n = 0;
	char key[17], list[256], *save = NULL;

	if (argc != 2) {
		fprintf(stderr, "usage: clones IMAGE_DIR\n");
		return 2;
	}
	if (runs < 1)
		runs = 1;
	bench_base(&base, argv[1]);
	if (vm_jail_config(&jc, base.qemu, base.accel, &err) < 0) {
		fprintf(stderr, "clones: %s\n", err.message);
		return 1;
	}
	base.jail = &jc;
	if (!(snapshot_key(&base, 256, 1, key, &err) == 0 && snapshot_open(cache, key, &snap, &err) == 0) &&
	    snapshot_create(&base, cache, 256, 1, 1, &snap, &err) < 0) {
		fprintf(stderr, "clones: snapshot: %s\n", err.message);
		return 1;
	}

	printf("plain QEMU clones of the 256 MiB snapshot (jailed, restored and SETUP as a session's VM; no kiln-host)\n");
	printf("  %6s %12s %22s %22s %12s\n", "N", "PSS/clone", "idle CPU, running", "idle CPU, stopped", "create step");
	snprintf(list, sizeof(list), "%s", steps);
	for (char *tok = strtok_r(list, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		int want = atoi(tok), made = n;
		int64_t t0 = proto_now_us();
		double run_cpu, stop_cpu, pss;
		long avail = status_kib(0, "/proc/meminfo", "MemAvailable");

		if (want <= n || want > MAX_CLONES)
			continue;
		/* Keep 3 GiB free, counting 60 MiB per new clone. */
		if (avail >= 0 && (avail / 1024 - (want - n) * 60) < 3072) {
			printf("  %6d stopped: MemAvailable %ld MiB would run short\n", want, avail / 1024);
			break;
		}
		for (; n < want; n++) {
			if (snapshot_restore(&snap, &base, &vms[n], &err) < 0 ||
			    vm_setup(&vms[n], proto_now_ms() + 60000, &err) < 0) {
				fprintf(stderr, "clones: clone %d: %s\n", n, err.message);
				vm_destroy(&vms[n]);
				break;
			}
		}
		if (n != want)
			break;
		t0 = proto_now_us() - t0;
		sleep(2); /* let the last ones settle */
		run_cpu = idle_cpu(vms, n, idle_s);
		pss = pss_mib(vms, n);
		for (int i = 0; i < n; i++)
			vm_qmp(&vms[i], "{\"execute\":\"stop\"}", proto_now_ms() + 10000, NULL, &err);
		stop_cpu = idle_cpu(vms, n, idle_s);
		for (int i = 0; i < n; i++)
			vm_qmp(&vms[i], "{\"execute\":\"cont\"}", proto_now_ms() + 10000, NULL, &err);
		printf("  %6d %8.1f MiB %13.1f%% (%4.2f%%/clone) %13.1f%% (%4.2f%%/clone) %9.1f s (%d new)\n", n, pss,
		       run_cpu, run_cpu / n, stop_cpu, stop_cpu / n, t0 / 1e6, n - made);
		fflush(stdout);
		if (getenv("CLONES_SMAPS") && made == 0) {
			/* Where one clone's PSS is, by mapping (bench/smaps.py). */
			char cmd[128];

			snprintf(cmd, sizeof(cmd), getenv("CLONES_SMAPS_CMD") ? getenv("CLONES_SMAPS_CMD") : "/usr/bin/python3 bench/smaps.py %d", (int)vms[0].pid);
			if (system(cmd) != 0)
				fprintf(stderr, "clones: %s failed\n", cmd);
		}
	}
	for (int i = 0; i < n; i++)
		vm_destroy(&vms[i]);

	/* Pool VMs: the same clones warmed up as kiln-host's pool does it
	 * (pool_warm_up: SETUP, FILE, EXEC of /bin/true, COLLECT, WARM in the
	 * pre-started interpreter), then stopped until a task takes them. */
	{
		int k = 0, want = getenv("CLONES_POOL") ? atoi(getenv("CLONES_POOL")) : 10;

		for (; k < want && k < MAX_CLONES; k++)
			if (snapshot_restore(&snap, &base, &vms[k], &err) < 0 || pool_warm_up(&vms[k], &err) < 0 ||
			    vm_qmp(&vms[k], "{\"execute\":\"stop\"}", proto_now_ms() + 10000, NULL, &err) < 0) {
				fprintf(stderr, "clones: pool VM %d: %s\n", k, err.message);
				vm_destroy(&vms[k]);
				break;
			}
		if (k)
			printf("\n%d warmed pool VMs (restored, pool_warm_up, stopped) side by side: PSS %.1f MiB each, host CPU %.1f%%\n",
			       k, pss_mib(vms, k), idle_cpu(vms, k, idle_s));
		if (k && getenv("CLONES_SMAPS")) {
			char cmd[128];

			snprintf(cmd, sizeof(cmd), getenv("CLONES_SMAPS_CMD") ? getenv("CLONES_SMAPS_CMD") : "/usr/bin/python3 bench/smaps.py %d", (int)vms[0].pid);
			if (system(cmd) != 0)
				fprintf(stderr, "clones: %s failed\n", cmd);
		}
		for (int i = 0; i < k; i++)
			vm_destroy(&vms[i]);
	}

	printf("\nTCG translation buffer (tb-size): one clone per run, a busy Python workload (imports, JSON, sqlite, difflib)\n");
	snprintf(list, sizeof(list), "%s", tbs);
	save = NULL;
	for (char *tok = strtok_r(list, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		int64_t t[64], first[64];
		double pss[64];
		int k = 0;

		base.tb_mib = (unsigned)atoi(tok);
		for (int r = 0; r < runs && r < 64; r++) {
			struct vm vm;

			if (snapshot_restore(&snap, &base, &vm, &err) == 0 && vm_setup(&vm, proto_now_ms() + 60000, &err) == 0 &&
			    (first[k] = run_python(&vm, busy_code, &err)) >= 0 && (t[k] = run_python(&vm, busy_code, &err)) >= 0) {
				usleep(500000);
				pss[k] = (double)status_kib(vm.pid, "smaps_rollup", "Pss") / 1024.0;
				k++;
			} else {
				fprintf(stderr, "clones: tb-size %s: %s\n", tok, err.message);
			}
			vm_destroy(&vm);
		}
		if (!k)
			continue;
		qsort(t, (size_t)k, sizeof(*t), cmp_i64);
		qsort(first, (size_t)k, sizeof(*first), cmp_i64);
		for (int i = 1; i < k; i++) /* insertion sort: k is small */
			for (int j = i; j > 0 && pss[j - 1] > pss[j]; j--) {
				double x = pss[j];

				pss[j] = pss[j - 1];
				pss[j - 1] = x;
			}
		printf("  tb-size %3u MiB: workload first run %7.1f ms, again %7.1f ms; PSS afterwards %6.1f MiB (medians of %d)\n",
		       base.tb_mib, first[k / 2] / 1e3, t[k / 2] / 1e3, pss[k / 2], k);
		fflush(stdout);
	}
	snapshot_close(&snap);
	return 0;
}
