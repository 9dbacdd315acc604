/*
 * kernels/awq_clip.h — AWQ's clip search (AutoAWQ awq/quantize/quantizer.py _compute_best_clip) as one call per
 * linear, on the CPU (this file's plain-C reference, kernels/awq_clip.c) or on a CUDA device
 * (kernels/awq_clip_cuda.cu).
 *
 * Legend: W (R, C) the linear's weights (already carrying AWQ's input scales), X (T, C) its sampled, scaled input
 * rows, G the group size (C % G == 0), NG = C / G, K shrink candidates (int(max_shrink · n_grid)).
 *
 * For each (row r, group g) with amax = max_j |w_j| over the group's G weights and, for i = 0 .. K-1,
 *     m_i = amax · (float)(1 − i / n_grid),  q_i = Q(clamp(w, −m_i, m_i))   (AWQ's asymmetric grid of `bits` bits,
 *                                                                          min / max of the clamped group)
 *     e_i = (1/T) Σ_t (x_t,g · (q_i − w))² = (q_i − w)ᵀ G_g (q_i − w) / T,   G_g = X_gᵀ X_g (G, G) in f64,
 * best[r, g] = m_i* and err[r, g] = e_i* for the first i whose e_i is the smallest (below 1e9; else amax and 1e9),
 * as quant/awq.c's host search chooses. That search forms every candidate's outputs X_g q_i and subtracts X_g w
 * (a (T, G) x (G, rows · (1 + K)) product per group); this one takes the quadratic form on the group's Gram matrix,
 * K · G² multiply-adds per (row, group) instead of (1 + K) · T · G. Equal in exact arithmetic; rounded differently,
 * so a near tie between two shrinks can go the other way (tests/unit/test_awq_clip.c measures the agreement).
 *
 * The CPU reference sums in a fixed order (bits independent of the thread count). The device computes G_g and the
 * products G_g (q_i − w) with cuBLAS DGEMM (strided batched over the groups), the candidates and the choice with own
 * kernels; its e_i are rounded differently from the CPU's (tests/gpu/test_awq_clip_cuda.c: the same choice on at
 * least 99.9% of (row, group), errors within 1e-9 relative). NOT YET RUN ON A GPU.
 */
#ifndef LLMQ_KERNELS_AWQ_CLIP_H
#define LLMQ_KERNELS_AWQ_CLIP_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/gptq_grid.h"

// best (R, NG) and err (R, NG) as above from host W (R, C) and X (T, C). LLMQ_ERR_ARG for a bad shape (G not dividing
// C, T < 1, K < 1 or > n_grid, bits outside 1..8), LLMQ_ERR_NOMEM, LLMQ_ERR_DEVICE (no device, or a build without
// CUDA) for the CUDA backend. W and X are not modified.
enum llmq_status llmq_awq_clip(enum llmq_backend be, const float *W, int64_t R, int64_t C, int64_t G, const float *X,
                               int64_t T, int bits, int K, int n_grid, float *best, double *err);

// The shrink candidates of one group w (G): q_i = Q(clamp(w, ±m_i)) for i = 0 .. K-1 into q (K, G); returns the
// group's amax. Every step one IEEE float32 operation (kernels/gptq_grid.h), so both backends make the same bits;
// m_i and the grid as quant/awq.c's clip_weight and pseudo_quantize_group make them.
LLMQ_GRID_FN float llmq_awq_clip_candidates(const float *w, int64_t G, int bits, int K, int n_grid, float *q) {
    const int maxq = (1 << bits) - 1;
    float amax = 0.0f;
    for (int64_t j = 0; j < G; j++) amax = fmaxf(amax, fabsf(w[j]));
    for (int i = 0; i < K; i++) {
        const float mx = LLMQ_GRID_MUL(amax, (float)(1.0 - (double)i / (double)n_grid)), mn = -mx;
        float *qi = q + i * G, lo = 0.0f, hi = 0.0f;
        for (int64_t j = 0; j < G; j++) {
            const float v = fminf(fmaxf(w[j], mn), mx);
            qi[j] = v;
            lo = j == 0 || v < lo ? v : lo;
            hi = j == 0 || v > hi ? v : hi;
        }
        float scale, zero;
        llmq_awq_grid_params(lo, hi, bits, &scale, &zero);
        for (int64_t j = 0; j < G; j++)
            qi[j] = LLMQ_GRID_MUL(LLMQ_GRID_SUB((float)llmq_gptq_grid_code(qi[j], scale, zero, maxq), zero), scale);
    }
    return amax;
}

// internal: the device half (arguments checked by llmq_awq_clip; kernels/awq_clip_stub.c without CUDA).
enum llmq_status llmq_awq_clip_cuda(const float *W, int64_t R, int64_t C, int64_t G, const float *X, int64_t T,
                                    int bits, int K, int n_grid, float *best, double *err);

#endif // LLMQ_KERNELS_AWQ_CLIP_H
