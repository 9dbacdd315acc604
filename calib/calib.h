/*
 * calib/calib.h — the calibration runner: where the calibration tokens come from, and the per-linear
 * input statistics every quantization method needs, gathered block by block in one pass.
 *
 * What it is: (1) sources → a (n_seq, seqlen) token matrix with provenance (path, sha256, token
 * count); (2) a statistics accumulator fed by calib/forward.h's linear hook; (3) the `.lcs` stats
 * file and llama.cpp's legacy imatrix `.dat` file. What it is not: no quantization (quant/), no
 * forward pass of its own (calib/forward.h).
 *
 * Legend: N calibration tokens (n_seq * seqlen), C in-features of a linear input, L n_layer.
 *
 * ---- Sources (llmq_calib_data_load) --------------------------------------------------------------
 *   PATH.txt | PATH.raw | anything else   the whole file is one text (".gz": gunzipped on read)
 *   PATH.jsonl[.gz]                       one JSON object per line; its string "text" is one text;
 *                                         a line without one is an error naming file and line
 *   NAME (a dataset name)                 datasets/datasets.h resolves it (datasets/manifest.tsv:
 *                                         wikitext-2-valid, wikitext-2-test, its alias wikitext-2,
 *                                         ...; the repository's .gz copy, an install's, $LLMQ_DATA or
 *                                         ../shared/datasets), sha256-checked on the decompressed
 *                                         bytes. A test split (wikitext-2-test) is accepted with a
 *                                         warning: eval --ppl wikitext-2 scores that text.
 *   "self"                                sequences sampled from the model itself (no data at all):
 *                                         each starts from BOS, tokens drawn from softmax(logits) at
 *                                         temperature 1 with a seeded xorshift generator. Costs
 *                                         seqlen forward calls per sequence (no KV cache): use short
 *                                         --seqlen.
 *   Text sources: every text is tokenized WITHOUT BOS/EOS and the token streams are concatenated
 *   as they are (argument order, then file order; no separator tokens), then n_seq
 *   windows of seqlen tokens are taken at seeded uniform random offsets in [0, total - seqlen]
 *   (the GPTQ reference's get_wikitext2 / get_c4 sampling). When total < seqlen: LLMQ_ERR_ARG.
 *   Seed: splitmix64(seed) drives a xorshift64* stream; identical sources + seed -> identical tokens.
 *
 * ---- Statistics (struct llmq_calib_stats) ---------------------------------------------------------
 *   Per block, four inputs (calib/forward.h hook slots): LLMQ_LIN_Q (shared by q/k/v), LLMQ_LIN_O,
 *   LLMQ_LIN_GATE (shared by gate/up), LLMQ_LIN_DOWN. For each input x (N, C):
 *     xtx     (C, C)  Σ_tokens xᵀx, accumulated in f64: every micro-batch of <= 256 rows goes through
 *                     an f32 SYRK (kernels/gemm.h: cblas_ssyrk, or cuBLAS on s->backend) into an f32
 *                     (C, C) scratch (beta 0, upper triangle) which is added to the f64 sum; the lower
 *                     triangle is mirrored at the end (llmq_calib_stats_finish).
 *     sum_abs (C)     Σ_tokens |x| in f64        sum_sq (C)  Σ_tokens x² in f64
 *     count           tokens seen (N)            n_seq       sequences seen
 *   GPTQ's Hessian is then H = (2 / n_seq) · xtx: the reference's running update
 *   H ← H·n/(n+m) + (2/(n+m))·XᵀX with n, m counted in SEQUENCES (gptq.py add_batch, batch dim)
 *   ends at exactly that (llmq_calib_hessian). AWQ's activation scale is mean |x| = sum_abs / count.
 *   The accumulator is deterministic: the same inputs in the same micro-batches give the same bits.
 *   NaN / Inf in an input -> LLMQ_ERR_NUMERIC naming the block and input.
 *
 * ---- Stats file (.lcs), little-endian ------------------------------------------------------------
 *   offset size
 *        0    8  magic "LLMQCALS"
 *        8    4  u32 version (1)
 *       12    4  u32 flags (bit 0: xtx present)
 *       16    8  i64 n_layer (1 .. 4096)
 *       24    8  i64 n_seq   (>= 1)
 *       32    8  i64 seqlen  (>= 1)
 *       40   32  sha256 of the calibration tokens (int32 little-endian, (n_seq, seqlen))
 *       72    -  then for layer 0..n_layer-1, for slot Q, O, GATE, DOWN:
 *                  i64 n_in (1 .. 1<<20), i64 count, f64 sum_abs[n_in], f64 sum_sq[n_in],
 *                  and when flag bit 0: f64 xtx[n_in * n_in] (full symmetric matrix, row-major)
 *   The file must end exactly after the last record. Reading validates magic (LLMQ_ERR_MAGIC),
 *   version (LLMQ_ERR_VERSION), every count (LLMQ_ERR_CORRUPT / LLMQ_ERR_OVERFLOW) and the size
 *   (LLMQ_ERR_TRUNCATED) before allocating. Written atomically (common/io.h llmq_afile).
 *
 * ---- llama.cpp imatrix legacy .dat (imatrix.cpp save_imatrix_legacy / load_imatrix_legacy) ----------
 *   i32 n_entries; n_entries × { i32 len; char name[len]; i32 ncall; i32 nval; f32 values[nval] };
 *   then i32 last_call; i32 len; char dataset[len]. values[i] = Σx²[i] / count[i] · ncall, so a
 *   reader's values / ncall is the mean of x² per input channel. llmq writes one entry per weight
 *   (GGUF names, "blk.N.attn_q.weight" ... "blk.N.ffn_down.weight"; q/k/v share the same values),
 *   ncall = n_seq. Reading back folds entries into sum_sq (count = ncall, sum_sq = values) for the
 *   slot of the named weight; xtx and sum_abs are absent after an imatrix read.
 */
