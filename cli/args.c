// cli/args.c — the flag parser behind every llmq subcommand.
#include "cli/args.h"

#include "common/io.h"
#include "common/log.h"
#include "common/spill.h"
#include "common/status.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct cli_flag *find_flag(const struct cli_cmd *cmd, const char *name, size_t len) {
    for (int i = 0; i < cmd->n_flags; i++)
        if (strlen(cmd->flags[i].name) == len && strncmp(cmd->flags[i].name, name, len) == 0) {
            const struct cli_flag *f = &cmd->flags[i];
            if (f->kind != CLI_ALIAS) return f;
            // an alias resolves to its target (one level: an alias of an alias is a table error)
            for (int j = 0; j < cmd->n_flags; j++)
                if (cmd->flags[j].kind != CLI_ALIAS && strcmp(cmd->flags[j].name, f->def) == 0) return &cmd->flags[j];
            LLMQ_ASSERT(!"CLI_ALIAS names no flag of its table");
        }
    return NULL;
}

void cli_print_help(const struct cli_cmd *cmd, FILE *out) {
    fprintf(out, "usage: llmq %s %s\n\n%s\n", cmd->name, cmd->usage, cmd->summary);
    if (cmd->n_flags > 0) fprintf(out, "\nflags:\n");
    for (int pass = 0; pass < 2; pass++) // the flags, then their aliases
        for (int i = 0; i < cmd->n_flags; i++) {
            const struct cli_flag *a = &cmd->flags[i];
            if ((a->kind == CLI_ALIAS) != (pass == 1)) continue;
            const struct cli_flag *f = pass ? find_flag(cmd, a->name, strlen(a->name)) : a;
            char left[64];
            const char *arg = f->kind == CLI_BOOL ? "" : f->kind == CLI_INT ? " N" : f->kind == CLI_FLOAT ? " X" : " S";
            snprintf(left, sizeof(left), "--%s%s", a->name, arg);
            if (pass)
                fprintf(out, "  %-24s same as --%s: %s (default: that of --%s)\n", left, f->name, a->help, f->name);
            else
                fprintf(out, "  %-24s %s (default: %s)\n", left, f->help, f->def ? f->def : "none");
        }
    fprintf(out, "  %-24s %s (default: off)\n", "--quiet",
            "errors only on stderr: no progress, per-layer or info lines");
    fprintf(out, "  %-24s %s (default: off)\n", "--verbose",
            "also debug lines (e.g. each GGUF type fallback as it is planned)");
    fprintf(out, "  %-24s %s\n", "--help", "print this help and exit");
    if (cmd->details) fprintf(out, "\n%s\n", cmd->details);
}

static int usage_error(const struct cli_cmd *cmd, const char *msg, const char *what) {
    fprintf(stderr, "llmq %s: %s%s\n", cmd->name, msg, what ? what : "");
    fprintf(stderr, "run 'llmq %s --help' for the flags and their defaults\n", cmd->name);
    return 2;
}

