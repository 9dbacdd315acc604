// formats/llama/arch.c — the LLaMA-family description (formats/llama/arch.h).
#include "formats/llama/arch.h"

#include "common/status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// {gguf, hf, hf_gemma, per_block, linear, qk_rows, gemma_only, norm, moe_only, shexp_only}
static const struct llmq_tensor_name table[LLMQ_T_COUNT] = {
    [LLMQ_T_TOK_EMBD] = {"token_embd.weight", "model.embed_tokens.weight", NULL, false, -1, false, false, false},
    [LLMQ_T_OUTPUT_NORM] = {"output_norm.weight", "model.norm.weight", NULL, false, -1, false, false, true},
    [LLMQ_T_OUTPUT] = {"output.weight", "lm_head.weight", NULL, false, -1, false, false, false},
    [LLMQ_T_ATTN_NORM] = {"attn_norm.weight", "input_layernorm.weight", NULL, true, -1, false, false, true},
    [LLMQ_T_FFN_NORM] = {"ffn_norm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight", true,
                         -1, false, false, true},
    [LLMQ_T_LINEAR_0 + LLMQ_LIN_Q] = {"attn_q.weight", "self_attn.q_proj.weight", NULL, true, LLMQ_LIN_Q, true},
    [LLMQ_T_LINEAR_0 + LLMQ_LIN_K] = {"attn_k.weight", "self_attn.k_proj.weight", NULL, true, LLMQ_LIN_K, true},
    [LLMQ_T_LINEAR_0 + LLMQ_LIN_V] = {"attn_v.weight", "self_attn.v_proj.weight", NULL, true, LLMQ_LIN_V, false},
    [LLMQ_T_LINEAR_0 + LLMQ_LIN_O] = {"attn_output.weight", "self_attn.o_proj.weight", NULL, true, LLMQ_LIN_O, false},
    [LLMQ_T_LINEAR_0 + LLMQ_LIN_GATE] = {"ffn_gate.weight", "mlp.gate_proj.weight", NULL, true, LLMQ_LIN_GATE, false},
    [LLMQ_T_LINEAR_0 + LLMQ_LIN_UP] = {"ffn_up.weight", "mlp.up_proj.weight", NULL, true, LLMQ_LIN_UP, false},
    [LLMQ_T_LINEAR_0 + LLMQ_LIN_DOWN] = {"ffn_down.weight", "mlp.down_proj.weight", NULL, true, LLMQ_LIN_DOWN, false},
    [LLMQ_T_BIAS_Q] = {"attn_q.bias", "self_attn.q_proj.bias", NULL, true, LLMQ_LIN_Q, true},
    [LLMQ_T_BIAS_K] = {"attn_k.bias", "self_attn.k_proj.bias", NULL, true, LLMQ_LIN_K, true},
    [LLMQ_T_BIAS_V] = {"attn_v.bias", "self_attn.v_proj.bias", NULL, true, LLMQ_LIN_V, false},
    [LLMQ_T_BIAS_O] = {"attn_output.bias", "self_attn.o_proj.bias", NULL, true, LLMQ_LIN_O, false},
    [LLMQ_T_ATTN_Q_NORM] = {"attn_q_norm.weight", "self_attn.q_norm.weight", NULL, true, -1, false, false, true},
    [LLMQ_T_ATTN_K_NORM] = {"attn_k_norm.weight", "self_attn.k_norm.weight", NULL, true, -1, false, false, true},
    [LLMQ_T_ATTN_POST_NORM] = {"post_attention_norm.weight", "post_attention_layernorm.weight", NULL, true, -1, false,
                               true, true},
    [LLMQ_T_FFN_POST_NORM] = {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", NULL, true, -1, false, true,
                              true},
    // moe: the HF names are the family's (moe_hf below); the experts have one HF tensor per expert
    [LLMQ_T_FFN_GATE_INP] = {"ffn_gate_inp.weight", "mlp.gate.weight", NULL, true, -1, false, false, false, true},
    [LLMQ_T_FFN_GATE_EXPS] = {"ffn_gate_exps.weight", NULL, NULL, true, LLMQ_LIN_GATE, false, false, false, true},
    [LLMQ_T_FFN_UP_EXPS] = {"ffn_up_exps.weight", NULL, NULL, true, LLMQ_LIN_UP, false, false, false, true},
    [LLMQ_T_FFN_DOWN_EXPS] = {"ffn_down_exps.weight", NULL, NULL, true, LLMQ_LIN_DOWN, false, false, false, true},
    [LLMQ_T_FFN_GATE_INP_SHEXP] = {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", NULL, true, -1, false,
                                   false, false, true, true},
};

