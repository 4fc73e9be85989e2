/* Unit tests for the OCI import's parsers (host/template_build/oci_parse.c: which archive,
 * index/manifest/config, the image's users and groups, umoci's rootless
 * owner record) and the walk that makes an unpacked tree fit to boot
 * (host/template_build/oci_tree.c: device nodes, set-uid bits, owners, links never
 * followed, kiln-init's directories; opening up a layout for the next
 * jail). No VM; the walk needs root (chown), and skips without it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "fsutil.h"
#include "oci_int.h"

/* ---- tar ---------------------------------------------------------------------- */

/* One ustar header for name (size bytes of data follow, zero-filled). */
static size_t tar_add(unsigned char *buf, size_t off, const char *name, size_t size)
{
	unsigned char *h = buf + off;
	unsigned sum = 0;

	memset(h, 0, 512);
	snprintf((char *)h, 100, "%s", name);
	snprintf((char *)h + 100, 8, "%07o", 0644);
	snprintf((char *)h + 108, 8, "%07o", 0);
	snprintf((char *)h + 116, 8, "%07o", 0);
	snprintf((char *)h + 124, 12, "%011zo", size);
	snprintf((char *)h + 136, 12, "%011o", 0);
	h[156] = '0';
	memcpy(h + 257, "ustar\0" "00", 8);
	memset(h + 148, ' ', 8);
	for (int i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	memset(h + 512, 0, (size + 511) & ~(size_t)511);
	return off + 512 + ((size + 511) & ~(size_t)511);
}

static int tar_kind(const unsigned char *buf, size_t n, struct kiln_err *err)
{
	int fd = memfd_create("test-oci", MFD_CLOEXEC), kind;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, n), (ssize_t)n);
	kind = oci_tar_kind(fd, n, err);
	close(fd);
	return kind;
}

static void tar_kinds(void **state)
{
	static unsigned char buf[16384];
	struct kiln_err err = { .code = "" };
	size_t n;

	(void)state;
	n = tar_add(buf, 0, "oci-layout", 30);
	n = tar_add(buf, n, "blobs/sha256/ab", 10);
	n = tar_add(buf, n, "index.json", 100);
	memset(buf + n, 0, 1024);
	assert_int_equal(tar_kind(buf, n + 1024, &err), OCI_KIND_OCI);

	n = tar_add(buf, 0, "./manifest.json", 30);
	n = tar_add(buf, n, "./abc/layer.tar", 1000);
	memset(buf + n, 0, 1024);
	assert_int_equal(tar_kind(buf, n + 1024, &err), OCI_KIND_DOCKER);

	/* manifest.json below the top does not count. */
	n = tar_add(buf, 0, "x/manifest.json", 30);
	memset(buf + n, 0, 1024);
	assert_int_equal(tar_kind(buf, n + 1024, &err), -1);
	assert_int_equal(err.errc, KERR_INVALID_IMAGE);
	assert_non_null(strstr(err.message, "neither manifest.json"));

	/* index.json alone (no oci-layout) is no layout. */
	n = tar_add(buf, 0, "index.json", 3);
	memset(buf + n, 0, 1024);
	assert_int_equal(tar_kind(buf, n + 1024, &err), -1);

	memset(buf, 0, 1024);
	assert_int_equal(tar_kind(buf, 1024, &err), -1);
	assert_non_null(strstr(err.message, "empty tar"));

	memset(buf, 'A', 2048);
	assert_int_equal(tar_kind(buf, 2048, &err), -1);
	assert_non_null(strstr(err.message, "not a tar"));

	memcpy(buf, "\x1f\x8b\x08\x00", 4);
	assert_int_equal(tar_kind(buf, 2048, &err), -1);
	assert_non_null(strstr(err.message, "compressed"));

	/* A header whose size runs past the end. */
	n = tar_add(buf, 0, "manifest.json", 100);
	snprintf((char *)buf + 124, 12, "%011o", 07777777);
	assert_int_equal(tar_kind(buf, n, &err), -1);

	/* Truncated: no end-of-archive blocks and a header cut short. */
	n = tar_add(buf, 0, "manifest.json", 0);
	assert_int_equal(tar_kind(buf, n + 100, &err), -1);
	assert_non_null(strstr(err.message, "truncated"));
	assert_int_equal(tar_kind(buf, 10, &err), -1);
}

