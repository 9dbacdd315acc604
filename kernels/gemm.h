/*
 * kernels/gemm.h — the dense matrix products of llmq behind one dispatch (cpu | cuda).
 *
 * What it is: GEMM (f32, f64) and the XᵀX rank-k update (f32 SYRK) with cblas RowMajor semantics,
 * taking and returning HOST pointers. LLMQ_BACKEND_CPU is cblas (OpenBLAS, with whatever thread
 * count OpenBLAS is set to) and is the reference. LLMQ_BACKEND_CUDA copies the operands into
 * device buffers, runs cuBLAS and copies the result back, so a caller changes nothing but the
 * backend value (llmq_gemm_dev below takes operands already on the device instead). What it is
 * not: no fused ops, no TF32/bf16 — cuBLAS runs in plain FP32/FP64 (CUBLAS_PEDANTIC_MATH: no tensor-core
 * down-conversion), so the two backends agree to float rounding (different summation order), not bit for bit. Reruns on
 * the same device, toolkit and inputs give the same bits (cuBLAS GEMM/SYRK use no atomics by default, and llmq runs
 * them on one stream).
 *
 * Small products stay on the CPU: with the CUDA backend a call with M·N·K below the device
 * threshold (LLMQ_GEMM_CUDA_MIN_WORK = 2^24 multiply-adds, about 2 ms of single-thread BLAS; the
 * PCIe copies of such operands cost as much as the product) runs the CPU path, bit-identical to
 * LLMQ_BACKEND_CPU. The environment variable LLMQ_GEMM_CUDA_MIN_WORK (an integer >= 0, read once)
 * overrides the threshold; tests set it to 0 to push tiny models' products onto the device.
 *
 * The CUDA context is one per process: device 0 (what `--device cuda` selects), a cuBLAS handle,
 * one stream and three device buffers grown on demand (never shrunk; llmq_gemm_cuda_release frees
 * them). A mutex serialises the calls, so several threads may call in; they queue, they do not
 * overlap. Host memory is pageable (no pinned staging): copies run at pageable speed.
 *
 * Legend (row-major, as cblas_sgemm with CblasRowMajor): op(X) = X or Xᵀ;
 *   C (M, N) = alpha · op(A) (M, K) · op(B) (K, N) + beta · C.
 *   A is stored (M, K) when !transA, (K, M) when transA, with row stride lda (>= its column count);
 *   B likewise (K, N) / (N, K) with ldb; C (M, N) with ldc >= N. Columns of C at or beyond N and
 *   the elements between rows are never written. beta == 0: C is not read (NaN there is ignored).
 *
 * Errors: LLMQ_ERR_ARG when a dimension or stride is negative, too small, or above INT_MAX (cblas
 * and cuBLAS take int); LLMQ_ERR_DEVICE for the CUDA backend when llmq was built without CUDA, no
 * device is usable, or a CUDA / cuBLAS call fails (the message names the call and the CUDA error;
 * C is then unspecified); LLMQ_ERR_NOMEM when device memory runs out. Each is logged once.
 * M == 0 or N == 0 is a no-op; K == 0 gives C = beta · C.
 */
#ifndef LLMQ_KERNELS_GEMM_H
#define LLMQ_KERNELS_GEMM_H

#include "common/status.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stdint.h>

#define LLMQ_GEMM_CUDA_MIN_WORK (1LL << 24) // default device threshold on M·N·K (see above)

// C (M, N) = alpha · op(A) · op(B) + beta · C in f32.
enum llmq_status llmq_gemm_f32(enum llmq_backend be, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                               float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                               float *C, int64_t ldc);

// The same in f64 (AWQ's clip search).
enum llmq_status llmq_gemm_f64(enum llmq_backend be, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                               double alpha, const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                               double *C, int64_t ldc);

// The XᵀX update (cblas_ssyrk(RowMajor, Upper, Trans, N, K, ...)): for A (K, N) row-major with row
// stride lda >= N, the upper triangle (j >= i) of C (N, N), row stride ldc >= N, becomes
//     C[i][j] = alpha · Σ_k A[k][i] · A[k][j] + beta · C[i][j].
// The strict lower triangle is left as it was. beta 1 accumulates over calls (the Hessian sum);
// llmq_gram_acc_f64 below uses beta 0 into an f32 scratch and sums the scratch in f64.
enum llmq_status llmq_syrk_f32_acc(enum llmq_backend be, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                   float beta, float *C, int64_t ldc);

