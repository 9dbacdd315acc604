/*
 * quant/gptq.c — GPTQ `fasterquant` for one linear layer (see gptq.h for the contract and the step
 * list; the step numbers below refer to it). Mirrors IST-DASLab/gptq gptq.py line by line, with the
 * reference's names: H, Hinv, W1, Q1, Err1, blocksize, percdamp, perm, invperm.
 *
 * Legend: R rows/out, C cols/in, G group size, NG groups per row, B blocksize.
 *
 * Layout notes. W is row-major (R, C); GPTQ rows are independent, so the in-block loop runs row by row
 * over a contiguous slice W[r, i1:i2] (the reference's W1 column block, updated in place: every value
 * the reference later reads from the stale W[:, i1:i2] — the dynamic-group ranges — is taken at the
 * start of the block, before the slice changes). The in-block update w1[k] -= err1 * Hinv[i, k] is a
 * product rounded to fp32 and then a subtraction, exactly like torch's outer product then `-=`; this
 * file is built with -ffp-contract=off so the compiler cannot fuse them.
 *
 * The Cholesky chain runs in column-major LAPACK on the symmetric row-major H, so "row-major lower" is
 * "column-major upper": spotrf('U') = reference cholesky (lower L, stored in our lower triangle),
 * spotri('U') = cholesky_inverse, mirror lower -> upper, spotrf('L') = cholesky(upper=True) in our upper
 * triangle. No LAPACKE row-major wrappers: they would transpose through a second C x C buffer.
 *
 * Backends: steps 1-4 and 8 always run here. Steps 5-7 run either here (llmq_gptq_hinv + blocks_cpu) or
 * on CUDA (solve_cuda -> kernels/gptq_cuda.h); both share the damping retry (hinv_retry), and the CUDA
 * in-block kernel is a port of llmq_gptq_block_row (the reference the GPU tests compare it with).
 */
#include "quant/gptq.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "kernels/gptq_cuda.h"

struct llmq_gptq_opts llmq_gptq_opts_default(void) {
    struct llmq_gptq_opts o = {
        .q = {.bits = 4, .group_size = 128, .sym = false},
        .percdamp = LLMQ_GPTQ_PERCDAMP_DEFAULT,
        .act_order = false,
        .static_groups = false,
        .blocksize = LLMQ_GPTQ_BLOCKSIZE_DEFAULT,
        .damp_increment = LLMQ_GPTQ_DAMP_INCREMENT_DEFAULT,
    };
    return o;
}

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

// One attempt of steps 5 + 6 with absolute damping `damp`: 0 on success, else the failing step (1..4).
typedef int (*hinv_attempt_fn)(void *ctx, float damp);

