/* pause_cache: the chunks of a session's latest pause, kept on this host's
 * disk as they went to S3, so that resuming it here reads them locally
 * instead of fetching them (each still checked against the manifest's
 * SHA-256, which comes from S3: a missing or damaged file is fetched from
 * S3 instead). Layout: <spool>/pause-cache/<customer>/<session>/<sha256>,
 * files 0600 in directories 0700. A session's files go when it resumes
 * here, when it is deleted here, when its next pause starts, and when they
 * are older than the configured age or over the byte budget (least
 * recently written sessions first). Customer memory at rest on the host:
 * see docs/threat-model.md. */
#ifndef KILN_PAUSE_CACHE_H
#define KILN_PAUSE_CACHE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

struct pause_cache {
	char root[PATH_MAX];  /* "" when off */
	uint64_t budget;      /* bytes */
	int64_t max_age_ms;
};

/* Set pc up under spool_dir (creating its root): budget_mib 0 turns it off
 * (and removes what an earlier run left). Then prunes by age and budget.
 * 0, or -1 with errno (pc is off then). */
int pcache_init(struct pause_cache *pc, const char *spool_dir, unsigned budget_mib, unsigned max_age_s);

/* The session's directory into out ("" when the cache is off or the ids
 * make no path); with create, made (and emptied of an older pause's files
 * first). 0, or -1 (no directory: the caller does without). */
int pcache_dir(const struct pause_cache *pc, const char *customer, const char *id, int create, char *out,
	       size_t cap);

/* Remove the session's files. */
void pcache_drop(const struct pause_cache *pc, const char *customer, const char *id);

/* Remove files older than the age limit, then whole sessions, least
 * recently written first, until the rest fit the budget. keep_customer/
 * keep_id (may be NULL) is never removed for the budget. */
void pcache_prune(const struct pause_cache *pc, const char *keep_customer, const char *keep_id);

#endif
