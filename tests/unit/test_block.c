/*
 * tests/unit/test_block.c — kernels/block.h on the CPU backend (the CUDA half: tests/gpu/test_block_cuda.c).
 *
 *  1. Random tiny llama (norm RoPE with frequency divisors, GQA 3:1, an f16 gate weight), qwen2 (neox RoPE, q/k/v
 *     biases, GQA 2:1) and qwen3 (q/k norms, MHA) models, each block loaded through calib/model/devblock.h and run
 *     on x: the result equals llmq_forward_block (calib/model/forward.c, one thread, OpenBLAS on one thread) BIT FOR
 *     BIT, block after block, for several sequences with partial attention tiles (seqlen 70 and 150 > 64 rows), and
 *     twice on the same block (the weights stay loaded; x stays in the block's buffer across the layers).
 *  2. The Gram sums equal llmq_gram_acc_f64 (kernels/gemm.h) on the inputs forward.c's hook sees (and
 *     llmq_block_hessian is (float)(scale · G) of them made symmetric, bit for bit), and the column
 *     sums (Σ|x|, Σx²) the calibration statistics' (calib/calib.h llmq_calib_stats_add) on them, bit for bit,
 *     accumulated over two passes; a NaN planted in the second pass's input is reported at its row (counted over
 *     both passes) and column.
 *  3. forward.c with 2 threads (its linears split W's rows over them): the measured difference is printed.
 *  4. The CPU block is within tests/block_tolerance.h's bound of a float64 block (so the bound the GPU test uses is
 *     itself tested), and a block with the wrong RoPE pairing is not.
 *  5. Refusals: other families by name, partial RoPE (n_rot < head_dim), a weight never set, too many tokens, sums
 *     of a block without, an unknown sums flag, a CUDA block without a device.
 *  6. llmq_block_gather (quantize's one-input statistics passes): the sums of each input it is asked for equal the
 *     whole forward's bit for bit, the others stay zero, x is not changed; llmq_block_attn then llmq_block_ffn (apply)
 *     give the forward's bits and sums, and the ffn's gathers from h = the attention half's output its sums without
 *     changing h; empty, unknown or other-half masks are refused.
 */
#include "harness.h"

#include "block_fixture.h"
#include "block_tolerance.h"

#include "calib/calib.h"
#include "calib/model/devblock.h"
#include "calib/model/forward.h"
#include "common/log.h"
#include "kernels/gemm.h"

#include <cblas.h>

static uint64_t rng = 0xB7E151628AED2A6Bull;

static int64_t bits_differ(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static float *random_x(int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    CHECK(x);
    for (int64_t i = 0; i < n; i++) x[i] = 2.0f * test_frand(&rng);
    return x;
}

// forward.c's hook: the Gram sums of the four inputs, as the calibration would make them, and the calibration's
// own statistics (Σ|x|, Σx² per column) of them in cs.
struct gram_ref {
    int64_t C[LLMQ_BLOCK_GRAM_COUNT];
    double *acc[LLMQ_BLOCK_GRAM_COUNT];
    float *scratch;
    struct llmq_calib_stats cs; // without xtx
};

static void gram_hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    struct gram_ref *g = user;
    const int k = which == LLMQ_LIN_Q ? 0 : which == LLMQ_LIN_O ? 1 : which == LLMQ_LIN_GATE ? 2 : 3;
    CHECK(n_in == g->C[k]);
    CHECK_OK(llmq_gram_acc_f64(LLMQ_BACKEND_CPU, in, n, n_in, g->scratch, g->acc[k]));
    CHECK_OK(llmq_calib_stats_add(&g->cs, layer, llmq_calib_slot_of(which), in, n, 1));
}

// Upper triangles of a and b (C, C) differ in how many entries.
static int64_t upper_differ(const double *a, const double *b, int64_t C) {
    int64_t d = 0;
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = i; j < C; j++) d += memcmp(&a[i * C + j], &b[i * C + j], sizeof(double)) != 0;
    return d;
}

