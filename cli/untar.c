/* untar: a guest's tar archive unpacked safely (see untar.h). GNU tar run
 * as root recreates device nodes, setuid bits and owners and follows what
 * the archive says; libarchive's write-disk with its SECURE flags, plus a
 * type filter here, does what a download should. */
#include "untar.h"

#include <archive.h>
#include <archive_entry.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A name from the archive: relative, no '..' component (checked here as
 * well as by ARCHIVE_EXTRACT_SECURE_NODOTDOT, before dest is prefixed). */
static int name_ok(const char *n)
{
	const char *p = n;

	if (!*n || *n == '/')
		return 0;
	while (*p) {
		size_t len = strcspn(p, "/");

		if (len == 2 && p[0] == '.' && p[1] == '.')
			return 0;
		p += len;
		while (*p == '/')
			p++;
	}
	return 1;
}

static void skip(struct untar_report *rep, const char *name)
{
	if (!rep->skipped++)
		snprintf(rep->first_skipped, sizeof(rep->first_skipped), "%s", name ? name : "?");
}

int untar_safe(const char *path, const char *dest, struct untar_report *rep, struct kiln_err *err)
{
	const int flags = ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
			  ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS;
	struct archive *in = archive_read_new(), *out = archive_write_disk_new();
	struct archive_entry *e;
	int r = -1, st, cwd = -1;

	memset(rep, 0, sizeof(*rep));
	if (!in || !out) {
		kiln_err_set(err, KERR_CLI, "out of memory");
		goto done;
	}
	archive_read_support_format_tar(in);
	archive_write_disk_set_options(out, flags);
	if (archive_read_open_filename(in, path, 1 << 16) != ARCHIVE_OK) {
		kiln_err_set(err, KERR_CLI, "%s: %s", path, archive_error_string(in));
		goto done;
	}
	/* libarchive writes relative to the working directory, and its SECURE
	 * flags refuse absolute names: extract from inside dest (the CLI is
	 * single-threaded here), then go back. */
	if ((cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 || chdir(dest) < 0) {
		kiln_err_set(err, KERR_CLI, "%s: %s", dest, strerror(errno));
		goto done;
	}
	while ((st = archive_read_next_header(in, &e)) == ARCHIVE_OK || st == ARCHIVE_WARN) {
		const char *name = archive_entry_pathname(e);
		mode_t type = archive_entry_filetype(e);

		if (!name || !name_ok(name) || archive_entry_hardlink(e) || (type != AE_IFREG && type != AE_IFDIR)) {
			skip(rep, name);
			continue;
		}
		/* Permission bits only: no setuid, setgid or sticky; no owner is
		 * restored (ARCHIVE_EXTRACT_OWNER is not set), so files belong to
		 * whoever runs kiln. Directories stay usable by their owner. */
		archive_entry_set_perm(e, (archive_entry_perm(e) & 0777) | (type == AE_IFDIR ? 0700 : 0));
		if (archive_write_header(out, e) != ARCHIVE_OK) {
			skip(rep, name);
			continue;
		}
		if (type == AE_IFREG) {
			const void *buf;
			size_t len;
			la_int64_t off;

			while ((st = archive_read_data_block(in, &buf, &len, &off)) == ARCHIVE_OK)
				if (archive_write_data_block(out, buf, len, off) != ARCHIVE_OK)
					break;
			if (st != ARCHIVE_EOF) {
				kiln_err_set(err, KERR_CLI, "%s: %s", name,
					     archive_error_string(st == ARCHIVE_OK ? out : in) ?: "read error");
				goto done;
			}
			rep->files++;
		} else {
			rep->dirs++;
		}
		archive_write_finish_entry(out);
	}
	if (st != ARCHIVE_EOF) {
		kiln_err_set(err, KERR_CLI, "%s: %s", path, archive_error_string(in) ?: "not a tar archive");
		goto done;
	}
	r = 0;
done:
	if (cwd >= 0) {
		if (fchdir(cwd) < 0 && r == 0)
			r = kiln_err_set(err, KERR_CLI, "cannot return to the working directory: %s", strerror(errno));
		close(cwd);
	}
	if (out) {
		archive_write_close(out);
		archive_write_free(out);
	}
	if (in)
		archive_read_free(in);
	return r;
}
