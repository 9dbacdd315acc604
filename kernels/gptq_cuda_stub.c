// kernels/gptq_cuda_stub.c — kernels/gptq_cuda.h in a build without CUDA: every call is LLMQ_ERR_DEVICE.
#include "kernels/gptq_cuda.h"

#ifndef LLMQ_HAVE_CUDA
static enum llmq_status no_cuda(const char *what) {
    return llmq_errorf(LLMQ_ERR_DEVICE, "%s: GPTQ on CUDA: this llmq was built without CUDA", what);
}

enum llmq_status llmq_cuda_gptq_init(const char *name, int64_t R, int64_t C, int64_t NG, int64_t B,
                                     struct llmq_cuda_gptq **out) {
    (void)R, (void)C, (void)NG, (void)B;
    *out = NULL;
    return no_cuda(name);
}

int llmq_cuda_gptq_hinv_attempt(struct llmq_cuda_gptq *g, const float *H, float damp) {
    (void)g, (void)H, (void)damp;
    return 1;
}

enum llmq_status llmq_cuda_gptq_blocks(struct llmq_cuda_gptq *g, float *W, const int32_t *gcol, const int32_t *perm,
                                       int64_t G_dyn, int bits, bool sym, float *scales, float *zeros, uint8_t *q,
                                       double *loss_rows, float *Hinv) {
    (void)g, (void)W, (void)gcol, (void)perm, (void)G_dyn, (void)bits, (void)sym, (void)scales, (void)zeros;
    (void)q, (void)loss_rows, (void)Hinv;
    return no_cuda("gptq");
}

void llmq_cuda_gptq_free(struct llmq_cuda_gptq *g) { (void)g; }
void llmq_cuda_gptq_release_spare(void) {}

enum llmq_status llmq_cuda_gptq_block_test(const float *W1, int64_t R, int64_t count, const float *Hinv1,
                                           const float *scales, const float *zeros, int64_t NG, const int32_t *gcol,
                                           int bits, float *Q1, float *Err1, uint8_t *codes, double *rloss) {
    (void)W1, (void)R, (void)count, (void)Hinv1, (void)scales, (void)zeros, (void)NG, (void)gcol, (void)bits;
    (void)Q1, (void)Err1, (void)codes, (void)rloss;
    return no_cuda("gptq block test");
}

enum llmq_status llmq_cuda_gptq_params_test(const float *W, int64_t R, int64_t ldw, int64_t n, int bits, bool sym,
                                            float *scales, float *zeros) {
    (void)W, (void)R, (void)ldw, (void)n, (void)bits, (void)sym, (void)scales, (void)zeros;
    return no_cuda("gptq params test");
}
#else
typedef int llmq_gptq_cuda_stub_unused; // ISO C: a translation unit is not empty
#endif
