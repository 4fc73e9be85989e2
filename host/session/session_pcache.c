/* session_pcache: the session table's side of the pause cache
 * (pause_cache.h): setting it up, the sweep on the janitor's timer that
 * removes the copies of sessions whose pause no longer is the one in S3
 * (destroyed through another host or while this one was away, or paused
 * again elsewhere), and the clean-up kiln-api sends when a session resumes
 * on another host. */
#include "session_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3.h"
#include "task/task.h"

struct sweep {
	struct session_table *ss;
	const struct s3_config *c;
};

/* Whether the table holds the session in any state (running, pausing, being
 * resumed): its cache directory is in use then. */
static int held_here(struct session_table *ss, const char *id)
{
	int found = 0;

	pthread_mutex_lock(&ss->lock);
	for (struct session *s = ss->list; s && !found; s = s->next)
		found = !strcmp(s->id, id);
	pthread_mutex_unlock(&ss->lock);
	return found;
}

/* pcache_sweep's question, on S3's word only: gone when there is no
 * manifest (destroyed), or when another host wrote the one there (the
 * session resumed elsewhere and paused again: this host's copies are of an
 * older pause, whose key went with its manifest). An S3 that cannot be
 * reached, or a manifest that names no host (from before host_id), keeps
 * the files (age and budget still bound them). A session held here is
 * kept: a pause writes its manifest last, so one in its first pause has
 * none yet, and one pausing here again still has another host's. */
static int sweep_gone(void *ctx, const char *customer, const char *id)
{
	struct sweep *w = ctx;
	char host[65];
	int r;

	if (!strncmp(id, "snapshot.", 9)) {
		/* A snapshot's copies: gone with its manifest. */
		char key[512], *text = NULL;
		struct kiln_err e = { .code = "" };

		snprintf(key, sizeof(key), "%s/snapshots/%s/manifest.json", customer, id + 9);
		if (session_get_small(w->c, key, &text, &e) >= 0) {
			free(text);
			return 0;
		}
		return e.errc == KERR_S3_NOT_FOUND;
	}
	if (held_here(w->ss, id))
		return 0;
	r = session_pause_manifest_host(w->c, customer, id, host);
	return r == 0 || (r == 1 && host[0] && strcmp(host, w->ss->host_id));
}

/* The janitor hook (hostd_set_janitor_hook): on an upload thread, no lock. */
static void sweep_run(void *ctx)
{
	struct session_table *ss = ctx;
	struct hostd_s3 s3;
	struct sweep w = { .ss = ss };
	int n;

	fork_base_drop(NULL, NULL); /* forks' RAM copies past their time */
	if (hostd_s3_take(ss->d, &s3) < 0) {
		pcache_prune(&ss->pcache, NULL, NULL);
		return;
	}
	w.c = &s3.c;
	n = pcache_sweep(&ss->pcache, sweep_gone, &w);
	if (n > 0)
		fprintf(stderr, "kiln-host: pause cache: removed the copies of %d session%s whose pause is no longer the one in S3\n",
			n, n == 1 ? "" : "s");
	hostd_s3_free(&s3);
}

int sessions_set_pause_cache(struct session_table *ss, const char *spool_dir, unsigned budget_mib,
			     unsigned max_age_s, unsigned sweep_s)
{
	if (pcache_init(&ss->pcache, spool_dir, budget_mib, max_age_s) < 0)
		return -1;
	if (ss->pcache.root[0]) {
		hostd_set_janitor_hook(ss->d, sweep_run, ss, (sweep_s ? sweep_s : 60) * 1000u);
		ss->pcache_hooked = 1;
	}
	return 0;
}

void session_pcache_close(struct session_table *ss)
{
	/* Waits for a sweep in flight: it uses ss. */
	if (ss->pcache_hooked)
		hostd_set_janitor_hook(ss->d, NULL, NULL, 0);
	ss->pcache_hooked = 0;
}

int sessions_pcache_drop(struct session_table *ss, const char *id, const char *customer, struct kiln_err *err)
{
	char dir[PATH_MAX];

	if (!id || !customer || !spool_id_ok(id) || !spool_id_ok(customer))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "a session id and ?customer= are required");
	if (pcache_dir(&ss->pcache, customer, id, 0, dir, sizeof(dir)) < 0)
		return 0;
	pcache_drop(&ss->pcache, customer, id);
	return 1;
}
