/* templates_int.h: what the pieces of kiln-api's templates module share,
 * private to api/templates/templates.c (endpoints, OCI uploads, events streams),
 * api/templates/template_build.c (the builder, the clean-up) and api/templates/template_use.c
 * (resolution for tasks and sessions, heartbeats); templates.h is the
 * public interface. */
#ifndef KILN_API_TEMPLATES_INT_H
#define KILN_API_TEMPLATES_INT_H

#include <pthread.h>
#include <stdint.h>

#include "templates.h"

struct follower {
	char id[40];
	struct follower *next;
};

struct templates {
	const struct api_config *cfg;
	struct store *st;
	struct sched *sched;
	const struct host_ops *ops;
	const struct kiln_clock *clock;
	char *token;
	pthread_mutex_t lock;
	pthread_cond_t cond;         /* CLOCK_MONOTONIC: every change, the builder's wake-up */
	uint64_t gen;                /* bumped on every change (events streams wait for it) */
	int stopping, woken;
	pthread_t thread;
	int threaded;
	struct follower *followers;  /* builds followed by a thread of ours */
	unsigned nfollowers;
	int64_t last_gc;
	int bucket_ok;               /* the S3 bucket was made (or found) once */
};

/* A row changed: bump gen and wake events streams (template_build.c). */
void tpl_changed(struct templates *t);
/* tpl_changed, and the builder looks at the queue now. */
void tpl_wake(struct templates *t);
/* Whether templates_stop was called. */
int tpl_stopping(struct templates *t);
/* Wait up to ms on t->cond (or until stopping). */
void tpl_nap(struct templates *t, long ms);
/* The customer's quotas, or the defaults ("" or a customer gone). */
void tpl_customer_quota(struct store *st, const char *customer, struct quota *q);

#endif
