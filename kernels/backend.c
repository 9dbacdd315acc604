// kernels/backend.c — backend selection; the CUDA queries live in backend_cuda.cu.
#include "kernels/backend.h"

#include <string.h>

#ifndef LLMQ_HAVE_CUDA
bool llmq_backend_cuda_compiled(void) { return false; }
int llmq_cuda_device_count(const char **why) {
    if (why) *why = "this llmq was built without CUDA (-DLLMQ_CUDA=OFF or no nvcc at build time)";
    return 0;
}
enum llmq_status llmq_cuda_device_info(int index, struct llmq_device_info *out) {
    (void)out;
    return llmq_errorf(LLMQ_ERR_DEVICE, "CUDA device %d: this llmq was built without CUDA", index);
}
#endif

const char *llmq_backend_name(enum llmq_backend b) { return b == LLMQ_BACKEND_CUDA ? "cuda" : "cpu"; }

enum llmq_status llmq_backend_select(const char *name, enum llmq_backend *out) {
    const char *why = NULL;
    if (strcmp(name, "cpu") == 0) {
        *out = LLMQ_BACKEND_CPU;
        return LLMQ_OK;
    }
    if (strcmp(name, "auto") == 0) {
        *out = llmq_cuda_device_count(NULL) > 0 ? LLMQ_BACKEND_CUDA : LLMQ_BACKEND_CPU;
        return LLMQ_OK;
    }
    if (strcmp(name, "cuda") == 0) {
        if (llmq_cuda_device_count(&why) == 0)
            return llmq_errorf(LLMQ_ERR_DEVICE, "--device cuda: no CUDA device found: %s", why);
        *out = LLMQ_BACKEND_CUDA;
        return LLMQ_OK;
    }
    return llmq_errorf(LLMQ_ERR_ARG, "unknown device '%s' (expected auto, cpu or cuda)", name);
}
