/*
 * tests/tools/forward_logits.c — llmq_forward_logits on the command line, for the pytest oracles.
 *
 *   forward_logits MODEL IDS_FILE OUT_FILE [THREADS=2] [FIRST=0] [EMULATE=none] [ROPE_CTX=0]
 *
 * IDS_FILE holds whitespace-separated token ids (one sequence, prefilled from position 0).
 * OUT_FILE receives the logits of positions [FIRST, n) as raw little-endian float32,
 * ((n - FIRST), n_vocab) row-major. EMULATE names a calib/model/actq.h mode (llamacpp-cpu, ...). Prints "n_tokens
 * n_vocab" on stdout. ROPE_CTX > 0: LongRoPE picks its factors by that context, as llama.cpp's n_ctx
 * (llmq_forward_set_rope_ctx); 0: by the sequence's length, as transformers. Exit 1 on error.
 */
#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "common/io.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL IDS_FILE OUT_FILE [THREADS=2] [FIRST=0] [EMULATE=none] [ROPE_CTX=0]\n",
                argv[0]);
        return 2;
    }
    int threads = argc > 4 ? atoi(argv[4]) : 2;
    int64_t first = argc > 5 ? atoll(argv[5]) : 0, rope_ctx = argc > 7 ? atoll(argv[7]) : 0;
    enum llmq_emulate emulate = LLMQ_EMULATE_NONE;
    if (argc > 6 && !llmq_emulate_from_name(argv[6], &emulate)) {
        fprintf(stderr, "%s: unknown emulation mode\n", argv[6]);
        return 2;
    }
    char *text = NULL;
    size_t size = 0;
    int32_t *ids = NULL;
    int64_t n = 0, cap = 0;
    float *logits = NULL;
    struct llmq_model *m = NULL;
    struct llmq_forward *f = NULL;
    int rc = 1;
    if (llmq_read_file(argv[2], 1u << 28, &text, &size) != LLMQ_OK) goto done;
    for (char *p = text, *e;; p = e) {
        long v = strtol(p, &e, 10);
        if (e == p) break;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            int32_t *ni = realloc(ids, (size_t)cap * sizeof(int32_t));
            if (!ni) goto done;
            ids = ni;
        }
        ids[n++] = (int32_t)v;
    }
    if (n == 0 || first < 0 || first >= n) {
        fprintf(stderr, "%s: no token ids, or FIRST out of range\n", argv[2]);
        goto done;
    }
    if (llmq_model_load(argv[1], &m) != LLMQ_OK) goto done;
    if (llmq_forward_init(m, n, threads, &f) != LLMQ_OK || llmq_forward_set_emulate(f, emulate) != LLMQ_OK ||
        llmq_forward_set_rope_ctx(f, rope_ctx) != LLMQ_OK)
        goto done;
    logits = malloc((size_t)((n - first) * m->hp.n_vocab) * sizeof(float));
    if (!logits) goto done;
    if (llmq_forward_logits(f, ids, n, first, logits) != LLMQ_OK) goto done;
    if (test_save(argv[3], logits, (size_t)((n - first) * m->hp.n_vocab) * sizeof(float))) goto done;
    printf("%lld %lld\n", (long long)n, (long long)m->hp.n_vocab);
    rc = 0;
done:
    free(logits);
    free(ids);
    free(text);
    llmq_forward_free(f);
    llmq_model_free(m);
    return rc;
}
