/* multipart: streaming multipart/form-data parser (lib/multipart.h). The
 * body is scanned for "\r\n--BOUNDARY" with a carry-over of at most the
 * delimiter's length, so memory stays bounded whatever the upload's size;
 * part headers are collected up to MULTIPART_MAX_HEADERS and only
 * Content-Disposition is interpreted. Hostile input: fuzzed (fuzz_multipart). */
#include "multipart.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "buf.h"

enum mp_state {
	MP_PREAMBLE, /* before the first delimiter */
	MP_AFTER,    /* just after a delimiter: "--" (the end) or CRLF (a part) */
	MP_HEADERS,  /* a part's header block */
	MP_DATA,     /* a part's content */
	MP_DONE,     /* after the closing delimiter */
};

struct multipart {
	enum mp_state state;
	int err;
	unsigned parts;
	char delim[MULTIPART_MAX_BOUNDARY + 5]; /* "\r\n--" + boundary */
	size_t dlen;
	struct buf pend; /* bytes not yet decided on */
	struct multipart_cb cb;
	void *cls;
};

/* RFC 2046 bchars, and a boundary may not end with a space. */
static int bchar(unsigned char c)
{
	return isalnum(c) || strchr("'()+_,-./:=? ", c) != NULL;
}

int multipart_boundary(const char *ct, char out[MULTIPART_MAX_BOUNDARY + 1])
{
	const char *p;
	size_t n = 0;

	out[0] = '\0';
	if (!ct || strncasecmp(ct, "multipart/form-data", 19) != 0)
		return -EINVAL;
	p = ct + 19;
	while (*p) {
		while (*p == ';' || *p == ' ' || *p == '\t')
			p++;
		if (strncasecmp(p, "boundary=", 9) == 0) {
			p += 9;
			if (*p == '"') {
				for (p++; *p && *p != '"'; p++) {
					if (n >= MULTIPART_MAX_BOUNDARY || !bchar((unsigned char)*p))
						return -EINVAL;
					out[n++] = *p;
				}
				if (*p != '"')
					return -EINVAL;
			} else {
				for (; *p && *p != ';' && *p != ' ' && *p != '\t'; p++) {
					if (n >= MULTIPART_MAX_BOUNDARY || !bchar((unsigned char)*p))
						return -EINVAL;
					out[n++] = *p;
				}
			}
			out[n] = '\0';
			if (n == 0 || out[n - 1] == ' ') {
				out[0] = '\0';
				return -EINVAL;
			}
			return 0;
		}
		/* Skip another parameter (quoted values may hold ';'). */
		while (*p && *p != ';') {
			if (*p == '"') {
				for (p++; *p && *p != '"'; p++)
					if (*p == '\\' && p[1])
						p++;
				if (!*p)
					return -EINVAL;
			}
			p++;
		}
	}
	return -EINVAL;
}

struct multipart *multipart_new(const char *boundary, const struct multipart_cb *cb, void *cls)
{
	struct multipart *m;
	size_t n = strlen(boundary);

	if (n == 0 || n > MULTIPART_MAX_BOUNDARY)
		return NULL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	memcpy(m->delim, "\r\n--", 4);
	memcpy(m->delim + 4, boundary, n);
	m->dlen = 4 + n;
	m->cb = *cb;
	m->cls = cls;
	/* The carry-over plus one fed slice, plus a whole header block. */
	buf_init(&m->pend, MULTIPART_MAX_HEADERS + 64 * 1024 + sizeof(m->delim));
	/* A body may open with the delimiter without a CRLF before it: give
	 * it one, so that every delimiter looks the same. */
	if (buf_add(&m->pend, "\r\n", 2) < 0) {
		free(m);
		return NULL;
	}
	return m;
}

/* One Content-Disposition parameter value: quoted (backslash escapes) or a
 * token, copied into out (cap bytes; out NULL: skipped). Returns the
 * position after it, or NULL when malformed or too long. */
static const char *param_value(const char *p, char *out, size_t cap)
{
	size_t n = 0;

	if (*p == '"') {
		for (p++; *p && *p != '"'; p++) {
			if (*p == '\\' && p[1])
				p++;
			if (out && n + 1 >= cap)
				return NULL;
			if (out)
				out[n++] = *p;
		}
		if (*p != '"')
			return NULL;
		p++;
	} else {
		for (; *p && *p != ';' && *p != ' ' && *p != '\t'; p++) {
			if (out && n + 1 >= cap)
				return NULL;
			if (out)
				out[n++] = *p;
		}
	}
	if (out)
		out[n] = '\0';
	return p;
}

/* A header block (lines separated by CRLF, no final empty line): find
 * Content-Disposition: form-data and its name and filename. */
