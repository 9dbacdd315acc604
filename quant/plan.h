/*
 * quant/plan.h — the preflight plan of `llmq quantize`: what a run will need before it starts (the output
 * size, peak RAM, VRAM on CUDA, spill and checkpoint disk, the time of each stage), printed by --dry-run for
 * every method and format, and the free-space check every real run makes before any work.
 *
 * What it is: a model of quant/quantize.c's memory layout and work, evaluated on the model's shapes, plus a
 * short measurement of this machine's rates (well under a second: a few GEMMs, a weight conversion, the
 * encoders of the types in the plan). What it is not: a guarantee. Every time is an estimate from the rates
 * measured at plan time (the machine's load then); the RAM and VRAM figures are sums of the buffers the code
 * allocates, not measurements (bench/scale.sh puts them next to measured ones).
 *
 * Legend: R rows/out, C cols/in, N calibration tokens (nsamples x seqlen), T micro-batch tokens
 * (micro_batch x seqlen), D n_embd, F n_ff, V n_vocab, L n_layer, es bytes per source element.
 *
 * ---- Output size -------------------------------------------------------------------------------------
 *   gguf: the writer's own plan (quant/gguf_export.h: a dry begin, or the dry run's report) gives every
 *         tensor's type and bytes; the header (KVs, tokenizer, tensor infos) is estimated: a GGUF input's
 *         own header size, or an HF input's tokenizer files plus 96 bytes per tensor. A real run with
 *         --mix quality plans with the mix (an upper bound: quality picks no larger type), --target-* with
 *         its budget in place of the linears' mix bytes.
 *   awq / gptq / fake: quant/export.h's layouts (qweight, qzeros, scales, g_idx, biases per linear; the
 *         other tensors in f16, or the fake dtype), the safetensors headers (64 bytes + the name per
 *         tensor) and the side files (an HF input's tokenizer files; a GGUF input's header size for the
 *         rebuilt tokenizer).
 *
 * ---- Peak RAM (anonymous memory, and file pages of the mapped model) ----------------------------------
 *   The maximum over the run's phases of the pages they touch (untouched calloc / malloc pages and pages
 *   released with MADV_DONTNEED do not count). Base: what the process holds at plan time (its RssAnon:
 *   the model's headers, the tokenizer; RssFile likewise). Per method (quant/quantize.h "Memory"):
 *   check     the finiteness pass: one linear in f32 (4RC) and its mapped pages (RC·es).
 *   gptq      per block, phase by phase of the true-sequential loop: the block inputs x and its copy
 *             (2·4ND), the micro-batch forward (weight scratch 4·max RC, activations 4T(2D + 2Dq + 2Dkv +
 *             2F)), the seven quantized overrides (4RC each, kept from block to block), and then ONE block
 *             input's XᵀX in f64 (8C²) with the syrk scratch (4C²) during its pass; at each linear the
 *             Hessian H (4C²), the error copy Hx (4C², from the group's second linear), W / Q / T (4RC
 *             each), the solver's codes and grid (no C x C backup: H_src), the writer's packed parts; the
 *             XᵀX is freed once its group's last Hessian is taken. GPTQ into GGUF adds quant/gptq_gguf.c's
 *             C x C backup and the encoded rows.
 *   awq       x and its copy, the N-token forward of the scale search besides the micro-batch one, all four
 *             XᵀX of the block (8C² each), the block's f32 weights (4RC each), the search's output
 *             buffers (or its Gram form, 16C², where quant/awq.c chooses it) and the clip search's f64
 *             products; then each linear as for gptq.
 *   rtn       into gguf: the check, then the writer's chunk (16 MiB of f32 and its encoding); --calib adds
 *             the statistics pass (x, the forward, per-slot sums). Into a directory: W, Q and the codes
 *             of one linear (with --calib its XᵀX and H as awq's).
 *   File pages: the mapped source bytes the phase reads and has not released (one linear, or the block's
 *   linears a pass runs unquantized). With --max-memory the activations beyond the budget are counted as
 *   file pages of the spill file instead of anonymous memory.
 *
 * ---- VRAM (--device cuda) -------------------------------------------------------------------------------
 *   kernels/gemm_cuda.cu keeps three device buffers grown to the largest A, B and C of the products it ran
 *   (those of at least LLMQ_GEMM_CUDA_MIN_WORK multiply-adds: the forward's, the XᵀX syrk, the error's
 *   quadratic forms, AWQ's), never shrunk; the GPTQ solve into a directory (minmax grid) adds W, H, the
 *   codes and the grid of one linear while it runs (kernels/gptq_cuda.cu). The CUDA context and the
 *   libraries' own workspaces are not in the figure (a few hundred MiB, device dependent).
 *
 * ---- Disk ----------------------------------------------------------------------------------------------
 *   output      the output's size, in the output's directory (the temporary "<out>.tmp.<pid>" is renamed
 *               onto it; an existing output being replaced stays until then).
 *   spill       with --max-memory, the activations beyond the budget, in common/spill.h's directory.
 *   checkpoint  "<out>.partial/" next to the output, as the resume feature lays it out: every finished
 *               block's outputs (the linears' encoded bytes) plus the next block's input activations (N x D
 *               f32, quant/checkpoint.h); rtn into GGUF: its state.json only (64 KiB are counted), since the
 *               partial output it holds is the output's file before its rename (counted as the output); counted
 *               in the free-space check when the run writes one (plan opts `checkpoint`:
 *               llmq_plan_writes_checkpoint).
 *   Directories on the same file system (st_dev) are summed before comparing with its free space.
 *
 * ---- Time (an estimate) ---------------------------------------------------------------------------------
 *   Stages: check weights (conversion of every linear), calibration pass (rtn --calib into gguf, the type
 *   choice's statistics), block passes (the forward FLOPs and weight conversions of each method's passes),
 *   XᵀX (syrk FLOPs and the f64 accumulation), GPTQ solve (the Cholesky chain 4/3·C³ and the lazy-batch
 *   updates R·C² per linear), AWQ search (n_grid forwards of each scale group, the clip search's f64
 *   products), layer errors (the quadratic forms of err / rtn_err, 2RC² each), round / encode (the
 *   grids' rounding or each GGUF type's encoder), other tensors (embeddings, head, norms converted or
 *   encoded). Rates: f32 and f64 GEMM FLOP/s on n_threads, the model's dtype -> f32 conversion on its own
 *   mapped rows, memory bandwidth, the RTN rounding, each planned GGUF type's encoder (with importance when
 *   the run has one). Not estimated: tokenizing the calibration text, writing to disk (page cache speed is
 *   assumed), GPU speed (a CUDA run's stages are given at the CPU rates).
 *
 * ---- Mixture of experts (mixtral, qwen3_moe, qwen2_moe) -------------------------------------------------
 *   Every expert's gate / up / down is a linear of its own in the output, RAM and time figures. RAM: the experts'
 *   XᵀX sums (E D² for gate / up, E Fe² for down, f64) in the passes that gather them (gptq: group by group; awq:
 *   all at once, through the whole block), the held quantized experts (gptq), the mixture's scratch and one (Fe, D)
 *   expert weight (the expert source), AWQ's per-expert search buffers (no expert copies: quant/awq.h), the mapped
 *   source pages of the experts a pass runs unquantized. Time: the router and K experts per token in the passes (every
 *   expert under --moe-calib all in the statistics passes), the experts' XᵀX over their tokens, AWQ's n_grid mixture
 *   forwards and per-expert searches. Measured on a random 64-expert qwen3_moe (README "Mixture of experts"): the
 *   peak 5-7 % below the measured one for gptq / awq / awq+gptq. The checkpoint holds every expert's linear
 *   as handed over (in the disk figure as a dense block's linears are; no RAM: each is streamed to its file).
 *   qwen2_moe's shared expert is a dense MLP of width n_ff_shexp: its gate / up / down are counted as a dense
 *   block's (all N tokens, their XᵀX sums gathered in the experts' passes and solved after the experts', f32 copies
 *   in AWQ's block and candidates in its gate / up search), its sigmoid gate (1, D) as the router. Measured on a
 *   random 64-expert qwen2_moe (the qwen3_moe model's shapes, a shared expert of width 1024): the peak 5-6 % below
 *   the measured one for gptq (directory, GGUF), 8 % below for awq / awq+gptq.
 */
