/*
 * tests/tools/awq_tool.c — llmq_awq_search on one block of a real model, for the numpy oracle
 * (tests/py/test_awq_oracle.py).
 *
 *   awq_tool MODEL TEXT OUT_DIR LAYER N_SEQ SEQLEN GROUP [BITS=4] [THREADS=2] [N_SAMPLE_TOKEN=512]
 *
 * Tokenizes TEXT (the first N_SEQ * SEQLEN tokens, no BOS), runs the full-precision model up to
 * block LAYER and the AWQ search on it. Writes into OUT_DIR (raw little-endian float32, row-major):
 *   x.f32                  (N, D) the block's fp input
 *   n1.f32, att.f32, n2.f32, act.f32  (N, D), (N, Dq), (N, D), (N, F) the fp inputs of q/k/v, o,
 *                          gate/up and down (the hook of llmq_forward_block, as the search sees them)
 *   scales_<prev>.f32      (C) chosen scales per scale group (prev = attn_norm | v | ffn_norm | up)
 *   clip_<lin>.f32         (R, NG) clip thresholds (lin = v | o | gate | up | down)
 *   w_<lin>.f32            (R, C) the block's weights after scaling and clipping (all 7)
 *   attn_norm.f32, ffn_norm.f32 (D) folded norms
 *   result.json            {"N", "D", "groups": [{"prev", "best", "ratio", "loss": [...]}],
 *                           "clip_err": {lin: sum}, "seconds_scale", "seconds_clip"}
 * Exit 1 on error.
 */
#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "quant/awq.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prev_name(enum llmq_awq_prev p) {
    return p == LLMQ_AWQ_PREV_ATTN_NORM  ? "attn_norm"
           : p == LLMQ_AWQ_PREV_V        ? "v"
           : p == LLMQ_AWQ_PREV_FFN_NORM ? "ffn_norm"
                                         : "up";
}

struct cap {
    float *p[4]; // n1, att, n2, act
};

static void hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    (void)layer;
    struct cap *c = user;
    int i = which == LLMQ_LIN_Q ? 0 : which == LLMQ_LIN_O ? 1 : which == LLMQ_LIN_GATE ? 2 : 3;
    c->p[i] = malloc((size_t)(n * n_in) * sizeof(float));
    if (c->p[i]) memcpy(c->p[i], in, (size_t)(n * n_in) * sizeof(float));
}

