// tests/unit/test_ggml_quants.c — block layouts, hand-computed blocks, fast == reference, errors.
// (The bit-exact comparison with ggml / gguf-py lives in tests/py/test_dequant_oracle.py.)
#include "harness.h"

#include "common/dtype.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/ggml/quants.h"

#include <math.h>
#include <stdalign.h>
#include <stdint.h>

#define F16_1 0x3c00    // 1.0
#define F16_HALF 0x3800 // 0.5
#define F16_QUARTER 0x3400
#define F16_2 0x4000
#define F16_M1 0xbc00 // -1.0

static float out[LLMQ_QK_K * 4];

static void decode(enum llmq_dtype t, const void *src, int64_t n) {
    CHECK_EQ_INT(llmq_dequantize_row(t, src, out, n), LLMQ_OK);
    // the reference decoder agrees on every hand-made block too
    static float ref[LLMQ_QK_K * 4];
    CHECK_EQ_INT(llmq_dequantize_row_ref(t, src, ref, n), LLMQ_OK);
    CHECK(memcmp(out, ref, (size_t)n * sizeof(float)) == 0);
}

static void test_layout(void) {
    static const struct {
        enum llmq_dtype t;
        size_t size;
    } blocks[] = {
        {LLMQ_DTYPE_Q4_0, sizeof(struct llmq_block_q4_0)},     {LLMQ_DTYPE_Q4_1, sizeof(struct llmq_block_q4_1)},
        {LLMQ_DTYPE_Q5_0, sizeof(struct llmq_block_q5_0)},     {LLMQ_DTYPE_Q5_1, sizeof(struct llmq_block_q5_1)},
        {LLMQ_DTYPE_Q8_0, sizeof(struct llmq_block_q8_0)},     {LLMQ_DTYPE_Q2_K, sizeof(struct llmq_block_q2_k)},
        {LLMQ_DTYPE_Q3_K, sizeof(struct llmq_block_q3_k)},     {LLMQ_DTYPE_Q4_K, sizeof(struct llmq_block_q4_k)},
        {LLMQ_DTYPE_Q5_K, sizeof(struct llmq_block_q5_k)},     {LLMQ_DTYPE_Q6_K, sizeof(struct llmq_block_q6_k)},
        {LLMQ_DTYPE_IQ4_NL, sizeof(struct llmq_block_iq4_nl)}, {LLMQ_DTYPE_IQ4_XS, sizeof(struct llmq_block_iq4_xs)},
    };
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        CHECK_EQ_INT(blocks[i].size, llmq_dtype_traits(blocks[i].t)->size);
    // field offsets that differ between plausible layouts
    CHECK_EQ_INT(offsetof(struct llmq_block_q2_k, d), 80);
    CHECK_EQ_INT(offsetof(struct llmq_block_q3_k, scales), 96);
    CHECK_EQ_INT(offsetof(struct llmq_block_q3_k, d), 108);
    CHECK_EQ_INT(offsetof(struct llmq_block_q5_k, qh), 16);
    CHECK_EQ_INT(offsetof(struct llmq_block_q6_k, scales), 192);
    CHECK_EQ_INT(offsetof(struct llmq_block_q6_k, d), 208);
    CHECK_EQ_INT(offsetof(struct llmq_block_iq4_xs, scales_l), 4);
    CHECK_EQ_INT(offsetof(struct llmq_block_q5_1, qh), 4);

    // the traits table: one entry per dtype, decoders exactly where the dtype table says so
    for (int t = 0; t < LLMQ_DTYPE_COUNT; t++) {
        const struct llmq_quant_traits *qt = llmq_quant_traits((enum llmq_dtype)t);
        CHECK(qt && (int)qt->type == t);
        CHECK_EQ_INT(qt->to_float != NULL, llmq_dtype_traits((enum llmq_dtype)t)->can_dequant);
        CHECK_EQ_INT(qt->to_float_ref != NULL, qt->to_float != NULL);
    }
    CHECK(llmq_quant_traits(LLMQ_DTYPE_COUNT) == NULL);
    CHECK(llmq_quant_traits(LLMQ_DTYPE_INVALID) == NULL);
}

