// tests/unit/test_convert.c — calib/convert: the q/k permutation against its definition
// (llama.cpp's reshape(H, 2, Dh/2, C).swapaxes(1, 2)) and its inverse on random data; small
// handmade GGUF models (SPM and byte-level BPE vocabularies, tied and untied, llama and qwen2,
// llama3 rope_freqs) through GGUF -> HF -> GGUF compared tensor byte by tensor byte and array by
// array; GGUF -> GGUF at f16 / bf16 against the scalar rounding helpers; sharded HF output;
// refused outputs and corrupt inputs leaving nothing behind. SmolLM2 / stories260K and the
// independent oracles (gguf-py, safetensors, tokenizers) are in tests/py/test_convert_oracle.py.
#include "harness.h"

#include "calib/model/model.h"
#include "common/io.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/convert/convert.h"
#include "formats/ggml/quants.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/llmq_test_convert_XXXXXX";

static uint64_t rng = 88172645463325252ull;
static float frand(void) { // uniform in [-1, 1)
    return (float)((double)(test_xorshift64(&rng) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static char *tpath(const char *name) { return test_path(tmpdir, name); }

// ---- the permutation ----------------------------------------------------------------------------

static void test_permutation(void) {
    const int64_t cases[][3] = {{1, 2, 3}, {3, 8, 5}, {9, 64, 2}, {4, 2, 1}, {2, 6, 7}}; // heads, Dh, C
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int64_t H = cases[c][0], Dh = cases[c][1], C = cases[c][2], R = H * Dh, half = Dh / 2;
        float *hf = malloc(sizeof(float) * (size_t)(R * C)), *gg = malloc(sizeof(float) * (size_t)(R * C));
        float *back = malloc(sizeof(float) * (size_t)(R * C));
        CHECK(hf && gg && back);
        for (int64_t i = 0; i < R * C; i++) hf[i] = frand();
        // the definition: gguf[h][i][j][:] = hf[h][j][i][:] with hf viewed as (H, 2, Dh/2, C)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < half; i++)
                for (int64_t j = 0; j < 2; j++)
                    memcpy(gg + ((h * half + i) * 2 + j) * C, hf + ((h * 2 + j) * half + i) * C,
                           sizeof(float) * (size_t)C);
        for (int64_t r = 0; r < R; r++) {
            int64_t s = llmq_arch_qk_src_row(r, R, H, true); // to GGUF
            CHECK(memcmp(gg + r * C, hf + s * C, sizeof(float) * (size_t)C) == 0);
            int64_t b = llmq_arch_qk_src_row(r, R, H, false); // back to HF
            memcpy(back + r * C, gg + b * C, sizeof(float) * (size_t)C);
            CHECK_EQ_INT(llmq_arch_qk_src_row(b, R, H, true), r); // inverse of each other
        }
        CHECK(memcmp(back, hf, sizeof(float) * (size_t)(R * C)) == 0);
        free(hf);
        free(gg);
        free(back);
    }
}

// ---- handmade models ----------------------------------------------------------------------------

struct spec {
    const char *arch; // "llama" / "qwen2" / "qwen3" / "gemma2" / "gemma3"
    int64_t n_embd, n_head, n_head_kv, n_ff, n_layer;
    bool tied, spm, llama3, q8_embd;
};

static const char *spm_tokens[] = {"<unk>",
                                   "<s>",
                                   "</s>",
                                   "<0x0A>",
                                   "<0x41>",
                                   "\xe2\x96\x81",
                                   "a",
                                   "b",
                                   "c",
                                   "\xe2\x96\x81"
                                   "a",
                                   "ab",
                                   "\xe2\x96\x81"
                                   "ab",
                                   "abc",
                                   "bc",
                                   "\xc3\xa9",
                                   "<pad>",
                                   "[PAD16]"};
static const int32_t spm_types[] = {2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 5};
static const char *bpe_tokens[] = {"<|endoftext|>",
                                   "<|im_start|>",
                                   "a",
                                   "b",
                                   "c",
                                   "\xc4\xa0",
                                   "ab",
                                   "abc",
                                   "\xc4\xa0"
                                   "a",
                                   "\xc4\xa0"
                                   "ab",
                                   "1",
                                   "2",
                                   "<tool>",
                                   "\xc3\xa9"};
static const int32_t bpe_types[] = {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1};
static const char *bpe_merges[] = {"a b", "ab c", "\xc4\xa0 a",
                                   "\xc4\xa0"
                                   "a b"};
#define NSPM ((int64_t)(sizeof(spm_tokens) / sizeof(spm_tokens[0])))
#define NBPE ((int64_t)(sizeof(bpe_tokens) / sizeof(bpe_tokens[0])))

static void add_tensor(struct llmq_gguf_writer *w, float ***bufs, int *nb, const char *name, int nd, int64_t a,
                       int64_t b, enum llmq_dtype dt) {
    int64_t shape[2] = {a, b};
    CHECK(llmq_gguf_writer_add_tensor(w, name, dt, nd, shape) == LLMQ_OK);
    int64_t n = nd == 1 ? a : a * b;
    float *f = malloc(sizeof(float) * (size_t)n);
    CHECK(f);
    for (int64_t i = 0; i < n; i++) f[i] = frand();
    (*bufs)[(*nb)++] = f;
}

// The last tensor added becomes a gemma norm weight (1 + w) in [1, 2): there (1 + w) - 1 + 1 is exact in f32, so
// GGUF -> HF -> GGUF gives the same bits.
static void gemma_norm(float **bufs, int nb, int64_t n) {
    for (int64_t i = 0; i < n; i++) bufs[nb - 1][i] = 1.5f + 0.5f * bufs[nb - 1][i];
}

static void make_gguf(const char *path, const struct spec *s) {
    struct llmq_gguf_writer *w = llmq_gguf_writer_init();
    char k[128];
    int64_t hd = s->n_embd / s->n_head, V = s->spm ? NSPM : NBPE;
    CHECK(w);
#define KEY(x) (snprintf(k, sizeof(k), "%s.%s", s->arch, x), k)
    CHECK(llmq_gguf_writer_set_str(w, "general.architecture", s->arch) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_str(w, "general.name", "handmade") == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_u32(w, KEY("context_length"), 256) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)s->n_layer) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)s->n_head) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_f32(w, KEY("rope.freq_base"), s->llama3 ? 500000.0f : 10000.0f) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f) == LLMQ_OK);
    CHECK(llmq_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hd) == LLMQ_OK);
