// tests/unit/test_gguf_enc.c — formats/ggml/encode.h: the grid contract of every block type, the exact
// nearest grid point, threaded rows == the reference, argument errors.
// (Byte equality with ggml and gguf-py: tests/py/test_gguf_enc_oracle.py.)
#include "harness.h"

#include <math.h>

#include "common/dtype.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"

static const enum llmq_dtype block_types[] = {
    LLMQ_DTYPE_Q4_0, LLMQ_DTYPE_Q4_1, LLMQ_DTYPE_Q5_0, LLMQ_DTYPE_Q5_1, LLMQ_DTYPE_Q8_0,   LLMQ_DTYPE_Q2_K,
    LLMQ_DTYPE_Q3_K, LLMQ_DTYPE_Q4_K, LLMQ_DTYPE_Q5_K, LLMQ_DTYPE_Q6_K, LLMQ_DTYPE_IQ4_NL, LLMQ_DTYPE_IQ4_XS,
};
#define N_BLOCK_TYPES (int)(sizeof block_types / sizeof block_types[0])

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { return (uint32_t)(test_xorshift64(&rng_state) >> 16); }
static float unif(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f; } // [0, 1)
static float gauss(void) {
    const float u = unif() + 1e-7f, v = unif();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

// Rows of varied character: gaussian with a per-block spread, zero / constant / positive blocks.
static void fill_rows(float *x, int64_t nrows, int64_t n) {
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t b = 0; b < n / 32; b++) {
            const int kind = (int)(rnd() % 8);
            const float spread = powf(10.0f, 4.0f * unif() - 2.0f), c = gauss();
            for (int64_t i = 0; i < 32; i++) {
                float *v = &x[r * n + 32 * b + i];
                *v = kind == 0 ? 0.0f : kind == 1 ? c : kind == 2 ? fabsf(gauss()) * spread + 0.1f : gauss() * spread;
            }
        }
}

static int same_bits(float a, float b) { return llmq_f32_bits(a) == llmq_f32_bits(b); }

// For random encoded blocks of t: every element decodes to A * L[code] + B of its grid for the
// code it stores (some code reproduces the decoded bits), and setting any code of any element
// changes exactly that element, to exactly A * L[code] + B, without changing any grid.
static void check_grid_contract(enum llmq_dtype t) {
    const struct llmq_dtype_traits *dt = llmq_dtype_traits(t);
    const int64_t blck = dt->blck, n = 512;
    float x[512], imp[512], dec[512], dec2[512];
    unsigned char row[512 / 32 * 34], blk[256];
    struct llmq_gguf_grid g, g2;
    fill_rows(x, 1, n);
    for (int i = 0; i < n; i++) imp[i] = 0.1f + 3.0f * unif();
    for (int pass = 0; pass < 2; pass++) {
        CHECK(llmq_gguf_encode_row_ref(t, x, row, n, pass ? imp : NULL) == LLMQ_OK);
        for (int64_t b = 0; b < n / blck; b++) {
            memcpy(blk, row + b * dt->size, dt->size);
            CHECK(llmq_dequantize_row_ref(t, blk, dec, blck) == LLMQ_OK);
            for (int j = 0; j < blck; j++) {
                llmq_gguf_block_grid(t, blk, j, &g);
                CHECK(g.n_levels >= 2 && g.n_levels <= LLMQ_GGUF_MAX_LEVELS);
                int found = 0;
                for (int c = 0; c < g.n_levels; c++) {
                    if (c > 0) CHECK(g.L[c - 1] < g.L[c]);
                    found |= same_bits(llmq_gguf_grid_value(&g, c), dec[j]);
                }
                if (!found) {
                    fprintf(stderr, "%s block %lld elem %d: decoded %g is no grid value (A %g B %g)\n", dt->name,
                            (long long)b, j, dec[j], g.A, g.B);
                    CHECK(found);
                }
            }
            // set_code round trip on a few elements (all of them for the first block)
            for (int j = 0; j < blck; j += b == 0 ? 1 : 7) {
                llmq_gguf_block_grid(t, blk, j, &g);
                for (int c = 0; c<g.n_levels; c += g.n_levels> 32 ? 5 : 1) {
                    unsigned char mod[256];
                    memcpy(mod, blk, dt->size);
                    llmq_gguf_block_set_code(t, mod, j, c);
                    CHECK(llmq_dequantize_row_ref(t, mod, dec2, blck) == LLMQ_OK);
                    for (int k = 0; k < blck; k++) {
                        if (k == j) {
                            if (!same_bits(dec2[k], llmq_gguf_grid_value(&g, c))) {
                                fprintf(stderr, "%s block %lld elem %d code %d: decodes %g, grid says %g\n", dt->name,
                                        (long long)b, j, c, dec2[k], llmq_gguf_grid_value(&g, c));
                                CHECK(0);
                            }
                        } else {
                            CHECK(same_bits(dec2[k], dec[k]));
                        }
                    }
                    llmq_gguf_block_grid(t, mod, j, &g2);
                    CHECK(same_bits(g.A, g2.A) && same_bits(g.B, g2.B) && g.n_levels == g2.n_levels && g.L == g2.L);
                }
            }
        }
    }
}

