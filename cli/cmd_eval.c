/*
 * cli/cmd_eval.c — `llmq eval`: perplexity of a model on a text, or its KL divergence from a base
 * model, under the llama.cpp or the GPTQ-paper protocol (calib/eval/eval.h has the definitions).
 *
 *   llmq eval --model M --ppl FILE|NAME [--protocol llamacpp|gptq] [--ctx N] [--chunks N] [--threads N]
 *             [--base MODEL | --kld-base MODEL | --save-logits FILE | --kld FILE] [--emulate MODE] [--json FILE]
 *   llmq eval --model M --tasks LIST [--protocol lm-eval|llamacpp] [--limit N] [--seed S] [--json-items]
 *             (zero-shot accuracy: calib/eval/tasks.h, printed by cli/cmd_eval_tasks.c; with --ppl in the same run
 *             the tasks follow the perplexity and share its --json)
 *
 * --ppl takes a file, or a dataset name resolved by datasets/datasets.h (wikitext-2 = wikitext-2-test,
 * wikitext-2-valid, ...: the same names as --calib).
 * Modes: plain perplexity (optionally --save-logits: the base logits for a later --kld run);
 * --base MODEL runs the base next to the model on the same tokens (as --kld-base does) and reports
 * both perplexities and their difference, absolute and in % (paired over the same tokens);
 * --kld-base MODEL runs the base and the model chunk by chunk in this process; --kld FILE compares
 * with a saved logits file (its chunks, protocol and context are used; --ppl is then optional and
 * only checked against the file's text hash). --emulate llamacpp-cpu rounds activations as llama.cpp's
 * CPU backend does (calib/model/actq.h), to predict llama-perplexity's figure on a quantized GGUF file.
 * stdout: the figures (llama-perplexity's wording); stderr: logs and one progress line with ETA
 * (rewritten in place on a terminal, a line every ~5% otherwise); --json FILE: every figure plus
 * what produced it (model, text sha256, protocol, tokens, llmq version), written atomically.
 */
#include "calib/eval/eval.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/eval_tasks.h"
#include "common/eta.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/spill.h"
#include "datasets/datasets.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ---- progress --------------------------------------------------------------------------------------

struct progress {
    bool tty;
    int64_t every; // non-TTY: a line every this many chunks
    bool printed;
    double last_s; // TTY: elapsed time of the last update (at most 5 per second)
};

static void on_progress(void *user, const struct llmq_eval_progress *p) {
    struct progress *pr = user;
    bool last = p->chunk == p->n_chunks;
    if (llmq_log_get_level() > LLMQ_LOG_INFO) return; // --quiet
    if (!last && (pr->tty ? pr->printed && p->elapsed_s - pr->last_s < 0.2 : p->chunk % pr->every != 0)) return;
    pr->last_s = p->elapsed_s;
    char el[32], eta[32], kld[48] = "";
    llmq_eta_format(p->elapsed_s, el, sizeof(el));
    // chunks cost the same: the work model is the chunk count (common/eta.h)
    struct llmq_eta w = {.total = (double)p->n_chunks, .done = (double)p->chunk, .t0 = 0};
    llmq_eta_format(llmq_eta_remaining(&w, p->elapsed_s), eta, sizeof(eta));
    if (p->kld_mean > 0) snprintf(kld, sizeof(kld), "  KLD %.6f", p->kld_mean);
    fprintf(stderr, "%seval: chunk %lld/%lld  PPL %.4f%s  %.2f s/chunk  elapsed %s  ETA %s%s", pr->tty ? "\r" : "",
            (long long)p->chunk, (long long)p->n_chunks, p->ppl, kld, p->elapsed_s / (double)p->chunk, el, eta,
            pr->tty ? "\033[K" : "\n");
    if (pr->tty && last) fputc('\n', stderr);
    fflush(stderr);
    pr->printed = true;
}

// ---- output ----------------------------------------------------------------------------------------

static const char *quantile_label(int i) {
    static const char *labels[LLMQ_EVAL_N_QUANTILES] = {"Minimum", " 0.1%  ", " 1.0%  ", " 5.0%  ", "10.0%  ",
                                                        "25.0%  ", "Median ", "75.0%  ", "90.0%  ", "95.0%  ",
                                                        "99.0%  ", "99.9%  ", "Maximum"};
    return labels[i];
}

