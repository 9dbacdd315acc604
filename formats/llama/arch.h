/*
 * formats/llama/arch.h — the one description of the LLaMA-family architectures llmq reads and writes
 * (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen3_moe, qwen2_moe): the architecture enum, the
 * hyper-parameters, the tensor-name table (llmq role <-> GGUF name <-> Hugging Face name), whether GGUF stores the q/k
 * rows permuted and the row map of that permutation, the llama3 RoPE frequency factors, and the Gemma block's rules.
 *
 * What it is: facts about the architectures, shared by the model loader (calib/model/model.h), the
 * converter (formats/convert/convert.h), the calibration files (calib/calib.h) and the quantized-model
 * writers (quant/export.h, quant/gguf_export.h); and the one reader and writer of the hyper-parameters
 * in both formats (formats/llama/hparams.c: GGUF <arch>.* keys, HF config.json). Adding a family means
 * adding its entry here (and its forward-pass differences in calib/model/forward.c), nothing else.
 * What it is not: no compute; the only file it reads is config.json (llmq_hf_config_load): the GGUF
 * functions take an open file or writer (formats/gguf.h).
 *
 * ---- Tensors (shapes outermost-first, W[out, in]; in GGUF the dims are stored reversed) -------
 *   GGUF name                  HF name                                        shape
 *   token_embd.weight          model.embed_tokens.weight                      (V, D)
 *   output_norm.weight         model.norm.weight                              (D)
 *   output.weight              lm_head.weight            (absent: tied)       (V, D)
 *   blk.N.attn_norm.weight     model.layers.N.input_layernorm.weight          (D)
 *   blk.N.attn_q.weight        model.layers.N.self_attn.q_proj.weight         (H*Dh, D)
 *   blk.N.attn_k.weight        model.layers.N.self_attn.k_proj.weight         (Hkv*Dh, D)
 *   blk.N.attn_v.weight        model.layers.N.self_attn.v_proj.weight         (Hkv*Dh, D)
 *   blk.N.attn_output.weight   model.layers.N.self_attn.o_proj.weight         (D, H*Dh)
 *   blk.N.ffn_norm.weight      model.layers.N.post_attention_layernorm.weight (D)
 *   blk.N.ffn_gate.weight      model.layers.N.mlp.gate_proj.weight            (F, D)
 *   blk.N.ffn_up.weight        model.layers.N.mlp.up_proj.weight              (F, D)
 *   blk.N.ffn_down.weight      model.layers.N.mlp.down_proj.weight            (D, F)
 *   blk.N.attn_{q,k,v,output}.bias  model.layers.N.self_attn.{q,k,v,o}_proj.bias  (qwen2: q, k, v;
 *                                   llama with attention_bias: all four — converter only)
 *   blk.N.attn_q_norm.weight   model.layers.N.self_attn.q_norm.weight         (Dh)  qwen3, gemma3: RMSNorm of
 *   blk.N.attn_k_norm.weight   model.layers.N.self_attn.k_norm.weight         (Dh)  each q / k head before RoPE
 *   gemma2 / gemma3 (four norms per block; the HF names of the two families differ from llama's):
 *   blk.N.attn_norm.weight          model.layers.N.input_layernorm.weight            (D) before attention
 *   blk.N.post_attention_norm.weight model.layers.N.post_attention_layernorm.weight  (D) after attention
 *   blk.N.ffn_norm.weight           model.layers.N.pre_feedforward_layernorm.weight  (D) before the MLP
 *   blk.N.post_ffw_norm.weight      model.layers.N.post_feedforward_layernorm.weight (D) after the MLP
 *   Names as llama.cpp's gguf-py (gguf/constants.py MODEL_TENSOR) and transformers' modeling_llama.py
 *   / modeling_qwen2.py / modeling_qwen3.py / modeling_gemma2.py / modeling_gemma3.py state them.
 *
 * ---- Phi-3 (phi3: modeling_phi3.py, llama.cpp src/models/phi3.cpp, conversion/phi.py) -------------------
 *   blk.N.attn_qkv.weight      model.layers.N.self_attn.qkv_proj.weight       (H*Dh + 2*Hkv*Dh, D) q, k, v rows
 *   blk.N.ffn_up.weight        model.layers.N.mlp.gate_up_proj.weight         (2F, D) gate rows, then up rows
 *   (the roles LLMQ_T_LINEAR_0 + LLMQ_LIN_Q and + LLMQ_LIN_UP carry these names and shapes in phi3; K, V and GATE
 *   have no tensor of their own: the loader (calib/model/model.h) gives them row ranges of the fused ones.)
 *   RoPE NEOX in both formats, no permutation. Partial RoPE (Phi-4-mini: partial_rotary_factor 0.75, head_dim
 *   128, n_rot 96): only the first n_rot values of every q / k head rotate, pair i being (i, i + n_rot/2) at
 *   pos * theta^(-2i/n_rot), the other head_dim - n_rot values pass through (modeling_phi3.py
 *   apply_rotary_pos_emb q_rot / q_pass; ggml_rope_ext with n_dims = n_rot). n_rot = int(head_dim *
 *   partial_rotary_factor) as transformers' rope init computes it; GGUF rope.dimension_count (convert_hf_to_gguf.py
 *   Phi3MiniModel writes int(factor * n_embd) // n_head, the same value when head_dim = n_embd / n_head). The
 *   other families refuse partial RoPE. The sliding window (HF sliding_window, every layer) is honoured for an HF
 *   model; a GGUF has none (llama.cpp's phi3 disables it). Quantized output keeps the fusion: llmq_arch_fused_part.
 *
 * ---- LongRoPE (phi3 rope_scaling "longrope", legacy "su": transformers modeling_rope_utils.py
 *      _compute_longrope_parameters / dynamic_rope_update; llama.cpp convert_hf_to_gguf.py Phi3MiniModel,
 *      llama-model.cpp get_rope_factors, llama-context.cpp yarn_attn_factor, ggml rope_yarn) ---------------
 *   Pair i of a head rotates by pos * theta^(-2i/n_rot) / ext[i] and cos / sin are multiplied by attn_factor (q
 *   and k alike, so the scores by attn_factor^2); ext = long_factor or short_factor (n_rot/2 values each, > 0;
 *   n_rot = head_dim without partial RoPE; config.json lists and GGUF tensors of another length are refused).
 *   config.json                                      GGUF (phi3.*)
 *   rope_scaling.short_factor / long_factor          tensors rope_factors_short.weight / rope_factors_long.weight
 *   original_max_position_embeddings (top level;     rope.scaling.original_context_length (absent:
 *     Phi3Config's 4096 when absent, as transformers) context_length)
 *   rope_scaling.attention_factor, else, with        rope.scaling.attn_factor (absent: 1); written as the
 *     factor = rope_scaling.factor or max_position_  value transformers uses (llama.cpp's converter derives
 *     embeddings / original: sqrt(1 + ln factor /    it from the two lengths alone, the same unless config
 *     ln original) when factor > 1, else 1            gives factor / attention_factor)
 *   Which set: transformers takes long when this forward's sequence (max position + 1) is longer than
 *   original_max_position_embeddings; llama.cpp when the context size n_ctx (per sequence) is. llmq's forward
 *   pass (calib/model/forward.h llmq_forward_set_rope_ctx) uses transformers' rule unless given a context:
 *   llmq eval's perplexity / KLD passes give their --ctx for a GGUF model or under --emulate (llama.cpp's rule;
 *   every chunk is the context long, so the two rules agree there); the tasks (calib/eval/tasks.c) and
 *   calibration use transformers' rule.
 *
 * ---- Mixture of experts (mixtral: modeling_mixtral.py, qwen3_moe: modeling_qwen3_moe.py; llama.cpp
 *      src/models/llama.cpp, qwen3moe.cpp, llama-graph.cpp build_moe_ffn; convert_hf_to_gguf.py LlamaModel,
 *      Qwen2MoeModel) --------------------------------------------------------------------------------------
 *   GGUF name                  HF name (mixtral | qwen3_moe)                                 shape
 *   blk.N.ffn_gate_inp.weight  model.layers.N.block_sparse_moe.gate.weight | mlp.gate.weight  (E, D) router
 *   blk.N.ffn_gate_exps.weight model.layers.N.block_sparse_moe.experts.X.w1.weight |          (E, Fe, D)
 *                              mlp.experts.X.gate_proj.weight                      (HF: (Fe, D) per expert X)
 *   blk.N.ffn_up_exps.weight   ...experts.X.w3.weight | ...experts.X.up_proj.weight           (E, Fe, D)
 *   blk.N.ffn_down_exps.weight ...experts.X.w2.weight | ...experts.X.down_proj.weight         (E, D, Fe)
 *   GGUF stacks the E experts of a tensor along the outermost dim (expert X = rows [X*Fe, (X+1)*Fe) of the
 *   (E*Fe, D) view), one type for all of them; the router stays f32 (convert_hf_to_gguf.py, llama-quant.cpp).
 *   The dense ffn_gate / ffn_up / ffn_down are not tensors of these families. Per token t (n2 = the normed
 *   input of the MLP): p = softmax(router · n2) over E (f32), the K largest p_e (ties: the lower expert index),
 *   w = p / sum of those K when norm_topk_prob (mixtral: always; llama.cpp: always, so a qwen3_moe with
 *   norm_topk_prob false has no GGUF form), and out = sum over the K experts of w_e * Wdown_e · (SiLU(Wgate_e ·
 *   n2) * (Wup_e · n2)). mixtral is GGUF "llama" with expert_count > 0 (q/k rows permuted as llama); qwen3_moe
 *   is GGUF "qwen3moe" (qwen3's q/k norms, NEOX). Keys: E expert_count / num_local_experts (mixtral; qwen3_moe written
 * so by transformers 5) | num_experts; K expert_used_count / num_experts_per_tok; Fe expert_feed_forward_length
 * (qwen3moe; mixtral: feed_forward_length) / intermediate_size (mixtral) | moe_intermediate_size; norm_topk_prob
 * (qwen3_moe, default false as Qwen3MoeConfig; true when read from a GGUF). qwen3_moe's decoder_sparse_step other than
 * 1 and a non-empty mlp_only_layers (dense blocks) are refused.
 *   Two spellings of an HF directory's experts (enum llmq_expert_names): LLMQ_EXPERT_NAMES_HUB, the table above (the
 *   Hub's checkpoints and their GPTQ / AWQ quantizations, transformers' save_pretrained, vLLM's loaders: vllm
 *   model_executor/models/mixtral.py maps block_sparse_moe.experts.X.w1 / w3 / w2); LLMQ_EXPERT_NAMES_GPTQMODEL,
 *   GPTQModel 7.7's (gptqmodel/models/definitions/mixtral.py over Defuser's per-expert block): mixtral's router and
 *   experts under qwen3_moe's names, model.layers.N.mlp.gate.weight and mlp.experts.X.{gate,up,down}_proj (its
 *   quantized loader reads the checkpoint's keys as they are, so it cannot load the Hub spelling of a quantized
 *   Mixtral). qwen3_moe and qwen2_moe have one spelling: both enums name the table's.
 *
 * ---- Qwen2-MoE's shared expert (qwen2_moe: modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock; llama.cpp
 *      src/models/qwen2moe.cpp, conversion/qwen.py Qwen2MoeModel) ----------------------------------------------
 *   qwen2's attention (q/k/v biases, NEOX, unpermuted) and per block the routed experts of qwen3_moe's names, plus
 *   a shared expert that every token goes through, gated per token by a sigmoid:
 *   GGUF name                       HF name                                         shape
 *   blk.N.ffn_gate_inp_shexp.weight model.layers.N.mlp.shared_expert_gate.weight    (1, D) (GGUF: (D) once
 *                                                                                   llama-quantize wrote it)
 *   blk.N.ffn_gate_shexp.weight     model.layers.N.mlp.shared_expert.gate_proj.weight (Fs, D)
 *   blk.N.ffn_up_shexp.weight       model.layers.N.mlp.shared_expert.up_proj.weight   (Fs, D)
 *   blk.N.ffn_down_shexp.weight     model.layers.N.mlp.shared_expert.down_proj.weight (D, Fs)
 *   out = mixture(n2) + sigmoid(shexp_gate · n2) * Wdown_s · (SiLU(Wgate_s · n2) * (Wup_s · n2)), the shared expert's
 *   term added after the routed sum. The shared expert's gate / up / down are the roles LLMQ_T_LINEAR_0 + GATE / UP /
 *   DOWN of the family (a dense MLP of width Fs, llmq_hparams_ffn_width); the gate ffn_gate_inp_shexp stays f32 like
 *   the router (convert_hf_to_gguf.py keeps FFN_GATE_INP_SHEXP in f32; it is 1-D for llama-quantize). Keys: E
 *   expert_count / num_experts (60); K expert_used_count / num_experts_per_tok (4); Fe expert_feed_forward_length /
 *   moe_intermediate_size (1408); Fs expert_shared_feed_forward_length / shared_expert_intermediate_size (5632;
 *   llama.cpp: n_ff when absent); n_ff feed_forward_length / intermediate_size (the width of dense blocks, which
 *   llmq refuses: kept for the round trip only). norm_topk_prob (default false as Qwen2MoeConfig): llama.cpp's
 *   qwen2moe graph never renormalises, so a GGUF is false and true has no GGUF form. decoder_sparse_step other than
 *   1, a non-empty mlp_only_layers and qkv_bias false are refused.
 *
 * ---- Gemma (gemma2, gemma3: modeling_gemma2.py / modeling_gemma3.py, llama.cpp src/models/gemma2.cpp,
 *      gemma3.cpp, conversion/gemma.py) ---------------------------------------------------------
 *   Norm weights: HF stores w and computes x_normed * (1 + w); GGUF stores 1 + w (convert_hf_to_gguf.py
 *   adds 1 to every "*norm.weight", q/k norms included). llmq's model (calib/model/model.h) holds 1 + w
 *   in both cases; the converter adds / subtracts 1 in f32 (formats/convert/convert.h).
 *   Layer il uses the sliding window iff swa_pattern == 0 or il % swa_pattern < swa_pattern - 1 (llama.cpp
 *   llama_hparams::set_swa_pattern; transformers' layer_types default: "sliding_attention" unless
 *   (il + 1) % pattern == 0), gemma2's pattern 2, gemma3's 6. A query at position t sees the keys at
 *   positions t - sliding_window < p <= t on those layers (masking_utils.sliding_window_overlay,
 *   llama_hparams::is_masked_swa). gemma3: sliding layers use rope_theta_swa (rope_local_base_freq) and
 *   no rope scaling; the others rope_theta and rope_scaling (linear). sliding_window 0 (HF null): no mask, the
 *   layers keep their RoPE (transformers); a GGUF without the window has no sliding layers (llama.cpp's gemma3:
 *   swa_pattern 1 on reading), so such an HF model converts only when both RoPEs are the same.
 *
 * ---- Q/K row permutation ------------------------------------------------------------------------
 *   llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute) reorders the rows of q_proj / k_proj (and
 *   their biases) of llama and mistral checkpoints so that RoPE rotates adjacent pairs (NORM); qwen2
 *   and qwen3 are written unpermuted and rotate halves (NEOX). Within each head of hd = n_rows / n_head rows:
 *     GGUF row h*hd + k  <-  HF row   h*hd + (k % 2) * hd/2 + k / 2
 *     HF row   h*hd + k  <-  GGUF row h*hd + 2 * (k % (hd/2)) + k / (hd/2)
 *
 * ---- Hyper-parameters (struct llmq_hparams) ---------------------------------------------------------
 *   field            GGUF key (<arch>.*)                  config.json key                  absent
 *   arch             general.architecture                 model_type (else architectures[0])  required
 *   n_embd           embedding_length                     hidden_size                      required
 *   n_ff             feed_forward_length                  intermediate_size                required
 *   n_layer          block_count                          num_hidden_layers                required
 *   n_head           attention.head_count                 num_attention_heads              required
 *   n_head_kv        attention.head_count_kv              num_key_value_heads              n_head
 *   head_dim         attention.key_length (= value_length) head_dim                        n_embd / n_head
 *   n_rot            rope.dimension_count (other than     phi3: int(head_dim * partial_  head_dim
 *                    head_dim: phi3 only, the other       rotary_factor), the factor in (0, 1] top-level
 *                    families refuse it)                  or in rope_parameters; others: 1 or refused
 *   n_ctx_train      context_length                       max_position_embeddings          the caller's
 *   rms_eps          attention.layer_norm_rms_epsilon     rms_norm_eps                     required / 1e-6
 *   rope_theta       rope.freq_base                       rope_theta                       10000
 *   rope_scaling     rope.scaling.type "none" | "linear"  rope_scaling null | {"rope_type" (or "type"):
 *                    (+ rope.scaling.factor); llama3:     "default" | "linear" (factor) | "llama3" (factor,
 *                    the tensor rope_freqs.weight, left   low_freq_factor, high_freq_factor,
 *                    to the caller (type NONE)            original_max_position_embeddings)
 *                    phi3 LongRoPE: two factor tensors    | "longrope" / "su" (see "LongRoPE")}
 *                    (transformers 5 writes "rope_parameters" {"rope_theta", "rope_type", ...} instead of
 *                    rope_theta and rope_scaling: read the same way when those keys are absent)
 *   n_vocab          rows of token_embd.weight (checked   vocab_size                       0 (HF only)
 *                    against vocab_size when present)
 *   tied_embeddings  no output.weight tensor              tie_word_embeddings              false
 *   attn_bias        a blk.0.attn_q.bias tensor           attention_bias                   false
 *                    (not for qkv_bias families)          (not for qkv_bias families)
 *   gemma2 / gemma3 only:
 *   attn_softcap     attn_logit_softcapping               attn_logit_softcapping           0 (none)
 *   final_softcap    final_logit_softcapping              final_logit_softcapping          0 (none)
 *   query_pre_attn_scalar  (no key: llama.cpp derives it) query_pre_attn_scalar            head_dim
 *                    head_dim, or n_embd / n_head for the 27B shapes (gemma2 46 layers, gemma3 62)
 *   sliding_window   attention.sliding_window             sliding_window                   gemma2 4096 / 0
 *   swa_pattern      attention.sliding_window_pattern     layer_types (a period n: see     the family's
 *                    (u32)                                "Gemma"), else sliding_window_pattern
 *   rope_theta_swa   rope.freq_base_swa                   gemma3: rope_parameters.sliding_attention.rope_theta
 *                                                         or rope_local_base_freq (10000); gemma2: rope_theta
 *                    (gemma3 in transformers 5: rope_parameters.full_attention holds rope_theta / the scaling)
 *   tied_embeddings  gemma2: always (llama.cpp never reads output.weight); tie_word_embeddings false refused
 *   qkv_bias, qk_norm, gemma, rope_type: from the family (struct llmq_arch_info); rope_type NORM only for a GGUF
 *   whose q/k rows are permuted. config.json also: hidden_act must be "silu" (gemma: hidden_activation or
 *   hidden_act "gelu_pytorch_tanh"), mlp_bias must be false, use_bidirectional_attention not true. null counts
 *   as absent in config.json. Keys as llama.cpp's gguf-py (gguf/constants.py Keys.LLM / Keys.Attention /
 *   Keys.Rope) and transformers' LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config (defaults) state them.
 *   Checks (llmq_hparams_check, run by both readers): every dim in [1, 2^24], n_layer <= 4096, moe: 1 <= K <= E
 *   <= 4096 and Fe in [1, 2^24], n_head a multiple of n_head_kv, head_dim even, n_rot even in [2, head_dim],
 *   n_head * head_dim <= 2^24, rms_eps and rope_theta finite and positive, scaling factors positive, llama3
 *   low_freq_factor < high_freq_factor and original_max_position_embeddings >= 1; integer keys outside [0, 2^40]
 *   are refused while reading.
 *   Errors name the file and the key: a missing required key LLMQ_ERR_NOT_FOUND, a wrong type or a value
 *   out of range LLMQ_ERR_CORRUPT (partial_rotary_factor outside (0, 1]), an unknown family / scaling type /
 *   hidden_act / mlp_bias, partial RoPE outside phi3, a partial_rotary_factor giving an odd or zero rotary count,
 *   or two different ones (top level and rope_parameters) LLMQ_ERR_UNSUPPORTED.
 */
