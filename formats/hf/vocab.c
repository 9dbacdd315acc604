// formats/hf/vocab.c — the tokenizer half of `llmq convert`: GGUF tokenizer.ggml.* <-> Hugging Face
// tokenizer.json / tokenizer_config.json. The mapping is documented in formats/convert/convert.h ("Tokenizer");
// the names of llama.cpp's pre-tokenizer types and their patterns follow llama.cpp's llama-vocab.cpp,
// the tokenizer.json layout the one the `tokenizers` library writes.
#include "formats/hf/vocab.h"

#include "common/io.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VOCAB (1 << 24)             // tokens; far above any real vocabulary
#define MAX_TOKENIZER_JSON (1ull << 30) // bytes of tokenizer.json we are willing to parse

// ============================================================================ pre-tokenizers ====
// GGUF tokenizer.ggml.pre names grouped by the pattern llama.cpp uses for them; each group has one
// tokenizer.json pre_tokenizer and one canonical name it comes back as.

enum pre_class { PRE_GPT2, PRE_SMOLLM, PRE_LLAMA3, PRE_QWEN2 };

static const struct {
    const char *name;
    enum pre_class cls;
    bool ignore_merges; // llama.cpp sets ignore_merges for these (the llama3 group)
} pre_table[] = {
    {"gpt-2", PRE_GPT2, false},
    {"gpt2", PRE_GPT2, false},
    {"default", PRE_GPT2, false},
    {"phi-2", PRE_GPT2, false},
    {"mpt", PRE_GPT2, false},
    {"olmo", PRE_GPT2, false},
    {"jais", PRE_GPT2, false},
    {"gigachat", PRE_GPT2, false},
    {"trillion", PRE_GPT2, false},
    {"smollm", PRE_SMOLLM, false},
    {"starcoder", PRE_SMOLLM, false},
    {"refact", PRE_SMOLLM, false},
    {"command-r", PRE_SMOLLM, false},
    {"codeshell", PRE_SMOLLM, false},
    {"exaone", PRE_SMOLLM, false},
    {"minerva-7b", PRE_SMOLLM, false},
    {"llama-bpe", PRE_LLAMA3, true},
    {"llama3", PRE_LLAMA3, true},
    {"llama-v3", PRE_LLAMA3, true},
    {"falcon3", PRE_LLAMA3, true},
    {"pixtral", PRE_LLAMA3, true},
    {"dbrx", PRE_LLAMA3, false},
    {"smaug-bpe", PRE_LLAMA3, false},
    {"qwen2", PRE_QWEN2, false},
    {"deepseek-r1-qwen", PRE_QWEN2, false},
    {"stablelm2", PRE_QWEN2, false},
    {"megrez", PRE_QWEN2, false},
};

// The Split patterns of the llama3 and qwen2 tokenizer.json files (llama.cpp's comments quote them).
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                               "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int pre_find(const char *name) {
    for (size_t i = 0; i < sizeof(pre_table) / sizeof(pre_table[0]); i++)
        if (strcmp(pre_table[i].name, name) == 0) return (int)i;
    return -1;
}

static const char *pre_canonical(enum pre_class c, bool ignore_merges) {
    switch (c) {
    case PRE_GPT2: return "gpt-2";
    case PRE_SMOLLM: return "smollm";
    case PRE_LLAMA3: return ignore_merges ? "llama-bpe" : "smaug-bpe";
    case PRE_QWEN2: return "qwen2";
    }
    return "gpt-2";
}

// GGUF role key suffixes and tokenizer_config.json names of the special tokens, by enum cv_special.
static const char *const special_gguf[CV_N_SPECIAL] = {"bos", "eos", "unknown", "padding", "seperator", "mask"};
static const char *const special_hf[CV_N_SPECIAL] = {"bos", "eos", "unk", "pad", "sep", "mask"};

// ============================================================================ small helpers ====

