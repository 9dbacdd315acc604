// tests/unit/test_calib.c — calib/calib.h: sources (.txt, .jsonl, .gz; names: test_datasets.c),
// statistics against a direct computation on stories260K, the .lcs stats file (round
// trip + corrupt cases) and llama.cpp's imatrix .dat (round trip).
#include "calib/calib.h"
#include "common/io.h"
#include "common/log.h"
#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include <zlib.h>

static char tmpdir[] = "/tmp/llmq_test_calib_XXXXXX";

static char *tpath(const char *name) { return test_path(tmpdir, name); }

static void test_sources(void) {
    const char *txt = "Once upon a time there was a cat.\nIt sat.";
    test_write_file(tpath("a.txt"), txt, strlen(txt));
    const char *jl = "{\"text\": \"first text\"}\n\n{\"text\": \"second \\u00e9\", \"id\": 3}\n";
    test_write_file(tpath("b.jsonl"), jl, strlen(jl));
    gzFile gz = gzopen(tpath("c.jsonl.gz"), "wb");
    CHECK(gz);
    CHECK(gzwrite(gz, jl, (unsigned)strlen(jl)) == (int)strlen(jl));
    gzclose(gz);
    const char *badjl = "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n";
    test_write_file(tpath("d.jsonl"), badjl, strlen(badjl));

    char **t;
    int64_t n;
    char sha[65];
    CHECK(llmq_calib_read_texts(tpath("a.txt"), &t, &n, sha) == LLMQ_OK);
    CHECK_EQ_INT(n, 1);
    CHECK(strcmp(t[0], txt) == 0);
    CHECK_EQ_INT(strlen(sha), 64);
    free(t[0]);
    free(t);
    for (int gzk = 0; gzk < 2; gzk++) {
        CHECK(llmq_calib_read_texts(tpath(gzk ? "c.jsonl.gz" : "b.jsonl"), &t, &n, sha) == LLMQ_OK);
        CHECK_EQ_INT(n, 2);
        CHECK(strcmp(t[0], "first text") == 0);
        CHECK(strcmp(t[1], "second \xc3\xa9") == 0);
        for (int64_t i = 0; i < n; i++) free(t[i]);
        free(t);
    }
    CHECK(llmq_calib_read_texts(tpath("d.jsonl"), &t, &n, sha) == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "line 2");
    // manifest names: tests/unit/test_datasets.c (datasets/datasets.h)
}

// direct computation: keep the raw inputs of (layer, slot) and sum in double
struct grab {
    int layer, slot;
    double *xtx, *sa, *sq;
    int64_t C, count;
};
static void grab_hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    struct grab *g = user;
    if (layer != g->layer || llmq_calib_slot_of(which) != g->slot) return;
    CHECK_EQ_INT(n_in, g->C);
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < n_in; i++) {
            double xi = in[t * n_in + i];
            g->sa[i] += fabs(xi);
            g->sq[i] += xi * xi;
            for (int64_t j = 0; j < n_in; j++) g->xtx[i * n_in + j] += xi * (double)in[t * n_in + j];
        }
    g->count += n;
}

