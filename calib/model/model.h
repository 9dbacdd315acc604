/*
 * calib/model/model.h — a LLaMA-family decoder (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral,
 * qwen3_moe, qwen2_moe) opened from a
 * GGUF file or a Hugging Face directory, as hyper-parameters plus non-owning views of its weights.
 *
 * What it is: the loader that reads the architecture description (GGUF `<arch>.*` metadata, or
 * config.json), finds every tensor under its name in that source, checks every shape against the
 * hyper-parameters, and loads the tokenizer (calib/tokenizer/tokenizer.h) from the same source. Weights stay
 * inside the read-only mappings of formats/gguf.h / formats/safetensors.h: nothing is converted
 * while loading, and memory stays at the size of the file mapping — except for AWQ / GPTQ
 * directories, whose packed linears are dequantized to f32 on load (see "Quantized HF
 * directories"). llmq_model_weight_f32 converts ONE weight to f32 when a consumer
 * (calib/model/forward.h, quant/) needs it.
 * What it is not: no compute (calib/model/forward.h), no writing (formats/convert/convert.h, quant/export.h).
 *
 * Legend: V n_vocab, D n_embd, F n_ff, L n_layer, H n_head, Hkv n_head_kv, Dh head_dim.
 *
 * ---- Tensors ----------------------------------------------------------------------------------
 *   Names and shapes: the table of formats/llama/arch.h (GGUF and HF spelling of every tensor).
 *
 * ---- Hyper-parameters ---------------------------------------------------------------------------
 *   Read by formats/llama/arch.h (llmq_hparams_from_gguf / llmq_hparams_from_hf_config: every key, its
 *   default and its checks are in its "Hyper-parameters" table), with n_ctx_train 0 when the file does
 *   not say. On top of that, the loader:
 *     refuses linear rope scaling and attention_bias (an o_proj bias): LLMQ_ERR_UNSUPPORTED;
 *     GGUF: takes llama3 scaling from the tensor rope_freqs.weight (n_rot/2 f32 divisors written by
 *     convert_hf_to_gguf.py), which becomes model->rope_freqs;
 *     HF: takes n_vocab from model.embed_tokens.weight (vocab_size, when present, must agree); the
 *     weights from model.safetensors, model.safetensors.index.json, or the only *.safetensors file.
 *   sliding_window (mistral, qwen2) is ignored: attention is fully causal, which is exact for
 *   sequences no longer than the window. gemma2 / gemma3 honour theirs (calib/model/forward.h).
 *   phi3: qkv_proj / attn_qkv and gate_up_proj / ffn_up (formats/llama/arch.h "Phi-3") are split into row
 *   ranges: layers[l].w[Q, K, V] and w[GATE, UP] are views of consecutive rows of the fused tensor (m->slices,
 *   no copy); m->fused holds the stored tensors themselves (llmq_model_stored_linear). An AWQ / GPTQ directory of
 *   phi3 (as `llmq quantize` writes it: quant/export.h "Fused linears") has one packed qkv_proj and gate_up_proj per
 *   block: each is dequantized on load into an owned F32 view and split the same way.
 *   Gemma norms: every norm view holds the weights the forward pass multiplies by, 1 + w (formats/llama/arch.h
 *   "Gemma"): a GGUF stores them so; for an HF directory the loader makes owned F32 copies of 1 + w
 *   (m->shifted; (D) or (Dh) floats per norm, computed in f32), and the HF writers store them minus 1. rope_type: NORM
 * for a GGUF llama / mistral (llama.cpp permutes q/k rows so adjacent pairs rotate), NEOX otherwise.
 *
 * ---- Mixture of experts (mixtral, qwen3_moe: formats/llama/arch.h "Mixture of experts") -------------
 *   layers[l].router is the (E, D) router; layers[l].exps[3 * x + {0, 1, 2}] are expert x's gate, up and down
 *   as 2-D views: in a GGUF, row ranges of the stacked (E, Fe, D) / (E, D, Fe) tensors (m->exp_slices, no copy);
 *   in an HF directory, the per-expert tensors. w[GATE], w[UP], w[DOWN] are NULL. Nothing is converted on load:
 *   the forward pass converts one expert's weight at a time, only for experts some token is routed to.
 *   AWQ / GPTQ directories of these families (as llmq writes them: quant/export.h llmq_export_expert) are read with
 *   every expert's packed linear dequantized on load into an owned F32 view, as the dense linears are.
 *   An HF directory's router and experts are read in either spelling of formats/llama/arch.h (enum
 *   llmq_expert_names; mixtral: block_sparse_moe.experts.X.w1 or, as `llmq quantize --expert-names gptqmodel`
 *   writes it for GPTQModel, mlp.experts.X.gate_proj): block 0's router decides (the Hub's when it is there, else
 *   GPTQModel's), m->expert_names records it, and every block must then have that spelling (missing tensor errors
 *   name the decided one).
 *   qwen2_moe (formats/llama/arch.h "Qwen2-MoE's shared expert"): w[GATE], w[UP], w[DOWN] are the shared expert
 *   ((Fs, D), (Fs, D), (D, Fs); a quantized directory's packed mlp.shared_expert.*_proj dequantized like the dense
 *   linears) and layers[l].shexp_gate its gate, a (1, D) view of ffn_gate_inp_shexp whether the file stores it as
 *   (1, D) or (D) (m->shexp_views).
 *
 * ---- Quantized HF directories (the outputs of `llmq quantize`, AutoAWQ, AutoGPTQ, GPTQModel) ---
 *   config.json "quantization_config" decides (absent or null: a plain model, which includes
 *   llmq's --format fake outputs; any other quant_method: LLMQ_ERR_UNSUPPORTED naming it):
 *     quant_method "awq" (version "gemm" or absent; bits 4; group_size > 0): per linear <p>.qweight
 *       I32 [C, R/8], <p>.qzeros I32 [C/G, R/8], <p>.scales [C/G, R] (quant/export.h "--format awq").
 *     quant_method "gptq" (bits 2, 3, 4, 8; group_size > 0 or -1; checkpoint_format "gptq" (default)
 *       or "gptq_v2"): <p>.qweight I32 [C*b/32, R], <p>.qzeros I32 [ng, R*b/32], <p>.scales [ng, R],
 *       <p>.g_idx I32 [C] (absent: c / G) (quant/export.h "--format gptq"); v1 zeros are stored + 1
 *       as the GPTQ kernels do (no masking, so a v1 asym zero of 0 comes back as 2^b, like theirs).
 *   A linear with a plain <p>.weight is used as is (modules_to_not_convert). The others are
 *   dequantized WHILE LOADING, with the same rule in both formats, in f32:
 *       W[r, c] = (float)(q - z) * (float)s        q, z integers; s the stored scale widened to f32
 *   (one rounding: the product), into owned F32 views that m->layers[l].w[k] point at.
 *   Memory: unlike every other model, 4 bytes per linear weight are allocated (about 8x the packed
 *   4-bit size; SmolLM2-135M: 425 MB), held until llmq_model_free; m->quant says so. Loading costs
 *   one pass over the packed tensors, output rows split over up to 16 threads (one per online
 *   CPU; the result does not depend on the split). Errors: a missing / mis-shaped quantized
 *   tensor is LLMQ_ERR_NOT_FOUND / LLMQ_ERR_CORRUPT naming it; a g_idx entry outside [0, ng) is
 *   LLMQ_ERR_CORRUPT.
 *
 * ---- Errors --------------------------------------------------------------------------------------
 *   Every failure logs one line naming the file and what is wrong, and returns:
 *     path neither a file nor a directory / no config.json         LLMQ_ERR_NOT_FOUND
 *     config.json not JSON / a key of the wrong type               LLMQ_ERR_CORRUPT
 *     unknown architecture / model_type / rope scaling type        LLMQ_ERR_UNSUPPORTED
 *     a required key or tensor missing                              LLMQ_ERR_NOT_FOUND ("... missing key X")
 *     a tensor whose shape differs from the hyper-parameters        LLMQ_ERR_CORRUPT (expected vs actual)
 *     a weight dtype that cannot be converted to f32                LLMQ_ERR_UNSUPPORTED
 *     hyper-parameters out of range (n_head not dividing, ...)      LLMQ_ERR_CORRUPT
 *   plus what formats/gguf.h, formats/safetensors.h and calib/tokenizer/tokenizer.h return (truncated files:
 *   LLMQ_ERR_TRUNCATED from the file readers).
 */
