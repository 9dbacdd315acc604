/*
 * cli/cmd_eval_tasks.c — `llmq eval --tasks LIST` (cli/eval_tasks.h): printing and JSON of
 * calib/eval/tasks.h's results. Not a command of its own: cli/cmd_eval.c calls eval_tasks_run.
 */
#include "cli/eval_tasks.h"

#include "calib/model/model.h"
#include "cli/commands.h"
#include "common/eta.h"
#include "common/log.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct tprogress {
    bool tty, printed;
    double last_s;
    int next_pct; // non-TTY: the next 10% step to print
};

static void on_progress(void *user, const struct llmq_tasks_progress *p) {
    struct tprogress *pr = user;
    bool last = p->seq_done == p->n_seq;
    if (llmq_log_get_level() > LLMQ_LOG_INFO) return; // --quiet
    int pct = (int)(100 * p->tokens_done / (p->n_tokens > 0 ? p->n_tokens : 1));
    if (!last && (pr->tty ? pr->printed && p->elapsed_s - pr->last_s < 0.2 : pct < pr->next_pct)) return;
    if (!pr->tty) pr->next_pct = pct / 10 * 10 + 10;
    pr->last_s = p->elapsed_s;
    char el[32], eta[32];
    llmq_eta_format(p->elapsed_s, el, sizeof(el));
    // the work of a forward call grows with its tokens: the work model is the token count (common/eta.h)
    struct llmq_eta w = {.total = (double)p->n_tokens, .done = (double)p->tokens_done, .t0 = 0};
    llmq_eta_format(llmq_eta_remaining(&w, p->elapsed_s), eta, sizeof(eta));
    fprintf(stderr, "%stasks: %s %lld/%lld sequences, %lld/%lld tokens  %.0f tokens/s  elapsed %s  ETA %s%s",
            pr->tty ? "\r" : "", llmq_task_name(p->id), (long long)p->seq_done, (long long)p->n_seq,
            (long long)p->tokens_done, (long long)p->n_tokens,
            p->elapsed_s > 0 ? (double)p->tokens_done / p->elapsed_s : 0.0, el, eta, pr->tty ? "\033[K" : "\n");
    if (pr->tty && last) fputc('\n', stderr);
    fflush(stderr);
    pr->printed = !last;
}

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *item_json(const struct llmq_task_item_result *it, bool norm) {
    json_t *o = json_object(), *sc = json_array(), *sn = json_array();
    json_object_set_new(o, "index", json_integer(it->index));
    json_object_set_new(o, "gold", json_integer(it->gold));
    json_object_set_new(o, "pred", json_integer(it->pred));
    if (norm) json_object_set_new(o, "pred_norm", json_integer(it->pred_norm));
    for (int c = 0; c < it->n_choices; c++) {
        json_array_append_new(sc, jnum(it->score[c]));
        if (norm) json_array_append_new(sn, jnum(it->score_norm[c]));
    }
    json_object_set_new(o, "scores", sc);
    if (norm)
        json_object_set_new(o, "scores_norm", sn);
    else
        json_decref(sn);
    if (it->n_choices == 1) json_object_set_new(o, "greedy", json_boolean(it->greedy));
    json_object_set_new(o, "tokens", json_integer(it->n_tokens));
    return o;
}

static json_t *task_json(const struct llmq_task_result *t, bool items) {
    json_t *o = json_object();
    json_object_set_new(o, "task", json_string(llmq_task_name(t->id)));
    json_object_set_new(o, "protocol", json_string(llmq_task_protocol_name(t->protocol)));
    json_object_set_new(o, "file", json_string(t->path));
    json_object_set_new(o, "file_sha256", json_string(t->sha256));
    json_object_set_new(o, "items", json_integer(t->n_items));
    json_object_set_new(o, "items_in_file", json_integer(t->n_file_items));
    json_object_set_new(o, "acc", jnum(t->acc));
    json_object_set_new(o, "acc_stderr", jnum(t->acc_stderr));
    if (t->has_norm) {
        json_object_set_new(o, "acc_norm", jnum(t->acc_norm));
        json_object_set_new(o, "acc_norm_stderr", jnum(t->acc_norm_stderr));
    }
    if (t->has_ppl) {
        json_object_set_new(o, "ppl", jnum(t->ppl));
        json_object_set_new(o, "ppl_stderr", jnum(t->ppl_stderr));
        json_object_set_new(o, "ppl_stderr_method", json_string("delta: ppl * stderr(ll)"));
    }
    json_object_set_new(o, "tokens", json_integer(t->tokens));
    json_object_set_new(o, "seconds", jnum(t->seconds));
    json_object_set_new(o, "tokens_per_s", jnum(t->seconds > 0 ? (double)t->tokens / t->seconds : 0));
    if (items && t->items) {
        json_t *a = json_array();
        for (int64_t i = 0; i < t->n_items; i++) json_array_append_new(a, item_json(&t->items[i], t->has_norm));
        json_object_set_new(o, "per_item", a);
    }
    return o;
}

