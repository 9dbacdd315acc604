/*
 * kernels/ops.h — the non-GEMM operations of a decoder block behind one dispatch (cpu | cuda), on buffers that
 * live where the backend computes: RMSNorm, RoPE, causal grouped-query attention, SwiGLU, the residual add.
 *
 * What it is: the first layer of "the block forward on the device" (a context, a small buffer API, five ops).
 * LLMQ_BACKEND_CPU is the reference: plain C (the attention's two products through cblas_sgemm) written as
 * calib/model/forward.c computes the same steps, so that on the same inputs it gives the SAME BITS as the CPU
 * forward pass (tests/unit/test_ops.c runs a whole block both ways and compares them bit for bit).
 * LLMQ_BACKEND_CUDA runs own kernels (kernels/ops_cuda.cu) on device buffers (device 0, one stream per
 * context); tests/gpu/test_ops_cuda.c compares each with the CPU reference at the tolerances stated below.
 * kernels/block.h runs a whole llama-family block on these ops (with the linears through kernels/gemm.h's
 * device-pointer products).
 * What it is not (yet): NOT wired into calib/model/forward.c — the forward pass still runs these steps on the
 * CPU with its own copies of them; making forward.c call this module (CPU path first, bit for bit, then the
 * CUDA path with the linears through cuBLAS on device buffers) is the next step. No linears here, no pinned
 * host staging, no multi-threaded CPU path (the CPU reference runs on the calling thread), no llama.cpp
 * emulation modes (calib/model/actq.h), no GELU (gemma's GeGLU).
 * NOTHING OF THE CUDA HALF HAS RUN ON A GPU YET: it compiles and links (-DLLMQ_CUDA=ON), and its test skips
 * on machines without a device. Until tests/gpu/test_ops_cuda.c has passed on one, treat it as unverified.
 *
 * Arithmetic: FP32 everywhere, on both backends, with FP32 accumulation (the CPU reference keeps
 * forward.c's double sums in RMSNorm and softmax). Why: the CPU path, which every oracle of the project
 * checks, is f32, so an f32 device path has tolerances that can be derived (below) and a failing test means a
 * bug, not a precision choice; issue 17 asks that each reduced-precision choice (BF16 tensor cores for the
 * forward, TF32) be MEASURED against the CPU path's perplexity before it is adopted, which needs a GPU run.
 * The attention kernel therefore runs on the FP32 CUDA cores; it is the obvious candidate for BF16 tensor
 * cores once measured.
 *
 * Device agreement with the CPU reference (u = 2^-24; derivations in tests/gpu/test_ops_cuda.c and
 * tests/ops_tolerance.h):
 *   RoPE, residual add: bit for bit (every operation an explicit round-to-nearest intrinsic, no FMA).
 *   RMSNorm: |gpu - cpu| <= 5 · FLT_EPSILON · |cpu| + 1e-37 (the double sum of squares is reduced in another
 *     order, so the f32 mean may round to the neighbouring float; the rest is the same operations).
 *   SwiGLU: |gpu - cpu| <= 6 · FLT_EPSILON · |cpu| + 1e-36 · |up| + 1e-44 (CUDA expf is within 2 ulp, glibc's
 *     within 1).
 *   Attention: per output element d, |gpu - cpu| <= (expm1(4 (Dh + 8) u Smax) + (2 nk + 5 nt + 12) u) ·
 *     Σ_j p_j |v_jd|, Smax = max_j scale · Σ_i |q_i k_ji|, nk visible keys, nt key tiles of 32: the bound of two
 *     FP32 softmax-attentions that sum in different orders (the device runs a flash-style online softmax).
 *     tests/unit/test_ops.c checks the CPU reference against float64 with the same bound.
 *   Each backend is deterministic on its own: the kernels use no atomics and a fixed reduction order.
 *
 * Residency: buffers are allocated once (llmq_ops_buf_alloc: cudaMalloc on CUDA, malloc on the CPU) and
 * reused; the ops allocate nothing on the device (the attention kernel is tiled: it never materialises the
 * (T, T) scores of a head). The CPU reference grows one (64, seqlen) score scratch in the context.
 * Asynchrony: on CUDA, uploads and ops are queued on the context's stream and return before they finish;
 * llmq_ops_download and llmq_ops_sync wait for the stream. An error of a queued kernel is reported by the
 * next sync / download. Uploads read pageable host memory (the copy is staged before the call returns, so
 * the source may be reused at once).
 *
 * Errors (each logged once, naming the op): LLMQ_ERR_ARG for a negative or inconsistent size, a buffer too
 * small for the shape, a buffer of another backend than the context's, a bad parameter (odd head_dim for RoPE,
 * n_head not a multiple of n_head_kv, ...); LLMQ_ERR_UNSUPPORTED for attention with head_dim > 256 on CUDA;
 * LLMQ_ERR_DEVICE when CUDA is not compiled in, no device is usable, or a CUDA call fails (the message names
 * the call, the CUDA error and file:line); LLMQ_ERR_NOMEM when host or device memory runs out. After an error
 * the output buffers are unspecified. A context is not thread-safe: one caller at a time.
 *
 * Legend: T tokens (n_seq sequences of seqlen tokens, back to back, each from position 0), D the row width,
 * H / Hkv query / key-value heads, Dh head_dim, Dq = H·Dh, Dkv = Hkv·Dh. Every matrix is row-major f32.
 */
