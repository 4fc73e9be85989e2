/* Unit tests for the kiln CLI's parsers of untrusted or user-written input:
 * credentials-file lines, output paths named by the server, the
 * arguments of kiln session exec/put/get, ids put into request paths, the
 * query of kiln snapshot list and kiln session create's --volume. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "cli.h"
#include "creds.h"
#include "recipe.h"
#include "untar.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>

static void test_creds_lines(void **state)
{
	char n[64], v[128];

	assert_int_equal(creds_parse_line("KILN_API=http://127.0.0.1:8080\n", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(n, "KILN_API");
	assert_string_equal(v, "http://127.0.0.1:8080");
	assert_int_equal(creds_parse_line("export KILN_KEY='kiln_a_b'\r\n", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(n, "KILN_KEY");
	assert_string_equal(v, "kiln_a_b");
	assert_int_equal(creds_parse_line("S3_SECRET_KEY=\"x=y\"", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(v, "x=y");
	assert_int_equal(creds_parse_line("EMPTY=", n, sizeof(n), v, sizeof(v)), 1);
	assert_string_equal(v, "");
	assert_int_equal(creds_parse_line("# comment\n", n, sizeof(n), v, sizeof(v)), 0);
	assert_int_equal(creds_parse_line("   \n", n, sizeof(n), v, sizeof(v)), 0);
	assert_int_equal(creds_parse_line("no equals sign", n, sizeof(n), v, sizeof(v)), -1);
	assert_int_equal(creds_parse_line("=value", n, sizeof(n), v, sizeof(v)), -1);
	assert_int_equal(creds_parse_line("BAD NAME=x", n, sizeof(n), v, sizeof(v)), -1);
	/* Too long for the buffers: refused, never truncated silently. */
	{
		char longv[300];

		memset(longv, 'a', sizeof(longv));
		memcpy(longv, "K=", 2);
		longv[sizeof(longv) - 1] = '\0';
		assert_int_equal(creds_parse_line(longv, n, sizeof(n), v, sizeof(v)), -1);
	}
}

static void test_output_paths(void **state)
{
	assert_true(cli_output_path_ok("a.txt"));
	assert_true(cli_output_path_ok("report/sub/squares.csv"));
	assert_true(cli_output_path_ok("..hidden/x"));
	assert_false(cli_output_path_ok(""));
	assert_false(cli_output_path_ok("/etc/passwd"));
	assert_false(cli_output_path_ok("../x"));
	assert_false(cli_output_path_ok("a/../../x"));
	assert_false(cli_output_path_ok("a/.."));
	assert_false(cli_output_path_ok("./a"));
	assert_false(cli_output_path_ok("a//b"));
	assert_false(cli_output_path_ok("a/"));
	assert_false(cli_output_path_ok("a\nb"));
	{
		char big[1100];

		memset(big, 'a', sizeof(big));
		big[sizeof(big) - 1] = '\0';
		assert_false(cli_output_path_ok(big));
	}
}

/* argv for cli_session_exec_args from a NULL-terminated list. */
static int exec_args(struct cli_exec_args *a, char *msg, ...)
{
	char *argv[32];
	int argc = 0;
	va_list ap;

	argv[argc++] = "exec";
	va_start(ap, msg);
	while (argc < 31 && (argv[argc] = va_arg(ap, char *)))
		argc++;
	va_end(ap);
	argv[argc] = NULL;
	msg[0] = '\0';
	return cli_session_exec_args(argc, argv, a, msg, 300);
}

