/*
 * calib/tokenizer/tokenizer.c — see calib/tokenizer/tokenizer.h. Mirrors llama.cpp's src/llama-vocab.cpp (vocabulary
 * loading, special-token partition, llm_tokenizer_spm, llm_tokenizer_bpe, token_to_piece) and
 * src/unicode.cpp (UTF-8 handling, the hand-written gpt2 / llama3 / qwen2 pre-tokenizers and what
 * its std::regex fallback does for the "default" and "smollm" patterns). Function names below say
 * which llama.cpp piece each one mirrors.
 *
 * Strings: every distinct byte string the tokenizer needs (token texts, BPE merge parts and merge
 * results) is interned once: a string id (sid) indexes str_off/str_len into one blob. BPE symbols
 * then carry sids and a merge is a hash lookup of the pair (sid_left, sid_right). Legend:
 *   V  n_vocab tokens      S  interned strings      M  merges      L  input bytes
 */
#include "calib/tokenizer/tokenizer.h"

#include "calib/tokenizer/unicode.h"
#include "common/io.h"
#include "common/log.h"
#include "formats/gguf.h"

#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// llama.cpp's llama_token_attr bits (token types are mapped onto these; a few texts add CONTROL).
enum {
    ATTR_UNDEFINED = 0,
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
    ATTR_LSTRIP = 1 << 7,
    ATTR_RSTRIP = 1 << 8,
};

// The pre-tokenizer pattern families (llama.cpp's regex_exprs of llm_tokenizer_bpe).
enum pre_family { PRE_DEFAULT, PRE_GPT2, PRE_SMOLLM, PRE_LLAMA3, PRE_QWEN2 };

#define MAX_VOCAB (1 << 24)
#define MAX_MERGES (1 << 26)
#define MAX_TOKEN_BYTES (1 << 20)
#define MAX_HF_JSON ((size_t)1 << 30)

struct llmq_tokenizer {
    enum llmq_tokenizer_kind kind;
    enum pre_family pre;
    char pre_name[32];  // GGUF tokenizer.ggml.pre value ("" for SPM)
    bool ignore_merges; // llama3 family: a word that is a token is not merged
    bool add_bos, add_eos, add_space_prefix;
    int32_t bos, eos, unk, pad; // -1 if none

    int32_t n_vocab;  // V
    int32_t *tok_sid; // (V) sid of each token's text
    float *score;     // (V)
    int32_t *type;    // (V) token type as stored (enum llmq_token_type)
    uint32_t *attr;   // (V) ATTR_* bits used by tokenize / token_to_piece

    char *blob; // interned string bytes
    size_t blob_n, blob_cap;
    uint32_t *str_off, *str_len; // (S) sid -> bytes in blob
    int32_t *str_tok;            // (S) sid -> token id with that text (the last one), or -1
    int32_t n_str, cap_str;
    int32_t *hslot; // open-addressing table of sids (-1 empty), size hmask + 1
    uint32_t hmask;

    int64_t n_merges; // M, in rank order
    char *merge_blob; // the "a b" texts, for llmq_tokenizer_merge
    size_t merge_blob_n, merge_blob_cap;
    uint64_t *merge_text_off; // (M + 1) offsets into merge_blob
    uint64_t *mkey;           // (M) (sid_left << 32) | sid_right, or UINT64_MAX for an unusable merge
    int32_t *mres;            // (M) sid of left + right
    int32_t *mslot;           // open-addressing table of merge ranks (-1 empty), size mmask + 1
    uint64_t mmask;

    int32_t *special; // (n_special) CONTROL / USER_DEFINED / UNKNOWN ids, longest text first
    int32_t n_special;
    int32_t byte_sid[256];     // BPE: sid of the GPT-2 alphabet character of each byte, or -1
    int32_t byte1_tok[256];    // BPE: token of the one-byte string, or -1 (llama.cpp's last resort)
    int32_t spm_byte_tok[256]; // SPM: token <0xXX> (else the one-byte string), or -1
    uint8_t ascii_flags[128];  // pre-tokenizer F_* flags of the ASCII code points
    char src[512];             // file name for messages
};

// ================================================================================================
// Small helpers
// ================================================================================================

struct ivec {
    int32_t *v;
    int64_t n, cap;
};

static bool ivec_reserve(struct ivec *a, int64_t want) {
    if (want <= a->cap) return true;
    int64_t cap = a->cap ? a->cap : 64;
    while (cap < want) cap *= 2;
    int32_t *nv = realloc(a->v, (size_t)cap * sizeof(int32_t));
    if (!nv) return false;
    a->v = nv;
    a->cap = cap;
    return true;
}

static inline bool ivec_push(struct ivec *a, int32_t x) {
    if (a->n == a->cap && !ivec_reserve(a, a->n + 1)) return false;
    a->v[a->n++] = x;
    return true;
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, s, 8);
        h = (h ^ k) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t k = 0;
    memcpy(&k, s, n);
    h = (h ^ k) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h;
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

// The sid of s[0..n), or -1.
static int32_t str_find(const struct llmq_tokenizer *t, const char *s, size_t n) {
    if (!t->hslot) return -1;
    for (uint64_t i = hash_bytes(s, n) & t->hmask;; i = (i + 1) & t->hmask) {
        int32_t sid = t->hslot[i];
        if (sid < 0) return -1;
        if (t->str_len[sid] == n && memcmp(t->blob + t->str_off[sid], s, n) == 0) return sid;
    }
}

static bool str_rehash(struct llmq_tokenizer *t, uint32_t cap) {
    int32_t *slot = malloc((size_t)cap * sizeof(int32_t));
    if (!slot) return false;
    memset(slot, 0xFF, (size_t)cap * sizeof(int32_t));
    for (int32_t sid = 0; sid < t->n_str; sid++) {
        uint64_t i = hash_bytes(t->blob + t->str_off[sid], t->str_len[sid]) & (cap - 1);
        while (slot[i] >= 0) i = (i + 1) & (cap - 1);
        slot[i] = sid;
    }
    free(t->hslot);
    t->hslot = slot;
    t->hmask = cap - 1;
    return true;
}

// Interns s[0..n) and returns its sid in *sid. LLMQ_ERR_NOMEM / LLMQ_ERR_OVERFLOW (logged).
static enum llmq_status str_intern(struct llmq_tokenizer *t, const char *s, size_t n, int32_t *sid) {
    int32_t found = str_find(t, s, n);
    if (found >= 0) {
        *sid = found;
        return LLMQ_OK;
    }
    if (n > MAX_TOKEN_BYTES || t->blob_n + n > UINT32_MAX || t->n_str >= INT32_MAX / 4)
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: tokenizer strings exceed the limits", t->src);
    if (t->n_str == t->cap_str) {
        int32_t cap = t->cap_str ? t->cap_str * 2 : 1024;
        uint32_t *o = realloc(t->str_off, (size_t)cap * sizeof(uint32_t));
        if (o) t->str_off = o;
        uint32_t *l = realloc(t->str_len, (size_t)cap * sizeof(uint32_t));
        if (l) t->str_len = l;
        int32_t *k = realloc(t->str_tok, (size_t)cap * sizeof(int32_t));
        if (k) t->str_tok = k;
        if (!o || !l || !k) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", t->src);
        t->cap_str = cap;
    }
    if (t->blob_n + n > t->blob_cap) {
        size_t cap = t->blob_cap ? t->blob_cap : 65536;
        while (cap < t->blob_n + n) cap *= 2;
        char *b = realloc(t->blob, cap);
        if (!b) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", t->src);
        t->blob = b;
        t->blob_cap = cap;
    }
    if (n) memcpy(t->blob + t->blob_n, s, n);
    int32_t id = t->n_str++;
    t->str_off[id] = (uint32_t)t->blob_n;
    t->str_len[id] = (uint32_t)n;
    t->str_tok[id] = -1;
    t->blob_n += n;
    if ((uint64_t)t->n_str * 2 > (uint64_t)t->hmask + 1 || !t->hslot) {
        uint32_t cap = t->hslot ? (t->hmask + 1) * 2 : 4096;
        while ((uint64_t)t->n_str * 2 > cap) cap *= 2;
        if (!str_rehash(t, cap)) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", t->src);
    } else {
        uint64_t i = hash_bytes(s, n) & t->hmask;
        while (t->hslot[i] >= 0) i = (i + 1) & t->hmask;
        t->hslot[i] = id;
    }
    *sid = id;
    return LLMQ_OK;
}

static inline const char *str_text(const struct llmq_tokenizer *t, int32_t sid) { return t->blob + t->str_off[sid]; }

// Token id whose text is s[0..n) (llama.cpp text_to_token), or -1.
static int32_t text_to_token(const struct llmq_tokenizer *t, const char *s, size_t n) {
    int32_t sid = str_find(t, s, n);
    return sid < 0 ? -1 : t->str_tok[sid];
}

// The rank of merge (sid_l, sid_r), or -1.
static int32_t merge_find(const struct llmq_tokenizer *t, int32_t sid_l, int32_t sid_r) {
    if (!t->mslot || sid_l < 0 || sid_r < 0) return -1;
    uint64_t key = ((uint64_t)(uint32_t)sid_l << 32) | (uint32_t)sid_r;
    for (uint64_t i = hash_u64(key) & t->mmask;; i = (i + 1) & t->mmask) {
        int32_t r = t->mslot[i];
        if (r < 0) return -1;
        if (t->mkey[r] == key) return r;
    }
}

// GPT-2's bytes_to_unicode (llama.cpp unicode_byte_to_utf8_map): printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order.
static uint32_t gpt2_byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
    uint32_t n = 0;
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) n++;
    return 256 + n;
}

// Inverse of gpt2_byte_to_cp: the byte, or -1 for a code point outside the alphabet.
static int gpt2_cp_to_byte(uint32_t cp) {
    if (cp < 256) {
        if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE)) return (int)cp;
        return -1;
    }
    uint32_t n = 0;
    for (uint32_t c = 0; c < 256; c++) {
        if ((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE)) continue;
        if (256 + n == cp) return (int)c;
        n++;
    }
    return -1;
}

// ================================================================================================
// Building a tokenizer (shared by the GGUF and HF loaders)
// ================================================================================================

static struct llmq_tokenizer *tok_new(const char *src, enum llmq_tokenizer_kind kind, int32_t n_vocab) {
    struct llmq_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    snprintf(t->src, sizeof(t->src), "%s", src);
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->bos = t->eos = t->unk = t->pad = -1;
    t->tok_sid = malloc((size_t)n_vocab * sizeof(int32_t));
    t->score = calloc((size_t)n_vocab, sizeof(float));
    t->type = malloc((size_t)n_vocab * sizeof(int32_t));
    t->attr = calloc((size_t)n_vocab, sizeof(uint32_t));
    if (!t->tok_sid || !t->score || !t->type || !t->attr) {
        llmq_tokenizer_free(t);
        return NULL;
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        t->tok_sid[i] = -1;
        t->type[i] = LLMQ_TOKEN_TYPE_NORMAL;
    }
    return t;
}

// Sets token id's text (an empty text becomes "[EMPTY_<id>]", as llama.cpp does). A later id with
// the same text wins the text -> id lookup (llama.cpp's token_to_id[word] = i).
static enum llmq_status tok_set_text(struct llmq_tokenizer *t, int32_t id, const char *s, size_t n) {
    char empty[32];
    if (n == 0) {
        n = (size_t)snprintf(empty, sizeof(empty), "[EMPTY_%d]", id);
        s = empty;
        llmq_warn("%s: token %d has an empty text, using %s (as llama.cpp)\n", t->src, id, empty);
    }
    int32_t sid;
    enum llmq_status st = str_intern(t, s, n, &sid);
    if (st != LLMQ_OK) return st;
    int32_t old = t->tok_sid[id];
    if (old >= 0 && old != sid && t->str_tok[old] == id) t->str_tok[old] = -1; // a text replaced (HF added_tokens)
    t->tok_sid[id] = sid;
    t->str_tok[sid] = id;
    return LLMQ_OK;
}

