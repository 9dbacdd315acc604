// tests/unit/test_gguf_choose.c — quant/gguf_choose.h on constructed tensors whose answer is known:
//   - QUALITY: rows that lie on IQ4_NL's grid (its non-uniform levels times one scale per block) against the
//     mix's Q4_0 of the same size: IQ4_NL must win; rows on Q4_0's uniform grid: Q4_0 must stay; a tensor
//     marked not free keeps its type; every choice is the argmin of errors computed here independently
//     (encode + decode with formats/ggml/encode.h) among the types of no more bytes; exclude is respected;
//   - TARGET: the total stays within the budget, no single upgrade still fits (the fill saturates), the
//     summed error is no worse than the best assignment of one type to every tensor that fits, and equals
//     brute force over every assignment of three small tensors; a budget below the smallest
//     allocation is LLMQ_ERR_ARG, and llmq_gguf_choose_range gives both ends;
//   - MEASURED: the same brute force in KLD units (each tensor's err times its measured slope), the predicted
//     KLD per tensor, the most sensitive of three equal tensors favoured, the fallback slope, LLMQ_ERR_NUMERIC.
#include "harness.h"

#include "common/log.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"
#include "quant/gguf_choose.h"

#include <math.h>

#define MAXT 8
static float *rows_of[MAXT]; // (R, C) per tensor

static enum llmq_status get_rows(void *user, int64_t i, int64_t stride, int64_t n, float *out) {
    const struct llmq_gguf_choose_tensor *t = user;
    for (int64_t k = 0; k < n; k++) memcpy(out + k * t[i].C, rows_of[i] + k * stride * t[i].C, t[i].C * sizeof(float));
    return LLMQ_OK;
}

// The error of the whole tensor (R ≤ 2048: every row) in type ty, computed here.
static double err_of(const float *W, int64_t R, int64_t C, enum llmq_dtype ty, const float *imp) {
    size_t rb = 0;
    CHECK(llmq_dtype_nbytes(ty, C, &rb));
    uint8_t *blk = malloc(rb * R);
    float *Q = malloc(sizeof(float) * R * C);
    CHECK_OK(llmq_gguf_encode_rows(ty, W, blk, R, C, imp, 1));
    double e = 0;
    for (int64_t r = 0; r < R; r++) {
        CHECK_OK(llmq_dequantize_row(ty, blk + r * rb, Q + r * C, C));
        for (int64_t c = 0; c < C; c++) {
            double d = (double)W[r * C + c] - Q[r * C + c];
            e += (imp ? imp[c] : 1.0) * d * d;
        }
    }
    free(blk);
    free(Q);
    return e;
}

static const enum llmq_dtype all[] = {LLMQ_DTYPE_Q2_K,   LLMQ_DTYPE_Q3_K, LLMQ_DTYPE_IQ4_XS, LLMQ_DTYPE_Q4_0,
                                      LLMQ_DTYPE_IQ4_NL, LLMQ_DTYPE_Q4_K, LLMQ_DTYPE_Q4_1,   LLMQ_DTYPE_Q5_0,
                                      LLMQ_DTYPE_Q5_K,   LLMQ_DTYPE_Q5_1, LLMQ_DTYPE_Q6_K,   LLMQ_DTYPE_Q8_0};
#define NALL ((int)(sizeof(all) / sizeof(all[0])))

static const int8_t iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// (R, C) rows: grid 0 = IQ4_NL's levels, 1 = Q4_0's (-8..7), each block of 32 one random scale, random codes;
// every block holds both extreme levels so that the encoders' max-based scale lands on the grid.
static float *grid_rows(int64_t R, int64_t C, int grid, uint64_t seed) {
    float *W = malloc(sizeof(float) * R * C);
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < C / 32; b++) {
            float d = 0.001f * (1.0f + 0.5f * test_frand(&seed));
            for (int j = 0; j < 32; j++) {
                int code = (int)(test_xorshift64(&seed) % 16);
                if (j == 0) code = 0;
                if (j == 1) code = 15;
                W[r * C + b * 32 + j] = grid == 0 ? d * iq4nl_levels[code] : d * (float)(code - 8);
            }
        }
    return W;
}

