/* session: long-lived sandboxes (see session.h).
 *
 * A session VM is a snapshot clone like a task's, with two differences: its
 * disk layer is a qcow2 overlay of its own in <spool>/sessions/<id>/ (not
 * QEMU's throw-away snapshot=on file), so that it can be saved; and its
 * commands run with PROTO_EXEC_KEEP, so processes they start survive them.
 *
 * Pause: QEMU migrates the stopped VM into a file (its RAM is private, so
 * the stream holds all of it; x-ignore-shared only leaves out RAM shared
 * with a file), which also flushes and releases the overlay. Both go to S3,
 * then a manifest naming their sizes and SHA-256 (written last: a snapshot
 * without one does not exist). Resume: the manifest, then the files, each
 * checked against it; the overlay is re-pointed at this host's copy of the
 * same template (the template key is part of the manifest and must match),
 * and a QEMU with plain RAM loads the stream. Clock and entropy are set anew
 * afterwards, as after any restore. */
#include "session.h"
#include "qcow2.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "fsutil.h"
#include "net.h"
#include "proto.h"
#include "snapshot.h"
#include "spool.h"

#define SESSION_SAVE_MS    300000 /* pausing a VM into its file */
#define SESSION_LOAD_MS    300000
#define SESSION_SETUP_MS   10000
#define SESSION_MANIFEST_V 1
#define SESSION_FILE_MAX   (64u << 20) /* a file read back with GET .../files */
#define SESSION_STDIN_MAX  (16u << 20) /* a command's stdin_b64, decoded */
#define SESSION_STDIN_PATH "/kiln/stdin"
/* Interactive commands: what one input request may carry, decoded, and the
 * pipe that holds input on its way to the guest. Each frame in the pipe is
 * at most PIPE_BUF bytes, so that it is written (and later read) whole. */
#define SESSION_INPUT_MAX   (256u << 10)
#define SESSION_INPUT_PIPE  (1u << 20)
#define SESSION_INPUT_CHUNK (PIPE_BUF - PROTO_HDR_SIZE)

enum session_state { SS_RUNNING, SS_PAUSING, SS_GONE };

struct session {
	char id[65], customer[65];
	enum session_state state;
	struct vm vm;
	struct net_sandbox *net;
	json_t *spec;            /* {"limits","network"}: kept for the manifest */
	unsigned vcpus, memory_mib, output_mib;
	const struct snapshot *snap;
	char release[65];
	char dir[PATH_MAX], disk[PATH_MAX + 16], state_path[PATH_MAX + 16];
	int64_t created_ms, last_active_ms;
	pthread_mutex_t op;      /* one operation at a time */
	int refs;                /* under ss->lock */
	/* The interactive command running now (under ss->lock): its id and the
	 * write end of its input pipe (-1: none). */
	char exec_id[33];
	int input_wr;
	struct session *next;
};

/* A QEMU dies with the thread that started it (PR_SET_PDEATHSIG), and HTTP
 * requests come on threads that end with them: session VMs are started on
 * this process-long thread instead. */
struct launch {
	const struct vm_config *cfg;
	struct vm *vm;
	struct kiln_err *err;
	int done, rc;
	struct launch *next;
};

struct sessions {
	struct hostd *d;
	char host_id[65];
	char root[PATH_MAX];
	pthread_mutex_t lock;
	struct session *list;
	pthread_t launcher;
	pthread_cond_t launch_cond, launched_cond;
	struct launch *queue;
	int stopping;
};

static void *launcher_main(void *arg)
{
	struct sessions *ss = arg;

	pthread_mutex_lock(&ss->lock);
	for (;;) {
		struct launch *l;

		while (!ss->queue && !ss->stopping)
			pthread_cond_wait(&ss->launch_cond, &ss->lock);
		if (!ss->queue)
			break;
		l = ss->queue;
		ss->queue = l->next;
		pthread_mutex_unlock(&ss->lock);
		l->rc = vm_start(l->cfg, l->vm, l->err);
		pthread_mutex_lock(&ss->lock);
		l->done = 1;
		pthread_cond_broadcast(&ss->launched_cond);
	}
	pthread_mutex_unlock(&ss->lock);
	return NULL;
}

/* vm_start on the launcher thread. */
static int launch_vm(struct sessions *ss, const struct vm_config *cfg, struct vm *vm, struct kiln_err *err)
{
	struct launch l = { .cfg = cfg, .vm = vm, .err = err };

	pthread_mutex_lock(&ss->lock);
	l.next = ss->queue;
	ss->queue = &l;
	pthread_cond_signal(&ss->launch_cond);
	while (!l.done)
		pthread_cond_wait(&ss->launched_cond, &ss->lock);
	pthread_mutex_unlock(&ss->lock);
	return l.rc;
}

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct sessions *sessions_open(struct hostd *d, const char *host_id, const char *spool_dir, struct kiln_err *err)
{
	struct sessions *ss = calloc(1, sizeof(*ss));

	if (!ss) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	ss->d = d;
	snprintf(ss->host_id, sizeof(ss->host_id), "%s", host_id ? host_id : "");
	snprintf(ss->root, sizeof(ss->root), "%s/sessions", spool_dir);
	pthread_mutex_init(&ss->lock, NULL);
	pthread_cond_init(&ss->launch_cond, NULL);
	pthread_cond_init(&ss->launched_cond, NULL);
	if (pthread_create(&ss->launcher, NULL, launcher_main, ss) != 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the session launcher thread");
		free(ss);
		return NULL;
	}
	/* Sessions of an earlier process died with it (their VMs were its
	 * children); paused ones are in S3, not here. */
	fs_rmtree(ss->root);
	if (fs_mkdir_p(ss->root, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", ss->root, strerror(errno));
		sessions_close(ss);
		return NULL;
	}
	return ss;
}

static void session_teardown(struct sessions *ss, struct session *s)
{
	vm_destroy(&s->vm);
	if (s->net) {
		net_sandbox_stop(s->net, NULL);
		s->net = NULL;
	}
	if (s->vcpus)
		hostd_release(ss->d, s->vcpus, s->memory_mib);
	s->vcpus = 0;
	fs_rmtree(s->dir);
}

static void session_free(struct session *s)
{
	json_decref(s->spec);
	pthread_mutex_destroy(&s->op);
	free(s);
}

void sessions_close(struct sessions *ss)
{
	if (!ss)
		return;
	pthread_mutex_lock(&ss->lock);
	while (ss->list) {
		struct session *s = ss->list;

		ss->list = s->next;
		pthread_mutex_unlock(&ss->lock);
		pthread_mutex_lock(&s->op);
		session_teardown(ss, s);
		pthread_mutex_unlock(&s->op);
		session_free(s);
		pthread_mutex_lock(&ss->lock);
	}
	ss->stopping = 1;
	pthread_cond_broadcast(&ss->launch_cond);
	pthread_mutex_unlock(&ss->lock);
	pthread_join(ss->launcher, NULL);
	free(ss);
}

static json_t *session_json(const struct sessions *ss, const struct session *s)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:i}", "id", s->id, "customer", s->customer, "state",
			 s->state == SS_RUNNING ? "running" : s->state == SS_PAUSING ? "pausing" : "destroyed", "host_id",
			 ss->host_id, "created_ms", (json_int_t)s->created_ms, "last_active_ms",
			 (json_int_t)s->last_active_ms, "vcpus", (int)s->vcpus, "memory_mib", (int)s->memory_mib);
}