static void print_report(const struct llmq_eval_report *rep) {
    const struct llmq_eval_result *r = &rep->res;
    printf("tokens:    %lld evaluated (%lld chunks of %lld), %lld scored\n", (long long)rep->tokens_evaluated,
           (long long)rep->plan.n_chunks, (long long)rep->plan.n_ctx, (long long)r->count);
    printf("speed:     %.1f tokens/s (%.2f s)\n", rep->tokens_per_s, rep->seconds);
    if (!r->kld) {
        printf("\nFinal estimate: PPL = %.4f +/- %.5f  [protocol %s, ctx %lld]\n", r->ppl, r->ppl_unc,
               llmq_eval_protocol_name(rep->plan.protocol), (long long)rep->plan.n_ctx);
        return;
    }
    printf("\n====== Perplexity statistics ======  [protocol %s, ctx %lld]\n",
           llmq_eval_protocol_name(rep->plan.protocol), (long long)rep->plan.n_ctx);
    printf("Mean PPL(Q)                   : %10.6f ± %10.6f\n", r->ppl, r->ppl_unc);
    printf("Mean PPL(base)                : %10.6f ± %10.6f\n", r->ppl_base, r->ppl_base_unc);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100.0 * r->log_ppl_cor);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f\n", r->log_ppl_ratio, r->log_ppl_ratio_unc);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n", r->ppl_ratio, r->ppl_ratio_unc);
    printf("Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f\n", r->ppl_diff, r->ppl_diff_unc);
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6f ± %10.6f\n", r->kld_mean, r->kld_unc);
    for (int i = LLMQ_EVAL_N_QUANTILES - 1; i >= 0; i--) printf("%s KLD: %10.6f\n", quantile_label(i), r->kld_q[i]);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    Δp: %6.3f ± %5.3f %%\n", 100.0 * r->p_diff_mean, 100.0 * r->p_diff_unc);
    for (int i = LLMQ_EVAL_N_QUANTILES - 1; i >= 0; i--)
        printf("%s Δp: %6.3f%%\n", quantile_label(i), 100.0 * r->p_diff_q[i]);
    printf("RMS Δp    : %6.3f ± %5.3f %%\n", 100.0 * r->p_diff_rms, 100.0 * r->p_diff_rms_unc);
    printf("Same top p: %6.3f ± %5.3f %%\n", 100.0 * r->same_top, 100.0 * r->same_top_unc);
}

// --base: the model's figure as in plain mode, then the base's, the model's and the difference
// (llama-perplexity --kl-divergence's paired statistics: ppl_diff and ppl_ratio with their uncertainty).
static void print_base_report(const struct llmq_eval_report *rep, const char *base_path, const char *model_path) {
    const struct llmq_eval_result *r = &rep->res;
    printf("tokens:    %lld evaluated per model (%lld chunks of %lld), %lld scored\n", (long long)rep->tokens_evaluated,
           (long long)rep->plan.n_chunks, (long long)rep->plan.n_ctx, (long long)r->count);
    printf("speed:     %.1f tokens/s, both models (%.2f s)\n", rep->tokens_per_s, rep->seconds);
    printf("\nFinal estimate: PPL = %.4f +/- %.5f  [protocol %s, ctx %lld]\n", r->ppl, r->ppl_unc,
           llmq_eval_protocol_name(rep->plan.protocol), (long long)rep->plan.n_ctx);
    printf("KLD vs base: mean %.6f +/- %.6f, same top-1 token %.3f%%\n", r->kld_mean, r->kld_unc, 100.0 * r->same_top);
    printf("\nbase:        PPL = %.4f +/- %.5f  (%s)\n", r->ppl_base, r->ppl_base_unc, base_path);
    printf("quantized:   PPL = %.4f +/- %.5f  (%s)\n", r->ppl, r->ppl_unc, model_path);
    printf("difference:  PPL %+.4f +/- %.5f  (%+.3f%% +/- %.3f%%)\n", r->ppl_diff, r->ppl_diff_unc,
           100.0 * (r->ppl_ratio - 1.0), 100.0 * r->ppl_ratio_unc);
}

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

// --base's keys (top level, next to "ppl"; the "kld" object has the full paired statistics).
static void base_json(json_t *j, const struct llmq_eval_result *r) {
    json_object_set_new(j, "base_ppl", jnum(r->ppl_base));
    json_object_set_new(j, "base_ppl_uncertainty", jnum(r->ppl_base_unc));
    json_object_set_new(j, "ppl_diff", jnum(r->ppl_diff));
    json_object_set_new(j, "ppl_diff_uncertainty", jnum(r->ppl_diff_unc));
    json_object_set_new(j, "ppl_diff_percent", jnum(100.0 * (r->ppl_ratio - 1.0)));
    json_object_set_new(j, "ppl_diff_percent_uncertainty", jnum(100.0 * r->ppl_ratio_unc));
}

static json_t *quantiles_json(const double *q) {
    json_t *o = json_object();
    for (int i = 0; i < LLMQ_EVAL_N_QUANTILES; i++) {
        char key[16];
        double f = llmq_eval_quantiles[i];
        if (f == 0)
            snprintf(key, sizeof(key), "min");
        else if (f == 1)
            snprintf(key, sizeof(key), "max");
        else
            snprintf(key, sizeof(key), "p%g", 100 * f);
        json_object_set_new(o, key, jnum(q[i]));
    }
    return o;
}

