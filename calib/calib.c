/*
 * calib/calib.c — calibration sources, statistics, stats / imatrix files (calib/calib.h documents
 * every rule; this file only implements them). The pass that gathers the statistics is calib/calib_run.c.
 * Legend: N tokens, C in-features, L layers.
 */
#include "calib/calib.h"

#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/spill.h"
#include "datasets/datasets.h"
#include "formats/gguf.h"
#include "kernels/gemm.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_TEXT_BYTES ((size_t)4 << 30)

// ---- seeded generator (splitmix64 seeding a xorshift64* stream) -------------------------------------

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

// ---- files and the manifest ----------------------------------------------------------------------------

static void free_texts(char **t, int64_t n) {
    for (int64_t i = 0; t && i < n; i++) free(t[i]);
    free(t);
}

// The texts of buf (len bytes, NUL-terminated, read from path; owned: freed or kept as the one text).
static enum llmq_status split_texts(const char *path, char *buf, size_t len, char ***texts, int64_t *n) {
    *texts = NULL;
    *n = 0;
    char **out = NULL;
    int64_t cnt = 0, cap = 0;
    enum llmq_status st = LLMQ_OK;
    bool jsonl = llmq_ends_with(path, ".jsonl") || llmq_ends_with(path, ".jsonl.gz");
    if (len == 0) {
        free(buf);
        return llmq_errorf(LLMQ_ERR_ARG, "%s: the calibration text is empty (0 bytes%s)", path,
                           llmq_ends_with(path, ".gz") ? " after decompression" : "");
    }
    if (!jsonl) {
        out = malloc(sizeof(*out));
        if (!out) goto nomem;
        out[0] = buf;
        buf = NULL;
        cnt = 1;
    } else {
        int64_t line_no = 0;
        char *p = buf, *end = buf + len;
        while (p < end) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
            line_no++;
            bool blank = true;
            for (size_t i = 0; i < ll; i++)
                if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') blank = false;
            if (!blank) {
                json_error_t je;
                json_t *j = json_loadb(p, ll, 0, &je);
                json_t *t = j ? json_object_get(j, "text") : NULL;
                if (!j || !json_is_string(t)) {
                    json_decref(j);
                    st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: line %lld: %s", path, (long long)line_no,
                                     j ? "no string field \"text\"" : je.text);
                    goto fail;
                }
                if (cnt == cap) {
                    cap = cap ? 2 * cap : 64;
                    char **nt = realloc(out, (size_t)cap * sizeof(*out));
                    if (!nt) {
                        json_decref(j);
                        goto nomem;
                    }
                    out = nt;
                }
                out[cnt] = strdup(json_string_value(t));
                json_decref(j);
                if (!out[cnt]) goto nomem;
                cnt++;
            }
            p += ll + 1;
        }
        if (cnt == 0) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: no texts", path);
            goto fail;
        }
    }
    free(buf);
    *texts = out;
    *n = cnt;
    return LLMQ_OK;
nomem:
    st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
fail:
    free_texts(out, cnt);
    free(buf);
    return st;
}

enum llmq_status llmq_calib_read_texts(const char *path, char ***texts, int64_t *n, char sha256[65]) {
    *texts = NULL;
    *n = 0;
    char *buf = NULL;
    size_t len;
    enum llmq_status st = llmq_file_sha256(path, sha256);
    if (st) return st;
    if ((st = llmq_read_file(path, MAX_TEXT_BYTES, &buf, &len))) return st;
    return split_texts(path, buf, len, texts, n);
}

// ---- token matrix ---------------------------------------------------------------------------------------

static enum llmq_status sample_self(const struct llmq_model *m, int64_t n_seq, int64_t seqlen, uint64_t *rng,
                                    int n_threads, enum llmq_backend be, int32_t *tokens) {
    int32_t bos = llmq_tokenizer_bos(m->tok);
    if (bos < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "calib: --calib self needs a BOS token; %s has none", m->path);
    struct llmq_forward *f = NULL;
    int64_t V = m->hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    double *p = malloc((size_t)V * sizeof(double));
    enum llmq_status st = LLMQ_OK;
    if (!logits || !p) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
        goto done;
    }
    if ((st = llmq_forward_init(m, seqlen, n_threads, &f))) goto done;
    llmq_forward_set_backend(f, be);
    for (int64_t s = 0; s < n_seq; s++) {
        int32_t *t = tokens + s * seqlen;
        t[0] = bos;
        for (int64_t i = 1; i < seqlen; i++) {
            if ((st = llmq_forward_logits(f, t, i, i - 1, logits))) goto done;
            float mx = logits[0];
            for (int64_t v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
            double z = 0;
            for (int64_t v = 0; v < V; v++) z += p[v] = exp((double)(logits[v] - mx));
            double u = rng_unit(rng) * z, c = 0;
            int64_t pick = V - 1;
            for (int64_t v = 0; v < V; v++) {
                c += p[v];
                if (u < c) {
                    pick = v;
                    break;
                }
            }
            t[i] = (int32_t)pick;
        }
        llmq_info("calib: self-sampled sequence %lld/%lld", (long long)s + 1, (long long)n_seq);
    }
done:
    llmq_forward_free(f);
    free(p);
    free(logits);
    return st;
}

void llmq_calib_data_free(struct llmq_calib_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n_src; i++) {
        free(d->src[i].arg);
        free(d->src[i].path);
    }
    free(d->src);
    free(d->tokens);
    memset(d, 0, sizeof(*d));
}

