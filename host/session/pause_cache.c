/* pause_cache: a session's latest pause chunks kept on this host, sealed
 * with the pause's key (see pause_cache.h). Every function is best effort:
 * a cache that cannot be written or read only sends the resume to S3. */
#include "pause_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "fsutil.h"
#include "io.h"
#include "task/task.h"

/* A sealed file: magic, a random nonce, the ciphertext, GCM's tag. */
#define SEAL_MAGIC     "KPC1"
#define SEAL_MAGIC_LEN 4
#define SEAL_NONCE_LEN 12
#define SEAL_TAG_LEN   16
#define SEAL_OVERHEAD  (SEAL_MAGIC_LEN + SEAL_NONCE_LEN + SEAL_TAG_LEN)

static int64_t wall_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int pcache_init(struct pause_cache *pc, const char *spool_dir, unsigned budget_mib, unsigned max_age_s)
{
	char root[PATH_MAX];

	memset(pc, 0, sizeof(*pc));
	if (snprintf(root, sizeof(root), "%s/pause-cache", spool_dir) >= (int)sizeof(root)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	if (!budget_mib) {
		fs_rmtree(root); /* turned off: nothing of an earlier run stays */
		return 0;
	}
	if (fs_mkdir_p(root, 0700) < 0)
		return -1;
	snprintf(pc->root, sizeof(pc->root), "%s", root);
	pc->budget = (uint64_t)budget_mib << 20;
	pc->max_age_ms = (int64_t)max_age_s * 1000;
	pcache_prune(pc, NULL, NULL);
	return 0;
}

int pcache_dir(const struct pause_cache *pc, const char *customer, const char *id, int create, char *out,
	       size_t cap)
{
	char cdir[PATH_MAX];

	out[0] = '\0';
	/* Ids checked as for every path kiln-host makes of them: no '/', no
	 * leading '.', bounded. */
	if (!pc->root[0] || !spool_id_ok(customer) || !spool_id_ok(id) ||
	    snprintf(cdir, sizeof(cdir), "%s/%s", pc->root, customer) >= (int)sizeof(cdir) ||
	    snprintf(out, cap, "%s/%s", cdir, id) >= (int)cap) {
		out[0] = '\0';
		return -1;
	}
	if (!create)
		return access(out, F_OK) == 0 ? 0 : (out[0] = '\0', -1);
	fs_rmtree(out);
	if ((mkdir(cdir, 0700) < 0 && errno != EEXIST) || mkdir(out, 0700) < 0) {
		out[0] = '\0';
		return -1;
	}
	return 0;
}

void pcache_drop(const struct pause_cache *pc, const char *customer, const char *id)
{
	char dir[PATH_MAX];

	if (pcache_dir(pc, customer, id, 0, dir, sizeof(dir)) == 0)
		fs_rmtree(dir);
}

struct pc_session {
	char path[PATH_MAX];
	uint64_t bytes;
	int64_t newest_ms;
	int keep;
};

static int older_first(const void *a, const void *b)
{
	const struct pc_session *x = a, *y = b;

	return (x->newest_ms > y->newest_ms) - (x->newest_ms < y->newest_ms);
}

/* One session's directory: files past the age limit go, the rest are
 * counted. */
static void scan_session(const struct pause_cache *pc, struct pc_session *s, int64_t now)
{
	DIR *d = opendir(s->path);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		struct stat st;
		int64_t mt;

		if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		mt = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
		if (!S_ISREG(st.st_mode) || now - mt > pc->max_age_ms) {
			fs_rmtree_at(dirfd(d), e->d_name);
			continue;
		}
		s->bytes += (uint64_t)st.st_size;
		if (mt > s->newest_ms)
			s->newest_ms = mt;
	}
	closedir(d);
}

void pcache_prune(const struct pause_cache *pc, const char *keep_customer, const char *keep_id)
{
	struct pc_session *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	int64_t now = wall_ms();
	DIR *cd;
	struct dirent *c;

	if (!pc->root[0] || !(cd = opendir(pc->root)))
		return;
	while ((c = readdir(cd))) {
		char cpath[PATH_MAX];
		DIR *sd;
		struct dirent *e;
		int any = 0;

		if (c->d_name[0] == '.' ||
		    snprintf(cpath, sizeof(cpath), "%s/%s", pc->root, c->d_name) >= (int)sizeof(cpath) ||
		    !(sd = opendir(cpath)))
			continue;
		while ((e = readdir(sd))) {
			struct pc_session s = { .newest_ms = 0 };

			if (e->d_name[0] == '.' ||
			    snprintf(s.path, sizeof(s.path), "%s/%s", cpath, e->d_name) >= (int)sizeof(s.path))
				continue;
			s.keep = keep_customer && keep_id && !strcmp(c->d_name, keep_customer) && !strcmp(e->d_name, keep_id);
			scan_session(pc, &s, now);
			if (!s.bytes && !s.keep) {
				rmdir(s.path); /* emptied by age (or never filled) */
				continue;
			}
			any = 1;
			total += s.bytes;
			if (n == cap) {
				struct pc_session *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof(*v));

				if (!nv)
					break;
				v = nv;
			}
			v[n++] = s;
		}
		closedir(sd);
		if (!any)
			rmdir(cpath);
	}
	closedir(cd);
	qsort(v, n, sizeof(*v), older_first);
	for (size_t i = 0; i < n && total > pc->budget; i++) {
		if (v[i].keep)
			continue;
		fs_rmtree(v[i].path);
		total -= v[i].bytes;
	}
	free(v);
}

