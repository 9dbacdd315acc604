/*
 * tests/block_tolerance.h — a float64 reference of kernels/block.h's block and a per-element bound on the error of
 * an FP32 implementation of it, shared by tests/unit/test_block.c (the CPU block against float64 with it: the bound
 * is itself tested) and tests/gpu/test_block_cuda.c (CUDA against the CPU block with TWICE it: two implementations,
 * each within the bound of the float64 result).
 *
 * Derivation (u = 2^-24; FIRST ORDER in u: products of two error terms are dropped, which for these O(1)
 * activations and O(100) dot lengths is below 1e-10 of the bound). Every intermediate z carries e(z), a bound on
 * |z_f32 - z_exact|, propagated through each step's derivative plus that step's own rounding:
 *   RMSNorm y_i = x_i s w_i, s = (m + eps)^-1/2, m = Σ x² / D: δm <= (2/D) Σ |x_j| e_j, |δs| / s <= δm / (2 (m +
 *     eps)); e(y_i) = |w_i| s (e_i + |x_i| δs / s) + 8 u |y_i| (squares, mean, + eps, sqrt, 1/x, two products: 5.5 u
 *     in kernels/ops.h's order, rounded up).
 *   Linear y_r = Σ_c W_rc x_c (+ b_r): e(y_r) = Σ_c |W_rc| e(x_c) + γ(C + 1) (Σ_c |W_rc x_c| + |b_r|), γ(n) = n u /
 *     (1 - n u): a dot product in any order, fused or not (Higham, Accuracy and Stability, §3.1).
 *   RoPE a' = a c - b s: e(a') = |c| e(a) + |s| e(b) + 2 u (|a c| + |b s|); the reference uses the f32 tables of
 *     llmq_ops_rope_table, which both implementations share (the tables' own error is then no difference).
 *   Attention, per query row and head: scores σ_j = scale q·k_j with e(σ_j) = scale Σ_i (|k_ji| e(q_i) + |q_i|
 *     e(k_ji)) from the inputs; p = softmax(σ) moves by |δp_j| <= p_j (e(σ_j) + Σ_i p_i e(σ_i)); o_d = Σ_j p_j v_jd
 *     gets Σ_j p_j e(v_jd) + Σ_j |δp_j| |v_jd| from its inputs plus its own rounding, taken from
 *     tests/ops_tolerance.h: (expm1(4 (Dh + 8) u Smax) + (2 nk + 5 nt + 12) u) Σ_j p_j |v_jd| (the bound between
 *     two FP32 attentions, so more than one's own).
 *   SwiGLU y = silu(g) · v: |silu'| <= 1.1, so e(y) = 1.1 e(g) |v| + |silu(g)| e(v) + 8 u |y| + 1e-36 |v| (expf
 *     within 2 ulp, 1 + e, the division and the product: 7 u; the absolute term is exp's overflow near g = -88.7).
 *   Residual add x' = x + y: e(x') = e(x) + e(y) + u |x'|.
 * The bound is worst case (errors add linearly); a wrong RoPE pairing, mask or head moves the output by O(1) of
 * the attention's share of it, far above it.
 */
#ifndef LLMQ_TEST_BLOCK_TOLERANCE_H
#define LLMQ_TEST_BLOCK_TOLERANCE_H

#include "kernels/block.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BT_U 5.9604644775390625e-8 // 2^-24

static inline double bt_gamma(int64_t n) { return (double)n * BT_U / (1.0 - (double)n * BT_U); }

// y, ey (n, R) = x (n, C) · Wᵀ (+ b) with its bound, from x, ex (n, C).
static inline void bt_linear(const float *W, const float *b, int64_t R, int64_t C, const double *x, const double *ex,
                             int64_t n, double *y, double *ey) {
    const double g = bt_gamma(C + 1);
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < R; r++) {
            double acc = b ? b[r] : 0.0, prop = 0.0, mag = b ? fabs((double)b[r]) : 0.0;
            const float *w = W + r * C;
            for (int64_t c = 0; c < C; c++) {
                acc += (double)w[c] * x[t * C + c];
                prop += fabs((double)w[c]) * ex[t * C + c];
                mag += fabs((double)w[c] * x[t * C + c]);
            }
            y[t * R + r] = acc;
            ey[t * R + r] = prop + g * mag;
        }
}

// y, ey (n, D) = RMSNorm of the rows of x, ex (n, D) times w (D); y may be x, ey may be ex.
static inline void bt_rmsnorm(const double *x, const double *ex, const float *w, int64_t n, int64_t D, float eps,
                              double *y, double *ey) {
    for (int64_t t = 0; t < n; t++) {
        const double *xr = x + t * D, *er = ex + t * D;
        double ss = 0.0, dm = 0.0;
        for (int64_t i = 0; i < D; i++) ss += xr[i] * xr[i], dm += 2.0 * fabs(xr[i]) * er[i];
        const double m = ss / (double)D + (double)eps, s = 1.0 / sqrt(m), ds = dm / (double)D / (2.0 * m);
        for (int64_t i = 0; i < D; i++) {
            const double xi = xr[i], ei = er[i], v = xi * s * w[i];
            ey[t * D + i] = fabs((double)w[i]) * s * (ei + fabs(xi) * ds) + 8.0 * BT_U * fabs(v);
            y[t * D + i] = v;
        }
    }
}

