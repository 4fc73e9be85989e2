/* bench/start: how fast a task's code starts, by start path, in one run:
 *   cold    - vm_start to kiln-init's HELLO
 *   restore - snapshot_restore to the guest's first reply (SETUP acknowledged)
 *   pool    - pool_take to the task's code running (STARTED), through the real
 *             hand-out path (cont, SETUP, code file, EXEC)
 *   print(1) end to end through run_task in each mode
 * and the host memory (RSS, PSS) of an idle restored VM by guest memory size.
 *   usage: start IMAGE_DIR RUNS */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "pool.h"
#include "jail.h"
#include "proto.h"
#include "run.h"
#include "snapshot.h"
#include "spec.h"
#include "vm_ops.h"
#include "vm.h"

#include "bench.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static void report(const char *what, int64_t *v, int n)
{
	if (n == 0) {
		printf("  %-44s no successful runs\n", what);
		return;
	}
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
	printf("  %-44s median %8.2f ms  p95 %8.2f ms  (n=%d)\n", what, v[n / 2] / 1e3, v[(n - 1) * 95 / 100] / 1e3, n);
}

static int64_t median(int64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
	return n ? v[n / 2] : 0;
}

/* Bench only: poll (bounded, 30 s) until the pool's one VM is ready. */
static void wait_pool(struct pool *p)
{
	for (int w = 0; w < 3000 && pool_ready(p) == 0; w++)
		usleep(10000);
}

/* The rest of run.c's path after SETUP, up to STARTED, with print(1) as the code. */
static int run_code(struct vm *vm, struct kiln_err *err)
{
	static uint8_t buf[PROTO_MAX_PAYLOAD];
	static struct proto_exec e;
	struct proto_file file = { .mode = 0644, .size = 9 };
	struct proto_frame f;
	ssize_t n;

	int64_t t0 = proto_now_us();
#define STEP(x) (getenv("BENCH_TRACE") ? fprintf(stderr, "  %-6s %6.2f ms\n", x, (proto_now_us() - t0) / 1e3) : 0)
	snprintf(file.path, sizeof(file.path), "/kiln/code/main.py");
	n = proto_file_encode(buf, sizeof(buf), &file);
	if (vm_send(vm, PROTO_FILE, buf, (size_t)n, proto_now_ms() + 20000, err) < 0 ||
	    vm_send(vm, PROTO_FILE_DATA, "print(1)\n", 9, proto_now_ms() + 20000, err) < 0 ||
	    vm_recv(vm, &f, proto_now_ms() + 20000, err) < 0 || f.type != PROTO_OK)
		return -1;
	STEP("file");
	memset(&e, 0, sizeof(e));
	e.flags = PROTO_EXEC_ZYGOTE;
	e.output_cap = 1 << 20;
	e.uid = e.gid = 1000;
	snprintf(e.cwd, sizeof(e.cwd), "/work");
	e.argc = 2;
	e.argv[0] = "python3";
	e.argv[1] = "/kiln/code/main.py";
	e.envc = 1;
	e.env[0] = "PATH=/usr/bin:/bin";
	n = proto_exec_encode(buf, sizeof(buf), &e);
	if (vm_send(vm, PROTO_EXEC, buf, (size_t)n, proto_now_ms() + 20000, err) < 0 ||
	    vm_recv(vm, &f, proto_now_ms() + 20000, err) < 0)
		return -1;
	STEP("exec");
	return f.type == PROTO_STARTED ? 0 : kiln_err_set(err, KERR_GUEST_ERROR, "no STARTED (frame 0x%02x)", f.type);
}

/* SETUP, then run_code: the whole hand-out path of a pool VM. */
static int start_code(struct vm *vm, struct kiln_err *err)
{
	if (vm_setup(vm, proto_now_ms() + 20000, err) < 0)
		return -1;
	return run_code(vm, err);
}