int pcache_sweep(const struct pause_cache *pc, pcache_gone_fn gone, void *ctx)
{
	DIR *cd;
	struct dirent *c;
	int removed = 0;

	if (!pc->root[0] || !(cd = opendir(pc->root)))
		return 0;
	while ((c = readdir(cd))) {
		char cpath[PATH_MAX], spath[PATH_MAX];
		DIR *sd;
		struct dirent *e;

		if (c->d_name[0] == '.' || !spool_id_ok(c->d_name) ||
		    snprintf(cpath, sizeof(cpath), "%s/%s", pc->root, c->d_name) >= (int)sizeof(cpath) ||
		    !(sd = opendir(cpath)))
			continue;
		while ((e = readdir(sd))) {
			if (e->d_name[0] == '.' || !spool_id_ok(e->d_name) ||
			    snprintf(spath, sizeof(spath), "%s/%s", cpath, e->d_name) >= (int)sizeof(spath))
				continue;
			if (gone(ctx, c->d_name, e->d_name) == 1 && fs_rmtree(spath) == 0)
				removed++;
		}
		closedir(sd);
	}
	closedir(cd);
	/* Emptied customer directories go with the age and budget pass. */
	pcache_prune(pc, NULL, NULL);
	return removed;
}

int pcache_key_new(unsigned char key[PCACHE_KEY_LEN])
{
	return RAND_bytes(key, PCACHE_KEY_LEN) == 1 ? 0 : -1;
}

int pcache_key_parse(const char *hex, unsigned char key[PCACHE_KEY_LEN])
{
	if (!hex || strlen(hex) != 2 * PCACHE_KEY_LEN)
		return -1;
	for (size_t i = 0; i < PCACHE_KEY_LEN; i++) {
		unsigned v = 0;

		for (int k = 0; k < 2; k++) {
			char ch = hex[2 * i + (size_t)k];

			v <<= 4;
			if (ch >= '0' && ch <= '9')
				v |= (unsigned)(ch - '0');
			else if (ch >= 'a' && ch <= 'f')
				v |= (unsigned)(ch - 'a' + 10);
			else
				return -1;
		}
		key[i] = (unsigned char)v;
	}
	return 0;
}

void pcache_key_hex(const unsigned char key[PCACHE_KEY_LEN], char out[2 * PCACHE_KEY_LEN + 1])
{
	for (size_t i = 0; i < PCACHE_KEY_LEN; i++)
		snprintf(out + 2 * i, 3, "%02x", key[i]);
}

/* The file's path: dir/hex(HMAC-SHA256(key, sha)). Named by the manifest's
 * hash as such, a file would let anyone who can list the directory confirm
 * a guess of a chunk's bytes; keyed, the name means nothing without the
 * manifest. -1 if it does not fit. */
static int seal_path(const struct pcache_seal *seal, const char *sha, char *out, size_t cap)
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	char hex[2 * 32 + 1];

	if (!HMAC(EVP_sha256(), seal->key, PCACHE_KEY_LEN, (const unsigned char *)sha, strlen(sha), mac, &n) ||
	    n < 32)
		return -1;
	for (unsigned i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", mac[i]);
	return snprintf(out, cap, "%s/%s", seal->dir, hex) < (int)cap ? 0 : -1;
}

