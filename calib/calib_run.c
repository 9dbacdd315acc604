/*
 * calib/calib_run.c — llmq_calib_run, the calibration pass of calib/calib.h: the model over the calibration tokens
 * block by block, each block's four linear inputs into the statistics. Its decoder blocks run one of two ways
 * (calib.h "Decoder blocks"):
 *   forward.c   calib/model/forward.h's block API with the statistics hook: the (N, D) block-boundary activations on
 *               the host, every layer run over them a micro-batch of sequences at a time, each input summed on the
 *               host as the hook sees it (the XᵀX products on s->backend).
 *   block.h     kernels/block.h layer-major with its sums through calib/blocks.h: the (N, D) activations resident
 *               where the block computes (uploaded once after the embedding) or streamed from the host when they do
 *               not fit, each layer's weights loaded once and run over the same micro-batches, its Gram and column
 *               sums downloaded once per layer.
 * Legend: N calibration tokens (n_seq · seqlen), S seqlen, D n_embd, C in-features of an input, L n_layer.
 */
#include "calib/calib.h"

#include "calib/blocks.h"

#include "common/log.h"
#include "common/sha256.h"
#include "common/spill.h"
#include "kernels/block.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// The block path (see the file comment): the embedding a micro-batch at a time on the host (forward.c) into an
// (N, D) host array handed to the blocks (resident: uploaded and freed; streamed: kept for the passes), then every
// layer's weights loaded, its pass with the sums, the sums taken. A CPU block's products are single-threaded cblas
// calls, as inside a forward pass (kernels/block.h).
static enum llmq_status run_blocks(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                   int64_t micro_batch, struct llmq_blocks *q, struct llmq_calib_stats *s) {
    const int64_t N = d->n_seq * d->seqlen, D = m->hp.n_embd, mb_tokens = micro_batch * d->seqlen;
    struct llmq_forward *f = NULL;
    float *x = llmq_big_alloc((size_t)(N * D) * sizeof(float), "calib: activations");
    enum llmq_status st = x ? LLMQ_OK
                            : llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory for (%lld, %lld) activations",
                                          (long long)N, (long long)D);
    if (!st) st = llmq_forward_init(m, mb_tokens, n_threads, &f);
    for (int64_t t0 = 0; !st && t0 < N; t0 += mb_tokens) {
        const int64_t n = N - t0 < mb_tokens ? N - t0 : mb_tokens;
        st = llmq_forward_embed(f, d->tokens + t0, n, x + t0 * D);
    }
    llmq_forward_free(f);
    if (!st) st = llmq_blocks_put_x(q, x);
    if (!llmq_blocks_streamed(q)) llmq_big_free(x), x = NULL; // uploaded: the host copy is not needed
    const double t_start = llmq_now_s();
    for (int64_t l = 0; !st && l < m->hp.n_layer; l++) {
        llmq_calib_stats_reset(s, l);
        st = llmq_blocks_load(q, &m->layers[l], n_threads);
        if (!st) st = llmq_blocks_advance(q, l, s);
        if (st) break;
        llmq_calib_stats_finish(s, l);
        progress(l, m->hp.n_layer, t_start);
    }
    llmq_blocks_free(q); // before x: a streamed array is page-locked until then
    llmq_big_free(x);
    return st;
}

enum llmq_status llmq_calib_run(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                int64_t micro_batch, struct llmq_calib_stats *s) {
    if (micro_batch < 1) micro_batch = 1;
    const struct llmq_blocks_opts bo = {.who = "calib",
                                        .env = "LLMQ_CALIB_BLOCK",
                                        .backend = s->backend,
                                        .micro_batch = micro_batch,
                                        .max_vram = s->max_vram,
                                        .gram = s->with_xtx};
    struct llmq_blocks *q = NULL;
    enum llmq_status st = llmq_blocks_open(m, d, &bo, &q);
    if (!st)
        st = q ? run_blocks(m, d, n_threads, micro_batch < d->n_seq ? micro_batch : d->n_seq, q, s)
               : run_forward(m, d, n_threads, micro_batch, s);
    s->n_seq = d->n_seq;
    s->seqlen = d->seqlen;
    llmq_sha256(d->tokens, (size_t)(d->n_seq * d->seqlen) * sizeof(int32_t), s->tokens_sha256);
    return st;
}
