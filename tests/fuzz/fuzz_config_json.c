// tests/fuzz/fuzz_config_json.c — config.json through the HF hyper-parameter reader (architectures, sizes,
// RoPE scaling, quantization_config).
#include "formats/hf/hfdir.h"
#include "fuzz.h"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("config.json", data, size);
    json_t *cfg = NULL;
    struct llmq_hparams hp;
    (void)llmq_hf_hparams_from_dir(fuzz_dir(), &cfg, &hp);
    json_decref(cfg); // the caller's even on failure (as formats/hf callers treat it)
    return 0;
}