static json_t *report_json(const struct llmq_eval_report *rep) {
    const struct llmq_eval_result *r = &rep->res;
    const struct llmq_eval_plan *p = &rep->plan;
    json_t *j = json_object();
    json_object_set_new(j, "protocol", json_string(llmq_eval_protocol_name(p->protocol)));
    json_object_set_new(j, "ctx", json_integer(p->n_ctx));
    json_object_set_new(j, "first_scored_position", json_integer(p->first));
    json_object_set_new(j, "bos_per_chunk", p->bos >= 0 ? json_integer(p->bos) : json_null());
    json_object_set_new(j, "chunks", json_integer(p->n_chunks));
    json_object_set_new(j, "chunks_available", json_integer(p->n_chunks_max));
    json_object_set_new(j, "text_tokens", json_integer(p->n_tokens));
    json_object_set_new(j, "tokens_evaluated", json_integer(rep->tokens_evaluated));
    json_object_set_new(j, "tokens_scored", json_integer(r->count));
    json_object_set_new(j, "seconds", jnum(rep->seconds));
    json_object_set_new(j, "tokens_per_s", jnum(rep->tokens_per_s));
    json_object_set_new(j, "ppl", jnum(r->ppl));
    json_object_set_new(j, "ppl_uncertainty", jnum(r->ppl_unc));
    json_object_set_new(j, "nll_mean", jnum(r->nll_mean));
    json_object_set_new(j, "nll_stderr", jnum(r->nll_stderr));
    if (!r->kld) return j;
    json_t *k = json_object();
    json_object_set_new(k, "ppl_base", jnum(r->ppl_base));
    json_object_set_new(k, "ppl_base_uncertainty", jnum(r->ppl_base_unc));
    json_object_set_new(k, "ln_ppl_correlation", jnum(r->log_ppl_cor));
    json_object_set_new(k, "ln_ppl_ratio", jnum(r->log_ppl_ratio));
    json_object_set_new(k, "ln_ppl_ratio_uncertainty", jnum(r->log_ppl_ratio_unc));
    json_object_set_new(k, "ppl_ratio", jnum(r->ppl_ratio));
    json_object_set_new(k, "ppl_ratio_uncertainty", jnum(r->ppl_ratio_unc));
    json_object_set_new(k, "ppl_diff", jnum(r->ppl_diff));
    json_object_set_new(k, "ppl_diff_uncertainty", jnum(r->ppl_diff_unc));
    json_object_set_new(k, "kld_mean", jnum(r->kld_mean));
    json_object_set_new(k, "kld_uncertainty", jnum(r->kld_unc));
    json_object_set_new(k, "kld_quantiles", quantiles_json(r->kld_q));
    json_object_set_new(k, "delta_p_mean", jnum(r->p_diff_mean));
    json_object_set_new(k, "delta_p_uncertainty", jnum(r->p_diff_unc));
    json_object_set_new(k, "delta_p_rms", jnum(r->p_diff_rms));
    json_object_set_new(k, "delta_p_rms_uncertainty", jnum(r->p_diff_rms_unc));
    json_object_set_new(k, "delta_p_max_abs", jnum(r->p_diff_max_abs));
    json_object_set_new(k, "delta_p_quantiles", quantiles_json(r->p_diff_q));
    json_object_set_new(k, "same_top_p", jnum(r->same_top));
    json_object_set_new(k, "same_top_p_uncertainty", jnum(r->same_top_unc));
    json_object_set_new(j, "kld", k);
    return j;
}

// ---- the command ------------------------------------------------------------------------------------

// Eval's flags as parsed (NULL / 0 / -1: not given).
struct eargs {
    const char *model_path, *text_arg, *protocol_name, *kld_base, *save_logits, *kld_file, *json_path, *base_path,
        *logits_dtype, *rows, *device, *emulate_name, *gates_dummy, *tasks, *max_vram;
    long ctx, chunks, threads, limit, seed, lc_parallel; // ctx LONG_MIN: not given
    bool force, json_items, no_prefix_reuse;
};

