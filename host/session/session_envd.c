/* session_envd: what a session gives the E2B-style envd endpoints
 * (envd_http.c): its envd channel (host/envd/envd.h), opened on first use and
 * closed with the VM, its default env, and its metrics. None of it takes
 * the session's operation lock: envd requests run beside commands, files
 * and each other. */
#include "session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "envd/envd.h"
#include "fsutil.h"
#include "io.h"

void session_envd_enable(struct session_table *ss, struct session *s)
{
	pthread_mutex_lock(&ss->lock);
	s->envd_ok = 1;
	pthread_mutex_unlock(&ss->lock);
}

void session_envd_close(struct session_table *ss, struct session *s, const char *why)
{
	struct envd *e;

	pthread_mutex_lock(&ss->lock);
	e = s->envd;
	s->envd = NULL;
	s->envd_ok = 0;
	pthread_mutex_unlock(&ss->lock);
	if (e) {
		envd_kill(e, why);
		envd_unref(e);
	}
}

void sessions_envd_stop(struct session_table *ss)
{
	for (;;) {
		struct envd *e = NULL;

		pthread_mutex_lock(&ss->lock);
		ss->envd_stopped = 1;
		for (struct session *s = ss->list; s && !e; s = s->next)
			if (s->envd) {
				e = s->envd;
				s->envd = NULL;
			}
		pthread_mutex_unlock(&ss->lock);
		if (!e)
			return;
		envd_kill(e, "kiln-host is shutting down");
		/* Let the streams write their end before the HTTP server goes. */
		envd_wait_idle(e, proto_now_ms() + 3000);
		envd_unref(e);
	}
}

static struct session *find_locked(struct session_table *ss, const char *id)
{
	for (struct session *s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id) && s->state != SS_GONE)
			return s;
	return NULL;
}

/* session_envd with s->wake held (and a reference on s). */
static struct envd *envd_take(struct session_table *ss, struct session *s, const char *id, json_t **env,
			      struct kiln_err *err)
{
	struct envd *e = NULL;
	json_t *j;

	pthread_mutex_lock(&ss->lock);
	if (s->stopped && s->state != SS_GONE) {
		/* The idler stopped its VM: continue it before the request
		 * reaches envd (session_idle.c); with op too, for SETUP on the
		 * agent channel. Only a destroy holds op on a stopped VM: then
		 * there is nothing to wake. */
		int r = 0;

		pthread_mutex_unlock(&ss->lock);
		if (pthread_mutex_trylock(&s->op) == 0) {
			r = session_wake_held(ss, s, err);
			pthread_mutex_unlock(&s->op);
		} else {
			r = kiln_err_set(err, KERR_UNAVAILABLE, "session %s is being destroyed", id);
		}
		if (r < 0) {
			if (err->errc != KERR_UNAVAILABLE)
				kiln_err_set(err, KERR_UNAVAILABLE, "session %s: its VM does not continue", id);
			return NULL;
		}
		pthread_mutex_lock(&ss->lock);
	}
	if (s->state == SS_GONE) {
		pthread_mutex_unlock(&ss->lock);
		kiln_err_set(err, KERR_NOT_FOUND, "no session %s on this host", id);
		return NULL;
	}
	if (s->state != SS_RUNNING || !s->envd_ok || s->vm.envd_fd < 0 || ss->envd_stopped) {
		pthread_mutex_unlock(&ss->lock);
		kiln_err_set(err, KERR_UNAVAILABLE, "session %s is not running (pausing or starting)", id);
		return NULL;
	}
	if (s->envd && !envd_alive(s->envd)) {
		/* Its channel broke (the guest's envd misbehaved): a new one. */
		envd_unref(s->envd);
		s->envd = NULL;
	}
	if (!s->envd) {
		char name[100];

		snprintf(name, sizeof(name), "session %s envd", s->id);
		s->envd = envd_open(s->vm.envd_fd, name);
	}
	if (s->envd) {
		e = s->envd;
		envd_ref(e);
	}
	j = json_object_get(s->spec, "env");
	*env = json_is_object(j) ? json_deep_copy(j) : json_object();
	s->last_active_ms = clock_wall_ms();
	pthread_mutex_unlock(&ss->lock);
	if (!e) {
		json_decref(*env);
		*env = NULL;
		kiln_err_set(err, KERR_HOST_ERROR, "cannot open the session's envd channel (out of memory)");
	}
	return e;
}

