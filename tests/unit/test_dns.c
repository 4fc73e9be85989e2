/* test_dns: unit tests for lib/dns.c, the sandbox resolver's DNS codec: query
 * parsing (and what it refuses), replies byte for byte, upstream queries and
 * responses (CNAME chains, compression, pointer loops, truncation at every
 * length, mismatches) and allowlist matching. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dns.h"

/* ---- a hand-written message builder --------------------------------------- */

struct msg {
	uint8_t b[DNS_MAX_MSG + 64];
	size_t len;
};

static void m_u8(struct msg *m, uint8_t v)
{
	assert_true(m->len < sizeof(m->b));
	m->b[m->len++] = v;
}

static void m_u16(struct msg *m, uint16_t v)
{
	m_u8(m, (uint8_t)(v >> 8));
	m_u8(m, (uint8_t)v);
}

static void m_u32(struct msg *m, uint32_t v)
{
	m_u16(m, (uint16_t)(v >> 16));
	m_u16(m, (uint16_t)v);
}

static void m_raw(struct msg *m, const void *p, size_t n)
{
	assert_true(n <= sizeof(m->b) - m->len);
	memcpy(m->b + m->len, p, n);
	m->len += n;
}

/* Labels of a dotted name, without the root byte (to end with m_ptr or m_u8(0)).
 * Returns the offset where they start. No validation: tests write bad names too. */
static size_t m_labels(struct msg *m, const char *name)
{
	size_t start = m->len;

	while (*name) {
		size_t n = strcspn(name, ".");

		m_u8(m, (uint8_t)n);
		m_raw(m, name, n);
		name += n;
		if (*name == '.')
			name++;
	}
	return start;
}

/* A whole uncompressed name; returns its offset. */
static size_t m_name(struct msg *m, const char *name)
{
	size_t start = m_labels(m, name);

	m_u8(m, 0);
	return start;
}

static void m_ptr(struct msg *m, size_t off)
{
	m_u16(m, (uint16_t)(0xc000 | off));
}

static void m_header(struct msg *m, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns, uint16_t ar)
{
	m->len = 0;
	m_u16(m, id);
	m_u16(m, flags);
	m_u16(m, qd);
	m_u16(m, an);
	m_u16(m, ns);
	m_u16(m, ar);
}

/* Type, class, TTL, rdlength: what follows an owner name. */
static void m_rr(struct msg *m, uint16_t type, uint16_t class, uint32_t ttl, uint16_t rdlen)
{
	m_u16(m, type);
	m_u16(m, class);
	m_u32(m, ttl);
	m_u16(m, rdlen);
}

/* An A record's type..rdata with the address a.b.c.d, after its owner. */
static void m_a(struct msg *m, uint32_t ttl, uint8_t a, uint8_t b, uint8_t c, uint8_t d)
{
	m_rr(m, DNS_TYPE_A, DNS_CLASS_IN, ttl, 4);
	m_u8(m, a);
	m_u8(m, b);
	m_u8(m, c);
	m_u8(m, d);
}

/* A CNAME's type..rdata with the target written by the caller between
 * m_cname_begin and m_cname_end (which fills in the rdlength). */
static size_t m_cname_begin(struct msg *m, uint32_t ttl)
{
	m_rr(m, DNS_TYPE_CNAME, DNS_CLASS_IN, ttl, 0);
	return m->len;
}

static void m_cname_end(struct msg *m, size_t rdata)
{
	size_t n = m->len - rdata;

	m->b[rdata - 2] = (uint8_t)(n >> 8);
	m->b[rdata - 1] = (uint8_t)n;
}

static void m_set_an(struct msg *m, uint16_t an)
{
	m->b[6] = (uint8_t)(an >> 8);
	m->b[7] = (uint8_t)an;
}

#define RESP_FLAGS 0x8180 /* QR, RD, RA, NOERROR */
#define ID 0x4b1d

/* A response header and the question for name / A / IN. */
static void m_response(struct msg *m, const char *qname, uint16_t an)
{
	m_header(m, ID, RESP_FLAGS, 1, an, 0, 0);
	m_name(m, qname);
	m_u16(m, DNS_TYPE_A);
	m_u16(m, DNS_CLASS_IN);
}

