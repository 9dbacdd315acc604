/*
 * quant/gptq.c — GPTQ `fasterquant` for one linear layer (see gptq.h for the contract and the step
 * list; the step numbers below refer to it). Mirrors IST-DASLab/gptq gptq.py line by line, with the
 * reference's names: H, Hinv, W1, Q1, Err1, blocksize, percdamp, perm, invperm.
 *
 * Legend: R rows/out, C cols/in, G group size, NG groups per row, B blocksize.
 *
 * Steps 5-7 (damping, the Cholesky chain, the lazy block loop) run behind kernels/gptq.h on either
 * backend; this file keeps steps 1-4 and 8, the damping retry policy (hinv_retry: which damping next, its
 * warnings and its error) and the choice of backend: a searched grid (--grid mse | hmse) is a CPU callback,
 * so with it steps 5-7 run on the CPU whatever the backend. This file is built with -ffp-contract=off.
 */
#include "quant/gptq.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "kernels/gptq.h"

struct llmq_gptq_opts llmq_gptq_opts_default(void) {
    struct llmq_gptq_opts o = {
        .q = {.bits = 4, .group_size = 128, .sym = false},
        .percdamp = LLMQ_GPTQ_PERCDAMP_DEFAULT,
        .act_order = false,
        .static_groups = false,
        .blocksize = LLMQ_GPTQ_BLOCKSIZE_DEFAULT,
        .damp_increment = LLMQ_GPTQ_DAMP_INCREMENT_DEFAULT,
        .gptaq_alpha = LLMQ_GPTAQ_ALPHA_DEFAULT,
    };
    return o;
}

// Steps 5 + 6 with GPTQModel's retry, for either backend: mean(diag H) of the undamped H (C, C), then
// attempts (kernels/gptq.h) with percdamp, percdamp + increment, ... until one succeeds or percdamp reaches 1.
static enum llmq_status hinv_retry(const char *name, const float *H /* (C, C) */, int64_t C, float *percdamp,
                                   float damp_increment, struct llmq_gptq_solver *g) {
    double sum = 0.0;
    for (int64_t i = 0; i < C; i++) sum += H[i * C + i];
    const float mean = (float)(sum / (double)C); // torch.mean(torch.diag(H))
    for (;;) {
        int fail = llmq_gptq_solver_hinv_attempt(g, *percdamp * mean);
        if (!fail) return LLMQ_OK;
        static const char *what[] = {"", "cholesky(H)", "cholesky_inverse", "cholesky(H^-1, upper)",
                                     "cholesky(H^-1, upper)"};
        float next = *percdamp + (damp_increment > 0.0f ? damp_increment : LLMQ_GPTQ_DAMP_INCREMENT_DEFAULT);
        if (!(next < 1.0f))
            return llmq_errorf(LLMQ_ERR_NUMERIC,
                               "%s: H is not positive definite (%s failed) even with percdamp %.4f; "
                               "giving up",
                               name, what[fail], (double)*percdamp);
        llmq_warn("%s: %s failed with percdamp %.4f, retrying with percdamp %.4f", name, what[fail], (double)*percdamp,
                  (double)next);
        *percdamp = next;
    }
}

enum llmq_status llmq_gptq_hinv(const char *name, float *H, float *H0, int64_t C, float *percdamp,
                                float damp_increment) {
    struct llmq_gptq_solve sv = {.backend = LLMQ_BACKEND_CPU, .name = name, .C = C, .backup = H0};
    struct llmq_gptq_solver *g = NULL;
    enum llmq_status st = llmq_gptq_solver_init(&sv, H, &g);
    if (!st) st = hinv_retry(name, H, C, percdamp, damp_increment, g);
    llmq_gptq_solver_free(g);
    return st;
}

// Stable descending argsort of diag(H) (merge sort on indices; ties keep ascending index).
void llmq_gptq_argsort_desc(const float *key /* (C) */, int64_t *perm /* (C) */, int64_t *tmp /* (C) */, int64_t C) {
    for (int64_t i = 0; i < C; i++) perm[i] = i;
    for (int64_t width = 1; width < C; width *= 2) {
        for (int64_t lo = 0; lo < C; lo += 2 * width) {
            int64_t mid = lo + width < C ? lo + width : C, hi = lo + 2 * width < C ? lo + 2 * width : C;
            int64_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = key[perm[b]] > key[perm[a]] ? perm[b++] : perm[a++];
            while (a < mid) tmp[k++] = perm[a++];
            while (b < hi) tmp[k++] = perm[b++];
        }
        memcpy(perm, tmp, (size_t)C * sizeof *perm);
    }
}

