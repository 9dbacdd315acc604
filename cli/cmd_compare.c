/*
 * cli/cmd_compare.c — `llmq compare`: several quantized artifacts of one model against its base on the same
 * text, in one table (calib/eval/compare.h has the sizes, the cache and the CSV / HTML pages).
 *
 *   llmq compare --base BASE A [B ...] [--ppl FILE|NAME] [--kld] [--protocol P] [--ctx N] [--chunks N]
 *                [--threads N] [--device D] [--cache-dir DIR] [--json FILE] [--csv FILE] [--html FILE]
 *                [--fail-if EXPR ...] [--force]
 *
 * Order of work: every flag, gate and output path is checked first (usage errors exit 2); then the text is
 * read, the base and every artifact are opened once (an unreadable one, or a vocabulary that differs from
 * the base's, stops the run before any evaluation: exit 1 naming the file); then the base's report (and its
 * logits with --kld) come from the cache or one evaluation, and each artifact costs one evaluation: its
 * perplexity (llmq_eval_ppl), or with --kld its perplexity and KLD against the cached logits
 * (llmq_eval_kld_file, the same chunks). PPL Δ% is against the base's exact (f32) perplexity; KLD against
 * its logits as cached (--logits-dtype, f16 by default: a KLD floor of ~3e-6, calib/eval/eval.h).
 * With --tasks LIST the base and every artifact also run the zero-shot tasks of calib/eval/tasks.h (protocol
 * --task-protocol, lm-eval by default; --limit / --seed select the items as `llmq eval --tasks` does): acc and
 * acc_norm with their standard errors, and the change in points against the base's. The task figures are not
 * cached: the base's tasks run on every compare.
 */
#include "calib/eval/compare.h"
#include "calib/eval/eval.h"
#include "calib/eval/gate.h"
#include "calib/eval/tasks.h"
#include "calib/model/model.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/eval_tasks.h"
#include "common/eta.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ARTIFACTS 64

struct cargs {
    const char *base, *text_arg, *protocol_name, *device, *cache_dir, *json_path, *csv_path, *html_path, *tasks,
        *logits_dtype, *gates_dummy, *task_protocol_name;
    const char *artifacts[MAX_ARTIFACTS];
    int n_artifacts;
    long ctx, chunks, threads, limit, seed; // limit, seed: -1 when not given
    bool kld, force;
};

// ---- progress over every evaluation ---------------------------------------------------------------------

struct progress {
    bool tty, printed;
    int index, n_evals;  // the evaluation running (0-based) of n_evals
    int64_t chunks_done; // chunks of the evaluations finished
    int64_t chunks_each; // K
    double t0, last;     // start of all evaluations; last update (TTY)
    const char *label;
};

static void on_progress(void *user, const struct llmq_eval_progress *p) {
    struct progress *pr = user;
    double now = llmq_now_s(), el = now - pr->t0;
    bool last = p->chunk == p->n_chunks;
    if (llmq_log_get_level() > LLMQ_LOG_INFO) return;
    if (!last && (pr->tty ? now - pr->last < 0.2 : p->chunk % (p->n_chunks / 4 > 1 ? p->n_chunks / 4 : 1) != 0)) return;
    pr->last = now;
    struct llmq_eta w = {
        .total = (double)(pr->n_evals * pr->chunks_each), .done = (double)(pr->chunks_done + p->chunk), .t0 = 0};
    char els[32], eta[32], kld[40] = "";
    llmq_eta_format(el, els, sizeof(els));
    llmq_eta_format(llmq_eta_remaining(&w, el), eta, sizeof(eta));
    if (p->kld_mean > 0) snprintf(kld, sizeof(kld), "  KLD %.6f", p->kld_mean);
    fprintf(stderr, "%scompare: [%d/%d] %s  chunk %lld/%lld  PPL %.4f%s  elapsed %s  ETA %s%s", pr->tty ? "\r" : "",
            pr->index + 1, pr->n_evals, pr->label, (long long)p->chunk, (long long)p->n_chunks, p->ppl, kld, els, eta,
            pr->tty ? "\033[K" : "\n");
    if (pr->tty && last) fputc('\n', stderr);
    fflush(stderr);
    pr->printed = true;
}

