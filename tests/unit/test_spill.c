// tests/unit/test_spill.c — common/spill.h: the --max-memory budget, spill files, size parsing.
#include "harness.h"

#include <stdint.h>

#include "common/log.h"
#include "common/spill.h"

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    uint64_t b = 0;
    CHECK(llmq_parse_bytes("123", &b) && b == 123);
    CHECK(llmq_parse_bytes("4K", &b) && b == 4096);
    CHECK(llmq_parse_bytes("512M", &b) && b == 512ull << 20);
    CHECK(llmq_parse_bytes("1.5G", &b) && b == 3ull << 29);
    CHECK(llmq_parse_bytes("8GiB", &b) && b == 8ull << 30);
    CHECK(llmq_parse_bytes("2TB", &b) && b == 2ull << 40);
    b = 7;
    CHECK(!llmq_parse_bytes("", &b) && !llmq_parse_bytes("G", &b) && !llmq_parse_bytes("-1M", &b));
    CHECK(!llmq_parse_bytes("12Q", &b) && !llmq_parse_bytes("1M extra", &b) && b == 7);

    // unlimited: heap
    llmq_spill_configure(0);
    float *a = llmq_big_alloc(1 << 20, "test a");
    CHECK(a && ((uintptr_t)a & 63) == 0 && llmq_spill_ram_bytes() == 1 << 20 && llmq_spill_file_bytes() == 0);
    // a budget of 1.5 MiB: the next 1 MiB goes to a file, a small one still fits in RAM
    llmq_spill_configure(3 << 19);
    float *c = llmq_big_alloc(1 << 20, "test c");
    CHECK(c && ((uintptr_t)c & 63) == 0 && llmq_spill_file_bytes() == 1 << 20);
    float *d = llmq_big_alloc(1 << 18, "test d");
    CHECK(d && llmq_spill_ram_bytes() == (1 << 20) + (1 << 18) && llmq_spill_file_bytes() == 1 << 20);
    for (int i = 0; i < (1 << 18); i++) c[i] = (float)i, a[i] = -(float)i;
    for (int i = 0; i < (1 << 18); i++) CHECK(c[i] == (float)i && a[i] == -(float)i);
    llmq_big_free(c);
    CHECK(llmq_spill_file_bytes() == 0 && llmq_spill_peak_file_bytes() == 1 << 20);
    llmq_big_free(a);
    llmq_big_free(d);
    llmq_big_free(NULL);
    CHECK(llmq_spill_ram_bytes() == 0);
    // an unusable spill directory: the allocation beyond the budget fails cleanly
    setenv("LLMQ_SPILL_DIR", "/nonexistent/llmq", 1);
    llmq_spill_configure(1);
    CHECK(llmq_big_alloc(4096, "test e") == NULL);
    unsetenv("LLMQ_SPILL_DIR");
    printf("test_spill: ok\n");
    return 0;
}
