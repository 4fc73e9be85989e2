/* up_tls: kiln up's local certificate authority and the certificate for
 * its sandbox domain (up_tls.c). */
#ifndef KILN_CLI_UP_TLS_H
#define KILN_CLI_UP_TLS_H

#include <limits.h>
#include <stddef.h>

struct up_tls {
	char dir[PATH_MAX];          /* DIR/tls */
	char ca[PATH_MAX];           /* the CA's certificate (NODE_EXTRA_CA_CERTS) */
	char cert[PATH_MAX], key[PATH_MAX]; /* kiln-api's tls.cert_file, tls.key_file */
	char bundle[PATH_MAX];       /* the system's authorities and the CA (SSL_CERT_FILE) */
};

/* Make (or keep, when still good) DIR/tls's CA and the certificate for
 * `*.<domain>` (domain may carry :PORT, which certificates ignore). 0 with
 * *out filled, or -1 with why. */
int up_tls_make(const char *dir, const char *domain, struct up_tls *out, char *why, size_t why_len);

#endif
