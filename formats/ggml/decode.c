// formats/ggml/decode.c — decoders for ggml block types, bit-identical to ggml-quants.c.
//
// Two decoders per type: `ref_*` follows ggml's dequantize_row_* loop for loop (the oracle), and
// `fast_*` evaluates the very same f32 expression per element — same operands, same order, one
// rounding per operation — in loops shaped for the auto-vectorizer: restrict pointers, the
// sub-block scales computed once into small arrays, constant shifts and bit masks per loop, and a
// staged int32 array where a 32-wide float loop vectorizes better than two 16-wide ones (GCC fully
// unrolls the latter and then fails to SLP-vectorize them). The outputs are equal bit for bit
// (tests/unit/test_ggml_quants.c); bench/dequant_speed.sh measures both.
// This file is compiled with -ffp-contract=off (top-level CMakeLists.txt): a fused multiply-add
// would round once instead of twice and break the bit-exactness with ggml and gguf-py.
#include "formats/ggml/quants.h"

#include <stdalign.h>
#include <string.h>

#ifdef __FAST_MATH__
#error "formats/ggml/decode.c must not be built with -ffast-math (bit-exact decoding)"
#endif

const int8_t llmq_kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

// f16 -> f32 with selects instead of branches, so that row loops vectorize. Exact for every input
// (the same bits as llmq_f16_to_f32, NaN payloads included).
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;                                   // exponent and mantissa
    uint32_t norm = (em << 13) + (112u << 23);                         // rebias 15 -> 127
    norm += (uint32_t) - (int32_t)(em >= 0x7c00u) & (112u << 23);      // inf / nan: exponent 255
    const uint32_t sub = llmq_f32_bits((float)(int32_t)em * 0x1p-24f); // zero / subnormal, exact
    const uint32_t is_sub = (uint32_t) - (int32_t)(em < 0x0400u);
    return llmq_bits_f32(sign | (sub & is_sub) | (norm & ~is_sub));
}

// ggml's get_scale_min_k4: 6-bit scale and min j (0..7) of a Q4_K / Q5_K block.
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// 6-bit scale j (0..15) of a Q3_K block, still biased by 32.
static inline int scale_q3_k(int j, const uint8_t *s) {
    int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | (hi << 4);
}

// ============================================================================ plain types

static void ref_f32(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * sizeof(float)); }

static void ref_f64(const void *src, float *y, int64_t n) {
    const double *x = src; // (n)
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
}

static void ref_f16(const void *src, float *y, int64_t n) {
    const uint16_t *x = src; // (n)
    for (int64_t i = 0; i < n; i++) y[i] = llmq_f16_to_f32(x[i]);
}

static void ref_bf16(const void *src, float *y, int64_t n) {
    const uint16_t *x = src; // (n)
    for (int64_t i = 0; i < n; i++) y[i] = llmq_bf16_to_f32(x[i]);
}

void llmq_f16_to_f32_row(const uint16_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = half_to_float(src[i]);
}

void llmq_bf16_to_f32_row(const uint16_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

void llmq_f32_to_f16_row(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = llmq_f32_to_f16(src[i]);
}

void llmq_f32_to_bf16_row(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = llmq_f32_to_bf16(src[i]);
}

static void fast_f16(const void *src, float *y, int64_t n) { llmq_f16_to_f32_row(src, y, n); }
static void fast_bf16(const void *src, float *y, int64_t n) { llmq_bf16_to_f32_row(src, y, n); }

static void enc_f32(const float *x, void *dst, int64_t n, const float *importance) {
    (void)importance;
    memcpy(dst, x, (size_t)n * sizeof(float));
}
static void enc_f16(const float *x, void *dst, int64_t n, const float *importance) {
    (void)importance;
    llmq_f32_to_f16_row(x, dst, n);
}
static void enc_bf16(const float *x, void *dst, int64_t n, const float *importance) {
    (void)importance;
    llmq_f32_to_bf16_row(x, dst, n);
}

// ============================================================================ legacy 32-blocks
// ggml: y = x0*d (Q4_0, Q5_0, Q8_0) and y = x0*d + m (Q4_1, Q5_1), x0 an int converted to f32.

static void ref_q4_0(const void *src, float *y, int64_t n) {
    const struct llmq_block_q4_0 *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK4_0; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        for (int j = 0; j < LLMQ_QK4_0 / 2; j++) {
            const int x0 = (x[i].qs[j] & 0x0F) - 8;
            const int x1 = (x[i].qs[j] >> 4) - 8;
            y[i * LLMQ_QK4_0 + j] = x0 * d;
            y[i * LLMQ_QK4_0 + j + LLMQ_QK4_0 / 2] = x1 * d;
        }
    }
}