// RoPE in place on x, ex (T, heads · Dh) with the f32 tables cs, sn (seqlen, Dh/2).
static inline void bt_rope(double *x, double *ex, int64_t T, int64_t seqlen, int64_t heads, int64_t Dh, bool neox,
                           const float *cs, const float *sn) {
    const int64_t half = Dh / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < half; i++) {
                const int64_t base = (t * heads + h) * Dh, ia = base + (neox ? i : 2 * i),
                              ib = base + (neox ? i + half : 2 * i + 1);
                const double c = cs[(t % seqlen) * half + i], s = sn[(t % seqlen) * half + i];
                const double a = x[ia], b = x[ib], ea = ex[ia], eb = ex[ib];
                x[ia] = a * c - b * s, x[ib] = a * s + b * c;
                ex[ia] = fabs(c) * ea + fabs(s) * eb + 2.0 * BT_U * (fabs(a * c) + fabs(b * s));
                ex[ib] = fabs(s) * ea + fabs(c) * eb + 2.0 * BT_U * (fabs(a * s) + fabs(b * c));
            }
}

// Causal GQA attention o, eo (T, Dq) of q, k, v with their bounds; p, es: (seqlen) scratch.
static inline void bt_attention(const struct llmq_block_shape *s, int64_t n_seq, int64_t S, const double *q,
                                const double *eq, const double *k, const double *ek, const double *v, const double *ev,
                                double *o, double *eo, double *p, double *es) {
    const int64_t H = s->n_head, Dh = s->head_dim, Dq = H * Dh, Dkv = s->n_head_kv * Dh, grp = H / s->n_head_kv;
    const double sc = s->attn_scale;
    for (int64_t sq = 0; sq < n_seq; sq++)
        for (int64_t t = 0; t < S; t++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t qo = (sq * S + t) * Dq + h * Dh, hk = h / grp;
                double mx = -INFINITY, smax = 0.0, sum = 0.0, pes = 0.0;
                for (int64_t j = 0; j <= t; j++) {
                    const int64_t ko = (sq * S + j) * Dkv + hk * Dh;
                    double d = 0.0, da = 0.0, e = 0.0;
                    for (int64_t i = 0; i < Dh; i++) {
                        d += q[qo + i] * k[ko + i], da += fabs(q[qo + i] * k[ko + i]);
                        e += fabs(k[ko + i]) * eq[qo + i] + fabs(q[qo + i]) * ek[ko + i];
                    }
                    p[j] = d * sc, es[j] = e * fabs(sc);
                    if (p[j] > mx) mx = p[j];
                    if (da * fabs(sc) > smax) smax = da * fabs(sc);
                }
                for (int64_t j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                for (int64_t j = 0; j <= t; j++) p[j] /= sum, pes += p[j] * es[j];
                const int64_t nk = t + 1, nt = (nk + 14 + 31) / 32;
                const double rel = expm1(4.0 * (double)(Dh + 8) * BT_U * smax) + (double)(2 * nk + 5 * nt + 12) * BT_U;
                for (int64_t d = 0; d < Dh; d++) {
                    double acc = 0.0, mag = 0.0, prop = 0.0;
                    for (int64_t j = 0; j <= t; j++) {
                        const int64_t vo = (sq * S + j) * Dkv + hk * Dh + d;
                        acc += p[j] * v[vo], mag += p[j] * fabs(v[vo]);
                        prop += p[j] * ev[vo] + p[j] * (es[j] + pes) * fabs(v[vo]);
                    }
                    o[qo + d] = acc;
                    eo[qo + d] = prop + rel * mag;
                }
            }
}

// x, ex (n) += y, ey (n).
static inline void bt_add(double *x, double *ex, const double *y, const double *ey, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] += y[i];
        ex[i] += ey[i] + BT_U * fabs(x[i]);
    }
}

// g, eg (n) = silu(g) · v with the bound.
static inline void bt_swiglu(double *g, double *eg, const double *v, const double *ev, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const double si = g[i] / (1.0 + exp(-g[i])), y = si * v[i];
        eg[i] = 1.1 * eg[i] * fabs(v[i]) + fabs(si) * ev[i] + 8.0 * BT_U * fabs(y) + 1e-36 * fabs(v[i]);
        g[i] = y;
    }
}

