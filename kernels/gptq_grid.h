/*
 * kernels/gptq_grid.h — the GPTQ integer grid, written once for the C solver (quant/quantizer.c,
 * quant/gptq.c) and the CUDA one (kernels/gptq_cuda.cu): the (scale, zero) of a group from its range and
 * the code of one value. As IST-DASLab/gptq quant.py Quantizer.find_params / quantize:
 *   range [xmin, xmax] always includes 0; sym: xmax = max(|xmin|, xmax), xmin = -xmax when xmin < 0;
 *   an all-zero range becomes [-1, 1]; scale = (xmax - xmin) / maxq; zero = sym ? (maxq + 1) / 2 :
 *   round(-xmin / scale); code = clamp(round(w / scale) + zero, 0, maxq), maxq = 2^bits - 1.
 *
 * Bit-exactness between the two: every operation is one IEEE float32 operation rounded to nearest. On the
 * device the sums and quotients are the __f*_rn intrinsics (never contracted into an FMA, whatever -fmad
 * says); on the host plain operators, and the C code is compiled without FP contraction (-std=c11).
 * rintf rounds half to even on both, like torch.round.
 */
#ifndef LLMQ_KERNELS_GPTQ_GRID_H
#define LLMQ_KERNELS_GPTQ_GRID_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LLMQ_GRID_FN __host__ __device__ static inline
#else
#define LLMQ_GRID_FN static inline
#endif
#if defined(__CUDA_ARCH__)
#define LLMQ_GRID_ADD(a, b) __fadd_rn((a), (b))
#define LLMQ_GRID_SUB(a, b) __fsub_rn((a), (b))
#define LLMQ_GRID_DIV(a, b) __fdiv_rn((a), (b))
#define LLMQ_GRID_MUL(a, b) __fmul_rn((a), (b))
#else
#define LLMQ_GRID_ADD(a, b) ((a) + (b))
#define LLMQ_GRID_SUB(a, b) ((a) - (b))
#define LLMQ_GRID_DIV(a, b) ((a) / (b))
#define LLMQ_GRID_MUL(a, b) ((a) * (b))
#endif

// (scale, zero) of a group whose values span [xmin, xmax] (xmin <= 0 <= xmax: the range includes 0).
LLMQ_GRID_FN void llmq_gptq_grid_params(float xmin, float xmax, int bits, bool sym, float *scale, float *zero) {
    const float maxq = (float)((1 << bits) - 1);
    if (sym) {
        if (-xmin > xmax) xmax = -xmin;
        if (xmin < 0.0f) xmin = -xmax;
    }
    if (xmin == 0.0f && xmax == 0.0f) {
        xmin = -1.0f;
        xmax = 1.0f;
    }
    *scale = LLMQ_GRID_DIV(LLMQ_GRID_SUB(xmax, xmin), maxq);
    *zero = sym ? LLMQ_GRID_DIV(LLMQ_GRID_ADD(maxq, 1.0f), 2.0f) : rintf(LLMQ_GRID_DIV(-xmin, *scale));
}

// AutoAWQ's zero-point grid (awq/quantize/quantizer.py pseudo_quantize_tensor, zero_point=True) of a group spanning
// [xmin, xmax] (its own min and max, 0 not forced in): scale = max(xmax - xmin, 1e-5) / maxq, zero = clamp(-round(xmin
// / scale), 0, maxq). The codes are llmq_gptq_grid_code's; the value (code - zero) · scale.
LLMQ_GRID_FN void llmq_awq_grid_params(float xmin, float xmax, int bits, float *scale, float *zero) {
    const float maxq = (float)((1 << bits) - 1);
    float range = LLMQ_GRID_SUB(xmax, xmin);
    if (range < 1e-5f) range = 1e-5f;
    *scale = LLMQ_GRID_DIV(range, maxq);
    float z = -rintf(LLMQ_GRID_DIV(xmin, *scale));
    if (z < 0.0f) z = 0.0f;
    if (z > maxq) z = maxq;
    *zero = z;
}

// The code of w on the grid: clamp(round(w / scale) + zero, 0, maxq).
LLMQ_GRID_FN uint8_t llmq_gptq_grid_code(float w, float scale, float zero, int maxq) {
    float q = LLMQ_GRID_ADD(rintf(LLMQ_GRID_DIV(w, scale)), zero);
    if (q < 0.0f) q = 0.0f;
    if (q > (float)maxq) q = (float)maxq;
    return (uint8_t)q;
}

#endif // LLMQ_KERNELS_GPTQ_GRID_H