// The definition of grid_nearest: the lowest code minimising |value - w|; A == 0: the lowest code
// minimising |L|.
static int nearest_brute(const struct llmq_gguf_grid *g, float w) {
    int best = 0;
    for (int c = 1; c < g->n_levels; c++) {
        if (g->A == 0 ? fabsf(g->L[c]) < fabsf(g->L[best])
                      : fabsf(llmq_gguf_grid_value(g, c) - w) < fabsf(llmq_gguf_grid_value(g, best) - w))
            best = c;
    }
    return best;
}

// Probe points around a grid: random, every value, its float neighbours, the float midpoints of
// neighbouring values, far outside.
static void check_nearest_on(const struct llmq_gguf_grid *g, const char *what) {
    float probes[4 * LLMQ_GGUF_MAX_LEVELS + 64];
    int np = 0;
    const float lo = llmq_gguf_grid_value(g, 0), hi = llmq_gguf_grid_value(g, g->n_levels - 1);
    for (int c = 0; c < g->n_levels; c++) {
        const float v = llmq_gguf_grid_value(g, c);
        probes[np++] = v;
        probes[np++] = nextafterf(v, INFINITY);
        probes[np++] = nextafterf(v, -INFINITY);
        if (c > 0) probes[np++] = 0.5f * (v + llmq_gguf_grid_value(g, c - 1));
    }
    for (int i = 0; i < 60; i++) probes[np++] = lo + (hi - lo) * (1.4f * unif() - 0.2f);
    probes[np++] = 1e30f;
    probes[np++] = -1e30f;
    probes[np++] = 0.0f;
    probes[np++] = -0.0f;
    for (int i = 0; i < np; i++) {
        const int got = llmq_gguf_grid_nearest(g, probes[i]), want = nearest_brute(g, probes[i]);
        if (got != want) {
            fprintf(stderr, "%s: nearest(%.9g) = %d, brute force %d (A %.9g B %.9g, %d levels)\n", what, probes[i], got,
                    want, g->A, g->B, g->n_levels);
            CHECK(0);
        }
    }
}

static void check_nearest(void) {
    // grids of real encoded blocks
    float x[512];
    unsigned char row[512 / 32 * 34];
    fill_rows(x, 1, 512);
    for (int ti = 0; ti < N_BLOCK_TYPES; ti++) {
        const enum llmq_dtype t = block_types[ti];
        const struct llmq_dtype_traits *dt = llmq_dtype_traits(t);
        CHECK(llmq_gguf_encode_row_ref(t, x, row, 512, NULL) == LLMQ_OK);
        for (int64_t b = 0; b < 512 / dt->blck; b++)
            for (int j = 0; j < dt->blck; j += 13) {
                struct llmq_gguf_grid g;
                llmq_gguf_block_grid(t, row + b * dt->size, j, &g);
                check_nearest_on(&g, dt->name);
            }
    }
    // adversarial grids: plateaus (A tiny next to B), negative A, A == 0, subnormal A
    float lv[256];
    for (int c = 0; c < 256; c++) lv[c] = (float)(c - 128);
    static const float iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    const struct llmq_gguf_grid grids[] = {
        {1e-6f, 1000.0f, 256, lv},  {-1e-6f, 1000.0f, 256, lv}, {3e-5f, -1.0f, 16, iq4}, {0.0f, 5.0f, 16, iq4},
        {-0.0f, -0.0f, 256, lv},    {-0.37f, -0.0f, 16, iq4},   {1e-40f, 0.0f, 256, lv}, {2.5f, 1e-3f, 32, lv + 112},
        {-7.0f, 3.0f, 4, lv + 128}, {1e-3f, 1e4f, 64, lv + 96},
    };
    for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++) check_nearest_on(&grids[i], "synthetic grid");
    for (int i = 0; i < 300; i++) { // random uniform grids, some with B dwarfing A
        const float A = (rnd() & 1 ? 1.0f : -1.0f) * powf(10.0f, 8.0f * unif() - 6.0f);
        const float B = gauss() * powf(10.0f, 6.0f * unif() - 2.0f);
        const int nl = 4 << (rnd() % 7);
        const struct llmq_gguf_grid g = {A, B, nl > 256 ? 256 : nl, lv + (nl >= 256 ? 0 : 128 - nl / 2)};
        check_nearest_on(&g, "random grid");
    }
}

