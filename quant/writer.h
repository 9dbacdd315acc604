/*
 * quant/writer.h — one interface over the quantized-model writers: begin, hand over every block linear
 * (llmq_qwriter_put_linear), finish or abort. The pipeline (quant/quantize.h) writes through this only, so
 * each method is written once for every output; behind it are quant/export.h (AWQ / GPTQ / fake HF
 * directories) and quant/gguf_export.h (a GGUF file), whose own headers document the bytes.
 *
 * What it is: an adapter that tells a solver, per linear, what the output holds (its target: an integer
 * grid, or a ggml type, and the importance the writer has for the linear's input) and takes the linear in
 * that form. What it is not: no solver, no packing or encoding (the writers do that), no type choice
 * (quant/gguf_mix.h).
 *
 * Legend: R rows = out_features, C cols = in_features, ng groups per row.
 *
 * ---- Targets and payloads --------------------------------------------------------------------------
 *   A directory holds every linear as integer codes on one grid (opts->dir->q): target kind CODES, and
 *   put_linear takes a struct llmq_qlinear with that grid's bits / group size / sym.
 *   A GGUF file holds each linear in the type its mix planned (llmq_gguf_export_linear_type): a ggml block
 *   type is target kind ROWS (R rows already encoded in that type, e.g. by formats/ggml/encode.h or
 *   quant/gptq_gguf.h); F32 / F16 / BF16 (the mix's last resort) are kind F32, handed over as f32 weights
 *   and converted by the writer. Its importance is the imatrix's (quant/gguf_export.h "Importance").
 *   A payload of another kind than the target's is LLMQ_ERR_ARG naming the linear, and changes nothing.
 *   Every payload is in the MODEL's row order (the writers undo a llama q / k permutation themselves) and
 *   is only read during the call.
 *
 * ---- Block tensors and order ----------------------------------------------------------------------
 *   The tensors of block l a method may change besides its linears (attn_norm, ffn_norm, q / k / v biases:
 *   AWQ folds its scales into them) come from the driver explicitly: llmq_qwriter_put_block hands over the
 *   block's weight set before the block's first put_linear, and the writer keeps copies until it writes
 *   them; a block never handed over is written from the model's own views. Every other tensor (embeddings,
 *   output, q / k norms, post norms) is the model's. The writers never read a driver's weight set after the
 *   call returned, so the driver may free it at once. Linears may come in any order (early ones are held,
 *   packed or encoded); block by block, q k v o gate up down, nothing is held beyond one block.
 *
 * ---- Errors ----------------------------------------------------------------------------------------
 *   As the writer behind: one log line naming the output / linear and a status. A put_linear refused for
 *   its arguments changes nothing; a failure while writing poisons the writer (later calls return it).
 *   The caller ends with llmq_qwriter_finish (which aborts when anything failed or is missing) or abort.
 */
#ifndef LLMQ_QUANT_WRITER_H
#define LLMQ_QUANT_WRITER_H

#include "calib/model/model.h"
#include "common/dtype.h"
#include "common/status.h"
#include "quant/export.h"
#include "quant/gguf_export.h"
#include "quant/quantizer.h"

#include <stdint.h>
#include <stdio.h>

// The writer's options: exactly one of the two is set (it is copied; its pointers must stay valid until
// finish / abort).
struct llmq_qwriter_opts {
    const struct llmq_export_opts *dir;       // an HF directory (quant/export.h)
    const struct llmq_gguf_export_opts *gguf; // or a GGUF file (quant/gguf_export.h)
};

enum llmq_qpayload_kind {
    LLMQ_QPAYLOAD_CODES, // integer codes + grid
    LLMQ_QPAYLOAD_ROWS,  // encoded ggml rows
    LLMQ_QPAYLOAD_F32,   // f32 weights, converted by the writer
};

// What the output holds for one linear: what a solver quantizes onto.
struct llmq_qtarget {
    enum llmq_qpayload_kind kind; // the payload put_linear takes for it
    enum llmq_dtype type;         // ROWS / F32: the file's type of the linear; CODES: LLMQ_DTYPE_INVALID
    struct llmq_qconfig q;        // CODES: the grid (bits, group size, sym); otherwise zero
    const float *importance;      // (C) the writer's importance of the linear's input, owned by the writer
                                  // until finish / abort; NULL when it has none (always for a directory)
};

// One linear as handed over; the member that kind names is read.
struct llmq_qpayload {
    enum llmq_qpayload_kind kind;
    const struct llmq_qlinear *codes; // CODES: q (R, C), scales / zeros (R, ng), g_idx (C)
    const void *rows;                 // ROWS: R rows encoded in the target's type (R * row bytes)
    const float *w;                   // F32: (R, C)
};

struct llmq_qwriter; // opaque

// The checks begin starts with, writing nothing: a directory's options and every linear's shape against
// its format (llmq_export_check); a GGUF file's are made by begin (its plan), LLMQ_OK here.
enum llmq_status llmq_qwriter_check(const struct llmq_model *m, const struct llmq_qwriter_opts *o);

// Opens the writer onto out (the directory, or the .gguf file) as llmq_export_begin /
// llmq_gguf_export_begin do; m must outlive it. On failure *w is NULL, nothing is left behind, one error
// line was logged.
enum llmq_status llmq_qwriter_begin(const struct llmq_model *m, const char *out, const struct llmq_qwriter_opts *o,
                                    struct llmq_qwriter **w);

// The target of block `layer`'s linear `which` (see "Targets and payloads").
struct llmq_qtarget llmq_qwriter_target(const struct llmq_qwriter *w, int64_t layer, enum llmq_linear which);

// Hands over that linear (see "Targets and payloads" and "Block tensors and order").
enum llmq_status llmq_qwriter_put_linear(struct llmq_qwriter *w, int64_t layer, enum llmq_linear which,
                                         const struct llmq_qpayload *p);

// A moe block's experts (which LLMQ_LIN_GATE, UP or DOWN, expert < E): the target of every expert of that linear
// (one grid, or the stacked GGUF tensor's one type; no importance: the solver brings each expert's own), and the
// hand-over of expert `expert`'s (R, C) linear. A directory writes it as that expert's HF linear, a GGUF file into
// the stacked blk.N.ffn_*_exps tensor (quant/export.h llmq_export_expert, quant/gguf_export.h
// llmq_gguf_export_expert_bytes).
struct llmq_qtarget llmq_qwriter_expert_target(const struct llmq_qwriter *w, int64_t layer, enum llmq_linear which);
enum llmq_status llmq_qwriter_put_expert(struct llmq_qwriter *w, int64_t layer, enum llmq_linear which, int64_t expert,
                                         const struct llmq_qpayload *p);

// Hands over block `layer`'s non-linear tensors as ly holds them (see "Block tensors and order"): before its
// first put_linear (LLMQ_ERR_ARG later), copied during the call.
enum llmq_status llmq_qwriter_put_block(struct llmq_qwriter *w, int64_t layer, const struct llmq_layer *ly);

// A GGUF dry run's plan table on f (llmq_gguf_export_print_plan); a directory has none: nothing printed.
void llmq_qwriter_print_plan(const struct llmq_qwriter *w, FILE *f);

// Writes what is left and commits the output (llmq_export_finish / llmq_gguf_export_finish, which stores
// the GGUF report where opts->gguf->report points). Always frees w.
enum llmq_status llmq_qwriter_finish(struct llmq_qwriter *w);

// Removes the temporary output and frees w. NULL: no-op.
void llmq_qwriter_abort(struct llmq_qwriter *w);

#endif // LLMQ_QUANT_WRITER_H
