// quant/gguf_mix.c — llama.cpp's per-tensor type choice (see quant/gguf_mix.h for the rules and
// their source in src/llama-quant.cpp).
#include "quant/gguf_mix.h"

#include "common/log.h"

#include <ctype.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- ftypes ----------------------------------------------------------------------------------------

static const struct {
    enum llmq_gguf_ftype f;
    const char *name;
    enum llmq_dtype type; // llama_ftype_get_default_type
} ftypes[] = {
    {LLMQ_GGUF_FTYPE_Q8_0, "Q8_0", LLMQ_DTYPE_Q8_0},       {LLMQ_GGUF_FTYPE_Q6_K, "Q6_K", LLMQ_DTYPE_Q6_K},
    {LLMQ_GGUF_FTYPE_Q5_K_M, "Q5_K_M", LLMQ_DTYPE_Q5_K},   {LLMQ_GGUF_FTYPE_Q5_K_S, "Q5_K_S", LLMQ_DTYPE_Q5_K},
    {LLMQ_GGUF_FTYPE_Q5_0, "Q5_0", LLMQ_DTYPE_Q5_0},       {LLMQ_GGUF_FTYPE_Q5_1, "Q5_1", LLMQ_DTYPE_Q5_1},
    {LLMQ_GGUF_FTYPE_Q4_K_M, "Q4_K_M", LLMQ_DTYPE_Q4_K},   {LLMQ_GGUF_FTYPE_Q4_K_S, "Q4_K_S", LLMQ_DTYPE_Q4_K},
    {LLMQ_GGUF_FTYPE_Q4_0, "Q4_0", LLMQ_DTYPE_Q4_0},       {LLMQ_GGUF_FTYPE_Q4_1, "Q4_1", LLMQ_DTYPE_Q4_1},
    {LLMQ_GGUF_FTYPE_Q3_K_L, "Q3_K_L", LLMQ_DTYPE_Q3_K},   {LLMQ_GGUF_FTYPE_Q3_K_M, "Q3_K_M", LLMQ_DTYPE_Q3_K},
    {LLMQ_GGUF_FTYPE_Q3_K_S, "Q3_K_S", LLMQ_DTYPE_Q3_K},   {LLMQ_GGUF_FTYPE_Q2_K, "Q2_K", LLMQ_DTYPE_Q2_K},
    {LLMQ_GGUF_FTYPE_IQ4_NL, "IQ4_NL", LLMQ_DTYPE_IQ4_NL}, {LLMQ_GGUF_FTYPE_IQ4_XS, "IQ4_XS", LLMQ_DTYPE_IQ4_XS},
    {LLMQ_GGUF_FTYPE_F16, "F16", LLMQ_DTYPE_F16},          {LLMQ_GGUF_FTYPE_BF16, "BF16", LLMQ_DTYPE_BF16},
    {LLMQ_GGUF_FTYPE_F32, "F32", LLMQ_DTYPE_F32},
};
#define N_FTYPES ((int)(sizeof(ftypes) / sizeof(ftypes[0])))

bool llmq_gguf_ftype_parse(const char *s, enum llmq_gguf_ftype *out) {
    static const struct {
        const char *alias;
        enum llmq_gguf_ftype f;
    } aliases[] = {
        {"Q3_K", LLMQ_GGUF_FTYPE_Q3_K_M}, {"Q4_K", LLMQ_GGUF_FTYPE_Q4_K_M}, {"Q5_K", LLMQ_GGUF_FTYPE_Q5_K_M}};
    if (!s) return false;
    for (int i = 0; i < N_FTYPES; i++)
        if (!strcasecmp(s, ftypes[i].name)) {
            *out = ftypes[i].f;
            return true;
        }
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (!strcasecmp(s, aliases[i].alias)) {
            *out = aliases[i].f;
            return true;
        }
    return false;
}

