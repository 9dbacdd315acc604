// kernels/block_cuda.cu — the device half of kernels/block.h's sums: the float64 accumulation of one micro-batch's
// f32 SYRK result, the column sums (Σ|x|, Σx² and the first non-finite value; llmq_block_colsums_cpu in
// kernels/block.c is the reference, bit for bit), and zeroing. CUDA failures become an LLMQ_ERR_DEVICE status naming
// the call (as kernels/ops_cuda.cu).
//
// NOT YET RUN ON A GPU: compiled and linked only (see kernels/block.h).
extern "C" {
#include "kernels/block.h"
}

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define THREADS 256

static enum llmq_status cuda_check(cudaError_t e, const char *stmt, const char *file, int line) {
    if (e == cudaSuccess) return LLMQ_OK;
    return llmq_errorf(LLMQ_ERR_DEVICE, "cuda:0: %s failed: %s (%s) at %s:%d", stmt, cudaGetErrorName(e),
                       cudaGetErrorString(e), file, line);
}
#define CU(stmt) cuda_check((stmt), #stmt, __FILE__, __LINE__)

static unsigned blocks_for(int64_t n) {
    const int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < (1 << 20) ? b : (1 << 20));
}

// acc[i][j] += (double)scratch[i][j] for j >= i, both (C, C) row-major: one thread per element of the square.
__global__ void acc_upper_kernel(double *acc, const float *scratch, int64_t C) {
    for (int64_t idx = (int64_t)blockIdx.x * THREADS + threadIdx.x; idx < C * C; idx += (int64_t)gridDim.x * THREADS) {
        const int64_t i = idx / C, j = idx - i * C;
        if (j >= i) acc[idx] = __dadd_rn(acc[idx], (double)scratch[idx]);
    }
}

// Column c of x (n, C): acc[c] += |x_tc|, acc[C + c] += x_tc² for t = 0 .. n-1 in order (f64, explicit
// round-to-nearest adds and product: never contracted, as llmq_block_colsums_cpu's loop), and *bad = min(*bad,
// (row0 + t)·C + c) over its non-finite values. One thread per column: the row loop's order is the reference's.
__global__ void colsums_kernel(const float *x, int64_t n, int64_t C, int64_t row0, double *acc,
                               unsigned long long *bad) {
    for (int64_t c = (int64_t)blockIdx.x * THREADS + threadIdx.x; c < C; c += (int64_t)gridDim.x * THREADS) {
        double sa = acc[c], sq = acc[C + c];
        unsigned long long first = ~0ull;
        for (int64_t t = 0; t < n; t++) {
            const float v = x[t * C + c];
            if (!isfinite(v) && first == ~0ull) first = (unsigned long long)((row0 + t) * C + c);
            const double d = (double)v;
            sa = __dadd_rn(sa, fabs(d));
            sq = __dadd_rn(sq, __dmul_rn(d, d));
        }
        acc[c] = sa;
        acc[C + c] = sq;
        if (first != ~0ull) atomicMin(bad, first);
    }
}

__global__ void zero_kernel(double *acc, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS)
        acc[i] = 0.0;
}

extern "C" enum llmq_status llmq_block_cuda_acc_upper(void *stream, double *acc, const float *scratch, int64_t C) {
    acc_upper_kernel<<<blocks_for(C * C), THREADS, 0, (cudaStream_t)stream>>>(acc, scratch, C);
    return CU(cudaGetLastError());
}

extern "C" enum llmq_status llmq_block_cuda_colsums(void *stream, const float *x, int64_t n, int64_t C, int64_t row0,
                                                    double *acc, uint64_t *bad) {
    static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "atomicMin on the 64-bit marks");
    colsums_kernel<<<blocks_for(C), THREADS, 0, (cudaStream_t)stream>>>(x, n, C, row0, acc, (unsigned long long *)bad);
    return CU(cudaGetLastError());
}

// H[i][j] = (float)(scale · acc[min(i, j)][max(i, j)]): one f64 product rounded to f32, as calib/calib.c's Hessian.
__global__ void hessian_kernel(const double *acc, int64_t C, double scale, float *H) {
    for (int64_t idx = (int64_t)blockIdx.x * THREADS + threadIdx.x; idx < C * C; idx += (int64_t)gridDim.x * THREADS) {
        const int64_t i = idx / C, j = idx - i * C;
        H[idx] = __double2float_rn(__dmul_rn(scale, j >= i ? acc[idx] : acc[j * C + i]));
    }
}

extern "C" enum llmq_status llmq_block_cuda_hessian(void *stream, const double *acc, int64_t C, double scale,
                                                    float *H) {
    hessian_kernel<<<blocks_for(C * C), THREADS, 0, (cudaStream_t)stream>>>(acc, C, scale, H);
    return CU(cudaGetLastError());
}

extern "C" enum llmq_status llmq_block_cuda_zero(void *stream, double *acc, int64_t n) {
    zero_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(acc, n);
    return CU(cudaGetLastError());
}
