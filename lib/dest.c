/* dest: a customer's S3 destination, parsed and validated (see dest.h). */
#include "dest.h"

#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>

static int is_lower_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* http(s)://HOST[:PORT] with an optional trailing '/': HOST of letters,
 * digits, '.', '-' (or a bracketed IPv6 literal), PORT 1-65535. No user
 * info, path, query or fragment: the bucket is added path-style. */
static const char *endpoint_problem(const char *e)
{
	const char *h, *p;
	size_t n = strlen(e);

	if (!strncmp(e, "http://", 7))
		h = e + 7;
	else if (!strncmp(e, "https://", 8))
		h = e + 8;
	else
		return "expected an http:// or https:// URL";
	if (n > DEST_ENDPOINT_MAX)
		return "at most 256 characters";
	if (n && e[n - 1] == '/')
		n--;
	p = h;
	if (*p == '[') {
		for (p++; p < e + n && *p != ']'; p++)
			if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F') ||
			      *p == ':'))
				return "bad IPv6 address";
		if (p >= e + n || p == h + 1)
			return "bad IPv6 address";
		p++;
	} else {
		for (; p < e + n && *p != ':'; p++)
			if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
			      *p == '.' || *p == '-'))
				return "the host may hold only letters, digits, '.' and '-' (no user, path or query)";
		if (p == h)
			return "no host";
	}
	if (p < e + n) {
		unsigned long port = 0;
		const char *q;

		if (*p != ':' || p + 1 == e + n)
			return "expected :PORT after the host";
		for (q = p + 1; q < e + n; q++) {
			if (*q < '0' || *q > '9' || q - p > 5)
				return "the port: 1-65535 (no path or query after it)";
			port = port * 10 + (unsigned long)(*q - '0');
		}
		if (port < 1 || port > 65535)
			return "the port: 1-65535";
	}
	return NULL;
}

/* S3's bucket naming rules: 3-63 of [a-z0-9.-], starting and ending with a
 * letter or digit, no "..", not shaped like an IPv4 address. */
static const char *bucket_problem(const char *b)
{
	size_t n = strlen(b);
	int dots = 0, digits_only = 1;

	if (n < 3 || n > DEST_BUCKET_MAX)
		return "3-63 characters";
	if (!is_lower_alnum(b[0]) || !is_lower_alnum(b[n - 1]))
		return "must start and end with a lowercase letter or digit";
	for (size_t i = 0; i < n; i++) {
		if (!is_lower_alnum(b[i]) && b[i] != '.' && b[i] != '-')
			return "only lowercase letters, digits, '.' and '-'";
		if (b[i] == '.' && (b[i + 1] == '.' || b[i + 1] == '-' || (i && b[i - 1] == '-')))
			return "no \"..\", \".-\" or \"-.\"";
		if (b[i] == '.')
			dots++;
		else if (b[i] < '0' || b[i] > '9')
			digits_only = 0;
	}
	if (dots == 3 && digits_only)
		return "must not look like an IP address";
	return NULL;
}

/* "" or 1-256 bytes ending in '/', not starting with '/', and a valid key
 * start: no control characters, no empty, "." or ".." segments. */
static const char *prefix_problem(const char *p)
{
	size_t n = strlen(p), seg = 0;

	if (!n)
		return NULL;
	if (n > DEST_PREFIX_MAX)
		return "at most 256 characters";
	if (p[n - 1] != '/')
		return "must end with '/'";
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];

		if (c < 0x20 || c == 0x7f || c == '\\')
			return "no control characters or backslashes";
		if (c == '/') {
			if (i == seg)
				return "no empty segments (\"//\" or a leading '/')";
			if ((i - seg == 1 && p[seg] == '.') || (i - seg == 2 && p[seg] == '.' && p[seg + 1] == '.'))
				return "no \".\" or \"..\" segments";
			seg = i + 1;
		}
	}
	return NULL;
}

/* 1..max printable ASCII characters, no spaces. */
static const char *credential_problem(const char *s, size_t max)
{
	size_t n = strlen(s);

	if (n < 1 || n > max)
		return max == DEST_ACCESS_MAX ? "1-128 characters" : "1-256 characters";
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
			return "printable ASCII characters only, no spaces";
	return NULL;
}

static const char *region_problem(const char *r)
{
	size_t n = strlen(r);

	if (n < 1 || n > DEST_REGION_MAX)
		return "1-32 characters";
	for (size_t i = 0; i < n; i++)
		if (!is_lower_alnum(r[i]) && r[i] != '-')
			return "only lowercase letters, digits and '-'";
	return NULL;
}

static int is_extra(const char *k, const char *const *extra)
{
	for (; extra && *extra; extra++)
		if (!strcmp(k, *extra))
			return 1;
	return 0;
}

