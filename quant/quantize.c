/*
 * quant/quantize.c — the `llmq quantize` pipeline (quant/quantize.h documents the contract).
 * Legend: R rows/out, C cols/in, G group size, N calibration tokens, D n_embd.
 */
#include "quant/quantize.h"

#include "calib/model/forward.h"
#include "common/eta.h"
#include "common/io.h"
#include "common/log.h"
#include "common/spill.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"
#include "kernels/gemm.h"
#include "quant/awq.h"
#include "quant/gptq.h"
#include "quant/gptq_gguf.h"

#include <cblas.h>
#include <dirent.h>
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
    o.micro_batch = 8;
    o.n_threads = 1;
    o.calib.nsamples = 128;
    o.calib.seqlen = 512;
    o.out = llmq_export_default_opts();
    o.gguf = llmq_gguf_export_default_opts();
    return o;
}

// ---- the run's state -------------------------------------------------------------------------------

struct run {
    struct llmq_model *m;
    const struct llmq_quantize_opts *o;
    struct llmq_export *e;
    struct llmq_gguf_export *ge; // to_gguf: the GGUF writer (e is NULL then)
    struct llmq_forward *f;      // micro-batch forward (micro_batch * seqlen tokens)
    struct llmq_forward *fbig;   // AWQ: all N tokens
    struct llmq_calib_data d;
    struct llmq_calib_stats s; // statistics of the current block only
    bool have_calib;
    int want_slot;             // hook filter: -1 all, else one slot
    float *x;                  // (N, D) block input (x_q for gptq, x_fp otherwise)
    float *xt;                 // (N, D) scratch copy for the extra passes / AWQ's search input
    float *W;                  // (Rmax, Cmax) the weight handed to a solver
    float *Q;                  // (Rmax, Cmax) dequantized result / RTN comparison
    float *H;                  // (Cmax, Cmax) Hessian given to GPTQ (destroyed)
    float *Hx;                 // (Cmax, Cmax) XᵀX kept for the error
    float *T;                  // (Rmax, Cmax) product scratch
    enum llmq_status gemm_st;  // first failed product of rel_err (it returns NaN then); checked per block
    float *wq[LLMQ_LIN_COUNT]; // (R, C) dequantized weights of the current block (gptq overrides)
    struct llmq_tensor_view ov[LLMQ_LIN_COUNT];
    const struct llmq_tensor_view *saved[LLMQ_LIN_COUNT];
    bool overridden[LLMQ_LIN_COUNT];
    struct llmq_qlinear held; // AWQ: block l-1's down, handed to the writer once block l is bound (see block_awq)
    int held_layer;           // -1: none
    // to_gguf only
    uint8_t *blk;                    // (Rmax, Cmax * 4 bytes) one linear's encoded rows
    float *imp;                      // (Cmax) importance handed to the encoder / solver
    float *simp[LLMQ_CALIB_N_SLOTS]; // (Cmax) AWQ: importance of each block input (mean x² of the fp input)
    float *fq_qw;                    // (Cmax) AWQ search: importance of the scaled input
    json_t *layers;
    double t0;
    int64_t params_total;
    struct llmq_eta eta;    // over the block loop; work units: cost_data + cost_solve per linear
    bool eta_data_early;    // the method credits cost_data after its block passes, not per report
    double eta_data_weight; // block passes per linear's data work: 1, AWQ 1 + n_grid (its scale search)
    double eta_other;       // work of the other tensors (embeddings, output head: their elements), which
                            // the writer streams out before block 0's linears; credited at the first report
    double bits_total;      // Σ bits of codes + scales (f16) + zeros
};

static void hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    struct run *r = user;
    if (r->want_slot >= 0 && llmq_calib_slot_of(which) != r->want_slot) return;
    llmq_calib_stats_hook(&r->s, layer, which, in, n, n_in);
}

// Runs block l over buf (N, D) in micro-batches (in place), statistics for want_slot (-2: none).
static enum llmq_status block_pass(struct run *r, int l, float *buf, int want_slot) {
    int64_t D = r->m->hp.n_embd, mb = r->o->micro_batch, L = r->d.seqlen;
    r->want_slot = want_slot;
    for (int64_t s0 = 0; s0 < r->d.n_seq; s0 += mb) {
        int64_t ns = r->d.n_seq - s0 < mb ? r->d.n_seq - s0 : mb;
        r->s.n_seq_hint = ns;
        enum llmq_status st = llmq_forward_block(r->f, l, buf + s0 * L * D, ns, L, want_slot == -2 ? NULL : hook, r);
        if (!st) st = r->s.err;
        if (st) return st;
    }
    llmq_calib_stats_finish(&r->s, l);
    return LLMQ_OK;
}

// The statistics of a normed block input without running the whole block (same micro-batches as
// block_pass, same numbers: calib/model/forward.h's sub-block functions reproduce llmq_forward_block bit for bit):
//   ffn == false: RMSNorm(x) * attn_norm, the q/k/v input;
//   ffn == true:  RMSNorm(h) * ffn_norm with h = x + attn(RMSNorm(x) * attn_norm), the gate/up input
//                 (the attention runs with this block's quantized q/k/v/o already in place).
static enum llmq_status norm_pass(struct run *r, int l, bool ffn) {
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
    if (!st) st = llmq_model_weight_f32(r->m->layers[l].attn_norm, wn, 1);
    if (!st) st = llmq_model_weight_f32(r->m->layers[l].ffn_norm, wn + D, 1);
    for (int64_t s0 = 0; !st && s0 < r->d.n_seq; s0 += mb) {
        int64_t ns = r->d.n_seq - s0 < mb ? r->d.n_seq - s0 : mb, n = ns * L;
        const float *x = r->x + s0 * L * D;
        if ((st = llmq_forward_rmsnorm(r->f, x, n, wn, a))) break;
        if (ffn) {
            if ((st = llmq_forward_attn(r->f, l, a, ns, L, b))) break;
            for (int64_t i = 0; i < n * D; i++) b[i] = x[i] + b[i];
            if ((st = llmq_forward_rmsnorm(r->f, b, n, wn + D, a))) break;
        }
        st = llmq_calib_stats_add(&r->s, l, ffn ? LLMQ_CALIB_SLOT_GATE : LLMQ_CALIB_SLOT_Q, a, n, ns);
    }
    if (!st) llmq_calib_stats_finish(&r->s, l);
    free(own);
    free(wn);
    return st;
}

