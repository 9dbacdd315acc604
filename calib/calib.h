/*
 * calib/calib.h — the calibration runner: where the calibration tokens come from, and the per-linear
 * input statistics every quantization method needs, gathered block by block in one pass.
 *
 * What it is: (1) sources → a (n_seq, seqlen) token matrix with provenance (path, sha256, token
 * count); (2) a statistics accumulator fed by calib/model/forward.h's linear hook, or by kernels/block.h's sums
 * (llmq_calib_run, calib/calib_run.c: "Decoder blocks" below); (3) the `.lcs` stats file and llama.cpp's imatrix
 * files (GGUF and the legacy `.dat`). What it is not: no quantization (quant/), no forward pass of its own
 * (calib/model/forward.h, kernels/block.h).
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
 *   Per block, four inputs (calib/model/forward.h hook slots): LLMQ_LIN_Q (shared by q/k/v), LLMQ_LIN_O,
 *   LLMQ_LIN_GATE (shared by gate/up), LLMQ_LIN_DOWN. For each input x (N, C):
 *     xtx     (C, C)  Σ_tokens xᵀx, accumulated in f64: every micro-batch of <= 256 rows goes through
 *                     an f32 SYRK (kernels/gemm.h llmq_gram_acc_f64: cblas_ssyrk, or cuBLAS on s->backend;
 *                     in row tiles of GEMMs for C > 4096) into an f32 scratch (beta 0, upper triangle)
 *                     which is added to the f64 sum; the lower triangle is mirrored at the end
 *                     (llmq_calib_stats_finish).
 *     sum_abs (C)     Σ_tokens |x| in f64        sum_sq (C)  Σ_tokens x² in f64
 *     count           tokens seen (N)            n_seq       sequences seen
 *   GPTQ's Hessian is then H = (2 / n_seq) · xtx: the reference's running update
 *   H ← H·n/(n+m) + (2/(n+m))·XᵀX with n, m counted in SEQUENCES (gptq.py add_batch, batch dim)
 *   ends at exactly that (llmq_calib_hessian). AWQ's activation scale is mean |x| = sum_abs / count.
 *   The accumulator is deterministic: the same inputs in the same micro-batches give the same bits.
 *   NaN / Inf in an input -> LLMQ_ERR_NUMERIC naming the block and input.
 *   Mixture of experts (mixtral, qwen3_moe): the block's MLP input slot GATE is the router's and every
 *   expert's input (no DOWN slot: the experts have one each); per expert x the same four sums over the
 *   rows that reach it, for its gate/up input (D) and its down input (Fe) (struct llmq_calib_stats exp,
 *   fed by llmq_calib_stats_expert_hook from calib/model/moe.h). Which rows reach it: the ones the router
 *   sends it (llmq_forward_set_moe_calib_all false), or every token (true, llm-compressor's
 *   calibrate_all_experts; the block output still sums the routed experts only). routed counts the
 *   routed tokens either way (the coverage report). An expert's xtx is calloc'ed (its pages are touched
 *   only once a token reaches it): E (D² + Fe²) f64 per block at most. Not kept in .lcs files; the imatrix
 *   files keep each expert's Σx² and count (below, "Mixture of experts in imatrix files").
 *   qwen2_moe: its shared expert is the block's dense MLP, so the GATE slot (every token) is also its gate/up
 *   input and the DOWN slot (Fs wide) its down input.
 *
 * ---- Decoder blocks (llmq_calib_run) -----------------------------------------------------------------
 *   The pass is layer-major either way: the embedding of every sequence, then block 0 over all of them (micro-batches
 *   of micro_batch sequences, the statistics of its four inputs complete), block 1, ... Its blocks run one of two
 *   ways (calib/calib_run.c):
 *   forward.c   calib/model/forward.h with llmq_calib_stats_hook: the (N, D) activations on the host, every input
 *               summed on the host as above (XᵀX on s->backend: kernels/gemm.h llmq_gram_acc_f64). Everything
 *               (mixtures of experts, every family) and the only path with a CPU backend.
 *   block.h     with s->backend CUDA, for what calib/model/devblock.h covers (llama, mistral, qwen2, qwen3 without
 *               sliding window, softcap, linear RoPE scaling, partial RoPE): kernels/block.h with its sums. The
 *               (N, D) activations are uploaded once after the embedding and stay on the device for every block
 *               (never downloaded: the calibration needs only the sums); each layer's weights are converted and
 *               uploaded once; the same micro-batches run through the block, which sums XᵀX (LLMQ_BLOCK_SUM_GRAM,
 *               only with xtx) and Σ|x| / Σx² per column (LLMQ_BLOCK_SUM_COLS) where it computes; per layer the
 *               host downloads 2 C doubles per input and, with xtx, its (C, C) f64 upper triangle (an 8B model's
 *               down input: 1.6 GB a layer), then mirrors it as above. Σx² is the column-sum kernel's, not the Gram
 *               diagonal (f32 products of a micro-batch rounded before the f64 sum: other bits than sum_sq's).
 *               The non-finite check is the block's (its first NaN / Inf per input, reported per layer in slot
 *               order, naming the sequence, position and channel: LLMQ_ERR_NUMERIC as above).
 *               The engine is calib/blocks.h: when the activations (N · D floats; a 128 × 2048-token calibration of
 *               an 8B model: 4 GiB) do not fit in s->max_vram (--max-vram; default half of the device's free memory)
 *               with the block's buffers, they stay in a page-locked host array and stream through the device a
 *               micro-batch at a time.
 *   Otherwise forward.c, with one info line naming why: devblock's refusal (the family or the feature, e.g. a
 *   mixture of experts), or the block's buffers alone over the budget. llmq calib has no emulation mode, so none is
 *   refused. Who takes the block path: `llmq calib
 *   --device cuda`, and quantize's importance statistics (gguf type choice, rtn with --calib) on --device cuda.
 *   Agreement: the block on the CPU backend repeats forward.c's operations (kernels/block.h), its Gram sums are
 *   llmq_gram_acc_f64's and its column sums the loop above, so with --threads 1 the statistics file is the SAME
 *   BYTES as forward.c's (tests/py/test_calib_blocks.py). On CUDA the inputs differ by float rounding and the Gram
 *   products by summation order: tests/gpu/test_calib_cuda.c bounds the difference; it has NEVER RUN ON A GPU.
 *   Test hook: LLMQ_CALIB_BLOCK=cpu runs the block path on the CPU backend whatever the device (so its wiring is
 *   tested without a GPU; no memory bound there but --max-vram, which the tests use to force streaming);
 *   LLMQ_CALIB_BLOCK=off keeps forward.c with --device cuda; any other
 *   value is LLMQ_ERR_ARG.
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
 * ---- llama.cpp imatrix files (llama.cpp tools/imatrix/imatrix.cpp, read by tools/quantize) ----------
 *   llama-imatrix writes GGUF by default (`--output-format gguf`; so does the llama.cpp vendored in
 *   llama-cpp-python 0.3.36, which bench/llama_tools.sh builds) and the legacy .dat
 *   with `--output-format dat`. llmq_calib_imatrix_load tells them apart by the first four bytes
 *   ("GGUF", else a .dat's i32 entry count), never by the file name. Entries are named by the GGUF
 *   weight ("blk.N.attn_q.weight" ... "blk.N.ffn_down.weight"); entries of other tensors (output.weight
 *   with --process-output, an MoE's experts of another model) are ignored with a warning, and a file
 *   none of whose entries is a linear of the model is refused (LLMQ_ERR_NOT_FOUND). q/k/v (gate/up)
 *   read one input, so the first of their entries in file order fills the shared slot. After a read,
 *   per slot: sum_sq[c] and count are what the file holds (below), xtx and sum_abs are zero.
 *
 *   GGUF (imatrix.cpp save_imatrix / common/imatrix-loader.cpp common_imatrix_load), formats/gguf.h:
 *     KV general.type          string     "imatrix" (when present it must be that: a model is refused)
 *     KV imatrix.datasets      [string]   the text files it was computed on      } all three required,
 *     KV imatrix.chunk_count   u32        chunks of chunk_size tokens processed  } as llama-quantize
 *     KV imatrix.chunk_size    u32        tokens per chunk (n_ctx / n_parallel)  } requires them
 *     per weight W, names sorted (std::sort of the weight names), in this order:
 *       W.in_sum2   F32, ne = [C, n_mat]   Σ over tokens of x² per input column (f32 sums), one row
 *                                          per expert matrix (n_mat 1 for a dense weight; ggml drops
 *                                          the trailing 1: stored 1-D [C])
 *       W.counts    F32, ne = [1, n_mat]   tokens seen per matrix (an integer stored as f32)
 *       W.in_sum    F32, same shape as in_sum2, optional (newer llama.cpp: Σx; checked, not used)
 *     Tensors with other suffixes are ignored (as llama.cpp does). Read: sum_sq = in_sum2, count =
 *     lround(counts), stats n_seq = chunk_count, seqlen = chunk_size. Refused, naming file and tensor:
 *     in_sum2 without counts or the reverse [CORRUPT], a type other than F32 [CORRUPT], counts not
 *     dividing in_sum2's elements or in_sum of another size [CORRUPT], n_mat > 1 on a dense linear
 *     [UNSUPPORTED], C != the model's in-features [CORRUPT], a count that is not finite or rounds to
 *     0 [NUMERIC] (llama-quantize would use importance 1 there: it means no data), a NaN / Inf /
 *     negative Σx² [NUMERIC], a missing KV [NOT_FOUND], general.type not "imatrix" [MAGIC].
 *     The importance llama-quantize derives is in_sum2 / counts in f32 (quantize.cpp load_imatrix);
 *     quant/gguf_export.h computes (float)(sum_sq / count) in f64, the same value (a quotient of two
 *     floats rounded through f64 to f32 is the correctly rounded f32 quotient).
 *   Write (llmq_calib_imatrix_save_gguf): that layout for the seven linears of every block, the
 *     names sorted as llama-imatrix sorts them, n_mat 1 (1-D tensors), in_sum2 = (float)sum_sq,
 *     counts = (float)count, chunk_count = n_seq, chunk_size = seqlen, datasets = [dataset] (or []
 *     for ""); no in_sum (llmq keeps Σ|x|, not Σx). For statistics read from a llama-imatrix GGUF
 *     file this reproduces the file byte for byte (when it has no other entries).
 *
 *   Mixture of experts in imatrix files (llama-imatrix collects MUL_MAT_ID per expert): the stacked
 *     blk.N.ffn_{gate,up,down}_exps.weight hold n_mat = E rows, row x expert x's Σx² over the tokens routed to
 *     it (GGUF in_sum2 ne [C, E], counts ne [1, E]; .dat nval = E · C, expert after expert, one ncall). Read
 *     into stats exp (gate_exps / up_exps share EXP_GATE: the first in the file fills it, down_exps EXP_DOWN);
 *     n_mat != E, or E · C values that do not match, is CORRUPT; an expert's count may be 0 (no token reached
 *     it: count 0 kept; llama-quantize then uses importance 1, quant/gguf_export.h). blk.N.ffn_gate_inp.weight
 *     (the router) and qwen2_moe's ffn_gate_inp_shexp read the ffn input, so they may fill the GATE slot like
 *     ffn_gate_shexp. Written: q, k, v, o, ffn_gate_inp, (qwen2_moe) ffn_{gate,up,down}_shexp and
 *     ffn_gate_inp_shexp, then the three stacked experts, the names llama-imatrix writes; GGUF: in_sum2 (E, C)
 *     and counts (E, 1) as they are (0 for an expert no token reached); .dat: values = Σx² / count · ncall per
 *     expert, 1 · ncall for an expert of count 0 (llama-imatrix's "partial data" rule). A llama-imatrix GGUF of
 *     a mixture read and written back (llmq calib --imatrix-in F --imatrix-out G) is byte-identical
 *     (tests/py/test_moe_imatrix.py). The statistics of llmq_calib_run are routed (every expert's rows are
 *     the tokens the router sends it), as llama-imatrix's.
 *
 *   Legacy .dat (imatrix.cpp save_imatrix_legacy / imatrix-loader.cpp common_imatrix_load_legacy):
 *     i32 n_entries; n_entries × { i32 len; char name[len]; i32 ncall; i32 nval; f32 values[nval] };
 *     then i32 last_call; i32 len; char dataset[len] (this tail is optional). llama-imatrix derives
 *     it from the GGUF form per entry as ncall = ceil(max(counts) / chunk_size) and values[i] =
 *     (in_sum2[i] / counts) · ncall in f32; llama-quantize's importance is values / ncall. Read:
 *     sum_sq = values, count = ncall (ncall 0: count 1, so the importance is the values, as
 *     llama-quantize takes them), stats n_seq = 1, seqlen = 1.
 *     Write (llmq_calib_imatrix_save): one entry per weight in block order (q, k, v, o, gate, up,
 *     down), ncall = n_seq, values = (float)(sum_sq / count · ncall) in f64, last_call = n_seq.
 *   Converting with llmq (read one form, write the other) keeps the importance up to f32 rounding but
 *   is not llama-imatrix's conversion byte for byte: a GGUF written as .dat has its entries in block
 *   order and values rounded once in f64 (llama-imatrix: sorted, rounded twice in f32, so a value may
 *   differ by one ulp); a .dat written as GGUF has counts = ncall and chunk_size 1 (a .dat does not
 *   store the chunk size; llama-imatrix assumes its own -c).
 *
 *   Each form gives the importance llama-quantize derives from it, so llmq's output equals
 *   llama-quantize's for either. The two forms of one llama-imatrix run give the same importance when
 *   fl(fl(q · ncall) / ncall) == q for every q = fl(in_sum2 / counts) (counts = ncall · chunk_size):
 *   exactly so when ncall is a power of two; measured so for every value when chunk_size is a power
 *   of two (-c 128, 512, ...: then q = fl(y / ncall) with y = in_sum2 / chunk_size a float, and in
 *   10^6 random y per ncall, ncall 2 ... 4999, the round trip never failed). With -c 500 (stories260K,
 *   3 chunks) 413 of 2780 values differ by an ulp and 5 tensors of a Q4_K_M file differ between the
 *   two forms, in llama-quantize's output exactly as in llmq's (tests/py/test_imatrix_gguf.py).
 */
