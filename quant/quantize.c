/*
 * quant/quantize.c — the `llmq quantize` pipeline (quant/quantize.h documents the contract).
 * Legend: R rows/out, C cols/in, G group size, N calibration tokens, D n_embd.
 */
#include "quant/quantize.h"

#include "calib/blocks.h"
#include "calib/model/forward.h"
#include "common/eta.h"
#include "common/io.h"
#include "common/log.h"
#include "common/spill.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"
#include "kernels/block.h"
#include "kernels/gemm.h"
#include "kernels/gptq.h"
#include "quant/awq.h"
#include "quant/checkpoint.h"
#include "quant/gptq.h"
#include "quant/gptq_gguf.h"
#include "quant/plan.h"
#include "quant/writer.h"

#include <cblas.h>
#include <dirent.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

void openblas_set_num_threads(int n);

const char *llmq_qmethod_name(enum llmq_qmethod m) {
    switch (m) {
    case LLMQ_QMETHOD_RTN: return "rtn";
    case LLMQ_QMETHOD_GPTQ: return "gptq";
    case LLMQ_QMETHOD_AWQ: return "awq";
    case LLMQ_QMETHOD_AWQ_GPTQ: return "awq+gptq";
    }
    return "?";
}

bool llmq_qmethod_parse(const char *s, enum llmq_qmethod *out) {
    for (int i = 0; i <= LLMQ_QMETHOD_AWQ_GPTQ; i++)
        if (strcmp(s, llmq_qmethod_name((enum llmq_qmethod)i)) == 0) {
            *out = (enum llmq_qmethod)i;
            return true;
        }
    return false;
}

struct llmq_quantize_opts llmq_quantize_default_opts(void) {
    struct llmq_quantize_opts o;
    memset(&o, 0, sizeof(o));
    o.method = LLMQ_QMETHOD_RTN;
    o.q = (struct llmq_qconfig){.bits = 4, .group_size = 128, .sym = false};
    o.percdamp = 0.01f;
    o.true_sequential = true;
    o.gptaq_alpha = LLMQ_GPTAQ_ALPHA_DEFAULT;
    o.micro_batch = 8;
    o.n_threads = 1;
    o.calib.nsamples = 128;
    o.moe_token_floor = LLMQ_MOE_TOKEN_FLOOR_DEFAULT;
    o.moe_calib_all = true; // measured: quant/quantize.h "Mixture of experts"
    o.calib.seqlen = 512;
    o.out = llmq_export_default_opts();
    o.gguf = llmq_gguf_export_default_opts();
    return o;
}

static const struct llmq_tensor_view *block_weight(const struct llmq_model *m, int64_t l, int64_t j);

// ---- the run's state -------------------------------------------------------------------------------

// The stages the run's wall time is split into (the "profile" of the report, quant/quantize.h "Profile").
enum stage { S_CALIB, S_UPLOAD, S_PASSES, S_SUMS, S_HESSIAN, S_SEARCH, S_SOLVE, S_WRITE, S_CKPT, S_COUNT };
static const char *const stage_names[S_COUNT] = {"calibration",   "weight_uploads", "block_passes",
                                                 "sums_download", "hessians",       "awq_search",
                                                 "solvers",       "writer",         "checkpoint"};

struct run {
    const struct llmq_model *m; // only read: each block runs on its own weight set (ly)
    const struct llmq_quantize_opts *o;
    struct llmq_qwriter *w;    // the output (quant/writer.h)
    struct llmq_ckpt *ck;      // its checkpoint (quant/checkpoint.h), or NULL
    struct llmq_forward *f;    // micro-batch forward (micro_batch * seqlen tokens)
    struct llmq_forward *fbig; // AWQ: all N tokens
    struct llmq_blocks *qb;    // the block path (calib/blocks.h: x resident where the blocks compute), or NULL
    struct llmq_calib_data d;
    struct llmq_calib_stats s; // statistics of the current block only
    bool have_calib;
    int want_slot;             // hook filter: -1 all, else one slot
    int want_eslot;            // expert hook filter (moe): -1 both, else one LLMQ_CALIB_EXP_* slot, -2 none
    float *x;                  // (N, D) block input (x_q for gptq, x_fp otherwise)
    float *xt;                 // (N, D) scratch copy for the extra passes / AWQ's search input
    float *W;                  // (Rmax, Cmax) the weight handed to a solver
    float *Q;                  // (Rmax, Cmax) dequantized result / RTN comparison
    float *H;                  // (Cmax, Cmax) Hessian given to GPTQ (destroyed)
    float *Hx;                 // (Cmax, Cmax) XᵀX kept for the error
    float *T;                  // (QF_ROWS or, on CUDA, Rmax, Cmax) product scratch of quad_form
    int64_t n_w, n_h, n_t;     // Rmax * Cmax (W, Q), Cmax * Cmax (H, Hx), T's: for release_work
    enum llmq_status gemm_st;  // first failed product of rel_err (it returns NaN then); checked per block
    struct llmq_layer ly;      // the current block's weight set: the model's block, with gptq's quantized
                               // linears on ov as they are done (AWQ runs its own, struct llmq_awq_block.ly)
    float *wq[LLMQ_LIN_COUNT]; // (R, C) dequantized weights of the current block (gptq), decoded from held for
                               // each pass and released after it
    struct held {              // gptq: a quantized linear of the current block as handed to the writer
        bool on;
        enum llmq_qpayload_kind kind;
        enum llmq_dtype type;
        struct llmq_qlinear ql; // CODES
        uint8_t *rows;          // ROWS / F32: the encoded rows
    } held[LLMQ_LIN_COUNT];
    bool hold;                                  // quantize_linear keeps its result in held / exp_held (block_gptq)
    struct llmq_tensor_view ov[LLMQ_LIN_COUNT]; // F32 views on wq
    // moe (see "Mixture of experts" in quant/quantize.h)
    struct held *exp_held; // (3E) gptq: expert x's quantized linears of the current block (3x + gate/up/down),
                           // decoded by expert_source for each product of the block's later passes
    int64_t *under;        // (E) the coverage's experts under the floor
    json_t *moe;           // the coverage report ("moe" in the JSON); NULL for a dense model
    // GPTAQ (o->gptaq): the full-precision stream and the cross terms of the current block
    float *xfp;                           // (N, D) the fp model's block input: r->x + N * D (one allocation, so that
                                          // the checkpoint's activations carry both streams)
    float *fpin;                          // (N, Σ C_slot) the block's fp linear inputs, slot after slot
    float *fpin_slot[LLMQ_CALIB_N_SLOTS]; // slot s's (N, C_s) inside fpin
    int64_t cin[LLMQ_CALIB_N_SLOTS];      // C_s: the input width of each slot (the widest over the blocks)
    double *dxx[LLMQ_CALIB_N_SLOTS];      // (C_s, C_s) Σ ΔXᵀX̃ of the current block, f64
    float *dscr;                          // (LLMQ_GRAM_MICRO_BATCH * Cmax + Cmax * Cmax) ΔX chunk, f32 product
    float *Dcur;                          // (Cmax, Cmax) the D handed to the solver, NULL when there is none
    int64_t tok0;                         // the first token of the micro-batch a hook sees
    // to_gguf only (the targets are ggml types)
    uint8_t *blk;                    // (Rmax, Cmax * 4 bytes) one linear's encoded rows
    float *imp;                      // (Cmax) importance handed to the encoder / solver
    float *simp[LLMQ_CALIB_N_SLOTS]; // (Cmax) AWQ: importance of each block input (mean x² of the fp input)
    float *fq_qw;                    // (Cmax) AWQ search: importance of the scaled input
    float *W0;                       // (Rmax, Cmax) awq, awq+gptq: the original weights, for rtn_orig_err
    const float *awq_s;              // the input scales of the linear quantize_linear gets (AWQ; NULL: none)
    json_t *layers;
    double t0;
    int64_t params_total;
    struct llmq_eta eta;     // over the block loop; work units: cost_data + cost_solve per linear
    bool eta_data_early;     // the method credits cost_data after its block passes, not per report
    double eta_data_weight;  // block passes per linear's data work: 1, AWQ 1 + n_grid (its scale search)
    double eta_other;        // work of the other tensors (embeddings, output head: their elements), which
                             // the writer streams out before block 0's linears; credited at the first report
    double bits_total;       // Σ bits of codes + scales (f16) + zeros
    double stage_s[S_COUNT]; // seconds per stage (the report's "profile")
};

// Adds the seconds since t0 to stage k; returns st (so that a timed call reads st = timed(r, k, t0, call(...))).
static enum llmq_status timed(struct run *r, enum stage k, double t0, enum llmq_status st) {
    r->stage_s[k] += llmq_now_s() - t0;
    return st;
}

// H (C, C) of block l's input slot from the current statistics (calib/calib.h llmq_calib_hessian; take: _take), or on
// the block path from the block's own sums (calib/blocks.h llmq_blocks_hessian: the same bits).
static enum llmq_status hessian(struct run *r, int l, int slot, float *H, bool take) {
    if (r->qb) return llmq_blocks_hessian(r->qb, slot, H); // the block path: from the block's sums (timed there)
    const double t0 = llmq_now_s();
    return timed(r, S_HESSIAN, t0,
                 take ? llmq_calib_hessian_take(&r->s, l, slot, H) : llmq_calib_hessian(&r->s, l, slot, H));
}

// GPTAQ: dxx[slot] += ΔXᵀX̃ of the n tokens xq (n, C) from r->tok0 on, ΔX = their fp inputs - xq.
static enum llmq_status dxx_add(struct run *r, int slot, const float *xq, int64_t n) {
    const int64_t C = r->cin[slot], nb = LLMQ_GRAM_MICRO_BATCH;
    if (r->tok0 + n > r->d.n_seq * r->d.seqlen) return llmq_errorf(LLMQ_ERR_ARG, "quantize: gptaq: token overflow");
    const float *xf = r->fpin_slot[slot] + r->tok0 * C;
    float *dx = r->dscr, *prod = r->dscr + nb * C;
    for (int64_t t0 = 0; t0 < n; t0 += nb) {
        const int64_t m = n - t0 < nb ? n - t0 : nb;
        for (int64_t i = 0; i < m * C; i++) dx[i] = xf[t0 * C + i] - xq[t0 * C + i];
        enum llmq_status st =
            llmq_gemm_f32(r->o->backend, true, false, C, C, m, 1.0f, dx, C, xq + t0 * C, C, 0.0f, prod, C);
        if (st) return st;
        for (int64_t i = 0; i < C * C; i++) r->dxx[slot][i] += (double)prod[i];
    }
    return LLMQ_OK;
}

static void hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    struct run *r = user;
    int slot = llmq_calib_slot_of(which);
    if (r->want_slot == -2 || (r->want_slot >= 0 && slot != r->want_slot)) return;
    llmq_calib_stats_hook(&r->s, layer, which, in, n, n_in);
    if (r->fpin && !r->s.err) r->s.err = dxx_add(r, slot, in, n);
}

// GPTAQ's fp pass: each linear's input into its slot of r->fpin, at the micro-batch's tokens.
static void fp_hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    struct run *r = user;
    int slot = llmq_calib_slot_of(which);
    (void)layer;
    if (r->s.err) return;
    if (n_in != r->cin[slot] || r->tok0 + n > r->d.n_seq * r->d.seqlen) {
        r->s.err = llmq_errorf(LLMQ_ERR_ARG, "quantize: gptaq: unexpected input (%lld x %lld) of slot %d", (long long)n,
                               (long long)n_in, slot);
        return;
    }
    memcpy(r->fpin_slot[slot] + r->tok0 * n_in, in, (size_t)(n * n_in) * sizeof(float));
}

static void expert_hook(void *user, int layer, int expert, enum llmq_linear which, const float *in, int64_t n,
                        int64_t n_in) {
    struct run *r = user;
    int k = which == LLMQ_LIN_DOWN ? LLMQ_CALIB_EXP_DOWN : LLMQ_CALIB_EXP_GATE;
    if (r->want_eslot == -2 || (r->want_eslot >= 0 && r->want_eslot != k)) return;
    llmq_calib_stats_expert_hook(&r->s, layer, expert, which, in, n, n_in);
}

// Runs block l (its weight set r->ly) over buf (N, D) in micro-batches (in place), statistics for want_slot
// (-2: none) and, in a moe block, for the experts' inputs want_eslot (-1 both, -2 none). A pass that gathers the
// experts' gate/up input also counts the routing (s.routed of block l, the coverage report).
static enum llmq_status block_pass_run(struct run *r, int l, float *buf, int want_slot, int want_eslot) {
    int64_t D = r->m->hp.n_embd, mb = r->o->micro_batch, L = r->d.seqlen;
    const bool moe = r->m->hp.moe, routing = moe && (want_eslot == -1 || want_eslot == LLMQ_CALIB_EXP_GATE);
    r->want_slot = want_slot;
    r->want_eslot = moe ? want_eslot : -2;
    llmq_forward_set_moe_calib_all(r->f, r->o->moe_calib_all && moe && want_eslot != -2);
    if (routing) memset(r->s.routed + (int64_t)l * r->s.n_expert, 0, (size_t)r->s.n_expert * sizeof(int64_t));
    for (int64_t s0 = 0; s0 < r->d.n_seq; s0 += mb) {
        int64_t ns = r->d.n_seq - s0 < mb ? r->d.n_seq - s0 : mb;
        r->s.n_seq_hint = ns;
        bool any = want_slot != -2 || r->want_eslot != -2;
        r->tok0 = s0 * L;
        enum llmq_status st = llmq_forward_block(r->f, l, &r->ly, buf + s0 * L * D, ns, L, any ? hook : NULL, r);
        if (!st) st = r->s.err;
        if (st) return st;
        if (routing) llmq_calib_stats_add_routed(&r->s, l, llmq_forward_moe_counts(r->f));
    }
    llmq_calib_stats_finish(&r->s, l);
    llmq_forward_release_scratch(r->f); // not held through the solves that follow
    return LLMQ_OK;
}

static enum llmq_status block_pass(struct run *r, int l, float *buf, int want_slot, int want_eslot) {
    const double t0 = llmq_now_s();
    return timed(r, S_PASSES, t0, block_pass_run(r, l, buf, want_slot, want_eslot));
}

// The statistics of a normed block input without running the whole block (same micro-batches as
// block_pass, same numbers: calib/model/forward.h's sub-block functions reproduce llmq_forward_block bit for bit):
//   ffn == false: RMSNorm(x) * attn_norm, the q/k/v input;
//   ffn == true:  RMSNorm(h) * ffn_norm with h = x + attn(RMSNorm(x) * attn_norm), the gate/up input
//                 (the attention runs with this block's quantized q/k/v/o already in place).
static enum llmq_status norm_pass_run(struct run *r, int l, bool ffn) {
    int64_t D = r->m->hp.n_embd, mb = r->o->micro_batch, L = r->d.seqlen;
    float *a = r->xt, *b = r->xt + mb * L * D; // (mb*L, D) each, inside the (N, D) scratch when it fits
    float *own = NULL, *wn = malloc((size_t)(2 * D) * sizeof(float)); // (2, D) attn_norm, ffn_norm
    enum llmq_status st = wn ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory");
    if (!st && 2 * mb * L > r->d.n_seq * L) {
        own = malloc((size_t)(2 * mb * L * D) * sizeof(float));
        if (!own) st = llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory");
        a = own;
        b = own ? own + mb * L * D : NULL;
    }
    if (!st) st = llmq_model_weight_f32(r->ly.attn_norm, wn, 1);
    if (!st) st = llmq_model_weight_f32(r->ly.ffn_norm, wn + D, 1);
    for (int64_t s0 = 0; !st && s0 < r->d.n_seq; s0 += mb) {
        int64_t ns = r->d.n_seq - s0 < mb ? r->d.n_seq - s0 : mb, n = ns * L;
        const float *x = r->x + s0 * L * D;
        if ((st = llmq_forward_rmsnorm(r->f, x, n, wn, a))) break;
        if (ffn) {
            if ((st = llmq_forward_attn(r->f, l, &r->ly, a, ns, L, b))) break;
            for (int64_t i = 0; i < n * D; i++) b[i] = x[i] + b[i];
            if ((st = llmq_forward_rmsnorm(r->f, b, n, wn + D, a))) break;
        }
        st = llmq_calib_stats_add(&r->s, l, ffn ? LLMQ_CALIB_SLOT_GATE : LLMQ_CALIB_SLOT_Q, a, n, ns);
        r->tok0 = s0 * L;
        if (!st && r->fpin) st = dxx_add(r, ffn ? LLMQ_CALIB_SLOT_GATE : LLMQ_CALIB_SLOT_Q, a, n);
    }
    if (!st) llmq_calib_stats_finish(&r->s, l);
    free(own);
    free(wn);
    return st;
}

