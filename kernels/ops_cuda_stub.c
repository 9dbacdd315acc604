// kernels/ops_cuda_stub.c — the device half of kernels/ops.h in a build without CUDA: llmq_ops_cuda_init fails
// with LLMQ_ERR_DEVICE, so no CUDA context exists and the other entry points are never reached (they fail the
// same way if they are).
#include "kernels/ops.h"

#ifndef LLMQ_HAVE_CUDA
static enum llmq_status no_cuda(const char *what) {
    return llmq_errorf(LLMQ_ERR_DEVICE, "ops %s on cuda: this llmq was built without CUDA", what);
}

enum llmq_status llmq_ops_cuda_init(struct llmq_ops_cuda **out) {
    *out = NULL;
    return no_cuda("init");
}
void llmq_ops_cuda_free(struct llmq_ops_cuda *c) { (void)c; }
enum llmq_status llmq_ops_cuda_alloc(size_t bytes, void **out) {
    (void)bytes;
    *out = NULL;
    return no_cuda("alloc");
}
void llmq_ops_cuda_buf_free(void *p) { (void)p; }
enum llmq_status llmq_ops_cuda_copy(struct llmq_ops_cuda *c, void *dst, const void *src, size_t bytes, bool to_device) {
    (void)c, (void)dst, (void)src, (void)bytes, (void)to_device;
    return no_cuda("copy");
}
enum llmq_status llmq_ops_cuda_download_2d(struct llmq_ops_cuda *c, float *dst, const float *src, int64_t width,
                                           int64_t stride, int64_t count) {
    (void)c, (void)dst, (void)src, (void)width, (void)stride, (void)count;
    return no_cuda("download_2d");
}
enum llmq_status llmq_ops_cuda_sync(struct llmq_ops_cuda *c) {
    (void)c;
    return no_cuda("sync");
}
enum llmq_status llmq_ops_cuda_rmsnorm(struct llmq_ops_cuda *c, const float *x, const float *w, float *y, int64_t n,
                                       int64_t D, float eps, bool one_plus_w) {
    (void)c, (void)x, (void)w, (void)y, (void)n, (void)D, (void)eps, (void)one_plus_w;
    return no_cuda("rmsnorm");
}
enum llmq_status llmq_ops_cuda_rope(struct llmq_ops_cuda *c, float *x, int64_t n_seq, int64_t seqlen, int64_t n_heads,
                                    int64_t head_dim, bool neox, const float *cos, const float *sin) {
    (void)c, (void)x, (void)n_seq, (void)seqlen, (void)n_heads, (void)head_dim, (void)neox, (void)cos, (void)sin;
    return no_cuda("rope");
}
enum llmq_status llmq_ops_cuda_attention(struct llmq_ops_cuda *c, const struct llmq_ops_attn *a, const float *q,
                                         const float *k, const float *v, float *o) {
    (void)c, (void)a, (void)q, (void)k, (void)v, (void)o;
    return no_cuda("attention");
}
enum llmq_status llmq_ops_cuda_swiglu(struct llmq_ops_cuda *c, const float *gate, const float *up, float *out,
                                      int64_t n) {
    (void)c, (void)gate, (void)up, (void)out, (void)n;
    return no_cuda("swiglu");
}
enum llmq_status llmq_ops_cuda_add(struct llmq_ops_cuda *c, float *x, const float *y, int64_t n) {
    (void)c, (void)x, (void)y, (void)n;
    return no_cuda("add");
}
bool llmq_ops_cuda_pin(void *p, size_t bytes) {
    (void)p, (void)bytes;
    return false;
}
void llmq_ops_cuda_unpin(void *p) { (void)p; }
enum llmq_status llmq_ops_cuda_dot(struct llmq_ops_cuda *c, const float *a, const float *b, int64_t n,
                                   double partial[LLMQ_OPS_DOT_BLOCKS]) {
    (void)c, (void)a, (void)b, (void)n, (void)partial;
    return no_cuda("dot");
}
enum llmq_status llmq_ops_cuda_repeat_rows(struct llmq_ops_cuda *c, const float *row, float *y, int64_t n, int64_t C) {
    (void)c, (void)row, (void)y, (void)n, (void)C;
    return no_cuda("repeat_rows");
}
void *llmq_ops_cuda_stream(struct llmq_ops_cuda *c) {
    (void)c;
    return NULL;
}
enum llmq_status llmq_ops_cuda_copy_d2d(struct llmq_ops_cuda *c, float *dst, const float *src, int64_t n) {
    (void)c, (void)dst, (void)src, (void)n;
    return no_cuda("copy");
}
enum llmq_status llmq_ops_cuda_sqdiff(struct llmq_ops_cuda *c, const float *a, const float *b, int64_t n,
                                      double partial[LLMQ_OPS_DOT_BLOCKS]) {
    (void)c, (void)a, (void)b, (void)n, (void)partial;
    return no_cuda("sqdiff");
}
enum llmq_status llmq_ops_cuda_awq_candidate(struct llmq_ops_cuda *c, const float *W, const float *s, int64_t R,
                                             int64_t C, int64_t G, int bits, bool minus_w, float *out) {
    (void)c, (void)W, (void)s, (void)R, (void)C, (void)G, (void)bits, (void)minus_w, (void)out;
    return no_cuda("awq_candidate");
}
#else
typedef int llmq_ops_cuda_stub_unused; // ISO C: a translation unit is not empty
#endif