static enum llmq_status merge_blob_add(struct llmq_tokenizer *t, const char *s, size_t n) {
    if (t->merge_blob_n + n > t->merge_blob_cap) {
        size_t cap = t->merge_blob_cap ? t->merge_blob_cap : 65536;
        while (cap < t->merge_blob_n + n) cap *= 2;
        char *b = realloc(t->merge_blob, cap);
        if (!b) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", t->src);
        t->merge_blob = b;
        t->merge_blob_cap = cap;
    }
    if (n) memcpy(t->merge_blob + t->merge_blob_n, s, n);
    t->merge_blob_n += n;
    return LLMQ_OK;
}

static enum llmq_status merges_alloc(struct llmq_tokenizer *t, int64_t n) {
    if (n > MAX_MERGES) return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: %" PRId64 " merges exceed the limit", t->src, n);
    t->merge_text_off = malloc((size_t)(n + 1) * sizeof(uint64_t));
    t->mkey = malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    t->mres = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap *= 2;
    t->mslot = malloc(cap * sizeof(int32_t));
    if (!t->merge_text_off || !t->mkey || !t->mres || !t->mslot)
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %" PRId64 " merges", t->src, n);
    memset(t->mslot, 0xFF, cap * sizeof(int32_t));
    t->mmask = cap - 1;
    t->merge_text_off[0] = 0;
    return LLMQ_OK;
}

// Appends merge number t->n_merges: left l[0..ln) + right r[0..rn), stored text txt[0..tn). An empty
// side makes the merge unusable (llama.cpp keys it as ("", "") which no symbol matches); a pair seen
// before keeps its first rank (llama.cpp's bpe_ranks.emplace).
static enum llmq_status merge_add(struct llmq_tokenizer *t, const char *l, size_t ln, const char *r, size_t rn,
                                  const char *txt, size_t tn) {
    int64_t rank = t->n_merges;
    enum llmq_status st = merge_blob_add(t, txt, tn);
    if (st != LLMQ_OK) return st;
    t->merge_text_off[rank + 1] = t->merge_blob_n;
    t->mkey[rank] = UINT64_MAX;
    t->mres[rank] = -1;
    t->n_merges++;
    if (ln == 0 || rn == 0) return LLMQ_OK;
    int32_t sl, sr, sres;
    if ((st = str_intern(t, l, ln, &sl)) != LLMQ_OK || (st = str_intern(t, r, rn, &sr)) != LLMQ_OK) return st;
    char stack[256];
    char *cat = ln + rn <= sizeof(stack) ? stack : malloc(ln + rn);
    if (!cat) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", t->src);
    memcpy(cat, l, ln);
    memcpy(cat + ln, r, rn);
    st = str_intern(t, cat, ln + rn, &sres);
    if (cat != stack) free(cat);
    if (st != LLMQ_OK) return st;
    uint64_t key = ((uint64_t)(uint32_t)sl << 32) | (uint32_t)sr;
    uint64_t i = hash_u64(key) & t->mmask;
    for (; t->mslot[i] >= 0; i = (i + 1) & t->mmask)
        if (t->mkey[t->mslot[i]] == key) return LLMQ_OK; // duplicate pair: first rank wins
    t->mslot[i] = (int32_t)rank;
    t->mkey[rank] = key;
    t->mres[rank] = sres;
    return LLMQ_OK;
}

static uint32_t attr_of_type(int32_t type) {
    switch (type) {
    case LLMQ_TOKEN_TYPE_UNKNOWN: return ATTR_UNKNOWN;
    case LLMQ_TOKEN_TYPE_UNUSED: return ATTR_UNUSED;
    case LLMQ_TOKEN_TYPE_NORMAL: return ATTR_NORMAL;
    case LLMQ_TOKEN_TYPE_CONTROL: return ATTR_CONTROL;
    case LLMQ_TOKEN_TYPE_USER_DEFINED: return ATTR_USER_DEFINED;
    case LLMQ_TOKEN_TYPE_BYTE: return ATTR_BYTE;
    default: return ATTR_UNDEFINED;
    }
}

static bool text_is(const struct llmq_tokenizer *t, int32_t id, const char *s) {
    size_t n = strlen(s);
    return t->str_len[t->tok_sid[id]] == n && memcmp(str_text(t, t->tok_sid[id]), s, n) == 0;
}

static bool text_in(const struct llmq_tokenizer *t, int32_t id, const char *const *list) {
    for (; *list; list++)
        if (text_is(t, id, *list)) return true;
    return false;
}

// llama.cpp's text-based attribute fixes (llama_vocab::impl::load): end-of-generation / FIM texts
// become CONTROL, the gpt-oss texts USER_DEFINED, phi-3 special tokens RSTRIP. llama.cpp marks only
// the first FIM text of each kind it meets in hash order; here every one is (differs only for
// vocabularies with several FIM spellings that are not already CONTROL).
static const char *const eog_texts[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81"
                                        "of\xe2\x96\x81"
                                        "sentence\xef\xbd\x9c>",
                                        "<end_of_utterance>",
                                        "<|eom_id|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<|flush|>",
                                        "<|calls|>",
                                        "</s>",
                                        "[EOS]",
                                        "<eos>",
                                        "<turn|>",
                                        "<|tool_response>",
                                        "[e~[",
                                        NULL};
static const char *const fim_texts[] = {"<|fim_prefix|>",
                                        "<fim-prefix>",
                                        "<fim_prefix>",
                                        "<\xef\xbd\x9c"
                                        "fim\xe2\x96\x81"
                                        "begin\xef\xbd\x9c>",
                                        "<PRE>",
                                        "\xe2\x96\x81<PRE>",
                                        "<|code_prefix|>",
                                        "<|prefix|>",
                                        "<|fim_suffix|>",
                                        "<fim-suffix>",
                                        "<fim_suffix>",
                                        "<\xef\xbd\x9c"
                                        "fim\xe2\x96\x81"
                                        "hole\xef\xbd\x9c>",
                                        "<SUF>",
                                        "\xe2\x96\x81<SUF>",
                                        "<|code_suffix|>",
                                        "<|suffix|>",
                                        "<|fim_middle|>",
                                        "<fim-middle>",
                                        "<fim_middle>",
                                        "<\xef\xbd\x9c"
                                        "fim\xe2\x96\x81"
                                        "end\xef\xbd\x9c>",
                                        "<MID>",
                                        "\xe2\x96\x81<MID>",
                                        "<|code_middle|>",
                                        "<|middle|>",
                                        "<|fim_pad|>",
                                        "<fim-pad>",
                                        "<fim_pad>",
                                        "<PAD>",
                                        "[PAD]",
                                        "<|fim_repo|>",
                                        "<|repo_name|>",
                                        "<fim-repo>",
                                        "<REPO>",
                                        "<reponame>",
                                        "<|file_sep|>",
                                        NULL};
static const char *const gptoss_user_texts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};