json_t *sessions_list(struct sessions *ss)
{
	json_t *a = json_array();

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		json_array_append_new(a, session_json(ss, s));
	pthread_mutex_unlock(&ss->lock);
	return json_pack("{s:o}", "sessions", a);
}

json_t *session_get(struct sessions *ss, const char *id)
{
	json_t *j = NULL;

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id))
			j = session_json(ss, s);
	pthread_mutex_unlock(&ss->lock);
	return j;
}

/* Take the session for one operation: found, referenced, its op lock held.
 * NULL with err "not_found" or "busy". */
static struct session *session_take(struct sessions *ss, const char *id, struct kiln_err *err)
{
	struct session *s;

	pthread_mutex_lock(&ss->lock);
	for (s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id))
			break;
	if (s)
		s->refs++;
	pthread_mutex_unlock(&ss->lock);
	if (!s) {
		kiln_err_set(err, KERR_NOT_FOUND, "no session %s on this host", id);
		return NULL;
	}
	if (pthread_mutex_trylock(&s->op) != 0) {
		pthread_mutex_lock(&ss->lock);
		s->refs--;
		pthread_mutex_unlock(&ss->lock);
		kiln_err_set(err, KERR_BUSY, "session %s is busy with another request", id);
		return NULL;
	}
	if (s->state == SS_GONE) {
		pthread_mutex_unlock(&s->op);
		pthread_mutex_lock(&ss->lock);
		s->refs--;
		pthread_mutex_unlock(&ss->lock);
		kiln_err_set(err, KERR_NOT_FOUND, "no session %s on this host", id);
		return NULL;
	}
	return s;
}

/* End an operation; with gone, the session also leaves the list and is
 * freed by whoever holds the last reference. */
static void session_put(struct sessions *ss, struct session *s, int gone)
{
	int free_it;

	if (gone)
		s->state = SS_GONE;
	else
		s->last_active_ms = wall_ms();
	pthread_mutex_unlock(&s->op);
	pthread_mutex_lock(&ss->lock);
	if (gone) {
		for (struct session **pp = &ss->list; *pp; pp = &(*pp)->next)
			if (*pp == s) {
				*pp = s->next;
				break;
			}
	}
	free_it = --s->refs == 0 && s->state == SS_GONE;
	pthread_mutex_unlock(&ss->lock);
	if (free_it)
		session_free(s);
}

/* ---- create ------------------------------------------------------------- */

/* Parse a session spec ({"limits","network"}) as a task spec, so the same
 * rules and messages apply. */
static int parse_session_spec(json_t *spec, struct task_spec *out, struct kiln_err *err)
{
	const char *k;
	json_t *v, *j;
	char *text;
	int r;

	if (!json_is_object(spec))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "spec: expected an object");
	json_object_foreach(spec, k, v)
		if (strcmp(k, "limits") && strcmp(k, "network"))
			return kiln_err_set(err, KERR_INVALID_SPEC, "%s: a session spec has only \"limits\" and \"network\"", k);
	j = json_deep_copy(spec);
	json_object_set_new(j, "argv", json_pack("[s]", "true"));
	text = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!text)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r = spec_parse(text, strlen(text), out, err);
	free(text);
	return r;
}

/* The template a session of spec starts from (and is resumed against). */
static const struct snapshot *template_for(const struct run_opts *ro, const struct task_spec *spec,
					   struct kiln_err *err)
{
	const struct snapshot *snap = spec->egress ? ro->net_snap : ro->snap;

	if (!snap) {
		kiln_err_set(err, spec->egress && !(ro->net && ro->net->enabled) ? KERR_EGRESS_UNAVAILABLE : KERR_INVALID_SPEC,
			     spec->egress && !(ro->net && ro->net->enabled)
				     ? "network.egress: this host does not offer network egress"
				     : "sessions need a snapshot: this host runs cold");
		return NULL;
	}
	if (snap->memory_mib != spec->memory_mib || snap->vcpus != spec->vcpus) {
		kiln_err_set(err, KERR_INVALID_SPEC,
			     "limits: sessions on this host have %u MiB and %u vCPU (its snapshot's size), not %u MiB and %u",
			     snap->memory_mib, snap->vcpus, spec->memory_mib, spec->vcpus);
		return NULL;
	}
	return snap;
}

static struct session *session_new(struct sessions *ss, const char *id, const char *customer, json_t *spec,
				   const struct task_spec *ts, const struct snapshot *snap, struct kiln_err *err)
{
	struct session *s = calloc(1, sizeof(*s));

	if (!s) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	snprintf(s->id, sizeof(s->id), "%s", id);
	snprintf(s->customer, sizeof(s->customer), "%s", customer);
	s->vm.pid = s->vm.pidfd = s->vm.agent_fd = s->vm.qmp_fd = s->vm.lock_fd = -1;
	s->spec = json_deep_copy(spec);
	s->memory_mib = ts->memory_mib;
	s->output_mib = ts->output_mib;
	s->snap = snap;
	snprintf(s->release, sizeof(s->release), "%s", snap->release);
	snprintf(s->dir, sizeof(s->dir), "%s/%s", ss->root, id);
	snprintf(s->disk, sizeof(s->disk), "%s/disk.qcow2", s->dir);
	snprintf(s->state_path, sizeof(s->state_path), "%s/state", s->dir);
	s->created_ms = s->last_active_ms = wall_ms();
	s->input_wr = -1;
	pthread_mutex_init(&s->op, NULL);
	return s;
}

/* Register s, unless a session with its id is here already. */
static int session_insert(struct sessions *ss, struct session *s, struct kiln_err *err)
{
	pthread_mutex_lock(&ss->lock);
	for (struct session *o = ss->list; o; o = o->next)
		if (!strcmp(o->id, s->id)) {
			pthread_mutex_unlock(&ss->lock);
			return kiln_err_set(err, KERR_DUPLICATE, "session %s already runs on this host", s->id);
		}
	s->next = ss->list;
	ss->list = s;
	pthread_mutex_unlock(&ss->lock);
	return 0;
}

/* Start the session's VM: its network (if any), then QEMU on the overlay
 * s->disk (backed by the template's disk), loading state_fd (a template's
 * device state, or a paused session's whole state with mem_ram). */
static int session_boot(struct sessions *ss, struct session *s, const struct task_spec *ts, int state_fd, int mem_ram,
			struct kiln_err *err)
{
	const struct run_opts *ro = hostd_run_opts(ss->d);
	struct vm_config cfg = ro->vm;

