/*
 * cli/commands.h — the subcommands of the llmq executable. Each takes the arguments after its
 * name and returns the process exit code: 0 success, 1 failure (an error line was printed),
 * 2 usage error, 3 a quality gate (--fail-if) violated.
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
int cmd_compare(int argc, char **argv);

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

// ---- quality gates: --fail-if EXPR (eval, compare; cli/gates.c over calib/eval/gate.h)

#include "calib/eval/gate.h"

#define CLI_MAX_GATES 32
#define CLI_GATES_HELP                                                                                                 \
    "quality gate, repeatable: exit 3 when METRIC OP VALUE holds for an artifact (OP < <= > >=). Metrics: ppl, "       \
    "ppl_increase (%, vs the base), kld, kld_p99, kld_max (need the base's logits), top1 (% same top-1 token), "       \
    "TASK.acc / acc_norm / acc_drop / acc_norm_drop (points; need --tasks). Percent metrics take VALUE%, e.g. "        \
    "'ppl_increase>2%', 'top1<90%', 'kld>0.05'"

struct json_t;
struct cli_gates {
    struct llmq_gate g[CLI_MAX_GATES];
    int n;                  // gates given
    int violated;           // (artifact, gate) pairs violated or unmeasured so far
    struct json_t *results; // array of {gate, metric, threshold, artifact, value, verdict}; NULL until evaluated
};

// Takes every --fail-if out of argv (before cli_parse) and parses it. 0, or 2 after printing the usage error
// (naming the expression and why). Allocates nothing: only cli_gates_eval does (then cli_gates_free).
int cli_gates_take(const char *cmd, int *argc, char **argv, struct cli_gates *gs);
// 0 when every gate's needs (LLMQ_GATE_NEEDS_*) are among `have` and every task gate's task is in the
// list `tasks` (--tasks, NULL when not given; LLMQ_GATE_NEEDS_TASK in `have` is not looked at); else 2
// after printing which gate needs what (how_base / how_kld: the flags that would measure it).
int cli_gates_check(const char *cmd, const struct cli_gates *gs, unsigned have, const char *tasks, const char *how_base,
                    const char *how_kld);
// The task gate values of a task run (acc, acc_norm in points; the *_drop values NaN: no base) into tv
// (LLMQ_TASK_COUNT rows; names are llmq_task_name's); returns the rows filled.
struct llmq_tasks_report;
int cli_gate_task_values(const struct llmq_tasks_report *r, struct llmq_gate_task_values *tv);
// Evaluates every gate on one artifact: one stderr line per violated (or unmeasured: counted as violated)
// gate, naming gate, artifact and measured value; a JSON record for every gate. Returns the violations.
int cli_gates_eval(const char *cmd, struct cli_gates *gs, const char *artifact, const struct llmq_gate_values *v);
// The gate values of an `llmq eval` result: ppl always; with a base (r->kld) ppl_increase, kld, kld_p99,
// kld_max, top1.
struct llmq_eval_result;
void cli_gate_values_from_eval(const struct llmq_eval_result *r, struct llmq_gate_values *v);
// Sets "gates" (the records) and "gates_violated" in a JSON report object.
void cli_gates_json(const struct cli_gates *gs, struct json_t *report);
void cli_gates_free(struct cli_gates *gs);

#endif
