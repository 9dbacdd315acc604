// formats/ggml/encode_legacy.c — encoders and grids of the legacy 32-element blocks Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0 (see formats/ggml/encode.h, formats/ggml/encode_impl.h).
//
// Without importance each encoder is ggml's quantize_row_qX_Y_ref (ggml-quants.c), which is also
// what gguf-py's gguf.quants.quantize computes: a scale from the block's max (Q4_0, Q5_0: the
// signed value of largest magnitude over -8 / -16; Q8_0: amax / 127) or its range (Q4_1, Q5_1),
// then truncation of x * (1/d) + 8.5 (etc.) to an integer. With importance the encoders are
// ggml's quantize_row_qX_Y_impl: per-element weights qw[j] * sqrt(sigma2 + x[j]^2), sigma2 the
// mean square of the row, then the weighted scale search make_qx_quants (symmetric types) or
// make_qkx3_quants (types with a minimum). Q8_0 has no weighted variant (ggml ignores the
// imatrix for it).
// Every float expression is ggml's, in ggml's order (compiled with -ffp-contract=off); the float
// to small-int conversions are the same C casts, so out-of-range edge cases (NaN) behave alike.
#include "formats/ggml/encode.h"
#include "formats/ggml/encode_impl.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "formats/ggml/quants.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

// sigma2 of quantize_row_*_impl: the mean of x^2 over the whole row, summed in order.
static float row_sigma2(const float *x, int64_t n) {
    float sum_x2 = 0;
    for (int64_t j = 0; j < n; j++) sum_x2 += x[j] * x[j];
    return sum_x2 / (float)n; // ggml: sum_x2 / n_per_row, the int64_t converted to float
}

// weight[j] = qw[j] * sqrt(sigma2 + x[j]^2) for one block of 32.
static void block_weights(const float *xb, const float *qw, float sigma2, float *weight) {
    for (int j = 0; j < 32; j++) weight[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
}

// The signed value of largest magnitude of a block (the first one on ties), as ggml finds it.
static float block_absmax_signed(const float *xb, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        const float v = xb[j];
        if (amax < fabsf(v)) {
            amax = fabsf(v);
            max = v;
        }
    }
    return max;
}

// Nibbles (and 5th bits) of 32 codes 0..31 into qs / qh as ggml lays them out.
static void pack_q5(const uint8_t *q, uint8_t *qs, uint8_t *qh_bytes) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const uint8_t xi0 = q[j], xi1 = q[j + 16];
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
        qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4);
}

// ============================================================================ Q4_0

