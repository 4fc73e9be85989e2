/* up: `kiln up`, the whole stack on one machine: a local S3 server
 * (scripts/s3-local.sh), kiln-api and one kiln-host, configured with fresh
 * secrets in DIR, a first customer and key, and DIR/credentials written once
 * everything is ready. SIGINT/SIGTERM stop it all; a child that dies stops
 * the rest. kiln up owns its children: kiln-api and kiln-host die with it
 * (PR_SET_PDEATHSIG), the S3 servers are stopped through the script.
 * --egress gives kiln-host a "network" section (egress on) and the customer
 * the allow_egress quota: kiln run --allow and template builds then work. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "cli.h"
#include "fsutil.h"
#include "io.h"
#include "up_tls.h"

#define UP_DEFAULT_DIR "/var/lib/kiln/up"
#define UP_DEFAULT_PORT 8080
#define UP_BUCKET "kiln"
#define UP_HOST_ID "local"
#define UP_CUSTOMER "default"
#define UP_DOMAIN "kiln.localhost"  /* resolves to loopback through nss-myhostname (scripts/deps.sh) */
#define HOST_READY_TIMEOUT_S (30 * 60) /* a first snapshot on a slow TCG machine */
#define HOST_STOP_TIMEOUT_S 60
#define API_STOP_TIMEOUT_S 20

struct up {
	char dir[PATH_MAX - 64], bindir[PATH_MAX - 64], s3_script[PATH_MAX];
	char s3_dir[PATH_MAX], creds[PATH_MAX];
	int port, host_port;
	char admin_key[80], token[80], customer_key[256];
	char api_url[64], host_url[64];
	char s3_endpoint[256], s3_region[64], s3_access[128], s3_secret[128];
	int egress;        /* --egress: kiln-host offers egress, the customer may use it */
	int tls_port;      /* kiln-api's TLS listener (443 when free) */
	char domain[96];   /* the sandbox domain: kiln.localhost[:tls_port] */
	struct up_tls tls; /* DIR/tls: the local CA and the domain's certificate */
	pid_t api_pid, host_pid;
	sigset_t sigs;     /* blocked in kiln up, waited for with sigtimedwait */
	int stop;          /* SIGINT/SIGTERM/SIGHUP arrived */
	const char *died;  /* a child that exited on its own */
	int died_status;
};

static void up_usage(FILE *f)
{
	fprintf(f, "usage: kiln up [--dir DIR] [--port PORT] [--egress]\n"
		   "  Runs a local S3 server, kiln-api on 127.0.0.1:PORT (default %d) and one kiln-host,\n"
		   "  all with their state in DIR (default %s), and writes DIR/credentials once\n"
		   "  they are ready. Ctrl-C or SIGTERM stops everything.\n"
		   "  --egress: sandboxes may reach the network, each only where its policy allows\n"
		   "  (kiln run --allow DEST:PORTS; template builds reach the Debian mirror). kiln-host\n"
		   "  then installs its nftables table, enables IPv4 forwarding and gives each sandbox\n"
		   "  with a policy a NIC behind a filter that always blocks private ranges and this\n"
		   "  machine's own addresses; DNS goes to the resolver of /etc/resolv.conf. The\n"
		   "  customer of kiln up gets the allow_egress quota. Without it no sandbox has a\n"
		   "  network (as before).\n",
		UP_DEFAULT_PORT, UP_DEFAULT_DIR);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;

	fputs("kiln up: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static int random_hex(char *out, size_t bytes)
{
	unsigned char b[64];

	if (bytes > sizeof(b) || getrandom(b, bytes, 0) != (ssize_t)bytes)
		return -1;
	for (size_t i = 0; i < bytes; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
	return 0;
}

/* A TCP port on 127.0.0.1 that is free now (the kernel picks it). */
/* Port want on loopback when nothing holds it (0: any free port): the port, or -1. */
static int bind_port(int want)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)want) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd < 0)
		return -1;
	if (!bind(fd, (struct sockaddr *)&a, sizeof(a)) && !getsockname(fd, (struct sockaddr *)&a, &len))
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static int free_port(void)
{
	return bind_port(0);
}

