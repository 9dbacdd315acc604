// quant/gguf_export.c — the quantized GGUF writer (contract in quant/gguf_export.h).
//
// begin: list every output tensor (kind + where its values come from), sort them in llama.cpp's
// order, plan the types (gguf_mix), declare them to the formats/gguf.h writer. Then a "pump" writes
// tensors in file order as long as the next one is ready (handed over, or readable from the model).
#include "quant/gguf_export.h"

#include "common/eta.h"
#include "common/io.h"
#include "common/log.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"
#include "formats/gguf.h"
#include "formats/hf/hfdir.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define CHUNK_FLOATS ((int64_t)4 << 20) // rows decoded per step: about 16 MiB of f32
#define N_GIVEN 7                       // a block's tensors a driver hands over (llmq_gguf_export_block)

enum kind {
    K_VIEW,      // a tensor of the input GGUF that the model does not use (copied / converted as planned)
    K_TOK_EMBD,  // m->tok_embd
    K_OUT_NORM,  // m->output_norm
    K_OUTPUT,    // m->output (only when not tied)
    K_ROPE,      // m->rope_freqs (GGUF) or generated llama3 factors (HF)
    K_LINEAR,    // m->layers[l].w[which]
    K_ATTN_NORM, // m->layers[l].attn_norm
    K_FFN_NORM,  // m->layers[l].ffn_norm
    K_BQ,
    K_BK,
    K_BV,
    K_ROUTER,     // m->layers[l].router (moe)
    K_EXPS,       // the stacked experts of m->layers[l].exps, which = 0 gate, 1 up, 2 down (moe)
    K_SHEXP_GATE, // m->layers[l].shexp_gate (qwen2_moe)
};

struct entry {
    char name[96];
    enum kind kind;
    int64_t layer;                       // -1 for globals
    int which;                           // K_LINEAR: enum llmq_linear; K_EXPS: 0 gate, 1 up, 2 down
    const struct llmq_tensor_view *view; // K_VIEW: the file tensor; others are resolved when written
    int n_dims;
    int64_t shape[LLMQ_MAX_DIMS]; // outermost first
    int64_t R, C;                 // rows (product of the outer dims) and row length
    enum llmq_dtype src_type;
    struct llmq_gguf_mix_choice ch;
    int64_t perm_heads; // HF llama q / k: rows permuted with this many heads; 0 = in order
    size_t row_bytes, nbytes;
    void *held; // (nbytes) encoded rows in the MODEL's row order, handed over early
    bool handed, written;
    int64_t n_exp_handed; // K_EXPS: experts handed over so far (handed once all E are)
    unsigned fused_got;   // phi3's attn_qkv / ffn_up: the members handed over so far (bit `which`)
    int64_t expert;       // write_exps' part of a K_EXPS entry: its expert (its importance); -1 otherwise
    double seconds;
    double pred_err, pred_err_mix; // the type choice's err of the chosen type and of the mix's (free tensors)
    double sens_kld, pred_kld;     // MEASURED, allocated tensors: the KLD alone in the mix's type, the predicted
    bool sens;                     // sens_kld was measured
};

struct llmq_gguf_export {
    const struct llmq_model *m;
    struct llmq_gguf_export_opts o;
    char *out_path;
    struct entry *ent;                   // (n) in file order
    int64_t n, next;                     // next: the first entry not written yet
    int64_t *lin;                        // (n_layer * LLMQ_LIN_COUNT) entry index of each linear
    int64_t *xlin;                       // (n_layer * 3) moe: entry index of each stacked expert tensor
    int *n_handed;                       // (n_layer) linears handed over per block
    struct llmq_tensor_view *given;      // (n_layer, N_GIVEN) copies of the handed-over block tensors (data NULL: none)
    float **imp;                         // (n_layer * LLMQ_CALIB_N_SLOTS) importance per block input, or NULL
    float **eimp;                        // moe: (n_layer, E, 2) each expert's gate/up and down input importance
    float **cimp;                        // the same from o.choice_imatrix (the type choice only), or NULL
    float **ceimp;                       // moe: eimp's from o.choice_imatrix, or NULL
    struct llmq_tensor_view rope_view;   // HF llama3: generated rope_freqs.weight
    struct llmq_tensor_view rope_ext[2]; // HF phi3 LongRoPE: rope_factors_long / _short.weight from m->hp
    float *rope_gen;
    struct llmq_gguf_writer *w;
    enum llmq_status err; // first failure while encoding / writing (poisons the export)
    bool finishing;
    float *f;   // (f_cap) decoded rows
    uint8_t *q; // (q_cap) encoded rows
    int64_t f_cap;
    size_t q_cap;
    double t0;
    int64_t total_elems, done_elems;
    uint64_t total_bytes;
    uint64_t unsynced; // stream: bytes written since the last sync
    int n_fallback;
    int64_t sens_tokens; // MEASURED: the tokens the sensitivity was measured on
    double sens_seconds;
};

struct llmq_gguf_export_opts llmq_gguf_export_default_opts(void) {
    return (struct llmq_gguf_export_opts){
        .mix = llmq_gguf_mix_default_opts(), .n_threads = 1, .progress = true, .sens = llmq_gguf_sens_default_opts()};
}

// ---- building the entry list ------------------------------------------------------------------------

static struct entry *add_entry(struct llmq_gguf_export *e, int64_t *cap) {
    if (e->n == *cap) {
        int64_t c = *cap ? 2 * *cap : 64;
        struct entry *p = realloc(e->ent, (size_t)c * sizeof(*p));
        if (!p) return NULL;
        e->ent = p;
        *cap = c;
    }
    struct entry *x = &e->ent[e->n++];
    memset(x, 0, sizeof(*x));
    x->layer = -1;
    x->which = -1;
    x->expert = -1;
    return x;
}

static void set_shape(struct entry *x, const struct llmq_tensor_view *v) {
    x->n_dims = v->n_dims;
    memcpy(x->shape, v->shape, sizeof(x->shape));
    x->src_type = v->dtype;
}

// Classifies a GGUF tensor name: the kind, block and linear it belongs to (K_VIEW if none).
static enum kind classify(const struct llmq_hparams *hp, const char *name, int64_t *layer, int *which) {
    int role = llmq_tensor_role_of(hp->arch, name, false, hp->n_layer, layer);
    *which = -1;
    switch (role) {
    case LLMQ_T_TOK_EMBD: return K_TOK_EMBD;
    case LLMQ_T_OUTPUT_NORM: return K_OUT_NORM;
    case LLMQ_T_OUTPUT: return K_OUTPUT;
    case LLMQ_T_ATTN_NORM: return K_ATTN_NORM;
    case LLMQ_T_FFN_NORM: return K_FFN_NORM;
    case LLMQ_T_BIAS_Q: return K_BQ;
    case LLMQ_T_BIAS_K: return K_BK;
    case LLMQ_T_BIAS_V: return K_BV;
    case LLMQ_T_FFN_GATE_INP: return K_ROUTER;
    case LLMQ_T_FFN_GATE_INP_SHEXP: return K_SHEXP_GATE;
    case LLMQ_T_FFN_GATE_EXPS:
    case LLMQ_T_FFN_UP_EXPS:
    case LLMQ_T_FFN_DOWN_EXPS: *which = role - LLMQ_T_FFN_GATE_EXPS; return K_EXPS;
    default:
        if (role >= LLMQ_T_LINEAR_0 && role < LLMQ_T_LINEAR_0 + LLMQ_LIN_COUNT) {
            *which = role - LLMQ_T_LINEAR_0;
            return K_LINEAR;
        }
        *layer = -1;
        return K_VIEW;
    }
}

// The slot of kind k among a block's handed-over tensors (attn_norm, ffn_norm, bq, bk, bv, the moe router and
// qwen2_moe's shared expert gate: AWQ scales their columns), or -1.
static int given_slot(enum kind k) {
    switch (k) {
    case K_ATTN_NORM: return 0;
    case K_FFN_NORM: return 1;
    case K_BQ: return 2;
    case K_BK: return 3;
    case K_BV: return 4;
    case K_ROUTER: return 5;
    case K_SHEXP_GATE: return 6;
    default: return -1;
    }
}

static struct llmq_tensor_view *given_view(const struct llmq_gguf_export *e, const struct entry *x) {
    int g = given_slot(x->kind);
    return g >= 0 && e->given ? &e->given[x->layer * N_GIVEN + g] : NULL;
}

