// tests/gpu/test_gemm.c — kernels/gemm.h on CUDA against the CPU reference (label gpu; exits 77 =
// skipped without CUDA or a device).
//
// Cases: seeded random shapes incl. 1 and odd sizes, all four transA/transB combinations, alpha/beta
// (beta 0 with NaN in C, which must be ignored), padded strides (the padding must come back
// untouched), sizes under the device threshold (must equal the CPU bits exactly) and over it, f64,
// SYRK accumulated over several calls (strict lower triangle untouched), and 4 threads calling at once.
//
// Tolerance, per element: |gpu - cpu| <= 4 · sqrt(K) · eps · S[i][j] + tiny, with
// S = |alpha| · |op(A)| · |op(B)| + |beta| · |C0| (element-wise absolute values). The rounding error of
// either summation order is at most K · eps · S (Higham, Accuracy and Stability, §3.5), and with
// pairwise / blocked sums of random-sign data it behaves like sqrt(K) · eps · S; the factor 4 covers
// the two sides (CPU and GPU each contribute) and FMA-vs-separate rounding. A transposed or
// mis-strided operand gives errors of the order of S itself, ~1/(sqrt(K)·eps) times over the bound.
#include "harness.h"

#include "kernels/backend.h"
#include "kernels/gemm.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { return (double)(test_xorshift64(&rng) >> 11) / (double)(1ull << 52) - 1.0; } // [-1, 1)

#define SENTINEL 12345.0f

// One f32 GEMM case; returns the number of mismatches (prints the first few).
static int case_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int64_t lda = ac + 3, ldb = bc + 1, ldc = N + 2;
    float *A = malloc(sizeof(float) * (size_t)(ar * lda)), *B = malloc(sizeof(float) * (size_t)(br * ldb));
    float *C0 = malloc(sizeof(float) * (size_t)(M * ldc)), *Cc = malloc(sizeof(float) * (size_t)(M * ldc));
    float *Cg = malloc(sizeof(float) * (size_t)(M * ldc)), *S = malloc(sizeof(float) * (size_t)(M * N));
    float *aA = malloc(sizeof(float) * (size_t)(ar * lda)), *aB = malloc(sizeof(float) * (size_t)(br * ldb));
    CHECK(A && B && C0 && Cc && Cg && S && aA && aB);
    for (int64_t i = 0; i < ar * lda; i++) aA[i] = fabsf(A[i] = (float)urand());
    for (int64_t i = 0; i < br * ldb; i++) aB[i] = fabsf(B[i] = (float)urand());
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) C0[i * ldc + j] = j >= N ? SENTINEL : beta == 0.0f ? NAN : (float)urand();
    memcpy(Cc, C0, sizeof(float) * (size_t)(M * ldc));
    memcpy(Cg, C0, sizeof(float) * (size_t)(M * ldc));
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cc, ldc) == LLMQ_OK);
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CUDA, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cg, ldc) == LLMQ_OK);
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, ta, tb, M, N, K, fabsf(alpha), aA, lda, aB, ldb, 0.0f, S, N) == LLMQ_OK);
    const bool dev = llmq_gemm_on_device(LLMQ_BACKEND_CUDA, M, N, K);
    const double tol = 4.0 * sqrt((double)K) * (double)FLT_EPSILON;
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            const float c = Cc[i * ldc + j], g = Cg[i * ldc + j];
            bool ok;
            if (j >= N)
                ok = g == SENTINEL;
            else if (!dev)
                ok = memcmp(&c, &g, sizeof c) == 0; // the CPU path: the same bits
            else {
                const double s = S[i * N + j] + (beta != 0.0f ? fabs((double)beta * C0[i * ldc + j]) : 0.0);
                ok = fabs((double)g - (double)c) <= tol * s + 1e-30;
            }
            if (!ok && bad++ < 5)
                fprintf(stderr,
                        "f32 ta %d tb %d M %lld N %lld K %lld alpha %g beta %g: C[%lld][%lld] gpu %.9g cpu %.9g\n", ta,
                        tb, (long long)M, (long long)N, (long long)K, alpha, beta, (long long)i, (long long)j, g, c);
        }
    free(A), free(B), free(C0), free(Cc), free(Cg), free(S), free(aA), free(aB);
    return bad;
}

