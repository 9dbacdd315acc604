/*
 * quant/quantize.h — the pipeline behind `llmq quantize`: calibration (calib/calib.h), one solver
 * per linear (RTN quant/quantizer.h, GPTQ quant/gptq.h / quant/gptq_gguf.h, AWQ quant/awq.h), output
 * through the writer interface (quant/writer.h: quant/export.h's directories or quant/gguf_export.h's GGUF).
 *
 * What it is: the block-by-block driver. What it is not: no solver, no writer, no CLI parsing.
 *
 * Legend: R rows/out, C cols/in, G group size, N calibration tokens (n_seq * seqlen), D n_embd.
 *
 * ---- Per method ----------------------------------------------------------------------------------
 *   rtn       no calibration needed: every linear rounded to nearest on the GPTQ grid
 *             (llmq_rtn_quantize). With --calib, the full-precision activations are gathered too, only
 *             to report the output error.
 *   gptq      true-sequential, as IST-DASLab/gptq llama.py --true-sequential: per block, the groups
 *             [q,k,v] -> [o] -> [gate,up] -> [down]; for each group the block is run (micro-batches)
 *             on x_q, the block input of the QUANTIZED model so far, with the already quantized linears
 *             of this block in place (the block's weight set: F32 views on their dequantized weights,
 *             the model's views for the rest; the model itself is never changed), collecting the
 *             group's XᵀX; H = 2/n_seq · XᵀX (calib/calib.h); each linear: llmq_gptq_quantize. After the
 *             block, x_q <- block(x_q) with all seven quantized: 5 block passes per block.
   gptq, gptaq (o->gptaq; Li et al. 2025, quant/gptq.h "GPTAQ"): the same passes on x_q, and a second stream x_fp,
             the block inputs of the FULL-PRECISION model: per block, first x_fp <- block(x_fp) with the model's
             weights, keeping every linear's fp input X (N, C) of that pass; then each statistics pass on x_q also
             sums ΔXᵀX̃ per block input (ΔX = X - X̃, in f64 over <= 256-token f32 products, like XᵀX), and each
             linear's solve gets D = 2/n_seq · ΔXᵀX̃ (llmq_gptq_opts.dxxt): Q minimises ‖W X − Q X̃‖². Cost: x_fp
             (N, D) f32 more; the fp inputs of one block, N x (C_q + C_o + C_gate + C_down) f32 (SmolLM2-135M:
             N x 3,264 floats, 107 MB at 16 x 512 tokens, 855 MB at 128 x 512), both under --max-memory
             (common/spill.h); one (C, C) f64 sum per block input and one (C, C) f32 D; one more block pass per
             block (6 instead of 5) and one (C, C, N) product per block input; the solver's own 2 C³ per linear
             (quant/gptq.h). The checkpoint carries x_fp with x (the resume continues both streams).
 *   awq       AutoAWQ: block inputs x_fp from the full-precision model; llmq_awq_search (scale + clip)
 *             on the block's fp input; each scaled and clipped linear rounded on the AWQ grid
 *             (llmq_quant_params_awq); the folded norms and v bias go to the output with the search's
 *             weight set (llmq_qwriter_put_block), the folded v / up rows with their linears.
 *   awq+gptq  AWQ's scaling and clipping, then GPTQ on the scaled weights with the Hessian of the scaled
 *             input H' = H / (s_i s_j) (llmq_awq_scale_hessian), H from the same full-precision inputs
 *             (not true-sequential: AWQ's search needs the fp block input anyway).
 *   A group size that does not tile a linear's C is refused (LLMQ_ERR_ARG naming the layer and the
 *   options) unless fallback_rtn_per_channel: that linear is then rounded per output channel (G = -1,
 *   re-expressed on the G grid by repeating its one (scale, zero) in every group so the writers see a
 *   uniform layout; only --format fake can hold a non-tiled C).
 *
 * ---- One method, every writer -------------------------------------------------------------------
 *   Each method is written once, against the target the writer gives each linear (llmq_qwriter_target):
 *   an integer grid (the directories: q) or a ggml type (GGUF: the mix's), plus the writer's importance.
 *   The same step then means, per target kind: rounding = llmq_rtn_quantize / AutoAWQ's grid (awq), or the
 *   type's encoder with the importance (formats/ggml/encode.h); GPTQ = llmq_gptq_quantize, or
 *   llmq_gptq_gguf_quantize; AWQ's search quantizer = its own grid, or encode-and-decode with the type. The
 *   result goes to llmq_qwriter_put_linear as codes + grid or as encoded rows, and its decoding is what the
 *   true-sequential passes and the reported error see. What only one kind has is there once: the per-channel
 *   fallback (a grid), the plain conversion of F32 / F16 / BF16 linears and GPTQ's "gptq:rtn" fallback (ggml
 *   types, see below).
 *
 * ---- GGUF output (to_gguf: the writer is quant/gguf_export.h) ---------------------------------------
 *   Every linear gets the type the writer's mix gives it (its target); q, the group size, static_groups
 *   and the fallback do not apply (static_groups: LLMQ_ERR_ARG; act_order does, quant/gptq_gguf.h; rtn is
 *   the writer alone: begin and finish, which encodes every tensor itself). Importance: imatrix_path's when
 *   given, else (rtn) the statistics gathered from the calibration, else (gptq, awq) the block statistics
 *   below; without any, rtn is unweighted.
 *   gptq      the same true-sequential loop; each linear through llmq_gptq_gguf_quantize (quant/gptq_gguf.h)
 *             with importance = imatrix, else diag(H); its blocks are handed over as encoded rows and
 *             their decoding replaces the linear in the block's weight set for the following passes.
 *             rtn_err: the encoder alone with the same importance. When GPTQ's err is not below rtn_err (it
 *             happens with little data on a type whose importance-weighted encoder is already strong, e.g.
 *             Q4_K ffn_down), the encoder's blocks are written instead: method "gptq:rtn", the rejected
 *             "gptq_err" in the JSON (onto a directory's grid GPTQ's result is always written: its rtn_err
 *             is the unweighted grid).
 *   awq       AWQ's search with the GGUF quantizer (llmq_awq_opts.fake_quant: encode with the linear's type
 *             and the importance of the scaled input, imp / s², then decode; group = the type's block);
 *             importance = imatrix, else Σx²/count of the block's fp inputs. Each scaled and clipped
 *             linear is encoded the same way and handed over as rows (the folded norms and v bias as
 *             for a directory).
 *   awq+gptq  the same search, then llmq_gptq_gguf_quantize on the scaled weights with H' and imp / s².
 *   F32 / F16 / BF16 linears (the mix's last resort): handed over as f32, converted by the writer
 *             (method "convert").
 *   Calibration size: GPTQ fits H, so with few tokens per input column it overfits: its in-sample err
 *   (below rtn_err) says nothing about other text (bench/README.md, "GPTQ into GGUF and the calibration
 *   size"). Use tens of thousands of tokens (e.g. 32 x 512 or more) or a larger --damp when data is short.
 *   Type choice (gguf.choose: --mix quality, --target-*; quant/gguf_choose.h): made by the writer at begin from
 *             the original weights and the importance: the imatrix, else (rtn --calib) the gathered statistics,
 *             else (gptq / awq, and dry runs with --calib) the full-precision model's statistics on the same
 *             calibration (gguf.choice_imatrix; one more forward pass over it); the solvers then solve onto the
 *             chosen types. gguf.choose.sensitivity MEASURED: the writer measures each linear's KLD alone on the
 *             calibration's first windows (gguf.sens_calib: the solvers' calibration, else the one loaded for
 *             the statistics, else, with --imatrix, the calibration loaded for this only; quant/gguf_sens.h).
 *   Report: each layer row also has "type"; "totals" the writer's figures (tensors, bytes, whole-file
 *   bits_per_weight, fallbacks) plus linear_bits_per_weight; "gguf" the writer's own report.
 *
 * ---- Mixture of experts (mixtral, qwen3_moe, qwen2_moe) ------------------------------------------------
 *   qwen2_moe's shared expert is quantized as the block's dense gate / up / down ("blk.L.ffn_gate_shexp" in the log
 *   and JSON, no "expert"), on every token's statistics; gptq solves its gate / up right after the experts' on the
 *   same pass, its down after the experts' downs. Its sigmoid gate stays full precision like the router.
 *   Expert x's gate / up / down are linears of their own ("blk.L.ffn_gate_exps.X" in the log and JSON, with "expert",
 *   "routed_tokens", "calib_tokens"), solved on that expert's statistics (calib/calib.h "Per-expert statistics"),
 *   onto the writer's expert target (quant/writer.h: one grid, or the stacked tensor's one GGUF type; the importance
 *   of a ggml row encoder is diag of the expert's Hessian). The router is never quantized (the writers keep it f32 in
 *   GGUF, the output dtype in a directory); a dense block's rules hold for q, k, v, o.
 *   gptq       [q,k,v] -> [o] -> [every expert's gate, up] -> [every expert's down]: a full block pass gathers the
 *              experts' gate/up inputs (the routing of the quantized model so far), then one the down inputs with
 *              the quantized gate / up in place (--no-true-sequential: one pass for all).
 *   awq        quant/awq.h "Mixture of experts"; the experts' Hessians come from the block's fp inputs, scaled by the
 *              input scales (H / (s_i s_j)) for awq+gptq and the error; rows report rtn_orig_err (RTN of the
 *              original weights on the same statistics), the baseline AWQ is judged against.
 *   rtn        into a directory like the others; into GGUF the writer alone, with --calib each expert's Σx² / count as
 *              its importance (what llama-imatrix's per-expert rows give llama-quantize), or with --imatrix the
 *              file's per-expert rows (calib/calib.h; --imatrix with gptq / awq / awq+gptq is refused for moe: their
 *              experts take the statistics of --calib). gguf.choose QUALITY / TARGET: one type per stacked expert
 *              tensor (quant/gguf_choose.h "Experts"); its sensitivity MEASURED is refused for moe.
 *   moe_calib_all (--moe-calib all, the default): every token through every expert for the statistics; the block's
 *              output keeps the real routing. Measured on the random test models (bench/README.md "moe_calib"): the
 *              KL divergence after GPTQ was lower than with routed in 7 of 8 runs. Under routed, an expert with
 *              fewer routed tokens than moe_token_floor is rounded (RTN, method "rtn:floor", "fallback" in its rows,
 *              a log line) by gptq and awq+gptq.
 *   Coverage: per block a log line and a row of the report's "moe" ({"calib", "token_floor", "fallback_rtn",
 *              "layers": [{"layer", "tokens_min", "tokens_median", "tokens_max", "under_floor", "routed"}]}), from the
 *              routing of the pass that gathered the gate/up inputs.
 *   Checkpoint and resume as for a dense model (see below): the block's files hold its experts' hand-overs and its
 *              coverage rows (quant/checkpoint.h "EXPT", "JSON"); moe_calib_all and moe_token_floor are in the
 *              fingerprint.
 *   Not for moe yet: --imatrix with a solver, --sensitivity measured, --gptaq.
 *   Memory: an expert's f32 weights exist only while it is used: gptq holds each quantized expert as codes /
 *   encoded rows (exp_held) and the forward decodes it per product into one scratch (llmq_forward_set_expert_source);
 *   AWQ copies no expert (quant/awq.h "Mixture of experts"). The experts' XᵀX sums are mapped per block (E (D² + Fe²)
 *   f64 at most, pages touched only by experts that see tokens) and unmapped expert by expert as they are solved.
 *
 * ---- phi3 (fused qkv_proj / gate_up_proj) -----------------------------------------------------------------
 *   q, k, v and gate, up are solved as the row ranges of the fused tensors they are (they share one input: one
 *   Hessian, one AWQ input scale, so this is the fused linear's own solve, row by row). AWQ's groups are llama's
 *   (quant/awq.h): the input norm's scale over q|k|v's columns, the post-attention norm's over gate|up's, the
 *   up -> down scale on the up rows of gate_up_proj only, v -> o only when v and o have one shape. The
 *   writers put them back fused (quant/export.h "Fused linears", quant/gguf_export.h "phi3's fused linears"). Each
 *   part keeps its own log line and JSON row, plus "fused": {"tensor": "blk.L.attn_qkv" | "blk.L.ffn_up",
 *   "rows": [r0, r1)} (and the log line's "rows r0..r1 of ...").
 *
 * ---- Reported error (stderr line, --json) ----------------------------------------------------------
 *   err = ‖(W - Q) X‖² / ‖W X‖² with W the matrix handed to the solver (AWQ: scaled and clipped), Q its
 *   dequantization, X the solver's input (AWQ: scaled), computed as tr(ΔW H ΔWᵀ) / tr(W H Wᵀ) with H the
 *   layer's XᵀX. gptq additionally reports the reference's loss and rtn_err, the same ratio for RTN of
 *   the same W on the same H (so the JSON proves GPTQ < RTN per layer). Without calibration (rtn):
 *   err = ‖W - Q‖² / ‖W‖² (weight error), marked "werr".
 *
 * ---- Profile (the report's "profile", a stderr line at the end) -------------------------------------
 *   The run's wall seconds split by stage: calibration (the windows, the embeddings, the type choice's statistics
 *   pass, the block path's upload of the activations), weight_uploads (the block path: each block's weights
 *   converted and uploaded, the solved linears' decodings), block_passes (every statistics and output pass; on the
 *   block path each waited for, so the device's time), sums_download (the block path: the gathered sums into the
 *   host's statistics), hessians (H from the sums, calib/calib.h), awq_search (llmq_awq_search), solvers (each
 *   linear's solve and its reported errors: the rows' seconds less the hand-over), writer (begin, the hand-overs,
 *   finish), checkpoint (open / replay and each block's commit), other (the rest: allocation, the ETA, the
 *   report), total; the stderr line names the stages the run had (a time above 0). Timings vary from run to run: the
 profile is the one part of the report that is not
 *   deterministic (with the rows' "seconds" and "totals.seconds").
 *
 * ---- Determinism ------------------------------------------------------------------------------------
 *   Same model, sources, seed, options and n_threads -> byte-identical output directory and JSON
 *   (except "seconds" fields). OpenBLAS is set to n_threads.
 *
 * ---- Sweeps (several levels from one command: cli/cmd_quantize.c) --------------------------------
 *   The model is loaded once and llmq_quantize_run runs once per level. What is reused between the levels
 *   is what does not depend on the level: rtn into GGUF with --calib gathers its importance (the
 *   calibration pass over every block) on the first level into struct llmq_quantize_shared and every
 *   later level takes it from there, with the same calibration record, so each file has the bytes of its
 *   single run. rtn without calibration has nothing to share. gptq and awq+gptq recompute everything per
 *   level: they are true-sequential (each block's Hessian is taken on the inputs from the blocks already
 *   quantized AT THAT LEVEL), so only block 0's statistics would be common. awq's block inputs come from
 *   the full-precision model and could be shared, but its scale and clip search runs the level's own
 *   quantizer on them, and keeping the inputs of every block for all levels would hold N x D floats per
 *   block beyond the one block the pipeline keeps (quant/quantize.h "Memory"); it recomputes them too.
 *
 * ---- Memory -----------------------------------------------------------------------------------------
 *   x_q or x_fp (N, D) f32 + one copy for the block passes; the forward object sized for micro_batch
 *   sequences (AWQ: for all N tokens, its search needs them in one call); one block's f32 weights and
 *   their quantized copies; XᵀX of the four block inputs in f64. GPTQ's true-sequential block holds one
 *   input's f64 sums at a time, releases them while the Hessian is taken (calib/calib.h
 *   llmq_calib_hessian_take), keeps its quantized linears as codes / encoded rows between the passes and
 *   decodes them into f32 for each pass only, and releases the solver buffers and the forward's weight scratch
 *   between the phases; the 8B shape's peak is ffn_down's XᵀX pass (bench/README.md "scale"). The
 *   activations (x, its copy, the
 *   forward's per-token buffers) come from common/spill.h: beyond --max-memory they live in an unlinked
 *   temporary file instead of RAM.
 *
 * ---- Decoder blocks (calib/blocks.h) ----------------------------------------------------------------
 *   The passes above run one of two ways:
 *   forward.c   calib/model/forward.h block by block over the (N, D) activations on the host, a micro-batch at a
 *               time, the statistics summed on the host as the hook sees them (their products on o->backend).
 *               Every method, family and option, and the only path with --device cpu.
 *   block.h     with --device cuda, for rtn (with calibration), gptq without GPTAQ, awq and awq+gptq, on the families
 *               calib/model/devblock.h covers (llama, mistral, qwen2, qwen3 without sliding window, softcap,
 *               linear RoPE scaling, partial RoPE; no moe): kernels/block.h. The activations are uploaded once
 *               after the embedding (or the resume) and stay where the block computes for every block; each block's
 *               weights are converted and uploaded once; gptq's true-sequential statistics passes gather the group's
 *               one input: q/k/v's (the attention RMSNorm alone, as forward.c's norm pass) and o's (up to the
 *               attention) with llmq_block_gather, x_q only read; once [o] is solved x_q <- h = x_q + the attention
 *               half in place (kernels/block.h llmq_block_attn, gate/up's input gathered on the way), then down's
 *               input from h and the output pass x_q <- h + MLP(h) (llmq_block_ffn): the attention runs twice per block
 *               (forward.c's path: four times), x_q is never copied; after each group its solved linears' decodings
 *               replace the block's weights (rtn: one pass with every input's sums). Per pass the host downloads the
 *               gathered input's column sums (calib/calib.h llmq_calib_take_block_sums: the finite check) and, per
 *               linear, its H converted from the f64 sums where the block computes (f32, the bits of
 *               llmq_calib_hessian: calib/blocks.h llmq_blocks_hessian; the statistics keep no XᵀX on this path),
 *               and solves as above (GPTQ's CUDA steps upload H again: quant/gptq.h); the reported errors'
 *               tr(Δ H Δᵀ) use that H where it was made (llmq_blocks_quad_form: only Δ goes up). With a
 *               checkpoint the activations come back to the host after each block. No (N, D) host copy is made.
 *               Placement (calib/blocks.h): resident when the activations with the block's buffers (a micro-batch
 *               with its Gram and column sums, one Hessian and the error sums' chunks: llmq_blocks_bytes) fit in
 *               o->max_vram (--max-vram; default half of the device's free memory), else streamed from r->x
 *               (page-locked) a micro-batch at a time; when the buffers alone do not fit, forward.c.
 *               awq / awq+gptq (quant/awq.h "On the block path"): one fp pass keeps each micro-batch's attention and
 *               MLP outputs there (2 N·D floats more, plus a scale group's saved weights and one Δ: needs the
 *               resident placement, else forward.c with the line saying so) with the four inputs' sums and the clip
 *               search's sampled rows; each ratio's candidates are made there and the inspected half run over every
 *               micro-batch; the linears then as on forward.c (H from the block's sums, scaled by 1/(s_i s_j) on the
 *               host and uploaded again for the error sums); x <- x + attn + mlp (the fp block output).
 *   The choice is one info line ("quantize: decoder blocks on cuda through kernels/block.h ..." or "... through
 *   calib/model/forward.c (...): <why>"): GPTAQ (its second stream), devblock's refusal of the family (moe among
 *   them), or the budget (llmq_quantize_block_refusal gives the first).
 *   Agreement: on the CPU backend (the test hook LLMQ_QUANT_BLOCK=cpu; off keeps forward.c with --device cuda,
 *   another value is LLMQ_ERR_ARG) the block path writes the SAME BYTES as forward.c with --threads 1, for every
 *   format (tests/py/test_quantize_blocks.py: llama, qwen2, qwen3, true-sequential or not, GGUF, resume; awq and
 *   awq+gptq when forward.c's search takes the Gram form and runs every sequence in one micro-batch). On CUDA
 *   the statistics differ by float rounding (kernels/block.h): NOT YET RUN ON A GPU.
 *
 * ---- Checkpoint and resume (o->checkpoint, o->resume; quant/checkpoint.h) ------------------------------------
 *   A solver run (every method into a directory, gptq / awq / awq+gptq into GGUF) keeps "<out_dir>.partial"
 *   next to the output: after each block, what that block handed to the writer (exactly as handed over, with
 *   the non-linear tensors the writer read meanwhile), the next block's input x, the report rows so far and a
 *   fingerprint of the model files, the provenance settings and the run options. With o->resume a run whose
 *   fingerprint matches replays the saved blocks into a fresh writer in order, restores x and continues at the
 *   next block: the output has the bytes of an uninterrupted run (the calibration windows are drawn again from
 *   the seed, and tokens_sha256 in the fingerprint proves them equal; the GGUF plan and the type choice's
 *   importance are recomputed from the same inputs). A fingerprint that differs is refused naming what differs.
 *   On success the checkpoint is removed; on a failure or a signal it is kept (common/io.h prints how to
 *   resume). rtn into GGUF has no block loop: its output streams into the checkpoint directory and a resume
 *   continues after the last tensor committed there (quant/checkpoint.h "The writer-only run"). Dry runs keep none.
 */
