// formats/llama/hparams.c — the one reader and writer of the LLaMA-family hyper-parameters, GGUF keys
// and HF config.json (contracts and the key table: formats/llama/arch.h "Hyper-parameters").
// Mirrors llama.cpp's llm_load_hparams (the keys read) and convert_hf_to_gguf.py (the keys written, their
// order), and transformers' LlamaConfig / Qwen2Config / Qwen3Config (config.json keys and defaults).
#include "formats/llama/arch.h"

#include "common/io.h"
#include "formats/ggml/quants.h"
#include "formats/gguf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INT_KEY (1LL << 40)      // any integer key, before the checks of llmq_hparams_check
#define MAX_CONFIG_BYTES (16u << 20) // config.json

static void set_arch(struct llmq_hparams *hp, enum llmq_arch a, bool gguf) {
    const struct llmq_arch_info *ai = llmq_arch_info_of(a);
    hp->arch = a;
    hp->qkv_bias = ai->qkv_bias;
    hp->qk_norm = ai->qk_norm;
    hp->gemma = ai->gemma;
    hp->moe = ai->moe;
    hp->shexp = ai->shexp;
    hp->swa_pattern = ai->swa_pattern;
    hp->rope_type = gguf && ai->qk_permuted ? LLMQ_ROPE_NORM : LLMQ_ROPE_NEOX;
}

// The checks of llmq_hparams_check; n_vocab only when vocab (config.json may lack vocab_size).
// LongRoPE: n_rot/2 <= LLMQ_LONGROPE_MAX_PAIRS positive finite factors of each set, a positive attention factor.
static enum llmq_status check_longrope(const struct llmq_hparams *hp, const char *file) {
    const int64_t half = hp->n_rot / 2;
    if (half > LLMQ_LONGROPE_MAX_PAIRS || hp->rope_scaling.original_max_pos < 1)
        return llmq_errorf(
            LLMQ_ERR_CORRUPT, "%s: LongRoPE needs n_rot <= %d and an original context >= 1 (n_rot %lld, %lld)", file,
            2 * LLMQ_LONGROPE_MAX_PAIRS, (long long)hp->n_rot, (long long)hp->rope_scaling.original_max_pos);
    const float a = hp->rope_scaling.attn_factor;
    if (!(a > 0.0f) || !isfinite(a))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: LongRoPE attention factor %g must be positive", file, (double)a);
    for (int64_t i = 0; i < half; i++) {
        const float s = hp->rope_scaling.short_factor[i], l = hp->rope_scaling.long_factor[i];
        if (!(s > 0.0f) || !isfinite(s) || !(l > 0.0f) || !isfinite(l))
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: LongRoPE factor %lld (short %g, long %g) must be positive", file,
                               (long long)i, (double)s, (double)l);
    }
    return LLMQ_OK;
}

static enum llmq_status check(const struct llmq_hparams *hp, const char *file, bool vocab) {
    enum llmq_status st;
    const struct {
        const char *name;
        int64_t v;
    } dims[] = {{"n_embd", hp->n_embd},  {"n_ff", hp->n_ff},           {"n_layer", hp->n_layer},
                {"n_head", hp->n_head},  {"n_head_kv", hp->n_head_kv}, {"head_dim", hp->head_dim},
                {"n_vocab", hp->n_vocab}}; // n_vocab last: left out when !vocab
    for (size_t i = 0; i < sizeof dims / sizeof dims[0] - (vocab ? 0 : 1); i++)
        if (dims[i].v < 1 || dims[i].v > LLMQ_HPARAMS_MAX_DIM)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s = %lld is out of range [1, %lld]", file, dims[i].name,
                               (long long)dims[i].v, (long long)LLMQ_HPARAMS_MAX_DIM);
    if (hp->n_layer > LLMQ_HPARAMS_MAX_LAYERS)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %lld layers is more than %d", file, (long long)hp->n_layer,
                           LLMQ_HPARAMS_MAX_LAYERS);
    if (hp->n_head % hp->n_head_kv != 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: n_head %lld is not a multiple of n_head_kv %lld", file,
                           (long long)hp->n_head, (long long)hp->n_head_kv);
    if (hp->head_dim % 2 != 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: head_dim %lld is odd (RoPE needs pairs)", file,
                           (long long)hp->head_dim);
    if (hp->n_rot < 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %lld rotary dims: RoPE needs an even count in [2, head_dim %lld]",
                           file, (long long)hp->n_rot, (long long)hp->head_dim);
    if (hp->n_head * hp->head_dim > LLMQ_HPARAMS_MAX_DIM)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: n_head x head_dim is too large", file);
    if (!(hp->rms_eps > 0.0f) || !isfinite(hp->rms_eps))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rms norm epsilon %g must be positive", file, (double)hp->rms_eps);
    if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rope theta %g must be positive", file, (double)hp->rope_theta);
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR && !(hp->rope_scaling.factor > 0.0f))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: linear rope scaling factor %g must be positive", file,
                           (double)hp->rope_scaling.factor);
    if (hp->gemma) {
        if (!(hp->attn_softcap >= 0.0f) || !(hp->final_softcap >= 0.0f) || !isfinite(hp->attn_softcap) ||
            !isfinite(hp->final_softcap))
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: logit soft-capping values must be finite and >= 0", file);
        if (!(hp->query_pre_attn_scalar > 0.0f) || !isfinite(hp->query_pre_attn_scalar))
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: query_pre_attn_scalar %g must be positive", file,
                               (double)hp->query_pre_attn_scalar);
        if (!(hp->rope_theta_swa > 0.0f) || !isfinite(hp->rope_theta_swa))
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: sliding-window rope theta %g must be positive", file,
                               (double)hp->rope_theta_swa);
        if (hp->swa_pattern > LLMQ_HPARAMS_MAX_DIM || hp->sliding_window > LLMQ_HPARAMS_MAX_DIM)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: sliding window %lld / pattern %lld out of range", file,
                               (long long)hp->sliding_window, (long long)hp->swa_pattern);
    }
    if (hp->moe && (hp->n_expert < 1 || hp->n_expert > LLMQ_HPARAMS_MAX_EXPERTS || hp->n_expert_used < 1 ||
                    hp->n_expert_used > hp->n_expert || hp->n_ff_exp < 1 || hp->n_ff_exp > LLMQ_HPARAMS_MAX_DIM))
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: %lld experts, %lld per token, expert width %lld: need 1 <= per token <= experts <= %d "
                           "and a width in [1, %lld]",
                           file, (long long)hp->n_expert, (long long)hp->n_expert_used, (long long)hp->n_ff_exp,
                           LLMQ_HPARAMS_MAX_EXPERTS, (long long)LLMQ_HPARAMS_MAX_DIM);
    if (hp->shexp && (hp->n_ff_shexp < 1 || hp->n_ff_shexp > LLMQ_HPARAMS_MAX_DIM))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: shared expert width %lld out of range [1, %lld]", file,
                           (long long)hp->n_ff_shexp, (long long)LLMQ_HPARAMS_MAX_DIM);
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LONGROPE && (st = check_longrope(hp, file))) return st;
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LLAMA3) {
        float factor = hp->rope_scaling.factor, lo = hp->rope_scaling.low_freq_factor;
        float hi = hp->rope_scaling.high_freq_factor;
        if (!(factor > 0) || !(lo > 0) || !(hi > lo) || hp->rope_scaling.original_max_pos < 1)
            return llmq_errorf(LLMQ_ERR_CORRUPT,
                               "%s: rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor "
                               "and original_max_position_embeddings >= 1",
                               file);
    }
    return LLMQ_OK;
}

