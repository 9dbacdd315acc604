// tests/unit/test_gptq_gguf.c — quant/gptq_gguf.h on random problems, for every block type:
//   - the blocks decode (llmq_dequantize_row) bit for bit to the W the solver returns, i.e. to the
//     values its loss and its error propagation used;
//   - the GPTQ proxy error tr(ΔW H ΔWᵀ) is below the plain encoder's (RTN, same importance) on a
//     correlated H, with importance = diag(H) and with a given importance vector;
//   - H = I (no propagation): the block scales are the plain encoder's and every element is at least
//     as close as the encoder's; the bytes are the encoder's exactly for the types listed in
//     `same_as_encoder` (checked: those whose encoders end with a nearest-level rounding);
//   - the same bytes and loss for 1 and 3 threads; argument and NaN errors;
//   - GPTAQ (opts.dxxt): on a layer whose quantized-model input X̃ differs from its fp input X, the asymmetric
//     objective ‖X W − X̃ Q‖² is below plain GPTQ's (alpha 1 and 0.25, plain and act-order), the blocks still
//     decode to the returned W, and a zero cross term gives plain GPTQ's bytes.
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/log.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"
#include "harness.h"
#include "quant/gptq_gguf.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { return test_frand(&rng_state); } // uniform [-1, 1)

// H (C, C) = 2/N XᵀX with X (N, C) strongly correlated (low rank + noise), a few dead columns.
static void make_hessian(int64_t C, int64_t N, float *H) {
    float *X = malloc((size_t)(N * C) * sizeof *X);
    CHECK(X);
    test_correlated_x(&rng_state, N, C, X);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) // dead columns, uneven scales
            X[n * C + c] = (c % 97 == 5) ? 0.0f : X[n * C + c] * (1.0f + (float)(c % 7));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)C, (int)C, (int)N, 2.0f / (float)N, X, (int)C, X, (int)C,
                0.0f, H, (int)C);
    free(X);
}

// tr(ΔW H ΔWᵀ), ΔW = Q - W
static double proxy(const float *W, const float *Q, const float *H, int64_t R, int64_t C) {
    double e = 0;
    float *d = malloc((size_t)C * sizeof *d);
    CHECK(d);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t i = 0; i < C; i++) d[i] = Q[r * C + i] - W[r * C + i];
        for (int64_t i = 0; i < C; i++) {
            double s = 0;
            for (int64_t j = 0; j < C; j++) s += (double)H[i * C + j] * d[j];
            e += (double)d[i] * s;
        }
    }
    free(d);
    return e;
}

static const enum llmq_dtype types[] = {LLMQ_DTYPE_Q4_0, LLMQ_DTYPE_Q4_1, LLMQ_DTYPE_Q5_0,   LLMQ_DTYPE_Q5_1,
                                        LLMQ_DTYPE_Q8_0, LLMQ_DTYPE_Q2_K, LLMQ_DTYPE_Q3_K,   LLMQ_DTYPE_Q4_K,
                                        LLMQ_DTYPE_Q5_K, LLMQ_DTYPE_Q6_K, LLMQ_DTYPE_IQ4_NL, LLMQ_DTYPE_IQ4_XS};
#define N_TYPES ((int)(sizeof types / sizeof types[0]))

// Decodes R rows of blocks into D and checks D == W bit for bit.
static void check_decodes_to(enum llmq_dtype t, const uint8_t *blocks, size_t rb, const float *W, int64_t R, int64_t C,
                             float *D) {
    for (int64_t r = 0; r < R; r++) CHECK_EQ_INT(llmq_dequantize_row(t, blocks + r * rb, D + r * C, C), LLMQ_OK);
    for (int64_t i = 0; i < R * C; i++)
        if (llmq_f32_bits(D[i]) != llmq_f32_bits(W[i]) && !(D[i] == 0.0f && W[i] == 0.0f)) {
            fprintf(stderr, "%s: element (%lld, %lld) decodes to %.9g, solver used %.9g\n", llmq_dtype_name(t),
                    (long long)(i / C), (long long)(i % C), (double)D[i], (double)W[i]);
            CHECK(0);
        }
}

