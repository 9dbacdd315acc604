/*
 * quant/awq.c — AutoAWQ's per-block search (quant/awq.h has the algorithm and the contracts).
 *
 * Mirrors awq/quantize/quantizer.py of AutoAWQ: _search_best_scale / _compute_best_scale (scale
 * groups, duo scaling, one module forward per ratio), apply_scale (scale_ln_fcs, scale_fc_fc),
 * _search_best_clip / _compute_best_clip and apply_clip; pseudo_quantize_tensor is
 * llmq_quant_params_awq + llmq_quant_code (quant/quantizer.h).
 *
 * How it is fast: every candidate of the scale search is one module forward on the block's f32
 * copies (views point at reused candidate buffers, so no conversion), i.e. one sgemm per linear of
 * the group; the clip search batches, per quant group, all rows of a chunk and all shrink
 * candidates into one dgemm (T, G) x (G, rows * (1 + K)) (double so that the choice does not
 * depend on summation order, which keeps it equal to the numpy port in tests/py/awq_ref.py).
 *
 * Legend: R rows/out, C cols/in, G group size, N tokens, T sampled tokens, K shrink candidates.
 */
#include "quant/awq.h"

#include "calib/blocks.h"
#include "common/log.h"
#include "kernels/awq_clip.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "quant/quantizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CLIP_ROW_CHUNK 256 // weight rows per clip dgemm

static int64_t lin_rows(const struct llmq_awq_block *b, enum llmq_linear l) {
    return b->m->layers[b->layer].w[l]->shape[0];
}
static int64_t lin_cols(const struct llmq_awq_block *b, enum llmq_linear l) {
    return b->m->layers[b->layer].w[l]->shape[1];
}

// The group size the search uses for linear l (C input channels): o->lin_group_size[l] when set
// and tiling C, else o->group_size when it tiles C, else C (one group per row: see "Group sizes that
// do not tile" in quant/awq.h).
static int64_t lin_group(const struct llmq_awq_opts *o, const struct llmq_awq_block *b, enum llmq_linear l) {
    const int64_t C = lin_cols(b, l), Gl = o->lin_group_size[l];
    if (Gl > 0 && C % Gl == 0) return Gl;
    return o->group_size > 0 && C % o->group_size == 0 ? o->group_size : C;
}

static float *alloc_f32(int64_t n) { return n > 0 ? malloc((size_t)n * sizeof(float)) : NULL; }

static void f32_view(struct llmq_tensor_view *v, float *data, int64_t R, int64_t C, const char *name) {
    memset(v, 0, sizeof *v);
    v->dtype = LLMQ_DTYPE_F32;
    v->data = data;
    v->name = name;
    if (R == 1) {
        v->n_dims = 1;
        v->shape[0] = C;
    } else {
        v->n_dims = 2;
        v->shape[0] = R;
        v->shape[1] = C;
    }
    v->nbytes = (size_t)(R * C) * sizeof(float);
}

// ---------------------------------------------------------------------------------------------
// Options, block copies and their weight set
// ---------------------------------------------------------------------------------------------

void llmq_awq_opts_default(struct llmq_awq_opts *o) {
    memset(o, 0, sizeof *o);
    o->bits = 4;
    o->group_size = 128;
    o->n_grid = 20;
    o->duo_scaling = true;
    o->clip = true;
    o->clip_n_grid = 20;
    o->max_shrink = 0.5f;
    o->n_sample_token = 512;
    o->gram_loss = -1;
    o->n_threads = 1;
}

// A moe block's router (and qwen2_moe's shared expert gate) into f32 copies on views (ly.router, ly.shexp_gate;
// b->ly already copied, its exps the model's).
static enum llmq_status copy_router(struct llmq_awq_block *b, const struct llmq_layer *ly, int n_threads) {
    const int64_t E = b->m->hp.n_expert;
    b->E = E;
    b->Fe = b->m->hp.n_ff_exp;
    b->n_threads = n_threads;
    b->s_down = calloc((size_t)E, sizeof *b->s_down);
    b->eclip = calloc((size_t)(3 * E), sizeof *b->eclip);
    if (!b->s_down || !b->eclip || !(b->router = alloc_f32(E * b->D)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the router of layer %d", b->layer);
    enum llmq_status st = llmq_model_weight_f32(ly->router, b->router, n_threads);
    f32_view(&b->vrouter, b->router, E, b->D, ly->router->name);
    b->ly.router = &b->vrouter;
    if (!st && ly->shexp_gate) { // qwen2_moe: the shared expert's gate, scaled with the router
        if (!(b->shg = alloc_f32(b->D)))
            return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the shared expert's gate of layer %d", b->layer);
        st = llmq_model_weight_f32(ly->shexp_gate, b->shg, n_threads);
        f32_view(&b->vshg, b->shg, 1, b->D, ly->shexp_gate->name);
        b->vshg.n_dims = 2; // (1, D) as the model's (a linear's weight, not a norm)
        b->vshg.shape[0] = 1;
        b->vshg.shape[1] = b->D;
        b->ly.shexp_gate = &b->vshg;
    }
    return st;
}

enum llmq_status llmq_awq_block_init(const struct llmq_model *m, int layer, int n_threads,
                                     struct llmq_awq_block **out) {
    *out = NULL;
    if (!m || layer < 0 || layer >= m->hp.n_layer)
        return llmq_errorf(LLMQ_ERR_ARG, "awq: layer %d out of range [0, %lld)", layer,
                           m ? (long long)m->hp.n_layer : 0LL);
    const struct llmq_hparams *hp = &m->hp;
    const struct llmq_layer *ly = &m->layers[layer];
    enum llmq_status st = LLMQ_OK;
    struct llmq_awq_block *b = calloc(1, sizeof *b);
    if (!b) return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory");
    b->m = m;
    b->layer = layer;
    b->D = hp->n_embd;
    b->F = hp->shexp ? hp->n_ff_shexp : hp->n_ff; // qwen2_moe: the shared expert's width
    b->Dq = hp->n_head * hp->head_dim;
    b->Dkv = hp->n_head_kv * hp->head_dim;
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) {
        const struct llmq_tensor_view *w = ly->w[l];
        if (!w) continue; // a moe block's gate / up / down: its experts (never copied); qwen2_moe's: its shared expert
        const int64_t R = w->shape[0], C = w->shape[1];
        if (!(b->w[l] = alloc_f32(R * C))) goto nomem;
        if ((st = llmq_model_weight_f32(w, b->w[l], n_threads))) goto fail;
        f32_view(&b->vw[l], b->w[l], R, C, w->name);
    }
    if (!(b->attn_norm = alloc_f32(b->D)) || !(b->ffn_norm = alloc_f32(b->D))) goto nomem;
    if ((st = llmq_model_weight_f32(ly->attn_norm, b->attn_norm, 1))) goto fail;
    if ((st = llmq_model_weight_f32(ly->ffn_norm, b->ffn_norm, 1))) goto fail;
    f32_view(&b->vattn_norm, b->attn_norm, 1, b->D, ly->attn_norm->name);
    f32_view(&b->vffn_norm, b->ffn_norm, 1, b->D, ly->ffn_norm->name);
    const struct llmq_tensor_view *bias[3] = {ly->bq, ly->bk, ly->bv};
    for (int i = 0; i < 3; i++) {
        if (!bias[i]) continue;
        const int64_t n = i == 0 ? b->Dq : b->Dkv;
        if (!(b->bias[i] = alloc_f32(n))) goto nomem;
        if ((st = llmq_model_weight_f32(bias[i], b->bias[i], 1))) goto fail;
        f32_view(&b->vbias[i], b->bias[i], 1, n, bias[i]->name);
    }
    b->ly = *ly; // the weight set: the model's block with its views on the copies
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) b->ly.w[l] = b->w[l] ? &b->vw[l] : NULL;
    if (hp->moe && (st = copy_router(b, ly, n_threads))) goto fail;
    b->ly.attn_norm = &b->vattn_norm;
    b->ly.ffn_norm = &b->vffn_norm;
    const struct llmq_tensor_view **lb[3] = {&b->ly.bq, &b->ly.bk, &b->ly.bv};
    for (int i = 0; i < 3; i++)
        if (b->bias[i]) *lb[i] = &b->vbias[i];
    *out = b;
    return LLMQ_OK;
nomem:
    st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory copying block %d of %s", layer, m->path);
fail:
    llmq_awq_block_free(b);
    return st;
}

