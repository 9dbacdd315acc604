/*
 * quant/awq.h — activation-aware weight quantization (AWQ, Lin et al. 2023) exactly as AutoAWQ
 * does it (awq/quantize/quantizer.py; Lin et al. 2023, "AWQ"): per decoder block, a search of per-channel
 * scales over n_grid ratios with duo scaling, the scales folded into the preceding op, then a
 * search of per-(row, group) clipping thresholds on the scaled weights. It produces the scaled and
 * clipped f32 weights of one block; turning them into integer codes (RTN with the AWQ grid, or
 * GPTQ for --method awq+gptq) and writing them is the driver's job (quant/quantize.h).
 *
 * What it is not: no calibration (calib/calib.h supplies the block's fp input), no packing
 * (quant/export.h), no error propagation: the block input must come from the full-precision model.
 *
 * Legend: R rows = out_features, C cols = in_features, G group size, N tokens (n_seq * seqlen),
 *         D n_embd, F n_ff, Dq = H*Dh, Dkv = Hkv*Dh, NG = C / G quant groups per row.
 *
 * ---- The algorithm (names as in AutoAWQ) -----------------------------------------------------
 * Scale groups (get_layers_for_scaling, llama/mistral/qwen2):
 *   attn_norm -> [q, k, v]   inspected module: attention (output = o_proj output, llmq_forward_attn)
 *   v         -> [o]         only when v and o have the same shape (no GQA); inspected: o itself
 *   ffn_norm  -> [gate, up]  inspected module: the MLP (output = down_proj output, llmq_forward_mlp)
 *   up        -> [down]      inspected: down itself
 * _search_best_scale, for every group, all on the ORIGINAL weights and inputs:
 *   x_mean[c] = mean_t |x[t, c]|                         (x = the group's input, N tokens)
 *   w_mean[c] = mean over the rows of all the group's linears of |W[r, c]| / (max_{c' in group g(c)}
 *               |W[r, c']| + 1e-6)                      (normalised by each quant group's abs-max)
 *   for ratio = i / n_grid, i = 0..n_grid-1:
 *       s = clamp(x_mean^ratio / (w_mean^(1-ratio) + 1e-4), min 1e-4)   (duo scaling; else x_mean^ratio)
 *       s = s / sqrt(max(s) * min(s));  inf/nan -> 1
 *       W <- Q(W * s) / s for each linear of the group (columns scaled; Q = pseudo-quantize below)
 *       loss = mean((module_fp(x) - module_W(x))^2)   (sum in double)
 *   When the inspected module is the group's one linear (v->o, up->down), that loss is the quadratic
 *   form Σ_r ΔW[r]·(XᵀX)·ΔW[r]ᵀ / (N·R), ΔW = W' - W: llmq evaluates it so (gram_loss) when that is
 *   cheaper — C·C·N/2 once plus R·C·C per ratio instead of R·C·N per ratio, e.g. 13x fewer flops for
 *   SmolLM2's down_proj at 128 x 512 tokens. Same value up to float rounding (XᵀX summed in f64 over
 *   micro-batches, rounded to f32; tests/unit/test_awq.c checks both forms pick the same ratios).
 *   keep the first ratio with the strictly smallest loss.
 * apply_scale: prev op /= s (norm weight, or the LAST C rows of v / up and their bias), every
 *   linear of the group: W[:, c] *= s[c]; the cached inputs x[:, c] /= s[c].
 * _search_best_clip, for every linear except q and k, on the scaled W and the scaled input:
 *   tokens t = 0, step, 2*step, ... with step = max(1, N / n_sample_token) (AutoAWQ's sampling:
 *   this is up to 2*n_sample_token - 1 tokens, not at most n_sample_token); inputs in f32, the dot
 *   products and errors in double;
 *   per (row r, group g): org_max = max|W[r, g]|; for i = 0 .. max_shrink*n_grid - 1:
 *       max_val = org_max * (1 - i/n_grid);  w' = Q(clamp(W[r, g], -max_val, max_val))
 *       err = mean_t (x[t, g] . w' - x[t, g] . W[r, g])^2    (dot products over the group; double)
 *   best = the first i with the strictly smallest err (start: err 1e9, best = org_max).
 * apply_clip: W[r, g] = clamp(W[r, g], -best, best).
 * Q is pluggable (llmq_awq_opts.fake_quant, e.g. a GGUF block type's encoder + decoder, with a group
 * size per linear, lin_group_size); the default is AutoAWQ's:
 * Q (pseudo_quantize_tensor, zero point): per (row, group) of G columns, in fp32:
 *   scale = clamp(max - min, 1e-5) / maxq; zero = clamp(-round(min / scale), 0, maxq);
 *   w' = (clamp(round(w / scale) + zero, 0, maxq) - zero) * scale     (quant/quantizer.h
 *   llmq_quant_params_awq; round = half to even).
 *
 * ---- Weights, views, and the model ------------------------------------------------------------
 * Model weights are const views into a mapped file, and the model is never changed: the search works on
 * a struct llmq_awq_block that OWNS f32 copies of the block's 7 linears, 2 norms and (qwen2) q/k/v biases,
 * and its weight set b->ly (the model's block with those views on the copies; q/k norms, post norms the
 * model's; a moe block's router copied too, its experts not: see "Mixture of experts"). The forward pass
 * (calib/model/forward.h) runs b->ly; after the search
 * it holds the scaled, folded and clipped weights, which the driver hands to the solvers and the writer
 * (quant/quantize.h, quant/writer.h llmq_qwriter_put_block).
 *
 * ---- Mixture of experts (mixtral, qwen3_moe, qwen2_moe) ------------------------------------------
 * The post-attention norm feeds the router and every expert, so it is one scale group over all experts' gate and
 * up (AutoAWQ's Mixtral get_layers_for_scaling: prev_op post_attention_layernorm, layers = every expert's w1 / w3,
 * module2inspect the sparse MoE block): x_mean over all N tokens of the ffn input, w_mean over the rows of all
 * 2E linears, loss = mse of the mixture's output (llmq_forward_mlp, the router's choices fixed by its unchanged
 * input). After the search ffn_norm /= s and the ROUTER's columns *= s as well (it stays full precision), so its
 * logits are those of the unscaled model up to rounding and the routing does not move. Each expert x: up_x ->
 * down_x on the rows the router sends to x (their SiLU(gate) * up), loss = mse of down_x's output; an expert no
 * token reaches keeps s = 1 (no group). The clip search runs on every expert's gate / up / down with its own
 * routed (scaled) inputs. The attention's groups are unchanged.
 * The experts are not copied: an expert's f32 weights exist only while it is used. The gate / up scale search
 * makes each candidate inside the mixture's pass, expert by expert, from the model's weights
 * (llmq_forward_set_expert_source); then ONE pass of the mixture with the original weights runs each expert's
 * up -> down search and its clip search from the expert hook, on that expert's routed inputs (the sampled rows
 * kept for the clip), so no expert's inputs outlive its turn. What stays per expert is its scales and its clip
 * tables ((R, NG) per linear); llmq_awq_expert_weight makes the scaled and clipped weights from the model's again
 * when the driver quantizes the expert (the same float operations, so the same bits as applying them in place).
 * qwen2_moe (its shared expert: formats/llama/arch.h): the post-attention norm feeds the router, the shared expert's
 * sigmoid gate (ffn_gate_inp_shexp), every expert's gate / up and the shared expert's gate / up, so its one scale s
 * must be carried by all of them: the search's group is every expert's gate / up plus the shared expert's (as
 * AutoAWQ's Qwen2MoE grouping: experts' gate_proj / up_proj + shared_expert.gate_proj / up_proj, module2inspect the
 * sparse MoE block; w_mean over all their rows, loss = mse of the whole block MLP, the gated shared output
 * included), and after it ffn_norm /= s while the router's AND the shared gate's columns *= s (both stay full
 * precision, so the routing and the sigmoid gate are those of the unscaled model up to rounding; AutoAWQ leaves
 * both unscaled, which moves them). The shared expert's up -> down is an ordinary group (the dense one, on all N
 * tokens); it is searched and applied before the experts' search, whose shared gate / up candidates thus carry up's
 * row scaling already (a per-row factor, which the group quantizers reproduce up to rounding). The clip search
 * covers the shared expert's gate / up / down on its (scaled) all-token inputs. The shared expert is a dense MLP:
 * the block holds f32 copies of its weights (w[GATE / UP / DOWN]), as of a dense block's.
 *
 * Memory of llmq_awq_search (f32): the block copies (its dense weights once; a moe block: the router, and of the
 * experts three (Fe, D) weights, the clip tables and (2 n_sample_token, D + Fe) sampled rows), plus for N tokens the
 * captured inputs n1 (N, D), o input (N, Dq), n2 (N, D), down input (N, F), and five (N, D) buffers
 * (block output scratch, fp attention / MLP / down outputs, one candidate output); three candidate
 * weight buffers of the largest linear; for the clip search the sampled inputs (T, max(D, F, Dq))
 * and, in double, (T, 256 * (1 + K)) group outputs. The forward object must accept N tokens.
 *
 * Cost: the scale search is n_grid x (attention + MLP + down_proj forwards) — about 20-25 block
 * forwards — and runs at that floor (the matmuls are the forward's threaded sgemms or one
 * multi-threaded cblas_sgemm per candidate; quantizing candidates and the loss are < 5%); the clip
 * search is ~11 x 2 x T x (weights of v, o, gate, up, down) flops in dgemm, independent of N.
 * The scale search grows linearly with N; a driver that wants it cheaper passes fewer sequences in x
 * (timings per block: bench/awq_speed.c, figures in bench/README.md).
 *
 * Group sizes that do not tile (e.g. stories260K's 172-wide ffn_down with G = 64; AutoAWQ would
 * fail): the linears with that C are searched with one group per row (G = C) for w_mean, the
 * candidates and the clip table (clip_groups = 1), with a warning. Whether such a layer may be
 * quantized at all (--fallback) is the driver's decision; the search itself does not refuse.
 *
 * Errors: LLMQ_ERR_ARG (bad options, a second search on the same block), LLMQ_ERR_NUMERIC (NaN/Inf
 * in the input or a loss, naming layer and group), LLMQ_ERR_NOMEM, and whatever the forward pass
 * returns. Each is logged once. On failure the block's weights are unspecified (free it).
 */
