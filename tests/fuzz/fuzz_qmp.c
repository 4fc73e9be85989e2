/* fuzz_qmp: QMP lines from QEMU (which runs the guest) through qmp_parse, and
 * arbitrary task output through the UTF-8 sanitiser. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmp.h"
#include "textbuf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct qmp_msg m;
	char *s;

	if (qmp_parse((const char *)data, size, &m) == 0) {
		/* Whatever kind it is, its borrowed members must be usable. */
		if (m.kind == QMP_EVENT && !m.event)
			abort();
		if (m.kind == QMP_RETURN && !m.ret)
			abort();
		qmp_msg_free(&m);
	}
	s = textbuf_to_utf8((const char *)data, size);
	if (s) {
		json_t *j = json_string(s); /* jansson rejects invalid UTF-8: the sanitiser must never produce it */

		if (!j)
			abort();
		json_decref(j);
		free(s);
	}
	return 0;
}
