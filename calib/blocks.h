/*
 * calib/blocks.h — the calibration set's passes through kernels/block.h, block by block: the engine behind the block
 * paths of `llmq calib` (calib/calib_run.c, calib/calib.h "Decoder blocks") and of `llmq quantize`'s rtn / gptq
 * passes and AWQ's scale search (quant/quantize.c, quant/quantize.h "Decoder blocks", quant/awq.h "On the block
 * path").
 *
 * What it does: the block's buffers for micro-batches of mb sequences with the sums asked for, each block's weights
 * converted and uploaded once (calib/model/devblock.h) and single linears replaced in place, the statistics passes
 * (llmq_block_gather: x only read; llmq_block_attn / llmq_block_ffn once the attention half is final) and the block
 * output pass, the sums taken into a struct llmq_calib_stats (calib/calib.h llmq_calib_take_block_sums), and for
 * quantize each linear's Hessian converted where the block computes and its error sums tr(Δ H Δᵀ) there.
 * Where the calibration activations (N, D) live:
 *   resident   on the device for the whole run (uploaded once, downloaded only for a checkpoint): when the
 *              activations plus the buffers fit in the budget;
 *   streamed   in the caller's host array, each micro-batch uploaded into one staging buffer, run, and (when the pass
 *              changes x) downloaded back, the array page-locked for the copies (cudaHostRegister; pageable when
 *              that fails, with an info line): when only the buffers fit. Copies and compute are not overlapped (one
 *              stream: NOT MEASURED, no GPU run yet);
 *   neither    calib/model/forward.c (the caller's path), with one info line naming why.
 * Budget: opts.max_vram bytes (--max-vram), else half of the device's free memory on CUDA; the CPU backend (the test
 * hooks) has none unless max_vram is given (so the tests can force streaming).
 * Who asks for it: a CUDA backend, or the caller's test hook (calib/model/devblock.h llmq_devblock_want: opts.env "cpu"
 * runs the same wiring on the CPU backend, bit for bit forward.c's with one thread; "off" keeps forward.c).
 * NOTHING OF THE CUDA HALF HAS RUN ON A GPU (kernels/block.h).
 *
 * Legend: N calibration tokens (n_seq · seqlen), D n_embd, mb sequences per block call, C a block input's width.
 */
#ifndef LLMQ_CALIB_BLOCKS_H
#define LLMQ_CALIB_BLOCKS_H

#include "calib/calib.h"
#include "calib/model/model.h"
#include "common/status.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stdint.h>

struct llmq_blocks;

struct llmq_blocks_opts {
    const char *who;           // the command's name in messages ("calib", "quantize")
    const char *env;           // its test hook's variable ("LLMQ_CALIB_BLOCK", "LLMQ_QUANT_BLOCK")
    enum llmq_backend backend; // the run's backend (CUDA asks for the block path)
    int64_t micro_batch;       // sequences per block call (clamped to 1 .. n_seq)
    uint64_t max_vram;         // the budget in bytes; 0: half of the device's free memory (CPU: none)
    bool gram;                 // gather XᵀX (LLMQ_BLOCK_SUM_GRAM) besides the column sums
    bool hessians;             // keep a Hessian and the error sums' buffers (llmq_blocks_hessian, _quad_form)
    bool awq;                  // AWQ's search buffers ("AWQ's scale search" below); needs the activations resident
    const char *refusal;       // NULL / "": the run may take the block path; else why not (the info line's reason)
};

// The blocks for m and d, or *out NULL for calib/model/forward.c (one info line: the path and placement taken, or
// why not: opts.refusal, devblock's refusal of the family or feature, the budget). Without calibration (d->n_seq 0)
// *out NULL and no line. LLMQ_ERR_ARG for a bad test hook value, the device's and the allocation's errors.
enum llmq_status llmq_blocks_open(const struct llmq_model *m, const struct llmq_calib_data *d,
                                  const struct llmq_blocks_opts *o, struct llmq_blocks **out);
void llmq_blocks_free(struct llmq_blocks *q); // NULL is a no-op

// Bytes where the blocks compute for m with n_seq x seqlen calibration tokens: resident (the activations with the
// buffers) or streamed (the buffers and one micro-batch); -1 when m's family keeps forward.c. The plan's VRAM
// (quant/plan.h) and the budget above.
int64_t llmq_blocks_bytes(const struct llmq_model *m, const struct llmq_blocks_opts *o, int64_t n_seq, int64_t seqlen,
                          bool streamed);

