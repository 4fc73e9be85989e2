/* execpath: execvpe() with an explicit PATH (guest/execpath.c). */
#ifndef KILN_GUEST_EXECPATH_H
#define KILN_GUEST_EXECPATH_H

#include <stddef.h>

/* argv[0] (file) searched in path as execvp does, run with envp. Returns
 * only when nothing could be run: the errno to report, and in failed (cap
 * bytes) the path that failed. For a forked child. */
int exec_in_path(const char *file, char *const argv[], char *const envp[], const char *path, char *failed,
		 size_t cap);

#endif