void llmq_awq_block_free(struct llmq_awq_block *b) {
    if (!b) return;
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) {
        free(b->w[l]);
        free(b->clip[l]);
    }
    free(b->attn_norm);
    free(b->ffn_norm);
    for (int i = 0; i < 3; i++) free(b->bias[i]);
    for (int64_t j = 0; b->eclip && j < 3 * b->E; j++) free(b->eclip[j]);
    for (int64_t x = 0; b->s_down && x < b->E; x++) free(b->s_down[x]);
    free(b->eclip);
    free(b->s_down);
    free(b->s_ffn);
    free(b->router);
    free(b->shg);
    for (int g = 0; g < b->n_groups; g++) {
        free(b->groups[g].loss);
        free(b->groups[g].scales);
    }
    free(b);
}

const float *llmq_awq_input_scales(const struct llmq_awq_block *b, enum llmq_linear lin) {
    if (b->s_down && (lin == LLMQ_LIN_GATE || lin == LLMQ_LIN_UP)) return b->w[lin] ? b->s_ffn : NULL; // shared expert
    for (int g = 0; g < b->n_groups; g++)
        for (int i = 0; i < b->groups[g].n_lin; i++)
            if (b->groups[g].lin[i] == lin) return b->groups[g].scales;
    return NULL;
}

const float *llmq_awq_expert_input_scales(const struct llmq_awq_block *b, enum llmq_linear lin, int64_t expert) {
    if (!b->s_down || lin < LLMQ_LIN_GATE || expert < 0 || expert >= b->E) return NULL;
    return lin == LLMQ_LIN_DOWN ? b->s_down[expert] : b->s_ffn;
}

void llmq_awq_scale_hessian(const struct llmq_awq_block *b, enum llmq_linear lin, float *H) {
    const float *s = llmq_awq_input_scales(b, lin); // (C)
    if (!s) return;
    const int64_t C = lin_cols(b, lin);
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) H[i * C + j] = H[i * C + j] / (s[i] * s[j]);
}

// ---------------------------------------------------------------------------------------------
// The quantizer
// ---------------------------------------------------------------------------------------------

// One group of n values (contiguous) fake-quantized: out = (clamp(round(w/scale)+zero) - zero)*scale.
static void pseudo_quantize_group(const float *w, int64_t n, int bits, float *out) {
    float scale, zero;
    llmq_quant_params_awq(w, n, 1, bits, false, &scale, &zero);
    const int maxq = (1 << bits) - 1;
    for (int64_t i = 0; i < n; i++) out[i] = ((float)llmq_quant_code(w[i], scale, zero, maxq) - zero) * scale;
}

void llmq_awq_pseudo_quantize(const float *W, int64_t R, int64_t C, int bits, int group_size, float *Wq) {
    const int64_t G = group_size > 0 && C % group_size == 0 ? group_size : C;
    for (int64_t i = 0; i < R * C; i += G) pseudo_quantize_group(W + i, G, bits, Wq + i);
}

// ---------------------------------------------------------------------------------------------
// Scale search
// ---------------------------------------------------------------------------------------------

// The inputs of the block's linears captured from one fp block forward.
struct captured {
    float *n1;  // (N, D) input of q/k/v
    float *att; // (N, Dq) input of o; NULL when there is no v->o group
    float *n2;  // (N, D) input of gate/up
    float *act; // (N, F) input of down
    int64_t N;
};

static void capture_hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    (void)layer;
    struct captured *c = user;
    float *dst = which == LLMQ_LIN_Q ? c->n1 : which == LLMQ_LIN_O ? c->att : which == LLMQ_LIN_GATE ? c->n2 : c->act;
    if (dst) memcpy(dst, in, (size_t)(n * n_in) * sizeof(float));
}

// sum((a - b)^2) / n, in double.
static double mse(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        s += d * d;
    }
    return s / (double)n;
}

// x_mean (C) = mean_t |x[t, c]| over N rows.
static void compute_x_mean(const float *x, int64_t N, int64_t C, float *x_mean) {
    double *acc = calloc((size_t)C, sizeof(double));
    LLMQ_ASSERT(acc);
    for (int64_t t = 0; t < N; t++)
        for (int64_t c = 0; c < C; c++) acc[c] += fabs((double)x[t * C + c]);
    for (int64_t c = 0; c < C; c++) x_mean[c] = (float)(acc[c] / (double)N);
    free(acc);
}

// w_mean (C): over the rows of all linears of the group, |W| / (group abs-max + 1e-6), averaged
// (each linear's quant groups: lin_group).
// acc (C) += Σ over the rows of W (R, C) of |W| / (its quant group's abs-max + 1e-6), groups of G.
static void w_mean_acc(const float *W, int64_t R, int64_t C, int64_t G, double *acc) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t c0 = 0; c0 < C; c0 += G) {
            const float *w = W + r * C + c0;
            float amax = 0.0f;
            for (int64_t j = 0; j < G; j++) amax = fmaxf(amax, fabsf(w[j]));
            const float den = amax + 1e-6f;
            for (int64_t j = 0; j < G; j++) acc[c0 + j] += (double)(fabsf(w[j]) / den);
        }
}

static void compute_w_mean(struct llmq_awq_block *b, const struct llmq_awq_group *g, const struct llmq_awq_opts *o,
                           float *w_mean) {
    const int64_t C = g->C;
    double *acc = calloc((size_t)C, sizeof(double));
    LLMQ_ASSERT(acc);
    int64_t rows = 0;
    for (int i = 0; i < g->n_lin; i++) {
        const int64_t R = lin_rows(b, g->lin[i]);
        w_mean_acc(b->w[g->lin[i]], R, C, lin_group(o, b, g->lin[i]), acc);
        rows += R;
    }
    for (int64_t c = 0; c < C; c++) w_mean[c] = (float)(acc[c] / (double)rows);
    free(acc);
}

// s (C) for ratio (AutoAWQ _compute_best_scale).
static void ratio_scales(const float *x_mean, const float *w_mean, int64_t C, float ratio, bool duo, float *s) {
    float mx = -INFINITY, mn = INFINITY;
    for (int64_t c = 0; c < C; c++) {
        float v = duo ? powf(x_mean[c], ratio) / (powf(w_mean[c], 1.0f - ratio) + 1e-4f) : powf(x_mean[c], ratio);
        if (v < 1e-4f) v = 1e-4f;
        s[c] = v;
        mx = fmaxf(mx, v);
        mn = fminf(mn, v);
    }
    const float norm = sqrtf(mx * mn);
    for (int64_t c = 0; c < C; c++) {
        float v = s[c] / norm;
        if (isinf(v) || isnan(v)) v = 1.0f;
        s[c] = v;
    }
}

// Wc (R, C) = Q(W * s) / s for linear l of b, columns scaled. tmp: (R, C) scratch for a plugged-in Q.
// The same for any (R, C) weight of linear kind l of block `layer` with group G.
// AutoAWQ's grid: kernels/ops.h llmq_ops_awq_candidate's CPU half, whose device half the block path runs.
static void candidate_of(int layer, enum llmq_linear l, const float *W, int64_t R, int64_t C, int64_t G, const float *s,
                         const struct llmq_awq_opts *opt, float *tmp, float *Wc) {
    if (!opt->fake_quant) {
        llmq_ops_awq_candidate_cpu(W, s, R, C, G, opt->bits, false, Wc);
        return;
    }
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) tmp[r * C + c] = W[r * C + c] * s[c];
    opt->fake_quant(opt->fake_quant_user, layer, l, R, 0, C, s, tmp, Wc);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) Wc[r * C + c] = Wc[r * C + c] / s[c];
}

static void scaled_candidate(const struct llmq_awq_block *b, enum llmq_linear l, const float *W, const float *s,
                             const struct llmq_awq_opts *opt, float *tmp, float *Wc) {
    candidate_of(b->layer, l, W, lin_rows(b, l), lin_cols(b, l), lin_group(opt, b, l), s, opt, tmp, Wc);
}

// Y (N, R) = X (N, C) · W (R, C)^T on backend be (the CPU one with multi-threaded BLAS).
static enum llmq_status gemm_nt(enum llmq_backend be, const float *X, const float *W, int64_t N, int64_t R, int64_t C,
                                float *Y) {
    return llmq_gemm_f32(be, false, true, N, R, C, 1.0f, X, C, W, C, 0.0f, Y, R);
}

