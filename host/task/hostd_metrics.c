/* hostd_metrics: what the host reports about its tasks and capacity:
 * GET /v1/capacity (also the heartbeat's body) and GET /metrics
 * (Prometheus text). Read-only views under the hostd's locks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "hostd_int.h"
#include "metrics.h"
#include "template/template.h"

/* One counter of the VMs' common memory cgroup (bytes, or a count), 0 when
 * there is none or it cannot be read. */
static uint64_t memcg_value(const struct capacity *cap, const char *file, const char *key)
{
	char path[700], buf[512];
	const char *p = buf;
	size_t n;
	FILE *f;

	if (!cap->memcg)
		return 0;
	snprintf(path, sizeof(path), "%s/%s", cap->memcg, file);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (key && !(p = strstr(buf, key)))
		return 0;
	return strtoull(p + (key ? strlen(key) : 0), NULL, 10);
}

json_t *hostd_capacity_json(struct hostd *d)
{
	unsigned running = 0, uploading = 0, vcpus_used, vcpus_idle;
	int draining;
	int64_t drain_deadline_ms;
	uint64_t total_mib, used_mib;
	struct pool_stats ps = { 0 };
	json_t *j, *mem;

	pthread_mutex_lock(&d->lock);
	for (struct hostd_task *t = d->tasks; t; t = t->next) {
		running += t->state == TS_STARTING || t->state == TS_RUNNING;
		uploading += t->state == TS_UPLOADING;
	}
	vcpus_used = d->vcpus_used;
	vcpus_idle = d->vcpus_idle;
	draining = d->draining;
	drain_deadline_ms = d->drain_deadline_ms;
	pthread_mutex_unlock(&d->lock);
	pthread_mutex_lock(&d->cap->lock);
	total_mib = d->cap->total_mib;
	used_mib = d->cap->used_mib;
	pthread_mutex_unlock(&d->cap->lock);
	if (d->pool)
		pool_stats(d->pool, &ps);
	j = json_pack("{s:s, s:s, s:{s:i, s:i, s:i, s:i}, s:{s:I, s:I}, s:i, s:i, s:{s:i, s:i, s:i, s:i}, s:b}", "host_id",
			 d->host_id, "accel", d->cfg.accel ? d->cfg.accel : "tcg", "vcpus", "total",
			 (int)d->cfg.vcpus_total, "used", (int)vcpus_used, "idle", (int)vcpus_idle, "idle_max",
			 (int)d->cfg.vcpus_idle_max, "memory_mib", "total", (json_int_t)total_mib,
			 "used", (json_int_t)used_mib, "running_tasks", (int)running, "uploading_tasks", (int)uploading,
			 "pool", "ready", d->pool ? (int)pool_ready(d->pool) : 0, "prestarted",
			 d->pool ? (int)pool_prestarted(d->pool) : 0, "memory_mib",
			 d->pool ? (int)pool_memory_mib(d->pool) : 0, "vcpus", d->pool ? (int)pool_vcpus(d->pool) : 0,
			 "egress", d->ro.net && d->ro.net->enabled);
	/* The nominal total above is what placement counts against (budget x
	 * overcommit); the budget and what the VMs really use sit beside it. */
	if (j && (mem = json_object_get(j, "memory_mib")) && d->cap->budget_mib) {
		json_object_set_new(mem, "budget", json_integer((json_int_t)d->cap->budget_mib));
		uint64_t usage = memcg_value(d->cap, "memory.usage_in_bytes", NULL);

		json_object_set_new(mem, "usage", json_integer((json_int_t)(usage >> 20)));
	}
	/* kiln-host drain: kiln-api takes the heartbeat's word for it. */
	if (j && draining) {
		json_object_set_new(j, "draining", json_true());
		if (drain_deadline_ms > 0)
			json_object_set_new(j, "drain_deadline_ms", json_integer((json_int_t)drain_deadline_ms));
	}
	if (j && d->pool) {
		json_t *po = json_object_get(j, "pool");

		json_object_set_new(po, "target", json_integer(ps.target));
		json_object_set_new(po, "min", json_integer(ps.min));
		json_object_set_new(po, "max", json_integer(ps.max));
		json_object_set_new(po, "misses", json_integer((json_int_t)ps.misses));
		json_object_set_new(po, "refill_ms", json_integer(ps.refill_ms));
		json_object_set_new(po, "refills", json_integer(ps.refills));
	}
	if (j && d->cfg.templates)
		json_object_set_new(j, "templates", template_store_json(d->cfg.templates));
	return j;
}