static uint32_t ip(uint8_t a, uint8_t b, uint8_t c, uint8_t d)
{
	uint8_t p[4] = { a, b, c, d };
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

/* parse_response over an exact-size heap copy, so a sanitizer build sees any
 * read past len. */
static int parse_resp(const uint8_t *p, size_t len, uint16_t id, const char *name, struct dns_addr *out,
		      size_t max, size_t *n, int *rcode)
{
	uint8_t *c = malloc(len ? len : 1);
	int rc;

	assert_non_null(c);
	memcpy(c, p, len);
	rc = dns_parse_response(c, len, id, name, out, max, n, rcode);
	free(c);
	return rc;
}

static int parse_query(const uint8_t *p, size_t len, struct dns_query *q, uint16_t *id)
{
	uint8_t *c = malloc(len ? len : 1);
	int rc;

	assert_non_null(c);
	memcpy(c, p, len);
	rc = dns_parse_query(c, len, q, id);
	free(c);
	return rc;
}

/* A name of n characters: labels of 63 'a's (the last one shorter) joined by dots. */
static void long_name(char *out, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		out[i] = i % 64 == 63 ? '.' : 'a';
	out[n] = '\0';
	assert_true(n == 0 || (out[n - 1] != '.' && out[0] != '.'));
}

/* ---- queries from the guest ------------------------------------------------ */

/* A query header and question for name / qtype / IN. */
static void m_query(struct msg *m, uint16_t id, uint16_t flags, const char *name, uint16_t qtype)
{
	m_header(m, id, flags, 1, 0, 0, 0);
	m_name(m, name);
	m_u16(m, qtype);
	m_u16(m, DNS_CLASS_IN);
}

static void test_parse_query_ok(void **state)
{
	struct dns_query q;
	struct msg m;
	char name[DNS_MAX_NAME + 2];
	uint16_t id = 0;

	/* Upper case is lower-cased; rd and the rest come through. */
	m_query(&m, 0xabcd, 0x0100, "WWW.Example.ORG", DNS_TYPE_AAAA);
	assert_int_equal(parse_query(m.b, m.len, &q, &id), 0);
	assert_int_equal(q.id, 0xabcd);
	assert_int_equal(id, 0xabcd);
	assert_int_equal(q.rd, 1);
	assert_string_equal(q.name, "www.example.org");
	assert_int_equal(q.qtype, DNS_TYPE_AAAA);
	assert_int_equal(q.qclass, DNS_CLASS_IN);
	assert_int_equal(q.question_len, 17 + 4);

	/* rd clear; AD (dig sets it) and CD ignored; '-', '_' and digits fine. */
	m_query(&m, 1, 0x0030, "_dmarc.a-1.example", DNS_TYPE_A);
	assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
	assert_int_equal(q.rd, 0);
	assert_string_equal(q.name, "_dmarc.a-1.example");

	/* An EDNS OPT record (with one option) is accepted and ignored. */
	m_query(&m, 2, 0x0100, "example.org", DNS_TYPE_A);
	m.b[11] = 1;
	m_u8(&m, 0);
	m_rr(&m, 41, 1232, 0, 6);
	m_u16(&m, 10); /* COOKIE */
	m_u16(&m, 2);
	m_u16(&m, 0xffff);
	assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
	assert_string_equal(q.name, "example.org");
	assert_int_equal(q.question_len, 13 + 4);

	/* The root. */
	m_query(&m, 3, 0, "", 2);
	assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
	assert_string_equal(q.name, "");
	assert_int_equal(q.question_len, 5);

	/* A 63-byte label and a 253-character name are the largest allowed. */
	long_name(name, DNS_MAX_NAME);
	m_query(&m, 4, 0, name, DNS_TYPE_A);
	assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
	assert_string_equal(q.name, name);
	assert_int_equal(q.question_len, DNS_MAX_NAME + 2 + 4);
}

static void test_parse_query_rejects(void **state)
{
	static const char *bad_names[] = {
		"a b.example", "a*.example", "*.example", "a/b", "a\\b", "a\x7f.b", "a\xc3\xa9.b", "a=b", "a@b",
	};
	struct dns_query q;
	struct msg m, ok;
	char name[DNS_MAX_NAME + 2];
	uint16_t id;
	size_t i;

	m_query(&ok, 0x7777, 0x0100, "example.org", DNS_TYPE_A);
	assert_int_equal(parse_query(ok.b, ok.len, &q, NULL), 0);

#define REJECT(msg_, len_)                                                    \
	do {                                                                  \
		id = 0;                                                       \
		assert_int_equal(parse_query((msg_), (len_), &q, &id), -1); \
		assert_int_equal(id, 0x7777);                                 \
	} while (0)

	/* Header fields: QR=1, opcodes 1 (IQUERY), 2 (STATUS), 5 (UPDATE). */
	m = ok;
	m.b[2] |= 0x80;
	REJECT(m.b, m.len);
	for (i = 1; i < 16; i++) {
		m = ok;
		m.b[2] = (uint8_t)((m.b[2] & 0x87) | i << 3);
		REJECT(m.b, m.len);
	}
	/* Counts: qdcount 0 and 2, any answer or authority, arcount 2. */
	m = ok;
	m.b[5] = 0;
	REJECT(m.b, m.len);
	m = ok;
	m.b[5] = 2;
	m_name(&m, "example.org");
	m_u16(&m, 1);
	m_u16(&m, 1);
	REJECT(m.b, m.len);
	m = ok;
	m.b[7] = 1;
	m_ptr(&m, 12);
	m_a(&m, 1, 1, 2, 3, 4);
	REJECT(m.b, m.len);
	m = ok;
	m.b[9] = 1;
	m_ptr(&m, 12);
	m_a(&m, 1, 1, 2, 3, 4);
	REJECT(m.b, m.len);
	m = ok;
	m.b[11] = 2;
	m_u8(&m, 0);
	m_rr(&m, 41, 512, 0, 0);
	m_u8(&m, 0);
	m_rr(&m, 41, 512, 0, 0);
	REJECT(m.b, m.len);
	/* The additional record must be OPT, at the root, and whole. */
	m = ok;
	m.b[11] = 1;
	m_ptr(&m, 12);
	m_a(&m, 1, 1, 2, 3, 4);
	REJECT(m.b, m.len);
	m = ok;
	m.b[11] = 1;
	m_name(&m, "x");
	m_rr(&m, 41, 512, 0, 0);
	REJECT(m.b, m.len);
	m = ok;
	m.b[11] = 1;
	m_u8(&m, 5); /* a 5-byte label whose bytes read like OPT's type, class... */
	m_rr(&m, 41, 512, 0, 0);
	REJECT(m.b, m.len);
	m = ok;
	m.b[11] = 1;
	m_u8(&m, 0);
	m_rr(&m, 41, 512, 0, 4);
	m_u16(&m, 0);
	REJECT(m.b, m.len);
	/* arcount 1 and no record; trailing bytes after the question. */
	m = ok;
	m.b[11] = 1;
	REJECT(m.b, m.len);
	m = ok;
	m_u8(&m, 0);
	REJECT(m.b, m.len);

	/* Labels: 64 bytes; a 254-character name; an empty label. */
	memset(name, 'a', 64);
	strcpy(name + 64, ".org");
	m_query(&m, 0x7777, 0, name, DNS_TYPE_A);
	REJECT(m.b, m.len);
	name[1] = '.'; /* 1 + 62: fine */
	m_query(&m, 0x7777, 0, name, DNS_TYPE_A);
	assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
	long_name(name, DNS_MAX_NAME + 1);
	m_query(&m, 0x7777, 0, name, DNS_TYPE_A);
	REJECT(m.b, m.len);
	m_header(&m, 0x7777, 0, 1, 0, 0, 0);
	m_u8(&m, 1);
	m_u8(&m, 'a');
	m_u8(&m, 0); /* an empty label in the middle is a root byte: name ends */
	m_u8(&m, 1);
	m_u8(&m, 'b');
	m_u8(&m, 0);
	m_u16(&m, 1);
	m_u16(&m, 1);
	REJECT(m.b, m.len);

	/* Characters outside letters, digits, '-', '_', including a '.' and a NUL
	 * inside a label. */
	for (i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		m_query(&m, 0x7777, 0, bad_names[i], DNS_TYPE_A);
		if (parse_query(m.b, m.len, &q, NULL) != -1)
			fail_msg("query for \"%s\" accepted", bad_names[i]);
	}
	m = ok;
	m.b[13] = '.'; /* "e" of "example" */
	REJECT(m.b, m.len);
	m = ok;
	m.b[13] = '\0';
	REJECT(m.b, m.len);

	/* Compression in the question, even a pointer to the header; the
	 * extended label types 01 and 10. */
	m_header(&m, 0x7777, 0, 1, 0, 0, 0);
	m_labels(&m, "www");
	m_ptr(&m, 12);
	m_u16(&m, 1);
	m_u16(&m, 1);
	REJECT(m.b, m.len);
	m_header(&m, 0x7777, 0, 1, 0, 0, 0);
	m_ptr(&m, 0);
	m_u16(&m, 1);
	m_u16(&m, 1);
	REJECT(m.b, m.len);
	m = ok;
	m.b[12] |= 0x40;
	REJECT(m.b, m.len);
	m = ok;
	m.b[12] |= 0x80;
	REJECT(m.b, m.len);

	/* Up to DNS_MAX_MSG bytes (a large OPT record), not one more (the id
	 * still comes back). */
	for (i = DNS_MAX_MSG; i <= DNS_MAX_MSG + 1; i++) {
		m = ok;
		m.b[11] = 1;
		m_u8(&m, 0);
		m_rr(&m, 41, 4096, 0, (uint16_t)(i - m.len - 10));
		memset(m.b + m.len, 0, i - m.len);
		m.len = i;
		if (i == DNS_MAX_MSG)
			assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
		else
			REJECT(m.b, m.len);
	}
	m = ok;

	/* Every truncation of a valid query (with OPT) fails; the id comes back
	 * only once the header is complete. */
	m.b[11] = 1;
	m_u8(&m, 0);
	m_rr(&m, 41, 1232, 0, 0);
	assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
	for (i = 0; i < m.len; i++) {
		id = 0;
		assert_int_equal(parse_query(m.b, i, &q, &id), -1);
		assert_int_equal(id, i >= 12 ? 0x7777 : 0);
	}
	assert_int_equal(dns_parse_query(NULL, 0, &q, NULL), -1);
#undef REJECT
}

/* ---- replies to the guest ------------------------------------------------ */

static void test_build_reply_bytes(void **state)
{
	static const uint8_t want[] = {
		0x12, 0x34, 0x81, 0x80, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, /* header */
		1, 'a', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0, 0x00, 0x01, 0x00, 0x01, /* question */
		0xc0, 0x0c, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x04, 10, 0, 0, 1,
		0xc0, 0x0c, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x04, 192, 168, 1, 2,
	};
	struct dns_query q = { .id = 0x1234, .rd = 1, .name = "a.example", .qtype = 1, .qclass = 1 };
	uint32_t addrs[2] = { ip(10, 0, 0, 1), ip(192, 168, 1, 2) };
	struct dns_query back;
	struct dns_addr got[4];
	uint8_t out[600];
	size_t len, n, cap;
	int rcode;

	len = dns_build_reply(&q, DNS_RCODE_NOERROR, addrs, 2, 60, out, sizeof(out));
	assert_int_equal(len, sizeof(want));
	assert_memory_equal(out, want, sizeof(want));

	/* Exactly that cap is enough, one byte less is not. */
	assert_int_equal(dns_build_reply(&q, 0, addrs, 2, 60, out, sizeof(want)), sizeof(want));
	for (cap = 0; cap < sizeof(want); cap++)
		assert_int_equal(dns_build_reply(&q, 0, addrs, 2, 60, out, cap), 0);

	/* It reads back as a response to that question. */
	assert_int_equal(parse_resp(want, sizeof(want), 0x1234, "a.example", got, 4, &n, &rcode), 0);
	assert_int_equal(n, 2);
	assert_int_equal(rcode, 0);
	assert_int_equal(got[0].addr, addrs[0]);
	assert_int_equal(got[1].addr, addrs[1]);
	assert_int_equal(got[1].ttl, 60);

	/* NXDOMAIN, rd clear, mixed-case name in q: lower-cased labels, no answers. */
	q.rd = 0;
	strcpy(q.name, "A.Example");
	q.qtype = DNS_TYPE_AAAA;
	len = dns_build_reply(&q, DNS_RCODE_NXDOMAIN, NULL, 0, 0, out, sizeof(out));
	assert_int_equal(len, 12 + 11 + 4);
	assert_int_equal(out[2], 0x80);
	assert_int_equal(out[3], 0x83);
	assert_int_equal(out[7], 0);
	assert_memory_equal(out + 12, want + 12, 11);
	assert_int_equal(out[12 + 11 + 1], DNS_TYPE_AAAA);
	/* With QR cleared it is the query it answers. */
	out[2] &= 0x7f;
	out[3] = 0;
	assert_int_equal(parse_query(out, len, &back, NULL), 0);
	assert_string_equal(back.name, "a.example");
	assert_int_equal(back.qtype, DNS_TYPE_AAAA);
	assert_int_equal(back.question_len, 15);

	/* Refused: bad rcode, invalid names, answers without addresses, too many. */
	assert_int_equal(dns_build_reply(&q, 16, NULL, 0, 0, out, sizeof(out)), 0);
	assert_int_equal(dns_build_reply(&q, -1, NULL, 0, 0, out, sizeof(out)), 0);
	assert_int_equal(dns_build_reply(&q, 0, NULL, 1, 0, out, sizeof(out)), 0);
	strcpy(q.name, "a..b");
	assert_int_equal(dns_build_reply(&q, 0, NULL, 0, 0, out, sizeof(out)), 0);
	strcpy(q.name, "a.b.");
	assert_int_equal(dns_build_reply(&q, 0, NULL, 0, 0, out, sizeof(out)), 0);
	strcpy(q.name, "a b");
	assert_int_equal(dns_build_reply(&q, 0, NULL, 0, 0, out, sizeof(out)), 0);
	strcpy(q.name, "x");
	{
		static uint32_t many[300];
		static uint8_t big[DNS_MAX_MSG + 100];

		/* 12 + 3 + 4 + 255 * 16 = 4099 > DNS_MAX_MSG, whatever the cap. */
		assert_int_equal(dns_build_reply(&q, 0, many, 254, 0, big, sizeof(big)), 12 + 3 + 4 + 254 * 16);
		assert_int_equal(dns_build_reply(&q, 0, many, 255, 0, big, sizeof(big)), 0);
		assert_int_equal(dns_build_reply(&q, 0, many, 300, 0, big, sizeof(big)), 0);
	}
}

static void test_build_formerr(void **state)
{
	static const uint8_t want[] = { 0xbe, 0xef, 0x80, 0x81, 0, 0, 0, 0, 0, 0, 0, 0 };
	uint8_t out[12];

	assert_int_equal(dns_build_formerr(0xbeef, out, sizeof(out)), 12);
	assert_memory_equal(out, want, 12);
	assert_int_equal(dns_build_formerr(0xbeef, out, 11), 0);
}

/* Guest query -> reply -> read back as an upstream response would be. */
static void test_query_reply_roundtrip(void **state)
{
	uint32_t addrs[3] = { ip(1, 1, 1, 1), ip(8, 8, 4, 4), ip(255, 0, 0, 1) };
	struct dns_addr got[3];
	struct dns_query q;
	struct msg m;
	uint8_t out[512];
	size_t len, n;
	int rcode;

	m_query(&m, 0x0102, 0x0100, "Files.PyPI.org", DNS_TYPE_A);
	m.b[11] = 1;
	m_u8(&m, 0);
	m_rr(&m, 41, 4096, 0, 0);
	assert_int_equal(parse_query(m.b, m.len, &q, NULL), 0);
	len = dns_build_reply(&q, DNS_RCODE_NOERROR, addrs, 3, 30, out, sizeof(out));
	assert_int_equal(len, 12 + q.question_len + 3 * 16);
	assert_int_equal(parse_resp(out, len, 0x0102, "files.pypi.org", got, 3, &n, &rcode), 0);
	assert_int_equal(n, 3);
	assert_int_equal(got[2].addr, addrs[2]);
	assert_int_equal(got[2].ttl, 30);
	/* The question is the guest's, lower-cased. */
	assert_memory_equal(out + 12, "\x05" "files\x04pypi\x03org", 15);
}

/* ---- upstream queries and responses ----------------------------------------- */

static void test_build_query(void **state)
{
	static const uint8_t want[] = {
		0xbe, 0xef, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0x00, 0x01, 0x00, 0x01,
	};
	static const char *bad[] = { "a..b", ".a", "a.", ".", "a b", "a*", "*.a", "a\xff" };
	char name[DNS_MAX_NAME + 2];
	struct dns_query q;
	uint8_t out[300];
	size_t cap, i;

	assert_int_equal(dns_build_query(0xbeef, "Example.COM", DNS_TYPE_A, out, sizeof(out)), sizeof(want));
	assert_memory_equal(out, want, sizeof(want));
	for (cap = 0; cap < sizeof(want); cap++)
		assert_int_equal(dns_build_query(0xbeef, "example.com", DNS_TYPE_A, out, cap), 0);
	/* What we send is a query we would accept. */
	assert_int_equal(parse_query(want, sizeof(want), &q, NULL), 0);
	assert_int_equal(q.rd, 1);

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (dns_build_query(1, bad[i], DNS_TYPE_A, out, sizeof(out)) != 0)
			fail_msg("query built for \"%s\"", bad[i]);
	assert_int_equal(dns_build_query(1, NULL, DNS_TYPE_A, out, sizeof(out)), 0);
	long_name(name, DNS_MAX_NAME);
	assert_int_equal(dns_build_query(1, name, DNS_TYPE_A, out, sizeof(out)), 12 + 255 + 4);
	long_name(name, DNS_MAX_NAME + 1);
	assert_int_equal(dns_build_query(1, name, DNS_TYPE_A, out, sizeof(out)), 0);
	memset(name, 'a', 64);
	name[64] = '\0';
	assert_int_equal(dns_build_query(1, name, DNS_TYPE_A, out, sizeof(out)), 0);
	name[63] = '\0';
	assert_int_equal(dns_build_query(1, name, DNS_TYPE_A, out, sizeof(out)), 12 + 65 + 4);
}

/* build_query -> the upstream's answer written by hand -> parse_response. */
static void test_response_roundtrip(void **state)
{
	struct dns_addr got[4];
	struct msg m;
	size_t n = 99;
	int rcode = -1;

	m.len = dns_build_query(ID, "example.com", DNS_TYPE_A, m.b, sizeof(m.b));
	assert_int_equal(m.len, 29);
	m.b[2] = 0x81; /* QR, RD */
	m.b[3] = 0x80; /* RA */
	m_set_an(&m, 2);
	m_ptr(&m, 12);
	m_a(&m, 3600, 93, 184, 216, 34);
	m_ptr(&m, 12);
	m_a(&m, 0xffffffffu, 93, 184, 216, 35);
	assert_int_equal(parse_resp(m.b, m.len, ID, "example.com", got, 4, &n, &rcode), 0);
	assert_int_equal(rcode, DNS_RCODE_NOERROR);
	assert_int_equal(n, 2);
	assert_int_equal(got[0].addr, ip(93, 184, 216, 34));
	assert_int_equal(got[0].ttl, 3600);
	assert_int_equal(got[1].addr, ip(93, 184, 216, 35));
	assert_int_equal(got[1].ttl, 86400);

	/* The upstream may vary the case of the question (0x20 bits); so may we. */
	m.b[13] = 'E';
	m.b[21] = 'C';
	assert_int_equal(parse_resp(m.b, m.len, ID, "EXAMPLE.com", got, 4, &n, &rcode), 0);
	assert_int_equal(n, 2);

	/* max bounds what we take, in record order. */
	assert_int_equal(parse_resp(m.b, m.len, ID, "example.com", got, 1, &n, &rcode), 0);
	assert_int_equal(n, 1);
	assert_int_equal(got[0].addr, ip(93, 184, 216, 34));
	assert_int_equal(parse_resp(m.b, m.len, ID, "example.com", NULL, 0, &n, &rcode), 0);
	assert_int_equal(n, 0);

	/* NXDOMAIN with nothing else. */
	m_header(&m, ID, 0x8183, 1, 0, 0, 0);
	m_name(&m, "nope.example.com");
	m_u16(&m, 1);
	m_u16(&m, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "nope.example.com", got, 4, &n, &rcode), 0);
	assert_int_equal(rcode, DNS_RCODE_NXDOMAIN);
	assert_int_equal(n, 0);
}

