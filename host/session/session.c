/* session: kiln-host's long-lived sandboxes (see session.h): the session
 * table, the launcher thread that starts their VMs, create and delete.
 * Commands and files are in session_io.c, pause and resume in
 * session_pause.c; what they share is in session_int.h.
 *
 * A session VM is a snapshot clone like a task's, with two differences: its
 * disk layer is a qcow2 overlay of its own in <spool>/sessions/<id>/ (not
 * QEMU's throw-away snapshot=on file), so that it can be saved; and its
 * commands run with PROTO_EXEC_KEEP, so processes they start survive them. */
#include "session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "proto.h"
#include "task/task.h"

#define SESSION_LOAD_MS    300000
#define SESSION_SETUP_MS   10000
#define SESSION_MAX_ENV    256

static void *launcher_main(void *arg)
{
	struct session_table *ss = arg;

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
static int launch_vm(struct session_table *ss, const struct vm_config *cfg, struct vm *vm, struct kiln_err *err)
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

struct session_table *sessions_open(struct hostd *d, const char *host_id, const char *spool_dir, struct kiln_err *err)
{
	struct session_table *ss = calloc(1, sizeof(*ss));

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
	pthread_cond_init(&ss->ckpt_cond, NULL);
	ss->prepare_base = 1;
	if (!(ss->bases = base_book_new())) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		free(ss);
		return NULL;
	}
	if (pthread_create(&ss->launcher, NULL, launcher_main, ss) != 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot start the session launcher thread");
		base_book_unref(ss->bases);
		free(ss);
		return NULL;
	}
	ss->pre.enabled = 1;
	if (session_prestart_open(ss, err) < 0) {
		sessions_close(ss);
		return NULL;
	}
	/* Sessions of an earlier process died with it (their VMs were its
	 * children); paused ones are in S3, not here. What their guests wrote
	 * to read-write volumes (and synced: it is in the slot files) goes to
	 * S3 first. */
	sessions_vols_recover(ss);
	fs_rmtree(ss->root);
	if (fs_mkdir_p(ss->root, 0700) < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", ss->root, strerror(errno));
		sessions_close(ss);
		return NULL;
	}
	return ss;
}

void session_teardown(struct session_table *ss, struct session *s)
{
	/* E2B's words for it (its SDK tells the user the same thing). */
	session_envd_close(ss, s, "the sandbox was killed or reached its end of life");
	fork_child_cancel(s); /* a destroyed child's prefix must stay empty */
	vm_destroy(&s->vm);
	session_vols_teardown(ss, s); /* before its directory goes */
	if (s->has_tu) {
		template_release(hostd_templates(ss->d), &s->tu);
		s->has_tu = 0;
	}
	if (s->net) {
		net_sandbox_stop(s->net, NULL);
		s->net = NULL;
	}
	session_reservation_release(ss, s);
	session_base_release(s);
	fork_base_put(s->fork);
	s->fork = NULL;
	phash_free(&s->layers); /* the VM whose pages it describes is gone */
	s->layers_ok = 0;
	fs_rmtree(s->dir);
}

void sessions_close(struct session_table *ss)
{
	if (!ss)
		return;
	session_base_prep_stop(ss);
	/* Forks' uploads first: they adopt their children's manifests. */
	pthread_mutex_lock(&ss->lock);
	while (ss->ckpt_jobs)
		pthread_cond_wait(&ss->ckpt_cond, &ss->lock);
	pthread_mutex_unlock(&ss->lock);
	session_pcache_close(ss);
	session_idler_stop(ss);
	pthread_mutex_lock(&ss->lock);
	while (ss->list) {
		struct session *s = ss->list;

		ss->list = s->next;
		pthread_mutex_unlock(&ss->lock);
		pthread_mutex_lock(&s->op);
		/* Shutting down: its read-write volumes are kept as at a destroy. */
		if (session_vols_keep(ss, s, &(struct kiln_err){ .code = "" }) < 0)
			fprintf(stderr, "kiln-host: session %s: its volumes could not be kept in S3 at shutdown\n", s->id);
		session_teardown(ss, s);
		pthread_mutex_unlock(&s->op);
		session_free(s);
		pthread_mutex_lock(&ss->lock);
	}
	ss->stopping = 1;
	pthread_cond_broadcast(&ss->launch_cond);
	pthread_mutex_unlock(&ss->lock);
	pthread_join(ss->launcher, NULL);
	session_prestart_close(ss);
	fork_base_drop_all();
	base_book_unref(ss->bases);
	free(ss);
}

