// quant/export.c — AWQ GEMM / GPTQ / fake-quant HF directories, streamed (contracts in quant/export.h).
// Mirrors AutoAWQ WQLinear_GEMM.from_linear (+ packing_utils) and AutoGPTQ / GPTQModel
// QuantLinear.pack for the tensor layouts; formats/hf/hfdir.h supplies the HF side files, the output
// directory handling; formats/llama/arch.h the GGUF q/k row order.
//
// Legend: R rows = out_features, C cols = in_features, G group size, ng groups per row, b bits.
//
// The output is a list of slots in stream order (model tensors and linears); a slot is written when
// every slot before it has been, so the safetensors writer receives bytes in declared order.
#include "quant/export.h"

#include "common/dtype.h"
#include "common/io.h"
#include "common/log.h"
#include "formats/hf/hfdir.h"
#include "formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_FLOATS (1 << 20) // model tensors are converted 4 MiB of f32 at a time
#define MAX_PARTS 5            // qweight, qzeros, scales, g_idx, bias
#define N_GIVEN                                                                                                        \
    7 // a block's tensors a driver hands over (llmq_export_block): norms, q / k / v biases,
      // the moe router, qwen2_moe's shared expert gate

const int LLMQ_AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

struct llmq_export_opts llmq_export_default_opts(void) {
    return (struct llmq_export_opts){.format = LLMQ_EXPORT_AWQ,
                                     .q = {.bits = 4, .group_size = 128, .sym = false},
                                     .desc_act = false,
                                     .static_groups = false,
                                     .true_sequential = true,
                                     .damp_percent = 0.01f,
                                     .fake_dtype = LLMQ_DTYPE_COUNT,
                                     .max_shard_bytes = 5000000000ull,
                                     .force = false,
                                     .provenance = NULL,
                                     .expert_names = LLMQ_EXPERT_NAMES_HUB};
}

const char *llmq_export_format_name(enum llmq_export_format f) {
    switch (f) {
    case LLMQ_EXPORT_AWQ: return "awq";
    case LLMQ_EXPORT_GPTQ: return "gptq";
    case LLMQ_EXPORT_FAKE: return "fake";
    }
    return "?";
}

bool llmq_export_format_parse(const char *name, enum llmq_export_format *out) {
    for (int f = LLMQ_EXPORT_AWQ; f <= LLMQ_EXPORT_FAKE; f++)
        if (name && strcmp(name, llmq_export_format_name((enum llmq_export_format)f)) == 0) {
            *out = (enum llmq_export_format)f;
            return true;
        }
    return false;
}

// ================================================================================ packing ====

void llmq_pack_bits(const uint8_t *v, int64_t stride, int64_t n, int bits, uint32_t *out) {
    int64_t n_words = n * bits / 32;
    memset(out, 0, (size_t)n_words * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
        uint64_t bit = (uint64_t)i * (uint64_t)bits, word = bit / 32, off = bit % 32;
        uint64_t x = (uint64_t)v[i * stride] << off; // may straddle two words (3 bits)
        out[word] |= (uint32_t)x;
        if (off + (uint64_t)bits > 32) out[word + 1] |= (uint32_t)(x >> 32);
    }
}

void llmq_unpack_bits(const uint32_t *words, int64_t n, int bits, uint8_t *v, int64_t stride) {
    uint32_t mask = (1u << bits) - 1;
    for (int64_t i = 0; i < n; i++) {
        uint64_t bit = (uint64_t)i * (uint64_t)bits, word = bit / 32, off = bit % 32;
        uint64_t x = words[word] >> off;
        if (off + (uint64_t)bits > 32) x |= (uint64_t)words[word + 1] << (32 - off);
        v[i * stride] = (uint8_t)(x & mask);
    }
}

uint32_t llmq_awq_pack8(const uint8_t *c) {
    uint32_t w = 0;
    for (int i = 0; i < 8; i++) w |= (uint32_t)(c[LLMQ_AWQ_ORDER[i]] & 15u) << (4 * i);
    return w;
}

void llmq_awq_unpack8(uint32_t w, uint8_t *c) {
    for (int i = 0; i < 8; i++) c[LLMQ_AWQ_ORDER[i]] = (uint8_t)((w >> (4 * i)) & 15u);
}

// ================================================================================ the export ====

// SLOT_NORM: a norm that no linear waits for (q_norm / k_norm, gemma's post norms), after down_proj.
enum slot_kind {
    SLOT_EMBED,
    SLOT_ATTN_NORM,
    SLOT_FFN_NORM,
    SLOT_NORM,
    SLOT_LINEAR,
    SLOT_ROUTER, // a moe block's router or (role LLMQ_T_FFN_GATE_INP_SHEXP) shared expert gate (unquantized)
    SLOT_OUT_NORM,
    SLOT_LM_HEAD
};

struct part { // one output tensor of a linear, packed and waiting for its turn in the stream
    char name[160];
    void *data;
    size_t nbytes;
};

struct slot {
    enum slot_kind kind;
    int64_t layer;
    enum llmq_linear which;
    int64_t expert;             // linears: the expert (moe gate / up / down), -1 for a dense linear
    enum llmq_tensor_role role; // model tensors: the role
    char name[160];             // model tensors: the HF tensor name
    int n_parts;                // linears: tensors declared for it
    bool ready;                 // linears: handed over and packed
    struct part parts[MAX_PARTS];
    // phi3's fused qkv_proj / gate_up_proj (on the slot of q / up, which holds its parts; the other members' slots
    // have none): the rows handed over so far, and which members they were (bit `which`)
    struct llmq_qlinear fused;
    unsigned fused_got;
};

struct llmq_export {
    const struct llmq_model *m;
    struct llmq_export_opts o;
    char *out, *tmp;
    bool replace;
    enum llmq_dtype dtype; // non-quantized tensors (and fake linears)
    struct llmq_st_writer *sw;
    struct slot *slots;   // (n_slots) in stream order
    int64_t n_slots, pos; // pos: first slot not yet written
    enum llmq_status poisoned;
    float *work;                    // (CHUNK_FLOATS) f32 conversion buffer
    void *conv;                     // (CHUNK_FLOATS * 4 bytes) converted buffer
    struct llmq_tensor_view *given; // (n_layer, N_GIVEN) copies of attn_norm, ffn_norm, bq, bk, bv handed over
                                    // (llmq_export_block; data NULL: none, or written already)
};

