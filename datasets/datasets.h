/*
 * datasets/datasets.h — named datasets: the one resolver behind every dataset name a command takes
 * (`--calib NAME` of calib / quantize, `eval --ppl NAME`, the zero-shot task sets). A name is looked
 * up in datasets/manifest.tsv, its file found in the first data directory that holds it, read
 * (gunzipped) and checked against the manifest's sha256 of the decompressed bytes.
 *
 * What it is: name -> verified bytes plus where they came from. What it is not: no parsing (calib/
 * splits texts, the evaluators parse their task formats); paths are not names (callers use a path
 * that exists as a file first, then ask here).
 *
 * ---- datasets/manifest.tsv ---------------------------------------------------------------------------
 *   UTF-8, one row per line, fields separated by one TAB; the first row is the header
 *   (name file sha256 licence source data_file); lines starting with '#' are ignored.
 *     name       what users type: wikitext-2-valid, wikitext-2-test, hellaswag, arc-easy, ...
 *     file       path relative to a data directory (the repository's copies: data/NAME.EXT.gz). A file
 *                over the repository's 2 MB per-file limit is split at a record boundary into parts
 *                joined here with '+' (data/hellaswag.part1.txt.gz+data/hellaswag.part2.txt.gz): the
 *                parts are read in order and concatenated, and all must sit in the same directory.
 *     sha256     of the DECOMPRESSED bytes (all parts concatenated): the same digest whether the text is
 *                read from the repository's .gz or from an uncompressed upstream copy.
 *     licence, source   provenance; datasets/SOURCES.md has the detail (origin, commit, what it is).
 *     data_file  optional (absent or "-": none): where the same bytes sit, uncompressed, in the upstream
 *                layout of a data directory ($LLMQ_DATA), e.g. wikitext-2-raw/wiki.test.raw.
 *   Aliases (the table in datasets.c): wikitext-2 = wikitext-2-test (the split every perplexity
 *   figure of this field is measured on). They resolve the same way in every command.
 *
 * ---- Search order ------------------------------------------------------------------------------------
 *   The manifest: $LLMQ_MANIFEST; else the first that exists of <llmq's dir>/../datasets/manifest.tsv (a
 *   build directory inside the source tree), <llmq's dir>/../share/llmq/manifest.tsv (installed by
 *   `cmake --install`), the source tree's datasets/manifest.tsv this binary was built from,
 *   ./datasets/manifest.tsv.
 *   The data, in each directory `file` then `data_file`, first hit wins:
 *     1. the manifest's own directory (a source tree's datasets/, or P/share/llmq when installed)
 *     2. the datasets/ of the source tree this binary was built from
 *     3. <llmq's dir>/../share/llmq (the install prefix of the running binary)
 *     4. $LLMQ_DATA
 *     5. ./../shared/datasets (from the working directory), then ../shared/datasets next to the source
 *        tree this binary was built from
 *   The first copy found is the one used: a wrong sha256 there is LLMQ_ERR_CORRUPT (both digests and
 *   the manifest named), not a silent fall-through to another copy.
 *
 * ---- Errors ------------------------------------------------------------------------------------------
 *   LLMQ_ERR_NOT_FOUND  no manifest; the name is not in it (the message lists the names); no data
 *                       directory holds the file (the message lists where it looked)
 *   LLMQ_ERR_CORRUPT    sha256 mismatch; a bad gzip stream
 *   LLMQ_ERR_TRUNCATED  a .gz that ends inside its compressed stream (common/io.h llmq_read_file)
 *   LLMQ_ERR_OVERFLOW   more than max_bytes of decompressed text
 */
#ifndef LLMQ_DATASETS_DATASETS_H
#define LLMQ_DATASETS_DATASETS_H

#include "common/status.h"

#include <stddef.h>

struct llmq_dataset {
    char *name;     // the manifest name (an alias resolved), malloc'd
    char *path;     // the file read (the first part of a split file), canonical (realpath), malloc'd
    char *manifest; // the manifest consulted, malloc'd
    char *licence;  // the manifest's licence field, malloc'd
    int n_parts;    // files concatenated (1 unless split)
    char *data;     // (len + 1) decompressed bytes, NUL-terminated, malloc'd
    size_t len;
    char sha256[65]; // of data, lower-case hex; equal to the manifest's
};

// The manifest name an alias stands for, or name itself (never NULL for a non-NULL name).
const char *llmq_dataset_canonical(const char *name);

// Resolves name (rules above), reads it and checks its sha256. manifest: NULL for the search order
// above, else that file. max_bytes bounds the decompressed size. On failure *out is zeroed and one
// line is logged naming the dataset and the file or directories concerned.
enum llmq_status llmq_dataset_load(const char *name, const char *manifest, size_t max_bytes, struct llmq_dataset *out);
void llmq_dataset_free(struct llmq_dataset *d); // zeroed or NULL: no-op

#endif // LLMQ_DATASETS_DATASETS_H
