// tests/unit/test_gguf_enc_k.c — the k-quant encoders and grids of formats/ggml/encode.h (Q2_K .. Q6_K).
// Grid: for encoded blocks of several distributions, every element decodes (llmq_dequantize_row and
// _ref) to exactly A*L[code]+B with the code read back here from the documented bit layout
// (formats/ggml/quants.h), independently of formats/ggml/encode_k.c; set_code round trips and touches
// only its element. Encoders: edge cases (all-zero, constant, tiny, subnormal, huge, spikes, with
// and without importance) do not crash and decode sensibly; the threaded path equals the reference.
// Byte equality with ggml is tests/py/test_gguf_enc_k_oracle.py.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"
#include "harness.h"

#define QK 256
#define NB 8 // blocks per test row

static const enum llmq_dtype TYPES[] = {LLMQ_DTYPE_Q2_K, LLMQ_DTYPE_Q3_K, LLMQ_DTYPE_Q4_K, LLMQ_DTYPE_Q5_K,
                                        LLMQ_DTYPE_Q6_K};
#define NTYPES (int)(sizeof TYPES / sizeof TYPES[0])

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(test_xorshift64(&rng) >> 32); }
static float unif(void) { return (rnd() + 0.5f) / 4294967296.0f; }
static float gauss(void) { return sqrtf(-2.0f * logf(unif())) * cosf(6.2831853f * unif()); }

static size_t block_bytes(enum llmq_dtype t) {
    switch (t) {
    case LLMQ_DTYPE_Q2_K: return sizeof(struct llmq_block_q2_k);
    case LLMQ_DTYPE_Q3_K: return sizeof(struct llmq_block_q3_k);
    case LLMQ_DTYPE_Q4_K: return sizeof(struct llmq_block_q4_k);
    case LLMQ_DTYPE_Q5_K: return sizeof(struct llmq_block_q5_k);
    case LLMQ_DTYPE_Q6_K: return sizeof(struct llmq_block_q6_k);
    default: CHECK(!"not a k type"); return 0;
    }
}

// The code stored for element e of a block, read from the layout of formats/ggml/quants.h.
static int read_code(enum llmq_dtype t, const uint8_t *b, int e) {
    const int h = e / 128, jj = (e % 128) / 32, l = e % 32; // 2-bit-plane layouts
    const int k = e / 64, hi = (e % 64) / 32;               // nibble layouts
    switch (t) {
    case LLMQ_DTYPE_Q2_K: {
        const struct llmq_block_q2_k *x = (const void *)b;
        return (x->qs[32 * h + l] >> (2 * jj)) & 3;
    }
    case LLMQ_DTYPE_Q3_K: {
        const struct llmq_block_q3_k *x = (const void *)b;
        const int low = (x->qs[32 * h + l] >> (2 * jj)) & 3;
        const int hb = (x->hmask[l] >> (4 * h + jj)) & 1;
        return low | (hb << 2); // value = low - 4 + 4*hb = code - 4
    }
    case LLMQ_DTYPE_Q4_K: {
        const struct llmq_block_q4_k *x = (const void *)b;
        return hi ? x->qs[32 * k + l] >> 4 : x->qs[32 * k + l] & 0xF;
    }
    case LLMQ_DTYPE_Q5_K: {
        const struct llmq_block_q5_k *x = (const void *)b;
        const int nib = hi ? x->qs[32 * k + l] >> 4 : x->qs[32 * k + l] & 0xF;
        return nib | (((x->qh[l] >> (e / 32)) & 1) << 4);
    }
    case LLMQ_DTYPE_Q6_K: {
        const struct llmq_block_q6_k *x = (const void *)b;
        const uint8_t q = x->ql[64 * h + l + 32 * (jj & 1)];
        const int lo = jj >= 2 ? q >> 4 : q & 0xF;
        return lo | (((x->qh[32 * h + l] >> (2 * jj)) & 3) << 4);
    }
    default: CHECK(!"not a k type"); return -1;
    }
}

static int n_levels_of(enum llmq_dtype t) {
    switch (t) {
    case LLMQ_DTYPE_Q2_K: return 4;
    case LLMQ_DTYPE_Q3_K: return 8;
    case LLMQ_DTYPE_Q4_K: return 16;
    case LLMQ_DTYPE_Q5_K: return 32;
    default: return 64;
    }
}

// Same bits, or both NaN (a NaN offset may come out with the other sign: x - NaN vs x + -NaN).
static int same_float(float a, float b) {
    if (isnan(a) && isnan(b)) return 1;
    return memcmp(&a, &b, sizeof a) == 0;
}

