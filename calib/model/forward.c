/*
 * calib/model/forward.c — CPU prefill forward pass (see calib/model/forward.h for the maths and the contract).
 *
 * Mirrors llama.cpp's llm_build_llama / llm_build_qwen2 / qwen3 graph as the ggml CPU backend evaluates it
 * with an f32 KV cache: ggml_rms_norm (sum of squares in double, eps inside the sqrt), then the
 * norm weight; ggml_rope_ext (theta_scale = base^(-2/n_dims), theta multiplied pair by pair in f32,
 * divided by the freq factor); kq scaled inside ggml_soft_max_ext (exp in f32, sum in double,
 * rows multiplied by 1/sum); ggml_swiglu = silu(gate) * up with silu(x) = x / (1 + exp(-x)).
 *
 * Parallelism: one fork-join helper (parallel()) runs a function on n threads, the caller being
 * thread 0. Linear layers split the weight's rows over the threads; each thread converts its rows
 * into the shared f32 scratch and runs one single-threaded cblas_sgemm over all tokens on them.
 * OpenBLAS is held at one thread while our threads call it (restored around the hooks and on
 * return), so the two thread pools never oversubscribe the cores.
 *
 * Legend: T tokens of the call (n_seq * seqlen), D n_embd, F n_ff, V n_vocab, H / Hkv heads,
 * Dh head_dim, R n_rot (the rotated values of a head, R <= Dh), Dq = H*Dh, Dkv = Hkv*Dh, RB query rows per
 * attention task.
 */
#include "calib/model/forward.h"

#include "calib/model/moe.h"
#include "common/io.h"
#include "common/log.h"
#include "common/spill.h"
#include "kernels/gemm.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 256
#define RB 64                   // query rows per attention task
#define HEAD_MIN_ROWS 4096      // the output head is converted in chunks of at least this many rows
#define SERIAL_WORK (1LL << 18) // multiply-adds below which an op runs on the calling thread

struct llmq_forward {
    const struct llmq_model *m;
    int n_threads;
    int64_t max_tokens;
    int blas_saved;            // OpenBLAS thread count to restore (0: not changed)
    enum llmq_backend backend; // of the linear / head products (llmq_forward_set_backend); CPU by default
    enum llmq_emulate emulate; // calib/model/actq.h; NONE: plain f32
    float *xq;                 // (max_tokens, max(D, Dq, F)) a linear input rounded as llama.cpp would (emulate only)
    const uint8_t *favec;      // (rows of a call) 1: the row's attention as flash attention's vector path (emulate
                               // llamacpp-cpu only; llmq_forward_set_favec_rows); NULL: none

    float *wbuf; // (wbuf_n) f32 copy of the weight rows in use
    int64_t wbuf_n;
    float *out_norm; // (D) output_norm
    // the small weights of the block in use, converted from its weight set (struct llmq_layer) at every call
    float *norms;      // (2, D) attn_norm, ffn_norm
    float *bias;       // (Dq + 2 Dkv) q, k, v biases; NULL without qkv_bias
    float *qk_norms;   // (2 Dh) q_norm, k_norm; NULL without qk_norm
    float *post_norms; // (2, D) gemma attn_post_norm, ffn_post_norm; NULL otherwise
    float *ff;         // (3, R/2) RoPE frequency divisors (calib/model/model.h llmq_model_rope_freq_factors;
                       // LongRoPE: the short factors), ones, LongRoPE's long factors
    int64_t rope_ctx;  // LongRoPE: llama.cpp's context for the choice of factors; 0: transformers' rule
                       // (llmq_forward_set_rope_ctx)
    int rope_long;     // the factors rope_cos / rope_sin hold: 1 long (LongRoPE), 0 the others; -1 none yet
    int64_t n_pos;     // positions in the RoPE tables and keys in the score buffers (grown on demand)
    float *rope_cos;   // (n_pos, R/2) cos(pos * theta_i / ff_i) (LongRoPE: times attn_factor)
    float *rope_sin;   // (n_pos, R/2)
    float *swa_cos;    // (n_pos, R/2) the sliding layers' table (gemma: rope_theta_swa, no scaling); NULL when
    float *swa_sin;    // they share rope_cos / rope_sin

    float *x;      // (max_tokens, D) hidden state of llmq_forward_logits (allocated by its first call)
    float *xn;     // (max_tokens, D) normalized input of a linear layer
    float *q;      // (max_tokens, Dq)
    float *k;      // (max_tokens, Dkv)
    float *v;      // (max_tokens, Dkv)
    float *att;    // (max_tokens, Dq) attention output (input of o_proj)
    float *gate;   // (max_tokens, F) gate, then silu(gate) * up (input of down_proj)
    float *up;     // (max_tokens, F)
    float *out;    // (max_tokens, D) output of the attention / MLP of a block, added to x
    float *scores; // (n_threads, RB, n_pos) attention scores per worker

    float *shx;             // (max_tokens, D) qwen2_moe: the shared expert's output, before its gate
    float *shg;             // (max_tokens) qwen2_moe: the shared expert's gate logits
    struct llmq_moe *moe;   // moe families: the mixture's scratch (calib/model/moe.h); else NULL
    llmq_expert_hook ehook; // llmq_forward_set_expert_hook
    void *euser;
};

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

typedef void (*par_fn)(void *ctx, int ith, int nth);

struct par_arg {
    par_fn fn;
    void *ctx;
    int ith, nth;
};

static void *par_main(void *p) {
    struct par_arg *a = p;
    a->fn(a->ctx, a->ith, a->nth);
    return NULL;
}

// Runs fn(ctx, i, nth) for i in [0, nth), thread 0 being the caller. A thread that cannot be
// created has its share run by the caller afterwards (shares are independent).
static void parallel(int nth, par_fn fn, void *ctx) {
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    pthread_t tid[MAX_THREADS];
    struct par_arg args[MAX_THREADS];
    bool started[MAX_THREADS];
    for (int i = 0; i < nth; i++) args[i] = (struct par_arg){fn, ctx, i, nth};
    for (int i = 1; i < nth; i++) started[i] = pthread_create(&tid[i], NULL, par_main, &args[i]) == 0;
    fn(ctx, 0, nth);
    for (int i = 1; i < nth; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            fn(ctx, i, nth);
    }
}

// Threads worth using for `work` multiply-adds.
static int threads_for(const struct llmq_forward *f, int64_t work) {
    if (work < SERIAL_WORK) return 1;
    int64_t t = work / SERIAL_WORK;
    return t < f->n_threads ? (int)t : f->n_threads;
}

static void range_of(int64_t n, int ith, int nth, int64_t align, int64_t *a, int64_t *b) {
    int64_t per = (n + nth - 1) / nth;
    per = (per + align - 1) / align * align;
    *a = per * ith < n ? per * ith : n;
    *b = *a + per < n ? *a + per : n;
}

static void blas_serial(struct llmq_forward *f) {
    int cur = openblas_get_num_threads();
    if (cur != 1) {
        f->blas_saved = cur;
        openblas_set_num_threads(1);
    }
}

static void blas_restore(struct llmq_forward *f) {
    if (f->blas_saved > 0) openblas_set_num_threads(f->blas_saved);
    f->blas_saved = 0;
}

// ---------------------------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------------------------

// A weight usable by sgemm in place: f32 and 4-byte aligned.
static bool direct_f32(const struct llmq_tensor_view *w) {
    return w->dtype == LLMQ_DTYPE_F32 && ((uintptr_t)w->data % sizeof(float)) == 0;
}

struct linear_ctx {
    struct llmq_forward *f;
    const struct llmq_tensor_view *w; // (R, C)
    int64_t r0, nr;                   // rows [r0, r0 + nr) of w
    const float *X;                   // (n, C)
    int64_t n, C;
    float *Y; // (n, ldy): columns [0, nr) written
    int64_t ldy;
    float beta;        // 0: Y = X W^T; 1: Y += X W^T
    bool convert_only; // device GEMM: the workers only convert their rows into wbuf
    enum llmq_status st[MAX_THREADS];
};

