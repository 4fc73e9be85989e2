/* tests/agent/drive: serves the guest protocol (the real guest/agent.c, task.c,
 * collect.c) on an inherited socket fd, as a child subreaper standing in for
 * PID 1, so agent_host.py can test the guest side without a VM.
 *   usage: agent-drive OUTPUT_DIR FD */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include "agent.h"
int main(int argc, char **argv)
{
	struct agent_config cfg = { .output_dir = argv[1], .file_uid = 54321, .file_gid = 54321 };
	struct agent *a;
	int r;
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	a = agent_create(atoi(argv[2]), &cfg); (void)argc;
	if (!a) { perror("agent_create"); return 2; }
	r = agent_hello(a);
	if (!r) r = agent_serve(a);
	fprintf(stderr, "drive: serve ended: %s\n", strerror(-r));
	agent_destroy(a);
	return 1;
}