#ifndef LLMQ_QUANT_QUANTIZE_H
#define LLMQ_QUANT_QUANTIZE_H

#include "calib/blocks.h"
#include "calib/calib.h"
#include "calib/model/model.h"
#include "common/status.h"
#include "quant/export.h"
#include "quant/gguf_export.h"
#include "quant/gptq.h"
#include "quant/quantizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define LLMQ_MOE_TOKEN_FLOOR_DEFAULT 32 // --moe-token-floor's default (see "Mixture of experts")

enum llmq_qmethod { LLMQ_QMETHOD_RTN, LLMQ_QMETHOD_GPTQ, LLMQ_QMETHOD_AWQ, LLMQ_QMETHOD_AWQ_GPTQ };

const char *llmq_qmethod_name(enum llmq_qmethod m);             // "rtn", "gptq", "awq", "awq+gptq"
bool llmq_qmethod_parse(const char *s, enum llmq_qmethod *out); // false when unknown
// gptq and awq+gptq run the GPTQ solver (and so take its options: order, damping, true-sequential)
static inline bool llmq_qmethod_uses_gptq(enum llmq_qmethod m) {
    return m == LLMQ_QMETHOD_GPTQ || m == LLMQ_QMETHOD_AWQ_GPTQ;
}

struct llmq_quantize_opts {
    enum llmq_qmethod method;
    struct llmq_qconfig q;         // bits, group size, sym
    float percdamp;                // GPTQ damping (0.01)
    bool act_order, static_groups; // GPTQ
    bool group_aware;              // GPTQ: GPTQModel's act_group_aware order (quant/gptq.h step 4); not gguf
    bool true_sequential;          // GPTQ (default true)
    enum llmq_gptq_grid gptq_grid; // GPTQ into a directory: each group's (scale, zero) search (quant/gptq.h);
                                   // MINMAX by default; not gguf (the block encoders search their own scales)
    bool gptaq;                    // gptq into a directory: GPTAQ's target, see "Per method" (quant/gptq.h "GPTAQ")
    float gptaq_alpha;             // its scale of the asymmetric term (0.25, upstream's)
    bool fallback_rtn_per_channel; // non-tiled C -> RTN per channel instead of an error
    bool allow_requantize;         // quantize linears stored in a block type (a Q4_1 GGUF input) instead
                                   // of refusing the first (LLMQ_ERR_ARG), as quant/gguf_export.h
                                   // "Requantization"; every linear counts, since every one is re-encoded
                                   // (to_gguf: gguf.allow_requantize is the switch)
    struct llmq_calib_opts calib;  // sources etc.; calib.n_sources == 0: no calibration (rtn only)
    int64_t micro_batch;           // sequences per forward call (8)
    int n_threads;
    enum llmq_backend backend;           // GEMM backend (kernels/gemm.h) of the forward passes, XᵀX, AWQ's search
                                         // and the layer-error products, and of GPTQ's steps 5-7 into a directory
                                         // format (quant/gptq.h); CPU by default. The GGUF encoders and GPTQ onto
                                         // ggml blocks (quant/gptq_gguf.h) run on the CPU.
    struct llmq_export_opts out;         // format, force, ... (q, provenance filled in by the pipeline)
    const char *out_dir;                 // the output directory, or the .gguf file when to_gguf
    bool to_gguf;                        // write a GGUF file (quant/gguf_export.h) instead of an HF directory
    struct llmq_gguf_export_opts gguf;   // its options (q, out are then unused; imatrix and provenance are
                                         // filled in by the pipeline, see "GGUF output")
    const char *imatrix_path;            // to_gguf: the importance from this file: llmq statistics (.lcs, magic
                                         // "LLMQCALS") or a llama-imatrix file (GGUF or legacy .dat); with rtn
                                         // it excludes calibration (which gathers the importance instead)
    bool dry_run;                        // any format: print the preflight plan (quant/plan.h), write nothing
                                         // (gguf.dry_run, which to_gguf's CLI sets too, means the same)
    FILE *plan;                          // dry runs: where the plan table and the preflight go (NULL: stdout)
    struct llmq_quantize_shared *shared; // a sweep's statistics shared between runs (see "Sweeps"); NULL: none
    uint64_t max_vram;                   // the block path's device budget in bytes (--max-vram; "Decoder blocks"),
                                         // 0: half of the device's free memory
    bool moe_calib_all;                  // moe: every calibration token through every expert for the statistics
                                         // (--moe-calib all), else only the routed ones (see "Mixture of experts")
    int64_t moe_token_floor;             // moe, --moe-calib routed: an expert the router sends fewer tokens is
                                         // rounded (RTN) instead of solved (LLMQ_MOE_TOKEN_FLOOR_DEFAULT)
    bool checkpoint;                     // keep "<out_dir>.partial" after each block (see "Checkpoint and resume")
    bool resume;                         // continue from that checkpoint when there is one
};

