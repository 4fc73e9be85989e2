/* pause_manifest: parse and check a paused session's manifest (see
 * pause_manifest.h). Everything in it came from S3: bounded here. */
#include "pause_manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "version.h"

static int hex64(const char *s)
{
	if (!s || strlen(s) != 64)
		return 0;
	for (int i = 0; i < 64; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

/* A chunk's key: under prefix, or under alt (NULL: none); a name after it,
 * with no "..". */
static int key_under(const char *key, const char *prefix)
{
	size_t plen = strlen(prefix);

	return !strncmp(key, prefix, plen) && strlen(key) > plen && !strstr(key + plen, "..");
}

static int chunks_parse(json_t *o, const char *prefix, const char *alt, struct pchunk_list *l, struct kiln_err *err)
{
	json_t *arr = json_object_get(o, "chunks"), *c;
	size_t i;

	if (!json_is_array(arr) || json_array_size(arr) > PCHUNK_MAX)
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest has no valid chunk list");
	l->n = json_array_size(arr);
	l->c = calloc(l->n ? l->n : 1, sizeof(*l->c));
	if (!l->c)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	json_array_foreach(arr, i, c) {
		struct pchunk *p = &l->c[i];
		const char *key = json_string_value(json_object_get(c, "key"));
		const char *sha = json_string_value(json_object_get(c, "sha256"));
		json_t *size = json_object_get(c, "size"), *zsize = json_object_get(c, "zsize");

		if (!key || !(key_under(key, prefix) || (alt && key_under(key, alt))) || strlen(key) >= sizeof(p->key) ||
		    !hex64(sha) || !json_is_integer(size) || !json_is_integer(zsize) ||
		    json_integer_value(size) <= 0 || json_integer_value(size) > PCHUNK_RAW_MAX ||
		    json_integer_value(zsize) <= 0 || json_integer_value(zsize) > PCHUNK_RAW_MAX + (1 << 20))
			return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest: chunk %zu is invalid", i);
		snprintf(p->key, sizeof(p->key), "%s", key);
		memcpy(p->sha256, sha, 65);
		p->size = (uint64_t)json_integer_value(size);
		p->zsize = (uint64_t)json_integer_value(zsize);
		p->offset = l->total;
		l->total += p->size;
	}
	return 0;
}

int pmanifest_parse(const char *text, size_t len, const char *customer, const char *id, struct pmanifest *out,
		    struct kiln_err *err)
{
	return pmanifest_parse_at(text, len, customer, PMANIFEST_SESSIONS, id, out, err);
}

/* An id of ours: 1-64 of [A-Za-z0-9_.-], not starting with '.'. */
static int id_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n < 1 || n > 64 || s[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '_' || s[i] == '.' || s[i] == '-'))
			return 0;
	return 1;
}

int pmanifest_parse_at(const char *text, size_t len, const char *customer, const char *where, const char *id,
		       struct pmanifest *out, struct kiln_err *err)
{
	json_error_t je;
	json_t *m, *base, *from;
	char prefix[512], alt[512];
	json_int_t v;