void llmq_enc_q4_0(const float *x, void *vy, int64_t n, const float *qw) {
    struct llmq_block_q4_0 *y = vy;
    const int64_t nb = n / LLMQ_QK4_0;
    if (!qw) { // quantize_row_q4_0_ref
        for (int64_t i = 0; i < nb; i++) {
            const float *xb = x + i * LLMQ_QK4_0;
            const float max = block_absmax_signed(xb, LLMQ_QK4_0);
            const float d = max / -8;
            const float id = d ? 1.0f / d : 0.0f;
            y[i].d = llmq_f32_to_f16(d);
            for (int j = 0; j < 16; j++) {
                const float x0 = xb[j] * id;
                const float x1 = xb[j + 16] * id;
                const uint8_t xi0 = (uint8_t)MIN(15, (int8_t)(x0 + 8.5f));
                const uint8_t xi1 = (uint8_t)MIN(15, (int8_t)(x1 + 8.5f));
                y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
            }
        }
        return;
    }
    // quantize_row_q4_0_impl
    const float sigma2 = row_sigma2(x, n);
    float weight[32];
    int8_t L[32];
    for (int64_t ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        block_weights(xb, qw + 32 * ib, sigma2, weight);
        const float d = llmq_make_qx_quants(32, 8, xb, L, 1, weight);
        y[ib].d = llmq_f32_to_f16(d);
        for (int j = 0; j < 16; j++) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

// ============================================================================ Q4_1

void llmq_enc_q4_1(const float *x, void *vy, int64_t n, const float *qw) {
    struct llmq_block_q4_1 *y = vy;
    const int64_t nb = n / LLMQ_QK4_1;
    if (!qw) { // quantize_row_q4_1_ref
        for (int64_t i = 0; i < nb; i++) {
            const float *xb = x + i * LLMQ_QK4_1;
            float min = FLT_MAX, max = -FLT_MAX;
            for (int j = 0; j < LLMQ_QK4_1; j++) {
                if (xb[j] < min) min = xb[j];
                if (xb[j] > max) max = xb[j];
            }
            const float d = (max - min) / ((1 << 4) - 1);
            const float id = d ? 1.0f / d : 0.0f;
            y[i].d = llmq_f32_to_f16(d);
            y[i].m = llmq_f32_to_f16(min);
            for (int j = 0; j < 16; j++) {
                const float x0 = (xb[j] - min) * id;
                const float x1 = (xb[j + 16] - min) * id;
                const uint8_t xi0 = (uint8_t)MIN(15, (int8_t)(x0 + 0.5f));
                const uint8_t xi1 = (uint8_t)MIN(15, (int8_t)(x1 + 0.5f));
                y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
            }
        }
        return;
    }
    // quantize_row_q4_1_impl
    const float sigma2 = row_sigma2(x, n);
    float weight[32];
    uint8_t L[32], Laux[32];
    for (int64_t ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        block_weights(xb, qw + 32 * ib, sigma2, weight);
        float min;
        const float d = llmq_make_qkx3_quants(32, 15, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, 0);
        y[ib].d = llmq_f32_to_f16(d);
        y[ib].m = llmq_f32_to_f16(-min);
        for (int j = 0; j < 16; j++) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
    }
}

// ============================================================================ Q5_0

void llmq_enc_q5_0(const float *x, void *vy, int64_t n, const float *qw) {
    struct llmq_block_q5_0 *y = vy;
    const int64_t nb = n / LLMQ_QK5_0;
    uint8_t q[32];
    if (!qw) { // quantize_row_q5_0_ref
        for (int64_t i = 0; i < nb; i++) {
            const float *xb = x + i * LLMQ_QK5_0;
            const float max = block_absmax_signed(xb, LLMQ_QK5_0);
            const float d = max / -16;
            const float id = d ? 1.0f / d : 0.0f;
            y[i].d = llmq_f32_to_f16(d);
            for (int j = 0; j < 32; j++) q[j] = (uint8_t)MIN(31, (int8_t)(xb[j] * id + 16.5f));
            pack_q5(q, y[i].qs, y[i].qh);
        }
        return;
    }
    // quantize_row_q5_0_impl
    const float sigma2 = row_sigma2(x, n);
    float weight[32];
    int8_t L[32];
    for (int64_t ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        block_weights(xb, qw + 32 * ib, sigma2, weight);
        const float d = llmq_make_qx_quants(32, 16, xb, L, 1, weight);
        y[ib].d = llmq_f32_to_f16(d);
        for (int j = 0; j < 32; j++) q[j] = (uint8_t)L[j];
        pack_q5(q, y[ib].qs, y[ib].qh);
    }
}

// ============================================================================ Q5_1

void llmq_enc_q5_1(const float *x, void *vy, int64_t n, const float *qw) {
    struct llmq_block_q5_1 *y = vy;
    const int64_t nb = n / LLMQ_QK5_1;
    uint8_t q[32];
    if (!qw) { // quantize_row_q5_1_ref
        for (int64_t i = 0; i < nb; i++) {
            const float *xb = x + i * LLMQ_QK5_1;
            float min = FLT_MAX, max = -FLT_MAX;
            for (int j = 0; j < LLMQ_QK5_1; j++) {
                if (xb[j] < min) min = xb[j];
                if (xb[j] > max) max = xb[j];
            }
            const float d = (max - min) / ((1 << 5) - 1);
            const float id = d ? 1.0f / d : 0.0f;
            y[i].d = llmq_f32_to_f16(d);
            y[i].m = llmq_f32_to_f16(min);
            for (int j = 0; j < 32; j++) q[j] = (uint8_t)((xb[j] - min) * id + 0.5f); // no clamp, as ggml
            pack_q5(q, y[i].qs, y[i].qh);
        }
        return;
    }
    // quantize_row_q5_1_impl
    const float sigma2 = row_sigma2(x, n);
    float weight[32];
    uint8_t L[32], Laux[32];
    for (int64_t ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        block_weights(xb, qw + 32 * ib, sigma2, weight);
        float min;
        const float d = llmq_make_qkx3_quants(32, 31, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, 0);
        y[ib].d = llmq_f32_to_f16(d);
        y[ib].m = llmq_f32_to_f16(-min);
        pack_q5(L, y[ib].qs, y[ib].qh);
    }
}

// ============================================================================ Q8_0

void llmq_enc_q8_0(const float *x, void *vy, int64_t n, const float *qw) {
    (void)qw; // ggml's quantize_q8_0 ignores the imatrix
    struct llmq_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / LLMQ_QK8_0; i++) {
        const float *xb = x + i * LLMQ_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < LLMQ_QK8_0; j++) {
            const float a = fabsf(xb[j]);
            amax = amax > a ? amax : a; // ggml MAX(amax, fabsf(v))
        }
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = llmq_f32_to_f16(d);
        for (int j = 0; j < LLMQ_QK8_0; j++) y[i].qs[j] = (int8_t)roundf(xb[j] * id);
    }
}