	if (ts->egress) {
		if (net_sandbox_start(ro->net, ts->net_rules, ts->nnet_rules, NULL, NULL, &s->net, err) < 0)
			return -1;
		cfg.net = 1;
		cfg.net_fd = net_sandbox_tap_fd(s->net);
	}
	cfg.vcpus = s->snap->vcpus;
	cfg.memory_mib = s->snap->memory_mib;
	cfg.disk = s->disk;
	cfg.disk_format = "qcow2";
	cfg.disk_writable = 1;
	cfg.disk_backing = s->snap->disk;
	cfg.disk_backing2 = s->snap->backing;
	cfg.incoming = 1;
	cfg.cancel_fd = -1;
	if (mem_ram) {
		cfg.mem_ram = 1;
		cfg.mem_fd = 0;
		cfg.mem_file = NULL;
	} else {
		cfg.mem_fd = s->snap->mem_fd;
		cfg.mem_file = s->snap->mem;
		cfg.mem_share = 0;
	}
	if (launch_vm(ss, &cfg, &s->vm, err) < 0)
		return -1;
	if (snapshot_load_fd(&s->vm, state_fd, SESSION_LOAD_MS, err) < 0) {
		if (mem_ram)
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's state does not load: %s", err->message);
		return -1;
	}
	return vm_setup(&s->vm, proto_now_ms() + SESSION_SETUP_MS, err);
}

/* The overlay that holds everything the session writes to its disk. */
static int make_overlay(const char *disk, const char *backing, struct kiln_err *err)
{
	char *argv[] = { "/usr/bin/qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", (char *)backing,
			 (char *)disk, NULL };

	if (snapshot_run_cmd(argv) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "qemu-img create %s failed", disk);
	return 0;
}

int session_create(struct sessions *ss, const char *id, const char *customer, json_t *spec, json_t **out,
		   struct kiln_err *err)
{
	struct task_spec ts;
	const struct snapshot *snap;
	struct session *s;
	int fd, r;

	*out = NULL;
	if (!spool_id_ok(id) || !spool_id_ok(customer))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "id and customer: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (parse_session_spec(spec, &ts, err) < 0)
		return -1;
	snap = template_for(hostd_run_opts(ss->d), &ts, err);
	if (!snap || hostd_reserve(ss->d, ts.vcpus, ts.memory_mib, err) < 0) {
		spec_free(&ts);
		return -1;
	}
	s = session_new(ss, id, customer, spec, &ts, snap, err);
	if (!s) {
		hostd_release(ss->d, ts.vcpus, ts.memory_mib);
		spec_free(&ts);
		return -1;
	}
	s->vcpus = ts.vcpus;
	pthread_mutex_lock(&s->op);
	s->refs = 1;
	if (session_insert(ss, s, err) < 0) {
		hostd_release(ss->d, s->vcpus, s->memory_mib);
		pthread_mutex_unlock(&s->op);
		session_free(s);
		spec_free(&ts);
		return -1;
	}
	r = -1;
	fd = -1;
	if (mkdir(s->dir, 0700) < 0)
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", s->dir, strerror(errno));
	else if (make_overlay(s->disk, snap->disk, err) == 0 && (fd = open(snap->state, O_RDONLY | O_CLOEXEC)) < 0)
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: %s", snap->state, strerror(errno));
	else if (fd >= 0 && session_boot(ss, s, &ts, fd, 0, err) == 0)
		r = 0;
	if (fd >= 0)
		close(fd);
	spec_free(&ts);
	if (r < 0) {
		session_teardown(ss, s);
		session_put(ss, s, 1);
		return -1;
	}
	*out = session_json(ss, s);
	session_put(ss, s, 0);
	return 0;
}

/* ---- commands and files ------------------------------------------------- */

/* The session's command as a task spec: the session's limits plus the
 * command's own timeout, so that the spec parser checks everything. */
static int exec_spec(const struct session *s, json_t *req, struct task_spec *ts, struct kiln_err *err)
{
	const char *k;
	json_t *v, *j, *limits;
	char *text;
	int r;

	if (!json_is_object(req))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "expected a JSON object");
	j = json_object();
	json_object_foreach(req, k, v) {
		if (!strcmp(k, "timeout_s") || !strcmp(k, "stdin_b64") || !strcmp(k, "tty") || !strcmp(k, "interactive"))
			continue;
		if (strcmp(k, "argv") && strcmp(k, "language") && strcmp(k, "code") && strcmp(k, "env") &&
		    strcmp(k, "cwd") && strcmp(k, "files")) {
			json_decref(j);
			return kiln_err_set(err, KERR_INVALID_SPEC, "%s: not a field of a session command", k);
		}
		json_object_set(j, k, v);
	}
	limits = json_pack("{s:i, s:i, s:i}", "vcpus", (int)s->vcpus, "memory_mib", (int)s->memory_mib, "output_mib",
			   (int)s->output_mib);
	if (json_object_get(req, "timeout_s"))
		json_object_set(limits, "timeout_s", json_object_get(req, "timeout_s"));
	json_object_set_new(j, "limits", limits);
	text = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!text)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	r = spec_parse(text, strlen(text), ts, err);
	free(text);
	return r;
}

/* The field `name` of req (standard base64, padded), decoded: *data is
 * malloc'd (NULL when there is none). At most max bytes. 0 or -1 with err. */
static int field_b64(json_t *req, const char *name, size_t max, unsigned char **data, size_t *len,
		     struct kiln_err *err)
{
	json_t *v = json_object_get(req, name);
	const char *b;
	size_t n;
	int got;

	*data = NULL;
	*len = 0;
	if (!v)
		return 0;
	b = json_string_value(v);
	n = b ? strlen(b) : 0;
	/* The decoded length: padding ('=') carries no data. */
	if (!b || n % 4 || n / 4 * 3 - (n && b[n - 1] == '=') - (n > 1 && b[n - 2] == '=') > max)
		return kiln_err_set(err, KERR_INVALID_SPEC, "%s: expected padded base64 of at most %zu KiB", name,
				    max >> 10);
	*data = malloc(n / 4 * 3 + 1);
	if (!*data)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	got = n ? EVP_DecodeBlock(*data, (const unsigned char *)b, (int)n) : 0;
	for (size_t i = 0; i < n; i++)
		if (b[i] == '=' && i < n - 2)
			got = -1; /* padding only at the end */
	if (got < 0) {
		free(*data);
		*data = NULL;
		return kiln_err_set(err, KERR_INVALID_SPEC, "%s: not valid base64", name);
	}
	if (n && b[n - 1] == '=')
		got--;
	if (n > 1 && b[n - 2] == '=')
		got--;
	*len = (size_t)got;
	return 0;
}

/* "interactive": true (stdin from input requests) or "tty": {"rows","cols"}
 * (a terminal, input typed into it): the PROTO_EXEC_* flag and size. */
