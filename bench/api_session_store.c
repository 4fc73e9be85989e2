/* api_session_store: what a session exec costs kiln-api's store (figures,
 * not pass/fail), per exec, in the store's own calls, without HTTP or VMs:
 *   touch x2      the writes an exec made before leases (last_active_ms at
 *                 its start and end: store_session_touch twice)
 *   lease+touch   what it makes now: the lease taken with the first touch
 *                 and dropped with the second, each pair one transaction
 *                 (store_session_lease_set / _drop with touch)
 *   renew         one renewal of a process's leases (every second while it
 *                 holds any)
 * on SQLite (WAL, synchronous=FULL: each commit an fsync; a file in
 * $TMPDIR or /tmp) and, given a conninfo as the first argument, on
 * PostgreSQL (synchronous_commit on). N (env, default 500) rounds each
 * (2 ms apart, as an exec would keep them, not counted); median and mean
 * per round in microseconds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "quota.h"
#include "store.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static int64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void report(const char *store, const char *what, int64_t *t, int n)
{
	int64_t sum = 0;

	for (int i = 0; i < n; i++)
		sum += t[i];
	qsort(t, (size_t)n, sizeof(*t), cmp_i64);
	printf("  %-10s %-12s median %7lld us  mean %7lld us  (n=%d)\n", store, what, (long long)t[n / 2],
	       (long long)(sum / n), n);
}

static int run(const char *target, const char *label)
{
	struct kiln_err err = { .code = "" };
	struct store *s = store_open(target, &err);
	struct store_session_new sn = { .spec_json = "{}", .vcpus = 1, .memory_mib = 256,
					.idle_timeout_s = 600, .max_lifetime_s = 3600, .host_id = "h1" };
	struct quota q;
	char id[40], owner[64]; /* the customer and the lease owner */
	int n = getenv("N") ? atoi(getenv("N")) : 500;
	int64_t *t, *u;

	if (!s) {
		fprintf(stderr, "api_session_store: %s: %s\n", label, err.message);
		return 1;
	}
	if (n < 1)
		n = 1;
	t = calloc((size_t)n, sizeof(*t));
	u = calloc((size_t)n, sizeof(*u));
	snprintf(owner, sizeof(owner), "bench-%ld", (long)getpid());
	sn.customer = owner;
	quota_defaults(&q);
	store_customer_create(s, owner, owner, &q, &err);
	if (!t || !u || store_session_create(s, &sn, id, &err) != 0) {
		fprintf(stderr, "api_session_store: %s: %s\n", label, err.message);
		return 1;
	}
	/* Rounds alternate the two, so that a busy machine slows both alike;
	 * the exec itself between a round's two writes: 2 ms, not counted
	 * (without it the second touch would write the same millisecond,
	 * which SQLite does not even commit). */
	for (int i = 0; i < n; i++) {
		int64_t t0 = now_us(), t1;

		store_session_touch(s, id);
		t1 = now_us();
		usleep(2000);
		t0 += now_us() - t1;
		store_session_touch(s, id);
		t[i] = now_us() - t0;
		t0 = now_us();
		store_session_lease_set(s, id, owner, 1, 5000, 1);
		t1 = now_us();
		usleep(2000);
		t0 += now_us() - t1;
		store_session_lease_drop(s, id, owner, 1);
		u[i] = now_us() - t0;
	}
	report(label, "touch x2", t, n);
	report(label, "lease+touch", u, n);
	store_session_lease_set(s, id, owner, 1, 5000, 0);
	for (int i = 0; i < n; i++) {
		int64_t t0;

		usleep(2000);
		t0 = now_us();
		store_session_leases_renew(s, owner, 5000);
		t[i] = now_us() - t0;
	}
	report(label, "renew", t, n);
	store_session_lease_drop(s, id, owner, 0);
	store_session_transition(s, id, SESSION_STARTING, SESSION_DESTROYED, "", "deleted", NULL);
	free(t);
	free(u);
	store_close(s);
	return 0;
}

int main(int argc, char **argv)
{
	char dir[256], path[300];
	int r;

	snprintf(dir, sizeof(dir), "%s/kiln-bench-store.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/api.db", dir);
	printf("session exec: the store's writes per exec, before leases and now\n");
	r = run(path, "sqlite");
	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	if (system(path) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	if (argc > 1)
		r |= run(argv[1], "postgresql");
	return r;
}
