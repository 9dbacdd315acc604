/*
 * tests/unit/test_awq.c — quant/awq.h and the sub-block API of calib/model/forward.h.
 *
 *  1. llmq_forward_attn / llmq_forward_mlp / llmq_forward_rmsnorm rebuild llmq_forward_block bit for
 *     bit (x + attn(norm(x)), then + mlp(norm(.))) on every block of stories260K and of a random
 *     qwen2 model with q/k/v biases and no GQA.
 *  2. Folding: with the clip search off, the block's weight set (scaled weights and folded norms / v rows /
 *     v bias / up rows) gives the fp block output within 1e-5 (relative to its max); the model's own block
 *     gives the fp output bit for bit before and after. Scale groups: 3 under GQA (stories260K), 4 without
 *     (the v -> o group).
 *  3. AWQ beats RTN: block output MSE with AWQ (scale + clip, then the AWQ grid) < with RTN (the same
 *     grid on the original weights), on stories260K (group 4) and, when ~/.cache/llmq/smollm2-f32.gguf
 *     exists, on SmolLM2 block 3 (group 64) with wiki.valid.raw tokens.
 *  5. The Gram form of the single-linear groups' loss (v -> o, up -> down; llmq_awq_opts.gram_loss)
 *     picks the same ratio as the output form, with losses within 1e-4 relative, and the same scales;
 *     also through the pluggable quantizer (the path of AWQ into GGUF).
 *  4. Errors: NaN input, a second search, group size 0, a layer out of range. A group size that
 *     does not tile a linear (stories260K's 172-wide ffn_down) makes it per-channel (clip_groups 1).
 */
#include "harness.h"

#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "formats/safetensors.h"
#include "quant/awq.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static float *f32_of(const struct llmq_tensor_view *w) {
    float *p = malloc((size_t)llmq_tensor_nelements(w) * sizeof(float));
    CHECK(p);
    CHECK(llmq_model_weight_f32(w, p, 1) == LLMQ_OK);
    return p;
}

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

static double mse(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return s / (double)n;
}

// x (n_seq * seqlen, D): the fp input of block `layer` for tokens ids (or synthetic ids if NULL).
static float *block_input(struct llmq_forward *f, const struct llmq_model *m, const int32_t *ids, int layer,
                          int64_t n_seq, int64_t seqlen) {
    const int64_t N = n_seq * seqlen, D = m->hp.n_embd;
    int32_t *toks = malloc((size_t)N * sizeof(int32_t));
    float *x = malloc((size_t)(N * D) * sizeof(float));
    CHECK(toks && x);
    for (int64_t i = 0; i < N; i++) toks[i] = ids ? ids[i] : (int32_t)((i * 37 + 3) % m->hp.n_vocab);
    CHECK(llmq_forward_embed(f, toks, N, x) == LLMQ_OK);
    for (int l = 0; l < layer; l++)
        CHECK(llmq_forward_block(f, l, &m->layers[l], x, n_seq, seqlen, NULL, NULL) == LLMQ_OK);
    free(toks);
    return x;
}

// (n_seq * seqlen, D): the fp output of block `layer` for its input x (x is not changed).
static float *block_output(struct llmq_forward *f, const struct llmq_model *m, const float *x, int layer, int64_t n_seq,
                           int64_t seqlen) {
    const size_t bytes = (size_t)(n_seq * seqlen * m->hp.n_embd) * sizeof(float);
    float *ref = malloc(bytes);
    CHECK(ref);
    memcpy(ref, x, bytes);
    CHECK(llmq_forward_block(f, layer, &m->layers[layer], ref, n_seq, seqlen, NULL, NULL) == LLMQ_OK);
    return ref;
}

// ---------------------------------------------------------------------------------------------
// 1. sub-block pieces == block
// ---------------------------------------------------------------------------------------------