static enum llmq_status norm_pass(struct run *r, int l, bool ffn) {
    const double t0 = llmq_now_s();
    return timed(r, S_PASSES, t0, norm_pass_run(r, l, ffn));
}

// Σ_r Δ_r H Δ_rᵀ for Δ (R, C), H (C, C) symmetric, in double. On the CPU T = Δ H is formed QF_ROWS rows at a time,
// so r->T holds (QF_ROWS, C) however large R is; on CUDA in one product (each call uploads H: kernels/gemm.h), into
// a T of (Rmax, Cmax).
#define QF_ROWS LLMQ_BLOCKS_QF_ROWS_CPU // calib/blocks.h repeats these products on the CPU hook
static int64_t qf_rows(const struct run *r, int64_t R) { return r->o->backend == LLMQ_BACKEND_CUDA ? R : QF_ROWS; }
static double quad_form(struct run *r, const float *Dl, const float *H, int64_t R, int64_t C) {
    double s = 0;
    if (r->qb) { // the block path: H is the linear's, kept where the block computes (calib/blocks.h)
        enum llmq_status st = llmq_blocks_quad_form(r->qb, Dl, R, C, &s);
        if (st && !r->gemm_st) r->gemm_st = st;
        return st ? NAN : s;
    }
    const int64_t step = qf_rows(r, R);
    for (int64_t r0 = 0; r0 < R; r0 += step) {
        const int64_t n = R - r0 < step ? R - r0 : step;
        const float *D0 = Dl + r0 * C;
        enum llmq_status st = llmq_gemm_f32(r->o->backend, false, false, n, C, C, 1.0f, D0, C, H, C, 0.0f, r->T, C);
        if (st) {
            if (!r->gemm_st) r->gemm_st = st;
            return NAN;
        }
        for (int64_t i = 0; i < n * C; i++) s += (double)D0[i] * (double)r->T[i];
    }
    return s;
}

// err = ‖(W - Q) X‖² / ‖W X‖² from Hx, or the weight error when Hx is NULL. Uses r->T; Q is overwritten. den: NULL,
// or ‖W X‖² of this W and Hx when >= 0 (not formed again), else set to it (GPTQ's two errors share W and Hx).
static double rel_err(struct run *r, const float *W, float *Q, const float *Hx, int64_t R, int64_t C, double *den) {
    for (int64_t i = 0; i < R * C; i++) Q[i] = W[i] - Q[i];
    if (!Hx) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < R * C; i++) {
            a += (double)Q[i] * Q[i];
            b += (double)W[i] * W[i];
        }
        return b > 0 ? a / b : 0;
    }
    double d = den && *den >= 0 ? *den : quad_form(r, W, Hx, R, C);
    if (den) *den = d;
    double num = quad_form(r, Q, Hx, R, C);
    return d > 0 ? num / d : 0;
}

// RTN on the AWQ grid (AutoAWQ pseudo_quantize_tensor with zero point): llmq_quant_params_awq per group.
static enum llmq_status awq_rtn(const char *name, const float *W, int64_t R, int64_t C, const struct llmq_qconfig *cfg,
                                struct llmq_qlinear *out) {
    enum llmq_status st = llmq_qlinear_init(R, C, cfg, out);
    if (st) return st;
    int64_t G = cfg->group_size > 0 ? cfg->group_size : C;
    int maxq = (1 << cfg->bits) - 1;
    for (int64_t i = 0; i < R; i++)
        for (int64_t g = 0; g < out->n_groups; g++) {
            int64_t c0 = g * G, n = C - c0 < G ? C - c0 : G;
            const float *w = W + i * C + c0;
            float sc, z;
            for (int64_t c = 0; c < n; c++)
                if (!isfinite(w[c])) {
                    llmq_qlinear_free(out);
                    return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: non-finite weight at [%lld, %lld]", name, (long long)i,
                                       (long long)(c0 + c));
                }
            llmq_quant_params_awq(w, n, 1, cfg->bits, cfg->sym, &sc, &z);
            out->scales[i * out->n_groups + g] = sc;
            out->zeros[i * out->n_groups + g] = z;
            for (int64_t c = 0; c < n; c++) out->q[i * C + c0 + c] = llmq_quant_code(w[c], sc, z, maxq);
        }
    return LLMQ_OK;
}

// RTN per output channel (G = -1) re-expressed on cfg's G layout: the one (scale, zero) in every group, so the
// writers see a uniform layout (the fallback for a group size that does not tile C).
static enum llmq_status rtn_per_channel(const char *name, const float *W, int64_t R, int64_t C,
                                        const struct llmq_qconfig *cfg, struct llmq_qlinear *out) {
    struct llmq_qconfig pc = *cfg;
    pc.group_size = -1;
    struct llmq_qlinear tmp = {0};
    enum llmq_status st = llmq_rtn_quantize(name, W, R, C, &pc, &tmp);
    if (!st) st = llmq_qlinear_init(R, C, cfg, out);
    if (!st) {
        memcpy(out->q, tmp.q, (size_t)(R * C));
        for (int64_t i = 0; i < R; i++)
            for (int64_t g = 0; g < out->n_groups; g++) {
                out->scales[i * out->n_groups + g] = tmp.scales[i];
                out->zeros[i * out->n_groups + g] = tmp.zeros[i];
            }
    }
    llmq_qlinear_free(&tmp);
    return st;
}

// The ETA's work model (common/eta.h) of linear (R, C) with N calibration tokens: cost_data for the products
// over the tokens (its share of the block passes and XᵀX; AWQ's scale search is n_grid more forwards, quant/awq.h
// "Cost"), cost_solve for the C-sized products (GPTQ's solve and the layer error ‖(W-Q)X‖² from XᵀX; RTN
// without calibration: the rounding itself).
static double cost_data(const struct run *r, int64_t R, int64_t C) {
    return r->eta_data_weight * (double)R * (double)C * (double)(r->d.n_seq * r->d.seqlen);
}
static double cost_solve(const struct run *r, int64_t R, int64_t C) {
    return (double)R * (double)C * (r->have_calib ? (double)C : 1.0);
}

// Credits cost_data of linear k of block l (k < 0: of all its linears): their block passes (or search) are done.
static void credit_data(struct run *r, int l, int k) {
    for (int j = k < 0 ? 0 : k; j < (k < 0 ? LLMQ_LIN_COUNT : k + 1); j++) {
        const struct llmq_tensor_view *v = r->m->layers[l].w[j];
        if (!v) continue; // a moe block's experts: credited with their reports
        llmq_eta_credit(&r->eta, cost_data(r, v->shape[0], v->shape[1]));
    }
}

// The stderr line and the JSON row of one finished linear; bits: what its storage costs.
// gtype: the GGUF type it was written in (LLMQ_DTYPE_INVALID for the HF formats).
// The name of block l's linear k in the log and the JSON: "blk.L.attn_q", an expert's "blk.L.ffn_gate_exps.X".
static char *lin_label(enum llmq_arch a, int l, int k, int64_t x, char *buf, size_t size) {
    if (x < 0) return llmq_arch_linear_full_name(a, k, l, false, buf, size); // qwen2_moe: blk.L.ffn_gate_shexp
    snprintf(buf, size, "blk.%d.ffn_%s_exps.%lld", l, llmq_linear_name((enum llmq_linear)k), (long long)x);
    return buf;
}

// An expert's share of the ETA's data work: the fraction of the tokens the router sends it on average (K / E).
static double expert_share(const struct run *r, int64_t x) {
    return x < 0 ? 1.0 : (double)r->m->hp.n_expert_used / (double)r->m->hp.n_expert;
}

static void report_linear(struct run *r, int l, int k, int64_t x, int64_t R, int64_t C, double bits, const char *how,
                          enum llmq_dtype gtype, double err, bool werr, double loss, double rtn_err, double secs) {
    r->bits_total += bits;
    const double data = x >= 0 || !r->eta_data_early ? expert_share(r, x) * cost_data(r, R, C) : 0;
    llmq_eta_credit(&r->eta, cost_solve(r, R, C) + data + r->eta_other);
    r->eta_other = 0;
    char eta[32], name[64], extra[96] = "", type[24] = "", fused[128] = "", stem[64];
    llmq_eta_format(llmq_eta_remaining(&r->eta, llmq_now_s()), eta, sizeof(eta));
    lin_label(r->m->hp.arch, l, k, x, name, sizeof(name));
    enum llmq_linear head;
    int64_t r0 = 0, total = 0;
    const bool part = x < 0 && llmq_arch_fused_part(&r->m->hp, (enum llmq_linear)k, &head, &r0, &total);
    if (part) { // phi3: written as rows of the fused attn_qkv / ffn_up (qkv_proj / gate_up_proj)
        snprintf(stem, sizeof stem, "blk.%d.%s", l, head == LLMQ_LIN_Q ? "attn_qkv" : "ffn_up");
        snprintf(fused, sizeof fused, "  rows %lld..%lld of %s", (long long)r0, (long long)(r0 + R), stem);
    }
    if (loss >= 0) snprintf(extra, sizeof(extra), "  loss %.4g  rtn_err %.4e", loss, rtn_err);
    if (gtype != LLMQ_DTYPE_INVALID) snprintf(type, sizeof(type), "%-6s ", llmq_dtype_name(gtype));
    llmq_info("quantize: %-18s %5lld x %-5lld %-9s %s%s %.4e%s  %.2f s  ETA %s%s", name, (long long)R, (long long)C,
              how, type, werr ? "werr" : "err ", err, extra, secs, eta, fused);
    json_t *row = json_object();
    json_object_set_new(row, "name", json_string(name));
    if (part) // the stored tensor and the half-open row range [r0, r1) this linear is
        json_object_set_new(row, "fused",
                            json_pack("{s:s, s:[I, I]}", "tensor", stem, "rows", (json_int_t)r0, (json_int_t)(r0 + R)));
    if (x >= 0) json_object_set_new(row, "expert", json_integer(x));
    json_object_set_new(row, "shape", json_pack("[I, I]", (json_int_t)R, (json_int_t)C));
    json_object_set_new(row, "method", json_string(how));
    if (gtype != LLMQ_DTYPE_INVALID) json_object_set_new(row, "type", json_string(llmq_dtype_name(gtype)));
    json_object_set_new(row, werr ? "weight_err" : "err", json_real(err));
    if (loss >= 0) {
        json_object_set_new(row, "gptq_loss", json_real(loss));
        json_object_set_new(row, "rtn_err", json_real(rtn_err));
    }
    json_object_set_new(row, "seconds", json_real(secs));
    json_array_append_new(r->layers, row);
}

static bool tiles(const struct llmq_qconfig *q, int64_t C) { return q->group_size <= 0 || C % q->group_size == 0; }

// W (R, C) of linear k of block l, f32, into r->W.
static enum llmq_status load_weight(struct run *r, int l, int k) {
    return llmq_model_weight_f32(r->m->layers[l].w[k], r->W, r->o->n_threads);
}

// ---- one linear onto the writer's target (quant/writer.h) ----------------------------------------------------
// A result is held in the target's terms: integer codes + grid in a struct llmq_qlinear (CODES), or R encoded
// rows in r->blk (ROWS, and F32 for the writer's F32 / F16 / BF16 conversion).

// Q (R, C) := the weights the result holds (exactly what the output will decode to).
static enum llmq_status decode_payload(enum llmq_qpayload_kind kind, enum llmq_dtype type,
                                       const struct llmq_qlinear *ql, const uint8_t *rows, int64_t R, int64_t C,
                                       float *Q) {
    if (kind == LLMQ_QPAYLOAD_CODES) {
        llmq_qlinear_dequant(ql, Q);
        return LLMQ_OK;
    }
    size_t rb = 0;
    (void)llmq_dtype_nbytes(type, C, &rb); // C tiles the type's blocks (checked by quantize_linear)
    enum llmq_status st = LLMQ_OK;
    for (int64_t i = 0; i < R && !st; i++) st = llmq_dequantize_row(type, rows + (size_t)i * rb, Q + i * C, C);
    return st;
}
static enum llmq_status decode_result(struct run *r, const struct llmq_qtarget *t, const struct llmq_qlinear *ql,
                                      int64_t R, int64_t C, float *Q) {
    return decode_payload(t->kind, t->type, ql, r->blk, R, C, Q);
}

// W (R, C) rounded onto t without a solver, then decoded into Q (Q may be W). CODES: the grid's RTN
// (llmq_rtn_quantize; with awq_grid AutoAWQ's, awq_rtn; per channel when G does not tile C) into ql, which
// must be empty; ROWS / F32: t's encoder with importance imp (C or NULL) into r->blk.
static enum llmq_status round_onto(struct run *r, const struct llmq_qtarget *t, const char *name, const float *W,
                                   int64_t R, int64_t C, const float *imp, bool awq_grid, struct llmq_qlinear *ql,
                                   float *Q) {
    enum llmq_status st;
    if (t->kind != LLMQ_QPAYLOAD_CODES)
        st = llmq_gguf_encode_rows(t->type, W, r->blk, R, C, imp, r->o->n_threads);
    else if (!tiles(&t->q, C))
        st = rtn_per_channel(name, W, R, C, &t->q, ql);
    else
        st = awq_grid ? awq_rtn(name, W, R, C, &t->q, ql) : llmq_rtn_quantize(name, W, R, C, &t->q, ql);
    return st ? st : decode_result(r, t, ql, R, C, Q);
}

// GPTQ of W (R, C) onto t with the Hessian r->H (destroyed): CODES through quant/gptq.h into ql (empty), ROWS
// through quant/gptq_gguf.h with importance imp into r->blk. W then holds the result's decoding; *loss the
// solver's loss.
static enum llmq_status gptq_onto(struct run *r, const struct llmq_qtarget *t, const char *name, float *W, int64_t R,
                                  int64_t C, const float *imp, struct llmq_qlinear *ql, double *loss) {
    const struct llmq_quantize_opts *o = r->o;
    if (t->kind == LLMQ_QPAYLOAD_CODES) {
        struct llmq_gptq_opts go = llmq_gptq_opts_default();
        go.q = t->q;
        go.percdamp = o->percdamp;
        go.act_order = o->act_order;
        go.static_groups = o->static_groups;
        go.group_aware = o->group_aware;
        go.backend = o->backend; // CUDA: steps 5-7 on the GPU (quant/gptq.h)
        go.grid = o->gptq_grid;
        go.H_src = r->Hx; // r->H is a copy of it (quantize_linear): the solver keeps no C x C backup
        go.dxxt = r->Dcur;
        go.gptaq_alpha = o->gptaq_alpha;
        return llmq_gptq_quantize(name, W, r->H, R, C, &go, ql, loss, NULL);
    }
    struct llmq_gptq_gguf_opts go = llmq_gptq_gguf_opts_default();
    go.percdamp = o->percdamp;
    go.n_threads = o->n_threads;
    go.act_order = o->act_order;
    go.dxxt = r->Dcur;
    go.gptaq_alpha = o->gptaq_alpha;
    return llmq_gptq_gguf_quantize(name, W, r->H, R, C, t->type, imp, &go, r->blk, loss, NULL);
}

