/*
 * quant/plan.c — the preflight plan of `llmq quantize` (quant/plan.h documents the model).
 * Legend: R rows/out, C cols/in, N calibration tokens, T micro-batch tokens, D n_embd, F n_ff, V n_vocab,
 * L n_layer, Dq = n_head * head_dim, Dkv = n_head_kv * head_dim, es bytes per source element.
 * Byte and FLOP arithmetic is in double (sums of products of int64 shapes; no overflow, ~1e-16 relative).
 */
#include "quant/plan.h"

#include "calib/blocks.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "common/spill.h"
#include "formats/ggml/encode.h"
#include "formats/gguf.h"
#include "kernels/gemm.h"
#include "quant/awq.h"
#include "quant/gguf_export.h"
#include "quant/quantizer.h"

#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

void openblas_set_num_threads(int n);

#define MIB 1048576.0
#define GPTQ_B 128             // quant/gptq.h's lazy-batch block size (LLMQ_GPTQ_BLOCKSIZE_DEFAULT)
#define QF_ROWS 256            // quant/quantize.c quad_form's rows per product
#define GGUF_CHUNK (4 << 20)   // quant/gguf_export.c CHUNK_FLOATS: f32 elements decoded per step
#define EXPORT_CHUNK (1 << 20) // quant/export.c CHUNK_FLOATS
#define ATTN_RB 64             // calib/model/forward.c RB: query rows per attention task
#define CLIP_ROWS 256          // quant/awq.c CLIP_ROW_CHUNK

static const int seq_groups[4][3] = {{LLMQ_LIN_Q, LLMQ_LIN_K, LLMQ_LIN_V},
                                     {LLMQ_LIN_O, -1, -1},
                                     {LLMQ_LIN_GATE, LLMQ_LIN_UP, -1},
                                     {LLMQ_LIN_DOWN, -1, -1}};

enum { ST_WEIGHTS, ST_CALIB, ST_PASS, ST_XTX, ST_SOLVE, ST_AWQ, ST_ERR, ST_ROUND, ST_OTHER, ST_N };
static const char *const stage_names[ST_N] = {"weights to f32", "calibration pass", "block passes", "XtX",
                                              "GPTQ solve",     "AWQ search",       "layer errors", "round/encode",
                                              "other tensors"};

// ---- the model's shapes ---------------------------------------------------------------------------------

struct shape {
    const struct llmq_model *m;
    const struct llmq_quantize_opts *o;
    int64_t D, F, V, L, Dq, Dkv, N, T, seqlen;
    bool calib, gguf, awq, gptq;      // calibration; GGUF output; AWQ search; GPTQ solve
    json_t *rep;                      // to_gguf: the writer's report (tensors, totals), owned here
    double lin_bytes[LLMQ_LIN_COUNT]; // to_gguf: bytes of each linear of block 0 in the output
    // moe (mixtral, qwen3_moe, qwen2_moe): a block's gate / up / down are its E experts' (w[GATE..DOWN] NULL but
    // where shexp: qwen2_moe's shared expert, a dense MLP of width F, and its (1, D) sigmoid gate)
    bool moe, moe_all, shexp; // moe_all: --moe-calib all (every expert over every token in the statistics passes)
    int64_t E, K, Fe;
    double exp_bytes[3]; // to_gguf: bytes of one expert's gate, up, down in the output (block 0)
};

// A block's linears j: the dense ones (j < LLMQ_LIN_COUNT; NULL where a moe block has none), then expert
// (j - LLMQ_LIN_COUNT) / 3's gate, up, down.
static int n_lin(const struct shape *s) { return LLMQ_LIN_COUNT + (s->moe ? 3 * (int)s->E : 0); }
static const struct llmq_tensor_view *lin_view(const struct shape *s, int64_t l, int j) {
    return j < LLMQ_LIN_COUNT ? s->m->layers[l].w[j] : s->m->layers[l].exps[j - LLMQ_LIN_COUNT];
}
// "blk.L.<stem>.weight" of dense linear k in the GGUF (qwen2_moe's gate / up / down: "ffn_gate_shexp", ...).
static const char *gguf_weight_name(const struct shape *s, long long l, int k, char *buf, size_t size) {
    char stem[80];
    llmq_arch_linear_full_name(s->m->hp.arch, (enum llmq_linear)k, l, false, stem, sizeof(stem));
    snprintf(buf, size, "%s.weight", stem);
    return buf;
}
static double vRC(const struct llmq_tensor_view *v) { return v ? (double)v->shape[0] * (double)v->shape[1] : 0; }
static double RC(const struct shape *s, int64_t l, int k) { return vRC(lin_view(s, l, k)); }
static int64_t rows(const struct shape *s, int64_t l, int k) {
    const struct llmq_tensor_view *v = lin_view(s, l, k);
    return v ? v->shape[0] : 0;
}
static int64_t cols(const struct shape *s, int64_t l, int k) {
    const struct llmq_tensor_view *v = lin_view(s, l, k);
    return v ? v->shape[1] : 0;
}
static double src_bytes(const struct shape *s, int64_t l, int k) {
    const struct llmq_tensor_view *v = lin_view(s, l, k);
    return v ? (double)v->nbytes : 0;
}
static double exp_src_bytes(const struct shape *s, int64_t l, int which) { // every expert's gate / up / down (-1: all)
    double t = 0;
    for (int j = LLMQ_LIN_COUNT; j < n_lin(s); j++)
        if (which < 0 || (j - LLMQ_LIN_COUNT) % 3 == which) t += src_bytes(s, l, j);
    return t;
}
static double es(const struct llmq_tensor_view *v) { // bytes per element of a view
    int64_t n = llmq_tensor_nelements(v);
    return n > 0 ? (double)v->nbytes / (double)n : 0;
}
static bool direct_f32(const struct llmq_tensor_view *v) { // calib/model/forward.c: used in place
    return v->dtype == LLMQ_DTYPE_F32 && ((uintptr_t)v->data % sizeof(float)) == 0;
}
static double block_rc(const struct shape *s, int64_t l) {
    double t = 0;
    for (int k = 0; k < n_lin(s); k++) t += RC(s, l, k);
    return t;
}
static double block_src_bytes(const struct shape *s, int64_t l) {
    double t = 0;
    for (int k = 0; k < n_lin(s); k++) t += src_bytes(s, l, k);
    return t;
}
static double max_rc(const struct shape *s) {
    double mx = 0;
    for (int64_t l = 0; l < s->L; l++)
        for (int k = 0; k < n_lin(s); k++) mx = fmax(mx, RC(s, l, k));
    return mx;
}
// The XᵀX width of slot k's input: D (q/k/v, gate/up), Dq (o), F (down; a moe block without a shared expert: Fe).
static int64_t slot_c(const struct shape *s, int slot) {
    return slot == LLMQ_CALIB_SLOT_O      ? s->Dq
           : slot == LLMQ_CALIB_SLOT_DOWN ? (s->moe && !s->shexp ? s->Fe : s->F)
                                          : s->D;
}
static double xtx_exp(const struct shape *s) { // moe: every expert's two inputs' XᵀX in f64
    return s->moe ? 8.0 * (double)s->E * ((double)s->D * (double)s->D + (double)s->Fe * (double)s->Fe) : 0;
}
// The four block inputs' XᵀX in f64 (moe: the experts' too; no dense down unless qwen2_moe's shared expert).
static double xtx_all(const struct shape *s) {
    double t = 0;
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++)
        if (!s->moe || s->shexp || k != LLMQ_CALIB_SLOT_DOWN) t += 8.0 * (double)slot_c(s, k) * (double)slot_c(s, k);
    return t + xtx_exp(s);
}
static double cmax_slot(const struct shape *s) {
    double mx = 0;
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) mx = fmax(mx, (double)slot_c(s, k));
    return s->moe ? fmax(mx, (double)s->Fe) : mx;
}

// Views other than the block linears: embeddings, head, norms, biases (elements, and bytes in the source).
static void other_tensors(const struct shape *s, double *elems, double *src_bytes) {
    const struct llmq_model *m = s->m;
    const struct llmq_tensor_view *g[] = {m->tok_embd, m->output_norm, m->hp.tied_embeddings ? NULL : m->output};
    *elems = *src_bytes = 0;
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++)
        if (g[i]) *elems += (double)llmq_tensor_nelements(g[i]), *src_bytes += (double)g[i]->nbytes;
    for (int64_t l = 0; l < s->L; l++) {
        const struct llmq_layer *ly = &m->layers[l];
        const struct llmq_tensor_view *v[] = {
            ly->attn_norm, ly->ffn_norm, ly->q_norm, ly->k_norm, ly->attn_post_norm, ly->ffn_post_norm,
            ly->bq,        ly->bk,       ly->bv,     ly->router, ly->shexp_gate};
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
            if (v[i]) *elems += (double)llmq_tensor_nelements(v[i]), *src_bytes += (double)v[i]->nbytes;
    }
}

static int64_t count_tensors(const struct shape *s) {
    int64_t n = 3 + s->L * (LLMQ_LIN_COUNT + 2); // a close count: embeddings, norm, head, the blocks' linears
    for (int64_t l = 0; l < s->L; l++) {         // and norms, plus the optional ones
        const struct llmq_layer *ly = &s->m->layers[l];
        n += !!ly->q_norm + !!ly->k_norm + !!ly->attn_post_norm + !!ly->ffn_post_norm + !!ly->bq + !!ly->bk + !!ly->bv +
             !!ly->router + !!ly->shexp_gate + (s->moe ? 3 * s->E - (s->shexp ? 0 : 3) : 0); // moe: + the experts'
        // linears (instead of the dense three, but for qwen2_moe's shared expert)
    }
    return n;
}

// ---- output size ---------------------------------------------------------------------------------------

// Bytes of the tokenizer / side files an HF input's output copies (or a GGUF input's header: its vocabulary).
static double side_bytes(const struct llmq_model *m) {
    if (m->gguf) return (double)llmq_gguf_data_offset(m->gguf);
    static const char *names[] = {
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
        "merges.txt",     "chat_template.jinja",   "generation_config.json",  "config.json"};
    double t = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char *p = llmq_path_join(m->path, names[i]);
        struct stat sb;
        if (p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) t += (double)sb.st_size;
        free(p);
    }
    return t;
}

