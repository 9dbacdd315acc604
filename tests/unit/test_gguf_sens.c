// tests/unit/test_gguf_sens.c — quant/gguf_sens.h on stories260K (f32), seeded random calibration windows:
//   1. kld of one linear alone in Q4_0 equals the KLD recomputed here independently: the tensor encoded and
//      decoded here, the whole model run with llmq_forward_logits (not the block API the module uses), the KLD of
//      every position with llmq_eval_kld_row; the views are restored after the call;
//   2. kld is positive, and larger for a coarser type of the same tensor (Q4_0 > Q8_0);
//   3. a layer made deliberately more sensitive gets a larger kld: block 2's attn_output scaled by 4 amplifies
//      what an error of its attn_v does to the residual stream, while attn_v itself (its weights, its type, so its
//      reconstruction error) is unchanged;
//   4. the windows are capped at the calibration's (n_windows, seqlen larger than it measure on all of it); the same
//      n_threads give the same figure, another n_threads the same up to float rounding; no calibration and a
//      block out of range are LLMQ_ERR_ARG.
#include "harness.h"

#include "calib/eval/eval.h"
#include "calib/model/forward.h"
#include "common/log.h"
#include "formats/ggml/encode.h"
#include "formats/ggml/quants.h"
#include "quant/gguf_sens.h"

#include <math.h>

#define NW 3
#define S 48

// The decoding of weight v encoded in ty (no importance) into a new (R, C) buffer.
static float *decoded(const struct llmq_tensor_view *v, enum llmq_dtype ty) {
    const int64_t R = v->shape[0], C = v->shape[1];
    size_t rb = 0;
    CHECK(llmq_dtype_nbytes(ty, C, &rb));
    float *W = malloc(sizeof(float) * R * C), *Q = malloc(sizeof(float) * R * C);
    uint8_t *blk = malloc(rb * R);
    CHECK(W && Q && blk);
    CHECK_OK(llmq_model_weight_f32(v, W, 1));
    CHECK_OK(llmq_gguf_encode_rows(ty, W, blk, R, C, NULL, 1));
    for (int64_t r = 0; r < R; r++) CHECK_OK(llmq_dequantize_row(ty, blk + r * rb, Q + r * C, C));
    free(W);
    free(blk);
    return Q;
}

// Mean KLD over every position of the NW windows between the model as it is and its logits ref (NW * S, V).
static double kld_full(const struct llmq_model *m, const int32_t *tok, const float *ref) {
    const int64_t V = m->hp.n_vocab;
    struct llmq_forward *f = NULL;
    CHECK_OK(llmq_forward_init(m, S, 1, &f));
    float *lg = malloc(sizeof(float) * S * V);
    double sum = 0;
    for (int w = 0; w < NW; w++) {
        CHECK_OK(llmq_forward_logits(f, tok + w * S, S, 0, lg));
        for (int p = 0; p < S; p++) {
            struct llmq_eval_row row;
            llmq_eval_kld_row(ref + (w * S + p) * V, lg + p * V, V, 0, &row);
            sum += row.kld;
        }
    }
    free(lg);
    llmq_forward_free(f);
    return sum / (NW * S);
}

static void logits_all(const struct llmq_model *m, const int32_t *tok, float *out) {
    struct llmq_forward *f = NULL;
    CHECK_OK(llmq_forward_init(m, S, 1, &f));
    for (int w = 0; w < NW; w++) CHECK_OK(llmq_forward_logits(f, tok + w * S, S, 0, out + w * S * m->hp.n_vocab));
    llmq_forward_free(f);
}

static double measure(const struct llmq_model *m, const struct llmq_calib_data *d, int64_t layer, int which,
                      enum llmq_dtype ty) {
    struct llmq_gguf_sens_opts o = llmq_gguf_sens_default_opts();
    o.n_windows = NW;
    o.seqlen = S;
    o.n_threads = 2;
    struct llmq_gguf_sens_tensor t = {.layer = layer, .which = which, .type = ty};
    int64_t n_tok = 0;
    CHECK_OK(llmq_gguf_sens_measure(m, d, &o, 1, &t, &n_tok));
    CHECK_EQ_INT(n_tok, NW * S);
    return t.kld;
}

