// tests/unit/test_gptq.c — quant/quantizer.h (grid, RTN, qlinear) and quant/gptq.h properties:
// codes in range, RTN error within half a step, GPTQ beats RTN on a correlated H, the damping retry,
// NaN / hopeless H -> LLMQ_ERR_NUMERIC naming the layer, determinism, bad options.
// Bit-exactness against the reference lives in tests/py/test_gptq_oracle.py.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/log.h"
#include "harness.h"
#include "kernels/backend.h"
#include "quant/gptq.h"
#include "quant/quantizer.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { return test_frand(&rng_state); } // uniform [-1, 1)

// W (R, C) random; H (C, C) = 2/N XᵀX with X (N, C) strongly correlated (low rank + noise)
static void make_problem(int64_t R, int64_t C, int64_t N, float *W, float *H) {
    float *X = malloc((size_t)(N * C) * sizeof *X);
    CHECK(X);
    test_correlated_x(&rng_state, N, C, X);
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++) s += (double)X[n * C + i] * X[n * C + j];
            H[i * C + j] = (float)(2.0 * s / (double)N);
        }
    for (int64_t i = 0; i < R * C; i++) W[i] = 0.05f * frand();
    free(X);
}

// tr((Q - W) H (Q - W)ᵀ): the layer's output error on the calibration data
static double out_err(const float *W, const float *Q, const float *H, int64_t R, int64_t C) {
    double e = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < C; i++) {
            double di = (double)Q[r * C + i] - W[r * C + i];
            for (int64_t j = 0; j < C; j++) e += di * H[i * C + j] * ((double)Q[r * C + j] - W[r * C + j]);
        }
    return e;
}

static void test_rtn(void) {
    const int64_t R = 7, C = 96;
    float W[7 * 96], D[7 * 96];
    for (int i = 0; i < R * C; i++) W[i] = frand();
    for (int c = 0; c < C; c++) W[2 * C + c] = 0.0f;                // all-zero row -> range [-1, 1]
    for (int c = 0; c < C; c++) W[3 * C + c] = fabsf(W[3 * C + c]); // all >= 0
    int bits_list[] = {2, 3, 4, 8}, groups[] = {32, -1, 64};
    for (int bi = 0; bi < 4; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int sym = 0; sym < 2; sym++) {
                struct llmq_qconfig cfg = {.bits = bits_list[bi], .group_size = groups[gi], .sym = sym};
                struct llmq_qlinear ql;
                CHECK_EQ_INT(llmq_rtn_quantize("t", W, R, C, &cfg, &ql), LLMQ_OK);
                CHECK_EQ_INT(ql.n_groups, groups[gi] > 0 ? (C + groups[gi] - 1) / groups[gi] : 1); // 96 / 64: ragged
                llmq_qlinear_dequant(&ql, D);
                const int maxq = (1 << cfg.bits) - 1;
                for (int64_t r = 0; r < R; r++)
                    for (int64_t c = 0; c < C; c++) {
                        int g = ql.g_idx[c];
                        CHECK_EQ_INT(g, groups[gi] > 0 ? c / groups[gi] : 0);
                        float s = ql.scales[r * ql.n_groups + g], z = ql.zeros[r * ql.n_groups + g];
                        CHECK(ql.q[r * C + c] <= maxq);
                        CHECK(z == rintf(z) && z >= 0 && z <= maxq);
                        if (sym) CHECK(z == (float)(1 << (cfg.bits - 1)));
                        if (r == 2) CHECK(s == 2.0f / (float)maxq);
                        // inside the grid's range the error is at most half a step
                        float lo = (0 - z) * s, hi = (maxq - z) * s, w = W[r * C + c];
                        if (w >= lo && w <= hi) CHECK(fabsf(D[r * C + c] - w) <= 0.5f * s * 1.0001f);
                    }
                llmq_qlinear_free(&ql);
                CHECK(ql.q == NULL);
            }
    llmq_qlinear_free(NULL);
    // bad configs
    struct llmq_qlinear ql;
    struct llmq_qconfig bad1 = {.bits = 1, .group_size = 64}, bad2 = {.bits = 9, .group_size = 64},
                        bad3 = {.bits = 4, .group_size = 0};
    CHECK_EQ_INT(llmq_rtn_quantize("blk.0.q", W, R, C, &bad1, &ql), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "blk.0.q");
    CHECK_EQ_INT(llmq_rtn_quantize("t", W, R, C, &bad2, &ql), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_rtn_quantize("t", W, R, C, &bad3, &ql), LLMQ_ERR_ARG);
    W[5] = NAN;
    struct llmq_qconfig ok = {.bits = 4, .group_size = 32};
    CHECK_EQ_INT(llmq_rtn_quantize("blk.1.ffn_up", W, R, C, &ok, &ql), LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "blk.1.ffn_up");
}