// Hands the result over (F32: the weights W themselves, converted by the writer) and into the checkpoint, and
// decodes it into W; x >= 0: expert x's linear k.
static enum llmq_status hand_over(struct run *r, int l, int k, int64_t x, const struct llmq_qtarget *t,
                                  const struct llmq_qlinear *ql, int64_t R, int64_t C, float *W) {
    struct llmq_qpayload p = {.kind = t->kind, .codes = ql, .rows = r->blk, .w = W};
    enum llmq_status st = x >= 0 ? llmq_qwriter_put_expert(r->w, l, (enum llmq_linear)k, x, &p)
                                 : llmq_qwriter_put_linear(r->w, l, (enum llmq_linear)k, &p);
    if (!st && r->ck)
        st = x >= 0 ? llmq_ckpt_put_expert(r->ck, r->m, r->w, l, (enum llmq_linear)k, x, &p)
                    : llmq_ckpt_put_linear(r->ck, r->m, r->w, l, (enum llmq_linear)k, &p);
    return st ? st : decode_result(r, t, ql, R, C, W);
}

// What the output spends on the result: codes + f16 scales + zeros, or R rows of rb bytes.
static double result_bits(const struct llmq_qtarget *t, const struct llmq_qlinear *ql, int64_t R, size_t rb) {
    if (t->kind != LLMQ_QPAYLOAD_CODES) return 8.0 * (double)rb * (double)R;
    return (double)ql->R * (double)ql->C * ql->bits + (double)ql->R * (double)ql->n_groups * (16.0 + ql->bits);
}

static void held_free(struct held *h) {
    llmq_qlinear_free(&h->ql);
    free(h->rows);
    memset(h, 0, sizeof *h);
}

// Keeps a linear's result in h (its codes, moved out of ql, or a copy of its encoded rows of rb bytes): a quarter or
// less of the f32 weights that the block's later passes decode from it (held_unpack).
static enum llmq_status hold_result(struct run *r, struct held *h, const struct llmq_qtarget *t,
                                    struct llmq_qlinear *ql, int64_t R, size_t rb) {
    held_free(h);
    h->kind = t->kind;
    h->type = t->type;
    if (t->kind == LLMQ_QPAYLOAD_CODES) {
        h->ql = *ql;
        memset(ql, 0, sizeof *ql);
    } else {
        if (!(h->rows = malloc((size_t)R * rb)))
            return llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory for a quantized linear's rows");
        memcpy(h->rows, r->blk, (size_t)R * rb);
    }
    h->on = true;
    return LLMQ_OK;
}

// awq, awq+gptq of a moe model: RTN of the ORIGINAL weights of linear (l, k, x) (not scaled, not clipped) onto t, with
// the original input's Hessian H0 = Hx ∘ (s_i s_j) (s = r->awq_s) and, for ggml rows, importance diag(H0): the
// "rtn_orig_err" of the report, the baseline AWQ is measured against. Uses r->H, r->Q, r->W0 (all rewritten).
static double rtn_orig_err(struct run *r, const struct llmq_qtarget *t, const char *name,
                           const struct llmq_tensor_view *v, const float *Hx, int64_t R, int64_t C) {
    const float *s = r->awq_s;
    struct llmq_qlinear ql = {0};
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) r->H[i * C + j] = s ? Hx[i * C + j] * s[i] * s[j] : Hx[i * C + j];
    for (int64_t i = 0; i < C; i++) r->imp[i] = r->H[i * C + i];
    enum llmq_status st = llmq_model_weight_f32(v, r->W0, r->o->n_threads);
    if (!st) st = round_onto(r, t, name, r->W0, R, C, t->kind == LLMQ_QPAYLOAD_ROWS ? r->imp : NULL, false, &ql, r->Q);
    llmq_qlinear_free(&ql);
    return st ? NAN : rel_err(r, r->W0, r->Q, r->H, R, C, NULL);
}

// One linear onto the writer's target and into the writer, as the run's method does it; logs the line and
// records the JSON row. W (R, C): in, the weights to quantize (AWQ: scaled and clipped); out, the decoding of
// what was handed over (the block's weight set for the true-sequential passes). Hsrc (C, C): the Hessian of W's input
// (AWQ: scaled), read only (it may be r->H or r->Hx); NULL without calibration (rtn: the weight error, "werr"). imp: a
// ROWS target's encoder importance (AWQ: of the scaled input); NULL: the writer's, else diag(Hsrc).
//   rtn, awq   rounded onto the target (round_onto; awq on AutoAWQ's grid).
//   gptq, awq+gptq   rtn_err of the plain rounding (GPTQ's grid, same importance), then GPTQ onto the target.
//              Into ggml rows, when GPTQ's err is not below rtn_err (little data, an importance-weighted
//              encoder already strong) the rounding is written instead: method "<how>:rtn", the rejected
//              "gptq_err" in the JSON. On an integer grid GPTQ's result is always written.
//   What the target does not let the method solve: a grid whose G does not tile C (only with the fallback,
//   llmq_quantize_check) -> RTN per channel, "rtn-pc"; an F32 / F16 / BF16 type -> the writer's conversion,
//   "convert".
//   x >= 0: expert x's gate / up / down (k) of a moe block, onto the writer's expert target; floor: an expert
//   below the token floor, rounded ("rtn:floor") whatever the method (Hsrc, when given, only for the error).
static enum llmq_status quantize_linear(struct run *r, int l, int k, int64_t x, float *W, const float *Hsrc,
                                        const float *imp, bool floor) {
    const struct llmq_tensor_view *v = llmq_layer_linear(&r->m->layers[l], k, x);
    const int64_t R = v->shape[0], C = v->shape[1];
    const struct llmq_qtarget t = x >= 0 ? llmq_qwriter_expert_target(r->w, l, (enum llmq_linear)k)
                                         : llmq_qwriter_target(r->w, l, (enum llmq_linear)k);
    const enum llmq_qmethod method = floor ? LLMQ_QMETHOD_RTN : r->o->method;
    char name[64], fallback_how[24];
    lin_label(r->m->hp.arch, l, k, x, name, sizeof(name));
    size_t rb = 0;
    if (t.kind != LLMQ_QPAYLOAD_CODES && !llmq_dtype_nbytes(t.type, C, &rb))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: %s: %lld columns do not tile %s blocks", name, (long long)C,
                           llmq_dtype_name(t.type));
    const float *Hx = NULL;
    if (Hsrc) {
        if (Hsrc != r->Hx) memcpy(r->Hx, Hsrc, (size_t)(C * C) * sizeof(float));
        Hx = r->Hx;
    }
    const bool per_channel = t.kind == LLMQ_QPAYLOAD_CODES && !tiles(&t.q, C);
    const bool plain = per_channel || t.kind == LLMQ_QPAYLOAD_F32; // no solver, whatever the method
    const char *how = per_channel ? "rtn-pc" : plain ? "convert" : floor ? "rtn:floor" : llmq_qmethod_name(method);
    if (t.kind != LLMQ_QPAYLOAD_ROWS) {
        imp = NULL;
    } else if (!imp && !(imp = t.importance) && Hx) { // no statistics (an expert no token reached): unweighted
        for (int64_t i = 0; i < C; i++) r->imp[i] = Hx[i * C + i];
        imp = r->imp;
    }
    double t0 = llmq_now_s(), loss = -1, rtn_err = 0, gptq_err = -1, err, orig_err = -1;
    struct llmq_qlinear ql = {0};
    enum llmq_status st;
    if (!plain && !floor && Hx && r->W0 && r->m->hp.moe) // moe only: the dense reports stay as they were
        orig_err = rtn_orig_err(r, &t, name, v, Hx, R, C);
    if (!plain && llmq_qmethod_uses_gptq(method)) {
        // the rounding alone with the same importance, for the comparison column
        if ((st = round_onto(r, &t, name, W, R, C, imp, false, &ql, r->Q))) goto done;
        llmq_qlinear_free(&ql);
        double den = -1; // ‖W0 X‖², formed once for both errors
        rtn_err = rel_err(r, W, r->Q, Hx, R, C, &den);
        memcpy(r->Q, W, (size_t)(R * C) * sizeof(float)); // keep the original W for the error
        memcpy(r->H, Hx, (size_t)(C * C) * sizeof(float));
        if ((st = gptq_onto(r, &t, name, W, R, C, imp, &ql, &loss))) goto done;
        err = rel_err(r, r->Q, W, Hx, R, C, &den); // W := W0 - Q; restored from the result by hand_over
        if (t.kind == LLMQ_QPAYLOAD_ROWS && !(err < rtn_err) && !r->Dcur) { // GPTAQ does not minimise err
            llmq_info("quantize: %s: gptq err %.4e >= rtn_err %.4e: written with the encoder alone", name, err,
                      rtn_err);
            gptq_err = err;
            err = rtn_err;
            snprintf(fallback_how, sizeof(fallback_how), "%s:rtn", how);
            how = fallback_how;
            if ((st = round_onto(r, &t, name, r->Q, R, C, imp, false, &ql, W))) goto done;
        }
    } else {
        if ((st = round_onto(r, &t, name, W, R, C, imp, !plain && method == LLMQ_QMETHOD_AWQ, &ql, r->Q))) goto done;
        err = rel_err(r, W, r->Q, Hx, R, C, NULL);
    }
    const double t_hand = llmq_now_s();
    r->stage_s[S_SOLVE] += t_hand - t0; // the solve and its errors; the hand-over is the writer's
    if ((st = timed(r, S_WRITE, t_hand, hand_over(r, l, k, x, &t, &ql, R, C, W)))) goto done;
    report_linear(r, l, k, x, R, C, result_bits(&t, &ql, R, rb), how,
                  t.kind == LLMQ_QPAYLOAD_CODES ? LLMQ_DTYPE_INVALID : t.type, err, Hx == NULL, loss, rtn_err,
                  llmq_now_s() - t0);
    if (gptq_err >= 0)
        json_object_set_new(json_array_get(r->layers, json_array_size(r->layers) - 1), "gptq_err", json_real(gptq_err));
    if (orig_err >= 0)
        json_object_set_new(json_array_get(r->layers, json_array_size(r->layers) - 1), "rtn_orig_err",
                            json_real(orig_err));
    if (r->hold) st = hold_result(r, x >= 0 ? &r->exp_held[3 * x + (k - LLMQ_LIN_GATE)] : &r->held[k], &t, &ql, R, rb);
done:
    llmq_qlinear_free(&ql);
    return st;
}

// ---- RTN ---------------------------------------------------------------------------------------------------

// Block l's weight set to the writer (and to the checkpoint, which replays it on --resume).
static enum llmq_status put_block(struct run *r, int l, const struct llmq_layer *ly) {
    const double t0 = llmq_now_s();
    enum llmq_status st = llmq_qwriter_put_block(r->w, l, ly);
    if (!st && r->ck) st = llmq_ckpt_put_block(r->ck, l, ly);
    return timed(r, S_WRITE, t0, st);
}

// The pages of the per-linear work buffers (W, Q, T, H, Hx: every one is rewritten before it is read), so
// that a statistics pass does not hold them next to its XᵀX sums (quant/quantize.h "Memory").
static void release_work(struct run *r) {
    float *w[] = {r->W, r->Q}, *h[] = {r->H, r->Hx};
    for (int i = 0; i < 2; i++) llmq_scratch_release(w[i], (size_t)r->n_w * sizeof(float));
    llmq_scratch_release(r->T, (size_t)r->n_t * sizeof(float));
    for (int i = 0; i < 2; i++) llmq_scratch_release(h[i], (size_t)r->n_h * sizeof(float));
}

// ---- Mixture of experts -------------------------------------------------------------------------------------