// Steps 5 + 6 with GPTQModel's retry, for either backend: mean(diag H) of the undamped H (C, C), then
// attempts with percdamp, percdamp + increment, ... until one succeeds or percdamp reaches 1.
static enum llmq_status hinv_retry(const char *name, const float *H /* (C, C) */, int64_t C, float *percdamp,
                                   float damp_increment, hinv_attempt_fn attempt, void *ctx) {
    double sum = 0.0;
    for (int64_t i = 0; i < C; i++) sum += H[i * C + i];
    const float mean = (float)(sum / (double)C); // torch.mean(torch.diag(H))
    for (;;) {
        int fail = attempt(ctx, *percdamp * mean);
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

// H (C, C) := what steps 2 and 4 make of Hsrc (C, C): H[i, j] = Hsrc[perm[i], perm[j]], a zero diagonal
// entry (a dead column) set to 1. The same values as the in-place steps, from the caller's copy.
static void rebuild_h(float *H, const float *Hsrc, const int64_t *perm, int64_t C) {
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) {
            float v = Hsrc[perm[i] * C + perm[j]];
            H[i * C + j] = i == j && v == 0.0f ? 1.0f : v;
        }
}

struct cpu_hinv {
    float *H, *H0;       // (C, C) working copy, undamped backup (NULL: rebuilt from Hsrc)
    const float *Hsrc;   // (C, C) the caller's unchanged H (with perm), when H0 is NULL
    const int64_t *perm; // (C)
    int64_t C;
};

static int cpu_hinv_attempt(void *ctx, float damp) {
    struct cpu_hinv *c = ctx;
    for (int64_t i = 0; i < c->C; i++) c->H[i * c->C + i] += damp;
    int fail = hinv_chain(c->H, c->C);
    if (fail && c->H0) memcpy(c->H, c->H0, (size_t)(c->C * c->C) * sizeof(float));
    if (fail && !c->H0) rebuild_h(c->H, c->Hsrc, c->perm, c->C);
    return fail;
}

enum llmq_status llmq_gptq_hinv(const char *name, float *H, float *H0, int64_t C, float *percdamp,
                                float damp_increment) {
    memcpy(H0, H, (size_t)(C * C) * sizeof(float));
    struct cpu_hinv ctx = {H, H0, NULL, NULL, C};
    return hinv_retry(name, H0, C, percdamp, damp_increment, cpu_hinv_attempt, &ctx);
}

double llmq_gptq_block_row(float *W1, float *err1, uint8_t *code1, const float *Hinv1, int64_t ldh, int64_t count,
                           const float *scales, const float *zeros, const int32_t *gcol, int maxq) {
    double rloss = 0.0;
    for (int64_t i = 0; i < count; i++) {
        const float scale = scales[gcol[i]], zero = zeros[gcol[i]];
        const float w = W1[i], d = Hinv1[i * ldh + i];
        const uint8_t code = llmq_quant_code(w, scale, zero, maxq);
        const float q = scale * ((float)code - zero);   // Q1[:, i]
        const float e = (w - q) / d;                    // err1
        rloss += (double)((w - q) * (w - q) / (d * d)); // Losses1[:, i]
        const float *hrow = Hinv1 + i * ldh;            // Hinv1[i, :]
        for (int64_t k = i + 1; k < count; k++) W1[k] -= e * hrow[k];
        err1[i] = e;
        W1[i] = q;
        code1[i] = code;
    }
    return rloss;
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

// Step 7 on the CPU: lazy blocks over W (R, C) (processing order) with Hinv (C, C) (upper). G_dyn > 0:
// dynamic groups of G_dyn columns; gcol (C) the group of each processing position; perm (C) its original
// column. *loss accumulates the Losses sum (rows in order, block by block).
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

static enum llmq_status blocks_cpu(const char *name, float *W, const float *Hinv, int64_t R, int64_t C, int64_t B,
                                   int64_t G_dyn, const int32_t *gcol, const int64_t *perm,
                                   const struct llmq_gptq_opts *o, const float *dhp, struct llmq_qlinear *out,
                                   double *loss, double *t_gemm) {
    const struct llmq_qconfig *cfg = &o->q;
    const int64_t NG = out->n_groups;
    const int maxq = (1 << cfg->bits) - 1;
    float *Err1 = malloc((size_t)(R * B) * sizeof *Err1); // (R, B) scaled errors of the current block
    uint8_t *code1 = malloc((size_t)B);                   // (B) one row's codes, block order
    if (!Err1 || !code1) {
        free(code1);
        free(Err1);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for GPTQ scratch (R = %lld)", name, (long long)R);
    }
    for (int64_t i1 = 0; i1 < C; i1 += B) {
        const int64_t i2 = i1 + B < C ? i1 + B : C, count = i2 - i1;

        // dynamic groups starting in this block: find_params(W[:, c:c+G]) from W as it is now
        if (G_dyn > 0)
            for (int64_t c = ((i1 + G_dyn - 1) / G_dyn) * G_dyn; c < i2; c += G_dyn) {
                int64_t n = c + G_dyn <= C ? G_dyn : C - c;
                for (int64_t r = 0; r < R; r++)
                    group_params(o, W + r * C + c, n, dhp + c, &out->scales[r * NG + c / G_dyn],
                                 &out->zeros[r * NG + c / G_dyn]);
            }

        for (int64_t r = 0; r < R; r++) {
            // W[r, i1:i2] is this row's block of the reference's W1, updated in place; ends as Q1
            *loss += llmq_gptq_block_row(W + r * C + i1, Err1 + r * count, code1, Hinv + i1 * C + i1, C, count,
                                         out->scales + r * NG, out->zeros + r * NG, gcol + i1, maxq);
            for (int64_t i = 0; i < count; i++) out->q[r * C + perm[i1 + i]] = code1[i]; // original order
        }

        // W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]
        double tg = llmq_now_s();
        if (i2 < C)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)R, (blasint)(C - i2), (blasint)count, -1.0f,
                        Err1, (blasint)count, Hinv + i1 * C + i2, (blasint)C, 1.0f, W + i2, (blasint)C);
        *t_gemm += llmq_now_s() - tg;
    }
    free(code1);
    free(Err1);
    return LLMQ_OK;
}