static void restore_overrides(struct run *r, int l) {
    for (int k = 0; k < LLMQ_LIN_COUNT; k++)
        if (r->overridden[k]) {
            r->m->layers[l].w[k] = r->saved[k];
            r->overridden[k] = false;
        }
}

// Σ_r Δ_r H Δ_rᵀ for Δ (R, C), H (C, C) symmetric, in double.
static double quad_form(struct run *r, const float *Dl, const float *H, int64_t R, int64_t C) {
    enum llmq_status st = llmq_gemm_f32(r->o->backend, false, false, R, C, C, 1.0f, Dl, C, H, C, 0.0f, r->T, C);
    if (st) {
        if (!r->gemm_st) r->gemm_st = st;
        return NAN;
    }
    double s = 0;
    for (int64_t i = 0; i < R * C; i++) s += (double)Dl[i] * (double)r->T[i];
    return s;
}

// err = ‖(W - Q) X‖² / ‖W X‖² from Hx, or the weight error when Hx is NULL. Uses r->T; Q is overwritten.
static double rel_err(struct run *r, const float *W, float *Q, const float *Hx, int64_t R, int64_t C) {
    for (int64_t i = 0; i < R * C; i++) Q[i] = W[i] - Q[i];
    if (!Hx) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < R * C; i++) {
            a += (double)Q[i] * Q[i];
            b += (double)W[i] * W[i];
        }
        return b > 0 ? a / b : 0;
    }
    double den = quad_form(r, W, Hx, R, C);
    double num = quad_form(r, Q, Hx, R, C);
    return den > 0 ? num / den : 0;
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

// A per-channel result (G = -1) re-expressed on the G layout: the one (scale, zero) in every group.
static enum llmq_status widen_per_channel(const struct llmq_qlinear *pc, const struct llmq_qconfig *cfg,
                                          struct llmq_qlinear *out) {
    enum llmq_status st = llmq_qlinear_init(pc->R, pc->C, cfg, out);
    if (st) return st;
    memcpy(out->q, pc->q, (size_t)(pc->R * pc->C));
    for (int64_t i = 0; i < pc->R; i++)
        for (int64_t g = 0; g < out->n_groups; g++) {
            out->scales[i * out->n_groups + g] = pc->scales[i];
            out->zeros[i * out->n_groups + g] = pc->zeros[i];
        }
    return LLMQ_OK;
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
        llmq_eta_credit(&r->eta, cost_data(r, v->shape[0], v->shape[1]));
    }
}