// The coverage of block l's experts (the routing of the pass that gathered their gate/up inputs): a log line and a
// row of the report's "moe" object.
static void moe_coverage(struct run *r, int l) {
    const int64_t E = r->m->hp.n_expert, floor = r->o->moe_token_floor;
    struct llmq_calib_coverage c;
    llmq_calib_moe_coverage(&r->s, l, floor, &c, r->under);
    char list[160] = "";
    size_t n = 0;
    for (int64_t i = 0; i < c.n_under && n + 24 < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%lld", i ? "," : ": experts ", (long long)r->under[i]);
    if (n + 24 >= sizeof list) snprintf(list + n, sizeof list - n, ",...");
    llmq_info("quantize: blk.%d experts: routed tokens per expert min %lld / median %lld / max %lld (%lld tokens, "
              "top-%lld of %lld); %lld under the floor %lld%s%s",
              l, (long long)c.min, (long long)c.median, (long long)c.max, (long long)(r->d.n_seq * r->d.seqlen),
              (long long)r->m->hp.n_expert_used, (long long)E, (long long)c.n_under, (long long)floor, list,
              c.n_under && r->o->moe_calib_all ? " (--moe-calib all: every expert sees every token, no fallback)" : "");
    json_t *row = json_object(), *under = json_array(), *routed = json_array();
    for (int64_t i = 0; i < c.n_under; i++) json_array_append_new(under, json_integer(r->under[i]));
    for (int64_t x = 0; x < E; x++) json_array_append_new(routed, json_integer(r->s.routed[(int64_t)l * E + x]));
    json_object_set_new(row, "layer", json_integer(l));
    json_object_set_new(row, "tokens_min", json_integer(c.min));
    json_object_set_new(row, "tokens_median", json_integer(c.median));
    json_object_set_new(row, "tokens_max", json_integer(c.max));
    json_object_set_new(row, "under_floor", under);
    json_object_set_new(row, "routed", routed);
    json_array_append_new(json_object_get(r->moe, "layers"), row);
}

// Expert x's linear k (GATE, UP, DOWN) of block l from its own statistics (of r->s: gathered by the last pass):
// the method, or RTN when the router sent it fewer tokens than the floor under --moe-calib routed (gptq, awq+gptq;
// a log line, a JSON "fallback"); gptq: its result is held (exp_held) and replaces the model's expert in the block's
// later passes (expert_source). awq: the weights to quantize are b's (scaled and clipped, made for this call:
// llmq_awq_expert_weight; NULL: the model's), s the input scales they carry (the Hessian is taken as
// H / (s_i s_j)) or NULL.
static enum llmq_status quantize_expert(struct run *r, int l, int k, int64_t x, const struct llmq_awq_block *b,
                                        const float *s) {
    const struct llmq_tensor_view *v = llmq_layer_linear(&r->m->layers[l], k, x);
    const int eslot = k == LLMQ_LIN_DOWN ? LLMQ_CALIB_EXP_DOWN : LLMQ_CALIB_EXP_GATE;
    const int64_t C = v->shape[1], j = 3 * x + (k - LLMQ_LIN_GATE);
    const int64_t routed = r->have_calib ? r->s.routed[(int64_t)l * r->s.n_expert + x] : 0;
    const bool floor =
        r->have_calib && llmq_qmethod_uses_gptq(r->o->method) && !r->o->moe_calib_all && routed < r->o->moe_token_floor;
    const struct llmq_calib_input *in = r->have_calib ? llmq_calib_expert_input(&r->s, l, x, eslot) : NULL;
    enum llmq_status st = LLMQ_OK;
    if (b)
        st = llmq_awq_expert_weight(b, (enum llmq_linear)k, x, r->W);
    else
        st = llmq_model_weight_f32(v, r->W, r->o->n_threads);
    const float *H = NULL;
    if (!st && in && in->count > 0) {
        if ((st = llmq_calib_expert_hessian(&r->s, l, x, eslot, r->H))) return st;
        for (int64_t i = 0; s && i < C; i++)
            for (int64_t j2 = 0; j2 < C; j2++) r->H[i * C + j2] /= s[i] * s[j2];
        H = r->H;
    }
    if (st) return st;
    if (floor)
        llmq_info("quantize: blk.%d.ffn_%s_exps.%lld: %lld routed tokens < --moe-token-floor %lld: rounded (RTN) "
                  "instead of %s",
                  l, llmq_linear_name((enum llmq_linear)k), (long long)x, (long long)routed,
                  (long long)r->o->moe_token_floor, llmq_qmethod_name(r->o->method));
    r->awq_s = s;
    r->hold = !b && llmq_qmethod_uses_gptq(r->o->method); // gptq: the later passes of the block use the result
    st = quantize_linear(r, l, k, x, r->W, H, NULL, floor);
    r->hold = false;
    if (st) return st;
    json_t *row = json_array_get(r->layers, json_array_size(r->layers) - 1);
    json_object_set_new(row, "routed_tokens", json_integer(routed));
    json_object_set_new(row, "calib_tokens", json_integer(in ? in->count : 0)); // its statistics' tokens
    if (floor) {
        json_object_set_new(row, "fallback", json_string("rtn: routed tokens below the floor"));
        json_integer_set(json_object_get(r->moe, "fallback_rtn"),
                         json_integer_value(json_object_get(r->moe, "fallback_rtn")) + 1);
    }
    if (eslot == LLMQ_CALIB_EXP_GATE && k == LLMQ_LIN_UP) llmq_calib_expert_drop_xtx(&r->s, l, x, eslot);
    if (eslot == LLMQ_CALIB_EXP_DOWN) llmq_calib_expert_drop_xtx(&r->s, l, x, eslot);
    // the model's expert is read no more in this block (gptq: its held result replaces it; awq: made from it once)
    if (r->exp_held[j].on || b) llmq_mmap_release(v->data, v->nbytes);
    return LLMQ_OK;
}

// The forward's expert source (calib/model/moe.h llmq_expert_weight_fn): gptq's held result of the expert, decoded
// into the scratch (the same bits as hand_over's decoding); the model's view while there is none.
static enum llmq_status expert_source(void *user, int layer, int expert, enum llmq_linear which,
                                      const struct llmq_tensor_view *w, float *scratch, bool *filled) {
    const struct run *r = user;
    const struct held *h = &r->exp_held[3 * (int64_t)expert + (which - LLMQ_LIN_GATE)];
    (void)layer; // exp_held is the current block's (moe_bind)
    *filled = h->on;
    return h->on ? decode_payload(h->kind, h->type, &h->ql, h->rows, w->shape[0], w->shape[1], scratch) : LLMQ_OK;
}

// The heap's free pages back to the system (glibc: malloc_trim). A moe block frees its experts' XᵀX sums one
// expert at a time (2 x 8C² each); without this the heap keeps them and the next block's peak sits on top of them.
static void heap_trim(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

// The experts of block l start as the model's: the previous block's held results are freed.
static void moe_bind(struct run *r, int l) {
    (void)l;
    for (int64_t j = 0; j < 3 * r->m->hp.n_expert; j++) held_free(&r->exp_held[j]);
    heap_trim(); // the previous block's sums and results
}

// Every expert's linears of eslot (GATE: gate and up; DOWN: down) of block l; with gather, first the pass over the
// block (this block's quantized linears in place) that collects their inputs (qwen2_moe: and the shared expert's,
// the dense slot of the same linears); GATE reports the coverage.
static enum llmq_status moe_group(struct run *r, int l, int eslot, bool gather) {
    enum llmq_status st = LLMQ_OK;
    const int64_t N = r->d.n_seq * r->d.seqlen, D = r->m->hp.n_embd;
    const int dslot = !r->m->hp.shexp ? -2 : eslot == LLMQ_CALIB_EXP_GATE ? LLMQ_CALIB_SLOT_GATE : LLMQ_CALIB_SLOT_DOWN;
    if (gather && r->have_calib) {
        release_work(r);
        memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float));
        if ((st = block_pass(r, l, r->xt, dslot, eslot))) return st;
    }
    if (eslot == LLMQ_CALIB_EXP_GATE && r->have_calib) moe_coverage(r, l);
    for (int64_t x = 0; x < r->m->hp.n_expert && !st; x++)
        for (int k = eslot == LLMQ_CALIB_EXP_GATE ? LLMQ_LIN_GATE : LLMQ_LIN_DOWN; k <= LLMQ_LIN_DOWN && !st; k++) {
            if (eslot == LLMQ_CALIB_EXP_GATE && k == LLMQ_LIN_DOWN) break;
            st = quantize_expert(r, l, k, x, NULL, NULL);
        }
    heap_trim(); // the group's sums are freed
    return st;
}

// The block path's statistics of the inputs in slots (bits 1u << slot) with the block's weights as they are, mirrored;
// apply_attn: x <- h first (llmq_blocks_apply_attn, the ffn inputs only).
static enum llmq_status dev_gather(struct run *r, int l, unsigned slots, bool apply_attn) {
    enum llmq_status st =
        apply_attn ? llmq_blocks_apply_attn(r->qb, l, slots, &r->s) : llmq_blocks_gather(r->qb, l, slots, &r->s);
    if (!st) llmq_calib_stats_finish(&r->s, l);
    return st;
}

static enum llmq_status block_rtn(struct run *r, int l) {
    enum llmq_status st = put_block(r, l, &r->ly);
    if (!st && r->have_calib && r->qb) { // fp inputs, only for the reported error
        if (!(st = llmq_blocks_load(r->qb, &r->ly, r->o->n_threads))) st = llmq_blocks_advance(r->qb, l, &r->s);
        if (!st) llmq_calib_stats_finish(&r->s, l);
    } else if (!st && r->have_calib) {
        st = block_pass(r, l, r->x, -1, -1);
    }
    if (!st && r->m->hp.moe) {
        if (!(st = moe_group(r, l, LLMQ_CALIB_EXP_GATE, false))) st = moe_group(r, l, LLMQ_CALIB_EXP_DOWN, false);
    }
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        if (!r->m->layers[l].w[k]) continue; // a moe block's: its experts above
        if ((st = load_weight(r, l, k))) break;
        if (r->have_calib && (st = hessian(r, l, llmq_calib_slot_of((enum llmq_linear)k), r->Hx, false))) break;
        st = quantize_linear(r, l, k, -1, r->W, r->have_calib ? r->Hx : NULL, NULL, false);
    }
    return st;
}

// ---- GPTQ (true-sequential) -------------------------------------------------------------------------------

static const int seq_groups[4][3] = {{LLMQ_LIN_Q, LLMQ_LIN_K, LLMQ_LIN_V},
                                     {LLMQ_LIN_O, -1, -1},
                                     {LLMQ_LIN_GATE, LLMQ_LIN_UP, -1},
                                     {LLMQ_LIN_DOWN, -1, -1}};

// The block's quantized linears into wq for a pass (the same bits as hand_over's decoding), and their pages
// released after it: between the passes only the held results stay (quant/quantize.h "Memory").
static enum llmq_status held_unpack(struct run *r) {
    enum llmq_status st = LLMQ_OK;
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        const struct held *h = &r->held[k];
        if (h->on)
            st = decode_payload(h->kind, h->type, &h->ql, h->rows, r->ov[k].shape[0], r->ov[k].shape[1], r->wq[k]);
    }
    return st;
}
static void held_release(struct run *r) {
    for (int k = 0; k < LLMQ_LIN_COUNT; k++)
        if (r->held[k].on) llmq_scratch_release(r->wq[k], (size_t)r->n_w * sizeof(float));
}

// GPTAQ: x_fp <- fp block l (x_fp) with the model's weights, its linears' inputs into r->fpin, the sums of D zeroed.
static enum llmq_status fp_pass_run(struct run *r, int l) {
    int64_t D = r->m->hp.n_embd, mb = r->o->micro_batch, L = r->d.seqlen;
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) memset(r->dxx[k], 0, (size_t)(r->cin[k] * r->cin[k]) * sizeof(double));
    for (int64_t s0 = 0; s0 < r->d.n_seq; s0 += mb) {
        int64_t ns = r->d.n_seq - s0 < mb ? r->d.n_seq - s0 : mb;
        r->tok0 = s0 * L;
        enum llmq_status st = llmq_forward_block(r->f, l, &r->m->layers[l], r->xfp + s0 * L * D, ns, L, fp_hook, r);
        if (!st) st = r->s.err;
        if (st) return st;
    }
    return LLMQ_OK;
}

static enum llmq_status fp_pass(struct run *r, int l) {
    const double t0 = llmq_now_s();
    return timed(r, S_PASSES, t0, fp_pass_run(r, l));
}

// GPTAQ: r->Dcur (C, C) := 2/n_seq · dxx[slot], the scale of H (llmq_calib_hessian).
static void gptaq_cross(struct run *r, int slot) {
    const int64_t C = r->cin[slot];
    const double f = 2.0 / (double)r->d.n_seq;
    for (int64_t i = 0; i < C * C; i++) r->Dcur[i] = (float)(f * r->dxx[slot][i]);
}

// GPTQ of the dense linears of group g (seq_groups) of block l on the statistics of their input slot, which the
// last of them drops; each result replaces the model's weight in the block's weight set for its following passes
// (decoded into wq[k] from held[k] for each pass).
static enum llmq_status gptq_group(struct run *r, int l, int g, int slot) {
    enum llmq_status st = LLMQ_OK;
    for (int j = 0; j < 3 && !st && seq_groups[g][j] >= 0; j++) {
        int k = seq_groups[g][j];
        const struct llmq_tensor_view *v = r->m->layers[l].w[k];
        int64_t R = v->shape[0], C = v->shape[1];
        if ((st = load_weight(r, l, k))) break;
        llmq_mmap_release(v->data, v->nbytes); // W holds it; the passes left in this block read the quantized copy
        const bool last = j == 2 || seq_groups[g][j + 1] < 0; // the input's last linear: its sums are dropped
        st = last ? hessian(r, l, slot, r->H, true) : hessian(r, l, slot, r->H, false);
        if (st) break;
        if (r->fpin) gptaq_cross(r, slot);
        r->hold = !r->qb; // forward.c's passes decode the held result; the block path takes W's decoding at once
        st = quantize_linear(r, l, k, -1, r->W, r->H, NULL, false);
        r->hold = false;
        if (!st && r->qb) st = llmq_blocks_set_linear(r->qb, (enum llmq_linear)k, r->W); // W: what was handed over
        if (st) break;
        r->ov[k] = *v;
        r->ov[k].dtype = LLMQ_DTYPE_F32;
        r->ov[k].data = r->wq[k];
        r->ov[k].nbytes = (size_t)(R * C) * sizeof(float);
        r->ly.w[k] = &r->ov[k];
    }
    return st;
}

static enum llmq_status block_gptq(struct run *r, int l) {
    enum llmq_status st = put_block(r, l, &r->ly); // GPTQ changes no norm or bias
    int64_t N = r->d.n_seq * r->d.seqlen, D = r->m->hp.n_embd;
    if (!st && r->fpin) st = fp_pass(r, l);
    if (st) return st;
    if (!r->o->true_sequential) {
        release_work(r);
        memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float));
        if ((st = block_pass(r, l, r->xt, -1, -1))) return st;
        credit_data(r, l, -1);
    }
    for (int g = 0; g < 4 && !st; g++) {
        int slot = llmq_calib_slot_of((enum llmq_linear)seq_groups[g][0]);
        if (r->m->hp.moe && g >= 2) { // the experts, each on its own inputs (attention's quantized linears decoded)
            if ((st = held_unpack(r))) break;
            st = moe_group(r, l, g == 2 ? LLMQ_CALIB_EXP_GATE : LLMQ_CALIB_EXP_DOWN, r->o->true_sequential);
            held_release(r);
            if (!st && r->m->layers[l].w[seq_groups[g][0]]) { // qwen2_moe: the shared expert, on moe_group's pass
                if (r->o->true_sequential)
                    for (int j = 0; j < 3 && seq_groups[g][j] >= 0; j++) credit_data(r, l, seq_groups[g][j]);
                st = gptq_group(r, l, g, slot);
            }
            continue;
        }
        if (r->o->true_sequential) {
            release_work(r);
            if ((st = held_unpack(r))) break;
            if (g == 0 || g == 2)
                st = norm_pass(r, l, g == 2);
            else {
                memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float));
                st = block_pass(r, l, r->xt, slot, -2);
            }
            held_release(r);
            if (st) break;
            for (int j = 0; j < 3 && seq_groups[g][j] >= 0; j++) credit_data(r, l, seq_groups[g][j]);
        }
        st = gptq_group(r, l, g, slot);
    }
    release_work(r); // the last solve's buffers: not held next to the seven decoded linears of the output pass
    if (!st) st = held_unpack(r);
    if (!st) st = block_pass(r, l, r->x, -2, -2); // x_q <- quantized block(x_q)
    held_release(r);
    for (int k = 0; k < LLMQ_LIN_COUNT; k++) held_free(&r->held[k]);
    return st;
}

// GPTQ on the block path (quant/quantize.h "Decoder blocks"): block_gptq's groups and solves, each group's
// statistics gathered where the blocks compute with the linears solved so far in place (each decoding uploaded as
// it is solved, gptq_group), then x_q <- quantized block(x_q) there. True-sequential: once [o] is solved the attention
// half is applied to x_q in place (h), [gate, up]'s and [down]'s inputs come from h and the output pass is the ffn half
// alone: the attention runs twice per block ([o]'s pass and h), not four times.
static enum llmq_status block_gptq_dev(struct run *r, int l) {
    enum llmq_status st = put_block(r, l, &r->ly);
    if (!st) st = llmq_blocks_load(r->qb, &r->ly, r->o->n_threads);
    if (!st && !r->o->true_sequential) {
        release_work(r);
        if (!(st = dev_gather(r, l, LLMQ_BLOCK_INPUTS_ALL, false))) credit_data(r, l, -1);
    }
    for (int g = 0; g < 4 && !st; g++) {
        const int slot = llmq_calib_slot_of((enum llmq_linear)seq_groups[g][0]);
        if (r->o->true_sequential) { // [gate, up]: x <- h once the attention is solved (calib/blocks.h)
            release_work(r);
            if ((st = dev_gather(r, l, 1u << slot, g == 2))) break;
            for (int j = 0; j < 3 && seq_groups[g][j] >= 0; j++) credit_data(r, l, seq_groups[g][j]);
        }
        st = gptq_group(r, l, g, slot);
    }
    release_work(r);
    if (!st) st = llmq_blocks_advance(r->qb, l, NULL); // x_q <- quantized block(x_q)
    for (int k = 0; k < LLMQ_LIN_COUNT; k++) held_free(&r->held[k]);
    return st;
}

// ---- AWQ and AWQ+GPTQ ----------------------------------------------------------------------------------------

