/*
 * bench/gptq_speed.c — time llmq_gptq_quantize on one seeded layer W (R, C) with a fixed correlated
 * H (C, C); bench/gptq_speed.sh runs the numpy reference (tests/py/gptq_ref.py) on the same files.
 *
 *   bench_gptq_speed --R 4096 --C 4096 [--seed 1] [--bits 4] [--group 128] [--act-order]
 *                    [--device cpu|cuda (default cpu)] [--dump PREFIX] [--reps 1]
 *                    [--verbose (time per phase on stderr)]
 *
 * H = 2/k · (B·S)ᵀ(B·S) + 0.05·S² with B (k = 256, C) random and S = diag(s), s in [0.2, 3]: a
 * low-rank-plus-diagonal Hessian like a real layer's (strong correlations, a wide diag(H) range).
 * --dump writes PREFIX.W, PREFIX.H (inputs, raw f32) and PREFIX.llmq.q (llmq's codes, u8).
 * stdout: one JSON line {"R", "C", "device", "seconds" (median), "gflops" (≈ R·C² + 4/3·C³ lazy+chain),
 * "loss"}. Threads: OpenBLAS's (OPENBLAS_NUM_THREADS). --device cuda: steps 5-7 on the GPU (quant/gptq.h);
 * the seconds include the host steps 1-4 / 8, the transfers and the per-call cuBLAS / cuSOLVER handle
 * creation, but not the CUDA context and library loading (one small untimed warm-up solve first).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "kernels/backend.h"
#include "quant/gptq.h"
#include "tests/util.h"

static uint64_t rng_state;
static float frand(void) { return test_frand(&rng_state); } // uniform [-1, 1)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int64_t R = 4096, C = 4096;
    int reps = 1;
    unsigned long long seed = 1;
    const char *prefix = NULL;
    struct llmq_gptq_opts o = llmq_gptq_opts_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--act-order")) {
            o.act_order = true;
            continue;
        }
        if (!strcmp(a, "--verbose")) {
            llmq_log_set_level(LLMQ_LOG_DEBUG);
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_gptq_speed: %s needs a value\n", a);
            return 1;
        }
        if (!strcmp(a, "--R"))
            R = atoll(v);
        else if (!strcmp(a, "--C"))
            C = atoll(v);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--bits"))
            o.q.bits = atoi(v);
        else if (!strcmp(a, "--group"))
            o.q.group_size = atoi(v);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--dump"))
            prefix = v;
        else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "bench_gptq_speed: --device cpu|cuda, got %s\n", v);
                return 1;
            }
            if (llmq_backend_select(v, &o.backend)) return 1; // cuda without a device: the reason is logged
        } else {
            fprintf(stderr, "bench_gptq_speed: unknown flag %s\n", a);
            return 1;
        }
        i++;
    }
    if (R <= 0 || C <= 0 || reps < 1 || reps > 50) {
        fprintf(stderr, "bench_gptq_speed: bad arguments\n");
        return 1;
    }
    rng_state = 0x9E3779B97F4A7C15ull ^ (seed * 0x2545F4914F6CDD1Dull);
    const int64_t k = 256;
    float *W = malloc((size_t)(R * C) * sizeof *W), *Wc = malloc((size_t)(R * C) * sizeof *Wc); // (R, C)
    float *H = malloc((size_t)(C * C) * sizeof *H), *Hc = malloc((size_t)(C * C) * sizeof *Hc); // (C, C)
    float *B = malloc((size_t)(k * C) * sizeof *B), *s = malloc((size_t)C * sizeof *s);         // (k, C), (C)
    if (!W || !Wc || !H || !Hc || !B || !s) {
        fprintf(stderr, "bench_gptq_speed: out of memory\n");
        return 1;
    }
    for (int64_t c = 0; c < C; c++) s[c] = 1.6f + 1.4f * frand();
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = 0; c < C; c++) B[i * C + c] = (frand() + frand() + frand()) * s[c];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)C, (blasint)C, (blasint)k, 2.0f / (float)k, B,
                (blasint)C, B, (blasint)C, 0.0f, H, (blasint)C);
    for (int64_t c = 0; c < C; c++) H[c * C + c] += 0.05f * s[c] * s[c];
    for (int64_t i = 0; i < R * C; i++) W[i] = 0.02f * (frand() + frand() + frand());
    if (prefix && (test_write_raw(prefix, "W", W, (size_t)(R * C) * sizeof *W) ||
                   test_write_raw(prefix, "H", H, (size_t)(C * C) * sizeof *H))) {
        fprintf(stderr, "bench_gptq_speed: cannot write %s.*\n", prefix);
        return 1;
    }
    double t[50], loss = 0;
    struct llmq_qlinear ql;
    if (o.backend == LLMQ_BACKEND_CUDA) { // warm-up: CUDA context, cuBLAS / cuSOLVER loading
        const int64_t wc = 64;
        float *ww = calloc((size_t)(8 * wc), sizeof *ww), *wh = calloc((size_t)(wc * wc), sizeof *wh);
        if (!ww || !wh) {
            fprintf(stderr, "bench_gptq_speed: out of memory\n");
            return 1;
        }
        for (int64_t c = 0; c < wc; c++) wh[c * wc + c] = 1.0f;
        if (llmq_gptq_quantize("warmup", ww, wh, 8, wc, &o, &ql, NULL, NULL)) return 1;
        llmq_qlinear_free(&ql);
        free(wh);
        free(ww);
    }
    for (int r = 0; r < reps; r++) {
        memcpy(Wc, W, (size_t)(R * C) * sizeof *W);
        memcpy(Hc, H, (size_t)(C * C) * sizeof *H);
        double t0 = llmq_now_s();
        if (llmq_gptq_quantize("bench", Wc, Hc, R, C, &o, &ql, &loss, NULL)) return 1;
        t[r] = llmq_now_s() - t0;
        if (prefix && r == 0 && test_write_raw(prefix, "llmq.q", ql.q, (size_t)(R * C))) return 1;
        llmq_qlinear_free(&ql);
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    double flops = (double)R * C * C + 4.0 / 3.0 * (double)C * C * C;
    printf("{\"R\": %lld, \"C\": %lld, \"device\": \"%s\", \"seconds\": %.3f, \"gflops\": %.1f, \"loss\": %.9g}\n",
           (long long)R, (long long)C, llmq_backend_name(o.backend), t[reps / 2], flops / t[reps / 2] * 1e-9, loss);
    free(s);
    free(B);
    free(Hc);
    free(H);
    free(Wc);
    free(W);
    return 0;
}