static void linear_worker(void *p, int ith, int nth) {
    struct linear_ctx *c = p;
    int64_t a, b;
    range_of(c->nr, ith, nth, 16, &a, &b);
    c->st[ith] = LLMQ_OK;
    if (a >= b) return;
    const float *W; // (b - a, C)
    if (direct_f32(c->w)) {
        W = (const float *)c->w->data + (c->r0 + a) * c->C;
    } else {
        float *dst = c->f->wbuf + a * c->C;
        c->st[ith] = llmq_model_rows_f32(c->w, c->r0 + a, b - a, dst);
        if (c->st[ith]) return;
        W = dst;
    }
    if (c->convert_only) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->n, (int)(b - a), (int)c->C, 1.0f, c->X, (int)c->C, W,
                (int)c->C, c->beta, c->Y + a, (int)c->ldy);
}

struct actq_ctx {
    enum llmq_dtype vt;
    const float *X; // (n, C)
    float *Xq;      // (n, C)
    int64_t n, C;
};

static void actq_worker(void *p, int ith, int nth) {
    struct actq_ctx *c = p;
    int64_t a, b;
    range_of(c->n, ith, nth, 1, &a, &b);
    for (int64_t t = a; t < b; t++) llmq_actq_round_row(c->vt, c->X + t * c->C, c->C, c->Xq + t * c->C);
}

// The input X (n, C) of a product with w as llama.cpp's CPU backend sees it (calib/model/actq.h): rounded
// through w's vec_dot_type into f->xq, or X itself when it stays f32.
static const float *emulate_input(struct llmq_forward *f, const struct llmq_tensor_view *w, const float *X, int64_t n) {
    struct actq_ctx c = {llmq_actq_vec_dot_type(w->dtype), X, f->xq, n, w->shape[1]};
    if (c.vt == LLMQ_DTYPE_F32) return X;
    parallel(threads_for(f, n * c.C * 16), actq_worker, &c);
    return f->xq;
}

// Grows the weight scratch to n floats (a caller's weight set may hold a converted weight the model has in f32).
static enum llmq_status ensure_wbuf(struct llmq_forward *f, int64_t n) {
    if (n <= f->wbuf_n) return LLMQ_OK;
    float *p = realloc(f->wbuf, (size_t)n * sizeof(float));
    if (!p) return llmq_errorf(LLMQ_ERR_NOMEM, "forward: out of memory for a %lld-element weight", (long long)n);
    f->wbuf = p;
    f->wbuf_n = n;
    return LLMQ_OK;
}

// Y[:, 0:nr] (n, ldy) = X (n, C) · W[r0 : r0+nr]^T + beta · Y; wbuf grows to nr * C when W is converted.
// On the device (kernels/gemm.h decides by size): the threads convert W's rows into wbuf (rows
// [r0, r0+nr) at wbuf[0..nr*C)), then ONE GEMM over all rows instead of a GEMM per thread slice.
static enum llmq_status linear_rows(struct llmq_forward *f, const struct llmq_tensor_view *w, int64_t r0, int64_t nr,
                                    const float *X, int64_t n, float *Y, int64_t ldy, float beta) {
    if (!direct_f32(w)) {
        enum llmq_status st = ensure_wbuf(f, nr * w->shape[1]);
        if (st) return st;
    }
    if (f->emulate) X = emulate_input(f, w, X, n);
    const bool dev = llmq_gemm_on_device(f->backend, n, nr, w->shape[1]);
    struct linear_ctx c = {.f = f,
                           .w = w,
                           .r0 = r0,
                           .nr = nr,
                           .X = X,
                           .n = n,
                           .C = w->shape[1],
                           .Y = Y,
                           .ldy = ldy,
                           .beta = beta,
                           .convert_only = dev};
    int nth = threads_for(f, n * nr * c.C);
    if (nth > (nr + 15) / 16) nth = (int)((nr + 15) / 16);
    if (nth < 1) nth = 1;
    if (dev && direct_f32(w)) nth = 0; // nothing to convert
    if (nth > 0) parallel(nth, linear_worker, &c);
    for (int i = 0; i < nth; i++)
        if (c.st[i]) return c.st[i];
    if (!dev) return LLMQ_OK;
    const float *W = direct_f32(w) ? (const float *)w->data + r0 * c.C : f->wbuf; // (nr, C)
    return llmq_gemm_f32(f->backend, false, true, n, nr, c.C, 1.0f, X, c.C, W, c.C, beta, Y, ldy);
}

static enum llmq_status linear(struct llmq_forward *f, const struct llmq_tensor_view *w, const float *X, int64_t n,
                               float *Y, float beta) {
    return linear_rows(f, w, 0, w->shape[0], X, n, Y, w->shape[0], beta);
}

struct rms_ctx {
    const float *x; // (n, D)
    const float *w; // (D)
    float *y;       // (n, D)
    int64_t n, D;
    float eps;
};

static void rms_worker(void *p, int ith, int nth) {
    struct rms_ctx *c = p;
    int64_t a, b;
    range_of(c->n, ith, nth, 1, &a, &b);
    for (int64_t t = a; t < b; t++) {
        const float *x = c->x + t * c->D;
        float *y = c->y + t * c->D;
        double sum = 0.0;
        for (int64_t i = 0; i < c->D; i++) sum += (double)(x[i] * x[i]);
        const float mean = (float)(sum / (double)c->D);
        const float scale = 1.0f / sqrtf(mean + c->eps);
        for (int64_t i = 0; i < c->D; i++) y[i] = (x[i] * scale) * c->w[i];
    }
}

// y (n, D) = RMSNorm(x) * w row by row, w (D).
static void rms_rows(struct llmq_forward *f, const float *x, const float *w, float *y, int64_t n, int64_t D) {
    struct rms_ctx c = {x, w, y, n, D, f->m->hp.rms_eps};
    parallel(threads_for(f, n * c.D * 4), rms_worker, &c);
}

static void rms_norm(struct llmq_forward *f, const float *x, const float *w, float *y, int64_t n) {
    rms_rows(f, x, w, y, n, f->m->hp.n_embd);
}

struct rope_ctx {
    struct llmq_forward *f;
    float *q, *k; // (n, Dq), (n, Dkv)
    int64_t n, seqlen;
    const float *cos, *sin; // (n_pos, R/2) the layer's table
};

// The first R values of each of the n_heads heads of x rotated; the other Dh - R kept.
static void rope_rows(const struct rope_ctx *c, float *x, int64_t n_heads, int64_t pos) {
    const struct llmq_forward *f = c->f;
    const int64_t Dh = f->m->hp.head_dim, half = f->m->hp.n_rot / 2;
    const float *cs = c->cos + pos * half, *sn = c->sin + pos * half;
    const bool neox = f->m->hp.rope_type == LLMQ_ROPE_NEOX;
    for (int64_t h = 0; h < n_heads; h++) {
        float *xh = x + h * Dh;
        for (int64_t i = 0; i < half; i++) {
            float *a = neox ? &xh[i] : &xh[2 * i];
            float *b = neox ? &xh[i + half] : &xh[2 * i + 1];
            const float x0 = *a, x1 = *b;
            *a = x0 * cs[i] - x1 * sn[i];
            *b = x0 * sn[i] + x1 * cs[i];
        }
    }
}

static void rope_worker(void *p, int ith, int nth) {
    struct rope_ctx *c = p;
    const struct llmq_hparams *hp = &c->f->m->hp;
    int64_t a, b;
    range_of(c->n, ith, nth, 1, &a, &b);
    for (int64_t t = a; t < b; t++) {
        int64_t pos = t % c->seqlen;
        rope_rows(c, c->q + t * hp->n_head * hp->head_dim, hp->n_head, pos);
        rope_rows(c, c->k + t * hp->n_head_kv * hp->head_dim, hp->n_head_kv, pos);
    }
}

struct attn_ctx {
    struct llmq_forward *f;
    int64_t n_seq, seqlen, n_rb;
    int64_t window;   // keys visible to a query (t - window < p <= t); 0: all of 0..t
    atomic_long next; // next task index
};

