// calib/eval/gate.c — the quality-gate expressions of calib/eval/gate.h.
#include "calib/eval/gate.h"

#include "calib/eval/tasks.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct llmq_gate_metric_info METRICS[LLMQ_GATE_METRIC_COUNT] = {
    [LLMQ_GATE_PPL] = {"ppl", LLMQ_GATE_UNIT_PLAIN, 0, "the artifact's perplexity"},
    [LLMQ_GATE_PPL_INCREASE] = {"ppl_increase", LLMQ_GATE_UNIT_PERCENT, LLMQ_GATE_NEEDS_BASE,
                                "100 * (PPL / PPL_base - 1), in %"},
    [LLMQ_GATE_KLD] = {"kld", LLMQ_GATE_UNIT_PLAIN, LLMQ_GATE_NEEDS_KLD, "mean KL(base || artifact) per token"},
    [LLMQ_GATE_KLD_P99] = {"kld_p99", LLMQ_GATE_UNIT_PLAIN, LLMQ_GATE_NEEDS_KLD, "99th percentile of the KLD"},
    [LLMQ_GATE_KLD_MAX] = {"kld_max", LLMQ_GATE_UNIT_PLAIN, LLMQ_GATE_NEEDS_KLD, "largest per-token KLD"},
    [LLMQ_GATE_TOP1] = {"top1", LLMQ_GATE_UNIT_PERCENT, LLMQ_GATE_NEEDS_KLD, "% of tokens with the base's top-1"},
    [LLMQ_GATE_TASK_ACC] = {"acc", LLMQ_GATE_UNIT_POINTS, LLMQ_GATE_NEEDS_TASK, "task accuracy, in %"},
    [LLMQ_GATE_TASK_ACC_NORM] = {"acc_norm", LLMQ_GATE_UNIT_POINTS, LLMQ_GATE_NEEDS_TASK,
                                 "length-normalized task accuracy, in %"},
    [LLMQ_GATE_TASK_ACC_DROP] = {"acc_drop", LLMQ_GATE_UNIT_POINTS, LLMQ_GATE_NEEDS_TASK | LLMQ_GATE_NEEDS_BASE,
                                 "accuracy points lost against the base"},
    [LLMQ_GATE_TASK_ACC_NORM_DROP] = {"acc_norm_drop", LLMQ_GATE_UNIT_POINTS,
                                      LLMQ_GATE_NEEDS_TASK | LLMQ_GATE_NEEDS_BASE, "acc_norm points lost"},
};

const struct llmq_gate_metric_info *llmq_gate_metric_info(enum llmq_gate_metric m) { return &METRICS[m]; }

bool llmq_gate_task_known(const char *name) {
    enum llmq_task_id id;
    return llmq_task_from_name(name, &id);
}

unsigned llmq_gate_needs(const struct llmq_gate *g) { return METRICS[g->metric].needs; }

// The metric part [s, s + n) of an expression: a core name, or TASK.METRIC.
static enum llmq_status parse_metric(const char *expr, const char *s, size_t n, struct llmq_gate *g, char *err,
                                     size_t err_n) {
    const char *dot = memchr(s, '.', n);
    int lo = dot ? LLMQ_GATE_N_CORE : 0, hi = dot ? LLMQ_GATE_METRIC_COUNT : LLMQ_GATE_N_CORE;
    const char *name = dot ? dot + 1 : s;
    size_t name_n = dot ? n - (size_t)(dot + 1 - s) : n;
    if (dot) {
        size_t tn = (size_t)(dot - s);
        if (tn == 0 || tn > LLMQ_GATE_MAX_TASK) {
            snprintf(err, err_n, "'%s': a task name before '.' is required (at most %d bytes)", expr,
                     LLMQ_GATE_MAX_TASK);
            return LLMQ_ERR_ARG;
        }
        memcpy(g->task, s, tn);
        g->task[tn] = '\0';
        if (!llmq_gate_task_known(g->task)) {
            int k = snprintf(err, err_n, "'%s': unknown task '%s' (known:", expr, g->task);
            for (int t = 0; t < LLMQ_TASK_COUNT && k >= 0 && (size_t)k < err_n; t++)
                k += snprintf(err + k, err_n - (size_t)k, " %s%s", llmq_task_name((enum llmq_task_id)t),
                              t + 1 < LLMQ_TASK_COUNT ? "," : ")");
            return LLMQ_ERR_ARG;
        }
    }
    for (int m = lo; m < hi; m++)
        if (strlen(METRICS[m].name) == name_n && memcmp(METRICS[m].name, name, name_n) == 0) {
            g->metric = (enum llmq_gate_metric)m;
            return LLMQ_OK;
        }
    int k = snprintf(err, err_n, "'%s': unknown metric '%.*s' (known:", expr, (int)n, s);
    for (int m = lo; m < hi && k >= 0 && (size_t)k < err_n; m++)
        k += snprintf(err + k, err_n - (size_t)k, " %s%s%s", dot ? "TASK." : "", METRICS[m].name,
                      m + 1 < hi ? "," : ")");
    return LLMQ_ERR_ARG;
}