/* The www.example.com -> cname1.example.com -> edge.cdn.net chain, records out
 * of order, with unrelated and other-type records in between, compressed. */
static void chain_response(struct msg *m)
{
	size_t edge, cname1, rd;

	m_response(m, "www.example.com", 9);
	/* A for the end of the chain first. */
	edge = m_name(m, "edge.cdn.net");
	m_a(m, 300, 1, 2, 3, 4);
	/* Unrelated owners: another domain, the parent, a longer name, a
	 * name that only ends like ours. */
	m_name(m, "evil.com");
	m_a(m, 300, 6, 6, 6, 6);
	m_ptr(m, 16); /* example.com */
	m_a(m, 300, 9, 9, 9, 9);
	m_labels(m, "x");
	m_ptr(m, 12); /* x.www.example.com */
	m_a(m, 300, 7, 7, 7, 7);
	/* cname1.example.com -> edge.cdn.net */
	cname1 = m_labels(m, "cname1");
	m_ptr(m, 16);
	rd = m_cname_begin(m, 60);
	m_ptr(m, edge);
	m_cname_end(m, rd);
	/* AAAA and class CH A for the chain's end: skipped. */
	m_ptr(m, edge);
	m_rr(m, DNS_TYPE_AAAA, DNS_CLASS_IN, 300, 16);
	m_raw(m, "0123456789abcdef", 16);
	m_ptr(m, edge);
	m_rr(m, DNS_TYPE_A, 3, 300, 4);
	m_u32(m, 0x05050505);
	/* www.example.com -> cname1.example.com, target compressed. */
	m_ptr(m, 12);
	rd = m_cname_begin(m, 60);
	m_ptr(m, cname1);
	m_cname_end(m, rd);
	/* A second address for the end, TTL to be clamped. */
	m_ptr(m, edge);
	m_a(m, 86401, 5, 6, 7, 8);
}

