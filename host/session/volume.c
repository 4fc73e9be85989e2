/* volume: the session spec's "volumes" and a volume's manifest, parsed and
 * bounded (see volume.h). The spec comes from kiln-api (and back from a
 * pause manifest in S3), the manifest from S3: neither is trusted here. */
#include "volume.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "task/task.h"
#include "version.h"

/* The rule kiln-api applies too (lib/spec.c). */
int vol_path_ok(const char *p)
{
	return spec_volume_path_ok(p);
}

int vol_spec_parse(json_t *volumes, struct vol_mount out[VOL_SLOTS], size_t *n, struct kiln_err *err)
{
	json_t *v;
	size_t i;

	*n = 0;
	if (!volumes)
		return 0;
	if (!json_is_array(volumes))
		return kiln_err_set(err, KERR_INVALID_SPEC, "volumes: expected an array of {\"id\",\"path\",\"size_mib\"}");
	if (json_array_size(volumes) > VOL_SLOTS)
		return kiln_err_set(err, KERR_INVALID_SPEC, "volumes: a session mounts at most %d (got %zu)", VOL_SLOTS,
				    json_array_size(volumes));
	json_array_foreach(volumes, i, v) {
		struct vol_mount *m = &out[i];
		const char *k, *id, *path;
		json_t *f, *ro, *size;

		if (!json_is_object(v))
			return kiln_err_set(err, KERR_INVALID_SPEC, "volumes[%zu]: expected an object", i);
		json_object_foreach(v, k, f)
			if (strcmp(k, "id") && strcmp(k, "path") && strcmp(k, "read_only") && strcmp(k, "size_mib"))
				return kiln_err_set(err, KERR_INVALID_SPEC,
						    "volumes[%zu].%s: a volume has only \"id\", \"path\", \"read_only\" "
						    "and \"size_mib\"", i, k);
		id = json_string_value(json_object_get(v, "id"));
		path = json_string_value(json_object_get(v, "path"));
		ro = json_object_get(v, "read_only");
		size = json_object_get(v, "size_mib");
		if (!id || !spool_id_ok(id))
			return kiln_err_set(err, KERR_INVALID_SPEC,
					    "volumes[%zu].id: expected 1-64 characters of [A-Za-z0-9_.-], not starting "
					    "with '.'", i);
		if (!path || !vol_path_ok(path))
			return kiln_err_set(err, KERR_INVALID_SPEC,
					    "volumes[%zu].path: expected an absolute, normalised path of at most %d "
					    "characters (no \"//\", \".\", \"..\" or trailing '/'), not \"/\" and not "
					    "under /proc, /sys or /dev", i, VOL_PATH_MAX);
		if (ro && !json_is_boolean(ro))
			return kiln_err_set(err, KERR_INVALID_SPEC, "volumes[%zu].read_only: expected true or false", i);
		if (!json_is_integer(size) || json_integer_value(size) < VOL_SIZE_MIB_MIN ||
		    json_integer_value(size) > (json_int_t)VOL_SIZE_MIB_MAX)
			return kiln_err_set(err, KERR_INVALID_SPEC, "volumes[%zu].size_mib: expected an integer from %d to %llu",
					    i, VOL_SIZE_MIB_MIN, (unsigned long long)VOL_SIZE_MIB_MAX);
		for (size_t j = 0; j < i; j++) {
			if (!strcmp(out[j].id, id))
				return kiln_err_set(err, KERR_INVALID_SPEC, "volumes[%zu].id: volume %s is mounted twice", i,
						    id);
			if (spec_path_within(path, out[j].path) || spec_path_within(out[j].path, path))
				return kiln_err_set(err, KERR_INVALID_SPEC,
						    "volumes[%zu].path: %s and %s: one volume would be mounted inside "
						    "another", i, path, out[j].path);
		}
		snprintf(m->id, sizeof(m->id), "%s", id);
		snprintf(m->path, sizeof(m->path), "%s", path);
		m->read_only = json_is_true(ro);
		m->size_mib = (unsigned)json_integer_value(size);
	}
	*n = json_array_size(volumes);
	return 0;
}

void vol_prefix(char *out, size_t cap, const char *customer, const char *id)
{
	snprintf(out, cap, "%s/" PMANIFEST_VOLUMES "/%s/", customer, id);
}

void vol_manifest_key(char *out, size_t cap, const char *customer, const char *id)
{
	snprintf(out, cap, "%s/" PMANIFEST_VOLUMES "/%s/manifest.json", customer, id);
}

