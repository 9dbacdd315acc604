/*
 * common/dtype.h — element types of every tensor llmq reads or writes, in one table.
 *
 * One enum covers the safetensors dtypes (F64 … BOOL) and the ggml/GGUF tensor types (F32, F16,
 * BF16, the legacy 32-element blocks and the 256-element k-quant / i-quant super-blocks).
 * A block type stores `blck` elements in `size` bytes; plain types have blck == 1.
 * `ggml_id` is the on-disk GGUF type number (-1: no GGUF encoding); `st_name` is the safetensors
 * dtype string (NULL: not a safetensors dtype). `can_dequant` tells whether
 * formats/ggml/quants.h can turn it into f32.
 *
 * Half-precision helpers: f16 and bf16 <-> f32. f16/bf16 -> f32 is exact; f32 -> f16/bf16
 * rounds to nearest even (NaN stays NaN), like ggml's reference conversions.
 */
#ifndef LLMQ_DTYPE_H
#define LLMQ_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum llmq_dtype {
    LLMQ_DTYPE_F32 = 0,
    LLMQ_DTYPE_F16,
    LLMQ_DTYPE_BF16,
    LLMQ_DTYPE_F64,
    LLMQ_DTYPE_I64,
    LLMQ_DTYPE_I32,
    LLMQ_DTYPE_I16,
    LLMQ_DTYPE_I8,
    LLMQ_DTYPE_U8,
    LLMQ_DTYPE_BOOL,
    // ggml block types
    LLMQ_DTYPE_Q4_0,
    LLMQ_DTYPE_Q4_1,
    LLMQ_DTYPE_Q5_0,
    LLMQ_DTYPE_Q5_1,
    LLMQ_DTYPE_Q8_0,
    LLMQ_DTYPE_Q8_1,
    LLMQ_DTYPE_Q2_K,
    LLMQ_DTYPE_Q3_K,
    LLMQ_DTYPE_Q4_K,
    LLMQ_DTYPE_Q5_K,
    LLMQ_DTYPE_Q6_K,
    LLMQ_DTYPE_Q8_K,
    LLMQ_DTYPE_IQ2_XXS,
    LLMQ_DTYPE_IQ2_XS,
    LLMQ_DTYPE_IQ3_XXS,
    LLMQ_DTYPE_IQ1_S,
    LLMQ_DTYPE_IQ4_NL,
    LLMQ_DTYPE_IQ3_S,
    LLMQ_DTYPE_IQ2_S,
    LLMQ_DTYPE_IQ4_XS,
    LLMQ_DTYPE_IQ1_M,
    LLMQ_DTYPE_TQ1_0,
    LLMQ_DTYPE_TQ2_0,
    LLMQ_DTYPE_MXFP4,
    LLMQ_DTYPE_COUNT,
    LLMQ_DTYPE_INVALID = -1,
};

struct llmq_dtype_traits {
    const char *name;    // lower-case display name: "f32", "bf16", "q4_k", "iq4_xs"
    const char *st_name; // safetensors dtype string ("F32", "BF16", "BOOL"), NULL if none
    int ggml_id;         // GGUF on-disk type id, -1 if none
    int64_t blck;        // elements per block (1 for plain types)
    size_t size;         // bytes per block
    bool is_quant;       // a ggml block type (blck > 1)
    bool can_dequant;    // formats/ggml/quants.h can convert it to f32
};

const struct llmq_dtype_traits *llmq_dtype_traits(enum llmq_dtype t); // NULL if t is out of range
const char *llmq_dtype_name(enum llmq_dtype t);                       // "?" if out of range

enum llmq_dtype llmq_dtype_from_ggml(uint32_t ggml_id);    // INVALID if unknown
enum llmq_dtype llmq_dtype_from_st_name(const char *name); // INVALID if unknown
enum llmq_dtype llmq_dtype_from_name(const char *name);    // by display name, case-insensitive

// Bytes taken by n elements of type t; returns false (and leaves *out alone) if n is not a multiple
// of the block size or the product overflows.
bool llmq_dtype_nbytes(enum llmq_dtype t, int64_t n, size_t *out);

// Half-precision conversions.
float llmq_f16_to_f32(uint16_t h);
uint16_t llmq_f32_to_f16(float f);
float llmq_bf16_to_f32(uint16_t h);
uint16_t llmq_f32_to_bf16(float f);

// The bits of a float and back (no aliasing games: memcpy compiles to a register move).
static inline uint32_t llmq_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float llmq_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Overflow-checked arithmetic for sizes read from files: false on overflow.
static inline bool llmq_mul_i64(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool llmq_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

#endif // LLMQ_DTYPE_H
