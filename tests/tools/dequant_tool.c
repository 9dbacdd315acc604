// tests/tools/dequant_tool.c — formats/ggml/quants.h on the command line, for the pytest oracles.
//
//   dequant_tool [--ref] [--misalign] TYPE IN.bin OUT.f32   raw blocks -> raw little-endian f32
//   dequant_tool --encode TYPE IN.f32 OUT.bin               raw f32 -> TYPE (types with from_float)
//   dequant_tool --table [--tsv]                            the dtype table (JSON array, or TSV)
//
// --ref decodes with the plain-C reference decoders; --misalign hands the library a source buffer
// at an odd address (exercises the bounce-buffer path). TYPE is a dtype display name ("q4_k").
// Exit status: 0 ok, 1 library error (message on stderr), 2 usage / file error.
#include "common/dtype.h"
#include "common/status.h"
#include "formats/ggml/quants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: dequant_tool [--ref] [--misalign] TYPE IN.bin OUT.f32\n"
                    "       dequant_tool --encode TYPE IN.f32 OUT.bin\n"
                    "       dequant_tool --table [--tsv]\n");
    return 2;
}

// Whole file into a malloc'd buffer placed `pad` bytes past a malloc'd (aligned) start.
static unsigned char *read_file(const char *path, size_t pad, size_t *len, unsigned char **base) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    *base = malloc((size_t)sz + pad + 1);
    if (!*base || fread(*base + pad, 1, (size_t)sz, f) != (size_t)sz) {
        fprintf(stderr, "%s: read failed\n", path);
        fclose(f);
        free(*base);
        return NULL;
    }
    fclose(f);
    *len = (size_t)sz;
    return *base + pad;
}

static int write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        return 2;
    }
    return 0;
}

static int print_table(int tsv) {
    if (tsv)
        printf("name\tggml_id\tblck\tsize\tcan_dequant\n");
    else
        printf("[\n");
    for (int t = 0; t < LLMQ_DTYPE_COUNT; t++) {
        const struct llmq_dtype_traits *d = llmq_dtype_traits((enum llmq_dtype)t);
        if (tsv)
            printf("%s\t%d\t%lld\t%zu\t%d\n", d->name, d->ggml_id, (long long)d->blck, d->size, d->can_dequant);
        else
            printf("  {\"name\": \"%s\", \"ggml_id\": %d, \"blck\": %lld, \"size\": %zu, \"can_dequant\": %s}%s\n",
                   d->name, d->ggml_id, (long long)d->blck, d->size, d->can_dequant ? "true" : "false",
                   t + 1 < LLMQ_DTYPE_COUNT ? "," : "");
    }
    if (!tsv) printf("]\n");
    return 0;
}

int main(int argc, char **argv) {
    int ref = 0, misalign = 0, encode = 0, i = 1;
    if (argc >= 2 && strcmp(argv[1], "--table") == 0) return print_table(argc >= 3 && strcmp(argv[2], "--tsv") == 0);
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--ref") == 0)
            ref = 1;
        else if (strcmp(argv[i], "--misalign") == 0)
            misalign = 1;
        else if (strcmp(argv[i], "--encode") == 0)
            encode = 1;
        else {
            fprintf(stderr, "unknown flag %s\n", argv[i]);
            return usage();
        }
    }
    if (argc - i != 3) return usage();
    enum llmq_dtype t = llmq_dtype_from_name(argv[i]);
    if (t == LLMQ_DTYPE_INVALID) {
        fprintf(stderr, "unknown type %s\n", argv[i]);
        return 2;
    }
    const struct llmq_dtype_traits *dt = llmq_dtype_traits(t);

    size_t len;
    unsigned char *base = NULL;
    unsigned char *in = read_file(argv[i + 1], misalign ? 1 : 0, &len, &base);
    if (!in) return 2;
    int rc = 0;
    if (encode) {
        const struct llmq_quant_traits *qt = llmq_quant_traits(t);
        if (!qt->from_float) {
            fprintf(stderr, "no encoder for %s\n", dt->name);
            free(base);
            return 1;
        }
        int64_t n = (int64_t)(len / sizeof(float));
        size_t out_len;
        if (len % sizeof(float) || !llmq_dtype_nbytes(t, n, &out_len)) {
            fprintf(stderr, "%s: %zu bytes is not a whole number of %s blocks\n", argv[i + 1], len, dt->name);
            free(base);
            return 1;
        }
        void *out = malloc(out_len + 1);
        qt->from_float((const float *)in, out, n, NULL);
        rc = write_file(argv[i + 2], out, out_len);
        free(out);
    } else {
        if (len % dt->size) {
            fprintf(stderr, "%s: %zu bytes is not a whole number of %s blocks (%zu bytes)\n", argv[i + 1], len,
                    dt->name, dt->size);
            free(base);
            return 1;
        }
        int64_t n = (int64_t)(len / dt->size) * dt->blck;
        float *out = malloc((size_t)n * sizeof(float) + 1);
        enum llmq_status st = ref ? llmq_dequantize_row_ref(t, in, out, n) : llmq_dequantize_row(t, in, out, n);
        if (st != LLMQ_OK)
            rc = 1;
        else
            rc = write_file(argv[i + 2], out, (size_t)n * sizeof(float));
        free(out);
    }
    free(base);
    return rc;
}