static int exec_interactive(json_t *req, unsigned *flags, uint32_t *rows, uint32_t *cols, struct kiln_err *err)
{
	json_t *tty = json_object_get(req, "tty"), *ia = json_object_get(req, "interactive"), *v;
	const char *k;

	*flags = 0;
	*rows = *cols = 0;
	if (ia && !json_is_boolean(ia))
		return kiln_err_set(err, KERR_INVALID_SPEC, "interactive: expected true or false");
	if (json_is_true(ia))
		*flags = PROTO_EXEC_STDIN;
	if (!tty || json_is_null(tty))
		goto done;
	if (!json_is_object(tty))
		return kiln_err_set(err, KERR_INVALID_SPEC, "tty: expected an object {\"rows\":N,\"cols\":N}");
	json_object_foreach(tty, k, v) {
		json_int_t n = json_integer_value(v);

		if (strcmp(k, "rows") && strcmp(k, "cols"))
			return kiln_err_set(err, KERR_INVALID_SPEC, "tty.%s: not a field (rows, cols)", k);
		if (!json_is_integer(v) || n < 1 || n > PROTO_MAX_TTY_DIM)
			return kiln_err_set(err, KERR_INVALID_SPEC, "tty.%s: expected an integer from 1 to %d", k,
					    PROTO_MAX_TTY_DIM);
		*(k[0] == 'r' ? rows : cols) = (uint32_t)n;
	}
	if (!*rows || !*cols)
		return kiln_err_set(err, KERR_INVALID_SPEC, "tty: both rows and cols are required");
	*flags = PROTO_EXEC_TTY;
done:
	if (*flags && json_object_get(req, "stdin_b64"))
		return kiln_err_set(err, KERR_INVALID_SPEC, "stdin_b64: not with an interactive command (send input instead)");
	return 0;
}

/* Run the command with its stdin from SESSION_STDIN_PATH: argv behind a
 * shell that redirects and execs it (the guest starts every command with
 * stdin at /dev/null). */
static int wrap_stdin(struct task_spec *ts, struct kiln_err *err)
{
	static const char *const pre[] = { "/bin/sh", "-c", "exec \"$@\" < " SESSION_STDIN_PATH, "sh" };
	char **argv = calloc(ts->argc + 5, sizeof(*argv));

	if (!argv)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	for (size_t i = 0; i < 4; i++)
		if (!(argv[i] = strdup(pre[i]))) {
			for (size_t j = 0; j < i; j++)
				free(argv[j]);
			free(argv);
			return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		}
	memcpy(argv + 4, ts->argv, ts->argc * sizeof(*argv));
	free(ts->argv);
	ts->argv = argv;
	ts->argc += 4;
	ts->language = SPEC_LANG_NONE; /* not the pre-started interpreter: it has no stdin */
	return 0;
}

/* The VM stopped answering: the session is over. */
static int vm_broken(json_t *result)
{
	return !strcmp(json_string_value(json_object_get(result, "state")) ?: "", "error") &&
	       !strcmp(json_string_value(json_object_get(result, "end_reason")) ?: "", "vm_error");
}

/* The interactive command is over: no more input requests reach it. */
static void input_close(struct sessions *ss, struct session *s, int rd)
{
	pthread_mutex_lock(&ss->lock);
	if (s->input_wr >= 0)
		close(s->input_wr);
	s->input_wr = -1;
	s->exec_id[0] = '\0';
	pthread_mutex_unlock(&ss->lock);
	if (rd >= 0)
		close(rd);
}

/* One command in a session whose op lock the caller holds (session_take);
 * *gone says whether the VM broke and the session ended (for session_put). */
static json_t *exec_held(struct sessions *ss, struct session *s, json_t *req,
			 void (*on_event)(void *ctx, int event, const void *data, size_t len), void *ctx, int *gone,
			 struct kiln_err *err)
{
	struct run_opts opts;
	struct task_spec ts;
	json_t *result;
	unsigned char *in = NULL, rnd[16];
	size_t in_len = 0;
	unsigned flags;
	uint32_t rows, cols;
	int broken, pipe_fd[2] = { -1, -1 };
	char exec_id[33] = "";

	*gone = 0;
	if (s->state != SS_RUNNING) {
		kiln_err_set(err, KERR_BUSY, "session %s is being paused", s->id);
		return NULL;
	}
	if (exec_interactive(req, &flags, &rows, &cols, err) < 0 || exec_spec(s, req, &ts, err) < 0)
		return NULL;
	if (flags) {
		if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd) || pipe2(pipe_fd, O_CLOEXEC | O_NONBLOCK) < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "interactive command: %s", strerror(errno));
			spec_free(&ts);
			return NULL;
		}
		/* Room for a burst of typing or a pasted file; the default 64 KiB if refused. */
		fcntl(pipe_fd[1], F_SETPIPE_SZ, SESSION_INPUT_PIPE);
		for (size_t i = 0; i < sizeof(rnd); i++)
			sprintf(exec_id + 2 * i, "%02x", rnd[i]);
		pthread_mutex_lock(&ss->lock);
		memcpy(s->exec_id, exec_id, sizeof(exec_id));
		s->input_wr = pipe_fd[1];
		pthread_mutex_unlock(&ss->lock);
	}
	if (field_b64(req, "stdin_b64", SESSION_STDIN_MAX, &in, &in_len, err) < 0 ||
	    (in && (wrap_stdin(&ts, err) < 0 ||
		    run_session_put(&s->vm, SESSION_STDIN_PATH, in, in_len, 0600, err) < 0))) {
		free(in);
		spec_free(&ts);
		input_close(ss, s, pipe_fd[0]);
		return NULL;
	}
	free(in);
	opts = *hostd_run_opts(ss->d);
	opts.vm.cancel_fd = -1;
	opts.stream = NULL;
	opts.on_event = on_event;
	opts.event_ctx = ctx;
	opts.extra_flags = flags;
	opts.tty_rows = rows;
	opts.tty_cols = cols;
	opts.input_fd = pipe_fd[0];
	opts.exec_id = flags ? exec_id : NULL;
	result = run_session_exec(&s->vm, &ts, &opts);
	spec_free(&ts);
	input_close(ss, s, pipe_fd[0]);
	broken = vm_broken(result);
	if (broken) {
		fprintf(stderr, "kiln-host: session %s: its VM failed; the session ends\n", s->id);
		session_teardown(ss, s);
	}
	*gone = broken;
	return result;
}

json_t *session_exec(struct sessions *ss, const char *id, json_t *req,
		     void (*on_event)(void *ctx, int event, const void *data, size_t len), void *ctx,
		     struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	json_t *result;
	int gone;

	if (!s)
		return NULL;
	result = exec_held(ss, s, req, on_event, ctx, &gone, err);
	session_put(ss, s, gone);
	return result;
}

/* One frame into the input pipe, whole (the caller checked the room). */
static int input_frame(int fd, uint8_t type, const void *p, size_t n)
{
	uint8_t frame[PIPE_BUF];

	proto_frame_header(frame, type, (uint32_t)n);
	if (n)
		memcpy(frame + PROTO_HDR_SIZE, p, n);
	return write(fd, frame, PROTO_HDR_SIZE + n) == (ssize_t)(PROTO_HDR_SIZE + n) ? 0 : -1;
}

