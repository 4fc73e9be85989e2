/* qmp: classify and validate QMP messages (greeting, return, error, event). */
#include "qmp.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int qmp_parse(const char *line, size_t len, struct qmp_msg *m)
{
	json_t *v;

	memset(m, 0, sizeof(*m));
	if (len > QMP_MAX_LINE)
		return -EPROTO;
	m->root = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
	if (!m->root || !json_is_object(m->root))
		goto bad;
	if (json_object_get(m->root, "QMP")) {
		m->kind = QMP_GREETING;
		return 0;
	}
	if ((v = json_object_get(m->root, "return"))) {
		m->kind = QMP_RETURN;
		m->ret = v;
		return 0;
	}
	if ((v = json_object_get(m->root, "error"))) {
		json_t *c = json_object_get(v, "class"), *d = json_object_get(v, "desc");

		if (!json_is_string(c) || !json_is_string(d))
			goto bad;
		m->kind = QMP_ERROR;
		snprintf(m->errclass, sizeof(m->errclass), "%s", json_string_value(c));
		snprintf(m->errdesc, sizeof(m->errdesc), "%s", json_string_value(d));
		return 0;
	}
	if ((v = json_object_get(m->root, "event"))) {
		if (!json_is_string(v))
			goto bad;
		m->kind = QMP_EVENT;
		m->event = json_string_value(v);
		return 0;
	}
bad:
	json_decref(m->root);
	memset(m, 0, sizeof(*m));
	return -EPROTO;
}

void qmp_msg_free(struct qmp_msg *m)
{
	json_decref(m->root);
	memset(m, 0, sizeof(*m));
}