/* kiln_host_*: every metric hostd_metrics writes, declared once. */
enum {
	M_TASKS, M_ACCEPTED, M_FINISHED, M_START, M_VMS, M_UP_BYTES, M_UP_FILES, M_UP_FAIL, M_VCPUS, M_VCPUS_IDLE, M_POOL_READY,
	M_POOL_TARGET, M_POOL_TAKES, M_POOL_MISSES, M_MEM_USED, M_MEM_ADMITTED, M_MEM_BUDGET, M_MEM_USAGE,
	M_MEM_HITS, M_EG_SANDBOXES, M_EG_CONNS, M_EG_BYTES, M_EG_DNS, M_COUNT
};
static const struct metric host_metrics[M_COUNT] = {
	[M_TASKS] = {
		.name = "kiln_host_tasks", .type = METRIC_GAUGE, .labels = { "state" },
		.help = "Tasks known to this host, by state.",
	},
	[M_ACCEPTED] = {
		.name = "kiln_host_tasks_accepted_total", .type = METRIC_COUNTER,
		.help = "Tasks accepted.",
	},
	[M_FINISHED] = {
		.name = "kiln_host_tasks_finished_total", .type = METRIC_COUNTER, .labels = { "state" },
		.help = "Tasks that reached a final state.",
	},
	[M_START] = {
		.name = "kiln_host_task_start_seconds", .type = METRIC_HISTOGRAM,
		.bounds = hostd_start_buckets, .nbounds = HOSTD_START_BUCKETS,
		.help = "From acceptance to the task's code running.",
	},
	[M_VMS] = {
		.name = "kiln_host_vms_running", .type = METRIC_GAUGE,
		.help = "VMs running tasks.",
	},
	[M_UP_BYTES] = {
		.name = "kiln_host_upload_bytes_total", .type = METRIC_COUNTER,
		.help = "Bytes sent to S3, retries included.",
	},
	[M_UP_FILES] = {
		.name = "kiln_host_upload_files_total", .type = METRIC_COUNTER,
		.help = "Files S3 confirmed.",
	},
	[M_UP_FAIL] = {
		.name = "kiln_host_upload_failures_total", .type = METRIC_COUNTER,
		.help = "Failed upload attempts (each is retried).",
	},
	[M_VCPUS] = {
		.name = "kiln_host_vcpus_used", .type = METRIC_GAUGE,
		.help = "vCPUs reserved and running work (tasks, builds, sessions whose vCPUs run).",
	},
	[M_VCPUS_IDLE] = {
		.name = "kiln_host_vcpus_idle", .type = METRIC_GAUGE,
		.help = "vCPUs reserved by idle sessions whose vCPUs are stopped (not counted against the capacity).",
	},
	[M_POOL_READY] = {
		.name = "kiln_host_pool_ready", .type = METRIC_GAUGE,
		.help = "Warm pool VMs ready.",
	},
	[M_POOL_TARGET] = {
		.name = "kiln_host_pool_target", .type = METRIC_GAUGE,
		.help = "Warm pool VMs the default template's pool aims for now (between its size and max, by recent "
			"demand).",
	},
	[M_POOL_TAKES] = {
		.name = "kiln_host_pool_takes_total", .type = METRIC_COUNTER,
		.help = "Tasks that asked the pool for a VM.",
	},
	[M_POOL_MISSES] = {
		.name = "kiln_host_pool_misses_total", .type = METRIC_COUNTER,
		.help = "Tasks that found no warm VM ready (restored instead).",
	},
	[M_MEM_USED] = {
		.name = "kiln_host_memory_used_mib", .type = METRIC_GAUGE,
		.help = "Guest memory reserved (tasks and pool).",
	},
	[M_MEM_ADMITTED] = {
		.name = "kiln_host_memory_admitted_mib", .type = METRIC_GAUGE,
		.help = "Nominal guest memory this host admits (budget x overcommit).",
	},
	[M_MEM_BUDGET] = {
		.name = "kiln_host_memory_budget_mib", .type = METRIC_GAUGE,
		.help = "Real memory all VMs may use together (their cgroup's limit).",
	},
	[M_MEM_USAGE] = {
		.name = "kiln_host_memory_usage_bytes", .type = METRIC_GAUGE,
		.help = "Memory the VMs' cgroups really use (QEMU and guest RAM, cache).",
	},
	[M_MEM_HITS] = {
		.name = "kiln_host_memory_budget_hits_total", .type = METRIC_COUNTER,
		.help = "Times the VMs together reached the budget (memory.failcnt).",
	},
	[M_EG_SANDBOXES] = {
		.name = "kiln_host_egress_sandboxes", .type = METRIC_GAUGE,
		.help = "Sandboxes with a network now.",
	},
	[M_EG_CONNS] = {
		.name = "kiln_host_egress_connections_total", .type = METRIC_COUNTER, .labels = { "verdict" },
		.help = "Connections from sandboxes, by verdict.",
	},
	[M_EG_BYTES] = {
		.name = "kiln_host_egress_bytes_total", .type = METRIC_COUNTER, .labels = { "direction" },
		.help = "IP bytes through sandboxes' NICs that were let through.",
	},
	[M_EG_DNS] = {
		.name = "kiln_host_egress_dns_queries_total", .type = METRIC_COUNTER, .labels = { "answer" },
		.help = "Queries to sandboxes' resolvers, by answer.",
	},
};