/* The binaries beside ours, and s3-local.sh: $KILN_S3_LOCAL, else
 * <bindir>/../scripts/s3-local.sh (the source tree), else
 * <bindir>/../share/kiln/s3-local.sh (an install). */
static int find_tools(struct up *u)
{
	char exe[PATH_MAX], *slash;
	const char *env = getenv("KILN_S3_LOCAL");
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n <= 0)
		return -1;
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	*slash = '\0';
	snprintf(u->bindir, sizeof(u->bindir), "%s", exe);
	if (env && *env) {
		snprintf(u->s3_script, sizeof(u->s3_script), "%s", env);
	} else {
		snprintf(u->s3_script, sizeof(u->s3_script), "%s/../scripts/s3-local.sh", u->bindir);
		if (access(u->s3_script, X_OK))
			snprintf(u->s3_script, sizeof(u->s3_script), "%s/../share/kiln/s3-local.sh", u->bindir);
	}
	if (access(u->s3_script, X_OK)) {
		say("s3-local.sh not found beside %s (looked in ../scripts and ../share/kiln; set KILN_S3_LOCAL)",
		    u->bindir);
		return -1;
	}
	for (int i = 0; i < 2; i++) {
		char p[PATH_MAX];

		snprintf(p, sizeof(p), "%s/%s", u->bindir, i ? "kiln-host" : "kiln-api");
		if (access(p, X_OK)) {
			say("%s is missing (build it with make)", p);
			return -1;
		}
	}
	return 0;
}

/* Start argv[0] (a path) with its own process group (so that a Ctrl-C on
 * the terminal reaches only kiln up, which stops the children in order),
 * signals unblocked, stdout to out_fd (-1: the log) and stderr to log
 * (NULL: ours). pdeath: die with kiln up. */