static void test_pieces(const struct llmq_model *m, const char *label, int64_t n_seq, int64_t seqlen) {
    const int64_t N = n_seq * seqlen, D = m->hp.n_embd;
    struct llmq_forward *f = NULL;
    CHECK(llmq_forward_init(m, N, 2, &f) == LLMQ_OK);
    float *x = block_input(f, m, NULL, 0, n_seq, seqlen);
    float *xb = malloc((size_t)(N * D) * sizeof(float)), *xn = malloc((size_t)(N * D) * sizeof(float));
    float *out = malloc((size_t)(N * D) * sizeof(float));
    CHECK(xb && xn && out);
    for (int l = 0; l < m->hp.n_layer; l++) {
        memcpy(xb, x, (size_t)(N * D) * sizeof(float));
        CHECK(llmq_forward_block(f, l, &m->layers[l], xb, n_seq, seqlen, NULL, NULL) == LLMQ_OK);
        float *an = f32_of(m->layers[l].attn_norm), *fn = f32_of(m->layers[l].ffn_norm);
        CHECK(llmq_forward_rmsnorm(f, x, N, an, xn) == LLMQ_OK);
        CHECK(llmq_forward_attn(f, l, &m->layers[l], xn, n_seq, seqlen, out) == LLMQ_OK);
        for (int64_t i = 0; i < N * D; i++) x[i] += out[i];
        CHECK(llmq_forward_rmsnorm(f, x, N, fn, xn) == LLMQ_OK);
        CHECK(llmq_forward_mlp(f, l, &m->layers[l], xn, N, out) == LLMQ_OK);
        for (int64_t i = 0; i < N * D; i++) x[i] += out[i];
        CHECK(memcmp(x, xb, (size_t)(N * D) * sizeof(float)) == 0);
        free(an);
        free(fn);
    }
    // argument errors
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_forward_attn(f, (int)m->hp.n_layer, m->layers, xn, n_seq, seqlen, out) == LLMQ_ERR_ARG);
    CHECK(llmq_forward_mlp(f, 0, m->layers, xn, N + 1, out) == LLMQ_ERR_ARG);
    CHECK(llmq_forward_rmsnorm(f, x, 0, xn, out) == LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);
    printf("  %s: attn/mlp/rmsnorm == block on %lld layers (bitwise)\n", label, (long long)m->hp.n_layer);
    free(x);
    free(xb);
    free(xn);
    free(out);
    llmq_forward_free(f);
}

// ---------------------------------------------------------------------------------------------
// 2. folding preserves the fp block; 3. AWQ < RTN
// ---------------------------------------------------------------------------------------------