// The Gram matrix as calibration accumulates it: the upper triangle (j >= i) of acc (C, C), f64,
// gains XᵀX of X (N, C) row-major, computed per micro-batch of LLMQ_GRAM_MICRO_BATCH rows in f32 into
// scratch (llmq_gram_scratch_rows(C), C) f32 and summed in f64 (f32 products, f64 sums across batches).
// Up to C = LLMQ_GRAM_TILE_FROM the product is one SYRK; for wider inputs (an 8B model's ffn_down, C 14336)
// it runs in row tiles of LLMQ_GRAM_TILE (a GEMM of the tile's columns against the columns from its first
// one on), so that the f32 scratch is not a second (C, C) matrix next to the f64 sums. The strict lower
// triangle of acc is left as it was. Used by calib/ for the Hessians and by AWQ's Gram-form loss, so both
// see the same bits for the same rows.
#define LLMQ_GRAM_MICRO_BATCH 256
#define LLMQ_GRAM_TILE_FROM 4096
#define LLMQ_GRAM_TILE 512
int64_t llmq_gram_scratch_rows(int64_t C);
enum llmq_status llmq_gram_acc_f64(enum llmq_backend be, const float *X, int64_t N, int64_t C, float *scratch,
                                   double *acc);

// True when a product of M·N·K multiply-adds on backend be runs on the device (be is CUDA and the
// work is at or above the threshold); false means the CPU path (exactly LLMQ_BACKEND_CPU's bits).
bool llmq_gemm_on_device(enum llmq_backend be, int64_t M, int64_t N, int64_t K);

// ---- Products on operands that already live where the backend computes (kernels/block.h's linears) -------------
// A context for products whose A, B and C are pointers on backend be: host memory for LLMQ_BACKEND_CPU (cblas, the
// same call as llmq_gemm_f32's CPU path, so the same bits), device memory for LLMQ_BACKEND_CUDA (cuBLAS in plain
// FP32, CUBLAS_PEDANTIC_MATH as above, queued on `stream`, a cudaStream_t passed as void *; NULL: the default
// stream). Nothing is copied and nothing is allocated per call; there is no size threshold (the operands are
// already on the device). On CUDA the calls return before the product is done: the stream's next synchronisation
// (kernels/ops.h llmq_ops_sync / llmq_ops_download on the context that owns the stream) reports a failure of it.
// One handle per context, bound to its stream, so that its workspace is never shared with work on another stream.
// Not thread-safe: one caller at a time. NOT YET RUN ON A GPU (the CUDA half compiles; tests/gpu/test_block_cuda.c).
struct llmq_gemm_dev;
// *out = a context (NULL on error: LLMQ_ERR_DEVICE without CUDA / a device, or when cuBLAS fails to start).
enum llmq_status llmq_gemm_dev_init(enum llmq_backend be, void *stream, struct llmq_gemm_dev **out);
void llmq_gemm_dev_free(struct llmq_gemm_dev *g); // NULL is a no-op
// on: llmq_gemm_dev_f32's products from now on on TF32 tensor cores (inputs rounded to TF32's 10-bit mantissa, FP32
// accumulation: cuBLAS CUBLAS_TF32_TENSOR_OP_MATH); off (the default): plain FP32. LLMQ_ERR_UNSUPPORTED for on with
// a CPU context (no TF32 there). EXPERIMENTAL: never run on a GPU, its effect on perplexity not yet measured.
enum llmq_status llmq_gemm_dev_set_tf32(struct llmq_gemm_dev *g, bool on);
// As llmq_gemm_f32 (same legend, same checks and errors) on the context's pointers.
enum llmq_status llmq_gemm_dev_f32(struct llmq_gemm_dev *g, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                                   float *C, int64_t ldc);
// As llmq_syrk_f32_acc on the context's pointers (the upper triangle of row-major C; the strict lower one is left).
// Always plain FP32, whatever llmq_gemm_dev_set_tf32 says (the Gram sums' bound assumes it: kernels/block.h).
enum llmq_status llmq_syrk_dev_f32(struct llmq_gemm_dev *g, int64_t N, int64_t K, float alpha, const float *A,
                                   int64_t lda, float beta, float *C, int64_t ldc);

// Frees the CUDA context's buffers, stream and handle (a later call makes them again). No-op
// without CUDA or before the first device call.
void llmq_gemm_cuda_release(void);

// ---- internal: the device half (kernels/gemm_cuda.cu; stubs returning LLMQ_ERR_DEVICE without
// CUDA). Arguments already checked by the dispatch above; M, N, K > 0.
enum llmq_status llmq_gemm_cuda_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                                    int64_t ldc);
enum llmq_status llmq_gemm_cuda_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K, double alpha,
                                    const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
                                    int64_t ldc);
enum llmq_status llmq_syrk_cuda_f32(int64_t N, int64_t K, float alpha, const float *A, int64_t lda, float beta,
                                    float *C, int64_t ldc);

// The device half of llmq_gemm_dev (a cublasHandle_t as void *); arguments checked by kernels/gemm.c.
enum llmq_status llmq_gemm_dev_cuda_init(void *stream, void **handle);
void llmq_gemm_dev_cuda_free(void *handle);
enum llmq_status llmq_gemm_dev_cuda_f32(void *handle, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                        float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                                        float beta, float *C, int64_t ldc);
enum llmq_status llmq_syrk_dev_cuda_f32(void *handle, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                        float beta, float *C, int64_t ldc);
enum llmq_status llmq_gemm_dev_cuda_math(void *handle, bool tf32); // the handle's math mode: TF32 or pedantic FP32

#endif // LLMQ_KERNELS_GEMM_H