static void test_session_exec_args(void **state)
{
	struct cli_exec_args a;
	char msg[300];

	/* Options before "--" (either spelling), the command after it as is. */
	assert_int_equal(exec_args(&a, msg, "s_1", "--env", "A=1", "--cwd=/tmp", "--timeout", "9", "--env=B=x=y", "--",
				   "ls", "-l", "--env", "--", NULL),
			 0);
	assert_string_equal(a.id, "s_1");
	assert_int_equal(a.ncmd, 4);
	assert_string_equal(a.cmd[0], "ls");
	assert_string_equal(a.cmd[2], "--env"); /* after "--": the command's own */
	assert_string_equal(a.cmd[3], "--");
	assert_int_equal(a.nenv, 2);
	assert_string_equal(a.env[0], "A=1");
	assert_string_equal(a.env[1], "B=x=y");
	assert_string_equal(a.cwd, "/tmp");
	assert_int_equal(a.timeout_s, 9);
	assert_null(a.code_file);
	assert_int_equal(a.json, 0);
	/* The id may come after options; --code picks the language. */
	assert_int_equal(exec_args(&a, msg, "--json", "--code", "job.py", "s_2", NULL), 0);
	assert_string_equal(a.id, "s_2");
	assert_string_equal(a.language, "python");
	assert_int_equal(a.json, 1);
	assert_null(a.cmd);
	assert_int_equal(exec_args(&a, msg, "s_2", "--code=run.sh", NULL), 0);
	assert_string_equal(a.language, "bash");
	assert_null(a.stdin_file);
	assert_int_equal(exec_args(&a, msg, "s_2", "--stdin", "-", "--", "wc", "-l", NULL), 0);
	assert_string_equal(a.stdin_file, "-");
	assert_int_equal(a.ncmd, 2);
	/* Refusals say why. */
	assert_int_equal(exec_args(&a, msg, "s_1", NULL), -1);
	assert_non_null(strstr(msg, "no command"));
	assert_int_equal(exec_args(&a, msg, "s_1", "--", NULL), -1);
	assert_non_null(strstr(msg, "nothing after"));
	assert_int_equal(exec_args(&a, msg, "--", "ls", NULL), -1);
	assert_non_null(strstr(msg, "ID is missing"));
	assert_int_equal(exec_args(&a, msg, "s_1", "ls", "--", "ls", NULL), -1);
	assert_non_null(strstr(msg, "ls: unexpected"));
	assert_int_equal(exec_args(&a, msg, "s_1", "--code", "a.py", "--", "ls", NULL), -1);
	assert_non_null(strstr(msg, "not both"));
	assert_int_equal(exec_args(&a, msg, "s_1", "--code", "a.rb", NULL), -1);
	assert_non_null(strstr(msg, ".py or .sh"));
	assert_int_equal(exec_args(&a, msg, "s_1", "--env", "NOEQ", "--", "ls", NULL), -1);
	assert_non_null(strstr(msg, "NAME=VALUE"));
	assert_int_equal(exec_args(&a, msg, "s_1", "--timeout", "0", "--", "ls", NULL), -1);
	assert_int_equal(exec_args(&a, msg, "s_1", "--timeout", "5s", "--", "ls", NULL), -1);
	assert_int_equal(exec_args(&a, msg, "s_1", "--memory", "5", "--", "ls", NULL), -1);
	assert_non_null(strstr(msg, "unknown option"));
	assert_int_equal(exec_args(&a, msg, "s_1", "--cwd", NULL), -1);
	assert_non_null(strstr(msg, "needs a value"));
	assert_int_equal(exec_args(&a, msg, "s_1", "--cwd", "--", "ls", NULL), -1); /* "--" is not a value */
}