// The output bytes of linear (R, C) in a directory format (quant/export.h's layouts).
static double dir_linear_bytes(const struct shape *s, int64_t l, int k, double out_es) {
    const struct llmq_quantize_opts *o = s->o;
    int64_t R = rows(s, l, k), C = cols(s, l, k), b = o->q.bits;
    if (R == 0) return 0; // a moe block's dense gate / up / down
    int64_t ng = llmq_qconfig_n_groups(&o->q, C);
    const struct llmq_layer *ly = &s->m->layers[l];
    const struct llmq_tensor_view *bias = k >= LLMQ_LIN_COUNT ? NULL
                                          : k == LLMQ_LIN_Q   ? ly->bq
                                          : k == LLMQ_LIN_K   ? ly->bk
                                          : k == LLMQ_LIN_V   ? ly->bv
                                                              : NULL;
    double bb = bias ? (double)R * (o->out.format == LLMQ_EXPORT_FAKE ? out_es : 2.0) : 0;
    switch (o->out.format) {
    case LLMQ_EXPORT_AWQ:
        return (double)C * (double)(R / 8) * 4 + (double)ng * (double)(R / 8) * 4 + (double)ng * R * 2 + bb;
    case LLMQ_EXPORT_GPTQ:
        return (double)(C * b / 32) * (double)R * 4 + (double)ng * (double)(R * b / 32) * 4 + (double)ng * R * 2 +
               (double)C * 4 + bb;
    case LLMQ_EXPORT_FAKE: return (double)R * (double)C * out_es + bb;
    }
    return 0;
}

// The fake format's dtype size (quant/export.c llmq_export_begin): the fake dtype, else the input's linear
// dtype when it is F16 / BF16, else F32.
static double fake_es(const struct shape *s) {
    enum llmq_dtype d = s->o->out.fake_dtype != LLMQ_DTYPE_COUNT ? s->o->out.fake_dtype : s->m->layers[0].w[0]->dtype;
    return d == LLMQ_DTYPE_F16 || d == LLMQ_DTYPE_BF16 ? 2.0 : 4.0;
}

static void dir_output(const struct shape *s, struct llmq_plan *p) {
    double out_es = s->o->out.format == LLMQ_EXPORT_FAKE ? fake_es(s) : 2.0, lin = 0, oe, ob;
    for (int64_t l = 0; l < s->L; l++)
        for (int k = 0; k < n_lin(s); k++) lin += dir_linear_bytes(s, l, k, out_es);
    other_tensors(s, &oe, &ob);
    int64_t nt = count_tensors(s) + s->L * n_lin(s) * 3; // awq / gptq: up to four parts per linear
    p->linear_out_bytes = (uint64_t)lin;
    p->output_bytes = (uint64_t)(lin + oe * out_es + (double)nt * 96.0 + 4096.0 + side_bytes(s->m));
}

// The writer's plan of the GGUF output without writing anything: a dry begin + finish with the mix's types
// (the choice modes read every weight at begin; see quant/plan.h "Output size"), its lines silenced.
static enum llmq_status gguf_dry_report(const struct shape *s, json_t **rep) {
    const struct llmq_quantize_opts *o = s->o;
    struct llmq_gguf_export_opts go = o->gguf;
    struct llmq_gguf_export *e = NULL;
    go.dry_run = true;
    go.progress = false;
    go.imatrix = go.choice_imatrix = NULL;
    go.choose.mode = LLMQ_GGUF_CHOICE_MIX;
    go.provenance = NULL;
    go.report = rep;
    // the real run's mix: with importance whenever it has any (quant/quantize.c run_writer / begin_writer)
    go.mix.have_imatrix = o->imatrix_path || o->method != LLMQ_QMETHOD_RTN || o->calib.n_sources > 0;
    if (go.n_threads < 1) go.n_threads = o->n_threads > 0 ? o->n_threads : 1;
    enum llmq_log_level lv = llmq_log_get_level();
    llmq_log_set_level(LLMQ_LOG_SILENT); // a refusal is the real begin's to report
    enum llmq_status st = llmq_gguf_export_begin(s->m, o->out_dir ? o->out_dir : "plan.gguf", &go, &e);
    if (!st) st = llmq_gguf_export_finish(e);
    llmq_log_set_level(lv);
    return st;
}

// The GGUF header's size: a GGUF input's own; for an HF input its vocabulary as tokenizer.ggml.* arrays (each
// string 8 + its bytes, a type and a score per token, the merges, "[PAD<id>]" fillers up to n_vocab rows) plus
// 4 KiB of other keys (the tensor infos are added by the caller).
static double gguf_header_bytes(const struct llmq_model *m) {
    if (m->gguf) return (double)llmq_gguf_data_offset(m->gguf);
    double t = 4096.0;
    int32_t n = m->tok ? llmq_tokenizer_n_vocab(m->tok) : 0;
    for (int32_t i = 0; i < n; i++) {
        size_t len = 0;
        (void)llmq_tokenizer_token_text(m->tok, i, &len);
        t += 16.0 + (double)len;
    }
    for (int64_t i = 0; m->tok && i < llmq_tokenizer_n_merges(m->tok); i++) {
        size_t len = 0;
        (void)llmq_tokenizer_merge(m->tok, i, &len);
        t += 8.0 + (double)len;
    }
    for (int64_t id = n; id < m->hp.n_vocab; id++) t += 16.0 + 5.0 + floor(log10((double)id + 1.0)) + 1.0;
    return t;
}

static void gguf_output(struct shape *s, struct llmq_plan *p, bool own_report) {
    json_t *ts = json_object_get(s->rep, "tensors"), *t;
    size_t i;
    double tensor_bytes = 0, lin = 0;
    json_array_foreach(ts, i, t) {
        double b = (double)json_integer_value(json_object_get(t, "bytes"));
        const char *name = json_string_value(json_object_get(t, "name"));
        tensor_bytes += b;
        for (int k = 0; name && k < LLMQ_LIN_COUNT; k++) {
            char want[96];
            long long l = -1;
            if (sscanf(name, "blk.%lld.", &l) != 1) break;
            if (strcmp(name, gguf_weight_name(s, l, k, want, sizeof(want)))) continue;
            lin += b;
            if (l == 0) s->lin_bytes[k] = b;
        }
        for (int k = 0; name && s->moe && k < 3; k++) { // the stacked experts
            char want[96];
            long long l = -1;
            if (sscanf(name, "blk.%lld.", &l) != 1) break;
            snprintf(want, sizeof(want), "blk.%lld.ffn_%s_exps.weight", l,
                     llmq_linear_name((enum llmq_linear)(LLMQ_LIN_GATE + k)));
            if (strcmp(name, want)) continue;
            lin += b;
            if (l == 0) s->exp_bytes[k] = b / (double)s->E;
        }
    }
    const struct llmq_gguf_export_opts *g = &s->o->gguf;
    if (own_report && g->choose.mode == LLMQ_GGUF_CHOICE_TARGET) { // the budget replaces the mix's sizes
        double params = (double)json_integer_value(json_object_get(json_object_get(s->rep, "totals"), "params"));
        double budget = g->choose.target_bytes ? (double)g->choose.target_bytes : floor(g->target_bpw * params / 8.0);
        lin += budget - tensor_bytes;
        tensor_bytes = budget;
    }
    double hdr = gguf_header_bytes(s->m) + (double)json_array_size(ts) * 96.0;
    p->linear_out_bytes = (uint64_t)fmax(lin, 0);
    p->output_bytes = (uint64_t)(tensor_bytes + hdr);
}

// ---- peak RAM: the phases ---------------------------------------------------------------------------------

struct mem {
    const struct shape *s;
    double base_anon, base_file;
    double x;           // the block inputs and their copy (2 x 4ND), or calib's activations
    double fwd;         // the micro-batch forward (weight scratch + activations)
    double fwd_scratch; // of that, the weight scratch (released after each pass of gptq's block)
    double acts;        // of that and of fbig: what common/spill.h holds (under --max-memory)
    double fbig;        // AWQ: the N-token forward's activations
    double writer;      // the writer's work buffers
    double peak, anon_max, anon_at, file_at;
    char phase[64];
};

static void phase(struct mem *mm, double anon, double file, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void phase(struct mem *mm, double anon, double file, const char *fmt, ...) {
    anon += mm->base_anon;
    file += mm->base_file;
    mm->anon_max = fmax(mm->anon_max, anon);
    if (anon + file <= mm->peak) return;
    mm->peak = anon + file;
    mm->anon_at = anon;
    mm->file_at = file;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mm->phase, sizeof(mm->phase), fmt, ap);
    va_end(ap);
}

// The forward object for T tokens (calib/model/forward.c llmq_forward_init): the weight scratch as far as
// the block passes touch it (the largest linear not usable in place), the per-token activations, the norms.
static double weight_scratch_bytes(const struct shape *s) {
    double wn = 0;
    for (int64_t l = 0; l < s->L; l++)
        for (int k = 0; k < n_lin(s); k++)
            if (lin_view(s, l, k) && !direct_f32(lin_view(s, l, k))) wn = fmax(wn, RC(s, l, k));
    return 4.0 * wn;
}
// moe: the mixture's scratch (calib/model/moe.h: logits, choices, one expert's activations) and the expert
// source's (Fe, D) weight (quant/quantize.c's gptq results, quant/awq.c's candidates: decoded per product).
static double moe_forward_bytes(const struct shape *s, int64_t T) {
    if (!s->moe) return 0;
    return 4.0 * (double)T * (double)(s->E + 2 * s->K + 2 + 2 * s->D + 2 * s->Fe + s->shexp) +
           4.0 * (double)(s->Fe * s->D);
}
static double forward_bytes(const struct shape *s, int64_t T, bool scratch, double *acts) {
    const int64_t F = s->moe && !s->shexp ? 0 : s->F; // a moe forward touches no dense MLP buffer but the shared's
    double a = 4.0 * (double)T * (double)(2 * s->D + 2 * s->Dq + 2 * s->Dkv + 2 * F);
    *acts += a;
    int nt = s->o->n_threads > 0 ? s->o->n_threads : 1;
    return (scratch ? weight_scratch_bytes(s) : 0) + a + 4.0 * (double)((2 * s->L + 1) * s->D) +
           4.0 * nt * ATTN_RB * (double)s->seqlen + moe_forward_bytes(s, T);
}

