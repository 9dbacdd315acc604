/*
 * quant/gguf_export.h — write a model as a quantized GGUF file: the types of quant/gguf_mix.h, the
 * bytes of formats/ggml/encode.h, streamed through formats/gguf.h's atomic writer.
 *
 * What it is: the writer behind `llmq quantize --format gguf`. `--method rtn` is begin + finish
 * (every tensor encoded from the model's views, with the importance of its input when given);
 * GPTQ / AWQ drivers (quant/quantize.c) hand over their linears as encoded blocks or as f32 weights
 * between begin and finish. What it is not: no type choice (gguf_mix.h), no block encoding
 * (formats/ggml/encode.h), no calibration (calib/calib.h), no solver.
 *
 * Legend: R rows = out_features, C cols = in_features (the GGUF row length, ne[0]).
 *
 * ---- The file (for a GGUF input: byte-identical to llama_model_quantize of llama.cpp as shipped in
 *      llama-cpp-python 0.3.36, given the same types and importance, when no_provenance) ----------
 *   KVs: every KV of the input in order except general.quantization_version, general.file_type and
 *     split.{no,count,tensors.count}; then general.quantization_version = u32 2 and
 *     general.file_type = u32 ftype (gguf_set_val_u32 removes a key and appends it: both move to the
 *     end, as in llama.cpp's output); then, unless no_provenance, the llmq.* keys below.
 *     An HF input gets the KVs `llmq convert` writes for it (formats/hf/hfdir.h
 *     llmq_hf_gguf_kvs: general.*, <arch>.*, tokenizer.ggml.*) the same way.
 *   Tensors: every tensor of the input (GGUF: every tensor in the file, also ones llmq's model does
 *     not use; HF: the model's tensors under their GGUF names, rope_freqs.weight generated for
 *     llama3 rope scaling, no output.weight when tied), in llama.cpp's order (llmq_gguf_mix_name_cmp:
 *     globals by name, then block by block, names sorted), with the types of llmq_gguf_mix_plan.
 *     A tensor whose input type equals its output type is copied byte for byte; otherwise its rows
 *     are decoded to f32 (formats/ggml/quants.h, exact) and encoded (llmq_gguf_encode_rows,
 *     n_threads). An HF llama / mistral model's q and k rows are permuted as llmq convert does
 *     (formats/llama/arch.h llmq_arch_qk_src_row): whole encoded rows move.
 *   Alignment 32 (or the input's general.alignment), version 3.
 *   qwen2_moe: its shared expert's ffn_{gate,up,down}_shexp are the block's gate / up / down linears (all seven
 *     handed over one by one), its gate ffn_gate_inp_shexp keeps its type like the router and is written 1-D (D):
 *     every tensor's outer dims of 1 are dropped, as llama.cpp's gguf writer (ggml_n_dims) does.
 *   Mixtures of experts (mixtral, qwen3_moe, qwen2_moe): blk.N.ffn_{gate,up,down}_exps (E, R, C) are written expert by
 * expert from the model's per-expert views (m->layers[l].exps: slices of the stacked tensor for a GGUF input, the
 *     per-expert HF tensors stacked in index order for an HF input, as llmq convert stacks them), one type for the
 *     whole stacked tensor as llama-quantize chooses it (quant/gguf_mix.h: n_expert, the block of ffn_down_exps from
 *     its name); every encoder works row by row, so this is llama_model_quantize's output when no importance is
 *     given. The router ffn_gate_inp keeps its type (llama-quantize never quantizes it; AWQ hands over a copy with its
 *     columns scaled, llmq_gguf_export_block). Importance: statistics with per-expert rows (llmq_calib_stats exp, as
 *     llmq_calib_run gathers them) give each expert its own Σx² / count; the solvers hand the experts over encoded
 *     (llmq_gguf_export_expert_bytes) and the stacked tensor is written once all E are in. An expert of count 0 gets
 *     importance 1 in every column when another expert of its tensor has data, none when no expert has
 *     (llama-quantize's load_imatrix / "did not find weights"). choose.mode QUALITY / TARGET: each stacked tensor is
 *     one tensor of the choice, its rows weighted per expert (quant/gguf_choose.h "Experts"). Refused
 *     (LLMQ_ERR_UNSUPPORTED): statistics without per-expert rows (a .lcs file), choose.sensitivity MEASURED, and the
 *     hand-overs of the dense gate / up / down (a moe block has none).
 *
 * ---- Provenance keys (absent with no_provenance) ------------------------------------------------
 *   llmq.version                string  LLMQ_VERSION
 *   llmq.method                 string  provenance["method"] (e.g. "rtn", "gptq"), when present
 *   llmq.gguf_type              string  the ftype name ("Q4_K_M")
 *   llmq.params                 string  the provenance object as compact JSON text (every setting)
 *   llmq.calibration.sha256     string  provenance["calibration"]["tokens_sha256"], when present
 *   llmq.imatrix.sha256         string  provenance["imatrix"]["sha256"], when present
 *
 * ---- Importance (llama.cpp's quant_weights) -------------------------------------------------------
 *   opts->imatrix: statistics with sum_sq and count per block input (calib/calib.h: a .lcs file, a
 *   llama.cpp imatrix (GGUF or .dat) read by llmq_calib_imatrix_load, or llmq_calib_run; a mixture of experts' per
 *   expert rows: "Mixtures of experts" above). The importance of
 *   column c of a block linear is (float)(sum_sq[c] / count) of its input slot (q/k/v share the
 *   attention input, gate/up the ffn input): the mean of x² that llama.cpp's imatrix stores, and
 *   for a .dat input exactly llama-quantize's values / ncall (f64 division then rounding equals the
 *   f32 division). Slots without data (count 0) and tensors outside the blocks (token_embd, output)
 *   get none. With an imatrix, mix.have_imatrix is set (it changes some Q4_0 / Q5_0 / IQ4 choices).
 *
 * ---- Requantization (llama-quantize's --allow-requantize, llama-quant.cpp) ----------------------------
 *   A tensor whose input type is a block type (Q4_0 ... IQ4_XS; not F32 / F16 / BF16) and whose
 *   planned type differs from it would be decoded and encoded again, which loses more than encoding
 *   the original. Unless allow_requantize, begin refuses the first such tensor in file order
 *   (LLMQ_ERR_ARG naming the input, the tensor and both types), also with dry_run. Tensors whose type
 *   stays are copied byte for byte and never refused (but a GPTQ / AWQ driver re-encodes every linear,
 *   and quant/quantize.h refuses a block-type linear for them before begin). With allow_requantize the
 *   output is unchanged.
 *
 * ---- Streaming and holding ------------------------------------------------------------------------
 *   The output is written in file order. A tensor is written as soon as every tensor before it is:
 *     - a linear when it was handed over (llmq_gguf_export_linear_bytes / _f32);
 *     - a norm / bias of block l once all seven linears of block l were handed over, from the copy
 *       llmq_gguf_export_block took of the driver's block (else from the model's view);
 *     - a global tensor (token_embd, output_norm, output, rope_freqs) at once.
 *   llmq_gguf_export_finish writes whatever is left (those copies, the model's views). Linears handed over
 *   ahead of their turn are held, encoded (at most about one block's linears for a driver going
 *   block by block). Memory otherwise: one chunk of rows in f32 (~16 MiB) plus its encoding.
 *   Atomic: "<out>.tmp.<pid>" renamed onto out by finish; abort / failure / crash leave out as it was.
 *   The output path follows common/io.h's guard (llmq_output_check): an existing out is refused unless
 *   force (and then only a regular file is replaced); out may not be an input of the run.
 *
 * ---- phi3's fused linears ---------------------------------------------------------------------------
 *   attn_qkv and ffn_up (2 n_ff rows, gate then up) are one tensor each, as llama.cpp's phi3 graph reads them: one
 *   type for the tensor (the mix's rule for attn_qkv / ffn_up), the linears' importance (one input). A driver hands
 *   q, k, v (gate, up) over as their own rows (llmq_gguf_export_linear_bytes / _f32 with their `which`); they land
 *   at their row offsets (formats/llama/arch.h llmq_arch_fused_part) and the tensor is written once all are in.
 *
 * ---- The type choice from the weights (quant/gguf_choose.h) -------------------------------------------
 *   With choose.mode QUALITY or TARGET, begin refines the mix's plan before declaring the types: the free
 *   tensors are the quantized ones whose type the mix rules chose (not --tensor-type, --output-type,
 *   --embedding-type, not a type no block tiles); TARGET allocates the block linears and a mixture's stacked experts
 * (token_embd / output keep the QUALITY choice at the mix's size: their errors are in other units than the linears'
 * output error energy). Each tensor's rows are read from the model's views at begin (the ORIGINAL weights: a GPTQ / AWQ
 *   driver then solves onto the chosen types); the importance is the imatrix's, else choice_imatrix's (the
 *   statistics of the full-precision model a solver run gathers for this), else none. TARGET's budget:
 *   choose.target_bytes, or when 0 floor(target_bpw × params / 8) (params: every tensor's elements, as in the
 *   plan's bits per weight; the budget is the tensor data, not the KVs). A changed type's note says so ("quality:
 *   -> iq4_nl", "target: -> q3_k"); the report's tensors get "pred_err" / "pred_err_mix", its totals
 *   "predicted_err" / "predicted_err_mix" (the sums over the free tensors), the plan table's total line too.
 *   choose.sensitivity MEASURED: before the choice, every allocated tensor's KLD alone in the mix's type is
 *   measured on sens_calib (quant/gguf_sens.h with opts sens; LLMQ_ERR_ARG without sens_calib) and given to the
 *   choice as kld_ref; the report's tensors also get "sens_kld" (that measurement) and "pred_kld" (the
 *   predicted KLD of the chosen type), its totals "predicted_kld" / "predicted_kld_mix" (sums over the
 *   allocated tensors: the linears; token_embd / output are not measured) and "sensitivity" (windows, seqlen,
 *   tokens, seconds); the plan's total line the predicted KLD.
 *   With mode MIX nothing of this happens (byte identity with llama-quantize is untouched).
 *
 * ---- Dry run ---------------------------------------------------------------------------------------
 *   dry_run: begin plans and checks everything but creates nothing (out is not even looked at);
 *   hand-overs are checked and dropped; finish writes nothing. llmq_gguf_export_print_plan shows it.
 *
 * ---- Errors ----------------------------------------------------------------------------------------
 *   One log line naming the output / tensor and a status: LLMQ_ERR_ARG (output exists without force,
 *   out == input, an already quantized tensor without allow_requantize, layer / which out of range or
 *   given twice, finish with a hand-over refused earlier), LLMQ_ERR_UNSUPPORTED (a type llmq cannot write, an
 *   input dtype that cannot be decoded, statistics of another model shape), what gguf_mix.h,
 *   formats/ggml/encode.h, formats/gguf.h and formats/hf/hfdir.h return. A hand-over refused for its
 *   arguments changes nothing; a failure while
 *   encoding or writing poisons the export (later calls return the same status). The caller ends
 *   with finish (which aborts when anything failed) or abort.
 */
