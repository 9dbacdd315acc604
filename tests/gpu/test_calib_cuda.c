// tests/gpu/test_calib_cuda.c — `llmq calib --device cuda` through the block path (calib/calib.h "Decoder blocks":
// every calibration sequence resident on the device, each block as kernels/block.h with its Gram and column sums)
// against `--device cpu` (calib/model/forward.c) on SmolLM2 (label gpu; exits 77 = skipped without a device, without
// $LLMQ_BIN, or without the model or the text).
//
// Model: tests/cli_util.h test_smollm2_gpu_model (the bundle's SmolLM2 cut to 4 blocks under tests/gpu/run.sh).
// Calibration: 4 sequences of 128 tokens of wiki.valid.raw (one micro-batch), seed 1: a few seconds on the CPU, well
// under one on the device.
//   1. cpu and cuda: the .lcs statistics (calib/calib.h "Stats file"), read back with llmq_calib_stats_load; the
//      cuda run took the block path (its info line on stderr).
//   2. The same header (layers, sequences, tokens sha256) and counts; then per input of every block, with
//      RTOL = 1e-3:  |Σ|x|_gpu - Σ|x|_cpu| <= RTOL · Σ|x|_cpu,  |Σx²_gpu - Σx²_cpu| <= RTOL · Σx²_cpu (per column),
//      |XᵀX_gpu - XᵀX_cpu|_ij <= RTOL · sqrt(XᵀX_ii XᵀX_jj) (the CPU's diagonal, Cauchy-Schwarz's scale).
//      RTOL is NOT derived (the inputs of every block but the first differ by the propagated block error, which has
//      no element-wise bound: tests/gpu/test_block_cuda.c): it is 30x the Gram sums' own device bound (2 γ(256)
//      ≈ 3e-5 of sqrt(G_ii G_jj), kernels/block.h), 300x the CPU's reordering differences of the same statistics
//      (forward.c on 1 against 2 threads: up to 3.3e-6, tests/py/test_calib_blocks.py), and far under a wiring
//      error (a lost or repeated micro-batch moves a layer's sums by a quarter or more, another layer's weights by
//      O(1)). The first mismatches are printed; the worst ratio to the bound is printed per input.
//   3. cuda again: the same bytes (cuBLAS without atomics, the column sums in a fixed order, one stream).
// NEVER RUN ON A GPU YET (written without one): its first run is tests/gpu/run.sh's.
#include "cli_util.h"

#include "calib/calib.h"
#include "common/io.h"
#include "kernels/backend.h"

#include <math.h>
#include <stdlib.h>

#define RTOL 1e-3

static char tmp[] = "/tmp/llmq_calib_cuda_XXXXXX";
static int failures;

// a (n) against b (n) at |a - b| <= RTOL · scale_i (scale NULL: |b_i|); label names the input. Returns the worst
// ratio to the bound.
static double compare(const char *label, const char *what, const double *a, const double *b, int64_t n,
                      const double *scale) {
    double worst = 0.0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double tol = RTOL * (scale ? scale[i] : fabs(b[i])) + 1e-30, e = fabs(a[i] - b[i]);
        if (!(e <= tol) && bad++ < 5)
            fprintf(stderr, "%s %s[%lld]: cuda %.17g cpu %.17g (tol %.3g)\n", label, what, (long long)i, a[i], b[i],
                    tol);
        worst = isnan(e) ? INFINITY : fmax(worst, e / tol);
    }
    if (bad) failures++;
    return worst;
}

// One input's statistics, cuda (g) against cpu (c).
static void compare_input(const char *label, const struct llmq_calib_input *g, const struct llmq_calib_input *c) {
    const int64_t C = c->n_in;
    CHECK(g->n_in == C && g->count == c->count && g->xtx && c->xtx);
    const double wa = compare(label, "sum_abs", g->sum_abs, c->sum_abs, C, NULL);
    const double ws = compare(label, "sum_sq", g->sum_sq, c->sum_sq, C, NULL);
    double *scale = malloc((size_t)(C * C) * sizeof(double));
    CHECK(scale);
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) scale[i * C + j] = sqrt(fabs(c->xtx[i * C + i] * c->xtx[j * C + j]));
    const double wx = compare(label, "xtx", g->xtx, c->xtx, C * C, scale);
    free(scale);
    printf("%-40s max |cuda - cpu| / bound: sum_abs %.3g, sum_sq %.3g, xtx %.3g\n", label, wa, ws, wx);
}

int main(void) {
    char model[1024], text[1024];
    const char *bin = test_smollm2_gpu_inputs("wiki.valid.raw", model, sizeof model, text, sizeof text, tmp);
    const char *calib = "%s calib --model %s --calib %s --nsamples 4 --seqlen 128 --seed 1 --threads 8 --device %s "
                        "--out %s/%s.lcs 2>%s/%s.err";
    CHECK(test_run(calib, bin, model, text, "cpu", tmp, "cpu", tmp, "cpu") == 0);
    CHECK(test_run(calib, bin, model, text, "cuda", tmp, "cuda", tmp, "cuda") == 0);
    CHECK(test_run(calib, bin, model, text, "cuda", tmp, "cuda2", tmp, "cuda2") == 0);
    char *err = NULL, *g1 = NULL, *g2 = NULL;
    size_t len = 0, n1 = 0, n2 = 0;
    CHECK_OK(llmq_read_file(test_path(tmp, "cuda.err"), 1 << 20, &err, &len));
    CHECK_CONTAINS(err, "calib: decoder blocks on cuda through kernels/block.h");
    free(err);

    struct llmq_calib_stats c, g;
    CHECK_OK(llmq_calib_stats_load(test_path(tmp, "cpu.lcs"), &c));
    CHECK_OK(llmq_calib_stats_load(test_path(tmp, "cuda.lcs"), &g));
    CHECK(c.n_layer == g.n_layer && c.n_seq == g.n_seq && c.seqlen == g.seqlen && c.with_xtx && g.with_xtx);
    CHECK(memcmp(c.tokens_sha256, g.tokens_sha256, 32) == 0);
    static const char *const slot[LLMQ_CALIB_N_SLOTS] = {"q/k/v", "o", "gate/up", "down"};
    for (int64_t l = 0; l < c.n_layer; l++)
        for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) {
            char label[64];
            snprintf(label, sizeof label, "blk.%lld %s input", (long long)l, slot[k]);
            compare_input(label, &g.in[l * LLMQ_CALIB_N_SLOTS + k], &c.in[l * LLMQ_CALIB_N_SLOTS + k]);
        }
    llmq_calib_stats_free(&c), llmq_calib_stats_free(&g);

    CHECK_OK(llmq_read_file(test_path(tmp, "cuda.lcs"), (size_t)1 << 30, &g1, &n1));
    CHECK_OK(llmq_read_file(test_path(tmp, "cuda2.lcs"), (size_t)1 << 30, &g2, &n2));
    const bool same = n1 == n2 && memcmp(g1, g2, n1) == 0;
    printf("cuda rerun: %s\n", same ? "the same bytes" : "DIFFERS");
    failures += !same;
    free(g1), free(g2);
    if (failures)
        fprintf(stderr, "%d checks failed\n", failures);
    else
        test_run("rm -rf %s", tmp);
    return failures ? 1 : 0;
}
