// kernels/gemm_cuda.cu — the device half of kernels/gemm.h: cuBLAS SGEMM / DGEMM / SSYRK on host
// operands, through one process-wide context (device 0, handle, stream, three growable buffers)
// behind a mutex. Row-major operands are used as their column-major transposes: C (M, N) row-major
// is Cᵀ (N, M) column-major, so Cᵀ = op(B)ᵀ · op(A)ᵀ is one cuBLAS call with the operands swapped
// and the same transpose flags. CUDA / cuBLAS failures become an LLMQ_ERR_DEVICE status (not an
// abort, unlike kernels/cuda_common.h's CUDA_CHECK: a failed product must let the CLI clean up and
// exit non-zero) with the failing call, the error text and file:line.
extern "C" {
#include "kernels/gemm.h"
}

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>

#define DEVICE 0

struct gemm_ctx {
    bool ready;
    cublasHandle_t handle;
    cudaStream_t stream;
    void *buf[3];  // device buffers for A, B, C (packed: row stride = column count)
    size_t cap[3]; // their sizes in bytes
};

static struct gemm_ctx g_ctx;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static enum llmq_status cuda_fail(const char *stmt, cudaError_t e, const char *file, int line) {
    return llmq_errorf(e == cudaErrorMemoryAllocation ? LLMQ_ERR_NOMEM : LLMQ_ERR_DEVICE,
                       "cuda:%d: %s failed: %s (%s) at %s:%d", DEVICE, stmt, cudaGetErrorName(e), cudaGetErrorString(e),
                       file, line);
}

static enum llmq_status cublas_fail(const char *stmt, cublasStatus_t e, const char *file, int line) {
    return llmq_errorf(e == CUBLAS_STATUS_ALLOC_FAILED ? LLMQ_ERR_NOMEM : LLMQ_ERR_DEVICE,
                       "cuda:%d: %s failed: %s (%s) at %s:%d", DEVICE, stmt, cublasGetStatusName(e),
                       cublasGetStatusString(e), file, line);
}

