// tests/unit/test_gguf_mix.c — quant/gguf_mix.h on synthetic tensor lists (llama.cpp's rules written out
// by hand: use_more_bits layers, n/8 and n/16 bumps, the attn_v counter and how manual overrides skip it,
// n_gqa, 70B, tied output, fallbacks down to F16, pure, output / embedding types, parsing), then
// quant/gguf_export.h on stories260K: linears handed over as f32 or encoded bytes, in any order and from
// an HF directory (q/k rows permuted by the writer), give the bytes of the plain rtn export; refusals
// change nothing; abort and dry runs leave nothing. The comparisons with llama.cpp itself are in
// tests/py/test_gguf_mix.py.
#include "harness.h"

#include "calib/model/model.h"
#include "common/io.h"
#include "common/log.h"
#include "formats/convert/convert.h"
#include "formats/ggml/encode.h"
#include "quant/gguf_export.h"
#include "quant/gguf_mix.h"

#include <stdint.h>
#include <unistd.h>

// ---- synthetic models ---------------------------------------------------------------------------------

#define MAXT 1024
static struct llmq_gguf_mix_tensor T[MAXT];
static struct llmq_gguf_mix_choice R[MAXT];
static char names[MAXT][64];
static int nt;

static void add(const char *name, int64_t rows, int64_t cols, int n_dims) {
    snprintf(names[nt], 64, "%s", name);
    T[nt] = (struct llmq_gguf_mix_tensor){.name = names[nt], .n_dims = n_dims, .src_type = LLMQ_DTYPE_F32};
    T[nt].shape[0] = n_dims == 1 ? cols : rows;
    T[nt].shape[1] = cols;
    nt++;
}

// A llama model in llama.cpp's file order: D hidden, F ffn, L blocks, kv rows of k/v, tied or not.
static void model(int64_t D, int64_t F, int L, int64_t kv, bool tied) {
    char b[64];
    static const char *const blk[] = {"attn_k",   "attn_norm", "attn_output", "attn_q", "attn_v",
                                      "ffn_down", "ffn_gate",  "ffn_norm",    "ffn_up"};
    nt = 0;
    if (!tied) add("output.weight", 32000, D, 2);
    add("output_norm.weight", 1, D, 1);
    add("token_embd.weight", 32000, D, 2);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 9; k++) {
            snprintf(b, sizeof b, "blk.%d.%s.weight", l, blk[k]);
            if (k == 1 || k == 7)
                add(b, 1, D, 1);
            else if (k == 0 || k == 4)
                add(b, kv, D, 2);
            else if (k == 2 || k == 3)
                add(b, D, D, 2);
            else if (k == 5)
                add(b, D, F, 2);
            else
                add(b, F, D, 2);
        }
}

static int find(const char *name) {
    for (int i = 0; i < nt; i++)
        if (!strcmp(T[i].name, name)) return i;
    fprintf(stderr, "no tensor %s\n", name);
    exit(1);
}

static enum llmq_dtype type_of(const char *fmt, int l) {
    char b[64];
    snprintf(b, sizeof b, fmt, l);
    return R[find(b)].type;
}

static void plan(enum llmq_gguf_ftype f, int64_t n_head, int64_t n_head_kv, int L,
                 const struct llmq_gguf_mix_opts *base) {
    struct llmq_gguf_mix_opts o = base ? *base : llmq_gguf_mix_default_opts();
    struct llmq_gguf_mix_model mm = {.n_layer = L, .n_head = n_head, .n_head_kv = n_head_kv};
    o.ftype = f;
    mm.is_70b = L == 80 && n_head != n_head_kv;
    CHECK_OK(llmq_gguf_mix_plan(&mm, &o, nt, T, R));
}