#ifndef LLMQ_FORMATS_LLAMA_ARCH_H
#define LLMQ_FORMATS_LLAMA_ARCH_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum llmq_arch {
    LLMQ_ARCH_LLAMA,
    LLMQ_ARCH_MISTRAL,
    LLMQ_ARCH_QWEN2,
    LLMQ_ARCH_QWEN3,
    LLMQ_ARCH_GEMMA2,
    LLMQ_ARCH_GEMMA3,
    LLMQ_ARCH_PHI3,
    LLMQ_ARCH_MIXTRAL,
    LLMQ_ARCH_QWEN3_MOE,
    LLMQ_ARCH_QWEN2_MOE,
    LLMQ_ARCH_COUNT
};
#define LLMQ_ARCH_NAMES                                                                                                \
    "llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen3_moe, qwen2_moe" // the families, for messages

// One row per family.
struct llmq_arch_info {
    const char *name;          // the GGUF general.architecture read ("mistral"), and llmq's name of the family
    const char *hf_model_type; // HF config.json model_type ("gemma3_text" for gemma3's text model)
    const char *hf_class;      // HF architectures[0] ("MistralForCausalLM")
    const char *gguf_name;     // general.architecture written (convert_hf_to_gguf.py writes mistral as "llama")
    bool qk_permuted;          // GGUF stores q/k rows permuted (see "Q/K row permutation"): RoPE NORM there
    bool qkv_bias;             // q, k and v projections always carry biases
    bool qk_norm;              // RMSNorm (weights (Dh), eps rms_eps) of every q and k head before RoPE
    bool gemma;                // the Gemma block (see "Gemma"): sqrt(D)-scaled embeddings, (1 + w) norms in HF,
                               // post-attention / post-feed-forward norms, GeGLU (tanh GELU), sliding window
    bool always_tied;          // the GGUF head is always token_embd (llama.cpp's gemma2 ignores output.weight)
    int swa_pattern;           // default period of the sliding-window layers (see "Gemma"); 0: no sliding window
    bool fused;                // q/k/v and gate/up stored as one tensor each (see "Phi-3")
    bool moe;                  // every block's MLP is a mixture of experts (see "Mixture of experts")
    bool shexp;                // and a gated shared expert (see "Qwen2-MoE's shared expert")
};