// The stderr line and the JSON row of one finished linear; bits: what its storage costs.
// gtype: the GGUF type it was written in (LLMQ_DTYPE_INVALID for the HF formats).
static void report_linear(struct run *r, int l, int k, int64_t R, int64_t C, double bits, const char *how,
                          enum llmq_dtype gtype, double err, bool werr, double loss, double rtn_err, double secs) {
    r->bits_total += bits;
    llmq_eta_credit(&r->eta, cost_solve(r, R, C) + (r->eta_data_early ? 0 : cost_data(r, R, C)) + r->eta_other);
    r->eta_other = 0;
    char eta[32], name[64], extra[96] = "", type[24] = "";
    llmq_eta_format(llmq_eta_remaining(&r->eta, llmq_now_s()), eta, sizeof(eta));
    llmq_linear_full_name(k, l, false, name, sizeof(name));
    if (loss >= 0) snprintf(extra, sizeof(extra), "  loss %.4g  rtn_err %.4e", loss, rtn_err);
    if (gtype != LLMQ_DTYPE_INVALID) snprintf(type, sizeof(type), "%-6s ", llmq_dtype_name(gtype));
    llmq_info("quantize: %-18s %5lld x %-5lld %-9s %s%s %.4e%s  %.2f s  ETA %s", name, (long long)R, (long long)C, how,
              type, werr ? "werr" : "err ", err, extra, secs, eta);
    json_t *row = json_object();
    json_object_set_new(row, "name", json_string(name));
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

// Hands ql to the writer, logs the line, records the JSON row.
static enum llmq_status finish_linear(struct run *r, int l, int k, struct llmq_qlinear *ql, const char *how, double err,
                                      bool werr, double loss, double rtn_err, double secs) {
    bool defer = k == LLMQ_LIN_DOWN && (r->o->method == LLMQ_QMETHOD_AWQ || r->o->method == LLMQ_QMETHOD_AWQ_GPTQ);
    enum llmq_status st = LLMQ_OK;
    if (defer) { // the writer would stream block l+1's input_layernorm right after it: wait for l+1's binding
        LLMQ_ASSERT(r->held_layer < 0);
        r->held = *ql;
        r->held_layer = l;
        memset(ql, 0, sizeof(*ql));
        ql = &r->held;
    } else if ((st = llmq_export_layer(r->e, l, (enum llmq_linear)k, ql))) {
        return st;
    }
    report_linear(r, l, k, ql->R, ql->C,
                  (double)ql->R * (double)ql->C * ql->bits + (double)ql->R * (double)ql->n_groups * (16.0 + ql->bits),
                  how, LLMQ_DTYPE_INVALID, err, werr, loss, rtn_err, secs);
    return LLMQ_OK;
}

static bool tiles(const struct llmq_qconfig *q, int64_t C) { return q->group_size <= 0 || C % q->group_size == 0; }

// W (R, C) of linear k of block l, f32, into r->W.
static enum llmq_status load_weight(struct run *r, int l, int k) {
    return llmq_model_weight_f32(r->m->layers[l].w[k], r->W, r->o->n_threads);
}

// The fallback for a non-tiled C: RTN per output channel, widened to the G layout.
static enum llmq_status quantize_fallback(struct run *r, int l, int k, const char *name, const float *Hx, int64_t R,
                                          int64_t C, struct llmq_qlinear *out) {
    struct llmq_qconfig pc = r->o->q;
    pc.group_size = -1;
    struct llmq_qlinear tmp = {0};
    double t = llmq_now_s();
    enum llmq_status st = llmq_rtn_quantize(name, r->W, R, C, &pc, &tmp);
    if (!st) st = widen_per_channel(&tmp, &r->o->q, out);
    llmq_qlinear_free(&tmp);
    if (st) return st;
    llmq_qlinear_dequant(out, r->Q);
    double err = rel_err(r, r->W, r->Q, Hx, R, C);
    llmq_qlinear_dequant(out, r->Q); // rel_err overwrote Q; keep the dequantized weights for overrides
    return finish_linear(r, l, k, out, "rtn-pc", err, Hx == NULL, -1, 0, llmq_now_s() - t);
}

// ---- RTN ---------------------------------------------------------------------------------------------------

static enum llmq_status block_rtn(struct run *r, int l) {
    enum llmq_status st = LLMQ_OK;
    if (r->have_calib) st = block_pass(r, l, r->x, -1); // fp inputs, only for the reported error
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        const struct llmq_tensor_view *v = r->m->layers[l].w[k];
        int64_t R = v->shape[0], C = v->shape[1];
        char name[64];
        llmq_linear_full_name(k, l, false, name, sizeof(name));
        if ((st = load_weight(r, l, k))) break;
        const float *Hx = NULL;
        if (r->have_calib) {
            int slot = llmq_calib_slot_of((enum llmq_linear)k);
            if ((st = llmq_calib_hessian(&r->s, l, slot, r->Hx))) break;
            Hx = r->Hx;
        }
        struct llmq_qlinear ql = {0};
        if (!tiles(&r->o->q, C)) {
            st = quantize_fallback(r, l, k, name, Hx, R, C, &ql);
        } else {
            double t = llmq_now_s();
            if (!(st = llmq_rtn_quantize(name, r->W, R, C, &r->o->q, &ql))) {
                llmq_qlinear_dequant(&ql, r->Q);
                double err = rel_err(r, r->W, r->Q, Hx, R, C);
                st = finish_linear(r, l, k, &ql, "rtn", err, Hx == NULL, -1, 0, llmq_now_s() - t);
            }
        }
        llmq_qlinear_free(&ql);
    }
    return st;
}

// ---- GPTQ (true-sequential) -------------------------------------------------------------------------------

static enum llmq_status gptq_linear(struct run *r, int l, int k, float *W, const float *Hsrc, struct llmq_qlinear *ql,
                                    const char *how) {
    const struct llmq_tensor_view *v = r->m->layers[l].w[k];
    int64_t R = v->shape[0], C = v->shape[1];
    char name[64];
    llmq_linear_full_name(k, l, false, name, sizeof(name));
    enum llmq_status st;
    memcpy(r->Hx, Hsrc, (size_t)(C * C) * sizeof(float));
    if (!tiles(&r->o->q, C)) return quantize_fallback(r, l, k, name, r->Hx, R, C, ql);
    double t = llmq_now_s();
    // RTN of the same W on the same H, for the comparison column
    struct llmq_qlinear rq = {0};
    if ((st = llmq_rtn_quantize(name, W, R, C, &r->o->q, &rq))) return st;
    llmq_qlinear_dequant(&rq, r->Q);
    llmq_qlinear_free(&rq);
    double rtn_err = rel_err(r, W, r->Q, r->Hx, R, C);
    memcpy(r->Q, W, (size_t)(R * C) * sizeof(float)); // keep the original W for the error
    memcpy(r->H, Hsrc, (size_t)(C * C) * sizeof(float));
    struct llmq_gptq_opts go = llmq_gptq_opts_default();
    go.q = r->o->q;
    go.percdamp = r->o->percdamp;
    go.act_order = r->o->act_order;
    go.static_groups = r->o->static_groups;
    go.group_aware = r->o->group_aware;
    go.backend = r->o->backend; // CUDA: steps 5-7 on the GPU (quant/gptq.h)
    double loss = 0;
    if ((st = llmq_gptq_quantize(name, W, r->H, R, C, &go, ql, &loss, NULL))) return st;
    // W holds Q now and r->Q the original W0: err of (W0 - Q) (W is overwritten, then restored)
    double err = rel_err(r, r->Q, W, r->Hx, R, C);
    llmq_qlinear_dequant(ql, W);
    return finish_linear(r, l, k, ql, how, err, false, loss, rtn_err, llmq_now_s() - t);
}

// ---- GGUF output (to_gguf) ---------------------------------------------------------------------------------

// W (R, C) encoded to t (block type or F32 / F16 / BF16) into r->blk with importance imp (C or NULL), and
// decoded into Q (R, C): exactly the weights the file will hold.
static enum llmq_status gguf_roundtrip(struct run *r, const char *name, enum llmq_dtype t, const float *W, int64_t R,
                                       int64_t C, const float *imp, float *Q) {
    size_t rb = 0;
    if (!llmq_dtype_nbytes(t, C, &rb))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: %s: %lld columns do not tile %s blocks", name, (long long)C,
                           llmq_dtype_name(t));
    enum llmq_status st = llmq_gguf_encode_rows(t, W, r->blk, R, C, imp, r->o->n_threads);
    for (int64_t i = 0; i < R && !st; i++) st = llmq_dequantize_row(t, r->blk + (size_t)i * rb, Q + i * C, C);
    return st;
}

