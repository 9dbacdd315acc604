/*
 * formats/hf/hfdir.h — a Hugging Face model directory as llmq writes one, shared by the converter
 * (formats/convert/convert.h) and the quantized-model writers (quant/export.h, quant/gguf_export.h):
 * the hyper-parameters as the HF side sees them, the non-tensor files (config.json, generation_config.json,
 * tokenizer files), the GGUF keys of an HF directory, and the staging of an output directory
 * ("<out>.tmp.<pid>/", renamed onto <out> when complete). The mapping of every key and tokenizer field is
 * documented in formats/convert/convert.h ("Tokenizer", "Rope scaling", "Output, atomicity, memory").
 *
 * Errors: one line naming the file and key / tensor, and the status (as formats/convert/convert.h).
 */
#ifndef LLMQ_FORMATS_HF_HFDIR_H
#define LLMQ_FORMATS_HF_HFDIR_H

#include "common/dtype.h"
#include "common/status.h"
#include "formats/gguf.h"
#include "formats/llama/arch.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

// ---- hyper-parameters as a GGUF <-> HF conversion reads them ---------------------------------------

// A GGUF's (formats/llama/arch.h llmq_hparams_from_gguf): context_length absent means 2048;
// general.architecture "mistral" is refused (llama.cpp writes mistral models as "llama"); a
// rope_freqs.weight tensor becomes llama3 rope_scaling (fitted, see "Rope scaling").
enum llmq_status llmq_hf_hparams_from_gguf(const struct llmq_gguf *g, struct llmq_hparams *hp);
// An HF directory's config.json into *cfg (owned: json_decref) and *hp: max_position_embeddings
// absent means 2048, and vocab_size is required (the GGUF vocabulary is padded to it).
enum llmq_status llmq_hf_hparams_from_dir(const char *dir, json_t **cfg, struct llmq_hparams *hp);
// general.name of a GGUF made from the HF directory dir: the directory's name. Returns buf.
const char *llmq_hf_model_name(const char *dir, char *buf, size_t size);

// ---- the non-tensor files ------------------------------------------------------------------------------

// The JSON files of an HF directory made from a GGUF (owned; llmq_hf_files_free).
struct llmq_hf_files {
    json_t *config, *generation, *tokenizer, *tokenizer_config;
};
// Builds them from GGUF g (read as llmq_hf_hparams_from_gguf gives hp) for weights of dtype: the
// vocabulary must have hp->n_vocab tokens (else LLMQ_ERR_CORRUPT). Nothing is written.
enum llmq_status llmq_hf_files_from_gguf(const struct llmq_gguf *g, const struct llmq_hparams *hp,
                                         enum llmq_dtype dtype, struct llmq_hf_files *out);
// Writes generation_config.json, tokenizer.json, tokenizer_config.json and (with_config) config.json
// into dir.
enum llmq_status llmq_hf_files_write(const struct llmq_hf_files *f, const char *dir, bool with_config);
void llmq_hf_files_free(struct llmq_hf_files *f);

// Writes the non-tensor files of an HF directory for the model at `in` into dir:
//   GGUF input: the llmq_hf_files_from_gguf files;
//   HF input: config.json read back, and generation_config.json, tokenizer.json,
//     tokenizer_config.json, special_tokens_map.json, added_tokens.json, tokenizer.model,
//     vocab.json, merges.txt, chat_template.jinja / .json copied byte for byte when present.
// config.json gets "torch_dtype" for dtype, loses any "quantization_config" of the input, and then
// every key of config_extra (an object, or NULL) set over it.
enum llmq_status llmq_hf_side_files(const char *in, const char *dir, enum llmq_dtype dtype, const json_t *config_extra);

// The GGUF keys `llmq convert` writes for the HF directory `in` (general.*, <arch>.*, tokenizer.ggml.*,
// in its order) into w; general.file_type only when file_type >= 0.
struct llmq_gguf_writer;
enum llmq_status llmq_hf_gguf_kvs(const char *in, int64_t file_type, struct llmq_gguf_writer *w);

// ---- staging an output directory -----------------------------------------------------------------------

// Refuses out == in and an existing out unless force (then only a directory llmq wrote, or an empty one:
// common/io.h llmq_output_check), then creates "<out>.tmp.<pid>" (llmq_hf_stage_create).
// *tmp (owned: free()) names it; *replace tells llmq_hf_stage_publish to replace an existing out.
enum llmq_status llmq_hf_stage_prepare(const char *in, const char *out, bool force, char **tmp, bool *replace);
// Creates the directory "<out>.tmp.<pid>" (common/io.h llmq_outdir_create: stale ones removed, the llmq
// marker written); *tmp (owned: free()) names it; remove it with llmq_outdir_discard on failure.
enum llmq_status llmq_hf_stage_create(const char *out, char **tmp);
// Renames the finished tmp onto out (common/io.h llmq_outdir_publish: an existing out is moved aside first
// and removed after the rename succeeded; a new out is created exclusively), then fsyncs the parent
// directory. On failure tmp is left to the caller.
enum llmq_status llmq_hf_stage_publish(const char *tmp, const char *out, bool replace);
// Writes j as dir/name (2-space indent, key order kept, floats with 9 digits), atomically.
enum llmq_status llmq_hf_write_json(const char *dir, const char *name, const json_t *j);

#endif // LLMQ_FORMATS_HF_HFDIR_H
