/* drain_cmd: kiln-host's `drain` and `undrain` commands: tell the kiln-host
 * running on this machine (its HTTP API, with the cluster token from its
 * configuration) to report draining in its heartbeat, or to stop. */
#ifndef KILN_DRAIN_CMD_H
#define KILN_DRAIN_CMD_H

/* argv[0] is "drain" or "undrain". Returns the process's exit status: 0 done,
 * 2 bad usage, 3 the kiln-host could not be told. */
int drain_cmd_main(int argc, char **argv);

#endif
