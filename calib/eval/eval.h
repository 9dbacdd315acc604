/*
 * calib/eval/eval.h — perplexity and KL divergence of a causal LM on a text, under two protocols
 * (llama.cpp's tools/perplexity/perplexity.cpp, and the GPTQ / AWQ papers' evaluation scripts), plus
 * the logits file behind `llmq eval --save-logits` / `--kld`.
 *
 * What it is: the chunking of a tokenized text (which tokens go into each forward pass, which
 * positions are scored), the per-position math (log-softmax, NLL, KL divergence, Δp, same top-1) in
 * double precision, the running statistics with the ± uncertainties exactly as llama.cpp's
 * llama-perplexity reports them, a checked binary logits file, and the chunk loop that drives
 * calib/model/forward.h (or, for the decoder blocks on a device, kernels/block.h: "Decoder blocks" below).
 * What it is not: no tokenizer (calib/tokenizer/tokenizer.h), no forward pass (calib/model/forward.h,
 * kernels/block.h), no printing (cli/cmd_eval.c prints; this module reports progress through a callback).
 *
 * Legend: V n_vocab, T tokens of the whole text, n n_ctx (tokens per chunk), R rows scored per
 * chunk, K chunks evaluated.
 *
 * ---- Protocols ------------------------------------------------------------------------------------
 * llamacpp (llama.cpp tools/perplexity, perplexity()): the text, read as `-f` reads it (one
 *   trailing '\n' removed: cli/cmd_eval.c does that), is tokenized once with add_special (a BOS in
 *   front when the model adds BOS) and without parsing special-token texts. K_max = T / n chunks of
 *   n consecutive tokens, no overlap, the tail dropped. When the model adds BOS, position 0 of EVERY chunk is replaced
 * by BOS (the token it replaces is lost, exactly as llama.cpp does; for chunk 0 it already is BOS). Only the second
 * half is scored: first = n/2, row r = position first + r predicts the token at first + r + 1, for r in [0, R), R = n -
 * 1 - first (255 for n = 512). llama.cpp refuses texts under 2n tokens; llmq needs one full chunk. gptq
 * (IST-DASLab/gptq datautils.get_wikitext2 + llama_eval): the dataset rows joined with "\n\n", tokenized once (HF
 * tokenizers add BOS once at the front when the model adds BOS), K_max = T / n windows of n tokens (n = 2048 by
 * default), tail dropped, no BOS per window. Every position but the last predicts the next token: first = 0, R = n - 1
 * (the reference computes the mean loss over the n - 1 shifted labels and multiplies it by n, so exp(Σ NLL / (K·n))
 * there equals exp(mean NLL over the K·(n-1) scored tokens) here). For a plain-text file the rows are its lines: see
 *   llmq_eval_join_rows.
 * Both report ppl = exp(mean NLL) and its uncertainty ppl · stderr(NLL) where
 * stderr = sqrt((mean(NLL²) − mean(NLL)²) / (count − 1)) (llama.cpp's "Final estimate: PPL = x +/- y").
 *
 * ---- KL-divergence mode (llama.cpp --kl-divergence) -----------------------------------------------
 * Per scored position: KLD = Σ_v p_base(v) (log p_base(v) − log p(v)) over the whole vocabulary;
 * Δp = p(target) − p_base(target); same top = argmax base == argmax model (first maximum on ties).
 * Reported: mean ± stderr of KLD, its max / quantiles; Δp mean ± stderr, RMS ± (0.5/RMS)·stderr(Δp²),
 * max |Δp|, quantiles; same-top-1 fraction ± sqrt(f(1−f)/(count−1)); PPL of both models, their
 * correlation, ln(PPL/PPL_base) ± its uncertainty with the covariance term, PPL ratio and difference.
 * The mean ± uncertainty in this mode use llama.cpp's mean_and_uncertainty (uncertainty 0 when
 * count <= 10). Differences from llama.cpp: the base distribution is kept exactly (f32 or f16
 * logits) where llama.cpp stores 16-bit quantized log-probabilities clipped at max − 16 and drops
 * base probabilities under e^-16 from the KLD sum; llmq sums every term.
 *
 * ---- Logits file (version 1), little-endian --------------------------------------------------------
 *   offset  size  field
 *        0     8  magic "LLMQLOGT"
 *        8     4  u32 version = 1
 *       12     4  u32 dtype of the logits: 0 = f32, 1 = f16 (IEEE half, round-to-nearest-even)
 *       16     4  u32 protocol: 0 = llamacpp, 1 = gptq
 *       20     4  u32 flags, must be 0
 *       24     8  i64 n_vocab V          1 <= V <= 2^24
 *       32     8  i64 n_ctx n            2 <= n <= 2^20
 *       40     8  i64 n_chunks K         1 <= K <= 2^24
 *       48     8  i64 first              llamacpp: n/2, gptq: 0
 *       56     8  i64 n_rows R           = n - 1 - first
 *       64     8  i64 n_text_tokens T    tokens of the whole text, >= K·n
 *       72    32  sha256 of the text bytes that were tokenized (after row joining)
 *      104    24  reserved, zero
 *      128   4Kn  i32 tokens (K, n): the input of every chunk as evaluated (BOS substituted);
 *                 every id in [0, V)
 *        D        logits start at D = round_up(128 + 4·K·n, 64)
 *                 chunk k: (R, V) values of the element type at D + k·R·V·esize; row r holds the
 *                 logits of position first + r of chunk k
 *   The file size must equal D + K·R·V·esize exactly. Every field is checked on open (magic,
 *   version, dtype, protocol vs first, ranges, the size arithmetic for overflow, token ids); a chunk
 *   read rejects NaN / Inf. The writer is atomic (common/io.h llmq_afile): a crash or an abort leaves
 *   no file behind. f16 halves the size (K·R·V·2 bytes: 14.8 GB for all of wiki.test.raw with
 *   V = 49152) at the cost of a KLD floor of ~3e-6 (SmolLM2 against its own f16 logits).
 *
 * ---- Decoder blocks ---------------------------------------------------------------------------------
 * Two ways to run a model's decoder blocks; the embedding (on the host), the output head (calib/model/forward.h
 * llmq_forward_head on opts->backend) and the statistics are the same for both.
 *   forward.c (the CPU backend, and the fallback): calib/model/forward.h's block API, one chunk at a time, on
 *     opts->n_threads threads; with LLMQ_BACKEND_CUDA only its linears' products go to the device (pageable
 *     copies per call, kernels/gemm.h).
 *   block.h (LLMQ_BACKEND_CUDA, when every model of the run is one kernels/block.h covers: calib/model/devblock.h
 *     llmq_devblock_shape, i.e. llama / mistral / qwen2 / qwen3 without sliding window, softcap, linear RoPE
 *     scaling, and no --emulate): layer-major over a batch of B chunks. The batch's hidden state (B·n, D) is
 *     embedded on the host, uploaded once into a buffer where the block computes, and stays there; for each layer
 *     the model's weights are converted to f32 and uploaded once per batch (llmq_devblock_load, on n_threads
 *     threads) and llmq_block_forward runs the B sequences; after the last layer x comes back once for the head.
 *     B = min(chunks, LLMQ_EVAL_BATCH_TOKENS / n) (at least 1), lowered until the block buffers of every model of
 *     the run (kernels/block.h llmq_block_bytes for B·n tokens plus x: about 4·(3 D + 2 Dq + 2 Dkv + 2 F) bytes a
 *     token and one layer's weights in f32) fit in opts->max_vram (--max-vram), else in half of the device's free
 *     memory at the start (the other half is left to the head's per-call device buffers, cuBLAS and other users;
 *     the CPU hook: no bound unless max_vram is given); if not even one chunk fits, the forward.c path runs. Host
 * memory grows to (B·n, D) floats of x per model. The progress callback still comes after every chunk, but B at a time
 * (the head and the scores of a batch's chunks follow its last block). Which one ran is logged once (info) whenever the
 * block path was asked for (LLMQ_BACKEND_CUDA or the hook below), with the reason when it is not the block path
 * ("--emulate ...", devblock's refusal naming the family or feature, the memory bound). The finite check: forward.c
 * checks the hidden state on the host after every block. The block path downloads only the last block's output and
 * checks that: a NaN or Inf in a row of the residual stream stays non-finite through every later block (x + NaN is NaN;
 * RMSNorm of a row holding Inf is NaN), so a finite final state means every block's output was finite; a non-finite one
 * reruns the batch with a download and check after every block, which names the first non-finite layer with the same
 * message (within the batch: the first layer at which any of its chunks breaks, where forward.c names the first
 * chunk's). Agreement (tests/py/test_eval_blocks.py, on the CPU block): with one chunk per batch and n_threads 1 the
 *   block path gives forward.c's bits (kernels/block.h: the same cblas calls and op code paths), so the logits,
 *   PPL and KLD figures are identical. A batch of B > 1 chunks runs the block's products over B·n tokens instead
 *   of n, and forward.c on n_threads > 1 splits W's rows over its threads: OpenBLAS then sums some dot products in
 *   another order, so the logits differ by float rounding (measured max |Δlogit| 1e-6 to 3e-6 of max |logit| on
 *   stories260K and SmolLM2, the same size as forward.c's own --threads 1 vs 2 difference; PPL within 1.1e-7
 *   relative). The CUDA block differs from the CPU by float rounding (tests/gpu/test_block_cuda.c's bound).
 *   NOTHING OF THE CUDA BLOCK PATH HAS RUN ON A GPU YET: it compiles and links; tests/gpu/test_eval_cuda.c
 *   compares `--device cuda` with `--device cpu` on SmolLM2 (PPL within 0.5%, KLD) when a device is there.
 *   Test hook: the environment variable LLMQ_EVAL_BLOCK=cpu runs the block path on the CPU backend whatever
 *   opts->backend (the head still runs there), so that its wiring (batches, upload / download, the finite check,
 *   the fallbacks) is tested without a GPU; LLMQ_EVAL_BLOCK=off keeps forward.c's blocks with --device cuda (the
 *   GEMM-only device path); any other non-empty value is LLMQ_ERR_ARG. Not a user option: the CPU block runs on
 *   one thread.
 *
 * ---- Memory of the chunk loop ---------------------------------------------------------------------
 * Per model: calib/model/forward.h's buffers for n tokens, the activations (B·n, D) (B = 1 on the forward.c
 * path), and at most (512, V) logits (the head runs on the scored positions in slices of 512 rows); the KLD
 * modes add the same for the base; KLD mode keeps 8 bytes per scored position for the quantiles. Never all
 * logits. The block path adds its block buffers ("Decoder blocks").
 *
 * ---- Errors ----------------------------------------------------------------------------------------
 * Every failure logs one line naming the file (or the chunk / row) and returns a status:
 * LLMQ_ERR_ARG bad options, too few tokens for one chunk, or a bad LLMQ_EVAL_BLOCK; LLMQ_ERR_MAGIC / _VERSION /
 * _TRUNCATED / _CORRUPT / _OVERFLOW a bad logits file; LLMQ_ERR_NUMERIC NaN / Inf logits or hidden states (naming
 * the layer, position, component and chunk); LLMQ_ERR_DEVICE a failed device call of the block path (the CUDA
 * message names the call); LLMQ_ERR_IO, _NOMEM.
 */
