/* fuzz_volume: a session spec's "volumes" (from kiln-api, and back from a
 * pause manifest in S3) through vol_spec_parse, and a volume's manifest
 * (from S3) through vmanifest_parse: no crash or leak, and what they accept
 * keeps its promises (at most VOL_SLOTS mounts with valid ids and mount
 * points, none inside another; chunk keys under the volume's prefix,
 * aligned, increasing, non-overlapping offsets inside the volume). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fuzz.h"
#include "task/task.h"
#include "volume.h"

/* No component of p is "", "." or "..". */
static int components_ok(const char *p)
{
	for (const char *c = p + 1;; c++) {
		const char *e = strchr(c, '/');
		size_t l = e ? (size_t)(e - c) : strlen(c);

		if (!l || (l == 1 && c[0] == '.') || (l == 2 && !strncmp(c, "..", 2)))
			return 0;
		if (!e)
			return 1;
		c = e;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kiln_err err = { .code = "" };
	struct vol_mount v[VOL_SLOTS];
	struct vmanifest m;
	json_error_t je;
	json_t *j = json_loadb((const char *)data, size, 0, &je);
	size_t n = 99;

	if (j && vol_spec_parse(j, v, &n, &err) == 0) {
		check(n <= VOL_SLOTS);
		for (size_t i = 0; i < n; i++) {
			check(spool_id_ok(v[i].id));
			check(vol_path_ok(v[i].path) && v[i].path[0] == '/' && components_ok(v[i].path));
			check(v[i].size_mib >= VOL_SIZE_MIB_MIN && v[i].size_mib <= VOL_SIZE_MIB_MAX);
			for (size_t k = 0; k < i; k++) {
				size_t l = strlen(v[k].path);
				int within = !strncmp(v[i].path, v[k].path, l) && (v[i].path[l] == '/' || !v[i].path[l]);

				check(strcmp(v[i].id, v[k].id) && !within);
			}
		}
	} else if (j) {
		check(err.errc == KERR_INVALID_SPEC);
	}
	json_decref(j);

	err = (struct kiln_err){ .code = "" };
	if (vmanifest_parse((const char *)data, size, "acme", "v1", &m, &err) == 0) {
		uint64_t end = 0, total = 0;

		check(m.size_mib >= VOL_SIZE_MIB_MIN && m.size_mib <= VOL_SIZE_MIB_MAX && m.generation[0]);
		check(m.chunks.n <= PCHUNK_MAX);
		for (size_t i = 0; i < m.chunks.n; i++) {
			const struct pchunk *c = &m.chunks.c[i];

			check(!strncmp(c->key, "acme/volumes/v1/", 16) && strlen(c->key) > 16 && !strstr(c->key, ".."));
			check(c->size > 0 && c->size <= PCHUNK_RAW_MAX && c->offset % 4096 == 0 && c->offset >= end);
			check(c->offset + c->size <= (uint64_t)m.size_mib << 20 && strlen(c->sha256) == 64);
			end = c->offset + c->size;
			total += c->size;
		}
		check(total == m.chunks.total);
	} else {
		check(err.errc == KERR_SNAPSHOT_CORRUPT || err.errc == KERR_HOST_ERROR ||
		      (err.errc == KERR_INCOMPATIBLE_SNAPSHOT && strstr(err.message, "newer than this kiln-host")));
	}
	vmanifest_free(&m);
	return 0;
}
