// kernels/awq_clip_stub.c — the device half of kernels/awq_clip.h in a build without CUDA: LLMQ_ERR_DEVICE.
#include "kernels/awq_clip.h"

#ifndef LLMQ_HAVE_CUDA
enum llmq_status llmq_awq_clip_cuda(const float *W, int64_t R, int64_t C, int64_t G, const float *X, int64_t T,
                                    int bits, int K, int n_grid, float *best, double *err) {
    (void)W, (void)R, (void)C, (void)G, (void)X, (void)T, (void)bits, (void)K, (void)n_grid, (void)best, (void)err;
    return llmq_errorf(LLMQ_ERR_DEVICE, "awq clip on CUDA: this llmq was built without CUDA");
}
#endif