// Linear k's bytes in the GGUF output (block 0's; its f32 element count when the report has none).
static double gguf_lin_bytes(const struct shape *s, int64_t l, int k) {
    double b = k < LLMQ_LIN_COUNT ? s->lin_bytes[k] : s->exp_bytes[(k - LLMQ_LIN_COUNT) % 3];
    return b > 0 ? b : RC(s, l, k);
}

// One linear's solver and hand-over buffers beyond W / Q / T / H / Hx.
static double solve_bytes(const struct shape *s, int64_t l, int k) {
    int64_t R = rows(s, l, k), C = cols(s, l, k);
    if (s->gguf) { // quant/gptq_gguf.c: its C x C retry backup, Err1, the encoded rows (r->blk) and their copy
        double blk = gguf_lin_bytes(s, l, k);
        return (s->gptq ? 4.0 * (double)C * C + 4.0 * R * GPTQ_B + 8.0 * R : 0) + 2.0 * blk + 8.0 * C;
    }
    int64_t ng = llmq_qconfig_n_groups(&s->o->q, C);
    double codes = (double)R * C + 8.0 * (double)R * ng + 4.0 * C; // struct llmq_qlinear
    double gptq = s->gptq ? 4.0 * R * GPTQ_B + 8.0 * (double)R * ((C + GPTQ_B - 1) / GPTQ_B) + 40.0 * C : 0;
    double out_es = s->o->out.format == LLMQ_EXPORT_FAKE ? fake_es(s) : 2.0;
    double pack = dir_linear_bytes(s, l, k, out_es) + (s->o->out.format == LLMQ_EXPORT_FAKE ? 4.0 * RC(s, l, k) : 0);
    return codes + gptq + pack;
}

// The f32 scratch of the XᵀX products for an input of C columns (kernels/gemm.h llmq_gram_acc_f64).
static double gram_bytes(int64_t C) { return 4.0 * (double)llmq_gram_scratch_rows(C) * (double)C; }

// quant/quantize.c quad_form's product scratch T for a linear of R rows: (min(R, QF_ROWS), C); on CUDA (R, C).
static double t_bytes(const struct shape *s, int64_t l, int k) {
    int64_t R = rows(s, l, k), n = s->o->backend == LLMQ_BACKEND_CUDA || R < QF_ROWS ? R : QF_ROWS; // CUDA: all R
    return 4.0 * (double)n * (double)cols(s, l, k);
}

// A quantized linear as block_gptq holds it between passes (quant/quantize.c hold_result): its encoded rows, or
// its codes (a byte per weight), grid and g_idx.
static double held_bytes(const struct shape *s, int64_t l, int k) {
    if (s->gguf) return gguf_lin_bytes(s, l, k);
    int64_t R = rows(s, l, k), C = cols(s, l, k), ng = llmq_qconfig_n_groups(&s->o->q, C);
    return RC(s, l, k) + 8.0 * (double)R * (double)ng + 4.0 * (double)C;
}

// GPTQ's experts of moe block l after its attention (quant/quantize.c moe_group), group by group (every expert's
// gate and up, then every down): the pass gathering the group's XᵀX of all E experts (8C² f64 each: every expert
// that a token reaches, all of them under --moe-calib all), then the experts' solves (the first one with all the
// sums still held; each expert's sums are dropped and its mapped pages released once it is done, its result held:
// a quarter of its f32 or less, decoded per product into the forward's expert scratch); qwen2_moe: the pass gathers
// the shared expert's dense slot too, whose linears are solved after the experts (quant/quantize.c gptq_group) and
// held as a dense block's. P0: what the block holds besides (*wq32: the decoded dense results, grown here), xtx: the
// sums gathered before (no true-sequential: all of them, the experts' included), *wq: the held results, grown here.
static void phases_gptq_experts(struct mem *mm, int64_t l, double P0, double *wq32, double xtx, double *wq) {
    const struct shape *s = mm->s;
    const bool ts = s->o->true_sequential, gptq = s->o->method == LLMQ_QMETHOD_GPTQ;
    for (int g = 0; g < 2; g++) {
        const double C = (double)(g ? s->Fe : s->D), sums = 8.0 * (double)s->E * C * C;
        const double Cd = (double)(g ? s->F : s->D), dsums = s->shexp ? 8.0 * Cd * Cd : 0; // the shared expert's
        double file = g ? exp_src_bytes(s, l, 2) : exp_src_bytes(s, l, -1);
        for (int k = g ? LLMQ_LIN_DOWN : LLMQ_LIN_GATE; s->shexp && k <= LLMQ_LIN_DOWN; k++) file += src_bytes(s, l, k);
        double left = ts ? sums + dsums : xtx - (g ? 8.0 * (double)s->D * (double)s->D * (double)(s->E + s->shexp) : 0);
        const int j0 = LLMQ_LIN_COUNT + (g ? 2 : 0); // expert 0's gate, or its down
        const double P = P0 + *wq32;
        if (ts)
            phase(mm, P + *wq + mm->fwd_scratch + sums + dsums + gram_bytes((int64_t)fmax(C, s->shexp ? Cd : 0)), file,
                  "blk.%lld experts' %s: XtX pass", (long long)l, g ? "ffn_down" : "ffn_gate/up");
        const double rc = RC(s, l, j0);
        phase(mm, P + *wq + left + 8.0 * C * C + 8.0 * rc + t_bytes(s, l, j0) + solve_bytes(s, l, j0), file,
              "blk.%lld experts' %s: GPTQ solve", (long long)l, g ? "ffn_down" : "ffn_gate/up");
        for (int j = LLMQ_LIN_COUNT; j < n_lin(s); j++)
            if ((((j - LLMQ_LIN_COUNT) % 3 == 2) == (g == 1)) && gptq) *wq += held_bytes(s, l, j);
        left -= sums; // every expert's dropped
        for (int j = 0; s->shexp && j < 3 && seq_groups[g + 2][j] >= 0; j++) {
            const int k = seq_groups[g + 2][j];
            phase(mm,
                  P0 + *wq32 + *wq + left + 8.0 * Cd * Cd + 8.0 * RC(s, l, k) + t_bytes(s, l, k) + solve_bytes(s, l, k),
                  0.0, "blk.%lld %s: GPTQ solve", (long long)l, llmq_linear_gguf_name(k));
            if (gptq) *wq += held_bytes(s, l, k), *wq32 += 4.0 * RC(s, l, k);
        }
    }
}

// GPTQ's true-sequential block l (quant/quantize.c block_gptq), phase by phase. The block's quantized linears
// count as held between the passes (wq) and in f32 as well in each pass (wq32, decoded for it), the forward's
// weight scratch only in the passes (released after each), the f64 sums of an input's last linear are released
// while its Hessian is taken (calib/calib.h llmq_calib_hessian_take).
static void phases_gptq(struct mem *mm, int64_t l) {
    const struct shape *s = mm->s;
    const struct llmq_layer *ly = &s->m->layers[l];
    double wq = 0, wq32 = 0, P0 = mm->x + mm->fwd - mm->fwd_scratch + mm->writer;
    bool ts = s->o->true_sequential;
    double xtx_left = ts ? 0 : xtx_all(s);
    if (!ts)
        phase(mm, P0 + mm->fwd_scratch + xtx_left + gram_bytes(cmax_slot(s)), block_src_bytes(s, l),
              "blk.%lld: statistics pass", (long long)l);
    for (int g = 0; g < (s->moe ? 2 : 4); g++) { // moe: the experts after attention (phases_gptq_experts)
        int64_t C = cols(s, l, seq_groups[g][0]);
        double C2 = (double)C * (double)C, file = 0;
        if (ts) {
            for (int k = 0; k < LLMQ_LIN_COUNT && (g == 1 || g == 3); k++) // the pass runs these unquantized
                if (k >= seq_groups[g][0]) file += src_bytes(s, l, k);
            if (g == 1) file += exp_src_bytes(s, l, -1);
            phase(mm, P0 + wq + wq32 + mm->fwd_scratch + 8.0 * C2 + gram_bytes(C), file, "blk.%lld %s: XtX pass",
                  (long long)l, llmq_linear_gguf_name(seq_groups[g][0]));
            xtx_left = 8.0 * C2;
        }
        double rc_max = 0, prev = 0;
        for (int j = 0; j < 3 && seq_groups[g][j] >= 0; j++) {
            int k = seq_groups[g][j];
            bool last = j == 2 || seq_groups[g][j + 1] < 0;
            rc_max = fmax(rc_max, RC(s, l, k));
            double P = P0 + wq, h = ts && last ? 0 : 4.0 * C2; // take: H replaces the sums' pages as it fills
            phase(mm, P + xtx_left + h + prev + 4.0 * rc_max, (double)ly->w[k]->nbytes, "blk.%lld %s: Hessian",
                  (long long)l, llmq_linear_gguf_name(k));
            if (last) xtx_left -= 8.0 * C2; // dropped once its last Hessian is taken
            phase(mm, P + xtx_left + 8.0 * C2 + 8.0 * rc_max + t_bytes(s, l, k) + solve_bytes(s, l, k), 0.0,
                  "blk.%lld %s: GPTQ solve", (long long)l, llmq_linear_gguf_name(k)); // its pages released
            prev = 4.0 * C2 + 4.0 * rc_max + t_bytes(s, l, k); // Hx, Q, T held into the group's next linear
            if (s->o->method == LLMQ_QMETHOD_GPTQ) wq += held_bytes(s, l, k), wq32 += 4.0 * RC(s, l, k);
        }
    }
    (void)ly;
    if (s->moe) phases_gptq_experts(mm, l, P0, &wq32, xtx_left, &wq);
    phase(mm, P0 + wq + wq32 + mm->fwd_scratch, 0.0, "blk.%lld: output pass", (long long)l);
}