static int cmp_special(const void *a, const void *b, void *ctx) {
    const struct llmq_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = t->str_len[t->tok_sid[x]], ly = t->str_len[t->tok_sid[y]];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static uint8_t cp_flags_slow(uint32_t c); // pre-tokenizer flags of a code point (defined below)

// Derives everything tokenize needs once the tokens, types, scores and merges are in.
// model_name: GGUF general.name (for the phi-3 rule), may be NULL.
static enum llmq_status tok_finalize(struct llmq_tokenizer *t, const char *model_name) {
    for (int32_t i = 0; i < t->n_vocab; i++) t->attr[i] = attr_of_type(t->type[i]);

    bool has_return = false, has_call = false, has_flush = false, has_tool_response = false;
    int32_t end_id = -1, s_id = -1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->str_tok[t->tok_sid[i]] != i) continue; // a shadowed duplicate text: llama.cpp never sees it
        if (text_in(t, i, eog_texts) || text_in(t, i, fim_texts)) t->attr[i] |= ATTR_CONTROL;
        if (text_in(t, i, gptoss_user_texts)) t->attr[i] = ATTR_USER_DEFINED;
        if (text_is(t, i, "<|return|>")) has_return = true;
        if (text_is(t, i, "<|call|>") || text_is(t, i, "<|calls|>")) has_call = true;
        if (text_is(t, i, "<|flush|>")) has_flush = true;
        if (text_is(t, i, "<|tool_response>") || text_is(t, i, "<|plamo:eos|>")) has_tool_response = true;
        if (text_is(t, i, "<|end|>")) end_id = i;
        if (text_is(t, i, "</s>")) s_id = i;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) t->attr[end_id] = ATTR_USER_DEFINED;
    if (s_id >= 0 && has_tool_response) t->attr[s_id] = ATTR_NORMAL;

    // special tokens, longest text first (llama.cpp sorts with std::sort; ties here by id)
    t->special = malloc((size_t)t->n_vocab * sizeof(int32_t));
    if (!t->special) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", t->src);
    t->n_special = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) t->special[t->n_special++] = i;
    qsort_r(t->special, (size_t)t->n_special, sizeof(int32_t), cmp_special, t);

    if (model_name) {
        char low[256];
        size_t n = strlen(model_name);
        if (n >= sizeof(low)) n = sizeof(low) - 1;
        for (size_t i = 0; i < n; i++) low[i] = (char)tolower((unsigned char)model_name[i]);
        low[n] = 0;
        if (strstr(low, "phi-3") || strstr(low, "phi3")) {
            for (int32_t k = 0; k < t->n_special; k++) t->attr[t->special[k]] |= ATTR_RSTRIP;
            int32_t id = text_to_token(t, "</s>", 4);
            if (id >= 0) t->attr[id] |= ATTR_RSTRIP;
            const char *off[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (int k = 0; k < 3; k++) {
                id = text_to_token(t, off[k], strlen(off[k]));
                if (id >= 0) t->attr[id] &= ~(uint32_t)ATTR_RSTRIP;
            }
        }
    }

    for (uint32_t c = 0; c < 128; c++) t->ascii_flags[c] = cp_flags_slow(c);
    for (int b = 0; b < 256; b++) {
        char one = (char)b;
        t->byte1_tok[b] = text_to_token(t, &one, 1);
        uint8_t u[4];
        int n = llmq_unicode_encode(gpt2_byte_to_cp((uint8_t)b), u);
        t->byte_sid[b] = str_find(t, (const char *)u, (size_t)n);
        char hex[8];
        snprintf(hex, sizeof(hex), "<0x%02X>", b);
        int32_t id = text_to_token(t, hex, 6);
        t->spm_byte_tok[b] = id >= 0 ? id : t->byte1_tok[b];
    }

    if (t->add_bos && t->bos < 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: the tokenizer adds BOS but has no BOS token", t->src);
    if (t->add_eos && t->eos < 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: the tokenizer adds EOS but has no EOS token", t->src);
    return LLMQ_OK;
}

void llmq_tokenizer_free(struct llmq_tokenizer *t) {
    if (!t) return;
    free(t->tok_sid);
    free(t->score);
    free(t->type);
    free(t->attr);
    free(t->blob);
    free(t->str_off);
    free(t->str_len);
    free(t->str_tok);
    free(t->hslot);
    free(t->merge_blob);
    free(t->merge_text_off);
    free(t->mkey);
    free(t->mres);
    free(t->mslot);
    free(t->special);
    free(t);
}

// ================================================================================================
// Pre-tokenizers (llama.cpp unicode.cpp). A fragment's code points cp[0..n) carry flags fl[i];
// pieces are consecutive lengths. Each splitter refines every input piece independently and, as
// llama.cpp's, sees nothing outside the piece (positions outside read as "no flags").
// ================================================================================================

enum { F_LETTER = 1, F_NUMBER = 2, F_WS = 4, F_PUNCT = 8, F_VALID = 16 };
#define OUT_OF_RANGE 0xFFFFFFFFu

struct pieces {
    int64_t *len;
    int64_t n, cap;
};

static bool pieces_push(struct pieces *p, int64_t len) {
    if (len <= 0) return true;
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 256;
        int64_t *nl = realloc(p->len, (size_t)cap * sizeof(int64_t));
        if (!nl) return false;
        p->len = nl;
        p->cap = cap;
    }
    p->len[p->n++] = len;
    return true;
}

struct span {
    const uint32_t *cp; // (n) code points of the fragment
    const uint8_t *fl;  // (n) F_* flags
    int64_t a, b;       // the piece [a, b)
};

static inline uint8_t sp_fl(const struct span *s, int64_t i) { return i >= s->a && i < s->b ? s->fl[i] : 0; }
static inline uint32_t sp_cp(const struct span *s, int64_t i) {
    return i >= s->a && i < s->b ? s->cp[i] : OUT_OF_RANGE;
}
static inline uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Length of a contraction 's 't 'm 'd 're 've 'll at pos (case-insensitive when fold), else 0.
static int64_t contraction(const struct span *s, int64_t pos, bool fold) {
    if (s->cp[pos] != '\'' || pos + 1 >= s->b) return 0;
    uint32_t c1 = s->cp[pos + 1];
    if (fold) c1 = ascii_lower(c1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 < s->b) {
        uint32_t c2 = s->cp[pos + 2];
        if (fold) c2 = ascii_lower(c2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
    return 0;
}

// unicode_regex_split_custom_gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static bool split_gpt2(const struct span *s, struct pieces *out) {
    int64_t pos = s->a, prev = s->a;
#define EMIT(end)                                                                                                      \
    do {                                                                                                               \
        if (!pieces_push(out, (end)-prev)) return false;                                                               \
        prev = (end);                                                                                                  \
    } while (0)
    while (pos < s->b) {
        uint32_t c = s->cp[pos];
        int64_t k = contraction(s, pos, false);
        if (k) {
            pos += k;
            EMIT(pos);
            continue;
        }
        uint8_t f2 = c == ' ' ? sp_fl(s, pos + 1) : s->fl[pos];
        if (f2 & (F_LETTER | F_NUMBER)) {
            uint8_t want = f2 & F_LETTER ? F_LETTER : F_NUMBER;
            pos += c == ' ';
            while (sp_fl(s, pos) & want) pos++;
            EMIT(pos);
            continue;
        }
        if (!(f2 & (F_WS | F_LETTER | F_NUMBER)) && (f2 & F_VALID)) {
            pos += c == ' ';
            for (uint8_t f = sp_fl(s, pos); !(f & (F_WS | F_LETTER | F_NUMBER)) && (f & F_VALID); f = sp_fl(s, ++pos)) {
            }
            EMIT(pos);
            continue;
        }
        int64_t nws = 0;
        while (sp_fl(s, pos + nws) & F_WS) nws++;
        if (nws > 1 && sp_cp(s, pos + nws) != OUT_OF_RANGE) {
            pos += nws - 1;
            EMIT(pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            EMIT(pos);
            continue;
        }
        pos++;
        EMIT(pos);
    }
    return true;
}

// unicode_regex_split_custom_llama3 (max_digits 3) and _qwen2 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
static bool split_llama3(const struct span *s, int max_digits, struct pieces *out) {
    int64_t pos = s->a, prev = s->a;
    while (pos < s->b) {
        uint32_t c = s->cp[pos];
        uint8_t f = s->fl[pos];
        int64_t k = contraction(s, pos, true);
        if (k) {
            pos += k;
            EMIT(pos);
            continue;
        }
        if (!(c == '\r' || c == '\n' || (f & F_NUMBER))) {
            if ((f & F_LETTER) || (sp_fl(s, pos + 1) & F_LETTER)) {
                pos++;
                while (sp_fl(s, pos) & F_LETTER) pos++;
                EMIT(pos);
                continue;
            }
        }
        if (f & F_NUMBER) {
            int64_t ini = pos;
            while (sp_fl(s, pos) & F_NUMBER) {
                if (++pos - ini >= max_digits) {
                    EMIT(pos);
                    ini = pos;
                }
            }
            EMIT(pos);
            continue;
        }
        uint8_t f2 = c == ' ' ? sp_fl(s, pos + 1) : f;
        if (!(f2 & (F_WS | F_LETTER | F_NUMBER))) { // (llama.cpp tests the flags of pos here, always set)
            pos += c == ' ';
            for (; !(f2 & (F_WS | F_LETTER | F_NUMBER)) && (f2 & F_VALID); f2 = sp_fl(s, ++pos)) {
            }
            for (uint32_t c2 = sp_cp(s, pos); c2 == '\r' || c2 == '\n'; c2 = sp_cp(s, ++pos)) {
            }
            EMIT(pos);
            continue;
        }
        int64_t nws = 0, last_rn = 0;
        while (sp_fl(s, pos + nws) & F_WS) {
            uint32_t c2 = s->cp[pos + nws];
            if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
            nws++;
        }
        if (last_rn > 0) {
            pos = last_rn;
            EMIT(pos);
            continue;
        }
        if (nws > 1 && sp_cp(s, pos + nws) != OUT_OF_RANGE) {
            pos += nws - 1;
            EMIT(pos);
            continue;
        }
        if (nws > 0) {
            pos += nws;
            EMIT(pos);
            continue;
        }
        pos++;
        EMIT(pos);
    }
    return true;
#undef EMIT
}

// What std::regex does in llama.cpp for the patterns without a hand-written splitter: every
// maximal run of characters with one of the flags in `mask` (runs == false: every single such
// character; triples: every "[0-9][0-9][0-9]" found left to right) becomes a piece, and so does the
// text between them.
enum isolate_mode { ISO_RUNS, ISO_SINGLE, ISO_ASCII_DIGIT_TRIPLES };

static bool split_isolate(const struct span *s, uint8_t mask, enum isolate_mode mode, struct pieces *out) {
    int64_t pos = s->a, prev = s->a;
    while (pos < s->b) {
        int64_t end = pos;
        if (mode == ISO_ASCII_DIGIT_TRIPLES) {
            while (end < s->b && end - pos < 3 && s->cp[end] >= '0' && s->cp[end] <= '9') end++;
            if (end - pos < 3) end = pos;
        } else if (s->fl[pos] & mask) {
            end = pos + 1;
            if (mode == ISO_RUNS)
                while (end < s->b && (s->fl[end] & mask)) end++;
        }
        if (end == pos) {
            pos++;
            continue;
        }
        if (!pieces_push(out, pos - prev) || !pieces_push(out, end - pos)) return false;
        prev = pos = end;
    }
    return pieces_push(out, s->b - prev);
}

// F_* flags of one code point (cp_flags: with the ASCII table of the tokenizer). F_PUNCT is the class of the "default"
// pattern [\p{P}\$\+<=>\^~\|]: in llama.cpp's collapsed text ASCII keeps its own character (the class lists
// !-#%-*,-/:-;?-@[-]_{} and $+<=>^~|, i.e. ASCII punctuation and symbols but '`'), other code points become a class
// byte (whitespace first, then the category).
static uint8_t cp_flags_slow(uint32_t c) {
    unsigned u = llmq_unicode_flags(c);
    unsigned cls = u & LLMQ_UNICODE_CLASS_MASK;
    uint8_t f = F_VALID;
    if (cls == LLMQ_UNICODE_LETTER) f |= F_LETTER;
    if (cls == LLMQ_UNICODE_NUMBER) f |= F_NUMBER;
    if (u & LLMQ_UNICODE_WHITESPACE)
        f |= F_WS;
    else if (c < 128 ? ispunct((int)c) && c != '`' : cls == LLMQ_UNICODE_PUNCT)
        f |= F_PUNCT;
    return f;
}

static inline uint8_t cp_flags(const struct llmq_tokenizer *t, uint32_t c) {
    return c < 128 ? t->ascii_flags[c] : cp_flags_slow(c);
}

// Runs the pattern chain of t->pre over cp[0..n): *out receives the word lengths.
static bool pretokenize(const struct llmq_tokenizer *t, const uint32_t *cp, const uint8_t *fl, int64_t n,
                        struct pieces *out, struct pieces *tmp) {
    struct pieces *cur = tmp, *nxt = out;
    cur->n = 0;
    if (!pieces_push(cur, n)) return false;
    // llama.cpp's regex_exprs per pre type: default = "[\p{P}\$\+<=>\^~\|]+", gpt2, "\p{N}+",
    // "[0-9][0-9][0-9]"; smollm = "\p{N}", gpt2; the others one hand-written pattern each.
    enum step { GPT2, QWEN2, LLAMA3, PUNCT_RUNS, NUMBER_RUNS, DIGIT_TRIPLES, EACH_NUMBER };
    static const enum step chains[][4] = {
        [PRE_DEFAULT] = {PUNCT_RUNS, GPT2, NUMBER_RUNS, DIGIT_TRIPLES},
        [PRE_GPT2] = {GPT2},
        [PRE_SMOLLM] = {EACH_NUMBER, GPT2},
        [PRE_LLAMA3] = {LLAMA3},
        [PRE_QWEN2] = {QWEN2},
    };
    static const int n_steps[] = {
        [PRE_DEFAULT] = 4, [PRE_GPT2] = 1, [PRE_SMOLLM] = 2, [PRE_LLAMA3] = 1, [PRE_QWEN2] = 1};
    for (int k = 0; k < n_steps[t->pre]; k++) {
        nxt->n = 0;
        int64_t a = 0;
        for (int64_t i = 0; i < cur->n; i++) {
            struct span s = {cp, fl, a, a + cur->len[i]};
            bool ok;
            switch (chains[t->pre][k]) {
            case GPT2: ok = split_gpt2(&s, nxt); break;
            case QWEN2: ok = split_llama3(&s, 1, nxt); break;
            case LLAMA3: ok = split_llama3(&s, 3, nxt); break;
            case PUNCT_RUNS: ok = split_isolate(&s, F_PUNCT, ISO_RUNS, nxt); break;
            case NUMBER_RUNS: ok = split_isolate(&s, F_NUMBER, ISO_RUNS, nxt); break;
            case DIGIT_TRIPLES: ok = split_isolate(&s, 0, ISO_ASCII_DIGIT_TRIPLES, nxt); break;
            default: ok = split_isolate(&s, F_NUMBER, ISO_SINGLE, nxt); break;
            }
            if (!ok) return false;
            a += cur->len[i];
        }
        struct pieces *sw = cur;
        cur = nxt;
        nxt = sw;
    }
    if (cur != out) { // the result must end in out
        struct pieces sw = *out;
        *out = *cur;
        *cur = sw;
    }
    return true;
}

// ================================================================================================
// Merge queue: a binary heap of candidate merges (llm_bigram_spm / llm_bigram_bpe queues).
// SPM pops the highest score first, BPE the lowest rank; ties: the leftmost symbol first.
// ================================================================================================

struct bigram {
    union {
        float score;
        int32_t rank;
    } k;
    int32_t left, right;
    int32_t size; // bytes of left + right when queued: a different sum means the entry is stale
};

struct heap {
    struct bigram *v;
    int64_t n, cap;
    bool by_rank;
};

static inline bool before(const struct heap *h, const struct bigram *x, const struct bigram *y) {
    if (h->by_rank) {
        if (x->k.rank != y->k.rank) return x->k.rank < y->k.rank;
    } else if (x->k.score != y->k.score) {
        return x->k.score > y->k.score;
    }
    return x->left < y->left;
}

static bool heap_push(struct heap *h, struct bigram b) {
    if (h->n == h->cap) {
        int64_t cap = h->cap ? h->cap * 2 : 64;
        struct bigram *nv = realloc(h->v, (size_t)cap * sizeof(*nv));
        if (!nv) return false;
        h->v = nv;
        h->cap = cap;
    }
    int64_t i = h->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!before(h, &b, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = b;
    return true;
}

static struct bigram heap_pop(struct heap *h) {
    struct bigram top = h->v[0], last = h->v[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(h, &h->v[c + 1], &h->v[c])) c++;
        if (!before(h, &h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

// Symbols of the linked list the merges work on (llm_symbol).
struct symbols {
    int64_t *start;       // first byte in the text
    int32_t *n;           // bytes (0: merged away)
    int32_t *prev, *next; // neighbours, -1 at the ends
    int32_t *sid;         // BPE: interned string of the symbol, -1 if none
    int64_t cap;
};

static bool symbols_reserve(struct symbols *s, int64_t n, bool with_sid) {
    if (n <= s->cap && (!with_sid || s->sid)) return true;
    int64_t cap = s->cap ? s->cap : 256;
    while (cap < n) cap *= 2;
    int64_t *st = realloc(s->start, (size_t)cap * sizeof(int64_t));
    if (st) s->start = st;
    int32_t *nn = realloc(s->n, (size_t)cap * sizeof(int32_t));
    if (nn) s->n = nn;
    int32_t *pv = realloc(s->prev, (size_t)cap * sizeof(int32_t));
    if (pv) s->prev = pv;
    int32_t *nx = realloc(s->next, (size_t)cap * sizeof(int32_t));
    if (nx) s->next = nx;
    int32_t *sd = with_sid ? realloc(s->sid, (size_t)cap * sizeof(int32_t)) : s->sid;
    if (sd) s->sid = sd;
    if (!st || !nn || !pv || !nx || (with_sid && !sd)) return false;
    s->cap = cap;
    return true;
}

static void symbols_free(struct symbols *s) {
    free(s->start);
    free(s->n);
    free(s->prev);
    free(s->next);
    free(s->sid);
}

// ================================================================================================
// SPM (llm_tokenizer_spm_session::tokenize)
// ================================================================================================

struct work {
    struct ivec out;
    struct heap heap;
    struct symbols sym;
    char *buf; // escaped text (SPM) / word bytes (BPE)
    size_t buf_cap;
    uint32_t *cp; // (L) code points of a BPE fragment
    uint8_t *fl;  // (L) their flags
    struct pieces words, tmp;
};

static bool buf_reserve(struct work *w, size_t n) {
    if (n <= w->buf_cap) return true;
    size_t cap = w->buf_cap ? w->buf_cap : 4096;
    while (cap < n) cap *= 2;
    char *nb = realloc(w->buf, cap);
    if (!nb) return false;
    w->buf = nb;
    w->buf_cap = cap;
    return true;
}

static bool spm_try_bigram(const struct llmq_tokenizer *t, struct work *w, const char *text, int32_t left,
                           int32_t right) {
    if (left < 0 || right < 0) return true;
    const struct symbols *s = &w->sym;
    int32_t id = text_to_token(t, text + s->start[left], (size_t)s->n[left] + (size_t)s->n[right]);
    if (id < 0) return true;
    struct bigram b = {.left = left, .right = right, .size = s->n[left] + s->n[right]};
    b.k.score = t->score[id];
    return heap_push(&w->heap, b);
}

// Tokenizes one raw fragment. prefix: prepend a space (add_space_prefix after BOS / a special token).
static enum llmq_status spm_tokenize(const struct llmq_tokenizer *t, struct work *w, const char *text, int64_t len,
                                     bool prefix) {
    // escape: ' ' -> U+2581
    int64_t n_sp = 0;
    for (int64_t i = 0; i < len; i++) n_sp += text[i] == ' ';
    size_t esc_n = (size_t)len + 2 * (size_t)n_sp + (prefix ? 3 : 0);
    if (!buf_reserve(w, esc_n + 1)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    char *e = w->buf;
    size_t o = 0;
    if (prefix) memcpy(e + o, "\xe2\x96\x81", 3), o += 3;
    for (int64_t i = 0; i < len; i++) {
        if (text[i] == ' ')
            memcpy(e + o, "\xe2\x96\x81", 3), o += 3;
        else
            e[o++] = text[i];
    }
    if (esc_n == 0) return LLMQ_OK;
    if (esc_n > (size_t)INT32_MAX) return llmq_errorf(LLMQ_ERR_ARG, "tokenize: text too long for one SPM fragment");

    // split into UTF-8 characters by the lead byte
    struct symbols *s = &w->sym;
    if (!symbols_reserve(s, (int64_t)esc_n, false)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    int32_t ns = 0;
    for (size_t off = 0; off < esc_n;) {
        size_t n = (size_t)llmq_unicode_len_utf8((uint8_t)e[off]);
        if (n > esc_n - off) n = esc_n - off;
        s->start[ns] = (int64_t)off;
        s->n[ns] = (int32_t)n;
        s->prev[ns] = ns - 1;
        off += n;
        s->next[ns] = off == esc_n ? -1 : ns + 1;
        ns++;
    }
    w->heap.n = 0;
    w->heap.by_rank = false;
    for (int32_t i = 1; i < ns; i++)
        if (!spm_try_bigram(t, w, e, i - 1, i)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    while (w->heap.n > 0) {
        struct bigram b = heap_pop(&w->heap);
        int32_t L = b.left, R = b.right;
        if (s->n[L] == 0 || s->n[R] == 0 || s->n[L] + s->n[R] != b.size) continue; // stale entry
        s->n[L] += s->n[R];
        s->n[R] = 0;
        s->next[L] = s->next[R];
        if (s->next[R] >= 0) s->prev[s->next[R]] = L;
        if (!spm_try_bigram(t, w, e, s->prev[L], L) || !spm_try_bigram(t, w, e, L, s->next[L]))
            return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    }
    // resegment: a symbol is a token, or its bytes go through the byte tokens
    for (int32_t i = 0; i != -1; i = s->next[i]) {
        int32_t id = text_to_token(t, e + s->start[i], (size_t)s->n[i]);
        if (id >= 0) {
            if (!ivec_push(&w->out, id)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
            continue;
        }
        for (int32_t j = 0; j < s->n[i]; j++) {
            int32_t bt = t->spm_byte_tok[(uint8_t)e[s->start[i] + j]];
            if (bt < 0) bt = t->unk; // llama.cpp throws here (a vocabulary without byte tokens)
            if (bt >= 0 && !ivec_push(&w->out, bt)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
        }
    }
    return LLMQ_OK;
}

// ================================================================================================
// BPE (llm_tokenizer_bpe_session::tokenize, GPT-2 byte encoding)
// ================================================================================================

static bool bpe_try_bigram(const struct llmq_tokenizer *t, struct work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const struct symbols *s = &w->sym;
    int32_t rank = merge_find(t, s->sid[left], s->sid[right]);
    if (rank < 0) return true;
    struct bigram b = {.left = left, .right = right, .size = s->n[left] + s->n[right]};
    b.k.rank = rank;
    return heap_push(&w->heap, b);
}

// The GPT-2 alphabet character of byte b, as UTF-8 (1 or 2 bytes) into u; returns the length.
static inline int gpt2_char(uint8_t b, uint8_t u[4]) { return llmq_unicode_encode(gpt2_byte_to_cp(b), u); }

// Tokenizes one pre-tokenized word given as its UTF-8 bytes wb[0..nb).
static enum llmq_status bpe_word(const struct llmq_tokenizer *t, struct work *w, const uint8_t *wb, int32_t nb,
                                 char *mapped) {
    struct symbols *s = &w->sym;
    if (t->ignore_merges) { // a word that is a token as a whole is that token
        size_t mn = 0;
        for (int32_t i = 0; i < nb; i++) mn += (size_t)gpt2_char(wb[i], (uint8_t *)mapped + mn);
        int32_t id = text_to_token(t, mapped, mn);
        if (id >= 0) return ivec_push(&w->out, id) ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    }
    if (!symbols_reserve(s, nb, true)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    for (int32_t i = 0; i < nb; i++) {
        s->start[i] = i;
        s->n[i] = 1;
        s->prev[i] = i - 1;
        s->next[i] = i + 1 == nb ? -1 : i + 1;
        s->sid[i] = t->byte_sid[wb[i]];
    }
    w->heap.n = 0;
    w->heap.by_rank = true;
    for (int32_t i = 1; i < nb; i++)
        if (!bpe_try_bigram(t, w, i - 1, i)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    while (w->heap.n > 0) {
        struct bigram b = heap_pop(&w->heap);
        int32_t L = b.left, R = b.right;
        if (s->n[L] == 0 || s->n[R] == 0 || s->n[L] + s->n[R] != b.size) continue; // stale entry
        s->n[L] += s->n[R];
        s->n[R] = 0;
        s->sid[L] = t->mres[b.k.rank];
        s->next[L] = s->next[R];
        if (s->next[R] >= 0) s->prev[s->next[R]] = L;
        if (!bpe_try_bigram(t, w, s->prev[L], L) || !bpe_try_bigram(t, w, L, s->next[L]))
            return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    }
    for (int32_t i = 0; i != -1; i = s->next[i]) {
        int32_t sid = s->sid[i];
        int32_t id = sid >= 0 ? t->str_tok[sid] : -1;
        if (id >= 0) {
            if (!ivec_push(&w->out, id)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
            continue;
        }
        // not a token: llama.cpp looks up every byte of the symbol's (GPT-2 encoded) text alone
        uint8_t one[4];
        const uint8_t *txt = one;
        size_t n;
        if (sid >= 0) {
            txt = (const uint8_t *)str_text(t, sid);
            n = t->str_len[sid];
        } else {
            n = (size_t)gpt2_char(wb[s->start[i]], one);
        }
        for (size_t j = 0; j < n; j++) {
            int32_t bt = t->byte1_tok[txt[j]];
            if (bt >= 0 && !ivec_push(&w->out, bt)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
        }
    }
    return LLMQ_OK;
}

static enum llmq_status bpe_tokenize(const struct llmq_tokenizer *t, struct work *w, const char *text, int64_t len) {
    // code points as llama.cpp's unicode_cpts_from_utf8 sees them
    uint32_t *cp = realloc(w->cp, (size_t)len * sizeof(uint32_t));
    if (cp) w->cp = cp;
    uint8_t *fl = realloc(w->fl, (size_t)len);
    if (fl) w->fl = fl;
    if (!cp || !fl) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    int64_t n = 0;
    for (int64_t off = 0; off < len;) {
        size_t adv;
        uint32_t c = llmq_unicode_decode((const uint8_t *)text + off, (size_t)(len - off), &adv);
        cp[n] = c;
        fl[n] = cp_flags(t, c);
        n++;
        off += (int64_t)adv;
    }
    if (!pretokenize(t, cp, fl, n, &w->words, &w->tmp)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
    int64_t a = 0;
    for (int64_t k = 0; k < w->words.n; k++) {
        int64_t m = w->words.len[k];
        if (m > INT32_MAX / 8)
            return llmq_errorf(LLMQ_ERR_ARG, "tokenize: a pre-tokenized word of %" PRId64 " characters is too long", m);
        if (!buf_reserve(w, (size_t)m * 12)) return llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
        uint8_t *wb = (uint8_t *)w->buf; // word bytes: <= 4 per code point; then 8 per byte for the mapped text
        int32_t nb = 0;
        for (int64_t i = a; i < a + m; i++) nb += llmq_unicode_encode(cp[i], wb + nb);
        enum llmq_status st = bpe_word(t, w, wb, nb, w->buf + (size_t)m * 4);
        if (st != LLMQ_OK) return st;
        a += m;
    }
    return LLMQ_OK;
}

// ================================================================================================
// Special-token partition and the entry points
// ================================================================================================

struct frag {
    int64_t off, len; // raw text [off, off + len) when tok < 0
    int32_t tok;
};

struct fragvec {
    struct frag *v;
    int64_t n, cap;
};

static bool frag_push(struct fragvec *f, int64_t off, int64_t len, int32_t tok) {
    if (f->n == f->cap) {
        int64_t cap = f->cap ? f->cap * 2 : 16;
        struct frag *nv = realloc(f->v, (size_t)cap * sizeof(*nv));
        if (!nv) return false;
        f->v = nv;
        f->cap = cap;
    }
    f->v[f->n++] = (struct frag){off, len, tok};
    return true;
}

static inline bool c_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// llama_vocab::impl::tokenizer_st_partition: for each special token, longest text first, every raw
// fragment is cut at each occurrence (left to right, non-overlapping) of its text.
static bool partition(const struct llmq_tokenizer *t, const char *text, int64_t len, bool parse_special,
                      struct fragvec *cur, struct fragvec *nxt) {
    cur->n = 0;
    if (len > 0 && !frag_push(cur, 0, len, -1)) return false;
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint32_t a = t->attr[id];
        if (!parse_special && (a & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        const char *st = str_text(t, t->tok_sid[id]);
        size_t sn = t->str_len[t->tok_sid[id]];
        bool any = false;
        for (int64_t i = 0; i < cur->n && !any; i++)
            any = cur->v[i].tok < 0 && memmem(text + cur->v[i].off, (size_t)cur->v[i].len, st, sn);
        if (!any) continue;
        nxt->n = 0;
        for (int64_t i = 0; i < cur->n; i++) {
            struct frag f = cur->v[i];
            if (f.tok >= 0) {
                if (!frag_push(nxt, f.off, f.len, f.tok)) return false;
                continue;
            }
            int64_t base = f.off, blen = f.len;
            for (;;) {
                const char *m = blen > 0 ? memmem(text + base, (size_t)blen, st, sn) : NULL;
                if (!m) {
                    if (blen > 0 && !frag_push(nxt, base, blen, -1)) return false;
                    break;
                }
                int64_t mpos = m - text, left = mpos - base;
                if (a & ATTR_LSTRIP)
                    while (left > 0 && c_isspace(text[base + left - 1])) left--;
                if (left > 0 && !frag_push(nxt, base, left, -1)) return false;
                if (!frag_push(nxt, 0, 0, id)) return false;
                int64_t roff = mpos + (int64_t)sn, rlen = base + blen - roff;
                if (a & ATTR_RSTRIP)
                    while (rlen > 0 && c_isspace(text[roff])) roff++, rlen--;
                base = roff;
                blen = rlen;
            }
        }
        struct fragvec sw = *cur;
        *cur = *nxt;
        *nxt = sw;
    }
    return true;
}

enum llmq_status llmq_tokenize(const struct llmq_tokenizer *t, const char *text, size_t len, bool add_special,
                               bool parse_special, int32_t **ids, int64_t *n_ids) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!t || !ids || !n_ids || (!text && len > 0)) return llmq_errorf(LLMQ_ERR_ARG, "llmq_tokenize: NULL argument");
    if (len > (size_t)INT32_MAX) return llmq_errorf(LLMQ_ERR_ARG, "llmq_tokenize: text of %zu bytes is too long", len);
    enum llmq_status st = LLMQ_OK;
    struct work w = {0};
    struct fragvec fa = {0}, fb = {0};
    if (!partition(t, text, (int64_t)len, parse_special, &fa, &fb)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
        goto fail;
    }
    if (!ivec_reserve(&w.out, (int64_t)len / 3 + 16)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
        goto fail;
    }
    if (add_special && t->add_bos) ivec_push(&w.out, t->bos);
    bool prev_special = true; // SPM: the first fragment gets the space prefix
    for (int64_t i = 0; i < fa.n; i++) {
        const struct frag *f = &fa.v[i];
        if (f->tok >= 0) {
            if (!ivec_push(&w.out, f->tok)) {
                st = llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
                goto fail;
            }
            prev_special = true;
            continue;
        }
        if (t->kind == LLMQ_TOKENIZER_SPM)
            st = spm_tokenize(t, &w, text + f->off, f->len, t->add_space_prefix && prev_special);
        else
            st = bpe_tokenize(t, &w, text + f->off, f->len);
        if (st != LLMQ_OK) goto fail;
        prev_special = false;
    }
    if (add_special && t->add_eos && !ivec_push(&w.out, t->eos)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "tokenize: out of memory");
        goto fail;
    }
    *ids = w.out.v;
    *n_ids = w.out.n;
    w.out.v = NULL;
fail:
    free(w.out.v);
    free(w.heap.v);
    symbols_free(&w.sym);
    free(w.buf);
    free(w.cp);
    free(w.fl);
    free(w.words.len);
    free(w.tmp.len);
    free(fa.v);
    free(fb.v);
    return st;
}

// ---- decode (llama_vocab::impl::token_to_piece, lstrip 0)

static int copy_piece(char *buf, int size, const char *s, size_t n) {
    if (n > (size_t)INT32_MAX) return 0;
    if ((size_t)size < n) return -(int)n;
    if (n) memcpy(buf, s, n);
    return (int)n;
}

int llmq_token_to_piece(const struct llmq_tokenizer *t, int32_t id, char *buf, int size, bool render_special) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    if (size < 0) size = 0;
    uint32_t a = t->attr[id];
    if (!render_special && (a & (ATTR_UNKNOWN | ATTR_CONTROL))) return 0;
    const char *s = str_text(t, t->tok_sid[id]);
    size_t n = t->str_len[t->tok_sid[id]];
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) return copy_piece(buf, size, s, n);
    if (a & ATTR_NORMAL) {
        // SPM: U+2581 -> ' ' (output never longer than the text); BPE: GPT-2 alphabet -> bytes
        size_t cap = n;
        if (t->kind == LLMQ_TOKENIZER_BPE) { // room for the "[UNK_BYTE_0x..<text>]" of unmapped characters
            for (size_t i = 0; i < n;) {
                size_t adv;
                uint32_t c = llmq_unicode_decode((const uint8_t *)s + i, n - i, &adv);
                i += adv;
                if (gpt2_cp_to_byte(c) < 0) cap += 24 + n;
            }
        }
        char stack[512];
        char *o = cap <= sizeof(stack) ? stack : malloc(cap);
        if (!o) return 0;
        size_t m = 0;
        if (t->kind == LLMQ_TOKENIZER_SPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0)
                    o[m++] = ' ', i += 3;
                else
                    o[m++] = s[i++];
            }
        } else {
            for (size_t i = 0; i < n;) {
                size_t adv;
                uint32_t c = llmq_unicode_decode((const uint8_t *)s + i, n - i, &adv);
                i += adv;
                int b = gpt2_cp_to_byte(c);
                if (b >= 0) {
                    o[m++] = (char)b;
                    continue;
                }
                uint8_t u[4];
                int un = llmq_unicode_encode(c, u);
                memcpy(o + m, "[UNK_BYTE_0x", 12);
                m += 12;
                for (int k = 0; k < un; k++) {
                    static const char hx[] = "0123456789abcdef";
                    o[m++] = hx[u[k] >> 4];
                    o[m++] = hx[u[k] & 15];
                }
                memcpy(o + m, s, n);
                m += n;
                o[m++] = ']';
            }
        }
        int r = copy_piece(buf, size, o, m);
        if (o != stack) free(o);
        return r;
    }
    if (a & ATTR_BYTE) {
        char hex[3] = {0};
        if (n >= 5) memcpy(hex, s + 3, 2);
        char byte = (char)strtol(hex, NULL, 16);
        return copy_piece(buf, size, &byte, 1);
    }
    return 0;
}

// ---- accessors

int32_t llmq_tokenizer_n_vocab(const struct llmq_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t llmq_tokenizer_bos(const struct llmq_tokenizer *t) { return t ? t->bos : -1; }
int32_t llmq_tokenizer_eos(const struct llmq_tokenizer *t) { return t ? t->eos : -1; }
int32_t llmq_tokenizer_unk(const struct llmq_tokenizer *t) { return t ? t->unk : -1; }
int32_t llmq_tokenizer_pad(const struct llmq_tokenizer *t) { return t ? t->pad : -1; }
bool llmq_tokenizer_add_bos(const struct llmq_tokenizer *t) { return t && t->add_bos; }
bool llmq_tokenizer_add_eos(const struct llmq_tokenizer *t) { return t && t->add_eos; }
bool llmq_tokenizer_add_space_prefix(const struct llmq_tokenizer *t) { return t && t->add_space_prefix; }
enum llmq_tokenizer_kind llmq_tokenizer_kind(const struct llmq_tokenizer *t) {
    return t ? t->kind : LLMQ_TOKENIZER_SPM;
}
const char *llmq_tokenizer_pre(const struct llmq_tokenizer *t) {
    return t && t->kind == LLMQ_TOKENIZER_BPE ? t->pre_name : NULL;
}

const char *llmq_tokenizer_token_text(const struct llmq_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->str_len[t->tok_sid[id]];
    return str_text(t, t->tok_sid[id]);
}

float llmq_tokenizer_token_score(const struct llmq_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab ? t->score[id] : 0.0f;
}

enum llmq_token_type llmq_tokenizer_token_type(const struct llmq_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab ? (enum llmq_token_type)t->type[id] : LLMQ_TOKEN_TYPE_UNDEFINED;
}

int64_t llmq_tokenizer_n_merges(const struct llmq_tokenizer *t) { return t ? t->n_merges : 0; }

const char *llmq_tokenizer_merge(const struct llmq_tokenizer *t, int64_t rank, size_t *len) {
    if (!t || rank < 0 || rank >= t->n_merges) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = (size_t)(t->merge_text_off[rank + 1] - t->merge_text_off[rank]);
    return t->merge_blob + t->merge_text_off[rank];
}

// ================================================================================================
// Loading from GGUF (llama_vocab::impl::load)
// ================================================================================================

static const struct pre_entry {
    const char *name;
    enum pre_family fam;
    bool ignore_merges, add_bos;
} pre_table[] = {
    {"default", PRE_DEFAULT, false, false},
    {"llama3", PRE_LLAMA3, true, true},
    {"llama-v3", PRE_LLAMA3, true, true},
    {"llama-bpe", PRE_LLAMA3, true, true},
    {"falcon3", PRE_LLAMA3, true, true},
    {"falcon-h1", PRE_LLAMA3, true, true},
    {"pixtral", PRE_LLAMA3, true, true},
    {"midm-2.0", PRE_LLAMA3, true, true},
    {"lfm2", PRE_LLAMA3, true, true},
    {"jina-v5-nano", PRE_LLAMA3, true, true},
    {"dbrx", PRE_LLAMA3, false, false},
    {"smaug-bpe", PRE_LLAMA3, false, false},
    {"gpt-2", PRE_GPT2, false, false},
    {"phi-2", PRE_GPT2, false, false},
    {"jina-es", PRE_GPT2, false, false},
    {"jina-de", PRE_GPT2, false, false},
    {"gigachat", PRE_GPT2, false, false},
    {"jina-v2-es", PRE_GPT2, false, false},
    {"jina-v2-de", PRE_GPT2, false, false},
    {"a.x-4.0", PRE_GPT2, false, false},
    {"mellum", PRE_GPT2, false, false},
    {"modern-bert", PRE_GPT2, false, false},
    {"mpt", PRE_GPT2, false, false},
    {"olmo", PRE_GPT2, false, false},
    {"jais", PRE_GPT2, false, false},
    {"trillion", PRE_GPT2, false, false},
    {"granite-docling", PRE_GPT2, false, false},
    {"exaone4", PRE_GPT2, false, false},
    {"smollm", PRE_SMOLLM, false, false},
    {"starcoder", PRE_SMOLLM, false, false},
    {"refact", PRE_SMOLLM, false, false},
    {"command-r", PRE_SMOLLM, false, false},
    {"codeshell", PRE_SMOLLM, false, false},
    {"exaone", PRE_SMOLLM, false, false},
    {"minerva-7b", PRE_SMOLLM, false, false},
    {"mellum2", PRE_SMOLLM, false, false},
    {"qwen2", PRE_QWEN2, false, false},
    {"deepseek-r1-qwen", PRE_QWEN2, false, false},
    {"kormo", PRE_QWEN2, false, false},
    {"f2llmv2", PRE_QWEN2, false, false},
    {"megrez", PRE_QWEN2, false, false},
    {"stablelm2", PRE_QWEN2, false, false},
    {"hunyuan", PRE_QWEN2, false, false},
    {"solar-open", PRE_QWEN2, false, false},
};

static const struct pre_entry *pre_lookup(const char *name) {
    for (size_t i = 0; i < sizeof(pre_table) / sizeof(pre_table[0]); i++)
        if (strcmp(pre_table[i].name, name) == 0) return &pre_table[i];
    return NULL;
}

static void set_pre(struct llmq_tokenizer *t, const struct pre_entry *p) {
    t->pre = p->fam;
    t->ignore_merges = p->ignore_merges;
    t->add_bos = p->add_bos;
    snprintf(t->pre_name, sizeof(t->pre_name), "%s", p->name);
}

// An optional integer key: *id set when present, in range and >= 0 (llama.cpp keeps the default and
// warns for an id out of range).
static enum llmq_status gguf_opt_id(const struct llmq_gguf *g, const struct llmq_tokenizer *t, const char *key,
                                    int32_t *id) {
    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, key);
    if (!kv) return LLMQ_OK;
    int64_t v;
    if (!llmq_gguf_kv_as_i64(kv, &v))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key '%s' is a %s, not an integer", t->src, key,
                           llmq_gguf_type_name(kv->type));
    if (v < 0 || v >= t->n_vocab) {
        llmq_warn("%s: %s = %" PRId64 " is outside the vocabulary of %d tokens, keeping %d\n", t->src, key, v,
                  t->n_vocab, *id);
        return LLMQ_OK;
    }
    *id = (int32_t)v;
    return LLMQ_OK;
}

static enum llmq_status gguf_opt_bool(const struct llmq_gguf *g, const struct llmq_tokenizer *t, const char *key,
                                      bool *b) {
    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, key);
    if (!kv) return LLMQ_OK;
    if (!llmq_gguf_kv_as_bool(kv, b))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key '%s' is a %s, not a bool", t->src, key,
                           llmq_gguf_type_name(kv->type));
    return LLMQ_OK;
}

enum llmq_status llmq_tokenizer_load_gguf(const struct llmq_gguf *g, struct llmq_tokenizer **out) {
    struct llmq_tokenizer *t = NULL;
    enum llmq_status st;
    if (!out) return llmq_errorf(LLMQ_ERR_ARG, "llmq_tokenizer_load_gguf: NULL argument");
    *out = NULL;
    if (!g) return llmq_errorf(LLMQ_ERR_ARG, "llmq_tokenizer_load_gguf: NULL argument");
    const char *path = llmq_gguf_path(g);
    const char *model = NULL;
    if ((st = llmq_gguf_get_str(g, "tokenizer.ggml.model", &model)) != LLMQ_OK) return st;
    enum llmq_tokenizer_kind kind;
    if (strcmp(model, "llama") == 0)
        kind = LLMQ_TOKENIZER_SPM;
    else if (strcmp(model, "gpt2") == 0)
        kind = LLMQ_TOKENIZER_BPE;
    else
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: tokenizer.ggml.model '%s' is not supported (llmq reads 'llama' "
                           "= SentencePiece BPE and 'gpt2' = byte-level BPE)",
                           path, model);
    const struct pre_entry *pre = &pre_table[0];
    if (kind == LLMQ_TOKENIZER_BPE) {
        const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, "tokenizer.ggml.pre");
        const char *name = kv ? llmq_gguf_kv_as_str(kv, NULL) : NULL;
        if (kv && !name)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key 'tokenizer.ggml.pre' is a %s, not a string", path,
                               llmq_gguf_type_name(kv->type));
        if (!kv)
            llmq_warn("%s: no tokenizer.ggml.pre, using the 'default' pre-tokenizer (as llama.cpp)\n", path);
        else if (!(pre = pre_lookup(name)))
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "%s: tokenizer.ggml.pre '%s' is not a pre-tokenizer llmq "
                               "implements (gpt2, llama3, smollm and qwen2 patterns)",
                               path, name);
    }
    const struct llmq_gguf_kv *toks, *scores, *types, *merges = NULL;
    if ((st = llmq_gguf_get_arr(g, "tokenizer.ggml.tokens", LLMQ_GGUF_TYPE_STRING, &toks)) != LLMQ_OK) return st;
    if (toks->n == 0 || toks->n > MAX_VOCAB)
        return llmq_errorf(toks->n ? LLMQ_ERR_OVERFLOW : LLMQ_ERR_CORRUPT,
                           "%s: tokenizer.ggml.tokens has %" PRIu64 " entries (1..%d allowed)", path, toks->n,
                           MAX_VOCAB);
    int32_t n = (int32_t)toks->n;
    scores = llmq_gguf_find_kv(g, "tokenizer.ggml.scores");
    if (scores && (scores->type != LLMQ_GGUF_TYPE_ARRAY ||
                   (scores->arr_type != LLMQ_GGUF_TYPE_FLOAT32 && scores->arr_type != LLMQ_GGUF_TYPE_INT32) ||
                   scores->n < toks->n))
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: tokenizer.ggml.scores must be an f32 or i32 array of at least %d "
                           "entries",
                           path, n);
    types = llmq_gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (types && (types->type != LLMQ_GGUF_TYPE_ARRAY || types->arr_type != LLMQ_GGUF_TYPE_INT32 || types->n < toks->n))
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: tokenizer.ggml.token_type must be an i32 array of at least %d "
                           "entries",
                           path, n);
    if (kind == LLMQ_TOKENIZER_BPE &&
        (st = llmq_gguf_get_arr(g, "tokenizer.ggml.merges", LLMQ_GGUF_TYPE_STRING, &merges)) != LLMQ_OK)
        return st;

    t = tok_new(path, kind, n);
    if (!t) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %d tokens", path, n);
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        const char *s = llmq_gguf_kv_arr_str(toks, (uint64_t)i, &len);
        if (len > MAX_TOKEN_BYTES) {
            st = llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: token %d is %zu bytes long", path, i, len);
            goto fail;
        }
        if ((st = tok_set_text(t, i, s, len)) != LLMQ_OK) goto fail;
        double d = 0;
        if (scores) llmq_gguf_kv_arr_f64(scores, (uint64_t)i, &d);
        t->score[i] = (float)d;
        int64_t ty = LLMQ_TOKEN_TYPE_NORMAL;
        if (types) llmq_gguf_kv_arr_i64(types, (uint64_t)i, &ty);
        t->type[i] = (int32_t)ty;
    }
    if (merges) {
        if ((st = merges_alloc(t, (int64_t)merges->n)) != LLMQ_OK) goto fail;
        for (uint64_t j = 0; j < merges->n; j++) {
            size_t len;
            const char *s = llmq_gguf_kv_arr_str(merges, j, &len);
            const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL; // word.find(' ', 1)
            size_t ln = sp ? (size_t)(sp - s) : 0, rn = sp ? len - ln - 1 : 0;
            if ((st = merge_add(t, s, ln, sp ? sp + 1 : s, rn, s, len)) != LLMQ_OK) goto fail;
        }
    }
    if (kind == LLMQ_TOKENIZER_SPM) {
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else {
        set_pre(t, pre);
        t->bos = 11, t->eos = 11; // llama.cpp's defaults for gpt2 vocabularies
    }
    if (t->bos >= n) t->bos = -1;
    if (t->eos >= n) t->eos = -1;
    if (t->unk >= n) t->unk = -1;
    if ((st = gguf_opt_bool(g, t, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix)) != LLMQ_OK ||
        (st = gguf_opt_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos)) != LLMQ_OK ||
        (st = gguf_opt_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos)) != LLMQ_OK ||
        (st = gguf_opt_id(g, t, "tokenizer.ggml.unknown_token_id", &t->unk)) != LLMQ_OK ||
        (st = gguf_opt_id(g, t, "tokenizer.ggml.padding_token_id", &t->pad)) != LLMQ_OK ||
        (st = gguf_opt_bool(g, t, "tokenizer.ggml.add_bos_token", &t->add_bos)) != LLMQ_OK ||
        (st = gguf_opt_bool(g, t, "tokenizer.ggml.add_eos_token", &t->add_eos)) != LLMQ_OK)
        goto fail;
    const char *name = NULL;
    const struct llmq_gguf_kv *nkv = llmq_gguf_find_kv(g, "general.name");
    if (nkv) name = llmq_gguf_kv_as_str(nkv, NULL);
    if ((st = tok_finalize(t, name)) != LLMQ_OK) goto fail;
    *out = t;
    return LLMQ_OK;
fail:
    llmq_tokenizer_free(t);
    return st;
}

// ================================================================================================
// Loading from a Hugging Face directory (tokenizer.json + tokenizer_config.json [+ config.json]),
// mirroring what llama.cpp's convert_hf_to_gguf.py + gguf-py's SpecialVocab would put in a GGUF.
// ================================================================================================

// Pre-tokenizer patterns as tokenizer.json files spell them (Split.pattern.Regex).
static const char RE_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_GPT2_SHORT[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

static const char *jtype(json_t *o) {
    json_t *ty = json_is_object(o) ? json_object_get(o, "type") : NULL;
    return json_is_string(ty) ? json_string_value(ty) : "";
}

// The steps of a (possibly Sequence) pre_tokenizer / normalizer: *n entries into v (at most 8).
static int jsteps(json_t *o, const char *seq_key, json_t **v) {
    if (!o || json_is_null(o)) return 0;
    if (strcmp(jtype(o), "Sequence") == 0) {
        json_t *arr = json_object_get(o, seq_key);
        int n = 0;
        size_t i;
        json_t *e;
        json_array_foreach(arr, i, e) {
            if (n == 8) return -1;
            v[n++] = e;
        }
        return n;
    }
    v[0] = o;
    return 1;
}

static bool jbool(json_t *o, const char *key, bool dflt) {
    json_t *b = json_is_object(o) ? json_object_get(o, key) : NULL;
    return json_is_boolean(b) ? json_is_true(b) : dflt;
}

// The content of a tokenizer_config.json token entry ("text" or {"content": "text"}), or NULL.
static const char *jtoken_content(json_t *e) {
    if (json_is_string(e)) return json_string_value(e);
    if (json_is_object(e) && json_is_string(json_object_get(e, "content")))
        return json_string_value(json_object_get(e, "content"));
    return NULL;
}

// A short printable excerpt of o for messages.
static void jexcerpt(json_t *o, char *buf, size_t n) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    snprintf(buf, n, "%s", s ? s : "null");
    if (s && strlen(s) >= n && n > 4) memcpy(buf + n - 4, "...", 4);
    free(s);
}

// convert_hf_to_gguf.py does_token_look_special
static bool looks_special(const char *s) {
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]")) return true;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return true;
    if (n >= 8 && !strncmp(s, "<\xef\xbd\x9c", 4) && !strcmp(s + n - 4, "\xef\xbd\x9c>")) return true;
    if (n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>') return true;
    return false;
}

static bool is_byte_piece(const char *s, size_t n) {
    return n == 6 && !memcmp(s, "<0x", 3) && isxdigit((unsigned char)s[3]) && isxdigit((unsigned char)s[4]) &&
           s[5] == '>';
}

// Id of the token with text s: first among the added tokens (gguf-py's rule), else the vocabulary.
static int32_t hf_token_id(const struct llmq_tokenizer *t, json_t *added, const char *s) {
    size_t i;
    json_t *e;
    json_array_foreach(added, i, e) {
        json_t *c = json_object_get(e, "content"), *id = json_object_get(e, "id");
        if (json_is_string(c) && !strcmp(json_string_value(c), s) && json_is_integer(id)) {
            json_int_t v = json_integer_value(id);
            if (v >= 0 && v < t->n_vocab) return (int32_t)v;
        }
    }
    return text_to_token(t, s, strlen(s));
}

// A GGUF-style merge text for a pair: parts with spaces get U+0120 for ' ' (as gguf-py).
static enum llmq_status hf_merge_pair(struct llmq_tokenizer *t, const char *l, size_t ln, const char *r, size_t rn) {
    size_t cap = 2 * (ln + rn) + 2;
    char *buf = malloc(cap), *p = buf;
    if (!buf) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", t->src);
    for (size_t i = 0; i < ln; i++) p = l[i] == ' ' ? (memcpy(p, "\xc4\xa0", 2), p + 2) : (*p = l[i], p + 1);
    size_t la = (size_t)(p - buf);
    *p++ = ' ';
    for (size_t i = 0; i < rn; i++) p = r[i] == ' ' ? (memcpy(p, "\xc4\xa0", 2), p + 2) : (*p = r[i], p + 1);
    size_t tn = (size_t)(p - buf);
    enum llmq_status st = merge_add(t, buf, la, buf + la + 1, tn - la - 1, buf, tn);
    free(buf);
    return st;
}

static enum llmq_status load_json(const char *path, bool optional, json_t **out) {
    char *data = NULL;
    size_t n = 0;
    *out = NULL;
    if (optional && !llmq_file_exists(path)) return LLMQ_OK;
    enum llmq_status st = llmq_read_file(path, MAX_HF_JSON, &data, &n);
    if (st != LLMQ_OK) return st;
    json_error_t err;
    json_t *root = json_loadb(data, n, JSON_ALLOW_NUL, &err);
    free(data);
    if (!root)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: bad JSON at line %d column %d: %s", path, err.line, err.column,
                           err.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: the top level is not a JSON object", path);
    }
    *out = root;
    return LLMQ_OK;
}