// How RoPE pairs the dimensions of one head of Dh values.
enum llmq_rope_type {
    LLMQ_ROPE_NORM, // adjacent pairs (2i, 2i+1): the GGUF llama layout (q/k rows permuted by llama.cpp)
    LLMQ_ROPE_NEOX, // halves (i, i + Dh/2): HF rotate_half, and qwen2 / qwen3 in both formats
};                  // (partial RoPE: the first n_rot values of a head rotate, n_rot in place of Dh; see "Phi-3")

enum llmq_rope_scaling {
    LLMQ_ROPE_SCALING_NONE,
    LLMQ_ROPE_SCALING_LINEAR,   // positions divided by factor (the forward pass refuses it; the converter carries it)
    LLMQ_ROPE_SCALING_LLAMA3,   // per-pair frequency divisors (Llama 3.1+): llmq_rope_llama3_factors
    LLMQ_ROPE_SCALING_LONGROPE, // phi3 "longrope" / "su": short or long per-pair divisors, cos / sin times
                                // attn_factor (see "LongRoPE")
};
#define LLMQ_LONGROPE_MAX_PAIRS 256 // n_rot <= 512 for LongRoPE (Phi-3-mini / Phi-4-mini: 96, 96 of 128)

// See "Hyper-parameters" for where each field comes from.
struct llmq_hparams {
    enum llmq_arch arch;
    int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_ctx_train;
    int64_t n_rot; // values of a head that RoPE rotates (the first n_rot; head_dim unless partial RoPE: "Phi-3")
    float rms_eps, rope_theta;
    enum llmq_rope_type rope_type;
    struct {
        enum llmq_rope_scaling type;
        float factor;                            // LINEAR, LLAMA3
        float low_freq_factor, high_freq_factor; // LLAMA3
        int64_t original_max_pos;                // LLAMA3, LONGROPE: original_max_position_embeddings
        float attn_factor;                       // LONGROPE: cos / sin scale (transformers' attention_factor)
        float short_factor[LLMQ_LONGROPE_MAX_PAIRS], long_factor[LLMQ_LONGROPE_MAX_PAIRS]; // LONGROPE (n_rot/2)
    } rope_scaling;
    bool tied_embeddings;
    bool qkv_bias;  // q, k, v biases (the family's: qwen2)
    bool qk_norm;   // q_norm / k_norm per head (the family's: qwen3, gemma3)
    bool attn_bias; // attention_bias of the other families: q, k, v and o biases (the forward pass refuses them)
    bool gemma;     // the Gemma block (the family's): see "Gemma"
    // gemma2 / gemma3 only (0 where a family has none):
    float attn_softcap;          // attention logits s -> cap * tanh(s / cap) (gemma2: 50)
    float final_softcap;         // output logits likewise (gemma2: 30)
    float query_pre_attn_scalar; // scores scaled by query_pre_attn_scalar^-1/2 (others: head_dim)
    int64_t sliding_window;      // keys visible to a query on a sliding layer (0: no sliding window)
    int64_t swa_pattern;         // see "Gemma"
    float rope_theta_swa;        // RoPE base of the sliding layers (gemma2: rope_theta)
    // mixtral / qwen3_moe only (0 / false elsewhere; see "Mixture of experts"):
    bool moe;              // the family's
    int64_t n_expert;      // experts per block (E)
    int64_t n_expert_used; // experts per token (K), 1 <= K <= E
    int64_t n_ff_exp;      // one expert's intermediate width (Fe); mixtral: n_ff
    bool norm_topk_prob;   // the K routing weights renormalised to sum 1 (mixtral: always)
    // qwen2_moe only (see "Qwen2-MoE's shared expert"):
    bool shexp;         // the family's: a shared expert, gated by sigmoid(ffn_gate_inp_shexp · n2)
    int64_t n_ff_shexp; // its intermediate width (Fs)
};