enum llmq_status llmq_hparams_check(const struct llmq_hparams *hp, const char *file) { return check(hp, file, true); }

// ============================================================================ GGUF ====

// <arch>.<suffix>, an integer in [0, 2^40]: required (absent: the GGUF reader's NOT_FOUND) or def.
static enum llmq_status gguf_int(const struct llmq_gguf *g, const char *arch, const char *suffix, bool required,
                                 int64_t def, int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!required && !llmq_gguf_find_kv(g, key)) {
        *out = def;
        return LLMQ_OK;
    }
    enum llmq_status st = llmq_gguf_get_i64(g, key, out);
    if (!st && (*out < 0 || *out > MAX_INT_KEY))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s = %lld is out of range", llmq_gguf_path(g), key, (long long)*out);
    return st;
}

// <arch>.<suffix>, a number: an F32 value keeps its exact bits, any other is rounded to float.
static enum llmq_status gguf_float(const struct llmq_gguf *g, const char *arch, const char *suffix, bool required,
                                   float def, float *out) {
    char key[128];
    double d;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, key);
    if (!kv && !required) {
        *out = def;
        return LLMQ_OK;
    }
    if (kv && kv->type == LLMQ_GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->data, 4);
        return LLMQ_OK;
    }
    enum llmq_status st = llmq_gguf_get_f64(g, key, &d);
    if (!st) *out = (float)d;
    return st;
}

// The attention scale llama.cpp derives for a gemma model (src/models/gemma2.cpp, gemma3.cpp: no GGUF key):
// n_embd / n_head for the 27B shapes (46 gemma2 layers, 62 gemma3 layers), else head_dim.
static float gemma_gguf_attn_scalar(const struct llmq_hparams *hp) {
    bool big = hp->n_layer == (hp->arch == LLMQ_ARCH_GEMMA2 ? 46 : 62);
    return (float)(big ? hp->n_embd / hp->n_head : hp->head_dim);
}

// One LongRoPE factor tensor (n_rot/2 decodable values) into out.
static enum llmq_status gguf_factors(const struct llmq_gguf *g, const struct llmq_gguf_tensor *t, const char *name,
                                     int64_t half, float *out) {
    if (!t)
        return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s (LongRoPE needs both factor tensors)",
                           llmq_gguf_path(g), name);
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(t->view.dtype);
    if (llmq_tensor_nelements(&t->view) != half || !tr || !tr->can_dequant ||
        llmq_dequantize_row(t->view.dtype, t->view.data, out, half) != LLMQ_OK)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s: expected %lld decodable values (rope.dimension_count / 2)",
                           llmq_gguf_path(g), name, (long long)half);
    return LLMQ_OK;
}

// phi3 LongRoPE (formats/llama/arch.h "LongRoPE"): the rope_factors_long / _short tensors, when either is present,
// with rope.scaling.attn_factor (absent: 1, as llama.cpp) and rope.scaling.original_context_length (absent:
// context_length, as llama.cpp's n_ctx_orig_yarn).
static enum llmq_status longrope_from_gguf(const struct llmq_gguf *g, const char *arch, struct llmq_hparams *hp) {
    const struct llmq_gguf_tensor *lt = llmq_gguf_find_tensor(g, LLMQ_GGUF_ROPE_LONG);
    const struct llmq_gguf_tensor *sh = llmq_gguf_find_tensor(g, LLMQ_GGUF_ROPE_SHORT);
    const int64_t half = hp->n_rot / 2;
    enum llmq_status st;
    if (!lt && !sh) return LLMQ_OK;
    if (hp->arch != LLMQ_ARCH_PHI3 || hp->rope_scaling.type != LLMQ_ROPE_SCALING_NONE)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: LongRoPE factor tensors are supported for phi3 without %s.rope.scaling.type",
                           llmq_gguf_path(g), arch);
    if (half > LLMQ_LONGROPE_MAX_PAIRS)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: LongRoPE with %lld rotary dims is not supported (at most %d)",
                           llmq_gguf_path(g), (long long)hp->n_rot, 2 * LLMQ_LONGROPE_MAX_PAIRS);
    hp->rope_scaling.type = LLMQ_ROPE_SCALING_LONGROPE;
    if ((st = gguf_factors(g, lt, LLMQ_GGUF_ROPE_LONG, half, hp->rope_scaling.long_factor)) ||
        (st = gguf_factors(g, sh, LLMQ_GGUF_ROPE_SHORT, half, hp->rope_scaling.short_factor)) ||
        (st = gguf_float(g, arch, "rope.scaling.attn_factor", false, 1.0f, &hp->rope_scaling.attn_factor)) ||
        (st = gguf_int(g, arch, "rope.scaling.original_context_length", false, hp->n_ctx_train,
                       &hp->rope_scaling.original_max_pos)))
        return st;
    hp->rope_scaling.factor = (float)((double)hp->n_ctx_train / (double)hp->rope_scaling.original_max_pos);
    return LLMQ_OK;
}

// The gemma keys of "Hyper-parameters" (defaults as llama.cpp's load_arch_hparams of gemma2 / gemma3).
static enum llmq_status gemma_from_gguf(const struct llmq_gguf *g, const char *arch, struct llmq_hparams *hp) {
    bool g2 = hp->arch == LLMQ_ARCH_GEMMA2;
    enum llmq_status st;
    if ((st = gguf_float(g, arch, "attn_logit_softcapping", false, g2 ? 50.0f : 0.0f, &hp->attn_softcap)) ||
        (st = gguf_float(g, arch, "final_logit_softcapping", false, g2 ? 30.0f : 0.0f, &hp->final_softcap)) ||
        (st = gguf_int(g, arch, "attention.sliding_window", false, g2 ? 4096 : 0, &hp->sliding_window)) ||
        (st = gguf_int(g, arch, "attention.sliding_window_pattern", false, hp->swa_pattern, &hp->swa_pattern)) ||
        (st = gguf_float(g, arch, "rope.freq_base_swa", false, g2 ? hp->rope_theta : 10000.0f, &hp->rope_theta_swa)))
        return st;
    if (!g2) hp->attn_softcap = 0.0f;                 // llama.cpp's gemma3 graph has no attention soft-capping
    if (hp->sliding_window == 0) hp->swa_pattern = 1; // llama.cpp: LLAMA_SWA_TYPE_NONE, every layer global
    hp->query_pre_attn_scalar = gemma_gguf_attn_scalar(hp);
    return LLMQ_OK;
}