// What tokenizer.json says about the family: BPE or SPM, the pre-tokenizer, the SPM space flags.
struct hf_family {
    enum llmq_tokenizer_kind kind;
    const struct pre_entry *pre; // BPE
    bool meta_prefix, prepend;   // SPM: a "▁" is prepended (Metaspace prefix or a Prepend normalizer)
};

// ---- which family, which pre-tokenizer
static enum llmq_status hf_family_of(const char *path, json_t *root, json_t *model, struct hf_family *fam) {
    char ex[200];
    json_t *pre_steps[8], *norm_steps[8];
    int n_pre = jsteps(json_object_get(root, "pre_tokenizer"), "pretokenizers", pre_steps);
    int n_norm = jsteps(json_object_get(root, "normalizer"), "normalizers", norm_steps);
    if (n_pre < 0 || n_norm < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: pre_tokenizer / normalizer sequence too long", path);
    bool byte_level = false, metaspace = false, meta_prefix = false, replace_space = false, prepend = false;
    for (int i = 0; i < n_pre; i++) {
        const char *ty = jtype(pre_steps[i]);
        if (!strcmp(ty, "ByteLevel")) byte_level = true;
        if (!strcmp(ty, "Metaspace")) {
            metaspace = true;
            json_t *scheme = json_object_get(pre_steps[i], "prepend_scheme");
            if (json_is_string(scheme))
                meta_prefix = strcmp(json_string_value(scheme), "never") != 0;
            else
                meta_prefix = jbool(pre_steps[i], "add_prefix_space", true);
        }
    }
    for (int i = 0; i < n_norm; i++) {
        const char *ty = jtype(norm_steps[i]);
        json_t *pat = json_object_get(norm_steps[i], "pattern");
        json_t *pstr = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
        json_t *content = json_object_get(norm_steps[i], "content"), *prep = json_object_get(norm_steps[i], "prepend");
        if (!strcmp(ty, "Replace") && json_is_string(pstr) && !strcmp(json_string_value(pstr), " ") &&
            json_is_string(content) && !strcmp(json_string_value(content), "\xe2\x96\x81"))
            replace_space = true;
        else if (!strcmp(ty, "Prepend") && json_is_string(prep) && !strcmp(json_string_value(prep), "\xe2\x96\x81"))
            prepend = true;
        else if (strcmp(ty, "NFC") != 0) {
            jexcerpt(norm_steps[i], ex, sizeof(ex));
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: normalizer %s is not supported", path, ex);
        }
    }
    bool byte_fallback = jbool(model, "byte_fallback", false);
    const struct pre_entry *pre = NULL;
    *fam = (struct hf_family){.meta_prefix = meta_prefix, .prepend = prepend};
    if (byte_level) {
        fam->kind = LLMQ_TOKENIZER_BPE;
        if (replace_space || prepend || metaspace)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "%s: a ByteLevel pre-tokenizer mixed with Metaspace / \u2581 normalizers", path);
        const char *t0 = n_pre > 0 ? jtype(pre_steps[0]) : "";
        json_t *last = n_pre > 0 ? pre_steps[n_pre - 1] : NULL;
        bool last_bl = last && !strcmp(jtype(last), "ByteLevel");
        if (n_pre == 1 && last_bl && jbool(last, "use_regex", true)) {
            pre = pre_lookup("gpt-2");
        } else if (n_pre == 2 && last_bl && jbool(last, "use_regex", true) && !strcmp(t0, "Digits") &&
                   jbool(pre_steps[0], "individual_digits", false)) {
            pre = pre_lookup("smollm");
        } else if (n_pre == 2 && last_bl && !jbool(last, "use_regex", true) && !strcmp(t0, "Split")) {
            json_t *pat = json_object_get(pre_steps[0], "pattern");
            json_t *re = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
            json_t *beh = json_object_get(pre_steps[0], "behavior");
            const char *r = json_is_string(re) ? json_string_value(re) : "";
            bool isolated = json_is_string(beh) && !strcmp(json_string_value(beh), "Isolated");
            if (isolated && !jbool(pre_steps[0], "invert", false)) {
                if (!strcmp(r, RE_LLAMA3))
                    pre = pre_lookup("llama-bpe");
                else if (!strcmp(r, RE_QWEN2))
                    pre = pre_lookup("qwen2");
                else if (!strcmp(r, RE_GPT2) || !strcmp(r, RE_GPT2_SHORT))
                    pre = pre_lookup("gpt-2");
            }
        }
        if (!pre) {
            jexcerpt(json_object_get(root, "pre_tokenizer"), ex, sizeof(ex));
            return llmq_errorf(
                LLMQ_ERR_UNSUPPORTED,
                "%s: pre_tokenizer %s is not one llmq implements (ByteLevel = gpt2, "
                "Digits(individual) + ByteLevel = smollm, Split(llama3 / qwen2 / gpt2 regex) + ByteLevel)",
                path, ex);
        }
        fam->pre = pre;
    } else if (byte_fallback || metaspace || replace_space) {
        fam->kind = LLMQ_TOKENIZER_SPM;
        for (int i = 0; i < n_pre; i++)
            if (strcmp(jtype(pre_steps[i]), "Metaspace") != 0) {
                jexcerpt(pre_steps[i], ex, sizeof(ex));
                return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                                   "%s: pre_tokenizer %s is not supported for a SentencePiece-style BPE", path, ex);
            }
    } else {
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: neither a byte-level BPE (ByteLevel pre-tokenizer) nor a SentencePiece-style "
                           "BPE (byte_fallback, Metaspace or a \" \" -> \"\u2581\" normalizer)",
                           path);
    }
    return LLMQ_OK;
}

