// quant/gguf_choose.c — the type choice from the weights (contract in quant/gguf_choose.h).
// Legend: R rows, C row length, n sampled rows, K candidate types.
#include "quant/gguf_choose.h"

#include "common/log.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SAMPLED_ROWS 2048

static const enum llmq_dtype cand[] = {
    LLMQ_DTYPE_Q2_K, LLMQ_DTYPE_Q3_K, LLMQ_DTYPE_IQ4_XS, LLMQ_DTYPE_Q4_0, LLMQ_DTYPE_IQ4_NL, LLMQ_DTYPE_Q4_K,
    LLMQ_DTYPE_Q4_1, LLMQ_DTYPE_Q5_0, LLMQ_DTYPE_Q5_K,   LLMQ_DTYPE_Q5_1, LLMQ_DTYPE_Q6_K,   LLMQ_DTYPE_Q8_0,
};
#define K ((int)(sizeof(cand) / sizeof(cand[0])))

uint64_t llmq_gguf_choose_bytes(const struct llmq_gguf_choose_tensor *t, enum llmq_dtype ty) {
    size_t rb = 0;
    if (!llmq_dtype_nbytes(ty, t->C, &rb)) return 0;
    return (uint64_t)rb * (uint64_t)t->R;
}

static int cand_index(enum llmq_dtype ty) {
    for (int k = 0; k < K; k++)
        if (cand[k] == ty) return k;
    return -1;
}

// A tensor's candidates: bytes[k] (0 = its row does not tile cand[k]) and err[k] (INFINITY when not computed; for a
// candidate smaller than the mix's type, the guarded err of the header's "Downgrades"), err_u[k] the same error with
// imp = 1.
struct opt {
    uint64_t bytes[K];
    double err[K], err_u[K];
    int mix;     // cand index of the mix's type, or -1 (then the tensor is fixed)
    double gain; // what one unit of err costs in the allocation: g_t (MEASURED, allocated tensors), else 1
};

// What candidate k of a tensor costs in the allocation: err (UNIFORM: gain 1, exactly err) or pred.
static double cost(const struct opt *op, int k) { return op->err[k] * op->gain; }

static bool excluded(const struct llmq_gguf_choose_opts *o, int k) {
    return cand[k] < 64 && (o->exclude >> cand[k] & 1u);
}

void llmq_gguf_choose_range(const struct llmq_gguf_choose_opts *o, int64_t n, const struct llmq_gguf_choose_tensor *t,
                            uint64_t *min_bytes, uint64_t *max_bytes) {
    uint64_t lo = 0, hi = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t cur = llmq_gguf_choose_bytes(&t[i], t[i].type), a = cur, b = cur;
        if (t[i].allocate && cand_index(t[i].type) >= 0)
            for (int k = 0; k < K; k++) {
                uint64_t by = excluded(o, k) ? 0 : llmq_gguf_choose_bytes(&t[i], cand[k]);
                if (!by) continue;
                a = by < a ? by : a;
                b = by > b ? by : b;
            }
        lo += a;
        hi += b;
    }
    *min_bytes = lo;
    *max_bytes = hi;
}

// Work buffers for one tensor's sampled rows: W, its decoding, the encoded rows.
struct work {
    float *W, *Q;
    uint8_t *blk;
    size_t cap; // elements
};

static enum llmq_status work_reserve(struct work *w, size_t nel) {
    if (nel <= w->cap) return LLMQ_OK;
    free(w->W);
    free(w->Q);
    free(w->blk);
    w->W = malloc(nel * sizeof(float));
    w->Q = malloc(nel * sizeof(float));
    w->blk = malloc(nel * 4); // 4 bytes per element hold any candidate (Q8_0 is the widest, 8.5 bits)
    w->cap = nel;
    if (w->W && w->Q && w->blk) return LLMQ_OK;
    w->cap = 0;
    return llmq_errorf(LLMQ_ERR_NOMEM, "gguf choice: out of memory for %zu floats", nel);
}

// The importance of row r of t: its part's (stacked experts), else the tensor's.
static const float *row_importance(const struct llmq_gguf_choose_tensor *t, int64_t r) {
    return t->part_rows > 0 ? t->part_importance[r / t->part_rows * t->part_stride] : t->importance;
}