enum llmq_status llmq_hparams_from_gguf(const struct llmq_gguf *g, int64_t n_ctx_absent, struct llmq_hparams *hp) {
    const char *path = llmq_gguf_path(g), *arch = NULL, *type = NULL;
    int64_t vlen = 0, rdim = 0, kv_vocab = 0;
    char key[128], name[64];
    enum llmq_status st;
    memset(hp, 0, sizeof *hp);
    if ((st = llmq_gguf_get_str(g, "general.architecture", &arch))) return st;
    int a = llmq_arch_find(arch, LLMQ_ARCH_KEY_GGUF);
    if (a < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: general.architecture \"%s\" is not supported (" LLMQ_ARCH_NAMES ")", path, arch);
    set_arch(hp, a, true);
    int64_t n_exp = 0;
    if ((st = gguf_int(g, arch, "expert_count", false, 0, &n_exp))) return st;
    if (a == LLMQ_ARCH_LLAMA && n_exp > 0) set_arch(hp, LLMQ_ARCH_MIXTRAL, true); // convert_hf_to_gguf.py: "llama"
    if ((st = gguf_int(g, arch, "embedding_length", true, 0, &hp->n_embd)) ||
        (st = gguf_int(g, arch, "feed_forward_length", true, 0, &hp->n_ff)) ||
        (st = gguf_int(g, arch, "block_count", true, 0, &hp->n_layer)) ||
        (st = gguf_int(g, arch, "attention.head_count", true, 0, &hp->n_head)) ||
        (st = gguf_int(g, arch, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv)) ||
        (st = gguf_int(g, arch, "context_length", false, n_ctx_absent, &hp->n_ctx_train)))
        return st;
    if (hp->n_head < 1)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s.attention.head_count = %lld must be >= 1", path, arch,
                           (long long)hp->n_head);
    if ((st = gguf_int(g, arch, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim)) ||
        (st = gguf_int(g, arch, "attention.value_length", false, hp->head_dim, &vlen)) ||
        (st = gguf_int(g, arch, "rope.dimension_count", false, hp->head_dim, &rdim)) ||
        (st = gguf_float(g, arch, "attention.layer_norm_rms_epsilon", true, 0, &hp->rms_eps)) ||
        (st = gguf_float(g, arch, "rope.freq_base", false, 10000.0f, &hp->rope_theta)))
        return st;
    if (vlen != hp->head_dim)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: %s.attention.key_length %lld and .value_length %lld differ", path,
                           arch, (long long)hp->head_dim, (long long)vlen);
    if (rdim != hp->head_dim && hp->arch != LLMQ_ARCH_PHI3)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: %s.rope.dimension_count %lld is not the head size %lld: partial RoPE is supported for "
                           "phi3 only",
                           path, arch, (long long)rdim, (long long)hp->head_dim);
    hp->n_rot = rdim; // llmq_hparams_check: even, in [2, head_dim]
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (llmq_gguf_find_kv(g, key)) {
        if ((st = llmq_gguf_get_str(g, key, &type))) return st;
        if (strcmp(type, "linear") == 0) {
            hp->rope_scaling.type = LLMQ_ROPE_SCALING_LINEAR;
            if ((st = gguf_float(g, arch, "rope.scaling.factor", true, 0, &hp->rope_scaling.factor))) return st;
        } else if (strcmp(type, "none") != 0) {
            return llmq_errorf(
                LLMQ_ERR_UNSUPPORTED,
                "%s: %s = \"%s\" is not supported (none, linear, or llama3 factors in " LLMQ_GGUF_ROPE_FREQS ")", path,
                key, type);
        }
    }
    if ((st = longrope_from_gguf(g, arch, hp))) return st;
    // n_vocab: the embedding's first dim (the tokenizer may be smaller; llama.cpp uses the tokens array)
    const char *te_name = llmq_tensor_name_of(LLMQ_T_TOK_EMBD)->gguf;
    const struct llmq_gguf_tensor *te = llmq_gguf_find_tensor(g, te_name);
    if (!te) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s", path, te_name);
    if (te->view.n_dims != 2 || te->view.shape[1] != hp->n_embd)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s is not (n_vocab, %lld)", path, te_name, (long long)hp->n_embd);
    hp->n_vocab = te->view.shape[0];
    snprintf(key, sizeof key, "%s.vocab_size", arch);
    if (llmq_gguf_find_kv(g, key)) {
        if ((st = llmq_gguf_get_i64(g, key, &kv_vocab))) return st;
        if (kv_vocab != hp->n_vocab)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s = %lld but %s has %lld rows", path, key, (long long)kv_vocab,
                               te_name, (long long)hp->n_vocab);
    }
    hp->tied_embeddings = llmq_gguf_find_tensor(g, llmq_tensor_name_of(LLMQ_T_OUTPUT)->gguf) == NULL ||
                          llmq_arch_info_of(hp->arch)->always_tied;
    llmq_tensor_full_name(hp->arch, LLMQ_T_BIAS_Q, 0, false, name, sizeof name);
    hp->attn_bias = !hp->qkv_bias && llmq_gguf_find_tensor(g, name) != NULL;
    if (hp->gemma && (st = gemma_from_gguf(g, arch, hp))) return st;
    if (hp->moe) { // llama.cpp's llama / qwen3moe graphs renormalise the top-k weights (build_moe_ffn norm_w),
        hp->n_expert = n_exp; // its qwen2moe graph does not
        hp->norm_topk_prob = !hp->shexp;
        if ((st = gguf_int(g, arch, "expert_used_count", true, 0, &hp->n_expert_used)) ||
            (st = gguf_int(g, arch, "expert_feed_forward_length", false, hp->n_ff, &hp->n_ff_exp)) ||
            (hp->shexp &&
             (st = gguf_int(g, arch, "expert_shared_feed_forward_length", false, hp->n_ff, &hp->n_ff_shexp))))
            return st;
    }
    return check(hp, path, true);
}

