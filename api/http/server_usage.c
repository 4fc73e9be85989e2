/* server_usage: kiln-api's usage history routes (docs/api.md "Usage
 * history"): GET /v1/usage/history for the caller's customer and
 * GET /v1/admin/customers/{id}/usage/history for any, as JSON or CSV, from
 * the store's per-minute metering (store_usage_history). */
#include "server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "buf.h"
#include "clock.h"
#include "reply.h"
#include "store/store.h"

#define HISTORY_MAX_BUCKETS 1440
#define HISTORY_STEP_MIN_MS 60000LL
#define HISTORY_STEP_MAX_MS 86400000LL
#define HISTORY_DEFAULT_STEP_MS 3600000LL
#define HISTORY_DEFAULT_SPAN_MS 86400000LL

/* A non-negative decimal integer of at most 15 digits: 0, or -1. */
static int parse_ms(const char *v, int64_t *out)
{
	int64_t n = 0;
	size_t i, len = strlen(v);

	if (!len || len > 15)
		return -1;
	for (i = 0; i < len; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		n = n * 10 + (v[i] - '0');
	}
	*out = n;
	return 0;
}

/* A step: seconds ("300"), or a count with s, m, h or d ("5m"): ms, or -1. */
static int64_t parse_step(const char *v)
{
	char num[16];
	size_t len = strlen(v);
	int64_t n, unit = 1000;

	if (!len || len >= sizeof(num))
		return -1;
	memcpy(num, v, len + 1);
	switch (num[len - 1]) {
	case 's': unit = 1000; num[--len] = 0; break;
	case 'm': unit = 60000; num[--len] = 0; break;
	case 'h': unit = 3600000; num[--len] = 0; break;
	case 'd': unit = 86400000; num[--len] = 0; break;
	default: break;
	}
	if (parse_ms(num, &n) < 0 || n > 86400)
		return -1;
	return n * unit;
}

static int64_t floor_to(int64_t v, int64_t step)
{
	return v - v % step;
}

static const char *arg(struct MHD_Connection *conn, const char *name)
{
	return MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
}

/* Whether the caller asked for CSV: ?format=csv or an Accept naming
 * text/csv (?format=json wins over Accept). */
static int wants_csv(struct MHD_Connection *conn)
{
	const char *f = arg(conn, "format");
	const char *acc = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Accept");

	if (f)
		return !strcasecmp(f, "csv") ? 1 : !strcasecmp(f, "json") ? 0 : -1;
	return acc && strcasestr(acc, "text/csv") != NULL;
}