static int case_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, double beta) {
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int64_t lda = ac + 1, ldb = bc + 2, ldc = N + 1;
    double *A = malloc(sizeof(double) * (size_t)(ar * lda)), *B = malloc(sizeof(double) * (size_t)(br * ldb));
    double *Cc = malloc(sizeof(double) * (size_t)(M * ldc)), *Cg = malloc(sizeof(double) * (size_t)(M * ldc));
    double *C0 = malloc(sizeof(double) * (size_t)(M * ldc));
    CHECK(A && B && Cc && Cg && C0);
    for (int64_t i = 0; i < ar * lda; i++) A[i] = urand();
    for (int64_t i = 0; i < br * ldb; i++) B[i] = urand();
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = (i % ldc) >= N ? SENTINEL : urand();
    memcpy(Cc, C0, sizeof(double) * (size_t)(M * ldc));
    memcpy(Cg, C0, sizeof(double) * (size_t)(M * ldc));
    CHECK(llmq_gemm_f64(LLMQ_BACKEND_CPU, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cc, ldc) == LLMQ_OK);
    CHECK(llmq_gemm_f64(LLMQ_BACKEND_CUDA, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cg, ldc) == LLMQ_OK);
    const double tol = 4.0 * sqrt((double)K) * DBL_EPSILON;
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            const double c = Cc[i * ldc + j], g = Cg[i * ldc + j];
            double s = fabs(beta * C0[i * ldc + j]);
            for (int64_t k = 0; j < N && k < K; k++)
                s += fabs(alpha * (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]));
            const bool ok = j >= N ? g == SENTINEL : fabs(g - c) <= tol * s + 1e-300;
            if (!ok && bad++ < 5)
                fprintf(stderr, "f64 ta %d tb %d M %lld N %lld K %lld: C[%lld][%lld] gpu %.17g cpu %.17g\n", ta, tb,
                        (long long)M, (long long)N, (long long)K, (long long)i, (long long)j, g, c);
        }
    free(A), free(B), free(Cc), free(Cg), free(C0);
    return bad;
}

// SYRK accumulated over n_calls batches of K rows: C (N, N) upper += Aᵀ A (beta 1 after the first).
static int case_syrk(int64_t N, int64_t K, int n_calls) {
    const int64_t lda = N + 1, ldc = N + 3;
    float *A = malloc(sizeof(float) * (size_t)(K * lda)), *Cc = malloc(sizeof(float) * (size_t)(N * ldc));
    float *Cg = malloc(sizeof(float) * (size_t)(N * ldc)), *S = calloc((size_t)(N * N), sizeof(float));
    float *aA = malloc(sizeof(float) * (size_t)(K * lda));
    CHECK(A && Cc && Cg && S && aA);
    for (int64_t i = 0; i < N * ldc; i++)
        Cc[i] = Cg[i] = (i % ldc) >= N || (i % ldc) < i / ldc ? SENTINEL : (float)urand();
    const bool dev = llmq_gemm_on_device(LLMQ_BACKEND_CUDA, N, N, K);
    int bad = 0;
    for (int call = 0; call < n_calls; call++) {
        const float beta = call == 0 ? 0.0f : 1.0f, alpha = call == 1 ? 0.5f : 1.0f;
        for (int64_t i = 0; i < K * lda; i++) aA[i] = fabsf(A[i] = (float)urand());
        CHECK(llmq_syrk_f32_acc(LLMQ_BACKEND_CPU, N, K, alpha, A, lda, beta, Cc, ldc) == LLMQ_OK);
        CHECK(llmq_syrk_f32_acc(LLMQ_BACKEND_CUDA, N, K, alpha, A, lda, beta, Cg, ldc) == LLMQ_OK);
        CHECK(llmq_gemm_f32(LLMQ_BACKEND_CPU, true, false, N, N, K, alpha, aA, lda, aA, lda, 1.0f, S, N) == LLMQ_OK);
        const double tol = 4.0 * sqrt((double)K * (call + 1)) * (double)FLT_EPSILON;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < ldc; j++) {
                const float c = Cc[i * ldc + j], g = Cg[i * ldc + j];
                bool ok;
                if (j >= N || j < i)
                    ok = g == SENTINEL; // padding and the strict lower triangle
                else if (!dev)
                    ok = memcmp(&c, &g, sizeof c) == 0;
                else
                    ok = fabs((double)g - (double)c) <= tol * S[i * N + j] + 1e-30;
                if (!ok && bad++ < 5)
                    fprintf(stderr, "syrk N %lld K %lld call %d: C[%lld][%lld] gpu %.9g cpu %.9g\n", (long long)N,
                            (long long)K, call, (long long)i, (long long)j, g, c);
            }
    }
    free(A), free(Cc), free(Cg), free(S), free(aA);
    return bad;
}