// The width of a block's dense MLP (w[GATE], w[UP], w[DOWN]): n_ff, the shared expert's Fs for qwen2_moe, 0 for the
// other moe families (they have none).
static inline int64_t llmq_hparams_ffn_width(const struct llmq_hparams *hp) {
    return hp->shexp ? hp->n_ff_shexp : hp->moe ? 0 : hp->n_ff;
}
#define LLMQ_HPARAMS_MAX_EXPERTS 4096

#define LLMQ_HPARAMS_MAX_DIM (1LL << 24) // any single dimension
#define LLMQ_HPARAMS_MAX_LAYERS 4096

// The seven linear layers of a block, in the order used everywhere (hooks, calibration, quant).
enum llmq_linear {
    LLMQ_LIN_Q,
    LLMQ_LIN_K,
    LLMQ_LIN_V,
    LLMQ_LIN_O,
    LLMQ_LIN_GATE,
    LLMQ_LIN_UP,
    LLMQ_LIN_DOWN,
    LLMQ_LIN_COUNT
};

// Every tensor role of the family (one row of the table above).
enum llmq_tensor_role {
    LLMQ_T_TOK_EMBD,
    LLMQ_T_OUTPUT_NORM,
    LLMQ_T_OUTPUT,
    LLMQ_T_ATTN_NORM,
    LLMQ_T_FFN_NORM,
    LLMQ_T_LINEAR_0,                                  // LLMQ_T_LINEAR_0 + enum llmq_linear: the seven weights
    LLMQ_T_BIAS_Q = LLMQ_T_LINEAR_0 + LLMQ_LIN_COUNT, // q, k, v, o biases
    LLMQ_T_BIAS_K,
    LLMQ_T_BIAS_V,
    LLMQ_T_BIAS_O,
    LLMQ_T_ATTN_Q_NORM, // (Dh) qk_norm families
    LLMQ_T_ATTN_K_NORM,
    LLMQ_T_ATTN_POST_NORM,     // (D) gemma families: after attention
    LLMQ_T_FFN_POST_NORM,      // (D) after the MLP
    LLMQ_T_FFN_GATE_INP,       // (E, D) moe families: the router (kept in f32)
    LLMQ_T_FFN_GATE_EXPS,      // (E, Fe, D) moe: every expert's gate, stacked in GGUF (HF: one tensor per expert)
    LLMQ_T_FFN_UP_EXPS,        // (E, Fe, D)
    LLMQ_T_FFN_DOWN_EXPS,      // (E, D, Fe)
    LLMQ_T_FFN_GATE_INP_SHEXP, // (1, D) qwen2_moe: the shared expert's gate (kept in f32)
    LLMQ_T_COUNT
};