// One group's (scale, zero) with o's grid search: x (n) contiguous, dh (n) its columns' diag(H).
static void group_params(const struct llmq_gptq_opts *o, const float *x, int64_t n, const float *dh, float *scale,
                         float *zero) {
    if (o->grid == LLMQ_GPTQ_GRID_MINMAX)
        llmq_quant_params_gptq(x, n, 1, o->q.bits, o->q.sym, scale, zero);
    else if (o->grid == LLMQ_GPTQ_GRID_MSE)
        llmq_quant_params_gptq_mse(x, n, 1, o->q.bits, o->q.sym, NULL, 2.4f, scale, zero);
    else
        llmq_quant_params_gptq_mse(x, n, 1, o->q.bits, o->q.sym, dh, 2.0f, scale, zero);
}

// Step 7's dynamic grid as a kernels/gptq.h callback (the searched grids; CPU only).
struct grid_ctx {
    const struct llmq_gptq_opts *o;
    const float *dhp; // (C) diag(H) in processing order
};

static void grid_cb(void *ctx, const float *x, int64_t n, int64_t c, float *scale, float *zero) {
    const struct grid_ctx *g = ctx;
    group_params(g->o, x, n, g->dhp + c, scale, zero);
}

// Step 4, group-aware (GAR): the full groups by decreasing max diag within the group, each group's
// columns by decreasing diag, the tail columns last in their own order. diag (C) is read only.
static enum llmq_status gar_perm(const float *diag, int64_t C, int64_t G, int64_t *perm) {
    const int64_t NF = C / G; // full groups
    float *key = malloc((size_t)(NF > G ? NF : G) * sizeof *key);
    int64_t *gorder = malloc((size_t)(NF > 0 ? NF : 1) * sizeof *gorder), *local = malloc((size_t)G * sizeof *local);
    int64_t *tmp = malloc((size_t)(NF > G ? NF : G) * sizeof *tmp);
    if (!key || !gorder || !local || !tmp) {
        free(tmp), free(local), free(gorder), free(key);
        return llmq_errorf(LLMQ_ERR_NOMEM, "gptq: out of memory for the group-aware order (C = %lld)", (long long)C);
    }
    for (int64_t g = 0; g < NF; g++) {
        float m = diag[g * G];
        for (int64_t i = 1; i < G; i++) m = diag[g * G + i] > m ? diag[g * G + i] : m;
        key[g] = m;
    }
    if (NF > 0) llmq_gptq_argsort_desc(key, gorder, tmp, NF);
    for (int64_t j = 0; j < NF; j++) {
        const int64_t g = gorder[j];
        llmq_gptq_argsort_desc(diag + g * G, local, tmp, G);
        for (int64_t i = 0; i < G; i++) perm[j * G + i] = g * G + local[i];
    }
    for (int64_t c = NF * G; c < C; c++) perm[c] = c;
    free(tmp), free(local), free(gorder), free(key);
    return LLMQ_OK;
}

// Step 8, group-aware: the grid found for processing group j belongs to original group perm[j * G] / G.
// The tail group (C % G columns, processed last in place) does not move. tmp is (C) scratch >= NG floats.
static void gar_unpermute_grids(struct llmq_qlinear *out, int64_t R, int64_t C, int64_t G, const int64_t *perm,
                                float *tmp) {
    const int64_t NG = out->n_groups, NF = C / G;
    float *grids[2] = {out->scales, out->zeros};
    for (int k = 0; k < 2; k++)
        for (int64_t r = 0; r < R; r++) {
            float *v = grids[k] + r * NG;
            for (int64_t j = 0; j < NF; j++) tmp[perm[j * G] / G] = v[j];
            memcpy(v, tmp, (size_t)NF * sizeof *v);
        }
}