#ifndef LLMQ_CALIB_MODEL_H
#define LLMQ_CALIB_MODEL_H

#include "common/status.h"
#include "common/tensor.h"
#include "formats/llama/arch.h"

#include <stdbool.h>
#include <stdint.h>

struct llmq_gguf;
struct llmq_st_model;
struct llmq_tokenizer;

// One decoder block's weights, a weight set: in m->layers, views owned by the model's file object; a set of a
// caller's own (quant/quantize.h's block with its quantized linears, quant/awq.h's folded copies) has the same
// shapes on views of its own, and is what calib/model/forward.h and quant/writer.h take explicitly.
struct llmq_layer {
    const struct llmq_tensor_view *attn_norm, *ffn_norm; // (D) RMSNorm weights
    const struct llmq_tensor_view *w[LLMQ_LIN_COUNT];    // W[out, in], shapes in the table above
    const struct llmq_tensor_view *bq, *bk, *bv;         // (H*Dh), (Hkv*Dh); NULL unless qwen2
    const struct llmq_tensor_view *q_norm, *k_norm;      // (Dh) per-head RMSNorm weights; NULL unless qwen3 / gemma3
    const struct llmq_tensor_view *attn_post_norm, *ffn_post_norm; // (D) gemma: after attention / the MLP; else NULL
    // moe families (w[GATE], w[UP], w[DOWN] are NULL there): see "Mixture of experts"
    const struct llmq_tensor_view *router;      // (E, D) ffn_gate_inp; NULL unless moe
    const struct llmq_tensor_view *const *exps; // (E, 3) expert x's gate (Fe, D), up (Fe, D), down (D, Fe); or NULL
    // qwen2_moe: w[GATE], w[UP], w[DOWN] are the shared expert's (Fs, D), (Fs, D), (D, Fs), and its gate:
    const struct llmq_tensor_view *shexp_gate; // (1, D) ffn_gate_inp_shexp; NULL unless qwen2_moe
};