/* Every envd request takes s->wake, stopped VM or not: the idler's whole
 * stop decision (re-check, PROCS_QUERY, QMP stop) runs under it, so a
 * request either waits for the decision and then finds the VM stopped (and
 * continues it), or holds its channel reference (envd busy) before the
 * idler looks. Without it a request could reach the guest between the
 * idler's re-check and its QMP stop, and wait for an answer from a stopped
 * VM until its client gave up. */
struct envd *session_envd(struct session_table *ss, const char *id, json_t **env, struct kiln_err *err)
{
	struct session *s;
	struct envd *e;

	*env = NULL;
	pthread_mutex_lock(&ss->lock);
	s = find_locked(ss, id);
	if (!s) {
		pthread_mutex_unlock(&ss->lock);
		kiln_err_set(err, KERR_NOT_FOUND, "no session %s on this host", id);
		return NULL;
	}
	s->refs++;
	pthread_mutex_unlock(&ss->lock);
	pthread_mutex_lock(&s->wake);
	e = envd_take(ss, s, id, env, err);
	pthread_mutex_unlock(&s->wake);
	session_unref(ss, s);
	return e;
}

/* ---- metrics -------------------------------------------------------------- */

static int read_u64(const char *path, uint64_t *v)
{
	char buf[64];

	if (io_read_small(path, buf, sizeof(buf)) < 0)
		return -1;
	*v = strtoull(buf, NULL, 10);
	return 0;
}

/* QEMU's CPU time (all its threads: the vCPUs and the emulation), ns:
 * utime + stime, fields 14 and 15 of its stat. */
static uint64_t qemu_cpu_ns(pid_t pid)
{
	unsigned long long t[2];
	long tick = sysconf(_SC_CLK_TCK);

	if (fs_proc_stat(pid, 14, 2, t) < 0 || tick <= 0)
		return 0;
	return (t[0] + t[1]) * (1000000000ull / (uint64_t)tick);
}

/* The virtual size in a qcow2 header (big-endian u64 at 24), or 0. */
static uint64_t qcow2_virtual_size(const char *path)
{
	uint8_t h[32];
	uint64_t v = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	if (pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) && !memcmp(h, "QFI\xfb", 4))
		for (int i = 24; i < 32; i++)
			v = v << 8 | h[i];
	close(fd);
	return v;
}

/* What a measurement needs from the session, copied under ss->lock. */
struct measure_in {
	pid_t pid;
	unsigned vcpus;
	uint64_t mem_total;
	char mem_path[700], disk[PATH_MAX + 16];
};

static void measure_in_locked(const struct session *s, struct measure_in *in)
{
	in->pid = s->vm.pid;
	in->vcpus = s->vcpus ? s->vcpus : 1;
	in->mem_total = (uint64_t)s->memory_mib << 20;
	in->mem_path[0] = '\0';
	if (s->vm.jail.cg[0][0])
		snprintf(in->mem_path, sizeof(in->mem_path), "%s/memory.usage_in_bytes", s->vm.jail.cg[0]);
	snprintf(in->disk, sizeof(in->disk), "%s", s->disk);
}