static pid_t spawn(struct up *u, char *const argv[], const char *log, int out_fd, int pdeath)
{
	pid_t pid = fork();

	if (pid < 0) {
		say("fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		int fd;

		setpgid(0, 0);
		if (pdeath)
			prctl(PR_SET_PDEATHSIG, SIGTERM);
		io_child_reset();
		if (log) {
			fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
			if (fd >= 0) {
				dup2(fd, 2);
				if (out_fd < 0)
					dup2(fd, 1);
			}
		}
		if (out_fd >= 0)
			dup2(out_fd, 1);
		execv(argv[0], argv);
		fprintf(stderr, "kiln up: %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	return pid;
}

static void describe_status(int st, char *out, size_t size)
{
	if (WIFEXITED(st))
		snprintf(out, size, "exited with status %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(out, size, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		snprintf(out, size, "ended (status %d)", st);
}

/* Wait up to ms for a signal: a stop request sets u->stop; SIGCHLD reaps
 * kiln-api and kiln-host if they exited (u->died). other: a further child
 * to check (its status in *other_status once reaped; 0 pid when reaped). */
static void up_poll(struct up *u, int ms, pid_t *other, int *other_status)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	int sig = sigtimedwait(&u->sigs, NULL, &ts), st;

	if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
		if (!u->stop)
			say("%s: stopping", strsignal(sig));
		u->stop = 1;
	}
	if (u->api_pid > 0 && waitpid(u->api_pid, &st, WNOHANG) == u->api_pid) {
		u->api_pid = 0;
		u->died = u->died ? u->died : "kiln-api";
		u->died_status = st;
	}
	if (u->host_pid > 0 && waitpid(u->host_pid, &st, WNOHANG) == u->host_pid) {
		u->host_pid = 0;
		u->died = u->died ? u->died : "kiln-host";
		u->died_status = st;
	}
	if (other && *other > 0 && waitpid(*other, other_status, WNOHANG) == *other)
		*other = 0;
}

/* Run s3-local.sh CMD DIR to completion; stdout into out (may be NULL). */
static int run_s3_script(struct up *u, const char *cmd, char *out, size_t size)
{
	char *argv[] = { u->s3_script, (char *)cmd, u->s3_dir, NULL };
	int pfd[2], st = 0;
	size_t len = 0;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -1;
	pid = spawn(u, argv, NULL, pfd[1], 0);
	close(pfd[1]);
	if (pid < 0) {
		close(pfd[0]);
		return -1;
	}
	fcntl(pfd[0], F_SETFL, O_NONBLOCK);
	for (;;) {
		ssize_t n;

		if (out && len + 1 < size) {
			while ((n = read(pfd[0], out + len, size - 1 - len)) > 0)
				len += (size_t)n;
		}
		if (!pid)
			break;
		up_poll(u, 100, &pid, &st);
		/* A stop request during `start`: let the script finish, then stop S3. */
	}
	close(pfd[0]);
	if (out)
		out[len] = '\0';
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		char how[96];

		describe_status(st, how, sizeof(how));
		say("%s %s %s %s", u->s3_script, cmd, u->s3_dir, how);
		return -1;
	}
	return 0;
}

static int start_s3(struct up *u)
{
	char out[4096], name[64], value[512], *line, *save = NULL;

	say("starting the local S3 server (state in %s)", u->s3_dir);
	if (run_s3_script(u, "start", out, sizeof(out)) < 0)
		return -1;
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (creds_parse_line(line, name, sizeof(name), value, sizeof(value)) != 1)
			continue;
		if (!strcmp(name, "S3_ENDPOINT"))
			snprintf(u->s3_endpoint, sizeof(u->s3_endpoint), "%s", value);
		else if (!strcmp(name, "S3_REGION"))
			snprintf(u->s3_region, sizeof(u->s3_region), "%s", value);
		else if (!strcmp(name, "S3_ACCESS_KEY"))
			snprintf(u->s3_access, sizeof(u->s3_access), "%s", value);
		else if (!strcmp(name, "S3_SECRET_KEY"))
			snprintf(u->s3_secret, sizeof(u->s3_secret), "%s", value);
	}
	if (!u->s3_endpoint[0] || !u->s3_access[0] || !u->s3_secret[0]) {
		say("s3-local.sh start printed no S3_ENDPOINT/S3_ACCESS_KEY/S3_SECRET_KEY");
		return -1;
	}
	if (!u->s3_region[0])
		snprintf(u->s3_region, sizeof(u->s3_region), "us-east-1");
	return 0;
}

/* Write len bytes of data to path: mode 0600, written and synced under a
 * temporary name first, so that path is the old file or the whole new one. */
static int write_file_atomic(const char *path, const char *data, size_t len)
{
	char tmp[PATH_MAX + 8];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, data, len) != (ssize_t)len || fsync(fd) < 0 || close(fd) < 0 ||
	    rename(tmp, path) < 0) {
		say("%s: %s", path, strerror(errno));
		if (fd >= 0)
			unlink(tmp);
		return -1;
	}
	return 0;
}

/* Write a JSON document to path (mode 0600, via a temporary name). */
static int write_json(json_t *doc, const char *path)
{
	char *text = json_dumps(doc, JSON_INDENT(2));
	int r;

	if (!text) {
		say("%s: out of memory", path);
		return -1;
	}
	r = write_file_atomic(path, text, strlen(text));
	free(text);
	return r;
}

/* DIR/destinations.key: the key that seals customers' own S3 destinations'
 * secrets in kiln-api's store (README, "Customer destinations"). Made once
 * (32 random bytes, hex, mode 0600) and kept: a new one would make every
 * stored destination undecryptable. */
static int ensure_dest_key(const char *path)
{
	char hex[80];

	if (access(path, F_OK) == 0)
		return 0;
	if (random_hex(hex, 32) < 0)
		return -1;
	strcat(hex, "\n");
	return write_file_atomic(path, hex, strlen(hex));
}