static void test_session_paths(void **state)
{
	char out[64], dir[] = "/tmp/kiln-test-cli.XXXXXX", want[128];

	assert_int_equal(cli_guest_path("data.csv", out, sizeof(out)), 0);
	assert_string_equal(out, "/work/data.csv");
	assert_int_equal(cli_guest_path("sub/a b", out, sizeof(out)), 0);
	assert_string_equal(out, "/work/sub/a b");
	assert_int_equal(cli_guest_path("/etc/hosts", out, sizeof(out)), 0);
	assert_string_equal(out, "/etc/hosts");
	assert_int_equal(cli_guest_path("", out, sizeof(out)), -1);
	{
		char big[100];

		memset(big, 'a', sizeof(big));
		big[sizeof(big) - 1] = '\0';
		assert_int_equal(cli_guest_path(big, out, sizeof(out)), -1); /* never cut short */
	}
	/* kiln session get: where the file lands. */
	assert_int_equal(cli_session_get_target("/work/out/r.csv", NULL, out, sizeof(out)), 0);
	assert_string_equal(out, "r.csv");
	assert_int_equal(cli_session_get_target("/work/out/r.csv", "-", out, sizeof(out)), 0);
	assert_string_equal(out, "-");
	assert_int_equal(cli_session_get_target("/work/out/r.csv", "mine.csv", out, sizeof(out)), 0);
	assert_string_equal(out, "mine.csv");
	assert_int_equal(cli_session_get_target("/work/out/", NULL, out, sizeof(out)), -1);
	assert_int_equal(cli_session_get_target("/work/..", NULL, out, sizeof(out)), -1);
	assert_int_equal(cli_session_get_target("/work/out/", "x", out, sizeof(out)), 0);
	assert_non_null(mkdtemp(dir));
	assert_int_equal(cli_session_get_target("/work/r.csv", dir, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "%s/r.csv", dir);
	assert_string_equal(out, want);
	assert_int_equal(cli_session_get_target("/work/", dir, out, sizeof(out)), -1);
	rmdir(dir);
}

/* Session and snapshot ids go into request paths as they are: nothing that
 * could leave the path's segment or the query. */
static void test_ids_and_snapshot_list_path(void **state)
{
	char out[256], tiny[40], big[80];

	assert_true(cli_id_ok("s_0123456789abcdef0123456789abcdef"));
	assert_true(cli_id_ok("snap_0123456789abcdef0123456789abcdef"));
	assert_false(cli_id_ok(""));
	assert_false(cli_id_ok(NULL));
	assert_false(cli_id_ok("."));
	assert_false(cli_id_ok(".."));
	assert_false(cli_id_ok("../x"));
	assert_false(cli_id_ok("s_1?x=1"));
	assert_false(cli_id_ok("s_1/fork"));
	assert_false(cli_id_ok("s 1"));
	assert_false(cli_id_ok("s_1%2f"));
	memset(big, 'a', sizeof(big));
	big[63] = '\0';
	assert_true(cli_id_ok(big));
	big[63] = 'a';
	big[64] = '\0';
	assert_false(cli_id_ok(big)); /* 64 bytes: longer than any id */

	assert_int_equal(cli_snapshot_list_path(NULL, NULL, NULL, out, sizeof(out)), 0);
	assert_string_equal(out, "/v1/snapshots?limit=100");
	assert_int_equal(cli_snapshot_list_path("", "", "", out, sizeof(out)), 0);
	assert_string_equal(out, "/v1/snapshots?limit=100");
	assert_int_equal(cli_snapshot_list_path("my snap&x=1", "s_1", "tok/+=", out, sizeof(out)), 0);
	assert_string_equal(out, "/v1/snapshots?limit=100&name=my%20snap%26x%3D1&session_id=s_1&after=tok%2F%2B%3D");
	assert_int_equal(cli_snapshot_list_path(NULL, NULL, "t2", out, sizeof(out)), 0);
	assert_string_equal(out, "/v1/snapshots?limit=100&after=t2");
	/* Never cut short: a path that does not fit is an error. */
	assert_int_equal(cli_snapshot_list_path(NULL, NULL, NULL, tiny, 23), -1);
	assert_int_equal(cli_snapshot_list_path(NULL, NULL, NULL, tiny, 24), 0);
	assert_int_equal(cli_snapshot_list_path("n", NULL, NULL, tiny, 31), 0);
	assert_int_equal(cli_snapshot_list_path("nam", NULL, NULL, tiny, 32), -1);
}

/* --volume NAME:PATH[:ro|:rw]: the name as a path segment may carry, the
 * path absolute, the mode only when given; anything else refused with why. */
static void test_volume_mount(void **state)
{
	static const char *const bad[] = {
		"ws", "ws:", ":/data", "ws:data", "ws:/", "ws:/:ro", "../x:/data", "a/b:/data", "ws:/data:rx",
		"ws:/data:ro:ro", "ws:/a:b", "..:/data", "ws /x:/data",
		"0123456789012345678901234567890123456789012345678901234567890123:/data", /* a 64-byte name */
	};
	char msg[320], *got;
	json_t *m;
	size_t i;

	assert_true(cli_volume_name_ok("ws"));
	assert_true(cli_volume_name_ok("my.vol_1-2"));
	assert_true(cli_volume_name_ok("vol_0123456789abcdef01234567"));
	assert_false(cli_volume_name_ok(""));
	assert_false(cli_volume_name_ok(".."));
	assert_false(cli_volume_name_ok("a/b"));
	assert_false(cli_volume_name_ok("a?b"));

	m = cli_volume_mount("ws:/data", msg, sizeof(msg));
	got = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
	assert_string_equal(got, "{\"name\":\"ws\",\"path\":\"/data\"}");
	free(got);
	json_decref(m);
	m = cli_volume_mount("ws:/mnt/my data:ro", msg, sizeof(msg));
	got = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
	assert_string_equal(got, "{\"name\":\"ws\",\"path\":\"/mnt/my data\",\"read_only\":true}");
	free(got);
	json_decref(m);
	m = cli_volume_mount("ws:/data:rw", msg, sizeof(msg));
	assert_true(json_is_false(json_object_get(m, "read_only")));
	assert_string_equal(json_string_value(json_object_get(m, "path")), "/data");
	json_decref(m);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		msg[0] = '\0';
		m = cli_volume_mount(bad[i], msg, sizeof(msg));
		if (m)
			fail_msg("--volume %s was taken", bad[i]);
		assert_true(msg[0] != '\0');
	}
	assert_null(cli_volume_mount(NULL, msg, sizeof(msg)));
	assert_null(cli_volume_mount("ws:/caf\xe9", msg, sizeof(msg))); /* not UTF-8 */
	assert_non_null(strstr(msg, "UTF-8"));
}