#ifndef LLMQ_CALIB_CALIB_H
#define LLMQ_CALIB_CALIB_H

#include "calib/forward.h"
#include "calib/model.h"
#include "common/status.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stdint.h>

// ---- Sources -----------------------------------------------------------------------------------------

#define LLMQ_CALIB_MAX_SOURCES 16

enum llmq_calib_kind { LLMQ_CALIB_FILE, LLMQ_CALIB_NAMED, LLMQ_CALIB_SELF };

struct llmq_calib_source {
    enum llmq_calib_kind kind;
    char *arg;       // owned: what the user gave
    char *path;      // owned: the file read (NULL for self)
    char sha256[65]; // file: of its bytes as stored (compressed for .gz); named: the manifest's, of the
                     // decompressed text; "" for self
    int64_t n_texts; // texts read (jsonl lines, 1 for a plain file, n_seq for self)
    int64_t n_tokens;// tokens this source contributed to the stream
};

struct llmq_calib_opts {
    const char *const *sources; // (n_sources) --calib arguments
    int n_sources;
    int64_t nsamples, seqlen;   // n_seq windows of seqlen tokens
    uint64_t seed;
    int n_threads;
    enum llmq_backend backend;  // GEMM backend of the "self" sampling forward (kernels/gemm.h); 0 = CPU
    const char *manifest;       // NULL: datasets/datasets.h's search order
};

struct llmq_calib_data {
    int64_t n_seq, seqlen;
    int32_t *tokens;                 // (n_seq, seqlen) owned
    struct llmq_calib_source *src;   // (n_src) owned
    int n_src;
    int64_t n_stream_tokens;         // tokens in the concatenated stream the windows came from
    char tokens_sha256[65];          // of tokens (int32 little-endian)
};

// Reads the texts of one file (rules above). *texts (n) and each string are malloc'd (free each + array).
enum llmq_status llmq_calib_read_texts(const char *path, char ***texts, int64_t *n, char sha256[65]);

// Builds the token matrix from opts->sources (see "Sources"). On failure *out is zeroed.
enum llmq_status llmq_calib_data_load(const struct llmq_model *m, const struct llmq_calib_opts *o,
                                      struct llmq_calib_data *out);
void llmq_calib_data_free(struct llmq_calib_data *d); // zeroed or NULL: no-op

// ---- Statistics ---------------------------------------------------------------------------------------