// One linear into the GGUF writer. W (R, C): in, the weights to quantize (AWQ: scaled and clipped); out, the
// decoding of what was handed over (the true-sequential override). Hsrc (C, C): the Hessian of W's input (AWQ:
// scaled), read only (it may be r->H). imp: the encoder's importance (C), NULL = diag(Hsrc). solve: GPTQ onto the
// linear's type (llmq_gptq_gguf_quantize), else the encoder alone (AWQ). When GPTQ's err is not below the
// encoder's (rtn_err, same importance, same H) the encoder's blocks are written instead, the method shows
// "<how>:rtn" and the JSON keeps the rejected "gptq_err". F32 / F16 / BF16 types: handed over as f32 (plain
// conversion by the writer), no solver, method "convert".
static enum llmq_status gguf_linear(struct run *r, int l, int k, float *W, const float *Hsrc, const float *imp,
                                    bool solve, const char *how) {
    const struct llmq_tensor_view *v = r->m->layers[l].w[k];
    const int64_t R = v->shape[0], C = v->shape[1];
    const enum llmq_dtype t = llmq_gguf_export_linear_type(r->ge, l, (enum llmq_linear)k);
    char name[64];
    llmq_linear_full_name(k, l, false, name, sizeof(name));
    size_t rb = 0;
    if (!llmq_dtype_nbytes(t, C, &rb))
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: %s: %lld columns do not tile %s blocks", name, (long long)C,
                           llmq_dtype_name(t));
    const double bits = 8.0 * (double)rb * (double)R;
    memcpy(r->Hx, Hsrc, (size_t)(C * C) * sizeof(float));
    double t0 = llmq_now_s(), loss = -1, rtn_err = 0, err, gptq_err = -1;
    char fallback_how[24];
    snprintf(fallback_how, sizeof(fallback_how), "%s:rtn", how);
    enum llmq_status st;
    if (!llmq_dtype_traits(t)->is_quant) {
        if ((st = llmq_gguf_export_linear_f32(r->ge, l, (enum llmq_linear)k, W))) return st;
        if ((st = gguf_roundtrip(r, name, t, W, R, C, NULL, r->Q))) return st;
        err = rel_err(r, W, r->Q, r->Hx, R, C);
        if ((st = gguf_roundtrip(r, name, t, W, R, C, NULL, W))) return st;
        report_linear(r, l, k, R, C, bits, "convert", t, err, false, -1, 0, llmq_now_s() - t0);
        return LLMQ_OK;
    }
    if (!imp) {
        for (int64_t i = 0; i < C; i++) r->imp[i] = r->Hx[i * C + i];
        imp = r->imp;
    }
    if (solve) {
        // the encoder alone with the same importance, for the comparison column
        if ((st = gguf_roundtrip(r, name, t, W, R, C, imp, r->Q))) return st;
        rtn_err = rel_err(r, W, r->Q, r->Hx, R, C);
        memcpy(r->Q, W, (size_t)(R * C) * sizeof(float)); // keep the original W for the error
        memcpy(r->H, r->Hx, (size_t)(C * C) * sizeof(float));
        struct llmq_gptq_gguf_opts go = llmq_gptq_gguf_opts_default();
        go.percdamp = r->o->percdamp;
        go.n_threads = r->o->n_threads;
        go.act_order = r->o->act_order;
        if ((st = llmq_gptq_gguf_quantize(name, W, r->H, R, C, t, imp, &go, r->blk, &loss, NULL))) return st;
        err = rel_err(r, r->Q, W, r->Hx, R, C); // W := W0 - Q; restored from the blocks below
        if (!(err < rtn_err)) { // the solver lost on its own objective (little data, a strong encoder): keep RTN
            llmq_info("quantize: %s: gptq err %.4e >= rtn_err %.4e: written with the encoder alone", name, err,
                      rtn_err);
            gptq_err = err;
            err = rtn_err;
            how = fallback_how;
            if ((st = gguf_roundtrip(r, name, t, r->Q, R, C, imp, W))) return st;
        }
    } else {
        if ((st = gguf_roundtrip(r, name, t, W, R, C, imp, r->Q))) return st;
        err = rel_err(r, W, r->Q, r->Hx, R, C);
    }
    if ((st = llmq_gguf_export_linear_bytes(r->ge, l, (enum llmq_linear)k, r->blk))) return st;
    for (int64_t i = 0; i < R && !st; i++) st = llmq_dequantize_row(t, r->blk + (size_t)i * rb, W + i * C, C);
    if (st) return st;
    report_linear(r, l, k, R, C, bits, how, t, err, false, loss, rtn_err, llmq_now_s() - t0);
    if (gptq_err >= 0)
        json_object_set_new(json_array_get(r->layers, json_array_size(r->layers) - 1), "gptq_err", json_real(gptq_err));
    return LLMQ_OK;
}

static const int seq_groups[4][3] = {{LLMQ_LIN_Q, LLMQ_LIN_K, LLMQ_LIN_V},
                                     {LLMQ_LIN_O, -1, -1},
                                     {LLMQ_LIN_GATE, LLMQ_LIN_UP, -1},
                                     {LLMQ_LIN_DOWN, -1, -1}};

