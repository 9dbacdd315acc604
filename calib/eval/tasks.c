/*
 * calib/eval/tasks.c — names, item selection, the scored positions of each protocol, the batched
 * forward passes and the statistics of calib/eval/tasks.h (the readers are in task_read.c).
 *
 * A "request" is one causal sequence: the tokens the model reads and the positions whose logits are
 * scored (a contiguous run [lo, lo + n_rows), row r predicting tgt[r]; plus, for llama.cpp's
 * winogrande, one probe position). Requests are sorted by length and packed into forward calls.
 */
#include "calib/eval/tasks.h"

#include "calib/eval/eval.h"
#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { HEAD_ROWS = 256, MAX_SEQ_PER_CALL = 256, MAX_TOKENS_PER_SEQ = 1 << 20 };
#define GROUP_BYTES ((int64_t)256 << 20) // a group's hidden states and one layer's prefix K/V (run_grouped)

static const char *const task_names[LLMQ_TASK_COUNT] = {"hellaswag", "arc-easy",   "arc-challenge",
                                                        "piqa",      "winogrande", "lambada"};

const char *llmq_task_name(enum llmq_task_id id) { return (unsigned)id < LLMQ_TASK_COUNT ? task_names[id] : "?"; }

bool llmq_task_from_name(const char *name, enum llmq_task_id *out) {
    for (int i = 0; name && i < LLMQ_TASK_COUNT; i++)
        if (strcmp(name, task_names[i]) == 0) return *out = (enum llmq_task_id)i, true;
    return false;
}

const char *llmq_task_protocol_name(enum llmq_task_protocol p) {
    return p == LLMQ_TASK_PROTOCOL_LMEVAL ? "lm-eval" : p == LLMQ_TASK_PROTOCOL_LLAMACPP ? "llamacpp" : "?";
}

bool llmq_task_protocol_from_name(const char *name, enum llmq_task_protocol *out) {
    if (name && strcmp(name, "lm-eval") == 0) return *out = LLMQ_TASK_PROTOCOL_LMEVAL, true;
    if (name && strcmp(name, "llamacpp") == 0) return *out = LLMQ_TASK_PROTOCOL_LLAMACPP, true;
    return false;
}

bool llmq_task_has_norm(enum llmq_task_id id, enum llmq_task_protocol p) {
    return p == LLMQ_TASK_PROTOCOL_LMEVAL && id != LLMQ_TASK_WINOGRANDE && id != LLMQ_TASK_LAMBADA;
}

double llmq_tasks_stderr01(int64_t k, int64_t n) {
    if (n < 2) return 0;
    double mu = (double)k / (double)n;
    double ss = (double)k * (1 - mu) * (1 - mu) + (double)(n - k) * mu * mu; // Σ (x - mean)²
    return sqrt(ss / (double)(n - 1)) / sqrt((double)n);
}

// ---- std::mt19937 and the selections ---------------------------------------------------------------------

void llmq_mt19937_seed(struct llmq_mt19937 *r, uint32_t seed) {
    r->mt[0] = seed;
    for (int i = 1; i < 624; i++) r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->i = 624;
}