struct cuda_hinv {
    struct llmq_cuda_gptq *g;
    const float *H; // (C, C) undamped, processing order
};

static int cuda_hinv_attempt(void *ctx, float damp) {
    struct cuda_hinv *c = ctx;
    return llmq_cuda_gptq_hinv_attempt(c->g, c->H, damp);
}

// Steps 5 - 7 on the CUDA device (kernels/gptq_cuda.h), same retry policy as the CPU (hinv_retry). W (R, C)
// processing order -> Q; H (C, C) undamped -> Hinv (upper, strict lower 0); codes, grids, loss into out.
static enum llmq_status solve_cuda(const char *name, float *W, float *H, int64_t R, int64_t C, int64_t B, int64_t G_dyn,
                                   const int32_t *gcol, const int64_t *perm, const struct llmq_gptq_opts *o,
                                   struct llmq_qlinear *out, float *percdamp, double *loss, double *t_chain) {
    const int64_t nblocks = (C + B - 1) / B;
    struct llmq_cuda_gptq *g = NULL;
    int32_t *perm32 = malloc((size_t)C * sizeof *perm32);                  // (C)
    double *loss_rows = malloc((size_t)(nblocks * R) * sizeof *loss_rows); // (nblocks, R)
    enum llmq_status st = LLMQ_OK;
    if (!perm32 || !loss_rows) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for GPTQ scratch (R = %lld)", name, (long long)R);
        goto done;
    }
    for (int64_t j = 0; j < C; j++) perm32[j] = (int32_t)perm[j];
    if ((st = llmq_cuda_gptq_init(name, R, C, out->n_groups, B, &g))) goto done;
    double t = llmq_now_s();
    struct cuda_hinv ctx = {g, H};
    if ((st = hinv_retry(name, H, C, percdamp, o->damp_increment, cuda_hinv_attempt, &ctx))) goto done;
    *t_chain = llmq_now_s() - t;
    if ((st = llmq_cuda_gptq_blocks(g, W, gcol, perm32, G_dyn, o->q.bits, o->q.sym, out->scales, out->zeros, out->q,
                                    loss_rows, H)))
        goto done;
    for (int64_t i = 0; i < nblocks * R; i++) *loss += loss_rows[i]; // the CPU's order: block by block, rows
done:
    llmq_cuda_gptq_free(g);
    free(loss_rows);
    free(perm32);
    return st;
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

