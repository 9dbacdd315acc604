/*
 * calib/calib_run.c — llmq_calib_run, the calibration pass of calib/calib.h: the model over the calibration tokens
 * block by block, each block's four linear inputs into the statistics. Its decoder blocks run one of two ways
 * (calib.h "Decoder blocks"):
 *   forward.c   calib/model/forward.h's block API with the statistics hook: the (N, D) block-boundary activations on
 *               the host, every layer run over them a micro-batch of sequences at a time, each input summed on the
 *               host as the hook sees it (the XᵀX products on s->backend).
 *   block.h     kernels/block.h layer-major with its sums: the (N, D) activations uploaded once after the embedding
 *               and resident where the block computes, each layer's weights loaded once (calib/model/devblock.h)
 *               and run over the same micro-batches, its Gram and column sums downloaded once per layer.
 * Legend: N calibration tokens (n_seq · seqlen), S seqlen, D n_embd, C in-features of an input, L n_layer.
 */
#include "calib/calib.h"

#include "calib/model/devblock.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/spill.h"
#include "kernels/block.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert((int)LLMQ_BLOCK_GRAM_QKV == LLMQ_CALIB_SLOT_Q && (int)LLMQ_BLOCK_GRAM_O == LLMQ_CALIB_SLOT_O &&
                   (int)LLMQ_BLOCK_GRAM_GATE == LLMQ_CALIB_SLOT_GATE &&
                   (int)LLMQ_BLOCK_GRAM_DOWN == LLMQ_CALIB_SLOT_DOWN && LLMQ_BLOCK_GRAM_COUNT == LLMQ_CALIB_N_SLOTS,
               "kernels/block.h's inputs are calib.h's slots");

static void progress(int64_t l, int64_t L, double t_start) {
    const double el = llmq_now_s() - t_start;
    llmq_info("calib: block %lld/%lld  %.1f s  ETA %.0f s", (long long)l + 1, (long long)L, el,
              el / (double)(l + 1) * (double)(L - l - 1));
}

// The forward.c path (see the file comment).
static enum llmq_status run_forward(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                    int64_t micro_batch, struct llmq_calib_stats *s) {
    const int64_t N = d->n_seq * d->seqlen, D = m->hp.n_embd, mb_tokens = micro_batch * d->seqlen;
    float *x = llmq_big_alloc((size_t)(N * D) * sizeof(float), "calib: activations"); // (N, D) at the block boundary
    struct llmq_forward *f = NULL;
    enum llmq_status st = x ? LLMQ_OK
                            : llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory for (%lld, %lld) activations",
                                          (long long)N, (long long)D);
    if (!st) st = llmq_forward_init(m, mb_tokens, n_threads, &f);
    if (!st) llmq_forward_set_backend(f, s->backend);
    if (!st && s->exp) llmq_forward_set_expert_hook(f, llmq_calib_stats_expert_hook, s);
    for (int64_t t0 = 0; !st && t0 < N; t0 += mb_tokens) {
        int64_t n = N - t0 < mb_tokens ? N - t0 : mb_tokens;
        st = llmq_forward_embed(f, d->tokens + t0, n, x + t0 * D);
    }
    const double t_start = llmq_now_s();
    for (int64_t l = 0; !st && l < m->hp.n_layer; l++) {
        llmq_calib_stats_reset(s, l);
        for (int64_t s0 = 0; !st && s0 < d->n_seq; s0 += micro_batch) {
            int64_t ns = d->n_seq - s0 < micro_batch ? d->n_seq - s0 : micro_batch;
            s->n_seq_hint = ns;
            st = llmq_forward_block(f, (int)l, &m->layers[l], x + s0 * d->seqlen * D, ns, d->seqlen,
                                    llmq_calib_stats_hook, s);
            if (!st) st = s->err;
            if (!st) llmq_calib_stats_add_routed(s, l, llmq_forward_moe_counts(f));
        }
        if (st) break;
        llmq_calib_stats_finish(s, l);
        progress(l, m->hp.n_layer, t_start);
    }
    llmq_forward_free(f);
    llmq_big_free(x);
    return st;
}

// The sums the block path asks of kernels/block.h: the column sums always (sum_abs, sum_sq and the finite check),
// XᵀX when the statistics keep it.
static unsigned block_sums(const struct llmq_calib_stats *s) {
    return LLMQ_BLOCK_SUM_COLS | (s->with_xtx ? LLMQ_BLOCK_SUM_GRAM : 0u);
}

