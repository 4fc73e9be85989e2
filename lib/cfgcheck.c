/* cfgcheck: the check-config report and the checks kiln-api and kiln-host
 * share (cfgcheck.h). Read-only: it probes, it never creates. */
#include "cfgcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "err.h"

void cfgcheck_use(struct cfgcheck *c, const char *setting, const char *fmt, ...)
{
	va_list ap;

	fprintf(c->out, "  %-22s ", setting);
	va_start(ap, fmt);
	vfprintf(c->out, fmt, ap);
	va_end(ap);
	fputc('\n', c->out);
}

/* One line per problem: libraries' messages (libpq, nftables) may hold
 * newlines of their own. */
static void problem(struct cfgcheck *c, const char *kind, const char *setting, const char *fmt, va_list ap)
{
	char msg[1024];
	size_t n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
		msg[--n] = '\0';
	for (char *p = msg; *p; p++)
		if (*p == '\n' || *p == '\r' || *p == '\t')
			*p = ' ';
	fprintf(c->problems, "%s: %s: %s\n", kind, setting, msg);
}

void cfgcheck_error(struct cfgcheck *c, const char *setting, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	problem(c, "error", setting, fmt, ap);
	va_end(ap);
	c->errors++;
}

void cfgcheck_warn(struct cfgcheck *c, const char *setting, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	problem(c, "warning", setting, fmt, ap);
	va_end(ap);
	c->warnings++;
}

int cfgcheck_dir(struct cfgcheck *c, const char *setting, const char *dir)
{
	char probe[PATH_MAX], *slash;
	struct statvfs vfs;
	struct stat st;
	uint64_t free_mib;

	if (!dir || !*dir) {
		cfgcheck_error(c, setting, "empty path");
		return -1;
	}
	if (strlen(dir) >= sizeof(probe)) {
		cfgcheck_error(c, setting, "path longer than %d bytes", PATH_MAX - 1);
		return -1;
	}
	/* The nearest ancestor that exists is where the daemon's mkdir -p would
	 * start: it must be a directory we may write in. */
	strcpy(probe, dir);
	while (stat(probe, &st) < 0) {
		if (errno != ENOENT && errno != ENOTDIR) { /* ENOTDIR: a file on the way, reported below */
			cfgcheck_error(c, setting, "%s: %s", probe, strerror(errno));
			return -1;
		}
		slash = strrchr(probe, '/');
		if (!slash) {
			strcpy(probe, ".");
		} else if (slash == probe) {
			strcpy(probe, "/");
		} else {
			*slash = '\0';
		}
	}
	if (!S_ISDIR(st.st_mode)) {
		cfgcheck_error(c, setting, "%s is not a directory (needed for %s)", probe, dir);
		return -1;
	}
	if (access(probe, W_OK | X_OK) < 0) {
		cfgcheck_error(c, setting, "%s is not writable: %s%s", probe, strerror(errno),
			       strcmp(probe, dir) ? " (cannot create the directory)" : "");
		return -1;
	}
	if (statvfs(probe, &vfs) < 0) {
		cfgcheck_error(c, setting, "%s: statvfs: %s", probe, strerror(errno));
		return -1;
	}
	free_mib = (uint64_t)vfs.f_bavail * vfs.f_frsize >> 20;
	cfgcheck_use(c, setting, "%s (%s, %llu MiB free)", dir, strcmp(probe, dir) ? "will be created" : "writable",
		     (unsigned long long)free_mib);
	if (free_mib < CFGCHECK_DISK_LOW_MIB)
		cfgcheck_warn(c, setting, "only %llu MiB free under %s (below %u MiB)", (unsigned long long)free_mib,
			      dir, CFGCHECK_DISK_LOW_MIB);
	return 0;
}

int cfgcheck_file(struct cfgcheck *c, const char *setting, const char *path)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		cfgcheck_error(c, setting, "cannot read %s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		cfgcheck_error(c, setting, "%s is not a regular file", path);
		return -1;
	}
	close(fd);
	cfgcheck_use(c, setting, "%s (%llu bytes)", path, (unsigned long long)st.st_size);
	return 0;
}

static int stop_at_first(void *ctx, const char *key)
{
	return 1;
}

int cfgcheck_s3(struct cfgcheck *c, const char *setting, const struct s3_config *s3)
{
	struct s3_config probe = *s3;
	struct kiln_err err = { .code = "" };
	const char *bucket = s3->bucket && *s3->bucket ? s3->bucket : "(named by the endpoint)";

	cfgcheck_use(c, setting, "%s bucket %s region %s", s3->endpoint, bucket, s3->region ? s3->region : "-");
	probe.timeout_s = CFGCHECK_TIMEOUT_S;
	probe.attempts = 1;
	/* A listing under a prefix nobody writes: one request that needs the
	 * endpoint, the credentials and the bucket, and changes nothing. */
	if (s3_list(&probe, "kiln-check-config/", stop_at_first, NULL, &err) < 0) {
		cfgcheck_error(c, setting, "endpoint %s bucket %s: %s (%s)", s3->endpoint, bucket, err.message, err.code);
		return -1;
	}
	return 0;
}
