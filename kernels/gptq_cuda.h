/*
 * kernels/gptq_cuda.h — steps 5-7 of GPTQ (quant/gptq.h) on a CUDA device: damping + Cholesky chain
 * (cuSOLVER), the lazy block loop (own kernels: dynamic group grid, in-block loop) and the lazy update
 * (cuBLAS sgemm, plain FP32): the device half of kernels/gptq.h, which alone calls it (quant/gptq.c drives
 * that dispatch: the damping retry policy, its warnings and errors, steps 1-4 and 8 stay there). It depends on common/
 * only; the grid rules are kernels/gptq_grid.h, the one header the C solver compiles too.
 *
 * Legend: R rows = out_features, C cols = in_features, G group size, NG groups per row, B blocksize.
 * All matrices are row-major fp32 on the host side; "processing order" = the columns after act-order.
 *
 * Bit-exactness (tested in tests/gpu/test_gptq_cuda.c): the in-block kernel and the group-params kernel
 * give the same bits as llmq_gptq_block_row / llmq_quant_params_gptq on the same inputs (this file is
 * built with -fmad=false and uses __f*_rn intrinsics: every product is rounded before its subtraction).
 * The whole solve is not bit-identical to the CPU one: cuSOLVER / cuBLAS round differently from
 * OpenBLAS. Reruns on the same device and libraries are bit-identical.
 *
 * Built only with LLMQ_HAVE_CUDA; otherwise every function is a stub returning LLMQ_ERR_DEVICE
 * (kernels/gptq_cuda_stub.c). CUDA / cuBLAS / cuSOLVER call failures abort (CUDA_CHECK tier);
 * no device / device out of memory -> LLMQ_ERR_DEVICE / LLMQ_ERR_NOMEM with a message naming the layer.
 */
#ifndef LLMQ_KERNELS_GPTQ_CUDA_H
#define LLMQ_KERNELS_GPTQ_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

// Device state of one layer's solve (opaque): W (R, C), H / Hinv (C, C), Err1 (R, B), codes (R, C),
// scales / zeros (R, NG), per-block row losses, cuBLAS / cuSOLVER handles and workspace.
struct llmq_cuda_gptq;

// Allocate the device state for W (R, C), NG groups per row, block width B (>= 1) on device 0.
// name: layer for messages. On error *out = NULL.
enum llmq_status llmq_cuda_gptq_init(const char *name, int64_t R, int64_t C, int64_t NG, int64_t B,
                                     struct llmq_cuda_gptq **out);

// One attempt of steps 5 + 6: device H = H (host, undamped, processing order), H_ii += damp (fp32),
// then spotrf(lower) -> spotri -> mirror -> spotrf(upper) as in kernels/gptq.c. Returns 0 on success,
// else the failing step: 1 cholesky(H), 2 cholesky_inverse, 3 cholesky(H^-1, upper), 4 a diagonal of
// the factor not > 0 or not finite (the numbering of gptq.c). H is not modified.
int llmq_cuda_gptq_hinv_attempt(struct llmq_cuda_gptq *g, const float *H /* (C, C) */, float damp);

// Step 7 after a successful attempt.
//   W      : (R, C) in: weights in processing order (after steps 2 and 4); out: Q in processing order
//   gcol   : (C) group of each processing position (static + act-order: perm[j] / G; else j / G; 0 for G = -1)
//   perm   : (C) original column of each processing position (codes are written in original order)
//   G_dyn  : > 0: dynamic groups of G_dyn columns (grid computed at each group start, from W as it is
//            then, as the reference does); <= 0: scales / zeros are given (per row or static)
//   scales, zeros : (R, NG) in: given grids (ignored for dynamic groups); out: the grids used
//   q      : (R, C) out: codes, original column order
//   loss_rows : (ceil(C / B), R) out: per block and row, Σ (w - q)² / d² (fp64), for the caller to sum in
//            the CPU's order
//   Hinv   : (C, C) optional out: the upper factor (strict lower zero), processing order
enum llmq_status llmq_cuda_gptq_blocks(struct llmq_cuda_gptq *g, float *W /* (R, C) */, const int32_t *gcol /* (C) */,
                                       const int32_t *perm /* (C) */, int64_t G_dyn, int bits, bool sym,
                                       float *scales /* (R, NG) */, float *zeros /* (R, NG) */, uint8_t *q /* (R, C) */,
                                       double *loss_rows /* (ceil(C / B), R) */, float *Hinv /* (C, C) */);

// Done with the device state; NULL is a no-op. The first state freed is kept as the one spare: the next init takes
// it (its stream, cuBLAS / cuSOLVER handles and buffers; only a buffer too small for the new shape is allocated again),
// so a run of linears pays the handles' creation and the cudaMallocs once. Any other is destroyed.
void llmq_cuda_gptq_free(struct llmq_cuda_gptq *g);
// Destroys the spare (the device memory of the largest shape solved since); NULL spare: a no-op.
void llmq_cuda_gptq_release_spare(void);

// ---- test hooks (tests/gpu/test_gptq_cuda.c compares them bit for bit with the C code)

// The in-block kernel alone on host inputs, every row of W1 one block of `count` columns:
//   W1 (R, count) in; Hinv1 (count, count); scales / zeros (R, NG); gcol (count) group per column.
//   out: Q1 (R, count), Err1 (R, count), codes (R, count) in block order, rloss (R) = Σ (w - q)² / d².
// Reference: llmq_gptq_block_row (quant/gptq.h) per row with ldh = count.
enum llmq_status llmq_cuda_gptq_block_test(const float *W1 /* (R, count) */, int64_t R, int64_t count,
                                           const float *Hinv1 /* (count, count) */, const float *scales /* (R, NG) */,
                                           const float *zeros /* (R, NG) */, int64_t NG,
                                           const int32_t *gcol /* (count) */, int bits, float *Q1 /* (R, count) */,
                                           float *Err1 /* (R, count) */, uint8_t *codes /* (R, count) */,
                                           double *rloss /* (R) */);

// The group-params kernel alone: for each row r, the grid of W[r, 0:n] (row stride ldw >= n).
// Reference: llmq_quant_params_gptq(W + r * ldw, n, 1, bits, sym, ...).
enum llmq_status llmq_cuda_gptq_params_test(const float *W /* (R, ldw) */, int64_t R, int64_t ldw, int64_t n, int bits,
                                            bool sym, float *scales /* (R) */, float *zeros /* (R) */);

#endif // LLMQ_KERNELS_GPTQ_CUDA_H
