/* paths: where a kiln binary finds its shipped files (paths.h). */
#include "paths.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int paths_exe_dir(char *buf, size_t size)
{
	ssize_t n = readlink("/proc/self/exe", buf, size);
	char *slash;

	if (n < 0)
		return -errno;
	if ((size_t)n >= size)
		return -ENAMETOOLONG;
	buf[n] = '\0';
	slash = strrchr(buf, '/');
	if (!slash)
		return -ENOENT;
	*slash = '\0';
	return 0;
}

static int is_dir(const char *p)
{
	struct stat st;

	return !stat(p, &st) && S_ISDIR(st.st_mode);
}

const char *paths_image_dir(char *buf, size_t size)
{
	char exe[PATH_MAX], real[PATH_MAX];

	if (paths_exe_dir(exe, sizeof(exe)) < 0)
		return NULL;
	if ((size_t)snprintf(buf, size, "%s/image", exe) >= size)
		return NULL;
	if (is_dir(buf))
		return buf;
	/* Installed: say /usr/lib/kiln/image, not /usr/bin/../lib/kiln/image. */
	if ((size_t)snprintf(buf, size, "%s/../lib/kiln/image", exe) < size && realpath(buf, real) && is_dir(real) &&
	    strlen(real) < size)
		return strcpy(buf, real);
	if ((size_t)snprintf(buf, size, "%s/image", exe) >= size)
		return NULL;
	return buf;
}
