/*
 * kernels/block.h — one decoder block of the plain LLaMA family (llama, mistral, qwen2 with q/k/v biases, qwen3 with
 * q/k norms) run where a backend computes, its weights uploaded once and its activations kept there across passes.
 *
 * What it computes (calib/model/forward.h's block for those families, with no emulation mode), on x (T, D) in place:
 *     xn = RMSNorm(x) · attn_norm;  q, k, v = Wq·xn (+ bq), Wk·xn (+ bk), Wv·xn (+ bv);  qwen3: q, k = per-head
 *     RMSNorm · q_norm / k_norm;  q, k = RoPE(q), RoPE(k);  att = causal GQA attention;  x += Wo·att;
 *     xn = RMSNorm(x) · ffn_norm;  x += Wdown · (SiLU(Wgate·xn) · (Wup·xn)).
 * Linears go through kernels/gemm.h llmq_gemm_dev_f32 (the same cblas call as forward.c on the CPU; cuBLAS in plain
 * FP32 on device pointers on CUDA), the rest through kernels/ops.h, all on one ops context (one stream on CUDA).
 * Optionally (LLMQ_BLOCK_SUM_GRAM) the block also accumulates XᵀX of the four linear inputs (the calibration
 * Hessians: q/k/v's, o's, gate/up's and down's) in float64 where it computes (see "Gram matrices"), and
 * (LLMQ_BLOCK_SUM_COLS) it sums Σ|x| and Σx² per column of those inputs in float64 (see "Column
 * sums"). Who calls it: `llmq eval` with --device cuda (calib/eval/eval_run.c, calib/eval/eval.h "Decoder blocks":
 * every layer of a batch of chunks through one block, its weights replaced layer by layer), the calibration runner
 * with --device cuda (calib/calib_run.c, calib/calib.h "Decoder blocks": every calibration sequence resident, each
 * layer's Gram and column sums downloaded once; `llmq calib`, and quantize's importance statistics);
 * calib/model/devblock.h fills it from a model; and the tests.
 * `llmq quantize` with --device cuda (calib/blocks.h: rtn's and gptq's passes and AWQ's scale search, the calibration
 * activations resident;
 * llmq_block_gather for the true-sequential statistics passes).
 * AWQ's scale search on the block path (calib/blocks.h, quant/awq.h "On the block path": llmq_block_attn_out /
 * _mlp_out). What it is not (yet): no gemma, phi3, moe, sliding window, softcap, linear RoPE scaling or llama.cpp
 * emulation (calib/model/devblock.h refuses those by name); no pinned staging or prefetch of the next block's weights;
 * FP32 by default, TF32 for the linears as an unmeasured experiment (llmq_block_set_tf32), no BF16 (issue 17 asks for
 * each to be measured first).
 *
 * Agreement:
 *   LLMQ_BACKEND_CPU gives the SAME BITS as llmq_forward_block (calib/model/forward.c, n_threads 1, OpenBLAS on one
 *   thread as inside a forward pass): the same cblas_sgemm calls, the same op code paths (kernels/ops.c is written
 *   as forward.c). tests/unit/test_block.c checks it on random tiny llama / qwen2 / qwen3 shaped models.
 *   LLMQ_BACKEND_CUDA differs by float rounding: tests/gpu/test_block_cuda.c compares it with the CPU block at the
 *   first-order bound of tests/block_tolerance.h (the per-op bounds of kernels/ops.h propagated through the block).
 * NOTHING OF THE CUDA HALF HAS RUN ON A GPU YET: it compiles and links (-DLLMQ_CUDA=ON) and its tests skip without
 * a device. Until tests/gpu/test_block_cuda.c (the block, its column-sum kernel), tests/gpu/test_eval_cuda.c (`llmq
 * eval --device cuda` through it), tests/gpu/test_calib_cuda.c (`llmq calib --device cuda`) and
 * tests/gpu/test_quantize_cuda.c (`llmq quantize --device cuda`) have passed on one, treat it as unverified.
 *
 * Residency: llmq_block_init allocates everything once — the weights (D·(Dq + 2 Dkv) + Dq·D + 3 D·F floats plus the
 * norms and biases), the activations for max_tokens tokens (T·(2 D + 2 Dq + 2 Dkv + 2 F) floats: the caller picks
 * max_tokens to fit, e.g. 16 sequences of 2048 for an 8B shape is 2.6 GiB), the RoPE tables for max_seqlen
 * positions (computed on the host once) and the sums asked for (Gram matrices, column sums); a forward pass allocates
 * nothing (the CPU attention's score scratch, kernels/ops.h, grows once to the longest sequence). Weights stay until
 * replaced by llmq_block_set_weight (e.g. a solved linear before the next pass); x is the caller's buffer on the
 * block's backend (llmq_ops_buf_alloc on llmq_block_ops), so it stays on the device across passes and blocks.
 * Asynchrony (CUDA): set_weight copies from pageable memory (staged before it returns) and the forward pass queues
 * its work; llmq_ops_sync / llmq_ops_download on llmq_block_ops(b) wait for it and report a failed kernel.
 *
 * Gram matrices (LLMQ_BLOCK_SUM_GRAM at init): llmq_block_forward(..., accumulate = true) adds, for each of the four
 * inputs X (T, C) (C = D, Dq, D, F), XᵀX to the upper triangle of a float64 (C, C) sum kept where the block
 * computes, exactly as kernels/gemm.h llmq_gram_acc_f64 does it: micro-batches of LLMQ_GRAM_MICRO_BATCH rows
 * multiplied in f32, summed in f64. Why f32 products and f64 sums: it is the CPU calibration's arithmetic, so the
 * CPU backend gives the calibration's bits (it calls llmq_gram_acc_f64 itself), and on the device the f32 error of
 * one micro-batch (at most 256 u relative to Σ|x_i x_j|) does not grow with the token count (an f32 sum over
 * 128 × 2048 tokens could lose up to N u ≈ 1.6% in the worst case; the f64 sums add about 2^-53 per batch). The
 * device computes a whole micro-batch as one SYRK into a (C, C) f32 scratch (no column tiles: an 8B model's down
 * input makes it 0.8 GiB), so for C > LLMQ_GRAM_TILE_FROM its f32 products are summed in another order than the
 * CPU's tiled GEMMs: within the same bound, not the same bits. llmq_block_gram_download copies one sum to the host
 * (once per block); llmq_block_sums_zero clears every sum.
 *
 * Column sums (LLMQ_BLOCK_SUM_COLS at init): accumulate also adds, per column c of each input X (T, C),
 * Σ_t |x_tc| and Σ_t x_tc² in float64, the rows in order (acc = acc + |(double)x|, acc = acc + (double)x·(double)x:
 * the product of two floats is exact in a double), exactly calib/calib.c's loop for the statistics' sum_abs /
 * sum_sq, so the same inputs give the same bits on both backends (the device kernel, one thread per column, adds
 * in the same order without FMA contraction; llmq_block_colsums_cpu is its reference). Why not the Gram diagonal
 * for Σx²: that is f32 products of 256-row micro-batches rounded to f32 before the f64 sum, not the statistic's
 * bits. The same pass notes the first non-finite value of each input (its row, counted over the passes since the
 * last llmq_block_sums_zero, and column), which llmq_block_colsums_download reports: the calibration's NaN / Inf
 * check. Cost on the device: the kernel reads the input once more (T·C floats) with only C threads (a latency-bound
 * loop of T steps each; not measured: no GPU run yet), next to the SYRK's C²·T multiply-adds.
 *
 * Errors (each logged once): LLMQ_ERR_ARG for a bad shape, an unknown sums flag, a weight not loaded (named), T >
 * max_tokens or seqlen > max_seqlen, x too small or on another backend, sums asked of (or downloaded from) a block
 * made without them; LLMQ_ERR_DEVICE when CUDA is missing or fails; LLMQ_ERR_NOMEM. A non-finite input is not an
 * error of the block: the column sums report where it is (llmq_block_colsums_download).
 * A block is not thread-safe.
 *
 * Legend: T tokens (n_seq sequences of seqlen, back to back, each from position 0), D n_embd, F n_ff, H / Hkv
 * heads, Dh head_dim, Dq = H·Dh, Dkv = Hkv·Dh. Weights row-major f32, W[out, in].
 */