struct scale_job {
    struct llmq_awq_block *b;
    struct llmq_forward *f;
    const struct llmq_awq_opts *o;
    const float *in;     // (N, C) the group's input
    const float *fp_out; // (N, D) the inspected module's fp output; NULL for a single-linear group
    float *fp_scratch;   // (N, D) where a single-linear group's fp output goes (output-form loss only)
    int64_t n_seq, seqlen, N;
    float *cand[3]; // candidate weights of the group's linears, each (R_i, C)
    float *tmp;     // (largest R * C) scratch of a plugged-in quantizer
    float *out;     // (N, D) candidate output
    // the block path ("On the block path"): the candidates' losses where the blocks compute, the group input's Σ|x|
    struct llmq_blocks *qb;
    const double *sum_abs; // (C)
};

// G (C, C), full symmetric = XᵀX of X (N, C), accumulated as calibration does (llmq_gram_acc_f64).
static enum llmq_status gram(enum llmq_backend be, const float *X, int64_t N, int64_t C, float *G, float *tmp,
                             double *acc) {
    memset(acc, 0, (size_t)(C * C) * sizeof *acc);
    enum llmq_status st = llmq_gram_acc_f64(be, X, N, C, tmp, acc);
    for (int64_t i = 0; i < C; i++)
        for (int64_t k = i; k < C; k++) G[i * C + k] = G[k * C + i] = (float)acc[i * C + k];
    return st;
}

// The single-linear loss in Gram form: Σ_r ΔW[r]·G·ΔW[r]ᵀ / (N·R), ΔW = Wc - W; dW and T are (R, C) scratch. T = ΔW·G
// is formed LLMQ_BLOCKS_QF_ROWS_CPU rows at a time into one running sum, as calib/blocks.h llmq_blocks_awq_gram_loss
// does on the CPU hook (the same products, so the same bits).
static enum llmq_status gram_loss(enum llmq_backend be, const float *Wc, const float *W, const float *G, int64_t N,
                                  int64_t R, int64_t C, float *dW, float *T, double *loss) {
    for (int64_t i = 0; i < R * C; i++) dW[i] = Wc[i] - W[i];
    enum llmq_status st = LLMQ_OK;
    double sum = 0.0;
    for (int64_t r0 = 0; r0 < R && !st; r0 += LLMQ_BLOCKS_QF_ROWS_CPU) {
        const int64_t n = R - r0 < LLMQ_BLOCKS_QF_ROWS_CPU ? R - r0 : LLMQ_BLOCKS_QF_ROWS_CPU;
        const float *d = dW + r0 * C;
        st = llmq_gemm_f32(be, false, false, n, C, C, 1.0f, d, C, G, C, 0.0f, T, C);
        for (int64_t i = 0; i < n * C && !st; i++) sum += (double)d[i] * (double)T[i];
    }
    *loss = sum / ((double)N * (double)R);
    return st;
}

// The loss of ratio i's candidates (scales s) on the block path: a single linear's in Gram form there (its Δ made there
// for AutoAWQ's grid, on the host from cand - W for a plugged-in quantizer), else the inspected half's with the
// candidates in place of the group's linears (saved before the ratios, restored after them).
static enum llmq_status block_loss(struct scale_job *j, const struct llmq_awq_group *g, const float *s, double *loss) {
    struct llmq_awq_block *b = j->b;
    const struct llmq_awq_opts *o = j->o;
    enum llmq_status st = LLMQ_OK;
    for (int k = 0; k < g->n_lin && !st; k++) {
        const enum llmq_linear l = g->lin[k];
        const int bits = o->bits;
        const int64_t G = lin_group(o, b, l), R = lin_rows(b, l), C = lin_cols(b, l);
        float *wc = NULL;
        if (o->fake_quant) {
            scaled_candidate(b, l, b->w[l], s, o, j->tmp, j->cand[k]);
            wc = j->cand[k];
        }
        if (g->n_lin > 1) {
            st = llmq_blocks_awq_candidate(j->qb, l, s, bits, G, wc);
            continue;
        }
        if (wc)
            for (int64_t i = 0; i < R * C; i++) wc[i] = wc[i] - b->w[l][i]; // gram_loss's dW
        return llmq_blocks_awq_gram_loss(j->qb, l, s, bits, G, wc, loss);
    }
    return st ? st : llmq_blocks_awq_loss(j->qb, g->prev == LLMQ_AWQ_PREV_FFN_NORM, loss);
}

static bool use_gram(const struct llmq_awq_opts *o, const struct llmq_awq_group *g, int64_t N, int64_t R) {
    if (g->prev != LLMQ_AWQ_PREV_V && g->prev != LLMQ_AWQ_PREV_UP) return false;
    if (o->gram_loss >= 0) return o->gram_loss == 1;
    const double C = (double)g->C, direct = (double)o->n_grid * (double)N * (double)R * C;
    return C * C * (double)N / 2.0 + (double)o->n_grid * (double)R * C * C < 0.5 * direct;
}

// The loss of ratio i's candidates (scales s) with forward.c and the host's products: the Gram form (G, dW and T its
// scratch), or the inspected module's output against fp_out.
static enum llmq_status host_loss(struct scale_job *j, const struct llmq_awq_group *g, const float *s, bool by_gram,
                                  const float *G, float *dW, float *T, const float *fp_out, double *loss) {
    struct llmq_awq_block *b = j->b;
    const struct llmq_awq_opts *o = j->o;
    const int64_t C = g->C, N = j->N, D = b->D, R1 = lin_rows(b, g->lin[0]);
    for (int k = 0; k < g->n_lin; k++) {
        const enum llmq_linear l = g->lin[k];
        scaled_candidate(b, l, b->w[l], s, o, j->tmp, j->cand[k]);
        b->vw[l].data = j->cand[k];
    }
    enum llmq_status st;
    if (by_gram)
        st = gram_loss(o->backend, j->cand[0], b->w[g->lin[0]], G, N, R1, C, dW, T, loss);
    else if (g->prev == LLMQ_AWQ_PREV_ATTN_NORM)
        st = llmq_forward_attn(j->f, b->layer, &b->ly, j->in, j->n_seq, j->seqlen, j->out);
    else if (g->prev == LLMQ_AWQ_PREV_FFN_NORM)
        st = llmq_forward_mlp(j->f, b->layer, &b->ly, j->in, N, j->out);
    else
        st = gemm_nt(o->backend, j->in, j->cand[0], N, D, C, j->out);
    for (int k = 0; k < g->n_lin; k++) b->vw[g->lin[k]].data = b->w[g->lin[k]];
    if (!st && !by_gram) *loss = mse(fp_out, j->out, N * D);
    return st;
}

static enum llmq_status search_group(struct scale_job *j, struct llmq_awq_group *g) {
    struct llmq_awq_block *b = j->b;
    const struct llmq_awq_opts *o = j->o;
    const int64_t C = g->C, N = j->N, D = b->D;
    enum llmq_status st = LLMQ_OK;
    const int64_t R1 = lin_rows(b, g->lin[0]);
    const bool single = g->prev == LLMQ_AWQ_PREV_V || g->prev == LLMQ_AWQ_PREV_UP;
    const bool by_gram = j->qb ? single : use_gram(o, g, N, R1); // the block path: the Gram form always
    float *G = NULL, *Gt = NULL, *dW = NULL, *T = NULL;          // Gram form: (C, C) twice, (R1, C) twice
    double *acc = NULL;                                          // (C, C)
    unsigned mask = 0; // the block path: the group's linears, saved for candidates
    bool saved = false;
    float *x_mean = alloc_f32(C), *w_mean = alloc_f32(C), *s = alloc_f32(C);
    g->loss = malloc((size_t)o->n_grid * sizeof(double));
    g->scales = alloc_f32(C);
    if (!x_mean || !w_mean || !s || !g->loss || !g->scales) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory (layer %d)", b->layer);
        goto done;
    }
    if (j->qb)
        for (int64_t c = 0; c < C; c++) x_mean[c] = (float)(j->sum_abs[c] / (double)N); // compute_x_mean's bits
    else
        compute_x_mean(j->in, N, C, x_mean);
    compute_w_mean(b, g, o, w_mean);
    for (int k = 0; k < g->n_lin; k++) mask |= 1u << g->lin[k];
    if (j->qb && !single) {
        if ((st = llmq_blocks_awq_save(j->qb, mask))) goto done;
        saved = true;
    }
    if (by_gram && !j->qb) {
        G = alloc_f32(C * C), dW = alloc_f32(R1 * C), T = alloc_f32(R1 * C), Gt = alloc_f32(C * C);
        acc = malloc((size_t)(C * C) * sizeof *acc);
        if (!G || !dW || !T || !Gt || !acc) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the Gram matrix (layer %d)", b->layer);
            goto done;
        }
        if ((st = gram(o->backend, j->in, N, C, G, Gt, acc))) goto done;
    }
    // The output form of a single-linear group compares with the linear's own fp output, computed
    // here with our sgemm exactly as its candidates are (the Gram form does not need it).
    const float *fp_out = j->fp_out;
    if (!fp_out && !by_gram && !j->qb) {
        if ((st = gemm_nt(o->backend, j->in, b->w[g->lin[0]], N, D, C, j->fp_scratch))) goto done;
        fp_out = j->fp_scratch;
    }

    double best_err = INFINITY;
    g->best = -1;
    for (int i = 0; i < o->n_grid; i++) {
        const float ratio = (float)((double)i / (double)o->n_grid);
        ratio_scales(x_mean, w_mean, C, ratio, o->duo_scaling, s);
        double loss = 0.0;
        if (j->qb) {
            if ((st = block_loss(j, g, s, &loss))) goto done;
        } else if ((st = host_loss(j, g, s, by_gram, G, dW, T, fp_out, &loss))) {
            goto done;
        }
        g->loss[i] = loss;
        if (!isfinite(loss)) {
            st = llmq_errorf(LLMQ_ERR_NUMERIC, "awq: layer %d, scale group of %s: loss %g at ratio %g", b->layer,
                             llmq_linear_name(g->lin[0]), loss, (double)ratio);
            goto done;
        }
        if (loss < best_err) {
            best_err = loss;
            g->best = i;
            memcpy(g->scales, s, (size_t)C * sizeof(float));
        }
    }
    g->ratio = (float)((double)g->best / (double)o->n_grid);
    llmq_info("awq: layer %d %s: ratio %.2f, loss %.6g (ratio 0: %.6g)", b->layer,
              g->prev == LLMQ_AWQ_PREV_ATTN_NORM  ? "attn_norm->q,k,v"
              : g->prev == LLMQ_AWQ_PREV_V        ? "v->o"
              : g->prev == LLMQ_AWQ_PREV_FFN_NORM ? "ffn_norm->gate,up"
                                                  : "up->down",
              (double)g->ratio, g->loss[g->best], g->loss[0]);
