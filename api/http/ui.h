/* ui: the web console's static files, served by kiln-api under /ui (README
 * "The web console", docs/architecture.md, "Threat model"). */
#ifndef KILN_API_UI_H
#define KILN_API_UI_H

#include <stddef.h>

#include <microhttpd.h>

/* The Content-Security-Policy every /ui answer carries. */
#define UI_CSP                                                                                             \
	"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " \
	"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* url is "/ui" or under "/ui/". */
int ui_is_path(const char *url);

/* The console's directory when none is configured: <dir of the running
 * binary>/../ui (a build tree: build/kiln-api -> ui/), else
 * <dir>/../share/kiln/ui (installed), else NULL. Into buf; returns buf or NULL. */
const char *ui_default_dir(char *buf, size_t size);

/* Answers a GET/HEAD for url (ui_is_path) from dir (NULL: 404). Only flat
 * names of [A-Za-z0-9_-] with a known extension are served (no '/', no
 * "..": no way out of dir); "/ui" and "/ui/" are index.html. */
enum MHD_Result ui_serve(const char *dir, struct MHD_Connection *conn, const char *method, const char *url);

/* The name under /ui/ that ui_serve would open (index.html for "/ui" and
 * "/ui/") and its Content-Type, or NULL: for the unit test. */
const char *ui_file_name(const char *url, const char **type);

#endif
