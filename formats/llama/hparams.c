// formats/llama/hparams.c — the one reader and writer of the LLaMA-family hyper-parameters, GGUF keys
// and HF config.json (contracts and the key table: formats/llama/arch.h "Hyper-parameters").
// Mirrors llama.cpp's llm_load_hparams (the keys read) and convert_hf_to_gguf.py (the keys written, their
// order), and transformers' LlamaConfig / Qwen2Config / Qwen3Config (config.json keys and defaults).
#include "formats/llama/arch.h"

#include "common/io.h"
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
    hp->rope_type = gguf && ai->qk_permuted ? LLMQ_ROPE_NORM : LLMQ_ROPE_NEOX;
}

// The checks of llmq_hparams_check; n_vocab only when vocab (config.json may lack vocab_size).
static enum llmq_status check(const struct llmq_hparams *hp, const char *file, bool vocab) {
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
    if (hp->n_head * hp->head_dim > LLMQ_HPARAMS_MAX_DIM)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: n_head x head_dim is too large", file);
    if (!(hp->rms_eps > 0.0f) || !isfinite(hp->rms_eps))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rms norm epsilon %g must be positive", file, (double)hp->rms_eps);
    if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rope theta %g must be positive", file, (double)hp->rope_theta);
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR && !(hp->rope_scaling.factor > 0.0f))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: linear rope scaling factor %g must be positive", file,
                           (double)hp->rope_scaling.factor);
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

enum llmq_status llmq_hparams_from_gguf(const struct llmq_gguf *g, int64_t n_ctx_absent, struct llmq_hparams *hp) {
    const char *path = llmq_gguf_path(g), *arch = NULL, *type = NULL;
    int64_t vlen = 0, rdim = 0, kv_vocab = 0;
    char key[128], name[64];
    enum llmq_status st;
    memset(hp, 0, sizeof *hp);
    if ((st = llmq_gguf_get_str(g, "general.architecture", &arch))) return st;
    int a = llmq_arch_find(arch, false);
    if (a < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: general.architecture \"%s\" is not supported (" LLMQ_ARCH_NAMES ")", path, arch);
    set_arch(hp, a, true);
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
    if (vlen != hp->head_dim || rdim != hp->head_dim)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: %s.attention.key_length %lld, .value_length %lld and .rope.dimension_count %lld differ "
                           "(partial RoPE is not supported)",
                           path, arch, (long long)hp->head_dim, (long long)vlen, (long long)rdim);
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
    hp->tied_embeddings = llmq_gguf_find_tensor(g, llmq_tensor_name_of(LLMQ_T_OUTPUT)->gguf) == NULL;
    llmq_tensor_full_name(LLMQ_T_BIAS_Q, 0, false, name, sizeof name);
    hp->attn_bias = !hp->qkv_bias && llmq_gguf_find_tensor(g, name) != NULL;
    return check(hp, path, true);
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
    if (hp->head_dim != hp->n_embd / hp->n_head &&
        ((st = llmq_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim)) ||
         (st = llmq_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim))))
        return st;
    if ((file_type >= 0 && (st = llmq_gguf_writer_set_u32(w, "general.file_type", (uint32_t)file_type))) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->head_dim)))
        return st;
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR &&
        ((st = llmq_gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear")) ||
         (st = llmq_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), hp->rope_scaling.factor))))
        return st;
#undef KEY
    return LLMQ_OK;
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

