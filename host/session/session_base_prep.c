/* session_base_prep: a snapshot's base RAM put in S3 ahead of the first
 * pause. Once a snapshot is ready for sessions (the default template's at
 * start, any other on its first session here), one worker thread hashes its
 * RAM (snapshot_mem_sha256, cached beside it) and makes sure its base is
 * under .bases/<sha256>/ (session_base_ensure), off every request's path
 * and at low priority, so that the first pause finds it there with a HEAD
 * and uploads only its own chunks. A failure is only logged: the pause
 * makes sure of the base itself, as it always did. The worker owns copies
 * of what it uses (the S3 settings, the snapshot with a duplicate of its
 * RAM fd, a reference to the book), so that shutdown need not wait for S3. */
#include "session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "proto.h"
#include "task/task.h"

/* Below the VMs and the requests it must never delay (nice 10). */
#define BASE_PREP_NICE 10

struct prep_job {
	struct base_book_job j;  /* first: the book's queue holds it */
	char id[800];            /* the snapshot's directory and RAM file identity */
	struct snapshot snap;    /* a copy; mem_fd is our own duplicate */
	struct hostd_s3 s3;
};

static void prep_job_drop(struct base_book_job *j)
{
	struct prep_job *p = (struct prep_job *)j;

	if (p->snap.mem_fd >= 0)
		close(p->snap.mem_fd);
	hostd_s3_free(&p->s3);
	free(p);
}

/* Hash the snapshot's RAM and make sure its base is in S3; log how it went. */
static void prep_one(struct base_book *bk, struct prep_job *p)
{
	struct kiln_err err = { .code = "" };
	int64_t t0 = proto_now_ms();
	uint64_t bytes = 0;
	char sha[65];
	int r = -1;

	if (snapshot_mem_sha256(&p->snap, sha, &err) == 0)
		r = session_base_ensure(bk, &p->s3.c, p->snap.mem_fd, p->snap.mem_size, sha, p->snap.key, 1, &bytes,
					&err);
	if (r > 0)
		fprintf(stderr, "kiln-host: base %s in S3 (%llu bytes in %lld ms, ahead of any pause)\n", sha,
			(unsigned long long)bytes, (long long)(proto_now_ms() - t0));
	else if (r == 0)
		fprintf(stderr, "kiln-host: base %s already in S3 (checked in %lld ms, ahead of any pause)\n", sha,
			(long long)(proto_now_ms() - t0));
	else
		fprintf(stderr,
			"kiln-host: snapshot %s: its base RAM could not be put in S3 ahead of a pause (%s); its first "
			"pause will put it there\n",
			p->snap.key, err.message);
	base_book_done(bk, p->id, r >= 0, proto_now_ms());
}

static void *prep_worker(void *arg)
{
	struct base_book *bk = arg;
	struct base_book_job *j;

	/* This thread only (and the uploader threads it starts inherit it). */
	if (setpriority(PRIO_PROCESS, (id_t)gettid(), BASE_PREP_NICE) < 0)
		fprintf(stderr, "kiln-host: base preparation: cannot lower its priority: %s\n", strerror(errno));
	while ((j = base_book_pop(bk))) {
		prep_one(bk, (struct prep_job *)j);
		j->drop(j);
	}
	base_book_unref(bk);
	return NULL;
}

void session_base_prep_want(struct session_table *ss, const struct snapshot *snap)
{
	struct prep_job *p;
	pthread_attr_t a;
	pthread_t th;
	int r;

	if (!ss->prepare_base || !snap || snap->mem_fd < 0)
		return;
	if (!(p = calloc(1, sizeof(*p))))
		return;
	p->snap.mem_fd = -1;
	p->j.drop = prep_job_drop;
	/* Every session create comes here: the claim (a lookup) first. */
	snprintf(p->id, sizeof(p->id), "%s %llu %llu", snap->dir, (unsigned long long)snap->mem_ino,
		 (unsigned long long)snap->mem_mtime_ns);
	if (!base_book_claim(ss->bases, p->id, proto_now_ms(), BASE_BOOK_RETRY_MS)) {
		free(p);
		return;
	}
	/* No S3 (yet: SIGHUP may bring it): nothing to prepare for now. */
	if (hostd_s3_take(ss->d, &p->s3) < 0) {
		base_book_done(ss->bases, p->id, 0, proto_now_ms());
		free(p);
		return;
	}
	p->snap = *snap;
	p->snap.mem_fd = fcntl(snap->mem_fd, F_DUPFD_CLOEXEC, 0);
	if (p->snap.mem_fd < 0 || (r = base_book_push(ss->bases, &p->j)) < 0) {
		base_book_done(ss->bases, p->id, 0, proto_now_ms());
		prep_job_drop(&p->j);
		return;
	}
	if (r == 0)
		return; /* the worker that runs takes it */
	base_book_ref(ss->bases);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&th, &a, prep_worker, ss->bases) != 0) {
		struct base_book_job *j;

		fprintf(stderr, "kiln-host: base preparation: cannot start its thread (the first pause puts the base "
				"in S3)\n");
		while ((j = base_book_pop(ss->bases))) {
			base_book_done(ss->bases, ((struct prep_job *)j)->id, 0, proto_now_ms());
			j->drop(j);
		}
		base_book_unref(ss->bases);
	}
	pthread_attr_destroy(&a);
}

void sessions_set_prepare_base(struct session_table *ss, int on)
{
	ss->prepare_base = on;
}

void sessions_prepare_base(struct session_table *ss, const struct snapshot *snap)
{
	session_base_prep_want(ss, snap);
}

void session_base_prep_stop(struct session_table *ss)
{
	if (ss->bases && base_book_stop(ss->bases, BASE_PREP_STOP_MS))
		fprintf(stderr, "kiln-host: base preparation still waits on S3 after %d ms: left to end with the "
				"process (a base whose manifest is not written does not exist)\n",
			BASE_PREP_STOP_MS);
}