enum llmq_status llmq_gate_parse(const char *expr, struct llmq_gate *out, char *err, size_t err_n) {
    memset(out, 0, sizeof(*out));
    if (err_n) err[0] = '\0';
    if (strlen(expr) > LLMQ_GATE_MAX_EXPR) {
        snprintf(err, err_n, "'%.40s...': longer than %d bytes", expr, LLMQ_GATE_MAX_EXPR);
        return LLMQ_ERR_ARG;
    }
    strcpy(out->expr, expr);
    const char *s = expr;
    while (isspace((unsigned char)*s)) s++;
    const char *m0 = s;
    while (*s && (isalnum((unsigned char)*s) || *s == '_' || *s == '-' || *s == '.')) s++;
    size_t mn = (size_t)(s - m0);
    while (isspace((unsigned char)*s)) s++;
    if (mn == 0 || (*s != '<' && *s != '>')) {
        snprintf(err, err_n, "'%s': expected METRIC<VALUE, METRIC<=VALUE, METRIC>VALUE or METRIC>=VALUE", expr);
        return LLMQ_ERR_ARG;
    }
    bool lt = *s == '<', eq = s[1] == '=';
    out->op = lt ? (eq ? LLMQ_GATE_OP_LE : LLMQ_GATE_OP_LT) : (eq ? LLMQ_GATE_OP_GE : LLMQ_GATE_OP_GT);
    s += eq ? 2 : 1;
    enum llmq_status st = parse_metric(expr, m0, mn, out, err, err_n);
    if (st) return st;
    char *end;
    while (isspace((unsigned char)*s)) s++;
    out->threshold = strtod(s, &end);
    if (end == s || !isfinite(out->threshold)) {
        snprintf(err, err_n, "'%s': the threshold is not a finite number", expr);
        return LLMQ_ERR_ARG;
    }
    s = end;
    while (isspace((unsigned char)*s)) s++;
    bool pct = *s == '%';
    if (pct) s++;
    while (isspace((unsigned char)*s)) s++;
    if (*s) {
        snprintf(err, err_n, "'%s': unexpected '%s' after the threshold", expr, s);
        return LLMQ_ERR_ARG;
    }
    enum llmq_gate_unit unit = METRICS[out->metric].unit;
    if (unit == LLMQ_GATE_UNIT_PERCENT && !pct) {
        snprintf(err, err_n, "'%s': %s is a percentage: write the threshold with '%%' (e.g. %s%s%g%%)", expr,
                 METRICS[out->metric].name, METRICS[out->metric].name, lt ? (eq ? "<=" : "<") : (eq ? ">=" : ">"),
                 out->threshold);
        return LLMQ_ERR_ARG;
    }
    if (unit == LLMQ_GATE_UNIT_PLAIN && pct) {
        snprintf(err, err_n, "'%s': %s is not a percentage: write the threshold without '%%'", expr,
                 METRICS[out->metric].name);
        return LLMQ_ERR_ARG;
    }
    return LLMQ_OK;
}

void llmq_gate_values_init(struct llmq_gate_values *v) {
    for (int i = 0; i < LLMQ_GATE_N_CORE; i++) v->core[i] = NAN;
    v->tasks = NULL;
    v->n_tasks = 0;
}

const char *llmq_gate_verdict_name(enum llmq_gate_verdict v) {
    return v == LLMQ_GATE_PASS ? "pass" : v == LLMQ_GATE_FAIL ? "fail" : "unmeasured";
}

static double task_value(const struct llmq_gate *g, const struct llmq_gate_values *v) {
    for (int i = 0; i < v->n_tasks; i++) {
        const struct llmq_gate_task_values *t = &v->tasks[i];
        if (strcmp(t->name, g->task) != 0) continue;
        switch (g->metric) {
        case LLMQ_GATE_TASK_ACC: return t->acc;
        case LLMQ_GATE_TASK_ACC_NORM: return t->acc_norm;
        case LLMQ_GATE_TASK_ACC_DROP: return t->acc_drop;
        default: return t->acc_norm_drop;
        }
    }
    return NAN;
}

enum llmq_gate_verdict llmq_gate_eval(const struct llmq_gate *g, const struct llmq_gate_values *v, double *measured) {
    double x = g->metric < LLMQ_GATE_N_CORE ? v->core[g->metric] : task_value(g, v);
    if (measured) *measured = x;
    if (isnan(x)) return LLMQ_GATE_UNMEASURED;
    bool hit;
    switch (g->op) {
    case LLMQ_GATE_OP_LT: hit = x < g->threshold; break;
    case LLMQ_GATE_OP_LE: hit = x <= g->threshold; break;
    case LLMQ_GATE_OP_GT: hit = x > g->threshold; break;
    default: hit = x >= g->threshold; break;
    }
    return hit ? LLMQ_GATE_FAIL : LLMQ_GATE_PASS;
}

void llmq_gate_metric_name(const struct llmq_gate *g, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s", g->task, g->task[0] ? "." : "", METRICS[g->metric].name);
}

void llmq_gate_format_value(const struct llmq_gate *g, double value, char *buf, size_t n) {
    switch (METRICS[g->metric].unit) {
    case LLMQ_GATE_UNIT_PERCENT: snprintf(buf, n, "%.3f%%", value); break;
    case LLMQ_GATE_UNIT_POINTS: snprintf(buf, n, "%.2f points", value); break;
    default: snprintf(buf, n, "%.6g", value); break;
    }
}
