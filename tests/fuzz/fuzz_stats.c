// tests/fuzz/fuzz_stats.c — an llmq statistics file (.lcs, calib/calib.h) through its loader.
#include "calib/calib.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct llmq_calib_stats s = {0};
    if (llmq_calib_stats_load(fuzz_write("in.lcs", data, size), &s) == LLMQ_OK) llmq_calib_stats_free(&s);
    return 0;
}
