// quant/gguf_sens.c — the measured sensitivity of the type choice (contract in quant/gguf_sens.h).
// Legend: L n_layer, D n_embd, V n_vocab, N measured tokens (Nw windows of S tokens), R rows, C row length.
#include "quant/gguf_sens.h"

#include "calib/eval/eval.h"
#include "calib/model/forward.h"
#include "common/eta.h"
#include "common/log.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"

#include <stdlib.h>
#include <string.h>

struct llmq_gguf_sens_opts llmq_gguf_sens_default_opts(void) {
    return (struct llmq_gguf_sens_opts){.n_windows = 4, .seqlen = 256, .n_threads = 1, .backend = LLMQ_BACKEND_CPU};
}

// The measurement's state: the unquantized model's block inputs and logits, the work buffers.
struct sens {
    const struct llmq_model *m;
    const struct llmq_gguf_sens_opts *o;
    struct llmq_forward *f;
    int64_t Nw, S, N, D, V;
    int32_t *tok;               // (N) the measured tokens, window after window
    int32_t *tgt;               // (N) each position's next token (the last of a window: itself; the KLD ignores it)
    float *xs;                  // (L, N, D) the input of every block of the unquantized model
    float *P;                   // (N, V) its logits
    float *x;                   // (N, D) the hidden state of the pass in progress
    float *logits;              // (S, V) one window's logits
    struct llmq_eval_row *rows; // (S)
    float *W, *Q;               // (R, C) the tensor measured: f32, decoded
    uint8_t *blk;               // its encoding
    size_t cap_w, cap_blk;
};

static enum llmq_status grow(struct sens *s, size_t nel, size_t nblk) {
    if (nel > s->cap_w) {
        free(s->W);
        free(s->Q);
        s->W = malloc(nel * sizeof(float));
        s->Q = malloc(nel * sizeof(float));
        s->cap_w = s->W && s->Q ? nel : 0;
    }
    if (nblk > s->cap_blk) {
        free(s->blk);
        s->blk = malloc(nblk);
        s->cap_blk = s->blk ? nblk : 0;
    }
    if (s->cap_w >= nel && s->cap_blk >= nblk) return LLMQ_OK;
    return llmq_errorf(LLMQ_ERR_NOMEM, "gguf sensitivity: out of memory for a %zu-element weight", nel);
}

// The reference pass: every block input into xs, the logits into P.
static enum llmq_status reference(struct sens *s) {
    const int64_t L = s->m->hp.n_layer, N = s->N, D = s->D;
    enum llmq_status st = llmq_forward_embed(s->f, s->tok, N, s->x);
    for (int64_t l = 0; l < L && !st; l++) {
        memcpy(s->xs + (size_t)(l * N * D), s->x, (size_t)(N * D) * sizeof(float));
        st = llmq_forward_block(s->f, (int)l, &s->m->layers[l], s->x, s->Nw, s->S, NULL, NULL);
    }
    return st ? st : llmq_forward_head(s->f, s->x, N, s->P);
}

// Blocks l .. L-1 from the reference input of block l (block l with the weight set ly_l, the others the model's
// own), then the head and the KLD against P, window by window.
static enum llmq_status kld_from(struct sens *s, int64_t l, const struct llmq_layer *ly_l, double *kld) {
    const int64_t L = s->m->hp.n_layer, N = s->N, D = s->D, S = s->S, V = s->V;
    memcpy(s->x, s->xs + (size_t)(l * N * D), (size_t)(N * D) * sizeof(float));
    enum llmq_status st = LLMQ_OK;
    for (int64_t j = l; j < L && !st; j++)
        st = llmq_forward_block(s->f, (int)j, j == l ? ly_l : &s->m->layers[j], s->x, s->Nw, S, NULL, NULL);
    double sum = 0;
    for (int64_t w = 0; w < s->Nw && !st; w++) {
        if ((st = llmq_forward_head(s->f, s->x + (size_t)(w * S * D), S, s->logits))) break;
        st = llmq_eval_score(s->logits, s->P + (size_t)(w * S * V), s->tgt + w * S, S, V, s->o->n_threads, s->rows);
        for (int64_t p = 0; p < S && !st; p++) sum += s->rows[p].kld;
    }
    *kld = st ? 0 : sum / (double)N;
    return st;
}

// kld of one tensor (see "What is measured"): its decoding in place of the view in a copy of its block's weight
// set while the pass runs (the model is not changed).
static enum llmq_status measure_one(struct sens *s, struct llmq_gguf_sens_tensor *t) {
    const struct llmq_model *m = s->m;
    if (t->layer < 0 || t->layer >= m->hp.n_layer || t->which < 0 || t->which >= LLMQ_LIN_COUNT ||
        !m->layers[t->layer].w[t->which])
        return llmq_errorf(LLMQ_ERR_ARG, "gguf sensitivity: no linear %d in block %lld", t->which, (long long)t->layer);
    const struct llmq_tensor_view *v = m->layers[t->layer].w[t->which];
    const int64_t R = v->shape[0], C = v->shape[1];
    size_t rb = 0;
    if (!llmq_dtype_nbytes(t->type, C, &rb) || !llmq_gguf_can_encode(t->type))
        return llmq_errorf(LLMQ_ERR_ARG, "gguf sensitivity: blk.%lld.%s: %s cannot encode rows of %lld",
                           (long long)t->layer, llmq_linear_gguf_name(t->which), llmq_dtype_name(t->type),
                           (long long)C);
    enum llmq_status st = grow(s, (size_t)(R * C), rb * (size_t)R);
    if (!st) st = llmq_model_weight_f32(v, s->W, s->o->n_threads);
    if (!st) st = llmq_gguf_encode_rows(t->type, s->W, s->blk, R, C, t->importance, s->o->n_threads);
    for (int64_t r = 0; r < R && !st; r++) st = llmq_dequantize_row(t->type, s->blk + (size_t)r * rb, s->Q + r * C, C);
    if (st) return st;
    struct llmq_tensor_view ov = *v;
    ov.dtype = LLMQ_DTYPE_F32;
    ov.data = s->Q;
    ov.nbytes = (size_t)(R * C) * sizeof(float);
    struct llmq_layer ly = m->layers[t->layer];
    ly.w[t->which] = &ov;
    return kld_from(s, t->layer, &ly, &t->kld);
}

