/* conf: the JSON configuration field walker (see conf.h). */
#include "conf.h"

#include <assert.h>
#include <stdint.h>
#include <string.h>

/* The table's bounds fit the field's type: our own invariant, not input. */
static int bounds_fit(const struct conf_field *f)
{
	switch (f->type) {
	case CONF_U32:
		return f->min >= 0 && f->min <= f->max && f->max <= (double)UINT32_MAX;
	case CONF_U64:
		return f->min >= 0 && f->min <= f->max;
	case CONF_INT:
		return f->min >= (double)INT32_MIN && f->min <= f->max && f->max <= (double)INT32_MAX;
	case CONF_DOUBLE:
		return f->min <= f->max;
	default:
		return 1;
	}
}

/* A number for f: 0, or -1 with err set. Integers are compared as doubles
 * (exact up to 2^53, far above any bound we use) and stored from the JSON
 * integer itself, so that a 64-bit value keeps every bit. */
static int take_number(json_t *v, const struct conf_field *f, const char *file, const char *where, const char *dot,
		       const char *k, unsigned flags, struct kiln_err *err)
{
	int integer = f->type != CONF_DOUBLE;
	double x;

	if (!json_is_number(v) || (integer && !json_is_integer(v))) {
		if (flags & CONF_INT_ONE_MESSAGE)
			return kiln_err_set(err, KERR_CONFIG, "%s: %s%s%s: expected an integer %g..%g", file, where, dot, k,
					    f->min, f->max);
		return kiln_err_set(err, KERR_CONFIG, "%s: %s%s%s: expected a number", file, where, dot, k);
	}
	x = json_number_value(v);
	if (x < f->min || x > f->max) {
		if (flags & CONF_INT_ONE_MESSAGE)
			return kiln_err_set(err, KERR_CONFIG, "%s: %s%s%s: expected an integer %g..%g", file, where, dot, k,
					    f->min, f->max);
		return kiln_err_set(err, KERR_CONFIG, "%s: %s%s%s: expected %g..%g", file, where, dot, k, f->min, f->max);
	}
	switch (f->type) {
	case CONF_U32:
		*(uint32_t *)f->out = (uint32_t)json_integer_value(v);
		break;
	case CONF_U64:
		*(uint64_t *)f->out = (uint64_t)json_integer_value(v);
		break;
	case CONF_INT:
		*(int *)f->out = (int)json_integer_value(v);
		break;
	default:
		*(double *)f->out = x;
		break;
	}
	return 0;
}

int conf_take(json_t *obj, const char *where, const struct conf_field *fields, const char *file, unsigned flags,
	      struct kiln_err *err)
{
	const char *dot = *where ? "." : "";
	const char *k;
	json_t *v;

	if (!json_is_object(obj))
		return kiln_err_set(err, KERR_CONFIG, "%s: %s: expected an object", file,
				    !*where && (flags & CONF_TOP_NAMED) ? "(top)" : where);
	json_object_foreach(obj, k, v) {
		const struct conf_field *f = fields;

		while (f->type != CONF_END && strcmp(f->name, k))
			f++;
		if (f->type == CONF_END)
			return kiln_err_set(err, KERR_CONFIG, "%s: %s%s%s: unknown setting", file, where, dot, k);
		assert(bounds_fit(f));
		switch (f->type) {
		case CONF_STR:
			if (!json_is_string(v) || !json_string_length(v))
				return kiln_err_set(err, KERR_CONFIG, "%s: %s%s%s: expected a non-empty string", file, where,
						    dot, k);
			*(const char **)f->out = json_string_value(v);
			break;
		case CONF_U32:
		case CONF_U64:
		case CONF_INT:
		case CONF_DOUBLE:
			if (take_number(v, f, file, where, dot, k, flags, err) < 0)
				return -1;
			break;
		case CONF_BOOL:
			if (!json_is_boolean(v))
				return kiln_err_set(err, KERR_CONFIG, "%s: %s%s%s: expected true or false", file, where, dot,
						    k);
			*(int *)f->out = json_is_true(v);
			break;
		case CONF_OBJ:
			*(json_t **)f->out = v;
			break;
		case CONF_END:
			break;
		}
	}
	return 0;
}