#undef KEY
    if (s->spm) {
        float scores[NSPM];
        int64_t n = 0;
        for (int64_t i = 0; i < NSPM; i++) scores[i] = spm_types[i] == 1 ? -(float)n++ : 0.0f;
        CHECK(llmq_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", spm_tokens, NULL, NSPM) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_arr(w, "tokenizer.ggml.scores", LLMQ_GGUF_TYPE_FLOAT32, scores, NSPM) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LLMQ_GGUF_TYPE_INT32, spm_types, NSPM) ==
              LLMQ_OK);
        CHECK(llmq_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 15) == LLMQ_OK);
    } else {
        CHECK(llmq_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_str(w, "tokenizer.ggml.pre", s->llama3 ? "llama-bpe" : "smollm") == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", bpe_tokens, NULL, NBPE) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LLMQ_GGUF_TYPE_INT32, bpe_types, NBPE) ==
              LLMQ_OK);
        CHECK(llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", bpe_merges, NULL, 4) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 0) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_str(w, "tokenizer.chat_template", "{{ messages }}") == LLMQ_OK);
    }
    float **bufs = malloc(sizeof(float *) * 256);
    int nb = 0;
    CHECK(bufs);
    bool qwen = !strcmp(s->arch, "qwen2"), gemma = !strncmp(s->arch, "gemma", 5);
    int64_t q = s->n_head * hd, kv = s->n_head_kv * hd;
    if (s->llama3) {
        struct llmq_hparams mh = {.head_dim = hd, .n_rot = hd, .rope_theta = 500000.0f};
        mh.rope_scaling.type = LLMQ_ROPE_SCALING_LLAMA3, mh.rope_scaling.factor = 8.0f;
        mh.rope_scaling.low_freq_factor = 1.0f, mh.rope_scaling.high_freq_factor = 4.0f;
        mh.rope_scaling.original_max_pos = 8192;
        add_tensor(w, &bufs, &nb, "rope_freqs.weight", 1, hd / 2, 1, LLMQ_DTYPE_F32);
        llmq_rope_llama3_factors(&mh, bufs[nb - 1]);
    }
    add_tensor(w, &bufs, &nb, "token_embd.weight", 2, V, s->n_embd, s->q8_embd ? LLMQ_DTYPE_Q8_0 : LLMQ_DTYPE_F32);
    for (int64_t l = 0; l < s->n_layer; l++) {
        char n[64];
#define T(name, nd, a, b)                                                                                              \
    (snprintf(n, sizeof(n), "blk.%lld.%s", (long long)l, name), add_tensor(w, &bufs, &nb, n, nd, a, b, LLMQ_DTYPE_F32))
#define NORM(name, a) (T(name, 1, a, 1), gemma ? gemma_norm(bufs, nb, a) : (void)0)
        NORM("attn_norm.weight", s->n_embd);
        T("attn_q.weight", 2, q, s->n_embd);
        T("attn_k.weight", 2, kv, s->n_embd);
        T("attn_v.weight", 2, kv, s->n_embd);
        if (qwen) {
            T("attn_q.bias", 1, q, 1);
            T("attn_k.bias", 1, kv, 1);
            T("attn_v.bias", 1, kv, 1);
        }
        if (!strcmp(s->arch, "qwen3") || !strcmp(s->arch, "gemma3")) { // per-head q / k RMSNorm weights
            NORM("attn_q_norm.weight", hd);
            NORM("attn_k_norm.weight", hd);
        }
        T("attn_output.weight", 2, s->n_embd, q);
        NORM("ffn_norm.weight", s->n_embd);
        if (gemma) {
            NORM("post_attention_norm.weight", s->n_embd);
            NORM("post_ffw_norm.weight", s->n_embd);
        }
        T("ffn_gate.weight", 2, s->n_ff, s->n_embd);
        T("ffn_up.weight", 2, s->n_ff, s->n_embd);
        T("ffn_down.weight", 2, s->n_embd, s->n_ff);
#undef NORM
#undef T
    }
    add_tensor(w, &bufs, &nb, "output_norm.weight", 1, s->n_embd, 1, LLMQ_DTYPE_F32);
    if (gemma) gemma_norm(bufs, nb, s->n_embd);
    if (!s->tied) add_tensor(w, &bufs, &nb, "output.weight", 2, V, s->n_embd, LLMQ_DTYPE_F32);
    CHECK(llmq_gguf_writer_begin(w, path) == LLMQ_OK);
    for (int i = 0; i < nb; i++) {
        size_t nbytes = llmq_gguf_writer_tensor_nbytes(w, i);
        if (i == (s->llama3 ? 1 : 0) && s->q8_embd) { // quantize the embedding to Q8_0 by hand
            int64_t n = V * s->n_embd;
            struct llmq_block_q8_0 *blk = malloc(nbytes);
            CHECK(blk && (size_t)(n / 32) * sizeof(*blk) == nbytes);
            for (int64_t b = 0; b < n / 32; b++) {
                float amax = 0;
                for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(bufs[i][b * 32 + e]));
                float d = amax / 127.0f;
                blk[b].d = llmq_f32_to_f16(d);
                for (int e = 0; e < 32; e++) blk[b].qs[e] = (int8_t)lrintf(d ? bufs[i][b * 32 + e] / d : 0);
            }
            CHECK(llmq_gguf_writer_write_tensor(w, blk, nbytes) == LLMQ_OK);
            free(blk);
        } else {
            CHECK(llmq_gguf_writer_write_tensor(w, bufs[i], nbytes) == LLMQ_OK);
        }
        free(bufs[i]);
    }
    free(bufs);
    CHECK(llmq_gguf_writer_commit(w) == LLMQ_OK);
    llmq_gguf_writer_free(w);
}