json_t *session_input(struct sessions *ss, const char *id, json_t *req, struct kiln_err *err)
{
	json_t *resize = json_object_get(req, "resize"), *eof = json_object_get(req, "eof"), *v;
	const char *exec_id = json_string_value(json_object_get(req, "exec_id")), *k;
	unsigned char *data = NULL;
	uint8_t rs[8];
	uint32_t rows = 0, cols = 0;
	size_t len = 0, need = 0, room, frames;
	struct session *s;
	int r = -1, queued = 0, size;

	if (!json_is_object(req)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "expected a JSON object");
		return NULL;
	}
	json_object_foreach(req, k, v)
		if (strcmp(k, "exec_id") && strcmp(k, "data_b64") && strcmp(k, "eof") && strcmp(k, "resize")) {
			kiln_err_set(err, KERR_INVALID_REQUEST, "%s: not a field of an input request", k);
			return NULL;
		}
	if (!exec_id) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "exec_id: expected the string the command's started event gave");
		return NULL;
	}
	if (eof && !json_is_boolean(eof)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "eof: expected true or false");
		return NULL;
	}
	if (resize && (!json_is_object(resize) || json_object_size(resize) != 2 ||
		       json_integer_value(json_object_get(resize, "rows")) < 1 ||
		       json_integer_value(json_object_get(resize, "rows")) > PROTO_MAX_TTY_DIM ||
		       json_integer_value(json_object_get(resize, "cols")) < 1 ||
		       json_integer_value(json_object_get(resize, "cols")) > PROTO_MAX_TTY_DIM)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "resize: expected {\"rows\":N,\"cols\":N}, each from 1 to %d",
			     PROTO_MAX_TTY_DIM);
		return NULL;
	}
	if (field_b64(req, "data_b64", SESSION_INPUT_MAX, &data, &len, err) < 0) {
		kiln_err_recode(err, KERR_INVALID_REQUEST);
		return NULL;
	}
	if (resize) {
		rows = (uint32_t)json_integer_value(json_object_get(resize, "rows"));
		cols = (uint32_t)json_integer_value(json_object_get(resize, "cols"));
		proto_resize_encode(rs, sizeof(rs), rows, cols);
		need += PROTO_HDR_SIZE + sizeof(rs);
	}
	frames = (len + SESSION_INPUT_CHUNK - 1) / SESSION_INPUT_CHUNK + (resize != NULL) + json_is_true(eof);
	need += len + (len + SESSION_INPUT_CHUNK - 1) / SESSION_INPUT_CHUNK * PROTO_HDR_SIZE;
	if (json_is_true(eof))
		need += PROTO_HDR_SIZE;

	pthread_mutex_lock(&ss->lock);
	for (s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id))
			break;
	if (!s || s->state == SS_GONE) {
		kiln_err_set(err, KERR_NOT_FOUND, "no session %s on this host", id);
		goto out;
	}
	if (s->input_wr < 0 || strcmp(s->exec_id, exec_id)) {
		kiln_err_set(err, KERR_NO_EXEC, "no interactive command %.40s runs in session %s (it ended?)", exec_id, id);
		goto out;
	}
	/* All of it or nothing: the pipe's free room, checked under the lock
	 * that every writer takes (the reader only makes more room). */
	size = fcntl(s->input_wr, F_GETPIPE_SZ);
	if (size < 0 || ioctl(s->input_wr, FIONREAD, &queued) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "input pipe: %s", strerror(errno));
		goto out;
	}
	room = (size_t)size > (size_t)queued ? (size_t)size - (size_t)queued : 0;
	/* A frame that does not fit the pipe's last page takes a page of its
	 * own: allow a page's slack per frame. */
	if (need + frames * PIPE_BUF > room) {
		kiln_err_set(err, KERR_INPUT_FULL, "the command has not yet taken the %d bytes sent before; retry", queued);
		goto out;
	}
	if (resize && input_frame(s->input_wr, PROTO_RESIZE, rs, sizeof(rs)) < 0)
		goto write_failed;
	for (size_t off = 0; off < len; off += SESSION_INPUT_CHUNK)
		if (input_frame(s->input_wr, PROTO_STDIN, data + off,
				len - off < SESSION_INPUT_CHUNK ? len - off : SESSION_INPUT_CHUNK) < 0)
			goto write_failed;
	if (json_is_true(eof) && input_frame(s->input_wr, PROTO_STDIN, NULL, 0) < 0)
		goto write_failed;
	s->last_active_ms = wall_ms();
	r = 0;
	goto out;
write_failed:
	kiln_err_set(err, KERR_HOST_ERROR, "input pipe: %s", strerror(errno));
out:
	pthread_mutex_unlock(&ss->lock);
	free(data);
	return r < 0 ? NULL : json_pack("{s:s, s:I}", "exec_id", exec_id, "accepted", (json_int_t)len);
}

void session_interrupt(struct sessions *ss, const char *id, const char *exec_id)
{
	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id) && s->input_wr >= 0 && !strcmp(s->exec_id, exec_id) &&
		    input_frame(s->input_wr, PROTO_HANGUP, NULL, 0) == 0)
			fprintf(stderr, "kiln-host: session %s: interactive command %s lost its client: hung up\n", id,
				exec_id);
	pthread_mutex_unlock(&ss->lock);
}

int session_put_file(struct sessions *ss, const char *id, const char *path, const void *data, size_t len,
		     struct kiln_err *err)
{
	struct session *s;
	int r;

	if (!path || proto_abspath_ok(path) || !strncmp(path, SPEC_RESERVED_DIR "/", sizeof(SPEC_RESERVED_DIR)))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "path: expected an absolute path without '.', '..' or empty parts, outside /kiln");
	if (len > SESSION_FILE_MAX)
		return kiln_err_set(err, KERR_TOO_LARGE, "a file is at most %u MiB", SESSION_FILE_MAX >> 20);
	s = session_take(ss, id, err);
	if (!s)
		return -1;
	r = run_session_put(&s->vm, path, data, len, SPEC_DEFAULT_MODE, err);
	session_put(ss, s, 0);
	return r;
}

/* Run argv in the session and return its stdout decoded from base64 (the
 * command pipes through base64, so any bytes survive the text result). */
static int exec_base64(struct sessions *ss, const char *id, json_t *argv, unsigned char **data, size_t *len,
		       struct kiln_err *err)
{
	json_t *req = json_pack("{s:o}", "argv", argv), *res;
	const char *out, *errs;
	size_t n;
	int got;

