/*
 * calib/tokenizer/tokenizer.h — text <-> token ids, identical to llama.cpp's tokenizer (src/llama-vocab.cpp,
 * src/unicode.cpp; checked token for token by tests/py/test_tokenizer_oracle.py against
 * llama-cpp-python 0.3.36, on the whole of wiki.test.raw and ~250 adversarial texts).
 *
 * Two tokenizer families are supported, those of the LLaMA-family models llmq quantizes:
 *
 *   SPM  (GGUF tokenizer.ggml.model = "llama"): SentencePiece-style BPE as llama.cpp's
 *        llm_tokenizer_spm: spaces become U+2581 "▁", a "▁" is put in front of the text (and of
 *        every text fragment that follows a special token) when add_space_prefix is set (default
 *        true), the text is cut into UTF-8 characters (by lead byte), adjacent pieces whose
 *        concatenation is a token merge greedily by the highest token SCORE (ties: leftmost first),
 *        and a piece that is no token goes out byte by byte as <0xXX> tokens. Models: Llama 1/2,
 *        Mistral v0.1, TinyLlama, stories260K.
 *   BPE  (GGUF tokenizer.ggml.model = "gpt2"): GPT-2 byte-level BPE. The text is decoded as llama.cpp
 *        does (a bad byte becomes U+FFFD), split into words by the pattern chain of the "pre" type,
 *        each word's bytes are mapped to GPT-2's printable alphabet and merged by MERGE RANK (lowest
 *        first; ties: leftmost). A word left with a piece that is no token gives the tokens of that
 *        piece's single bytes, when they exist. tokenizer.ggml.pre values (llama.cpp's names):
 *          "default" (also when absent): [\p{P}$+<=>^~|]+, then GPT-2's pattern, \p{N}+, [0-9]{3}
 *          "gpt-2" (and phi-2, mpt, olmo, jais, ...): 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|...
 *          "smollm" (and starcoder, refact, command-r, ...): every \p{N} alone, then GPT-2's pattern
 *          "llama3" / "llama-bpe" / "llama-v3" (...): the Llama 3 pattern (\p{N}{1,3}, (?i:'s...));
 *                   a word that is a token as a whole is not merged (ignore_merges); adds BOS
 *          "qwen2" (and stablelm2, deepseek-r1-qwen, ...): the Qwen2 pattern (single digits)
 *        The patterns are written by hand (no regex library) after llama.cpp's unicode.cpp, with its
 *        Unicode 15.1 character classes (calib/tokenizer/unicode.h).
 *
 * Not supported (LLMQ_ERR_UNSUPPORTED, naming the file and the value): WordPiece ("bert"), Unigram
 * ("t5"), RWKV, PLaMo-2, and BPE pre types with other patterns (deepseek, falcon, gpt-4o, ...).
 *
 * ---- Special tokens --------------------------------------------------------------------------------
 * Tokens of type CONTROL (3), USER_DEFINED (4) and UNKNOWN (2) are "special" (plus, as llama.cpp, the
 * end-of-generation / FIM texts such as "<|im_end|>", "</s>", "<|fim_prefix|>" count as CONTROL
 * whatever their stored type). Before the family's algorithm runs, the text is cut at every
 * occurrence of a special token's text, longest token first (llama.cpp's tokenizer_st_partition):
 * USER_DEFINED tokens always, CONTROL and UNKNOWN only with parse_special.
 *
 * ---- BOS / EOS --------------------------------------------------------------------------------------
 * add_special adds BOS in front if the model adds BOS, EOS at the end if it adds EOS. Defaults as
 * llama.cpp: SPM adds BOS; BPE adds BOS only for the llama3 pre types; GGUF
 * tokenizer.ggml.add_bos_token / add_eos_token override. Default ids (when the keys are absent): SPM
 * bos 1, eos 2, unk 0; BPE bos = eos = 11 (llama.cpp's, if inside the vocabulary).
 *
 * ---- Hugging Face directories ----------------------------------------------------------------------
 * tokenizer.json must hold a "BPE" model. Byte-level when the pre_tokenizer has a ByteLevel step; the
 * pre type is recognised from its shape: ByteLevel(use_regex) = gpt-2; Sequence[Digits(individual
 * digits), ByteLevel(use_regex)] = smollm; Sequence[Split(Regex = the Llama 3 / Qwen2 / GPT-2
 * pattern, Isolated), ByteLevel(use_regex false)] = llama-bpe / qwen2 / gpt-2. An NFC normalizer
 * (Qwen2) is accepted and, as by llama.cpp, not applied. SentencePiece-style when model.byte_fallback
 * is set or a Metaspace pre-tokenizer / Replace(" " -> "▁") normalizer is present; add_space_prefix
 * comes from a Prepend("▁") normalizer or the Metaspace prepend_scheme. Merges may be "a b" strings
 * or ["a", "b"] pairs. What convert_hf_to_gguf.py + gguf-py would write into a GGUF is rebuilt:
 *   - ids 0..n-1, n = 1 + the largest id of model.vocab / added_tokens, or config.json vocab_size if
 *     larger; a missing id becomes "[PAD<id>]" of type UNUSED;
 *   - types: added_tokens are CONTROL when "special" (or looking special: "<|...|>", "<pad>", ...),
 *     else USER_DEFINED; SPM: "<0xXX>" pieces BYTE, model.unk_token UNKNOWN; the rest NORMAL;
 *   - SPM scores: tokenizer.json has no scores; a piece made by merges scores minus the rank of the
 *     first merge that makes it (merges are ordered by piece score in files converted from
 *     SentencePiece), other NORMAL pieces -(n_merges + id), the rest 0. llmq convert stores the
 *     exact GGUF values in two extra keys that Hugging Face's loader ignores and that are used when
 *     present: model.llmq_scores (n floats) and model.llmq_token_types (n ints, enum llmq_token_type);
 *   - bos / eos / unk / pad: tokenizer_config.json *_token (a string or {"content"}), looked up in
 *     added_tokens then the vocabulary, else config.json *_token_id; SPM falls back to "<s>", "</s>",
 *     "<unk>"; add_bos / add_eos: a TemplateProcessing post-processor that starts (ends) with the
 *     BOS (EOS) token, overridden by tokenizer_config.json add_bos_token / add_eos_token.
 *
 * ---- Decode ----------------------------------------------------------------------------------------
 * llmq_token_to_piece is llama.cpp's llama_token_to_piece(lstrip = 0): CONTROL and UNKNOWN tokens
 * give nothing unless render_special (then their text), USER_DEFINED tokens their text; NORMAL
 * tokens: SPM "▁" -> ' ', BPE the GPT-2 alphabet back to bytes; BYTE tokens <0xXX> that byte;
 * UNUSED / UNDEFINED tokens nothing. A piece may be part of a UTF-8 character: concatenate.
 *
 * ---- Where llmq differs from llama.cpp (inputs on which llama.cpp fails, or is unspecified) ---------
 *   - BPE text with a 4-byte sequence above U+10FFFF (lead bytes F5..F7): llama.cpp aborts
 *     (std::invalid_argument); llmq tokenizes the code point as U+FFFD.
 *   - SPM vocabulary without <0xXX> (and one-byte) tokens: llama.cpp throws; llmq emits unk.
 *   - Special tokens of equal text length are tried in id order (llama.cpp: std::sort, unspecified);
 *     every FIM spelling present is made CONTROL (llama.cpp: the first one it meets in hash order).
 *   - A model that adds BOS (EOS) without a BOS (EOS) id is refused at load (llama.cpp asserts when
 *     tokenizing).
 *
 * ---- Ownership, threads, limits ---------------------------------------------------------------------
 * A tokenizer owns copies of everything it needs (the GGUF reader may be freed after loading). It is
 * immutable after loading: calls on one tokenizer from several threads are safe; nothing is cached
 * globally. Texts up to 2^31 - 1 bytes per call; vocabularies up to 2^24 tokens, 2^26 merges, token
 * texts up to 1 MiB. Speed against llama.cpp's: bench/tokenize_speed.sh, figures in bench/README.md.
 */