/* Memory and disk now (no lock: files only); the CPU share is the caller's. */
static void measure(const struct measure_in *in, struct session_sample *out)
{
	uint64_t mem_used = 0, disk_used = 0;
	struct stat st;

	/* The VM's memory cgroup holds guest RAM and QEMU's own: what the
	 * guest has is at most its RAM. Unjailed: QEMU's resident set. */
	if (in->mem_path[0] && read_u64(in->mem_path, &mem_used) < 0)
		mem_used = 0;
	if (!mem_used) {
		char path[64], line[256];
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/status", (int)in->pid);
		f = fopen(path, "re");
		while (f && fgets(line, sizeof(line), f))
			if (!strncmp(line, "VmRSS:", 6))
				mem_used = strtoull(line + 6, NULL, 10) << 10;
		if (f)
			fclose(f);
	}
	if (mem_used > in->mem_total)
		mem_used = in->mem_total;
	if (stat(in->disk, &st) == 0)
		disk_used = (uint64_t)st.st_blocks * 512;
	out->t_ms = clock_wall_ms();
	out->vcpus = in->vcpus;
	out->mem_used = mem_used;
	out->mem_total = in->mem_total;
	out->disk_used = disk_used;
	out->disk_total = qcow2_virtual_size(in->disk);
}

static double cpu_pct(uint64_t cpu_ns, uint64_t prev_ns, int64_t now_us, int64_t prev_us, unsigned vcpus)
{
	double pct = 0;

	if (now_us > prev_us && cpu_ns >= prev_ns)
		pct = (double)(cpu_ns - prev_ns) / 1000.0 / (double)(now_us - prev_us) / vcpus * 100.0;
	return pct > 100 ? 100 : pct;
}

static json_t *sample_json(const struct session_sample *m, int with_time)
{
	json_t *j = json_pack("{s:i, s:f, s:I, s:I, s:I, s:I}", "cpu_count", (int)m->vcpus, "cpu_used_pct",
			      (double)m->cpu_pct, "mem_used", (json_int_t)m->mem_used, "mem_total",
			      (json_int_t)m->mem_total, "disk_used", (json_int_t)m->disk_used, "disk_total",
			      (json_int_t)m->disk_total);

	if (j && with_time)
		json_object_set_new(j, "t_ms", json_integer(m->t_ms));
	return j;
}

json_t *session_metrics(struct session_table *ss, const char *id, struct kiln_err *err)
{
	struct session_sample m;
	struct measure_in in;
	struct session *s;
	uint64_t cpu_ns, prev_ns;
	int64_t now_us = proto_now_us(), prev_us;

	pthread_mutex_lock(&ss->lock);
	s = find_locked(ss, id);
	if (!s || s->state != SS_RUNNING || s->vm.pid <= 0) {
		pthread_mutex_unlock(&ss->lock);
		kiln_err_set(err, KERR_NOT_FOUND, "no running session %s on this host", id);
		return NULL;
	}
	measure_in_locked(s, &in);
	cpu_ns = qemu_cpu_ns(in.pid);
	prev_ns = s->cpu_prev_us ? s->cpu_prev_ns : 0;
	prev_us = s->cpu_prev_us ? s->cpu_prev_us : s->vm.t_spawn_us;
	s->cpu_prev_ns = cpu_ns;
	s->cpu_prev_us = now_us;
	pthread_mutex_unlock(&ss->lock);
	measure(&in, &m);
	m.cpu_pct = (float)cpu_pct(cpu_ns, prev_ns, now_us, prev_us, in.vcpus);
	return sample_json(&m, 0);
}

json_t *session_metrics_range(struct session_table *ss, const char *id, int64_t start_ms, int64_t end_ms,
			      struct kiln_err *err)
{
	json_t *now = session_metrics(ss, id, err), *a;
	struct session *s;

	if (!now)
		return NULL;
	a = json_array();
	pthread_mutex_lock(&ss->lock);
	s = find_locked(ss, id);
	for (unsigned i = 0; s && a && i < s->nsamples; i++) {
		const struct session_sample *m =
			&s->samples[(s->sample_head + SESSION_SAMPLES - s->nsamples + i) % SESSION_SAMPLES];

		if (m->t_ms >= start_ms && m->t_ms <= end_ms)
			json_array_append_new(a, sample_json(m, 1));
	}
	pthread_mutex_unlock(&ss->lock);
	/* Now as the last one, when the range reaches it. */
	if (a && clock_wall_ms() >= start_ms && clock_wall_ms() <= end_ms + SESSION_SAMPLE_MS) {
		json_object_set_new(now, "t_ms", json_integer(clock_wall_ms()));
		json_array_append(a, now);
	}
	json_decref(now);
	return a ? json_pack("{s:o}", "samples", a) : NULL;
}

