/*
 * calib/eval/gate.h — quality gates: `--fail-if EXPR` of `llmq eval` and `llmq compare`, parsed, checked
 * and evaluated against an artifact's measured figures.
 *
 * What it is: the metric table (name, unit, what a run must measure for it), the expression parser, and
 * the verdict of one gate on one artifact's values. What it is not: no measuring (calib/eval/eval.h),
 * no printing and no exit codes (the CLI prints the violation line and exits 3).
 *
 * ---- Expressions ------------------------------------------------------------------------------------
 *   EXPR   := METRIC OP NUMBER [ '%' ]          spaces allowed around OP and before '%'
 *   METRIC := a core metric name | TASK '.' TASK_METRIC
 *   OP     := '<' | '<=' | '>' | '>='
 *   The gate is VIOLATED when "measured OP threshold" holds: `ppl_increase>2%` fails an artifact whose
 *   perplexity is more than 2% above the base's. NUMBER is strtod's (finite only).
 *
 * ---- Metrics (one table, gate.c) -------------------------------------------------------------------
 *   name            unit     needs          value
 *   ppl             plain    -              the artifact's perplexity
 *   ppl_increase    percent  base           100 · (PPL / PPL_base − 1)
 *   kld             plain    base logits    mean KL(base ‖ artifact) per scored token (nats)
 *   kld_p99         plain    base logits    99th percentile of the per-token KLD
 *   kld_max         plain    base logits    largest per-token KLD
 *   top1            percent  base logits    % of scored tokens whose top-1 token equals the base's
 *   T.acc           points   task T         accuracy of task T, in % (0..100)
 *   T.acc_norm      points   task T         length-normalized accuracy of task T, in %
 *   T.acc_drop      points   task T, base   accuracy points lost against the base: acc_base − acc
 *   T.acc_norm_drop points   task T, base   the same for acc_norm
 *   Units decide the '%': a percent metric needs it (`top1<90%`; `top1<0.9` is refused, since it would
 *   mean 0.9%), a plain metric refuses it (`kld>5%` is refused), a points metric takes the number in
 *   percentage points with or without it (`hellaswag.acc_drop>1.0` = `hellaswag.acc_drop>1%`).
 *   Task names T are checked by llmq_gate_task_known.
 *
 * ---- Verdicts ---------------------------------------------------------------------------------------
 *   pass (the comparison is false), fail (true), unmeasured (the run did not measure the metric: the
 *   value is NaN in struct llmq_gate_values). The CLIs refuse a gate whose needs the run cannot meet
 *   before anything is evaluated (a usage error), so unmeasured means a task or figure went missing.
 */
#ifndef LLMQ_CALIB_EVAL_GATE_H
#define LLMQ_CALIB_EVAL_GATE_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>

enum llmq_gate_metric {
    LLMQ_GATE_PPL,
    LLMQ_GATE_PPL_INCREASE,
    LLMQ_GATE_KLD,
    LLMQ_GATE_KLD_P99,
    LLMQ_GATE_KLD_MAX,
    LLMQ_GATE_TOP1,
    LLMQ_GATE_N_CORE, // the metrics above are per artifact; those below per task
    LLMQ_GATE_TASK_ACC = LLMQ_GATE_N_CORE,
    LLMQ_GATE_TASK_ACC_NORM,
    LLMQ_GATE_TASK_ACC_DROP,
    LLMQ_GATE_TASK_ACC_NORM_DROP,
    LLMQ_GATE_METRIC_COUNT
};

enum llmq_gate_unit { LLMQ_GATE_UNIT_PLAIN, LLMQ_GATE_UNIT_PERCENT, LLMQ_GATE_UNIT_POINTS };

// What a run must measure for a metric (bit flags).
enum {
    LLMQ_GATE_NEEDS_BASE = 1, // a base model's perplexity
    LLMQ_GATE_NEEDS_KLD = 2,  // the base's logits next to the artifact's (KLD mode)
    LLMQ_GATE_NEEDS_TASK = 4, // the gate's task evaluated (calib/eval/tasks.h)
};

struct llmq_gate_metric_info {
    const char *name; // "ppl_increase"; task metrics without the task: "acc_drop"
    enum llmq_gate_unit unit;
    unsigned needs; // LLMQ_GATE_NEEDS_* flags
    const char *help;
};

// The row of metric m (m < LLMQ_GATE_METRIC_COUNT).
const struct llmq_gate_metric_info *llmq_gate_metric_info(enum llmq_gate_metric m);

enum llmq_gate_op { LLMQ_GATE_OP_LT, LLMQ_GATE_OP_LE, LLMQ_GATE_OP_GT, LLMQ_GATE_OP_GE };

#define LLMQ_GATE_MAX_EXPR 127
#define LLMQ_GATE_MAX_TASK 31

struct llmq_gate {
    char expr[LLMQ_GATE_MAX_EXPR + 1]; // the expression as given
    enum llmq_gate_metric metric;
    char task[LLMQ_GATE_MAX_TASK + 1]; // task metrics: the task's name; else ""
    enum llmq_gate_op op;
    double threshold; // in the metric's unit (percent and points: the number as written, 2 for "2%")
};

// Parses expr into *out. LLMQ_ERR_ARG with the reason in err (err_n bytes; naming the expression and,
// for an unknown metric, the known ones) when it is malformed, names an unknown metric or task, or uses
// '%' against the metric's unit. Nothing is logged: the caller prints err as a usage error.
enum llmq_status llmq_gate_parse(const char *expr, struct llmq_gate *out, char *err, size_t err_n);

// Whether `name` is a zero-shot task a gate may name: a task of calib/eval/tasks.h's registry
// (llmq_task_from_name: hellaswag, arc-easy, arc-challenge, piqa, winogrande, lambada).
bool llmq_gate_task_known(const char *name);

// The LLMQ_GATE_NEEDS_* flags of g.
unsigned llmq_gate_needs(const struct llmq_gate *g);

// One task's figures for the task metrics, in percentage points (100 · the fraction); NaN where unknown.
struct llmq_gate_task_values {
    const char *name;
    double acc, acc_norm, acc_drop, acc_norm_drop;
};

// An artifact's measured figures. core[m] for m < LLMQ_GATE_N_CORE, in the metric's unit (ppl_increase
// and top1 in %); NaN = not measured. tasks: (n_tasks) rows, not owned.
struct llmq_gate_values {
    double core[LLMQ_GATE_N_CORE];
    const struct llmq_gate_task_values *tasks;
    int n_tasks;
};

void llmq_gate_values_init(struct llmq_gate_values *v); // every core value NaN, no tasks

enum llmq_gate_verdict { LLMQ_GATE_PASS, LLMQ_GATE_FAIL, LLMQ_GATE_UNMEASURED };
const char *llmq_gate_verdict_name(enum llmq_gate_verdict v); // "pass", "fail", "unmeasured"

// The verdict of g on v; *measured (may be NULL) gets the value compared (NaN when unmeasured).
enum llmq_gate_verdict llmq_gate_eval(const struct llmq_gate *g, const struct llmq_gate_values *v, double *measured);

// The metric's full name ("ppl_increase", "hellaswag.acc_drop") into buf (n bytes).
void llmq_gate_metric_name(const struct llmq_gate *g, char *buf, size_t n);
// A value of g's metric as the user writes it: "38.214%" (percent, points), "0.052311" (plain).
void llmq_gate_format_value(const struct llmq_gate *g, double value, char *buf, size_t n);

#endif // LLMQ_CALIB_EVAL_GATE_H