// GGUF only: llama3 RoPE frequency divisors (n_rot/2 f32) written by convert_hf_to_gguf.py; HF has
// rope_scaling in config.json instead.
#define LLMQ_GGUF_ROPE_FREQS "rope_freqs.weight"
// GGUF only: LongRoPE's long / short divisors (n_rot/2 f32), as convert_hf_to_gguf.py Phi3MiniModel writes them.
#define LLMQ_GGUF_ROPE_LONG "rope_factors_long.weight"
#define LLMQ_GGUF_ROPE_SHORT "rope_factors_short.weight"

struct llmq_tensor_name {
    const char *gguf;     // GGUF name, after "blk.N." for per-block tensors ("attn_q.weight")
    const char *hf;       // HF name, after "model.layers.N." for per-block tensors ("self_attn.q_proj.weight")
    const char *hf_gemma; // HF name in the gemma families when it differs (NULL: hf); "" for none there
    bool per_block;       // per decoder block
    int linear;           // its enum llmq_linear for a linear's weight or bias, else -1
    bool qk_rows;         // rows follow the q/k head layout (q, k weights and biases): see "Q/K row permutation"
    bool gemma_only;      // a tensor of the gemma families only (their post norms)
    bool norm;            // a norm weight: 1 + w in GGUF and w in HF for the gemma families
    bool moe_only;        // a tensor of the moe families only (router, experts); their dense MLP rows are absent
    bool shexp_only;      // a tensor of the shared-expert families only (ffn_gate_inp_shexp)
};