char *hostd_metrics(struct hostd *d)
{
	uint64_t by_state[TS_COUNT] = { 0 };
	struct buf b = BUF_INIT;

	pthread_mutex_lock(&d->lock);
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		by_state[t->state]++;
	metric_write_by(&b, &host_metrics[M_TASKS], hostd_state_names, by_state, TS_COUNT);
	metric_write(&b, &host_metrics[M_ACCEPTED], d->accepted_total);
	metric_write_by(&b, &host_metrics[M_FINISHED], &hostd_state_names[TS_SUCCEEDED], &d->finished_total[TS_SUCCEEDED],
			TS_COUNT - TS_SUCCEEDED);
	metric_write_histogram(&b, &host_metrics[M_START], d->start_hist, d->start_count, d->start_sum);
	metric_write(&b, &host_metrics[M_VMS], by_state[TS_STARTING] + by_state[TS_RUNNING]);
	metric_write(&b, &host_metrics[M_UP_BYTES], d->upload_bytes);
	metric_write(&b, &host_metrics[M_UP_FILES], d->upload_files);
	metric_write(&b, &host_metrics[M_UP_FAIL], d->upload_failures);
	metric_write(&b, &host_metrics[M_VCPUS], d->vcpus_used);
	metric_write(&b, &host_metrics[M_VCPUS_IDLE], d->vcpus_idle);
	pthread_mutex_unlock(&d->lock);
	metric_write(&b, &host_metrics[M_POOL_READY], d->pool ? pool_ready(d->pool) : 0);
	if (d->pool) {
		struct pool_stats ps;

		pool_stats(d->pool, &ps);
		metric_write(&b, &host_metrics[M_POOL_TARGET], ps.target);
		metric_write(&b, &host_metrics[M_POOL_TAKES], ps.takes);
		metric_write(&b, &host_metrics[M_POOL_MISSES], ps.misses);
	}
	pthread_mutex_lock(&d->cap->lock);
	metric_write(&b, &host_metrics[M_MEM_USED], d->cap->used_mib);
	metric_write(&b, &host_metrics[M_MEM_ADMITTED], d->cap->total_mib);
	pthread_mutex_unlock(&d->cap->lock);
	if (d->cap->budget_mib)
		metric_write(&b, &host_metrics[M_MEM_BUDGET], d->cap->budget_mib);
	if (d->cap->memcg) {
		metric_write(&b, &host_metrics[M_MEM_USAGE], memcg_value(d->cap, "memory.usage_in_bytes", NULL));
		metric_write(&b, &host_metrics[M_MEM_HITS], memcg_value(d->cap, "memory.failcnt", NULL));
	}
	if (d->cfg.templates)
		template_store_metrics(d->cfg.templates, &b);
	if (d->ro.net && d->ro.net->enabled) {
		struct net_host *n = d->ro.net;
		static const char *const verdicts[] = { "allowed", "blocked" }, *const directions[] = { "out", "in" },
					 *const answers[] = { "refused", "served" };

		/* Finished sandboxes' totals (a running task's counters join at its end). */
		pthread_mutex_lock(&n->lock);
		metric_write(&b, &host_metrics[M_EG_SANDBOXES], n->active);
		metric_write_by(&b, &host_metrics[M_EG_CONNS], verdicts, (uint64_t[]){ n->allowed, n->blocked }, 2);
		metric_write_by(&b, &host_metrics[M_EG_BYTES], directions, (uint64_t[]){ n->bytes_out, n->bytes_in }, 2);
		metric_write_by(&b, &host_metrics[M_EG_DNS], answers,
				(uint64_t[]){ n->dns_refused, n->dns_queries - n->dns_refused }, 2);
		pthread_mutex_unlock(&n->lock);
	}
	/* Empty on allocation failure: the caller answers 500. */
	if (!b.len) {
		buf_free(&b);
		return NULL;
	}
	return buf_steal(&b, NULL);
}