// Status-returning checks (the caller declares `enum llmq_status st` and a `done:` label).
#define TRY_CUDA(stmt)                                                                                                 \
    do {                                                                                                               \
        cudaError_t e_ = (stmt);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            st = cuda_fail(#stmt, e_, __FILE__, __LINE__);                                                             \
            goto done;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define TRY_CUBLAS(stmt)                                                                                               \
    do {                                                                                                               \
        cublasStatus_t e_ = (stmt);                                                                                    \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            st = cublas_fail(#stmt, e_, __FILE__, __LINE__);                                                           \
            goto done;                                                                                                 \
        }                                                                                                              \
    } while (0)

// Called with g_mu held. Makes the context on first use; selects the device on this thread.
static enum llmq_status ctx_ready(void) {
    enum llmq_status st = LLMQ_OK;
    TRY_CUDA(cudaSetDevice(DEVICE)); // the current device is per host thread
    if (g_ctx.ready) return LLMQ_OK;
    TRY_CUDA(cudaStreamCreateWithFlags(&g_ctx.stream, cudaStreamNonBlocking));
    TRY_CUBLAS(cublasCreate(&g_ctx.handle));
    TRY_CUBLAS(cublasSetStream(g_ctx.handle, g_ctx.stream));
    // Plain FP32 / FP64: no TF32 or other reduced-precision tensor-core paths.
    TRY_CUBLAS(cublasSetMathMode(g_ctx.handle, CUBLAS_PEDANTIC_MATH));
    g_ctx.ready = true;
done:
    return st;
}

// Called with g_mu held. Buffer i holds at least bytes (grown in 1 MiB steps, never shrunk).
static enum llmq_status ensure_buf(int i, size_t bytes) {
    enum llmq_status st = LLMQ_OK;
    if (g_ctx.cap[i] >= bytes) return LLMQ_OK;
    size_t want = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (g_ctx.buf[i]) cudaFree(g_ctx.buf[i]);
    g_ctx.buf[i] = NULL;
    g_ctx.cap[i] = 0;
    TRY_CUDA(cudaMalloc(&g_ctx.buf[i], want));
    g_ctx.cap[i] = want;
done:
    return st;
}

// Host (rows, cols) with row stride ld -> device buffer i, packed.
static cudaError_t upload(int i, const void *host, int64_t rows, int64_t cols, int64_t ld, size_t es) {
    return cudaMemcpy2DAsync(g_ctx.buf[i], (size_t)cols * es, host, (size_t)ld * es, (size_t)cols * es, (size_t)rows,
                             cudaMemcpyHostToDevice, g_ctx.stream);
}

static cublasStatus_t gemm_call(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *alpha,
                                const float *A, int lda, const float *B, int ldb, const float *beta, float *C,
                                int ldc) {
    return cublasSgemm(g_ctx.handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

static cublasStatus_t gemm_call(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const double *alpha,
                                const double *A, int lda, const double *B, int ldb, const double *beta, double *C,
                                int ldc) {
    return cublasDgemm(g_ctx.handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
static enum llmq_status gemm_device(bool transA, bool transB, int64_t M, int64_t N, int64_t K, T alpha, const T *A,
                                    int64_t lda, const T *B, int64_t ldb, T beta, T *C, int64_t ldc) {
    const size_t es = sizeof(T);
    const int64_t arows = transA ? K : M, acols = transA ? M : K; // A as stored
    const int64_t brows = transB ? N : K, bcols = transB ? K : N; // B as stored
    enum llmq_status st = LLMQ_OK;
    pthread_mutex_lock(&g_mu);
    if ((st = ctx_ready()) || (st = ensure_buf(0, (size_t)(arows * acols) * es)) ||
        (st = ensure_buf(1, (size_t)(brows * bcols) * es)) || (st = ensure_buf(2, (size_t)(M * N) * es)))
        goto done;
    TRY_CUDA(upload(0, A, arows, acols, lda, es));
    TRY_CUDA(upload(1, B, brows, bcols, ldb, es));
    if (beta != (T)0) TRY_CUDA(upload(2, C, M, N, ldc, es));
    // Cᵀ (N, M) = op(B)ᵀ (N, K) · op(A)ᵀ (K, M), all column-major views of the packed row-major buffers.
    TRY_CUBLAS(gemm_call(transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K,
                         &alpha, (const T *)g_ctx.buf[1], (int)bcols, (const T *)g_ctx.buf[0], (int)acols, &beta,
                         (T *)g_ctx.buf[2], (int)N));
    TRY_CUDA(cudaMemcpy2DAsync(C, (size_t)ldc * es, g_ctx.buf[2], (size_t)N * es, (size_t)N * es, (size_t)M,
                               cudaMemcpyDeviceToHost, g_ctx.stream));
    TRY_CUDA(cudaStreamSynchronize(g_ctx.stream));
done:
    pthread_mutex_unlock(&g_mu);
    return st;
}

extern "C" enum llmq_status llmq_gemm_cuda_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                                               const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                                               float *C, int64_t ldc) {
    return gemm_device<float>(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

extern "C" enum llmq_status llmq_gemm_cuda_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K, double alpha,
                                               const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                                               double *C, int64_t ldc) {
    return gemm_device<double>(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Row-major upper of C (N, N) += A (K, N)ᵀ A: in column-major terms A is (N, K) and the row-major
// upper triangle is the column-major lower one, so it is cublasSsyrk(LOWER, N) on the same bytes.
// C is uploaded even for beta 0 so that the strict lower triangle comes back unchanged (cblas leaves it).
extern "C" enum llmq_status llmq_syrk_cuda_f32(int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                               float beta, float *C, int64_t ldc) {
    const size_t es = sizeof(float);
    enum llmq_status st = LLMQ_OK;
    pthread_mutex_lock(&g_mu);
    if ((st = ctx_ready()) || (st = ensure_buf(0, (size_t)(K * N) * es)) || (st = ensure_buf(2, (size_t)(N * N) * es)))
        goto done;
    TRY_CUDA(upload(0, A, K, N, lda, es));
    TRY_CUDA(upload(2, C, N, N, ldc, es));
    TRY_CUBLAS(cublasSsyrk(g_ctx.handle, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, (int)N, (int)K, &alpha,
                           (const float *)g_ctx.buf[0], (int)N, &beta, (float *)g_ctx.buf[2], (int)N));
    TRY_CUDA(cudaMemcpy2DAsync(C, (size_t)ldc * es, g_ctx.buf[2], (size_t)N * es, (size_t)N * es, (size_t)N,
                               cudaMemcpyDeviceToHost, g_ctx.stream));
    TRY_CUDA(cudaStreamSynchronize(g_ctx.stream));
done:
    pthread_mutex_unlock(&g_mu);
    return st;
}

extern "C" void llmq_gemm_cuda_release(void) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < 3; i++) {
        if (g_ctx.buf[i]) cudaFree(g_ctx.buf[i]);
        g_ctx.buf[i] = NULL;
        g_ctx.cap[i] = 0;
    }
    if (g_ctx.ready) {
        cublasDestroy(g_ctx.handle);
        cudaStreamDestroy(g_ctx.stream);
        g_ctx.ready = false;
    }
    pthread_mutex_unlock(&g_mu);
}

// ---------------------------------------------------------------------------------------------
// llmq_gemm_dev: operands already on the device, one handle per context bound to the caller's stream
// ---------------------------------------------------------------------------------------------

extern "C" enum llmq_status llmq_gemm_dev_cuda_init(void *stream, void **handle) {
    *handle = NULL;
    cublasHandle_t h = NULL;
    enum llmq_status st = LLMQ_OK;
    TRY_CUDA(cudaSetDevice(DEVICE));
    TRY_CUBLAS(cublasCreate(&h));
    TRY_CUBLAS(cublasSetStream(h, (cudaStream_t)stream));
    TRY_CUBLAS(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH)); // plain FP32, as the host-pointer products
    *handle = h;
    return LLMQ_OK;
done:
    if (h) cublasDestroy(h);
    return st;
}

extern "C" void llmq_gemm_dev_cuda_free(void *handle) {
    if (handle) cublasDestroy((cublasHandle_t)handle);
}

// Row-major C (M, N) = alpha · op(A) · op(B) + beta · C as the column-major Cᵀ = op(B)ᵀ · op(A)ᵀ on the same bytes.
extern "C" enum llmq_status llmq_gemm_dev_cuda_f32(void *handle, bool transA, bool transB, int64_t M, int64_t N,
                                                   int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                                                   int64_t ldb, float beta, float *C, int64_t ldc) {
    enum llmq_status st = LLMQ_OK;
    TRY_CUBLAS(cublasSgemm((cublasHandle_t)handle, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                           transA ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, B, (int)ldb, A, (int)lda,
                           &beta, C, (int)ldc));
done:
    return st;
}

extern "C" enum llmq_status llmq_gemm_dev_cuda_math(void *handle, bool tf32) {
    enum llmq_status st = LLMQ_OK;
    TRY_CUBLAS(cublasSetMathMode((cublasHandle_t)handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
done:
    return st;
}

// As llmq_syrk_cuda_f32: the row-major upper triangle is cuBLAS's column-major lower one.
extern "C" enum llmq_status llmq_syrk_dev_cuda_f32(void *handle, int64_t N, int64_t K, float alpha, const float *A,
                                                   int64_t lda, float beta, float *C, int64_t ldc) {
    enum llmq_status st = LLMQ_OK;
    TRY_CUBLAS(cublasSsyrk((cublasHandle_t)handle, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, (int)N, (int)K, &alpha, A,
                           (int)lda, &beta, C, (int)ldc));
done:
    return st;
}