// AWQ's search buffers for block l (quant/awq.c llmq_awq_search, search_group, search_clip).
static double awq_search_bytes(const struct shape *s, int64_t l) {
    struct llmq_awq_opts ao;
    llmq_awq_opts_default(&ao);
    const int64_t N = s->N, D = s->D, F = s->F, Dq = s->Dq;
    double mrc = 0, gram = 0;
    for (int k = 0; k < LLMQ_LIN_COUNT; k++) mrc = fmax(mrc, RC(s, l, k));
    const int64_t gC[4] = {D, Dq, D, F}, gR[4] = {rows(s, l, LLMQ_LIN_Q), D, F, D};
    for (int g = 0; g < 4; g++) { // the Gram form where quant/awq.c use_gram takes it
        double C = (double)gC[g], R = (double)gR[g];
        if (C * C * (double)N / 2.0 + ao.n_grid * R * C * C < 0.5 * ao.n_grid * (double)N * R * C)
            gram = fmax(gram, 16.0 * C * C + 8.0 * R * C);
    }
    int64_t step = N / ao.n_sample_token > 1 ? N / ao.n_sample_token : 1, T = (N + step - 1) / step;
    double K1 = ao.max_shrink * ao.clip_n_grid + 1, G = 128;             // a group's candidates (G: a typical group)
    const int64_t Fw = s->moe ? (s->shexp && F > s->Fe ? F : s->Fe) : F; // moe: the experts' down input (and the
                                                                         // shared expert's)
    double clip =
        8.0 * T * G + 8.0 * CLIP_ROWS * K1 * G + 8.0 * T * CLIP_ROWS * K1 + 4.0 * T * (double)(Fw > D ? Fw : D);
    if (!s->moe) return 4.0 * (double)N * (double)(6 * D + Dq + F) + 16.0 * mrc + gram + clip;
    // quant/awq.c moe_search: three (Fe, D) expert weights (the model's in f32, the quantizer's scratch, the clip
    // search's scaled copy), the down search's candidate and scratch and its routed rows' two outputs (n_x, D) (n_x
    // taken as 4 N K / E), the sampled inputs (T, D + Fe), the clip tables
    // (qwen2_moe: the shared expert's down input (N, F) is touched, and its gate / up candidates (2, F, D) with the
    // quantizer's scratch widened to (max(Fe, F), D) join the gate / up search)
    double ex = (double)s->Fe * (double)D, nx = fmin((double)N, 4.0 * (double)N * (double)s->K / (double)s->E);
    double shx = s->shexp ? 4.0 * (double)N * (double)F + 4.0 * (2.0 * F + fmax(0.0, (double)(F - s->Fe))) * D : 0;
    return 4.0 * (double)N * (double)(6 * D + Dq) + 16.0 * mrc + clip + 4.0 * 5.0 * ex + 8.0 * nx * (double)D +
           4.0 * T * (double)(D + s->Fe) + 4.0 * 3.0 * (double)s->E * ex / G + shx;
}

// AWQ / AWQ+GPTQ block l (quant/quantize.c block_awq): the fp pass, the search, the linears.
// moe: the block copy holds the attention linears and the router, not the experts (made per use); the experts'
// linears come first (quant/quantize.c block_awq), each with the original weights' rounding for rtn_orig_err (W0).
static void phases_awq(struct mem *mm, int64_t l) {
    const struct shape *s = mm->s;
    double P = mm->x + mm->fwd + mm->fbig + mm->writer, xtx = xtx_all(s), bw = 4.0 * block_rc(s, l);
    double file = block_src_bytes(s, l), cm = cmax_slot(s);
    if (s->moe) // (qwen2_moe: the shared expert's linears and its gate copied too)
        bw = 4.0 *
             (block_rc(s, l) - (double)s->E * 3.0 * (double)s->Fe * (double)s->D + (double)((s->E + s->shexp) * s->D));
    phase(mm, P + xtx + gram_bytes(cm), file, "blk.%lld: fp pass and XtX", (long long)l);
    phase(mm, P + xtx + bw + awq_search_bytes(s, l), file, "blk.%lld: AWQ search", (long long)l);
    double rc_max = 0, t_max = 0;
    for (int k = s->moe ? LLMQ_LIN_COUNT : 0, n = 0; n < n_lin(s); n++, k = (k + 1) % n_lin(s)) {
        if (!lin_view(s, l, k)) continue;
        double C = (double)cols(s, l, k);
        rc_max = fmax(rc_max, RC(s, l, k));
        t_max = fmax(t_max, t_bytes(s, l, k));
        if (k > LLMQ_LIN_COUNT + 2 && k < n_lin(s) - 1) continue; // the other experts: as the first one
        phase(mm, P + xtx + bw + 8.0 * C * C + (s->moe ? 12.0 : 8.0) * rc_max + t_max + solve_bytes(s, l, k), file,
              "blk.%lld %s: %s", (long long)l, k < LLMQ_LIN_COUNT ? llmq_linear_gguf_name(k) : "experts",
              s->gptq ? "GPTQ solve" : "rounding");
    }
}

// RTN into a directory (quant/quantize.c block_rtn): with --calib the fp pass's four XᵀX and each linear's
// H, without it W, Q and the codes of one linear.
static void phases_rtn_dir(struct mem *mm, int64_t l) {
    const struct shape *s = mm->s;
    double P = mm->x + mm->fwd + mm->writer, xtx = s->calib ? xtx_all(s) : 0, cm = cmax_slot(s);
    if (s->calib) phase(mm, P + xtx + gram_bytes(cm), block_src_bytes(s, l), "blk.%lld: fp pass", (long long)l);
    double rc_max = 0, t_max = 0;
    for (int k = 0; k < n_lin(s); k++) {
        if (!lin_view(s, l, k)) continue;
        double C = (double)cols(s, l, k);
        rc_max = fmax(rc_max, RC(s, l, k));
        t_max = fmax(t_max, t_bytes(s, l, k));
        double err = s->calib ? 4.0 * C * C + 8.0 * rc_max + t_max : 8.0 * rc_max;
        if (k > LLMQ_LIN_COUNT + 2 && k < n_lin(s) - 1) continue; // the other experts: as the first one
        phase(mm, P + xtx + err + solve_bytes(s, l, k), src_bytes(s, l, k), "blk.%lld %s: rounding", (long long)l,
              k < LLMQ_LIN_COUNT ? llmq_linear_gguf_name(k) : "experts");
    }
}

// The writer alone (rtn into GGUF): the importance pass with --calib, then one chunk at a time.
static void phases_writer(struct mem *mm) {
    const struct shape *s = mm->s;
    double worst_src = 0;
    for (int64_t l = 0; l < s->L; l++)
        for (int k = 0; k < n_lin(s); k++)
            if (lin_view(s, l, k)) worst_src = fmax(worst_src, es(lin_view(s, l, k)));
    worst_src = fmax(worst_src, es(s->m->tok_embd));
    if (mm->x > 0) // calib/calib.c llmq_calib_run: activations at the block boundary, the forward, the sums
        phase(mm, mm->x + mm->fwd + 32.0 * cmax_slot(s) * LLMQ_CALIB_N_SLOTS * s->L, block_src_bytes(s, 0),
              "calibration pass");
    phase(mm, mm->writer, mm->writer / 6.0 * worst_src, "writing (one chunk of rows)");
}

// calib/blocks.h: the bytes where the blocks compute when the run takes the block path (--device cuda, its method
// and family), else -1: the activations resident, or streamed when they exceed --max-vram (without it the device's
// free memory, which the run checks, is not known here).
static int64_t block_path(const struct shape *s) {
    if (s->o->backend != LLMQ_BACKEND_CUDA || !s->calib || s->seqlen < 1) return -1;
    const struct llmq_blocks_opts bo = llmq_quantize_block_opts(s->o);
    if (bo.refusal && bo.refusal[0]) return -1;
    const int64_t n_seq = s->N / s->seqlen, res = llmq_blocks_bytes(s->m, &bo, n_seq, s->seqlen, false);
    return bo.max_vram && res > (int64_t)bo.max_vram ? llmq_blocks_bytes(s->m, &bo, n_seq, s->seqlen, true) : res;
}

static void plan_memory(struct shape *s, struct llmq_plan *p) {
    struct mem mm = {.s = s};
    char line[256];
    FILE *st = fopen("/proc/self/status", "r");
    while (st && fgets(line, sizeof(line), st)) { // what the process holds now: the model's headers, the tokenizer
        long long kb;
        if (sscanf(line, "RssAnon: %lld kB", &kb) == 1) mm.base_anon = 1024.0 * kb;
        if (sscanf(line, "RssFile: %lld kB", &kb) == 1) mm.base_file = 1024.0 * kb;
    }
    if (st) fclose(st);
    const struct llmq_quantize_opts *o = s->o;
    bool writer_only = s->gguf && o->method == LLMQ_QMETHOD_RTN;
    if (s->calib && !writer_only) {
        mm.x = (block_path(s) >= 0 ? 1.0 : 2.0) * 4.0 * (double)s->N * (double)s->D; // the block path: no host copy
        if (o->gptaq) { // quant/quantize.h "gptaq": x_fp, one block's fp linear inputs, the ΔXᵀX̃ sums and D
            double sc = 0, cm = cmax_slot(s);
            for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) sc += (double)slot_c(s, k);
            mm.x += 4.0 * (double)s->N * ((double)s->D + sc) + xtx_all(s) +
                    4.0 * (LLMQ_GRAM_MICRO_BATCH * cm + 2 * cm * cm);
        }
        mm.acts = mm.x;
        mm.fwd = forward_bytes(s, s->T, true, &mm.acts);
        mm.fwd_scratch = weight_scratch_bytes(s);
        if (s->awq) mm.fbig = forward_bytes(s, s->N, false, &mm.acts) - 4.0 * (double)((2 * s->L + 1) * s->D);
    } else if (s->calib && writer_only && !o->imatrix_path) { // rtn --calib: the importance pass
        mm.x = 4.0 * (double)s->N * (double)s->D;
        mm.acts = mm.x;
        mm.fwd = forward_bytes(s, s->T, true, &mm.acts);
    }
    // the writer's chunk buffers, as far as its largest tensor fills them: f32 rows and their encoding (gguf),
    // the f32 rows and their conversion (directories)
    double maxel = fmax(max_rc(s), (double)llmq_tensor_nelements(s->m->tok_embd));
    if (s->m->output) maxel = fmax(maxel, (double)llmq_tensor_nelements(s->m->output));
    mm.writer = s->gguf ? 4.0 * fmin(fmax(GGUF_CHUNK, (double)(s->D > s->F ? s->D : s->F)), maxel) * 1.5
                        : 8.0 * fmin(EXPORT_CHUNK, maxel);
    p->base_anon_bytes = (uint64_t)mm.base_anon;
    p->base_file_bytes = (uint64_t)mm.base_file;
    double mrc = max_rc(s), msrc = 0; // the finiteness check: one linear in f32 and its mapped pages
    for (int64_t l = 0; l < s->L; l++)
        for (int k = 0; k < n_lin(s); k++) msrc = fmax(msrc, src_bytes(s, l, k));
    phase(&mm, 4.0 * mrc, msrc, "the finiteness check");
    if (writer_only)
        phases_writer(&mm);
    else
        for (int64_t l = 0; l < s->L; l++) {
            if (o->method == LLMQ_QMETHOD_GPTQ)
                phases_gptq(&mm, l);
            else if (s->awq)
                phases_awq(&mm, l);
            else
                phases_rtn_dir(&mm, l);
        }
    double budget = (double)llmq_spill_budget(), spill = budget > 0 && mm.acts > budget ? mm.acts - budget : 0;
    p->spill_bytes = (uint64_t)spill;
    // spilled activations are file pages of the spill file instead of anonymous memory
    p->ram_anon_bytes = (uint64_t)fmax(mm.anon_at - spill, 0);
    p->ram_file_bytes = (uint64_t)(mm.file_at + spill);
    p->ram_peak_bytes = (uint64_t)mm.peak;
    p->ram_anon_max_bytes = (uint64_t)fmax(mm.anon_max - spill, 0);
    snprintf(p->ram_phase, sizeof(p->ram_phase), "%s", mm.phase);
}