static void test_cname_chain(void **state)
{
	struct dns_addr got[8];
	struct msg m;
	size_t n, len;
	int rcode;

	chain_response(&m);
	assert_int_equal(parse_resp(m.b, m.len, ID, "www.example.com", got, 8, &n, &rcode), 0);
	assert_int_equal(n, 2);
	assert_int_equal(got[0].addr, ip(1, 2, 3, 4));
	assert_int_equal(got[0].ttl, 300);
	assert_int_equal(got[1].addr, ip(5, 6, 7, 8));
	assert_int_equal(got[1].ttl, 86400);

	/* Asked for something else in the same message: the question differs. */
	assert_int_equal(parse_resp(m.b, m.len, ID, "evil.com", got, 8, &n, &rcode), -1);
	assert_int_equal(n, 0);

	/* Every truncation is refused (the records are all needed). */
	for (len = 0; len < m.len; len++) {
		n = 99;
		if (parse_resp(m.b, len, ID, "www.example.com", got, 8, &n, &rcode) != -1)
			fail_msg("truncated to %zu bytes: accepted", len);
		assert_int_equal(n, 0);
		assert_int_equal(rcode, DNS_RCODE_SERVFAIL);
	}
}

/* h0.example -> h1.example -> ... -> hK.example, written last hop first, and
 * an A record for hK. */
