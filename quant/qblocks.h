/*
 * quant/qblocks.h — the decoder blocks of `llmq quantize`'s passes through kernels/block.h (quant/quantize.h "Decoder
 * blocks"): the calibration activations (N, D) resident where the block computes, each block's weights uploaded
 * once and each solved linear replaced in place, every statistics pass and the block's output pass run there, the
 * sums downloaded once per pass into the block's statistics (calib/calib.h llmq_calib_take_block_sums).
 *
 * What it is: the bridge between quant/quantize.c's per-block methods (rtn with calibration, gptq without GPTAQ) and
 * kernels/block.h, for the families calib/model/devblock.h covers. What it is not: the solvers (GPTQ still gets its
 * Hessian on the host and, with --device cuda, uploads it again: quant/gptq.h), AWQ's search (calib/model/forward.c),
 * mixtures of experts, GPTAQ's second stream; no pinned staging, no prefetch of the next block's weights.
 * THE CUDA HALF HAS NEVER RUN ON A GPU (kernels/block.h): only the CPU backend, through the test hook
 * LLMQ_QUANT_BLOCK=cpu, is tested (tests/py/test_quantize_blocks.py).
 *
 * Legend: N calibration tokens (n_seq · seqlen), D n_embd, mb sequences per block call (o->micro_batch).
 */
#ifndef LLMQ_QUANT_QBLOCKS_H
#define LLMQ_QUANT_QBLOCKS_H

#include "calib/calib.h"
#include "calib/model/model.h"
#include "common/status.h"
#include "quant/quantize.h"

#include <stdbool.h>
#include <stdint.h>

struct llmq_qblocks;

// Whether the run's passes take the block path, and the blocks for it: *out NULL for calib/model/forward.c. Asked
// for by --device cuda or the test hook LLMQ_QUANT_BLOCK=cpu (off: forward.c; another value: LLMQ_ERR_ARG), as
// calib/model/devblock.h llmq_devblock_want; then one info line: the path taken, or why not — the method (awq and
// awq+gptq, GPTAQ), the family or feature devblock refuses (moe among them), or, on CUDA, the resident activations
// and the block's buffers above half of the device's free memory (the other half is the solvers' and the GEMMs').
// Without calibration (rtn alone) there are no passes: *out NULL, no line. The blocks hold a micro-batch of mb
// sequences with the Gram and column sums, and the (N, D) activations (contents undefined until llmq_qblocks_put_x).
enum llmq_status llmq_qblocks_open(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                   const struct llmq_calib_data *d, struct llmq_qblocks **out);
void llmq_qblocks_free(struct llmq_qblocks *q); // NULL is a no-op

// Bytes where the blocks compute for a run of o on m with n_seq x seqlen calibration tokens (the block for o's
// micro-batches with its sums, and the resident activations); -1 when the run keeps forward.c by its method or m's
// family (not by memory): the plan's VRAM (quant/plan.h) and the memory bound above.
int64_t llmq_qblocks_bytes(const struct llmq_model *m, const struct llmq_quantize_opts *o, int64_t n_seq,
                           int64_t seqlen);

// The (N, D) block input from the host (the embeddings, or a resumed checkpoint's activations) / back to it (for
// the checkpoint after a block).
enum llmq_status llmq_qblocks_put_x(struct llmq_qblocks *q, const float *x);
enum llmq_status llmq_qblocks_get_x(struct llmq_qblocks *q, float *x);

// Every weight of the weight set ly (converted to f32 on n_threads threads where it is not) into the block.
enum llmq_status llmq_qblocks_load(struct llmq_qblocks *q, const struct llmq_layer *ly, int n_threads);
// Linear k's weights (R, C) f32 row-major (a solved linear's decoding) in place of the block's.
enum llmq_status llmq_qblocks_set_linear(struct llmq_qblocks *q, enum llmq_linear k, const float *w);

// The statistics of the block inputs in `slots` (bits 1u << LLMQ_CALIB_SLOT_*) with the block's weights as they are,
// over every calibration sequence in micro-batches, added to s's block l (allocated for it, those slots still zero, as
// calib/calib.h's hook adds): kernels/block.h llmq_block_gather (the block input is not changed); after
// llmq_qblocks_apply_attn only the ffn inputs, from h (llmq_block_ffn; another input is LLMQ_ERR_ARG). Not mirrored
// (llmq_calib_stats_finish). LLMQ_ERR_NUMERIC for a non-finite input, naming block, input, sequence, position.
enum llmq_status llmq_qblocks_gather(struct llmq_qblocks *q, int64_t l, unsigned slots, struct llmq_calib_stats *s);

// x <- h = x + the block's attention half (kernels/block.h llmq_block_attn) with the weights as they are, once the
// attention's linears are final (gptq: after [o]), and the statistics of the ffn inputs in `slots` (gate/up's, 0:
// none) from h as llmq_qblocks_gather does. From then on llmq_qblocks_gather takes only the ffn inputs (from h, no
// attention computed again) and llmq_qblocks_advance applies only the ffn half. LLMQ_ERR_ARG when x already holds h
// or for an attention input.
enum llmq_status llmq_qblocks_apply_attn(struct llmq_qblocks *q, int64_t l, unsigned slots, struct llmq_calib_stats *s);

// The block's output pass: x <- block(x) (after llmq_qblocks_apply_attn: x <- h + MLP(h)) with the block's weights
// as they are; with s, also the statistics of every input the pass computes (all four; after apply_attn the ffn's)
// into s's block l as llmq_qblocks_gather does (rtn: the full-precision inputs of its report).
enum llmq_status llmq_qblocks_advance(struct llmq_qblocks *q, int64_t l, struct llmq_calib_stats *s);

// H (C, C) f32 = 2 / n_seq · XᵀX of block input `slot` from the last pass that gathered it (kernels/block.h
// llmq_block_hessian: converted where the block computes and kept there for llmq_qblocks_quad_form, only the f32
// matrix downloaded): the bits of calib/calib.h llmq_calib_hessian on the same sums. Valid until the next gather or
// advance with statistics (which zero the sums); the statistics' own XᵀX is not needed (quantize allocates them
// without it on this path).
enum llmq_status llmq_qblocks_hessian(struct llmq_qblocks *q, int slot, float *H);

// *out = Σ_r d_r H d_rᵀ (f64) for Dl (R, C) on the host and H the last llmq_qblocks_hessian's, kept where the block
// computes (quant/quantize.c's error sums: only Dl goes to the device, in row chunks, instead of H and Dl per product
// and D·H back). The CPU backend repeats quantize.c quad_form's products and sum (chunks of 256 rows, one running sum
// in order: the same bits); CUDA sums each chunk as kernels/ops.h llmq_ops_dot_f64 does. LLMQ_ERR_ARG when C is not
// the width of that Hessian.
enum llmq_status llmq_qblocks_quad_form(struct llmq_qblocks *q, const float *Dl, int64_t R, int64_t C, double *out);

// Seconds spent so far, added to *load (weights converted and uploaded: llmq_qblocks_load, _set_linear), *passes
// (the passes, each waited for: the device's time) and *sums (the sums downloaded into the statistics, the
// Hessians converted and downloaded).
void llmq_qblocks_times(const struct llmq_qblocks *q, double *load, double *passes, double *sums);

#endif // LLMQ_QUANT_QBLOCKS_H
