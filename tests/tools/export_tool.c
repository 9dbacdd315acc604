// tests/tools/export_tool.c — drives quant/export.h for tests/py/test_export_oracle.py.
//
//   export_tool quantize MODEL OUT awq|gptq|fake BITS GROUP sym|asym [--act-order] [--layers N]
//                        [--ref REFDIR] [--force] [--abort-at L]
//       RTN-quantizes every linear of MODEL (quant/quantizer.h llmq_rtn_quantize) and exports it.
//       --layers N keeps the first N blocks only (a small model for fast tests; config.json then
//       says N layers). --act-order replaces g_idx by a seeded permutation (every group keeps G
//       columns; codes / scales / zeros are left as they are: the packing does not care how they
//       were found). --ref writes REFDIR/model.safetensors with, per linear, under <p>.weight in HF row order, the f32
//       weights the output must decode to: W = (float)(q - z) * s with s rounded to fp16 (awq, gptq) or kept in f32
//       (fake). --abort-at L calls llmq_export_abort after layer L (atomicity tests).
//   export_tool dequant DIR OUTDIR
//       Loads DIR with llmq_model_load and writes OUTDIR/model.safetensors with every linear as llmq sees it (f32, HF
//       names).
// Exit 0 on success, 1 on any error (logged on stderr), 2 on bad usage.
#include "calib/model/model.h"
#include "common/dtype.h"
#include "common/io.h"
#include "common/status.h"
#include "formats/convert/convert.h"
#include "formats/safetensors.h"
#include "quant/export.h"
#include "quant/quantizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *hf_lin[LLMQ_LIN_COUNT] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                             "mlp.down_proj"};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) { return test_xorshift64s(&rng_state); }

static int usage(void) {
    fprintf(stderr, "usage: export_tool quantize MODEL OUT awq|gptq|fake BITS GROUP sym|asym [--act-order] "
                    "[--layers N] [--ref REFDIR] [--force] [--abort-at L]\n"
                    "       export_tool dequant DIR OUTDIR\n");
    return 2;
}

// Declares (pass 0) or writes (pass 1) every linear of m into w as f32 <p>.weight.
static enum llmq_status dump_linears(const struct llmq_model *m, const char *out) {
    struct llmq_st_writer *w = NULL;
    enum llmq_status st;
    float *buf = NULL;
    char name[160];
    mkdir(out, 0755);
    if ((st = llmq_st_writer_init(out, 0, &w))) return st;
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            snprintf(name, sizeof name, "model.layers.%lld.%s.weight", (long long)l, hf_lin[k]);
            if ((st = llmq_st_writer_add_tensor(w, name, LLMQ_DTYPE_F32, 2, m->layers[l].w[k]->shape))) goto done;
        }
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v = m->layers[l].w[k];
            size_t n = (size_t)v->shape[0] * (size_t)v->shape[1];
            free(buf);
            if (!(buf = malloc(n * 4))) {
                st = LLMQ_ERR_NOMEM;
                goto done;
            }
            if ((st = llmq_model_weight_f32(v, buf, 2)) || (st = llmq_st_writer_write(w, buf, n * 4))) goto done;
        }
    st = llmq_st_writer_finish(w);
    w = NULL;
done:
    llmq_st_writer_abort(w);
    free(buf);
    return st;
}