// One row of scores (nk) in place: keys [j0, nv) scaled (gemma2: soft-capped), softmax in f32 with the sum in
// double (the emulation without flash attention: probabilities to f16), the rest zeroed.
static void softmax_row(const struct llmq_forward *f, float *row, int64_t j0, int64_t nv, int64_t nk, float scale,
                        float cap) {
    float mx = -INFINITY;
    for (int64_t j = j0; j < nv; j++) {
        row[j] *= scale;
        if (cap > 0.0f) row[j] = tanhf(row[j] / cap) * cap;
        if (row[j] > mx) mx = row[j];
    }
    double sum = 0.0;
    for (int64_t j = j0; j < nv; j++) {
        row[j] = expf(row[j] - mx);
        sum += (double)row[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = j0; j < nv; j++) row[j] *= inv;
    if (f->emulate == LLMQ_EMULATE_LLAMACPP_CPU_NOFA) llmq_actq_round_f16(row + j0, nv - j0);
    for (int64_t j = 0; j < j0; j++) row[j] = 0.0f;
    for (int64_t j = nv; j < nk; j++) row[j] = 0.0f;
}

static float f16r(float x) { return llmq_f16_to_f32(llmq_f32_to_f16(x)); }

// The keys of one query row for favec_row: rows [j0, nv) of (K1; K2) and (V1; V2), n1 rows in the first part,
// every row Dh values at stride ld (the emulation's K and V, already rounded to f16).
struct favec_keys {
    const float *K1, *V1, *K2, *V2;
    int64_t n1, ld, j0, nv;
};

// One query row q (Dh) as llama.cpp's flash-attention vector path (ggml-cpu ops.cpp
// ggml_compute_forward_flash_attn_ext_f16_one_chunk, taken for a ubatch of fewer than GGML_FA_TILE_Q = 64 queries
// with an F16 KV cache): Q rounded to f16; per visible key in cell order its score dot(K, Q) (here summed in
// double: ggml's ggml_vec_dot_f16 sums f32 lanes, an order not emulated), times scale (gemma2: cap * tanh(s *
// scale / cap)); an online softmax whose V accumulator is f16, every update rounded to f16 (ggml_vec_scale_f16 on a
// new maximum, then ggml_vec_mad_f16's fused multiply-add); out = f32(acc) * (1 / S).
static void favec_row(const float *q, int64_t Dh, const struct favec_keys *k, float scale, float cap, float *out) {
    float q16[LLMQ_FAVEC_MAX_DH], acc[LLMQ_FAVEC_MAX_DH];
    for (int64_t d = 0; d < Dh; d++) q16[d] = f16r(q[d]), acc[d] = 0.0f;
    float M = -INFINITY, S = 0.0f;
    if (cap > 0.0f) scale /= cap;
    for (int64_t j = k->j0; j < k->nv; j++) {
        const float *kr = j < k->n1 ? k->K1 + j * k->ld : k->K2 + (j - k->n1) * k->ld;
        const float *vr = j < k->n1 ? k->V1 + j * k->ld : k->V2 + (j - k->n1) * k->ld;
        double dot = 0.0;
        for (int64_t d = 0; d < Dh; d++) dot += (double)kr[d] * (double)q16[d];
        float s = (float)dot * scale;
        if (cap > 0.0f) s = cap * tanhf(s);
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            const float Mold = M;
            M = s;
            ms = expf(Mold - M);
            for (int64_t d = 0; d < Dh; d++) acc[d] = f16r(acc[d] * ms);
        } else {
            vs = expf(s - M);
        }
        for (int64_t d = 0; d < Dh; d++) acc[d] = f16r(fmaf(vr[d], vs, acc[d]));
        S = fmaf(S, ms, vs);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int64_t d = 0; d < Dh; d++) out[d] = acc[d] * inv;
}

// One task: rows [t0, t1) of head h of sequence s. Tasks are handed out largest first (the last
// row blocks attend to the most keys).
static void attn_worker(void *p, int ith, int nth) {
    (void)nth;
    struct attn_ctx *c = p;
    struct llmq_forward *f = c->f;
    const struct llmq_hparams *hp = &f->m->hp;
    const int64_t H = hp->n_head, Dh = hp->head_dim, Dq = H * Dh, Dkv = hp->n_head_kv * Dh;
    const int64_t group = H / hp->n_head_kv, n_tasks = c->n_seq * H * c->n_rb;
    const float scale = 1.0f / sqrtf(hp->gemma ? hp->query_pre_attn_scalar : (float)Dh);
    const float cap = hp->attn_softcap; // gemma2: s -> cap * tanh(s / cap), as modeling_gemma2.py
    const int64_t window = c->window;
    float *S = f->scores + (int64_t)ith * RB * f->n_pos; // (RB, nk)
    for (;;) {
        long task = atomic_fetch_add(&c->next, 1);
        if (task >= n_tasks) break;
        int64_t rb = c->n_rb - 1 - task / (c->n_seq * H), rest = task % (c->n_seq * H);
        int64_t s = rest / H, h = rest % H, hk = h / group;
        int64_t t0 = rb * RB, t1 = t0 + RB < c->seqlen ? t0 + RB : c->seqlen, nk = t1, m = t1 - t0;
        const float *Q = f->q + (s * c->seqlen + t0) * Dq + h * Dh; // (m, Dh), ld Dq
        const float *K = f->k + s * c->seqlen * Dkv + hk * Dh;      // (nk, Dh), ld Dkv
        const float *Vv = f->v + s * c->seqlen * Dkv + hk * Dh;     // (nk, Dh), ld Dkv
        float *O = f->att + (s * c->seqlen + t0) * Dq + h * Dh;     // (m, Dh), ld Dq
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nk, (int)Dh, 1.0f, Q, (int)Dq, K, (int)Dkv,
                    0.0f, S, (int)nk);
        for (int64_t i = 0; i < m; i++) {
            float *row = S + i * nk;
            int64_t nv = t0 + i + 1; // keys j0..t0+i are visible
            int64_t j0 = window > 0 && nv > window ? nv - window : 0;
            softmax_row(f, row, j0, nv, nk, scale, cap);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)Dh, (int)nk, 1.0f, S, (int)nk, Vv, (int)Dkv,
                    0.0f, O, (int)Dq);
        for (int64_t i = 0; f->favec && i < m; i++) { // rows of llama.cpp's vector path: replaced
            if (!f->favec[s * c->seqlen + t0 + i]) continue;
            int64_t nv = t0 + i + 1;
            struct favec_keys fk = {K, Vv, NULL, NULL, nv, Dkv, window > 0 && nv > window ? nv - window : 0, nv};
            favec_row(Q + i * Dq, Dh, &fk, scale, cap, O + i * Dq);
        }
    }
}

struct swiglu_ctx {
    float *g;       // (n, F) gate in, act(gate) * up out
    const float *u; // (n, F)
    int64_t count;
    bool gelu;     // GeGLU (gemma): act = GELU with the tanh approximation, else SiLU
    bool gelu_f16; // GELU as ggml's CPU table (emulation): f16(gelu(f16(x))) on (-10, 10), 0 below, x above
};

static float gelu_tanh(float x) { // gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    const float k = 0.79788456080286535588f, kappa = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(k * (x + kappa * x * x * x)));
}

// ggml-cpu vec.h ggml_vec_geglu_f32 with GGML_GELU_FP16: ggml_table_gelu_f16[f16(x)] = f16(ggml_gelu_f32(x)),
// where ggml_gelu_f32(x) = 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
static float gelu_ggml_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float h = llmq_f16_to_f32(llmq_f32_to_f16(x));
    const float y = 0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)));
    return llmq_f16_to_f32(llmq_f32_to_f16(y));
}

static void swiglu_worker(void *p, int ith, int nth) {
    struct swiglu_ctx *c = p;
    int64_t a, b;
    range_of(c->count, ith, nth, 64, &a, &b);
    if (c->gelu) {
        for (int64_t i = a; i < b; i++)
            c->g[i] = (c->gelu_f16 ? gelu_ggml_table(c->g[i]) : gelu_tanh(c->g[i])) * c->u[i];
        return;
    }
    for (int64_t i = a; i < b; i++) {
        const float x = c->g[i];
        c->g[i] = (x / (1.0f + expf(-x))) * c->u[i];
    }
}

