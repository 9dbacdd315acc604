/*
 * calib/model/actq.h — emulation of llama.cpp's CPU-backend activation arithmetic, so that `llmq eval
 * --emulate llamacpp-cpu` predicts the perplexity llama.cpp computes on the same GGUF file.
 *
 * What it is: the rounding llama.cpp (vendored 0.3.36, ggml-cpu) applies to the activations of a
 * matrix product, as a round trip f32 -> vec_dot_type -> f32, and the names of the emulation modes.
 * What it is not: no matrix product (calib/model/forward.c rounds the input once per product, then runs
 * its usual f32 GEMM on the dequantized weight), no bit-exact replay of ggml's integer dot products.
 *
 * Facts (ggml/src/ggml-cpu/ggml-cpu.c type_traits_cpu, ggml-cpu/arch/x86/quants.c, ggml-quants.c):
 *   ggml_compute_forward_mul_mat converts src1 (the f32 activations, one row per token) to the
 *   weight type's vec_dot_type before the dot products:
 *     Q4_0 Q5_0 Q8_0 IQ4_NL MXFP4                                  -> Q8_0 (blocks of 32)
 *     Q4_1 Q5_1                                                     -> Q8_1 (blocks of 32)
 *     Q2_K..Q6_K IQ1_S IQ1_M IQ2_* IQ3_* IQ4_XS TQ1_0 TQ2_0         -> Q8_K (blocks of 256)
 *     F16 -> F16, BF16 -> BF16, F32 -> none.
 *   The repacked paths (Q4_0 / IQ4_NL / Q4_K / Q2_K on AVX2 / AVX-512, ggml-cpu/repack.cpp) and
 *   llamafile's tinyBLAS quantize the activations with the same per-block values.
 *   Q8_0 / Q8_1, x86 AVX path (quantize_row_q8_0 / _q8_1): per block of 32, amax = max|x|,
 *     d = amax / 127, id = amax != 0 ? 127 / amax : 0, q = round-half-even(x · id), stored
 *     d16 = f16(d); the dot product sees x̂ = d16 · q. (The scalar reference quantize_row_q8_0_ref
 *     used on other CPUs takes id = 1 / d and roundf — half away from zero; the two differ only
 *     when x · id lies within an ulp of a .5 boundary.) Q8_1 also stores s = f16(d · Σq), which the
 *     Q4_1 / Q5_1 dot product uses for the weight's min term; here that term sees d16 · Σq instead
 *     (an f16 rounding of one block sum: not emulated).
 *   Q8_K (quantize_row_q8_K_ref, also the x86 path): per block of 256, max = the element of largest
 *     |x| (the first one on ties), zero block -> all zero; iscale = -127 / max,
 *     q = min(127, nearest_int(iscale · x)) (round-half-even), d = 1 / iscale kept in f32; x̂ = d · q.
 *     (The repacked Q4_K / Q2_K path picks the positive element when +amax and -amax both occur.)
 *   F16 / BF16: x̂ = the value rounded to nearest even (ggml_cpu_fp32_to_fp16 / _bf16).
 * Attention (src/llama-graph.cpp build_attn_mha; the KV cache is F16 by default):
 *   K (after RoPE) and V are stored in the cache as f16. llama-perplexity's default flash_attn is
 *   "auto", which resolves to enabled on the CPU backend (logged "Flash Attention enabled"); for a
 *   batch of >= 64 queries ggml_compute_forward_flash_attn_ext_tiled then keeps Q, the scores, the
 *   softmax and the V accumulation in f32 (only K and V are f16). Without flash attention
 *   (llama-cpp-python's default, llama-perplexity -fa off) KQ = mul_mat(K f16, Q) converts Q to f16,
 *   and KQV = mul_mat(V f16, softmax(KQ)) converts the probabilities to f16.
 *   For a ubatch under 64 queries flash attention takes its vector path instead: Q to f16, the scores
 *   in key order with an online softmax whose V accumulator is f16 (ggml_vec_mad_f16 / _scale_f16 round
 *   every update). Emulated row by row where the caller knows the ubatches (calib/model/forward.h
 *   llmq_forward_set_favec_rows; calib/eval/tasks.h replays llama-perplexity's batches).
 *   Not emulated: flash attention's online softmax over KV tiles (an f32 reordering), summation orders
 *   (ggml_vec_dot_f16's lanes: the vector path's scores are summed in double here).
 */
#ifndef LLMQ_CALIB_ACTQ_H
#define LLMQ_CALIB_ACTQ_H

#include "common/dtype.h"

#include <stdbool.h>
#include <stdint.h>

enum llmq_emulate {
    LLMQ_EMULATE_NONE = 0,          // f32 activations, f32 attention (llmq's own arithmetic)
    LLMQ_EMULATE_LLAMACPP_CPU,      // llama.cpp CPU defaults: activations to vec_dot_type, K/V f16, flash attention
    LLMQ_EMULATE_LLAMACPP_CPU_NOFA, // the same without flash attention: Q and the softmax output to f16 too
    LLMQ_EMULATE_COUNT
};

const char *llmq_emulate_name(enum llmq_emulate e); // "none", "llamacpp-cpu", "llamacpp-cpu-nofa", "?"
bool llmq_emulate_from_name(const char *name, enum llmq_emulate *out); // false if unknown

// The type llama.cpp's CPU backend converts the activations to before multiplying them with a weight
// of type w (the table above): Q8_0, Q8_1, Q8_K, F16 or BF16; F32 when they stay f32 (f32 weights, or
// a type without a CPU dot product).
enum llmq_dtype llmq_actq_vec_dot_type(enum llmq_dtype w);

// y (C) = x (C) rounded through vec_dot_type vt (a value llmq_actq_vec_dot_type returns) and back to
// f32, as above. C must be a multiple of vt's block size (32 for Q8_0 / Q8_1, 256 for Q8_K), which
// holds whenever C is the row length of a weight whose vec_dot_type is vt. y may equal x. F32: a copy.
void llmq_actq_round_row(enum llmq_dtype vt, const float *x, int64_t C, float *y);

// x (n) rounded to f16 and back, in place (the F16 KV cache and the f16 operands of attention).
void llmq_actq_round_f16(float *x, int64_t n);

#endif // LLMQ_CALIB_ACTQ_H
