/*
 * tests/harness.h — the ten-line test harness. A test is a main() calling CHECK*; the process
 * exits 1 on the first failed check (after printing file:line), 77 to tell ctest "skipped". It brings
 * tests/util.h (the random streams) with it.
 */
#ifndef LLMQ_TEST_HARNESS_H
#define LLMQ_TEST_HARNESS_H
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/io.h"
#include "common/status.h"
#include "kernels/backend.h"
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
// CHECK that a call returns LLMQ_OK, printing the recorded error first otherwise (for tests that silence logging).
#define CHECK_OK(x)                                                                                                    \
    do {                                                                                                               \
        enum llmq_status s_ = (x);                                                                                     \
        if (s_ != LLMQ_OK) fprintf(stderr, "%s\n", llmq_last_error());                                                 \
        CHECK(s_ == LLMQ_OK);                                                                                          \
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
// models/stories260K/`name` (the stories260K test model's files) under test_data_dir(), into buf; returns buf.
static inline char *test_stories260k(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/models/stories260K/%s", test_data_dir(), name);
    return buf;
}
// A test that cannot run without `path` fails (exit 1, not a skip) when it is missing, naming it.
static inline void test_need_file(const char *path) {
    if (!llmq_file_exists(path)) {
        fprintf(stderr, "%s is missing (set LLMQ_DATA)\n", path);
        exit(1);
    }
}
// A gpu-labelled test without a usable CUDA device: exits 77 (ctest's skip), saying why.
static inline void test_need_cuda(void) {
    const char *why = NULL;
    if (llmq_cuda_device_count(&why) > 0) return;
    fprintf(stderr, "skipped: no CUDA device (%s)\n", why ? why : "?");
    exit(TEST_SKIP);
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

// Entries of directory `dir` other than . and .. (a failure to open it is a failed check).
static inline int test_count_entries(const char *dir) {
    DIR *d = opendir(dir);
    CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

// Whether files a and b both read (up to 1 GiB) and hold the same bytes.
static inline bool test_same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool same = llmq_read_file(a, 1u << 30, &x, &nx) == LLMQ_OK && llmq_read_file(b, 1u << 30, &y, &ny) == LLMQ_OK &&
                nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

// Removes `dir` and everything under it (rm -rf; a failure is a failed check): a test's temporary directory.
static inline void test_remove_tree(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
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
