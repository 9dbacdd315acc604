/*
 * formats/ggml/encode.h — encoders for ggml's block types (the inverse of formats/ggml/quants.h), and
 * the per-element grid of an encoded block that GPTQ needs to quantize onto a block format.
 *
 * What it is: one reference encoder per block type that produces the same bytes as ggml's
 * quantizers, with and without importance weights; a threaded row encoder that produces the same
 * bytes as the reference; and the block "grid" (the values an element of an already-encoded block
 * can take) with a setter for one element's code.
 * What it is not: no choice of types (quant/gguf_mix.h), no file writing (quant/gguf_export.h).
 *
 * Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element blocks), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256),
 * IQ4_NL (32), IQ4_XS (256); F32, F16, BF16 are accepted too (plain conversion, f16/bf16 round to
 * nearest even like formats/ggml/quants.h).
 *
 * ---- Equality with the oracles (tests/py/test_gguf_enc_oracle.py) ------------------------------
 *   importance == NULL : bytes identical to ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row,
 *                        NULL) of llama.cpp (libggml-base.so shipped in llama-cpp-python 0.3.36),
 *                        which is what llama-quantize writes without an imatrix; for Q4_0, Q4_1,
 *                        Q5_0, Q5_1, Q8_0 also identical to gguf-py's gguf.quants.quantize.
 *   importance != NULL : bytes identical to ggml_quantize_chunk(..., imatrix) (the weighted-error
 *                        searches of ggml-quants.c quantize_row_*_impl): the importance of column j of every row is
 *                        importance[j] (ggml's quant_weights, the imatrix entry of that tensor).
 *                        Q8_0 ignores it (as ggml does).
 *
 * ---- The grid (for GPTQ onto a block type) -----------------------------------------------------
 * Element j of an encoded block decodes, exactly as formats/ggml/quants.h does it, to
 *     value = A * L[code] + B        (f32: one multiply, then one add, in this order)
 * where code in 0..n_levels-1 is what the block stores for j and L is ascending. A, B depend on the
 * block's (super-)scales and the sub-block of j (e.g. Q4_K: A = d*sc, B = -(dmin*m); Q4_0: A = d,
 * L = -8..7, B = 0; IQ4_NL: L = kvalues_iq4nl). A may be negative or zero (e.g. Q4_0 whose d is
 * max / -8). llmq_gguf_block_set_code rewrites only the bits of element j: scales and other elements
 * are untouched, so after setting every element the block decodes to A * L[code_j] + B for each j.
 */
#ifndef LLMQ_QUANT_GGUF_ENC_H
#define LLMQ_QUANT_GGUF_ENC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/status.h"

// true for the types above (block types and F32 / F16 / BF16).
bool llmq_gguf_can_encode(enum llmq_dtype t);

// Reference encoder of one row: n elements (a multiple of the block size) from src into
// n / blck blocks at dst. importance: NULL or (n) non-negative weights. The plain-C mirror of
// ggml's quantize_row_*_ref / quantize_row_*_impl, the oracle of llmq_gguf_encode_rows.
// Errors (logged): LLMQ_ERR_ARG (n not a multiple of the block, NULL src/dst, type not encodable).
enum llmq_status llmq_gguf_encode_row_ref(enum llmq_dtype t, const float *src, void *dst, int64_t n,
                                          const float *importance);

// The fast path: nrows rows of n_per_row elements, row r from src + r * n_per_row into
// dst + r * row_bytes; importance NULL or (n_per_row), shared by every row. n_threads >= 1 splits
// the rows; the bytes equal llmq_gguf_encode_row_ref of each row for any n_threads.
enum llmq_status llmq_gguf_encode_rows(enum llmq_dtype t, const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                                       const float *importance, int n_threads);

// ---- grid access (block types only; F32 / F16 / BF16 have no grid)

#define LLMQ_GGUF_MAX_LEVELS 256

struct llmq_gguf_grid {
    float A, B;     // value = A * L[code] + B
    int n_levels;   // codes 0 .. n_levels - 1
    const float *L; // (n_levels) ascending levels (static storage)
};

// Grid of element j (0 <= j < block size) of one encoded block of type t.
void llmq_gguf_block_grid(enum llmq_dtype t, const void *block, int j, struct llmq_gguf_grid *g);

// Store code (0 <= code < n_levels of j's grid) as element j of the block.
void llmq_gguf_block_set_code(enum llmq_dtype t, void *block, int j, int code);

// The code of the grid point nearest to w (ties: the lower code); A == 0 gives the code whose
// level is nearest to 0. Exact for any grid (linear search over at most 256 levels, or arithmetic
// for uniform levels with the same result).
int llmq_gguf_grid_nearest(const struct llmq_gguf_grid *g, float w);

static inline float llmq_gguf_grid_value(const struct llmq_gguf_grid *g, int code) { return g->A * g->L[code] + g->B; }

#endif // LLMQ_QUANT_GGUF_ENC_H