static void test_gptq_vs_rtn(bool with_importance, bool act_order) {
    const int64_t R = 24, C = 512, N = 1024;
    float *W0 = malloc((size_t)(R * C) * sizeof(float)), *W = malloc((size_t)(R * C) * sizeof(float));
    float *Q = malloc((size_t)(R * C) * sizeof(float)), *H = malloc((size_t)(C * C) * sizeof(float));
    float *Hc = malloc((size_t)(C * C) * sizeof(float)), *imp = malloc((size_t)C * sizeof(float));
    uint8_t *blk = malloc((size_t)(R * C) * 4), *blk3 = malloc((size_t)(R * C) * 4);
    CHECK(W0 && W && Q && H && Hc && imp && blk && blk3);
    make_hessian(C, N, H);
    for (int64_t i = 0; i < R * C; i++) W0[i] = 0.05f * frand() * (1.0f + 3.0f * (frand() > 0.95f)); // some outliers
    for (int64_t c = 0; c < C; c++) imp[c] = with_importance ? 0.1f + fabsf(frand()) : H[c * C + c];
    for (int ti = 0; ti < N_TYPES; ti++) {
        enum llmq_dtype t = types[ti];
        size_t rb = 0;
        CHECK(llmq_dtype_nbytes(t, C, &rb));
        // RTN: the plain encoder with the same importance
        CHECK_EQ_INT(llmq_gguf_encode_rows(t, W0, blk, R, C, imp, 1), LLMQ_OK);
        for (int64_t r = 0; r < R; r++) CHECK_EQ_INT(llmq_dequantize_row(t, blk + r * rb, Q + r * C, C), LLMQ_OK);
        double e_rtn = proxy(W0, Q, H, R, C);
        // GPTQ
        struct llmq_gptq_gguf_opts o = llmq_gptq_gguf_opts_default();
        o.act_order = act_order;
        memcpy(W, W0, (size_t)(R * C) * sizeof(float));
        memcpy(Hc, H, (size_t)(C * C) * sizeof(float));
        double loss = -1;
        CHECK_EQ_INT(llmq_gptq_gguf_quantize("t", W, Hc, R, C, t, with_importance ? imp : NULL, &o, blk, &loss, NULL),
                     LLMQ_OK);
        check_decodes_to(t, blk, rb, W, R, C, Q);
        double e_gptq = proxy(W0, W, H, R, C);
        printf("%-7s %s%s: proxy error gptq %.4e  rtn %.4e  (ratio %.3f)  loss %.4e\n", llmq_dtype_name(t),
               with_importance ? "imatrix" : "diag(H)", act_order ? " act-order" : "", e_gptq, e_rtn, e_gptq / e_rtn,
               loss);
        CHECK(loss > 0 && isfinite(loss));
        CHECK(e_gptq < e_rtn);
        // 3 threads: same bytes, same W, same loss
        float *W3 = Q;
        memcpy(W3, W0, (size_t)(R * C) * sizeof(float));
        memcpy(Hc, H, (size_t)(C * C) * sizeof(float));
        o.n_threads = 3;
        double loss3 = -2;
        CHECK_EQ_INT(
            llmq_gptq_gguf_quantize("t", W3, Hc, R, C, t, with_importance ? imp : NULL, &o, blk3, &loss3, NULL),
            LLMQ_OK);
        CHECK(memcmp(blk, blk3, (size_t)R * rb) == 0);
        CHECK(memcmp(W, W3, (size_t)(R * C) * sizeof(float)) == 0);
        CHECK(loss == loss3);
    }
    free(blk3);
    free(blk);
    free(imp);
    free(Hc);
    free(H);
    free(Q);
    free(W);
    free(W0);
}

// Same bytes as the encoder when H = I: the types whose encoder stores the nearest level on its
// final scales (found by this test; the others pick codes by a weighted or joint search).
// Q4_0..Q5_1 and Q8_0 round x * (1/d) (truncation of x*id + 8.5 for Q4_0, roundf for Q8_0, ...),
// which is not always the level nearest to x on the decoded grid d * q; IQ4_XS picks the index with
// its own scale before the 6-bit scale rounding. A handful of elements per 8192 differ there.
static bool same_as_encoder(enum llmq_dtype t) {
    switch (t) {
    case LLMQ_DTYPE_Q2_K:
    case LLMQ_DTYPE_Q3_K:
    case LLMQ_DTYPE_Q4_K:
    case LLMQ_DTYPE_Q5_K:
    case LLMQ_DTYPE_Q6_K:
    case LLMQ_DTYPE_IQ4_NL: return true;
    default: return false;
    }
}