enum llmq_status llmq_calib_data_load(const struct llmq_model *m, const struct llmq_calib_opts *o,
                                      struct llmq_calib_data *out) {
    memset(out, 0, sizeof(*out));
    if (o->n_sources < 1 || o->n_sources > LLMQ_CALIB_MAX_SOURCES)
        return llmq_errorf(LLMQ_ERR_ARG, "calib: between 1 and %d --calib sources are needed", LLMQ_CALIB_MAX_SOURCES);
    if (o->nsamples < 1 || o->seqlen < 2 || o->nsamples > (1 << 20) || o->seqlen > (1 << 20))
        return llmq_errorf(LLMQ_ERR_ARG, "calib: --nsamples must be >= 1 and --seqlen >= 2");
    struct llmq_calib_data d = {.n_seq = o->nsamples, .seqlen = o->seqlen};
    int32_t *stream = NULL;
    int64_t n_stream = 0;
    enum llmq_status st = LLMQ_OK;
    uint64_t rng = splitmix64(o->seed);
    if (!rng) rng = 1;
    // sizes first, from the flags and the model, before any allocation or text is read: the block-boundary
    // activations (N, D) floats (in RAM, or beyond --max-memory in the spill directory), the token matrix
    char what[160];
    uint64_t N = (uint64_t)d.n_seq * (uint64_t)d.seqlen, ram_bytes = llmq_phys_mem_bytes();
    snprintf(what, sizeof what, "calib: --nsamples %lld x --seqlen %lld = %llu tokens x %lld activations",
             (long long)d.n_seq, (long long)d.seqlen, (unsigned long long)N, (long long)m->hp.n_embd);
    if ((st = llmq_spill_preflight(N * (uint64_t)m->hp.n_embd * sizeof(float), what))) return st;
    if (ram_bytes && N * sizeof(int32_t) > ram_bytes)
        return llmq_errorf(LLMQ_ERR_NOMEM, "calib: the %llu-token matrix needs more than this machine's RAM",
                           (unsigned long long)N);
    d.src = calloc((size_t)o->n_sources, sizeof(*d.src));
    if (!d.src) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
        goto fail;
    }
    d.n_src = o->n_sources;
    bool self = false;
    for (int i = 0; i < o->n_sources; i++) {
        struct llmq_calib_source *s = &d.src[i];
        const char *a = o->sources[i];
        if (!(s->arg = strdup(a))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
            goto fail;
        }
        if (strcmp(a, "self") == 0) {
            if (o->n_sources != 1) {
                st = llmq_errorf(LLMQ_ERR_ARG, "calib: --calib self cannot be mixed with other sources");
                goto fail;
            }
            s->kind = LLMQ_CALIB_SELF;
            self = true;
            continue;
        }
        char **texts = NULL;
        int64_t nt = 0;
        if (llmq_file_exists(a)) {
            s->kind = LLMQ_CALIB_FILE;
            if (!(s->path = strdup(a))) {
                st = llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
                goto fail;
            }
            if ((st = llmq_calib_read_texts(s->path, &texts, &nt, s->sha256))) goto fail;
        } else {
            // a name (datasets/datasets.h): the recorded sha256 is the manifest's, of the decompressed
            // text, whichever copy (repository .gz or upstream file) was read
            s->kind = LLMQ_CALIB_NAMED;
            struct llmq_dataset ds;
            if ((st = llmq_dataset_load(a, o->manifest, MAX_TEXT_BYTES, &ds))) goto fail;
            if (strcmp(ds.name, "wikitext-2-test") == 0)
                llmq_warn("calib: %s is WikiText-2's test split, the text `llmq eval --ppl wikitext-2` scores: "
                          "perplexity measured on it after calibrating on it is optimistic (wikitext-2-valid is the "
                          "calibration split)",
                          a);
            memcpy(s->sha256, ds.sha256, sizeof(s->sha256));
            s->path = ds.path;
            ds.path = NULL;
            st = split_texts(s->path, ds.data, ds.len, &texts, &nt);
            ds.data = NULL; // owned by split_texts now
            llmq_dataset_free(&ds);
            if (st) goto fail;
        }
        s->n_texts = nt;
        for (int64_t k = 0; k < nt && !st; k++) {
            int32_t *ids = NULL;
            int64_t n_ids = 0;
            if ((st = llmq_tokenize(m->tok, texts[k], strlen(texts[k]), false, false, &ids, &n_ids))) break;
            int32_t *ns = realloc(stream, (size_t)(n_stream + n_ids + 1) * sizeof(int32_t));
            if (!ns) {
                free(ids);
                st = llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
                break;
            }
            stream = ns;
            memcpy(stream + n_stream, ids, (size_t)n_ids * sizeof(int32_t));
            n_stream += n_ids;
            s->n_tokens += n_ids;
            free(ids);
        }
        free_texts(texts, nt);
        if (st) goto fail;
        llmq_info("calib: %s: %s, sha256 %s, %lld texts, %lld tokens", a, s->path, s->sha256, (long long)s->n_texts,
                  (long long)s->n_tokens);
    }
    if (!(d.tokens = malloc((size_t)N * sizeof(int32_t)))) { // (n_seq, seqlen), once the texts are read
        st = llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory for %llu tokens", (unsigned long long)N);
        goto fail;
    }
    if (self) {
        if ((st = sample_self(m, d.n_seq, d.seqlen, &rng, o->n_threads, o->backend, d.tokens))) goto fail;
        d.src[0].n_texts = d.n_seq;
        d.src[0].n_tokens = d.n_seq * d.seqlen;
        n_stream = d.n_seq * d.seqlen;
    } else {
        if (n_stream < d.seqlen) {
            st = llmq_errorf(LLMQ_ERR_ARG, "calib: the sources hold %lld tokens, fewer than --seqlen %lld",
                             (long long)n_stream, (long long)d.seqlen);
            goto fail;
        }
        uint64_t span = (uint64_t)(n_stream - d.seqlen + 1);
        for (int64_t s = 0; s < d.n_seq; s++) {
            int64_t at = (int64_t)(rng_next(&rng) % span);
            memcpy(d.tokens + s * d.seqlen, stream + at, (size_t)d.seqlen * sizeof(int32_t));
        }
    }
    d.n_stream_tokens = n_stream;
    uint8_t dig[32];
    llmq_sha256(d.tokens, (size_t)(d.n_seq * d.seqlen) * sizeof(int32_t), dig); // little-endian hosts only
    llmq_sha256_hex(dig, d.tokens_sha256);
    free(stream);
    *out = d;
    return LLMQ_OK;
fail:
    free(stream);
    llmq_calib_data_free(&d);
    return st;
}

// ---- statistics ------------------------------------------------------------------------------------------

int llmq_calib_slot_of(enum llmq_linear l) {
    switch (l) {
    case LLMQ_LIN_Q:
    case LLMQ_LIN_K:
    case LLMQ_LIN_V: return LLMQ_CALIB_SLOT_Q;
    case LLMQ_LIN_O: return LLMQ_CALIB_SLOT_O;
    case LLMQ_LIN_GATE:
    case LLMQ_LIN_UP: return LLMQ_CALIB_SLOT_GATE;
    case LLMQ_LIN_DOWN: return LLMQ_CALIB_SLOT_DOWN;
    default: return -1;
    }
}

const char *llmq_calib_slot_name(int slot) {
    static const char *n[] = {"attn_in (q/k/v)", "attn_output in", "ffn_in (gate/up)", "ffn_down in"};
    return slot >= 0 && slot < LLMQ_CALIB_N_SLOTS ? n[slot] : "?";
}

static int64_t slot_n_in(const struct llmq_model *m, int slot) {
    switch (slot) {
    case LLMQ_CALIB_SLOT_Q:
    case LLMQ_CALIB_SLOT_GATE: return m->hp.n_embd;
    case LLMQ_CALIB_SLOT_O: return m->hp.n_head * m->hp.head_dim;
    default: return m->hp.shexp ? m->hp.n_ff_shexp : m->hp.n_ff; // qwen2_moe: the shared expert's down
    }
}

