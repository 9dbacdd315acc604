// kernels/block.c — the block forward of kernels/block.h: buffers, weights, and the pass as a sequence of
// kernels/gemm.h device-pointer products and kernels/ops.h ops, in calib/model/forward.c block()'s order (so that the
// CPU backend repeats its operations one by one); the sums' CPU half (the column sums' reference). The device half of
// the sums is kernels/block_cuda.cu.
#include "kernels/block.h"

#include "kernels/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Activation buffers, each (max_tokens, width).
enum { A_XN, A_Q, A_K, A_V, A_ATT, A_OUT, A_GATE, A_UP, A_COUNT };

struct llmq_block {
    enum llmq_backend be;
    struct llmq_block_shape s; // s.rope_ff points at ff
    float *ff;                 // (Dh/2) host copy of the frequency divisors
    int64_t max_tokens, max_seqlen;
    struct llmq_ops *ops;
    struct llmq_gemm_dev *gemm;
    struct llmq_ops_buf w[LLMQ_BLOCK_WEIGHT_COUNT]; // where the backend computes; empty when the shape has none
    bool loaded[LLMQ_BLOCK_WEIGHT_COUNT];
    struct llmq_ops_buf act[A_COUNT];
    struct llmq_ops_buf cos, sin;                    // (max_seqlen, Dh/2) RoPE tables
    unsigned sums;                                   // LLMQ_BLOCK_SUM_* flags
    struct llmq_ops_buf gsum[LLMQ_BLOCK_GRAM_COUNT]; // (C, C) doubles each, stored in 2 C² floats (SUM_GRAM)
    struct llmq_ops_buf gscratch;                    // CPU: (llmq_gram_scratch_rows(C), C); CUDA: (C, C) f32, max C
    struct llmq_ops_buf csum[LLMQ_BLOCK_GRAM_COUNT]; // (2, C) doubles each (Σ|x|, Σx²), in 4 C floats (SUM_COLS)
    struct llmq_ops_buf cbad;                        // (4) uint64 first non-finite index per input, in 8 floats
    int64_t rows;                                    // rows accumulated since llmq_block_sums_zero
};

static const char *const weight_names[LLMQ_BLOCK_WEIGHT_COUNT] = {
    "wq", "wk", "wv", "wo", "wgate", "wup", "wdown", "attn_norm", "ffn_norm", "bq", "bk", "bv", "q_norm", "k_norm"};

static int64_t weight_size(const struct llmq_block_shape *s, enum llmq_block_weight w) {
    const int64_t D = s->n_embd, F = s->n_ff, Dh = s->head_dim, Dq = s->n_head * Dh, Dkv = s->n_head_kv * Dh;
    switch (w) {
    case LLMQ_BLOCK_WQ: return Dq * D;
    case LLMQ_BLOCK_WK:
    case LLMQ_BLOCK_WV: return Dkv * D;
    case LLMQ_BLOCK_WO: return D * Dq;
    case LLMQ_BLOCK_WGATE:
    case LLMQ_BLOCK_WUP:
    case LLMQ_BLOCK_WDOWN: return F * D;
    case LLMQ_BLOCK_ATTN_NORM:
    case LLMQ_BLOCK_FFN_NORM: return D;
    case LLMQ_BLOCK_BQ: return s->qkv_bias ? Dq : 0;
    case LLMQ_BLOCK_BK:
    case LLMQ_BLOCK_BV: return s->qkv_bias ? Dkv : 0;
    case LLMQ_BLOCK_Q_NORM:
    case LLMQ_BLOCK_K_NORM: return s->qk_norm ? Dh : 0;
    default: return 0;
    }
}

static int64_t gram_dim(const struct llmq_block_shape *s, enum llmq_block_gram g) {
    return g == LLMQ_BLOCK_GRAM_O ? s->n_head * s->head_dim : g == LLMQ_BLOCK_GRAM_DOWN ? s->n_ff : s->n_embd;
}

int64_t llmq_block_weight_size(const struct llmq_block *b, enum llmq_block_weight w) { return weight_size(&b->s, w); }
int64_t llmq_block_gram_dim(const struct llmq_block *b, enum llmq_block_gram g) { return gram_dim(&b->s, g); }
struct llmq_ops *llmq_block_ops(struct llmq_block *b) {
    return b->ops;
}

// Floats per token of activation buffer i (A_XN ... A_UP).
static int64_t act_width(const struct llmq_block_shape *s, int i) {
    const int64_t D = s->n_embd, F = s->n_ff, Dq = s->n_head * s->head_dim, Dkv = s->n_head_kv * s->head_dim;
    const int64_t width[A_COUNT] = {D, Dq, Dkv, Dkv, Dq, D, F, F};
    return width[i];
}

