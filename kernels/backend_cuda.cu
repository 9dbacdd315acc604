// kernels/backend_cuda.cu — CUDA device queries for the backend dispatch.
extern "C" {
#include "kernels/backend.h"
}
#include "kernels/cuda_common.h"

#include <stdio.h>
#include <string.h>

extern "C" bool llmq_backend_cuda_compiled(void) { return true; }

// Why cudaGetDeviceCount failed, in the machine's terms. Without any NVIDIA driver the runtime reports
// cudaErrorInsufficientDriver ("CUDA driver version is insufficient for CUDA runtime version"), which reads
// as an old driver; cudaDriverGetVersion tells the two apart (it gives 0 when no driver is installed).
static const char *count_failure(cudaError_t err) {
    static char buf[256];
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    if (err == cudaErrorNoDevice)
        snprintf(buf, sizeof(buf), "the NVIDIA driver sees no GPU (cudaGetDeviceCount: %s)", cudaGetErrorString(err));
    else if (err == cudaErrorInsufficientDriver && drv == 0)
        snprintf(buf, sizeof(buf), "no NVIDIA driver is loaded on this machine (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(err));
    else if (err == cudaErrorInsufficientDriver)
        snprintf(buf, sizeof(buf),
                 "the NVIDIA driver supports CUDA %d.%d, older than this llmq's runtime %d.%d "
                 "(cudaGetDeviceCount: %s)",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, cudaGetErrorString(err));
    else
        snprintf(buf, sizeof(buf), "cudaGetDeviceCount: %s", cudaGetErrorString(err));
    return buf;
}

extern "C" int llmq_cuda_device_count(const char **why) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError(); // clear the sticky error so later queries start clean
        if (why) *why = count_failure(err);
        return 0;
    }
    if (n == 0 && why) *why = "the NVIDIA driver sees no GPU (cudaGetDeviceCount: 0 devices)";
    return n;
}

extern "C" enum llmq_status llmq_cuda_device_info(int index, struct llmq_device_info *out) {
    cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, index);
    if (err != cudaSuccess) return llmq_errorf(LLMQ_ERR_DEVICE, "CUDA device %d: %s", index, cudaGetErrorString(err));
    memset(out, 0, sizeof(*out));
    out->index = index;
    snprintf(out->name, sizeof(out->name), "%s", prop.name);
    out->total_mem = prop.totalGlobalMem;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->sm_count = prop.multiProcessorCount;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) out->free_mem = free_b;
    return LLMQ_OK;
}