enum { LLMQ_CALIB_SLOT_Q, LLMQ_CALIB_SLOT_O, LLMQ_CALIB_SLOT_GATE, LLMQ_CALIB_SLOT_DOWN, LLMQ_CALIB_N_SLOTS };

// The slot whose input a linear reads (q/k/v -> Q, gate/up -> GATE).
int llmq_calib_slot_of(enum llmq_linear l);

struct llmq_calib_input {
    int64_t n_in;    // C
    int64_t count;   // tokens seen
    int64_t n_seq;   // sequences seen
    double *xtx;     // (C, C) Σ xᵀx; NULL when not gathered
    double *sum_abs; // (C) Σ |x|
    double *sum_sq;  // (C) Σ x²
};

struct llmq_calib_stats {
    int64_t n_layer;
    bool with_xtx;
    struct llmq_calib_input *in; // (n_layer, LLMQ_CALIB_N_SLOTS)
    float *scratch;              // (Cmax, Cmax) ssyrk scratch
    enum llmq_backend backend;   // of the XᵀX syrk and of llmq_calib_run's forward (kernels/gemm.h); CPU
                                 // after init / load: set it after llmq_calib_stats_init
    int64_t n_seq_hint;          // sequences per block call (for n_seq counting in the hook)
    enum llmq_status err;        // first error seen by the hook
    int64_t n_seq, seqlen;       // of the calibration data (for the file header)
    uint8_t tokens_sha256[32];
};

// Allocates statistics for every block of m (xtx only when with_xtx: (C, C) f64 per slot per layer).
// Only layers in [layer0, layer1) get buffers (others keep n_in set and NULL arrays): the pipeline
// allocates one block at a time; `llmq calib` all of them.
enum llmq_status llmq_calib_stats_init(const struct llmq_model *m, bool with_xtx, int64_t layer0, int64_t layer1,
                                       struct llmq_calib_stats *out);
void llmq_calib_stats_free(struct llmq_calib_stats *s);
// Zeroes the sums of one layer (reuse for the next block).
void llmq_calib_stats_reset(struct llmq_calib_stats *s, int64_t layer);

// Adds x (n, C) — n tokens from n_seq sequences — to the statistics of (layer, slot).
enum llmq_status llmq_calib_stats_add(struct llmq_calib_stats *s, int64_t layer, int slot, const float *x, int64_t n,
                                      int64_t n_seq);
// A calib/forward.h hook; user is a struct llmq_calib_stats * whose n_seq_hint is set. Errors are
// kept in s->err (the first one) since hooks return nothing.
void llmq_calib_stats_hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in);
// Mirrors the upper triangle of every xtx of a layer into the lower one (after the last add).
void llmq_calib_stats_finish(struct llmq_calib_stats *s, int64_t layer);

// H (C, C) f32 = (2 / n_seq) · xtx of (layer, slot), the GPTQ reference's Hessian (see above).
enum llmq_status llmq_calib_hessian(const struct llmq_calib_stats *s, int64_t layer, int slot, float *H);

// Runs the whole model over d block by block (embedding, then block 0..L-1 with the stats hook,
// the block outputs feeding the next block) gathering every layer's statistics into s (allocated
// for all layers). Memory: one (N, D) activation buffer plus the forward object's buffers.
// progress: one stderr line per block with ETA. The forward and the XᵀX products run on s->backend.
enum llmq_status llmq_calib_run(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                int64_t micro_batch, struct llmq_calib_stats *s);

// ---- Files --------------------------------------------------------------------------------------------
enum llmq_status llmq_calib_stats_save(const struct llmq_calib_stats *s, const char *path);
// Reads a stats file (validated, see the layout) into *out (all layers allocated).
enum llmq_status llmq_calib_stats_load(const char *path, struct llmq_calib_stats *out);
// llama.cpp imatrix legacy .dat: write (every layer of s needs sum_sq), read (GGUF weight names
// "blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>.weight"; others are ignored
// with a warning). dataset: the string stored at the end ("" allowed).
enum llmq_status llmq_calib_imatrix_save(const struct llmq_calib_stats *s, const char *path, const char *dataset);
enum llmq_status llmq_calib_imatrix_load(const char *path, const struct llmq_model *m, struct llmq_calib_stats *out);

#endif // LLMQ_CALIB_CALIB_H