// 1 + 2. Every block of fm through the CPU block vs forward.c, n_seq sequences of S tokens, then the Gram sums.
static void check_model(struct fix_model *fm, const char *label, int64_t n_seq, int64_t S) {
    const struct llmq_model *m = &fm->m;
    const int64_t D = m->hp.n_embd, n = n_seq * S;
    struct llmq_forward *f = NULL;
    CHECK_OK(llmq_forward_init(m, n, 1, &f));
    struct llmq_block_shape s;
    float ff[256];
    CHECK_OK(llmq_devblock_shape(m, ff, &s));
    CHECK(memcmp(ff, fm->ff, (size_t)(s.head_dim / 2) * sizeof(float)) == 0);
    struct llmq_block *b = NULL;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, &s, n, S, LLMQ_BLOCK_SUM_GRAM | LLMQ_BLOCK_SUM_COLS, &b));
    struct llmq_ops *ops = llmq_block_ops(b);
    struct llmq_ops_buf xb;
    CHECK_OK(llmq_ops_buf_alloc(ops, n * D, &xb));
    float *x_ref = random_x(n * D), *x_blk = malloc((size_t)(n * D) * sizeof(float));
    CHECK(x_blk);
    CHECK_OK(llmq_ops_upload(ops, &xb, 0, x_ref, n * D));

    struct gram_ref g = {{D, s.n_head * s.head_dim, D, s.n_ff}, {0}, NULL, {0}};
    CHECK_OK(llmq_calib_stats_init(m, false, 0, m->hp.n_layer, &g.cs));
    int64_t cmax = 0;
    for (int k = 0; k < 4; k++) {
        CHECK(g.acc[k] = calloc((size_t)(g.C[k] * g.C[k]), sizeof(double)));
        if (g.C[k] > cmax) cmax = g.C[k];
    }
    CHECK(g.scratch = malloc((size_t)(llmq_gram_scratch_rows(cmax) * cmax) * sizeof(float)));
    double *got = malloc((size_t)(cmax * cmax) * sizeof(double)), *cols = malloc((size_t)(2 * cmax) * sizeof(double));
    CHECK(got && cols);
    for (int il = 0; il < fm->n_layer; il++) {
        CHECK_OK(llmq_devblock_load(b, &m->layers[il], 1));
        CHECK_OK(llmq_block_sums_zero(b));
        for (int k = 0; k < 4; k++) memset(g.acc[k], 0, (size_t)(g.C[k] * g.C[k]) * sizeof(double));
        llmq_calib_stats_reset(&g.cs, il);
        for (int pass = 0; pass < 2; pass++) { // the same block twice: weights kept, Gram sums accumulated
            CHECK_OK(llmq_forward_block(f, il, &m->layers[il], x_ref, n_seq, S, gram_hook, &g));
            CHECK_OK(llmq_block_forward(b, &xb, n_seq, S, true));
            CHECK_OK(llmq_ops_download(ops, x_blk, &xb, 0, n * D));
            const int64_t d = bits_differ(x_ref, x_blk, n * D);
            if (d)
                fprintf(stderr, "%s: block %d pass %d: %lld of %lld values differ from forward.c\n", label, il, pass,
                        (long long)d, (long long)(n * D));
            CHECK(d == 0);
        }
        for (int k = 0; k < 4; k++) {
            memset(got, 0, (size_t)(g.C[k] * g.C[k]) * sizeof(double));
            CHECK_OK(llmq_block_gram_download(b, (enum llmq_block_gram)k, got));
            CHECK(llmq_block_gram_dim(b, (enum llmq_block_gram)k) == g.C[k]);
            CHECK(upper_differ(got, g.acc[k], g.C[k]) == 0);
            CHECK(fix_hessian_differ(b, (enum llmq_block_gram)k, 2.0 / 3.0) == 0);
            const struct llmq_calib_input *in = &g.cs.in[il * LLMQ_CALIB_N_SLOTS + k];
            int64_t bad = 0;
            memset(cols, 0, (size_t)(2 * g.C[k]) * sizeof(double));
            CHECK_OK(llmq_block_colsums_download(b, (enum llmq_block_gram)k, cols, cols + g.C[k], &bad));
            CHECK(bad == -1 && in->count == 2 * n);
            CHECK(memcmp(cols, in->sum_abs, (size_t)g.C[k] * sizeof(double)) == 0);
            CHECK(memcmp(cols + g.C[k], in->sum_sq, (size_t)g.C[k] * sizeof(double)) == 0);
        }
    }
    printf("%s: %lld x %lld tokens, %d blocks x 2 passes: bit-identical to llmq_forward_block; the 4 Gram sums "
           "bit-identical to llmq_gram_acc_f64, the column sums to the calibration statistics'\n",
           label, (long long)n_seq, (long long)S, fm->n_layer);
    for (int k = 0; k < 4; k++) free(g.acc[k]);
    llmq_calib_stats_free(&g.cs);
    free(g.scratch), free(got), free(cols), free(x_ref), free(x_blk);
    llmq_ops_buf_free(&xb);
    llmq_block_free(b);
    llmq_forward_free(f);
}

