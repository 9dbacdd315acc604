/*
 * formats/hf/vocab.h — PRIVATE to formats/convert/convert.c and formats/hf/hfdir.c: the vocabulary of a model in GGUF
 * terms, read from GGUF metadata or from tokenizer.json (+ tokenizer_config.json), and written as either. The mapping
 * between the two is documented in formats/convert/convert.h ("Tokenizer"); this header only declares the shared
 * structure and the four entry points those two use.
 */
#ifndef LLMQ_FORMATS_HF_VOCAB_H
#define LLMQ_FORMATS_HF_VOCAB_H

#include "common/status.h"
#include "formats/gguf.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// llama.cpp's token types (tokenizer.ggml.token_type)
enum cv_token_type {
    CV_TOK_UNDEFINED = 0,
    CV_TOK_NORMAL = 1,
    CV_TOK_UNKNOWN = 2,
    CV_TOK_CONTROL = 3,
    CV_TOK_USER_DEFINED = 4,
    CV_TOK_UNUSED = 5,
    CV_TOK_BYTE = 6,
};

enum cv_kind { CV_SPM, CV_BPE }; // tokenizer.ggml.model "llama" / "gpt2"

// Special token roles carried by both formats: GGUF tokenizer.ggml.<gguf>_token_id and
// tokenizer_config.json "<hf>_token".
enum cv_special { CV_BOS, CV_EOS, CV_UNK, CV_PAD, CV_SEP, CV_MASK, CV_N_SPECIAL };

struct cv_vocab {
    enum cv_kind kind;
    char *pre;                     // BPE: tokenizer.ggml.pre as written to GGUF (owned); NULL for SPM
    int64_t n;                     // tokens
    char **tok;                    // (n) owned token texts (NUL-terminated; no inner NUL)
    size_t *tok_len;               // (n) byte lengths
    int32_t *type;                 // (n) enum cv_token_type
    float *scores;                 // (n) or NULL (BPE has none)
    int64_t n_merges;              // BPE only
    char **merge;                  // (n_merges) owned "left right" strings
    int64_t special[CV_N_SPECIAL]; // ids, -1 if none
    int add_bos, add_eos;          // 1 / 0, or -1 when the source says nothing
    int add_space_prefix;          // SPM: 1 / 0 / -1 (absent: llama.cpp's default, true)
    char *chat_template;           // owned or NULL
};

void cv_vocab_free(struct cv_vocab *v); // frees the members (v itself is the caller's); zeroed struct ok

// Reads tokenizer.ggml.* of g. Validates array types and lengths, ids, types. Refuses tokenizer
// models other than "llama" / "gpt2" and (for HF output) nothing else: pre names are checked by
// cv_vocab_write_hf.
enum llmq_status cv_vocab_from_gguf(const struct llmq_gguf *g, struct cv_vocab *v);

// Reads <dir>/tokenizer.json and (optional) <dir>/tokenizer_config.json; cfg is the parsed
// config.json (vocab_size, *_token_id fallbacks). n_vocab: the number of tokens the GGUF gets (the
// embedding rows); every tokenizer id must be below it.
enum llmq_status cv_vocab_from_hf(const char *dir, const json_t *cfg, int64_t n_vocab, struct cv_vocab *v);

// Sets every tokenizer.ggml.* key of v on w.
enum llmq_status cv_vocab_write_gguf(const struct cv_vocab *v, struct llmq_gguf_writer *w);

// Builds tokenizer.json and tokenizer_config.json for v (n_ctx: model_max_length). The caller
// writes them (JSON values it owns). src names the input for messages.
enum llmq_status cv_vocab_to_hf(const struct cv_vocab *v, const char *src, int64_t n_ctx, json_t **tokenizer_json,
                                json_t **tokenizer_config);

#endif // LLMQ_FORMATS_HF_VOCAB_H
