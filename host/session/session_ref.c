/* session_ref: the end of a session record: the last reference dropped
 * (session_unref) frees it (session_free). Its own file so that what takes
 * and drops references (the idler, the envd side, the resume) needs nothing
 * of session.c, which calls them: no circle through the session room. */
#include "session_int.h"

#include <pthread.h>
#include <stdlib.h>

#include <jansson.h>

void session_free(struct session *s)
{
	session_base_release(s);
	fork_base_put(s->fork);
	phash_free(&s->layers);
	json_decref(s->spec);
	json_decref(s->vol_expect);
	free(s->samples);
	pthread_mutex_destroy(&s->op);
	pthread_mutex_destroy(&s->wake);
	pthread_mutex_destroy(&s->adopt_mu);
	free(s);
}

void session_unref(struct session_table *ss, struct session *s)
{
	int free_it;

	pthread_mutex_lock(&ss->lock);
	free_it = --s->refs == 0 && s->state == SS_GONE;
	pthread_mutex_unlock(&ss->lock);
	if (free_it)
		session_free(s);
}
