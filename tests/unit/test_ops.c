/*
 * tests/unit/test_ops.c — kernels/ops.h on the CPU backend (the CUDA half: tests/gpu/test_ops_cuda.c).
 *
 *  1. Every block of stories260K run through the ops (RMSNorm, the q/k/v products, RoPE with tables from
 *     llmq_ops_rope_table, attention, the o product, the add, RMSNorm, gate/up, SwiGLU, down, the add) equals
 *     llmq_forward_block (calib/model/forward.c) BIT FOR BIT, in three settings of the hyper-parameters: as
 *     stored (norm RoPE, GQA 8:4, two sequences of 70: a partial attention tile), neox RoPE with llama3 scaling,
 *     and a sliding window of 5 with an attention softcap (the forward pass honours hp.sliding_window on phi3
 *     and hp.attn_softcap on any family, so the test sets those fields on the loaded model).
 *  2. RMSNorm equals llmq_forward_rmsnorm bit for bit, in place too; one_plus_w on w equals it on 1 + w.
 *  3. The CPU attention is within tests/ops_tolerance.h's bound of float64 attention over head_dim 8 to 128,
 *     GQA, windows and softcaps; wrong attentions (a window off by one, two sequences taken as one) are not.
 *  4. Buffers (upload / download at offsets, views, host views) and the argument checks; a CUDA context on a
 *     machine or build without a device is LLMQ_ERR_DEVICE.
 * The products use OpenBLAS on one thread, as the forward pass does.
 */
#include "harness.h"
#include "ops_tolerance.h"

#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "common/log.h"
#include "kernels/ops.h"
#include "quant/awq.h"

#include <cblas.h>
#include <math.h>

static uint64_t rng = 0x243F6A8885A308D3ull;

static struct llmq_ops_buf alloc_buf(struct llmq_ops *ops, int64_t n) {
    struct llmq_ops_buf b;
    CHECK_OK(llmq_ops_buf_alloc(ops, n, &b));
    return b;
}

static float *weight_f32(const struct llmq_tensor_view *w) { // f32 copy (caller frees)
    float *p = malloc((size_t)llmq_tensor_nelements(w) * sizeof(float));
    CHECK(p);
    CHECK_OK(llmq_model_weight_f32(w, p, 1));
    return p;
}

// Y (n, R) = X (n, C) · Wᵀ as forward.c's linear with one thread and an f32 weight: one sgemm on the mapping.
static void linear(const struct llmq_tensor_view *w, const float *X, int64_t n, float *Y) {
    CHECK(w->dtype == LLMQ_DTYPE_F32 && (uintptr_t)w->data % sizeof(float) == 0);
    const int R = (int)w->shape[0], C = (int)w->shape[1];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, R, C, 1.0f, X, C, (const float *)w->data, C, 0.0f, Y,
                R);
}

// The activations of one block on the CPU backend.
struct acts {
    struct llmq_ops_buf xn, q, k, v, att, out, gate, up, norm, cos, sin;
};

