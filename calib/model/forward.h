/*
 * calib/model/forward.h — the CPU forward pass of a LLaMA-family or Gemma decoder (calib/model/model.h), whole
 * sequences at once (prefill), in f32.
 *
 * What it computes, per block (as llama.cpp's llm_build_llama / llm_build_qwen2 / qwen3 with an f32 KV cache):
 *   h   = x + Wo · Attn(RoPE(Nq(Wq·n1 + bq)), RoPE(Nk(Wk·n1 + bk)), Wv·n1 + bv),   n1 = RMSNorm(x) * attn_norm
 *   out = h + Wdown · (SiLU(Wgate·n2) * (Wup·n2)),                        n2 = RMSNorm(h) * ffn_norm
 *   RMSNorm(x) = x / sqrt(mean(x²) + eps) (eps inside the sqrt, the sum of squares in double as ggml);
 *   Nq, Nk: qwen3 only (identity otherwise), RMSNorm of each head's Dh values times q_norm / k_norm
 *   (modeling_qwen3.py Qwen3Attention, llama.cpp models/qwen3.cpp), same eps;
 *   RoPE: pair i of a head (i < R/2, R = n_rot: Dh except for partial RoPE, formats/llama/arch.h "Phi-3") rotates
 *   by pos · theta^(-2i/R) (llama3 scaling applied to the frequency when enabled; LongRoPE's factors), pairs
 *   (2i, 2i+1) for LLMQ_ROPE_NORM, (i, i+R/2) for LLMQ_ROPE_NEOX; the head's values from R on pass unrotated;
 *   Attn: causal, grouped-query (query head h reads kv head h / (H/Hkv)), scores · 1/sqrt(Dh),
 *   softmax in f32 (max subtracted, sum in double). Then logits = output · (RMSNorm(x) * output_norm).
 *   gemma2 / gemma3 (modeling_gemma2.py / modeling_gemma3.py, llama.cpp src/models/gemma2.cpp, gemma3.cpp):
 *     x0 = embedding * sqrt(D) (f32); every norm weight is 1 + w (calib/model/model.h);
 *     h   = x + Npost_attn(Wo · Attn(...)),   out = h + Npost_ffw(Wdown · (GELU(Wgate·n2) * (Wup·n2)))
 *     with GELU tanh-approximated (gelu_pytorch_tanh), scores · query_pre_attn_scalar^-1/2, then
 *     s -> cap * tanh(s / cap) (gemma2's attn_softcap), keys limited to t - sliding_window < p <= t on the
 *     sliding layers (formats/llama/arch.h "Gemma"; a window >= the sequence changes nothing, not a bit),
 *     whose RoPE uses rope_theta_swa; the other layers' RoPE divides every angle by a linear scaling factor;
 *     logits -> cap * tanh(logits / cap) (final_softcap). The emulation modes (llmq_forward_set_emulate)
 *     also take GELU from ggml's f16 table (ggml-cpu vec.h ggml_vec_geglu_f32: f16(gelu(f16(x)))).
 *     Measured: within 1.3e-6 of max |logit| of transformers (tests/py/test_gemma.py).
 *   The sub-block functions below return the residual contributions (post norms included).
 *   RoPE angles follow ggml_rope_cache_init (theta_scale = base^(-2/R) multiplied pair by pair in
 *   f32). Measured: stories260K within 6.2e-6 of float64 reference logits; SmolLM2 f32 GGUF within
 *   8.3e-5 of llama.cpp's logits over 512 positions (tests/py/test_forward_oracle.py).
 *
 * How: a linear layer Y (n, R) = X (n, C) · Wᵀ splits W's R rows over the n_threads pthreads; each
 * thread converts its rows to f32 into a shared scratch (sized to the largest weight, never the
 * whole model) and runs ONE single-threaded cblas_sgemm over all n tokens on them. Attention runs
 * as tasks of (sequence, head, 64 query rows), each an sgemm for QKᵀ, the causal softmax, and an
 * sgemm for PV. Norms, RoPE and SwiGLU are split over the threads too. No per-token loops.
 * Side effect: while a call runs, OpenBLAS is set to one thread (openblas_set_num_threads) so that
 * our threads do not oversubscribe the cores; the previous count is restored before every hook
 * call and on return, so hooks may use multi-threaded BLAS.
 *
 * Memory (f32): the weight scratch (the largest block weight that is not f32 already — f32 weights
 * are used in place from the mapping — or a chunk of >= 4096 rows of the output head); activations
 * for max_tokens tokens (normed input, q, k, v, attention output, gate, up, sub-block output; plus the hidden state of
 * llmq_forward_logits, allocated by its first call); RoPE tables and one (64, seqlen) score block
 * per thread, grown to the longest sequence seen; f32 copies of the output norm and of the block in use's
 * norms and biases (converted from its weight set at every call). Logits go to the caller's buffer (peak RSS
 * measured: bench/README.md, forward_speed).
 *
 * Legend: n tokens in a call, D n_embd, V n_vocab, F n_ff, H / Hkv / Dh as in calib/model/model.h.
 *
 * Errors: LLMQ_ERR_ARG for n < 1, n > max_tokens, a token id outside [0, V), a layer out of range,
 * first_logit outside [0, n); LLMQ_ERR_NOMEM; a weight that cannot be converted
 * (LLMQ_ERR_UNSUPPORTED). Each is logged once. A forward object is not thread-safe (one caller at
 * a time), and the model must outlive it.
 */
