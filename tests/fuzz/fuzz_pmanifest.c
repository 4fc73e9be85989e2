/* fuzz_pmanifest: a paused session's manifest (from S3) through
 * pmanifest_parse: no crash or leak, and what it accepts keeps its promises
 * (keys under the session's prefix, bounded sizes, offsets that add up). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz.h"
#include "pause_manifest.h"

static void check_list(const struct pchunk_list *l)
{
	uint64_t off = 0;

	check(l->n > 0 && l->n <= PCHUNK_MAX);
	for (size_t i = 0; i < l->n; i++) {
		check(!strncmp(l->c[i].key, "acme/sessions/s1/", 17) && strlen(l->c[i].key) > 17);
		check(l->c[i].size > 0 && l->c[i].size <= PCHUNK_RAW_MAX);
		check(l->c[i].offset == off);
		check(strlen(l->c[i].sha256) == 64);
		off += l->c[i].size;
	}
	check(off == l->total);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct pmanifest m;
	struct kiln_err err = { .code = "" };

	if (pmanifest_parse((const char *)data, size, "acme", "s1", &m, &err) == 0) {
		check(m.version == PMANIFEST_V1 || m.version == PMANIFEST_V2);
		if (m.version == PMANIFEST_V2) {
			check(strlen(m.base_sha256) == 64 && m.base_size > 0);
			check_list(&m.state);
			check_list(&m.disk);
		}
	} else {
		check(err.errc == KERR_SNAPSHOT_CORRUPT || err.errc == KERR_HOST_ERROR);
	}
	pmanifest_free(&m);
	return 0;
}