// The table row of a role (never NULL for role < LLMQ_T_COUNT).
const struct llmq_tensor_name *llmq_tensor_name_of(enum llmq_tensor_role role);

// The HF name of role in family a (after "model.layers.N." for per-block tensors).
const char *llmq_tensor_hf_name(enum llmq_arch a, enum llmq_tensor_role role);

// Writes the full tensor name of role (block `layer`, ignored for global tensors) of family a in GGUF
// (hf false) or HF (hf true) spelling into buf. Returns buf.
char *llmq_tensor_full_name(enum llmq_arch a, enum llmq_tensor_role role, int64_t layer, bool hf, char *buf,
                            size_t size);

// The role of a full tensor name of family a in GGUF or HF spelling, with *layer its block (-1 for global
// tensors); -1 when the name is not in the table (or not of family a) or its block index is malformed or
// >= n_layer.
int llmq_tensor_role_of(enum llmq_arch a, const char *name, bool hf, int64_t n_layer, int64_t *layer);

// The spellings of a moe family's router and experts in an HF directory (see "Mixture of experts").
enum llmq_expert_names {
    LLMQ_EXPERT_NAMES_HUB,       // mixtral: model.layers.N.block_sparse_moe.{gate, experts.X.w1 / w3 / w2}
    LLMQ_EXPERT_NAMES_GPTQMODEL, // mixtral: model.layers.N.mlp.{gate, experts.X.gate_proj / up_proj / down_proj}
};
// "hub" / "gptqmodel", and the reverse (false when the name is unknown).
const char *llmq_expert_names_name(enum llmq_expert_names n);
bool llmq_expert_names_parse(const char *name, enum llmq_expert_names *out);