// ============================================================================ grids
// value = A * L[code] + B. For the symmetric types B = -0.0f: x + (-0.0f) == x for every x,
// zeros of either sign included, so A * L[code] + B has the very bits of the decoder's q * d.

static const float levels_q4_0[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
static const float levels_q4_1[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const float levels_q5_0[32] = {-16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1,
                                      0,   1,   2,   3,   4,   5,   6,   7,  8,  9,  10, 11, 12, 13, 14, 15};
static const float levels_q5_1[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                      16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
#define R16(b)                                                                                                         \
    (b), (b) + 1, (b) + 2, (b) + 3, (b) + 4, (b) + 5, (b) + 6, (b) + 7, (b) + 8, (b) + 9, (b) + 10, (b) + 11,          \
        (b) + 12, (b) + 13, (b) + 14, (b) + 15
static const float levels_q8_0[256] = {R16(-128), R16(-112), R16(-96), R16(-80), R16(-64), R16(-48),
                                       R16(-32),  R16(-16),  R16(0),   R16(16),  R16(32),  R16(48),
                                       R16(64),   R16(80),   R16(96),  R16(112)};
#undef R16

void llmq_grid_legacy(int type, const void *block, int j, struct llmq_gguf_grid *g) {
    switch ((enum llmq_dtype)type) {
    case LLMQ_DTYPE_Q4_0: {
        const struct llmq_block_q4_0 *b = block;
        *g = (struct llmq_gguf_grid){llmq_f16_to_f32(b->d), -0.0f, 16, levels_q4_0};
        return;
    }
    case LLMQ_DTYPE_Q4_1: {
        const struct llmq_block_q4_1 *b = block;
        *g = (struct llmq_gguf_grid){llmq_f16_to_f32(b->d), llmq_f16_to_f32(b->m), 16, levels_q4_1};
        return;
    }
    case LLMQ_DTYPE_Q5_0: {
        const struct llmq_block_q5_0 *b = block;
        *g = (struct llmq_gguf_grid){llmq_f16_to_f32(b->d), -0.0f, 32, levels_q5_0};
        return;
    }
    case LLMQ_DTYPE_Q5_1: {
        const struct llmq_block_q5_1 *b = block;
        *g = (struct llmq_gguf_grid){llmq_f16_to_f32(b->d), llmq_f16_to_f32(b->m), 32, levels_q5_1};
        return;
    }
    case LLMQ_DTYPE_Q8_0: {
        const struct llmq_block_q8_0 *b = block;
        *g = (struct llmq_gguf_grid){llmq_f16_to_f32(b->d), -0.0f, 256, levels_q8_0};
        return;
    }
    default: break;
    }
    (void)j; // every element of a legacy block shares its grid
    LLMQ_ASSERT(!"llmq_grid_legacy: not a legacy block type");
}

// Nibble j of a 32-element block: low nibble of qs[j] for j < 16, high nibble of qs[j - 16] else.
static void set_nibble(uint8_t *qs, int j, int v) {
    if (j < 16)
        qs[j] = (uint8_t)((qs[j] & 0xF0) | (v & 0x0F));
    else
        qs[j - 16] = (uint8_t)((qs[j - 16] & 0x0F) | ((v & 0x0F) << 4));
}

static void set_q5(uint8_t *qs, uint8_t *qh, int j, int code) {
    set_nibble(qs, j, code);
    uint8_t *byte = &qh[j / 8]; // qh is a little-endian u32: bit j lives in byte j / 8
    *byte = (uint8_t)((*byte & ~(1u << (j % 8))) | (((unsigned)code >> 4 & 1u) << (j % 8)));
}

void llmq_setq_legacy(int type, void *block, int j, int code) {
    switch ((enum llmq_dtype)type) {
    case LLMQ_DTYPE_Q4_0: set_nibble(((struct llmq_block_q4_0 *)block)->qs, j, code); return;
    case LLMQ_DTYPE_Q4_1: set_nibble(((struct llmq_block_q4_1 *)block)->qs, j, code); return;
    case LLMQ_DTYPE_Q5_0: {
        struct llmq_block_q5_0 *b = block;
        set_q5(b->qs, b->qh, j, code);
        return;
    }
    case LLMQ_DTYPE_Q5_1: {
        struct llmq_block_q5_1 *b = block;
        set_q5(b->qs, b->qh, j, code);
        return;
    }
    case LLMQ_DTYPE_Q8_0: ((struct llmq_block_q8_0 *)block)->qs[j] = (int8_t)(code - 128); return;
    default: break;
    }
    LLMQ_ASSERT(!"llmq_setq_legacy: not a legacy block type");
}
