/*
 * formats/ggml/encode_sse2.c — SSE2 fast paths of the legacy encoders without importance (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0): the same bytes as the reference encoders of formats/ggml/encode_legacy.c, which mirror ggml's
 * quantize_row_*_ref, four elements at a time.
 *
 * Why they are exact: every per-element step of the reference is an f32 multiply / add followed by a
 * truncating (int8_t) conversion or roundf, and SSE2 does the same IEEE single-precision operations; the
 * per-block scalars (the signed maximum, d, 1/d, the f16 scale) are computed by the same scalar code.
 * roundf (half away from zero) is built from truncation: t = trunc(v), then ±1 when |v - t| >= 0.5
 * (v - t is exact for |v| < 2^23). Blocks where SIMD min/max could differ from the reference's strict
 * first-wins comparisons — any non-finite value, or a zero extreme that might be -0.0 — and blocks whose
 * 1/d overflows (subnormal scales, where the reference casts ±inf / NaN to int8) are handed to
 * the reference encoder, so the bytes never depend on which path ran. tests/unit/test_gguf_enc.c and the
 * ggml oracle (tests/py/test_gguf_enc_oracle.py, which runs this path) check the equality.
 */
#include "formats/ggml/encode_impl.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/dtype.h"
#include "formats/ggml/quants.h"

#if defined(__SSE2__)
#include <emmintrin.h>

typedef void (*enc_fn)(const float *x, void *y, int64_t n, const float *qw);

// Loads one 32-element block into v[8]; returns false when a value is not finite.
static inline bool load32(const float *x, __m128 v[8]) {
    const __m128 inf = _mm_set1_ps(INFINITY);
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 bad = _mm_setzero_ps();
    for (int k = 0; k < 8; k++) {
        v[k] = _mm_loadu_ps(x + 4 * k);
        bad = _mm_or_ps(bad, _mm_cmpnlt_ps(_mm_and_ps(v[k], absmask), inf)); // |x| >= inf or NaN
    }
    return _mm_movemask_ps(bad) == 0;
}