void cv_vocab_free(struct cv_vocab *v) {
    if (!v) return;
    for (int64_t i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    for (int64_t i = 0; v->merge && i < v->n_merges; i++) free(v->merge[i]);
    free(v->tok);
    free(v->tok_len);
    free(v->type);
    free(v->scores);
    free(v->merge);
    free(v->pre);
    free(v->chat_template);
    memset(v, 0, sizeof(*v));
}

static enum llmq_status vocab_alloc(struct cv_vocab *v, int64_t n) {
    v->n = n;
    v->tok = calloc((size_t)n, sizeof(*v->tok));
    v->tok_len = calloc((size_t)n, sizeof(*v->tok_len));
    v->type = calloc((size_t)n, sizeof(*v->type));
    for (int r = 0; r < CV_N_SPECIAL; r++) v->special[r] = -1;
    v->add_bos = v->add_eos = v->add_space_prefix = -1;
    if (!v->tok || !v->tok_len || !v->type)
        return llmq_errorf(LLMQ_ERR_NOMEM, "vocabulary of %lld tokens: out of memory", (long long)n);
    return LLMQ_OK;
}

// text -> id, open addressing (ids into v->tok); the first id of a text wins.
struct tokmap {
    int64_t *slots; // (cap) ids, -1 empty
    size_t cap;
    const struct cv_vocab *v;
};

static uint64_t hash_bytes(const char *s, size_t n) { // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int64_t tokmap_find(const struct tokmap *m, const char *s, size_t n) {
    for (size_t k = hash_bytes(s, n) & (m->cap - 1);; k = (k + 1) & (m->cap - 1)) {
        int64_t id = m->slots[k];
        if (id < 0) return -1;
        if (m->v->tok_len[id] == n && memcmp(m->v->tok[id], s, n) == 0) return id;
    }
}

// Indexes every token whose skip[] is false (skip may be NULL). *dup_a / *dup_b: the first two ids
// sharing a text (-1 if none).
static enum llmq_status tokmap_init(struct tokmap *m, const struct cv_vocab *v, const bool *skip, int64_t *dup_a,
                                    int64_t *dup_b) {
    m->v = v;
    m->cap = 16;
    while (m->cap < (size_t)v->n * 2) m->cap <<= 1;
    m->slots = malloc(m->cap * sizeof(*m->slots));
    *dup_a = *dup_b = -1;
    if (!m->slots) return llmq_errorf(LLMQ_ERR_NOMEM, "token index: out of memory");
    for (size_t k = 0; k < m->cap; k++) m->slots[k] = -1;
    for (int64_t id = 0; id < v->n; id++) {
        if ((skip && skip[id]) || !v->tok[id]) continue;
        size_t k = hash_bytes(v->tok[id], v->tok_len[id]) & (m->cap - 1);
        for (;; k = (k + 1) & (m->cap - 1)) {
            int64_t o = m->slots[k];
            if (o < 0) {
                m->slots[k] = id;
                break;
            }
            if (v->tok_len[o] == v->tok_len[id] && memcmp(v->tok[o], v->tok[id], v->tok_len[id]) == 0) {
                if (*dup_a < 0) *dup_a = o, *dup_b = id;
                break;
            }
        }
    }
    return LLMQ_OK;
}

static void tokmap_free(struct tokmap *m) { free(m->slots); }

// "<0xAB>": an SPM byte token.
static bool is_byte_token(const char *s, size_t n) {
    static const char hex[] = "0123456789ABCDEFabcdef";
    return n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && s[3] && s[4] && strchr(hex, s[3]) && strchr(hex, s[4]);
}

// "[PAD123]" with 123 == id: a filler llama.cpp's converter adds for ids the tokenizer lacks.
static bool is_pad_filler(const char *s, int64_t id) {
    char buf[40];
    snprintf(buf, sizeof(buf), "[PAD%lld]", (long long)id);
    return strcmp(s, buf) == 0;
}

// SentencePiece gives piece i of a BPE model the score -i; llama.cpp stores them as tokenizer.ggml.scores.
// The canonical scores of v: NORMAL token number k (in id order) gets -(float)k, all others 0.
static void canonical_scores(const struct cv_vocab *v, float *out) {
    int64_t k = 0;
    for (int64_t id = 0; id < v->n; id++) out[id] = v->type[id] == CV_TOK_NORMAL ? -(float)k++ : 0.0f;
}

// ============================================================================ GGUF -> vocab ====

static enum llmq_status gguf_str_arr(const struct llmq_gguf *g, const char *key, bool required,
                                     const struct llmq_gguf_kv **out) {
    *out = llmq_gguf_find_kv(g, key);
    if (!*out)
        return required ? llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing key %s", llmq_gguf_path(g), key) : LLMQ_OK;
    if ((*out)->type != LLMQ_GGUF_TYPE_ARRAY || (*out)->arr_type != LLMQ_GGUF_TYPE_STRING)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s is not an array of strings", llmq_gguf_path(g), key);
    return LLMQ_OK;
}

enum llmq_status cv_vocab_from_gguf(const struct llmq_gguf *g, struct cv_vocab *v) {
    const char *path = llmq_gguf_path(g);
    const struct llmq_gguf_kv *kv_tok, *kv_merges, *kv;
    const char *model = NULL;
    enum llmq_status st;
    memset(v, 0, sizeof(*v));

    if ((st = llmq_gguf_get_str(g, "tokenizer.ggml.model", &model))) return st;
    if (strcmp(model, "llama") == 0)
        v->kind = CV_SPM;
    else if (strcmp(model, "gpt2") == 0)
        v->kind = CV_BPE;
    else
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: tokenizer.ggml.model \"%s\" is not supported (only \"llama\" and \"gpt2\")", path,
                           model);
    if ((st = gguf_str_arr(g, "tokenizer.ggml.tokens", true, &kv_tok))) return st;
    if (kv_tok->n == 0 || kv_tok->n > MAX_VOCAB)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tokenizer.ggml.tokens has %llu entries (1..%d allowed)", path,
                           (unsigned long long)kv_tok->n, MAX_VOCAB);
    if ((st = vocab_alloc(v, (int64_t)kv_tok->n))) goto fail;
    for (int64_t i = 0; i < v->n; i++) {
        size_t len;
        const char *s = llmq_gguf_kv_arr_str(kv_tok, (uint64_t)i, &len);
        if (!s || !(v->tok[i] = llmq_strndup_bytes(s, len))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: token %lld: out of memory", path, (long long)i);
            goto fail;
        }
        v->tok_len[i] = len;
        v->type[i] = CV_TOK_NORMAL;
    }
    if ((kv = llmq_gguf_find_kv(g, "tokenizer.ggml.token_type"))) {
        if (kv->type != LLMQ_GGUF_TYPE_ARRAY || kv->n != (uint64_t)v->n) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tokenizer.ggml.token_type must be an array of %lld integers", path,
                             (long long)v->n);
            goto fail;
        }
        for (int64_t i = 0; i < v->n; i++) {
            int64_t t;
            if (!llmq_gguf_kv_arr_i64(kv, (uint64_t)i, &t) || t < CV_TOK_UNDEFINED || t > CV_TOK_BYTE) {
                st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tokenizer.ggml.token_type[%lld] is not a token type (0..6)",
                                 path, (long long)i);
                goto fail;
            }
            v->type[i] = (int32_t)t;
        }
    }
    if ((kv = llmq_gguf_find_kv(g, "tokenizer.ggml.scores"))) {
        if (kv->type != LLMQ_GGUF_TYPE_ARRAY || kv->n != (uint64_t)v->n ||
            (kv->arr_type != LLMQ_GGUF_TYPE_FLOAT32 && kv->arr_type != LLMQ_GGUF_TYPE_FLOAT64)) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tokenizer.ggml.scores must be an array of %lld floats", path,
                             (long long)v->n);
            goto fail;
        }
        if (!(v->scores = malloc((size_t)v->n * sizeof(float)))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: scores: out of memory", path);
            goto fail;
        }
        for (int64_t i = 0; i < v->n; i++) {
            double d = 0;
            if (kv->arr_type == LLMQ_GGUF_TYPE_FLOAT32) { // keep the bits (-0.0 included)
                memcpy(&v->scores[i], kv->data + 4 * i, 4);
            } else {
                llmq_gguf_kv_arr_f64(kv, (uint64_t)i, &d);
                v->scores[i] = (float)d;
            }
        }
    }
    if ((st = gguf_str_arr(g, "tokenizer.ggml.merges", v->kind == CV_BPE, &kv_merges))) goto fail;
    if (kv_merges) {
        v->n_merges = (int64_t)kv_merges->n;
        if (!(v->merge = calloc((size_t)v->n_merges + 1, sizeof(*v->merge)))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: merges: out of memory", path);
            goto fail;
        }
        for (int64_t i = 0; i < v->n_merges; i++) {
            size_t len;
            const char *s = llmq_gguf_kv_arr_str(kv_merges, (uint64_t)i, &len);
            if (!s || !(v->merge[i] = llmq_strndup_bytes(s, len))) {
                st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: merge %lld: out of memory", path, (long long)i);
                goto fail;
            }
            if (strlen(v->merge[i]) != len) {
                st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tokenizer.ggml.merges[%lld] holds a NUL byte", path,
                                 (long long)i);
                goto fail;
            }
        }
    }
    if (v->kind == CV_BPE) {
        const char *pre = "default";
        if ((kv = llmq_gguf_find_kv(g, "tokenizer.ggml.pre")) && !(pre = llmq_gguf_kv_as_str(kv, NULL))) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tokenizer.ggml.pre is not a string", path);
            goto fail;
        }
        if (!(v->pre = strdup(pre))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
    } else {
        v->special[CV_BOS] = 1, v->special[CV_EOS] = 2, v->special[CV_UNK] = 0; // llama.cpp's SPM defaults
    }
    for (int r = 0; r < CV_N_SPECIAL; r++) {
        char key[64];
        int64_t id;
        snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", special_gguf[r]);
        if (!(kv = llmq_gguf_find_kv(g, key))) {
            if (v->special[r] >= v->n) v->special[r] = -1;
            continue;
        }
        if (!llmq_gguf_kv_as_i64(kv, &id)) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s is not an integer", path, key);
            goto fail;
        }
        if (id < 0 || id >= v->n) { // llama.cpp ignores such ids with a warning too
            llmq_warn("%s: %s = %lld is not a token id (vocabulary of %lld): ignored", path, key, (long long)id,
                      (long long)v->n);
            id = -1;
        }
        v->special[r] = id;
    }
    bool b;
    if ((kv = llmq_gguf_find_kv(g, "tokenizer.ggml.add_bos_token")) && llmq_gguf_kv_as_bool(kv, &b)) v->add_bos = b;
    if ((kv = llmq_gguf_find_kv(g, "tokenizer.ggml.add_eos_token")) && llmq_gguf_kv_as_bool(kv, &b)) v->add_eos = b;
    if ((kv = llmq_gguf_find_kv(g, "tokenizer.ggml.add_space_prefix")) && llmq_gguf_kv_as_bool(kv, &b))
        v->add_space_prefix = b;
    if ((kv = llmq_gguf_find_kv(g, "tokenizer.chat_template"))) {
        size_t len;
        const char *s = llmq_gguf_kv_as_str(kv, &len);
        if (s && !(v->chat_template = llmq_strndup_bytes(s, len))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
    }
    return LLMQ_OK;
fail:
    cv_vocab_free(v);
    return st;
}