static int parse_headers(struct multipart *m, char *h)
{
	char name[MULTIPART_MAX_NAME + 1], filename[MULTIPART_MAX_NAME + 1];
	int seen = 0;
	char *line, *next;

	name[0] = filename[0] = '\0';
	for (line = h; line && *line; line = next) {
		char *colon, *v;

		next = strstr(line, "\r\n");
		if (next) {
			*next = '\0';
			next += 2;
		}
		colon = strchr(line, ':');
		if (!colon)
			return -EPROTO;
		*colon = '\0';
		if (strcasecmp(line, "Content-Disposition") != 0)
			continue;
		v = colon + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		if (strncasecmp(v, "form-data", 9) != 0 || (v[9] && v[9] != ';' && v[9] != ' '))
			return -EPROTO;
		seen = 1;
		v += 9;
		while (*v) {
			char key[16];
			size_t k = 0;

			while (*v == ';' || *v == ' ' || *v == '\t')
				v++;
			if (!*v)
				break;
			while (*v && *v != '=' && *v != ';' && k + 1 < sizeof(key))
				key[k++] = *v++;
			key[k] = '\0';
			if (*v != '=') {
				/* A parameter without a value, or a name too long
				 * to be one we read: skip it. */
				while (*v && *v != ';')
					v++;
				continue;
			}
			v++;
			if (strcasecmp(key, "name") == 0)
				v = (char *)param_value(v, name, sizeof(name));
			else if (strcasecmp(key, "filename") == 0)
				v = (char *)param_value(v, filename, sizeof(filename));
			else
				v = (char *)param_value(v, NULL, 0);
			if (!v)
				return -EPROTO;
		}
	}
	if (!seen)
		return -EPROTO;
	return m->cb.part_begin ? m->cb.part_begin(m->cls, name, filename) : 0;
}

static int emit(struct multipart *m, const char *p, size_t n)
{
	if (!n || !m->cb.part_data)
		return 0;
	return m->cb.part_data(m->cls, (const uint8_t *)p, n);
}

/* Work through what pend holds; returns 0 when it needs more bytes. */
static int step(struct multipart *m)
{
	for (;;) {
		char *p = m->pend.p;
		size_t len = m->pend.len;
		char *hit;
		int rc;

		switch (m->state) {
		case MP_PREAMBLE:
		case MP_DATA:
			hit = len >= m->dlen ? memmem(p, len, m->delim, m->dlen) : NULL;
			if (!hit) {
				/* Keep what could be the start of a delimiter. */
				size_t keep = m->dlen - 1, give = len > keep ? len - keep : 0;
				if (m->state == MP_DATA && (rc = emit(m, p, give)) < 0)
					return rc;
				buf_consume(&m->pend, give);
				return 0;
			}
			if (m->state == MP_DATA) {
				if ((rc = emit(m, p, (size_t)(hit - p))) < 0)
					return rc;
				if (m->cb.part_end && (rc = m->cb.part_end(m->cls)) < 0)
					return rc;
			}
			buf_consume(&m->pend, (size_t)(hit - p) + m->dlen);
			m->state = MP_AFTER;
			break;
		case MP_AFTER: {
			size_t i = 0;

			if (len < 2)
				return 0;
			if (p[0] == '-' && p[1] == '-') {
				m->state = MP_DONE;
				buf_reset(&m->pend);
				return 0;
			}
			/* Transport padding, then CRLF. */
			while (i < len && (p[i] == ' ' || p[i] == '\t'))
				i++;
			if (i > 64)
				return -EPROTO;
			if (len - i < 2)
				return 0;
			if (p[i] != '\r' || p[i + 1] != '\n')
				return -EPROTO;
			if (++m->parts > MULTIPART_MAX_PARTS)
				return -EPROTO;
			buf_consume(&m->pend, i + 2);
			m->state = MP_HEADERS;
			break;
		}
		case MP_HEADERS: {
			char *end;

			/* An empty header block is a bare CRLF (refused below:
			 * no Content-Disposition). */
			if (len >= 2 && p[0] == '\r' && p[1] == '\n')
				return -EPROTO;
			end = memmem(p, len, "\r\n\r\n", 4);
			if (!end) {
				if (len > MULTIPART_MAX_HEADERS)
					return -EPROTO;
				return 0;
			}
			if ((size_t)(end - p) > MULTIPART_MAX_HEADERS || memchr(p, '\0', (size_t)(end - p)))
				return -EPROTO;
			*end = '\0';
			rc = parse_headers(m, p);
			if (rc < 0)
				return rc;
			/* Everything up to the blank line is consumed: the data
			 * starts right after it, and an empty part's next
			 * delimiter ("\r\n--B") is found at once. */
			buf_consume(&m->pend, (size_t)(end - p) + 4);
			m->state = MP_DATA;
			break;
		}
		case MP_DONE:
			buf_reset(&m->pend);
			return 0;
		}
	}
}

int multipart_feed(struct multipart *m, const uint8_t *p, size_t n)
{
	const size_t slice = 32 * 1024;

	if (m->err)
		return m->err;
	while (n > 0) {
		size_t k = n < slice ? n : slice;
		int rc;

		if (m->state == MP_DONE)
			return 0; /* the epilogue is ignored */
		rc = buf_add(&m->pend, p, k);
		if (rc == 0)
			rc = step(m);
		if (rc < 0) {
			m->err = rc == -E2BIG ? -EPROTO : rc;
			return m->err;
		}
		p += k;
		n -= k;
	}
	return 0;
}

int multipart_finish(struct multipart *m)
{
	if (m->err)
		return m->err;
	return m->state == MP_DONE ? 0 : -EPROTO;
}

void multipart_free(struct multipart *m)
{
	if (!m)
		return;
	buf_free(&m->pend);
	free(m);
}
