/* fuzz_dns: libFuzzer target for the sandbox resolver's DNS codec (lib/dns.c).
 * Every input goes, as an exact-size heap copy, to dns_parse_query and to
 * dns_parse_response (for a fixed id and name, for the name of the query the
 * input parses as, and for the question the input carries), and the leading
 * bytes to dns_name_match. Whatever parses must rebuild and parse back to the
 * same thing, within the documented bounds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dns.h"
#include "fuzz.h"

#define FIXED_ID   0x1234
#define FIXED_NAME "example.com"
#define MAX_ADDRS  64

static uint8_t out[DNS_MAX_MSG];

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static uint8_t *dup_exact(const uint8_t *p, size_t n)
{
	uint8_t *c = malloc(n ? n : 1);

	check(c != NULL);
	if (n)
		memcpy(c, p, n);
	return c;
}

static int lower_eq(const uint8_t *a, const uint8_t *b, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		uint8_t x = a[i], y = b[i];

		if (x >= 'A' && x <= 'Z')
			x += 'a' - 'A';
		if (y >= 'A' && y <= 'Z')
			y += 'a' - 'A';
		if (x != y)
			return 0;
	}
	return 1;
}

/* A name as dns_parse_query hands it out: lower-case letters, digits, '-',
 * '_', labels of 1..63 bytes, at most DNS_MAX_NAME characters, or "". */
