// kernels/gemm.c — GEMM / SYRK dispatch and the CPU reference (cblas); the device half is
// kernels/gemm_cuda.cu (contract in kernels/gemm.h).
#include "kernels/gemm.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

static long long min_work = LLMQ_GEMM_CUDA_MIN_WORK;
static pthread_once_t min_work_once = PTHREAD_ONCE_INIT;

static void read_min_work(void) {
    const char *s = getenv("LLMQ_GEMM_CUDA_MIN_WORK");
    if (!s || !*s) return;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end && *end == '\0' && v >= 0) min_work = v;
}

bool llmq_gemm_on_device(enum llmq_backend be, int64_t M, int64_t N, int64_t K) {
    if (be != LLMQ_BACKEND_CUDA) return false;
    pthread_once(&min_work_once, read_min_work);
    if (M <= 0 || N <= 0 || K <= 0) return false;                 // nothing to multiply: the CPU path scales C
    return (double)M * (double)N * (double)K >= (double)min_work; // in double: no int64 overflow
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

// Checks dims and strides of op(A) (M, K), op(B) (K, N), C (M, N), row-major.
static enum llmq_status check_gemm(const char *what, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                   int64_t lda, int64_t ldb, int64_t ldc) {
    const int64_t acols = transA ? M : K, bcols = transB ? K : N;
    if (!fits_int(M) || !fits_int(N) || !fits_int(K) || !fits_int(lda) || !fits_int(ldb) || !fits_int(ldc) ||
        lda < (acols > 1 ? acols : 1) || ldb < (bcols > 1 ? bcols : 1) || ldc < (N > 1 ? N : 1))
        return llmq_errorf(LLMQ_ERR_ARG,
                           "%s: bad shape M %lld N %lld K %lld lda %lld ldb %lld ldc %lld (transA %d transB %d)", what,
                           (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb, (long long)ldc,
                           (int)transA, (int)transB);
    return LLMQ_OK;
}

enum llmq_status llmq_gemm_f32(enum llmq_backend be, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                               float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                               float *C, int64_t ldc) {
    enum llmq_status st = check_gemm("gemm_f32", transA, transB, M, N, K, lda, ldb, ldc);
    if (st || M == 0 || N == 0) return st;
    if (K > 0 && llmq_gemm_on_device(be, M, N, K))
        return llmq_gemm_cuda_f32(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
    return LLMQ_OK;
}

enum llmq_status llmq_gemm_f64(enum llmq_backend be, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                               double alpha, const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                               double *C, int64_t ldc) {
    enum llmq_status st = check_gemm("gemm_f64", transA, transB, M, N, K, lda, ldb, ldc);
    if (st || M == 0 || N == 0) return st;
    if (K > 0 && llmq_gemm_on_device(be, M, N, K))
        return llmq_gemm_cuda_f64(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    cblas_dgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
    return LLMQ_OK;
}

enum llmq_status llmq_syrk_f32_acc(enum llmq_backend be, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                   float beta, float *C, int64_t ldc) {
    if (!fits_int(N) || !fits_int(K) || !fits_int(lda) || !fits_int(ldc) || lda < (N > 1 ? N : 1) ||
        ldc < (N > 1 ? N : 1))
        return llmq_errorf(LLMQ_ERR_ARG, "syrk_f32: bad shape N %lld K %lld lda %lld ldc %lld", (long long)N,
                           (long long)K, (long long)lda, (long long)ldc);
    if (N == 0) return LLMQ_OK;
    if (K > 0 && llmq_gemm_on_device(be, N, N, K)) return llmq_syrk_cuda_f32(N, K, alpha, A, lda, beta, C, ldc);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)N, (int)K, alpha, A, (int)lda, beta, C, (int)ldc);
    return LLMQ_OK;
}

int64_t llmq_gram_scratch_rows(int64_t C) { return C > LLMQ_GRAM_TILE_FROM ? LLMQ_GRAM_TILE : C; }

// One micro-batch Xb (n, C) of the Gram sum, rows [i0, i1) of the upper triangle: one SYRK when the tile is the
// whole matrix, else Xb[:, i0:i1]ᵀ · Xb[:, i0:C] as a GEMM into scratch (i1 - i0, C - i0).
static enum llmq_status gram_tile(enum llmq_backend be, const float *Xb, int64_t n, int64_t C, int64_t i0, int64_t i1,
                                  float *scratch, double *acc) {
    const int64_t w = C - i0;
    enum llmq_status st = i0 == 0 && i1 == C ? llmq_syrk_f32_acc(be, C, n, 1.0f, Xb, C, 0.0f, scratch, C)
                                             : llmq_gemm_f32(be, true, false, i1 - i0, w, n, 1.0f, Xb + i0, C, Xb + i0,
                                                             C, 0.0f, scratch, w);
    if (st) return st;
    for (int64_t i = i0; i < i1; i++) {
        double *dst = acc + i * C;
        const float *src = scratch + (i - i0) * w; // columns i0 .. C-1 of row i
        for (int64_t k = i; k < C; k++) dst[k] += (double)src[k - i0];
    }
    return LLMQ_OK;
}

enum llmq_status llmq_gram_acc_f64(enum llmq_backend be, const float *X, int64_t N, int64_t C, float *scratch,
                                   double *acc) {
    const int64_t tb = llmq_gram_scratch_rows(C);
    for (int64_t t0 = 0; t0 < N; t0 += LLMQ_GRAM_MICRO_BATCH) {
        const int64_t n = N - t0 < LLMQ_GRAM_MICRO_BATCH ? N - t0 : LLMQ_GRAM_MICRO_BATCH;
        for (int64_t i0 = 0; i0 < C; i0 += tb) {
            enum llmq_status st = gram_tile(be, X + t0 * C, n, C, i0, i0 + tb < C ? i0 + tb : C, scratch, acc);
            if (st) return st;
        }
    }
    return LLMQ_OK;
}

#ifndef LLMQ_HAVE_CUDA
static enum llmq_status no_cuda(const char *what) {
    return llmq_errorf(LLMQ_ERR_DEVICE, "%s on cuda: this llmq was built without CUDA", what);
}
enum llmq_status llmq_gemm_cuda_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                                    int64_t ldc) {
    (void)transA, (void)transB, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
    (void)beta, (void)C, (void)ldc;
    return no_cuda("gemm_f32");
}
enum llmq_status llmq_gemm_cuda_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K, double alpha,
                                    const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
                                    int64_t ldc) {
    (void)transA, (void)transB, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
    (void)beta, (void)C, (void)ldc;
    return no_cuda("gemm_f64");
}
enum llmq_status llmq_syrk_cuda_f32(int64_t N, int64_t K, float alpha, const float *A, int64_t lda, float beta,
                                    float *C, int64_t ldc) {
    (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)beta, (void)C, (void)ldc;
    return no_cuda("syrk_f32");
}
void llmq_gemm_cuda_release(void) {}
enum llmq_status llmq_gemm_dev_cuda_init(void *stream, void **handle) {
    (void)stream;
    *handle = NULL;
    return no_cuda("gemm_dev");
}
void llmq_gemm_dev_cuda_free(void *handle) { (void)handle; }
enum llmq_status llmq_gemm_dev_cuda_f32(void *handle, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                        float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                                        float beta, float *C, int64_t ldc) {
    (void)handle, (void)transA, (void)transB, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    return no_cuda("gemm_dev_f32");
}
enum llmq_status llmq_syrk_dev_cuda_f32(void *handle, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                        float beta, float *C, int64_t ldc) {
    (void)handle, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)beta, (void)C, (void)ldc;
    return no_cuda("syrk_dev_f32");
}
enum llmq_status llmq_gemm_dev_cuda_math(void *handle, bool tf32) {
    (void)handle, (void)tf32;
    return no_cuda("gemm_dev_math");
}
#endif

