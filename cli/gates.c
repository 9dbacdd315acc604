// cli/gates.c — `--fail-if EXPR` of `llmq eval` and `llmq compare` (cli/commands.h): taking, checking,
// evaluating and reporting the quality gates of calib/eval/gate.h.
#include "calib/eval/eval.h"
#include "calib/eval/gate.h"
#include "calib/eval/tasks.h"
#include "cli/args.h"
#include "cli/commands.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_gates_take(const char *cmd, int *argc, char **argv, struct cli_gates *gs) {
    const char *vals[CLI_MAX_GATES];
    int n = 0, rc = cli_take_repeated("fail-if", argc, argv, vals, CLI_MAX_GATES, &n);
    gs->n = 0;
    gs->violated = 0;
    gs->results = NULL;
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        char err[512];
        if (llmq_gate_parse(vals[i], &gs->g[i], err, sizeof(err))) {
            fprintf(stderr, "llmq %s: --fail-if %s\nrun 'llmq %s --help' for the gate metrics\n", cmd, err, cmd);
            return 2;
        }
    }
    gs->n = n;
    return 0;
}

// Whether the task list `tasks` (--tasks; NULL: none) names the task `name`.
static bool list_has_task(const char *tasks, const char *name) {
    enum llmq_task_id ids[LLMQ_TASK_COUNT], want;
    const char *paths[LLMQ_TASK_COUNT];
    char *buf = NULL;
    int n = 0;
    bool has = false;
    if (tasks && llmq_task_from_name(name, &want) && llmq_tasks_parse_list(tasks, ids, &n, paths, &buf) == LLMQ_OK)
        for (int i = 0; i < n; i++) has |= ids[i] == want;
    free(buf);
    return has;
}

int cli_gates_check(const char *cmd, const struct cli_gates *gs, unsigned have, const char *tasks, const char *how_base,
                    const char *how_kld) {
    for (int i = 0; i < gs->n; i++) {
        const struct llmq_gate *g = &gs->g[i];
        unsigned miss = llmq_gate_needs(g) & ~have;
        if ((llmq_gate_needs(g) & LLMQ_GATE_NEEDS_TASK) && !list_has_task(tasks, g->task)) {
            if (tasks)
                fprintf(stderr, "llmq %s: --fail-if '%s' needs the task %s, which --tasks %s does not name\n", cmd,
                        g->expr, g->task, tasks);
            else
                fprintf(stderr, "llmq %s: --fail-if '%s' needs --tasks %s\n", cmd, g->expr, g->task);
            return 2;
        }
        if (!(miss & ~(unsigned)LLMQ_GATE_NEEDS_TASK)) continue;
        fprintf(stderr, "llmq %s: --fail-if '%s' needs %s\n", cmd, g->expr,
                miss & LLMQ_GATE_NEEDS_BASE ? how_base : how_kld);
        return 2;
    }
    return 0;
}

int cli_gate_task_values(const struct llmq_tasks_report *r, struct llmq_gate_task_values *tv) {
    for (int i = 0; i < r->n_tasks && i < LLMQ_TASK_COUNT; i++) {
        const struct llmq_task_result *t = &r->tasks[i];
        tv[i] = (struct llmq_gate_task_values){llmq_task_name(t->id), 100 * t->acc,
                                               t->has_norm ? 100 * t->acc_norm : NAN, NAN, NAN};
    }
    return r->n_tasks < LLMQ_TASK_COUNT ? r->n_tasks : LLMQ_TASK_COUNT;
}

void cli_gate_values_from_eval(const struct llmq_eval_result *r, struct llmq_gate_values *v) {
    llmq_gate_values_init(v);
    v->core[LLMQ_GATE_PPL] = r->ppl;
    if (!r->kld) return;
    v->core[LLMQ_GATE_PPL_INCREASE] = 100.0 * (r->ppl / r->ppl_base - 1.0);
    v->core[LLMQ_GATE_KLD] = r->kld_mean;
    for (int q = 0; q < LLMQ_EVAL_N_QUANTILES; q++)
        if (llmq_eval_quantiles[q] == 0.99) v->core[LLMQ_GATE_KLD_P99] = r->kld_q[q];
    v->core[LLMQ_GATE_KLD_MAX] = r->kld_q[LLMQ_EVAL_N_QUANTILES - 1];
    v->core[LLMQ_GATE_TOP1] = 100.0 * r->same_top;
}

static json_t *jnum_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

int cli_gates_eval(const char *cmd, struct cli_gates *gs, const char *artifact, const struct llmq_gate_values *v) {
    int bad = 0;
    if (gs->n && !gs->results) gs->results = json_array();
    for (int i = 0; i < gs->n; i++) {
        const struct llmq_gate *g = &gs->g[i];
        double x;
        enum llmq_gate_verdict vd = llmq_gate_eval(g, v, &x);
        char name[64], val[64];
        llmq_gate_metric_name(g, name, sizeof(name));
        llmq_gate_format_value(g, x, val, sizeof(val));
        if (vd == LLMQ_GATE_FAIL)
            fprintf(stderr, "llmq %s: gate '%s' violated by %s: %s = %s\n", cmd, g->expr, artifact, name, val);
        else if (vd == LLMQ_GATE_UNMEASURED)
            fprintf(stderr,
                    "llmq %s: gate '%s' could not be checked on %s: %s was not measured (counted as violated)\n", cmd,
                    g->expr, artifact, name);
        bad += vd != LLMQ_GATE_PASS;
        json_t *r = json_object();
        json_object_set_new(r, "gate", json_string(g->expr));
        json_object_set_new(r, "metric", json_string(name));
        json_object_set_new(r, "threshold", json_real(g->threshold));
        json_object_set_new(r, "artifact", json_string(artifact));
        json_object_set_new(r, "value", jnum_or_null(x));
        json_object_set_new(r, "verdict", json_string(llmq_gate_verdict_name(vd)));
        json_array_append_new(gs->results, r);
    }
    gs->violated += bad;
    return bad;
}

void cli_gates_json(const struct cli_gates *gs, json_t *report) {
    if (gs->results)
        json_object_set(report, "gates", gs->results); // report shares the caller's array
    else
        json_object_set_new(report, "gates", json_array());
    json_object_set_new(report, "gates_violated", json_integer(gs->violated));
}

void cli_gates_free(struct cli_gates *gs) {
    json_decref(gs->results);
    gs->results = NULL;
}
