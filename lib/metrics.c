/* metrics: the Prometheus text format for every daemon's /metrics
 * (lib/metrics.h): HELP/TYPE lines, label escaping, samples, histograms. */
#include <errno.h>
#include <stdio.h>

#include "metrics.h"

static const char *const type_names[] = {
	[METRIC_COUNTER] = "counter",
	[METRIC_GAUGE] = "gauge",
	[METRIC_HISTOGRAM] = "histogram",
};

/* Keep the first error: later writes may succeed on a capped buffer. */
static void keep(int *r, int e)
{
	if (e < 0 && *r == 0)
		*r = e;
}

/* s with the exposition format's escapes: \\ and \n, and \" when quoted
 * (label values; HELP text leaves quotes alone). */
static int add_escaped(struct buf *b, const char *s, int quoted)
{
	int r = 0;

	for (const char *p = s; *p; p++) {
		if (*p == '\\')
			keep(&r, buf_add(b, "\\\\", 2));
		else if (*p == '\n')
			keep(&r, buf_add(b, "\\n", 2));
		else if (*p == '"' && quoted)
			keep(&r, buf_add(b, "\\\"", 2));
		else
			keep(&r, buf_add(b, p, 1));
	}
	return r;
}

int metric_head(struct buf *b, const struct metric *m)
{
	int r = 0;

	keep(&r, buf_printf(b, "# HELP %s ", m->name));
	keep(&r, add_escaped(b, m->help, 0));
	keep(&r, buf_printf(b, "\n# TYPE %s %s\n", m->name, type_names[m->type]));
	return r;
}

/* name{l1="v1",...} with the extra label le (histogram buckets) last. */
static int add_series(struct buf *b, const char *name, const char *suffix, const struct metric *m,
		      const char *const *values, const char *le)
{
	int r = 0, n = 0;

	keep(&r, buf_printf(b, "%s%s", name, suffix));
	for (int i = 0; i < METRIC_LABELS_MAX && m->labels[i] && values; i++) {
		keep(&r, buf_printf(b, "%s%s=\"", n++ ? "," : "{", m->labels[i]));
		keep(&r, add_escaped(b, values[i] ? values[i] : "", 1));
		keep(&r, buf_add(b, "\"", 1));
	}
	if (le)
		keep(&r, buf_printf(b, "%sle=\"%s\"", n++ ? "," : "{", le));
	if (n)
		keep(&r, buf_add(b, "}", 1));
	return r;
}

int metric_sample(struct buf *b, const struct metric *m, const char *const *values, uint64_t v)
{
	int r = add_series(b, m->name, "", m, values, NULL);

	keep(&r, buf_printf(b, " %llu\n", (unsigned long long)v));
	return r;
}

int metric_write(struct buf *b, const struct metric *m, uint64_t v)
{
	int r = metric_head(b, m);

	keep(&r, metric_sample(b, m, NULL, v));
	return r;
}

int metric_write_by(struct buf *b, const struct metric *m, const char *const *names, const uint64_t *values, size_t n)
{
	int r = metric_head(b, m);

	for (size_t i = 0; i < n; i++)
		keep(&r, metric_sample(b, m, &names[i], values[i]));
	return r;
}

int metric_write_histogram(struct buf *b, const struct metric *m, const uint64_t *counts, uint64_t count, double sum)
{
	uint64_t cum = 0;
	char le[32];
	int r = metric_head(b, m);

	for (size_t i = 0; i < m->nbounds; i++) {
		cum += counts[i];
		snprintf(le, sizeof(le), "%g", m->bounds[i]);
		keep(&r, add_series(b, m->name, "_bucket", m, NULL, le));
		keep(&r, buf_printf(b, " %llu\n", (unsigned long long)cum));
	}
	keep(&r, add_series(b, m->name, "_bucket", m, NULL, "+Inf"));
	keep(&r, buf_printf(b, " %llu\n", (unsigned long long)count));
	keep(&r, buf_printf(b, "%s_sum %.6f\n%s_count %llu\n", m->name, sum, m->name, (unsigned long long)count));
	return r;
}