// An input's XᵀX sums (C x C f64, zero) in pages of their own: untouched until the first product writes them and
// returned to the system when freed, whatever the heap did with the previous block's (a calloc'd chunk reused
// from the heap is zeroed by hand, so all its pages would count from the start: a moe block's per-expert sums).
static double *xtx_alloc(int64_t C) {
    void *p = mmap(NULL, (size_t)(C * C) * sizeof(double), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void xtx_free(struct llmq_calib_input *in) {
    if (in->xtx) munmap(in->xtx, (size_t)(in->n_in * in->n_in) * sizeof(double));
    in->xtx = NULL;
}

static enum llmq_status input_alloc(struct llmq_calib_input *in, bool with_xtx) {
    int64_t C = in->n_in;
    in->sum_abs = calloc((size_t)C, sizeof(double));
    in->sum_sq = calloc((size_t)C, sizeof(double));
    if (with_xtx) in->xtx = xtx_alloc(C);
    if (!in->sum_abs || !in->sum_sq || (with_xtx && !in->xtx))
        return llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory for statistics of %lld inputs", (long long)C);
    return LLMQ_OK;
}

static void input_release(struct llmq_calib_input *in) {
    xtx_free(in);
    free(in->sum_abs);
    free(in->sum_sq);
    in->xtx = in->sum_abs = in->sum_sq = NULL;
}

// The f32 scratch of kernels/gemm.h llmq_gram_acc_f64 for an input of C columns.
static int64_t gram_scratch_n(int64_t C) { return llmq_gram_scratch_rows(C) * C; }

static enum llmq_status stats_alloc_scratch(struct llmq_calib_stats *s, int64_t need) {
    if (!s->with_xtx) return LLMQ_OK;
    s->scratch = malloc((size_t)need * sizeof(float));
    s->scratch_n = need;
    return s->scratch ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
}

// The per-expert inputs of a moe model (see "Per-expert statistics"); *cmax (the Gram scratch's floats) grows to
// Fe's where that is wider.
static enum llmq_status stats_alloc_experts(const struct llmq_model *m, bool with_xtx, int64_t layer0, int64_t layer1,
                                            struct llmq_calib_stats *out, int64_t *cmax) {
    const int64_t L = m->hp.n_layer, E = m->hp.n_expert;
    out->n_expert = E;
    out->exp = calloc((size_t)(L * E * LLMQ_CALIB_EXP_N_SLOTS), sizeof(*out->exp));
    out->routed = calloc((size_t)(L * E), sizeof(*out->routed));
    if (!out->exp || !out->routed) return llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
    enum llmq_status st = LLMQ_OK;
    for (int64_t i = 0; i < L * E * LLMQ_CALIB_EXP_N_SLOTS && !st; i++) {
        struct llmq_calib_input *in = &out->exp[i];
        int64_t l = i / (E * LLMQ_CALIB_EXP_N_SLOTS);
        in->n_in = i % LLMQ_CALIB_EXP_N_SLOTS == LLMQ_CALIB_EXP_GATE ? m->hp.n_embd : m->hp.n_ff_exp;
        *cmax = gram_scratch_n(in->n_in) > *cmax ? gram_scratch_n(in->n_in) : *cmax;
        if (l >= layer0 && l < layer1) st = input_alloc(in, with_xtx);
    }
    return st;
}

enum llmq_status llmq_calib_stats_init(const struct llmq_model *m, bool with_xtx, int64_t layer0, int64_t layer1,
                                       struct llmq_calib_stats *out) {
    memset(out, 0, sizeof(*out));
    int64_t L = m->hp.n_layer;
    if (layer0 < 0 || layer1 > L || layer0 > layer1) return llmq_errorf(LLMQ_ERR_ARG, "calib: bad layer range");
    out->n_layer = L;
    out->with_xtx = with_xtx;
    out->arch = m->hp.arch;
    out->in = calloc((size_t)(L * LLMQ_CALIB_N_SLOTS), sizeof(*out->in));
    enum llmq_status st = out->in ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "calib: out of memory");
    int64_t cmax = 0;
    for (int64_t l = 0; l < L && !st; l++)
        for (int k = 0; k < LLMQ_CALIB_N_SLOTS && !st; k++) {
            struct llmq_calib_input *in = &out->in[l * LLMQ_CALIB_N_SLOTS + k];
            in->n_in = slot_n_in(m, k);
            cmax = gram_scratch_n(in->n_in) > cmax ? gram_scratch_n(in->n_in) : cmax;
            if (l >= layer0 && l < layer1) st = input_alloc(in, with_xtx);
        }
    if (!st && m->hp.moe) st = stats_alloc_experts(m, with_xtx, layer0, layer1, out, &cmax);
    if (!st) st = stats_alloc_scratch(out, cmax);
    if (st) llmq_calib_stats_free(out);
    return st;
}

void llmq_calib_stats_free(struct llmq_calib_stats *s) {
    if (!s) return;
    for (int64_t i = 0; s->in && i < s->n_layer * LLMQ_CALIB_N_SLOTS; i++) input_release(&s->in[i]);
    for (int64_t i = 0; s->exp && i < s->n_layer * s->n_expert * LLMQ_CALIB_EXP_N_SLOTS; i++) input_release(&s->exp[i]);
    free(s->in);
    free(s->exp);
    free(s->routed);
    free(s->scratch);
    free(s->dataset);
    memset(s, 0, sizeof(*s));
}

static void input_reset(struct llmq_calib_input *in) {
    int64_t C = in->n_in;
    if (in->xtx && in->count) memset(in->xtx, 0, (size_t)(C * C) * sizeof(double)); // untouched pages stay so
    in->count = in->n_seq = 0;
    if (in->sum_abs) memset(in->sum_abs, 0, (size_t)C * sizeof(double));
    if (in->sum_sq) memset(in->sum_sq, 0, (size_t)C * sizeof(double));
}

void llmq_calib_stats_reset(struct llmq_calib_stats *s, int64_t layer) {
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) {
        struct llmq_calib_input *in = &s->in[layer * LLMQ_CALIB_N_SLOTS + k];
        int64_t C = in->n_in;
        in->count = in->n_seq = 0;
        if (in->xtx) memset(in->xtx, 0, (size_t)(C * C) * sizeof(double));
        if (in->sum_abs) memset(in->sum_abs, 0, (size_t)C * sizeof(double));
        if (in->sum_sq) memset(in->sum_sq, 0, (size_t)C * sizeof(double));
    }
    for (int64_t x = 0; x < s->n_expert; x++) {
        for (int k = 0; k < LLMQ_CALIB_EXP_N_SLOTS; k++) {
            input_reset(llmq_calib_expert_input(s, layer, x, k));
        }
        s->routed[layer * s->n_expert + x] = 0;
    }
    s->err = LLMQ_OK;
}

// Adds x (n, in->n_in) to one input's sums; what: its name in messages ("blk.L <slot>").
static enum llmq_status input_add(struct llmq_calib_stats *s, struct llmq_calib_input *in, const char *what,
                                  const float *x, int64_t n, int64_t n_seq) {
    int64_t C = in->n_in;
    if (!in->sum_sq) return llmq_errorf(LLMQ_ERR_ARG, "calib: statistics of %s were not allocated", what);
    for (int64_t t = 0; t < n; t++) {
        const float *r = x + t * C;
        for (int64_t c = 0; c < C; c++) {
            float v = r[c];
            if (!isfinite(v))
                return llmq_errorf(LLMQ_ERR_NUMERIC, "calib: %s: non-finite activation %g at token %lld, channel %lld",
                                   what, (double)v, (long long)t, (long long)c);
            in->sum_abs[c] += fabs((double)v);
            in->sum_sq[c] += (double)v * (double)v;
        }
    }
    if (in->xtx) {
        enum llmq_status st = llmq_gram_acc_f64(s->backend, x, n, C, s->scratch, in->xtx);
        if (st) return st;
    }
    in->count += n;
    in->n_seq += n_seq;
    return LLMQ_OK;
}

enum llmq_status llmq_calib_stats_add(struct llmq_calib_stats *s, int64_t layer, int slot, const float *x, int64_t n,
                                      int64_t n_seq) {
    LLMQ_ASSERT(layer >= 0 && layer < s->n_layer && slot >= 0 && slot < LLMQ_CALIB_N_SLOTS);
    char what[64];
    snprintf(what, sizeof what, "blk.%lld %s", (long long)layer, llmq_calib_slot_name(slot));
    return input_add(s, &s->in[layer * LLMQ_CALIB_N_SLOTS + slot], what, x, n, n_seq);
}

struct llmq_calib_input *llmq_calib_expert_input(const struct llmq_calib_stats *s, int64_t layer, int64_t expert,
                                                 int eslot) {
    if (!s->exp) return NULL;
    LLMQ_ASSERT(layer >= 0 && layer < s->n_layer && expert >= 0 && expert < s->n_expert && eslot >= 0 &&
                eslot < LLMQ_CALIB_EXP_N_SLOTS);
    return &s->exp[(layer * s->n_expert + expert) * LLMQ_CALIB_EXP_N_SLOTS + eslot];
}

