/*
 * calib/eval/compare.h — `llmq compare`: several artifacts of one model measured on the same text against
 * one base, the base's cached figures and logits, and the table as CSV and as a self-contained HTML page.
 *
 * What it is: an artifact's size and bits per weight, the model sha256 that keys the cache, the cached
 * base evaluation (calib/eval/eval.h's chunk loop and logits file), the Pareto front of size against a
 * loss figure, and the CSV / HTML writers of the table. What it is not: no flag parsing, no terminal
 * table, no JSON (cli/cmd_compare.c), no gate logic (calib/eval/gate.h).
 *
 * ---- Sizes ----------------------------------------------------------------------------------------------
 *   file_bytes:   bytes on disk of the weight files: the GGUF file, or an HF directory's safetensors shards.
 *   tensor_bytes: bytes of the tensors' data as stored (GGUF: every tensor's nbytes; HF: every safetensors
 *                 tensor, qweight / qzeros / scales / g_idx included) — what `llmq inspect` counts.
 *   n_params:     logical weights the model computes with: the elements of every tensor view of struct
 *                 llmq_model (an AWQ / GPTQ linear counts R·C, its dequantized shape).
 *   bpw = 8 · tensor_bytes / n_params (llama.cpp's "BPW" in llama_model_loader's print_info divides the
 *   tensors' bytes by their elements in the same way).
 *
 * ---- The cache of the base's evaluation -----------------------------------------------------------------
 *   Key: the text "llmq-compare-cache 1" followed by one "name=value" line per field of struct
 *   llmq_compare_key (model sha256, text sha256, protocol, ctx, chunks asked, the logits dtype, backend,
 *   emulation, llmq version). The entry is named by the sha256 hex of that text, in the cache directory:
 *     <hex>.json    the base's report: {"key": text, "ppl", "ppl_uncertainty", "nll_mean", "nll_stderr",
 *                   "tokens_scored", "chunks", "ctx", "n_vocab", "model", "seconds"}
 *     <hex>.logits  the base's logits (calib/eval/eval.h, version 1), written when KLD is asked
 *   Both are written atomically. An entry is used only when its "key" text equals the expected one and, for
 *   the logits, when the header agrees with the plan (protocol, ctx, chunks, text sha256, n_vocab); anything
 *   else (unreadable, corrupt, another key) is logged as a warning and recomputed over it.
 *   The directory: --cache-dir, else $LLMQ_CACHE/compare, else $HOME/.cache/llmq/compare (created).
 *
 * ---- HTML ------------------------------------------------------------------------------------------------
 *   One file, no external resource of any kind (no script, stylesheet, font or image reference, no URL):
 *   an inline <style>, the table, and two inline <svg> plots — size (MiB, x) against PPL and against mean
 *   KLD (y) — each artifact one <circle class="pt"> with a <text> label (the base drawn as a square
 *   <rect class="pt base">), and the Pareto front (smaller size and smaller y both better) as a
 *   <polyline class="front">. Without KLD figures the second plot says so instead of drawing points.
 *
 * ---- Errors ----------------------------------------------------------------------------------------------
 *   LLMQ_ERR_IO naming the file (cache directory, outputs), LLMQ_ERR_NOMEM; the writers are atomic.
 */
#ifndef LLMQ_CALIB_EVAL_COMPARE_H
#define LLMQ_CALIB_EVAL_COMPARE_H

#include "calib/eval/eval.h"

#include <stdbool.h>
#include <stdint.h>

struct llmq_model;

// ---- sizes ------------------------------------------------------------------------------------------------

struct llmq_compare_size {
    uint64_t file_bytes, tensor_bytes;
    int64_t n_params;
    double bpw;
};

void llmq_compare_model_size(const struct llmq_model *m, struct llmq_compare_size *out);

