/* tmpl_cmd: kiln-host's `template` command (template build RECIPE.json
 * --out FILE: a recipe template built in a build VM on this machine). */
#ifndef KILN_TMPL_CMD_H
#define KILN_TMPL_CMD_H

/* argv[0] is "template". Returns the process's exit status. */
int tmpl_cmd_main(int argc, char **argv);

#endif
