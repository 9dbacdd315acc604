// quant/qblocks.c — quant/qblocks.h: quantize's decoder-block passes through kernels/block.h, over calibration
// activations resident where the block computes.
#include "quant/qblocks.h"

#include "calib/model/devblock.h"
#include "common/log.h"
#include "kernels/block.h"
#include "kernels/gemm.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

struct llmq_qblocks {
    struct llmq_block *b;
    struct llmq_ops_buf x; // (N, D) the block input, where the block computes
    const struct llmq_calib_data *d;
    int64_t D, mb; // n_embd, sequences per block call
    bool cpu;      // the CPU backend (the test hook): its products run single-threaded, as inside a forward pass
    double load_s, pass_s, sums_s; // llmq_qblocks_times
    bool x_is_h; // x holds the attention half's output h (llmq_qblocks_apply_attn), not the block input
    // the error sums (llmq_qblocks_quad_form): the last Hessian where the block computes, row chunks of D and D·H
    struct llmq_ops_buf h, dl, t; // (Cmax, Cmax), (QF_ROWS, Cmax) x 2
    int64_t h_C;                  // the width of the Hessian in h; 0: none yet
    struct llmq_gemm_dev *gemm;   // its own products, plain FP32 (whatever LLMQ_BLOCK_MATH says of the block's)
};

// Rows of D per product of the error sums: quant/quantize.c quad_form's 256 on the CPU (the same products, so the
// same bits), larger chunks on the device.
static int64_t qf_rows(enum llmq_backend be) { return be == LLMQ_BACKEND_CUDA ? 2048 : 256; }

// The widest block input (the Hessians' C).
static int64_t c_max(const struct llmq_block_shape *sh) {
    const int64_t Dq = sh->n_head * sh->head_dim;
    int64_t c = sh->n_embd > sh->n_ff ? sh->n_embd : sh->n_ff;
    return c > Dq ? c : Dq;
}

// The ways passes() runs a micro-batch.
enum pass_kind {
    GATHER,  // llmq_block_gather (x read; from the block input)
    FORWARD, // llmq_block_forward (x <- block(x), sums of every input when any)
    ATTN,    // llmq_block_attn (x <- h), then the ffn inputs' sums from h
    FFN,     // llmq_block_ffn without apply (x = h read)
    FFN_OUT, // llmq_block_ffn with apply (x <- h + MLP(h))
};

static const unsigned SUMS = LLMQ_BLOCK_SUM_GRAM | LLMQ_BLOCK_SUM_COLS;

static int64_t micro_batch(int64_t n_seq, int64_t mb) { return mb < 1 ? 1 : mb < n_seq ? mb : n_seq; }

// Why the run's method keeps forward.c ("" when it can take the block path).
static const char *method_refusal(const struct llmq_quantize_opts *o) {
    if (o->method == LLMQ_QMETHOD_AWQ || o->method == LLMQ_QMETHOD_AWQ_GPTQ)
        return "AWQ's scale and clip search runs on calib/model/forward.c (quant/quantize.h \"Decoder blocks\")";
    if (o->method == LLMQ_QMETHOD_GPTQ && o->gptaq) return "GPTAQ's full-precision stream is not on the block path";
    return "";
}

int64_t llmq_qblocks_bytes(const struct llmq_model *m, const struct llmq_quantize_opts *o, int64_t n_seq,
                           int64_t seqlen) {
    float *ff = malloc((size_t)(m->hp.head_dim / 2 + 1) * sizeof(float));
    struct llmq_block_shape sh;
    char why[256];
    int64_t bytes = -1;
    if (ff && n_seq >= 1 && seqlen >= 1 && !method_refusal(o)[0] &&
        llmq_devblock_supported(m, ff, &sh, why, sizeof why))
        bytes = llmq_block_bytes(LLMQ_BACKEND_CUDA, &sh, micro_batch(n_seq, o->micro_batch) * seqlen, seqlen, SUMS) +
                (n_seq * seqlen * m->hp.n_embd + c_max(&sh) * (c_max(&sh) + 2 * qf_rows(LLMQ_BACKEND_CUDA))) *
                    (int64_t)sizeof(float); // x; the Hessian and the error sums' chunks
    free(ff);
    return bytes;
}