#ifndef LLMQ_KERNELS_BLOCK_H
#define LLMQ_KERNELS_BLOCK_H

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

#include <stdbool.h>
#include <stdint.h>

// The block's weights. The seven linears come first, in the order of formats/llama/arch.h enum llmq_linear.
enum llmq_block_weight {
    LLMQ_BLOCK_WQ,        // (Dq, D)
    LLMQ_BLOCK_WK,        // (Dkv, D)
    LLMQ_BLOCK_WV,        // (Dkv, D)
    LLMQ_BLOCK_WO,        // (D, Dq)
    LLMQ_BLOCK_WGATE,     // (F, D)
    LLMQ_BLOCK_WUP,       // (F, D)
    LLMQ_BLOCK_WDOWN,     // (D, F)
    LLMQ_BLOCK_ATTN_NORM, // (D)
    LLMQ_BLOCK_FFN_NORM,  // (D)
    LLMQ_BLOCK_BQ,        // (Dq)  qkv_bias only
    LLMQ_BLOCK_BK,        // (Dkv) qkv_bias only
    LLMQ_BLOCK_BV,        // (Dkv) qkv_bias only
    LLMQ_BLOCK_Q_NORM,    // (Dh)  qk_norm only
    LLMQ_BLOCK_K_NORM,    // (Dh)  qk_norm only
    LLMQ_BLOCK_WEIGHT_COUNT
};