// The HF name of a linear without ".weight": "model.layers.N.self_attn.q_proj", an expert's
// "model.layers.N.mlp.experts.E.gate_proj" (qwen3_moe) / "...block_sparse_moe.experts.E.w1" (mixtral; with
// LLMQ_EXPERT_NAMES_GPTQMODEL "...mlp.experts.E.gate_proj"), in spelling `names` (quant/export.h).
static void lin_name_x(const struct llmq_model *m, enum llmq_expert_names names, char *buf, size_t n, int64_t layer,
                       enum llmq_linear w, int64_t expert) {
    enum llmq_linear head;
    int64_t r0, total;
    if (expert < 0 && llmq_arch_fused_part(&m->hp, w, &head, &r0, &total) && w == head) { // qkv_proj / gate_up_proj
        llmq_tensor_full_name(m->hp.arch, LLMQ_T_LINEAR_0 + head, layer, true, buf, n);
        size_t len = strlen(buf), sl = strlen(".weight");
        if (len > sl && strcmp(buf + len - sl, ".weight") == 0) buf[len - sl] = 0;
        return;
    }
    if (expert < 0) {
        llmq_arch_linear_full_name(m->hp.arch, w, layer, true, buf, n);
        return;
    }
    llmq_tensor_expert_hf_name(m->hp.arch, names, LLMQ_T_FFN_GATE_EXPS + (w - LLMQ_LIN_GATE), layer, expert, buf, n);
    size_t len = strlen(buf), sl = strlen(".weight");
    if (len > sl && strcmp(buf + len - sl, ".weight") == 0) buf[len - sl] = 0;
}

// Rows whose GGUF order must be undone: the q/k weights of a GGUF llama model (0: none).
static int64_t perm_heads(const struct llmq_model *m, enum llmq_linear w) {
    if (!m->from_gguf || !llmq_arch_qk_permuted(m->hp.arch)) return 0;
    if (w == LLMQ_LIN_Q) return m->hp.n_head;
    if (w == LLMQ_LIN_K) return m->hp.n_head_kv;
    return 0;
}

// The model-order row of output (HF) row r.
static int64_t src_row(int64_t r, int64_t R, int64_t heads) {
    return heads ? llmq_arch_qk_src_row(r, R, heads, false) : r;
}

static const struct llmq_tensor_view *lin_bias(const struct llmq_model *m, int64_t layer, enum llmq_linear w) {
    const struct llmq_layer *L = &m->layers[layer];
    return w == LLMQ_LIN_Q ? L->bq : w == LLMQ_LIN_K ? L->bk : w == LLMQ_LIN_V ? L->bv : NULL;
}

int llmq_export_fit_group(const struct llmq_model *m, int group_size) {
    int g = 1;
    while (g <= group_size / 2) g *= 2;
    for (; g > 1; g /= 2) {
        bool all = true;
        for (int64_t l = 0; all && l < m->hp.n_layer; l++)
            for (int k = 0; all && k < LLMQ_LIN_COUNT; k++) {
                int64_t x = m->hp.moe && k >= LLMQ_LIN_GATE ? 0 : -1; // moe: expert 0 stands for all (same shapes)
                all = llmq_layer_linear(&m->layers[l], k, x)->shape[1] % g == 0;
                if (all && x >= 0 && m->layers[l].w[k]) all = m->layers[l].w[k]->shape[1] % g == 0; // shared expert
            }
        if (all) break;
    }
    return g;
}

// Checks that the format can hold linear (R, C); `what` names it, fit is llmq_export_fit_group's answer.
static enum llmq_status check_shape(const struct llmq_export_opts *o, const char *what, int64_t R, int64_t C, int fit) {
    int b = o->q.bits, G = o->q.group_size;
    if (o->format == LLMQ_EXPORT_FAKE) return LLMQ_OK;
    if (G > 0 && C % G != 0)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "%s (%lld x %lld): in_features %lld is not a multiple of group size %d; --group-size %d "
                           "tiles every linear of the model (or -1 for per-channel%s, or --format fake)",
                           what, (long long)R, (long long)C, (long long)C, G, fit,
                           o->format == LLMQ_EXPORT_AWQ ? " with --format gptq" : "");
    if (o->format == LLMQ_EXPORT_AWQ) {
        if (R % 8 != 0)
            return llmq_errorf(LLMQ_ERR_ARG,
                               "%s (%lld x %lld): out_features %lld is not a multiple of 8 (AWQ GEMM packs 8 "
                               "output channels per int32)",
                               what, (long long)R, (long long)C, (long long)R);
        return LLMQ_OK;
    }
    if (((C * b) % 32) != 0 || ((R * b) % 32) != 0)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "%s (%lld x %lld): GPTQ packs %d-bit codes %s; in_features and out_features must be "
                           "multiples of %d",
                           what, (long long)R, (long long)C, b, b == 3 ? "32 per 3 int32 words" : "into int32 words",
                           b == 3 ? 32 : 32 / b);
    return LLMQ_OK;
}

static enum llmq_status check_opts(const struct llmq_export_opts *o) {
    int b = o->q.bits, G = o->q.group_size;
    if (G == 0 || G < -1) return llmq_errorf(LLMQ_ERR_ARG, "export: group size %d (use >= 1 or -1)", G);
    switch (o->format) {
    case LLMQ_EXPORT_AWQ:
        if (b != 4)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "export: --format awq holds 4-bit weights only (got %d bits; use --format gptq for "
                               "2/3/8 bits, or --format fake)",
                               b);
        if (G < 0)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "export: --format awq needs a group size (got -1; use --format gptq for per-channel)");
        return LLMQ_OK;
    case LLMQ_EXPORT_GPTQ:
        if (b != 2 && b != 3 && b != 4 && b != 8)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "export: --format gptq holds 2, 3, 4 or 8 bits (got %d; use --format fake)", b);
        return LLMQ_OK;
    case LLMQ_EXPORT_FAKE:
        if (b < LLMQ_QBITS_MIN || b > LLMQ_QBITS_MAX)
            return llmq_errorf(LLMQ_ERR_ARG, "export: %d bits (use %d..%d)", b, LLMQ_QBITS_MIN, LLMQ_QBITS_MAX);
        if (o->fake_dtype != LLMQ_DTYPE_COUNT && o->fake_dtype != LLMQ_DTYPE_F32 && o->fake_dtype != LLMQ_DTYPE_F16 &&
            o->fake_dtype != LLMQ_DTYPE_BF16)
            return llmq_errorf(LLMQ_ERR_ARG, "export: fake dtype %s (use f32, f16 or bf16)",
                               llmq_dtype_name(o->fake_dtype));
        return LLMQ_OK;
    }
    return llmq_errorf(LLMQ_ERR_ARG, "export: unknown format %d", (int)o->format);
}

// ---- JSON

