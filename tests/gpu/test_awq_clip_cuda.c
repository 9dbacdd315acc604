/*
 * tests/gpu/test_awq_clip_cuda.c (label gpu) — kernels/awq_clip_cuda.cu against the plain-C reference
 * kernels/awq_clip.c. The candidates are the same bits on both (llmq_awq_clip_candidates, compiled for both);
 * the Gram matrices and quadratic forms are cuBLAS DGEMMs, summed in another order than the C loops, so the
 * errors agree to rounding (stated tolerance: 1e-9 relative, f64 sums of at most T · G² terms of one sign
 * pattern) and a near tie may choose another shrink (at least 99.9% of the (row, group)s must choose the same).
 * Reruns on the device are bit-identical. Skipped (exit 77) without a device.
 */
#include "harness.h"

#include "kernels/awq_clip.h"
#include "kernels/backend.h"

#include <math.h>
#include <string.h>

static uint64_t rng = 0xD1B54A32D192ED03ull;

static void test_case(int64_t R, int64_t C, int64_t G, int64_t T, int bits) {
    const int K = 10, n_grid = 20;
    const int64_t NG = C / G;
    float *W = malloc((size_t)(R * C) * sizeof(float)), *X = malloc((size_t)(T * C) * sizeof(float));
    float *bc = malloc((size_t)(R * NG) * sizeof(float)), *bg = malloc((size_t)(R * NG) * sizeof(float));
    float *bg2 = malloc((size_t)(R * NG) * sizeof(float));
    double *ec = malloc((size_t)(R * NG) * sizeof(double)), *eg = malloc((size_t)(R * NG) * sizeof(double));
    double *eg2 = malloc((size_t)(R * NG) * sizeof(double));
    CHECK(W && X && bc && bg && bg2 && ec && eg && eg2);
    for (int64_t i = 0; i < R * C; i++) W[i] = 0.05f * (test_frand(&rng) + test_frand(&rng) + test_frand(&rng));
    for (int64_t i = 0; i < R * C; i += 97) W[i] *= 6.0f;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) X[t * C + c] = test_frand(&rng) * (c % 13 == 0 ? 8.0f : 1.0f);
    CHECK_OK(llmq_awq_clip(LLMQ_BACKEND_CPU, W, R, C, G, X, T, bits, K, n_grid, bc, ec));
    CHECK_OK(llmq_awq_clip(LLMQ_BACKEND_CUDA, W, R, C, G, X, T, bits, K, n_grid, bg, eg));
    CHECK_OK(llmq_awq_clip(LLMQ_BACKEND_CUDA, W, R, C, G, X, T, bits, K, n_grid, bg2, eg2));
    int64_t same = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < R * NG; i++) {
        if (bc[i] != bg[i]) continue;
        same++;
        worst = fmax(worst, fabs(eg[i] - ec[i]) / fmax(ec[i], 1e-300));
    }
    const double agree = (double)same / (double)(R * NG);
    printf("clip (%lld, %lld) G %lld T %lld %d bits: same shrink on %.5f of (row, group)s, errors within %.2e rel\n",
           (long long)R, (long long)C, (long long)G, (long long)T, bits, agree, worst);
    CHECK(agree >= 0.999);
    CHECK(worst < 1e-9);
    CHECK(memcmp(bg, bg2, (size_t)(R * NG) * sizeof(float)) == 0 &&
          memcmp(eg, eg2, (size_t)(R * NG) * sizeof(double)) == 0);
    free(W), free(X), free(bc), free(bg), free(bg2), free(ec), free(eg), free(eg2);
}

int main(void) {
    const char *why = NULL;
    if (llmq_cuda_device_count(&why) == 0) {
        fprintf(stderr, "skipped: no CUDA device (%s)\n", why ? why : "?");
        return TEST_SKIP;
    }
    test_case(5, 64, 32, 40, 4);
    test_case(33, 256, 64, 128, 4);
    test_case(17, 256, 128, 96, 3);
    test_case(700, 4096, 128, 256, 4); // two row chunks of the device's 512 MiB scratch
    printf("test_awq_clip_cuda: ok\n");
    return 0;
}