#ifndef LLMQ_KERNELS_OPS_H
#define LLMQ_KERNELS_OPS_H

#include "common/status.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLMQ_OPS_ATTN_RB 64        // CPU reference: query rows per attention tile (forward.c's RB: same products)
#define LLMQ_OPS_CUDA_MAX_HEAD 256 // CUDA attention: the largest head_dim

struct llmq_ops; // a context: its backend; CUDA: device 0 and one stream; CPU: the attention's score scratch

// n floats where the context's backend computes. data is a device pointer for LLMQ_BACKEND_CUDA: never read or
// write it on the host. A zeroed struct is an empty buffer (llmq_ops_buf_free is a no-op on it).
struct llmq_ops_buf {
    float *data;
    int64_t n;            // floats
    enum llmq_backend be; // where data lives
    bool owned;           // from llmq_ops_buf_alloc (freed by llmq_ops_buf_free); false for a view
};

// A context for backend be. CUDA: LLMQ_ERR_DEVICE without CUDA or a device (the reason in the message).
// On error *out = NULL. Free with llmq_ops_free (NULL is a no-op); buffers may outlive their context.
enum llmq_status llmq_ops_init(enum llmq_backend be, struct llmq_ops **out);
void llmq_ops_free(struct llmq_ops *ops);
enum llmq_backend llmq_ops_backend(const struct llmq_ops *ops);

// Waits for everything queued on the context (no-op on the CPU); reports a queued kernel's failure.
enum llmq_status llmq_ops_sync(struct llmq_ops *ops);

// *out = a buffer of n >= 1 floats on the context's backend, contents undefined (alloc once, reuse: never on
// a hot path). On error *out is zeroed.
enum llmq_status llmq_ops_buf_alloc(struct llmq_ops *ops, int64_t n, struct llmq_ops_buf *out);
// Frees an owned buffer and zeroes *b; a view or a zeroed struct: only zeroed. NULL is a no-op. A CUDA buffer
// must not be in use by queued work of a context that is still running (cudaFree waits for the device).
void llmq_ops_buf_free(struct llmq_ops_buf *b);
// Floats [off, off + n) of b as a view (not owned; valid while b is). Out of range: LLMQ_ASSERT.
struct llmq_ops_buf llmq_ops_buf_view(const struct llmq_ops_buf *b, int64_t off, int64_t n);
// Host memory data (n floats, the caller's) as a CPU-backend view: the CPU forward's own arrays used in place.
struct llmq_ops_buf llmq_ops_buf_host(float *data, int64_t n);

// dst[off, off + n) = src (n) from host memory / dst (n) = src[off, off + n) into host memory (waits).
enum llmq_status llmq_ops_upload(struct llmq_ops *ops, const struct llmq_ops_buf *dst, int64_t off, const float *src,
                                 int64_t n);
enum llmq_status llmq_ops_download(struct llmq_ops *ops, float *dst, const struct llmq_ops_buf *src, int64_t off,
                                   int64_t n);
