/*
 * cli/commands.h — the subcommands of the llmq executable. Each takes the arguments after its
 * name and returns the process exit code: 0 success, 1 failure (an error line was printed),
 * 2 usage error.
 */
#ifndef LLMQ_CLI_COMMANDS_H
#define LLMQ_CLI_COMMANDS_H

int cmd_inspect(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_calib(int argc, char **argv);

#endif