#ifndef LLMQ_CALIB_FORWARD_H
#define LLMQ_CALIB_FORWARD_H

#include "calib/model/actq.h"
#include "calib/model/model.h"
#include "calib/model/moe.h"
#include "common/status.h"
#include "kernels/backend.h"

#include <stdint.h>

struct llmq_forward;

// Prepares buffers for calls of at most max_tokens tokens (summed over the sequences of a block
// call), using n_threads threads (< 1: 1). *out must be released with llmq_forward_free.
enum llmq_status llmq_forward_init(const struct llmq_model *m, int64_t max_tokens, int n_threads,
                                   struct llmq_forward **out);
void llmq_forward_free(struct llmq_forward *f); // NULL is a no-op
// Releases the pages of the weight scratch (rewritten before every read): between the calls of a job whose other
// buffers peak elsewhere (quantize's solves), so that the scratch does not add to that peak.
void llmq_forward_release_scratch(struct llmq_forward *f);

// Backend of the linear layers and the output head (kernels/gemm.h); LLMQ_BACKEND_CPU after init.
// With LLMQ_BACKEND_CUDA a product at or above the device threshold converts the weight's rows to
// f32 on the threads (as on the CPU), then runs as ONE device GEMM over all tokens and rows; smaller
// ones stay on the CPU path. Attention, norms, RoPE and SwiGLU always run on the CPU. Results differ
// from the CPU backend by float rounding only; a failed device call is returned by the pass.
void llmq_forward_set_backend(struct llmq_forward *f, enum llmq_backend be);

// Emulates llama.cpp's CPU-backend arithmetic from the next call on (calib/model/actq.h): the input of every
// product with a weight rounded once through the weight's vec_dot_type (Q8_0 / Q8_1 / Q8_K / F16 /
// BF16), K and V rounded to f16 after RoPE, and for LLMQ_EMULATE_LLAMACPP_CPU_NOFA also Q and the
// softmax probabilities. Applies to every pass (blocks, head, logits). The default, LLMQ_EMULATE_NONE,
// leaves the f32 arithmetic above unchanged bit for bit. Allocates (max_tokens, max(D, H*Dh, F))
// floats on the first mode other than NONE. LLMQ_ERR_ARG for an unknown mode, LLMQ_ERR_NOMEM.
enum llmq_status llmq_forward_set_emulate(struct llmq_forward *f, enum llmq_emulate e);

// Under LLMQ_EMULATE_LLAMACPP_CPU, the rows of the following block calls whose attention llama.cpp computes on
// flash attention's vector path (its path for a ubatch of fewer than 64 queries; calib/model/actq.h): rows[t] != 0
// for row t = s * seqlen + i of a call (sequence s, its row i), NULL for none (the default). Those rows read Q in
// f16 and accumulate V in f16 (forward.c favec_row); the others as before. rows must cover every row of each call
// made while it is set. LLMQ_ERR_ARG under another mode or for a head size over LLMQ_FAVEC_MAX_DH.
#define LLMQ_FAVEC_MAX_DH 512
enum llmq_status llmq_forward_set_favec_rows(struct llmq_forward *f, const uint8_t *rows);

