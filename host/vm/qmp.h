/* qmp: parse one QMP message (a line of JSON from QEMU's monitor). QEMU runs
 * the guest, so after boot its replies are treated as untrusted input too. */
#ifndef KILN_QMP_H
#define KILN_QMP_H

#include <stddef.h>
#include <jansson.h>

#define QMP_MAX_LINE (64 * 1024)

enum qmp_kind { QMP_GREETING = 1, QMP_RETURN, QMP_ERROR, QMP_EVENT };

struct qmp_msg {
	enum qmp_kind kind;
	json_t *root;       /* owned */
	json_t *ret;        /* borrowed from root: "return" (QMP_RETURN) */
	const char *event;  /* borrowed from root: event name (QMP_EVENT) */
	char errclass[64];  /* QMP_ERROR */
	char errdesc[256];
};

/* Parse one line (without its newline). Returns 0, or -EPROTO when the line
 * is not JSON or not one of the four QMP message shapes. On success the
 * caller frees m with qmp_msg_free. */
int qmp_parse(const char *line, size_t len, struct qmp_msg *m);
void qmp_msg_free(struct qmp_msg *m);

#endif
