/*
 * formats/ggml/quants.h — ggml's quantized block formats and their conversion to f32.
 *
 * What this module is: the byte layout of every ggml block type llmq reads (one fixed-size struct
 * per type, laid out exactly as ggml's ggml-common.h, size checked by _Static_assert), and the
 * decoders that turn rows of those blocks — and of the plain F32 / F16 / BF16 / F64 types — into
 * f32. The decoders reproduce ggml's reference C dequantizers (ggml-quants.c dequantize_row_*)
 * bit for bit: every multiply and subtract happens in f32 in the same order, so a tensor decoded
 * here equals the one llama.cpp or gguf-py (gguf.quants.dequantize) produces, to the last bit.
 * The traits table (llmq_quant_traits) is the single place that maps a dtype to its decoders.
 *
 * What it is not: no file parsing (formats/gguf.h), no threading (callers split rows), no dot
 * products, no quantization of the block types: their encoders live in formats/ggml/encode.h (formats/
 * must not depend on quant/), so `from_float` is set only for F32 / F16 / BF16.
 *
 * Legend: n = elements in a row (a multiple of the type's block size `blck`), nb = n / blck blocks.
 * All multi-byte fields are little-endian; llmq builds only on little-endian hosts.
 * `ggml_half` fields are IEEE binary16 stored as uint16_t.
 *
 * Block layouts (elements / bytes; value of element i of a block):
 *   Q4_0   32/18  d; qs[16]            x = (q - 8) * d, q = low nibble of qs[i] for i < 16,
 *                                      high nibble of qs[i-16] for i >= 16
 *   Q4_1   32/20  d, m; qs[16]         x = q * d + m (nibbles as Q4_0)
 *   Q5_0   32/22  d; qh[4]; qs[16]     x = (q - 16) * d, q = nibble | bit i of qh (u32) << 4
 *   Q5_1   32/24  d, m; qh[4]; qs[16]  x = q * d + m (q as Q5_0)
 *   Q8_0   32/34  d; qs[32] (int8)     x = qs[i] * d
 *   Q2_K  256/84  scales[16]; qs[64]; d; dmin
 *                 16 sub-blocks of 16; scales[s] = scale (low 4 bits) | min (high 4 bits);
 *                 2-bit q: element 128h + 32j + l is (qs[32h + l] >> 2j) & 3;
 *                 x = (d * sc) * q - (dmin * m)
 *   Q3_K  256/110 hmask[32]; qs[64]; scales[12]; d
 *                 16 sub-blocks of 16, 6-bit signed scales (value - 32) packed: low 4 bits in
 *                 scales[0..7] (nibble j/8 of byte j%8), high 2 bits in scales[8 + j%4] bits 2(j/4);
 *                 element 128h + 32j + l: q = ((qs[32h + l] >> 2j) & 3) - 4 unless bit (4h + j)
 *                 of hmask[l] is set; x = (d * sc) * q
 *   Q4_K  256/144 d; dmin; scales[12]; qs[128]
 *                 8 sub-blocks of 32 with 6-bit scale and min (K_SCALE_SIZE = 12 bytes, ggml's
 *                 get_scale_min_k4 packing); element 64k + l is the low nibble of qs[32k + l],
 *                 element 64k + 32 + l its high nibble; x = (d * sc) * q - (dmin * m)
 *   Q5_K  256/176 d; dmin; scales[12]; qh[32]; qs[128]
 *                 as Q4_K plus bit s of qh[l] as the 5th bit of element 32s + l
 *   Q6_K  256/210 ql[128]; qh[64]; scales[16] (int8); d
 *                 16 sub-blocks of 16; element 128h + 32j + l: low 4 bits from ql[64h + l + 32(j&1)]
 *                 (low nibble for j < 2, high for j >= 2), high 2 bits (qh[32h + l] >> 2j) & 3;
 *                 x = (d * sc) * (q - 32)
 *   IQ4_NL  32/18 d; qs[16]            x = d * kvalues_iq4nl[q] (nibbles as Q4_0)
 *   IQ4_XS 256/136 d; scales_h (u16); scales_l[4]; qs[128]
 *                 8 sub-blocks of 32, 6-bit scale ls = nibble s%2 of scales_l[s/2] |
 *                 ((scales_h >> 2s) & 3) << 4; x = (d * (ls - 32)) * kvalues_iq4nl[q], nibbles of
 *                 qs[16s .. 16s+15] as Q4_0 within the sub-block
 */