	res = session_exec(ss, id, req, NULL, NULL, err);
	json_decref(req);
	if (!res)
		return -1;
	if (json_integer_value(json_object_get(res, "exit_code")) != 0 || !json_is_integer(json_object_get(res, "exit_code"))) {
		errs = json_string_value(json_object_get(res, "stderr")) ?: "";
		if (strstr(errs, "No such file") || strstr(errs, "Not a directory"))
			kiln_err_set(err, KERR_NOT_FOUND, "%.300s", errs);
		else
			kiln_err_set(err, KERR_INVALID_REQUEST, "%.300s", *errs ? errs : "the guest could not read it");
		json_decref(res);
		return -1;
	}
	if (json_is_true(json_object_get(res, "stdout_truncated"))) {
		json_decref(res);
		return kiln_err_set(err, KERR_TOO_LARGE, "larger than the session's output limit allows");
	}
	out = json_string_value(json_object_get(res, "stdout")) ?: "";
	n = strlen(out);
	*data = malloc(n / 4 * 3 + 4);
	if (!*data) {
		json_decref(res);
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	got = n ? EVP_DecodeBlock(*data, (const unsigned char *)out, (int)n) : 0;
	if (got < 0 || n % 4) {
		free(*data);
		*data = NULL;
		json_decref(res);
		return kiln_err_set(err, KERR_VM_ERROR, "the guest's base64 did not decode");
	}
	/* EVP_DecodeBlock counts padding as data. */
	if (n >= 1 && out[n - 1] == '=')
		got--;
	if (n >= 2 && out[n - 2] == '=')
		got--;
	*len = (size_t)got;
	json_decref(res);
	return 0;
}

int session_get_file(struct sessions *ss, const char *id, const char *path, unsigned char **data, size_t *len,
		     struct kiln_err *err)
{
	if (!path || proto_abspath_ok(path))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "path: expected an absolute path without '.', '..' or empty parts");
	/* As the task's user: what the session's code could read, nothing more. */
	return exec_base64(ss, id, json_pack("[s, s, s, s]", "/usr/bin/base64", "-w0", "--", path), data, len, err);
}

json_t *session_list_dir(struct sessions *ss, const char *id, const char *dir, struct kiln_err *err)
{
	unsigned char *raw = NULL;
	size_t len = 0, i = 0;
	json_t *entries;

	if (!dir || proto_abspath_ok(dir)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "dir: expected an absolute path without '.', '..' or empty parts");
		return NULL;
	}
	/* Type, size and name of each entry, NUL-terminated (a name may hold
	 * anything but NUL and '/'), as the task's user. */
	if (exec_base64(ss, id,
			json_pack("[s, s, s, s, s]", "/bin/sh", "-c",
				  "cd -- \"$1\" 2>/dev/null || { echo \"$1: No such file or directory\" >&2; exit 1; }; "
				  "find . -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%P\\0' | base64 -w0",
				  "sh", dir),
			&raw, &len, err) < 0)
		return NULL;
	entries = json_array();
	while (i < len) {
		char *e = (char *)raw + i, *t1, *t2;
		size_t n = strnlen(e, len - i);

		if (i + n >= len)
			break; /* no NUL: not an entry find wrote */
		i += n + 1;
		t1 = strchr(e, '\t');
		t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
		if (!t1 || !t2)
			continue;
		*t1 = *t2 = 0;
		json_array_append_new(entries,
				      json_pack("{s:s, s:s, s:I}", "name", t2 + 1, "type",
						e[0] == 'f' ? "file" : e[0] == 'd' ? "dir" : e[0] == 'l' ? "link" : "other",
						"size", (json_int_t)strtoll(t1 + 1, NULL, 10)));
	}
	free(raw);
	return json_pack("{s:o}", "entries", entries);
}

int session_get_tar(struct sessions *ss, const char *id, const char *dir, unsigned char **data, size_t *len,
		    struct kiln_err *err)
{
	if (!dir || proto_abspath_ok(dir))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "dir: expected an absolute path without '.', '..' or empty parts");
	/* As the task's user, paths relative to dir ("./..."); GNU tar keeps
	 * symlinks as links and reports what it cannot read (exit 2). */
	return exec_base64(ss, id,
			   json_pack("[s, s, s, s, s]", "/bin/bash", "-c",
				     "cd -- \"$1\" 2>/dev/null || { echo \"$1: No such file or directory\" >&2; exit 1; }; "
				     "set -o pipefail; tar -cf - --one-file-system . | base64 -w0",
				     "sh", dir),
			   data, len, err);
}

int session_put_tar(struct sessions *ss, const char *id, const char *dir, const void *data, size_t len,
		    struct kiln_err *err)
{
	unsigned char rnd[8];
	char tmp[64];
	json_t *req, *res;
	struct session *s;
	int r = -1, gone = 0;

	if (!dir || proto_abspath_ok(dir) || !strncmp(dir, SPEC_RESERVED_DIR "/", sizeof(SPEC_RESERVED_DIR)) ||
	    !strcmp(dir, SPEC_RESERVED_DIR))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "dir: expected an absolute path without '.', '..' or empty parts, outside /kiln");
	if (len > SESSION_FILE_MAX)
		return kiln_err_set(err, KERR_TOO_LARGE, "a tar archive is at most %u MiB", SESSION_FILE_MAX >> 20);
	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
		return kiln_err_set(err, KERR_HOST_ERROR, "getrandom: %s", strerror(errno));
	/* /tmp, not /kiln: the archive may be larger than /kiln's 16 MiB. */
	snprintf(tmp, sizeof(tmp), "/tmp/.kiln-put-%02x%02x%02x%02x%02x%02x%02x%02x.tar", rnd[0], rnd[1], rnd[2], rnd[3],
		 rnd[4], rnd[5], rnd[6], rnd[7]);
	/* Unpacked as the task's user, so it makes only what the session's
	 * own code could; files belong to that user, modes as archived (less
	 * the umask). The archive goes whatever tar made of it. */
	req = json_pack("{s:[s, s, s, s, s, s]}", "argv", "/bin/sh", "-c",
			"mkdir -p -- \"$1\" && tar -C \"$1\" -xf \"$2\" --no-same-owner; rc=$?; rm -f -- \"$2\"; exit $rc",
			"sh", dir, tmp);
	if (!req)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	/* Written and unpacked in one operation: no other request can take the
	 * session in between and leave the archive behind in the guest. */
	s = session_take(ss, id, err);
	if (!s) {
		json_decref(req);
		return -1;
	}
	if (s->state != SS_RUNNING) {
		kiln_err_set(err, KERR_BUSY, "session %s is being paused", id);
	} else if (run_session_put(&s->vm, tmp, data, len, 0600, err) < 0) {
		/* A part may have been written (the guest's /tmp filled up):
		 * remove it, in the same operation. */
		json_t *rm = json_pack("{s:[s, s, s]}", "argv", "/bin/rm", "-f", tmp);
		struct kiln_err ignore = { .code = "" };

		if (rm)
			json_decref(exec_held(ss, s, rm, NULL, NULL, &gone, &ignore));
		json_decref(rm);
	} else if ((res = exec_held(ss, s, req, NULL, NULL, &gone, err))) {
		if (json_integer_value(json_object_get(res, "exit_code")) == 0 &&
		    json_is_integer(json_object_get(res, "exit_code")))
			r = 0;
		else
			kiln_err_set(err, KERR_INVALID_REQUEST, "the archive did not unpack: %.300s",
				     json_string_value(json_object_get(res, "stderr")) ?: "tar failed");
		json_decref(res);
	}
	session_put(ss, s, gone);
	json_decref(req);
	return r;
}

/* ---- pause and resume --------------------------------------------------- */

static const char *const snap_files[] = { "state", "disk.qcow2" };

static void s3_key_of(char *out, size_t cap, const char *customer, const char *id, const char *name)
{
	snprintf(out, cap, "%s/sessions/%s/%s", customer, id, name);
}

