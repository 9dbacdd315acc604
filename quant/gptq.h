/*
 * quant/gptq.h — GPTQ (Frantar et al. 2022) for one linear layer, faithful to the reference
 * `GPTQ.fasterquant` of IST-DASLab/gptq (gptq.py + quant.py) (Frantar et al. 2022, "GPTQ", Algorithm 1), with the
 * act-order, static-groups and g_idx conventions of AutoGPTQ / GPTQModel and GPTQModel's damping retry.
 *
 * It is NOT the calibration pass: the caller (quant/quantize.h) gathers H = 2/N · XᵀX from the
 * layer's input activations (calib/calib.h) and hands over W and H; this module only solves.
 *
 * Legend: R rows = out_features, C cols = in_features, G group size, N calibration tokens.
 *
 * Steps (each maps to a line of fasterquant; all arithmetic fp32 like the reference):
 *   1. G = -1: (scale, zero) per row from the ORIGINAL W (before dead columns are zeroed).
 *   2. dead columns: diag(H) == 0 -> H_ii = 1, W[:, i] = 0.
 *   3. static_groups: (scale, zero) of every original-order group of G columns, from W after step 2.
 *   4. act_order: perm = argsort(diag H, descending; STABLE: ties keep ascending index), W and H
 *      permuted. group_aware instead (GPTQModel's act_group_aware, "GAR", Gafni et al. 2025): the
 *      full groups of G columns in order of decreasing max diag(H) within the group (stable), the
 *      columns of each group in order of decreasing diag(H) (stable), then the C % G tail columns
 *      in their own order. Each group's columns stay together, so the dynamic grid of processing
 *      group j is the grid of one original group.
 *   5. damping: H_ii += percdamp · mean(diag H) (mean summed in double, rounded to fp32).
 *   6. Hinv = upper Cholesky factor of H⁻¹: spotrf (lower) -> spotri -> spotrf (upper), fp32 LAPACK
 *      like torch.linalg.cholesky / cholesky_inverse. If any step fails (H not numerically positive
 *      definite): percdamp += damp_increment, a warning names the layer and the new percdamp, and the
 *      chain is retried from the undamped H; percdamp >= 1 -> LLMQ_ERR_NUMERIC naming the layer.
 *   7. lazy blocks of `blocksize` columns [i1, i2): per column i: q = quant(w), err1 = (w - q) / Hinv_ii,
 *      W1[:, i:] -= err1 ⊗ Hinv[i, i:] (within the block); then W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]
 *      (cblas_sgemm). Dynamic groups (G > 0, not static): at the first column c of each group (in
 *      processing order), (scale, zero) from W[:, c:c+G] — the reference reads the matrix W, which holds
 *      the lazy updates of earlier blocks but not the in-block updates of the current block (W1 is a
 *      copy); we reproduce that exactly. static_groups + act_order: column c (original index perm[j])
 *      uses group perm[j] / G.
 *   8. Q and the codes are un-permuted; g_idx[c] = group used for original column c
 *      (dynamic + act_order: invperm[c] / G; otherwise c / G). group_aware: the grids of the full
 *      groups move back to their original group index, so g_idx[c] = c / G as without reordering
 *      (any format that holds plain groups, --format awq included, holds the result).
 *
 * Memory: besides the caller's W and H, one C x C fp32 buffer during step 6 (the retry backup; freed
 * before the block loop) and R x B floats (Err1). H is destroyed: a caller that shares one H between
 * linears (q/k/v, gate/up) passes a copy to each.
 *
 * Threads: the heavy parts (Cholesky chain, lazy sgemm) run in OpenBLAS with its thread count
 * (OPENBLAS_NUM_THREADS / openblas_set_num_threads); the in-block loop is single-threaded per layer.
 * Results are bit-identical for a given OpenBLAS build and thread count.
 *
 * GPTAQ (Li et al. 2025, "GPTAQ: Efficient Finetuning-Free Quantization for Asymmetric Calibration", arXiv
 * 2504.02692; upstream Intelligent-Computing-Lab-Yale/GPTAQ fake_quant/gptaq_utils.py), opts.dxxt != NULL: the
 * objective is ‖W X − Q X̃‖² with X̃ the layer's input in the quantized model (what H is made of) and X its input
 * in the full-precision model, instead of GPTQ's ‖(W − Q) X̃‖². The caller passes dxxt = 2/n_seq · ΔX X̃ᵀ
 * (C, C), ΔX = X − X̃ (D[i, j] = Σ_tokens Δx_i x̃_j, the same scale as H). Fixing column i to q_i, the columns
 * F = {i+1, ...} compensate the error (w_i − q_i) x̃_i + w_i Δx_i on X̃: the GPTQ update plus
 * w_i · D[i, F] (H_FF)⁻¹, and with H⁻¹ = UᵀU (U the upper factor of step 6), (H_FF)⁻¹ = U_FFᵀ U_FF, so that row
 * is row i of P = triu₁(D Uᵀ) U (triu₁: strictly upper part). Steps:
 *   2'. D[:, dead] = 0 (the dead columns of step 2);  4'. D = D[perm][:, perm];
 *   6'. after the Cholesky chain: P = alpha · triu₁(D Uᵀ) U (two strmm, in place on the copy of D;
 *       2', 4' and 6' are llmq_gptaq_term);
 *   7'. in the block, W1[:, k] -= err1 · Hinv[i, k] − w · P[i, k] for k > i (w: column i before rounding);
 *       the lazy update W[:, i2:] += Wpre1 · P[i1:i2, i2:] before GPTQ's, Wpre1 the block's columns as they
 *       were just before their rounding. (Upstream's lazy term multiplies P by W1 after the block, which then
 *       holds the rounded Q1, not the w its in-block term uses; here both use w, so the lazy form equals the
 *       column-by-column one up to rounding.)
 * alpha (opts.gptaq_alpha) scales the asymmetric term; upstream's default is 0.25 (alpha = 1 is the plain
 * closed form). Cost: one more C x C fp32 matrix during the solve (the copy of D, then P) and 2 C³ flops
 * (the two strmm) per linear, R x B floats (Wpre1) and one more (R, C, B) sgemm per lazy block; steps 5-7 then
 * run on the CPU whatever the backend (like the searched grids). The caller's cost (the full-precision
 * stream, X per block input, the D sums) is quant/quantize.h's.
 *
 * Steps 5-7 run behind the kernels/gptq.h dispatch (its CPU reference is the text above; its in-block loop
 * llmq_gptq_block_row). CUDA (opts.backend = LLMQ_BACKEND_CUDA, kernels/gptq_cuda.h underneath): steps 1-4
 * and 8 stay here on the CPU; steps 5-7 run on the device: damping and the Cholesky chain in cuSOLVER
 * (spotrf/spotri/spotrf, the same retry loop and warnings as the CPU, shared code), the in-block loop as one warp per
 * row with the same fp32 operations as llmq_gptq_block_row (bit-identical for identical inputs; tests/gpu checks it),
 * dynamic (scale, zero) bit-identical to llmq_quant_params_gptq, the lazy update in cublasSgemm (plain
 * FP32, no TF32). The result differs from the CPU one only through cuSOLVER / cuBLAS vs OpenBLAS fp32
 * rounding (codes agree on >= 99%, tests/gpu/test_gptq_cuda.c). Reruns on the same GPU, driver and
 * CUDA libraries give bit-identical results (cuSOLVER potrf/potri and cuBLAS sgemm are deterministic
 * for a fixed configuration; our kernels use no atomics on floats); another GPU model or library
 * version may round differently. Device memory: W (R, C), H (C, C), Err1 (R, B), codes (R, C),
 * scales/zeros, the cuSOLVER workspace. The Hinv contract on H holds on both backends.
 */