#ifndef LLMQ_QUANT_AWQ_H
#define LLMQ_QUANT_AWQ_H

#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stdint.h>

#define LLMQ_AWQ_MAX_GROUPS 4

// The search's quantize-dequantize step ("Q" above), pluggable: out = Q(w) for `rows` rows of linear
// `lin` of block `layer`, columns [c0, c0 + n) of each; w and out are (rows, n) row-major, n a whole
// number of that linear's groups. The search calls it once per scale candidate on the whole matrix
// (rows = R, c0 = 0, n = C) and once per clip candidate on one group of a chunk of rows (n = G).
// w are SCALED weights W[r, c] * s[c]; s (C) are the input scales they carry (the candidate's during
// the scale search, the chosen ones during the clip search; NULL = none), so that a quantizer that
// weights columns by input statistics can divide them by s². w and out do not overlap. Called from
// the searching thread only (it may use threads of its own).
// A moe block's experts' gate / up / down reach it (and lin_group_size) as LLMQ_AWQ_EXPERT_LIN(GATE / UP / DOWN) =
// LLMQ_LIN_COUNT + 0 / 1 / 2, not as the dense values, which qwen2_moe's shared expert keeps (its types differ).
typedef void (*llmq_awq_fake_quant_fn)(void *user, int layer, enum llmq_linear lin, int64_t rows, int64_t c0, int64_t n,
                                       const float *s, const float *w, float *out);