// ---- VRAM ----------------------------------------------------------------------------------------------

struct dev {
    double buf[3]; // kernels/gemm_cuda.cu's A, B, C buffers (bytes, grown to the largest)
    double solve;  // the largest GPTQ solve on the device
};

static void dev_gemm(struct dev *d, double M, double N, double K, double a, double b, double c, double elt) {
    if (M * N * K < (double)LLMQ_GEMM_CUDA_MIN_WORK) return; // stays on the CPU
    const double v[3] = {a, b, c};
    for (int i = 0; i < 3; i++) d->buf[i] = fmax(d->buf[i], ceil(v[i] * elt / MIB) * MIB);
}

static void plan_vram(const struct shape *s, struct llmq_plan *p) {
    struct dev d = {{0}, 0};
    struct llmq_awq_opts ao;
    llmq_awq_opts_default(&ao);
    for (int64_t l = 0; l < s->L && s->calib; l++)
        for (int k = 0; k < n_lin(s); k++) {
            if (!lin_view(s, l, k)) continue;
            double R = (double)rows(s, l, k), C = (double)cols(s, l, k), T = (double)s->T, N = (double)s->N;
            dev_gemm(&d, T, R, C, T * C, R * C, T * R, 4);                    // the forward's products
            double K = N < LLMQ_GRAM_MICRO_BATCH ? N : LLMQ_GRAM_MICRO_BATCH; // the XᵀX syrk
            dev_gemm(&d, C, C, K, K * C, 0, C * C, 4);
            dev_gemm(&d, R, C, C, R * C, C * C, R * C, 4); // the layer error's quadratic forms
            if (s->awq) {
                dev_gemm(&d, N, R, C, N * C, R * C, N * R, 4); // the scale search's candidates
                double Tc = fmin(N, 2.0 * ao.n_sample_token), M = CLIP_ROWS * (ao.max_shrink * ao.clip_n_grid + 1);
                dev_gemm(&d, Tc, M, 128, Tc * 128, M * 128, Tc * M, 8); // the clip search (f64)
            }
            if (s->gptq && !s->gguf && s->o->gptq_grid == LLMQ_GPTQ_GRID_MINMAX) { // kernels/gptq_cuda.cu
                double ng = (double)llmq_qconfig_n_groups(&s->o->q, (int64_t)C);
                d.solve = fmax(d.solve, 4.0 * R * C + 4.0 * C * C + 4.0 * R * GPTQ_B + 8.0 * R * ng + R * C + 8.0 * C +
                                            8.0 * R * ceil(C / GPTQ_B));
            }
        }
    const int64_t blocks = block_path(s); // the resident activations and the block with its sums
    p->vram_bytes = (uint64_t)(d.buf[0] + d.buf[1] + d.buf[2] + d.solve + (blocks > 0 ? (double)blocks : 0));
}

// ---- disk ----------------------------------------------------------------------------------------------

static void dir_of(const char *path, char *buf, size_t n) {
    if (!path) {
        snprintf(buf, n, ".");
        return;
    }
    char *tmp = strdup(path);
    snprintf(buf, n, "%s", tmp ? dirname(tmp) : ".");
    free(tmp);
}

static void plan_disk(const struct shape *s, struct llmq_plan *p, bool checkpoint) {
    p->out = s->o->out_dir;
    dir_of(p->out, p->out_dir, sizeof(p->out_dir));
    snprintf(p->spill_dir, sizeof(p->spill_dir), "%s", llmq_spill_dir());
    snprintf(p->checkpoint_dir, sizeof(p->checkpoint_dir), "%s.partial", p->out ? p->out : "OUT");
    p->checkpoint = checkpoint;
    // every finished block's outputs (a moe block's experts among them: linear_out_bytes counts the stacked or
    // per-expert linears), plus the next block's input (N x D f32; quant/checkpoint.h), plus its state;
    // the writer-only run (rtn into GGUF): its state only, the partial output in it is the output's own file (counted
    // as the output: it is renamed onto it)
    if (s->o->to_gguf && s->o->method == LLMQ_QMETHOD_RTN)
        p->checkpoint_bytes = 65536;
    else
        p->checkpoint_bytes = p->linear_out_bytes + (uint64_t)(s->calib ? 4.0 * s->N * s->D : 0) + 65536;
}

// ---- rates and time -------------------------------------------------------------------------------------

static uint64_t rng_state = 88172645463325252ull;
static float rnd(void) { // xorshift64: [-1, 1)
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 4503599627370496.0 - 1.0);
}

static double median3(double a, double b, double c) { return fmax(fmin(a, b), fmin(fmax(a, b), c)); }

