/* creds: the kiln CLI's configuration from the environment or `kiln up`'s
 * credentials file. */
#include "creds.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int creds_parse_line(const char *line, char *name, size_t name_size, char *value, size_t value_size)
{
	const char *eq, *v;
	size_t n, vl;

	while (*line == ' ' || *line == '\t')
		line++;
	if (!*line || *line == '\n' || *line == '#')
		return 0;
	if (!strncmp(line, "export ", 7))
		line += 7;
	eq = strchr(line, '=');
	if (!eq || eq == line)
		return -1;
	n = (size_t)(eq - line);
	for (size_t i = 0; i < n; i++)
		if (!(isalnum((unsigned char)line[i]) || line[i] == '_'))
			return -1;
	if (n >= name_size)
		return -1;
	memcpy(name, line, n);
	name[n] = '\0';
	v = eq + 1;
	vl = strcspn(v, "\r\n");
	if (vl >= 2 && (v[0] == '\'' || v[0] == '"') && v[vl - 1] == v[0]) {
		v++;
		vl -= 2;
	}
	if (vl >= value_size)
		return -1;
	memcpy(value, v, vl);
	value[vl] = '\0';
	return 1;
}

struct slot {
	const char *name;
	char *out;
	size_t size;
};

int creds_load(struct creds *c, struct kiln_err *err)
{
	struct slot slots[] = {
		{ "KILN_API", c->api, sizeof(c->api) },
		{ "KILN_KEY", c->key, sizeof(c->key) },
		{ "KILN_ADMIN_KEY", c->admin_key, sizeof(c->admin_key) },
		{ "S3_ENDPOINT", c->s3_endpoint, sizeof(c->s3_endpoint) },
		{ "S3_BUCKET", c->s3_bucket, sizeof(c->s3_bucket) },
		{ "KILN_CA_FILE", c->ca_file, sizeof(c->ca_file) },
	};
	const char *path = getenv("KILN_CREDENTIALS");
	char line[2048], name[64], value[1024];
	FILE *f;
	int lineno = 0;

	memset(c, 0, sizeof(*c));
	if (!path || !*path)
		path = CREDS_DEFAULT_FILE;
	snprintf(c->file, sizeof(c->file), "%s", path);
	f = fopen(path, "re");
	if (f) {
		c->file_found = 1;
		while (fgets(line, sizeof(line), f)) {
			int r = creds_parse_line(line, name, sizeof(name), value, sizeof(value));

			lineno++;
			if (r < 0) {
				fclose(f);
				return kiln_err_set(err, KERR_CONFIG, "%s:%d: expected NAME=VALUE", path, lineno);
			}
			for (size_t i = 0; r > 0 && i < sizeof(slots) / sizeof(slots[0]); i++)
				if (!strcmp(name, slots[i].name))
					snprintf(slots[i].out, slots[i].size, "%s", value);
		}
		fclose(f);
	} else if (errno != ENOENT) {
		return kiln_err_set(err, KERR_CONFIG, "%s: %s", path, strerror(errno));
	}
	for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
		const char *e = getenv(slots[i].name);

		if (e && *e)
			snprintf(slots[i].out, slots[i].size, "%s", e);
	}
	return 0;
}
