/*
 * tests/block_fixture.h — random tiny decoder blocks for the tests of kernels/block.h (tests/unit/test_block.c,
 * tests/gpu/test_block_cuda.c): one set of host f32 weights per block of a named shape (llama: norm RoPE with
 * llama3-style frequency divisors; qwen2: neox RoPE and q/k/v biases; qwen3: neox RoPE and q/k norms), and the same
 * weights as an in-memory struct llmq_model (views on the arrays, no file) for calib/model/forward.c.
 * Weights are uniform in ±1.5/sqrt(in) (the linears), 1 ± 0.2 (norms), ±0.5 (biases): activations stay O(1).
 */
#ifndef LLMQ_TEST_BLOCK_FIXTURE_H
#define LLMQ_TEST_BLOCK_FIXTURE_H

#include "harness.h"

#include "calib/model/model.h"
#include "kernels/block.h"

#include <math.h>

#define FIX_MAX_LAYERS 3

enum fix_family { FIX_LLAMA, FIX_QWEN2, FIX_QWEN3 };

struct fix_model {
    struct llmq_block_shape s;
    float ff[256]; // (Dh/2) RoPE frequency divisors
    int n_layer;
    float *w[FIX_MAX_LAYERS][LLMQ_BLOCK_WEIGHT_COUNT]; // host f32, NULL where the shape has none
    uint16_t *f16[FIX_MAX_LAYERS];                     // layer l's wgate as f16 (the model's view)
    struct llmq_tensor_view views[FIX_MAX_LAYERS][LLMQ_BLOCK_WEIGHT_COUNT + 2];
    struct llmq_tensor_view out_view, norm_view, ff_view;
    float *out_w, *out_norm; // (V, D), (D): forward_init reads them
    struct llmq_layer layers[FIX_MAX_LAYERS];
    struct llmq_model m;
};

static inline int64_t fix_size(const struct llmq_block_shape *s, int w) { // as kernels/block.c weight_size
    const int64_t D = s->n_embd, F = s->n_ff, Dh = s->head_dim, Dq = s->n_head * Dh, Dkv = s->n_head_kv * Dh;
    const int64_t sz[LLMQ_BLOCK_WEIGHT_COUNT] = {Dq * D,
                                                 Dkv * D,
                                                 Dkv * D,
                                                 D * Dq,
                                                 F * D,
                                                 F * D,
                                                 D * F,
                                                 D,
                                                 D,
                                                 s->qkv_bias ? Dq : 0,
                                                 s->qkv_bias ? Dkv : 0,
                                                 s->qkv_bias ? Dkv : 0,
                                                 s->qk_norm ? Dh : 0,
                                                 s->qk_norm ? Dh : 0};
    return sz[w];
}

static inline void fix_view(struct llmq_tensor_view *v, const char *name, enum llmq_dtype dt, const void *data,
                            int64_t rows, int64_t cols) {
    memset(v, 0, sizeof *v);
    v->name = name;
    v->dtype = dt;
    v->n_dims = rows > 1 ? 2 : 1;
    v->shape[0] = rows > 1 ? rows : cols;
    v->shape[1] = rows > 1 ? cols : 1;
    for (int i = v->n_dims; i < LLMQ_MAX_DIMS; i++) v->shape[i] = 1;
    v->data = data;
    v->nbytes = (size_t)(rows * cols) * (dt == LLMQ_DTYPE_F16 ? 2 : 4);
}