// LongRoPE (phi3 rope_scaling "longrope" / "su"; formats/llama/arch.h "LongRoPE"): which factor set a pass uses.
// n_ctx 0 (the default): transformers' rule, the long factors for a sequence longer than
// original_max_position_embeddings (its prefix included), the short ones otherwise, chosen per call; n_ctx > 0:
// llama.cpp's rule, long for every sequence when n_ctx (llama.cpp's context per sequence) is longer. No effect for
// other models. LLMQ_ERR_ARG for n_ctx < 0.
enum llmq_status llmq_forward_set_rope_ctx(struct llmq_forward *f, int64_t n_ctx);

// One sequence of n tokens (tokens (n)) from position 0 (prefill, causal). Writes the logits of
// positions [first_logit, n) into logits: ((n - first_logit), V) floats, row-major.
enum llmq_status llmq_forward_logits(struct llmq_forward *f, const int32_t *tokens, int64_t n, int64_t first_logit,
                                     float *logits);

// ---- Block-by-block API (the calibration runner drives the model this way) ---------------------
// x is (n_seq * seqlen, D): n_seq independent causal sequences of seqlen tokens each, back to back,
// every sequence starting at position 0.

// x (n, D) = rows of the embedding for tokens (n).
enum llmq_status llmq_forward_embed(struct llmq_forward *f, const int32_t *tokens, int64_t n, float *x);

// Sees the input of the linear layers of a block: called with LLMQ_LIN_Q (the input shared by
// q/k/v), LLMQ_LIN_O, LLMQ_LIN_GATE (shared by gate/up) and LLMQ_LIN_DOWN, in that order, from the
// calling thread; in is (n, n_in) with n = n_seq * seqlen (n_in = D, H*Dh, D, F). in is valid only
// during the call.
typedef void (*llmq_linear_hook)(void *user, int layer, enum llmq_linear which, const float *in, int64_t n,
                                 int64_t n_in);

// The weights of a block call: ly, the block's weight set (its linears, norms, biases, router and experts;
// &m->layers[layer] for the model's own, or a set of the caller's with the same shapes, e.g. quant/quantize.h's
// block with its quantized linears or AWQ's folded copies). Everything is read through ly's views during the
// call: nothing of a block is kept between calls. A linear of ly that is not f32 and larger than the init-time
// scratch grows it. Errors as below, plus LLMQ_ERR_ARG for a NULL ly or a linear / norm whose shape differs
// from the model's block `layer`.

// Runs decoder block `layer` with the weights ly in place on x (n_seq * seqlen, D). hook may be NULL.
enum llmq_status llmq_forward_block(struct llmq_forward *f, int layer, const struct llmq_layer *ly, float *x,
                                    int64_t n_seq, int64_t seqlen, llmq_linear_hook hook, void *user);

// ---- Sequences that continue a shared prefix (calib/eval/tasks.h scores the choices of an item this way) -----
// Causal attention makes the keys and values of a prefix independent of what follows it, so a prefix shared
// by several sequences can run once (llmq_forward_block over the prefixes, its K/V kept layer by layer
// with llmq_forward_last_kv) and every continuation then runs alone against those rows.

// The keys and values of the last pass through a block (llmq_forward_block, llmq_forward_block_prefixed,
// llmq_forward_attn): *k, *v ((n_seq * seqlen), Hkv*Dh), rows in that call's token order; K after RoPE
// (and qwen3's k_norm), both as the attention read them (the emulation modes: rounded to f16). Owned by f,
// overwritten by the next pass.
void llmq_forward_last_kv(const struct llmq_forward *f, const float **k, const float **v);

// Runs block `layer` with the weights ly (as llmq_forward_block) in place on x (n_seq * seqlen, D), n_seq
// sequences of seqlen tokens, where sequence s continues a prefix of pre_len[s] >= 0 tokens whose keys and values at
// this layer are pre_k[s], pre_v[s]
// ((pre_len[s], Hkv*Dh) rows as llmq_forward_last_kv gave them; unread when pre_len[s] == 0): its token t
// sits at position pre_len[s] + t and attends to the prefix (within gemma's sliding window) and to its own
// tokens 0..t. Padding after a sequence's last token does not change its rows. The result is that of
// llmq_forward_block on the prefix and the sequence as one sequence, up to float rounding: the attention
// output sums the prefix's and the own keys' terms as two products (tests/unit/test_forward.c bounds the
// difference). No hook. Errors: those of llmq_forward_block; LLMQ_ERR_ARG for a negative pre_len or a NULL
// prefix pointer with pre_len > 0.
enum llmq_status llmq_forward_block_prefixed(struct llmq_forward *f, int layer, const struct llmq_layer *ly, float *x,
                                             int64_t n_seq, int64_t seqlen, const float *const *pre_k,
                                             const float *const *pre_v, const int64_t *pre_len);