// ---- vocabulary size: ids of the vocab, of the added tokens, config.json vocab_size
static enum llmq_status hf_vocab_size(const char *path, json_t *vocab, json_t *added, json_t *cfg, int64_t *out) {
    int64_t n_vocab = 0;
    const char *piece;
    json_t *val;
    json_object_foreach(vocab, piece, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_VOCAB)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.vocab[\"%.60s\"] is not a token id in 0..%d", path, piece,
                               MAX_VOCAB - 1);
        if (json_integer_value(val) >= n_vocab) n_vocab = json_integer_value(val) + 1;
    }
    size_t ai;
    json_t *ae;
    if (added) json_array_foreach(added, ai, ae) {
            json_t *id = json_object_get(ae, "id"), *c = json_object_get(ae, "content");
            if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_VOCAB ||
                !json_is_string(c))
                return llmq_errorf(LLMQ_ERR_CORRUPT,
                                   "%s: added_tokens[%zu] needs an \"id\" in 0..%d and a \"content\" string", path, ai,
                                   MAX_VOCAB - 1);
            if (json_integer_value(id) >= n_vocab) n_vocab = json_integer_value(id) + 1;
        }
    json_t *vs = cfg ? json_object_get(cfg, "vocab_size") : NULL;
    if (json_is_integer(vs) && json_integer_value(vs) > n_vocab && json_integer_value(vs) <= MAX_VOCAB)
        n_vocab = json_integer_value(vs);
    if (n_vocab == 0) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: the vocabulary is empty", path);
    // the ids not listed become "[PAD<i>]" tokens: a real vocabulary has few (config.json's vocab_size
    // rounded up); a small file naming one huge id would cost memory and time for nothing, so more gaps
    // than listed tokens + 65536 are refused before anything is allocated
    int64_t listed = (int64_t)json_object_size(vocab) + (added ? (int64_t)json_array_size(added) : 0);
    if (n_vocab - listed > listed + 65536)
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: token ids reach %lld but only %lld tokens are listed: %lld ids would be unused "
                           "padding (at most the listed count + 65536 is accepted)",
                           path, (long long)n_vocab - 1, (long long)listed, (long long)(n_vocab - listed));
    *out = n_vocab;
    return LLMQ_OK;
}

