/* test_envd: the guest's envd (guest/envd.c, envd_fs.c) served in a forked
 * child over a socketpair, spoken to with lib/eproto's codecs as kiln-host
 * would: processes (output streams, exit codes, signals, stdin, terminal,
 * LIST, the window), file requests, malformed frames, a host's HELLO, and
 * the default user's creation. No VM; as root it also checks that processes
 * and file requests take another user's identity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "envd.h"
#include "envd_int.h"
#include "eproto.h"
#include "proto.h"

#define OTHER_UID 54321 /* a second user, for the root-only checks */

static char dir[64], passwd_path[128], group_path[128], home[128], tcp_path[128], tcp6_path[128];
static struct envd_config cfg;
static int host = -1;
static pid_t envd_pid = -1;
static uint8_t rbuf[4 * PROTO_MAX_FRAME];
static size_t rlen;
static uint8_t pl[PROTO_MAX_PAYLOAD];
static uint32_t next_req = 1u << 24; /* above every pid */
static pid_t started[64]; /* process groups the test started, killed at teardown */
static int nstarted;

/* ---- the host side ---- */

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void send_frame(uint8_t type, const void *p, size_t n)
{
	uint8_t hdr[PROTO_HDR_SIZE];

	proto_frame_header(hdr, type, (uint32_t)n);
	assert_int_equal(write(host, hdr, sizeof(hdr)), sizeof(hdr));
	if (n)
		assert_int_equal(write(host, p, n), (ssize_t)n);
}

static void send_u32s(uint8_t type, const uint32_t *v, unsigned n)
{
	ssize_t len = eproto_u32s_encode(pl, sizeof(pl), v, n);

	assert_true(len >= 0);
	send_frame(type, pl, (size_t)len);
}

/* The next frame within timeout_ms: its type, payload copied to out. Returns
 * 0 on timeout. */
static int recv_frame(uint8_t *type, uint8_t *out, size_t *len, int timeout_ms)
{
	struct proto_frame f;

	for (;;) {
		ssize_t n = proto_frame_parse(rbuf, rlen, &f);
		struct pollfd p = { .fd = host, .events = POLLIN };

		assert_true(n >= 0);
		if (n > 0) {
			*type = f.type;
			*len = f.len;
			memcpy(out, f.payload, f.len);
			memmove(rbuf, rbuf + n, rlen - (size_t)n);
			rlen -= (size_t)n;
			return 1;
		}
		if (poll(&p, 1, timeout_ms) <= 0)
			return 0;
		n = read(host, rbuf + rlen, sizeof(rbuf) - rlen);
		assert_true(n > 0);
		rlen += (size_t)n;
	}
}

static uint8_t fr[PROTO_MAX_PAYLOAD];

static uint8_t expect_frame(size_t *len)
{
	uint8_t type;

	assert_true(recv_frame(&type, fr, len, 10000));
	return type;
}

