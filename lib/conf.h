/* conf: the one walker over a JSON configuration object, shared by
 * kiln-api's and kiln-host's config files. A table of fields names each key,
 * its explicit type and bounds and where its value goes; a key the table does
 * not name is an error ("unknown setting"), so that a typo never silently
 * leaves a default in place. Messages name the file and the dotted key. */
#ifndef KILN_CONF_H
#define KILN_CONF_H

#include <jansson.h>

#include "err.h"

enum conf_type {
	CONF_END = 0, /* ends a table (a zeroed entry) */
	CONF_STR,     /* const char **: a non-empty string, owned by the JSON tree */
	CONF_U32,     /* uint32_t * (also `unsigned`): an integer in min..max */
	CONF_U64,     /* uint64_t *: an integer in min..max */
	CONF_INT,     /* int *: an integer in min..max */
	CONF_DOUBLE,  /* double *: any number in min..max */
	CONF_BOOL,    /* int *: true (1) or false (0) */
	CONF_OBJ,     /* json_t ** (borrowed): any value, checked by a nested walk */
};

struct conf_field {
	const char *name;
	enum conf_type type;
	void *out;
	double min, max;   /* numbers only; must fit the type (asserted) */
};

/* How a walk words its errors: the two config files have always differed,
 * and their messages are part of their interface (tests, scripts, docs). */
enum {
	/* A non-object at the top is named "(top)" (kiln-api); otherwise the
	 * name is left empty (kiln-host). */
	CONF_TOP_NAMED = 1 << 0,
	/* Integers: one message, "expected an integer MIN..MAX", for a wrong
	 * type and for a value out of range (kiln-api). Otherwise a wrong type
	 * is "expected a number" and a value out of range "expected MIN..MAX"
	 * (kiln-host). */
	CONF_INT_ONE_MESSAGE = 1 << 1,
};

/* Check obj's keys against fields (ended by a CONF_END entry) and store each
 * value in its field's out. where is the dotted path of obj ("" at the top),
 * file the config file's name for messages, flags CONF_* above. Returns 0, or
 * -1 with err set (code "config", "FILE: KEY: ..."), values stored before the
 * bad key staying stored. Strings and objects stay owned by obj's tree. Any
 * thread (no state). */
int conf_take(json_t *obj, const char *where, const struct conf_field *fields, const char *file, unsigned flags,
	      struct kiln_err *err);

#endif