// Several threads share the one CUDA context (the mutex in gemm_cuda.cu).
struct thr {
    int id, bad;
};
static void *thread_main(void *p) {
    struct thr *t = p;
    const int64_t M = 300 + t->id, N = 257, K = 333; // 25.6M+ multiply-adds: on the device
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(N * K));
    float *Cc = malloc(sizeof(float) * (size_t)(M * N)), *Cg = malloc(sizeof(float) * (size_t)(M * N));
    uint64_t s = 0x1234567ull * (uint64_t)(t->id + 1);
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    for (int64_t i = 0; i < N * K; i++) B[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    for (int rep = 0; rep < 5; rep++) {
        if (llmq_gemm_f32(LLMQ_BACKEND_CPU, false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, Cc, N) ||
            llmq_gemm_f32(LLMQ_BACKEND_CUDA, false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, Cg, N)) {
            t->bad++;
            break;
        }
        // |a|, |b| <= 0.5: S <= K / 4
        for (int64_t i = 0; i < M * N; i++)
            if (fabsf(Cg[i] - Cc[i]) > 4.0f * sqrtf((float)K) * FLT_EPSILON * (float)K / 4.0f) t->bad++;
    }
    free(A), free(B), free(Cc), free(Cg);
    return NULL;
}

int main(void) {
    const char *why = NULL;
    if (llmq_cuda_device_count(&why) == 0) {
        fprintf(stderr, "skipped: no CUDA device (%s)\n", why ? why : "?");
        return TEST_SKIP;
    }
    if (getenv("LLMQ_GEMM_CUDA_MIN_WORK")) {
        fprintf(stderr, "skipped: LLMQ_GEMM_CUDA_MIN_WORK is set (this test checks the default threshold)\n");
        return TEST_SKIP;
    }
    // The threshold: under it the CUDA backend is the CPU path, at it the device.
    CHECK(!llmq_gemm_on_device(LLMQ_BACKEND_CUDA, 255, 256, 256));
    CHECK(llmq_gemm_on_device(LLMQ_BACKEND_CUDA, 256, 256, 256));
    CHECK(!llmq_gemm_on_device(LLMQ_BACKEND_CPU, 4096, 4096, 4096));

    static const int64_t shapes[][3] = {
        {1, 1, 1},       {7, 33, 5},       {64, 64, 64},    // under the threshold: CPU bits
        {257, 129, 513}, {1, 4097, 4097},  {4097, 1, 4097}, // over it, odd, vectors
        {33, 4097, 129}, {512, 1536, 576},                  // forward-like: tokens x rows x cols
    };
    int bad = 0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int t = 0; t < 4; t++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            bad += case_f32(t & 1, t >> 1, M, N, K, 1.0f, 0.0f);
            bad += case_f32(t & 1, t >> 1, M, N, K, -0.75f, 1.5f);
        }
    bad += case_f32(false, true, 3, 5, 0, 1.0f, 2.0f); // K = 0: C = beta C
    for (int t = 0; t < 4; t++) {
        bad += case_f64(t & 1, t >> 1, 300, 301, 257, 1.0, 0.0); // 23M: over the threshold
        bad += case_f64(t & 1, t >> 1, 17, 9, 31, 0.5, -1.0);    // under it
    }
    bad += case_syrk(33, 7, 3);     // under the threshold
    bad += case_syrk(576, 256, 4);  // SmolLM2 attn input, one calib micro-batch
    bad += case_syrk(1537, 100, 3); // odd
    // bad arguments are refused on either backend
    float x[4] = {0};
    CHECK(llmq_gemm_f32(LLMQ_BACKEND_CUDA, false, false, 2, 2, 2, 1.0f, x, 1, x, 2, 0.0f, x, 2) == LLMQ_ERR_ARG);
    CHECK(llmq_syrk_f32_acc(LLMQ_BACKEND_CUDA, 2, 2, 1.0f, x, 1, 0.0f, x, 2) == LLMQ_ERR_ARG);

    pthread_t tid[4];
    struct thr th[4];
    for (int i = 0; i < 4; i++) {
        th[i] = (struct thr){.id = i};
        CHECK(pthread_create(&tid[i], NULL, thread_main, &th[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        bad += th[i].bad;
    }
    llmq_gemm_cuda_release();
    // the context comes back after a release
    bad += case_f32(false, false, 300, 300, 300, 1.0f, 0.0f);
    llmq_gemm_cuda_release();
    if (bad) fprintf(stderr, "%d mismatches\n", bad);
    CHECK(bad == 0);
    printf("gemm: cuda matches the cpu reference\n");
    return 0;
}
