// common/dtype.c — the dtype traits table and half-precision conversions.
#include "common/dtype.h"

#include <string.h>
#include <strings.h>

// Block sizes and byte sizes mirror ggml-common.h (checked against gguf-py's GGML_QUANT_SIZES in
// tests/py/test_dtype_table.py). `can_dequant` lists the types formats/ggml/decode.c decodes.
static const struct llmq_dtype_traits traits[LLMQ_DTYPE_COUNT] = {
    [LLMQ_DTYPE_F32] = {"f32", "F32", 0, 1, 4, false, true},
    [LLMQ_DTYPE_F16] = {"f16", "F16", 1, 1, 2, false, true},
    [LLMQ_DTYPE_BF16] = {"bf16", "BF16", 30, 1, 2, false, true},
    [LLMQ_DTYPE_F64] = {"f64", "F64", 28, 1, 8, false, true},
    [LLMQ_DTYPE_I64] = {"i64", "I64", 27, 1, 8, false, false},
    [LLMQ_DTYPE_I32] = {"i32", "I32", 26, 1, 4, false, false},
    [LLMQ_DTYPE_I16] = {"i16", "I16", 25, 1, 2, false, false},
    [LLMQ_DTYPE_I8] = {"i8", "I8", 24, 1, 1, false, false},
    [LLMQ_DTYPE_U8] = {"u8", "U8", -1, 1, 1, false, false},
    [LLMQ_DTYPE_BOOL] = {"bool", "BOOL", -1, 1, 1, false, false},
    [LLMQ_DTYPE_Q4_0] = {"q4_0", NULL, 2, 32, 18, true, true},
    [LLMQ_DTYPE_Q4_1] = {"q4_1", NULL, 3, 32, 20, true, true},
    [LLMQ_DTYPE_Q5_0] = {"q5_0", NULL, 6, 32, 22, true, true},
    [LLMQ_DTYPE_Q5_1] = {"q5_1", NULL, 7, 32, 24, true, true},
    [LLMQ_DTYPE_Q8_0] = {"q8_0", NULL, 8, 32, 34, true, true},
    [LLMQ_DTYPE_Q8_1] = {"q8_1", NULL, 9, 32, 36, true, false},
    [LLMQ_DTYPE_Q2_K] = {"q2_k", NULL, 10, 256, 84, true, true},
    [LLMQ_DTYPE_Q3_K] = {"q3_k", NULL, 11, 256, 110, true, true},
    [LLMQ_DTYPE_Q4_K] = {"q4_k", NULL, 12, 256, 144, true, true},
    [LLMQ_DTYPE_Q5_K] = {"q5_k", NULL, 13, 256, 176, true, true},
    [LLMQ_DTYPE_Q6_K] = {"q6_k", NULL, 14, 256, 210, true, true},
    [LLMQ_DTYPE_Q8_K] = {"q8_k", NULL, 15, 256, 292, true, false},
    [LLMQ_DTYPE_IQ2_XXS] = {"iq2_xxs", NULL, 16, 256, 66, true, false},
    [LLMQ_DTYPE_IQ2_XS] = {"iq2_xs", NULL, 17, 256, 74, true, false},
    [LLMQ_DTYPE_IQ3_XXS] = {"iq3_xxs", NULL, 18, 256, 98, true, false},
    [LLMQ_DTYPE_IQ1_S] = {"iq1_s", NULL, 19, 256, 50, true, false},
    [LLMQ_DTYPE_IQ4_NL] = {"iq4_nl", NULL, 20, 32, 18, true, true},
    [LLMQ_DTYPE_IQ3_S] = {"iq3_s", NULL, 21, 256, 110, true, false},
    [LLMQ_DTYPE_IQ2_S] = {"iq2_s", NULL, 22, 256, 82, true, false},
    [LLMQ_DTYPE_IQ4_XS] = {"iq4_xs", NULL, 23, 256, 136, true, true},
    [LLMQ_DTYPE_IQ1_M] = {"iq1_m", NULL, 29, 256, 56, true, false},
    [LLMQ_DTYPE_TQ1_0] = {"tq1_0", NULL, 34, 256, 54, true, false},
    [LLMQ_DTYPE_TQ2_0] = {"tq2_0", NULL, 35, 256, 66, true, false},
    [LLMQ_DTYPE_MXFP4] = {"mxfp4", NULL, 39, 32, 17, true, false},
};

const struct llmq_dtype_traits *llmq_dtype_traits(enum llmq_dtype t) {
    if ((int)t < 0 || t >= LLMQ_DTYPE_COUNT) return NULL;
    return &traits[t];
}

const char *llmq_dtype_name(enum llmq_dtype t) {
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(t);
    return tr ? tr->name : "?";
}

enum llmq_dtype llmq_dtype_from_ggml(uint32_t ggml_id) {
    for (int t = 0; t < LLMQ_DTYPE_COUNT; t++)
        if (traits[t].ggml_id >= 0 && (uint32_t)traits[t].ggml_id == ggml_id) return (enum llmq_dtype)t;
    return LLMQ_DTYPE_INVALID;
}

enum llmq_dtype llmq_dtype_from_st_name(const char *name) {
    for (int t = 0; t < LLMQ_DTYPE_COUNT; t++)
        if (traits[t].st_name && strcmp(traits[t].st_name, name) == 0) return (enum llmq_dtype)t;
    return LLMQ_DTYPE_INVALID;
}

enum llmq_dtype llmq_dtype_from_name(const char *name) {
    for (int t = 0; t < LLMQ_DTYPE_COUNT; t++)
        if (strcasecmp(traits[t].name, name) == 0) return (enum llmq_dtype)t;
    return LLMQ_DTYPE_INVALID;
}

bool llmq_dtype_nbytes(enum llmq_dtype t, int64_t n, size_t *out) {
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(t);
    int64_t bytes;
    if (!tr || n < 0 || n % tr->blck != 0) return false;
    if (!llmq_mul_i64(n / tr->blck, (int64_t)tr->size, &bytes)) return false;
    *out = (size_t)bytes;
    return true;
}

float llmq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return llmq_bits_f32(sign | 0x7f800000u | (man << 13)); // inf / nan
    if (exp == 0) {
        if (man == 0) return llmq_bits_f32(sign);
        // subnormal: value = man * 2^-24, exactly representable in f32
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return llmq_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t llmq_f32_to_f16(float f) {
    uint32_t x = llmq_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0); // inf / nan
    if (ax >= 0x477ff000u) return sign | 0x7c00;                                  // rounds to >= 65520: overflow to inf
    if (ax < 0x38800000u) { // below the smallest normal half: subnormal or 0
        // half subnormal step is 2^-24; round-to-nearest-even via float arithmetic
        float a = llmq_bits_f32(ax);
        float scaled = a * 16777216.0f; // a / 2^-24, exact (power of two)
        uint32_t m = (uint32_t)scaled;
        float frac = scaled - (float)m;
        if (frac > 0.5f || (frac == 0.5f && (m & 1))) m++;
        return sign | (uint16_t)m; // m may become 0x400: the smallest normal, still correct
    }
    uint32_t exp = (ax >> 23) - 112;
    uint32_t man = ax & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

float llmq_bf16_to_f32(uint16_t h) { return llmq_bits_f32((uint32_t)h << 16); }

uint16_t llmq_f32_to_bf16(float f) {
    uint32_t x = llmq_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); // quiet nan
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}
