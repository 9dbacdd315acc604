// tests/fuzz/fuzz_safetensors.c — a .safetensors file through llmq_st_open (header JSON, offsets, dtypes).
#include "formats/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct llmq_st_model *m = NULL;
    if (llmq_st_open(fuzz_write("model.safetensors", data, size), &m) == LLMQ_OK) llmq_st_free(m);
    return 0;
}