static void test_fold(struct llmq_model *m, const char *label, int layer, int group, int want_groups) {
    const int64_t n_seq = 2, seqlen = 48, N = n_seq * seqlen, D = m->hp.n_embd;
    struct llmq_forward *f = NULL;
    CHECK(llmq_forward_init(m, N, 2, &f) == LLMQ_OK);
    float *x = block_input(f, m, NULL, layer, n_seq, seqlen), *ref = block_output(f, m, x, layer, n_seq, seqlen);
    float *y = malloc((size_t)(N * D) * sizeof(float));
    CHECK(y);

    struct llmq_awq_opts o;
    llmq_awq_opts_default(&o);
    o.group_size = group;
    o.clip = false;
    struct llmq_awq_block *b = NULL;
    CHECK(llmq_awq_block_init(m, layer, 1, &b) == LLMQ_OK);
    CHECK(llmq_awq_search(b, f, x, n_seq, seqlen, &o) == LLMQ_OK);
    CHECK_EQ_INT(b->n_groups, want_groups);
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) CHECK(b->clip[l] == NULL);
    CHECK(llmq_awq_input_scales(b, LLMQ_LIN_Q) == b->groups[0].scales);
    CHECK((llmq_awq_input_scales(b, LLMQ_LIN_O) != NULL) == (want_groups == 4));
    // the search leaves the model as it was
    memcpy(y, x, (size_t)(N * D) * sizeof(float));
    CHECK(llmq_forward_block(f, layer, &m->layers[layer], y, n_seq, seqlen, NULL, NULL) == LLMQ_OK);
    CHECK(memcmp(y, ref, (size_t)(N * D) * sizeof(float)) == 0);

    memcpy(y, x, (size_t)(N * D) * sizeof(float));
    CHECK(llmq_forward_block(f, layer, &b->ly, y, n_seq, seqlen, NULL, NULL) == LLMQ_OK);
    const double rel = max_diff(y, ref, N * D) / max_abs(ref, N * D);
    printf("  %s layer %d: %d scale groups (ratios", label, layer, b->n_groups);
    for (int g = 0; g < b->n_groups; g++) printf(" %.2f", (double)b->groups[g].ratio);
    printf("); folded fp block vs original: max |diff| / max |out| = %.2e\n", rel);
    CHECK(rel < 1e-5);
    memcpy(y, x, (size_t)(N * D) * sizeof(float));
    CHECK(llmq_forward_block(f, layer, &m->layers[layer], y, n_seq, seqlen, NULL, NULL) == LLMQ_OK);
    CHECK(memcmp(y, ref, (size_t)(N * D) * sizeof(float)) == 0);

    // the scaled Hessian helper: H' = diag(1/s) H diag(1/s)
    const int64_t C = D;
    float *H = malloc((size_t)(C * C) * sizeof(float));
    CHECK(H);
    for (int64_t i = 0; i < C * C; i++) H[i] = 1.0f;
    llmq_awq_scale_hessian(b, LLMQ_LIN_GATE, H);
    const float *s = llmq_awq_input_scales(b, LLMQ_LIN_GATE);
    CHECK(fabsf(H[1 * C + 2] - 1.0f / (s[1] * s[2])) <= 1e-6f * fabsf(H[1 * C + 2]));
    free(H);

    // errors: a second search, NaN input, group size 0, a layer out of range
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_awq_search(b, f, x, n_seq, seqlen, &o) == LLMQ_ERR_ARG);
    llmq_awq_block_free(b);
    b = NULL;
    CHECK(llmq_awq_block_init(m, layer, 1, &b) == LLMQ_OK);
    x[5] = NAN;
    CHECK(llmq_awq_search(b, f, x, n_seq, seqlen, &o) == LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "block input");
    x[5] = 0.0f;
    o.group_size = 0;
    CHECK(llmq_awq_search(b, f, x, n_seq, seqlen, &o) == LLMQ_ERR_ARG);
    struct llmq_awq_block *none = NULL;
    CHECK(llmq_awq_block_init(m, (int)m->hp.n_layer, 1, &none) == LLMQ_ERR_ARG && none == NULL);
    llmq_log_set_level(LLMQ_LOG_INFO);
    llmq_awq_block_free(b);

    // a group size that tiles some linears and not others: those are searched per channel
    if (group > 0) {
        b = NULL;
        CHECK(llmq_awq_block_init(m, layer, 1, &b) == LLMQ_OK);
        o.group_size = 2 * group;
        o.clip = true;
        CHECK(llmq_awq_search(b, f, x, n_seq, seqlen, &o) == LLMQ_OK);
        for (int l = 0; l < LLMQ_LIN_COUNT; l++) {
            const int64_t C = m->layers[layer].w[l]->shape[1];
            const int64_t want = l == LLMQ_LIN_Q || l == LLMQ_LIN_K ? 0 : C % (2 * group) ? 1 : C / (2 * group);
            CHECK_EQ_INT(b->clip_groups[l], want);
        }
        llmq_awq_block_free(b);
    }
    free(x);
    free(ref);
    free(y);
    llmq_forward_free(f);
}

// The pluggable quantizer (llmq_awq_opts.fake_quant): plugging in the default grid itself, through the
// callback and the per-linear group sizes, gives the very same search (scales, clips, weights).
struct plug {
    int bits, G;
    int64_t calls, bad;
};