// ============================================================================ vocab -> GGUF ====

enum llmq_status cv_vocab_write_gguf(const struct cv_vocab *v, struct llmq_gguf_writer *w) {
    enum llmq_status st;
    if ((st = llmq_gguf_writer_set_str(w, "tokenizer.ggml.model", v->kind == CV_SPM ? "llama" : "gpt2"))) return st;
    if (v->pre && (st = llmq_gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre))) return st;
    if ((st = llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->tok_len,
                                           (uint64_t)v->n)))
        return st;
    if (v->scores &&
        (st = llmq_gguf_writer_set_arr(w, "tokenizer.ggml.scores", LLMQ_GGUF_TYPE_FLOAT32, v->scores, (uint64_t)v->n)))
        return st;
    if ((st = llmq_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LLMQ_GGUF_TYPE_INT32, v->type, (uint64_t)v->n)))
        return st;
    if (v->merge && (st = llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merge, NULL,
                                                       (uint64_t)v->n_merges)))
        return st;
    for (int r = 0; r < CV_N_SPECIAL; r++) {
        char key[64];
        if (v->special[r] < 0) continue;
        snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", special_gguf[r]);
        if ((st = llmq_gguf_writer_set_u32(w, key, (uint32_t)v->special[r]))) return st;
    }
    if (v->add_bos >= 0 && (st = llmq_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos))) return st;
    if (v->add_eos >= 0 && (st = llmq_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos))) return st;
    if (v->add_space_prefix >= 0 &&
        (st = llmq_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix)))
        return st;
    if (v->chat_template && (st = llmq_gguf_writer_set_str(w, "tokenizer.chat_template", v->chat_template))) return st;
    return LLMQ_OK;
}

// ============================================================================ vocab -> HF ====

// One candidate SentencePiece merge: tokens l + r == token m.
struct spm_merge {
    int64_t m, l, r;
    float score; // score of m
};

static int spm_merge_cmp(const void *pa, const void *pb) {
    const struct spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1; // higher score merges first
    if (a->m != b->m) return a->m < b->m ? -1 : 1;
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    return a->r < b->r ? -1 : a->r > b->r;
}

// Every split of every non-byte token into two tokens, in SentencePiece priority order (see
// formats/convert/convert.h). *out is malloc'd.
static enum llmq_status spm_merges(const struct cv_vocab *v, const struct tokmap *map, const float *scores,
                                   struct spm_merge **out, int64_t *n_out) {
    int64_t n = 0, cap = 1024;
    struct spm_merge *m = malloc((size_t)cap * sizeof(*m));
    if (!m) return llmq_errorf(LLMQ_ERR_NOMEM, "merges: out of memory");
    for (int64_t id = 0; id < v->n; id++) {
        const char *s = v->tok[id];
        size_t len = v->tok_len[id];
        if (v->type[id] == CV_TOK_BYTE || v->type[id] == CV_TOK_UNUSED) continue;
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xc0) == 0x80) continue; // not a character boundary
            int64_t l = tokmap_find(map, s, k), r = l >= 0 ? tokmap_find(map, s + k, len - k) : -1;
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                struct spm_merge *p = realloc(m, (size_t)(cap *= 2) * sizeof(*m));
                if (!p) {
                    free(m);
                    return llmq_errorf(LLMQ_ERR_NOMEM, "merges: out of memory");
                }
                m = p;
            }
            m[n++] = (struct spm_merge){.m = id, .l = l, .r = r, .score = scores ? scores[id] : 0.0f};
        }
    }
    qsort(m, (size_t)n, sizeof(*m), spm_merge_cmp);
    *out = m;
    *n_out = n;
    return LLMQ_OK;
}