#define LLMQ_AWQ_EXPERT_LIN(l) ((enum llmq_linear)(LLMQ_LIN_COUNT + ((l)-LLMQ_LIN_GATE)))
#define LLMQ_AWQ_N_LIN (LLMQ_LIN_COUNT + 3) // the values fake_quant and lin_group_size take

struct llmq_awq_opts {
    int bits;                  // 4 (2..8); the search always uses the zero-point (asym) grid, as AutoAWQ's
                               // default zero_point=True (zero_point=False is not implemented)
    int group_size;            // 128 (AutoAWQ's default; 64 for SmolLM2); -1 = one group per row
    int n_grid;                // 20 scale ratios i / n_grid, i = 0..n_grid-1 (1..1000)
    bool duo_scaling;          // true: x_mean^a / (w_mean^(1-a) + 1e-4); false: llm-awq's x_mean^a
    bool clip;                 // true: run the clip search (AutoAWQ apply_clip)
    int clip_n_grid;           // 20
    float max_shrink;          // 0.5: candidates 1 - i/clip_n_grid for i < max_shrink * clip_n_grid
    int64_t n_sample_token;    // 512 (see the sampling note above)
    int gram_loss;             // single-linear groups (v->o, up->down): the loss as tr(ΔW·XᵀX·ΔWᵀ) / (N·R)
                               // instead of from the candidate's output: -1 auto (when it costs fewer
                               // flops, i.e. N well above C; the default), 0 never, 1 always (tests)
    int n_threads;             // reserved: today the work is all in the forward object's threads and
                               // in BLAS (OpenBLAS's own thread setting)
    enum llmq_backend backend; // the search's own products (o / down candidates, the clip dgemm) go
                               // through kernels/gemm.h on it; CPU by default. The forward object's
                               // backend (llmq_forward_set_backend) covers the attention / MLP passes:
                               // set both alike, or the fp and candidate outputs differ in rounding.
    // Another quantizer than AutoAWQ's grid (NULL: the grid above with bits / group_size, the
    // default). quant/quantize.c plugs in "encode to the linear's GGUF block type and decode".
    llmq_awq_fake_quant_fn fake_quant;
    void *fake_quant_user;
    // Per-linear group size (> 0 and tiling the linear's C: used instead of group_size for that
    // linear's w_mean, candidates and clip table; e.g. the GGUF block size of its type). 0: group_size.
    int lin_group_size[LLMQ_AWQ_N_LIN]; // the experts' at LLMQ_AWQ_EXPERT_LIN
};