static void check_threads(void) {
    enum { R = 23, N = 768 };
    static float x[R * N], imp[N];
    static unsigned char ref[R * N / 32 * 34 + 4 * R * N], got[sizeof ref];
    fill_rows(x, R, N);
    for (int i = 0; i < N; i++) imp[i] = 0.05f + unif();
    const enum llmq_dtype extra[] = {LLMQ_DTYPE_F32, LLMQ_DTYPE_F16, LLMQ_DTYPE_BF16};
    for (int ti = 0; ti < N_BLOCK_TYPES + 3; ti++) {
        const enum llmq_dtype t = ti < N_BLOCK_TYPES ? block_types[ti] : extra[ti - N_BLOCK_TYPES];
        CHECK(llmq_gguf_can_encode(t));
        size_t rb;
        CHECK(llmq_dtype_nbytes(t, N, &rb));
        for (int pass = 0; pass < 2; pass++) {
            const float *qw = pass ? imp : NULL;
            for (int r = 0; r < R; r++) CHECK(llmq_gguf_encode_row_ref(t, x + r * N, ref + r * rb, N, qw) == LLMQ_OK);
            for (int nt = 1; nt <= 5; nt += 2) {
                memset(got, 0xA5, sizeof got);
                CHECK(llmq_gguf_encode_rows(t, x, got, R, N, qw, nt) == LLMQ_OK);
                CHECK(memcmp(got, ref, rb * R) == 0);
                CHECK(got[rb * R] == 0xA5); // nothing written past the rows
            }
        }
    }
    // F32 / F16 / BF16: plain conversion
    float back[N];
    CHECK(llmq_gguf_encode_row_ref(LLMQ_DTYPE_F16, x, got, N, NULL) == LLMQ_OK);
    CHECK(llmq_dequantize_row(LLMQ_DTYPE_F16, got, back, N) == LLMQ_OK);
    for (int i = 0; i < N; i++) CHECK(same_bits(back[i], llmq_f16_to_f32(llmq_f32_to_f16(x[i]))));
    CHECK(llmq_gguf_encode_row_ref(LLMQ_DTYPE_F32, x, got, N, NULL) == LLMQ_OK);
    CHECK(memcmp(got, x, sizeof(float) * N) == 0);
}

static void check_errors(void) {
    float x[256] = {0};
    unsigned char y[1024];
    CHECK(llmq_gguf_encode_row_ref(LLMQ_DTYPE_Q4_K, x, y, 128, NULL) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "q4_k");
    CHECK_CONTAINS(llmq_last_error(), "multiple of the block size 256");
    CHECK(llmq_gguf_encode_rows(LLMQ_DTYPE_Q4_0, x, y, 2, 48, NULL, 2) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "q4_0");
    CHECK_CONTAINS(llmq_last_error(), "48");
    CHECK(!llmq_gguf_can_encode(LLMQ_DTYPE_Q8_1) && !llmq_gguf_can_encode(LLMQ_DTYPE_I32) &&
          !llmq_gguf_can_encode(LLMQ_DTYPE_IQ2_XXS) && !llmq_gguf_can_encode(LLMQ_DTYPE_F64) &&
          !llmq_gguf_can_encode(LLMQ_DTYPE_COUNT) && !llmq_gguf_can_encode(LLMQ_DTYPE_INVALID));
    CHECK(llmq_gguf_encode_row_ref(LLMQ_DTYPE_Q8_1, x, y, 32, NULL) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "cannot encode q8_1");
    CHECK(llmq_gguf_encode_rows(LLMQ_DTYPE_IQ2_XXS, x, y, 1, 256, NULL, 1) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "cannot encode iq2_xxs");
    CHECK(llmq_gguf_encode_row_ref(LLMQ_DTYPE_COUNT, x, y, 32, NULL) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "out of range");
    CHECK(llmq_gguf_encode_row_ref(LLMQ_DTYPE_Q8_0, NULL, y, 32, NULL) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "NULL buffer");
    CHECK(llmq_gguf_encode_rows(LLMQ_DTYPE_Q8_0, x, y, -1, 32, NULL, 1) == LLMQ_ERR_ARG);
    CHECK(llmq_gguf_encode_rows(LLMQ_DTYPE_Q8_0, x, y, INT64_MAX / 16, 64, NULL, 1) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "bad shape");
    // empty input is fine, NULL buffers included
    CHECK(llmq_gguf_encode_row_ref(LLMQ_DTYPE_Q6_K, NULL, NULL, 0, NULL) == LLMQ_OK);
    CHECK(llmq_gguf_encode_rows(LLMQ_DTYPE_Q6_K, NULL, NULL, 0, 256, NULL, 4) == LLMQ_OK);
}