// FLOP/s of an n x n x n GEMM (f32 or f64) on the CPU backend: the median of three.
static double gemm_rate(int64_t n, bool f64) {
    size_t es_ = f64 ? 8 : 4;
    void *A = malloc((size_t)(n * n) * es_), *B = malloc((size_t)(n * n) * es_), *C = malloc((size_t)(n * n) * es_);
    double t[3] = {0, 0, 0};
    if (A && B && C) {
        for (int64_t i = 0; i < n * n; i++) {
            if (f64)
                ((double *)A)[i] = rnd(), ((double *)B)[i] = rnd();
            else
                ((float *)A)[i] = rnd(), ((float *)B)[i] = rnd();
        }
        for (int r = 0; r < 4; r++) { // the first call warms the threads and caches up: not counted
            double t0 = llmq_now_s();
            if (f64)
                (void)llmq_gemm_f64(LLMQ_BACKEND_CPU, false, false, n, n, n, 1.0, A, n, B, n, 0.0, C, n);
            else
                (void)llmq_gemm_f32(LLMQ_BACKEND_CPU, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
            if (r) t[r - 1] = llmq_now_s() - t0;
        }
    }
    free(A), free(B), free(C);
    double m = median3(t[0], t[1], t[2]);
    return m > 0 ? 2.0 * (double)n * n * n / m : 0;
}

static void measure_rates(const struct shape *s, struct llmq_plan_rates *r) {
    double t0 = llmq_now_s();
    openblas_set_num_threads(s->o->n_threads > 0 ? s->o->n_threads : 1);
    r->sgemm_flops = gemm_rate(768, false);
    r->dgemm_flops = gemm_rate(384, true);
    // the conversion of the model's own largest linear of its middle block (rows from its middle)
    int64_t l = s->L / 2, kb = 0;
    for (int k = 1; k < LLMQ_LIN_COUNT; k++) kb = RC(s, l, k) > RC(s, l, kb) ? k : kb;
    const struct llmq_tensor_view *v = s->m->layers[l].w[kb];
    int64_t C = v->shape[1], n = (2 << 20) / C > 0 ? (2 << 20) / C : 1;
    n = n < v->shape[0] ? n : v->shape[0];
    float *buf = malloc((size_t)(n * C) * sizeof(float) > (32u << 20) ? (size_t)(n * C) * sizeof(float) : 32u << 20);
    float *buf2 = malloc(32u << 20);
    if (buf && buf2) {
        double a = llmq_now_s();
        if (!llmq_model_rows_f32(v, (v->shape[0] - n) / 2, n, buf))
            r->convert_eps = (double)(n * C) / (llmq_now_s() - a);
        memset(buf, 1, 32u << 20), memset(buf2, 2, 32u << 20);
        double tm[3];
        for (int i = 0; i < 3; i++) {
            a = llmq_now_s();
            memcpy(i % 2 ? buf : buf2, i % 2 ? buf2 : buf, 32u << 20);
            tm[i] = llmq_now_s() - a;
        }
        r->mem_bps = 2.0 * (32u << 20) / median3(tm[0], tm[1], tm[2]); // read + write
        // the directory formats' rounding on the run's grid (a group size that tiles 1024 columns)
        struct llmq_qconfig q = s->o->q;
        if (q.group_size > 1024 || (q.group_size > 0 && 1024 % q.group_size)) q.group_size = -1;
        for (int64_t i = 0; i < 256 * 1024; i++) buf[i] = rnd();
        struct llmq_qlinear ql = {0};
        a = llmq_now_s();
        if (!llmq_rtn_quantize("plan", buf, 256, 1024, &q, &ql)) r->rtn_eps = 256.0 * 1024.0 / (llmq_now_s() - a);
        llmq_qlinear_free(&ql);
    }
    free(buf), free(buf2);
    r->measure_s = llmq_now_s() - t0;
}

// Elements/s of the GGUF encoder of type t on rows of C columns (with importance when the run has one).
static double enc_rate(const struct shape *s, json_t *cache, enum llmq_dtype t, int64_t C) {
    json_t *hit = json_object_get(cache, llmq_dtype_name(t));
    if (hit) return json_real_value(hit);
    int64_t n = (1 << 18) / C > 0 ? (1 << 18) / C : 1;
    float *src = malloc((size_t)(n * C) * sizeof(float)), *imp = malloc((size_t)C * sizeof(float));
    void *dst = malloc((size_t)(n * C) * 4);
    double rate = 0;
    if (src && imp && dst) {
        for (int64_t i = 0; i < n * C; i++) src[i] = rnd();
        for (int64_t i = 0; i < C; i++) imp[i] = 0.5f + 0.5f * fabsf(rnd());
        bool with_imp = s->o->imatrix_path || s->o->method != LLMQ_QMETHOD_RTN || s->o->calib.n_sources > 0;
        int nt = s->o->n_threads > 0 ? s->o->n_threads : 1;
        (void)llmq_gguf_encode_rows(t, src, dst, n > 4 ? 4 : n, C, with_imp ? imp : NULL, nt); // warm-up
        double a = llmq_now_s();
        if (!llmq_gguf_encode_rows(t, src, dst, n, C, with_imp ? imp : NULL, nt))
            rate = (double)(n * C) / fmax(llmq_now_s() - a, 1e-9);
    }
    free(src), free(imp), free(dst);
    json_object_set_new(cache, llmq_dtype_name(t), json_real(rate));
    return rate;
}

static double per(double work, double rate) { return rate > 0 ? work / rate : 0; }

// Forward FLOPs per token of a whole block, and of its attention part alone (q, k, v, o and the scores).
// moe: the router and the K routed experts per token (the statistics passes under --moe-calib all: every expert,
// moe_all_flops more).
static double fwd_flops(const struct shape *s, int64_t l, bool attn_only) {
    double attn = 2.0 * (RC(s, l, LLMQ_LIN_Q) + RC(s, l, LLMQ_LIN_K) + RC(s, l, LLMQ_LIN_V) + RC(s, l, LLMQ_LIN_O)) +
                  2.0 * (double)s->seqlen * (double)s->Dq;
    if (s->moe && !attn_only) // (qwen2_moe: + its shared gate; the shared expert is the dense MLP below)
        attn += 2.0 * (double)((s->E + s->shexp) * s->D) + 6.0 * (double)(s->K * s->Fe * s->D);
    return attn_only ? attn : attn + 2.0 * (RC(s, l, LLMQ_LIN_GATE) + RC(s, l, LLMQ_LIN_UP) + RC(s, l, LLMQ_LIN_DOWN));
}
static double moe_all_flops(const struct shape *s) {
    return s->moe && s->moe_all ? 6.0 * (double)((s->E - s->K) * s->Fe * s->D) : 0;
}
static double conv_of(const struct shape *s, int64_t l, int k) { // elements a pass converts for linear k
    const struct llmq_tensor_view *v = lin_view(s, l, k);
    return !v || direct_f32(v) ? 0 : RC(s, l, k);
}
static double conv_experts(const struct shape *s, int64_t l) { // a moe pass: every expert's (each one a token reaches)
    double t = 0;
    for (int j = LLMQ_LIN_COUNT; j < n_lin(s); j++) t += conv_of(s, l, j);
    return t;
}

// The XᵀX of one block input of width C over N tokens: the syrk and the f64 accumulation per 256 tokens, the
// mirror and the Hessian's conversion.
static void time_xtx_n(const struct llmq_plan_rates *r, double N, double C, double *st) {
    double n_mb = ceil(N / LLMQ_GRAM_MICRO_BATCH);
    st[ST_XTX] += per(N * C * C, r->sgemm_flops) + per(n_mb * C * C / 2.0 * 20.0 + C * C * 28.0, r->mem_bps);
}
static void time_xtx(const struct shape *s, const struct llmq_plan_rates *r, double C, double *st) {
    time_xtx_n(r, (double)s->N, C, st);
}
// The experts' XᵀX (moe): E of each of their two inputs, over N tokens (--moe-calib all) or N K / E on average.
static void time_xtx_experts(const struct shape *s, const struct llmq_plan_rates *r, double *st) {
    const double n = s->moe_all ? (double)s->N : (double)s->N * (double)s->K / (double)s->E;
    for (int64_t x = 0; s->moe && x < s->E; x++)
        time_xtx_n(r, n, (double)s->D, st), time_xtx_n(r, n, (double)s->Fe, st);
}

// GPTQ of one linear: the Cholesky chain, the lazy-batch updates and the in-block column steps.
static double gptq_flops(double R, double C) { return R * C * C + 4.0 / 3.0 * C * C * C + 2.0 * R * C * GPTQ_B; }

// Per linear, in every solver method: its f32 load, the round / encode (twice for GPTQ: rtn_err), the errors.
static void time_linear(const struct shape *s, const struct llmq_plan_rates *r, json_t *cache, int64_t l, int k,
                        double *st) {
    double R = (double)rows(s, l, k), C = (double)cols(s, l, k), rc = R * C;
    st[ST_WEIGHTS] += per(rc, r->convert_eps);
    double n_round = s->gptq ? 2 : 1;
    if (s->gguf) {
        enum llmq_dtype t = LLMQ_DTYPE_COUNT;
        json_t *ts = json_object_get(s->rep, "tensors"), *x;
        size_t i;
        char want[96];
        if (k < LLMQ_LIN_COUNT)
            gguf_weight_name(s, (long long)l, k, want, sizeof(want));
        else
            snprintf(want, sizeof(want), "blk.%lld.ffn_%s_exps.weight", (long long)l,
                     llmq_linear_name((enum llmq_linear)(LLMQ_LIN_GATE + (k - LLMQ_LIN_COUNT) % 3)));
        json_array_foreach(ts, i, x) {
            const char *name = json_string_value(json_object_get(x, "name"));
            if (name && !strcmp(name, want)) t = llmq_dtype_from_name(json_string_value(json_object_get(x, "type")));
        }
        double er = t != LLMQ_DTYPE_COUNT ? enc_rate(s, cache, t, (int64_t)C) : 0;
        st[ST_ROUND] += n_round * per(rc, er) + n_round * per(rc, r->convert_eps);
    } else {
        st[ST_ROUND] += n_round * per(rc, r->rtn_eps) + per(rc * 8.0, r->mem_bps); // + packing
    }
    if (s->calib)
        st[ST_ERR] += per((s->gptq ? 3.0 : 2.0) * 2.0 * R * C * C, r->sgemm_flops); // rtn_err, err: one ‖W X‖²
    if (s->calib) st[ST_ERR] += per(C * C * 12.0 + rc * 12.0, r->mem_bps);          // the H / Hx / W copies
    if (s->gptq) st[ST_SOLVE] += per(gptq_flops(R, C), r->sgemm_flops);
    if (s->gptq && s->o->gptaq)
        st[ST_SOLVE] += per(2.0 * C * C * C + 2.0 * R * C * GPTQ_B, r->sgemm_flops); // P, Wpre1·P
}

// AWQ's search of block l: n_grid forwards of each scale group's module over the N tokens (or the Gram form),
// the candidates' rounding, the clip search's f64 products for every linear but q and k.
static void time_awq_search(const struct shape *s, const struct llmq_plan_rates *r, int64_t l, double *st) {
    struct llmq_awq_opts ao;
    llmq_awq_opts_default(&ao);
    double N = (double)s->N, grid = ao.n_grid;
    bool vo = rows(s, l, LLMQ_LIN_V) == rows(s, l, LLMQ_LIN_O) && cols(s, l, LLMQ_LIN_V) == cols(s, l, LLMQ_LIN_O);
    const double gC[4] = {(double)s->D, (double)s->Dq, (double)s->D, (double)s->F};
    const double gR[4] = {(double)rows(s, l, LLMQ_LIN_Q), (double)s->D, (double)s->F, (double)s->D};
    const double module[4] = {fwd_flops(s, l, true), 2.0 * RC(s, l, LLMQ_LIN_O),
                              2.0 * (RC(s, l, LLMQ_LIN_GATE) + RC(s, l, LLMQ_LIN_UP) + RC(s, l, LLMQ_LIN_DOWN)),
                              2.0 * RC(s, l, LLMQ_LIN_DOWN)};
    const double grc[4] = {RC(s, l, LLMQ_LIN_Q) + RC(s, l, LLMQ_LIN_K) + RC(s, l, LLMQ_LIN_V), RC(s, l, LLMQ_LIN_O),
                           RC(s, l, LLMQ_LIN_GATE) + RC(s, l, LLMQ_LIN_UP), RC(s, l, LLMQ_LIN_DOWN)};
    for (int g = 0; g < 4; g++) {
        // moe: the experts' groups below (qwen2_moe's shared gate / up among them; its up -> down here)
        if ((g == 1 && !vo) || (s->moe && (g == 2 || (g == 3 && !s->shexp)))) continue;
        double C = gC[g], R = gR[g];
        bool gram = C * C * N / 2.0 + grid * R * C * C < 0.5 * grid * N * R * C;
        st[ST_AWQ] +=
            gram ? per(C * C * N + grid * 2.0 * R * C * C, r->sgemm_flops) : per(grid * N * module[g], r->sgemm_flops);
        st[ST_AWQ] += per(grid * grc[g], r->rtn_eps);
    }
    double T = fmin(N, 2.0 * ao.n_sample_token), K1 = ao.max_shrink * ao.clip_n_grid + 1;
    for (int k = LLMQ_LIN_V; k < LLMQ_LIN_COUNT; k++)
        st[ST_AWQ] += per(2.0 * T * K1 * RC(s, l, k), r->dgemm_flops) + per((K1 - 1) * RC(s, l, k), r->rtn_eps);
    if (!s->moe) return;
    // quant/awq.c moe_search: n_grid mixture forwards over the N tokens (router + K experts per token), each with
    // the routed experts' gate / up candidates made from their f32 conversion; one more forward in which each
    // expert's up -> down search (n_grid + 1 products over its n_x = N K / E rows on average) and its clip search
    // (three linears, T_x sampled rows) run
    const double E = (double)s->E, ex = (double)s->Fe * (double)s->D, nx = N * (double)s->K / E;
    // (qwen2_moe: the shared expert in every mixture forward, its gate / up candidates made per ratio)
    const double mix = N * (2.0 * E * (double)s->D + 6.0 * (double)s->K * ex + (s->shexp ? module[2] : 0));
    const double Tx = fmin(nx, 2.0 * ao.n_sample_token);
    st[ST_AWQ] += per((grid + 1) * mix + E * (grid + 1) * 2.0 * nx * ex, r->sgemm_flops);
    st[ST_AWQ] +=
        per(grid * 2.0 * E * ex + grid * E * ex + 3.0 * E * (K1 - 1) * ex + (s->shexp ? grid * grc[2] : 0), r->rtn_eps);
    st[ST_AWQ] += per((grid * 2.0 + 4.0) * E * ex, r->convert_eps) + per(3.0 * E * 2.0 * Tx * K1 * ex, r->dgemm_flops);
}

// The non-linear tensors: converted (directories), or encoded in their planned types (GGUF).
static void time_other(const struct shape *s, const struct llmq_plan_rates *r, json_t *cache, bool linears_too,
                       double *st) {
    if (!s->gguf) {
        double e, b;
        other_tensors(s, &e, &b);
        st[ST_OTHER] += per(e, r->convert_eps) + per(e * 6.0, r->mem_bps);
        return;
    }
    json_t *ts = json_object_get(s->rep, "tensors"), *x;
    size_t i;
    json_array_foreach(ts, i, x) {
        const char *name = json_string_value(json_object_get(x, "name"));
        bool lin = false;
        long long l;
        for (int k = 0; name && k < LLMQ_LIN_COUNT && sscanf(name, "blk.%lld.", &l) == 1; k++) {
            char want[96];
            lin = lin || !strcmp(gguf_weight_name(s, l, k, want, sizeof(want)), name);
        }
        if (lin && !linears_too) continue;
        json_t *sh = json_object_get(x, "shape");
        double n = 1;
        for (size_t d = 0; d < json_array_size(sh); d++) n *= (double)json_integer_value(json_array_get(sh, d));
        int64_t C = json_array_size(sh) ? json_integer_value(json_array_get(sh, 0)) : 1;
        enum llmq_dtype t = llmq_dtype_from_name(json_string_value(json_object_get(x, "type")));
        const char *src = json_string_value(json_object_get(x, "src_type"));
        int stage = lin ? ST_ROUND : ST_OTHER;
        if (src && !strcmp(src, json_string_value(json_object_get(x, "type"))))
            st[stage] += per(2.0 * (double)json_integer_value(json_object_get(x, "bytes")), r->mem_bps); // a copy
        else
            st[stage] += per(n, r->convert_eps) + per(n, llmq_dtype_traits(t) && llmq_dtype_traits(t)->is_quant
                                                             ? enc_rate(s, cache, t, C)
                                                             : r->mem_bps / 6.0);
    }
}

static void plan_time(const struct shape *s, struct llmq_plan *p) {
    double st[ST_N] = {0};
    struct llmq_plan_rates *r = &p->rates;
    json_t *cache = json_object(); // the rates were measured by llmq_plan_build
    const struct llmq_quantize_opts *o = s->o;
    bool writer_only = s->gguf && o->method == LLMQ_QMETHOD_RTN;
    double t_enc0 = llmq_now_s();
    double nmb = s->T > 0 ? ceil((double)s->N / (double)s->T) : 0;
    for (int64_t l = 0; l < s->L; l++)
        for (int k = 0; k < n_lin(s); k++) st[ST_WEIGHTS] += per(RC(s, l, k), r->convert_eps); // the check
    if (writer_only) {
        if (s->calib && !o->imatrix_path) // the importance pass over every block
            for (int64_t l = 0; l < s->L; l++) {
                st[ST_CALIB] += per((double)s->N * fwd_flops(s, l, false), r->sgemm_flops);
                for (int k = 0; k < n_lin(s); k++) st[ST_CALIB] += per(nmb * conv_of(s, l, k), r->convert_eps);
            }
        time_other(s, r, cache, true, st);
    } else {
        for (int64_t l = 0; l < s->L; l++) {
            double conv = 0, fl = 0;
            if (o->method == LLMQ_QMETHOD_GPTQ && o->true_sequential && s->moe) { // o, experts' gate/up, down, x_q
                fl = 4.0 * fwd_flops(s, l, false) + 2.0 * moe_all_flops(s);
                conv = conv_of(s, l, LLMQ_LIN_O) + 4.0 * conv_experts(s, l); // held results decoded alike
                // qwen2_moe: the shared expert unquantized in the experts' passes (gate / up in the first one)
                if (s->shexp)
                    conv +=
                        conv_of(s, l, LLMQ_LIN_GATE) + conv_of(s, l, LLMQ_LIN_UP) + 2.0 * conv_of(s, l, LLMQ_LIN_DOWN);
                for (int slot = 0; slot < (s->shexp ? LLMQ_CALIB_N_SLOTS : 2); slot++)
                    time_xtx(s, r, (double)slot_c(s, slot), st);
                time_xtx_experts(s, r, st);
            } else if (o->method == LLMQ_QMETHOD_GPTQ && o->true_sequential) { // passes for o, the ffn norm, down, x_q
                fl = 3.0 * fwd_flops(s, l, false) + fwd_flops(s, l, true);
                for (int k = LLMQ_LIN_O; k < LLMQ_LIN_COUNT; k++) conv += conv_of(s, l, k);
                conv += conv_of(s, l, LLMQ_LIN_DOWN);
                for (int slot = 0; slot < LLMQ_CALIB_N_SLOTS; slot++) time_xtx(s, r, (double)slot_c(s, slot), st);
                if (o->gptaq) { // the fp pass and the ΔXᵀX̃ products (a full C x C product, twice a syrk's work)
                    fl += fwd_flops(s, l, false);
                    for (int slot = 0; slot < LLMQ_CALIB_N_SLOTS; slot++)
                        for (int t = 0; t < 2; t++) time_xtx(s, r, (double)slot_c(s, slot), st);
                }
            } else if (s->calib) { // one fp pass with every input's statistics (+ GPTQ's x_q pass)
                fl = fwd_flops(s, l, false) * (o->method == LLMQ_QMETHOD_GPTQ ? 2.0 : 1.0) + moe_all_flops(s);
                for (int k = 0; k < n_lin(s); k++) conv += conv_of(s, l, k);
                for (int slot = 0; slot < (s->moe && !s->shexp ? 3 : LLMQ_CALIB_N_SLOTS); slot++)
                    time_xtx(s, r, (double)slot_c(s, slot), st);
                time_xtx_experts(s, r, st);
            }
            st[ST_PASS] += per((double)s->N * fl, r->sgemm_flops) + per(nmb * conv, r->convert_eps);
            if (s->awq) {
                st[ST_WEIGHTS] += per(block_rc(s, l), r->convert_eps); // the block's f32 copy (moe: experts made twice)
                time_awq_search(s, r, l, st);
            }
            for (int k = 0; k < n_lin(s); k++)
                if (lin_view(s, l, k)) time_linear(s, r, cache, l, k, st);
        }
        time_other(s, r, cache, false, st);
    }
    r->measure_s += llmq_now_s() - t_enc0; // the encoders were measured on the way
    p->n_stages = 0;
    p->seconds = 0;
    for (int i = 0; i < ST_N; i++) {
        if (st[i] <= 0) continue;
        p->stages[p->n_stages++] = (struct llmq_plan_stage){stage_names[i], st[i]};
        p->seconds += st[i];
    }
    p->enc_rates = cache;
    p->timed = true;
}

// ---- the public functions ------------------------------------------------------------------------------

enum llmq_status llmq_plan_build(const struct llmq_model *m, const struct llmq_quantize_opts *o,
                                 const struct llmq_plan_opts *po, struct llmq_plan *p) {
    memset(p, 0, sizeof(*p));
    const struct llmq_hparams *hp = &m->hp;
    struct shape s = {.m = m,
                      .o = o,
                      .D = hp->n_embd,
                      .F = hp->shexp ? hp->n_ff_shexp : hp->n_ff, // qwen2_moe: the shared expert's width
                      .V = hp->n_vocab,
                      .L = hp->n_layer,
                      .Dq = hp->n_head * hp->head_dim,
                      .Dkv = hp->n_head_kv * hp->head_dim,
                      .calib = o->calib.n_sources > 0,
                      .gguf = o->to_gguf,
                      .awq = o->method == LLMQ_QMETHOD_AWQ || o->method == LLMQ_QMETHOD_AWQ_GPTQ,
                      .gptq = llmq_qmethod_uses_gptq(o->method),
                      .moe = hp->moe,
                      .moe_all = hp->moe && o->moe_calib_all,
                      .shexp = hp->moe && hp->shexp,
                      .E = hp->moe ? hp->n_expert : 0,
                      .K = hp->moe ? hp->n_expert_used : 0,
                      .Fe = hp->moe ? hp->n_ff_exp : 0};
    if (s.calib) {
        s.seqlen = o->calib.seqlen;
        s.N = o->calib.nsamples * o->calib.seqlen;
        s.T = (o->micro_batch < o->calib.nsamples ? o->micro_batch : o->calib.nsamples) * o->calib.seqlen;
    }
    p->tokens = s.N;
    p->cuda = o->backend == LLMQ_BACKEND_CUDA;
    enum llmq_status st = LLMQ_OK;
    if (s.gguf) {
        bool own = !po || !po->gguf_report;
        if (own && (st = gguf_dry_report(&s, &s.rep))) return st;
        if (!own) s.rep = json_incref((json_t *)po->gguf_report);
        gguf_output(&s, p, own);
    } else {
        dir_output(&s, p);
    }
    if (po && po->timed) measure_rates(&s, &p->rates); // first: its GEMMs map OpenBLAS's pages, as the run will
    plan_memory(&s, p);
    if (p->cuda) plan_vram(&s, p);
    plan_disk(&s, p, po && po->checkpoint);
    if (po && po->timed) plan_time(&s, p);
    json_decref(s.rep);
    return LLMQ_OK;
}

void llmq_plan_free(struct llmq_plan *p) {
    if (!p) return;
    json_decref(p->enc_rates);
    p->enc_rates = NULL;
}

static bool free_bytes(const char *dir, uint64_t *avail, dev_t *dev) {
    struct statvfs sv;
    struct stat sb;
    if (statvfs(dir, &sv) != 0 || stat(dir, &sb) != 0) return false;
    *avail = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    *dev = sb.st_dev;
    return true;
}

static void human(double b, char *buf, size_t n) {
    if (b >= 1073741824.0)
        snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= MIB)
        snprintf(buf, n, "%.1f MiB", b / MIB);
    else
        snprintf(buf, n, "%.1f KiB", b / 1024.0);
}