#ifndef LLMQ_CALIB_EVAL_H
#define LLMQ_CALIB_EVAL_H

#include "calib/model/actq.h"
#include "common/dtype.h"
#include "common/status.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct llmq_model;

enum llmq_eval_protocol { LLMQ_EVAL_PROTOCOL_LLAMACPP = 0, LLMQ_EVAL_PROTOCOL_GPTQ = 1, LLMQ_EVAL_PROTOCOL_COUNT };

const char *llmq_eval_protocol_name(enum llmq_eval_protocol p);                    // "llamacpp", "gptq", "?"
bool llmq_eval_protocol_from_name(const char *name, enum llmq_eval_protocol *out); // false if unknown
int64_t llmq_eval_protocol_default_ctx(enum llmq_eval_protocol p);                 // 512, 2048

// ---- text ------------------------------------------------------------------------------------------

// Reads a whole text file (".gz" transparently) of at most 1 GiB into a malloc'd, NUL-terminated
// buffer (*text, caller frees; *len excludes the NUL). LLMQ_ERR_IO / _OVERFLOW / _NOMEM on failure.
enum llmq_status llmq_eval_read_text(const char *path, char **text, size_t *len);

// The gptq protocol's text from a plain file: every line (split after '\n'; a last line without '\n'
// counts too) is one dataset row, kept with its '\n'; a row of only spaces / tabs / '\r' / '\n'
// becomes "" (the HF `wikitext` loader does exactly this to wiki.*.raw); rows are joined with "\n\n".
// Applied to wiki.test.raw this reproduces "\n\n".join(load_dataset("wikitext",
// "wikitext-2-raw-v1", split="test")["text"]) byte for byte. *out is malloc'd (caller frees).
enum llmq_status llmq_eval_join_rows(const char *text, size_t len, char **out, size_t *out_len);

