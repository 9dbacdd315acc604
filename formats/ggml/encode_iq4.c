// formats/ggml/encode_iq4.c — encoders and grids of IQ4_NL (32-element blocks) and IQ4_XS (256-element
// super-blocks of 8 x 32), the 4-bit non-linear types whose 16 levels are kvalues_iq4nl (see
// formats/ggml/encode.h, formats/ggml/encode_impl.h).
//
// Both encoders are ggml's quantize_row_iq4_nl_impl as quantize_iq4_nl / quantize_iq4_xs call it
// (ggml_quantize_chunk, i.e. what llama-quantize writes): ntry = 7 trial scales around -max/-127
// per 32-element block, weights x^2 without importance and qw * sqrt(sigma2 + x^2) with it
// (sigma2 = 2 * mean(x^2) over the super-block). IQ4_XS then quantizes the 8 block scales to
// 6 bits against the super-block scale -max_scale/32 and re-picks every element's level.
// (ggml's quantize_row_iq4_nl_ref, ntry = -1, is not what any file writer uses; not mirrored.)
// Every float expression is ggml's, in ggml's order (compiled with -ffp-contract=off).
#include "formats/ggml/encode.h"
#include "formats/ggml/encode_impl.h"

#include <math.h>
#include <string.h>

#include "formats/ggml/quants.h"

#define GROUP_MAX_EPS 1e-15f
#define NTRY 7

// ggml's best_index_int8: the index of the level nearest to x (values ascending; ties go up,
// except x exactly halfway below the midpoint rule `x - v[mu-1] < v[mu] - x`).
static inline int best_index_int8(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav])
            mu = mav;
        else
            ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// quantize_row_iq4_nl_impl for one super-block of `sbs` elements (32: IQ4_NL, 256: IQ4_XS) in
// blocks of 32. dh: the f16 scale; q4: sbs / 2 nibble bytes; scales_h / scales_l: IQ4_XS only.
// qw: NULL or (sbs) importance.
static void iq4_superblock(int sbs, const float *x, uint16_t *dh, uint8_t *q4, uint16_t *scales_h, uint8_t *scales_l,
                           const float *qw) {
    const int8_t *values = llmq_kvalues_iq4nl;
    const int bs = 32, nb = sbs / bs;
    float scales[LLMQ_QK_K / 32]; // (nb)
    float weight[32];
    uint8_t L[LLMQ_QK_K]; // (sbs)

    float sigma2 = 0;
    for (int j = 0; j < sbs; j++) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / sbs;

    memset(q4, 0, (size_t)sbs / 2);
    *dh = llmq_f32_to_f16(0.f);

    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nb; ib++) {
        const float *xb = x + ib * bs;
        uint8_t *Lb = L + ib * bs;
        if (qw) {
            const float *qwb = qw + ib * bs;
            for (int j = 0; j < bs; j++) weight[j] = qwb[j] * sqrtf(sigma2 + xb[j] * xb[j]);
        } else {
            for (int j = 0; j < bs; j++) weight[j] = xb[j] * xb[j];
        }
        float amax = 0, max = 0;
        for (int j = 0; j < bs; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0]; // ntry > 0
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < bs; j++) {
            const float al = id * xb[j];
            const int l = best_index_int8(16, values, al);
            Lb[j] = (uint8_t)l;
            const float q = values[l];
            const float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -NTRY; itry <= NTRY; itry++) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < bs; j++) {
                const float al = id * xb[j];
                const int l = best_index_int8(16, values, al);
                const float q = values[l];
                const float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }

    if (nb > 1) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = llmq_f32_to_f16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < nb; ib++) {
            int l = llmq_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            uint8_t *Lb = L + ib * bs;
            const float *xb = x + ib * bs;
            for (int j = 0; j < bs; j++) Lb[j] = (uint8_t)best_index_int8(16, values, idl * xb[j]);
            l += 32;
            const uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0)
                scales_l[ib / 2] = l_l;
            else
                scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        *dh = llmq_f32_to_f16(scales[0]);
        const float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < sbs; j++) L[j] = (uint8_t)best_index_int8(16, values, id * x[j]);
    }

    for (int i = 0; i < sbs / 32; i++)
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

void llmq_enc_iq4_nl(const float *x, void *vy, int64_t n, const float *qw) {
    struct llmq_block_iq4_nl *y = vy;
    for (int64_t ib = 0; ib < n / LLMQ_QK4_NL; ib++) {
        uint16_t unused_h;
        iq4_superblock(LLMQ_QK4_NL, x + LLMQ_QK4_NL * ib, &y[ib].d, y[ib].qs, &unused_h, NULL,
                       qw ? qw + LLMQ_QK4_NL * ib : NULL);
    }
}

void llmq_enc_iq4_xs(const float *x, void *vy, int64_t n, const float *qw) {
    struct llmq_block_iq4_xs *y = vy;
    for (int64_t ib = 0; ib < n / LLMQ_QK_K; ib++) {
        uint16_t scales_h; // the struct member may be unaligned for a pointer: go through a local
        iq4_superblock(LLMQ_QK_K, x + LLMQ_QK_K * ib, &y[ib].d, y[ib].qs, &scales_h, y[ib].scales_l,
                       qw ? qw + LLMQ_QK_K * ib : NULL);
        y[ib].scales_h = scales_h;
    }
}

// ============================================================================ grids
// value = A * kvalues_iq4nl[code] + B with A = d (IQ4_NL) or d * (ls - 32) (IQ4_XS, block j / 32),
// B = -0.0f (x + -0.0f == x for every x, so the sum has the decoder's bits). kvalues_iq4nl is
// ascending, so the levels are its values in order and the code is the stored nibble.

static const float levels_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static int iq4_xs_scale(const struct llmq_block_iq4_xs *b, int ib) {
    return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4);
}

void llmq_grid_iq4(int type, const void *block, int j, struct llmq_gguf_grid *g) {
    if (type == LLMQ_DTYPE_IQ4_NL) {
        const struct llmq_block_iq4_nl *b = block;
        *g = (struct llmq_gguf_grid){llmq_f16_to_f32(b->d), -0.0f, 16, levels_iq4};
        return;
    }
    LLMQ_ASSERT(type == LLMQ_DTYPE_IQ4_XS);
    const struct llmq_block_iq4_xs *b = block;
    const float dl = llmq_f16_to_f32(b->d) * (iq4_xs_scale(b, j / 32) - 32);
    *g = (struct llmq_gguf_grid){dl, -0.0f, 16, levels_iq4};
}

void llmq_setq_iq4(int type, void *block, int j, int code) {
    uint8_t *qs;
    if (type == LLMQ_DTYPE_IQ4_NL) {
        qs = ((struct llmq_block_iq4_nl *)block)->qs;
    } else {
        LLMQ_ASSERT(type == LLMQ_DTYPE_IQ4_XS);
        qs = ((struct llmq_block_iq4_xs *)block)->qs + 16 * (j / 32);
        j %= 32;
    }
    if (j < 16)
        qs[j] = (uint8_t)((qs[j] & 0xF0) | (code & 0x0F));
    else
        qs[j - 16] = (uint8_t)((qs[j - 16] & 0x0F) | ((code & 0x0F) << 4));
}