// ---- comparisons --------------------------------------------------------------------------------

static void check_same_array(const struct llmq_gguf *a, const struct llmq_gguf *b, const char *key) {
    const struct llmq_gguf_kv *x = llmq_gguf_find_kv(a, key), *y = llmq_gguf_find_kv(b, key);
    if (!x) {
        CHECK(!y);
        return;
    }
    if (!y) fprintf(stderr, "missing %s\n", key);
    CHECK(y && x->type == LLMQ_GGUF_TYPE_ARRAY && y->type == LLMQ_GGUF_TYPE_ARRAY);
    CHECK_EQ_INT(x->n, y->n);
    if (x->arr_type == LLMQ_GGUF_TYPE_STRING) {
        CHECK(y->arr_type == LLMQ_GGUF_TYPE_STRING);
        for (uint64_t j = 0; j < x->n; j++) {
            size_t lx, ly;
            const char *sx = llmq_gguf_kv_arr_str(x, j, &lx), *sy = llmq_gguf_kv_arr_str(y, j, &ly);
            if (lx != ly || memcmp(sx, sy, lx))
                fprintf(stderr, "%s[%llu]: '%.*s' vs '%.*s'\n", key, (unsigned long long)j, (int)lx, sx, (int)ly, sy);
            CHECK(lx == ly && memcmp(sx, sy, lx) == 0);
        }
    } else {
        CHECK(x->arr_type == y->arr_type && x->nbytes == y->nbytes);
        if (memcmp(x->data, y->data, x->nbytes)) {
            for (uint64_t j = 0; j < x->n; j++) {
                int64_t u = 0, v = 0;
                if (llmq_gguf_kv_arr_i64(x, j, &u) && llmq_gguf_kv_arr_i64(y, j, &v) && u != v)
                    fprintf(stderr, "%s[%llu]: %lld vs %lld\n", key, (unsigned long long)j, (long long)u, (long long)v);
            }
        }
        CHECK(memcmp(x->data, y->data, x->nbytes) == 0);
    }
}

