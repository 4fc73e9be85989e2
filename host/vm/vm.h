/* vm: the VM driver. Starts one QEMU microvm per task, talks QMP, reads the
 * kiln-init agent channel, and destroys the VM and everything it took (process,
 * fds, per-VM directory) on every path, including after a SIGKILL of kiln-host
 * (vm_reap_stale on the next start).
 *
 * Room: the vm room's door (host/vm/: QEMU and QMP, snapshots, guest memory,
 * qcow2 checks, the migration-stream filter, the page loader). It may call
 * lib/ and jail/ only. Everything other rooms may use is declared here or in
 * the headers included at the end. */
#ifndef KILN_VM_H
#define KILN_VM_H

#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "jail.h"
#include "proto.h"

enum vm_accel { VM_ACCEL_AUTO, VM_ACCEL_KVM, VM_ACCEL_TCG };

/* Defaults of vm_config.disk_bps/disk_iops (kiln-host's "disk" settings). */
#define VM_DISK_BPS  (128ull << 20)
/* Bytes of the guest's serial console QEMU keeps (a ring; see vm.c). */
#define VM_CONSOLE_RING 65536u
#define VM_DISK_IOPS 4000u

struct vm_config {
	const char *qemu;          /* qemu-system-x86_64 */
	const char *kernel;        /* vmlinux (PVH entry) */
	const char *initrd;        /* initramfs with kiln-init */
	const char *disk;          /* root disk: never written (QEMU snapshot=on overlay) */
	const char *disk_format;   /* "raw" or "qcow2" */
	const char *run_dir;       /* per-VM directories live here */
	enum vm_accel accel;       /* resolved: KVM or TCG, never AUTO */
	unsigned vcpus, memory_mib;
	/* Snapshots (NULL/0 for a cold boot): */
	const char *mem_file;      /* guest RAM backed by this file (memory-backend-file) */
	int mem_share;             /* 1: writes go to the file (template); 0: private COW (clone) */
	int incoming;              /* start paused in -incoming defer */
	int disk_writable;         /* 1: write to `disk` itself (a template's own overlay) */
	const char *disk_backing;  /* the qcow2 `disk`'s backing file (read-only), or NULL */
	const char *disk_backing2; /* and that file's own backing file (read-only), or NULL */
	/* A second disk (a template build's output): a raw file the guest
	 * writes, bound read-write into the jail, throttled like the root disk,
	 * serial "kiln-out" (the guest finds it by that, not by its name), and
	 * placed after every other device. NULL: none. Its size counts towards
	 * QEMU's file size limit, so a qcow2 `disk` may grow as large as it. */
	const char *disk2;
	/* Volume slots (docs/architecture.md "Volumes"): VM_VOL_SLOTS raw
	 * drives of VM_VOL_SLOT_BYTES each (sparse), serials "kiln-vol0"...,
	 * cache=writeback (a guest flush reaches the file: fdatasync), placed
	 * after every other device, in every VM: the layout is part of every
	 * snapshot, so a clone of any template can mount a volume. vm_start
	 * creates them empty as vol_dir/vol<N>.img (NULL: in the VM's own
	 * directory), bound read-write into the jail; a session fills one in
	 * place (the inode QEMU holds open) before its guest runs. */
	const char *vol_dir;
	/* The guest's disk I/O, throttled by QEMU's block layer whatever the
	 * host's page cache absorbs: bytes and requests per second, reads and
	 * writes together (0: no limit). A guest cannot saturate the host's
	 * disk; see VM_DISK_BPS/VM_DISK_IOPS for the defaults. */
	uint64_t disk_bps;
	unsigned disk_iops;
	/* 1: the whole serial console in <dir>/vm/console.log (debugging; a
	 * guest can fill the run directory with it). 0: a VM_CONSOLE_RING ring
	 * inside QEMU, read on failure. */
	int console_file;
	int mem_ram;               /* guest RAM as memory-backend-ram "mem": a resumed session,
				    * whose RAM comes in the migration stream */
	int mem_fd;                /* > 0: guest RAM is this sealed memfd, mapped privately
				    * (a snapshot clone; see snapshot.h); overrides mem_file */
	int cancel_fd;             /* > 0: every wait ends ("interrupted") once it is readable */
	/* Network (see net.h). 0: no NIC at all, the default. 1: a virtio-net NIC
	 * on the tap net_fd (opened in the sandbox's own network namespace; not
	 * owned), or, with net_fd <= 0, on a hub port leading nowhere (a template
	 * that clones with a tap are made from). */
	int net;
	int net_fd;
	/* The jail around QEMU (namespaces, read-only root, cgroups, rlimits,
	 * slot uid): from vm_jail_config. NULL runs QEMU unconfined, as root:
	 * only for debugging (kiln-host --no-jail). */
	const struct jail_config *jail;
	/* TCG's translation buffer in MiB (0: VM_TB_MIB). Pages of it are
	 * touched (and held, privately) only as the guest runs new code; a
	 * smaller buffer caps what an idle VM holds but retranslates sooner. */
	unsigned tb_mib;
};