// ---------------------------------------------------------------------------------------------
// Init / free
// ---------------------------------------------------------------------------------------------

static float *alloc_f32(int64_t n, bool *ok) {
    if (!*ok) return NULL;
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) *ok = false;
    return p;
}

// The per-token intermediates (they grow with max_tokens): under the --max-memory budget (common/spill.h).
static float *alloc_act(int64_t n, bool *ok) {
    if (!*ok) return NULL;
    float *p = llmq_big_alloc((size_t)(n > 0 ? n : 1) * sizeof(float), "forward activations");
    if (!p) *ok = false;
    return p;
}

enum llmq_status llmq_forward_init(const struct llmq_model *m, int64_t max_tokens, int n_threads,
                                   struct llmq_forward **out) {
    *out = NULL;
    if (!m || max_tokens < 1 || max_tokens > (1LL << 30))
        return llmq_errorf(LLMQ_ERR_ARG, "forward: max_tokens %lld out of range", (long long)max_tokens);
    const struct llmq_hparams *hp = &m->hp;
    const int64_t D = hp->n_embd, F = hp->shexp ? hp->n_ff_shexp : hp->n_ff, V = hp->n_vocab;
    const int64_t L = hp->n_layer, Dh = hp->head_dim, Dq = hp->n_head * Dh, Dkv = hp->n_head_kv * Dh, T = max_tokens;
    const int64_t R = hp->n_rot;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    struct llmq_forward *f = calloc(1, sizeof *f);
    if (!f) return llmq_errorf(LLMQ_ERR_NOMEM, "forward: out of memory");
    f->m = m;
    f->n_threads = n_threads;
    f->max_tokens = T;

    // The weight scratch: the largest block weight that is not usable in place, and a chunk of
    // the output head.
    int64_t wn = 0;
    for (int64_t il = 0; il < L; il++) {
        const struct llmq_layer *ly = &m->layers[il];
        const int64_t n_exp = ly->exps ? 3 * hp->n_expert : 0;     // moe: every expert's weights, the router and
        for (int64_t k = 0; k < LLMQ_LIN_COUNT + n_exp + 2; k++) { // qwen2_moe's shared expert gate
            const struct llmq_tensor_view *w = k < LLMQ_LIN_COUNT            ? ly->w[k]
                                               : k < LLMQ_LIN_COUNT + n_exp  ? ly->exps[k - LLMQ_LIN_COUNT]
                                               : k == LLMQ_LIN_COUNT + n_exp ? ly->router
                                                                             : ly->shexp_gate;
            if (w && !direct_f32(w) && w->shape[0] * w->shape[1] > wn) wn = w->shape[0] * w->shape[1];
        }
    }
    if (!direct_f32(m->output)) {
        int64_t rows = wn / D > HEAD_MIN_ROWS ? wn / D : HEAD_MIN_ROWS;
        if (rows > V) rows = V;
        if (rows * D > wn) wn = rows * D;
    }
    f->wbuf_n = wn;

    bool ok = true;
    f->wbuf = wn ? alloc_f32(wn, &ok) : NULL;
    f->out_norm = alloc_f32(D, &ok);
    f->norms = alloc_f32(2 * D, &ok);
    f->bias = hp->qkv_bias ? alloc_f32(Dq + 2 * Dkv, &ok) : NULL;
    f->qk_norms = hp->qk_norm ? alloc_f32(2 * Dh, &ok) : NULL;
    f->post_norms = hp->gemma ? alloc_f32(2 * D, &ok) : NULL;
    f->ff = alloc_f32(3 * (R / 2), &ok); // (R/2) factors, (R/2) ones for the sliding layers' table, long factors
    f->xn = alloc_act(T * D, &ok);
    f->q = alloc_act(T * Dq, &ok);
    f->k = alloc_act(T * Dkv, &ok);
    f->v = alloc_act(T * Dkv, &ok);
    f->att = alloc_act(T * Dq, &ok);
    f->gate = alloc_act(T * F, &ok);
    f->up = alloc_act(T * F, &ok);
    f->out = alloc_act(T * D, &ok);
    if (hp->shexp) {
        f->shx = alloc_act(T * D, &ok);
        f->shg = alloc_act(T, &ok);
    }
    enum llmq_status st = LLMQ_OK;
    if (!ok) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "forward: out of memory for %lld tokens of %s", (long long)T, m->path);
        goto fail;
    }

    if (hp->moe) st = llmq_moe_init(hp, T, &f->moe);
    if (!st) st = llmq_model_weight_f32(m->output_norm, f->out_norm, 1);
    if (st) goto fail;
    llmq_model_rope_freq_factors(m, f->ff);
    for (int64_t i = R / 2; i < 3 * (R / 2); i++) f->ff[i] = 1.0f;
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LONGROPE) {
        memcpy(f->ff, hp->rope_scaling.short_factor, (size_t)(R / 2) * sizeof(float));
        memcpy(f->ff + 2 * (R / 2), hp->rope_scaling.long_factor, (size_t)(R / 2) * sizeof(float));
    }
    f->rope_long = -1;
    *out = f;
    return LLMQ_OK;
fail:
    llmq_forward_free(f);
    return st;
}

void llmq_forward_set_backend(struct llmq_forward *f, enum llmq_backend be) { f->backend = be; }

void llmq_forward_release_scratch(struct llmq_forward *f) {
    if (f) llmq_scratch_release(f->wbuf, (size_t)f->wbuf_n * sizeof(float));
}

void llmq_forward_free(struct llmq_forward *f) {
    if (!f) return;
    free(f->wbuf);
    llmq_big_free(f->xq);
    free(f->out_norm);
    free(f->norms);
    free(f->bias);
    free(f->qk_norms);
    free(f->post_norms);
    free(f->swa_cos);
    free(f->swa_sin);
    free(f->ff);
    free(f->rope_cos);
    free(f->rope_sin);
    llmq_big_free(f->x);
    llmq_big_free(f->xn);
    llmq_big_free(f->q);
    llmq_big_free(f->k);
    llmq_big_free(f->v);
    llmq_big_free(f->att);
    llmq_big_free(f->gate);
    llmq_big_free(f->up);
    llmq_big_free(f->out);
    llmq_big_free(f->shx);
    llmq_big_free(f->shg);
    free(f->scores);
    llmq_moe_free(f->moe);
    free(f);
}

void llmq_forward_set_expert_hook(struct llmq_forward *f, llmq_expert_hook hook, void *user) {
    f->ehook = hook;
    f->euser = user;
}

enum llmq_status llmq_forward_set_expert_source(struct llmq_forward *f, llmq_expert_weight_fn fn, void *user) {
    return f->moe ? llmq_moe_set_expert_source(f->moe, fn, user) : LLMQ_OK;
}

void llmq_forward_set_moe_calib_all(struct llmq_forward *f, bool all) {
    if (f->moe) llmq_moe_set_calib_all(f->moe, all);
}

const int64_t *llmq_forward_moe_counts(const struct llmq_forward *f) { return f->moe ? llmq_moe_counts(f->moe) : NULL; }

enum llmq_status llmq_forward_set_emulate(struct llmq_forward *f, enum llmq_emulate e) {
    if ((unsigned)e >= LLMQ_EMULATE_COUNT)
        return llmq_errorf(LLMQ_ERR_ARG, "forward: emulation mode %d unknown", (int)e);
    const struct llmq_hparams *hp = &f->m->hp;
    int64_t c = hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff;
    if (hp->n_head * hp->head_dim > c) c = hp->n_head * hp->head_dim;
    if (hp->n_ff_exp > c) c = hp->n_ff_exp;
    if (hp->n_ff_shexp > c) c = hp->n_ff_shexp;
    if (e && !f->xq && !(f->xq = llmq_big_alloc((size_t)(f->max_tokens * c) * sizeof(float), "emulated activations")))
        return llmq_errorf(LLMQ_ERR_NOMEM, "forward: out of memory for %lld emulated activations of %s",
                           (long long)(f->max_tokens * c), f->m->path);
    f->emulate = e;
    return LLMQ_OK;
}

