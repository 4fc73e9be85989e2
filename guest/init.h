/* init: kiln-init's boot (mounts, switch to the root disk, host channel) and
 * its last resort on fatal errors (console message, reboot: QEMU exits). */
#ifndef KILN_GUEST_INIT_H
#define KILN_GUEST_INIT_H

/* Name of the virtio-serial port that carries the host-guest protocol. */
#define INIT_PORT_NAME "kiln.agent"

/* Brings the guest up from the initramfs: fds 0-2, devtmpfs and proc, waits
 * (bounded) for /dev/vda, mounts it on /newroot and makes it the root, mounts
 * /proc, /sys, /dev, /dev/pts, /dev/shm, /tmp, /run there, raises `lo`, sets
 * the hostname and protects PID 1 from the OOM killer. Calls init_die() on
 * anything a task could not run without. PID 1 only, before any other thread
 * or child exists. */
void init_boot(void);

/* Waits (bounded) for the virtio-serial port called `name` to appear and
 * opens it O_RDWR | O_NONBLOCK | O_CLOEXEC. Returns the fd; calls init_die()
 * when it does not show up in time. */
int init_open_port(const char *name);

/* Looks for the port once, without waiting or dying: returns an open fd
 * (as init_open_port), -ENOENT when it is not there (yet), or another
 * negative errno. For envd, whose port an older host does not add. */
int init_find_port(const char *name);

/* 1 when at least one virtio port exists and every one has its name (the
 * host has announced them all), else 0. */
int init_ports_named(void);

/* Make chan (a virtio-serial port, or a socketpair end in tests) a
 * non-blocking channel that raises SIGIO for this process, block SIGCHLD and
 * SIGIO, ignore SIGPIPE (a write to a closed socketpair must be an error,
 * not death), and return a signalfd for SIGCHLD and SIGIO; -1 with errno set
 * on failure (nothing left open). SIGIO is how a port that polls as hung up
 * says the host (re)connected; SIGCHLD is reaped in the event loop. */
int init_channel_signals(int chan);

/* Writes "kiln-init: <message>\n" to fd 2 (the console once init_boot() has
 * run) in a single write. For errors only: the serial console is slow under
 * TCG. Callable from anywhere, including a forked child before exec. */
/* In a child about to exec a task or a process: every signal back to its
 * default and none blocked. kiln-init blocks SIGCHLD and SIGIO and ignores
 * SIGPIPE, and the mask and ignored signals survive exec. */
void init_child_signals(void);

/* Writes text to path (a /proc or /sys knob) in one write: 0 or -errno. */
int init_write_file(const char *path, const char *text);

void init_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Logs the message, waits for the console to drain and reboots; with
 * `-no-reboot` QEMU exits, which is how the host learns the guest died.
 * Never returns. */
void init_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
