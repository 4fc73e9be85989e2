/* envd: the guest's process and file daemon for E2B-style work, serving
 * lib/eproto.h on the second virtio-serial port (`kiln.envd`): many
 * processes at once, each with its own output stream, stdin, signals and
 * terminal, and file operations run with a user's permissions. kiln-init
 * forks it at boot (envd_spawn); tests drive it over a socketpair. */
#ifndef KILN_GUEST_ENVD_H
#define KILN_GUEST_ENVD_H

#include <sys/types.h>

/* Name of the virtio-serial port envd serves. */
#define ENVD_PORT_NAME "kiln.envd"
/* The user commands run as when the host names none (E2B's convention). */
#define ENVD_DEFAULT_USER "user"
/* Its uid/gid when envd has to create it: this or the first free id above.
 * Not 1000: kiln-init's native tasks run as uid 1000, and a task timeout
 * kills every process of that uid; E2B processes must survive it. */
#define ENVD_DEFAULT_UID 1001

/* Bounds: processes envd follows at once, and READ/WRITE/LISTDIR/LIST
 * requests in progress at once. */
#define ENVD_MAX_PROCS 1024
#define ENVD_MAX_JOBS 64
/* Port connections open at once (PORT_OPEN past it: PORT_CLOSED -EMFILE). */
#define ENVD_MAX_CONNS 256
/* Input a process has not read yet, held per process; past it INPUT bytes
 * are dropped (and logged) rather than block the channel. */
#define ENVD_STDIN_MAX (1u << 20)
#define ENVD_STDIN_TOTAL (32u << 20) /* ... and for all processes together */
/* After the main process exits, its pipes are read this much longer for a
 * background child still holding them, then closed (what was in them at
 * that moment is still delivered). */
#define ENVD_LINGER_MS 100

/* Where envd finds and makes users, and what it calls a missing user's
 * home; tests point these into a temporary directory. */
struct envd_config {
	const char *passwd;   /* "/etc/passwd" */
	const char *group;    /* "/etc/group" */
	const char *shadow;   /* "/etc/shadow" (appended to only when it exists) */
	const char *home_dir; /* "/home": the default user's home is HOME_DIR/user */
	/* Where PORTS reads the listening sockets (NULL: /proc/net/tcp, tcp6). */
	const char *proc_net_tcp, *proc_net_tcp6;
};

/* The paths of a real guest. */
extern const struct envd_config envd_guest_config;

/* Opaque: one per channel. */
struct envd;

/* Takes over `chan` (the virtio-serial port or one end of a socketpair;
 * made non-blocking, O_ASYNC) and blocks SIGCHLD and SIGIO in the calling
 * process, which must be single-threaded, to read them from a signalfd.
 * Makes the process a child subreaper. Returns NULL with errno set on
 * failure; the envd owns chan from then on. cfg must outlive the envd. */
struct envd *envd_create(int chan, const struct envd_config *cfg);

/* Serves until the channel fails. Sends HELLO first when the host is
 * connected, and again on every (re)connection. Returns a negative errno. */
int envd_serve(struct envd *e);

/* Kills (SIGKILL to their groups) and reaps every process envd started,
 * closes everything and frees the envd. For tests. */
void envd_destroy(struct envd *e);

/* Makes sure the default user exists: appends it to cfg->passwd and
 * cfg->group (and cfg->shadow when that file exists) when missing, with
 * uid/gid ENVD_DEFAULT_UID or the first id above free in both files, home
 * HOME_DIR/user and shell /bin/bash, and creates the home (owned by it)
 * when missing. Returns 0 or a negative errno. */
int envd_ensure_user(const struct envd_config *cfg);

/* kiln-init's side: forks a small supervisor that runs envd on the
 * `kiln.envd` port as root and starts it again (1 s later) whenever it
 * dies; a VM without the port (an older host) gets no envd. Call once,
 * after init_boot() and before anything blocks SIGCHLD. Returns the
 * supervisor's pid or a negative errno; never blocks. */
pid_t envd_spawn(void);

#endif