// ---------------------------------------------------------------------------------------------
// Products on operands where the backend computes (llmq_gemm_dev)
// ---------------------------------------------------------------------------------------------

struct llmq_gemm_dev {
    enum llmq_backend be;
    void *handle; // CUDA: the cublasHandle_t bound to the stream; NULL on the CPU
    bool tf32;    // llmq_gemm_dev_set_tf32
};

enum llmq_status llmq_gemm_dev_set_tf32(struct llmq_gemm_dev *g, bool on) {
    if (on && g->be != LLMQ_BACKEND_CUDA)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "gemm_dev: TF32 products need a CUDA context (this one is on %s)",
                           llmq_backend_name(g->be));
    enum llmq_status st = g->be == LLMQ_BACKEND_CUDA ? llmq_gemm_dev_cuda_math(g->handle, on) : LLMQ_OK;
    if (!st) g->tf32 = on;
    return st;
}

enum llmq_status llmq_gemm_dev_init(enum llmq_backend be, void *stream, struct llmq_gemm_dev **out) {
    *out = NULL;
    if (be != LLMQ_BACKEND_CPU && be != LLMQ_BACKEND_CUDA)
        return llmq_errorf(LLMQ_ERR_ARG, "gemm_dev: unknown backend %d", (int)be);
    struct llmq_gemm_dev *g = calloc(1, sizeof *g);
    if (!g) return llmq_errorf(LLMQ_ERR_NOMEM, "gemm_dev: out of memory");
    g->be = be;
    if (be == LLMQ_BACKEND_CUDA) {
        enum llmq_status st = llmq_gemm_dev_cuda_init(stream, &g->handle);
        if (st) {
            free(g);
            return st;
        }
    }
    *out = g;
    return LLMQ_OK;
}