static uint32_t u32_at(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void expect_hello(void)
{
	uint32_t v[2];
	size_t len;

	assert_int_equal(expect_frame(&len), EP_HELLO);
	assert_int_equal(eproto_u32s_decode(fr, len, v, 2), 0);
	assert_int_equal(v[0], EPROTO_VERSION);
	assert_int_equal(v[1], EPROTO_FEAT_PORTS | EPROTO_FEAT_WATCH);
}

static int32_t expect_error(uint32_t req)
{
	char msg[PROTO_MAX_MSG + 1];
	uint32_t r;
	int32_t code;
	size_t len;

	assert_int_equal(expect_frame(&len), EP_ERROR);
	assert_int_equal(eproto_error_decode(fr, len, &r, &code, msg), 0);
	assert_int_equal(r, req);
	return code;
}

static int envd_setup(void **state)
{
	int sv[2];
	char text[512];

	snprintf(dir, sizeof(dir), "/tmp/kiln-envd.XXXXXX");
	assert_non_null(mkdtemp(dir));
	chmod(dir, 0755);
	snprintf(passwd_path, sizeof(passwd_path), "%s/passwd", dir);
	snprintf(group_path, sizeof(group_path), "%s/group", dir);
	snprintf(home, sizeof(home), "%s/home", dir);
	assert_int_equal(mkdir(home, 0755), 0);
	snprintf(text, sizeof(text), "root:x:0:0:root:/root:/bin/sh\nuser:x:%u:%u::%s:/bin/sh\nother:x:%d:%d::/:/bin/sh\n",
		 (unsigned)getuid(), (unsigned)getgid(), home, OTHER_UID, OTHER_UID);
	put_file(passwd_path, text);
	snprintf(text, sizeof(text), "root:x:0:\ngrp%u:x:%u:\nother:x:%d:\n", (unsigned)getgid(), (unsigned)getgid(),
		 OTHER_UID);
	put_file(group_path, text);
	snprintf(tcp_path, sizeof(tcp_path), "%s/tcp", dir);
	snprintf(tcp6_path, sizeof(tcp6_path), "%s/tcp6", dir);
	/* /proc/net/tcp's shape: 8080 listening (0A) and 9090 connected (01);
	 * tcp6: 8080 again and 3000 listening. */
	put_file(tcp_path, "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
			   "   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n"
			   "   1: 0100007F:2382 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 2\n");
	put_file(tcp6_path, "  sl  local_address                         remote_address                        st\n"
			    "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0\n"
			    "   1: 00000000000000000000000001000000:0BB8 00000000000000000000000000000000:0000 0A 0\n");
	cfg = (struct envd_config){ .passwd = passwd_path, .group = group_path, .shadow = NULL, .home_dir = dir,
				    .proc_net_tcp = tcp_path, .proc_net_tcp6 = tcp6_path };

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	envd_pid = fork();
	assert_true(envd_pid >= 0);
	if (envd_pid == 0) {
		struct envd *e;

		close(sv[0]);
		e = envd_create(sv[1], &cfg);
		if (!e)
			_exit(2);
		envd_serve(e);
		envd_destroy(e);
		_exit(1);
	}
	close(sv[1]);
	host = sv[0];
	rlen = 0;
	expect_hello();
	return 0;
}

static int envd_teardown(void **state)
{
	char cmd[128];

	close(host);
	host = -1;
	/* What the test started, background children included (one group each). */
	while (nstarted > 0)
		kill(-started[--nstarted], SIGKILL);
	kill(envd_pid, SIGKILL);
	waitpid(envd_pid, NULL, 0);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* ---- processes ---- */

static struct eproto_start st;

static uint32_t start_proc(uint32_t req, uint32_t flags, const char *user, const char *cwd, const char *const *argv,
			   const char *const *env)
{
	uint32_t v[2];
	ssize_t n;
	size_t len;

	memset(&st, 0, sizeof(st));
	st.req = req;
	st.flags = flags;
	if (flags & EP_START_PTY) {
		st.rows = 24;
		st.cols = 80;
	}
	st.user = user;
	st.cwd = cwd;
	st.tag = "t";
	while (argv[st.argc])
		st.argv[st.argc] = argv[st.argc], st.argc++;
	while (env && env[st.envc])
		st.env[st.envc] = env[st.envc], st.envc++;
	n = eproto_start_encode(pl, sizeof(pl), &st);
	assert_true(n > 0);
	send_frame(EP_START, pl, (size_t)n);
	if (expect_frame(&len) == EP_ERROR) {
		char msg[PROTO_MAX_MSG + 1];
		int32_t code;

		eproto_error_decode(fr, len, &v[0], &code, msg);
		fail_msg("START refused: %s", msg);
	}
	assert_int_equal(eproto_u32s_decode(fr, len, v, 2), 0);
	assert_int_equal(v[0], req);
	assert_true(v[1] > 0);
	if (nstarted < 64)
		started[nstarted++] = (pid_t)v[1];
	return v[1];
}

struct outcome {
	char out[1 << 16], err[1 << 16];
	size_t nout, nerr;
	uint8_t how;
	uint32_t status;
};

static struct outcome oc;

/* Collects pid's output until its END, acknowledging as the host does
 * (unless ack is 0). */
static void follow(uint32_t pid, int ack)
{
	uint8_t type;
	size_t len;

	memset(&oc, 0, sizeof(oc));
	for (;;) {
		type = expect_frame(&len);
		if (type == EP_OUT) {
			uint32_t p, v[2];
			uint8_t stream;
			const uint8_t *raw;
			size_t n;

			assert_int_equal(eproto_out_decode(fr, len, &p, &stream, &raw, &n), 0);
			assert_int_equal(p, pid);
			if (stream == EP_STDERR) {
				if (oc.nerr + n < sizeof(oc.err))
					memcpy(oc.err + oc.nerr, raw, n), oc.nerr += n;
			} else {
				if (oc.nout + n < sizeof(oc.out))
					memcpy(oc.out + oc.nout, raw, n), oc.nout += n;
			}
			if (ack) {
				v[0] = pid;
				v[1] = (uint32_t)n;
				send_u32s(EP_ACK, v, 2);
			}
			continue;
		}
		assert_int_equal(type, EP_END);
		{
			uint32_t p;

			assert_int_equal(eproto_end_decode(fr, len, &p, &oc.how, &oc.status), 0);
			assert_int_equal(p, pid);
		}
		return;
	}
}

/* Reads pid's OUT frames, unacknowledged, until a whole window has come;
 * then nothing more may come (the writer is held back). Returns the bytes. */
static uint64_t read_window(uint32_t pid)
{
	uint64_t got = 0;
	uint8_t type;
	size_t len;

	while (got < EPROTO_WINDOW) {
		type = expect_frame(&len);
		assert_int_equal(type, EP_OUT);
		assert_int_equal(u32_at(fr), pid);
		got += len - 5;
	}
	assert_int_equal(got, EPROTO_WINDOW);
	assert_false(recv_frame(&type, fr, &len, 300));
	return got;
}

static void test_echo_streams_exit(void **state)
{
	const char *argv[] = { "sh", "-c", "echo out; echo err >&2; exit 7", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "", argv, NULL);

	follow(pid, 1);
	assert_int_equal(oc.how, PROTO_EXITED);
	assert_int_equal(oc.status, 7);
	assert_int_equal(oc.nout, 4);
	assert_memory_equal(oc.out, "out\n", 4);
	assert_int_equal(oc.nerr, 4);
	assert_memory_equal(oc.err, "err\n", 4);
}

static void test_env_cwd_user(void **state)
{
	const char *argv[] = { "sh", "-c", "echo $HOME $USER $LOGNAME $A; pwd", NULL };
	const char *env[] = { "A=from-start", NULL };
	char want[512];
	uint32_t pid;

	assert_int_equal(mkdir(strcat(strcpy(want, home), "/sub"), 0755), 0);
	pid = start_proc(next_req++, 0, "user", "sub", argv, env);
	follow(pid, 1);
	assert_int_equal(oc.status, 0);
	snprintf(want, sizeof(want), "%s user user from-start\n%s/sub\n", home, home);
	assert_int_equal(oc.nout, strlen(want));
	assert_memory_equal(oc.out, want, strlen(want));
}

static void test_start_errors(void **state)
{
	const char *missing[] = { "no-such-command-kiln", NULL };
	const char *ok[] = { "true", NULL };
	uint32_t req = next_req++;
	ssize_t n;

	memset(&st, 0, sizeof(st));
	st.req = req;
	st.user = st.cwd = st.tag = "";
	st.argc = 1;
	st.argv[0] = missing[0];
	n = eproto_start_encode(pl, sizeof(pl), &st);
	send_frame(EP_START, pl, (size_t)n);
	assert_int_equal(expect_error(req), -ENOENT);

	req = next_req++;
	st.req = req;
	st.argv[0] = ok[0];
	st.cwd = "/no/such/dir";
	n = eproto_start_encode(pl, sizeof(pl), &st);
	send_frame(EP_START, pl, (size_t)n);
	assert_int_equal(expect_error(req), -ENOENT);

	req = next_req++;
	st.req = req;
	st.cwd = "";
	st.user = "nosuchuser";
	n = eproto_start_encode(pl, sizeof(pl), &st);
	send_frame(EP_START, pl, (size_t)n);
	assert_int_equal(expect_error(req), -ENOENT);
}

static void test_signal(void **state)
{
	const char *argv[] = { "sleep", "30", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "", argv, NULL);
	uint32_t v[2] = { pid, SIGTERM };

	send_u32s(EP_SIGNAL, v, 2);
	follow(pid, 1);
	assert_int_equal(oc.how, PROTO_SIGNALED);
	assert_int_equal(oc.status, SIGTERM);
}

static void test_stdin_pipe(void **state)
{
	const char *argv[] = { "sh", "-c", "read a; echo got:$a; cat", NULL };
	uint32_t pid = start_proc(next_req++, EP_START_STDIN, "", "", argv, NULL);
	uint8_t in[64];
	uint32_t v = pid;

	memcpy(in, &pid, 4); /* little-endian host */
	memcpy(in + 4, "hello\nrest", 10);
	send_frame(EP_INPUT, in, 14);
	send_u32s(EP_CLOSE_STDIN, &v, 1);
	follow(pid, 1);
	assert_int_equal(oc.status, 0);
	assert_int_equal(oc.nout, strlen("got:hello\nrest"));
	assert_memory_equal(oc.out, "got:hello\nrest", oc.nout);
}

static void send_fs(uint8_t type, uint32_t req, const char *path, const char *path2, uint32_t depth);
static void expect_entry(uint32_t req);

/* A process that does not read yet: envd holds 1 MiB of its input, drops
 * the rest, and goes on serving meanwhile. */
static void test_stdin_bound(void **state)
{
	const char *argv[] = { "sh", "-c", "sleep 1; wc -c", NULL };
	uint32_t pid = start_proc(next_req++, EP_START_STDIN, "", "", argv, NULL);
	static uint8_t chunk[4 + EPROTO_MAX_CHUNK];
	uint32_t req = next_req++;
	unsigned long count;
	int i;

	memcpy(chunk, &pid, 4);
	for (i = 0; i < 48; i++) /* 3 MiB */
		send_frame(EP_INPUT, chunk, sizeof(chunk));
	send_fs(EP_STAT, req, "/", NULL, 0);
	expect_entry(req);
	send_u32s(EP_CLOSE_STDIN, &pid, 1);
	follow(pid, 1);
	assert_int_equal(oc.status, 0);
	oc.out[oc.nout] = '\0';
	count = strtoul(oc.out, NULL, 10);
	assert_true(count >= ENVD_STDIN_MAX);
	assert_true(count <= ENVD_STDIN_MAX + (1u << 20)); /* what the pipe itself holds */
}

static void test_pty(void **state)
{
	const char *argv[] = { "sh", "-c", "tty >/dev/null && echo tty; stty size", NULL };
	uint32_t pid;

	if (access("/dev/pts/ptmx", R_OK | W_OK) < 0 && access("/dev/ptmx", R_OK | W_OK) < 0) {
		skip(); /* no pseudo-terminals here */
		return;
	}
	pid = start_proc(next_req++, EP_START_PTY, "", "", argv, NULL);
	follow(pid, 1);
	assert_int_equal(oc.status, 0);
	assert_non_null(memmem(oc.out, oc.nout, "tty\r\n24 80", 10));
	assert_int_equal(oc.nerr, 0);
}

/* A background child keeping stdout open does not hold END back. */
static void test_linger(void **state)
{
	const char *argv[] = { "sh", "-c", "echo first; (sleep 5; echo late) & exit 3", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "", argv, NULL);
	int64_t t0 = proto_now_ms();

	follow(pid, 1);
	assert_true(proto_now_ms() - t0 < 4500); /* not held until the background child's end */
	assert_int_equal(oc.status, 3);
	assert_int_equal(oc.nout, 6);
	assert_memory_equal(oc.out, "first\n", 6);
}

/* Output still in the pipe when the linger ends (the window was full) is
 * delivered in full, and END does not wait for the silent background child
 * that holds the pipe. */
static void test_linger_drain(void **state)
{
	const char *argv[] = { "sh", "-c", "head -c 1100000 /dev/zero; sleep 20 & exit 0", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "", argv, NULL);
	int64_t t0 = proto_now_ms();
	uint64_t got = 0;
	uint32_t v[2];
	uint8_t type;
	size_t len;

	got = read_window(pid);
	v[0] = pid;
	v[1] = (uint32_t)got;
	send_u32s(EP_ACK, v, 2);
	for (;;) {
		type = expect_frame(&len);
		if (type == EP_END)
			break;
		assert_int_equal(type, EP_OUT);
		got += len - 5;
	}
	assert_int_equal(got, 1100000);
	assert_true(proto_now_ms() - t0 < 10000);
}

static void test_list(void **state)
{
	const char *argv[] = { "sleep", "30", NULL };
	const char *env[] = { "K=V", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "/", argv, env);
	uint32_t req = next_req++, v[2];
	static struct eproto_proc p;
	int found = 0;
	size_t len;
	uint8_t type;

	send_u32s(EP_LIST, &req, 1);
	for (;;) {
		type = expect_frame(&len);
		if (type == EP_DONE)
			break;
		assert_int_equal(type, EP_PROC);
		assert_int_equal(eproto_proc_decode(fr, len, &p), 0);
		assert_int_equal(p.req, req);
		if (p.pid == pid) {
			found = 1;
			assert_string_equal(p.argv[0], "sleep");
			assert_string_equal(p.argv[1], "30");
			assert_string_equal(p.env[0], "K=V");
			assert_string_equal(p.cwd, "/");
			assert_string_equal(p.tag, "t");
		}
	}
	assert_int_equal(u32_at(fr), req);
	assert_true(found);
	v[0] = pid;
	v[1] = SIGKILL;
	send_u32s(EP_SIGNAL, v, 2);
	follow(pid, 1);
	assert_int_equal(oc.status, SIGKILL);
}

/* Without ACKs envd sends at most a window, then waits (the writer blocks);
 * an ACK lets the rest through. */
static void test_window(void **state)
{
	const char *argv[] = { "head", "-c", "3000000", "/dev/zero", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "", argv, NULL);
	uint64_t got;
	uint32_t v[2];

	got = read_window(pid);
	v[0] = pid;
	v[1] = (uint32_t)got;
	send_u32s(EP_ACK, v, 2);
	follow(pid, 1);
	assert_int_equal(oc.status, 0);
}

/* The same, counting everything: 3 MB arrive in full with ACKs. */
static void test_window_full(void **state)
{
	const char *argv[] = { "head", "-c", "3000000", "/dev/zero", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "", argv, NULL);
	uint64_t got = 0;
	uint8_t type;
	size_t len;

	for (;;) {
		uint32_t v[2];

		type = expect_frame(&len);
		if (type == EP_END)
			break;
		assert_int_equal(type, EP_OUT);
		assert_true(len - 5 <= EPROTO_MAX_CHUNK);
		got += len - 5;
		v[0] = pid;
		v[1] = (uint32_t)(len - 5);
		send_u32s(EP_ACK, v, 2);
	}
	assert_int_equal(got, 3000000);
}

static void test_malformed(void **state)
{
	const char *argv[] = { "true", NULL };
	uint8_t junk[3] = { 1, 2, 3 };
	uint32_t pid;

	send_frame(EP_SIGNAL, junk, 3);
	assert_int_equal(expect_error(0), -EPROTO);
	send_frame(0x42, NULL, 0);
	assert_int_equal(expect_error(0), -EPROTO);
	/* Still serving. */
	pid = start_proc(next_req++, 0, "", "", argv, NULL);
	follow(pid, 1);
	assert_int_equal(oc.status, 0);
}

static void expect_done(uint32_t req);

/* The host's HELLO (a restored VM): HELLO, windows open again, then
 * DONE{req}; an END not yet sent is not lost. */
static void test_host_hello(void **state)
{
	const char *argv[] = { "head", "-c", "2000000", "/dev/zero", NULL };
	uint32_t pid = start_proc(next_req++, 0, "", "", argv, NULL);
	uint32_t v[2] = { EPROTO_VERSION, next_req++ };

	/* A full window, unacknowledged: the writer blocks. */
	read_window(pid);
	send_u32s(EP_HELLO, v, 2);
	expect_hello();
	expect_done(v[1]);
	/* The window is open again without an ACK: the rest comes, then END. */
	follow(pid, 1);
	assert_int_equal(oc.status, 0);
	/* A request right behind the HELLO, in the same write, is served. */
	{
		uint8_t two[64];
		uint32_t req = next_req++;
		size_t n = 0;

		proto_frame_header(two, EP_HELLO, 8);
		v[1] = next_req++;
		memcpy(two + 8, v, 8);
		n = 16;
		proto_frame_header(two + n, EP_LIST, 4);
		memcpy(two + n + 8, &req, 4);
		n += 12;
		assert_int_equal(write(host, two, n), (ssize_t)n);
		expect_hello();
		expect_done(v[1]);
		expect_done(req); /* LIST: no process left */
	}
}

/* ---- files ---- */

static struct eproto_fsreq q;
static struct eproto_entry ent;

static void send_fs(uint8_t type, uint32_t req, const char *path, const char *path2, uint32_t depth)
{
	ssize_t n;

	memset(&q, 0, sizeof(q));
	q.req = req;
	snprintf(q.path, sizeof(q.path), "%s", path);
	if (path2)
		snprintf(q.path2, sizeof(q.path2), "%s", path2);
	q.depth = depth;
	n = eproto_fsreq_encode(pl, sizeof(pl), type, &q);
	assert_true(n > 0);
	send_frame(type, pl, (size_t)n);
}

static void expect_entry(uint32_t req)
{
	size_t len;

	assert_int_equal(expect_frame(&len), EP_ENTRY);
	assert_int_equal(eproto_entry_decode(fr, len, &ent), 0);
	assert_int_equal(ent.req, req);
}

static void expect_done(uint32_t req)
{
	size_t len;

	assert_int_equal(expect_frame(&len), EP_DONE);
	assert_int_equal(len, 4);
	assert_int_equal(u32_at(fr), req);
}

static void write_file(const char *path, const void *data, size_t n)
{
	uint32_t req = next_req++;
	uint8_t buf[4 + EPROTO_MAX_CHUNK];
	size_t off = 0;

	send_fs(EP_WRITE, req, path, NULL, 0);
	while (off < n) {
		size_t c = n - off < EPROTO_MAX_CHUNK ? n - off : EPROTO_MAX_CHUNK;

		memcpy(buf, &req, 4);
		memcpy(buf + 4, (const char *)data + off, c);
		send_frame(EP_WDATA, buf, 4 + c);
		off += c;
	}
	send_u32s(EP_WEND, &req, 1);
	expect_entry(req);
}

static void test_fs_write_read_stat(void **state)
{
	static char data[200000];
	char path[256];
	uint32_t req;
	size_t got = 0, len;
	struct stat s;
	uint8_t type;
	size_t i;

	for (i = 0; i < sizeof(data); i++)
		data[i] = (char)(i * 7);
	/* Relative to the home, parents made. */
	write_file("a/b/c.bin", data, sizeof(data));
	snprintf(path, sizeof(path), "%s/a/b/c.bin", home);
	assert_string_equal(ent.path, path);
	assert_string_equal(ent.name, "c.bin");
	assert_int_equal(ent.type, EP_FILE);
	assert_int_equal(ent.size, sizeof(data));
	assert_string_equal(ent.owner, getuid() == 0 ? "root" : "user"); /* the first name of the uid */
	assert_int_equal(stat(path, &s), 0);
	assert_int_equal(s.st_size, sizeof(data));

	req = next_req++;
	send_fs(EP_READ, req, path, NULL, 0);
	for (;;) {
		uint32_t v[2];

		type = expect_frame(&len);
		if (type == EP_DONE)
			break;
		assert_int_equal(type, EP_DATA);
		assert_int_equal(u32_at(fr), req);
		assert_true(got + len - 4 <= sizeof(data));
		assert_memory_equal(fr + 4, data + got, len - 4);
		got += len - 4;
		v[0] = req;
		v[1] = (uint32_t)(len - 4);
		send_u32s(EP_ACK, v, 2);
	}
	assert_int_equal(got, sizeof(data));

	req = next_req++;
	send_fs(EP_STAT, req, "a/b", NULL, 0);
	expect_entry(req);
	assert_int_equal(ent.type, EP_DIR);

	req = next_req++;
	send_fs(EP_STAT, req, "a/missing", NULL, 0);
	assert_int_equal(expect_error(req), -ENOENT);

	req = next_req++;
	send_fs(EP_READ, req, "a/b", NULL, 0);
	assert_int_equal(expect_error(req), -EISDIR);
}

/* WRITE's metadata becomes user.e2b.* xattrs, ENTRY reads them back
 * (leaving out what is not printable), MOVE keeps them, an overwrite
 * without metadata clears them. */
static void test_fs_metadata(void **state)
{
	char path[256], path2[256], v[64];
	uint32_t req = next_req++;
	const char *k, *val;
	size_t off = 0;
	ssize_t n;
	uint32_t want;

	memset(&q, 0, sizeof(q));
	q.req = req;
	snprintf(q.path, sizeof(q.path), "meta/m.txt");
	assert_int_equal(eproto_meta_add(q.meta, &q.meta_len, "author", 6, "mish", 4), 0);
	assert_int_equal(eproto_meta_add(q.meta, &q.meta_len, "purpose", 7, "unit test", 9), 0);
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_WRITE, &q);
	assert_true(n > 0);
	want = q.meta_len; /* send_fs clears q */
	send_frame(EP_WRITE, pl, (size_t)n);
	send_u32s(EP_WEND, &req, 1);
	snprintf(path, sizeof(path), "%s/meta/m.txt", home);
	expect_entry(req);
	n = getxattr(path, "user.e2b.author", v, sizeof(v));
	if (n < 0 && errno == ENOTSUP)
		skip(); /* this file system keeps no user xattrs */
	assert_int_equal(n, 4);
	assert_memory_equal(v, "mish", 4);
	assert_int_equal(ent.meta_len, want);
	assert_memory_equal(ent.meta, "author\0mish\0purpose\0unit test\0", want);
	/* A pair set in the sandbox that is not printable ASCII is left out. */
	assert_int_equal(setxattr(path, "user.e2b.bin", "\x01\x02", 2, 0), 0);
	assert_int_equal(setxattr(path, "user.other", "x", 1, 0), 0);
	req = next_req++;
	send_fs(EP_STAT, req, path, NULL, 0);
	expect_entry(req);
	assert_int_equal(ent.meta_len, want);
	assert_int_equal(eproto_meta_next(ent.meta, ent.meta_len, &off, &k, &val), 1);
	req = next_req++;
	snprintf(path2, sizeof(path2), "%s/meta/n.txt", home);
	send_fs(EP_MOVE, req, path, path2, 0);
	expect_entry(req);
	assert_int_equal(ent.meta_len, want);
	write_file("meta/n.txt", "again", 5);
	assert_int_equal(ent.meta_len, 0);
	assert_true(getxattr(path2, "user.e2b.author", v, sizeof(v)) < 0);
}

static void test_fs_write_cancel(void **state)
{
	uint32_t req = next_req++;
	uint8_t buf[16];
	char path[256];
	struct stat s;
	DIR *d;
	struct dirent *de;
	int others = 0;

	send_fs(EP_WRITE, req, "partial.txt", NULL, 0);
	memcpy(buf, &req, 4);
	memcpy(buf + 4, "half", 4);
	send_frame(EP_WDATA, buf, 8);
	send_u32s(EP_CANCEL, &req, 1);
	assert_int_equal(expect_error(req), -ECANCELED);
	snprintf(path, sizeof(path), "%s/partial.txt", home);
	assert_int_equal(stat(path, &s), -1);
	d = opendir(home);
	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' || strlen(de->d_name) > 2)
			others++;
	closedir(d);
	assert_int_equal(others, 0); /* no temporary file left */
	/* The WEND after the CANCEL is ignored, not an error. */
	send_u32s(EP_WEND, &req, 1);
	send_fs(EP_STAT, req + 1, "/", NULL, 0);
	expect_entry(req + 1);
	assert_string_equal(ent.path, "/");
	next_req += 2;
}

static void test_fs_dirs(void **state)
{
	uint32_t req;
	char path[256];
	int n = 0, saw_link = 0, saw_deep = 0, saw_top = 0;
	size_t len;
	uint8_t type;

	req = next_req++;
	send_fs(EP_MKDIR, req, "x/y/z", NULL, 0);
	expect_entry(req);
	assert_int_equal(ent.type, EP_DIR);
	snprintf(path, sizeof(path), "%s/x/y/z", home);
	assert_string_equal(ent.path, path);

	req = next_req++;
	send_fs(EP_MKDIR, req, "x/y/z", NULL, 0);
	assert_int_equal(expect_error(req), -EEXIST);

	write_file("x/y/z/f.txt", "hi", 2);
	snprintf(path, sizeof(path), "%s/x/link", home);
	assert_int_equal(symlink("/", path), 0);

	/* depth 2: x's children and grandchildren, never through the link. */
	req = next_req++;
	send_fs(EP_LISTDIR, req, "x", NULL, 2);
	for (;;) {
		type = expect_frame(&len);
		if (type == EP_DONE)
			break;
		assert_int_equal(type, EP_ENTRY);
		assert_int_equal(eproto_entry_decode(fr, len, &ent), 0);
		n++;
		if (!strcmp(ent.name, "link")) {
			saw_link = 1;
			/* As E2B's envd: the type of what it leads to, the
			 * absolute path it resolves to. */
			assert_int_equal(ent.type, EP_DIR);
			assert_string_equal(ent.target, "/");
		}
		if (!strcmp(ent.name, "y"))
			saw_top = 1;
		if (!strcmp(ent.name, "z"))
			saw_deep = 1;
		assert_null(strstr(ent.name, "f.txt")); /* depth 3 */
	}
	assert_int_equal(n, 3);
	assert_true(saw_link && saw_top && saw_deep);

	/* A relative link: its target as the absolute path it resolves to; a
	 * broken one: its own path, of no type (E2B's envd). */
	snprintf(path, sizeof(path), "%s/x/rel", home);
	assert_int_equal(symlink("y", path), 0);
	req = next_req++;
	send_fs(EP_STAT, req, "x/rel", NULL, 0);
	expect_entry(req);
	snprintf(path, sizeof(path), "%s/x/y", home);
	assert_string_equal(ent.target, path);
	assert_int_equal(ent.type, EP_DIR);
	snprintf(path, sizeof(path), "%s/x/broken", home);
	assert_int_equal(symlink("nowhere", path), 0);
	req = next_req++;
	send_fs(EP_STAT, req, "x/broken", NULL, 0);
	expect_entry(req);
	assert_string_equal(ent.target, path);
	assert_int_equal(ent.type, EP_OTHER);

	/* LISTDIR goes in lexical order, depth first (E2B's envd walks so). */
	{
		const char *names[] = { "ord", "ord/c", "ord/a", "ord/b", "ord/a/z", "ord/a/y" };
		const char *want[] = { "a", "y", "z", "b", "c" };
		int k = 0;

		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			snprintf(path, sizeof(path), "%s/%s", home, names[i]);
			if (i == 0 || i == 2)
				assert_int_equal(mkdir(path, 0755), 0);
			else
				assert_int_equal(close(open(path, O_CREAT | O_WRONLY, 0644)), 0);
		}
		req = next_req++;
		send_fs(EP_LISTDIR, req, "ord", NULL, 2);
		for (;;) {
			type = expect_frame(&len);
			if (type == EP_DONE)
				break;
			assert_int_equal(type, EP_ENTRY);
			assert_int_equal(eproto_entry_decode(fr, len, &ent), 0);
			assert_true(k < 5);
			assert_string_equal(ent.name, want[k]);
			k++;
		}
		assert_int_equal(k, 5);
	}

	req = next_req++;
	send_fs(EP_MOVE, req, "x/y/z/f.txt", "moved/g.txt", 0);
	expect_entry(req);
	snprintf(path, sizeof(path), "%s/moved/g.txt", home);
	assert_string_equal(ent.path, path);
	assert_int_equal(ent.size, 2);

	/* Recursive, and the link's target is left alone. */
	req = next_req++;
	send_fs(EP_REMOVE, req, "x", NULL, 0);
	expect_done(req);
	snprintf(path, sizeof(path), "%s/x", home);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(access("/tmp", F_OK), 0);

	/* Not there: removed already (E2B's envd answers so too). */
	req = next_req++;
	send_fs(EP_REMOVE, req, "x", NULL, 0);
	expect_done(req);
}

