/* up_tls: the TLS material kiln up gives kiln-api so that a sandbox's ports
 * answer at https://<port>-<id>.<domain> on one machine (docs/api.md "TLS
 * and the sandbox domain"): a local certificate authority made once per
 * directory (DIR/tls/ca.pem, its key ca.key, 0600), a certificate for
 * `*.<domain>`, `<domain>`, `localhost` and 127.0.0.1 signed by it
 * (cert.pem, key.pem; made again when it is missing, for another domain, or
 * within 30 days of its end), and ca-bundle.pem, the system's authorities
 * plus this one (for SSL_CERT_FILE and REQUESTS_CA_BUNDLE). Keys are EC
 * P-256, made with OpenSSL's libcrypto. Nothing here is trusted beyond the
 * shells that source DIR/credentials. */
#include "up_tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "fsutil.h"
#include "io.h"

#define UP_TLS_DAYS 365
#define UP_CA_DAYS 3650
#define UP_RENEW_DAYS 30
#define SYSTEM_BUNDLE "/etc/ssl/certs/ca-certificates.crt"

static EVP_PKEY *new_key(void)
{
	return EVP_EC_gen("P-256");
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509_EXTENSION *ext;
	int ok;

	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
	ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	if (!ext)
		return -1;
	ok = X509_add_ext(cert, ext, -1);
	X509_EXTENSION_free(ext);
	return ok ? 0 : -1;
}

