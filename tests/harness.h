/*
 * tests/harness.h — the ten-line test harness. A test is a main() calling CHECK*; the process
 * exits 1 on the first failed check (after printing file:line), 77 to tell ctest "skipped".
 */
#ifndef LLMQ_TEST_HARNESS_H
#define LLMQ_TEST_HARNESS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#endif