// Every element of the nb blocks at y decodes to A*L[code]+B, through both decoders.
static void check_grid_blocks(enum llmq_dtype t, const uint8_t *y, int nb) {
    float dec[NB * QK], dec_ref[NB * QK];
    CHECK(nb <= NB);
    CHECK(llmq_dequantize_row(t, y, dec, nb * QK) == LLMQ_OK);
    CHECK(llmq_dequantize_row_ref(t, y, dec_ref, nb * QK) == LLMQ_OK);
    const size_t bb = block_bytes(t);
    for (int ib = 0; ib < nb; ib++) {
        const uint8_t *b = y + ib * bb;
        for (int e = 0; e < QK; e++) {
            struct llmq_gguf_grid g;
            llmq_gguf_block_grid(t, b, e, &g);
            CHECK_EQ_INT(g.n_levels, n_levels_of(t));
            for (int c = 1; c < g.n_levels; c++) CHECK(g.L[c - 1] < g.L[c]);
            const int code = read_code(t, b, e);
            CHECK(code >= 0 && code < g.n_levels);
            const float v = llmq_gguf_grid_value(&g, code);
            if (!same_float(v, dec[ib * QK + e]) || !same_float(v, dec_ref[ib * QK + e])) {
                fprintf(stderr, "%s block %d elem %d code %d: grid %.9g (A %.9g L %g B %.9g) decode %.9g ref %.9g\n",
                        llmq_dtype_name(t), ib, e, code, v, g.A, g.L[code], g.B, dec[ib * QK + e],
                        dec_ref[ib * QK + e]);
                CHECK(0);
            }
        }
    }
}

// set_code: element e only; grids unchanged; every element still decodes to A*L[code]+B.
static void check_set_code(enum llmq_dtype t, const uint8_t *block) {
    const size_t bb = block_bytes(t);
    uint8_t b[256], b0[256];
    memcpy(b, block, bb);
    struct llmq_gguf_grid g0[QK];
    for (int e = 0; e < QK; e++) llmq_gguf_block_grid(t, b, e, &g0[e]);
    // 1) single elements, each code of the grid, checked against every other element's code
    for (int trial = 0; trial < 64; trial++) {
        const int e = (int)(rnd() % QK);
        const int c = (int)(rnd() % (uint32_t)g0[e].n_levels);
        memcpy(b0, b, bb);
        llmq_gguf_block_set_code(t, b, e, c);
        CHECK_EQ_INT(read_code(t, b, e), c);
        for (int o = 0; o < QK; o++)
            if (o != e) CHECK_EQ_INT(read_code(t, b, o), read_code(t, b0, o));
        llmq_gguf_block_set_code(t, b, e, read_code(t, b0, e)); // back
        CHECK(memcmp(b, b0, bb) == 0);
        llmq_gguf_block_set_code(t, b, e, c);
    }
    // 2) every element to a random code: grids unchanged, decode == A*L[code]+B
    int codes[QK];
    for (int e = 0; e < QK; e++) {
        codes[e] = (int)(rnd() % (uint32_t)g0[e].n_levels);
        llmq_gguf_block_set_code(t, b, e, codes[e]);
    }
    float dec[QK];
    CHECK(llmq_dequantize_row(t, b, dec, QK) == LLMQ_OK);
    for (int e = 0; e < QK; e++) {
        struct llmq_gguf_grid g;
        llmq_gguf_block_grid(t, b, e, &g);
        CHECK(same_float(g.A, g0[e].A) && same_float(g.B, g0[e].B) && g.n_levels == g0[e].n_levels && g.L == g0[e].L);
        CHECK_EQ_INT(read_code(t, b, e), codes[e]);
        CHECK(same_float(llmq_gguf_grid_value(&g, codes[e]), dec[e]));
    }
    // 3) extremes: all codes 0, then all codes n_levels - 1
    for (int c = 0; c < 2; c++) {
        for (int e = 0; e < QK; e++) llmq_gguf_block_set_code(t, b, e, c ? g0[e].n_levels - 1 : 0);
        for (int e = 0; e < QK; e++) CHECK_EQ_INT(read_code(t, b, e), c ? g0[e].n_levels - 1 : 0);
    }
    check_grid_blocks(t, b, 1);
}

enum dist {
    D_GAUSS,
    D_HEAVY,
    D_SMALL,
    D_SCALED,
    D_ZERO,
    D_CONST,
    D_NEG_CONST,
    D_TINY,
    D_SUBNORMAL,
    D_HUGE,
    D_SPIKE,
    D_ALT,
    D_MIXED,
    D_POS,
    D_COUNT
};
static const char *DIST_NAMES[D_COUNT] = {"gauss", "heavy",     "small", "scaled", "zero", "const", "neg_const",
                                          "tiny",  "subnormal", "huge",  "spike",  "alt",  "mixed", "pos"};