const char *llmq_gguf_ftype_name(enum llmq_gguf_ftype f) {
    for (int i = 0; i < N_FTYPES; i++)
        if (ftypes[i].f == f) return ftypes[i].name;
    return "?";
}

enum llmq_dtype llmq_gguf_ftype_default_type(enum llmq_gguf_ftype f) {
    for (int i = 0; i < N_FTYPES; i++)
        if (ftypes[i].f == f) return ftypes[i].type;
    return LLMQ_DTYPE_INVALID;
}

const char *llmq_gguf_ftype_list(void) {
    return "Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_0, Q5_1, Q4_K_M, Q4_K_S, Q4_0, Q4_1, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K, IQ4_NL, "
           "IQ4_XS, F16, BF16, F32";
}

bool llmq_gguf_mix_type_ok(enum llmq_dtype t) {
    switch (t) {
    case LLMQ_DTYPE_F32:
    case LLMQ_DTYPE_F16:
    case LLMQ_DTYPE_BF16:
    case LLMQ_DTYPE_Q4_0:
    case LLMQ_DTYPE_Q4_1:
    case LLMQ_DTYPE_Q5_0:
    case LLMQ_DTYPE_Q5_1:
    case LLMQ_DTYPE_Q8_0:
    case LLMQ_DTYPE_Q2_K:
    case LLMQ_DTYPE_Q3_K:
    case LLMQ_DTYPE_Q4_K:
    case LLMQ_DTYPE_Q5_K:
    case LLMQ_DTYPE_Q6_K:
    case LLMQ_DTYPE_IQ4_NL:
    case LLMQ_DTYPE_IQ4_XS: return true;
    default: return false;
    }
}

struct llmq_gguf_mix_opts llmq_gguf_mix_default_opts(void) {
    return (struct llmq_gguf_mix_opts){
        .ftype = LLMQ_GGUF_FTYPE_Q8_0, .output_type = LLMQ_DTYPE_COUNT, .embedding_type = LLMQ_DTYPE_COUNT};
}

enum llmq_status llmq_gguf_tensor_type_parse(const char *arg, struct llmq_gguf_tensor_type *out) {
    const char *sep = arg ? strchr(arg, '=') : NULL;
    memset(out, 0, sizeof(*out));
    if (!sep) return llmq_errorf(LLMQ_ERR_ARG, "--tensor-type '%s': expected REGEX=TYPE", arg ? arg : "");
    if (sep == arg) return llmq_errorf(LLMQ_ERR_ARG, "--tensor-type '%s': missing tensor name regex", arg);
    if (!sep[1]) return llmq_errorf(LLMQ_ERR_ARG, "--tensor-type '%s': missing type", arg);
    enum llmq_dtype t = llmq_dtype_from_name(sep + 1);
    if (t == LLMQ_DTYPE_INVALID)
        return llmq_errorf(LLMQ_ERR_ARG, "--tensor-type '%s': unknown type '%s'", arg, sep + 1);
    if (!llmq_gguf_mix_type_ok(t))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "--tensor-type '%s': llmq cannot write type %s into a GGUF", arg,
                           llmq_dtype_name(t));
    size_t n = (size_t)(sep - arg);
    char *re = malloc(n + 1);
    if (!re) return llmq_errorf(LLMQ_ERR_NOMEM, "--tensor-type: out of memory");
    for (size_t i = 0; i < n; i++) re[i] = (char)tolower((unsigned char)arg[i]);
    re[n] = 0;
    regex_t rx;
    int rc = regcomp(&rx, re, REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char msg[128];
        regerror(rc, &rx, msg, sizeof(msg));
        free(re);
        return llmq_errorf(LLMQ_ERR_ARG, "--tensor-type '%s': bad regex: %s", arg, msg);
    }
    regfree(&rx);
    out->regex = re;
    out->type = t;
    return LLMQ_OK;
}