// The shared-expert families' dense MLP rows: the shared expert's gate, up, down (GGUF, HF).
static const char *const shexp_names[3][2] = {{"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
                                              {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
                                              {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"}};

// The moe families' HF names in a block: the router, and each expert's gate, up, down around its index.
struct moe_names {
    const char *router;
    const char *exp_prefix; // before the expert index
    const char *exp_lin[3]; // after it: gate, up, down
};
// GPTQModel 7.7's names of every moe family's block (its models/definitions/{mixtral,qwen2_moe,qwen3_moe}.py)
static const struct moe_names moe_gptqmodel = {
    "mlp.gate.weight", "mlp.experts.", {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"}};
static const struct moe_names moe_hf[LLMQ_ARCH_COUNT] = {
    [LLMQ_ARCH_MIXTRAL] = {"block_sparse_moe.gate.weight",
                           "block_sparse_moe.experts.",
                           {".w1.weight", ".w3.weight", ".w2.weight"}},
    [LLMQ_ARCH_QWEN3_MOE] = {"mlp.gate.weight",
                             "mlp.experts.",
                             {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"}},
    [LLMQ_ARCH_QWEN2_MOE] = {"mlp.gate.weight",
                             "mlp.experts.",
                             {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"}},
};

// The linears' stems: the table's weight names without ".weight", and the short names.
static const char *const lin_gguf[LLMQ_LIN_COUNT] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                     "ffn_gate", "ffn_up", "ffn_down"};
static const char *const lin_hf[LLMQ_LIN_COUNT] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                   "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                   "mlp.down_proj"};
static const char *const lin_short[LLMQ_LIN_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};

#define GGUF_BLOCK "blk."
#define HF_BLOCK "model.layers."

const struct llmq_tensor_name *llmq_tensor_name_of(enum llmq_tensor_role role) {
    LLMQ_ASSERT((unsigned)role < LLMQ_T_COUNT);
    return &table[role];
}

static bool arch_gemma(enum llmq_arch a) { return (unsigned)a < LLMQ_ARCH_COUNT && llmq_arch_info_of(a)->gemma; }

static bool arch_fused(enum llmq_arch a) { return (unsigned)a < LLMQ_ARCH_COUNT && llmq_arch_info_of(a)->fused; }

static bool arch_moe(enum llmq_arch a) { return (unsigned)a < LLMQ_ARCH_COUNT && llmq_arch_info_of(a)->moe; }

static bool arch_shexp(enum llmq_arch a) { return (unsigned)a < LLMQ_ARCH_COUNT && llmq_arch_info_of(a)->shexp; }

// The name of table row i in family a (NULL: not a tensor of a).
static const char *row_name(enum llmq_arch a, int i, bool hf) {
    const struct llmq_tensor_name *t = &table[i];
    if (t->gemma_only && !arch_gemma(a)) return NULL;
    if (t->shexp_only && !arch_shexp(a)) return NULL;
    if (arch_shexp(a) && i >= LLMQ_T_LINEAR_0 + LLMQ_LIN_GATE && i <= LLMQ_T_LINEAR_0 + LLMQ_LIN_DOWN)
        return shexp_names[i - (LLMQ_T_LINEAR_0 + LLMQ_LIN_GATE)][hf]; // the shared expert is the dense MLP
    if (t->moe_only && hf && i == LLMQ_T_FFN_GATE_INP_SHEXP) return t->hf;
    if (t->moe_only != arch_moe(a) && (t->moe_only || i == LLMQ_T_LINEAR_0 + LLMQ_LIN_GATE ||
                                       i == LLMQ_T_LINEAR_0 + LLMQ_LIN_UP || i == LLMQ_T_LINEAR_0 + LLMQ_LIN_DOWN))
        return NULL; // the router and experts are the moe families' only, the dense MLP theirs not
    if (t->moe_only && hf) return i == LLMQ_T_FFN_GATE_INP ? moe_hf[a].router : NULL;
    if (arch_fused(a)) { // phi3: q holds q, k, v; up holds gate, up (formats/llama/arch.h "Phi-3")
        if (i == LLMQ_T_LINEAR_0 + LLMQ_LIN_Q) return hf ? "self_attn.qkv_proj.weight" : "attn_qkv.weight";
        if (i == LLMQ_T_LINEAR_0 + LLMQ_LIN_UP) return hf ? "mlp.gate_up_proj.weight" : "ffn_up.weight";
        if (i == LLMQ_T_LINEAR_0 + LLMQ_LIN_K || i == LLMQ_T_LINEAR_0 + LLMQ_LIN_V ||
            i == LLMQ_T_LINEAR_0 + LLMQ_LIN_GATE)
            return NULL;
    }
    if (!hf) return t->gguf;
    return arch_gemma(a) && t->hf_gemma ? t->hf_gemma : t->hf;
}

const char *llmq_tensor_hf_name(enum llmq_arch a, enum llmq_tensor_role role) {
    LLMQ_ASSERT((unsigned)role < LLMQ_T_COUNT);
    const char *n = row_name(a, role, true);
    return n ? n : table[role].hf;
}

char *llmq_tensor_full_name(enum llmq_arch a, enum llmq_tensor_role role, int64_t layer, bool hf, char *buf,
                            size_t size) {
    const struct llmq_tensor_name *t = llmq_tensor_name_of(role);
    const char *n = row_name(a, role, hf);
    if (!n) n = hf && t->hf ? t->hf : t->gguf;
    if (t->per_block)
        snprintf(buf, size, "%s%lld.%s", hf ? HF_BLOCK : GGUF_BLOCK, (long long)layer, n);
    else
        snprintf(buf, size, "%s", n);
    return buf;
}

// Reads the decimal index at *p (no leading zeros, at most 6 digits) below limit; NULL when there is none.
static const char *read_index(const char *p, int64_t limit, int64_t *out) {
    const char *end;
    long long v = 0;
    for (end = p; *end >= '0' && *end <= '9' && end - p < 6; end++) v = v * 10 + (*end - '0');
    if (end == p || (end - p > 1 && *p == '0') || v >= limit) return NULL;
    *out = v;
    return end;
}

int llmq_tensor_role_of(enum llmq_arch a, const char *name, bool hf, int64_t n_layer, int64_t *layer) {
    const char *prefix = hf ? HF_BLOCK : GGUF_BLOCK;
    size_t plen = strlen(prefix);
    *layer = -1;
    if (strncmp(name, prefix, plen) == 0) {
        int64_t l = 0;
        const char *end = read_index(name + plen, n_layer, &l);
        if (!end || *end != '.') return -1;
        for (int i = 0; i < LLMQ_T_COUNT; i++) {
            const char *n = row_name(a, i, hf);
            if (!table[i].per_block || !n || strcmp(end + 1, n) != 0) continue;
            *layer = l;
            return i;
        }
        return -1;
    }
    for (int i = 0; i < LLMQ_T_COUNT; i++) {
        const char *n = row_name(a, i, hf);
        if (!table[i].per_block && n && strcmp(name, n) == 0) return i;
    }
    return -1;
}

static const struct moe_names *moe_names_of(enum llmq_arch a, enum llmq_expert_names n) {
    LLMQ_ASSERT(arch_moe(a) && (n == LLMQ_EXPERT_NAMES_HUB || n == LLMQ_EXPERT_NAMES_GPTQMODEL));
    return n == LLMQ_EXPERT_NAMES_GPTQMODEL ? &moe_gptqmodel : &moe_hf[a];
}

const char *llmq_expert_names_name(enum llmq_expert_names n) {
    return n == LLMQ_EXPERT_NAMES_GPTQMODEL ? "gptqmodel" : "hub";
}

bool llmq_expert_names_parse(const char *name, enum llmq_expert_names *out) {
    if (!name) return false;
    if (strcmp(name, "hub") == 0)
        *out = LLMQ_EXPERT_NAMES_HUB;
    else if (strcmp(name, "gptqmodel") == 0)
        *out = LLMQ_EXPERT_NAMES_GPTQMODEL;
    else
        return false;
    return true;
}

char *llmq_tensor_expert_hf_name(enum llmq_arch a, enum llmq_expert_names n, enum llmq_tensor_role role, int64_t layer,
                                 int64_t expert, char *buf, size_t size) {
    LLMQ_ASSERT(role >= LLMQ_T_FFN_GATE_EXPS && role <= LLMQ_T_FFN_DOWN_EXPS);
    const struct moe_names *t = moe_names_of(a, n);
    snprintf(buf, size, "%s%lld.%s%lld%s", HF_BLOCK, (long long)layer, t->exp_prefix, (long long)expert,
             t->exp_lin[role - LLMQ_T_FFN_GATE_EXPS]);
    return buf;
}

char *llmq_tensor_router_hf_name(enum llmq_arch a, enum llmq_expert_names n, int64_t layer, char *buf, size_t size) {
    snprintf(buf, size, "%s%lld.%s", HF_BLOCK, (long long)layer, moe_names_of(a, n)->router);
    return buf;
}

int llmq_tensor_expert_role_of(enum llmq_arch a, const char *name, int64_t n_layer, int64_t n_expert, int64_t *layer,
                               int64_t *expert) {
    size_t plen = strlen(HF_BLOCK);
    *layer = *expert = -1;
    if (!arch_moe(a) || strncmp(name, HF_BLOCK, plen) != 0) return -1;
    int64_t l, e;
    const char *p = read_index(name + plen, n_layer, &l);
    size_t xlen = strlen(moe_hf[a].exp_prefix);
    if (!p || *p != '.' || strncmp(p + 1, moe_hf[a].exp_prefix, xlen) != 0) return -1;
    if (!(p = read_index(p + 1 + xlen, n_expert, &e))) return -1;
    for (int k = 0; k < 3; k++)
        if (strcmp(p, moe_hf[a].exp_lin[k]) == 0) {
            *layer = l;
            *expert = e;
            return LLMQ_T_FFN_GATE_EXPS + k;
        }
    return -1;
}

bool llmq_tensor_norm_shifted(enum llmq_arch a, enum llmq_tensor_role role) {
    return arch_gemma(a) && (unsigned)role < LLMQ_T_COUNT && table[role].norm;
}

bool llmq_hparams_layer_swa(const struct llmq_hparams *hp, int64_t il) {
    if (hp->arch == LLMQ_ARCH_PHI3) return hp->sliding_window > 0; // every layer (modeling_phi3.py)
    if (!hp->gemma) return false;
    int64_t n = hp->swa_pattern;
    return n == 0 || il % n < n - 1;
}

const char *llmq_linear_gguf_name(enum llmq_linear l) { return (unsigned)l < LLMQ_LIN_COUNT ? lin_gguf[l] : "?"; }
const char *llmq_linear_hf_name(enum llmq_linear l) { return (unsigned)l < LLMQ_LIN_COUNT ? lin_hf[l] : "?"; }
char *llmq_linear_full_name(enum llmq_linear l, int64_t layer, bool hf, char *buf, size_t size) {
    snprintf(buf, size, "%s%lld.%s", hf ? HF_BLOCK : GGUF_BLOCK, (long long)layer,
             hf ? llmq_linear_hf_name(l) : llmq_linear_gguf_name(l));
    return buf;
}
const char *llmq_linear_name(enum llmq_linear l) { return (unsigned)l < LLMQ_LIN_COUNT ? lin_short[l] : "?"; }

char *llmq_arch_linear_full_name(enum llmq_arch a, enum llmq_linear l, int64_t layer, bool hf, char *buf, size_t size) {
    if (!arch_shexp(a) || l < LLMQ_LIN_GATE || l > LLMQ_LIN_DOWN) return llmq_linear_full_name(l, layer, hf, buf, size);
    const char *n = shexp_names[l - LLMQ_LIN_GATE][hf];
    snprintf(buf, size, "%s%lld.%.*s", hf ? HF_BLOCK : GGUF_BLOCK, (long long)layer,
             (int)(strlen(n) - strlen(".weight")), n);
    return buf;
}

bool llmq_arch_fused_part(const struct llmq_hparams *hp, enum llmq_linear l, enum llmq_linear *head, int64_t *r0,
                          int64_t *total) {
    if (!arch_fused(hp->arch) || l == LLMQ_LIN_O || l == LLMQ_LIN_DOWN || (unsigned)l >= LLMQ_LIN_COUNT) return false;
    const int64_t Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    const bool attn = l <= LLMQ_LIN_V;
    *head = attn ? LLMQ_LIN_Q : LLMQ_LIN_UP;
    *total = attn ? Dq + 2 * Dkv : 2 * F;
    *r0 = l == LLMQ_LIN_Q || l == LLMQ_LIN_GATE ? 0 : l == LLMQ_LIN_K ? Dq : l == LLMQ_LIN_V ? Dq + Dkv : F;
    return true;
}

// {name, hf_model_type, hf_class, gguf_name, qk_permuted, qkv_bias, qk_norm, gemma, always_tied, swa_pattern, fused,
//  moe, shexp}
static const struct llmq_arch_info archs[LLMQ_ARCH_COUNT] = {
    [LLMQ_ARCH_LLAMA] = {"llama", "llama", "LlamaForCausalLM", "llama", true, false, false, false, false, 0},
    [LLMQ_ARCH_MISTRAL] = {"mistral", "mistral", "MistralForCausalLM", "llama", true, false, false, false, false, 0},
    [LLMQ_ARCH_QWEN2] = {"qwen2", "qwen2", "Qwen2ForCausalLM", "qwen2", false, true, false, false, false, 0},
    [LLMQ_ARCH_QWEN3] = {"qwen3", "qwen3", "Qwen3ForCausalLM", "qwen3", false, false, true, false, false, 0},
    [LLMQ_ARCH_GEMMA2] = {"gemma2", "gemma2", "Gemma2ForCausalLM", "gemma2", false, false, false, true, true, 2},
    [LLMQ_ARCH_GEMMA3] = {"gemma3", "gemma3_text", "Gemma3ForCausalLM", "gemma3", false, false, true, true, false, 6},
    [LLMQ_ARCH_PHI3] = {"phi3", "phi3", "Phi3ForCausalLM", "phi3", false, false, false, false, false, 0, true},
    [LLMQ_ARCH_MIXTRAL] = {"mixtral", "mixtral", "MixtralForCausalLM", "llama", true, false, false, false, false, 0,
                           false, true},
    [LLMQ_ARCH_QWEN3_MOE] = {"qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe", false, false, true, false,
                             false, 0, false, true},
    [LLMQ_ARCH_QWEN2_MOE] = {"qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM", "qwen2moe", false, true, false, false,
                             false, 0, false, true, true},
};

const struct llmq_arch_info *llmq_arch_info_of(enum llmq_arch a) {
    LLMQ_ASSERT((unsigned)a < LLMQ_ARCH_COUNT);
    return &archs[a];
}

const char *llmq_arch_name(enum llmq_arch a) { return (unsigned)a < LLMQ_ARCH_COUNT ? archs[a].name : "?"; }

int llmq_arch_find(const char *s, enum llmq_arch_key key) {
    for (int a = 0; a < LLMQ_ARCH_COUNT; a++) {
        const char *n = key == LLMQ_ARCH_KEY_HF_CLASS  ? archs[a].hf_class
                        : key == LLMQ_ARCH_KEY_HF_TYPE ? archs[a].hf_model_type
                                                       : archs[a].name;
        if (strcmp(s, n) == 0) return a;
    }
    if (key == LLMQ_ARCH_KEY_GGUF) // a GGUF name that is not llmq's name of a family ("qwen3moe")
        for (int a = 0; a < LLMQ_ARCH_COUNT; a++)
            if (strcmp(s, archs[a].gguf_name) == 0) return a;
    return -1;
}

bool llmq_arch_qk_permuted(enum llmq_arch a) { return llmq_arch_info_of(a)->qk_permuted; }

int64_t llmq_arch_qk_src_row(int64_t r, int64_t n_rows, int64_t n_head, bool to_gguf) {
    LLMQ_ASSERT(n_head > 0 && n_rows % (2 * n_head) == 0 && r >= 0 && r < n_rows);
    int64_t hd = n_rows / n_head, half = hd / 2, h = r / hd, k = r % hd;
    if (to_gguf) return h * hd + (k % 2) * half + k / 2; // GGUF row (i, j) = (k / 2, k % 2) <- HF row (j, i)
    return h * hd + 2 * (k % half) + k / half;           // HF row (j, i) = (k / half, k % half) <- GGUF row (i, j)
}

void llmq_rope_llama3_factors(const struct llmq_hparams *hp, float *ff) {
    int64_t half = hp->n_rot / 2;
    for (int64_t i = 0; i < half; i++) ff[i] = 1.0f;
    if (hp->rope_scaling.type != LLMQ_ROPE_SCALING_LLAMA3) return;
    // convert_hf_to_gguf.py LlamaModel (rope_type "llama3"): wavelengths beyond the original
    // context are slowed down by `factor`, short ones kept, the band between interpolated.
    double factor = hp->rope_scaling.factor, lo = hp->rope_scaling.low_freq_factor;
    double hi = hp->rope_scaling.high_freq_factor, old_ctx = (double)hp->rope_scaling.original_max_pos;
    double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    for (int64_t i = 0; i < half; i++) {
        float freq = 1.0f / powf(hp->rope_theta, (float)(2 * i) / (float)hp->n_rot);
        double wavelen = 2.0 * M_PI / freq;
        if (wavelen < hi_wavelen)
            ff[i] = 1.0f;
        else if (wavelen > lo_wavelen)
            ff[i] = (float)factor;
        else {
            double smooth = (old_ctx / wavelen - lo) / (hi - lo);
            ff[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
}

bool llmq_rope_longrope_long(const struct llmq_hparams *hp, int64_t ctx, int64_t seqlen) {
    if (hp->rope_scaling.type != LLMQ_ROPE_SCALING_LONGROPE) return false;
    return (ctx > 0 ? ctx : seqlen) > hp->rope_scaling.original_max_pos;
}

float llmq_longrope_attn_default(double factor, int64_t original_max_pos) {
    if (!(factor > 1.0) || original_max_pos < 2) return 1.0f;
    return (float)sqrt(1.0 + log(factor) / log((double)original_max_pos));
}