static int write_configs(struct up *u)
{
	char path[PATH_MAX + 32], p2[PATH_MAX + 32], p3[PATH_MAX + 32];
	json_t *s3 = json_pack("{s:s, s:s, s:s, s:s, s:s}", "endpoint", u->s3_endpoint, "region", u->s3_region,
			       "bucket", UP_BUCKET, "access_key", u->s3_access, "secret_key", u->s3_secret);
	json_t *api, *host;
	char listen[64];
	int r;

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", u->port);
	snprintf(path, sizeof(path), "%s/api.db", u->dir);
	api = json_pack("{s:s, s:s, s:s, s:s, s:O}", "listen", listen, "db", path, "admin_key", u->admin_key,
			"cluster_token", u->token, "s3", s3);
	/* Sandboxes' ports at https://<port>-<id>.<domain> (E2B's getHost):
	 * names under localhost resolve to loopback (nss-myhostname). */
	if (api) {
		char tls_listen[64];

		snprintf(tls_listen, sizeof(tls_listen), "127.0.0.1:%d", u->tls_port);
		json_object_set_new(api, "sandbox_domain", json_string(u->domain));
		/* Every client of one machine's stack comes from 127.0.0.1: a
		 * browser, an SDK's pool and a port's connections together. */
		json_object_set_new(api, "max_connections_per_address", json_integer(1024));
		json_object_set_new(api, "tls", json_pack("{s:s, s:s, s:s}", "listen", tls_listen, "cert_file",
							   u->tls.cert, "key_file", u->tls.key));
	}
	snprintf(p3, sizeof(p3), "%s/destinations.key", u->dir);
	if (api && ensure_dest_key(p3) == 0)
		json_object_set_new(api, "destinations", json_pack("{s:s}", "key_file", p3));
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", u->host_port);
	snprintf(path, sizeof(path), "%s/spool", u->dir);
	snprintf(p2, sizeof(p2), "%s/run", u->dir);
	/* One machine of mostly idle sessions: an idle 256 MiB sandbox really
	 * uses ~17-23 MiB, so 4x nominal admits 4x the sandboxes and leaves
	 * room for about a fifth of them to touch all their memory at once; past
	 * that, the budget's cgroup stops sandboxes, never the daemons
	 * (README, "Configuration": choosing the memory overcommit). A pool
	 * of at least 6 warm VMs: a client submitting back to back still runs
	 * half its tasks on a warm VM while refills (~0.35-0.5 s of TCG each
	 * under that load) trail behind; with 1 it was 14 of 30, with 3 it was
	 * 15 until tasks got faster, then 14, with 4 14-15, with 6 16
	 * (docs/performance.md, "kiln up's pool"). Each warm VM costs ~40-55
	 * MiB of real memory. */
	host = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:{s:i, s:i}, s:{s:f}, s:O}", "listen", listen, "host_id",
			 UP_HOST_ID, "token", u->token, "api", u->api_url, "spool_dir", path, "run_dir", p2, "pool",
			 "size", 6, "prestart", 1, "capacity", "memory_overcommit", 4.0, "s3", s3);
	snprintf(path, sizeof(path), "%s/api.json", u->dir);
	snprintf(p3, sizeof(p3), "%s/host.json", u->dir);
	/* The default deny ranges, the link range and the resolv.conf resolver
	 * of kiln-host's network section are what a single machine wants. */
	if (host && u->egress)
		json_object_set_new(host, "network", json_pack("{s:b}", "egress", 1));
	r = (!api || !host || write_json(api, path) < 0 || write_json(host, p3) < 0) ? -1 : 0;
	json_decref(s3);
	json_decref(api);
	json_decref(host);
	return r;
}

static pid_t start_daemon(struct up *u, const char *name, const char *sub)
{
	char bin[PATH_MAX + 16], conf[PATH_MAX + 16], log[PATH_MAX + 16];
	char *argv[5];
	int i = 0;

	snprintf(bin, sizeof(bin), "%s/%s", u->bindir, name);
	snprintf(conf, sizeof(conf), "%s/%s.json", u->dir, sub ? "host" : "api");
	snprintf(log, sizeof(log), "%s/%s.log", u->dir, sub ? "host" : "api");
	argv[i++] = bin;
	if (sub)
		argv[i++] = (char *)sub;
	argv[i++] = "--config";
	argv[i++] = conf;
	argv[i] = NULL;
	return spawn(u, argv, log, -1, 1);
}