// Whether the activations are streamed from the caller's host array (see above), not resident.
bool llmq_blocks_streamed(const struct llmq_blocks *q);

// The (N, D) block input from the host. Resident: uploaded (x is free again on return). Streamed: x IS the
// activations from now on: the caller keeps it allocated and does not touch it until llmq_blocks_get_x or free.
enum llmq_status llmq_blocks_put_x(struct llmq_blocks *q, float *x);
// The activations into x (N, D) on the host (a checkpoint's copy; streamed: a copy only when x is not the array).
enum llmq_status llmq_blocks_get_x(struct llmq_blocks *q, float *x);

// Every weight of the weight set ly (converted to f32 on n_threads threads where it is not) into the block.
enum llmq_status llmq_blocks_load(struct llmq_blocks *q, const struct llmq_layer *ly, int n_threads);
// Linear k's weights (R, C) f32 row-major (a solved linear's decoding) in place of the block's.
enum llmq_status llmq_blocks_set_linear(struct llmq_blocks *q, enum llmq_linear k, const float *w);

// The statistics of the block inputs in `slots` (bits 1u << LLMQ_CALIB_SLOT_*) with the block's weights as they are,
// over every calibration sequence in micro-batches, added to s's block l (allocated for it, those slots still zero, as
// calib/calib.h's hook adds): kernels/block.h llmq_block_gather (the block input is not changed); after
// llmq_blocks_apply_attn only the ffn inputs, from h (llmq_block_ffn; another input is LLMQ_ERR_ARG). Not mirrored
// (llmq_calib_stats_finish). LLMQ_ERR_NUMERIC for a non-finite input, naming block, input, sequence, position.
enum llmq_status llmq_blocks_gather(struct llmq_blocks *q, int64_t l, unsigned slots, struct llmq_calib_stats *s);

// x <- h = x + the block's attention half (kernels/block.h llmq_block_attn) with the weights as they are, once the
// attention's linears are final (gptq: after [o]), and the statistics of the ffn inputs in `slots` (gate/up's, 0:
// none) from h as llmq_blocks_gather does. From then on llmq_blocks_gather takes only the ffn inputs (from h, no
// attention computed again) and llmq_blocks_advance applies only the ffn half. LLMQ_ERR_ARG when x already holds h
// or for an attention input.
enum llmq_status llmq_blocks_apply_attn(struct llmq_blocks *q, int64_t l, unsigned slots, struct llmq_calib_stats *s);

// The block's output pass: x <- block(x) (after llmq_blocks_apply_attn: x <- h + MLP(h)) with the block's weights as
// they are; with s, also the statistics of every input the pass computes (all four; after apply_attn the ffn's) into
// s's block l as llmq_blocks_gather does (calib's pass; rtn: the full-precision inputs of its report).
enum llmq_status llmq_blocks_advance(struct llmq_blocks *q, int64_t l, struct llmq_calib_stats *s);

// H (C, C) f32 = 2 / n_seq · XᵀX of block input `slot` from the last pass that gathered it (kernels/block.h
// llmq_block_hessian: converted where the block computes and kept there for llmq_blocks_quad_form, only the f32
// matrix downloaded): the bits of calib/calib.h llmq_calib_hessian on the same sums. Valid until the next pass with
// statistics (which zeroes the sums); the statistics' own XᵀX is not needed. Blocks opened with opts.hessians.
enum llmq_status llmq_blocks_hessian(struct llmq_blocks *q, int slot, float *H);

// *out = Σ_r d_r H d_rᵀ (f64) for Dl (R, C) on the host and H the last llmq_blocks_hessian's, kept where the block
// computes (quant/quantize.c's error sums: only Dl goes to the device, in row chunks). The CPU backend repeats
// quant/quantize.c quad_form's products and sum (chunks of 256 rows, one running sum in order: the same bits); CUDA
// sums each chunk as kernels/ops.h llmq_ops_dot_f64 does. LLMQ_ERR_ARG when C is not the width of that Hessian.
#define LLMQ_BLOCKS_QF_ROWS_CPU 256 // rows of Dl per product on the CPU: quant/quantize.c quad_form's chunk
enum llmq_status llmq_blocks_quad_form(struct llmq_blocks *q, const float *Dl, int64_t R, int64_t C, double *out);

