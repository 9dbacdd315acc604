// bench/tokenize_speed.c — llmq's tokenizer throughput: tokenizes FILE whole, REPS times, with
// add_special (as llama-perplexity does), and prints the median tokens/s. bench/tokenize_speed.sh
// runs it next to llama.cpp's tokenizer (llama-cpp-python) on the same files.
//
//   bench_tokenize_speed MODEL.gguf|HF_DIR FILE [REPS (7)]
// stdout: "<n_tokens> <median seconds> <median tokens/s> <load seconds>"
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "formats/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenize_speed MODEL.gguf|HF_DIR FILE [REPS (7)]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 7;
    if (reps < 1 || reps > 1000) reps = 7;
    struct llmq_gguf *g = NULL;
    struct llmq_tokenizer *t = NULL;
    char *text = NULL;
    size_t n = 0;
    double t0 = llmq_now_s();
    if (llmq_is_dir(argv[1]) ? llmq_tokenizer_load_hf(argv[1], &t) != LLMQ_OK
                             : (llmq_gguf_open(argv[1], &g) != LLMQ_OK || llmq_tokenizer_load_gguf(g, &t) != LLMQ_OK))
        return 1;
    double load = llmq_now_s() - t0;
    if (llmq_read_file(argv[2], (size_t)1 << 31, &text, &n) != LLMQ_OK) return 1;
    double *secs = malloc((size_t)reps * sizeof(double));
    int64_t n_ids = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids = NULL;
        t0 = llmq_now_s();
        if (llmq_tokenize(t, text, n, true, false, &ids, &n_ids) != LLMQ_OK) return 1;
        secs[r] = llmq_now_s() - t0;
        free(ids);
    }
    qsort(secs, (size_t)reps, sizeof(double), cmp_double);
    double med = secs[reps / 2];
    printf("%lld %.4f %.0f %.4f\n", (long long)n_ids, med, (double)n_ids / med, load);
    free(secs);
    free(text);
    llmq_tokenizer_free(t);
    llmq_gguf_free(g);
    return 0;
}
