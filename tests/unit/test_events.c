/* test_events: kiln-api's event hub (api/http/events.c) over a temporary SQLite
 * store: no list for an unknown task; a list starts with the task's current
 * state; relayed events arrive as SSE blocks and "state" ones are refused
 * from the relay; the store's listener adds committed state changes; the
 * stream ends after a final state; events_stop ends a stream that has
 * nothing left and events_stopping says so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "events.h"
#include "quota.h"
#include "store.h"

static char dir[] = "/tmp/kiln-test-events.XXXXXX";
static char path[256];
static int seq;

static int setup(void **state)
{
	snprintf(path, sizeof(path), "%s/api-%d.db", dir, ++seq);
	return 0;
}

static struct store *open_with_task(char id[40])
{
	struct kiln_err err = { .code = "" };
	struct store *s = store_open(path, &err);
	struct quota q;

	if (!s)
		fail_msg("store_open(%s): %s", path, err.message);
	quota_defaults(&q);
	if (store_customer_create(s, "acme", "acme", &q, &err) != 0)
		fail_msg("customer: %s", err.message);
	if (store_task_insert(s, "acme", "{\"argv\":[\"true\"]}", NULL, 1, 256, NULL, "h", id, &err) != 0)
		fail_msg("insert: %s", err.message);
	return s;
}

/* What the stream has now (a short deadline: nothing more is coming). */
static long read_now(struct ev_task *t, struct evlog_cursor *cur, char *buf, size_t cap)
{
	long n = events_read(t, cur, buf, cap - 1, clock_mono_ms() + 50);

	buf[n > 0 ? n : 0] = '\0';
	return n;
}

static void test_unknown_task(void **state)
{
	char id[40];
	struct store *st = open_with_task(id);
	struct events *h = events_new(st);
	json_t *d = json_pack("{s:s}", "data", "x");

	assert_non_null(h);
	assert_null(events_get(h, "t_nosuchtask"));
	/* Unknown ids are ignored by the relay. */
	events_task_event(h, "t_nosuchtask", "stdout", d);
	json_decref(d);
	events_free(h);
	store_close(st);
}

static void test_stream(void **state)
{
	char id[40], buf[4096];
	struct store *st = open_with_task(id);
	struct events *h = events_new(st);
	struct evlog_cursor cur = { 0 };
	struct ev_task *t;
	enum task_state cs;
	json_t *d;

	store_set_listener(st, events_store_listener, h);
	t = events_get(h, id);
	assert_non_null(t);
	assert_true(read_now(t, &cur, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "event: state\ndata: {\"state\":\"queued\",\"at\":"));
	assert_int_equal(buf[strlen(buf) - 1], '\n');
	assert_int_equal(read_now(t, &cur, buf, sizeof(buf)), 0);

	/* Output from the relay; a "state" from it is dropped. */
	d = json_pack("{s:s}", "data", "hi");
	events_task_event(h, id, "stdout", d);
	events_task_event(h, id, "state", d);
	json_decref(d);
	assert_true(read_now(t, &cur, buf, sizeof(buf)) > 0);
	assert_string_equal(buf, "event: stdout\ndata: {\"data\":\"hi\"}\n\n");

	/* A committed change reaches the list through the listener; a final
	 * state closes it. */
	assert_int_equal(store_task_cancel(st, id, "acme", &cs), STORE_CANCEL_DONE);
	assert_true(read_now(t, &cur, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "event: state\ndata: {\"state\":\"cancelled\""));
	assert_int_equal(read_now(t, &cur, buf, sizeof(buf)), EVLOG_END);
	events_put(h, t);

	/* A second reader of the same list replays it from its start. */
	t = events_get(h, id);
	cur = (struct evlog_cursor){ 0 };
	assert_true(read_now(t, &cur, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "\"queued\""));
	events_put(h, t);

	store_set_listener(st, NULL, NULL);
	events_free(h);
	store_close(st);
}

static void test_stop(void **state)
{
	char id[40], buf[4096];
	struct store *st = open_with_task(id);
	struct events *h = events_new(st);
	struct evlog_cursor cur = { 0 };
	struct ev_task *t = events_get(h, id);

	assert_non_null(t);
	assert_int_equal(events_stopping(h), 0);
	assert_true(read_now(t, &cur, buf, sizeof(buf)) > 0);
	events_stop(h);
	assert_int_equal(events_stopping(h), 1);
	assert_int_equal(read_now(t, &cur, buf, sizeof(buf)), EVLOG_END);
	events_put(h, t);
	events_free(h);
	store_close(st);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_unknown_task, setup),
		cmocka_unit_test_setup(test_stream, setup),
		cmocka_unit_test_setup(test_stop, setup),
	};
	int r;
	char cmd[300];

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return r;
}
