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
    int h_gram;                   // AWQ: h holds input h_gram's XᵀX unscaled (the Gram-form loss's G); -1: not
    struct llmq_gemm_dev *gemm;   // its own products, plain FP32 (whatever LLMQ_BLOCK_MATH says of the block's)
    // AWQ's search (opts.awq): the fp pass's outputs, a micro-batch's h and candidate output, the saved originals of a
    // scale group's linears (at their offsets in wsave), the Gram-form Δ, a candidate's scales
    struct llmq_ops_buf afp, mfp, hs, cout, wsave, delta, sc;
    int64_t wsave_off[LLMQ_LIN_COUNT];
    unsigned saved; // the linears whose originals wsave holds
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

// Floats of AWQ's buffers for shape sh: afp, mfp (N, D), hs, cout (mb·S, D), wsave (q, k, v or gate, up), delta (the
// widest single linear), sc (the widest input).
static int64_t awq_floats(const struct llmq_block_shape *sh, int64_t N, int64_t mbS) {
    const int64_t D = sh->n_embd, F = sh->n_ff, Dq = sh->n_head * sh->head_dim, Dkv = sh->n_head_kv * sh->head_dim;
    const int64_t qkv = (Dq + 2 * Dkv) * D, gu = 2 * F * D, single = D * (Dq > F ? Dq : F);
    return 2 * N * D + 2 * mbS * D + (qkv > gu ? qkv : gu) + single + c_max(sh);
}

// Bytes on backend be for shape sh (see llmq_blocks_bytes).
static int64_t bytes_for(enum llmq_backend be, const struct llmq_block_shape *sh, const struct llmq_blocks_opts *o,
                         int64_t n_seq, int64_t seqlen, int64_t D, bool streamed) {
    const int64_t mb = micro_batch(n_seq, o->micro_batch), cm = c_max(sh);
    const int64_t x = (streamed ? mb : n_seq) * seqlen * D;
    int64_t extra = o->hessians ? cm * (cm + 2 * qf_rows(be)) : 0; // the Hessian, the error sums' chunks
    if (o->awq) extra += awq_floats(sh, n_seq * seqlen, mb * seqlen);
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
    if (o->awq && *streamed)
        snprintf(why, cap,
                 "AWQ's search needs the activations and its outputs resident (%.0f MiB), more than %s (%.0f MiB)",
                 (double)res / 1048576.0, o->max_vram ? "--max-vram" : "half of the device's free memory",
                 (double)budget / 1048576.0);
    else if (str > budget)
        snprintf(why, cap,
                 "even with the activations streamed from the host the block buffers (%.0f MiB) exceed %s (%.0f MiB)",
                 (double)str / 1048576.0, o->max_vram ? "--max-vram" : "half of the device's free memory",
                 (double)budget / 1048576.0);
    return LLMQ_OK;
}