// The moe families' expert tensors: the HF name of expert `expert`'s slice of role (LLMQ_T_FFN_{GATE,UP,DOWN}_EXPS)
// in block `layer` in spelling n ("model.layers.N.mlp.experts.E.gate_proj.weight"), into buf. Returns buf.
char *llmq_tensor_expert_hf_name(enum llmq_arch a, enum llmq_expert_names n, enum llmq_tensor_role role, int64_t layer,
                                 int64_t expert, char *buf, size_t size);
// The HF name of block `layer`'s router in spelling n ("model.layers.N.block_sparse_moe.gate.weight"), into buf
// (LLMQ_EXPERT_NAMES_HUB: llmq_tensor_full_name's). Returns buf.
char *llmq_tensor_router_hf_name(enum llmq_arch a, enum llmq_expert_names n, int64_t layer, char *buf, size_t size);
// The expert tensor role and block of an HF per-expert name of family a, with *expert its expert (< n_expert);
// -1 when name is not one (or its indices are malformed or out of range).
int llmq_tensor_expert_role_of(enum llmq_arch a, const char *name, int64_t n_layer, int64_t n_expert, int64_t *layer,
                               int64_t *expert);

// True when role's weights are stored as w in HF and as 1 + w in GGUF for family a (gemma norms).
bool llmq_tensor_norm_shifted(enum llmq_arch a, enum llmq_tensor_role role);

// True when layer il of hp is a sliding layer (see "Gemma": its RoPE base, and the window when sliding_window > 0).
bool llmq_hparams_layer_swa(const struct llmq_hparams *hp, int64_t il);

// A linear's GGUF stem ("attn_q") and HF module path within a block ("self_attn.q_proj").
const char *llmq_linear_gguf_name(enum llmq_linear l);
const char *llmq_linear_hf_name(enum llmq_linear l);
// A linear's full stem in block `layer`: "blk.N.attn_q" (GGUF) or "model.layers.N.self_attn.q_proj" (HF),
// the prefix of its tensors (".weight"; the quantized formats' ".qweight", ".scales", ...). Returns buf.
char *llmq_linear_full_name(enum llmq_linear l, int64_t layer, bool hf, char *buf, size_t size);
// The same in family a's names: qwen2_moe's gate / up / down are its shared expert's ("blk.N.ffn_gate_shexp",
// "model.layers.N.mlp.shared_expert.gate_proj"); the other families' as llmq_linear_full_name. Returns buf.
char *llmq_arch_linear_full_name(enum llmq_arch a, enum llmq_linear l, int64_t layer, bool hf, char *buf, size_t size);
const char *llmq_linear_name(enum llmq_linear l); // short: "q", "k", "v", "o", "gate", "up", "down"
// phi3 (see "Phi-3"): linear l of hp is rows [*r0, *r0 + its own rows) of the tensor stored for linear *head (q, k, v:
// LLMQ_LIN_Q's attn_qkv / qkv_proj; gate, up: LLMQ_LIN_UP's ffn_up / gate_up_proj), *total rows in all. false (nothing
// set) for a linear stored as a tensor of its own: every other family's, and o / down.
bool llmq_arch_fused_part(const struct llmq_hparams *hp, enum llmq_linear l, enum llmq_linear *head, int64_t *r0,
                          int64_t *total);

const struct llmq_arch_info *llmq_arch_info_of(enum llmq_arch a); // never NULL for a < LLMQ_ARCH_COUNT
const char *llmq_arch_name(enum llmq_arch a);                     // "llama", "mistral", ..., "gemma3"
// Which name llmq_arch_find looks up.
enum llmq_arch_key { LLMQ_ARCH_KEY_GGUF, LLMQ_ARCH_KEY_HF_TYPE, LLMQ_ARCH_KEY_HF_CLASS };
// The family whose GGUF name, HF model_type or HF class is s; -1 when none is.
int llmq_arch_find(const char *s, enum llmq_arch_key key);

// True when the GGUF form of architecture a stores q/k rows permuted relative to HF (llama, mistral).
bool llmq_arch_qk_permuted(enum llmq_arch a);