#ifndef LLMQ_GGML_QUANTS_H
#define LLMQ_GGML_QUANTS_H

#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llmq reads ggml blocks in place and needs a little-endian host"
#endif

#define LLMQ_QK4_0 32
#define LLMQ_QK4_1 32
#define LLMQ_QK5_0 32
#define LLMQ_QK5_1 32
#define LLMQ_QK8_0 32
#define LLMQ_QK4_NL 32
#define LLMQ_QK_K 256        // elements of a k-quant / IQ4_XS super-block
#define LLMQ_K_SCALE_SIZE 12 // bytes of packed 6-bit scales + mins in Q4_K / Q5_K

// The 16 non-linear levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl).
extern const int8_t llmq_kvalues_iq4nl[16];

// ---- block structs: field names and order as ggml-common.h; `d`, `m`, `dmin` are f16 bits.
struct llmq_block_q4_0 {
    uint16_t d;                 // scale
    uint8_t qs[LLMQ_QK4_0 / 2]; // nibbles
};
struct llmq_block_q4_1 {
    uint16_t d;                 // scale
    uint16_t m;                 // offset (block minimum)
    uint8_t qs[LLMQ_QK4_1 / 2]; // nibbles
};
struct llmq_block_q5_0 {
    uint16_t d;                 // scale
    uint8_t qh[4];              // 5th bits, a little-endian u32, bit i for element i
    uint8_t qs[LLMQ_QK5_0 / 2]; // low 4 bits
};
struct llmq_block_q5_1 {
    uint16_t d;                 // scale
    uint16_t m;                 // offset
    uint8_t qh[4];              // 5th bits
    uint8_t qs[LLMQ_QK5_1 / 2]; // low 4 bits
};
struct llmq_block_q8_0 {
    uint16_t d;            // scale
    int8_t qs[LLMQ_QK8_0]; // quants
};
struct llmq_block_q2_k {
    uint8_t scales[LLMQ_QK_K / 16]; // 4-bit scale | 4-bit min << 4, per 16 elements
    uint8_t qs[LLMQ_QK_K / 4];      // 2-bit quants
    uint16_t d;                     // super-block scale of the scales
    uint16_t dmin;                  // super-block scale of the mins
};
struct llmq_block_q3_k {
    uint8_t hmask[LLMQ_QK_K / 8]; // high bit of each quant
    uint8_t qs[LLMQ_QK_K / 4];    // low 2 bits
    uint8_t scales[12];           // 16 6-bit scales
    uint16_t d;                   // super-block scale
};
struct llmq_block_q4_k {
    uint16_t d;                        // super-block scale of the scales
    uint16_t dmin;                     // super-block scale of the mins
    uint8_t scales[LLMQ_K_SCALE_SIZE]; // 8 6-bit scales + 8 6-bit mins
    uint8_t qs[LLMQ_QK_K / 2];         // nibbles
};
struct llmq_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[LLMQ_K_SCALE_SIZE];
    uint8_t qh[LLMQ_QK_K / 8]; // 5th bits
    uint8_t qs[LLMQ_QK_K / 2]; // low 4 bits
};
struct llmq_block_q6_k {
    uint8_t ql[LLMQ_QK_K / 2];     // low 4 bits
    uint8_t qh[LLMQ_QK_K / 4];     // high 2 bits
    int8_t scales[LLMQ_QK_K / 16]; // 8-bit signed scales
    uint16_t d;                    // super-block scale
};
struct llmq_block_iq4_nl {
    uint16_t d;
    uint8_t qs[LLMQ_QK4_NL / 2]; // indices into llmq_kvalues_iq4nl
};
struct llmq_block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;                // high 2 bits of the 8 sub-block scales
    uint8_t scales_l[LLMQ_QK_K / 64]; // low 4 bits of the 8 sub-block scales
    uint8_t qs[LLMQ_QK_K / 2];        // indices into llmq_kvalues_iq4nl
};