#ifndef LLMQ_TOKENIZER_H
#define LLMQ_TOKENIZER_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct llmq_gguf;
struct llmq_tokenizer; // opaque

// GGUF token types (tokenizer.ggml.token_type), numbered as llama.cpp's llama_token_type.
enum llmq_token_type {
    LLMQ_TOKEN_TYPE_UNDEFINED = 0,
    LLMQ_TOKEN_TYPE_NORMAL = 1,
    LLMQ_TOKEN_TYPE_UNKNOWN = 2,
    LLMQ_TOKEN_TYPE_CONTROL = 3,
    LLMQ_TOKEN_TYPE_USER_DEFINED = 4,
    LLMQ_TOKEN_TYPE_UNUSED = 5,
    LLMQ_TOKEN_TYPE_BYTE = 6,
};

// The two families (see above).
enum llmq_tokenizer_kind { LLMQ_TOKENIZER_SPM, LLMQ_TOKENIZER_BPE };

// Loads the tokenizer from GGUF metadata: tokenizer.ggml.model ("llama" or "gpt2"), .pre (BPE only;
// absent = "default"), .tokens (required), .scores (optional f32 / i32: all 0), .token_type
// (optional i32: all NORMAL), .merges (BPE: required, "a b" strings split at the first space after
// the first byte), .bos_token_id, .eos_token_id, .unknown_token_id, .padding_token_id (an id outside
// the vocabulary keeps the default, with a warning, as llama.cpp), .add_bos_token, .add_eos_token,
// .add_space_prefix; general.name (phi-3 models: llama.cpp's RSTRIP rule for special tokens).
// On failure *out is NULL, one line naming the GGUF file and the key was logged, and the status is
// NOT_FOUND (a required key is missing), CORRUPT (wrong type, arrays shorter than the vocabulary, an
// empty vocabulary, BOS / EOS added but absent), UNSUPPORTED (model / pre type), OVERFLOW (limits) or
// NOMEM. On success free with llmq_tokenizer_free.
enum llmq_status llmq_tokenizer_load_gguf(const struct llmq_gguf *g, struct llmq_tokenizer **out);

