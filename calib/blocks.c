// calib/blocks.c — calib/blocks.h: the calibration set's passes through kernels/block.h, its activations resident
// where the block computes or streamed from the host.
#include "calib/blocks.h"

#include "calib/model/devblock.h"
#include "common/log.h"
#include "kernels/block.h"
#include "kernels/gemm.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert((int)LLMQ_BLOCK_GRAM_QKV == LLMQ_CALIB_SLOT_Q && (int)LLMQ_BLOCK_GRAM_O == LLMQ_CALIB_SLOT_O &&
                   (int)LLMQ_BLOCK_GRAM_GATE == LLMQ_CALIB_SLOT_GATE &&
                   (int)LLMQ_BLOCK_GRAM_DOWN == LLMQ_CALIB_SLOT_DOWN && LLMQ_BLOCK_GRAM_COUNT == LLMQ_CALIB_N_SLOTS,
               "kernels/block.h's inputs are calib.h's slots");

struct llmq_blocks {
    struct llmq_block *b;
    const struct llmq_calib_data *d;
    int64_t D, mb;         // n_embd, sequences per block call
    bool cpu;              // the CPU backend (a test hook): its products run single-threaded, as inside a forward pass
    struct llmq_ops_buf x; // resident: (N, D) the activations; streamed: (mb · seqlen, D) the staging buffer
    bool streamed;         // the activations are host (the caller's array), see calib/blocks.h
    float *host;           // streamed: the caller's (N, D) array (llmq_blocks_put_x)
    bool pinned;           // host is page-locked (llmq_ops_pin)
    double load_s, pass_s, sums_s; // llmq_blocks_times
    bool x_is_h; // x holds the attention half's output h (llmq_blocks_apply_attn), not the block input
    // quantize's Hessians (opts.hessians): the last one where the block computes, row chunks of D and D·H
    struct llmq_ops_buf h, dl, t; // (Cmax, Cmax), (qf_rows, Cmax) x 2
    int64_t h_C;                  // the width of the Hessian in h; 0: none yet
    struct llmq_gemm_dev *gemm;   // its own products, plain FP32 (whatever LLMQ_BLOCK_MATH says of the block's)
};

// Rows of D per product of the error sums: quant/quantize.c quad_form's 256 on the CPU (the same products, so the
// same bits), larger chunks on the device.
static int64_t qf_rows(enum llmq_backend be) { return be == LLMQ_BACKEND_CUDA ? 2048 : LLMQ_BLOCKS_QF_ROWS_CPU; }

// The widest block input (the Hessians' C).
static int64_t c_max(const struct llmq_block_shape *sh) {
    const int64_t Dq = sh->n_head * sh->head_dim;
    const int64_t c = sh->n_embd > sh->n_ff ? sh->n_embd : sh->n_ff;
    return c > Dq ? c : Dq;
}

static int64_t micro_batch(int64_t n_seq, int64_t mb) { return mb < 1 ? 1 : mb < n_seq ? mb : n_seq; }

static unsigned block_sums(const struct llmq_blocks_opts *o) {
    return LLMQ_BLOCK_SUM_COLS | (o->gram ? LLMQ_BLOCK_SUM_GRAM : 0u);
}

// Bytes on backend be for shape sh (see llmq_blocks_bytes).
static int64_t bytes_for(enum llmq_backend be, const struct llmq_block_shape *sh, const struct llmq_blocks_opts *o,
                         int64_t n_seq, int64_t seqlen, int64_t D, bool streamed) {
    const int64_t mb = micro_batch(n_seq, o->micro_batch), cm = c_max(sh);
    const int64_t x = (streamed ? mb : n_seq) * seqlen * D;
    const int64_t extra = o->hessians ? cm * (cm + 2 * qf_rows(be)) : 0; // the Hessian, the error sums' chunks
    return llmq_block_bytes(be, sh, mb * seqlen, seqlen, block_sums(o)) + (x + extra) * (int64_t)sizeof(float);
}