// Bytes where the blocks compute: the block for micro-batches of mb sequences and the resident (N, D) activations.
static int64_t blocks_bytes(enum llmq_backend be, const struct llmq_block_shape *sh, const struct llmq_calib_data *d,
                            int64_t mb, int64_t D, unsigned sums) {
    return llmq_block_bytes(be, sh, mb * d->seqlen, d->seqlen, sums) +
           d->n_seq * d->seqlen * D * (int64_t)sizeof(float);
}

// Which way the decoder blocks run (calib.h "Decoder blocks"): *blocks on *be with shape *sh (its rope_ff in ff,
// (Dh/2 + 1) floats), else forward.c. One info line when the block path was asked for (a CUDA backend or
// LLMQ_CALIB_BLOCK): which path, and why not the block path. LLMQ_ERR_ARG for a bad LLMQ_CALIB_BLOCK.
static enum llmq_status plan_blocks(const struct llmq_model *m, const struct llmq_calib_data *d, int64_t mb,
                                    const struct llmq_calib_stats *s, bool *blocks, enum llmq_backend *be,
                                    struct llmq_block_shape *sh, float *ff) {
    bool want, hook;
    enum llmq_status st = llmq_devblock_want("LLMQ_CALIB_BLOCK", "calib", s->backend, &want, &hook, be);
    *blocks = false;
    if (st || !want) return st;
    char why[512] = "";
    llmq_devblock_supported(m, ff, sh, why, sizeof why);
    const int64_t D = m->hp.n_embd;
    const unsigned sums = block_sums(s);
    if (!why[0] && *be == LLMQ_BACKEND_CUDA) {
        struct llmq_device_info dev = {0};
        if ((st = llmq_cuda_device_info(0, &dev))) return st;
        const int64_t budget = (int64_t)(dev.free_mem / 2), need = blocks_bytes(*be, sh, d, mb, D, sums);
        if (need > budget)
            snprintf(why, sizeof why,
                     "the %lld calibration tokens' activations and the block buffers (%.0f MiB) exceed half of the "
                     "device's free memory (%.0f MiB)",
                     (long long)(d->n_seq * d->seqlen), (double)need / 1048576.0, (double)budget / 1048576.0);
    }
    if (why[0]) {
        llmq_devblock_info_fallback("calib", s->backend, why);
        return LLMQ_OK;
    }
    *blocks = true;
    llmq_info("calib: decoder blocks on %s through kernels/block.h%s: %lld sequences resident, micro-batches of %lld, "
              "each block's weights uploaded once, %.0f MiB of block buffers",
              llmq_backend_name(*be), hook ? " (LLMQ_CALIB_BLOCK=cpu, the test hook)" : "", (long long)d->n_seq,
              (long long)mb, (double)blocks_bytes(*be, sh, d, mb, D, sums) / 1048576.0);
    return LLMQ_OK;
}

enum llmq_status llmq_calib_take_block_sums(struct llmq_block *b, const struct llmq_calib_data *d, int64_t l,
                                            unsigned inputs, struct llmq_calib_stats *s) {
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) {
        if (!(inputs & (1u << k))) continue;
        struct llmq_calib_input *in = &s->in[l * LLMQ_CALIB_N_SLOTS + k];
        const enum llmq_block_gram g = (enum llmq_block_gram)k;
        const int64_t C = in->n_in;
        if (!in->sum_sq || llmq_block_gram_dim(b, g) != C)
            return llmq_errorf(LLMQ_ERR_ARG, "calib: statistics of blk.%lld %s were not allocated for %lld inputs",
                               (long long)l, llmq_calib_slot_name(k), (long long)llmq_block_gram_dim(b, g));
        int64_t bad = -1;
        enum llmq_status st = llmq_block_colsums_download(b, g, in->sum_abs, in->sum_sq, &bad);
        if (st) return st;
        if (bad >= 0) {
            const int64_t t = bad / C;
            return llmq_errorf(LLMQ_ERR_NUMERIC,
                               "calib: blk.%lld %s: non-finite activation (NaN or Inf) at token %lld (sequence %lld, "
                               "position %lld), channel %lld",
                               (long long)l, llmq_calib_slot_name(k), (long long)t, (long long)(t / d->seqlen),
                               (long long)(t % d->seqlen), (long long)(bad % C));
        }
        if (in->xtx && (st = llmq_block_gram_download(b, g, in->xtx))) return st;
        in->count = d->n_seq * d->seqlen;
        in->n_seq = d->n_seq;
    }
    return LLMQ_OK;
}