/* Upload the saved files, then the manifest that makes them a snapshot. */
static int pause_upload(struct sessions *ss, struct session *s, uint64_t *bytes, struct kiln_err *err)
{
	struct hostd_s3 s3;
	json_t *m, *files = json_object();
	char key[512], path[PATH_MAX + 32];
	char *text;
	int r = -1;

	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	*bytes = 0;
	if (s3_ensure_bucket(&s3.c, err) < 0)
		goto out;
	for (size_t i = 0; i < sizeof(snap_files) / sizeof(*snap_files); i++) {
		char sha[65];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", s->dir, snap_files[i]);
		s3_key_of(key, sizeof(key), s->customer, s->id, snap_files[i]);
		if (stat(path, &st) < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", path, strerror(errno));
			goto out;
		}
		if (s3_put_file(&s3.c, key, path, "application/octet-stream", sha, NULL, err) < 0)
			goto out;
		json_object_set_new(files, snap_files[i], json_pack("{s:I, s:s}", "size", (json_int_t)st.st_size, "sha256", sha));
		*bytes += (uint64_t)st.st_size;
	}
	m = json_pack("{s:i, s:s, s:s, s:s, s:b, s:i, s:i, s:O, s:s, s:O, s:I, s:s}", "version", SESSION_MANIFEST_V, "id",
		      s->id, "customer", s->customer, "template", s->snap->key, "net", s->snap->net, "memory_mib",
		      (int)s->memory_mib, "vcpus", (int)s->vcpus, "spec", s->spec, "guest_kernel", s->release, "files",
		      files, "paused_ms", (json_int_t)wall_ms(), "host_id", ss->host_id);
	text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	s3_key_of(key, sizeof(key), s->customer, s->id, "manifest.json");
	if (!text) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	r = s3_put_buffer(&s3.c, key, text, strlen(text), "application/json", err);
	free(text);
out:
	json_decref(files);
	hostd_s3_free(&s3);
	return r;
}

json_t *session_pause(struct sessions *ss, const char *id, struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	int64_t t0 = proto_now_ms();
	uint64_t bytes = 0;
	struct hostd_s3 s3;
	char prefix[512];
	json_t *out;

	if (!s)
		return NULL;
	if (s->state == SS_RUNNING) {
		int fd = open(s->state_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		int r;

		if (fd < 0) {
			kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
			session_put(ss, s, 0);
			return NULL;
		}
		r = snapshot_save_fd(&s->vm, fd, SESSION_SAVE_MS, err);
		if (r == 0 && (fsync(fd) < 0 || close(fd) < 0)) {
			fd = -1;
			r = kiln_err_set(err, KERR_HOST_ERROR, "writing %s: %s", s->state_path, strerror(errno));
		} else if (fd >= 0 && r < 0) {
			close(fd);
		}
		if (r < 0) {
			/* QEMU may have stopped the guest: it cannot be trusted to go on. */
			fprintf(stderr, "kiln-host: session %s: pause failed (%s); the session ends\n", id, err->message);
			session_teardown(ss, s);
			session_put(ss, s, 1);
			return NULL;
		}
		/* Saved: the VM and its network go now; the files stay until S3
		 * has them. */
		vm_destroy(&s->vm);
		if (s->net) {
			net_sandbox_stop(s->net, NULL);
			s->net = NULL;
		}
		hostd_release(ss->d, s->vcpus, s->memory_mib);
		s->vcpus = 0;
		s->state = SS_PAUSING;
	}
	if (pause_upload(ss, s, &bytes, err) < 0) {
		char m[sizeof(err->message)];

		snprintf(m, sizeof(m), "%s", err->message);
		kiln_err_set(err, kiln_err_is_s3(err->errc) ? KERR_S3_UNAVAILABLE : err->errc,
			     "the session is saved on this host but not yet in S3 (pause again to retry): %s", m);
		session_put(ss, s, 0);
		return NULL;
	}
	snprintf(prefix, sizeof(prefix), "%s/sessions/%s/", s->customer, s->id);
	out = json_pack("{s:s, s:s, s:{s:s, s:s, s:I, s:I}}", "id", s->id, "state", "paused", "snapshot", "bucket",
			hostd_s3_take(ss->d, &s3) == 0 ? s3.c.bucket : "", "prefix", prefix, "bytes", (json_int_t)bytes,
			"pause_ms", (json_int_t)(proto_now_ms() - t0));
	hostd_s3_free(&s3);
	session_teardown(ss, s);
	session_put(ss, s, 1);
	return out;
}

/* Check a downloaded file against the manifest's size and sha256. */
static int check_file(const char *path, json_t *want, const char *name, struct kiln_err *err)
{
	char sha[65];
	struct stat st;
	const char *ws = json_string_value(json_object_get(want, "sha256"));

	if (!ws || !json_is_integer(json_object_get(want, "size")))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest does not describe %s", name);
	if (stat(path, &st) < 0 || (json_int_t)st.st_size != json_integer_value(json_object_get(want, "size")))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: size differs from the manifest (S3 copy damaged)", name);
	if (fs_sha256_file(path, sha) < 0 || strcmp(sha, ws))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: sha256 differs from the manifest (S3 copy damaged)", name);
	return 0;
}

int session_resume(struct sessions *ss, const char *id, const char *customer, json_t **out, struct kiln_err *err)
{
	const struct run_opts *ro = hostd_run_opts(ss->d);
	struct hostd_s3 s3;
	struct task_spec ts = { 0 };
	const struct snapshot *snap;
	struct session *s = NULL;
	json_t *m = NULL, *files;
	json_error_t je;
	char key[512], path[PATH_MAX + 32];
	int fd = -1, r = -1, have_ts = 0, reserved = 0;

	*out = NULL;
	if (!spool_id_ok(id) || !spool_id_ok(customer))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "id and customer: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (hostd_s3_take(ss->d, &s3) < 0)
		return kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
	s = session_new(ss, id, customer, NULL, &(struct task_spec){ .memory_mib = 0 }, &(struct snapshot){ .mem_fd = -1 },
			err);
	if (!s)
		goto out_s3;
	pthread_mutex_lock(&s->op);
	s->refs = 1;
	if (session_insert(ss, s, err) < 0) {
		pthread_mutex_unlock(&s->op);
		session_free(s);
		s = NULL;
		goto out_s3;
	}
	if (mkdir(s->dir, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", s->dir, strerror(errno));
		goto fail;
	}
	/* The manifest first: without it there is no paused session. */
	snprintf(path, sizeof(path), "%s/manifest.json", s->dir);
	s3_key_of(key, sizeof(key), customer, id, "manifest.json");
	if (s3_get_file(&s3.c, key, path, err) < 0) {
		if (err->errc == KERR_S3_NOT_FOUND)
			kiln_err_set(err, KERR_NO_SNAPSHOT, "no paused session %s", id);
		goto fail;
	}
	m = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!m || json_integer_value(json_object_get(m, "version")) != SESSION_MANIFEST_V ||
	    strcmp(json_string_value(json_object_get(m, "customer")) ?: "", customer) ||
	    strcmp(json_string_value(json_object_get(m, "id")) ?: "", id) || !json_is_object(json_object_get(m, "spec"))) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest is unreadable or not this session's");
		goto fail;
	}
	if (parse_session_spec(json_object_get(m, "spec"), &ts, err) < 0) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's spec is invalid");
		goto fail;
	}
	have_ts = 1;
	snap = template_for(ro, &ts, err);
	if (!snap)
		goto fail;
	if (strcmp(json_string_value(json_object_get(m, "template")) ?: "", snap->key)) {
		kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
			     "the session was paused on a host with another image (template %.20s, this host's %s)",
			     json_string_value(json_object_get(m, "template")) ?: "?", snap->key);
		goto fail;
	}
	if (hostd_reserve(ss->d, ts.vcpus, ts.memory_mib, err) < 0)
		goto fail;
	reserved = 1;
	/* The real values, now that they are known. */
	json_decref(s->spec);
	s->spec = json_deep_copy(json_object_get(m, "spec"));
	s->snap = snap;
	s->vcpus = ts.vcpus;
	s->memory_mib = ts.memory_mib;
	s->output_mib = ts.output_mib;
	snprintf(s->release, sizeof(s->release), "%s", snap->release);
	files = json_object_get(m, "files");
	for (size_t i = 0; i < sizeof(snap_files) / sizeof(*snap_files); i++) {
		snprintf(path, sizeof(path), "%s/%s", s->dir, snap_files[i]);
		s3_key_of(key, sizeof(key), customer, id, snap_files[i]);
		if (s3_get_file(&s3.c, key, path, err) < 0) {
			if (err->errc == KERR_S3_NOT_FOUND)
				kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s is missing from the paused session in S3", snap_files[i]);
			goto fail;
		}
		if (check_file(path, json_object_get(files, snap_files[i]), snap_files[i], err) < 0)
			goto fail;
	}
	/* Point the overlay at this host's copy of the template (same key: the
	 * same bytes); -u: only the header changes. qemu-img runs as root and
	 * the header came from S3 (written by a jailed QEMU): it must be a plain
	 * overlay of this template first, nothing that makes qemu-img open
	 * another host file (an external data file) or parse more than that. */
	if (qcow2_file_check(s->disk, snap->disk, err) < 0)
		goto fail;
	{
		char *argv[] = { "/usr/bin/qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-F", "qcow2", "-b",
				 (char *)snap->disk, s->disk, NULL };

		if (snapshot_run_cmd(argv) < 0) {
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's disk layer is not a usable qcow2 image");
			goto fail;
		}
	}
	fd = open(s->state_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "%s: %s", s->state_path, strerror(errno));
		goto fail;
	}
	if (session_boot(ss, s, &ts, fd, 1, err) < 0)
		goto fail;
	close(fd);
	fd = -1;
	unlink(s->state_path); /* the RAM is in the VM now */
	*out = session_json(ss, s);
	session_put(ss, s, 0);
	r = 0;
	goto out;
