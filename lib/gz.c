/* gz: gzip content coding for HTTP bodies over zlib (lib/gz.h): a bounded
 * streaming inflate for request bodies, a streaming deflate for answers,
 * and the Accept-Encoding / Content-Encoding readers. */
#include "gz.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int gz_in_init(struct gz_in *g, uint64_t max)
{
	memset(g, 0, sizeof(*g));
	g->max = max;
	g->buf = malloc(GZ_BLOCK);
	/* 16 + MAX_WBITS: the gzip wrapper only (a zlib or raw stream is not gzip). */
	if (!g->buf || inflateInit2(&g->z, 16 + MAX_WBITS) != Z_OK) {
		free(g->buf);
		g->buf = NULL;
		return -ENOMEM;
	}
	g->inited = 1;
	return 0;
}

int gz_in_feed(struct gz_in *g, const uint8_t *p, size_t n, int (*sink)(void *cls, const uint8_t *p, size_t n),
	       void *cls)
{
	g->z.next_in = (Bytef *)p;
	g->z.avail_in = (uInt)n; /* callers feed slices far below 4 GiB */
	for (;;) {
		int rc;
		size_t got;

		if (g->ended) {
			if (g->z.avail_in == 0)
				return 0;
			/* Another member follows the one that ended. */
			if (inflateReset(&g->z) != Z_OK)
				return -EBADMSG;
			g->ended = 0;
		}
		g->z.next_out = g->buf;
		g->z.avail_out = GZ_BLOCK;
		rc = inflate(&g->z, Z_NO_FLUSH);
		if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
			return rc == Z_MEM_ERROR ? -ENOMEM : -EBADMSG;
		got = GZ_BLOCK - g->z.avail_out;
		/* The bound is on what comes out, counted before any of it
		 * goes on: a bomb stops at max whatever its ratio. */
		if (got > g->max - g->out)
			return -EFBIG;
		g->out += got;
		if (got) {
			int r = sink(cls, g->buf, got);

			if (r < 0)
				return r;
		}
		if (rc == Z_STREAM_END) {
			g->ended = 1;
			continue;
		}
		/* Output room left means zlib took all it could: done until
		 * more input comes (a full buffer: more may be pending). */
		if (g->z.avail_out != 0 && g->z.avail_in == 0)
			return 0;
		if (rc == Z_BUF_ERROR && got == 0)
			return 0;
	}
}

int gz_in_finish(struct gz_in *g)
{
	return g->inited && g->ended ? 0 : -EBADMSG;
}

void gz_in_free(struct gz_in *g)
{
	if (g->inited)
		inflateEnd(&g->z);
	free(g->buf);
	memset(g, 0, sizeof(*g));
}

int gz_out_init(struct gz_out *g)
{
	memset(g, 0, sizeof(*g));
	/* The fastest level: downloads are compressed whenever a client takes
	 * gzip (fetch always says it does), on a host shared by many VMs. */
	if (deflateInit2(&g->z, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
		return -ENOMEM;
	g->inited = 1;
	return 0;
}

ssize_t gz_out_step(struct gz_out *g, const uint8_t *in, size_t n, size_t *used, int fin, uint8_t *out, size_t cap)
{
	int rc;

	*used = 0;
	if (g->ended)
		return 0;
	g->z.next_in = (Bytef *)in;
	g->z.avail_in = (uInt)n;
	g->z.next_out = out;
	g->z.avail_out = (uInt)cap;
	rc = deflate(&g->z, fin ? Z_FINISH : Z_NO_FLUSH);
	if (rc == Z_STREAM_ERROR)
		return -EIO;
	if (rc == Z_STREAM_END)
		g->ended = 1;
	*used = n - g->z.avail_in;
	return (ssize_t)(cap - g->z.avail_out);
}

int gz_out_ended(const struct gz_out *g)
{
	return g->ended;
}

void gz_out_free(struct gz_out *g)
{
	if (g->inited)
		deflateEnd(&g->z);
	memset(g, 0, sizeof(*g));
}

/* One Accept-Encoding element: its coding (lowercased, at most cap - 1
 * bytes, else "") and quality (1 by default; 0 for a q that is not a
 * number in 0-1). */
static void accept_elem(const char *s, size_t n, char *coding, size_t cap, double *q)
{
	size_t i = 0, k = 0;

	*q = 1;
	while (i < n && (s[i] == ' ' || s[i] == '\t'))
		i++;
	while (i < n && s[i] != ';' && s[i] != ' ' && s[i] != '\t') {
		if (k + 1 < cap)
			coding[k++] = (char)tolower((unsigned char)s[i]);
		else
			k = cap; /* too long to be one we know */
		i++;
	}
	coding[k < cap ? k : 0] = '\0';
	while (i < n) {
		if (s[i] == ';') {
			i++;
			while (i < n && (s[i] == ' ' || s[i] == '\t'))
				i++;
			if (i + 1 < n && (s[i] == 'q' || s[i] == 'Q') && s[i + 1] == '=') {
				char num[16];
				size_t m = 0;
				char *end;
				double v;

				for (i += 2; i < n && s[i] != ';' && m + 1 < sizeof(num); i++)
					num[m++] = s[i];
				num[m] = '\0';
				v = strtod(num, &end);
				while (*end == ' ' || *end == '\t')
					end++;
				*q = (end != num && !*end && v >= 0 && v <= 1) ? v : 0;
				continue;
			}
		}
		i++;
	}
}

int gz_accept(const char *h)
{
	double q_gzip = -1, q_identity = -1, q_star = -1;
	const char *p = h;

	if (!h)
		return 0;
	while (*p) {
		size_t n = strcspn(p, ",");
		char coding[16];
		double q;

		accept_elem(p, n, coding, sizeof(coding), &q);
		/* A coding listed twice: the first says. */
		if (!strcmp(coding, "gzip") && q_gzip < 0)
			q_gzip = q;
		else if (!strcmp(coding, "identity") && q_identity < 0)
			q_identity = q;
		else if (!strcmp(coding, "*") && q_star < 0)
			q_star = q;
		p += n;
		if (*p == ',')
			p++;
	}
	{
		int identity_refused = q_identity == 0;
		double best = 0;
		int pick = identity_refused ? -1 : 0;

		/* The highest quality wins; on a tie gzip, listed by E2B
		 * first, is taken only over "*". */
		if (q_identity > best) {
			best = q_identity;
			pick = 0;
		}
		if (q_gzip > 0 && q_gzip >= best) {
			best = q_gzip;
			pick = 1;
		}
		if (q_star > best) {
			best = q_star;
			pick = identity_refused ? 1 : 0;
		}
		return pick;
	}
}

int gz_content_encoding(const char *h)
{
	size_t n;

	if (!h)
		return 0;
	while (*h == ' ' || *h == '\t')
		h++;
	n = strcspn(h, " \t;");
	if (n == 0 || (n == 8 && !strncasecmp(h, "identity", 8)))
		return 0;
	if (n == 4 && !strncasecmp(h, "gzip", 4))
		return 1;
	return -1;
}
