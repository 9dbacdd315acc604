/*
 * calib/eval/eval_run.c — the chunk loop of calib/eval/eval.h: runs the model (and the base model, or reads
 * the base logits file) one chunk at a time and feeds the scores to the statistics.
 *
 * A chunk goes through calib/model/forward.h's block API: embed the n_ctx tokens, run every decoder block
 * on the one sequence, then the output head on the scored positions only, SLICE_ROWS rows at a
 * time. So the logits held in memory never exceed (SLICE_ROWS, V) per model, whatever n_ctx is (the
 * gptq protocol's 2047 rows × V would be 400 MB for V = 49152), and positions before `first` never
 * go through the head (half of the head's work for the llamacpp protocol).
 */
#include "calib/eval/eval.h"

#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SLICE_ROWS = 512 };

bool llmq_eval_same_vocab(const struct llmq_model *a, const struct llmq_model *b) {
    if (a->hp.n_vocab != b->hp.n_vocab) return false;
    if (!a->tok || !b->tok) return a->tok == b->tok;
    int32_t n = llmq_tokenizer_n_vocab(a->tok);
    if (n != llmq_tokenizer_n_vocab(b->tok) || llmq_tokenizer_bos(a->tok) != llmq_tokenizer_bos(b->tok) ||
        llmq_tokenizer_add_bos(a->tok) != llmq_tokenizer_add_bos(b->tok))
        return false;
    for (int32_t i = 0; i < n; i++) {
        size_t la, lb;
        const char *ta = llmq_tokenizer_token_text(a->tok, i, &la), *tb = llmq_tokenizer_token_text(b->tok, i, &lb);
        if (!ta || !tb || la != lb || memcmp(ta, tb, la) != 0 ||
            llmq_tokenizer_token_type(a->tok, i) != llmq_tokenizer_token_type(b->tok, i))
            return false;
    }
    return true;
}

// One model's activations for a chunk: x (n_ctx, D) after the last block.
// The hidden state after block `layer` (-1: the embedding) is finite, else an error naming the layer: the
// first block whose output holds a NaN or Inf is where the model breaks (a scan of n_ctx x D floats per
// block, small next to the block's own n_ctx x D x D work).
static enum llmq_status check_finite(const struct llmq_model *m, int layer, const float *x, int64_t n_ctx) {
    int64_t D = m->hp.n_embd;
    for (int64_t i = 0; i < n_ctx * D; i++)
        if (!isfinite(x[i])) {
            char where[32] = "token_embd";
            if (layer >= 0) snprintf(where, sizeof where, "blk.%d", layer);
            return llmq_errorf(LLMQ_ERR_NUMERIC,
                               "eval: %s: the output of %s is %s at position %lld, component %lld (the first "
                               "layer to produce a non-finite value: its weights or activations overflow)",
                               m->path, where, isnan(x[i]) ? "NaN" : "Inf", (long long)(i / D), (long long)(i % D));
        }
    return LLMQ_OK;
}

static enum llmq_status run_blocks(struct llmq_forward *f, const struct llmq_model *m, const int32_t *chunk,
                                   int64_t n_ctx, float *x) {
    enum llmq_status st = llmq_forward_embed(f, chunk, n_ctx, x);
    if (!st) st = check_finite(m, -1, x, n_ctx);
    for (int l = 0; !st && l < (int)m->hp.n_layer; l++) {
        st = llmq_forward_block(f, l, &m->layers[l], x, 1, n_ctx, NULL, NULL);
        if (!st) st = check_finite(m, l, x, n_ctx);
    }
    return st;
}

// Everything the loop owns; freed by run_free.
struct run {
    struct llmq_forward *fm, *fb; // model, base model (KLD-base mode)
    float *xm, *xb;               // (n_ctx, D) activations of model and base
    float *lm, *lb;               // (SLICE_ROWS, V) logits of model and base
    int32_t *chunk;               // (n_ctx) input tokens
    struct llmq_eval_row *rows;   // (SLICE_ROWS)
    struct llmq_logits_writer *w;
    struct llmq_eval_stats stats;
};

static void run_free(struct run *r) {
    llmq_forward_free(r->fm);
    llmq_forward_free(r->fb);
    free(r->xm);
    free(r->xb);
    free(r->lm);
    free(r->lb);
    free(r->chunk);
    free(r->rows);
    llmq_logits_abort(r->w);
    llmq_eval_stats_free(&r->stats);
}