enum llmq_status llmq_hparams_check_gguf(const struct llmq_hparams *hp, const char *file) {
    if (hp->moe && hp->norm_topk_prob == hp->shexp)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: %s with norm_topk_prob %s: llama.cpp's graph %s the top-k routing weights, so a GGUF "
                           "cannot express it",
                           file, llmq_arch_name(hp->arch), hp->shexp ? "true" : "false",
                           hp->shexp ? "never renormalises" : "always renormalises");
    if (hp->arch == LLMQ_ARCH_MIXTRAL && hp->n_ff_exp != hp->n_ff)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: mixtral with an expert width other than n_ff", file);
    if (!hp->gemma) return LLMQ_OK;
    const bool g2 = hp->arch == LLMQ_ARCH_GEMMA2;
    if (hp->query_pre_attn_scalar != gemma_gguf_attn_scalar(hp))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: query_pre_attn_scalar %g is not what llama.cpp derives for this shape (%g): a GGUF "
                           "cannot express it",
                           file, (double)hp->query_pre_attn_scalar, (double)gemma_gguf_attn_scalar(hp));
    if (g2 && (!(hp->attn_softcap > 0.0f) || !(hp->final_softcap > 0.0f) || hp->sliding_window < 1))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: gemma2 without attention / final logit soft-capping or sliding window: llama.cpp's "
                           "gemma2 graph always applies them",
                           file);
    if (!g2 && hp->sliding_window == 0 && (hp->rope_theta_swa != hp->rope_theta || hp->rope_scaling.type))
        for (int64_t il = 0; il < hp->n_layer; il++)
            if (llmq_hparams_layer_swa(hp, il))
                return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                                   "%s: gemma3 without a sliding window but with sliding layers of another RoPE: "
                                   "llama.cpp has no sliding layers without a window",
                                   file);
    if (!g2 && hp->attn_softcap > 0.0f)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: gemma3 with attn_logit_softcapping: llama.cpp's gemma3 has none",
                           file);
    return LLMQ_OK;
}

// The gemma keys (conversion/gemma.py writes the soft-capping values and the window; the pattern and the
// local RoPE base where they differ from llama.cpp's defaults), after llmq_hparams_check_gguf.
static enum llmq_status gemma_to_gguf(struct llmq_gguf_writer *w, const struct llmq_hparams *hp, const char *a) {
    const bool g2 = hp->arch == LLMQ_ARCH_GEMMA2;
    char k[128];
    enum llmq_status st = llmq_hparams_check_gguf(hp, llmq_arch_name(hp->arch));
    if (st) return st;
#define KEY(suffix) (snprintf(k, sizeof(k), "%s.%s", a, suffix), k)
    if (g2) st = llmq_gguf_writer_set_f32(w, KEY("attn_logit_softcapping"), hp->attn_softcap);
    if (!st && hp->final_softcap > 0.0f)
        st = llmq_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), hp->final_softcap);
    if (!st && hp->sliding_window > 0)
        st = llmq_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)hp->sliding_window);
    if (!st && hp->sliding_window > 0 && hp->swa_pattern != llmq_arch_info_of(hp->arch)->swa_pattern)
        st = llmq_gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)hp->swa_pattern);
    if (!st && (!g2 || hp->rope_theta_swa != hp->rope_theta))
        st = llmq_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), hp->rope_theta_swa);
#undef KEY
    return st;
}

enum llmq_status llmq_hparams_to_gguf(struct llmq_gguf_writer *w, const struct llmq_hparams *hp, const char *name,
                                      int64_t file_type) {
    const char *a = llmq_arch_info_of(hp->arch)->gguf_name;
    char k[128];
    enum llmq_status st;
#define KEY(suffix) (snprintf(k, sizeof(k), "%s.%s", a, suffix), k)
    if ((st = llmq_gguf_writer_set_str(w, "general.architecture", a)) ||
        (st = llmq_gguf_writer_set_str(w, "general.type", "model")) ||
        (st = llmq_gguf_writer_set_str(w, "general.name", name)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)hp->n_ctx_train)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)hp->n_embd)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)hp->n_ff)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)hp->n_layer)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)hp->n_head)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)hp->n_head_kv)) ||
        (st = llmq_gguf_writer_set_f32(w, KEY("rope.freq_base"), hp->rope_theta)) ||
        (st = llmq_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps)))
        return st;
    if (hp->moe && ((st = llmq_hparams_check_gguf(hp, llmq_arch_name(hp->arch))) ||
                    (st = llmq_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)hp->n_expert)) ||
                    (st = llmq_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)hp->n_expert_used))))
        return st;
    if ((hp->arch == LLMQ_ARCH_QWEN3_MOE || hp->shexp) &&
        (st = llmq_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)hp->n_ff_exp)))
        return st;
    if (hp->shexp &&
        (st = llmq_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)hp->n_ff_shexp)))
        return st;
    if (hp->head_dim != hp->n_embd / hp->n_head &&
        ((st = llmq_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim)) ||
         (st = llmq_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim))))
        return st;
    if ((file_type >= 0 && (st = llmq_gguf_writer_set_u32(w, "general.file_type", (uint32_t)file_type))) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->n_rot)))
        return st;
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR &&
        ((st = llmq_gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear")) ||
         (st = llmq_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), hp->rope_scaling.factor))))
        return st;
    // LongRoPE: the factor tensors are the caller's (convert_hf_to_gguf.py Phi3MiniModel writes these two keys)
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LONGROPE &&
        ((st = llmq_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                                        (uint32_t)hp->rope_scaling.original_max_pos)) ||
         (st = llmq_gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), hp->rope_scaling.attn_factor))))
        return st;
#undef KEY
    return hp->gemma ? gemma_to_gguf(w, hp, a) : LLMQ_OK;
}

// ============================================================================ config.json ====

enum llmq_status llmq_hf_config_load(const char *dir, json_t **cfg, char **path) {
    char *p = llmq_path_join(dir, "config.json");
    enum llmq_status st;
    *cfg = NULL;
    if (path) *path = NULL;
    if (!p) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    if (!llmq_file_exists(p))
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no config.json (not a Hugging Face model directory)", dir);
    else
        st = llmq_read_json_object(p, MAX_CONFIG_BYTES, cfg);
    if (st == LLMQ_OK && path)
        *path = p;
    else
        free(p);
    return st;
}

// One object of config.json: the config itself, or its rope_scaling (prefix "rope_scaling." in messages).
struct cfg {
    const char *file;
    const json_t *obj;
    const char *prefix;
};

// A key that is absent or null counts as absent.
static const json_t *cfg_get(const struct cfg *c, const char *key) {
    const json_t *v = json_object_get(c->obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static enum llmq_status cfg_missing(const struct cfg *c, const char *key) {
    return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing key \"%s%s\"", c->file, c->prefix, key);
}

// An integer in [0, 2^40]: required, or def when absent.
static enum llmq_status cfg_int(const struct cfg *c, const char *key, bool required, int64_t def, int64_t *out) {
    const json_t *v = cfg_get(c, key);
    if (!v) {
        *out = def;
        return required ? cfg_missing(c, key) : LLMQ_OK;
    }
    if (!json_is_integer(v))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s%s\" is not an integer", c->file, c->prefix, key);
    *out = (int64_t)json_integer_value(v);
    if (*out < 0 || *out > MAX_INT_KEY)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s%s\" = %lld is out of range [0, 2^40]", c->file, c->prefix, key,
                           (long long)*out);
    return LLMQ_OK;
}

// A number, rounded to float: required, or def when absent.
static enum llmq_status cfg_float(const struct cfg *c, const char *key, bool required, double def, float *out) {
    const json_t *v = cfg_get(c, key);
    if (!v) {
        *out = (float)def;
        return required ? cfg_missing(c, key) : LLMQ_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s%s\" is not a number", c->file, c->prefix, key);
    *out = (float)json_number_value(v);
    return LLMQ_OK;
}