static json_t *llmq_object(const struct llmq_export *e) {
    json_t *j =
        json_pack("{s:s, s:s, s:i, s:i, s:b}", "version", LLMQ_VERSION, "format", llmq_export_format_name(e->o.format),
                  "bits", e->o.q.bits, "group_size", e->o.q.group_size, "sym", e->o.q.sym);
    if (e->o.format == LLMQ_EXPORT_GPTQ)
        json_object_set_new(j, "checkpoint_format", json_string(e->o.q.sym ? "gptq" : "gptq_v2"));
    if (e->o.expert_names != LLMQ_EXPERT_NAMES_HUB) // absent by default: the outputs so far keep their bytes
        json_object_set_new(j, "expert_names", json_string(llmq_expert_names_name(e->o.expert_names)));
    if (e->o.provenance && json_is_object(e->o.provenance)) json_object_update(j, (json_t *)e->o.provenance);
    return j;
}

static json_t *quant_config(const struct llmq_export *e) {
    const struct llmq_export_opts *o = &e->o;
    if (o->format == LLMQ_EXPORT_AWQ)
        return json_pack("{s:s, s:i, s:i, s:b, s:s, s:n}", "quant_method", "awq", "bits", o->q.bits, "group_size",
                         o->q.group_size, "zero_point", 1, "version", "gemm", "modules_to_not_convert");
    if (o->format == LLMQ_EXPORT_GPTQ)
        return json_pack("{s:s, s:i, s:i, s:b, s:b, s:f, s:b, s:b, s:s, s:b}", "quant_method", "gptq", "bits",
                         o->q.bits, "group_size", o->q.group_size, "desc_act", o->desc_act, "sym", o->q.sym,
                         "damp_percent", (double)o->damp_percent, "static_groups", o->static_groups, "true_sequential",
                         o->true_sequential, "checkpoint_format", o->q.sym ? "gptq" : "gptq_v2", "lm_head", 0);
    return NULL;
}

// ---- declaration

// A block's slots: two norms, the seven linears, and after down_proj q_norm / k_norm (qwen3, gemma3) and the
// post norms (gemma).
// A moe block: the two norms, q k v o, the router and E x (gate, up, down), then q_norm / k_norm; qwen2_moe: the
// router, the shared expert gate, E x (gate, up, down), then the shared expert's gate, up, down.
static int64_t slots_per_layer(const struct llmq_model *m) {
    const int64_t E3 = 3 * m->hp.n_expert;
    int64_t lin = m->hp.shexp ? LLMQ_LIN_GATE + 2 + E3 + 3 : m->hp.moe ? LLMQ_LIN_GATE + 1 + E3 : LLMQ_LIN_COUNT;
    return lin + 2 + (m->hp.qk_norm ? 2 : 0) + (m->hp.gemma ? 2 : 0);
}

// The slot of block l's linear `which` (expert >= 0: that expert's gate / up / down), in the order of
// llmq_export_begin.
static int64_t linear_slot(const struct llmq_model *m, int64_t l, enum llmq_linear which, int64_t expert) {
    int64_t base = 1 + l * slots_per_layer(m);                           // its input_layernorm
    int64_t exp0 = base + 1 + LLMQ_LIN_GATE + 2 + (m->hp.shexp ? 1 : 0); // + ffn norm, router (, shared gate)
    if (expert >= 0) return exp0 + 3 * expert + (which - LLMQ_LIN_GATE);
    if (m->hp.shexp && which >= LLMQ_LIN_GATE) return exp0 + 3 * m->hp.n_expert + (which - LLMQ_LIN_GATE);
    return base + (int64_t)which + 1 + (which >= LLMQ_LIN_GATE ? 1 : 0);
}

// The view of norm `role` of block l (output_norm for LLMQ_T_OUTPUT_NORM); NULL when the model has none.
static const struct llmq_tensor_view *norm_view(const struct llmq_model *m, int64_t l, enum llmq_tensor_role role) {
    const struct llmq_layer *L = l >= 0 ? &m->layers[l] : NULL;
    switch (role) {
    case LLMQ_T_OUTPUT_NORM: return m->output_norm;
    case LLMQ_T_ATTN_NORM: return L->attn_norm;
    case LLMQ_T_FFN_NORM: return L->ffn_norm;
    case LLMQ_T_ATTN_Q_NORM: return L->q_norm;
    case LLMQ_T_ATTN_K_NORM: return L->k_norm;
    case LLMQ_T_ATTN_POST_NORM: return L->attn_post_norm;
    case LLMQ_T_FFN_POST_NORM: return L->ffn_post_norm;
    case LLMQ_T_FFN_GATE_INP: return L->router;
    default: return NULL;
    }
}

static struct slot *add_slot(struct llmq_export *e, enum slot_kind k, int64_t layer, enum llmq_linear w,
                             const char *name) {
    struct slot *s = &e->slots[e->n_slots++];
    memset(s, 0, sizeof *s);
    s->kind = k;
    s->layer = layer;
    s->which = w;
    s->expert = -1;
    if (name) snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

static enum llmq_status declare_view(struct llmq_export *e, const char *name, const struct llmq_tensor_view *v) {
    return llmq_st_writer_add_tensor(e->sw, name, e->dtype, v->n_dims, v->shape);
}

static enum llmq_status declare_part(struct llmq_export *e, struct slot *s, const char *suffix, enum llmq_dtype dt,
                                     int n_dims, int64_t d0, int64_t d1) {
    char prefix[128];
    int64_t shape[2] = {d0, d1};
    struct part *p = &s->parts[s->n_parts++];
    lin_name_x(e->m, e->o.expert_names, prefix, sizeof prefix, s->layer, s->which, s->expert);
    snprintf(p->name, sizeof p->name, "%s.%s", prefix, suffix);
    return llmq_st_writer_add_tensor(e->sw, p->name, dt, n_dims, shape);
}

static enum llmq_status declare_linear(struct llmq_export *e, struct slot *s) {
    const struct llmq_tensor_view *w = llmq_layer_linear(&e->m->layers[s->layer], s->which, s->expert);
    int64_t R = w->shape[0], C = w->shape[1], b = e->o.q.bits, r0;
    enum llmq_linear head;
    if (s->expert < 0 && llmq_arch_fused_part(&e->m->hp, s->which, &head, &r0, &R) && s->which != head)
        return LLMQ_OK; // phi3: rows of the fused linear declared on its head's slot
    int64_t ng = e->o.q.group_size > 0 ? C / e->o.q.group_size : 1;
    bool bias = lin_bias(e->m, s->layer, s->which) != NULL;
    enum llmq_status st = LLMQ_OK;
    switch (e->o.format) {
    case LLMQ_EXPORT_AWQ:
        if ((st = declare_part(e, s, "qweight", LLMQ_DTYPE_I32, 2, C, R / 8)) ||
            (st = declare_part(e, s, "qzeros", LLMQ_DTYPE_I32, 2, ng, R / 8)) ||
            (st = declare_part(e, s, "scales", LLMQ_DTYPE_F16, 2, ng, R)))
            return st;
        break;
    case LLMQ_EXPORT_GPTQ:
        if ((st = declare_part(e, s, "qweight", LLMQ_DTYPE_I32, 2, C * b / 32, R)) ||
            (st = declare_part(e, s, "qzeros", LLMQ_DTYPE_I32, 2, ng, R * b / 32)) ||
            (st = declare_part(e, s, "scales", LLMQ_DTYPE_F16, 2, ng, R)) ||
            (st = declare_part(e, s, "g_idx", LLMQ_DTYPE_I32, 1, C, 0)))
            return st;
        break;
    case LLMQ_EXPORT_FAKE:
        if ((st = declare_part(e, s, "weight", e->dtype, 2, R, C))) return st;
        break;
    }
    if (bias) st = declare_part(e, s, "bias", e->dtype, 1, R, 0);
    return st;
}

// ---- writing

// Converts n f32 values to e->dtype and appends them to the stream.
static enum llmq_status write_f32(struct llmq_export *e, const float *x, int64_t n) {
    if (e->dtype == LLMQ_DTYPE_F32) return llmq_st_writer_write(e->sw, x, (size_t)n * 4);
    uint16_t *h = e->conv;
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK_FLOATS) {
        int64_t k = n - i0 < CHUNK_FLOATS ? n - i0 : CHUNK_FLOATS;
        for (int64_t i = 0; i < k; i++)
            h[i] = e->dtype == LLMQ_DTYPE_F16 ? llmq_f32_to_f16(x[i0 + i]) : llmq_f32_to_bf16(x[i0 + i]);
        enum llmq_status st = llmq_st_writer_write(e->sw, h, (size_t)k * 2);
        if (st) return st;
    }
    return LLMQ_OK;
}

