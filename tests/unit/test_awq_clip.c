/*
 * tests/unit/test_awq_clip.c — kernels/awq_clip.h on the CPU (the device half: tests/gpu/test_awq_clip_cuda.c).
 *
 *  1. The candidates (llmq_awq_clip_candidates) equal quant/awq.c's own, made here the way its clip_weight makes
 *     them (clamp to ± amax · (1 − i / n_grid), llmq_quant_params_awq, llmq_quant_code), bit for bit.
 *  2. The choice and its error against the output form the host search uses, computed here in f64 straight from
 *     the definition (1/T) Σ_t (x_t · q_i − x_t · w)²: the errors agree to 1e-9 relative, and the chosen shrink is
 *     the same wherever the two smallest errors differ by more than 1e-9 relative (a near tie may go either way);
 *     a wrong Gram matrix (one token dropped) is caught.
 *  3. Bad arguments are LLMQ_ERR_ARG; the CUDA backend without a device (or without CUDA) is LLMQ_ERR_DEVICE.
 */
#include "harness.h"

#include "common/log.h"
#include "kernels/awq_clip.h"
#include "kernels/backend.h"
#include "quant/quantizer.h"

#include <math.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;

// The host search's candidates for one group (quant/awq.c clip_weight + pseudo_quantize_group).
static void host_candidates(const float *w, int64_t G, int bits, int K, int n_grid, float *q) {
    float amax = 0.0f, tmp[256];
    for (int64_t j = 0; j < G; j++) amax = fmaxf(amax, fabsf(w[j]));
    for (int i = 0; i < K; i++) {
        const float mx = amax * (float)(1.0 - (double)i / (double)n_grid), mn = -mx;
        for (int64_t j = 0; j < G; j++) tmp[j] = fminf(fmaxf(w[j], mn), mx);
        float scale, zero;
        llmq_quant_params_awq(tmp, G, 1, bits, false, &scale, &zero);
        const int maxq = (1 << bits) - 1;
        for (int64_t j = 0; j < G; j++)
            q[i * G + j] = ((float)llmq_quant_code(tmp[j], scale, zero, maxq) - zero) * scale;
    }
}

// e_i of (row r, group g) in the output form: (1/T) Σ_t (Σ_j x_tj q_ij − Σ_j x_tj w_j)², t0 the first token used.
static double output_err(const float *X, int64_t T, int64_t t0, int64_t C, int64_t c0, const float *q, const float *w,
                         int64_t G) {
    double e = 0.0;
    for (int64_t t = t0; t < T; t++) {
        double a = 0.0, b = 0.0;
        for (int64_t j = 0; j < G; j++) a += (double)X[t * C + c0 + j] * q[j], b += (double)X[t * C + c0 + j] * w[j];
        e += (a - b) * (a - b);
    }
    return e / (double)(T - t0);
}