static json_t *json_token(const struct cv_vocab *v, int64_t id) { return json_stringn(v->tok[id], v->tok_len[id]); }

static json_t *added_token_json(const struct cv_vocab *v, int64_t id, bool special, bool with_id) {
    json_t *t = json_object();
    if (with_id) json_object_set_new(t, "id", json_integer(id));
    json_object_set_new(t, "content", json_token(v, id));
    json_object_set_new(t, "single_word", json_false());
    json_object_set_new(t, "lstrip", json_false());
    json_object_set_new(t, "rstrip", json_false());
    json_object_set_new(t, "normalized", json_false());
    json_object_set_new(t, "special", json_boolean(special));
    return t;
}

static json_t *byte_level(bool use_regex, bool trim_offsets, bool add_prefix_space) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", add_prefix_space, "trim_offsets",
                     trim_offsets, "use_regex", use_regex);
}

static json_t *pre_tokenizer_json(enum pre_class c) {
    switch (c) {
    case PRE_GPT2: return byte_level(true, true, false);
    case PRE_SMOLLM:
        return json_pack("{s:s, s:[{s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Digits",
                         "individual_digits", 1, byte_level(true, true, false));
    case PRE_LLAMA3:
    case PRE_QWEN2:
        return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Split",
                         "pattern", "Regex", c == PRE_LLAMA3 ? RE_LLAMA3 : RE_QWEN2, "behavior", "Isolated", "invert",
                         0, byte_level(false, true, false));
    }
    return json_null();
}

// TemplateProcessing adding BOS in front and / or EOS at the end (the post-processor HF uses).
static json_t *template_json(const struct cv_vocab *v, int64_t bos, int64_t eos) {
    json_t *single = json_array(), *pair = json_array(), *specials = json_object();
    for (int part = 0; part < 2; part++) {
        json_t *arr = part == 0 ? single : pair;
        for (int seq = 0; seq <= part; seq++) {
            if (bos >= 0)
                json_array_append_new(
                    arr, json_pack("{s:{s:o, s:i}}", "SpecialToken", "id", json_token(v, bos), "type_id", seq));
            json_array_append_new(arr, json_pack("{s:{s:s, s:i}}", "Sequence", "id", seq ? "B" : "A", "type_id", seq));
            if (eos >= 0)
                json_array_append_new(
                    arr, json_pack("{s:{s:o, s:i}}", "SpecialToken", "id", json_token(v, eos), "type_id", seq));
        }
    }
    int64_t ids[2] = {bos, eos};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        json_t *tok = json_token(v, ids[k]);
        json_object_setn_new(specials, v->tok[ids[k]], v->tok_len[ids[k]],
                             json_pack("{s:O, s:[I], s:[O]}", "id", tok, "ids", (json_int_t)ids[k], "tokens", tok));
        json_decref(tok);
    }
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                     "special_tokens", specials);
}

// Every token must be a non-empty UTF-8 string without NUL; omit[id]: a [PAD<id>] filler that tokenizer.json
// leaves out; *unk: the first UNKNOWN-typed token (or -1).
static enum llmq_status check_tokens(const struct cv_vocab *v, const char *src, bool *omit, int64_t *unk) {
    *unk = -1;
    for (int64_t id = 0; id < v->n; id++) {
        if (v->tok_len[id] == 0 || strlen(v->tok[id]) != v->tok_len[id] ||
            !llmq_utf8_valid(v->tok[id], v->tok_len[id])) {
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "%s: token %lld is empty, holds a NUL byte or is not valid UTF-8: tokenizer.json cannot "
                               "hold it",
                               src, (long long)id);
        }
        omit[id] = v->type[id] == CV_TOK_UNUSED && is_pad_filler(v->tok[id], id);
        if (v->type[id] == CV_TOK_UNKNOWN && *unk < 0) *unk = id;
        if (v->type[id] == CV_TOK_UNUSED && !omit[id])
            llmq_warn("%s: token %lld \"%s\" is UNUSED: tokenizer.json has no such type, it comes back NORMAL", src,
                      (long long)id, v->tok[id]);
    }
    return LLMQ_OK;
}

// model.merges: BPE's tokenizer.ggml.merges as "a b" strings (or ["a", "b"] pairs when a token holds a space,
// which needs tokenizers >= 0.20); SPM's merges rebuilt from the scores (see the header).
static enum llmq_status merges_json(const struct cv_vocab *v, const struct tokmap *map, const char *src,
                                    json_t *merges) {
    enum llmq_status st = LLMQ_OK;
    struct spm_merge *sm = NULL;
    int64_t n_sm = 0;
    float *canon = NULL;
    bool pairs = false;
    if (v->kind == CV_BPE) {
        for (int64_t i = 0; i < v->n_merges && !pairs; i++) {
            const char *sp = strchr(v->merge[i], ' ');
            pairs = !sp || sp == v->merge[i] || strchr(sp + 1, ' ');
        }
        for (int64_t i = 0; i < v->n_merges; i++) {
            const char *m = v->merge[i];
            if (!llmq_utf8_valid(m, strlen(m)))
                return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: merge %lld is not valid UTF-8", src, (long long)i);
            if (!pairs) {
                json_array_append_new(merges, json_string(m));
                continue;
            }
            const char *sp = m[0] ? strchr(m + 1, ' ') : NULL; // llama.cpp splits at the first space after byte 0
            if (!sp)
                return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tokenizer.ggml.merges[%lld] \"%s\" is not \"left right\"",
                                   src, (long long)i, m);
            json_array_append_new(merges, json_pack("[s#, s]", m, (int)(sp - m), sp + 1));
        }
    } else {
        if (!(canon = malloc((size_t)v->n * sizeof(float))))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", src);
        canonical_scores(v, canon);
        if (!v->scores)
            llmq_warn("%s: SPM vocabulary without tokenizer.ggml.scores: merges follow the token ids", src);
        else if (memcmp(canon, v->scores, (size_t)v->n * sizeof(float)) != 0)
            llmq_warn("%s: tokenizer.ggml.scores are not SentencePiece's -i sequence: tokenizer.json keeps their order "
                      "(in its merges), not their values",
                      src);
        if ((st = spm_merges(v, map, v->scores ? v->scores : canon, &sm, &n_sm))) {
            free(canon);
            return st;
        }
        for (int64_t i = 0; i < n_sm && !pairs; i++)
            pairs = strchr(v->tok[sm[i].l], ' ') || strchr(v->tok[sm[i].r], ' ');
        for (int64_t i = 0; i < n_sm; i++) {
            if (pairs) {
                json_array_append_new(merges, json_pack("[o, o]", json_token(v, sm[i].l), json_token(v, sm[i].r)));
                continue;
            }
            char *s = malloc(v->tok_len[sm[i].l] + v->tok_len[sm[i].r] + 2);
            if (!s) {
                st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: merges: out of memory", src);
                break;
            }
            sprintf(s, "%s %s", v->tok[sm[i].l], v->tok[sm[i].r]);
            json_array_append_new(merges, json_string(s));
            free(s);
        }
        free(sm);
        free(canon);
    }
    return st;
}