// A model tensor (any decodable dtype) plus shift (gemma norms: -1, calib/model/model.h) in e->dtype, in chunks
// of rows.
static enum llmq_status write_shifted(struct llmq_export *e, const struct llmq_tensor_view *v, float shift) {
    int64_t C = v->n_dims > 0 ? v->shape[v->n_dims - 1] : 1, R = C > 0 ? llmq_tensor_nelements(v) / C : 0;
    int64_t rows = C > 0 && C < CHUNK_FLOATS ? CHUNK_FLOATS / C : 1;
    enum llmq_status st = LLMQ_OK;
    if (C > CHUNK_FLOATS)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: rows of %lld elements are too long", v->name, (long long)C);
    for (int64_t r0 = 0; r0 < R && !st; r0 += rows) {
        int64_t n = R - r0 < rows ? R - r0 : rows;
        if ((st = llmq_model_rows_f32(v, r0, n, e->work))) break;
        size_t rb = 0; // these rows' file pages are done with (the embeddings and lm_head: GBs at 8B)
        if (llmq_dtype_nbytes(v->dtype, C, &rb))
            llmq_mmap_release((const uint8_t *)v->data + (size_t)r0 * rb, (size_t)n * rb);
        for (int64_t i = 0; shift != 0.0f && i < n * C; i++) e->work[i] += shift;
        st = write_f32(e, e->work, n * C);
    }
    return st;
}

static enum llmq_status write_view(struct llmq_export *e, const struct llmq_tensor_view *v) {
    return write_shifted(e, v, 0.0f);
}

// The copy handed over for tensor g (0..N_GIVEN-1: attn_norm, ffn_norm, bq, bk, bv) of block l, or NULL.
static struct llmq_tensor_view *given(const struct llmq_export *e, int64_t l, int g) {
    struct llmq_tensor_view *v = l >= 0 && g >= 0 ? &e->given[l * N_GIVEN + g] : NULL;
    return v && v->data ? v : NULL;
}

// Norm `role` of block l as HF stores it (w, not 1 + w, for the gemma families): the copy handed over for the
// block (llmq_export_block, freed once written), else the model's view.
static enum llmq_status write_norm(struct llmq_export *e, int64_t l, enum llmq_tensor_role role) {
    struct llmq_tensor_view *g = given(e, l, role == LLMQ_T_ATTN_NORM ? 0 : role == LLMQ_T_FFN_NORM ? 1 : -1);
    enum llmq_status st = write_shifted(e, g ? g : norm_view(e->m, l, role),
                                        llmq_tensor_norm_shifted(e->m->hp.arch, role) ? -1.0f : 0.0f);
    if (g) llmq_tensor_copy_free(g);
    return st;
}

static enum llmq_status write_slot(struct llmq_export *e, struct slot *s) {
    const struct llmq_model *m = e->m;
    enum llmq_status st = LLMQ_OK;
    switch (s->kind) {
    case SLOT_EMBED: return write_view(e, m->tok_embd);
    case SLOT_ATTN_NORM:
    case SLOT_FFN_NORM:
    case SLOT_NORM:
    case SLOT_OUT_NORM: return write_norm(e, s->layer, s->role);
    case SLOT_LM_HEAD: return write_view(e, m->output);
    case SLOT_ROUTER: { // the copy handed over (AWQ: its columns scaled), else the model's
        const bool sh = s->role == LLMQ_T_FFN_GATE_INP_SHEXP;
        struct llmq_tensor_view *g = given(e, s->layer, sh ? 6 : 5);
        st = write_view(e, g ? g : sh ? m->layers[s->layer].shexp_gate : m->layers[s->layer].router);
        if (g) llmq_tensor_copy_free(g);
        return st;
    }
    case SLOT_LINEAR:
        for (int i = 0; i < s->n_parts && !st; i++) {
            st = llmq_st_writer_write_tensor(e->sw, s->parts[i].name, s->parts[i].data, s->parts[i].nbytes);
            free(s->parts[i].data);
            s->parts[i].data = NULL;
        }
        return st;
    }
    return st;
}

// Writes every slot from e->pos up to the first linear not handed over yet. A block's norm is declared
// just before its first linear (input_layernorm before q, post_attention_layernorm before gate) and is
// written only once that linear has arrived, so it comes from the copy of a block handed over before its
// linears (llmq_export_block), whatever the driver did with the block before.
static enum llmq_status advance(struct llmq_export *e) {
    enum llmq_status st;
    while (e->pos < e->n_slots) {
        struct slot *s = &e->slots[e->pos];
        if (s->kind == SLOT_LINEAR && !s->ready) break;
        if ((s->kind == SLOT_ATTN_NORM || s->kind == SLOT_FFN_NORM) && e->pos + 1 < e->n_slots &&
            !e->slots[e->pos + 1].ready)
            break;
        if ((st = write_slot(e, s))) return st;
        e->pos++;
    }
    return LLMQ_OK;
}