static void plug_grid(void *user, int layer, enum llmq_linear lin, int64_t rows, int64_t c0, int64_t n, const float *s,
                      const float *w, float *out) {
    (void)layer, (void)lin, (void)s;
    struct plug *p = user;
    p->calls++;
    if (rows < 1 || n < p->G || n % p->G || c0 % p->G) p->bad++;
    llmq_awq_pseudo_quantize(w, rows, n, p->bits, p->G, out);
}

static void test_plugged_quantizer(struct llmq_model *m, const char *label, int layer, int group) {
    const int64_t n_seq = 2, seqlen = 32, N = n_seq * seqlen;
    struct llmq_forward *f = NULL;
    CHECK(llmq_forward_init(m, N, 2, &f) == LLMQ_OK);
    float *x = block_input(f, m, NULL, layer, n_seq, seqlen);
    struct llmq_awq_opts o;
    llmq_awq_opts_default(&o);
    o.group_size = group;
    o.bits = 3;
    struct llmq_awq_block *a = NULL, *b = NULL;
    CHECK(llmq_awq_block_init(m, layer, 1, &a) == LLMQ_OK && llmq_awq_block_init(m, layer, 1, &b) == LLMQ_OK);
    CHECK(llmq_awq_search(a, f, x, n_seq, seqlen, &o) == LLMQ_OK);
    struct plug p = {.bits = o.bits, .G = group};
    o.fake_quant = plug_grid;
    o.fake_quant_user = &p;
    o.group_size = 1000003; // unused: every linear takes its lin_group_size
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) {
        CHECK(m->layers[layer].w[l]->shape[1] % group == 0); // (the test needs a group that tiles every C)
        o.lin_group_size[l] = group;
    }
    CHECK(llmq_awq_search(b, f, x, n_seq, seqlen, &o) == LLMQ_OK);
    CHECK(p.calls > 0 && p.bad == 0);
    CHECK_EQ_INT(b->n_groups, a->n_groups);
    for (int g = 0; g < a->n_groups; g++) {
        CHECK_EQ_INT(b->groups[g].best, a->groups[g].best);
        CHECK(memcmp(b->groups[g].scales, a->groups[g].scales, (size_t)a->groups[g].C * sizeof(float)) == 0);
    }
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) {
        const int64_t R = m->layers[layer].w[l]->shape[0], C = m->layers[layer].w[l]->shape[1];
        CHECK_EQ_INT(b->clip_groups[l], a->clip_groups[l]);
        if (a->clip[l]) CHECK(memcmp(b->clip[l], a->clip[l], (size_t)(R * a->clip_groups[l]) * sizeof(float)) == 0);
        CHECK(memcmp(b->w[l], a->w[l], (size_t)(R * C) * sizeof(float)) == 0);
    }
    printf("  %s layer %d: plugged-in grid quantizer (%lld calls) = built-in grid, bit for bit\n", label, layer,
           (long long)p.calls);
    llmq_awq_block_free(a);
    llmq_awq_block_free(b);
    free(x);
    llmq_forward_free(f);
}

// Block output MSE vs the fp block with all 7 linears fake-quantized, after AWQ (awq = true) or RTN.
static double quantized_block_mse(struct llmq_model *m, struct llmq_forward *f, const float *x, const float *ref,
                                  int layer, int64_t n_seq, int64_t seqlen, const struct llmq_awq_opts *o, bool awq,
                                  double *seconds) {
    const int64_t N = n_seq * seqlen, D = m->hp.n_embd;
    struct llmq_awq_block *b = NULL;
    CHECK(llmq_awq_block_init(m, layer, 1, &b) == LLMQ_OK);
    if (awq) {
        CHECK(llmq_awq_search(b, f, x, n_seq, seqlen, o) == LLMQ_OK);
        if (seconds) *seconds = b->seconds_scale + b->seconds_clip;
    }
    for (int l = 0; l < LLMQ_LIN_COUNT; l++) {
        const int64_t R = m->layers[layer].w[l]->shape[0], C = m->layers[layer].w[l]->shape[1];
        llmq_awq_pseudo_quantize(b->w[l], R, C, o->bits, o->group_size, b->w[l]);
    }
    float *y = malloc((size_t)(N * D) * sizeof(float));
    CHECK(y);
    memcpy(y, x, (size_t)(N * D) * sizeof(float));
    CHECK(llmq_forward_block(f, layer, &b->ly, y, n_seq, seqlen, NULL, NULL) == LLMQ_OK);
    double e = mse(y, ref, N * D);
    free(y);
    llmq_awq_block_free(b);
    return e;
}

