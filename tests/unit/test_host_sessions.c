/* test_host_sessions: kiln-host's session table (host/session/session.c,
 * session_io.c, session_pause.c) without a VM: sessions_open clears what an
 * earlier process left in the spool; an empty list; create refuses bad ids,
 * bad specs and a host without a snapshot, giving its reservation back; every
 * operation on a session that is not here answers not_found, through each of
 * the three files; file requests are checked before the session is looked
 * up; resume and delete without S3. No QEMU, no root, no S3. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "buf.h"
#include "fake_vm_ops.h"
#include "fsutil.h"
#include "hostd.h"
#include "session.h"
#include "session_int.h"
#include "proto.h"
#include "vm.h"

struct fixture {
	struct fake_ops f;
	struct fake_clock clk;
	struct capacity cap;
	struct run_opts ro;
	char spool[64];
	struct hostd *d;
	struct session_table *ss;
};

static int setup(void **state)
{
	struct fixture *x = calloc(1, sizeof(*x));
	struct kiln_err err = { .code = "" };
	struct hostd_config cfg = { .host_id = "h1", .vcpus_total = 4, .upload_workers = 1, .accel = "tcg" };
	char stale[128];

	if (!x)
		return -1;
	fake_ops_init(&x->f);
	fake_clock_init(&x->clk);
	pthread_mutex_init(&x->cap.lock, NULL);
	x->cap.total_mib = 4096;
	snprintf(x->spool, sizeof(x->spool), "/tmp/kiln-host-sessions.XXXXXX");
	if (!mkdtemp(x->spool))
		return -1;
	cfg.spool_dir = x->spool;
	x->d = hostd_open(&cfg, &x->ro, &x->cap, NULL, &x->f.ops, &x->clk.c, &err);
	if (!x->d)
		fail_msg("hostd_open: %s: %s", err.code, err.message);
	/* What an earlier kiln-host left: its VMs died with it. */
	snprintf(stale, sizeof(stale), "%s/sessions/old", x->spool);
	if (fs_mkdir_p(stale, 0700) < 0)
		return -1;
	x->ss = sessions_open(x->d, "h1", x->spool, &err);
	if (!x->ss)
		fail_msg("sessions_open: %s: %s", err.code, err.message);
	*state = x;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *x = *state;

	sessions_close(x->ss);
	hostd_close(x->d);
	fs_rmtree(x->spool);
	fake_ops_free(&x->f);
	pthread_mutex_destroy(&x->cap.lock);
	free(x);
	return 0;
}