// What alloc_all allocates, in bytes.
int64_t llmq_block_bytes(enum llmq_backend be, const struct llmq_block_shape *s, int64_t max_tokens, int64_t max_seqlen,
                         unsigned sums) {
    const bool gram = sums & LLMQ_BLOCK_SUM_GRAM, cols = sums & LLMQ_BLOCK_SUM_COLS;
    int64_t floats = 2 * max_seqlen * (s->head_dim / 2); // the RoPE tables
    for (int i = 0; i < A_COUNT; i++) floats += max_tokens * act_width(s, i);
    for (int i = 0; i < LLMQ_BLOCK_WEIGHT_COUNT; i++) floats += weight_size(s, (enum llmq_block_weight)i);
    int64_t cmax = 0;
    for (int g = 0; g < LLMQ_BLOCK_GRAM_COUNT; g++) {
        const int64_t C = gram_dim(s, (enum llmq_block_gram)g);
        if (C > cmax) cmax = C;
        floats += (gram ? 2 * C * C : 0) + (cols ? 4 * C : 0);
    }
    if (gram) floats += (be == LLMQ_BACKEND_CUDA ? cmax : llmq_gram_scratch_rows(cmax)) * cmax;
    if (cols) floats += 2 * LLMQ_BLOCK_GRAM_COUNT;
    return floats * (int64_t)sizeof(float);
}

static bool shape_ok(const struct llmq_block_shape *s) {
    const int64_t lim = 1LL << 24; // formats/llama/arch.h LLMQ_HPARAMS_MAX_DIM
    return s && s->n_embd >= 1 && s->n_embd <= lim && s->n_ff >= 1 && s->n_ff <= lim && s->n_head >= 1 &&
           s->n_head_kv >= 1 && s->n_head % s->n_head_kv == 0 && s->head_dim >= 2 && s->head_dim % 2 == 0 &&
           s->n_head * s->head_dim <= lim && s->rms_eps >= 0.0f && isfinite(s->attn_scale) && s->rope_theta > 0.0f &&
           s->rope_ff;
}

// Allocates the buffers (weights, activations, tables, Gram sums) and fills the RoPE tables.
static enum llmq_status alloc_all(struct llmq_block *b) {
    const struct llmq_block_shape *s = &b->s;
    const int64_t Dh = s->head_dim, T = b->max_tokens, half = Dh / 2;
    enum llmq_status st = LLMQ_OK;
    for (int i = 0; i < LLMQ_BLOCK_WEIGHT_COUNT && !st; i++) {
        const int64_t n = weight_size(s, (enum llmq_block_weight)i);
        if (n > 0) st = llmq_ops_buf_alloc(b->ops, n, &b->w[i]);
    }
    for (int i = 0; i < A_COUNT && !st; i++) st = llmq_ops_buf_alloc(b->ops, T * act_width(s, i), &b->act[i]);
    if (!st) st = llmq_ops_buf_alloc(b->ops, b->max_seqlen * half, &b->cos);
    if (!st) st = llmq_ops_buf_alloc(b->ops, b->max_seqlen * half, &b->sin);
    const bool gram = b->sums & LLMQ_BLOCK_SUM_GRAM, cols = b->sums & LLMQ_BLOCK_SUM_COLS;
    int64_t cmax = 0;
    for (int g = 0; g < LLMQ_BLOCK_GRAM_COUNT && !st; g++) {
        const int64_t C = gram_dim(s, (enum llmq_block_gram)g);
        if (C > cmax) cmax = C;
        if (gram) st = llmq_ops_buf_alloc(b->ops, 2 * C * C, &b->gsum[g]);
        if (!st && cols) st = llmq_ops_buf_alloc(b->ops, 4 * C, &b->csum[g]);
    }
    if (!st && gram)
        st = llmq_ops_buf_alloc(b->ops, (b->be == LLMQ_BACKEND_CUDA ? cmax : llmq_gram_scratch_rows(cmax)) * cmax,
                                &b->gscratch);
    if (!st && cols) st = llmq_ops_buf_alloc(b->ops, 2 * LLMQ_BLOCK_GRAM_COUNT, &b->cbad);
    if (!st && b->sums) st = llmq_block_sums_zero(b);
    if (st) return st;
    float *cs = malloc((size_t)(b->max_seqlen * half) * sizeof(float));
    float *sn = malloc((size_t)(b->max_seqlen * half) * sizeof(float));
    if (!cs || !sn) st = llmq_errorf(LLMQ_ERR_NOMEM, "block: out of memory for the RoPE tables");
    if (!st) {
        llmq_ops_rope_table(s->rope_theta, Dh, b->ff, 1.0f, b->max_seqlen, cs, sn);
        st = llmq_ops_upload(b->ops, &b->cos, 0, cs, b->max_seqlen * half);
    }
    if (!st) st = llmq_ops_upload(b->ops, &b->sin, 0, sn, b->max_seqlen * half);
    if (!st) st = llmq_ops_sync(b->ops); // the tables' host copies are freed below
    free(cs), free(sn);
    return st;
}