// The search's quantizer for a linear whose target is a ggml type (gguf_fake_quant: encode with the type and
// the importance of the scaled input, decode), with that type's block as the group. Importance: the writer's
// (the imatrix) when it has one, else the mean x² of the block's fp inputs (what llama.cpp's imatrix would
// hold for this calibration), divided by s² for the scaled input.
struct gguf_fq {
    enum llmq_dtype type[LLMQ_AWQ_N_LIN]; // the experts' at LLMQ_AWQ_EXPERT_LIN (quant/awq.h)
    const float *imp[LLMQ_AWQ_N_LIN];     // (C) importance of the unscaled input, or NULL
    float *qw;                            // (Cmax) importance of the scaled input
    uint8_t *blk;                         // (Rmax, Cmax * 4 bytes) the encoded rows
    int n_threads;
    enum llmq_status st; // first failure (the callback returns nothing)
};

static void gguf_fake_quant(void *user, int layer, enum llmq_linear lin, int64_t rows, int64_t c0, int64_t n,
                            const float *s, const float *w, float *out) {
    struct gguf_fq *q = user;
    (void)layer;
    const float *qw = NULL;
    if (q->imp[lin]) {
        for (int64_t j = 0; j < n; j++) {
            const float sj = s ? s[c0 + j] : 1.0f;
            q->qw[j] = q->imp[lin][c0 + j] / (sj * sj);
        }
        qw = q->qw;
    }
    size_t rb = 0;
    (void)llmq_dtype_nbytes(q->type[lin], n, &rb); // n is whole blocks (lin_group_size)
    enum llmq_status st = llmq_gguf_encode_rows(q->type[lin], w, q->blk, rows, n, qw, q->n_threads);
    for (int64_t r = 0; r < rows && !st; r++)
        st = llmq_dequantize_row(q->type[lin], q->blk + (size_t)r * rb, out + r * n, n);
    if (st) {
        if (!q->st) q->st = st;
        memcpy(out, w, (size_t)(rows * n) * sizeof(float));
    }
}

// simp (C) = sum_sq / count of (layer l, slot) of the current statistics; NULL when there are none.
static const float *stats_importance(const struct run *r, int l, int slot, float *simp) {
    const struct llmq_calib_input *in = &r->s.in[(int64_t)l * LLMQ_CALIB_N_SLOTS + slot];
    if (!in->sum_sq || in->count < 1) return NULL;
    for (int64_t c = 0; c < in->n_in; c++) simp[c] = (float)(in->sum_sq[c] / (double)in->count);
    return simp;
}

// The search's quantizer from the writer's targets of block l: AutoAWQ's grid with the grid's bits and group
// size for integer codes (a directory: one grid for every linear), gguf_fake_quant for ggml types.
static void awq_quantizer(struct run *r, int l, struct llmq_awq_opts *ao, struct gguf_fq *fq) {
    for (int k = 0; k < (r->m->hp.moe ? LLMQ_AWQ_N_LIN : LLMQ_LIN_COUNT); k++) {
        const bool xp = k >= LLMQ_LIN_COUNT; // an expert's (moe): its stacked tensor's type, no DOWN importance
        const enum llmq_linear lin = xp ? (enum llmq_linear)(LLMQ_LIN_GATE + k - LLMQ_LIN_COUNT) : (enum llmq_linear)k;
        const struct llmq_qtarget t = xp ? llmq_qwriter_expert_target(r->w, l, lin) : llmq_qwriter_target(r->w, l, lin);
        if (t.kind == LLMQ_QPAYLOAD_CODES) {
            ao->bits = t.q.bits;
            ao->group_size = t.q.group_size;
            continue;
        }
        int slot = llmq_calib_slot_of(lin);
        fq->type[k] = t.type;
        fq->imp[k] = t.importance                 ? t.importance
                     : xp && lin == LLMQ_LIN_DOWN ? NULL // the DOWN slot is qwen2_moe's shared expert's (or empty)
                                                  : stats_importance(r, l, slot, r->simp[slot]);
        int64_t blck = llmq_dtype_traits(t.type)->blck;
        ao->lin_group_size[k] = blck > 1 ? (int)blck : 32; // F16 / BF16 / F32: any group, nearly lossless
        ao->fake_quant = gguf_fake_quant;
        ao->fake_quant_user = fq;
    }
}

// The scaled and clipped linears of b (block l) through quantize_linear with H' = H / (s_i s_j) and, for a ggml type,
// the importance of the scaled input (block_awq's loop; on the block path H' is also the error sums' Hessian there).
static enum llmq_status awq_quantize_linears(struct run *r, int l, const struct llmq_awq_block *b,
                                             const struct gguf_fq *fq) {
    enum llmq_status st = LLMQ_OK;
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        const struct llmq_tensor_view *v = r->m->layers[l].w[k];
        if (!v) continue; // a moe block's: its experts
        int64_t R = v->shape[0], C = v->shape[1];
        memcpy(r->W, b->w[k], (size_t)(R * C) * sizeof(float));
        if ((st = hessian(r, l, llmq_calib_slot_of((enum llmq_linear)k), r->H, false))) break;
        llmq_awq_scale_hessian(b, (enum llmq_linear)k, r->H);
        if (r->qb && (st = llmq_blocks_set_hessian(r->qb, r->H, C))) break;
        const float *s = llmq_awq_input_scales(b, (enum llmq_linear)k), *imp = NULL;
        if (fq->imp[k]) {
            for (int64_t c = 0; c < C; c++) r->fq_qw[c] = s ? fq->imp[k][c] / (s[c] * s[c]) : fq->imp[k][c];
            imp = r->fq_qw;
        }
        r->awq_s = s;
        st = quantize_linear(r, l, k, -1, r->W, r->H, imp, false);
    }
    return st;
}

// AWQ (and AWQ+GPTQ): the block's fp inputs, the scale and clip search with the quantizer of the writer's
// targets, then every scaled and clipped linear through quantize_linear with H' = H / (s_i s_j) and, for a
// ggml type, the importance of the scaled input. The search's weight set b->ly (the folded norms and v bias
// among it) goes to the writer before the block's linears (llmq_qwriter_put_block).
static enum llmq_status block_awq(struct run *r, int l) {
    int64_t N = r->d.n_seq * r->d.seqlen, D = r->m->hp.n_embd;
    struct llmq_awq_block *b = NULL;
    struct gguf_fq fq = {.qw = r->fq_qw, .blk = r->blk, .n_threads = r->o->n_threads};
    memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float)); // the block's fp input for the search
    enum llmq_status st = block_pass(r, l, r->x, -1, -1); // x <- fp block(x); XᵀX of the fp inputs
    if (!st) st = llmq_awq_block_init(r->m, l, r->o->n_threads, &b);
    struct llmq_awq_opts ao;
    llmq_awq_opts_default(&ao);
    ao.n_threads = r->o->n_threads;
    ao.backend = r->o->backend;
    if (!st) awq_quantizer(r, l, &ao, &fq);
    const double t_search = llmq_now_s();
    if (!st) st = timed(r, S_SEARCH, t_search, llmq_awq_search(b, r->fbig, r->xt, r->d.n_seq, r->d.seqlen, &ao));
    if (!st) credit_data(r, l, -1);
    if (!st && fq.st) st = fq.st;
    if (!st) st = put_block(r, l, &b->ly);
    if (!st && r->m->hp.moe) moe_coverage(r, l);                           // the fp pass's routing
    for (int64_t x = 0; x < r->m->hp.n_expert && r->m->hp.moe && !st; x++) // the scaled, clipped experts
        for (int k = LLMQ_LIN_GATE; k <= LLMQ_LIN_DOWN && !st; k++)
            st = quantize_expert(r, l, k, x, b, llmq_awq_expert_input_scales(b, (enum llmq_linear)k, x));
    if (!st) st = awq_quantize_linears(r, l, b, &fq);
    llmq_awq_block_free(b);
    return st;
}

// AWQ on the block path (quant/awq.h "On the block path"): the fp pass there (its outputs kept, the sums of the four
// inputs, the clip search's sampled rows), the search with its losses there, the linears as block_awq's, then x <- the
// fp block output. The search's own seconds exclude the blocks' (counted as their passes / uploads / sums).
static enum llmq_status block_awq_dev(struct run *r, int l) {
    const int64_t N = r->d.n_seq * r->d.seqlen;
    struct llmq_awq_block *b = NULL;
    struct gguf_fq fq = {.qw = r->fq_qw, .blk = r->blk, .n_threads = r->o->n_threads};
    struct llmq_awq_opts ao;
    llmq_awq_opts_default(&ao);
    ao.n_threads = r->o->n_threads;
    ao.backend = r->o->backend;
    const int64_t step = llmq_awq_sample_step(N, &ao), T = (N + step - 1) / step;
    float *rows[4] = {0};
    const double *sum_abs[4];
    enum llmq_status st = llmq_blocks_load(r->qb, &r->ly, r->o->n_threads);
    for (int g = 0; g < 4 && !st; g++) {
        const int64_t C = r->s.in[(int64_t)l * LLMQ_CALIB_N_SLOTS + g].n_in;
        if (!(rows[g] = malloc((size_t)(T * C) * sizeof(float))))
            st = llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory for AWQ's clip samples (blk.%d)", l);
        sum_abs[g] = r->s.in[(int64_t)l * LLMQ_CALIB_N_SLOTS + g].sum_abs;
    }
    if (!st) st = llmq_blocks_awq_fp(r->qb, l, step, rows, &r->s);
    if (!st) llmq_calib_stats_finish(&r->s, l);
    if (!st) st = llmq_awq_block_init(r->m, l, r->o->n_threads, &b);
    if (!st) awq_quantizer(r, l, &ao, &fq);
    double dev0[3] = {0}, dev1[3] = {0};
    llmq_blocks_times(r->qb, &dev0[0], &dev0[1], &dev0[2]);
    const double t_search = llmq_now_s();
    if (!st) st = llmq_awq_search_blocks(b, r->qb, r->d.n_seq, r->d.seqlen, sum_abs, (const float *const *)rows, &ao);
    llmq_blocks_times(r->qb, &dev1[0], &dev1[1], &dev1[2]);
    r->stage_s[S_SEARCH] += llmq_now_s() - t_search - (dev1[0] + dev1[1] + dev1[2] - dev0[0] - dev0[1] - dev0[2]);
    if (!st) credit_data(r, l, -1);
    if (!st && fq.st) st = fq.st;
    if (!st) st = put_block(r, l, &b->ly);
    if (!st) st = awq_quantize_linears(r, l, b, &fq);
    if (!st) st = llmq_blocks_awq_advance(r->qb); // x <- the fp block output, the next block's input
    llmq_awq_block_free(b);
    for (int g = 0; g < 4; g++) free(rows[g]);
    return st;
}

// ---- the driver ----------------------------------------------------------------------------------------------

static int64_t dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *p = llmq_path_join(dir, de->d_name);
        struct stat sb;
        if (p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) total += (int64_t)sb.st_size;
        free(p);
    }
    closedir(d);
    return total;
}

static json_t *settings_json(const struct llmq_quantize_opts *o) {
    json_t *s = json_object();
    json_object_set_new(s, "llmq_version", json_string(LLMQ_VERSION));
    json_object_set_new(s, "method", json_string(llmq_qmethod_name(o->method)));
    if (o->to_gguf) {
        const struct llmq_gguf_mix_opts *mx = &o->gguf.mix;
        json_object_set_new(s, "format", json_string("gguf"));
        json_object_set_new(s, "gguf_type", json_string(llmq_gguf_ftype_name(mx->ftype)));
        json_object_set_new(s, "pure", json_boolean(mx->pure));
        if (mx->output_type != LLMQ_DTYPE_COUNT)
            json_object_set_new(s, "output_type", json_string(llmq_dtype_name(mx->output_type)));
        if (mx->embedding_type != LLMQ_DTYPE_COUNT)
            json_object_set_new(s, "embedding_type", json_string(llmq_dtype_name(mx->embedding_type)));
        if (llmq_qmethod_uses_gptq(o->method)) {
            json_object_set_new(s, "damp", json_real(o->percdamp));
            json_object_set_new(s, "act_order", json_boolean(o->act_order));
            json_object_set_new(s, "true_sequential", json_boolean(o->method == LLMQ_QMETHOD_GPTQ));
            if (o->gptaq) json_object_set_new(s, "gptaq_alpha", json_real(o->gptaq_alpha));
        }
        return s;
    }
    json_object_set_new(s, "bits", json_integer(o->q.bits));
    json_object_set_new(s, "group_size", json_integer(o->q.group_size));
    json_object_set_new(s, "sym", json_boolean(o->q.sym));
    if (llmq_qmethod_uses_gptq(o->method)) {
        json_object_set_new(s, "damp", json_real(o->percdamp));
        json_object_set_new(s, "act_order", json_boolean(o->act_order));
        json_object_set_new(s, "static_groups", json_boolean(o->static_groups));
        json_object_set_new(s, "act_group_aware", json_boolean(o->group_aware));
        json_object_set_new(s, "true_sequential", json_boolean(o->method == LLMQ_QMETHOD_GPTQ && o->true_sequential));
        if (o->gptq_grid != LLMQ_GPTQ_GRID_MINMAX) // absent by default: the outputs so far keep their bytes
            json_object_set_new(s, "grid", json_string(o->gptq_grid == LLMQ_GPTQ_GRID_MSE ? "mse" : "hmse"));
        if (o->gptaq) // likewise absent by default
            json_object_set_new(s, "gptaq_alpha", json_real(o->gptaq_alpha));
    }
    json_object_set_new(s, "fallback", json_string(o->fallback_rtn_per_channel ? "rtn-per-channel" : "none"));
    json_object_set_new(s, "format", json_string(llmq_export_format_name(o->out.format)));
    if (o->out.expert_names != LLMQ_EXPERT_NAMES_HUB) // absent by default, as the grid
        json_object_set_new(s, "expert_names", json_string(llmq_expert_names_name(o->out.expert_names)));
    return s;
}

// The calibration record. full: the solvers' form; otherwise the subset (source, sha256, tokens per source;
// nsamples, seqlen, seed, tokens_sha256) that rtn-into-GGUF files have carried in their llmq.* keys, kept
// so their bytes stay the same.
static json_t *calib_json(const struct llmq_quantize_opts *o, const struct llmq_calib_data *d, bool full) {
    if (!d->tokens) return json_null();
    json_t *c = json_object(), *srcs = json_array();
    for (int i = 0; i < d->n_src; i++) {
        const struct llmq_calib_source *s = &d->src[i];
        json_t *j = json_object();
        json_object_set_new(j, "source", json_string(s->arg));
        if (full)
            json_object_set_new(j, "kind",
                                json_string(s->kind == LLMQ_CALIB_SELF    ? "self"
                                            : s->kind == LLMQ_CALIB_NAMED ? "named"
                                                                          : "file"));
        if (s->sha256[0]) json_object_set_new(j, "sha256", json_string(s->sha256));
        if (full) json_object_set_new(j, "texts", json_integer(s->n_texts));
        json_object_set_new(j, "tokens", json_integer(s->n_tokens));
        json_array_append_new(srcs, j);
    }
    json_object_set_new(c, "sources", srcs);
    json_object_set_new(c, "nsamples", json_integer(d->n_seq));
    json_object_set_new(c, "seqlen", json_integer(d->seqlen));
    json_object_set_new(c, "seed", json_integer((json_int_t)o->calib.seed));
    if (full) {
        json_object_set_new(c, "tokens", json_integer(d->n_seq * d->seqlen));
        json_object_set_new(c, "stream_tokens", json_integer(d->n_stream_tokens));
    }
    json_object_set_new(c, "tokens_sha256", json_string(d->tokens_sha256));
    return c;
}

