// kernels/awq_clip_cuda.cu — the device half of kernels/awq_clip.h: AWQ's clip search for one linear. The groups'
// Gram matrices and the products G_g (q_i − w) are cuBLAS DGEMMs strided-batched over the groups; the candidates
// (llmq_awq_clip_candidates, the CPU's bits) and the choice are own kernels. CUDA / cuBLAS failures become an
// LLMQ_ERR_DEVICE status naming the call (out of memory: LLMQ_ERR_NOMEM); nothing aborts.
//
// NOT YET RUN ON A GPU: compiled and linked only (tests/gpu/test_awq_clip_cuda.c is its check).
extern "C" {
#include "kernels/awq_clip.h"

#include "common/log.h"
}

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define THREADS 256
#define CHUNK_BYTES ((size_t)512 << 20) // candidates, their differences and products of one row chunk

static enum llmq_status cu_status(cudaError_t e, const char *stmt, int line) {
    if (e == cudaSuccess) return LLMQ_OK;
    return llmq_errorf(e == cudaErrorMemoryAllocation ? LLMQ_ERR_NOMEM : LLMQ_ERR_DEVICE,
                       "awq clip on CUDA: %s failed: %s (%s) at %s:%d", stmt, cudaGetErrorName(e),
                       cudaGetErrorString(e), __FILE__, line);
}
static enum llmq_status blas_status(cublasStatus_t s, const char *stmt, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return LLMQ_OK;
    return llmq_errorf(s == CUBLAS_STATUS_ALLOC_FAILED ? LLMQ_ERR_NOMEM : LLMQ_ERR_DEVICE,
                       "awq clip on CUDA: %s failed: cuBLAS status %d at %s:%d", stmt, (int)s, __FILE__, line);
}
#define CU(stmt) cu_status((stmt), #stmt, __LINE__)
#define BL(stmt) blas_status((stmt), #stmt, __LINE__)

static unsigned blocks_for(int64_t n) {
    const int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

__global__ void to_f64_kernel(const float *x, double *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS)
        y[i] = (double)x[i];
}

// One thread per (group g, row r of the chunk): the K candidates into q (scratch), their differences q_i − w as f64
// into D[((g · nr + r) · K + i) · G + j], the group's amax into amax[g · nr + r].
__global__ void candidates_kernel(const float *W, int64_t C, int64_t G, int64_t NG, int64_t r0, int64_t nr, int bits,
                                  int K, int n_grid, float *q, double *D, float *amax) {
    for (int64_t idx = (int64_t)blockIdx.x * THREADS + threadIdx.x; idx < NG * nr;
         idx += (int64_t)gridDim.x * THREADS) {
        const int64_t g = idx / nr, r = idx % nr;
        const float *w = W + (r0 + r) * C + g * G;
        float *qg = q + idx * K * G;
        double *d = D + idx * K * G;
        amax[idx] = llmq_awq_clip_candidates(w, G, bits, K, n_grid, qg);
        for (int i = 0; i < K; i++)
            for (int64_t j = 0; j < G; j++) d[i * G + j] = (double)qg[i * G + j] - (double)w[j];
    }
}

// One warp per (group, row of the chunk): e_i = Σ_j D_ij Y_ij / T, the first smallest below 1e9 (kernels/awq_clip.h).
__global__ void pick_kernel(const double *D, const double *Y, const float *amax, int64_t G, int64_t NG, int64_t r0,
                            int64_t nr, int K, int n_grid, int64_t T, float *best, double *err) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (THREADS / 32);
    for (int64_t idx = (int64_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32; idx < NG * nr; idx += warps) {
        const int64_t g = idx / nr, r = idx % nr;
        double min_err = 1e9;
        float best_max = amax[idx];
        for (int i = 0; i < K; i++) {
            const double *d = D + (idx * K + i) * G, *y = Y + (idx * K + i) * G;
            double s = 0.0;
            for (int64_t j = lane; j < G; j += 32) s += d[j] * y[j];
            for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
            const double e = s / (double)T;
            if (e < min_err) min_err = e, best_max = __fmul_rn(amax[idx], (float)(1.0 - (double)i / (double)n_grid));
        }
        if (lane == 0) best[(r0 + r) * NG + g] = best_max, err[(r0 + r) * NG + g] = min_err;
    }
}

struct clip_dev {
    float *W, *X, *q, *amax, *best;
    double *Xd, *gram, *D, *Y, *err;
    cublasHandle_t blas;
};

static void clip_dev_free(struct clip_dev *c) {
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->W), cudaFree(c->X), cudaFree(c->q), cudaFree(c->amax), cudaFree(c->best);
    cudaFree(c->Xd), cudaFree(c->gram), cudaFree(c->D), cudaFree(c->Y), cudaFree(c->err);
}