// The Gram matrices: the inputs of q/k/v, o, gate/up, down (formats/llama/arch.h's LLMQ_LIN_Q, O, GATE, DOWN); the
// column sums are indexed by the same input.
enum llmq_block_gram { LLMQ_BLOCK_GRAM_QKV, LLMQ_BLOCK_GRAM_O, LLMQ_BLOCK_GRAM_GATE, LLMQ_BLOCK_GRAM_DOWN };
#define LLMQ_BLOCK_GRAM_COUNT 4
#define LLMQ_BLOCK_INPUTS_ALL 0xfu // a mask of inputs (bit 1u << g for input g): all four (llmq_block_gather)

// The sums a block gathers over its passes with accumulate (flags of llmq_block_init's sums; 0: none).
#define LLMQ_BLOCK_SUM_GRAM 1u // XᵀX of the four inputs ("Gram matrices")
#define LLMQ_BLOCK_SUM_COLS 2u // Σ|x|, Σx² per column of the four inputs and their first non-finite value

struct llmq_block_shape {
    int64_t n_embd, n_ff, n_head, n_head_kv, head_dim; // D, F, H, Hkv, Dh (Dh even)
    float rms_eps;
    float attn_scale;     // scores · attn_scale (1/sqrtf(Dh))
    bool rope_neox;       // pairs (i, i + Dh/2); false: (2i, 2i+1)
    float rope_theta;     // RoPE base
    const float *rope_ff; // (Dh/2) frequency divisors (llama3 scaling; all 1 otherwise); copied by init
    bool qkv_bias;        // qwen2: q, k, v biases
    bool qk_norm;         // qwen3: per-head RMSNorm of q and k before RoPE (eps rms_eps)
};

struct llmq_block;

// A block for sequences of at most max_seqlen tokens and passes of at most max_tokens tokens on backend be (CUDA:
// device 0), gathering the sums of sums (LLMQ_BLOCK_SUM_* flags; LLMQ_ERR_ARG for another bit). *out = NULL on
// error.
enum llmq_status llmq_block_init(enum llmq_backend be, const struct llmq_block_shape *s, int64_t max_tokens,
                                 int64_t max_seqlen, unsigned sums, struct llmq_block **out);
void llmq_block_free(struct llmq_block *b); // NULL is a no-op

// Bytes that llmq_block_init(be, s, max_tokens, max_seqlen, sums) allocates where the block computes (weights,
// activations, RoPE tables, the sums and the Gram scratch; not the CUDA context, cuBLAS's workspace or the caller's
// x): what a caller sizes a pass by before it asks for the block (calib/eval/eval_run.c's batch of chunks,
// calib/calib_run.c's resident calibration set).
int64_t llmq_block_bytes(enum llmq_backend be, const struct llmq_block_shape *s, int64_t max_tokens, int64_t max_seqlen,
                         unsigned sums);

// The block's ops context: allocate x there (llmq_ops_buf_alloc), upload / download it, wait for the block's work.
struct llmq_ops *llmq_block_ops(struct llmq_block *b);

// on: the block's linears (not the Gram sums) on TF32 tensor cores from the next pass on (kernels/gemm.h
// llmq_gemm_dev_set_tf32); off (the default): FP32. LLMQ_ERR_UNSUPPORTED for on with a CPU block. EXPERIMENTAL:
// NOT RUN ON A GPU, its effect on perplexity unmeasured (issue 17 asks for the measurement before any default);
// the tolerances of tests/gpu/test_block_cuda.c are FP32's and do not hold for it.
enum llmq_status llmq_block_set_tf32(struct llmq_block *b, bool on);

