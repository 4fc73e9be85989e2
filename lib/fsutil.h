/* fsutil: removing and making directory trees, shared by the host, the jail
 * and the spool. Neither follows symbolic links: a tree a VM or a guest
 * could have written into is removed without ever leaving it. */
#ifndef KILN_FSUTIL_H
#define KILN_FSUTIL_H

#include <sys/types.h>

#include "err.h"

/* Remove name (relative to dirfd, or AT_FDCWD) and everything below it, at
 * any depth (deeper than PATH_MAX too: the walk is iterative, holds at most
 * 33 fds and builds no path), never following links. A missing path is not
 * an error. Returns 0 or a negative errno from the final removal. Any thread. */
int fs_rmtree_at(int dirfd, const char *name);
int fs_rmtree(const char *path);

/* mkdir -p: parents with 0755, the last component with mode. Returns 0 or a
 * negative errno. An existing directory is fine. */
int fs_mkdir_p(const char *path, mode_t mode);

/* SHA-256 of the file at path as 64 hex digits + NUL. 0 or -1. */
int fs_sha256_file(const char *path, char out[65]);
/* The same of len bytes in memory. 0 or -1. */
int fs_sha256_buf(const void *p, size_t len, char out[65]);

/* A secret kept in a file (a token, an S3 secret, an admin key): its first
 * line without the newline, malloc'd. NULL with err set (code "config",
 * naming the configuration file and key) when it cannot be read or is empty. */
char *fs_read_secret(const char *path, const char *key, const char *file, struct kiln_err *err);

/* n numeric fields of /proc/PID/stat from field `first` on (numbered as in
 * proc(5), first >= 3: after the command name, which may hold spaces and
 * ')'), into v. 0, or -1 when the process is gone or the line is short. */
int fs_proc_stat(pid_t pid, int first, int n, unsigned long long *v);

/* Make this process (a daemon: kiln-host, kiln-api) one of the last the
 * kernel's OOM killer picks: /proc/self/oom_score_adj = adj (negative needs
 * CAP_SYS_RESOURCE; without it the value is left as is). Sandboxes' QEMUs
 * set theirs high (host/vm/vm.c). 0 or -errno. */
int fs_oom_score_adj(int adj);
#define DAEMON_OOM_SCORE_ADJ (-500)

/* A daemon's start (kiln-api, kiln-host): SIGINT, SIGTERM and SIGHUP
 * blocked in *set for sigwait (every thread started after inherits the
 * mask), SIGPIPE ignored, and DAEMON_OOM_SCORE_ADJ: should the machine run
 * short of memory, sandboxes go first. Main thread, before any other. */
void fs_daemon_start(sigset_t *set);

#endif
