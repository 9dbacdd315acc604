// calib/model/devblock.c — calib/model/devblock.h: a model's block shape and weight sets for kernels/block.h.
#include "calib/model/devblock.h"

#include "common/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(LLMQ_BLOCK_WQ == (int)LLMQ_LIN_Q && LLMQ_BLOCK_WO == (int)LLMQ_LIN_O &&
                   LLMQ_BLOCK_WDOWN == (int)LLMQ_LIN_DOWN && LLMQ_BLOCK_WDOWN + 1 == (int)LLMQ_LIN_COUNT,
               "kernels/block.h's linears follow enum llmq_linear");

enum llmq_status llmq_devblock_shape(const struct llmq_model *m, float *ff, struct llmq_block_shape *s) {
    const struct llmq_hparams *hp = &m->hp;
    const enum llmq_arch a = hp->arch;
    if (a != LLMQ_ARCH_LLAMA && a != LLMQ_ARCH_MISTRAL && a != LLMQ_ARCH_QWEN2 && a != LLMQ_ARCH_QWEN3)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: the backend block forward covers llama, mistral, qwen2 and "
                           "qwen3, not %s",
                           m->path ? m->path : "model", llmq_arch_name(a));
    const char *what = hp->attn_softcap > 0.0f                             ? "an attention softcap"
                       : llmq_hparams_layer_swa(hp, 0)                     ? "a sliding window"
                       : hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR ? "linear RoPE scaling"
                       : hp->n_rot != hp->head_dim                         ? "partial RoPE (n_rot below head_dim)"
                       : hp->attn_bias                                     ? "attention biases"
                       : hp->gemma || hp->moe                              ? "a gemma or moe block"
                                                                           : NULL;
    if (what)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: the backend block forward has no %s", m->path ? m->path : "model",
                           what);
    llmq_model_rope_freq_factors(m, ff);
    *s = (struct llmq_block_shape){.n_embd = hp->n_embd,
                                   .n_ff = hp->n_ff,
                                   .n_head = hp->n_head,
                                   .n_head_kv = hp->n_head_kv,
                                   .head_dim = hp->head_dim,
                                   .rms_eps = hp->rms_eps,
                                   .attn_scale = 1.0f / sqrtf((float)hp->head_dim), // forward.c attn_worker
                                   .rope_neox = hp->rope_type == LLMQ_ROPE_NEOX,
                                   .rope_theta = hp->rope_theta,
                                   .rope_ff = ff,
                                   .qkv_bias = hp->qkv_bias,
                                   .qk_norm = hp->qk_norm};
    return LLMQ_OK;
}

bool llmq_devblock_supported(const struct llmq_model *m, float *ff, struct llmq_block_shape *s, char *why, size_t cap) {
    const enum llmq_log_level lv = llmq_log_get_level();
    llmq_log_set_level(LLMQ_LOG_SILENT); // the refusal is the caller's reason, not an error
    const enum llmq_status st = llmq_devblock_shape(m, ff, s);
    llmq_log_set_level(lv);
    if (st) snprintf(why, cap, "%s", llmq_last_error());
    llmq_clear_error();
    return st == LLMQ_OK;
}

enum llmq_status llmq_devblock_want(const char *var, const char *who, enum llmq_backend backend, bool *want, bool *hook,
                                    enum llmq_backend *be) {
    const char *env = getenv(var);
    const bool off = env && strcmp(env, "off") == 0;
    *hook = env && strcmp(env, "cpu") == 0;
    *want = *hook || (!off && backend == LLMQ_BACKEND_CUDA);
    *be = *hook ? LLMQ_BACKEND_CPU : backend;
    if (env && *env && !*hook && !off)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "%s: %s=%s: must be cpu or off (unset: the device's blocks with --device cuda)", who, var,
                           env);
    if (off) llmq_info("%s: decoder blocks through calib/model/forward.c: %s=off", who, var);
    return LLMQ_OK;
}

enum llmq_status llmq_devblock_math(struct llmq_block *b, const char *who) {
    const char *env = getenv("LLMQ_BLOCK_MATH");
    if (!env || !*env || strcmp(env, "fp32") == 0) return LLMQ_OK;
    if (strcmp(env, "tf32") != 0)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: LLMQ_BLOCK_MATH=%s: must be fp32 or tf32", who, env);
    enum llmq_status st = llmq_block_set_tf32(b, true);
    if (!st)
        llmq_info("%s: the block's linears on TF32 tensor cores (LLMQ_BLOCK_MATH=tf32, experimental: not measured)",
                  who);
    return st;
}

void llmq_devblock_info_fallback(const char *who, enum llmq_backend be, const char *why) {
    llmq_info("%s: decoder blocks through calib/model/forward.c (%s): %s", who,
              be == LLMQ_BACKEND_CUDA ? "its linears' products on cuda" : "on the CPU", why);
}

// The view of ly that holds block weight w.
static const struct llmq_tensor_view *view_of(const struct llmq_layer *ly, enum llmq_block_weight w) {
    switch (w) {
    case LLMQ_BLOCK_ATTN_NORM: return ly->attn_norm;
    case LLMQ_BLOCK_FFN_NORM: return ly->ffn_norm;
    case LLMQ_BLOCK_BQ: return ly->bq;
    case LLMQ_BLOCK_BK: return ly->bk;
    case LLMQ_BLOCK_BV: return ly->bv;
    case LLMQ_BLOCK_Q_NORM: return ly->q_norm;
    case LLMQ_BLOCK_K_NORM: return ly->k_norm;
    default: return (int)w < LLMQ_LIN_COUNT ? ly->w[w] : NULL;
    }
}

static const char *const names[LLMQ_BLOCK_WEIGHT_COUNT] = {
    "wq", "wk", "wv", "wo", "wgate", "wup", "wdown", "attn_norm", "ffn_norm", "bq", "bk", "bv", "q_norm", "k_norm"};

enum llmq_status llmq_devblock_load(struct llmq_block *b, const struct llmq_layer *ly, int n_threads) {
    int64_t big = 0;
    for (int i = 0; i < LLMQ_BLOCK_WEIGHT_COUNT; i++) {
        const int64_t n = llmq_block_weight_size(b, (enum llmq_block_weight)i);
        const struct llmq_tensor_view *v = view_of(ly, (enum llmq_block_weight)i);
        if (n == 0) continue;
        if (!v || llmq_tensor_nelements(v) != n)
            return llmq_errorf(LLMQ_ERR_ARG, "block weight %s (%s): %lld elements, the block needs %lld", names[i],
                               v && v->name ? v->name : "missing", v ? (long long)llmq_tensor_nelements(v) : 0LL,
                               (long long)n);
        if (n > big) big = n;
    }
    float *scratch = NULL;
    enum llmq_status st = LLMQ_OK;
    for (int i = 0; i < LLMQ_BLOCK_WEIGHT_COUNT && !st; i++) {
        const enum llmq_block_weight w = (enum llmq_block_weight)i;
        const struct llmq_tensor_view *v = view_of(ly, w);
        if (llmq_block_weight_size(b, w) == 0) continue;
        if (v->dtype == LLMQ_DTYPE_F32 && (uintptr_t)v->data % sizeof(float) == 0) {
            st = llmq_block_set_weight(b, w, (const float *)v->data);
            continue;
        }
        if (!scratch && !(scratch = malloc((size_t)big * sizeof(float)))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "block weights: out of memory for %lld floats", (long long)big);
            break;
        }
        st = llmq_model_weight_f32(v, scratch, n_threads);
        if (!st) st = llmq_block_set_weight(b, w, scratch);
    }
    free(scratch);
    return st;
}
