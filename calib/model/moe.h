/*
 * calib/model/moe.h — the mixture-of-experts MLP of a block (mixtral, qwen3_moe), as the forward pass
 * (calib/model/forward.h) runs it in place of the dense MLP.
 *
 * What it computes, for the normed MLP input xn (n, D) of block `layer` (formats/llama/arch.h "Mixture of experts";
 * transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock, llama.cpp llama-graph.cpp build_moe_ffn):
 *   logits (n, E) = xn · routerᵀ; p = softmax per token in f32 (max subtracted, sum in double);
 *   the K largest p (scanning experts 0..E-1, a later expert replaces an earlier one only when strictly larger:
 *   ties go to the lower index); w = p / (sum of the K) when norm_topk_prob, else p;
 *   out[t] = sum over experts x in index order of w_tx * Wdown_x · (SiLU(Wgate_x · xn[t]) * (Wup_x · xn[t])),
 *   the sum taken in f32 in expert order as transformers' index_add_ loop does.
 * Only the experts some token is routed to are computed, each over just its tokens (gathered into one
 * matrix): an expert's weights are converted to f32 by the linear callback one weight at a time, never the
 * whole block. An expert source (llmq_moe_set_expert_source) may supply a weight instead, just before its product,
 * written into one reusable (Fe, D) scratch: a caller's quantized result or search candidate, decoded per use. With
 * llmq_moe_set_calib_all, every expert also runs over every token so that the expert hook sees all of them
 * (llm-compressor's calibrate_all_experts); out still sums the routed experts' outputs only.
 *
 * What it is not: no threads of its own (the linear callback parallelises), no dense MLP.
 * Legend: n tokens, D n_embd, E n_expert, K n_expert_used, Fe n_ff_exp, T max_tokens.
 * Memory: (T, E) logits, (T, K) choices, (T, 2 D + 2 Fe) floats of per-expert activations, allocated at init;
 * with an expert source, Fe * D floats of weight scratch.
 */
#ifndef LLMQ_CALIB_MOE_H
#define LLMQ_CALIB_MOE_H

#include "calib/model/model.h"
#include "common/status.h"

#include <stdbool.h>
#include <stdint.h>

struct llmq_moe;

// Y (n, R) = X (n, C) · Wᵀ for a weight W (R, C) of any dtype (the forward pass's linear: threads, backend and
// emulation included). ctx is the caller's.
typedef enum llmq_status (*llmq_moe_linear_fn)(void *ctx, const struct llmq_tensor_view *w, const float *X, int64_t n,
                                               float *Y);

// Sees the input of expert `expert`'s linears in block `layer`: which is LLMQ_LIN_GATE (the rows of xn routed
// to it, shared by gate and up; n_in = D) or LLMQ_LIN_DOWN (SiLU(gate) * up of those rows; n_in = Fe). in is
// (n, n_in), valid during the call only; n >= 1 (an expert no token reaches is not called).
typedef void (*llmq_expert_hook)(void *user, int layer, int expert, enum llmq_linear which, const float *in, int64_t n,
                                 int64_t n_in);

// Supplies expert `expert`'s weight `which` (LLMQ_LIN_GATE, UP or DOWN) of block `layer` just before its product; w
// is the weight set's view (R, C). Either leaves *filled false (the product reads w), or writes the (R, C) weights in
// f32 into scratch (Fe * D floats, rewritten by the next call) and sets *filled. Errors: the source's (logged by it).
typedef enum llmq_status (*llmq_expert_weight_fn)(void *user, int layer, int expert, enum llmq_linear which,
                                                  const struct llmq_tensor_view *w, float *scratch, bool *filled);

// Scratch for calls of at most max_tokens tokens of a moe model hp. *out: llmq_moe_free. LLMQ_ERR_NOMEM.
enum llmq_status llmq_moe_init(const struct llmq_hparams *hp, int64_t max_tokens, struct llmq_moe **out);
void llmq_moe_free(struct llmq_moe *s); // NULL is a no-op

// From the next call on: every expert over every token for the hook (true), or only its routed tokens (false,
// the default). The block output sums the routed experts' rows either way; those rows come from a product over
// more rows under `all`, so they may differ from the routed-only ones by float rounding (BLAS blocking).
void llmq_moe_set_calib_all(struct llmq_moe *s, bool all);

// From the next call on, the experts' weights come through fn (NULL: the weight set's views, the default).
// LLMQ_ERR_NOMEM (the scratch).
enum llmq_status llmq_moe_set_expert_source(struct llmq_moe *s, llmq_expert_weight_fn fn, void *user);

// out (n, D) = the mixture of block `layer` (ly: its router and experts) for xn (n, D), 1 <= n <= max_tokens
// (out must not alias xn). hook may be NULL. Errors: those of lin (logged by it).
enum llmq_status llmq_moe_ffn(struct llmq_moe *s, const struct llmq_hparams *hp, const struct llmq_layer *ly, int layer,
                              const float *xn, int64_t n, float *out, llmq_moe_linear_fn lin, void *lin_ctx,
                              llmq_expert_hook hook, void *user);

// Tokens routed to each expert by the last llmq_moe_ffn call: (E) counts, owned by s.
const int64_t *llmq_moe_counts(const struct llmq_moe *s);

#endif // LLMQ_CALIB_MOE_H