// The block path's reason to stay on forward.c for this run, into why ("" when it can take it), with *sh for it.
static enum llmq_status plan(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                             const struct llmq_calib_data *d, enum llmq_backend be, float *ff,
                             struct llmq_block_shape *sh, char *why, size_t cap) {
    snprintf(why, cap, "%s", method_refusal(o));
    if (why[0] || !llmq_devblock_supported(m, ff, sh, why, cap) || be != LLMQ_BACKEND_CUDA) return LLMQ_OK;
    struct llmq_device_info dev = {0};
    enum llmq_status st = llmq_cuda_device_info(0, &dev);
    if (st) return st;
    const int64_t budget = (int64_t)(dev.free_mem / 2), need = llmq_qblocks_bytes(m, o, d->n_seq, d->seqlen);
    if (need > budget)
        snprintf(why, cap,
                 "the %lld calibration tokens' activations and the block buffers (%.0f MiB) exceed half of the "
                 "device's free memory (%.0f MiB)",
                 (long long)(d->n_seq * d->seqlen), (double)need / 1048576.0, (double)budget / 1048576.0);
    return LLMQ_OK;
}

enum llmq_status llmq_qblocks_open(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                   const struct llmq_calib_data *d, struct llmq_qblocks **out) {
    *out = NULL;
    bool want, hook;
    enum llmq_backend be;
    if (d->n_seq < 1) return LLMQ_OK; // no calibration: no passes
    enum llmq_status st = llmq_devblock_want("LLMQ_QUANT_BLOCK", "quantize", o->backend, &want, &hook, &be);
    if (st || !want) return st;
    char why[512] = "";
    struct llmq_block_shape sh;
    float *ff = malloc((size_t)(m->hp.head_dim / 2 + 1) * sizeof(float)); // the shape's rope_ff
    if (!ff) return llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory");
    st = plan(m, o, d, be, ff, &sh, why, sizeof why);
    if (!st && why[0]) llmq_devblock_info_fallback("quantize", o->backend, why);
    struct llmq_qblocks *q = NULL;
    if (!st && !why[0] && !(q = calloc(1, sizeof *q))) st = llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory");
    if (q) {
        q->d = d;
        q->D = m->hp.n_embd;
        q->mb = micro_batch(d->n_seq, o->micro_batch);
        q->cpu = be == LLMQ_BACKEND_CPU;
        st = llmq_block_init(be, &sh, q->mb * d->seqlen, d->seqlen, SUMS, &q->b);
        if (!st) st = llmq_devblock_math(q->b, "quantize");
        struct llmq_ops *ops = st ? NULL : llmq_block_ops(q->b);
        const int64_t cm = c_max(&sh);
        if (!st) st = llmq_ops_buf_alloc(ops, d->n_seq * d->seqlen * q->D, &q->x);
        if (!st) st = llmq_ops_buf_alloc(ops, cm * cm, &q->h);
        if (!st) st = llmq_ops_buf_alloc(ops, qf_rows(be) * cm, &q->dl);
        if (!st) st = llmq_ops_buf_alloc(ops, qf_rows(be) * cm, &q->t);
        if (!st) st = llmq_gemm_dev_init(be, llmq_ops_stream(ops), &q->gemm);
        if (!st)
            llmq_info("quantize: decoder blocks on %s through kernels/block.h%s: %lld sequences resident, "
                      "micro-batches of %lld, %.0f MiB where the blocks compute",
                      llmq_backend_name(be), hook ? " (LLMQ_QUANT_BLOCK=cpu, the test hook)" : "", (long long)d->n_seq,
                      (long long)q->mb, (double)llmq_qblocks_bytes(m, o, d->n_seq, d->seqlen) / 1048576.0);
    }
    free(ff);
    if (st) {
        llmq_qblocks_free(q);
        return st;
    }
    *out = q;
    return LLMQ_OK;
}

void llmq_qblocks_free(struct llmq_qblocks *q) {
    if (!q) return;
    llmq_block_free(q->b); // waits for its queued work: the buffers are free to go
    llmq_ops_buf_free(&q->x);
    llmq_ops_buf_free(&q->h);
    llmq_ops_buf_free(&q->dl);
    llmq_ops_buf_free(&q->t);
    llmq_gemm_dev_free(q->gemm);
    free(q);
}

enum llmq_status llmq_qblocks_put_x(struct llmq_qblocks *q, const float *x) {
    enum llmq_status st = llmq_ops_upload(llmq_block_ops(q->b), &q->x, 0, x, q->x.n);
    return st ? st : llmq_ops_sync(llmq_block_ops(q->b));
}

enum llmq_status llmq_qblocks_get_x(struct llmq_qblocks *q, float *x) {
    return llmq_ops_download(llmq_block_ops(q->b), x, &q->x, 0, q->x.n);
}

enum llmq_status llmq_qblocks_load(struct llmq_qblocks *q, const struct llmq_layer *ly, int n_threads) {
    const double t0 = llmq_now_s();
    enum llmq_status st = llmq_devblock_load(q->b, ly, n_threads);
    q->load_s += llmq_now_s() - t0;
    return st;
}

