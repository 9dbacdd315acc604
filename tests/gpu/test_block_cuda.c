/*
 * tests/gpu/test_block_cuda.c — kernels/block.h on CUDA against the CPU block (label gpu; exits 77 = skipped
 * without CUDA or a device). Random llama / qwen2 / qwen3 shaped blocks (tests/block_fixture.h), seeded inputs,
 * several sequences with partial attention tiles, the first mismatches printed, exit 1 on any.
 * NEVER RUN ON A GPU YET (written and compiled on a machine without one).
 *
 * Tolerances:
 *   Block output: |gpu - cpu| <= 2 · bound, bound from tests/block_tolerance.h (the first-order bound on ONE FP32
 *     implementation's error against the float64 block; tests/unit/test_block.c checks the CPU block against float64
 *     with it): two implementations, each within it. Every layer starts both sides from the same x (the CPU's
 *     output of the layer before, uploaded), so the bound never has to cover an input difference.
 *   Rerun: the device block on the same input twice gives the same bits (cuBLAS without atomics, the kernels with a
 *     fixed reduction order, one stream).
 *   Gram sum of q/k/v's input: |gpu - cpu| <= (2 γ(256) + 20 u) · sqrt(G_ii G_jj) + 1e-12 |G_ij| (u = 2^-24): both
 *     sides normalise the same x (kernels/ops.h: within 5 FLT_EPSILON = 10 u of each other, so a product x_i x_j
 *     within 20 u), each multiplies a micro-batch of 256 rows in f32 (γ(256) of Σ_t |x_ti x_tj| each, in any
 *     order), and Σ_t |x_ti x_tj| <= sqrt(G_ii G_jj) (Cauchy-Schwarz on the CPU's diagonal); the f64 sums over the
 *     batches add under 2^-53 each (the 1e-12 term).
 *   Gram sums of o's, gate's and down's inputs: those inputs already differ by the propagated block error, which
 *     has no element-wise relative bound (cancellation), so they are compared at 1e-3 · sqrt(G_ii G_jj): a SMOKE
 *     CHECK (a wrong input or a lost micro-batch is O(1) off), NOT a derived tolerance.
 *   Column sums of q/k/v's input (Σ|x|, Σx² per column, f64): the same normalised inputs, within 10 u of each other,
 *     so |ΔΣ|x|| <= 10 u Σ|x| and |ΔΣx²| <= (20 u + 100 u²) Σx² <= 21 u Σx² (|x'² - x²| = |x' - x| |x' + x|), plus
 *     the f64 sums' rounding (n 2^-53 relative: the 1e-12 term). The other inputs' column sums: 1e-3 of the value,
 *     a SMOKE CHECK as their Gram sums.
 *   The device Hessian (llmq_block_hessian, converted on the device) against (float)(scale · G) of the
 *     device's own Gram sum on the host: BIT FOR BIT (one f64 product rounded to f32 on both sides).
 *   llmq_block_gather, and llmq_block_attn then llmq_block_ffn, against the device's own forward with sums on the
 *     same x: BIT FOR BIT (the same kernels and cuBLAS calls in the same order), the inputs outside the mask zero, x
 *     unchanged by the gathers.
 *   The column-sum kernel alone (kernels/block.h llmq_block_cuda_colsums against llmq_block_colsums_cpu on the same
 *     input: odd sizes, two calls accumulating, a NaN and an Inf planted): BIT FOR BIT, and the same first
 *     non-finite index (the device adds the rows of a column in the reference's order, without FMA contraction).
 */
#include "harness.h"

#include "block_fixture.h"
#include "block_tolerance.h"

#include "common/log.h"
#include "kernels/backend.h"
#include "kernels/block.h"

#include <cblas.h>
#include <float.h>
#include <math.h>

static uint64_t rng = 0x452821E638D01377ull;
static int failures;

static float *host(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    CHECK(p);
    return p;
}

