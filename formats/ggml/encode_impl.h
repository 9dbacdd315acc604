/*
 * formats/ggml/encode_impl.h — internal to formats/ggml/encode*.c: the shared searches of ggml's quantizers
 * and the per-type row encoders behind formats/ggml/encode.h. Not for use outside formats/ggml/encode*.c.
 *
 * Files:
 *   formats/ggml/encode.c         dispatch (llmq_gguf_encode_row_ref, _rows with threads, can_encode),
 *                      llmq_gguf_grid_nearest, block_grid / block_set_code dispatch
 *   formats/ggml/search.c    nearest_int and the scale searches shared by several types
 *   formats/ggml/encode_legacy.c  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
 *   formats/ggml/encode_k.c       Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
 *   formats/ggml/encode_iq4.c     IQ4_NL, IQ4_XS
 *   formats/ggml/encode_sse2.c    SSE2 fast paths of the legacy types (no importance), same bytes
 * Every function mirrors ggml-quants.c (llama.cpp as vendored by llama-cpp-python 0.3.36) in the
 * order of its floating-point operations, so the bytes are identical. Files are compiled with
 * -ffp-contract=off.
 */
#ifndef LLMQ_QUANT_GGUF_ENC_IMPL_H
#define LLMQ_QUANT_GGUF_ENC_IMPL_H

#include <stdint.h>

// ---- formats/ggml/search.c
int llmq_nearest_int(float fval); // ggml nearest_int: round half to even via the 1.5*2^23 trick, |fval| <= 4194303
float llmq_make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw);
float llmq_make_q3_quants(int n, int nmax, const float *x, int8_t *L, int do_rmse);
float llmq_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                            uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad);
float llmq_make_qkx3_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                            uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad);
float llmq_make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *quant_weights);

// ---- per-type row encoders: n elements (multiple of the block), qw NULL or (n) importance
void llmq_enc_q4_0(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q4_1(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q5_0(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q5_1(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q8_0(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q2_k(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q3_k(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q4_k(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q5_k(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_q6_k(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_iq4_nl(const float *x, void *y, int64_t n, const float *qw);
void llmq_enc_iq4_xs(const float *x, void *y, int64_t n, const float *qw);

// ---- formats/ggml/encode_sse2.c: SSE2 encoders without importance, the same bytes as the reference (NULL: none)
void (*llmq_enc_fast(int type))(const float *x, void *y, int64_t n, const float *qw);

// ---- per-type grids (see formats/ggml/encode.h): j is the element index inside the block
struct llmq_gguf_grid;
void llmq_grid_legacy(int type /* enum llmq_dtype */, const void *block, int j, struct llmq_gguf_grid *g);
void llmq_setq_legacy(int type, void *block, int j, int code);
void llmq_grid_k(int type, const void *block, int j, struct llmq_gguf_grid *g);
void llmq_setq_k(int type, void *block, int j, int code);
void llmq_grid_iq4(int type, const void *block, int j, struct llmq_gguf_grid *g);
void llmq_setq_iq4(int type, void *block, int j, int code);

#endif // LLMQ_QUANT_GGUF_ENC_IMPL_H