// Block L's linear `which`, or (expert >= 0; which GATE, UP or DOWN of a moe block) expert `expert`'s; NULL when the
// block has no such weight (a moe block's dense gate / up / down, except qwen2_moe's shared expert).
static inline const struct llmq_tensor_view *llmq_layer_linear(const struct llmq_layer *L, int which, int64_t expert) {
    if (expert < 0) return L->w[which];
    return L->exps && which >= LLMQ_LIN_GATE ? L->exps[3 * expert + (which - LLMQ_LIN_GATE)] : NULL;
}

struct llmq_model {
    struct llmq_hparams hp;
    const struct llmq_tensor_view *tok_embd;    // (V, D)
    const struct llmq_tensor_view *output_norm; // (D)
    const struct llmq_tensor_view *output;      // (V, D); == tok_embd when tied
    struct llmq_layer *layers;                  // (n_layer)
    struct llmq_tokenizer *tok;                 // owned; NULL only if the tokenizer module is absent
    const char *path;                           // owned copy of the path given to llmq_model_load
    bool from_gguf;
    const struct llmq_gguf *gguf;              // owned; NULL for HF
    const struct llmq_st_model *st;            // owned; NULL for GGUF
    const char *arch_name;                     // "llama", "mistral", ..., "gemma3" (static string)
    const struct llmq_tensor_view *rope_freqs; // (n_rot/2) GGUF rope_freqs.weight (llama3 factors); else NULL
    const struct llmq_model_quant *quant;      // owned; non-NULL only for an AWQ / GPTQ directory
    struct llmq_tensor_view *shifted;          // (n_shifted) owned F32 views of 1 + w: an HF gemma model's norms
    int64_t n_shifted;
    struct llmq_tensor_view *slices; // (n_layer, LLMQ_LIN_COUNT) phi3: row ranges of the fused tensors (data not owned)
    const struct llmq_tensor_view **fused;    // (n_layer, 2) phi3: the stored qkv and gate_up tensors (data not owned)
    struct llmq_tensor_view *exp_slices;      // (n_layer, E, 3) GGUF moe: each expert's part of a stacked tensor
    const struct llmq_tensor_view **exp_ptrs; // (n_layer, E, 3) what layers[l].exps point into
    struct llmq_tensor_view *shexp_views;     // (n_layer) qwen2_moe: ffn_gate_inp_shexp as (1, D) (data not owned)
    enum llmq_expert_names expert_names; // an HF moe directory's spelling of its experts (see "Mixture of experts")
};

