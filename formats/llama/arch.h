/*
 * formats/llama/arch.h — the one description of the LLaMA-family architectures llmq reads and writes
 * (llama, mistral, qwen2): the architecture enum, the hyper-parameters, the tensor-name table (llmq
 * role <-> GGUF name <-> Hugging Face name), whether GGUF stores the q/k rows permuted and the row map
 * of that permutation, and the llama3 RoPE frequency factors.
 *
 * What it is: facts about the architectures, shared by the model loader (calib/model/model.h), the
 * converter (formats/convert/convert.h), the calibration files (calib/calib.h) and the quantized-model
 * writers (quant/export.h, quant/gguf_export.h). Adding a family means adding its entry here (and its
 * forward-pass differences in calib/model/forward.c), nothing else.
 * What it is not: no file reading or writing, no compute.
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
 *   Names as llama.cpp's gguf-py (gguf/constants.py MODEL_TENSOR) and transformers' modeling_llama.py
 *   / modeling_qwen2.py state them.
 *
 * ---- Q/K row permutation ------------------------------------------------------------------------
 *   llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute) reorders the rows of q_proj / k_proj (and
 *   their biases) of llama and mistral checkpoints so that RoPE rotates adjacent pairs (NORM); qwen2
 *   is written unpermuted and rotates halves (NEOX). Within each head of hd = n_rows / n_head rows:
 *     GGUF row h*hd + k  <-  HF row   h*hd + (k % 2) * hd/2 + k / 2
 *     HF row   h*hd + k  <-  GGUF row h*hd + 2 * (k % (hd/2)) + k / (hd/2)
 */
#ifndef LLMQ_FORMATS_LLAMA_ARCH_H
#define LLMQ_FORMATS_LLAMA_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum llmq_arch { LLMQ_ARCH_LLAMA, LLMQ_ARCH_MISTRAL, LLMQ_ARCH_QWEN2 };

// How RoPE pairs the dimensions of one head of Dh values.
enum llmq_rope_type {
    LLMQ_ROPE_NORM, // adjacent pairs (2i, 2i+1): the GGUF llama layout (q/k rows permuted by llama.cpp)
    LLMQ_ROPE_NEOX, // halves (i, i + Dh/2): HF rotate_half, and qwen2 in both formats
};

struct llmq_hparams {
    enum llmq_arch arch;
    int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_ctx_train;
    float rms_eps, rope_theta;
    enum llmq_rope_type rope_type;
    struct {
        bool enabled; // llama3 frequency scaling (Llama 3.1+)
        float factor, low_freq_factor, high_freq_factor;
        int64_t original_max_pos;
    } rope_llama3;
    bool tied_embeddings, qkv_bias;
};

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
    LLMQ_T_COUNT
};

// GGUF only: llama3 RoPE frequency divisors (Dh/2 f32) written by convert_hf_to_gguf.py; HF has
// rope_scaling in config.json instead.
#define LLMQ_GGUF_ROPE_FREQS "rope_freqs.weight"

struct llmq_tensor_name {
    const char *gguf; // GGUF name, after "blk.N." for per-block tensors ("attn_q.weight")
    const char *hf;   // HF name, after "model.layers.N." for per-block tensors ("self_attn.q_proj.weight")
    bool per_block;   // per decoder block
    int linear;       // its enum llmq_linear for a linear's weight or bias, else -1
    bool qk_rows;     // rows follow the q/k head layout (q, k weights and biases): see "Q/K row permutation"
};

// The table row of a role (never NULL for role < LLMQ_T_COUNT).
const struct llmq_tensor_name *llmq_tensor_name_of(enum llmq_tensor_role role);

// Writes the full tensor name of role (block `layer`, ignored for global tensors) in GGUF (hf false)
// or HF (hf true) spelling into buf. Returns buf.
char *llmq_tensor_full_name(enum llmq_tensor_role role, int64_t layer, bool hf, char *buf, size_t size);

// The role of a full tensor name in GGUF or HF spelling, with *layer its block (-1 for global
// tensors); -1 when the name is not in the table or its block index is malformed or >= n_layer.
int llmq_tensor_role_of(const char *name, bool hf, int64_t n_layer, int64_t *layer);

// A linear's GGUF stem ("attn_q") and HF module path within a block ("self_attn.q_proj").
const char *llmq_linear_gguf_name(enum llmq_linear l);
const char *llmq_linear_hf_name(enum llmq_linear l);
// A linear's full stem in block `layer`: "blk.N.attn_q" (GGUF) or "model.layers.N.self_attn.q_proj" (HF),
// the prefix of its tensors (".weight"; the quantized formats' ".qweight", ".scales", ...). Returns buf.
char *llmq_linear_full_name(enum llmq_linear l, int64_t layer, bool hf, char *buf, size_t size);
const char *llmq_linear_name(enum llmq_linear l); // short: "q", "k", "v", "o", "gate", "up", "down"

const char *llmq_arch_name(enum llmq_arch a); // "llama", "mistral", "qwen2"

// True when the GGUF form of architecture a stores q/k rows permuted relative to HF (llama, mistral).
bool llmq_arch_qk_permuted(enum llmq_arch a);

// The source row of output row r of a (n_rows, ·) q or k tensor with n_head heads, converting HF ->
// GGUF (to_gguf) or GGUF -> HF; see "Q/K row permutation". n_rows must be a multiple of 2 * n_head.
int64_t llmq_arch_qk_src_row(int64_t r, int64_t n_rows, int64_t n_head, bool to_gguf);

// The per-pair RoPE frequency divisors ff (Dh/2) of llama3 scaling (hp->rope_llama3; all 1 when it
// is disabled), as llama.cpp's convert_hf_to_gguf.py / transformers' _compute_llama3_parameters
// compute them: pair i rotates by pos * theta^(-2i/Dh) / ff[i].
void llmq_rope_llama3_factors(const struct llmq_hparams *hp, float *ff);

#endif // LLMQ_FORMATS_LLAMA_ARCH_H
