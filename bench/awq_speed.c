/*
 * bench/awq_speed.c — wall time of the AWQ search (quant/awq.h) on one block of a real model.
 *
 *   bench_awq_speed MODEL TEXT [LAYER=3] [N_SEQ=16] [SEQLEN=512] [GROUP=64] [THREADS=2] [BITS=4]
 *
 * Tokenizes TEXT (the first N_SEQ * SEQLEN tokens), runs the fp model up to block LAYER, then prints
 * the time of the scale search and of the clip search, next to the peer measured in the same run:
 * one fp llmq_forward_block on the same tokens. The scale search costs about n_grid (20) x (attention
 * + MLP + down_proj) forwards, i.e. ~20 x 1.3 block forwards: its ratio to the peer shows how close
 * it runs to that floor. It also prints the block output MSE with RTN and with AWQ (AWQ grid).
 * The search runs twice: with the single-linear groups' loss from their outputs (gram_loss 0, what
 * AutoAWQ computes) and with llmq's default (the Gram form when it is cheaper); it prints both scale
 * search times, their ratio, and whether every group chose the same ratio.
 */
#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "quant/awq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double block_mse(struct llmq_model *m, struct llmq_forward *f, struct llmq_awq_block *b, const float *x,
                        const float *ref, int64_t n_seq, int64_t seqlen, int bits, int group) {
    const int64_t N = n_seq * seqlen, D = m->hp.n_embd;
    for (int l = 0; l < LLMQ_LIN_COUNT; l++)
        llmq_awq_pseudo_quantize(b->w[l], m->layers[b->layer].w[l]->shape[0], m->layers[b->layer].w[l]->shape[1], bits,
                                 group, b->w[l]);
    float *y = malloc((size_t)(N * D) * sizeof(float));
    if (!y) return -1;
    memcpy(y, x, (size_t)(N * D) * sizeof(float));
    double e = -1;
    if (llmq_forward_block(f, b->layer, &b->ly, y, n_seq, seqlen, NULL, NULL) == LLMQ_OK) {
        e = 0;
        for (int64_t i = 0; i < N * D; i++) e += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        e /= (double)(N * D);
    }
    free(y);
    return e;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL TEXT [LAYER=3] [N_SEQ=16] [SEQLEN=512] [GROUP=64] [THREADS=2] [BITS=4]\n",
                argv[0]);
        return 2;
    }
    const int layer = argc > 3 ? atoi(argv[3]) : 3;
    const int64_t n_seq = argc > 4 ? atoll(argv[4]) : 16, seqlen = argc > 5 ? atoll(argv[5]) : 512;
    const int group = argc > 6 ? atoi(argv[6]) : 64, threads = argc > 7 ? atoi(argv[7]) : 2;
    const int bits = argc > 8 ? atoi(argv[8]) : 4;
    const int64_t N = n_seq * seqlen;
    struct llmq_model *m = NULL;
    struct llmq_forward *f = NULL;
    struct llmq_awq_block *b = NULL, *rtn = NULL;
    char *text = NULL;
    size_t size = 0;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    if (llmq_read_file(argv[2], 1u << 30, &text, &size) != LLMQ_OK || llmq_model_load(argv[1], &m) != LLMQ_OK) return 1;
    if (llmq_tokenize(m->tok, text, size, false, false, &ids, &n_ids) != LLMQ_OK || n_ids < N) {
        fprintf(stderr, "%s: %lld tokens, need %lld\n", argv[2], (long long)n_ids, (long long)N);
        return 1;
    }
    const int64_t D = m->hp.n_embd;
    float *x = malloc((size_t)(N * D) * sizeof(float)), *ref = malloc((size_t)(N * D) * sizeof(float));
    if (!x || !ref || llmq_forward_init(m, N, threads, &f) != LLMQ_OK || llmq_forward_embed(f, ids, N, x) != LLMQ_OK)
        return 1;
    for (int l = 0; l < layer; l++)
        if (llmq_forward_block(f, l, &m->layers[l], x, n_seq, seqlen, NULL, NULL) != LLMQ_OK) return 1;
    memcpy(ref, x, (size_t)(N * D) * sizeof(float));
    double t0 = now();
    if (llmq_forward_block(f, layer, &m->layers[layer], ref, n_seq, seqlen, NULL, NULL) != LLMQ_OK) return 1;
    const double t_block = now() - t0;

    struct llmq_awq_opts o;
    llmq_awq_opts_default(&o);
    o.group_size = group;
    o.bits = bits;
    o.n_threads = threads;
    struct llmq_awq_block *b_out = NULL;
    struct llmq_awq_opts o_out = o;
    o_out.gram_loss = 0;
    o_out.clip = false;
    if (llmq_awq_block_init(m, layer, threads, &b_out) != LLMQ_OK) return 1;
    if (llmq_awq_search(b_out, f, x, n_seq, seqlen, &o_out) != LLMQ_OK) return 1;
    if (llmq_awq_block_init(m, layer, threads, &b) != LLMQ_OK) return 1;
    t0 = now();
    if (llmq_awq_search(b, f, x, n_seq, seqlen, &o) != LLMQ_OK) return 1;
    const double t_awq = now() - t0;
    int same = 1;
    for (int g = 0; g < b->n_groups; g++) same &= b->groups[g].best == b_out->groups[g].best;
    if (llmq_awq_block_init(m, layer, threads, &rtn) != LLMQ_OK) return 1;
    const double e_rtn = block_mse(m, f, rtn, x, ref, n_seq, seqlen, bits, group);
    const double e_awq = block_mse(m, f, b, x, ref, n_seq, seqlen, bits, group);

    printf("model %s, layer %d, %lld tokens (%lld x %lld), %d-bit g%d, %d threads\n", argv[1], layer, (long long)N,
           (long long)n_seq, (long long)seqlen, bits, group, threads);
    printf("peer: fp block forward       %8.3f s\n", t_block);
    printf("awq: scale search, losses from outputs (gram_loss 0) %8.3f s  (%.1f x the block forward)\n",
           b_out->seconds_scale, b_out->seconds_scale / t_block);
    printf("awq: scale search, default (Gram form when cheaper)  %8.3f s  (%.1f x; %.2f x faster; same ratios: %s)\n",
           b->seconds_scale, b->seconds_scale / t_block, b_out->seconds_scale / b->seconds_scale, same ? "yes" : "NO");
    printf("awq: clip search             %8.3f s\n", b->seconds_clip);
    printf("awq: total                   %8.3f s\n", t_awq);
    printf("block output MSE: RTN %.6g, AWQ %.6g (%.1f%%)\n", e_rtn, e_awq, 100.0 * e_awq / e_rtn);
    llmq_awq_block_free(b);
    llmq_awq_block_free(b_out);
    llmq_awq_block_free(rtn);
    llmq_forward_free(f);
    llmq_model_free(m);
    free(x);
    free(ref);
    free(ids);
    free(text);
    return 0;
}
