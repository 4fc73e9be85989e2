/* snapshot: pre-booted VM images. A template VM boots once, pre-starts the
 * Python interpreter, pauses and saves its device state; its RAM lives in a
 * file that every clone maps privately (copy-on-write), and its disk overlay
 * becomes the read-only backing of every clone's own throw-away overlay. */
#ifndef KILN_SNAPSHOT_H
#define KILN_SNAPSHOT_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "err.h"
#include "vm.h"

struct snapshot {
	char key[17];
	char dir[512];
	char mem[600], disk[600], state[600];
	unsigned memory_mib, vcpus;
	int net;               /* the template has a NIC: its clones need a tap (vm_config.net_fd) */
	char release[65];      /* the guest kernel's release (from its HELLO) */
	/* What the manifest recorded, checked on every open. */
	char state_sha256[65];
	uint64_t mem_size, mem_ino, mem_mtime_ns, mem_ctime_ns;
	/* The RAM file's contents in a sealed memfd (snapshot_open and
	 * snapshot_create load it; -1 otherwise). Clones map it privately: a
	 * jailed QEMU needs it opened read-write, and the seals (not file
	 * permissions) are what keep any clone from changing the template that
	 * every later clone starts from. Copies of the struct share it. */
	int mem_fd;
	char backing[600];     /* disk.qcow2's backing file (the rootfs), bound read-only into clones */
	/* The resume key (snapshot_resume_key), "" until the template store
	 * sets it: a session paused on this snapshot resumes on any snapshot
	 * with the same one, whatever kernel or kiln-init booted it. */
	char rkey[17];
};

/* The key of the snapshot for base's kernel, rootfs, initramfs, QEMU, memory
 * size and vCPUs: a change to any of them selects a different snapshot. */
int snapshot_key(const struct vm_config *base, unsigned memory_mib, unsigned vcpus, char key[17],
		 struct kiln_err *err);

/* The key of what a paused session's guest needs from the host to go on:
 * the rootfs (its disk layer sits on it), QEMU and the machine (memory,
 * vCPUs, accelerator, CPU model, device layout, NIC). Not the kernel or the
 * initramfs: a paused guest holds its own kernel and kiln-init in its RAM,
 * so a new kiln-init (every kiln upgrade) or kernel makes a new template
 * snapshot for new VMs but leaves paused sessions resumable. */
int snapshot_resume_key(const struct vm_config *base, unsigned memory_mib, unsigned vcpus, char key[17],
			struct kiln_err *err);

/* Boot a template VM from base, prepare it and save it under
 * <cache>/snapshots/<key>/ (replacing any snapshot with that key), and load
 * it as snapshot_open does into out (when not NULL).
 * Shows progress on stderr when verbose. */
int snapshot_create(const struct vm_config *base, const char *cache, unsigned memory_mib, unsigned vcpus,
		    int verbose, struct snapshot *out, struct kiln_err *err);

/* Open and validate the snapshot with this key, and load its RAM into a
 * sealed memfd (out->mem_fd; ~15 ms per 60 MiB of guest RAM in use, once per
 * process). Returns 0; -ENOENT when there is none (err set); -EBADMSG when it
 * exists but is damaged (truncated, modified, unreadable manifest: err says
 * which). */
int snapshot_open(const char *cache, const char *key, struct snapshot *out, struct kiln_err *err);

/* Release what snapshot_open or snapshot_create loaded (the memfd), in the
 * last copy of s that is used. */
void snapshot_close(struct snapshot *s);

/* Start a clone: QEMU waits in -incoming, loads the device state, maps the
 * RAM file privately, then runs. On success the guest is running and
 * waiting for the host's first request. The caller owns vm. */
int snapshot_restore(const struct snapshot *s, const struct vm_config *base, struct vm *vm, struct kiln_err *err);

/* The two halves of snapshot_restore: start QEMU waiting in -incoming with
 * the snapshot's devices and RAM file (the slow part: process start-up), and
 * later load the device state into it and resume. */
int snapshot_spawn(const struct snapshot *s, const struct vm_config *base, struct vm *vm, struct kiln_err *err);
int snapshot_load(const struct snapshot *s, struct vm *vm, struct kiln_err *err);

/* Save a running VM's whole state (devices, and RAM unless it is shared
 * with a file) into state_fd; the VM is stopped and its disks flushed and
 * released when this returns 0 (then only destroy it). And load such a
 * stream into a VM started with vm_config.incoming, then run it. */
int snapshot_save_fd(struct vm *vm, int state_fd, int timeout_ms, struct kiln_err *err);
int snapshot_load_fd(struct vm *vm, int state_fd, int timeout_ms, struct kiln_err *err);

/* The SHA-256 of the snapshot's RAM (what a paused session's RAM diff is
 * against), hex in out. Computed once from the loaded memfd and cached in
 * <dir>/mem.sha256 with the file's identity (inode, mtime, ctime), so a
 * changed file is hashed again. 0, or -1 with err. Any thread. */
int snapshot_mem_sha256(const struct snapshot *s, char out[65], struct kiln_err *err);

/* The backing file name in the header of the qcow2 image at path ("" for
 * none) into out (cap bytes). 0 or a negative errno. */
int snapshot_qcow2_backing(const char *path, char *out, size_t cap);

/* Run a helper program (qemu-img) to completion: 0 when it exits 0. */
int snapshot_run_cmd(char *const argv[]);

/* Operator commands. */
int snapshot_list(const char *cache, FILE *out);
int snapshot_rm(const char *cache, const char *key, struct kiln_err *err);
/* Remove every snapshot the current inputs (base) would not select: made
 * from another kernel, rootfs, kiln-init or QEMU. Returns how many. */
int snapshot_prune(const struct vm_config *base, const char *cache, FILE *out);

/* Walk a running VM through everything a task does (SETUP, FILE, EXEC of
 * /bin/true, COLLECT, WARM), running no task code. In a snapshot template it
 * leaves the guest's caches (dentries, page cache, the interpreter's lazy
 * state) warm for every clone; in a pool VM it also gets TCG to translate
 * those paths before a task needs them. Returns 0 or -1 with err set.
 * (host/vm/warmup.c; the pool uses it too.) */
int pool_warm_up(struct vm *vm, struct kiln_err *err);

#endif
