/*
 * bench/forward_speed.c — prefill throughput of calib/model/forward.h on a model.
 *
 *   bench_forward_speed MODEL [N_TOKENS=512] [THREADS=2] [REPS=3]
 *
 * Runs llmq_forward_logits on one sequence of N_TOKENS (all logits, as perplexity needs them)
 * REPS times after one warm-up, and prints tokens/s and the achieved GFLOP/s (2 x parameters used
 * per token + attention), next to the peer: OpenBLAS sgemm GFLOP/s on a (N, D) x (D, F) product
 * of the same model's sizes with the same thread count, measured in the same run.
 * The tokens are a fixed pseudo-random sequence (speed does not depend on the ids).
 */
#include "calib/model/forward.h"
#include "calib/model/model.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [N_TOKENS=512] [THREADS=2] [REPS=3]\n", argv[0]);
        return 2;
    }
    int64_t n = argc > 2 ? atoll(argv[2]) : 512;
    int threads = argc > 3 ? atoi(argv[3]) : 2, reps = argc > 4 ? atoi(argv[4]) : 3;
    struct llmq_model *m = NULL;
    struct llmq_forward *f = NULL;
    if (n < 1 || reps < 1 || llmq_model_load(argv[1], &m) != LLMQ_OK) return 1;
    const struct llmq_hparams *hp = &m->hp;
    if (llmq_forward_init(m, n, threads, &f) != LLMQ_OK) return 1;
    int32_t *toks = malloc((size_t)n * sizeof(int32_t));
    float *logits = malloc((size_t)(n * hp->n_vocab) * sizeof(float));
    if (!toks || !logits) return 1;
    for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    if (llmq_forward_logits(f, toks, n, 0, logits) != LLMQ_OK) return 1; // warm-up
    double best = 1e30, total = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (llmq_forward_logits(f, toks, n, 0, logits) != LLMQ_OK) return 1;
        double dt = now() - t0;
        total += dt;
        if (dt < best) best = dt;
    }
    const double D = (double)hp->n_embd, Dq = (double)(hp->n_head * hp->head_dim);
    const double Dkv = (double)(hp->n_head_kv * hp->head_dim);
    double per_tok = hp->n_layer * (D * (Dq + 2 * Dkv) + Dq * D + 3 * D * hp->n_ff) + D * hp->n_vocab;
    double flop = 2.0 * n * per_tok + hp->n_layer * 2.0 * (double)n * n * Dq; // attention: causal half of QK and PV
    printf("llmq forward: %s, %lld tokens, %d threads: best %.3f s (%.1f tokens/s, %.1f GFLOP/s), mean %.3f s\n",
           argv[1], (long long)n, threads, best, n / best, flop / best * 1e-9, total / reps);

    // peer: one OpenBLAS sgemm of the model's MLP size, OpenBLAS using the same thread count
    int64_t F = hp->n_ff, K = hp->n_embd;
    float *A = calloc((size_t)(n * K), sizeof(float)), *B = calloc((size_t)(F * K), sizeof(float));
    float *C = calloc((size_t)(n * F), sizeof(float));
    if (!A || !B || !C) return 1;
    for (int64_t i = 0; i < n * K; i++) A[i] = (float)(i % 17) * 0.01f;
    for (int64_t i = 0; i < F * K; i++) B[i] = (float)(i % 13) * 0.01f;
    openblas_set_num_threads(threads);
    double pbest = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)F, (int)K, 1.0f, A, (int)K, B, (int)K, 0.0f,
                    C, (int)F);
        double dt = now() - t0;
        if (dt < pbest) pbest = dt;
    }
    printf("peer  OpenBLAS sgemm (%lld x %lld x %lld), %d threads: %.1f GFLOP/s\n", (long long)n, (long long)K,
           (long long)F, threads, 2.0 * n * K * F / pbest * 1e-9);
    free(A), free(B), free(C), free(toks), free(logits);
    llmq_forward_free(f);
    llmq_model_free(m);
    return 0;
}