// Every block's pass: weights loaded, the micro-batches of the resident activations xd run with the sums, the sums
// taken. A CPU block's products are single-threaded cblas calls, as inside a forward pass (kernels/block.h).
static enum llmq_status run_layers(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                   int64_t mb, struct llmq_block *b, const struct llmq_ops_buf *xd,
                                   struct llmq_calib_stats *s) {
    const int64_t S = d->seqlen, D = m->hp.n_embd;
    const bool cpu = llmq_ops_backend(llmq_block_ops(b)) == LLMQ_BACKEND_CPU;
    const int blas = cpu ? openblas_get_num_threads() : 1;
    if (blas != 1) openblas_set_num_threads(1);
    enum llmq_status st = LLMQ_OK;
    const double t_start = llmq_now_s();
    for (int64_t l = 0; !st && l < m->hp.n_layer; l++) {
        llmq_calib_stats_reset(s, l);
        st = llmq_devblock_load(b, &m->layers[l], n_threads);
        if (!st) st = llmq_block_sums_zero(b);
        for (int64_t s0 = 0; !st && s0 < d->n_seq; s0 += mb) {
            const int64_t ns = d->n_seq - s0 < mb ? d->n_seq - s0 : mb;
            const struct llmq_ops_buf v = llmq_ops_buf_view(xd, s0 * S * D, ns * S * D);
            st = llmq_block_forward(b, &v, ns, S, true);
        }
        if (!st) st = llmq_calib_take_block_sums(b, d, l, LLMQ_BLOCK_INPUTS_ALL, s);
        if (st) break;
        llmq_calib_stats_finish(s, l);
        progress(l, m->hp.n_layer, t_start);
    }
    if (blas != 1) openblas_set_num_threads(blas);
    return st;
}

// The block.h path (see the file comment): the embedding a micro-batch at a time on the host (forward.c) into the
// resident xd, then run_layers.
static enum llmq_status run_blocks(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                   int64_t micro_batch, enum llmq_backend be, const struct llmq_block_shape *sh,
                                   struct llmq_calib_stats *s) {
    const int64_t N = d->n_seq * d->seqlen, D = m->hp.n_embd;
    const int64_t mb = micro_batch < d->n_seq ? micro_batch : d->n_seq, mb_tokens = mb * d->seqlen;
    struct llmq_forward *f = NULL;
    struct llmq_block *b = NULL;
    struct llmq_ops_buf xd = {0};
    float *xe = malloc((size_t)(mb_tokens * D) * sizeof(float)); // (mb_tokens, D) one micro-batch's embedding
    enum llmq_status st = xe ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
    if (!st) st = llmq_forward_init(m, mb_tokens, n_threads, &f);
    if (!st) st = llmq_block_init(be, sh, mb_tokens, d->seqlen, block_sums(s), &b);
    if (!st) st = llmq_devblock_math(b, "calib");
    if (!st) st = llmq_ops_buf_alloc(llmq_block_ops(b), N * D, &xd);
    for (int64_t t0 = 0; !st && t0 < N; t0 += mb_tokens) {
        const int64_t n = N - t0 < mb_tokens ? N - t0 : mb_tokens;
        st = llmq_forward_embed(f, d->tokens + t0, n, xe);
        if (!st) st = llmq_ops_upload(llmq_block_ops(b), &xd, t0 * D, xe, n * D); // staged: xe is free again
    }
    if (!st) st = run_layers(m, d, n_threads, mb, b, &xd, s);
    llmq_block_free(b); // waits for its queued work: xd is free to go
    llmq_ops_buf_free(&xd);
    llmq_forward_free(f);
    free(xe);
    return st;
}

enum llmq_status llmq_calib_run(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                int64_t micro_batch, struct llmq_calib_stats *s) {
    if (micro_batch < 1) micro_batch = 1;
    bool blocks = false;
    enum llmq_backend be;
    struct llmq_block_shape sh;
    float *ff = malloc((size_t)(m->hp.head_dim / 2 + 1) * sizeof(float)); // the block shape's rope_ff
    enum llmq_status st = ff ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
    if (!st) st = plan_blocks(m, d, micro_batch < d->n_seq ? micro_batch : d->n_seq, s, &blocks, &be, &sh, ff);
    if (!st)
        st = blocks ? run_blocks(m, d, n_threads, micro_batch, be, &sh, s)
                    : run_forward(m, d, n_threads, micro_batch, s);
    free(ff);
    s->n_seq = d->n_seq;
    s->seqlen = d->seqlen;
    llmq_sha256(d->tokens, (size_t)(d->n_seq * d->seqlen) * sizeof(int32_t), s->tokens_sha256);
    return st;
}