/* As root: a process and a file request as another user get that user's
 * identity and permissions. */
static void test_other_user(void **state)
{
	const char *argv[] = { "id", "-u", NULL };
	char path[256], want[32];
	uint32_t pid, req;
	ssize_t n;

	if (geteuid() != 0) {
		skip(); /* needs root to change users */
		return;
	}
	pid = start_proc(next_req++, 0, "other", "/", argv, NULL);
	follow(pid, 1);
	snprintf(want, sizeof(want), "%d\n", OTHER_UID);
	assert_int_equal(oc.nout, strlen(want));
	assert_memory_equal(oc.out, want, oc.nout);

	/* home is 0755 and belongs to root here: other may not write in it. */
	snprintf(path, sizeof(path), "%s/nope.txt", home);
	req = next_req++;
	memset(&q, 0, sizeof(q));
	q.req = req;
	strcpy(q.user, "other");
	strcpy(q.path, path);
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_WRITE, &q);
	send_frame(EP_WRITE, pl, (size_t)n);
	assert_int_equal(expect_error(req), -EACCES);
	assert_int_equal(access(path, F_OK), -1);

	/* A file it makes in /tmp is its own. */
	snprintf(path, sizeof(path), "%s/mine", dir);
	chmod(dir, 0777);
	req = next_req++;
	strcpy(q.path, path);
	q.req = req;
	n = eproto_fsreq_encode(pl, sizeof(pl), EP_MKDIR, &q);
	send_frame(EP_MKDIR, pl, (size_t)n);
	expect_entry(req);
	assert_int_equal(ent.uid, OTHER_UID);
	assert_string_equal(ent.owner, "other");
	chmod(dir, 0755);
}

