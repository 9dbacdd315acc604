// formats/ggml/encode.c — dispatch of the ggml block encoders (formats/ggml/encode.h): argument checks, the
// per-type reference row encoders of encode_{legacy,k,iq4}.c, the threaded row encoder, the grid
// dispatch and the exact nearest grid point.
// Legend: n elements of a row, blck elements of a block, nrows rows of n_per_row elements.
// The threaded path runs the reference encoder on disjoint row ranges: every row is encoded by
// the same code with the same inputs, so the bytes cannot depend on the thread count.
#include "formats/ggml/encode.h"
#include "formats/ggml/encode_impl.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>

#include "formats/ggml/quants.h"

typedef void (*enc_fn)(const float *x, void *y, int64_t n, const float *qw);

static void enc_f32(const float *x, void *y, int64_t n, const float *qw) {
    (void)qw;
    llmq_quant_traits(LLMQ_DTYPE_F32)->from_float(x, y, n, NULL);
}
static void enc_f16(const float *x, void *y, int64_t n, const float *qw) {
    (void)qw;
    llmq_f32_to_f16_row(x, y, n);
}
static void enc_bf16(const float *x, void *y, int64_t n, const float *qw) {
    (void)qw;
    llmq_f32_to_bf16_row(x, y, n);
}

// Encoder of t, NULL if t is not encodable (or out of range).
static enc_fn encoder(enum llmq_dtype t) {
    switch (t) {
    case LLMQ_DTYPE_F32: return enc_f32;
    case LLMQ_DTYPE_F16: return enc_f16;
    case LLMQ_DTYPE_BF16: return enc_bf16;
    case LLMQ_DTYPE_Q4_0: return llmq_enc_q4_0;
    case LLMQ_DTYPE_Q4_1: return llmq_enc_q4_1;
    case LLMQ_DTYPE_Q5_0: return llmq_enc_q5_0;
    case LLMQ_DTYPE_Q5_1: return llmq_enc_q5_1;
    case LLMQ_DTYPE_Q8_0: return llmq_enc_q8_0;
    case LLMQ_DTYPE_Q2_K: return llmq_enc_q2_k;
    case LLMQ_DTYPE_Q3_K: return llmq_enc_q3_k;
    case LLMQ_DTYPE_Q4_K: return llmq_enc_q4_k;
    case LLMQ_DTYPE_Q5_K: return llmq_enc_q5_k;
    case LLMQ_DTYPE_Q6_K: return llmq_enc_q6_k;
    case LLMQ_DTYPE_IQ4_NL: return llmq_enc_iq4_nl;
    case LLMQ_DTYPE_IQ4_XS: return llmq_enc_iq4_xs;
    default: return NULL;
    }
}

bool llmq_gguf_can_encode(enum llmq_dtype t) { return encoder(t) != NULL; }

// Checks shared by both entry points; *fn and *row_bytes are set on success.
static enum llmq_status check_args(const char *what, enum llmq_dtype t, const float *src, const void *dst,
                                   int64_t nrows, int64_t n_per_row, enc_fn *fn, size_t *row_bytes) {
    const struct llmq_dtype_traits *dt = llmq_dtype_traits(t);
    if (!dt) return llmq_errorf(LLMQ_ERR_ARG, "%s: dtype %d out of range", what, (int)t);
    *fn = encoder(t);
    if (!*fn) return llmq_errorf(LLMQ_ERR_ARG, "%s: cannot encode %s (no ggml quantizer for it)", what, dt->name);
    if (n_per_row < 0 || n_per_row % dt->blck != 0)
        return llmq_errorf(LLMQ_ERR_ARG, "%s %s: %lld elements per row is not a multiple of the block size %lld", what,
                           dt->name, (long long)n_per_row, (long long)dt->blck);
    int64_t total;
    if (nrows < 0 || !llmq_mul_i64(nrows, n_per_row, &total) || !llmq_dtype_nbytes(t, n_per_row, row_bytes) ||
        (nrows > 0 && *row_bytes > SIZE_MAX / (size_t)nrows))
        return llmq_errorf(LLMQ_ERR_ARG, "%s %s: bad shape (%lld, %lld)", what, dt->name, (long long)nrows,
                           (long long)n_per_row);
    if (total > 0 && (!src || !dst)) return llmq_errorf(LLMQ_ERR_ARG, "%s %s: NULL buffer", what, dt->name);
    return LLMQ_OK;
}