static void check_same_u32(const struct llmq_gguf *a, const struct llmq_gguf *b, const char *key) {
    int64_t x = -1, y = -1;
    const struct llmq_gguf_kv *kx = llmq_gguf_find_kv(a, key), *ky = llmq_gguf_find_kv(b, key);
    if (kx) CHECK(llmq_gguf_kv_as_i64(kx, &x));
    if (ky) CHECK(llmq_gguf_kv_as_i64(ky, &y));
    if (x != y) fprintf(stderr, "%s: %lld vs %lld\n", key, (long long)x, (long long)y);
    CHECK(x == y);
}

// Every tensor of a (the original) in b with the same dtype, shape and bytes; the same tensor count.
// A quantized tensor of a must come back as its exact f32 decoding.
static void check_same_tensors(const struct llmq_gguf *a, const struct llmq_gguf *b) {
    CHECK_EQ_INT(llmq_gguf_n_tensors(a), llmq_gguf_n_tensors(b));
    for (int64_t i = 0; i < llmq_gguf_n_tensors(a); i++) {
        const struct llmq_tensor_view *x = &llmq_gguf_tensor_at(a, i)->view;
        const struct llmq_gguf_tensor *ty = llmq_gguf_find_tensor(b, x->name);
        if (!ty) fprintf(stderr, "missing tensor %s\n", x->name);
        CHECK(ty);
        const struct llmq_tensor_view *y = &ty->view;
        CHECK_EQ_INT(x->n_dims, y->n_dims);
        for (int d = 0; d < x->n_dims; d++) CHECK_EQ_INT(x->shape[d], y->shape[d]);
        if (x->dtype == LLMQ_DTYPE_F32) {
            CHECK(y->dtype == LLMQ_DTYPE_F32 && x->nbytes == y->nbytes);
            if (memcmp(x->data, y->data, x->nbytes)) fprintf(stderr, "tensor %s differs\n", x->name);
            CHECK(memcmp(x->data, y->data, x->nbytes) == 0);
        } else {
            int64_t n = llmq_tensor_nelements(x);
            float *f = malloc(sizeof(float) * (size_t)n);
            CHECK(f && y->dtype == LLMQ_DTYPE_F32);
            CHECK(llmq_dequantize_row(x->dtype, x->data, f, n) == LLMQ_OK);
            CHECK(memcmp(f, y->data, (size_t)n * 4) == 0);
            free(f);
        }
    }
}