// The error the choice uses for type ty (the header's "Downgrades": a type smaller than the mix's costs at least its
// importance-free error rescaled to the mix's), computed here.
static double choice_err(const float *W, const struct llmq_gguf_choose_tensor *t, enum llmq_dtype mix,
                         enum llmq_dtype ty) {
    double e = err_of(W, t->R, t->C, ty, t->importance);
    if (llmq_gguf_choose_bytes(t, ty) >= llmq_gguf_choose_bytes(t, mix)) return e;
    double eu = err_of(W, t->R, t->C, ty, NULL), eum = err_of(W, t->R, t->C, mix, NULL);
    double g = eum > 0 ? eu * err_of(W, t->R, t->C, mix, t->importance) / eum : e;
    return g > e ? g : e;
}

static void check_quality_is_argmin(const struct llmq_gguf_choose_tensor *t, enum llmq_dtype mix, const float *W,
                                    uint64_t exclude) {
    uint64_t cap = llmq_gguf_choose_bytes(t, mix);
    enum llmq_dtype best = mix;
    double be = err_of(W, t->R, t->C, mix, t->importance);
    for (int k = 0; k < NALL; k++) {
        uint64_t by = llmq_gguf_choose_bytes(t, all[k]);
        if (!by || by > cap || (exclude >> all[k] & 1u)) continue;
        double e = choice_err(W, t, mix, all[k]);
        if (e < be || (e == be && by < llmq_gguf_choose_bytes(t, best))) {
            be = e;
            best = all[k];
        }
    }
    CHECK_EQ_INT(t->type, best);
    CHECK(fabs(t->err - be) <= 1e-9 * (be + 1e-30));
}

static void test_quality(void) {
    const int64_t R = 64, C = 64; // 64 = 2 blocks of 32, tiled by no 256-block type
    struct llmq_gguf_choose_tensor t[4];
    float imp[64];
    uint64_t seed = 7;
    for (int c = 0; c < C; c++) imp[c] = 0.5f + (float)((test_xorshift64(&seed) >> 40) % 100) / 50.0f;
    rows_of[0] = grid_rows(R, C, 0, 1); // IQ4_NL grid
    rows_of[1] = grid_rows(R, C, 1, 2); // Q4_0 grid
    rows_of[2] = grid_rows(R, C, 0, 3); // IQ4_NL grid, but not free
    rows_of[3] = grid_rows(R, C, 0, 4); // IQ4_NL grid, importance
    for (int i = 0; i < 4; i++)
        t[i] = (struct llmq_gguf_choose_tensor){
            .name = "t", .R = R, .C = C, .type = LLMQ_DTYPE_Q4_0, .is_free = i != 2, .importance = i == 3 ? imp : NULL};
    struct llmq_gguf_choose_opts o = {.mode = LLMQ_GGUF_CHOICE_QUALITY, .params = 4 * R * C, .n_threads = 2};
    CHECK_OK(llmq_gguf_choose(&o, 4, t, get_rows, t));
    CHECK_EQ_INT(t[0].type, LLMQ_DTYPE_IQ4_NL);
    CHECK(t[0].err < 0.01 * t[0].err_mix);
    CHECK_EQ_INT(t[1].type, LLMQ_DTYPE_Q4_0);
    CHECK_EQ_INT(t[2].type, LLMQ_DTYPE_Q4_0);
    CHECK(t[2].err == 0 && t[2].err_mix == 0);
    CHECK_EQ_INT(t[3].type, LLMQ_DTYPE_IQ4_NL);
    for (int i = 0; i < 4; i++)
        if (i != 2) check_quality_is_argmin(&t[i], LLMQ_DTYPE_Q4_0, rows_of[i], 0);

    // random rows, a larger mix type (Q5_0 as the Q4_K fallback): the independent argmin among <= 5.5 bits;
    // then the same with Q4_1 and Q5_0's rivals excluded
    free(rows_of[0]);
    rows_of[0] = malloc(sizeof(float) * R * C);
    for (int64_t i = 0; i < R * C; i++) rows_of[0][i] = test_frand(&seed) * (i % 7 == 0 ? 3.0f : 1.0f);
    for (uint64_t ex = 0; ex <= (1ull << LLMQ_DTYPE_Q4_1 | 1ull << LLMQ_DTYPE_IQ4_NL);
         ex = ex ? ex + 1 : (1ull << LLMQ_DTYPE_Q4_1 | 1ull << LLMQ_DTYPE_IQ4_NL)) {
        t[0] = (struct llmq_gguf_choose_tensor){.name = "r", .R = R, .C = C, .type = LLMQ_DTYPE_Q5_0, .is_free = true};
        o.exclude = ex;
        CHECK_OK(llmq_gguf_choose(&o, 1, t, get_rows, t));
        check_quality_is_argmin(&t[0], LLMQ_DTYPE_Q5_0, rows_of[0], ex);
        CHECK(!(ex >> t[0].type & 1u));
    }
    for (int i = 0; i < 4; i++) free(rows_of[i]);
}

