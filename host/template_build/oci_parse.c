/* oci_parse: the parsers of the OCI import over data the customer wrote:
 * the archive's tar headers, index.json, the manifest, the image config, the
 * image's /etc/passwd and /etc/group, and umoci's rootless owner xattr. No
 * I/O but pread on the archive; every length bounded; fuzzed by
 * tests/fuzz/fuzz_oci.c. */
#include "oci_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the archive ----------------------------------------------------------- */

/* A tar header's octal number field (NUL/space terminated; GNU base-256 for
 * large sizes). -1 when malformed. */
static int64_t tar_number(const unsigned char *f, size_t n)
{
	uint64_t v = 0;
	size_t i = 0;

	if (n && (f[0] & 0x80)) {
		/* base-256: the rest of the field big-endian, first byte's low bits too. */
		v = f[0] & 0x3f;
		for (i = 1; i < n; i++) {
			if (v >> 55)
				return -1;
			v = (v << 8) | f[i];
		}
		return (int64_t)v;
	}
	while (i < n && f[i] == ' ')
		i++;
	for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
		if (v >> 60)
			return -1;
		v = v * 8 + (uint64_t)(f[i] - '0');
	}
	if (i < n && f[i] != ' ' && f[i] != '\0')
		return -1;
	return (int64_t)v;
}

/* 1 when the 512-byte block is a tar header whose checksum matches. */
static int tar_header_ok(const unsigned char *h)
{
	int64_t want = tar_number(h + 148, 8);
	uint64_t sum = 0;

	if (want < 0)
		return 0;
	for (size_t i = 0; i < 512; i++)
		sum += (i >= 148 && i < 156) ? ' ' : h[i];
	return (int64_t)sum == want;
}