static void test_legacy_blocks(void) {
    struct llmq_block_q4_0 q40 = {.d = F16_HALF};
    for (int j = 0; j < 16; j++) q40.qs[j] = (uint8_t)(j | (15 - j) << 4);
    decode(LLMQ_DTYPE_Q4_0, &q40, 32);
    CHECK(out[0] == -4.0f && out[8] == 0.0f && out[15] == 3.5f);
    CHECK(out[16] == 3.5f && out[31] == -4.0f);

    struct llmq_block_q4_1 q41 = {.d = F16_QUARTER, .m = F16_M1};
    for (int j = 0; j < 16; j++) q41.qs[j] = (uint8_t)(j | (15 - j) << 4);
    decode(LLMQ_DTYPE_Q4_1, &q41, 32);
    CHECK(out[0] == -1.0f && out[15] == 2.75f && out[16] == 2.75f && out[31] == -1.0f);

    struct llmq_block_q5_0 q50 = {.d = F16_1, .qh = {0x01, 0x00, 0x01, 0x80}}; // bits 0, 16, 31
    for (int j = 0; j < 16; j++) q50.qs[j] = (uint8_t)(j | (15 - j) << 4);
    decode(LLMQ_DTYPE_Q5_0, &q50, 32);
    CHECK(out[0] == 0.0f);   // 0 | 16 - 16
    CHECK(out[1] == -15.0f); // 1 - 16
    CHECK(out[16] == 15.0f); // 15 | 16 - 16
    CHECK(out[31] == 0.0f);  // 0 | 16 - 16
    CHECK(out[30] == -15.0f);

    struct llmq_block_q5_1 q51 = {.d = F16_2, .m = F16_HALF, .qh = {0xff, 0xff, 0xff, 0xff}};
    for (int j = 0; j < 16; j++) q51.qs[j] = (uint8_t)(j | (15 - j) << 4);
    decode(LLMQ_DTYPE_Q5_1, &q51, 32);
    CHECK(out[0] == 32.5f && out[15] == 62.5f && out[16] == 62.5f);

    struct llmq_block_q8_0 q80 = {.d = 0x3000}; // 0.125
    for (int j = 0; j < 32; j++) q80.qs[j] = (int8_t)(j * 8 - 128);
    decode(LLMQ_DTYPE_Q8_0, &q80, 32);
    CHECK(out[0] == -16.0f && out[16] == 0.0f && out[31] == 15.0f);

    struct llmq_block_iq4_nl nl = {.d = F16_2};
    for (int j = 0; j < 16; j++) nl.qs[j] = (uint8_t)(j | (15 - j) << 4);
    decode(LLMQ_DTYPE_IQ4_NL, &nl, 32);
    CHECK(out[0] == -254.0f && out[8] == 2.0f && out[16] == 226.0f && out[31] == -254.0f);

    // subnormal and negative scales decode exactly: d = -2^-24 (f16 0x8001)
    q80.d = 0x8001;
    decode(LLMQ_DTYPE_Q8_0, &q80, 32);
    CHECK(out[0] == 128 * 0x1p-24f && out[31] == -120 * 0x1p-24f);
    CHECK(signbit(out[16])); // 0 * negative d = -0, as in ggml
}