static void test_awq_beats_rtn(struct llmq_model *m, const char *label, const int32_t *ids, int layer, int64_t n_seq,
                               int64_t seqlen, int group, int bits) {
    const int64_t N = n_seq * seqlen;
    struct llmq_forward *f = NULL;
    CHECK(llmq_forward_init(m, N, 2, &f) == LLMQ_OK);
    float *x = block_input(f, m, ids, layer, n_seq, seqlen), *ref = block_output(f, m, x, layer, n_seq, seqlen);
    struct llmq_awq_opts o;
    llmq_awq_opts_default(&o);
    o.group_size = group;
    o.bits = bits;
    double secs = 0;
    const double rtn = quantized_block_mse(m, f, x, ref, layer, n_seq, seqlen, &o, false, NULL);
    const double awq = quantized_block_mse(m, f, x, ref, layer, n_seq, seqlen, &o, true, &secs);
    printf(
        "  %s layer %d, %lld tokens, %d-bit g%d: block output MSE RTN %.6g, AWQ %.6g (%.1f%% of RTN; search %.2f s)\n",
        label, layer, (long long)N, bits, group, rtn, awq, 100.0 * awq / rtn, secs);
    CHECK(awq < rtn);
    free(x);
    free(ref);
    llmq_forward_free(f);
}

// plugged: through the pluggable quantizer (the path of AWQ into GGUF), the default grid plugged in.
static void test_gram_loss(struct llmq_model *m, const char *label, const int32_t *ids, int layer, int64_t n_seq,
                           int64_t seqlen, int group, bool plugged) {
    const int64_t N = n_seq * seqlen;
    struct llmq_forward *f = NULL;
    CHECK(llmq_forward_init(m, N, 2, &f) == LLMQ_OK);
    float *x = block_input(f, m, ids, layer, n_seq, seqlen);
    struct llmq_awq_block *b[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        struct llmq_awq_opts o;
        llmq_awq_opts_default(&o);
        o.group_size = group;
        o.clip = false;
        o.gram_loss = k; // 0: from the outputs, 1: tr(ΔW XᵀX ΔWᵀ)
        struct plug p = {.bits = o.bits, .G = group};
        if (plugged) {
            o.fake_quant = plug_grid;
            o.fake_quant_user = &p;
            for (int l = 0; l < LLMQ_LIN_COUNT; l++) o.lin_group_size[l] = group;
        }
        CHECK(llmq_awq_block_init(m, layer, 1, &b[k]) == LLMQ_OK);
        CHECK(llmq_awq_search(b[k], f, x, n_seq, seqlen, &o) == LLMQ_OK);
        CHECK(!plugged || (p.calls > 0 && p.bad == 0));
    }
    CHECK_EQ_INT(b[0]->n_groups, b[1]->n_groups);
    int single = 0;
    for (int gi = 0; gi < b[0]->n_groups; gi++) {
        const struct llmq_awq_group *g0 = &b[0]->groups[gi], *g1 = &b[1]->groups[gi];
        CHECK_EQ_INT(g0->best, g1->best);
        double worst = 0;
        for (int i = 0; i < 20; i++) worst = fmax(worst, fabs(g0->loss[i] - g1->loss[i]) / fmax(g0->loss[i], 1e-30));
        if (g0->prev == LLMQ_AWQ_PREV_V || g0->prev == LLMQ_AWQ_PREV_UP) {
            single++;
            printf("  %s layer %d group %d%s: ratio %.2f both ways, Gram vs output loss max rel diff %.2e\n", label,
                   layer, gi, plugged ? " (plugged quantizer)" : "", (double)g0->ratio, worst);
        }
        CHECK(worst < 1e-4);
        CHECK(memcmp(g0->scales, g1->scales, (size_t)g0->C * sizeof(float)) == 0);
    }
    CHECK(single >= 1);
    llmq_awq_block_free(b[0]);
    llmq_awq_block_free(b[1]);
    free(x);
    llmq_forward_free(f);
}