int64_t llmq_blocks_bytes(const struct llmq_model *m, const struct llmq_blocks_opts *o, int64_t n_seq, int64_t seqlen,
                          bool streamed) {
    float *ff = malloc((size_t)(m->hp.head_dim / 2 + 1) * sizeof(float));
    struct llmq_block_shape sh;
    char why[256];
    int64_t bytes = -1;
    if (ff && n_seq >= 1 && seqlen >= 1 && llmq_devblock_supported(m, ff, &sh, why, sizeof why))
        bytes = bytes_for(LLMQ_BACKEND_CUDA, &sh, o, n_seq, seqlen, m->hp.n_embd, streamed);
    free(ff);
    return bytes;
}

// The placement for the run (*streamed), or why the block path is not taken, into why ("" when it is).
static enum llmq_status plan(const struct llmq_model *m, const struct llmq_calib_data *d,
                             const struct llmq_blocks_opts *o, enum llmq_backend be, const struct llmq_block_shape *sh,
                             bool *streamed, char *why, size_t cap) {
    *streamed = false;
    int64_t budget = o->max_vram > 0 ? (int64_t)o->max_vram : -1;
    if (budget < 0 && be == LLMQ_BACKEND_CUDA) {
        struct llmq_device_info dev = {0};
        enum llmq_status st = llmq_cuda_device_info(0, &dev);
        if (st) return st;
        budget = (int64_t)(dev.free_mem / 2);
    }
    if (budget < 0) return LLMQ_OK; // the CPU hook without --max-vram: no bound
    const int64_t D = m->hp.n_embd, res = bytes_for(be, sh, o, d->n_seq, d->seqlen, D, false),
                  str = bytes_for(be, sh, o, d->n_seq, d->seqlen, D, true);
    *streamed = res > budget;
    if (str > budget)
        snprintf(why, cap,
                 "even with the activations streamed from the host the block buffers (%.0f MiB) exceed %s (%.0f MiB)",
                 (double)str / 1048576.0, o->max_vram ? "--max-vram" : "half of the device's free memory",
                 (double)budget / 1048576.0);
    return LLMQ_OK;
}

// The buffers of q (opened on be with shape sh) and the info line.
static enum llmq_status alloc_blocks(struct llmq_blocks *q, const struct llmq_blocks_opts *o, enum llmq_backend be,
                                     const struct llmq_block_shape *sh, bool hook) {
    const struct llmq_calib_data *d = q->d;
    enum llmq_status st = llmq_block_init(be, sh, q->mb * d->seqlen, d->seqlen, block_sums(o), &q->b);
    if (!st) st = llmq_devblock_math(q->b, o->who);
    struct llmq_ops *ops = st ? NULL : llmq_block_ops(q->b);
    const int64_t cm = c_max(sh);
    if (!st) st = llmq_ops_buf_alloc(ops, (q->streamed ? q->mb : d->n_seq) * d->seqlen * q->D, &q->x);
    if (!st && o->hessians) st = llmq_ops_buf_alloc(ops, cm * cm, &q->h);
    if (!st && o->hessians) st = llmq_ops_buf_alloc(ops, qf_rows(be) * cm, &q->dl);
    if (!st && o->hessians) st = llmq_ops_buf_alloc(ops, qf_rows(be) * cm, &q->t);
    if (!st && o->hessians) st = llmq_gemm_dev_init(be, llmq_ops_stream(ops), &q->gemm);
    char hk[96] = "";
    if (hook) snprintf(hk, sizeof hk, " (%s=cpu, the test hook)", o->env);
    const int64_t bytes = bytes_for(be, sh, o, d->n_seq, d->seqlen, q->D, q->streamed);
    if (!st)
        llmq_info("%s: decoder blocks on %s through kernels/block.h%s: %lld sequences %s, micro-batches of %lld, "
                  "%.1f MiB (%lld bytes) where the blocks compute",
                  o->who, llmq_backend_name(be), hk, (long long)d->n_seq,
                  q->streamed ? "streamed from the host" : "resident", (long long)q->mb, (double)bytes / 1048576.0,
                  (long long)bytes);
    return st;
}

