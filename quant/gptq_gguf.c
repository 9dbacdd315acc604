/*
 * quant/gptq_gguf.c — GPTQ onto a ggml block type (quant/gptq_gguf.h has the contract and the
 * steps; the numbers below refer to it). Names as fasterquant / quant/gptq.c: H, Hinv, W1, Err1,
 * blocksize, percdamp. Built with -ffp-contract=off like gptq.c: the in-batch update is a product
 * rounded to fp32, then a subtraction.
 *
 * Legend: R rows/out, C cols/in, QK block size, B lazy batch width, bsz bytes per block.
 */
#include "quant/gptq_gguf.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "formats/ggml/encode.h"
#include "quant/gptq.h"

#define MAX_THREADS 64

struct llmq_gptq_gguf_opts llmq_gptq_gguf_opts_default(void) {
    struct llmq_gptq_gguf_opts o = {
        .percdamp = LLMQ_GPTQ_PERCDAMP_DEFAULT,
        .damp_increment = LLMQ_GPTQ_DAMP_INCREMENT_DEFAULT,
        .blocksize = LLMQ_GPTQ_BLOCKSIZE_DEFAULT,
        .n_threads = 1,
        .gptaq_alpha = LLMQ_GPTAQ_ALPHA_DEFAULT,
    };
    return o;
}

// One lazy batch [i1, i2) for rows [r0, r1).
struct batch_job {
    enum llmq_dtype type;
    int64_t C, QK, i1, i2, r0, r1;
    size_t bsz, row_bytes;
    float *W;            // (R, C)
    const float *Hinv;   // (C, C) upper triangle
    const float *imp;    // (C)
    uint8_t *blocks;     // (R, row_bytes)
    float *Err1;         // (R, i2 - i1)
    double *rowloss;     // (R)
    const int64_t *perm; // (C) act-order: processing position -> original column; NULL: identity
    const float *P;      // (C, C) GPTAQ's term (processing order), or NULL
    float *Wpre1;        // (R, i2 - i1) GPTAQ: each column's value just before its rounding
    bool fixed;          // act-order: every block is encoded already, only codes are chosen
    enum llmq_status st;
};

static void *batch_rows(void *arg) {
    struct batch_job *j = arg;
    const int64_t C = j->C, QK = j->QK, i1 = j->i1, count = j->i2 - j->i1;
    for (int64_t r = j->r0; r < j->r1; r++) {
        float *W1 = j->W + r * C + i1;     // (count) this row's batch, updated in place; ends as Q1
        float *err1 = j->Err1 + r * count; // (count) row r of Err1
        uint8_t *brow = j->blocks + (size_t)r * j->row_bytes;
        double rloss = 0.0;
        for (int64_t i = 0; i < count; i++) {
            const int64_t p = i1 + i;                   // processing position (Hinv's index)
            const int64_t c = j->perm ? j->perm[p] : p; // original column (the block's)
            const int e = (int)(c % QK);                // element inside its block
            void *blk = brow + (size_t)(c / QK) * j->bsz;
            if (e == 0 && !j->fixed) { // the block's scales from the current, error-compensated values
                enum llmq_status st = llmq_gguf_encode_row_ref(j->type, W1 + i, blk, QK, j->imp + c);
                if (st) {
                    j->st = st;
                    return NULL;
                }
            }
            struct llmq_gguf_grid g;
            llmq_gguf_block_grid(j->type, blk, e, &g);
            const float w = W1[i], d = j->Hinv[p * C + p];
            const int code = llmq_gguf_grid_nearest(&g, w);
            llmq_gguf_block_set_code(j->type, blk, e, code);
            const float q = llmq_gguf_grid_value(&g, code); // Q1[:, i]
            const float er = (w - q) / d;                   // err1
            rloss += (double)((w - q) * (w - q) / (d * d)); // Losses1[:, i]
            const float *hrow = j->Hinv + p * C + i1;       // Hinv1[i, :]
            if (j->P) {                                     // GPTAQ (quant/gptq.h 7')
                const float *prow = j->P + p * C + i1;
                for (int64_t k = i + 1; k < count; k++) W1[k] -= er * hrow[k] - w * prow[k];
                j->Wpre1[r * count + i] = w;
            } else {
                for (int64_t k = i + 1; k < count; k++) W1[k] -= er * hrow[k];
            }
            err1[i] = er;
            W1[i] = q;
        }
        j->rowloss[r] += rloss;
    }
    return NULL;
}