static void hop_response(struct msg *m, int hops, const char *a_owner)
{
	char from[32], to[32];
	size_t rd;
	int i;

	m_response(m, "h0.example", (uint16_t)(hops + 1));
	m_name(m, a_owner);
	m_a(m, 10, 10, 0, 0, (uint8_t)hops);
	for (i = hops; i > 0; i--) {
		snprintf(from, sizeof(from), "h%d.example", i - 1);
		snprintf(to, sizeof(to), "h%d.example", i);
		m_name(m, from);
		rd = m_cname_begin(m, 10);
		m_name(m, to);
		m_cname_end(m, rd);
	}
}

static void test_cname_limits(void **state)
{
	struct dns_addr got[2];
	char end[32];
	struct msg m;
	size_t rd, n, at;
	int rcode;

	/* 8 hops are followed, 9 are not. */
	hop_response(&m, 8, "h8.example");
	assert_int_equal(parse_resp(m.b, m.len, ID, "h0.example", got, 2, &n, &rcode), 0);
	assert_int_equal(n, 1);
	assert_int_equal(got[0].addr, ip(10, 0, 0, 8));
	hop_response(&m, 9, "h9.example");
	assert_int_equal(parse_resp(m.b, m.len, ID, "h0.example", got, 2, &n, &rcode), 0);
	assert_int_equal(n, 0);
	/* ... but an A record anywhere on the followed part counts. */
	hop_response(&m, 9, "h3.example");
	assert_int_equal(parse_resp(m.b, m.len, ID, "h0.example", got, 2, &n, &rcode), 0);
	assert_int_equal(n, 1);
	snprintf(end, sizeof(end), "h%d.example", 0);
	hop_response(&m, 0, end);
	assert_int_equal(parse_resp(m.b, m.len, ID, "h0.example", got, 2, &n, &rcode), 0);
	assert_int_equal(n, 1);

	/* A CNAME loop ends the walk: a -> b -> a, A only for an unrelated c. */
	m_response(&m, "a.example", 3);
	m_name(&m, "a.example");
	rd = m_cname_begin(&m, 1);
	m_name(&m, "b.example");
	m_cname_end(&m, rd);
	m_name(&m, "b.example");
	rd = m_cname_begin(&m, 1);
	m_name(&m, "a.example");
	m_cname_end(&m, rd);
	at = m_name(&m, "c.example");
	m_a(&m, 1, 1, 1, 1, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "a.example", got, 2, &n, &rcode), 0);
	assert_int_equal(n, 0);
	/* The same loop with an A record for b: taken. */
	m.b[at + 1] = 'b';
	assert_int_equal(parse_resp(m.b, m.len, ID, "a.example", got, 2, &n, &rcode), 0);
	assert_int_equal(n, 1);

	/* A CNAME whose target does not fill its rdata exactly is malformed. */
	m_response(&m, "a.example", 2);
	m_name(&m, "a.example");
	rd = m_cname_begin(&m, 1);
	m_name(&m, "b.example");
	m_u8(&m, 0);
	m_cname_end(&m, rd);
	m_name(&m, "b.example");
	m_a(&m, 1, 1, 1, 1, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "a.example", got, 2, &n, &rcode), -1);
	m.b[rd - 1] -= 2; /* rdlength now ends inside the target name */
	assert_int_equal(parse_resp(m.b, m.len, ID, "a.example", got, 2, &n, &rcode), -1);
}