static void round_trip(const char *name, const struct spec *s, uint64_t shard_bytes) {
    char src[64], hf[64], back[64];
    snprintf(src, sizeof(src), "%s.gguf", name);
    snprintf(hf, sizeof(hf), "%s-hf", name);
    snprintf(back, sizeof(back), "%s-back.gguf", name);
    make_gguf(tpath(src), s);
    struct llmq_convert_opts o = llmq_convert_default_opts();
    struct llmq_convert_stats st;
    o.max_shard_bytes = shard_bytes;
    CHECK_OK(llmq_convert(tpath(src), tpath(hf), &o, &st));
    if (shard_bytes) {
        CHECK(st.n_shards > 1);
        char idx[256];
        snprintf(idx, sizeof(idx), "%s/model.safetensors.index.json", tpath(hf));
        CHECK(llmq_file_exists(idx));
    }
    struct llmq_st_model *m = NULL;
    CHECK(llmq_st_open(tpath(hf), &m) == LLMQ_OK);
    CHECK(llmq_st_get(m, "model.embed_tokens.weight"));
    CHECK((llmq_st_get(m, "lm_head.weight") != NULL) == !s->tied);
    CHECK(!llmq_st_get(m, "rope_freqs.weight"));
    CHECK((llmq_st_get(m, "model.layers.0.self_attn.k_norm.weight") != NULL) ==
          (!strcmp(s->arch, "qwen3") || !strcmp(s->arch, "gemma3")));
    if (!strncmp(s->arch, "gemma", 5)) { // four norms per block, stored as w = (1 + w) - 1
        const struct llmq_tensor_view *pre = llmq_st_get(m, "model.layers.1.pre_feedforward_layernorm.weight");
        CHECK(pre && llmq_st_get(m, "model.layers.1.post_attention_layernorm.weight") &&
              llmq_st_get(m, "model.layers.1.post_feedforward_layernorm.weight"));
        float w0;
        memcpy(&w0, pre->data, 4);
        CHECK(w0 >= 0.0f && w0 < 1.0f); // the GGUF's value is in [1, 2)
    }
    llmq_st_free(m);
    CHECK_OK(llmq_convert(tpath(hf), tpath(back), &o, &st));

    struct llmq_gguf *a = NULL, *b = NULL;
    CHECK(llmq_gguf_open(tpath(src), &a) == LLMQ_OK);
    CHECK(llmq_gguf_open(tpath(back), &b) == LLMQ_OK);
    check_same_tensors(a, b);
    check_same_array(a, b, "tokenizer.ggml.tokens");
    check_same_array(a, b, "tokenizer.ggml.token_type");
    check_same_array(a, b, "tokenizer.ggml.merges");
    check_same_array(a, b, "tokenizer.ggml.scores");
    check_same_u32(a, b, "tokenizer.ggml.bos_token_id");
    check_same_u32(a, b, "tokenizer.ggml.eos_token_id");
    check_same_u32(a, b, "tokenizer.ggml.padding_token_id");
    const char *arch = s->arch;
    const char *keys[] = {"embedding_length",     "feed_forward_length",     "block_count",
                          "attention.head_count", "attention.head_count_kv", "context_length",
                          "rope.dimension_count"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        char k[128];
        snprintf(k, sizeof(k), "%s.%s", arch, keys[i]);
        check_same_u32(a, b, k);
    }
    const char *sa, *sb;
    CHECK(llmq_gguf_get_str(a, "tokenizer.ggml.model", &sa) == LLMQ_OK &&
          llmq_gguf_get_str(b, "tokenizer.ggml.model", &sb) == LLMQ_OK);
    CHECK(!strcmp(sa, sb));
    if (!s->spm) {
        CHECK(llmq_gguf_get_str(b, "tokenizer.ggml.pre", &sb) == LLMQ_OK);
        CHECK(!strcmp(sb, s->llama3 ? "llama-bpe" : "smollm"));
        CHECK(llmq_gguf_get_str(b, "tokenizer.chat_template", &sb) == LLMQ_OK && !strcmp(sb, "{{ messages }}"));
        bool add_bos = true;
        CHECK(llmq_gguf_get_bool(b, "tokenizer.ggml.add_bos_token", &add_bos) == LLMQ_OK && !add_bos);
    }
    double x, y;
    char k[128];
    snprintf(k, sizeof(k), "%s.attention.layer_norm_rms_epsilon", arch);
    CHECK(llmq_gguf_get_f64(a, k, &x) == LLMQ_OK && llmq_gguf_get_f64(b, k, &y) == LLMQ_OK && x == y);
    snprintf(k, sizeof(k), "%s.rope.freq_base", arch);
    CHECK(llmq_gguf_get_f64(a, k, &x) == LLMQ_OK && llmq_gguf_get_f64(b, k, &y) == LLMQ_OK && x == y);
    llmq_gguf_free(a);
    llmq_gguf_free(b);
    if (!s->spm) { // merges written as ["a", "b"] pairs (tokenizers >= 0.20) read back the same
        char cmd[1024], back2[64];
        snprintf(back2, sizeof(back2), "%s-pairs.gguf", name);
        snprintf(cmd, sizeof(cmd),
                 "sed -i -E 's/^( *)\"([^\" ]+) ([^\" ]+)\"(,?)$/\\1[\"\\2\", \"\\3\"]\\4/' %s/tokenizer.json && "
                 "grep -q '\\[\"a\", \"b\"\\]' %s/tokenizer.json",
                 tpath(hf), tpath(hf));
        CHECK(system(cmd) == 0);
        CHECK_OK(llmq_convert(tpath(hf), tpath(back2), &o, &st));
        CHECK(llmq_gguf_open(tpath(src), &a) == LLMQ_OK && llmq_gguf_open(tpath(back2), &b) == LLMQ_OK);
        check_same_array(a, b, "tokenizer.ggml.merges");
        llmq_gguf_free(a);
        llmq_gguf_free(b);
    }
}

// ---- GGUF -> GGUF at f16 / bf16 -----------------------------------------------------------------

static void test_gguf_dtypes(void) {
    struct spec s = {"llama", 32, 4, 2, 40, 1, true, false, false, true};
    make_gguf(tpath("d.gguf"), &s);
    const enum llmq_dtype dts[] = {LLMQ_DTYPE_F16, LLMQ_DTYPE_BF16, LLMQ_DTYPE_F32};
    for (int d = 0; d < 3; d++) {
        struct llmq_convert_opts o = llmq_convert_default_opts();
        o.to = LLMQ_CONVERT_TO_GGUF;
        o.dtype = dts[d];
        o.force = true;
        CHECK_OK(llmq_convert(tpath("d.gguf"), tpath("d-out.gguf"), &o, NULL));
        struct llmq_gguf *a = NULL, *b = NULL;
        CHECK(llmq_gguf_open(tpath("d.gguf"), &a) == LLMQ_OK && llmq_gguf_open(tpath("d-out.gguf"), &b) == LLMQ_OK);
        int64_t ft;
        CHECK(llmq_gguf_get_i64(b, "general.file_type", &ft) == LLMQ_OK);
        CHECK_EQ_INT(ft, dts[d] == LLMQ_DTYPE_F16 ? 1 : dts[d] == LLMQ_DTYPE_BF16 ? 32 : 0);
        CHECK(!llmq_gguf_find_kv(b, "general.quantization_version"));
        CHECK_EQ_INT(llmq_gguf_n_kv(a), llmq_gguf_n_kv(b) - 1); // general.file_type added, nothing else
        for (int64_t i = 0; i < llmq_gguf_n_tensors(a); i++) {
            const struct llmq_tensor_view *x = &llmq_gguf_tensor_at(a, i)->view, *y = &llmq_gguf_tensor_at(b, i)->view;
            CHECK(!strcmp(x->name, y->name));
            int64_t n = llmq_tensor_nelements(x);
            float *f = malloc(sizeof(float) * (size_t)n);
            CHECK(f && llmq_dequantize_row(x->dtype, x->data, f, n) == LLMQ_OK);
            CHECK(y->dtype == (x->n_dims == 1 ? LLMQ_DTYPE_F32 : dts[d]));
            for (int64_t e = 0; e < n; e++) {
                uint16_t h;
                if (y->dtype == LLMQ_DTYPE_F32) {
                    CHECK(memcmp((const float *)y->data + e, &f[e], 4) == 0);
                    continue;
                }
                memcpy(&h, (const uint16_t *)y->data + e, 2);
                CHECK(h == (y->dtype == LLMQ_DTYPE_F16 ? llmq_f32_to_f16(f[e]) : llmq_f32_to_bf16(f[e])));
            }
            free(f);
        }
        llmq_gguf_free(a);
        llmq_gguf_free(b);
    }
}