/* A session's volume slots hold at most their volume (its size_mib, and
 * what ext4 may write past its end: VOL_SLOT_SLACK); an empty slot nothing.
 * A guest (its root) that writes past that into the slot's device would
 * fill the host's disk (the slot is a 64 GiB sparse file): its VM is
 * killed at the sample that sees it, within SESSION_SAMPLE_MS of writes
 * at the disk throttle's rate. Unlocked reads of the slots' sizes: nvols
 * and vols[] do not change while the VM runs. */
#define VOL_SLOT_SLACK (64ull << 20)

static void vol_slots_check(const struct session *s, pid_t pid)
{
	for (unsigned i = 0; i < VM_VOL_SLOTS; i++) {
		uint64_t allow = (i < s->nvols ? (uint64_t)s->vols[i].size_mib << 20 : 0) + VOL_SLOT_SLACK;
		char path[PATH_MAX + 32];
		struct stat st;

		snprintf(path, sizeof(path), "%s/vol%u.img", s->dir, i);
		if (stat(path, &st) < 0 || (uint64_t)st.st_blocks * 512 <= allow)
			continue;
		fprintf(stderr,
			"kiln-host: session %s: its volume slot %u holds %llu MiB, past the %llu MiB its volume may: its VM "
			"is stopped (SIGKILL)\n",
			s->id, i, (unsigned long long)((uint64_t)st.st_blocks * 512 >> 20),
			(unsigned long long)(allow >> 20));
		if (pid > 0)
			kill(pid, SIGKILL);
		return;
	}
}

void sessions_sample(struct session_table *ss)
{
	struct {
		struct session *s;
		struct measure_in in;
		uint64_t cpu_ns, prev_ns;
		int64_t now_us, prev_us;
	} *due = NULL;
	size_t n = 0, cap = 0;
	int64_t now = proto_now_ms();

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next) {
		if (s->state != SS_RUNNING || s->vm.pid <= 0 || now < s->sample_next_ms)
			continue;
		if (n == cap) {
			size_t nc = cap ? 2 * cap : 16;
			void *p = realloc(due, nc * sizeof(*due));

			if (!p)
				break;
			due = p;
			cap = nc;
		}
		s->sample_next_ms = now + SESSION_SAMPLE_MS;
		s->refs++;
		due[n].s = s;
		measure_in_locked(s, &due[n].in);
		due[n].prev_ns = s->sample_prev_us ? s->sample_prev_ns : 0;
		due[n].prev_us = s->sample_prev_us ? s->sample_prev_us : s->vm.t_spawn_us;
		n++;
	}
	pthread_mutex_unlock(&ss->lock);
	for (size_t i = 0; i < n; i++)
		vol_slots_check(due[i].s, due[i].in.pid);
	for (size_t i = 0; i < n; i++) {
		struct session_sample m;

		due[i].now_us = proto_now_us();
		due[i].cpu_ns = qemu_cpu_ns(due[i].in.pid);
		measure(&due[i].in, &m);
		m.cpu_pct = (float)cpu_pct(due[i].cpu_ns, due[i].prev_ns, due[i].now_us, due[i].prev_us, due[i].in.vcpus);
		pthread_mutex_lock(&ss->lock);
		if (!due[i].s->samples)
			due[i].s->samples = calloc(SESSION_SAMPLES, sizeof(struct session_sample));
		if (due[i].s->samples && due[i].s->vm.pid == due[i].in.pid) {
			due[i].s->samples[due[i].s->sample_head] = m;
			due[i].s->sample_head = (due[i].s->sample_head + 1) % SESSION_SAMPLES;
			if (due[i].s->nsamples < SESSION_SAMPLES)
				due[i].s->nsamples++;
			due[i].s->sample_prev_ns = due[i].cpu_ns;
			due[i].s->sample_prev_us = due[i].now_us;
		}
		pthread_mutex_unlock(&ss->lock);
		session_unref(ss, due[i].s);
	}
	free(due);
}
