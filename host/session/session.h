/* session: long-lived sandboxes on one kiln-host. A session is a VM cloned
 * from the host's snapshot (with a NIC when its policy asks for egress) that
 * runs many commands one after another, takes and gives files, and can be
 * paused: its whole RAM and device state and its own disk layer go to S3
 * (CUSTOMER/sessions/ID/), the VM is destroyed, and any host with the same
 * image can resume it later with processes, files and memory as they were.
 * See docs/api.md, "kiln-host sessions". Every call is thread-safe; one
 * operation runs per session at a time (others get err "busy").
 *
 * Room: the session room's door (host/session/: sessions, pause and
 * resume, the pause cache and its chunks and manifests, prestarted QEMUs,
 * idle reaping, a session's envd). It may call the task, template, run, vm,
 * net and envd rooms and lib/. */
#ifndef KILN_SESSION_H
#define KILN_SESSION_H

#include <stddef.h>

#include <jansson.h>

#include "dest.h"
#include "err.h"
#include "run/run.h"
#include "task/task.h"

struct session_table;

/* Sessions of this host: their files live in <spool_dir>/sessions/<id>/
 * (what an earlier process left there is removed: its VMs died with it).
 * Uses d for capacity, run options and S3. NULL with err set. */
struct session_table *sessions_open(struct hostd *d, const char *host_id, const char *spool_dir, struct kiln_err *err);
/* Start the thread that samples running sessions' metrics (every 5 s) and,
 * unless idle_stop_ms is 0, stops idle sessions' vCPUs after idle_stop_ms
 * without a request (0: never;
 * see session_idle.c). Once, before requests come. 0 or -1 with err. */
int sessions_set_idle_stop(struct session_table *ss, unsigned idle_stop_ms, struct kiln_err *err);
/* Keep one session QEMU started ahead for the next create or resume
 * (session_prestart.c; on unless turned off here). */
void sessions_set_prestart(struct session_table *ss, int on);
/* Pause by reading the VM's changed pages out of QEMU (vmmem.c; on unless
 * turned off here, or where process_vm_readv is refused) instead of QEMU
 * saving every page. mode 0: off; 1: on; 2: on, and each such pause is
 * then checked page by page against QEMU's own save of the same stopped VM
 * (vmmem_verify: a diagnostic, a full save more per pause). */
void sessions_set_save_pages(struct session_table *ss, int mode);
/* Put the base RAM of each snapshot that sessions start from into S3
 * ahead of its first pause (session_base_prep.c; on unless turned off
 * here): sessions_prepare_base for the host's own snapshots, and on the
 * first session created here on any other. */
void sessions_set_prepare_base(struct session_table *ss, int on);
struct snapshot;
/* snap (the default template's, NULL: nothing) is ready for sessions:
 * hash its RAM and make sure its base is in S3 on a background thread (at
 * low priority, one snapshot at a time; logged; a failure leaves it to the
 * first pause). Returns at once; after sessions_set_prepare_base. */
void sessions_prepare_base(struct session_table *ss, const struct snapshot *snap);
/* Keep each pause's chunks under spool_dir too (pause_cache.h), so that a
 * resume on this host reads them locally: at most budget_mib MiB (0: off),
 * none older than max_age_s; every sweep_s seconds (on the janitor's timer)
 * the copies of sessions whose manifest in S3 is gone or another host's go,
 * and age and budget are enforced again. Before any session is created; 0, or -1 with errno
 * (the cache is off). */
int sessions_set_pause_cache(struct session_table *ss, const char *spool_dir, unsigned budget_mib,
			     unsigned max_age_s, unsigned sweep_s);
/* Remove this host's pause-cache copies of customer's session id (it
 * resumed on another host). 1 if there were some, 0 if not, -1 with err
 * (invalid_request) for ids that name no session. */
int sessions_pcache_drop(struct session_table *ss, const char *id, const char *customer, struct kiln_err *err);
/* Prometheus lines about sessions (kiln_host_sessions{...}, idle stops):
 * appended to b. */
struct buf;
void sessions_metrics(struct session_table *ss, struct buf *b);
/* Destroy every running session (on shutdown; paused ones are in S3). */
void sessions_close(struct session_table *ss);

/* {"sessions":[session objects]} / one session object, or NULL. */
json_t *sessions_list(struct session_table *ss);
json_t *session_get(struct session_table *ss, const char *id);

struct template_ref;

/* Start a session. spec: {"limits":{...},"network":{...}} as in a task spec
 * (no code); ref: its template (NULL: default), made ready first (fetched,
 * verified, snapshotted: this call may take a while) and kept in use until
 * the session is paused or destroyed. *out: the session object. Errors:
 * invalid_request, invalid_spec, duplicate, no_capacity,
 * egress_unavailable, no_template, invalid_image, s3_*, vm_error. */