_Static_assert(sizeof(struct llmq_block_q4_0) == 18, "block_q4_0 size");
_Static_assert(sizeof(struct llmq_block_q4_1) == 20, "block_q4_1 size");
_Static_assert(sizeof(struct llmq_block_q5_0) == 22, "block_q5_0 size");
_Static_assert(sizeof(struct llmq_block_q5_1) == 24, "block_q5_1 size");
_Static_assert(sizeof(struct llmq_block_q8_0) == 34, "block_q8_0 size");
_Static_assert(sizeof(struct llmq_block_q2_k) == 84, "block_q2_K size");
_Static_assert(sizeof(struct llmq_block_q3_k) == 110, "block_q3_K size");
_Static_assert(sizeof(struct llmq_block_q4_k) == 144, "block_q4_K size");
_Static_assert(sizeof(struct llmq_block_q5_k) == 176, "block_q5_K size");
_Static_assert(sizeof(struct llmq_block_q6_k) == 210, "block_q6_K size");
_Static_assert(sizeof(struct llmq_block_iq4_nl) == 18, "block_iq4_nl size");
_Static_assert(sizeof(struct llmq_block_iq4_xs) == 136, "block_iq4_xs size");

// ---- the traits table

// Decode n elements (n a multiple of the block size, already checked) from src into dst.
// src: n / blck blocks, aligned for the type's block struct (2 bytes; F32 4, F64 8); dst: (n) f32.
// src and dst must not overlap.
typedef void (*llmq_to_float_fn)(const void *src, float *dst, int64_t n);

// Encode n f32 elements. `importance` is NULL or (n) per-element weights; the plain types ignore
// it. Set only for F32 / F16 / BF16: the block-type encoders are formats/ggml/encode.h
// (llmq_gguf_encode_row_ref / llmq_gguf_encode_rows), not hooked in here so that formats/ does
// not depend on quant/.
typedef void (*llmq_from_float_fn)(const float *src, void *dst, int64_t n, const float *importance);

struct llmq_quant_traits {
    enum llmq_dtype type;
    llmq_to_float_fn to_float;     // fast decoder, NULL if the type cannot be decoded
    llmq_to_float_fn to_float_ref; // plain-C reference mirroring ggml's loop, the oracle for
                                   // to_float (bit-identical output); NULL iff to_float is
    llmq_from_float_fn from_float; // encoder, NULL if none
};

// Traits of t; NULL if t is out of range. Every type of common/dtype.h has an entry, and
// to_float != NULL exactly when llmq_dtype_traits(t)->can_dequant.
const struct llmq_quant_traits *llmq_quant_traits(enum llmq_dtype t);

// ---- row conversion

// Decode n elements of type t from src (n / blck blocks, any alignment) into dst (n floats).
// Returns LLMQ_OK; LLMQ_ERR_ARG (logged via llmq_errorf) if t is out of range, n < 0, n is not a
// multiple of the block size, or src/dst is NULL with n > 0; LLMQ_ERR_UNSUPPORTED if t has no
// decoder (integer types, Q8_1, Q8_K, the IQ1/IQ2/IQ3 grids, TQ*, MXFP4). dst is untouched on error.
enum llmq_status llmq_dequantize_row(enum llmq_dtype t, const void *src, float *dst, int64_t n);

// Same contract through the plain-C reference decoders (slower; for tests and cross-checks).
enum llmq_status llmq_dequantize_row_ref(enum llmq_dtype t, const void *src, float *dst, int64_t n);

// Half-precision rows. src/dst: (n) elements, n >= 0, no overlap. f16/bf16 -> f32 is exact
// (NaN payloads kept); f32 -> f16/bf16 rounds to nearest even like llmq_f32_to_f16 / _bf16
// (numpy astype(float16) and ggml_compute_fp32_to_bf16 give the same bits).
void llmq_f16_to_f32_row(const uint16_t *restrict src, float *restrict dst, int64_t n);
void llmq_bf16_to_f32_row(const uint16_t *restrict src, float *restrict dst, int64_t n);
void llmq_f32_to_f16_row(const float *src, uint16_t *dst, int64_t n);
void llmq_f32_to_bf16_row(const float *src, uint16_t *dst, int64_t n);

#endif // LLMQ_GGML_QUANTS_H