// AutoAWQ's defaults above (group_size 128, bits 4).
void llmq_awq_opts_default(struct llmq_awq_opts *o);

// The op whose output channels absorb 1/s.
enum llmq_awq_prev { LLMQ_AWQ_PREV_ATTN_NORM, LLMQ_AWQ_PREV_V, LLMQ_AWQ_PREV_FFN_NORM, LLMQ_AWQ_PREV_UP };

// One scale group and its search result.
struct llmq_awq_group {
    enum llmq_awq_prev prev;
    int n_lin;               // 1..3 linears that share the input
    enum llmq_linear lin[3]; // e.g. {Q, K, V}
    int64_t C;               // channels (the linears' C)
    int best;                // chosen grid index; ratio = best / n_grid
    float ratio;
    double *loss;  // (n_grid) loss of every ratio (owned)
    float *scales; // (C) chosen s (owned); the linears' columns were multiplied by it
};

struct llmq_awq_block {
    const struct llmq_model *m; // not owned; must outlive the block
    int layer;
    int64_t D, F, Dq, Dkv;
    float *w[LLMQ_LIN_COUNT]; // (R, C) f32 copies: original, then scaled (search), then clipped
    float *attn_norm;         // (D)
    float *ffn_norm;          // (D)
    float *bias[3];           // (Dq), (Dkv), (Dkv) q, k, v biases; NULL unless the model has them
    int n_groups;             // scale groups found (3 without v->o, 4 with it)
    struct llmq_awq_group groups[LLMQ_AWQ_MAX_GROUPS];
    int64_t clip_groups[LLMQ_LIN_COUNT]; // NG of each linear's clip table (0 when none)
    float *clip[LLMQ_LIN_COUNT];         // (R, NG) chosen max|w| per (row, group); NULL for q, k,
                                         // and when the clip search is off
    double clip_err[LLMQ_LIN_COUNT];     // sum over (row, group) of the chosen clip error (0 if none)
    double seconds_scale, seconds_clip;  // wall time of the two searches