enum llmq_status llmq_gptq_quantize(const char *name, float *W, float *H, int64_t R, int64_t C,
                                    const struct llmq_gptq_opts *o, struct llmq_qlinear *out, double *err,
                                    float *percdamp_used) {
    enum llmq_status st = LLMQ_OK;
    int64_t *perm = NULL, *invperm = NULL; // (C) processing position -> original column, and back
    float *H0 = NULL;                      // (C, C) backup of H for the damping retry / permute scratch
    float *row = NULL;                     // (C) permutation scratch
    float *dh = NULL, *dhp = NULL;         // (C) diag(H) after step 2, original and processing order
    int32_t *gcol = NULL;                  // (C) group of each processing position
    memset(out, 0, sizeof *out);

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

    const int64_t B = o->blocksize > 0 ? o->blocksize : LLMQ_GPTQ_BLOCKSIZE_DEFAULT;
    const int64_t G = o->q.group_size; // -1 = per row
    const bool static_groups = o->static_groups && G > 0;
    float percdamp = o->percdamp;
    double loss = 0.0, t0 = llmq_now_s(), t_chain = 0.0, t_gemm = 0.0;

    if (o->backend != LLMQ_BACKEND_CPU && o->backend != LLMQ_BACKEND_CUDA)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: unknown backend %d", name, (int)o->backend);
    const char *why = NULL;
    if (o->backend == LLMQ_BACKEND_CUDA && llmq_cuda_device_count(&why) == 0)
        return llmq_errorf(LLMQ_ERR_DEVICE, "%s: GPTQ on CUDA: no CUDA device: %s", name, why);
    if ((st = llmq_qlinear_init(R, C, &o->q, out))) return st;
    const int64_t NG = out->n_groups;
    perm = malloc((size_t)C * sizeof *perm);
    invperm = malloc((size_t)C * sizeof *invperm);
    if (!o->H_src) H0 = malloc((size_t)(C * C) * sizeof *H0); // else a retry rebuilds H from H_src
    row = malloc((size_t)C * sizeof *row);
    gcol = malloc((size_t)C * sizeof *gcol);
    dh = malloc((size_t)C * sizeof *dh);
    dhp = malloc((size_t)C * sizeof *dhp);
    if (!perm || !invperm || (!H0 && !o->H_src) || !row || !gcol || !dh || !dhp) {
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
        rebuild_h(H, o->H_src, perm, C);
    }
    for (int64_t j = 0; j < C; j++) dhp[j] = dh[perm[j]]; // diag(H) in processing order (step 7's groups)

    // group of each processing position (dynamic groups follow the processing order; static groups and
    // the per-row grid do not move with act-order)
    for (int64_t j = 0; j < C; j++) gcol[j] = G <= 0 ? 0 : (int32_t)((static_groups ? perm[j] : j) / G);
    const int64_t G_dyn = G > 0 && !static_groups ? G : 0;

    if (o->backend == LLMQ_BACKEND_CUDA && o->grid == LLMQ_GPTQ_GRID_MINMAX) {
        free(H0); // 5. - 7. on the device (H stays the undamped host copy until Hinv comes back)
        H0 = NULL;
        if ((st = solve_cuda(name, W, H, R, C, B, G_dyn, gcol, perm, o, out, &percdamp, &loss, &t_chain))) goto fail;
    } else {
        // 5. + 6. damping and Hinv = cholesky(cholesky_inverse(cholesky(H)), upper=True), with retries
        t_chain = llmq_now_s();
        if (H0) {
            st = llmq_gptq_hinv(name, H, H0, C, &percdamp, o->damp_increment);
        } else {
            struct cpu_hinv ctx = {H, NULL, o->H_src, perm, C};
            st = hinv_retry(name, H, C, &percdamp, o->damp_increment, cpu_hinv_attempt, &ctx);
        }
        if (st) goto fail;
        t_chain = llmq_now_s() - t_chain;
        free(H0);
        H0 = NULL;
        // 7. lazy blocks
        if ((st = blocks_cpu(name, W, H, R, C, B, G_dyn, gcol, perm, o, dhp, out, &loss, &t_gemm))) goto fail;
    }

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
    free(dhp);
    free(dh);
    free(gcol);
    free(row);
    free(H0);
    free(invperm);
    free(perm);
    return st;
}