void llmq_calib_stats_expert_hook(void *user, int layer, int expert, enum llmq_linear which, const float *in, int64_t n,
                                  int64_t n_in) {
    struct llmq_calib_stats *s = user;
    (void)n_in;
    if (s->err || !s->exp) return;
    const int k = which == LLMQ_LIN_DOWN ? LLMQ_CALIB_EXP_DOWN : LLMQ_CALIB_EXP_GATE;
    char what[64];
    snprintf(what, sizeof what, "blk.%d expert %d %s", layer, expert, k ? "down in" : "gate/up in");
    s->err = input_add(s, llmq_calib_expert_input(s, layer, expert, k), what, in, n, s->n_seq_hint);
}

void llmq_calib_stats_add_routed(struct llmq_calib_stats *s, int64_t layer, const int64_t *counts) {
    for (int64_t x = 0; counts && s->routed && x < s->n_expert; x++) s->routed[layer * s->n_expert + x] += counts[x];
}

static void input_mirror(struct llmq_calib_input *in) {
    if (!in->xtx || in->count == 0) return; // all zeros: nothing to mirror, and its pages stay untouched
    int64_t C = in->n_in;
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < i; j++) in->xtx[i * C + j] = in->xtx[j * C + i];
}

static enum llmq_status input_hessian(const struct llmq_calib_input *in, const char *what, float *H) {
    if (!in || !in->xtx || in->n_seq < 1) return llmq_errorf(LLMQ_ERR_ARG, "calib: no XᵀX gathered for %s", what);
    int64_t C = in->n_in;
    double f = 2.0 / (double)in->n_seq;
    for (int64_t i = 0; i < C * C; i++) H[i] = (float)(f * in->xtx[i]);
    return LLMQ_OK;
}

enum llmq_status llmq_calib_expert_hessian(const struct llmq_calib_stats *s, int64_t layer, int64_t expert, int eslot,
                                           float *H) {
    char what[64];
    snprintf(what, sizeof what, "blk.%lld expert %lld %s", (long long)layer, (long long)expert,
             eslot ? "down in" : "gate/up in");
    return input_hessian(llmq_calib_expert_input(s, layer, expert, eslot), what, H);
}

void llmq_calib_expert_drop_xtx(struct llmq_calib_stats *s, int64_t layer, int64_t expert, int eslot) {
    struct llmq_calib_input *in = llmq_calib_expert_input(s, layer, expert, eslot);
    if (in) xtx_free(in);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void llmq_calib_moe_coverage(const struct llmq_calib_stats *s, int64_t layer, int64_t floor,
                             struct llmq_calib_coverage *c, int64_t *under) {
    const int64_t E = s->n_expert;
    memset(c, 0, sizeof *c);
    if (!s->routed || E < 1) return;
    const int64_t *r = s->routed + layer * E;
    int64_t *sorted = malloc((size_t)E * sizeof(int64_t));
    c->min = c->max = r[0];
    for (int64_t x = 0; x < E; x++) {
        c->min = r[x] < c->min ? r[x] : c->min;
        c->max = r[x] > c->max ? r[x] : c->max;
        if (r[x] < floor) under[c->n_under++] = x;
    }
    if (sorted) { // without memory the median stays 0
        memcpy(sorted, r, (size_t)E * sizeof(int64_t));
        qsort(sorted, (size_t)E, sizeof(int64_t), cmp_i64);
        c->median = sorted[(E - 1) / 2];
    }
    free(sorted);
}

void llmq_calib_stats_hook(void *user, int layer, enum llmq_linear which, const float *in, int64_t n, int64_t n_in) {
    struct llmq_calib_stats *s = user;
    (void)n_in;
    if (s->err) return;
    s->err = llmq_calib_stats_add(s, layer, llmq_calib_slot_of(which), in, n, s->n_seq_hint);
}

void llmq_calib_stats_finish(struct llmq_calib_stats *s, int64_t layer) {
    for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) input_mirror(&s->in[layer * LLMQ_CALIB_N_SLOTS + k]);
    for (int64_t x = 0; x < s->n_expert; x++)
        for (int k = 0; k < LLMQ_CALIB_EXP_N_SLOTS; k++) input_mirror(llmq_calib_expert_input(s, layer, x, k));
    llmq_scratch_release(s->scratch, (size_t)s->scratch_n * sizeof(float));
}

void llmq_calib_stats_drop_xtx(struct llmq_calib_stats *s, int64_t layer, int slot) {
    LLMQ_ASSERT(layer >= 0 && layer < s->n_layer && slot >= 0 && slot < LLMQ_CALIB_N_SLOTS);
    xtx_free(&s->in[layer * LLMQ_CALIB_N_SLOTS + slot]);
}

enum llmq_status llmq_calib_hessian(const struct llmq_calib_stats *s, int64_t layer, int slot, float *H) {
    char what[64];
    snprintf(what, sizeof what, "blk.%lld %s", (long long)layer, llmq_calib_slot_name(slot));
    return input_hessian(&s->in[layer * LLMQ_CALIB_N_SLOTS + slot], what, H);
}

enum llmq_status llmq_calib_hessian_take(struct llmq_calib_stats *s, int64_t layer, int slot, float *H) {
    struct llmq_calib_input *in = &s->in[layer * LLMQ_CALIB_N_SLOTS + slot];
    if (!in->xtx || in->n_seq < 1)
        return llmq_errorf(LLMQ_ERR_ARG, "calib: no XᵀX gathered for blk.%lld %s", (long long)layer,
                           llmq_calib_slot_name(slot));
    const int64_t C = in->n_in, step = (8 << 20) / (8 * C) + 1; // rows per release: about 8 MiB of sums
    const double f = 2.0 / (double)in->n_seq;
    for (int64_t r0 = 0; r0 < C; r0 += step) {
        const int64_t r1 = r0 + step < C ? r0 + step : C;
        for (int64_t i = r0 * C; i < r1 * C; i++) H[i] = (float)(f * in->xtx[i]);
        llmq_scratch_release(in->xtx + r0 * C, (size_t)((r1 - r0) * C) * sizeof(double)); // read: never again
    }
    llmq_calib_stats_drop_xtx(s, layer, slot);
    return LLMQ_OK;
}

// ---- stats file ----------------------------------------------------------------------------------------------

static const char STATS_MAGIC[8] = {'L', 'L', 'M', 'Q', 'C', 'A', 'L', 'S'};
#define STATS_VERSION 1u
#define STATS_HEADER 72
#define LINEAR_NAMES LLMQ_ARCH_LLAMA // a linear's GGUF name is the same in every family

enum llmq_status llmq_calib_stats_save(const struct llmq_calib_stats *s, const char *path) {
    struct llmq_afile f;
    enum llmq_status st = llmq_afile_open(&f, path);
    if (st) return st;
    uint32_t version = STATS_VERSION, flags = s->with_xtx ? 1u : 0u;
    int64_t hdr[3] = {s->n_layer, s->n_seq, s->seqlen};
    llmq_afile_write(&f, STATS_MAGIC, 8);
    llmq_afile_write(&f, &version, 4);
    llmq_afile_write(&f, &flags, 4);
    llmq_afile_write(&f, hdr, sizeof(hdr));
    llmq_afile_write(&f, s->tokens_sha256, 32);
    for (int64_t i = 0; i < s->n_layer * LLMQ_CALIB_N_SLOTS; i++) {
        const struct llmq_calib_input *in = &s->in[i];
        if (!in->sum_sq || !in->sum_abs || (s->with_xtx && !in->xtx)) {
            llmq_afile_abort(&f);
            return llmq_errorf(LLMQ_ERR_ARG, "%s: statistics of layer %lld are missing", path,
                               (long long)(i / LLMQ_CALIB_N_SLOTS));
        }
        int64_t h[2] = {in->n_in, in->count};
        llmq_afile_write(&f, h, sizeof(h));
        llmq_afile_write(&f, in->sum_abs, (size_t)in->n_in * sizeof(double));
        llmq_afile_write(&f, in->sum_sq, (size_t)in->n_in * sizeof(double));
        if (s->with_xtx) llmq_afile_write(&f, in->xtx, (size_t)(in->n_in * in->n_in) * sizeof(double));
    }
    return llmq_afile_commit(&f);
}

