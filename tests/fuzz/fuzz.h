/*
 * tests/fuzz/fuzz.h — the shared part of the libFuzzer harnesses (built with -DLLMQ_FUZZ=ON and clang;
 * see tests/fuzz/README.md). llmq's readers take paths, so each input is written to a file in a private
 * temporary directory first; logging is silenced (a refusal is the expected outcome of most inputs).
 */
#ifndef LLMQ_TESTS_FUZZ_H
#define LLMQ_TESTS_FUZZ_H

#include "common/io.h"
#include "common/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The private directory (created once per process) and path = dir/name holding data (size bytes).
static inline const char *fuzz_write(const char *name, const uint8_t *data, size_t size) {
    static char dir[64], path[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/llmq-fuzz-XXXXXX");
        if (!mkdtemp(dir)) abort();
        llmq_log_set_level(LLMQ_LOG_SILENT);
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
    return path;
}

// The directory fuzz_write writes into (after a first call).
static inline const char *fuzz_dir(void) {
    static char d[256];
    const char *p = fuzz_write(".probe", (const uint8_t *)"", 0);
    snprintf(d, sizeof d, "%s", p);
    *strrchr(d, '/') = '\0';
    return d;
}

#endif // LLMQ_TESTS_FUZZ_H