// tokenizer.json: the pipeline around model (normalizer, pre-tokenizer, post-processor, decoder). Takes the
// references of model and added. NULL when out of memory.
static json_t *tokenizer_json_of(const struct cv_vocab *v, int pre_i, int add_bos, int add_eos, json_t *model,
                                 json_t *added) {
    bool spm = v->kind == CV_SPM;
    int add_space = v->add_space_prefix >= 0 ? v->add_space_prefix : 1;
    int64_t bos = add_bos ? v->special[CV_BOS] : -1, eos = add_eos ? v->special[CV_EOS] : -1;
    json_t *normalizer, *pre, *post, *decoder;
    if (spm) {
        json_t *norms = json_array();
        if (add_space)
            json_array_append_new(norms, json_pack("{s:s, s:s}", "type", "Prepend", "prepend", "\xe2\x96\x81"));
        json_array_append_new(norms, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ",
                                               "content", "\xe2\x96\x81"));
        normalizer = json_pack("{s:s, s:o}", "type", "Sequence", "normalizers", norms);
        pre = json_null();
        json_t *decs = json_pack("[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}]", "type", "Replace", "pattern", "String",
                                 "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse");
        if (add_space)
            json_array_append_new(
                decs, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ", "start", 1, "stop", 0));
        decoder = json_pack("{s:s, s:o}", "type", "Sequence", "decoders", decs);
    } else {
        normalizer = json_null();
        pre = pre_tokenizer_json(pre_table[pre_i].cls);
        decoder = byte_level(true, true, true);
    }
    if (bos >= 0 || eos >= 0)
        post = template_json(v, bos, eos);
    else
        post = spm ? json_null() : byte_level(true, false, true);
    return json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                     "added_tokens", added, "normalizer", normalizer, "pre_tokenizer", pre, "post_processor", post,
                     "decoder", decoder, "model", model);
}

enum llmq_status cv_vocab_to_hf(const struct cv_vocab *v, const char *src, int64_t n_ctx, json_t **tokenizer_json,
                                json_t **tokenizer_config) {
    enum llmq_status st = LLMQ_OK;
    struct tokmap map = {0};
    int64_t dup_a, dup_b, unk = -1;
    bool *omit = calloc((size_t)v->n, sizeof(bool));
    json_t *tj = NULL, *tc = NULL, *added = json_array(), *added_dec = json_object(), *vocab = json_object();
    json_t *merges = json_array();
    int pre_i = -1;
    *tokenizer_json = *tokenizer_config = NULL;
    if (!omit || !added || !added_dec || !vocab || !merges) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: tokenizer: out of memory", src);
        goto done;
    }
    if (v->kind == CV_BPE && (pre_i = pre_find(v->pre)) < 0) {
        st = llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                         "%s: tokenizer.ggml.pre \"%s\" has no tokenizer.json equivalent here (supported: the gpt-2, "
                         "smollm, llama-bpe and qwen2 patterns and their aliases)",
                         src, v->pre);
        goto done;
    }
    if (v->kind == CV_BPE && strcmp(v->pre, "default") == 0)
        llmq_warn("%s: no tokenizer.ggml.pre (llama.cpp's \"default\" pre-tokenizer): written as GPT-2's byte-level "
                  "pattern",
                  src);
    if ((st = check_tokens(v, src, omit, &unk))) goto done;
    if ((st = tokmap_init(&map, v, omit, &dup_a, &dup_b))) goto done;
    if (dup_a >= 0) {
        st = llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                         "%s: tokens %lld and %lld are both \"%s\": tokenizer.json cannot hold both", src,
                         (long long)dup_a, (long long)dup_b, v->tok[dup_a]);
        goto done;
    }

    // ---- model
    for (int64_t id = 0; id < v->n; id++) {
        if (omit[id]) continue;
        json_object_setn_new_nocheck(vocab, v->tok[id], v->tok_len[id], json_integer(id));
        bool is_added =
            v->type[id] == CV_TOK_CONTROL || v->type[id] == CV_TOK_USER_DEFINED || v->type[id] == CV_TOK_UNKNOWN;
        if (is_added) {
            char key[32];
            bool special = v->type[id] != CV_TOK_USER_DEFINED;
            json_array_append_new(added, added_token_json(v, id, special, true));
            snprintf(key, sizeof(key), "%lld", (long long)id);
            json_object_set_new(added_dec, key, added_token_json(v, id, special, false));
        }
    }
    if ((st = merges_json(v, &map, src, merges))) goto done;
    bool spm = v->kind == CV_SPM;
    bool ignore_merges = !spm && pre_table[pre_i].ignore_merges;
    int64_t unk_model = unk; // only an UNKNOWN-typed token: HF -> GGUF gives model.unk_token that type
    json_t *model = json_pack("{s:s, s:n, s:o, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", unk_model >= 0 ? json_token(v, unk_model) : json_null(),
                              "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", spm, "byte_fallback", spm,
                              "ignore_merges", ignore_merges, "vocab", vocab, "merges", merges);
    vocab = merges = NULL; // owned by model now

    // ---- the pipeline around the model
    int add_bos =
        v->add_bos >= 0 ? v->add_bos : (spm || (pre_i >= 0 && pre_table[pre_i].ignore_merges)); // llama.cpp defaults
    int add_eos = v->add_eos >= 0 ? v->add_eos : 0;
    tj = tokenizer_json_of(v, pre_i, add_bos, add_eos, model, added);
    added = NULL;

    // ---- tokenizer_config.json
    tc = json_pack("{s:b, s:b, s:o}", "add_bos_token", add_bos, "add_eos_token", add_eos, "added_tokens_decoder",
                   added_dec);
    added_dec = NULL;
    for (int r = 0; r < CV_N_SPECIAL; r++) {
        char key[32];
        int64_t id = v->special[r];
        if (id < 0 || omit[id]) continue;
        snprintf(key, sizeof(key), "%s_token", special_hf[r]);
        json_object_set_new(tc, key, json_token(v, id));
    }
    if (v->chat_template) json_object_set_new(tc, "chat_template", json_string(v->chat_template));
    json_object_set_new(tc, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(tc, "model_max_length", json_integer(n_ctx));
    json_object_set_new(tc, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    if (!tj || !tc) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: tokenizer.json: out of memory (or a string that is not UTF-8)", src);
        goto done;
    }
    *tokenizer_json = tj;
    *tokenizer_config = tc;
    tj = tc = NULL;
done:
    json_decref(tj);
    json_decref(tc);
    json_decref(added);
    json_decref(added_dec);
    json_decref(vocab);
    json_decref(merges);
    tokmap_free(&map);
    free(omit);
    return st;
}