/* The last non-empty line of a log file, for progress messages. */
static void last_line(const char *path, char *out, size_t size)
{
	char buf[2048];
	FILE *f = fopen(path, "re");
	long n;
	size_t len;
	char *end, *start;

	out[0] = '\0';
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, n > (long)sizeof(buf) - 1 ? n - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = '\0';
	end = buf + len;
	while (end > buf && (end[-1] == '\n' || end[-1] == '\r'))
		*--end = '\0';
	start = strrchr(buf, '\n');
	start = start ? start + 1 : buf;
	snprintf(out, size, "%.160s", start);
}

static int check_died(struct up *u)
{
	char how[96], log[PATH_MAX + 16], tail[200];

	if (!u->died)
		return 0;
	describe_status(u->died_status, how, sizeof(how));
	snprintf(log, sizeof(log), "%s/%s.log", u->dir, strcmp(u->died, "kiln-api") ? "host" : "api");
	last_line(log, tail, sizeof(tail));
	say("%s %s unexpectedly; its log: %s%s%s", u->died, how, log, tail[0] ? "\n  last line: " : "", tail);
	return -1;
}

/* Wait until kiln-api answers /healthz. */
static int wait_api(struct up *u)
{
	struct cli_conn c = { .api = u->api_url };
	long long deadline = clock_mono_ms() + 30000;

	while (!u->stop && !check_died(u)) {
		struct kiln_err err = { .code = "" };
		json_t *r = NULL;
		int st = http_call(&c, "GET", "/healthz", NULL, 2, &r, &err);

		json_decref(r);
		if (st == 200)
			return 0;
		if (clock_mono_ms() > deadline) {
			say("kiln-api does not answer on %s after 30 s (log: %s/api.log)", u->api_url, u->dir);
			return -1;
		}
		up_poll(u, 100, NULL, NULL);
	}
	return -1;
}

/* Wait until kiln-host is registered, live, with a warm VM ready. The first
 * run creates the snapshot (minutes under TCG): show progress meanwhile. */
static int wait_host(struct up *u)
{
	struct cli_conn c = { .api = u->api_url, .key = u->admin_key };
	long long start = clock_mono_ms(), last_say = start;
	char log[PATH_MAX + 16], tail[200], prev[200] = "";

	snprintf(log, sizeof(log), "%s/host.log", u->dir);
	say("waiting for kiln-host to register and warm a VM (the first run creates the VM snapshot: "
	    "minutes; log: %s)", log);
	while (!u->stop && !check_died(u)) {
		struct kiln_err err = { .code = "" };
		json_t *r = NULL, *h;
		const char *phase = "not registered yet";
		long long now;
		size_t i;
		int st = http_call(&c, "GET", "/v1/admin/hosts", NULL, 5, &r, &err);

		json_array_foreach(st == 200 ? json_object_get(r, "hosts") : NULL, i, h) {
			json_t *ready = json_object_get(json_object_get(json_object_get(h, "capacity"), "pool"), "ready");

			if (strcmp(json_string_value(json_object_get(h, "id")) ?: "", UP_HOST_ID))
				continue;
			if (strcmp(json_string_value(json_object_get(h, "state")) ?: "", "live")) {
				phase = "registered, not live";
				continue;
			}
			if (json_integer_value(ready) >= 1) {
				json_decref(r);
				say("kiln-host is live with a warm VM (%.1f s)", (double)(clock_mono_ms() - start) / 1000);
				return 0;
			}
			phase = "live, warming its pool";
		}
		json_decref(r);
		now = clock_mono_ms();
		if (now - last_say >= 5000) {
			last_line(log, tail, sizeof(tail));
			say("%.0f s: kiln-host %s%s%s", (double)(now - start) / 1000, phase,
			    strcmp(tail, prev) && tail[0] ? "; " : "", strcmp(tail, prev) ? tail : "");
			snprintf(prev, sizeof(prev), "%s", tail);
			last_say = now;
		}
		if (now - start > HOST_READY_TIMEOUT_S * 1000LL) {
			say("kiln-host not ready after %d s (log: %s)", HOST_READY_TIMEOUT_S, log);
			return -1;
		}
		up_poll(u, 250, NULL, NULL);
	}
	return -1;
}