static void test_kquant_blocks(void) {
    struct llmq_block_q2_k q2 = {.d = F16_1, .dmin = F16_HALF};
    memset(q2.qs, 0xE4, sizeof q2.qs);         // 0b11100100: the j-th 2-bit field is j
    memset(q2.scales, 0x21, sizeof q2.scales); // scale 1, min 2
    q2.scales[5] = 0x3F;                       // sub-block 5 (elements 80..95): scale 15, min 3
    decode(LLMQ_DTYPE_Q2_K, &q2, 256);
    CHECK(out[0] == -1.0f && out[32] == 0.0f && out[64] == 1.0f && out[127] == 2.0f && out[128] == -1.0f);
    CHECK(out[80] == 15.0f * 2 - 1.5f); // j = 2

    struct llmq_block_q3_k q3 = {.d = F16_1};
    memset(q3.qs, 0xE4, sizeof q3.qs);
    memset(q3.hmask, 0xFF, sizeof q3.hmask); // high bit set: no -4
    memset(q3.scales, 0x11, 8);              // low 4 bits of all 16 scales = 1
    memset(q3.scales + 8, 0xAA, 4);          // high 2 bits = 2: scale 33 - 32 = 1
    q3.hmask[5] = 0xFE;                      // element 5 (half 0, j 0): q = 0 - 4
    q3.scales[2] = 0x01;                     // scale 10: low bits 0 ...
    q3.scales[10] = 0x8A;                    // ... high bits 0 -> 0 - 32
    decode(LLMQ_DTYPE_Q3_K, &q3, 256);
    CHECK(out[0] == 0.0f && out[5] == -4.0f && out[32] == 1.0f && out[255] == 3.0f);
    CHECK(out[160] == -32.0f && out[175] == -32.0f && out[176] == 1.0f); // sub-block 10 = 160..175

    struct llmq_block_q4_k q4 = {.d = F16_HALF, .dmin = F16_QUARTER};
    memset(q4.qs, 0x53, sizeof q4.qs); // even sub-blocks q = 3, odd q = 5
    q4.scales[0] = 2;                  // sub-block 0: scale 2
    q4.scales[4] = 1;                  //              min 1
    q4.scales[9] = 0x81;               // sub-block 5: low 4 bits of scale 1, of min 8
    q4.scales[1] = 0x80;               //              high bits of scale 2 (sub-block 1 scale 0)
    q4.scales[5] = 0x80;               //              high bits of min 2 (sub-block 1 min 0)
    decode(LLMQ_DTYPE_Q4_K, &q4, 256);
    CHECK(out[0] == 2.75f);               // (0.5 * 2) * 3 - 0.25 * 1
    CHECK(out[32] == 0.0f);               // sub-block 1: scale 0, min 0
    CHECK(out[160] == 16.5f * 5 - 10.0f); // scale 33, min 40

    struct llmq_block_q5_k q5 = {.d = F16_HALF, .dmin = F16_QUARTER};
    memcpy(q5.scales, q4.scales, sizeof q5.scales);
    memset(q5.qs, 0x53, sizeof q5.qs);
    q5.qh[3] = 1 << 5; // 5th bit of element 32 * 5 + 3
    decode(LLMQ_DTYPE_Q5_K, &q5, 256);
    CHECK(out[0] == 2.75f && out[160] == 72.5f && out[163] == 16.5f * 21 - 10.0f);

    struct llmq_block_q6_k q6 = {.d = F16_HALF};
    memset(q6.ql, 0x21, sizeof q6.ql); // low nibble 1, high nibble 2
    memset(q6.qh, 0xE4, sizeof q6.qh); // high 2 bits = j
    for (int s = 0; s < 16; s++) q6.scales[s] = (int8_t)(s - 8);
    decode(LLMQ_DTYPE_Q6_K, &q6, 256);
    CHECK(out[0] == 124.0f);  // (0.5 * -8) * (1 - 32)
    CHECK(out[40] == 45.0f);  // j 1, s 2: (0.5 * -6) * (17 - 32)
    CHECK(out[69] == -4.0f);  // j 2, s 4: (0.5 * -4) * (34 - 32)
    CHECK(out[225] == 54.0f); // j 3, s 14: (0.5 * 6) * (50 - 32)

    struct llmq_block_iq4_xs xs = {.d = F16_1, .scales_h = 0x000A, .scales_l = {0x21, 0, 0, 0}};
    for (int j = 0; j < 128; j++) xs.qs[j] = (uint8_t)((j % 16) | (15 - j % 16) << 4);
    decode(LLMQ_DTYPE_IQ4_XS, &xs, 256);
    CHECK(out[0] == -127.0f && out[15] == 113.0f && out[16] == 113.0f); // scale 33 - 32 = 1
    CHECK(out[32] == -254.0f);                                          // scale 2
    CHECK(out[64] == 127.0f * 32);                                      // scale 0 - 32
}