done:
    if (saved) {
        enum llmq_status rs = llmq_blocks_awq_restore(j->qb, mask); // the originals back for the next group's passes
        if (!st) st = rs;
    }
    free(T);
    free(dW);
    free(Gt);
    free(G);
    free(acc);
    free(x_mean);
    free(w_mean);
    free(s);
    return st;
}

// apply_scale for one group: prev op /= s, linears' columns *= s (AutoAWQ scale_ln_fcs / scale_fc_fc).
static void apply_scale(struct llmq_awq_block *b, const struct llmq_awq_group *g) {
    const int64_t C = g->C;
    const float *s = g->scales;
    switch (g->prev) {
    case LLMQ_AWQ_PREV_ATTN_NORM:
    case LLMQ_AWQ_PREV_FFN_NORM: {
        float *ln = g->prev == LLMQ_AWQ_PREV_ATTN_NORM ? b->attn_norm : b->ffn_norm;
        for (int64_t c = 0; c < C; c++) ln[c] = ln[c] / s[c];
        break;
    }
    case LLMQ_AWQ_PREV_V:
    case LLMQ_AWQ_PREV_UP: {
        const enum llmq_linear l = g->prev == LLMQ_AWQ_PREV_V ? LLMQ_LIN_V : LLMQ_LIN_UP;
        const int64_t R = lin_rows(b, l), Cp = lin_cols(b, l);
        float *W = b->w[l] + (R - C) * Cp; // the last C rows
        for (int64_t r = 0; r < C; r++)
            for (int64_t c = 0; c < Cp; c++) W[r * Cp + c] = W[r * Cp + c] / s[r];
        if (l == LLMQ_LIN_V && b->bias[2])
            for (int64_t r = 0; r < C; r++) b->bias[2][R - C + r] = b->bias[2][R - C + r] / s[r];
        break;
    }
    }
    for (int k = 0; k < g->n_lin; k++) {
        float *W = b->w[g->lin[k]];
        const int64_t R = lin_rows(b, g->lin[k]);
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) W[r * C + c] = W[r * C + c] * s[c];
    }
}

// ---------------------------------------------------------------------------------------------
// Clip search
// ---------------------------------------------------------------------------------------------

// apply_clip: W (R, C) clamped to ± best (R, C / G), one entry per (row, group of G columns).
static void apply_clip(float *W, int64_t R, int64_t C, int64_t G, const float *best) {
    const int64_t NG = C / G;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            const float mx = best[r * NG + c / G];
            W[r * C + c] = fminf(fmaxf(W[r * C + c], -mx), mx);
        }
}

// The test hook LLMQ_AWQ_CLIP=gram: the CPU runs the clip search as the device does (kernels/awq_clip.h, the
// quadratic form on each group's Gram matrix) instead of the output differences below; unset: the default.
static bool gram_clip_hook(void) {
    const char *v = getenv("LLMQ_AWQ_CLIP");
    return v && strcmp(v, "gram") == 0;
}

// clip_weight on the groups' Gram matrices (kernels/awq_clip.h: on the device with --device cuda), then apply_clip.
static enum llmq_status clip_gram(int layer, enum llmq_linear l, float *W, int64_t R, int64_t C, const float *X,
                                  int64_t T, const struct llmq_awq_opts *o, int64_t G, int K, float *best,
                                  double *err_out) {
    double *err = malloc((size_t)(R * (C / G)) * sizeof(double));
    if (!err || !best) {
        free(err);
        return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the clip search of layer %d %s", layer,
                           llmq_linear_name(l));
    }
    enum llmq_status st = llmq_awq_clip(o->backend, W, R, C, G, X, T, o->bits, K, o->clip_n_grid, best, err);
    double sum = 0.0;
    for (int64_t i = 0; !st && i < R * (C / G); i++) sum += err[i];
    free(err);
    if (st) return st;
    apply_clip(W, R, C, G, best);
    *err_out = sum;
    llmq_debug("awq: layer %d %s: clip search on the groups' Gram matrices (%s)", layer, llmq_linear_name(l),
               o->backend == LLMQ_BACKEND_CUDA ? "cuda" : "cpu");
    return LLMQ_OK;
}