static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static void test_parse_and_order(void) {
    enum llmq_gguf_ftype f;
    CHECK(llmq_gguf_ftype_parse("q4_k_m", &f) && f == LLMQ_GGUF_FTYPE_Q4_K_M);
    CHECK(llmq_gguf_ftype_parse("Q4_K", &f) && f == LLMQ_GGUF_FTYPE_Q4_K_M);
    CHECK(llmq_gguf_ftype_parse("iq4_xs", &f) && f == 30);
    CHECK(llmq_gguf_ftype_parse("BF16", &f) && f == 32);
    CHECK(!llmq_gguf_ftype_parse("Q4_K_X", &f) && !llmq_gguf_ftype_parse("", &f));
    CHECK(!strcmp(llmq_gguf_ftype_name(LLMQ_GGUF_FTYPE_Q3_K_L), "Q3_K_L"));
    CHECK(llmq_gguf_ftype_default_type(LLMQ_GGUF_FTYPE_Q3_K_L) == LLMQ_DTYPE_Q3_K);
    CHECK(llmq_gguf_ftype_default_type(LLMQ_GGUF_FTYPE_IQ4_XS) == LLMQ_DTYPE_IQ4_XS);
    CHECK(llmq_gguf_ftype_default_type((enum llmq_gguf_ftype)5) == LLMQ_DTYPE_INVALID);
    // llama_model_loader's weight_name_comparer
    const char *in[] = {"blk.10.attn_k.weight",   "blk.2.ffn_up.weight", "token_embd.weight", "output_norm.weight",
                        "blk.2.attn_norm.weight", "output.weight",       "rope_freqs.weight"};
    const char *want[] = {"output.weight",          "output_norm.weight",  "rope_freqs.weight",   "token_embd.weight",
                          "blk.2.attn_norm.weight", "blk.2.ffn_up.weight", "blk.10.attn_k.weight"};
    for (int i = 0; i < 7; i++)
        for (int j = i + 1; j < 7; j++) {
            if (llmq_gguf_mix_name_cmp(in[j], in[i]) < 0) {
                const char *t = in[i];
                in[i] = in[j];
                in[j] = t;
            }
        }
    for (int i = 0; i < 7; i++) CHECK(!strcmp(in[i], want[i]));
    struct llmq_gguf_tensor_type tt;
    CHECK_OK(llmq_gguf_tensor_type_parse("FFN_Down=Q8_0", &tt));
    CHECK(!strcmp(tt.regex, "ffn_down") && tt.type == LLMQ_DTYPE_Q8_0);
    free((char *)tt.regex);
    CHECK(llmq_gguf_tensor_type_parse("ffn_down", &tt) == LLMQ_ERR_ARG);
    CHECK(llmq_gguf_tensor_type_parse("=q8_0", &tt) == LLMQ_ERR_ARG);
    CHECK(llmq_gguf_tensor_type_parse("a(b=q8_0", &tt) == LLMQ_ERR_ARG);
    CHECK(llmq_gguf_tensor_type_parse("a=q9", &tt) == LLMQ_ERR_ARG);
    CHECK(llmq_gguf_tensor_type_parse("a=iq2_xxs", &tt) == LLMQ_ERR_UNSUPPORTED);
}

