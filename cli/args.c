// cli/args.c — the flag parser behind every llmq subcommand.
#include "cli/args.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void cli_print_help(const struct cli_cmd *cmd, FILE *out) {
    fprintf(out, "usage: llmq %s %s\n\n%s\n", cmd->name, cmd->usage, cmd->summary);
    if (cmd->n_flags > 0) fprintf(out, "\nflags:\n");
    for (int i = 0; i < cmd->n_flags; i++) {
        const struct cli_flag *f = &cmd->flags[i];
        char left[64];
        const char *arg = f->kind == CLI_BOOL ? "" : f->kind == CLI_INT ? " N" : f->kind == CLI_FLOAT ? " X" : " S";
        snprintf(left, sizeof(left), "--%s%s", f->name, arg);
        fprintf(out, "  %-24s %s (default: %s)\n", left, f->help, f->def ? f->def : "none");
    }
    fprintf(out, "  %-24s %s\n", "--help", "print this help and exit");
    if (cmd->details) fprintf(out, "\n%s\n", cmd->details);
}

static const struct cli_flag *find_flag(const struct cli_cmd *cmd, const char *name, size_t len) {
    for (int i = 0; i < cmd->n_flags; i++)
        if (strlen(cmd->flags[i].name) == len && strncmp(cmd->flags[i].name, name, len) == 0)
            return &cmd->flags[i];
    return NULL;
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
            if (errno || end == val || *end) return usage_error(cmd, "not a number for ", a);
            *(double *)f->dst = v;
            break;
        }
        case CLI_STR: *(const char **)f->dst = val; break;
        case CLI_BOOL: break;
        }
    }
    if (*n_pos < cmd->min_pos) return usage_error(cmd, "missing argument: ", cmd->usage);
    return 0;
}
