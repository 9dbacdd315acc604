// bench/dequant_speed.c — single-thread f32 decoding throughput of formats/ggml/quants.h.
//
//   bench_dequant_speed [--mb N] [--reps R] [--types q4_0,q4_k,...] [--dump DIR]
//
// For every decodable type: a buffer of random blocks (realistic, normal-range f16 scales so no
// subnormal arithmetic skews the timing) that decodes to N MB of f32 (default 64), decoded R times
// (default 7) by the fast decoder and by the plain-C reference; prints the median as GB/s of f32
// output (1 GB = 1e9 bytes), one TSV line per type on stdout. --dump DIR writes each input to
// DIR/<type>.bin so that bench/dequant_speed.sh can time gguf-py on the same bytes.
#include "common/dtype.h"
#include "common/status.h"
#include "formats/ggml/quants.h"
#include "tests/util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// f16 fields inside each block type (byte offsets), to be given realistic scales.
static const struct {
    enum llmq_dtype t;
    int n;
    size_t off[2];
} f16_fields[] = {
    {LLMQ_DTYPE_Q4_0, 1, {offsetof(struct llmq_block_q4_0, d)}},
    {LLMQ_DTYPE_Q4_1, 2, {offsetof(struct llmq_block_q4_1, d), offsetof(struct llmq_block_q4_1, m)}},
    {LLMQ_DTYPE_Q5_0, 1, {offsetof(struct llmq_block_q5_0, d)}},
    {LLMQ_DTYPE_Q5_1, 2, {offsetof(struct llmq_block_q5_1, d), offsetof(struct llmq_block_q5_1, m)}},
    {LLMQ_DTYPE_Q8_0, 1, {offsetof(struct llmq_block_q8_0, d)}},
    {LLMQ_DTYPE_Q2_K, 2, {offsetof(struct llmq_block_q2_k, d), offsetof(struct llmq_block_q2_k, dmin)}},
    {LLMQ_DTYPE_Q3_K, 1, {offsetof(struct llmq_block_q3_k, d)}},
    {LLMQ_DTYPE_Q4_K, 2, {offsetof(struct llmq_block_q4_k, d), offsetof(struct llmq_block_q4_k, dmin)}},
    {LLMQ_DTYPE_Q5_K, 2, {offsetof(struct llmq_block_q5_k, d), offsetof(struct llmq_block_q5_k, dmin)}},
    {LLMQ_DTYPE_Q6_K, 1, {offsetof(struct llmq_block_q6_k, d)}},
    {LLMQ_DTYPE_IQ4_NL, 1, {offsetof(struct llmq_block_iq4_nl, d)}},
    {LLMQ_DTYPE_IQ4_XS, 1, {offsetof(struct llmq_block_iq4_xs, d)}},
};

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { return (uint32_t)(test_xorshift64(&rng) >> 16); }
static float rnd_normalish(void) { // sum of uniforms, roughly N(0, 1)
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)rnd() / 4294967296.0f;
    return (s - 2.0f) * 1.7f;
}

static void fill(enum llmq_dtype t, unsigned char *buf, size_t bytes, int64_t n) {
    const struct llmq_dtype_traits *dt = llmq_dtype_traits(t);
    if (t == LLMQ_DTYPE_F32) {
        for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = rnd_normalish();
    } else if (t == LLMQ_DTYPE_F64) {
        for (int64_t i = 0; i < n; i++) ((double *)buf)[i] = rnd_normalish();
    } else if (t == LLMQ_DTYPE_F16) {
        for (int64_t i = 0; i < n; i++) ((uint16_t *)buf)[i] = llmq_f32_to_f16(rnd_normalish());
    } else if (t == LLMQ_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++) ((uint16_t *)buf)[i] = llmq_f32_to_bf16(rnd_normalish());
    } else {
        for (size_t i = 0; i < bytes; i++) buf[i] = (unsigned char)rnd();
        for (size_t k = 0; k < sizeof f16_fields / sizeof f16_fields[0]; k++) {
            if (f16_fields[k].t != t) continue;
            for (size_t b = 0; b < bytes / dt->size; b++)
                for (int f = 0; f < f16_fields[k].n; f++) {
                    uint16_t h = llmq_f32_to_f16(0.001f + 0.01f * fabsf(rnd_normalish()));
                    memcpy(buf + b * dt->size + f16_fields[k].off[f], &h, 2);
                }
        }
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Median seconds of `reps` decodes (after one warm-up that also faults the pages in).
static double time_decode(llmq_to_float_fn fn, const void *src, float *dst, int64_t n, int reps) {
    double t[64];
    fn(src, dst, n);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        fn(src, dst, n);
        t[r] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

static int usage(void) {
    fprintf(stderr, "usage: bench_dequant_speed [--mb N (64)] [--reps R (7, max 63)] [--types a,b,...] [--dump DIR]\n");
    return 2;
}

int main(int argc, char **argv) {
    int64_t mb = 64;
    int reps = 7;
    const char *types = NULL, *dump = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc)
            mb = atoll(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--types") == 0 && i + 1 < argc)
            types = argv[++i];
        else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
            dump = argv[++i];
        else {
            fprintf(stderr, "bad flag %s\n", argv[i]);
            return usage();
        }
    }
    if (mb < 1 || reps < 1 || reps > 63) return usage();

    const int64_t n_target = mb * 1024 * 1024 / 4; // f32 outputs
    float *dst = malloc((size_t)n_target * sizeof(float));
    if (!dst) return 1;
    printf("type\tin_MB\tout_MB\tfast_ms\tfast_GBps\tref_ms\tref_GBps\n");
    for (int t = 0; t < LLMQ_DTYPE_COUNT; t++) {
        const struct llmq_dtype_traits *dt = llmq_dtype_traits((enum llmq_dtype)t);
        const struct llmq_quant_traits *qt = llmq_quant_traits((enum llmq_dtype)t);
        if (!qt->to_float) continue;
        if (types) { // comma-separated filter
            const char *p = strstr(types, dt->name);
            size_t l = strlen(dt->name);
            if (!p || (p != types && p[-1] != ',') || (p[l] != '\0' && p[l] != ',')) continue;
        }
        const int64_t n = n_target / dt->blck * dt->blck;
        size_t bytes;
        if (!llmq_dtype_nbytes((enum llmq_dtype)t, n, &bytes)) return 1;
        unsigned char *src = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!src) return 1;
        fill((enum llmq_dtype)t, src, bytes, n);
        if (dump) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.bin", dump, dt->name);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(src, 1, bytes, f) != bytes || fclose(f) != 0) {
                perror(path);
                return 1;
            }
        }
        double tf = time_decode(qt->to_float, src, dst, n, reps);
        double tr = time_decode(qt->to_float_ref, src, dst, n, reps);
        double out_gb = (double)n * 4 / 1e9;
        printf("%s\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\n", dt->name, (double)bytes / 1048576.0,
               (double)n * 4 / 1048576.0, tf * 1e3, out_gb / tf, tr * 1e3, out_gb / tr);
        fflush(stdout);
        free(src);
    }
    free(dst);
    return 0;
}