// AWQ's buffers (awq_floats), each on its own.
static enum llmq_status alloc_awq(struct llmq_blocks *q, const struct llmq_block_shape *sh) {
    struct llmq_ops *ops = llmq_block_ops(q->b);
    const int64_t D = sh->n_embd, F = sh->n_ff, Dq = sh->n_head * sh->head_dim, Dkv = sh->n_head_kv * sh->head_dim;
    const int64_t N = q->d->n_seq * q->d->seqlen, mbS = q->mb * q->d->seqlen;
    const int64_t qkv = (Dq + 2 * Dkv) * D, gu = 2 * F * D;
    enum llmq_status st = llmq_ops_buf_alloc(ops, N * D, &q->afp);
    if (!st) st = llmq_ops_buf_alloc(ops, N * D, &q->mfp);
    if (!st) st = llmq_ops_buf_alloc(ops, mbS * D, &q->hs);
    if (!st) st = llmq_ops_buf_alloc(ops, mbS * D, &q->cout);
    if (!st) st = llmq_ops_buf_alloc(ops, qkv > gu ? qkv : gu, &q->wsave);
    if (!st) st = llmq_ops_buf_alloc(ops, D * (Dq > F ? Dq : F), &q->delta);
    if (!st) st = llmq_ops_buf_alloc(ops, c_max(sh), &q->sc);
    return st;
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
    if (!st && o->awq) st = alloc_awq(q, sh);
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
                                  .h_gram = -1,
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
    struct llmq_ops_buf *awq[] = {&q->afp, &q->mfp, &q->hs, &q->cout, &q->wsave, &q->delta, &q->sc};
    for (size_t i = 0; i < sizeof awq / sizeof awq[0]; i++) llmq_ops_buf_free(awq[i]);
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
    q->h_gram = -1;
    enum llmq_status st = llmq_block_hessian(q->b, (enum llmq_block_gram)slot, 2.0 / (double)q->d->n_seq, &q->h);
    if (!st) st = llmq_ops_download(llmq_block_ops(q->b), H, &q->h, 0, C * C);
    if (!st) q->h_C = C;
    q->sums_s += llmq_now_s() - t0;
    return st;
}

// Σ_r d_r H d_rᵀ for Δ (R, C) with H = q->h: Δ from the host (Dl, uploaded in row chunks into q->dl) or, Dl NULL,
// where the block computes (dev, multiplied chunk by chunk in place).
static enum llmq_status quad_form(struct llmq_blocks *q, const float *Dl, const struct llmq_ops_buf *dev, int64_t R,
                                  int64_t C, double *out) {
    if (C != q->h_C || !q->gemm)
        return llmq_errorf(LLMQ_ERR_ARG, "blocks: an error sum of width %lld without its Hessian (%lld)", (long long)C,
                           (long long)q->h_C);
    struct llmq_ops *ops = llmq_block_ops(q->b);
    const int64_t step = qf_rows(llmq_ops_backend(ops));
    double s = 0;
    enum llmq_status st = LLMQ_OK;
    for (int64_t r0 = 0; r0 < R && !st; r0 += step) {
        const int64_t n = R - r0 < step ? R - r0 : step;
        const struct llmq_ops_buf d = Dl ? llmq_ops_buf_view(&q->dl, 0, n * C) : llmq_ops_buf_view(dev, r0 * C, n * C);
        if (Dl) st = llmq_ops_upload(ops, &q->dl, 0, Dl + r0 * C, n * C);
        if (!st)
            st = llmq_gemm_dev_f32(q->gemm, false, false, n, C, C, 1.0f, d.data, C, q->h.data, C, 0.0f, q->t.data, C);
        if (!st) st = llmq_ops_dot_f64(ops, &d, &q->t, n * C, &s);
    }
    if (!st) *out = s;
    return st;
}

enum llmq_status llmq_blocks_quad_form(struct llmq_blocks *q, const float *Dl, int64_t R, int64_t C, double *out) {
    return quad_form(q, Dl, NULL, R, C, out);
}

enum llmq_status llmq_blocks_set_hessian(struct llmq_blocks *q, const float *H, int64_t C) {
    if (!q->h.data || C < 1 || C * C > q->h.n)
        return llmq_errorf(LLMQ_ERR_ARG, "blocks: a Hessian of width %lld (opened without, or too wide)", (long long)C);
    q->h_C = 0;
    q->h_gram = -1;
    enum llmq_status st = llmq_ops_upload(llmq_block_ops(q->b), &q->h, 0, H, C * C);
    if (!st) q->h_C = C;
    return st;
}

// ---- AWQ's scale search
// ----------------------------------------------------------------------------------------------