// 2. A NaN at row r = S (the second sequence's first token), column 3 of the second pass's x (n, D): every input of
// the row is NaN from its first column (RMSNorm spreads it over the row, the token attends to itself; the rows before
// it belong to the first sequence, which it never reaches: a NaN value row inside a sequence would also reach the
// earlier rows of its attention tile, 0 · NaN in p · v, as in forward.c), so each input reports row n + S, column 0
// (rows counted over both passes), and the first pass alone reports none.
static void check_nonfinite(struct fix_model *fm, int64_t n_seq, int64_t S) {
    const int64_t r = S;
    const int64_t D = fm->s.n_embd, n = n_seq * S;
    struct llmq_block *b = NULL;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, &fm->s, n, S, LLMQ_BLOCK_SUM_COLS, &b));
    fix_load(fm, 0, b);
    struct llmq_ops_buf xb;
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(b), n * D, &xb));
    float *x = random_x(n * D);
    double *cols = calloc((size_t)(2 * fm->s.n_ff + 2 * D + 2 * fm->s.n_head * fm->s.head_dim), sizeof(double));
    CHECK(cols);
    for (int pass = 0; pass < 2; pass++) {
        memcpy(xb.data, x, (size_t)(n * D) * sizeof(float));
        if (pass == 1) xb.data[r * D + 3] = NAN;
        CHECK_OK(llmq_block_forward(b, &xb, n_seq, S, true));
        for (int k = 0; k < LLMQ_BLOCK_GRAM_COUNT; k++) {
            const int64_t C = llmq_block_gram_dim(b, (enum llmq_block_gram)k);
            int64_t bad = 0;
            CHECK_OK(llmq_block_colsums_download(b, (enum llmq_block_gram)k, cols, cols + C, &bad));
            CHECK(bad == (pass ? (n + r) * C : -1));
        }
    }
    CHECK(llmq_block_gram_download(b, LLMQ_BLOCK_GRAM_QKV, cols) == LLMQ_ERR_ARG); // made without XᵀX
    CHECK_OK(llmq_block_sums_zero(b));
    int64_t bad = 0;
    CHECK_OK(llmq_block_colsums_download(b, LLMQ_BLOCK_GRAM_DOWN, cols, cols + fm->s.n_ff, &bad));
    CHECK(bad == -1);
    printf("a NaN in row %lld of the second pass: every input reports row %lld (counted over the passes), column 0\n",
           (long long)r, (long long)(n + r));
    free(x), free(cols);
    llmq_ops_buf_free(&xb);
    llmq_block_free(b);
}

// 3. forward.c on 2 threads vs the CPU block: printed, not asserted (the row split is forward.c's choice).
static void measure_threads(struct fix_model *fm, int64_t n_seq, int64_t S) {
    const struct llmq_model *m = &fm->m;
    const int64_t D = m->hp.n_embd, n = n_seq * S;
    struct llmq_forward *f = NULL;
    CHECK_OK(llmq_forward_init(m, n, 2, &f));
    struct llmq_block *b = NULL;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, &fm->s, n, S, 0, &b));
    struct llmq_ops_buf xb;
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(b), n * D, &xb));
    float *x = random_x(n * D);
    memcpy(xb.data, x, (size_t)(n * D) * sizeof(float));
    CHECK_OK(llmq_forward_block(f, 0, &m->layers[0], x, n_seq, S, NULL, NULL));
    fix_load(fm, 0, b);
    CHECK_OK(llmq_block_forward(b, &xb, n_seq, S, false));
    double worst = 0.0;
    for (int64_t i = 0; i < n * D; i++) {
        const double e = fabs((double)x[i] - xb.data[i]) / fmax(fabs((double)x[i]), 1e-30);
        if (e > worst) worst = e;
    }
    printf("forward.c on 2 threads vs the CPU block (%lld tokens): %lld of %lld values differ, max relative %.3g\n",
           (long long)n, (long long)bits_differ(x, xb.data, n * D), (long long)(n * D), worst);
    free(x);
    llmq_ops_buf_free(&xb);
    llmq_block_free(b);
    llmq_forward_free(f);
}