/* ---- JSON ----------------------------------------------------------------------- */

#define DG "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void index_and_manifest(void **state)
{
	struct kiln_err err = { .code = "" };
	char d[72];
	const char *one = "{\"manifests\":[{\"digest\":\"" DG "\",\"annotations\":"
			  "{\"org.opencontainers.image.ref.name\":\"kiln\"}}]}";
	const char *two = "{\"manifests\":[{\"digest\":\"" DG "\"},{\"digest\":\"" DG "\"}]}";

	(void)state;
	assert_int_equal(oci_index_manifest(one, strlen(one), "kiln", d, &err), 0);
	assert_string_equal(d, DG);
	assert_int_equal(oci_index_manifest(one, strlen(one), NULL, d, &err), 0);
	assert_int_equal(oci_index_manifest(one, strlen(one), "other", d, &err), -1);
	assert_non_null(strstr(err.message, "no manifest tagged"));
	assert_int_equal(oci_index_manifest(two, strlen(two), NULL, d, &err), -1);
	assert_non_null(strstr(err.message, "2 manifests"));
	assert_int_equal(oci_index_manifest("{\"manifests\":[]}", 16, NULL, d, &err), -1);
	assert_int_equal(oci_index_manifest("[1]", 3, NULL, d, &err), -1);
	assert_int_equal(oci_index_manifest("{\"manifests\":[{\"digest\":\"sha512:00\"}]}", 38, NULL, d, &err), -1);
	assert_non_null(strstr(err.message, "digest"));
	/* Duplicate keys are refused, as everywhere in kiln. */
	assert_int_equal(oci_manifest_config("{\"config\":{},\"config\":{}}", 25, d, &err), -1);

	const char *m = "{\"config\":{\"digest\":\"" DG "\"},\"layers\":[]}";
	assert_int_equal(oci_manifest_config(m, strlen(m), d, &err), 0);
	assert_string_equal(d, DG);
	assert_int_equal(oci_manifest_config("{}", 2, d, &err), -1);

	assert_int_equal(oci_digest_ok(DG), 0);
	assert_int_equal(oci_digest_ok("sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"), -1);
	assert_int_equal(oci_digest_ok("sha256:../../etc/passwd"), -1);
}

static void config_fields(void **state)
{
	struct kiln_err err = { .code = "" };
	struct oci_config c;
	const char *ok = "{\"config\":{\"Env\":[\"PATH=/bin\",\"A=b=c\",\"_X=\"],\"WorkingDir\":\"/srv/app\","
			 "\"User\":\"app:staff\"},\"rootfs\":{}}";
	static const char *const bad[] = {
		"{\"config\":{\"Env\":[\"=x\"]}}",
		"{\"config\":{\"Env\":[\"NOEQUALS\"]}}",
		"{\"config\":{\"Env\":[\"1A=x\"]}}",
		"{\"config\":{\"Env\":[\"A-B=x\"]}}",
		"{\"config\":{\"Env\":\"A=b\"}}",
		"{\"config\":{\"Env\":[5]}}",
		"{\"config\":{\"WorkingDir\":\"relative\"}}",
		"{\"config\":{\"WorkingDir\":\"/a/../etc\"}}",
		"{\"config\":{\"WorkingDir\":\"/a/./b\"}}",
		"{\"config\":{\"User\":5}}",
		"{\"config\":[]}",
		"{\"config\":{\"Env\":[\"A=\\u0000b\"]}}",
		"not json",
	};

	(void)state;
	assert_int_equal(oci_config_parse(ok, strlen(ok), &c, &err), 0);
	assert_int_equal(json_array_size(c.env), 3);
	assert_string_equal(json_string_value(json_array_get(c.env, 1)), "A=b=c");
	assert_string_equal(c.workdir, "/srv/app");
	assert_string_equal(c.user, "app:staff");
	oci_config_free(&c);

	assert_int_equal(oci_config_parse("{}", 2, &c, &err), 0);
	assert_int_equal(json_array_size(c.env), 0);
	assert_string_equal(c.workdir, "");
	assert_string_equal(c.user, "");
	oci_config_free(&c);
	assert_int_equal(oci_config_parse("{\"config\":{\"Env\":null,\"WorkingDir\":\"\"}}", 39, &c, &err), 0);
	oci_config_free(&c);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err.errc = KERR_NONE;
		if (oci_config_parse(bad[i], strlen(bad[i]), &c, &err) != -1)
			fail_msg("accepted %s", bad[i]);
		assert_int_equal(err.errc, KERR_INVALID_IMAGE);
		assert_null(c.env);
	}
}