static void test_response_records(void **state)
{
	struct dns_addr got[4];
	struct msg m;
	size_t n;
	int rcode;

	/* A class-IN A record of 5 bytes is malformed; a class-CH one is skipped. */
	m_response(&m, "x.example", 1);
	m_ptr(&m, 12);
	m_rr(&m, DNS_TYPE_A, DNS_CLASS_IN, 1, 5);
	m_raw(&m, "\1\2\3\4\5", 5);
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	m.b[12 + 11 + 4 + 2 + 3] = 3; /* class CH */
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), 0);
	assert_int_equal(n, 0);
	/* Unknown types of any size are skipped; rdata past the end is not. */
	m_response(&m, "x.example", 2);
	m_ptr(&m, 12);
	m_rr(&m, 16, DNS_CLASS_IN, 1, 3);
	m_raw(&m, "\2hi", 3);
	m_ptr(&m, 12);
	m_a(&m, 7, 127, 0, 0, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), 0);
	assert_int_equal(n, 1);
	assert_int_equal(got[0].ttl, 7);
	m.b[12 + 11 + 4 + 2 + 9] = 200;
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	/* More answers announced than present. */
	m_response(&m, "x.example", 2);
	m_ptr(&m, 12);
	m_a(&m, 7, 127, 0, 0, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	m_set_an(&m, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), 0);
	/* Authority and additional sections are not read (whatever is there). */
	m.b[9] = 5;
	m.b[11] = 5;
	m_raw(&m, "\xc0\xc0\xc0", 3);
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), 0);
	assert_int_equal(n, 1);
}

