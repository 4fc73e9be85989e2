/* base_book: the bookkeeping behind a template's base RAM put in S3 ahead
 * of the first pause (session_base_prep.c does the work, session_s3.c's
 * session_base_ensure the upload): which snapshots were prepared or are
 * being prepared, the queue of one worker thread at a time, and a lock per
 * base (by its SHA-256) so that one thread of this process at a time
 * uploads a given base. No I/O; every call is thread-safe. Reference
 * counted, so that a worker still waiting on S3 at shutdown can be left to
 * end with the process without outliving what it uses. Unit-tested
 * (tests/unit/test_base_book.c). */
#ifndef KILN_BASE_BOOK_H
#define KILN_BASE_BOOK_H

#include <pthread.h>
#include <stdint.h>

/* A failed preparation (S3 down) is tried again, on the next request for
 * it, no sooner than this. */
#define BASE_BOOK_RETRY_MS 60000

/* What the worker queue holds: embedded first in the caller's job; drop
 * frees it (a job never run: the book is stopping, or closed). */
struct base_book_job {
	struct base_book_job *next;
	void (*drop)(struct base_book_job *j);
};

struct base_book;

/* A new book with one reference; NULL when out of memory. */
struct base_book *base_book_new(void);
void base_book_ref(struct base_book *b);
/* The last reference frees the book and drops the jobs still queued. */
void base_book_unref(struct base_book *b);

/* Claim the snapshot named id (its directory and RAM file identity) for a
 * preparation: 1 when the caller is to prepare it (it is marked busy until
 * base_book_done); 0 when there is nothing to do: being prepared, done, it
 * failed less than retry_ms ago, or the book is stopping. */
int base_book_claim(struct base_book *b, const char *id, int64_t now_ms, int64_t retry_ms);
/* The preparation of id ended (ok: its base is in S3). */
void base_book_done(struct base_book *b, const char *id, int ok, int64_t now_ms);

/* Queue j for the worker. 1: no worker runs, the caller must start one
 * (counted as running from now on; it takes jobs with base_book_pop); 0: the
 * running worker takes it; -1: stopping, j is not queued (the caller still
 * owns it). */
int base_book_push(struct base_book *b, struct base_book_job *j);
/* The worker's next job (owned by it), or NULL: nothing queued, or
 * stopping. After NULL the worker is counted gone and must not use b
 * again except to drop its reference. */
struct base_book_job *base_book_pop(struct base_book *b);
/* 1 once base_book_stop was called: a job under way gives up at its next
 * step. */
int base_book_stopping(struct base_book *b);
/* Stop: no job is queued or started any more; wait up to wait_ms for the
 * worker to end. 0: none runs; 1: one still runs (it holds its own
 * reference and ends with its S3 request, or with the process). */
int base_book_stop(struct base_book *b, int wait_ms);

/* The upload lock of the base sha: waits while another thread holds it,
 * then holds it until base_book_leave. */
void base_book_enter(struct base_book *b, const char *sha);
void base_book_leave(struct base_book *b, const char *sha);

#endif
