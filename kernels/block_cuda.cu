// kernels/block_cuda.cu — the device half of kernels/block.h's Gram sums: the float64 accumulation of one
// micro-batch's f32 SYRK result, and zeroing. CUDA failures become an LLMQ_ERR_DEVICE status naming the call
// (as kernels/ops_cuda.cu).
//
// NOT YET RUN ON A GPU: compiled and linked only (see kernels/block.h).
extern "C" {
#include "kernels/block.h"
}

#include <cuda_runtime.h>
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

__global__ void zero_kernel(double *acc, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS)
        acc[i] = 0.0;
}

extern "C" enum llmq_status llmq_block_cuda_acc_upper(void *stream, double *acc, const float *scratch, int64_t C) {
    acc_upper_kernel<<<blocks_for(C * C), THREADS, 0, (cudaStream_t)stream>>>(acc, scratch, C);
    return CU(cudaGetLastError());
}

extern "C" enum llmq_status llmq_block_cuda_zero(void *stream, double *acc, int64_t n) {
    zero_kernel<<<blocks_for(n), THREADS, 0, (cudaStream_t)stream>>>(acc, n);
    return CU(cudaGetLastError());
}