// --protocol names the protocol of each mode where it is one of its names (tasks: lm-eval, llamacpp;
// perplexity: llamacpp, gptq); the other mode keeps its default (perplexity llamacpp, tasks lm-eval).
static const char *check_task_flags(const struct eargs *a, enum llmq_eval_protocol *protocol) {
    enum llmq_task_protocol tp;
    const char *name = a->protocol_name ? a->protocol_name : "llamacpp";
    bool for_ppl = llmq_eval_protocol_from_name(name, protocol), for_tasks = llmq_task_protocol_from_name(name, &tp);
    if (!for_ppl && !for_tasks) return "--protocol must be llamacpp or gptq (perplexity), lm-eval or llamacpp (tasks)";
    if (!for_ppl) *protocol = LLMQ_EVAL_PROTOCOL_LLAMACPP;
    if (!(for_ppl && (a->text_arg || a->kld_file)) && !(for_tasks && a->tasks))
        return for_ppl ? "--protocol gptq applies to --ppl / --kld only" : "--protocol lm-eval applies to --tasks only";
    if (!a->tasks && (a->limit != -1 || a->seed != -1 || a->json_items || a->no_prefix_reuse))
        return "--limit, --seed, --json-items and --no-prefix-reuse need --tasks";
    if (a->limit == 0 || a->limit < -1) return "--limit must be -1 (all) or at least 1";
    if (a->seed < -1) return "--seed must be at least 0";
    if (a->lc_parallel < 1 || a->lc_parallel > 256) return "--llamacpp-parallel must be between 1 and 256";
    if (a->json_items && !a->json_path) return "--json-items needs --json FILE";
    uint64_t vram = 0;
    if (a->max_vram && (!llmq_parse_bytes(a->max_vram, &vram) || vram == 0))
        return "--max-vram must be a size such as 20G, 512M or 1073741824";
    if (a->tasks && !eval_tasks_list_ok(a->tasks)) return "--tasks: not a task list (the line above says why)";
    return NULL;
}

// The task protocol --protocol names (lm-eval when it names a perplexity-only protocol or none).
static enum llmq_task_protocol task_protocol(const struct eargs *a) {
    enum llmq_task_protocol tp = LLMQ_TASK_PROTOCOL_LMEVAL;
    if (a->protocol_name) llmq_task_protocol_from_name(a->protocol_name, &tp);
    return tp;
}

// --max-vram in bytes (0: not given; check_task_flags refused a bad one).
static uint64_t max_vram_bytes(const struct eargs *a) {
    uint64_t v = 0;
    return a->max_vram && llmq_parse_bytes(a->max_vram, &v) ? v : 0;
}

// The flag combinations that are wrong whatever the files: NULL, or the usage message.
static const char *check_flags(const struct eargs *a, enum llmq_eval_protocol *protocol, enum llmq_emulate *emulate,
                               enum llmq_dtype dtype) {
    if (!a->model_path) return "--model is required";
    if (!a->text_arg && !a->kld_file && !a->tasks) return "--ppl FILE is required (or --kld FILE, or --tasks LIST)";
    const char *usage = check_task_flags(a, protocol);
    if (usage) return usage;
    if (a->ctx != LONG_MIN && (a->ctx < 2 || a->ctx > (1L << 20))) return "--ctx must be between 2 and 1048576";
    if (a->chunks == 0 || a->chunks < -1) return "--chunks must be -1 (all) or at least 1";
    if (a->threads < 1 || a->threads > 256) return "--threads must be between 1 and 256";
    if ((a->base_path != NULL) + (a->kld_base != NULL) + (a->save_logits != NULL) + (a->kld_file != NULL) > 1)
        return "--base, --kld-base, --save-logits and --kld exclude each other";
    if (a->base_path && !a->text_arg) return "--base needs --ppl FILE";
    if (dtype != LLMQ_DTYPE_F16 && dtype != LLMQ_DTYPE_F32) return "--logits-dtype must be f16 or f32";
    if (strcmp(a->rows, "auto") && strcmp(a->rows, "on") && strcmp(a->rows, "off"))
        return "--rows must be auto, on or off";
    if (!llmq_emulate_from_name(a->emulate_name, emulate))
        return "--emulate must be none, llamacpp-cpu or llamacpp-cpu-nofa";
    return NULL;
}

// check_flags and the gates' needs: 0, or 2 after the usage message.
static int usage_errors(const struct eargs *a, const struct cli_gates *gs, enum llmq_eval_protocol *protocol,
                        enum llmq_emulate *emulate, enum llmq_dtype dtype) {
    const char *usage = check_flags(a, protocol, emulate, dtype);
    unsigned have = a->base_path || a->kld_base || a->kld_file ? LLMQ_GATE_NEEDS_BASE | LLMQ_GATE_NEEDS_KLD : 0;
    const char *how = "a base: --base MODEL, --kld-base MODEL or --kld FILE";
    if (usage) {
        fprintf(stderr, "llmq eval: %s\nrun 'llmq eval --help' for the flags and their defaults\n", usage);
        return 2;
    }
    for (int i = 0; i < gs->n; i++) {
        const struct llmq_gate *g = &gs->g[i];
        if (g->metric == LLMQ_GATE_TASK_ACC_DROP || g->metric == LLMQ_GATE_TASK_ACC_NORM_DROP) {
            fprintf(stderr,
                    "llmq eval: --fail-if '%s' needs the base's accuracy on %s, which llmq eval does not measure "
                    "(it scores the model alone): use llmq compare --base BASE MODEL --tasks %s\n",
                    g->expr, g->task, g->task);
            return 2;
        }
        if (g->metric < LLMQ_GATE_N_CORE && !a->text_arg && !a->kld_file) {
            fprintf(stderr, "llmq eval: --fail-if '%s' needs a perplexity run: --ppl FILE or --kld FILE\n", g->expr);
            return 2;
        }
    }
    return cli_gates_check("eval", gs, have, a->tasks, how, how);
}