// Floats of weight w for the block's shape (0 for a bias or q/k norm the shape does not have).
int64_t llmq_block_weight_size(const struct llmq_block *b, enum llmq_block_weight w);

// Uploads weight w from host (llmq_block_weight_size floats, row-major f32): kept until replaced. LLMQ_ERR_ARG for a
// weight the shape does not have.
enum llmq_status llmq_block_set_weight(struct llmq_block *b, enum llmq_block_weight w, const float *host);

// Runs the block in place on x (n_seq · seqlen, D), a buffer on the block's backend (a view into a larger one, e.g.
// one micro-batch of a resident calibration set). accumulate (blocks made with sums only): also adds the four
// inputs to the sums the block was made with.
enum llmq_status llmq_block_forward(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                    bool accumulate);

// The sums of the inputs in the mask `inputs` (bits 1u << g; LLMQ_BLOCK_INPUTS_ALL) over x (n_seq · seqlen, D), a
// buffer as llmq_block_forward's that is only READ: the block runs only as far as the last input of the mask needs
// (the q/k/v input: the attention RMSNorm alone; o's: up to the attention; gate/up's: the attention half and the
// ffn RMSNorm; down's: all but the down projection), the residual of the attention half into the block's own
// buffer. What quantize's true-sequential statistics passes need (quant/quantize.h "Decoder blocks"): one input's
// sums with the linears solved so far in place, no copy of x. The same bits as llmq_block_forward(..., true) gives
// for those inputs (h = x + Wo·att is formed as Wo·att + x, an IEEE add: commutative). LLMQ_ERR_ARG for an empty
// mask or unknown bits and as llmq_block_forward (a block made without sums).
enum llmq_status llmq_block_gather(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                   unsigned inputs);

// The block's two halves on their own, in place on x (n_seq · seqlen, D) as llmq_block_forward runs them one after the
// other (the same bits): llmq_block_attn x += Wo · Attn(...) with the sums of its inputs in the mask (q/k/v's, o's;
// 0: none); llmq_block_ffn with apply x += MLP(x), without it x is only read and the half stops after the last input
// of the mask (gate/up's, down's), summing them. What quantize's true-sequential passes use after the attention is
// solved (calib/blocks.h): x replaced by the attention half's output once, then the feed-forward inputs gathered
// from it and the output pass only the feed-forward half (the attention is not computed again). LLMQ_ERR_ARG for
// inputs of the other half, for llmq_block_ffn without apply or inputs, and as llmq_block_forward.
enum llmq_status llmq_block_attn(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                 unsigned inputs);
enum llmq_status llmq_block_ffn(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                unsigned inputs, bool apply);

// The two halves' outputs without the residual (what AWQ's scale search compares, quant/awq.h): llmq_block_attn_out
// out (T, D) = Wo · Attn(RMSNorm(x) · attn_norm, ...) with x (T, D) only read; llmq_block_mlp_out out (T, D) =
// Wdown · (SiLU(Wgate·xn) · (Wup·xn)), xn = RMSNorm(h) · ffn_norm, with h (T, D) only read. The sums of the half's
// inputs in the mask are gathered on the way (0: none). The same bits as calib/model/forward.h llmq_forward_attn /
// llmq_forward_mlp on the normalised input (the CPU backend), and as the values llmq_block_forward adds to x. out is a
// buffer on the block's backend of at least T · D floats, overlapping nothing. Errors as llmq_block_attn / _ffn.
enum llmq_status llmq_block_attn_out(struct llmq_block *b, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                                     unsigned inputs, const struct llmq_ops_buf *out);
enum llmq_status llmq_block_mlp_out(struct llmq_block *b, const struct llmq_ops_buf *h, int64_t n_seq, int64_t seqlen,
                                    unsigned inputs, const struct llmq_ops_buf *out);

// n rows first, first + step, ... (each < the last pass's T; step >= 1) of input g (C wide) as the last pass left it,
// into host (n, C) by one strided copy:
// the q/k/v input after an attention half (llmq_block_attn_out, _attn, _forward's ffn half overwrites it with the
// gate/up input), o's after an attention half, gate/up's and down's after a feed-forward half (llmq_block_mlp_out,
// _ffn, _forward). Waits for the block's work. AWQ's clip search samples its tokens so.
enum llmq_status llmq_block_input_rows(struct llmq_block *b, enum llmq_block_gram g, int64_t first, int64_t step,
                                       int64_t n, float *host);