static inline float hmax(__m128 a) {
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_max_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(a);
}
static inline float hmin(__m128 a) {
    a = _mm_min_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_min_ps(a, _mm_shuffle_ps(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(a);
}

// The reference's signed maximum: the first element of largest magnitude (0.0f when all are zero).
static inline float signed_absmax(const float *x, const __m128 v[8]) {
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 m = _mm_and_ps(v[0], absmask);
    for (int k = 1; k < 8; k++) m = _mm_max_ps(m, _mm_and_ps(v[k], absmask));
    const float amax = hmax(m);
    if (amax == 0.0f) return 0.0f;
    const __m128 a = _mm_set1_ps(amax);
    for (int k = 0; k < 8; k++) {
        int bits = _mm_movemask_ps(_mm_cmpeq_ps(_mm_and_ps(v[k], absmask), a));
        if (bits) return x[4 * k + __builtin_ctz((unsigned)bits)];
    }
    return 0.0f; // not reached
}

// q[0..32) = min(qmax, (int)(v * id + add)) for the 32 values (the reference's (int8_t) cast then MIN).
static inline void codes_trunc(const __m128 v[8], float id, float add, __m128 sub, int qmax, __m128i *lo, __m128i *hi) {
    const __m128 vid = _mm_set1_ps(id), vadd = _mm_set1_ps(add);
    __m128i t[8];
    for (int k = 0; k < 8; k++) t[k] = _mm_cvttps_epi32(_mm_add_ps(_mm_mul_ps(_mm_sub_ps(v[k], sub), vid), vadd));
    const __m128i mx = _mm_set1_epi16((short)qmax);
    __m128i a = _mm_min_epi16(_mm_packs_epi32(t[0], t[1]), mx), b = _mm_min_epi16(_mm_packs_epi32(t[2], t[3]), mx);
    __m128i c = _mm_min_epi16(_mm_packs_epi32(t[4], t[5]), mx), d = _mm_min_epi16(_mm_packs_epi32(t[6], t[7]), mx);
    *lo = _mm_packus_epi16(a, b); // elements 0..15
    *hi = _mm_packus_epi16(c, d); // elements 16..31
}

// Q4_0 / Q5_0 (sub = 0: the products are x * id exactly as the reference, x - 0 == x).
static void fast_sym(const float *x, void *vy, int64_t n, int bits) {
    const int64_t nb = n / 32;
    const float div = bits == 4 ? -8.0f : -16.0f, add = bits == 4 ? 8.5f : 16.5f;
    const int qmax = bits == 4 ? 15 : 31;
    __m128 v[8];
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + 32 * i;
        if (!load32(xb, v)) {
            if (bits == 4)
                llmq_enc_q4_0(xb, (struct llmq_block_q4_0 *)vy + i, 32, NULL);
            else
                llmq_enc_q5_0(xb, (struct llmq_block_q5_0 *)vy + i, 32, NULL);
            continue;
        }
        const float max = signed_absmax(xb, v);
        const float d = max / div;
        const float id = d ? 1.0f / d : 0.0f;
        if (!isfinite(id)) { // subnormal d: the reference's casts of ±inf / NaN are not portable, let it decide
            if (bits == 4)
                llmq_enc_q4_0(xb, (struct llmq_block_q4_0 *)vy + i, 32, NULL);
            else
                llmq_enc_q5_0(xb, (struct llmq_block_q5_0 *)vy + i, 32, NULL);
            continue;
        }
        __m128i lo, hi;
        codes_trunc(v, id, add, _mm_setzero_ps(), qmax, &lo, &hi);
        const __m128i nib = _mm_set1_epi8(0x0f);
        __m128i qs = _mm_or_si128(_mm_and_si128(lo, nib), _mm_slli_epi16(_mm_and_si128(hi, nib), 4));
        if (bits == 4) {
            struct llmq_block_q4_0 *y = (struct llmq_block_q4_0 *)vy + i;
            y->d = llmq_f32_to_f16(d);
            _mm_storeu_si128((__m128i *)y->qs, qs);
        } else {
            struct llmq_block_q5_0 *y = (struct llmq_block_q5_0 *)vy + i;
            y->d = llmq_f32_to_f16(d);
            uint32_t qh = (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(lo, 3)) |
                          (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(hi, 3)) << 16;
            memcpy(y->qh, &qh, 4);
            _mm_storeu_si128((__m128i *)y->qs, qs);
        }
    }
}

// Q4_1 / Q5_1: scale from the block's min and max.
static void fast_asym(const float *x, void *vy, int64_t n, int bits) {
    const int64_t nb = n / 32;
    const int qmax = bits == 4 ? 15 : 31;
    __m128 v[8];
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + 32 * i;
        bool ok = load32(xb, v);
        float mn = 0.0f, mx = 0.0f;
        if (ok) {
            __m128 a = v[0], b = v[0];
            for (int k = 1; k < 8; k++) a = _mm_min_ps(a, v[k]), b = _mm_max_ps(b, v[k]);
            mn = hmin(a), mx = hmax(b);
            ok = mn != 0.0f && mx != 0.0f; // a zero extreme may be -0.0 in one path and +0.0 in the other
        }
        if (!ok) {
            if (bits == 4)
                llmq_enc_q4_1(xb, (struct llmq_block_q4_1 *)vy + i, 32, NULL);
            else
                llmq_enc_q5_1(xb, (struct llmq_block_q5_1 *)vy + i, 32, NULL);
            continue;
        }
        const float d = (mx - mn) / (float)qmax;
        const float id = d ? 1.0f / d : 0.0f;
        if (!isfinite(id) || !isfinite(d)) {
            if (bits == 4)
                llmq_enc_q4_1(xb, (struct llmq_block_q4_1 *)vy + i, 32, NULL);
            else
                llmq_enc_q5_1(xb, (struct llmq_block_q5_1 *)vy + i, 32, NULL);
            continue;
        }
        __m128i lo, hi;
        // Q5_1's reference does not clamp ((uint8_t) of the sum; a 32 would keep its low 5 bits): neither do we
        codes_trunc(v, id, 0.5f, _mm_set1_ps(mn), bits == 4 ? 15 : 255, &lo, &hi);
        const __m128i nib = _mm_set1_epi8(0x0f);
        __m128i qs = _mm_or_si128(_mm_and_si128(lo, nib), _mm_slli_epi16(_mm_and_si128(hi, nib), 4));
        if (bits == 4) {
            struct llmq_block_q4_1 *y = (struct llmq_block_q4_1 *)vy + i;
            y->d = llmq_f32_to_f16(d);
            y->m = llmq_f32_to_f16(mn);
            _mm_storeu_si128((__m128i *)y->qs, qs);
        } else {
            struct llmq_block_q5_1 *y = (struct llmq_block_q5_1 *)vy + i;
            y->d = llmq_f32_to_f16(d);
            y->m = llmq_f32_to_f16(mn);
            uint32_t qh = (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(lo, 3)) |
                          (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(hi, 3)) << 16;
            memcpy(y->qh, &qh, 4);
            _mm_storeu_si128((__m128i *)y->qs, qs);
        }
    }
}

