/*
 * tests/util.h — helpers with no test harness attached (they return values, they never exit), shared by
 * the unit tests (through harness.h), the helper programs in tests/tools/ and the benchmarks in bench/:
 *   - the deterministic random streams every test and benchmark draws its inputs from. Each caller keeps
 *     its own state (any non-zero seed), so that one test's inputs do not depend on another's draws;
 *   - writing a raw buffer to a file (test_save, test_write_raw: PREFIX.EXT), the layout the pytest oracles and
 *     bench scripts read back.
 */
#ifndef LLMQ_TEST_UTIL_H
#define LLMQ_TEST_UTIL_H
#include <stdint.h>
#include <stdio.h>

// xorshift64, shifts (13, 7, 17) (Marsaglia, "Xorshift RNGs", 2003): advances *s, returns the new state.
static inline uint64_t test_xorshift64(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

// xorshift64*, shifts (12, 25, 27) and multiplier 0x2545F4914F6CDD1D (Vigna 2016): advances *s, returns the
// scrambled output (its high bits are the good ones).
static inline uint64_t test_xorshift64s(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

// Uniform in [-1, 1) on a grid of 2^-23 (the top 24 bits of test_xorshift64: exact in float).
static inline float test_frand(uint64_t *s) { return (float)((test_xorshift64(s) >> 40) * (1.0 / (1 << 23))) - 1.0f; }

// Writes n bytes of p to `path`; 0 on success, 1 after one line on stderr naming the path when the file cannot be
// opened, written or closed.
static inline int test_save(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "%s: cannot open for writing\n", path);
        return 1;
    }
    int bad = fwrite(p, 1, n, f) != n;
    if ((fclose(f) != 0) | bad) {
        fprintf(stderr, "%s: write failed\n", path);
        return 1;
    }
    return 0;
}

// test_save into PREFIX.EXT (the raw files of the GPTQ tool and benchmark).
static inline int test_write_raw(const char *prefix, const char *ext, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, ext);
    return test_save(path, p, n);
}
#endif
