/*
 * quant/export.h — write a quantized model as an AutoAWQ "GEMM", a GPTQ (v1 / gptq_v2) or a
 * "fake-quantized" (dequantized) Hugging Face directory, streamed one linear layer at a time.
 *
 * What it is: the writers behind `llmq quantize --format awq|gptq|fake`. The caller (the quantize
 * driver) opens an export with the model being quantized, hands over one struct llmq_qlinear per
 * quantized linear as soon as it is done (llmq_export_layer), and finishes. Every other tensor
 * (embeddings, norms, q/k/v biases, lm_head) is read from the model's views when the output stream
 * reaches it. What it is not: no quantization (quant/quantizer.h, gptq.h, awq.h), no reading back
 * (calib/model/model.h loads all three kinds, dequantizing on load).
 *
 * Legend: R rows = out_features (N in the packers' code), C cols = in_features (K), G group size,
 *   ng = number of groups (C / G; 1 when G = -1), b bits, pk = 32 / b values per int32 word.
 *   HF names: <p> = model.layers.<l>.self_attn.{q,k,v,o}_proj | model.layers.<l>.mlp.{gate,up,down}_proj.
 *
 * ---- --format awq (AutoAWQ awq/modules/linear/gemm.py WQLinear_GEMM,
 *      awq/utils/packing_utils.py; transformers AwqConfig version "gemm") -------------------------
 *   <p>.qweight  I32 [C, R/8]   q transposed (W_T[k, n] = W[n, k]) and packed along R: word (k, j)
 *                               holds the 8 codes of columns n = 8j..8j+7 with nibble i (bits 4i..4i+3,
 *                               from the LSB) = code of n = 8j + order[i], order = {0,2,4,6,1,3,5,7}.
 *   <p>.qzeros   I32 [ng, R/8]  the integer zero points, raw (not minus one), packed the same way.
 *   <p>.scales   F16 [ng, R]    scales, rounded to nearest-even fp16.
 *   <p>.bias     F16 [R]        only where the model has one (qwen2 q/k/v).
 *   Requires b == 4, G > 0, C % G == 0, R % 8 == 0, and g_idx the identity c / G (no act-order):
 *   anything else is LLMQ_ERR_ARG / LLMQ_ERR_UNSUPPORTED naming the layer and what to use instead.
 *   config.json quantization_config = {"quant_method":"awq","bits":4,"group_size":G,
 *   "zero_point":true,"version":"gemm","modules_to_not_convert":null}. A symmetric
 *   quantization is written the same way with zeros 2^(b-1) (AutoAWQ's zero_point=false layout has no
 *   loader in transformers' GEMM path), so zero_point is always true.
 *
 * ---- --format gptq (AutoGPTQ / GPTQModel QuantLinear pack(), transformers
 *      GPTQConfig) -------------------------------------------------------------------------------
 *   <p>.qweight  I32 [C*b/32, R] packed along C: every 32 consecutive input channels form one
 *                               little-endian bit stream of b words (32*b bits), code of channel
 *                               32t+i at stream bits b*i .. b*i+b-1. For b = 2, 4, 8 this is the
 *                               plain "q[r, n] |= v[pk*r + j, n] << b*j"; for b = 3 codes straddle
 *                               words (AutoGPTQ's 10/1/10/1/10 scheme is the same bit stream).
 *   <p>.qzeros   I32 [ng, R*b/32] zeros packed the same way along R; v1 ("gptq", written when sym):
 *                               stored = zero - 1 (masked to b bits); gptq_v2 (written when asym):
 *                               stored = zero.
 *   <p>.scales   F16 [ng, R];   <p>.g_idx I32 [C] = group of each input channel in ORIGINAL column
 *                               order (act-order: not monotone; G = -1: all 0); <p>.bias F16 [R].
 *   Requires b in {2, 3, 4, 8}, C % 32 == 0 (b = 3) or C % pk == 0, R likewise (zeros), and
 *   C % G == 0 when G > 0. config.json quantization_config and quantize_config.json hold
 *   quant_method "gptq", bits, group_size, desc_act, sym, damp_percent, static_groups,
 *   true_sequential, checkpoint_format ("gptq" | "gptq_v2"), plus "lm_head": false.
 *
 * ---- --format fake ----------------------------------------------------------------------------
 *   A plain HF checkpoint: <p>.weight = llmq_qlinear_dequant() of each linear (scales in f32, not
 *   rounded to fp16), every tensor in opts->fake_dtype (default: the dtype of the input's linear
 *   weights when it is F32 / F16 / BF16, else F32 — a quantized GGUF such as Q4_1 gives F32).
 *   Any bits 2..8 and any group size (a G that does not tile C is fine: ng = ceil(C / G), the
 *   last group partial, as quant/quantizer.h produces it). Always an HF directory, also for a
 *   GGUF input (`llmq convert` turns it into a GGUF). It has NO quantization_config (transformers
 *   refuses unknown quant methods); it is recognised by the "llmq" key below and loads anywhere
 *   as an ordinary model.
 *
 * ---- Common to all three ---------------------------------------------------------------------
 *   - Files: config.json, generation_config.json (when the input has / implies one), the tokenizer
 *     files (copied from an HF input: tokenizer.json, tokenizer_config.json, special_tokens_map.json,
 *     tokenizer.model, vocab.json, merges.txt, chat_template.jinja when present; rebuilt from a GGUF
 *     vocabulary by formats/hf/hfdir.h llmq_hf_side_files), model.safetensors or shards + index
 *     (opts->max_shard_bytes), quantize_config.json (gptq only).
 *   - Non-quantized tensors: F16 for awq / gptq ("torch_dtype":"float16"), the fake dtype for fake.
 *     lm_head.weight is written only when the embeddings are not tied.
 *   - HF tensor names; a GGUF llama model's q/k row permutation is undone (formats/llama/arch.h
 *     llmq_arch_qk_src_row): whole output rows move, so codes, scales and zeros of a row move
 *     together; g_idx (per input column) is unaffected.
 *   - Provenance: config.json gets a top-level "llmq" object = {"format": "awq"|"gptq"|"fake",
 *     "bits", "group_size", "sym", ...opts->provenance's keys (llmq version, method, parameters,
 *     calibration sha256, seed — whatever the driver puts there)}; every safetensors shard's
 *     __metadata__ has "format":"pt", "llmq_format", and "llmq_provenance" = that object as compact
 *     JSON text.
 *   - Atomic: everything is built in "<out>.tmp.<pid>/" and renamed onto <out> by
 *     llmq_export_finish; on abort / failure / crash nothing is at <out> that was not there
 *     before. An existing <out> is refused (LLMQ_ERR_ARG) unless opts->force, and even then only
 *     when it is a directory llmq wrote (common/io.h LLMQ_OUTDIR_MARKER, written into every output
 *     directory), or empty (otherwise refused, never deleted).
 *
 * ---- Fused linears (phi3: formats/llama/arch.h llmq_arch_fused_part) -------------------------------------
 *   q, k, v and gate, up are handed over one by one (each its own qlinear, R its own rows) and written as ONE
 *   linear each, as the checkpoint stores them: <p> = model.layers.<l>.self_attn.qkv_proj (rows q | k | v) and
 *   model.layers.<l>.mlp.gate_up_proj (rows gate | up); rows are output features, so the packing above applies
 *   to the concatenated (R_q + R_k + R_v, C) codes, scales and zeros unchanged (AutoAWQ / GPTQModel / transformers
 *   read such a linear as any other). The rows are copied into the fused linear as they arrive and it is packed
 *   once its last member is in (held: the fused codes, about one byte per weight, until then). Every member must
 *   carry the same g_idx (GPTQ's act-order gives them one: they share one Hessian), else LLMQ_ERR_ARG.
 *
 * ---- Streaming and memory ------------------------------------------------------------------------
 *   llmq_export_begin declares every output tensor (shapes follow from the model and opts), in this
 *   order: embed_tokens; per block l: input_layernorm, q, k, v, o, post_attention_layernorm, gate,
 *   up, down (each linear's tensors together: qweight, qzeros, scales, g_idx, bias / weight, bias);
 *   model.norm; lm_head. The safetensors writer takes bytes in that order. llmq_export_layer packs
 *   the linear at once (the qlinear can be freed right after the call), then writes every pending
 *   tensor up to the next missing linear: a linear that arrives ahead of its turn is held packed
 *   (awq / gptq: about b/16 of its fp16 size; fake: its full converted size) until its turn.
 *   In order — block by block, linears q,k,v,o,gate,up,down, as the driver goes — nothing is held
 *   beyond one linear's packed buffers. llmq_export_finish writes model.norm and lm_head.
 *   Block l's input_layernorm, post_attention_layernorm and q / k / v biases are what
 *   llmq_export_block handed over for it (copies; AWQ's folded norms and v bias), else the model's
 *   views; every other tensor is the model's. They are read when the stream reaches them
 *   (input_layernorm when q arrives, post_attention_layernorm when gate arrives, biases with their
 *   linear), embed_tokens at the first call, model.norm / lm_head at finish.
 *
 * ---- Errors ---------------------------------------------------------------------------------------
 *   One log line naming the output / layer (e.g. "blk.3.ffn_down (576 x 1536): ...") and a status:
 *   LLMQ_ERR_ARG (output exists without force; layer / which out of range or given twice; a
 *   qlinear whose R, C, bits, group_size or sym differ from the export's; C % G != 0; R or C not a
 *   multiple of the packing; act-order g_idx for awq; finish with a linear missing),
 *   LLMQ_ERR_UNSUPPORTED (awq with bits != 4 or G = -1, gptq with bits not in {2,3,4,8}, a model
 *   tensor dtype that cannot be decoded), LLMQ_ERR_IO / _NOMEM, plus what formats/hf/hfdir.h and
 *   formats/safetensors.h return. Shape checks for every linear run in llmq_export_begin, so a
 *   format that cannot hold the model fails before anything is written. An llmq_export_layer call
 *   refused for its arguments (range, twice, a mismatching qlinear, a non-integer zero point, a
 *   code above 2^b - 1) changes nothing; one that fails while packing or writing poisons the
 *   export: later calls return the same status. Either way the caller ends with
 *   llmq_export_abort, or llmq_export_finish (which aborts when anything is missing or failed).
 */