int session_create(struct session_table *ss, const char *id, const char *customer, json_t *spec,
		   const struct template_ref *ref, json_t **out, struct kiln_err *err);

/* Replace a running session's egress rules: network is the spec's
 * "network" object ({"egress":"allow","allow":[...]}), checked as create
 * checks it, applied at once (net_sandbox_update: one nftables transaction
 * in the sandbox's namespace) and kept in the session's spec, so that a
 * pause's manifest, and the resume that follows on any host, carry it.
 * Returns {"id","network"} (new reference) or NULL with err: not_found,
 * busy, not_running (being paused), no_network (created with egress
 * "none": no network device to change), invalid_spec, net_error. */
json_t *session_network(struct session_table *ss, const char *id, json_t *network, struct kiln_err *err);

/* Run one command: req {"argv":[...]} or {"language","code"}, optional
 * "env", "cwd", "timeout_s", "stdin_b64", "interactive", "tty". on_event/ctx
 * (may be NULL): output as it comes (RUN_EV_STDOUT/STDERR), and
 * RUN_EV_RUNNING once it started (its data: struct run_started, with the
 * exec id that input requests name for an interactive command, and the
 * command's deadline, past which on_event must not wait: run.h). Returns the result (a task result without
 * outputs), or NULL with err (not_found, busy, invalid_spec). A command that
 * broke the VM ends the session (state "error"). */
json_t *session_exec(struct session_table *ss, const char *id, json_t *req,
		     void (*on_event)(void *ctx, int event, const void *data, size_t len), void *ctx,
		     struct kiln_err *err);

/* Input for the session's interactive command (one started with
 * "interactive":true or "tty"): req {"exec_id", "data_b64", "eof",
 * "resize":{"rows","cols"}} (all but exec_id optional), queued for the guest
 * in that order, all or nothing. Returns {"exec_id","accepted":bytes}, or
 * NULL with err (invalid_request, not_found, no_exec: not running now,
 * input_full: the command has not read what came before). Does not wait for
 * the command; safe while it runs (it takes no operation lock). */
json_t *session_input(struct session_table *ss, const char *id, json_t *req, struct kiln_err *err);

/* Hang up the interactive command exec_id of session id if it still runs
 * (its client went away): SIGHUP as when a terminal closes, SIGKILL to its
 * process group 3 s later; the session's other processes stay. */
void session_interrupt(struct session_table *ss, const char *id, const char *exec_id);

/* Files: write data at path (absolute); read the file at path (malloc'd
 * into *data); list a directory ({"entries":[{name,type,size}]}). */
int session_put_file(struct session_table *ss, const char *id, const char *path, const void *data, size_t len,
		     struct kiln_err *err);
int session_get_file(struct session_table *ss, const char *id, const char *path, unsigned char **data, size_t *len,
		     struct kiln_err *err);
json_t *session_list_dir(struct session_table *ss, const char *id, const char *dir, struct kiln_err *err);
/* Whole directories as tar (POSIX/GNU format, paths relative to dir):
 * pack dir into *data (malloc'd), or unpack data into dir (created), as the
 * task's user. 0, or -1 with err (not_found, invalid_request: tar's
 * message, too_large). */
int session_get_tar(struct session_table *ss, const char *id, const char *dir, unsigned char **data, size_t *len,
		    struct kiln_err *err);
int session_put_tar(struct session_table *ss, const char *id, const char *dir, const void *data, size_t len,
		    struct kiln_err *err);

/* Pause: save the VM to S3 and destroy it. Returns
 * {"id","state":"paused","snapshot":{"bucket","prefix","bytes","pause_ms"}}
 * or NULL with err. If S3 fails, the saved files stay on this host and a
 * later pause retries the upload (the session is "pausing"). */
json_t *session_pause(struct session_table *ss, const char *id, struct kiln_err *err);

/* Resume a paused session of customer from S3 on this host, on the
 * template ref (NULL: default; it must be the one it was paused on: the
 * snapshot key says). With from_snapshot (NULL: none), id is a new
 * session started from that snapshot of customer's (session_checkpoint),
 * its manifest awaited up to snapshot_wait_ms;
 * its manifest is copied to the session's own place once it runs. Errors:
 * duplicate (running here), no_snapshot, snapshot_corrupt (damaged in S3),
 * incompatible_snapshot (another image), no_capacity, vm_error. */
int session_resume(struct session_table *ss, const char *id, const char *customer, const char *from_snapshot,
		   unsigned snapshot_wait_ms, const struct template_ref *ref, json_t **out, struct kiln_err *err);
/* snapshot_wait_ms: a snapshot whose manifest is not in S3 yet (a fork's,
 * still uploading) is looked for again until then (at most this). */