static void check_name(const char *name)
{
	size_t len = strnlen(name, DNS_MAX_NAME + 1), i, lab = 0;

	check(len <= DNS_MAX_NAME);
	for (i = 0; i < len; i++) {
		char c = name[i];

		if (c == '.') {
			check(lab >= 1);
			lab = 0;
			continue;
		}
		check((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_');
		check(++lab <= 63);
	}
	check(len == 0 || lab >= 1);
}

static int parse_resp(const uint8_t *msg, size_t len, uint16_t id, const char *name, struct dns_addr *a, size_t max,
		      size_t *n, int *rcode)
{
	int rc = dns_parse_response(msg, len, id, name, a, max, n, rcode);

	check(rc == 0 || rc == -1);
	if (rc) {
		check(*n == 0 && *rcode == DNS_RCODE_SERVFAIL);
		return rc;
	}
	check(*n <= max);
	check(len >= 12 && len <= DNS_MAX_MSG && get16(msg) == id && (msg[2] & 0x80));
	check(*rcode == (msg[3] & 0x0f));
	return 0;
}

/* The response properties for one (id, name). */
static void check_response(const uint8_t *msg, size_t len, uint16_t id, const char *name)
{
	static struct dns_addr a[MAX_ADDRS], b[2], c[MAX_ADDRS];
	static uint32_t addrs[MAX_ADDRS];
	char upper[DNS_MAX_NAME + 1];
	struct dns_query q = { .id = id, .qtype = DNS_TYPE_A, .qclass = DNS_CLASS_IN };
	size_t n, nb, nc, i, rlen;
	int rcode, rc2;

	if (parse_resp(msg, len, id, name, a, MAX_ADDRS, &n, &rcode))
		return;
	check(strlen(name) <= DNS_MAX_NAME);
	for (i = 0; i < n; i++)
		check(a[i].ttl <= 86400);

	/* A smaller max takes a prefix of the same addresses. */
	check(parse_resp(msg, len, id, name, b, 2, &nb, &rc2) == 0);
	check(rc2 == rcode && nb == (n < 2 ? n : 2));
	check(memcmp(a, b, nb * sizeof(b[0])) == 0);

	/* The name is compared without regard to case. */
	for (i = 0; name[i]; i++)
		upper[i] = name[i] >= 'a' && name[i] <= 'z' ? (char)(name[i] - 'a' + 'A') : name[i];
	upper[i] = '\0';
	check(parse_resp(msg, len, id, upper, c, MAX_ADDRS, &nc, &rc2) == 0);
	check(nc == n && rc2 == rcode && memcmp(a, c, n * sizeof(a[0])) == 0);

	/* Our own reply carrying those addresses reads back the same. */
	strcpy(q.name, name);
	for (i = 0; i < n; i++)
		addrs[i] = a[i].addr;
	rlen = dns_build_reply(&q, rcode, addrs, n, 77, out, sizeof(out));
	check(rlen == 12 + strlen(name) + (name[0] ? 2 : 1) + 4 + 16 * n);
	check(parse_resp(out, rlen, id, name, c, MAX_ADDRS, &nc, &rc2) == 0);
	check(nc == n && rc2 == rcode);
	for (i = 0; i < n; i++)
		check(c[i].addr == a[i].addr && c[i].ttl == 77);
}

/* The query properties; returns 0 with *q filled when msg parses as a query. */
static int check_query(const uint8_t *msg, size_t len, struct dns_query *q)
{
	static struct dns_addr got[4];
	struct dns_query back;
	uint32_t addrs[3] = { 0x0100007f, 0xffffffff, 0 };
	size_t nl, qlen, rlen, k, n, i;
	uint16_t id = 0;
	int rc, rcode;

	if (len >= 4)
		memcpy(&addrs[2], msg + len - 4, 4);
	rc = dns_parse_query(msg, len, q, &id);
	check(rc == 0 || rc == -1);
	if (len >= 12)
		check(id == get16(msg));
	else
		check(id == 0 && rc == -1);
	if (rc) {
		/* What the caller answers instead: a bare FORMERR header. */
		if (len >= 12) {
			check(dns_build_formerr(id, out, sizeof(out)) == 12);
			check(get16(out) == id && out[2] == 0x80 && out[3] == (0x80 | DNS_RCODE_FORMERR));
			check(!memcmp(out + 4, "\0\0\0\0\0\0\0\0", 8));
		}
		return -1;
	}

	check_name(q->name);
	nl = strlen(q->name);
	qlen = (nl ? nl + 2 : 1) + 4;
	check(q->question_len == qlen && 12 + qlen <= len && len <= DNS_MAX_MSG);
	check(q->id == get16(msg) && q->rd == !!(msg[2] & 1) && !(msg[2] & 0xf8));
	check(q->qtype == get16(msg + 12 + qlen - 4) && q->qclass == get16(msg + 12 + qlen - 2));

	/* A reply: header fields as documented, the question as sent but
	 * lower-cased, then k answers. */
	k = len % 4;
	rlen = dns_build_reply(q, DNS_RCODE_NOERROR, addrs, k, 300, out, sizeof(out));
	check(rlen == 12 + qlen + 16 * k);
	check(get16(out) == q->id && out[2] == (0x80 | (q->rd ? 1 : 0)) && out[3] == 0x80);
	check(get16(out + 4) == 1 && get16(out + 6) == k && get16(out + 8) == 0 && get16(out + 10) == 0);
	check(lower_eq(out + 12, msg + 12, qlen) && memcmp(out + 12 + qlen - 4, msg + 12 + qlen - 4, 4) == 0);
	for (i = 0; i < k; i++)
		check(memcmp(out + 12 + qlen + 16 * i, "\xc0\x0c\0\1\0\1\0\0\1\x2c\0\4", 12) == 0 &&
		      memcmp(out + 12 + qlen + 16 * i + 12, &addrs[i], 4) == 0);
	check(dns_build_reply(q, DNS_RCODE_NOERROR, addrs, k, 300, out, rlen - 1) == 0);
	/* Read back as a response: exactly our addresses, for A/IN questions. */
	rc = dns_parse_response(out, rlen, q->id, q->name, got, 4, &n, &rcode);
	if (q->qtype == DNS_TYPE_A && q->qclass == DNS_CLASS_IN) {
		check(rc == 0 && n == k && rcode == 0);
		for (i = 0; i < k; i++)
			check(got[i].addr == addrs[i] && got[i].ttl == 300);
	} else {
		check(rc == -1);
	}
	/* With QR, RA and the answers gone it is the same query again. */
	rlen = dns_build_reply(q, DNS_RCODE_NXDOMAIN, NULL, 0, 0, out, sizeof(out));
	check(rlen == 12 + qlen && (out[3] & 0x0f) == DNS_RCODE_NXDOMAIN);
	out[2] &= 0x7f;
	out[3] = 0;
	check(dns_parse_query(out, rlen, &back, NULL) == 0);
	check(back.id == q->id && back.rd == q->rd && !strcmp(back.name, q->name) && back.qtype == q->qtype &&
	      back.qclass == q->qclass && back.question_len == qlen);

	/* The upstream query for that name is one we would accept, too. */
	rlen = dns_build_query(q->id, q->name, q->qtype, out, sizeof(out));
	check(rlen == 12 + qlen);
	check(dns_parse_query(out, rlen, &back, NULL) == 0);
	check(back.rd == 1 && !strcmp(back.name, q->name) && back.qtype == q->qtype &&
	      back.qclass == DNS_CLASS_IN);

	/* Allowlist matching on a real name. */
	check(dns_name_match(q->name, q->name) == (nl > 0));
	if (nl) {
		char pat[DNS_MAX_NAME + 3];
		const char *dot = strchr(q->name, '.');

		snprintf(pat, sizeof(pat), "*.%s", q->name);
		check(dns_name_match(pat, q->name) == 0);
		if (dot) {
			snprintf(pat, sizeof(pat), "*.%s", dot + 1);
			check(dns_name_match(pat, q->name) == 1);
			check(dns_name_match(dot + 1, q->name) == 0);
		}
	}
	return 0;
}

/* The input's own question (if it has an uncompressed one) as a query, so that
 * response-shaped inputs get parsed against the name they carry. */
static int question_of(const uint8_t *msg, size_t len, struct dns_query *q)
{
	size_t p = 12, end;
	uint8_t *c;
	int rc;

	if (len < 12)
		return -1;
	while (p < len && msg[p] && !(msg[p] & 0xc0))
		p += (size_t)msg[p] + 1;
	if (p >= len || msg[p])
		return -1;
	end = p + 1 + 4;
	if (end > len)
		return -1;
	c = dup_exact(msg, end);
	c[2] &= 0x07; /* QR and opcode cleared */
	memcpy(c + 4, "\0\1\0\0\0\0\0\0", 8);
	rc = dns_parse_query(c, end, q, NULL);
	free(c);
	return rc;
}

/* Is s a name we would build a query for (the validity dns_name_match wants)? */
static int valid_name(const char *s)
{
	return s[0] && dns_build_query(0, s, DNS_TYPE_A, out, sizeof(out)) > 0;
}

/* The input up to its first NUL as a pattern, the rest up to the next NUL as a name. */
static void check_match(const uint8_t *data, size_t size)
{
	char pattern[300], name[300];
	size_t pl = 0, nl = 0, i = 0;
	int m;

	while (i < size && data[i] && pl < sizeof(pattern) - 1)
		pattern[pl++] = (char)data[i++];
	pattern[pl] = '\0';
	for (i++; i < size && data[i] && nl < sizeof(name) - 1; i++)
		name[nl++] = (char)data[i];
	name[nl] = '\0';

	m = dns_name_match(pattern, name);
	check(m == 0 || m == 1);
	if (pattern[0] == '*' && pattern[1] == '.') {
		const char *suf = pattern + 2;
		size_t sl = strlen(suf);
		int want = valid_name(name) && valid_name(suf) && nl > sl + 1 && name[nl - sl - 1] == '.' &&
			   !strcasecmp(name + nl - sl, suf);

		check(m == want);
	} else {
		check(m == (valid_name(name) && valid_name(pattern) && !strcasecmp(name, pattern)));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *msg = dup_exact(data, size);
	struct dns_query q;

	if (check_query(msg, size, &q) == 0)
		check_response(msg, size, q.id, q.name);
	check_response(msg, size, FIXED_ID, FIXED_NAME);
	if (question_of(msg, size, &q) == 0)
		check_response(msg, size, size >= 2 ? get16(msg) : 0, q.name);
	check_match(msg, size);
	free(msg);
	return 0;
}
