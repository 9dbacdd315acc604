// tests/unit/test_export.c — quant/export.h: the bit packers against hand-computed words and as
// round trips (2..8 bits, 3-bit words straddled), then stories260K (llama GGUF, 5 blocks, 64 x 172
// ffn) through RTN -> --format gptq 8-bit (one file, and sharded) -> calib/model/model.c loader: every linear comes
// back bit for bit as W = f32(q - z) * f32(fp16(s)) in HF row order (q/k permutation undone); layers handed over out of
// order give the same bytes; an existing output is refused (kept) and replaced with force; abort and failed finishes
// leave nothing; bad bits / shapes / qlinears are refused naming the layer; quant/writer.h's targets and its refusal of
// a payload of the wrong kind, over this writer and the GGUF one; a block's norms handed over through
// llmq_qwriter_put_block are what both writers store (copied at the call), a late hand-over is refused. The independent
// Python unpacker and SmolLM2 cases are in tests/py/test_export_oracle.py.
#include "harness.h"

#include "calib/model/model.h"
#include "common/dtype.h"
#include "common/io.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/convert/convert.h"
#include "formats/ggml/encode.h"
#include "quant/export.h"
#include "quant/quantizer.h"
#include "quant/writer.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/llmq_test_export_XXXXXX";
static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) { return test_xorshift64(&rs); }

static char *tpath(const char *name) { return test_path(tmpdir, name); }

static void test_packing(void) {
    uint8_t c[8] = {0, 1, 2, 3, 4, 5, 6, 7}, back[64];
    // AWQ: nibble i holds column order[i] = 0,2,4,6,1,3,5,7
    CHECK(llmq_awq_pack8(c) == 0x75316420u);
    llmq_awq_unpack8(0x75316420u, back);
    CHECK(memcmp(back, c, 8) == 0);
    // GPTQ 3 bits, AutoGPTQ's scheme: value 10 has its low 2 bits at word0 bits 30-31, bit 2 at word1
    // bit 0; value 21 its low bit at word1 bit 31 and bits 1-2 at word2 bits 0-1.
    uint8_t v[32] = {0};
    uint32_t w[8];
    v[10] = 7;
    v[21] = 5;
    v[31] = 6;
    llmq_pack_bits(v, 1, 32, 3, w);
    CHECK(w[0] == 0xC0000000u && w[1] == 0x80000001u && w[2] == ((5u >> 1) | (6u << 29)));
    // 4 bits natural order: value j at bits 4j
    for (int i = 0; i < 8; i++) v[i] = (uint8_t)(i + 8);
    llmq_pack_bits(v, 1, 8, 4, w);
    CHECK(w[0] == 0xFEDCBA98u);
    // round trips, with a stride
    for (int bits = 2; bits <= 8; bits++) {
        uint8_t in[64 * 3], out[64 * 3];
        uint32_t words[64];
        for (int i = 0; i < 64 * 3; i++) in[i] = (uint8_t)(rnd() & ((1u << bits) - 1));
        llmq_pack_bits(in, 3, 64, bits, words);
        memset(out, 0xAA, sizeof out);
        llmq_unpack_bits(words, 64, bits, out, 3);
        for (int i = 0; i < 64; i++) CHECK_EQ_INT(out[3 * i], in[3 * i]);
        CHECK_EQ_INT(out[1], 0xAA);
    }
    enum llmq_export_format f;
    CHECK(llmq_export_format_parse("gptq", &f) && f == LLMQ_EXPORT_GPTQ);
    CHECK(!llmq_export_format_parse("gguf", &f));
}

// RTN-quantizes every linear of m (reversed: last layer first, when `reverse`) into an export.
static enum llmq_status export_all(const struct llmq_model *m, const char *out, const struct llmq_export_opts *o,
                                   bool reverse, int skip_layer) {
    struct llmq_export *e = NULL;
    enum llmq_status st = llmq_export_begin(m, out, o, &e);
    if (st) return st;
    for (int64_t i = 0; i < m->hp.n_layer; i++) {
        int64_t l = reverse ? m->hp.n_layer - 1 - i : i;
        if (l == skip_layer) continue;
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v = m->layers[l].w[k];
            int64_t R = v->shape[0], C = v->shape[1];
            float *W = malloc((size_t)(R * C) * 4);
            struct llmq_qlinear ql = {0};
            CHECK(W);
            CHECK_OK(llmq_model_weight_f32(v, W, 1));
            CHECK_OK(llmq_rtn_quantize("t", W, R, C, &o->q, &ql));
            st = llmq_export_layer(e, l, (enum llmq_linear)k, &ql);
            llmq_qlinear_free(&ql);
            free(W);
            if (st) {
                llmq_export_abort(e);
                return st;
            }
        }
    }
    return llmq_export_finish(e);
}