#ifndef LLMQ_CALIB_CALIB_H
#define LLMQ_CALIB_CALIB_H

#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "common/status.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stdint.h>

// ---- Sources -----------------------------------------------------------------------------------------

#define LLMQ_CALIB_MAX_SOURCES 16

enum llmq_calib_kind { LLMQ_CALIB_FILE, LLMQ_CALIB_NAMED, LLMQ_CALIB_SELF };

struct llmq_calib_source {
    enum llmq_calib_kind kind;
    char *arg;        // owned: what the user gave
    char *path;       // owned: the file read (NULL for self)
    char sha256[65];  // file: of its bytes as stored (compressed for .gz); named: the manifest's, of the
                      // decompressed text; "" for self
    int64_t n_texts;  // texts read (jsonl lines, 1 for a plain file, n_seq for self)
    int64_t n_tokens; // tokens this source contributed to the stream
};

struct llmq_calib_opts {
    const char *const *sources; // (n_sources) --calib arguments
    int n_sources;
    int64_t nsamples, seqlen; // n_seq windows of seqlen tokens
    uint64_t seed;
    int n_threads;
    enum llmq_backend backend; // GEMM backend of the "self" sampling forward (kernels/gemm.h); 0 = CPU
    const char *manifest;      // NULL: datasets/datasets.h's search order
};