// 4. The CPU block against float64 with the bound; then a block whose RoPE pairs the wrong halves.
static void check_bound(struct fix_model *fm, const char *label, int64_t n_seq, int64_t S) {
    const int64_t D = fm->s.n_embd, n = n_seq * S;
    struct llmq_block_shape wrong = fm->s;
    wrong.rope_neox = !wrong.rope_neox;
    for (int variant = 0; variant < 2; variant++) {
        struct llmq_block *b = NULL;
        CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, variant ? &wrong : &fm->s, n, S, 0, &b));
        fix_load(fm, 0, b);
        struct llmq_ops_buf xb;
        CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(b), n * D, &xb));
        float *x = random_x(n * D);
        memcpy(xb.data, x, (size_t)(n * D) * sizeof(float));
        CHECK_OK(llmq_block_forward(b, &xb, n_seq, S, false));
        double *ex = malloc((size_t)(n * D) * sizeof(double)), *bd = malloc((size_t)(n * D) * sizeof(double));
        CHECK(ex && bd);
        CHECK(block_tol_reference(&fm->s, (const float *const *)fm->w[0], x, n_seq, S, ex, bd) == 0);
        double worst = 0.0;
        const int64_t bad = block_tol_outside(variant ? NULL : label, xb.data, ex, bd, n * D, &worst);
        printf("%s%s: max |cpu block - f64| / bound = %.3g, %lld outside\n", label,
               variant ? " (RoPE pairs swapped)" : "", worst, (long long)bad);
        CHECK(variant ? bad > 0 : bad == 0);
        free(x), free(ex), free(bd);
        llmq_ops_buf_free(&xb);
        llmq_block_free(b);
    }
}

// 5. Refusals.
static void test_refusals(struct fix_model *fm) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    float ff[256];
    struct llmq_block_shape s;
    const struct llmq_hparams saved = fm->m.hp;
    fm->m.hp.arch = LLMQ_ARCH_GEMMA2;
    CHECK(llmq_devblock_shape(&fm->m, ff, &s) == LLMQ_ERR_UNSUPPORTED);
    CHECK_CONTAINS(llmq_last_error(), "gemma2");
    fm->m.hp = saved;
    fm->m.hp.arch = LLMQ_ARCH_PHI3, fm->m.hp.sliding_window = 8;
    CHECK(llmq_devblock_shape(&fm->m, ff, &s) == LLMQ_ERR_UNSUPPORTED);
    fm->m.hp = saved;
    fm->m.hp.attn_softcap = 30.0f;
    CHECK(llmq_devblock_shape(&fm->m, ff, &s) == LLMQ_ERR_UNSUPPORTED);
    CHECK_CONTAINS(llmq_last_error(), "softcap");
    fm->m.hp = saved;
    fm->m.hp.n_rot = fm->m.hp.head_dim / 2; // the block rotates whole heads
    CHECK(llmq_devblock_shape(&fm->m, ff, &s) == LLMQ_ERR_UNSUPPORTED);
    CHECK_CONTAINS(llmq_last_error(), "partial RoPE");
    fm->m.hp = saved;

    struct llmq_block *b = NULL;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, &fm->s, 20, 10, 0, &b));
    struct llmq_ops_buf xb;
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(b), 20 * fm->s.n_embd, &xb));
    CHECK(llmq_block_forward(b, &xb, 2, 10, false) == LLMQ_ERR_ARG); // nothing loaded yet
    CHECK_CONTAINS(llmq_last_error(), "wq was never set");
    fix_load(fm, 0, b);
    CHECK_OK(llmq_block_forward(b, &xb, 2, 10, false));
    CHECK(llmq_block_forward(b, &xb, 3, 10, false) == LLMQ_ERR_ARG);             // 30 > 20 tokens
    CHECK(llmq_block_forward(b, &xb, 1, 11, false) == LLMQ_ERR_ARG);             // a sequence longer than 10
    CHECK(llmq_block_forward(b, &xb, 1, 10, true) == LLMQ_ERR_ARG);              // no Gram sums
    CHECK(llmq_block_set_weight(b, LLMQ_BLOCK_BQ, fm->w[0][0]) == LLMQ_ERR_ARG); // llama has no q bias
    CHECK_CONTAINS(llmq_last_error(), "bq");
    struct llmq_ops_buf small = llmq_ops_buf_view(&xb, 0, 10);
    CHECK(llmq_block_forward(b, &small, 1, 10, false) == LLMQ_ERR_ARG);
    fm->layers[0].w[LLMQ_LIN_UP] = &fm->views[0][LLMQ_BLOCK_WDOWN]; // same size: accepted; a wrong size is not
    fm->layers[0].w[LLMQ_LIN_Q] = &fm->views[0][LLMQ_BLOCK_WK];
    CHECK(llmq_devblock_load(b, &fm->layers[0], 1) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "wq");
    fm->layers[0].w[LLMQ_LIN_UP] = &fm->views[0][LLMQ_BLOCK_WUP];
    fm->layers[0].w[LLMQ_LIN_Q] = &fm->views[0][LLMQ_BLOCK_WQ];
    llmq_ops_buf_free(&xb);
    llmq_block_free(b);
    llmq_block_free(NULL);
    struct llmq_block_shape bad = fm->s;
    bad.head_dim = 7;
    CHECK(llmq_block_init(LLMQ_BACKEND_CPU, &bad, 20, 10, 0, &b) == LLMQ_ERR_ARG && !b);
    CHECK(llmq_block_init(LLMQ_BACKEND_CPU, &fm->s, 20, 10, 4u, &b) == LLMQ_ERR_ARG && !b); // no such sum
    if (llmq_cuda_device_count(NULL) == 0) {
        CHECK(llmq_block_init(LLMQ_BACKEND_CUDA, &fm->s, 20, 10, 0, &b) == LLMQ_ERR_DEVICE && !b);
        printf("a CUDA block without a device: LLMQ_ERR_DEVICE (%s)\n", llmq_last_error());
    }
    llmq_log_set_level(LLMQ_LOG_INFO);
    printf("refusals: other families, missing weights, sizes, sums without, an unknown sums flag\n");
}