static void ref_q4_1(const void *src, float *y, int64_t n) {
    const struct llmq_block_q4_1 *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK4_1; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        const float m = llmq_f16_to_f32(x[i].m);
        for (int j = 0; j < LLMQ_QK4_1 / 2; j++) {
            const int x0 = x[i].qs[j] & 0x0F;
            const int x1 = x[i].qs[j] >> 4;
            y[i * LLMQ_QK4_1 + j] = x0 * d + m;
            y[i * LLMQ_QK4_1 + j + LLMQ_QK4_1 / 2] = x1 * d + m;
        }
    }
}

static void ref_q5_0(const void *src, float *y, int64_t n) {
    const struct llmq_block_q5_0 *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK5_0; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < LLMQ_QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            const int x0 = ((x[i].qs[j] & 0x0F) | h0) - 16;
            const int x1 = ((x[i].qs[j] >> 4) | h1) - 16;
            y[i * LLMQ_QK5_0 + j] = x0 * d;
            y[i * LLMQ_QK5_0 + j + LLMQ_QK5_0 / 2] = x1 * d;
        }
    }
}

static void ref_q5_1(const void *src, float *y, int64_t n) {
    const struct llmq_block_q5_1 *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK5_1; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        const float m = llmq_f16_to_f32(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < LLMQ_QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            const int x0 = (x[i].qs[j] & 0x0F) | h0;
            const int x1 = (x[i].qs[j] >> 4) | h1;
            y[i * LLMQ_QK5_1 + j] = x0 * d + m;
            y[i * LLMQ_QK5_1 + j + LLMQ_QK5_1 / 2] = x1 * d + m;
        }
    }
}

static void ref_q8_0(const void *src, float *y, int64_t n) {
    const struct llmq_block_q8_0 *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK8_0; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        for (int j = 0; j < LLMQ_QK8_0; j++) y[i * LLMQ_QK8_0 + j] = x[i].qs[j] * d;
    }
}

static void ref_iq4_nl(const void *src, float *y, int64_t n) {
    const struct llmq_block_iq4_nl *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK4_NL; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        for (int j = 0; j < LLMQ_QK4_NL / 2; j++) {
            y[i * LLMQ_QK4_NL + j] = d * llmq_kvalues_iq4nl[x[i].qs[j] & 0xF];
            y[i * LLMQ_QK4_NL + j + LLMQ_QK4_NL / 2] = d * llmq_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

// Fast versions: `restrict` pointers (no aliasing checks), constant shifts and masks per loop, so
// that each inner loop vectorizes; the per-element expression is the one ggml evaluates.

// bit_u32[j] = 1 << j: "bit j of qh" as a mask test, which vectorizes (a variable shift does not
// on baseline x86-64).
#define BITS4(k) 1u << (k), 1u << ((k) + 1), 1u << ((k) + 2), 1u << ((k) + 3)
static const uint32_t bit_u32[32] = {BITS4(0),  BITS4(4),  BITS4(8),  BITS4(12),
                                     BITS4(16), BITS4(20), BITS4(24), BITS4(28)};
#undef BITS4

static void fast_q4_0(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q4_0 *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK4_0; i++, y += LLMQ_QK4_0) {
        const float d = half_to_float(x[i].d);
        int32_t q[LLMQ_QK4_0]; // staged: a 32-wide float loop vectorizes better than two 16-wide
        for (int j = 0; j < 16; j++) {
            q[j] = (x[i].qs[j] & 0x0F) - 8;
            q[j + 16] = (x[i].qs[j] >> 4) - 8;
        }
        for (int j = 0; j < LLMQ_QK4_0; j++) y[j] = (float)q[j] * d;
    }
}

static void fast_q4_1(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q4_1 *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK4_1; i++, y += LLMQ_QK4_1) {
        const float d = half_to_float(x[i].d);
        const float m = half_to_float(x[i].m);
        int32_t q[LLMQ_QK4_1];
        for (int j = 0; j < 16; j++) {
            q[j] = x[i].qs[j] & 0x0F;
            q[j + 16] = x[i].qs[j] >> 4;
        }
        for (int j = 0; j < LLMQ_QK4_1; j++) y[j] = (float)q[j] * d + m;
    }
}