static int all_zero(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

/* The name "./x" or "x" (top level, no trailing slash) as x; NULL otherwise. */
static const char *top_name(const char *name)
{
	if (name[0] == '.' && name[1] == '/')
		name += 2;
	return strchr(name, '/') ? NULL : name;
}

int oci_tar_kind(int fd, uint64_t size, struct kiln_err *err)
{
	unsigned char h[512];
	char name[4097];
	int oci_layout = 0, index = 0, manifest = 0, long_name = 0;
	uint64_t off = 0;
	unsigned entries = 0;

	if (size < 512) {
		if (size >= 2 && pread(fd, h, 2, 0) == 2 && h[0] == 0x1f && h[1] == 0x8b)
			goto compressed;
		return kiln_err_set(err, KERR_INVALID_IMAGE, "not an image archive: %llu bytes is too short for a tar archive",
				    (unsigned long long)size);
	}
	for (;;) {
		int64_t len;

		if (off + 512 > size)
			return kiln_err_set(err, KERR_INVALID_IMAGE, "not an image archive: the tar archive is truncated");
		if (pread(fd, h, 512, (off_t)off) != 512)
			return kiln_err_set(err, KERR_HOST_ERROR, "reading the archive: %s", strerror(errno ? errno : EIO));
		if (all_zero(h, 512))
			break;
		if (!tar_header_ok(h)) {
			if (off == 0 && h[0] == 0x1f && h[1] == 0x8b)
				goto compressed;
			if (off == 0)
				return kiln_err_set(err, KERR_INVALID_IMAGE, "not an image archive: not a tar archive");
			return kiln_err_set(err, KERR_INVALID_IMAGE,
					    "not an image archive: bad tar header at offset %llu", (unsigned long long)off);
		}
		if (++entries > OCI_MAX_TAR_ENTRIES)
			return kiln_err_set(err, KERR_INVALID_IMAGE, "not an image archive: more than %u entries",
					    OCI_MAX_TAR_ENTRIES);
		len = tar_number(h + 124, 12);
		if (len < 0 || (uint64_t)len > size)
			return kiln_err_set(err, KERR_INVALID_IMAGE, "not an image archive: bad entry size at offset %llu",
					    (unsigned long long)off);
		if (h[156] == 'L') {
			/* GNU long name: the next header's name is this entry's data. */
			size_t n = (uint64_t)len < sizeof(name) ? (size_t)len : sizeof(name) - 1;

			if (off + 512 + n > size || pread(fd, name, n, (off_t)(off + 512)) != (ssize_t)n)
				return kiln_err_set(err, KERR_INVALID_IMAGE, "not an image archive: the tar archive is truncated");
			name[n] = '\0';
			long_name = 1;
		} else if (h[156] != 'x' && h[156] != 'g' && h[156] != 'K') {
			const char *top;

			if (!long_name) {
				/* ustar: prefix "/" name, both NUL-padded fields. */
				size_t pl = strnlen((const char *)h + 345, 155), nl = strnlen((const char *)h, 100), o = 0;

				if (!memcmp(h + 257, "ustar", 5) && pl) {
					memcpy(name, h + 345, pl);
					name[pl] = '/';
					o = pl + 1;
				}
				memcpy(name + o, h, nl);
				name[o + nl] = '\0';
			}
			long_name = 0;
			if ((top = top_name(name))) {
				oci_layout |= !strcmp(top, "oci-layout");
				index |= !strcmp(top, "index.json");
				manifest |= !strcmp(top, "manifest.json");
			}
		}
		off += 512 + (((uint64_t)len + 511) & ~(uint64_t)511);
		if (off >= size)
			break;
	}
	if (entries == 0)
		return kiln_err_set(err, KERR_INVALID_IMAGE, "not an image archive: an empty tar archive");
	if (oci_layout && index)
		return OCI_KIND_OCI;
	if (manifest)
		return OCI_KIND_DOCKER;
	return kiln_err_set(err, KERR_INVALID_IMAGE,
			    "not an image archive: neither manifest.json (docker-archive) nor oci-layout and index.json "
			    "(OCI image layout) at the top of the tar");
compressed:
	return kiln_err_set(err, KERR_INVALID_IMAGE,
			    "compressed archive: upload the uncompressed tar that docker save / podman save wrote");
}

/* ---- index, manifest, config ------------------------------------------------- */

int oci_digest_ok(const char *d)
{
	if (strncmp(d, "sha256:", 7) || strlen(d) != 7 + 64)
		return -1;
	for (const char *p = d + 7; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return -1;
	return 0;
}

static json_t *load_object(const char *json, size_t len, const char *what, struct kiln_err *err)
{
	json_error_t je;
	json_t *root;

	if (len > OCI_MAX_JSON) {
		kiln_err_set(err, KERR_INVALID_IMAGE, "%s is larger than %u MiB", what, OCI_MAX_JSON >> 20);
		return NULL;
	}
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		kiln_err_set(err, KERR_INVALID_IMAGE, "%s: malformed JSON: %s", what, je.text);
		return NULL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		kiln_err_set(err, KERR_INVALID_IMAGE, "%s: not a JSON object", what);
		return NULL;
	}
	return root;
}

static int copy_digest(json_t *desc, char digest[72], const char *what, struct kiln_err *err)
{
	const char *d = json_string_value(json_object_get(desc, "digest"));

	if (!d || oci_digest_ok(d) < 0)
		return kiln_err_set(err, KERR_INVALID_IMAGE, "%s: missing or unsupported digest (sha256 only)", what);
	memcpy(digest, d, 7 + 64 + 1);
	return 0;
}

int oci_index_manifest(const char *json, size_t len, const char *ref, char digest[72], struct kiln_err *err)
{
	json_t *root = load_object(json, len, "index.json", err), *ms, *m, *pick = NULL;
	size_t i, n = 0;
	int r = -1;

	if (!root)
		return -1;
	ms = json_object_get(root, "manifests");
	if (!json_is_array(ms) || json_array_size(ms) == 0) {
		kiln_err_set(err, KERR_INVALID_IMAGE, "index.json: no manifests");
		goto out;
	}
	json_array_foreach(ms, i, m) {
		const char *name = json_string_value(
			json_object_get(json_object_get(m, "annotations"), "org.opencontainers.image.ref.name"));

		if (!json_is_object(m))
			continue;
		if (!ref || (name && !strcmp(name, ref))) {
			pick = m;
			n++;
		}
	}
	if (n == 0) {
		kiln_err_set(err, KERR_INVALID_IMAGE, "index.json: no manifest tagged \"%s\"", ref ? ref : "");
		goto out;
	}
	if (n > 1) {
		kiln_err_set(err, KERR_INVALID_IMAGE, "index.json: %zu manifests%s%s%s: which image is meant?", n,
			     ref ? " tagged \"" : "", ref ? ref : "", ref ? "\"" : "");
		goto out;
	}
	r = copy_digest(pick, digest, "index.json: the manifest", err);
out:
	json_decref(root);
	return r;
}

int oci_manifest_config(const char *json, size_t len, char digest[72], struct kiln_err *err)
{
	json_t *root = load_object(json, len, "the image manifest", err), *cfg;
	int r;

	if (!root)
		return -1;
	cfg = json_object_get(root, "config");
	if (!json_is_object(cfg))
		r = kiln_err_set(err, KERR_INVALID_IMAGE, "the image manifest has no config");
	else
		r = copy_digest(cfg, digest, "the image manifest's config", err);
	json_decref(root);
	return r;
}

#define OCI_MAX_ENV       1024
#define OCI_MAX_ENV_KEY   256
#define OCI_MAX_ENV_BYTES (64u << 10)

static int env_name_ok(const char *s, size_t n)
{
	if (n == 0 || n > OCI_MAX_ENV_KEY || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
		return 0;
	for (size_t i = 1; i < n; i++)
		if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
			return 0;
	return 1;
}

/* An absolute path without "." or ".." components (kiln-init and the spec
 * take cwd as written). */
static int workdir_ok(const char *p)
{
	if (p[0] != '/')
		return 0;
	for (const char *c = p; *c;) {
		size_t n;

		while (*c == '/')
			c++;
		n = strcspn(c, "/");
		if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return 0;
		c += n;
	}
	return 1;
}

void oci_config_free(struct oci_config *c)
{
	json_decref(c->env);
	memset(c, 0, sizeof(*c));
}

int oci_config_parse(const char *json, size_t len, struct oci_config *out, struct kiln_err *err)
{
	json_t *root, *cfg, *env, *v;
	const char *s;
	size_t i, total = 0;

	memset(out, 0, sizeof(*out));
	if (!(root = load_object(json, len, "the image config", err)))
		return -1;
	if (!(out->env = json_array()))
		goto oom;
	cfg = json_object_get(root, "config");
	if (!cfg || json_is_null(cfg))
		goto done;
	if (!json_is_object(cfg)) {
		kiln_err_set(err, KERR_INVALID_IMAGE, "the image config: \"config\" is not an object");
		goto fail;
	}
	env = json_object_get(cfg, "Env");
	if (env && !json_is_null(env)) {
		if (!json_is_array(env) || json_array_size(env) > OCI_MAX_ENV) {
			kiln_err_set(err, KERR_INVALID_IMAGE, "the image config: Env is not an array of at most %d strings",
				     OCI_MAX_ENV);
			goto fail;
		}
		json_array_foreach(env, i, v) {
			const char *eq;
			size_t n = json_string_length(v);

			s = json_string_value(v);
			if (!s || strlen(s) != n || !(eq = strchr(s, '=')) || !env_name_ok(s, (size_t)(eq - s))) {
				kiln_err_set(err, KERR_INVALID_IMAGE, "the image config: Env[%zu] is not NAME=VALUE", i);
				goto fail;
			}
			total += n + 1;
			if (total > OCI_MAX_ENV_BYTES) {
				kiln_err_set(err, KERR_INVALID_IMAGE, "the image config: Env is larger than %u KiB",
					     OCI_MAX_ENV_BYTES >> 10);
				goto fail;
			}
			if (json_array_append(out->env, v) < 0)
				goto oom;
		}
	}
	v = json_object_get(cfg, "WorkingDir");
	if (v && !json_is_null(v)) {
		s = json_string_value(v);
		if (!s || strlen(s) != json_string_length(v) || strlen(s) >= sizeof(out->workdir) ||
		    (*s && !workdir_ok(s))) {
			kiln_err_set(err, KERR_INVALID_IMAGE,
				     "the image config: WorkingDir must be an absolute path without . or .. components");
			goto fail;
		}
		snprintf(out->workdir, sizeof(out->workdir), "%s", s);
	}
	v = json_object_get(cfg, "User");
	if (v && !json_is_null(v)) {
		s = json_string_value(v);
		if (!s || strlen(s) != json_string_length(v) || strlen(s) > OCI_MAX_USER) {
			kiln_err_set(err, KERR_INVALID_IMAGE, "the image config: User is not a string of at most %d bytes",
				     OCI_MAX_USER);
			goto fail;
		}
		snprintf(out->user, sizeof(out->user), "%s", s);
	}
done:
	json_decref(root);
	return 0;
oom:
	kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
fail:
	json_decref(root);
	oci_config_free(out);
	return -1;
}

/* ---- users and groups ---------------------------------------------------------- */

/* A decimal id in s[0..n): 0 and *out, or -1 (not a number, or past
 * 4294967294: (uid_t)-1 means "no change" to the kernel). */
static int parse_id(const char *s, size_t n, uint32_t *out)
{
	uint64_t v = 0;

	if (n == 0 || n > 10)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v >= 0xffffffffu)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* Look up a line of a passwd or group file (name:x:id[:gid:...]) whose
 * field key_field (0: name, 2: id) equals key[0..kn). Sets *id (field 2)
 * and, when want_gid, *gid (field 3). 1 found, 0 not. Malformed lines are
 * skipped, as libc does. */
static int etc_lookup(const char *text, size_t len, int key_field, const char *key, size_t kn, uint32_t *id,
		      uint32_t *gid, int want_gid)
{
	const char *p = text, *end = text + len;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *le = nl ? nl : end;
		const char *f[4];
		size_t fl[4];
		int nf = 0;
		const char *c = p;

		while (nf < 4) {
			const char *colon = memchr(c, ':', (size_t)(le - c));

			f[nf] = c;
			fl[nf] = (size_t)((colon ? colon : le) - c);
			nf++;
			if (!colon)
				break;
			c = colon + 1;
		}
		p = nl ? nl + 1 : end;
		if (nf < 3 || (want_gid && nf < 4))
			continue;
		if (fl[key_field] != kn || memcmp(f[key_field], key, kn))
			continue;
		{
			uint32_t a, b = 0;

			if (parse_id(f[2], fl[2], &a) < 0 || (want_gid && parse_id(f[3], fl[3], &b) < 0))
				continue;
			*id = a;
			if (want_gid)
				*gid = b;
			return 1;
		}
	}
	return 0;
}

static int name_ok(const char *s, size_t n)
{
	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (s[i] == ':' || s[i] == '\n' || s[i] == '\0' || (unsigned char)s[i] < 0x20)
			return 0;
	return 1;
}

int oci_user_resolve(const char *user, const char *passwd, size_t plen, const char *group, size_t glen,
		     uint32_t *uid, uint32_t *gid, struct kiln_err *err)
{
	const char *colon, *u = user, *g = NULL;
	size_t un, gn = 0;
	uint32_t pw_gid = 0, dummy;
	int have_pw_gid = 0;

	*uid = *gid = 0;
	if (!user[0])
		return 0;
	if (strlen(user) > OCI_MAX_USER)
		return kiln_err_set(err, KERR_INVALID_IMAGE, "the image's User is longer than %d bytes", OCI_MAX_USER);
	colon = strchr(user, ':');
	un = colon ? (size_t)(colon - user) : strlen(user);
	if (colon) {
		g = colon + 1;
		gn = strlen(g);
		if (gn == 0 || strchr(g, ':'))
			return kiln_err_set(err, KERR_INVALID_IMAGE, "the image's User \"%s\" is not user[:group]", user);
	}
	if (un == 0)
		return kiln_err_set(err, KERR_INVALID_IMAGE, "the image's User \"%s\" names no user", user);
	if (parse_id(u, un, uid) == 0) {
		/* A numeric uid needs no passwd entry; it takes the entry's gid when there is one. */
		if (passwd && etc_lookup(passwd, plen, 2, u, un, &dummy, &pw_gid, 1))
			have_pw_gid = 1;
	} else if (u[0] >= '0' && u[0] <= '9' && strspn(u, "0123456789") == un) {
		return kiln_err_set(err, KERR_INVALID_IMAGE, "the image's User \"%.*s\" is out of range", (int)un, u);
	} else {
		if (!name_ok(u, un) || !passwd || !etc_lookup(passwd, plen, 0, u, un, uid, &pw_gid, 1))
			return kiln_err_set(err, KERR_INVALID_IMAGE, "the image's User \"%.*s\" is not in the image's /etc/passwd",
					    (int)un, u);
		have_pw_gid = 1;
	}
	if (!g) {
		*gid = have_pw_gid ? pw_gid : 0;
		return 0;
	}
	if (parse_id(g, gn, gid) == 0)
		return 0;
	if (g[0] >= '0' && g[0] <= '9' && strspn(g, "0123456789") == gn)
		return kiln_err_set(err, KERR_INVALID_IMAGE, "the image's group \"%s\" is out of range", g);
	if (!name_ok(g, gn) || !group || !etc_lookup(group, glen, 0, g, gn, gid, NULL, 0))
		return kiln_err_set(err, KERR_INVALID_IMAGE, "the image's group \"%s\" is not in the image's /etc/group", g);
	return 0;
}

/* ---- umoci's rootless owner xattr -------------------------------------------- */

static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (*p >= end)
			return -1;
		uint8_t b = *(*p)++;

		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return 0;
	}
	return -1;
}

int oci_rootless_owner(const uint8_t *p, size_t n, uint32_t *uid, uint32_t *gid)
{
	const uint8_t *end = p + n;
	uint64_t key, v;

	*uid = *gid = 0;
	while (p < end) {
		if (varint(&p, end, &key) < 0)
			return -1;
		switch (key & 7) {
		case 0:
			if (varint(&p, end, &v) < 0)
				return -1;
			if (key >> 3 == 1 || key >> 3 == 2) {
				if (v > 0xffffffffu)
					return -1;
				/* 0xffffffff: "unchanged", i.e. the unpacker's own id, which is root here. */
				*(key >> 3 == 1 ? uid : gid) = v == 0xffffffffu ? 0 : (uint32_t)v;
			}
			break;
		case 1:
			if ((size_t)(end - p) < 8)
				return -1;
			p += 8;
			break;
		case 2:
			if (varint(&p, end, &v) < 0 || v > (uint64_t)(end - p))
				return -1;
			p += v;
			break;
		case 5:
			if ((size_t)(end - p) < 4)
				return -1;
			p += 4;
			break;
		default:
			return -1;
		}
	}
	return 0;
}