static void test_identity(void) {
    const int64_t R = 16, C = 512;
    float *W0 = malloc((size_t)(R * C) * sizeof(float)), *W = malloc((size_t)(R * C) * sizeof(float));
    float *Q = malloc((size_t)(R * C) * sizeof(float)), *H = malloc((size_t)(C * C) * sizeof(float));
    uint8_t *be = malloc((size_t)(R * C) * 4), *bg = malloc((size_t)(R * C) * 4);
    CHECK(W0 && W && Q && H && be && bg);
    for (int64_t i = 0; i < R * C; i++) W0[i] = frand() * (1.0f + 4.0f * (frand() > 0.97f));
    for (int ti = 0; ti < N_TYPES; ti++) {
        enum llmq_dtype t = types[ti];
        const int64_t QK = llmq_dtype_traits(t)->blck;
        size_t rb = 0, bsz = llmq_dtype_traits(t)->size;
        CHECK(llmq_dtype_nbytes(t, C, &rb));
        memset(H, 0, (size_t)(C * C) * sizeof(float));
        for (int64_t i = 0; i < C; i++) H[i * C + i] = 1.0f;
        struct llmq_gptq_gguf_opts o = llmq_gptq_gguf_opts_default();
        memcpy(W, W0, (size_t)(R * C) * sizeof(float));
        CHECK_EQ_INT(llmq_gptq_gguf_quantize("t", W, H, R, C, t, NULL, &o, bg, NULL, NULL), LLMQ_OK);
        // the encoder, block by block, with importance diag(I) = 1 (what the solver used)
        float *ones = malloc((size_t)C * sizeof(float));
        CHECK(ones);
        for (int64_t c = 0; c < C; c++) ones[c] = 1.0f;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c += QK)
                CHECK_EQ_INT(
                    llmq_gguf_encode_row_ref(t, W0 + r * C + c, be + r * rb + (size_t)(c / QK) * bsz, QK, ones),
                    LLMQ_OK);
        free(ones);
        for (int64_t r = 0; r < R; r++) CHECK_EQ_INT(llmq_dequantize_row(t, be + r * rb, Q + r * C, C), LLMQ_OK);
        int64_t n_diff = 0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                // same grid for every element (scales untouched by the solver)
                struct llmq_gguf_grid ge, gg;
                const uint8_t *pe = be + r * rb + (size_t)(c / QK) * bsz, *pg = bg + r * rb + (size_t)(c / QK) * bsz;
                llmq_gguf_block_grid(t, pe, (int)(c % QK), &ge);
                llmq_gguf_block_grid(t, pg, (int)(c % QK), &gg);
                if (!(ge.A == gg.A && ge.B == gg.B && ge.n_levels == gg.n_levels && ge.L == gg.L)) {
                    fprintf(stderr, "%s: (%lld, %lld): grid A %g / %g, B %g / %g, levels %d / %d\n", llmq_dtype_name(t),
                            (long long)r, (long long)c, (double)ge.A, (double)gg.A, (double)ge.B, (double)gg.B,
                            ge.n_levels, gg.n_levels);
                    CHECK(0);
                }
                const float w = W0[r * C + c];
                CHECK(fabsf(w - W[r * C + c]) <= fabsf(w - Q[r * C + c]));
                n_diff += W[r * C + c] != Q[r * C + c];
            }
        printf("%-7s H = I: %lld of %lld elements differ from the encoder's (all closer)\n", llmq_dtype_name(t),
               (long long)n_diff, (long long)(R * C));
        if (same_as_encoder(t)) CHECK(memcmp(be, bg, (size_t)R * rb) == 0);
    }
    free(bg);
    free(be);
    free(H);
    free(Q);
    free(W);
    free(W0);
}

static void test_errors(void) {
    const int64_t R = 2, C = 64;
    float W[2 * 64], H[64 * 64], imp[64];
    uint8_t blk[2 * 64 * 4];
    struct llmq_gptq_gguf_opts o = llmq_gptq_gguf_opts_default();
    llmq_log_set_level(LLMQ_LOG_SILENT);
    for (int i = 0; i < R * C; i++) W[i] = frand();
    for (int i = 0; i < C * C; i++) H[i] = i % (C + 1) == 0 ? 1.0f : 0.0f;
    for (int i = 0; i < C; i++) imp[i] = 1.0f;
    CHECK_EQ_INT(llmq_gptq_gguf_quantize("blk.1.ffn_down", W, H, R, C, LLMQ_DTYPE_Q4_K, NULL, &o, blk, NULL, NULL),
                 LLMQ_ERR_ARG); // 64 does not tile 256
    CHECK_CONTAINS(llmq_last_error(), "blk.1.ffn_down");
    CHECK_EQ_INT(llmq_gptq_gguf_quantize("t", W, H, R, C, LLMQ_DTYPE_F16, NULL, &o, blk, NULL, NULL), LLMQ_ERR_ARG);
    W[70] = NAN;
    CHECK_EQ_INT(llmq_gptq_gguf_quantize("blk.2.attn_q", W, H, R, C, LLMQ_DTYPE_Q4_0, NULL, &o, blk, NULL, NULL),
                 LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "blk.2.attn_q");
    W[70] = 0.5f;
    imp[3] = -1.0f;
    CHECK_EQ_INT(llmq_gptq_gguf_quantize("t", W, H, R, C, LLMQ_DTYPE_Q4_0, imp, &o, blk, NULL, NULL), LLMQ_ERR_NUMERIC);
    o.percdamp = 1.5f;
    CHECK_EQ_INT(llmq_gptq_gguf_quantize("t", W, H, R, C, LLMQ_DTYPE_Q4_0, NULL, &o, blk, NULL, NULL), LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);
}