/* The first customer and a key for it (the customer may exist from an
 * earlier run over the same DIR; a new key is made each time). */
static int make_customer(struct up *u)
{
	struct cli_conn c = { .api = u->api_url, .key = u->admin_key };
	struct kiln_err err = { .code = "" };
	json_t *body = json_pack("{s:s, s:s}", "id", UP_CUSTOMER, "name", "kiln up"), *r = NULL;
	char msg[700];
	int st = http_call(&c, "POST", "/v1/admin/customers", body, 30, &r, &err);
	const char *key;

	json_decref(body);
	if (st != 201 && st != 409) {
		if (st < 0)
			say("creating customer %s: %s", UP_CUSTOMER, err.message);
		else
			http_describe_error(st, r, msg, sizeof(msg)), say("creating customer %s: %s", UP_CUSTOMER, msg);
		json_decref(r);
		return -1;
	}
	json_decref(r);
	r = NULL;
	if (u->egress) {
		/* Also when the customer exists from an earlier run without --egress. */
		body = json_pack("{s:b}", "allow_egress", 1);
		st = http_call(&c, "PUT", "/v1/admin/customers/" UP_CUSTOMER "/quotas", body, 30, &r, &err);
		json_decref(body);
		if (st != 200) {
			if (st < 0)
				say("allowing egress to customer %s: %s", UP_CUSTOMER, err.message);
			else
				http_describe_error(st, r, msg, sizeof(msg)),
					say("allowing egress to customer %s: %s", UP_CUSTOMER, msg);
			json_decref(r);
			return -1;
		}
		json_decref(r);
		r = NULL;
	}
	st = http_call(&c, "POST", "/v1/admin/customers/" UP_CUSTOMER "/keys", NULL, 30, &r, &err);
	key = json_string_value(json_object_get(r, "key"));
	if (st != 201 || !key) {
		if (st < 0)
			say("creating a key: %s", err.message);
		else
			http_describe_error(st, r, msg, sizeof(msg)), say("creating a key: %s", msg);
		json_decref(r);
		return -1;
	}
	snprintf(u->customer_key, sizeof(u->customer_key), "%s", key);
	json_decref(r);
	return 0;
}

/* Values go into shell-style lines; only characters that need no quoting. */
static int shell_safe(const char *s)
{
	return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/@+=,") == strlen(s);
}