// 6. llmq_block_gather: for each single input and for a mixed mask (o's and down's), the sums of a gather equal those
// of llmq_block_forward(..., true) on the same x bit for bit (Gram upper triangles, Σ|x|, Σx²), the inputs outside the
// mask stay zero, x is not changed; an empty mask and an unknown bit are refused.
static void check_gather(struct fix_model *fm, const char *label, int64_t n_seq, int64_t S) {
    const struct llmq_model *m = &fm->m;
    const int64_t D = m->hp.n_embd, n = n_seq * S;
    struct llmq_block_shape s;
    float ff[256];
    CHECK_OK(llmq_devblock_shape(m, ff, &s));
    struct llmq_block *bf = NULL, *bg = NULL;
    const unsigned sums = LLMQ_BLOCK_SUM_GRAM | LLMQ_BLOCK_SUM_COLS;
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, &s, n, S, sums, &bf));
    CHECK_OK(llmq_block_init(LLMQ_BACKEND_CPU, &s, n, S, sums, &bg));
    struct llmq_ops_buf xf, xg;
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(bf), n * D, &xf));
    CHECK_OK(llmq_ops_buf_alloc(llmq_block_ops(bg), n * D, &xg));
    float *x0 = random_x(n * D);
    const unsigned masks[] = {1u, 2u, 4u, 8u, 2u | 8u};
    for (int il = 0; il < fm->n_layer; il++) {
        CHECK_OK(llmq_devblock_load(bf, &m->layers[il], 1));
        CHECK_OK(llmq_devblock_load(bg, &m->layers[il], 1));
        CHECK_OK(llmq_block_sums_zero(bf));
        memcpy(xf.data, x0, (size_t)(n * D) * sizeof(float));
        CHECK_OK(llmq_block_forward(bf, &xf, n_seq, S, true));
        for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++) {
            CHECK_OK(llmq_block_sums_zero(bg));
            memcpy(xg.data, x0, (size_t)(n * D) * sizeof(float));
            CHECK_OK(llmq_block_gather(bg, &xg, n_seq, S, masks[mi]));
            CHECK(bits_differ(x0, xg.data, n * D) == 0);
            CHECK(fix_sums_differ(bf, bg, masks[mi]) == 0);
        }
        // the halves: llmq_block_attn then llmq_block_ffn with apply is the forward, bits and sums
        CHECK_OK(llmq_block_sums_zero(bg));
        memcpy(xg.data, x0, (size_t)(n * D) * sizeof(float));
        CHECK_OK(llmq_block_attn(bg, &xg, n_seq, S, 1u | 2u));
        CHECK_OK(llmq_block_ffn(bg, &xg, n_seq, S, 4u | 8u, true));
        CHECK(bits_differ(xf.data, xg.data, n * D) == 0);
        CHECK(fix_sums_differ(bf, bg, 0xfu) == 0);
        // h = the attention half's output in place, then the ffn inputs gathered from it without applying it
        CHECK_OK(llmq_block_sums_zero(bg));
        memcpy(xg.data, x0, (size_t)(n * D) * sizeof(float));
        CHECK_OK(llmq_block_attn(bg, &xg, n_seq, S, 0u));
        float *h = malloc((size_t)(n * D) * sizeof(float));
        CHECK(h);
        memcpy(h, xg.data, (size_t)(n * D) * sizeof(float));
        CHECK_OK(llmq_block_ffn(bg, &xg, n_seq, S, 4u | 8u, false));
        CHECK(bits_differ(h, xg.data, n * D) == 0);
        CHECK(fix_sums_differ(bf, bg, 4u | 8u) == 0);
        free(h);
        memcpy(xg.data, x0, (size_t)(n * D) * sizeof(float)); // the halves' outputs without the residual
        CHECK(fix_outs_differ(bg, &xg, n_seq, S) == 0);
    }
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_block_gather(bg, &xg, n_seq, S, 0u) == LLMQ_ERR_ARG);
    CHECK(llmq_block_gather(bg, &xg, n_seq, S, 0x10u) == LLMQ_ERR_ARG);
    CHECK(llmq_block_attn(bg, &xg, n_seq, S, 4u) == LLMQ_ERR_ARG);
    CHECK(llmq_block_ffn(bg, &xg, n_seq, S, 1u, true) == LLMQ_ERR_ARG);
    CHECK(llmq_block_ffn(bg, &xg, n_seq, S, 0u, false) == LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);
    printf("%s: llmq_block_gather of 1, 2, 4, 8 and o+down: sums bit-identical to the forward's, the others zero, "
           "x unchanged; llmq_block_attn + llmq_block_ffn: the forward's bits and sums, the ffn gathers from h; "
           "attn_out / mlp_out + the residual: the halves' bits, their input rows sum to their column sums; wrong "
           "masks refused\n",
           label);
    free(x0);
    llmq_ops_buf_free(&xf), llmq_ops_buf_free(&xg);
    llmq_block_free(bf), llmq_block_free(bg);
}

