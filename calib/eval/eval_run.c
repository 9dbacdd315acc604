/*
 * calib/eval/eval_run.c — the chunk loop of calib/eval/eval.h: runs the model (and the base model, or reads
 * the base logits file) a batch of chunks at a time and feeds the scores to the statistics.
 *
 * Each model's decoder blocks run one of two ways (eval.h "Decoder blocks"):
 *   forward.c   calib/model/forward.h's block API, one chunk at a time (a batch is one chunk): embed the n_ctx
 *               tokens, run every decoder block on the one sequence, check the hidden state after each block.
 *   block.h     kernels/block.h, layer-major over a batch of B chunks: the batch's hidden state (B·n_ctx, D)
 *               uploaded once into a buffer where the block computes, each layer's weights loaded once per
 *               batch (calib/model/devblock.h) and run over the B sequences, the result downloaded once.
 * Then, either way, the output head on the scored positions only, SLICE_ROWS rows at a time, chunk by chunk
 * (calib/model/forward.h, on opts->backend). So the logits held in memory never exceed (SLICE_ROWS, V) per model,
 * whatever n_ctx is (the gptq protocol's 2047 rows × V would be 400 MB for V = 49152), and positions before
 * `first` never go through the head (half of the head's work for the llamacpp protocol).
 */
#include "calib/eval/eval.h"

#include "calib/model/devblock.h"
#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/log.h"
#include "kernels/block.h"

#include <cblas.h>
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

// The index of the first NaN / Inf of x (n), -1 when every value is finite.
static int64_t first_nonfinite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

// The hidden state x (rows, D) after block `layer` (-1: the embedding) of chunks k0, k0 + 1, ... (n_ctx rows each)
// is finite, else an error naming the layer: the first block whose output holds a NaN or Inf is where the model
// breaks (a scan of rows x D floats, small next to the block's own rows x D x D work).
static enum llmq_status check_finite(const struct llmq_model *m, int layer, const float *x, int64_t rows, int64_t n_ctx,
                                     int64_t k0) {
    const int64_t D = m->hp.n_embd, i = first_nonfinite(x, rows * D);
    if (i < 0) return LLMQ_OK;
    char where[32] = "token_embd";
    if (layer >= 0) snprintf(where, sizeof where, "blk.%d", layer);
    return llmq_errorf(LLMQ_ERR_NUMERIC,
                       "eval: %s: the output of %s is %s at position %lld, component %lld of chunk %lld (the first "
                       "layer to produce a non-finite value: its weights or activations overflow)",
                       m->path, where, isnan(x[i]) ? "NaN" : "Inf", (long long)(i / D % n_ctx), (long long)(i % D),
                       (long long)(k0 + i / D / n_ctx));
}

// One model's side of the loop; freed by side_free.
struct side {
    const struct llmq_model *m;
    struct llmq_forward *f; // the embedding and the head; the blocks too when blk is NULL
    struct llmq_block *blk; // the decoder block where it computes (kernels/block.h); NULL: forward.c's blocks
    struct llmq_ops_buf xd; // (B·n, D) the batch's hidden state on blk's backend (blk only)
    float *x;               // (B·n, D) host: the hidden state after the last block, the head's input
};

static void side_free(struct side *s) {
    llmq_block_free(s->blk); // waits for its queued work: xd is free to go
    llmq_ops_buf_free(&s->xd);
    llmq_forward_free(s->f);
    free(s->x);
}