void llmq_gemm_dev_free(struct llmq_gemm_dev *g) {
    if (!g) return;
    if (g->handle) llmq_gemm_dev_cuda_free(g->handle);
    free(g);
}

enum llmq_status llmq_gemm_dev_f32(struct llmq_gemm_dev *g, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                                   float *C, int64_t ldc) {
    enum llmq_status st = check_gemm("gemm_dev_f32", transA, transB, M, N, K, lda, ldb, ldc);
    if (st || M == 0 || N == 0) return st;
    if (g->be == LLMQ_BACKEND_CUDA)
        return llmq_gemm_dev_cuda_f32(g->handle, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return llmq_gemm_f32(LLMQ_BACKEND_CPU, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

enum llmq_status llmq_syrk_dev_f32(struct llmq_gemm_dev *g, int64_t N, int64_t K, float alpha, const float *A,
                                   int64_t lda, float beta, float *C, int64_t ldc) {
    if (g->be != LLMQ_BACKEND_CUDA) return llmq_syrk_f32_acc(LLMQ_BACKEND_CPU, N, K, alpha, A, lda, beta, C, ldc);
    if (!fits_int(N) || !fits_int(K) || !fits_int(lda) || !fits_int(ldc) || lda < (N > 1 ? N : 1) ||
        ldc < (N > 1 ? N : 1))
        return llmq_errorf(LLMQ_ERR_ARG, "syrk_dev_f32: bad shape N %lld K %lld lda %lld ldc %lld", (long long)N,
                           (long long)K, (long long)lda, (long long)ldc);
    if (N == 0) return LLMQ_OK;
    enum llmq_status st = g->tf32 ? llmq_gemm_dev_cuda_math(g->handle, false) : LLMQ_OK; // the Gram: plain FP32
    if (!st) st = llmq_syrk_dev_cuda_f32(g->handle, N, K, alpha, A, lda, beta, C, ldc);
    enum llmq_status back = g->tf32 ? llmq_gemm_dev_cuda_math(g->handle, true) : LLMQ_OK;
    return st ? st : back;
}