    // The block's weight set: m->layers[layer] with w, attn_norm, ffn_norm and bq / bk / bv on F32 views of
    // the copies above (vw, vattn_norm, vffn_norm, vbias). Valid until llmq_awq_block_free.
    struct llmq_layer ly;
    struct llmq_tensor_view vw[LLMQ_LIN_COUNT], vattn_norm, vffn_norm, vbias[3];

    // A moe block (see "Mixture of experts"): w[GATE], w[UP], w[DOWN] are NULL (qwen2_moe: its shared expert's); an
    // f32 copy of the router on a view in ly (router); ly.exps are the model's experts (never copied:
    // llmq_awq_expert_weight).
    int64_t E, Fe;
    int n_threads;                   // the conversions of the model's experts
    float *router;                   // (E, D)
    struct llmq_tensor_view vrouter; // view on it
    float *s_ffn;                    // (D) ffn_norm -> every expert's gate and up; NULL before the search
    float **s_down;                  // (E) up_x -> down_x; NULL for an expert no token was routed to
    float ratio_ffn;                 // the ffn_norm group's chosen ratio
    float **eclip;                   // (3E) expert x's clip tables (R, C / eclip_g) of gate, up, down; NULL: unclipped
    int64_t eclip_g[3];              // their group sizes (gate, up, down)
    // qwen2_moe: w[GATE], w[UP], w[DOWN] are the shared expert's (F its width); its gate ffn_gate_inp_shexp:
    float *shg;                   // (D) f32 copy, its columns scaled by s_ffn as the router's
    struct llmq_tensor_view vshg; // (1, D) view on it: ly.shexp_gate
};

// Copies block `layer` of m to f32 (any weight dtype llmq_model_weight_f32 reads) into a new block.
// *out must be released with llmq_awq_block_free. LLMQ_ERR_ARG for a layer out of range.
enum llmq_status llmq_awq_block_init(const struct llmq_model *m, int layer, int n_threads, struct llmq_awq_block **out);
// NULL is a no-op.
void llmq_awq_block_free(struct llmq_awq_block *b);

// The whole AWQ step for block b->layer: scale search on the ORIGINAL copies (b must be fresh from
// llmq_awq_block_init), apply_scale (the copies now hold the scaled weights and folded norms /
// v / up rows), then, if o->clip, the clip search and apply_clip on the copies. x (N, D),
// N = n_seq * seqlen, is the block's full-precision input (not modified). f is a forward object
// of b->m (max_tokens >= N). Results: b->groups, b->clip, b->clip_err, timings; one log line per
// scale group (ratio, loss at ratio 0 and at the chosen ratio) and per clipped linear.
enum llmq_status llmq_awq_search(struct llmq_awq_block *b, struct llmq_forward *f, const float *x, int64_t n_seq,
                                 int64_t seqlen, const struct llmq_awq_opts *o);