static void test_plain(void) {
    const uint16_t h[4] = {0x3c00, 0x8001, 0x7c00, 0xfbff};
    decode(LLMQ_DTYPE_F16, h, 4);
    CHECK(out[0] == 1.0f && out[1] == -0x1p-24f && isinf(out[2]) && out[3] == -65504.0f);
    const uint16_t b[2] = {0x3f80, 0xc040};
    decode(LLMQ_DTYPE_BF16, b, 2);
    CHECK(out[0] == 1.0f && out[1] == -3.0f);
    const double d[3] = {1.0 + 0x1p-24, 1.0 + 0x1.8p-24, 1e300};
    decode(LLMQ_DTYPE_F64, d, 3);
    CHECK(out[0] == 1.0f && out[1] == 1.0f + 0x1p-23f && isinf(out[2])); // ties to even, overflow

    // row helpers: every f16 bit pattern, branch-free path == scalar conversion
    static uint16_t all[65536];
    static float f[65536];
    static uint16_t back[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    llmq_f16_to_f32_row(all, f, 65536);
    for (int i = 0; i < 65536; i++) {
        float s = llmq_f16_to_f32(all[i]);
        CHECK(memcmp(&s, &f[i], 4) == 0);
    }
    llmq_f32_to_f16_row(f, back, 65536);
    for (int i = 0; i < 65536; i++) CHECK(back[i] == llmq_f32_to_f16(f[i]));
    llmq_bf16_to_f32_row(all, f, 65536);
    llmq_f32_to_bf16_row(f, back, 65536);
    for (int i = 0; i < 65536; i++) {
        if (!isnan(f[i]))
            CHECK_EQ_INT(back[i], i);
        else
            CHECK_EQ_INT(back[i], i | 0x40); // NaNs come back quiet
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { return (uint32_t)(test_xorshift64(&rng_state) >> 16); }

// Random blocks (f16 fields random but finite) decode identically with to_float and to_float_ref,
// also from an odd source address; NaN outputs compared by bits too.
static void test_fast_equals_ref(void) {
    enum { NB = 97 };
    static alignas(8) unsigned char buf[NB * 210 + 16];
    static float a[NB * 256], r[NB * 256], u[NB * 256];
    for (int t = 0; t < LLMQ_DTYPE_COUNT; t++) {
        const struct llmq_dtype_traits *dt = llmq_dtype_traits((enum llmq_dtype)t);
        const struct llmq_quant_traits *qt = llmq_quant_traits((enum llmq_dtype)t);
        if (!qt->to_float || t == LLMQ_DTYPE_F64) continue;
        int64_t nb = t == LLMQ_DTYPE_F32 ? NB * 8 : NB, n = nb * dt->blck;
        for (int rep = 0; rep < 20; rep++) {
            for (size_t i = 0; i < (size_t)nb * dt->size; i++) buf[i] = (uint8_t)rnd();
            if (dt->is_quant) { // keep f16 fields finite: clear exponent-all-ones at every even offset
                for (size_t i = 0; i + 1 < (size_t)nb * dt->size; i += 2)
                    if ((buf[i + 1] & 0x7c) == 0x7c) buf[i + 1] &= 0xbf;
            }
            CHECK_EQ_INT(llmq_dequantize_row((enum llmq_dtype)t, buf, a, n), LLMQ_OK);
            CHECK_EQ_INT(llmq_dequantize_row_ref((enum llmq_dtype)t, buf, r, n), LLMQ_OK);
            if (memcmp(a, r, (size_t)n * 4) != 0) {
                for (int64_t i = 0; i < n; i++)
                    if (memcmp(&a[i], &r[i], 4) != 0) {
                        fprintf(stderr, "%s: element %lld fast %a ref %a\n", dt->name, (long long)i, a[i], r[i]);
                        break;
                    }
                CHECK(!"fast != ref");
            }
            memmove(buf + 1, buf, (size_t)nb * dt->size);
            CHECK_EQ_INT(llmq_dequantize_row((enum llmq_dtype)t, buf + 1, u, n), LLMQ_OK);
            CHECK(memcmp(a, u, (size_t)n * 4) == 0);
        }
    }
}

static void test_errors(void) {
    unsigned char blk[512] = {0};
    float sentinel = 12345.0f;
    out[0] = sentinel;
    llmq_clear_error();
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_Q4_K, blk, out, 255), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "q4_k");
    CHECK_CONTAINS(llmq_last_error(), "255");
    CHECK(out[0] == sentinel);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_Q4_0, blk, out, 33), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_Q4_0, blk, out, -32), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_Q4_0, NULL, out, 32), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_Q4_0, blk, NULL, 32), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_Q4_0, NULL, NULL, 0), LLMQ_OK);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_Q8_K, blk, out, 256), LLMQ_ERR_UNSUPPORTED);
    CHECK_CONTAINS(llmq_last_error(), "q8_k");
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_I32, blk, out, 4), LLMQ_ERR_UNSUPPORTED);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_IQ2_XXS, blk, out, 256), LLMQ_ERR_UNSUPPORTED);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_MXFP4, blk, out, 32), LLMQ_ERR_UNSUPPORTED);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_COUNT, blk, out, 32), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_dequantize_row(LLMQ_DTYPE_INVALID, blk, out, 32), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_dequantize_row_ref(LLMQ_DTYPE_Q6_K, blk, out, 100), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_last_status(), LLMQ_ERR_ARG);
    CHECK(out[0] == sentinel);
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    test_layout();
    test_legacy_blocks();
    test_kquant_blocks();
    test_plain();
    test_fast_equals_ref();
    test_errors();
    printf("test_ggml_quants: ok\n");
    return 0;
}