// The text of an evaluation, as the protocol tokenizes it (llmq_eval_text_load). Free with
// llmq_eval_text_free (a zeroed struct is safe).
struct llmq_eval_text {
    char *path;    // resolved path (owned)
    char *dataset; // the dataset name when arg named one (owned), else NULL
    char *data;    // (len) the bytes tokenized, NUL-terminated (rows joined when asked)
    size_t len;
    uint8_t sha[32]; // sha256 of data
    bool rows_joined;
};

// arg: a file (".gz" transparently), else a dataset name (datasets/datasets.h: read and sha256-checked
// there; an unknown name lists the known ones). join: llmq_eval_join_rows first. The llamacpp protocol
// reads the text as llama-perplexity's -f does (one trailing '\n' removed); gptq keeps every byte.
// On failure t holds nothing to free beyond what llmq_eval_text_free releases.
enum llmq_status llmq_eval_text_load(const char *arg, enum llmq_eval_protocol protocol, bool join,
                                     struct llmq_eval_text *t);
void llmq_eval_text_free(struct llmq_eval_text *t);

// Tokenizes t with m's tokenizer (add_special, no special-token parsing) into *ids (malloc'd, caller
// frees; *n tokens). An EOS the tokenizer appends is dropped with a warning (llama.cpp refuses such
// models). LLMQ_ERR_NOT_FOUND when m has no tokenizer. Logs one info line (bytes, tokens, seconds).
enum llmq_status llmq_eval_text_tokenize(const struct llmq_model *m, const struct llmq_eval_text *t, int32_t **ids,
                                         int64_t *n);