#define VM_TB_MIB 64

#define VM_VOL_SLOTS      2
#define VM_VOL_SLOT_BYTES (64ull << 30) /* the guest's view: fixed by the template snapshot */
#define VM_VOL_SERIAL     "kiln-vol"    /* + the slot's number */

struct vm;

/* Whether cfg's volume slots are read-only drives: a restored VM that is no
 * session's (vol_dir NULL; not a template build's, which writes its disk). */
int vm_vol_readonly(const struct vm_config *cfg);

/* The path of slot's file for a VM started with vol_dir dir (NULL: the VM's
 * own, vm->dir). */
void vm_vol_path(char *out, size_t cap, const char *dir, const struct vm *vm, unsigned slot);

struct vm {
	pid_t pid;
	int pidfd;      /* readable when QEMU exits */
	int agent_fd;   /* virtio-serial port "kiln.agent" (socketpair end) */
	int qmp_fd;     /* QMP monitor (socketpair end) */
	int envd_fd;    /* virtio-serial port "kiln.envd" (socketpair end; blocking;
			 * the guest's envd, lib/eproto.h: host/envd/envd.c dups it) */
	int lock_fd;    /* flock on <dir>/lock: held while this process owns the VM */
	int cancel_fd;  /* from vm_config, not owned */
	int input_fd;   /* > 0: vm_recv also returns ("input") when it is readable;
			 * not owned (a session's interactive command, run.c) */
	/* Per-VM directory: lock, qemu.pid, jail (what to reap), root/ (the
	 * jail's root mount point) and vm/ (QEMU's own files, owned by the slot
	 * uid: qemu.log, the disk overlay, console.log with console_file). */
	char dir[512];
	struct jail jail; /* slot and cgroups, while jailed */
	int64_t t_spawn_us;
	/* Agent receive buffer: bytes read from the guest, not yet consumed. */
	uint8_t *rbuf;
	size_t rlen, rskip;
	/* QMP receive buffer. */
	char *qbuf;
	size_t qlen;
	/* The status of the last MIGRATION event that arrived while vm_qmp
	 * waited for a reply: a short migration can end before QEMU answers
	 * the command that started it ("" when none since vm_qmp_migration_reset). */
	char migration[24];
};

/* Resolve VM_ACCEL_AUTO: KVM only when a hardware KVM module (kvm_intel or
 * kvm_amd) is loaded and /dev/kvm opens; never a software hypervisor (PVM). */
enum vm_accel vm_accel_resolve(enum vm_accel want, struct kiln_err *err);
const char *vm_accel_name(enum vm_accel a);
/* The -cpu model for accel a: the host's CPU under KVM; under TCG qemu64
 * (fewer features to emulate, first-touch writes ~2x faster) with an Intel
 * vendor string: as AuthenticAMD family 15, OpenBLAS picks its Opteron
 * kernels, whose 3DNow! instructions TCG does not have (SIGILL in every
 * matrix product). Part of the snapshot key. */
const char *vm_cpu_model(enum vm_accel a);
/* The host's invariant TSC rate in kHz (measured once, ~50 ms), or 0. */
unsigned vm_host_tsc_khz(void);

/* Fill jc for jailing QEMU: jail_config_init, then QEMU itself, its shared
 * libraries, its firmware directory and (under TCG) its accelerator module
 * with that module's libraries. Once per process; jc is then read-only and
 * shared by every VM. Returns 0 or -1 with err set. */
int vm_jail_config(struct jail_config *jc, const char *qemu, enum vm_accel accel, struct kiln_err *err);

/* Spawn QEMU for cfg. On success the VM is running (or, with cfg->incoming,
 * waiting for migrate-incoming) and QMP has been negotiated. The caller owns
 * vm and must call vm_destroy on every path. Returns 0 or -1 with err set. */
int vm_start(const struct vm_config *cfg, struct vm *vm, struct kiln_err *err);

/* Receive the next agent frame, waiting until deadline_ms (monotonic). The
 * frame's payload points into vm's buffer and is valid until the next call.
 * Returns 0, or -1 with err set (timeout, QEMU exited, protocol error). */
int vm_recv(struct vm *vm, struct proto_frame *f, int64_t deadline_ms, struct kiln_err *err);

