/* interp: the template's code interpreter service (guest/interpreter.py in
 * the `code-interpreter` image), started by kiln-init at boot when the image
 * names one in /etc/kiln/interpreter, kept running by a supervisor like
 * envd's, ready before the template's snapshot is taken (PREPARE waits for
 * it) and told after every restore to reseed its random state. */
#ifndef KILN_GUEST_INTERP_H
#define KILN_GUEST_INTERP_H

#include <stdint.h>
#include <sys/types.h>

/* The file naming the program (one absolute path on its first line). */
#define INTERP_CONF "/etc/kiln/interpreter"

struct interp {
	pid_t sup;  /* the supervisor (0: this image has no interpreter) */
	int ready;  /* read end: a byte each time an instance is ready, or -1 */
	int reseed; /* write end of the instances' stdin: a byte after a restore, or -1 */
	int is_ready; /* a ready byte was read */
};

/* Forks the supervisor when INTERP_CONF names a program, else leaves
 * i->sup 0. Call before anything blocks signals (as envd_spawn). Returns 0
 * or a negative errno. */
int interp_spawn(struct interp *i);

/* Waits until the service said it is ready (its imports and warm-up done),
 * up to deadline_ms (proto_now_ms clock). 0 at once when there is none or
 * it already said so; -ETIMEDOUT, or -EPIPE when every instance died. */
int interp_wait_ready(struct interp *i, int64_t deadline_ms);

/* After a snapshot restore (SETUP): the service's next cells reseed Python's
 * and numpy's random state from the (reseeded) kernel. Never blocks. */
void interp_reseed(struct interp *i);

/* Whether pid belongs to the service (the supervisor, the service, its fork
 * server or a context's interpreter): processes that wait for requests and
 * do not keep a sandbox busy. What a cell starts is deeper and counts. */
int interp_owns(const struct interp *i, long pid, long ppid);

#endif
