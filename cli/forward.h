/* forward: kiln session forward (forward.c). */
#ifndef KILN_CLI_FORWARD_H
#define KILN_CLI_FORWARD_H

#include "http.h"

/* Listen on 127.0.0.1:local_port (-1: the same as port; 0: any) and carry
 * each connection to port in session id through kiln-api. Returns only on
 * a failure to listen or accept (1). */
int session_forward(const char *id, unsigned port, int local_port, const struct cli_conn *conn);

#endif