static void test_layer_rules(void) {
    model(4096, 11008, 32, 1024, false); // every row tiles 256: no fallback
    plan(LLMQ_GGUF_FTYPE_Q4_K_M, 32, 8, 32, NULL);
    CHECK(R[find("output.weight")].type == LLMQ_DTYPE_Q6_K);
    CHECK(R[find("token_embd.weight")].type == LLMQ_DTYPE_Q4_K);
    CHECK(R[find("output_norm.weight")].type == LLMQ_DTYPE_F32 && !R[find("output_norm.weight")].quantized);
    for (int l = 0; l < 32; l++) {
        enum llmq_dtype want = more_bits(l, 32) ? LLMQ_DTYPE_Q6_K : LLMQ_DTYPE_Q4_K;
        CHECK(type_of("blk.%d.attn_v.weight", l) == want);
        CHECK(type_of("blk.%d.ffn_down.weight", l) == want);
        CHECK(type_of("blk.%d.attn_q.weight", l) == LLMQ_DTYPE_Q4_K);
        CHECK(type_of("blk.%d.ffn_up.weight", l) == LLMQ_DTYPE_Q4_K);
        CHECK(type_of("blk.%d.attn_norm.weight", l) == LLMQ_DTYPE_F32);
    }
    plan(LLMQ_GGUF_FTYPE_Q3_K_M, 32, 8, 32, NULL);
    for (int l = 0; l < 32; l++) {
        CHECK(type_of("blk.%d.attn_v.weight", l) == (l < 2 ? LLMQ_DTYPE_Q5_K : LLMQ_DTYPE_Q4_K));
        CHECK(type_of("blk.%d.ffn_down.weight", l) == (l < 2 ? LLMQ_DTYPE_Q5_K : LLMQ_DTYPE_Q4_K));
        CHECK(type_of("blk.%d.attn_output.weight", l) == LLMQ_DTYPE_Q4_K);
        CHECK(type_of("blk.%d.ffn_gate.weight", l) == LLMQ_DTYPE_Q3_K);
    }
    plan(LLMQ_GGUF_FTYPE_Q2_K, 32, 8, 32, NULL); // n_gqa 4
    CHECK(type_of("blk.%d.attn_v.weight", 5) == LLMQ_DTYPE_Q4_K);
    CHECK(type_of("blk.%d.ffn_down.weight", 5) == LLMQ_DTYPE_Q3_K);
    CHECK(type_of("blk.%d.attn_output.weight", 5) == LLMQ_DTYPE_Q3_K);
    CHECK(type_of("blk.%d.attn_k.weight", 5) == LLMQ_DTYPE_Q2_K);
    plan(LLMQ_GGUF_FTYPE_Q2_K, 32, 16, 32, NULL); // n_gqa 2
    CHECK(type_of("blk.%d.attn_v.weight", 5) == LLMQ_DTYPE_Q3_K);
    plan(LLMQ_GGUF_FTYPE_Q4_K_S, 32, 8, 32, NULL);
    for (int l = 0; l < 32; l++) {
        CHECK(type_of("blk.%d.attn_v.weight", l) == (l < 4 ? LLMQ_DTYPE_Q5_K : LLMQ_DTYPE_Q4_K));
        CHECK(type_of("blk.%d.ffn_down.weight", l) == (l < 4 ? LLMQ_DTYPE_Q5_K : LLMQ_DTYPE_Q4_K));
    }
    // IQ4_XS: n_gqa >= 4 bumps attn_v; ffn_down below n/8 only without an imatrix
    struct llmq_gguf_mix_opts im = llmq_gguf_mix_default_opts();
    im.have_imatrix = true;
    plan(LLMQ_GGUF_FTYPE_IQ4_XS, 32, 8, 32, NULL);
    CHECK(type_of("blk.%d.attn_v.weight", 9) == LLMQ_DTYPE_Q5_K);
    CHECK(type_of("blk.%d.ffn_down.weight", 3) == LLMQ_DTYPE_Q5_K &&
          type_of("blk.%d.ffn_down.weight", 4) == LLMQ_DTYPE_IQ4_XS);
    plan(LLMQ_GGUF_FTYPE_IQ4_XS, 32, 8, 32, &im);
    CHECK(type_of("blk.%d.ffn_down.weight", 3) == LLMQ_DTYPE_IQ4_XS);
    plan(LLMQ_GGUF_FTYPE_IQ4_XS, 32, 32, 32, NULL);
    CHECK(type_of("blk.%d.attn_v.weight", 9) == LLMQ_DTYPE_IQ4_XS);
    // Q4_0 / Q5_0 with an imatrix: Q4_1 / Q5_1 ffn_down below n/8
    plan(LLMQ_GGUF_FTYPE_Q4_0, 32, 8, 32, &im);
    CHECK(type_of("blk.%d.ffn_down.weight", 3) == LLMQ_DTYPE_Q4_1 &&
          type_of("blk.%d.ffn_down.weight", 4) == LLMQ_DTYPE_Q4_0);
    CHECK(R[find("output.weight")].type == LLMQ_DTYPE_Q6_K);
    plan(LLMQ_GGUF_FTYPE_Q5_0, 32, 8, 32, NULL);
    CHECK(type_of("blk.%d.ffn_down.weight", 0) == LLMQ_DTYPE_Q5_0);
    plan(LLMQ_GGUF_FTYPE_Q8_0, 32, 8, 32, NULL);
    CHECK(R[find("output.weight")].type == LLMQ_DTYPE_Q8_0);
    // 70B (80 blocks, GQA): Q3_K / Q4_K attn_v become Q5_K
    model(1024, 2816, 80, 128, false);
    plan(LLMQ_GGUF_FTYPE_Q3_K_M, 64, 8, 80, NULL);
    for (int l = 0; l < 80; l++) CHECK(type_of("blk.%d.attn_v.weight", l) == LLMQ_DTYPE_Q5_K);
    CHECK(type_of("blk.%d.ffn_down.weight", 4) == LLMQ_DTYPE_Q5_K &&
          type_of("blk.%d.ffn_down.weight", 5) == LLMQ_DTYPE_Q4_K);
    plan(LLMQ_GGUF_FTYPE_Q3_K_M, 64, 64, 80, NULL); // 65B: no bump
    CHECK(type_of("blk.%d.attn_v.weight", 9) == LLMQ_DTYPE_Q4_K);
}