// TARGET on n tensors of (R, 256): the budget, saturation, and the bounds below.
static void test_target(void) {
    enum { N = 3 };
    const int64_t R = 16, C = 256;
    uint64_t seed = 11;
    struct llmq_gguf_choose_tensor t[N + 1];
    double e[N][NALL];
    for (int i = 0; i < N; i++) {
        rows_of[i] = malloc(sizeof(float) * R * C);
        float sc = (float)(1 << (2 * i)); // unequal tensors: the allocation should favour the large-error one
        for (int64_t j = 0; j < R * C; j++) rows_of[i][j] = sc * test_frand(&seed) * (j % 5 == 0 ? 4.0f : 1.0f);
        for (int k = 0; k < NALL; k++) e[i][k] = err_of(rows_of[i], R, C, all[k], NULL);
    }
    // a fixed tensor (not free) counts against the budget
    rows_of[N] = grid_rows(R, 64, 1, 9);
    struct llmq_gguf_choose_tensor fixed = {.name = "fixed", .R = R, .C = 64, .type = LLMQ_DTYPE_Q8_0};
    uint64_t fixed_bytes = llmq_gguf_choose_bytes(&fixed, LLMQ_DTYPE_Q8_0);
    struct llmq_gguf_choose_opts o = {.mode = LLMQ_GGUF_CHOICE_TARGET, .params = N * R * C + R * 64, .n_threads = 1};
    uint64_t lo = 0, hi = 0;
    for (int i = 0; i < N; i++)
        t[i] = (struct llmq_gguf_choose_tensor){
            .name = "x", .R = R, .C = C, .type = LLMQ_DTYPE_Q4_K, .is_free = true, .allocate = true};
    t[N] = fixed;
    llmq_gguf_choose_range(&o, N + 1, t, &lo, &hi);
    CHECK_EQ_INT(lo, N * llmq_gguf_choose_bytes(&t[0], LLMQ_DTYPE_Q2_K) + fixed_bytes);
    CHECK_EQ_INT(hi, N * llmq_gguf_choose_bytes(&t[0], LLMQ_DTYPE_Q8_0) + fixed_bytes);
    for (uint64_t budget = lo; budget <= hi + 100; budget += (hi - lo) / 13) {
        for (int i = 0; i < N; i++) t[i].type = LLMQ_DTYPE_Q4_K;
        o.target_bytes = budget;
        CHECK_OK(llmq_gguf_choose(&o, N + 1, t, get_rows, t));
        CHECK_EQ_INT(t[N].type, LLMQ_DTYPE_Q8_0);
        uint64_t used = fixed_bytes;
        double sum = 0;
        int sel[N];
        for (int i = 0; i < N; i++) {
            used += llmq_gguf_choose_bytes(&t[i], t[i].type);
            for (int k = 0; k < NALL; k++)
                if (all[k] == t[i].type) sel[i] = k;
            CHECK(fabs(t[i].err - e[i][sel[i]]) <= 1e-9 * e[i][sel[i]]);
            sum += e[i][sel[i]];
        }
        CHECK(used <= budget);
        for (int i = 0; i < N; i++) // saturated: no upgrade that lowers the error still fits
            for (int k = 0; k < NALL; k++) {
                uint64_t add = llmq_gguf_choose_bytes(&t[i], all[k]), cur = llmq_gguf_choose_bytes(&t[i], t[i].type);
                CHECK(!(add > cur && e[i][k] < e[i][sel[i]] && used - cur + add <= budget));
            }
        double best_uniform = INFINITY, brute = INFINITY;
        for (int k = 0; k < NALL; k++)
            if (N * llmq_gguf_choose_bytes(&t[0], all[k]) + fixed_bytes <= budget)
                best_uniform = fmin(best_uniform, e[0][k] + e[1][k] + e[2][k]);
        for (int a = 0; a < NALL; a++)
            for (int b = 0; b < NALL; b++)
                for (int c = 0; c < NALL; c++) {
                    uint64_t by = fixed_bytes + llmq_gguf_choose_bytes(&t[0], all[a]) +
                                  llmq_gguf_choose_bytes(&t[1], all[b]) + llmq_gguf_choose_bytes(&t[2], all[c]);
                    if (by <= budget) brute = fmin(brute, e[0][a] + e[1][b] + e[2][c]);
                }
        CHECK(sum <= best_uniform);
        CHECK(sum <= brute * (1 + 1e-12)); // budgets < 2^17 bytes: the knapsack's unit is 1 byte, exact
    }
    o.target_bytes = lo - 1;
    llmq_log_set_level(LLMQ_LOG_ERROR + 1);
    CHECK(llmq_gguf_choose(&o, N + 1, t, get_rows, t) == LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);
    for (int i = 0; i <= N; i++) free(rows_of[i]);
}