enum llmq_status llmq_calib_stats_load(const char *path, struct llmq_calib_stats *out) {
    memset(out, 0, sizeof(*out));
    struct llmq_mmap mm = {0};
    enum llmq_status st = llmq_mmap_open(&mm, path);
    if (st) return st;
    const uint8_t *p = mm.data;
    size_t size = mm.size, off = STATS_HEADER;
    uint32_t version, flags;
    int64_t hdr[3];
    if (size < 8 || memcmp(p, STATS_MAGIC, 8) != 0) {
        st = llmq_errorf(LLMQ_ERR_MAGIC, "%s: not an llmq calibration stats file (magic)", path);
        goto fail;
    }
    if (size < STATS_HEADER) {
        st = llmq_errorf(LLMQ_ERR_TRUNCATED, "%s: header truncated (%zu bytes)", path, size);
        goto fail;
    }
    memcpy(&version, p + 8, 4);
    memcpy(&flags, p + 12, 4);
    memcpy(hdr, p + 16, sizeof(hdr));
    if (version != STATS_VERSION) {
        st = llmq_errorf(LLMQ_ERR_VERSION, "%s: version %u (this llmq reads %u)", path, version, STATS_VERSION);
        goto fail;
    }
    if ((flags & ~1u) || hdr[0] < 1 || hdr[0] > 4096 || hdr[1] < 1 || hdr[2] < 1 || hdr[1] > (1 << 24) ||
        hdr[2] > (1 << 24)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: bad header (flags %u, n_layer %lld, n_seq %lld, seqlen %lld)", path,
                         flags, (long long)hdr[0], (long long)hdr[1], (long long)hdr[2]);
        goto fail;
    }
    out->n_layer = hdr[0];
    out->n_seq = hdr[1];
    out->seqlen = hdr[2];
    out->with_xtx = flags & 1u;
    memcpy(out->tokens_sha256, p + 40, 32);
    out->in = calloc((size_t)(out->n_layer * LLMQ_CALIB_N_SLOTS), sizeof(*out->in));
    if (!out->in) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    int64_t cmax = 0;
    for (int64_t i = 0; i < out->n_layer * LLMQ_CALIB_N_SLOTS; i++) {
        struct llmq_calib_input *in = &out->in[i];
        int64_t h[2];
        if (size - off < sizeof(h)) {
            st = llmq_errorf(LLMQ_ERR_TRUNCATED, "%s: record %lld truncated at offset %zu", path, (long long)i, off);
            goto fail;
        }
        memcpy(h, p + off, sizeof(h));
        off += sizeof(h);
        if (h[0] < 1 || h[0] > (1 << 20) || h[1] < 0) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: record %lld: n_in %lld, count %lld out of range (offset %zu)", path,
                             (long long)i, (long long)h[0], (long long)h[1], off - sizeof(h));
            goto fail;
        }
        uint64_t C = (uint64_t)h[0], need = 2 * C * 8 + (out->with_xtx ? C * C * 8 : 0);
        if (need > size - off) {
            st = llmq_errorf(LLMQ_ERR_TRUNCATED, "%s: record %lld needs %llu bytes at offset %zu, file has %zu", path,
                             (long long)i, (unsigned long long)need, off, size);
            goto fail;
        }
        in->n_in = h[0];
        in->count = h[1];
        in->n_seq = out->n_seq;
        cmax = gram_scratch_n(in->n_in) > cmax ? gram_scratch_n(in->n_in) : cmax;
        if ((st = input_alloc(in, out->with_xtx))) goto fail;
        memcpy(in->sum_abs, p + off, C * 8);
        memcpy(in->sum_sq, p + off + C * 8, C * 8);
        if (out->with_xtx) memcpy(in->xtx, p + off + 2 * C * 8, C * C * 8);
        off += need;
    }
    if (off != size) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %zu trailing bytes after the last record", path, size - off);
        goto fail;
    }
    if ((st = stats_alloc_scratch(out, cmax))) goto fail;
    llmq_mmap_close(&mm);
    return LLMQ_OK;
fail:
    llmq_calib_stats_free(out);
    llmq_mmap_close(&mm);
    return st;
}

// ---- llama.cpp imatrix files ---------------------------------------------------------------------------------

// One entry of an imatrix file: a weight and the statistics of its input; a stacked expert tensor has n_mat = E
// inputs, expert x's at in + x * LLMQ_CALIB_EXP_N_SLOTS.
struct imatrix_entry {
    char name[96]; // "blk.N.<weight>.weight"
    const struct llmq_calib_input *in;
    int64_t n_mat;
};

static void imatrix_add(struct imatrix_entry *e, int64_t *n, enum llmq_arch a, int role, int64_t l,
                        const struct llmq_calib_input *in, int64_t n_mat) {
    llmq_tensor_full_name(a, (enum llmq_tensor_role)role, l, false, e[*n].name, sizeof(e[*n].name));
    e[*n].in = in;
    e[*n].n_mat = n_mat;
    (*n)++;
}

