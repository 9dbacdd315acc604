/*
 * quant/gguf_choose.h — the type of every tensor of a GGUF chosen from the weights themselves: `--mix quality`
 * (the lowest-error type of no larger size) and `--target-bpw` / `--target-size` (one type per tensor under a
 * size budget, minimising the sum of the predicted errors).
 *
 * What it is: a refinement of a plan of quant/gguf_mix.h (llama-quantize's types): each tensor the caller
 * marks free gets another block type when the rule below says so. The errors come from encoding a sample of
 * the tensor's rows with every candidate type (formats/ggml/encode.h, with the tensor's importance, exactly as
 * the file would be encoded by --method rtn) and decoding them. What it is not: no mix rules (gguf_mix.h), no
 * file writing (gguf_export.h, which calls this from its begin when its opts ask for a choice).
 *
 * Legend: R rows, C row length (GGUF ne[0]), n sampled rows, T tensors, K candidate types.
 *
 * ---- The error of a tensor in a type ----------------------------------------------------------------------
 *   err(t, τ) = R / n · Σ_{sampled rows r} Σ_c imp_c · (W_rc − Q_rc)²
 *   with Q the decoding of the rows encoded in τ with importance imp (the same importance the file is encoded
 *   with), imp = 1 without importance. With llama.cpp's imatrix importance (imp_c = mean x_c² of the linear's
 *   input) this is the diagonal approximation of E‖(W − Q) x‖² over the calibration tokens: the output error
 *   energy per token, the quantity llama.cpp's own encoders minimise block by block. Rows are sampled with the
 *   stride ceil(R / 2048) (rows 0, s, 2s, ...: every row for R ≤ 2048); deterministic.
 *   Candidates: the block types llmq writes whose block tiles C: Q2_K, Q3_K, IQ4_XS, Q4_0, IQ4_NL, Q4_K, Q4_1,
 *   Q5_0, Q5_K, Q5_1, Q6_K, Q8_0 (F16 / BF16 / F32 never: a tensor no block tiles keeps the mix's type),
 *   less those in `exclude` (the mix's own type always stays a candidate). Why exclude one: a model that was
 *   dequantized from a block type (SmolLM2's test base is the f32 decoding of a Q4_1 file) is reproduced
 *   exactly by that type, which then wins every comparison it may enter without saying anything about
 *   other weights.
 *
 * ---- Downgrades: a type smaller than the mix's ------------------------------------------------------------------
 *   For a candidate τ whose row takes fewer bytes than the mix's type τ_mix, the choice uses
 *     err(t, τ) = max( err_imp(t, τ),  err_1(t, τ) · err_imp(t, τ_mix) / err_1(t, τ_mix) )
 *   where err_imp is the error above and err_1 the same sum with imp = 1 (the calibration-free error), both over the
 *   same decoded rows (nothing changes when err_1(t, τ_mix) = 0, or without importance, where both are one sum).
 *   So a smaller type replaces the mix's (QUALITY) only when it is better by both measures, and the allocation
 *   (TARGET) prices a downgrade at the larger of the two estimates. Same-size and larger candidates use err_imp.
 *   Why: llama.cpp's encoders fit each block to the importance, and an importance with "massive activation"
 *   channels (mean x² of one input column 10⁵–10⁶ × the median: SmolLM2's blk.11 and blk.28 ffn_down, whose
 *   column 1229 / 678 carry 89% / 73% of Q3_K's err_imp) lets a 2-bit encoding that spends its scale on that one
 *   column beat a 3-bit one by err_imp (97 vs 3694 for blk.11, llmq calib 128 × 512 importance) while being ~4×
 *   worse on every other column. Those channels peak on a few tokens (attention sinks), which the diagonal
 *   approximation weighs by their mean x² alone; measured at the full protocol (bench/README.md "gguf_choice at
 *   the full protocol"), taking those two downgrades cost Q2_K's perplexity. The guard costs one more sum per
 *   decoded row.
 *
 * ---- Experts (a mixture of experts' stacked ffn_{gate,up,down}_exps) ------------------------------------------
 *   One tensor of the choice, so all its experts get one type (llama.cpp's fused MoE kernels take one type per
 *   stacked tensor). Its rows are the experts' rows one after another; the sampled rows of expert x are encoded and
 *   weighted with expert x's importance (part_importance, mean x² over the tokens routed to x), so
 *   err(t, τ) = Σ_x err(expert x, τ): each expert's output error energy per token that reaches it, summed over the
 *   experts. Not scaled by the share of tokens each expert receives (the router's weights are not in it either):
 *   beside a dense linear, whose err is per token of the whole calibration, an expert tensor's err weighs each
 *   expert as if every token reached it.
 *
 * ---- QUALITY (--mix quality) -------------------------------------------------------------------------------
 *   Each free tensor gets, among the candidates whose row takes no more bytes than the mix's type, the one
 *   with the lowest err (a smaller candidate's err guarded as in "Downgrades"; ties keep the mix's type, then the
 *   smaller type, then the order above). So the file is never larger than the mix's, and every tensor's predicted
 *   error is no larger than the mix's. Example:
 *   SmolLM2's 576-wide rows, which 256-blocks do not tile: the mix's Q4_0 fallback of Q3_K_M competes with
 *   IQ4_NL (the same 4.5 bits per weight).
 *
 * ---- TARGET (--target-bpw / --target-size) -------------------------------------------------------------------
 *   The tensors marked `allocate` share the budget: target_bytes minus the bytes of every other tensor (those
 *   get the QUALITY choice when free, else keep their type). Minimise Σ_t err(t, τ_t) (MEASURED: Σ_t pred(t, τ_t),
 *   see "Sensitivity"; err below stands for what is minimised) subject to
 *   Σ_t bytes(t, τ_t) ≤ budget over one candidate per tensor (a multiple-choice knapsack), solved as:
 *     1. dynamic programming over the budget in units of u = floor(budget / 2^17) + 1 bytes, every candidate's
 *        bytes rounded UP to whole units (so the result fits; it is optimal up to that rounding, which can
 *        cost at most T·u bytes of the budget, about T / 2^17 of it; exact for budgets below 2^17 bytes);
 *        ties keep the earlier candidate of the list above;
 *     2. greedy fill of what the rounding left: while an upgrade of one tensor to a larger candidate with a
 *        lower err fits, take the one with the largest err decrease per added byte.
 *   Cost: T·K·2^17 steps and T·2^17 bytes of choices (SmolLM2: 210 linears, about 0.3 s and 28 MB).
 *   The caller decides which tensors take part (quant/gguf_export.h: the block linears; token_embd / output,
 *   whose errors are in other units, keep the QUALITY choice at the mix's size).
 *   Errors: a budget below the smallest allocation (every allocated tensor in its smallest candidate) is
 *   LLMQ_ERR_ARG with the smallest reachable bits per weight in the message (llmq_gguf_choose_range gives
 *   both ends without encoding anything).
 *
 * ---- Sensitivity: the errors in KLD units (opts.sensitivity) ----------------------------------------------
 *   UNIFORM: every allocated tensor's err counts with weight 1 (the output error energy per token of every
 *   block linear treated as equally harmful to the model's output). Measured to be wrong at Q2_K
 *   (bench/README.md "gguf_choice": a fifth of quality's predicted err, a higher KLD).
 *   MEASURED: the caller gives each allocated tensor kld_ref = the mean KLD of the model's output when t alone
 *   is quantized in the mix's type τ_mix (quant/gguf_sens.h, on calibration windows). Then
 *     pred(t, τ) = g_t · err(t, τ),   g_t = kld_ref(t) / err(t, τ_mix)     (KLD per unit of err)
 *   and TARGET minimises Σ_t pred(t, τ_t) instead of Σ_t err(t, τ_t) (the same knapsack, the same fill).
 *   Why this form: for a small error δ = (W − Q) x of one linear's output the KLD is second order in δ,
 *   KLD ≈ ½ E[δᵀ F δ] (F the Fisher information of the output distribution with respect to that output), as
 *   err is (Σ imp (W − Q)² is the diagonal approximation of E‖δ‖²); with the error's direction statistics
 *   the same for every type of the tensor, KLD(t, τ) / err(t, τ) does not depend on τ, and one measurement
 *   per tensor gives its slope. Errors of different tensors are independent roundings: the cross terms
 *   E[δ_aᵀ F δ_b] vanish to first order, so the KLDs add: the predicted KLD of the whole choice is
 *   Σ_t pred(t, τ_t) over the allocated tensors (the other tensors, token_embd / output, are not measured and
 *   not in it). Both assumptions are approximations; bench/README.md reports the prediction against the
 *   measured KLD of the files.
 *   A tensor whose kld_ref or err(t, τ_mix) is not positive and finite (a type that rebuilds it exactly)
 *   gets the smallest positive g of the others (so its error still costs something); if no tensor has one,
 *   LLMQ_ERR_NUMERIC. QUALITY's choice does not change with MEASURED (each tensor's lowest err is its lowest
 *   pred), only the report gets the predicted KLD.
 *   Which one by default: `llmq quantize --sensitivity auto` (the CLI's default) is MEASURED for a size target
 *   with --calib and UNIFORM otherwise (the struct's zero value here is UNIFORM). Chosen by measurement
 *   (bench/README.md "gguf_choice", SmolLM2 at the size of llama.cpp's Q2_K and Q3_K_M files): MEASURED gave
 *   mean KLD 0.143 / 0.038 where UNIFORM gave 0.217 / 0.055 and llama.cpp's mix 0.262 / 0.083. Its cost is
 *   the measurement (quant/gguf_sens.h "Cost"): on SmolLM2 ~10 CPU-minutes, about 5× the rest of the choice.
 *
 * ---- Determinism, cost -------------------------------------------------------------------------------------
 *   The result does not depend on n_threads (the encoders' bytes do not, the sums run in row order). Cost: one
 *   encoding of at most 2048 rows per tensor and candidate (QUALITY: only the candidates no larger than the
 *   mix's type; SmolLM2-135M at Q3_K_M: 41 s for llama-quantize's mix, 553 s with --mix quality on the 2
 *   shared, heavily loaded cores of the measurement, before that restriction).
 *   Memory: one tensor's sampled rows in f32, their encoding and decoding.
 */