// MEASURED: three tensors with the same rows and measured KLDs 1 : 10 : 100 in the mix's type. The choice is the
// brute-force minimum of Σ g_t err(t, τ_t) (g_t = kld_ref / err(t, mix)); pred_kld = g_t err(t, chosen); the
// most sensitive tensor gets more bytes than the least at some budget; a zero kld_ref gets the smallest g of the
// others; all zero is LLMQ_ERR_NUMERIC.
static void test_measured(void) {
    enum { N = 3 };
    const int64_t R = 16, C = 256;
    uint64_t seed = 5;
    struct llmq_gguf_choose_tensor t[N];
    double e[NALL], g[N];
    const double kref[N] = {1e-3, 1e-2, 1e-1};
    rows_of[0] = malloc(sizeof(float) * R * C);
    for (int64_t j = 0; j < R * C; j++) rows_of[0][j] = test_frand(&seed) * (j % 7 == 0 ? 3.0f : 1.0f);
    for (int i = 1; i < N; i++) rows_of[i] = rows_of[0];
    int mix = 0;
    for (int k = 0; k < NALL; k++) {
        e[k] = err_of(rows_of[0], R, C, all[k], NULL);
        if (all[k] == LLMQ_DTYPE_Q4_K) mix = k;
    }
    for (int i = 0; i < N; i++) g[i] = kref[i] / e[mix];
    struct llmq_gguf_choose_opts o = {
        .mode = LLMQ_GGUF_CHOICE_TARGET, .sensitivity = LLMQ_GGUF_SENS_MEASURED, .params = N * R * C, .n_threads = 1};
    uint64_t lo = 0, hi = 0;
    for (int i = 0; i < N; i++)
        t[i] = (struct llmq_gguf_choose_tensor){
            .name = "x", .R = R, .C = C, .type = LLMQ_DTYPE_Q4_K, .is_free = true, .allocate = true};
    llmq_gguf_choose_range(&o, N, t, &lo, &hi);
    CHECK(hi > lo + 17);
    bool favoured = false;
    for (uint64_t budget = lo; budget <= hi; budget += (hi - lo) / 17) {
        for (int i = 0; i < N; i++) {
            t[i].type = LLMQ_DTYPE_Q4_K;
            t[i].kld_ref = kref[i];
        }
        o.target_bytes = budget;
        CHECK_OK(llmq_gguf_choose(&o, N, t, get_rows, t));
        double sum = 0, brute = INFINITY;
        for (int i = 0; i < N; i++) {
            int k = 0;
            while (all[k] != t[i].type) k++;
            CHECK(fabs(t[i].pred_kld - g[i] * e[k]) <= 1e-9 * t[i].pred_kld);
            sum += g[i] * e[k];
        }
        for (int a = 0; a < NALL; a++)
            for (int b = 0; b < NALL; b++)
                for (int c = 0; c < NALL; c++) {
                    uint64_t by = llmq_gguf_choose_bytes(&t[0], all[a]) + llmq_gguf_choose_bytes(&t[1], all[b]) +
                                  llmq_gguf_choose_bytes(&t[2], all[c]);
                    if (by <= budget) brute = fmin(brute, g[0] * e[a] + g[1] * e[b] + g[2] * e[c]);
                }
        CHECK(sum <= brute * (1 + 1e-12));
        favoured |= llmq_gguf_choose_bytes(&t[2], t[2].type) > llmq_gguf_choose_bytes(&t[0], t[0].type);
    }
    CHECK(favoured);
    // a tensor without a positive measurement: the smallest g of the others (here tensor 1's)
    for (int i = 0; i < N; i++) {
        t[i].type = LLMQ_DTYPE_Q4_K;
        t[i].kld_ref = i == 0 ? 0 : kref[i];
    }
    o.target_bytes = N * llmq_gguf_choose_bytes(&t[0], LLMQ_DTYPE_Q4_K);
    llmq_log_set_level(LLMQ_LOG_ERROR);
    CHECK_OK(llmq_gguf_choose(&o, N, t, get_rows, t));
    CHECK(fabs(t[0].pred_kld - g[1] * t[0].err) <= 1e-9 * t[0].pred_kld);
    for (int i = 0; i < N; i++) {
        t[i].type = LLMQ_DTYPE_Q4_K;
        t[i].kld_ref = 0;
    }
    llmq_log_set_level(LLMQ_LOG_ERROR + 1);
    CHECK(llmq_gguf_choose(&o, N, t, get_rows, t) == LLMQ_ERR_NUMERIC);
    llmq_log_set_level(LLMQ_LOG_INFO);
    free(rows_of[0]);
}