static int hex64(const char *s)
{
	if (!s || strlen(s) != 64)
		return 0;
	for (int i = 0; i < 64; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

int vmanifest_parse(const char *text, size_t len, const char *customer, const char *id, struct vmanifest *out,
		    struct kiln_err *err)
{
	json_error_t je;
	json_t *m, *arr, *c, *size;
	const char *gen;
	char prefix[512];
	uint64_t end = 0, bytes;
	size_t i, plen;

	memset(out, 0, sizeof(*out));
	m = out->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	/* A newer version is another kiln's format, not damage: refused as
	 * such, the volume left as it is. No version: the first release's. */
	if (json_is_object(m) && json_integer_value(json_object_get(m, "version")) > VOL_MANIFEST_V)
		return kiln_err_set(err, KERR_INCOMPATIBLE_SNAPSHOT,
				    "%s/" PMANIFEST_VOLUMES "/%s/manifest.json has version %lld, newer than this kiln-host "
				    "(%s) reads (%d): written by a newer kiln",
				    customer, id, (long long)json_integer_value(json_object_get(m, "version")), kiln_version(),
				    VOL_MANIFEST_V);
	if (!json_is_object(m) ||
	    (json_object_get(m, "version") && json_integer_value(json_object_get(m, "version")) != VOL_MANIFEST_V) ||
	    strcmp(json_string_value(json_object_get(m, "customer")) ?: "", customer) ||
	    strcmp(json_string_value(json_object_get(m, "id")) ?: "", id))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "volume %s: its manifest is unreadable or not this volume's", id);
	size = json_object_get(m, "size_mib");
	gen = json_string_value(json_object_get(m, "generation"));
	if (!json_is_integer(size) || json_integer_value(size) < VOL_SIZE_MIB_MIN ||
	    json_integer_value(size) > (json_int_t)VOL_SIZE_MIB_MAX || !gen || !*gen ||
	    strlen(gen) >= sizeof(out->generation))
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "volume %s: its manifest has no valid size_mib or generation",
				    id);
	out->size_mib = (unsigned)json_integer_value(size);
	snprintf(out->generation, sizeof(out->generation), "%s", gen);
	bytes = (uint64_t)out->size_mib << 20;
	arr = json_object_get(m, "chunks");
	if (!json_is_array(arr) || json_array_size(arr) > PCHUNK_MAX)
		return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "volume %s: its manifest has no valid chunk list", id);
	out->chunks.n = json_array_size(arr);
	out->chunks.c = calloc(out->chunks.n ? out->chunks.n : 1, sizeof(*out->chunks.c));
	if (!out->chunks.c)
		return kiln_err_set(err, KERR_HOST_ERROR, "out of memory");
	vol_prefix(prefix, sizeof(prefix), customer, id);
	plen = strlen(prefix);
	json_array_foreach(arr, i, c) {
		struct pchunk *p = &out->chunks.c[i];
		const char *key = json_string_value(json_object_get(c, "key"));
		const char *sha = json_string_value(json_object_get(c, "sha256"));
		json_t *off = json_object_get(c, "offset"), *sz = json_object_get(c, "size"), *zs = json_object_get(c, "zsize");

		if (!key || strncmp(key, prefix, plen) || strlen(key) <= plen || strstr(key + plen, "..") ||
		    strlen(key) >= sizeof(p->key) || !hex64(sha) || !json_is_integer(off) || !json_is_integer(sz) ||
		    !json_is_integer(zs) || json_integer_value(sz) <= 0 || json_integer_value(sz) > PCHUNK_RAW_MAX ||
		    json_integer_value(zs) <= 0 || json_integer_value(zs) > PCHUNK_RAW_MAX + (1 << 20) ||
		    json_integer_value(off) < 0 || (json_integer_value(off) & 4095) ||
		    (uint64_t)json_integer_value(off) < end ||
		    (uint64_t)json_integer_value(off) > bytes - (uint64_t)json_integer_value(sz))
			return kiln_err_set(err, KERR_SNAPSHOT_CORRUPT, "volume %s: its manifest's chunk %zu is invalid", id, i);
		snprintf(p->key, sizeof(p->key), "%s", key);
		memcpy(p->sha256, sha, 65);
		p->size = (uint64_t)json_integer_value(sz);
		p->zsize = (uint64_t)json_integer_value(zs);
		p->offset = (uint64_t)json_integer_value(off);
		end = p->offset + p->size;
		out->chunks.total += p->size;
	}
	return 0;
}

void vmanifest_free(struct vmanifest *m)
{
	json_decref(m->root);
	free(m->chunks.c);
	memset(m, 0, sizeof(*m));
}

json_t *vmanifest_json(const char *customer, const char *id, unsigned size_mib, const char *generation,
		       const char *host_id, const struct pchunk_list *chunks)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < chunks->n; i++) {
		const struct pchunk *p = &chunks->c[i];

		if (json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:I, s:s}", "key", p->key, "offset",
						       (json_int_t)p->offset, "size", (json_int_t)p->size, "zsize",
						       (json_int_t)p->zsize, "sha256", p->sha256)) < 0) {
			json_decref(a);
			return NULL;
		}
	}
	if (!a)
		return NULL;
	return json_pack("{s:i, s:s, s:s, s:i, s:s, s:s, s:I, s:o}", "version", VOL_MANIFEST_V, "customer", customer,
			 "id", id, "size_mib", (int)size_mib, "generation", generation, "host_id", host_id ? host_id : "",
			 "bytes", (json_int_t)chunks->total, "chunks", a);
}