static void print_table(const struct llmq_tasks_report *r, enum llmq_task_protocol p) {
    printf("\nzero-shot accuracy  [protocol %s; acc and acc_norm in %%, +/- standard error]\n",
           llmq_task_protocol_name(p));
    printf("%-14s %7s %17s %17s %9s %8s\n", "task", "items", "acc", "acc_norm", "tokens", "seconds");
    for (int i = 0; i < r->n_tasks; i++) {
        const struct llmq_task_result *t = &r->tasks[i];
        char acc[32], norm[32] = "-";
        snprintf(acc, sizeof(acc), "%.2f +/- %.2f", 100 * t->acc, 100 * t->acc_stderr);
        if (t->has_norm) snprintf(norm, sizeof(norm), "%.2f +/- %.2f", 100 * t->acc_norm, 100 * t->acc_norm_stderr);
        printf("%-14s %7lld %17s %17s %9lld %8.1f", llmq_task_name(t->id), (long long)t->n_items, acc, norm,
               (long long)t->tokens, t->seconds);
        if (t->has_ppl) printf("   ppl %.3f +/- %.3f", t->ppl, t->ppl_stderr);
        printf("\n");
    }
    fflush(stdout);
}

bool eval_tasks_list_ok(const char *list) {
    enum llmq_task_id ids[LLMQ_TASK_COUNT];
    const char *paths[LLMQ_TASK_COUNT];
    char *buf = NULL;
    int n;
    enum llmq_status st = llmq_tasks_parse_list(list, ids, &n, paths, &buf);
    free(buf);
    return st == LLMQ_OK;
}

enum llmq_status eval_tasks_run(const struct llmq_model *m, const struct eval_tasks_args *a, struct json_t *js,
                                struct llmq_gate_task_values *tv, int *n_tv) {
    enum llmq_task_id ids[LLMQ_TASK_COUNT];
    const char *paths[LLMQ_TASK_COUNT];
    char *buf = NULL;
    int n = 0;
    struct llmq_tasks_report rep = {0};
    struct tprogress pr = {.tty = isatty(STDERR_FILENO) != 0};
    *n_tv = 0;
    enum llmq_status st = llmq_tasks_parse_list(a->list, ids, &n, paths, &buf);
    if (st) goto done;
    struct llmq_tasks_opts o = {.protocol = a->protocol,
                                .limit = a->limit,
                                .use_seed = a->seed >= 0,
                                .seed = (uint64_t)(a->seed >= 0 ? a->seed : 0),
                                .n_threads = a->n_threads,
                                .backend = a->backend,
                                .emulate = a->emulate,
                                .keep_items = a->json_items,
                                .no_prefix_reuse = a->no_prefix_reuse,
                                .lc_parallel = a->lc_parallel,
                                .progress = on_progress,
                                .progress_user = &pr};
    for (int i = 0; i < LLMQ_TASK_COUNT; i++) o.paths[i] = paths[i];
    llmq_info("tasks: %s, protocol %s, %d task(s)%s%s", m->path, llmq_task_protocol_name(a->protocol), n,
              a->emulate ? ", emulating " : "", a->emulate ? llmq_emulate_name(a->emulate) : "");
    st = llmq_tasks_run(m, ids, n, &o, &rep);
    if (st) {
        if (pr.tty && pr.printed) fputc('\n', stderr);
        goto done;
    }
    print_table(&rep, a->protocol);
    *n_tv = cli_gate_task_values(&rep, tv);
    if (js) {
        json_t *arr = json_array();
        for (int i = 0; i < rep.n_tasks; i++) json_array_append_new(arr, task_json(&rep.tasks[i], a->json_items));
        json_object_set_new(js, "task_protocol", json_string(llmq_task_protocol_name(a->protocol)));
        json_object_set_new(js, "task_limit", a->limit >= 0 ? json_integer(a->limit) : json_null());
        json_object_set_new(js, "task_seed", a->seed >= 0 ? json_integer(a->seed) : json_null());
        json_object_set_new(js, "tasks", arr);
    }
done:
    llmq_tasks_report_free(&rep);
    free(buf);
    return st;
}