/* ---- users ---------------------------------------------------------------------- */

static void users(void **state)
{
	static const char pw[] = "root:x:0:0:root:/root:/bin/sh\n"
				 "broken line\n"
				 "bad:x:notanumber:1::/:/bin/sh\n"
				 "app:x:1234:2345::/home/app:/bin/sh\n"
				 "noeol:x:77:88::/:/bin/sh";
	static const char gr[] = "root:x:0:\nstaff:x:50:app\nbig:x:4294967295:\n";
	struct kiln_err err = { .code = "" };
	uint32_t u, g;

	(void)state;
#define RES(user) oci_user_resolve(user, pw, sizeof(pw) - 1, gr, sizeof(gr) - 1, &u, &g, &err)
	assert_int_equal(RES(""), 0);
	assert_true(u == 0 && g == 0);
	assert_int_equal(RES("app"), 0);
	assert_true(u == 1234 && g == 2345);
	assert_int_equal(RES("noeol"), 0);
	assert_true(u == 77 && g == 88);
	assert_int_equal(RES("app:staff"), 0);
	assert_true(u == 1234 && g == 50);
	assert_int_equal(RES("app:7"), 0);
	assert_true(u == 1234 && g == 7);
	assert_int_equal(RES("1234"), 0); /* numeric in passwd: its gid */
	assert_true(u == 1234 && g == 2345);
	assert_int_equal(RES("999"), 0); /* numeric, not in passwd: gid 0 */
	assert_true(u == 999 && g == 0);
	assert_int_equal(RES("999:staff"), 0);
	assert_true(u == 999 && g == 50);
	assert_int_equal(RES("4294967294:4294967294"), 0);
	assert_int_equal(RES("nobody"), -1);
	assert_non_null(strstr(err.message, "not in the image's /etc/passwd"));
	assert_int_equal(RES("bad"), -1);
	assert_int_equal(RES("app:nogroup"), -1);
	assert_non_null(strstr(err.message, "/etc/group"));
	assert_int_equal(RES("app:big"), -1); /* 4294967295 is (gid_t)-1 */
	assert_int_equal(RES("4294967295"), -1);
	assert_non_null(strstr(err.message, "out of range"));
	assert_int_equal(RES("99999999999"), -1);
	assert_int_equal(RES(":5"), -1);
	assert_int_equal(RES("app:"), -1);
	assert_int_equal(RES("a:b:c"), -1);
	assert_int_equal(RES("root:x"), -1);
#undef RES
	/* No /etc/passwd in the image: numbers still work, names do not. */
	assert_int_equal(oci_user_resolve("5:6", NULL, 0, NULL, 0, &u, &g, &err), 0);
	assert_true(u == 5 && g == 6);
	assert_int_equal(oci_user_resolve("app", NULL, 0, NULL, 0, &u, &g, &err), -1);
}