enum llmq_status llmq_gguf_encode_row_ref(enum llmq_dtype t, const float *src, void *dst, int64_t n,
                                          const float *importance) {
    enc_fn fn = NULL;
    size_t row_bytes = 0;
    enum llmq_status st = check_args("encode", t, src, dst, 1, n, &fn, &row_bytes);
    if (st) return st;
    if (n > 0) fn(src, dst, n, importance);
    return LLMQ_OK;
}

// ---- threaded rows

struct rows_job {
    enc_fn fn;
    const float *src;        // (nrows, n_per_row)
    unsigned char *dst;      // (nrows, row_bytes)
    const float *importance; // NULL or (n_per_row)
    int64_t n_per_row, r0, r1;
    size_t row_bytes;
};

static void *encode_job(void *arg) {
    const struct rows_job *j = arg;
    for (int64_t r = j->r0; r < j->r1; r++)
        j->fn(j->src + r * j->n_per_row, j->dst + (size_t)r * j->row_bytes, j->n_per_row, j->importance);
    return NULL;
}

enum llmq_status llmq_gguf_encode_rows(enum llmq_dtype t, const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                                       const float *importance, int n_threads) {
    enum { MAX_THREADS = 256 };
    enc_fn fn = NULL;
    size_t row_bytes = 0;
    enum llmq_status st = check_args("encode rows", t, src, dst, nrows, n_per_row, &fn, &row_bytes);
    if (st) return st;
    if (nrows == 0 || n_per_row == 0) return LLMQ_OK;