// The downgrade guard: rows of 256 with one "massive activation" input column (importance 10^6 x the others') whose
// weights are outliers. Importance-weighted, a smaller type may win by spending its scale on that column; the choice
// takes a smaller type only when it is also better without the importance (the independent guarded argmin), and with
// the same rows but uniform importance it is the plain argmin.
static void test_downgrade_guard(void) {
    const int64_t R = 64, C = 256;
    uint64_t seed = 5;
    float imp[256];
    for (int c = 0; c < C; c++) imp[c] = c == 37 ? 1e6f : 0.5f + test_frand(&seed) * 0.5f;
    rows_of[0] = malloc(sizeof(float) * R * C);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) rows_of[0][r * C + c] = (c == 37 ? 8.0f : 1.0f) * (test_frand(&seed) - 0.5f);
    const enum llmq_dtype mixes[] = {LLMQ_DTYPE_Q3_K, LLMQ_DTYPE_Q4_K, LLMQ_DTYPE_Q5_K, LLMQ_DTYPE_Q6_K};
    int guarded = 0;
    for (int m = 0; m < 4; m++) {
        struct llmq_gguf_choose_tensor t = {
            .name = "g", .R = R, .C = C, .type = mixes[m], .is_free = true, .importance = imp};
        struct llmq_gguf_choose_opts o = {.mode = LLMQ_GGUF_CHOICE_QUALITY, .params = R * C, .n_threads = 2};
        CHECK_OK(llmq_gguf_choose(&o, 1, &t, get_rows, &t));
        check_quality_is_argmin(&t, mixes[m], rows_of[0], 0);
        // would the importance alone have taken a smaller type that the guard refuses?
        double em = err_of(rows_of[0], R, C, mixes[m], imp);
        for (int k = 0; k < NALL; k++) {
            uint64_t by = llmq_gguf_choose_bytes(&t, all[k]);
            if (by && by < llmq_gguf_choose_bytes(&t, mixes[m]) && err_of(rows_of[0], R, C, all[k], imp) < em &&
                choice_err(rows_of[0], &t, mixes[m], all[k]) >= em)
                guarded++;
        }
    }
    printf("test_gguf_choose: downgrade guard refused %d importance-only wins\n", guarded);
    CHECK(guarded > 0); // the constructed rows exercise the guard
    free(rows_of[0]);
}

int main(void) {
    test_quality();
    test_downgrade_guard();
    test_target();
    test_measured();
    printf("test_gguf_choose: ok\n");
    return 0;
}