// fm = a random model of family fam: D, F, H / Hkv, Dh, L layers; the layer-l wgate of the model is stored in f16
// (the block gets the same values in f32: f16 -> f32 is exact) when f16_gate.
static inline void fix_init(struct fix_model *fm, enum fix_family fam, int64_t D, int64_t F, int64_t H, int64_t Hkv,
                            int64_t Dh, int L, bool f16_gate, uint64_t *rng) {
    memset(fm, 0, sizeof *fm);
    CHECK(L <= FIX_MAX_LAYERS && Dh / 2 <= 256);
    fm->n_layer = L;
    struct llmq_block_shape *s = &fm->s;
    *s = (struct llmq_block_shape){.n_embd = D,
                                   .n_ff = F,
                                   .n_head = H,
                                   .n_head_kv = Hkv,
                                   .head_dim = Dh,
                                   .rms_eps = fam == FIX_LLAMA ? 1e-5f : 1e-6f,
                                   .attn_scale = 1.0f / sqrtf((float)Dh),
                                   .rope_neox = fam != FIX_LLAMA,
                                   .rope_theta = fam == FIX_LLAMA ? 500000.0f : 1000000.0f,
                                   .rope_ff = fm->ff,
                                   .qkv_bias = fam == FIX_QWEN2,
                                   .qk_norm = fam == FIX_QWEN3};
    for (int64_t i = 0; i < Dh / 2; i++) fm->ff[i] = fam == FIX_LLAMA && i >= Dh / 4 ? 1.0f + (float)i : 1.0f;
    struct llmq_hparams *hp = &fm->m.hp;
    hp->arch = fam == FIX_LLAMA ? LLMQ_ARCH_LLAMA : fam == FIX_QWEN2 ? LLMQ_ARCH_QWEN2 : LLMQ_ARCH_QWEN3;
    hp->n_vocab = 16, hp->n_embd = D, hp->n_ff = F, hp->n_layer = L, hp->n_head = H, hp->n_head_kv = Hkv;
    hp->head_dim = Dh, hp->n_rot = Dh, hp->rms_eps = s->rms_eps, hp->rope_theta = s->rope_theta;
    hp->rope_type = s->rope_neox ? LLMQ_ROPE_NEOX : LLMQ_ROPE_NORM;
    hp->qkv_bias = s->qkv_bias, hp->qk_norm = s->qk_norm;
    const int64_t Dq = H * Dh, Dkv = Hkv * Dh;
    const int64_t rows[LLMQ_BLOCK_WEIGHT_COUNT] = {Dq, Dkv, Dkv, D, F, F, D, 1, 1, 1, 1, 1, 1, 1};
    static const char *const names[LLMQ_BLOCK_WEIGHT_COUNT] = {
        "wq", "wk", "wv", "wo", "wgate", "wup", "wdown", "attn_norm", "ffn_norm", "bq", "bk", "bv", "q_norm", "k_norm"};
    for (int l = 0; l < L; l++) {
        for (int w = 0; w < LLMQ_BLOCK_WEIGHT_COUNT; w++) {
            const int64_t n = fix_size(s, w);
            if (n == 0) continue;
            float *p = fm->w[l][w] = malloc((size_t)n * sizeof(float));
            CHECK(p);
            const float sc = w < 7 ? 1.5f / sqrtf((float)(n / rows[w])) : 0.0f;
            for (int64_t i = 0; i < n; i++)
                p[i] = w < 7                                                            ? sc * test_frand(rng)
                       : w == LLMQ_BLOCK_BQ || w == LLMQ_BLOCK_BK || w == LLMQ_BLOCK_BV ? 0.5f * test_frand(rng)
                                                                                        : 1.0f + 0.2f * test_frand(rng);
            if (w == LLMQ_BLOCK_WGATE && f16_gate) { // values an f16 holds exactly, stored as f16 in the model
                CHECK(fm->f16[l] = malloc((size_t)n * sizeof(uint16_t)));
                for (int64_t i = 0; i < n; i++) p[i] = llmq_f16_to_f32(fm->f16[l][i] = llmq_f32_to_f16(p[i]));
                fix_view(&fm->views[l][w], names[w], LLMQ_DTYPE_F16, fm->f16[l], rows[w], n / rows[w]);
            } else {
                fix_view(&fm->views[l][w], names[w], LLMQ_DTYPE_F32, p, rows[w], n / rows[w]);
            }
        }
        struct llmq_layer *ly = &fm->layers[l];
        struct llmq_tensor_view *v = fm->views[l];
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) ly->w[k] = &v[k];
        ly->attn_norm = &v[LLMQ_BLOCK_ATTN_NORM], ly->ffn_norm = &v[LLMQ_BLOCK_FFN_NORM];
        if (s->qkv_bias) ly->bq = &v[LLMQ_BLOCK_BQ], ly->bk = &v[LLMQ_BLOCK_BK], ly->bv = &v[LLMQ_BLOCK_BV];
        if (s->qk_norm) ly->q_norm = &v[LLMQ_BLOCK_Q_NORM], ly->k_norm = &v[LLMQ_BLOCK_K_NORM];
    }
    CHECK((fm->out_w = calloc((size_t)(16 * D), sizeof(float))) && (fm->out_norm = calloc((size_t)D, sizeof(float))));
    fix_view(&fm->out_view, "output", LLMQ_DTYPE_F32, fm->out_w, 16, D);
    fix_view(&fm->norm_view, "output_norm", LLMQ_DTYPE_F32, fm->out_norm, 1, D);
    fm->m.output = fm->m.tok_embd = &fm->out_view;
    fm->m.output_norm = &fm->norm_view;
    fix_view(&fm->ff_view, "rope_freqs", LLMQ_DTYPE_F32, fm->ff, 1, Dh / 2); // forward.c reads the divisors here
    fm->m.rope_freqs = &fm->ff_view;
    fm->m.layers = fm->layers;
    fm->m.path = "random model";
    fm->m.arch_name = llmq_arch_name(hp->arch);
}

