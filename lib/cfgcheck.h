/* cfgcheck: the report `kiln-api check-config` and `kiln-host check-config`
 * print (README "Checking a configuration"): one line per setting that would
 * be used, one line per problem naming the setting, and the checks both
 * daemons share (a directory that must be writable, free disk, S3
 * reachability). Nothing here changes the system: no directory is created,
 * no object written. */
#ifndef KILN_CFGCHECK_H
#define KILN_CFGCHECK_H

#include <stdint.h>
#include <stdio.h>

#include "s3.h"

#define CFGCHECK_DISK_LOW_MIB 1024 /* less free than this under a directory: a warning */
#define CFGCHECK_TIMEOUT_S 5       /* per network probe (S3, PostgreSQL, kiln-api) */

struct cfgcheck {
	FILE *out;      /* the settings (stdout) */
	FILE *problems; /* the errors and warnings (stderr) */
	int errors, warnings;
};

/* "  SETTING  VALUE" on out: what would be used. */
void cfgcheck_use(struct cfgcheck *c, const char *setting, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* "error: SETTING: MESSAGE" on problems; counted. */
void cfgcheck_error(struct cfgcheck *c, const char *setting, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* "warning: SETTING: MESSAGE" on problems; counted, not fatal. */
void cfgcheck_warn(struct cfgcheck *c, const char *setting, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The directory dir (setting names it) exists and is writable, or can be
 * created (its nearest existing ancestor is a writable directory); the free
 * space of its file system is reported, with a warning under
 * CFGCHECK_DISK_LOW_MIB. 0 or -1 (an error was reported). */
int cfgcheck_dir(struct cfgcheck *c, const char *setting, const char *dir);

/* The regular file path can be opened for reading. 0 or -1 (reported). */
int cfgcheck_file(struct cfgcheck *c, const char *setting, const char *path);

/* TLS material, loaded with GnuTLS as the listeners load it. The pair:
 * cert_file is a PEM certificate, key_file its key (they load as one
 * pair); the subject and expiry are reported, an expired certificate is a
 * warning. prefix names the section ("tls"): settings PREFIX.cert_file and
 * PREFIX.key_file. 0 or -1 (reported). */
int cfgcheck_tls_pair(struct cfgcheck *c, const char *prefix, const char *cert_file, const char *key_file);

/* ca_file (setting names it) holds one or more PEM certificates to verify
 * peers with; how many is reported. 0 or -1 (reported). */
int cfgcheck_ca_file(struct cfgcheck *c, const char *setting, const char *ca_file);

/* One ListObjectsV2 request on the bucket (a short timeout, one attempt):
 * the endpoint answers, the credentials are accepted and the bucket
 * exists. setting: "s3". Needs s3_global_init. 0 or -1 (reported, naming
 * the endpoint and the bucket). */
int cfgcheck_s3(struct cfgcheck *c, const char *setting, const struct s3_config *s3);

#endif
