/* metrics: Prometheus text exposition (format 0.0.4), written in one place.
 * A daemon declares each metric once, as a static const struct metric (name,
 * HELP text, type, label names, a histogram's bounds); at scrape time it
 * reads its values under its own locks and hands them to the functions
 * below, which write the HELP and TYPE lines, escape label values and format
 * the samples. Nothing here holds state: not thread-safe only in that one
 * struct buf has one owner. */
#ifndef KILN_METRICS_H
#define KILN_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

#define METRIC_LABELS_MAX 3

/* One metric, declared once. labels: the label names in the order their
 * values are given (unused slots NULL). A histogram's bounds are ascending
 * upper bounds ("le"), +Inf implied. */
struct metric {
	const char *name;
	const char *help;
	enum metric_type type;
	const char *labels[METRIC_LABELS_MAX];
	const double *bounds;
	size_t nbounds;
};

/* The "# HELP" and "# TYPE" lines; once per metric, before its samples.
 * Each function here returns 0, or buf's -ENOMEM/-E2BIG (the first one met;
 * the text written so far stays). */
int metric_head(struct buf *b, const struct metric *m);

/* One sample: values[i] is the value of m->labels[i] (values may be NULL when
 * m has no labels); label values are escaped (\\, \" and \n). */
int metric_sample(struct buf *b, const struct metric *m, const char *const *values, uint64_t v);

/* A metric without labels: its head and its one sample. */
int metric_write(struct buf *b, const struct metric *m, uint64_t v);

/* A metric with one label: its head and n samples, values[i] for label
 * value names[i]. */
int metric_write_by(struct buf *b, const struct metric *m, const char *const *names, const uint64_t *values, size_t n);

/* A histogram: its head, cumulative buckets from counts[] (one per bound,
 * not cumulative), the +Inf bucket (count), _sum and _count. */
int metric_write_histogram(struct buf *b, const struct metric *m, const uint64_t *counts, uint64_t count, double sum);

#endif