json_t *session_json(const struct session_table *ss, const struct session *s)
{
	json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:i}", "id", s->id, "customer", s->customer, "state",
			 s->state == SS_RUNNING ? "running" : s->state == SS_PAUSING ? "pausing" : "destroyed", "host_id",
			 ss->host_id, "created_ms", (json_int_t)s->created_ms, "last_active_ms",
			 (json_int_t)s->last_active_ms, "vcpus", (int)s->vcpus, "memory_mib", (int)s->memory_mib);

	if (j && s->has_tu)
		json_object_set_new(j, "template", json_string(s->tu.name));
	if (j && json_is_array(json_object_get(s->spec, "volumes")))
		json_object_set(j, "volumes", json_object_get(s->spec, "volumes"));
	/* Its vCPUs are stopped while it is idle (session_idle.c). */
	if (j && s->state == SS_RUNNING)
		json_object_set_new(j, "idle_stopped", json_boolean(s->stopped));
	/* Its QEMU (an operator's look at one VM: /proc/PID/smaps_rollup), and
	 * whether it shares a fork's copy of its parent's RAM. */
	if (j && s->state == SS_RUNNING && s->vm.pid > 0)
		json_object_set_new(j, "vm_pid", json_integer(s->vm.pid));
	if (j && s->fork)
		json_object_set_new(j, "fork_shared", json_true());
	return j;
}

json_t *sessions_list(struct session_table *ss)
{
	json_t *a = json_array();

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		json_array_append_new(a, session_json(ss, s));
	pthread_mutex_unlock(&ss->lock);
	return json_pack("{s:o}", "sessions", a);
}

json_t *session_get(struct session_table *ss, const char *id)
{
	json_t *j = NULL;

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id))
			j = session_json(ss, s);
	pthread_mutex_unlock(&ss->lock);
	return j;
}

/* session_take, and with wake, continue the VM if the idler stopped it
 * (session_idle.c): every operation but destroying needs a running guest. */
static struct session *take(struct session_table *ss, const char *id, int wake, struct kiln_err *err)
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
	/* The idle stop decision holds wake (and op) for a moment: wait for
	 * it rather than answer "busy", then find the VM as it left it. */
	pthread_mutex_lock(&s->wake);
	if (pthread_mutex_trylock(&s->op) != 0) {
		pthread_mutex_unlock(&s->wake);
		session_unref(ss, s);
		kiln_err_set(err, KERR_BUSY, "session %s is busy with another request", id);
		return NULL;
	}
	if (s->state == SS_GONE) {
		pthread_mutex_unlock(&s->op);
		pthread_mutex_unlock(&s->wake);
		session_unref(ss, s);
		kiln_err_set(err, KERR_NOT_FOUND, "no session %s on this host", id);
		return NULL;
	}
	/* A VM that does not continue is broken: the operation finds out and
	 * reports it as for any VM that stopped answering. */
	if (wake && s->stopped) {
		struct kiln_err e2 = { .errc = KERR_NONE };

		session_wake_held(ss, s, &e2);
	}
	pthread_mutex_unlock(&s->wake);
	return s;
}

/* Take the session for one operation: found, referenced, its op lock held,
 * its VM running. NULL with err "not_found" or "busy". */
struct session *session_take(struct session_table *ss, const char *id, struct kiln_err *err)
{
	return take(ss, id, 1, err);
}

/* End an operation; with gone, the session also leaves the list and is
 * freed by whoever holds the last reference. */