// (R, C) of linear k.
static void lin_shape(struct llmq_blocks *q, enum llmq_linear k, int64_t *R, int64_t *C) {
    const enum llmq_block_gram in = k == LLMQ_LIN_O      ? LLMQ_BLOCK_GRAM_O
                                    : k == LLMQ_LIN_DOWN ? LLMQ_BLOCK_GRAM_DOWN
                                                         : LLMQ_BLOCK_GRAM_QKV; // gate/up's width is D too
    *C = llmq_block_gram_dim(q->b, in);
    *R = llmq_block_weight_size(q->b, (enum llmq_block_weight)k) / *C;
}

static enum llmq_status awq_ready(const struct llmq_blocks *q, const char *what) {
    if (!q->afp.data || q->streamed || q->x_is_h)
        return llmq_errorf(LLMQ_ERR_ARG, "blocks: %s: not opened for AWQ, streamed, or x holds h", what);
    return LLMQ_OK;
}

// Micro-batch s0 (ns sequences): its attention output into afp and MLP output into mfp with the sums of every input,
// and the rows t = k·step (k = 0, 1, ...) it holds of each input asked for into rows[g] + (t / step)·C_g.
static enum llmq_status awq_fp_batch(struct llmq_blocks *q, int64_t s0, int64_t ns, int64_t step,
                                     float *const rows[4]) {
    const int64_t S = q->d->seqlen, D = q->D, n = ns * S, lo = s0 * S, hi = lo + n;
    struct llmq_ops *ops = llmq_block_ops(q->b);
    const struct llmq_ops_buf x = llmq_ops_buf_view(&q->x, lo * D, n * D),
                              a = llmq_ops_buf_view(&q->afp, lo * D, n * D),
                              m = llmq_ops_buf_view(&q->mfp, lo * D, n * D);
    const unsigned attn_in = (1u << LLMQ_BLOCK_GRAM_QKV) | (1u << LLMQ_BLOCK_GRAM_O);
    enum llmq_status st = llmq_block_attn_out(q->b, &x, ns, S, attn_in, &a);
    for (int half = 0; half < 2 && !st; half++) {
        if (half == 1) { // h = x + attn (forward.c's x += attn), then the MLP of it
            if (!(st = llmq_ops_copy(ops, &q->hs, &x, n * D))) st = llmq_ops_add(ops, &q->hs, &a, n * D);
            if (!st) st = llmq_block_mlp_out(q->b, &q->hs, ns, S, FFN_INPUTS, &m);
        }
        const int64_t t0 = (lo + step - 1) / step * step, nb = t0 < hi ? (hi - 1 - t0) / step + 1 : 0;
        for (int g = 2 * half; g < 2 * half + 2 && !st && nb > 0; g++)
            if (rows[g]) {
                const int64_t C = llmq_block_gram_dim(q->b, (enum llmq_block_gram)g);
                st = llmq_block_input_rows(q->b, (enum llmq_block_gram)g, t0 - lo, step, nb, rows[g] + t0 / step * C);
            }
    }
    return st;
}

enum llmq_status llmq_blocks_awq_fp(struct llmq_blocks *q, int64_t l, int64_t step, float *const rows[4],
                                    struct llmq_calib_stats *s) {
    enum llmq_status st = awq_ready(q, "awq_fp");
    if (st) return st;
    if (step < 1) return llmq_errorf(LLMQ_ERR_ARG, "blocks: awq_fp: step %lld", (long long)step);
    const double t0 = llmq_now_s();
    const int blas = q->cpu ? openblas_get_num_threads() : 1;
    if (blas != 1) openblas_set_num_threads(1);
    st = llmq_block_sums_zero(q->b);
    q->h_gram = -1; // new sums: the Gram-form loss's G is made again
    for (int64_t s0 = 0; !st && s0 < q->d->n_seq; s0 += q->mb) {
        const int64_t ns = q->d->n_seq - s0 < q->mb ? q->d->n_seq - s0 : q->mb;
        st = awq_fp_batch(q, s0, ns, step, rows);
    }
    if (!st) st = llmq_ops_sync(llmq_block_ops(q->b));
    if (blas != 1) openblas_set_num_threads(blas);
    q->pass_s += llmq_now_s() - t0;
    return st ? st : take(q, l, LLMQ_BLOCK_INPUTS_ALL, s);
}