// ---- On the block path (quant/quantize.h "Decoder blocks"; calib/blocks.h "AWQ's scale search")
// ---------------------- The same search with the candidates' losses computed where the blocks compute (a CUDA device,
// or the CPU hook), the block's full-precision input resident there: the caller has run calib/blocks.h
// llmq_blocks_awq_fp over block b->layer (its fp attention and MLP outputs kept there, the sums of the four inputs
// taken) with step = llmq_awq_sample_step(N, o), and passes each input's Σ|x| (sum_abs[g], C_g; x_mean = Σ|x| / N,
// compute_x_mean's bits) and its sampled rows (rows[g], (T, C_g), T = ceil(N / step): the clip search's tokens,
// unscaled).
//   attn_norm -> [q, k, v], ffn_norm -> [gate, up]: each ratio's candidates made there from the saved originals
//       (AutoAWQ's grid: kernels/ops.h llmq_ops_awq_candidate; a plugged-in fake_quant: made on the host and
//       uploaded), the half's output over every micro-batch compared with the fp one (llmq_blocks_awq_loss);
//   v -> [o], up -> [down]: ALWAYS the Gram form (gram_loss = 1 whatever o->gram_loss says: the block keeps XᵀX of
//       their inputs, not the inputs), Δ made there (llmq_blocks_awq_gram_loss);
//   apply_scale on the host; the clip search from the samples: with o->backend CUDA (and no plugged-in fake_quant)
//       as one device call per linear (kernels/awq_clip.h: the candidates and each group's error as a quadratic form
//       on its Gram matrix, cuBLAS DGEMMs), else as above (the test hook LLMQ_AWQ_CLIP=gram runs the Gram form on
//       the CPU: tests/py/test_quantize_blocks.py test_awq_clip_gram_hook).
// The CPU hook gives the same bits as llmq_awq_search at one thread when that search takes the Gram form too (N well
// above C, its default rule) and every micro-batch is a multiple of LLMQ_GRAM_MICRO_BATCH tokens (the Gram sums are
// then summed in the same batches); tests/py/test_quantize_blocks.py checks it. Not a mixture of experts
// (LLMQ_ERR_UNSUPPORTED; calib/model/devblock.h keeps those on forward.c). A plugged-in quantizer's clip candidates are
// made on the host. NONE of this has RUN ON A GPU yet (issue 17).
int64_t llmq_awq_sample_step(int64_t N, const struct llmq_awq_opts *o); // max(1, N / n_sample_token)
struct llmq_blocks;
enum llmq_status llmq_awq_search_blocks(struct llmq_awq_block *b, struct llmq_blocks *qb, int64_t n_seq, int64_t seqlen,
                                        const double *const sum_abs[4], const float *const rows[4],
                                        const struct llmq_awq_opts *o);

// The per-column scale applied to linear `lin` of b (its input was divided by it): the (C) scales of
// the group that contains lin, or NULL when lin is in no group (o under GQA) or before the search.
// For awq+gptq: the Hessian of the scaled layer is H'[i, j] = H[i, j] / (s[i] * s[j]) where H is
// built from the unscaled input; llmq_awq_scale_hessian does that in place on H (C, C).
const float *llmq_awq_input_scales(const struct llmq_awq_block *b, enum llmq_linear lin);
// A moe block's expert `expert`'s linear lin (GATE, UP: s_ffn; DOWN: s_down[expert]): its input scales, or NULL.
const float *llmq_awq_expert_input_scales(const struct llmq_awq_block *b, enum llmq_linear lin, int64_t expert);
// dst (R, C) := expert `expert`'s linear lin (GATE, UP, DOWN) after the search: the model's weights in f32, scaled
// (columns by its input scales; up's rows by 1 / s_down) and clipped by its clip table. Errors: the conversion's.
enum llmq_status llmq_awq_expert_weight(const struct llmq_awq_block *b, enum llmq_linear lin, int64_t expert,
                                        float *dst);
void llmq_awq_scale_hessian(const struct llmq_awq_block *b, enum llmq_linear lin, float *H /* (C, C) */);

// AutoAWQ's pseudo_quantize_tensor (zero point) on W (R, C) with G = group_size (-1, or a size
// that does not tile C: G = C, as the search): Wq (R, C) = dequantized fake-quant weights. Wq may
// equal W.
void llmq_awq_pseudo_quantize(const float *W, int64_t R, int64_t C, int bits, int group_size, float *Wq);

#endif // LLMQ_QUANT_AWQ_H
