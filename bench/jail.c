/* bench/jail: what the jail around QEMU costs, jailed and unjailed runs
 * interleaved: cold boot to kiln-init's HELLO, snapshot restore to the
 * guest's first reply, restore into an already started QEMU, QEMU start-up to
 * its QMP greeting, vm_destroy, the time to load a snapshot's RAM into the
 * sealed memfd, and the host memory (RSS, PSS) of an idle restored clone.
 *   usage: jail IMAGE_DIR RUNS   (as root, with cgroup v1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jail.h"
#include "proto.h"
#include "snapshot.h"
#include "vm.h"

#include "bench.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static int64_t med(int64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_i64);
	return n ? v[n / 2] : 0;
}

static void report(const char *what, int64_t *plain, int np, int64_t *jailed, int nj)
{
	int64_t a = med(plain, np), b = med(jailed, nj);

	printf("  %-38s unjailed %8.2f ms  jailed %8.2f ms  (+%.2f ms; n=%d/%d)\n", what, a / 1e3, b / 1e3,
	       (b - a) / 1e3, np, nj);
}

int main(int argc, char **argv)
{
	static struct jail_config jc;
	struct vm_config base = { 0 }, cfg[2];
	struct kiln_err err = { .code = "" };
	struct snapshot snap;
	const char *cache = getenv("KILN_CACHE") ? getenv("KILN_CACHE") : "/var/cache/kiln";
	int runs, n[5][2] = { { 0 } };
	int64_t *t[5][2];
	char key[17];

	if (argc != 3 || (runs = atoi(argv[2])) <= 0) {
		fprintf(stderr, "usage: jail IMAGE_DIR RUNS\n");
		return 2;
	}
	for (int k = 0; k < 5; k++)
		for (int j = 0; j < 2; j++)
			t[k][j] = calloc((size_t)runs, sizeof(int64_t));
	bench_base(&base, argv[1]);
	{
		int64_t t0 = proto_now_us();

		if (vm_jail_config(&jc, base.qemu, base.accel, &err) < 0) {
			fprintf(stderr, "bench: %s\n", err.message);
			return 1;
		}
		printf("jail set-up once per process (libraries via ld.so --list, seccomp filter): %.1f ms\n",
		       (proto_now_us() - t0) / 1e3);
	}
	cfg[0] = base;
	cfg[1] = base;
	cfg[1].jail = &jc;
	if (snapshot_key(&base, 256, 1, key, &err) < 0 ||
	    (snapshot_open(cache, key, &snap, &err) < 0 && snapshot_create(&cfg[1], cache, 256, 1, 0, &snap, &err) < 0)) {
		fprintf(stderr, "bench: snapshot: %s\n", err.message);
		return 1;
	}
	{
		/* The memfd load, as snapshot_open does it once per process. */
		int64_t v[5];
		int fd;

		for (int i = 0; i < 5; i++) {
			struct stat st;
			int64_t t0 = proto_now_us();

			fd = jail_sealed_memfd(snap.mem, &st, &err);
			v[i] = proto_now_us() - t0;
			if (fd >= 0)
				close(fd);
		}
		printf("snapshot RAM (%u MiB) into a sealed memfd, once per process and snapshot: median %.1f ms\n",
		       snap.memory_mib, med(v, 5) / 1e3);
	}

	for (int i = 0; i < runs; i++) {
		for (int j = 0; j < 2; j++) {
			struct vm vm;
			struct proto_frame f;
			int64_t t0 = proto_now_us();

			/* QEMU start-up alone: spawn to QMP negotiated, -incoming (no guest runs). */
			if (snapshot_spawn(&snap, &cfg[j], &vm, &err) == 0) {
				t[0][j][n[0][j]++] = proto_now_us() - t0;
				t0 = proto_now_us();
				if (snapshot_load(&snap, &vm, &err) == 0 && vm_setup(&vm, proto_now_ms() + 20000, &err) == 0)
					t[1][j][n[1][j]++] = proto_now_us() - t0;
				else
					fprintf(stderr, "load (%s): %s\n", j ? "jailed" : "unjailed", err.message);
			} else {
				fprintf(stderr, "spawn (%s): %s\n", j ? "jailed" : "unjailed", err.message);
			}
			vm_destroy(&vm);

			t0 = proto_now_us();
			if (snapshot_restore(&snap, &cfg[j], &vm, &err) == 0 && vm_setup(&vm, proto_now_ms() + 20000, &err) == 0)
				t[2][j][n[2][j]++] = proto_now_us() - t0;
			else
				fprintf(stderr, "restore (%s): %s\n", j ? "jailed" : "unjailed", err.message);
			/* Teardown: kill, reap (the jail's namespaces go with its
			 * init), cgroups, directory. */
			t0 = proto_now_us();
			vm_destroy(&vm);
			t[4][j][n[4][j]++] = proto_now_us() - t0;

			t0 = proto_now_us();
			if (vm_start(&cfg[j], &vm, &err) == 0 && vm_recv(&vm, &f, proto_now_ms() + 60000, &err) == 0 &&
			    f.type == PROTO_HELLO)
				t[3][j][n[3][j]++] = proto_now_us() - t0;
			else
				fprintf(stderr, "cold (%s): %s\n", j ? "jailed" : "unjailed", err.message);
			vm_destroy(&vm);
		}
	}
	printf("start-up paths, %d runs each, interleaved (TCG, 1 vCPU, 256 MiB):\n", runs);
	report("QEMU start to QMP ready (-incoming)", t[0][0], n[0][0], t[0][1], n[0][1]);
	report("restore into a started QEMU", t[1][0], n[1][0], t[1][1], n[1][1]);
	report("snapshot restore (start + load)", t[2][0], n[2][0], t[2][1], n[2][1]);
	report("cold boot to HELLO", t[3][0], n[3][0], t[3][1], n[3][1]);
	report("vm_destroy of a restored clone", t[4][0], n[4][0], t[4][1], n[4][1]);

	printf("host memory of one idle restored clone (after its first reply, paused), median of 5:\n");
	for (int j = 0; j < 2; j++) {
		int64_t rss[5], pss[5];
		int m = 0;

		for (int i = 0; i < 5; i++) {
			struct vm vm;

			if (snapshot_restore(&snap, &cfg[j], &vm, &err) == 0 && vm_setup(&vm, proto_now_ms() + 20000, &err) == 0 &&
			    vm_qmp(&vm, "{\"execute\":\"stop\"}", proto_now_ms() + 10000, NULL, &err) == 0) {
				rss[m] = status_kib(vm.pid, "status", "VmRSS");
				pss[m++] = status_kib(vm.pid, "smaps_rollup", "Pss");
			}
			vm_destroy(&vm);
		}
		printf("  %-9s RSS %6.1f MiB  PSS %6.1f MiB\n", j ? "jailed" : "unjailed", med(rss, m) / 1024.0,
		       med(pss, m) / 1024.0);
	}
	snapshot_close(&snap);
	jail_config_free(&jc);
	return 0;
}