int pcache_put(const struct pcache_seal *seal, const char *sha, const void *z, size_t n)
{
	char path[PATH_MAX], tmp[PATH_MAX + 16];
	unsigned char *out = NULL;
	EVP_CIPHER_CTX *cx = NULL;
	int fd = -1, len = 0, r = -1;

	if (!seal->dir[0] || n > INT32_MAX - SEAL_OVERHEAD || seal_path(seal, sha, path, sizeof(path)) < 0)
		return -1;
	if (!(out = malloc(n + SEAL_OVERHEAD)) || !(cx = EVP_CIPHER_CTX_new()))
		goto out;
	memcpy(out, SEAL_MAGIC, SEAL_MAGIC_LEN);
	/* A random nonce per file: a key seals at most a pause's few thousand
	 * chunks, far below where random 96-bit nonces could repeat. */
	if (RAND_bytes(out + SEAL_MAGIC_LEN, SEAL_NONCE_LEN) != 1 ||
	    EVP_EncryptInit_ex(cx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
	    EVP_CIPHER_CTX_ctrl(cx, EVP_CTRL_GCM_SET_IVLEN, SEAL_NONCE_LEN, NULL) != 1 ||
	    EVP_EncryptInit_ex(cx, NULL, NULL, seal->key, out + SEAL_MAGIC_LEN) != 1 ||
	    /* The hash as associated data: a sealed chunk opens only as itself. */
	    EVP_EncryptUpdate(cx, NULL, &len, (const unsigned char *)sha, (int)strlen(sha)) != 1 ||
	    EVP_EncryptUpdate(cx, out + SEAL_MAGIC_LEN + SEAL_NONCE_LEN, &len, z, (int)n) != 1 ||
	    EVP_EncryptFinal_ex(cx, out + SEAL_MAGIC_LEN + SEAL_NONCE_LEN + len, &len) != 1 ||
	    EVP_CIPHER_CTX_ctrl(cx, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_LEN, out + SEAL_MAGIC_LEN + SEAL_NONCE_LEN + n) != 1)
		goto out;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		goto out;
	r = io_write_all(fd, out, n + SEAL_OVERHEAD);
	if (close(fd) < 0 || r < 0 || rename(tmp, path) < 0) {
		r = -1;
		unlink(tmp);
	}
	fd = -1;
out:
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	EVP_CIPHER_CTX_free(cx);
	free(out);
	return r;
}

int pcache_get(const struct pcache_seal *seal, const char *sha, void *z, size_t n)
{
	char path[PATH_MAX];
	unsigned char head[SEAL_MAGIC_LEN + SEAL_NONCE_LEN], tag[SEAL_TAG_LEN];
	EVP_CIPHER_CTX *cx = NULL;
	struct stat st;
	int fd, len = 0, r = -1;

	if (!seal->dir[0] || n > INT32_MAX - SEAL_OVERHEAD || seal_path(seal, sha, path, sizeof(path)) < 0)
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -1; /* not kept (or gone): nothing to remove */
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != n + SEAL_OVERHEAD ||
	    io_read_all(fd, head, sizeof(head)) != (ssize_t)sizeof(head) || memcmp(head, SEAL_MAGIC, SEAL_MAGIC_LEN) ||
	    /* The ciphertext is read into z and opened in place (GCM allows it):
	     * no second chunk-sized buffer on the resume's path. */
	    io_read_all(fd, z, n) != (ssize_t)n ||
	    io_read_all(fd, tag, sizeof(tag)) != (ssize_t)sizeof(tag) || !(cx = EVP_CIPHER_CTX_new()))
		goto out;
	if (EVP_DecryptInit_ex(cx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
	    EVP_CIPHER_CTX_ctrl(cx, EVP_CTRL_GCM_SET_IVLEN, SEAL_NONCE_LEN, NULL) != 1 ||
	    EVP_DecryptInit_ex(cx, NULL, NULL, seal->key, head + SEAL_MAGIC_LEN) != 1 ||
	    EVP_DecryptUpdate(cx, NULL, &len, (const unsigned char *)sha, (int)strlen(sha)) != 1 ||
	    EVP_DecryptUpdate(cx, z, &len, z, (int)n) != 1 ||
	    EVP_CIPHER_CTX_ctrl(cx, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_LEN, tag) != 1 ||
	    EVP_DecryptFinal_ex(cx, (unsigned char *)z + len, &len) != 1)
		goto out;
	r = 0;
out:
	close(fd);
	EVP_CIPHER_CTX_free(cx);
	if (r < 0) {
		/* Whatever z holds now is not to be used. */
		OPENSSL_cleanse(z, n);
		fprintf(stderr, "kiln-host: %s: does not open as the chunk the manifest names; fetching it from S3\n",
			path);
		unlink(path);
	}
	return r;
}

void pcache_keep_only(const struct pcache_seal *seal, const char *const *shas, size_t n)
{
	char (*names)[PATH_MAX] = n ? calloc(n, sizeof(*names)) : NULL;
	DIR *d;
	struct dirent *e;

	if ((n && !names) || !seal->dir[0]) {
		free(names);
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (seal_path(seal, shas[i], names[i], sizeof(names[i])) < 0)
			names[i][0] = '\0';
	if ((d = opendir(seal->dir))) {
		while ((e = readdir(d))) {
			char path[PATH_MAX];
			size_t i;

			if (e->d_name[0] == '.' ||
			    snprintf(path, sizeof(path), "%s/%s", seal->dir, e->d_name) >= (int)sizeof(path))
				continue;
			for (i = 0; i < n && strcmp(names[i], path); i++)
				;
			if (i == n)
				unlink(path);
		}
		closedir(d);
	}
	free(names);
}