// ---- zero-shot tasks: the hook for calib/eval/tasks.h ----------------------------------------------------

// Runs a->tasks on m and returns one llmq_compare_task per task in *out (malloc'd, *n rows); base (n_base
// rows, NULL for the base itself) gives the Δ points.
static enum llmq_status eval_tasks(const struct cargs *a, const struct llmq_model *m, enum llmq_backend backend,
                                   const struct llmq_compare_task *base, int n_base, struct llmq_compare_task **out,
                                   int *n) {
    enum llmq_task_id ids[LLMQ_TASK_COUNT];
    const char *paths[LLMQ_TASK_COUNT];
    char *buf = NULL;
    int n_ids = 0;
    struct llmq_tasks_report rep = {0};
    struct llmq_tasks_opts o = {.limit = a->limit,
                                .use_seed = a->seed >= 0,
                                .seed = (uint64_t)(a->seed >= 0 ? a->seed : 0),
                                .n_threads = (int)a->threads,
                                .backend = backend};
    *out = NULL;
    *n = 0;
    llmq_task_protocol_from_name(a->task_protocol_name, &o.protocol); // checked by check_flags
    enum llmq_status st = llmq_tasks_parse_list(a->tasks, ids, &n_ids, paths, &buf);
    for (int i = 0; i < LLMQ_TASK_COUNT; i++) o.paths[i] = paths[i];
    if (!st) llmq_info("compare: tasks %s on %s (protocol %s)", a->tasks, m->path, a->task_protocol_name);
    if (!st) st = llmq_tasks_run(m, ids, n_ids, &o, &rep);
    if (!st && !(*out = calloc((size_t)rep.n_tasks + 1, sizeof(**out))))
        st = llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    for (int t = 0; !st && t < rep.n_tasks; t++) {
        const struct llmq_task_result *x = &rep.tasks[t];
        struct llmq_compare_task *c = &(*out)[t];
        *c = (struct llmq_compare_task){llmq_task_name(x->id),
                                        x->n_items,
                                        x->acc,
                                        x->acc_stderr,
                                        x->has_norm ? x->acc_norm : NAN,
                                        x->has_norm ? x->acc_norm_stderr : NAN,
                                        0,
                                        0};
        if (base && t < n_base) { // the same list in the same order: row t is the same task
            c->acc_delta_pts = 100 * (c->acc - base[t].acc);
            c->acc_norm_delta_pts = 100 * (c->acc_norm - base[t].acc_norm);
        }
        *n = t + 1;
    }
    llmq_tasks_report_free(&rep);
    free(buf);
    return st;
}

// ---- checks -----------------------------------------------------------------------------------------------

static const char *check_flags(const struct cargs *a, enum llmq_eval_protocol *protocol, enum llmq_dtype *dtype) {
    if (!a->base) return "--base BASE is required";
    if (a->n_artifacts < 1) return "name at least one artifact to compare with the base";
    if (!llmq_eval_protocol_from_name(a->protocol_name, protocol)) return "--protocol must be llamacpp or gptq";
    if (a->ctx < 0 || a->ctx == 1 || a->ctx > (1L << 20)) return "--ctx must be between 2 and 1048576";
    if (a->chunks == 0 || a->chunks < -1) return "--chunks must be -1 (all) or at least 1";
    if (a->threads < 1 || a->threads > 256) return "--threads must be between 1 and 256";
    *dtype = llmq_dtype_from_name(a->logits_dtype);
    if (*dtype != LLMQ_DTYPE_F16 && *dtype != LLMQ_DTYPE_F32) return "--logits-dtype must be f16 or f32";
    enum llmq_task_protocol tp;
    if (!llmq_task_protocol_from_name(a->task_protocol_name, &tp)) return "--task-protocol must be lm-eval or llamacpp";
    if (!a->tasks && (a->limit != -1 || a->seed != -1)) return "--limit and --seed need --tasks";
    if (a->limit == 0 || a->limit < -1) return "--limit must be -1 (all) or at least 1";
    if (a->seed < -1) return "--seed must be at least 0";
    if (a->tasks && !eval_tasks_list_ok(a->tasks)) return "--tasks: not a task list (the line above says why)";
    return NULL;
}

