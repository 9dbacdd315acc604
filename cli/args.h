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
#include <stdint.h>
#include <stdio.h>

// CLI_ALIAS: another name for a flag of the same table (e.g. llama-quantize's name for one of ours):
// {"output-tensor-type", CLI_ALIAS, NULL, "output-type", "llama-quantize's name"} — def holds the
// target's name, dst is unused; the alias parses exactly as its target and --help lists it after
// the flags as "--ALIAS ... same as --TARGET". A later flag overrides an earlier one, alias or not.
enum cli_flag_kind { CLI_BOOL, CLI_INT, CLI_FLOAT, CLI_STR, CLI_ALIAS };

struct cli_flag {
    const char *name; // without the leading "--"
    enum cli_flag_kind kind;
    void *dst;       // bool*, long*, double*, const char**; NULL for CLI_ALIAS
    const char *def; // default shown in --help (and already stored in *dst by the caller); CLI_ALIAS:
                     // the target flag's name
    const char *help;
};

struct cli_cmd {
    const char *name;    // "inspect"
    const char *usage;   // "PATH [flags]"
    const char *summary; // one line
    const char *details; // optional paragraph printed after the flags
    const struct cli_flag *flags;
    int n_flags;
    int min_pos, max_pos; // positional argument count bounds
};

// Parses argv[0..argc) (argv[0] is the first argument after the command name). Positional
// arguments are stored in pos[] (at most max_pos). Returns 0 on success, 1 if --help was printed
// (the caller exits 0), 2 on a usage error (already printed; the caller exits 2). Every command also
// takes --quiet (log level LLMQ_LOG_ERROR: errors only) and --verbose (LLMQ_LOG_DEBUG); the last wins.
int cli_parse(const struct cli_cmd *cmd, int argc, char **argv, const char **pos, int *n_pos);
void cli_print_help(const struct cli_cmd *cmd, FILE *out);

// A repeatable flag (cli_parse keeps one value): collects every "--name V" / "--name=V" into vals (at
// most max_vals) and removes them from argv, updating *argc. Returns 0, or 2 on a usage error (printed).
int cli_take_repeated(const char *name, int *argc, char **argv, const char **vals, int max_vals, int *n_vals);

// The output guard of a command (common/io.h), before any work: records every non-NULL path of inputs
// (n_in) as an input of the run, then checks every non-NULL path of outputs (n_out) as a file output
// (llmq_output_check_file with force). 0, or 1 after the refusal's line (the command exits 1).
int cli_guard(const char *const *inputs, int n_in, const char *const *outputs, int n_out, bool force);

// ---- the calibration flags, shared by `llmq calib` and `llmq quantize`

#define CLI_CALIB_MAX_SOURCES 16 // = LLMQ_CALIB_MAX_SOURCES (calib/calib.h; checked there)

struct cli_calib_args {
    const char *sources[CLI_CALIB_MAX_SOURCES]; // every --calib, in order (cli_take_repeated)
    int n_sources;
    const char *calib_help_dummy; // the --calib table entry's destination; the values are in sources
    long nsamples, seqlen, seed, micro, threads;
    const char *max_memory;  // --max-memory as given (NULL: unlimited)
    uint64_t max_mem_bytes;  // parsed by cli_calib_args_check (0: unlimited)
    const char *max_vram;    // --max-vram as given (NULL: half of the device's free memory)
    uint64_t max_vram_bytes; // parsed by cli_calib_args_check (0: the default)
};

// Defaults: 128 x 512 tokens, seed 0, micro-batch 8, threads = online CPUs, no memory limit.
void cli_calib_args_init(struct cli_calib_args *a);
// Takes every --calib out of argv (cli_take_repeated); returns its status.
int cli_calib_take_sources(struct cli_calib_args *a, int *argc, char **argv);
// NULL when the values are in range (and --max-memory parses), else the usage message.
const char *cli_calib_args_check(struct cli_calib_args *a);

#define CLI_CALIB_SOURCE_HELP                                                                                          \
    "calibration source, repeatable: a .txt/.raw/.jsonl[.gz] file, a datasets/manifest.tsv name "                      \
    "(wikitext-2-valid, ...), or self (sequences sampled from the model)"

// The table entries of the flags above (--threads is the command's own: its help differs).
#define CLI_CALIB_FLAGS(a)                                                                                             \
    {"nsamples", CLI_INT, &(a)->nsamples, "128", "calibration sequences"},                                             \
        {"seqlen", CLI_INT, &(a)->seqlen, "512", "tokens per calibration sequence"},                                   \
        {"seed", CLI_INT, &(a)->seed, "0", "seed of the window sampling (and of --calib self)"},                       \
        {"micro-batch", CLI_INT, &(a)->micro, "8", "sequences per forward call of the calibration passes"},            \
        {"max-memory", CLI_STR, &(a)->max_memory, "unlimited",                                                         \
         "RAM for the calibration activations (e.g. 4G, 512M); beyond it they go to an unlinked temp file "            \
         "in $LLMQ_SPILL_DIR / $TMPDIR (weights and Hessians are not counted)"},                                       \
    {                                                                                                                  \
        "max-vram", CLI_STR, &(a)->max_vram, "half of the device's free memory",                                       \
            "--device cuda: device memory for the decoder blocks' passes (e.g. 20G); when the calibration "            \
            "activations do not fit in it with the block's buffers they stream from page-locked host memory a "        \
            "micro-batch at a time, and when the buffers alone do not fit the passes run on the host (with a log "     \
            "line saying so)"                                                                                          \
    }

#endif // LLMQ_CLI_ARGS_H