// ---- refusals and corrupt inputs ----------------------------------------------------------------

static void test_refusals(void) {
    struct spec s = {"llama", 16, 2, 1, 24, 2, false, true, false, false};
    struct llmq_convert_opts o = llmq_convert_default_opts();
    make_gguf(tpath("r.gguf"), &s);
    CHECK_OK(llmq_convert(tpath("r.gguf"), tpath("r-hf"), &o, NULL));
    // an existing output is refused without force, and replaced with it
    CHECK(llmq_convert(tpath("r.gguf"), tpath("r-hf"), &o, NULL) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "--force");
    o.force = true;
    o.dtype = LLMQ_DTYPE_BF16;
    CHECK_OK(llmq_convert(tpath("r.gguf"), tpath("r-hf"), &o, NULL));
    struct llmq_st_model *m = NULL;
    CHECK(llmq_st_open(tpath("r-hf"), &m) == LLMQ_OK);
    CHECK(llmq_st_get(m, "model.norm.weight")->dtype == LLMQ_DTYPE_BF16);
    llmq_st_free(m);
    // force does not replace what is not a model: a plain file for HF output, a directory for GGUF output
    FILE *fp = fopen(tpath("plain.txt"), "w");
    CHECK(fp && fputs("keep me", fp) >= 0 && fclose(fp) == 0);
    CHECK(llmq_convert(tpath("r.gguf"), tpath("plain.txt"), &o, NULL) == LLMQ_ERR_ARG);
    CHECK(mkdir(tpath("notmodel"), 0755) == 0);
    fp = fopen(tpath("notmodel/file"), "w");
    CHECK(fp && fclose(fp) == 0);
    CHECK(llmq_convert(tpath("r.gguf"), tpath("notmodel"), &o, NULL) == LLMQ_ERR_ARG);
    CHECK(llmq_file_exists(tpath("notmodel/file")));
    o.to = LLMQ_CONVERT_TO_GGUF;
    CHECK(llmq_convert(tpath("r.gguf"), tpath("notmodel"), &o, NULL) == LLMQ_ERR_ARG);
    CHECK(llmq_convert(tpath("r.gguf"), tpath("r.gguf"), &o, NULL) == LLMQ_ERR_ARG); // output == input
    CHECK_CONTAINS(llmq_last_error(), "is an input");
    o.dtype = LLMQ_DTYPE_Q4_0;
    CHECK(llmq_convert(tpath("r.gguf"), tpath("q.gguf"), &o, NULL) == LLMQ_ERR_ARG);
    o = llmq_convert_default_opts();
    o.to = LLMQ_CONVERT_TO_HF;
    CHECK(llmq_convert(tpath("r-hf"), tpath("x-hf"), &o, NULL) == LLMQ_ERR_ARG); // HF -> HF
    CHECK(llmq_convert(tpath("plain.txt"), tpath("x-hf"), &o, NULL) == LLMQ_ERR_MAGIC);
    CHECK(llmq_convert(tpath("nothing"), tpath("x-hf"), &o, NULL) == LLMQ_ERR_NOT_FOUND);

    // corrupt inputs: the error names the problem and nothing is written
    int before = test_count_entries(tmpdir);
    struct spec bad = s;
    bad.arch = "gpt-j"; // an architecture we do not convert
    make_gguf(tpath("bad-arch.gguf"), &bad);
    before++;
    CHECK(llmq_convert(tpath("bad-arch.gguf"), tpath("bad-hf"), &o, NULL) == LLMQ_ERR_UNSUPPORTED);
    CHECK_CONTAINS(llmq_last_error(), "gpt-j");
    CHECK_CONTAINS(llmq_last_error(),
                   "(llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen3_moe, qwen2_moe)");
    // truncated: the GGUF reader refuses it before anything is created
    struct stat sb;
    CHECK(stat(tpath("r.gguf"), &sb) == 0);
    CHECK(truncate(tpath("bad-arch.gguf"), sb.st_size / 2) == 0);
    CHECK(llmq_convert(tpath("bad-arch.gguf"), tpath("bad-hf"), &o, NULL) == LLMQ_ERR_TRUNCATED);
    // HF input with a broken config.json / tokenizer.json / a missing tensor
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "cp -r %s %s && printf '{\"model_type\": \"llama\",' > %s/config.json", tpath("r-hf"),
             tpath("broken-hf"), tpath("broken-hf"));
    CHECK(system(cmd) == 0);
    before++;
    o.to = LLMQ_CONVERT_TO_GGUF;
    CHECK(llmq_convert(tpath("broken-hf"), tpath("broken.gguf"), &o, NULL) == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "config.json");
    snprintf(cmd, sizeof(cmd), "cp %s/config.json %s/config.json && printf '{\"model\": ' > %s/tokenizer.json",
             tpath("r-hf"), tpath("broken-hf"), tpath("broken-hf"));
    CHECK(system(cmd) == 0);
    CHECK(llmq_convert(tpath("broken-hf"), tpath("broken.gguf"), &o, NULL) == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "tokenizer.json");
    snprintf(
        cmd, sizeof(cmd),
        "cp %s/tokenizer.json %s/tokenizer.json && sed -i 's/\"vocab_size\": 17/\"vocab_size\": 18/' %s/config.json",
        tpath("r-hf"), tpath("broken-hf"), tpath("broken-hf"));
    CHECK(system(cmd) == 0);
    CHECK(llmq_convert(tpath("broken-hf"), tpath("broken.gguf"), &o, NULL) == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "model.embed_tokens.weight");
    CHECK_EQ_INT(test_count_entries(tmpdir), before); // no output, no temporary left behind
}