// The forward object of s->m for chunks of n tokens with opts' backend and emulation, x for B chunks, and with
// blocks the decoder block on be for B sequences of n tokens and its x buffer.
static enum llmq_status side_init(struct side *s, const struct llmq_model *m, int64_t n, int64_t B, bool blocks,
                                  enum llmq_backend be, const struct llmq_eval_opts *o, int nt) {
    enum llmq_status st;
    s->m = m;
    if ((st = llmq_forward_init(m, n, nt, &s->f)) || (st = llmq_forward_set_emulate(s->f, o->emulate))) return st;
    // LongRoPE: llama.cpp's choice of factors by the context for a GGUF or under --emulate (every chunk is the
    // context long, so transformers' rule by the sequence's length agrees)
    if ((m->from_gguf || o->emulate) && (st = llmq_forward_set_rope_ctx(s->f, n))) return st;
    llmq_forward_set_backend(s->f, o->backend);
    const int64_t D = m->hp.n_embd;
    if (!(s->x = malloc((size_t)(B * n * D) * sizeof(float))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "eval: out of memory for the activations of %lld chunks of %lld tokens",
                           (long long)B, (long long)n);
    if (!blocks) return LLMQ_OK;
    float *ff = malloc((size_t)(m->hp.head_dim / 2 + 1) * sizeof(float));
    struct llmq_block_shape sh;
    if (!ff) return llmq_errorf(LLMQ_ERR_NOMEM, "eval: out of memory");
    st = llmq_devblock_shape(m, ff, &sh);
    if (!st) st = llmq_block_init(be, &sh, B * n, n, 0, &s->blk);
    if (!st) st = llmq_devblock_math(s->blk, "eval");
    free(ff);
    if (!st) st = llmq_ops_buf_alloc(llmq_block_ops(s->blk), B * n * D, &s->xd);
    return st;
}

static enum llmq_status forward_chunk(struct side *s, const int32_t *chunk, int64_t n, int64_t k, float *x) {
    enum llmq_status st = llmq_forward_embed(s->f, chunk, n, x);
    if (!st) st = check_finite(s->m, -1, x, n, n, k);
    for (int l = 0; !st && l < (int)s->m->hp.n_layer; l++) {
        st = llmq_forward_block(s->f, l, &s->m->layers[l], x, 1, n, NULL, NULL);
        if (!st) st = check_finite(s->m, l, x, n, n, k);
    }
    return st;
}

// The decoder blocks of chunks k0 .. k0 + nb - 1 (tokens (nb, n)) through s->blk: embedded on the host into s->x,
// uploaded, each layer's weights loaded once and run over the nb sequences, the result downloaded into s->x.
// check_each: download and check x after every block too (the rerun that names the first non-finite layer).
static enum llmq_status block_batch(struct side *s, const int32_t *tokens, int64_t k0, int64_t nb, int64_t n, int nt,
                                    bool check_each) {
    const struct llmq_model *m = s->m;
    const int64_t D = m->hp.n_embd, T = nb * n;
    struct llmq_ops *ops = llmq_block_ops(s->blk);
    enum llmq_status st = LLMQ_OK;
    for (int64_t j = 0; j < nb && !st; j++) st = llmq_forward_embed(s->f, tokens + j * n, n, s->x + j * n * D);
    if (!st) st = check_finite(m, -1, s->x, T, n, k0);
    if (!st) st = llmq_ops_upload(ops, &s->xd, 0, s->x, T * D);
    for (int l = 0; !st && l < (int)m->hp.n_layer; l++) {
        st = llmq_devblock_load(s->blk, &m->layers[l], nt);
        if (!st) st = llmq_block_forward(s->blk, &s->xd, nb, n, false);
        if (!st && check_each) st = llmq_ops_download(ops, s->x, &s->xd, 0, T * D);
        if (!st && check_each) st = check_finite(m, l, s->x, T, n, k0);
    }
    if (!st && !check_each) st = llmq_ops_download(ops, s->x, &s->xd, 0, T * D);
    return st;
}

// s->x (nb·n, D) = the hidden state after the last block of chunks k0 .. k0 + nb - 1 (tokens (nb, n)).
// The block path checks only its final output: a NaN or Inf in a row of the residual stream stays there through
// every later block (x + NaN is NaN; a row holding Inf normalises to NaN), so a finite final state means every
// block's output was finite, and a non-finite one reruns the batch with the per-block check to name the layer.
static enum llmq_status side_blocks(struct side *s, const int32_t *tokens, int64_t k0, int64_t nb, int64_t n, int nt) {
    const int64_t D = s->m->hp.n_embd;
    enum llmq_status st = LLMQ_OK;
    if (!s->blk) {
        for (int64_t j = 0; j < nb && !st; j++) st = forward_chunk(s, tokens + j * n, n, k0 + j, s->x + j * n * D);
        return st;
    }
    // the CPU block's products are single-threaded cblas calls, as inside a forward pass (kernels/block.h)
    const bool cpu = llmq_ops_backend(llmq_block_ops(s->blk)) == LLMQ_BACKEND_CPU;
    const int blas = cpu ? openblas_get_num_threads() : 1;
    if (blas != 1) openblas_set_num_threads(1);
    st = block_batch(s, tokens, k0, nb, n, nt, false);
    if (!st && first_nonfinite(s->x, nb * n * D) >= 0) st = block_batch(s, tokens, k0, nb, n, nt, true);
    if (blas != 1) openblas_set_num_threads(blas);
    return st;
}

// Bytes of the block path's buffers where the blocks compute for batches of B chunks of n tokens: each model's
// block (llmq_block_bytes) and its x. ms: the models (the second may be NULL).
static int64_t batch_bytes(const struct llmq_model *const ms[2], const struct llmq_block_shape sh[2],
                           enum llmq_backend be, int64_t B, int64_t n) {
    int64_t bytes = 0;
    for (int i = 0; i < 2 && ms[i]; i++)
        bytes += llmq_block_bytes(be, &sh[i], B * n, n, 0) + B * n * ms[i]->hp.n_embd * (int64_t)sizeof(float);
    return bytes;
}

// Why the models' blocks cannot take the block path (written into why), or "" when they can; the shapes into sh.
static void blocks_refusal(const struct llmq_model *const ms[2], const struct llmq_eval_opts *o,
                           struct llmq_block_shape sh[2], char *why, size_t cap) {
    why[0] = '\0';
    if (o->emulate) {
        snprintf(why, cap, "--emulate %s rounds activations as llama.cpp does, the block forward does not",
                 llmq_emulate_name(o->emulate));
        return;
    }
    for (int i = 0; i < 2 && ms[i] && !why[0]; i++) {
        float *ff = malloc((size_t)(ms[i]->hp.head_dim / 2 + 1) * sizeof(float));
        if (!ff)
            snprintf(why, cap, "out of memory");
        else
            llmq_devblock_supported(ms[i], ff, &sh[i], why, cap);
        free(ff);
    }
}

// Which way the decoder blocks run (eval.h "Decoder blocks"): *blocks, on *be, in batches of *B chunks of n tokens
// (1 for forward.c's blocks). Logs one info line when the block path was asked for (a CUDA backend or
// LLMQ_EVAL_BLOCK): which path, and why not the block path. LLMQ_ERR_ARG for a bad LLMQ_EVAL_BLOCK.
static enum llmq_status plan_blocks(const struct llmq_model *const ms[2], const struct llmq_eval_opts *o, int64_t n,
                                    int64_t n_chunks, bool *blocks, enum llmq_backend *be, int64_t *B) {
    bool want, hook;
    enum llmq_status st = llmq_devblock_want("LLMQ_EVAL_BLOCK", "eval", o->backend, &want, &hook, be);
    *blocks = false, *B = 1;
    if (st || !want) return st;
    struct llmq_block_shape sh[2];
    char why[512];
    blocks_refusal(ms, o, sh, why, sizeof why);
    int64_t b = n_chunks < LLMQ_EVAL_BATCH_TOKENS / n ? n_chunks : LLMQ_EVAL_BATCH_TOKENS / n;
    if (b < 1) b = 1;
    struct llmq_device_info dev = {0};
    if (!why[0] && (*be == LLMQ_BACKEND_CUDA || o->max_vram)) {
        if (!o->max_vram && (st = llmq_cuda_device_info(0, &dev))) return st;
        const int64_t budget = o->max_vram ? (int64_t)o->max_vram : (int64_t)(dev.free_mem / 2);
        while (b > 0 && batch_bytes(ms, sh, *be, b, n) > budget) b--;
        if (b == 0)
            snprintf(why, sizeof why, "the block buffers of one %lld-token chunk (%.0f MiB) exceed %s (%.0f MiB)",
                     (long long)n, (double)batch_bytes(ms, sh, *be, 1, n) / 1048576.0,
                     o->max_vram ? "--max-vram" : "half of the device's free memory", (double)budget / 1048576.0);
    }
    if (why[0]) {
        llmq_devblock_info_fallback("eval", o->backend, why);
        return LLMQ_OK;
    }
    *blocks = true, *B = b;
    llmq_info("eval: decoder blocks on %s through kernels/block.h%s: batches of %lld chunks (%lld tokens), each "
              "block's weights uploaded once per batch, %.0f MiB of block buffers",
              llmq_backend_name(*be), hook ? " (LLMQ_EVAL_BLOCK=cpu, the test hook)" : "", (long long)b,
              (long long)(b * n), (double)batch_bytes(ms, sh, *be, b, n) / 1048576.0);
    return LLMQ_OK;
}

// Everything the loop owns; freed by run_free.
struct run {
    struct side sm, sb;         // model, base model (KLD-base mode; sb zeroed otherwise)
    float *lm, *lb;             // (SLICE_ROWS, V) logits of model and base
    int32_t *chunk;             // (B, n_ctx) input tokens of the batch
    struct llmq_eval_row *rows; // (SLICE_ROWS)
    struct llmq_logits_writer *w;
    struct llmq_eval_stats stats;
};

static void run_free(struct run *r) {
    side_free(&r->sm);
    side_free(&r->sb);
    free(r->lm);
    free(r->lb);
    free(r->chunk);
    free(r->rows);
    llmq_logits_abort(r->w);
    llmq_eval_stats_free(&r->stats);
}

// Scores chunk k: its tokens chunk (n), the hidden states xm (n, D) of the model and xb of the base (NULL: none),
// the head slice by slice, the base logits from lf when given.
static enum llmq_status score_chunk(struct run *r, const struct llmq_eval_plan *plan, struct llmq_logits_file *lf,
                                    int64_t k, const int32_t *chunk, const float *xm, const float *xb, int nt) {
    const int64_t V = r->sm.m->hp.n_vocab, D = r->sm.m->hp.n_embd;
    const int64_t slice = plan->n_rows < SLICE_ROWS ? plan->n_rows : SLICE_ROWS;
    const bool kld = xb || lf;
    enum llmq_status st = LLMQ_OK;
    for (int64_t r0 = 0; r0 < plan->n_rows && !st; r0 += slice) {
        int64_t ns = plan->n_rows - r0 < slice ? plan->n_rows - r0 : slice;
        int64_t pos = plan->first + r0; // position of the slice's first row
        if ((st = llmq_forward_head(r->sm.f, xm + pos * D, ns, r->lm))) break;
        if (xb && (st = llmq_forward_head(r->sb.f, xb + pos * r->sb.m->hp.n_embd, ns, r->lb))) break;
        if (lf && (st = llmq_logits_read(lf, k, r0, ns, r->lb))) break;
        // row i predicts the token after its position
        if ((st = llmq_eval_score(r->lm, kld ? r->lb : NULL, chunk + pos + 1, ns, V, nt, r->rows))) {
            llmq_errorf(st, "eval: chunk %lld, positions %lld..%lld could not be scored", (long long)k, (long long)pos,
                        (long long)(pos + ns - 1));
            break;
        }
        if ((st = llmq_eval_stats_add(&r->stats, r->rows, ns))) break;
        if (r->w) st = llmq_logits_append(r->w, r->lm, ns);
    }
    return st;
}

// Starts the logits file of --save-logits: every chunk's tokens, then the rows as they come.
static enum llmq_status open_writer(struct run *r, const int32_t *tokens, const struct llmq_eval_plan *plan,
                                    const struct llmq_eval_opts *o) {
    const int64_t n = plan->n_ctx;
    struct llmq_logits_header h = {.dtype = o->logits_dtype,
                                   .protocol = plan->protocol,
                                   .n_vocab = r->sm.m->hp.n_vocab,
                                   .n_ctx = n,
                                   .n_chunks = plan->n_chunks,
                                   .first = plan->first,
                                   .n_rows = plan->n_rows,
                                   .n_text_tokens = plan->n_tokens};
    if (o->text_sha256) memcpy(h.text_sha256, o->text_sha256, 32);
    int32_t *all = malloc((size_t)(plan->n_chunks * n) * sizeof(int32_t));
    if (!all) return llmq_errorf(LLMQ_ERR_NOMEM, "eval: out of memory");
    for (int64_t k = 0; k < plan->n_chunks; k++) llmq_eval_chunk_tokens(plan, tokens, k, all + k * n);
    enum llmq_status st = llmq_logits_create(o->save_logits, &h, all, &r->w);
    free(all);
    return st;
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
    const int nt = o->n_threads < 1 ? 1 : o->n_threads;
    const struct llmq_model *const ms[2] = {m, base};
    bool blocks;
    enum llmq_backend be;
    int64_t B;

    memset(out, 0, sizeof(*out));
    out->plan = *plan;
    r.stats.kld = kld;
    if ((st = plan_blocks(ms, o, n, plan->n_chunks, &blocks, &be, &B))) goto done;
    if ((st = side_init(&r.sm, m, n, B, blocks, be, o, nt))) goto done;
    if (base && (st = side_init(&r.sb, base, n, B, blocks, be, o, nt))) goto done;
    r.lm = malloc((size_t)(slice * V) * sizeof(float));
    r.chunk = malloc((size_t)(B * n) * sizeof(int32_t));
    r.rows = malloc((size_t)slice * sizeof(*r.rows));
    if (kld) r.lb = malloc((size_t)(slice * V) * sizeof(float));
    if (!r.lm || !r.chunk || !r.rows || (kld && !r.lb)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "eval: out of memory for the buffers of a %lld-token chunk", (long long)n);
        goto done;
    }
    if (o->save_logits && !kld && (st = open_writer(&r, tokens, plan, o))) goto done;

    double t0 = llmq_now_s();
    for (int64_t k0 = 0; k0 < plan->n_chunks; k0 += B) {
        const int64_t nb = plan->n_chunks - k0 < B ? plan->n_chunks - k0 : B;
        for (int64_t j = 0; j < nb; j++) {
            if (lf)
                memcpy(r.chunk + j * n, llmq_logits_tokens(lf) + (k0 + j) * n, (size_t)n * sizeof(int32_t));
            else
                llmq_eval_chunk_tokens(plan, tokens, k0 + j, r.chunk + j * n);
        }
        if ((st = side_blocks(&r.sm, r.chunk, k0, nb, n, nt))) goto done;
        if (base && (st = side_blocks(&r.sb, r.chunk, k0, nb, n, nt))) goto done;
        for (int64_t j = 0; j < nb; j++) {
            const float *xb = base ? r.sb.x + j * n * base->hp.n_embd : NULL;
            if ((st = score_chunk(&r, plan, lf, k0 + j, r.chunk + j * n, r.sm.x + j * n * D, xb, nt))) goto done;
            if (o->progress) {
                struct llmq_eval_progress p = {k0 + j + 1, plan->n_chunks, llmq_now_s() - t0, 0, 0};
                p.ppl = exp(r.stats.sum_nll / (double)r.stats.count);
                p.kld_mean = kld ? r.stats.sum_kld / (double)r.stats.count : 0;
                o->progress(o->progress_user, &p);
            }
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