// ---- packing one linear into its parts (HF row order)

static void *alloc_part(struct part *p, size_t nbytes) {
    p->nbytes = nbytes;
    p->data = calloc(1, nbytes ? nbytes : 1);
    return p->data;
}

// The bias of linear s, converted to e->dtype, rows in HF order, into part p.
static enum llmq_status pack_bias(struct llmq_export *e, const struct llmq_tensor_view *bv, int64_t heads,
                                  struct part *p) {
    int64_t R = bv->shape[0];
    size_t es = e->dtype == LLMQ_DTYPE_F32 ? 4 : 2;
    float *f = malloc((size_t)R * sizeof *f);
    enum llmq_status st = LLMQ_OK;
    if (!f || !alloc_part(p, (size_t)R * es)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", p->name);
        goto done;
    }
    if ((st = llmq_model_rows_f32(bv, 0, 1, f))) goto done;
    for (int64_t r = 0; r < R; r++) {
        float x = f[src_row(r, R, heads)];
        if (es == 4)
            ((float *)p->data)[r] = x;
        else
            ((uint16_t *)p->data)[r] = e->dtype == LLMQ_DTYPE_F16 ? llmq_f32_to_f16(x) : llmq_f32_to_bf16(x);
    }
done:
    free(f);
    return st;
}