#ifndef LLMQ_QUANT_EXPORT_H
#define LLMQ_QUANT_EXPORT_H

#include "calib/model/model.h"
#include "common/dtype.h"
#include "common/status.h"
#include "quant/quantizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

enum llmq_export_format { LLMQ_EXPORT_AWQ, LLMQ_EXPORT_GPTQ, LLMQ_EXPORT_FAKE };

struct llmq_export_opts {
    enum llmq_export_format format;
    struct llmq_qconfig q; // bits, group_size, sym: every qlinear must match
    // GPTQ quantization_config fields (they describe how the codes were made; loaders use desc_act)
    bool desc_act, static_groups, true_sequential;
    float damp_percent;
    enum llmq_dtype fake_dtype; // fake only: F32, F16 or BF16; LLMQ_DTYPE_COUNT = from the input (see above)
    uint64_t max_shard_bytes;   // tensor bytes per safetensors file; 0 = one file
    bool force;                 // replace an existing output directory
    const json_t *provenance;   // a JSON object (or NULL); its keys are copied into "llmq"
    // a moe model's router and experts (formats/llama/arch.h "Mixture of experts"): LLMQ_EXPERT_NAMES_HUB, the
    // family's checkpoint names (mixtral: block_sparse_moe.experts.E.w1 / w3 / w2; vLLM's loader), or
    // LLMQ_EXPERT_NAMES_GPTQMODEL, GPTQModel 7.7's (mixtral: mlp.experts.E.gate_proj / up_proj / down_proj and
    // mlp.gate; "expert_names": "gptqmodel" in the "llmq" object). awq / gptq only; LLMQ_ERR_ARG for a dense model
    // or fake. qwen3_moe / qwen2_moe: the same names either way.
    enum llmq_expert_names expert_names;
};