enum llmq_status llmq_blocks_open(const struct llmq_model *m, const struct llmq_calib_data *d,
                                  const struct llmq_blocks_opts *o, struct llmq_blocks **out) {
    *out = NULL;
    bool want, hook;
    enum llmq_backend be;
    if (d->n_seq < 1) return LLMQ_OK; // no calibration: no passes
    enum llmq_status st = llmq_devblock_want(o->env, o->who, o->backend, &want, &hook, &be);
    if (st || !want) return st;
    char why[512] = "";
    struct llmq_block_shape sh;
    bool streamed = false;
    float *ff = malloc((size_t)(m->hp.head_dim / 2 + 1) * sizeof(float)); // the shape's rope_ff
    if (!ff) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", o->who);
    snprintf(why, sizeof why, "%s", o->refusal ? o->refusal : "");
    if (!why[0] && llmq_devblock_supported(m, ff, &sh, why, sizeof why))
        st = plan(m, d, o, be, &sh, &streamed, why, sizeof why);
    if (!st && why[0]) llmq_devblock_info_fallback(o->who, o->backend, why);
    struct llmq_blocks *q = NULL;
    if (!st && !why[0] && !(q = calloc(1, sizeof *q))) st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", o->who);
    if (q) {
        *q = (struct llmq_blocks){.d = d,
                                  .D = m->hp.n_embd,
                                  .mb = micro_batch(d->n_seq, o->micro_batch),
                                  .cpu = be == LLMQ_BACKEND_CPU,
                                  .streamed = streamed};
        st = alloc_blocks(q, o, be, &sh, hook);
    }
    free(ff);
    if (st) {
        llmq_blocks_free(q);
        return st;
    }
    *out = q;
    return LLMQ_OK;
}

void llmq_blocks_free(struct llmq_blocks *q) {
    if (!q) return;
    if (q->pinned) { // no copy from the array may still be queued when it is unlocked
        (void)llmq_ops_sync(llmq_block_ops(q->b));
        llmq_ops_unpin(llmq_block_ops(q->b), q->host);
    }
    llmq_block_free(q->b); // waits for its queued work: the buffers are free to go
    llmq_ops_buf_free(&q->x);
    llmq_ops_buf_free(&q->h);
    llmq_ops_buf_free(&q->dl);
    llmq_ops_buf_free(&q->t);
    llmq_gemm_dev_free(q->gemm);
    free(q);
}

bool llmq_blocks_streamed(const struct llmq_blocks *q) { return q->streamed; }

enum llmq_status llmq_blocks_put_x(struct llmq_blocks *q, float *x) {
    struct llmq_ops *ops = llmq_block_ops(q->b);
    if (!q->streamed) {
        enum llmq_status st = llmq_ops_upload(ops, &q->x, 0, x, q->x.n);
        return st ? st : llmq_ops_sync(ops);
    }
    if (q->pinned && q->host != x) llmq_ops_unpin(ops, q->host), q->pinned = false;
    const size_t bytes = (size_t)(q->d->n_seq * q->d->seqlen * q->D) * sizeof(float);
    if (!q->pinned && llmq_ops_backend(ops) == LLMQ_BACKEND_CUDA) {
        enum llmq_status st = llmq_ops_pin(ops, x, bytes, &q->pinned);
        if (st) return st;
        if (!q->pinned) llmq_info("blocks: the streamed activations could not be page-locked: pageable copies");
    }
    q->host = x;
    return LLMQ_OK;
}

enum llmq_status llmq_blocks_get_x(struct llmq_blocks *q, float *x) {
    if (!q->streamed) return llmq_ops_download(llmq_block_ops(q->b), x, &q->x, 0, q->x.n);
    if (x != q->host) memcpy(x, q->host, (size_t)(q->d->n_seq * q->d->seqlen * q->D) * sizeof(float));
    return LLMQ_OK;
}

enum llmq_status llmq_blocks_load(struct llmq_blocks *q, const struct llmq_layer *ly, int n_threads) {
    const double t0 = llmq_now_s();
    enum llmq_status st = llmq_devblock_load(q->b, ly, n_threads);
    q->load_s += llmq_now_s() - t0;
    return st;
}