#ifndef LLMQ_QUANT_GGUF_EXPORT_H
#define LLMQ_QUANT_GGUF_EXPORT_H

#include "calib/calib.h"
#include "calib/model/model.h"
#include "common/dtype.h"
#include "common/status.h"
#include "quant/gguf_choose.h"
#include "quant/gguf_mix.h"
#include "quant/gguf_sens.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

// A resumable output (quant/checkpoint.h "The writer-only run"): the file streams into part, a file of the
// caller's that survives failures and signals, instead of "<out>.tmp.<pid>", and is renamed onto out by finish.
// After every tensor written, step() is called with done = the tensors complete; after a tensor that brings the
// bytes written since the last sync to sync_bytes or more (not after the last tensor: finish follows), the file is
// first fsynced (formats/gguf.h llmq_gguf_writer_sync) and step() gets synced = true and offset = the bytes that
// hold those done tensors: what a later run passes back as done / offset to continue. A failing step() fails the
// export (its status).
struct llmq_gguf_export_stream {
    const char *part;    // the partial output file
    int64_t done;        // a resume: tensors 0..done-1 are in part already (not encoded again); 0: a new file
    uint64_t offset;     // where they end (checked against this run's layout: LLMQ_ERR_CORRUPT when it differs)
    uint64_t sync_bytes; // see above
    enum llmq_status (*step)(void *user, int64_t done, int64_t n_tensors, bool synced, uint64_t offset);
    void *user;
};

