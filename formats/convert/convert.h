/*
 * formats/convert/convert.h — convert a LLaMA-family model between GGUF and a Hugging Face directory, and
 * between GGUF tensor types (f32 / f16 / bf16).
 *
 * What it is: the library behind `llmq convert`. Three directions, chosen from the input kind and
 * opts->to:
 *
 *   GGUF -> GGUF   every KV copied in order (general.file_type set: f32 0, f16 1, bf16 32;
 *                  general.quantization_version dropped: no tensor stays quantized), every tensor
 *                  in order: 1-D tensors (norms, biases) and the moe router (ffn_gate_inp) become f32
 *                  as llama.cpp keeps them, the others opts->dtype. Quantized tensors are dequantized bit-exactly as
 * ggml does (formats/ggml/quants.h), f32 -> f16 / bf16 rounds to nearest even. GGUF -> HF     a directory with
 * config.json, generation_config.json, tokenizer.json, tokenizer_config.json and model.safetensors (or
 * model-0000i-of-0000n.safetensors
 *                  + model.safetensors.index.json above opts->max_shard_bytes), every tensor in
 *                  opts->dtype under its HF name (table in calib/model/model.h), llama.cpp's q/k row
 *                  permutation undone for arch "llama".
 *   HF -> GGUF     llama-family metadata (general.*, <arch>.*, tokenizer.ggml.*), q/k rows permuted
 *                  for arch "llama" as llama.cpp's convert_hf_to_gguf.py does, GGUF tensor names,
 *                  types as GGUF -> GGUF.
 *
 * Architectures: GGUF "llama" (llama, mistral, stories260K, SmolLM2), "qwen2" (q/k/v biases, no
 * permutation: NEOX RoPE in both formats) and "qwen3" (no biases, per-head q_norm / k_norm, no
 * permutation), "gemma2" and "gemma3" (post norms, norm weights stored as 1 + w: HF -> GGUF adds 1 to every
 * norm weight in f32 as conversion/gemma.py does, GGUF -> HF subtracts it, so a round trip gives w back within
 * 2^-23; the window / soft-capping / local RoPE keys as formats/llama/arch.h "Gemma"); HF model_type "llama",
 * "mistral" (written as GGUF "llama", as llama.cpp does), "qwen2", "qwen3", "gemma2" and "gemma3_text"; the
 * mixtures of experts "mixtral" (GGUF "llama" with <arch>.expert_count) and "qwen3_moe" (GGUF "qwen3moe"), see
 * "Experts".
 * Anything else (GGUF "mistral" included): LLMQ_ERR_UNSUPPORTED naming it; so is a Gemma model a GGUF cannot
 * express (formats/llama/arch.h llmq_hparams_to_gguf).
 * Hyper-parameters: read and written by formats/llama/arch.h ("Hyper-parameters": the GGUF keys and
 * config.json keys, defaults and checks); here an absent context length is written as 2048 and HF
 * vocab_size is required.
 *
 * ---- The q/k permutation ----------------------------------------------------------------------
 * HF applies RoPE to the two halves of a head (rotate_half); llama.cpp's "llama" rotates adjacent
 * pairs, so convert_hf_to_gguf.py reorders the rows of q_proj / k_proj per head:
 *   permute(W) = W.reshape(n_head, 2, Dh/2, C).swapaxes(1, 2).reshape(R, C)
 * i.e. GGUF row h*Dh + 2*i + j holds HF row h*Dh + j*Dh/2 + i (i < Dh/2, j in {0, 1}); k uses
 * n_head_kv. llmq_arch_qk_src_row() (formats/llama/arch.h) gives the source row of an output row in either direction.
 *
 * ---- Experts (mixtral, qwen3_moe, qwen2_moe: formats/llama/arch.h "Mixture of experts") ----------
 * qwen2_moe's shared expert (mlp.shared_expert.*_proj <-> ffn_{gate,up,down}_shexp) converts as dense linears, its
 * gate mlp.shared_expert_gate (1, D) <-> ffn_gate_inp_shexp in f32 (GGUF ne [D, 1] as convert_hf_to_gguf.py writes
 * it; a 1-D (D) input, llama-quantize's form, is read too and written back to HF as (1, D)); the KVs add
 * .expert_feed_forward_length and .expert_shared_feed_forward_length.
 * HF -> GGUF stacks the E per-expert tensors of a block (model.layers.N.block_sparse_moe.experts.X.w1 / w3 / w2,
 * or mlp.experts.X.gate_proj / up_proj / down_proj) into one 3-D tensor each, expert X's rows at [X] as
 * convert_hf_to_gguf.py's torch.stack: blk.N.ffn_gate_exps / ffn_up_exps (E, Fe, D), ffn_down_exps (E, D, Fe),
 * in opts->dtype; the router (E, D) becomes blk.N.ffn_gate_inp.weight in f32 (convert_hf_to_gguf.py keeps
 * FFN_GATE_INP in f32). The KVs: <arch>.expert_count, .expert_used_count, and for qwen3moe
 * .expert_feed_forward_length (formats/llama/arch.h). A missing or repeated expert, or one of another shape, is
 * refused naming it. GGUF -> HF splits every stacked tensor back into the E per-expert tensors (rows of the
 * stacked tensor, no copy before conversion); config.json gets num_local_experts / num_experts,
 * num_experts_per_tok, moe_intermediate_size and norm_topk_prob true (llama.cpp always renormalises). A qwen3_moe
 * with norm_topk_prob false has no GGUF form (LLMQ_ERR_UNSUPPORTED before anything is written).
 *
 * ---- Tokenizer ---------------------------------------------------------------------------------
 * GGUF -> HF rebuilds tokenizer.json from tokenizer.ggml.*:
 *   "gpt2"  byte-level BPE: model BPE (vocab = every token by id, merges = tokenizer.ggml.merges in
 *           order), pre_tokenizer for tokenizer.ggml.pre: gpt2-like pres ("gpt-2", "mpt", "olmo",
 *           ...) ByteLevel(use_regex); smollm-like ("smollm", "starcoder", "refact", ...) Digits
 *           (individual) + ByteLevel; llama3-like ("llama-bpe", "llama3", "dbrx", ...) Split(llama3
 *           regex, Isolated) + ByteLevel(no regex) with ignore_merges; qwen2-like ("qwen2",
 *           "stablelm2", ...) Split(qwen2 regex) + ByteLevel. Other pres: LLMQ_ERR_UNSUPPORTED.
 *   "llama" SentencePiece-style BPE: byte_fallback, normalizer Prepend("▁") (when
 *           add_space_prefix, llama.cpp's default) + Replace(" " -> "▁"), no pre-tokenizer, merges
 *           generated from the vocabulary: every split of a token into two tokens, ordered by the
 *           merged token's score (highest first), then by the merged, left and right ids — the
 *           order transformers' SentencePieceExtractor produces — so BPE by rank merges what
 *           llama.cpp's SPM merges by score.
 * Token types map to tokenizer.json as: CONTROL (3) -> added token, special; USER_DEFINED (4) ->
 * added token, not special; UNKNOWN (2) -> added token, special, and model.unk_token; UNUSED (5)
 * named "[PAD<id>]" -> left out (HF -> GGUF recreates them); NORMAL (1), BYTE (6) -> vocab only.
 * tokenizer_config.json carries add_bos_token / add_eos_token, bos/eos/unk/pad/sep/mask tokens and
 * the chat template; config.json and generation_config.json carry bos/eos ids.
 * HF -> GGUF reads them back: tokens by id from model.vocab and added_tokens (ids missing from
 * both up to config vocab_size become "[PAD<id>]" UNUSED, as llama.cpp does); types as above, plus
 * BYTE for "<0xXX>" in an SPM vocabulary; "gpt2" merges in order; "llama" scores are not stored by
 * tokenizer.json: they are recreated the way SentencePiece assigns them to a BPE model, piece i of
 * the NORMAL pieces in id order gets score -i (from -0.0), every other token 0 — exactly the scores
 * of stories260K / llama tokenizers; a GGUF whose scores are not of that form gets a warning on
 * GGUF -> HF (its merge order is kept, the score values are not).
 *   Round trip: GGUF -> HF -> GGUF at f32 reproduces every tensor byte and tokenizer.ggml.tokens,
 *   token_type, merges and scores exactly for such vocabularies (tests/py/test_convert_oracle.py).
 *   Not carried through HF: general.* descriptions, eot/eom/fim token ids, tokenizer.ggml.pre names
 *   that share a pattern (they come back as the canonical name: "gpt-2", "smollm", "llama-bpe",
 *   "qwen2"), UNUSED tokens not named "[PAD<id>]" (come back NORMAL).
 *
 * ---- Rope scaling ------------------------------------------------------------------------------
 * HF rope_scaling {"rope_type": "llama3", ...} -> GGUF tensor rope_freqs.weight (n_rot/2 f32 factors,
 * computed by formats/llama/arch.h llmq_rope_llama3_factors); "linear" -> <arch>.rope.scaling.type/.factor.
 * GGUF -> HF: rope.scaling.type "linear" back to rope_scaling; rope_freqs.weight is fitted to llama3
 * parameters (low_freq_factor 1) and accepted only when regenerating the factors reproduces the
 * tensor (relative error <= 1e-6); otherwise LLMQ_ERR_UNSUPPORTED. Other scaling types: UNSUPPORTED.
 *
 * ---- Output, atomicity, memory ------------------------------------------------------------------
 * An existing output is refused (LLMQ_ERR_ARG) unless opts->force; with force, a GGUF output must be
 * a regular file and an HF output a directory llmq wrote (common/io.h LLMQ_OUTDIR_MARKER) or an empty
 * one: anything else is refused rather than deleted. The output is never visible half-written: a GGUF goes to
 * "<out>.tmp.<pid>" and is renamed at the end (formats/gguf.h writer); an HF directory is built as
 * "<out>.tmp.<pid>/" and renamed onto <out> at the end (the replaced directory is removed after
 * the rename). Every input check (architecture, names, shapes, dtypes, vocabulary) runs before
 * anything is created, so a bad input leaves nothing behind. The input is never written, and the
 * output may not be the input. Tensors stream one at a time through a work buffer of a few MiB
 * (rows are converted in chunks): memory stays far below one f32 copy of the model.
 * Progress: one line per tensor on stderr (llmq_info) when opts->progress.
 *
 * ---- Errors -------------------------------------------------------------------------------------
 * Every failure logs one line naming the file and tensor / key and returns: LLMQ_ERR_ARG (bad
 * options, output exists, output == input), LLMQ_ERR_UNSUPPORTED (architecture, tensor name, dtype
 * that cannot be decoded, tokenizer kind, rope scaling), LLMQ_ERR_CORRUPT (shapes that contradict the
 * hyper-parameters, malformed tokenizer arrays or JSON), LLMQ_ERR_NOT_FOUND (missing key / file /
 * tensor), plus what formats/gguf.h and formats/safetensors.h return for damaged files.
 */