/* ---- paths ---- */

static void test_resolve(void **state)
{
	static struct envd_user u;
	static char out[PROTO_MAX_PATH + 1], in[PROTO_MAX_PATH + 2];
	unsigned seed = 12345;
	int i, k;

	strcpy(u.home, "/home/user");
	assert_int_equal(envd_resolve(&u, "a/../b", out), 0);
	assert_string_equal(out, "/home/user/b");
	assert_int_equal(envd_resolve(&u, "/../..", out), 0);
	assert_string_equal(out, "/");
	assert_int_equal(envd_resolve(&u, "//x//./y/", out), 0);
	assert_string_equal(out, "/x/y");
	assert_int_equal(envd_resolve(&u, "../../../etc", out), 0);
	assert_string_equal(out, "/etc");
	assert_int_equal(envd_resolve(&u, ".", out), 0);
	assert_string_equal(out, "/home/user");
	assert_int_equal(envd_resolve(&u, "", out), -EINVAL);
	memset(in, 'a', 256);
	in[256] = '\0';
	assert_int_equal(envd_resolve(&u, in, out), -ENAMETOOLONG); /* a component over 255 */
	for (k = 0; k < PROTO_MAX_PATH; k += 2)
		in[k] = 'a', in[k + 1] = '/';
	in[PROTO_MAX_PATH] = '\0';
	assert_int_equal(envd_resolve(&u, in, out), -ENAMETOOLONG); /* with the home, over 4096 */
	/* Random paths: the result is always clean, absolute and bounded. */
	for (i = 0; i < 20000; i++) {
		static const char alphabet[] = "/./..ab";
		int n = (int)(rand_r(&seed) % 64);

		for (k = 0; k < n; k++)
			in[k] = alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)];
		in[n] = '\0';
		if (envd_resolve(&u, in, out) < 0)
			continue;
		assert_true(out[0] == '/');
		assert_true(strlen(out) <= PROTO_MAX_PATH);
		assert_null(strstr(out, "//"));
		assert_null(strstr(out, "/./"));
		assert_null(strstr(out, "/../"));
		assert_true(strlen(out) == 1 || out[strlen(out) - 1] != '/');
		assert_false(strlen(out) >= 3 && !strcmp(out + strlen(out) - 3, "/.."));
		assert_false(strlen(out) >= 2 && !strcmp(out + strlen(out) - 2, "/."));
	}
}