enum llmq_status llmq_block_init(enum llmq_backend be, const struct llmq_block_shape *s, int64_t max_tokens,
                                 int64_t max_seqlen, unsigned sums, struct llmq_block **out) {
    *out = NULL;
    if (!shape_ok(s) || max_tokens < 1 || max_tokens > (1LL << 30) || max_seqlen < 1 || max_seqlen > max_tokens ||
        max_seqlen > INT32_MAX || (sums & ~(LLMQ_BLOCK_SUM_GRAM | LLMQ_BLOCK_SUM_COLS)))
        return llmq_errorf(LLMQ_ERR_ARG,
                           "block: bad shape D %lld F %lld heads %lld / %lld head_dim %lld, max_tokens %lld "
                           "max_seqlen %lld, sums %#x",
                           s ? (long long)s->n_embd : 0, s ? (long long)s->n_ff : 0, s ? (long long)s->n_head : 0,
                           s ? (long long)s->n_head_kv : 0, s ? (long long)s->head_dim : 0, (long long)max_tokens,
                           (long long)max_seqlen, sums);
    struct llmq_block *b = calloc(1, sizeof *b);
    if (!b || !(b->ff = malloc((size_t)(s->head_dim / 2) * sizeof(float)))) {
        free(b);
        return llmq_errorf(LLMQ_ERR_NOMEM, "block: out of memory");
    }
    b->be = be;
    b->s = *s;
    memcpy(b->ff, s->rope_ff, (size_t)(s->head_dim / 2) * sizeof(float));
    b->s.rope_ff = b->ff;
    b->max_tokens = max_tokens;
    b->max_seqlen = max_seqlen;
    b->sums = sums;
    enum llmq_status st = llmq_ops_init(be, &b->ops);
    if (!st) st = llmq_gemm_dev_init(be, llmq_ops_stream(b->ops), &b->gemm);
    if (!st) st = alloc_all(b);
    if (st) {
        llmq_block_free(b);
        return st;
    }
    *out = b;
    return LLMQ_OK;
}

void llmq_block_free(struct llmq_block *b) {
    if (!b) return;
    if (b->ops) llmq_ops_sync(b->ops); // nothing queued may still read a buffer freed below
    for (int i = 0; i < LLMQ_BLOCK_WEIGHT_COUNT; i++) llmq_ops_buf_free(&b->w[i]);
    for (int i = 0; i < A_COUNT; i++) llmq_ops_buf_free(&b->act[i]);
    for (int g = 0; g < LLMQ_BLOCK_GRAM_COUNT; g++) llmq_ops_buf_free(&b->gsum[g]);
    for (int g = 0; g < LLMQ_BLOCK_GRAM_COUNT; g++) llmq_ops_buf_free(&b->csum[g]);
    llmq_ops_buf_free(&b->gscratch);
    llmq_ops_buf_free(&b->cbad);
    llmq_ops_buf_free(&b->cos);
    llmq_ops_buf_free(&b->sin);
    llmq_gemm_dev_free(b->gemm);
    llmq_ops_free(b->ops);
    free(b->ff);
    free(b);
}

enum llmq_status llmq_block_set_tf32(struct llmq_block *b, bool on) { return llmq_gemm_dev_set_tf32(b->gemm, on); }

enum llmq_status llmq_block_set_weight(struct llmq_block *b, enum llmq_block_weight w, const float *host) {
    if ((unsigned)w >= LLMQ_BLOCK_WEIGHT_COUNT || weight_size(&b->s, w) == 0 || !host)
        return llmq_errorf(LLMQ_ERR_ARG, "block: weight %s is not part of this block's shape",
                           (unsigned)w < LLMQ_BLOCK_WEIGHT_COUNT ? weight_names[w] : "?");
    enum llmq_status st = llmq_ops_upload(b->ops, &b->w[w], 0, host, weight_size(&b->s, w));
    b->loaded[w] = st == LLMQ_OK;
    return st;
}

// ---------------------------------------------------------------------------------------------
// The pass
// ---------------------------------------------------------------------------------------------

// Y (n, R) = X (n, C) · W[w]ᵀ + beta · Y, as forward.c linear_worker's sgemm with one thread.
static enum llmq_status linear(struct llmq_block *b, enum llmq_block_weight w, const struct llmq_ops_buf *X, int64_t n,
                               const struct llmq_ops_buf *Y, float beta) {
    const int64_t D = b->s.n_embd, F = b->s.n_ff, Dq = b->s.n_head * b->s.head_dim,
                  Dkv = b->s.n_head_kv * b->s.head_dim;
    const int64_t rows[7] = {Dq, Dkv, Dkv, D, F, F, D}, cols[7] = {D, D, D, Dq, D, D, F};
    return llmq_gemm_dev_f32(b->gemm, false, true, n, rows[w], cols[w], 1.0f, X->data, cols[w], b->w[w].data, cols[w],
                             beta, Y->data, rows[w]);
}