#ifndef LLMQ_QUANT_PLAN_H
#define LLMQ_QUANT_PLAN_H

#include "calib/model/model.h"
#include "common/status.h"
#include "quant/quantize.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define LLMQ_PLAN_MAX_STAGES 10

struct llmq_plan_stage {
    const char *name; // static string
    double seconds;
};

// Rates measured on this machine at plan time (0: not measured).
struct llmq_plan_rates {
    double sgemm_flops, dgemm_flops; // FLOP/s of f32 / f64 GEMM on n_threads
    double convert_eps;              // elements/s: the model's linear dtype -> f32 (its own mapped rows)
    double mem_bps;                  // bytes/s of a large memcpy
    double rtn_eps;                  // elements/s of llmq_rtn_quantize (the directory formats' rounding)
    double measure_s;                // seconds the measurement took
};

struct llmq_plan {
    int64_t tokens;                          // N (0 without calibration)
    uint64_t output_bytes;                   // the output file / directory
    uint64_t linear_out_bytes;               // of that: the block linears (also the checkpoint's blocks)
    uint64_t ram_anon_bytes, ram_file_bytes; // at the peak phase
    uint64_t ram_peak_bytes;                 // max over phases of anonymous + file pages
    uint64_t ram_anon_max_bytes;             // max over phases of anonymous memory alone
    char ram_phase[64];                      // where the peak is ("blk.1 ffn_down: Hessian")
    uint64_t base_anon_bytes, base_file_bytes;
    bool cuda; // the backend is CUDA: vram_bytes is meaningful
    uint64_t vram_bytes;
    uint64_t spill_bytes;      // beyond --max-memory, in spill_dir
    uint64_t checkpoint_bytes; // "<out>.partial/" at its largest
    bool checkpoint;           // the run writes a checkpoint (counted in the disk check)
    char out_dir[4096], spill_dir[4096], checkpoint_dir[4200];
    const char *out; // o->out_dir (may be NULL for a dry run without --out)
    struct llmq_plan_stage stages[LLMQ_PLAN_MAX_STAGES];
    int n_stages;
    double seconds; // sum of the stages
    bool timed;     // rates measured and stages filled
    struct llmq_plan_rates rates;
    json_t *enc_rates; // {"q4_k": elements/s, ...} of the measured encoders (owned; NULL if none)
};