// The row chunks: Gram matrices once, then per chunk candidates -> Y_g = G_g D_g -> the choice.
static enum llmq_status clip_run(struct clip_dev *c, int64_t R, int64_t C, int64_t G, int64_t T, int bits, int K,
                                 int n_grid, int64_t nr_max) {
    const int64_t NG = C / G;
    const double one = 1.0, zero = 0.0;
    enum llmq_status st = LLMQ_OK;
    to_f64_kernel<<<blocks_for(T * C), THREADS>>>(c->X, c->Xd, T * C);
    if ((st = CU(cudaGetLastError()))) return st;
    // row-major X (T, C) is column-major (C, T) with ld C; group g's columns are its rows g·G ..: (G, T), ld C
    if ((st = BL(cublasDgemmStridedBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)G, (int)G, (int)T, &one, c->Xd,
                                           (int)C, G, c->Xd, (int)C, G, &zero, c->gram, (int)G, G * G, (int)NG))))
        return st;
    for (int64_t r0 = 0; r0 < R && !st; r0 += nr_max) {
        const int64_t nr = R - r0 < nr_max ? R - r0 : nr_max, n = nr * K;
        candidates_kernel<<<blocks_for(NG * nr), THREADS>>>(c->W, C, G, NG, r0, nr, bits, K, n_grid, c->q, c->D,
                                                            c->amax);
        if ((st = CU(cudaGetLastError()))) break;
        // group g's differences (nr · K, G) row-major = column-major (G, nr · K): Y_g = G_g D_g (G_g symmetric)
        if ((st = BL(cublasDgemmStridedBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)G, (int)n, (int)G, &one, c->gram,
                                               (int)G, G * G, c->D, (int)G, n * G, &zero, c->Y, (int)G, n * G,
                                               (int)NG))))
            break;
        pick_kernel<<<blocks_for(NG * nr * 32), THREADS>>>(c->D, c->Y, c->amax, G, NG, r0, nr, K, n_grid, T, c->best,
                                                           c->err);
        st = CU(cudaGetLastError());
    }
    return st;
}

extern "C" enum llmq_status llmq_awq_clip_cuda(const float *W, int64_t R, int64_t C, int64_t G, const float *X,
                                               int64_t T, int bits, int K, int n_grid, float *best, double *err) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        (void)cudaGetLastError();
        return llmq_errorf(LLMQ_ERR_DEVICE, "awq clip on CUDA: no CUDA device");
    }
    if (C > INT32_MAX / 2 || T > INT32_MAX / 2)
        return llmq_errorf(LLMQ_ERR_ARG, "awq clip on CUDA: shape (%lld, %lld) too large for cuBLAS", (long long)R,
                           (long long)C);
    const int64_t NG = C / G, per_row = C * K * (int64_t)(sizeof(float) + 2 * sizeof(double));
    int64_t nr_max = (int64_t)(CHUNK_BYTES / (size_t)per_row);
    if (nr_max < 1) nr_max = 1;
    if (nr_max > R) nr_max = R;
    if (nr_max * K > INT32_MAX / 2) nr_max = INT32_MAX / 2 / K;
    struct clip_dev c = {};
    enum llmq_status st = CU(cudaSetDevice(0));
    if (!st) st = CU(cudaMalloc((void **)&c.W, (size_t)(R * C) * sizeof(float)));
    if (!st) st = CU(cudaMalloc((void **)&c.X, (size_t)(T * C) * sizeof(float)));
    if (!st) st = CU(cudaMalloc((void **)&c.Xd, (size_t)(T * C) * sizeof(double)));
    if (!st) st = CU(cudaMalloc((void **)&c.gram, (size_t)(NG * G * G) * sizeof(double)));
    if (!st) st = CU(cudaMalloc((void **)&c.q, (size_t)(NG * nr_max * K * G) * sizeof(float)));
    if (!st) st = CU(cudaMalloc((void **)&c.D, (size_t)(NG * nr_max * K * G) * sizeof(double)));
    if (!st) st = CU(cudaMalloc((void **)&c.Y, (size_t)(NG * nr_max * K * G) * sizeof(double)));
    if (!st) st = CU(cudaMalloc((void **)&c.amax, (size_t)(NG * nr_max) * sizeof(float)));
    if (!st) st = CU(cudaMalloc((void **)&c.best, (size_t)(R * NG) * sizeof(float)));
    if (!st) st = CU(cudaMalloc((void **)&c.err, (size_t)(R * NG) * sizeof(double)));
    if (!st) st = BL(cublasCreate(&c.blas));
    if (!st) st = BL(cublasSetMathMode(c.blas, CUBLAS_DEFAULT_MATH)); // plain FP64
    if (!st) st = CU(cudaMemcpy(c.W, W, (size_t)(R * C) * sizeof(float), cudaMemcpyHostToDevice));
    if (!st) st = CU(cudaMemcpy(c.X, X, (size_t)(T * C) * sizeof(float), cudaMemcpyHostToDevice));
    if (!st) st = clip_run(&c, R, C, G, T, bits, K, n_grid, nr_max);
    if (!st) st = CU(cudaMemcpy(best, c.best, (size_t)(R * NG) * sizeof(float), cudaMemcpyDeviceToHost));
    if (!st) st = CU(cudaMemcpy(err, c.err, (size_t)(R * NG) * sizeof(double), cudaMemcpyDeviceToHost));
    clip_dev_free(&c);
    return st;
}