static void iso(int64_t ms, char out[32])
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static enum MHD_Result history(struct server *s, struct MHD_Connection *conn, const char *customer)
{
	const char *from_a = arg(conn, "from"), *to_a = arg(conn, "to"), *step_a = arg(conn, "step");
	int64_t from, to, step = HISTORY_DEFAULT_STEP_MS, n;
	struct usage_bucket *b;
	struct usage_bucket tot = { 0 };
	int csv = wants_csv(conn);
	char msg[160];

	if (csv < 0)
		return reply_error(conn, KERR_INVALID_REQUEST, "format: json or csv");
	if (step_a) {
		step = parse_step(step_a);
		if (step < HISTORY_STEP_MIN_MS || step > HISTORY_STEP_MAX_MS || step % HISTORY_STEP_MIN_MS)
			return reply_error(conn, KERR_INVALID_REQUEST,
					   "step: a whole number of minutes from 60s to 1d (e.g. 60, 300s, 5m, 1h, 1d)");
	}
	if (to_a) {
		if (parse_ms(to_a, &to) < 0)
			return reply_error(conn, KERR_INVALID_REQUEST, "to: milliseconds since the epoch (UTC)");
	} else {
		to = clock_wall_ms();
	}
	if (from_a) {
		if (parse_ms(from_a, &from) < 0)
			return reply_error(conn, KERR_INVALID_REQUEST, "from: milliseconds since the epoch (UTC)");
	} else {
		from = to > HISTORY_DEFAULT_SPAN_MS ? to - HISTORY_DEFAULT_SPAN_MS : 0;
	}
	if (from >= to)
		return reply_error(conn, KERR_INVALID_REQUEST, "from must be before to");
	/* Buckets aligned on the step from the epoch: from rounded down, to up. */
	from = floor_to(from, step);
	to = floor_to(to + step - 1, step);
	n = (to - from) / step;
	if (n > HISTORY_MAX_BUCKETS) {
		snprintf(msg, sizeof(msg), "from..to is %lld buckets of this step, more than %d: a larger step or a shorter range",
			 (long long)n, HISTORY_MAX_BUCKETS);
		return reply_error(conn, KERR_INVALID_REQUEST, msg);
	}
	b = calloc((size_t)n, sizeof(*b));
	if (!b)
		return reply_internal(conn, "out of memory");
	if (store_usage_history(s->st, customer, from, step, (int)n, b) < 0) {
		free(b);
		return reply_internal(conn, "cannot read the usage history");
	}
	for (int64_t i = 0; i < n; i++) {
		tot.vcpu_ms += b[i].vcpu_ms;
		tot.mib_ms += b[i].mib_ms;
		tot.tasks += b[i].tasks;
		tot.sessions += b[i].sessions;
		tot.egress_bytes += b[i].egress_bytes;
		if (b[i].snapshot_bytes > tot.snapshot_bytes)
			tot.snapshot_bytes = b[i].snapshot_bytes;
		if (b[i].volume_mib > tot.volume_mib)
			tot.volume_mib = b[i].volume_mib;
		if (b[i].pause_bytes > tot.pause_bytes)
			tot.pause_bytes = b[i].pause_bytes;
		if (b[i].template_bytes > tot.template_bytes)
			tot.template_bytes = b[i].template_bytes;
	}
	if (csv) {
		struct buf out = BUF_INIT;
		char when[32], *body;
		size_t len;
		int bad;

		bad = buf_adds(&out, "start_ms,start,vcpu_seconds,mib_seconds,tasks_started,sessions_started,"
				       "snapshot_bytes,volume_mib,egress_bytes,pause_bytes,template_bytes\r\n") < 0;
		for (int64_t i = 0; !bad && i < n; i++) {
			iso(b[i].start_ms, when);
			bad = buf_printf(&out, "%lld,%s,%.3f,%.3f,%lld,%lld,%lld,%lld,%lld,%lld,%lld\r\n",
					 (long long)b[i].start_ms, when, b[i].vcpu_ms / 1000.0, b[i].mib_ms / 1000.0,
					 (long long)b[i].tasks, (long long)b[i].sessions, (long long)b[i].snapshot_bytes,
					 (long long)b[i].volume_mib, (long long)b[i].egress_bytes,
					 (long long)b[i].pause_bytes, (long long)b[i].template_bytes) < 0;
		}
		free(b);
		body = bad ? NULL : buf_steal(&out, &len);
		buf_free(&out);
		if (!body)
			return reply_internal(conn, "out of memory");
		return reply_bytes(conn, MHD_HTTP_OK, body, len, "text/csv; charset=utf-8");
	}
	json_t *arr = json_array();

	for (int64_t i = 0; arr && i < n; i++)
		json_array_append_new(arr, json_pack("{s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "start_ms",
						     (json_int_t)b[i].start_ms, "vcpu_seconds", b[i].vcpu_ms / 1000.0,
						     "mib_seconds", b[i].mib_ms / 1000.0, "tasks_started",
						     (json_int_t)b[i].tasks, "sessions_started", (json_int_t)b[i].sessions,
						     "snapshot_bytes", (json_int_t)b[i].snapshot_bytes, "volume_mib",
						     (json_int_t)b[i].volume_mib, "egress_bytes", (json_int_t)b[i].egress_bytes,
						     "pause_bytes", (json_int_t)b[i].pause_bytes, "template_bytes",
						     (json_int_t)b[i].template_bytes));
	free(b);
	return reply_json(conn, MHD_HTTP_OK,
			  json_pack("{s:s, s:I, s:I, s:I, s:o, s:{s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I}}", "customer",
				    customer, "from_ms", (json_int_t)from, "to_ms", (json_int_t)to, "step_s",
				    (json_int_t)(step / 1000), "buckets", arr, "totals", "vcpu_seconds", tot.vcpu_ms / 1000.0,
				    "mib_seconds", tot.mib_ms / 1000.0, "tasks_started", (json_int_t)tot.tasks,
				    "sessions_started", (json_int_t)tot.sessions, "egress_bytes", (json_int_t)tot.egress_bytes,
				    "snapshot_bytes_max", (json_int_t)tot.snapshot_bytes, "volume_mib_max",
				    (json_int_t)tot.volume_mib, "pause_bytes_max", (json_int_t)tot.pause_bytes,
				    "template_bytes_max", (json_int_t)tot.template_bytes));
}

/* GET /v1/usage/history */
enum MHD_Result server_rt_usage_history(void *ctx, struct httpd_req *r)
{
	const struct caller *c = r->app;

	if (c->admin)
		return reply_error(r->conn, KERR_FORBIDDEN,
				   "an admin key has no usage: GET /v1/admin/customers/{id}/usage/history");
	return history(ctx, r->conn, c->customer);
}

/* GET /v1/admin/customers/{id}/usage/history */
enum MHD_Result server_rt_admin_usage_history(void *ctx, struct httpd_req *r)
{
	struct server *s = ctx;
	struct quota q;

	if (strlen(r->param[0]) >= 65 || store_customer_quota(s->st, r->param[0], &q) < 0)
		return reply_not_found(r->conn, "no such customer");
	return history(s, r->conn, r->param[0]);
}