// Defaults: AWQ, 4 bits, group 128, asym, desc_act false, static_groups false, true_sequential
// true, damp_percent 0.01, fake dtype from the input, 5e9-byte shards, no force, no provenance, the Hub's expert
// names.
struct llmq_export_opts llmq_export_default_opts(void);

// "awq" / "gptq" / "fake", and the reverse (false when the name is unknown).
const char *llmq_export_format_name(enum llmq_export_format f);
bool llmq_export_format_parse(const char *name, enum llmq_export_format *out);

struct llmq_export; // opaque

// The checks llmq_export_begin starts with (options, and every linear's shape against the format), without
// writing anything: LLMQ_ERR_ARG / LLMQ_ERR_UNSUPPORTED and one line naming the linear, or LLMQ_OK.
enum llmq_status llmq_export_check(const struct llmq_model *m, const struct llmq_export_opts *o);

// The largest power of two <= group_size (>= 1) that divides the in_features of every linear of m: the
// group size to suggest when group_size does not tile some linear.
int llmq_export_fit_group(const struct llmq_model *m, int group_size);

/*
 * Checks that the format can hold every linear of m (see the per-format requirements), refuses an
 * existing output, creates "<out_dir>.tmp.<pid>/", writes config.json / tokenizer files /
 * quantize_config.json there and declares every tensor. m must outlive the export. On failure *out
 * is NULL, nothing is left behind, and one error line was logged.
 */