int dest_from_json(json_t *o, enum dest_secret secret, const char *const *extra, struct dest *d,
		   struct kiln_err *err)
{
	static const struct {
		const char *name;
		size_t off, size;
	} fields[] = {
		{ "endpoint", offsetof(struct dest, endpoint), sizeof(d->endpoint) },
		{ "region", offsetof(struct dest, region), sizeof(d->region) },
		{ "bucket", offsetof(struct dest, bucket), sizeof(d->bucket) },
		{ "prefix", offsetof(struct dest, prefix), sizeof(d->prefix) },
		{ "access_key", offsetof(struct dest, access_key), sizeof(d->access_key) },
		{ "secret_key", offsetof(struct dest, secret_key), sizeof(d->secret_key) },
	};
	const char *k, *why;
	json_t *v;

	memset(d, 0, sizeof(*d));
	if (!json_is_object(o))
		return kiln_err_set(err, KERR_INVALID_REQUEST, "destination: expected a JSON object");
	json_object_foreach(o, k, v) {
		size_t i;

		if (is_extra(k, extra))
			continue;
		for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
			if (!strcmp(k, fields[i].name))
				break;
		if (i == sizeof(fields) / sizeof(fields[0]) || (secret == DEST_SECRET_NONE && !strcmp(k, "secret_key"))) {
			dest_wipe(d);
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%.64s: unknown field", k);
		}
		if (!json_is_string(v)) {
			dest_wipe(d);
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: expected a string", k);
		}
		/* Too long for its field: refused below by its own rule. */
		if (json_string_length(v) >= fields[i].size || strlen(json_string_value(v)) != json_string_length(v)) {
			dest_wipe(d);
			return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: too long or contains NUL", k);
		}
		memcpy((char *)d + fields[i].off, json_string_value(v), json_string_length(v) + 1);
	}
	if (!d->region[0])
		snprintf(d->region, sizeof(d->region), "us-east-1");
	if (!d->endpoint[0] || !d->bucket[0] || !d->access_key[0] ||
	    (secret == DEST_SECRET_REQUIRED && !d->secret_key[0])) {
		const char *miss = !d->endpoint[0] ? "endpoint" : !d->bucket[0] ? "bucket"
							   : !d->access_key[0] ? "access_key" : "secret_key";

		dest_wipe(d);
		return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: required", miss);
	}
	if ((why = endpoint_problem(d->endpoint)))
		k = "endpoint";
	else if ((why = region_problem(d->region)))
		k = "region";
	else if ((why = bucket_problem(d->bucket)))
		k = "bucket";
	else if ((why = prefix_problem(d->prefix)))
		k = "prefix";
	else if ((why = credential_problem(d->access_key, DEST_ACCESS_MAX)))
		k = "access_key";
	else if (secret == DEST_SECRET_REQUIRED && (why = credential_problem(d->secret_key, DEST_SECRET_MAX)))
		k = "secret_key";
	if (why) {
		dest_wipe(d);
		return kiln_err_set(err, KERR_INVALID_REQUEST, "%s: %s", k, why);
	}
	/* One trailing '/' of the endpoint is dropped: keys are joined with one. */
	{
		size_t n = strlen(d->endpoint);

		if (d->endpoint[n - 1] == '/')
			d->endpoint[n - 1] = '\0';
	}
	return 0;
}

int dest_parse(const char *text, size_t len, enum dest_secret secret, struct dest *d, struct kiln_err *err)
{
	json_error_t je;
	json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	int r;

	if (!j) {
		memset(d, 0, sizeof(*d));
		return kiln_err_set(err, KERR_INVALID_JSON, "line %d, column %d: %s", je.line, je.column, je.text);
	}
	r = dest_from_json(j, secret, NULL, d, err);
	json_decref(j);
	return r;
}

json_t *dest_to_json(const struct dest *d, int with_secret)
{
	json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s}", "endpoint", d->endpoint, "region", d->region, "bucket",
			      d->bucket, "prefix", d->prefix, "access_key", d->access_key);

	if (j && with_secret && json_object_set_new(j, "secret_key", json_string(d->secret_key)) < 0) {
		json_decref(j);
		return NULL;
	}
	return j;
}

int dest_same_place(const struct dest *a, const struct dest *b)
{
	return !strcmp(a->endpoint, b->endpoint) && !strcmp(a->region, b->region) && !strcmp(a->bucket, b->bucket) &&
	       !strcmp(a->prefix, b->prefix);
}

void dest_s3_config(const struct dest *d, const struct netaddr_allow *allow, struct s3_config *c)
{
	memset(c, 0, sizeof(*c));
	c->guarded = 1;
	c->allow = allow;
	c->endpoint = d->endpoint;
	c->region = d->region;
	c->bucket = d->bucket;
	c->access_key = d->access_key;
	c->secret_key = d->secret_key;
}

void dest_mask_access(const char *access_key, char *out, size_t out_size)
{
	size_t n = strlen(access_key), i;

	if (!out_size)
		return;
	for (i = 0; i < n && i + 1 < out_size; i++)
		out[i] = i < 4 && n > 8 ? access_key[i] : '*';
	out[i] = '\0';
}

void dest_wipe(struct dest *d)
{
	OPENSSL_cleanse(d, sizeof(*d));
}