int main(void) {
    char path[1024];
    test_stories260k(path, sizeof path, "tinyllamas-stories-260k-f32.gguf");
    test_need_file(path);
    llmq_log_set_level(LLMQ_LOG_ERROR);
    struct llmq_model *m = NULL;
    CHECK_OK(llmq_model_load(path, &m));
    const int64_t V = m->hp.n_vocab;
    int32_t tok[NW * S];
    uint64_t seed = 7;
    for (int i = 0; i < NW * S; i++) tok[i] = (int32_t)(test_xorshift64s(&seed) >> 33) % (int32_t)V;
    struct llmq_calib_data d = {.n_seq = NW, .seqlen = S, .tokens = tok};
    float *ref = malloc(sizeof(float) * NW * S * V);
    logits_all(m, tok, ref);

    // 1. against the independent recomputation; the view is restored
    const struct llmq_tensor_view *v = m->layers[1].w[LLMQ_LIN_Q];
    double k4 = measure(m, &d, 1, LLMQ_LIN_Q, LLMQ_DTYPE_Q4_0);
    CHECK(m->layers[1].w[LLMQ_LIN_Q] == v);
    float *Q = decoded(v, LLMQ_DTYPE_Q4_0);
    struct llmq_tensor_view ov = *v;
    ov.dtype = LLMQ_DTYPE_F32;
    ov.data = Q;
    ov.nbytes = sizeof(float) * (size_t)llmq_tensor_nelements(v);
    m->layers[1].w[LLMQ_LIN_Q] = &ov;
    double kx = kld_full(m, tok, ref);
    m->layers[1].w[LLMQ_LIN_Q] = v;
    free(Q);
    printf("blk.1.attn_q q4_0: kld %.9g (module) %.9g (recomputed)\n", k4, kx);
    CHECK(k4 > 0 && fabs(k4 - kx) <= 1e-4 * kx); // float rounding: the module runs the windows in one call

    // 2. a coarser type costs more
    double k8 = measure(m, &d, 1, LLMQ_LIN_Q, LLMQ_DTYPE_Q8_0);
    printf("blk.1.attn_q q8_0: kld %.9g\n", k8);
    CHECK(k8 > 0 && k8 < k4 / 4);

    // 3. block 2's attn_v behind an attn_output scaled by 4
    double kv = measure(m, &d, 2, LLMQ_LIN_V, LLMQ_DTYPE_Q4_0);
    const struct llmq_tensor_view *wo = m->layers[2].w[LLMQ_LIN_O];
    const int64_t nwo = llmq_tensor_nelements(wo);
    float *Wo = malloc(sizeof(float) * nwo);
    CHECK_OK(llmq_model_weight_f32(wo, Wo, 1));
    for (int64_t i = 0; i < nwo; i++) Wo[i] *= 4.0f;
    struct llmq_tensor_view so = *wo;
    so.dtype = LLMQ_DTYPE_F32;
    so.data = Wo;
    so.nbytes = sizeof(float) * (size_t)nwo;
    m->layers[2].w[LLMQ_LIN_O] = &so;
    double kv4 = measure(m, &d, 2, LLMQ_LIN_V, LLMQ_DTYPE_Q4_0);
    m->layers[2].w[LLMQ_LIN_O] = wo;
    free(Wo);
    printf("blk.2.attn_v q4_0: kld %.9g; behind attn_output x 4: %.9g\n", kv, kv4);
    CHECK(kv > 0 && kv4 > 2 * kv);

    // 4. windows capped at the calibration's; no calibration
    struct llmq_gguf_sens_opts o = llmq_gguf_sens_default_opts(); // 4 x 256, more than the 3 x 48 there are
    struct llmq_gguf_sens_tensor t = {.layer = 1, .which = LLMQ_LIN_Q, .type = LLMQ_DTYPE_Q4_0};
    int64_t n_tok = 0;
    CHECK_OK(llmq_gguf_sens_measure(m, &d, &o, 1, &t, &n_tok));
    CHECK_EQ_INT(n_tok, NW * S);
    CHECK(fabs(t.kld - k4) <= 1e-4 * k4); // 1 thread against 2: the GEMMs' float rounding only
    o.n_threads = 2;
    CHECK_OK(llmq_gguf_sens_measure(m, &d, &o, 1, &t, NULL));
    CHECK(t.kld == k4); // the same threads: the same figure
    CHECK(llmq_gguf_sens_measure(m, NULL, &o, 1, &t, NULL) == LLMQ_ERR_ARG);
    t.layer = m->hp.n_layer;
    CHECK(llmq_gguf_sens_measure(m, &d, &o, 1, &t, NULL) == LLMQ_ERR_ARG);

    free(ref);
    llmq_model_free(m);
    printf("test_gguf_sens: OK\n");
    return 0;
}
