// tests/fuzz/fuzz_imatrix.c — a llama.cpp imatrix (the legacy .dat, or GGUF: told apart by content) through
// llmq_calib_imatrix_load against stories260K, loaded once ($LLMQ_DATA/models/stories260K, else
// ../shared/datasets from the working directory).
#include "calib/calib.h"
#include "calib/model/model.h"
#include "fuzz.h"

static struct llmq_model *model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *data = getenv("LLMQ_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K/tinyllamas-stories-260k-f32.v3.gguf",
             data && *data ? data : "../shared/datasets");
    if (llmq_model_load(path, &model) != LLMQ_OK) {
        fprintf(stderr, "fuzz_imatrix: cannot load %s (set LLMQ_DATA)\n", path);
        abort();
    }
    llmq_log_set_level(LLMQ_LOG_SILENT);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct llmq_calib_stats s = {0};
    if (llmq_calib_imatrix_load(fuzz_write("in.imatrix", data, size), model, &s) == LLMQ_OK) llmq_calib_stats_free(&s);
    return 0;
}