// x (n_seq · S, D) through block `layer` with the ops: what forward.c's block() computes.
static void block_by_ops(struct llmq_ops *ops, struct acts *a, const struct llmq_model *m, int layer, float *x,
                         int64_t n_seq, int64_t S) {
    const struct llmq_hparams *hp = &m->hp;
    const struct llmq_layer *ly = &m->layers[layer];
    const int64_t D = hp->n_embd, Dh = hp->head_dim, n = n_seq * S, F = hp->n_ff;
    const struct llmq_ops_buf xb = llmq_ops_buf_host(x, n * D);
    const bool neox = hp->rope_type == LLMQ_ROPE_NEOX, swa = llmq_hparams_layer_swa(hp, layer);
    const struct llmq_ops_attn at = {.n_seq = n_seq,
                                     .seqlen = S,
                                     .n_head = hp->n_head,
                                     .n_head_kv = hp->n_head_kv,
                                     .head_dim = Dh,
                                     .scale = 1.0f / sqrtf((float)Dh),
                                     .softcap = hp->attn_softcap,
                                     .window = swa ? hp->sliding_window : 0};
    float *w = weight_f32(ly->attn_norm);
    CHECK_OK(llmq_ops_upload(ops, &a->norm, 0, w, D));
    free(w);
    CHECK_OK(llmq_ops_rmsnorm(ops, &xb, &a->norm, &a->xn, n, D, hp->rms_eps, false));
    linear(ly->w[LLMQ_LIN_Q], a->xn.data, n, a->q.data);
    linear(ly->w[LLMQ_LIN_K], a->xn.data, n, a->k.data);
    linear(ly->w[LLMQ_LIN_V], a->xn.data, n, a->v.data);
    CHECK_OK(llmq_ops_rope(ops, &a->q, n_seq, S, hp->n_head, Dh, neox, &a->cos, &a->sin));
    CHECK_OK(llmq_ops_rope(ops, &a->k, n_seq, S, hp->n_head_kv, Dh, neox, &a->cos, &a->sin));
    CHECK_OK(llmq_ops_attention(ops, &at, &a->q, &a->k, &a->v, &a->att));
    linear(ly->w[LLMQ_LIN_O], a->att.data, n, a->out.data);
    CHECK_OK(llmq_ops_add(ops, &xb, &a->out, n * D));

    w = weight_f32(ly->ffn_norm);
    CHECK_OK(llmq_ops_upload(ops, &a->norm, 0, w, D));
    free(w);
    CHECK_OK(llmq_ops_rmsnorm(ops, &xb, &a->norm, &a->xn, n, D, hp->rms_eps, false));
    linear(ly->w[LLMQ_LIN_GATE], a->xn.data, n, a->gate.data);
    linear(ly->w[LLMQ_LIN_UP], a->xn.data, n, a->up.data);
    CHECK_OK(llmq_ops_swiglu(ops, &a->gate, &a->up, &a->gate, n * F));
    linear(ly->w[LLMQ_LIN_DOWN], a->gate.data, n, a->out.data);
    CHECK_OK(llmq_ops_add(ops, &xb, &a->out, n * D));
}