enum llmq_status llmq_blocks_set_linear(struct llmq_blocks *q, enum llmq_linear k, const float *w) {
    const double t0 = llmq_now_s();
    enum llmq_status st = llmq_block_set_weight(q->b, (enum llmq_block_weight)k, w);
    q->load_s += llmq_now_s() - t0;
    return st;
}

void llmq_blocks_times(const struct llmq_blocks *q, double *load, double *passes, double *sums) {
    *load += q->load_s;
    *passes += q->pass_s;
    *sums += q->sums_s;
}

// ---- the passes ----------------------------------------------------------------------------------------------

// The ways passes() runs a micro-batch.
enum pass_kind {
    GATHER,  // llmq_block_gather (x read; from the block input)
    FORWARD, // llmq_block_forward (x <- block(x), sums of every input when any)
    ATTN,    // llmq_block_attn (x <- h), then the ffn inputs' sums from h
    FFN,     // llmq_block_ffn without apply (x = h read)
    FFN_OUT, // llmq_block_ffn with apply (x <- h + MLP(h))
};

static enum llmq_status run_one(struct llmq_blocks *q, enum pass_kind kind, const struct llmq_ops_buf *v, int64_t ns,
                                int64_t S, unsigned inputs) {
    switch (kind) {
    case GATHER: return llmq_block_gather(q->b, v, ns, S, inputs);
    case FORWARD: return llmq_block_forward(q->b, v, ns, S, inputs != 0);
    case ATTN: {
        enum llmq_status st = llmq_block_attn(q->b, v, ns, S, 0u);
        return st || !inputs ? st : llmq_block_ffn(q->b, v, ns, S, inputs, false);
    }
    case FFN: return llmq_block_ffn(q->b, v, ns, S, inputs, false);
    default: return llmq_block_ffn(q->b, v, ns, S, inputs, true);
    }
}

// Every micro-batch of the calibration sequences through the block as `kind` says, the sums of `inputs` gathered
// (zeroed first when there are any); streamed: each micro-batch uploaded from the host array and, when the pass
// changes x, downloaded back.
static enum llmq_status passes(struct llmq_blocks *q, unsigned inputs, enum pass_kind kind) {
    const int64_t S = q->d->seqlen, n_seq = q->d->n_seq, D = q->D;
    const double t0 = llmq_now_s();
    struct llmq_ops *ops = llmq_block_ops(q->b);
    const bool writes = kind == FORWARD || kind == ATTN || kind == FFN_OUT;
    const int blas = q->cpu ? openblas_get_num_threads() : 1;
    if (blas != 1) openblas_set_num_threads(1);
    enum llmq_status st = q->streamed && !q->host ? llmq_errorf(LLMQ_ERR_ARG, "blocks: no activations (put_x)")
                          : inputs                ? llmq_block_sums_zero(q->b)
                                                  : LLMQ_OK;
    for (int64_t s0 = 0; !st && s0 < n_seq; s0 += q->mb) {
        const int64_t ns = n_seq - s0 < q->mb ? n_seq - s0 : q->mb, n = ns * S * D;
        const struct llmq_ops_buf v = llmq_ops_buf_view(&q->x, q->streamed ? 0 : s0 * S * D, n);
        if (q->streamed) st = llmq_ops_upload(ops, &v, 0, q->host + s0 * S * D, n);
        if (!st) st = run_one(q, kind, &v, ns, S, inputs);
        if (!st && q->streamed && writes) st = llmq_ops_download(ops, q->host + s0 * S * D, &v, 0, n);
    }
    if (!st) st = llmq_ops_sync(ops); // the device's time is the pass's
    if (blas != 1) openblas_set_num_threads(blas);
    q->pass_s += llmq_now_s() - t0;
    return st;
}