enum llmq_status llmq_export_begin(const struct llmq_model *m, const char *out_dir, const struct llmq_export_opts *o,
                                   struct llmq_export **out);

// Hands over the quantized linear `which` of block `layer` (see "Streaming"). ql is only read
// during the call: ql->q (R, C) codes, scales / zeros (R, ng), g_idx (C), all in the MODEL's row
// order (GGUF row order for a GGUF input; the writer undoes the q/k permutation).
enum llmq_status llmq_export_layer(struct llmq_export *e, int64_t layer, enum llmq_linear which,
                                   const struct llmq_qlinear *ql);

// A moe block's expert `expert`'s gate / up / down (which LLMQ_LIN_GATE, UP, DOWN), as llmq_export_layer; the dense
// gate / up / down of a moe block do not exist (LLMQ_ERR_ARG), nor an expert of a dense linear. Written as
// "<HF name of the expert's linear>.qweight" etc. (model.layers.N.mlp.experts.E.gate_proj for qwen3_moe,
// model.layers.N.block_sparse_moe.experts.E.w1 / w3 / w2 for mixtral, mlp.experts.E.gate_proj / up_proj / down_proj
// with opts.expert_names LLMQ_EXPERT_NAMES_GPTQMODEL); the router (mlp.gate / block_sparse_moe.gate) is written
// unquantized, in the output's dtype, before the experts.
enum llmq_status llmq_export_expert(struct llmq_export *e, int64_t layer, enum llmq_linear which, int64_t expert,
                                    const struct llmq_qlinear *ql);

// Hands over block `layer`'s input_layernorm, post_attention_layernorm and q / k / v biases as the driver's
// weight set ly holds them (attn_norm, ffn_norm, bq, bk, bv; a NULL one: the model's), copied during the call; they are
// written instead of the model's views. Before the block's q, k and v (LLMQ_ERR_ARG after); a second call
// replaces the first.
enum llmq_status llmq_export_block(struct llmq_export *e, int64_t layer, const struct llmq_layer *ly);

// Writes the remaining tensors, commits the safetensors files and renames the directory onto
// out_dir. Always frees e; on failure nothing is left at out_dir (an output replaced by force is
// only removed after the rename succeeded).
enum llmq_status llmq_export_finish(struct llmq_export *e);

// Removes the temporary directory and frees e. NULL: no-op.
void llmq_export_abort(struct llmq_export *e);

// ---- packing primitives (exposed for tests/unit/test_export.c and the loader in calib/model/model.c) --

// AWQ order: nibble i of a word holds column 8j + LLMQ_AWQ_ORDER[i].
extern const int LLMQ_AWQ_ORDER[8];

// Packs n codes v[0..n) (each < 2^bits) into n*bits/32 words of a little-endian bit stream (value
// i at bits [bits*i, bits*i + bits)). n*bits must be a multiple of 32. `stride` is the distance in
// elements between consecutive values in v (1 for a row, R for a column of a row-major (C, R) array).
void llmq_pack_bits(const uint8_t *v, int64_t stride, int64_t n, int bits, uint32_t *out);
// The inverse: n values from words into v (stride as above).
void llmq_unpack_bits(const uint32_t *words, int64_t n, int bits, uint8_t *v, int64_t stride);

// AWQ: packs 8 4-bit codes c[0..8) (c[i] = column 8j + i) into one word in LLMQ_AWQ_ORDER, and back.
uint32_t llmq_awq_pack8(const uint8_t *c);
void llmq_awq_unpack8(uint32_t w, uint8_t *c);

#endif // LLMQ_QUANT_EXPORT_H