static inline void fix_free(struct fix_model *fm) {
    for (int l = 0; l < fm->n_layer; l++) {
        for (int w = 0; w < LLMQ_BLOCK_WEIGHT_COUNT; w++) free(fm->w[l][w]);
        free(fm->f16[l]);
    }
    free(fm->out_w), free(fm->out_norm);
}

// Uploads layer l's weights into b from the host arrays.
static inline void fix_load(const struct fix_model *fm, int l, struct llmq_block *b) {
    for (int w = 0; w < LLMQ_BLOCK_WEIGHT_COUNT; w++)
        if (fm->w[l][w]) CHECK_OK(llmq_block_set_weight(b, (enum llmq_block_weight)w, fm->w[l][w]));
}

// llmq_block_hessian's check (both tests): how many elements of block b's H of input g at scale differ from
// (float)(scale · G_ij), G its own Gram sum (gram_download) made symmetric: the bits calib/calib.c's Hessian gives.
static inline int64_t fix_hessian_differ(struct llmq_block *b, enum llmq_block_gram g, double scale) {
    const int64_t C = llmq_block_gram_dim(b, g);
    double *G = calloc((size_t)(C * C), sizeof(double));
    float *H = malloc((size_t)(C * C) * sizeof(float));
    struct llmq_ops_buf hb;
    CHECK(G && H);
    CHECK_OK(llmq_block_gram_download(b, g, G));
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(b), C * C, &hb));
    CHECK_OK(llmq_block_hessian(b, g, scale, &hb));
    CHECK_OK(llmq_ops_download(llmq_block_ops(b), H, &hb, 0, C * C));
    llmq_ops_buf_free(&hb);
    int64_t bad = 0;
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) {
            const float want = (float)(scale * (j >= i ? G[i * C + j] : G[j * C + i]));
            bad += memcmp(&want, &H[i * C + j], sizeof(float)) != 0;
        }
    free(G), free(H);
    return bad;
}

// llmq_block_gather's check (both tests): how many of the sums of block got differ from those of block ref for the
// inputs in mask (the Gram upper triangles and the column sums, bit for bit; a non-finite mark counts too), plus how
// many of got's sums outside mask are not zero. Both blocks made with LLMQ_BLOCK_SUM_GRAM | LLMQ_BLOCK_SUM_COLS.
static inline int64_t fix_sums_differ(struct llmq_block *ref, struct llmq_block *got, unsigned mask) {
    int64_t bad = 0;
    for (int k = 0; k < LLMQ_BLOCK_GRAM_COUNT; k++) {
        const enum llmq_block_gram g = (enum llmq_block_gram)k;
        const int64_t C = llmq_block_gram_dim(got, g), n = C * C + 2 * C;
        double *a = calloc((size_t)n, sizeof(double)), *b = calloc((size_t)n, sizeof(double));
        int64_t ba = 0, bb = 0;
        CHECK(a && b);
        CHECK_OK(llmq_block_gram_download(ref, g, a));
        CHECK_OK(llmq_block_colsums_download(ref, g, a + C * C, a + C * C + C, &ba));
        CHECK_OK(llmq_block_gram_download(got, g, b));
        CHECK_OK(llmq_block_colsums_download(got, g, b + C * C, b + C * C + C, &bb));
        bad += ba != -1 || bb != -1;
        for (int64_t i = 0; i < n; i++)
            bad += (mask & (1u << k)) ? memcmp(&a[i], &b[i], sizeof(double)) != 0 : b[i] != 0.0;
        free(a), free(b);
    }
    return bad;
}