#ifndef LLMQ_QUANT_GGUF_CHOOSE_H
#define LLMQ_QUANT_GGUF_CHOOSE_H

#include "common/dtype.h"
#include "common/status.h"

#include <stdbool.h>
#include <stdint.h>

enum llmq_gguf_choice_mode {
    LLMQ_GGUF_CHOICE_MIX,     // the mix's types unchanged (llama-quantize's; the default)
    LLMQ_GGUF_CHOICE_QUALITY, // --mix quality
    LLMQ_GGUF_CHOICE_TARGET,  // --target-bpw / --target-size
};

enum llmq_gguf_sensitivity {
    LLMQ_GGUF_SENS_UNIFORM,  // every allocated tensor's err with weight 1
    LLMQ_GGUF_SENS_MEASURED, // err scaled to KLD by each tensor's measured kld_ref (see "Sensitivity")
};

struct llmq_gguf_choose_opts {
    enum llmq_gguf_choice_mode mode;
    enum llmq_gguf_sensitivity sensitivity;
    uint64_t target_bytes; // TARGET: the budget of every tensor's data (the caller turns a bpw into bytes)
    int64_t params;        // every tensor's element count (for the bits per weight in messages)
    uint64_t exclude;      // candidates left out: bit t for type t (1ull << LLMQ_DTYPE_Q4_1, ...); 0 = none
    int n_threads;         // encoder threads (>= 1)
};