enum llmq_status llmq_qblocks_set_linear(struct llmq_qblocks *q, enum llmq_linear k, const float *w) {
    const double t0 = llmq_now_s();
    enum llmq_status st = llmq_block_set_weight(q->b, (enum llmq_block_weight)k, w);
    q->load_s += llmq_now_s() - t0;
    return st;
}

enum llmq_status llmq_qblocks_hessian(struct llmq_qblocks *q, int slot, float *H) {
    const double t0 = llmq_now_s();
    const int64_t C = llmq_block_gram_dim(q->b, (enum llmq_block_gram)slot);
    q->h_C = 0;
    enum llmq_status st = llmq_block_hessian(q->b, (enum llmq_block_gram)slot, 2.0 / (double)q->d->n_seq, &q->h);
    if (!st) st = llmq_ops_download(llmq_block_ops(q->b), H, &q->h, 0, C * C);
    if (!st) q->h_C = C;
    q->sums_s += llmq_now_s() - t0;
    return st;
}

enum llmq_status llmq_qblocks_quad_form(struct llmq_qblocks *q, const float *Dl, int64_t R, int64_t C, double *out) {
    if (C != q->h_C)
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: an error sum of width %lld without its Hessian (%lld)",
                           (long long)C, (long long)q->h_C);
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

void llmq_qblocks_times(const struct llmq_qblocks *q, double *load, double *passes, double *sums) {
    *load += q->load_s;
    *passes += q->pass_s;
    *sums += q->sums_s;
}

// Every micro-batch of the resident sequences through the block as `kind` says, the sums of `inputs` gathered.
static enum llmq_status run_one(struct llmq_qblocks *q, enum pass_kind kind, const struct llmq_ops_buf *v, int64_t ns,
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

static enum llmq_status passes(struct llmq_qblocks *q, unsigned inputs, enum pass_kind kind) {
    const int64_t S = q->d->seqlen, n_seq = q->d->n_seq;
    const double t0 = llmq_now_s();
    const int blas = q->cpu ? openblas_get_num_threads() : 1;
    if (blas != 1) openblas_set_num_threads(1);
    enum llmq_status st = inputs ? llmq_block_sums_zero(q->b) : LLMQ_OK;
    for (int64_t s0 = 0; !st && s0 < n_seq; s0 += q->mb) {
        const int64_t ns = n_seq - s0 < q->mb ? n_seq - s0 : q->mb;
        const struct llmq_ops_buf v = llmq_ops_buf_view(&q->x, s0 * S * q->D, ns * S * q->D);
        st = run_one(q, kind, &v, ns, S, inputs);
    }
    if (!st) st = llmq_ops_sync(llmq_block_ops(q->b)); // the device's time is the pass's
    if (blas != 1) openblas_set_num_threads(blas);
    q->pass_s += llmq_now_s() - t0;
    return st;
}

// The sums of `inputs` of block l into s, timed.
static enum llmq_status take(struct llmq_qblocks *q, int64_t l, unsigned inputs, struct llmq_calib_stats *s) {
    const double t0 = llmq_now_s();
    enum llmq_status st = llmq_calib_take_block_sums(q->b, q->d, l, inputs, s);
    q->sums_s += llmq_now_s() - t0;
    return st;
}

static const unsigned FFN_INPUTS = (1u << LLMQ_CALIB_SLOT_GATE) | (1u << LLMQ_CALIB_SLOT_DOWN);

enum llmq_status llmq_qblocks_gather(struct llmq_qblocks *q, int64_t l, unsigned slots, struct llmq_calib_stats *s) {
    if (q->x_is_h && (slots & ~FFN_INPUTS))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: blk.%lld: the attention inputs are gone (x holds its output)",
                           (long long)l);
    enum llmq_status st = passes(q, slots, q->x_is_h ? FFN : GATHER);
    return st ? st : take(q, l, slots, s);
}

enum llmq_status llmq_qblocks_apply_attn(struct llmq_qblocks *q, int64_t l, unsigned slots,
                                         struct llmq_calib_stats *s) {
    if (q->x_is_h || (slots & ~FFN_INPUTS))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: blk.%lld: apply_attn twice, or of inputs %#x", (long long)l, slots);
    enum llmq_status st = passes(q, slots, ATTN);
    q->x_is_h = true; // whatever happened: x is no longer the block input
    return st || !slots ? st : take(q, l, slots, s);
}

enum llmq_status llmq_qblocks_advance(struct llmq_qblocks *q, int64_t l, struct llmq_calib_stats *s) {
    const unsigned inputs = s ? (q->x_is_h ? FFN_INPUTS : LLMQ_BLOCK_INPUTS_ALL) : 0u;
    enum llmq_status st = passes(q, inputs, q->x_is_h ? FFN_OUT : FORWARD);
    q->x_is_h = false;
    return st || !s ? st : take(q, l, inputs, s);
}