// ---- chunking ----------------------------------------------------------------------------------------

struct llmq_eval_plan {
    enum llmq_eval_protocol protocol;
    int64_t n_tokens;     // T: tokens of the whole text
    int64_t n_ctx;        // n: tokens fed per chunk
    int64_t n_chunks_max; // T / n
    int64_t n_chunks;     // K: chunks evaluated (min(max_chunks, n_chunks_max), all if max_chunks < 0)
    int64_t first;        // first position whose logits are used: llamacpp n/2, gptq 0
    int64_t n_rows;       // R = n - 1 - first: row r (position first + r) predicts token first + r + 1
    int32_t bos;          // written at position 0 of every chunk; -1: none (gptq, or no BOS)
};

// Plans the chunks. bos: the BOS id when the model adds BOS (llmq_tokenizer_add_bos), else -1;
// ignored for gptq. n_ctx <= 0 takes the protocol default. LLMQ_ERR_ARG (naming the counts) when
// n_ctx < 2 or > 2^20, max_chunks == 0, or the text has fewer than n_ctx tokens.
enum llmq_status llmq_eval_plan_init(enum llmq_eval_protocol protocol, int64_t n_tokens, int64_t n_ctx,
                                     int64_t max_chunks, int32_t bos, struct llmq_eval_plan *out);