static void test_awq_params(void) {
    float x[4] = {0.5f, 1.0f, 2.0f, 3.0f}, s, z; // AutoAWQ does not force 0 into the range
    llmq_quant_params_awq(x, 4, 1, 4, false, &s, &z);
    CHECK(fabsf(s - 2.5f / 15.0f) < 1e-7f && z == 0.0f); // -round(0.5 / 0.1667) = -3 -> clamp 0
    float y[3] = {-1.0f, 0.5f, 2.0f};
    llmq_quant_params_awq(y, 3, 1, 4, false, &s, &z);
    CHECK(fabsf(s - 0.2f) < 1e-7f && z == 5.0f);
    llmq_quant_params_awq(y, 3, 1, 4, true, &s, &z);
    CHECK(fabsf(s - 2.0f / 7.0f) < 1e-7f && z == 8.0f);
    llmq_quant_params_gptq(x, 4, 1, 4, false, &s, &z); // GPTQ: range [0, 3]
    CHECK(fabsf(s - 0.2f) < 1e-7f && z == 0.0f);
}

static void test_gptq_vs_rtn(void) {
    const int64_t R = 24, C = 200, N = 400; // C not a multiple of the block size
    float *W = malloc(R * C * sizeof *W), *W2 = malloc(R * C * sizeof *W2), *Q = malloc(R * C * sizeof *Q);
    float *H = malloc(C * C * sizeof *H), *H2 = malloc(C * C * sizeof *H2), *Dq = malloc(R * C * sizeof *Dq);
    CHECK(W && W2 && Q && H && H2 && Dq);
    make_problem(R, C, N, W, H);
    for (int act = 0; act < 2; act++)
        for (int gi = 0; gi < 3; gi++) {
            struct llmq_gptq_opts o = llmq_gptq_opts_default();
            o.q.bits = 3;
            o.q.group_size = (int[]){-1, 64, 128}[gi];
            o.act_order = act;
            struct llmq_qlinear rtn, gq, gq2;
            CHECK_EQ_INT(llmq_rtn_quantize("t", W, R, C, &o.q, &rtn), LLMQ_OK);
            llmq_qlinear_dequant(&rtn, Dq);
            double e_rtn = out_err(W, Dq, H, R, C);
            memcpy(Q, W, R * C * sizeof *W);
            memcpy(H2, H, C * C * sizeof *H);
            double loss = -1;
            float pd = 0;
            CHECK_EQ_INT(llmq_gptq_quantize("t", Q, H2, R, C, &o, &gq, &loss, &pd), LLMQ_OK);
            CHECK(loss > 0 && pd == o.percdamp);
            for (int64_t c = 0; c < C; c++) // strict lower triangle of the returned Hinv is zero
                for (int64_t j = 0; j < c; j++) CHECK(H2[c * C + j] == 0.0f);
            llmq_qlinear_dequant(&gq, Dq);
            CHECK(memcmp(Dq, Q, R * C * sizeof *Q) == 0); // W out == dequant(out)
            double e_gptq = out_err(W, Q, H, R, C);
            if (e_gptq >= 0.7 * e_rtn)
                fprintf(stderr, "act %d group %d: gptq %g rtn %g\n", act, o.q.group_size, e_gptq, e_rtn);
            CHECK(e_gptq < 0.7 * e_rtn);
            // deterministic
            memcpy(W2, W, R * C * sizeof *W);
            memcpy(H2, H, C * C * sizeof *H);
            CHECK_EQ_INT(llmq_gptq_quantize("t", W2, H2, R, C, &o, &gq2, NULL, NULL), LLMQ_OK);
            CHECK(memcmp(W2, Q, R * C * sizeof *Q) == 0 && memcmp(gq.q, gq2.q, R * C) == 0);
            for (int64_t c = 0; c < C; c++) CHECK(gq.g_idx[c] >= 0 && gq.g_idx[c] < gq.n_groups);
            llmq_qlinear_free(&gq2);
            llmq_qlinear_free(&gq);
            llmq_qlinear_free(&rtn);
        }
    free(Dq);
    free(H2);
    free(H);
    free(Q);
    free(W2);
    free(W);
}