static void test_fallbacks_tied_pure_overrides(void) {
    model(576, 1536, 30, 192, true); // SmolLM2: 576 tiles 32 only, tied embeddings
    plan(LLMQ_GGUF_FTYPE_Q4_K_M, 9, 3, 30, NULL);
    struct llmq_gguf_mix_choice *c = &R[find("blk.0.attn_q.weight")];
    CHECK(c->type == LLMQ_DTYPE_Q5_0 && c->wanted == LLMQ_DTYPE_Q4_K && c->fallback);
    CHECK_CONTAINS(c->note, "ncols 576 not divisible by 256 (q4_k) -> q5_0");
    CHECK(type_of("blk.%d.attn_v.weight", 0) == LLMQ_DTYPE_Q8_0); // Q6_K -> Q8_0
    CHECK(type_of("blk.%d.ffn_down.weight", 0) == LLMQ_DTYPE_Q6_K && !R[find("blk.0.ffn_down.weight")].fallback);
    CHECK(R[find("token_embd.weight")].type == LLMQ_DTYPE_Q8_0); // tied: output rule, 576 % 256 -> Q8_0
    plan(LLMQ_GGUF_FTYPE_Q4_0, 9, 3, 30, NULL);
    CHECK(R[find("token_embd.weight")].type == LLMQ_DTYPE_Q8_0); // Q6_K, then its fallback Q8_0
    CHECK(R[find("token_embd.weight")].wanted == LLMQ_DTYPE_Q6_K);
    plan(LLMQ_GGUF_FTYPE_Q3_K_S, 9, 3, 30, NULL);
    CHECK(type_of("blk.%d.ffn_gate.weight", 0) == LLMQ_DTYPE_Q4_0 &&
          type_of("blk.%d.ffn_down.weight", 0) == LLMQ_DTYPE_Q3_K);
    plan(LLMQ_GGUF_FTYPE_IQ4_XS, 9, 3, 30, NULL);
    CHECK(type_of("blk.%d.ffn_gate.weight", 0) == LLMQ_DTYPE_IQ4_NL);
    plan(LLMQ_GGUF_FTYPE_Q5_K_S, 9, 3, 30, NULL);
    CHECK(type_of("blk.%d.ffn_gate.weight", 0) == LLMQ_DTYPE_Q5_1);
    plan(LLMQ_GGUF_FTYPE_F16, 9, 3, 30, NULL);
    CHECK(R[find("token_embd.weight")].type == LLMQ_DTYPE_F16 && type_of("blk.%d.attn_v.weight", 3) == LLMQ_DTYPE_F16);
    CHECK(type_of("blk.%d.ffn_norm.weight", 3) == LLMQ_DTYPE_F32);

    // stories260K: 172-wide ffn_down tiles nothing -> F16
    model(64, 172, 5, 32, false);
    plan(LLMQ_GGUF_FTYPE_Q4_0, 8, 4, 5, NULL);
    c = &R[find("blk.4.ffn_down.weight")];
    CHECK(c->type == LLMQ_DTYPE_F16 && c->wanted == LLMQ_DTYPE_Q4_0);
    CHECK_CONTAINS(c->note, "-> f16");
    CHECK(R[find("output.weight")].type == LLMQ_DTYPE_Q8_0 && R[find("token_embd.weight")].type == LLMQ_DTYPE_Q4_0);
    plan(LLMQ_GGUF_FTYPE_Q4_K_M, 8, 4, 5, NULL);
    CHECK(type_of("blk.%d.ffn_down.weight", 0) == LLMQ_DTYPE_F16); // Q6_K -> Q8_0 -> F16
    CHECK(type_of("blk.%d.ffn_down.weight", 1) == LLMQ_DTYPE_F16); // Q4_K -> Q5_0 -> F16

    // pure: the default type everywhere (+ fallback); output / embedding types still apply
    model(4096, 11008, 32, 1024, false);
    struct llmq_gguf_mix_opts o = llmq_gguf_mix_default_opts();
    o.pure = true;
    plan(LLMQ_GGUF_FTYPE_Q4_K_M, 32, 8, 32, &o);
    for (int i = 0; i < nt; i++) CHECK(R[i].type == (T[i].n_dims == 2 ? LLMQ_DTYPE_Q4_K : LLMQ_DTYPE_F32));
    o.output_type = LLMQ_DTYPE_Q8_0;
    o.embedding_type = LLMQ_DTYPE_Q5_0;
    plan(LLMQ_GGUF_FTYPE_Q4_K_M, 32, 8, 32, &o);
    CHECK(R[find("output.weight")].type == LLMQ_DTYPE_Q8_0 && R[find("token_embd.weight")].type == LLMQ_DTYPE_Q5_0);
    o.pure = false;
    o.output_type = LLMQ_DTYPE_IQ2_XXS;
    struct llmq_gguf_mix_model mm = {.n_layer = 32, .n_head = 32, .n_head_kv = 8};
    o.ftype = LLMQ_GGUF_FTYPE_Q4_K_M;
    CHECK(llmq_gguf_mix_plan(&mm, &o, nt, T, R) == LLMQ_ERR_UNSUPPORTED);

    // overrides: first match wins; a manual attn_v does not advance the attn_v counter
    struct llmq_gguf_tensor_type tt[] = {{"blk\\.(0|1)\\.attn_v", LLMQ_DTYPE_Q4_0}, {"attn_v", LLMQ_DTYPE_Q8_0}};
    o = llmq_gguf_mix_default_opts();
    o.n_overrides = 1;
    o.overrides = tt;
    plan(LLMQ_GGUF_FTYPE_Q4_K_M, 32, 8, 32, &o);
    CHECK(type_of("blk.%d.attn_v.weight", 1) == LLMQ_DTYPE_Q4_0 && R[find("blk.1.attn_v.weight")].manual);
    for (int l = 2; l < 32; l++) // layer l is the (l-2)th attn_v to reach the rule, out of 32
        CHECK(type_of("blk.%d.attn_v.weight", l) == (more_bits(l - 2, 32) ? LLMQ_DTYPE_Q6_K : LLMQ_DTYPE_Q4_K));
    o.n_overrides = 2;
    plan(LLMQ_GGUF_FTYPE_Q4_K_M, 32, 8, 32, &o);
    CHECK(type_of("blk.%d.attn_v.weight", 0) == LLMQ_DTYPE_Q4_0 &&
          type_of("blk.%d.attn_v.weight", 7) == LLMQ_DTYPE_Q8_0);
    plan(LLMQ_GGUF_FTYPE_F16, 32, 8, 32, &o); // overrides only apply to a quantized default type
    CHECK(type_of("blk.%d.attn_v.weight", 0) == LLMQ_DTYPE_F16);
    struct llmq_gguf_tensor_type bad = {"attn_(v", LLMQ_DTYPE_Q8_0};
    o.overrides = &bad;
    o.n_overrides = 1;
    o.ftype = LLMQ_GGUF_FTYPE_Q4_0;
    CHECK(llmq_gguf_mix_plan(&mm, &o, nt, T, R) == LLMQ_ERR_ARG);

    // kept tensors: 1-D -> F32, a >= 2-D tensor that is not quantized keeps an F16 type
    nt = 0;
    add("blk.0.attn_norm.weight", 1, 64, 1);
    T[0].src_type = LLMQ_DTYPE_F16;
    add("blk.0.ffn_gate_inp.weight", 8, 64, 2);
    T[1].src_type = LLMQ_DTYPE_F16;
    add("blk.0.ffn_up.weight", 1, 64, 2); // ggml_n_dims 1: not quantized
    plan(LLMQ_GGUF_FTYPE_Q4_0, 8, 8, 1, NULL);
    CHECK(R[0].type == LLMQ_DTYPE_F32 && R[1].type == LLMQ_DTYPE_F16 && R[2].type == LLMQ_DTYPE_F32);
}