// Clip table best (R, NG) of the weight W (R, C) of linear kind l of block `layer` (carrying the input scales s, or
// NULL) from its sampled, scaled input X (T, C), then apply_clip on W; *err_out the chosen errors' sum.
static enum llmq_status clip_weight(int layer, enum llmq_linear l, float *W, int64_t R, int64_t C, const float *s,
                                    const float *X, int64_t T, const struct llmq_awq_opts *o, int64_t G, float *best,
                                    double *err_out) {
    const int64_t NG = C / G;
    const int K = (int)(o->max_shrink * (float)o->clip_n_grid); // candidates i_s = 0..K-1
    if (!o->fake_quant && K >= 1 && (o->backend == LLMQ_BACKEND_CUDA || gram_clip_hook()))
        return clip_gram(layer, l, W, R, C, X, T, o, G, K, best, err_out);
    const int64_t RC = R < CLIP_ROW_CHUNK ? R : CLIP_ROW_CHUNK;
    enum llmq_status st = LLMQ_OK;
    double *Xg = malloc((size_t)(T * G) * sizeof(double));              // (T, G)
    double *cand = malloc((size_t)(RC * (K + 1) * G) * sizeof(double)); // (RC * (K + 1), G)
    double *out = malloc((size_t)(T * RC * (K + 1)) * sizeof(double));  // (T, RC * (K + 1))
    float *tmp = alloc_f32(2 * RC * G + RC); // (2, RC, G) candidates in / out, (RC) abs-max per row
    if (!Xg || !cand || !out || !tmp || !best) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the clip search of layer %d %s", layer,
                         llmq_linear_name(l));
        goto done;
    }
    double err_sum = 0.0;
    for (int64_t g = 0; g < NG; g++) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < G; j++) Xg[t * G + j] = (double)X[t * C + g * G + j];
        for (int64_t r0 = 0; r0 < R; r0 += RC) {
            const int64_t nr = R - r0 < RC ? R - r0 : RC;
            for (int64_t r = 0; r < nr && !o->fake_quant; r++) {
                const float *w = W + (r0 + r) * C + g * G; // (G)
                float amax = 0.0f;
                for (int64_t j = 0; j < G; j++) amax = fmaxf(amax, fabsf(w[j]));
                double *c0 = cand + r * (K + 1) * G;
                for (int64_t j = 0; j < G; j++) c0[j] = (double)w[j];
                for (int i = 0; i < K; i++) {
                    const float mx = amax * (float)(1.0 - (double)i / (double)o->clip_n_grid), mn = -mx;
                    for (int64_t j = 0; j < G; j++) tmp[j] = fminf(fmaxf(w[j], mn), mx);
                    pseudo_quantize_group(tmp, G, o->bits, tmp + G);
                    for (int64_t j = 0; j < G; j++) c0[(1 + i) * G + j] = (double)tmp[G + j];
                }
            }
            if (o->fake_quant) { // the same candidates, one plugged-in call per shrink step for all nr rows
                float *in = tmp, *q = tmp + RC * G, *amax = tmp + 2 * RC * G;
                for (int64_t r = 0; r < nr; r++) {
                    const float *w = W + (r0 + r) * C + g * G; // (G)
                    amax[r] = 0.0f;
                    for (int64_t j = 0; j < G; j++) {
                        amax[r] = fmaxf(amax[r], fabsf(w[j]));
                        cand[r * (K + 1) * G + j] = (double)w[j];
                    }
                }
                for (int i = 0; i < K; i++) {
                    for (int64_t r = 0; r < nr; r++) {
                        const float *w = W + (r0 + r) * C + g * G;
                        const float mx = amax[r] * (float)(1.0 - (double)i / (double)o->clip_n_grid), mn = -mx;
                        for (int64_t j = 0; j < G; j++) in[r * G + j] = fminf(fmaxf(w[j], mn), mx);
                    }
                    o->fake_quant(o->fake_quant_user, layer, l, nr, g * G, G, s, in, q);
                    for (int64_t r = 0; r < nr; r++)
                        for (int64_t j = 0; j < G; j++) cand[(r * (K + 1) + 1 + i) * G + j] = (double)q[r * G + j];
                }
            }
            const int64_t M = nr * (K + 1);
            if ((st = llmq_gemm_f64(o->backend, false, true, T, M, G, 1.0, Xg, G, cand, G, 0.0, out, M))) goto done;
            for (int64_t r = 0; r < nr; r++) {
                const float *w = W + (r0 + r) * C + g * G;
                float amax = 0.0f;
                for (int64_t j = 0; j < G; j++) amax = fmaxf(amax, fabsf(w[j]));
                double min_err = 1e9;
                float best_max = amax;
                for (int i = 0; i < K; i++) {
                    double e = 0.0;
                    for (int64_t t = 0; t < T; t++) {
                        const double d = out[t * M + r * (K + 1) + 1 + i] - out[t * M + r * (K + 1)];
                        e += d * d;
                    }
                    e /= (double)T;
                    if (e < min_err) {
                        min_err = e;
                        best_max = amax * (float)(1.0 - (double)i / (double)o->clip_n_grid);
                    }
                }
                best[(r0 + r) * NG + g] = best_max;
                err_sum += min_err;
            }
        }
    }
    apply_clip(W, R, C, G, best);
    *err_out = err_sum;
done:
    free(Xg);
    free(cand);
    free(out);
    free(tmp);
    return st;
}