// The sums of `inputs` of block l into s, timed.
static enum llmq_status take(struct llmq_blocks *q, int64_t l, unsigned inputs, struct llmq_calib_stats *s) {
    const double t0 = llmq_now_s();
    enum llmq_status st = llmq_calib_take_block_sums(q->b, q->d, l, inputs, s);
    q->sums_s += llmq_now_s() - t0;
    return st;
}

static const unsigned FFN_INPUTS = (1u << LLMQ_CALIB_SLOT_GATE) | (1u << LLMQ_CALIB_SLOT_DOWN);

enum llmq_status llmq_blocks_gather(struct llmq_blocks *q, int64_t l, unsigned slots, struct llmq_calib_stats *s) {
    if (q->x_is_h && (slots & ~FFN_INPUTS))
        return llmq_errorf(LLMQ_ERR_ARG, "blocks: blk.%lld: the attention inputs are gone (x holds its output)",
                           (long long)l);
    enum llmq_status st = passes(q, slots, q->x_is_h ? FFN : GATHER);
    return st ? st : take(q, l, slots, s);
}

enum llmq_status llmq_blocks_apply_attn(struct llmq_blocks *q, int64_t l, unsigned slots, struct llmq_calib_stats *s) {
    if (q->x_is_h || (slots & ~FFN_INPUTS))
        return llmq_errorf(LLMQ_ERR_ARG, "blocks: blk.%lld: apply_attn twice, or of inputs %#x", (long long)l, slots);
    enum llmq_status st = passes(q, slots, ATTN);
    q->x_is_h = true; // whatever happened: x is no longer the block input
    return st || !slots ? st : take(q, l, slots, s);
}

enum llmq_status llmq_blocks_advance(struct llmq_blocks *q, int64_t l, struct llmq_calib_stats *s) {
    const unsigned inputs = s ? (q->x_is_h ? FFN_INPUTS : LLMQ_BLOCK_INPUTS_ALL) : 0u;
    enum llmq_status st = passes(q, inputs, q->x_is_h ? FFN_OUT : FORWARD);
    q->x_is_h = false;
    return st || !s ? st : take(q, l, inputs, s);
}

// ---- quantize's Hessians and error sums ------------------------------------------------------------------------

enum llmq_status llmq_blocks_hessian(struct llmq_blocks *q, int slot, float *H) {
    if (!q->h.data) return llmq_errorf(LLMQ_ERR_ARG, "blocks: opened without Hessians");
    const double t0 = llmq_now_s();
    const int64_t C = llmq_block_gram_dim(q->b, (enum llmq_block_gram)slot);
    q->h_C = 0;
    enum llmq_status st = llmq_block_hessian(q->b, (enum llmq_block_gram)slot, 2.0 / (double)q->d->n_seq, &q->h);
    if (!st) st = llmq_ops_download(llmq_block_ops(q->b), H, &q->h, 0, C * C);
    if (!st) q->h_C = C;
    q->sums_s += llmq_now_s() - t0;
    return st;
}

enum llmq_status llmq_blocks_quad_form(struct llmq_blocks *q, const float *Dl, int64_t R, int64_t C, double *out) {
    if (C != q->h_C || !q->gemm)
        return llmq_errorf(LLMQ_ERR_ARG, "blocks: an error sum of width %lld without its Hessian (%lld)", (long long)C,
                           (long long)q->h_C);
    struct llmq_ops *ops = llmq_block_ops(q->b);
    const int64_t step = qf_rows(llmq_ops_backend(ops));
    double s = 0;
    enum llmq_status st = LLMQ_OK;
    for (int64_t r0 = 0; r0 < R && !st; r0 += step) {
        const int64_t n = R - r0 < step ? R - r0 : step;
        st = llmq_ops_upload(ops, &q->dl, 0, Dl + r0 * C, n * C);
        if (!st)
            st = llmq_gemm_dev_f32(q->gemm, false, false, n, C, C, 1.0f, q->dl.data, C, q->h.data, C, 0.0f, q->t.data,
                                   C);
        if (!st) st = llmq_ops_dot_f64(ops, &q->dl, &q->t, n * C, &s);
    }
    if (!st) *out = s;
    return st;
}