// The view an entry reads when it is written: the driver's copy handed over for its block
// (llmq_gguf_export_block), else the model's. A model without that view (e.g. a bias the loader does not use)
// falls back to the file's tensor.
static const struct llmq_tensor_view *entry_view(const struct llmq_gguf_export *e, const struct entry *x) {
    const struct llmq_model *m = e->m;
    const struct llmq_layer *L = x->layer >= 0 ? &m->layers[x->layer] : NULL;
    const struct llmq_tensor_view *v = given_view(e, x);
    if (v && v->data) return v;
    v = NULL;
    switch (x->kind) {
    case K_VIEW: break;
    case K_TOK_EMBD: v = m->tok_embd; break;
    case K_OUT_NORM: v = m->output_norm; break;
    case K_OUTPUT: v = m->output; break;
    case K_ROPE: v = m->from_gguf ? m->rope_freqs : &e->rope_view; break;
    case K_LINEAR: v = llmq_model_stored_linear(m, x->layer, x->which); break; // phi3: all of attn_qkv / ffn_up
    case K_ATTN_NORM: v = L->attn_norm; break;
    case K_FFN_NORM: v = L->ffn_norm; break;
    case K_BQ: v = L->bq; break;
    case K_BK: v = L->bk; break;
    case K_BV: v = L->bv; break;
    case K_ROUTER: v = L->router; break;
    case K_SHEXP_GATE: v = L->shexp_gate; break;
    case K_EXPS: break; // one view per expert: write_exps
    }
    return v ? v : x->view;
}

static enum llmq_status list_gguf(struct llmq_gguf_export *e, int64_t *cap) {
    const struct llmq_gguf *g = e->m->gguf;
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *v = &llmq_gguf_tensor_at(g, i)->view;
        struct entry *x = add_entry(e, cap);
        if (!x) return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
        snprintf(x->name, sizeof(x->name), "%s", v->name);
        x->kind = classify(&e->m->hp, v->name, &x->layer, &x->which);
        if (x->kind == K_VIEW && !strcmp(v->name, "rope_freqs.weight")) x->kind = K_ROPE;
        x->view = v;
        set_shape(x, v);
    }
    return LLMQ_OK;
}

static enum llmq_status list_hf(struct llmq_gguf_export *e, int64_t *cap) {
    const struct llmq_model *m = e->m;
    const struct llmq_hparams *hp = &m->hp;
    struct entry *x = NULL;
#define ADD(view_, kind_, layer_, which_, ...)                                                                         \
    do {                                                                                                               \
        if (!(x = add_entry(e, cap))) return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");                \
        snprintf(x->name, sizeof(x->name), __VA_ARGS__);                                                               \
        x->kind = kind_;                                                                                               \
        x->layer = layer_;                                                                                             \
        x->which = which_;                                                                                             \
        set_shape(x, view_);                                                                                           \
    } while (0)
    char nb[96];
#define TN(role_, l_) llmq_tensor_full_name(hp->arch, (role_), (l_), false, nb, sizeof nb)
    ADD(m->tok_embd, K_TOK_EMBD, -1, -1, "%s", TN(LLMQ_T_TOK_EMBD, 0));
    ADD(m->output_norm, K_OUT_NORM, -1, -1, "%s", TN(LLMQ_T_OUTPUT_NORM, 0));
    if (!hp->tied_embeddings) ADD(m->output, K_OUTPUT, -1, -1, "%s", TN(LLMQ_T_OUTPUT, 0));
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LLAMA3) { // convert_hf_to_gguf.py writes the factors as a tensor
        int64_t n = hp->n_rot / 2;
        if (!(e->rope_gen = malloc((size_t)n * sizeof(float))))
            return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
        llmq_model_rope_freq_factors(m, e->rope_gen);
        e->rope_view = (struct llmq_tensor_view){.name = LLMQ_GGUF_ROPE_FREQS,
                                                 .dtype = LLMQ_DTYPE_F32,
                                                 .n_dims = 1,
                                                 .shape = {n, 1, 1, 1},
                                                 .data = e->rope_gen,
                                                 .nbytes = (size_t)n * sizeof(float)};
        ADD(&e->rope_view, K_ROPE, -1, -1, "%s", LLMQ_GGUF_ROPE_FREQS);
    }
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LONGROPE) { // as llmq convert (Phi3MiniModel): long, then short
        const char *names[2] = {LLMQ_GGUF_ROPE_LONG, LLMQ_GGUF_ROPE_SHORT};
        const float *vals[2] = {hp->rope_scaling.long_factor, hp->rope_scaling.short_factor};
        int64_t n = hp->n_rot / 2;
        for (int i = 0; i < 2; i++) {
            e->rope_ext[i] = (struct llmq_tensor_view){.name = names[i],
                                                       .dtype = LLMQ_DTYPE_F32,
                                                       .n_dims = 1,
                                                       .shape = {n, 1, 1, 1},
                                                       .data = (void *)vals[i],
                                                       .nbytes = (size_t)n * sizeof(float)};
            ADD(&e->rope_ext[i], K_VIEW, -1, -1, "%s", names[i]);
            x->view = &e->rope_ext[i];
        }
    }
    for (int64_t l = 0; l < hp->n_layer; l++) {
        const struct llmq_layer *L = &m->layers[l];
        ADD(L->attn_norm, K_ATTN_NORM, l, -1, "%s", TN(LLMQ_T_ATTN_NORM, l));
        ADD(L->ffn_norm, K_FFN_NORM, l, -1, "%s", TN(LLMQ_T_FFN_NORM, l));
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            if (!L->w[k]) continue; // a moe block's gate / up / down: the experts below
            enum llmq_linear head;
            int64_t r0, total;
            if (llmq_arch_fused_part(hp, k, &head, &r0, &total) && k != (int)head) continue; // phi3: rows of q's / up's
            ADD(llmq_model_stored_linear(m, l, k), K_LINEAR, l, k, "%s", TN(LLMQ_T_LINEAR_0 + k, l));
            if (llmq_arch_qk_permuted(hp->arch) && llmq_tensor_name_of(LLMQ_T_LINEAR_0 + k)->qk_rows)
                x->perm_heads = k == LLMQ_LIN_Q ? hp->n_head : hp->n_head_kv;
        }
        if (L->router) ADD(L->router, K_ROUTER, l, -1, "%s", TN(LLMQ_T_FFN_GATE_INP, l));
        if (L->shexp_gate) ADD(L->shexp_gate, K_SHEXP_GATE, l, -1, "%s", TN(LLMQ_T_FFN_GATE_INP_SHEXP, l));
        for (int k = 0; L->exps && k < 3; k++) { // (E, R, C): the experts' (R, C) stacked as llmq convert does
            ADD(L->exps[k], K_EXPS, l, k, "%s", TN(LLMQ_T_FFN_GATE_EXPS + k, l));
            x->n_dims = 3;
            x->shape[0] = hp->n_expert;
            x->shape[1] = L->exps[k]->shape[0];
            x->shape[2] = L->exps[k]->shape[1];
        }
        if (L->bq) ADD(L->bq, K_BQ, l, -1, "%s", TN(LLMQ_T_BIAS_Q, l));
        if (L->bk) ADD(L->bk, K_BK, l, -1, "%s", TN(LLMQ_T_BIAS_K, l));
        if (L->bv) ADD(L->bv, K_BV, l, -1, "%s", TN(LLMQ_T_BIAS_V, l));
        // qwen3 / gemma3 q_norm, k_norm, gemma's post norms: copied as the file's other 1-D tensors
        const struct {
            const struct llmq_tensor_view *v;
            enum llmq_tensor_role role;
        } extra[] = {{L->q_norm, LLMQ_T_ATTN_Q_NORM},
                     {L->k_norm, LLMQ_T_ATTN_K_NORM},
                     {L->attn_post_norm, LLMQ_T_ATTN_POST_NORM},
                     {L->ffn_post_norm, LLMQ_T_FFN_POST_NORM}};
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
            if (!extra[i].v) continue;
            ADD(extra[i].v, K_VIEW, l, -1, "%s", TN(extra[i].role, l));
            x->view = extra[i].v;
        }
    }
#undef TN
#undef ADD
    return LLMQ_OK;
}

// The linears of a block handed over one by one: all seven, or a moe block's q, k, v, o (its experts are K_EXPS;
// qwen2_moe's shared expert is its gate, up, down).
static int block_linears(const struct llmq_hparams *hp) {
    return hp->moe && !hp->shexp ? LLMQ_LIN_GATE : LLMQ_LIN_COUNT;
}