// The header's "Downgrades": a candidate smaller than the mix's type costs at least its error without the importance,
// rescaled to the mix's importance-weighted error: err[k] = max(err[k], err_u[k] · err[mix] / err_u[mix]) (nothing
// when the mix's type rebuilds the sampled rows exactly, err_u[mix] = 0).
static void guard_downgrades(struct opt *op) {
    const double eu = op->err_u[op->mix], em = op->err[op->mix];
    if (!(eu > 0) || !isfinite(eu) || !isfinite(em)) return;
    for (int k = 0; k < K; k++)
        if (op->bytes[k] && op->bytes[k] < op->bytes[op->mix] && isfinite(op->err[k])) {
            double g = op->err_u[k] * (em / eu);
            if (g > op->err[k]) op->err[k] = g;
        }
}

// err[k] of tensor i for every candidate that tiles its rows (see "The error of a tensor in a type").
static enum llmq_status tensor_errors(const struct llmq_gguf_choose_opts *o, const struct llmq_gguf_choose_tensor *t,
                                      int64_t i, llmq_gguf_choose_rows_fn rows, void *user, struct work *w,
                                      struct opt *op) {
    const int64_t R = t->R, C = t->C;
    const int64_t stride = (R + MAX_SAMPLED_ROWS - 1) / MAX_SAMPLED_ROWS, n = (R + stride - 1) / stride;
    enum llmq_status st = work_reserve(w, (size_t)(n * C));
    if (!st) st = rows(user, i, stride, n, w->W);
    const bool capped = !(o->mode == LLMQ_GGUF_CHOICE_TARGET && t->allocate); // QUALITY: no larger than the mix's
    for (int k = 0; k < K && !st; k++) {
        if (!op->bytes[k] || (capped && op->bytes[k] > op->bytes[op->mix])) continue; // err stays INFINITY
        size_t rb = 0;
        (void)llmq_dtype_nbytes(cand[k], C, &rb);
        double e = 0, eu = 0;
        for (int64_t r0 = 0, r1; r0 < n && !st; r0 = r1) { // runs of sampled rows with one importance (one expert)
            const float *imp = row_importance(t, r0 * stride);
            for (r1 = r0 + 1; r1 < n && row_importance(t, r1 * stride) == imp;) r1++;
            st = llmq_gguf_encode_rows(cand[k], w->W + r0 * C, w->blk + (size_t)r0 * rb, r1 - r0, C, imp, o->n_threads);
            for (int64_t r = r0; r < r1 && !st; r++) {
                if ((st = llmq_dequantize_row(cand[k], w->blk + (size_t)r * rb, w->Q, C))) break;
                const float *x = w->W + r * C;
                double er = 0, eru = 0;
                for (int64_t c = 0; c < C; c++) {
                    double d = (double)x[c] - (double)w->Q[c];
                    er += (imp ? (double)imp[c] : 1.0) * d * d;
                    eru += d * d;
                }
                e += er;
                eu += eru;
            }
        }
        op->err[k] = e * (double)R / (double)n;
        op->err_u[k] = eu * (double)R / (double)n;
    }
    guard_downgrades(op);
    return st;
}

// The QUALITY pick of one tensor: the lowest err among candidates no larger than the mix's type.
static int pick_quality(const struct opt *op) {
    int best = op->mix;
    for (int k = 0; k < K; k++) {
        if (!op->bytes[k] || op->bytes[k] > op->bytes[op->mix]) continue;
        if (op->err[k] < op->err[best] || (op->err[k] == op->err[best] && op->bytes[k] < op->bytes[best])) best = k;
    }
    return best;
}

#define DP_UNITS (1 << 17) // the budget's resolution in the knapsack

// Greedy fill of what the rounding left: while an upgrade of one tensor to a larger candidate with a lower err
// fits, take the one with the largest err decrease per added byte (ties: the first tensor, then candidate).
static void fill(int64_t n, const struct llmq_gguf_choose_tensor *t, const struct opt *op, uint64_t budget,
                 uint64_t used, int *sel) {
    for (;;) {
        int64_t bi = -1;
        int bk = -1;
        double br = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!t[i].allocate || op[i].mix < 0) continue;
            const int c = sel[i];
            for (int k = 0; k < K; k++) {
                if (!op[i].bytes[k] || op[i].bytes[k] <= op[i].bytes[c] || !(cost(&op[i], k) < cost(&op[i], c)))
                    continue;
                uint64_t add = op[i].bytes[k] - op[i].bytes[c];
                if (used + add > budget) continue;
                double ratio = (cost(&op[i], c) - cost(&op[i], k)) / (double)add;
                if (bi < 0 || ratio > br) {
                    bi = i;
                    bk = k;
                    br = ratio;
                }
            }
        }
        if (bi < 0) return;
        used += op[bi].bytes[bk] - op[bi].bytes[sel[bi]];
        sel[bi] = bk;
    }
}