// What goes into each file system: the output (and checkpoint) directory, the spill directory.
struct need {
    const char *dir;
    bool known;
    dev_t dev;
    uint64_t avail, bytes;
    char what[10240];
};

static int disk_needs(const struct llmq_plan *p, struct need nd[2]) {
    char a[32], b[32];
    int n = 0;
    nd[0] = (struct need){.dir = p->out_dir};
    nd[0].known = free_bytes(p->out_dir, &nd[0].avail, &nd[0].dev);
    nd[0].bytes = p->output_bytes + (p->checkpoint ? p->checkpoint_bytes : 0);
    human((double)p->output_bytes, a, sizeof(a));
    human((double)p->checkpoint_bytes, b, sizeof(b));
    if (p->checkpoint)
        snprintf(nd[0].what, sizeof(nd[0].what), "the output %s (%s) and the checkpoint %s/ (%s)", p->out ? p->out : "",
                 a, p->checkpoint_dir, b);
    else
        snprintf(nd[0].what, sizeof(nd[0].what), "the output %s (%s)", p->out ? p->out : "", a);
    n = 1;
    if (p->spill_bytes) {
        struct need sp = {.dir = p->spill_dir, .bytes = p->spill_bytes};
        sp.known = free_bytes(p->spill_dir, &sp.avail, &sp.dev);
        human((double)p->spill_bytes, a, sizeof(a));
        if (sp.known && nd[0].known && sp.dev == nd[0].dev) { // one file system: summed
            nd[0].bytes += sp.bytes;
            size_t len = strlen(nd[0].what);
            snprintf(nd[0].what + len, sizeof(nd[0].what) - len, " and the spill files beyond --max-memory (%s, in %s)",
                     a, p->spill_dir);
        } else {
            snprintf(sp.what, sizeof(sp.what), "the spill files beyond --max-memory (%s)", a);
            nd[n++] = sp;
        }
    }
    return n;
}