// The Gram sum g += Xᵀ X for X (n, C) (see kernels/block.h "Gram matrices").
static enum llmq_status gram_acc(struct llmq_block *b, enum llmq_block_gram g, const float *X, int64_t n) {
    const int64_t C = gram_dim(&b->s, g);
    double *acc = (double *)(void *)b->gsum[g].data;
    if (b->be != LLMQ_BACKEND_CUDA) return llmq_gram_acc_f64(LLMQ_BACKEND_CPU, X, n, C, b->gscratch.data, acc);
    for (int64_t t0 = 0; t0 < n; t0 += LLMQ_GRAM_MICRO_BATCH) {
        const int64_t nb = n - t0 < LLMQ_GRAM_MICRO_BATCH ? n - t0 : LLMQ_GRAM_MICRO_BATCH;
        enum llmq_status st = llmq_syrk_dev_f32(b->gemm, C, nb, 1.0f, X + t0 * C, C, 0.0f, b->gscratch.data, C);
        if (!st) st = llmq_block_cuda_acc_upper(llmq_ops_stream(b->ops), acc, b->gscratch.data, C);
        if (st) return st;
    }
    return LLMQ_OK;
}

void llmq_block_colsums_cpu(const float *x, int64_t n, int64_t C, int64_t row0, double *acc, uint64_t *bad) {
    for (int64_t t = 0; t < n; t++) {
        const float *r = x + t * C;
        for (int64_t c = 0; c < C; c++) {
            const float v = r[c];
            if (!isfinite(v) && (uint64_t)((row0 + t) * C + c) < *bad) *bad = (uint64_t)((row0 + t) * C + c);
            acc[c] += fabs((double)v);
            acc[C + c] += (double)v * (double)v;
        }
    }
}

// The sums of input g (X (n, C), the rows after the b->rows already summed): its Gram sum, its column sums.
static enum llmq_status sums_acc(struct llmq_block *b, enum llmq_block_gram g, const float *X, int64_t n) {
    const int64_t C = gram_dim(&b->s, g);
    enum llmq_status st = b->sums & LLMQ_BLOCK_SUM_GRAM ? gram_acc(b, g, X, n) : LLMQ_OK;
    if (st || !(b->sums & LLMQ_BLOCK_SUM_COLS)) return st;
    double *acc = (double *)(void *)b->csum[g].data;
    uint64_t *bad = (uint64_t *)(void *)b->cbad.data + g;
    if (b->be == LLMQ_BACKEND_CUDA) return llmq_block_cuda_colsums(llmq_ops_stream(b->ops), X, n, C, b->rows, acc, bad);
    llmq_block_colsums_cpu(X, n, C, b->rows, acc, bad);
    return LLMQ_OK;
}

static enum llmq_status check_pass(const struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq,
                                   int64_t seqlen, bool accumulate) {
    if (n_seq < 1 || seqlen < 1 || seqlen > b->max_seqlen || n_seq > b->max_tokens / seqlen)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "block: %lld sequences of %lld tokens (at most %lld tokens, sequences of %lld)",
                           (long long)n_seq, (long long)seqlen, (long long)b->max_tokens, (long long)b->max_seqlen);
    if (accumulate && !b->sums) return llmq_errorf(LLMQ_ERR_ARG, "block: sums asked of a block made without");
    for (int i = 0; i < LLMQ_BLOCK_WEIGHT_COUNT; i++)
        if (weight_size(&b->s, (enum llmq_block_weight)i) > 0 && !b->loaded[i])
            return llmq_errorf(LLMQ_ERR_ARG, "block: weight %s was never set", weight_names[i]);
    if (!x || !x->data || x->be != b->be || x->n < n_seq * seqlen * b->s.n_embd)
        return llmq_errorf(LLMQ_ERR_ARG, "block: x is not a buffer of %lld floats on %s", (long long)(n_seq * seqlen),
                           llmq_backend_name(b->be));
    return LLMQ_OK;
}

#define IN(g) (1u << (g)) // an input's bit in a mask of inputs (llmq_block_gather)