// Weight w's buffer where the block computes (llmq_block_weight_size floats), marked loaded: for a caller that writes
// it with ops of its own (AWQ's candidates, kernels/ops.h llmq_ops_awq_candidate) instead of llmq_block_set_weight.
// An empty buffer for a weight the shape does not have.
struct llmq_ops_buf llmq_block_weight_buf(struct llmq_block *b, enum llmq_block_weight w);

// The width C of Gram matrix g (D, Dq, D, F).
int64_t llmq_block_gram_dim(const struct llmq_block *b, enum llmq_block_gram g);
// acc (C, C) f64 on the host += the block's sum g, upper triangle (j >= i) only (the strict lower triangle is left).
// Waits for the block's work. LLMQ_ERR_ARG on a block without LLMQ_BLOCK_SUM_GRAM.
enum llmq_status llmq_block_gram_download(struct llmq_block *b, enum llmq_block_gram g, double *acc);
// H (C, C) f32, a buffer where the block computes (llmq_ops_buf_alloc on llmq_block_ops, at least C² floats), every
// element = (float)(scale · G_ij) with G the block's Gram sum g made symmetric (the upper triangle's
// G_min(i,j),max(i,j)): calib/calib.h llmq_calib_hessian's arithmetic (scale 2 / n_seq, one f64 product rounded to
// f32), so the same bits as gram_download + llmq_calib_stats_finish + llmq_calib_hessian. On CUDA the conversion runs
// on the device (queued): a caller downloads only the f32 matrix (half the bytes of the f64 sums, no host pass over
// them) and can keep it there for products (calib/blocks.h's error sums). LLMQ_ERR_ARG on a block without
// LLMQ_BLOCK_SUM_GRAM or for H too small or on another backend.
enum llmq_status llmq_block_hessian(struct llmq_block *b, enum llmq_block_gram g, double scale,
                                    const struct llmq_ops_buf *H);
// Input g's column sums onto the host: sum_abs (C) += Σ|x|, sum_sq (C) += Σx² (f64), and *bad = t·C + c of its
// first non-finite value in row-major order (t: the row counted over every pass since the last
// llmq_block_sums_zero), -1 when all were finite. Waits for the block's work. LLMQ_ERR_ARG on a block without
// LLMQ_BLOCK_SUM_COLS.
enum llmq_status llmq_block_colsums_download(struct llmq_block *b, enum llmq_block_gram g, double *sum_abs,
                                             double *sum_sq, int64_t *bad);
// Zeroes every sum the block gathers (the Gram upper triangles, the column sums, the non-finite marks, the row
// count). LLMQ_ERR_ARG on a block made without sums.
enum llmq_status llmq_block_sums_zero(struct llmq_block *b);

// ---- internal: the column sums' reference and the device half of the sums (kernels/block_cuda.cu;
// kernels/block_cuda_stub.c without CUDA), exposed for tests/gpu/test_block_cuda.c.
// acc (2, C) f64 (Σ|x| then Σx²) += the rows of x (n, C) in order, as "Column sums"; *bad = min(*bad, (row0 + t)·C + c)
// over the non-finite x_tc (UINT64_MAX: none yet). The device kernel gives the same bits on the same x.
void llmq_block_colsums_cpu(const float *x, int64_t n, int64_t C, int64_t row0, double *acc, uint64_t *bad);
enum llmq_status llmq_block_cuda_colsums(void *stream, const float *x, int64_t n, int64_t C, int64_t row0, double *acc,
                                         uint64_t *bad);
// acc (C, C) f64 += scratch (C, C) f32 on the upper triangle, queued on stream; zero: acc = 0 (n doubles).
enum llmq_status llmq_block_cuda_acc_upper(void *stream, double *acc, const float *scratch, int64_t C);
enum llmq_status llmq_block_cuda_zero(void *stream, double *acc, int64_t n);
// H (C, C) f32 = (float)(scale · acc) on the whole square from acc's upper triangle, queued on stream.
enum llmq_status llmq_block_cuda_hessian(void *stream, const double *acc, int64_t C, double scale, float *H);

#endif // LLMQ_KERNELS_BLOCK_H