// What one evaluation produced, for the printout and the JSON.
struct outcome {
    const struct llmq_model *m, *base;
    struct llmq_logits_file *lf;
    const struct llmq_eval_text *text;
    const struct llmq_eval_report *rep;
    enum llmq_emulate emulate;
    enum llmq_dtype dtype;
    bool join;
    const char *device;
    char hex[65]; // sha256 of the text
};

// The results on stdout.
static void print_results(const struct eargs *a, const struct outcome *o) {
    printf("model:     %s\n", o->m->path);
    if (o->base) printf("base:      %s\n", o->base->path);
    if (o->lf) printf("base:      logits file %s\n", a->kld_file);
    if (o->emulate) printf("emulate:   %s\n", llmq_emulate_name(o->emulate));
    if (a->text_arg)
        printf("text:      %s (%zu bytes%s, sha256 %s)\n", o->text->path, o->text->len, o->join ? ", rows joined" : "",
               o->hex);
    else
        printf("text:      sha256 %s (from the logits file)\n", o->hex);
    printf("protocol:  %s (ctx %lld, scored positions [%lld, %lld), BOS per chunk: %s)\n",
           llmq_eval_protocol_name(o->rep->plan.protocol), (long long)o->rep->plan.n_ctx, (long long)o->rep->plan.first,
           (long long)o->rep->plan.n_ctx - 1,
           o->rep->plan.bos >= 0 ? "yes"
           : o->lf               ? "as stored"
                                 : "no");
    if (a->base_path)
        print_base_report(o->rep, o->base->path, o->m->path);
    else
        print_report(o->rep);
    if (a->save_logits) printf("logits:    %s (%s)\n", a->save_logits, llmq_dtype_name(o->dtype));
    fflush(stdout);
}