static int open_or_create(const struct vm_config *base, const char *cache, unsigned mib, struct snapshot *s)
{
	struct kiln_err err = { .code = "" };
	char key[17];

	if (snapshot_key(base, mib, 1, key, &err) == 0 && snapshot_open(cache, key, s, &err) == 0)
		return 0;
	if (snapshot_create(base, cache, mib, 1, 1, s, &err) < 0) {
		fprintf(stderr, "bench: snapshot create (%u MiB): %s\n", mib, err.message);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct vm_config base = { 0 };
	struct snapshot snap;
	struct capacity cap = { .lock = PTHREAD_MUTEX_INITIALIZER, .total_mib = 1 << 20 };
	const char *cache = getenv("KILN_CACHE") ? getenv("KILN_CACHE") : "/var/cache/kiln";
	int runs, nc = 0, nr = 0, np = 0, nl = 0, ncr = 0, nrr = 0, nlr = 0;
	int64_t *cold, *rest, *pool, *load, *cold_run, *rest_run, *load_run, *e2e[3];
	int ne2e[3] = { 0, 0, 0 }, nfirst[3] = { 0, 0, 0 };
	int64_t *first[3];
	struct pool *p;

	if (argc != 3) {
		fprintf(stderr, "usage: start IMAGE_DIR RUNS\n");
		return 2;
	}
	runs = atoi(argv[2]);
	cold = calloc((size_t)runs, sizeof(int64_t));
	rest = calloc((size_t)runs, sizeof(int64_t));
	pool = calloc((size_t)runs, sizeof(int64_t));
	load = calloc((size_t)runs, sizeof(int64_t));
	cold_run = calloc((size_t)runs, sizeof(int64_t));
	rest_run = calloc((size_t)runs, sizeof(int64_t));
	load_run = calloc((size_t)runs, sizeof(int64_t));
	for (int m = 0; m < 3; m++) {
		e2e[m] = calloc((size_t)runs, sizeof(int64_t));
		first[m] = calloc((size_t)runs, sizeof(int64_t));
	}
	bench_base(&base, argv[1]);
	{
		/* Jailed, as kiln-host runs every QEMU (bench/jail compares both). */
		static struct jail_config jc;
		struct kiln_err err = { .code = "" };

		if (vm_jail_config(&jc, base.qemu, base.accel, &err) < 0) {
			fprintf(stderr, "start: %s\n", err.message);
			return 1;
		}
		base.jail = &jc;
	}
	if (open_or_create(&base, cache, 256, &snap) < 0)
		return 1;
	p = pool_start(&snap, &base, 1, 0, &cap, &vm_ops_real, NULL);

	for (int i = 0; i < runs; i++) {
		struct kiln_err err = { .code = "" };
		struct vm vm;
		struct proto_frame f;
		int64_t t0;

		wait_pool(p);
		t0 = proto_now_us();
		if (vm_start(&base, &vm, &err) == 0 && vm_recv(&vm, &f, proto_now_ms() + 60000, &err) == 0 &&
		    f.type == PROTO_HELLO) {
			cold[nc++] = proto_now_us() - t0;
			if (start_code(&vm, &err) == 0)
				cold_run[ncr++] = proto_now_us() - t0;
		} else {
			fprintf(stderr, "cold: %s\n", err.message);
		}
		vm_destroy(&vm);

		wait_pool(p);
		t0 = proto_now_us();
		if (snapshot_restore(&snap, &base, &vm, &err) == 0 && vm_setup(&vm, proto_now_ms() + 20000, &err) == 0) {
			rest[nr++] = proto_now_us() - t0;
			if (run_code(&vm, &err) == 0)
				rest_run[nrr++] = proto_now_us() - t0;
		} else {
			fprintf(stderr, "restore: %s\n", err.message);
		}
		vm_destroy(&vm);

		/* Restore into a QEMU that was started ahead of time (-incoming defer). */
		wait_pool(p);
		if (snapshot_spawn(&snap, &base, &vm, &err) == 0) {
			t0 = proto_now_us();
			if (snapshot_load(&snap, &vm, &err) == 0 && vm_setup(&vm, proto_now_ms() + 20000, &err) == 0) {
				load[nl++] = proto_now_us() - t0;
				if (run_code(&vm, &err) == 0)
					load_run[nlr++] = proto_now_us() - t0;
			} else {
				fprintf(stderr, "load: %s\n", err.message);
			}
		}
		vm_destroy(&vm);

		/* The pool refills in the background: wait (bounded) for a ready VM,
		 * and measure only while no refill competes for the CPU. */
		wait_pool(p);
		t0 = proto_now_us();
		if (pool_take(p, &vm, &err) == 0 && start_code(&vm, &err) == 0)
			pool[np++] = proto_now_us() - t0;
		else
			fprintf(stderr, "pool: %s\n", err.message[0] ? err.message : "no VM ready");
		vm_destroy(&vm);
	}

	/* print(1) end to end, through run_task, in each mode. */
	for (int i = 0; i < runs; i++) {
		for (int m = 0; m < 3; m++) {
			struct run_opts ro = { .vm = base, .boot_timeout_s = 60 };
			struct task_spec spec;
			struct kiln_err err = { .code = "" };
			/* print(1), except that the 1 is the guest's wall-clock time at
			 * the task's first line: the host set that clock at SETUP, so
			 * it also tells when user code started running. */
			const char *json = "{\"language\":\"python\",\"code\":\"import time; print(repr(time.time()))\"}";
			struct timespec rt0;
			json_t *r;
			int64_t t0;

			if (m >= 1)
				ro.snap = &snap;
			if (m == 2)
				ro.pool = p;
			wait_pool(p);
			t0 = proto_now_us();
			clock_gettime(CLOCK_REALTIME, &rt0);
			if (spec_parse(json, strlen(json), &spec, &err) < 0)
				return 1;
			r = run_task(&spec, &ro);
			if (!strcmp(json_string_value(json_object_get(r, "state")), "succeeded") &&
			    !strcmp(json_string_value(json_object_get(json_object_get(r, "timings"), "start")),
				    m == 0 ? "cold" : m == 1 ? "restore" : "pool"))
			{
				double g = strtod(json_string_value(json_object_get(r, "stdout")), NULL);

				e2e[m][ne2e[m]++] = proto_now_us() - t0;
				first[m][nfirst[m]++] = (int64_t)((g - (double)rt0.tv_sec - rt0.tv_nsec / 1e9) * 1e6);
			}
			else
				fprintf(stderr, "print(1) mode %d: %s\n", m, json_dumps(r, JSON_COMPACT));
			json_decref(r);
			spec_free(&spec);
		}
	}
	pool_stop(p);

	printf("start-up paths (%d runs each, interleaved; TCG, 1 vCPU, 256 MiB)\n", runs);
	printf(" to guest ready (kiln-init answers):\n");
	report("cold boot", cold, nc);
	report("snapshot restore (QEMU start + load)", rest, nr);
	report("restore into a pre-started QEMU", load, nl);
	printf(" to task code running (code file sent, EXEC answered STARTED):\n");
	report("cold boot", cold_run, ncr);
	report("snapshot restore", rest_run, nrr);
	report("restore into a pre-started QEMU", load_run, nlr);
	report("pool hand-out", pool, np);
	printf(" to the task's first line of Python running (guest clock, set by the host at SETUP):\n");
	report("cold", first[0], nfirst[0]);
	report("restore", first[1], nfirst[1]);
	report("pool", first[2], nfirst[2]);
	printf(" print(1) end to end through run_task (spec parse to result):\n");
	report("cold", e2e[0], ne2e[0]);
	report("restore", e2e[1], ne2e[1]);
	report("pool", e2e[2], ne2e[2]);
	{
		double c = (double)median(cold, nc), cr = (double)median(cold_run, ncr), e = (double)median(e2e[0], ne2e[0]);

		if (nr && nl && nrr && nlr && np && ne2e[1] && ne2e[2])
			printf(" ratios of medians:\n"
			       "  to ready:        cold/restore %.1fx, cold/restore-into-pre-started %.1fx\n"
			       "  to code running: cold/restore %.1fx, cold/restore-into-pre-started %.1fx, cold/pool %.1fx\n"
			       "  to first line:   cold/restore %.1fx, cold/pool %.1fx\n"
			       "  print(1):        cold/restore %.1fx, cold/pool %.1fx\n",
			       c / (double)median(rest, nr), c / (double)median(load, nl), cr / (double)median(rest_run, nrr),
			       cr / (double)median(load_run, nlr), cr / (double)median(pool, np),
			       (double)median(first[0], nfirst[0]) / (double)median(first[1], nfirst[1]),
			       (double)median(first[0], nfirst[0]) / (double)median(first[2], nfirst[2]),
			       e / (double)median(e2e[1], ne2e[1]),
			       e / (double)median(e2e[2], ne2e[2]));
	}
	printf("\nhost memory of one idle restored VM (QEMU process, after its first reply, paused)\n");
	for (unsigned mib = 256; mib <= 1024; mib *= 2) {
		struct snapshot s;
		struct kiln_err err = { .code = "" };
		struct vm vm;

		if (open_or_create(&base, cache, mib, &s) < 0)
			continue;
		if (snapshot_restore(&s, &base, &vm, &err) == 0 && vm_setup(&vm, proto_now_ms() + 20000, &err) == 0 &&
		    vm_qmp(&vm, "{\"execute\":\"stop\"}", proto_now_ms() + 10000, NULL, &err) == 0)
			printf("  guest %4u MiB: RSS %6.1f MiB, PSS %6.1f MiB (RAM file pages shared with other clones count once in PSS)\n",
			       mib, status_kib(vm.pid, "status", "VmRSS") / 1024.0,
			       status_kib(vm.pid, "smaps_rollup", "Pss") / 1024.0);
		else
			printf("  guest %4u MiB: %s\n", mib, err.message);
		vm_destroy(&vm);
	}
	/* The marginal cost of one more idle sandbox: N clones side by side share
	 * QEMU's text and the snapshot's page cache, as they would on a host. */
	{
		enum { N = 10 };
		static struct vm vms[N];
		struct kiln_err err = { .code = "" };
		long avail0 = status_kib(0, "/proc/meminfo", "MemAvailable"), avail1, pss = 0;
		int n = 0;

		for (int i = 0; i < N; i++) {
			if (snapshot_restore(&snap, &base, &vms[i], &err) == 0 &&
			    vm_setup(&vms[i], proto_now_ms() + 20000, &err) == 0 &&
			    vm_qmp(&vms[i], "{\"execute\":\"stop\"}", proto_now_ms() + 10000, NULL, &err) == 0)
				n++;
			else
				fprintf(stderr, "idle clone %d: %s\n", i, err.message);
		}
		avail1 = status_kib(0, "/proc/meminfo", "MemAvailable");
		for (int i = 0; i < N; i++)
			if (vms[i].pid > 0)
				pss += status_kib(vms[i].pid, "smaps_rollup", "Pss");
		if (n)
			printf("  %d idle clones of the 256 MiB snapshot side by side: PSS %.1f MiB each, MemAvailable down %.1f MiB each\n",
			       n, pss / 1024.0 / n, (avail0 - avail1) / 1024.0 / n);
		for (int i = 0; i < N; i++)
			vm_destroy(&vms[i]);
	}
	return 0;
}
