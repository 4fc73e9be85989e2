/* port_resp: an HTTP/1.1 answer from a server inside a sandbox, read with
 * Debian's http-parser (nodejs/http-parser 2.9): its status, its headers
 * (bounded: PORT_RESP_HEAD_MAX bytes, PORT_RESP_MAX_HEADERS lines), and its
 * body decoded from whatever framing the server chose (Content-Length,
 * chunked, or up to the end of the connection). Interim 1xx answers are
 * skipped, except 101 (an upgrade), which ends the head and leaves what
 * follows to the caller. Pure: no I/O (fuzz_portresp feeds it bytes). The
 * server is untrusted: every length is bounded before it is stored. */
#include "ports_int.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static struct port_resp *of(http_parser *p)
{
	return p->data;
}

/* Store n more bytes of the header being read: its name (value 0) or its
 * value. http-parser may hand either over in pieces. */
static int hdr_add(struct port_resp *r, const char *at, size_t n, int value)
{
	if (!value && r->last != 1) {
		/* A new header's name. */
		if (r->nh >= PORT_RESP_MAX_HEADERS) {
			r->too_big = 1;
			return 1;
		}
		r->name_off[r->nh] = r->value_off[r->nh] = r->hlen;
		r->name_len[r->nh] = r->value_len[r->nh] = 0;
		r->nh++;
	} else if (value && r->last != 2) {
		if (!r->nh)
			return 1;
		r->value_off[r->nh - 1] = r->hlen;
	}
	r->last = value ? 2 : 1;
	if (n > sizeof(r->hbuf) - r->hlen) {
		r->too_big = 1;
		return 1;
	}
	memcpy(r->hbuf + r->hlen, at, n);
	r->hlen += n;
	if (value)
		r->value_len[r->nh - 1] += n;
	else
		r->name_len[r->nh - 1] += n;
	return 0;
}

static int on_field(http_parser *p, const char *at, size_t n)
{
	return hdr_add(of(p), at, n, 0);
}

static int on_value(http_parser *p, const char *at, size_t n)
{
	return hdr_add(of(p), at, n, 1);
}

static int on_headers_complete(http_parser *p)
{
	struct port_resp *r = of(p);

	if (p->status_code < 100 || p->status_code > 599) {
		snprintf(r->why, sizeof(r->why), "status %u is not an HTTP status", p->status_code);
		r->bad_status = 1;
		return -1;
	}
	if (p->status_code < 200 && p->status_code != 101) {
		/* 100 Continue and the like: the answer is still to come. */
		r->nh = 0;
		r->hlen = 0;
		r->last = 0;
		r->interim = 1;
		return 0;
	}
	r->status = (int)p->status_code;
	r->head_done = 1;
	r->chunked = (p->flags & F_CHUNKED) != 0;
	r->has_length = !r->chunked && p->content_length != ULLONG_MAX;
	r->content_length = r->has_length ? p->content_length : 0;
	if (r->status == 101) {
		r->upgrade = 1;
		return 2; /* no body: what follows is another protocol's */
	}
	if (r->head_request || r->status == 204 || r->status == 304) {
		r->has_length = 0;
		return 1;
	}
	return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
	struct port_resp *r = of(p);

	if (buf_add(r->body, at, n) < 0)
		return 1;
	return 0;
}

static int on_message_complete(http_parser *p)
{
	struct port_resp *r = of(p);

	if (r->interim) {
		r->interim = 0;
		return 0;
	}
	r->done = 1;
	http_parser_pause(p, 1); /* nothing after it is read as a second answer */
	return 0;
}

static const http_parser_settings settings = {
	.on_header_field = on_field,
	.on_header_value = on_value,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

void port_resp_init(struct port_resp *r, int head_request, struct buf *body)
{
	memset(r, 0, sizeof(*r));
	http_parser_init(&r->p, HTTP_RESPONSE);
	r->p.data = r;
	r->head_request = head_request;
	r->body = body;
}

long port_resp_feed(struct port_resp *r, const char *p, size_t n)
{
	size_t k;

	if (r->failed)
		return -1;
	if (r->done || r->upgrade)
		return 0;
	k = http_parser_execute(&r->p, &settings, p, n);
	if (HTTP_PARSER_ERRNO(&r->p) == HPE_PAUSED) {
		/* Our pause at the answer's end, or the upgrade's end of head. */
		return (long)k;
	}
	if (HTTP_PARSER_ERRNO(&r->p) != HPE_OK || r->too_big) {
		r->failed = 1;
		if (!r->bad_status)
			snprintf(r->why, sizeof(r->why), "%s",
				 r->too_big ? "its head is too large" : http_errno_description(HTTP_PARSER_ERRNO(&r->p)));
		return -1;
	}
	if (r->upgrade)
		return (long)k; /* the rest is the new protocol's */
	if (k != n && !r->done) {
		r->failed = 1;
		snprintf(r->why, sizeof(r->why), "%s", "bytes after its end");
		return -1;
	}
	return (long)k;
}

int port_resp_eof(struct port_resp *r)
{
	if (r->failed)
		return -1;
	if (r->done || r->upgrade)
		return 0;
	http_parser_execute(&r->p, &settings, NULL, 0);
	if (r->done)
		return 0;
	r->failed = 1;
	snprintf(r->why, sizeof(r->why), "%s",
		 r->head_done ? "the connection ended inside its body" : "the connection ended before an answer");
	return -1;
}

int port_resp_header(const struct port_resp *r, size_t i, const char **name, size_t *name_len, const char **value,
		     size_t *value_len)
{
	if (i >= r->nh)
		return 0;
	*name = r->hbuf + r->name_off[i];
	*name_len = r->name_len[i];
	*value = r->hbuf + r->value_off[i];
	*value_len = r->value_len[i];
	return 1;
}