void session_put(struct session_table *ss, struct session *s, int gone)
{
	int free_it;

	if (gone)
		s->state = SS_GONE;
	else
		s->last_active_ms = clock_wall_ms();
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
int session_parse_spec(json_t *spec, struct task_spec *out, struct kiln_err *err)
{
	const char *k;
	json_t *v, *j;
	char *text;
	int r;

	if (!json_is_object(spec))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "spec: expected an object");
	json_object_foreach(spec, k, v)
		if (strcmp(k, "limits") && strcmp(k, "network") && strcmp(k, "env") && strcmp(k, "volumes"))
			return kiln_err_set(err, KERR_INVALID_SPEC,
					    "%s: a session spec has only \"limits\", \"network\", \"env\" and \"volumes\"",
					    k);
	{
		struct vol_mount vols[VOL_SLOTS];
		size_t nvols;

		if (vol_spec_parse(json_object_get(spec, "volumes"), vols, &nvols, err) < 0)
			return -1;
	}
	/* env: the default of every envd process; a task's rules, and fewer. */
	if (json_object_size(json_object_get(spec, "env")) > SESSION_MAX_ENV)
		return kiln_err_set(err, KERR_INVALID_SPEC, "env: must have at most %d entries (got %zu)", SESSION_MAX_ENV,
				    json_object_size(json_object_get(spec, "env")));
	j = json_deep_copy(spec);
	json_object_del(j, "volumes"); /* not a task's */
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
const struct snapshot *session_template(const struct run_opts *ro, const struct task_spec *spec,
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

const struct snapshot *session_template_take(struct session_table *ss, const struct template_ref *ref,
					     const struct task_spec *spec, struct template_use *tu, int *has_tu,
					     struct kiln_err *err)
{
	struct template_store *st = hostd_templates(ss->d);
	struct run_opts ro = *hostd_run_opts(ss->d);
	const struct snapshot *snap;

	*has_tu = 0;
	if (st) {
		struct hostd_s3 s3;
		int have_s3 = hostd_s3_take(ss->d, &s3) == 0, r;

		r = template_acquire(st, ref, spec->egress, have_s3 ? &s3.c : NULL, tu, err);
		if (have_s3)
			hostd_s3_free(&s3);
		if (r < 0)
			return NULL;
		ro.snap = tu->snap;
		ro.net_snap = tu->net_snap;
		*has_tu = 1;
	} else if (ref && !(ref->builtin && !strcmp(ref->name, "default"))) {
		kiln_err_set(err, KERR_NO_TEMPLATE, "template %s: this host has no template store", ref->name);
		return NULL;
	}
	snap = session_template(&ro, spec, err);
	if (!snap && *has_tu) {
		template_release(st, tu);
		*has_tu = 0;
	}
	return snap;
}

struct session *session_new(struct session_table *ss, const char *id, const char *customer, json_t *spec,
			    const struct task_spec *ts, const struct snapshot *snap, struct kiln_err *err)
{
	struct session *s = calloc(1, sizeof(*s));

	if (!s) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		return NULL;
	}
	snprintf(s->id, sizeof(s->id), "%s", id);
	snprintf(s->customer, sizeof(s->customer), "%s", customer);
	s->vm.pid = s->vm.pidfd = s->vm.agent_fd = s->vm.qmp_fd = s->vm.envd_fd = s->vm.lock_fd = -1;
	s->spec = json_deep_copy(spec);
	s->memory_mib = ts->memory_mib;
	s->output_mib = ts->output_mib;
	s->snap = snap;
	snprintf(s->release, sizeof(s->release), "%s", snap->release);
	snprintf(s->dir, sizeof(s->dir), "%s/%s", ss->root, id);
	snprintf(s->disk, sizeof(s->disk), "%s/disk.qcow2", s->dir);
	snprintf(s->state_path, sizeof(s->state_path), "%s/state", s->dir);
	s->created_ms = s->last_active_ms = clock_wall_ms();
	s->input_wr = -1;
	s->base_fd = -1;
	pthread_mutex_init(&s->op, NULL);
	pthread_mutex_init(&s->wake, NULL);
	pthread_mutex_init(&s->adopt_mu, NULL);
	return s;
}

/* Register s, unless a session with its id is here already. */
int session_insert(struct session_table *ss, struct session *s, struct kiln_err *err)
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

/* The overlay that holds everything the session writes to its disk. */
static int make_overlay(const char *disk, const char *backing, struct kiln_err *err)
{
	char *argv[] = { "/usr/bin/qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", (char *)backing,
			 (char *)disk, NULL };

	if (snapshot_run_cmd(argv) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "qemu-img create %s failed", disk);
	return 0;
}

/* Start the session's VM: its network (if any), then QEMU on the overlay
 * s->disk (backed by the template's disk), loading state_fd (a template's
 * device state, or a paused session's whole state with mem_ram). */
int session_boot(struct session_table *ss, struct session *s, const struct task_spec *ts, int state_fd, int mem_ram,
		 struct kiln_err *err)
{
	const struct run_opts *ro = hostd_run_opts(ss->d);
	struct vm_config cfg = ro->vm;
	/* Not on a base fetched from S3: a VM started ahead would keep that
	 * RAM alive after its last session. */
	int can_pre = s->base_fd < 0 && !s->fork;

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
	cfg.vol_dir = s->dir; /* its volume slots: <dir>/vol<N>.img */
	if (session_vols_parse(s, err) < 0)
		return -1;
	if (mem_ram) {
		cfg.mem_ram = 1;
		cfg.mem_fd = 0;
		cfg.mem_file = NULL;
	} else {
		/* The snapshot's RAM, or the base fetched for a resumed session. */
		cfg.mem_fd = s->fork ? s->fork->mem_fd : s->base_fd >= 0 ? s->base_fd : s->snap->mem_fd;
		cfg.mem_file = s->snap->mem;
		cfg.mem_share = 0;
	}
	s->prestarted = 0;
	s->boot_ms[0] = proto_now_ms();
	{
		char pdisk[PATH_MAX + 16], pdir[PATH_MAX];
		int have_disk = access(s->disk, F_OK) == 0;

		if (can_pre && session_prestart_take(ss, &cfg, &s->vm, pdisk, sizeof(pdisk), pdir, sizeof(pdir)) == 0) {
			/* Its overlay becomes the session's: as it is for a new
			 * session, with the fetched disk layer copied in for a
			 * resumed one. */
			s->prestarted = 1;
			if ((have_disk && session_prestart_disk(s->disk, pdisk, err) < 0) ||
			    (rename(pdisk, s->disk) < 0 &&
			     kiln_err_set(err, KERR_HOST_ERROR, "cannot move %s: %s", pdisk, strerror(errno)) < 0)) {
				fs_rmtree(pdir); /* the VM goes with the session's teardown */
				return -1;
			}
			/* Its volume slots too (the inodes it holds open). */
			for (unsigned i = 0; i < VM_VOL_SLOTS; i++) {
				char from[PATH_MAX + 32], to[PATH_MAX + 32];

				vm_vol_path(from, sizeof(from), pdir, &s->vm, i);
				vm_vol_path(to, sizeof(to), s->dir, &s->vm, i);
				if (rename(from, to) < 0) {
					kiln_err_set(err, KERR_HOST_ERROR, "cannot move %s: %s", from, strerror(errno));
					fs_rmtree(pdir);
					return -1;
				}
			}
			fs_rmtree(pdir);
		} else if (!have_disk && make_overlay(s->disk, s->snap->disk, err) < 0) {
			return -1;
		} else if (launch_vm(ss, &cfg, &s->vm, err) < 0) {
			return -1;
		}
	}
	if (can_pre)
		session_prestart_want(ss, &cfg);
	s->boot_ms[0] = proto_now_ms() - s->boot_ms[0];
	if (s->booted)
		s->booted(s->booted_ctx, s);
	/* The volumes in their slots before the guest runs (it sees them as
	 * it left them: a resumed guest has them mounted already). */
	if (session_vols_fill(ss, s, err) < 0) {
		s->vol_failed = 1;
		return -1;
	}
	s->boot_ms[1] = proto_now_ms();
	if (snapshot_load_fd(&s->vm, state_fd, SESSION_LOAD_MS, err) < 0) {
		if (mem_ram)
			kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's state does not load: %s", err->message);
		return -1;
	}
	s->boot_ms[2] = proto_now_ms();
	s->boot_ms[1] = s->boot_ms[2] - s->boot_ms[1];
	if (vm_setup(&s->vm, proto_now_ms() + SESSION_SETUP_MS, err) < 0)
		return -1;
	s->boot_ms[2] = proto_now_ms() - s->boot_ms[2];
	session_envd_enable(ss, s);
	return 0;
}

/* The session's env (an E2B sandbox's envVars) as a file the guest's code
 * interpreter reads (/kiln/session-env.json, guest/interpreter.py): envd
 * gets it with every command, but a cell runs in a process started before
 * the snapshot. Written once at create (a resumed session has it on its
 * disk); nothing when there is no env. */
static int session_env_file(struct session *s, struct kiln_err *err)
{
	json_t *env = json_object_get(s->spec, "env");
	struct proto_file m = { .mode = 0644 };
	int64_t deadline = proto_now_ms() + 10000;
	uint8_t *buf;
	char *text;
	ssize_t n;
	int r = -1;

	if (!json_is_object(env) || !json_object_size(env))
		return 0;
	text = json_dumps(env, JSON_COMPACT);
	buf = malloc(PROTO_MAX_PAYLOAD);
	if (!text || !buf) {
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	m.size = strlen(text);
	snprintf(m.path, sizeof(m.path), "/kiln/session-env.json");
	n = proto_file_encode(buf, PROTO_MAX_PAYLOAD, &m);
	if (n < 0) {
		kiln_err_set(err, KERR_HOST_ERROR, "the session's env file header does not encode");
		goto out;
	}
	if (vm_send(&s->vm, PROTO_FILE, buf, (size_t)n, deadline, err) < 0)
		goto out;
	for (size_t off = 0; off < m.size; off += PROTO_MAX_PAYLOAD) {
		size_t len = m.size - off < PROTO_MAX_PAYLOAD ? m.size - off : PROTO_MAX_PAYLOAD;

		if (vm_send(&s->vm, PROTO_FILE_DATA, text + off, len, deadline, err) < 0)
			goto out;
	}
	r = vm_recv_ok(&s->vm, PROTO_FILE, deadline, "the session's env file", err);
out:
	free(buf);
	free(text);
	return r;
}

int session_create(struct session_table *ss, const char *id, const char *customer, json_t *spec,
		   const struct template_ref *ref, json_t **out, struct kiln_err *err)
{
	struct task_spec ts;
	const struct snapshot *snap;
	struct session *s;
	struct template_use tu;
	int fd, r, has_tu = 0;

	*out = NULL;
	if (!spool_id_ok(id) || !spool_id_ok(customer))
		return kiln_err_set(err, KERR_INVALID_REQUEST,
				    "id and customer: expected 1-64 characters of [A-Za-z0-9_.-], not starting with '.'");
	if (session_parse_spec(spec, &ts, err) < 0)
		return -1;
	snap = session_template_take(ss, ref, &ts, &tu, &has_tu, err);
	if (!snap || hostd_reserve_wait(ss->d, ts.vcpus, ts.memory_mib, session_admit_wait_ms(ss), err) < 0) {
		if (has_tu)
			template_release(hostd_templates(ss->d), &tu);
		spec_free(&ts);
		return -1;
	}
	s = session_new(ss, id, customer, spec, &ts, snap, err);
	if (!s) {
		if (has_tu)
			template_release(hostd_templates(ss->d), &tu);
		hostd_release(ss->d, ts.vcpus, ts.memory_mib);
		spec_free(&ts);
		return -1;
	}
	s->tu = tu;
	s->has_tu = has_tu;
	s->vcpus = ts.vcpus;
	pthread_mutex_lock(&s->op);
	s->refs = 1;
	if (session_insert(ss, s, err) < 0) {
		session_reservation_release(ss, s); /* never idle: not in the table yet */
		if (s->has_tu)
			template_release(hostd_templates(ss->d), &s->tu);
		pthread_mutex_unlock(&s->op);
		session_free(s);
		spec_free(&ts);
		return -1;
	}
	r = -1;
	fd = -1;
	if (mkdir(s->dir, 0700) < 0)
		kiln_err_set(err, KERR_HOST_ERROR, "cannot create %s: %s", s->dir, strerror(errno));
	else if ((fd = open(snap->state, O_RDONLY | O_CLOEXEC)) < 0)
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "%s: %s", snap->state, strerror(errno));
	else if (fd >= 0 && session_boot(ss, s, &ts, fd, 0, err) == 0 && session_env_file(s, err) == 0 &&
		 session_vols_mount(ss, s, err) == 0)
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
	s->vols_live = 1;
	/* Its snapshot is ready for sessions: its base goes to S3 now, off
	 * this request (nothing when that was done already). */
	session_base_prep_want(ss, snap);
	session_put(ss, s, 0);
	return 0;
}


/* ---- network ------------------------------------------------------------ */

json_t *session_network(struct session_table *ss, const char *id, json_t *network, struct kiln_err *err)
{
	/* The rules live in kiln-host's namespace, not in the guest: a VM
	 * the idler stopped need not be continued for them. */
	struct session *s = take(ss, id, 0, err);
	struct task_spec ts;
	json_t *spec, *out = NULL;

	if (!s)
		return NULL;
	if (s->state != SS_RUNNING) {
		kiln_err_set(err, KERR_NOT_RUNNING, "session %s is being paused", id);
		goto out;
	}
	if (!s->net) {
		kiln_err_set(err, KERR_NO_NETWORK,
			     "session %s has no network device (it was created with egress \"none\"): its egress rules "
			     "cannot be changed; create it with \"egress\":\"allow\" (\"allow\": [] reaches nothing) "
			     "to change them later", id);
		goto out;
	}
	if (!json_is_object(network)) {
		kiln_err_set(err, KERR_INVALID_REQUEST, "expected the network object {\"egress\":\"allow\",\"allow\":[...]}");
		goto out;
	}
	/* The whole spec as it would be, parsed as create parses it: the same
	 * rules, bounds and messages. */
	spec = json_is_object(s->spec) ? json_deep_copy(s->spec) : json_object();
	if (!spec || json_object_set(spec, "network", network) < 0) {
		json_decref(spec);
		kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
		goto out;
	}
	if (session_parse_spec(spec, &ts, err) < 0) {
		json_decref(spec);
		goto out;
	}
	if (!ts.egress) {
		kiln_err_set(err, KERR_INVALID_SPEC,
			     "network.egress: a session with a network device keeps egress \"allow\" (\"allow\": [] "
			     "reaches nothing)");
	} else if (net_sandbox_update(s->net, ts.net_rules, ts.nnet_rules, err) == 0) {
		/* What a pause writes to the manifest, and a resume (here or
		 * on another host) builds the network from. */
		json_decref(s->spec);
		s->spec = spec;
		spec = NULL;
		out = json_pack("{s:s, s:O}", "id", s->id, "network", network);
		if (!out)
			kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	}
	json_decref(spec);
	spec_free(&ts);
out:
	session_put(ss, s, 0);
	return out;
}

/* Whether session id (if here) has a read-write volume. */
static int has_rw_volume(struct session_table *ss, const char *id)
{
	int rw = 0;

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s; s = s->next)
		if (!strcmp(s->id, id))
			rw = session_vols_rw(s);
	pthread_mutex_unlock(&ss->lock);
	return rw;
}

int session_delete(struct session_table *ss, const char *id, const char *customer, int keep_snapshot,
		   struct kiln_err *err)
{
	/* A stopped VM is destroyed as it is: no need to continue it, unless
	 * it has a read-write volume (its guest syncs it first). */
	struct session *s = take(ss, id, has_rw_volume(ss, id), err);
	struct hostd_s3 s3;
	char cust[65] = "";
	int found = s != NULL;

	if (!s && err->errc != KERR_NOT_FOUND)
		return -1; /* busy */
	if (s && keep_snapshot)
		s->vols_done = 1; /* a stale copy: its volumes are not the truth */
	else if (s && session_vols_keep(ss, s, err) < 0) {
		session_put(ss, s, 0);
		return -1;
	}
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
	if (cust[0])
		pcache_drop(&ss->pcache, cust, id);
	if (cust[0] && spool_id_ok(id) && hostd_s3_take(ss->d, &s3) == 0) {
		session_pause_delete_s3(&s3.c, ss->root, cust, id);
		hostd_s3_free(&s3);
	}
	if (!found && !cust[0])
		return -1; /* err: not_found */
	return 0;
}
