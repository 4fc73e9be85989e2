/* pause_cache: the chunks of a session's latest pause, kept on this host's
 * disk as they went to S3, so that resuming it here reads them locally
 * instead of fetching them (each still checked against the manifest's
 * SHA-256, which comes from S3: a missing or damaged file is fetched from
 * S3 instead). Layout: <spool>/pause-cache/<customer>/<session>/<name>
 * (name: an HMAC of the chunk's SHA-256 under the pause's key, pcache_put),
 * files 0600 in directories 0700. A session's files go when it resumes
 * here, when it is deleted here (kiln-api sends a destroy to the host that
 * paused it, and a clean-up there when it resumes elsewhere), when its
 * next pause starts, when they are older than the configured age or over
 * the byte budget (least recently written sessions first), and when a
 * periodic sweep finds the session's manifest gone from S3 or written by
 * another host.
 *
 * Each file is sealed (AES-256-GCM) with a random key made for that pause
 * and written only into its manifest in S3: without the manifest the files
 * are ciphertext, so a destroyed session (its manifest deleted first, from
 * any host) leaves nothing readable here even before its files go.
 * Customer memory at rest on the host: docs/architecture.md, threat model. */
#ifndef KILN_PAUSE_CACHE_H
#define KILN_PAUSE_CACHE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define PCACHE_KEY_LEN 32 /* AES-256 */

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

/* Asked of each session in the cache by pcache_sweep: 1 if its files must
 * go now (its pause no longer exists), 0 to keep them. */
typedef int (*pcache_gone_fn)(void *ctx, const char *customer, const char *id);

/* Remove every session whose files gone() says must go, then prune by age
 * and budget (pcache_prune, nothing kept). The number of sessions removed
 * by gone(). Blocking (gone may ask S3): not on a request thread. */
int pcache_sweep(const struct pause_cache *pc, pcache_gone_fn gone, void *ctx);

/* One pause's chunks in the cache: its session's directory and the key the
 * files are sealed with (the manifest's "cache_key"). */
struct pcache_seal {
	char dir[PATH_MAX];
	unsigned char key[PCACHE_KEY_LEN];
	/* A resume's: a chunk fetched from S3 (and checked) is kept here too,
	 * for the layers a later delta pause and resume reuse. */
	int keep;
};

/* A fresh random key for a pause. 0, or -1 (no randomness: keep nothing). */
int pcache_key_new(unsigned char key[PCACHE_KEY_LEN]);

/* Parse the manifest's 64 hex digits into key. 0, or -1 if malformed. */
int pcache_key_parse(const char *hex, unsigned char key[PCACHE_KEY_LEN]);

/* The key as 64 hex digits and a NUL. */
void pcache_key_hex(const unsigned char key[PCACHE_KEY_LEN], char out[2 * PCACHE_KEY_LEN + 1]);

/* Keep the chunk whose manifest hash is sha (z, n bytes) in seal->dir,
 * sealed with seal->key under a name derived from both (HMAC: the name
 * says nothing about the bytes without the key), written under a temporary
 * name then renamed, so a file by that name is whole. Best effort: 0, or
 * -1 (nothing kept). Any thread. */
int pcache_put(const struct pcache_seal *seal, const char *sha, const void *z, size_t n);

/* Read the chunk named sha, exactly n bytes once opened, into z: 0 when the
 * file is there and opens with seal->key (authenticated: a flipped bit, a
 * file of another pause, or a wrong key fails); else -1 (a file that fails
 * is removed; the caller fetches from S3, and still checks the hash). Any
 * thread. */
int pcache_get(const struct pcache_seal *seal, const char *sha, void *z, size_t n);

/* Remove from seal->dir every file that is not the copy of one of the n
 * chunks shas names (after a pause: the copies are then exactly what its
 * manifest names). */
void pcache_keep_only(const struct pcache_seal *seal, const char *const *shas, size_t n);

#endif