// ---- the writer on stories260K -----------------------------------------------------------------------------

static char tmpdir[] = "/tmp/llmq_test_gguf_mix_XXXXXX";

static char *tpath(const char *name) { return test_path(tmpdir, name); }

// Hands over every linear (reversed layer and linear order when reverse), as f32 or encoded bytes.
static enum llmq_status hand_all(struct llmq_gguf_export *e, const struct llmq_model *m, bool reverse, bool bytes) {
    for (int64_t i = 0; i < m->hp.n_layer; i++)
        for (int j = 0; j < LLMQ_LIN_COUNT; j++) {
            int64_t l = reverse ? m->hp.n_layer - 1 - i : i;
            enum llmq_linear k = (enum llmq_linear)(reverse ? LLMQ_LIN_COUNT - 1 - j : j);
            const struct llmq_tensor_view *v = m->layers[l].w[k];
            int64_t Rr = v->shape[0], C = v->shape[1];
            enum llmq_dtype t = llmq_gguf_export_linear_type(e, l, k);
            size_t rb;
            float *W = malloc((size_t)(Rr * C) * 4);
            CHECK(W && llmq_dtype_nbytes(t, C, &rb));
            void *q = malloc(rb * (size_t)Rr);
            CHECK_OK(llmq_model_weight_f32(v, W, 1));
            enum llmq_status st;
            if (bytes) {
                CHECK_OK(llmq_gguf_encode_rows(t, W, q, Rr, C, llmq_gguf_export_linear_importance(e, l, k), 2));
                st = llmq_gguf_export_linear_bytes(e, l, k, q);
            } else {
                st = llmq_gguf_export_linear_f32(e, l, k, W);
            }
            free(W);
            free(q);
            if (st) return st;
        }
    return LLMQ_OK;
}