// The entries both writers store, in block order: a dense model's seven linears; a mixture of experts' q, k, v, o,
// router (ffn_gate_inp, the GATE slot), qwen2_moe's shared expert (gate / up / its gate ffn_gate_inp_shexp from the
// GATE slot, down from DOWN) and the stacked ffn_{gate,up,down}_exps (the per-expert inputs), as llama-imatrix
// collects them. Every dense input needs Σx² and a count >= 1 (an expert may have 0: no token reached it).
// *e is malloc'd (n entries), *cmax the widest input.
static enum llmq_status imatrix_entries(const struct llmq_calib_stats *s, const char *path, struct imatrix_entry **e,
                                        int64_t *n, int64_t *cmax) {
    const bool moe = s->n_expert > 0 && s->exp, shexp = moe && llmq_arch_info_of(s->arch)->shexp;
    const enum llmq_arch a = moe ? s->arch : LINEAR_NAMES;
    *n = *cmax = 0;
    if (!(*e = malloc((size_t)(s->n_layer * 12 > 0 ? s->n_layer * 12 : 1) * sizeof(**e))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    for (int64_t l = 0; l < s->n_layer; l++) {
        const struct llmq_calib_input *in = &s->in[l * LLMQ_CALIB_N_SLOTS];
        for (int k = 0; k < LLMQ_LIN_COUNT; k++)
            if (!moe || k < LLMQ_LIN_GATE || shexp)
                imatrix_add(*e, n, a, LLMQ_T_LINEAR_0 + k, l, &in[llmq_calib_slot_of((enum llmq_linear)k)], 1);
        if (!moe) continue;
        imatrix_add(*e, n, a, LLMQ_T_FFN_GATE_INP, l, &in[LLMQ_CALIB_SLOT_GATE], 1);
        if (shexp) imatrix_add(*e, n, a, LLMQ_T_FFN_GATE_INP_SHEXP, l, &in[LLMQ_CALIB_SLOT_GATE], 1);
        const struct llmq_calib_input *x = &s->exp[l * s->n_expert * LLMQ_CALIB_EXP_N_SLOTS];
        imatrix_add(*e, n, a, LLMQ_T_FFN_GATE_EXPS, l, x + LLMQ_CALIB_EXP_GATE, s->n_expert);
        imatrix_add(*e, n, a, LLMQ_T_FFN_UP_EXPS, l, x + LLMQ_CALIB_EXP_GATE, s->n_expert);
        imatrix_add(*e, n, a, LLMQ_T_FFN_DOWN_EXPS, l, x + LLMQ_CALIB_EXP_DOWN, s->n_expert);
    }
    for (int64_t i = 0; i < *n; i++)
        for (int64_t x = 0; x < (*e)[i].n_mat; x++) {
            const struct llmq_calib_input *in = (*e)[i].in + x * LLMQ_CALIB_EXP_N_SLOTS;
            if (!in->sum_sq || in->count < ((*e)[i].n_mat > 1 ? 0 : 1)) {
                enum llmq_status st = llmq_errorf(LLMQ_ERR_ARG, "%s: %s has no Σx² statistics", path, (*e)[i].name);
                free(*e);
                *e = NULL;
                return st;
            }
            *cmax = in->n_in > *cmax ? in->n_in : *cmax;
        }
    return LLMQ_OK;
}

// The statistics of weight `name` (n bytes) of m in s: *in the block input, or expert 0's input of a stacked expert
// tensor (*n_mat E); *key indexes what the entry fills (shared inputs: the first entry in the file fills them).
// False when name is no weight of m whose input llmq keeps.
static bool imatrix_target(struct llmq_calib_stats *s, const struct llmq_model *m, const char *name, size_t n,
                           struct llmq_calib_input **in, int64_t *n_mat, int64_t *key) {
    char buf[128];
    int64_t l;
    if (n >= sizeof(buf)) return false;
    memcpy(buf, name, n);
    buf[n] = '\0';
    int role = llmq_tensor_role_of(m->hp.arch, buf, false, m->hp.n_layer, &l), slot = -1, eslot = -1;
    *n_mat = 1;
    if (role >= LLMQ_T_LINEAR_0 && role < LLMQ_T_LINEAR_0 + LLMQ_LIN_COUNT)
        slot = llmq_calib_slot_of((enum llmq_linear)(role - LLMQ_T_LINEAR_0));
    else if (m->hp.moe && (role == LLMQ_T_FFN_GATE_INP || role == LLMQ_T_FFN_GATE_INP_SHEXP))
        slot = LLMQ_CALIB_SLOT_GATE; // the router's (and the shared expert's gate's) input: the ffn input
    else if (m->hp.moe && (role == LLMQ_T_FFN_GATE_EXPS || role == LLMQ_T_FFN_UP_EXPS))
        eslot = LLMQ_CALIB_EXP_GATE;
    else if (m->hp.moe && role == LLMQ_T_FFN_DOWN_EXPS)
        eslot = LLMQ_CALIB_EXP_DOWN;
    else
        return false;
    if (slot >= 0) {
        *key = l * LLMQ_CALIB_N_SLOTS + slot;
        *in = &s->in[*key];
        return true;
    }
    *key = s->n_layer * LLMQ_CALIB_N_SLOTS + l * LLMQ_CALIB_EXP_N_SLOTS + eslot;
    *in = &s->exp[l * s->n_expert * LLMQ_CALIB_EXP_N_SLOTS + eslot];
    *n_mat = s->n_expert;
    return true;
}

enum llmq_status llmq_calib_imatrix_save(const struct llmq_calib_stats *s, const char *path, const char *dataset) {
    struct llmq_afile f;
    struct imatrix_entry *ent = NULL;
    int64_t Cmax, n;
    enum llmq_status st = imatrix_entries(s, path, &ent, &n, &Cmax);
    if (st) return st;
    float *tmp = malloc((size_t)Cmax * sizeof(float));
    if (!tmp || (st = llmq_afile_open(&f, path))) {
        free(tmp);
        free(ent);
        return st ? st : llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    int32_t n_entries = (int32_t)n, ncall = (int32_t)(s->n_seq > 0 ? s->n_seq : 1);
    llmq_afile_write(&f, &n_entries, 4);
    for (int64_t i = 0; i < n; i++) {
        int32_t len = (int32_t)strlen(ent[i].name), nval = (int32_t)(ent[i].in->n_in * ent[i].n_mat);
        llmq_afile_write(&f, &len, 4);
        llmq_afile_write(&f, ent[i].name, (size_t)len);
        llmq_afile_write(&f, &ncall, 4);
        llmq_afile_write(&f, &nval, 4);
        for (int64_t x = 0; x < ent[i].n_mat; x++) { // an expert no token reached: 1 (llama-imatrix's "partial data")
            const struct llmq_calib_input *in = ent[i].in + x * LLMQ_CALIB_EXP_N_SLOTS;
            for (int64_t c = 0; c < in->n_in; c++)
                tmp[c] = in->count > 0 ? (float)(in->sum_sq[c] / (double)in->count * (double)ncall) : (float)ncall;
            llmq_afile_write(&f, tmp, (size_t)in->n_in * sizeof(float));
        }
    }
    int32_t dlen = (int32_t)strlen(dataset ? dataset : "");
    llmq_afile_write(&f, &ncall, 4); // last_call
    llmq_afile_write(&f, &dlen, 4);
    llmq_afile_write(&f, dataset ? dataset : "", (size_t)dlen);
    free(tmp);
    free(ent);
    return llmq_afile_commit(&f);
}

static int imatrix_entry_cmp(const void *a, const void *b) {
    return strcmp(((const struct imatrix_entry *)a)->name, ((const struct imatrix_entry *)b)->name);
}

enum llmq_status llmq_calib_imatrix_save_gguf(const struct llmq_calib_stats *s, const char *path, const char *dataset) {
    struct imatrix_entry *ent = NULL;
    int64_t Cmax, n;
    enum llmq_status st = imatrix_entries(s, path, &ent, &n, &Cmax);
    if (st) return st;
    float *tmp = NULL;
    struct llmq_gguf_writer *w = NULL;
    if (s->n_seq < 0 || s->n_seq > UINT32_MAX || s->seqlen < 0 || s->seqlen > UINT32_MAX) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: %lld chunks of %lld tokens do not fit the u32 keys", path,
                         (long long)s->n_seq, (long long)s->seqlen);
        goto done;
    }
    if (!(tmp = malloc((size_t)(Cmax > s->n_expert ? Cmax : s->n_expert) * sizeof(float))) ||
        !(w = llmq_gguf_writer_init())) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    qsort(ent, (size_t)n, sizeof(*ent), imatrix_entry_cmp); // llama-imatrix: std::sort of the names
    const char *ds[1] = {dataset};
    if ((st = llmq_gguf_writer_set_str(w, "general.type", "imatrix")) ||
        (st = llmq_gguf_writer_set_arr_str(w, "imatrix.datasets", ds, NULL, dataset && *dataset ? 1 : 0)) ||
        (st = llmq_gguf_writer_set_u32(w, "imatrix.chunk_count", (uint32_t)s->n_seq)) ||
        (st = llmq_gguf_writer_set_u32(w, "imatrix.chunk_size", (uint32_t)s->seqlen)))
        goto done;
    for (int64_t i = 0; i < n && !st; i++) { // (n_mat, C) and (n_mat, 1); ggml drops outer dims of 1
        char tn[128];
        const bool stacked = ent[i].n_mat > 1;
        int64_t sh[2] = {ent[i].n_mat, ent[i].in->n_in}, shc[2] = {ent[i].n_mat, 1};
        snprintf(tn, sizeof(tn), "%s.in_sum2", ent[i].name);
        st = llmq_gguf_writer_add_tensor(w, tn, LLMQ_DTYPE_F32, stacked ? 2 : 1, stacked ? sh : sh + 1);
        snprintf(tn, sizeof(tn), "%s.counts", ent[i].name);
        if (!st) st = llmq_gguf_writer_add_tensor(w, tn, LLMQ_DTYPE_F32, stacked ? 2 : 1, stacked ? shc : shc + 1);
    }
    if (!st) st = llmq_gguf_writer_begin(w, path);
    for (int64_t i = 0; i < n && !st; i++) {
        for (int64_t x = 0; x < ent[i].n_mat && !st; x++) {
            const struct llmq_calib_input *in = ent[i].in + x * LLMQ_CALIB_EXP_N_SLOTS;
            for (int64_t c = 0; c < in->n_in; c++) tmp[c] = (float)in->sum_sq[c];
            st = llmq_gguf_writer_write_tensor(w, tmp, (size_t)in->n_in * sizeof(float));
        }
        for (int64_t x = 0; x < ent[i].n_mat; x++) tmp[x] = (float)ent[i].in[x * LLMQ_CALIB_EXP_N_SLOTS].count;
        if (!st) st = llmq_gguf_writer_write_tensor(w, tmp, (size_t)ent[i].n_mat * sizeof(float));
    }
    if (!st) st = llmq_gguf_writer_commit(w);
done:
    llmq_gguf_writer_free(w);
    free(tmp);
    free(ent);
    return st;
}

// The values of one entry (n_mat inputs of C columns, vals f32 unaligned, n_mat · C of them) into in (expert x's at
// in + x · LLMQ_CALIB_EXP_N_SLOTS), with count[x] (GGUF: the counts tensor's, rounded; .dat: ncall for each). A
// dense input needs a count >= 1; an expert no token reached keeps count 0 (llama-quantize's importance 1). name: the
// tensor (entry) the values are in, weight: the weight they are of (for the messages).
static enum llmq_status imatrix_fill(const char *path, const char *name, const char *weight,
                                     struct llmq_calib_input *in, int64_t n_mat, const uint8_t *vals,
                                     const struct llmq_gguf_tensor *counts, int64_t ncall, int64_t chunk_size) {
    const int64_t C = in->n_in;
    for (int64_t x = 0; x < n_mat; x++) {
        struct llmq_calib_input *xi = in + x * LLMQ_CALIB_EXP_N_SLOTS;
        float cnt = (float)ncall;
        if (counts) memcpy(&cnt, (const uint8_t *)counts->view.data + 4 * x, sizeof(cnt));
        if (counts && n_mat > 1 && (!isfinite(cnt) || cnt < 0 || cnt > 9e15f))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: %s of expert %lld is %g", path, counts->view.name, (long long)x,
                               (double)cnt);
        if (counts && n_mat == 1 && (!isfinite(cnt) || cnt < 0.5f || cnt > 9e15f))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: %s is %g: no tokens were seen for %s", path, counts->view.name,
                               (double)cnt, weight);
        for (int64_t c = 0; c < C; c++) {
            float v;
            memcpy(&v, vals + 4 * (x * C + c), sizeof(v));
            if (!isfinite(v) || v < 0)
                return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: %s value %lld is %g", path, name, (long long)(x * C + c),
                                   (double)v);
            xi->sum_sq[c] = (double)v;
        }
        xi->count = counts ? (int64_t)llroundf(cnt) : ncall > 0 ? ncall : 1; // .dat ncall 0: the values as they are
        xi->n_seq = !counts ? xi->count : chunk_size > 0 ? (xi->count + chunk_size - 1) / chunk_size : 1;
    }
    return LLMQ_OK;
}