// Loads the tokenizer of a Hugging Face model directory (see "Hugging Face directories"):
// dir/tokenizer.json (required), dir/tokenizer_config.json and dir/config.json (optional).
// Errors name the file and the problem: IO (missing / unreadable), CORRUPT (".../tokenizer.json: bad
// JSON at line 3 column 5: ...", no "model", model.vocab not an object or an id not in 0..2^24-1 or
// given twice, a merge that is not two tokens, an added token without id / content),
// UNSUPPORTED (model.type "Unigram", an unknown pre_tokenizer or normalizer, shown in the message).
enum llmq_status llmq_tokenizer_load_hf(const char *dir, struct llmq_tokenizer **out);

void llmq_tokenizer_free(struct llmq_tokenizer *t); // NULL is a no-op

// Tokenizes text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp does; text may be NULL
// when len is 0). add_special: add BOS / EOS by the model's rules (llama.cpp's add_special);
// parse_special: match CONTROL token texts like "<|im_start|>" in the input. On success *ids is a malloc'd array of
// *n_ids ids (the caller frees it; it is a valid pointer even when *n_ids == 0). Errors: LLMQ_ERR_ARG (NULL pointers,
// len > INT32_MAX), LLMQ_ERR_NOMEM; *ids is NULL and *n_ids 0 then.
enum llmq_status llmq_tokenize(const struct llmq_tokenizer *t, const char *text, size_t len, bool add_special,
                               bool parse_special, int32_t **ids, int64_t *n_ids);

// The bytes of token id (llama.cpp token_to_piece semantics, see "Decode") written to buf (no NUL).
// Returns the number of bytes written, or -(bytes needed) if size is too small (nothing written),
// or 0 for an id out of range.
int llmq_token_to_piece(const struct llmq_tokenizer *t, int32_t id, char *buf, int size, bool render_special);

int32_t llmq_tokenizer_n_vocab(const struct llmq_tokenizer *t);
int32_t llmq_tokenizer_bos(const struct llmq_tokenizer *t); // -1 if none
int32_t llmq_tokenizer_eos(const struct llmq_tokenizer *t); // -1 if none
bool llmq_tokenizer_add_bos(const struct llmq_tokenizer *t);

// ---- extra introspection (for llmq convert, which rebuilds GGUF / HF tokenizers from a loaded one)
bool llmq_tokenizer_add_eos(const struct llmq_tokenizer *t);
enum llmq_tokenizer_kind llmq_tokenizer_kind(const struct llmq_tokenizer *t);
// BPE: the tokenizer.ggml.pre value ("default" when it was absent; for HF directories "gpt-2",
// "smollm", "llama-bpe" or "qwen2"); NULL for SPM.
const char *llmq_tokenizer_pre(const struct llmq_tokenizer *t);
int32_t llmq_tokenizer_unk(const struct llmq_tokenizer *t); // -1 if none
int32_t llmq_tokenizer_pad(const struct llmq_tokenizer *t); // -1 if none
bool llmq_tokenizer_add_space_prefix(const struct llmq_tokenizer *t);
// The stored text of token id (SPM: with U+2581; BPE: in GPT-2's byte alphabet; an empty text reads
// "[EMPTY_<id>]" as in llama.cpp), its score (as stored or derived, see above; 0 when none) and its
// type as stored (the CONTROL overrides of "Special tokens" are not shown here). NULL / 0 / UNDEFINED
// for an id out of range.
const char *llmq_tokenizer_token_text(const struct llmq_tokenizer *t, int32_t id, size_t *len);
float llmq_tokenizer_token_score(const struct llmq_tokenizer *t, int32_t id);
enum llmq_token_type llmq_tokenizer_token_type(const struct llmq_tokenizer *t, int32_t id);
// BPE merges in rank order ("a b" with one space, as GGUF stores them); 0 / NULL for SPM.
int64_t llmq_tokenizer_n_merges(const struct llmq_tokenizer *t);
const char *llmq_tokenizer_merge(const struct llmq_tokenizer *t, int64_t rank, size_t *len);

#endif // LLMQ_TOKENIZER_H