// The GGUF options as recorded: the writer-only runs' settings, and the keys a solver run adds after its own.
static json_t *gguf_settings(const struct llmq_quantize_opts *o, const json_t *imatrix) {
    const struct llmq_gguf_mix_opts *mx = &o->gguf.mix;
    json_t *s = json_object(), *tt = json_array();
    for (int i = 0; i < mx->n_overrides; i++) {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s=%s", mx->overrides[i].regex, llmq_dtype_name(mx->overrides[i].type));
        json_array_append_new(tt, json_string(buf));
    }
    json_object_set_new(s, "llmq_version", json_string(LLMQ_VERSION));
    json_object_set_new(s, "method", json_string(llmq_qmethod_name(o->method)));
    json_object_set_new(s, "format", json_string("gguf"));
    json_object_set_new(s, "gguf_type", json_string(llmq_gguf_ftype_name(mx->ftype)));
    json_object_set_new(s, "output_type",
                        mx->output_type == LLMQ_DTYPE_COUNT ? json_null()
                                                            : json_string(llmq_dtype_name(mx->output_type)));
    json_object_set_new(s, "embedding_type",
                        mx->embedding_type == LLMQ_DTYPE_COUNT ? json_null()
                                                               : json_string(llmq_dtype_name(mx->embedding_type)));
    json_object_set_new(s, "pure", json_boolean(mx->pure));
    json_object_set_new(s, "tensor_types", tt);
    if (llmq_qmethod_uses_gptq(o->method)) {
        json_object_set_new(s, "damp", json_real(o->percdamp));
        json_object_set_new(s, "act_order", json_boolean(o->act_order));
    }
    const struct llmq_gguf_export_opts *g = &o->gguf;
    if (g->choose.mode != LLMQ_GGUF_CHOICE_MIX) // absent for llama-quantize's mix: its files keep their bytes
        json_object_set_new(s, "mix", json_string(g->choose.mode == LLMQ_GGUF_CHOICE_QUALITY ? "quality" : "target"));
    if (g->choose.mode == LLMQ_GGUF_CHOICE_TARGET)
        json_object_set_new(s, g->choose.target_bytes ? "target_size" : "target_bpw",
                            g->choose.target_bytes ? json_integer((json_int_t)g->choose.target_bytes)
                                                   : json_real(g->target_bpw));
    if (g->choose.mode != LLMQ_GGUF_CHOICE_MIX && g->choose.sensitivity == LLMQ_GGUF_SENS_MEASURED) {
        json_t *sj = json_object(); // absent for uniform: those files keep their bytes
        json_object_set_new(sj, "windows", json_integer(g->sens.n_windows));
        json_object_set_new(sj, "seqlen", json_integer(g->sens.seqlen));
        json_object_set_new(s, "sensitivity", sj);
    }
    if (g->choose.exclude) {
        json_t *ex = json_array();
        for (int t = 0; t < 64; t++)
            if (g->choose.exclude >> t & 1u)
                json_array_append_new(ex, json_string(llmq_dtype_name((enum llmq_dtype)t)));
        json_object_set_new(s, "mix_exclude", ex);
    }
    if (imatrix) json_object_set(s, "imatrix", (json_t *)imatrix);
    return s;
}

// The provenance of a run, written into the output (GGUF llmq.* keys, the directory's config) and the
// report's "settings": built here only. solvers: a gptq / awq / rtn-into-directory run (settings_json, the
// full calibration record, then the GGUF keys it lacks); otherwise a writer-only GGUF run (gguf_settings,
// then the short calibration record of the statistics it gathered, if any), "threads" when calibration ran
// (it changes the bytes). The caller's own object
// (o->gguf.provenance) fills in what is still missing.
static json_t *provenance(const struct llmq_quantize_opts *o, const struct llmq_calib_data *d, const json_t *imatrix,
                          bool solvers) {
    json_t *p;
    if (solvers) {
        p = settings_json(o);
        json_object_set_new(p, "calibration", calib_json(o, d, true));
        if (o->to_gguf) {
            json_t *g = gguf_settings(o, imatrix);
            json_object_update_missing(p, g);
            json_decref(g);
        }
    } else {
        p = gguf_settings(o, imatrix);
        if (d->tokens) json_object_set_new(p, "calibration", calib_json(o, d, false));
    }
    // --threads orders OpenBLAS's float32 sums in the statistics and the solvers: recorded whenever calibration
    // ran (a run without it, RTN from the weights alone, gives the same bytes whatever the thread count)
    if (d->tokens) json_object_set_new(p, "threads", json_integer(o->n_threads));
    if (o->to_gguf && json_is_object(o->gguf.provenance)) json_object_update_missing(p, (json_t *)o->gguf.provenance);
    return p;
}

// --imatrix: llmq statistics (.lcs) or a llama.cpp imatrix (GGUF or legacy .dat, told apart by
// llmq_calib_imatrix_load); *rec: its provenance record {path, format, sha256}.
static enum llmq_status load_imatrix(const char *path, const struct llmq_model *m, struct llmq_calib_stats *s,
                                     json_t **rec) {
    char magic[8] = {0}, sha[65];
    FILE *f = fopen(path, "rb");
    if (!f) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: cannot open the imatrix", path);
    size_t n = fread(magic, 1, 8, f);
    fclose(f);
    bool lcs = n == 8 && memcmp(magic, "LLMQCALS", 8) == 0;
    enum llmq_status st = lcs ? llmq_calib_stats_load(path, s) : llmq_calib_imatrix_load(path, m, s);
    if (st) return st;
    json_t *j = json_object();
    json_object_set_new(j, "path", json_string(path));
    bool gguf = n >= 4 && memcmp(magic, "GGUF", 4) == 0;
    json_object_set_new(j, "format",
                        json_string(lcs    ? "llmq-stats"
                                    : gguf ? "llama.cpp-imatrix-gguf"
                                           : "llama.cpp-imatrix-dat"));
    if (!llmq_file_sha256(path, sha)) json_object_set_new(j, "sha256", json_string(sha));
    *rec = j;
    return LLMQ_OK;
}

// The calibration windows of o into *d.
static enum llmq_status load_calib(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                   struct llmq_calib_data *d) {
    struct llmq_calib_opts co = o->calib;
    co.n_threads = o->n_threads;
    co.backend = o->backend;
    return llmq_calib_data_load(m, &co, d);
}

// The statistics of the full-precision model on the calibration (the importance llama-imatrix would gather)
// into *d and *s.
static enum llmq_status gather_stats(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                     struct llmq_calib_data *d, struct llmq_calib_stats *s) {
    enum llmq_status st = load_calib(m, o, d);
    if (!st) st = llmq_calib_stats_init(m, false, 0, m->hp.n_layer, s);
    if (st) return st;
    s->backend = o->backend;
    s->max_vram = o->max_vram;
    return llmq_calib_run(m, d, o->n_threads, o->micro_batch, s);
}

static enum llmq_status stream_step(void *ck, int64_t done, int64_t n_tensors, bool synced, uint64_t offset) {
    return llmq_ckpt_stream_step(ck, done, n_tensors, synced, offset);
}

// The writer alone (rtn into GGUF, and every dry run): the importance loaded or gathered (recomputed by a resumed
// run: its inputs are in the fingerprint), then begin (the plan printed for a dry run) and finish, which encodes
// every tensor from the model's views; a real run streams into its checkpoint (quant/checkpoint.h "The writer-only
// run"), continued after its committed tensors with o->resume.
static enum llmq_status run_writer(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                   const struct llmq_calib_stats *imat, const json_t *imat_rec, json_t **report) {
    struct llmq_gguf_export_opts go = o->gguf;
    struct llmq_quantize_shared local = {0}, *sh = o->shared ? o->shared : &local;
    json_t *prov = NULL, *rep = NULL;
    struct llmq_ckpt *ck = NULL;
    enum llmq_status st = LLMQ_OK;
    bool rtn = o->method == LLMQ_QMETHOD_RTN;
    go.imatrix = imat;
    if (!imat && (!rtn || o->calib.n_sources > 0)) {
        // gptq / awq weight the encoders with their statistics, and a dry run gathers none for them: the file
        // gets the imatrix mix (llama-quantize's Q4_0 / Q5_0 / IQ4_* ffn_down choices with --imatrix)
        bool solver_plan = o->gguf.dry_run || !rtn;
        if (solver_plan) go.mix.have_imatrix = true;
        // rtn --calib: gather the importance on the fly (once per sweep); a dry run with a type choice: for the
        // choice only
        if (!solver_plan || o->gguf.choose.mode != LLMQ_GGUF_CHOICE_MIX) {
            if (!sh->have) {
                if ((st = gather_stats(m, o, &sh->d, &sh->s))) goto done;
                sh->have = true;
            } else {
                llmq_info("quantize: importance from the sweep's calibration pass (%lld tokens)",
                          (long long)(sh->d.n_seq * sh->d.seqlen));
            }
        }
        if (sh->have) *(solver_plan ? &go.choice_imatrix : &go.imatrix) = &sh->s;
    }
    if (o->gguf.choose.mode != LLMQ_GGUF_CHOICE_MIX && o->gguf.choose.sensitivity == LLMQ_GGUF_SENS_MEASURED) {
        // the windows of the measured sensitivity (with --imatrix: the calibration is loaded for them only)
        if (!sh->d.tokens && (st = load_calib(m, o, &sh->d))) goto done;
        go.sens_calib = &sh->d;
        go.sens.backend = o->backend;
    }
    prov = provenance(o, &sh->d, imat_rec, false);
    go.provenance = prov;
    go.report = &rep;
    if (go.n_threads < 1) go.n_threads = o->n_threads;
    struct llmq_gguf_export_stream gs = {.sync_bytes = llmq_ckpt_stream_sync_bytes(), .step = stream_step};
    if (o->checkpoint && !o->gguf.dry_run) { // the output streams into its checkpoint (quant/checkpoint.h)
        json_t *fp = llmq_ckpt_fingerprint(m, o, prov);
        st = llmq_ckpt_open_stream(o->out_dir, fp, o->resume, o->gguf.force, &ck, &gs.done, &gs.offset);
        json_decref(fp);
        if (st) goto done;
        gs.part = llmq_ckpt_stream_part(ck);
        gs.user = ck;
        go.stream = &gs;
    }
    struct llmq_qwriter *w = NULL; // rtn: every tensor encoded from the model's views by the writer itself
    if ((st = llmq_qwriter_begin(m, o->out_dir, &(struct llmq_qwriter_opts){.gguf = &go}, &w))) goto done;
    if (o->gguf.dry_run) {
        FILE *f = o->plan ? o->plan : stdout;
        llmq_qwriter_print_plan(w, f);
        fflush(f);
    }
    if ((st = llmq_qwriter_finish(w))) goto done;
    llmq_ckpt_done(ck); // the output is in place
    ck = NULL;
    if (rep && !json_object_get(rep, "settings")) json_object_set(rep, "settings", prov);
    if (report) {
        *report = rep;
        rep = NULL;
    }
done:
    llmq_ckpt_close(ck); // a failure: kept when it holds tensors (the writer left its partial output)
    json_decref(rep);
    json_decref(prov);
    if (st && sh != &local) llmq_quantize_shared_free(sh); // a failed run shares nothing
    llmq_quantize_shared_free(&local);
    return st;
}

void llmq_quantize_shared_free(struct llmq_quantize_shared *sh) {
    if (!sh) return;
    llmq_calib_stats_free(&sh->s);
    llmq_calib_data_free(&sh->d);
    memset(sh, 0, sizeof(*sh));
}

// The directory writer's options for the run; prov: its provenance (NULL for the checks).
static struct llmq_export_opts dir_opts(const struct llmq_quantize_opts *o, const json_t *prov) {
    struct llmq_export_opts eo = o->out;
    eo.q = o->q;
    eo.desc_act = o->act_order;
    eo.static_groups = o->static_groups;
    eo.true_sequential = o->true_sequential;
    eo.damp_percent = o->percdamp;
    eo.provenance = prov;
    return eo;
}

// A TARGET choice's budget against what m's plan can reach (quant/gguf_export.h llmq_gguf_export_target_range).
static enum llmq_status check_target(const struct llmq_model *m, const struct llmq_quantize_opts *o) {
    const struct llmq_gguf_export_opts *g = &o->gguf;
    if (g->choose.mode != LLMQ_GGUF_CHOICE_TARGET) return LLMQ_OK;
    if (!g->choose.target_bytes && !(g->target_bpw > 0))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: a size target needs --target-bpw > 0 or --target-size > 0");
    uint64_t lo = 0, hi = 0;
    int64_t params = 0;
    enum llmq_status st = llmq_gguf_export_target_range(m, g, &lo, &hi, &params);
    if (st) return st;
    double want = g->choose.target_bytes ? 8.0 * (double)g->choose.target_bytes / (double)params : g->target_bpw;
    uint64_t bytes = g->choose.target_bytes ? g->choose.target_bytes : (uint64_t)floor(want * (double)params / 8.0);
    if (bytes < lo)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "quantize: the size target (%llu bytes of tensor data, %.4f bits per weight) is below the "
                           "smallest this model reaches with --gguf-type %s: %llu bytes (%.4f bits per weight: every "
                           "block linear in its smallest type, the other tensors as the mix has them)",
                           (unsigned long long)bytes, want, llmq_gguf_ftype_name(g->mix.ftype), (unsigned long long)lo,
                           8.0 * (double)lo / (double)params);
    if (bytes > hi)
        llmq_warn("quantize: the size target (%.4f bits per weight) is above the largest this model reaches (%.4f): "
                  "every block linear gets its largest type",
                  want, 8.0 * (double)hi / (double)params);
    return LLMQ_OK;
}