// An HF directory in bf16 whose config says "mistral": back to GGUF f32, architecture "llama", every
// weight the bf16 rounding of the original (q/k permuted back), norms too (HF stores them bf16).
static void test_hf_bf16_mistral(void) {
    struct spec s = {"llama", 16, 4, 2, 24, 1, false, true, false, false};
    struct llmq_convert_opts o = llmq_convert_default_opts();
    char cmd[1024];
    make_gguf(tpath("m.gguf"), &s);
    o.dtype = LLMQ_DTYPE_BF16;
    CHECK_OK(llmq_convert(tpath("m.gguf"), tpath("m-hf"), &o, NULL));
    snprintf(cmd, sizeof(cmd),
             "sed -i 's/\"llama\"/\"mistral\"/; s/LlamaForCausalLM/MistralForCausalLM/' %s/config.json", tpath("m-hf"));
    CHECK(system(cmd) == 0);
    o = llmq_convert_default_opts();
    CHECK_OK(llmq_convert(tpath("m-hf"), tpath("m-back.gguf"), &o, NULL));
    struct llmq_gguf *a = NULL, *b = NULL;
    CHECK(llmq_gguf_open(tpath("m.gguf"), &a) == LLMQ_OK && llmq_gguf_open(tpath("m-back.gguf"), &b) == LLMQ_OK);
    const char *arch;
    CHECK(llmq_gguf_get_str(b, "general.architecture", &arch) == LLMQ_OK && !strcmp(arch, "llama"));
    CHECK(llmq_gguf_get_str(b, "general.name", &arch) == LLMQ_OK && !strcmp(arch, "m-hf"));
    CHECK_EQ_INT(llmq_gguf_n_tensors(a), llmq_gguf_n_tensors(b));
    for (int64_t i = 0; i < llmq_gguf_n_tensors(a); i++) {
        const struct llmq_tensor_view *x = &llmq_gguf_tensor_at(a, i)->view;
        const struct llmq_tensor_view *y = &llmq_gguf_find_tensor(b, x->name)->view;
        CHECK(y->dtype == LLMQ_DTYPE_F32 && x->nbytes == y->nbytes);
        for (int64_t e = 0; e < llmq_tensor_nelements(x); e++) {
            float f, g;
            memcpy(&f, (const float *)x->data + e, 4);
            memcpy(&g, (const float *)y->data + e, 4);
            CHECK(g == llmq_bf16_to_f32(llmq_f32_to_bf16(f)));
        }
    }
    llmq_gguf_free(a);
    llmq_gguf_free(b);
}