// The source row of output row r of a (n_rows, ·) q or k tensor with n_head heads, converting HF ->
// GGUF (to_gguf) or GGUF -> HF; see "Q/K row permutation". n_rows must be a multiple of 2 * n_head.
int64_t llmq_arch_qk_src_row(int64_t r, int64_t n_rows, int64_t n_head, bool to_gguf);

// The per-pair RoPE frequency divisors ff (n_rot/2) of llama3 scaling (hp->rope_scaling; all 1 for any
// other type), as llama.cpp's convert_hf_to_gguf.py / transformers' _compute_llama3_parameters
// compute them: pair i rotates by pos * theta^(-2i/n_rot) / ff[i].
void llmq_rope_llama3_factors(const struct llmq_hparams *hp, float *ff);

// LongRoPE (see "LongRoPE"): true when a pass uses the long factors. ctx > 0: llama.cpp's rule, by the context
// size (ctx > original_max_pos); ctx 0: transformers' rule, by this sequence's length seqlen (> original_max_pos).
// False for any other scaling type.
bool llmq_rope_longrope_long(const struct llmq_hparams *hp, int64_t ctx, int64_t seqlen);

// LongRoPE's attention factor when config.json gives none (transformers _compute_longrope_parameters,
// convert_hf_to_gguf.py Phi3MiniModel): sqrt(1 + ln factor / ln original_max_pos) for factor > 1, else 1.
float llmq_longrope_attn_default(double factor, int64_t original_max_pos);

// ---- Reading and writing the hyper-parameters (formats/llama/hparams.c) --------------------------
struct llmq_gguf;
struct llmq_gguf_writer;
struct json_t;

// Reads *hp from an open GGUF: the keys of "Hyper-parameters", n_vocab / tied_embeddings / attn_bias
// from its tensor directory; n_ctx_absent when context_length is absent. Then llmq_hparams_check.
// A rope_freqs.weight tensor is left to the caller (rope_scaling stays NONE). On failure logs one
// line naming the file and the key and returns the status (see "Hyper-parameters"); *hp is then partial.
enum llmq_status llmq_hparams_from_gguf(const struct llmq_gguf *g, int64_t n_ctx_absent, struct llmq_hparams *hp);

// Reads <dir>/config.json (a JSON object of at most 16 MiB) into *cfg (owned: json_decref) and, when
// path is not NULL, its path into *path (owned: free). Absent: LLMQ_ERR_NOT_FOUND "<dir>: no config.json
// ..."; not JSON / not an object: LLMQ_ERR_CORRUPT naming line and column (common/io.h).
enum llmq_status llmq_hf_config_load(const char *dir, struct json_t **cfg, char **path);

// Reads *hp from a parsed config.json (file: its path, for messages); n_ctx_absent when
// max_position_embeddings is absent; n_vocab 0 when vocab_size is absent (the caller takes it from the
// embedding or refuses the model). Then llmq_hparams_check (of n_vocab only when present). Failure: as
// llmq_hparams_from_gguf.
enum llmq_status llmq_hparams_from_hf_config(const char *file, const struct json_t *cfg, int64_t n_ctx_absent,
                                             struct llmq_hparams *hp);

// The checks of "Hyper-parameters" on a complete *hp; the first failure is LLMQ_ERR_CORRUPT naming file.
enum llmq_status llmq_hparams_check(const struct llmq_hparams *hp, const char *file);

// Writes general.architecture (the family's gguf_name), general.type "model", general.name = name,
// the <arch>.* keys of hp, and general.file_type = file_type unless it is negative, in the order of
// llama.cpp's convert_hf_to_gguf.py (key_length / value_length only when head_dim != n_embd / n_head,
// rope.scaling.* only for LINEAR; LLAMA3 is the caller's rope_freqs.weight tensor), then the gemma keys.
// LLMQ_ERR_UNSUPPORTED for a model llama.cpp would compute differently (llmq_hparams_check_gguf).
enum llmq_status llmq_hparams_to_gguf(struct llmq_gguf_writer *w, const struct llmq_hparams *hp, const char *name,
                                      int64_t file_type);

// LLMQ_OK when a GGUF can express hp as llama.cpp computes it; else LLMQ_ERR_UNSUPPORTED naming file: for the
// gemma families a query_pre_attn_scalar other than the one llama.cpp derives, gemma2 without both
// soft-cappings or a window, gemma3 with attention soft-capping or with sliding layers of another RoPE but no
// window. Run by llmq_hparams_to_gguf, and by the converter before it reads any tensor.
enum llmq_status llmq_hparams_check_gguf(const struct llmq_hparams *hp, const char *file);

// A new config.json object for hp as transformers writes it for the family (llama, qwen2 or qwen3 keys),
// with bos / eos / pad token ids where they are >= 0 and torch_dtype; floats as their shortest
// decimal; partial_rotary_factor only when n_rot != head_dim (the shortest decimal giving n_rot back). Owned by
// the caller (json_decref); NULL when out of memory.
struct json_t *llmq_hparams_to_hf_config(const struct llmq_hparams *hp, int64_t bos, int64_t eos, int64_t pad,
                                         const char *torch_dtype);

#endif // LLMQ_FORMATS_LLAMA_ARCH_H