static int64_t bits_differ(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

// 1. Every block, ops vs forward.c, for n_seq sequences of S tokens.
static void check_blocks(struct llmq_model *m, const char *label, int64_t n_seq, int64_t S) {
    const struct llmq_hparams *hp = &m->hp;
    const int64_t D = hp->n_embd, Dh = hp->head_dim, n = n_seq * S, V = hp->n_vocab;
    const int64_t Dq = hp->n_head * Dh, Dkv = hp->n_head_kv * Dh;
    struct llmq_forward *f = NULL;
    CHECK_OK(llmq_forward_init(m, n, 1, &f));
    struct llmq_ops *ops = NULL;
    CHECK_OK(llmq_ops_init(LLMQ_BACKEND_CPU, &ops));
    struct acts a = {alloc_buf(ops, n * D),        alloc_buf(ops, n * Dq),       alloc_buf(ops, n * Dkv),
                     alloc_buf(ops, n * Dkv),      alloc_buf(ops, n * Dq),       alloc_buf(ops, n * D),
                     alloc_buf(ops, n * hp->n_ff), alloc_buf(ops, n * hp->n_ff), alloc_buf(ops, D),
                     alloc_buf(ops, S * Dh / 2),   alloc_buf(ops, S * Dh / 2)};
    float *ff = malloc((size_t)(Dh / 2) * sizeof(float)), *cs = malloc((size_t)(S * Dh / 2) * sizeof(float));
    float *sn = malloc((size_t)(S * Dh / 2) * sizeof(float));
    CHECK(ff && cs && sn);
    llmq_model_rope_freq_factors(m, ff); // what forward_init reads; the tables as fill_rope makes them
    llmq_ops_rope_table(hp->rope_theta, Dh, ff, 1.0f, S, cs, sn);
    CHECK_OK(llmq_ops_upload(ops, &a.cos, 0, cs, S * Dh / 2));
    CHECK_OK(llmq_ops_upload(ops, &a.sin, 0, sn, S * Dh / 2));

    int32_t *toks = malloc((size_t)n * sizeof(int32_t));
    float *x_ref = malloc((size_t)(n * D) * sizeof(float)), *x_ops = malloc((size_t)(n * D) * sizeof(float));
    CHECK(toks && x_ref && x_ops);
    for (int64_t i = 0; i < n; i++) toks[i] = i % S == 0 ? 1 : (int32_t)((i * 131 + 7) % V);
    CHECK_OK(llmq_forward_embed(f, toks, n, x_ref));
    memcpy(x_ops, x_ref, (size_t)(n * D) * sizeof(float));
    for (int il = 0; il < hp->n_layer; il++) {
        CHECK_OK(llmq_forward_block(f, il, &m->layers[il], x_ref, n_seq, S, NULL, NULL));
        block_by_ops(ops, &a, m, il, x_ops, n_seq, S);
        const int64_t d = bits_differ(x_ref, x_ops, n * D);
        if (d)
            fprintf(stderr, "%s: block %d: %lld of %lld values differ from forward.c\n", label, il, (long long)d,
                    (long long)(n * D));
        CHECK(d == 0);
    }
    printf("%s: %lld x %lld tokens, %lld blocks through the ops: bit-identical to llmq_forward_block\n", label,
           (long long)n_seq, (long long)S, (long long)hp->n_layer);
    struct llmq_ops_buf *bufs[] = {&a.xn, &a.q, &a.k, &a.v, &a.att, &a.out, &a.gate, &a.up, &a.norm, &a.cos, &a.sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) llmq_ops_buf_free(bufs[i]);
    llmq_ops_free(ops);
    llmq_forward_free(f);
    free(ff), free(cs), free(sn), free(toks), free(x_ref), free(x_ops);
}

static void test_blocks(struct llmq_model *m) {
    const struct llmq_hparams saved = m->hp;
    CHECK(m->hp.rope_type == LLMQ_ROPE_NORM && m->hp.n_head == 2 * m->hp.n_head_kv && !m->rope_freqs);
    check_blocks(m, "stories260K as stored (norm RoPE, GQA 8:4)", 2, 70);

    m->hp.rope_type = LLMQ_ROPE_NEOX;
    m->hp.rope_scaling.type = LLMQ_ROPE_SCALING_LLAMA3;
    m->hp.rope_scaling.factor = 8.0f;
    m->hp.rope_scaling.low_freq_factor = 1.0f;
    m->hp.rope_scaling.high_freq_factor = 4.0f;
    m->hp.rope_scaling.original_max_pos = 64; // head_dim 8: wavelengths 6.3, 63, 628, 6283 -> kept, blended, / 8, / 8
    float ff[4];
    llmq_model_rope_freq_factors(m, ff);
    CHECK(ff[0] == 1.0f && ff[1] > 1.0f && ff[1] < 8.0f && ff[2] == 8.0f && ff[3] == 8.0f);
    check_blocks(m, "neox RoPE, llama3 scaling", 1, 37);

    m->hp = saved;
    m->hp.arch = LLMQ_ARCH_PHI3; // phi3: every layer slides (formats/llama/arch.h llmq_hparams_layer_swa)
    m->hp.sliding_window = 5;
    m->hp.attn_softcap = 1.5f;
    CHECK(llmq_hparams_layer_swa(&m->hp, 0));
    check_blocks(m, "sliding window 5, softcap 1.5", 2, 70);
    m->hp = saved;
}

// 2. RMSNorm against llmq_forward_rmsnorm.
static void test_rmsnorm(const struct llmq_model *m) {
    const int64_t D = m->hp.n_embd, n = 5;
    struct llmq_forward *f = NULL;
    CHECK_OK(llmq_forward_init(m, n, 1, &f));
    struct llmq_ops *ops = NULL;
    CHECK_OK(llmq_ops_init(LLMQ_BACKEND_CPU, &ops));
    float *x = malloc((size_t)(n * D) * sizeof(float)), *w = malloc((size_t)D * sizeof(float));
    float *w1 = malloc((size_t)D * sizeof(float)), *y_ref = malloc((size_t)(n * D) * sizeof(float));
    float *y = malloc((size_t)(n * D) * sizeof(float));
    CHECK(x && w && w1 && y_ref && y);
    for (int64_t i = 0; i < n * D; i++) x[i] = 3.0f * test_frand(&rng);
    for (int64_t i = 0; i < D; i++) w1[i] = 1.0f + (w[i] = 0.5f * test_frand(&rng)); // the f32 1 + w of model.c
    struct llmq_ops_buf xb = llmq_ops_buf_host(x, n * D), wb = llmq_ops_buf_host(w, D),
                        yb = llmq_ops_buf_host(y, n * D);
    const float eps = m->hp.rms_eps;
    CHECK_OK(llmq_forward_rmsnorm(f, x, n, w, y_ref));
    CHECK_OK(llmq_ops_rmsnorm(ops, &xb, &wb, &yb, n, D, eps, false));
    CHECK(bits_differ(y, y_ref, n * D) == 0);
    CHECK_OK(llmq_forward_rmsnorm(f, x, n, w1, y_ref));
    CHECK_OK(llmq_ops_rmsnorm(ops, &xb, &wb, &yb, n, D, eps, true));
    CHECK(bits_differ(y, y_ref, n * D) == 0);
    CHECK_OK(llmq_ops_rmsnorm(ops, &xb, &wb, &xb, n, D, eps, true)); // in place
    CHECK(bits_differ(x, y_ref, n * D) == 0);
    printf("rmsnorm: equals llmq_forward_rmsnorm bit for bit (w, 1 + w, in place)\n");
    free(x), free(w), free(w1), free(y_ref), free(y);
    llmq_ops_free(ops);
    llmq_forward_free(f);
}

// 3. One attention case against float64; returns the elements outside the bound. `shift`: the reference is
// computed with a window larger by one (0: the right one); `merge`: with all sequences taken as one.
static int64_t attn_case(struct llmq_ops *ops, struct llmq_ops_attn a, int shift, bool merge) {
    const int64_t T = a.n_seq * a.seqlen, Dq = a.n_head * a.head_dim, Dkv = a.n_head_kv * a.head_dim;
    struct llmq_ops_buf q = alloc_buf(ops, T * Dq), k = alloc_buf(ops, T * Dkv), v = alloc_buf(ops, T * Dkv);
    struct llmq_ops_buf o = alloc_buf(ops, T * Dq);
    double *ex = malloc((size_t)(T * Dq) * sizeof(double)), *bd = malloc((size_t)(T * Dq) * sizeof(double));
    CHECK(ex && bd);
    for (int64_t i = 0; i < T * Dq; i++) q.data[i] = 2.0f * test_frand(&rng);
    for (int64_t i = 0; i < T * Dkv; i++) k.data[i] = 2.0f * test_frand(&rng), v.data[i] = test_frand(&rng);
    CHECK_OK(llmq_ops_attention(ops, &a, &q, &k, &v, &o));
    struct llmq_ops_attn r = a;
    r.window += shift;
    if (merge) r.n_seq = 1, r.seqlen = T;
    CHECK(ops_attn_exact(&r, q.data, k.data, v.data, ex, bd) == 0);
    double worst = 0.0;
    char label[160];
    snprintf(label, sizeof label, "attention %lldx%lld H %lld/%lld Dh %lld window %lld cap %g%s%s", (long long)a.n_seq,
             (long long)a.seqlen, (long long)a.n_head, (long long)a.n_head_kv, (long long)a.head_dim,
             (long long)a.window, a.softcap, shift ? " (wrong window)" : "", merge ? " (sequences merged)" : "");
    const int64_t bad = ops_count_outside(shift || merge ? NULL : label, o.data, ex, bd, T * Dq, &worst);
    printf("%s: max |cpu - f64| / bound = %.3g, %lld outside\n", label, worst, (long long)bad);
    llmq_ops_buf_free(&q), llmq_ops_buf_free(&k), llmq_ops_buf_free(&v), llmq_ops_buf_free(&o);
    free(ex), free(bd);
    return bad;
}

static void test_attention_f64(void) {
    struct llmq_ops *ops = NULL;
    CHECK_OK(llmq_ops_init(LLMQ_BACKEND_CPU, &ops));
    const struct llmq_ops_attn cases[] = {
        {1, 1, 1, 1, 8, 0.35355339f, 0.0f, 0},  {2, 70, 8, 4, 8, 0.35355339f, 0.0f, 0},
        {1, 129, 4, 1, 64, 0.125f, 0.0f, 17},   {1, 200, 2, 2, 128, 0.08838835f, 5.0f, 0},
        {3, 33, 6, 3, 80, 0.1118034f, 0.0f, 1}, {1, 150, 2, 1, 16, 0.25f, 2.0f, 40},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) CHECK(attn_case(ops, cases[i], 0, false) == 0);
    CHECK(attn_case(ops, cases[2], 1, false) > 0); // a window off by one is far outside the bound
    CHECK(attn_case(ops, cases[1], 0, true) > 0);  // so is attending across the sequence boundary
    llmq_ops_free(ops);
}

// 4. Buffers and argument checks.
// AWQ's scale candidate (kernels/ops.h llmq_ops_awq_candidate) against the search's own pipeline spelled out: W · s,
// quant/awq.h llmq_awq_pseudo_quantize (AutoAWQ's grid), / s; with minus_w that less W. Bit for bit, at 2, 4 and 8
// bits, groups of 8 and one group per row, with a constant group (range below 1e-5) and an all-zero row among them.
static void test_awq_candidate(struct llmq_ops *ops) {
    const int64_t R = 5, C = 48;
    float W[5 * 48], s[48], ws[5 * 48], ref[5 * 48], got[5 * 48], dif[5 * 48];
    for (int64_t i = 0; i < R * C; i++) W[i] = 2.0f * test_frand(&rng);
    for (int64_t c = 0; c < C; c++) s[c] = 0.1f + 3.0f * fabsf(test_frand(&rng));
    for (int64_t c = 0; c < 8; c++) W[C + c] = 0.25f; // row 1's first group: constant
    for (int64_t c = 0; c < C; c++) W[3 * C + c] = 0.0f;
    for (int64_t i = 0; i < R * C; i++) ws[i] = W[i] * s[i % C];
    const int bits[3] = {2, 4, 8};
    const int64_t groups[2] = {8, 48};
    struct llmq_ops_buf bw = llmq_ops_buf_host(W, R * C), bs = llmq_ops_buf_host(s, C);
    struct llmq_ops_buf bg = llmq_ops_buf_host(got, R * C), bd = llmq_ops_buf_host(dif, R * C);
    int64_t bad = 0;
    for (int ib = 0; ib < 3; ib++)
        for (int ig = 0; ig < 2; ig++) {
            llmq_awq_pseudo_quantize(ws, R, C, bits[ib], (int)groups[ig], ref);
            for (int64_t i = 0; i < R * C; i++) ref[i] = ref[i] / s[i % C];
            CHECK_OK(llmq_ops_awq_candidate(ops, &bw, &bs, R, C, groups[ig], bits[ib], false, &bg));
            CHECK_OK(llmq_ops_awq_candidate(ops, &bw, &bs, R, C, groups[ig], bits[ib], true, &bd));
            for (int64_t i = 0; i < R * C; i++) {
                const float d = ref[i] - W[i];
                bad += memcmp(&ref[i], &got[i], sizeof(float)) != 0 || memcmp(&d, &dif[i], sizeof(float)) != 0;
            }
        }
    CHECK(bad == 0);
    printf("awq_candidate: Q(W·s)/s and its Δ bit-identical to the search's pipeline (2 / 4 / 8 bits, G 8 / 48)\n");
}

static void test_buffers_and_errors(void) {
    struct llmq_ops *ops = NULL;
    CHECK_OK(llmq_ops_init(LLMQ_BACKEND_CPU, &ops));
    CHECK(llmq_ops_backend(ops) == LLMQ_BACKEND_CPU);
    struct llmq_ops_buf b = alloc_buf(ops, 10);
    CHECK(b.owned && b.n == 10 && b.be == LLMQ_BACKEND_CPU);
    const float src[4] = {1, 2, 3, 4};
    float dst[4] = {0};
    CHECK_OK(llmq_ops_upload(ops, &b, 6, src, 4));
    struct llmq_ops_buf view = llmq_ops_buf_view(&b, 5, 5);
    CHECK(!view.owned && view.n == 5);
    CHECK_OK(llmq_ops_download(ops, dst, &view, 1, 3));
    CHECK(dst[0] == 1 && dst[1] == 2 && dst[2] == 3);
    CHECK_OK(llmq_ops_sync(ops));
    // strided rows: b = {., ., ., ., ., ., 1, 2, 3, 4}; rows of 2 from b[5] every 3 floats: (0, 1), (3, 4)
    b.data[5] = 0;
    float rows[4] = {-1, -1, -1, -1};
    CHECK_OK(llmq_ops_download_rows(ops, rows, &b, 5, 2, 3, 2));
    CHECK(rows[0] == 0 && rows[1] == 1 && rows[2] == 3 && rows[3] == 4);
    CHECK_OK(llmq_ops_download_rows(ops, rows, &b, 10, 2, 3, 0)); // no rows: nothing read
    CHECK_OK(llmq_ops_download_rows(ops, rows, &view, 2, 3, 3, 1));
    CHECK(rows[0] == 2 && rows[1] == 3 && rows[2] == 4);
    // the dot: a running f64 sum from *acc in index order (quant/quantize.c quad_form's loop, bit for bit)
    const float da[5] = {1.5f, -2.25f, 3e-8f, 7.0f, 0.1f}, db[5] = {0.3f, 1e7f, -4.0f, 0.125f, -0.7f};
    struct llmq_ops_buf ba = llmq_ops_buf_host((float *)da, 5), bb = llmq_ops_buf_host((float *)db, 5);
    double got = 0.5, want = 0.5;
    for (int i = 0; i < 5; i++) want += (double)da[i] * (double)db[i];
    CHECK_OK(llmq_ops_dot_f64(ops, &ba, &bb, 5, &got));
    CHECK(memcmp(&got, &want, sizeof got) == 0);

    // the squared difference: the same running sum of (a - b)² (quant/awq.c mse's loop); the copy: exact
    want = got = 0.25;
    for (int i = 0; i < 5; i++) want += ((double)da[i] - (double)db[i]) * ((double)da[i] - (double)db[i]);
    CHECK_OK(llmq_ops_sqdiff_f64(ops, &ba, &bb, 5, &got));
    CHECK(memcmp(&got, &want, sizeof got) == 0);
    CHECK_OK(llmq_ops_copy(ops, &view, &ba, 5));
    CHECK(memcmp(b.data + 5, da, sizeof da) == 0);
    test_awq_candidate(ops);

    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_ops_awq_candidate(ops, &ba, &bb, 1, 5, 2, 4, false, &b) == LLMQ_ERR_ARG); // 2 does not tile 5
    CHECK(llmq_ops_awq_candidate(ops, &ba, &bb, 1, 5, 5, 9, false, &b) == LLMQ_ERR_ARG); // 9 bits
    CHECK(llmq_ops_sqdiff_f64(ops, &ba, &bb, 6, &got) == LLMQ_ERR_ARG);                  // past the end
    CHECK(llmq_ops_dot_f64(ops, &ba, &bb, 6, &got) == LLMQ_ERR_ARG);                     // past the end
    CHECK(llmq_ops_upload(ops, &b, 7, src, 4) == LLMQ_ERR_ARG);                          // past the end
    CHECK_CONTAINS(llmq_last_error(), "holds 10 floats");
    CHECK(llmq_ops_download(ops, dst, &b, -1, 1) == LLMQ_ERR_ARG);
    CHECK(llmq_ops_download_rows(ops, dst, &b, 5, 2, 3, 3) == LLMQ_ERR_ARG); // the third row ends at 13 > 10
    CHECK_CONTAINS(llmq_last_error(), "holds 10 floats");
    CHECK(llmq_ops_download_rows(ops, dst, &b, 0, 3, 2, 2) == LLMQ_ERR_ARG); // a stride below the width
    CHECK(llmq_ops_download_rows(ops, dst, &b, 0, 1, INT64_MAX, 3) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "at a stride of");
    struct llmq_ops_buf none = {0}, fake_dev = {.data = b.data, .n = 10, .be = LLMQ_BACKEND_CUDA};
    CHECK(llmq_ops_buf_alloc(ops, 0, &none) == LLMQ_ERR_ARG && !none.data);
    CHECK(llmq_ops_rmsnorm(ops, &b, &b, &b, 2, 6, 1e-5f, false) == LLMQ_ERR_ARG); // 12 > 10
    CHECK(llmq_ops_rmsnorm(ops, &b, &b, &none, 1, 4, 1e-5f, false) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "empty");
    CHECK(llmq_ops_add(ops, &b, &fake_dev, 4) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "is on cuda");
    CHECK(llmq_ops_rope(ops, &b, 1, 1, 1, 5, false, &b, &b) == LLMQ_ERR_ARG); // odd head_dim
    struct llmq_ops_attn bad = {1, 1, 3, 2, 2, 1.0f, 0.0f, 0};                // 3 heads over 2 kv heads
    CHECK(llmq_ops_attention(ops, &bad, &b, &b, &b, &b) == LLMQ_ERR_ARG);
    bad.n_head = 2, bad.window = -1;
    CHECK(llmq_ops_attention(ops, &bad, &b, &b, &b, &b) == LLMQ_ERR_ARG);
    struct llmq_ops *dev = NULL;
    if (llmq_cuda_device_count(NULL) == 0) {
        CHECK(llmq_ops_init(LLMQ_BACKEND_CUDA, &dev) == LLMQ_ERR_DEVICE && !dev);
        printf("ops on cuda without a device: LLMQ_ERR_DEVICE (%s)\n", llmq_last_error());
    }
    llmq_log_set_level(LLMQ_LOG_INFO);
    llmq_ops_buf_free(&view); // a view: only zeroed
    CHECK(!view.data && b.data);
    llmq_ops_buf_free(&b);
    CHECK(!b.data && !b.owned);
    llmq_ops_buf_free(&b);
    llmq_ops_buf_free(NULL);
    llmq_ops_free(ops);
    llmq_ops_free(NULL);
}

int main(void) {
    openblas_set_num_threads(1); // as inside a forward pass (calib/model/forward.c blas_serial)
    char path[1024];
    test_stories260k(path, sizeof path, "tinyllamas-stories-260k-f32.gguf");
    test_need_file(path);
    struct llmq_model *m = NULL;
    CHECK_OK(llmq_model_load(path, &m));
    test_blocks(m);
    test_rmsnorm(m);
    llmq_model_free(m);
    test_attention_f64();
    test_buffers_and_errors();
    return 0;
}