// Clip table of linear l (R, NG) from its sampled, scaled input X (T, C), then apply_clip.
static enum llmq_status search_clip(struct llmq_awq_block *b, enum llmq_linear l, const float *X, int64_t T,
                                    const struct llmq_awq_opts *o, int64_t G) {
    const int64_t R = lin_rows(b, l), C = lin_cols(b, l);
    b->clip_groups[l] = C / G;
    if (!(b->clip[l] = alloc_f32(R * (C / G))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the clip search of layer %d", b->layer);
    enum llmq_status st =
        clip_weight(b->layer, l, b->w[l], R, C, llmq_awq_input_scales(b, l), X, T, o, G, b->clip[l], &b->clip_err[l]);
    if (!st)
        llmq_info("awq: layer %d %s: clip search over %lld tokens, error sum %.6g", b->layer, llmq_linear_name(l),
                  (long long)T, b->clip_err[l]);
    return st;
}

// ---------------------------------------------------------------------------------------------
// The whole step
// ---------------------------------------------------------------------------------------------

static enum llmq_status check_opts(const struct llmq_awq_opts *o) {
    if (o->bits < LLMQ_QBITS_MIN || o->bits > LLMQ_QBITS_MAX)
        return llmq_errorf(LLMQ_ERR_ARG, "awq: bits %d outside [%d, %d]", o->bits, LLMQ_QBITS_MIN, LLMQ_QBITS_MAX);
    if (o->n_grid < 1 || o->n_grid > 1000 || o->clip_n_grid < 1 || o->clip_n_grid > 1000 ||
        !(o->max_shrink > 0.0f && o->max_shrink <= 1.0f) || o->n_sample_token < 1)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "awq: bad search options (n_grid %d, clip_n_grid %d, max_shrink %g, "
                           "n_sample_token %lld)",
                           o->n_grid, o->clip_n_grid, (double)o->max_shrink, (long long)o->n_sample_token);
    if (o->group_size == 0 || o->group_size < -1)
        return llmq_errorf(LLMQ_ERR_ARG, "awq: group size %d (want -1 or >= 1)", o->group_size);
    return LLMQ_OK;
}

// X (N, C) rows t = 0, step, ... (step = max(1, N / n_sample_token)) divided by s (C) (s may be NULL)
// into S (T, C); returns T.
static int64_t sample_scaled(const float *X, int64_t N, int64_t C, int64_t n_sample_token, const float *s, float *S) {
    int64_t step = N / n_sample_token;
    if (step < 1) step = 1;
    int64_t T = 0;
    for (int64_t t = 0; t < N; t += step, T++)
        for (int64_t c = 0; c < C; c++) S[T * C + c] = s ? X[t * C + c] / s[c] : X[t * C + c];
    return T;
}

// ---------------------------------------------------------------------------------------------
// Mixture of experts (quant/awq.h "Mixture of experts")
// ---------------------------------------------------------------------------------------------

// lin_group for an expert's linear of kind l with C input channels.
static int64_t expert_group(const struct llmq_awq_opts *o, enum llmq_linear l, int64_t C) {
    const int64_t Gl = o->lin_group_size[l];
    if (Gl > 0 && C % Gl == 0) return Gl;
    return o->group_size > 0 && C % o->group_size == 0 ? o->group_size : C;
}

// dst (R, C) := expert x's linear k (0 gate, 1 up, 2 down) from the model in f32, with apply_scale's factors once the
// search chose them: gate / up columns * s_ffn, up's rows / s_down[x], down's columns * s_down[x].
static enum llmq_status expert_scaled(const struct llmq_awq_block *b, int k, int64_t x, float *dst) {
    const int64_t D = b->D, Fe = b->Fe;
    enum llmq_status st = llmq_model_weight_f32(b->m->layers[b->layer].exps[3 * x + k], dst, b->n_threads);
    if (st || !b->s_ffn) return st;
    const float *s = b->s_ffn, *sd = b->s_down[x];
    if (k < 2)
        for (int64_t r = 0; r < Fe; r++)
            for (int64_t c = 0; c < D; c++) dst[r * D + c] *= s[c];
    if (k == 1 && sd)
        for (int64_t r = 0; r < Fe; r++)
            for (int64_t c = 0; c < D; c++) dst[r * D + c] /= sd[r];
    if (k == 2 && sd)
        for (int64_t r = 0; r < D; r++)
            for (int64_t c = 0; c < Fe; c++) dst[r * Fe + c] *= sd[c];
    return LLMQ_OK;
}

enum llmq_status llmq_awq_expert_weight(const struct llmq_awq_block *b, enum llmq_linear lin, int64_t expert,
                                        float *dst) {
    LLMQ_ASSERT(b->s_down && lin >= LLMQ_LIN_GATE && expert >= 0 && expert < b->E);
    const int k = lin - LLMQ_LIN_GATE;
    enum llmq_status st = expert_scaled(b, k, expert, dst);
    const float *clip = b->eclip[3 * expert + k];
    if (!st && clip) apply_clip(dst, k < 2 ? b->Fe : b->D, k < 2 ? b->D : b->Fe, b->eclip_g[k], clip);
    return st;
}

// The gate / up scale search's expert source (llmq_expert_weight_fn): expert x's candidate Q(W * s) / s at the
// ratio's scales s, made from the model's weights when the mixture reaches it; down stays the model's.
struct ffn_cand {
    const struct llmq_awq_block *b;
    const struct llmq_awq_opts *o;
    const float *s; // (D) the ratio's scales
    float *W, *tmp; // (Fe, D) the model's weights in f32, the quantizer's scratch
    int64_t G;
};

static enum llmq_status ffn_candidate(void *user, int layer, int expert, enum llmq_linear which,
                                      const struct llmq_tensor_view *w, float *scratch, bool *filled) {
    const struct ffn_cand *c = user;
    *filled = false;
    if (which == LLMQ_LIN_DOWN) return LLMQ_OK;
    (void)expert;
    enum llmq_status st = llmq_model_weight_f32(w, c->W, c->b->n_threads);
    if (st) return st;
    candidate_of(layer, LLMQ_AWQ_EXPERT_LIN(which), c->W, c->b->Fe, c->b->D, c->G, c->s, c->o, c->tmp, scratch);
    *filled = true;
    return LLMQ_OK;
}

// The shared expert's gate / up candidates at the ratio's scales s into cand (2, Fs, D) on their views (qwen2_moe;
// up's rows already carry its own group's scales), or (restore) the views back on the weights.
static void shexp_candidates(struct llmq_awq_block *b, const float *s, const struct llmq_awq_opts *o, float *tmp,
                             float *cand, bool restore) {
    const int64_t D = b->D, Fs = b->F;
    for (int k = 0; k < 2; k++) {
        const enum llmq_linear l = LLMQ_LIN_GATE + k;
        if (!restore) candidate_of(b->layer, l, b->w[l], Fs, D, expert_group(o, l, D), s, o, tmp, cand + k * Fs * D);
        b->vw[l].data = restore ? b->w[l] : cand + k * Fs * D;
    }
}

// ffn_norm -> every expert's gate and up (and the router's columns; qwen2_moe: and the shared expert's gate / up and
// its gate's columns): the search over the mixture's output fp_out (N, D) (qwen2_moe: the gated shared output
// included) for the ffn input n2 (N, D); out (N, D) scratch. Result: b->s_ffn, b->ratio_ffn. w_mean reads the
// experts one at a time; each expert's candidate is made as the mixture reaches it (ffn_candidate), the shared
// expert's (a dense MLP whose f32 copies the block holds) before each pass.
static enum llmq_status moe_search_ffn(struct llmq_awq_block *b, struct llmq_forward *f, const float *n2, int64_t N,
                                       const float *fp_out, float *out, const struct llmq_awq_opts *o) {
    const int64_t D = b->D, E = b->E, Fe = b->Fe;
    const int64_t Fs = b->w[LLMQ_LIN_GATE] ? b->F : 0; // qwen2_moe: the shared expert's gate / up join the group
    struct ffn_cand c = {.b = b, .o = o, .G = expert_group(o, LLMQ_AWQ_EXPERT_LIN(LLMQ_LIN_GATE), D)};
    float *x_mean = alloc_f32(D), *w_mean = alloc_f32(D), *s = alloc_f32(D), *best_s = alloc_f32(D);
    float *scand = Fs ? alloc_f32(2 * Fs * D) : NULL;
    c.W = alloc_f32(Fe * D);
    c.tmp = alloc_f32((Fe > Fs ? Fe : Fs) * D);
    double *acc = calloc((size_t)D, sizeof *acc), best = INFINITY, loss0 = 0;
    enum llmq_status st = LLMQ_OK;
    if (!x_mean || !w_mean || !s || !best_s || !c.W || !c.tmp || !acc || (Fs && !scand)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the experts' search (layer %d)", b->layer);
        goto done;
    }
    compute_x_mean(n2, N, D, x_mean);
    for (int64_t j = 0; j < 3 * E && !st; j++)
        if (j % 3 != 2 && !(st = llmq_model_weight_f32(b->m->layers[b->layer].exps[j], c.W, b->n_threads)))
            w_mean_acc(c.W, Fe, D, c.G, acc);
    for (int k = 0; k < 2 && Fs; k++)
        w_mean_acc(b->w[LLMQ_LIN_GATE + k], Fs, D, expert_group(o, LLMQ_LIN_GATE + k, D), acc);
    for (int64_t i = 0; i < D; i++) w_mean[i] = (float)(acc[i] / (double)(2 * (E * Fe + Fs)));
    c.s = s;
    if (!st) st = llmq_forward_set_expert_source(f, ffn_candidate, &c);
    for (int i = 0; i < o->n_grid && !st; i++) {
        const float ratio = (float)((double)i / (double)o->n_grid);
        ratio_scales(x_mean, w_mean, D, ratio, o->duo_scaling, s);
        if (Fs) shexp_candidates(b, s, o, c.tmp, scand, false);
        st = llmq_forward_mlp(f, b->layer, &b->ly, n2, N, out);
        if (Fs) shexp_candidates(b, s, o, c.tmp, scand, true);
        const double loss = st ? NAN : mse(fp_out, out, N * D);
        if (!st && !isfinite(loss))
            st = llmq_errorf(LLMQ_ERR_NUMERIC, "awq: layer %d, experts' gate / up: loss %g at ratio %g", b->layer, loss,
                             (double)ratio);
        if (i == 0) loss0 = loss;
        if (!st && loss < best) {
            best = loss;
            b->ratio_ffn = ratio;
            memcpy(best_s, s, (size_t)D * sizeof(float));
        }
    }
    (void)llmq_forward_set_expert_source(f, NULL, NULL); // back to the model's experts (no allocation)
    if (!st) {
        b->s_ffn = best_s; // from now on expert_scaled applies it
        best_s = NULL;
        llmq_info("awq: layer %d ffn_norm->%lld experts' gate,up%s (+ router columns): ratio %.2f, loss %.6g (ratio 0: "
                  "%.6g)",
                  b->layer, (long long)E, Fs ? " and the shared expert's (+ its gate's columns)" : "",
                  (double)b->ratio_ffn, best, loss0);
    }
done:
    free(x_mean);
    free(w_mean);
    free(s);
    free(best_s);
    free(scand);
    free(c.W);
    free(c.tmp);
    free(acc);
    return st;
}

// up_x -> down_x of expert x on its routed down inputs X (n, Fe): the loss is down_x's output. W (D, Fe): scratch for
// the model's down_x. Result: s_down[x].
static enum llmq_status moe_search_down(struct llmq_awq_block *b, int64_t x, const float *X, int64_t n,
                                        const struct llmq_awq_opts *o, float *W, float *ratio_out) {
    const int64_t D = b->D, Fe = b->Fe, G = expert_group(o, LLMQ_AWQ_EXPERT_LIN(LLMQ_LIN_DOWN), Fe);
    float *x_mean = alloc_f32(Fe), *w_mean = alloc_f32(Fe), *s = alloc_f32(Fe), *tmp = alloc_f32(D * Fe);
    float *cand = alloc_f32(D * Fe), *fp = alloc_f32(n * D), *out = alloc_f32(n * D), *sx = alloc_f32(Fe);
    double *acc = calloc((size_t)Fe, sizeof *acc), best = INFINITY;
    enum llmq_status st = LLMQ_OK;
    if (!x_mean || !w_mean || !s || !tmp || !cand || !fp || !out || !acc || !sx) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for expert %lld's search (layer %d)", (long long)x,
                         b->layer);
        goto done;
    }
    if ((st = llmq_model_weight_f32(b->m->layers[b->layer].exps[3 * x + 2], W, b->n_threads))) goto done;
    compute_x_mean(X, n, Fe, x_mean);
    w_mean_acc(W, D, Fe, G, acc);
    for (int64_t c = 0; c < Fe; c++) w_mean[c] = (float)(acc[c] / (double)D);
    st = gemm_nt(o->backend, X, W, n, D, Fe, fp);
    for (int i = 0; i < o->n_grid && !st; i++) {
        const float ratio = (float)((double)i / (double)o->n_grid);
        ratio_scales(x_mean, w_mean, Fe, ratio, o->duo_scaling, s);
        candidate_of(b->layer, LLMQ_AWQ_EXPERT_LIN(LLMQ_LIN_DOWN), W, D, Fe, G, s, o, tmp, cand);
        if ((st = gemm_nt(o->backend, X, cand, n, D, Fe, out))) break;
        const double loss = mse(fp, out, n * D);
        if (!isfinite(loss))
            st = llmq_errorf(LLMQ_ERR_NUMERIC, "awq: layer %d expert %lld up->down: loss %g at ratio %g", b->layer,
                             (long long)x, loss, (double)ratio);
        if (!st && loss < best) {
            best = loss;
            *ratio_out = ratio;
            memcpy(sx, s, (size_t)Fe * sizeof(float));
        }
    }
    if (!st) {
        b->s_down[x] = sx; // from now on expert_scaled applies it
        sx = NULL;
    }