// The legacy .dat (layout in calib/calib.h) into out (initialised for m by the caller).
static enum llmq_status imatrix_load_dat(const char *path, const struct llmq_model *m, struct llmq_calib_stats *out,
                                         int64_t *n_used) {
    struct llmq_mmap mm = {0};
    enum llmq_status st = llmq_mmap_open(&mm, path);
    if (st) return st;
    const uint8_t *p = mm.data;
    size_t size = mm.size, off = 0;
    int32_t n_entries;
    bool *seen = calloc((size_t)(out->n_layer * (LLMQ_CALIB_N_SLOTS + LLMQ_CALIB_EXP_N_SLOTS)), sizeof(bool));
    if (!seen) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
#define NEED(n, what)                                                                                                  \
    if ((size_t)(n) > size - off) {                                                                                    \
        st = llmq_errorf(LLMQ_ERR_TRUNCATED, "%s: %s truncated at offset %zu", path, what, off);                       \
        goto done;                                                                                                     \
    }
    NEED(4, "entry count");
    memcpy(&n_entries, p, 4);
    off = 4;
    if (n_entries < 1 || n_entries > (1 << 20)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %d entries (not an imatrix .dat file?)", path, n_entries);
        goto done;
    }
    for (int32_t e = 0; e < n_entries; e++) {
        int32_t len, ncall, nval;
        NEED(4, "name length");
        memcpy(&len, p + off, 4);
        off += 4;
        if (len < 1 || len > 1024) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: entry %d: name length %d", path, e, len);
            goto done;
        }
        NEED(len + 8, "entry");
        char name[1025];
        memcpy(name, p + off, (size_t)len);
        name[len] = '\0';
        off += (size_t)len;
        memcpy(&ncall, p + off, 4);
        memcpy(&nval, p + off + 4, 4);
        off += 8;
        if (nval < 0 || nval > (1 << 24) || ncall < 0) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s: nval %d, ncall %d", path, name, nval, ncall);
            goto done;
        }
        NEED((size_t)nval * 4, "values");
        const uint8_t *vals = p + off;
        off += (size_t)nval * 4;
        struct llmq_calib_input *in;
        int64_t n_mat, key;
        if (!imatrix_target(out, m, name, (size_t)len, &in, &n_mat, &key)) {
            llmq_warn("%s: entry %s is not a linear weight of %s; ignored", path, name, m->path);
            continue;
        }
        if (nval != in->n_in * n_mat) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s has %d values, the model's input has %lld%s", path, name, nval,
                             (long long)(in->n_in * n_mat), n_mat > 1 ? " (its experts' inputs together)" : "");
            goto done;
        }
        if (seen[key]) continue; // q/k/v (gate/up, the router, gate_exps / up_exps) share one input
        seen[key] = true;
        if ((st = imatrix_fill(path, name, name, in, n_mat, vals, NULL, ncall, 0))) goto done;
        (*n_used)++;
    }
    // last_call and the dataset name follow; optional (older files end here)
    int32_t dlen;
    if (size - off >= 8 && (memcpy(&dlen, p + off + 4, 4), dlen > 0) && (size_t)dlen <= size - off - 8 &&
        !(out->dataset = strndup((const char *)p + off + 8, (size_t)dlen))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    out->n_seq = 1;
    out->seqlen = 1;
#undef NEED
done:
    free(seen);
    llmq_mmap_close(&mm);
    return st;
}