// ============================================================================ HF -> vocab ====

static enum llmq_status load_json(const char *path, bool required, json_t **out) {
    char *text = NULL;
    size_t n = 0;
    json_error_t err;
    enum llmq_status st;
    *out = NULL;
    if (!llmq_file_exists(path)) return required ? llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing", path) : LLMQ_OK;
    if ((st = llmq_read_file(path, MAX_TOKENIZER_JSON, &text, &n))) return st;
    *out = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!*out || !json_is_object(*out)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: line %d column %d: %s", path, err.line, err.column,
                         *out ? "not a JSON object" : err.text);
        json_decref(*out);
        *out = NULL;
        return st;
    }
    return LLMQ_OK;
}

// The flat list of a normalizer / pre-tokenizer: a "Sequence" unpacked, a single step as one item.
static size_t flat_steps(const json_t *j, const char *list_key, const json_t **steps, size_t max) {
    if (!json_is_object(j)) return 0;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        size_t n = 0, i;
        json_t *e;
        json_array_foreach(json_object_get(j, list_key), i, e) if (n < max) steps[n++] = e;
        return n;
    }
    steps[0] = j;
    return 1;
}

static bool step_is(const json_t *s, const char *type) {
    const char *t = json_string_value(json_object_get(s, "type"));
    return t && strcmp(t, type) == 0;
}

