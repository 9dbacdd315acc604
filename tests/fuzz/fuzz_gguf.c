// tests/fuzz/fuzz_gguf.c — a GGUF file through the reader and the model loader (hyper-parameters, tensor
// names and shapes, the GGUF tokenizer).
#include "calib/model/model.h"
#include "formats/gguf.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_write("in.gguf", data, size);
    struct llmq_gguf *g = NULL;
    if (llmq_gguf_open(p, &g) == LLMQ_OK) {
        for (int64_t i = 0; i < llmq_gguf_n_kv(g); i++) (void)llmq_gguf_kv_at(g, i);
        llmq_gguf_free(g);
        struct llmq_model *m = NULL;
        if (llmq_model_load(p, &m) == LLMQ_OK) llmq_model_free(m);
    }
    return 0;
}