// ---- token texts and types: model.vocab, then added_tokens, then the gaps
static enum llmq_status hf_fill_tokens(struct llmq_tokenizer *t, const char *path, json_t *model, json_t *vocab,
                                       json_t *added) {
    enum llmq_status st = LLMQ_OK;
    const char *piece;
    size_t piece_len, ai;
    json_t *val, *ae;
    json_object_keylen_foreach(vocab, piece, piece_len, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (t->tok_sid[id] >= 0)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: token id %d appears twice in model.vocab", path, id);
        if ((st = tok_set_text(t, id, piece, piece_len)) != LLMQ_OK) return st;
    }
    uint8_t *is_added = calloc((size_t)t->n_vocab, 1);
    if (!is_added) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    if (added) json_array_foreach(added, ai, ae) {
            int32_t id = (int32_t)json_integer_value(json_object_get(ae, "id"));
            const char *c = json_string_value(json_object_get(ae, "content"));
            size_t cn = json_string_length(json_object_get(ae, "content"));
            if (t->tok_sid[id] < 0 || t->str_len[t->tok_sid[id]] != cn ||
                memcmp(str_text(t, t->tok_sid[id]), c, cn) != 0)
                if ((st = tok_set_text(t, id, c, cn)) != LLMQ_OK) goto done;
            bool special = jbool(ae, "special", false) || looks_special(c);
            t->type[id] = special ? LLMQ_TOKEN_TYPE_CONTROL : LLMQ_TOKEN_TYPE_USER_DEFINED;
            is_added[id] = 1;
        }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->tok_sid[i] < 0) { // a gap: convert_hf_to_gguf.py fills it with [PAD<i>], UNUSED
            char pad[32];
            int pn = snprintf(pad, sizeof(pad), "[PAD%d]", i);
            if ((st = tok_set_text(t, i, pad, (size_t)pn)) != LLMQ_OK) goto done;
            t->type[i] = LLMQ_TOKEN_TYPE_UNUSED;
        } else if (!is_added[i] && t->kind == LLMQ_TOKENIZER_SPM &&
                   is_byte_piece(str_text(t, t->tok_sid[i]), t->str_len[t->tok_sid[i]])) {
            t->type[i] = LLMQ_TOKEN_TYPE_BYTE;
        }
    }
    json_t *unk_piece = json_object_get(model, "unk_token");
    if (t->kind == LLMQ_TOKENIZER_SPM && json_is_string(unk_piece)) {
        int32_t id = text_to_token(t, json_string_value(unk_piece), strlen(json_string_value(unk_piece)));
        if (id >= 0) {
            t->unk = id;
            t->type[id] = LLMQ_TOKEN_TYPE_UNKNOWN;
        }
    }