/* ---- a guest's tar archive, unpacked ---- */

static void tar_add(struct archive *a, const char *name, mode_t type, mode_t perm, const char *link, const char *data)
{
	struct archive_entry *e = archive_entry_new();

	archive_entry_set_pathname(e, name);
	archive_entry_set_filetype(e, type);
	archive_entry_set_perm(e, perm);
	archive_entry_set_uid(e, 1234);
	archive_entry_set_gid(e, 1234);
	if (type == AE_IFCHR)
		archive_entry_set_rdev(e, makedev(1, 3));
	if (type == AE_IFLNK)
		archive_entry_set_symlink(e, link);
	if (link && type == AE_IFREG)
		archive_entry_set_hardlink(e, link);
	archive_entry_set_size(e, data && !link ? (la_int64_t)strlen(data) : 0);
	assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
	if (data && !link)
		assert_int_equal(archive_write_data(a, data, strlen(data)), (la_ssize_t)strlen(data));
	archive_entry_free(e);
}

/* What a hostile guest could put in `kiln session get DIR/`'s archive, and
 * what the CLI (as root here) makes of it: plain files and directories
 * only, no owner, no setuid, nothing outside the target. */
static void test_untar_hostile(void **state)
{
	char dir[] = "/tmp/kiln-untar.XXXXXX", tarpath[64], dest[64], p[160], outside[64];
	struct archive *a = archive_write_new();
	struct untar_report rep;
	struct kiln_err err = { .code = "" };
	struct stat st;

	assert_non_null(mkdtemp(dir));
	snprintf(tarpath, sizeof(tarpath), "%s/in.tar", dir);
	snprintf(dest, sizeof(dest), "%s/out", dir);
	snprintf(outside, sizeof(outside), "%s/escaped.txt", dir);
	assert_int_equal(mkdir(dest, 0755), 0);
	archive_write_set_format_pax_restricted(a);
	assert_int_equal(archive_write_open_filename(a, tarpath), ARCHIVE_OK);
	tar_add(a, "ok.txt", AE_IFREG, 04755, NULL, "fine\n");
	tar_add(a, "sub", AE_IFDIR, 02777, NULL, NULL);
	tar_add(a, "sub/inner.txt", AE_IFREG, 06644, NULL, "in\n");
	tar_add(a, "null", AE_IFCHR, 0666, NULL, NULL);
	tar_add(a, "fifo", AE_IFIFO, 0666, NULL, NULL);
	tar_add(a, "etc", AE_IFLNK, 0777, "/etc", NULL);
	tar_add(a, "etc/passwd-kiln-test", AE_IFREG, 0644, NULL, "through the link\n");
	tar_add(a, "hard", AE_IFREG, 0644, "/etc/passwd", NULL);
	tar_add(a, "../escaped.txt", AE_IFREG, 0644, NULL, "out\n");
	tar_add(a, "/tmp/kiln-untar-absolute.txt", AE_IFREG, 0644, NULL, "abs\n");
	archive_write_close(a);
	archive_write_free(a);

	assert_int_equal(untar_safe(tarpath, dest, &rep, &err), 0);
	/* ok.txt, sub/inner.txt and etc/passwd-kiln-test (in a directory etc
	 * of its own: the symlink was left out); sub. */
	assert_int_equal(rep.files, 3);
	assert_int_equal(rep.dirs, 1);
	assert_int_equal(rep.skipped, 6);
	snprintf(p, sizeof(p), "%s/ok.txt", dest);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0755); /* setuid dropped */
	assert_int_equal(st.st_uid, getuid());      /* not 1234 */
	snprintf(p, sizeof(p), "%s/sub", dest);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 07000, 0);
	assert_int_equal(st.st_uid, getuid());
	snprintf(p, sizeof(p), "%s/sub/inner.txt", dest);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0644);
	snprintf(p, sizeof(p), "%s/null", dest);
	assert_int_equal(lstat(p, &st), -1);
	snprintf(p, sizeof(p), "%s/fifo", dest);
	assert_int_equal(lstat(p, &st), -1);
	snprintf(p, sizeof(p), "%s/etc", dest);
	assert_int_equal(lstat(p, &st), 0);
	assert_true(S_ISDIR(st.st_mode)); /* not the symlink to /etc */
	snprintf(p, sizeof(p), "%s/hard", dest);
	assert_int_equal(lstat(p, &st), -1);
	assert_int_equal(lstat("/etc/passwd-kiln-test", &st), -1);
	assert_int_equal(lstat(outside, &st), -1);
	assert_int_equal(lstat("/tmp/kiln-untar-absolute.txt", &st), -1);
	/* A file that is not a tar archive is an error, not a silent success. */
	assert_int_equal(untar_safe("/etc/hostname", dest, &rep, &err), -1);
	snprintf(p, sizeof(p), "rm -rf %s", dir);
	assert_int_equal(system(p), 0);
}