#define SESSION_SNAPSHOT_WAIT_MAX_MS 300000

/* Checkpoint a running session of customer (NULL: any) to the snapshot
 * snapshot_id in S3 ("<customer>/snapshots/<snapshot_id>/": its chunks, then
 * manifest.json), for sessions started from it (session_resume with
 * from_snapshot: a fork's children, a named snapshot's sessions): the VM is
 * stopped while its pages are read and its disk copied, then goes on.
 * Returns {"id","snapshot":{"id","bucket","prefix","bytes","stop_ms","ms"}}
 * or NULL with err (not_found, busy, not_running, no_s3, s3_unavailable,
 * host_error: nothing kept in S3 then). With fork, a copy of its RAM is
 * also kept here a while, which the sessions started from it on this host
 * map copy-on-write (session_fork.c). */
json_t *session_checkpoint(struct session_table *ss, const char *id, const char *customer, const char *snapshot_id,
			   int fork, struct kiln_err *err);

/* Delete every object of customer's snapshot snapshot_id in S3 (its
 * manifest first). The number deleted, or -1 with err. */
int sessions_snapshot_delete(struct session_table *ss, const char *customer, const char *snapshot_id,
			     struct kiln_err *err);

/* A volume of customer's in S3 ("<customer>/volumes/<id>/", docs/
 * architecture.md "Volumes"): {"id","exists":true,"bytes" (data stored,
 * uncompressed),"stored_bytes","size_mib","generation","chunks"} from its
 * manifest, or NULL with err (not_found: no manifest; invalid_request,
 * no_s3, s3_*, snapshot_corrupt). */
json_t *sessions_volume_get(struct session_table *ss, const char *customer, const char *id, struct kiln_err *err);
/* Delete every object of customer's volume id in S3 (its manifest first):
 * the number deleted (0: nothing was there), or -1 with err. kiln-api asks
 * once no session mounts it. */
int sessions_volume_delete(struct session_table *ss, const char *customer, const char *id, struct kiln_err *err);

/* Upload /output to CUSTOMER/sessions/ID/outputs/: {"outputs":[...],
 * "truncated":bool}. A file whose name makes no valid key, or is not UTF-8,
 * is listed with "skipped" (the reason) and "s3_key" null. */
json_t *session_outputs(struct session_table *ss, const char *id, struct kiln_err *err);
/* The same to the customer's own destination (NULL: the host's S3), under
 * its PREFIX + CUSTOMER/sessions/ID/outputs/, with its credentials. */
json_t *session_outputs_to(struct session_table *ss, const char *id, const struct dest *dest, struct kiln_err *err);

/* The S3 key of a session's output file rel: malloc'd, built whole and
 * checked with s3_key_check; NULL with err set when no valid key can carry
 * it (never a shortened key, which two names could share). */
char *session_output_key(const char *customer, const char *id, const char *rel, struct kiln_err *err);

struct envd;

/* The session's envd channel (host/envd/envd.h), opened on first use and
 * referenced for the caller (envd_unref), and its default env (*env: a new
 * reference to an object of strings, {} when it has none). Takes no
 * operation lock: envd requests run beside commands and each other; counts
 * as activity. NULL with err: not_found, or unavailable (pausing). */
struct envd *session_envd(struct session_table *ss, const char *id, json_t **env, struct kiln_err *err);

/* Shutting down: close every envd channel (their streams end with
 * `unavailable`, so that the HTTP threads serving them finish) and open no
 * new one. Before the HTTP server stops. */
void sessions_envd_stop(struct session_table *ss);

/* {cpu_count, cpu_used_pct, mem_used, mem_total, disk_used, disk_total}
 * measured now from the VM's cgroups and disk layer (cpu_used_pct: since
 * the last call, or since the VM started). NULL with err (not_found). */
json_t *session_metrics(struct session_table *ss, const char *id, struct kiln_err *err);
/* {"samples":[{..., t_ms}]}: the session's samples (one every 5 s while it
 * runs on this host, the last hour kept) whose time (wall clock, ms) is in
 * [start_ms, end_ms], then one measured now when the range reaches now.
 * NULL with err (not_found). */
json_t *session_metrics_range(struct session_table *ss, const char *id, int64_t start_ms, int64_t end_ms,
			      struct kiln_err *err);

/* Destroy the session (if it runs here) and, unless keep_snapshot, delete
 * its paused snapshot from S3 (customer may be NULL when the session runs
 * here). keep_snapshot: only this copy goes (a stale one, whose session
 * lives on elsewhere or in S3). */
int session_delete(struct session_table *ss, const char *id, const char *customer, int keep_snapshot,
		   struct kiln_err *err);

#endif