// Tensor `name` of g, or NULL; name_len bytes of base followed by suffix.
static const struct llmq_gguf_tensor *imatrix_sibling(const struct llmq_gguf *g, const char *base, size_t base_len,
                                                      const char *suffix) {
    char buf[512];
    if (base_len + strlen(suffix) >= sizeof(buf)) return NULL;
    memcpy(buf, base, base_len);
    strcpy(buf + base_len, suffix);
    return llmq_gguf_find_tensor(g, buf);
}

static bool strip_suffix(const char *name, const char *suffix, size_t *base_len) {
    size_t n = strlen(name), k = strlen(suffix);
    if (n <= k || strcmp(name + n - k, suffix) != 0) return false;
    *base_len = n - k;
    return true;
}

static int64_t tensor_nelements(const struct llmq_gguf_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < LLMQ_MAX_DIMS; d++) n *= t->ne[d];
    return n;
}

// The GGUF form (layout in calib/calib.h) into out (initialised for m by the caller).
static enum llmq_status imatrix_load_gguf(const char *path, const struct llmq_model *m, struct llmq_calib_stats *out,
                                          int64_t *n_used) {
    struct llmq_gguf *g = NULL;
    bool *seen = NULL;
    int64_t n_ignored = 0, chunk_count = 0, chunk_size = 0;
    enum llmq_status st = llmq_gguf_open(path, &g);
    if (st) return st;
    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, "general.type");
    const char *type = kv ? llmq_gguf_kv_as_str(kv, NULL) : "imatrix";
    if (!type || strcmp(type, "imatrix") != 0) {
        st = llmq_errorf(LLMQ_ERR_MAGIC,
                         "%s: general.type is %s%s%s, not \"imatrix\" (a model, not an importance matrix?)", path,
                         type ? "\"" : "", type ? type : "not a string", type ? "\"" : "");
        goto done;
    }
    static const char *const keys[] = {"imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"};
    for (int k = 0; k < 3; k++)
        if (!llmq_gguf_find_kv(g, keys[k])) {
            st = llmq_errorf(LLMQ_ERR_NOT_FOUND,
                             "%s: no %s key: not a llama-imatrix GGUF file (llama-quantize refuses it too)", path,
                             keys[k]);
            goto done;
        }
    const struct llmq_gguf_kv *ds;
    if ((st = llmq_gguf_get_arr(g, "imatrix.datasets", LLMQ_GGUF_TYPE_STRING, &ds)) ||
        (st = llmq_gguf_get_i64(g, "imatrix.chunk_count", &chunk_count)) ||
        (st = llmq_gguf_get_i64(g, "imatrix.chunk_size", &chunk_size)))
        goto done;
    if (chunk_count < 0 || chunk_count > UINT32_MAX || chunk_size < 0 || chunk_size > UINT32_MAX) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: imatrix.chunk_count %lld / chunk_size %lld out of range", path,
                         (long long)chunk_count, (long long)chunk_size);
        goto done;
    }
    if (ds->n > 0) {
        size_t len;
        const char *d = llmq_gguf_kv_arr_str(ds, ds->n - 1, &len);
        if (!(out->dataset = strndup(d, len))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
    }
    if (!(seen = calloc((size_t)(out->n_layer * (LLMQ_CALIB_N_SLOTS + LLMQ_CALIB_EXP_N_SLOTS)), sizeof(bool)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_gguf_tensor *t = llmq_gguf_tensor_at(g, i), *sums = NULL, *counts = NULL, *in_sum = NULL;
        const char *name = t->view.name;
        size_t bl;
        if (strip_suffix(name, ".in_sum2", &bl))
            sums = t;
        else if (strip_suffix(name, ".counts", &bl))
            counts = t;
        else if (strip_suffix(name, ".in_sum", &bl))
            in_sum = t;
        else
            continue; // not an imatrix tensor (llama.cpp ignores these too)
        if (!sums && !(sums = imatrix_sibling(g, name, bl, ".in_sum2"))) {
            st =
                llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s has no %.*s.in_sum2 beside it", path, name, (int)bl, name);
            goto done;
        }
        if (sums != t) continue; // checked with its in_sum2
        if (!(counts = imatrix_sibling(g, name, bl, ".counts"))) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s has no %.*s.counts beside it", path, name, (int)bl, name);
            goto done;
        }
        in_sum = imatrix_sibling(g, name, bl, ".in_sum");
        const struct llmq_gguf_tensor *all[3] = {sums, counts, in_sum};
        for (int k = 0; k < 3; k++)
            if (all[k] && all[k]->view.dtype != LLMQ_DTYPE_F32) {
                st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s is %s, llama-imatrix writes F32", path,
                                 all[k]->view.name, llmq_dtype_name(all[k]->view.dtype));
                goto done;
            }
        int64_t n_sums = tensor_nelements(sums), n_mat = tensor_nelements(counts);
        if (n_mat < 1 || n_sums < 1 || n_sums % n_mat != 0 || (in_sum && tensor_nelements(in_sum) != n_sums)) {
            st = llmq_errorf(
                LLMQ_ERR_CORRUPT, "%s: tensor %s: %lld sums, %lld counts and %lld in_sum values do not match", path,
                name, (long long)n_sums, (long long)n_mat, (long long)(in_sum ? tensor_nelements(in_sum) : n_sums));
            goto done;
        }
        struct llmq_calib_input *in;
        int64_t n_want, key;
        if (!imatrix_target(out, m, name, bl, &in, &n_want, &key)) {
            if (n_ignored++ == 0)
                llmq_warn("%s: entry %.*s is not a linear weight of %s; ignored (and any more such)", path, (int)bl,
                          name, m->path);
            continue;
        }
        if (n_mat != n_want) {
            st = n_want == 1 ? llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                                           "%s: %s holds %lld expert matrices; %.*s of %s is one dense matrix", path,
                                           name, (long long)n_mat, (int)bl, name, m->path)
                             : llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s holds %lld expert matrices; %s has %lld experts",
                                           path, name, (long long)n_mat, m->path, (long long)n_want);
            goto done;
        }
        if (n_sums != in->n_in * n_mat) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s has %lld values, the model's input has %lld", path, name,
                             (long long)n_sums, (long long)(in->n_in * n_mat));
            goto done;
        }
        if (seen[key]) continue; // q/k/v (gate/up, the router, gate_exps / up_exps) share one input: the first fills it
        seen[key] = true;
        char weight[128];
        snprintf(weight, sizeof(weight), "%.*s", (int)bl, name);
        if ((st = imatrix_fill(path, name, weight, in, n_mat, sums->view.data, counts, 0, chunk_size))) goto done;
        (*n_used)++;
    }
    out->n_seq = chunk_count;
    out->seqlen = chunk_size;
done:
    free(seen);
    llmq_gguf_free(g);
    return st;
}

enum llmq_status llmq_calib_imatrix_load(const char *path, const struct llmq_model *m, struct llmq_calib_stats *out) {
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: cannot open the imatrix: %s", path, strerror(errno));
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    enum llmq_status st = llmq_calib_stats_init(m, false, 0, m->hp.n_layer, out);
    if (st) return st;
    int64_t n_used = 0;
    bool gguf = got == 4 && memcmp(magic, LLMQ_GGUF_MAGIC, 4) == 0;
    st = gguf ? imatrix_load_gguf(path, m, out, &n_used) : imatrix_load_dat(path, m, out, &n_used);
    if (!st && n_used == 0)
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no entry names a linear weight of %s (an imatrix of another model?)",
                         path, m->path);
    if (st) llmq_calib_stats_free(out);
    return st;
}