// A boolean, false when absent.
static enum llmq_status cfg_bool(const struct cfg *c, const char *key, bool *out) {
    const json_t *v = cfg_get(c, key);
    *out = v && json_is_true(v);
    if (v && !json_is_boolean(v))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s%s\" is not a boolean", c->file, c->prefix, key);
    return LLMQ_OK;
}

// The n numbers of the array key of r into out (a LongRoPE factor list).
static enum llmq_status cfg_factors(const struct cfg *r, const char *key, int64_t n, float *out) {
    const json_t *a = cfg_get(r, key);
    if (!a) return cfg_missing(r, key);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != n)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s%s\" is not an array of %lld numbers (rotary dims / 2)", r->file,
                           r->prefix, key, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s%s\"[%lld] is not a number", r->file, r->prefix, key,
                               (long long)i);
        out[i] = (float)json_number_value(v);
    }
    return LLMQ_OK;
}

// phi3 rope_scaling "longrope" / "su" (object r; c the config) as transformers reads it (formats/llama/arch.h
// "LongRoPE"): original_max_position_embeddings from the top level (Phi3Config's default 4096 when absent, which
// transformers puts over rope_scaling's own), factor as given or max_position_embeddings / original, and the
// attention factor as given or derived from it.
static enum llmq_status cfg_longrope(const struct cfg *c, const struct cfg *r, struct llmq_hparams *hp) {
    const int64_t half = hp->n_rot / 2;
    int64_t max_pos = 0;
    float factor = 0, attn = 0;
    enum llmq_status st;
    if (half < 1 || half > LLMQ_LONGROPE_MAX_PAIRS)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: LongRoPE with %lld rotary dims is not supported (at most %d)",
                           c->file, (long long)hp->n_rot, 2 * LLMQ_LONGROPE_MAX_PAIRS);
    hp->rope_scaling.type = LLMQ_ROPE_SCALING_LONGROPE;
    if ((st = cfg_factors(r, "short_factor", half, hp->rope_scaling.short_factor)) ||
        (st = cfg_factors(r, "long_factor", half, hp->rope_scaling.long_factor)) ||
        (st = cfg_int(c, "original_max_position_embeddings", false, 4096, &hp->rope_scaling.original_max_pos)) ||
        (st = cfg_int(c, "max_position_embeddings", false, 4096, &max_pos)) ||
        (st = cfg_float(r, "factor", false, 0, &factor)) || (st = cfg_float(r, "attention_factor", false, 0, &attn)))
        return st;
    if (hp->rope_scaling.original_max_pos < 1)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: original_max_position_embeddings must be >= 1", c->file);
    const double f =
        cfg_get(r, "factor") ? (double)factor : (double)max_pos / (double)hp->rope_scaling.original_max_pos;
    hp->rope_scaling.factor = (float)f;
    hp->rope_scaling.attn_factor =
        cfg_get(r, "attention_factor") ? attn : llmq_longrope_attn_default(f, hp->rope_scaling.original_max_pos);
    return LLMQ_OK;
}

// n_rot from partial_rotary_factor (formats/llama/arch.h "Phi-3"): phi3 reads it at the top level (transformers 4's
// Phi3Config) and in rope_scaling / rope_parameters, the object cfg_rope_scaling reads (transformers 5 moves it
// there; that copy wins); both present and different is refused. n_rot = int(head_dim * factor) as transformers'
// _compute_default_rope_parameters / _compute_longrope_parameters, in double. Any other family takes 1 only (its
// transformers model rotates the whole head).
static enum llmq_status cfg_rotary(const struct cfg *c, struct llmq_hparams *hp) {
    const json_t *rs = cfg_get(c, "rope_scaling") ? cfg_get(c, "rope_scaling") : cfg_get(c, "rope_parameters");
    const json_t *top = cfg_get(c, "partial_rotary_factor"), *in = NULL;
    if (json_is_object(rs) && !json_is_null(json_object_get(rs, "partial_rotary_factor")))
        in = json_object_get(rs, "partial_rotary_factor");
    hp->n_rot = hp->head_dim;
    if ((top && !json_is_number(top)) || (in && !json_is_number(in)))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: partial_rotary_factor is not a number", c->file);
    if (top && in && json_number_value(top) != json_number_value(in))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: partial_rotary_factor %g at the top level and %g in %s differ (transformers 4 reads "
                           "the first, 5 the second)",
                           c->file, json_number_value(top), json_number_value(in),
                           cfg_get(c, "rope_scaling") ? "rope_scaling" : "rope_parameters");
    const double f = in ? json_number_value(in) : top ? json_number_value(top) : 1.0;
    if (f == 1.0) return LLMQ_OK;
    if (hp->arch != LLMQ_ARCH_PHI3)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: partial_rotary_factor %g: partial RoPE is supported for phi3 only", c->file, f);
    if (!(f > 0.0 && f < 1.0))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: partial_rotary_factor %g is not in (0, 1]", c->file, f);
    hp->n_rot = (int64_t)((double)hp->head_dim * f);
    if (hp->n_rot < 2 || hp->n_rot % 2 != 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: partial_rotary_factor %g of head_dim %lld gives %lld rotary dims (RoPE needs an even "
                           "count >= 2)",
                           c->file, f, (long long)hp->head_dim, (long long)hp->n_rot);
    return LLMQ_OK;
}

// rope_scaling, else rope_parameters (transformers 5 writes rope_theta and the scaling there, same keys; for
// gemma3 one object per layer type: "full_attention" is read as the scaling, "sliding_attention" gives
// rope_theta_swa).
static enum llmq_status cfg_rope_scaling(const struct cfg *c, struct llmq_hparams *hp) {
    const bool scaling = cfg_get(c, "rope_scaling") != NULL;
    const char *key = scaling ? "rope_scaling" : "rope_parameters";
    const char *prefix = scaling ? "rope_scaling." : "rope_parameters.";
    const json_t *rs = cfg_get(c, key);
    enum llmq_status st;
    if (!rs) return LLMQ_OK;
    if (!json_is_object(rs)) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s\" is not an object", c->file, key);
    const json_t *full = json_object_get(rs, "full_attention"), *local = json_object_get(rs, "sliding_attention");
    if (!scaling && hp->gemma && (json_is_object(full) || json_is_object(local))) {
        if (json_is_object(local)) {
            struct cfg l = {c->file, local, "rope_parameters.sliding_attention."};
            const json_t *lt = cfg_get(&l, "rope_type");
            if (lt && (!json_is_string(lt) || strcmp(json_string_value(lt), "default") != 0))
                return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                                   "%s: rope_parameters.sliding_attention.rope_type must be \"default\"", c->file);
            if ((st = cfg_float(&l, "rope_theta", false, hp->rope_theta_swa, &hp->rope_theta_swa))) return st;
        }
        if (!json_is_object(full)) return LLMQ_OK;
        rs = full;
        prefix = "rope_parameters.full_attention.";
    }
    const json_t *t = json_object_get(rs, "rope_type"); // transformers: rope_type, else the older "type"
    if (!t) t = json_object_get(rs, "type");
    if (!json_is_string(t)) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s has no string \"rope_type\"", c->file, prefix);
    const char *type = json_string_value(t);
    struct cfg r = {c->file, rs, prefix};
    if (!cfg_get(c, "rope_theta") && (st = cfg_float(&r, "rope_theta", false, hp->rope_theta, &hp->rope_theta)))
        return st;
    if (strcmp(type, "default") == 0) return LLMQ_OK;
    if (strcmp(type, "linear") == 0) {
        hp->rope_scaling.type = LLMQ_ROPE_SCALING_LINEAR;
        return cfg_float(&r, "factor", true, 0, &hp->rope_scaling.factor);
    }
    if (hp->arch == LLMQ_ARCH_PHI3 && (strcmp(type, "longrope") == 0 || strcmp(type, "su") == 0))
        return cfg_longrope(c, &r, hp);
    if (strcmp(type, "llama3") != 0 || hp->gemma)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: rope_scaling type \"%s\" is not supported (%s)", c->file, type,
                           hp->gemma                    ? "linear"
                           : hp->arch == LLMQ_ARCH_PHI3 ? "linear, llama3, longrope, su"
                                                        : "linear, llama3");
    hp->rope_scaling.type = LLMQ_ROPE_SCALING_LLAMA3;
    if ((st = cfg_float(&r, "factor", true, 0, &hp->rope_scaling.factor)) ||
        (st = cfg_float(&r, "low_freq_factor", true, 0, &hp->rope_scaling.low_freq_factor)) ||
        (st = cfg_float(&r, "high_freq_factor", true, 0, &hp->rope_scaling.high_freq_factor)) ||
        (st = cfg_int(&r, "original_max_position_embeddings", true, 0, &hp->rope_scaling.original_max_pos)))
        return st;
    return LLMQ_OK;
}