// q, k, v of xn = a[A_XN] (biases, q/k norms, RoPE) and their causal attention into a[A_ATT].
static enum llmq_status attention(struct llmq_block *b, int64_t n_seq, int64_t seqlen) {
    const struct llmq_block_shape *s = &b->s;
    const int64_t Dh = s->head_dim, Dq = s->n_head * Dh, Dkv = s->n_head_kv * Dh, n = n_seq * seqlen;
    struct llmq_ops_buf *a = b->act;
    struct llmq_ops *ops = b->ops;
    enum llmq_status st = LLMQ_OK;
    const float beta = s->qkv_bias ? 1.0f : 0.0f; // forward.c: y = b, then y += W x
    if (s->qkv_bias) st = llmq_ops_repeat_rows(ops, &b->w[LLMQ_BLOCK_BQ], &a[A_Q], n, Dq);
    if (!st && s->qkv_bias) st = llmq_ops_repeat_rows(ops, &b->w[LLMQ_BLOCK_BK], &a[A_K], n, Dkv);
    if (!st && s->qkv_bias) st = llmq_ops_repeat_rows(ops, &b->w[LLMQ_BLOCK_BV], &a[A_V], n, Dkv);
    if (!st) st = linear(b, LLMQ_BLOCK_WQ, &a[A_XN], n, &a[A_Q], beta);
    if (!st) st = linear(b, LLMQ_BLOCK_WK, &a[A_XN], n, &a[A_K], beta);
    if (!st) st = linear(b, LLMQ_BLOCK_WV, &a[A_XN], n, &a[A_V], beta);
    if (!st && s->qk_norm)
        st = llmq_ops_rmsnorm(ops, &a[A_Q], &b->w[LLMQ_BLOCK_Q_NORM], &a[A_Q], n * s->n_head, Dh, s->rms_eps, false);
    if (!st && s->qk_norm)
        st = llmq_ops_rmsnorm(ops, &a[A_K], &b->w[LLMQ_BLOCK_K_NORM], &a[A_K], n * s->n_head_kv, Dh, s->rms_eps, false);
    if (!st) st = llmq_ops_rope(ops, &a[A_Q], n_seq, seqlen, s->n_head, Dh, s->rope_neox, &b->cos, &b->sin);
    if (!st) st = llmq_ops_rope(ops, &a[A_K], n_seq, seqlen, s->n_head_kv, Dh, s->rope_neox, &b->cos, &b->sin);
    const struct llmq_ops_attn at = {.n_seq = n_seq,
                                     .seqlen = seqlen,
                                     .n_head = s->n_head,
                                     .n_head_kv = s->n_head_kv,
                                     .head_dim = Dh,
                                     .scale = s->attn_scale};
    if (!st) st = llmq_ops_attention(ops, &at, &a[A_Q], &a[A_K], &a[A_V], &a[A_ATT]);
    return st;
}

// x += Wo · Attn(RoPE(Nq(Wq·xn + bq)), RoPE(Nk(Wk·xn + bk)), Wv·xn + bv), xn = RMSNorm(x) · attn_norm; the inputs in
// acc summed on the way. gather (llmq_block_gather): x is only read, the pass stops after the last input acc needs,
// and h = x + Wo·att goes to a[A_OUT] (as a[A_OUT] += x: the same bits as x += a[A_OUT]).
static enum llmq_status attn_half(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                  unsigned acc, bool gather) {
    const int64_t D = b->s.n_embd, n = n_seq * seqlen;
    struct llmq_ops_buf *a = b->act;
    enum llmq_status st = llmq_ops_rmsnorm(b->ops, x, &b->w[LLMQ_BLOCK_ATTN_NORM], &a[A_XN], n, D, b->s.rms_eps, false);
    if (!st && (acc & IN(LLMQ_BLOCK_GRAM_QKV))) st = sums_acc(b, LLMQ_BLOCK_GRAM_QKV, a[A_XN].data, n);
    if (st || (gather && !(acc & ~IN(LLMQ_BLOCK_GRAM_QKV)))) return st;
    st = attention(b, n_seq, seqlen);
    if (!st && (acc & IN(LLMQ_BLOCK_GRAM_O))) st = sums_acc(b, LLMQ_BLOCK_GRAM_O, a[A_ATT].data, n);
    if (st || (gather && !(acc & (IN(LLMQ_BLOCK_GRAM_GATE) | IN(LLMQ_BLOCK_GRAM_DOWN))))) return st;
    st = linear(b, LLMQ_BLOCK_WO, &a[A_ATT], n, &a[A_OUT], 0.0f);
    if (!st) st = gather ? llmq_ops_add(b->ops, &a[A_OUT], x, n * D) : llmq_ops_add(b->ops, x, &a[A_OUT], n * D);
    return st;
}