// An export of m to `out` fed by hand_all(reverse, bytes) is byte for byte the file `ref`.
static void check_handed_over(const struct llmq_model *m, const struct llmq_gguf_export_opts *o, const char *out,
                              const char *ref, bool reverse, bool bytes) {
    struct llmq_gguf_export *e = NULL;
    CHECK_OK(llmq_gguf_export_begin(m, tpath(out), o, &e));
    CHECK_OK(hand_all(e, m, reverse, bytes));
    CHECK_OK(llmq_gguf_export_finish(e));
    CHECK(test_same_file(tpath(ref), tpath(out)));
}

static void test_export(const char *stories) {
    struct llmq_model *m = NULL, *hf = NULL;
    struct llmq_gguf_export *e = NULL;
    struct llmq_gguf_export_opts o = llmq_gguf_export_default_opts();
    o.mix.ftype = LLMQ_GGUF_FTYPE_Q4_0;
    o.no_provenance = true;
    o.progress = false;
    o.n_threads = 2;
    CHECK_OK(llmq_model_load(stories, &m));
    CHECK_OK(llmq_gguf_export_rtn(m, tpath("rtn.gguf"), &o));
    CHECK(test_count_entries(tmpdir) == 1);

    // f32 hand-overs, last layer first: held until their turn, same bytes
    CHECK_OK(llmq_gguf_export_begin(m, tpath("f32.gguf"), &o, &e));
    CHECK(llmq_gguf_export_linear_type(e, 0, LLMQ_LIN_Q) == LLMQ_DTYPE_Q4_0);
    CHECK(llmq_gguf_export_linear_type(e, 4, LLMQ_LIN_DOWN) == LLMQ_DTYPE_F16); // 172 wide
    CHECK(llmq_gguf_export_linear_type(e, 5, LLMQ_LIN_Q) == LLMQ_DTYPE_INVALID);
    CHECK(llmq_gguf_export_linear_importance(e, 0, LLMQ_LIN_Q) == NULL);
    CHECK_OK(hand_all(e, m, true, false));
    float W[64 * 64] = {0};
    CHECK(llmq_gguf_export_linear_f32(e, 0, LLMQ_LIN_Q, W) == LLMQ_ERR_ARG); // twice: refused, nothing changes
    CHECK(llmq_gguf_export_linear_f32(e, 7, LLMQ_LIN_Q, W) == LLMQ_ERR_ARG);
    CHECK_OK(llmq_gguf_export_finish(e));
    CHECK(test_same_file(tpath("rtn.gguf"), tpath("f32.gguf")));

    check_handed_over(m, &o, "bytes.gguf", "rtn.gguf", false, true); // encoded bytes, in order

    // abort after some hand-overs; an existing output without force; a dry run: nothing left behind
    CHECK_OK(llmq_gguf_export_begin(m, tpath("aborted.gguf"), &o, &e));
    CHECK_OK(llmq_gguf_export_linear_f32(e, 0, LLMQ_LIN_K, W));
    llmq_gguf_export_abort(e);
    CHECK(!llmq_file_exists(tpath("aborted.gguf")) && test_count_entries(tmpdir) == 3);
    CHECK(llmq_gguf_export_begin(m, tpath("rtn.gguf"), &o, &e) == LLMQ_ERR_ARG && e == NULL);
    o.dry_run = true;
    CHECK_OK(llmq_gguf_export_begin(m, tpath("dry.gguf"), &o, &e));
    CHECK_OK(llmq_gguf_export_linear_f32(e, 0, LLMQ_LIN_K, W));
    CHECK_OK(llmq_gguf_export_finish(e));
    CHECK(!llmq_file_exists(tpath("dry.gguf")) && test_count_entries(tmpdir) == 3);
    o.dry_run = false;

    // an HF input: the writer permutes the q / k rows it gets in HF order
    struct llmq_convert_opts co = llmq_convert_default_opts();
    co.to = LLMQ_CONVERT_TO_HF;
    CHECK_OK(llmq_convert(stories, tpath("hf"), &co, NULL));
    CHECK_OK(llmq_model_load(tpath("hf"), &hf));
    CHECK_OK(llmq_gguf_export_rtn(hf, tpath("hf_rtn.gguf"), &o));
    check_handed_over(hf, &o, "hf_f32.gguf", "hf_rtn.gguf", true, false);
    check_handed_over(hf, &o, "hf_bytes.gguf", "hf_rtn.gguf", false, true);
    llmq_model_free(hf);
    llmq_model_free(m);
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    test_parse_and_order();
    test_layer_rules();
    test_fallbacks_tied_pure_overrides();
    char stories[1024];
    test_need_file(test_stories260k(stories, sizeof stories, "tinyllamas-stories-260k-f32.v3.gguf"));
    CHECK(mkdtemp(tmpdir));
    test_export(stories);
    llmq_remove_tree(tmpdir);
    return 0;
}