// The n_ctx input tokens of chunk k (0 <= k < n_chunks_max) into dst (n_ctx): tokens[k·n, (k+1)·n)
// with position 0 replaced by plan->bos when plan->bos >= 0. tokens: (T) ids.
void llmq_eval_chunk_tokens(const struct llmq_eval_plan *plan, const int32_t *tokens, int64_t k, int32_t *dst);

// ---- per-position math -------------------------------------------------------------------------------

struct llmq_eval_row {
    double nll;       // −log p(target) under the model
    double nll_base;  // −log p_base(target) (KLD mode; else 0)
    double kld;       // KL(base ‖ model) over the vocabulary (KLD mode; else 0)
    int32_t top;      // argmax of the model's logits (first maximum)
    int32_t top_base; // argmax of the base logits (KLD mode; else -1)
};

// −log softmax(logits)[target] with the max subtracted and Σexp accumulated in double (the
// arithmetic of llama.cpp's log_softmax). logits: (V) finite floats; 0 <= target < V. *top (may be
// NULL) gets the argmax.
double llmq_eval_nll(const float *logits, int64_t n_vocab, int32_t target, int32_t *top);

// Fills one KLD-mode row from the base logits (V) and the model logits (V): both NLLs, the KL
// divergence Σ p_base (log p_base − log p) with every log-probability difference formed in double
// before it is weighted (KLD(x, x) == 0 exactly), and both argmaxes.
void llmq_eval_kld_row(const float *base, const float *logits, int64_t n_vocab, int32_t target,
                       struct llmq_eval_row *out);

// Scores n_rows positions over n_threads pthreads (<= 1: the calling thread): logits (n_rows, V),
// base (n_rows, V) or NULL (then only nll / top are set), targets (n_rows) in [0, V), rows (n_rows)
// out. The result does not depend on n_threads. LLMQ_ERR_NUMERIC (naming the row) for a NaN/Inf
// logit, LLMQ_ERR_ARG for a target out of range.
enum llmq_status llmq_eval_score(const float *logits, const float *base, const int32_t *targets, int64_t n_rows,
                                 int64_t n_vocab, int n_threads, struct llmq_eval_row *rows);

// ---- statistics --------------------------------------------------------------------------------------

// Running sums over scored positions, in double, added in position order (deterministic). Zero-
// initialise (struct llmq_eval_stats s = {0}); set .kld = true before the first add for KLD mode
// (then the per-position KLD and Δp values are also kept for quantiles: 8 bytes per position).
struct llmq_eval_stats {
    bool kld;
    int64_t count;
    double sum_nll, sum_nll2;
    double sum_nll_base, sum_nll_base2, sum_nll_nll_base;
    double sum_kld, sum_kld2;
    double sum_p_diff, sum_p_diff2, sum_p_diff4, max_abs_p_diff;
    int64_t n_same_top;
    float *kld_values;    // (count) KLD of every position, KLD mode only
    float *p_diff_values; // (count) Δp of every position, KLD mode only
    int64_t cap;
};

enum llmq_status llmq_eval_stats_add(struct llmq_eval_stats *s, const struct llmq_eval_row *rows, int64_t n);
void llmq_eval_stats_free(struct llmq_eval_stats *s); // frees the value arrays; the struct may be reused

