// kernels/block_cuda_stub.c — the device half of kernels/block.h in a build without CUDA: a CUDA block cannot be
// made (its ops context fails first), and these fail the same way if they are reached.
#include "kernels/block.h"

#ifndef LLMQ_HAVE_CUDA
enum llmq_status llmq_block_cuda_acc_upper(void *stream, double *acc, const float *scratch, int64_t C) {
    (void)stream, (void)acc, (void)scratch, (void)C;
    return llmq_errorf(LLMQ_ERR_DEVICE, "block Gram sums on cuda: this llmq was built without CUDA");
}
enum llmq_status llmq_block_cuda_colsums(void *stream, const float *x, int64_t n, int64_t C, int64_t row0, double *acc,
                                         uint64_t *bad) {
    (void)stream, (void)x, (void)n, (void)C, (void)row0, (void)acc, (void)bad;
    return llmq_errorf(LLMQ_ERR_DEVICE, "block column sums on cuda: this llmq was built without CUDA");
}
enum llmq_status llmq_block_cuda_zero(void *stream, double *acc, int64_t n) {
    (void)stream, (void)acc, (void)n;
    return llmq_errorf(LLMQ_ERR_DEVICE, "block Gram sums on cuda: this llmq was built without CUDA");
}
enum llmq_status llmq_block_cuda_hessian(void *stream, const double *acc, int64_t C, double scale, float *H) {
    (void)stream, (void)acc, (void)C, (void)scale, (void)H;
    return llmq_errorf(LLMQ_ERR_DEVICE, "block Hessian on cuda: this llmq was built without CUDA");
}
#else
typedef int llmq_block_cuda_stub_unused; // ISO C: a translation unit is not empty
#endif