#ifndef LLMQ_QUANT_GPTQ_H
#define LLMQ_QUANT_GPTQ_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "quant/quantizer.h"

#define LLMQ_GPTQ_PERCDAMP_DEFAULT 0.01f
#define LLMQ_GPTQ_DAMP_INCREMENT_DEFAULT 0.0025f // GPTQModel damp_auto_increment
#define LLMQ_GPTQ_BLOCKSIZE_DEFAULT 128
#define LLMQ_GPTAQ_ALPHA_DEFAULT 0.25f // upstream fasterquant(alpha=0.25)

// How each group's (scale, zero) is found (at steps 1, 3 and 7, wherever the reference calls find_params).
enum llmq_gptq_grid {
    LLMQ_GPTQ_GRID_MINMAX, // the reference's default: the group's min / max (llmq_quant_params_gptq)
    LLMQ_GPTQ_GRID_MSE,  // quant.py's mse=True: the shrink grid minimising Σ |w - q|^2.4 (llmq_quant_params_gptq_mse)
    LLMQ_GPTQ_GRID_HMSE, // the same grid minimising Σ diag(H)_c (w - q)², diag(H) of the columns after step 2
};

struct llmq_gptq_opts {
    struct llmq_qconfig q;     // bits, group size (-1 = per row), sym
    float percdamp;            // relative damping of diag(H), in [0, 1); 0.01 (reference)
    bool act_order;            // process columns in order of decreasing diag(H)
    bool static_groups;        // groups' (scale, zero) from the original weights, before any update
    bool group_aware;          // GAR order (step 4); needs G > 0; excludes act_order and static_groups
    int blocksize;             // lazy-update block width; 128 (0 -> 128)
    float damp_increment;      // added to percdamp on each Cholesky failure; 0 -> 0.0025
    enum llmq_backend backend; // where steps 5-7 run; LLMQ_BACKEND_CPU (= 0, so a zeroed struct means CPU)
    enum llmq_gptq_grid grid;  // MINMAX (= 0); MSE / HMSE run steps 5-7 on the CPU whatever the backend
    const float *H_src;        // (C, C) NULL, or an unchanged copy of the H passed in, kept by the caller for
                               // the whole call: then the solver holds no C x C backup of its own (the damping
                               // retry and act-order's permutation rebuild H from it; same bytes), C² floats less
    const float *dxxt; // (C, C) NULL, or GPTAQ's cross term 2/n_seq · ΔX X̃ᵀ in original column order (see "GPTAQ"
                       // above); read only
    float gptaq_alpha; // GPTAQ's scale of the asymmetric term (> 0; upstream 0.25); used only with dxxt
};