// The loop shared by the three modes. Exactly one base source at most: base (a model) or lf (a file).
// tokens: (T) the text's tokens (NULL when lf gives the chunks). save_logits only without a base.
static enum llmq_status run_eval(const struct llmq_model *m, const struct llmq_model *base, struct llmq_logits_file *lf,
                                 const int32_t *tokens, const struct llmq_eval_plan *plan,
                                 const struct llmq_eval_opts *o, struct llmq_eval_report *out) {
    struct run r = {0};
    enum llmq_status st = LLMQ_OK;
    const int64_t V = m->hp.n_vocab, D = m->hp.n_embd, n = plan->n_ctx;
    const int64_t slice = plan->n_rows < SLICE_ROWS ? plan->n_rows : SLICE_ROWS;
    const bool kld = base || lf;
    int nt = o->n_threads < 1 ? 1 : o->n_threads;

    memset(out, 0, sizeof(*out));
    out->plan = *plan;
    r.stats.kld = kld;
    if ((st = llmq_forward_init(m, n, nt, &r.fm)) || (st = llmq_forward_set_emulate(r.fm, o->emulate))) goto done;
    if (base && ((st = llmq_forward_init(base, n, nt, &r.fb)) || (st = llmq_forward_set_emulate(r.fb, o->emulate))))
        goto done;
    // LongRoPE: llama.cpp's choice of factors by the context for a GGUF or under --emulate (every chunk is the
    // context long, so transformers' rule by the sequence's length agrees)
    if ((m->from_gguf || o->emulate) && (st = llmq_forward_set_rope_ctx(r.fm, n))) goto done;
    if (r.fb && (base->from_gguf || o->emulate) && (st = llmq_forward_set_rope_ctx(r.fb, n))) goto done;
    llmq_forward_set_backend(r.fm, o->backend);
    if (r.fb) llmq_forward_set_backend(r.fb, o->backend);
    r.xm = malloc((size_t)(n * D) * sizeof(float));
    r.lm = malloc((size_t)(slice * V) * sizeof(float));
    r.chunk = malloc((size_t)n * sizeof(int32_t));
    r.rows = malloc((size_t)slice * sizeof(*r.rows));
    if (base) r.xb = malloc((size_t)(n * base->hp.n_embd) * sizeof(float));
    if (kld) r.lb = malloc((size_t)(slice * V) * sizeof(float));
    if (!r.xm || !r.lm || !r.chunk || !r.rows || (base && !r.xb) || (kld && !r.lb)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "eval: out of memory for the buffers of a %lld-token chunk", (long long)n);
        goto done;
    }
    if (o->save_logits && !kld) {
        struct llmq_logits_header h = {.dtype = o->logits_dtype,
                                       .protocol = plan->protocol,
                                       .n_vocab = V,
                                       .n_ctx = n,
                                       .n_chunks = plan->n_chunks,
                                       .first = plan->first,
                                       .n_rows = plan->n_rows,
                                       .n_text_tokens = plan->n_tokens};
        if (o->text_sha256) memcpy(h.text_sha256, o->text_sha256, 32);
        int32_t *all = malloc((size_t)(plan->n_chunks * n) * sizeof(int32_t));
        if (!all) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "eval: out of memory");
            goto done;
        }
        for (int64_t k = 0; k < plan->n_chunks; k++) llmq_eval_chunk_tokens(plan, tokens, k, all + k * n);
        st = llmq_logits_create(o->save_logits, &h, all, &r.w);
        free(all);
        if (st) goto done;
    }

    double t0 = llmq_now_s();
    for (int64_t k = 0; k < plan->n_chunks; k++) {
        if (lf)
            memcpy(r.chunk, llmq_logits_tokens(lf) + k * n, (size_t)n * sizeof(int32_t));
        else
            llmq_eval_chunk_tokens(plan, tokens, k, r.chunk);
        if ((st = run_blocks(r.fm, m, r.chunk, n, r.xm))) goto done;
        if (base && (st = run_blocks(r.fb, base, r.chunk, n, r.xb))) goto done;
        for (int64_t r0 = 0; r0 < plan->n_rows; r0 += slice) {
            int64_t ns = plan->n_rows - r0 < slice ? plan->n_rows - r0 : slice;
            int64_t pos = plan->first + r0; // position of the slice's first row
            if ((st = llmq_forward_head(r.fm, r.xm + pos * D, ns, r.lm))) goto done;
            if (base && (st = llmq_forward_head(r.fb, r.xb + pos * base->hp.n_embd, ns, r.lb))) goto done;
            if (lf && (st = llmq_logits_read(lf, k, r0, ns, r.lb))) goto done;
            // row i predicts the token after its position
            if ((st = llmq_eval_score(r.lm, kld ? r.lb : NULL, r.chunk + pos + 1, ns, V, nt, r.rows))) {
                llmq_errorf(st, "eval: chunk %lld, positions %lld..%lld could not be scored", (long long)k,
                            (long long)pos, (long long)(pos + ns - 1));
                goto done;
            }
            if ((st = llmq_eval_stats_add(&r.stats, r.rows, ns))) goto done;
            if (r.w && (st = llmq_logits_append(r.w, r.lm, ns))) goto done;
        }
        if (o->progress) {
            struct llmq_eval_progress p = {k + 1, plan->n_chunks, llmq_now_s() - t0, 0, 0};
            p.ppl = exp(r.stats.sum_nll / (double)r.stats.count);
            p.kld_mean = kld ? r.stats.sum_kld / (double)r.stats.count : 0;
            o->progress(o->progress_user, &p);
        }
    }
    if (r.w) {
        st = llmq_logits_commit(r.w);
        r.w = NULL;
        if (st) goto done;
    }
    out->seconds = llmq_now_s() - t0;
    out->tokens_evaluated = plan->n_chunks * n;
    out->tokens_per_s = out->seconds > 0 ? (double)out->tokens_evaluated * (base ? 2 : 1) / out->seconds : 0;
    llmq_eval_stats_result(&r.stats, &out->res);