// x = h + Wdown · (SiLU(Wgate·xn) · (Wup·xn)), xn = RMSNorm(h) · ffn_norm (h is x, or the gather's a[A_OUT]); the
// inputs in acc summed on the way. gather: x is not written, the pass stops after the last input acc needs.
static enum llmq_status mlp_half(struct llmq_block *b, const struct llmq_ops_buf *h, const struct llmq_ops_buf *x,
                                 int64_t n, unsigned acc, bool gather) {
    const int64_t D = b->s.n_embd, F = b->s.n_ff;
    struct llmq_ops_buf *a = b->act;
    enum llmq_status st = llmq_ops_rmsnorm(b->ops, h, &b->w[LLMQ_BLOCK_FFN_NORM], &a[A_XN], n, D, b->s.rms_eps, false);
    if (!st && (acc & IN(LLMQ_BLOCK_GRAM_GATE))) st = sums_acc(b, LLMQ_BLOCK_GRAM_GATE, a[A_XN].data, n);
    if (st || (gather && !(acc & IN(LLMQ_BLOCK_GRAM_DOWN)))) return st;
    st = linear(b, LLMQ_BLOCK_WGATE, &a[A_XN], n, &a[A_GATE], 0.0f);
    if (!st) st = linear(b, LLMQ_BLOCK_WUP, &a[A_XN], n, &a[A_UP], 0.0f);
    if (!st) st = llmq_ops_swiglu(b->ops, &a[A_GATE], &a[A_UP], &a[A_GATE], n * F);
    if (!st && (acc & IN(LLMQ_BLOCK_GRAM_DOWN))) st = sums_acc(b, LLMQ_BLOCK_GRAM_DOWN, a[A_GATE].data, n);
    if (st || gather) return st;
    st = linear(b, LLMQ_BLOCK_WDOWN, &a[A_GATE], n, &a[A_OUT], 0.0f);
    if (!st) st = llmq_ops_add(b->ops, x, &a[A_OUT], n * D);
    return st;
}

enum llmq_status llmq_block_forward(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                    bool accumulate) {
    const unsigned acc = accumulate ? LLMQ_BLOCK_INPUTS_ALL : 0u;
    enum llmq_status st = check_pass(b, x, n_seq, seqlen, accumulate);
    if (!st) st = attn_half(b, x, n_seq, seqlen, acc, false);
    if (!st) st = mlp_half(b, x, x, n_seq * seqlen, acc, false);
    if (!st && accumulate) b->rows += n_seq * seqlen;
    return st;
}

enum llmq_status llmq_block_attn(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                 unsigned inputs) {
    if (inputs & ~(IN(LLMQ_BLOCK_GRAM_QKV) | IN(LLMQ_BLOCK_GRAM_O)))
        return llmq_errorf(LLMQ_ERR_ARG, "block: attn: inputs %#x are not the attention half's", inputs);
    enum llmq_status st = check_pass(b, x, n_seq, seqlen, inputs != 0);
    if (!st) st = attn_half(b, x, n_seq, seqlen, inputs, false);
    if (!st && inputs) b->rows += n_seq * seqlen;
    return st;
}

enum llmq_status llmq_block_ffn(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                unsigned inputs, bool apply) {
    if ((inputs & ~(IN(LLMQ_BLOCK_GRAM_GATE) | IN(LLMQ_BLOCK_GRAM_DOWN))) || (!apply && !inputs))
        return llmq_errorf(LLMQ_ERR_ARG, "block: ffn: inputs %#x (apply %d): not the feed-forward half's", inputs,
                           (int)apply);
    enum llmq_status st = check_pass(b, x, n_seq, seqlen, inputs != 0);
    if (!st) st = mlp_half(b, x, x, n_seq * seqlen, inputs, !apply);
    if (!st && inputs) b->rows += n_seq * seqlen;
    return st;
}

enum llmq_status llmq_block_attn_out(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                     unsigned inputs, const struct llmq_ops_buf *out) {
    const int64_t D = b->s.n_embd, n = n_seq * seqlen;
    struct llmq_ops_buf *a = b->act;
    if (inputs & ~(IN(LLMQ_BLOCK_GRAM_QKV) | IN(LLMQ_BLOCK_GRAM_O)))
        return llmq_errorf(LLMQ_ERR_ARG, "block: attn_out: inputs %#x are not the attention half's", inputs);
    enum llmq_status st = check_pass(b, x, n_seq, seqlen, inputs != 0);
    if (!st && (!out || !out->data || out->be != b->be || out->n < n * D))
        st = llmq_errorf(LLMQ_ERR_ARG, "block: attn_out: out is not a buffer of %lld floats", (long long)(n * D));
    if (!st) st = llmq_ops_rmsnorm(b->ops, x, &b->w[LLMQ_BLOCK_ATTN_NORM], &a[A_XN], n, D, b->s.rms_eps, false);
    if (!st && (inputs & IN(LLMQ_BLOCK_GRAM_QKV))) st = sums_acc(b, LLMQ_BLOCK_GRAM_QKV, a[A_XN].data, n);
    if (!st) st = attention(b, n_seq, seqlen);
    if (!st && (inputs & IN(LLMQ_BLOCK_GRAM_O))) st = sums_acc(b, LLMQ_BLOCK_GRAM_O, a[A_ATT].data, n);
    if (!st) st = linear(b, LLMQ_BLOCK_WO, &a[A_ATT], n, out, 0.0f);
    if (!st && inputs) b->rows += n;
    return st;
}