static bool json_true_key(const json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

// Decides SPM vs byte-level BPE and the pre type / space prefix from the tokenizer.json pipeline.
static enum llmq_status hf_pipeline(const char *path, const json_t *tj, const json_t *model, struct cv_vocab *v) {
    const json_t *norm[8], *pre[8];
    size_t n_norm = flat_steps(json_object_get(tj, "normalizer"), "normalizers", norm, 8);
    size_t n_pre = flat_steps(json_object_get(tj, "pre_tokenizer"), "pretokenizers", pre, 8);
    bool replace_space = false, prepend = false, metaspace = false, byte_level = false, nfc = false;
    for (size_t i = 0; i < n_norm; i++) {
        const char *pat = json_string_value(json_object_get(json_object_get(norm[i], "pattern"), "String"));
        const char *content = json_string_value(json_object_get(norm[i], "content"));
        const char *pp = json_string_value(json_object_get(norm[i], "prepend"));
        if (step_is(norm[i], "Replace") && pat && content && !strcmp(pat, " ") && !strcmp(content, "\xe2\x96\x81"))
            replace_space = true;
        else if (step_is(norm[i], "Prepend") && pp && !strcmp(pp, "\xe2\x96\x81"))
            prepend = true;
        else if (step_is(norm[i], "NFC"))
            nfc = true;
        else
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: normalizer step \"%s\" is not supported", path,
                               json_string_value(json_object_get(norm[i], "type"))
                                   ? json_string_value(json_object_get(norm[i], "type"))
                                   : "?");
    }
    for (size_t i = 0; i < n_pre; i++) {
        if (step_is(pre[i], "Metaspace")) {
            const char *scheme = json_string_value(json_object_get(pre[i], "prepend_scheme"));
            metaspace = true;
            prepend = scheme ? strcmp(scheme, "never") != 0 : json_true_key(pre[i], "add_prefix_space");
        }
        if (step_is(pre[i], "ByteLevel")) byte_level = true;
    }
    if (replace_space || metaspace) {
        if (n_pre > 1 || (n_pre == 1 && !metaspace))
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "%s: SentencePiece-style tokenizer with an extra pre-tokenizer step", path);
        if (metaspace)
            llmq_warn("%s: Metaspace pre-tokenizer%s: llama.cpp's SPM tokenizer %salways prepends \"\u2581\" (texts "
                      "starting with a space may tokenize differently)",
                      path, json_is_false(json_object_get(pre[0], "split")) ? "" : " splitting at spaces",
                      json_is_false(json_object_get(pre[0], "split")) ? "" : "does not split and ");
        if (!json_true_key(model, "byte_fallback"))
            llmq_warn("%s: SentencePiece-style tokenizer without byte_fallback; llama.cpp falls back to bytes", path);
        v->kind = CV_SPM;
        v->add_space_prefix = prepend;
        return LLMQ_OK;
    }
    if (!byte_level)
        return llmq_errorf(
            LLMQ_ERR_UNSUPPORTED,
            "%s: tokenizer is neither byte-level BPE (a ByteLevel pre-tokenizer) nor SentencePiece-style "
            "BPE (Metaspace, or a Replace(\" \" -> \"\\u2581\") normalizer)",
            path);
    if (nfc) llmq_warn("%s: NFC normalizer dropped: llama.cpp does not normalize", path);
    v->kind = CV_BPE;
    v->add_space_prefix = 0;
    // match the pre-tokenizer against the four patterns llama.cpp knows under our names
    int cls = -1;
    const json_t *bl = pre[n_pre - 1];
    bool bl_ok = step_is(bl, "ByteLevel") && !json_true_key(bl, "add_prefix_space");
    if (n_pre == 1 && bl_ok && json_true_key(bl, "use_regex"))
        cls = PRE_GPT2;
    else if (n_pre == 2 && bl_ok && json_true_key(bl, "use_regex") && step_is(pre[0], "Digits") &&
             json_true_key(pre[0], "individual_digits"))
        cls = PRE_SMOLLM;
    else if (n_pre == 2 && bl_ok && !json_true_key(bl, "use_regex") && step_is(pre[0], "Split")) {
        const char *re = json_string_value(json_object_get(json_object_get(pre[0], "pattern"), "Regex"));
        const char *beh = json_string_value(json_object_get(pre[0], "behavior"));
        if (re && beh && !strcmp(beh, "Isolated") && !json_true_key(pre[0], "invert"))
            cls = !strcmp(re, RE_LLAMA3) ? PRE_LLAMA3 : !strcmp(re, RE_QWEN2) ? PRE_QWEN2 : -1;
    }
    if (cls < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: byte-level pre_tokenizer not recognized (known: gpt2 ByteLevel, smollm Digits + "
                           "ByteLevel, llama3 / qwen2 Split + ByteLevel)",
                           path);
    if (!(v->pre = strdup(pre_canonical((enum pre_class)cls, json_true_key(model, "ignore_merges")))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    return LLMQ_OK;
}

// The content of a tokenizer_config.json special token entry: "text" or {"content": "text", ...}.
static const char *token_content(const json_t *e) {
    if (json_is_string(e)) return json_string_value(e);
    return json_string_value(json_object_get(e, "content"));
}

// add_bos / add_eos from a TemplateProcessing post-processor (first / last item of "single").
static void template_flags(const json_t *post, const struct cv_vocab *v, const struct tokmap *map, int *bos, int *eos) {
    const char *type = json_string_value(json_object_get(post, "type"));
    if (!type || strcmp(type, "TemplateProcessing") != 0) return;
    const json_t *single = json_object_get(post, "single");
    size_t n = json_array_size(single);
    *bos = *eos = 0;
    for (int end = 0; end < 2 && n > 0; end++) {
        const char *id = json_string_value(
            json_object_get(json_object_get(json_array_get(single, end ? n - 1 : 0), "SpecialToken"), "id"));
        if (!id) continue;
        int64_t tok = tokmap_find(map, id, strlen(id));
        if (!end && tok >= 0 && tok == v->special[CV_BOS]) *bos = 1;
        if (end && tok >= 0 && tok == v->special[CV_EOS]) *eos = 1;
    }
}

static enum llmq_status set_token(struct cv_vocab *v, const char *path, int64_t id, const char *s, size_t len) {
    char *p = llmq_strndup_bytes(s, len);
    if (!p) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    if (strlen(p) != len || len == 0) {
        free(p);
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: token %lld is empty or holds a NUL character", path,
                           (long long)id);
    }
    free(v->tok[id]);
    v->tok[id] = p;
    v->tok_len[id] = len;
    return LLMQ_OK;
}

// ---- tokens: model.vocab, then added_tokens (which win, as in transformers' get_vocab), then the holes
static enum llmq_status hf_tokens(struct cv_vocab *v, const char *dir, const char *tj_path, const json_t *tj,
                                  const json_t *model, int64_t n_vocab) {
    const json_t *jvocab = json_object_get(model, "vocab");
    bool *added_special = calloc((size_t)n_vocab, sizeof(bool)), *is_added = calloc((size_t)n_vocab, sizeof(bool));
    enum llmq_status st = LLMQ_OK;
    if (!added_special || !is_added) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    const char *key;
    size_t klen;
    json_t *val;
    void *it;
    for (it = json_object_iter((json_t *)jvocab); it; it = json_object_iter_next((json_t *)jvocab, it)) {
        key = json_object_iter_key(it);
        klen = json_object_iter_key_len(it);
        val = json_object_iter_value(it);
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= n_vocab) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT,
                             "%s: model.vocab[\"%s\"] = %lld is not an id below the vocabulary size %lld", tj_path, key,
                             (long long)id, (long long)n_vocab);
            goto done;
        }
        if (v->tok[id]) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.vocab gives id %lld to \"%s\" and \"%s\"", tj_path,
                             (long long)id, v->tok[id], key);
            goto done;
        }
        if ((st = set_token(v, tj_path, id, key, klen))) goto done;
    }
    size_t i;
    json_t *at;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, at) {
        const json_t *jc = json_object_get(at, "content");
        json_int_t id = json_integer_value(json_object_get(at, "id"));
        if (!json_is_string(jc) || !json_is_integer(json_object_get(at, "id")) || id < 0 || id >= n_vocab) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: added_tokens[%zu] has no string content or no id below %lld",
                             tj_path, i, (long long)n_vocab);
            goto done;
        }
        if ((st = set_token(v, tj_path, id, json_string_value(jc), json_string_length(jc)))) goto done;
        is_added[id] = true;
        added_special[id] = json_is_true(json_object_get(at, "special"));
    }
    const char *unk_text = json_string_value(json_object_get(model, "unk_token"));
    for (int64_t id = 0; id < n_vocab; id++) {
        if (!v->tok[id]) { // a hole: llama.cpp's converter fills it the same way
            char buf[40];
            snprintf(buf, sizeof(buf), "[PAD%lld]", (long long)id);
            if ((st = set_token(v, dir, id, buf, strlen(buf)))) goto done;
            v->type[id] = CV_TOK_UNUSED;
            continue;
        }
        bool unk = unk_text && strcmp(v->tok[id], unk_text) == 0;
        if (is_added[id])
            v->type[id] = unk && added_special[id] ? CV_TOK_UNKNOWN
                          : added_special[id]      ? CV_TOK_CONTROL
                                                   : CV_TOK_USER_DEFINED;
        else if (unk)
            v->type[id] = CV_TOK_UNKNOWN;
        else if (v->kind == CV_SPM && is_byte_token(v->tok[id], v->tok_len[id]))
            v->type[id] = CV_TOK_BYTE;
        else
            v->type[id] = CV_TOK_NORMAL;
    }
done:
    free(added_special);
    free(is_added);
    return st;
}