static void rootless_owner(void **state)
{
	uint32_t u, g;

	(void)state;
	assert_int_equal(oci_rootless_owner((const uint8_t *)"\x08\xe8\x07\x10\xe9\x07", 6, &u, &g), 0);
	assert_true(u == 1000 && g == 1001);
	assert_int_equal(oci_rootless_owner((const uint8_t *)"\x10\x05", 2, &u, &g), 0); /* uid 0 is absent */
	assert_true(u == 0 && g == 5);
	assert_int_equal(oci_rootless_owner((const uint8_t *)"", 0, &u, &g), 0);
	assert_true(u == 0 && g == 0);
	/* 0xffffffff: unchanged, i.e. root here; unknown fields skipped. */
	assert_int_equal(oci_rootless_owner((const uint8_t *)"\x08\xff\xff\xff\xff\x0f\x1a\x02" "hi\x10\x02", 12, &u, &g), 0);
	assert_true(u == 0 && g == 2);
	assert_int_equal(oci_rootless_owner((const uint8_t *)"\x08\xff\xff\xff\xff\x1f", 6, &u, &g), -1); /* > 32 bits */
	assert_int_equal(oci_rootless_owner((const uint8_t *)"\x08", 1, &u, &g), -1);
	assert_int_equal(oci_rootless_owner((const uint8_t *)"\x1a\x05" "ab", 4, &u, &g), -1);
	assert_int_equal(oci_rootless_owner((const uint8_t *)"\x0b", 1, &u, &g), -1); /* group wire type */
}

/* ---- the walk ------------------------------------------------------------------- */

static char dir[64];

static int dir_setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/kiln-unit-oci.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int dir_teardown(void **state)
{
	(void)state;
	return fs_rmtree(dir);
}

static void no_log(void *ctx, const char *fmt, ...)
{
	(void)ctx, (void)fmt;
}

static void mkfile(const char *rel, mode_t mode)
{
	char p[256];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "data\n", 5), 5);
	close(fd);
	assert_int_equal(chmod(p, mode), 0);
}

static struct stat lst(const char *rel)
{
	char p[256];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	if (lstat(p, &st) < 0)
		memset(&st, 0, sizeof(st));
	return st;
}