static void test_response_mismatch(void **state)
{
	struct dns_addr got[4];
	struct msg ok, m;
	size_t n;
	int rcode;

	m_response(&ok, "x.example", 1);
	m_ptr(&ok, 12);
	m_a(&ok, 7, 127, 0, 0, 1);
	assert_int_equal(parse_resp(ok.b, ok.len, ID, "x.example", got, 4, &n, &rcode), 0);

	assert_int_equal(parse_resp(ok.b, ok.len, ID + 1, "x.example", got, 4, &n, &rcode), -1);
	assert_int_equal(parse_resp(ok.b, ok.len, ID, "y.example", got, 4, &n, &rcode), -1);
	assert_int_equal(parse_resp(ok.b, ok.len, ID, "x.example.com", got, 4, &n, &rcode), -1);
	assert_int_equal(parse_resp(ok.b, ok.len, ID, "example", got, 4, &n, &rcode), -1);
	assert_int_equal(parse_resp(ok.b, ok.len, ID, "x..example", got, 4, &n, &rcode), -1);
	m = ok;
	m.b[2] &= 0x7f; /* QR=0 */
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	m = ok;
	m.b[2] |= 0x10; /* opcode 2 */
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	m = ok;
	m.b[5] = 0; /* qdcount 0 */
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	m = ok;
	m.b[5] = 2;
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	m = ok;
	m.b[12 + 11 + 1] = DNS_TYPE_AAAA;
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	m = ok;
	m.b[12 + 11 + 3] = 3; /* class CH */
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	/* A label holding a '.' is not two labels. */
	m_response(&m, "x.example", 1);
	m.b[12] = 9;
	m.b[13] = 'x';
	m.b[14] = '.';
	memcpy(m.b + 15, "example\0", 8);
	m.len = 12 + 11;
	m_u16(&m, 1);
	m_u16(&m, 1);
	m_ptr(&m, 12);
	m_a(&m, 7, 127, 0, 0, 1);
	m_set_an(&m, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	/* Over DNS_MAX_MSG. */
	m = ok;
	m.len = DNS_MAX_MSG + 1;
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", got, 4, &n, &rcode), -1);
	/* Bad arguments. */
	assert_int_equal(dns_parse_response(ok.b, ok.len, ID, NULL, got, 4, &n, &rcode), -1);
	assert_int_equal(dns_parse_response(NULL, 0, ID, "x.example", got, 4, &n, &rcode), -1);
	assert_int_equal(dns_parse_response(ok.b, ok.len, ID, "x.example", NULL, 4, &n, &rcode), -1);
	assert_int_equal(dns_parse_response(ok.b, ok.len, ID, "x.example", got, 4, NULL, &rcode), -1);
}

/* An A record (127.0.0.1) owned by whatever the caller wrote, after a valid
 * question for x.example; returns whether parse_response accepted it. */
static int owner_ok(struct msg *m, size_t *n)
{
	struct dns_addr got[2];
	int rcode;

	m_a(m, 1, 127, 0, 0, 1);
	return parse_resp(m->b, m->len, ID, "x.example", got, 2, n, &rcode) == 0;
}

static void test_compression_pointers(void **state)
{
	char name[DNS_MAX_NAME + 2];
	struct msg m;
	size_t at, i, rd, n;
	int rcode;

	/* Control: a pointer back to the question is fine. */
	m_response(&m, "x.example", 1);
	m_ptr(&m, 12);
	assert_true(owner_ok(&m, &n));
	assert_int_equal(n, 1);

	/* A pointer to itself. */
	m_response(&m, "x.example", 1);
	m_ptr(&m, m.len);
	assert_false(owner_ok(&m, &n));
	/* Labels, then a pointer back to their own start (a loop that moves). */
	m_response(&m, "x.example", 1);
	at = m_labels(&m, "x");
	m_ptr(&m, at);
	assert_false(owner_ok(&m, &n));
	/* A pointer into its own labels, even one whose walk would end: the
	 * label "\0x", then a pointer to its second byte (a root byte). */
	m_response(&m, "x.example", 1);
	at = m.len;
	m_u8(&m, 2);
	m_u8(&m, 0);
	m_u8(&m, 'x');
	m_ptr(&m, at + 1);
	assert_false(owner_ok(&m, &n));
	/* Two names pointing at each other. */
	m_response(&m, "x.example", 2);
	at = m.len;
	m_ptr(&m, at + 2 + 10 + 4);
	m_a(&m, 1, 1, 1, 1, 1);
	m_ptr(&m, at);
	assert_false(owner_ok(&m, &n));
	/* Into the header. */
	for (i = 0; i < 12; i++) {
		m_response(&m, "x.example", 1);
		m_ptr(&m, i);
		assert_false(owner_ok(&m, &n));
	}
	/* Past the end of the message. */
	m_response(&m, "x.example", 1);
	m_ptr(&m, 0x3fff);
	assert_false(owner_ok(&m, &n));
	/* A pointer cut in half. */
	m_response(&m, "x.example", 1);
	m_u8(&m, 0xc0);
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", NULL, 0, &n, &rcode), -1);
	/* Extended label types 01 and 10. */
	m_response(&m, "x.example", 1);
	m_u8(&m, 0x41);
	m_u8(&m, 'x');
	m_u8(&m, 0);
	assert_false(owner_ok(&m, &n));
	m_response(&m, "x.example", 1);
	m_u8(&m, 0x81);
	m_u8(&m, 'x');
	m_u8(&m, 0);
	assert_false(owner_ok(&m, &n));
	/* In the question, a pointer can only go into the header: refused. */
	m_header(&m, ID, RESP_FLAGS, 1, 0, 0, 0);
	m_ptr(&m, 0);
	m_u16(&m, 1);
	m_u16(&m, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, "", NULL, 0, &n, &rcode), -1);

	/* Forward: the first answer's owner points at a name written later
	 * (the second answer's CNAME target); control with the pointer fixed. */
	m_response(&m, "x.example", 2);
	at = m.len;
	m_ptr(&m, 0);
	m_a(&m, 1, 1, 1, 1, 1);
	m_ptr(&m, 12);
	rd = m_cname_begin(&m, 1);
	m_name(&m, "y.example");
	m_cname_end(&m, rd);
	m.b[at] = (uint8_t)(0xc0 | rd >> 8);
	m.b[at + 1] = (uint8_t)rd;
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", NULL, 0, &n, &rcode), -1);
	m.b[at + 1] = 12;
	assert_int_equal(parse_resp(m.b, m.len, ID, "x.example", NULL, 0, &n, &rcode), 0);

	/* Pointers to pointers: 32 jumps are allowed, 33 are not. The chain
	 * sits in the rdata of an unknown type, the A owner points at its end. */
	for (i = 31; i <= 32; i++) {
		size_t k, r;

		m_response(&m, "x.example", 2);
		m_ptr(&m, 12);
		m_rr(&m, 0xff00, DNS_CLASS_IN, 1, (uint16_t)(2 * i));
		r = m.len;
		m_ptr(&m, 12);
		for (k = 1; k < i; k++)
			m_ptr(&m, r + 2 * (k - 1));
		m_ptr(&m, r + 2 * (i - 1)); /* the A owner: one more jump */
		assert_true(owner_ok(&m, &n) == (i == 31));
		if (i == 31)
			assert_int_equal(n, 1);
	}

	/* Names made too long by compression: 2 + 255 bytes refused, a
	 * 253-character name through a pointer accepted. */
	long_name(name, DNS_MAX_NAME);
	m_response(&m, name, 1);
	m_labels(&m, "b");
	m_ptr(&m, 12);
	m_a(&m, 1, 1, 1, 1, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, name, NULL, 0, &n, &rcode), -1);
	m_response(&m, name, 1);
	m_labels(&m, "a");
	m_ptr(&m, 12 + 64); /* the name without its first 63-byte label */
	m_a(&m, 1, 1, 1, 1, 1);
	assert_int_equal(parse_resp(m.b, m.len, ID, name, NULL, 0, &n, &rcode), 0);
}

