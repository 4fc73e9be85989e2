/* dns: a small, strict DNS message codec for kiln-host's per-sandbox resolver.
 * Parses the guest's queries and the upstream resolver's responses, builds
 * fresh replies and upstream queries. Pure code: no sockets, no allocation. */
#ifndef KILN_DNS_H
#define KILN_DNS_H

#include <stddef.h>
#include <stdint.h>

#define DNS_MAX_NAME 253  /* presentation length without trailing dot */
#define DNS_MAX_MSG  4096 /* largest message we build or accept */
#define DNS_TYPE_A     1
#define DNS_TYPE_CNAME 5
#define DNS_TYPE_AAAA  28
#define DNS_CLASS_IN 1
#define DNS_RCODE_NOERROR  0
#define DNS_RCODE_FORMERR  1
#define DNS_RCODE_SERVFAIL 2
#define DNS_RCODE_NXDOMAIN 3
#define DNS_RCODE_REFUSED  5

struct dns_query {
	uint16_t id;
	int rd;                      /* recursion desired bit, echoed */
	char name[DNS_MAX_NAME + 1]; /* lower-cased, no trailing dot; "" for the root */
	uint16_t qtype, qclass;
	size_t question_len;         /* bytes of the question section (name + type + class) as sent */
};

/* Parse a query from a client (hostile: the guest). Accepted: QR=0, opcode 0
 * (QUERY), QDCOUNT=1, ANCOUNT=0, NSCOUNT=0, ARCOUNT 0 or 1 where that one
 * record must be a well-formed EDNS OPT record (owner root, type 41), which is
 * ignored; nothing after the last record; at most DNS_MAX_MSG bytes. The
 * question name has no compression pointers, labels of 1..63 bytes of letters,
 * digits, '-' and '_', at most DNS_MAX_NAME characters; it is lower-cased into
 * q->name. Other header bits (AA, TC, Z, AD, CD, rcode) are ignored; qtype and
 * qclass are returned as sent for the caller to judge.
 * Returns 0, or -1 when it is not such a query; in that case, when at least the
 * 12-byte header was there, *id_out (may be NULL) gets the id so the caller
 * can answer FORMERR. Any thread; q is the caller's. */
int dns_parse_query(const uint8_t *msg, size_t len, struct dns_query *q, uint16_t *id_out);

/* Build a reply to q into out (cap bytes): header (id, QR=1, opcode 0, AA=0,
 * RD echoed, RA=1, rcode), the question re-encoded from q (name as lower-case
 * labels), and n A records (addrs[i] in network byte order, owner a
 * compression pointer to the question, class IN, the given ttl). n is 0 for
 * NXDOMAIN/REFUSED/empty NOERROR. The reply carries no OPT record, so for a
 * plain UDP client pass cap <= 512. Returns the length, or 0 if it does not
 * fit in cap (or DNS_MAX_MSG), q->name is not a valid name or rcode > 15. */
size_t dns_build_reply(const struct dns_query *q, int rcode, const uint32_t *addrs, size_t n, uint32_t ttl,
		       uint8_t *out, size_t cap);

/* A FORMERR reply with just a header (id given, QR=1, RA=1, all counts 0), for
 * messages that failed to parse. Returns 12, or 0 if cap < 12. */
size_t dns_build_formerr(uint16_t id, uint8_t *out, size_t cap);

/* Build a recursive query (RD=1) for name (same rules as dns_query.name; any
 * case, written lower-cased) / qtype, class IN, with this id and no OPT
 * record. Returns the length, or 0 if name is invalid or it does not fit. */
size_t dns_build_query(uint16_t id, const char *name, uint16_t qtype, uint8_t *out, size_t cap);

struct dns_addr {
	uint32_t addr; /* network byte order */
	uint32_t ttl;
};

/* Parse an upstream response (hostile) to the query (id, name, qtype A) we
 * sent: QR=1, opcode 0, same id, QDCOUNT=1 with the same name
 * (case-insensitive), type A, class IN; at most DNS_MAX_MSG bytes. Walks the
 * answer section (compression pointers allowed only backwards, to before the
 * name they occur in and not into the header, a bounded number of jumps,
 * names at most DNS_MAX_NAME) and collects class-IN A records whose owner is
 * `name` or is reached from `name` through the CNAME records of the same answer
 * section (at most 8 CNAME hops, records in any order; when an owner has
 * several CNAMEs the first is followed). At most max addresses go to out, in
 * record order; *n gets how many. *rcode gets the response's rcode. TTLs above
 * 86400 are clamped to 86400. Records of other types or classes are skipped but
 * must be well-formed; a class-IN A record with rdlength != 4 or a CNAME whose
 * target does not exactly fill its rdata is malformed. The authority and
 * additional sections are not read. TC is not looked at: the records present
 * are used (a caller wanting a TCP retry checks msg[2] & 0x02 itself).
 * Returns 0, or -1 (with *n = 0, *rcode = DNS_RCODE_SERVFAIL) for a malformed
 * or mismatched message. Any thread; nothing kept. */
int dns_parse_response(const uint8_t *msg, size_t len, uint16_t id, const char *name, struct dns_addr *out,
		       size_t max, size_t *n, int *rcode);

/* Does name (lower-case, no trailing dot) match pattern? Pattern is an exact
 * host name ("example.org": only that name) or "*.suffix" (any name with at
 * least one more label in front of suffix: "a.suffix", "a.b.suffix", but not
 * "suffix" itself). Comparison is case-insensitive. An empty name or pattern,
 * a bare "*" or "*." and names with empty labels never match.
 * Returns 1 or 0. */
int dns_name_match(const char *pattern, const char *name);

#endif