/* argv for cli_template_build_args from a NULL-terminated list. */
static int template_build_args(struct cli_template_args *a, char *msg, ...)
{
	static char *argv[40];
	int argc = 0;
	va_list ap;

	argv[argc++] = "build";
	va_start(ap, msg);
	while (argc < 39 && (argv[argc] = va_arg(ap, char *)))
		argc++;
	va_end(ap);
	argv[argc] = NULL;
	return cli_template_build_args(argc, argv, a, msg, 300);
}

static void test_template_build_args(void **state)
{
	struct cli_template_args a;
	char msg[300];

	assert_int_equal(template_build_args(&a, msg, "--name", "data", "--packages", "python3-numpy,jq", "--packages=curl",
				     "--run", "echo hi > /etc/hi", "--preload", "numpy", "--no-wait", NULL),
			 0);
	assert_string_equal(a.name, "data");
	assert_int_equal(a.npackages, 2);
	assert_int_equal(a.nrun, 1);
	assert_int_equal(a.npreload, 1);
	assert_int_equal(a.no_wait, 1);
	assert_null(a.recipe_file);
	assert_null(a.oci);
	assert_int_equal(template_build_args(&a, msg, "recipe.json", "--json", NULL), 0);
	assert_string_equal(a.recipe_file, "recipe.json");
	assert_null(a.name);
	assert_int_equal(a.json, 1);
	assert_int_equal(template_build_args(&a, msg, "--oci", "img.tar", "--name", "img", NULL), 0);
	assert_string_equal(a.oci, "img.tar");
	assert_int_equal(template_build_args(&a, msg, "--help", NULL), 0);
	assert_int_equal(a.help, 1);
	/* Refusals say why. */
	assert_int_equal(template_build_args(&a, msg, NULL), -1);
	assert_non_null(strstr(msg, "nothing to build"));
	assert_int_equal(template_build_args(&a, msg, "--packages", "jq", NULL), -1);
	assert_non_null(strstr(msg, "--name is needed"));
	assert_int_equal(template_build_args(&a, msg, "--oci", "img.tar", NULL), -1);
	assert_non_null(strstr(msg, "--name is needed"));
	assert_int_equal(template_build_args(&a, msg, "--name", "Data", "--packages", "jq", NULL), -1);
	assert_non_null(strstr(msg, "--name Data"));
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--oci", "i.tar", "--packages", "jq", NULL), -1);
	assert_non_null(strstr(msg, "--oci"));
	assert_int_equal(template_build_args(&a, msg, "r.json", "--run", "true", NULL), -1);
	assert_non_null(strstr(msg, "not both"));
	assert_int_equal(template_build_args(&a, msg, "r.json", "s.json", NULL), -1);
	assert_non_null(strstr(msg, "one recipe file"));
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--file", "local.txt", NULL), -1);
	assert_non_null(strstr(msg, "LOCAL:/"));
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--file", "local.txt:etc/x", NULL), -1);
	assert_non_null(strstr(msg, "LOCAL:/"));
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--env", "NOEQUALS", NULL), -1);
	assert_non_null(strstr(msg, "NAME=VALUE"));
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--workdir", "rel", NULL), -1);
	assert_non_null(strstr(msg, "absolute"));
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--run", "", NULL), -1);
	assert_non_null(strstr(msg, "empty"));
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--bogus", NULL), -1);
	assert_non_null(strstr(msg, "--bogus: unknown option"));
	assert_int_equal(template_build_args(&a, msg, "--name", NULL), -1);
	assert_non_null(strstr(msg, "expects a value"));
	{
		/* More --run steps than a recipe may hold. */
		char *argv[60];
		int argc = 0;

		argv[argc++] = "build";
		argv[argc++] = "--name=x";
		for (int i = 0; i < 51; i++)
			argv[argc++] = "--run=true";
		argv[argc] = NULL;
		assert_int_equal(cli_template_build_args(argc, argv, &a, msg, sizeof(msg)), -1);
		assert_non_null(strstr(msg, "--run: at most 50"));
	}
}