// --json: every figure.
static enum llmq_status write_json(const struct eargs *a, const struct outcome *o, const struct cli_gates *gs,
                                   json_t *tasks) {
    json_t *js = report_json(o->rep);
    if (tasks) json_object_update(js, tasks);
    if (gs->n) cli_gates_json(gs, js);
    json_object_set_new(js, "llmq_version", json_string(LLMQ_VERSION));
    json_object_set_new(js, "model", json_string(o->m->path));
    json_object_set_new(js, "emulate", json_string(llmq_emulate_name(o->emulate)));
    if (o->base) json_object_set_new(js, "base_model", json_string(o->base->path));
    if (a->base_path) base_json(js, &o->rep->res);
    if (o->text->dataset) json_object_set_new(js, "dataset", json_string(o->text->dataset));
    if (o->lf) json_object_set_new(js, "kld_logits_file", json_string(a->kld_file));
    if (a->save_logits) json_object_set_new(js, "saved_logits", json_string(a->save_logits));
    json_object_set_new(js, "text", a->text_arg ? json_string(o->text->path) : json_null());
    json_object_set_new(js, "text_bytes", a->text_arg ? json_integer((json_int_t)o->text->len) : json_null());
    json_object_set_new(js, "text_sha256", json_string(o->hex));
    json_object_set_new(js, "rows_joined", json_boolean(o->join));
    json_object_set_new(js, "threads", json_integer(a->threads));
    json_object_set_new(js, "device", json_string(o->device));
    enum llmq_status st =
        llmq_write_json(a->json_path, js, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(js);
    return st;
}

// --tasks: the zero-shot tasks on m (cli/eval_tasks.h); with tj, *tj becomes a new object with their JSON keys.
// gv's task rows point into tv (LLMQ_TASK_COUNT).
static enum llmq_status run_tasks(const struct eargs *a, const struct llmq_model *m, enum llmq_backend backend,
                                  enum llmq_emulate emulate, json_t **tj, struct llmq_gate_values *gv,
                                  struct llmq_gate_task_values *tv) {
    if (tj && !(*tj = json_object())) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    struct eval_tasks_args ta = {.list = a->tasks,
                                 .protocol = task_protocol(a),
                                 .limit = a->limit,
                                 .seed = a->seed,
                                 .json_items = a->json_items,
                                 .no_prefix_reuse = a->no_prefix_reuse,
                                 .lc_parallel = (int)a->lc_parallel,
                                 .n_threads = (int)a->threads,
                                 .backend = backend,
                                 .emulate = emulate};
    printf("model:     %s\n", m->path);
    if (emulate) printf("emulate:   %s\n", llmq_emulate_name(emulate));
    gv->tasks = tv;
    return eval_tasks_run(m, &ta, tj ? *tj : NULL, tv, &gv->n_tasks);
}

// --tasks without --ppl / --kld: loads the model, runs the tasks, checks the task gates, writes their --json
// with what produced them. Returns the exit code.
static int tasks_only(const struct eargs *a, enum llmq_backend backend, enum llmq_emulate emulate, const char *device,
                      struct cli_gates *gs) {
    struct llmq_model *m = NULL;
    json_t *js = NULL;
    struct llmq_gate_values gv;
    struct llmq_gate_task_values tv[LLMQ_TASK_COUNT];
    llmq_gate_values_init(&gv);
    enum llmq_status st = llmq_model_load(a->model_path, &m);
    if (!st) st = run_tasks(a, m, backend, emulate, a->json_path ? &js : NULL, &gv, tv);
    if (!st) cli_gates_eval("eval", gs, m->path, &gv);
    if (!st && js) {
        if (gs->n) cli_gates_json(gs, js);
        json_object_set_new(js, "llmq_version", json_string(LLMQ_VERSION));
        json_object_set_new(js, "model", json_string(m->path));
        json_object_set_new(js, "emulate", json_string(llmq_emulate_name(emulate)));
        json_object_set_new(js, "threads", json_integer(a->threads));
        json_object_set_new(js, "device", json_string(device));
        st = llmq_write_json(a->json_path, js, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    }
    json_decref(js);
    llmq_model_free(m);
    return st ? 1 : gs->violated ? 3 : 0;
}

// --kld FILE: the logits file, whose protocol rules; a --ctx that differs from its context is a usage error
// (*usage_late), found once the file is open.
static enum llmq_status open_logits(const struct eargs *a, struct llmq_logits_file **lf,
                                    enum llmq_eval_protocol *protocol, bool *usage_late) {
    enum llmq_status st = llmq_logits_open(a->kld_file, lf);
    if (st) return st;
    *protocol = llmq_logits_header(*lf)->protocol;
    if (a->ctx > 0 && a->ctx != llmq_logits_header(*lf)->n_ctx) {
        fprintf(stderr, "llmq eval: --ctx %ld differs from the context %lld of %s\n", a->ctx,
                (long long)llmq_logits_header(*lf)->n_ctx, a->kld_file);
        *usage_late = true;
        return LLMQ_ERR_ARG;
    }
    return LLMQ_OK;
}

// The output guard (common/io.h): the inputs named, --json and --save-logits checked before any work.
static int guard(const struct eargs *a) {
    const char *inputs[5] = {a->model_path, a->text_arg, a->base_path, a->kld_base, a->kld_file},
               *outputs[2] = {a->json_path, a->save_logits};
    return cli_guard(inputs, 5, outputs, 2, a->force);
}

static void warn_ctx(const struct llmq_model *m, int64_t n_ctx) {
    if (m->hp.n_ctx_train > 0 && n_ctx > m->hp.n_ctx_train)
        llmq_warn("eval: --ctx %lld is past the training context of %s (%lld tokens): the perplexity measures "
                  "the model outside the positions it was trained on",
                  (long long)n_ctx, m->path, (long long)m->hp.n_ctx_train);
}

// The chunk count to expect (for the progress line's pace) and the info line of the plan.
static void log_plan(const struct eargs *a, const struct llmq_model *m, const struct llmq_model *base,
                     struct llmq_logits_file *lf, int64_t n_ids, enum llmq_eval_protocol protocol,
                     enum llmq_emulate emulate, struct progress *pr) {
    int64_t n_chunks = lf ? llmq_logits_header(lf)->n_chunks
                          : n_ids / (a->ctx > 0 ? a->ctx : llmq_eval_protocol_default_ctx(protocol));
    if (a->chunks > 0 && a->chunks < n_chunks) n_chunks = a->chunks;
    pr->every = n_chunks / 20 > 1 ? n_chunks / 20 : 1;
    llmq_info("eval: %s, protocol %s, %lld chunks, threads %ld%s%s%s%s", m->path, llmq_eval_protocol_name(protocol),
              (long long)n_chunks, a->threads, base ? ", base " : "", base ? base->path : "",
              emulate ? ", emulating " : "", emulate ? llmq_emulate_name(emulate) : "");
}

// Eval's flag table, help text and parsing into *a: cli_parse's status (0: go on, 1: --help printed, 2: usage).
static int parse_flags(int argc, char **argv, struct eargs *a) {
    const struct cli_flag flags[] = {
        {"model", CLI_STR, &a->model_path, NULL, "the model: GGUF file or Hugging Face directory (required)"},
        {"ppl", CLI_STR, &a->text_arg, NULL,
         "text file (.txt, .raw, .gz), or a dataset name: wikitext-2 (= wikitext-2-test), wikitext-2-valid, ... "
         "(datasets/manifest.tsv; shipped with llmq, sha256-checked)"},
        {"protocol", CLI_STR, &a->protocol_name, "llamacpp for --ppl, lm-eval for --tasks",
         "perplexity: llamacpp (n_ctx chunks, BOS per chunk, second half scored) or gptq (the papers' windows, all "
         "scored); --tasks: lm-eval (lm-evaluation-harness's prompts and log-likelihoods) or llamacpp "
         "(llama-perplexity --hellaswag / --winogrande / --multiple-choice scoring)"},
        {"ctx", CLI_INT, &a->ctx, "512 for llamacpp, 2048 for gptq",
         "tokens per chunk (phi3 LongRoPE: the long factors when it exceeds the original context)"},
        {"chunks", CLI_INT, &a->chunks, "-1 (all)", "evaluate only the first N chunks"},
        {"threads", CLI_INT, &a->threads, "the number of CPUs", "threads for the forward pass and the scoring"},
        {"device", CLI_STR, &a->device, "auto", CLI_DEVICE_HELP},
        {"max-vram", CLI_STR, &a->max_vram, "half of the device's free memory",
         "--device cuda, --ppl / --kld: device memory for the decoder blocks' batches of chunks (e.g. 20G); fewer "
         "chunks per batch when they would pass it, the forward pass on the host when one chunk does"},
        {"base", CLI_STR, &a->base_path, NULL,
         "also evaluate this base model on the same tokens and print both PPLs and the difference (absolute, %)"},
        {"kld-base", CLI_STR, &a->kld_base, NULL, "KL divergence mode: run this base model next to --model"},
        {"save-logits", CLI_STR, &a->save_logits, NULL, "write the scored positions' logits here (for a later --kld)"},
        {"logits-dtype", CLI_STR, &a->logits_dtype, "f16", "element type of --save-logits: f16 or f32"},
        {"kld", CLI_STR, &a->kld_file, NULL, "KL divergence mode against a --save-logits file (chunks come from it)"},
        {"rows", CLI_STR, &a->rows, "auto",
         "on: each line of the text is a dataset row, rows joined with \"\\n\\n\" (as the papers load "
         "wikitext-2-raw-v1); off: the file as is; auto: on for gptq, off for llamacpp"},
        {"emulate", CLI_STR, &a->emulate_name, "none",
         "none: f32 arithmetic; llamacpp-cpu: round activations as llama.cpp's CPU backend does (8-bit "
         "Q8_0/Q8_1/Q8_K or f16 inputs per weight type, f16 KV cache, flash attention as llama-perplexity's "
         "default); llamacpp-cpu-nofa: the same with flash attention off (also Q and softmax in f16)"},
        {"json", CLI_STR, &a->json_path, NULL, "also write every figure as JSON to this file"},
        {"fail-if", CLI_STR, &a->gates_dummy, "none", CLI_GATES_HELP ". Base metrics need --base, --kld-base or --kld"},
        {"force", CLI_BOOL, &a->force, "off", "replace existing --json / --save-logits files (never an input)"},
        EVAL_TASK_FLAGS(a),
    };
    const struct cli_cmd cmd = {
        "eval",
        "--model M --ppl FILE [flags]  |  --model M --tasks LIST [flags]",
        "Perplexity of a model on a text, or its KL divergence from a base model (like llama-perplexity); zero-shot "
        "accuracy on hellaswag, arc-easy, arc-challenge, piqa, winogrande, lambada (--tasks).",
        "Protocols (they are not comparable; the output always names it):\n"
        "  llamacpp  llama.cpp's llama-perplexity: the text tokenized once, chunks of --ctx tokens, the\n"
        "            first token of each chunk replaced by BOS when the model adds BOS, positions\n"
        "            [ctx/2, ctx) scored.\n"
        "  gptq      GPTQ/AWQ papers: rows joined with \"\\n\\n\", tokenized once, windows of --ctx tokens,\n"
        "            tail dropped, every next token scored.\n" EVAL_TASKS_HELP
        "KLD modes print mean KLD, Δp and same-top-1 % like llama-perplexity --kl-divergence.\n"
        "With --base both models run chunk by chunk on the same tokens (as with --kld-base); the output ends\n"
        "with the base's PPL, the model's and the difference, absolute and in % (paired uncertainties).\n"
        "Progress with ETA goes to stderr; results to stdout. Exit status: 0 ok, 1 error, 2 usage, 3 a --fail-if\n"
        "gate violated (one stderr line names the gate, the model and the measured value).",
        flags,
        (int)(sizeof(flags) / sizeof(flags[0])),
        0,
        0};
    const char *pos[1];
    int n_pos;
    return cli_parse(&cmd, argc, argv, pos, &n_pos);
}

int cmd_eval(int argc, char **argv) {
    struct eargs a = {.limit = -1,
                      .seed = -1,
                      .lc_parallel = LLMQ_TASKS_LC_PARALLEL,
                      .logits_dtype = "f16",
                      .rows = "auto",
                      .device = "auto",
                      .emulate_name = "none",
                      .chunks = -1,
                      .ctx = LONG_MIN,
                      .threads = sysconf(_SC_NPROCESSORS_ONLN)};
    if (a.threads < 1) a.threads = 1;
    struct cli_gates gs;
    int rc = cli_gates_take("eval", &argc, argv, &gs);
    if (rc) return rc;
    rc = parse_flags(argc, argv, &a);
    if (rc) {
        cli_gates_free(&gs);
        return rc == 1 ? 0 : rc;
    }

    enum llmq_eval_protocol protocol;
    enum llmq_emulate emulate = LLMQ_EMULATE_NONE;
    enum llmq_dtype dtype = llmq_dtype_from_name(a.logits_dtype);
    if (usage_errors(&a, &gs, &protocol, &emulate, dtype)) return 2;

    if (a.ctx == LONG_MIN) a.ctx = 0; // the protocol's default
    if (guard(&a)) return 1;
    enum llmq_backend backend;
    char device_desc[320];
    if ((rc = cli_device(a.device, &backend, device_desc, sizeof(device_desc)))) return rc;

    struct llmq_model *m = NULL, *base = NULL;
    struct llmq_logits_file *lf = NULL;
    struct llmq_eval_text text = {0};
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    enum llmq_status st = LLMQ_OK;
    struct llmq_eval_report rep;
    struct progress pr = {.tty = isatty(STDERR_FILENO) != 0};
    bool usage_late = false;
    json_t *tj = NULL; // the tasks' JSON keys when --tasks and --ppl / --kld are given together

    if (!a.text_arg && !a.kld_file) { // --tasks alone
        rc = tasks_only(&a, backend, emulate, device_desc, &gs);
        cli_gates_free(&gs);
        return rc;
    }
    if (a.kld_file && (st = open_logits(&a, &lf, &protocol, &usage_late))) goto done;
    bool join = strcmp(a.rows, "on") == 0 || (strcmp(a.rows, "auto") == 0 && protocol == LLMQ_EVAL_PROTOCOL_GPTQ);
    if (a.text_arg && (st = llmq_eval_text_load(a.text_arg, protocol, join, &text))) goto done;
    if (lf && a.text_arg && memcmp(text.sha, llmq_logits_header(lf)->text_sha256, 32) != 0) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: the text (sha256 of %s%s) is not the one %s was computed on", text.path,
                         text.path, join ? " with rows joined" : "", a.kld_file);
        goto done;
    }
    if ((st = llmq_model_load(a.model_path, &m))) goto done;
    warn_ctx(m, lf ? llmq_logits_header(lf)->n_ctx : a.ctx > 0 ? a.ctx : llmq_eval_protocol_default_ctx(protocol));
    if (a.base_path) a.kld_base = a.base_path; // the same run; only the report differs
    if (a.kld_base && (st = llmq_model_load(a.kld_base, &base))) goto done;
    if (!lf && (st = llmq_eval_text_tokenize(base ? base : m, &text, &ids, &n_ids))) goto done;

    struct llmq_eval_opts o = {
        .protocol = protocol,
        .n_ctx = a.ctx,
        .max_chunks = a.chunks,
        .n_threads = (int)a.threads,
        .backend = backend,
        .max_vram = max_vram_bytes(&a),
        .emulate = emulate,
        .save_logits = a.save_logits,
        .logits_dtype = dtype,
        .text_sha256 = a.text_arg ? text.sha : NULL,
        .progress = on_progress,
        .progress_user = &pr,
    };
    log_plan(&a, m, base, lf, n_ids, protocol, emulate, &pr);
    if (lf)
        st = llmq_eval_kld_file(lf, m, &o, &rep);
    else if (base)
        st = llmq_eval_kld_models(base, m, ids, n_ids, &o, &rep);
    else
        st = llmq_eval_ppl(m, ids, n_ids, &o, &rep);
    if (st) {
        if (pr.tty && pr.printed) fputc('\n', stderr);
        goto done;
    }

    struct outcome out = {.m = m,
                          .base = base,
                          .lf = lf,
                          .text = &text,
                          .rep = &rep,
                          .emulate = emulate,
                          .dtype = dtype,
                          .join = join,
                          .device = device_desc};
    llmq_sha256_hex(lf ? llmq_logits_header(lf)->text_sha256 : text.sha, out.hex);
    print_results(&a, &out);
    struct llmq_gate_values gv;
    struct llmq_gate_task_values tv[LLMQ_TASK_COUNT];
    cli_gate_values_from_eval(&rep.res, &gv);
    if (a.tasks && (st = run_tasks(&a, m, backend, emulate, a.json_path ? &tj : NULL, &gv, tv))) goto done;
    cli_gates_eval("eval", &gs, m->path, &gv);
    if (a.json_path && (st = write_json(&a, &out, &gs, tj))) goto done;
done:
    json_decref(tj);
    free(ids);
    llmq_eval_text_free(&text);
    llmq_logits_close(lf);
    llmq_model_free(base);
    llmq_model_free(m);
    cli_gates_free(&gs);
    return usage_late ? 2 : st ? 1 : gs.violated ? 3 : 0;
}