// ---------------------------------------------------------------------------------------------
// A random qwen2 model with q/k/v biases and no GQA (so the v -> o group exists)
// ---------------------------------------------------------------------------------------------

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(float scale) { return scale * test_frand(&rng); } // uniform [-scale, scale)

static void write_qwen2(const char *dir) {
    const int64_t D = 32, F = 64, L = 2, V = 64;
    mkdir(dir, 0755);
    char *p = llmq_path_join(dir, "config.json");
    FILE *fp = fopen(p, "wb");
    CHECK(fp);
    fprintf(fp,
            "{\"model_type\": \"qwen2\", \"hidden_size\": %lld, \"intermediate_size\": %lld, "
            "\"num_hidden_layers\": %lld, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
            "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"vocab_size\": %lld, \"tie_word_embeddings\": true}",
            (long long)D, (long long)F, (long long)L, (long long)V);
    fclose(fp);
    free(p);
    struct {
        char name[96];
        int nd;
        int64_t shape[2];
        float scale, base;
    } t[64];
    int n = 0;
#define ADD(nm_, nd_, r_, c_, sc_, b_)                                                                                 \
    do {                                                                                                               \
        snprintf(t[n].name, sizeof t[n].name, "%s", nm_);                                                              \
        t[n].nd = nd_;                                                                                                 \
        t[n].shape[0] = r_;                                                                                            \
        t[n].shape[1] = c_;                                                                                            \
        t[n].scale = sc_;                                                                                              \
        t[n].base = b_;                                                                                                \
        n++;                                                                                                           \
    } while (0)
    ADD("model.embed_tokens.weight", 2, V, D, 1.0f, 0.0f);
    ADD("model.norm.weight", 1, D, 1, 0.2f, 1.0f);
    const char *lin[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const int64_t shp[7][2] = {{D, D}, {D, D}, {D, D}, {D, D}, {F, D}, {F, D}, {D, F}};
    char nm[96];
    for (int64_t l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "model.layers.%lld.input_layernorm.weight", (long long)l);
        ADD(nm, 1, D, 1, 0.2f, 1.0f);
        snprintf(nm, sizeof nm, "model.layers.%lld.post_attention_layernorm.weight", (long long)l);
        ADD(nm, 1, D, 1, 0.2f, 1.0f);
        for (int k = 0; k < 7; k++) {
            snprintf(nm, sizeof nm, "model.layers.%lld.%s.weight", (long long)l, lin[k]);
            ADD(nm, 2, shp[k][0], shp[k][1], 1.5f / sqrtf((float)shp[k][1]), 0.0f);
            if (k < 3) {
                snprintf(nm, sizeof nm, "model.layers.%lld.%s.bias", (long long)l, lin[k]);
                ADD(nm, 1, shp[k][0], 1, 0.5f, 0.0f);
            }
        }
    }
#undef ADD
    struct llmq_st_writer *w = NULL;
    CHECK(llmq_st_writer_init(dir, 0, &w) == LLMQ_OK);
    for (int i = 0; i < n; i++)
        CHECK(llmq_st_writer_add_tensor(w, t[i].name, LLMQ_DTYPE_F32, t[i].nd, t[i].shape) == LLMQ_OK);
    for (int i = 0; i < n; i++) {
        const int64_t cnt = t[i].shape[0] * (t[i].nd > 1 ? t[i].shape[1] : 1);
        float *d = malloc((size_t)cnt * sizeof(float));
        CHECK(d);
        for (int64_t j = 0; j < cnt; j++) d[j] = t[i].base + frand(t[i].scale);
        // a few channels with large activations, as real models have (AWQ's premise)
        if (strcmp(t[i].name, "model.embed_tokens.weight") == 0)
            for (int64_t r = 0; r < V; r++) d[r * D + 3] *= 8.0f;
        CHECK(llmq_st_writer_write_tensor(w, t[i].name, d, (size_t)cnt * sizeof(float)) == LLMQ_OK);
        free(d);
    }
    CHECK(llmq_st_writer_finish(w) == LLMQ_OK);
}

