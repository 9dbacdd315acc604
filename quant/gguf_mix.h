/*
 * quant/gguf_mix.h — the type of every tensor of a quantized GGUF file: llama.cpp's "mixes"
 * (`llama-quantize ... Q4_K_M`) and the user's overrides.
 *
 * What it is: a port of llama.cpp's per-tensor type selection (src/llama-quant.cpp of the llama.cpp
 * vendored by llama-cpp-python 0.3.36: llama_ftype_get_default_type, tensor_allows_quantization,
 * tensor_get_category, llama_tensor_get_type / _impl with use_more_bits and the attention_wv /
 * ffn_down counters, tensor_type_fallback), so that `llmq quantize --method rtn` chooses exactly the
 * types llama_model_quantize chooses, plus llmq's handling of tensors no type can hold.
 * What it is not: no encoding (formats/ggml/encode.h), no file writing (quant/gguf_export.h).
 *
 * ---- The rules (in llama.cpp's order; only the branches reachable with the ftypes below) --------
 *   1. Which tensors are quantized at all (llama.cpp tensor_allows_quantization): names ending in
 *      "weight", with at least 2 dims (ggml_n_dims: trailing dims of 1 do not count), not
 *      "*_norm.weight", not ffn_gate_inp / altup / laurel / per_layer_model_proj / position_embd /
 *      token_types / ssm_conv1d / shortconv / time_mix_* / attn_rel_b / ... (the list is in the .c).
 *      The others keep their type when it is F32, F16 or BF16 and ≥ 2-D; 1-D tensors (norms,
 *      biases, rope_freqs) are always F32 (llama.cpp keeps whatever the input has: F32 for every
 *      file llama.cpp's converters write).
 *   2. The ftype's default type (Q4_K_M -> Q4_K, Q3_K_L -> Q3_K, IQ4_XS -> IQ4_XS, F16 -> F16 ...).
 *   3. --embedding-type on token_embd.weight and --output-type on output.weight win outright.
 *   4. Only when the default type is a block type: the first --tensor-type whose regex matches the
 *      name (search anywhere in the name, like std::regex_search) sets the type ("manual"); else,
 *      unless --pure, the mix rules by category (token_embd / output / attn_v / attn_k / attn_q /
 *      attn_output / ffn_down / ffn_gate / ffn_up, matched by substring as llama.cpp does):
 *        - output.weight, and token_embd.weight when the model has no output.weight (tied): the
 *          --output-type if given, else Q8_0 when its row length is not a multiple of the default
 *          type's block, else Q6_K unless the default is Q8_0;
 *        - attn_v: Q2_K -> Q4_K if n_gqa >= 4 else Q3_K; Q3_K_M -> Q5_K for the first two attn_v
 *          tensors, Q4_K after; Q3_K_L -> Q5_K; IQ4_NL / IQ4_XS with n_gqa >= 4 -> Q5_K; Q4_K_M /
 *          Q5_K_M -> Q6_K where use_more_bits(i, n); Q4_K_S -> Q5_K for the first 4; a 70B llama
 *          (80 layers, GQA) bumps Q3_K / Q4_K to Q5_K; n_expert == 8 -> Q8_0. The counter i counts
 *          the attn_v tensors that reached this rule, n all attn_v tensors of the file.
 *        - ffn_down (layer i of n_layer, from a counter of the ffn_down tensors that reached this rule,
 *          or the name when n_expert > 1): Q2_K -> Q3_K; Q3_K_M -> Q5_K below n/16 else Q4_K;
 *          Q3_K_L -> Q5_K; Q4_K_M -> Q6_K where use_more_bits; IQ4_NL / IQ4_XS without imatrix ->
 *          Q5_K below n/8; Q5_K_M -> Q6_K where use_more_bits; Q4_K_S -> Q5_K below n/8; Q4_0 / Q5_0
 *          WITH an imatrix -> Q4_1 / Q5_1 below n/8.
 *        - attn_output: Q2_K -> Q3_K, Q3_K_M -> Q4_K, Q3_K_L -> Q5_K (n_expert == 8: Q5_K for most).
 *        - attn_k, attn_q, ffn_gate, ffn_up: unchanged for these ftypes (n_expert == 8: attn_k Q8_0).
 *      use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 (integer division).
 *   5. The fallback when the row length (ne[0], the innermost dim) is not a multiple of the chosen
 *      type's block: IQ4_XS -> IQ4_NL; Q2_K, Q3_K -> Q4_0; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0;
 *      a 32-element type stays; and when the result still does not tile the row: F16. llama.cpp
 *      0.3.36 does the same (older releases refused such tensors, e.g. stories260K's 172-wide
 *      ffn_down at Q4_0). llmq applies the same fallback to --output-type / --embedding-type
 *      choices, which llama.cpp takes as given (and then fails on a row they do not tile).
 *   The order of the tensors matters (the counters): pass them in the file order of
 *   llama_model_quantize, which is llmq_gguf_mix_name_cmp order.
 *
 * ---- Types llmq can write ---------------------------------------------------------------------
 *   F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS
 *   (formats/ggml/encode.h). An override naming another type is refused (LLMQ_ERR_UNSUPPORTED).
 *
 * ---- --tensor-type REGEX=TYPE -----------------------------------------------------------------
 *   As llama-quantize parses it: split at the first '=', the REGEX lower-cased, TYPE a ggml type
 *   name in any case ("q8_0", "Q4_K"). The regex is POSIX extended (regcomp REG_EXTENDED), not
 *   ECMAScript like std::regex: the same for the usual patterns (".", "\\.", "[0-9]+", "|", "^", "$",
 *   "(...)"), different for ECMAScript-only syntax (\d, \w, lazy quantifiers, lookahead).
 */