/* ---- the default user ---- */

static void test_ensure_user(void **state)
{
	char d[64], p[128], g[128], s[128], h[128], buf[4096];
	struct envd_config c;
	struct stat sb;
	FILE *f;
	size_t n;

	snprintf(d, sizeof(d), "/tmp/kiln-envd-user.XXXXXX");
	assert_non_null(mkdtemp(d));
	snprintf(p, sizeof(p), "%s/passwd", d);
	snprintf(g, sizeof(g), "%s/group", d);
	snprintf(s, sizeof(s), "%s/shadow", d);
	/* 1001 is taken as a gid, 1002 as a uid: 1003 is the first free id. */
	put_file(p, "root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/work:/bin/sh\nb:x:1002:1002::/:/bin/sh");
	put_file(g, "root:x:0:\nsandbox:x:1000:\na:x:1001:\n");
	put_file(s, "root:*:1::::::\n");
	c = (struct envd_config){ .passwd = p, .group = g, .shadow = s, .home_dir = d };
	assert_int_equal(envd_ensure_user(&c), 0);
	f = fopen(p, "r");
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	snprintf(h, sizeof(h), "\nuser:x:1003:1003::%s/user:/bin/bash\n", d);
	assert_non_null(strstr(buf, h));
	assert_non_null(strstr(buf, "/bin/sh\nuser:")); /* the missing newline was added */
	f = fopen(g, "r");
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	assert_non_null(strstr(buf, "\nuser:x:1003:\n"));
	f = fopen(s, "r");
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	assert_non_null(strstr(buf, "\nuser:!:"));
	snprintf(h, sizeof(h), "%s/user", d);
	assert_int_equal(stat(h, &sb), 0);
	assert_true(S_ISDIR(sb.st_mode));
	if (geteuid() == 0)
		assert_int_equal(sb.st_uid, 1003);
	/* Idempotent. */
	assert_int_equal(envd_ensure_user(&c), 0);
	f = fopen(p, "r");
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	assert_null(strstr(strstr(buf, "\nuser:") + 1, "\nuser:"));
	snprintf(buf, sizeof(buf), "rm -rf %s", d);
	assert_int_equal(system(buf), 0);
}