// Quantiles reported for KLD and Δp, as fractions (llama.cpp's list plus 0.25 / 0.75 for KLD too):
// min, 0.1%, 1%, 5%, 10%, 25%, median, 75%, 90%, 95%, 99%, 99.9%, max. Linear interpolation between
// order statistics (llama.cpp's percentile(); its median is the same value).
#define LLMQ_EVAL_N_QUANTILES 13
extern const double llmq_eval_quantiles[LLMQ_EVAL_N_QUANTILES];

struct llmq_eval_result {
    int64_t count;               // scored positions
    double nll_mean, nll_stderr; // mean NLL and its standard error
    double ppl, ppl_unc;         // exp(nll_mean), ppl · nll_stderr
    // KLD mode only (zero otherwise):
    bool kld;
    double ppl_base, ppl_base_unc;
    double log_ppl_cor;                      // correlation of NLL and NLL_base
    double log_ppl_ratio, log_ppl_ratio_unc; // mean ln(PPL/PPL_base)
    double ppl_ratio, ppl_ratio_unc, ppl_diff, ppl_diff_unc;
    double kld_mean, kld_unc;
    double kld_q[LLMQ_EVAL_N_QUANTILES];
    double p_diff_mean, p_diff_unc; // Δp as a fraction (print ×100 for %)
    double p_diff_rms, p_diff_rms_unc, p_diff_max_abs;
    double p_diff_q[LLMQ_EVAL_N_QUANTILES];
    double same_top, same_top_unc; // fraction of positions with the same top-1 token
};

// Computes the figures (sorts the value arrays in place). count == 0 gives all zeros.
void llmq_eval_stats_result(struct llmq_eval_stats *s, struct llmq_eval_result *r);

// ---- logits file (layout above) ---------------------------------------------------------------------

#define LLMQ_LOGITS_MAGIC "LLMQLOGT"
#define LLMQ_LOGITS_VERSION 1
#define LLMQ_LOGITS_HEADER_SIZE 128

struct llmq_logits_header {
    enum llmq_dtype dtype; // LLMQ_DTYPE_F32 or LLMQ_DTYPE_F16
    enum llmq_eval_protocol protocol;
    int64_t n_vocab, n_ctx, n_chunks, first, n_rows, n_text_tokens;
    uint8_t text_sha256[32];
};

struct llmq_logits_writer;

// Starts an atomic logits file at path: the header and the chunk tokens (n_chunks, n_ctx) are
// written now; then llmq_logits_append calls for n_chunks · n_rows rows in all, then
// llmq_logits_commit. The header is validated like a read one (LLMQ_ERR_ARG when it is not; token
// ids too). On failure *out is NULL.
enum llmq_status llmq_logits_create(const char *path, const struct llmq_logits_header *h, const int32_t *tokens,
                                    struct llmq_logits_writer **out);
// Appends the next n rows (any n: a chunk may come in slices): logits (n, n_vocab) f32, converted to
// the file's dtype. LLMQ_ERR_NUMERIC (naming chunk and row) for NaN/Inf or a value beyond the f16
// range, LLMQ_ERR_ARG past the last row.
enum llmq_status llmq_logits_append(struct llmq_logits_writer *w, const float *logits, int64_t n);
// Commits (flush, fsync, rename) after all rows; LLMQ_ERR_ARG (and no file) if some are missing.
// Frees w in every case.
enum llmq_status llmq_logits_commit(struct llmq_logits_writer *w);
void llmq_logits_abort(struct llmq_logits_writer *w); // removes the temporary file; NULL is a no-op

struct llmq_logits_file;

// Opens and validates a logits file (everything but the logit values, which are checked per chunk).
enum llmq_status llmq_logits_open(const char *path, struct llmq_logits_file **out);
const struct llmq_logits_header *llmq_logits_header(const struct llmq_logits_file *f);
const int32_t *llmq_logits_tokens(const struct llmq_logits_file *f); // (n_chunks, n_ctx), owned by f
// Reads rows [r0, r0 + n) of chunk k (0 <= k < n_chunks, 0 <= r0 <= r0 + n <= n_rows) as f32 into
// dst (n, n_vocab) with pread (no mapping: memory stays at what the caller asks for).
// LLMQ_ERR_ARG out of range; LLMQ_ERR_IO / _TRUNCATED (the file shrank) / _NUMERIC (NaN/Inf, naming
// chunk, row and column).
enum llmq_status llmq_logits_read(struct llmq_logits_file *f, int64_t k, int64_t r0, int64_t n, float *dst);
void llmq_logits_close(struct llmq_logits_file *f); // NULL is a no-op