static void fill(enum dist d, float *x, int n) {
    for (int i = 0; i < n; i++) {
        switch (d) {
        case D_GAUSS: x[i] = gauss(); break;
        case D_HEAVY: x[i] = gauss() / (fabsf(gauss()) + 0.05f); break;
        case D_SMALL: x[i] = 0.02f * gauss(); break;
        case D_SCALED: x[i] = gauss() * powf(10.0f, (float)((i / QK) % 8) - 4.0f); break; // 1e-4 .. 1e3 per block
        case D_ZERO: x[i] = 0; break;
        case D_CONST: x[i] = 0.75f; break;
        case D_NEG_CONST: x[i] = -3.5f; break;
        case D_TINY: x[i] = 1e-20f * gauss(); break;
        case D_SUBNORMAL: x[i] = 1e-41f * (float)((int)(rnd() % 21) - 10); break;
        case D_HUGE: x[i] = 1e6f * gauss(); break;
        case D_SPIKE: x[i] = i % 97 == 5 ? 40.0f : 0.0f; break;
        case D_ALT: x[i] = i % 2 ? 1.0f : -1.0f; break;
        case D_MIXED: x[i] = (i / 16) % 3 == 0 ? 0.0f : (i / 16) % 3 == 1 ? 2.0f : gauss(); break;
        case D_POS: x[i] = fabsf(gauss()) + 0.5f; break;
        default: x[i] = 0;
        }
    }
}

int main(void) {
    static float x[NB * QK], imp[NB * QK], dec[NB * QK];
    static uint8_t y[NB * 256], y2[4 * NB * 256];
    for (int it = 0; it < NTYPES; it++) {
        const enum llmq_dtype t = TYPES[it];
        const size_t bb = block_bytes(t);
        CHECK(llmq_gguf_can_encode(t));
        for (int d = 0; d < D_COUNT; d++) {
            for (int wi = 0; wi < 3; wi++) { // no importance, random positive, with zeros
                fill((enum dist)d, x, NB * QK);
                for (int i = 0; i < NB * QK; i++)
                    imp[i] = wi == 1 ? unif() + 0.01f : wi == 2 ? (i % 3 ? unif() : 0) : 1;
                const float *w = wi ? imp : NULL;
                memset(y, 0xAB, sizeof y);
                CHECK(llmq_gguf_encode_row_ref(t, x, y, NB * QK, w) == LLMQ_OK);
                CHECK(llmq_dequantize_row(t, y, dec, NB * QK) == LLMQ_OK);
                if (d == D_ZERO)
                    for (int i = 0; i < NB * QK; i++) CHECK(dec[i] == 0.0f);
                if (d != D_HUGE) { // huge rows may overflow the f16 scales by design of the format
                    double err = 0, ref = 0;
                    for (int i = 0; i < NB * QK; i++) {
                        CHECK(isfinite(dec[i]));
                        err += ((double)dec[i] - x[i]) * ((double)dec[i] - x[i]);
                        ref += (double)x[i] * x[i];
                    }
                    // a sane reconstruction: relative error well below 1 (2-bit gaussian ~0.1)
                    if (ref > 1e-30 && d != D_SUBNORMAL && d != D_TINY && !(wi == 2 && d == D_SPIKE)) {
                        if (!(err <= 0.5 * ref)) {
                            fprintf(stderr, "%s %s imp %d: rel err %g\n", llmq_dtype_name(t), DIST_NAMES[d], wi,
                                    err / ref);
                            CHECK(0);
                        }
                    }
                }
                check_grid_blocks(t, y, NB);
                check_set_code(t, y + (rnd() % NB) * bb);
                // the threaded fast path produces the reference bytes (4 rows of NB/4 blocks... and 1 row)
                memset(y2, 0, sizeof y2);
                CHECK(llmq_gguf_encode_rows(t, x, y2, 4, NB * QK / 4, w ? imp : NULL, 3) == LLMQ_OK);
                uint8_t yr[NB * 256];
                for (int r = 0; r < 4; r++)
                    CHECK(llmq_gguf_encode_row_ref(t, x + r * (NB * QK / 4), yr + r * (NB / 4) * bb, NB * QK / 4,
                                                   w ? imp : NULL) == LLMQ_OK);
                CHECK(memcmp(y2, yr, NB * bb) == 0);
            }
        }
        // NaN-free outputs for finite, moderately large inputs; grid stays consistent on huge
        fill(D_HUGE, x, NB * QK);
        for (int i = 0; i < NB * QK; i++) x[i] *= 1e3f; // 1e9: the f16 scales overflow to inf
        CHECK(llmq_gguf_encode_row_ref(t, x, y, NB * QK, NULL) == LLMQ_OK);
        check_grid_blocks(t, y, NB);
        CHECK(llmq_gguf_encode_row_ref(t, x, y, NB * QK, imp) == LLMQ_OK);
        check_grid_blocks(t, y, NB);
        // a row that is not a multiple of 256 is refused
        CHECK(llmq_gguf_encode_row_ref(t, x, y, 32, NULL) == LLMQ_ERR_ARG);
        printf("%s ok\n", llmq_dtype_name(t));
    }
    return 0;
}