static void test_stats(void) {
    char model_path[512];
    test_stories260k(model_path, sizeof model_path, "tinyllamas-stories-260k-f32.gguf");
    struct llmq_model *m;
    CHECK(llmq_model_load(model_path, &m) == LLMQ_OK);
    const char *txt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
                      "One day, she saw a big red ball in the park. She ran to it and picked it up. Her mom smiled.";
    test_write_file(tpath("s.txt"), txt, strlen(txt));
    const char *src[] = {tpath("s.txt")};
    struct llmq_calib_opts co = {
        .sources = src, .n_sources = 1, .nsamples = 5, .seqlen = 16, .seed = 7, .n_threads = 1};
    struct llmq_calib_data d, d2;
    CHECK(llmq_calib_data_load(m, &co, &d) == LLMQ_OK);
    CHECK(llmq_calib_data_load(m, &co, &d2) == LLMQ_OK);
    CHECK(memcmp(d.tokens, d2.tokens, sizeof(int32_t) * 5 * 16) == 0); // seeded
    CHECK(strcmp(d.tokens_sha256, d2.tokens_sha256) == 0);
    llmq_calib_data_free(&d2);
    co.seed = 8;
    CHECK(llmq_calib_data_load(m, &co, &d2) == LLMQ_OK);
    CHECK(strcmp(d.tokens_sha256, d2.tokens_sha256) != 0);
    llmq_calib_data_free(&d2);
    co.seqlen = 100000;
    CHECK(llmq_calib_data_load(m, &co, &d2) == LLMQ_ERR_ARG); // fewer tokens than one window

    struct llmq_calib_stats s;
    CHECK(llmq_calib_stats_init(m, true, 0, m->hp.n_layer, &s) == LLMQ_OK);
    CHECK(llmq_calib_run(m, &d, 1, 2, &s) == LLMQ_OK); // micro-batches of 2 sequences: 2 + 2 + 1

    // direct: the whole (5, 16) batch at once
    int64_t D = m->hp.n_embd, N = 5 * 16;
    for (int slot = 0; slot < LLMQ_CALIB_N_SLOTS; slot++) {
        int layer = slot == 0 ? 0 : slot == 1 ? 2 : slot == 2 ? 4 : 3;
        struct grab g = {.layer = layer, .slot = slot, .C = s.in[layer * LLMQ_CALIB_N_SLOTS + slot].n_in};
        g.xtx = calloc((size_t)(g.C * g.C), sizeof(double));
        g.sa = calloc((size_t)g.C, sizeof(double));
        g.sq = calloc((size_t)g.C, sizeof(double));
        float *x = malloc((size_t)(N * D) * sizeof(float));
        struct llmq_forward *f;
        CHECK(llmq_forward_init(m, N, 1, &f) == LLMQ_OK);
        CHECK(llmq_forward_embed(f, d.tokens, N, x) == LLMQ_OK);
        for (int l = 0; l <= layer; l++)
            CHECK(llmq_forward_block(f, l, &m->layers[l], x, 5, 16, grab_hook, &g) == LLMQ_OK);
        const struct llmq_calib_input *in = &s.in[layer * LLMQ_CALIB_N_SLOTS + slot];
        CHECK_EQ_INT(in->count, N);
        CHECK_EQ_INT(g.count, N);
        CHECK_EQ_INT(in->n_seq, 5);
        double scale = 0;
        for (int64_t i = 0; i < g.C * g.C; i++) scale = fmax(scale, fabs(g.xtx[i]));
        for (int64_t i = 0; i < g.C * g.C; i++) CHECK(fabs(in->xtx[i] - g.xtx[i]) <= 1e-5 * scale);
        for (int64_t i = 0; i < g.C; i++) {
            CHECK(fabs(in->sum_abs[i] - g.sa[i]) <= 1e-4 * (fabs(g.sa[i]) + 1e-3));
            CHECK(fabs(in->sum_sq[i] - g.sq[i]) <= 1e-4 * (fabs(g.sq[i]) + 1e-3));
        }
        float *H = malloc((size_t)(g.C * g.C) * sizeof(float));
        CHECK(llmq_calib_hessian(&s, layer, slot, H) == LLMQ_OK);
        CHECK(fabs(H[0] - 2.0 / 5.0 * g.xtx[0]) <= 1e-4 * fabs(g.xtx[0]) + 1e-6);
        free(H);
        llmq_forward_free(f);
        free(x);
        free(g.xtx);
        free(g.sa);
        free(g.sq);
    }

    // stats file round trip
    CHECK(llmq_calib_stats_save(&s, tpath("s.lcs")) == LLMQ_OK);
    struct llmq_calib_stats s2;
    CHECK(llmq_calib_stats_load(tpath("s.lcs"), &s2) == LLMQ_OK);
    CHECK_EQ_INT(s2.n_layer, s.n_layer);
    CHECK_EQ_INT(s2.n_seq, 5);
    CHECK_EQ_INT(s2.seqlen, 16);
    CHECK(s2.with_xtx);
    for (int64_t i = 0; i < s.n_layer * LLMQ_CALIB_N_SLOTS; i++) {
        int64_t C = s.in[i].n_in;
        CHECK_EQ_INT(s2.in[i].n_in, C);
        CHECK_EQ_INT(s2.in[i].count, s.in[i].count);
        CHECK(memcmp(s2.in[i].xtx, s.in[i].xtx, (size_t)(C * C) * 8) == 0);
        CHECK(memcmp(s2.in[i].sum_abs, s.in[i].sum_abs, (size_t)C * 8) == 0);
        CHECK(memcmp(s2.in[i].sum_sq, s.in[i].sum_sq, (size_t)C * 8) == 0);
    }
    llmq_calib_stats_free(&s2);

    // corrupt cases
    char *buf;
    size_t len;
    CHECK(llmq_read_file(tpath("s.lcs"), (size_t)1 << 30, &buf, &len) == LLMQ_OK);
    llmq_log_set_level(LLMQ_LOG_SILENT);
    struct {
        size_t off;
        uint8_t val;
        size_t cut;
        enum llmq_status want;
    } cases[] = {
        {0, 'X', 0, LLMQ_ERR_MAGIC},   {8, 9, 0, LLMQ_ERR_VERSION},    {12, 2, 0, LLMQ_ERR_CORRUPT},
        {16, 0, 0, LLMQ_ERR_CORRUPT},  {72, 0, 0, LLMQ_ERR_CORRUPT},   {79, 0x7f, 0, LLMQ_ERR_CORRUPT},
        {0, 0, 1, LLMQ_ERR_TRUNCATED}, {0, 0, 40, LLMQ_ERR_TRUNCATED}, {0, 0, len - 50, LLMQ_ERR_TRUNCATED},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char *b = malloc(len + 8);
        memcpy(b, buf, len);
        size_t n = cases[c].cut ? len - cases[c].cut : len;
        if (!cases[c].cut) {
            if (cases[c].off == 16)
                memset(b + 16, 0, 8); // n_layer 0
            else if (cases[c].off == 72)
                memset(b + 72, 0, 8); // n_in 0
            else
                b[cases[c].off] = (char)cases[c].val;
        }
        test_write_file(tpath("bad.lcs"), b, n);
        free(b);
        enum llmq_status st = llmq_calib_stats_load(tpath("bad.lcs"), &s2);
        if (st != cases[c].want) fprintf(stderr, "case %zu: got %s\n", c, llmq_status_name(st));
        CHECK(st == cases[c].want);
    }
    // trailing bytes
    char *b = malloc(len + 8);
    memcpy(b, buf, len);
    memset(b + len, 0, 8);
    test_write_file(tpath("bad.lcs"), b, len + 8);
    CHECK(llmq_calib_stats_load(tpath("bad.lcs"), &s2) == LLMQ_ERR_CORRUPT);
    free(b);
    free(buf);
    llmq_log_set_level(LLMQ_LOG_INFO);

    // imatrix .dat round trip: the mean x² survives, and a re-save is byte-identical
    CHECK(llmq_calib_imatrix_save(&s, tpath("m.dat"), "s.txt") == LLMQ_OK);
    CHECK(llmq_calib_imatrix_load(tpath("m.dat"), m, &s2) == LLMQ_OK);
    for (int64_t i = 0; i < s.n_layer * LLMQ_CALIB_N_SLOTS; i++)
        for (int64_t c = 0; c < s.in[i].n_in; c++) {
            double a = s.in[i].sum_sq[c] / (double)s.in[i].count, e = s2.in[i].sum_sq[c] / (double)s2.in[i].count;
            CHECK(fabs(a - e) <= 1e-6 * fabs(a) + 1e-30);
        }
    s2.n_seq = s.n_seq;
    CHECK(llmq_calib_imatrix_save(&s2, tpath("m2.dat"), "s.txt") == LLMQ_OK);
    char *b1, *b2;
    size_t l1, l2;
    CHECK(llmq_read_file(tpath("m.dat"), 1 << 24, &b1, &l1) == LLMQ_OK);
    CHECK(llmq_read_file(tpath("m2.dat"), 1 << 24, &b2, &l2) == LLMQ_OK);
    CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    // layout: n_entries = 7 per layer, first name blk.0.attn_q.weight
    int32_t ne, nl;
    memcpy(&ne, b1, 4);
    memcpy(&nl, b1 + 4, 4);
    CHECK_EQ_INT(ne, 7 * m->hp.n_layer);
    CHECK_EQ_INT(nl, 19);
    CHECK(memcmp(b1 + 8, "blk.0.attn_q.weight", 19) == 0);
    // a truncated imatrix is refused
    test_write_file(tpath("bad.dat"), b1, l1 / 2);
    llmq_calib_stats_free(&s2);
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_calib_imatrix_load(tpath("bad.dat"), m, &s2) == LLMQ_ERR_TRUNCATED);
    llmq_log_set_level(LLMQ_LOG_INFO);
    free(b1);
    free(b2);

    llmq_calib_stats_free(&s);
    llmq_calib_data_free(&d);
    llmq_model_free(m);
}

int main(void) {
    CHECK(mkdtemp(tmpdir));
    test_sources();
    test_stats();
    test_remove_tree(tmpdir);
    printf("test_calib: ok\n");
    return 0;
}