// ---- the evaluation loop (drives calib/model/forward.h, or kernels/block.h: "Decoder blocks") ---------------

// The block path's batch: at most this many tokens (B·n) per batch of chunks (before the memory bound).
#define LLMQ_EVAL_BATCH_TOKENS 16384

struct llmq_eval_progress {
    int64_t chunk;    // chunks done
    int64_t n_chunks; // K
    double elapsed_s; // wall time of the loop so far
    double ppl;       // running exp(mean NLL)
    double kld_mean;  // running mean KLD (KLD modes), else 0
};

struct llmq_eval_opts {
    enum llmq_eval_protocol protocol;
    int64_t n_ctx;                // <= 0: protocol default
    int64_t max_chunks;           // < 0: all
    int n_threads;                // forward pass and scoring threads (>= 1)
    enum llmq_backend backend;    // of the forward passes: CUDA takes the block path ("Decoder blocks"); 0 = CPU
    uint64_t max_vram;            // the block path's budget in bytes (--max-vram), 0: half of the device's free
                                  // memory (the CPU test hook: no bound unless given)
    enum llmq_emulate emulate;    // arithmetic of the forward passes (calib/model/actq.h); 0: llmq's f32
    const char *save_logits;      // llmq_eval_ppl only: write the logits file here (NULL: no)
    enum llmq_dtype logits_dtype; // F32 or F16 for save_logits
    const uint8_t *text_sha256;   // (32) recorded in the logits file; may be NULL (zeros)
    void (*progress)(void *user, const struct llmq_eval_progress *p); // after every chunk; may be NULL
    void *progress_user;
};

struct llmq_eval_report {
    struct llmq_eval_plan plan;
    struct llmq_eval_result res;
    int64_t tokens_evaluated; // K·n tokens through each model's forward pass
    double seconds;           // wall time of the chunk loop (forward + scoring + file I/O)
    double tokens_per_s;      // tokens_evaluated / seconds (in KLD-base mode both models' passes)
};

// Perplexity of m on tokens (T) under opts (optionally saving the logits file).
enum llmq_status llmq_eval_ppl(const struct llmq_model *m, const int32_t *tokens, int64_t n_tokens,
                               const struct llmq_eval_opts *opts, struct llmq_eval_report *out);
// KLD of m against base, both run in this process chunk by chunk (one chunk of logits of each in
// memory). The tokens come from base's tokenizer; m must have the same vocabulary (checked:
// LLMQ_ERR_ARG naming both paths otherwise). The plan's BOS comes from base.
enum llmq_status llmq_eval_kld_models(const struct llmq_model *base, const struct llmq_model *m, const int32_t *tokens,
                                      int64_t n_tokens, const struct llmq_eval_opts *opts,
                                      struct llmq_eval_report *out);
// KLD of m against a logits file: the chunks, protocol and context come from the file (opts->protocol,
// n_ctx are ignored; max_chunks may cut the chunk count). n_vocab must match (LLMQ_ERR_ARG).
enum llmq_status llmq_eval_kld_file(struct llmq_logits_file *f, const struct llmq_model *m,
                                    const struct llmq_eval_opts *opts, struct llmq_eval_report *out);

// True when the two tokenizers have the same vocabulary (n_vocab, every token text and type, BOS,
// add_bos): the condition for comparing logits position by position.
bool llmq_eval_same_vocab(const struct llmq_model *a, const struct llmq_model *b);

#endif // LLMQ_CALIB_EVAL_H