static enum llmq_status block_gptq(struct run *r, int l) {
    enum llmq_status st = LLMQ_OK;
    int64_t N = r->d.n_seq * r->d.seqlen, D = r->m->hp.n_embd;
    if (!r->o->true_sequential) {
        memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float));
        if ((st = block_pass(r, l, r->xt, -1))) return st;
        credit_data(r, l, -1);
    }
    for (int g = 0; g < 4 && !st; g++) {
        int slot = llmq_calib_slot_of((enum llmq_linear)seq_groups[g][0]);
        if (r->o->true_sequential) {
            if (g == 0 || g == 2)
                st = norm_pass(r, l, g == 2);
            else {
                memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float));
                st = block_pass(r, l, r->xt, slot);
            }
            if (st) break;
            for (int j = 0; j < 3 && seq_groups[g][j] >= 0; j++) credit_data(r, l, seq_groups[g][j]);
        }
        for (int j = 0; j < 3 && !st && seq_groups[g][j] >= 0; j++) {
            int k = seq_groups[g][j];
            const struct llmq_tensor_view *v = r->m->layers[l].w[k];
            int64_t R = v->shape[0], C = v->shape[1];
            if ((st = llmq_model_weight_f32(v, r->wq[k], r->o->n_threads))) break;
            if ((st = llmq_calib_hessian(&r->s, l, slot, r->H))) break;
            float *Hsrc = malloc((size_t)(C * C) * sizeof(float));
            if (!Hsrc) {
                st = llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory");
                break;
            }
            memcpy(Hsrc, r->H, (size_t)(C * C) * sizeof(float));
            struct llmq_qlinear ql = {0};
            memcpy(r->W, r->wq[k], (size_t)(R * C) * sizeof(float));
            if (r->ge) { // importance: the imatrix when given, else diag(H)
                st = gguf_linear(r, l, k, r->W, Hsrc, llmq_gguf_export_linear_importance(r->ge, l, (enum llmq_linear)k),
                                 true, "gptq");
                if (!st) memcpy(r->wq[k], r->W, (size_t)(R * C) * sizeof(float));
            } else {
                st = gptq_linear(r, l, k, r->W, Hsrc, &ql, "gptq");
                if (!st) llmq_qlinear_dequant(&ql, r->wq[k]);
            }
            llmq_qlinear_free(&ql);
            free(Hsrc);
            if (st) break;
            // the quantized weights replace the model's for the following passes of this block
            r->ov[k] = *v;
            r->ov[k].dtype = LLMQ_DTYPE_F32;
            r->ov[k].data = r->wq[k];
            r->ov[k].nbytes = (size_t)(R * C) * sizeof(float);
            r->saved[k] = v;
            r->overridden[k] = true;
            r->m->layers[l].w[k] = &r->ov[k];
        }
    }
    if (!st) st = block_pass(r, l, r->x, -2); // x_q <- quantized block(x_q)
    restore_overrides(r, l);
    return st;
}

// ---- AWQ and AWQ+GPTQ ----------------------------------------------------------------------------------------

static enum llmq_status flush_held(struct run *r) {
    if (r->held_layer < 0) return LLMQ_OK;
    enum llmq_status st = llmq_export_layer(r->e, r->held_layer, LLMQ_LIN_DOWN, &r->held);
    llmq_qlinear_free(&r->held);
    r->held_layer = -1;
    return st;
}

static enum llmq_status block_awq(struct run *r, int l) {
    int64_t N = r->d.n_seq * r->d.seqlen, D = r->m->hp.n_embd;
    bool with_gptq = r->o->method == LLMQ_QMETHOD_AWQ_GPTQ;
    struct llmq_awq_block *b = NULL;
    struct llmq_qlinear ql[LLMQ_LIN_COUNT] = {{0}};
    memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float)); // the block's fp input for the search
    enum llmq_status st = block_pass(r, l, r->x, -1);     // x <- fp block(x); XᵀX of the fp inputs
    if (!st) st = llmq_awq_block_init(r->m, l, r->o->n_threads, &b);
    struct llmq_awq_opts ao;
    llmq_awq_opts_default(&ao);
    ao.bits = r->o->q.bits;
    ao.group_size = r->o->q.group_size;
    ao.n_threads = r->o->n_threads;
    ao.backend = r->o->backend;
    if (!st) st = llmq_awq_search(b, r->fbig, r->xt, r->d.n_seq, r->d.seqlen, &ao);
    if (!st) credit_data(r, l, -1);
    // The writer reads a block's norms (folded by AWQ) when its stream reaches them, which for
    // input_layernorm is right after the previous block's down: so the block is bound (the model's views
    // on the folded copies) before the held down of block l-1 goes out, and stays bound for its linears.
    if (!st) st = llmq_awq_block_bind(b, NULL);
    if (!st) st = flush_held(r);
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        const struct llmq_tensor_view *v = r->m->layers[l].w[k];
        int64_t R = v->shape[0], C = v->shape[1];
        char name[64];
        llmq_linear_full_name(k, l, false, name, sizeof(name));
        memcpy(r->W, b->w[k], (size_t)(R * C) * sizeof(float));
        if ((st = llmq_calib_hessian(&r->s, l, llmq_calib_slot_of((enum llmq_linear)k), r->H))) break;
        llmq_awq_scale_hessian(b, (enum llmq_linear)k, r->H);
        memcpy(r->Hx, r->H, (size_t)(C * C) * sizeof(float));
        if (!tiles(&r->o->q, C)) {
            st = quantize_fallback(r, l, k, name, r->Hx, R, C, &ql[k]);
            continue;
        }
        if (with_gptq) {
            float *Hsrc = malloc((size_t)(C * C) * sizeof(float));
            if (!Hsrc) {
                st = llmq_errorf(LLMQ_ERR_NOMEM, "quantize: out of memory");
                break;
            }
            memcpy(Hsrc, r->H, (size_t)(C * C) * sizeof(float));
            // finish_linear exports; AWQ's folded norms must be bound while the writer reads them
            st = gptq_linear(r, l, k, r->W, Hsrc, &ql[k], "awq+gptq");
            free(Hsrc);
            continue;
        }
        double t = llmq_now_s();
        if ((st = awq_rtn(name, r->W, R, C, &r->o->q, &ql[k]))) break;
        llmq_qlinear_dequant(&ql[k], r->Q);
        double err = rel_err(r, r->W, r->Q, r->Hx, R, C);
        st = finish_linear(r, l, k, &ql[k], "awq", err, false, -1, 0, llmq_now_s() - t);
    }
    if (b && b->bound) {
        enum llmq_status s2 = llmq_awq_block_unbind(b, NULL);
        if (!st) st = s2;
    }
    for (int k = 0; k < LLMQ_LIN_COUNT; k++) llmq_qlinear_free(&ql[k]);
    llmq_awq_block_free(b);
    return st;
}