#ifndef LLMQ_FORMATS_CONVERT_H
#define LLMQ_FORMATS_CONVERT_H

#include "common/dtype.h"
#include "common/status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

enum llmq_convert_to {
    LLMQ_CONVERT_TO_AUTO, // GGUF when the output path ends in ".gguf", else the other format (GGUF -> HF)
    LLMQ_CONVERT_TO_GGUF,
    LLMQ_CONVERT_TO_HF,
};

struct llmq_convert_opts {
    enum llmq_convert_to to;
    enum llmq_dtype dtype;    // LLMQ_DTYPE_F32, _F16 or _BF16 (anything else: LLMQ_ERR_ARG)
    uint64_t max_shard_bytes; // HF output: tensor bytes per safetensors file; 0 = a single file
    bool force;               // replace an existing output (see "Output")
    bool progress;            // one line per tensor on stderr
};

// What a conversion did (for the CLI summary and tests).
struct llmq_convert_stats {
    int64_t n_tensors;
    int64_t n_params;   // elements over all written tensors
    uint64_t bytes_out; // tensor bytes written
    int n_shards;       // HF output: safetensors files; 1 for GGUF
    double seconds;     // wall time of the whole conversion
};

// Defaults: AUTO, F32, 5 GB shards (5e9 bytes, Hugging Face's default), no force, no progress.
struct llmq_convert_opts llmq_convert_default_opts(void);

// Converts the model at `in` (a GGUF file or an HF directory) to `out` (see the header comment).
// stats may be NULL. On failure nothing exists at `out` that was not there before, and the
// temporary output is removed.
enum llmq_status llmq_convert(const char *in, const char *out, const struct llmq_convert_opts *opts,
                              struct llmq_convert_stats *stats);

// The pieces of an HF directory that the quantized-model writers share with the converter (the GGUF keys
// of an HF directory, the non-tensor files, the output staging) are formats/hf/hfdir.h.

#endif // LLMQ_FORMATS_CONVERT_H