fail:
	if (fd >= 0)
		close(fd);
	if (!reserved)
		s->vcpus = 0; /* nothing to give back */
	session_teardown(ss, s);
	session_put(ss, s, 1);
out:
	if (have_ts)
		spec_free(&ts);
	json_decref(m);
out_s3:
	hostd_s3_free(&s3);
	return r;
}

char *session_output_key(const char *customer, const char *id, const char *rel, struct kiln_err *err)
{
	char *key = NULL;

	/* The guest names its files: the key is built whole, never cut short
	 * (where two long names would meet), and checked as S3 needs it. */
	if (asprintf(&key, "%s/sessions/%s/outputs/%s", customer, id, rel) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	if (s3_key_check(key, err) < 0) {
		free(key);
		return NULL;
	}
	return key;
}

json_t *session_outputs(struct sessions *ss, const char *id, struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	struct hostd_s3 s3 = { 0 };
	char dir[PATH_MAX + 16];
	json_t *outs, *o;
	size_t i;
	int truncated = 0;

	if (!s)
		return NULL;
	snprintf(dir, sizeof(dir), "%s/outputs", s->dir);
	fs_rmtree(dir);
	outs = run_session_collect(&s->vm, dir, (uint64_t)s->output_mib << 20, hostd_run_opts(ss->d), &truncated, err);
	if (outs && hostd_s3_take(ss->d, &s3) < 0) {
		kiln_err_set(err, KERR_NO_S3, "this host has no S3 configured");
		json_decref(outs);
		outs = NULL;
	}
	json_array_foreach(outs, i, o) {
		char *key = NULL, path[PATH_MAX * 2];
		const char *rel = json_string_value(json_object_get(o, "path"));

		if (json_object_get(o, "skipped")) /* collect left it out (its name) */
			continue;
		if (!rel || !(key = session_output_key(s->customer, s->id, rel, err))) {
			json_object_set_new(o, "skipped", json_string(rel ? err->message : "no path"));
			json_object_set_new(o, "s3_key", json_null());
			continue;
		}
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, rel) >= sizeof(path)) {
			json_object_set_new(o, "skipped", json_string("the path is too long for this host"));
			json_object_set_new(o, "s3_key", json_null());
			free(key);
			continue;
		}
		if (s3_put_file(&s3.c, key, path, "application/octet-stream", NULL, NULL, err) < 0) {
			free(key);
			json_decref(outs);
			outs = NULL;
			break;
		}
		json_object_set_new(o, "s3_key", json_string(key));
		free(key);
	}
	hostd_s3_free(&s3);
	fs_rmtree(dir);
	session_put(ss, s, 0);
	return outs ? json_pack("{s:o, s:b}", "outputs", outs, "truncated", truncated) : NULL;
}

int session_delete(struct sessions *ss, const char *id, const char *customer, int keep_snapshot,
		   struct kiln_err *err)
{
	struct session *s = session_take(ss, id, err);
	struct hostd_s3 s3;
	char cust[65] = "";
	int found = s != NULL;

	if (!s && err->errc != KERR_NOT_FOUND)
		return -1; /* busy */
	if (s) {
		snprintf(cust, sizeof(cust), "%s", s->customer);
		session_teardown(ss, s);
		session_put(ss, s, 1);
	} else if (customer && spool_id_ok(customer) && !keep_snapshot) {
		snprintf(cust, sizeof(cust), "%s", customer);
	}
	if (keep_snapshot)
		return found ? 0 : -1;
	/* Its paused snapshot goes too: a destroyed session leaves nothing. */
	if (cust[0] && spool_id_ok(id) && hostd_s3_take(ss->d, &s3) == 0) {
		static const char *const all[] = { "manifest.json", "state", "disk.qcow2" };
		char key[512];

		for (size_t i = 0; i < sizeof(all) / sizeof(*all); i++) {
			struct kiln_err e2;

			s3_key_of(key, sizeof(key), cust, id, all[i]);
			if (s3_delete(&s3.c, key, &e2) < 0)
				fprintf(stderr, "kiln-host: session %s: deleting %s: %s\n", id, key, e2.message);
		}
		hostd_s3_free(&s3);
	}
	if (!found && !cust[0])
		return -1; /* err: not_found */
	return 0;
}
