/* execpath: execvpe() with an explicit PATH, for the children that
 * kiln-init (tasks) and envd (E2B processes) fork: the command's PATH, not
 * PID 1's. */
#include "execpath.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int exec_in_path(const char *file, char *const argv[], char *const envp[], const char *path, char *failed,
		 size_t cap)
{
	char buf[PATH_MAX];
	size_t flen = strlen(file);
	const char *p, *end;
	int eacces = 0;

	snprintf(failed, cap, "%s", file);
	if (strchr(file, '/')) {
		execve(file, argv, envp);
		return errno;
	}
	for (p = path;; p = end + 1) {
		size_t dlen;

		end = strchrnul(p, ':');
		dlen = (size_t)(end - p);
		if (dlen + 1 + flen + 1 <= sizeof(buf)) {
			/* An empty entry is the current directory, as in execvp. */
			if (dlen == 0) {
				buf[0] = '.';
				dlen = 1;
			} else {
				memcpy(buf, p, dlen);
			}
			buf[dlen] = '/';
			memcpy(buf + dlen + 1, file, flen + 1);
			execve(buf, argv, envp);
			switch (errno) {
			case EACCES:
				eacces = 1;
				break;
			case ENOENT:
			case ENOTDIR:
			case ENAMETOOLONG:
			case ESTALE:
			case ENODEV:
			case ETIMEDOUT:
				break;
			default:
				/* Found but cannot run (ENOEXEC, E2BIG, ...): stop
				 * here, as execvp does. */
				snprintf(failed, cap, "%s", buf);
				return errno;
			}
		}
		if (!*end)
			break;
	}
	return eacces ? EACCES : ENOENT;
}