enum llmq_status llmq_quantize_check(const struct llmq_model *m, const struct llmq_quantize_opts *o) {
    if (m->hp.moe && o->imatrix_path && o->method != LLMQ_QMETHOD_RTN)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "quantize: %s: --imatrix for a mixture of experts (%s) needs --method rtn (per-expert "
                           "importance from the file); --method %s takes each expert's statistics from --calib",
                           m->path, llmq_arch_name(m->hp.arch), llmq_qmethod_name(o->method));
    if (m->hp.moe && o->gguf.choose.mode != LLMQ_GGUF_CHOICE_MIX &&
        o->gguf.choose.sensitivity == LLMQ_GGUF_SENS_MEASURED)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "quantize: %s: --sensitivity measured is not implemented for a mixture of experts (%s): "
                           "pass --sensitivity uniform (auto means measured for --target-* with --calib)",
                           m->path, llmq_arch_name(m->hp.arch));
    if (o->moe_token_floor < 0) return llmq_errorf(LLMQ_ERR_ARG, "quantize: --moe-token-floor must be >= 0");
    if (o->to_gguf && o->method == LLMQ_QMETHOD_RTN && o->imatrix_path && o->calib.n_sources > 0 &&
        o->gguf.choose.sensitivity != LLMQ_GGUF_SENS_MEASURED) // measured: --calib gives its windows only
        return llmq_errorf(LLMQ_ERR_ARG,
                           "quantize: --imatrix and --calib exclude each other with --method rtn (--calib gathers "
                           "the importance)");
    if (!o->to_gguf && o->imatrix_path) return llmq_errorf(LLMQ_ERR_ARG, "quantize: --imatrix needs --format gguf");
    if (o->to_gguf && o->static_groups)
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --static-groups does not apply to --format gguf (with "
                                         "--act-order the block grids are static already)");
    if (o->gptq_grid != LLMQ_GPTQ_GRID_MINMAX && (o->to_gguf || !llmq_qmethod_uses_gptq(o->method)))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --grid mse / hmse needs --method gptq or awq+gptq and a directory "
                                         "format (gguf blocks take the encoders' own scale searches)");
    if (o->gptaq && o->method != LLMQ_QMETHOD_GPTQ)
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --gptaq needs --method gptq (awq+gptq takes its Hessians from the "
                                         "full-precision model already: its X_fp and X_q are the same)");
    if (o->gptaq && m->hp.moe)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "quantize: --gptaq is not implemented for a mixture of experts (%s): its "
                           "full-precision stream does not carry the experts' inputs",
                           llmq_arch_name(m->hp.arch));
    if (o->gptaq && !(o->gptaq_alpha > 0.0f && isfinite(o->gptaq_alpha)))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --gptaq-alpha must be > 0, got %g", (double)o->gptaq_alpha);
    if ((o->act_order || o->static_groups) && !llmq_qmethod_uses_gptq(o->method))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --act-order and --static-groups need --method gptq or awq+gptq");
    if (o->group_aware &&
        (o->to_gguf || !llmq_qmethod_uses_gptq(o->method) || o->act_order || o->static_groups || o->q.group_size <= 0))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --act-group-aware needs --method gptq or awq+gptq, a group size, "
                                         "not --format gguf, and excludes --act-order and --static-groups");
    enum llmq_status st = llmq_qconfig_check(&o->q, "--bits/--group-size");
    if (st) return st;
    if (o->method != LLMQ_QMETHOD_RTN && o->calib.n_sources == 0)
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --method %s needs calibration data (--calib PATH|NAME|self)",
                           llmq_qmethod_name(o->method));
    if (o->micro_batch < 1) return llmq_errorf(LLMQ_ERR_ARG, "quantize: micro_batch must be >= 1");
    if (!o->to_gguf && o->gguf.choose.mode != LLMQ_GGUF_CHOICE_MIX)
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --mix quality, --target-bpw and --target-size need --format gguf");
    if (o->to_gguf) return check_target(m, o);
    // refuse non-tiled shapes before any work
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v =
                llmq_layer_linear(&m->layers[l], k, m->hp.moe && k >= LLMQ_LIN_GATE ? 0 : -1);
            int64_t R = v->shape[0], C = v->shape[1];
            if (!tiles(&o->q, C) && !o->fallback_rtn_per_channel)
                return llmq_errorf(LLMQ_ERR_ARG,
                                   "quantize: blk.%lld.%s (%lld x %lld): --group-size %d does not tile its %lld input "
                                   "columns; --group-size %d tiles every linear of the model (or use --group-size -1 "
                                   "for per channel, or --fallback rtn-per-channel)",
                                   (long long)l, llmq_linear_gguf_name(k), (long long)R, (long long)C, o->q.group_size,
                                   (long long)C, llmq_export_fit_group(m, o->q.group_size));
        }
    struct llmq_export_opts eo = dir_opts(o, NULL);
    return llmq_qwriter_check(m, &(struct llmq_qwriter_opts){.dir = &eo});
}

// Every linear's shape into *Rmax / *Cmax / r->params_total; a linear stored in a block type is refused unless
// requantizing is allowed (every linear is re-encoded here, into GGUF too: gptq / awq hand their codes over
// even where the type stays).
static enum llmq_status scan_linears(struct run *r, int64_t *Rmax, int64_t *Cmax) {
    const struct llmq_model *m = r->m;
    const struct llmq_quantize_opts *o = r->o;
    *Rmax = *Cmax = 0;
    const int64_t nw = LLMQ_LIN_COUNT + (m->hp.moe ? 3 * m->hp.n_expert : 0);
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int64_t k = 0; k < nw; k++) {
            const struct llmq_tensor_view *v = block_weight(m, l, k);
            if (!v) continue; // a moe block's dense gate / up / down
            int64_t R = v->shape[0], C = v->shape[1];
            *Rmax = R > *Rmax ? R : *Rmax;
            *Cmax = C > *Cmax ? C : *Cmax;
            r->params_total += R * C;
            const struct llmq_dtype_traits *tr = llmq_dtype_traits(v->dtype);
            if (!(o->to_gguf ? o->gguf.allow_requantize : o->allow_requantize) && tr && tr->is_quant)
                return llmq_errorf(LLMQ_ERR_ARG,
                                   "quantize: %s: blk.%lld: %s is already quantized (%s); quantizing it again "
                                   "loses more than quantizing the f32 / f16 original: pass --allow-requantize to do "
                                   "it anyway",
                                   m->path, (long long)l, v->name, llmq_dtype_name(v->dtype));
        }
    return LLMQ_OK;
}

// The work buffers for linears up to (Rmax, Cmax) and N calibration tokens of width D.
static enum llmq_status alloc_buffers(struct run *r, int64_t Rmax, int64_t Cmax, int64_t N, int64_t D) {
    const struct llmq_quantize_opts *o = r->o;
    bool ok = true;
#define ALLOC(p, n)                                                                                                    \
    do {                                                                                                               \
        (p) = malloc((size_t)(n) * sizeof(*(p)));                                                                      \
        ok = ok && (p);                                                                                                \
    } while (0)
    r->n_w = Rmax * Cmax;
    r->n_h = Cmax * Cmax;
    ALLOC(r->W, Rmax * Cmax);
    ALLOC(r->Q, Rmax * Cmax);
    r->n_t = (Rmax < qf_rows(r, Rmax) ? Rmax : qf_rows(r, Rmax)) * Cmax;
    ALLOC(r->T, r->n_t);
    ALLOC(r->H, Cmax * Cmax);
    ALLOC(r->Hx, Cmax * Cmax);
    const int64_t nx = o->gptaq ? 2 : 1; // GPTAQ: x_q and x_fp in one allocation
    if (r->have_calib) {                 // the activations: under --max-memory (common/spill.h)
        ok = ok && (r->x = llmq_big_alloc((size_t)(nx * N * D) * sizeof(float), "quantize: block inputs"));
        if (!r->qb) // the block path's passes never copy x on the host
            ok = ok && (r->xt = llmq_big_alloc((size_t)(N * D) * sizeof(float), "quantize: block inputs (copy)"));
    }
    if (o->method == LLMQ_QMETHOD_GPTQ && !r->qb) // forward.c's passes decode the held results into them
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) ALLOC(r->wq[k], Rmax * Cmax);
    if (r->m->hp.moe) {
        const int64_t E = r->m->hp.n_expert;
        r->exp_held = calloc((size_t)(3 * E), sizeof(*r->exp_held));
        ALLOC(r->under, E);
        ok = ok && r->exp_held;
        r->moe = json_pack("{s:s, s:I, s:I, s:[]}", "calib", o->moe_calib_all ? "all" : "routed", "token_floor",
                           (json_int_t)o->moe_token_floor, "fallback_rtn", (json_int_t)0, "layers");
    }
    if (r->m->hp.moe && (o->method == LLMQ_QMETHOD_AWQ || o->method == LLMQ_QMETHOD_AWQ_GPTQ))
        ALLOC(r->W0, Rmax * Cmax);
    ALLOC(r->imp, Cmax);
    if (ok && o->gptaq && r->have_calib) {
        static const enum llmq_linear first[LLMQ_CALIB_N_SLOTS] = {LLMQ_LIN_Q, LLMQ_LIN_O, LLMQ_LIN_GATE,
                                                                   LLMQ_LIN_DOWN};
        int64_t sum = 0;
        r->xfp = r->x + N * D;
        for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) {
            for (int64_t l = 0; l < r->m->hp.n_layer; l++) {
                int64_t C = r->m->layers[l].w[first[k]]->shape[1];
                r->cin[k] = C > r->cin[k] ? C : r->cin[k];
            }
            sum += r->cin[k];
            ALLOC(r->dxx[k], r->cin[k] * r->cin[k]);
        }
        ok = ok && (r->fpin = llmq_big_alloc((size_t)(N * sum) * sizeof(float), "quantize: gptaq fp inputs"));
        for (int k = 0, off = 0; ok && k < LLMQ_CALIB_N_SLOTS; off += (int)r->cin[k], k++)
            r->fpin_slot[k] = r->fpin + N * off;
        ALLOC(r->dscr, LLMQ_GRAM_MICRO_BATCH * Cmax + Cmax * Cmax);
        ALLOC(r->Dcur, Cmax * Cmax);
    }
    if (o->to_gguf) {
        ALLOC(r->blk, 4 * Rmax * Cmax); // 4 bytes per element hold any type (F32 is the widest)
        ALLOC(r->fq_qw, Cmax);
        for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) ALLOC(r->simp[k], Cmax);
    }
#undef ALLOC
    return ok ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory for the work buffers");
}

// The forward objects and block 0's input x = the embeddings of the N calibration tokens.
static enum llmq_status embed_inputs(struct run *r, int64_t N, int64_t D) {
    const struct llmq_quantize_opts *o = r->o;
    int64_t mb_tokens = o->micro_batch * r->d.seqlen;
    enum llmq_status st = llmq_forward_init(r->m, mb_tokens, o->n_threads, &r->f);
    if (st) return st;
    llmq_forward_set_backend(r->f, o->backend);
    if (r->m->hp.moe) llmq_forward_set_expert_hook(r->f, expert_hook, r);
    if (r->m->hp.moe && (st = llmq_forward_set_expert_source(r->f, expert_source, r))) return st;
    for (int64_t t0 = 0; t0 < N && !st; t0 += mb_tokens) {
        int64_t n = N - t0 < mb_tokens ? N - t0 : mb_tokens;
        st = llmq_forward_embed(r->f, r->d.tokens + t0, n, r->x + t0 * D);
    }
    if (st) return st;
    if (r->xfp) memcpy(r->xfp, r->x, (size_t)(N * D) * sizeof(float)); // GPTAQ: both streams start equal
    if ((o->method == LLMQ_QMETHOD_AWQ || o->method == LLMQ_QMETHOD_AWQ_GPTQ) && !r->qb && // the block path: none
        (st = llmq_forward_init(r->m, N, o->n_threads, &r->fbig)))
        return st;
    if (r->fbig) llmq_forward_set_backend(r->fbig, o->backend);
    return LLMQ_OK;
}

// The writer for the run (a GGUF file or a directory), with the provenance prov.
static enum llmq_status begin_writer(struct run *r, const struct llmq_calib_stats *imat,
                                     const struct llmq_calib_stats *choice, json_t *prov, json_t **gguf_rep) {
    const struct llmq_quantize_opts *o = r->o;
    struct llmq_gguf_export_opts go = o->gguf;
    struct llmq_export_opts eo = dir_opts(o, prov);
    go.imatrix = imat;
    go.choice_imatrix = choice;
    go.mix.have_imatrix = go.mix.have_imatrix || !imat; // the solvers weight the encoders with their statistics
    go.sens_calib = r->have_calib ? &r->d : NULL;
    go.sens.backend = o->backend;
    go.provenance = prov;
    go.report = gguf_rep;
    if (go.n_threads < 1) go.n_threads = o->n_threads;
    struct llmq_qwriter_opts wo = {.dir = o->to_gguf ? NULL : &eo, .gguf = o->to_gguf ? &go : NULL};
    return llmq_qwriter_begin(r->m, o->out_dir, &wo, &r->w);
}

// The ETA's work model: every linear's data and solve cost plus the other tensors' elements.
static void init_eta(struct run *r) {
    const struct llmq_model *m = r->m;
    struct llmq_awq_opts awq_default;
    llmq_awq_opts_default(&awq_default);
    bool awq = r->o->method == LLMQ_QMETHOD_AWQ || r->o->method == LLMQ_QMETHOD_AWQ_GPTQ;
    r->eta_data_weight = awq ? 1.0 + awq_default.n_grid : 1.0;
    r->eta_other = (double)llmq_tensor_nelements(m->tok_embd) +
                   (m->output && m->output != m->tok_embd ? (double)llmq_tensor_nelements(m->output) : 0);
    double work = r->eta_other;
    const int64_t nw = LLMQ_LIN_COUNT + (m->hp.moe ? 3 * m->hp.n_expert : 0);
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int64_t k = 0; k < nw; k++) {
            const struct llmq_tensor_view *v = block_weight(m, l, k);
            if (!v) continue;
            double share = expert_share(r, k < LLMQ_LIN_COUNT ? -1 : 0);
            work += share * cost_data(r, v->shape[0], v->shape[1]) + cost_solve(r, v->shape[0], v->shape[1]);
        }
    r->eta_data_early = r->o->method != LLMQ_QMETHOD_RTN;
    llmq_eta_init(&r->eta, work, llmq_now_s()); // the setup (calibration text, embeddings) is not in the rate
}

// The run's wall time by stage (quant/quantize.h "Profile"): a stderr line (the stages the run had) and the report's
// "profile" object (every stage).
static json_t *profile(struct run *r, double secs) {
    double *t = r->stage_s, sum = 0;
    if (r->qb) llmq_blocks_times(r->qb, &t[S_UPLOAD], &t[S_PASSES], &t[S_SUMS]); // its own, added in
    json_t *j = json_object();
    char line[512];
    size_t n = 0;
    for (int k = 0; k < S_COUNT; k++) {
        sum += t[k];
        json_object_set_new(j, stage_names[k], json_real(t[k]));
        if (t[k] > 0) n += (size_t)snprintf(line + n, sizeof line - n, "%s %.1f s, ", stage_names[k], t[k]);
    }
    json_object_set_new(j, "other", json_real(secs - sum));
    json_object_set_new(j, "total", json_real(secs));
    llmq_info("quantize: time by stage: %sother %.1f s (total %.1f s)", line, secs - sum, secs);
    return j;
}

// The run's report (the totals line on stderr too).
static json_t *make_report(struct run *r, json_t *prov, json_t *gguf_rep) {
    const struct llmq_quantize_opts *o = r->o;
    double secs = llmq_now_s() - r->t0, bpw = r->bits_total / (double)r->params_total;
    int64_t bytes = 0;
    if (o->to_gguf) {
        struct stat sb;
        if (!o->gguf.dry_run && stat(o->out_dir, &sb) == 0) bytes = (int64_t)sb.st_size;
    } else {
        bytes = dir_bytes(o->out_dir);
    }
    llmq_info("quantize: %lld linears, %.1f M weights, %.3f bits per weight (%s), output %.1f MB in %s, %.1f s",
              (long long)json_array_size(r->layers), (double)r->params_total / 1e6, bpw,
              o->to_gguf ? "the linears' GGUF blocks" : "codes + f16 scales + zeros", (double)bytes / 1e6, o->out_dir,
              secs);
    json_t *rep = json_object();
    json_object_set(rep, "settings", prov);
    json_object_set_new(rep, "model", json_string(r->m->path));
    json_object_set_new(rep, "output", json_string(o->out_dir));
    json_object_set_new(rep, "threads", json_integer(o->n_threads));
    json_object_set(rep, "layers", r->layers);
    json_t *tot = json_object();
    json_object_set_new(tot, "linears", json_integer((json_int_t)json_array_size(r->layers)));
    json_object_set_new(tot, "weights", json_integer(r->params_total));
    json_object_set_new(tot, "bits_per_weight", json_real(bpw));
    json_object_set_new(tot, "output_bytes", json_integer(bytes));
    json_object_set_new(tot, "seconds", json_real(secs));
    json_t *gt = gguf_rep ? json_object_get(gguf_rep, "totals") : NULL;
    if (gt) { // the whole file's figures (as `--method rtn` reports them); the linears' own bits kept apart
        json_object_set_new(tot, "linear_bits_per_weight", json_real(bpw));
        const char *keys[] = {"tensors", "params", "bytes", "bits_per_weight", "file_bytes", "fallbacks"};
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (json_object_get(gt, keys[i])) json_object_set(tot, keys[i], json_object_get(gt, keys[i]));
    }
    json_object_set_new(rep, "totals", tot);
    json_object_set_new(rep, "profile", profile(r, secs));
    if (gguf_rep) json_object_set(rep, "gguf", gguf_rep);
    if (r->moe && r->have_calib) json_object_set(rep, "moe", r->moe);
    return rep;
}