// One Gram sum, gpu vs cpu (C, C) upper triangles, at rel · sqrt(G_ii G_jj) + 1e-12 |G_ij|.
static void compare_gram(const char *label, const double *g, const double *c, int64_t C, double rel) {
    int64_t bad = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = i; j < C; j++) {
            const double ref = c[i * C + j], e = fabs(g[i * C + j] - ref);
            const double tol = rel * sqrt(fabs(c[i * C + i] * c[j * C + j])) + 1e-12 * fabs(ref) + 1e-30;
            if (e / tol > worst || isnan(e)) worst = isnan(e) ? INFINITY : e / tol;
            if (!(e <= tol) && bad++ < 5)
                fprintf(stderr, "%s: (%lld, %lld): gpu %.17g cpu %.17g (tol %.3g)\n", label, (long long)i, (long long)j,
                        g[i * C + j], ref, tol);
        }
    printf("%-64s %s: max |gpu - cpu| / tol %.3g\n", label, bad ? "FAIL" : "ok", worst);
    if (bad) failures++;
}

// One input's column sums gpu vs cpu ((2, C): Σ|x|, then Σx²) at rel_abs / rel_sq of the value (+ 1e-12 of it).
static void compare_cols(const char *label, const double *g, const double *c, int64_t C, double rel_abs,
                         double rel_sq) {
    int64_t bad = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < 2 * C; i++) {
        const double ref = c[i], e = fabs(g[i] - ref);
        const double tol = (i < C ? rel_abs : rel_sq) * fabs(ref) + 1e-12 * fabs(ref) + 1e-30;
        worst = isnan(e) ? INFINITY : fmax(worst, e / tol);
        if (!(e <= tol) && bad++ < 5)
            fprintf(stderr, "%s: %s[%lld]: gpu %.17g cpu %.17g (tol %.3g)\n", label, i < C ? "sum_abs" : "sum_sq",
                    (long long)(i % C), g[i], ref, tol);
    }
    printf("%-64s %s: max |gpu - cpu| / tol %.3g\n", label, bad ? "FAIL" : "ok", worst);
    if (bad) failures++;
}

