/*
 * tests/unit/test_actq.c — calib/model/actq.h: the activation round trips of llama.cpp's CPU backend on
 * hand-computed cases (the expected values follow from the ggml formulas quoted in calib/model/actq.h, worked
 * out by hand: ties to even, f16 scale, the sign of the Q8_K scale), the vec_dot_type table, the mode
 * names, and the forward pass: LLMQ_EMULATE_NONE is bit-identical to a forward that never heard of
 * emulation, and the emulated stories260K (f32 weights: only the f16 K/V cache applies) stays close.
 */
#include "calib/model/actq.h"
#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "common/io.h"
#include "harness.h"

#include <math.h>
#include <stdint.h>

static void test_q8_0(void) {
    float x[64] = {0}, y[64];
    // Block 0: amax 127 -> d = 1 (exact in f16), id = 1: q = round-half-even(x).
    x[0] = 127.0f, x[1] = -63.5f, x[2] = 0.5f, x[3] = 1.5f, x[4] = 2.5f, x[5] = -0.5f, x[6] = 3.25f;
    // Block 1: amax 1 -> d16 = f16(1/127) = 0.0078735351..., id = 127: x = 1 -> 127 · d16.
    x[32] = 1.0f, x[33] = -0.5f; // -63.5 -> -64
    llmq_actq_round_row(LLMQ_DTYPE_Q8_0, x, 64, y);
    const float want0[7] = {127, -64, 0, 2, 2, -0.0f, 3};
    for (int j = 0; j < 7; j++) CHECK(y[j] == want0[j]);
    for (int j = 7; j < 32; j++) CHECK(y[j] == 0.0f);
    CHECK(y[32] == 0.99993896484375f);
    CHECK(y[33] == -64 * (0.99993896484375f / 127));
    // Q8_1 carries the same values.
    float y1[64];
    llmq_actq_round_row(LLMQ_DTYPE_Q8_1, x, 64, y1);
    CHECK(memcmp(y, y1, sizeof y) == 0);
    // A zero block stays zero; in place works.
    float z[32] = {0};
    llmq_actq_round_row(LLMQ_DTYPE_Q8_0, z, 32, z);
    for (int j = 0; j < 32; j++) CHECK(z[j] == 0.0f);
}

static void test_q8_K(void) {
    float x[512] = {0}, y[512];
    // Block 0: the largest |x| is positive (254): iscale = -127/254 = -0.5, d = -2.
    // 3 -> -1.5 -> -2 -> 4; 5 -> -2.5 -> -2 -> 4 (half away would give 6); 1 -> -0.5 -> -0 -> 0.
    x[0] = 3.0f, x[1] = 254.0f, x[2] = 5.0f, x[3] = 1.0f, x[4] = -7.0f;
    // Block 1: the largest |x| is negative (-127): iscale = 1, d = 1; 2.5 -> 2, -3.5 -> -4.
    x[256] = 2.5f, x[257] = -127.0f, x[258] = -3.5f, x[259] = 0.75f;
    llmq_actq_round_row(LLMQ_DTYPE_Q8_K, x, 512, y);
    CHECK(y[0] == 4.0f && y[1] == 254.0f && y[2] == 4.0f && y[3] == 0.0f && y[4] == -8.0f);
    for (int j = 5; j < 256; j++) CHECK(y[j] == 0.0f);
    CHECK(y[256] == 2.0f && y[257] == -127.0f && y[258] == -4.0f && y[259] == 1.0f);
    // A general scale: max -2 -> iscale 63.5, d = 1/63.5 in f32; 1 -> 63.5 -> 64.
    float a[256] = {0}, b[256];
    a[0] = 1.0f, a[1] = -2.0f;
    llmq_actq_round_row(LLMQ_DTYPE_Q8_K, a, 256, b);
    const float d = 1.0f / 63.5f;
    CHECK(b[0] == d * 64.0f && b[1] == d * -127.0f);
    // Zero block.
    float z[256] = {0};
    llmq_actq_round_row(LLMQ_DTYPE_Q8_K, z, 256, z);
    for (int j = 0; j < 256; j++) CHECK(z[j] == 0.0f);
}