static void tree_prepare(void **state)
{
	struct kiln_err err = { .code = "" };
	struct oci_tree_stats ts;
	char p[256], victim[256];
	struct stat st, vst;
	int root;

	(void)state;
	if (geteuid() != 0)
		skip(); /* chown to the image's owners needs root */
	snprintf(p, sizeof(p), "%s/root", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/root/bin", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/root/home", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(chmod(p, 02775), 0); /* mkdir ignores S_ISGID */
	mkfile("root/bin/su", 04755);
	mkfile("root/bin/wall", 02755);
	mkfile("root/home/notes", 0640);
	/* umoci's record: owner 1000:1001. */
	snprintf(p, sizeof(p), "%s/root/home/notes", dir);
	if (setxattr(p, OCI_ROOTLESS_XATTR, "\x08\xe8\x07\x10\xe9\x07", 6, 0) < 0)
		skip(); /* no user xattrs on this file system */
	snprintf(p, sizeof(p), "%s/root/fifo", dir);
	assert_int_equal(mkfifo(p, 0644), 0);
	/* Links out of the tree: never followed by the walk. */
	mkfile("victim", 04755);
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	assert_int_equal(stat(victim, &vst), 0);
	snprintf(p, sizeof(p), "%s/root/bin/out", dir);
	assert_int_equal(symlink(victim, p), 0);
	/* /work as a symlink out, /etc missing: both made directories. */
	snprintf(p, sizeof(p), "%s/root/work", dir);
	assert_int_equal(symlink(dir, p), 0);

	snprintf(p, sizeof(p), "%s/root", dir);
	root = open(p, O_RDONLY | O_DIRECTORY);
	assert_true(root >= 0);
	assert_int_equal(oci_tree_prepare(root, 4242, 4343, 1ull << 30, &ts, no_log, NULL, &err), 0);
	close(root);

	assert_int_equal(ts.removed_nodes, 1);
	assert_int_equal(ts.cleared_suid, 2);
	assert_int_equal(lst("root/fifo").st_mode, 0);
	assert_int_equal(lst("root/bin/su").st_mode & 07777, 0755);
	assert_int_equal(lst("root/bin/wall").st_mode & 07777, 0755);
	assert_int_equal(lst("root/home").st_mode & 07777, 02775); /* set-gid directories stay */
	st = lst("root/home/notes");
	assert_true(st.st_uid == 1000 && st.st_gid == 1001);
	snprintf(p, sizeof(p), "%s/root/home/notes", dir);
	assert_true(lgetxattr(p, OCI_ROOTLESS_XATTR, victim, 8) < 0);
	assert_true(S_ISLNK(lst("root/bin/out").st_mode));
	/* The link's target outside the tree is untouched. */
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	assert_int_equal(stat(victim, &st), 0);
	assert_int_equal(st.st_mode, vst.st_mode);
	assert_true(st.st_uid == vst.st_uid);
	st = lst("root/work");
	assert_true(S_ISDIR(st.st_mode) && st.st_uid == 4242 && st.st_gid == 4343);
	st = lst("root/output");
	assert_true(S_ISDIR(st.st_mode) && st.st_uid == 4242);
	assert_int_equal(lst("root/tmp").st_mode & 07777, 01777);
	assert_true(S_ISDIR(lst("root/dev/pts").st_mode) && S_ISDIR(lst("root/dev/shm").st_mode));
	assert_true(S_ISDIR(lst("root/proc").st_mode) && S_ISDIR(lst("root/kiln").st_mode));
	assert_true(S_ISREG(lst("root/etc/hostname").st_mode));
	assert_true(ts.inodes >= 6);
}

static void tree_limits(void **state)
{
	struct kiln_err err = { .code = "" };
	struct oci_tree_stats ts;
	uint64_t bytes = 0, inodes = 0;
	char p[256];
	int root;

	(void)state;
	if (geteuid() != 0)
		skip();
	snprintf(p, sizeof(p), "%s/root", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	mkfile("root/a", 0644);
	mkfile("root/b", 0644);
	root = open(p, O_RDONLY | O_DIRECTORY);
	assert_true(root >= 0);
	assert_int_equal(oci_tree_usage(root, 1ull << 30, &bytes, &inodes), 0);
	assert_int_equal(inodes, 2);
	assert_true(bytes > 0);
	/* Past max_bytes: too_large. */
	assert_int_equal(oci_tree_prepare(root, 0, 0, 512, &ts, no_log, NULL, &err), -1);
	assert_int_equal(err.errc, KERR_TOO_LARGE);
	close(root);
}

static void tree_open_up(void **state)
{
	char p[256], victim[256];
	struct stat vst;
	int fd;

	(void)state;
	snprintf(p, sizeof(p), "%s/in", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/in/blobs", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	mkfile("in/blobs/b", 0600);
	mkfile("victim", 0600);
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	assert_int_equal(stat(victim, &vst), 0);
	snprintf(p, sizeof(p), "%s/in/blobs/link", dir);
	assert_int_equal(symlink(victim, p), 0);
	snprintf(p, sizeof(p), "%s/in/fifo", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/in", dir);
	fd = open(p, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	assert_int_equal(oci_tree_open_up(fd), 0);
	close(fd);
	assert_int_equal(lst("in").st_mode & 07777, 0755);
	assert_int_equal(lst("in/blobs").st_mode & 07777, 0755);
	assert_int_equal(lst("in/blobs/b").st_mode & 07777, 0644);
	assert_true(S_ISLNK(lst("in/blobs/link").st_mode));
	assert_int_equal(lst("in/fifo").st_mode, 0);
	assert_int_equal(lst("victim").st_mode, vst.st_mode); /* the link was not followed */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(tar_kinds),
		cmocka_unit_test(index_and_manifest),
		cmocka_unit_test(config_fields),
		cmocka_unit_test(users),
		cmocka_unit_test(rootless_owner),
		cmocka_unit_test_setup_teardown(tree_prepare, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(tree_limits, dir_setup, dir_teardown),
		cmocka_unit_test_setup_teardown(tree_open_up, dir_setup, dir_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