    if (!importance) {
        enc_fn fast = llmq_enc_fast(t);
        if (fast) fn = fast;
    }
    int nt = n_threads < 1 ? 1 : n_threads > MAX_THREADS ? MAX_THREADS : n_threads;
    if (nt > nrows) nt = (int)nrows;
    struct rows_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {0};
    for (int i = 0; i < nt; i++)
        jobs[i] =
            (struct rows_job){fn, src, dst, importance, n_per_row, nrows * i / nt, nrows * (i + 1) / nt, row_bytes};
    for (int i = 1; i < nt; i++) started[i] = pthread_create(&tid[i], NULL, encode_job, &jobs[i]) == 0;
    encode_job(&jobs[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            encode_job(&jobs[i]); // could not start a thread: do its share here
    }
    return LLMQ_OK;
}

// ---- grids

enum grid_family { FAMILY_NONE, FAMILY_LEGACY, FAMILY_K, FAMILY_IQ4 };

// Family of t and the number of codes of its elements (bits per stored element).
static enum grid_family grid_family(enum llmq_dtype t, int *n_codes) {
    switch (t) {
    case LLMQ_DTYPE_Q4_0:
    case LLMQ_DTYPE_Q4_1: *n_codes = 16; return FAMILY_LEGACY;
    case LLMQ_DTYPE_Q5_0:
    case LLMQ_DTYPE_Q5_1: *n_codes = 32; return FAMILY_LEGACY;
    case LLMQ_DTYPE_Q8_0: *n_codes = 256; return FAMILY_LEGACY;
    case LLMQ_DTYPE_Q2_K: *n_codes = 4; return FAMILY_K;
    case LLMQ_DTYPE_Q3_K: *n_codes = 8; return FAMILY_K;
    case LLMQ_DTYPE_Q4_K: *n_codes = 16; return FAMILY_K;
    case LLMQ_DTYPE_Q5_K: *n_codes = 32; return FAMILY_K;
    case LLMQ_DTYPE_Q6_K: *n_codes = 64; return FAMILY_K;
    case LLMQ_DTYPE_IQ4_NL:
    case LLMQ_DTYPE_IQ4_XS: *n_codes = 16; return FAMILY_IQ4;
    default: *n_codes = 0; return FAMILY_NONE;
    }
}

void llmq_gguf_block_grid(enum llmq_dtype t, const void *block, int j, struct llmq_gguf_grid *g) {
    int n_codes;
    const enum grid_family f = grid_family(t, &n_codes);
    LLMQ_ASSERT(f != FAMILY_NONE && j >= 0 && j < llmq_dtype_traits(t)->blck);
    if (f == FAMILY_LEGACY)
        llmq_grid_legacy(t, block, j, g);
    else if (f == FAMILY_K)
        llmq_grid_k(t, block, j, g);
    else
        llmq_grid_iq4(t, block, j, g);
    LLMQ_ASSERT(g->n_levels == n_codes);
}

void llmq_gguf_block_set_code(enum llmq_dtype t, void *block, int j, int code) {
    int n_codes;
    const enum grid_family f = grid_family(t, &n_codes);
    LLMQ_ASSERT(f != FAMILY_NONE && j >= 0 && j < llmq_dtype_traits(t)->blck && code >= 0 && code < n_codes);
    if (f == FAMILY_LEGACY)
        llmq_setq_legacy(t, block, j, code);
    else if (f == FAMILY_K)
        llmq_setq_k(t, block, j, code);
    else
        llmq_setq_iq4(t, block, j, code);
}

// ---- nearest grid point
// The answer is defined by the linear search: the lowest code c minimising fabsf(value(c) - w).
// With A, B and w finite, value(c) is monotone in c (f32 multiply and add are monotone and L is
// ascending), so dist(c) = fabsf(value(c) - w) is non-increasing up to the first code p on the
// far side of w and non-decreasing from p on; the minimum is dist(p - 1) or dist(p), and the
// lowest code reaching it is found by bisection on [0, p) (plateaus of equal values or equal
// rounded distances included). Non-finite grids or w take the linear search.

static float grid_dist(const struct llmq_gguf_grid *g, int c, float w) { return fabsf(llmq_gguf_grid_value(g, c) - w); }

static int nearest_linear(const struct llmq_gguf_grid *g, float w) {
    int best = 0;
    float best_d = grid_dist(g, 0, w);
    for (int c = 1; c < g->n_levels; c++) {
        const float d = grid_dist(g, c, w);
        if (d < best_d || (isnan(best_d) && !isnan(d))) {
            best_d = d;
            best = c;
        }
    }
    return best;
}

int llmq_gguf_grid_nearest(const struct llmq_gguf_grid *g, float w) {
    const int n = g->n_levels;
    if (g->A == 0) { // every code decodes to B: the code whose level is nearest to 0
        int best = 0;
        for (int c = 1; c < n; c++)
            if (fabsf(g->L[c]) < fabsf(g->L[best])) best = c;
        return best;
    }
    if (!isfinite(g->A) || !isfinite(g->B) || !isfinite(w)) return nearest_linear(g, w);
    const bool up = g->A > 0; // value(c) non-decreasing in c (else non-increasing)
    // p: the first code with value(c) on w's far side (value >= w going up, <= w going down)
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        const float v = llmq_gguf_grid_value(g, mid);
        if (up ? v >= w : v <= w)
            hi = mid;
        else
            lo = mid + 1;
    }
    const int p = lo;
    float dmin = p < n ? grid_dist(g, p, w) : INFINITY;
    if (p > 0) {
        const float dp = grid_dist(g, p - 1, w);
        if (dp <= dmin)
            dmin = dp;
        else
            return p; // dist is larger everywhere below p
        // lowest code in [0, p) with dist <= dmin (dist non-increasing there)
        lo = 0, hi = p - 1;
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (grid_dist(g, mid, w) <= dmin)
                hi = mid;
            else
                lo = mid + 1;
        }
        return lo;
    }
    return p;
}