// The TARGET allocation of the allocated tensors into sel within budget bytes (see "TARGET" in the header):
// the multiple-choice knapsack by dynamic programming over the budget in units of u bytes, every candidate's
// bytes rounded up to whole units (so the result fits), then fill() on the exact bytes.
static enum llmq_status allocate(int64_t n, const struct llmq_gguf_choose_tensor *t, const struct opt *op,
                                 uint64_t budget, int *sel) {
    const uint64_t u = budget / DP_UNITS + 1;
    const int64_t W = (int64_t)(budget / u);
    int64_t na = 0;
    for (int64_t i = 0; i < n; i++) na += t[i].allocate && op[i].mix >= 0;
    double *dp = malloc((size_t)(W + 1) * sizeof(double)), *nx = malloc((size_t)(W + 1) * sizeof(double));
    uint8_t *ch = malloc((size_t)(na > 0 ? na : 1) * (size_t)(W + 1)); // (na, W + 1) the candidate per budget
    if (!dp || !nx || !ch) {
        free(dp);
        free(nx);
        free(ch);
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf choice: out of memory for the knapsack (%lld units)", (long long)W);
    }
    for (int64_t b = 0; b <= W; b++) dp[b] = 0;
    int64_t a = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!t[i].allocate || op[i].mix < 0) continue;
        uint8_t *ci = ch + (size_t)a++ * (size_t)(W + 1);
        for (int64_t b = 0; b <= W; b++) {
            nx[b] = INFINITY;
            ci[b] = 0;
            for (int k = 0; k < K; k++) {
                if (!op[i].bytes[k]) continue;
                int64_t w = (int64_t)((op[i].bytes[k] + u - 1) / u);
                if (w > b) continue;
                double v = dp[b - w] + cost(&op[i], k);
                if (v < nx[b]) {
                    nx[b] = v;
                    ci[b] = (uint8_t)k;
                }
            }
        }
        double *tmp = dp;
        dp = nx;
        nx = tmp;
    }
    // walk back from the full budget: the last tensor's choice at W, then the rest at what is left
    uint64_t used = 0;
    int64_t b = W;
    for (int64_t i = n - 1; i >= 0; i--) {
        if (!t[i].allocate || op[i].mix < 0) continue;
        const uint8_t *ci = ch + (size_t)--a * (size_t)(W + 1);
        sel[i] = ci[b];
        used += op[i].bytes[sel[i]];
        b -= (int64_t)((op[i].bytes[sel[i]] + u - 1) / u);
    }
    free(dp);
    free(nx);
    free(ch);
    fill(n, t, op, budget, used, sel);
    return LLMQ_OK;
}

// MEASURED: g_t = kld_ref / err(t, mix) of every allocated tensor, the smallest positive g where that is not
// positive and finite (see "Sensitivity" in the header). UNIFORM: nothing (every gain stays 1).
static enum llmq_status set_gains(const struct llmq_gguf_choose_opts *o, int64_t n,
                                  const struct llmq_gguf_choose_tensor *t, struct opt *op) {
    if (o->sensitivity != LLMQ_GGUF_SENS_MEASURED) return LLMQ_OK;
    double gmin = INFINITY;
    int64_t n_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!t[i].allocate || op[i].mix < 0) continue;
        double g = t[i].kld_ref / op[i].err[op[i].mix];
        op[i].gain = g > 0 && isfinite(g) ? g : NAN;
        if (isnan(op[i].gain))
            n_bad++;
        else if (g < gmin)
            gmin = g;
    }
    if (!isfinite(gmin))
        return llmq_errorf(LLMQ_ERR_NUMERIC, "gguf choice: no allocated tensor has a positive measured KLD per unit "
                                             "of error (--sensitivity measured); use --sensitivity uniform");
    for (int64_t i = 0; i < n; i++)
        if (t[i].allocate && op[i].mix >= 0 && isnan(op[i].gain)) op[i].gain = gmin;
    if (n_bad)
        llmq_warn("gguf choice: %lld tensors without a positive measured KLD per unit of error get the smallest "
                  "measured one (%.4g)",
                  (long long)n_bad, gmin);
    return LLMQ_OK;
}

static double bpw(uint64_t bytes, int64_t params) { return params > 0 ? 8.0 * (double)bytes / (double)params : 0; }

