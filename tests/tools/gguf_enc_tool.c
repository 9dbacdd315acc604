// tests/tools/gguf_enc_tool.c — formats/ggml/encode.h on the command line, for the pytest oracles.
//
//   gguf_enc_tool TYPE IN.f32 NROWS N_PER_ROW OUT.bin [--imatrix IMP.f32] [--threads N] [--ref]
//
// Encodes NROWS rows of N_PER_ROW little-endian f32 (IN.f32 holds exactly NROWS * N_PER_ROW
// floats) into raw TYPE blocks (OUT.bin, NROWS * row size bytes). --imatrix: N_PER_ROW f32
// importance weights shared by every row; --threads: llmq_gguf_encode_rows with N threads
// (default 1); --ref: llmq_gguf_encode_row_ref row by row instead. TYPE is a dtype display name
// ("q4_k", case-insensitive). Exit status: 0 ok, 1 any error (message on stderr).
#include "common/dtype.h"
#include "common/status.h"
#include "formats/ggml/encode.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: gguf_enc_tool TYPE IN.f32 NROWS N_PER_ROW OUT.bin [--imatrix IMP.f32] [--threads N] "
                    "[--ref]\n");
    return 1;
}

// Exactly n floats from path into a malloc'd buffer, NULL (message printed) otherwise.
static float *read_f32(const char *path, int64_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    const long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (sz < 0 || (uint64_t)sz != (uint64_t)n * sizeof(float)) {
        fprintf(stderr, "%s: %ld bytes, expected %lld floats (%lld bytes)\n", path, sz, (long long)n, (long long)n * 4);
        fclose(f);
        return NULL;
    }
    float *buf = malloc((size_t)n * sizeof(float) + 1);
    if (!buf || fread(buf, sizeof(float), (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: read failed\n", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0) return 0;
    *out = v;
    return 1;
}

int main(int argc, char **argv) {
    const char *pos[5], *imatrix_path = NULL;
    int n_pos = 0, ref = 0;
    int64_t threads = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ref") == 0)
            ref = 1;
        else if (strcmp(argv[i], "--imatrix") == 0 && i + 1 < argc)
            imatrix_path = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            if (!parse_i64(argv[++i], &threads) || threads < 1 || threads > 1024) {
                fprintf(stderr, "--threads: bad value %s\n", argv[i]);
                return 1;
            }
        } else if (strncmp(argv[i], "--", 2) == 0) {
            fprintf(stderr, "unknown flag %s\n", argv[i]);
            return usage();
        } else if (n_pos < 5)
            pos[n_pos++] = argv[i];
        else
            return usage();
    }
    if (n_pos != 5) return usage();
    const enum llmq_dtype t = llmq_dtype_from_name(pos[0]);
    if (t == LLMQ_DTYPE_INVALID) {
        fprintf(stderr, "unknown type %s\n", pos[0]);
        return 1;
    }
    int64_t nrows, n_per_row, total;
    size_t row_bytes;
    if (!parse_i64(pos[2], &nrows) || !parse_i64(pos[3], &n_per_row) || !llmq_mul_i64(nrows, n_per_row, &total)) {
        fprintf(stderr, "bad shape %s x %s\n", pos[2], pos[3]);
        return 1;
    }
    if (!llmq_gguf_can_encode(t) || !llmq_dtype_nbytes(t, n_per_row, &row_bytes)) {
        // let the library name the problem
        enum llmq_status st = llmq_gguf_encode_row_ref(t, NULL, NULL, n_per_row, NULL);
        if (st == LLMQ_OK) fprintf(stderr, "cannot encode %s rows of %lld\n", pos[0], (long long)n_per_row);
        return 1;
    }
    float *src = read_f32(pos[1], total);
    float *imp = imatrix_path ? read_f32(imatrix_path, n_per_row) : NULL;
    unsigned char *dst = malloc(row_bytes * (size_t)nrows + 1);
    int rc = 1;
    if (!src || (imatrix_path && !imp) || !dst) goto done;
    enum llmq_status st = LLMQ_OK;
    if (ref) {
        for (int64_t r = 0; r < nrows && st == LLMQ_OK; r++)
            st = llmq_gguf_encode_row_ref(t, src + r * n_per_row, dst + (size_t)r * row_bytes, n_per_row, imp);
    } else {
        st = llmq_gguf_encode_rows(t, src, dst, nrows, n_per_row, imp, (int)threads);
    }
    if (st != LLMQ_OK) goto done; // the library logged the reason
    FILE *f = fopen(pos[4], "wb");
    const size_t out_len = row_bytes * (size_t)nrows;
    const int ok = f && fwrite(dst, 1, out_len, f) == out_len;
    if ((f && fclose(f) != 0) || !ok) {
        fprintf(stderr, "%s: write failed\n", pos[4]);
        goto done;
    }
    rc = 0;
done:
    free(src);
    free(imp);
    free(dst);
    return rc;
}
