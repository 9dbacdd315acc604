/*
 * kernels/gptq.c — the dispatch of kernels/gptq.h and its CPU reference (steps 5-7 of GPTQ). Mirrors
 * IST-DASLab/gptq gptq.py fasterquant line by line, with the reference's names (H, Hinv, W1, Q1, Err1).
 *
 * Layout notes. W is row-major (R, C); GPTQ rows are independent, so the in-block loop runs row by row over
 * a contiguous slice W[r, i1:i2] (the reference's W1 column block, updated in place: every value the
 * reference later reads from the stale W[:, i1:i2] — the dynamic-group ranges — is taken at the start of the
 * block, before the slice changes).
 *
 * The Cholesky chain runs in column-major LAPACK on the symmetric row-major H: spotrf('U') = the reference's
 * cholesky (lower L, in our lower triangle), spotri('U') = cholesky_inverse, mirror lower -> upper,
 * spotrf('L') = cholesky(upper=True) in our upper triangle. No LAPACKE row-major wrappers: they would
 * transpose through a second C x C buffer.
 */
#include "kernels/gptq.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/gptq_cuda.h"
#include "kernels/gptq_grid.h"

struct llmq_gptq_solver {
    struct llmq_gptq_solve s;
    float *H;                   // (C, C) the caller's H
    float *backup;              // (C, C) CPU: copy of the undamped H (NULL: rebuilt from s.H_src)
    bool own_backup;            // backup allocated here
    struct llmq_cuda_gptq *dev; // CUDA state
    int32_t *perm32;            // (C) CUDA: perm as int32
};

// One attempt of step 6 on H (already damped): 0 on success.
static int hinv_chain(float *H /* (C, C) */, int64_t C) {
    lapack_int n = (lapack_int)C;
    if (LAPACKE_spotrf(LAPACK_COL_MAJOR, 'U', n, H, n) != 0) return 1; // H = L·Lᵀ, L in our lower
    if (LAPACKE_spotri(LAPACK_COL_MAJOR, 'U', n, H, n) != 0) return 2; // H⁻¹ in our lower
    for (int64_t i = 0; i < C; i++)                                    // mirror lower -> upper
        for (int64_t j = 0; j < i; j++) H[j * C + i] = H[i * C + j];
    if (LAPACKE_spotrf(LAPACK_COL_MAJOR, 'L', n, H, n) != 0) return 3; // H⁻¹ = Uᵀ·U, U in our upper
    for (int64_t i = 0; i < C; i++) {
        float d = H[i * C + i];
        if (!(d > 0.0f) || !isfinite(d)) return 4;
        memset(H + i * C, 0, (size_t)i * sizeof(float)); // strict lower = 0
    }
    return 0;
}

void llmq_gptq_rebuild_h(float *H, const float *Hsrc, const int64_t *perm, int64_t C) {
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) {
            float v = Hsrc[perm[i] * C + perm[j]];
            H[i * C + j] = i == j && v == 0.0f ? 1.0f : v;
        }
}

enum llmq_status llmq_gptq_solver_init(const struct llmq_gptq_solve *s, float *H, struct llmq_gptq_solver **out) {
    *out = NULL;
    const char *name = s->name ? s->name : "gptq";
    if (s->backend != LLMQ_BACKEND_CPU && s->backend != LLMQ_BACKEND_CUDA)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: unknown backend %d", name, (int)s->backend);
    if (s->backend == LLMQ_BACKEND_CUDA && (s->grid || s->P))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: GPTQ on CUDA computes only the min/max grid, without GPTAQ", name);
    if (s->C <= 0 || (s->backend == LLMQ_BACKEND_CUDA && (s->R <= 0 || s->B <= 0)))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: bad GPTQ solve (R %lld, C %lld, B %lld)", name, (long long)s->R,
                           (long long)s->C, (long long)s->B);
    struct llmq_gptq_solver *g = calloc(1, sizeof *g);
    if (!g) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for the GPTQ solver", name);
    g->s = *s;
    g->s.name = name;
    g->H = H;
    const int64_t C = s->C;
    enum llmq_status st = LLMQ_OK;
    if (s->backend == LLMQ_BACKEND_CPU) {
        if (!s->H_src) {
            g->backup = s->backup;
            if (!g->backup) {
                g->backup = malloc((size_t)(C * C) * sizeof *g->backup);
                g->own_backup = true;
            }
            if (!g->backup) {
                st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for the Hessian backup (C = %lld)", name,
                                 (long long)C);
                goto fail;
            }
            memcpy(g->backup, H, (size_t)(C * C) * sizeof *H);
        }
    } else {
        const char *why = NULL;
        if (llmq_cuda_device_count(&why) == 0) {
            st = llmq_errorf(LLMQ_ERR_DEVICE, "%s: GPTQ on CUDA: no CUDA device: %s", name, why);
            goto fail;
        }
        if (!(g->perm32 = malloc((size_t)C * sizeof *g->perm32))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for GPTQ scratch (C = %lld)", name, (long long)C);
            goto fail;
        }
        for (int64_t j = 0; j < C; j++) g->perm32[j] = (int32_t)s->perm[j];
        if ((st = llmq_cuda_gptq_init(name, s->R, C, s->NG, s->B, &g->dev))) goto fail;
    }
    *out = g;
    return LLMQ_OK;