enum llmq_status llmq_gguf_choose(const struct llmq_gguf_choose_opts *o, int64_t n, struct llmq_gguf_choose_tensor *t,
                                  llmq_gguf_choose_rows_fn rows, void *user) {
    if (o->mode == LLMQ_GGUF_CHOICE_MIX) return LLMQ_OK;
    struct opt *op = calloc((size_t)(n > 0 ? n : 1), sizeof(*op));
    int *sel = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    struct work w = {0};
    enum llmq_status st = op && sel ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "gguf choice: out of memory");
    uint64_t before = 0, fixed = 0, min_b = 0, max_b = 0;
    double err_before = 0, err_after = 0;
    if (!st && o->mode == LLMQ_GGUF_CHOICE_TARGET) {
        llmq_gguf_choose_range(o, n, t, &min_b, &max_b);
        if (o->target_bytes < min_b)
            st = llmq_errorf(LLMQ_ERR_ARG,
                             "gguf choice: the target of %llu bytes (%.4f bits per weight) is below the smallest "
                             "reachable: %llu bytes (%.4f bits per weight)",
                             (unsigned long long)o->target_bytes, bpw(o->target_bytes, o->params),
                             (unsigned long long)min_b, bpw(min_b, o->params));
    }
    for (int64_t i = 0; i < n && !st; i++) {
        struct opt *p = &op[i];
        before += llmq_gguf_choose_bytes(&t[i], t[i].type);
        t[i].err = t[i].err_mix = t[i].pred_kld = 0;
        p->mix = t[i].is_free ? cand_index(t[i].type) : -1;
        p->gain = 1;
        for (int k = 0; k < K; k++) {
            bool out = k != p->mix && excluded(o, k);
            p->bytes[k] = p->mix >= 0 && !out ? llmq_gguf_choose_bytes(&t[i], cand[k]) : 0;
            p->err[k] = p->err_u[k] = INFINITY;
        }
        if (p->mix < 0) continue;
        if ((st = tensor_errors(o, &t[i], i, rows, user, &w, p))) break;
        t[i].err_mix = p->err[p->mix];
        err_before += t[i].err_mix;
        sel[i] = p->mix;
        if (!(o->mode == LLMQ_GGUF_CHOICE_TARGET && t[i].allocate)) sel[i] = pick_quality(p);
    }
    if (!st) st = set_gains(o, n, t, op);
    if (!st && o->mode == LLMQ_GGUF_CHOICE_TARGET) {
        for (int64_t i = 0; i < n; i++)
            if (!(t[i].allocate && op[i].mix >= 0))
                fixed += op[i].mix >= 0 ? op[i].bytes[sel[i]] : llmq_gguf_choose_bytes(&t[i], t[i].type);
        if (fixed > o->target_bytes)
            st = llmq_errorf(LLMQ_ERR_ARG,
                             "gguf choice: the tensors outside the allocation alone take %llu bytes, "
                             "more than the target's %llu",
                             (unsigned long long)fixed, (unsigned long long)o->target_bytes);
        else
            st = allocate(n, t, op, o->target_bytes - fixed, sel);
    }
    if (!st) {
        uint64_t after = 0;
        int64_t changed = 0;
        double kld_before = 0, kld_after = 0;
        const bool measured = o->sensitivity == LLMQ_GGUF_SENS_MEASURED;
        for (int64_t i = 0; i < n; i++) {
            if (op[i].mix >= 0) {
                changed += cand[sel[i]] != t[i].type;
                t[i].type = cand[sel[i]];
                t[i].err = op[i].err[sel[i]];
                err_after += t[i].err;
                if (measured && t[i].allocate) {
                    t[i].pred_kld = cost(&op[i], sel[i]);
                    kld_before += cost(&op[i], op[i].mix);
                    kld_after += t[i].pred_kld;
                }
            }
            after += llmq_gguf_choose_bytes(&t[i], t[i].type);
        }
        char kl[96] = "";
        if (measured) snprintf(kl, sizeof(kl), "; predicted KLD of the linears %.6g -> %.6g", kld_before, kld_after);
        llmq_info("gguf choice (%s): %lld of %lld tensors changed; tensor data %.2f -> %.2f MiB (%.4f -> %.4f bits per "
                  "weight); predicted err %.6g -> %.6g%s",
                  o->mode == LLMQ_GGUF_CHOICE_QUALITY ? "quality" : "target", (long long)changed, (long long)n,
                  (double)before / 1048576.0, (double)after / 1048576.0, bpw(before, o->params), bpw(after, o->params),
                  err_before, err_after, kl);
    }
    free(w.W);
    free(w.Q);
    free(w.blk);
    free(op);
    free(sel);
    return st;
}