// count rows of width floats, row i at src[off + i·stride, + width), packed into host dst (count, width) (waits): one
// strided copy (cudaMemcpy2D on a CUDA context) where a loop of llmq_ops_download would pay a round trip per row.
// stride >= width >= 0, count >= 0; the last row must lie inside src.
enum llmq_status llmq_ops_download_rows(struct llmq_ops *ops, float *dst, const struct llmq_ops_buf *src, int64_t off,
                                        int64_t width, int64_t stride, int64_t count);

// Page-locks the host range [p, p + bytes) for faster copies on a CUDA context (cudaHostRegister): *pinned true when
// done (then llmq_ops_unpin before the memory is freed); false, and LLMQ_OK, when the range could not be locked (the
// copies stay pageable: e.g. a file-backed mapping the driver refuses) or on the CPU (nothing to do).
enum llmq_status llmq_ops_pin(struct llmq_ops *ops, void *p, size_t bytes, bool *pinned);
void llmq_ops_unpin(struct llmq_ops *ops, void *p); // a range llmq_ops_pin locked; NULL is a no-op

// The context's stream as a void * (a cudaStream_t: for kernels/gemm.h llmq_gemm_dev_init, so that products and ops
// queue in order); NULL on the CPU.
void *llmq_ops_stream(const struct llmq_ops *ops);

// ---- the ops (every buffer on the context's backend, at least as large as its shape)

// y (n, C): every row = row (C), an exact copy (the bias rows that a linear with beta 1 then accumulates into, as
// calib/model/forward.c qkv_project). y must not overlap row.
enum llmq_status llmq_ops_repeat_rows(struct llmq_ops *ops, const struct llmq_ops_buf *row,
                                      const struct llmq_ops_buf *y, int64_t n, int64_t C);

// y (n, D) = RMSNorm(x) · w row by row, as calib/model/forward.c rms_worker: sum of (x_i · x_i rounded to f32)
// in double, mean = (f32)(sum / D), scale = 1 / sqrtf(mean + eps), y_i = (x_i · scale) · w_i; with one_plus_w
// the factor is (1 + w_i) rounded to f32 first (gemma's norms as stored in HF; model.c makes the same f32
// 1 + w for the CPU forward). x (n, D), w (D), y (n, D); y may be x (in place), no other overlap. A row of
// Dh values per head (qwen3's q/k norm) is the same call with D = Dh and n = T · heads.
enum llmq_status llmq_ops_rmsnorm(struct llmq_ops *ops, const struct llmq_ops_buf *x, const struct llmq_ops_buf *w,
                                  const struct llmq_ops_buf *y, int64_t n, int64_t D, float eps, bool one_plus_w);

// The RoPE tables cos / sin (n_pos, Dh/2) on the host, as forward.c fill_rope and ggml_rope_cache_init:
// theta = pos, multiplied pair by pair by theta_scale = base^(-2/Dh) in f32; th_i = theta / ff[i], then / div
// when div != 1; cos / sin = cosf / sinf(th_i). ff (Dh/2): the frequency divisors (llama3 scaling:
// llmq_model_rope_freq_factors in calib/model/model.h; all 1 otherwise); div: linear scaling's factor, else 1.
// Computed once on the CPU and uploaded: the device never re-derives them.
void llmq_ops_rope_table(float base, int64_t head_dim, const float *ff /* (Dh/2) */, float div, int64_t n_pos,
                         float *cos /* (n_pos, Dh/2) */, float *sin /* (n_pos, Dh/2) */);

// RoPE in place on x (T, n_heads · Dh), T = n_seq · seqlen, token t at position t % seqlen: pair i of every head
// is (2i, 2i+1) (norm: GGUF llama) or (i, i + Dh/2) (neox), rotated as a' = a·c - b·s, b' = a·s + b·c
// (each product rounded, then the sum) with c, s = cos / sin[pos, i]. cos, sin: (>= seqlen, Dh/2). Dh even.
enum llmq_status llmq_ops_rope(struct llmq_ops *ops, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                               int64_t n_heads, int64_t head_dim, bool neox, const struct llmq_ops_buf *cos,
                               const struct llmq_ops_buf *sin);

