/*
 * tests/ops_tolerance.h — the attention tolerance of kernels/ops.h, shared by tests/unit/test_ops.c (which checks
 * the CPU reference against float64 with it, so that the bound is itself tested) and tests/gpu/test_ops_cuda.c
 * (device vs CPU reference).
 *
 * Derivation (u = 2^-24, the f32 unit roundoff; first order in u except where written with expm1):
 *   a score s_j = scale · q·k_j (then the softcap, whose derivative is <= 1) is computed by either side with
 *   |δs_j| <= (Dh + 8) u · Smax, Smax = max_j scale · Σ_i |q_i k_ji|: Dh for the dot product in any order
 *   (Higham, Accuracy and Stability, §3.1), 1 each for the scale, the division by the cap and the product with
 *   it, 4 for tanhf (2 ulp), 1 spare. Between two implementations that is twice that, δs <= 2 (Dh + 8) u Smax;
 *   p_j = e^{s_j} / Σ e^{s} then moves by a factor within e^{±2δs}: |δp_j| <= expm1(4 (Dh + 8) u Smax) p_j;
 *   the exponentials (expf within 2 ulp on CUDA, 1 in glibc), the online softmax's rescalings (one alpha =
 *   expf(m - m') and one product per key tile, nt tiles: 5 u each), the normalisation (the reference's
 *   (f32)(1 / sum) and product, the kernel's division: 2 u each side) and the sums over nk keys of
 *   p_j v_j and of p_j (nk u each side, any order) add (2 nk + 5 nt + 12) u relative to Σ_j p_j |v_jd|.
 *   So per output element d:
 *       |o_a - o_b| <= (expm1(4 (Dh + 8) u Smax) + (2 nk + 5 nt + 12) u) · Σ_j p_j |v_jd| + 1e-30.
 *   nt: the key tiles of 32 the device walks for the row's block of 8 rows, at most ceil((nk + 14) / 32).
 * The bound is worst case (errors add linearly); a wrong mask or head moves o by about p_j |v_j - o| ≈ |v| / nk,
 * far above it for the sequence lengths tested (nk <= a few thousand).
 */
#ifndef LLMQ_TEST_OPS_TOLERANCE_H
#define LLMQ_TEST_OPS_TOLERANCE_H

#include "kernels/ops.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// For attention a on host q (T, Dq), k, v (T, Dkv): exact (T, Dq) the float64 attention, bound (T, Dq) the
// tolerance above. Returns 0, or 1 when out of memory.
static inline int ops_attn_exact(const struct llmq_ops_attn *a, const float *q, const float *k, const float *v,
                                 double *exact, double *bound) {
    const int64_t S = a->seqlen, H = a->n_head, Dh = a->head_dim, Dq = H * Dh, Dkv = a->n_head_kv * Dh;
    const double u = ldexp(1.0, -24);
    double *sc = malloc((size_t)S * sizeof(double)), *sa = malloc((size_t)S * sizeof(double));
    if (!sc || !sa) {
        free(sc), free(sa);
        return 1;
    }
    for (int64_t s = 0; s < a->n_seq; s++)
        for (int64_t t = 0; t < S; t++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t hk = h / (H / a->n_head_kv),
                              lo = a->window > 0 && t + 1 > a->window ? t + 1 - a->window : 0;
                const float *qr = q + (s * S + t) * Dq + h * Dh;
                double mx = -INFINITY, smax = 0.0, sum = 0.0;
                for (int64_t j = lo; j <= t; j++) {
                    const float *kr = k + (s * S + j) * Dkv + hk * Dh;
                    double d = 0.0, da = 0.0;
                    for (int64_t i = 0; i < Dh; i++) d += (double)qr[i] * kr[i], da += fabs((double)qr[i] * kr[i]);
                    d *= a->scale;
                    if (a->softcap > 0.0f) d = tanh(d / a->softcap) * a->softcap;
                    sc[j] = d;
                    sa[j] = da * fabs((double)a->scale);
                    if (d > mx) mx = d;
                    if (sa[j] > smax) smax = sa[j];
                }
                for (int64_t j = lo; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                const int64_t nk = t + 1 - lo, nt = (nk + 14 + 31) / 32;
                const double rel = expm1(4.0 * (double)(Dh + 8) * u * smax) + (double)(2 * nk + 5 * nt + 12) * u;
                for (int64_t d = 0; d < Dh; d++) {
                    double o = 0.0, oa = 0.0;
                    for (int64_t j = lo; j <= t; j++) {
                        const double vj = v[(s * S + j) * Dkv + hk * Dh + d], p = sc[j] / sum;
                        o += p * vj, oa += p * fabs(vj);
                    }
                    exact[(s * S + t) * Dq + h * Dh + d] = o;
                    bound[(s * S + t) * Dq + h * Dh + d] = rel * oa + 1e-30;
                }
            }
    free(sc), free(sa);
    return 0;
}

// Elements of got (n) farther than bound from want; prints the first 5 (label first; NULL: silent) and the
// largest |got - want| / bound into *worst.
static inline int64_t ops_count_outside(const char *label, const float *got, const double *want, const double *bound,
                                        int64_t n, double *worst) {
    int64_t bad = 0;
    *worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]), r = e / bound[i];
        if (!(r <= *worst)) *worst = r; // NaN wins
        if (!(e <= bound[i]) && bad++ < 5 && label)
            fprintf(stderr, "%s: element %lld: got %.9g, want %.9g, |diff| %.3g > bound %.3g\n", label, (long long)i,
                    got[i], want[i], e, bound[i]);
    }
    return bad;
}

#endif // LLMQ_TEST_OPS_TOLERANCE_H