// AWQ (and AWQ+GPTQ) into GGUF. The search quantizes its candidates with the target type of each linear
// (gguf_fake_quant: encode with the importance of the scaled input, decode), with that type's block as the
// group. Importance: the imatrix when given, else the mean x² of the block's fp inputs (what llama.cpp's
// imatrix would hold for this calibration), divided by s² for the scaled input. The block stays bound (the
// model's views on the folded norms / v / up) until its seventh linear is handed over: the writer reads the
// norms then.
struct gguf_fq {
    enum llmq_dtype type[LLMQ_LIN_COUNT];
    const float *imp[LLMQ_LIN_COUNT]; // (C) importance of the unscaled input, or NULL
    float *qw;                        // (Cmax) importance of the scaled input
    uint8_t *blk;                     // (Rmax, Cmax * 4 bytes) the encoded rows
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

static enum llmq_status block_awq_gguf(struct run *r, int l) {
    int64_t N = r->d.n_seq * r->d.seqlen, D = r->m->hp.n_embd;
    bool with_gptq = r->o->method == LLMQ_QMETHOD_AWQ_GPTQ;
    struct llmq_awq_block *b = NULL;
    struct gguf_fq fq = {.qw = r->fq_qw, .blk = r->blk, .n_threads = r->o->n_threads};
    memcpy(r->xt, r->x, (size_t)(N * D) * sizeof(float)); // the block's fp input for the search
    enum llmq_status st = block_pass(r, l, r->x, -1);     // x <- fp block(x); XᵀX of the fp inputs
    if (!st) st = llmq_awq_block_init(r->m, l, r->o->n_threads, &b);
    struct llmq_awq_opts ao;
    llmq_awq_opts_default(&ao);
    ao.n_threads = r->o->n_threads;
    ao.backend = r->o->backend;
    ao.fake_quant = gguf_fake_quant;
    ao.fake_quant_user = &fq;
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        int slot = llmq_calib_slot_of((enum llmq_linear)k);
        fq.type[k] = llmq_gguf_export_linear_type(r->ge, l, (enum llmq_linear)k);
        fq.imp[k] = llmq_gguf_export_linear_importance(r->ge, l, (enum llmq_linear)k);
        if (!fq.imp[k]) fq.imp[k] = stats_importance(r, l, slot, r->simp[slot]);
        int64_t blck = llmq_dtype_traits(fq.type[k])->blck;
        ao.lin_group_size[k] = blck > 1 ? (int)blck : 32; // F16 / BF16 / F32: any group, nearly lossless
    }
    if (!st) st = llmq_awq_search(b, r->fbig, r->xt, r->d.n_seq, r->d.seqlen, &ao);
    if (!st) credit_data(r, l, -1);
    if (!st && fq.st) st = fq.st;
    if (!st) st = llmq_awq_block_bind(b, NULL);
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        const struct llmq_tensor_view *v = r->m->layers[l].w[k];
        int64_t R = v->shape[0], C = v->shape[1];
        memcpy(r->W, b->w[k], (size_t)(R * C) * sizeof(float));
        if ((st = llmq_calib_hessian(&r->s, l, llmq_calib_slot_of((enum llmq_linear)k), r->H))) break;
        llmq_awq_scale_hessian(b, (enum llmq_linear)k, r->H);
        const float *s = llmq_awq_input_scales(b, (enum llmq_linear)k), *imp = NULL;
        if (fq.imp[k]) {
            for (int64_t c = 0; c < C; c++) r->fq_qw[c] = s ? fq.imp[k][c] / (s[c] * s[c]) : fq.imp[k][c];
            imp = r->fq_qw;
        }
        st = gguf_linear(r, l, k, r->W, r->H, imp, with_gptq, with_gptq ? "awq+gptq" : "awq");
    }
    if (b && b->bound) {
        enum llmq_status s2 = llmq_awq_block_unbind(b, NULL);
        if (!st) st = s2;
    }
    llmq_awq_block_free(b);
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
    }
    json_object_set_new(s, "fallback", json_string(o->fallback_rtn_per_channel ? "rtn-per-channel" : "none"));
    json_object_set_new(s, "format", json_string(llmq_export_format_name(o->out.format)));
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
    if (imatrix) json_object_set(s, "imatrix", (json_t *)imatrix);
    return s;
}

// The provenance of a run, written into the output (GGUF llmq.* keys, the directory's config) and the
// report's "settings": built here only. solvers: a gptq / awq / rtn-into-directory run (settings_json, the
// full calibration record, then the GGUF keys it lacks); otherwise a writer-only GGUF run (gguf_settings,
// then the short calibration record of the statistics it gathered, if any). The caller's own object
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

