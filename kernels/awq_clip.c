// kernels/awq_clip.c — AWQ's clip search per linear: the checks, the dispatch and the plain-C reference
// (kernels/awq_clip.h has the algorithm).
#include "kernels/awq_clip.h"

#include "common/log.h"

#include <stdlib.h>

// G_g (G, G) = X_gᵀ X_g in f64 for the columns [c0, c0 + G) of X (T, C), t ascending for every entry.
static void group_gram(const float *X, int64_t T, int64_t C, int64_t c0, int64_t G, double *Gg) {
    for (int64_t j = 0; j < G * G; j++) Gg[j] = 0.0;
    for (int64_t t = 0; t < T; t++) {
        const float *x = X + t * C + c0;
        for (int64_t j = 0; j < G; j++)
            for (int64_t k = 0; k < G; k++) Gg[j * G + k] += (double)x[j] * (double)x[k];
    }
}

// dᵀ G_g d, d = q − w, as Σ_j d_j (Σ_k G_jk d_k), j and k ascending.
static double quad_form(const double *Gg, const float *q, const float *w, int64_t G, double *d) {
    for (int64_t j = 0; j < G; j++) d[j] = (double)q[j] - (double)w[j];
    double e = 0.0;
    for (int64_t j = 0; j < G; j++) {
        double y = 0.0;
        for (int64_t k = 0; k < G; k++) y += Gg[j * G + k] * d[k];
        e += d[j] * y;
    }
    return e;
}

static enum llmq_status clip_cpu(const float *W, int64_t R, int64_t C, int64_t G, const float *X, int64_t T, int bits,
                                 int K, int n_grid, float *best, double *err) {
    const int64_t NG = C / G;
    double *Gg = malloc((size_t)(G * G) * sizeof(double)), *d = malloc((size_t)G * sizeof(double));
    float *q = malloc((size_t)(K * G) * sizeof(float));
    enum llmq_status st = LLMQ_OK;
    if (!Gg || !d || !q) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "awq clip: out of memory for a group of %lld", (long long)G);
        goto done;
    }
    for (int64_t g = 0; g < NG; g++) {
        group_gram(X, T, C, g * G, G, Gg);
        for (int64_t r = 0; r < R; r++) {
            const float *w = W + r * C + g * G;
            const float amax = llmq_awq_clip_candidates(w, G, bits, K, n_grid, q);
            double min_err = 1e9;
            float best_max = amax;
            for (int i = 0; i < K; i++) {
                const double e = quad_form(Gg, q + i * G, w, G, d) / (double)T;
                if (e < min_err) min_err = e, best_max = amax * (float)(1.0 - (double)i / (double)n_grid);
            }
            best[r * NG + g] = best_max;
            err[r * NG + g] = min_err;
        }
    }
done:
    free(Gg), free(d), free(q);
    return st;
}

enum llmq_status llmq_awq_clip(enum llmq_backend be, const float *W, int64_t R, int64_t C, int64_t G, const float *X,
                               int64_t T, int bits, int K, int n_grid, float *best, double *err) {
    if (R < 1 || C < 1 || G < 1 || C % G != 0 || T < 1 || bits < 1 || bits > 8 || n_grid < 1 || K < 1 || K > n_grid ||
        !W || !X || !best || !err)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "awq clip: bad arguments (W %lld x %lld, group %lld, %lld tokens, %d bits, %d of "
                           "%d shrinks)",
                           (long long)R, (long long)C, (long long)G, (long long)T, bits, K, n_grid);
    if (be == LLMQ_BACKEND_CUDA) return llmq_awq_clip_cuda(W, R, C, G, X, T, bits, K, n_grid, best, err);
    return clip_cpu(W, R, C, G, X, T, bits, K, n_grid, best, err);
}