// ---- Mixture of experts (mixtral, qwen3_moe, qwen2_moe: calib/model/moe.h) ---------------------------
// A moe block's MLP is the mixture: llmq_linear_hook sees LLMQ_LIN_GATE (the input of the router and every
// expert) but no LLMQ_LIN_DOWN, except qwen2_moe's, whose LLMQ_LIN_DOWN is its shared expert's down input
// (SiLU(gate_s) * up_s of every token; the shared expert is the block's dense gate / up / down, added after the
// routed sum with its sigmoid gate); the experts' inputs go to the expert hook set here (NULL: none), called from
// the calling thread with OpenBLAS's thread count restored, as the linear hook.
void llmq_forward_set_expert_hook(struct llmq_forward *f, llmq_expert_hook hook, void *user);
// The experts' weights from fn just before each product (llmq_moe_set_expert_source: a caller's decoded result or
// candidate in one reusable scratch; NULL: the weight set's views). No-op for a dense model. LLMQ_ERR_NOMEM.
enum llmq_status llmq_forward_set_expert_source(struct llmq_forward *f, llmq_expert_weight_fn fn, void *user);
// Every expert over every token for the expert hook (llmq_moe_set_calib_all); no-op for a dense model.
void llmq_forward_set_moe_calib_all(struct llmq_forward *f, bool all);
// (E) tokens routed to each expert in the last moe block run; NULL for a dense model. Owned by f.
const int64_t *llmq_forward_moe_counts(const struct llmq_forward *f);

// ---- Sub-block API (AWQ's scale search runs the attention and the MLP on their own) ------------
// The same code paths as llmq_forward_block, which computes (attn_norm, ffn_norm: ly's)
//     x += llmq_forward_attn(RMSNorm(x) * attn_norm);   x += llmq_forward_mlp(RMSNorm(x) * ffn_norm)
// with exactly these functions (the sums in f32, one add per element), so the pieces reproduce
// llmq_forward_block bit for bit (tests/unit/test_awq.c).

// out (n_seq * seqlen, D) = Wo · Attn(RoPE(Wq·xn + bq), RoPE(Wk·xn + bk), Wv·xn + bv) of block
// `layer` with the weights ly for the normed input xn (n_seq * seqlen, D) (not modified), n_seq * seqlen <=
// max_tokens; gemma: RMSNorm(that) * attn_post_norm. out must not alias xn. Errors as llmq_forward_block.
enum llmq_status llmq_forward_attn(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn,
                                   int64_t n_seq, int64_t seqlen, float *out);

// out (n, D) = Wdown · (SiLU(Wgate·xn) * (Wup·xn)) of block `layer` with the weights ly for xn (n, D) (not
// modified), 1 <= n <= max_tokens; gemma: RMSNorm(Wdown · (GELU(Wgate·xn) * (Wup·xn))) * ffn_post_norm; moe:
// the mixture (qwen2_moe: plus its gated shared expert). out must not alias xn.
enum llmq_status llmq_forward_mlp(struct llmq_forward *f, int layer, const struct llmq_layer *ly, const float *xn,
                                  int64_t n, float *out);

// y (n, D) = RMSNorm(x) * w for x (n, D), w (D) (the formula above). y may equal x. Any n >= 1
// (not limited by max_tokens).
enum llmq_status llmq_forward_rmsnorm(struct llmq_forward *f, const float *x, int64_t n, const float *w, float *y);

// logits (n, V) = output · (RMSNorm(x) * output_norm) for x (n, D). Any n >= 1 (processed in
// chunks of max_tokens).
enum llmq_status llmq_forward_head(struct llmq_forward *f, const float *x, int64_t n, float *logits);

#endif // LLMQ_CALIB_FORWARD_H