enum llmq_status llmq_plan_check_disk(const struct llmq_plan *p) {
    struct need nd[2];
    int n = disk_needs(p, nd);
    for (int i = 0; i < n; i++) {
        if (!nd[i].known || nd[i].bytes <= nd[i].avail) continue;
        char need[32], have[32];
        human((double)nd[i].bytes, need, sizeof(need));
        human((double)nd[i].avail, have, sizeof(have));
        return llmq_errorf(LLMQ_ERR_IO,
                           "quantize: not enough free space in %s for %s: %llu bytes (%s) needed, %llu bytes (%s) "
                           "free; nothing was started (free space there, or choose another %s)",
                           nd[i].dir, nd[i].what, (unsigned long long)nd[i].bytes, need,
                           (unsigned long long)nd[i].avail, have,
                           nd[i].dir == p->spill_dir ? "LLMQ_SPILL_DIR" : "--out");
    }
    return LLMQ_OK;
}

bool llmq_plan_writes_checkpoint(const struct llmq_quantize_opts *o) { return o->checkpoint; }

enum llmq_status llmq_plan_preflight(const struct llmq_model *m, const struct llmq_quantize_opts *o) {
    struct llmq_plan p;
    struct llmq_plan_opts po = {.timed = false, .checkpoint = llmq_plan_writes_checkpoint(o)};
    if (llmq_plan_build(m, o, &po, &p)) return LLMQ_OK; // the writer's own begin refuses the options, with its line
    enum llmq_status st = llmq_plan_check_disk(&p);
    uint64_t ram = llmq_phys_mem_bytes();
    if (!st && ram && p.ram_peak_bytes > ram)
        llmq_warn("quantize: the plan's peak RAM (%.2f GiB, at %s) exceeds this machine's %.2f GiB (an estimate: "
                  "see llmq quantize --dry-run; --max-memory moves the activations to disk)",
                  (double)p.ram_peak_bytes / 1073741824.0, p.ram_phase, (double)ram / 1073741824.0);
    llmq_plan_free(&p);
    return st;
}

// ---- printing -------------------------------------------------------------------------------------------

static void print_disk(const struct llmq_plan *p, FILE *f) {
    struct need nd[2];
    int n = disk_needs(p, nd);
    for (int i = 0; i < n; i++) {
        char need[32], have[32];
        human((double)nd[i].bytes, need, sizeof(need));
        human((double)nd[i].avail, have, sizeof(have));
        if (nd[i].known)
            fprintf(f, "  free space   %s: %s needed, %s free%s\n", nd[i].dir, need, have,
                    nd[i].bytes > nd[i].avail ? "  -> a real run would be refused" : "");
        else
            fprintf(f, "  free space   %s: %s needed (the directory does not exist yet: not checked)\n", nd[i].dir,
                    need);
    }
}

void llmq_plan_print(const struct llmq_plan *p, FILE *f) {
    char a[32], b[32], c[32], d[32];
    fprintf(f, "\npreflight plan (estimates, nothing written):\n");
    human((double)p->output_bytes, a, sizeof(a));
    fprintf(f, "  output       %s: %llu bytes (%s)\n", p->out ? p->out : "(no --out)",
            (unsigned long long)p->output_bytes, a);
    human((double)p->ram_peak_bytes, a, sizeof(a));
    human((double)p->ram_anon_bytes, b, sizeof(b));
    human((double)p->ram_file_bytes, c, sizeof(c));
    human((double)p->ram_anon_max_bytes, d, sizeof(d));
    fprintf(f, "  peak RAM     %s (anonymous %s + file pages %s) at %s; anonymous alone at most %s\n", a, b, c,
            p->ram_phase, d);
    if (p->cuda) {
        human((double)p->vram_bytes, a, sizeof(a));
        fprintf(f,
                "  VRAM         %s (GEMM buffers, the GPTQ solve, the block path's activations and block; plus the "
                "CUDA context)\n",
                a);
    }
    human((double)p->spill_bytes, a, sizeof(a));
    if (p->spill_bytes)
        fprintf(f, "  spill        %s in %s (activations beyond --max-memory)\n", a, p->spill_dir);
    else
        fprintf(f, "  spill        none (%s)\n",
                llmq_spill_budget() ? "the activations fit in --max-memory" : "no --max-memory");
    human((double)p->checkpoint_bytes, a, sizeof(a));
    fprintf(f, "  checkpoint   %s/: %s at its largest (%s)\n", p->checkpoint_dir, a,
            p->checkpoint ? "written by this run" : "not written by this run (--no-checkpoint)");
    print_disk(p, f);
    if (p->tokens) fprintf(f, "  calibration  %lld tokens\n", (long long)p->tokens);
    if (!p->timed) return;
    const struct llmq_plan_rates *r = &p->rates;
    fprintf(f,
            "  time         about %.1f s (%.1f min), an estimate from rates measured now in %.2f s: f32 GEMM %.1f "
            "GFLOP/s, f64 %.1f GFLOP/s, weights to f32 %.0f M/s, memcpy %.1f GB/s, rounding %.0f M/s",
            p->seconds, p->seconds / 60.0, r->measure_s, r->sgemm_flops / 1e9, r->dgemm_flops / 1e9,
            r->convert_eps / 1e6, r->mem_bps / 1e9, r->rtn_eps / 1e6);
    const char *k;
    json_t *v;
    json_object_foreach(p->enc_rates, k, v) fprintf(f, ", %s %.1f M/s", k, json_real_value(v) / 1e6);
    fprintf(f, "\n");
    for (int i = 0; i < p->n_stages; i++) fprintf(f, "    %-16s %12.2f s\n", p->stages[i].name, p->stages[i].seconds);
}

json_t *llmq_plan_json(const struct llmq_plan *p) {
    json_t *j = json_object();
    json_object_set_new(j, "estimate", json_true());
    json_object_set_new(j, "output", p->out ? json_string(p->out) : json_null());
    json_object_set_new(j, "output_bytes", json_integer((json_int_t)p->output_bytes));
    json_object_set_new(j, "linear_output_bytes", json_integer((json_int_t)p->linear_out_bytes));
    json_object_set_new(j, "tokens", json_integer(p->tokens));
    json_object_set_new(j, "ram_peak_bytes", json_integer((json_int_t)p->ram_peak_bytes));
    json_object_set_new(j, "ram_anon_bytes", json_integer((json_int_t)p->ram_anon_bytes));
    json_object_set_new(j, "ram_file_bytes", json_integer((json_int_t)p->ram_file_bytes));
    json_object_set_new(j, "ram_anon_max_bytes", json_integer((json_int_t)p->ram_anon_max_bytes));
    json_object_set_new(j, "ram_peak_phase", json_string(p->ram_phase));
    json_object_set_new(j, "ram_base_anon_bytes", json_integer((json_int_t)p->base_anon_bytes));
    json_object_set_new(j, "vram_bytes", p->cuda ? json_integer((json_int_t)p->vram_bytes) : json_null());
    json_object_set_new(j, "spill_bytes", json_integer((json_int_t)p->spill_bytes));
    json_object_set_new(j, "spill_dir", json_string(p->spill_dir));
    json_object_set_new(j, "checkpoint_bytes", json_integer((json_int_t)p->checkpoint_bytes));
    json_object_set_new(j, "checkpoint_dir", json_string(p->checkpoint_dir));
    json_object_set_new(j, "checkpoint_written", json_boolean(p->checkpoint));
    struct need nd[2];
    int n = disk_needs(p, nd);
    json_t *disk = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(disk, json_pack("{s:s, s:s, s:I, s:o}", "dir", nd[i].dir, "what", nd[i].what, "bytes",
                                              (json_int_t)nd[i].bytes, "free_bytes",
                                              nd[i].known ? json_integer((json_int_t)nd[i].avail) : json_null()));
    json_object_set_new(j, "disk", disk);
    if (p->timed) {
        json_t *stg = json_array(), *r = json_object();
        for (int i = 0; i < p->n_stages; i++)
            json_array_append_new(stg,
                                  json_pack("{s:s, s:f}", "name", p->stages[i].name, "seconds", p->stages[i].seconds));
        json_object_set_new(j, "seconds", json_real(p->seconds));
        json_object_set_new(j, "stages", stg);
        json_object_set_new(r, "sgemm_flops", json_real(p->rates.sgemm_flops));
        json_object_set_new(r, "dgemm_flops", json_real(p->rates.dgemm_flops));
        json_object_set_new(r, "convert_elements_per_s", json_real(p->rates.convert_eps));
        json_object_set_new(r, "memcpy_bytes_per_s", json_real(p->rates.mem_bps));
        json_object_set_new(r, "rtn_elements_per_s", json_real(p->rates.rtn_eps));
        json_object_set_new(r, "encoders_elements_per_s", json_copy(p->enc_rates));
        json_object_set_new(r, "measure_seconds", json_real(p->rates.measure_s));
        json_object_set_new(j, "rates", r);
    }
    return j;
}