// The two spellings of a moe directory's router and experts (formats/llama/arch.h "Mixture of experts"): mixtral's
// differ, qwen3_moe's are the same; the names parse both ways and an unknown one is refused.
static void test_expert_names(void) {
    char a[160], b[160];
    enum llmq_expert_names n = LLMQ_EXPERT_NAMES_HUB;
    CHECK(llmq_expert_names_parse("gptqmodel", &n) && n == LLMQ_EXPERT_NAMES_GPTQMODEL);
    CHECK(llmq_expert_names_parse("hub", &n) && n == LLMQ_EXPERT_NAMES_HUB);
    CHECK(!llmq_expert_names_parse("vllm", &n) && !llmq_expert_names_parse(NULL, &n) && n == LLMQ_EXPERT_NAMES_HUB);
    CHECK(!strcmp(llmq_expert_names_name(LLMQ_EXPERT_NAMES_GPTQMODEL), "gptqmodel"));
    llmq_tensor_expert_hf_name(LLMQ_ARCH_MIXTRAL, LLMQ_EXPERT_NAMES_HUB, LLMQ_T_FFN_UP_EXPS, 3, 5, a, sizeof a);
    CHECK(!strcmp(a, "model.layers.3.block_sparse_moe.experts.5.w3.weight"));
    llmq_tensor_expert_hf_name(LLMQ_ARCH_MIXTRAL, LLMQ_EXPERT_NAMES_GPTQMODEL, LLMQ_T_FFN_UP_EXPS, 3, 5, a, sizeof a);
    CHECK(!strcmp(a, "model.layers.3.mlp.experts.5.up_proj.weight"));
    llmq_tensor_expert_hf_name(LLMQ_ARCH_MIXTRAL, LLMQ_EXPERT_NAMES_GPTQMODEL, LLMQ_T_FFN_DOWN_EXPS, 0, 7, a, sizeof a);
    CHECK(!strcmp(a, "model.layers.0.mlp.experts.7.down_proj.weight"));
    llmq_tensor_router_hf_name(LLMQ_ARCH_MIXTRAL, LLMQ_EXPERT_NAMES_GPTQMODEL, 2, a, sizeof a);
    CHECK(!strcmp(a, "model.layers.2.mlp.gate.weight"));
    llmq_tensor_router_hf_name(LLMQ_ARCH_MIXTRAL, LLMQ_EXPERT_NAMES_HUB, 2, a, sizeof a);
    CHECK(!strcmp(a, llmq_tensor_full_name(LLMQ_ARCH_MIXTRAL, LLMQ_T_FFN_GATE_INP, 2, true, b, sizeof b)));
    CHECK(!strcmp(a, "model.layers.2.block_sparse_moe.gate.weight"));
    for (int k = 0; k < 3; k++) { // qwen3_moe: one spelling
        llmq_tensor_expert_hf_name(LLMQ_ARCH_QWEN3_MOE, LLMQ_EXPERT_NAMES_HUB, LLMQ_T_FFN_GATE_EXPS + k, 1, 2, a,
                                   sizeof a);
        llmq_tensor_expert_hf_name(LLMQ_ARCH_QWEN3_MOE, LLMQ_EXPERT_NAMES_GPTQMODEL, LLMQ_T_FFN_GATE_EXPS + k, 1, 2, b,
                                   sizeof b);
        CHECK(!strcmp(a, b));
    }
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    test_expert_names();
    CHECK(mkdtemp(tmpdir));
    test_permutation();
    // SPM vocabulary, untied, GQA (2 heads / 1 kv head)
    round_trip("spm", &(struct spec){"llama", 16, 2, 1, 24, 2, false, true, false, false}, 0);
    // byte-level BPE, tied, MHA, sharded HF output
    round_trip("bpe", &(struct spec){"llama", 24, 3, 3, 32, 2, true, false, false, false}, 4000);
    // qwen2 with q/k/v biases (no permutation), BPE
    round_trip("qwen", &(struct spec){"qwen2", 16, 4, 2, 8, 1, true, false, false, false}, 0);
    // qwen3: q_norm / k_norm per head, no biases, untied
    round_trip("qwen3", &(struct spec){"qwen3", 16, 2, 1, 8, 2, false, false, false, false}, 0);
    // gemma2 / gemma3: post norms, norms + 1 in GGUF (- 1 in HF), gemma3's q/k norms; llama.cpp's defaults for the
    // window, soft-capping and period
    round_trip("gemma2", &(struct spec){"gemma2", 16, 2, 1, 8, 2, true, false, false, false}, 0);
    round_trip("gemma3", &(struct spec){"gemma3", 16, 2, 1, 8, 2, false, false, false, false}, 0);
    // llama3 rope scaling: rope_freqs.weight -> config.json rope_scaling -> the same tensor
    round_trip("llama3", &(struct spec){"llama", 256, 2, 1, 8, 1, true, false, true, false}, 0);
    test_gguf_dtypes();
    test_hf_bf16_mistral();
    test_refusals();
    test_remove_tree(tmpdir);
    printf("test_convert: ok\n");
    return 0;
}