static void test_open_and_list(void **state)
{
	struct fixture *x = *state;
	char p[128];
	struct stat st;
	json_t *j;
	char *text;

	snprintf(p, sizeof(p), "%s/sessions/old", x->spool);
	assert_int_equal(stat(p, &st), -1);
	snprintf(p, sizeof(p), "%s/sessions", x->spool);
	assert_int_equal(stat(p, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	j = sessions_list(x->ss);
	text = json_dumps(j, JSON_COMPACT);
	assert_string_equal(text, "{\"sessions\":[]}");
	free(text);
	json_decref(j);
	assert_null(session_get(x->ss, "s1"));
}

static void test_create_refused(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	json_t *spec = json_pack("{s:{s:i}}", "limits", "vcpus", 1), *bad = json_pack("{s:[s]}", "argv", "true");
	json_t *out = (json_t *)1;

	assert_int_equal(session_create(x->ss, "../s1", "acme", spec, NULL, &out, &err), -1);
	assert_null(out);
	assert_string_equal(err.code, "invalid_request");
	assert_int_equal(session_create(x->ss, "s1", "acme", bad, NULL, &out, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	assert_non_null(strstr(err.message, "argv"));
	assert_int_equal(session_create(x->ss, "s1", "acme", json_null(), NULL, &out, &err), -1);
	assert_string_equal(err.code, "invalid_request");
	/* This host has no snapshot: it runs cold, so no sessions. */
	assert_int_equal(session_create(x->ss, "s1", "acme", spec, NULL, &out, &err), -1);
	assert_string_equal(err.code, "invalid_spec");
	assert_non_null(strstr(err.message, "snapshot"));
	assert_null(session_get(x->ss, "s1"));
	/* Nothing stays reserved: the whole host is still free. */
	assert_int_equal(hostd_reserve(x->d, 4, 4096, &err), 0);
	hostd_release(x->d, 4, 4096);
	json_decref(spec);
	json_decref(bad);
}

static void test_not_found(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	json_t *req = json_pack("{s:[s]}", "argv", "true");
	json_t *in = json_pack("{s:s}", "exec_id", "e1");
	unsigned char *data = NULL;
	size_t len = 0;

	/* session_io.c */
	assert_null(session_exec(x->ss, "s1", req, NULL, NULL, &err));
	assert_string_equal(err.code, "not_found");
	err.code[0] = '\0';
	assert_null(session_input(x->ss, "s1", in, &err));
	assert_string_equal(err.code, "not_found");
	session_interrupt(x->ss, "s1", "e1");
	err.code[0] = '\0';
	assert_int_equal(session_put_file(x->ss, "s1", "/work/a", "x", 1, &err), -1);
	assert_string_equal(err.code, "not_found");
	err.code[0] = '\0';
	assert_int_equal(session_get_file(x->ss, "s1", "/work/a", &data, &len, &err), -1);
	assert_string_equal(err.code, "not_found");
	assert_null(data);
	err.code[0] = '\0';
	assert_null(session_list_dir(x->ss, "s1", "/work", &err));
	assert_string_equal(err.code, "not_found");
	err.code[0] = '\0';
	assert_null(session_outputs(x->ss, "s1", &err));
	assert_string_equal(err.code, "not_found");
	/* session_pause.c */
	err.code[0] = '\0';
	assert_null(session_pause(x->ss, "s1", &err));
	assert_string_equal(err.code, "not_found");
	/* session.c: not here, no customer to find a snapshot by. */
	err.code[0] = '\0';
	assert_int_equal(session_delete(x->ss, "s1", NULL, 0, &err), -1);
	assert_string_equal(err.code, "not_found");
	assert_int_equal(session_delete(x->ss, "s1", NULL, 1, &err), -1);
	json_decref(req);
	json_decref(in);
}

static void test_checked_first(void **state)
{
	struct fixture *x = *state;
	struct kiln_err err = { .code = "" };
	json_t *out = NULL;

	assert_int_equal(session_put_file(x->ss, "s1", "work/a", "x", 1, &err), -1);
	assert_string_equal(err.code, "invalid_request");
	assert_int_equal(session_put_file(x->ss, "s1", "/kiln/a", "x", 1, &err), -1);
	assert_string_equal(err.code, "invalid_request");
	assert_int_equal(session_put_file(x->ss, "s1", "/work/a", "x", (64u << 20) + 1, &err), -1);
	assert_string_equal(err.code, "too_large");
	/* session_pause.c: resume checks the ids, then wants S3. */
	assert_int_equal(session_resume(x->ss, "s1", "a/b", NULL, 0, NULL, &out, &err), -1);
	assert_string_equal(err.code, "invalid_request");
	assert_int_equal(session_resume(x->ss, "s1", "acme", NULL, 0, NULL, &out, &err), -1);
	assert_string_equal(err.code, "no_s3");
	assert_null(out);
	assert_null(session_get(x->ss, "s1"));
}

/* The idle stop's decision (host/session/session_idle.c): ask the guest only for a
 * booted, running session that is not stopped yet, has no interactive
 * command or envd request in flight, had no request for the delay, and was
 * not found busy a moment ago; never with the delay 0. Then the idler and
 * metrics start and stop with an empty table. */
static void test_idle_due(void **state)
{
	struct fixture *x = *state;
	struct session_idle_view v = { .running = 1, .last_active_ms = 10000, .idle_check_ms = 0 };
	struct session_idle_view w;
	struct kiln_err err = { .code = "" };
	struct buf b = BUF_INIT;

	assert_int_equal(session_idle_due(&v, 11500, 1500), 1);
	assert_int_equal(session_idle_due(&v, 11499, 1500), 0); /* not idle long enough */
	assert_int_equal(session_idle_due(&v, 99999, 0), 0);    /* idle stop off */
	w = v, w.running = 0;
	assert_int_equal(session_idle_due(&w, 20000, 1500), 0); /* pausing, starting, gone */
	w = v, w.stopped = 1;
	assert_int_equal(session_idle_due(&w, 20000, 1500), 0);
	w = v, w.interactive = 1;
	assert_int_equal(session_idle_due(&w, 20000, 1500), 0);
	w = v, w.envd_busy = 1;
	assert_int_equal(session_idle_due(&w, 20000, 1500), 0);
	w = v, w.idle_check_ms = 20001;                          /* busy a moment ago */
	assert_int_equal(session_idle_due(&w, 20000, 1500), 0);
	assert_int_equal(session_idle_due(&w, 20001, 1500), 1);

	assert_int_equal(sessions_set_idle_stop(x->ss, 100, &err), 0);
	usleep(150 * 1000); /* a pass or two over an empty table */
	sessions_metrics(x->ss, &b);
	assert_non_null(strstr(b.p, "kiln_host_sessions{vcpus=\"stopped\"} 0\n"));
	assert_non_null(strstr(b.p, "kiln_host_session_idle_stops_total 0\n"));
	buf_free(&b);
	/* teardown's sessions_close stops the idler */
}

/* vm_procs over a socketpair standing in for the agent channel: the query
 * goes out, PROCS comes back decoded; a guest that does not know the query
 * answers ERROR (guest_error: the idler leaves such a VM running); and a
 * PROCS that comes after its vm_procs gave up is dropped by vm_recv instead
 * of being taken as the next request's reply. */
static void test_vm_procs(void **state)
{
	struct vm vm = { .pid = -1, .pidfd = -1, .cancel_fd = -1, .qmp_fd = -1, .envd_fd = -1, .lock_fd = -1 };
	struct kiln_err err = { .code = "" };
	struct proto_frame f;
	uint8_t hdr[PROTO_HDR_SIZE], p[64], got[64];
	uint32_t count = 0, pid = 0;
	int sv[2];
	ssize_t n;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	vm.agent_fd = sv[0];
	vm.rbuf = malloc(PROTO_MAX_FRAME);
	assert_non_null(vm.rbuf);

	n = proto_procs_encode(p, sizeof(p), 2, 9);
	assert_int_equal(proto_send(sv[1], PROTO_PROCS, p, (size_t)n, 0), 0);
	assert_int_equal(vm_procs(&vm, proto_now_ms() + 2000, &count, &pid, &err), 0);
	assert_int_equal(count, 2);
	assert_int_equal(pid, 9);
	assert_int_equal(read(sv[1], got, sizeof(got)), PROTO_HDR_SIZE); /* the query: a header, no payload */
	proto_frame_header(hdr, PROTO_PROCS_QUERY, 0);
	assert_memory_equal(got, hdr, PROTO_HDR_SIZE);

	n = proto_error_encode(p, sizeof(p), &(struct proto_error){ .code = -EINVAL, .message = "unknown request type 0x4b" });
	assert_int_equal(proto_send(sv[1], PROTO_ERROR, p, (size_t)n, 0), 0);
	assert_int_equal(vm_procs(&vm, proto_now_ms() + 2000, &count, &pid, &err), -1);
	assert_string_equal(err.code, "guest_error");

	/* A late PROCS, then the reply the next reader waits for. */
	n = proto_procs_encode(p, sizeof(p), 0, 0);
	assert_int_equal(proto_send(sv[1], PROTO_PROCS, p, (size_t)n, 0), 0);
	got[0] = PROTO_SETUP;
	assert_int_equal(proto_send(sv[1], PROTO_OK, got, 1, 0), 0);
	assert_int_equal(vm_recv(&vm, &f, proto_now_ms() + 2000, &err), 0);
	assert_int_equal(f.type, PROTO_OK);
	assert_int_equal(f.len, 1);
	assert_int_equal(f.payload[0], PROTO_SETUP);

	free(vm.rbuf);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_open_and_list, setup, teardown),
		cmocka_unit_test_setup_teardown(test_create_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_not_found, setup, teardown),
		cmocka_unit_test_setup_teardown(test_checked_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_idle_due, setup, teardown),
		cmocka_unit_test(test_vm_procs),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