static int entry_cmp(const void *a, const void *b) {
    return llmq_gguf_mix_name_cmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

// ---- importance -----------------------------------------------------------------------------------

// Each expert's importance (Σx² / count over the tokens that reached it, as llama-imatrix keeps one row per expert
// matrix) into *eimp (n_layer, E, LLMQ_CALIB_EXP_N_SLOTS). llama-quantize's rule (tools/quantize load_imatrix): an
// expert no token reached gets importance 1 in every column when another expert of its tensor has data; a tensor
// none of whose experts has any gets none (NULL: encoded unweighted, as llama-quantize does for a missing entry).
static enum llmq_status load_expert_importance(struct llmq_gguf_export *e, const struct llmq_calib_stats *s,
                                               float ***eimp) {
    const int64_t E = e->m->hp.n_expert, n = e->m->hp.n_layer * E * LLMQ_CALIB_EXP_N_SLOTS;
    if (s->n_expert != E || !(*eimp = calloc((size_t)n, sizeof(float *))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
    for (int64_t i = 0; i < n; i++) {
        const int64_t first =
            i / (E * LLMQ_CALIB_EXP_N_SLOTS) * (E * LLMQ_CALIB_EXP_N_SLOTS) + i % LLMQ_CALIB_EXP_N_SLOTS;
        bool any = false; // another expert of the same tensor (layer, slot) has data
        for (int64_t x = 0; x < E && !any; x++) any = s->exp[first + x * LLMQ_CALIB_EXP_N_SLOTS].count > 0;
        const struct llmq_calib_input *in = &s->exp[i];
        if (!in->sum_sq || !any) continue;
        if (!((*eimp)[i] = malloc((size_t)in->n_in * sizeof(float))))
            return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
        for (int64_t c = 0; c < in->n_in; c++)
            (*eimp)[i][c] = in->count > 0 ? (float)(in->sum_sq[c] / (double)in->count) : 1.0f;
    }
    return LLMQ_OK;
}

// The importance of every block input of statistics s into *imp (NULL without s).
static enum llmq_status load_importance(struct llmq_gguf_export *e, const struct llmq_calib_stats *s, float ***imp,
                                        float ***eimp) {
    const struct llmq_model *m = e->m;
    int64_t L = m->hp.n_layer;
    if (!s) return LLMQ_OK;
    if (m->hp.moe && !s->exp)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "gguf export: %s: these statistics hold no per-expert importance for the experts of a "
                           "mixture of experts (%s): a .lcs file keeps none (use a llama.cpp imatrix, e.g. from "
                           "llmq calib --imatrix-out, or --calib)",
                           m->path, llmq_arch_name(m->hp.arch));
    if (s->n_layer != L)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "gguf export: the importance statistics have %lld blocks, %s has %lld",
                           (long long)s->n_layer, m->path, (long long)L);
    if (!(*imp = calloc((size_t)(L * LLMQ_CALIB_N_SLOTS), sizeof(float *))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
    static const int slot_linear[LLMQ_CALIB_N_SLOTS] = {LLMQ_LIN_Q, LLMQ_LIN_O, LLMQ_LIN_GATE, LLMQ_LIN_DOWN};
    int n_missing = 0;
    for (int64_t l = 0; l < L; l++)
        for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) {
            const struct llmq_calib_input *in = &s->in[l * LLMQ_CALIB_N_SLOTS + k];
            if (!m->layers[l].w[slot_linear[k]]) continue; // moe: the router's input (f32) / no dense down
            int64_t C = m->layers[l].w[slot_linear[k]]->shape[1];
            if (!in->sum_sq || in->count <= 0) {
                n_missing++;
                continue;
            }
            if (in->n_in != C)
                return llmq_errorf(
                    LLMQ_ERR_UNSUPPORTED, "gguf export: importance of blk.%lld.%s has %lld columns, the weight %lld",
                    (long long)l, llmq_linear_gguf_name(slot_linear[k]), (long long)in->n_in, (long long)C);
            float *v = malloc((size_t)C * sizeof(float));
            if (!v) return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
            for (int64_t c = 0; c < C; c++) v[c] = (float)(in->sum_sq[c] / (double)in->count);
            (*imp)[l * LLMQ_CALIB_N_SLOTS + k] = v;
        }
    if (n_missing)
        llmq_warn("gguf export: %d of %lld block inputs have no importance data (quantized without)", n_missing,
                  (long long)(L * LLMQ_CALIB_N_SLOTS));
    return m->hp.moe ? load_expert_importance(e, s, eimp) : LLMQ_OK;
}

static const float *slot_importance(float *const *imp, const struct entry *x) {
    if (!imp || x->kind != K_LINEAR) return NULL;
    return imp[x->layer * LLMQ_CALIB_N_SLOTS + llmq_calib_slot_of((enum llmq_linear)x->which)];
}

static const float *entry_importance(const struct llmq_gguf_export *e, const struct entry *x) {
    if (x->kind == K_EXPS && x->expert >= 0 && e->eimp) // write_exps' part: that expert's
        return e->eimp[(x->layer * e->m->hp.n_expert + x->expert) * LLMQ_CALIB_EXP_N_SLOTS + (x->which == 2)];
    return slot_importance(e->imp, x);
}

// ---- output path and KVs -----------------------------------------------------------------------------

static enum llmq_status check_output(const struct llmq_gguf_export *e) {
    bool exists;
    return llmq_output_check(e->m->path, e->out_path, false, e->o.force, &exists); // common/io.h's rule
}

static enum llmq_status write_kvs(struct llmq_gguf_export *e) {
    static const char *const except[] = {
        "general.quantization_version", "general.file_type", "split.no", "split.count", "split.tensors.count", NULL};
    struct llmq_gguf_writer *w = e->w;
    enum llmq_status st;
    if (e->m->from_gguf)
        st = llmq_gguf_writer_copy_kvs(w, e->m->gguf, except);
    else
        st = llmq_hf_gguf_kvs(e->m->path, -1, w);
    if (st || (st = llmq_gguf_writer_set_u32(w, "general.quantization_version", 2)) ||
        (st = llmq_gguf_writer_set_u32(w, "general.file_type", (uint32_t)e->o.mix.ftype)))
        return st;
    if (e->o.no_provenance) return LLMQ_OK;
    const json_t *p = json_is_object(e->o.provenance) ? e->o.provenance : NULL;
    const char *method = json_string_value(json_object_get(p, "method"));
    const char *csha = json_string_value(json_object_get(json_object_get(p, "calibration"), "tokens_sha256"));
    const char *isha = json_string_value(json_object_get(json_object_get(p, "imatrix"), "sha256"));
    if ((st = llmq_gguf_writer_set_str(w, "llmq.version", LLMQ_VERSION)) ||
        (method && (st = llmq_gguf_writer_set_str(w, "llmq.method", method))) ||
        (st = llmq_gguf_writer_set_str(w, "llmq.gguf_type", llmq_gguf_ftype_name(e->o.mix.ftype))))
        return st;
    if (p) {
        char *text = json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (!text) return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
        st = llmq_gguf_writer_set_str(w, "llmq.params", text);
        free(text);
        if (st) return st;
    }
    if ((csha && (st = llmq_gguf_writer_set_str(w, "llmq.calibration.sha256", csha))) ||
        (isha && (st = llmq_gguf_writer_set_str(w, "llmq.imatrix.sha256", isha))))
        return st;
    return LLMQ_OK;
}

// ---- begin ---------------------------------------------------------------------------------------------

static void export_free(struct llmq_gguf_export *e) {
    if (!e) return;
    llmq_gguf_writer_free(e->w); // removes an uncommitted temporary file
    for (int64_t i = 0; i < e->n; i++) free(e->ent[i].held);
    for (int64_t i = 0; e->given && i < e->m->hp.n_layer * N_GIVEN; i++) llmq_tensor_copy_free(&e->given[i]);
    free(e->given);
    for (int64_t i = 0; e->imp && i < e->m->hp.n_layer * LLMQ_CALIB_N_SLOTS; i++) free(e->imp[i]);
    for (int64_t i = 0; e->eimp && i < e->m->hp.n_layer * e->m->hp.n_expert * LLMQ_CALIB_EXP_N_SLOTS; i++)
        free(e->eimp[i]);
    free(e->eimp);
    for (int64_t i = 0; e->ceimp && i < e->m->hp.n_layer * e->m->hp.n_expert * LLMQ_CALIB_EXP_N_SLOTS; i++)
        free(e->ceimp[i]);
    free(e->ceimp);
    for (int64_t i = 0; e->cimp && i < e->m->hp.n_layer * LLMQ_CALIB_N_SLOTS; i++) free(e->cimp[i]);
    free(e->imp);
    free(e->cimp);
    free(e->ent);
    free(e->lin);
    free(e->xlin);
    free(e->n_handed);
    free(e->rope_gen);
    free(e->f);
    free(e->q);
    free(e->out_path);
    free(e);
}

// ---- the type choice from the weights (quant/gguf_choose.h) ----------------------------------------------

static void entry_rc(const struct entry *x, int64_t *R, int64_t *C) {
    int64_t ne = 1;
    for (int d = 0; d < x->n_dims; d++) ne *= x->shape[d];
    *C = x->n_dims > 0 ? x->shape[x->n_dims - 1] : 1;
    *R = *C > 0 ? ne / *C : 0;
}

// llmq_gguf_choose_rows_fn over the entries: rows 0, stride, ... of entry i's model view, decoded to f32.
static enum llmq_status choice_rows(void *user, int64_t i, int64_t stride, int64_t n, float *out) {
    const struct llmq_gguf_export *e = user;
    const struct entry *x = &e->ent[i];
    int64_t R, C;
    size_t rb = 0;
    entry_rc(x, &R, &C);
    if (x->kind == K_EXPS) { // row r: row r % Re of expert r / Re's own view
        const int64_t Re = R / e->m->hp.n_expert;
        enum llmq_status st = LLMQ_OK;
        for (int64_t k = 0; k < n && !st; k++) {
            const int64_t r = k * stride;
            const struct llmq_tensor_view *v = e->m->layers[x->layer].exps[3 * (r / Re) + x->which];
            if (!v || !llmq_dtype_nbytes(v->dtype, C, &rb) || llmq_tensor_nelements(v) != Re * C)
                return llmq_errorf(LLMQ_ERR_ARG, "gguf export: %s: expert %lld's view has another shape", x->name,
                                   (long long)(r / Re));
            st = llmq_dequantize_row(v->dtype, (const uint8_t *)v->data + (size_t)(r % Re) * rb, out + k * C, C);
        }
        return st;
    }
    const struct llmq_tensor_view *v = entry_view(e, x);
    if (!v || !llmq_dtype_nbytes(v->dtype, C, &rb) || llmq_tensor_nelements(v) != R * C)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: %s: the model's view has another shape", x->name);
    enum llmq_status st = LLMQ_OK;
    for (int64_t k = 0; k < n && !st; k++)
        st = llmq_dequantize_row(v->dtype, (const uint8_t *)v->data + (size_t)(k * stride) * rb, out + k * C, C);
    return st;
}

// Whether the mix's choice of entry x may change: a quantized tensor typed by the mix rules (quant/gguf_export.h
// "The type choice from the weights").
static bool choice_free(const struct llmq_gguf_export *e, const struct entry *x, const struct llmq_gguf_mix_choice *c,
                        bool tied) {
    const struct llmq_gguf_mix_opts *mx = &e->o.mix;
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(c->type);
    if (!c->quantized || c->manual || !tr || !tr->is_quant) return false;
    if (x->kind == K_TOK_EMBD && mx->embedding_type != LLMQ_DTYPE_COUNT) return false;
    return !((x->kind == K_OUTPUT || (tied && x->kind == K_TOK_EMBD)) && mx->output_type != LLMQ_DTYPE_COUNT);
}

// The choice's input for every entry (file order), from the plan mc.
static void choice_tensors(const struct llmq_gguf_export *e, const struct llmq_gguf_mix_choice *mc,
                           struct llmq_gguf_choose_tensor *ct) {
    bool tied = true;
    for (int64_t i = 0; i < e->n; i++) tied = tied && e->ent[i].kind != K_OUTPUT;
    for (int64_t i = 0; i < e->n; i++) {
        const struct entry *x = &e->ent[i];
        struct llmq_gguf_choose_tensor *t = &ct[i];
        entry_rc(x, &t->R, &t->C);
        t->name = x->name;
        t->type = mc[i].type;
        t->is_free = choice_free(e, x, &mc[i], tied);
        t->allocate = t->is_free && (x->kind == K_LINEAR || x->kind == K_EXPS);
        t->importance = e->imp ? slot_importance(e->imp, x) : slot_importance(e->cimp, x);
        float **eimp = e->imp ? e->eimp : e->ceimp; // the stacked experts: expert x's rows with x's importance
        if (x->kind == K_EXPS && eimp) {
            t->part_rows = t->R / e->m->hp.n_expert;
            t->part_stride = LLMQ_CALIB_EXP_N_SLOTS;
            t->part_importance = eimp + x->layer * e->m->hp.n_expert * LLMQ_CALIB_EXP_N_SLOTS + (x->which == 2);
        }
    }
}

// The params (every entry's elements) and the TARGET budget in bytes of o.
static uint64_t choice_budget(const struct llmq_gguf_export *e, const struct llmq_gguf_choose_tensor *ct,
                              int64_t *params) {
    int64_t p = 0;
    for (int64_t i = 0; i < e->n; i++) p += ct[i].R * ct[i].C;
    *params = p;
    if (e->o.choose.target_bytes) return e->o.choose.target_bytes;
    return (uint64_t)floor(e->o.target_bpw * (double)p / 8.0);
}

// MEASURED: the KLD of every allocated tensor alone in the mix's type (quant/gguf_sens.h) into ct[].kld_ref.
static enum llmq_status measure_sens(struct llmq_gguf_export *e, struct llmq_gguf_choose_tensor *ct) {
    if (e->o.choose.sensitivity != LLMQ_GGUF_SENS_MEASURED) return LLMQ_OK;
    if (e->m->hp.moe)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "gguf export: %s: --sensitivity measured is not implemented for a mixture of experts (%s)",
                           e->m->path, llmq_arch_name(e->m->hp.arch));
    if (!e->o.sens_calib)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: --sensitivity measured needs calibration windows (--calib)");
    struct llmq_gguf_sens_tensor *st = calloc((size_t)(e->n > 0 ? e->n : 1), sizeof(*st));
    int64_t *at = calloc((size_t)(e->n > 0 ? e->n : 1), sizeof(*at)), n = 0;
    if (!st || !at) {
        free(st);
        free(at);
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
    }
    for (int64_t i = 0; i < e->n; i++) {
        if (!ct[i].allocate) continue;
        st[n] = (struct llmq_gguf_sens_tensor){
            .layer = e->ent[i].layer, .which = e->ent[i].which, .type = ct[i].type, .importance = ct[i].importance};
        at[n++] = i;
    }
    struct llmq_gguf_sens_opts so = e->o.sens;
    so.n_threads = e->o.n_threads;
    const double t0 = llmq_now_s();
    enum llmq_status s = llmq_gguf_sens_measure(e->m, e->o.sens_calib, &so, n, st, &e->sens_tokens);
    e->sens_seconds = llmq_now_s() - t0;
    for (int64_t j = 0; j < n && !s; j++) {
        ct[at[j]].kld_ref = e->ent[at[j]].sens_kld = st[j].kld;
        e->ent[at[j]].sens = true;
    }
    free(st);
    free(at);
    return s;
}

// Refines the plan mc with o.choose (nothing for mode MIX): the chosen types, their notes, the entries' errors.
static enum llmq_status choose_types(struct llmq_gguf_export *e, struct llmq_gguf_mix_choice *mc) {
    if (e->o.choose.mode == LLMQ_GGUF_CHOICE_MIX) return LLMQ_OK;
    enum llmq_status st = load_importance(e, e->o.imatrix ? NULL : e->o.choice_imatrix, &e->cimp, &e->ceimp);
    struct llmq_gguf_choose_tensor *ct = st ? NULL : calloc((size_t)e->n, sizeof(*ct));
    if (st || !ct) return st ? st : llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
    struct llmq_gguf_choose_opts co = e->o.choose;
    choice_tensors(e, mc, ct);
    co.target_bytes = choice_budget(e, ct, &co.params);
    co.n_threads = e->o.n_threads;
    const char *mode = co.mode == LLMQ_GGUF_CHOICE_QUALITY ? "quality" : "target";
    if (!(st = measure_sens(e, ct)) && !(st = llmq_gguf_choose(&co, e->n, ct, choice_rows, e)))
        for (int64_t i = 0; i < e->n; i++) {
            struct llmq_gguf_mix_choice *c = &mc[i];
            e->ent[i].pred_err = ct[i].err;
            e->ent[i].pred_err_mix = ct[i].err_mix;
            e->ent[i].pred_kld = ct[i].pred_kld;
            if (ct[i].type == c->type) continue;
            char note[sizeof(c->note)];
            snprintf(note, sizeof(note), "%s%s%s: -> %s (err %.3g of the mix's)", c->note, c->note[0] ? "; " : "", mode,
                     llmq_dtype_name(ct[i].type), ct[i].err_mix > 0 ? ct[i].err / ct[i].err_mix : 0.0);
            memcpy(c->note, note, sizeof(note));
            c->type = ct[i].type;
        }
    free(ct);
    return st;
}

// Opens the file: "<out>.tmp.<pid>", or the stream's part, continued after its first done tensors (marked written).
static enum llmq_status begin_file(struct llmq_gguf_export *e) {
    const struct llmq_gguf_export_stream *s = e->o.stream;
    if (!s) return llmq_gguf_writer_begin(e->w, e->out_path);
    if (s->done < 0 || s->done > e->n)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: a checkpoint of %lld tensors, this output has %lld", s->part,
                           (long long)s->done, (long long)e->n);
    enum llmq_status st = llmq_gguf_writer_begin_part(e->w, e->out_path, s->part, s->done, s->offset);
    if (st) return st;
    for (int64_t i = 0; i < s->done; i++) {
        e->ent[i].written = true;
        e->total_elems -= e->ent[i].R * e->ent[i].C; // the ETA counts what is left
    }
    e->next = s->done;
    if (s->done > 0)
        llmq_info("gguf export: %s: continuing at tensor %lld of %lld (%s), %.2f MiB already written", e->out_path,
                  (long long)s->done + 1, (long long)e->n, s->done < e->n ? e->ent[s->done].name : "none left",
                  (double)s->offset / 1048576.0);
    return LLMQ_OK;
}

