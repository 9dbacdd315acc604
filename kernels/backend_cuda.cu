// kernels/backend_cuda.cu — CUDA device queries for the backend dispatch.
extern "C" {
#include "kernels/backend.h"
}
#include "kernels/cuda_common.h"

#include <stdio.h>
#include <string.h>

extern "C" bool llmq_backend_cuda_compiled(void) { return true; }

extern "C" int llmq_cuda_device_count(const char **why) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError(); // clear the sticky error so later queries start clean
        if (why) *why = cudaGetErrorString(err);
        return 0;
    }
    if (n == 0 && why) *why = "the CUDA driver reports no device";
    return n;
}

extern "C" enum llmq_status llmq_cuda_device_info(int index, struct llmq_device_info *out) {
    cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, index);
    if (err != cudaSuccess)
        return llmq_errorf(LLMQ_ERR_DEVICE, "CUDA device %d: %s", index, cudaGetErrorString(err));
    memset(out, 0, sizeof(*out));
    out->index = index;
    snprintf(out->name, sizeof(out->name), "%s", prop.name);
    out->total_mem = prop.totalGlobalMem;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->sm_count = prop.multiProcessorCount;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        out->free_mem = free_b;
    return LLMQ_OK;
}
