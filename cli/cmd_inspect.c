// cli/cmd_inspect.c — placeholder until the format readers land (see issue 2).
#include "cli/commands.h"
#include <stdio.h>
int cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "inspect: under construction\n"); return 1; }
