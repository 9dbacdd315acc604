/*
 * kernels/gptq.h — steps 5-7 of GPTQ (quant/gptq.h has the step list) behind one dispatch (cpu | cuda), as
 * gemm.h is for the products: damping and the Cholesky chain Hinv = cholesky(cholesky_inverse(cholesky(H +
 * damp·I)), upper=True), then the lazy block loop (the in-block loop, the dynamic group grids, the lazy update
 * W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]). quant/gptq.c drives it: steps 1-4 and 8 and the damping retry policy
 * (which damping to try next, its warnings and its error) stay there; this module only moves numbers.
 * It depends on common/ only; the grid rules are kernels/gptq_grid.h.
 *
 * LLMQ_BACKEND_CPU is the reference: LAPACK spotrf / spotri / spotrf in fp32 (OpenBLAS, column-major on the
 * symmetric row-major H, so "row-major lower" is "column-major upper"), the in-block loop llmq_gptq_block_row
 * one row at a time, the lazy update in cblas_sgemm. Built with -ffp-contract=off: every product is rounded
 * to fp32 before its subtraction, as torch's outer product then `-=`.
 * LLMQ_BACKEND_CUDA is kernels/gptq_cuda.h (cuSOLVER, own kernels bit-identical to llmq_gptq_block_row and
 * the min/max grid, cuBLAS sgemm in plain FP32); the two backends agree to fp32 rounding, not bit for bit.
 * Each is deterministic on its own device and libraries.
 *
 * Legend: R rows = out_features, C cols = in_features, NG groups per row, B block width; all matrices
 * row-major fp32 in processing order (after act-order), host pointers.
 */
#ifndef LLMQ_KERNELS_GPTQ_H
#define LLMQ_KERNELS_GPTQ_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

// A dynamic group's (scale, zero) on the CPU: x (n) contiguous, the group starting at processing column c.
// NULL in llmq_gptq_solve.grid: the min/max grid (llmq_gptq_grid_params over the range including 0).
typedef void (*llmq_gptq_grid_fn)(void *ctx, const float *x, int64_t n, int64_t c, float *scale, float *zero);

// One layer's solve.
struct llmq_gptq_solve {
    enum llmq_backend backend; // CPU or CUDA
    const char *name;          // layer, for messages
    int64_t R, C;              // shape
    int64_t B;                 // block width (>= 1)
    int64_t NG;                // groups per row of scales / zeros
    int64_t G_dyn;             // > 0: dynamic groups of G_dyn columns, grid computed at each group's first
                               // column from W as it is then; <= 0: the grids are given (per row or static)
    int bits;                  // 2..8
    bool sym;                  // symmetric grid (used by the min/max grid)
    const int32_t *gcol;       // (C) group of each processing position
    const int64_t *perm;       // (C) original column of each processing position (codes land there)
    llmq_gptq_grid_fn grid;    // CPU only (CUDA computes the min/max grid itself and refuses a callback)
    void *grid_ctx;
    const float *H_src; // CPU, optional: (C, C) the caller's unchanged H in original order; a failed attempt
                        // rebuilds H from it (H_src[perm][:, perm], a zero diagonal entry set to 1)
    float *backup;      // CPU, optional when H_src is NULL: (C, C) scratch for the copy of H a failed attempt
                        // restores from; NULL with H_src NULL: allocated here
    const float *P;     // CPU only, optional: (C, C) GPTAQ's asymmetric term in processing order (strict upper,
                        // quant/gptq.h "GPTAQ"); each quantized column i then also adds w_i · P[i, i+1:] to the
                        // columns after it (w_i its weight just before rounding), in the block and in the lazy
                        // update (W[:, i2:] += Wpre1 · P[i1:i2, i2:], Wpre1 the block's pre-rounding weights).
                        // NULL: plain GPTQ.
};

struct llmq_gptq_solver; // opaque: the backend's state for one layer