enum llmq_status llmq_forward_set_rope_ctx(struct llmq_forward *f, int64_t n_ctx) {
    if (n_ctx < 0) return llmq_errorf(LLMQ_ERR_ARG, "forward: RoPE context %lld is negative", (long long)n_ctx);
    f->rope_ctx = n_ctx;
    f->rope_long = -1; // the tables are refilled at the next pass
    return LLMQ_OK;
}

enum llmq_status llmq_forward_set_favec_rows(struct llmq_forward *f, const uint8_t *rows) {
    if (rows && (f->emulate != LLMQ_EMULATE_LLAMACPP_CPU || f->m->hp.head_dim > LLMQ_FAVEC_MAX_DH))
        return llmq_errorf(LLMQ_ERR_ARG,
                           "forward: the flash-attention vector path is emulated only under "
                           "llamacpp-cpu with a head size up to %d",
                           LLMQ_FAVEC_MAX_DH);
    f->favec = rows;
    return LLMQ_OK;
}

// Fills cos / sin (seqlen, R/2) as ggml_rope_cache_init: theta_i = pos * theta_scale^i (a running f32
// product) / ff_i / div (div: linear rope scaling's factor, else 1), cos and sin times mscale (LongRoPE's
// attention factor, else 1).
static void fill_rope(const struct llmq_forward *f, float base, const float *ff, float div, float mscale,
                      int64_t seqlen, float *c, float *s) {
    const int64_t half = f->m->hp.n_rot / 2;
    const float theta_scale = powf(base, -2.0f / (float)f->m->hp.n_rot);
    for (int64_t p = 0; p < seqlen; p++) {
        float theta = (float)p;
        for (int64_t i = 0; i < half; i++) {
            float th = theta / ff[i];
            if (div != 1.0f) th /= div;
            c[p * half + i] = cosf(th) * mscale;
            s[p * half + i] = sinf(th) * mscale;
            theta *= theta_scale;
        }
    }
}

// True when the sliding layers need their own RoPE table (gemma: another base, or scaling on the global ones).
static bool swa_table(const struct llmq_hparams *hp) {
    return hp->gemma && (hp->rope_theta_swa != hp->rope_theta || hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR);
}

// Grows the RoPE tables and the score buffers to sequences of seqlen tokens, and fills the tables with the
// factors a sequence of seqlen tokens takes (LongRoPE: llmq_rope_longrope_long).
static enum llmq_status ensure_positions(struct llmq_forward *f, int64_t seqlen) {
    const struct llmq_hparams *hp = &f->m->hp;
    const int lng = llmq_rope_longrope_long(hp, f->rope_ctx, seqlen);
    if (seqlen <= f->n_pos && lng == f->rope_long) return LLMQ_OK;
    if (seqlen < f->n_pos) seqlen = f->n_pos; // other factors: the whole table again
    const int64_t half = hp->n_rot / 2;
    const size_t tb = (size_t)(seqlen * half) * sizeof(float);
    bool ok = true;
    float **tabs[4] = {&f->rope_cos, &f->rope_sin, &f->swa_cos, &f->swa_sin};
    for (int i = 0; i < (swa_table(hp) ? 4 : 2) && ok; i++) {
        float *t = realloc(*tabs[i], tb);
        if (t) *tabs[i] = t;
        ok = t != NULL;
    }
    float *sc = ok ? realloc(f->scores, (size_t)((int64_t)f->n_threads * RB * seqlen) * sizeof(float)) : NULL;
    if (!sc)
        return llmq_errorf(LLMQ_ERR_NOMEM, "forward: out of memory for sequences of %lld tokens", (long long)seqlen);
    f->scores = sc;
    const float div = hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR ? hp->rope_scaling.factor : 1.0f;
    const bool longrope = hp->rope_scaling.type == LLMQ_ROPE_SCALING_LONGROPE;
    fill_rope(f, hp->rope_theta, lng ? f->ff + 2 * half : f->ff, div, longrope ? hp->rope_scaling.attn_factor : 1.0f,
              seqlen, f->rope_cos, f->rope_sin);
    if (swa_table(hp)) {
        float *ones = f->ff + half; // (R/2) ones after ff
        fill_rope(f, hp->rope_theta_swa, ones, 1.0f, 1.0f, seqlen, f->swa_cos, f->swa_sin);
    }
    f->n_pos = seqlen;
    f->rope_long = lng;
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// Public passes
// ---------------------------------------------------------------------------------------------

enum llmq_status llmq_forward_embed(struct llmq_forward *f, const int32_t *tokens, int64_t n, float *x) {
    const struct llmq_model *m = f->m;
    const int64_t D = m->hp.n_embd;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return llmq_errorf(LLMQ_ERR_ARG,
                               "forward: token id %d at position %lld is outside the vocabulary [0, %lld)",
                               (int)tokens[i], (long long)i, (long long)m->hp.n_vocab);
    }
    const float scale = sqrtf((float)D); // gemma: embeddings times sqrt(D) in f32, as ggml_scale / embed_scale
    for (int64_t i = 0; i < n; i++) {
        enum llmq_status st = llmq_model_rows_f32(m->tok_embd, tokens[i], 1, x + i * D);
        if (st) return st;
        if (m->hp.gemma)
            for (int64_t d = 0; d < D; d++) x[i * D + d] *= scale;
    }
    return LLMQ_OK;
}

static void call_hook(struct llmq_forward *f, llmq_linear_hook hook, void *user, int layer, enum llmq_linear which,
                      const float *in, int64_t n, int64_t n_in) {
    if (!hook) return;
    blas_restore(f);
    hook(user, layer, which, in, n, n_in);
    blas_serial(f);
}

// The attention's small weights of the weight set ly (q / k / v biases, q / k norms, gemma's attn_post_norm)
// into f's f32 copies.
static enum llmq_status attn_weights(struct llmq_forward *f, const struct llmq_layer *ly) {
    const struct llmq_hparams *hp = &f->m->hp;
    const int64_t Dh = hp->head_dim, Dq = hp->n_head * Dh, Dkv = hp->n_head_kv * Dh;
    enum llmq_status st = LLMQ_OK;
    if (f->bias) {
        st = llmq_model_weight_f32(ly->bq, f->bias, 1);
        if (!st) st = llmq_model_weight_f32(ly->bk, f->bias + Dq, 1);
        if (!st) st = llmq_model_weight_f32(ly->bv, f->bias + Dq + Dkv, 1);
    }
    if (!st && f->qk_norms) {
        st = llmq_model_weight_f32(ly->q_norm, f->qk_norms, 1);
        if (!st) st = llmq_model_weight_f32(ly->k_norm, f->qk_norms + Dh, 1);
    }
    if (!st && f->post_norms) st = llmq_model_weight_f32(ly->attn_post_norm, f->post_norms, 1);
    return st;
}

