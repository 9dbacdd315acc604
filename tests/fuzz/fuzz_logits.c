// tests/fuzz/fuzz_logits.c — a --save-logits file (calib/eval/eval.h) through llmq_logits_open and a read.
#include "calib/eval/eval.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct llmq_logits_file *f = NULL;
    if (llmq_logits_open(fuzz_write("in.logits", data, size), &f) == LLMQ_OK) {
        const struct llmq_logits_header *h = llmq_logits_header(f);
        if (h->n_chunks > 0 && h->n_rows > 0 && h->n_vocab > 0 && h->n_vocab < (1 << 20)) {
            float *row = malloc((size_t)h->n_vocab * sizeof(float));
            if (row) (void)llmq_logits_read(f, 0, 0, 1, row);
            free(row);
        }
        llmq_logits_close(f);
    }
    return 0;
}