// rope_scaling, else rope_parameters (transformers 5 writes rope_theta and the scaling there, same keys).
static enum llmq_status cfg_rope_scaling(const struct cfg *c, struct llmq_hparams *hp) {
    const bool scaling = cfg_get(c, "rope_scaling") != NULL;
    const char *key = scaling ? "rope_scaling" : "rope_parameters";
    const json_t *rs = cfg_get(c, key);
    if (!rs) return LLMQ_OK;
    if (!json_is_object(rs)) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"%s\" is not an object", c->file, key);
    const json_t *t = json_object_get(rs, "rope_type"); // transformers: rope_type, else the older "type"
    if (!t) t = json_object_get(rs, "type");
    if (!json_is_string(t)) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s has no string \"rope_type\"", c->file, key);
    const char *type = json_string_value(t);
    struct cfg r = {c->file, rs, scaling ? "rope_scaling." : "rope_parameters."};
    enum llmq_status st;
    if (!cfg_get(c, "rope_theta") && (st = cfg_float(&r, "rope_theta", false, 10000.0, &hp->rope_theta))) return st;
    if (strcmp(type, "default") == 0) return LLMQ_OK;
    if (strcmp(type, "linear") == 0) {
        hp->rope_scaling.type = LLMQ_ROPE_SCALING_LINEAR;
        return cfg_float(&r, "factor", true, 0, &hp->rope_scaling.factor);
    }
    if (strcmp(type, "llama3") != 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: rope_scaling type \"%s\" is not supported (linear, llama3)",
                           c->file, type);
    hp->rope_scaling.type = LLMQ_ROPE_SCALING_LLAMA3;
    if ((st = cfg_float(&r, "factor", true, 0, &hp->rope_scaling.factor)) ||
        (st = cfg_float(&r, "low_freq_factor", true, 0, &hp->rope_scaling.low_freq_factor)) ||
        (st = cfg_float(&r, "high_freq_factor", true, 0, &hp->rope_scaling.high_freq_factor)) ||
        (st = cfg_int(&r, "original_max_position_embeddings", true, 0, &hp->rope_scaling.original_max_pos)))
        return st;
    return LLMQ_OK;
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
        a = llmq_arch_find(type, false);
    } else if ((type = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0)))) {
        a = llmq_arch_find(type, true); // no model_type: the class, as transformers' AutoConfig falls back
    }
    if (!type) return cfg_missing(&c, "model_type");
    if (a < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (" LLMQ_ARCH_NAMES ")", file,
                           type);
    set_arch(hp, a, false);
    const json_t *act = cfg_get(&c, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\"", file);
    if ((st = cfg_int(&c, "hidden_size", true, 0, &hp->n_embd)) ||
        (st = cfg_int(&c, "intermediate_size", true, 0, &hp->n_ff)) ||
        (st = cfg_int(&c, "num_hidden_layers", true, 0, &hp->n_layer)) ||
        (st = cfg_int(&c, "num_attention_heads", true, 0, &hp->n_head)) ||
        (st = cfg_int(&c, "num_key_value_heads", false, hp->n_head, &hp->n_head_kv)))
        return st;
    if (hp->n_head < 1)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: num_attention_heads = %lld must be >= 1", file,
                           (long long)hp->n_head);
    if ((st = cfg_int(&c, "head_dim", false, hp->n_embd / hp->n_head, &hp->head_dim)) ||
        (st = cfg_int(&c, "vocab_size", false, -1, &vocab)) ||
        (st = cfg_int(&c, "max_position_embeddings", false, n_ctx_absent, &hp->n_ctx_train)) ||
        (st = cfg_float(&c, "rms_norm_eps", false, 1e-6, &hp->rms_eps)) ||
        (st = cfg_float(&c, "rope_theta", false, 10000.0, &hp->rope_theta)) ||
        (st = cfg_bool(&c, "tie_word_embeddings", &hp->tied_embeddings)) ||
        (st = cfg_bool(&c, "attention_bias", &hp->attn_bias)) || (st = cfg_bool(&c, "mlp_bias", &mlp_bias)) ||
        (st = cfg_rope_scaling(&c, hp)))
        return st;
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

json_t *llmq_hparams_to_hf_config(const struct llmq_hparams *hp, int64_t bos, int64_t eos, int64_t pad,
                                  const char *torch_dtype) {
    bool qwen = hp->arch == LLMQ_ARCH_QWEN2 || hp->arch == LLMQ_ARCH_QWEN3;
    json_t *c = json_object();
    if (!c) return NULL;
    json_object_set_new(c, "architectures", json_pack("[s]", llmq_arch_info_of(hp->arch)->hf_class));
    json_object_set_new(c, "model_type", json_string(llmq_arch_name(hp->arch)));
    if (hp->arch != LLMQ_ARCH_QWEN2) json_object_set_new(c, "attention_bias", json_boolean(hp->attn_bias));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    if (bos >= 0) json_object_set_new(c, "bos_token_id", json_integer(bos));
    if (eos >= 0) json_object_set_new(c, "eos_token_id", json_integer(eos));
    json_object_set_new(c, "head_dim", json_integer(hp->head_dim));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(hp->n_embd));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(hp->n_ff));
    json_object_set_new(c, "max_position_embeddings", json_integer(hp->n_ctx_train));
    if (qwen) json_object_set_new(c, "max_window_layers", json_integer(hp->n_layer));
    if (!qwen) json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "num_attention_heads", json_integer(hp->n_head));
    json_object_set_new(c, "num_hidden_layers", json_integer(hp->n_layer));
    json_object_set_new(c, "num_key_value_heads", json_integer(hp->n_head_kv));
    if (pad >= 0) json_object_set_new(c, "pad_token_id", json_integer(pad));
    if (!qwen) json_object_set_new(c, "pretraining_tp", json_integer(1));
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
    else
        json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "rope_theta", json_f32(hp->rope_theta));
    if (qwen) json_object_set_new(c, "sliding_window", json_null());
    json_object_set_new(c, "tie_word_embeddings", json_boolean(hp->tied_embeddings));
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype));
    json_object_set_new(c, "use_cache", json_true());
    if (qwen) json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "vocab_size", json_integer(hp->n_vocab));
    return c;
}