static enum llmq_status pack_linear(struct llmq_export *e, struct slot *s, const struct llmq_qlinear *ql,
                                    const char *what) {
    int64_t R = ql->R, C = ql->C, ng = ql->n_groups, heads = perm_heads(e->m, s->which);
    int b = ql->bits;
    uint32_t maxq = (1u << b) - 1;
    struct llmq_tensor_view *gb = s->which <= LLMQ_LIN_V ? given(e, s->layer, 2 + (int)s->which) : NULL;
    const struct llmq_tensor_view *bv = gb ? gb : lin_bias(e->m, s->layer, s->which);
    uint8_t *tmp = NULL;
    enum llmq_status st = LLMQ_OK;
    struct part *P = s->parts;

    // zeros must be integers of the grid
    for (int64_t i = 0; i < R * ng; i++) {
        float z = ql->zeros[i];
        if (!(z >= 0.0f && z <= (float)maxq && z == (float)(int)z))
            return llmq_errorf(LLMQ_ERR_ARG, "%s: zero point %g at (row %lld, group %lld) is not an integer in [0, %u]",
                               what, (double)z, (long long)(i / ng), (long long)(i % ng), maxq);
    }
    for (int64_t i = 0; i < R * C; i++)
        if (ql->q[i] > maxq)
            return llmq_errorf(LLMQ_ERR_ARG, "%s: code %u at (row %lld, col %lld) exceeds %u for %d bits", what,
                               ql->q[i], (long long)(i / C), (long long)(i % C), maxq, b);

    switch (e->o.format) {
    case LLMQ_EXPORT_AWQ: {
        uint32_t *qw = alloc_part(&P[0], (size_t)C * (size_t)(R / 8) * 4);
        uint32_t *qz = alloc_part(&P[1], (size_t)ng * (size_t)(R / 8) * 4);
        uint16_t *sc = alloc_part(&P[2], (size_t)ng * (size_t)R * 2);
        int64_t *src = malloc((size_t)R * sizeof *src);
        if (!qw || !qz || !sc || !src) {
            free(src);
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
        for (int64_t n = 0; n < R; n++) src[n] = src_row(n, R, heads);
        uint8_t c8[8];
        for (int64_t k = 0; k < C; k++)
            for (int64_t j = 0; j < R / 8; j++) {
                for (int i = 0; i < 8; i++) c8[i] = ql->q[src[8 * j + i] * C + k];
                qw[k * (R / 8) + j] = llmq_awq_pack8(c8);
            }
        for (int64_t g = 0; g < ng; g++) {
            for (int64_t j = 0; j < R / 8; j++) {
                for (int i = 0; i < 8; i++) c8[i] = (uint8_t)ql->zeros[src[8 * j + i] * ng + g];
                qz[g * (R / 8) + j] = llmq_awq_pack8(c8);
            }
            for (int64_t n = 0; n < R; n++) sc[g * R + n] = llmq_f32_to_f16(ql->scales[src[n] * ng + g]);
        }
        free(src);
        break;
    }
    case LLMQ_EXPORT_GPTQ: {
        int64_t kw = C * b / 32, nw = R * b / 32;
        uint32_t *qw = alloc_part(&P[0], (size_t)kw * (size_t)R * 4);
        uint32_t *qz = alloc_part(&P[1], (size_t)ng * (size_t)nw * 4);
        uint16_t *sc = alloc_part(&P[2], (size_t)ng * (size_t)R * 2);
        int32_t *gi = alloc_part(&P[3], (size_t)C * 4);
        uint32_t *words = malloc((size_t)(kw > nw ? kw : nw) * 4);
        tmp = malloc((size_t)R);
        if (!qw || !qz || !sc || !gi || !words || !tmp) {
            free(words);
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
        for (int64_t n = 0; n < R; n++) { // column n of qweight: the codes of HF row n along C
            llmq_pack_bits(ql->q + src_row(n, R, heads) * C, 1, C, b, words);
            for (int64_t w = 0; w < kw; w++) qw[w * R + n] = words[w];
        }
        uint32_t off = ql->sym ? 1u : 0u; // v1 stores zero - 1
        for (int64_t g = 0; g < ng; g++) {
            for (int64_t n = 0; n < R; n++) {
                int64_t r = src_row(n, R, heads);
                tmp[n] = (uint8_t)(((uint32_t)ql->zeros[r * ng + g] - off) & maxq);
                sc[g * R + n] = llmq_f32_to_f16(ql->scales[r * ng + g]);
            }
            llmq_pack_bits(tmp, 1, R, b, qz + g * nw);
        }
        for (int64_t c = 0; c < C; c++) gi[c] = ql->g_idx[c];
        free(words);
        break;
    }
    case LLMQ_EXPORT_FAKE: {
        size_t es = e->dtype == LLMQ_DTYPE_F32 ? 4 : 2;
        float *W = malloc((size_t)R * (size_t)C * sizeof *W);
        if (!W || !alloc_part(&P[0], (size_t)R * (size_t)C * es)) {
            free(W);
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %lld x %lld", what, (long long)R, (long long)C);
            goto done;
        }
        llmq_qlinear_dequant(ql, W);
        for (int64_t n = 0; n < R; n++) {
            const float *row = W + src_row(n, R, heads) * C;
            if (es == 4)
                memcpy((float *)P[0].data + n * C, row, (size_t)C * 4);
            else
                for (int64_t c = 0; c < C; c++)
                    ((uint16_t *)P[0].data)[n * C + c] =
                        e->dtype == LLMQ_DTYPE_F16 ? llmq_f32_to_f16(row[c]) : llmq_f32_to_bf16(row[c]);
        }
        free(W);
        break;
    }
    }
    if (bv) st = pack_bias(e, bv, heads, &P[s->n_parts - 1]);
    if (!st && gb) llmq_tensor_copy_free(gb); // packed: the copy is done with
done:
    free(tmp);
    if (st)
        for (int i = 0; i < s->n_parts; i++) {
            free(P[i].data);
            P[i].data = NULL;
        }
    return st;
}

// ---- phi3's fused linears (quant/export.h "Fused linears")

// Whether fused member `which` of block l was handed over already (false for a linear of its own).
static bool fused_has(const struct llmq_export *e, int64_t l, enum llmq_linear which, int64_t expert) {
    enum llmq_linear head;
    int64_t r0, total;
    if (expert >= 0 || !llmq_arch_fused_part(&e->m->hp, which, &head, &r0, &total)) return false;
    return e->slots[linear_slot(e->m, l, head, -1)].fused_got & (1u << which);
}

// Member ql (its own R rows, checked) of the fused linear on slot hs, at rows [r0, r0 + R) of total: copied in;
// s (the member's own slot) is done; once every member is in, the fused linear is packed on hs. All members
// must have one column order (g_idx): GPTQ's act-order gives them the same, from their one Hessian.
static enum llmq_status put_fused(struct llmq_export *e, struct slot *s, struct slot *hs, const struct llmq_qlinear *ql,
                                  int64_t r0, int64_t total, const char *what) {
    struct llmq_qlinear *f = &hs->fused;
    const int64_t C = ql->C, ng = ql->n_groups;
    enum llmq_status st;
    if (!f->q) {
        if ((st = llmq_qlinear_init(total, C, &e->o.q, f))) return st;
        memcpy(f->g_idx, ql->g_idx, (size_t)C * sizeof *f->g_idx);
    } else if (memcmp(f->g_idx, ql->g_idx, (size_t)C * sizeof *f->g_idx) != 0)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "%s: its g_idx (column order) differs from the other rows of the fused linear it is part "
                           "of: one packed linear has one g_idx",
                           what);
    memcpy(f->q + r0 * C, ql->q, (size_t)(ql->R * C));
    memcpy(f->scales + r0 * ng, ql->scales, (size_t)(ql->R * ng) * sizeof *f->scales);
    memcpy(f->zeros + r0 * ng, ql->zeros, (size_t)(ql->R * ng) * sizeof *f->zeros);
    hs->fused_got |= 1u << s->which;
    if (s != hs) s->ready = true; // no tensors of its own
    const unsigned all = hs->which == LLMQ_LIN_Q ? 7u << LLMQ_LIN_Q : 3u << LLMQ_LIN_GATE;
    if (hs->fused_got != all) return LLMQ_OK;
    char name[160];
    lin_name_x(e->m, e->o.expert_names, name, sizeof name, hs->layer, hs->which, -1);
    if ((st = pack_linear(e, hs, f, name))) return st;
    llmq_qlinear_free(f);
    hs->ready = true;
    return LLMQ_OK;
}

// ================================================================================ public API ====

static void export_free(struct llmq_export *e) {
    if (!e) return;
    for (int64_t i = 0; i < e->n_slots; i++) {
        for (int p = 0; p < e->slots[i].n_parts; p++) free(e->slots[i].parts[p].data);
        llmq_qlinear_free(&e->slots[i].fused);
    }
    free(e->slots);
    for (int64_t i = 0; e->given && i < e->m->hp.n_layer * N_GIVEN; i++) llmq_tensor_copy_free(&e->given[i]);
    free(e->given);
    free(e->work);
    free(e->conv);
    free(e->out);
    free(e->tmp);
    free(e);
}

void llmq_export_abort(struct llmq_export *e) {
    if (!e) return;
    llmq_st_writer_abort(e->sw);
    llmq_outdir_discard(e->tmp);
    export_free(e);
}

enum llmq_status llmq_export_check(const struct llmq_model *m, const struct llmq_export_opts *o) {
    char what[160];
    enum llmq_status st = check_opts(o);
    if (!st && o->expert_names != LLMQ_EXPERT_NAMES_HUB && !m->hp.moe)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "export: --expert-names %s names the experts of a mixture of experts; %s (%s) has none",
                           llmq_expert_names_name(o->expert_names), m->path, llmq_arch_name(m->hp.arch));
    if (!st && o->expert_names != LLMQ_EXPERT_NAMES_HUB && o->format == LLMQ_EXPORT_FAKE)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "export: --expert-names %s needs --format gptq or awq (a fake directory is a plain "
                           "checkpoint: transformers and GPTQModel read it under the Hub's names)",
                           llmq_expert_names_name(o->expert_names));
    int fit = o->q.group_size > 0 ? llmq_export_fit_group(m, o->q.group_size) : 0;
    for (int64_t l = 0; !st && l < m->hp.n_layer; l++)
        for (int w = 0; !st && w < LLMQ_LIN_COUNT; w++) {
            int64_t x = m->hp.moe && w >= LLMQ_LIN_GATE ? 0 : -1; // moe: expert 0 stands for all (same shapes)
            const struct llmq_tensor_view *v = llmq_layer_linear(&m->layers[l], w, x);
            lin_name_x(m, o->expert_names, what, sizeof what, l, (enum llmq_linear)w, x);
            st = check_shape(o, what, v->shape[0], v->shape[1], fit);
            if (!st && x >= 0 && (v = m->layers[l].w[w])) { // qwen2_moe: the shared expert too
                lin_name_x(m, o->expert_names, what, sizeof what, l, (enum llmq_linear)w, -1);
                st = check_shape(o, what, v->shape[0], v->shape[1], fit);
            }
        }
    return st;
}