// Runs one batch over all rows with n_threads threads; the first error of a job, or LLMQ_OK.
static enum llmq_status run_batch(const struct batch_job *proto, int64_t R, int n_threads) {
    struct batch_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    int nth = n_threads < 1 ? 1 : n_threads > MAX_THREADS ? MAX_THREADS : n_threads;
    if (nth > R) nth = (int)R;
    const int64_t per = (R + nth - 1) / nth;
    for (int t = 0; t < nth; t++) {
        jobs[t] = *proto;
        jobs[t].r0 = per * t < R ? per * t : R;
        jobs[t].r1 = per * (t + 1) < R ? per * (t + 1) : R;
        jobs[t].st = LLMQ_OK;
    }
    for (int t = 1; t < nth; t++) started[t] = pthread_create(&tid[t], NULL, batch_rows, &jobs[t]) == 0;
    batch_rows(&jobs[0]);
    for (int t = 1; t < nth; t++) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            batch_rows(&jobs[t]); // could not start a thread: do its share here
    }
    for (int t = 0; t < nth; t++)
        if (jobs[t].st) return jobs[t].st;
    return LLMQ_OK;
}

enum llmq_status llmq_gptq_gguf_quantize(const char *name, float *W, float *H, int64_t R, int64_t C,
                                         enum llmq_dtype type, const float *importance,
                                         const struct llmq_gptq_gguf_opts *o, void *blocks, double *loss,
                                         float *percdamp_used) {
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(type);
    if (!tr || !tr->is_quant || !llmq_gguf_can_encode(type))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: gptq onto GGUF needs a block type, got %s", name, llmq_dtype_name(type));
    const int64_t QK = tr->blck;
    if (R <= 0 || C <= 0 || C > (1 << 30) || C % QK != 0)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: shape (%lld, %lld) does not tile %s blocks of %lld", name, (long long)R,
                           (long long)C, tr->name, (long long)QK);
    if (!(o->percdamp >= 0.0f && o->percdamp < 1.0f))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: percdamp must be in [0, 1), got %g", name, (double)o->percdamp);
    if (o->blocksize < 0) return llmq_errorf(LLMQ_ERR_ARG, "%s: blocksize %d < 0", name, o->blocksize);
    if (o->dxxt && !(o->gptaq_alpha > 0.0f && isfinite(o->gptaq_alpha)))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: GPTAQ's alpha must be > 0, got %g", name, (double)o->gptaq_alpha);
    for (int64_t i = 0; i < R * C; i++)
        if (!isfinite(W[i]))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: weight (%lld, %lld) is %f", name, (long long)(i / C),
                               (long long)(i % C), (double)W[i]);
    for (int64_t i = 0; i < C * C; i++)
        if (!isfinite(H[i]))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: Hessian (%lld, %lld) is %f", name, (long long)(i / C),
                               (long long)(i % C), (double)H[i]);
    if (importance)
        for (int64_t i = 0; i < C; i++)
            if (!isfinite(importance[i]) || importance[i] < 0.0f)
                return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: importance[%lld] is %f", name, (long long)i,
                                   (double)importance[i]);

    enum llmq_status st = LLMQ_OK;
    size_t row_bytes = 0;
    (void)llmq_dtype_nbytes(type, C, &row_bytes); // C % QK == 0 checked above
    const int64_t B0 = o->blocksize > 0 ? o->blocksize : LLMQ_GPTQ_BLOCKSIZE_DEFAULT;
    const int64_t B = (B0 + QK - 1) / QK * QK;
    float percdamp = o->percdamp;
    double t0 = llmq_now_s(), t_chain = 0.0, t_gemm = 0.0;
    float *imp = malloc((size_t)C * sizeof *imp);         // (C)
    float *H0 = malloc((size_t)(C * C) * sizeof *H0);     // (C, C) retry backup
    float *Err1 = malloc((size_t)(R * B) * sizeof *Err1); // (R, B)
    double *rowloss = calloc((size_t)R, sizeof *rowloss); // (R)
    int64_t *perm = NULL, *tmp = NULL;                    // (C) act-order
    float *row = NULL;                                    // (C) act-order permutation scratch
    float *P = NULL, *Wpre1 = NULL;                       // GPTAQ: (C, C), (R, B)
    uint8_t *dead = NULL;                                 // GPTAQ: (C) the dead columns
    if (o->dxxt) {
        P = malloc((size_t)(C * C) * sizeof *P);
        Wpre1 = malloc((size_t)(R * B) * sizeof *Wpre1);
        dead = calloc((size_t)C, 1);
    }
    if (o->act_order) {
        perm = malloc((size_t)C * sizeof *perm);
        tmp = malloc((size_t)C * sizeof *tmp);
        row = malloc((size_t)C * sizeof *row);
    }
    if (!imp || !H0 || !Err1 || !rowloss || (o->act_order && (!perm || !tmp || !row)) ||
        (o->dxxt && (!P || !Wpre1 || !dead))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for GPTQ scratch (C = %lld)", name, (long long)C);
        goto done;
    }

    // 1. importance: the caller's, else diag(H) as handed over
    for (int64_t i = 0; i < C; i++) imp[i] = importance ? importance[i] : H[i * C + i];

    // 2. dead columns
    for (int64_t i = 0; i < C; i++) {
        if (H[i * C + i] != 0.0f) continue;
        H[i * C + i] = 1.0f;
        for (int64_t r = 0; r < R; r++) W[r * C + i] = 0.0f;
        if (dead) dead[i] = 1;
    }

    // act-order: every block's grid from the original W, then W and H in decreasing diag(H) order
    if (o->act_order) {
        if ((st = llmq_gguf_encode_rows(type, W, blocks, R, C, imp, o->n_threads))) goto done;
        for (int64_t i = 0; i < C; i++) row[i] = H[i * C + i];
        llmq_gptq_argsort_desc(row, perm, tmp, C);
        llmq_gptq_permute(W, H, R, C, perm, row, H0);
    }

    // 5. + 6. damping and the Cholesky chain, with retries
    t_chain = llmq_now_s();
    if ((st = llmq_gptq_hinv(name, H, H0, C, &percdamp, o->damp_increment))) goto done;
    t_chain = llmq_now_s() - t_chain;
    free(H0);
    H0 = NULL;
    const float *Hinv = H; // (C, C) upper triangle
    if (P) llmq_gptaq_term(o->dxxt, dead, perm, Hinv, C, o->gptaq_alpha, P);

    // 7. lazy batches
    for (int64_t i1 = 0; i1 < C; i1 += B) {
        const int64_t i2 = i1 + B < C ? i1 + B : C, count = i2 - i1;
        struct batch_job job = {.type = type,
                                .C = C,
                                .QK = QK,
                                .i1 = i1,
                                .i2 = i2,
                                .bsz = tr->size,
                                .row_bytes = row_bytes,
                                .W = W,
                                .Hinv = Hinv,
                                .imp = imp,
                                .blocks = blocks,
                                .Err1 = Err1,
                                .rowloss = rowloss,
                                .perm = perm,
                                .P = P,
                                .Wpre1 = Wpre1,
                                .fixed = o->act_order};
        if ((st = run_batch(&job, R, o->n_threads))) goto done;
        // (GPTAQ: W[:, i2:] += Wpre1 · P[i1:i2, i2:]), W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]
        double tg = llmq_now_s();
        if (i2 < C && P)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)R, (blasint)(C - i2), (blasint)count, 1.0f,
                        Wpre1, (blasint)count, P + i1 * C + i2, (blasint)C, 1.0f, W + i2, (blasint)C);
        if (i2 < C)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)R, (blasint)(C - i2), (blasint)count, -1.0f,
                        Err1, (blasint)count, Hinv + i1 * C + i2, (blasint)C, 1.0f, W + i2, (blasint)C);
        t_gemm += llmq_now_s() - tg;
    }

    if (o->act_order) // back to the original column order: W = the decoding of the blocks
        for (int64_t r = 0; r < R; r++) {
            for (int64_t j = 0; j < C; j++) row[perm[j]] = W[r * C + j];
            memcpy(W + r * C, row, (size_t)C * sizeof *row);
        }
    double sum = 0.0;
    for (int64_t r = 0; r < R; r++) sum += rowloss[r];
    llmq_debug("%s: gptq%s onto %s (%lld, %lld) %.3f s: Cholesky chain %.3f s, lazy sgemm %.3f s", name,
               o->act_order ? " (act-order)" : "", tr->name, (long long)R, (long long)C, llmq_now_s() - t0, t_chain,
               t_gemm);
    if (loss) *loss = sum / 2.0;
    if (percdamp_used) *percdamp_used = percdamp;
done:
    free(dead);
    free(Wpre1);
    free(P);
    free(row);
    free(tmp);
    free(perm);
    free(rowloss);
    free(Err1);
    free(H0);
    free(imp);
    return st;
}