enum llmq_status llmq_blocks_awq_save(struct llmq_blocks *q, unsigned mask) {
    enum llmq_status st = awq_ready(q, "awq_save");
    int64_t off = 0;
    q->saved = 0;
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        if (!(mask & (1u << k))) continue;
        const int64_t n = llmq_block_weight_size(q->b, (enum llmq_block_weight)k);
        if (off + n > q->wsave.n)
            return llmq_errorf(LLMQ_ERR_ARG, "blocks: awq_save: linears %#x do not fit the saved buffer", mask);
        const struct llmq_ops_buf w = llmq_block_weight_buf(q->b, (enum llmq_block_weight)k),
                                  dst = llmq_ops_buf_view(&q->wsave, off, n);
        st = llmq_ops_copy(llmq_block_ops(q->b), &dst, &w, n);
        q->wsave_off[k] = off;
        off += n;
        if (!st) q->saved |= 1u << k;
    }
    return st;
}

enum llmq_status llmq_blocks_awq_restore(struct llmq_blocks *q, unsigned mask) {
    enum llmq_status st = LLMQ_OK;
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        if (!(mask & (1u << k))) continue;
        if (!(q->saved & (1u << k)))
            return llmq_errorf(LLMQ_ERR_ARG, "blocks: awq_restore: %s was not saved", llmq_linear_name(k));
        const int64_t n = llmq_block_weight_size(q->b, (enum llmq_block_weight)k);
        const struct llmq_ops_buf w = llmq_block_weight_buf(q->b, (enum llmq_block_weight)k),
                                  src = llmq_ops_buf_view(&q->wsave, q->wsave_off[k], n);
        st = llmq_ops_copy(llmq_block_ops(q->b), &w, &src, n);
    }
    return st;
}

// dst (R, C) := the AutoAWQ-grid candidate of W with the scales s (C) from the host (minus_w: its Δ from W).
static enum llmq_status grid_candidate(struct llmq_blocks *q, const struct llmq_ops_buf *W, const float *s, int64_t R,
                                       int64_t C, int bits, int64_t G, bool minus_w, const struct llmq_ops_buf *dst) {
    struct llmq_ops *ops = llmq_block_ops(q->b);
    enum llmq_status st = llmq_ops_upload(ops, &q->sc, 0, s, C);
    return st ? st : llmq_ops_awq_candidate(ops, W, &q->sc, R, C, G, bits, minus_w, dst);
}

enum llmq_status llmq_blocks_awq_candidate(struct llmq_blocks *q, enum llmq_linear k, const float *s, int bits,
                                           int64_t G, const float *wc) {
    const double t0 = llmq_now_s();
    int64_t R, C;
    lin_shape(q, k, &R, &C);
    enum llmq_status st = LLMQ_OK;
    if (wc) {
        st = llmq_block_set_weight(q->b, (enum llmq_block_weight)k, wc);
    } else if (!(q->saved & (1u << k))) {
        st = llmq_errorf(LLMQ_ERR_ARG, "blocks: awq_candidate: %s was not saved", llmq_linear_name(k));
    } else {
        const struct llmq_ops_buf src = llmq_ops_buf_view(&q->wsave, q->wsave_off[k], R * C),
                                  w = llmq_block_weight_buf(q->b, (enum llmq_block_weight)k);
        st = grid_candidate(q, &src, s, R, C, bits, G, false, &w);
    }
    q->load_s += llmq_now_s() - t0;
    return st;
}