static void fast_q5_0(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q5_0 *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK5_0; i++, y += LLMQ_QK5_0) {
        const float d = half_to_float(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = (qh & bit_u32[j]) ? 16 : 0;
            const int h1 = (qh & bit_u32[j + 16]) ? 16 : 0;
            y[j] = (float)(((x[i].qs[j] & 0x0F) | h0) - 16) * d;
            y[j + 16] = (float)(((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

static void fast_q5_1(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q5_1 *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK5_1; i++, y += LLMQ_QK5_1) {
        const float d = half_to_float(x[i].d);
        const float m = half_to_float(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = (qh & bit_u32[j]) ? 16 : 0;
            const int h1 = (qh & bit_u32[j + 16]) ? 16 : 0;
            y[j] = (float)((x[i].qs[j] & 0x0F) | h0) * d + m;
            y[j + 16] = (float)((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

static void fast_q8_0(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q8_0 *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK8_0; i++, y += LLMQ_QK8_0) {
        const float d = half_to_float(x[i].d);
        for (int j = 0; j < LLMQ_QK8_0; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

static void fast_iq4_nl(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_iq4_nl *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK4_NL; i++, y += LLMQ_QK4_NL) {
        const float d = half_to_float(x[i].d);
        float tab[16]; // d * level: the very product ggml forms per element
        for (int k = 0; k < 16; k++) tab[k] = d * (float)llmq_kvalues_iq4nl[k];
        for (int j = 0; j < 16; j++) {
            y[j] = tab[x[i].qs[j] & 0xF];
            y[j + 16] = tab[x[i].qs[j] >> 4];
        }
    }
}

// ============================================================================ k-quants

static void ref_q2_k(const void *src, float *y, int64_t n) {
    const struct llmq_block_q2_k *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        const float min = llmq_f16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int j = 0; j < 4; j++) {
                const int shift = 2 * j;
                for (int part = 0; part < 2; part++) { // two sub-blocks of 16 per (half, j)
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (sc & 0xF);
                    const float ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16 * part] >> shift) & 3) - ml;
                }
            }
        }
    }
}

static void fast_q2_k(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q2_k *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d = half_to_float(x[i].d);
        const float min = half_to_float(x[i].dmin);
        float dl[16], ml[16]; // per sub-block of 16
        for (int s = 0; s < 16; s++) {
            dl[s] = d * (float)(x[i].scales[s] & 0xF);
            ml[s] = min * (float)(x[i].scales[s] >> 4);
        }
        for (int half = 0; half < 2; half++) {
            const uint8_t *restrict q = x[i].qs + 32 * half;
            for (int j = 0; j < 4; j++, y += 32) {
                const int sh = 2 * j, s = 8 * half + 2 * j;
                for (int l = 0; l < 16; l++) y[l] = dl[s] * (float)((q[l] >> sh) & 3) - ml[s];
                for (int l = 16; l < 32; l++) y[l] = dl[s + 1] * (float)((q[l] >> sh) & 3) - ml[s + 1];
            }
        }
    }
}

static void ref_q3_k(const void *src, float *y, int64_t n) {
    const struct llmq_block_q3_k *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d_all = llmq_f16_to_f32(x[i].d);
        const uint8_t *q = x[i].qs;
        const uint8_t *hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int j = 0; j < 4; j++, m = (uint8_t)(m << 1)) {
                const int shift = 2 * j;
                for (int part = 0; part < 2; part++) {
                    const float dl = d_all * (scale_q3_k(is++, x[i].scales) - 32);
                    for (int l = 16 * part; l < 16 * part + 16; l++)
                        *y++ = dl * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
            }
        }
    }
}

static void fast_q3_k(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q3_k *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d_all = half_to_float(x[i].d);
        float dl[16];
        for (int s = 0; s < 16; s++) dl[s] = d_all * (float)(scale_q3_k(s, x[i].scales) - 32);
        const uint8_t *restrict hm = x[i].hmask;
        for (int half = 0; half < 2; half++) {
            const uint8_t *restrict q = x[i].qs + 32 * half;
            for (int j = 0; j < 4; j++, y += 32) {
                const int sh = 2 * j, s = 8 * half + 2 * j;
                const uint8_t m = (uint8_t)(1u << (4 * half + j));
                int32_t v[32]; // staged quants of this group of 32
                for (int l = 0; l < 32; l++) v[l] = ((q[l] >> sh) & 3) - ((hm[l] & m) ? 0 : 4);
                for (int l = 0; l < 16; l++) y[l] = dl[s] * (float)v[l];
                for (int l = 0; l < 16; l++) y[l + 16] = dl[s + 1] * (float)v[l + 16];
            }
        }
    }
}