// Default options: 4-bit, group 128, asym, percdamp 0.01, no act-order, block 128, CPU, no GPTAQ (alpha 0.25).
struct llmq_gptq_opts llmq_gptq_opts_default(void);

// Quantize one linear layer with GPTQ.
//   name : layer name for messages ("blk.3.ffn_down")
//   W    : (R, C) row-major fp32; in: weights; out (LLMQ_OK): the dequantized weights Q (what the
//          reference writes back into layer.weight), equal to llmq_qlinear_dequant(out).
//   H    : (C, C) row-major fp32 Hessian 2/N·XᵀX (symmetric; the full matrix is read), destroyed; on
//          LLMQ_OK its upper triangle holds Hinv (permuted order when act_order) and its strict lower
//          triangle is zero.
//   R, C : shape; G must be -1 or >= 1 (a G that does not tile C gives a shorter last group).
//   out  : empty struct; initialised here (llmq_qlinear_init); the caller frees it. Left empty on error.
//   err  : optional; receives the reference's loss sum(Losses) = ½·Σ (w - q)² / Hinv_ii² (fp64 sum),
//          the GPTQ proxy of the layer's output error.
//   percdamp_used : optional; the damping that finally succeeded.
// Errors: bad options -> LLMQ_ERR_ARG; backend CUDA in a build without CUDA or without a device ->
// LLMQ_ERR_DEVICE; NaN/Inf in W or H -> LLMQ_ERR_NUMERIC (naming the layer and
// the element); Cholesky failing up to percdamp >= 1 -> LLMQ_ERR_NUMERIC; allocation -> LLMQ_ERR_NOMEM.
enum llmq_status llmq_gptq_quantize(const char *name, float *W /* (R, C) */, float *H /* (C, C) */, int64_t R,
                                    int64_t C, const struct llmq_gptq_opts *o, struct llmq_qlinear *out, double *err,
                                    float *percdamp_used);

// Steps 5 + 6 alone on the CPU (quant/gptq_gguf.c; kernels/gptq.h underneath): H (C, C) (already dead-column fixed and
// permuted) -> on LLMQ_OK its upper triangle holds the upper Cholesky factor of (H + damp·I)⁻¹, strict
// lower zero; *percdamp is updated to the value that succeeded. H0 (C, C) is scratch for the backup of
// H (the retry restarts from it).
enum llmq_status llmq_gptq_hinv(const char *name, float *H /* (C, C) */, float *H0 /* (C, C) */, int64_t C,
                                float *percdamp, float damp_increment);

// GPTAQ steps 2', 4' and 6' (see "GPTAQ"): P (C, C) := alpha · triu₁(D' Uᵀ) U with D' = D[perm][:, perm] (perm NULL:
// identity), its columns j with dead[perm[j]] zeroed (dead NULL: none), U (C, C) the upper factor of step 6 (its
// strict lower triangle is not read). Shared with quant/gptq_gguf.c.
void llmq_gptaq_term(const float *D /* (C, C) */, const uint8_t *dead /* (C) */, const int64_t *perm /* (C) */,
                     const float *U /* (C, C) */, int64_t C, float alpha, float *P /* (C, C) */);

// Step 4's order: perm = argsort(key, descending), STABLE (ties keep ascending index); tmp is (C)
// scratch. Shared with quant/gptq_gguf.c.
void llmq_gptq_argsort_desc(const float *key /* (C) */, int64_t *perm /* (C) */, int64_t *tmp /* (C) */, int64_t C);

// Step 4's permutation: W (R, C) = W[:, perm], H (C, C) = H[perm][:, perm]; row (C) and Hs (C, C) are
// scratch. Shared with quant/gptq_gguf.c.
void llmq_gptq_permute(float *W, float *H, int64_t R, int64_t C, const int64_t *perm, float *row, float *Hs);

#endif // LLMQ_QUANT_GPTQ_H
