/* creds: where the kiln CLI finds the API and its keys: the environment
 * (KILN_API, KILN_KEY, KILN_ADMIN_KEY, S3_*), else the credentials file that
 * `kiln up` writes (KILN_CREDENTIALS, else /var/lib/kiln/up/credentials). */
#ifndef KILN_CLI_CREDS_H
#define KILN_CLI_CREDS_H

#include <stddef.h>

#include "err.h"

#define CREDS_DEFAULT_FILE "/var/lib/kiln/up/credentials"

struct creds {
	char api[512], key[512], admin_key[512];
	char s3_endpoint[512], s3_bucket[256];
	char ca_file[1024]; /* KILN_CA_FILE: the CA verifying an https:// API ("": the system's) */
	char file[4096]; /* the credentials file consulted */
	int file_found;  /* it exists */
};

/* Fill c: each variable from the environment when set, else from the
 * credentials file (missing file: fields stay ""). A file that exists but
 * cannot be read is an error (-1, err set). */
int creds_load(struct creds *c, struct kiln_err *err);

/* Parse one "NAME=VALUE" line of a credentials file (VALUE optionally in
 * single or double quotes). Returns 1 with name/value filled, 0 for blank
 * lines and comments, -1 for anything else. */
int creds_parse_line(const char *line, char *name, size_t name_size, char *value, size_t value_size);

#endif