done:
    run_free(&r);
    return st;
}

enum llmq_status llmq_eval_ppl(const struct llmq_model *m, const int32_t *tokens, int64_t n_tokens,
                               const struct llmq_eval_opts *opts, struct llmq_eval_report *out) {
    struct llmq_eval_plan plan;
    int32_t bos = m->tok && llmq_tokenizer_add_bos(m->tok) ? llmq_tokenizer_bos(m->tok) : -1;
    enum llmq_status st = llmq_eval_plan_init(opts->protocol, n_tokens, opts->n_ctx, opts->max_chunks, bos, &plan);
    if (st) return st;
    return run_eval(m, NULL, NULL, tokens, &plan, opts, out);
}

enum llmq_status llmq_eval_kld_models(const struct llmq_model *base, const struct llmq_model *m, const int32_t *tokens,
                                      int64_t n_tokens, const struct llmq_eval_opts *opts,
                                      struct llmq_eval_report *out) {
    struct llmq_eval_plan plan;
    if (!llmq_eval_same_vocab(base, m))
        return llmq_errorf(LLMQ_ERR_ARG, "eval: %s and %s do not have the same vocabulary: logits cannot be compared",
                           base->path, m->path);
    int32_t bos = base->tok && llmq_tokenizer_add_bos(base->tok) ? llmq_tokenizer_bos(base->tok) : -1;
    enum llmq_status st = llmq_eval_plan_init(opts->protocol, n_tokens, opts->n_ctx, opts->max_chunks, bos, &plan);
    if (st) return st;
    struct llmq_eval_opts o = *opts;
    o.save_logits = NULL;
    return run_eval(m, base, NULL, tokens, &plan, &o, out);
}

enum llmq_status llmq_eval_kld_file(struct llmq_logits_file *f, const struct llmq_model *m,
                                    const struct llmq_eval_opts *opts, struct llmq_eval_report *out) {
    const struct llmq_logits_header *h = llmq_logits_header(f);
    if (h->n_vocab != m->hp.n_vocab)
        return llmq_errorf(LLMQ_ERR_ARG, "eval: the logits file has a vocabulary of %lld, %s has %lld",
                           (long long)h->n_vocab, m->path, (long long)m->hp.n_vocab);
    struct llmq_eval_plan plan = {
        .protocol = h->protocol,
        .n_tokens = h->n_text_tokens,
        .n_ctx = h->n_ctx,
        .n_chunks_max = h->n_chunks,
        .n_chunks = opts->max_chunks < 0 || opts->max_chunks > h->n_chunks ? h->n_chunks : opts->max_chunks,
        .first = h->first,
        .n_rows = h->n_rows,
        .bos = -1, // the stored chunks already carry their BOS
    };
    struct llmq_eval_opts o = *opts;
    o.save_logits = NULL;
    return run_eval(m, NULL, f, NULL, &plan, &o, out);
}
