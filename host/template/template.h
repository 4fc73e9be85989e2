/* template: kiln-host's template store (docs/templates.md, "kiln-host's
 * template store"). Built-in templates are the image directory's
 * rootfs.ext4 (`default`) and rootfs-NAME.ext4 (NAME); customer templates
 * live in <cache>/templates/<sha256>/ (rootfs.ext4 mode 0444, meta.json =
 * the TREF, last_used), fetched from S3 on first use and verified by their
 * SHA-256 before anything boots them. Each template has its own snapshots
 * (their key includes the rootfs) and, when configured, its own warm pool.
 * Least recently used customer templates are evicted past a disk budget;
 * snapshots unused for a TTL are removed whoever made them.
 *
 * Several kiln-host processes may share the cache: a template or snapshot
 * in use holds a shared flock on its last_used file, and eviction removes
 * only what it can lock exclusively.
 *
 * Room: the template room's door (host/template/: the
 * template store, template references). It may call the run and vm rooms
 * and lib/. */
#ifndef KILN_TEMPLATE_H
#define KILN_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "buf.h"
#include "err.h"
#include "s3.h"
#include "template_ref.h"
#include "vm/vm.h"

struct pool;
struct capacity;
struct vm_ops;
struct kiln_clock;

/* ---- the store ---- */

struct template_store_config {
	const char *image_dir;          /* rootfs.ext4, rootfs-NAME.ext4 */
	const char *cache;              /* snapshots/ and templates/ live here */
	const struct vm_config *base;   /* kernel, initramfs, QEMU, accel, jail (disk: replaced per template) */
	unsigned snap_memory_mib, snap_vcpus;
	int cold;                       /* no snapshots or pools at all */
	int net;                        /* egress is on: NIC snapshots are made for egress users */
	json_t *pools;                  /* {"NAME": N}: warm pool sizes (NULL: none); not kept */
	unsigned default_pool, prestart; /* the default template's pool (--pool, --prestart) */
	unsigned default_pool_max;      /* ... and how far it may grow with demand (--pool-max) */
	unsigned pool_refills;          /* every pool's refills under way at once (pool.refills; 0: 1) */
	uint64_t disk_budget_mib;       /* 0: no budget */
	unsigned snapshot_ttl_s;        /* 0: snapshots never expire */
	struct capacity *cap;           /* pools reserve their VMs' memory here */
	const struct vm_ops *ops;
	const struct kiln_clock *clk;   /* NULL: the system clock */
	int verbose;                    /* snapshot progress on stderr */
};

struct template_store;
struct template;

/* Open the store: find the built-ins (at least `default`), the customer
 * templates already in the cache, make the default template's snapshots
 * (and those of built-ins with a configured pool) and start their pools.
 * cfg's pointers must outlive the store. NULL with err set. */
struct template_store *template_store_open(const struct template_store_config *cfg, struct kiln_err *err);
/* Stop every pool, close every snapshot, free the store. No user may be left. */
void template_store_close(struct template_store *ts);

/* What one task or session of a template needs; valid until released. */
struct template_use {
	struct template *t;
	char name[64];
	const char *rootfs;             /* the image (the VM's disk) */
	const struct snapshot *snap;    /* NULL: cold (cold host, or the snapshot failed) */
	const struct snapshot *net_snap; /* for egress (NULL: none asked or cold) */
	struct pool *pool;              /* NULL: no pool */
	int user_set;
	uint32_t uid, gid;
};

/* Quick admission check for ref (NULL: default), no I/O but stat: 0, or
 * -1 with err no_template (a built-in this host lacks) or no_s3 (a customer
 * template that is not here and no S3 to fetch it from: have_s3 0). */
int template_check(struct template_store *ts, const struct template_ref *ref, int have_s3, struct kiln_err *err);

/* Take ref's template for one user (NULL: default), making it ready first:
 * fetched from S3 (s3 may be NULL when it is local) into a temporary file,
 * its SHA-256 verified, renamed into the store; then its snapshot (and with
 * need_net its NIC snapshot) opened or made. Concurrent callers for one
 * template wait for one fetch and one snapshot. The template stays in use
 * (never evicted) until template_release. Returns 0, or -1 with err:
 * no_template, s3_* (fetch), invalid_image (SHA-256 or size mismatch: the
 * file is removed, never used), host_error. Blocks; any thread. */
int template_acquire(struct template_store *ts, const struct template_ref *ref, int need_net,
		     const struct s3_config *s3, struct template_use *out, struct kiln_err *err);
void template_release(struct template_store *ts, struct template_use *u);

/* Install a built image (path, on the cache's file system) as the customer
 * template ref describes (its sha256 and size must match the file): moved
 * into the store (mode 0444) with its meta.json. 0 or -1 with err. */
int template_install(struct template_store *ts, const char *path, const struct template_ref *ref, struct kiln_err *err);

/* The default built-in image's path (builds start from it). */
const char *template_default_rootfs(const struct template_store *ts);

/* capacity.templates: [{"name","sha256"|null,"builtin","ready","snapshot"}]. */
json_t *template_store_json(struct template_store *ts);
/* Prometheus lines: per-template pool gauges, fetch and eviction counters. */
void template_store_metrics(struct template_store *ts, struct buf *b);
/* The default template's pool (NULL: none), for the legacy capacity.pool. */
struct pool *template_store_default_pool(struct template_store *ts);

/* Housekeeping: remove snapshots unused for the TTL, then evict least
 * recently used unused customer templates (with their snapshots) while the
 * store plus the snapshots exceed the budget; touch what is in use. Without
 * force, does nothing when the last pass was under TEMPLATE_GC_PERIOD_MS
 * ago. Called after every task and after each fetch; any thread. Returns
 * the templates evicted. */
#define TEMPLATE_GC_PERIOD_MS 10000
/* After a template's snapshot failed, its VMs boot cold this long before
 * the snapshot is tried again. */
#define TEMPLATE_SNAP_RETRY_MS 600000
int template_store_gc(struct template_store *ts, int force);

/* ---- building blocks, exported for the unit tests ---- */

/* Hash the file at path (SHA-256, lowercase hex) and its size. 0 or -errno. */
int template_file_sha256(const char *path, char hex[65], uint64_t *size);
/* Verify path against ref (size, then SHA-256): 0, or -1 with err
 * invalid_image saying which differs. */
int template_verify_file(const char *path, const struct template_ref *ref, struct kiln_err *err);

/* One candidate for eviction: a cache entry and what it occupies. */
struct template_lru {
	const char *id;          /* caller's name for it */
	int64_t last_used_ms;
	uint64_t bytes;
	int in_use;              /* by a user, a pool, or another process */
	int evictable;           /* customer template (never a built-in) */
};
/* Which entries to evict so that total (bytes) fits in budget: the indices
 * of the chosen entries in idx (oldest first), their count returned; never
 * one in use or not evictable (the total may still exceed budget then).
 * Pure. */
size_t template_lru_choose(const struct template_lru *e, size_t n, uint64_t total, uint64_t budget, size_t *idx);

#endif