done:
    free(x_mean);
    free(w_mean);
    free(s);
    free(tmp);
    free(cand);
    free(fp);
    free(out);
    free(sx);
    free(acc);
    return st;
}

// The per-expert pass (the mixture with the model's experts, after the gate / up search): its expert hook gets expert
// x's routed gate / up input, then its down input; at the down input x's up -> down search and its clip search run.
struct moe_step {
    struct llmq_awq_block *b;
    const struct llmq_awq_opts *o;
    float *W;        // (Fe, D) one expert weight, scaled for the clip search
    float *Sin;      // (Tmax, D) expert x's sampled gate / up input, divided by s_ffn
    float *Sact;     // (Tmax, Fe) its sampled down input, divided by s_down[x]
    int64_t Tin;     // rows of Sin
    double rsum;     // Σ chosen down ratios
    int64_t n_down;  // experts searched
    double clip_err; // Σ chosen clip errors
    enum llmq_status st;
};

// The clip table of expert x's linear k (0 gate, 1 up, 2 down) from the sampled, scaled input S (T, C).
static enum llmq_status expert_clip(struct moe_step *p, int64_t x, int k, const float *S, int64_t T) {
    struct llmq_awq_block *b = p->b;
    const int64_t R = k < 2 ? b->Fe : b->D, C = k < 2 ? b->D : b->Fe;
    const enum llmq_linear l = LLMQ_AWQ_EXPERT_LIN(LLMQ_LIN_GATE + k); // the quantizer's index of an expert's
    const int64_t G = expert_group(p->o, l, C);
    const float *s = k < 2 ? b->s_ffn : b->s_down[x];
    enum llmq_status st = expert_scaled(b, k, x, p->W);
    if (st) return st;
    b->eclip_g[k] = G;
    if (!(b->eclip[3 * x + k] = alloc_f32(R * (C / G))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for expert %lld's clip table (layer %d)", (long long)x,
                           b->layer);
    double e = 0;
    st = clip_weight(b->layer, l, p->W, R, C, s, S, T, p->o, G, b->eclip[3 * x + k], &e);
    p->clip_err += e;
    return st;
}

static void moe_step_hook(void *user, int layer, int expert, enum llmq_linear which, const float *in, int64_t n,
                          int64_t n_in) {
    struct moe_step *p = user;
    struct llmq_awq_block *b = p->b;
    const struct llmq_awq_opts *o = p->o;
    (void)layer;
    if (p->st) return;
    if (which != LLMQ_LIN_DOWN) {
        if (o->clip) p->Tin = sample_scaled(in, n, n_in, o->n_sample_token, b->s_ffn, p->Sin);
        return;
    }
    float ratio = 0;
    if ((p->st = moe_search_down(b, expert, in, n, o, p->W, &ratio))) return;
    p->rsum += ratio;
    p->n_down++;
    if (!o->clip) return;
    for (int k = 0; k < 2 && !p->st; k++) p->st = expert_clip(p, expert, k, p->Sin, p->Tin);
    if (p->st) return;
    const int64_t T = sample_scaled(in, n, n_in, o->n_sample_token, b->s_down[expert], p->Sact);
    p->st = expert_clip(p, expert, 2, p->Sact, T);
}

// apply_scale's part outside the experts: ffn_norm /= s_ffn, the router's columns *= s_ffn; qwen2_moe: the shared
// expert's gate's columns and its gate / up's *= s_ffn (the experts' factors are applied as their weights are made:
// expert_scaled).
static void moe_apply(struct llmq_awq_block *b) {
    const int64_t D = b->D, E = b->E;
    const float *s = b->s_ffn;
    for (int64_t c = 0; c < D; c++) b->ffn_norm[c] /= s[c];
    for (int64_t r = 0; r < E; r++)
        for (int64_t c = 0; c < D; c++) b->router[r * D + c] *= s[c];
    for (int64_t c = 0; b->shg && c < D; c++) b->shg[c] *= s[c];
    for (int k = 0; k < 2 && b->w[LLMQ_LIN_GATE]; k++) // (up's rows scaled by its own group already)
        for (int64_t r = 0; r < b->F; r++)
            for (int64_t c = 0; c < D; c++) b->w[LLMQ_LIN_GATE + k][r * D + c] *= s[c];
}

// The experts' part of llmq_awq_search for the ffn input n2 (N, D) and the mixture's fp output mlp_fp; out (N, D)
// scratch. f's expert hook and source are borrowed (and cleared).
static enum llmq_status moe_search(struct llmq_awq_block *b, struct llmq_forward *f, const float *n2, int64_t N,
                                   const float *mlp_fp, float *out, const struct llmq_awq_opts *o) {
    enum llmq_status st = moe_search_ffn(b, f, n2, N, mlp_fp, out, o);
    if (st) return st;
    const int64_t Tmax = N < 2 * o->n_sample_token ? N : 2 * o->n_sample_token; // sample_scaled's rows, at most
    struct moe_step p = {.b = b, .o = o};
    p.W = alloc_f32(b->Fe * b->D);
    p.Sin = alloc_f32(Tmax * b->D);
    p.Sact = alloc_f32(Tmax * b->Fe);
    if (!p.W || !p.Sin || !p.Sact) st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory (layer %d)", b->layer);
    if (!st) {
        llmq_forward_set_expert_hook(f, moe_step_hook, &p);
        st = llmq_forward_mlp(f, b->layer, &b->ly, n2, N, out);
        llmq_forward_set_expert_hook(f, NULL, NULL);
        if (!st) st = p.st;
    }
    if (!st)
        llmq_info("awq: layer %d up->down of %lld experts (the %lld others saw no token: unscaled), mean ratio %.2f",
                  b->layer, (long long)p.n_down, (long long)(b->E - p.n_down),
                  p.n_down ? p.rsum / (double)p.n_down : 0.0);
    if (!st && o->clip)
        llmq_info("awq: layer %d experts: clip search of %lld experts' gate, up, down, error sum %.6g", b->layer,
                  (long long)p.n_down, p.clip_err);
    if (!st) moe_apply(b);
    free(p.W);
    free(p.Sin);
    free(p.Sact);
    return st;
}

// The job's candidate weights (the largest group's) and a plugged-in quantizer's scratch.
static enum llmq_status job_alloc(struct scale_job *job) {
    const struct llmq_awq_block *b = job->b;
    int64_t cand_n = 0;
    for (int l = 0; l < LLMQ_LIN_COUNT; l++)
        if (b->w[l] && lin_rows(b, l) * lin_cols(b, l) > cand_n) cand_n = lin_rows(b, l) * lin_cols(b, l);
    for (int k = 0; k < 3; k++) job->cand[k] = alloc_f32(cand_n);
    job->tmp = job->o->fake_quant ? alloc_f32(cand_n) : alloc_f32(1);
    if (!job->cand[0] || !job->cand[1] || !job->cand[2] || !job->tmp)
        return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the candidates (layer %d)", b->layer);
    return LLMQ_OK;
}

static void job_free(struct scale_job *job) {
    for (int k = 0; k < 3; k++) free(job->cand[k]);
    free(job->tmp);
}

// The scale groups (get_layers_for_scaling) searched on the original weights: group input g (the four block inputs,
// ins[g] (N, C) on the host or NULL on the block path) and the inspected module's fp output fps[g] (NULL: none kept).
static enum llmq_status search_scales(struct scale_job *job, const float *const ins[4], const float *const fps[4],
                                      const double *const sum_abs[4], bool moe) {
    struct llmq_awq_block *b = job->b;
    const bool has_vo =
        lin_rows(b, LLMQ_LIN_V) == lin_rows(b, LLMQ_LIN_O) && lin_cols(b, LLMQ_LIN_V) == lin_cols(b, LLMQ_LIN_O);
    const struct {
        enum llmq_awq_prev prev;
        int n_lin;
        enum llmq_linear lin[3];
        int64_t C;
    } defs[4] = {
        {LLMQ_AWQ_PREV_ATTN_NORM, 3, {LLMQ_LIN_Q, LLMQ_LIN_K, LLMQ_LIN_V}, b->D},
        {LLMQ_AWQ_PREV_V, 1, {LLMQ_LIN_O}, b->Dq},
        {LLMQ_AWQ_PREV_FFN_NORM, 2, {LLMQ_LIN_GATE, LLMQ_LIN_UP}, b->D},
        {LLMQ_AWQ_PREV_UP, 1, {LLMQ_LIN_DOWN}, b->F},
    };
    enum llmq_status st = LLMQ_OK;
    for (int d = 0; d < 4 && !st; d++) {
        // moe: ffn_norm's group is the experts' (moe_search: qwen2_moe's shared gate / up among them), up -> down
        // only the shared expert's (qwen2_moe; the experts' in moe_search)
        if ((defs[d].prev == LLMQ_AWQ_PREV_V && !has_vo) || (moe && d == 2) || (moe && d == 3 && !b->w[LLMQ_LIN_DOWN]))
            continue;
        struct llmq_awq_group *g = &b->groups[b->n_groups++];
        g->prev = defs[d].prev;
        g->n_lin = defs[d].n_lin;
        memcpy(g->lin, defs[d].lin, sizeof g->lin);
        g->C = defs[d].C;
        job->in = ins[d];
        job->fp_out = fps[d];
        job->sum_abs = sum_abs ? sum_abs[d] : NULL;
        st = search_group(job, g);
    }
    return st;
}

// The clip search on the scaled weights with the scaled inputs: input g's rows t = 0, step, ... of ins[g] (N, C_g),
// step = max(1, N / n_sample) (the block path passes its samples with n_sample = N: every row).
static enum llmq_status search_clips(struct llmq_awq_block *b, const float *const ins[4], int64_t N, int64_t n_sample,
                                     bool moe, const struct llmq_awq_opts *o) {
    const int64_t D = b->D, F = b->F, Dq = b->Dq;
    int64_t Cmax = D > F ? D : F;
    if (Dq > Cmax) Cmax = Dq;
    int64_t step = N / n_sample;
    if (step < 1) step = 1;
    const int64_t T = (N + step - 1) / step;
    float *S = alloc_f32(T * Cmax);
    if (!S) return llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for the clip search (layer %d)", b->layer);
    enum llmq_status st = LLMQ_OK;
    const enum llmq_linear clip_lins[5] = {LLMQ_LIN_V, LLMQ_LIN_O, LLMQ_LIN_GATE, LLMQ_LIN_UP, LLMQ_LIN_DOWN};
    const bool dense_mlp = !moe || b->w[LLMQ_LIN_DOWN];    // qwen2_moe: its shared expert
    for (int k = 0; k < (dense_mlp ? 5 : 2) && !st; k++) { // moe: the experts' gate / up / down in moe_search
        const enum llmq_linear l = clip_lins[k];
        const float *in = ins[l == LLMQ_LIN_V ? 0 : l == LLMQ_LIN_O ? 1 : l == LLMQ_LIN_DOWN ? 3 : 2];
        if (l != LLMQ_LIN_UP) // gate and up share the sampled input S
            sample_scaled(in, N, lin_cols(b, l), n_sample, llmq_awq_input_scales(b, l), S);
        const int64_t G = lin_group(o, b, l);
        if (G != o->group_size && G != o->lin_group_size[l] && o->group_size > 0)
            llmq_warn("awq: layer %d %s: group size %d does not tile its %lld input channels: searched per channel",
                      b->layer, llmq_linear_name(l), o->group_size, (long long)lin_cols(b, l));
        st = search_clip(b, l, S, T, o, G);
    }
    free(S);
    return st;
}

// The checks both searches start with.
static enum llmq_status search_start(const struct llmq_awq_block *b, const struct llmq_awq_opts *o) {
    enum llmq_status st = check_opts(o);
    if (!st && b->n_groups)
        st = llmq_errorf(LLMQ_ERR_ARG, "awq: layer %d was searched already (use a fresh block)", b->layer);
    return st;
}

enum llmq_status llmq_awq_search(struct llmq_awq_block *b, struct llmq_forward *f, const float *x, int64_t n_seq,
                                 int64_t seqlen, const struct llmq_awq_opts *o) {
    const int64_t D = b->D, F = b->F, Dq = b->Dq, N = n_seq * seqlen;
    enum llmq_status st = search_start(b, o);
    if (st) return st;
    for (int64_t i = 0; i < N * D; i++)
        if (!isfinite(x[i]))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "awq: layer %d: block input (%lld, %lld) is %g", b->layer,
                               (long long)(i / D), (long long)(i % D), (double)x[i]);
    const bool moe = b->s_down != NULL; // the MLP's groups are the experts' (moe_search)
    struct captured cap = {.N = N};
    float *h = NULL, *attn_fp = NULL, *mlp_fp = NULL, *cand_out = NULL;
    struct scale_job job = {.b = b, .f = f, .o = o, .n_seq = n_seq, .seqlen = seqlen, .N = N};
    double t0 = llmq_now_s();