static int dump(const char *dir, const char *name, const float *p, int64_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return test_save(path, p, (size_t)n * sizeof(float));
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr,
                "usage: %s MODEL TEXT OUT_DIR LAYER N_SEQ SEQLEN GROUP [BITS=4] [THREADS=2] [N_SAMPLE_TOKEN=512]\n",
                argv[0]);
        return 2;
    }
    const char *out_dir = argv[3];
    const int layer = atoi(argv[4]);
    const int64_t n_seq = atoll(argv[5]), seqlen = atoll(argv[6]), N = n_seq * seqlen;
    struct llmq_awq_opts o;
    llmq_awq_opts_default(&o);
    o.group_size = atoi(argv[7]);
    if (argc > 8) o.bits = atoi(argv[8]);
    const int threads = argc > 9 ? atoi(argv[9]) : 2;
    if (argc > 10) o.n_sample_token = atoll(argv[10]);
    o.n_threads = threads;

    char *text = NULL;
    size_t size = 0;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    float *x = NULL, *h = NULL;
    struct cap cap = {{NULL}};
    struct llmq_model *m = NULL;
    struct llmq_forward *f = NULL;
    struct llmq_awq_block *b = NULL;
    FILE *js = NULL;
    int rc = 1;
    if (llmq_read_file(argv[2], 1u << 28, &text, &size) != LLMQ_OK) goto done;
    if (llmq_model_load(argv[1], &m) != LLMQ_OK) goto done;
    if (layer < 0 || layer >= m->hp.n_layer || n_seq < 1 || seqlen < 1) {
        fprintf(stderr, "bad LAYER / N_SEQ / SEQLEN\n");
        goto done;
    }
    if (llmq_tokenize(m->tok, text, size, false, false, &ids, &n_ids) != LLMQ_OK) goto done;
    if (n_ids < N) {
        fprintf(stderr, "%s: %lld tokens, need %lld\n", argv[2], (long long)n_ids, (long long)N);
        goto done;
    }
    const int64_t D = m->hp.n_embd;
    if (!(x = malloc((size_t)(N * D) * sizeof(float)))) goto done;
    if (llmq_forward_init(m, N, threads, &f) != LLMQ_OK) goto done;
    if (llmq_forward_embed(f, ids, N, x) != LLMQ_OK) goto done;
    for (int l = 0; l < layer; l++)
        if (llmq_forward_block(f, l, &m->layers[l], x, n_seq, seqlen, NULL, NULL) != LLMQ_OK) goto done;
    if (dump(out_dir, "x.f32", x, N * D)) goto done;
    if (!(h = malloc((size_t)(N * D) * sizeof(float)))) goto done;
    memcpy(h, x, (size_t)(N * D) * sizeof(float));
    if (llmq_forward_block(f, layer, &m->layers[layer], h, n_seq, seqlen, hook, &cap) != LLMQ_OK) goto done;
    const int64_t Dq = m->hp.n_head * m->hp.head_dim, F = m->hp.n_ff;
    if (!cap.p[0] || !cap.p[1] || !cap.p[2] || !cap.p[3]) goto done;
    if (dump(out_dir, "n1.f32", cap.p[0], N * D) || dump(out_dir, "att.f32", cap.p[1], N * Dq) ||
        dump(out_dir, "n2.f32", cap.p[2], N * D) || dump(out_dir, "act.f32", cap.p[3], N * F))
        goto done;
    if (llmq_awq_block_init(m, layer, threads, &b) != LLMQ_OK) goto done;
    if (llmq_awq_search(b, f, x, n_seq, seqlen, &o) != LLMQ_OK) goto done;

    char name[256], path[4096];
    for (int g = 0; g < b->n_groups; g++) {
        snprintf(name, sizeof name, "scales_%s.f32", prev_name(b->groups[g].prev));
        if (dump(out_dir, name, b->groups[g].scales, b->groups[g].C)) goto done;
    }
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) {
        const int64_t R = m->layers[layer].w[l]->shape[0], C = m->layers[layer].w[l]->shape[1];
        snprintf(name, sizeof name, "w_%s.f32", llmq_linear_name(l));
        if (dump(out_dir, name, b->w[l], R * C)) goto done;
        if (b->clip[l]) {
            snprintf(name, sizeof name, "clip_%s.f32", llmq_linear_name(l));
            if (dump(out_dir, name, b->clip[l], R * b->clip_groups[l])) goto done;
        }
    }
    if (dump(out_dir, "attn_norm.f32", b->attn_norm, D) || dump(out_dir, "ffn_norm.f32", b->ffn_norm, D)) goto done;
    snprintf(path, sizeof path, "%s/result.json", out_dir);
    if (!(js = fopen(path, "w"))) goto done;
    fprintf(js, "{\"N\": %lld, \"D\": %lld, \"seconds_scale\": %.3f, \"seconds_clip\": %.3f, \"groups\": [",
            (long long)N, (long long)D, b->seconds_scale, b->seconds_clip);
    for (int g = 0; g < b->n_groups; g++) {
        const struct llmq_awq_group *gr = &b->groups[g];
        fprintf(js, "%s{\"prev\": \"%s\", \"best\": %d, \"ratio\": %.9g, \"loss\": [", g ? ", " : "",
                prev_name(gr->prev), gr->best, (double)gr->ratio);
        for (int i = 0; i < o.n_grid; i++) fprintf(js, "%s%.17g", i ? ", " : "", gr->loss[i]);
        fprintf(js, "]}");
    }
    fprintf(js, "], \"clip_err\": {");
    int first = 1;
    for (int l = 0; l < LLMQ_LIN_COUNT; l++)
        if (b->clip[l]) {
            fprintf(js, "%s\"%s\": %.17g", first ? "" : ", ", llmq_linear_name(l), b->clip_err[l]);
            first = 0;
        }
    fprintf(js, "}}\n");
    if (fclose(js) != 0) {
        js = NULL;
        goto done;
    }
    js = NULL;
    printf("%.3f %.3f\n", b->seconds_scale, b->seconds_clip);
    rc = 0;
done:
    if (js) fclose(js);
    llmq_awq_block_free(b);
    free(x);
    free(h);
    for (int i = 0; i < 4; i++) free(cap.p[i]);
    free(ids);
    free(text);
    llmq_forward_free(f);
    llmq_model_free(m);
    return rc;
}