// The tensor block l stores linear `which` in: phi3's fused qkv / gate_up for q, k, v / gate, up (all their rows,
// formats/llama/arch.h llmq_arch_fused_part), else the linear's own view.
static inline const struct llmq_tensor_view *llmq_model_stored_linear(const struct llmq_model *m, int64_t l,
                                                                      enum llmq_linear which) {
    enum llmq_linear head;
    int64_t r0, total;
    if (!m->fused || !llmq_arch_fused_part(&m->hp, which, &head, &r0, &total)) return m->layers[l].w[which];
    return m->fused[2 * l + (head == LLMQ_LIN_UP)];
}

// What an AWQ / GPTQ directory held (see "Quantized HF directories"), and the dequantized weights.
struct llmq_model_quant {
    const char *method;             // "awq" | "gptq" (static string)
    const char *checkpoint_format;  // "gemm" (awq), "gptq" | "gptq_v2" (static string)
    int bits, group_size;           // group_size -1: one group per row
    bool sym, desc_act;             // as config.json states them (false when absent)
    int64_t n_dequantized;          // linears dequantized on load
    uint64_t bytes;                 // f32 bytes held for them
    int64_t n_views;                // n_layer * LLMQ_LIN_COUNT, then (moe) n_layer * E * 3 experts
    struct llmq_tensor_view *views; // (n_views) owned views (F32 data owned; unused: data NULL)
};

// Opens a GGUF file or an HF directory (decided by what path is), validates it (see "Errors")
// and returns a model that owns the mapping and the tokenizer. On failure *out is NULL and one
// error line was logged. Nothing is converted: loading costs the header parse only.
enum llmq_status llmq_model_load(const char *path, struct llmq_model **out);
void llmq_model_free(struct llmq_model *m); // NULL is a no-op

// Converts weight w (R, C) (outermost-first W[out, in]; a 1-D tensor is (1, C)) of any dtype
// formats/ggml/quants.h decodes to f32 into dst (R*C floats), rows split over n_threads pthreads
// (n_threads <= 1: the calling thread). LLMQ_ERR_UNSUPPORTED for a dtype that cannot be decoded.
enum llmq_status llmq_model_weight_f32(const struct llmq_tensor_view *w, float *dst, int n_threads);

// Converts rows [r0, r0 + n) of a 2-D weight (R, C) to f32 into dst (n*C floats), one thread.
// Used for embedding lookups (only the rows of the tokens seen). LLMQ_ERR_ARG if out of range.
enum llmq_status llmq_model_rows_f32(const struct llmq_tensor_view *w, int64_t r0, int64_t n, float *dst);

// The per-pair RoPE frequency divisors ff (n_rot/2): pair i rotates by pos * theta^(-2i/n_rot) / ff[i].
// From the GGUF rope_freqs.weight tensor when there is one, else computed from hp.rope_scaling as
// llama.cpp's convert_hf_to_gguf.py / transformers' _compute_llama3_parameters do, else all 1.
void llmq_model_rope_freq_factors(const struct llmq_model *m, float *ff);
// (The same computation from hyper-parameters alone: llmq_rope_llama3_factors, formats/llama/arch.h.)

#endif // LLMQ_CALIB_MODEL_H