// Every layer of fm: the CUDA and CPU blocks from the same x, n_seq sequences of S tokens, then the Gram and column
// sums.
static void check_family(struct fix_model *fm, const char *name, int64_t n_seq, int64_t S) {
    const struct llmq_block_shape *s = &fm->s;
    const int64_t D = s->n_embd, n = n_seq * S;
    struct llmq_block *cb = NULL, *gb = NULL;
    const unsigned sums = LLMQ_BLOCK_SUM_GRAM | LLMQ_BLOCK_SUM_COLS;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, s, n, S, sums, &cb));
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CUDA, s, n, S, sums, &gb));
    struct llmq_ops *gops = llmq_block_ops(gb);
    struct llmq_ops_buf cx, gx;
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(cb), n * D, &cx));
    CHECK_OK(llmq_ops_buf_alloc(gops, n * D, &gx));
    float *x = host(n * D), *g = host(n * D), *g2 = host(n * D);
    double *ex = malloc((size_t)(n * D) * sizeof(double)), *bd = malloc((size_t)(n * D) * sizeof(double));
    CHECK(ex && bd);
    for (int64_t i = 0; i < n * D; i++) x[i] = 2.0f * test_frand(&rng);
    char label[160];
    for (int l = 0; l < fm->n_layer; l++) {
        fix_load(fm, l, cb);
        fix_load(fm, l, gb);
        CHECK_OK(llmq_block_sums_zero(cb));
        CHECK_OK(llmq_block_sums_zero(gb));
        CHECK(block_tol_reference(s, (const float *const *)fm->w[l], x, n_seq, S, ex, bd) == 0);
        memcpy(cx.data, x, (size_t)(n * D) * sizeof(float));
        CHECK_OK(llmq_ops_upload(gops, &gx, 0, x, n * D));
        CHECK_OK(llmq_block_forward(cb, &cx, n_seq, S, true));
        CHECK_OK(llmq_block_forward(gb, &gx, n_seq, S, true));
        CHECK_OK(llmq_ops_download(gops, g, &gx, 0, n * D));
        CHECK_OK(llmq_ops_upload(gops, &gx, 0, x, n * D)); // the same input again: the same bits
        CHECK_OK(llmq_block_forward(gb, &gx, n_seq, S, false));
        CHECK_OK(llmq_ops_download(gops, g2, &gx, 0, n * D));
        for (int64_t i = 0; i < n * D; i++) ex[i] = cx.data[i]; // the oracle is the CPU block; the bound stays
        double worst = 0.0;
        snprintf(label, sizeof label, "%s layer %d, %lldx%lld tokens", name, l, (long long)n_seq, (long long)S);
        const int64_t bad = block_tol_outside_scaled(label, g, ex, bd, 2.0, n * D, &worst);
        const bool same = memcmp(g, g2, (size_t)(n * D) * sizeof(float)) == 0;
        printf("%-64s %s: max |gpu - cpu| / (2 bound) %.3g, %lld outside, rerun %s\n", label,
               bad || !same ? "FAIL" : "ok", worst, (long long)bad, same ? "bit-identical" : "DIFFERS");
        if (bad || !same) failures++;
        for (int k = 0; k < LLMQ_BLOCK_GRAM_COUNT; k++) {
            const int64_t C = llmq_block_gram_dim(cb, (enum llmq_block_gram)k);
            double *gc = calloc((size_t)(C * C), sizeof(double)), *gg = calloc((size_t)(C * C), sizeof(double));
            CHECK(gc && gg);
            CHECK_OK(llmq_block_gram_download(cb, (enum llmq_block_gram)k, gc));
            CHECK_OK(llmq_block_gram_download(gb, (enum llmq_block_gram)k, gg));
            static const char *const gname[] = {"q/k/v", "o", "gate/up", "down"};
            snprintf(label, sizeof label, "%s layer %d Gram sum of %s's input (C %lld)%s", name, l, gname[k],
                     (long long)C, k ? " [smoke]" : "");
            compare_gram(label, gg, gc, C, k ? 1e-3 : 2.0 * bt_gamma(256) + 20.0 * BT_U);
            const int64_t hbad = fix_hessian_differ(gb, (enum llmq_block_gram)k, 2.0 / 3.0);
            if (hbad) {
                printf("%s layer %d: the device Hessian of input %d differs from its Gram's in %lld elements: FAIL\n",
                       name, l, k, (long long)hbad);
                failures++;
            }
            memset(gc, 0, (size_t)(2 * C) * sizeof(double));
            memset(gg, 0, (size_t)(2 * C) * sizeof(double));
            int64_t bc = 0, bg = 0;
            CHECK_OK(llmq_block_colsums_download(cb, (enum llmq_block_gram)k, gc, gc + C, &bc));
            CHECK_OK(llmq_block_colsums_download(gb, (enum llmq_block_gram)k, gg, gg + C, &bg));
            CHECK(bc == -1 && bg == -1);
            snprintf(label, sizeof label, "%s layer %d column sums of %s's input%s", name, l, gname[k],
                     k ? " [smoke]" : "");
            compare_cols(label, gg, gc, C, k ? 1e-3 : 10.0 * BT_U, k ? 1e-3 : 21.0 * BT_U);
            free(gc), free(gg);
        }
        memcpy(x, cx.data, (size_t)(n * D) * sizeof(float)); // the next layer's input, the same on both sides
    }
    free(x), free(g), free(g2), free(ex), free(bd);
    llmq_ops_buf_free(&cx);
    llmq_ops_buf_free(&gx);
    llmq_block_free(cb);
    llmq_block_free(gb);
}

