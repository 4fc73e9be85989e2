/* kiln: the command-line client of kiln-api (kiln run, kiln task, kiln
 * session, kiln snapshot, kiln volume, kiln template, kiln admin) and `kiln up`, the one-command local stack. A thin dispatcher over
 * the cli/ modules; usage and exit statuses in cli.h and the README. */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "version.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kiln COMMAND [ARGS]\n"
		   "  up [--dir DIR] [--port P] [--egress] the local stack: S3, kiln-api, one kiln-host\n"
		   "  --version                            print the version\n"
		   "  --ca-file PEM COMMAND ...            verify an https:// API with this CA (or KILN_CA_FILE)\n"
		   "  run FILE.py|FILE.sh [options]        run a file in a microVM (kiln run --help)\n"
		   "  task get|list|cancel|logs ...        inspect tasks\n"
		   "  session create|exec|put|get|ls|pause|resume|fork|rm|list|info ...\n"
		   "                                       long-lived sandboxes (kiln session --help)\n"
		   "  snapshot create|list|get|delete ...  a session's state kept, to start sessions from\n"
		   "                                       (kiln snapshot --help)\n"
		   "  volume create|list|get|delete ...    filesystems that outlive sessions (kiln volume --help)\n"
		   "  shell SESSION [-- COMMAND...]        an interactive terminal in a session\n"
		   "  template build|list|get|rm ...       environments to run in (kiln template --help)\n"
		   "  destination set|show|test|delete     outputs to your own S3 bucket (kiln destination --help)\n"
		   "  mcp                                  an MCP server on stdin/stdout for AI agents (docs/mcp.md)\n"
		   "  admin customer|quota|key|hosts ...   administer (admin key)\n"
		   "Configuration: KILN_API, KILN_KEY, KILN_ADMIN_KEY, KILN_CA_FILE, else the credentials file of\n"
		   "`kiln up` (KILN_CREDENTIALS, else " CREDS_DEFAULT_FILE ").\n"
		   "Exit status: 0 ok; 1 refused by the API or the task failed (run: the task's exit code);\n"
		   "2 bad usage or no configuration; 3 API unreachable or a task error.\n");
}

int main(int argc, char **argv)
{
	int rc;

	/* kiln --ca-file PEM COMMAND ...: as KILN_CA_FILE=PEM. */
	if (argc >= 3 && !strcmp(argv[1], "--ca-file")) {
		setenv("KILN_CA_FILE", argv[2], 1);
		argv[2] = argv[0];
		argv += 2;
		argc -= 2;
	}
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
		printf("kiln %s\n", kiln_version());
		return 0;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
		fprintf(stderr, "kiln: curl_global_init failed\n");
		return EXIT_INFRA;
	}
	if (!strcmp(argv[1], "run"))
		rc = cmd_run(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "task"))
		rc = cmd_task(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "session"))
		rc = cmd_session(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "snapshot"))
		rc = cmd_snapshot(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "volume"))
		rc = cmd_volume(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "shell"))
		rc = cmd_shell(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "template"))
		rc = cmd_template(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "destination"))
		rc = cmd_destination(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "mcp"))
		rc = cmd_mcp(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "admin"))
		rc = cmd_admin(argc - 1, argv + 1);
	else if (!strcmp(argv[1], "up"))
		rc = cmd_up(argc - 1, argv + 1);
	else {
		fprintf(stderr, "kiln: %s: unknown command\n", argv[1]);
		usage(stderr);
		rc = EXIT_USAGE;
	}
	curl_global_cleanup();
	return rc;
}
