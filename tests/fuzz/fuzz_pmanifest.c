/* fuzz_pmanifest: a paused session's manifest (from S3) through
 * pmanifest_parse, and a base RAM's manifest through pbase_parse: no crash
 * or leak, and what they accept keeps its promises (keys under the
 * session's or the base's prefix, bounded sizes, offsets that add up). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "pause_manifest.h"

#define BASE_SHA "67d33f0202d1a21a5b7dfc8cca1059f161721d2615c6bba33545299241985097"
#define BASE_SIZE (16u << 20)

static void check_list_under(const struct pchunk_list *l, const char *prefix)
{
	uint64_t off = 0;

	check(l->n > 0 && l->n <= PCHUNK_MAX);
	for (size_t i = 0; i < l->n; i++) {
		check(!strncmp(l->c[i].key, prefix, strlen(prefix)) && strlen(l->c[i].key) > strlen(prefix));
		check(l->c[i].size > 0 && l->c[i].size <= PCHUNK_RAW_MAX);
		check(l->c[i].offset == off);
		check(strlen(l->c[i].sha256) == 64);
		off += l->c[i].size;
	}
	check(off == l->total);
}

/* Under the session's prefix, or the snapshot's it was started from. */
static void check_list(const struct pchunk_list *l, const char *from)
{
	char alt[128];

	snprintf(alt, sizeof(alt), "acme/snapshots/%s/", from);
	for (size_t i = 0; i < l->n; i++)
		check(!strncmp(l->c[i].key, "acme/sessions/s1/", 17) ||
		      (from[0] && !strncmp(l->c[i].key, alt, strlen(alt)) && !strstr(l->c[i].key, "..")));
	check_list_under(l, "acme/s");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pmanifest m;
	struct kiln_err err = { .code = "" };

	if (pmanifest_parse((const char *)data, size, "acme", "s1", &m, &err) == 0) {
		check(m.version == PMANIFEST_V1 || m.version == PMANIFEST_V2 || m.version == PMANIFEST_V3);
		if (m.version >= PMANIFEST_V2) {
			check(strlen(m.base_sha256) == 64 && m.base_size > 0);
			check_list(&m.state, m.from_snapshot);
			check_list(&m.disk, m.from_snapshot);
			/* Version 3: pages before the devices, a bounded depth. */
			check(m.version == PMANIFEST_V3 ? m.tail >= 1 && m.tail < m.state.n && m.depth >= 0 &&
								 m.depth <= PMANIFEST_DEPTH_MAX && m.generation[0]
							  : m.tail == 0);
		} else {
			check(!m.has_cache_key); /* version 1 has no pause cache */
		}
	} else {
		check(err.errc == KERR_SNAPSHOT_CORRUPT || err.errc == KERR_HOST_ERROR ||
		      (err.errc == KERR_INCOMPATIBLE_SNAPSHOT && strstr(err.message, "newer than this kiln-host")));
	}
	pmanifest_free(&m);

	struct pchunk_list bl;

	err = (struct kiln_err){ .code = "" };
	if (pbase_parse((const char *)data, size, BASE_SHA, BASE_SIZE, &bl, &err) == 0) {
		check_list_under(&bl, PBASE_DIR BASE_SHA "/");
		check(bl.total == BASE_SIZE);
		free(bl.c);
	} else {
		check(err.errc == KERR_SNAPSHOT_CORRUPT || err.errc == KERR_HOST_ERROR ||
		      (err.errc == KERR_INCOMPATIBLE_SNAPSHOT && strstr(err.message, "newer than this kiln-host")));
		check(bl.c == NULL);
	}
	return 0;
}
