/* fuzz_uiname: libFuzzer target for the web console's path check
 * (api/http/ui.c ui_file_name): the URL path under /ui of any client's request.
 * Besides memory safety, checks that a name accepted is a flat name: no
 * '/', not starting with '.', only [A-Za-z0-9_-] before its one known
 * extension, so no path can leave the console's directory. Input: the path. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ui.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *type = NULL, *name, *dot;
	char *s = malloc(size + 1);

	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	name = ui_file_name(s, &type);
	if (name) {
		check(ui_is_path(s));
		check(type != NULL);
		check(!strchr(name, '/') && name[0] != '.' && !strstr(name, ".."));
		dot = strchr(name, '.');
		check(dot && dot == strrchr(name, '.'));
		for (const char *p = name; p < dot; p++)
			check((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
			      *p == '_' || *p == '-');
	}
	free(s);
	return 0;
}