struct llmq_gguf_export_opts {
    struct llmq_gguf_mix_opts mix;
    const struct llmq_calib_stats *imatrix; // NULL = no importance (see "Importance"); only read in begin
    int n_threads;                          // encoder threads (>= 1)
    bool force, dry_run;
    bool progress;                                 // one stderr line per tensor with an ETA
    const json_t *provenance;                      // an object (or NULL): "method", "calibration", "imatrix", ...
    bool no_provenance;                            // no llmq.* keys (then rtn output == llama.cpp's bytes)
    bool allow_requantize;                         // see "Requantization"
    json_t **report;                               // if not NULL: finish stores a new object here (see below)
    struct llmq_gguf_choose_opts choose;           // the type choice from the weights (mode MIX: none)
    double target_bpw;                             // TARGET without choose.target_bytes: the budget in bpw
    const struct llmq_calib_stats *choice_imatrix; // importance of the choice when imatrix is NULL (or NULL)
    const struct llmq_calib_data *sens_calib;      // choose.sensitivity MEASURED: the windows it is measured on
    struct llmq_gguf_sens_opts sens;               // MEASURED: windows, seqlen, backend (n_threads: n_threads's)
    const struct llmq_gguf_export_stream *stream;  // a resumable output (above); NULL: "<out>.tmp.<pid>"
};