// Every output path through the one guard (cli/args.h cli_guard): not an input of this run (the base, the
// artifacts, the text), distinct, and not existing unless --force.
static int check_outputs(const struct cargs *a) {
    const char *inputs[MAX_ARTIFACTS + 2] = {a->base, a->text_arg};
    for (int k = 0; k < a->n_artifacts; k++) inputs[2 + k] = a->artifacts[k];
    const char *outs[3] = {a->json_path, a->csv_path, a->html_path};
    return cli_guard(inputs, 2 + a->n_artifacts, outs, 3, a->force);
}

// The artifact's label: its last path component (a trailing '/' ignored), or the path as given when two
// artifacts share it.
static const char *label_of(const char *path, char *buf, size_t n) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t s = len;
    while (s > 0 && path[s - 1] != '/') s--;
    snprintf(buf, n, "%.*s", (int)(len - s), path + s);
    return buf;
}

// ---- one artifact -----------------------------------------------------------------------------------------

static void row_from_report(struct llmq_compare_row *row, const struct llmq_eval_report *rep, double base_ppl) {
    const struct llmq_eval_result *r = &rep->res;
    row->ppl = r->ppl;
    row->ppl_unc = r->ppl_unc;
    row->ppl_delta_pct = 100.0 * (r->ppl / base_ppl - 1.0);
    row->seconds = rep->seconds;
    row->kld_mean = row->kld_unc = row->kld_p99 = row->kld_max = row->top1_pct = row->top1_unc_pct = NAN;
    if (!r->kld) return;
    row->kld_mean = r->kld_mean;
    row->kld_unc = r->kld_unc;
    for (int q = 0; q < LLMQ_EVAL_N_QUANTILES; q++)
        if (llmq_eval_quantiles[q] == 0.99) row->kld_p99 = r->kld_q[q];
    row->kld_max = r->kld_q[LLMQ_EVAL_N_QUANTILES - 1];
    row->top1_pct = 100.0 * r->same_top;
    row->top1_unc_pct = 100.0 * r->same_top_unc;
}

#define MAX_TASKS 16

// The gate values of an artifact; tv (MAX_TASKS) receives its task rows in points.
static void gate_values(const struct llmq_compare_row *row, struct llmq_gate_values *v,
                        struct llmq_gate_task_values *tv) {
    llmq_gate_values_init(v);
    for (int t = 0; t < row->n_tasks && t < MAX_TASKS; t++) {
        const struct llmq_compare_task *x = &row->tasks[t];
        tv[t] = (struct llmq_gate_task_values){x->name, 100 * x->acc, 100 * x->acc_norm, -x->acc_delta_pts,
                                               -x->acc_norm_delta_pts};
        v->n_tasks = t + 1;
    }
    v->tasks = tv;
    v->core[LLMQ_GATE_PPL] = row->ppl;
    v->core[LLMQ_GATE_PPL_INCREASE] = row->ppl_delta_pct;
    v->core[LLMQ_GATE_KLD] = row->kld_mean;
    v->core[LLMQ_GATE_KLD_P99] = row->kld_p99;
    v->core[LLMQ_GATE_KLD_MAX] = row->kld_max;
    v->core[LLMQ_GATE_TOP1] = row->top1_pct;
}

// Opens an artifact and checks it against the base (same vocabulary). *out NULL on failure.
static enum llmq_status open_artifact(const char *path, const struct llmq_model *base, struct llmq_model **out) {
    *out = NULL;
    if (!llmq_is_dir(path) && !llmq_file_exists(path))
        return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no such file or directory", path);
    enum llmq_status st = llmq_model_load(path, out);
    if (st) return llmq_errorf(st, "%s: not a model llmq reads (%s)", path, llmq_last_error());
    if (!llmq_eval_same_vocab(base, *out)) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: its vocabulary differs from the base's (%s): logits cannot be compared",
                         path, base->path);
        llmq_model_free(*out);
        *out = NULL;
    }
    return st;
}

// ---- output -----------------------------------------------------------------------------------------------

static void fmt_or_dash(char *buf, size_t n, const char *fmt, double v) {
    if (isfinite(v))
        snprintf(buf, n, fmt, v);
    else
        snprintf(buf, n, "-");
}

