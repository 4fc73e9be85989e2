/* hostd_metrics: what the host reports about its tasks and capacity:
 * GET /v1/capacity (also the heartbeat's body) and GET /metrics
 * (Prometheus text). Read-only views under the hostd's locks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "hostd_int.h"
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
	unsigned running = 0, uploading = 0, vcpus_used;
	uint64_t total_mib, used_mib;
	struct pool_stats ps = { 0 };
	json_t *j, *mem;

	pthread_mutex_lock(&d->lock);
	for (struct hostd_task *t = d->tasks; t; t = t->next) {
		running += t->state == TS_STARTING || t->state == TS_RUNNING;
		uploading += t->state == TS_UPLOADING;
	}
	vcpus_used = d->vcpus_used;
	pthread_mutex_unlock(&d->lock);
	pthread_mutex_lock(&d->cap->lock);
	total_mib = d->cap->total_mib;
	used_mib = d->cap->used_mib;
	pthread_mutex_unlock(&d->cap->lock);
	if (d->pool)
		pool_stats(d->pool, &ps);
	j = json_pack("{s:s, s:s, s:{s:i, s:i}, s:{s:I, s:I}, s:i, s:i, s:{s:i, s:i, s:i, s:i}, s:b}", "host_id",
			 d->host_id, "accel", d->cfg.accel ? d->cfg.accel : "tcg", "vcpus", "total",
			 (int)d->cfg.vcpus_total, "used", (int)vcpus_used, "memory_mib", "total", (json_int_t)total_mib,
			 "used", (json_int_t)used_mib, "running_tasks", (int)running, "uploading_tasks", (int)uploading,
			 "pool", "ready", d->pool ? (int)pool_ready(d->pool) : 0, "prestarted",
			 d->pool ? (int)pool_prestarted(d->pool) : 0, "memory_mib",
			 d->pool ? (int)pool_memory_mib(d->pool) : 0, "vcpus", d->pool ? (int)pool_vcpus(d->pool) : 0,
			 "egress", d->ro.net && d->ro.net->enabled);
	/* The nominal total above is what placement counts against (budget x
	 * overcommit); the budget and what the VMs really use sit beside it. */
	if (j && (mem = json_object_get(j, "memory_mib")) && d->cap->budget_mib) {
		json_object_set_new(mem, "budget", json_integer((json_int_t)d->cap->budget_mib));
		json_object_set_new(mem, "usage", json_integer((json_int_t)(memcg_value(d->cap, "memory.usage_in_bytes", NULL) >> 20)));
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

char *hostd_metrics(struct hostd *d)
{
	unsigned by_state[TS_COUNT] = { 0 };
	struct buf b = BUF_INIT;
	uint64_t cum = 0;

	pthread_mutex_lock(&d->lock);
	for (struct hostd_task *t = d->tasks; t; t = t->next)
		by_state[t->state]++;
	buf_adds(&b, "# HELP kiln_host_tasks Tasks known to this host, by state.\n# TYPE kiln_host_tasks gauge\n");
	for (int i = 0; i < TS_COUNT; i++)
		buf_printf(&b, "kiln_host_tasks{state=\"%s\"} %u\n", hostd_state_names[i], by_state[i]);
	buf_adds(&b, "# HELP kiln_host_tasks_accepted_total Tasks accepted.\n# TYPE kiln_host_tasks_accepted_total counter\n");
	buf_printf(&b, "kiln_host_tasks_accepted_total %llu\n", (unsigned long long)d->accepted_total);
	buf_adds(&b, "# HELP kiln_host_tasks_finished_total Tasks that reached a final state.\n"
		 "# TYPE kiln_host_tasks_finished_total counter\n");
	for (int i = TS_SUCCEEDED; i < TS_COUNT; i++)
		buf_printf(&b, "kiln_host_tasks_finished_total{state=\"%s\"} %llu\n", hostd_state_names[i],
			   (unsigned long long)d->finished_total[i]);
	buf_adds(&b, "# HELP kiln_host_task_start_seconds From acceptance to the task's code running.\n"
		 "# TYPE kiln_host_task_start_seconds histogram\n");
	for (int i = 0; i < HOSTD_START_BUCKETS; i++) {
		cum += d->start_hist[i];
		buf_printf(&b, "kiln_host_task_start_seconds_bucket{le=\"%g\"} %llu\n", hostd_start_buckets[i],
			   (unsigned long long)cum);
	}
	buf_printf(&b, "kiln_host_task_start_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)d->start_count);
	buf_printf(&b, "kiln_host_task_start_seconds_sum %.6f\nkiln_host_task_start_seconds_count %llu\n", d->start_sum,
		   (unsigned long long)d->start_count);
	buf_adds(&b, "# HELP kiln_host_vms_running VMs running tasks.\n# TYPE kiln_host_vms_running gauge\n");
	buf_printf(&b, "kiln_host_vms_running %u\n", by_state[TS_STARTING] + by_state[TS_RUNNING]);
	buf_adds(&b, "# HELP kiln_host_upload_bytes_total Bytes sent to S3, retries included.\n"
		 "# TYPE kiln_host_upload_bytes_total counter\n");
	buf_printf(&b, "kiln_host_upload_bytes_total %llu\n", (unsigned long long)d->upload_bytes);
	buf_adds(&b, "# HELP kiln_host_upload_files_total Files S3 confirmed.\n# TYPE kiln_host_upload_files_total counter\n");
	buf_printf(&b, "kiln_host_upload_files_total %llu\n", (unsigned long long)d->upload_files);
	buf_adds(&b, "# HELP kiln_host_upload_failures_total Failed upload attempts (each is retried).\n"
		 "# TYPE kiln_host_upload_failures_total counter\n");
	buf_printf(&b, "kiln_host_upload_failures_total %llu\n", (unsigned long long)d->upload_failures);
	buf_adds(&b, "# HELP kiln_host_vcpus_used vCPUs reserved by tasks.\n# TYPE kiln_host_vcpus_used gauge\n");
	buf_printf(&b, "kiln_host_vcpus_used %u\n", d->vcpus_used);
	pthread_mutex_unlock(&d->lock);
	buf_adds(&b, "# HELP kiln_host_pool_ready Warm pool VMs ready.\n# TYPE kiln_host_pool_ready gauge\n");
	buf_printf(&b, "kiln_host_pool_ready %u\n", d->pool ? pool_ready(d->pool) : 0);
	if (d->pool) {
		struct pool_stats ps;

		pool_stats(d->pool, &ps);
		buf_adds(&b, "# HELP kiln_host_pool_target Warm pool VMs the default template's pool aims for now "
			     "(between its size and max, by recent demand).\n# TYPE kiln_host_pool_target gauge\n");
		buf_printf(&b, "kiln_host_pool_target %u\n", ps.target);
		buf_adds(&b, "# HELP kiln_host_pool_takes_total Tasks that asked the pool for a VM.\n"
			     "# TYPE kiln_host_pool_takes_total counter\n");
		buf_printf(&b, "kiln_host_pool_takes_total %llu\n", (unsigned long long)ps.takes);
		buf_adds(&b, "# HELP kiln_host_pool_misses_total Tasks that found no warm VM ready (restored instead).\n"
			     "# TYPE kiln_host_pool_misses_total counter\n");
		buf_printf(&b, "kiln_host_pool_misses_total %llu\n", (unsigned long long)ps.misses);
	}
	pthread_mutex_lock(&d->cap->lock);
	buf_adds(&b, "# HELP kiln_host_memory_used_mib Guest memory reserved (tasks and pool).\n"
		 "# TYPE kiln_host_memory_used_mib gauge\n");
	buf_printf(&b, "kiln_host_memory_used_mib %llu\n", (unsigned long long)d->cap->used_mib);
	buf_adds(&b, "# HELP kiln_host_memory_admitted_mib Nominal guest memory this host admits (budget x overcommit).\n"
		 "# TYPE kiln_host_memory_admitted_mib gauge\n");
	buf_printf(&b, "kiln_host_memory_admitted_mib %llu\n", (unsigned long long)d->cap->total_mib);
	pthread_mutex_unlock(&d->cap->lock);
	if (d->cap->budget_mib) {
		buf_adds(&b, "# HELP kiln_host_memory_budget_mib Real memory all VMs may use together (their cgroup's limit).\n"
			 "# TYPE kiln_host_memory_budget_mib gauge\n");
		buf_printf(&b, "kiln_host_memory_budget_mib %llu\n", (unsigned long long)d->cap->budget_mib);
	}
	if (d->cap->memcg) {
		buf_adds(&b, "# HELP kiln_host_memory_usage_bytes Memory the VMs' cgroups really use (QEMU and guest RAM, cache).\n"
			 "# TYPE kiln_host_memory_usage_bytes gauge\n");
		buf_printf(&b, "kiln_host_memory_usage_bytes %llu\n",
			   (unsigned long long)memcg_value(d->cap, "memory.usage_in_bytes", NULL));
		buf_adds(&b, "# HELP kiln_host_memory_budget_hits_total Times the VMs together reached the budget (memory.failcnt).\n"
			 "# TYPE kiln_host_memory_budget_hits_total counter\n");
		buf_printf(&b, "kiln_host_memory_budget_hits_total %llu\n",
			   (unsigned long long)memcg_value(d->cap, "memory.failcnt", NULL));
	}
	if (d->cfg.templates)
		template_store_metrics(d->cfg.templates, &b);
	if (d->ro.net && d->ro.net->enabled) {
		struct net_host *n = d->ro.net;

		/* Finished sandboxes' totals (a running task's counters join at its end). */
		pthread_mutex_lock(&n->lock);
		buf_adds(&b, "# HELP kiln_host_egress_sandboxes Sandboxes with a network now.\n"
			 "# TYPE kiln_host_egress_sandboxes gauge\n");
		buf_printf(&b, "kiln_host_egress_sandboxes %llu\n", (unsigned long long)n->active);
		buf_adds(&b, "# HELP kiln_host_egress_connections_total Connections from sandboxes, by verdict.\n"
			 "# TYPE kiln_host_egress_connections_total counter\n");
		buf_printf(&b, "kiln_host_egress_connections_total{verdict=\"allowed\"} %llu\n", (unsigned long long)n->allowed);
		buf_printf(&b, "kiln_host_egress_connections_total{verdict=\"blocked\"} %llu\n", (unsigned long long)n->blocked);
		buf_adds(&b, "# HELP kiln_host_egress_bytes_total IP bytes through sandboxes' NICs that were let through.\n"
			 "# TYPE kiln_host_egress_bytes_total counter\n");
		buf_printf(&b, "kiln_host_egress_bytes_total{direction=\"out\"} %llu\n", (unsigned long long)n->bytes_out);
		buf_printf(&b, "kiln_host_egress_bytes_total{direction=\"in\"} %llu\n", (unsigned long long)n->bytes_in);
		buf_adds(&b, "# HELP kiln_host_egress_dns_queries_total Queries to sandboxes' resolvers, by answer.\n"
			 "# TYPE kiln_host_egress_dns_queries_total counter\n");
		buf_printf(&b, "kiln_host_egress_dns_queries_total{answer=\"refused\"} %llu\n", (unsigned long long)n->dns_refused);
		buf_printf(&b, "kiln_host_egress_dns_queries_total{answer=\"served\"} %llu\n",
			   (unsigned long long)(n->dns_queries - n->dns_refused));
		pthread_mutex_unlock(&n->lock);
	}
	/* Empty on allocation failure: the caller answers 500. */
	if (!b.len) {
		buf_free(&b);
		return NULL;
	}
	return buf_steal(&b, NULL);
}