// exact (T, D): the block of shape s with weights w (kernels/block.h order; NULL where the shape has none) on x (T,
// D) in float64, T = n_seq · seqlen; bound (T, D): the bound above on one FP32 implementation's error. 0, or 1 when
// out of memory.
static inline int block_tol_reference(const struct llmq_block_shape *s, const float *const *w, const float *x,
                                      int64_t n_seq, int64_t seqlen, double *exact, double *bound) {
    const int64_t D = s->n_embd, F = s->n_ff, Dh = s->head_dim, Dq = s->n_head * Dh, Dkv = s->n_head_kv * Dh;
    const int64_t T = n_seq * seqlen, half = Dh / 2;
    const int64_t sizes[] = {T * D, T * Dq, T * Dkv, T * Dkv, T * Dq, T * D, T * F, T * F, seqlen, seqlen};
    double *buf[2 * 10] = {0};
    float *cs = malloc((size_t)(seqlen * half) * sizeof(float)), *sn = malloc((size_t)(seqlen * half) * sizeof(float));
    int fail = !cs || !sn;
    for (int i = 0; i < 10 && !fail; i++)
        fail = !(buf[2 * i] = calloc((size_t)sizes[i], sizeof(double))) ||
               !(buf[2 * i + 1] = calloc((size_t)sizes[i], sizeof(double)));
    if (!fail) {
        double *xn = buf[0], *exn = buf[1], *q = buf[2], *eq = buf[3], *k = buf[4], *ek = buf[5], *v = buf[6];
        double *ev = buf[7], *at = buf[8], *eat = buf[9], *out = buf[10], *eout = buf[11], *g = buf[12];
        double *eg = buf[13], *up = buf[14], *eup = buf[15], *p = buf[16], *es = buf[17];
        llmq_ops_rope_table(s->rope_theta, Dh, s->rope_ff, 1.0f, seqlen, cs, sn);
        for (int64_t i = 0; i < T * D; i++) exact[i] = x[i], bound[i] = 0.0;
        bt_rmsnorm(exact, bound, w[LLMQ_BLOCK_ATTN_NORM], T, D, s->rms_eps, xn, exn);
        bt_linear(w[LLMQ_BLOCK_WQ], s->qkv_bias ? w[LLMQ_BLOCK_BQ] : NULL, Dq, D, xn, exn, T, q, eq);
        bt_linear(w[LLMQ_BLOCK_WK], s->qkv_bias ? w[LLMQ_BLOCK_BK] : NULL, Dkv, D, xn, exn, T, k, ek);
        bt_linear(w[LLMQ_BLOCK_WV], s->qkv_bias ? w[LLMQ_BLOCK_BV] : NULL, Dkv, D, xn, exn, T, v, ev);
        if (s->qk_norm) {
            bt_rmsnorm(q, eq, w[LLMQ_BLOCK_Q_NORM], T * s->n_head, Dh, s->rms_eps, q, eq);
            bt_rmsnorm(k, ek, w[LLMQ_BLOCK_K_NORM], T * s->n_head_kv, Dh, s->rms_eps, k, ek);
        }
        bt_rope(q, eq, T, seqlen, s->n_head, Dh, s->rope_neox, cs, sn);
        bt_rope(k, ek, T, seqlen, s->n_head_kv, Dh, s->rope_neox, cs, sn);
        bt_attention(s, n_seq, seqlen, q, eq, k, ek, v, ev, at, eat, p, es);
        bt_linear(w[LLMQ_BLOCK_WO], NULL, D, Dq, at, eat, T, out, eout);
        bt_add(exact, bound, out, eout, T * D);
        bt_rmsnorm(exact, bound, w[LLMQ_BLOCK_FFN_NORM], T, D, s->rms_eps, xn, exn);
        bt_linear(w[LLMQ_BLOCK_WGATE], NULL, F, D, xn, exn, T, g, eg);
        bt_linear(w[LLMQ_BLOCK_WUP], NULL, F, D, xn, exn, T, up, eup);
        bt_swiglu(g, eg, up, eup, T * F);
        bt_linear(w[LLMQ_BLOCK_WDOWN], NULL, D, F, g, eg, T, out, eout);
        bt_add(exact, bound, out, eout, T * D);
        for (int64_t i = 0; i < T * D; i++) bound[i] += 1e-30;
    }
    for (int i = 0; i < 20; i++) free(buf[i]);
    free(cs), free(sn);
    return fail;
}

// Elements of got (n) farther than scale · bound from want; prints the first 5 (label first; NULL: silent) and
// the largest |got - want| / (scale · bound) into *worst.
static inline int64_t block_tol_outside_scaled(const char *label, const float *got, const double *want,
                                               const double *bound, double scale, int64_t n, double *worst) {
    int64_t bad = 0;
    *worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]), r = e / (scale * bound[i]);
        if (r > *worst || isnan(r)) *worst = isnan(r) ? INFINITY : r;
        if (!(e <= scale * bound[i]) && bad++ < 5 && label)
            fprintf(stderr, "%s: element %lld: got %.9g want %.9g (|diff| %.3g, bound %.3g)\n", label, (long long)i,
                    got[i], want[i], e, scale * bound[i]);
    }
    return bad;
}

static inline int64_t block_tol_outside(const char *label, const float *got, const double *want, const double *bound,
                                        int64_t n, double *worst) {
    return block_tol_outside_scaled(label, got, want, bound, 1.0, n, worst);
}

#endif // LLMQ_TEST_BLOCK_TOLERANCE_H
