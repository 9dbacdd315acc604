// tests/unit/test_gemm_cpu.c — kernels/gemm.h's dispatch on the CPU: the cblas path against a naive
// double-precision loop (all transposes, strides, alpha/beta, K = 0), SYRK's untouched lower
// triangle, the Gram sums of calibration (one SYRK, or row tiles for wide inputs) exact on integer data, argument
// errors, and the CUDA backend's behaviour without a device (small products run
// the CPU path; large ones are LLMQ_ERR_DEVICE in a build without CUDA). GPU-vs-CPU: tests/gpu/test_gemm.c.
#include "harness.h"

#include "kernels/backend.h"
#include "kernels/gemm.h"

#include <float.h>
#include <math.h>

static double urand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return (double)((*s >> 8) & 0xFFFF) / 32768.0 - 1.0;
}

// Relative to Σ|a||b| (+ |beta c|): K·eps bounds any f32 summation order.
static void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    unsigned s = (unsigned)(M * 131 + N * 17 + K + ta * 7 + tb * 3);
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int64_t lda = ac + 2, ldb = bc + 1, ldc = N + 3;
    float A[40 * 42], B[40 * 41], C[40 * 43], C0[40 * 43];
    CHECK(ar * lda <= 40 * 42 && br * ldb <= 40 * 41 && M * ldc <= 40 * 43);
    for (int64_t i = 0; i < ar * lda; i++) A[i] = (float)urand(&s);
    for (int64_t i = 0; i < br * ldb; i++) B[i] = (float)urand(&s);
    for (int64_t i = 0; i < M * ldc; i++) C[i] = C0[i] = (i % ldc) >= N ? -7.0f : beta == 0.0f ? NAN : (float)urand(&s);
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == LLMQ_OK);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            if (j >= N) {
                CHECK(C[i * ldc + j] == -7.0f);
                continue;
            }
            double ref = beta == 0.0f ? 0.0 : (double)beta * C0[i * ldc + j], mag = fabs(ref);
            for (int64_t k = 0; k < K; k++) {
                double p =
                    (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (double)(tb ? B[j * ldb + k] : B[k * ldb + j]);
                ref += alpha * p;
                mag += fabs(alpha * p);
            }
            if (!(fabs(C[i * ldc + j] - ref) <= (K + 2) * FLT_EPSILON * mag + 1e-30)) {
                fprintf(stderr, "ta %d tb %d M %lld N %lld K %lld: C[%lld][%lld] = %.9g, want %.9g\n", ta, tb,
                        (long long)M, (long long)N, (long long)K, (long long)i, (long long)j, C[i * ldc + j], ref);
                CHECK(0);
            }
        }
}

// llmq_gram_acc_f64 over C columns, N rows of small integers (every f32 product and sum exact, so any tiling must
// give the exact sums): the upper triangle of sampled rows against a double loop, the lower triangle untouched.
static void check_gram(int64_t C, int64_t N) {
    float *X = malloc((size_t)(N * C) * sizeof(float));
    float *scr = malloc((size_t)(llmq_gram_scratch_rows(C) * C) * sizeof(float));
    double *acc = calloc((size_t)(C * C), sizeof(double));
    CHECK(X && scr && acc);
    unsigned s = (unsigned)(C * 7 + N);
    for (int64_t i = 0; i < N * C; i++) X[i] = (float)(int)(urand(&s) * 2.99);     // -2 .. 2
    for (int64_t i = 0; i < C; i++) acc[i * C + (i ? i - 1 : 0)] = i ? -5.0 : 0.0; // the lower triangle: kept
    CHECK(llmq_gram_acc_f64(LLMQ_BACKEND_CPU, X, N, C, scr, acc) == LLMQ_OK);
    const int64_t probe[] = {0, 1, 511, 512, 513, C / 2, C - 5, C - 1};
    for (size_t p = 0; p < sizeof(probe) / sizeof(probe[0]); p++) {
        const int64_t i = probe[p];
        if (i) CHECK(acc[i * C + i - 1] == -5.0);
        for (int64_t j = i; j < C; j++) {
            double ref = 0;
            for (int64_t t = 0; t < N; t++) ref += (double)X[t * C + i] * (double)X[t * C + j];
            if (acc[i * C + j] != ref) {
                fprintf(stderr, "gram C %lld N %lld: [%lld][%lld] = %g, want %g\n", (long long)C, (long long)N,
                        (long long)i, (long long)j, acc[i * C + j], ref);
                CHECK(0);
            }
        }
    }
    free(X), free(scr), free(acc);
}