// The period n of layer_types (see "Gemma" in formats/llama/arch.h): sliding layers at il % n < n - 1, n = 0
// when every layer slides; anything that is not such a period is refused.
static enum llmq_status cfg_layer_types(const struct cfg *c, const json_t *lt, struct llmq_hparams *hp) {
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != hp->n_layer)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"layer_types\" is not an array of %lld strings", c->file,
                           (long long)hp->n_layer);
    int64_t n = 0;
    for (int64_t il = 0; il < hp->n_layer && !n; il++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)il));
        if (t && strcmp(t, "full_attention") == 0) n = il + 1;
    }
    for (int64_t il = 0; il < hp->n_layer; il++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)il));
        bool sliding = n == 0 || il % n < n - 1;
        if (!t || strcmp(t, sliding ? "sliding_attention" : "full_attention") != 0)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "%s: layer_types[%lld] = %s: llmq (like llama.cpp) takes sliding layers in a period "
                               "(sliding_attention except every n-th layer)",
                               c->file, (long long)il, t ? t : "(not a string)");
    }
    hp->swa_pattern = n;
    return LLMQ_OK;
}

// The phi3 keys of config.json (transformers' Phi3Config): the window of every layer (null: none); the partial
// rotary factor is cfg_rotary's, the LongRoPE types cfg_rope_scaling's.
static enum llmq_status cfg_phi3(const struct cfg *c, struct llmq_hparams *hp) {
    return cfg_int(c, "sliding_window", false, 0, &hp->sliding_window);
}

// The moe keys of config.json (defaults as transformers' MixtralConfig / Qwen3MoeConfig / Qwen2MoeConfig); see
// "Mixture of experts" and "Qwen2-MoE's shared expert".
static enum llmq_status cfg_moe(const struct cfg *c, struct llmq_hparams *hp) {
    const bool mix = hp->arch == LLMQ_ARCH_MIXTRAL, q2 = hp->shexp;
    int64_t step = 1;
    enum llmq_status st;
    hp->n_ff_exp = hp->n_ff;
    hp->norm_topk_prob = mix;
    // Qwen3MoeConfig reads num_experts; transformers 5 writes it as num_local_experts
    const char *n_key = mix || !cfg_get(c, "num_experts") ? "num_local_experts" : "num_experts";
    if ((st = cfg_int(c, n_key, false,
                      mix  ? 8
                      : q2 ? 60
                           : 128,
                      &hp->n_expert)) ||
        (st = cfg_int(c, "num_experts_per_tok", false,
                      mix  ? 2
                      : q2 ? 4
                           : 8,
                      &hp->n_expert_used)) ||
        (!mix && (st = cfg_int(c, "moe_intermediate_size", false, q2 ? 1408 : 768, &hp->n_ff_exp))) ||
        (q2 && (st = cfg_int(c, "shared_expert_intermediate_size", false, 5632, &hp->n_ff_shexp))) ||
        (!mix && (st = cfg_bool(c, "norm_topk_prob", &hp->norm_topk_prob))) ||
        (!mix && (st = cfg_int(c, "decoder_sparse_step", false, 1, &step))))
        return st;
    const json_t *dense = cfg_get(c, "mlp_only_layers");
    if (step != 1 || (dense && (!json_is_array(dense) || json_array_size(dense) > 0)))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: decoder_sparse_step other than 1 or mlp_only_layers (dense blocks in a mixture of "
                           "experts) are not supported",
                           c->file);
    if (!q2 && cfg_get(c, "shared_expert_intermediate_size"))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: a shared expert in %s is not supported (qwen2_moe's is)", c->file,
                           llmq_arch_name(hp->arch));
    const json_t *qb = cfg_get(c, "qkv_bias"); // Qwen2MoeConfig: true
    if (q2 && qb && !json_is_true(qb))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: qwen2_moe with qkv_bias other than true is not supported",
                           c->file);
    return LLMQ_OK;
}

// The gemma keys of config.json (defaults as transformers' Gemma2Config / Gemma3TextConfig).
static enum llmq_status cfg_gemma(const struct cfg *c, struct llmq_hparams *hp) {
    const bool g2 = hp->arch == LLMQ_ARCH_GEMMA2;
    bool bidir = false;
    enum llmq_status st;
    if ((st = cfg_float(c, "attn_logit_softcapping", false, g2 ? 50.0 : 0.0, &hp->attn_softcap)) ||
        (st = cfg_float(c, "final_logit_softcapping", false, g2 ? 30.0 : 0.0, &hp->final_softcap)) ||
        (st = cfg_float(c, "query_pre_attn_scalar", false, 256.0, &hp->query_pre_attn_scalar)) ||
        (st = cfg_int(c, "sliding_window", false, 0, &hp->sliding_window)) ||
        (st = cfg_bool(c, "use_bidirectional_attention", &bidir)))
        return st;
    // absent: transformers' defaults; null: none
    if (json_object_get(c->obj, "sliding_window") == NULL) hp->sliding_window = 4096;
    if (json_is_null(json_object_get(c->obj, "attn_logit_softcapping"))) hp->attn_softcap = 0.0f;
    if (json_is_null(json_object_get(c->obj, "final_logit_softcapping"))) hp->final_softcap = 0.0f;
    if (bidir) return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: use_bidirectional_attention is not supported", c->file);
    if (!g2 && !cfg_get(c, "rope_parameters") &&
        (st = cfg_float(c, "rope_local_base_freq", false, 10000.0, &hp->rope_theta_swa)))
        return st;
    if (g2) hp->rope_theta_swa = hp->rope_theta;
    if (!hp->tied_embeddings && hp->arch == LLMQ_ARCH_GEMMA2)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: gemma2 with tie_word_embeddings false (llama.cpp's gemma2 always uses the embedding "
                           "as the head)",
                           c->file);
    const json_t *lt = cfg_get(c, "layer_types");
    if (lt) return cfg_layer_types(c, lt, hp);
    return cfg_int(c, "sliding_window_pattern", false, hp->swa_pattern, &hp->swa_pattern);
}