static void rm_dir(const char *dir) {
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *p = llmq_path_join(dir, files[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
}

// The checks of sections 1-3 on model m: the pieces on pieces_seq sequences of pieces_len synthetic tokens; on block
// `layer` with groups of `group` columns: folding (want_groups scale groups), the plugged quantizer, AWQ < RTN at 3
// bits and the Gram-form loss, both on 2 sequences of `seqlen` synthetic tokens.
static void test_model(struct llmq_model *m, const char *label, int64_t pieces_seq, int64_t pieces_len, int layer,
                       int group, int want_groups, int64_t seqlen) {
    test_pieces(m, label, pieces_seq, pieces_len);
    test_fold(m, label, layer, group, want_groups);
    test_plugged_quantizer(m, label, layer, group);
    test_awq_beats_rtn(m, label, NULL, layer, 2, seqlen, group, 3);
    test_gram_loss(m, label, NULL, layer, 2, seqlen, group, false);
    test_gram_loss(m, label, NULL, layer, 2, seqlen, group, true);
}

int main(void) {
    char stories[1024], wiki[1024], smol[1024];
    test_stories260k(stories, sizeof stories, "tinyllamas-stories-260k-f32.gguf");
    snprintf(wiki, sizeof wiki, "%s/wikitext-2-raw/wiki.valid.raw", test_data_dir());
    const char *cache = getenv("LLMQ_CACHE");
    if (cache && *cache)
        snprintf(smol, sizeof smol, "%s/smollm2-f32.gguf", cache);
    else
        snprintf(smol, sizeof smol, "%s/.cache/llmq/smollm2-f32.gguf", getenv("HOME") ? getenv("HOME") : ".");
    test_need_file(stories);
    struct llmq_model *m = NULL;
    CHECK(llmq_model_load(stories, &m) == LLMQ_OK);
    test_model(m, "stories260K", 2, 40, 2, 4, 3, 64);
    llmq_model_free(m);

    char tmp[] = "/tmp/llmq_test_awq.XXXXXX";
    CHECK(mkdtemp(tmp));
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/qwen2", tmp);
    write_qwen2(dir);
    CHECK(llmq_model_load(dir, &m) == LLMQ_OK);
    CHECK(m->hp.qkv_bias && m->hp.n_head == m->hp.n_head_kv);
    test_model(m, "random qwen2 (bias, no GQA)", 3, 17, 1, 8, 4, 32);
    llmq_model_free(m);
    rm_dir(dir);
    rmdir(tmp);

    if (llmq_file_exists(smol) && llmq_file_exists(wiki)) {
        CHECK(llmq_model_load(smol, &m) == LLMQ_OK);
        char *text = NULL;
        size_t size = 0;
        int32_t *ids = NULL;
        int64_t n_ids = 0;
        CHECK(llmq_read_file(wiki, 1u << 26, &text, &size) == LLMQ_OK);
        CHECK(llmq_tokenize(m->tok, text, size < 20000 ? size : 20000, false, false, &ids, &n_ids) == LLMQ_OK);
        CHECK(n_ids >= 256);
        test_awq_beats_rtn(m, "SmolLM2-135M", ids, 3, 2, 128, 64, 4);
        test_gram_loss(m, "SmolLM2-135M", ids, 3, 2, 128, 64, false);
        free(ids);
        free(text);
        llmq_model_free(m);
    } else {
        printf("  (SmolLM2: %s not found, its AWQ-vs-RTN check skipped; see tests/py/test_awq_oracle.py)\n", smol);
    }
    printf("test_awq: OK\n");
    return 0;
}