// A moe block's router (written from the model's view, in the output's dtype: unquantized) and its experts'
// gate, up, down in expert order.
static enum llmq_status declare_experts(struct llmq_export *e, int64_t l) {
    const struct llmq_model *m = e->m;
    char what[160];
    llmq_tensor_router_hf_name(m->hp.arch, e->o.expert_names, l, what, sizeof what);
    struct slot *s = add_slot(e, SLOT_ROUTER, l, 0, what);
    s->ready = true; // nothing to wait for: the post_attention_layernorm before it waits for o only
    s->role = LLMQ_T_FFN_GATE_INP;
    enum llmq_status st = declare_view(e, s->name, m->layers[l].router);
    if (!st && m->layers[l].shexp_gate) { // qwen2_moe: its shared expert's gate, unquantized as the router
        llmq_tensor_full_name(m->hp.arch, LLMQ_T_FFN_GATE_INP_SHEXP, l, true, what, sizeof what);
        s = add_slot(e, SLOT_ROUTER, l, 0, what);
        s->ready = true;
        s->role = LLMQ_T_FFN_GATE_INP_SHEXP;
        st = declare_view(e, s->name, m->layers[l].shexp_gate);
    }
    for (int64_t x = 0; !st && x < m->hp.n_expert; x++)
        for (int w = LLMQ_LIN_GATE; !st && w <= LLMQ_LIN_DOWN; w++) {
            s = add_slot(e, SLOT_LINEAR, l, (enum llmq_linear)w, NULL);
            s->expert = x;
            st = declare_linear(e, s);
        }
    return st;
}

enum llmq_status llmq_export_begin(const struct llmq_model *m, const char *out_dir, const struct llmq_export_opts *o,
                                   struct llmq_export **out) {
    struct llmq_export *e = NULL;
    json_t *extra = NULL, *prov = NULL, *qc = NULL;
    char *prov_text = NULL, what[160];
    enum llmq_status st;
    *out = NULL;
    if (!m || !out_dir || !*out_dir || !o) return llmq_errorf(LLMQ_ERR_ARG, "export: no model or output path");
    if ((st = llmq_export_check(m, o))) return st;
    if (o->provenance && !json_is_object(o->provenance))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: provenance is not a JSON object", out_dir);

    if (!(e = calloc(1, sizeof *e))) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out_dir);
    e->m = m;
    e->o = *o;
    e->o.provenance = NULL; // not kept: copied into the JSON below
    e->slots = calloc((size_t)(m->hp.n_layer * slots_per_layer(m) + 3), sizeof *e->slots);
    e->work = malloc((size_t)CHUNK_FLOATS * sizeof(float));
    e->conv = malloc((size_t)CHUNK_FLOATS * sizeof(float));
    e->out = strdup(out_dir);
    e->given = calloc((size_t)(m->hp.n_layer > 0 ? m->hp.n_layer * N_GIVEN : 1), sizeof *e->given);
    if (!e->slots || !e->work || !e->conv || !e->out || !e->given) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out_dir);
        goto fail;
    }
    if (o->format != LLMQ_EXPORT_FAKE)
        e->dtype = LLMQ_DTYPE_F16;
    else if (o->fake_dtype != LLMQ_DTYPE_COUNT)
        e->dtype = o->fake_dtype;
    else {
        enum llmq_dtype d = m->layers[0].w[LLMQ_LIN_Q]->dtype;
        e->dtype = d == LLMQ_DTYPE_F16 || d == LLMQ_DTYPE_BF16 ? d : LLMQ_DTYPE_F32;
    }

    // ---- JSON side files
    e->o.provenance = o->provenance; // read by llmq_object only
    prov = llmq_object(e);
    e->o.provenance = NULL;
    qc = quant_config(e);
    extra = json_object();
    if (qc) json_object_set(extra, "quantization_config", qc);
    json_object_set(extra, "llmq", prov);
    // the model's own count: a caller may export the first blocks only (tests/tools/export_tool --layers)
    json_object_set_new(extra, "num_hidden_layers", json_integer(m->hp.n_layer));
    if (!(prov_text = json_dumps(prov, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out_dir);
        goto fail;
    }
    if ((st = llmq_hf_stage_prepare(m->path, out_dir, o->force, &e->tmp, &e->replace))) goto fail;
    if ((st = llmq_hf_side_files(m->path, e->tmp, e->dtype, extra))) goto fail;
    if (qc && o->format == LLMQ_EXPORT_GPTQ && (st = llmq_hf_write_json(e->tmp, "quantize_config.json", qc))) goto fail;

    // ---- declare every tensor, in stream order
    if ((st = llmq_st_writer_init(e->tmp, o->max_shard_bytes, &e->sw)) ||
        (st = llmq_st_writer_set_metadata(e->sw, "format", "pt")) ||
        (st = llmq_st_writer_set_metadata(e->sw, "llmq_format", llmq_export_format_name(o->format))) ||
        (st = llmq_st_writer_set_metadata(e->sw, "llmq_provenance", prov_text)))
        goto fail;
    struct slot *s = add_slot(e, SLOT_EMBED, -1, 0, "model.embed_tokens.weight");
    if ((st = declare_view(e, s->name, m->tok_embd))) goto fail;
    static const enum llmq_tensor_role after_down[] = {LLMQ_T_ATTN_Q_NORM, LLMQ_T_ATTN_K_NORM, LLMQ_T_ATTN_POST_NORM,
                                                       LLMQ_T_FFN_POST_NORM};
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        for (int w = 0; w < LLMQ_LIN_COUNT; w++) {
            if (w == LLMQ_LIN_Q || w == LLMQ_LIN_GATE) {
                enum llmq_tensor_role r = w == LLMQ_LIN_Q ? LLMQ_T_ATTN_NORM : LLMQ_T_FFN_NORM;
                llmq_tensor_full_name(m->hp.arch, r, l, true, what, sizeof what);
                s = add_slot(e, w == LLMQ_LIN_Q ? SLOT_ATTN_NORM : SLOT_FFN_NORM, l, 0, what);
                s->role = r;
                if ((st = declare_view(e, s->name, norm_view(m, l, r)))) goto fail;
            }
            if (m->hp.moe && w == LLMQ_LIN_GATE && (st = declare_experts(e, l))) goto fail;
            if (!m->hp.moe || w < LLMQ_LIN_GATE || m->hp.shexp) { // qwen2_moe: the shared expert after the experts
                s = add_slot(e, SLOT_LINEAR, l, (enum llmq_linear)w, NULL);
                if ((st = declare_linear(e, s))) goto fail;
            }
            for (size_t k = 0; w == LLMQ_LIN_DOWN && k < sizeof after_down / sizeof after_down[0]; k++) {
                if (!norm_view(m, l, after_down[k])) continue; // the family has no such norm
                llmq_tensor_full_name(m->hp.arch, after_down[k], l, true, what, sizeof what);
                s = add_slot(e, SLOT_NORM, l, 0, what);
                s->role = after_down[k];
                if ((st = declare_view(e, s->name, norm_view(m, l, after_down[k])))) goto fail;
            }
        }
    s = add_slot(e, SLOT_OUT_NORM, -1, 0, "model.norm.weight");
    s->role = LLMQ_T_OUTPUT_NORM;
    if ((st = declare_view(e, s->name, m->output_norm))) goto fail;
    if (!m->hp.tied_embeddings) {
        s = add_slot(e, SLOT_LM_HEAD, -1, 0, "lm_head.weight");
        if ((st = declare_view(e, s->name, m->output))) goto fail;
    }
    json_decref(extra);
    json_decref(prov);
    json_decref(qc);
    free(prov_text);
    *out = e;
    return LLMQ_OK;
fail:
    json_decref(extra);
    json_decref(prov);
    json_decref(qc);
    free(prov_text);
    llmq_export_abort(e);
    return st;
}