// Inputs beyond the pipeline's options.
struct llmq_plan_opts {
    bool timed;                // measure the rates and estimate the stages (the dry run); else sizes only
    bool checkpoint;           // the run writes "<out>.partial/" (count it in the disk check)
    const json_t *gguf_report; // to_gguf: a dry run's writer report (tensors with types and bytes), or NULL
                               // (the plan makes its own dry begin of the writer, with the mix's types)
};

// Builds the plan of o on m. LLMQ_OK, or the status of a failed dry begin of the GGUF writer (its line
// logged). p is owned by the caller; free with llmq_plan_free.
enum llmq_status llmq_plan_build(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                 const struct llmq_plan_opts *po, struct llmq_plan *p);
void llmq_plan_free(struct llmq_plan *p); // NULL: no-op

// The plan as text (stdout of --dry-run): sizes, free space at each directory, the stages and their rates.
void llmq_plan_print(const struct llmq_plan *p, FILE *f);
// The plan as a JSON object ("preflight" in the dry run's report): every figure above as a field.
json_t *llmq_plan_json(const struct llmq_plan *p);

// Whether the run o describes keeps "<out>.partial/" (o->checkpoint: every method and format).
bool llmq_plan_writes_checkpoint(const struct llmq_quantize_opts *o);

// The free-space check (statvfs) of the output's, the spill and (when written) the checkpoint directory,
// summed per file system: LLMQ_OK, or LLMQ_ERR_IO after one line naming the directory, what goes there,
// the bytes needed and the bytes free. A directory that does not exist (yet) is not checked here (the
// writer reports it).
enum llmq_status llmq_plan_check_disk(const struct llmq_plan *p);

// Both for a real run: the sizes-only plan of o on m, then llmq_plan_check_disk. Warns (does not refuse)
// when the planned peak RAM exceeds the machine's physical memory.
enum llmq_status llmq_plan_preflight(const struct llmq_model *m, const struct llmq_quantize_opts *o);

#endif // LLMQ_QUANT_PLAN_H
