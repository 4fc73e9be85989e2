/* fuzz_oci: the OCI import's parsers over customer-written bytes
 * (host/template_build/oci_parse.c). The first byte picks the parser, the rest is its
 * input: 0 the archive's tar headers, 1 index.json, 2 a manifest, 3 the
 * image config, 4 User + /etc/passwd + /etc/group (NUL-separated), 5
 * umoci's rootless owner xattr. None may read outside its input, and what
 * each accepts must keep its promises (checked here). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "oci_int.h"

static void check_err(const struct kiln_err *err)
{
	if (err->errc != KERR_INVALID_IMAGE && err->errc != KERR_HOST_ERROR)
		abort();
}

static void fuzz_tar(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	int fd = memfd_create("fuzz-oci", MFD_CLOEXEC), kind;

	if (fd < 0)
		return;
	if (write(fd, data, size) == (ssize_t)size) {
		kind = oci_tar_kind(fd, size, &err);
		if (kind < 0)
			check_err(&err);
		else if ((kind != OCI_KIND_OCI && kind != OCI_KIND_DOCKER) || size < 512)
			abort();
	}
	close(fd);
}

static void fuzz_json(int which, const char *text, size_t size)
{
	struct kiln_err err = { .code = "" };
	struct oci_config cfg;
	char digest[72];
	int r;

	if (which == 1 || which == 2) {
		memset(digest, 'x', sizeof(digest));
		r = which == 1 ? oci_index_manifest(text, size, size & 1 ? "kiln" : NULL, digest, &err)
			       : oci_manifest_config(text, size, digest, &err);
		if (r == 0 && oci_digest_ok(digest) < 0)
			abort();
		if (r < 0)
			check_err(&err);
		return;
	}
	if (oci_config_parse(text, size, &cfg, &err) < 0) {
		check_err(&err);
		if (cfg.env)
			abort();
		return;
	}
	if (!json_is_array(cfg.env) || json_array_size(cfg.env) > 1024)
		abort();
	for (size_t i = 0; i < json_array_size(cfg.env); i++) {
		const char *e = json_string_value(json_array_get(cfg.env, i));

		if (!e || !strchr(e, '=') || e[0] == '=')
			abort();
	}
	if (cfg.workdir[0] && cfg.workdir[0] != '/')
		abort();
	if (strlen(cfg.user) > OCI_MAX_USER)
		abort();
	oci_config_free(&cfg);
}

static void fuzz_user(const char *text, size_t size)
{
	struct kiln_err err = { .code = "" };
	const char *user = text, *passwd = NULL, *group = NULL, *nul;
	size_t plen = 0, glen = 0;
	uint32_t uid = 7, gid = 7;

	/* user \0 passwd \0 group; a missing part is an absent file. */
	if ((nul = memchr(text, '\0', size))) {
		passwd = nul + 1;
		plen = size - (size_t)(passwd - text);
		if ((nul = memchr(passwd, '\0', plen))) {
			group = nul + 1;
			glen = plen - (size_t)(group - passwd);
			plen = (size_t)(nul - passwd);
		}
	}
	if (oci_user_resolve(user, passwd, plen, group, glen, &uid, &gid, &err) < 0)
		check_err(&err);
	else if (uid == 0xffffffffu || gid == 0xffffffffu)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t uid, gid;
	char *buf;

	if (size < 1)
		return 0;
	/* An exact-size heap copy plus a NUL the parsers must not rely on for
	 * the length (user parsing takes a C string: it stops at the first NUL). */
	if (!(buf = malloc(size)))
		return 0;
	memcpy(buf, data + 1, size - 1);
	buf[size - 1] = '\0';
	switch (data[0] % 6) {
	case 0: fuzz_tar((const uint8_t *)buf, size - 1); break;
	case 1: fuzz_json(1, buf, size - 1); break;
	case 2: fuzz_json(2, buf, size - 1); break;
	case 3: fuzz_json(3, buf, size - 1); break;
	case 4: fuzz_user(buf, size); break;
	case 5:
		if (oci_rootless_owner((const uint8_t *)buf, size - 1, &uid, &gid) == 0 &&
		    (uid == 0xffffffffu || gid == 0xffffffffu))
			abort();
		break;
	}
	free(buf);
	return 0;
}