static void fast_q8_0(const float *x, void *vy, int64_t n, const float *qw) {
    (void)qw;
    const int64_t nb = n / 32;
    const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128 half = _mm_set1_ps(0.5f), mhalf = _mm_set1_ps(-0.5f);
    __m128 v[8];
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + 32 * i;
        struct llmq_block_q8_0 *y = (struct llmq_block_q8_0 *)vy + i;
        if (!load32(xb, v)) {
            llmq_enc_q8_0(xb, y, 32, NULL);
            continue;
        }
        __m128 m = _mm_and_ps(v[0], absmask);
        for (int k = 1; k < 8; k++) m = _mm_max_ps(m, _mm_and_ps(v[k], absmask));
        const float amax = hmax(m);
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        if (!isfinite(id)) {
            llmq_enc_q8_0(xb, y, 32, NULL);
            continue;
        }
        const __m128 vid = _mm_set1_ps(id);
        __m128i t[8];
        for (int k = 0; k < 8; k++) {
            __m128 p = _mm_mul_ps(v[k], vid);
            __m128i q = _mm_cvttps_epi32(p);
            __m128 f = _mm_sub_ps(p, _mm_cvtepi32_ps(q));                   // exact
            q = _mm_sub_epi32(q, _mm_castps_si128(_mm_cmpge_ps(f, half)));  // +1
            q = _mm_add_epi32(q, _mm_castps_si128(_mm_cmple_ps(f, mhalf))); // -1
            t[k] = q;
        }
        y->d = llmq_f32_to_f16(d);
        __m128i a = _mm_packs_epi16(_mm_packs_epi32(t[0], t[1]), _mm_packs_epi32(t[2], t[3]));
        __m128i b = _mm_packs_epi16(_mm_packs_epi32(t[4], t[5]), _mm_packs_epi32(t[6], t[7]));
        _mm_storeu_si128((__m128i *)y->qs, a);
        _mm_storeu_si128((__m128i *)(y->qs + 16), b);
    }
}

static void fast_q4_0(const float *x, void *y, int64_t n, const float *qw) { (void)qw, fast_sym(x, y, n, 4); }
static void fast_q5_0(const float *x, void *y, int64_t n, const float *qw) { (void)qw, fast_sym(x, y, n, 5); }
static void fast_q4_1(const float *x, void *y, int64_t n, const float *qw) { (void)qw, fast_asym(x, y, n, 4); }
static void fast_q5_1(const float *x, void *y, int64_t n, const float *qw) { (void)qw, fast_asym(x, y, n, 5); }

void (*llmq_enc_fast(int type))(const float *, void *, int64_t, const float *) {
    switch ((enum llmq_dtype)type) {
    case LLMQ_DTYPE_Q4_0: return fast_q4_0;
    case LLMQ_DTYPE_Q4_1: return fast_q4_1;
    case LLMQ_DTYPE_Q5_0: return fast_q5_0;
    case LLMQ_DTYPE_Q5_1: return fast_q5_1;
    case LLMQ_DTYPE_Q8_0: return fast_q8_0;
    default: return NULL;
    }
}

#else // no SSE2: the reference encoders are the fast path

void (*llmq_enc_fast(int type))(const float *, void *, int64_t, const float *) {
    (void)type;
    return NULL;
}

#endif
