/*
 * tests/harness.h — the ten-line test harness. A test is a main() calling CHECK*; the process
 * exits 1 on the first failed check (after printing file:line), 77 to tell ctest "skipped". It brings
 * tests/util.h (the random streams) with it.
 */
#ifndef LLMQ_TEST_HARNESS_H
#define LLMQ_TEST_HARNESS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define TEST_SKIP 77
#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        if (!(x)) {                                                                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x);                                      \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define CHECK_EQ_INT(a, b)                                                                                             \
    do {                                                                                                               \
        long long a_ = (long long)(a), b_ = (long long)(b);                                                            \
        if (a_ != b_) {                                                                                                \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, #a, a_, #b, b_);           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define CHECK_CONTAINS(hay, needle)                                                                                    \
    do {                                                                                                               \
        const char *h_ = (hay);                                                                                        \
        if (!h_ || !strstr(h_, (needle))) {                                                                            \
            fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, h_ ? h_ : "(null)",         \
                    (needle));                                                                                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

// Directory of the shared datasets ($LLMQ_DATA, else ../shared/datasets from the source tree).
static inline const char *test_data_dir(void) {
    const char *d = getenv("LLMQ_DATA");
    return d && *d ? d : "../shared/datasets";
}
// `dir`/`name` in one of 8 rotating static buffers (valid until 8 more calls): a test's temp-file names.
static inline char *test_path(const char *dir, const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof(buf[0]), "%s/%s", dir, name);
    return p;
}

// Writes n bytes of data to path; a failure is a failed check.
static inline void test_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

// X (N, C) = Z·B + 0.3·noise with Z (N, 8) and B (8, C) uniform in [-1, 1) from *s: calibration inputs whose
// columns are strongly correlated (rank 8 plus noise), as a real layer's are. Draws B, then per row z and
// the noise.
static inline void test_correlated_x(uint64_t *s, int64_t N, int64_t C, float *X) {
    float *B = malloc((size_t)(8 * C) * sizeof *B);
    CHECK(B);
    for (int64_t i = 0; i < 8 * C; i++) B[i] = test_frand(s);
    for (int64_t n = 0; n < N; n++) {
        float z[8];
        for (int k = 0; k < 8; k++) z[k] = test_frand(s);
        for (int64_t c = 0; c < C; c++) {
            float v = 0.3f * test_frand(s);
            for (int k = 0; k < 8; k++) v += z[k] * B[k * C + c];
            X[n * C + c] = v;
        }
    }
    free(B);
}
#endif
