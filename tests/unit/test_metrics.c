/* test_metrics: lib/metrics.c's Prometheus text: HELP/TYPE lines, samples
 * with and without labels, label value and HELP escaping, histograms'
 * cumulative buckets, a capped buffer's error, and lib/version.c's
 * kiln_build_info gauge. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "metrics.h"
#include "version.h"

static void test_plain(void **state)
{
	static const struct metric m = {
		.name = "kiln_x_total", .type = METRIC_COUNTER,
		.help = "Things done.",
	};
	struct buf b = BUF_INIT;

	(void)state;
	assert_int_equal(metric_write(&b, &m, 42), 0);
	assert_string_equal(b.p, "# HELP kiln_x_total Things done.\n# TYPE kiln_x_total counter\nkiln_x_total 42\n");
	buf_free(&b);
}

static void test_labels(void **state)
{
	static const struct metric one = {
		.name = "kiln_tasks", .type = METRIC_GAUGE, .labels = { "state" },
		.help = "Tasks, by state.",
	};
	static const struct metric two = {
		.name = "kiln_pool", .type = METRIC_GAUGE, .labels = { "template", "sha256" },
		.help = "Pools.",
	};
	static const char *const names[] = { "queued", "running" };
	struct buf b = BUF_INIT;

	(void)state;
	assert_int_equal(metric_write_by(&b, &one, names, (uint64_t[]){ 3, 18446744073709551615ULL }, 2), 0);
	assert_string_equal(b.p, "# HELP kiln_tasks Tasks, by state.\n# TYPE kiln_tasks gauge\n"
				 "kiln_tasks{state=\"queued\"} 3\nkiln_tasks{state=\"running\"} 18446744073709551615\n");
	buf_reset(&b);
	assert_int_equal(metric_head(&b, &two), 0);
	assert_int_equal(metric_sample(&b, &two, (const char *[]){ "py", "" }, 0), 0);
	assert_int_equal(metric_sample(&b, &two, (const char *[]){ "node", NULL }, 7), 0);
	assert_string_equal(b.p, "# HELP kiln_pool Pools.\n# TYPE kiln_pool gauge\n"
				 "kiln_pool{template=\"py\",sha256=\"\"} 0\nkiln_pool{template=\"node\",sha256=\"\"} 7\n");
	buf_free(&b);
}

/* A label value or HELP text holding the format's special characters
 * cannot end the quoted value or the line early. */
static void test_escaping(void **state)
{
	static const struct metric m = {
		.name = "kiln_e", .type = METRIC_GAUGE, .labels = { "name" },
		.help = "a \\ back\nslash \"quoted\"",
	};
	struct buf b = BUF_INIT;

	(void)state;
	assert_int_equal(metric_head(&b, &m), 0);
	assert_int_equal(metric_sample(&b, &m, (const char *[]){ "x\"} 9\ny\\z" }, 1), 0);
	assert_string_equal(b.p, "# HELP kiln_e a \\\\ back\\nslash \"quoted\"\n# TYPE kiln_e gauge\n"
				 "kiln_e{name=\"x\\\"} 9\\ny\\\\z\"} 1\n");
	/* Exactly three lines: no newline came through unescaped. */
	{
		int lines = 0;

		for (const char *p = b.p; *p; p++)
			lines += *p == '\n';
		assert_int_equal(lines, 3);
	}
	buf_free(&b);
}

static void test_histogram(void **state)
{
	static const double bounds[] = { 0.005, 0.5, 1, 10 };
	static const struct metric m = {
		.name = "kiln_start_seconds", .type = METRIC_HISTOGRAM, .bounds = bounds, .nbounds = 4,
		.help = "Start.",
	};
	struct buf b = BUF_INIT;

	(void)state;
	assert_int_equal(metric_write_histogram(&b, &m, (uint64_t[]){ 1, 0, 2, 3, 1 }, 7, 12.25), 0);
	assert_string_equal(b.p, "# HELP kiln_start_seconds Start.\n# TYPE kiln_start_seconds histogram\n"
				 "kiln_start_seconds_bucket{le=\"0.005\"} 1\n"
				 "kiln_start_seconds_bucket{le=\"0.5\"} 1\n"
				 "kiln_start_seconds_bucket{le=\"1\"} 3\n"
				 "kiln_start_seconds_bucket{le=\"10\"} 6\n"
				 "kiln_start_seconds_bucket{le=\"+Inf\"} 7\n"
				 "kiln_start_seconds_sum 12.250000\n"
				 "kiln_start_seconds_count 7\n");
	buf_free(&b);
}

/* Past a capped buffer's limit the writer reports it. */
static void test_capped(void **state)
{
	static const struct metric m = {
		.name = "kiln_long_metric_name_total", .type = METRIC_COUNTER,
		.help = "Long help text here.",
	};
	struct buf b;

	(void)state;
	buf_init(&b, 16);
	assert_int_equal(metric_write(&b, &m, 1), -E2BIG);
	assert_true(b.len <= 16);
	buf_free(&b);
}

/* The version gauge both daemons' /metrics start with: one sample, value 1,
 * labelled with the same string --version prints. */
static void test_build_info(void **state)
{
	struct buf b = BUF_INIT;
	char want[256];
	const char *v = kiln_version();

	(void)state;
	assert_true(v[0] >= '0' && v[0] <= '9');
	assert_int_equal(version_metric(&b), 0);
	snprintf(want, sizeof(want), "# TYPE kiln_build_info gauge\nkiln_build_info{version=\"%s\"} 1\n", v);
	assert_non_null(strstr(b.p, want));
	assert_non_null(strstr(b.p, "# HELP kiln_build_info "));
	buf_free(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),     cmocka_unit_test(test_labels),   cmocka_unit_test(test_escaping),
		cmocka_unit_test(test_histogram), cmocka_unit_test(test_capped),    cmocka_unit_test(test_build_info),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