/* Receive the next agent frame and expect the guest's OK for the request
 * of type want; anything else becomes the error vm_frame_err sets, `what`
 * naming the request. Returns 0 or -1 with err set. */
int vm_recv_ok(struct vm *vm, uint8_t want, int64_t deadline_ms, const char *what, struct kiln_err *err);

/* Set err for an agent frame that is not the answer wanted: the guest's
 * ERROR ("what: its message", KERR_GUEST_ERROR) or an unexpected type
 * (KERR_VM_ERROR). Returns -1, so callers can `return vm_frame_err(...)`. */
int vm_frame_err(const struct proto_frame *f, const char *what, struct kiln_err *err);

/* Send one agent frame. Returns 0 or -1 with err set. */
int vm_send(struct vm *vm, uint8_t type, const void *payload, size_t len, int64_t deadline_ms,
	    struct kiln_err *err);

/* Run one QMP command (a JSON object text), skipping events (a MIGRATION
 * event's status is kept in vm->migration), and return its
 * "return" member as a new jansson reference in *ret (NULL to ignore). */
struct json_t;
int vm_qmp(struct vm *vm, const char *cmd, int64_t deadline_ms, struct json_t **ret, struct kiln_err *err);

/* Wait for a QMP event by name (e.g. "MIGRATION"), until deadline_ms; its
 * "data" member goes to *data as a new reference (NULL to ignore). */
int vm_qmp_wait_event(struct vm *vm, const char *event, int64_t deadline_ms, struct json_t **data,
		      struct kiln_err *err);
/* Forget the MIGRATION status vm_qmp kept (call before starting a migration). */
void vm_qmp_migration_reset(struct vm *vm);

/* Hand QEMU a file descriptor under a name (QMP getfd with SCM_RIGHTS). */
int vm_qmp_getfd(struct vm *vm, const char *name, int fd, int64_t deadline_ms, struct kiln_err *err);
/* Send one QMP command with a file descriptor attached (SCM_RIGHTS: getfd,
 * add-fd), as vm_qmp does otherwise. */
int vm_qmp_fd(struct vm *vm, const char *cmd, int fd, int64_t deadline_ms, struct json_t **ret, struct kiln_err *err);

/* SETUP round trip: give the guest the host's wall-clock time and 64 bytes
 * of fresh entropy, and wait for its OK. Done after every boot and restore,
 * before any task code runs (clones of one snapshot share their RNG state
 * and a stale clock until this). Returns 0 or -1 with err set. */
int vm_setup(struct vm *vm, int64_t deadline_ms, struct kiln_err *err);
/* The two halves of vm_setup, for a host that sends more before it reads. */
int vm_setup_send(struct vm *vm, int64_t deadline_ms, struct kiln_err *err);
int vm_setup_recv(struct vm *vm, int64_t deadline_ms, struct kiln_err *err);
/* Ask kiln-init how many processes run that are not its own (PROCS_QUERY:
 * a command's background child, a server started through envd...): *count
 * and the pid of one of them in *pid. Only while no request of the host's
 * runs on the agent channel. Returns 0 or -1 with err set; after a timeout
 * the answer may still come: vm_recv drops it, and the caller must not
 * trust a later vm_procs on this VM (it could read that stale answer). */
int vm_procs(struct vm *vm, int64_t deadline_ms, uint32_t *count, uint32_t *pid, struct kiln_err *err);

/* Set the nice value of every thread of QEMU (a pool refills at 19, so that
 * running tasks keep the CPU; a VM handed out goes back to 0) and, when
 * jailed, its cgroup's CPU weight to match: each jail is a cgroup of its own,
 * and among cgroups only the weight counts (nice 0: the default 1024; any
 * other: nice 19's CFS weight, 15, scaled the same way). Returns 0, or
 * -errno of the first thread (or the weight) that could not be changed. */
int vm_set_nice(const struct vm *vm, int nice);

/* Kill QEMU (SIGKILL), reap it, close every fd and remove the VM directory.
 * Safe on a zeroed or half-started vm, and idempotent. */
void vm_destroy(struct vm *vm);

/* The last bytes of the guest console and QEMU's own log, for error messages. */
void vm_log_tail(struct vm *vm, char *out, size_t cap);

/* Remove what crashed kiln-host processes left in run_dir: for every VM
 * directory whose lock is free, kill its QEMU (checked by pid and start time;
 * its jail's PID namespace and mounts go with it), remove its cgroups and
 * delete the directory. Returns the number of VMs reaped. */
int vm_reap_stale(const char *run_dir);

/* The rest of the door: the room's other modules other rooms use. */
#include "migfilter.h"
#include "pageload.h"
#include "qcow2.h"
#include "snapshot.h"
#include "vmmem.h"

#endif
