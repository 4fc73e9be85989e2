/* err: the error table's look-ups and the setters for struct kiln_err (see
 * err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
	const char *name;
	unsigned status;
} table[KERR_COUNT_] = {
	[KERR_NONE] = { "", 500 },
#define KERR(e, wire, st) [KERR_##e] = { wire, st },
	KILN_ERRORS
#undef KERR
};

const char *kiln_err_name(enum kiln_errc c)
{
	if ((unsigned)c >= KERR_COUNT_)
		return table[KERR_INTERNAL].name;
	return table[c].name;
}

unsigned kiln_err_status(enum kiln_errc c)
{
	if ((unsigned)c >= KERR_COUNT_)
		return 500;
	return table[c].status;
}

enum kiln_errc kiln_err_lookup(const char *name)
{
	if (!name || !*name)
		return KERR_NONE;
	for (unsigned i = KERR_NONE + 1; i < KERR_COUNT_; i++)
		if (!strcmp(name, table[i].name))
			return (enum kiln_errc)i;
	return KERR_NONE;
}

int kiln_err_is_s3(enum kiln_errc c)
{
	return !strncmp(kiln_err_name(c), "s3_", 3);
}

/* Format into a copy first: the arguments may point into e->message. */
static void set_message(struct kiln_err *e, const char *fmt, va_list ap)
{
	char m[sizeof(e->message)];

	vsnprintf(m, sizeof(m), fmt, ap);
	memcpy(e->message, m, sizeof(m));
}

int kiln_err_set(struct kiln_err *e, enum kiln_errc c, const char *fmt, ...)
{
	va_list ap;

	if (!e)
		return -1;
	va_start(ap, fmt);
	set_message(e, fmt, ap);
	va_end(ap);
	kiln_err_recode(e, c);
	return -1;
}

int kiln_err_relay(struct kiln_err *e, const char *wire, enum kiln_errc fallback, const char *fmt, ...)
{
	enum kiln_errc c = kiln_err_lookup(wire);
	char w[sizeof(e->code)];
	va_list ap;

	if (!e)
		return -1;
	/* wire may point into e (a relay of e's own code). */
	snprintf(w, sizeof(w), "%s", wire && *wire ? wire : kiln_err_name(fallback));
	va_start(ap, fmt);
	set_message(e, fmt, ap);
	va_end(ap);
	e->errc = c != KERR_NONE ? c : fallback;
	memcpy(e->code, w, sizeof(w));
	return -1;
}

int kiln_err_recode(struct kiln_err *e, enum kiln_errc c)
{
	if (!e)
		return -1;
	e->errc = c;
	snprintf(e->code, sizeof(e->code), "%s", kiln_err_name(c));
	return -1;
}
