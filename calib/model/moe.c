/*
 * calib/model/moe.c — the mixture-of-experts MLP (see calib/model/moe.h for the maths and the contract).
 *
 * Mirrors transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock (softmax in f32, top-k, optional
 * renormalisation, experts visited in index order, each over the tokens routed to it, outputs scaled by the
 * routing weight and accumulated) and llama.cpp's build_moe_ffn (which computes the same products; only the
 * order of the K additions per token differs).
 *
 * Legend: n tokens, D n_embd, E n_expert, K n_expert_used, Fe n_ff_exp, T max_tokens, ne tokens of one expert.
 */
#include "calib/model/moe.h"

#include "common/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct llmq_moe {
    int64_t T, D, E, K, Fe;
    bool all;                  // every expert over every token (llmq_moe_set_calib_all)
    float *logits;             // (T, E) router logits, then probabilities
    int32_t *sel;              // (T, K) chosen experts per token
    float *wsel;               // (T, K) their weights
    int64_t *count;            // (E) tokens routed to each expert (last call)
    int32_t *rows;             // (T) tokens of the current expert
    float *wrow;               // (T) their weights (0: not routed, under `all`)
    float *xe;                 // (T, D) gathered input
    float *ge;                 // (T, Fe) gate, then SiLU(gate) * up
    float *ue;                 // (T, Fe) up
    float *ye;                 // (T, D) expert output
    llmq_expert_weight_fn src; // llmq_moe_set_expert_source, or NULL
    void *src_user;
    float *wexp;                   // (Fe * D) the source's scratch; NULL without a source
    struct llmq_tensor_view wview; // F32 view on wexp
};

enum llmq_status llmq_moe_init(const struct llmq_hparams *hp, int64_t max_tokens, struct llmq_moe **out) {
    *out = NULL;
    LLMQ_ASSERT(hp->moe && max_tokens >= 1);
    struct llmq_moe *s = calloc(1, sizeof *s);
    if (!s) return llmq_errorf(LLMQ_ERR_NOMEM, "moe: out of memory");
    s->T = max_tokens;
    s->D = hp->n_embd;
    s->E = hp->n_expert;
    s->K = hp->n_expert_used;
    s->Fe = hp->n_ff_exp;
    const size_t T = (size_t)max_tokens;
    s->logits = malloc(T * (size_t)s->E * sizeof(float));
    s->sel = malloc(T * (size_t)s->K * sizeof(int32_t));
    s->wsel = malloc(T * (size_t)s->K * sizeof(float));
    s->count = calloc((size_t)s->E, sizeof(int64_t));
    s->rows = malloc(T * sizeof(int32_t));
    s->wrow = malloc(T * sizeof(float));
    s->xe = malloc(T * (size_t)s->D * sizeof(float));
    s->ge = malloc(T * (size_t)s->Fe * sizeof(float));
    s->ue = malloc(T * (size_t)s->Fe * sizeof(float));
    s->ye = malloc(T * (size_t)s->D * sizeof(float));
    if (!s->logits || !s->sel || !s->wsel || !s->count || !s->rows || !s->wrow || !s->xe || !s->ge || !s->ue ||
        !s->ye) {
        llmq_moe_free(s);
        return llmq_errorf(LLMQ_ERR_NOMEM, "moe: out of memory for %lld tokens", (long long)max_tokens);
    }
    *out = s;
    return LLMQ_OK;
}

void llmq_moe_free(struct llmq_moe *s) {
    if (!s) return;
    free(s->logits);
    free(s->sel);
    free(s->wsel);
    free(s->count);
    free(s->rows);
    free(s->wrow);
    free(s->xe);
    free(s->ge);
    free(s->ue);
    free(s->ye);
    free(s->wexp);
    free(s);
}

void llmq_moe_set_calib_all(struct llmq_moe *s, bool all) { s->all = all; }

