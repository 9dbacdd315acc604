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

// ---- shared by the commands

#include "kernels/backend.h"
#include <stddef.h>

// The help text of --device (quantize, calib, eval).
#define CLI_DEVICE_HELP                                                                                                \
    "auto | cpu | cuda: where the matrix products (linear layers, output head, XᵀX, AWQ search) run; "               \
    "auto = cuda when a CUDA device is present. CPU and CUDA results differ in float rounding; reruns on "             \
    "the same device are byte-identical"

// --device NAME (auto | cpu | cuda, kernels/backend.h): sets *be and prints "device: ..." once on
// stderr; desc (desc_n bytes) receives the same text without the prefix, for --json. Returns 0, or
// 2 for an unknown name and 1 for cuda without a usable device (the error line is printed).
int cli_device(const char *name, enum llmq_backend *be, char *desc, size_t desc_n);

#endif