int cli_parse(const struct cli_cmd *cmd, int argc, char **argv, const char **pos, int *n_pos) {
    *n_pos = 0;
    bool only_pos = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (*n_pos >= cmd->max_pos) return usage_error(cmd, "unexpected argument: ", a);
            pos[(*n_pos)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli_print_help(cmd, stdout);
            return 1;
        }
        if (strcmp(a, "--quiet") == 0 || strcmp(a, "--verbose") == 0) { // every command's (common/log.h level)
            llmq_log_set_level(a[2] == 'q' ? LLMQ_LOG_ERROR : LLMQ_LOG_DEBUG);
            continue;
        }
        if (strncmp(a, "--", 2) != 0) return usage_error(cmd, "unknown flag: ", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct cli_flag *f = find_flag(cmd, name, len);
        if (!f) return usage_error(cmd, "unknown flag: ", a);
        if (f->kind == CLI_BOOL) {
            if (eq) return usage_error(cmd, "flag takes no value: ", a);
            *(bool *)f->dst = true;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) return usage_error(cmd, "flag needs a value: ", a);
        char *end = NULL;
        errno = 0;
        switch (f->kind) {
        case CLI_INT: {
            long v = strtol(val, &end, 10);
            if (errno || end == val || *end) return usage_error(cmd, "not an integer for ", a);
            *(long *)f->dst = v;
            break;
        }
        case CLI_FLOAT: {
            double v = strtod(val, &end);
            if (errno || end == val || *end || !isfinite(v)) return usage_error(cmd, "not a finite number for ", a);
            *(double *)f->dst = v;
            break;
        }
        case CLI_STR: *(const char **)f->dst = val; break;
        case CLI_BOOL:
        case CLI_ALIAS: break; // find_flag never returns an alias
        }
    }
    if (*n_pos < cmd->min_pos) return usage_error(cmd, "missing argument: ", cmd->usage);
    return 0;
}

int cli_take_repeated(const char *name, int *argc, char **argv, const char **vals, int max_vals, int *n_vals) {
    size_t nl = strlen(name);
    int w = 0;
    *n_vals = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strncmp(a, "--", 2) == 0 && strncmp(a + 2, name, nl) == 0 && a[2 + nl] == '=')
            v = a + 3 + nl;
        else if (strncmp(a, "--", 2) == 0 && strcmp(a + 2, name) == 0) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "llmq: --%s needs a value\n", name);
                return 2;
            }
            v = argv[++i];
        }
        if (v) {
            if (*n_vals >= max_vals) {
                fprintf(stderr, "llmq: at most %d --%s flags\n", max_vals, name);
                return 2;
            }
            vals[(*n_vals)++] = v;
        } else {
            argv[w++] = argv[i];
        }
    }
    *argc = w;
    return 0;
}

void cli_calib_args_init(struct cli_calib_args *a) {
    *a = (struct cli_calib_args){.nsamples = 128, .seqlen = 512, .seed = 0, .micro = 8};
    a->threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (a->threads < 1) a->threads = 1;
}

int cli_calib_take_sources(struct cli_calib_args *a, int *argc, char **argv) {
    return cli_take_repeated("calib", argc, argv, a->sources, CLI_CALIB_MAX_SOURCES, &a->n_sources);
}

const char *cli_calib_args_check(struct cli_calib_args *a) {
    if (a->nsamples < 1 || a->nsamples > (1 << 20)) return "--nsamples must be between 1 and 1048576";
    if (a->seqlen < 2 || a->seqlen > (1 << 20)) return "--seqlen must be between 2 and 1048576";
    if (a->micro < 1) return "--micro-batch must be >= 1";
    if (a->seed < 0) return "--seed must be >= 0";
    if (a->threads < 1 || a->threads > 256) return "--threads must be between 1 and 256";
    if (a->max_memory && !llmq_parse_bytes(a->max_memory, &a->max_mem_bytes))
        return "--max-memory must be a size such as 4G, 512M or 1073741824";
    if (a->max_vram && (!llmq_parse_bytes(a->max_vram, &a->max_vram_bytes) || a->max_vram_bytes == 0))
        return "--max-vram must be a size such as 20G, 512M or 1073741824";
    return NULL;
}

int cli_guard(const char *const *inputs, int n_in, const char *const *outputs, int n_out, bool force) {
    for (int i = 0; i < n_in; i++) llmq_input_add(inputs[i]);
    for (int i = 0; i < n_out; i++) {
        for (int k = 0; outputs[i] && k < i; k++)
            if (outputs[k] && strcmp(outputs[k], outputs[i]) == 0) {
                llmq_errorf(LLMQ_ERR_ARG, "%s: named for two outputs of this run", outputs[i]);
                return 1;
            }
        if (outputs[i] && llmq_output_check_file(outputs[i], force)) return 1;
    }
    return 0;
}