static void test_case(int64_t R, int64_t C, int64_t G, int64_t T, int bits) {
    const int n_grid = 20, K = 10;
    const int64_t NG = C / G;
    float *W = malloc((size_t)(R * C) * sizeof(float)), *X = malloc((size_t)(T * C) * sizeof(float));
    float *best = malloc((size_t)(R * NG) * sizeof(float)), *q = malloc((size_t)(K * G) * sizeof(float));
    float *qh = malloc((size_t)(K * G) * sizeof(float));
    double *err = malloc((size_t)(R * NG) * sizeof(double));
    CHECK(W && X && best && q && qh && err);
    for (int64_t i = 0; i < R * C; i++) W[i] = 0.05f * (test_frand(&rng) + test_frand(&rng) + test_frand(&rng));
    for (int64_t i = 0; i < R * C; i += 97) W[i] *= 6.0f; // outliers: clipping pays
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) X[t * C + c] = test_frand(&rng) * (c % 13 == 0 ? 8.0f : 1.0f);
    CHECK_OK(llmq_awq_clip(LLMQ_BACKEND_CPU, W, R, C, G, X, T, bits, K, n_grid, best, err));
    int64_t same_choice = 0, decided = 0, cand_bad = 0, caught = 0;
    double worst = 0.0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t g = 0; g < NG; g++) {
            const float *w = W + r * C + g * G;
            const float amax = llmq_awq_clip_candidates(w, G, bits, K, n_grid, q);
            host_candidates(w, G, bits, K, n_grid, qh);
            cand_bad += memcmp(q, qh, (size_t)(K * G) * sizeof(float)) != 0;
            double e1 = 1e9, e2 = 1e9, e_drop = 1e9;
            int i1 = -1;
            for (int i = 0; i < K; i++) {
                const double e = output_err(X, T, 0, C, g * G, q + i * G, w, G);
                if (e < e1)
                    e2 = e1, e1 = e, i1 = i;
                else if (e < e2)
                    e2 = e;
                const double ed = output_err(X, T, 1, C, g * G, q + i * G, w, G);
                e_drop = ed < e_drop ? ed : e_drop;
            }
            const double got = err[r * NG + g];
            worst = fmax(worst, fabs(got - e1) / fmax(e1, 1e-300));
            caught += fabs(got - e_drop) > 1e-6 * e_drop;
            if (e2 - e1 > 1e-9 * e1) {
                decided++;
                same_choice += best[r * NG + g] == amax * (float)(1.0 - (double)i1 / (double)n_grid);
            }
        }
    printf("clip (%lld, %lld) G %lld T %lld %d bits: candidates differ in %lld groups; errors within %.2e rel; choice "
           "equal on %lld of %lld decided (row, group)s; a dropped token seen in %lld of %lld\n",
           (long long)R, (long long)C, (long long)G, (long long)T, bits, (long long)cand_bad, worst,
           (long long)same_choice, (long long)decided, (long long)caught, (long long)(R * NG));
    CHECK(cand_bad == 0);
    CHECK(worst < 1e-9);
    CHECK(same_choice == decided && decided > R * NG / 2);
    CHECK(caught > R * NG / 2);
    free(W), free(X), free(best), free(q), free(qh), free(err);
}

static void test_errors(void) {
    float w[8] = {0}, x[8] = {0}, best[2];
    double err[2];
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_awq_clip(LLMQ_BACKEND_CPU, w, 1, 8, 3, x, 1, 4, 10, 20, best, err) == LLMQ_ERR_ARG); // 3 ∤ 8
    CHECK_CONTAINS(llmq_last_error(), "group 3");
    CHECK(llmq_awq_clip(LLMQ_BACKEND_CPU, w, 1, 8, 4, x, 0, 4, 10, 20, best, err) == LLMQ_ERR_ARG); // no tokens
    CHECK(llmq_awq_clip(LLMQ_BACKEND_CPU, w, 1, 8, 4, x, 1, 9, 10, 20, best, err) == LLMQ_ERR_ARG); // 9 bits
    CHECK(llmq_awq_clip(LLMQ_BACKEND_CPU, w, 1, 8, 4, x, 1, 4, 21, 20, best, err) == LLMQ_ERR_ARG); // K > n_grid
    if (llmq_cuda_device_count(NULL) == 0)
        CHECK(llmq_awq_clip(LLMQ_BACKEND_CUDA, w, 1, 8, 4, x, 1, 4, 10, 20, best, err) == LLMQ_ERR_DEVICE);
    llmq_log_set_level(LLMQ_LOG_INFO);
    // all-zero weights: every candidate is w, e = 0 at i = 0
    CHECK_OK(llmq_awq_clip(LLMQ_BACKEND_CPU, w, 1, 8, 4, x, 1, 4, 10, 20, best, err));
    CHECK(best[0] == 0.0f && err[0] == 0.0 && err[1] == 0.0);
}

int main(void) {
    test_case(5, 64, 32, 40, 4);
    test_case(33, 256, 64, 128, 4);
    test_case(17, 256, 128, 96, 3);
    test_errors();
    printf("test_awq_clip: ok\n");
    return 0;
}