	memset(out, 0, sizeof(*out));
	m = out->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(m) || strcmp(json_string_value(json_object_get(m, "customer")) ?: "", customer) ||
	    strcmp(json_string_value(json_object_get(m, "id")) ?: "", id) || !json_is_object(json_object_get(m, "spec")))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest is unreadable or not this session's");
	/* No version: the first release's (1). A newer one is another kiln's
	 * format, not damage: 409 incompatible_snapshot, which leaves the
	 * session paused and its objects in S3 (422 would end it as corrupt). */
	v = json_object_get(m, "version") ? json_integer_value(json_object_get(m, "version")) : PMANIFEST_V1;
	if (v > PMANIFEST_V3)
		return kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
				    "%s/%s/%s/manifest.json has version %lld, newer than this kiln-host (%s) reads "
				    "(1 to %d): written by a newer kiln; resume it on an upgraded host",
				    customer, where, id, (long long)v, kiln_version(), PMANIFEST_V3);
	if (v == PMANIFEST_V1) {
		out->version = PMANIFEST_V1;
		return 0;
	}
	if (v != PMANIFEST_V2 && v != PMANIFEST_V3)
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT,
				    "the paused session's manifest has version %lld; this host reads versions 1 to %d",
				    (long long)v, PMANIFEST_V3);
	out->version = (int)v;
	base = json_object_get(m, "base");
	if (!hex64(json_string_value(json_object_get(base, "sha256"))) ||
	    !json_is_integer(json_object_get(base, "size")) || json_integer_value(json_object_get(base, "size")) <= 0)
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest does not name its base");
	memcpy(out->base_sha256, json_string_value(json_object_get(base, "sha256")), 65);
	out->base_size = (uint64_t)json_integer_value(json_object_get(base, "size"));
	/* Its own chunks, and those of the snapshot it was started from (a
	 * fork's or a named one's: they stay until no session of it is left). */
	snprintf(prefix, sizeof(prefix), "%s/%s/%s/", customer, where, id);
	from = json_object_get(m, "from_snapshot");
	if (from && !id_ok(json_string_value(from)))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest: from_snapshot is invalid");
	if (from) {
		snprintf(out->from_snapshot, sizeof(out->from_snapshot), "%s", json_string_value(from));
		snprintf(alt, sizeof(alt), "%s/" PMANIFEST_SNAPSHOTS "/%s/", customer, out->from_snapshot);
	}
	if (chunks_parse(json_object_get(m, "state"), prefix, from ? alt : NULL, &out->state, err) < 0 ||
	    chunks_parse(json_object_get(m, "disk"), prefix, from ? alt : NULL, &out->disk, err) < 0)
		return -1;
	if (!out->state.n || !out->disk.n)
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the paused session's manifest has an empty chunk list");
	if (v == PMANIFEST_V3) {
		json_t *t = json_object_get(m, "tail"), *d = json_object_get(m, "depth");
		const char *g = json_string_value(json_object_get(m, "generation"));

		/* At least one chunk of pages before the devices' chunks. */
		if (!json_is_integer(t) || json_integer_value(t) < 1 ||
		    (uint64_t)json_integer_value(t) >= (uint64_t)out->state.n || !json_is_integer(d) ||
		    json_integer_value(d) < 0 || json_integer_value(d) > PMANIFEST_DEPTH_MAX || !g || !*g ||
		    strlen(g) >= sizeof(out->generation))
			return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT,
					    "the paused session's manifest has no valid tail, depth or generation");
		out->tail = (size_t)json_integer_value(t);
		out->depth = (int)json_integer_value(d);
		snprintf(out->generation, sizeof(out->generation), "%s", g);
	}
	/* Only for the pause cache: without it a resume fetches from S3. */
	out->has_cache_key = pcache_key_parse(json_string_value(json_object_get(m, "cache_key")), out->cache_key) == 0;
	return 0;
}

void pmanifest_free(struct pmanifest *m)
{
	json_decref(m->root);
	free(m->state.c);
	free(m->disk.c);
	memset(m, 0, sizeof(*m));
}

json_t *pchunk_list_json(const struct pchunk_list *l)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < l->n; i++)
		if (json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:s}", "key", l->c[i].key, "size",
						       (json_int_t)l->c[i].size, "zsize", (json_int_t)l->c[i].zsize,
						       "sha256", l->c[i].sha256)) < 0) {
			json_decref(a);
			return NULL;
		}
	return json_pack("{s:o, s:I}", "chunks", a, "size", (json_int_t)l->total);
}

void pbase_prefix(char *out, size_t cap, const char *sha)
{
	snprintf(out, cap, PBASE_DIR "%s/", sha);
}

int pbase_parse(const char *text, size_t len, const char *sha, uint64_t size, struct pchunk_list *out,
		struct kiln_err *err)
{
	json_error_t je;
	json_t *m = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	char prefix[128];
	int r = -1;

	memset(out, 0, sizeof(*out));
	pbase_prefix(prefix, sizeof(prefix), sha);
	if (json_is_object(m) && json_integer_value(json_object_get(m, "version")) > PBASE_V) {
		kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
			     PBASE_DIR "%.16s/manifest.json has version %lld, newer than this kiln-host (%s) reads (%d): "
			     "written by a newer kiln",
			     sha, (long long)json_integer_value(json_object_get(m, "version")), kiln_version(), PBASE_V);
		goto out;
	}
	/* No version: the first release's (1). */
	if (!json_is_object(m) ||
	    (json_object_get(m, "version") && json_integer_value(json_object_get(m, "version")) != PBASE_V) ||
	    strcmp(json_string_value(json_object_get(m, "sha256")) ?: "", sha) ||
	    json_integer_value(json_object_get(m, "size")) != (json_int_t)size) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the base RAM %.16s in S3: its manifest is unreadable or not this base's",
			     sha);
		goto out;
	}
	if (chunks_parse(json_object_get(m, "mem"), prefix, NULL, out, err) < 0)
		goto out;
	if (out->total != size) {
		kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "the base RAM %.16s in S3: its chunks do not add up to its size", sha);
		goto out;
	}
	r = 0;
out:
	json_decref(m);
	if (r < 0) {
		free(out->c);
		memset(out, 0, sizeof(*out));
	}
	return r;
}