struct llmq_calib_data {
    int64_t n_seq, seqlen;
    int32_t *tokens;               // (n_seq, seqlen) owned
    struct llmq_calib_source *src; // (n_src) owned
    int n_src;
    int64_t n_stream_tokens; // tokens in the concatenated stream the windows came from
    char tokens_sha256[65];  // of tokens (int32 little-endian)
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
// The name of a slot's input in messages ("attn_in (q/k/v)", ...; "?" out of range): static.
const char *llmq_calib_slot_name(int slot);

struct llmq_calib_input {
    int64_t n_in;    // C
    int64_t count;   // tokens seen
    int64_t n_seq;   // sequences seen
    double *xtx;     // (C, C) Σ xᵀx; NULL when not gathered
    double *sum_abs; // (C) Σ |x|
    double *sum_sq;  // (C) Σ x²
};

// A mixture of experts' per-expert inputs (calib/model/moe.h's expert hook): expert x of block l reads
// LLMQ_CALIB_EXP_GATE (the rows of the ffn input routed to it, shared by its gate and up; C = D) and
// LLMQ_CALIB_EXP_DOWN (SiLU(gate) * up of those rows; C = Fe).
enum { LLMQ_CALIB_EXP_GATE, LLMQ_CALIB_EXP_DOWN, LLMQ_CALIB_EXP_N_SLOTS };

struct llmq_calib_stats {
    int64_t n_layer;
    bool with_xtx;
    enum llmq_arch arch;         // the family they were gathered for (llmq_calib_stats_init; LLAMA from .lcs)
    struct llmq_calib_input *in; // (n_layer, LLMQ_CALIB_N_SLOTS)
    // moe models only (0 / NULL for a dense one): see "Per-expert statistics"
    int64_t n_expert;             // E
    struct llmq_calib_input *exp; // (n_layer, E, LLMQ_CALIB_EXP_N_SLOTS), allocated for [layer0, layer1) only
    int64_t *routed;              // (n_layer, E) tokens the model's own routing sent to each expert
    float *scratch;               // f32 scratch of kernels/gemm.h llmq_gram_acc_f64 for the widest input (C x C,
                                  // or a row tile of it for C > LLMQ_GRAM_TILE_FROM); its pages are released by
                                  // llmq_calib_stats_finish
    int64_t scratch_n;            // its floats
    enum llmq_backend backend;    // of the XᵀX syrk and of llmq_calib_run's forward (kernels/gemm.h); CPU
                                  // after init / load: set it after llmq_calib_stats_init
    uint64_t max_vram;            // llmq_calib_run's block path budget (calib/blocks.h; --max-vram), 0: half of
                                  // the device's free memory; set it after llmq_calib_stats_init
    int64_t n_seq_hint;           // sequences per block call (for n_seq counting in the hook)
    enum llmq_status err;         // first error seen by the hook
    int64_t n_seq, seqlen;        // of the calibration data (for the file header)
    uint8_t tokens_sha256[32];
    char *dataset; // owned: the dataset an imatrix file names (llmq_calib_imatrix_load), else NULL
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
// A calib/model/forward.h hook; user is a struct llmq_calib_stats * whose n_seq_hint is set. Errors are
// kept in s->err (the first one) since hooks return nothing.
void llmq_calib_stats_hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in);
// Mirrors the upper triangle of every xtx of a layer into the lower one (after the last add); an xtx that has
// seen no token yet is not touched (its calloc'ed pages stay unmapped until its own pass). Releases the pages
// of the syrk scratch (common/io.h llmq_scratch_release) until the next add.
void llmq_calib_stats_finish(struct llmq_calib_stats *s, int64_t layer);
// Frees the xtx of (layer, slot) once its Hessians have been taken (llmq_calib_hessian then refuses it): the
// pipeline holds one block input's C x C f64 sums at a time, not four.
void llmq_calib_stats_drop_xtx(struct llmq_calib_stats *s, int64_t layer, int slot);

// H (C, C) f32 = (2 / n_seq) · xtx of (layer, slot), the GPTQ reference's Hessian (see above).
enum llmq_status llmq_calib_hessian(const struct llmq_calib_stats *s, int64_t layer, int slot, float *H);
// The same H, for the last linear that reads the input: the sums' pages are released as they are converted and
// then the sums are dropped (llmq_calib_stats_drop_xtx), so that the f64 sums and the f32 Hessian (1.5 times
// the sums' size) are never held whole together.
enum llmq_status llmq_calib_hessian_take(struct llmq_calib_stats *s, int64_t layer, int slot, float *H);

// ---- Per-expert statistics (moe) -----------------------------------------------------------------------
// The statistics of expert `expert`'s input `eslot` (LLMQ_CALIB_EXP_*) of block `layer`; NULL for a dense model.
struct llmq_calib_input *llmq_calib_expert_input(const struct llmq_calib_stats *s, int64_t layer, int64_t expert,
                                                 int eslot);
// A calib/model/moe.h expert hook over s (as llmq_calib_stats_hook: n_seq_hint counts the sequences of every
// expert the call reaches; errors in s->err).
void llmq_calib_stats_expert_hook(void *user, int layer, int expert, enum llmq_linear which, const float *in, int64_t n,
                                  int64_t n_in);
// Adds the model's routing of the last moe block run (llmq_forward_moe_counts: (E) tokens per expert) to
// s->routed of block `layer`; no-op for a dense model or counts NULL.
void llmq_calib_stats_add_routed(struct llmq_calib_stats *s, int64_t layer, const int64_t *counts);
// H (C, C) f32 = (2 / n_seq) · xtx of expert `expert`'s input eslot of block `layer` (LLMQ_ERR_ARG when that
// expert saw no token or its XᵀX was not gathered).
enum llmq_status llmq_calib_expert_hessian(const struct llmq_calib_stats *s, int64_t layer, int64_t expert, int eslot,
                                           float *H);
// Frees the xtx of one expert input (its Hessian has been taken).
void llmq_calib_expert_drop_xtx(struct llmq_calib_stats *s, int64_t layer, int64_t expert, int eslot);

// The coverage of block `layer`'s experts: min / median (the lower middle of the sorted counts) / max of
// s->routed, and the experts whose routed count is below floor into under[] (ascending, at most E), *n_under
// their number.
struct llmq_calib_coverage {
    int64_t min, median, max, n_under;
};
void llmq_calib_moe_coverage(const struct llmq_calib_stats *s, int64_t layer, int64_t floor,
                             struct llmq_calib_coverage *c, int64_t *under);

// The sums of block `layer`'s inputs in the mask `inputs` (kernels/block.h: bit 1u << slot, the block's inputs are the
// slots) that block b gathered over every token of d since its last llmq_block_sums_zero, into s (those slots zeroed
// by llmq_calib_stats_reset; not mirrored: llmq_calib_stats_finish does it): the column sums, the finite check in slot
// order (the first non-finite value named by sequence, position and channel: LLMQ_ERR_NUMERIC), XᵀX's upper triangle
// when s keeps it (with_xtx and a block made with LLMQ_BLOCK_SUM_GRAM), count and n_seq. The block path of
// llmq_calib_run and of quantize's passes (calib/blocks.h). LLMQ_ERR_ARG when s was not allocated for the layer.
struct llmq_block;
enum llmq_status llmq_calib_take_block_sums(struct llmq_block *b, const struct llmq_calib_data *d, int64_t layer,
                                            unsigned inputs, struct llmq_calib_stats *s);

// Runs the whole model over d block by block (embedding, then block 0..L-1, the block outputs feeding the next
// block) gathering every layer's statistics into s (allocated for all layers), micro_batch sequences per block
// call, the blocks through forward.c or kernels/block.h ("Decoder blocks"). Memory: forward.c: one (N, D)
// activation buffer on the host plus the forward object's buffers; block.h: (N, D) on the device, the block's
// buffers, one micro-batch's embedding on the host. progress: one stderr line per block with ETA. The forward and
// the XᵀX products run on s->backend. Errors: as the statistics' (LLMQ_ERR_NUMERIC naming block and input), the
// forward's or the block's, LLMQ_ERR_ARG for a bad LLMQ_CALIB_BLOCK.
enum llmq_status llmq_calib_run(const struct llmq_model *m, const struct llmq_calib_data *d, int n_threads,
                                int64_t micro_batch, struct llmq_calib_stats *s);

// ---- Files --------------------------------------------------------------------------------------------
enum llmq_status llmq_calib_stats_save(const struct llmq_calib_stats *s, const char *path);
// Reads a stats file (validated, see the layout) into *out (all layers allocated).
enum llmq_status llmq_calib_stats_load(const char *path, struct llmq_calib_stats *out);
// llama.cpp imatrix files (layouts above). Writers need sum_sq and count >= 1 in every slot of s
// (LLMQ_ERR_ARG otherwise) and write atomically; dataset: the text the statistics came from ("" allowed).
//   _save: the legacy .dat            _save_gguf: the GGUF form
// _load reads either (told apart by magic) into *out (all layers of m allocated; on failure *out is
// freed and zeroed). out->dataset (owned, NULL when the file names none) is the last dataset the file
// names, which `llmq calib --imatrix-in F --imatrix-out G` carries over.
enum llmq_status llmq_calib_imatrix_save(const struct llmq_calib_stats *s, const char *path, const char *dataset);
enum llmq_status llmq_calib_imatrix_save_gguf(const struct llmq_calib_stats *s, const char *path, const char *dataset);
enum llmq_status llmq_calib_imatrix_load(const char *path, const struct llmq_model *m, struct llmq_calib_stats *out);

#endif // LLMQ_CALIB_CALIB_H