void llmq_gptq_permute(float *W, float *H, int64_t R, int64_t C, const int64_t *perm, float *row, float *Hs) {
    for (int64_t r = 0; r < R; r++) {
        for (int64_t j = 0; j < C; j++) row[j] = W[r * C + perm[j]];
        memcpy(W + r * C, row, (size_t)C * sizeof *row);
    }
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) Hs[i * C + j] = H[perm[i] * C + perm[j]];
    memcpy(H, Hs, (size_t)(C * C) * sizeof *H);
}

// The options, the shape, W and H (finite) and the backend, before any allocation.
static enum llmq_status check_inputs(const char *name, const float *W, const float *H, int64_t R, int64_t C,
                                     const struct llmq_gptq_opts *o) {
    enum llmq_status st;
    if ((st = llmq_qconfig_check(&o->q, name))) return st;
    if (!(o->percdamp >= 0.0f && o->percdamp < 1.0f))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: percdamp must be in [0, 1), got %g", name, (double)o->percdamp);
    if (o->blocksize < 0) return llmq_errorf(LLMQ_ERR_ARG, "%s: blocksize %d < 0", name, o->blocksize);
    if (o->group_aware && (o->act_order || o->static_groups || o->q.group_size <= 0))
        return llmq_errorf(LLMQ_ERR_ARG,
                           "%s: group-aware order needs a group size and excludes act-order and "
                           "static groups",
                           name);
    if (R <= 0 || C <= 0 || C > (1 << 30))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: bad shape (%lld, %lld)", name, (long long)R, (long long)C);
    for (int64_t i = 0; i < R * C; i++)
        if (!isfinite(W[i]))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: weight (%lld, %lld) is %f", name, (long long)(i / C),
                               (long long)(i % C), (double)W[i]);
    for (int64_t i = 0; i < C * C; i++)
        if (!isfinite(H[i]))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: Hessian (%lld, %lld) is %f", name, (long long)(i / C),
                               (long long)(i % C), (double)H[i]);
    if (o->dxxt && !(o->gptaq_alpha > 0.0f && isfinite(o->gptaq_alpha)))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: GPTAQ's alpha must be > 0, got %g", name, (double)o->gptaq_alpha);
    for (int64_t i = 0; o->dxxt && i < C * C; i++)
        if (!isfinite(o->dxxt[i]))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: GPTAQ cross term (%lld, %lld) is %f", name, (long long)(i / C),
                               (long long)(i % C), (double)o->dxxt[i]);

    if (o->backend != LLMQ_BACKEND_CPU && o->backend != LLMQ_BACKEND_CUDA)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: unknown backend %d", name, (int)o->backend);
    const char *why = NULL;
    if (o->backend == LLMQ_BACKEND_CUDA && llmq_cuda_device_count(&why) == 0)
        return llmq_errorf(LLMQ_ERR_DEVICE, "%s: GPTQ on CUDA: no CUDA device: %s", name, why);
    return LLMQ_OK;
}

void llmq_gptaq_term(const float *D, const uint8_t *dead, const int64_t *perm, const float *U, int64_t C, float alpha,
                     float *P) {
    for (int64_t i = 0; i < C; i++) // 2' + 4': D[perm][:, perm], the dead columns (original index) zeroed
        for (int64_t j = 0; j < C; j++) {
            const int64_t pi = perm ? perm[i] : i, pj = perm ? perm[j] : j;
            P[i * C + j] = dead && dead[pj] ? 0.0f : D[pi * C + pj];
        }
    // 6': P := alpha · triu₁(P Uᵀ) U, two in-place triangular products (U upper, its strict lower is ignored)
    cblas_strmm(CblasRowMajor, CblasRight, CblasUpper, CblasTrans, CblasNonUnit, (blasint)C, (blasint)C, 1.0f, U,
                (blasint)C, P, (blasint)C);
    for (int64_t i = 0; i < C; i++) memset(P + i * C, 0, (size_t)(i + 1) * sizeof *P); // keep j > i
    cblas_strmm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, (blasint)C, (blasint)C, alpha, U,
                (blasint)C, P, (blasint)C);
}

