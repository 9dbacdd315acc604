/*
 * formats/ggml/encode_k.c — encoders and grids of the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
 * (see formats/ggml/encode.h for the contracts, formats/ggml/quants.h for the block layouts).
 *
 * Encoders: llmq_enc_qX_k(x, y, n, qw) mirrors ggml-quants.c (llama.cpp as vendored by
 * llama-cpp-python 0.3.36): qw == NULL is quantize_row_qX_K_ref (what ggml_quantize_chunk runs
 * without an imatrix), qw != NULL is the weighted quantize_row_qX_K_impl. Each block is built in a
 * local struct and copied out, so y needs no alignment. Legend: n elements of the row (a multiple
 * of 256), nb = n / 256 super-blocks, x (n) f32, y nb blocks, qw (n) importance of the row's
 * columns. Every float operation is in ggml's order (compiled with -ffp-contract=off).
 *
 * Grids: element e (0..255) of a block decodes as formats/ggml/decode.c does it to A*L[code]+B:
 *   Q2_K  A = d*(sc&15),      B = -(dmin*(sc>>4)),  L = 0..3      (sub-block e/16)
 *   Q3_K  A = d*(sc6-32),     B = -0,               L = -4..3     (code = 2 low bits | hmask bit<<2)
 *   Q4_K  A = d*sc,           B = -(dmin*m),        L = 0..15     (sub-block e/32)
 *   Q5_K  A = d*sc,           B = -(dmin*m),        L = 0..31     (code = nibble | qh bit<<4)
 *   Q6_K  A = d*sc,           B = -0,               L = -32..31   (code = 4 low | 2 high bits<<4)
 * B = -0.0f where the decoder has no offset: x + (-0) == x for every x (also -0), so the value
 * equals the decoder's product bit for bit; x + (-y) == x - y, so the offsets match as well.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/dtype.h"
#include "common/status.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/encode_impl.h"
#include "formats/ggml/quants.h"

#define QK_K LLMQ_QK_K
#define GROUP_MAX_EPS 1e-15f
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static inline uint16_t f2h(float f) { return llmq_f32_to_f16(f); }
static inline float h2f(uint16_t h) { return llmq_f16_to_f32(h); }

// ggml's get_scale_min_k4: 6-bit scale and min j (0..7) of a Q4_K / Q5_K block.
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

// Pack 6-bit scale ls and min lm of sub-block j (0..7) into the 12 scale bytes of Q4_K / Q5_K.
static inline void put_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t *scales) {
    if (j < 4) {
        scales[j] = ls;
        scales[j + 4] = lm;
    } else {
        scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
        scales[j - 0] |= (uint8_t)((lm >> 4) << 6);
    }
}

// 2-bit quants L (256, each 0..3) into qs[64]: element 128h + 32j + l at bits 2j of qs[32h + l].
static inline void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// 6-bit signed scale j (0..15, stored + 32 in l, 0..63) into the 12 scale bytes of Q3_K
// (which start zeroed).
static inline void put_scale_q3_k(int j, int l, uint8_t *scales) {
    if (j < 8)
        scales[j] = (uint8_t)(l & 0xF);
    else
        scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
    l >>= 4;
    scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
}

// The 6-bit scale j of a Q3_K block minus 32, as ggml's quantizer reads it back (int8_t).
static inline int8_t get_scale_q3_k(int j, const uint8_t *scales) {
    int8_t sc = (int8_t)(j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4);
    return (int8_t)((sc | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
}

// ============================================================================ Q2_K

static void q2_k_ref(const float *x, struct llmq_block_q2_k *y) {
    uint8_t L[QK_K];
    uint8_t Laux[16];
    float weights[16];
    float mins[QK_K / 16];
    float scales[QK_K / 16];
    const float q4scale = 15.f;

    float max_scale = 0; // as the min is deducted, scales are always positive
    float max_min = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
        for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = llmq_make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
        float scale = scales[j];
        if (scale > max_scale) max_scale = scale;
        float min = mins[j];
        if (min > max_min) max_min = min;
    }

    if (max_scale > 0) {
        float iscale = q4scale / max_scale;
        for (int j = 0; j < QK_K / 16; ++j) y->scales[j] = (uint8_t)llmq_nearest_int(iscale * scales[j]);
        y->d = f2h(max_scale / q4scale);
    } else {
        for (int j = 0; j < QK_K / 16; ++j) y->scales[j] = 0;
        y->d = f2h(0.f);
    }
    if (max_min > 0) {
        float iscale = q4scale / max_min;
        for (int j = 0; j < QK_K / 16; ++j) {
            int l = llmq_nearest_int(iscale * mins[j]);
            y->scales[j] |= (uint8_t)((unsigned)l << 4); // ggml shifts the int (UB when negative); same bits
        }
        y->dmin = f2h(max_min / q4scale);
    } else {
        y->dmin = f2h(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = h2f(y->d) * (y->scales[j] & 0xF);
        if (!d) continue;
        const float dm = h2f(y->dmin) * (y->scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            int l = llmq_nearest_int((x[16 * j + ii] + dm) / d);
            l = MAX(0, MIN(3, l));
            L[16 * j + ii] = (uint8_t)l;
        }
    }
    pack_2bit(L, y->qs);
}

static void q2_k_impl(const float *x, struct llmq_block_q2_k *y, const float *qw) {
    uint8_t L[QK_K];
    uint8_t Laux[16];
    float mins[QK_K / 16];
    float scales[QK_K / 16];
    float sw[QK_K / 16];
    float weight[16];
    uint8_t Ls[QK_K / 16], Lm[QK_K / 16];

    memset(sw, 0, sizeof sw);
    float sumx2 = 0;
    for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
    float sigma2 = sumx2 / QK_K;
    for (int j = 0; j < QK_K / 16; ++j) {
        const float *w = qw + 16 * j;
        for (int l = 0; l < 16; ++l) weight[l] = w[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
        for (int l = 0; l < QK_K / 16; ++l) sw[j] += weight[l];
        scales[j] = llmq_make_qkx3_quants(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
    }

    float dm = llmq_make_qp_quants(QK_K / 16, 15, scales, Ls, sw);
    float mm = llmq_make_qp_quants(QK_K / 16, 15, mins, Lm, sw);
    y->d = f2h(dm);
    y->dmin = f2h(mm);
    dm = h2f(y->d);
    mm = h2f(y->dmin);
    for (int j = 0; j < QK_K / 16; ++j) y->scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));

    for (int j = 0; j < QK_K / 16; ++j) { // ggml's requantize (always on)
        const float d = dm * (y->scales[j] & 0xF);
        if (!d) continue;
        const float m = mm * (y->scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            int l = llmq_nearest_int((x[16 * j + ii] + m) / d);
            l = MAX(0, MIN(3, l));
            L[16 * j + ii] = (uint8_t)l;
        }
    }
    pack_2bit(L, y->qs);
}

void llmq_enc_q2_k(const float *x, void *y, int64_t n, const float *qw) {
    uint8_t *out = y;
    for (int64_t i = 0; i < n / QK_K; i++) {
        struct llmq_block_q2_k b;
        memset(&b, 0, sizeof b);
        if (qw)
            q2_k_impl(x + QK_K * i, &b, qw + QK_K * i);
        else
            q2_k_ref(x + QK_K * i, &b);
        memcpy(out + (size_t)i * sizeof b, &b, sizeof b);
    }
}

// ============================================================================ Q3_K

// Requantize with the stored scales, then pack L (256, 0..7) into hmask (bit 2) and qs (bits 0..1).
static void q3_k_finish(const float *x, int8_t *L, struct llmq_block_q3_k *y) {
    for (int j = 0; j < QK_K / 16; ++j) {
        int8_t sc = get_scale_q3_k(j, y->scales);
        float d = h2f(y->d) * sc;
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = llmq_nearest_int(x[16 * j + ii] / d);
            l = MAX(-4, MIN(3, l));
            L[16 * j + ii] = (int8_t)(l + 4);
        }
    }

    memset(y->hmask, 0, QK_K / 8);
    // the high bit of the 1st 32 quants goes to bit 0, of the next 32 to bit 1, etc.
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; ++j) {
        if (L[j] > 3) {
            y->hmask[m] |= hm;
            L[j] = (int8_t)(L[j] - 4);
        }
        if (++m == QK_K / 8) {
            m = 0;
            hm = (uint8_t)(hm << 1);
        }
    }
    pack_2bit((const uint8_t *)L, y->qs);
}

static void q3_k_ref(const float *x, struct llmq_block_q3_k *y) {
    int8_t L[QK_K];
    float scales[QK_K / 16];

    float max_scale = 0;
    float amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
        scales[j] = llmq_make_q3_quants(16, 4, x + 16 * j, L + 16 * j, 1);
        float scale = fabsf(scales[j]);
        if (scale > amax) {
            amax = scale;
            max_scale = scales[j];
        }
    }

    memset(y->scales, 0, 12);
    if (max_scale) {
        float iscale = -32.f / max_scale;
        for (int j = 0; j < QK_K / 16; ++j) {
            int8_t l = (int8_t)llmq_nearest_int(iscale * scales[j]);
            l = (int8_t)(MAX(-32, MIN(31, l)) + 32);
            put_scale_q3_k(j, l, y->scales);
        }
        y->d = f2h(1 / iscale);
    } else {
        y->d = f2h(0.f);
    }
    q3_k_finish(x, L, y);
}

static void q3_k_impl(const float *x, struct llmq_block_q3_k *y, const float *qw) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float weight[16];
    float sw[QK_K / 16];
    int8_t Ls[QK_K / 16];

    float sumx2 = 0;
    for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
    float sigma2 = 2 * sumx2 / QK_K;

    for (int j = 0; j < QK_K / 16; ++j) {
        const float *w = qw + 16 * j;
        for (int l = 0; l < 16; ++l) weight[l] = w[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
        float sumw = 0;
        for (int l = 0; l < 16; ++l) sumw += weight[l];
        sw[j] = sumw;
        scales[j] = llmq_make_qx_quants(16, 4, x + 16 * j, L + 16 * j, 1, weight);
    }

    memset(y->scales, 0, 12);
    float d_block = llmq_make_qx_quants(QK_K / 16, 32, scales, Ls, 1, sw);
    for (int j = 0; j < QK_K / 16; ++j) put_scale_q3_k(j, Ls[j], y->scales);
    y->d = f2h(d_block);
    q3_k_finish(x, L, y);
}

void llmq_enc_q3_k(const float *x, void *y, int64_t n, const float *qw) {
    uint8_t *out = y;
    for (int64_t i = 0; i < n / QK_K; i++) {
        struct llmq_block_q3_k b;
        memset(&b, 0, sizeof b);
        if (qw)
            q3_k_impl(x + QK_K * i, &b, qw + QK_K * i);
        else
            q3_k_ref(x + QK_K * i, &b);
        memcpy(out + (size_t)i * sizeof b, &b, sizeof b);
    }
}

// ============================================================================ Q4_K / Q5_K

// Requantize elements with the stored scales/mins: L (256) in 0..nmax.
static void q45_k_requant(const float *x, uint16_t dh, uint16_t dminh, const uint8_t *scales, int nmax, uint8_t *L) {
    uint8_t sc, m;
    for (int j = 0; j < QK_K / 32; ++j) {
        get_scale_min_k4(j, scales, &sc, &m);
        const float d = h2f(dh) * sc;
        if (!d) continue;
        const float dm = h2f(dminh) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = llmq_nearest_int((x[32 * j + ii] + dm) / d);
            l = MAX(0, MIN(nmax, l));
            L[32 * j + ii] = (uint8_t)l;
        }
    }
}

// The reference (no importance) search of Q4_K (nmax 15) and Q5_K (nmax 31): scales, mins and
// super-block d / dmin into scales12, *dh, *dminh, then the requantized L.
static void q45_k_ref_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *scales12, uint16_t *dh,
                             uint16_t *dminh, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32];
    float mins[QK_K / 32];
    float scales[QK_K / 32];

    float max_scale = 0; // as the min is deducted, scales are always positive
    float max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] =
            llmq_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
        float scale = scales[j];
        if (scale > max_scale) max_scale = scale;
        float min = mins[j];
        if (min > max_min) max_min = min;
    }

    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)llmq_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)llmq_nearest_int(inv_min * mins[j]);
        ls = MIN(63, ls);
        lm = MIN(63, lm);
        put_scale_min_k4(j, ls, lm, scales12);
    }
    *dh = f2h(max_scale / 63.f);
    *dminh = f2h(max_min / 63.f);
    q45_k_requant(x, *dh, *dminh, scales12, nmax, L);
}

// The importance-weighted search of Q4_K / Q5_K (quantize_row_q{4,5}_K_impl); clamp63: Q5_K
// clamps the 6-bit scales to 63 before packing, Q4_K does not.
static void q45_k_impl_scales(const float *x, const float *qw, int nmax, int clamp63, uint8_t *scales12, uint16_t *dh,
                              uint16_t *dminh, uint8_t *L) {
    uint8_t Laux[32];
    uint8_t Ls[QK_K / 32];
    uint8_t Lm[QK_K / 32];
    float weights[32];
    float sw[QK_K / 32];
    float mins[QK_K / 32];
    float scales[QK_K / 32];

    float sum_x2 = 0;
    for (int l = 0; l < QK_K; ++l) sum_x2 += x[l] * x[l];
    float sigma2 = 2 * sum_x2 / QK_K;

    for (int j = 0; j < QK_K / 32; ++j) {
        const float *w = qw + 32 * j;
        for (int l = 0; l < 32; ++l) weights[l] = w[l] * sqrtf(sigma2 + x[32 * j + l] * x[32 * j + l]);
        float sumw = 0;
        for (int l = 0; l < 32; ++l) sumw += weights[l];
        sw[j] = sumw;
        scales[j] =
            llmq_make_qkx3_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
    }

    float d_block = llmq_make_qp_quants(QK_K / 32, 63, scales, Ls, sw);
    float m_block = llmq_make_qp_quants(QK_K / 32, 63, mins, Lm, sw);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = Ls[j];
        uint8_t lm = Lm[j];
        if (clamp63) {
            ls = MIN(63, ls);
            lm = MIN(63, lm);
        }
        put_scale_min_k4(j, ls, lm, scales12);
    }
    *dh = f2h(d_block);
    *dminh = f2h(m_block);
    q45_k_requant(x, *dh, *dminh, scales12, nmax, L);
}

void llmq_enc_q4_k(const float *x, void *y, int64_t n, const float *qw) {
    uint8_t *out = y;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        struct llmq_block_q4_k b;
        memset(&b, 0, sizeof b);
        const float *xb = x + QK_K * i;
        if (qw)
            q45_k_impl_scales(xb, qw + QK_K * i, 15, 0, b.scales, &b.d, &b.dmin, L);
        else
            q45_k_ref_scales(xb, 15, -1.f, 20, b.scales, &b.d, &b.dmin, L);
        uint8_t *q = b.qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        memcpy(out + (size_t)i * sizeof b, &b, sizeof b);
    }
}

void llmq_enc_q5_k(const float *x, void *y, int64_t n, const float *qw) {
    uint8_t *out = y;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        struct llmq_block_q5_k b;
        memset(&b, 0, sizeof b);
        const float *xb = x + QK_K * i;
        if (qw)
            q45_k_impl_scales(xb, qw + QK_K * i, 31, 1, b.scales, &b.d, &b.dmin, L);
        else
            q45_k_ref_scales(xb, 31, -0.5f, 15, b.scales, &b.d, &b.dmin, L);
        uint8_t *qh = b.qh;
        uint8_t *ql = b.qs;
        uint8_t m1 = 1, m2 = 2;
        for (int nn = 0; nn < QK_K; nn += 64) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[nn + j];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                int l2 = L[nn + j + 32];
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
            ql += 32;
        }
        memcpy(out + (size_t)i * sizeof b, &b, sizeof b);
    }
}

// ============================================================================ Q6_K

// quantize_row_q6_K_ref is quantize_row_q6_K_impl with quant_weights == NULL, so one function.
static void q6_k_block(const float *x, struct llmq_block_q6_k *y, const float *qw) {
    int8_t L[QK_K];
    float scales[QK_K / 16];

    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
        const float scale = llmq_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, qw ? qw + 16 * ib : NULL);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }

    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, sizeof *y);
        y->d = f2h(0.f);
        return;
    }

    float iscale = -128.f / max_scale;
    y->d = f2h(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) y->scales[ib] = (int8_t)MIN(127, llmq_nearest_int(iscale * scales[ib]));

    for (int j = 0; j < QK_K / 16; ++j) {
        float d = h2f(y->d) * y->scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = llmq_nearest_int(x[16 * j + ii] / d);
            l = MAX(-32, MIN(31, l));
            L[16 * j + ii] = (int8_t)(l + 32);
        }
    }

    uint8_t *ql = y->ql;
    uint8_t *qh = y->qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l + 0] & 0xF;
            const uint8_t q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF;
            const uint8_t q4 = L[j + l + 96] & 0xF;
            ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                              ((L[j + l + 96] >> 4) << 6));
        }
    }
}

void llmq_enc_q6_k(const float *x, void *y, int64_t n, const float *qw) {
    uint8_t *out = y;
    for (int64_t i = 0; i < n / QK_K; i++) {
        struct llmq_block_q6_k b;
        memset(&b, 0, sizeof b);
        q6_k_block(x + QK_K * i, &b, qw ? qw + QK_K * i : NULL);
        memcpy(out + (size_t)i * sizeof b, &b, sizeof b);
    }
}

// ============================================================================ grids

static const float lv_0_3[4] = {0, 1, 2, 3};
static const float lv_m4_3[8] = {-4, -3, -2, -1, 0, 1, 2, 3};
static const float lv_0_15[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const float lv_0_31[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                  16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
static const float lv_m32_31[64] = {-32, -31, -30, -29, -28, -27, -26, -25, -24, -23, -22, -21, -20, -19, -18, -17,
                                    -16, -15, -14, -13, -12, -11, -10, -9,  -8,  -7,  -6,  -5,  -4,  -3,  -2,  -1,
                                    0,   1,   2,   3,   4,   5,   6,   7,   8,   9,   10,  11,  12,  13,  14,  15,
                                    16,  17,  18,  19,  20,  21,  22,  23,  24,  25,  26,  27,  28,  29,  30,  31};

// f16 field at byte offset off of a block (any alignment).
static inline float rd_half(const uint8_t *b, size_t off) {
    uint16_t h;
    memcpy(&h, b + off, sizeof h);
    return llmq_f16_to_f32(h);
}

void llmq_grid_k(int type, const void *block, int j, struct llmq_gguf_grid *g) {
    const uint8_t *b = block;
    LLMQ_ASSERT(j >= 0 && j < QK_K);
    switch (type) {
    case LLMQ_DTYPE_Q2_K: {
        const uint8_t sc = b[offsetof(struct llmq_block_q2_k, scales) + j / 16];
        const float d = rd_half(b, offsetof(struct llmq_block_q2_k, d));
        const float min = rd_half(b, offsetof(struct llmq_block_q2_k, dmin));
        g->A = d * (sc & 0xF);
        g->B = -(min * (sc >> 4));
        g->n_levels = 4;
        g->L = lv_0_3;
        break;
    }
    case LLMQ_DTYPE_Q3_K: {
        const float d_all = rd_half(b, offsetof(struct llmq_block_q3_k, d));
        const uint8_t *s = b + offsetof(struct llmq_block_q3_k, scales);
        const int s16 = j / 16;
        const int sc =
            (s16 < 8 ? (s[s16] & 0xF) : (s[s16 - 8] >> 4)) | (((s[8 + s16 % 4] >> (2 * (s16 / 4))) & 3) << 4);
        g->A = d_all * (sc - 32);
        g->B = -0.0f;
        g->n_levels = 8;
        g->L = lv_m4_3;
        break;
    }
    case LLMQ_DTYPE_Q4_K:
    case LLMQ_DTYPE_Q5_K: {
        // Q4_K and Q5_K share the d, dmin, scales[12] prefix
        _Static_assert(offsetof(struct llmq_block_q4_k, scales) == offsetof(struct llmq_block_q5_k, scales),
                       "q4_k/q5_k prefix");
        const float d = rd_half(b, offsetof(struct llmq_block_q4_k, d));
        const float min = rd_half(b, offsetof(struct llmq_block_q4_k, dmin));
        uint8_t sc, m;
        get_scale_min_k4(j / 32, b + offsetof(struct llmq_block_q4_k, scales), &sc, &m);
        g->A = d * sc;
        g->B = -(min * m);
        g->n_levels = type == LLMQ_DTYPE_Q4_K ? 16 : 32;
        g->L = type == LLMQ_DTYPE_Q4_K ? lv_0_15 : lv_0_31;
        break;
    }
    case LLMQ_DTYPE_Q6_K: {
        const float d = rd_half(b, offsetof(struct llmq_block_q6_k, d));
        const int8_t sc = (int8_t)b[offsetof(struct llmq_block_q6_k, scales) + j / 16];
        g->A = d * sc;
        g->B = -0.0f;
        g->n_levels = 64;
        g->L = lv_m32_31;
        break;
    }
    default: LLMQ_ASSERT(!"llmq_grid_k: not a k-quant type");
    }
}

// Element j = 128h + 32jj + l (l 0..31) of a 2-bit-plane layout (Q2_K, Q3_K, Q6_K's high bits).
static inline void split_128(int j, int *h, int *jj, int *l) {
    *h = j / 128;
    *jj = (j % 128) / 32;
    *l = j % 32;
}

void llmq_setq_k(int type, void *block, int j, int code) {
    uint8_t *b = block;
    LLMQ_ASSERT(j >= 0 && j < QK_K);
    switch (type) {
    case LLMQ_DTYPE_Q2_K: {
        LLMQ_ASSERT(code >= 0 && code < 4);
        int h, jj, l;
        split_128(j, &h, &jj, &l);
        uint8_t *q = b + offsetof(struct llmq_block_q2_k, qs) + 32 * h + l;
        *q = (uint8_t)((*q & ~(3u << (2 * jj))) | ((unsigned)code << (2 * jj)));
        break;
    }
    case LLMQ_DTYPE_Q3_K: {
        LLMQ_ASSERT(code >= 0 && code < 8);
        int h, jj, l;
        split_128(j, &h, &jj, &l);
        uint8_t *q = b + offsetof(struct llmq_block_q3_k, qs) + 32 * h + l;
        *q = (uint8_t)((*q & ~(3u << (2 * jj))) | ((unsigned)(code & 3) << (2 * jj)));
        uint8_t *hm = b + offsetof(struct llmq_block_q3_k, hmask) + l;
        const unsigned bit = 1u << (4 * h + jj);
        *hm = (uint8_t)(code & 4 ? (*hm | bit) : (*hm & ~bit));
        break;
    }
    case LLMQ_DTYPE_Q4_K: {
        LLMQ_ASSERT(code >= 0 && code < 16);
        const int k = j / 64, hi = (j % 64) / 32, l = j % 32;
        uint8_t *q = b + offsetof(struct llmq_block_q4_k, qs) + 32 * k + l;
        *q = (uint8_t)(hi ? ((*q & 0x0F) | (code << 4)) : ((*q & 0xF0) | code));
        break;
    }
    case LLMQ_DTYPE_Q5_K: {
        LLMQ_ASSERT(code >= 0 && code < 32);
        const int k = j / 64, hi = (j % 64) / 32, l = j % 32;
        uint8_t *q = b + offsetof(struct llmq_block_q5_k, qs) + 32 * k + l;
        const int nib = code & 0xF;
        *q = (uint8_t)(hi ? ((*q & 0x0F) | (nib << 4)) : ((*q & 0xF0) | nib));
        uint8_t *qh = b + offsetof(struct llmq_block_q5_k, qh) + l;
        const unsigned bit = 1u << (j / 32);
        *qh = (uint8_t)(code & 16 ? (*qh | bit) : (*qh & ~bit));
        break;
    }
    case LLMQ_DTYPE_Q6_K: {
        LLMQ_ASSERT(code >= 0 && code < 64);
        int h, jj, l;
        split_128(j, &h, &jj, &l);
        // low 4 bits: ql[64h + l + 32(jj&1)], low nibble for jj < 2, high nibble for jj >= 2
        uint8_t *q = b + offsetof(struct llmq_block_q6_k, ql) + 64 * h + l + 32 * (jj & 1);
        const int nib = code & 0xF;
        *q = (uint8_t)(jj >= 2 ? ((*q & 0x0F) | (nib << 4)) : ((*q & 0xF0) | nib));
        uint8_t *qh = b + offsetof(struct llmq_block_q6_k, qh) + 32 * h + l;
        *qh = (uint8_t)((*qh & ~(3u << (2 * jj))) | ((unsigned)(code >> 4) << (2 * jj)));
        break;
    }
    default: LLMQ_ASSERT(!"llmq_setq_k: not a k-quant type");
    }
}