#ifndef LLMQ_QUANT_GGUF_MIX_H
#define LLMQ_QUANT_GGUF_MIX_H

#include "calib/model/model.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor.h"

#include <stdbool.h>
#include <stdint.h>

// llama.cpp's llama_ftype values (general.file_type).
enum llmq_gguf_ftype {
    LLMQ_GGUF_FTYPE_F32 = 0,
    LLMQ_GGUF_FTYPE_F16 = 1,
    LLMQ_GGUF_FTYPE_Q4_0 = 2,
    LLMQ_GGUF_FTYPE_Q4_1 = 3,
    LLMQ_GGUF_FTYPE_Q8_0 = 7,
    LLMQ_GGUF_FTYPE_Q5_0 = 8,
    LLMQ_GGUF_FTYPE_Q5_1 = 9,
    LLMQ_GGUF_FTYPE_Q2_K = 10,
    LLMQ_GGUF_FTYPE_Q3_K_S = 11,
    LLMQ_GGUF_FTYPE_Q3_K_M = 12,
    LLMQ_GGUF_FTYPE_Q3_K_L = 13,
    LLMQ_GGUF_FTYPE_Q4_K_S = 14,
    LLMQ_GGUF_FTYPE_Q4_K_M = 15,
    LLMQ_GGUF_FTYPE_Q5_K_S = 16,
    LLMQ_GGUF_FTYPE_Q5_K_M = 17,
    LLMQ_GGUF_FTYPE_Q6_K = 18,
    LLMQ_GGUF_FTYPE_IQ4_NL = 25,
    LLMQ_GGUF_FTYPE_IQ4_XS = 30,
    LLMQ_GGUF_FTYPE_BF16 = 32,
};

// "Q4_K_M" etc., case-insensitive; also llama-quantize's aliases Q3_K (= Q3_K_M), Q4_K (= Q4_K_M),
// Q5_K (= Q5_K_M). false for anything else.
bool llmq_gguf_ftype_parse(const char *s, enum llmq_gguf_ftype *out);
const char *llmq_gguf_ftype_name(enum llmq_gguf_ftype f); // "Q4_K_M"; "?" if unknown
// The ftype's default tensor type (llama_ftype_get_default_type); LLMQ_DTYPE_INVALID if unknown.
enum llmq_dtype llmq_gguf_ftype_default_type(enum llmq_gguf_ftype f);
// The list of supported ftype names, comma separated (for messages and --help).
const char *llmq_gguf_ftype_list(void);

