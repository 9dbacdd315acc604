/*
 * calib/model/actq.c — activation round trips of llama.cpp's CPU backend (see calib/model/actq.h for the facts
 * and the source files they come from).
 */
#include "calib/model/actq.h"

#include "common/status.h"

#include <math.h>
#include <string.h>

static const char *const names[LLMQ_EMULATE_COUNT] = {"none", "llamacpp-cpu", "llamacpp-cpu-nofa"};

const char *llmq_emulate_name(enum llmq_emulate e) { return (unsigned)e < LLMQ_EMULATE_COUNT ? names[e] : "?"; }

bool llmq_emulate_from_name(const char *name, enum llmq_emulate *out) {
    for (int i = 0; i < LLMQ_EMULATE_COUNT; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = (enum llmq_emulate)i;
            return true;
        }
    return false;
}

enum llmq_dtype llmq_actq_vec_dot_type(enum llmq_dtype w) {
    switch (w) {
    case LLMQ_DTYPE_F16: return LLMQ_DTYPE_F16;
    case LLMQ_DTYPE_BF16: return LLMQ_DTYPE_BF16;
    case LLMQ_DTYPE_Q4_0:
    case LLMQ_DTYPE_Q5_0:
    case LLMQ_DTYPE_Q8_0:
    case LLMQ_DTYPE_IQ4_NL:
    case LLMQ_DTYPE_MXFP4: return LLMQ_DTYPE_Q8_0;
    case LLMQ_DTYPE_Q4_1:
    case LLMQ_DTYPE_Q5_1: return LLMQ_DTYPE_Q8_1;
    case LLMQ_DTYPE_Q2_K:
    case LLMQ_DTYPE_Q3_K:
    case LLMQ_DTYPE_Q4_K:
    case LLMQ_DTYPE_Q5_K:
    case LLMQ_DTYPE_Q6_K:
    case LLMQ_DTYPE_IQ2_XXS:
    case LLMQ_DTYPE_IQ2_XS:
    case LLMQ_DTYPE_IQ3_XXS:
    case LLMQ_DTYPE_IQ1_S:
    case LLMQ_DTYPE_IQ3_S:
    case LLMQ_DTYPE_IQ2_S:
    case LLMQ_DTYPE_IQ4_XS:
    case LLMQ_DTYPE_IQ1_M:
    case LLMQ_DTYPE_TQ1_0:
    case LLMQ_DTYPE_TQ2_0: return LLMQ_DTYPE_Q8_K;
    default: return LLMQ_DTYPE_F32;
    }
}

// Q8_0 / Q8_1 values of one block of 32 (x86 quantize_row_q8_0: id = 127 / amax, ties to even).
static void round_q8_0(const float *x, float *y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = llmq_f16_to_f32(llmq_f32_to_f16(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; j++) {
        float q = rintf(x[j] * id);
        if (q > 127.0f) q = 127.0f; // the int8 pack saturates (x · id may exceed 127 by an ulp)
        if (q < -127.0f) q = -127.0f;
        y[j] = d * q;
    }
}

// Q8_K values of one block of 256 (quantize_row_q8_K_ref).
static void round_q8_K(const float *x, float *y) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax == 0.0f) {
        for (int j = 0; j < 256; j++) y[j] = 0.0f;
        return;
    }
    const float iscale = -127.0f / max;
    const float d = 1.0f / iscale;
    for (int j = 0; j < 256; j++) {
        float q = rintf(iscale * x[j]); // nearest_int: round half to even
        if (q > 127.0f) q = 127.0f;
        y[j] = d * q;
    }
}

void llmq_actq_round_row(enum llmq_dtype vt, const float *x, int64_t C, float *y) {
    switch (vt) {
    case LLMQ_DTYPE_Q8_0:
    case LLMQ_DTYPE_Q8_1:
        LLMQ_ASSERT(C % 32 == 0);
        for (int64_t i = 0; i < C; i += 32) round_q8_0(x + i, y + i);
        break;
    case LLMQ_DTYPE_Q8_K:
        LLMQ_ASSERT(C % 256 == 0);
        for (int64_t i = 0; i < C; i += 256) round_q8_K(x + i, y + i);
        break;
    case LLMQ_DTYPE_F16:
        for (int64_t i = 0; i < C; i++) y[i] = llmq_f16_to_f32(llmq_f32_to_f16(x[i]));
        break;
    case LLMQ_DTYPE_BF16:
        for (int64_t i = 0; i < C; i++) y[i] = llmq_bf16_to_f32(llmq_f32_to_bf16(x[i]));
        break;
    default:
        if (y != x) memmove(y, x, (size_t)C * sizeof(float));
        break;
    }
}

void llmq_actq_round_f16(float *x, int64_t n) { llmq_actq_round_row(LLMQ_DTYPE_F16, x, n, x); }