done:
    free(is_added);
    return st;
}

// ---- merges: BPE keeps them; SPM turns them into scores (see the header); llmq's own score / type arrays
static enum llmq_status hf_merges(struct llmq_tokenizer *t, const char *path, json_t *model, json_t *merges) {
    enum llmq_status st;
    enum llmq_tokenizer_kind kind = t->kind;
    int64_t n_vocab = t->n_vocab;
    size_t n_m = json_is_array(merges) ? json_array_size(merges) : 0;
    if (kind == LLMQ_TOKENIZER_BPE && (st = merges_alloc(t, (int64_t)n_m)) != LLMQ_OK) return st;
    if (kind == LLMQ_TOKENIZER_SPM)
        for (int32_t i = 0; i < t->n_vocab; i++)
            t->score[i] = t->type[i] == LLMQ_TOKEN_TYPE_NORMAL ? -(float)((int64_t)n_m + i) : 0.0f;
    for (size_t j = 0; j < n_m; j++) {
        json_t *m = json_array_get(merges, j);
        const char *l = NULL, *r = NULL;
        size_t ln = 0, rn = 0;
        if (json_is_string(m)) { // "a b": split at the first space after the first byte (llama.cpp's rule)
            const char *s = json_string_value(m);
            size_t n = json_string_length(m);
            const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
                return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.merges[%zu] \"%.60s\" is not two tokens", path, j, s);
            l = s, ln = (size_t)(sp - s), r = sp + 1, rn = n - ln - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            l = json_string_value(json_array_get(m, 0)), ln = json_string_length(json_array_get(m, 0));
            r = json_string_value(json_array_get(m, 1)), rn = json_string_length(json_array_get(m, 1));
        } else {
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path,
                               j);
        }
        if (kind == LLMQ_TOKENIZER_BPE) {
            if ((st = hf_merge_pair(t, l, ln, r, rn)) != LLMQ_OK) return st;
            continue;
        }
        // SPM: the merged piece's score is minus the rank of the first merge that makes it
        char *cat = malloc(ln + rn + 1);
        if (!cat) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        memcpy(cat, l, ln);
        memcpy(cat + ln, r, rn);
        int32_t id = text_to_token(t, cat, ln + rn);
        free(cat);
        if (id >= 0 && t->type[id] == LLMQ_TOKEN_TYPE_NORMAL && t->score[id] < -(float)j) t->score[id] = -(float)j;
    }
    json_t *xs = json_object_get(model, "llmq_scores"), *xt = json_object_get(model, "llmq_token_types");
    if (xs) {
        if (!json_is_array(xs) || json_array_size(xs) != (size_t)n_vocab)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.llmq_scores must be an array of %" PRId64 " numbers", path,
                               n_vocab);
        for (int32_t i = 0; i < t->n_vocab; i++) {
            json_t *e = json_array_get(xs, (size_t)i);
            if (!json_is_number(e))
                return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.llmq_scores[%d] is not a number", path, i);
            t->score[i] = (float)json_number_value(e);
        }
    }
    if (xt) {
        if (!json_is_array(xt) || json_array_size(xt) != (size_t)n_vocab)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.llmq_token_types must be an array of %" PRId64 " integers",
                               path, n_vocab);
        for (int32_t i = 0; i < t->n_vocab; i++) {
            json_t *e = json_array_get(xt, (size_t)i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 6)
                return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: model.llmq_token_types[%d] is not a token type 0..6", path,
                                   i);
            t->type[i] = (int32_t)json_integer_value(e);
        }
    }
    return LLMQ_OK;
}