/* A certificate for key with subject cn, signed by ca_key (issuer ca, NULL:
 * itself), valid for days. */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *ca, EVP_PKEY *ca_key, int days, const char *san)
{
	X509 *c = X509_new();
	unsigned char serial[16];
	BIGNUM *bn = NULL;
	X509_NAME *name;

	if (!c || RAND_bytes(serial, sizeof(serial)) != 1)
		goto fail;
	serial[0] &= 0x7f;
	bn = BN_bin2bn(serial, sizeof(serial), NULL);
	if (!bn || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(c)))
		goto fail;
	X509_set_version(c, 2);
	X509_gmtime_adj(X509_getm_notBefore(c), -3600);
	X509_gmtime_adj(X509_getm_notAfter(c), (long)days * 86400);
	X509_set_pubkey(c, key);
	name = X509_get_subject_name(c);
	X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"kiln up", -1, -1, 0);
	X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
	X509_set_issuer_name(c, ca ? X509_get_subject_name(ca) : name);
	if (!ca) {
		if (add_ext(c, c, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") < 0 ||
		    add_ext(c, c, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
		    add_ext(c, c, NID_subject_key_identifier, "hash") < 0)
			goto fail;
	} else if (add_ext(c, ca, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
		   add_ext(c, ca, NID_key_usage, "critical,digitalSignature") < 0 ||
		   add_ext(c, ca, NID_ext_key_usage, "serverAuth") < 0 ||
		   add_ext(c, ca, NID_subject_alt_name, san) < 0 ||
		   add_ext(c, ca, NID_authority_key_identifier, "keyid:always") < 0) {
		goto fail;
	}
	if (!X509_sign(c, ca_key, EVP_sha256()))
		goto fail;
	BN_free(bn);
	return c;
fail:
	BN_free(bn);
	X509_free(c);
	return NULL;
}

static int write_pem(const char *path, X509 *cert, EVP_PKEY *key)
{
	char tmp[PATH_MAX + 8];
	FILE *f;
	int ok;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	unlink(tmp);
	f = fopen(tmp, "wex");
	if (!f)
		return -1;
	fchmod(fileno(f), key ? 0600 : 0644);
	ok = cert ? PEM_write_X509(f, cert) : PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL);
	if (fclose(f) || !ok || rename(tmp, path)) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

static int write_bytes(const char *path, const char *p, size_t n)
{
	char tmp[PATH_MAX + 8];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	unlink(tmp);
	f = fopen(tmp, "wex");
	if (!f)
		return -1;
	if ((fwrite(p, 1, n, f) != n) | (fclose(f) != 0) || rename(tmp, path)) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* A PEM file's certificate (key 0) or private key (key 1); NULL when it
 * has none. */
static void *read_pem(const char *path, int key)
{
	FILE *f = fopen(path, "re");
	void *v;

	if (!f)
		return NULL;
	v = key ? (void *)PEM_read_PrivateKey(f, NULL, NULL, NULL) : (void *)PEM_read_X509(f, NULL, NULL, NULL);
	fclose(f);
	return v;
}

/* Whether cert still serves domain for at least UP_RENEW_DAYS and was signed by ca. */
static int cert_fits(X509 *cert, X509 *ca, const char *host)
{
	char wild[300];
	int days = 0, secs = 0;
	EVP_PKEY *pub = ca ? X509_get0_pubkey(ca) : NULL;

	snprintf(wild, sizeof(wild), "x.%s", host);
	return cert && pub && X509_verify(cert, pub) == 1 && X509_check_host(cert, wild, 0, 0, NULL) == 1 &&
	       ASN1_TIME_diff(&days, &secs, NULL, X509_get0_notAfter(cert)) && days >= UP_RENEW_DAYS;
}

int up_tls_make(const char *dir, const char *domain, struct up_tls *out, char *why, size_t why_len)
{
	char host[256], san[800], path[PATH_MAX];
	EVP_PKEY *ca_key = NULL, *key = NULL;
	X509 *ca = NULL, *cert = NULL;
	size_t n = strcspn(domain, ":");
	int rc = -1;

	if (n >= sizeof(host)) {
		snprintf(why, why_len, "the domain is too long");
		return -1;
	}
	memcpy(host, domain, n);
	host[n] = 0;
	snprintf(out->dir, sizeof(out->dir), "%s/tls", dir);
	if (fs_mkdir_p(out->dir, 0700) < 0) {
		snprintf(why, why_len, "%s: %s", out->dir, strerror(errno));
		return -1;
	}
	snprintf(out->ca, sizeof(out->ca), "%s/ca.pem", out->dir);
	snprintf(out->cert, sizeof(out->cert), "%s/cert.pem", out->dir);
	snprintf(out->key, sizeof(out->key), "%s/key.pem", out->dir);
	snprintf(out->bundle, sizeof(out->bundle), "%s/ca-bundle.pem", out->dir);
	snprintf(path, sizeof(path), "%s/ca.key", out->dir);
	ca = read_pem(out->ca, 0);
	ca_key = read_pem(path, 1);
	if (!ca || !ca_key || X509_check_private_key(ca, ca_key) != 1) {
		X509_free(ca);
		EVP_PKEY_free(ca_key);
		ca_key = new_key();
		ca = ca_key ? make_cert(ca_key, "kiln up local CA", NULL, ca_key, UP_CA_DAYS, NULL) : NULL;
		if (!ca || write_pem(path, NULL, ca_key) < 0 || write_pem(out->ca, ca, NULL) < 0) {
			snprintf(why, why_len, "cannot make the local CA in %s", out->dir);
			goto out;
		}
	}
	cert = read_pem(out->cert, 0);
	key = read_pem(out->key, 1);
	if (!key || !cert_fits(cert, ca, host) || X509_check_private_key(cert, key) != 1) {
		X509_free(cert);
		EVP_PKEY_free(key);
		snprintf(san, sizeof(san), "DNS:*.%s,DNS:%s,DNS:localhost,IP:127.0.0.1,IP:::1", host, host);
		key = new_key();
		cert = key ? make_cert(key, host, ca, ca_key, UP_TLS_DAYS, san) : NULL;
		if (!cert || write_pem(out->key, NULL, key) < 0 || write_pem(out->cert, cert, NULL) < 0) {
			snprintf(why, why_len, "cannot make the certificate for *.%s in %s", host, out->dir);
			goto out;
		}
	}
	{
		/* The system's authorities and ours, for clients that take one file. */
		size_t sl = 0, cl = 0;
		char *sys = io_read_file(SYSTEM_BUNDLE, 16u << 20, &sl), *mine = io_read_file(out->ca, 1u << 20, &cl);
		char *all = mine ? malloc(sl + cl + 2) : NULL;

		if (all) {
			memcpy(all, sys ? sys : "", sl);
			all[sl] = '\n';
			memcpy(all + sl + 1, mine, cl);
		}
		rc = all && write_bytes(out->bundle, all, sl + 1 + cl) == 0 ? 0 : -1;
		if (rc < 0)
			snprintf(why, why_len, "cannot write %s", out->bundle);
		free(all);
		free(sys);
		free(mine);
	}
out:
	X509_free(ca);
	X509_free(cert);
	EVP_PKEY_free(ca_key);
	EVP_PKEY_free(key);
	return rc;
}