enum llmq_status llmq_export_layer(struct llmq_export *e, int64_t layer, enum llmq_linear which,
                                   const struct llmq_qlinear *ql) {
    return llmq_export_expert(e, layer, which, -1, ql);
}

enum llmq_status llmq_export_expert(struct llmq_export *e, int64_t layer, enum llmq_linear which, int64_t expert,
                                    const struct llmq_qlinear *ql) {
    char what[160];
    enum llmq_status st;
    if (!e) return llmq_errorf(LLMQ_ERR_ARG, "export: no export");
    if (e->poisoned) return e->poisoned;
    const bool moe_ffn = e->m->hp.moe && which >= LLMQ_LIN_GATE; // qwen2_moe: expert -1 is the shared expert
    const bool exists = expert < 0 ? !moe_ffn || e->m->hp.shexp : moe_ffn && expert < e->m->hp.n_expert;
    if (layer < 0 || layer >= e->m->hp.n_layer || (unsigned)which >= LLMQ_LIN_COUNT || !ql || !exists)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: linear %d (expert %lld) of layer %lld does not exist", e->out, (int)which,
                           (long long)expert, (long long)layer);
    lin_name_x(e->m, e->o.expert_names, what, sizeof what, layer, which, expert);
    int64_t idx = linear_slot(e->m, layer, which, expert);
    struct slot *s = &e->slots[idx];
    LLMQ_ASSERT(s->kind == SLOT_LINEAR && s->layer == layer && s->which == which && s->expert == expert);
    if (s->ready || idx < e->pos || (e->slots[idx].kind == SLOT_LINEAR && fused_has(e, layer, which, expert)))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: handed over twice", what);
    const struct llmq_tensor_view *w = llmq_layer_linear(&e->m->layers[layer], which, expert);
    int64_t ng = llmq_qconfig_n_groups(&e->o.q, w->shape[1]); // ceil: fake also takes a non-tiled C
    if (ql->R != w->shape[0] || ql->C != w->shape[1] || ql->bits != e->o.q.bits ||
        ql->group_size != e->o.q.group_size || ql->sym != e->o.q.sym || ql->n_groups != ng)
        return llmq_errorf(
            LLMQ_ERR_ARG,
            "%s: quantized as %lld x %lld, %d bits, group %d, %s, %lld groups; the export expects %lld x "
            "%lld, %d bits, group %d, %s",
            what, (long long)ql->R, (long long)ql->C, ql->bits, ql->group_size, ql->sym ? "sym" : "asym",
            (long long)ql->n_groups, (long long)w->shape[0], (long long)w->shape[1], e->o.q.bits, e->o.q.group_size,
            e->o.q.sym ? "sym" : "asym");
    for (int64_t c = 0; c < ql->C; c++) {
        int32_t g = ql->g_idx[c];
        if (g < 0 || g >= ng)
            return llmq_errorf(LLMQ_ERR_ARG, "%s: g_idx[%lld] = %d is not a group (0..%lld)", what, (long long)c, g,
                               (long long)ng - 1);
        if (e->o.format == LLMQ_EXPORT_AWQ && g != c / e->o.q.group_size)
            return llmq_errorf(LLMQ_ERR_ARG,
                               "%s: act-order g_idx (column %lld in group %d) cannot be stored in --format awq (use "
                               "--format gptq, or no --act-order)",
                               what, (long long)c, g);
    }
    enum llmq_linear head;
    int64_t r0, total;
    if (expert < 0 && llmq_arch_fused_part(&e->m->hp, which, &head, &r0, &total))
        st = put_fused(e, s, &e->slots[linear_slot(e->m, layer, head, -1)], ql, r0, total, what);
    else if (!(st = pack_linear(e, s, ql, what)))
        s->ready = true;
    if (st || (st = advance(e))) return e->poisoned = st;
    return LLMQ_OK;
}

enum llmq_status llmq_export_block(struct llmq_export *e, int64_t layer, const struct llmq_layer *ly) {
    if (!e || !ly || layer < 0 || layer >= e->m->hp.n_layer)
        return llmq_errorf(LLMQ_ERR_ARG, "export: block %lld out of range or no weights", (long long)layer);
    if (e->poisoned) return e->poisoned;
    // the block's first slot (input_layernorm) and its q / k / v: none may be written or packed yet
    const int64_t first = 1 + layer * slots_per_layer(e->m);
    bool late = e->pos > first;
    for (int w = LLMQ_LIN_Q; w <= LLMQ_LIN_V; w++) late = late || e->slots[first + 1 + w].ready;
    if (late)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: block %lld handed over after its first linear", e->out, (long long)layer);
    const struct llmq_tensor_view *v[N_GIVEN] = {ly->attn_norm, ly->ffn_norm, ly->bq,        ly->bk,
                                                 ly->bv,        ly->router,   ly->shexp_gate};
    for (int g = 0; g < N_GIVEN; g++) {
        struct llmq_tensor_view *c = &e->given[layer * N_GIVEN + g];
        llmq_tensor_copy_free(c); // handed over again: the last one counts
        if (!llmq_tensor_copy(v[g], c))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for block %lld's tensors", e->out, (long long)layer);
    }
    return LLMQ_OK;
}

enum llmq_status llmq_export_finish(struct llmq_export *e) {
    enum llmq_status st = LLMQ_OK;
    if (!e) return llmq_errorf(LLMQ_ERR_ARG, "export: no export");
    if ((st = e->poisoned)) goto fail;
    if ((st = advance(e))) goto fail;
    if (e->pos < e->n_slots) {
        struct slot *s = &e->slots[e->pos];
        char what[160];
        lin_name_x(e->m, e->o.expert_names, what, sizeof what, s->layer, s->which, s->expert);
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: export finished without %s", e->out, what);
        goto fail;
    }
    st = llmq_st_writer_finish(e->sw);
    e->sw = NULL;
    if (st) goto fail;
    if ((st = llmq_hf_stage_publish(e->tmp, e->out, e->replace))) goto fail;
    free(e->tmp);
    e->tmp = NULL;
    export_free(e);
    return LLMQ_OK;
fail:
    llmq_export_abort(e);
    return st;
}
