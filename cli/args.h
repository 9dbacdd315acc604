/*
 * cli/args.h — table-driven flag parsing for llmq subcommands.
 *
 * Each command declares a table of struct cli_flag; cli_parse() fills the destinations, collects
 * positional arguments, prints `--help` (every flag with its default) and names an unknown or
 * malformed flag in its error. Flags take "--name value" or "--name=value"; bool flags take no value.
 */
#ifndef LLMQ_CLI_ARGS_H
#define LLMQ_CLI_ARGS_H

#include <stdbool.h>
#include <stdio.h>

enum cli_flag_kind { CLI_BOOL, CLI_INT, CLI_FLOAT, CLI_STR };

struct cli_flag {
    const char *name;   // without the leading "--"
    enum cli_flag_kind kind;
    void *dst;          // bool*, long*, double*, const char**
    const char *def;    // default shown in --help (and already stored in *dst by the caller)
    const char *help;
};

struct cli_cmd {
    const char *name;     // "inspect"
    const char *usage;    // "PATH [flags]"
    const char *summary;  // one line
    const char *details;  // optional paragraph printed after the flags
    const struct cli_flag *flags;
    int n_flags;
    int min_pos, max_pos; // positional argument count bounds
};

// Parses argv[0..argc) (argv[0] is the first argument after the command name). Positional
// arguments are stored in pos[] (at most max_pos). Returns 0 on success, 1 if --help was printed
// (the caller exits 0), 2 on a usage error (already printed; the caller exits 2).
int cli_parse(const struct cli_cmd *cmd, int argc, char **argv, const char **pos, int *n_pos);
void cli_print_help(const struct cli_cmd *cmd, FILE *out);

#endif // LLMQ_CLI_ARGS_H