// Causal grouped-query attention of n_seq independent sequences.
struct llmq_ops_attn {
    int64_t n_seq, seqlen;     // T = n_seq · seqlen tokens
    int64_t n_head, n_head_kv; // query head h reads key-value head h / (n_head / n_head_kv)
    int64_t head_dim;          // Dh
    float scale;               // scores · scale (1/sqrtf(Dh); gemma: 1/sqrtf(query_pre_attn_scalar))
    float softcap;             // > 0: s -> tanhf(s / softcap) · softcap after the scale (gemma2); 0: none
    int64_t window;            // > 0: query t sees keys t - window < p <= t (sliding layers); 0: all p <= t
};
// o (T, Dq) = softmax(scale · q kᵀ, causal, window) v per head, q (T, Dq), k, v (T, Dkv). CPU: forward.c
// attn_worker's arithmetic (tiles of LLMQ_OPS_ATTN_RB rows: an sgemm for q kᵀ, softmax with the max
// subtracted, expf in f32, the sum in double, rows times (f32)(1 / sum), an sgemm for p v; the same bits as
// forward.c when OpenBLAS runs one thread, as it does inside a forward pass). CUDA: one pass
// per tile of 8 query rows over key tiles of 32 with the online softmax (FP32 max, sum and output). o must
// not overlap q, k or v.
enum llmq_status llmq_ops_attention(struct llmq_ops *ops, const struct llmq_ops_attn *a, const struct llmq_ops_buf *q,
                                    const struct llmq_ops_buf *k, const struct llmq_ops_buf *v,
                                    const struct llmq_ops_buf *o);

// out (n) = silu(gate) · up = (g / (1 + expf(-g))) · u, element-wise. out may be gate or up, no other overlap.
enum llmq_status llmq_ops_swiglu(struct llmq_ops *ops, const struct llmq_ops_buf *gate, const struct llmq_ops_buf *up,
                                 const struct llmq_ops_buf *out, int64_t n);

// x (n) += y (n): the residual add. y may be x, no other overlap.
enum llmq_status llmq_ops_add(struct llmq_ops *ops, const struct llmq_ops_buf *x, const struct llmq_ops_buf *y,
                              int64_t n);

// *acc += Σ_i (double)a_i · (double)b_i over n floats of a and b, f64 products and sums (quant/quantize.c's error
// sums, tr(Δ H Δᵀ), on the block path: calib/blocks.h). CPU: one running sum from *acc in index order (the same
// bits as that loop). CUDA: LLMQ_OPS_DOT_BLOCKS partial sums, each a fixed tree over a fixed stride, added to *acc in
// block order on the host: deterministic, another order than the CPU's (both within n · 2^-53 · Σ|a_i b_i| of the
// exact sum). Waits for the context's work.
#define LLMQ_OPS_DOT_BLOCKS 256
enum llmq_status llmq_ops_dot_f64(struct llmq_ops *ops, const struct llmq_ops_buf *a, const struct llmq_ops_buf *b,
                                  int64_t n, double *acc);

// dst (n) = src (n), an exact copy where the context computes (the block path's saved weights: calib/blocks.h). No
// overlap.
enum llmq_status llmq_ops_copy(struct llmq_ops *ops, const struct llmq_ops_buf *dst, const struct llmq_ops_buf *src,
                               int64_t n);

// *acc += Σ_i d_i², d_i = (double)a_i - (double)b_i, over n floats (AWQ's losses on the block path: the squared error
// of a candidate's output). CPU: one running sum from *acc in index order (quant/awq.c's mse loop, so a loss summed
// micro-batch after micro-batch has its bits). CUDA: LLMQ_OPS_DOT_BLOCKS partial sums as llmq_ops_dot_f64, added to
// *acc in block order on the host. Waits for the context's work.
enum llmq_status llmq_ops_sqdiff_f64(struct llmq_ops *ops, const struct llmq_ops_buf *a, const struct llmq_ops_buf *b,
                                     int64_t n, double *acc);