// Why a run of o keeps calib/model/forward.c for its passes ("" when it may take the block path: see "Decoder blocks"),
// and the block path's options for it (calib/blocks.h: quantize's hook LLMQ_QUANT_BLOCK, XᵀX and Hessians).
const char *llmq_quantize_block_refusal(const struct llmq_quantize_opts *o);
struct llmq_blocks_opts llmq_quantize_block_opts(const struct llmq_quantize_opts *o);

// What a sweep's runs share (see "Sweeps"): zero-initialise, pass the same one to every run of the sweep,
// free after the last. The model and the calibration options must not change between those runs.
struct llmq_quantize_shared {
    bool have;                 // d and s hold the gathered importance
    struct llmq_calib_data d;  // the calibration windows (their record goes into each file's provenance)
    struct llmq_calib_stats s; // the statistics gathered on them
};
void llmq_quantize_shared_free(struct llmq_quantize_shared *sh); // NULL is a no-op

// Defaults: rtn, 4 bits, G 128, asym, percdamp 0.01, true_sequential, micro_batch 8, 1 thread.
struct llmq_quantize_opts llmq_quantize_default_opts(void);

// The option checks llmq_quantize_run starts with, against m's shapes, before any work: method / flag
// conflicts, calibration present where the method needs it, the group size tiling every linear (the message
// names the first that it does not and the largest power of two <= the group size that tiles them all), and
// the output format holding every linear (llmq_export_check). LLMQ_OK, or the status after one error line;
// every failure is the caller's choice of options (the CLI exits 2 on it).
enum llmq_status llmq_quantize_check(const struct llmq_model *m, const struct llmq_quantize_opts *o);