// Input g's rows 0 .. n-1 as the last pass left them (llmq_block_input_rows), summed by the column sums' reference:
// how many of Σ|x|, Σx² differ from the block's own column sums of g (bit for bit: the same rows in the same order).
static inline int64_t fix_rows_differ(struct llmq_block *b, enum llmq_block_gram g, int64_t n) {
    const int64_t C = llmq_block_gram_dim(b, g);
    float *rows = malloc((size_t)(n * C) * sizeof(float));
    int64_t bad = 0, mark = 0;
    double *ref = calloc((size_t)(2 * C), sizeof(double)), *got = calloc((size_t)(2 * C), sizeof(double));
    uint64_t first = UINT64_MAX;
    CHECK(rows && ref && got);
    CHECK_OK(llmq_block_input_rows(b, g, 0, 1, n, rows));
    llmq_block_colsums_cpu(rows, n, C, 0, ref, &first);
    CHECK_OK(llmq_block_colsums_download(b, g, got, got + C, &mark));
    for (int64_t i = 0; i < 2 * C; i++) bad += memcmp(&ref[i], &got[i], sizeof(double)) != 0;
    free(rows), free(ref), free(got);
    return bad;
}

// llmq_block_attn_out / _mlp_out's check (both tests), on block b (made with LLMQ_BLOCK_SUM_COLS, layer loaded) and x
// (n_seq · S, D) on b's backend (left unchanged): x + attn_out(x) is llmq_block_attn's x bit for bit, h + mlp_out(h)
// llmq_block_ffn's (apply) on that h, and each pass's input rows (llmq_block_input_rows) sum to its column sums.
// Returns how many checks failed.
static inline int64_t fix_outs_differ(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t S) {
    struct llmq_ops *ops = llmq_block_ops(b);
    const int64_t D = llmq_block_gram_dim(b, LLMQ_BLOCK_GRAM_QKV), n = n_seq * S;
    float *x0 = malloc((size_t)(n * D) * sizeof(float)), *want = malloc((size_t)(n * D) * sizeof(float));
    float *got = malloc((size_t)(n * D) * sizeof(float));
    struct llmq_ops_buf o, h;
    CHECK(x0 && want && got);
    CHECK_OK(llmq_ops_buf_alloc(ops, n * D, &o));
    CHECK_OK(llmq_ops_buf_alloc(ops, n * D, &h));
    CHECK_OK(llmq_ops_download(ops, x0, x, 0, n * D));
    int64_t bad = 0;
    for (int half = 0; half < 2; half++) {
        CHECK_OK(llmq_ops_upload(ops, &h, 0, x0, n * D)); // h = x, then (the ffn) x + attn
        if (half == 1) CHECK_OK(llmq_block_attn(b, &h, n_seq, S, 0u));
        CHECK_OK(llmq_ops_download(ops, got, &h, 0, n * D));
        CHECK_OK(llmq_block_sums_zero(b));
        if (half == 0) {
            CHECK_OK(llmq_block_attn_out(b, &h, n_seq, S, 3u, &o));
            bad += fix_rows_differ(b, LLMQ_BLOCK_GRAM_QKV, n) + fix_rows_differ(b, LLMQ_BLOCK_GRAM_O, n);
        } else {
            CHECK_OK(llmq_block_mlp_out(b, &h, n_seq, S, 12u, &o));
            bad += fix_rows_differ(b, LLMQ_BLOCK_GRAM_GATE, n) + fix_rows_differ(b, LLMQ_BLOCK_GRAM_DOWN, n);
        }
        CHECK_OK(llmq_ops_add(ops, &h, &o, n * D)); // h + out
        CHECK_OK(llmq_ops_download(ops, want, &h, 0, n * D));
        CHECK_OK(llmq_ops_upload(ops, &h, 0, got, n * D));
        if (half == 0)
            CHECK_OK(llmq_block_attn(b, &h, n_seq, S, 0u));
        else
            CHECK_OK(llmq_block_ffn(b, &h, n_seq, S, 4u, true));
        CHECK_OK(llmq_ops_download(ops, got, &h, 0, n * D));
        bad += memcmp(want, got, (size_t)(n * D) * sizeof(float)) != 0;
    }
    CHECK_OK(llmq_ops_download(ops, got, x, 0, n * D));
    bad += memcmp(x0, got, (size_t)(n * D) * sizeof(float)) != 0;
    free(x0), free(want), free(got);
    llmq_ops_buf_free(&o), llmq_ops_buf_free(&h);
    return bad;
}

#endif // LLMQ_TEST_BLOCK_FIXTURE_H