int main(int argc, char **argv) {
    struct llmq_model *m = NULL;
    struct llmq_export *e = NULL;
    struct llmq_st_writer *ref = NULL;
    struct llmq_qlinear ql = {0};
    float *W = NULL, *D = NULL;
    enum llmq_status st = LLMQ_OK;
    json_t *prov = NULL;

    if (argc >= 4 && strcmp(argv[1], "dequant") == 0) {
        if ((st = llmq_model_load(argv[2], &m))) return 1;
        st = dump_linears(m, argv[3]);
        llmq_model_free(m);
        return st ? 1 : 0;
    }
    if (argc < 8 || strcmp(argv[1], "quantize") != 0) return usage();
    struct llmq_export_opts o = llmq_export_default_opts();
    if (!llmq_export_format_parse(argv[4], &o.format)) return usage();
    o.q.bits = atoi(argv[5]);
    o.q.group_size = atoi(argv[6]);
    o.q.sym = strcmp(argv[7], "sym") == 0;
    int64_t layers = -1, abort_at = -1;
    const char *ref_path = NULL;
    bool act_order = false;
    for (int i = 8; i < argc; i++) {
        if (!strcmp(argv[i], "--act-order"))
            act_order = true;
        else if (!strcmp(argv[i], "--force"))
            o.force = true;
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--abort-at") && i + 1 < argc)
            abort_at = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--ref") && i + 1 < argc)
            ref_path = argv[++i];
        else
            return usage();
    }
    o.desc_act = act_order;
    if ((st = llmq_model_load(argv[2], &m))) goto done;
    if (layers > 0 && layers < m->hp.n_layer) m->hp.n_layer = layers;
    prov = json_pack("{s:s, s:s, s:i}", "method", "rtn", "tool", "export_tool", "seed", 0);
    o.provenance = prov;
    if ((st = llmq_export_begin(m, argv[3], &o, &e))) goto done;
    if (ref_path) {
        mkdir(ref_path, 0755);
        if ((st = llmq_st_writer_init(ref_path, 0, &ref))) goto done;
        char name[160];
        for (int64_t l = 0; l < m->hp.n_layer; l++)
            for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
                snprintf(name, sizeof name, "model.layers.%lld.%s.weight", (long long)l, hf_lin[k]);
                if ((st = llmq_st_writer_add_tensor(ref, name, LLMQ_DTYPE_F32, 2, m->layers[l].w[k]->shape))) goto done;
            }
    }
    char what[64];
    for (int64_t l = 0; l < m->hp.n_layer; l++) {
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            const struct llmq_tensor_view *v = m->layers[l].w[k];
            int64_t R = v->shape[0], C = v->shape[1];
            free(W);
            free(D);
            W = malloc((size_t)R * (size_t)C * 4);
            D = malloc((size_t)R * (size_t)C * 4);
            if (!W || !D) {
                st = LLMQ_ERR_NOMEM;
                goto done;
            }
            snprintf(what, sizeof what, "blk.%lld.%s", (long long)l, llmq_linear_name((enum llmq_linear)k));
            if ((st = llmq_model_weight_f32(v, W, 2)) || (st = llmq_rtn_quantize(what, W, R, C, &o.q, &ql))) goto done;
            if (act_order && o.q.group_size > 0) { // g_idx = group of the column's position in a random order
                int32_t *perm = malloc((size_t)C * sizeof *perm);
                for (int64_t c = 0; c < C; c++) perm[c] = (int32_t)c;
                for (int64_t c = C - 1; c > 0; c--) {
                    int64_t j = (int64_t)(rng() % (uint64_t)(c + 1));
                    int32_t t = perm[c];
                    perm[c] = perm[j];
                    perm[j] = t;
                }
                for (int64_t i = 0; i < C; i++) ql.g_idx[perm[i]] = (int32_t)(i / o.q.group_size);
                free(perm);
            }
            if (ref) { // expected decode, HF row order
                int64_t heads = 0;
                if (m->from_gguf && m->hp.rope_type == LLMQ_ROPE_NORM)
                    heads = k == LLMQ_LIN_Q ? m->hp.n_head : k == LLMQ_LIN_K ? m->hp.n_head_kv : 0;
                for (int64_t n = 0; n < R; n++) {
                    int64_t r = heads ? llmq_arch_qk_src_row(n, R, heads, false) : n;
                    for (int64_t c = 0; c < C; c++) {
                        int64_t g = ql.g_idx[c];
                        float s = ql.scales[r * ql.n_groups + g];
                        if (o.format != LLMQ_EXPORT_FAKE) s = llmq_f16_to_f32(llmq_f32_to_f16(s));
                        D[n * C + c] = ((float)ql.q[r * C + c] - ql.zeros[r * ql.n_groups + g]) * s;
                    }
                }
                if ((st = llmq_st_writer_write(ref, D, (size_t)R * (size_t)C * 4))) goto done;
            }
            if ((st = llmq_export_layer(e, l, (enum llmq_linear)k, &ql))) goto done;
            llmq_qlinear_free(&ql);
        }
        if (l == abort_at) {
            llmq_export_abort(e);
            e = NULL;
            goto done;
        }
    }
    st = llmq_export_finish(e);
    e = NULL;
    if (st) goto done;
    if (ref) {
        st = llmq_st_writer_finish(ref);
        ref = NULL;
    }
done:
    llmq_export_abort(e);
    llmq_st_writer_abort(ref);
    llmq_qlinear_free(&ql);
    free(W);
    free(D);
    json_decref(prov);
    llmq_model_free(m);
    if (st) fprintf(stderr, "export_tool: %s\n", llmq_status_name(st));
    return st ? 1 : 0;
}