// Σ (X̃ Qᵀ − X Wᵀ)² over N tokens (X, X̃ (N, C); W, Q (R, C)), in double.
static double asym_objective(const float *X, const float *Xq, const float *W, const float *Q, int64_t N, int64_t R,
                             int64_t C) {
    double e = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < R; r++) {
            double a = 0;
            for (int64_t c = 0; c < C; c++)
                a += (double)Xq[n * C + c] * Q[r * C + c] - (double)X[n * C + c] * W[r * C + c];
            e += a * a;
        }
    return e;
}

static void test_gptaq(bool act_order) {
    const int64_t R = 24, C = 256, N = 1024;
    float *X = malloc((size_t)(N * C) * sizeof *X), *Xq = malloc((size_t)(N * C) * sizeof *Xq);
    float *Dx = malloc((size_t)(N * C) * sizeof *Dx), *H = malloc((size_t)(C * C) * sizeof *H);
    float *Dxx = malloc((size_t)(C * C) * sizeof *Dxx), *W0 = malloc((size_t)(R * C) * sizeof *W0);
    float *W = malloc((size_t)(R * C) * sizeof *W), *Dec = malloc((size_t)(R * C) * sizeof *Dec);
    uint8_t *blk = malloc((size_t)(R * C) * 2), *blk0 = malloc((size_t)(R * C) * 2);
    CHECK(X && Xq && Dx && H && Dxx && W0 && W && Dec && blk && blk0);
    test_correlated_x(&rng_state, N, C, X);
    test_correlated_x(&rng_state, N, C, Dx); // the perturbation the quantized blocks before make
    for (int64_t i = 0; i < N * C; i++) Xq[i] = X[i] + 0.15f * Dx[i];
    for (int64_t i = 0; i < N * C; i++) Dx[i] = X[i] - Xq[i];
    for (int64_t i = 0; i < R * C; i++) W0[i] = 0.05f * frand();
    static const enum llmq_dtype tt[] = {LLMQ_DTYPE_Q4_0, LLMQ_DTYPE_Q3_K, LLMQ_DTYPE_Q4_K, LLMQ_DTYPE_IQ4_NL};
    for (int t = 0; t < 4; t++) {
        size_t rb = 0;
        CHECK(llmq_dtype_nbytes(tt[t], C, &rb));
        double base = -1;
        for (int v = 0; v < 4; v++) { // plain, D = 0, alpha 1, alpha 0.25
            struct llmq_gptq_gguf_opts o = llmq_gptq_gguf_opts_default();
            o.act_order = act_order;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)C, (int)C, (int)N, 2.0f / (float)N, Xq, (int)C,
                        Xq, (int)C, 0.0f, H, (int)C);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)C, (int)C, (int)N, 2.0f / (float)N, Dx, (int)C,
                        Xq, (int)C, 0.0f, Dxx, (int)C);
            if (v == 1) memset(Dxx, 0, (size_t)(C * C) * sizeof *Dxx);
            if (v >= 1) o.dxxt = Dxx;
            o.gptaq_alpha = v == 3 ? 0.25f : 1.0f;
            memcpy(W, W0, (size_t)(R * C) * sizeof *W);
            CHECK_OK(llmq_gptq_gguf_quantize("gptaq", W, H, R, C, tt[t], NULL, &o, v ? blk : blk0, NULL, NULL));
            check_decodes_to(tt[t], v ? blk : blk0, rb, W, R, C, Dec);
            double e = asym_objective(X, Xq, W0, W, N, R, C);
            if (v == 0) base = e;
            if (v == 1) CHECK(memcmp(blk, blk0, rb * (size_t)R) == 0);
            if (v >= 2) {
                printf("test_gptq_gguf: gptaq %s%s alpha %.2f: asym objective %.4g (plain GPTQ %.4g)\n",
                       llmq_dtype_name(tt[t]), act_order ? " act-order" : "", (double)o.gptaq_alpha, e, base);
                CHECK(e < base);
            }
        }
    }
    free(blk0), free(blk), free(Dec), free(W), free(W0), free(Dxx), free(H), free(Dx), free(Xq), free(X);
}

int main(void) {
    test_errors();
    test_identity();
    test_gptq_vs_rtn(false, false);
    test_gptq_vs_rtn(true, false);
    test_gptq_vs_rtn(false, true); // act-order: static block grids, then codes in decreasing diag(H) order
    test_gptq_vs_rtn(true, true);
    test_gptaq(false); // last: the draws of the tests above stay the ones they were written for
    test_gptaq(true);
    printf("test_gptq_gguf: ok\n");
    return 0;
}
