/* cfgcheck: the check-config report and the checks kiln-api and kiln-host
 * share (cfgcheck.h). Read-only: it probes, it never creates. */
#include "cfgcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <limits.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "err.h"
#include "io.h"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

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

#define CFGCHECK_PEM_MAX (1u << 20)

/* path's PEM text (malloc'd), or NULL with an error reported. */
static char *read_pem(struct cfgcheck *c, const char *setting, const char *path)
{
	size_t n = 0;
	char *p = path ? io_read_file(path, CFGCHECK_PEM_MAX, &n) : NULL;

	if (!path)
		cfgcheck_error(c, setting, "not set");
	else if (!p)
		cfgcheck_error(c, setting, "cannot read %s: %s", path, strerror(errno));
	else if (!n)
		cfgcheck_error(c, setting, "%s is empty", path);
	else if (!strstr(p, "-----BEGIN "))
		cfgcheck_error(c, setting, "%s is not PEM", path);
	else
		return p;
	free(p);
	return NULL;
}

int cfgcheck_tls_pair(struct cfgcheck *c, const char *prefix, const char *cert_file, const char *key_file)
{
	gnutls_certificate_credentials_t cred = NULL;
	gnutls_x509_crt_t crt = NULL;
	gnutls_datum_t cd, kd, dn = { 0 };
	char cs[64], ks[64], when[32], *cert, *key = NULL;
	time_t expires;
	int r, rc = -1;

	snprintf(cs, sizeof(cs), "%s.cert_file", prefix);
	snprintf(ks, sizeof(ks), "%s.key_file", prefix);
	if (!(cert = read_pem(c, cs, cert_file)) || !(key = read_pem(c, ks, key_file)))
		goto out;
	cd = (gnutls_datum_t){ (unsigned char *)cert, (unsigned)strlen(cert) };
	kd = (gnutls_datum_t){ (unsigned char *)key, (unsigned)strlen(key) };
	if (gnutls_x509_crt_init(&crt) < 0 || gnutls_certificate_allocate_credentials(&cred) < 0) {
		cfgcheck_error(c, prefix, "gnutls: out of memory");
		goto out;
	}
	r = gnutls_x509_crt_import(crt, &cd, GNUTLS_X509_FMT_PEM);
	if (r < 0) {
		cfgcheck_error(c, cs, "%s is not a PEM certificate: %s", cert_file, gnutls_strerror(r));
		goto out;
	}
	r = gnutls_certificate_set_x509_key_mem(cred, &cd, &kd, GNUTLS_X509_FMT_PEM);
	if (r == GNUTLS_E_CERTIFICATE_KEY_MISMATCH) {
		cfgcheck_error(c, ks, "%s is not the key of %s", key_file, cert_file);
		goto out;
	}
	if (r < 0) {
		cfgcheck_error(c, ks, "%s and %s do not load as a pair: %s", cert_file, key_file, gnutls_strerror(r));
		goto out;
	}
	expires = gnutls_x509_crt_get_expiration_time(crt);
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", gmtime(&expires));
	if (gnutls_x509_crt_get_dn3(crt, &dn, 0) < 0)
		dn.data = NULL;
	cfgcheck_use(c, cs, "%s (%s, expires %s)", cert_file, dn.data ? (const char *)dn.data : "?", when);
	cfgcheck_use(c, ks, "%s (matches the certificate)", key_file);
	if (expires != (time_t)-1 && expires < time(NULL))
		cfgcheck_warn(c, cs, "%s expired on %s", cert_file, when);
	gnutls_free(dn.data);
	rc = 0;
out:
	if (cred)
		gnutls_certificate_free_credentials(cred);
	if (crt)
		gnutls_x509_crt_deinit(crt);
	free(cert);
	free(key);
	return rc;
}

int cfgcheck_ca_file(struct cfgcheck *c, const char *setting, const char *ca_file)
{
	gnutls_x509_crt_t *list = NULL;
	unsigned n = 0;
	char *pem = read_pem(c, setting, ca_file);
	gnutls_datum_t d;
	int r;

	if (!pem)
		return -1;
	d = (gnutls_datum_t){ (unsigned char *)pem, (unsigned)strlen(pem) };
	r = gnutls_x509_crt_list_import2(&list, &n, &d, GNUTLS_X509_FMT_PEM, 0);
	free(pem);
	if (r < 0 || !n) {
		cfgcheck_error(c, setting, "%s holds no PEM certificate: %s", ca_file, r < 0 ? gnutls_strerror(r) : "none");
		return -1;
	}
	for (unsigned i = 0; i < n; i++)
		gnutls_x509_crt_deinit(list[i]);
	gnutls_free(list);
	cfgcheck_use(c, setting, "%s (%u certificate%s)", ca_file, n, n == 1 ? "" : "s");
	return 0;
}