int main(void) {
    openblas_set_num_threads(1); // as inside a forward pass (calib/model/forward.c blas_serial)
    struct fix_model fm;
    fix_init(&fm, FIX_LLAMA, 48, 40, 6, 2, 8, 2, true, &rng);
    check_model(&fm, "random llama (norm RoPE, divisors, GQA 3:1, f16 gate)", 2, 70);
    check_bound(&fm, "random llama", 2, 70);
    check_nonfinite(&fm, 2, 70);
    check_gather(&fm, "random llama", 2, 70);
    test_refusals(&fm);
    fix_free(&fm);

    fix_init(&fm, FIX_QWEN2, 32, 48, 4, 2, 16, 2, false, &rng);
    check_model(&fm, "random qwen2 (neox RoPE, q/k/v biases, GQA 2:1)", 1, 150);
    check_bound(&fm, "random qwen2", 1, 150);
    check_gather(&fm, "random qwen2", 1, 150);
    fix_free(&fm);

    fix_init(&fm, FIX_QWEN2, 128, 256, 8, 2, 16, 1, false, &rng); // wide enough for forward.c to use 2 threads
    measure_threads(&fm, 2, 150);
    fix_free(&fm);

    fix_init(&fm, FIX_QWEN3, 32, 24, 2, 2, 16, 3, false, &rng);
    check_model(&fm, "random qwen3 (q/k norms, MHA)", 3, 33);
    check_bound(&fm, "random qwen3", 3, 33);
    check_gather(&fm, "random qwen3", 3, 33);
    fix_free(&fm);
    return 0;
}