// H (C, C) f32 from the host as the Hessian llmq_blocks_quad_form uses (AWQ: the scaled H' = H / (s_i s_j) its
// reported errors are measured on, quant/awq.h llmq_awq_scale_hessian). LLMQ_ERR_ARG for C wider than the buffer.
enum llmq_status llmq_blocks_set_hessian(struct llmq_blocks *q, const float *H, int64_t C);

// ---- AWQ's scale search (quant/awq.h "On the block path"; blocks opened with opts.awq, activations resident)
// ---------- The full-precision pass of block l with the block's weights (the model's, llmq_blocks_load): each
// micro-batch's attention output Wo·Attn(...) and MLP output kept where the block computes for the losses below, the
// sums of all four inputs into s's block l (as llmq_blocks_gather; XᵀX kept in the block for llmq_blocks_hessian and
// the Gram-form losses), and rows t = 0, step, 2·step, ... (t < N) of each input g into rows[g] (T, C_g) on the host
// where rows[g] is not NULL (the clip search's samples). x is not changed until llmq_blocks_awq_advance.
enum llmq_status llmq_blocks_awq_fp(struct llmq_blocks *q, int64_t l, int64_t step, float *const rows[4],
                                    struct llmq_calib_stats *s);
// The current weights of the linears in mask (bits 1u << k) saved where the block computes: the originals that
// llmq_blocks_awq_candidate scales and llmq_blocks_awq_restore puts back. At most q, k, v or gate, up at once.
enum llmq_status llmq_blocks_awq_save(struct llmq_blocks *q, unsigned mask);
enum llmq_status llmq_blocks_awq_restore(struct llmq_blocks *q, unsigned mask);
// Linear k := Q(W_k · s) / s from its saved weights, s (C) from the host, Q AutoAWQ's grid of bits over groups of G
// (kernels/ops.h llmq_ops_awq_candidate, computed where the block is); or, with wc (R, C) on the host (a plugged-in
// quantizer's candidate, made there), wc uploaded.
enum llmq_status llmq_blocks_awq_candidate(struct llmq_blocks *q, enum llmq_linear k, const float *s, int bits,
                                           int64_t G, const float *wc);
// *loss = Σ over every token and channel of (out - out_fp)² / (N·D), out the attention half's output of x (mlp false)
// or the MLP's of h = x + attn_fp (mlp true) with the block's weights as they are (the candidates in place);
// quant/awq.c mse's loop over the micro-batches in order on the CPU backend (the same bits).
enum llmq_status llmq_blocks_awq_loss(struct llmq_blocks *q, bool mlp, double *loss);
// The single-linear loss in Gram form for linear k (O or DOWN, its block weight the original): Σ_r Δ_r G Δ_rᵀ / (N·R),
// G = XᵀX of its input from llmq_blocks_awq_fp (f32), Δ = Q(W·s)/s - W made where the block is (AutoAWQ's grid as
// llmq_blocks_awq_candidate), or dw (R, C) from the host as Δ (a plugged-in quantizer's candidate minus W, made there).
// CPU: quant/awq.c gram_loss's products (row chunks of LLMQ_BLOCKS_QF_ROWS_CPU) and sum. Replaces the Hessian of
// llmq_blocks_quad_form (G stays for the next ratios of the same input).
enum llmq_status llmq_blocks_awq_gram_loss(struct llmq_blocks *q, enum llmq_linear k, const float *s, int bits,
                                           int64_t G, const float *dw, double *loss);
// x <- x + attn_fp, then + mlp_fp: the full-precision block output (llmq_block_forward's bits), the next block's input.
enum llmq_status llmq_blocks_awq_advance(struct llmq_blocks *q);

// Seconds spent so far, added to *load (weights converted and uploaded: llmq_blocks_load, _set_linear), *passes
// (the passes with their micro-batches' copies when streamed, each waited for: the device's time) and *sums (the
// sums downloaded into the statistics, the Hessians converted and downloaded).
void llmq_blocks_times(const struct llmq_blocks *q, double *load, double *passes, double *sums);

#endif // LLMQ_CALIB_BLOCKS_H
