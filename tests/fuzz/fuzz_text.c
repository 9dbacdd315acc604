// tests/fuzz/fuzz_text.c — a calibration text through llmq_calib_read_texts: the first byte picks the kind
// (.txt, .txt.gz, .jsonl, .jsonl.gz), the rest is the file (gzip streams, JSON lines, empty files).
#include "calib/calib.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *names[] = {"c.txt", "c.txt.gz", "c.jsonl", "c.jsonl.gz"};
    if (size < 1) return 0;
    char **texts = NULL, sha[65];
    int64_t n = 0;
    if (llmq_calib_read_texts(fuzz_write(names[data[0] & 3], data + 1, size - 1), &texts, &n, sha) == LLMQ_OK) {
        for (int64_t i = 0; i < n; i++) free(texts[i]);
        free(texts);
    }
    return 0;
}
