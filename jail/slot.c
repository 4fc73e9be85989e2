/* slot: which unprivileged uid/gid a jail runs as. Slot n is uid and gid
 * uid_base + n, held by an flock on <slot_dir>/<n>.lock for the jail's
 * lifetime (the kernel drops it when the owner dies, whatever kills it).
 * Several kiln-host processes may share the range. */
#include "jail_int.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

#include "fsutil.h"

/* The lock file names its holder's memory cgroup: a slot whose previous jail
 * still has processes (its owner was killed a moment ago and the jail is
 * still dying) is skipped, so two live jails never share a uid. */
int slot_take(const struct jail_config *c, struct jail *j, const char *memcg, struct kiln_err *err)
{
	unsigned start;
	int r;

	if ((r = fs_mkdir_p(c->slot_dir, 0700)) < 0)
		return kiln_err_set(err, KERR_HOST_ERROR, "jail: cannot create %s: %s", c->slot_dir, strerror(-r));
	/* A random start spreads concurrent hosts over the range. */
	if (getrandom(&start, sizeof(start), 0) != sizeof(start))
		start = (unsigned)getpid();
	for (unsigned i = 0; i < c->slots; i++) {
		unsigned n = (start + i) % c->slots;
		char path[400], prev[700];
		ssize_t len;
		int fd;

		snprintf(path, sizeof(path), "%s/%u.lock", c->slot_dir, n);
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: %s", path, strerror(errno));
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			close(fd);
			continue;
		}
		len = pread(fd, prev, sizeof(prev) - 1, 0);
		prev[len > 0 ? len : 0] = '\0';
		prev[strcspn(prev, "\n")] = '\0';
		if (prev[0] == '/' && cg_populated(prev)) {
			close(fd);
			continue;
		}
		if (ftruncate(fd, 0) < 0 || pwrite(fd, memcg, strlen(memcg), 0) < 0) {
			r = errno;
			close(fd);
			return kiln_err_set(err, KERR_HOST_ERROR, "jail: %s: %s", path, strerror(r));
		}
		j->slot = (int)n;
		j->slot_fd = fd;
		j->uid = c->uid_base + n;
		j->gid = c->uid_base + n;
		return 0;
	}
	return kiln_err_set(err, KERR_NO_CAPACITY, "jail: all %u slots in %s are in use", c->slots, c->slot_dir);
}