// The writer alone (rtn into GGUF, and every dry run): the importance loaded or gathered, then
// llmq_gguf_export_rtn or the plan.
static enum llmq_status run_writer(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                   const struct llmq_calib_stats *imat, const json_t *imat_rec, json_t **report) {
    struct llmq_gguf_export_opts go = o->gguf;
    struct llmq_calib_data d = {0};
    struct llmq_calib_stats s = {0};
    json_t *prov = NULL, *rep = NULL;
    enum llmq_status st = LLMQ_OK;
    bool rtn = o->method == LLMQ_QMETHOD_RTN;
    go.imatrix = imat;
    if (!imat && (!rtn || o->calib.n_sources > 0)) {
        if (o->gguf.dry_run || !rtn) {
            // gptq / awq weight the encoders with their statistics, and a dry run gathers none: the file
            // gets the imatrix mix (llama-quantize's Q4_0 / Q5_0 / IQ4_* ffn_down choices with --imatrix)
            go.mix.have_imatrix = true;
        } else { // rtn --calib: gather the importance on the fly
            struct llmq_calib_opts co = o->calib;
            co.n_threads = o->n_threads;
            co.backend = o->backend;
            if ((st = llmq_calib_data_load(m, &co, &d)) || (st = llmq_calib_stats_init(m, false, 0, m->hp.n_layer, &s)))
                goto done;
            s.backend = o->backend;
            if ((st = llmq_calib_run(m, &d, o->n_threads, o->micro_batch, &s))) goto done;
            go.imatrix = &s;
        }
    }
    prov = provenance(o, &d, imat_rec, false);
    go.provenance = prov;
    go.report = &rep;
    if (go.n_threads < 1) go.n_threads = o->n_threads;
    if (o->gguf.dry_run) {
        struct llmq_gguf_export *e = NULL;
        if ((st = llmq_gguf_export_begin(m, o->out_dir, &go, &e))) goto done;
        FILE *f = o->plan ? o->plan : stdout;
        llmq_gguf_export_print_plan(e, f);
        fflush(f);
        if ((st = llmq_gguf_export_finish(e))) goto done;
    } else if ((st = llmq_gguf_export_rtn(m, o->out_dir, &go))) {
        goto done;
    }
    if (rep && !json_object_get(rep, "settings")) json_object_set(rep, "settings", prov);
    if (report) {
        *report = rep;
        rep = NULL;
    }
done:
    json_decref(rep);
    json_decref(prov);
    llmq_calib_stats_free(&s);
    llmq_calib_data_free(&d);
    return st;
}

enum llmq_status llmq_quantize_check(const struct llmq_model *m, const struct llmq_quantize_opts *o) {
    if (o->to_gguf && o->method == LLMQ_QMETHOD_RTN && o->imatrix_path && o->calib.n_sources > 0)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "quantize: --imatrix and --calib exclude each other with --method rtn (--calib gathers "
                           "the importance)");
    if (!o->to_gguf && o->imatrix_path) return llmq_errorf(LLMQ_ERR_ARG, "quantize: --imatrix needs --format gguf");
    if (o->to_gguf && o->static_groups)
        return llmq_errorf(LLMQ_ERR_ARG, "quantize: --static-groups does not apply to --format gguf (with "
                                         "--act-order the block grids are static already)");
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
    if (o->to_gguf) return LLMQ_OK;
    // refuse non-tiled shapes before any work
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v = m->layers[l].w[k];
            int64_t R = v->shape[0], C = v->shape[1];
            if (!tiles(&o->q, C) && !o->fallback_rtn_per_channel)
                return llmq_errorf(LLMQ_ERR_ARG,
                                   "quantize: blk.%lld.%s (%lld x %lld): --group-size %d does not tile its %lld input "
                                   "columns; --group-size %d tiles every linear of the model (or use --group-size -1 "
                                   "for per channel, or --fallback rtn-per-channel)",
                                   (long long)l, llmq_linear_gguf_name(k), (long long)R, (long long)C, o->q.group_size,
                                   (long long)C, llmq_export_fit_group(m, o->q.group_size));
        }
    struct llmq_export_opts eo = o->out;
    eo.q = o->q;
    return llmq_export_check(m, &eo);
}

// Every linear's shape into *Rmax / *Cmax / r->params_total; a linear stored in a block type is refused unless
// requantizing is allowed (every linear is re-encoded here, into GGUF too: gptq / awq hand their codes over
// even where the type stays).
static enum llmq_status scan_linears(struct run *r, int64_t *Rmax, int64_t *Cmax) {
    const struct llmq_model *m = r->m;
    const struct llmq_quantize_opts *o = r->o;
    *Rmax = *Cmax = 0;
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v = m->layers[l].w[k];
            int64_t R = v->shape[0], C = v->shape[1];
            *Rmax = R > *Rmax ? R : *Rmax;
            *Cmax = C > *Cmax ? C : *Cmax;
            r->params_total += R * C;
            const struct llmq_dtype_traits *tr = llmq_dtype_traits(v->dtype);
            if (!(o->to_gguf ? o->gguf.allow_requantize : o->allow_requantize) && tr && tr->is_quant)
                return llmq_errorf(LLMQ_ERR_ARG,
                                   "quantize: %s: blk.%lld.%s.weight is already quantized (%s); quantizing it again "
                                   "loses more than quantizing the f32 / f16 original: pass --allow-requantize to do "
                                   "it anyway",
                                   m->path, (long long)l, llmq_linear_gguf_name(k), llmq_dtype_name(v->dtype));
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
    ALLOC(r->W, Rmax * Cmax);
    ALLOC(r->Q, Rmax * Cmax);
    ALLOC(r->T, Rmax * Cmax);
    ALLOC(r->H, Cmax * Cmax);
    ALLOC(r->Hx, Cmax * Cmax);
    if (r->have_calib) { // the activations: under --max-memory (common/spill.h)
        ok = ok && (r->x = llmq_big_alloc((size_t)(N * D) * sizeof(float), "quantize: block inputs"));
        ok = ok && (r->xt = llmq_big_alloc((size_t)(N * D) * sizeof(float), "quantize: block inputs (copy)"));
    }
    if (o->method == LLMQ_QMETHOD_GPTQ)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) ALLOC(r->wq[k], Rmax * Cmax);
    if (o->to_gguf) {
        ALLOC(r->blk, 4 * Rmax * Cmax); // 4 bytes per element hold any type (F32 is the widest)
        ALLOC(r->imp, Cmax);
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
    for (int64_t t0 = 0; t0 < N && !st; t0 += mb_tokens) {
        int64_t n = N - t0 < mb_tokens ? N - t0 : mb_tokens;
        st = llmq_forward_embed(r->f, r->d.tokens + t0, n, r->x + t0 * D);
    }
    if (st) return st;
    if ((o->method == LLMQ_QMETHOD_AWQ || o->method == LLMQ_QMETHOD_AWQ_GPTQ) &&
        (st = llmq_forward_init(r->m, N, o->n_threads, &r->fbig)))
        return st;
    if (r->fbig) llmq_forward_set_backend(r->fbig, o->backend);
    return LLMQ_OK;
}