// q, k, v (n, Dq / Dkv / Dkv) = the projections of xn (n, D) by the weight set ly (biases, qwen3's q/k norms);
// also loads ly's attention post norm (gemma) into f->post_norms.
static enum llmq_status qkv_project(struct llmq_forward *f, const struct llmq_layer *ly, const float *xn, int64_t n) {
    const struct llmq_hparams *hp = &f->m->hp;
    const int64_t Dh = hp->head_dim, Dq = hp->n_head * Dh, Dkv = hp->n_head_kv * Dh;
    enum llmq_status st = attn_weights(f, ly);
    if (st) return st;
    float beta = 0.0f;
    if (f->bias) { // y = W x + b, as ggml_add after the matmul: start from b and accumulate
        const float *b = f->bias;
        for (int64_t t = 0; t < n; t++) {
            memcpy(f->q + t * Dq, b, (size_t)Dq * sizeof(float));
            memcpy(f->k + t * Dkv, b + Dq, (size_t)Dkv * sizeof(float));
            memcpy(f->v + t * Dkv, b + Dq + Dkv, (size_t)Dkv * sizeof(float));
        }
        beta = 1.0f;
    }
    if ((st = linear(f, ly->w[LLMQ_LIN_Q], xn, n, f->q, beta))) return st;
    if ((st = linear(f, ly->w[LLMQ_LIN_K], xn, n, f->k, beta))) return st;
    if ((st = linear(f, ly->w[LLMQ_LIN_V], xn, n, f->v, beta))) return st;
    if (f->qk_norms) { // qwen3: RMSNorm of every head (rows of Dh values) before RoPE, as ggml_rms_norm on (Dh, H, n)
        const float *w = f->qk_norms; // (2, Dh) q_norm, k_norm
        rms_rows(f, f->q, w, f->q, n * hp->n_head, Dh);
        rms_rows(f, f->k, w + Dh, f->k, n * hp->n_head_kv, Dh);
    }
    return LLMQ_OK;
}

// out (n, D) = Wo · Attn(RoPE(Wq·xn + bq), RoPE(Wk·xn + bk), Wv·xn + bv) for xn (n_seq * seqlen, D).
// xn may be f->xn; out must not alias f's buffers other than f->out.
static enum llmq_status attn(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn,
                             int64_t n_seq, int64_t seqlen, float *out, llmq_linear_hook hook, void *user) {
    const struct llmq_hparams *hp = &f->m->hp;
    const int64_t Dh = hp->head_dim;
    const int64_t Dq = hp->n_head * Dh, Dkv = hp->n_head_kv * Dh, n = n_seq * seqlen;
    enum llmq_status st = qkv_project(f, ly, xn, n);
    if (st) return st;
    const bool swa = llmq_hparams_layer_swa(hp, layer);
    struct rope_ctx rc = {f,
                          f->q,
                          f->k,
                          n,
                          seqlen,
                          swa && f->swa_cos ? f->swa_cos : f->rope_cos,
                          swa && f->swa_sin ? f->swa_sin : f->rope_sin};
    parallel(threads_for(f, n * (Dq + Dkv) * 4), rope_worker, &rc);
    if (f->emulate) { // the F16 KV cache; Q to f16 as mul_mat(K f16, Q) does without flash attention
        llmq_actq_round_f16(f->k, n * Dkv);
        llmq_actq_round_f16(f->v, n * Dkv);
        if (f->emulate == LLMQ_EMULATE_LLAMACPP_CPU_NOFA) llmq_actq_round_f16(f->q, n * Dq);
    }
    struct attn_ctx ac = {.f = f,
                          .n_seq = n_seq,
                          .seqlen = seqlen,
                          .n_rb = (seqlen + RB - 1) / RB,
                          .window = swa ? hp->sliding_window : 0};
    atomic_init(&ac.next, 0);
    int64_t attn_work = n_seq * hp->n_head * seqlen * seqlen * Dh;
    int nth = threads_for(f, attn_work);
    if (nth > n_seq * hp->n_head * ac.n_rb) nth = (int)(n_seq * hp->n_head * ac.n_rb);
    parallel(nth, attn_worker, &ac);
    call_hook(f, hook, user, layer, LLMQ_LIN_O, f->att, n, Dq);
    if ((st = linear(f, ly->w[LLMQ_LIN_O], f->att, n, out, 0.0f))) return st;
    if (f->post_norms) rms_norm(f, out, f->post_norms, out, n); // gemma's post norm
    return LLMQ_OK;
}

// The mixture's linear (calib/model/moe.h llmq_moe_linear_fn): this pass's linear.
static enum llmq_status moe_linear(void *ctx, const struct llmq_tensor_view *w, const float *X, int64_t n, float *Y) {
    return linear(ctx, w, X, n, Y, 0.0f);
}

// The expert hook with OpenBLAS's threads back, as call_hook.
static void moe_hook(void *ctx, int layer, int expert, enum llmq_linear which, const float *in, int64_t n,
                     int64_t n_in) {
    struct llmq_forward *f = ctx;
    blas_restore(f);
    f->ehook(f->euser, layer, expert, which, in, n, n_in);
    blas_serial(f);
}

// out (n, D) = Wdown · (act(Wgate·xn) * (Wup·xn)) for xn (n, D), F = llmq_hparams_ffn_width: the dense MLP, or
// qwen2_moe's shared expert; the hook sees down's input.
static enum llmq_status dense_ffn(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn,
                                  int64_t n, float *out, llmq_linear_hook hook, void *user) {
    const int64_t F = llmq_hparams_ffn_width(&f->m->hp);
    enum llmq_status st;
    if ((st = linear(f, ly->w[LLMQ_LIN_GATE], xn, n, f->gate, 0.0f))) return st;
    if ((st = linear(f, ly->w[LLMQ_LIN_UP], xn, n, f->up, 0.0f))) return st;
    struct swiglu_ctx sc = {f->gate, f->up, n * F, f->m->hp.gemma, f->emulate != LLMQ_EMULATE_NONE};
    parallel(threads_for(f, n * F * 8), swiglu_worker, &sc);
    call_hook(f, hook, user, layer, LLMQ_LIN_DOWN, f->gate, n, F);
    return linear(f, ly->w[LLMQ_LIN_DOWN], f->gate, n, out, 0.0f);
}

// out (n, D) = Wdown · (SiLU(Wgate·xn) * (Wup·xn)) for xn (n, D); moe: the mixture (calib/model/moe.h), and for
// qwen2_moe + sigmoid(shexp_gate · xn) * the shared expert (Qwen2MoeSparseMoeBlock: the gated shared output added
// to the routed sum, in f32).
static enum llmq_status mlp(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn, int64_t n,
                            float *out, llmq_linear_hook hook, void *user) {
    const int64_t D = f->m->hp.n_embd;
    enum llmq_status st;
    if (ly->router) {
        st = llmq_moe_ffn(f->moe, &f->m->hp, ly, layer, xn, n, out, moe_linear, f, f->ehook ? moe_hook : NULL, f);
        if (st || !ly->shexp_gate) return st;
        if ((st = dense_ffn(f, layer, ly, xn, n, f->shx, hook, user))) return st;
        if ((st = linear(f, ly->shexp_gate, xn, n, f->shg, 0.0f))) return st;
        for (int64_t t = 0; t < n; t++) {
            const float g = 1.0f / (1.0f + expf(-f->shg[t]));
            for (int64_t d = 0; d < D; d++) out[t * D + d] += g * f->shx[t * D + d];
        }
        return LLMQ_OK;
    }
    st = f->post_norms ? llmq_model_weight_f32(ly->ffn_post_norm, f->post_norms + D, 1) : LLMQ_OK;
    if (!st) st = dense_ffn(f, layer, ly, xn, n, out, hook, user);
    if (!st && f->post_norms) rms_norm(f, out, f->post_norms + D, out, n);
    return st;
}

