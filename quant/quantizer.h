/*
 * quant/quantizer.h — the shared integer grid of llmq's weight quantizers (RTN, GPTQ, AWQ) and the
 * result of quantizing one linear layer (struct llmq_qlinear), which the writers (quant/export.h)
 * pack into AWQ / GPTQ / fake-quant outputs.
 *
 * It is NOT a block format (ggml blocks live in formats/ggml/quants.h) and does no packing.
 *
 * Legend: R rows = out_features, C cols = in_features, G group size (columns per group along C),
 *         NG number of groups per row.
 *
 * The grid (IST-DASLab/gptq quant.py; AutoAWQ quantizer.py for the AWQ variant):
 *   maxq = 2^bits - 1; a group of weights w is mapped to integer codes
 *       q = clamp(round(w / scale) + zero, 0, maxq)            round = half to even (torch.round)
 *   and back to
 *       w' = scale * (q - zero)
 *   all in fp32, in exactly this order of operations (so that a numpy/torch port gives the same bits).
 *   zero is always an integer value stored as float; sym: zero = 2^(bits-1) = (maxq + 1) / 2.
 *
 * Dequantization of a struct llmq_qlinear (the contract every writer and reader relies on):
 *   W[r, c] = (q[r, c] - zeros[r, g_idx[c]]) * scales[r, g_idx[c]]
 */
#ifndef LLMQ_QUANT_QUANTIZER_H
#define LLMQ_QUANT_QUANTIZER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/gptq_grid.h"

#define LLMQ_QBITS_MIN 2
#define LLMQ_QBITS_MAX 8

// How to quantize: bits 2..8; group_size >= 1 (32|64|128 in practice) or -1 = one group per row
// (per-channel); sym = symmetric grid with fixed zero 2^(bits-1).
struct llmq_qconfig {
    int bits;       // 2..8
    int group_size; // 32|64|128|...; -1 = one group per row
    bool sym;
};

// One quantized linear layer W (R, C), groups along C. Owns its arrays (llmq_qlinear_free).
struct llmq_qlinear {
    int64_t R, C;
    int bits, group_size; // group_size as configured (-1 = one group per row)
    bool sym;
    int64_t n_groups; // ceil(C / G) (= C / G when G tiles C); 1 when G = -1
    uint8_t *q;       // (R, C) integer codes 0..2^bits-1, in ORIGINAL column order
    float *scales;    // (R, n_groups)
    float *zeros;     // (R, n_groups) integer-valued zero points (sym: 2^(bits-1))
    int32_t *g_idx;   // (C) group of each input column (c / G without act-order; 0 when G = -1)
};

// Check a config: bits in 2..8, group_size -1 or >= 1. `what` names the layer / flag in the message.
// Returns LLMQ_OK or LLMQ_ERR_ARG (after llmq_errorf).
enum llmq_status llmq_qconfig_check(const struct llmq_qconfig *cfg, const char *what);

// Number of groups per row for C columns (ceil(C / G); 1 when G = -1 or G >= C).
int64_t llmq_qconfig_n_groups(const struct llmq_qconfig *cfg, int64_t C);

// Allocate out for W (R, C) with cfg (arrays zeroed, g_idx = identity c / G). On failure out is left
// empty (all NULL) and LLMQ_ERR_ARG / LLMQ_ERR_OVERFLOW / LLMQ_ERR_NOMEM is returned.
enum llmq_status llmq_qlinear_init(int64_t R, int64_t C, const struct llmq_qconfig *cfg, struct llmq_qlinear *out);

// Free the arrays of ql (not ql itself) and zero it. NULL or an empty ql is a no-op.
void llmq_qlinear_free(struct llmq_qlinear *ql);

// W_out (R, C) = dequantized weights (formula above), fp32.
void llmq_qlinear_dequant(const struct llmq_qlinear *ql, float *W_out);

// Grid parameters of one group, GPTQ reference (quant.py Quantizer.find_params, weight=True):
// over the n values x[0], x[stride], ..., the range [min(xmin, 0), max(xmax, 0)] (forced to include
// 0); sym: xmax = max(|xmin|, xmax) and xmin = -xmax if xmin < 0 (a range with xmin == 0 stays
// [0, xmax] — a quirk of the reference kept on purpose); an all-zero range becomes [-1, 1];
// scale = (xmax - xmin) / maxq; zero = sym ? (maxq + 1) / 2 : round(-xmin / scale). fp32 throughout.
void llmq_quant_params_gptq(const float *x /* (n) with stride */, int64_t n, int64_t stride, int bits, bool sym,
                            float *scale, float *zero);

// Grid parameters of one group searched over a shrink grid (the `mse` option of the GPTQ reference's
// quant.py Quantizer.find_params, also GPTQModel's): the range [xmin, xmax] of llmq_quant_params_gptq is
// shrunk to p·[xmin, xmax] for p = 1, 0.99, ..., 0.21 (grid 100, maxshrink 0.8), each p's (scale, zero) made as
// llmq_quant_params_gptq makes them, and the p with the lowest Σ_i wt_i · |x_i - q_i|^norm is kept (q_i the
// value on that grid; wt NULL = 1; ties keep the larger p). The reference uses norm 2.4, no weights; with
// wt = diag(H) and norm 2 it is the diagonal approximation of the group's output error. Not bit-identical to
// the reference's torch arithmetic: |x - q| is formed in f32, its power and the weighted sum in double, in
// element order (tests/py/gptq_ref.py find_params does the same).
void llmq_quant_params_gptq_mse(const float *x /* (n) with stride */, int64_t n, int64_t stride, int bits, bool sym,
                                const float *wt /* (n) contiguous, or NULL */, float norm, float *scale, float *zero);

// Grid parameters of one group, AutoAWQ (awq/quantize/quantizer.py pseudo_quantize_tensor, zero point):
// max_val/min_val over the group (NOT forced to include 0); scale = clamp(max - min, 1e-5) / maxq;
// zero = clamp(-round(min / scale), 0, maxq). sym (AutoAWQ zero_point=False): scale =
// clamp(max|x|, 1e-5) / (2^(bits-1) - 1) and codes clamp(round(x / scale), -2^(bits-1), 2^(bits-1) - 1),
// which on our 0..maxq grid is zero = 2^(bits-1) (the same codes, shifted).
void llmq_quant_params_awq(const float *x /* (n) with stride */, int64_t n, int64_t stride, int bits, bool sym,
                           float *scale, float *zero);

// One value on the grid: the code clamp(round(w / scale) + zero, 0, maxq) (kernels/gptq_grid.h).
static inline uint8_t llmq_quant_code(float w, float scale, float zero, int maxq) {
    return llmq_gptq_grid_code(w, scale, zero, maxq);
}

// Round-to-nearest quantization of W (R, C) row-major with cfg and the GPTQ grid
// (llmq_quant_params_gptq per (row, group), original column order, identity g_idx).
// out must be empty or freed; it is initialised here (llmq_qlinear_init). NaN/Inf in W ->
// LLMQ_ERR_NUMERIC naming `name` (the layer) and the element. W is not modified.
enum llmq_status llmq_rtn_quantize(const char *name, const float *W /* (R, C) */, int64_t R, int64_t C,
                                   const struct llmq_qconfig *cfg, struct llmq_qlinear *out);

#endif // LLMQ_QUANT_QUANTIZER_H