/* ---- allowlist matching ------------------------------------------------------- */

static void test_name_match(void **state)
{
	static const struct {
		const char *pattern, *name;
		int want;
	} t[] = {
		{ "example.org", "example.org", 1 },
		{ "example.org", "www.example.org", 0 },
		{ "example.org", "example.org.evil", 0 },
		{ "example.org", "xexample.org", 0 },
		{ "example.org", "example.or", 0 },
		{ "Example.ORG", "example.org", 1 },
		{ "example.org", "EXAMPLE.org", 1 },
		{ "*.example.org", "a.example.org", 1 },
		{ "*.example.org", "a.b.example.org", 1 },
		{ "*.example.org", "A.B.Example.Org", 1 },
		{ "*.EXAMPLE.org", "a.example.org", 1 },
		{ "*.example.org", "example.org", 0 },
		{ "*.example.org", "xexample.org", 0 },
		{ "*.example.org", "a.xexample.org", 0 },
		{ "*.example.org", ".example.org", 0 },
		{ "*.example.org", "a.example.org.evil", 0 },
		{ "*.example.org", "a.example.or", 0 },
		{ "*.org", "example.org", 1 },
		{ "*.org", "org", 0 },
		{ "pypi.org", "files.pypi.org", 0 },
		{ "*.pypi.org", "files.pypi.org", 1 },
		/* Nonsense patterns and names match nothing. */
		{ "*", "example.org", 0 },
		{ "*.", "example.org", 0 },
		{ "*", "*", 0 },
		{ "", "", 0 },
		{ "", "a", 0 },
		{ "a", "", 0 },
		{ "*.example.org", "", 0 },
		{ "a.*.org", "a.b.org", 0 },
		{ "*example.org", "aexample.org", 0 },
		{ "**.example.org", "a.example.org", 0 },
		{ "*.*.org", "a.b.org", 0 },
		{ "example.org.", "example.org", 0 },
		{ "example.org", "example.org.", 0 },
		{ "a..b", "a..b", 0 },
		{ "*.b", "a..b", 0 },
		{ "a b", "a b", 0 },
	};
	char longn[DNS_MAX_NAME + 2], pat[DNS_MAX_NAME + 4];
	size_t i;

	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (dns_name_match(t[i].pattern, t[i].name) != t[i].want)
			fail_msg("dns_name_match(\"%s\", \"%s\"): expected %d", t[i].pattern, t[i].name, t[i].want);
	assert_int_equal(dns_name_match(NULL, "a"), 0);
	assert_int_equal(dns_name_match("a", NULL), 0);

	/* The longest name under a wildcard. */
	long_name(longn, DNS_MAX_NAME);
	snprintf(pat, sizeof(pat), "*.%s", longn + 64);
	assert_int_equal(dns_name_match(pat, longn), 1);
	assert_int_equal(dns_name_match(longn, longn), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_query_ok),
		cmocka_unit_test(test_parse_query_rejects),
		cmocka_unit_test(test_build_reply_bytes),
		cmocka_unit_test(test_build_formerr),
		cmocka_unit_test(test_query_reply_roundtrip),
		cmocka_unit_test(test_build_query),
		cmocka_unit_test(test_response_roundtrip),
		cmocka_unit_test(test_cname_chain),
		cmocka_unit_test(test_cname_limits),
		cmocka_unit_test(test_response_records),
		cmocka_unit_test(test_response_mismatch),
		cmocka_unit_test(test_compression_pointers),
		cmocka_unit_test(test_name_match),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