enum llmq_status llmq_block_mlp_out(struct llmq_block *b, const struct llmq_ops_buf *h, int64_t n_seq, int64_t seqlen,
                                    unsigned inputs, const struct llmq_ops_buf *out) {
    const int64_t D = b->s.n_embd, F = b->s.n_ff, n = n_seq * seqlen;
    struct llmq_ops_buf *a = b->act;
    if (inputs & ~(IN(LLMQ_BLOCK_GRAM_GATE) | IN(LLMQ_BLOCK_GRAM_DOWN)))
        return llmq_errorf(LLMQ_ERR_ARG, "block: mlp_out: inputs %#x are not the feed-forward half's", inputs);
    enum llmq_status st = check_pass(b, h, n_seq, seqlen, inputs != 0);
    if (!st && (!out || !out->data || out->be != b->be || out->n < n * D))
        st = llmq_errorf(LLMQ_ERR_ARG, "block: mlp_out: out is not a buffer of %lld floats", (long long)(n * D));
    if (!st) st = llmq_ops_rmsnorm(b->ops, h, &b->w[LLMQ_BLOCK_FFN_NORM], &a[A_XN], n, D, b->s.rms_eps, false);
    if (!st && (inputs & IN(LLMQ_BLOCK_GRAM_GATE))) st = sums_acc(b, LLMQ_BLOCK_GRAM_GATE, a[A_XN].data, n);
    if (!st) st = linear(b, LLMQ_BLOCK_WGATE, &a[A_XN], n, &a[A_GATE], 0.0f);
    if (!st) st = linear(b, LLMQ_BLOCK_WUP, &a[A_XN], n, &a[A_UP], 0.0f);
    if (!st) st = llmq_ops_swiglu(b->ops, &a[A_GATE], &a[A_UP], &a[A_GATE], n * F);
    if (!st && (inputs & IN(LLMQ_BLOCK_GRAM_DOWN))) st = sums_acc(b, LLMQ_BLOCK_GRAM_DOWN, a[A_GATE].data, n);
    if (!st) st = linear(b, LLMQ_BLOCK_WDOWN, &a[A_GATE], n, out, 0.0f);
    if (!st && inputs) b->rows += n;
    return st;
}

enum llmq_status llmq_block_input_rows(struct llmq_block *b, enum llmq_block_gram g, int64_t first, int64_t step,
                                       int64_t n, float *host) {
    if ((unsigned)g >= LLMQ_BLOCK_GRAM_COUNT || n < 0 || first < 0 || step < 1 || (n > 0 && !host) ||
        (n > 0 && (first >= b->max_tokens || (b->max_tokens - 1 - first) / step < n - 1)))
        return llmq_errorf(LLMQ_ERR_ARG, "block: input_rows: input %d, %lld rows from %lld by %lld of %lld", (int)g,
                           (long long)n, (long long)first, (long long)step, (long long)b->max_tokens);
    const int64_t C = gram_dim(&b->s, g);
    const struct llmq_ops_buf *src = &b->act[g == LLMQ_BLOCK_GRAM_O      ? A_ATT
                                             : g == LLMQ_BLOCK_GRAM_DOWN ? A_GATE
                                                                         : A_XN];
    return llmq_ops_download_rows(b->ops, host, src, first * C, C, step * C, n);
}

struct llmq_ops_buf llmq_block_weight_buf(struct llmq_block *b, enum llmq_block_weight w) {
    if ((unsigned)w >= LLMQ_BLOCK_WEIGHT_COUNT || weight_size(&b->s, w) == 0) return (struct llmq_ops_buf){0};
    b->loaded[w] = true;
    return b->w[w];
}

enum llmq_status llmq_block_gather(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                   unsigned inputs) {
    if (inputs == 0 || (inputs & ~LLMQ_BLOCK_INPUTS_ALL))
        return llmq_errorf(LLMQ_ERR_ARG, "block: gather: bad mask of inputs %#x", inputs);
    enum llmq_status st = check_pass(b, x, n_seq, seqlen, true);
    if (!st) st = attn_half(b, x, n_seq, seqlen, inputs, true);
    if (!st && (inputs & (IN(LLMQ_BLOCK_GRAM_GATE) | IN(LLMQ_BLOCK_GRAM_DOWN))))
        st = mlp_half(b, &b->act[A_OUT], x, n_seq * seqlen, inputs, true);
    if (!st) b->rows += n_seq * seqlen;
    return st;
}

// ---------------------------------------------------------------------------------------------
// Gram sums
// ---------------------------------------------------------------------------------------------

