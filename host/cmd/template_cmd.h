/* template_cmd: kiln-host's `template` command (template build RECIPE.json
 * --out FILE: a recipe template built in a build VM on this machine). */
#ifndef KILN_TEMPLATE_CMD_H
#define KILN_TEMPLATE_CMD_H

/* argv[0] is "template". Returns the process's exit status. */
int template_cmd_main(int argc, char **argv);

#endif