// The column-sum kernel against its reference on the same x (n, C): two calls (rows 0..n1-1, then n1..n-1, row0 n1)
// accumulating into the same sums, a NaN and an Inf planted when plant; bit for bit, the same first non-finite index.
static void check_colsums_kernel(int64_t n, int64_t n1, int64_t C, bool plant) {
    struct llmq_ops *ops = NULL;
    CHECK_OK(llmq_ops_init(LLMQ_BACKEND_CUDA, &ops));
    float *x = host(n * C);
    for (int64_t i = 0; i < n * C; i++) x[i] = 3.0f * test_frand(&rng) * (i % 7 == 0 ? 1e-20f : 1.0f);
    const int64_t first = plant ? (n - 1) * C + C / 2 : -1; // the first in row-major order: Inf after it, NaN before
    if (plant) x[first] = INFINITY, x[n * C - 1] = NAN;
    double *ref = calloc((size_t)(2 * C), sizeof(double)), *got = malloc((size_t)(2 * C) * sizeof(double));
    CHECK(ref && got);
    uint64_t bref = UINT64_MAX, bgot = 0;
    llmq_block_colsums_cpu(x, n1, C, 0, ref, &bref);
    llmq_block_colsums_cpu(x + n1 * C, n - n1, C, n1, ref, &bref);
    struct llmq_ops_buf dx, dacc, dbad;
    CHECK_OK(llmq_ops_buf_alloc(ops, n * C, &dx));
    CHECK_OK(llmq_ops_buf_alloc(ops, 4 * C, &dacc));
    CHECK_OK(llmq_ops_buf_alloc(ops, 2, &dbad));
    CHECK_OK(llmq_ops_upload(ops, &dx, 0, x, n * C));
    float *zeros = calloc((size_t)(4 * C), sizeof(float)), none[2];
    CHECK(zeros);
    memset(none, 0xff, sizeof none); // UINT64_MAX: no non-finite value yet
    CHECK_OK(llmq_ops_upload(ops, &dacc, 0, zeros, 4 * C));
    CHECK_OK(llmq_ops_upload(ops, &dbad, 0, none, 2));
    free(zeros);
    void *st = llmq_ops_stream(ops);
    double *acc = (double *)(void *)dacc.data;
    uint64_t *bad = (uint64_t *)(void *)dbad.data;
    CHECK_OK(llmq_block_cuda_colsums(st, dx.data, n1, C, 0, acc, bad));
    CHECK_OK(llmq_block_cuda_colsums(st, dx.data + n1 * C, n - n1, C, n1, acc, bad));
    CHECK_OK(llmq_ops_download(ops, (float *)(void *)got, &dacc, 0, 4 * C));
    CHECK_OK(llmq_ops_download(ops, (float *)(void *)&bgot, &dbad, 0, 2));
    int64_t differ = 0;
    for (int64_t i = 0; i < 2 * C; i++) {
        const bool same = memcmp(&got[i], &ref[i], sizeof(double)) == 0;
        if (!same && differ++ < 5)
            fprintf(stderr, "colsums (%lld, %lld) [%lld]: gpu %.17g ref %.17g\n", (long long)n, (long long)C,
                    (long long)i, got[i], ref[i]);
    }
    const bool marks = bref == (plant ? (uint64_t)first : UINT64_MAX) && bgot == bref;
    char label[96];
    snprintf(label, sizeof label, "column-sum kernel (%lld, %lld)%s", (long long)n, (long long)C,
             plant ? ", NaN / Inf planted" : "");
    printf("%-64s %s: %lld of %lld sums differ, first non-finite %s\n", label, differ || !marks ? "FAIL" : "ok",
           (long long)differ, (long long)(2 * C), marks ? "the same" : "DIFFERS");
    if (differ || !marks) failures++;
    free(x), free(ref), free(got);
    llmq_ops_buf_free(&dx), llmq_ops_buf_free(&dacc), llmq_ops_buf_free(&dbad);
    llmq_ops_free(ops);
}

// Refusals on the device: x on the host given to the CUDA block.
static void test_refusals(struct fix_model *fm) {
    struct llmq_block *gb = NULL;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CUDA, &fm->s, 16, 16, 0, &gb));
    fix_load(fm, 0, gb);
    float *x = host(16 * fm->s.n_embd);
    struct llmq_ops_buf hx = llmq_ops_buf_host(x, 16 * fm->s.n_embd);
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_block_forward(gb, &hx, 1, 16, false) == LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);
    free(x);
    llmq_block_free(gb);
    printf("%-64s ok\n", "a host buffer given to the CUDA block: LLMQ_ERR_ARG");
}

