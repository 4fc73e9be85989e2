/* presign: presigned GET URLs for host-reported S3 keys, checked against the
 * task's or session's own prefix first (see presign.h). */
#include "presign.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void presign_entry(const struct s3_config *c, unsigned expires_s, json_t *o, const char *prefix, const char *what,
		   time_t now)
{
	const char *key = json_string_value(json_object_get(o, "s3_key"));
	struct kiln_err err = { .code = "" };
	char *url = NULL;

	if (!json_is_object(o))
		return;
	json_object_del(o, "url_error");
	if (key && c->endpoint) {
		if (s3_key_under(key, prefix, &err) < 0) {
			fprintf(stderr, "kiln-api: %s: a host reported an S3 key outside %s: not signed: %s\n", what, prefix,
				err.message);
			json_object_set_new(o, "url_error",
					    json_string("not available: the host reported a storage key outside this "
							"task's or session's own prefix"));
		} else if (!(url = s3_presign_get(c, key, expires_s, now, &err))) {
			json_object_set_new(o, "url_error", json_string(err.message));
		}
	}
	json_object_set_new(o, "url", url ? json_string(url) : json_null());
	free(url);
}

json_t *presign_task_unavailable(json_t *task, const char *why)
{
	const char *k;
	json_t *v;
	size_t i;

	json_array_foreach(json_object_get(task, "outputs"), i, v)
		if (json_is_object(v) && json_string_value(json_object_get(v, "s3_key"))) {
			json_object_set_new(v, "url", json_null());
			json_object_set_new(v, "url_error", json_string(why));
		}
	json_object_foreach(json_object_get(task, "artifacts"), k, v)
		if (json_is_object(v) && json_string_value(json_object_get(v, "s3_key"))) {
			json_object_set_new(v, "url", json_null());
			json_object_set_new(v, "url_error", json_string(why));
		}
	return task;
}

json_t *presign_task(const struct s3_config *c, unsigned expires_s, json_t *task, const char *base, time_t now)
{
	const char *id = json_string_value(json_object_get(task, "id"));
	const char *customer = json_string_value(json_object_get(task, "customer"));
	char prefix[600], what[96];
	const char *k;
	json_t *v;
	size_t i;

	/* No id or customer: an empty prefix, which nothing lies under. */
	if (id && customer && strlen(base) + strlen(id) + strlen(customer) + 3 <= sizeof(prefix))
		snprintf(prefix, sizeof(prefix), "%s%s/%s/", base, customer, id);
	else
		prefix[0] = '\0';
	snprintf(what, sizeof(what), "task %.80s", id ? id : "?");
	json_array_foreach(json_object_get(task, "outputs"), i, v)
		presign_entry(c, expires_s, v, prefix, what, now);
	json_object_foreach(json_object_get(task, "artifacts"), k, v)
		presign_entry(c, expires_s, v, prefix, what, now);
	return task;
}

void presign_session_outputs(const struct s3_config *c, unsigned expires_s, json_t *reply, const char *base,
			     const char *customer, const char *id, time_t now)
{
	char prefix[600], what[96];
	json_t *v;
	size_t i;

	if (strlen(base) + strlen(id) + strlen(customer) + 20 <= sizeof(prefix))
		snprintf(prefix, sizeof(prefix), "%s%s/sessions/%s/outputs/", base, customer, id);
	else
		prefix[0] = '\0';
	snprintf(what, sizeof(what), "session %.80s", id);
	json_array_foreach(json_object_get(reply, "outputs"), i, v)
		presign_entry(c, expires_s, v, prefix, what, now);
}