// Prepare the solve of s on H (C, C): the undamped Hessian after steps 2 and 4. H must stay valid until
// llmq_gptq_solver_free; on the CPU it is damped and factored in place. Only C (and on CUDA R, NG, B) are
// needed for the attempts alone; the rest is checked by llmq_gptq_solver_blocks. Errors: LLMQ_ERR_ARG (bad
// backend, a grid callback on CUDA), LLMQ_ERR_DEVICE (no CUDA build or device), LLMQ_ERR_NOMEM. On error
// *out = NULL.
enum llmq_status llmq_gptq_solver_init(const struct llmq_gptq_solve *s, float *H /* (C, C) */,
                                       struct llmq_gptq_solver **out);

// One attempt of steps 5 + 6 with absolute damping `damp` (H_ii += damp, then the chain). 0 on success
// (the factor ready for the blocks), else the failing step: 1 cholesky(H), 2 cholesky_inverse, 3 cholesky(H⁻¹,
// upper), 4 a diagonal of the factor not > 0 or not finite. After a failure the undamped H is back; after a
// success no further attempt may be made (a backup allocated at init is freed then).
int llmq_gptq_solver_hinv_attempt(struct llmq_gptq_solver *g, float damp);

// Step 7 after a successful attempt.
//   W      : (R, C) in: weights in processing order; out: Q (the dequantized codes) in processing order
//   scales, zeros : (R, NG) in: given grids (ignored where dynamic); out: the grids used
//   q      : (R, C) out: codes in ORIGINAL column order (q[r, perm[j]])
//   loss   : += Σ (w - q)² / Hinv_ii² over the layer, summed block by block and row by row (both backends)
//   t_update : optional; += seconds in the lazy update (CPU; 0 added on CUDA)
// On return H (the pointer given at init) holds Hinv: the upper factor, strict lower zero.
enum llmq_status llmq_gptq_solver_blocks(struct llmq_gptq_solver *g, float *W /* (R, C) */, float *scales /* (R, NG) */,
                                         float *zeros /* (R, NG) */, uint8_t *q /* (R, C) */, double *loss,
                                         double *t_update);

// H (C, C) := what GPTQ's steps 2 and 4 make of Hsrc (C, C): H[i, j] = Hsrc[perm[i], perm[j]], a zero diagonal
// entry (a dead column) set to 1. (The CPU's restore from llmq_gptq_solve.H_src; quant/gptq.c's permutation.)
void llmq_gptq_rebuild_h(float *H /* (C, C) */, const float *Hsrc /* (C, C) */, const int64_t *perm /* (C) */,
                         int64_t C);

// Free the state (not H); NULL is a no-op. A CUDA state is kept as the one spare the next CUDA solver_init reuses
// (its handles and buffers; kernels/gptq_cuda.h), until llmq_gptq_release_device.
void llmq_gptq_solver_free(struct llmq_gptq_solver *g);
// Frees the spare CUDA solve state (device memory of the largest linear solved); a no-op without one or without CUDA.
void llmq_gptq_release_device(void);

// Step 7's in-block loop for one row (the CPU reference of the CUDA kernel; exposed for tests):
// for i in 0..count-1: code = quant(W1[i]) with (scales[gcol[i]], zeros[gcol[i]]), q, e = (w - q) / d,
// W1[k] -= e * Hinv1[i, k] for k > i (product rounded to fp32, then the subtraction), W1[i] = q.
//   W1     : (count) in: the row's block of W; out: Q1
//   err1   : (count) out: Err1 row
//   code1  : (count) out: integer codes, in block (processing) order
//   Hinv1  : (count, ldh) Hinv[i1:i2, i1:i2] with row stride ldh (C in the solve)
//   scales, zeros : (NG) this row's grid; gcol (count): group of each block column
// Returns the row's Losses1 sum Σ (w - q)² / d² (fp64 sum of fp32 terms; the caller halves the total).
double llmq_gptq_block_row(float *W1 /* (count) */, float *err1 /* (count) */, uint8_t *code1 /* (count) */,
                           const float *Hinv1 /* (count, ldh) */, int64_t ldh, int64_t count,
                           const float *scales /* (NG) */, const float *zeros /* (NG) */,
                           const int32_t *gcol /* (count) */, int maxq);

#endif // LLMQ_KERNELS_GPTQ_H