// The task columns of row r: per task (those of the base row, rows[0]) acc ± stderr in % and Δ points.
static void print_task_cells(const struct llmq_compare_row *r, const struct llmq_compare_row *base) {
    for (int t = 0; t < base->n_tasks; t++) {
        const struct llmq_compare_task *x = t < r->n_tasks ? &r->tasks[t] : NULL;
        char acc[40] = "-", d[24];
        if (x) snprintf(acc, sizeof(acc), "%.2f±%.2f", 100 * x->acc, 100 * x->acc_stderr); // '±': 2 bytes
        if (r->is_base)
            snprintf(d, sizeof(d), "base");
        else
            fmt_or_dash(d, sizeof(d), "%+.2f", x ? x->acc_delta_pts : NAN);
        printf(" %*s %7s", x ? 15 : 14, acc, d);
    }
}

static void print_table(const struct llmq_compare_row *rows, int n, int label_w) {
    printf("\n%-*s %9s %7s %10s %10s %10s %10s %10s %9s", label_w, "artifact", "size MiB", "bpw", "PPL", "±", "ΔPPL",
           "mean KLD", "KLD p99", "same top1");
    for (int t = 0; n && t < rows[0].n_tasks; t++) {
        char h[48];
        snprintf(h, sizeof(h), "%s acc%%", rows[0].tasks[t].name);
        printf(" %14s %8s", h, "Δpts"); // 'Δ': 2 bytes
    }
    printf("\n");
    for (int i = 0; i < n; i++) {
        const struct llmq_compare_row *r = &rows[i];
        char d[24], k[24], p[24], t[24];
        if (r->is_base)
            snprintf(d, sizeof(d), "base");
        else
            fmt_or_dash(d, sizeof(d), "%+.2f%%", r->ppl_delta_pct);
        fmt_or_dash(k, sizeof(k), "%.6f", r->is_base ? NAN : r->kld_mean);
        fmt_or_dash(p, sizeof(p), "%.5f", r->is_base ? NAN : r->kld_p99);
        fmt_or_dash(t, sizeof(t), "%.2f%%", r->is_base ? NAN : r->top1_pct);
        printf("%-*s %9.2f %7.3f %10.4f %9.5f %9s %10s %10s %9s", label_w, r->label,
               (double)r->size.file_bytes / 1048576.0, r->size.bpw, r->ppl, r->ppl_unc, d, k, p, t);
        print_task_cells(r, &rows[0]);
        printf("\n");
    }
}

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *row_json(const struct llmq_compare_row *r) {
    json_t *j = json_object();
    json_object_set_new(j, "artifact", json_string(r->label));
    json_object_set_new(j, "path", json_string(r->path));
    json_object_set_new(j, "base", json_boolean(r->is_base));
    json_object_set_new(j, "file_bytes", json_integer((json_int_t)r->size.file_bytes));
    json_object_set_new(j, "tensor_bytes", json_integer((json_int_t)r->size.tensor_bytes));
    json_object_set_new(j, "params", json_integer(r->size.n_params));
    json_object_set_new(j, "bpw", jnum(r->size.bpw));
    json_object_set_new(j, "ppl", jnum(r->ppl));
    json_object_set_new(j, "ppl_uncertainty", jnum(r->ppl_unc));
    json_object_set_new(j, "ppl_delta_percent", jnum(r->ppl_delta_pct));
    json_object_set_new(j, "kld_mean", jnum(r->kld_mean));
    json_object_set_new(j, "kld_uncertainty", jnum(r->kld_unc));
    json_object_set_new(j, "kld_p99", jnum(r->kld_p99));
    json_object_set_new(j, "kld_max", jnum(r->kld_max));
    json_object_set_new(j, "same_top1_percent", jnum(r->top1_pct));
    json_object_set_new(j, "same_top1_uncertainty_percent", jnum(r->top1_unc_pct));
    json_object_set_new(j, "seconds", jnum(r->seconds));
    json_t *t = json_array();
    for (int k = 0; k < r->n_tasks; k++)
        json_array_append_new(t, json_pack("{s:s, s:I, s:o, s:o, s:o, s:o, s:o}", "task", r->tasks[k].name, "items",
                                           (json_int_t)r->tasks[k].items, "acc", jnum(r->tasks[k].acc), "acc_stderr",
                                           jnum(r->tasks[k].acc_stderr), "acc_norm", jnum(r->tasks[k].acc_norm),
                                           "acc_norm_stderr", jnum(r->tasks[k].acc_norm_stderr), "acc_delta_points",
                                           jnum(r->tasks[k].acc_delta_pts)));
    json_object_set_new(j, "tasks", t);
    return j;
}

