/* dns: the DNS message codec behind kiln-host's per-sandbox resolver. The
 * guest's queries and the upstream's responses are hostile: every read is
 * checked against the message length, names are bounded in length and in
 * compression jumps, and names are compared in their lower-cased wire form so
 * that a label holding a '.' can never pass for two labels. */
#include "dns.h"

#include <string.h>

#define HDR_LEN   12
#define WIRE_MAX  (DNS_MAX_NAME + 2) /* length-prefixed labels + the root byte */
#define LABEL_MAX 63
/* Compression jumps per name. Real servers use one, rarely two; a chain of
 * pointers to pointers buys an attacker nothing but work, so keep it short. */
#define MAX_JUMPS 32
#define MAX_CNAME_HOPS 8
#define MAX_TTL 86400u
#define TYPE_OPT 41

#define F_QR     0x8000u
#define F_OPCODE 0x7800u
#define F_RD     0x0100u
#define F_RA     0x0080u
#define F_RCODE  0x000fu

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static uint8_t lower(uint8_t c)
{
	return c >= 'A' && c <= 'Z' ? (uint8_t)(c + ('a' - 'A')) : c;
}

/* The bytes we allow in names we hand out or accept from the guest. */
static int name_char_ok(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* A name in presentation form ("" for the root, no trailing dot) to lower-cased
 * wire form. Labels 1..63 bytes of name_char_ok(), at most DNS_MAX_NAME
 * characters. Returns 0, or -1 for anything else. */
static int name_from_text(const char *name, uint8_t wire[WIRE_MAX], size_t *wlen)
{
	size_t len = strnlen(name, DNS_MAX_NAME + 1), i, lab = 0, w = 1;

	if (len > DNS_MAX_NAME)
		return -1;
	if (len == 0) {
		wire[0] = 0;
		*wlen = 1;
		return 0;
	}
	/* w indexes the next byte; wire[lab] is the current label's length byte.
	 * len <= 253 keeps w + 1 <= 255 throughout. */
	for (i = 0; i < len; i++) {
		uint8_t c = (uint8_t)name[i];

		if (c == '.') {
			if (w - lab - 1 == 0)
				return -1;
			wire[lab] = (uint8_t)(w - lab - 1);
			lab = w++;
			continue;
		}
		if (!name_char_ok(c) || w - lab - 1 == LABEL_MAX)
			return -1;
		wire[w++] = lower(c);
	}
	if (w - lab - 1 == 0)
		return -1; /* trailing dot */
	wire[lab] = (uint8_t)(w - lab - 1);
	wire[w++] = 0;
	*wlen = w;
	return 0;
}

/* A wire name (as produced by name_read) to presentation form in out
 * (DNS_MAX_NAME + 1 bytes), refusing any byte that is not name_char_ok(). */
static int name_to_text(const uint8_t *wire, char out[DNS_MAX_NAME + 1])
{
	size_t r = 0, o = 0;

	while (wire[r]) {
		uint8_t n = wire[r++], i;

		if (o)
			out[o++] = '.';
		for (i = 0; i < n; i++) {
			if (!name_char_ok(wire[r]))
				return -1;
			out[o++] = (char)wire[r++];
		}
	}
	out[o] = '\0';
	return 0;
}

/* Read the name at *off in msg (len bytes) into wire (lower-cased, at most
 * WIRE_MAX bytes including the root byte) and move *off past it.
 * Compression pointers (when allowed) must point before the start of the run of
 * labels they end and not into the header: targets strictly decrease, so the
 * walk ends even without the jump bound, which caps the work anyway. Label
 * types 01 and 10 (extended, obsolete) are refused. */
static int name_read(const uint8_t *msg, size_t len, size_t *off, int allow_ptr, uint8_t wire[WIRE_MAX],
		     size_t *wlen)
{
	size_t pos = *off, seg = *off, end = 0, w = 0;
	unsigned jumps = 0;

	for (;;) {
		uint8_t c;

		if (pos >= len)
			return -1;
		c = msg[pos];
		if (c == 0)
			break;
		if ((c & 0xc0) == 0xc0) {
			size_t target;

			if (!allow_ptr || len - pos < 2 || ++jumps > MAX_JUMPS)
				return -1;
			target = (size_t)(c & 0x3f) << 8 | msg[pos + 1];
			if (target < HDR_LEN || target >= seg)
				return -1;
			if (!end)
				end = pos + 2;
			pos = seg = target;
			continue;
		}
		if (c & 0xc0)
			return -1;
		/* This label plus the root byte still has to fit. */
		if (len - pos - 1 < c || w + 1 + c + 1 > WIRE_MAX)
			return -1;
		wire[w++] = c;
		for (pos++; c; c--)
			wire[w++] = lower(msg[pos++]);
	}
	wire[w++] = 0;
	*wlen = w;
	*off = end ? end : pos + 1;
	return 0;
}

static void put_header(uint8_t *out, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an)
{
	put16(out, id);
	put16(out + 2, flags);
	put16(out + 4, qd);
	put16(out + 6, an);
	put16(out + 8, 0);
	put16(out + 10, 0);
}

/* ---- queries from the guest ---------------------------------------------- */

/* An EDNS OPT pseudo-record at *off: owner root, type 41, rdata inside the
 * message. Its contents (UDP size, flags, options) are not used. */
static int opt_skip(const uint8_t *msg, size_t len, size_t *off)
{
	size_t p = *off, rdlen;

	if (len - p < 11 || msg[p] != 0 || get16(msg + p + 1) != TYPE_OPT)
		return -1;
	rdlen = get16(msg + p + 9);
	p += 11;
	if (len - p < rdlen)
		return -1;
	*off = p + rdlen;
	return 0;
}

int dns_parse_query(const uint8_t *msg, size_t len, struct dns_query *q, uint16_t *id_out)
{
	struct dns_query r;
	uint8_t wire[WIRE_MAX];
	size_t off = HDR_LEN, wlen;
	uint16_t flags;

	if (!msg || len < HDR_LEN)
		return -1;
	r.id = get16(msg);
	if (id_out)
		*id_out = r.id;
	if (len > DNS_MAX_MSG)
		return -1;
	flags = get16(msg + 2);
	if (flags & (F_QR | F_OPCODE))
		return -1;
	if (get16(msg + 4) != 1 || get16(msg + 6) != 0 || get16(msg + 8) != 0 || get16(msg + 10) > 1)
		return -1;
	if (name_read(msg, len, &off, 0, wire, &wlen) || len - off < 4)
		return -1;
	r.qtype = get16(msg + off);
	r.qclass = get16(msg + off + 2);
	off += 4;
	r.question_len = off - HDR_LEN;
	if (get16(msg + 10) == 1 && opt_skip(msg, len, &off))
		return -1;
	if (off != len)
		return -1; /* trailing bytes: not a query we understand */
	if (name_to_text(wire, r.name))
		return -1;
	r.rd = !!(flags & F_RD);
	*q = r;
	return 0;
}

/* ---- messages we build ------------------------------------------------- */

static size_t put_question(uint8_t *out, const uint8_t *wire, size_t wlen, uint16_t qtype, uint16_t qclass)
{
	memcpy(out, wire, wlen);
	put16(out + wlen, qtype);
	put16(out + wlen + 2, qclass);
	return wlen + 4;
}

size_t dns_build_reply(const struct dns_query *q, int rcode, const uint32_t *addrs, size_t n, uint32_t ttl,
		       uint8_t *out, size_t cap)
{
	uint8_t wire[WIRE_MAX];
	size_t wlen, need, off, i;
	uint16_t flags;

	if (!q || !out || rcode < 0 || rcode > 15 || (n && !addrs))
		return 0;
	if (n > DNS_MAX_MSG / 16 || name_from_text(q->name, wire, &wlen))
		return 0;
	need = HDR_LEN + wlen + 4 + n * 16;
	if (need > cap || need > DNS_MAX_MSG)
		return 0;

	flags = F_QR | F_RA | (q->rd ? F_RD : 0) | (uint16_t)rcode;
	put_header(out, q->id, flags, 1, (uint16_t)n);
	off = HDR_LEN + put_question(out + HDR_LEN, wire, wlen, q->qtype, q->qclass);
	for (i = 0; i < n; i++) {
		put16(out + off, 0xc000 | HDR_LEN); /* owner: the question's name */
		put16(out + off + 2, DNS_TYPE_A);
		put16(out + off + 4, DNS_CLASS_IN);
		put32(out + off + 6, ttl);
		put16(out + off + 10, 4);
		memcpy(out + off + 12, &addrs[i], 4); /* already network byte order */
		off += 16;
	}
	return off;
}

size_t dns_build_formerr(uint16_t id, uint8_t *out, size_t cap)
{
	if (!out || cap < HDR_LEN)
		return 0;
	put_header(out, id, F_QR | F_RA | DNS_RCODE_FORMERR, 0, 0);
	return HDR_LEN;
}

size_t dns_build_query(uint16_t id, const char *name, uint16_t qtype, uint8_t *out, size_t cap)
{
	uint8_t wire[WIRE_MAX];
	size_t wlen, need;

	if (!name || !out || name_from_text(name, wire, &wlen))
		return 0;
	need = HDR_LEN + wlen + 4;
	if (need > cap)
		return 0;
	put_header(out, id, F_RD, 1, 0);
	return HDR_LEN + put_question(out + HDR_LEN, wire, wlen, qtype, DNS_CLASS_IN);
}

/* ---- responses from upstream ------------------------------------------- */

struct rr {
	uint8_t owner[WIRE_MAX];
	size_t owner_len;
	uint16_t type, class;
	uint32_t ttl;
	size_t rdata, rdlen;   /* offset and length of the rdata in the message */
	uint8_t target[WIRE_MAX]; /* class-IN CNAME only */
	size_t target_len;
};

static int is_in(const struct rr *r, uint16_t type)
{
	return r->type == type && r->class == DNS_CLASS_IN;
}

/* Read the resource record at *off and move past it. A class-IN A record must
 * carry 4 bytes; a class-IN CNAME's target must fill its rdata exactly. */
static int rr_read(const uint8_t *msg, size_t len, size_t *off, struct rr *r)
{
	size_t p = *off, t;

	if (name_read(msg, len, &p, 1, r->owner, &r->owner_len) || len - p < 10)
		return -1;
	r->type = get16(msg + p);
	r->class = get16(msg + p + 2);
	r->ttl = get32(msg + p + 4);
	r->rdlen = get16(msg + p + 8);
	r->rdata = p + 10;
	if (len - r->rdata < r->rdlen)
		return -1;
	if (is_in(r, DNS_TYPE_A) && r->rdlen != 4)
		return -1;
	if (is_in(r, DNS_TYPE_CNAME)) {
		t = r->rdata;
		if (name_read(msg, len, &t, 1, r->target, &r->target_len) || t != r->rdata + r->rdlen)
			return -1;
	}
	*off = r->rdata + r->rdlen;
	return 0;
}

static int same_name(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	return alen == blen && memcmp(a, b, alen) == 0;
}

/* The names whose A records we take: `name` and the CNAME targets reached from it. */
struct chain {
	uint8_t name[MAX_CNAME_HOPS + 1][WIRE_MAX];
	size_t len[MAX_CNAME_HOPS + 1];
	size_t count;
};

static int chain_has(const struct chain *c, const uint8_t *wire, size_t wlen)
{
	size_t i;

	for (i = 0; i < c->count; i++)
		if (same_name(c->name[i], c->len[i], wire, wlen))
			return 1;
	return 0;
}

static int parse_response(const uint8_t *msg, size_t len, uint16_t id, const char *name, struct dns_addr *out,
			  size_t max, size_t *n, int *rcode)
{
	struct chain chain;
	uint8_t wire[WIRE_MAX];
	size_t off = HDR_LEN, answers, wlen, i, hop;
	uint16_t flags, ancount;
	struct rr r;

	if (len < HDR_LEN || len > DNS_MAX_MSG || name_from_text(name, chain.name[0], &chain.len[0]))
		return -1;
	chain.count = 1;
	flags = get16(msg + 2);
	if (get16(msg) != id || !(flags & F_QR) || (flags & F_OPCODE) || get16(msg + 4) != 1)
		return -1;
	ancount = get16(msg + 6);

	if (name_read(msg, len, &off, 1, wire, &wlen) || len - off < 4)
		return -1;
	if (!same_name(wire, wlen, chain.name[0], chain.len[0]) || get16(msg + off) != DNS_TYPE_A ||
	    get16(msg + off + 2) != DNS_CLASS_IN)
		return -1;
	off += 4;

	/* Validate every answer once; the walks below then cannot fail. */
	answers = off;
	for (i = 0; i < ancount; i++)
		if (rr_read(msg, len, &off, &r))
			return -1;

	/* Follow the chain one hop per walk, so that record order does not
	 * matter; stop at a name without a CNAME, a loop, or the hop bound. */
	for (hop = 0; hop < MAX_CNAME_HOPS; hop++) {
		const uint8_t *cur = chain.name[chain.count - 1];
		size_t cur_len = chain.len[chain.count - 1];
		int found = 0;

		for (off = answers, i = 0; i < ancount && !found; i++) {
			(void)rr_read(msg, len, &off, &r);
			found = is_in(&r, DNS_TYPE_CNAME) && same_name(r.owner, r.owner_len, cur, cur_len);
		}
		if (!found || chain_has(&chain, r.target, r.target_len))
			break;
		memcpy(chain.name[chain.count], r.target, r.target_len);
		chain.len[chain.count++] = r.target_len;
	}

	for (off = answers, i = 0; i < ancount; i++) {
		(void)rr_read(msg, len, &off, &r);
		if (!is_in(&r, DNS_TYPE_A) || !chain_has(&chain, r.owner, r.owner_len))
			continue;
		if (*n < max) {
			memcpy(&out[*n].addr, msg + r.rdata, 4);
			out[*n].ttl = r.ttl > MAX_TTL ? MAX_TTL : r.ttl;
			(*n)++;
		}
	}
	*rcode = flags & F_RCODE;
	return 0;
}

int dns_parse_response(const uint8_t *msg, size_t len, uint16_t id, const char *name, struct dns_addr *out,
		       size_t max, size_t *n, int *rcode)
{
	if (!n || !rcode)
		return -1;
	*n = 0;
	if (!msg || !name || (max && !out) ||
	    parse_response(msg, len, id, name, out, max, n, rcode)) {
		*n = 0;
		*rcode = DNS_RCODE_SERVFAIL;
		return -1;
	}
	return 0;
}

/* ---- allowlist matching ----------------------------------------------- */

int dns_name_match(const char *pattern, const char *name)
{
	uint8_t pw[WIRE_MAX], nw[WIRE_MAX];
	size_t plen, nlen, p;

	if (!pattern || !name || !name[0] || name_from_text(name, nw, &nlen))
		return 0;
	if (pattern[0] == '*' && pattern[1] == '.') {
		if (!pattern[2] || name_from_text(pattern + 2, pw, &plen))
			return 0;
		/* Compare at each label boundary after the first label, so that
		 * "xsuffix" never matches "*.suffix". */
		for (p = (size_t)nw[0] + 1; nw[p]; p += (size_t)nw[p] + 1)
			if (same_name(nw + p, nlen - p, pw, plen))
				return 1;
		return 0;
	}
	if (!pattern[0] || name_from_text(pattern, pw, &plen))
		return 0;
	return same_name(nw, nlen, pw, plen);
}
