/*
 * kernels/cuda_common.h — the one error macro for CUDA runtime / cuBLAS / cuSOLVER calls
 * (the third error tier of common/status.h): prints the failing statement, file:line and device, then aborts.
 * Include only from .cu files.
 */
#ifndef LLMQ_CUDA_COMMON_H
#define LLMQ_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(stmt)                                                                                               \
    do {                                                                                                               \
        cudaError_t err_ = (stmt);                                                                                     \
        if (err_ != cudaSuccess) {                                                                                     \
            int dev_ = -1;                                                                                             \
            cudaGetDevice(&dev_);                                                                                      \
            fprintf(stderr, "llmq: CUDA error %s (%s) in `%s` at %s:%d on device %d\n", cudaGetErrorName(err_),        \
                    cudaGetErrorString(err_), #stmt, __FILE__, __LINE__, dev_);                                        \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

#endif // LLMQ_CUDA_COMMON_H