enum llmq_status llmq_hparams_from_hf_config(const char *file, const json_t *cfg, int64_t n_ctx_absent,
                                             struct llmq_hparams *hp) {
    struct cfg c = {file, cfg, ""};
    bool mlp_bias = false;
    int64_t vocab = -1;
    enum llmq_status st;
    memset(hp, 0, sizeof *hp);
    const json_t *mt = cfg_get(&c, "model_type");
    const char *type = NULL;
    int a = -1;
    if (mt && !json_is_string(mt)) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"model_type\" is not a string", file);
    if (mt) {
        type = json_string_value(mt);
        a = llmq_arch_find(type, LLMQ_ARCH_KEY_HF_TYPE);
    } else if ((type = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0)))) {
        a = llmq_arch_find(type,
                           LLMQ_ARCH_KEY_HF_CLASS); // no model_type: the class, as transformers' AutoConfig falls back
    }
    if (!type) return cfg_missing(&c, "model_type");
    if (a < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (" LLMQ_ARCH_NAMES ")", file,
                           type);
    set_arch(hp, a, false);
    const bool gemma = hp->gemma;
    const char *want_act = gemma ? "gelu_pytorch_tanh" : "silu";
    const json_t *act =
        gemma && cfg_get(&c, "hidden_activation") ? cfg_get(&c, "hidden_activation") : cfg_get(&c, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), want_act) != 0))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: %s must be \"%s\"", file,
                           gemma ? "hidden_activation" : "hidden_act", want_act);
    if ((st = cfg_int(&c, "hidden_size", true, 0, &hp->n_embd)) ||
        (st = cfg_int(&c, "intermediate_size", true, 0, &hp->n_ff)) ||
        (st = cfg_int(&c, "num_hidden_layers", true, 0, &hp->n_layer)) ||
        (st = cfg_int(&c, "num_attention_heads", true, 0, &hp->n_head)) ||
        (st = cfg_int(&c, "num_key_value_heads", false, hp->n_head, &hp->n_head_kv)))
        return st;
    if (hp->n_head < 1)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: num_attention_heads = %lld must be >= 1", file,
                           (long long)hp->n_head);
    hp->rope_theta_swa = 10000.0f;
    if ((st = cfg_int(&c, "head_dim", false, gemma ? 256 : hp->n_embd / hp->n_head, &hp->head_dim)) ||
        (st = cfg_int(&c, "vocab_size", false, -1, &vocab)) ||
        (st = cfg_int(&c, "max_position_embeddings", false, n_ctx_absent, &hp->n_ctx_train)) ||
        (st = cfg_float(&c, "rms_norm_eps", false, 1e-6, &hp->rms_eps)) ||
        (st = cfg_float(&c, "rope_theta", false, hp->arch == LLMQ_ARCH_GEMMA3 ? 1e6 : 10000.0, &hp->rope_theta)) ||
        (st = cfg_bool(&c, "tie_word_embeddings", &hp->tied_embeddings)) ||
        (st = cfg_bool(&c, "attention_bias", &hp->attn_bias)) || (st = cfg_bool(&c, "mlp_bias", &mlp_bias)) ||
        (st = cfg_rotary(&c, hp)) || (st = cfg_rope_scaling(&c, hp)))
        return st;
    if (gemma && !cfg_get(&c, "tie_word_embeddings")) hp->tied_embeddings = true; // Gemma configs' default
    if (gemma && (st = cfg_gemma(&c, hp))) return st;
    if (hp->arch == LLMQ_ARCH_PHI3 && (st = cfg_phi3(&c, hp))) return st;
    if (hp->moe && (st = cfg_moe(&c, hp))) return st;
    if (mlp_bias) return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: mlp_bias = true is not supported", file);
    hp->attn_bias = hp->attn_bias && !hp->qkv_bias; // qwen2's q/k/v biases are the family's, o has none
    hp->n_vocab = vocab < 0 ? 0 : vocab;
    return check(hp, file, vocab >= 0);
}