// ---- flags and special ids (gguf-py SpecialVocab: tokenizer_config.json, post_processor, config.json)
static void hf_specials(struct llmq_tokenizer *t, const struct hf_family *fam, json_t *root, json_t *added,
                        json_t *tcfg, json_t *cfg) {
    int64_t n_vocab = t->n_vocab;
    if (fam->kind == LLMQ_TOKENIZER_BPE) {
        set_pre(t, fam->pre);
    } else {
        t->add_bos = true;
        t->add_space_prefix = fam->prepend || fam->meta_prefix;
    }
    const char *names[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    int32_t *ids[4] = {&t->bos, &t->eos, &t->unk, &t->pad};
    for (int k = 0; k < 4; k++) {
        const char *c = tcfg ? jtoken_content(json_object_get(tcfg, names[k])) : NULL;
        int32_t id = c ? hf_token_id(t, added, c) : -1;
        if (id < 0 && cfg) {
            char key[32];
            snprintf(key, sizeof(key), "%s_id", names[k]);
            json_t *v = json_object_get(cfg, key);
            if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < n_vocab)
                id = (int32_t)json_integer_value(v);
        }
        if (id >= 0) *ids[k] = id;
    }
    if (fam->kind == LLMQ_TOKENIZER_SPM) { // llama.cpp's SPM defaults are ids 1, 2, 0: these texts in Llama
        if (t->bos < 0) t->bos = text_to_token(t, "<s>", 3);
        if (t->eos < 0) t->eos = text_to_token(t, "</s>", 4);
        if (t->unk < 0) t->unk = text_to_token(t, "<unk>", 5);
    }
    json_t *pp = json_object_get(root, "post_processor");
    json_t *procs = json_is_object(pp) && json_is_array(json_object_get(pp, "processors"))
                        ? json_object_get(pp, "processors")
                        : NULL;
    size_t n_proc = procs ? json_array_size(procs) : (json_is_object(pp) ? 1 : 0);
    for (size_t k = 0; k < n_proc; k++) {
        json_t *proc = procs ? json_array_get(procs, k) : pp;
        if (strcmp(jtype(proc), "TemplateProcessing") != 0) continue;
        json_t *single = json_object_get(proc, "single");
        if (!json_is_array(single) || json_array_size(single) < 2) continue;
        json_t *first = json_object_get(json_object_get(json_array_get(single, 0), "SpecialToken"), "id");
        json_t *last =
            json_object_get(json_object_get(json_array_get(single, json_array_size(single) - 1), "SpecialToken"), "id");
        if (json_is_string(first)) {
            int32_t id = hf_token_id(t, added, json_string_value(first));
            if (!tcfg && id >= 0) t->bos = id;
            t->add_bos = id >= 0 && id == t->bos;
        }
        if (json_is_string(last)) {
            int32_t id = hf_token_id(t, added, json_string_value(last));
            if (!tcfg && id >= 0) t->eos = id;
            t->add_eos = id >= 0 && id == t->eos;
        }
    }
    if (tcfg) {
        json_t *b = json_object_get(tcfg, "add_bos_token"), *e = json_object_get(tcfg, "add_eos_token");
        if (json_is_boolean(b)) t->add_bos = json_is_true(b);
        if (json_is_boolean(e)) t->add_eos = json_is_true(e);
    }
}

enum llmq_status llmq_tokenizer_load_hf(const char *dir, struct llmq_tokenizer **out) {
    enum llmq_status st = LLMQ_OK;
    struct llmq_tokenizer *t = NULL;
    json_t *root = NULL, *tcfg = NULL, *cfg = NULL;
    char *path = NULL, *tcfg_path = NULL, *cfg_path = NULL;
    if (!out) return llmq_errorf(LLMQ_ERR_ARG, "llmq_tokenizer_load_hf: NULL argument");
    *out = NULL;
    if (!dir) return llmq_errorf(LLMQ_ERR_ARG, "llmq_tokenizer_load_hf: NULL argument");
    path = llmq_path_join(dir, "tokenizer.json");
    tcfg_path = llmq_path_join(dir, "tokenizer_config.json");
    cfg_path = llmq_path_join(dir, "config.json");
    if (!path || !tcfg_path || !cfg_path) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    if ((st = load_json(path, false, &root)) != LLMQ_OK) goto fail;
    if ((st = load_json(tcfg_path, true, &tcfg)) != LLMQ_OK) goto fail;
    if ((st = load_json(cfg_path, true, &cfg)) != LLMQ_OK) goto fail;

#define BAD(status, ...)                                                                                               \
    do {                                                                                                               \
        st = llmq_errorf(status, __VA_ARGS__);                                                                         \
        goto fail;                                                                                                     \
    } while (0)
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) BAD(LLMQ_ERR_CORRUPT, "%s: no \"model\" object", path);
    const char *mtype = jtype(model);
    if (*mtype && strcmp(mtype, "BPE") != 0)
        BAD(LLMQ_ERR_UNSUPPORTED,
            "%s: model.type \"%s\" is not supported (llmq reads BPE models: byte-level or "
            "SentencePiece-style with byte_fallback)",
            path, mtype);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) BAD(LLMQ_ERR_CORRUPT, "%s: model.vocab is missing or not an object", path);
    if (merges && !json_is_array(merges)) BAD(LLMQ_ERR_CORRUPT, "%s: model.merges is not an array", path);
    if (added && !json_is_null(added) && !json_is_array(added))
        BAD(LLMQ_ERR_CORRUPT, "%s: added_tokens is not an array", path);
    if (!json_is_array(added)) added = NULL;
#undef BAD

    struct hf_family fam = {0};
    int64_t n_vocab = 0;
    if ((st = hf_family_of(path, root, model, &fam)) || (st = hf_vocab_size(path, vocab, added, cfg, &n_vocab)))
        goto fail;
    if (!(t = tok_new(path, fam.kind, (int32_t)n_vocab))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if ((st = hf_fill_tokens(t, path, model, vocab, added)) || (st = hf_merges(t, path, model, merges))) goto fail;
    hf_specials(t, &fam, root, added, tcfg, cfg);
    if ((st = tok_finalize(t, NULL)) != LLMQ_OK) goto fail;
    *out = t;
    t = NULL;
fail:
    llmq_tokenizer_free(t);
    json_decref(root);
    json_decref(tcfg);
    json_decref(cfg);
    free(path);
    free(tcfg_path);
    free(cfg_path);
    return st;
}