enum llmq_status llmq_moe_set_expert_source(struct llmq_moe *s, llmq_expert_weight_fn fn, void *user) {
    s->src = fn;
    s->src_user = user;
    if (fn && !s->wexp && !(s->wexp = malloc((size_t)(s->Fe * s->D) * sizeof(float))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "moe: out of memory for an expert's weights");
    return LLMQ_OK;
}

// Expert x's weight k (0 gate, 1 up, 2 down) of the weight set's view w for the next product: w, or what the source
// wrote into the scratch (an F32 view with w's shape).
static enum llmq_status expert_weight(struct llmq_moe *s, int layer, int32_t x, int k, const struct llmq_tensor_view *w,
                                      const struct llmq_tensor_view **out) {
    *out = w;
    bool filled = false;
    enum llmq_status st =
        s->src ? s->src(s->src_user, layer, x, (enum llmq_linear)(LLMQ_LIN_GATE + k), w, s->wexp, &filled) : LLMQ_OK;
    if (st || !filled) return st;
    s->wview = *w;
    s->wview.dtype = LLMQ_DTYPE_F32;
    s->wview.data = s->wexp;
    s->wview.nbytes = (size_t)(w->shape[0] * w->shape[1]) * sizeof(float);
    *out = &s->wview;
    return LLMQ_OK;
}

const int64_t *llmq_moe_counts(const struct llmq_moe *s) { return s->count; }

// Softmax of every token's E logits in place, then its K largest (ties: the lower expert) and their weights.
static void route(struct llmq_moe *s, int64_t n, bool renorm) {
    const int64_t E = s->E, K = s->K;
    memset(s->count, 0, (size_t)E * sizeof *s->count);
    for (int64_t t = 0; t < n; t++) {
        float *p = s->logits + t * E;
        float mx = -INFINITY;
        for (int64_t x = 0; x < E; x++) mx = p[x] > mx ? p[x] : mx;
        double sum = 0.0;
        for (int64_t x = 0; x < E; x++) {
            p[x] = expf(p[x] - mx);
            sum += (double)p[x];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t x = 0; x < E; x++) p[x] *= inv;
        int32_t *sel = s->sel + t * K;
        float *w = s->wsel + t * K, wsum = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (int64_t x = 0; x < E; x++) {
                bool taken = false;
                for (int64_t j = 0; j < k && !taken; j++) taken = sel[j] == x;
                if (!taken && (best < 0 || p[x] > p[best])) best = (int32_t)x;
            }
            sel[k] = best;
            w[k] = p[best];
            wsum += w[k];
            s->count[best]++;
        }
        if (renorm)
            for (int64_t k = 0; k < K; k++) w[k] /= wsum;
    }
}

// The tokens of expert x into s->rows / s->wrow (all tokens under `all`, weight 0 where not routed); returns ne.
static int64_t gather(struct llmq_moe *s, const float *xn, int64_t n, int32_t x) {
    int64_t ne = 0;
    for (int64_t t = 0; t < n; t++) {
        float w = 0.0f;
        bool routed = false;
        for (int64_t k = 0; k < s->K && !routed; k++)
            if (s->sel[t * s->K + k] == x) {
                routed = true;
                w = s->wsel[t * s->K + k];
            }
        if (!routed && !s->all) continue;
        s->rows[ne] = (int32_t)t;
        s->wrow[ne] = routed ? w : 0.0f;
        memcpy(s->xe + ne * s->D, xn + t * s->D, (size_t)s->D * sizeof(float));
        ne++;
    }
    return ne;
}

enum llmq_status llmq_moe_ffn(struct llmq_moe *s, const struct llmq_hparams *hp, const struct llmq_layer *ly, int layer,
                              const float *xn, int64_t n, float *out, llmq_moe_linear_fn lin, void *lin_ctx,
                              llmq_expert_hook hook, void *user) {
    LLMQ_ASSERT(n >= 1 && n <= s->T && ly->router && ly->exps);
    const int64_t D = s->D, Fe = s->Fe;
    enum llmq_status st = lin(lin_ctx, ly->router, xn, n, s->logits);
    if (st) return st;
    route(s, n, hp->norm_topk_prob);
    memset(out, 0, (size_t)(n * D) * sizeof(float));
    for (int32_t x = 0; x < s->E; x++) {
        if (s->count[x] == 0 && !s->all) continue; // no token routed to it: not computed
        const int64_t ne = gather(s, xn, n, x);
        const struct llmq_tensor_view *const *w = ly->exps + 3 * (size_t)x; // gate, up, down
        const struct llmq_tensor_view *wk;
        if (hook) hook(user, layer, x, LLMQ_LIN_GATE, s->xe, ne, D);
        if ((st = expert_weight(s, layer, x, 0, w[0], &wk)) || (st = lin(lin_ctx, wk, s->xe, ne, s->ge))) return st;
        if ((st = expert_weight(s, layer, x, 1, w[1], &wk)) || (st = lin(lin_ctx, wk, s->xe, ne, s->ue))) return st;
        for (int64_t i = 0; i < ne * Fe; i++) {
            const float g = s->ge[i];
            s->ge[i] = (g / (1.0f + expf(-g))) * s->ue[i];
        }
        if (hook) hook(user, layer, x, LLMQ_LIN_DOWN, s->ge, ne, Fe);
        if ((st = expert_weight(s, layer, x, 2, w[2], &wk)) || (st = lin(lin_ctx, wk, s->ge, ne, s->ye))) return st;
        for (int64_t i = 0; i < ne; i++) {
            if (s->wrow[i] == 0.0f && s->all) continue; // computed for the statistics only
            float *o = out + (int64_t)s->rows[i] * D;
            const float *y = s->ye + i * D, wt = s->wrow[i];
            for (int64_t d = 0; d < D; d++) o[d] += y[d] * wt;
        }
    }
    return LLMQ_OK;
}
