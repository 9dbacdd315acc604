// tests/fuzz/fuzz_tokenizer_json.c — tokenizer.json through the HF tokenizer loader, then a tokenization.
#include "calib/tokenizer/tokenizer.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("tokenizer.json", data, size);
    struct llmq_tokenizer *t = NULL;
    if (llmq_tokenizer_load_hf(fuzz_dir(), &t) == LLMQ_OK) {
        static const char text[] = "Hello world, 123 <s> \xc3\xa9t\xc3\xa9\n  end";
        int32_t *ids = NULL;
        int64_t n = 0;
        if (llmq_tokenize(t, text, sizeof text - 1, true, false, &ids, &n) == LLMQ_OK) free(ids);
        llmq_tokenizer_free(t);
    }
    return 0;
}