static int write_credentials(struct up *u)
{
	/* E2B's SDK reads these (docs/e2b.md): `set -a; . DIR/credentials`.
	 * No E2B_SANDBOX_URL: with E2B_DOMAIN the SDK reaches envd as E2B's
	 * cloud does, at https://49983-<id>.<domain> (kiln-api's TLS
	 * listener), so that the file URLs it signs name their sandbox. */
	char e2b_api[sizeof(u->api_url) + 8];
	const char *lines[][2] = {
		{ "KILN_API", u->api_url }, { "KILN_KEY", u->customer_key }, { "KILN_ADMIN_KEY", u->admin_key },
		{ "E2B_API_URL", e2b_api }, { "E2B_API_KEY", u->customer_key },
		{ "S3_ENDPOINT", u->s3_endpoint }, { "S3_REGION", u->s3_region }, { "S3_BUCKET", UP_BUCKET },
		{ "S3_ACCESS_KEY", u->s3_access }, { "S3_SECRET_KEY", u->s3_secret },
		/* https://<port>-<id>.<domain>: the local CA for Node, OpenSSL and
		 * Python's requests (the bundle holds the system's too). */
		{ "E2B_DOMAIN", u->domain }, { "KILN_SANDBOX_DOMAIN", u->domain },
		{ "NODE_EXTRA_CA_CERTS", u->tls.ca }, { "SSL_CERT_FILE", u->tls.bundle },
		{ "REQUESTS_CA_BUNDLE", u->tls.bundle },
	};
	char tmp[PATH_MAX + 16];
	FILE *f;

	snprintf(e2b_api, sizeof(e2b_api), "%s/e2b", u->api_url);
	snprintf(tmp, sizeof(tmp), "%s.tmp", u->creds);
	unlink(tmp);
	f = fopen(tmp, "wex");
	if (!f) {
		say("%s: %s", tmp, strerror(errno));
		return -1;
	}
	fchmod(fileno(f), 0600);
	fprintf(f, "# kiln up: written when the stack is ready, removed when it stops\n");
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
		if (!shell_safe(lines[i][1])) {
			say("%s: a value that needs shell quoting: refusing to write it", lines[i][0]);
			fclose(f);
			unlink(tmp);
			return -1;
		}
		fprintf(f, "%s=%s\n", lines[i][0], lines[i][1]);
	}
	if (fflush(f) || fsync(fileno(f)) || fclose(f) || rename(tmp, u->creds)) {
		say("%s: %s", u->creds, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* SIGTERM one child and wait for it (SIGKILL after timeout_s). */
static void stop_child(struct up *u, pid_t *pid, const char *name, int timeout_s)
{
	long long deadline = clock_mono_ms() + timeout_s * 1000LL;
	pid_t p = *pid;
	int st;

	if (p <= 0)
		return;
	kill(p, SIGTERM);
	for (;;) {
		if (waitpid(p, &st, WNOHANG) == p)
			break;
		if (clock_mono_ms() > deadline) {
			say("%s did not stop within %d s: SIGKILL", name, timeout_s);
			kill(p, SIGKILL);
			waitpid(p, &st, 0);
			break;
		}
		struct timespec ts = { 0, 100000000L };
		sigset_t chld;

		sigemptyset(&chld);
		sigaddset(&chld, SIGCHLD);
		sigtimedwait(&chld, NULL, &ts);
	}
	*pid = 0;
}

/* Everything down, in order: credentials first (nobody should start using a
 * stack that is going away), then the host (it destroys its VMs), the API,
 * S3. */
static void shutdown_all(struct up *u, int s3)
{
	unlink(u->creds);
	if (u->host_pid > 0)
		say("stopping kiln-host");
	stop_child(u, &u->host_pid, "kiln-host", HOST_STOP_TIMEOUT_S);
	if (u->api_pid > 0)
		say("stopping kiln-api");
	stop_child(u, &u->api_pid, "kiln-api", API_STOP_TIMEOUT_S);
	if (s3) {
		say("stopping the local S3 server");
		u->stop = 1;
		run_s3_script(u, "stop", NULL, 0);
	}
}

int cmd_up(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, 0, 'd' }, { "port", required_argument, 0, 'p' },
		{ "egress", no_argument, 0, 'e' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	static struct up u; /* large: PATH_MAX buffers */
	const char *dir = UP_DEFAULT_DIR;
	char lockpath[PATH_MAX + 16], *end;
	sigset_t old;
	int opt, lockfd = -1, rc = 1, s3 = 0, r;

	memset(&u, 0, sizeof(u));
	u.port = UP_DEFAULT_PORT;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "d:p:eh", opts, NULL)) != -1) {
		switch (opt) {
		case 'd':
			dir = optarg;
			break;
		case 'p':
			u.port = (int)strtol(optarg, &end, 10);
			if (*end || end == optarg || u.port < 1 || u.port > 65535) {
				fprintf(stderr, "kiln up: --port: expected 1-65535\n");
				return EXIT_USAGE;
			}
			break;
		case 'e':
			u.egress = 1;
			break;
		case 'h':
			up_usage(stdout);
			return 0;
		default:
			up_usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc) {
		up_usage(stderr);
		return EXIT_USAGE;
	}
	if ((r = fs_mkdir_p(dir, 0700)) < 0) {
		say("%s: %s", dir, strerror(-r));
		return 1;
	}
	if (!realpath(dir, u.dir) || strlen(u.dir) > 200) {
		say("%s: %s", dir, u.dir[0] ? "path too long for the VM sockets under it" : strerror(errno));
		return 1;
	}
	snprintf(u.s3_dir, sizeof(u.s3_dir), "%s/s3", u.dir);
	snprintf(u.creds, sizeof(u.creds), "%s/credentials", u.dir);
	snprintf(lockpath, sizeof(lockpath), "%s/up.lock", u.dir);
	if (find_tools(&u) < 0)
		return 1;
	lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lockfd < 0 || flock(lockfd, LOCK_EX | LOCK_NB) < 0) {
		say("%s: %s", lockpath, lockfd < 0 ? strerror(errno) : "another kiln up runs over this directory");
		if (lockfd >= 0)
			close(lockfd);
		return 1;
	}
	unlink(u.creds); /* left by a kiln up that was killed */
	u.host_port = free_port();
	if (u.host_port < 0 || random_hex(u.admin_key, 24) < 0 || random_hex(u.token, 24) < 0) {
		say("no free port or no randomness");
		goto out;
	}
	snprintf(u.api_url, sizeof(u.api_url), "http://127.0.0.1:%d", u.port);
	/* 443 when free, so that https://<port>-<id>.kiln.localhost needs no
	 * port; else any, carried in the domain (the SDK appends it). */
	u.tls_port = bind_port(443);
	if (u.tls_port < 0)
		u.tls_port = free_port();
	if (u.tls_port == 443)
		snprintf(u.domain, sizeof(u.domain), "%s", UP_DOMAIN);
	else
		snprintf(u.domain, sizeof(u.domain), "%s:%d", UP_DOMAIN, u.tls_port);
	{
		char why[300];

		if (u.tls_port < 0 || up_tls_make(u.dir, u.domain, &u.tls, why, sizeof(why)) < 0) {
			say("TLS for the sandbox domain: %s", u.tls_port < 0 ? "no free port" : why);
			goto out;
		}
	}
	sigemptyset(&u.sigs);
	sigaddset(&u.sigs, SIGINT);
	sigaddset(&u.sigs, SIGTERM);
	sigaddset(&u.sigs, SIGHUP);
	sigaddset(&u.sigs, SIGCHLD);
	sigprocmask(SIG_BLOCK, &u.sigs, &old);

	s3 = 1; /* from here on, stop S3 on the way out (harmless when it never started) */
	if (start_s3(&u) < 0 || u.stop)
		goto down;
	say("S3 at %s", u.s3_endpoint);
	if (write_configs(&u) < 0)
		goto down;
	say("starting kiln-api on %s (log: %s/api.log)", u.api_url, u.dir);
	u.api_pid = start_daemon(&u, "kiln-api", NULL);
	if (u.api_pid < 0 || wait_api(&u) < 0)
		goto down;
	say("starting kiln-host on 127.0.0.1:%d%s (log: %s/host.log)", u.host_port,
	    u.egress ? " with network egress" : "", u.dir);
	u.host_pid = start_daemon(&u, "kiln-host", "serve");
	if (u.host_pid < 0 || wait_host(&u) < 0)
		goto down;
	if (make_customer(&u) < 0 || write_credentials(&u) < 0)
		goto down;
	printf("kiln up: ready\n"
	       "  API          %s\n"
	       "  egress       %s\n"
	       "  S3           %s (bucket %s, access key %s)\n"
	       "  sandboxes    https://PORT-ID.%s (local CA %s)\n"
	       "  credentials  %s (kiln reads it by default; or: . %s)\n"
	       "  logs         %s/{api,host}.log, %s/log\n"
	       "Ctrl-C or SIGTERM stops everything.\n",
	       u.api_url, u.egress ? "on (kiln run --allow DEST:PORTS; template builds)" : "off (kiln up --egress)",
	       u.s3_endpoint, UP_BUCKET, u.s3_access, u.domain, u.tls.ca, u.creds, u.creds, u.dir, u.s3_dir);
	fflush(stdout);
	while (!u.stop && !u.died)
		up_poll(&u, 1000, NULL, NULL);
down:
	if (u.stop && !u.died)
		rc = 0;
	else
		check_died(&u);
	shutdown_all(&u, s3);
	sigprocmask(SIG_SETMASK, &old, NULL);
	say(rc ? "stopped after a failure" : "stopped");
out:
	close(lockfd);
	return rc;
}