// SHA-256 (lower-case hex, 65 bytes) of a model: a file's bytes, or for a directory the sha256 of the text
// "NAME\0HEX\n" for every regular file in it, sorted by name (HEX the file's sha256). LLMQ_ERR_IO naming the
// unreadable file.
enum llmq_status llmq_compare_model_sha256(const char *path, char hex[65]);

// ---- the cached base --------------------------------------------------------------------------------------

struct llmq_compare_key {
    char model_sha256[65];
    uint8_t text_sha256[32];
    enum llmq_eval_protocol protocol;
    int64_t n_ctx;      // as planned (the protocol default resolved)
    int64_t max_chunks; // as asked (-1: all)
    enum llmq_dtype logits_dtype;
    enum llmq_backend backend;
    enum llmq_emulate emulate;
};

// The cache directory (see above) into buf (n bytes), created with its parents. LLMQ_ERR_IO naming it.
enum llmq_status llmq_compare_cache_dir(const char *given, char *buf, size_t n);

struct llmq_compare_base {
    struct llmq_eval_report rep;   // the base's plain-perplexity report (from the cache: ppl, count, plan)
    struct llmq_logits_file *lf;   // its logits when asked (owned; llmq_logits_close), else NULL
    bool cached_report, cached_lf; // whether each came from the cache
    char entry[65];                // the cache entry's name (sha256 hex of the key text)
};

// The base's report, and with want_logits its logits file, from the cache directory dir, evaluating
// the base (one llmq_eval_ppl, saving the logits when asked) only for what is missing or unusable.
// tokens (n_tokens): the text's tokens under the base's tokenizer; opts: the chunk loop's options
// (save_logits is set here). On failure nothing is left half-written in dir.
enum llmq_status llmq_compare_base_get(const struct llmq_model *base, const int32_t *tokens, int64_t n_tokens,
                                       const struct llmq_eval_opts *opts, const struct llmq_compare_key *key,
                                       const char *dir, bool want_logits, struct llmq_compare_base *out);

// ---- the table --------------------------------------------------------------------------------------------

// One zero-shot task's figures on an artifact (cli/cmd_compare.c fills it from calib/eval/tasks.h's
// llmq_tasks_run): accuracies as fractions with their standard errors, and the change against the base in points.
struct llmq_compare_task {
    const char *name;
    int64_t items;
    double acc, acc_stderr, acc_norm, acc_norm_stderr; // NaN where the task has no acc_norm
    double acc_delta_pts, acc_norm_delta_pts;          // 100 · (acc − acc_base); 0 for the base
};

// One row: an artifact (or the base) and what was measured on it. NaN = not measured.
struct llmq_compare_row {
    const char *label; // shown in the table and the plots (the file's last path component)
    const char *path;
    bool is_base;
    struct llmq_compare_size size;
    double ppl, ppl_unc;
    double ppl_delta_pct; // 100 · (PPL / PPL_base − 1); 0 for the base
    double kld_mean, kld_unc, kld_p99, kld_max;
    double top1_pct, top1_unc_pct; // same top-1 token as the base, in %
    double seconds;                // the evaluation's wall time (0 when cached)
    const struct llmq_compare_task *tasks;
    int n_tasks;
};

// Marks on_front[i] (n) for the points not dominated by another: j dominates i when x[j] <= x[i] and
// y[j] <= y[i] with one of them strictly smaller. A point with a NaN coordinate is never on the front.
void llmq_compare_pareto(const double *x, const double *y, int n, bool *on_front);

// The table as CSV (RFC 4180 quoting; a header line, then one line per row; numbers with 17 significant
// digits, NaN as an empty field; task columns TASK_acc, TASK_acc_stderr, ... for the tasks of row 0).
enum llmq_status llmq_compare_write_csv(const char *path, const struct llmq_compare_row *rows, int n);

// The page described above, atomically at path. title: a line of plain text (escaped here), e.g. the
// text and protocol compared on.
enum llmq_status llmq_compare_write_html(const char *path, const struct llmq_compare_row *rows, int n,
                                         const char *title);

#endif // LLMQ_CALIB_EVAL_COMPARE_H