// true for the tensor types llmq can write into a GGUF (see "Types llmq can write").
bool llmq_gguf_mix_type_ok(enum llmq_dtype t);

// One --tensor-type: regex (as given, lower-cased by the parser) and type.
struct llmq_gguf_tensor_type {
    const char *regex;
    enum llmq_dtype type;
};

// Parses "REGEX=TYPE" into *out (out->regex is a malloc'd lower-cased copy: free it). Checks that
// the regex compiles and the type is writable. Errors (logged, naming the argument): LLMQ_ERR_ARG.
enum llmq_status llmq_gguf_tensor_type_parse(const char *arg, struct llmq_gguf_tensor_type *out);

struct llmq_gguf_mix_opts {
    enum llmq_gguf_ftype ftype;
    enum llmq_dtype output_type, embedding_type; // LLMQ_DTYPE_COUNT = from the mix
    bool pure;                                   // no mix rules: the default type everywhere (+ fallback)
    int n_overrides;
    const struct llmq_gguf_tensor_type *overrides; // (n_overrides) first match wins
    bool have_imatrix;                             // changes Q4_0 / Q5_0 / IQ4_* ffn_down choices
};

// Defaults: Q8_0, no output / embedding type, not pure, no overrides, no imatrix.
struct llmq_gguf_mix_opts llmq_gguf_mix_default_opts(void);

// What the rules read from the model (llama.cpp hparams).
struct llmq_gguf_mix_model {
    int64_t n_layer;           // block count (llama.cpp n_ffn_down = n_layer_all)
    int64_t n_head, n_head_kv; // n_gqa = n_head / n_head_kv (0 when n_head_kv is 0)
    int64_t n_expert;          // <arch>.expert_count: mixtral / qwen3_moe's E, 0 for the dense families
    bool is_70b;               // llama.cpp LLM_TYPE_70B: 80 blocks, and GQA for llama
};
void llmq_gguf_mix_model_from_hparams(const struct llmq_hparams *hp, struct llmq_gguf_mix_model *out);

// One tensor of the output file, in file order.
struct llmq_gguf_mix_tensor {
    const char *name; // GGUF name
    int n_dims;
    int64_t shape[LLMQ_MAX_DIMS]; // outermost first (shape[n_dims - 1] is the row, ggml ne[0])
    enum llmq_dtype src_type;     // the input's type (kept for non-quantized tensors, see rule 1)
};

struct llmq_gguf_mix_choice {
    enum llmq_dtype type;   // what the file gets
    enum llmq_dtype wanted; // the rules' choice before the fallback (== type without one)
    bool quantized;         // rule 1 allowed quantizing it
    bool manual;            // a --tensor-type matched
    bool fallback;          // rule 5 changed the type
    char note[112];         // "" or why: "ncols 576 not divisible by 256 (q4_k) -> q5_0", "override ..."
};

// The type of each of the n tensors t (file order) into out (n). Errors (logged): LLMQ_ERR_ARG for a
// regex that does not compile, an unknown ftype; LLMQ_ERR_UNSUPPORTED for an output / embedding /
// override type llmq cannot write. Logs one warning summing up the fallbacks (llama.cpp logs one per
// tensor; llmq names each in its progress line, and logs it as a debug line at planning).
enum llmq_status llmq_gguf_mix_plan(const struct llmq_gguf_mix_model *mm, const struct llmq_gguf_mix_opts *o, int64_t n,
                                    const struct llmq_gguf_mix_tensor *t, struct llmq_gguf_mix_choice *out);

// The order of llama_model_quantize's output (llama_model_loader::weight_name_comparer): the block
// number parsed from "blk.%d." (-1 for names without it) first, then strcmp. A qsort-style result.
int llmq_gguf_mix_name_cmp(const char *a, const char *b);

#endif // LLMQ_QUANT_GGUF_MIX_H