    cap.n1 = alloc_f32(N * D);
    cap.att = alloc_f32(N * Dq); // o's input: the v->o search and o's clip search
    cap.n2 = alloc_f32(N * D);
    cap.act = alloc_f32(N * F);
    h = alloc_f32(N * D);
    attn_fp = alloc_f32(N * D);
    mlp_fp = alloc_f32(N * D);
    cand_out = alloc_f32(N * D);
    if ((st = job_alloc(&job)) == LLMQ_OK &&
        (!cap.n1 || !cap.att || !cap.n2 || !cap.act || !h || !attn_fp || !mlp_fp || !cand_out))
        st = llmq_errorf(LLMQ_ERR_NOMEM, "awq: out of memory for %lld tokens (layer %d)", (long long)N, b->layer);
    if (st) goto done;

    // The fp pass: every linear's input, the attention and MLP outputs.
    memcpy(h, x, (size_t)(N * D) * sizeof(float));
    if ((st = llmq_forward_block(f, b->layer, &b->ly, h, n_seq, seqlen, capture_hook, &cap))) goto done;
    if ((st = llmq_forward_attn(f, b->layer, &b->ly, cap.n1, n_seq, seqlen, attn_fp))) goto done;
    if ((st = llmq_forward_mlp(f, b->layer, &b->ly, cap.n2, N, mlp_fp))) goto done;
    job.out = cand_out;
    job.fp_scratch = h; // free now: o's and down's fp outputs when their loss takes the output form

    const float *const ins[4] = {cap.n1, cap.att, cap.n2, cap.act}, *const fps[4] = {attn_fp, NULL, mlp_fp, NULL};
    if ((st = search_scales(&job, ins, fps, NULL, moe))) goto done;
    b->seconds_scale = llmq_now_s() - t0;
    t0 = llmq_now_s();

    // apply_scale, in the order of the groups (v and up see their column scale before the row one).
    for (int k = 0; k < b->n_groups; k++) apply_scale(b, &b->groups[k]);
    // the experts: searched on the original weights too (their clip search included), then applied
    if (moe && (st = moe_search(b, f, cap.n2, N, mlp_fp, cand_out, o))) goto done;
    if (o->clip) st = search_clips(b, ins, N, o->n_sample_token, moe, o);
    b->seconds_clip = llmq_now_s() - t0;

done:
    free(cap.n1);
    free(cap.att);
    free(cap.n2);
    free(cap.act);
    free(h);
    free(attn_fp);
    free(mlp_fp);
    free(cand_out);
    job_free(&job);
    return st;
}

int64_t llmq_awq_sample_step(int64_t N, const struct llmq_awq_opts *o) {
    const int64_t step = N / o->n_sample_token;
    return step < 1 ? 1 : step;
}

enum llmq_status llmq_awq_search_blocks(struct llmq_awq_block *b, struct llmq_blocks *qb, int64_t n_seq, int64_t seqlen,
                                        const double *const sum_abs[4], const float *const rows[4],
                                        const struct llmq_awq_opts *o) {
    const int64_t N = n_seq * seqlen;
    enum llmq_status st = search_start(b, o);
    if (st) return st;
    if (b->s_down)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "awq: layer %d: a mixture of experts is not on the block path",
                           b->layer);
    struct scale_job job = {.b = b, .o = o, .n_seq = n_seq, .seqlen = seqlen, .N = N, .qb = qb};
    double t0 = llmq_now_s();
    if (!(st = job_alloc(&job)))
        st = search_scales(&job, (const float *const[4]){0}, (const float *const[4]){0}, sum_abs, false);
    b->seconds_scale = llmq_now_s() - t0;
    t0 = llmq_now_s();
    if (!st)
        for (int k = 0; k < b->n_groups; k++) apply_scale(b, &b->groups[k]);
    const int64_t T = (N + llmq_awq_sample_step(N, o) - 1) / llmq_awq_sample_step(N, o);
    if (!st && o->clip) st = search_clips(b, rows, T, T, false, o);
    b->seconds_clip = llmq_now_s() - t0;
    job_free(&job);
    return st;
}