enum llmq_status llmq_gguf_export_begin(const struct llmq_model *m, const char *out_path,
                                        const struct llmq_gguf_export_opts *o, struct llmq_gguf_export **out) {
    struct llmq_gguf_export *e = NULL;
    struct llmq_gguf_mix_tensor *mt = NULL;
    struct llmq_gguf_mix_choice *mc = NULL;
    enum llmq_status st = LLMQ_OK;
    int64_t cap = 0, L = m ? m->hp.n_layer : 0;
    *out = NULL;
    if (!m || !o || (!out_path && !o->dry_run))
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: missing model, output or options");
    if (!(e = calloc(1, sizeof(*e)))) return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
    e->m = m;
    e->o = *o;
    if (e->o.n_threads < 1) e->o.n_threads = 1;
    e->o.mix.have_imatrix = o->mix.have_imatrix || o->imatrix != NULL;
    e->t0 = llmq_now_s();
    if ((out_path && !(e->out_path = strdup(out_path))) ||
        !(e->lin = malloc((size_t)(L * LLMQ_LIN_COUNT) * sizeof(int64_t))) ||
        !(e->xlin = malloc((size_t)(L > 0 ? L * 3 : 1) * sizeof(int64_t))) ||
        !(e->n_handed = calloc((size_t)(L > 0 ? L : 1), sizeof(int))) ||
        !(e->given = calloc((size_t)(L > 0 ? L * N_GIVEN : 1), sizeof(*e->given)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < L * LLMQ_LIN_COUNT; i++) e->lin[i] = -1;
    for (int64_t i = 0; i < L * 3; i++) e->xlin[i] = -1;
    if ((st = m->from_gguf ? list_gguf(e, &cap) : list_hf(e, &cap))) goto fail;
    qsort(e->ent, (size_t)e->n, sizeof(*e->ent), entry_cmp);
    for (int64_t i = 0; i < e->n; i++) { // gguf_write's ggml_n_dims: outer dims of 1 are not written ((1, D) -> (D))
        struct entry *x = &e->ent[i];
        while (x->n_dims > 1 && x->shape[0] == 1) {
            memmove(x->shape, x->shape + 1, sizeof(int64_t) * (size_t)(LLMQ_MAX_DIMS - 1));
            x->shape[LLMQ_MAX_DIMS - 1] = 1;
            x->n_dims--;
        }
    }
    if ((st = load_importance(e, o->imatrix, &e->imp, &e->eimp))) goto fail;

    // ---- plan
    if (!(mt = calloc((size_t)e->n, sizeof(*mt))) || !(mc = calloc((size_t)e->n, sizeof(*mc)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < e->n; i++) {
        struct entry *x = &e->ent[i];
        mt[i].name = x->name;
        mt[i].n_dims = x->n_dims;
        memcpy(mt[i].shape, x->shape, sizeof(mt[i].shape));
        mt[i].src_type = x->src_type;
        if (x->kind == K_LINEAR) e->lin[x->layer * LLMQ_LIN_COUNT + x->which] = i;
        for (int k = 0; x->kind == K_LINEAR && k < LLMQ_LIN_COUNT; k++) { // phi3: k, v in attn_qkv, gate in ffn_up
            enum llmq_linear head;
            int64_t r0, total;
            if (llmq_arch_fused_part(&m->hp, k, &head, &r0, &total) && (int)head == x->which && k != (int)head)
                e->lin[x->layer * LLMQ_LIN_COUNT + k] = i;
        }
        if (x->kind == K_EXPS) e->xlin[x->layer * 3 + x->which] = i;
        if (x->kind == K_EXPS && !m->hp.shexp) // their type (qwen2_moe: these are its shared expert's)
            e->lin[x->layer * LLMQ_LIN_COUNT + LLMQ_LIN_GATE + x->which] = i;
    }
    struct llmq_gguf_mix_model mm;
    llmq_gguf_mix_model_from_hparams(&m->hp, &mm);
    if ((st = llmq_gguf_mix_plan(&mm, &e->o.mix, e->n, mt, mc)) || (st = choose_types(e, mc))) goto fail;
    int64_t max_C = 1;
    for (int64_t i = 0; i < e->n; i++) {
        struct entry *x = &e->ent[i];
        int64_t ne = 1;
        for (int d = 0; d < x->n_dims; d++) ne *= x->shape[d];
        x->ch = mc[i];
        x->C = x->n_dims > 0 ? x->shape[x->n_dims - 1] : 1;
        x->R = x->C > 0 ? ne / x->C : 0;
        max_C = x->C > max_C ? x->C : max_C;
        const struct llmq_dtype_traits *tr = llmq_dtype_traits(x->src_type);
        if (x->src_type != x->ch.type && (!tr || !tr->can_dequant)) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s cannot be decoded", m->path, x->name,
                             llmq_dtype_name(x->src_type));
            goto fail;
        }
        if (!llmq_dtype_nbytes(x->ch.type, x->C, &x->row_bytes)) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED, "gguf export: %s: rows of %lld do not fit %s", x->name,
                             (long long)x->C, llmq_dtype_name(x->ch.type));
            goto fail;
        }
        if (x->perm_heads && x->R % (2 * x->perm_heads) != 0) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s: %lld rows cannot be split into %lld heads of pairs",
                             m->path, x->name, (long long)x->R, (long long)x->perm_heads);
            goto fail;
        }
        x->nbytes = x->row_bytes * (size_t)x->R;
        e->total_elems += ne;
        e->total_bytes += x->nbytes;
        e->n_fallback += x->ch.fallback;
    }
    for (int64_t i = 0; i < e->n && !o->allow_requantize; i++) { // llama-quant.cpp: "requantizing ... is disabled"
        const struct entry *x = &e->ent[i];
        const struct llmq_dtype_traits *tr = llmq_dtype_traits(x->src_type);
        if (x->src_type != x->ch.type && tr && tr->is_quant) {
            st =
                llmq_errorf(LLMQ_ERR_ARG,
                            "%s: tensor %s is already quantized (%s); requantizing it to %s loses more than quantizing "
                            "the f32 / f16 original: pass --allow-requantize to do it anyway",
                            m->path, x->name, llmq_dtype_name(x->src_type), llmq_dtype_name(x->ch.type));
            goto fail;
        }
    }
    for (int64_t i = 0; i < L * LLMQ_LIN_COUNT; i++)
        if (e->lin[i] < 0 && i % LLMQ_LIN_COUNT < block_linears(&m->hp)) {
            st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: blk.%lld.%s.weight missing", m->path,
                             (long long)(i / LLMQ_LIN_COUNT), llmq_linear_gguf_name(i % LLMQ_LIN_COUNT));
            goto fail;
        }
    e->f_cap = CHUNK_FLOATS > max_C ? CHUNK_FLOATS : max_C;
    if (o->dry_run) goto ok;

    // ---- the file
    if ((st = check_output(e))) goto fail;
    if (!(e->w = llmq_gguf_writer_init())) {
        st = LLMQ_ERR_NOMEM;
        goto fail;
    }
    if ((st = write_kvs(e))) goto fail;
    for (int64_t i = 0; i < e->n; i++)
        if ((st = llmq_gguf_writer_add_tensor(e->w, e->ent[i].name, e->ent[i].ch.type, e->ent[i].n_dims,
                                              e->ent[i].shape)))
            goto fail;
    if ((st = begin_file(e))) goto fail;