static void ref_q4_k(const void *src, float *y, int64_t n) {
    const struct llmq_block_q4_k *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = llmq_f16_to_f32(x[i].d);
        const float min = llmq_f16_to_f32(x[i].dmin);
        uint8_t sc, m;
        for (int is = 0; is < 8; is += 2, q += 32) {
            scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void fast_q4_k(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q4_k *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d = half_to_float(x[i].d);
        const float min = half_to_float(x[i].dmin);
        for (int k = 0; k < 4; k++, y += 64) {
            const uint8_t *restrict q = x[i].qs + 32 * k;
            uint8_t sc, m;
            scale_min_k4(2 * k, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(2 * k + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void ref_q5_k(const void *src, float *y, int64_t n) {
    const struct llmq_block_q5_k *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const uint8_t *ql = x[i].qs;
        const uint8_t *qh = x[i].qh;
        const float d = llmq_f16_to_f32(x[i].d);
        const float min = llmq_f16_to_f32(x[i].dmin);
        uint8_t sc, m;
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32, u1 = (uint8_t)(u1 << 2), u2 = (uint8_t)(u2 << 2)) {
            scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

static void fast_q5_k(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q5_k *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d = half_to_float(x[i].d);
        const float min = half_to_float(x[i].dmin);
        const uint8_t *restrict qh = x[i].qh;
        for (int k = 0; k < 4; k++, y += 64) {
            const uint8_t *restrict q = x[i].qs + 32 * k;
            const uint8_t u1 = (uint8_t)(1u << (2 * k)), u2 = (uint8_t)(2u << (2 * k));
            uint8_t sc, m;
            scale_min_k4(2 * k, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(2 * k + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)((q[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)((q[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

static void ref_q6_k(const void *src, float *y, int64_t n) {
    const struct llmq_block_q6_k *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d = llmq_f16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

static void fast_q6_k(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_q6_k *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d = half_to_float(x[i].d);
        float dl[16];
        for (int s = 0; s < 16; s++) dl[s] = d * (float)x[i].scales[s];
        for (int half = 0; half < 2; half++, y += 128) {
            const uint8_t *restrict ql = x[i].ql + 64 * half;
            const uint8_t *restrict qh = x[i].qh + 32 * half;
            const float *dh = dl + 8 * half;
            // element 32j + l of this half: sub-block 2j + l/16
            for (int p = 0; p < 32; p += 16) {
                const int s = p / 16;
                for (int l = p; l < p + 16; l++) y[l] = dh[s] * (float)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                for (int l = p; l < p + 16; l++)
                    y[l + 32] = dh[s + 2] * (float)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                for (int l = p; l < p + 16; l++)
                    y[l + 64] = dh[s + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                for (int l = p; l < p + 16; l++)
                    y[l + 96] = dh[s + 6] * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
    }
}

static inline int scale_iq4_xs(const struct llmq_block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}

static void ref_iq4_xs(const void *src, float *y, int64_t n) {
    const struct llmq_block_iq4_xs *x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const uint8_t *qs = x[i].qs;
        const float d = llmq_f16_to_f32(x[i].d);
        for (int ib = 0; ib < LLMQ_QK_K / 32; ib++, y += 32, qs += 16) {
            const float dl = d * (scale_iq4_xs(&x[i], ib) - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * llmq_kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * llmq_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

static void fast_iq4_xs(const void *src, float *restrict y, int64_t n) {
    const struct llmq_block_iq4_xs *restrict x = src;
    for (int64_t i = 0; i < n / LLMQ_QK_K; i++) {
        const float d = half_to_float(x[i].d);
        for (int ib = 0; ib < LLMQ_QK_K / 32; ib++, y += 32) {
            const uint8_t *restrict qs = x[i].qs + 16 * ib;
            const float dl = d * (float)(scale_iq4_xs(&x[i], ib) - 32);
            float tab[16];
            for (int k = 0; k < 16; k++) tab[k] = dl * (float)llmq_kvalues_iq4nl[k];
            for (int j = 0; j < 16; j++) {
                y[j] = tab[qs[j] & 0xF];
                y[j + 16] = tab[qs[j] >> 4];
            }
        }
    }
}

// ============================================================================ traits + dispatch

static const struct llmq_quant_traits quant_traits[LLMQ_DTYPE_COUNT] = {
    [LLMQ_DTYPE_F32] = {LLMQ_DTYPE_F32, ref_f32, ref_f32, enc_f32},
    [LLMQ_DTYPE_F16] = {LLMQ_DTYPE_F16, fast_f16, ref_f16, enc_f16},
    [LLMQ_DTYPE_BF16] = {LLMQ_DTYPE_BF16, fast_bf16, ref_bf16, enc_bf16},
    [LLMQ_DTYPE_F64] = {LLMQ_DTYPE_F64, ref_f64, ref_f64, NULL},
    [LLMQ_DTYPE_I64] = {LLMQ_DTYPE_I64, NULL, NULL, NULL},
    [LLMQ_DTYPE_I32] = {LLMQ_DTYPE_I32, NULL, NULL, NULL},
    [LLMQ_DTYPE_I16] = {LLMQ_DTYPE_I16, NULL, NULL, NULL},
    [LLMQ_DTYPE_I8] = {LLMQ_DTYPE_I8, NULL, NULL, NULL},
    [LLMQ_DTYPE_U8] = {LLMQ_DTYPE_U8, NULL, NULL, NULL},
    [LLMQ_DTYPE_BOOL] = {LLMQ_DTYPE_BOOL, NULL, NULL, NULL},
    [LLMQ_DTYPE_Q4_0] = {LLMQ_DTYPE_Q4_0, fast_q4_0, ref_q4_0, NULL},
    [LLMQ_DTYPE_Q4_1] = {LLMQ_DTYPE_Q4_1, fast_q4_1, ref_q4_1, NULL},
    [LLMQ_DTYPE_Q5_0] = {LLMQ_DTYPE_Q5_0, fast_q5_0, ref_q5_0, NULL},
    [LLMQ_DTYPE_Q5_1] = {LLMQ_DTYPE_Q5_1, fast_q5_1, ref_q5_1, NULL},
    [LLMQ_DTYPE_Q8_0] = {LLMQ_DTYPE_Q8_0, fast_q8_0, ref_q8_0, NULL},
    [LLMQ_DTYPE_Q8_1] = {LLMQ_DTYPE_Q8_1, NULL, NULL, NULL},
    [LLMQ_DTYPE_Q2_K] = {LLMQ_DTYPE_Q2_K, fast_q2_k, ref_q2_k, NULL},
    [LLMQ_DTYPE_Q3_K] = {LLMQ_DTYPE_Q3_K, fast_q3_k, ref_q3_k, NULL},
    [LLMQ_DTYPE_Q4_K] = {LLMQ_DTYPE_Q4_K, fast_q4_k, ref_q4_k, NULL},
    [LLMQ_DTYPE_Q5_K] = {LLMQ_DTYPE_Q5_K, fast_q5_k, ref_q5_k, NULL},
    [LLMQ_DTYPE_Q6_K] = {LLMQ_DTYPE_Q6_K, fast_q6_k, ref_q6_k, NULL},
    [LLMQ_DTYPE_Q8_K] = {LLMQ_DTYPE_Q8_K, NULL, NULL, NULL},
    [LLMQ_DTYPE_IQ2_XXS] = {LLMQ_DTYPE_IQ2_XXS, NULL, NULL, NULL},
    [LLMQ_DTYPE_IQ2_XS] = {LLMQ_DTYPE_IQ2_XS, NULL, NULL, NULL},
    [LLMQ_DTYPE_IQ3_XXS] = {LLMQ_DTYPE_IQ3_XXS, NULL, NULL, NULL},
    [LLMQ_DTYPE_IQ1_S] = {LLMQ_DTYPE_IQ1_S, NULL, NULL, NULL},
    [LLMQ_DTYPE_IQ4_NL] = {LLMQ_DTYPE_IQ4_NL, fast_iq4_nl, ref_iq4_nl, NULL},
    [LLMQ_DTYPE_IQ3_S] = {LLMQ_DTYPE_IQ3_S, NULL, NULL, NULL},
    [LLMQ_DTYPE_IQ2_S] = {LLMQ_DTYPE_IQ2_S, NULL, NULL, NULL},
    [LLMQ_DTYPE_IQ4_XS] = {LLMQ_DTYPE_IQ4_XS, fast_iq4_xs, ref_iq4_xs, NULL},
    [LLMQ_DTYPE_IQ1_M] = {LLMQ_DTYPE_IQ1_M, NULL, NULL, NULL},
    [LLMQ_DTYPE_TQ1_0] = {LLMQ_DTYPE_TQ1_0, NULL, NULL, NULL},
    [LLMQ_DTYPE_TQ2_0] = {LLMQ_DTYPE_TQ2_0, NULL, NULL, NULL},
    [LLMQ_DTYPE_MXFP4] = {LLMQ_DTYPE_MXFP4, NULL, NULL, NULL},
};

const struct llmq_quant_traits *llmq_quant_traits(enum llmq_dtype t) {
    if ((int)t < 0 || t >= LLMQ_DTYPE_COUNT) return NULL;
    return &quant_traits[t];
}

// The largest alignment any decoder needs from src (F64 reads doubles).
#define SRC_ALIGN 8

static enum llmq_status dequantize(enum llmq_dtype t, const void *src, float *dst, int64_t n, bool ref) {
    const struct llmq_dtype_traits *dt = llmq_dtype_traits(t);
    if (!dt) return llmq_errorf(LLMQ_ERR_ARG, "dequantize: dtype %d out of range", (int)t);
    const struct llmq_quant_traits *qt = &quant_traits[t];
    llmq_to_float_fn fn = ref ? qt->to_float_ref : qt->to_float;
    if (!fn) return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "dequantize: no f32 decoder for %s", dt->name);
    if (n < 0 || n % dt->blck != 0)
        return llmq_errorf(LLMQ_ERR_ARG, "dequantize %s: %lld elements is not a multiple of the block size %lld",
                           dt->name, (long long)n, (long long)dt->blck);
    if (n == 0) return LLMQ_OK;
    if (!src || !dst) return llmq_errorf(LLMQ_ERR_ARG, "dequantize %s: NULL buffer", dt->name);

    if (((uintptr_t)src & (SRC_ALIGN - 1)) == 0) {
        fn(src, dst, n);
        return LLMQ_OK;
    }
    // Unaligned source (a block inside a byte stream): decode through an aligned bounce buffer,
    // since reading the block structs in place would be undefined behaviour.
    alignas(SRC_ALIGN) unsigned char bounce[4096];
    const int64_t per = (int64_t)(sizeof bounce / dt->size); // whole blocks per chunk (>= 1)
    const unsigned char *s = src;
    for (int64_t b = 0, nb = n / dt->blck; b < nb; b += per) {
        const int64_t k = nb - b < per ? nb - b : per;
        memcpy(bounce, s + b * (int64_t)dt->size, (size_t)(k * (int64_t)dt->size));
        fn(bounce, dst + b * dt->blck, k * dt->blck);
    }
    return LLMQ_OK;
}

enum llmq_status llmq_dequantize_row(enum llmq_dtype t, const void *src, float *dst, int64_t n) {
    return dequantize(t, src, dst, n, false);
}

enum llmq_status llmq_dequantize_row_ref(enum llmq_dtype t, const void *src, float *dst, int64_t n) {
    return dequantize(t, src, dst, n, true);
}