// AWQ's scale candidate (quant/awq.h "_search_best_scale"): out (R, C) = Q(W · s) / s, columns scaled by s (C), Q
// AutoAWQ's zero-point grid of `bits` over groups of G columns (kernels/gptq_grid.h llmq_awq_grid_params); with
// minus_w, out = that - W (the Δ of the Gram-form loss). G tiles C. Every step one IEEE f32 operation (the device's
// __f*_rn intrinsics): the SAME BITS on both backends, and as quant/awq.c's own candidates (which call the CPU half,
// llmq_ops_awq_candidate_cpu). out must not overlap W or s.
enum llmq_status llmq_ops_awq_candidate(struct llmq_ops *ops, const struct llmq_ops_buf *W,
                                        const struct llmq_ops_buf *s, int64_t R, int64_t C, int64_t G, int bits,
                                        bool minus_w, const struct llmq_ops_buf *out);
void llmq_ops_awq_candidate_cpu(const float *W, const float *s, int64_t R, int64_t C, int64_t G, int bits, bool minus_w,
                                float *out);

// ---- internal: the device half (kernels/ops_cuda.cu; kernels/ops_cuda_stub.c returns LLMQ_ERR_DEVICE without
// CUDA). Arguments already checked by the dispatch in kernels/ops.c; every size > 0.
struct llmq_ops_cuda; // device 0, one non-blocking stream
enum llmq_status llmq_ops_cuda_init(struct llmq_ops_cuda **out);
void llmq_ops_cuda_free(struct llmq_ops_cuda *c);
enum llmq_status llmq_ops_cuda_alloc(size_t bytes, void **out);
void llmq_ops_cuda_buf_free(void *p);
enum llmq_status llmq_ops_cuda_copy(struct llmq_ops_cuda *c, void *dst, const void *src, size_t bytes, bool to_device);
enum llmq_status llmq_ops_cuda_download_2d(struct llmq_ops_cuda *c, float *dst, const float *src, int64_t width,
                                           int64_t stride, int64_t count);
enum llmq_status llmq_ops_cuda_sync(struct llmq_ops_cuda *c);
enum llmq_status llmq_ops_cuda_rmsnorm(struct llmq_ops_cuda *c, const float *x, const float *w, float *y, int64_t n,
                                       int64_t D, float eps, bool one_plus_w);
enum llmq_status llmq_ops_cuda_rope(struct llmq_ops_cuda *c, float *x, int64_t n_seq, int64_t seqlen, int64_t n_heads,
                                    int64_t head_dim, bool neox, const float *cos, const float *sin);
enum llmq_status llmq_ops_cuda_attention(struct llmq_ops_cuda *c, const struct llmq_ops_attn *a, const float *q,
                                         const float *k, const float *v, float *o);
enum llmq_status llmq_ops_cuda_swiglu(struct llmq_ops_cuda *c, const float *gate, const float *up, float *out,
                                      int64_t n);
enum llmq_status llmq_ops_cuda_add(struct llmq_ops_cuda *c, float *x, const float *y, int64_t n);
bool llmq_ops_cuda_pin(void *p, size_t bytes); // cudaHostRegister; false when it fails (the error is cleared)
void llmq_ops_cuda_unpin(void *p);
enum llmq_status llmq_ops_cuda_dot(struct llmq_ops_cuda *c, const float *a, const float *b, int64_t n,
                                   double partial[LLMQ_OPS_DOT_BLOCKS]); // waits
enum llmq_status llmq_ops_cuda_repeat_rows(struct llmq_ops_cuda *c, const float *row, float *y, int64_t n, int64_t C);
void *llmq_ops_cuda_stream(struct llmq_ops_cuda *c);
enum llmq_status llmq_ops_cuda_copy_d2d(struct llmq_ops_cuda *c, float *dst, const float *src, int64_t n);
enum llmq_status llmq_ops_cuda_sqdiff(struct llmq_ops_cuda *c, const float *a, const float *b, int64_t n,
                                      double partial[LLMQ_OPS_DOT_BLOCKS]); // waits
enum llmq_status llmq_ops_cuda_awq_candidate(struct llmq_ops_cuda *c, const float *W, const float *s, int64_t R,
                                             int64_t C, int64_t G, int bits, bool minus_w, float *out);

#endif // LLMQ_KERNELS_OPS_H
