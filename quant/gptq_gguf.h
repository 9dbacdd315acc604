/*
 * quant/gptq_gguf.h — GPTQ onto a ggml block type: the error compensation of quant/gptq.h
 * (fasterquant of IST-DASLab/gptq) with the target GGUF type's own grid instead of the integer
 * (scale, zero) grid, so the bytes written decode to exactly the weights GPTQ compensated for.
 *
 * What it is: the solver for one linear layer whose output is rows of ggml blocks (formats/ggml/encode.h
 * encoders and grids). What it is not: no type choice (quant/gguf_mix.h), no file writing
 * (quant/gguf_export.h), no calibration (the caller hands over H, as for quant/gptq.h).
 *
 * Legend: R rows = out_features, C cols = in_features, QK the type's block size (32 or 256),
 *         B the lazy batch width.
 *
 * Steps (gptq.h's numbering; everything fp32 except the loss):
 *   1. importance: the caller's (C) vector, else diag(H) as handed over (before steps 2 and 5): an
 *      imatrix made from the same activations up to a constant factor (2/n_seq vs 1/N).
 *   2. dead columns: diag(H) == 0 -> H_ii = 1, W[:, i] = 0.
 *   5./6. damping, Hinv = upper Cholesky factor of H⁻¹ with the damping retry (llmq_gptq_hinv).
 *   7. lazy batches of B columns [i1, i2), B = blocksize rounded UP to a multiple of QK (128 for the
 *      32-element types, 256 for the K-quants and IQ4_XS), so that every block lies inside one
 *      batch. Rows are independent; per row r, per column j of the batch in order:
 *        - j is the first column of a block: the block is encoded from the row's CURRENT values
 *          W[r, j:j+QK] (all earlier columns' error already propagated into them: the in-batch
 *          updates are in place and the lazy update of the earlier batches was applied before this
 *          batch) with llmq_gguf_encode_row_ref(type, ..., importance[j:j+QK]); this fixes the
 *          block's (super-)scales and mins for good. The block is encoded alone, as a row of QK:
 *          for Q4_0 / Q4_1 / Q5_0 / Q5_1 WITH importance ggml's regulariser sigma2 is the mean x² of
 *          the whole row, here of the block (the rest of the row is not final yet); the other
 *          types' encoders only look at the block anyway.
 *        - q = grid value of the code nearest to w = W[r, j] on the block's grid for element j
 *          (llmq_gguf_block_grid, llmq_gguf_grid_nearest; the code replaces the encoder's one with
 *          llmq_gguf_block_set_code), err1 = (w - q) / Hinv_jj, W[r, j+1:i2] -= err1 · Hinv[j, j+1:i2],
 *          loss += (w - q)² / Hinv_jj².
 *      then W[:, i2:] -= Err1 · Hinv[i1:i2, i2:] (cblas_sgemm), as fasterquant. In exact arithmetic
 *      this is the column-by-column GPTQ sweep: B only changes rounding.
 *   act_order (AutoGPTQ's desc_act with static_groups, the only way act-order fits blocks of
   contiguous columns): after step 2 every row is encoded whole from the ORIGINAL W with the
   importance (llmq_gguf_encode_rows, threaded: the plain encoder's bytes), which fixes
   every block's grid for good; then W and H are permuted by perm = argsort(diag H, descending,
   stable; llmq_gptq_argsort_desc), and step 7 runs over the permuted columns without re-encoding:
   column j (original column perm[j]) only picks the nearest code on its block's fixed grid. W is
   un-permuted at the end. Batches need no rounding to QK then, but B is rounded the same way.
 *
 * Result: blocks (R rows of C / QK blocks, llmq_dtype_nbytes(type, C) bytes per row, row r at
 * blocks + r * row_bytes) and W = their decoding: llmq_dequantize_row(type, row r) == W[r, :] bit
 * for bit. With H = I (no propagation, damping only scales Hinv) the scales are those of the plain
 * encoder on the same row; the codes are the nearest grid points, which equal the encoder's codes
 * only for the types whose encoder ends with a nearest-level rounding on the final scales (see
 * tests/unit/test_gptq_gguf.c for which).
 *
 * Threads: rows are split over n_threads (pthreads) inside each batch; the lazy sgemm and the
 * Cholesky chain run in OpenBLAS with its own thread count. The bytes, W and the loss (summed per
 * row, then over rows in order) do not depend on n_threads.
 *
 * Memory: besides W, H and blocks: one (C, C) fp32 buffer during step 6, R x B floats (Err1), R
 * doubles (per-row losses).
 */
#ifndef LLMQ_QUANT_GPTQ_GGUF_H
#define LLMQ_QUANT_GPTQ_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

struct llmq_gptq_gguf_opts {
    float percdamp;       // relative damping of diag(H) in [0, 1); 0.01
    float damp_increment; // added on each Cholesky failure; 0 -> 0.0025
    int blocksize;        // lazy batch width before rounding up to a multiple of QK; 0 -> 128
    int n_threads;        // >= 1
    bool act_order;       // columns in order of decreasing diag(H), every block's grid fixed first (below)
    const float *dxxt;    // (C, C) NULL, or GPTAQ's cross term 2/n_seq · ΔX X̃ᵀ (quant/gptq.h "GPTAQ"): the same
                          // steps 2', 4', 6', 7' on this solver's batches (the in-batch term and the lazy
                          // W[:, i2:] += Wpre1 · P[i1:i2, i2:]); one (C, C) and one (R, B) fp32 buffer more
    float gptaq_alpha;    // its scale (> 0; upstream 0.25); used only with dxxt
};

// percdamp 0.01, damp_increment 0.0025, blocksize 128, 1 thread, no GPTAQ (alpha 0.25).
struct llmq_gptq_gguf_opts llmq_gptq_gguf_opts_default(void);

// GPTQ of one linear onto block type `type` (a ggml block type llmq_gguf_can_encode accepts;
// F32 / F16 / BF16 have no grid: LLMQ_ERR_ARG).
//   name       : layer name for messages ("blk.3.ffn_down")
//   W          : (R, C) fp32; in: weights; out (LLMQ_OK): the decoding of `blocks`
//   H          : (C, C) fp32 Hessian 2/N·XᵀX (symmetric), destroyed (its upper triangle holds Hinv)
//   importance : NULL (diag(H) is used) or (C) non-negative weights of the encoder
//   blocks     : R * llmq_dtype_nbytes(type, C) bytes, written
//   loss       : optional, ½·Σ (w - q)² / Hinv_jj² (fp64), the GPTQ proxy of the output error
//   percdamp_used : optional, the damping that succeeded
// Errors: C not a multiple of QK, bad type or options -> LLMQ_ERR_ARG; NaN/Inf in W, H or importance
// -> LLMQ_ERR_NUMERIC naming the layer and the element; Cholesky failing up to percdamp >= 1 ->
// LLMQ_ERR_NUMERIC; allocation -> LLMQ_ERR_NOMEM. On error W and blocks are unspecified.
enum llmq_status llmq_gptq_gguf_quantize(const char *name, float *W /* (R, C) */, float *H /* (C, C) */, int64_t R,
                                         int64_t C, enum llmq_dtype type, const float *importance /* (C) or NULL */,
                                         const struct llmq_gptq_gguf_opts *o, void *blocks, double *loss,
                                         float *percdamp_used);

#endif // LLMQ_QUANT_GPTQ_GGUF_H