// The SSE2 fast paths of the legacy types (formats/ggml/encode_sse2.c, taken by llmq_gguf_encode_rows without
// importance) against the reference encoder, on blocks built to hit their corner cases: signed zeros,
// equal magnitudes of both signs, values that land exactly on .5 after scaling, non-finite values,
// all-equal blocks, subnormals, and plain gaussian / heavy-tailed data.
static void check_fast_paths(void) {
    static const enum llmq_dtype legacy[] = {LLMQ_DTYPE_Q4_0, LLMQ_DTYPE_Q4_1, LLMQ_DTYPE_Q5_0, LLMQ_DTYPE_Q5_1,
                                             LLMQ_DTYPE_Q8_0};
    enum { N = 32 * 64, ROWS = 96 };
    static float x[ROWS * N];
    for (int r = 0; r < ROWS; r++)
        for (int b = 0; b < N / 32; b++) {
            float *xb = x + (size_t)r * N + 32 * b;
            int kind = (int)(rnd() % 12);
            float s = kind == 9 ? 1e-40f : powf(10.0f, (float)((int)(rnd() % 9) - 4));
            for (int j = 0; j < 32; j++) {
                float g = gauss();
                switch (kind) {
                case 0: xb[j] = 0.0f; break;
                case 1: xb[j] = (rnd() & 1) ? -0.0f : 0.0f; break;
                case 2: xb[j] = (rnd() & 1) ? s : -s; break;                // equal magnitudes
                case 3: xb[j] = s * (float)((int)(rnd() % 33) - 16); break; // integers: exact .5 cases
                case 4: xb[j] = s * (float)((int)(rnd() % 255) - 127) / 2.0f; break;
                case 5: xb[j] = j == 7 ? NAN : s * g; break;
                case 6: xb[j] = j == 3 ? -INFINITY : s * g; break;
                case 7: xb[j] = 1.5f * s; break;                            // constant block
                case 8: xb[j] = (j % 3 == 0) ? -0.0f : s * fabsf(g); break; // min is -0.0
                case 9: xb[j] = s * g; break;                               // subnormals
                case 10: xb[j] = s * g * g * g; break;                      // heavy tails
                default: xb[j] = s * g; break;
                }
            }
        }
    for (size_t ti = 0; ti < sizeof legacy / sizeof legacy[0]; ti++) {
        enum llmq_dtype t = legacy[ti];
        size_t rb = 0;
        CHECK(llmq_dtype_nbytes(t, N, &rb));
        unsigned char *ref = malloc(rb * ROWS), *got = malloc(rb * ROWS);
        CHECK(ref && got);
        for (int r = 0; r < ROWS; r++)
            CHECK(llmq_gguf_encode_row_ref(t, x + (size_t)r * N, ref + r * rb, N, NULL) == LLMQ_OK);
        CHECK(llmq_gguf_encode_rows(t, x, got, ROWS, N, NULL, 1) == LLMQ_OK);
        for (size_t k = 0; k < rb * ROWS; k++)
            if (got[k] != ref[k]) {
                fprintf(stderr, "fast path %s differs from the reference at byte %zu (row %zu)\n", llmq_dtype_name(t),
                        k, k / rb);
                CHECK(0);
            }
        free(ref);
        free(got);
    }
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    for (int ti = 0; ti < N_BLOCK_TYPES; ti++) check_grid_contract(block_types[ti]);
    check_nearest();
    check_threads();
    check_fast_paths();
    check_errors();
    printf("test_gguf_enc: ok\n");
    return 0;
}