// The seven linears of block l of m into w as their targets take them (CODES: RTN on the grid, ROWS: the type's
// encoder, F32: the weights).
static enum llmq_status put_linears(const struct llmq_model *m, struct llmq_qwriter *w, int64_t l) {
    enum llmq_status st = LLMQ_OK;
    for (int k = 0; k < LLMQ_LIN_COUNT && !st; k++) {
        const struct llmq_tensor_view *v = m->layers[l].w[k];
        int64_t R = v->shape[0], C = v->shape[1];
        struct llmq_qtarget t = llmq_qwriter_target(w, l, (enum llmq_linear)k);
        float *W = malloc((size_t)(R * C) * 4);
        uint8_t *rows = malloc((size_t)(R * C) * 4);
        struct llmq_qlinear ql = {0};
        CHECK(W && rows);
        CHECK_OK(llmq_model_weight_f32(v, W, 1));
        if (t.kind == LLMQ_QPAYLOAD_CODES) CHECK_OK(llmq_rtn_quantize("t", W, R, C, &t.q, &ql));
        if (t.kind == LLMQ_QPAYLOAD_ROWS) CHECK_OK(llmq_gguf_encode_rows(t.type, W, rows, R, C, NULL, 1));
        st = llmq_qwriter_put_linear(w, l, (enum llmq_linear)k,
                                     &(struct llmq_qpayload){.kind = t.kind, .codes = &ql, .rows = rows, .w = W});
        llmq_qlinear_free(&ql);
        free(W);
        free(rows);
    }
    return st;
}

// The norms of block 2 handed over as a weight set of the driver's (attn_norm * 3, ffn_norm + 0.5, F32 views
// overwritten right after the call): a directory and a GGUF file store exactly those, every other block the
// model's; a hand-over after the block's linears is refused.
static void test_block_tensors(const struct llmq_model *m, const struct llmq_export_opts *dir) {
    const int64_t D = m->hp.n_embd;
    struct llmq_gguf_export_opts go = llmq_gguf_export_default_opts();
    go.progress = false;
    const struct llmq_qwriter_opts wo[2] = {{.dir = dir}, {.gguf = &go}};
    const char *out[2] = {"blockdir", "block.gguf"};
    for (int i = 0; i < 2; i++) {
        float *an = malloc((size_t)D * 4), *fn = malloc((size_t)D * 4), *want = malloc((size_t)(2 * D) * 4);
        float *a = malloc((size_t)(2 * D) * 4), *b = malloc((size_t)(2 * D) * 4);
        CHECK(an && fn && want && a && b);
        CHECK_OK(llmq_model_weight_f32(m->layers[2].attn_norm, an, 1));
        CHECK_OK(llmq_model_weight_f32(m->layers[2].ffn_norm, fn, 1));
        for (int64_t d = 0; d < D; d++) {
            want[d] = an[d] *= 3.0f;
            want[D + d] = fn[d] += 0.5f;
        }
        struct llmq_tensor_view va = *m->layers[2].attn_norm, vf = *m->layers[2].ffn_norm;
        va.dtype = vf.dtype = LLMQ_DTYPE_F32;
        va.data = an, vf.data = fn;
        va.nbytes = vf.nbytes = (size_t)D * 4;
        struct llmq_layer ly = m->layers[2];
        ly.attn_norm = &va, ly.ffn_norm = &vf;
        struct llmq_qwriter *w = NULL;
        CHECK_OK(llmq_qwriter_begin(m, tpath(out[i]), &wo[i], &w));
        for (int64_t l = 0; l < m->hp.n_layer; l++) {
            if (l == 2) {
                CHECK_OK(llmq_qwriter_put_block(w, l, &ly));
                for (int64_t d = 0; d < D; d++) an[d] = fn[d] = -7.0f; // copied at the call: not read again
            }
            CHECK_OK(put_linears(m, w, l));
        }
        CHECK_OK(llmq_qwriter_finish(w));
        struct llmq_model *back = NULL;
        CHECK_OK(llmq_model_load(tpath(out[i]), &back));
        for (int64_t l = 0; l < m->hp.n_layer; l++) {
            CHECK_OK(llmq_model_weight_f32(back->layers[l].attn_norm, a, 1));
            CHECK_OK(llmq_model_weight_f32(back->layers[l].ffn_norm, a + D, 1));
            CHECK_OK(llmq_model_weight_f32(m->layers[l].attn_norm, b, 1));
            CHECK_OK(llmq_model_weight_f32(m->layers[l].ffn_norm, b + D, 1));
            CHECK(memcmp(a, l == 2 ? want : b, (size_t)(2 * D) * 4) == 0);
        }
        llmq_model_free(back);
        free(an), free(fn), free(want), free(a), free(b);
        // too late: after the block's linears (a directory refuses from its q on, GGUF once the norms are written)
        CHECK_OK(llmq_qwriter_begin(m, tpath("late"), &wo[i], &w));
        CHECK_OK(put_linears(m, w, 0));
        CHECK(llmq_qwriter_put_block(w, 0, &m->layers[0]) == LLMQ_ERR_ARG);
        CHECK_CONTAINS(llmq_last_error(), "handed over after");
        CHECK(llmq_qwriter_put_block(w, m->hp.n_layer, &m->layers[0]) == LLMQ_ERR_ARG);
        llmq_qwriter_abort(w);
    }
}