// x += y, both (n) floats.
static void add_inplace(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static enum llmq_status block(struct llmq_forward *f, int layer, const struct llmq_layer *ly, float *x, int64_t n_seq,
                              int64_t seqlen, llmq_linear_hook hook, void *user) {
    const int64_t D = f->m->hp.n_embd, n = n_seq * seqlen;
    enum llmq_status st = llmq_model_weight_f32(ly->attn_norm, f->norms, 1);
    if (!st) st = llmq_model_weight_f32(ly->ffn_norm, f->norms + D, 1);
    if (st) return st;

    // ---- attention: x += attn(RMSNorm(x) * attn_norm)
    rms_norm(f, x, f->norms, f->xn, n);
    call_hook(f, hook, user, layer, LLMQ_LIN_Q, f->xn, n, D);
    if ((st = attn(f, layer, ly, f->xn, n_seq, seqlen, f->out, hook, user))) return st;
    add_inplace(x, f->out, n * D);

    // ---- MLP: x += mlp(RMSNorm(x) * ffn_norm)
    rms_norm(f, x, f->norms + D, f->xn, n);
    call_hook(f, hook, user, layer, LLMQ_LIN_GATE, f->xn, n, D);
    if ((st = mlp(f, layer, ly, f->xn, n, f->out, hook, user))) return st;
    add_inplace(x, f->out, n * D);
    return LLMQ_OK;
}

// A weight of the weight set with the shape of the model's (both NULL: the family has none).
static bool same_shape(const struct llmq_tensor_view *a, const struct llmq_tensor_view *b) {
    if (!a || !b) return a == b;
    if (a->n_dims != b->n_dims) return false;
    for (int d = 0; d < a->n_dims; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static enum llmq_status check_block_args(const struct llmq_forward *f, int layer, const struct llmq_layer *ly,
                                         int64_t n_seq, int64_t seqlen) {
    if (layer < 0 || layer >= f->m->hp.n_layer)
        return llmq_errorf(LLMQ_ERR_ARG, "forward: layer %d out of range [0, %lld)", layer,
                           (long long)f->m->hp.n_layer);
    if (!ly) return llmq_errorf(LLMQ_ERR_ARG, "forward: block %d without weights", layer);
    const struct llmq_layer *ml = &f->m->layers[layer];
    bool ok = same_shape(ly->attn_norm, ml->attn_norm) && same_shape(ly->ffn_norm, ml->ffn_norm) &&
              same_shape(ly->router, ml->router) && !ly->exps == !ml->exps &&
              same_shape(ly->shexp_gate, ml->shexp_gate);
    for (int k = 0; k < LLMQ_LIN_COUNT && ok; k++) ok = same_shape(ly->w[k], ml->w[k]);
    if (!ok)
        return llmq_errorf(LLMQ_ERR_ARG, "forward: the weights given for block %d have other shapes than the model's",
                           layer);
    if (n_seq < 1 || seqlen < 1 || n_seq > f->max_tokens / seqlen)
        return llmq_errorf(LLMQ_ERR_ARG, "forward: %lld sequences of %lld tokens exceed max_tokens %lld",
                           (long long)n_seq, (long long)seqlen, (long long)f->max_tokens);
    return LLMQ_OK;
}

enum llmq_status llmq_forward_attn(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn,
                                   int64_t n_seq, int64_t seqlen, float *out) {
    enum llmq_status st = check_block_args(f, layer, ly, n_seq, seqlen);
    if (!st) st = ensure_positions(f, seqlen);
    if (st) return st;
    blas_serial(f);
    st = attn(f, layer, ly, xn, n_seq, seqlen, out, NULL, NULL);
    blas_restore(f);
    return st;
}

enum llmq_status llmq_forward_mlp(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn,
                                  int64_t n, float *out) {
    enum llmq_status st = check_block_args(f, layer, ly, n < 1 ? 0 : 1, n);
    if (st) return st;
    blas_serial(f);
    st = mlp(f, layer, ly, xn, n, out, NULL, NULL);
    blas_restore(f);
    return st;
}

enum llmq_status llmq_forward_rmsnorm(struct llmq_forward *f, const float *x, int64_t n, const float *w, float *y) {
    if (n < 1) return llmq_errorf(LLMQ_ERR_ARG, "forward: rmsnorm on %lld tokens", (long long)n);
    blas_serial(f);
    rms_norm(f, x, w, y, n);
    blas_restore(f);
    return LLMQ_OK;
}

enum llmq_status llmq_forward_block(struct llmq_forward *f, int layer, const struct llmq_layer *ly, float *x,
                                    int64_t n_seq, int64_t seqlen, llmq_linear_hook hook, void *user) {
    enum llmq_status st = check_block_args(f, layer, ly, n_seq, seqlen);
    if (!st) st = ensure_positions(f, seqlen);
    if (st) return st;
    blas_serial(f);
    st = block(f, layer, ly, x, n_seq, seqlen, hook, user);
    blas_restore(f);
    return st;
}

static enum llmq_status head(struct llmq_forward *f, const float *x, int64_t n, float *logits) {
    const struct llmq_model *m = f->m;
    const int64_t D = m->hp.n_embd, V = m->hp.n_vocab;
    const int64_t chunk = direct_f32(m->output) ? V : f->wbuf_n / D;
    for (int64_t t0 = 0; t0 < n; t0 += f->max_tokens) {
        int64_t nt = n - t0 < f->max_tokens ? n - t0 : f->max_tokens;
        rms_norm(f, x + t0 * D, f->out_norm, f->xn, nt);
        for (int64_t r0 = 0; r0 < V; r0 += chunk) {
            int64_t nr = V - r0 < chunk ? V - r0 : chunk;
            enum llmq_status st = linear_rows(f, m->output, r0, nr, f->xn, nt, logits + t0 * V + r0, V, 0.0f);
            if (st) return st;
        }
    }
    const float cap = m->hp.final_softcap; // gemma: logits -> cap * tanh(logits / cap)
    if (cap > 0.0f)
        for (int64_t i = 0; i < n * V; i++) logits[i] = tanhf(logits[i] / cap) * cap;
    return LLMQ_OK;
}

enum llmq_status llmq_forward_head(struct llmq_forward *f, const float *x, int64_t n, float *logits) {
    if (n < 1) return llmq_errorf(LLMQ_ERR_ARG, "forward: head on %lld tokens", (long long)n);
    blas_serial(f);
    enum llmq_status st = head(f, x, n, logits);
    blas_restore(f);
    return st;
}

enum llmq_status llmq_forward_logits(struct llmq_forward *f, const int32_t *tokens, int64_t n, int64_t first_logit,
                                     float *logits) {
    if (n < 1 || n > f->max_tokens)
        return llmq_errorf(LLMQ_ERR_ARG, "forward: %lld tokens (max_tokens is %lld)", (long long)n,
                           (long long)f->max_tokens);
    if (first_logit < 0 || first_logit >= n)
        return llmq_errorf(LLMQ_ERR_ARG, "forward: first_logit %lld outside [0, %lld)", (long long)first_logit,
                           (long long)n);
    if (!f->x && !(f->x = llmq_big_alloc((size_t)(f->max_tokens * f->m->hp.n_embd) * sizeof(float), "forward input")))
        return llmq_errorf(LLMQ_ERR_NOMEM, "forward: out of memory for %lld tokens", (long long)f->max_tokens);
    enum llmq_status st = ensure_positions(f, n);
    if (!st) st = llmq_forward_embed(f, tokens, n, f->x);
    if (st) return st;
    blas_serial(f);
    for (int il = 0; il < f->m->hp.n_layer && !st; il++) st = block(f, il, &f->m->layers[il], f->x, 1, n, NULL, NULL);
    if (!st) st = head(f, f->x + first_logit * f->m->hp.n_embd, n - first_logit, logits);
    blas_restore(f);
    return st;
}

// ---------------------------------------------------------------------------------------------
// Blocks after a cached prefix (llmq_forward_block_prefixed)
// ---------------------------------------------------------------------------------------------

void llmq_forward_last_kv(const struct llmq_forward *f, const float **k, const float **v) {
    *k = f->k;
    *v = f->v;
}

struct rope_pre_ctx {
    struct rope_ctx rc;
    const int64_t *pre_len; // (n_seq) token t of sequence s sits at position pre_len[s] + t % seqlen
};

static void rope_pre_worker(void *p, int ith, int nth) {
    struct rope_pre_ctx *c = p;
    const struct llmq_hparams *hp = &c->rc.f->m->hp;
    int64_t a, b;
    range_of(c->rc.n, ith, nth, 1, &a, &b);
    for (int64_t t = a; t < b; t++) {
        int64_t pos = c->pre_len[t / c->rc.seqlen] + t % c->rc.seqlen;
        rope_rows(&c->rc, c->rc.q + t * hp->n_head * hp->head_dim, hp->n_head, pos);
        rope_rows(&c->rc, c->rc.k + t * hp->n_head_kv * hp->head_dim, hp->n_head_kv, pos);
    }
}

struct attn_pre_ctx {
    struct llmq_forward *f;
    int64_t n_seq, seqlen, n_rb, window;
    const float *const *pre_k, *const *pre_v; // (n_seq) (pre_len[s], Dkv) each
    const int64_t *pre_len;                   // (n_seq)
    atomic_long next;
};

// attn_worker with the keys [prefix | own rows 0..t1) of sequence s in one score row (positions 0..P+t1).
static void attn_pre_worker(void *p, int ith, int nth) {
    (void)nth;
    struct attn_pre_ctx *c = p;
    struct llmq_forward *f = c->f;
    const struct llmq_hparams *hp = &f->m->hp;
    const int64_t H = hp->n_head, Dh = hp->head_dim, Dq = H * Dh, Dkv = hp->n_head_kv * Dh;
    const int64_t group = H / hp->n_head_kv, n_tasks = c->n_seq * H * c->n_rb;
    const float scale = 1.0f / sqrtf(hp->gemma ? hp->query_pre_attn_scalar : (float)Dh);
    const float cap = hp->attn_softcap;
    float *S = f->scores + (int64_t)ith * RB * f->n_pos; // (RB, nk)
    for (;;) {
        long task = atomic_fetch_add(&c->next, 1);
        if (task >= n_tasks) break;
        int64_t rb = c->n_rb - 1 - task / (c->n_seq * H), rest = task % (c->n_seq * H);
        int64_t s = rest / H, h = rest % H, hk = h / group, P = c->pre_len[s];
        int64_t t0 = rb * RB, t1 = t0 + RB < c->seqlen ? t0 + RB : c->seqlen, m = t1 - t0, nk = P + t1;
        const float *Q = f->q + (s * c->seqlen + t0) * Dq + h * Dh; // (m, Dh), ld Dq
        const float *K = f->k + s * c->seqlen * Dkv + hk * Dh;      // (t1, Dh), ld Dkv
        const float *Vv = f->v + s * c->seqlen * Dkv + hk * Dh;     // (t1, Dh), ld Dkv
        float *O = f->att + (s * c->seqlen + t0) * Dq + h * Dh;     // (m, Dh), ld Dq
        if (P > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)P, (int)Dh, 1.0f, Q, (int)Dq,
                        c->pre_k[s] + hk * Dh, (int)Dkv, 0.0f, S, (int)nk);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)t1, (int)Dh, 1.0f, Q, (int)Dq, K, (int)Dkv,
                    0.0f, S + P, (int)nk);
        for (int64_t i = 0; i < m; i++) {
            float *row = S + i * nk;
            int64_t nv = P + t0 + i + 1; // keys j0..P+t0+i are visible
            int64_t j0 = c->window > 0 && nv > c->window ? nv - c->window : 0;
            softmax_row(f, row, j0, nv, nk, scale, cap);
        }
        if (P > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)Dh, (int)P, 1.0f, S, (int)nk,
                        c->pre_v[s] + hk * Dh, (int)Dkv, 0.0f, O, (int)Dq);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)Dh, (int)t1, 1.0f, S + P, (int)nk, Vv,
                    (int)Dkv, P > 0 ? 1.0f : 0.0f, O, (int)Dq);
        for (int64_t i = 0; f->favec && i < m; i++) { // rows of llama.cpp's vector path: replaced
            if (!f->favec[s * c->seqlen + t0 + i]) continue;
            int64_t nv = P + t0 + i + 1;
            struct favec_keys fk = {P > 0 ? c->pre_k[s] + hk * Dh : NULL,
                                    P > 0 ? c->pre_v[s] + hk * Dh : NULL,
                                    K,
                                    Vv,
                                    P,
                                    Dkv,
                                    c->window > 0 && nv > c->window ? nv - c->window : 0,
                                    nv};
            favec_row(Q + i * Dq, Dh, &fk, scale, cap, O + i * Dq);
        }
    }
}