static void test_half(void) {
    float x[4] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f}, y[4];
    llmq_actq_round_row(LLMQ_DTYPE_F16, x, 4, y);
    CHECK(y[0] == 1.0f && y[1] == 1.0f + 0x1p-9f && y[2] == x[2] && y[3] == x[3]);
    llmq_actq_round_row(LLMQ_DTYPE_BF16, x, 4, y);
    CHECK(y[0] == 1.0f && y[1] == 1.0f && y[2] == 1.0f && y[3] == 1.0f + 0x1p-6f);
    float h[2] = {1.0f + 0x1p-11f, 70000.0f};
    llmq_actq_round_f16(h, 2);
    CHECK(h[0] == 1.0f && isinf(h[1]));
    float f[3] = {0.1f, -2.0f, 3.3f}, g[3];
    llmq_actq_round_row(LLMQ_DTYPE_F32, f, 3, g);
    CHECK(memcmp(f, g, sizeof f) == 0);
}

static void test_tables(void) {
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_Q4_0) == LLMQ_DTYPE_Q8_0);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_IQ4_NL) == LLMQ_DTYPE_Q8_0);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_Q5_1) == LLMQ_DTYPE_Q8_1);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_Q2_K) == LLMQ_DTYPE_Q8_K);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_Q6_K) == LLMQ_DTYPE_Q8_K);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_IQ4_XS) == LLMQ_DTYPE_Q8_K);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_F16) == LLMQ_DTYPE_F16);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_BF16) == LLMQ_DTYPE_BF16);
    CHECK(llmq_actq_vec_dot_type(LLMQ_DTYPE_F32) == LLMQ_DTYPE_F32);
    enum llmq_emulate e;
    CHECK(llmq_emulate_from_name("llamacpp-cpu", &e) && e == LLMQ_EMULATE_LLAMACPP_CPU);
    CHECK(llmq_emulate_from_name("llamacpp-cpu-nofa", &e) && e == LLMQ_EMULATE_LLAMACPP_CPU_NOFA);
    CHECK(llmq_emulate_from_name("none", &e) && e == LLMQ_EMULATE_NONE);
    CHECK(!llmq_emulate_from_name("llamacpp", &e) && !llmq_emulate_from_name(NULL, &e));
    CHECK(strcmp(llmq_emulate_name(LLMQ_EMULATE_LLAMACPP_CPU), "llamacpp-cpu") == 0);
}

static void test_forward(const char *path) {
    struct llmq_model *m = NULL;
    CHECK(llmq_model_load(path, &m) == LLMQ_OK);
    const int64_t V = m->hp.n_vocab, n = 24;
    int32_t toks[24];
    for (int i = 0; i < n; i++) toks[i] = (i * 37 + 1) % (int32_t)V;
    float *a = malloc((size_t)(n * V) * sizeof(float)), *b = malloc((size_t)(n * V) * sizeof(float));
    float *c = malloc((size_t)(n * V) * sizeof(float));
    CHECK(a && b && c);
    struct llmq_forward *f = NULL, *g = NULL;
    CHECK(llmq_forward_init(m, n, 2, &f) == LLMQ_OK && llmq_forward_init(m, n, 2, &g) == LLMQ_OK);
    CHECK(llmq_forward_logits(f, toks, n, 0, a) == LLMQ_OK);
    CHECK(llmq_forward_set_emulate(g, LLMQ_EMULATE_LLAMACPP_CPU) == LLMQ_OK);
    CHECK(llmq_forward_logits(g, toks, n, 0, b) == LLMQ_OK);
    CHECK(llmq_forward_set_emulate(g, LLMQ_EMULATE_NONE) == LLMQ_OK);
    CHECK(llmq_forward_logits(g, toks, n, 0, c) == LLMQ_OK);
    CHECK(memcmp(a, c, (size_t)(n * V) * sizeof(float)) == 0); // NONE: the f32 pass bit for bit
    float d = 0.0f;
    for (int64_t i = 0; i < n * V; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    printf("stories260K (f32 weights) emulated vs f32: max |logit diff| = %.3g\n", d);
    CHECK(d > 0.0f && d < 3e-2f); // the f16 K/V cache changes something, and only a little
    CHECK(llmq_forward_set_emulate(g, LLMQ_EMULATE_COUNT) == LLMQ_ERR_ARG);
    llmq_forward_free(f);
    llmq_forward_free(g);
    free(a), free(b), free(c);
    llmq_model_free(m);
}

int main(void) {
    test_q8_0();
    test_q8_K();
    test_half();
    test_tables();
    char path[1024];
    test_need_file(test_stories260k(path, sizeof path, "tinyllamas-stories-260k-f32.gguf"));
    test_forward(path);
    printf("test_actq: OK\n");
    return 0;
}
