// tests/fuzz/fuzz_st_index.c — a sharded checkpoint's model.safetensors.index.json through llmq_st_open on
// its directory, next to two fixed small shards (the index is what varies: names, shard references,
// metadata).
#include "formats/safetensors.h"
#include "fuzz.h"

// A one-tensor safetensors file: "w" F32 [2] = {1, 2}.
static void write_shard(const char *name, const char *tensor) {
    char hdr[128];
    int n = snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", tensor);
    uint8_t buf[256];
    uint64_t len = (uint64_t)n;
    memcpy(buf, &len, 8);
    memcpy(buf + 8, hdr, (size_t)n);
    const float v[2] = {1, 2};
    memcpy(buf + 8 + n, v, 8);
    fuzz_write(name, buf, 16 + (size_t)n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int shards_written;
    if (!shards_written) {
        write_shard("model-00001-of-00002.safetensors", "a.weight");
        write_shard("model-00002-of-00002.safetensors", "b.weight");
        shards_written = 1;
    }
    fuzz_write(LLMQ_ST_INDEX_NAME, data, size);
    struct llmq_st_model *m = NULL;
    if (llmq_st_open(fuzz_dir(), &m) == LLMQ_OK) llmq_st_free(m);
    return 0;
}
