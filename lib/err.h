/* err: the small error record higher layers carry up to the user; its code
 * and message become the HTTP API's JSON error. Low-level code returns
 * negative errno instead and leaves the wording to its caller. */
#ifndef KILN_ERR_H
#define KILN_ERR_H

struct kiln_err {
	char code[48];     /* machine-readable: "invalid_spec", "vm_error", ... */
	char message[512]; /* human-readable, names the offending field */
};

/* Set both fields; the message is printf-formatted and truncated to fit.
 * e may be NULL (the error is then dropped). Returns -1 so that callers can
 * write `return kiln_err_set(err, ...);`. Thread-safe for distinct e. */
int kiln_err_set(struct kiln_err *e, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