enum llmq_status llmq_block_sums_zero(struct llmq_block *b) {
    if (!b->sums) return llmq_errorf(LLMQ_ERR_ARG, "block: no sums (made without)");
    const bool cuda = b->be == LLMQ_BACKEND_CUDA;
    enum llmq_status st = LLMQ_OK;
    for (int g = 0; g < LLMQ_BLOCK_GRAM_COUNT && !st; g++) {
        const int64_t C = gram_dim(&b->s, (enum llmq_block_gram)g);
        double *acc[2] = {(double *)(void *)b->gsum[g].data, (double *)(void *)b->csum[g].data};
        const int64_t n[2] = {C * C, 2 * C};
        for (int k = 0; k < 2 && !st; k++) {
            if (!acc[k]) continue; // a sum the block does not gather
            if (cuda)
                st = llmq_block_cuda_zero(llmq_ops_stream(b->ops), acc[k], n[k]);
            else
                memset(acc[k], 0, (size_t)n[k] * sizeof(double));
        }
    }
    if (!st && b->cbad.data) { // every mark UINT64_MAX: no non-finite value yet
        float none[2 * LLMQ_BLOCK_GRAM_COUNT];
        memset(none, 0xff, sizeof none);
        st = llmq_ops_upload(b->ops, &b->cbad, 0, none, 2 * LLMQ_BLOCK_GRAM_COUNT);
    }
    b->rows = 0;
    return st;
}

// n doubles of buffer src (where the block computes) as a host array: src itself on the CPU, else a malloc'd copy
// in *tmp (the caller frees it).
static enum llmq_status host_doubles(struct llmq_block *b, const struct llmq_ops_buf *src, int64_t n, double **tmp,
                                     const double **out) {
    *tmp = NULL;
    *out = (const double *)(void *)src->data;
    if (b->be != LLMQ_BACKEND_CUDA) return LLMQ_OK;
    if (!(*tmp = malloc((size_t)n * sizeof(double))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "block: out of memory for %lld sums", (long long)n);
    enum llmq_status st = llmq_ops_download(b->ops, (float *)(void *)*tmp, src, 0, 2 * n);
    *out = *tmp;
    return st;
}

enum llmq_status llmq_block_gram_download(struct llmq_block *b, enum llmq_block_gram g, double *acc) {
    if (!(b->sums & LLMQ_BLOCK_SUM_GRAM) || (unsigned)g >= LLMQ_BLOCK_GRAM_COUNT || !acc)
        return llmq_errorf(LLMQ_ERR_ARG, "block: no Gram sum %d (made without, or out of range)", (int)g);
    const int64_t C = gram_dim(&b->s, g);
    const double *src;
    double *tmp;
    enum llmq_status st = host_doubles(b, &b->gsum[g], C * C, &tmp, &src);
    for (int64_t i = 0; i < C && !st; i++)
        for (int64_t j = i; j < C; j++) acc[i * C + j] += src[i * C + j];
    free(tmp);
    return st;
}

enum llmq_status llmq_block_hessian(struct llmq_block *b, enum llmq_block_gram g, double scale,
                                    const struct llmq_ops_buf *H) {
    if (!(b->sums & LLMQ_BLOCK_SUM_GRAM) || (unsigned)g >= LLMQ_BLOCK_GRAM_COUNT)
        return llmq_errorf(LLMQ_ERR_ARG, "block: no Gram sum %d (made without, or out of range)", (int)g);
    const int64_t C = gram_dim(&b->s, g);
    if (!H || !H->data || H->be != b->be || H->n < C * C)
        return llmq_errorf(LLMQ_ERR_ARG, "block: the Hessian of input %d needs %lld floats on %s", (int)g,
                           (long long)(C * C), llmq_backend_name(b->be));
    const double *acc = (const double *)(void *)b->gsum[g].data;
    if (b->be == LLMQ_BACKEND_CUDA) return llmq_block_cuda_hessian(llmq_ops_stream(b->ops), acc, C, scale, H->data);
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++)
            H->data[i * C + j] = (float)(scale * (j >= i ? acc[i * C + j] : acc[j * C + i]));
    return LLMQ_OK;
}

enum llmq_status llmq_block_colsums_download(struct llmq_block *b, enum llmq_block_gram g, double *sum_abs,
                                             double *sum_sq, int64_t *bad) {
    if (!(b->sums & LLMQ_BLOCK_SUM_COLS) || (unsigned)g >= LLMQ_BLOCK_GRAM_COUNT || !sum_abs || !sum_sq || !bad)
        return llmq_errorf(LLMQ_ERR_ARG, "block: no column sums of input %d (made without, or out of range)", (int)g);
    const int64_t C = gram_dim(&b->s, g);
    const double *src;
    double *tmp;
    uint64_t marks[LLMQ_BLOCK_GRAM_COUNT];
    enum llmq_status st = host_doubles(b, &b->csum[g], 2 * C, &tmp, &src);
    if (!st) st = llmq_ops_download(b->ops, (float *)(void *)marks, &b->cbad, 0, 2 * LLMQ_BLOCK_GRAM_COUNT);
    for (int64_t c = 0; c < C && !st; c++) {
        sum_abs[c] += src[c];
        sum_sq[c] += src[C + c];
    }
    if (!st) *bad = marks[g] == UINT64_MAX ? -1 : (int64_t)marks[g];
    free(tmp);
    return st;
}