// One tensor of the plan (the caller's array, file order).
struct llmq_gguf_choose_tensor {
    const char *name;
    int64_t R, C;            // rows, row length
    enum llmq_dtype type;    // in: the mix's type; out: the chosen type
    bool is_free;            // the type may change (a quantized tensor whose type the mix rules chose)
    bool allocate;           // TARGET: takes part in the budget (implies is_free)
    const float *importance; // (C) or NULL (imp = 1)
    // A stacked expert tensor (E, R / E, C) when part_rows > 0: row r has the importance
    // part_importance[(r / part_rows) * part_stride] ((C) or NULL: imp = 1; importance is not read), each expert's
    // rows encoded with its own (see "Experts").
    float *const *part_importance;
    int64_t part_rows, part_stride;
    double err;      // out: err(t, type) of the chosen type, guarded if smaller than the mix's (free tensors; else 0)
    double err_mix;  // out: err(t, mix's type) (free tensors; 0 otherwise)
    double kld_ref;  // MEASURED, allocated tensors: in: the KLD of t alone in the mix's type
    double pred_kld; // out (MEASURED, allocated tensors): pred(t, type) of the chosen type; else 0
};

// Reads rows 0, stride, 2·stride, ... (n of them) of tensor i as f32 into out (n, C). Returns LLMQ_OK or a
// logged status.
typedef enum llmq_status (*llmq_gguf_choose_rows_fn)(void *user, int64_t i, int64_t stride, int64_t n, float *out);

// Bytes of tensor t in type ty (row bytes × R); 0 when ty does not tile C.
uint64_t llmq_gguf_choose_bytes(const struct llmq_gguf_choose_tensor *t, enum llmq_dtype ty);

// The smallest and largest total bytes a TARGET choice can reach for these tensors (allocated ones in their
// smallest / largest candidate not excluded by o, the others at their current type, for which QUALITY never grows). No
// encoding.
void llmq_gguf_choose_range(const struct llmq_gguf_choose_opts *o, int64_t n, const struct llmq_gguf_choose_tensor *t,
                            uint64_t *min_bytes, uint64_t *max_bytes);

// Applies o->mode to the n tensors t (see above). rows reads a tensor's rows. Logs one info line with the
// totals (bytes, bits per weight, Σ err before and after; MEASURED: Σ pred before (= Σ kld_ref) and after).
// Errors: LLMQ_ERR_NUMERIC (MEASURED without a positive g, see "Sensitivity"), LLMQ_ERR_ARG (a budget below the
// smallest allocation, see "TARGET"), what rows and the encoders return, LLMQ_ERR_NOMEM. On error t[].type is
// unspecified.
enum llmq_status llmq_gguf_choose(const struct llmq_gguf_choose_opts *o, int64_t n, struct llmq_gguf_choose_tensor *t,
                                  llmq_gguf_choose_rows_fn rows, void *user);

#endif // LLMQ_QUANT_GGUF_CHOOSE_H