/* ---- ports ---- */

/* A listening socket on 127.0.0.1 (the test's own: envd's child shares its
 * network), its port in *port. */
static int listen_loopback(uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 8), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static int accept_within(int lfd, int ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	assert_int_equal(poll(&p, 1, ms), 1);
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

static uint64_t acked; /* PORT_ACK bytes seen by next_port_frame */

/* The next frame that is not a PORT_ACK (those are added up in acked). */
static uint8_t next_port_frame(size_t *len)
{
	for (;;) {
		uint8_t type = expect_frame(len);
		uint32_t v[2];

		if (type != EP_PORT_ACK)
			return type;
		assert_int_equal(eproto_u32s_decode(fr, *len, v, 2), 0);
		acked += v[1];
	}
}

static void expect_port_u32s(uint8_t want, uint32_t id, uint32_t second, unsigned n)
{
	uint32_t v[2];
	size_t len;

	assert_int_equal(next_port_frame(&len), want);
	assert_int_equal(eproto_u32s_decode(fr, len, v, n), 0);
	assert_int_equal(v[0], id);
	if (n == 2)
		assert_int_equal(v[1], second);
}

static void send_port_data(uint32_t id, const void *p, size_t n)
{
	ssize_t len = eproto_idraw_encode(pl, sizeof(pl), id, p, n);

	assert_true(len >= 0);
	send_frame(EP_PORT_DATA, pl, (size_t)len);
}

/* Bytes a server wrote, as they come in PORT_DATA frames of conn id (ACKed
 * as they come when ack is set), up to want or a SHUT; the count. */
static size_t port_read(uint32_t id, uint8_t *out, size_t want, int ack, int *shut)
{
	size_t got = 0, len;
	uint32_t cid;
	const uint8_t *raw;
	size_t n;

	*shut = 0;
	while (got < want) {
		uint8_t type = next_port_frame(&len);

		if (type == EP_PORT_SHUT) {
			*shut = 1;
			break;
		}
		assert_int_equal(type, EP_PORT_DATA);
		assert_int_equal(eproto_idraw_decode(fr, len, &cid, &raw, &n), 0);
		assert_int_equal(cid, id);
		assert_true(got + n <= want);
		if (out)
			memcpy(out + got, raw, n);
		got += n;
		if (ack) {
			uint32_t v[2] = { id, (uint32_t)n };

			send_u32s(EP_PORT_ACK, v, 2);
		}
	}
	return got;
}

/* Hello features, a whole exchange both ways, half closes in both orders. */
static void test_port_echo(void **state)
{
	uint16_t port;
	int lfd = listen_loopback(&port), sfd, shut;
	uint32_t open[2] = { 7, port }, seven = 7;
	char buf[16] = { 0 };
	uint8_t got[16];

	send_u32s(EP_PORT_OPEN, open, 2);
	sfd = accept_within(lfd, 5000);
	assert_true(sfd >= 0);
	expect_port_u32s(EP_PORT_OPENED, 7, 0, 1);
	acked = 0;
	send_port_data(7, "hello", 5);
	assert_int_equal(read(sfd, buf, sizeof(buf)), 5);
	assert_string_equal(buf, "hello");
	assert_int_equal(write(sfd, "world!", 6), 6);
	assert_int_equal(port_read(7, got, 6, 1, &shut), 6);
	assert_memory_equal(got, "world!", 6);
	assert_int_equal(acked, 5); /* the 5 bytes the server took */
	/* The server's half close: SHUT; the host's: the server reads EOF. */
	assert_int_equal(shutdown(sfd, SHUT_WR), 0);
	assert_int_equal(port_read(7, NULL, 1, 1, &shut), 0);
	assert_true(shut);
	send_u32s(EP_PORT_SHUT, &seven, 1);
	assert_int_equal(read(sfd, buf, sizeof(buf)), 0);
	expect_port_u32s(EP_PORT_CLOSED, 7, 0, 2);
	/* The id is free again. */
	send_u32s(EP_PORT_OPEN, open, 2);
	close(accept_within(lfd, 5000));
	expect_port_u32s(EP_PORT_OPENED, 7, 0, 1);
	close(sfd);
	close(lfd);
}

/* Nobody listens: CLOSED -ECONNREFUSED at once, not a hang; a port out of
 * range is a malformed frame. */
static void test_port_refused(void **state)
{
	uint16_t port;
	int lfd = listen_loopback(&port);
	uint32_t open[2] = { 3, port }, zero[2] = { 4, 0 };

	close(lfd);
	send_u32s(EP_PORT_OPEN, open, 2);
	expect_port_u32s(EP_PORT_CLOSED, 3, (uint32_t)-ECONNREFUSED, 2);
	send_u32s(EP_PORT_OPEN, zero, 2);
	assert_int_equal(expect_error(0), -EPROTO);
}

/* A server that writes 3 MiB to a host that does not ACK: one window and
 * no more until the ACK; then the rest. */
static void test_port_window(void **state)
{
	static uint8_t big[3 << 20];
	uint16_t port;
	int lfd = listen_loopback(&port), sfd, shut;
	uint32_t open[2] = { 9, port }, ack[2] = { 9, EPROTO_WINDOW };
	uint8_t type;
	size_t len, off = 0;
	pid_t w;

	send_u32s(EP_PORT_OPEN, open, 2);
	sfd = accept_within(lfd, 5000);
	expect_port_u32s(EP_PORT_OPENED, 9, 0, 1);
	memset(big, 'x', sizeof(big));
	w = fork(); /* the server writes in a child: it blocks on a full socket */
	assert_true(w >= 0);
	if (w == 0) {
		while (off < sizeof(big)) {
			ssize_t n = write(sfd, big + off, sizeof(big) - off);

			if (n <= 0)
				_exit(1);
			off += (size_t)n;
		}
		_exit(0);
	}
	assert_int_equal(port_read(9, NULL, EPROTO_WINDOW, 0, &shut), EPROTO_WINDOW);
	assert_false(recv_frame(&type, fr, &len, 300)); /* the window is full */
	send_u32s(EP_PORT_ACK, ack, 2);
	assert_int_equal(port_read(9, NULL, sizeof(big) - EPROTO_WINDOW, 1, &shut), sizeof(big) - EPROTO_WINDOW);
	assert_int_equal(waitpid(w, NULL, 0), w);
	close(sfd);
	close(lfd);
}

/* The host abandons a connection: the server sees it end, CLOSED frees
 * the id; a CLOSE of an unknown id answers CLOSED too. */
static void test_port_close(void **state)
{
	uint16_t port;
	int lfd = listen_loopback(&port), sfd;
	uint32_t open[2] = { 5, port }, five = 5, six = 6;
	char c;

	send_u32s(EP_PORT_OPEN, open, 2);
	sfd = accept_within(lfd, 5000);
	expect_port_u32s(EP_PORT_OPENED, 5, 0, 1);
	send_u32s(EP_PORT_CLOSE, &five, 1);
	expect_port_u32s(EP_PORT_CLOSED, 5, 0, 2);
	assert_true(read(sfd, &c, 1) <= 0); /* a reset or the end */
	send_u32s(EP_PORT_CLOSE, &six, 1);
	expect_port_u32s(EP_PORT_CLOSED, 6, 0, 2);
	close(sfd);
	close(lfd);
}

/* PORTS: LISTEN sockets of tcp and tcp6, each port once, ascending. */
static void test_ports_list(void **state)
{
	uint16_t ports[EPROTO_MAX_PORTS];
	uint32_t req = next_req++, r, n;
	size_t len;

	send_u32s(EP_PORTS, &req, 1);
	assert_int_equal(expect_frame(&len), EP_PORTS_LIST);
	assert_int_equal(eproto_ports_decode(fr, len, &r, ports, &n), 0);
	assert_int_equal(r, req);
	assert_int_equal(n, 2);
	assert_int_equal(ports[0], 3000);
	assert_int_equal(ports[1], 8080);
}

/* ---- directory watches ---- */

static void send_watch(uint32_t req, uint32_t id, uint32_t flags, const char *path)
{
	static struct eproto_watch w;
	ssize_t n;

	memset(&w, 0, sizeof(w));
	w.req = req;
	w.id = id;
	w.flags = flags;
	snprintf(w.path, sizeof(w.path), "%s", path);
	n = eproto_watch_encode(pl, sizeof(pl), &w);
	assert_true(n > 0);
	send_frame(EP_WATCH, pl, (size_t)n);
}

static void expect_wevent(uint32_t id, uint8_t type, const char *name)
{
	char got[PROTO_MAX_PATH + 1];
	uint32_t i;
	uint8_t t;
	size_t len;

	assert_int_equal(expect_frame(&len), EP_WATCH_EVENT);
	assert_int_equal(eproto_wevent_decode(fr, len, &i, &t, got), 0);
	assert_int_equal(i, id);
	assert_string_equal(got, name);
	assert_int_equal(t, type);
}

static void expect_wend(uint32_t id, int32_t code)
{
	char msg[PROTO_MAX_MSG + 1];
	uint32_t i;
	int32_t c;
	size_t len;

	assert_int_equal(expect_frame(&len), EP_WATCH_END);
	assert_int_equal(eproto_wend_decode(fr, len, &i, &c, msg), 0);
	assert_int_equal(i, id);
	assert_int_equal(c, code);
}

static void test_watch(void **state)
{
	char w[256], p[300], p2[300];
	uint32_t req, id;

	snprintf(w, sizeof(w), "%s/w", home);
	req = next_req++;
	send_watch(req, 7, 0, w);
	assert_int_equal(expect_error(req), -ENOENT);
	snprintf(p, sizeof(p), "%s/afile", home);
	put_file(p, "x");
	req = next_req++;
	send_watch(req, 7, 0, p);
	assert_int_equal(expect_error(req), -ENOTDIR);

	/* Recursive, by a path relative to the home. */
	assert_int_equal(mkdir(w, 0755), 0);
	req = next_req++;
	send_watch(req, 7, EP_WATCH_RECURSIVE, "w");
	expect_done(req);
	snprintf(p, sizeof(p), "%s/a", w);
	put_file(p, "x");
	expect_wevent(7, EP_WEV_CREATE, "a");
	expect_wevent(7, EP_WEV_WRITE, "a");
	snprintf(p2, sizeof(p2), "%s/b", w);
	assert_int_equal(rename(p, p2), 0);
	expect_wevent(7, EP_WEV_RENAME, "a");
	expect_wevent(7, EP_WEV_CREATE, "b");
	assert_int_equal(chmod(p2, 0600), 0);
	expect_wevent(7, EP_WEV_CHMOD, "b");
	/* A directory made now is watched once its CREATE is out. */
	snprintf(p, sizeof(p), "%s/sub", w);
	assert_int_equal(mkdir(p, 0755), 0);
	expect_wevent(7, EP_WEV_CREATE, "sub");
	snprintf(p, sizeof(p), "%s/sub/c", w);
	put_file(p, "y");
	expect_wevent(7, EP_WEV_CREATE, "sub/c");
	expect_wevent(7, EP_WEV_WRITE, "sub/c");
	assert_int_equal(unlink(p2), 0);
	expect_wevent(7, EP_WEV_REMOVE, "b");
	send_u32s(EP_UNWATCH, (uint32_t[]){ 7 }, 1);
	expect_wend(7, 0);
	/* Gone: a change now sends nothing, and UNWATCH again neither. */
	put_file(p2, "z");
	send_u32s(EP_UNWATCH, (uint32_t[]){ 7 }, 1);
	req = next_req++;
	send_u32s(EP_LIST, &req, 1);
	expect_done(req);

	/* At most ENVD_MAX_WATCHES; an id in use is refused. */
	for (id = 100; id < 100 + ENVD_MAX_WATCHES; id++) {
		req = next_req++;
		send_watch(req, id, 0, w);
		expect_done(req);
	}
	req = next_req++;
	send_watch(req, 100, 0, w);
	assert_int_equal(expect_error(req), -EBUSY);
	req = next_req++;
	send_watch(req, 999, 0, w);
	assert_int_equal(expect_error(req), -EMFILE);
	for (id = 100; id < 100 + ENVD_MAX_WATCHES; id++) {
		send_u32s(EP_UNWATCH, &id, 1);
		expect_wend(id, 0);
	}

	/* ENVD_WATCH_DIRS directories per watch: a tree one larger is refused;
	 * one that grows past it ends with -EMFILE after the CREATE. */
	snprintf(p, sizeof(p), "%s/big", home);
	assert_int_equal(mkdir(p, 0755), 0);
	for (int i = 0; i < ENVD_WATCH_DIRS - 1; i++) {
		snprintf(p2, sizeof(p2), "%s/big/d%d", home, i);
		assert_int_equal(mkdir(p2, 0755), 0);
	}
	req = next_req++;
	send_watch(req, 8, EP_WATCH_RECURSIVE, "big");
	expect_done(req);
	snprintf(p2, sizeof(p2), "%s/big/d0/more", home);
	assert_int_equal(mkdir(p2, 0755), 0);
	expect_wevent(8, EP_WEV_CREATE, "d0/more");
	expect_wend(8, -EMFILE);
	req = next_req++;
	send_watch(req, 9, EP_WATCH_RECURSIVE, "big");
	assert_int_equal(expect_error(req), -EMFILE);
	/* Not recursive: one directory, however large the tree. */
	req = next_req++;
	send_watch(req, 9, 0, "big");
	expect_done(req);
	send_u32s(EP_UNWATCH, (uint32_t[]){ 9 }, 1);
	expect_wend(9, 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, envd_setup, envd_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_echo_streams_exit), T(test_env_cwd_user), T(test_start_errors), T(test_signal),
		T(test_stdin_pipe),        T(test_stdin_bound), T(test_pty),          T(test_linger),       T(test_linger_drain), T(test_list),
		T(test_window),            T(test_window_full),  T(test_malformed),    T(test_host_hello),
		T(test_fs_write_read_stat), T(test_fs_metadata), T(test_fs_write_cancel), T(test_fs_dirs),  T(test_other_user),
		T(test_port_echo),         T(test_port_refused), T(test_port_window),  T(test_port_close),   T(test_ports_list),
		T(test_watch),
		cmocka_unit_test(test_resolve), cmocka_unit_test(test_ensure_user),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
