/* err: setter for struct kiln_err (see err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

int kiln_err_set(struct kiln_err *e, const char *code, const char *fmt, ...)
{
	va_list ap;

	if (!e)
		return -1;
	snprintf(e->code, sizeof(e->code), "%s", code);
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -1;
}