static void run_free(struct run *r) {
    llmq_qwriter_abort(r->w);
    llmq_ckpt_close(r->ck);
    json_decref(r->layers);
    llmq_calib_stats_free(&r->s);
    llmq_calib_data_free(&r->d);
    llmq_forward_free(r->fbig);
    llmq_forward_free(r->f);
    llmq_blocks_free(r->qb);
    llmq_gptq_release_device(); // the spare CUDA solve state (kernels/gptq.h)
    for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
        free(r->wq[k]);
        held_free(&r->held[k]);
    }
    for (int64_t j = 0; r->exp_held && j < 3 * r->m->hp.n_expert; j++) held_free(&r->exp_held[j]);
    free(r->exp_held);
    free(r->under);
    json_decref(r->moe);
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) free(r->simp[k]);
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) free(r->dxx[k]);
    llmq_big_free(r->fpin);
    free(r->dscr);
    free(r->Dcur);
    free(r->blk);
    free(r->imp);
    free(r->fq_qw);
    free(r->W0);
    llmq_big_free(r->x);
    llmq_big_free(r->xt);
    free(r->W);
    free(r->Q);
    free(r->T);
    free(r->H);
    free(r->Hx);
}

// The checkpoint of the run (quant/checkpoint.h), and with --resume the blocks it holds replayed into the writer,
// the activations restored and the replayed work taken out of the ETA: *l0 the first block left to compute.
static enum llmq_status open_checkpoint(struct run *r, const json_t *prov, int64_t N, int64_t *l0) {
    const struct llmq_quantize_opts *o = r->o;
    json_t *fp = llmq_ckpt_fingerprint(r->m, o, prov);
    enum llmq_status st = llmq_ckpt_open(o->out_dir, fp, o->resume, o->to_gguf ? o->gguf.force : o->out.force,
                                         r->m->hp.n_layer, &r->ck, l0);
    json_decref(fp);
    if (st || *l0 == 0) return st;
    st = llmq_ckpt_replay(r->ck, r->m, r->w, r->layers, r->moe, &r->bits_total, r->have_calib ? r->x : NULL,
                          (r->xfp ? 2 : 1) * N * r->m->hp.n_embd); // GPTAQ: x_q, then x_fp
    double replayed = r->eta_other;
    const int64_t nw = LLMQ_LIN_COUNT + (r->m->hp.moe ? 3 * r->m->hp.n_expert : 0);
    for (int64_t l = 0; l < *l0; l++)
        for (int64_t k = 0; k < nw; k++) { // as init_eta counts them
            const struct llmq_tensor_view *v = block_weight(r->m, l, k);
            if (!v) continue;
            replayed += expert_share(r, k < LLMQ_LIN_COUNT ? -1 : 0) * cost_data(r, v->shape[0], v->shape[1]) +
                        cost_solve(r, v->shape[0], v->shape[1]);
        }
    if (replayed < r->eta.total) llmq_eta_init(&r->eta, r->eta.total - replayed, llmq_now_s());
    r->eta_other = 0;
    return st;
}

const char *llmq_quantize_block_refusal(const struct llmq_quantize_opts *o) {
    if (o->method == LLMQ_QMETHOD_GPTQ && o->gptaq) return "GPTAQ's full-precision stream is not on the block path";
    return "";
}

struct llmq_blocks_opts llmq_quantize_block_opts(const struct llmq_quantize_opts *o) {
    return (struct llmq_blocks_opts){.who = "quantize",
                                     .env = "LLMQ_QUANT_BLOCK",
                                     .backend = o->backend,
                                     .micro_batch = o->micro_batch,
                                     .max_vram = o->max_vram,
                                     .gram = true,
                                     .hessians = true,
                                     .awq = o->method == LLMQ_QMETHOD_AWQ || o->method == LLMQ_QMETHOD_AWQ_GPTQ,
                                     .refusal = llmq_quantize_block_refusal(o)};
}

// The solvers' run: block by block, each linear through its method and into the writer.
static enum llmq_status run_solvers(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                    const struct llmq_calib_stats *imat, const json_t *imat_rec, json_t **report) {
    struct run r = {.m = m, .o = o, .want_slot = -1};
    struct llmq_calib_stats cs = {0}; // the type choice's importance (quant/gguf_export.h), or none
    json_t *prov = NULL, *gguf_rep = NULL;
    int64_t Rmax, Cmax, N = 0, D = m->hp.n_embd;
    enum llmq_status st = scan_linears(&r, &Rmax, &Cmax);
    if (st) return st;
    r.layers = json_array();
    r.t0 = llmq_now_s();
    if (o->calib.n_sources > 0) {
        struct llmq_calib_opts co = o->calib;
        co.n_threads = o->n_threads;
        co.backend = o->backend;
        if ((st = llmq_calib_data_load(m, &co, &r.d))) goto done;
        r.have_calib = true;
        N = r.d.n_seq * r.d.seqlen;
        llmq_info("quantize: calibration %lld x %lld tokens (sha256 %s)", (long long)r.d.n_seq, (long long)r.d.seqlen,
                  r.d.tokens_sha256);
    }
    const struct llmq_blocks_opts bo = llmq_quantize_block_opts(o);
    if (r.have_calib && (st = llmq_blocks_open(m, &r.d, &bo, &r.qb))) goto done;
    if ((st = alloc_buffers(&r, Rmax, Cmax, N, D))) goto done;
    if (r.have_calib && (st = embed_inputs(&r, N, D))) goto done;
    prov = provenance(o, &r.d, imat_rec, true);
    if (o->to_gguf && !imat && o->gguf.choose.mode != LLMQ_GGUF_CHOICE_MIX) {
        // the type choice weighs each tensor's error with the full-precision model's importance
        if ((st = llmq_calib_stats_init(m, false, 0, m->hp.n_layer, &cs))) goto done;
        cs.backend = o->backend;
        cs.max_vram = o->max_vram;
        if ((st = llmq_calib_run(m, &r.d, o->n_threads, o->micro_batch, &cs))) goto done;
    }
    r.stage_s[S_CALIB] += llmq_now_s() - r.t0; // the windows, the embeddings, the type choice's statistics
    double t0 = llmq_now_s();
    if ((st = timed(&r, S_WRITE, t0, begin_writer(&r, imat, cs.in ? &cs : NULL, prov, &gguf_rep)))) goto done;
    init_eta(&r);
    int64_t l0 = 0;
    t0 = llmq_now_s();
    if (o->checkpoint && (st = timed(&r, S_CKPT, t0, open_checkpoint(&r, prov, N, &l0)))) goto done;
    t0 = llmq_now_s();
    if (r.qb && (st = timed(&r, S_CALIB, t0, llmq_blocks_put_x(r.qb, r.x)))) goto done; // the embeddings, or resumed
    for (int l = (int)l0; l < m->hp.n_layer && !st; l++) {
        size_t row0 = json_array_size(r.layers), moe0 = json_array_size(json_object_get(r.moe, "layers"));
        if (r.have_calib) {
            llmq_calib_stats_free(&r.s);
            if ((st = llmq_calib_stats_init(m, !r.qb, l, l + 1, &r.s))) break; // the block path: H from the block
            r.s.backend = o->backend;
        }
        r.ly = m->layers[l]; // the block's weight set: the model's until a method rebinds it
        if (m->hp.moe) moe_bind(&r, l);
        switch (o->method) {
        case LLMQ_QMETHOD_RTN: st = block_rtn(&r, l); break;
        case LLMQ_QMETHOD_GPTQ: st = r.qb ? block_gptq_dev(&r, l) : block_gptq(&r, l); break;
        default: st = r.qb ? block_awq_dev(&r, l) : block_awq(&r, l); break;
        }
        if (!st && r.gemm_st) st = r.gemm_st;
        t0 = llmq_now_s();
        if (!st && r.ck && r.qb) st = llmq_blocks_get_x(r.qb, r.x); // the activations the checkpoint keeps
        if (!st && r.ck)
            st = llmq_ckpt_commit_block(r.ck, l, r.layers, row0, r.bits_total, r.moe, moe0, r.have_calib ? r.x : NULL,
                                        (r.xfp ? 2 : 1) * N * D);
        if (r.ck) st = timed(&r, S_CKPT, t0, st);
        for (int64_t k = 0; !st && k < LLMQ_LIN_COUNT + (m->hp.moe ? 3 * m->hp.n_expert : 0); k++) {
            const struct llmq_tensor_view *v = block_weight(m, l, k); // done: release their file pages
            if (v) llmq_mmap_release(v->data, v->nbytes);
        }
    }
    if (st) goto done;
    t0 = llmq_now_s();
    st = timed(&r, S_WRITE, t0, llmq_qwriter_finish(r.w));
    r.w = NULL;
    if (!st) llmq_ckpt_done(r.ck); // the output is in place: the checkpoint has done its job
    if (!st) r.ck = NULL;
    if (!st && report) *report = make_report(&r, prov, gguf_rep);
done:
    json_decref(gguf_rep);
    json_decref(prov);
    llmq_calib_stats_free(&cs);
    run_free(&r);
    return st;
}

// Every linear weight is finite, else one refusal naming the tensor and its first bad element, the same for
// every method and format and before any work (a NaN would otherwise surface as a solver's, a calibration
// pass's or no error at all: ggml's encoders write a NaN as a finite code). One pass over the weights.
// Weight j of block l for the finiteness check: its linears, then (moe) each expert's gate, up, down; NULL for none.
static const struct llmq_tensor_view *block_weight(const struct llmq_model *m, int64_t l, int64_t j) {
    const struct llmq_layer *L = &m->layers[l];
    if (j < LLMQ_LIN_COUNT) return L->w[j];
    return L->exps && j - LLMQ_LIN_COUNT < 3 * m->hp.n_expert ? L->exps[j - LLMQ_LIN_COUNT] : NULL;
}

// The name of block_weight(m, l, j) = v in messages: "blk.L.attn_q.weight", an expert's "<its tensor> expert X".
static const char *weight_label(const struct llmq_model *m, int64_t l, int64_t j, const struct llmq_tensor_view *v,
                                char *buf, size_t size) {
    if (j < LLMQ_LIN_COUNT)
        snprintf(buf, size, "blk.%lld.%s.weight", (long long)l, llmq_linear_gguf_name((enum llmq_linear)j));
    else if (m->from_gguf) // a slice of the stacked tensor
        snprintf(buf, size, "%s expert %lld", v->name, (long long)((j - LLMQ_LIN_COUNT) / 3));
    else
        snprintf(buf, size, "%s", v->name);
    return buf;
}

static enum llmq_status check_finite_weights(const struct llmq_model *m, int n_threads) {
    char nm[192];
    int64_t max = 0, nw = LLMQ_LIN_COUNT + (m->hp.moe ? 3 * m->hp.n_expert : 0);
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int64_t j = 0; j < nw; j++) {
            const struct llmq_tensor_view *v = block_weight(m, l, j);
            if (v) max = v->shape[0] * v->shape[1] > max ? v->shape[0] * v->shape[1] : max;
        }
    float *W = malloc((size_t)max * sizeof(float)); // (R, C) of one linear at a time
    if (!W) return llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory for a %lld-element weight", (long long)max);
    enum llmq_status st = LLMQ_OK;
    for (int64_t l = 0; !st && l < m->hp.n_layer; l++)
        for (int64_t j = 0; !st && j < nw; j++) {
            const struct llmq_tensor_view *v = block_weight(m, l, j);
            if (!v) continue;
            int64_t C = v->shape[1], n = v->shape[0] * C;
            if ((st = llmq_model_weight_f32(v, W, n_threads))) break;
            llmq_mmap_release(v->data, v->nbytes); // read again when its block comes
            for (int64_t i = 0; i < n; i++)
                if (!isfinite(W[i])) {
                    st = llmq_errorf(LLMQ_ERR_NUMERIC,
                                     "quantize: %s: %s: element [%lld, %lld] (index %lld) is %s: non-finite weights "
                                     "are refused",
                                     m->path, weight_label(m, l, j, v, nm, sizeof nm), (long long)(i / C),
                                     (long long)(i % C), (long long)i,
                                     isnan(W[i]) ? "NaN"
                                     : W[i] > 0  ? "+Inf"
                                                 : "-Inf");
                    break;
                }
        }
    free(W);
    return st;
}

// A dry run of any format (quant/plan.h): the GGUF writer's plan table where the output is GGUF, then the
// preflight plan on o->plan (NULL: stdout) and as the report's "preflight"; nothing is written.
static enum llmq_status dry_run(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                const struct llmq_calib_stats *imat, const json_t *imat_rec, json_t **report) {
    struct llmq_quantize_opts od = *o;
    json_t *rep = NULL;
    enum llmq_status st = LLMQ_OK;
    od.gguf.dry_run = od.dry_run = true;
    if (o->to_gguf) {
        st = run_writer(m, &od, imat, imat_rec, &rep);
    } else {
        rep = json_object();
        json_object_set_new(rep, "settings", settings_json(o));
        json_object_set_new(rep, "model", json_string(m->path));
        json_object_set_new(rep, "output", o->out_dir ? json_string(o->out_dir) : json_null());
        json_object_set_new(rep, "dry_run", json_true());
    }
    struct llmq_plan p;
    struct llmq_plan_opts po = {.timed = true, .gguf_report = rep, .checkpoint = llmq_plan_writes_checkpoint(o)};
    if (!st && !(st = llmq_plan_build(m, &od, &po, &p))) {
        FILE *f = o->plan ? o->plan : stdout;
        llmq_plan_print(&p, f);
        fflush(f);
        json_object_set_new(rep, "preflight", llmq_plan_json(&p));
        llmq_plan_free(&p);
    }
    if (!st && report) {
        *report = rep;
        rep = NULL;
    }
    json_decref(rep);
    return st;
}

enum llmq_status llmq_quantize_run(const struct llmq_model *m, const struct llmq_quantize_opts *o, json_t **report) {
    if (report) *report = NULL;
    enum llmq_status st = llmq_quantize_check(m, o);
    if (st) return st;
    const bool dry = o->dry_run || (o->to_gguf && o->gguf.dry_run);
    if (!dry && (st = llmq_plan_preflight(m, o))) return st; // free space, before any work
    if (!dry && (st = check_finite_weights(m, o->n_threads))) return st;
    openblas_set_num_threads(o->n_threads);
    struct llmq_calib_stats imat = {0};
    json_t *imat_rec = NULL;
    if (o->to_gguf && o->imatrix_path && (st = load_imatrix(o->imatrix_path, m, &imat, &imat_rec))) return st;
    const struct llmq_calib_stats *ip = imat_rec ? &imat : NULL;
    if (dry)
        st = dry_run(m, o, ip, imat_rec, report);
    else if (o->to_gguf && o->method == LLMQ_QMETHOD_RTN)
        st = run_writer(m, o, ip, imat_rec, report);
    else
        st = run_solvers(m, o, ip, imat_rec, report);
    json_decref(imat_rec);
    llmq_calib_stats_free(&imat);
    return st;
}