fail:
    llmq_gptq_solver_free(g);
    return st;
}

int llmq_gptq_solver_hinv_attempt(struct llmq_gptq_solver *g, float damp) {
    if (g->s.backend == LLMQ_BACKEND_CUDA) return llmq_cuda_gptq_hinv_attempt(g->dev, g->H, damp);
    const int64_t C = g->s.C;
    for (int64_t i = 0; i < C; i++) g->H[i * C + i] += damp;
    int fail = hinv_chain(g->H, C);
    if (fail && g->backup) memcpy(g->H, g->backup, (size_t)(C * C) * sizeof *g->H);
    if (fail && !g->backup) llmq_gptq_rebuild_h(g->H, g->s.H_src, g->s.perm, C);
    if (!fail && g->own_backup) { // no further attempt: the C x C backup is not held through the blocks
        free(g->backup);
        g->backup = NULL;
        g->own_backup = false;
    }
    return fail;
}

// The in-block loop of one row; P1 / wpre1 NULL: plain GPTQ (llmq_gptq_block_row), else GPTAQ's term too.
static inline double block_row(float *W1, float *err1, uint8_t *code1, float *wpre1, const float *Hinv1,
                               const float *P1, int64_t ldh, int64_t count, const float *scales, const float *zeros,
                               const int32_t *gcol, int maxq) {
    double rloss = 0.0;
    for (int64_t i = 0; i < count; i++) {
        const float scale = scales[gcol[i]], zero = zeros[gcol[i]];
        const float w = W1[i], d = Hinv1[i * ldh + i];
        const uint8_t code = llmq_gptq_grid_code(w, scale, zero, maxq);
        const float q = scale * ((float)code - zero);   // Q1[:, i]
        const float e = (w - q) / d;                    // err1
        rloss += (double)((w - q) * (w - q) / (d * d)); // Losses1[:, i]
        const float *hrow = Hinv1 + i * ldh;            // Hinv1[i, :]
        if (P1) {
            const float *prow = P1 + i * ldh; // P1[i, :]
            for (int64_t k = i + 1; k < count; k++) W1[k] -= e * hrow[k] - w * prow[k];
            wpre1[i] = w;
        } else {
            for (int64_t k = i + 1; k < count; k++) W1[k] -= e * hrow[k];
        }
        err1[i] = e;
        W1[i] = q;
        code1[i] = code;
    }
    return rloss;
}

double llmq_gptq_block_row(float *W1, float *err1, uint8_t *code1, const float *Hinv1, int64_t ldh, int64_t count,
                           const float *scales, const float *zeros, const int32_t *gcol, int maxq) {
    return block_row(W1, err1, code1, NULL, Hinv1, NULL, ldh, count, scales, zeros, gcol, maxq);
}

// The dynamic group at processing column c, n columns of every row: grids from W as it is now.
static void dynamic_grids(const struct llmq_gptq_solve *s, const float *W, int64_t c, int64_t n, float *scales,
                          float *zeros) {
    const int64_t C = s->C, NG = s->NG, g = c / s->G_dyn;
    for (int64_t r = 0; r < s->R; r++) {
        const float *x = W + r * C + c;
        if (s->grid) {
            s->grid(s->grid_ctx, x, n, c, &scales[r * NG + g], &zeros[r * NG + g]);
            continue;
        }
        float xmin = 0.0f, xmax = 0.0f; // the range always includes 0
        for (int64_t i = 0; i < n; i++) {
            if (x[i] < xmin) xmin = x[i];
            if (x[i] > xmax) xmax = x[i];
        }
        llmq_gptq_grid_params(xmin, xmax, s->bits, s->sym, &scales[r * NG + g], &zeros[r * NG + g]);
    }
}

