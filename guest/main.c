/* kiln-init: PID 1 of a kiln guest. Boots the VM from its initramfs, then
 * serves the host over the virtio-serial port until the VM is destroyed. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "envd.h"
#include "init.h"
#include "interp.h"

int main(void)
{
	struct agent_config cfg = {
		.output_dir = "/output",
		.file_uid = 1000,
		.file_gid = 1000,
	};
	struct agent *a;
	int chan, r;

	/* It mounts over / and reboots: never let it loose on a real machine. */
	if (getpid() != 1) {
		init_log("must run as PID 1 (the init of a kiln guest)");
		return 1;
	}
	init_boot();
	/* Before anything blocks SIGCHLD (agent_create): envd starts with a
	 * clean signal mask. It runs beside the agent, in every VM, and is in
	 * the snapshots made later. */
	r = envd_spawn();
	if (r < 0)
		init_log("envd: %s", strerror(-r));
	cfg.envd_sup = r > 0 ? r : 0;
	/* The template's code interpreter, if its image has one: it starts
	 * now, warms up while the VM boots, and is in the snapshots. */
	r = interp_spawn(&cfg.interp);
	if (r < 0)
		init_log("interpreter: %s", strerror(-r));
	chan = init_open_port(INIT_PORT_NAME);
	a = agent_create(chan, &cfg);
	if (!a)
		init_die("agent: %s", strerror(errno));
	r = agent_hello(a);
	if (r == 0)
		r = agent_serve(a);
	init_die("host channel: %s", strerror(-r));
}