// The writer for the run: r->ge (GGUF) or r->e (a directory), with the provenance prov.
static enum llmq_status begin_writer(struct run *r, const struct llmq_calib_stats *imat, json_t *prov,
                                     json_t **gguf_rep) {
    const struct llmq_quantize_opts *o = r->o;
    if (o->to_gguf) {
        struct llmq_gguf_export_opts go = o->gguf;
        go.imatrix = imat;
        go.mix.have_imatrix = go.mix.have_imatrix || !imat; // the solvers weight the encoders with their statistics
        go.provenance = prov;
        go.report = gguf_rep;
        if (go.n_threads < 1) go.n_threads = o->n_threads;
        return llmq_gguf_export_begin(r->m, o->out_dir, &go, &r->ge);
    }
    struct llmq_export_opts eo = o->out;
    eo.q = o->q;
    eo.desc_act = o->act_order;
    eo.static_groups = o->static_groups;
    eo.true_sequential = o->true_sequential;
    eo.damp_percent = o->percdamp;
    eo.provenance = prov;
    return llmq_export_begin(r->m, o->out_dir, &eo, &r->e);
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
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v = m->layers[l].w[k];
            work += cost_data(r, v->shape[0], v->shape[1]) + cost_solve(r, v->shape[0], v->shape[1]);
        }
    r->eta_data_early = r->o->method != LLMQ_QMETHOD_RTN;
    llmq_eta_init(&r->eta, work, llmq_now_s()); // the setup (calibration text, embeddings) is not in the rate
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
    if (gguf_rep) json_object_set(rep, "gguf", gguf_rep);
    return rep;
}

static void run_free(struct run *r) {
    llmq_gguf_export_abort(r->ge);
    llmq_export_abort(r->e);
    llmq_qlinear_free(&r->held);
    json_decref(r->layers);
    llmq_calib_stats_free(&r->s);
    llmq_calib_data_free(&r->d);
    llmq_forward_free(r->fbig);
    llmq_forward_free(r->f);
    for (int k = 0; k < LLMQ_LIN_COUNT; k++) free(r->wq[k]);
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) free(r->simp[k]);
    free(r->blk);
    free(r->imp);
    free(r->fq_qw);
    llmq_big_free(r->x);
    llmq_big_free(r->xt);
    free(r->W);
    free(r->Q);
    free(r->T);
    free(r->H);
    free(r->Hx);
}

// The solvers' run: block by block, each linear through its method and into the writer.
static enum llmq_status run_solvers(struct llmq_model *m, const struct llmq_quantize_opts *o,
                                    const struct llmq_calib_stats *imat, const json_t *imat_rec, json_t **report) {
    struct run r = {.m = m, .o = o, .want_slot = -1, .held_layer = -1};
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
    if ((st = alloc_buffers(&r, Rmax, Cmax, N, D))) goto done;
    if (r.have_calib && (st = embed_inputs(&r, N, D))) goto done;
    prov = provenance(o, &r.d, imat_rec, true);
    if ((st = begin_writer(&r, imat, prov, &gguf_rep))) goto done;
    init_eta(&r);
    for (int l = 0; l < m->hp.n_layer && !st; l++) {
        if (r.have_calib) {
            llmq_calib_stats_free(&r.s);
            if ((st = llmq_calib_stats_init(m, true, l, l + 1, &r.s))) break;
            r.s.backend = o->backend;
        }
        switch (o->method) {
        case LLMQ_QMETHOD_RTN: st = block_rtn(&r, l); break;
        case LLMQ_QMETHOD_GPTQ: st = block_gptq(&r, l); break;
        default: st = r.ge ? block_awq_gguf(&r, l) : block_awq(&r, l); break;
        }
        if (!st && r.gemm_st) st = r.gemm_st;
    }
    if (!st) st = flush_held(&r);
    if (st) goto done;
    if (r.ge) {
        st = llmq_gguf_export_finish(r.ge);
        r.ge = NULL;
    } else {
        st = llmq_export_finish(r.e);
        r.e = NULL;
    }
    if (!st && report) *report = make_report(&r, prov, gguf_rep);
done:
    json_decref(gguf_rep);
    json_decref(prov);
    run_free(&r);
    return st;
}

enum llmq_status llmq_quantize_run(struct llmq_model *m, const struct llmq_quantize_opts *o, json_t **report) {
    if (report) *report = NULL;
    enum llmq_status st = llmq_quantize_check(m, o);
    if (st) return st;
    openblas_set_num_threads(o->n_threads);
    struct llmq_calib_stats imat = {0};
    json_t *imat_rec = NULL;
    if (o->to_gguf && o->imatrix_path && (st = load_imatrix(o->imatrix_path, m, &imat, &imat_rec))) return st;
    const struct llmq_calib_stats *ip = imat_rec ? &imat : NULL;
    if (o->to_gguf && (o->method == LLMQ_QMETHOD_RTN || o->gguf.dry_run))
        st = run_writer(m, o, ip, imat_rec, report);
    else
        st = run_solvers(m, o, ip, imat_rec, report);
    json_decref(imat_rec);
    llmq_calib_stats_free(&imat);
    return st;
}