// Defaults: mix defaults (Q8_0), no imatrix, 1 thread, no force, no dry run, progress on,
// no provenance object (llmq.version and llmq.gguf_type are still written), no report, requantizing refused.
struct llmq_gguf_export_opts llmq_gguf_export_default_opts(void);

struct llmq_gguf_export; // opaque

// Plans every tensor (gguf_mix.h), checks the output path, opens "<out>.tmp.<pid>" and writes the
// header placeholder (nothing of that with dry_run). m must outlive the export; o is copied (its
// pointers must stay valid until finish). On failure *out is NULL, nothing was created, one error
// line was logged.
enum llmq_status llmq_gguf_export_begin(const struct llmq_model *m, const char *out_path,
                                        const struct llmq_gguf_export_opts *o, struct llmq_gguf_export **out);

// The output type of block `layer`'s linear `which` (what linear_bytes must be encoded in).
enum llmq_dtype llmq_gguf_export_linear_type(const struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which);
// Its importance (C floats, owned by e, valid until finish / abort), or NULL without an imatrix.
const float *llmq_gguf_export_linear_importance(const struct llmq_gguf_export *e, int64_t layer,
                                                enum llmq_linear which);

// Hands over a linear as R rows already encoded in linear_type (R * row bytes), rows in the MODEL's
// order (GGUF order for a GGUF input; an HF llama's q / k rows are permuted by the writer). Copied
// during the call.
enum llmq_status llmq_gguf_export_linear_bytes(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                               const void *blocks);
// Or as f32 weights W (R, C) in the model's row order, encoded here with the linear's importance.
enum llmq_status llmq_gguf_export_linear_f32(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                             const float *W);

// A moe block's experts (which LLMQ_LIN_GATE, UP, DOWN: blk.N.ffn_{gate,up,down}_exps): one type for all E experts of
// the stacked tensor (llmq_gguf_export_expert_type of that `which` gives it; LLMQ_DTYPE_INVALID for a dense model).
// Expert `expert`'s (R, C) handed over as R encoded rows (or f32 weights, encoded here without importance), copied into
// the stacked tensor at rows expert R .. (expert + 1) R - 1; the tensor is written once all E are there. Without any
// hand-over (rtn: the writer alone) it is encoded from the model's views at finish, as before.
enum llmq_dtype llmq_gguf_export_expert_type(const struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which);
enum llmq_status llmq_gguf_export_expert_bytes(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                               int64_t expert, const void *blocks);
enum llmq_status llmq_gguf_export_expert_f32(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                             int64_t expert, const float *W);

// Hands over block `layer`'s attn_norm, ffn_norm and q / k / v biases as the driver's weight set ly holds them
// (AWQ's folded norms and v bias), copied during the call; they are written instead of the model's views. Before
// the block's seventh linear (LLMQ_ERR_ARG once one of them was written); a second call replaces the first.
enum llmq_status llmq_gguf_export_block(struct llmq_gguf_export *e, int64_t layer, const struct llmq_layer *ly);

// Writes every tensor not written yet, commits and renames the file, stores the report, frees e.
// The report: {"output", "model", "ftype", "dry_run", "tensors": [{"name", "shape", "src_type",
// "type", "wanted", "bytes", "note", "seconds"}], "totals": {"tensors", "params", "bytes",
// "bits_per_weight", "file_bytes", "fallbacks", "seconds"}}.
enum llmq_status llmq_gguf_export_finish(struct llmq_gguf_export *e);

// Removes the temporary output and frees e. NULL: no-op.
void llmq_gguf_export_abort(struct llmq_gguf_export *e);

// The plan as a table (name, shape, type, MiB, note) and totals (size, bits per weight) on f.
void llmq_gguf_export_print_plan(const struct llmq_gguf_export *e, FILE *f);

// The smallest and largest tensor data a TARGET choice can reach for m with o (its plan without encoding
// anything: llmq_gguf_choose_range) and every tensor's element count. Errors: as begin's plan.
enum llmq_status llmq_gguf_export_target_range(const struct llmq_model *m, const struct llmq_gguf_export_opts *o,
                                               uint64_t *min_bytes, uint64_t *max_bytes, int64_t *params);

// begin + finish: the whole `--method rtn` output.
enum llmq_status llmq_gguf_export_rtn(const struct llmq_model *m, const char *out_path,
                                      const struct llmq_gguf_export_opts *o);

#endif // LLMQ_QUANT_GGUF_EXPORT_H