// Runs the whole pipeline on m (only read: every block runs on a weight set of the pipeline's, see "Per
// method") and writes opts->out_dir: the one entry for every method and format. rtn into GGUF and every
// gguf.dry_run are the writer alone (llmq_gguf_export_rtn / the plan on o->plan), after the importance
// is loaded (imatrix_path) or, for rtn with calibration, gathered (llmq_calib_run over every block); the
// report is then the writer's, with "settings" added. *report (may be NULL) receives a new JSON object: {"settings":
// ..., "calibration": {...sources, sha256, tokens}, "layers": [{name, shape, method, err, loss, rtn_err, seconds,
// ...}], "totals": {...}}. Errors: see the modules; one line naming the layer / tensor.
// A dry run (dry_run or gguf.dry_run, any format) prints quant/plan.h's preflight plan on o->plan after the GGUF
// writer's table (a directory format: the plan alone; its report is {"settings", "model", "output", "dry_run"})
// and adds it as "preflight". A real run first checks free space (llmq_plan_preflight: LLMQ_ERR_IO before any
// work when the output, or the spill beyond --max-memory, does not fit its directory).
enum llmq_status llmq_quantize_run(const struct llmq_model *m, const struct llmq_quantize_opts *o, json_t **report);

#endif // LLMQ_QUANT_QUANTIZE_H