// llmq_block_gather on the device against the device's own llmq_block_forward(..., true) on the same x: the sums of
// each input asked for BIT FOR BIT (the same kernels and cuBLAS calls in the same order; the attention residual formed
// as Wo·att + x, an IEEE add), the others zero, x unchanged.
static void check_gather(struct fix_model *fm, const char *name, int64_t n_seq, int64_t S) {
    const struct llmq_block_shape *s = &fm->s;
    const int64_t D = s->n_embd, n = n_seq * S;
    struct llmq_block *fb = NULL, *gb = NULL;
    const unsigned sums = LLMQ_BLOCK_SUM_GRAM | LLMQ_BLOCK_SUM_COLS;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CUDA, s, n, S, sums, &fb));
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CUDA, s, n, S, sums, &gb));
    struct llmq_ops_buf fx, gx;
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(fb), n * D, &fx));
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(gb), n * D, &gx));
    float *x = host(n * D), *back = host(n * D);
    for (int64_t i = 0; i < n * D; i++) x[i] = 2.0f * test_frand(&rng);
    const unsigned masks[] = {1u, 2u, 4u, 8u, 2u | 8u};
    int64_t bad = 0;
    fix_load(fm, 0, fb);
    fix_load(fm, 0, gb);
    CHECK_OK(llmq_block_sums_zero(fb));
    CHECK_OK(llmq_ops_upload(llmq_block_ops(fb), &fx, 0, x, n * D));
    CHECK_OK(llmq_block_forward(fb, &fx, n_seq, S, true));
    for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++) {
        CHECK_OK(llmq_block_sums_zero(gb));
        CHECK_OK(llmq_ops_upload(llmq_block_ops(gb), &gx, 0, x, n * D));
        CHECK_OK(llmq_block_gather(gb, &gx, n_seq, S, masks[mi]));
        CHECK_OK(llmq_ops_download(llmq_block_ops(gb), back, &gx, 0, n * D));
        bad += memcmp(back, x, (size_t)(n * D) * sizeof(float)) != 0;
        bad += fix_sums_differ(fb, gb, masks[mi]);
    }
    // the halves: llmq_block_attn then llmq_block_ffn (apply) against the forward, bits and sums
    float *fwd = host(n * D);
    CHECK_OK(llmq_ops_download(llmq_block_ops(fb), fwd, &fx, 0, n * D));
    CHECK_OK(llmq_block_sums_zero(gb));
    CHECK_OK(llmq_ops_upload(llmq_block_ops(gb), &gx, 0, x, n * D));
    CHECK_OK(llmq_block_attn(gb, &gx, n_seq, S, 1u | 2u));
    CHECK_OK(llmq_block_ffn(gb, &gx, n_seq, S, 4u | 8u, true));
    CHECK_OK(llmq_ops_download(llmq_block_ops(gb), back, &gx, 0, n * D));
    bad += memcmp(back, fwd, (size_t)(n * D) * sizeof(float)) != 0;
    bad += fix_sums_differ(fb, gb, 0xfu);
    CHECK_OK(llmq_ops_upload(llmq_block_ops(gb), &gx, 0, x, n * D)); // the halves' outputs without the residual
    bad += fix_outs_differ(gb, &gx, n_seq, S);
    free(fwd);
    printf("%-64s %s: gather of 1, 2, 4, 8, o+down, attn + ffn vs the device forward, attn_out / mlp_out: %s\n", name,
           bad ? "FAIL" : "ok", bad ? "DIFFER" : "bit-identical sums and output, the others zero, x unchanged");
    if (bad) failures++;
    free(x), free(back);
    llmq_ops_buf_free(&fx), llmq_ops_buf_free(&gx);
    llmq_block_free(fb), llmq_block_free(gb);
}

int main(void) {
    test_need_cuda();
    openblas_set_num_threads(1);
    check_colsums_kernel(1, 1, 1, false);
    check_colsums_kernel(7, 3, 33, true);
    check_colsums_kernel(300, 256, 4097, true);
    check_colsums_kernel(33, 0, 7, false);
    struct fix_model fm;
    fix_init(&fm, FIX_LLAMA, 48, 40, 6, 2, 8, 2, false, &rng);
    check_family(&fm, "llama D 48 GQA 3:1 Dh 8", 2, 70);
    test_refusals(&fm);
    fix_free(&fm);
    fix_init(&fm, FIX_QWEN2, 256, 512, 4, 2, 64, 2, false, &rng);
    check_family(&fm, "qwen2 D 256 GQA 2:1 Dh 64 bias", 2, 200); // 400 tokens: two Gram micro-batches
    check_gather(&fm, "qwen2 D 256 GQA 2:1 Dh 64 bias", 2, 200);
    fix_free(&fm);
    fix_init(&fm, FIX_QWEN3, 128, 96, 2, 1, 128, 2, false, &rng);
    check_family(&fm, "qwen3 D 128 MQA Dh 128 q/k norm", 1, 300);
    check_gather(&fm, "qwen3 D 128 MQA Dh 128 q/k norm", 1, 300);
    fix_free(&fm);
    if (failures) fprintf(stderr, "%d checks failed\n", failures);
    return failures ? 1 : 0;
}