// The double nearest to the shortest decimal that reads back as f: 1e-05f gives 1e-05, not
// 9.99999975e-06, so config.json looks like the ones transformers writes (dumped with 9 digits).
static json_t *json_f32(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof(buf), "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

// partial_rotary_factor for n_rot of head_dim, a decimal of at most 9 digits (config.json's precision) that
// transformers turns back into n_rot (int(head_dim * factor), cfg_rotary): n_rot / head_dim when that is such a
// decimal (0.75), else the shortest one near the middle of [n_rot, n_rot + 1) / head_dim (1/3 of 96 rounds down to
// 31.99...; 0.34 gives 32).
static json_t *json_rotary_factor(const struct llmq_hparams *hp) {
    const double hd = (double)hp->head_dim, r = (double)hp->n_rot;
    char buf[32];
    for (int pass = 0; pass < 2; pass++)
        for (int p = 1; p <= 9; p++) {
            snprintf(buf, sizeof(buf), "%.*g", p, pass ? (r + 0.5) / hd : r / hd);
            const double f = strtod(buf, NULL);
            if (pass ? f <= 1.0 && (int64_t)(hd * f) == hp->n_rot : f == r / hd && (int64_t)(hd * f) == hp->n_rot)
                return json_real(f);
        }
    return json_real(r / hd); // not reached: the middle is 0.5 / head_dim >= 3e-8 from either end
}

// The gemma keys of config.json (Gemma2Config / Gemma3TextConfig; transformers reads rope_theta and
// rope_local_base_freq / rope_scaling in the older form too).
static void gemma_to_hf_config(const struct llmq_hparams *hp, json_t *c) {
    json_t *lt = json_array();
    for (int64_t il = 0; il < hp->n_layer; il++)
        json_array_append_new(lt, json_string(llmq_hparams_layer_swa(hp, il) ? "sliding_attention" : "full_attention"));
    json_object_set_new(c, "layer_types", lt);
    json_object_set_new(c, "hidden_activation", json_string("gelu_pytorch_tanh"));
    json_object_set_new(c, "attn_logit_softcapping", hp->attn_softcap > 0 ? json_f32(hp->attn_softcap) : json_null());
    json_object_set_new(c, "final_logit_softcapping",
                        hp->final_softcap > 0 ? json_f32(hp->final_softcap) : json_null());
    json_object_set_new(c, "query_pre_attn_scalar", json_f32(hp->query_pre_attn_scalar));
    json_object_set_new(c, "sliding_window", hp->sliding_window > 0 ? json_integer(hp->sliding_window) : json_null());
    if (hp->arch == LLMQ_ARCH_GEMMA3) json_object_set_new(c, "rope_local_base_freq", json_f32(hp->rope_theta_swa));
}

// The moe keys of config.json (MixtralConfig / Qwen3MoeConfig / Qwen2MoeConfig).
static void moe_to_hf_config(const struct llmq_hparams *hp, json_t *c) {
    const bool mix = hp->arch == LLMQ_ARCH_MIXTRAL;
    json_object_set_new(c, mix ? "num_local_experts" : "num_experts", json_integer(hp->n_expert));
    json_object_set_new(c, "num_experts_per_tok", json_integer(hp->n_expert_used));
    json_object_set_new(c, "output_router_logits", json_false());
    json_object_set_new(c, "router_aux_loss_coef", json_real(0.001));
    if (mix) {
        json_object_set_new(c, "router_jitter_noise", json_real(0.0));
        json_object_set_new(c, "sliding_window", json_null());
        return;
    }
    json_object_set_new(c, "moe_intermediate_size", json_integer(hp->n_ff_exp));
    if (hp->shexp) {
        json_object_set_new(c, "shared_expert_intermediate_size", json_integer(hp->n_ff_shexp));
        json_object_set_new(c, "qkv_bias", json_true());
    }
    json_object_set_new(c, "norm_topk_prob", json_boolean(hp->norm_topk_prob));
    json_object_set_new(c, "decoder_sparse_step", json_integer(1));
    json_object_set_new(c, "mlp_only_layers", json_array());
}

// phi3 LongRoPE as Phi3Config writes it: rope_scaling {"type": "longrope", short_factor, long_factor} and the
// top-level original_max_position_embeddings; factor and attention_factor only where they differ from what
// transformers derives without them (formats/llama/arch.h "LongRoPE").
static void longrope_to_hf_config(const struct llmq_hparams *hp, json_t *c) {
    const int64_t half = hp->n_rot / 2, orig = hp->rope_scaling.original_max_pos;
    json_t *rs = json_object(), *sf = json_array(), *lf = json_array();
    for (int64_t i = 0; i < half; i++) {
        json_array_append_new(sf, json_f32(hp->rope_scaling.short_factor[i]));
        json_array_append_new(lf, json_f32(hp->rope_scaling.long_factor[i]));
    }
    const float implied = (float)((double)hp->n_ctx_train / (double)orig);
    if (hp->rope_scaling.factor != implied) json_object_set_new(rs, "factor", json_f32(hp->rope_scaling.factor));
    if (hp->rope_scaling.attn_factor != llmq_longrope_attn_default(hp->rope_scaling.factor, orig))
        json_object_set_new(rs, "attention_factor", json_f32(hp->rope_scaling.attn_factor));
    json_object_set_new(rs, "long_factor", lf);
    json_object_set_new(rs, "short_factor", sf);
    json_object_set_new(rs, "type", json_string("longrope"));
    json_object_set_new(c, "rope_scaling", rs);
    json_object_set_new(c, "original_max_position_embeddings", json_integer(orig));
}

json_t *llmq_hparams_to_hf_config(const struct llmq_hparams *hp, int64_t bos, int64_t eos, int64_t pad,
                                  const char *torch_dtype) {
    bool qwen = hp->arch == LLMQ_ARCH_QWEN2 || hp->arch == LLMQ_ARCH_QWEN3 || hp->arch == LLMQ_ARCH_QWEN3_MOE ||
                hp->arch == LLMQ_ARCH_QWEN2_MOE;
    bool llama = !qwen && !hp->gemma && hp->arch != LLMQ_ARCH_PHI3 && !hp->moe;
    json_t *c = json_object();
    if (!c) return NULL;
    if (hp->gemma) gemma_to_hf_config(hp, c);
    json_object_set_new(c, "architectures", json_pack("[s]", llmq_arch_info_of(hp->arch)->hf_class));
    json_object_set_new(c, "model_type", json_string(llmq_arch_info_of(hp->arch)->hf_model_type));
    if (!hp->qkv_bias) json_object_set_new(c, "attention_bias", json_boolean(hp->attn_bias)); // qwen2(_moe): none
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    if (bos >= 0) json_object_set_new(c, "bos_token_id", json_integer(bos));
    if (eos >= 0) json_object_set_new(c, "eos_token_id", json_integer(eos));
    json_object_set_new(c, "head_dim", json_integer(hp->head_dim));
    if (!hp->gemma) json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(hp->n_embd));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(hp->n_ff));
    json_object_set_new(c, "max_position_embeddings", json_integer(hp->n_ctx_train));
    if (qwen) json_object_set_new(c, "max_window_layers", json_integer(hp->n_layer));
    if (llama) json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "num_attention_heads", json_integer(hp->n_head));
    json_object_set_new(c, "num_hidden_layers", json_integer(hp->n_layer));
    json_object_set_new(c, "num_key_value_heads", json_integer(hp->n_head_kv));
    if (pad >= 0) json_object_set_new(c, "pad_token_id", json_integer(pad));
    if (hp->n_rot != hp->head_dim) json_object_set_new(c, "partial_rotary_factor", json_rotary_factor(hp));
    if (llama) json_object_set_new(c, "pretraining_tp", json_integer(1));
    json_object_set_new(c, "rms_norm_eps", json_f32(hp->rms_eps));
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR)
        json_object_set_new(
            c, "rope_scaling",
            json_pack("{s:s, s:o}", "rope_type", "linear", "factor", json_f32(hp->rope_scaling.factor)));
    else if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LLAMA3)
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:o, s:o, s:o, s:I, s:s}", "factor", json_f32(hp->rope_scaling.factor),
                                      "high_freq_factor", json_f32(hp->rope_scaling.high_freq_factor),
                                      "low_freq_factor", json_f32(hp->rope_scaling.low_freq_factor),
                                      "original_max_position_embeddings", (json_int_t)hp->rope_scaling.original_max_pos,
                                      "rope_type", "llama3"));
    else if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LONGROPE)
        longrope_to_hf_config(hp, c);
    else
        json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "rope_theta", json_f32(hp->rope_theta));
    if (qwen) json_object_set_new(c, "sliding_window", json_null());
    json_object_set_new(c, "tie_word_embeddings", json_boolean(hp->tied_embeddings));
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype));
    json_object_set_new(c, "use_cache", json_true());
    if (qwen) json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "vocab_size", json_integer(hp->n_vocab));
    if (hp->moe) moe_to_hf_config(hp, c);
    return c;
}