enum llmq_status llmq_gptq_quantize(const char *name, float *W, float *H, int64_t R, int64_t C,
                                    const struct llmq_gptq_opts *o, struct llmq_qlinear *out, double *err,
                                    float *percdamp_used) {
    enum llmq_status st = LLMQ_OK;
    int64_t *perm = NULL, *invperm = NULL; // (C) processing position -> original column, and back
    float *H0 = NULL;                      // (C, C) backup of H for the damping retry / permute scratch
    float *row = NULL;                     // (C) permutation scratch
    float *dh = NULL, *dhp = NULL;         // (C) diag(H) after step 2, original and processing order
    int32_t *gcol = NULL;                  // (C) group of each processing position
    float *P = NULL;                       // (C, C) GPTAQ: the cross term, then its P (processing order)
    uint8_t *dead = NULL;                  // (C) GPTAQ: the dead columns of step 2
    struct llmq_gptq_solver *solver = NULL;
    memset(out, 0, sizeof *out);

    if ((st = check_inputs(name, W, H, R, C, o))) return st;

    const int64_t B = o->blocksize > 0 ? o->blocksize : LLMQ_GPTQ_BLOCKSIZE_DEFAULT;
    const int64_t G = o->q.group_size; // -1 = per row
    const bool static_groups = o->static_groups && G > 0;
    float percdamp = o->percdamp;
    double loss = 0.0, t0 = llmq_now_s(), t_chain = 0.0, t_gemm = 0.0;

    if ((st = llmq_qlinear_init(R, C, &o->q, out))) return st;
    const int64_t NG = out->n_groups;
    perm = malloc((size_t)C * sizeof *perm);
    invperm = malloc((size_t)C * sizeof *invperm);
    if (!o->H_src) H0 = malloc((size_t)(C * C) * sizeof *H0); // else a retry rebuilds H from H_src
    row = malloc((size_t)C * sizeof *row);
    gcol = malloc((size_t)C * sizeof *gcol);
    dh = malloc((size_t)C * sizeof *dh);
    dhp = malloc((size_t)C * sizeof *dhp);
    if (o->dxxt) P = malloc((size_t)(C * C) * sizeof *P), dead = calloc((size_t)C, 1);
    if (!perm || !invperm || (!H0 && !o->H_src) || !row || !gcol || !dh || !dhp || (o->dxxt && (!P || !dead))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for GPTQ scratch (C = %lld)", name, (long long)C);
        goto fail;
    }

    // 1. per-row grid from the original W (quantizer.find_params(W) before anything else)
    for (int64_t i = 0; i < C; i++) dh[i] = H[i * C + i];
    if (G <= 0)
        for (int64_t r = 0; r < R; r++) group_params(o, W + r * C, C, dh, &out->scales[r], &out->zeros[r]);

    // 2. dead columns
    for (int64_t i = 0; i < C; i++) {
        if (H[i * C + i] != 0.0f) continue;
        H[i * C + i] = 1.0f;
        for (int64_t r = 0; r < R; r++) W[r * C + i] = 0.0f;
        if (dead) dead[i] = 1;
    }

    // 3. static groups from the original-order W
    if (static_groups)
        for (int64_t r = 0; r < R; r++)
            for (int64_t g = 0; g < NG; g++) {
                int64_t c0 = g * G, n = c0 + G <= C ? G : C - c0;
                group_params(o, W + r * C + c0, n, dh + c0, &out->scales[r * NG + g], &out->zeros[r * NG + g]);
            }

    // 4. act-order: perm = argsort(diag(H), descending, stable); W = W[:, perm]; H = H[perm][:, perm]
    //    (group-aware: the GAR order, groups kept whole)
    const bool reorder = o->act_order || o->group_aware;
    for (int64_t i = 0; i < C; i++) row[i] = dh[i] = H[i * C + i];
    if (o->act_order) {
        llmq_gptq_argsort_desc(row, perm, invperm, C);
    } else if (o->group_aware) {
        if ((st = gar_perm(row, C, G, perm))) goto fail;
    } else {
        for (int64_t i = 0; i < C; i++) perm[i] = i;
    }
    for (int64_t i = 0; i < C; i++) invperm[perm[i]] = i;
    if (reorder && H0) {
        llmq_gptq_permute(W, H, R, C, perm, row, H0);
    } else if (reorder) { // W's columns in place, H from the caller's copy (no C x C scratch)
        for (int64_t r = 0; r < R; r++) {
            for (int64_t j = 0; j < C; j++) row[j] = W[r * C + perm[j]];
            memcpy(W + r * C, row, (size_t)C * sizeof *row);
        }
        llmq_gptq_rebuild_h(H, o->H_src, perm, C);
    }
    for (int64_t j = 0; j < C; j++) dhp[j] = dh[perm[j]]; // diag(H) in processing order (step 7's groups)

    // group of each processing position (dynamic groups follow the processing order; static groups and
    // the per-row grid do not move with act-order)
    for (int64_t j = 0; j < C; j++) gcol[j] = G <= 0 ? 0 : (int32_t)((static_groups ? perm[j] : j) / G);
    const int64_t G_dyn = G > 0 && !static_groups ? G : 0;

    // 5. - 7. behind kernels/gptq.h: damping and Hinv = cholesky(cholesky_inverse(cholesky(H)), upper=True)
    //    with retries, then the lazy blocks. The retry's backup of H: rebuilt from H_src, or the solver's own
    //    copy (H0 was only the permutation's scratch).
    free(H0);
    H0 = NULL;
    struct grid_ctx gctx = {o, dhp};
    const bool on_device = o->backend == LLMQ_BACKEND_CUDA && o->grid == LLMQ_GPTQ_GRID_MINMAX && !P;
    struct llmq_gptq_solve sv = {
        .backend = on_device ? LLMQ_BACKEND_CUDA : LLMQ_BACKEND_CPU,
        .name = name,
        .R = R,
        .C = C,
        .B = B,
        .NG = NG,
        .G_dyn = G_dyn,
        .bits = o->q.bits,
        .sym = o->q.sym,
        .gcol = gcol,
        .perm = perm,
        .grid = on_device || o->grid == LLMQ_GPTQ_GRID_MINMAX ? NULL : grid_cb,
        .grid_ctx = &gctx,
        .H_src = on_device ? NULL : o->H_src,
        .P = P, // filled by step 6' below, before the blocks
    };
    if ((st = llmq_gptq_solver_init(&sv, H, &solver))) goto fail;
    t_chain = llmq_now_s();
    if ((st = hinv_retry(name, H, C, &percdamp, o->damp_increment, solver))) goto fail;
    if (P) llmq_gptaq_term(o->dxxt, dead, perm, H, C, o->gptaq_alpha, P); // H's upper triangle is U now
    t_chain = llmq_now_s() - t_chain;
    if ((st = llmq_gptq_solver_blocks(solver, W, out->scales, out->zeros, out->q, &loss, &t_gemm))) goto fail;

    // 8. un-permute Q; g_idx in original column order (group-aware: grids back to their own group)
    if (o->group_aware) gar_unpermute_grids(out, R, C, G, perm, row);
    if (reorder)
        for (int64_t r = 0; r < R; r++) {
            for (int64_t c = 0; c < C; c++) row[c] = W[r * C + invperm[c]];
            memcpy(W + r * C, row, (size_t)C * sizeof *row);
        }
    for (int64_t c = 0; c < C; c++)
        out->g_idx[c] = G <= 0 ? 0 : (int32_t)((o->act_order && !static_groups ? invperm[c] : c) / G);

    llmq_debug("%s: gptq (%lld, %lld) on %s %.3f s: Cholesky chain %.3f s, lazy sgemm %.3f s (cpu only), rest %.3f s",
               name, (long long)R, (long long)C, llmq_backend_name(o->backend), llmq_now_s() - t0, t_chain, t_gemm,
               llmq_now_s() - t0 - t_chain - t_gemm);
    if (err) *err = loss / 2.0;
    if (percdamp_used) *percdamp_used = percdamp;
    goto done;
fail:
    llmq_qlinear_free(out);
done:
    llmq_gptq_solver_free(solver);
    free(dead);
    free(P);
    free(dhp);
    free(dh);
    free(gcol);
    free(row);
    free(H0);
    free(invperm);
    free(perm);
    return st;
}