// attn for sequences that continue cached prefixes (llmq_forward_block_prefixed); max_pre = max pre_len.
static enum llmq_status attn_prefixed(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn,
                                      int64_t n_seq, int64_t seqlen, const float *const *pre_k,
                                      const float *const *pre_v, const int64_t *pre_len, int64_t max_pre, float *out) {
    const struct llmq_hparams *hp = &f->m->hp;
    const int64_t Dh = hp->head_dim, Dq = hp->n_head * Dh, Dkv = hp->n_head_kv * Dh, n = n_seq * seqlen;
    enum llmq_status st = qkv_project(f, ly, xn, n);
    if (st) return st;
    const bool swa = llmq_hparams_layer_swa(hp, layer);
    struct rope_pre_ctx rc = {{f, f->q, f->k, n, seqlen, swa && f->swa_cos ? f->swa_cos : f->rope_cos,
                               swa && f->swa_sin ? f->swa_sin : f->rope_sin},
                              pre_len};
    parallel(threads_for(f, n * (Dq + Dkv) * 4), rope_pre_worker, &rc);
    if (f->emulate) { // as attn: the f16 KV cache (the prefix's rows were rounded by their own pass)
        llmq_actq_round_f16(f->k, n * Dkv);
        llmq_actq_round_f16(f->v, n * Dkv);
        if (f->emulate == LLMQ_EMULATE_LLAMACPP_CPU_NOFA) llmq_actq_round_f16(f->q, n * Dq);
    }
    struct attn_pre_ctx ac = {.f = f,
                              .n_seq = n_seq,
                              .seqlen = seqlen,
                              .n_rb = (seqlen + RB - 1) / RB,
                              .window = swa ? hp->sliding_window : 0,
                              .pre_k = pre_k,
                              .pre_v = pre_v,
                              .pre_len = pre_len};
    atomic_init(&ac.next, 0);
    int nth = threads_for(f, n_seq * hp->n_head * seqlen * (max_pre + seqlen) * Dh);
    if (nth > n_seq * hp->n_head * ac.n_rb) nth = (int)(n_seq * hp->n_head * ac.n_rb);
    parallel(nth, attn_pre_worker, &ac);
    if ((st = linear(f, ly->w[LLMQ_LIN_O], f->att, n, out, 0.0f))) return st;
    if (f->post_norms) rms_norm(f, out, f->post_norms, out, n); // gemma's post norm
    return LLMQ_OK;
}

enum llmq_status llmq_forward_block_prefixed(struct llmq_forward *f, int layer, const struct llmq_layer *ly, float *x,
                                             int64_t n_seq, int64_t seqlen, const float *const *pre_k,
                                             const float *const *pre_v, const int64_t *pre_len) {
    const int64_t D = f->m->hp.n_embd, n = n_seq * seqlen;
    enum llmq_status st = check_block_args(f, layer, ly, n_seq, seqlen);
    if (st) return st;
    int64_t max_pre = 0;
    for (int64_t s = 0; s < n_seq; s++) {
        if (pre_len[s] < 0 || pre_len[s] > (1LL << 30) || (pre_len[s] > 0 && (!pre_k[s] || !pre_v[s])))
            return llmq_errorf(LLMQ_ERR_ARG, "forward: sequence %lld: bad prefix (%lld tokens)", (long long)s,
                               (long long)pre_len[s]);
        if (pre_len[s] > max_pre) max_pre = pre_len[s];
    }
    if ((st = ensure_positions(f, max_pre + seqlen))) return st;
    st = llmq_model_weight_f32(ly->attn_norm, f->norms, 1);
    if (!st) st = llmq_model_weight_f32(ly->ffn_norm, f->norms + D, 1);
    if (st) return st;
    blas_serial(f);
    rms_norm(f, x, f->norms, f->xn, n); // x += attn(RMSNorm(x) * attn_norm), as block
    st = attn_prefixed(f, layer, ly, f->xn, n_seq, seqlen, pre_k, pre_v, pre_len, max_pre, f->out);
    if (!st) add_inplace(x, f->out, n * D);
    if (!st) rms_norm(f, x, f->norms + D, f->xn, n); // x += mlp(RMSNorm(x) * ffn_norm)
    if (!st) st = mlp(f, layer, ly, f->xn, n, f->out, NULL, NULL);
    if (!st) add_inplace(x, f->out, n * D);
    blas_restore(f);
    return st;
}