uint32_t llmq_mt19937_next(struct llmq_mt19937 *r) {
    if (r->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (r->mt[k] & 0x80000000u) | (r->mt[(k + 1) % 624] & 0x7fffffffu);
            r->mt[k] = r->mt[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        r->i = 0;
    }
    uint32_t y = r->mt[r->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

// libstdc++'s uniform_int_distribution(0, range - 1) on a 32-bit engine (_S_nd, Lemire's method).
static uint32_t uniform_below(struct llmq_mt19937 *r, uint32_t range) {
    uint64_t product = (uint64_t)llmq_mt19937_next(r) * range;
    uint32_t low = (uint32_t)product;
    if (low < range) {
        uint32_t threshold = (uint32_t)(-range) % range;
        while (low < threshold) {
            product = (uint64_t)llmq_mt19937_next(r) * range;
            low = (uint32_t)product;
        }
    }
    return (uint32_t)(product >> 32);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// order (n) <- the indices picked, in the order of the rule (header "Selection").
static void pick(enum llmq_task_id id, enum llmq_task_protocol p, int64_t n_all, int64_t n, bool use_seed,
                 uint64_t seed, int64_t *order, int64_t *aux) {
    for (int64_t i = 0; i < n_all; i++) aux[i] = i;
    if (use_seed) {
        uint64_t s = seed;
        for (int64_t i = 0; i < n; i++) { // partial Fisher-Yates
            int64_t j = i + (int64_t)(splitmix64(&s) % (uint64_t)(n_all - i));
            int64_t t = aux[i];
            aux[i] = aux[j], aux[j] = t;
            order[i] = aux[i];
        }
        qsort(order, (size_t)n, sizeof(*order), cmp_i64);
        return;
    }
    if (p != LLMQ_TASK_PROTOCOL_LLAMACPP || id == LLMQ_TASK_LAMBADA) {
        for (int64_t i = 0; i < n; i++) order[i] = i;
        return;
    }
    struct llmq_mt19937 r;
    llmq_mt19937_seed(&r, 1);
    int64_t left = n_all;
    for (int64_t i = 0; i < n; i++) {
        if (id == LLMQ_TASK_HELLASWAG) { // dist(0, left - 1), then erase (order kept)
            int64_t j = uniform_below(&r, (uint32_t)left);
            order[i] = aux[j];
            memmove(aux + j, aux + j + 1, (size_t)(left - j - 1) * sizeof(*aux));
        } else { // int(scale * rng() * aux.size()), then the last one moves into j
            const float scale = 1.f / (1.f + 4294967295.f);
            int64_t j = (int64_t)(scale * (float)llmq_mt19937_next(&r) * (float)left);
            if (j >= left) j = left - 1; // a draw that rounds to 2^32 (llama.cpp would read past the end)
            order[i] = aux[j];
            aux[j] = aux[left - 1];
        }
        left--;
    }
}

void llmq_task_set_select(struct llmq_task_set *s, int64_t limit, bool use_seed, uint64_t seed) {
    if (limit < 0 || limit > s->n_items) limit = s->n_items;
    if (limit == s->n_items && !use_seed) return;
    int64_t *order = malloc((size_t)(limit + 1) * sizeof(int64_t)), *aux = malloc((size_t)s->n_items * sizeof(int64_t));
    struct llmq_task_item *items = malloc((size_t)(limit + 1) * sizeof(*items));
    char *used = calloc((size_t)s->n_items, 1);
    if (order && aux && items && used) {
        pick(s->id, s->protocol, s->n_items, limit, use_seed, seed, order, aux);
        for (int64_t i = 0; i < limit; i++) items[i] = s->items[order[i]], used[order[i]] = 1;
        for (int64_t i = 0; i < s->n_items; i++)
            for (int c = 0; !used[i] && c < s->items[i].n_choices; c++)
                free(s->items[i].ch[c].ctx), free(s->items[i].ch[c].cont);
        free(s->items);
        s->items = items;
        items = NULL;
        s->n_items = limit;
    } else {
        llmq_warn("tasks: out of memory for the selection of %lld items; all %lld are evaluated", (long long)limit,
                  (long long)s->n_items);
    }
    free(order);
    free(aux);
    free(items);
    free(used);
}

// ---- requests ------------------------------------------------------------------------------------------------

struct req {
    int32_t *tok;       // (n_tok) the tokens read by the model (owned)
    int64_t n_tok;      // tokens fed (>= every scored position + 1)
    int64_t lo, n_rows; // scored positions [lo, lo + n_rows)
    int32_t *tgt;       // (n_rows) owned
    int64_t probe_pos;  // -1 or a position whose log p(probe_tgt) is wanted too
    int32_t probe_tgt;  //
    double *lp;         // (n_rows) log-probs, filled by the forward pass (owned)
    double probe_lp;    //
    bool greedy;        // every target was the argmax
    int64_t item;       // index into the set
    int choice;         //
    int64_t pre;        // tokens [0, pre) are the item's shared prefix, run once (0: none; header "How the model
                        // is run"); the scored positions are all >= pre
    // --emulate llamacpp-cpu, protocol llamacpp (lc_plan): where llama-perplexity's batch holds this request's
    // tokens: position p < lc_cp (the choices' common prefix) at lc_base + p, p >= lc_cp at lc_own + p - lc_cp, in a
    // batch of lc_total tokens (0: not planned)
    int64_t lc_len, lc_cp, lc_base, lc_own, lc_total;
};

static void req_free(struct req *r) {
    free(r->tok);
    free(r->tgt);
    free(r->lp);
}

static enum llmq_status tok(const struct llmq_model *m, const char *s, int32_t **ids, int64_t *n) {
    return llmq_tokenize(m->tok, s, strlen(s), true, false, ids, n);
}

// Allocates r's target and log-prob arrays for n rows and sets the targets from seq[lo + 1 ...].
static enum llmq_status req_rows(struct req *r, const int32_t *seq, int64_t lo, int64_t n) {
    if (n < 0) n = 0;
    r->lo = lo;
    r->n_rows = n;
    r->probe_pos = -1;
    r->tgt = malloc((size_t)(n + 1) * sizeof(int32_t));
    r->lp = calloc((size_t)(n + 1), sizeof(double));
    if (!r->tgt || !r->lp) return llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory");
    for (int64_t k = 0; k < n; k++) r->tgt[k] = seq[lo + 1 + k];
    return LLMQ_OK;
}

// lm-eval's request for one (context, continuation) pair (header "Protocol lm-eval").
static enum llmq_status lmeval_req(const struct llmq_model *m, const struct llmq_task_choice *ch, struct req *r) {
    size_t nc = strlen(ch->ctx), ns = 0;
    while (ns < nc && strchr(" \t\n\r\v\f", ch->ctx[nc - 1 - ns])) ns++;
    char *ctx = malloc(nc - ns + 1), *whole = malloc(nc + strlen(ch->cont) + 1);
    int32_t *we = NULL, *ce = NULL;
    int64_t nw = 0, nce = 0;
    enum llmq_status st = LLMQ_OK;
    if (!ctx || !whole) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory");
        goto done;
    }
    memcpy(ctx, ch->ctx, nc - ns);
    ctx[nc - ns] = '\0';
    memcpy(whole, ch->ctx, nc);
    strcpy(whole + nc, ch->cont);
    if ((st = tok(m, whole, &we, &nw)) || (st = tok(m, ctx, &ce, &nce))) goto done;
    int64_t ncont = nw > nce ? nw - nce : 0, pre = nce;
    int32_t prefix = llmq_tokenizer_bos(m->tok) >= 0 ? llmq_tokenizer_bos(m->tok) : llmq_tokenizer_eos(m->tok);
    bool add_prefix = nce == 0; // an empty context reads lm-eval's prefix token (BOS, else EOS)
    if (add_prefix) pre = 1;
    r->n_tok = pre + ncont; // the last token is read only as a target; fed for simplicity of n_tok >= lo + rows
    r->tok = malloc((size_t)(r->n_tok + 1) * sizeof(int32_t));
    if (!r->tok) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory");
        goto done;
    }
    if (add_prefix)
        r->tok[0] = prefix;
    else
        memcpy(r->tok, ce, (size_t)nce * sizeof(int32_t));
    memcpy(r->tok + pre, we + nce, (size_t)ncont * sizeof(int32_t));
    st = req_rows(r, r->tok, pre - 1, ncont);
    r->n_tok = pre + ncont - (ncont > 0); // the model does not need the last token
done:
    free(ctx);
    free(whole);
    free(we);
    free(ce);
    return st;
}

// Tokens of ctx + cont, and with ctx_only of ctx alone too.
static enum llmq_status tok_whole(const struct llmq_model *m, const struct llmq_task_choice *ch, int32_t **ids,
                                  int64_t *n) {
    size_t a = strlen(ch->ctx), b = strlen(ch->cont);
    char *w = malloc(a + b + 1);
    if (!w) return llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory");
    memcpy(w, ch->ctx, a);
    memcpy(w + a, ch->cont, b + 1);
    enum llmq_status st = tok(m, w, ids, n);
    free(w);
    return st;
}

static int64_t common_prefix(int32_t *const *seq, const int64_t *len, int n) {
    int64_t minlen = len[0];
    for (int s = 1; s < n; s++) minlen = len[s] < minlen ? len[s] : minlen;
    int64_t cp = 0;
    for (; cp < minlen; cp++) {
        bool same = true;
        for (int s = 1; s < n && same; s++) same = seq[s][cp] == seq[0][cp];
        if (!same) break;
    }
    return cp;
}

// llama.cpp's requests of one item (header "Protocol llamacpp"): the sequences are taken over by r.
static enum llmq_status llamacpp_reqs(const struct llmq_model *m, enum llmq_task_id id, const struct llmq_task_item *it,
                                      struct req *r) {
    int32_t *seq[LLMQ_TASK_MAX_CHOICES] = {0};
    int64_t len[LLMQ_TASK_MAX_CHOICES] = {0};
    enum llmq_status st = LLMQ_OK;
    int n = it->n_choices;
    for (int c = 0; c < n && !st; c++) st = tok_whole(m, &it->ch[c], &seq[c], &len[c]);
    if (st) goto fail;
    int64_t cp = common_prefix(seq, len, n);
    if (cp == 0) { // llama.cpp has no logits to score the first token with; it starts at 1 here
        llmq_warn("tasks: %s item %lld: the choices share no first token; scoring from the second", llmq_task_name(id),
                  (long long)it->index);
        cp = 1;
    }
    for (int c = 0; c < n; c++) r[c].lc_len = len[c], r[c].lc_cp = cp;
    if (id != LLMQ_TASK_WINOGRANDE || n != 2) {
        for (int c = 0; c < n && !st; c++) {
            r[c].tok = seq[c], r[c].n_tok = len[c] - 1;
            seq[c] = NULL;
            st = req_rows(&r[c], r[c].tok, cp - 1, len[c] - cp);
        }
        if (st) goto fail;
        return LLMQ_OK;
    }
    int64_t nb[2];
    for (int c = 0; c < 2 && !st; c++) { // n_base: tokens of first + choice
        int32_t *b = NULL;
        st = tok(m, it->ch[c].ctx, &b, &nb[c]);
        free(b);
    }
    if (st) goto fail;
    bool skip = len[0] - cp > 3 && len[1] - cp > 3;
    for (int c = 0; c < 2 && !st; c++) {
        int64_t base = skip ? nb[c] : cp;
        int64_t last = len[c] - base > 1 ? 1 : 0;
        int64_t lo = base - 1, rows = len[c] - 1 - last - lo; // positions [base - 1, len - 1 - last)
        if (!skip && c == 1) lo++, rows--;                    // its first term comes from choice 0 (the probe)
        r[c].tok = seq[c];
        r[c].n_tok = len[c];
        seq[c] = NULL;
        if (lo < 0) lo = 0;
        st = req_rows(&r[c], r[c].tok, lo, rows);
    }
    if (!st && !skip) { // llama.cpp's FIXME: choice 1's first token scored on choice 0's last logits
        r[0].probe_pos = len[0] - 1;
        r[0].probe_tgt = r[1].tok[cp];
    }
    if (st) goto fail;
    return LLMQ_OK;
fail:
    for (int c = 0; c < n; c++) free(seq[c]);
    return st;
}

// ---- the forward passes ----------------------------------------------------------------------------------------

struct engine {
    const struct llmq_model *m;
    struct llmq_forward *f;
    int64_t max_tokens, cap_tokens;
    int n_threads;
    int32_t *tokens;   // (max_tokens) one call's input
    float *x;          // (max_tokens, D) activations
    float *xr;         // (HEAD_ROWS, D) gathered rows for the head
    float *logits;     // (HEAD_ROWS, V)
    int32_t *tg;       // (HEAD_ROWS) their targets
    double **dst;      // (HEAD_ROWS) where each row's log-prob goes
    struct req **dreq; // (HEAD_ROWS) its request (greedy flag)
    struct llmq_eval_row *rows;
    uint8_t *fv; // (max_tokens) emulation: a call's rows on llama.cpp's flash-attention vector path (lc_plan)
};

static void engine_free(struct engine *e) {
    llmq_forward_free(e->f);
    free(e->tokens);
    free(e->x);
    free(e->xr);
    free(e->logits);
    free(e->tg);
    free(e->dst);
    free(e->dreq);
    free(e->rows);
    free(e->fv);
}

static enum llmq_status engine_init(struct engine *e, const struct llmq_model *m, const struct llmq_tasks_opts *o,
                                    int64_t max_tokens) {
    const int64_t D = m->hp.n_embd, V = m->hp.n_vocab;
    memset(e, 0, sizeof(*e));
    e->m = m;
    e->max_tokens = max_tokens;
    e->n_threads = o->n_threads < 1 ? 1 : o->n_threads;
    enum llmq_status st = llmq_forward_init(m, max_tokens, e->n_threads, &e->f);
    if (!st) st = llmq_forward_set_emulate(e->f, o->emulate);
    if (st) return st;
    llmq_forward_set_backend(e->f, o->backend);
    e->tokens = malloc((size_t)max_tokens * sizeof(int32_t));
    e->x = malloc((size_t)(max_tokens * D) * sizeof(float));
    e->xr = malloc((size_t)(HEAD_ROWS * D) * sizeof(float));
    e->logits = malloc((size_t)(HEAD_ROWS * V) * sizeof(float));
    e->tg = malloc(HEAD_ROWS * sizeof(int32_t));
    e->dst = malloc(HEAD_ROWS * sizeof(double *));
    e->dreq = malloc(HEAD_ROWS * sizeof(struct req *));
    e->rows = malloc(HEAD_ROWS * sizeof(*e->rows));
    if (o->emulate == LLMQ_EMULATE_LLAMACPP_CPU && !(e->fv = malloc((size_t)max_tokens)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory");
    if (!e->tokens || !e->x || !e->xr || !e->logits || !e->tg || !e->dst || !e->dreq || !e->rows)
        return llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory for %lld-token forward calls", (long long)max_tokens);
    return LLMQ_OK;
}

// Head + scoring of the gathered rows [0, n).
static enum llmq_status flush_rows(struct engine *e, int64_t n) {
    if (n == 0) return LLMQ_OK;
    const int64_t V = e->m->hp.n_vocab;
    enum llmq_status st = llmq_forward_head(e->f, e->xr, n, e->logits);
    if (!st) st = llmq_eval_score(e->logits, NULL, e->tg, n, V, e->n_threads, e->rows);
    if (st) return st;
    for (int64_t i = 0; i < n; i++) {
        *e->dst[i] = -e->rows[i].nll;
        if (e->dst[i] != &e->dreq[i]->probe_lp && e->rows[i].top != e->tg[i]) e->dreq[i]->greedy = false;
    }
    return LLMQ_OK;
}

// Head + scoring of the requests rs (nr) from the final hidden states x (nr * T, D) of a call: row t of
// request s holds its position pre + t.
static enum llmq_status score_rows(struct engine *e, struct req **rs, int nr, const float *x, int64_t T) {
    const int64_t D = e->m->hp.n_embd;
    enum llmq_status st = LLMQ_OK;
    int64_t k = 0;
    for (int s = 0; s < nr && !st; s++) {
        struct req *r = rs[s];
        r->greedy = true;
        for (int64_t i = -1; i < r->n_rows && !st; i++) {
            int64_t pos = i < 0 ? r->probe_pos : r->lo + i;
            if (pos < 0) continue;
            memcpy(e->xr + k * D, x + (s * T + pos - r->pre) * D, (size_t)D * sizeof(float));
            e->tg[k] = i < 0 ? r->probe_tgt : r->tgt[i];
            e->dst[k] = i < 0 ? &r->probe_lp : &r->lp[i];
            e->dreq[k] = r;
            if (++k == HEAD_ROWS) st = flush_rows(e, k), k = 0;
        }
    }
    if (!st) st = flush_rows(e, k);
    return st;
}

// ---- llama-perplexity's batches (--emulate llamacpp-cpu, header "Emulating llama-perplexity's batches") -----------

enum { LC_CTX = 512, LC_BATCH = 2048, LC_UBATCH = 512, LC_FA_TILE_Q = 64 };

// Whether llama.cpp runs the attention of r's position p on flash attention's vector path: its batch is cut into
// n_batch pieces, those into ubatches of n_ubatch tokens (one KV stream: in order), and a ubatch of fewer than
// GGML_FA_TILE_Q queries takes the vector path (ggml-cpu ops.cpp ggml_compute_forward_flash_attn_ext_f16).
static uint8_t lc_favec(const struct req *r, int64_t p) {
    if (r->lc_total <= 0) return 0;
    const int64_t i = p < r->lc_cp ? r->lc_base + p : r->lc_own + p - r->lc_cp;
    const int64_t b0 = i / LC_BATCH * LC_BATCH, nb = r->lc_total - b0 < LC_BATCH ? r->lc_total - b0 : LC_BATCH;
    const int64_t u0 = (i - b0) / LC_UBATCH * LC_UBATCH, nu = nb - u0 < LC_UBATCH ? nb - u0 : LC_UBATCH;
    return nu < LC_FA_TILE_Q;
}

// e->fv for a call over the requests rs (nr), T rows each, row t holding position from[s] + t (< upto[s]: real),
// and hands it to the forward; no-op without the emulation.
static enum llmq_status lc_rows(struct engine *e, struct req *const *rs, int64_t nr, int64_t T, bool prefix) {
    if (!e->fv) return LLMQ_OK;
    for (int64_t s = 0; s < nr; s++) {
        const struct req *r = rs[s];
        const int64_t from = prefix ? 0 : r->pre, upto = prefix ? r->pre : r->n_tok;
        for (int64_t t = 0; t < T; t++) e->fv[s * T + t] = from + t < upto ? lc_favec(r, from + t) : 0;
    }
    return llmq_forward_set_favec_rows(e->f, e->fv);
}

// e->tokens (nr * T) = the tokens [pre, n_tok) of the requests rs (nr), each padded at the end to T.
static void fill_tokens(struct engine *e, struct req **rs, int nr, int64_t T) {
    for (int s = 0; s < nr; s++) {
        const int32_t *tok = rs[s]->tok + rs[s]->pre;
        int64_t n = rs[s]->n_tok - rs[s]->pre;
        memcpy(e->tokens + s * T, tok, (size_t)n * sizeof(int32_t));
        for (int64_t j = n; j < T; j++) e->tokens[s * T + j] = tok[0]; // padding after the end
    }
}

// One forward call over the requests rs (nr), every one no longer than the first, each from position 0;
// fills their log-probs.
static enum llmq_status run_call(struct engine *e, struct req **rs, int nr) {
    const int64_t T = rs[0]->n_tok;
    fill_tokens(e, rs, nr, T);
    enum llmq_status st = llmq_forward_embed(e->f, e->tokens, nr * T, e->x);
    if (!st) st = lc_rows(e, rs, nr, T, false);
    for (int l = 0; !st && l < (int)e->m->hp.n_layer; l++)
        st = llmq_forward_block(e->f, l, &e->m->layers[l], e->x, nr, T, NULL, NULL);
    if (st) return st;
    return score_rows(e, rs, nr, e->x, T);
}

static int cmp_req_len(const void *a, const void *b) {
    const struct req *x = *(struct req *const *)a, *y = *(struct req *const *)b;
    if (x->n_tok != y->n_tok) return x->n_tok < y->n_tok ? 1 : -1;
    return (x->item > y->item) - (x->item < y->item); // stable: the order does not depend on qsort
}

// ---- one task ---------------------------------------------------------------------------------------------------

static double mean_lp(const struct req *r, bool with_probe_of, const struct req *probe_from) {
    double s = 0;
    int64_t n = r->n_rows;
    for (int64_t i = 0; i < r->n_rows; i++) s += r->lp[i];
    if (with_probe_of) s += probe_from->probe_lp, n++;
    return n > 0 ? s / (double)n : -INFINITY;
}

// The per-item figures from the requests of item it (r: its n_choices requests).
static void score_item(enum llmq_task_id id, enum llmq_task_protocol p, const struct llmq_task_item *it,
                       const struct req *r, struct llmq_task_item_result *out) {
    memset(out, 0, sizeof(*out));
    out->index = it->index;
    out->n_choices = it->n_choices;
    out->gold = it->gold;
    out->pred_norm = -1;
    bool lm = p == LLMQ_TASK_PROTOCOL_LMEVAL || id == LLMQ_TASK_LAMBADA;
    out->n_tokens = r[0].pre; // the shared prefix runs once
    for (int c = 0; c < it->n_choices; c++) {
        out->n_tokens += r[c].n_tok - r[c].pre;
        if (lm) {
            double s = 0;
            for (int64_t i = 0; i < r[c].n_rows; i++) s += r[c].lp[i];
            out->score[c] = s;
            out->score_norm[c] = s / (double)it->ch[c].norm_len;
        } else {
            bool probe = id == LLMQ_TASK_WINOGRANDE && c == 1 && r[0].probe_pos >= 0;
            out->score[c] = mean_lp(&r[c], probe, &r[0]);
        }
    }
    out->greedy = r[0].greedy;
    for (int c = 1; c < it->n_choices; c++) {
        if (out->score[c] > out->score[out->pred]) out->pred = c;
    }
    if (!lm && id == LLMQ_TASK_WINOGRANDE) out->pred = out->score[0] > out->score[1] ? 0 : 1; // ties: choice 2
    if (llmq_task_has_norm(id, p)) {
        out->pred_norm = 0;
        for (int c = 1; c < it->n_choices; c++)
            if (out->score_norm[c] > out->score_norm[out->pred_norm]) out->pred_norm = c;
    }
    if (id == LLMQ_TASK_LAMBADA) out->pred = out->greedy ? 0 : -1;
}

static void fill_result(const struct llmq_task_set *s, const struct llmq_task_item_result *ir,
                        struct llmq_task_result *res) {
    int64_t k = 0, kn = 0, n = s->n_items;
    double sum_ll = 0, sum_ll2 = 0;
    for (int64_t i = 0; i < n; i++) {
        k += ir[i].pred == ir[i].gold;
        kn += ir[i].pred_norm == ir[i].gold;
        res->tokens += ir[i].n_tokens;
        sum_ll += ir[i].score[0];
        sum_ll2 += ir[i].score[0] * ir[i].score[0];
    }
    res->acc = (double)k / (double)n;
    res->acc_stderr = llmq_tasks_stderr01(k, n);
    res->has_norm = llmq_task_has_norm(s->id, s->protocol);
    if (res->has_norm) res->acc_norm = (double)kn / (double)n, res->acc_norm_stderr = llmq_tasks_stderr01(kn, n);
    if (s->id == LLMQ_TASK_LAMBADA) {
        double mu = sum_ll / (double)n, var = n > 1 ? (sum_ll2 - n * mu * mu) / (double)(n - 1) : 0;
        res->has_ppl = true;
        res->ppl = exp(-mu);
        res->ppl_stderr = res->ppl * sqrt(var > 0 ? var : 0) / sqrt((double)n);
    }
}

struct task_run {
    struct req *reqs; // (n_req)
    int64_t n_req;
    int64_t *first;      // (n_items) index of each item's first request
    struct req **sorted; // (n_req)
    struct llmq_task_item_result *ir;
};

// Packs the items of s as llama-perplexity does (tools/perplexity/perplexity.cpp hellaswag_score, winogrande_score,
// multiple_choice_score with -c 512 and -np n_par): items in order while the batch's sequences (one per choice) stay
// within max_seq and its tokens within n_par * 512; each item's common prefix once, then every choice's own tokens.
static void lc_plan(const struct llmq_task_set *s, struct task_run *t, int n_par) {
    const int64_t per = s->id == LLMQ_TASK_WINOGRANDE ? 2 * 128 : 4 * 32, max_seq = per < n_par ? per : n_par;
    const int64_t n_ctx = (int64_t)n_par * LC_CTX;
    for (int64_t i0 = 0, i1; i0 < s->n_items; i0 = i1) {
        int64_t n_cur = 0, n_seq = 0;
        for (i1 = i0; i1 < s->n_items; i1++) {
            const struct req *r = &t->reqs[t->first[i1]];
            int64_t need = r[0].lc_cp;
            for (int c = 0; c < s->items[i1].n_choices; c++) need += r[c].lc_len - r[c].lc_cp;
            if (i1 > i0 && (n_cur + need > n_ctx || n_seq + s->items[i1].n_choices > max_seq)) break;
            n_cur += need, n_seq += s->items[i1].n_choices;
        }
        for (int64_t i = i0, at = 0; i < i1; i++) {
            struct req *r = &t->reqs[t->first[i]];
            int64_t own = at + r[0].lc_cp;
            for (int c = 0; c < s->items[i].n_choices; c++) {
                r[c].lc_base = at, r[c].lc_own = own, r[c].lc_total = n_cur;
                own += r[c].lc_len - r[c].lc_cp;
            }
            at = own;
        }
    }
}

static void task_run_free(struct task_run *t) {
    for (int64_t i = 0; i < t->n_req; i++) req_free(&t->reqs[i]);
    free(t->reqs);
    free(t->first);
    free(t->sorted);
    free(t->ir);
}

static enum llmq_status build_reqs(const struct llmq_model *m, const struct llmq_task_set *s, struct task_run *t) {
    int64_t n = 0;
    if (s->n_items < 1) return llmq_errorf(LLMQ_ERR_ARG, "tasks: %s: no items", llmq_task_name(s->id));
    for (int64_t i = 0; i < s->n_items; i++) n += s->items[i].n_choices;
    t->reqs = calloc((size_t)n, sizeof(*t->reqs));
    t->first = malloc((size_t)s->n_items * sizeof(int64_t));
    t->sorted = malloc((size_t)n * sizeof(*t->sorted));
    t->ir = calloc((size_t)s->n_items, sizeof(*t->ir));
    if (!t->reqs || !t->first || !t->sorted || !t->ir) return llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory");
    t->n_req = n;
    enum llmq_status st = LLMQ_OK;
    int64_t k = 0;
    for (int64_t i = 0; i < s->n_items && !st; i++) {
        const struct llmq_task_item *it = &s->items[i];
        t->first[i] = k;
        if (s->protocol == LLMQ_TASK_PROTOCOL_LMEVAL || s->id == LLMQ_TASK_LAMBADA) {
            for (int c = 0; c < it->n_choices && !st; c++) st = lmeval_req(m, &it->ch[c], &t->reqs[k + c]);
        } else {
            st = llamacpp_reqs(m, s->id, it, &t->reqs[k]);
        }
        for (int c = 0; c < it->n_choices && !st; c++) {
            struct req *r = &t->reqs[k + c];
            r->item = i, r->choice = c;
            if (r->n_tok < 1) r->n_tok = 1;
            if (r->n_tok > MAX_TOKENS_PER_SEQ)
                st = llmq_errorf(LLMQ_ERR_ARG, "tasks: %s item %lld has %lld tokens", llmq_task_name(s->id),
                                 (long long)it->index, (long long)r->n_tok);
            t->sorted[k + c] = r;
        }
        k += it->n_choices;
    }
    return st;
}

// ---- shared prefixes (header "How the model is run") --------------------------------------------------------------

// The leading tokens that the n requests r of one item read alike, up to the first scored position (and the
// probe) of any of them and leaving every request at least one token of its own; 0 for a single request.
static int64_t item_prefix(const struct req *r, int n) {
    if (n < 2) return 0;
    int64_t P = r[0].n_tok;
    for (int c = 0; c < n; c++) {
        int64_t lim = r[c].lo < r[c].n_tok - 1 ? r[c].lo : r[c].n_tok - 1;
        if (r[c].probe_pos >= 0 && r[c].probe_pos < lim) lim = r[c].probe_pos;
        if (lim < P) P = lim;
    }
    for (int c = 1; c < n; c++) {
        int64_t k = 0;
        while (k < P && r[c].tok[k] == r[0].tok[k]) k++;
        P = k;
    }
    return P > 0 ? P : 0;
}

// A forward call of a group: sequences [first, first + nr) of a sorted list, padded to T, rows from row0.
struct gcall {
    int64_t first, nr, T, row0;
};

// The group's sequences and buffers, grown as needed and reused by the next group.
struct group {
    int64_t n_pre, n_end, n_pc, n_ec; // prefix / ending sequences, prefix / ending calls
    struct req **pre;                 // (n_pre) the first request of each item with a prefix, by pre desc
    struct req **end;                 // (n_end) every request of the group, by n_tok - pre desc
    struct gcall *pc, *ec;            // (n_pre), (n_end) calls
    int64_t *kv_row;                  // (items of the group) the first row of the item's prefix in kv
    const float **pk, **pv;           // (n_end) each ending's prefix keys / values in kv (NULL: none)
    int64_t *pl;                      // (n_end) its prefix length
    int64_t pre_rows, end_rows;       // rows of xp / xe (padding included)
    float *xp, *xe;                   // (pre_rows, D), (end_rows, D) hidden states
    float *kv;                        // (2, kv_rows, Dkv) the prefixes' keys, then values, of one layer
    size_t cap_seq, cap_xp, cap_xe, cap_kv;
};

static void group_free(struct group *g) {
    free(g->pre), free(g->end), free(g->pc), free(g->ec), free(g->kv_row);
    free(g->pk), free(g->pv), free(g->pl), free(g->xp), free(g->xe), free(g->kv);
}

// *p holds at least need floats (contents not kept).
static bool floats_for(float **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    free(*p);
    *cap = 0;
    if (!(*p = malloc(need * sizeof(float)))) return false;
    *cap = need;
    return true;
}

// The per-sequence arrays for n sequences (contents not kept).
static bool seq_arrays(struct group *g, size_t n) {
    if (n <= g->cap_seq) return true;
    free(g->pre), free(g->end), free(g->pc), free(g->ec), free(g->kv_row), free(g->pk), free(g->pv), free(g->pl);
    g->pre = malloc(n * sizeof(*g->pre)), g->end = malloc(n * sizeof(*g->end));
    g->pc = malloc(n * sizeof(*g->pc)), g->ec = malloc(n * sizeof(*g->ec));
    g->kv_row = malloc(n * sizeof(*g->kv_row)), g->pl = malloc(n * sizeof(*g->pl));
    g->pk = malloc(n * sizeof(*g->pk)), g->pv = malloc(n * sizeof(*g->pv));
    bool ok = g->pre && g->end && g->pc && g->ec && g->kv_row && g->pl && g->pk && g->pv;
    g->cap_seq = ok ? n : 0;
    return ok;
}

static int64_t seq_len(const struct req *r) { return r->n_tok - r->pre; }

static int cmp_seq_len(const void *a, const void *b) { // longest first; then item, choice: a total order
    const struct req *x = *(struct req *const *)a, *y = *(struct req *const *)b;
    if (seq_len(x) != seq_len(y)) return seq_len(x) < seq_len(y) ? 1 : -1;
    if (x->item != y->item) return x->item > y->item ? 1 : -1;
    return (x->choice > y->choice) - (x->choice < y->choice);
}

static int cmp_pre_len(const void *a, const void *b) {
    const struct req *x = *(struct req *const *)a, *y = *(struct req *const *)b;
    if (x->pre != y->pre) return x->pre < y->pre ? 1 : -1;
    return (x->item > y->item) - (x->item < y->item);
}

// Packs the n sequences rs (sorted longest first; lengths pre, else n_tok - pre) into calls of at most
// budget tokens, padding at most 1/8 of a call's rows (endings are short and vary: one call per budget would
// pad more than the prefix saves); returns the number of calls, *rows their rows.
static int64_t pack(struct req **rs, int64_t n, bool prefixes, int64_t budget, struct gcall *calls, int64_t *rows) {
    int64_t nc = 0;
    *rows = 0;
    for (int64_t i = 0; i < n;) {
        int64_t T = prefixes ? rs[i]->pre : seq_len(rs[i]), nr = 0, real = 0;
        while (i + nr < n && nr < MAX_SEQ_PER_CALL && (nr + 1) * T <= budget) {
            int64_t len = prefixes ? rs[i + nr]->pre : seq_len(rs[i + nr]);
            if (nr > 0 && 8 * ((nr + 1) * T - real - len) > (nr + 1) * T) break; // padding over 1/8 of the call
            real += len, nr++;
        }
        calls[nc++] = (struct gcall){i, nr, T, *rows};
        *rows += nr * T;
        i += nr;
    }
    return nc;
}

// Lists, packs and allocates the group of items [i0, i1) of t.
static enum llmq_status group_plan(struct engine *e, const struct task_run *t, const struct llmq_task_set *s,
                                   int64_t i0, int64_t i1, struct group *g) {
    const int64_t D = e->m->hp.n_embd, Dkv = e->m->hp.n_head_kv * e->m->hp.head_dim;
    int64_t n_seq = 0, kv_rows = 0;
    for (int64_t i = i0; i < i1; i++) n_seq += s->items[i].n_choices;
    if (!seq_arrays(g, (size_t)n_seq)) goto nomem;
    g->n_pre = g->n_end = 0;
    for (int64_t i = i0; i < i1; i++) {
        struct req *r = &t->reqs[t->first[i]];
        if (r->pre > 0) g->pre[g->n_pre++] = r;
        for (int c = 0; c < s->items[i].n_choices; c++) g->end[g->n_end++] = &r[c];
    }
    qsort(g->pre, (size_t)g->n_pre, sizeof(*g->pre), cmp_pre_len);
    qsort(g->end, (size_t)g->n_end, sizeof(*g->end), cmp_seq_len);
    g->n_pc = pack(g->pre, g->n_pre, true, e->max_tokens, g->pc, &g->pre_rows);
    g->n_ec = pack(g->end, g->n_end, false, e->max_tokens, g->ec, &g->end_rows);
    for (int64_t j = 0; j < g->n_pre; j++) g->kv_row[g->pre[j]->item - i0] = kv_rows, kv_rows += g->pre[j]->pre;
    if (!floats_for(&g->xp, &g->cap_xp, (size_t)(g->pre_rows * D + 1)) ||
        !floats_for(&g->xe, &g->cap_xe, (size_t)(g->end_rows * D)) ||
        !floats_for(&g->kv, &g->cap_kv, (size_t)(2 * kv_rows * Dkv + 1)))
        goto nomem;
    for (int64_t j = 0; j < g->n_end; j++) {
        const struct req *r = g->end[j];
        int64_t row = r->pre > 0 ? g->kv_row[r->item - i0] : 0;
        g->pl[j] = r->pre;
        g->pk[j] = r->pre > 0 ? g->kv + row * Dkv : NULL;
        g->pv[j] = r->pre > 0 ? g->kv + (kv_rows + row) * Dkv : NULL;
    }
    return LLMQ_OK;
nomem:
    return llmq_errorf(LLMQ_ERR_NOMEM, "tasks: out of memory for a group of %lld items", (long long)(i1 - i0));
}

// Runs the planned group g through the model layer by layer (every call of a layer before the next layer, so
// that kv holds one layer's prefixes) and scores its requests. pr: the task's progress, done_tok the tokens of
// the groups before, g_tok this group's.
static enum llmq_status group_run(struct engine *e, struct group *g, const struct llmq_tasks_opts *o,
                                  struct llmq_tasks_progress *pr, int64_t done_tok, int64_t g_tok, double t0) {
    const int64_t D = e->m->hp.n_embd, Dkv = e->m->hp.n_head_kv * e->m->hp.head_dim, L = e->m->hp.n_layer;
    enum llmq_status st = LLMQ_OK;
    for (int64_t c = 0; c < g->n_pc && !st; c++) { // a prefix is the first request's tokens [0, pre)
        const struct gcall *k = &g->pc[c];
        for (int64_t s = 0; s < k->nr; s++) {
            const struct req *r = g->pre[k->first + s];
            memcpy(e->tokens + s * k->T, r->tok, (size_t)r->pre * sizeof(int32_t));
            for (int64_t j = r->pre; j < k->T; j++) e->tokens[s * k->T + j] = r->tok[0];
        }
        st = llmq_forward_embed(e->f, e->tokens, k->nr * k->T, g->xp + k->row0 * D);
    }
    for (int64_t c = 0; c < g->n_ec && !st; c++) {
        const struct gcall *k = &g->ec[c];
        fill_tokens(e, g->end + k->first, (int)k->nr, k->T);
        st = llmq_forward_embed(e->f, e->tokens, k->nr * k->T, g->xe + k->row0 * D);
    }
    int64_t kv_total = 0;
    for (int64_t j = 0; j < g->n_pre; j++) kv_total += g->pre[j]->pre;
    for (int l = 0; l < L && !st; l++) {
        int64_t kv_at = 0;
        for (int64_t c = 0; c < g->n_pc && !st; c++) {
            const struct gcall *k = &g->pc[c];
            const float *K, *V;
            st = lc_rows(e, g->pre + k->first, k->nr, k->T, true);
            if (!st) st = llmq_forward_block(e->f, l, &e->m->layers[l], g->xp + k->row0 * D, k->nr, k->T, NULL, NULL);
            llmq_forward_last_kv(e->f, &K, &V);
            for (int64_t s = 0; s < k->nr && !st; s++) { // in g->pre order: kv_row ascending
                size_t n = (size_t)(g->pre[k->first + s]->pre * Dkv) * sizeof(float);
                memcpy(g->kv + kv_at * Dkv, K + s * k->T * Dkv, n);
                memcpy(g->kv + (kv_total + kv_at) * Dkv, V + s * k->T * Dkv, n);
                kv_at += g->pre[k->first + s]->pre;
            }
        }
        for (int64_t c = 0; c < g->n_ec && !st; c++) {
            const struct gcall *k = &g->ec[c];
            st = lc_rows(e, g->end + k->first, k->nr, k->T, false);
            if (!st)
                st = llmq_forward_block_prefixed(e->f, l, &e->m->layers[l], g->xe + k->row0 * D, k->nr, k->T,
                                                 g->pk + k->first, g->pv + k->first, g->pl + k->first);
        }
        pr->tokens_done = done_tok + g_tok * (l + 1) / L;
        pr->elapsed_s = llmq_now_s() - t0;
        if (!st && o->progress && l + 1 < L) o->progress(o->progress_user, pr);
    }
    for (int64_t c = 0; c < g->n_ec && !st; c++) {
        const struct gcall *k = &g->ec[c];
        st = score_rows(e, g->end + k->first, (int)k->nr, g->xe + k->row0 * D, k->T);
    }
    return st;
}

// Every request from position 0, sorted by length and packed into calls (--no-prefix-reuse).
static enum llmq_status run_whole(struct engine *e, struct task_run *t, const struct llmq_tasks_opts *o,
                                  struct llmq_tasks_progress *pr, double t0) {
    enum llmq_status st = LLMQ_OK;
    const int64_t budget = e->max_tokens;
    for (int64_t i = 0; i < t->n_req && !st;) {
        int64_t T = t->sorted[i]->n_tok, nr = 0;
        while (i + nr < t->n_req && nr < MAX_SEQ_PER_CALL && (nr + 1) * T <= budget) nr++;
        st = run_call(e, t->sorted + i, (int)nr);
        for (int64_t j = 0; j < nr; j++) pr->tokens_done += t->sorted[i + j]->n_tok;
        i += nr;
        pr->seq_done = i;
        pr->elapsed_s = llmq_now_s() - t0;
        if (!st && o->progress) o->progress(o->progress_user, pr);
    }
    return st;
}

// Items in file order, in groups of about group_tok tokens, each group's prefixes run once (group_run).
static enum llmq_status run_grouped(struct engine *e, struct task_run *t, const struct llmq_task_set *s,
                                    const struct llmq_tasks_opts *o, struct llmq_tasks_progress *pr, double t0) {
    const struct llmq_hparams *hp = &e->m->hp;
    int64_t group_tok = GROUP_BYTES / (int64_t)sizeof(float) / (hp->n_embd + 2 * hp->n_head_kv * hp->head_dim);
    if (group_tok < e->max_tokens) group_tok = e->max_tokens;
    struct group g = {0};
    enum llmq_status st = LLMQ_OK;
    for (int64_t i0 = 0, i1; i0 < s->n_items && !st; i0 = i1) {
        int64_t g_tok = 0, g_seq = 0;
        for (i1 = i0; i1 < s->n_items; i1++) {
            const struct req *r = &t->reqs[t->first[i1]];
            int64_t c_tok = r->pre;
            for (int c = 0; c < s->items[i1].n_choices; c++) c_tok += seq_len(&r[c]);
            if (i1 > i0 && g_tok + c_tok > group_tok) break;
            g_tok += c_tok, g_seq += s->items[i1].n_choices;
        }
        int64_t done_tok = pr->tokens_done;
        st = group_plan(e, t, s, i0, i1, &g);
        if (!st) st = group_run(e, &g, o, pr, done_tok, g_tok, t0);
        pr->tokens_done = done_tok + g_tok;
        pr->seq_done += g_seq;
        pr->elapsed_s = llmq_now_s() - t0;
        if (!st && o->progress) o->progress(o->progress_user, pr);
    }
    group_free(&g);
    return st;
}

static enum llmq_status run_task(const struct llmq_model *m, const struct llmq_task_set *s,
                                 const struct llmq_tasks_opts *o, struct llmq_task_result *res) {
    struct task_run t = {0};
    struct engine e = {0};
    double t0 = llmq_now_s();
    enum llmq_status st = build_reqs(m, s, &t);
    if (st) goto done;
    if (o->emulate == LLMQ_EMULATE_LLAMACPP_CPU && s->protocol == LLMQ_TASK_PROTOCOL_LLAMACPP &&
        s->id != LLMQ_TASK_LAMBADA)
        lc_plan(s, &t, o->lc_parallel > LLMQ_TASKS_LC_PARALLEL ? o->lc_parallel : LLMQ_TASKS_LC_PARALLEL);
    qsort(t.sorted, (size_t)t.n_req, sizeof(*t.sorted), cmp_req_len);
    int64_t budget = o->max_batch_tokens > 0 ? o->max_batch_tokens : 2048, total = 0;
    if (t.sorted[0]->n_tok > budget) budget = t.sorted[0]->n_tok;
    for (int64_t i = 0; i < s->n_items && !o->no_prefix_reuse; i++) {
        struct req *r = &t.reqs[t.first[i]];
        int64_t P = item_prefix(r, s->items[i].n_choices);
        for (int c = 0; c < s->items[i].n_choices; c++) r[c].pre = P;
        total += P;
    }
    for (int64_t i = 0; i < t.n_req; i++) total += seq_len(&t.reqs[i]);
    if ((st = engine_init(&e, m, o, budget))) goto done;
    struct llmq_tasks_progress pr = {s->id, 0, t.n_req, 0, total, 0};
    st = o->no_prefix_reuse ? run_whole(&e, &t, o, &pr, t0) : run_grouped(&e, &t, s, o, &pr, t0);
    if (st) goto done;
    for (int64_t i = 0; i < s->n_items; i++)
        score_item(s->id, s->protocol, &s->items[i], &t.reqs[t.first[i]], &t.ir[i]);
    fill_result(s, t.ir, res);
    res->seconds = llmq_now_s() - t0;
    if (o->keep_items) res->items = t.ir, t.ir = NULL;
done:
    engine_free(&e);
    task_run_free(&t);
    return st;
}

// ---- the entry -------------------------------------------------------------------------------------------------

enum llmq_status llmq_tasks_parse_list(const char *list, enum llmq_task_id *ids, int *n, const char **paths,
                                       char **buf) {
    *n = 0;
    *buf = NULL;
    for (int i = 0; i < LLMQ_TASK_COUNT; i++) paths[i] = NULL;
    if (!list || !*list) return llmq_errorf(LLMQ_ERR_ARG, "--tasks: empty list");
    if (strcmp(list, "all") == 0) {
        for (int i = 0; i < LLMQ_TASK_COUNT; i++) ids[i] = (enum llmq_task_id)i;
        *n = LLMQ_TASK_COUNT;
        return LLMQ_OK;
    }
    char *copy = malloc(strlen(list) + 1);
    if (!copy) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    strcpy(copy, list);
    *buf = copy;
    bool seen[LLMQ_TASK_COUNT] = {0};
    for (char *save = NULL, *e = strtok_r(copy, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(e, '=');
        if (eq) *eq = '\0';
        enum llmq_task_id id;
        if (!llmq_task_from_name(e, &id))
            return llmq_errorf(LLMQ_ERR_ARG,
                               "--tasks: unknown task '%s' (known: hellaswag, arc-easy, arc-challenge, piqa, "
                               "winogrande, lambada, all)",
                               e);
        if (seen[id]) return llmq_errorf(LLMQ_ERR_ARG, "--tasks: '%s' given twice", e);
        if (eq && !eq[1]) return llmq_errorf(LLMQ_ERR_ARG, "--tasks: '%s=' names no file", e);
        seen[id] = true;
        paths[id] = eq ? eq + 1 : NULL;
        ids[(*n)++] = id;
    }
    if (*n == 0) return llmq_errorf(LLMQ_ERR_ARG, "--tasks: empty list");
    return LLMQ_OK;
}

void llmq_tasks_report_free(struct llmq_tasks_report *r) {
    for (int i = 0; r && i < r->n_tasks; i++) {
        free(r->tasks[i].items);
        free(r->tasks[i].path);
    }
    if (r) free(r->tasks), memset(r, 0, sizeof(*r));
}

enum llmq_status llmq_tasks_run(const struct llmq_model *m, const enum llmq_task_id *ids, int n_ids,
                                const struct llmq_tasks_opts *opts, struct llmq_tasks_report *out) {
    memset(out, 0, sizeof(*out));
    if (!m->tok) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: the model has no tokenizer", m->path);
    out->tasks = calloc((size_t)(n_ids > 0 ? n_ids : 1), sizeof(*out->tasks));
    if (!out->tasks) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    double t0 = llmq_now_s();
    enum llmq_status st = LLMQ_OK;
    for (int i = 0; i < n_ids && !st; i++) {
        struct llmq_task_set s;
        struct llmq_task_result *res = &out->tasks[i];
        if ((st = llmq_task_set_load(ids[i], opts->protocol, opts->paths[ids[i]], &s))) break;
        llmq_task_set_select(&s, opts->limit, opts->use_seed, opts->seed);
        res->id = ids[i];
        res->protocol = opts->protocol;
        res->n_items = s.n_items;
        res->n_file_items = s.n_file_items;
        memcpy(res->sha256, s.sha256, sizeof(res->sha256));
        res->path = s.path, s.path = NULL;
        out->n_tasks = i + 1;
        llmq_info("tasks: %s: %lld of %lld items from %s", llmq_task_name(ids[i]), (long long)s.n_items,
                  (long long)s.n_file_items, res->path);
        st = run_task(m, &s, opts, res);
        llmq_task_set_free(&s);
    }
    out->seconds = llmq_now_s() - t0;
    return st;
}