/* The recipe made from flags is what docs/templates.md describes, and
 * recipe_parse (kiln-api's and kiln-host's parser) accepts it. */
static void test_template_recipe(void **state)
{
	char dir[] = "/tmp/kiln-test-recipe-XXXXXX", local[128], farg[200], rfile[128], msg[300];
	struct cli_template_args a;
	struct recipe rc;
	struct kiln_err err = { .code = "" };
	json_t *r, *f;
	char *text;
	FILE *fp;

	assert_non_null(mkdtemp(dir));
	snprintf(local, sizeof(local), "%s/hello.sh", dir);
	fp = fopen(local, "w");
	assert_non_null(fp);
	fputs("#!/bin/sh\necho hi\n", fp);
	fclose(fp);
	assert_int_equal(chmod(local, 0750), 0);
	snprintf(farg, sizeof(farg), "%s:/usr/local/bin/hello", local);
	assert_int_equal(template_build_args(&a, msg, "--name", "data", "--packages", "python3-numpy, jq", "--packages",
				     "curl", "--run", "echo built > /etc/built", "--run", "hello", "--file", farg,
				     "--preload", "numpy,pandas", "--env", "LANG=C.UTF-8", "--env", "X=a=b", "--workdir",
				     "/srv", NULL),
			 0);
	r = cli_template_recipe(&a, msg, sizeof(msg));
	assert_non_null(r);
	assert_string_equal(json_string_value(json_object_get(r, "name")), "data");
	assert_string_equal(json_string_value(json_object_get(r, "from")), "debian");
	assert_int_equal(json_array_size(json_object_get(r, "packages")), 3);
	assert_string_equal(json_string_value(json_array_get(json_object_get(r, "packages"), 1)), "jq");
	assert_string_equal(json_string_value(json_array_get(json_object_get(r, "packages"), 2)), "curl");
	assert_string_equal(json_string_value(json_array_get(json_object_get(r, "run"), 0)), "echo built > /etc/built");
	assert_int_equal(json_array_size(json_object_get(r, "preload")), 2);
	assert_string_equal(json_string_value(json_object_get(json_object_get(r, "env"), "X")), "a=b");
	assert_string_equal(json_string_value(json_object_get(r, "workdir")), "/srv");
	f = json_array_get(json_object_get(r, "files"), 0);
	assert_string_equal(json_string_value(json_object_get(f, "path")), "/usr/local/bin/hello");
	assert_string_equal(json_string_value(json_object_get(f, "content_b64")), "IyEvYmluL3NoCmVjaG8gaGkK");
	assert_int_equal(json_integer_value(json_object_get(f, "mode")), 0750);
	/* kiln-api's parser takes it as is. */
	text = json_dumps(r, JSON_COMPACT);
	assert_int_equal(recipe_parse(text, strlen(text), &rc, &err), 0);
	assert_int_equal(rc.npackages, 3);
	assert_int_equal(rc.nfiles, 1);
	assert_int_equal(rc.files[0].mode, 0750);
	assert_int_equal(rc.files[0].len, 18);
	assert_int_equal(rc.nrun, 2);
	assert_int_equal(rc.npreload, 2);
	assert_int_equal(rc.nenv, 2);
	assert_string_equal(rc.workdir, "/srv");
	recipe_free(&rc);
	free(text);
	json_decref(r);

	/* Only the keys given: --packages alone. */
	assert_int_equal(template_build_args(&a, msg, "--name", "p", "--packages", "jq", NULL), 0);
	r = cli_template_recipe(&a, msg, sizeof(msg));
	assert_non_null(r);
	assert_int_equal(json_object_size(r), 3);
	json_decref(r);

	/* A missing local file, a bad package list: refused before any request. */
	snprintf(farg, sizeof(farg), "%s/nope:/etc/x", dir);
	assert_int_equal(template_build_args(&a, msg, "--name", "x", "--file", farg, NULL), 0);
	assert_null(cli_template_recipe(&a, msg, sizeof(msg)));
	assert_non_null(strstr(msg, "No such file"));
	{
		char big[300];

		memset(big, 'a', sizeof(big));
		big[sizeof(big) - 1] = '\0';
		assert_int_equal(template_build_args(&a, msg, "--name", "x", "--packages", big, NULL), 0);
		assert_null(cli_template_recipe(&a, msg, sizeof(msg)));
		assert_non_null(strstr(msg, "longer than 100 bytes"));
	}

	/* A recipe file: sent as written; --name replaces its name; a file
	 * that is not a JSON object, or has duplicate keys, is refused. */
	snprintf(rfile, sizeof(rfile), "%s/r.json", dir);
	fp = fopen(rfile, "w");
	fputs("{\"name\":\"fromfile\",\"packages\":[\"jq\"],\"run\":[\"true\"]}", fp);
	fclose(fp);
	assert_int_equal(template_build_args(&a, msg, rfile, NULL), 0);
	r = cli_template_recipe(&a, msg, sizeof(msg));
	assert_non_null(r);
	assert_string_equal(json_string_value(json_object_get(r, "name")), "fromfile");
	assert_int_equal(json_array_size(json_object_get(r, "run")), 1);
	json_decref(r);
	assert_int_equal(template_build_args(&a, msg, rfile, "--name", "renamed", NULL), 0);
	r = cli_template_recipe(&a, msg, sizeof(msg));
	assert_string_equal(json_string_value(json_object_get(r, "name")), "renamed");
	json_decref(r);
	fp = fopen(rfile, "w");
	fputs("{\"packages\":[\"jq\"]}", fp);
	fclose(fp);
	assert_int_equal(template_build_args(&a, msg, rfile, NULL), 0);
	assert_null(cli_template_recipe(&a, msg, sizeof(msg)));
	assert_non_null(strstr(msg, "no \"name\""));
	fp = fopen(rfile, "w");
	fputs("{\"name\":\"a\",\"name\":\"b\"}", fp);
	fclose(fp);
	assert_null(cli_template_recipe(&a, msg, sizeof(msg)));
	assert_non_null(strstr(msg, "not valid JSON"));
	fp = fopen(rfile, "w");
	fputs("[\"jq\"]", fp);
	fclose(fp);
	assert_null(cli_template_recipe(&a, msg, sizeof(msg)));
	assert_non_null(strstr(msg, "a recipe is a JSON object"));

	snprintf(msg, sizeof(msg), "rm -rf %s", dir);
	assert_int_equal(system(msg), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_creds_lines),
		cmocka_unit_test(test_output_paths),
		cmocka_unit_test(test_session_exec_args),
		cmocka_unit_test(test_session_paths),
		cmocka_unit_test(test_ids_and_snapshot_list_path),
		cmocka_unit_test(test_volume_mount),
		cmocka_unit_test(test_untar_hostile),
		cmocka_unit_test(test_template_build_args),
		cmocka_unit_test(test_template_recipe),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