void llmq_gguf_mix_model_from_hparams(const struct llmq_hparams *hp, struct llmq_gguf_mix_model *out) {
    out->n_layer = hp->n_layer;
    out->n_head = hp->n_head;
    out->n_head_kv = hp->n_head_kv;
    out->n_expert = hp->moe ? hp->n_expert : 0; // llama.cpp hparams.n_expert (<arch>.expert_count)
    // src/models/llama.cpp: 80 layers -> 65B when n_head == n_head_kv, else 70B; qwen2: 80 -> 70B
    out->is_70b = hp->n_layer == 80 && (hp->arch == LLMQ_ARCH_QWEN2 || hp->n_head != hp->n_head_kv);
}

int llmq_gguf_mix_name_cmp(const char *a, const char *b) {
    int la = -1, lb = -1;
    if (sscanf(a, "blk.%d.", &la) != 1) la = -1;
    if (sscanf(b, "blk.%d.", &lb) != 1) lb = -1;
    if (la != lb) return la < lb ? -1 : 1;
    return strcmp(a, b);
}

// ---- the rules ---------------------------------------------------------------------------------------

enum category {
    CAT_TOKEN_EMBD,
    CAT_ATTN_Q,
    CAT_ATTN_V,
    CAT_ATTN_K,
    CAT_ATTN_QKV,
    CAT_ATTN_KV_B,
    CAT_ATTN_OUTPUT,
    CAT_FFN_UP,
    CAT_FFN_GATE,
    CAT_FFN_DOWN,
    CAT_OUTPUT,
    CAT_OTHER
};

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static enum category category_of(const char *name) { // tensor_get_category, in its order
    if (!strcmp(name, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight")) return CAT_TOKEN_EMBD;
    if (has(name, "attn_qkv.weight")) return CAT_ATTN_QKV;
    if (has(name, "attn_kv_b.weight")) return CAT_ATTN_KV_B;
    if (has(name, "attn_v.weight")) return CAT_ATTN_V;
    if (has(name, "attn_k.weight")) return CAT_ATTN_K;
    if (has(name, "attn_q.weight")) return CAT_ATTN_Q;
    if (has(name, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    if (has(name, "ffn_up")) return CAT_FFN_UP;
    if (has(name, "ffn_gate")) return CAT_FFN_GATE;
    if (has(name, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

static bool is_attn_v(enum category c) { return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B; }

// ggml_n_dims: the number of dims up to the last one that is not 1 (at least 1).
static int ggml_n_dims_of(const struct llmq_gguf_mix_tensor *t) {
    int n = 1;
    for (int d = 0; d < t->n_dims; d++) // shape is outermost first: shape[0] is ne[n_dims - 1]
        if (t->shape[d] != 1) {
            n = t->n_dims - d;
            break;
        }
    return n;
}

static int64_t row_len(const struct llmq_gguf_mix_tensor *t) { return t->n_dims > 0 ? t->shape[t->n_dims - 1] : 1; }

static bool allows_quantization(const struct llmq_gguf_mix_tensor *t) { // tensor_allows_quantization
    static const char *const never[] = {"_norm.weight",
                                        "ffn_gate_inp.weight",
                                        "ffn_gate_tid2eid.weight",
                                        "altup",
                                        "laurel",
                                        "per_layer_model_proj",
                                        "ssm_conv1d",
                                        "shortconv.conv.weight",
                                        "indexer.k_proj.weight",
                                        "indexer.q_proj.weight",
                                        "time_mix_first.weight",
                                        "time_mix_w0.weight",
                                        "time_mix_w1.weight",
                                        "time_mix_w2.weight",
                                        "time_mix_v0.weight",
                                        "time_mix_v1.weight",
                                        "time_mix_v2.weight",
                                        "time_mix_a0.weight",
                                        "time_mix_a1.weight",
                                        "time_mix_a2.weight",
                                        "time_mix_g1.weight",
                                        "time_mix_g2.weight",
                                        "time_mix_decay_w1.weight",
                                        "time_mix_decay_w2.weight",
                                        "time_mix_lerp_fused.weight",
                                        "attn_rel_b.weight",
                                        ".position_embd",
                                        "sam.pos_embd",
                                        "sam.neck.",
                                        "sam.net_",
                                        ".rel_pos",
                                        ".patch_embd",
                                        ".patch_merger",
                                        "a.rvq.codebook",
                                        "mm.a.code_embd"};
    if (ggml_n_dims_of(t) < 2) return false;
    size_t n = strlen(t->name);
    if (n < 6 || strcmp(t->name + n - 6, "weight") != 0) return false;
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
        if (has(t->name, never[i])) return false;
    return strcmp(t->name, "position_embd.weight") != 0 && strcmp(t->name, "token_types.weight") != 0;
}

struct state {
    const struct llmq_gguf_mix_model *mm;
    const struct llmq_gguf_mix_opts *o;
    regex_t *rx; // (o->n_overrides) compiled
    int n_attention_wv, i_attention_wv, n_ffn_down, i_ffn_down, n_ffn_gate, i_ffn_gate, n_ffn_up, i_ffn_up;
    bool tied;
};

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int64_t blck(enum llmq_dtype t) { return llmq_dtype_traits(t)->blck; }

// The layer of an ffn tensor: the counter, or (n_expert > 1) the "blk.%d." of its name.
static int layer_of(const struct state *s, int counter, const char *name) {
    int l = counter;
    if (s->mm->n_expert > 1 && sscanf(name, "blk.%d.", &l) != 1) l = counter;
    return l;
}

// llama_tensor_get_type_impl for the ftypes llmq supports (no IQ1/IQ2/IQ3, TQ, MXFP4, Q2_K_S branches).
static enum llmq_dtype mix_rule(struct state *s, enum llmq_dtype t, const struct llmq_gguf_mix_tensor *x,
                                enum category cat) {
    const enum llmq_gguf_ftype f = s->o->ftype;
    const int64_t n_gqa = s->mm->n_head_kv > 0 ? s->mm->n_head / s->mm->n_head_kv : 0;
    const int64_t n_expert = s->mm->n_expert;
    if (cat == CAT_OUTPUT || (s->tied && cat == CAT_TOKEN_EMBD)) {
        if (s->o->output_type != LLMQ_DTYPE_COUNT)
            t = s->o->output_type;
        else if (row_len(x) % blck(t) != 0)
            t = LLMQ_DTYPE_Q8_0;
        else if (t != LLMQ_DTYPE_Q8_0)
            t = LLMQ_DTYPE_Q6_K;
    } else if (cat == CAT_TOKEN_EMBD) {
        if (s->o->embedding_type != LLMQ_DTYPE_COUNT) t = s->o->embedding_type;
    } else if (is_attn_v(cat)) {
        if (f == LLMQ_GGUF_FTYPE_Q2_K)
            t = n_gqa >= 4 ? LLMQ_DTYPE_Q4_K : LLMQ_DTYPE_Q3_K;
        else if (f == LLMQ_GGUF_FTYPE_Q3_K_M)
            t = s->i_attention_wv < 2 ? LLMQ_DTYPE_Q5_K : LLMQ_DTYPE_Q4_K;
        else if (f == LLMQ_GGUF_FTYPE_Q3_K_L)
            t = LLMQ_DTYPE_Q5_K;
        else if ((f == LLMQ_GGUF_FTYPE_IQ4_NL || f == LLMQ_GGUF_FTYPE_IQ4_XS) && n_gqa >= 4)
            t = LLMQ_DTYPE_Q5_K;
        else if ((f == LLMQ_GGUF_FTYPE_Q4_K_M || f == LLMQ_GGUF_FTYPE_Q5_K_M) &&
                 use_more_bits(s->i_attention_wv, s->n_attention_wv))
            t = LLMQ_DTYPE_Q6_K;
        else if (f == LLMQ_GGUF_FTYPE_Q4_K_S && s->i_attention_wv < 4)
            t = LLMQ_DTYPE_Q5_K;
        if (s->mm->is_70b && (t == LLMQ_DTYPE_Q3_K || t == LLMQ_DTYPE_Q4_K)) t = LLMQ_DTYPE_Q5_K;
        if (n_expert == 8) t = LLMQ_DTYPE_Q8_0;
        ++s->i_attention_wv;
    } else if (cat == CAT_ATTN_K) {
        if (n_expert == 8) t = LLMQ_DTYPE_Q8_0;
    } else if (cat == CAT_ATTN_Q) {
        // only IQ3_XS / IQ3_XXS change attn_q
    } else if (cat == CAT_FFN_DOWN) {
        int i = layer_of(s, s->i_ffn_down, x->name), n = s->n_ffn_down;
        if (f == LLMQ_GGUF_FTYPE_Q2_K)
            t = LLMQ_DTYPE_Q3_K;
        else if (f == LLMQ_GGUF_FTYPE_Q3_K_M)
            t = i < n / 16 ? LLMQ_DTYPE_Q5_K : LLMQ_DTYPE_Q4_K; // arch != FALCON
        else if (f == LLMQ_GGUF_FTYPE_Q3_K_L)
            t = LLMQ_DTYPE_Q5_K;
        else if (f == LLMQ_GGUF_FTYPE_Q4_K_M) {
            if (use_more_bits(i, n)) t = LLMQ_DTYPE_Q6_K;
        } else if (i < n / 8 && (f == LLMQ_GGUF_FTYPE_IQ4_NL || f == LLMQ_GGUF_FTYPE_IQ4_XS) && !s->o->have_imatrix)
            t = LLMQ_DTYPE_Q5_K;
        else if (f == LLMQ_GGUF_FTYPE_Q5_K_M && use_more_bits(i, n))
            t = LLMQ_DTYPE_Q6_K;
        else if (f == LLMQ_GGUF_FTYPE_Q4_K_S && i < n / 8)
            t = LLMQ_DTYPE_Q5_K;
        else if ((f == LLMQ_GGUF_FTYPE_Q4_0 || f == LLMQ_GGUF_FTYPE_Q5_0) && s->o->have_imatrix && i < n / 8)
            t = f == LLMQ_GGUF_FTYPE_Q4_0 ? LLMQ_DTYPE_Q4_1 : LLMQ_DTYPE_Q5_1;
        ++s->i_ffn_down;
    } else if (cat == CAT_ATTN_OUTPUT) {
        if (n_expert == 8) {
            if (f == LLMQ_GGUF_FTYPE_Q2_K || f == LLMQ_GGUF_FTYPE_Q3_K_S || f == LLMQ_GGUF_FTYPE_Q3_K_M ||
                f == LLMQ_GGUF_FTYPE_IQ4_NL || f == LLMQ_GGUF_FTYPE_Q4_K_S || f == LLMQ_GGUF_FTYPE_Q4_K_M ||
                f == LLMQ_GGUF_FTYPE_IQ4_XS)
                t = LLMQ_DTYPE_Q5_K;
        } else {
            if (f == LLMQ_GGUF_FTYPE_Q2_K)
                t = LLMQ_DTYPE_Q3_K;
            else if (f == LLMQ_GGUF_FTYPE_Q3_K_M)
                t = LLMQ_DTYPE_Q4_K;
            else if (f == LLMQ_GGUF_FTYPE_Q3_K_L)
                t = LLMQ_DTYPE_Q5_K;
        }
    } else if (cat == CAT_ATTN_QKV) {
        // unreachable: is_attn_v() took it (as in llama.cpp)
    } else if (cat == CAT_FFN_GATE) {
        ++s->i_ffn_gate;
    } else if (cat == CAT_FFN_UP) {
        ++s->i_ffn_up;
    }
    return t;
}

// tensor_type_fallback, with llmq's note text.
static enum llmq_dtype fallback(const struct llmq_gguf_mix_tensor *x, enum llmq_dtype t,
                                struct llmq_gguf_mix_choice *c) {
    int64_t nc = row_len(x), bs = blck(t);
    if (nc % bs == 0) return t;
    enum llmq_dtype r;
    switch (t) {
    case LLMQ_DTYPE_IQ4_XS: r = LLMQ_DTYPE_IQ4_NL; break;
    case LLMQ_DTYPE_Q2_K:
    case LLMQ_DTYPE_Q3_K: r = LLMQ_DTYPE_Q4_0; break;
    case LLMQ_DTYPE_Q4_K: r = LLMQ_DTYPE_Q5_0; break;
    case LLMQ_DTYPE_Q5_K: r = LLMQ_DTYPE_Q5_1; break;
    case LLMQ_DTYPE_Q6_K: r = LLMQ_DTYPE_Q8_0; break;
    default: r = t; break; // a 32-element type has no smaller block; a plain type never gets here
    }
    bool f16 = nc % blck(r) != 0;
    if (f16) r = LLMQ_DTYPE_F16;
    c->fallback = true;
    snprintf(c->note, sizeof(c->note), "ncols %lld not divisible by %lld (%s) -> %s%s", (long long)nc, (long long)bs,
             llmq_dtype_name(t), llmq_dtype_name(r), f16 ? " (no block type tiles the row)" : "");
    llmq_debug("gguf mix: %-32s %s", x->name, c->note); // summed up in one warning by fallback_summary
    return r;
}

static enum llmq_status check_type(enum llmq_dtype t, const char *what) {
    if (t == LLMQ_DTYPE_COUNT || llmq_gguf_mix_type_ok(t)) return LLMQ_OK;
    return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "gguf mix: %s %s cannot be written by llmq (%s)", what, llmq_dtype_name(t),
                       "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k..q6_k, iq4_nl, iq4_xs");
}

// One warning for all fallbacks of a plan: how many, and each (wanted -> written) pair with its count.
static void fallback_summary(int64_t n, const struct llmq_gguf_mix_choice *c) {
    enum llmq_dtype from[16], to[16];
    int64_t cnt[16] = {0}, total = 0;
    int np = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!c[i].fallback) continue;
        total++;
        int j = 0;
        while (j < np && !(from[j] == c[i].wanted && to[j] == c[i].type)) j++;
        if (j == np && np < 16) {
            from[np] = c[i].wanted;
            to[np++] = c[i].type;
        }
        if (j < np) cnt[j]++;
    }
    if (!total) return;
    char list[512];
    size_t off = 0;
    for (int j = 0; j < np && off < sizeof(list); j++)
        off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%lld %s -> %s", j ? ", " : "", (long long)cnt[j],
                                llmq_dtype_name(from[j]), llmq_dtype_name(to[j]));
    llmq_warn("gguf mix: %lld of %lld tensors fell back to another type (their row length is not a multiple of the "
              "block): %s; each is named in its progress line, by --dry-run and by --verbose",
              (long long)total, (long long)n, list);
}

enum llmq_status llmq_gguf_mix_plan(const struct llmq_gguf_mix_model *mm, const struct llmq_gguf_mix_opts *o, int64_t n,
                                    const struct llmq_gguf_mix_tensor *t, struct llmq_gguf_mix_choice *out) {
    struct state s = {.mm = mm, .o = o};
    enum llmq_status st;
    const enum llmq_dtype def = llmq_gguf_ftype_default_type(o->ftype);
    int n_rx = 0;
    if (def == LLMQ_DTYPE_INVALID) return llmq_errorf(LLMQ_ERR_ARG, "gguf mix: unknown ftype %d", (int)o->ftype);
    if ((st = check_type(o->output_type, "--output-type")) || (st = check_type(o->embedding_type, "--embedding-type")))
        return st;
    if (o->n_overrides > 0 && !(s.rx = calloc((size_t)o->n_overrides, sizeof(regex_t))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf mix: out of memory");
    for (; n_rx < o->n_overrides; n_rx++) {
        const struct llmq_gguf_tensor_type *ov = &o->overrides[n_rx];
        if ((st = check_type(ov->type, "--tensor-type"))) goto done;
        int rc = regcomp(&s.rx[n_rx], ov->regex, REG_EXTENDED | REG_NOSUB);
        if (rc) {
            char msg[128];
            regerror(rc, &s.rx[n_rx], msg, sizeof(msg));
            st = llmq_errorf(LLMQ_ERR_ARG, "gguf mix: --tensor-type regex '%s': %s", ov->regex, msg);
            goto done;
        }
    }
    // init_quantize_state_counters
    s.tied = true;
    for (int64_t i = 0; i < n; i++) {
        enum category c = category_of(t[i].name);
        if (is_attn_v(c)) s.n_attention_wv++;
        if (c == CAT_OUTPUT) s.tied = false;
    }
    s.n_ffn_down = s.n_ffn_gate = s.n_ffn_up = (int)mm->n_layer;

    const bool def_quant = llmq_dtype_traits(def)->is_quant;
    for (int64_t i = 0; i < n; i++) {
        const struct llmq_gguf_mix_tensor *x = &t[i];
        struct llmq_gguf_mix_choice *c = &out[i];
        enum category cat = category_of(x->name);
        memset(c, 0, sizeof(*c));
        c->quantized = allows_quantization(x);
        if (!c->quantized) { // kept: F32 for 1-D, the input type for plain >= 2-D, else F32
            enum llmq_dtype k = x->src_type;
            if (ggml_n_dims_of(x) < 2 || !(k == LLMQ_DTYPE_F32 || k == LLMQ_DTYPE_F16 || k == LLMQ_DTYPE_BF16))
                k = LLMQ_DTYPE_F32;
            c->type = c->wanted = k;
            continue;
        }
        enum llmq_dtype ty = def;
        if (o->embedding_type != LLMQ_DTYPE_COUNT && cat == CAT_TOKEN_EMBD) {
            ty = o->embedding_type;
            snprintf(c->note, sizeof(c->note), "--embedding-type %s", llmq_dtype_name(ty));
        } else if (o->output_type != LLMQ_DTYPE_COUNT && cat == CAT_OUTPUT) {
            ty = o->output_type;
            snprintf(c->note, sizeof(c->note), "--output-type %s", llmq_dtype_name(ty));
        } else if (def_quant) {
            for (int k = 0; k < n_rx; k++)
                if (regexec(&s.rx[k], x->name, 0, NULL, 0) == 0) {
                    if (o->overrides[k].type != ty)
                        snprintf(c->note, sizeof(c->note), "--tensor-type %s=%s", o->overrides[k].regex,
                                 llmq_dtype_name(o->overrides[k].type));
                    ty = o->overrides[k].type;
                    c->manual = true;
                    break;
                }
            if (!c->manual && !o->pure) ty = mix_rule(&s, ty, x, cat);
        }
        c->wanted = ty;
        // llama.cpp falls back only after the mix (not for --output-type / --embedding-type, which it
        // takes as given); llmq also refuses to write a row that the explicit type does not tile.
        if (def_quant || (o->embedding_type != LLMQ_DTYPE_COUNT && cat == CAT_TOKEN_EMBD) ||
            (o->output_type != LLMQ_DTYPE_COUNT && cat == CAT_OUTPUT))
            ty = fallback(x, ty, c);
        c->type = ty;
    }
    fallback_summary(n, out);
done:
    for (int k = 0; k < n_rx; k++) regfree(&s.rx[k]);
    free(s.rx);
    return st;
}