enum llmq_status llmq_blocks_awq_loss(struct llmq_blocks *q, bool mlp, double *loss) {
    enum llmq_status st = awq_ready(q, "awq_loss");
    if (st) return st;
    const int64_t S = q->d->seqlen, D = q->D, N = q->d->n_seq * S;
    struct llmq_ops *ops = llmq_block_ops(q->b);
    const double t0 = llmq_now_s();
    const int blas = q->cpu ? openblas_get_num_threads() : 1;
    if (blas != 1) openblas_set_num_threads(1);
    double sum = 0.0;
    for (int64_t s0 = 0; !st && s0 < q->d->n_seq; s0 += q->mb) {
        const int64_t ns = q->d->n_seq - s0 < q->mb ? q->d->n_seq - s0 : q->mb, n = ns * S * D, off = s0 * S * D;
        const struct llmq_ops_buf x = llmq_ops_buf_view(&q->x, off, n), a = llmq_ops_buf_view(&q->afp, off, n),
                                  fp = mlp ? llmq_ops_buf_view(&q->mfp, off, n) : a;
        if (!mlp) {
            st = llmq_block_attn_out(q->b, &x, ns, S, 0u, &q->cout);
        } else {
            if (!(st = llmq_ops_copy(ops, &q->hs, &x, n))) st = llmq_ops_add(ops, &q->hs, &a, n);
            if (!st) st = llmq_block_mlp_out(q->b, &q->hs, ns, S, 0u, &q->cout);
        }
        if (!st) st = llmq_ops_sqdiff_f64(ops, &fp, &q->cout, n, &sum);
    }
    if (blas != 1) openblas_set_num_threads(blas);
    q->pass_s += llmq_now_s() - t0;
    if (!st) *loss = sum / (double)(N * D);
    return st;
}

enum llmq_status llmq_blocks_awq_gram_loss(struct llmq_blocks *q, enum llmq_linear k, const float *s, int bits,
                                           int64_t G, const float *dw, double *loss) {
    enum llmq_status st = awq_ready(q, "awq_gram_loss");
    if (st) return st;
    if (k != LLMQ_LIN_O && k != LLMQ_LIN_DOWN)
        return llmq_errorf(LLMQ_ERR_ARG, "blocks: awq_gram_loss of %s (o or down only)", llmq_linear_name(k));
    const double t0 = llmq_now_s();
    int64_t R, C;
    lin_shape(q, k, &R, &C);
    const enum llmq_block_gram in = k == LLMQ_LIN_O ? LLMQ_BLOCK_GRAM_O : LLMQ_BLOCK_GRAM_DOWN;
    const struct llmq_ops_buf w = llmq_block_weight_buf(q->b, (enum llmq_block_weight)k),
                              dl = llmq_ops_buf_view(&q->delta, 0, R * C);
    if (q->h_gram != (int)in) { // G = XᵀX of the input (f32), as quant/awq.c gram(); kept for the group's ratios
        q->h_C = 0;
        q->h_gram = -1;
        if (!(st = llmq_block_hessian(q->b, in, 1.0, &q->h))) q->h_C = C, q->h_gram = (int)in;
    }
    if (!st && !dw) st = grid_candidate(q, &w, s, R, C, bits, G, true, &dl);
    double sum = 0.0;
    if (!st) st = quad_form(q, dw, dw ? NULL : &dl, R, C, &sum);
    q->sums_s += llmq_now_s() - t0;
    if (!st) *loss = sum / ((double)(q->d->n_seq * q->d->seqlen) * (double)R);
    return st;
}

enum llmq_status llmq_blocks_awq_advance(struct llmq_blocks *q) {
    enum llmq_status st = awq_ready(q, "awq_advance");
    if (st) return st;
    const double t0 = llmq_now_s();
    struct llmq_ops *ops = llmq_block_ops(q->b);
    const int64_t n = q->d->n_seq * q->d->seqlen * q->D;
    if (!(st = llmq_ops_add(ops, &q->x, &q->afp, n))) st = llmq_ops_add(ops, &q->x, &q->mfp, n);
    if (!st) st = llmq_ops_sync(ops);
    q->pass_s += llmq_now_s() - t0;
    return st;
}