// What the run was, for the JSON and the HTML title.
struct context {
    const struct llmq_eval_text *text;
    const struct llmq_compare_base *base;
    const char *cache_dir, *device;
    char text_hex[65];
};

static enum llmq_status write_json(const struct cargs *a, const struct context *c, const struct llmq_compare_row *rows,
                                   int n, const struct cli_gates *gs) {
    json_t *j = json_object(), *arr = json_array();
    const struct llmq_eval_plan *p = &c->base->rep.plan;
    json_object_set_new(j, "llmq_version", json_string(LLMQ_VERSION));
    json_object_set_new(j, "text", json_string(c->text->path));
    if (c->text->dataset) json_object_set_new(j, "dataset", json_string(c->text->dataset));
    json_object_set_new(j, "text_sha256", json_string(c->text_hex));
    json_object_set_new(j, "protocol", json_string(llmq_eval_protocol_name(p->protocol)));
    json_object_set_new(j, "ctx", json_integer(p->n_ctx));
    json_object_set_new(j, "chunks", json_integer(p->n_chunks));
    json_object_set_new(j, "tokens_scored", json_integer(c->base->rep.res.count));
    json_object_set_new(j, "kld", json_boolean(a->kld));
    json_object_set_new(j, "threads", json_integer(a->threads));
    json_object_set_new(j, "device", json_string(c->device));
    json_object_set_new(j, "cache",
                        json_pack("{s:s, s:s, s:b, s:b}", "dir", c->cache_dir, "entry", c->base->entry,
                                  "base_report_cached", c->base->cached_report, "base_logits_cached",
                                  c->base->cached_lf));
    for (int i = 0; i < n; i++) json_array_append_new(arr, row_json(&rows[i]));
    json_object_set_new(j, "artifacts", arr);
    cli_gates_json(gs, j);
    json_object_set_new(j, "exit_status", json_integer(gs->violated ? 3 : 0));
    enum llmq_status st =
        llmq_write_json(a->json_path, j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(j);
    return st;
}

static enum llmq_status write_outputs(const struct cargs *a, const struct context *c,
                                      const struct llmq_compare_row *rows, int n, const struct cli_gates *gs) {
    enum llmq_status st = LLMQ_OK;
    if (a->json_path && (st = write_json(a, c, rows, n, gs))) return st;
    if (a->csv_path && (st = llmq_compare_write_csv(a->csv_path, rows, n))) return st;
    if (a->html_path) {
        char title[1024];
        snprintf(title, sizeof(title), "%s (sha256 %.12s...), protocol %s, ctx %lld, %lld chunks, %lld tokens scored",
                 c->text->path, c->text_hex, llmq_eval_protocol_name(c->base->rep.plan.protocol),
                 (long long)c->base->rep.plan.n_ctx, (long long)c->base->rep.plan.n_chunks,
                 (long long)c->base->rep.res.count);
        st = llmq_compare_write_html(a->html_path, rows, n, title);
    }
    return st;
}

// ---- the command ------------------------------------------------------------------------------------------

// Everything the run owns.
struct run {
    struct llmq_eval_text text;
    struct llmq_model *base;
    int32_t *ids;
    int64_t n_ids;
    struct llmq_compare_base cb;
    struct llmq_compare_row rows[MAX_ARTIFACTS + 1];
    char labels[MAX_ARTIFACTS + 1][256];
    struct llmq_compare_task *tasks[MAX_ARTIFACTS + 1]; // (rows[i].n_tasks) per row, owned; NULL without --tasks
};

static void run_free(struct run *r) {
    llmq_eval_text_free(&r->text);
    llmq_model_free(r->base);
    free(r->ids);
    llmq_logits_close(r->cb.lf);
    for (int i = 0; i <= MAX_ARTIFACTS; i++) free(r->tasks[i]);
}

// The labels of the base (row 0) and of every artifact, unique (see label_of); returns the widest.
static int make_labels(const struct cargs *a, struct run *r) {
    int w = 8;
    for (int i = 0; i <= a->n_artifacts; i++) {
        const char *path = i ? a->artifacts[i - 1] : a->base;
        label_of(path, r->labels[i], sizeof(r->labels[i]));
        for (int j = 0; j < i; j++)
            if (strcmp(r->labels[j], r->labels[i]) == 0) snprintf(r->labels[i], sizeof(r->labels[i]), "%s", path);
        r->rows[i].label = r->labels[i];
        r->rows[i].path = path;
        r->rows[i].is_base = i == 0;
        int len = (int)strlen(r->labels[i]);
        if (len > w) w = len < 48 ? len : 48;
    }
    return w;
}

// Evaluates artifact i (1-based row) against the base; fills its row.
static enum llmq_status eval_artifact(const struct cargs *a, struct run *r, int i, const struct llmq_eval_opts *o) {
    struct llmq_model *m = NULL;
    struct llmq_eval_report rep;
    enum llmq_status st = open_artifact(a->artifacts[i - 1], r->base, &m);
    if (st) return st;
    llmq_compare_model_size(m, &r->rows[i].size);
    if (a->tasks &&
        (st = eval_tasks(a, m, o->backend, r->tasks[0], r->rows[0].n_tasks, &r->tasks[i], &r->rows[i].n_tasks)))
        goto done;
    r->rows[i].tasks = r->tasks[i];
    st = r->cb.lf ? llmq_eval_kld_file(r->cb.lf, m, o, &rep) : llmq_eval_ppl(m, r->ids, r->n_ids, o, &rep);
    if (!st) row_from_report(&r->rows[i], &rep, r->cb.rep.res.ppl);
done:
    llmq_model_free(m);
    return st;
}

// Opens every artifact once before anything is evaluated: a bad one stops the run early.
static enum llmq_status preflight(const struct cargs *a, const struct llmq_model *base) {
    for (int i = 0; i < a->n_artifacts; i++) {
        struct llmq_model *m;
        enum llmq_status st = open_artifact(a->artifacts[i], base, &m);
        llmq_model_free(m);
        if (st) return st;
    }
    return LLMQ_OK;
}

static enum llmq_status compare(const struct cargs *a, enum llmq_eval_protocol protocol, enum llmq_dtype dtype,
                                enum llmq_backend backend, const char *device, struct cli_gates *gs) {
    struct run *r = calloc(1, sizeof(*r));
    if (!r) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    char cache_dir[4096];
    struct llmq_compare_key key = {
        .protocol = protocol, .max_chunks = a->chunks, .logits_dtype = dtype, .backend = backend};
    enum llmq_status st = llmq_compare_cache_dir(a->cache_dir, cache_dir, sizeof(cache_dir));
    bool join = protocol == LLMQ_EVAL_PROTOCOL_GPTQ;
    if (!st) st = llmq_eval_text_load(a->text_arg, protocol, join, &r->text);
    if (!st) st = llmq_model_load(a->base, &r->base);
    if (!st) st = preflight(a, r->base);
    if (!st) st = llmq_eval_text_tokenize(r->base, &r->text, &r->ids, &r->n_ids);
    if (!st) st = llmq_compare_model_sha256(a->base, key.model_sha256);
    if (st) goto done;
    memcpy(key.text_sha256, r->text.sha, 32);
    key.n_ctx = a->ctx > 0 ? a->ctx : llmq_eval_protocol_default_ctx(protocol);

    int label_w = make_labels(a, r);
    int64_t k_max = r->n_ids / key.n_ctx, k = a->chunks > 0 && a->chunks < k_max ? a->chunks : k_max;
    struct progress pr = {.tty = isatty(STDERR_FILENO) != 0,
                          .n_evals = a->n_artifacts + 1,
                          .chunks_each = k,
                          .t0 = llmq_now_s(),
                          .label = r->labels[0]};
    struct llmq_eval_opts o = {.protocol = protocol,
                               .n_ctx = key.n_ctx,
                               .max_chunks = a->chunks,
                               .n_threads = (int)a->threads,
                               .backend = backend,
                               .progress = on_progress,
                               .progress_user = &pr};
    if ((st = llmq_compare_base_get(r->base, r->ids, r->n_ids, &o, &key, cache_dir, a->kld, &r->cb))) goto done;
    if (r->cb.cached_report && (!a->kld || r->cb.cached_lf)) {
        llmq_info("compare: base %s from the cache (%s/%s.*)", a->base, cache_dir, r->cb.entry);
        pr.n_evals--;
    } else {
        pr.chunks_done = k;
        pr.index = 1;
    }
    llmq_compare_model_size(r->base, &r->rows[0].size);
    row_from_report(&r->rows[0], &r->cb.rep, r->cb.rep.res.ppl);
    if (a->kld) r->rows[0].kld_mean = r->rows[0].kld_p99 = r->rows[0].kld_max = 0, r->rows[0].top1_pct = 100;
    if (a->tasks && (st = eval_tasks(a, r->base, backend, NULL, 0, &r->tasks[0], &r->rows[0].n_tasks))) goto done;
    r->rows[0].tasks = r->tasks[0];
    for (int i = 1; i <= a->n_artifacts; i++, pr.index++, pr.chunks_done += k) {
        pr.label = r->labels[i];
        if ((st = eval_artifact(a, r, i, &o))) goto done;
    }
    if (pr.tty && pr.printed) fflush(stderr);

    struct context c = {.text = &r->text, .base = &r->cb, .cache_dir = cache_dir, .device = device};
    llmq_sha256_hex(r->text.sha, c.text_hex);
    printf("base:      %s\ntext:      %s (%zu bytes, sha256 %s)\n", a->base, r->text.path, r->text.len, c.text_hex);
    printf("protocol:  %s (ctx %lld, %lld chunks, %lld tokens scored per artifact)%s\n",
           llmq_eval_protocol_name(protocol), (long long)r->cb.rep.plan.n_ctx, (long long)r->cb.rep.plan.n_chunks,
           (long long)r->cb.rep.res.count, r->cb.cached_report ? ", base from the cache" : "");
    print_table(r->rows, a->n_artifacts + 1, label_w);
    for (int i = 1; i <= a->n_artifacts; i++) {
        struct llmq_gate_values v;
        struct llmq_gate_task_values tv[MAX_TASKS];
        gate_values(&r->rows[i], &v, tv);
        cli_gates_eval("compare", gs, r->labels[i], &v);
    }
    if (gs->n) printf("\ngates:     %d checked on %d artifact(s), %d violated\n", gs->n, a->n_artifacts, gs->violated);
    fflush(stdout);
    st = write_outputs(a, &c, r->rows, a->n_artifacts + 1, gs);
done:
    run_free(r);
    free(r);
    return st;
}

int cmd_compare(int argc, char **argv) {
    struct cargs a = {.text_arg = "wikitext-2",
                      .protocol_name = "llamacpp",
                      .device = "auto",
                      .logits_dtype = "f16",
                      .task_protocol_name = "lm-eval",
                      .chunks = -1,
                      .limit = -1,
                      .seed = -1,
                      .threads = sysconf(_SC_NPROCESSORS_ONLN)};
    if (a.threads < 1) a.threads = 1;
    struct cli_gates gs;
    int rc = cli_gates_take("compare", &argc, argv, &gs);
    if (rc) return rc;
    const struct cli_flag flags[] = {
        {"base", CLI_STR, &a.base, NULL, "the reference model (GGUF file or HF directory; required)"},
        {"ppl", CLI_STR, &a.text_arg, "wikitext-2",
         "text file (.txt, .raw, .gz) or dataset name (datasets/manifest.tsv) every artifact is measured on"},
        {"kld", CLI_BOOL, &a.kld, "off", "also KL divergence from the base, its 99th percentile, same top-1 %"},
        {"protocol", CLI_STR, &a.protocol_name, "llamacpp", "llamacpp or gptq (llmq eval --help explains both)"},
        {"ctx", CLI_INT, &a.ctx, "512 for llamacpp, 2048 for gptq", "tokens per chunk"},
        {"chunks", CLI_INT, &a.chunks, "-1 (all)", "evaluate only the first N chunks"},
        {"threads", CLI_INT, &a.threads, "the number of CPUs", "threads for the forward pass and the scoring"},
        {"device", CLI_STR, &a.device, "auto", CLI_DEVICE_HELP},
        {"cache-dir", CLI_STR, &a.cache_dir, "$LLMQ_CACHE/compare or ~/.cache/llmq/compare",
         "where the base's figures and logits are cached (keyed by model sha256, text sha256, protocol, ctx, "
         "chunks)"},
        {"logits-dtype", CLI_STR, &a.logits_dtype, "f16", "element type of the cached base logits: f16 or f32"},
        {"tasks", CLI_STR, &a.tasks, "none",
         "zero-shot task columns (acc, acc_norm, Δ points vs the base): all, or a comma list of hellaswag, arc-easy, "
         "arc-challenge, piqa, winogrande, lambada; NAME=FILE reads that file (as llmq eval --tasks)"},
        {"task-protocol", CLI_STR, &a.task_protocol_name, "lm-eval",
         "--tasks: lm-eval or llamacpp (llmq eval --help explains both)"},
        {"limit", CLI_INT, &a.limit, "-1 (all)", "--tasks: N items per task (as llmq eval --limit)"},
        {"seed", CLI_INT, &a.seed, "none", "--tasks: draw the --limit items at random with this seed"},
        {"fail-if", CLI_STR, &a.gates_dummy, "none", CLI_GATES_HELP},
        {"json", CLI_STR, &a.json_path, NULL, "write the table, the run's inputs and every gate's verdict as JSON"},
        {"csv", CLI_STR, &a.csv_path, NULL, "write the table as CSV"},
        {"html", CLI_STR, &a.html_path, NULL,
         "write a self-contained HTML page: the table, size vs PPL and size vs KLD plots with the Pareto front"},
        {"force", CLI_BOOL, &a.force, "off", "replace existing --json / --csv / --html files"},
    };
    const struct cli_cmd cmd = {
        "compare",
        "--base BASE ARTIFACT... [flags]",
        "Perplexity (and KLD) of several quantized artifacts against their base on the same text, in one table.",
        "Each ARTIFACT is a GGUF file or an HF directory (awq / gptq / fake outputs too) with the base's vocabulary.\n"
        "The base's figures (and logits with --kld) are computed once and cached, so adding an artifact later\n"
        "costs one evaluation. ΔPPL is 100·(PPL/PPL_base − 1); bpw = 8 · tensor bytes / parameters.\n"
        "Exit status: 0 ok, 1 failure (a file unreadable or not comparable), 2 usage error, 3 a --fail-if gate\n"
        "violated (one stderr line per violation names the gate, the artifact and the measured value; the\n"
        "outputs are still written).",
        flags,
        (int)(sizeof(flags) / sizeof(flags[0])),
        0,
        MAX_ARTIFACTS};
    const char *usage;
    enum llmq_eval_protocol protocol;
    enum llmq_dtype dtype;
    enum llmq_backend backend;
    char device[320];
    enum llmq_status st;
    rc = cli_parse(&cmd, argc, argv, a.artifacts, &a.n_artifacts);
    if (rc) {
        rc = rc == 1 ? 0 : rc; // 1: --help was printed
        goto out;
    }
    if ((usage = check_flags(&a, &protocol, &dtype)) ||
        (rc = cli_gates_check("compare", &gs, LLMQ_GATE_NEEDS_BASE | (a.kld ? LLMQ_GATE_NEEDS_KLD : 0), a.tasks,
                              "a base", "--kld"))) {
        if (usage)
            fprintf(stderr, "llmq compare: %s\nrun 'llmq compare --help' for the flags and their defaults\n", usage);
        rc = 2;
        goto out;
    }
    if (check_outputs(&a)) {
        rc = 1;
        goto out;
    }
    if ((rc = cli_device(a.device, &backend, device, sizeof(device)))) goto out;
    st = compare(&a, protocol, dtype, backend, device, &gs);
    rc = st ? 1 : gs.violated ? 3 : 0;
out:
    cli_gates_free(&gs);
    return rc;
}