// Step 7 on the CPU: lazy blocks over W (R, C) with Hinv (C, C) (upper).
static enum llmq_status blocks_cpu(struct llmq_gptq_solver *g, float *W, float *scales, float *zeros, uint8_t *q,
                                   double *loss, double *t_update) {
    const struct llmq_gptq_solve *s = &g->s;
    const int64_t R = s->R, C = s->C, B = s->B, NG = s->NG, G_dyn = s->G_dyn;
    const float *Hinv = g->H;
    const int maxq = (1 << s->bits) - 1;
    const float *P = s->P;                                             // (C, C) GPTAQ's term, or NULL
    float *Err1 = malloc((size_t)(R * B) * sizeof *Err1);              // (R, B) scaled errors of the current block
    uint8_t *code1 = malloc((size_t)B);                                // (B) one row's codes, block order
    float *Wpre1 = P ? malloc((size_t)(R * B) * sizeof *Wpre1) : NULL; // (R, B) GPTAQ: pre-rounding weights
    if (!Err1 || !code1 || (P && !Wpre1)) {
        free(Wpre1);
        free(code1);
        free(Err1);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for GPTQ scratch (R = %lld)", s->name, (long long)R);
    }
    for (int64_t i1 = 0; i1 < C; i1 += B) {
        const int64_t i2 = i1 + B < C ? i1 + B : C, count = i2 - i1;

        // dynamic groups starting in this block: find_params(W[:, c:c+G]) from W as it is now
        if (G_dyn > 0)
            for (int64_t c = ((i1 + G_dyn - 1) / G_dyn) * G_dyn; c < i2; c += G_dyn)
                dynamic_grids(s, W, c, c + G_dyn <= C ? G_dyn : C - c, scales, zeros);

        for (int64_t r = 0; r < R; r++) {
            // W[r, i1:i2] is this row's block of the reference's W1, updated in place; ends as Q1
            *loss +=
                block_row(W + r * C + i1, Err1 + r * count, code1, P ? Wpre1 + r * count : NULL, Hinv + i1 * C + i1,
                          P ? P + i1 * C + i1 : NULL, C, count, scales + r * NG, zeros + r * NG, s->gcol + i1, maxq);
            for (int64_t i = 0; i < count; i++) q[r * C + s->perm[i1 + i]] = code1[i]; // original order
        }

        // W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]
        // (GPTAQ first: W[:, i2:] += Wpre1 · P[i1:i2, i2:])
        double tg = llmq_now_s();
        if (i2 < C && P)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)R, (blasint)(C - i2), (blasint)count, 1.0f,
                        Wpre1, (blasint)count, P + i1 * C + i2, (blasint)C, 1.0f, W + i2, (blasint)C);
        if (i2 < C)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)R, (blasint)(C - i2), (blasint)count, -1.0f,
                        Err1, (blasint)count, Hinv + i1 * C + i2, (blasint)C, 1.0f, W + i2, (blasint)C);
        if (t_update) *t_update += llmq_now_s() - tg;
    }
    free(Wpre1);
    free(code1);
    free(Err1);
    return LLMQ_OK;
}

// Step 7 on the device; the per-row losses come back and are summed in the CPU's order.
static enum llmq_status blocks_cuda(struct llmq_gptq_solver *g, float *W, float *scales, float *zeros, uint8_t *q,
                                    double *loss) {
    const struct llmq_gptq_solve *s = &g->s;
    const int64_t nblocks = (s->C + s->B - 1) / s->B;
    double *loss_rows = malloc((size_t)(nblocks * s->R) * sizeof *loss_rows); // (nblocks, R)
    if (!loss_rows)
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for GPTQ scratch (R = %lld)", s->name, (long long)s->R);
    enum llmq_status st = llmq_cuda_gptq_blocks(g->dev, W, s->gcol, g->perm32, s->G_dyn, s->bits, s->sym, scales, zeros,
                                                q, loss_rows, g->H);
    if (!st)
        for (int64_t i = 0; i < nblocks * s->R; i++) *loss += loss_rows[i]; // block by block, rows in order
    free(loss_rows);
    return st;
}

enum llmq_status llmq_gptq_solver_blocks(struct llmq_gptq_solver *g, float *W, float *scales, float *zeros, uint8_t *q,
                                         double *loss, double *t_update) {
    const struct llmq_gptq_solve *s = &g->s;
    if (s->R <= 0 || s->B <= 0 || s->bits < 1 || s->bits > 8 || (s->G_dyn > 0 && !s->gcol) || !s->perm)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: bad GPTQ solve (R %lld, C %lld, B %lld, bits %d)", s->name,
                           (long long)s->R, (long long)s->C, (long long)s->B, s->bits);
    if (g->s.backend == LLMQ_BACKEND_CUDA) return blocks_cuda(g, W, scales, zeros, q, loss);
    return blocks_cpu(g, W, scales, zeros, q, loss, t_update);
}

void llmq_gptq_release_device(void) { llmq_cuda_gptq_release_spare(); }

void llmq_gptq_solver_free(struct llmq_gptq_solver *g) {
    if (!g) return;
    llmq_cuda_gptq_free(g->dev);
    free(g->perm32);
    if (g->own_backup) free(g->backup);
    free(g);
}
