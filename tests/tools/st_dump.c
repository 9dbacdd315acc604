// tests/tools/st_dump.c — what formats/safetensors.h reads, on stdout, for the pytest oracles.
//
//   st_dump PATH              one line per shard, metadata pair and tensor (tab-separated):
//                               shard  <index> <file name> <n_tensors> <data_start> <file_size>
//                               meta   <key> <value>
//                               tensor <name> <DTYPE> <d0,d1,...> <nbytes> <shard> <fnv1a64 hex>
//   st_dump --raw PATH NAME   the raw bytes of tensor NAME
//
// PATH is anything llmq_st_open accepts (file, index.json, directory). The checksum is 64-bit FNV-1a
// over the tensor's bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
// Exit status: 0 ok, 1 library error ("status: <name>" on stderr after the error line), 2 usage.
#include "common/status.h"
#include "common/tensor.h"
#include "formats/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv) {
    bool raw = argc == 4 && strcmp(argv[1], "--raw") == 0;
    if (!(argc == 2 && argv[1][0] != '-') && !raw) {
        fprintf(stderr, "usage: st_dump PATH\n       st_dump --raw PATH NAME\n");
        return 2;
    }
    struct llmq_st_model *m = NULL;
    enum llmq_status st = llmq_st_open(argv[raw ? 2 : 1], &m);
    if (st) {
        fprintf(stderr, "status: %s\n", llmq_status_name(st));
        return 1;
    }
    int rc = 0;
    if (raw) {
        const struct llmq_tensor_view *t = llmq_st_get(m, argv[3]);
        if (!t) {
            fprintf(stderr, "st_dump: no tensor '%s'\nstatus: %s\n", argv[3], llmq_status_name(LLMQ_ERR_NOT_FOUND));
            rc = 1;
        } else if (t->nbytes && fwrite(t->data, 1, t->nbytes, stdout) != t->nbytes) {
            rc = 1;
        }
        llmq_st_free(m);
        return rc;
    }
    for (int s = 0; s < llmq_st_n_shards(m); s++) {
        const struct llmq_st_shard_info *sh = llmq_st_shard(m, s);
        printf("shard\t%d\t%s\t%" PRId64 "\t%" PRIu64 "\t%" PRIu64 "\n", s, sh->file_name, sh->n_tensors,
               sh->data_start, sh->file_size);
    }
    for (int64_t i = 0; i < llmq_st_n_metadata(m); i++)
        printf("meta\t%s\t%s\n", llmq_st_metadata_key(m, i), llmq_st_metadata_value(m, i));
    for (int64_t i = 0; i < llmq_st_n_tensors(m); i++) {
        const struct llmq_tensor_view *t = llmq_st_tensor(m, i);
        printf("tensor\t%s\t%s\t", t->name, llmq_dtype_traits(t->dtype)->st_name);
        for (int d = 0; d < t->n_dims; d++) printf(d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
        printf("\t%zu\t%d\t%016" PRIx64 "\n", t->nbytes, llmq_st_tensor_shard(m, i), fnv1a64(t->data, t->nbytes));
    }
    llmq_st_free(m);
    return 0;
}