int main(void) {
    // the Gram sums: one SYRK up to LLMQ_GRAM_TILE_FROM columns, row tiles beyond (a last tile of 4 rows here);
    // two micro-batches (256 + 44 rows)
    CHECK(llmq_gram_scratch_rows(LLMQ_GRAM_TILE_FROM) == LLMQ_GRAM_TILE_FROM);
    CHECK(llmq_gram_scratch_rows(LLMQ_GRAM_TILE_FROM + 4) == LLMQ_GRAM_TILE);
    check_gram(600, 300);
    check_gram(LLMQ_GRAM_TILE_FROM + 4, 300);
    for (int t = 0; t < 4; t++) {
        check_gemm(t & 1, t >> 1, 1, 1, 1, 1.0f, 0.0f);
        check_gemm(t & 1, t >> 1, 7, 33, 5, -0.5f, 2.0f);
        check_gemm(t & 1, t >> 1, 33, 7, 39, 1.0f, 0.0f);
        check_gemm(t & 1, t >> 1, 3, 5, 0, 1.0f, 1.5f); // K = 0: C = beta C
    }
    // f64 with the same layout rules
    double A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, -1, 2, 0.5, 3}, C[4] = {0};
    CHECK(llmq_gemm_f64(LLMQ_BACKEND_CPU, false, true, 2, 2, 3, 1.0, A, 3, B, 3, 0.0, C, 2) == LLMQ_OK);
    CHECK(C[0] == -2.0 && C[1] == 12.0 && C[2] == -2.0 && C[3] == 28.5);
    // SYRK: upper of C = Aᵀ A (+ beta C), strict lower untouched
    float X[3 * 2] = {1, 2, 3, 4, 5, 6}, S[2 * 3] = {9, 9, -1, 9, 9, -1}; // (K 3, N 2); C (2, 2) with ldc 3
    CHECK(llmq_syrk_f32_acc(LLMQ_BACKEND_CPU, 2, 3, 1.0f, X, 2, 0.0f, S, 3) == LLMQ_OK);
    CHECK(S[0] == 35.0f && S[1] == 44.0f && S[3] == 9.0f && S[4] == 56.0f && S[2] == -1.0f && S[5] == -1.0f);
    CHECK(llmq_syrk_f32_acc(LLMQ_BACKEND_CPU, 2, 3, 0.5f, X, 2, 1.0f, S, 3) == LLMQ_OK); // accumulate
    CHECK(S[0] == 52.5f && S[1] == 66.0f && S[3] == 9.0f && S[4] == 84.0f);
    // bad shapes and strides
    float x[4] = {0};
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, false, false, 2, 2, 2, 1.0f, x, 1, x, 2, 0.0f, x, 2) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "lda 1");
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, false, false, -1, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 2) == LLMQ_ERR_ARG);
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, false, false, 1LL << 31, 1, 1, 1.0f, x, 1, x, 1, 0.0f, x, 1) == LLMQ_ERR_ARG);
    CHECK(llmq_syrk_f32_acc(LLMQ_BACKEND_CPU, 2, 2, 1.0f, x, 2, 0.0f, x, 1) == LLMQ_ERR_ARG);
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, false, false, 0, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 2) == LLMQ_OK); // no-op

    // The CUDA backend: small products are the CPU path whatever the build; large ones need a device.
    CHECK(!llmq_gemm_on_device(LLMQ_BACKEND_CPU, 1 << 12, 1 << 12, 1 << 12));
    float a2[4] = {1, 2, 3, 4}, c2[4];
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CUDA, false, false, 2, 2, 2, 1.0f, a2, 2, a2, 2, 0.0f, c2, 2) == LLMQ_OK);
    CHECK(c2[0] == 7.0f && c2[1] == 10.0f && c2[2] == 15.0f && c2[3] == 22.0f);
    if (!llmq_backend_cuda_compiled() && !getenv("LLMQ_GEMM_CUDA_MIN_WORK")) {
        const int64_t n = 256; // 256³ = the threshold
        float *big = calloc((size_t)(n * n), sizeof(float)), *out = calloc((size_t)(n * n), sizeof(float));
        CHECK(big && out);
        CHECK(llmq_gemm_on_device(LLMQ_BACKEND_CUDA, n, n, n));
        CHECK(llmq_gemm_f32(LLMQ_BACKEND_CUDA, false, false, n, n, n, 1.0f, big, n, big, n, 0.0f, out, n) ==
              LLMQ_ERR_DEVICE);
        CHECK_CONTAINS(llmq_last_error(), "without CUDA");
        CHECK(llmq_syrk_f32_acc(LLMQ_BACKEND_CUDA, n, n, 1.0f, big, n, 0.0f, out, n) == LLMQ_ERR_DEVICE);
        double *bd = calloc((size_t)(n * n), sizeof(double)), *od = calloc((size_t)(n * n), sizeof(double));
        CHECK(bd && od);
        CHECK(llmq_gemm_f64(LLMQ_BACKEND_CUDA, false, false, n, n, n, 1.0, bd, n, bd, n, 0.0, od, n) ==
              LLMQ_ERR_DEVICE);
        free(big), free(out), free(bd), free(od);
        llmq_gemm_cuda_release(); // a no-op without CUDA
    }
    return 0;
}