static void test_stories_gptq(const char *stories) {
    struct llmq_model *m = NULL, *back = NULL;
    CHECK_OK(llmq_model_load(stories, &m));
    struct llmq_export_opts o = llmq_export_default_opts();
    o.format = LLMQ_EXPORT_GPTQ;
    o.q = (struct llmq_qconfig){.bits = 8, .group_size = 4, .sym = true};
    o.max_shard_bytes = 0;
    CHECK_OK(export_all(m, tpath("g8"), &o, false, -1));
    CHECK_OK(llmq_model_load(tpath("g8"), &back));
    CHECK(back->quant && !strcmp(back->quant->method, "gptq") && !strcmp(back->quant->checkpoint_format, "gptq"));
    CHECK_EQ_INT(back->quant->n_dequantized, m->hp.n_layer * LLMQ_LIN_COUNT);
    CHECK(back->hp.n_layer == m->hp.n_layer && back->hp.n_embd == m->hp.n_embd);
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v = m->layers[l].w[k], *b = back->layers[l].w[k];
            int64_t R = v->shape[0], C = v->shape[1];
            int64_t heads = k == LLMQ_LIN_Q ? m->hp.n_head : k == LLMQ_LIN_K ? m->hp.n_head_kv : 0;
            float *W = malloc((size_t)(R * C) * 4);
            struct llmq_qlinear ql = {0};
            CHECK_OK(llmq_model_weight_f32(v, W, 1));
            CHECK_OK(llmq_rtn_quantize("t", W, R, C, &o.q, &ql));
            CHECK(b->dtype == LLMQ_DTYPE_F32 && b->shape[0] == R && b->shape[1] == C);
            const float *D = b->data;
            for (int64_t n = 0; n < R; n++) {
                int64_t r = heads ? llmq_arch_qk_src_row(n, R, heads, false) : n;
                for (int64_t c = 0; c < C; c++) {
                    int64_t g = ql.g_idx[c];
                    float s = llmq_f16_to_f32(llmq_f32_to_f16(ql.scales[r * ql.n_groups + g]));
                    float want = ((float)ql.q[r * C + c] - ql.zeros[r * ql.n_groups + g]) * s;
                    CHECK(memcmp(&want, &D[n * C + c], 4) == 0);
                }
            }
            llmq_qlinear_free(&ql);
            free(W);
        }
    // sharded: the same weights through model.safetensors.index.json
    struct llmq_model *sh = NULL;
    o.max_shard_bytes = 40000;
    CHECK_OK(export_all(m, tpath("g8sharded"), &o, false, -1));
    o.max_shard_bytes = 0;
    char idx[600];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", tpath("g8sharded"));
    CHECK(llmq_file_exists(idx));
    CHECK_OK(llmq_model_load(tpath("g8sharded"), &sh));
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++)
            CHECK(memcmp(sh->layers[l].w[k]->data, back->layers[l].w[k]->data, back->layers[l].w[k]->nbytes) == 0);
    llmq_model_free(sh);
    llmq_model_free(back);

    // the same layers handed over last block first: the same bytes
    CHECK_OK(export_all(m, tpath("g8rev"), &o, true, -1));
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/model.safetensors", tpath("g8"));
    snprintf(b, sizeof b, "%s/model.safetensors", tpath("g8rev"));
    CHECK(test_same_file(a, b));

    // an existing output: refused and kept; replaced with force
    struct stat st0, st1;
    CHECK(stat(a, &st0) == 0);
    o.q.sym = false;
    CHECK(export_all(m, tpath("g8"), &o, false, -1) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "exists");
    CHECK(stat(a, &st1) == 0 && st1.st_ino == st0.st_ino);
    o.force = true;
    CHECK_OK(export_all(m, tpath("g8"), &o, false, -1));
    CHECK_OK(llmq_model_load(tpath("g8"), &back));
    CHECK(!strcmp(back->quant->checkpoint_format, "gptq_v2") && !back->quant->sym);
    llmq_model_free(back);
    o.force = false;

    // abort and an unfinished export leave nothing; a missing linear is named
    int before = test_count_entries(tmpdir);
    struct llmq_export *e = NULL;
    CHECK_OK(llmq_export_begin(m, tpath("aborted"), &o, &e));
    CHECK_EQ_INT(test_count_entries(tmpdir), before + 1); // the .tmp.<pid> directory
    llmq_export_abort(e);
    CHECK_EQ_INT(test_count_entries(tmpdir), before);
    CHECK(export_all(m, tpath("missing"), &o, false, 3) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "without model.layers.3.self_attn.q_proj");
    CHECK_EQ_INT(test_count_entries(tmpdir), before);

    // a qlinear that does not match the export, twice handed over, out-of-range layer
    CHECK_OK(llmq_export_begin(m, tpath("bad"), &o, &e));
    struct llmq_qlinear ql = {0};
    struct llmq_qconfig q4 = {.bits = 4, .group_size = 4, .sym = false};
    int64_t R = m->layers[0].w[LLMQ_LIN_UP]->shape[0], C = m->layers[0].w[LLMQ_LIN_UP]->shape[1];
    float *W = calloc((size_t)(R * C), 4);
    CHECK_OK(llmq_rtn_quantize("t", W, R, C, &q4, &ql));
    CHECK(llmq_export_layer(e, 0, LLMQ_LIN_UP, &ql) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "model.layers.0.mlp.up_proj: quantized as 172 x 64, 4 bits");
    llmq_qlinear_free(&ql);
    CHECK_OK(llmq_rtn_quantize("t", W, R, C, &o.q, &ql));
    CHECK_OK(llmq_export_layer(e, 0, LLMQ_LIN_UP, &ql));
    CHECK(llmq_export_layer(e, 0, LLMQ_LIN_UP, &ql) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "handed over twice");
    CHECK(llmq_export_layer(e, 99, LLMQ_LIN_UP, &ql) == LLMQ_ERR_ARG);
    ql.zeros[0] = 0.5f; // not an integer zero point
    CHECK(llmq_export_layer(e, 1, LLMQ_LIN_UP, &ql) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "zero point 0.5");
    llmq_qlinear_free(&ql);
    free(W);
    CHECK(llmq_export_finish(e) == LLMQ_ERR_ARG); // linears missing
    CHECK_EQ_INT(test_count_entries(tmpdir), before);

    // quant/writer.h over this writer: every target is the export's grid; another payload kind is refused
    // naming the linear and changes nothing; abort leaves nothing
    struct llmq_qwriter *w = NULL;
    CHECK_OK(llmq_qwriter_check(m, &(struct llmq_qwriter_opts){.dir = &o}));
    CHECK_OK(llmq_qwriter_begin(m, tpath("writer"), &(struct llmq_qwriter_opts){.dir = &o}, &w));
    struct llmq_qtarget t = llmq_qwriter_target(w, 2, LLMQ_LIN_DOWN);
    CHECK(t.kind == LLMQ_QPAYLOAD_CODES && t.type == LLMQ_DTYPE_INVALID && !t.importance);
    CHECK(t.q.bits == o.q.bits && t.q.group_size == o.q.group_size && t.q.sym == o.q.sym);
    uint8_t rows[16] = {0};
    CHECK(llmq_qwriter_put_linear(w, 2, LLMQ_LIN_DOWN,
                                  &(struct llmq_qpayload){.kind = LLMQ_QPAYLOAD_ROWS, .rows = rows}) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "blk.2.ffn_down: handed over as encoded rows, the output takes integer codes");
    llmq_qwriter_print_plan(w, stderr); // a directory has none
    llmq_qwriter_abort(w);
    CHECK_EQ_INT(test_count_entries(tmpdir), before);
    // over the GGUF writer (a dry run creates nothing): Q8_0 where 32 tiles C, the mix's fallback for the
    // 172-wide ffn_down, which is not a block type here and so handed over as f32
    struct llmq_gguf_export_opts go = llmq_gguf_export_default_opts();
    go.dry_run = true;
    go.progress = false;
    CHECK_OK(llmq_qwriter_begin(m, tpath("writer.gguf"), &(struct llmq_qwriter_opts){.gguf = &go}, &w));
    t = llmq_qwriter_target(w, 0, LLMQ_LIN_Q);
    CHECK(t.kind == LLMQ_QPAYLOAD_ROWS && t.type == LLMQ_DTYPE_Q8_0 && !t.importance);
    t = llmq_qwriter_target(w, 0, LLMQ_LIN_DOWN);
    CHECK(t.kind == (llmq_dtype_traits(t.type)->is_quant ? LLMQ_QPAYLOAD_ROWS : LLMQ_QPAYLOAD_F32));
    CHECK(llmq_qwriter_put_linear(w, 0, LLMQ_LIN_Q, &(struct llmq_qpayload){.kind = LLMQ_QPAYLOAD_CODES}) ==
          LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "blk.0.attn_q: handed over as integer codes, the output takes encoded rows");
    llmq_qwriter_abort(w);
    CHECK_EQ_INT(test_count_entries(tmpdir), before);

    // formats that cannot hold the model: refused at begin, naming layer and shape
    struct {
        enum llmq_export_format f;
        int bits, G;
        enum llmq_status st;
        const char *msg;
    } bad[] = {
        {LLMQ_EXPORT_AWQ, 4, 4, LLMQ_ERR_ARG,
         "model.layers.0.mlp.gate_proj (172 x 64): out_features 172 is not a multiple of 8"},
        {LLMQ_EXPORT_GPTQ, 8, 64, LLMQ_ERR_ARG,
         "model.layers.0.mlp.down_proj (64 x 172): in_features 172 is not a multiple of group size 64"},
        {LLMQ_EXPORT_GPTQ, 4, 4, LLMQ_ERR_ARG, "model.layers.0.mlp.gate_proj (172 x 64): GPTQ packs 4-bit codes"},
        {LLMQ_EXPORT_GPTQ, 3, 4, LLMQ_ERR_ARG, "multiples of 32"},
        {LLMQ_EXPORT_AWQ, 3, 4, LLMQ_ERR_UNSUPPORTED, "4-bit weights only"},
        {LLMQ_EXPORT_AWQ, 4, -1, LLMQ_ERR_UNSUPPORTED, "needs a group size"},
        {LLMQ_EXPORT_GPTQ, 5, 4, LLMQ_ERR_UNSUPPORTED, "2, 3, 4 or 8 bits"},
        {LLMQ_EXPORT_FAKE, 9, 4, LLMQ_ERR_ARG, "9 bits"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct llmq_export_opts ob = o;
        ob.format = bad[i].f;
        ob.q.bits = bad[i].bits;
        ob.q.group_size = bad[i].G;
        e = (struct llmq_export *)1;
        CHECK(llmq_export_begin(m, tpath("refused"), &ob, &e) == bad[i].st);
        CHECK(e == NULL);
        CHECK_CONTAINS(llmq_last_error(), bad[i].msg);
        CHECK_EQ_INT(test_count_entries(tmpdir), before);
    }
    // the group size suggested instead: the largest power of two <= the asked one dividing 64 and 172
    CHECK_EQ_INT(llmq_export_fit_group(m, 128), 4);
    CHECK_EQ_INT(llmq_export_fit_group(m, 4), 4);
    CHECK_EQ_INT(llmq_export_fit_group(m, 3), 2);
    CHECK_EQ_INT(llmq_export_fit_group(m, 1), 1);
    CHECK(llmq_export_check(m, &(struct llmq_export_opts){.format = LLMQ_EXPORT_GPTQ,
                                                          .q = {.bits = 8, .group_size = 64}}) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "--group-size 4 tiles every linear");

    // fake: any width and group (64 does not tile the 172-wide ffn_down: a partial last group), f32
    // from an f32 input, loads as a plain model
    o.format = LLMQ_EXPORT_FAKE;
    o.q = (struct llmq_qconfig){.bits = 3, .group_size = 64, .sym = false};
    CHECK_OK(export_all(m, tpath("fake64"), &o, false, -1));
    o.q = (struct llmq_qconfig){.bits = 3, .group_size = -1, .sym = false};
    CHECK_OK(export_all(m, tpath("fake"), &o, false, -1));
    CHECK_OK(llmq_model_load(tpath("fake"), &back));
    CHECK(back->quant == NULL && back->layers[0].w[LLMQ_LIN_DOWN]->dtype == LLMQ_DTYPE_F32);
    llmq_model_free(back);
    test_block_tensors(m, &o);
    llmq_model_free(m);
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(mkdtemp(tmpdir));
    test_packing();
    char stories[1024];
    test_need_file(test_stories260k(stories, sizeof stories, "tinyllamas-stories-260k-f32.gguf"));
    test_stories_gptq(stories);
    llmq_remove_tree(tmpdir);
    return 0;
}