// ---- merges (BPE) or scores (SPM)
static enum llmq_status hf_merges(struct cv_vocab *v, const char *tj_path, const json_t *model) {
    size_t i;
    if (v->kind == CV_BPE) {
        const json_t *jm = json_object_get(model, "merges");
        v->n_merges = (int64_t)json_array_size(jm);
        if (!json_is_array(jm) || !(v->merge = calloc((size_t)v->n_merges + 1, sizeof(*v->merge)))) {
            return json_is_array(jm) ? llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", tj_path)
                                     : llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.merges is not an array", tj_path);
        }
        json_t *m;
        json_array_foreach(jm, i, m) {
            const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
            if (json_is_string(m))
                v->merge[i] = strdup(json_string_value(m));
            else if (a && b && json_array_size(m) == 2 && (v->merge[i] = malloc(strlen(a) + strlen(b) + 2)))
                sprintf(v->merge[i], "%s %s", a, b);
            else if (!a || !b || json_array_size(m) != 2)
                return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]",
                                   tj_path, i);
            if (!v->merge[i]) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", tj_path);
        }
    } else {
        if (!(v->scores = malloc((size_t)v->n * sizeof(float))))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", tj_path);
        canonical_scores(v, v->scores);
    }

    return LLMQ_OK;
}

// Special tokens, the add_bos / add_eos flags and the chat template.
static enum llmq_status hf_specials(struct cv_vocab *v, const struct tokmap *map, const json_t *tj, const json_t *tc,
                                    const char *tc_path, const char *tmpl_path, const json_t *cfg) {
    int64_t n_vocab = v->n;
    size_t i;
    // ---- special tokens: tokenizer_config.json "<role>_token", else config.json "<role>_token_id"
    for (int r = 0; r < CV_N_SPECIAL; r++) {
        char k[48];
        snprintf(k, sizeof(k), "%s_token", special_hf[r]);
        const char *content = token_content(json_object_get(tc, k));
        if (content) {
            int64_t id = tokmap_find(map, content, strlen(content));
            if (id < 0) llmq_warn("%s: %s \"%s\" is not in the vocabulary: ignored", tc_path, k, content);
            v->special[r] = id;
            continue;
        }
        snprintf(k, sizeof(k), "%s_token_id", special_hf[r]);
        const json_t *jid = json_object_get(cfg, k);
        if (json_is_array(jid)) jid = json_array_get(jid, 0);
        if (json_is_integer(jid) && json_integer_value(jid) >= 0 && json_integer_value(jid) < n_vocab)
            v->special[r] = json_integer_value(jid);
    }
    if (v->special[CV_UNK] < 0)
        for (int64_t id = 0; id < n_vocab && v->special[CV_UNK] < 0; id++)
            if (v->type[id] == CV_TOK_UNKNOWN) v->special[CV_UNK] = id;

    // ---- flags and chat template
    int tb = -1, te = -1;
    template_flags(json_object_get(tj, "post_processor"), v, map, &tb, &te);
    const json_t *jb = json_object_get(tc, "add_bos_token"), *je = json_object_get(tc, "add_eos_token");
    v->add_bos = json_is_boolean(jb) ? json_is_true(jb) : tb >= 0 ? tb : 0;
    v->add_eos = json_is_boolean(je) ? json_is_true(je) : te >= 0 ? te : 0;
    const json_t *ct = json_object_get(tc, "chat_template");
    if (json_is_array(ct)) { // [{"name": "default", "template": "..."}, ...]: the "default" one, else the first
        json_t *e, *pick = json_array_get(ct, 0);
        json_array_foreach(ct, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm && !strcmp(nm, "default")) pick = e;
        }
        ct = json_object_get(pick, "template");
    }
    if (json_is_string(ct)) {
        if (!(v->chat_template = llmq_strndup_bytes(json_string_value(ct), json_string_length(ct))))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", tc_path);
    } else if (llmq_file_exists(tmpl_path)) {
        size_t n;
        return llmq_read_file(tmpl_path, 16u << 20, &v->chat_template, &n);
    }
    return LLMQ_OK;
}

enum llmq_status cv_vocab_from_hf(const char *dir, const json_t *cfg, int64_t n_vocab, struct cv_vocab *v) {
    char *tj_path = llmq_path_join(dir, "tokenizer.json"), *tc_path = llmq_path_join(dir, "tokenizer_config.json");
    char *tmpl_path = llmq_path_join(dir, "chat_template.jinja");
    json_t *tj = NULL, *tc = NULL;
    struct tokmap map = {0};
    enum llmq_status st;
    memset(v, 0, sizeof(*v));
    if (!tj_path || !tc_path || !tmpl_path) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    if ((st = load_json(tj_path, true, &tj)) || (st = load_json(tc_path, false, &tc))) goto fail;
    const json_t *model = json_object_get(tj, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || (mtype && strcmp(mtype, "BPE") != 0) ||
        (!mtype && !json_object_get(model, "merges"))) {
        st = llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: model type %s is not supported (only BPE)", tj_path,
                         mtype ? mtype : "(missing)");
        goto fail;
    }
    const json_t *jvocab = json_object_get(model, "vocab");
    if (!json_is_object(jvocab)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.vocab is not an object", tj_path);
        goto fail;
    }
    if (n_vocab <= 0 || n_vocab > MAX_VOCAB) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: vocabulary size %lld out of range", dir, (long long)n_vocab);
        goto fail;
    }
    if ((st = vocab_alloc(v, n_vocab))) goto fail;
    if ((st = hf_pipeline(tj_path, tj, model, v))) goto fail;
    if ((st = hf_tokens(v, dir, tj_path, tj, model, n_vocab))) goto fail;
    int64_t dup_a, dup_b;
    if ((st = tokmap_init(&map, v, NULL, &dup_a, &dup_b))) goto fail;

    if ((st = hf_merges(v, tj_path, model))) goto fail;
    if ((st = hf_specials(v, &map, tj, tc, tc_path, tmpl_path, cfg))) goto fail;
    st = LLMQ_OK;
    goto done;
fail:
    cv_vocab_free(v);
done:
    tokmap_free(&map);
    json_decref(tj);
    json_decref(tc);
    free(tj_path);
    free(tc_path);
    free(tmpl_path);
    return st;
}