static void sens_free(struct sens *s) {
    llmq_forward_free(s->f);
    free(s->tok);
    free(s->tgt);
    free(s->xs);
    free(s->P);
    free(s->x);
    free(s->logits);
    free(s->rows);
    free(s->W);
    free(s->Q);
    free(s->blk);
}

enum llmq_status llmq_gguf_sens_measure(const struct llmq_model *m, const struct llmq_calib_data *d,
                                        const struct llmq_gguf_sens_opts *o, int64_t n, struct llmq_gguf_sens_tensor *t,
                                        int64_t *n_tokens) {
    if (!d || d->n_seq < 1 || d->seqlen < 1 || !d->tokens || o->n_windows < 1 || o->seqlen < 1)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf sensitivity: no calibration windows to measure on (--calib)");
    const double t0 = llmq_now_s();
    struct sens s = {.m = m, .o = o, .D = m->hp.n_embd, .V = m->hp.n_vocab};
    s.Nw = o->n_windows < d->n_seq ? o->n_windows : d->n_seq;
    s.S = o->seqlen < d->seqlen ? o->seqlen : d->seqlen;
    s.N = s.Nw * s.S;
    const int64_t L = m->hp.n_layer, N = s.N, D = s.D, V = s.V;
    s.tok = malloc((size_t)N * sizeof(int32_t));
    s.tgt = malloc((size_t)N * sizeof(int32_t));
    s.xs = malloc((size_t)(L * N * D) * sizeof(float));
    s.P = malloc((size_t)(N * V) * sizeof(float));
    s.x = malloc((size_t)(N * D) * sizeof(float));
    s.logits = malloc((size_t)(s.S * V) * sizeof(float));
    s.rows = malloc((size_t)s.S * sizeof(*s.rows));
    enum llmq_status st = LLMQ_OK;
    if (!s.tok || !s.tgt || !s.xs || !s.P || !s.x || !s.logits || !s.rows)
        st = llmq_errorf(LLMQ_ERR_NOMEM, "gguf sensitivity: out of memory for %lld tokens (%.0f MB)", (long long)N,
                         (double)(L * N * D + N * V + N * D + s.S * V) * 4e-6);
    for (int64_t w = 0; w < s.Nw && !st; w++)
        for (int64_t p = 0; p < s.S; p++) {
            const int32_t *src = d->tokens + w * d->seqlen;
            s.tok[w * s.S + p] = src[p];
            s.tgt[w * s.S + p] = p + 1 < s.S ? src[p + 1] : src[p];
        }
    if (!st && !(st = llmq_forward_init(m, N, o->n_threads, &s.f))) {
        llmq_forward_set_backend(s.f, o->backend);
        st = reference(&s);
    }
    // the ETA's work model: per tensor of block l, the weights' elements of blocks l .. L-1 plus the head's
    double *rest = calloc((size_t)L + 1, sizeof(double)), total = 0;
    for (int64_t l = L - 1; rest && l >= 0; l--) {
        rest[l] = rest[l + 1];
        for (int k = 0; k < LLMQ_LIN_COUNT; k++)
            if (m->layers[l].w[k]) rest[l] += (double)llmq_tensor_nelements(m->layers[l].w[k]);
    }
    const double head = (double)(V * D);
    for (int64_t i = 0; i < n && rest; i++) total += rest[t[i].layer >= 0 && t[i].layer < L ? t[i].layer : 0] + head;
    struct llmq_eta eta;
    llmq_eta_init(&eta, total > 0 ? total : 1, llmq_now_s());
    if (!rest && !st) st = llmq_errorf(LLMQ_ERR_NOMEM, "gguf sensitivity: out of memory");
    for (int64_t i = 0; i < n && !st; i++) {
        const double t1 = llmq_now_s();
        if ((st = measure_one(&s, &t[i]))) break;
        llmq_eta_credit(&eta, rest[t[i].layer] + head);
        char left[32];
        llmq_eta_format(llmq_eta_remaining(&eta, llmq_now_s()), left, sizeof(left));
        llmq_info("gguf sensitivity: [%lld/%lld] blk.%lld.%s alone in %s: KLD %.4g (%.1f s, ETA %s)",
                  (long long)(i + 1), (long long)n, (long long)t[i].layer, llmq_linear_gguf_name(t[i].which),
                  llmq_dtype_name(t[i].type), t[i].kld, llmq_now_s() - t1, left);
    }
    free(rest);
    if (!st)
        llmq_info("gguf sensitivity: %lld tensors measured alone on %lld x %lld calibration tokens in %.1f s",
                  (long long)n, (long long)s.Nw, (long long)s.S, llmq_now_s() - t0);
    if (n_tokens) *n_tokens = st ? 0 : N;
    sens_free(&s);
    return st;
}