ok:
    free(mt);
    free(mc);
    *out = e;
    return LLMQ_OK;
fail:
    free(mt);
    free(mc);
    export_free(e);
    return st;
}

// ---- writing ---------------------------------------------------------------------------------------------

static enum llmq_status work_buffers(struct llmq_gguf_export *e) {
    size_t need = 0;
    if (!e->f && !(e->f = malloc((size_t)e->f_cap * sizeof(float))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory for %lld floats", (long long)e->f_cap);
    for (int64_t i = 0; i < e->n; i++) { // encoded size of one chunk of the widest-rowed tensor
        const struct entry *x = &e->ent[i];
        int64_t rows = e->f_cap / (x->C > 0 ? x->C : 1);
        size_t b = x->row_bytes * (size_t)(rows < x->R ? rows : x->R);
        need = b > need ? b : need;
    }
    if (!e->q && !(e->q = malloc(need ? need : 1))) return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
    e->q_cap = need;
    return LLMQ_OK;
}

static int64_t src_row(const struct entry *x, int64_t r) {
    return x->perm_heads ? llmq_arch_qk_src_row(r, x->R, x->perm_heads, true) : r;
}

// Writes encoded rows (model order) in file order.
static enum llmq_status write_encoded(struct llmq_gguf_export *e, const struct entry *x, const uint8_t *rows) {
    if (!x->perm_heads) return llmq_gguf_writer_write_tensor(e->w, rows, x->nbytes);
    enum llmq_status st = LLMQ_OK;
    for (int64_t r = 0; r < x->R && !st; r++)
        st = llmq_gguf_writer_write_tensor(e->w, rows + (size_t)src_row(x, r) * x->row_bytes, x->row_bytes);
    return st;
}

// Encodes rows of a view (or of the generated rope factors) chunk by chunk into the writer.
static enum llmq_status write_from_view(struct llmq_gguf_export *e, const struct entry *x,
                                        const struct llmq_tensor_view *v) {
    enum llmq_status st = LLMQ_OK;
    size_t src_rb;
    if (!v) return llmq_errorf(LLMQ_ERR_ARG, "gguf export: %s: the model has no view for it", x->name);
    if (llmq_tensor_nelements(v) != x->R * x->C || (v->n_dims > 0 && v->shape[v->n_dims - 1] != x->C) ||
        !llmq_dtype_nbytes(v->dtype, x->C, &src_rb))
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: %s: the model's view has another shape", x->name);
    const uint8_t *base = v->data;
    if (!x->perm_heads && v->dtype == x->ch.type) { // the same bytes: copy
        st = llmq_gguf_writer_write_tensor(e->w, base, x->nbytes);
        llmq_mmap_release(base, x->nbytes);
        return st;
    }
    if ((st = work_buffers(e))) return st;
    const float *imp = entry_importance(e, x);
    int64_t rows = e->f_cap / x->C;
    for (int64_t r0 = 0; r0 < x->R && !st; r0 += rows) {
        int64_t nr = x->R - r0 < rows ? x->R - r0 : rows;
        const float *src = e->f;
        if (!x->perm_heads && v->dtype == LLMQ_DTYPE_F32 && ((uintptr_t)base & 3) == 0)
            src = (const float *)(base + (size_t)r0 * src_rb); // f32 input: encode straight from the mapping
        else if (!x->perm_heads)
            st = llmq_dequantize_row(v->dtype, base + (size_t)r0 * src_rb, e->f, nr * x->C);
        else
            for (int64_t k = 0; k < nr && !st; k++)
                st = llmq_dequantize_row(v->dtype, base + (size_t)src_row(x, r0 + k) * src_rb, e->f + k * x->C, x->C);
        if (!st) st = llmq_gguf_encode_rows(x->ch.type, src, e->q, nr, x->C, imp, e->o.n_threads);
        if (!st) st = llmq_gguf_writer_write_tensor(e->w, e->q, x->row_bytes * (size_t)nr);
        if (!st) llmq_mmap_release(base + (size_t)r0 * src_rb, (size_t)nr * src_rb); // done with these rows
    }
    return st;
}

// A stacked expert tensor (E, R, C): expert x's rows (its own view, layers[l].exps) are rows x R .. (x + 1) R - 1, each
// expert written as a tensor of its own would be (every encoder works row by row; no importance here).
static enum llmq_status write_exps(struct llmq_gguf_export *e, const struct entry *x) {
    const struct llmq_layer *L = &e->m->layers[x->layer];
    const int64_t E = e->m->hp.n_expert;
    enum llmq_status st = LLMQ_OK;
    struct entry part = *x; // its kind and which stay: entry_importance finds the expert's
    part.n_dims = 2;
    part.shape[0] = x->shape[1];
    part.shape[1] = x->shape[2];
    part.shape[2] = 1;
    part.R = x->R / E;
    part.nbytes = x->row_bytes * (size_t)part.R;
    for (int64_t k = 0; k < E && !st; k++) {
        part.expert = k;
        st = write_from_view(e, &part, L->exps[3 * k + x->which]);
    }
    return st;
}

static void progress(struct llmq_gguf_export *e, int64_t i, double secs) {
    const struct entry *x = &e->ent[i];
    if (!e->o.progress) return;
    char shape[64];
    struct llmq_tensor_view v = {.n_dims = x->n_dims};
    memcpy(v.shape, x->shape, sizeof(v.shape));
    llmq_tensor_shape_str(&v, shape, sizeof(shape));
    e->done_elems += x->R * x->C;
    // work model: elements (common/eta.h; "?" until 1% of them are written)
    struct llmq_eta w = {.total = (double)e->total_elems, .done = (double)e->done_elems, .t0 = e->t0};
    char eta[16];
    llmq_eta_format(llmq_eta_remaining(&w, llmq_now_s()), eta, sizeof(eta));
    int width = snprintf(NULL, 0, "%lld", (long long)e->n);
    llmq_info("[%*lld/%lld] %-28s %-14s %5s -> %-6s %8.3f MiB %5.0f ms  ETA %s%s%s", width, (long long)i + 1,
              (long long)e->n, x->name, shape, llmq_dtype_name(x->src_type), llmq_dtype_name(x->ch.type),
              (double)x->nbytes / 1048576.0, 1e3 * secs, eta, x->ch.note[0] ? "  " : "", x->ch.note);
}

static bool ready(const struct llmq_gguf_export *e, const struct entry *x) {
    if (e->finishing) return true;
    if (x->kind == K_LINEAR) return x->handed;
    if (x->kind == K_EXPS) return x->handed; // every expert handed over (the writer alone: at finish)
    if (x->layer >= 0) return e->n_handed[x->layer] == block_linears(&e->m->hp);
    return true;
}

// After entry x was written (the stream's contract, quant/gguf_export.h): a sync when due, then step().
static enum llmq_status stream_step(struct llmq_gguf_export *e, const struct entry *x) {
    const struct llmq_gguf_export_stream *s = e->o.stream;
    int64_t done = e->next;
    uint64_t off = 0;
    e->unsynced += x->nbytes;
    bool sync = e->next < e->n && e->unsynced >= s->sync_bytes;
    enum llmq_status st = sync ? llmq_gguf_writer_sync(e->w, &done, &off) : LLMQ_OK;
    if (st) return st;
    if (sync) e->unsynced = 0;
    return s->step ? s->step(s->user, done, e->n, sync, off) : LLMQ_OK;
}

// Writes entries in file order while the next one is ready.
static enum llmq_status pump(struct llmq_gguf_export *e) {
    enum llmq_status st = LLMQ_OK;
    while (e->next < e->n && !st && ready(e, &e->ent[e->next])) {
        struct entry *x = &e->ent[e->next];
        double t0 = llmq_now_s();
        if (!e->o.dry_run) {
            if (x->held)
                st = write_encoded(e, x, x->held);
            else if (x->kind == K_EXPS)
                st = write_exps(e, x);
            else
                st = write_from_view(e, x, entry_view(e, x));
            if (st) {
                llmq_errorf(st, "gguf export: writing %s failed: %s", x->name, llmq_status_name(st));
                break;
            }
        }
        free(x->held);
        x->held = NULL;
        if (given_view(e, x)) llmq_tensor_copy_free(given_view(e, x)); // written: the copy is done with
        x->written = true;
        x->seconds = llmq_now_s() - t0;
        if (!e->o.dry_run) progress(e, e->next, x->seconds);
        e->next++;
        if (e->o.stream && !e->o.dry_run) st = stream_step(e, x);
    }
    if (st) e->err = st;
    return st;
}

// ---- hand-overs ---------------------------------------------------------------------------------------------

static struct entry *linear_entry(const struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which) {
    if (!e || layer < 0 || layer >= e->m->hp.n_layer || (int)which < 0 || which >= LLMQ_LIN_COUNT) return NULL;
    int64_t i = e->lin[layer * LLMQ_LIN_COUNT + which];
    return i >= 0 ? &e->ent[i] : NULL; // a moe block has no dense gate / up / down (qwen2_moe: its shared expert's)
}

// The stacked expert tensor of (layer, which GATE / UP / DOWN), or NULL.
static struct entry *expert_entry(const struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which) {
    if (!e || !e->m->hp.moe || layer < 0 || layer >= e->m->hp.n_layer || which < LLMQ_LIN_GATE || which > LLMQ_LIN_DOWN)
        return NULL;
    int64_t i = e->xlin[layer * 3 + (which - LLMQ_LIN_GATE)];
    return i >= 0 ? &e->ent[i] : NULL;
}

enum llmq_dtype llmq_gguf_export_expert_type(const struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which) {
    const struct entry *x = expert_entry(e, layer, which);
    return x ? x->ch.type : LLMQ_DTYPE_INVALID;
}

enum llmq_dtype llmq_gguf_export_linear_type(const struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which) {
    const struct entry *x = linear_entry(e, layer, which);
    return x ? x->ch.type : LLMQ_DTYPE_INVALID;
}

const float *llmq_gguf_export_linear_importance(const struct llmq_gguf_export *e, int64_t layer,
                                                enum llmq_linear which) {
    const struct entry *x = linear_entry(e, layer, which);
    return x ? entry_importance(e, x) : NULL;
}

// The entry of linear (layer, which) and where its rows go: rows [*r0, *r0 + *R) of the entry (phi3's q, k, v in
// attn_qkv, gate and up in ffn_up; every other linear is all the rows of its own entry).
static enum llmq_status check_handover(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                       const void *data, struct entry **xo, int64_t *r0, int64_t *R) {
    if (!e) return llmq_errorf(LLMQ_ERR_ARG, "gguf export: no export");
    if (e->err) return e->err;
    struct entry *x = linear_entry(e, layer, which);
    if (!x || !data || x->kind != K_LINEAR)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: linear (%lld, %d) out of range, an expert tensor or no data",
                           (long long)layer, (int)which);
    enum llmq_linear head;
    int64_t total;
    *r0 = 0;
    *R = x->R;
    if (llmq_arch_fused_part(&e->m->hp, which, &head, r0, &total)) {
        *R = e->m->layers[layer].w[which]->shape[0];
        if (x->fused_got & (1u << which))
            return llmq_errorf(LLMQ_ERR_ARG, "gguf export: %s rows of %s handed over twice", llmq_linear_name(which),
                               x->name);
    } else if (x->handed)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: %s handed over twice", x->name);
    if (!e->o.dry_run && !x->held && !(x->held = malloc(x->nbytes ? x->nbytes : 1)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: %s: out of memory", x->name);
    *xo = x;
    return LLMQ_OK;
}

// Linear `which`'s rows are in x->held: x is written when its turn comes once all its rows are (phi3: every member).
static enum llmq_status accept(struct llmq_gguf_export *e, struct entry *x, enum llmq_linear which) {
    enum llmq_linear head;
    int64_t r0, total;
    e->n_handed[x->layer]++;
    if (llmq_arch_fused_part(&e->m->hp, which, &head, &r0, &total)) {
        x->fused_got |= 1u << which;
        x->handed = x->fused_got == (head == LLMQ_LIN_Q ? 7u << LLMQ_LIN_Q : 3u << LLMQ_LIN_GATE);
    } else
        x->handed = true;
    return pump(e);
}

enum llmq_status llmq_gguf_export_linear_bytes(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                               const void *blocks) {
    struct entry *x = NULL;
    int64_t r0, R;
    enum llmq_status st = check_handover(e, layer, which, blocks, &x, &r0, &R);
    if (st) return st;
    if (x->held) memcpy((uint8_t *)x->held + (size_t)r0 * x->row_bytes, blocks, (size_t)R * x->row_bytes);
    return accept(e, x, which);
}

enum llmq_status llmq_gguf_export_linear_f32(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                             const float *W) {
    struct entry *x = NULL;
    int64_t r0, R;
    enum llmq_status st = check_handover(e, layer, which, W, &x, &r0, &R);
    if (st) return st;
    if (x->held && (st = llmq_gguf_encode_rows(x->ch.type, W, (uint8_t *)x->held + (size_t)r0 * x->row_bytes, R, x->C,
                                               entry_importance(e, x), e->o.n_threads)))
        return st;
    return accept(e, x, which);
}

// Expert `expert`'s part of the stacked tensor of (layer, which): *xo and its byte offset *off.
static enum llmq_status expert_part(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which, int64_t expert,
                                    const void *data, struct entry **xo, size_t *off) {
    if (!e) return llmq_errorf(LLMQ_ERR_ARG, "gguf export: no export");
    if (e->err) return e->err;
    struct entry *x = expert_entry(e, layer, which);
    if (!x || x->kind != K_EXPS || !data || expert < 0 || expert >= e->m->hp.n_expert)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: expert %lld of linear (%lld, %d) out of range or no data",
                           (long long)expert, (long long)layer, (int)which);
    const size_t part = x->nbytes / (size_t)e->m->hp.n_expert;
    if (x->handed || x->written)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: %s: expert %lld handed over after the tensor was complete",
                           x->name, (long long)expert);
    if (!e->o.dry_run && !x->held && !(x->held = calloc(1, x->nbytes ? x->nbytes : 1)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: %s: out of memory", x->name);
    *xo = x;
    *off = part * (size_t)expert;
    return LLMQ_OK;
}

// One more expert of x is in: once all are, the stacked tensor is written when its turn comes.
static enum llmq_status accept_expert(struct llmq_gguf_export *e, struct entry *x) {
    if (++x->n_exp_handed == e->m->hp.n_expert) x->handed = true;
    return pump(e);
}

// Expert `expert`'s rows into its part of the stacked tensor: encoded rows, or (f32) weights encoded here.
static enum llmq_status put_expert(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which, int64_t expert,
                                   const void *data, bool f32) {
    struct entry *x = NULL;
    size_t off = 0;
    enum llmq_status st = expert_part(e, layer, which, expert, data, &x, &off);
    if (st || !x->held) return st ? st : accept_expert(e, x);
    const int64_t R = x->R / e->m->hp.n_expert;
    if (!f32)
        memcpy((uint8_t *)x->held + off, data, x->nbytes / (size_t)e->m->hp.n_expert);
    else if ((st = llmq_gguf_encode_rows(x->ch.type, data, (uint8_t *)x->held + off, R, x->C, NULL, e->o.n_threads)))
        return st;
    return accept_expert(e, x);
}

enum llmq_status llmq_gguf_export_expert_bytes(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                               int64_t expert, const void *blocks) {
    return put_expert(e, layer, which, expert, blocks, false);
}

enum llmq_status llmq_gguf_export_expert_f32(struct llmq_gguf_export *e, int64_t layer, enum llmq_linear which,
                                             int64_t expert, const float *W) {
    return put_expert(e, layer, which, expert, W, true);
}

enum llmq_status llmq_gguf_export_block(struct llmq_gguf_export *e, int64_t layer, const struct llmq_layer *ly) {
    if (!e || !ly || layer < 0 || layer >= e->m->hp.n_layer)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf export: block %lld out of range or no weights", (long long)layer);
    if (e->err) return e->err;
    for (int64_t i = 0; i < e->n; i++) {
        const struct entry *x = &e->ent[i];
        if (x->layer == layer && given_slot(x->kind) >= 0 && x->written)
            return llmq_errorf(LLMQ_ERR_ARG, "gguf export: block %lld handed over after %s was written",
                               (long long)layer, x->name);
    }
    const struct llmq_tensor_view *v[N_GIVEN] = {ly->attn_norm, ly->ffn_norm, ly->bq,        ly->bk,
                                                 ly->bv,        ly->router,   ly->shexp_gate};
    for (int g = 0; g < N_GIVEN; g++) {
        struct llmq_tensor_view *c = &e->given[layer * N_GIVEN + g];
        llmq_tensor_copy_free(c); // handed over again: the last one counts
        if (!e->o.dry_run && !llmq_tensor_copy(v[g], c))
            return llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory for block %lld's tensors", (long long)layer);
    }
    return LLMQ_OK;
}

// ---- finish ------------------------------------------------------------------------------------------------

static json_t *report_json(const struct llmq_gguf_export *e, double secs, uint64_t file_bytes) {
    json_t *r = json_object(), *ts = json_array(), *tot = json_object();
    int64_t params = 0;
    double pe = 0, pm = 0;  // Σ predicted errors of the chosen types and of the mix's
    double pk = 0, pkm = 0; // MEASURED: Σ predicted KLD of the chosen types and Σ measured KLD of the mix's
    const bool measured =
        e->o.choose.mode != LLMQ_GGUF_CHOICE_MIX && e->o.choose.sensitivity == LLMQ_GGUF_SENS_MEASURED;
    for (int64_t i = 0; i < e->n; i++) {
        const struct entry *x = &e->ent[i];
        json_t *t = json_object(), *sh = json_array();
        for (int d = 0; d < x->n_dims; d++) json_array_append_new(sh, json_integer(x->shape[d]));
        json_object_set_new(t, "name", json_string(x->name));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "src_type", json_string(llmq_dtype_name(x->src_type)));
        json_object_set_new(t, "type", json_string(llmq_dtype_name(x->ch.type)));
        json_object_set_new(t, "wanted", json_string(llmq_dtype_name(x->ch.wanted)));
        json_object_set_new(t, "bytes", json_integer((json_int_t)x->nbytes));
        json_object_set_new(t, "note", json_string(x->ch.note));
        json_object_set_new(t, "seconds", json_real(x->seconds));
        if (e->o.choose.mode != LLMQ_GGUF_CHOICE_MIX) {
            json_object_set_new(t, "pred_err", json_real(x->pred_err));
            json_object_set_new(t, "pred_err_mix", json_real(x->pred_err_mix));
            pe += x->pred_err;
            pm += x->pred_err_mix;
        }
        if (measured && x->sens) {
            json_object_set_new(t, "sens_kld", json_real(x->sens_kld));
            json_object_set_new(t, "pred_kld", json_real(x->pred_kld));
            pk += x->pred_kld;
            pkm += x->sens_kld;
        }
        json_array_append_new(ts, t);
        params += x->R * x->C;
    }
    json_object_set_new(r, "output", e->out_path ? json_string(e->out_path) : json_null());
    json_object_set_new(r, "model", json_string(e->m->path));
    json_object_set_new(r, "ftype", json_string(llmq_gguf_ftype_name(e->o.mix.ftype)));
    json_object_set_new(r, "dry_run", json_boolean(e->o.dry_run));
    json_object_set_new(r, "tensors", ts);
    json_object_set_new(tot, "tensors", json_integer(e->n));
    json_object_set_new(tot, "params", json_integer(params));
    json_object_set_new(tot, "bytes", json_integer((json_int_t)e->total_bytes));
    json_object_set_new(tot, "bits_per_weight", json_real(params ? 8.0 * (double)e->total_bytes / (double)params : 0));
    json_object_set_new(tot, "file_bytes", json_integer((json_int_t)file_bytes));
    json_object_set_new(tot, "fallbacks", json_integer(e->n_fallback));
    json_object_set_new(tot, "seconds", json_real(secs));
    if (e->o.choose.mode != LLMQ_GGUF_CHOICE_MIX) {
        json_object_set_new(tot, "predicted_err", json_real(pe));
        json_object_set_new(tot, "predicted_err_mix", json_real(pm));
    }
    if (measured) {
        json_object_set_new(tot, "predicted_kld", json_real(pk));
        json_object_set_new(tot, "predicted_kld_mix", json_real(pkm));
        json_t *sj = json_object();
        json_object_set_new(sj, "windows", json_integer(e->o.sens.n_windows));
        json_object_set_new(sj, "seqlen", json_integer(e->o.sens.seqlen));
        json_object_set_new(sj, "tokens", json_integer(e->sens_tokens));
        json_object_set_new(sj, "seconds", json_real(e->sens_seconds));
        json_object_set_new(tot, "sensitivity", sj);
    }
    json_object_set_new(r, "totals", tot);
    return r;
}

enum llmq_status llmq_gguf_export_finish(struct llmq_gguf_export *e) {
    if (!e) return llmq_errorf(LLMQ_ERR_ARG, "gguf export: finish without an export");
    enum llmq_status st = e->err;
    uint64_t file_bytes = 0;
    for (int64_t i = e->next; i < e->n && !st; i++) // phi3: a fused tensor with only some of its rows
        if (e->ent[i].fused_got && !e->ent[i].handed)
            st = llmq_errorf(LLMQ_ERR_ARG, "gguf export: finished with only some rows of %s handed over",
                             e->ent[i].name);
    e->finishing = true;
    if (!st) st = pump(e);
    if (!st && !e->o.dry_run) {
        st = llmq_gguf_writer_commit(e->w);
        struct stat sb;
        if (!st && stat(e->out_path, &sb) == 0) file_bytes = (uint64_t)sb.st_size;
    }
    if (!st) {
        double secs = llmq_now_s() - e->t0;
        int64_t params = 0;
        for (int64_t i = 0; i < e->n; i++) params += e->ent[i].R * e->ent[i].C;
        if (!e->o.dry_run)
            llmq_info("gguf export: %s: %lld tensors, %.2f MiB of tensor data, %.3f bits per weight, %d fallback(s), "
                      "%.1f s",
                      e->out_path, (long long)e->n, (double)e->total_bytes / 1048576.0,
                      params ? 8.0 * (double)e->total_bytes / (double)params : 0.0, e->n_fallback, secs);
        if (e->o.report) *e->o.report = report_json(e, secs, file_bytes);
    }
    export_free(e);
    return st;
}

void llmq_gguf_export_abort(struct llmq_gguf_export *e) { export_free(e); }

void llmq_gguf_export_print_plan(const struct llmq_gguf_export *e, FILE *f) {
    int64_t params = 0;
    fprintf(f, "%-32s %-16s %-7s %-7s %10s  %s\n", "tensor", "shape", "from", "type", "MiB", "note");
    for (int64_t i = 0; i < e->n; i++) {
        const struct entry *x = &e->ent[i];
        char shape[64];
        struct llmq_tensor_view v = {.n_dims = x->n_dims};
        memcpy(v.shape, x->shape, sizeof(v.shape));
        llmq_tensor_shape_str(&v, shape, sizeof(shape));
        char kl[96] = "";
        if (x->sens)
            snprintf(kl, sizeof(kl), "%spredicted KLD %.3g (alone in the mix's type: %.3g)", x->ch.note[0] ? "; " : "",
                     x->pred_kld, x->sens_kld);
        fprintf(f, "%-32s %-16s %-7s %-7s %10.4f  %s%s\n", x->name, shape, llmq_dtype_name(x->src_type),
                llmq_dtype_name(x->ch.type), (double)x->nbytes / 1048576.0, x->ch.note, kl);
        params += x->R * x->C;
    }
    fprintf(f,
            "total: %lld tensors, %lld weights, %.2f MiB (%llu bytes of tensor data), %.4f bits per weight, "
            "%d fallback(s), ftype %s\n",
            (long long)e->n, (long long)params, (double)e->total_bytes / 1048576.0, (unsigned long long)e->total_bytes,
            params ? 8.0 * (double)e->total_bytes / (double)params : 0.0, e->n_fallback,
            llmq_gguf_ftype_name(e->o.mix.ftype));
    if (e->o.choose.mode != LLMQ_GGUF_CHOICE_MIX) {
        double pe = 0, pm = 0;
        for (int64_t i = 0; i < e->n; i++) {
            pe += e->ent[i].pred_err;
            pm += e->ent[i].pred_err_mix;
        }
        fprintf(f, "type choice: %s; predicted err %.6g (the mix's types: %.6g)\n",
                e->o.choose.mode == LLMQ_GGUF_CHOICE_QUALITY ? "quality" : "target", pe, pm);
        if (e->o.choose.sensitivity == LLMQ_GGUF_SENS_MEASURED) {
            double pk = 0, pkm = 0;
            for (int64_t i = 0; i < e->n; i++) {
                pk += e->ent[i].pred_kld;
                pkm += e->ent[i].sens_kld;
            }
            fprintf(f,
                    "sensitivity: measured on %lld calibration tokens; predicted KLD of the linears %.6g (the mix's "
                    "types, measured alone and summed: %.6g)\n",
                    (long long)e->sens_tokens, pk, pkm);
        }
    }
}

enum llmq_status llmq_gguf_export_target_range(const struct llmq_model *m, const struct llmq_gguf_export_opts *o,
                                               uint64_t *min_bytes, uint64_t *max_bytes, int64_t *params) {
    struct llmq_gguf_export_opts po = *o;
    struct llmq_gguf_export *e = NULL;
    po.dry_run = true;
    po.progress = false;
    po.report = NULL;
    po.choose.mode = LLMQ_GGUF_CHOICE_MIX;
    enum llmq_log_level lv = llmq_log_get_level();
    llmq_log_set_level(LLMQ_LOG_ERROR); // the plan's warnings come again with the run
    enum llmq_status st = llmq_gguf_export_begin(m, NULL, &po, &e);
    llmq_log_set_level(lv);
    if (st) return st;
    struct llmq_gguf_mix_choice *mc = calloc((size_t)e->n, sizeof(*mc));
    struct llmq_gguf_choose_tensor *ct = calloc((size_t)e->n, sizeof(*ct));
    if (!mc || !ct) st = llmq_errorf(LLMQ_ERR_NOMEM, "gguf export: out of memory");
    for (int64_t i = 0; !st && i < e->n; i++) mc[i] = e->ent[i].ch;
    if (!st) {
        choice_tensors(e, mc, ct);
        (void)choice_budget(e, ct, params);
        llmq_gguf_choose_range(&o->choose, e->n, ct, min_bytes, max_bytes);
    }
    free(mc);
    free(ct);
    export_free(e);
    return st;
}

enum llmq_status llmq_gguf_export_rtn(const struct llmq_model *m, const char *out_path,
                                      const struct llmq_gguf_export_opts *o) {
    struct llmq_gguf_export *e = NULL;
    enum llmq_status st = llmq_gguf_export_begin(m, out_path, o, &e);
    if (st) return st;
    return llmq_gguf_export_finish(e);
}