static void test_gptq_errors(void) {
    const int64_t R = 6, C = 40;
    float W[6 * 40], H[40 * 40];
    make_problem(R, C, 10, W, H); // rank 10 < C: singular
    float mean = 0;
    for (int i = 0; i < C; i++) mean += H[i * C + i] / C;
    for (int i = 0; i < C; i++) H[i * C + i] -= 0.004f * mean; // indefinite
    struct llmq_gptq_opts o = llmq_gptq_opts_default();
    o.q.group_size = -1;
    o.percdamp = 0.001f;
    struct llmq_qlinear ql;
    float pd = 0, W1[6 * 40];
    memcpy(W1, W, sizeof W);
    CHECK_EQ_INT(llmq_gptq_quantize("blk.2.attn_v", W1, H, R, C, &o, &ql, NULL, &pd), LLMQ_OK);
    CHECK(pd > 0.004f && pd < 0.01f); // retried (0.001 -> 0.0035 -> 0.006)
    llmq_qlinear_free(&ql);

    llmq_log_set_level(LLMQ_LOG_SILENT);
    for (int i = 0; i < C * C; i++) H[i] = i % (C + 1) == 0 ? -1.0f : 0.0f; // -I: hopeless
    o.percdamp = 0.9f;
    memcpy(W1, W, sizeof W);
    CHECK_EQ_INT(llmq_gptq_quantize("blk.2.attn_v", W1, H, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "blk.2.attn_v");
    CHECK(ql.q == NULL);

    make_problem(R, C, 80, W, H);
    o.percdamp = 0.01f;
    W[17] = NAN;
    CHECK_EQ_INT(llmq_gptq_quantize("blk.3.ffn_down", W, H, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "blk.3.ffn_down");
    W[17] = 0.0f;
    H[5] = INFINITY;
    CHECK_EQ_INT(llmq_gptq_quantize("blk.3.ffn_down", W, H, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "Hessian");
    H[5] = 0.0f;
    o.percdamp = 1.5f;
    CHECK_EQ_INT(llmq_gptq_quantize("x", W, H, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_ARG);
    o.percdamp = 0.01f;
    if (llmq_cuda_device_count(NULL) == 0) { // CUDA backend without a device (or without CUDA): a clear error
        o.backend = LLMQ_BACKEND_CUDA;
        CHECK_EQ_INT(llmq_gptq_quantize("blk.3.ffn_down", W, H, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_DEVICE);
        CHECK_CONTAINS(llmq_last_error(), "blk.3.ffn_down");
        CHECK(ql.q == NULL);
        o.backend = LLMQ_BACKEND_CPU;
    }
    o.q.bits = 9;
    CHECK_EQ_INT(llmq_gptq_quantize("x", W, H, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);
}

// o.H_src (no C x C backup inside the solver) gives the bytes of the plain call: act-order and group-aware
// permutations, a dead column, and a damping retry (an indefinite H) each rebuild H from the caller's copy.
static void test_gptq_h_src(void) {
    const int64_t R = 6, C = 40;
    float W[6 * 40], H[40 * 40], Hs[40 * 40], W1[6 * 40], W2[6 * 40], H1[40 * 40], H2[40 * 40];
    for (int retry = 0; retry < 2; retry++) {
        make_problem(R, C, retry ? 10 : 80, W, H);
        for (int64_t j = 0; j < C; j++) H[7 * C + j] = H[j * C + 7] = 0.0f; // column 7 dead
        if (retry) { // indefinite: the first attempts fail (as in test_gptq_errors)
            float mean = 0;
            for (int i = 0; i < C; i++) mean += H[i * C + i] / C;
            for (int i = 0; i < C; i++) H[i * C + i] -= 0.004f * mean;
        }
        for (int order = 0; order < 3; order++) {
            struct llmq_gptq_opts o = llmq_gptq_opts_default();
            o.q.group_size = 8;
            o.act_order = order == 1;
            o.group_aware = order == 2;
            o.percdamp = retry ? 0.001f : 0.01f;
            struct llmq_qlinear a, b;
            float pa = 0, pb = 0;
            memcpy(W1, W, sizeof W), memcpy(H1, H, sizeof H);
            CHECK_EQ_INT(llmq_gptq_quantize("t", W1, H1, R, C, &o, &a, NULL, &pa), LLMQ_OK);
            memcpy(W2, W, sizeof W), memcpy(H2, H, sizeof H), memcpy(Hs, H, sizeof H);
            o.H_src = Hs;
            CHECK_EQ_INT(llmq_gptq_quantize("t", W2, H2, R, C, &o, &b, NULL, &pb), LLMQ_OK);
            CHECK(pa == pb && (!retry || pa > o.percdamp)); // the retry did run
            CHECK(memcmp(W1, W2, sizeof W) == 0 && memcmp(H1, H2, sizeof H) == 0 && memcmp(a.q, b.q, R * C) == 0);
            CHECK(memcmp(a.scales, b.scales, (size_t)(R * a.n_groups) * sizeof(float)) == 0);
            CHECK(memcmp(Hs, H, sizeof H) == 0); // read only
            llmq_qlinear_free(&a);
            llmq_qlinear_free(&b);
        }
    }
}

int main(void) {
    test_rtn();
    test_awq_params();
    test_gptq_vs_rtn();
    test_gptq_errors();
    test_gptq_h_src();
    printf("test_gptq: ok\n");
    return 0;
}
