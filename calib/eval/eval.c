/*
 * calib/eval/eval.c — text, chunking, per-position math, statistics and the logits file of
 * calib/eval/eval.h. The chunk loop that runs the model is in calib/eval/eval_run.c.
 *
 * The figures mirror llama.cpp tools/perplexity/perplexity.cpp: perplexity() for the chunking and
 * the "Final estimate: PPL = x +/- y" line, kl_divergence() and its mean_and_uncertainty /
 * covariance / percentile helpers for KLD mode.
 */
#include "calib/eval/eval.h"

#include "common/io.h"
#include "formats/ggml/quants.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_TEXT_BYTES ((size_t)1 << 30)
#define MAX_CTX ((int64_t)1 << 20)
#define MAX_VOCAB ((int64_t)1 << 24)
#define MAX_CHUNKS ((int64_t)1 << 24)

static const char *protocol_names[LLMQ_EVAL_PROTOCOL_COUNT] = {"llamacpp", "gptq"};

const char *llmq_eval_protocol_name(enum llmq_eval_protocol p) {
    return (unsigned)p < LLMQ_EVAL_PROTOCOL_COUNT ? protocol_names[p] : "?";
}

bool llmq_eval_protocol_from_name(const char *name, enum llmq_eval_protocol *out) {
    for (int i = 0; i < LLMQ_EVAL_PROTOCOL_COUNT; i++)
        if (name && strcmp(name, protocol_names[i]) == 0) {
            *out = (enum llmq_eval_protocol)i;
            return true;
        }
    return false;
}

int64_t llmq_eval_protocol_default_ctx(enum llmq_eval_protocol p) { return p == LLMQ_EVAL_PROTOCOL_GPTQ ? 2048 : 512; }

// ---- text -------------------------------------------------------------------------------------------

enum llmq_status llmq_eval_read_text(const char *path, char **text, size_t *len) {
    return llmq_read_file(path, MAX_TEXT_BYTES, text, len);
}

static bool blank_row(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n\v\f", s[i]) || s[i] == '\0') return false;
    return true;
}

enum llmq_status llmq_eval_join_rows(const char *text, size_t len, char **out, size_t *out_len) {
    // Every row adds at most 2 bytes ("\n\n") and rows are at most len + 1 (a trailing empty one is
    // not a row: Python's line iteration yields none after a final '\n').
    size_t n_rows = 0, cap, k = 0;
    for (size_t i = 0; i < len; i++) n_rows += text[i] == '\n';
    n_rows += len > 0 && text[len - 1] != '\n';
    cap = len + 2 * n_rows + 1;
    char *buf = malloc(cap);
    *out = NULL;
    *out_len = 0;
    if (!buf) return llmq_errorf(LLMQ_ERR_NOMEM, "join rows: out of memory for %zu bytes", cap);
    for (size_t i = 0, r = 0; i < len; r++) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - text) + 1 : len; // the row keeps its '\n'
        if (r > 0) buf[k++] = '\n', buf[k++] = '\n';
        if (!blank_row(text + i, end - i)) {
            memcpy(buf + k, text + i, end - i);
            k += end - i;
        }
        i = end;
    }
    buf[k] = '\0';
    *out = buf;
    *out_len = k;
    return LLMQ_OK;
}

// ---- chunking -----------------------------------------------------------------------------------------

enum llmq_status llmq_eval_plan_init(enum llmq_eval_protocol protocol, int64_t n_tokens, int64_t n_ctx,
                                     int64_t max_chunks, int32_t bos, struct llmq_eval_plan *out) {
    memset(out, 0, sizeof(*out));
    if ((unsigned)protocol >= LLMQ_EVAL_PROTOCOL_COUNT)
        return llmq_errorf(LLMQ_ERR_ARG, "eval: unknown protocol %d", (int)protocol);
    if (n_ctx <= 0) n_ctx = llmq_eval_protocol_default_ctx(protocol);
    if (n_ctx < 2 || n_ctx > MAX_CTX)
        return llmq_errorf(LLMQ_ERR_ARG, "eval: context %lld is out of range [2, %lld]", (long long)n_ctx,
                           (long long)MAX_CTX);
    if (max_chunks == 0) return llmq_errorf(LLMQ_ERR_ARG, "eval: 0 chunks asked for: nothing to evaluate");
    if (n_tokens < n_ctx)
        return llmq_errorf(LLMQ_ERR_ARG, "eval: the text has %lld tokens, fewer than one chunk of %lld",
                           (long long)n_tokens, (long long)n_ctx);
    out->protocol = protocol;
    out->n_tokens = n_tokens;
    out->n_ctx = n_ctx;
    out->n_chunks_max = n_tokens / n_ctx;
    out->n_chunks = max_chunks < 0 || max_chunks > out->n_chunks_max ? out->n_chunks_max : max_chunks;
    if (out->n_chunks > MAX_CHUNKS) out->n_chunks = MAX_CHUNKS;
    out->first = protocol == LLMQ_EVAL_PROTOCOL_LLAMACPP ? n_ctx / 2 : 0;
    out->n_rows = n_ctx - 1 - out->first;
    if (out->n_rows < 1)
        return llmq_errorf(LLMQ_ERR_ARG, "eval: a context of %lld leaves no position to score under protocol %s",
                           (long long)n_ctx, llmq_eval_protocol_name(protocol));
    out->bos = protocol == LLMQ_EVAL_PROTOCOL_LLAMACPP && bos >= 0 ? bos : -1;
    return LLMQ_OK;
}

void llmq_eval_chunk_tokens(const struct llmq_eval_plan *plan, const int32_t *tokens, int64_t k, int32_t *dst) {
    LLMQ_ASSERT(k >= 0 && k < plan->n_chunks_max);
    memcpy(dst, tokens + k * plan->n_ctx, (size_t)plan->n_ctx * sizeof(int32_t));
    if (plan->bos >= 0) dst[0] = plan->bos;
}

// ---- per-position math ----------------------------------------------------------------------------

// Max and first argmax of a row; false if any value is NaN or infinite.
static bool row_max(const float *x, int64_t n, float *max, int32_t *arg) {
    float m = x[0];
    int32_t a = 0;
    bool finite = true;
    for (int64_t i = 0; i < n; i++) {
        finite &= isfinite(x[i]) != 0;
        if (x[i] > m) m = x[i], a = (int32_t)i;
    }
    *max = m;
    *arg = a;
    return finite;
}

// Σ exp(x_i − max) accumulated in double from expf terms (llama.cpp's log_softmax arithmetic).
static double row_sum_exp(const float *x, int64_t n, float max) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += expf(x[i] - max);
    return s;
}

double llmq_eval_nll(const float *logits, int64_t n_vocab, int32_t target, int32_t *top) {
    float max;
    int32_t arg;
    row_max(logits, n_vocab, &max, &arg);
    if (top) *top = arg;
    double sum = row_sum_exp(logits, n_vocab, max);
    return log(sum) - ((double)logits[target] - (double)max);
}

void llmq_eval_kld_row(const float *base, const float *logits, int64_t n_vocab, int32_t target,
                       struct llmq_eval_row *out) {
    float mb, mq;
    int32_t ab, aq;
    row_max(base, n_vocab, &mb, &ab);
    row_max(logits, n_vocab, &mq, &aq);
    double sb = row_sum_exp(base, n_vocab, mb), sq = row_sum_exp(logits, n_vocab, mq);
    double lsb = log(sb), lsq = log(sq);
    // log p_base(v) − log p(v) = (b_v − q_v) + c with c = log Z − log Z_base: the constant joins
    // before weighting so that identical rows give exactly 0 and close rows lose no digits.
    double c = ((double)mq - (double)mb) + (lsq - lsb), kld = 0;
    for (int64_t i = 0; i < n_vocab; i++) {
        double p = (double)expf(base[i] - mb) / sb;
        kld += p * (((double)base[i] - (double)logits[i]) + c);
    }
    out->kld = kld;
    out->nll_base = lsb - ((double)base[target] - (double)mb); // as llmq_eval_nll, bit for bit
    out->nll = lsq - ((double)logits[target] - (double)mq);
    out->top = aq;
    out->top_base = ab;
}

struct score_job {
    const float *logits, *base;
    const int32_t *targets;
    int64_t n_vocab, r0, r1;
    struct llmq_eval_row *rows;
    int64_t bad_row; // first row with a non-finite value, -1 if none
    bool bad_base;
};

static void *score_rows(void *arg) {
    struct score_job *j = arg;
    for (int64_t r = j->r0; r < j->r1; r++) {
        const float *q = j->logits + r * j->n_vocab, *b = j->base ? j->base + r * j->n_vocab : NULL;
        float m;
        int32_t a;
        if (!row_max(q, j->n_vocab, &m, &a) || (b && !row_max(b, j->n_vocab, &m, &a))) {
            j->bad_row = r;
            j->bad_base = b && row_max(q, j->n_vocab, &m, &a);
            return NULL;
        }
        struct llmq_eval_row *o = &j->rows[r];
        if (b) {
            llmq_eval_kld_row(b, q, j->n_vocab, j->targets[r], o);
        } else {
            o->nll = llmq_eval_nll(q, j->n_vocab, j->targets[r], &o->top);
            o->nll_base = o->kld = 0;
            o->top_base = -1;
        }
    }
    return NULL;
}

enum llmq_status llmq_eval_score(const float *logits, const float *base, const int32_t *targets, int64_t n_rows,
                                 int64_t n_vocab, int n_threads, struct llmq_eval_row *rows) {
    enum { MAX_THREADS = 256 };
    struct score_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {0};
    if (n_vocab < 1 || n_rows < 0)
        return llmq_errorf(LLMQ_ERR_ARG, "eval: bad score shape (%lld, %lld)", (long long)n_rows, (long long)n_vocab);
    for (int64_t r = 0; r < n_rows; r++)
        if (targets[r] < 0 || targets[r] >= n_vocab)
            return llmq_errorf(LLMQ_ERR_ARG, "eval: row %lld: target token %d is outside the vocabulary of %lld",
                               (long long)r, targets[r], (long long)n_vocab);
    int nt = n_threads < 1 ? 1 : n_threads > MAX_THREADS ? MAX_THREADS : n_threads;
    if (nt > n_rows) nt = n_rows > 0 ? (int)n_rows : 1;
    for (int t = 0; t < nt; t++)
        jobs[t] =
            (struct score_job){logits, base, targets, n_vocab, n_rows * t / nt, n_rows * (t + 1) / nt, rows, -1, false};
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&tid[t], NULL, score_rows, &jobs[t]) == 0;
    score_rows(&jobs[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            score_rows(&jobs[t]); // could not start a thread: do its share here
    }
    for (int t = 0; t < nt; t++)
        if (jobs[t].bad_row >= 0)
            return llmq_errorf(LLMQ_ERR_NUMERIC, "eval: row %lld: the %s logits contain NaN or Inf",
                               (long long)jobs[t].bad_row, jobs[t].bad_base ? "base" : "model");
    return LLMQ_OK;
}

// ---- statistics -----------------------------------------------------------------------------------

const double llmq_eval_quantiles[LLMQ_EVAL_N_QUANTILES] = {0.0,  0.001, 0.01, 0.05, 0.10,  0.25, 0.5,
                                                           0.75, 0.90,  0.95, 0.99, 0.999, 1.0};

enum llmq_status llmq_eval_stats_add(struct llmq_eval_stats *s, const struct llmq_eval_row *rows, int64_t n) {
    if (s->kld && s->count + n > s->cap) {
        int64_t cap = s->cap ? s->cap : 4096;
        while (cap < s->count + n) cap *= 2;
        float *a = realloc(s->kld_values, (size_t)cap * sizeof(float));
        if (a) s->kld_values = a;
        float *b = a ? realloc(s->p_diff_values, (size_t)cap * sizeof(float)) : NULL;
        if (b) s->p_diff_values = b;
        if (!a || !b) return llmq_errorf(LLMQ_ERR_NOMEM, "eval: out of memory for %lld positions", (long long)cap);
        s->cap = cap;
    }
    for (int64_t i = 0; i < n; i++) {
        const struct llmq_eval_row *r = &rows[i];
        s->sum_nll += r->nll;
        s->sum_nll2 += r->nll * r->nll;
        if (s->kld) {
            double p_diff = exp(-r->nll) - exp(-r->nll_base);
            s->sum_nll_base += r->nll_base;
            s->sum_nll_base2 += r->nll_base * r->nll_base;
            s->sum_nll_nll_base += r->nll * r->nll_base;
            s->sum_kld += r->kld;
            s->sum_kld2 += r->kld * r->kld;
            s->sum_p_diff += p_diff;
            s->sum_p_diff2 += p_diff * p_diff;
            s->sum_p_diff4 += p_diff * p_diff * p_diff * p_diff;
            if (fabs(p_diff) > s->max_abs_p_diff) s->max_abs_p_diff = fabs(p_diff);
            s->n_same_top += r->top == r->top_base;
            s->kld_values[s->count] = (float)r->kld;
            s->p_diff_values[s->count] = (float)p_diff;
        }
        s->count++;
    }
    return LLMQ_OK;
}

void llmq_eval_stats_free(struct llmq_eval_stats *s) {
    free(s->kld_values);
    free(s->p_diff_values);
    s->kld_values = s->p_diff_values = NULL;
    s->cap = 0;
}

// llama.cpp's mean_and_uncertainty: mean and standard error, the error 0 below min_count positions.
static void mean_unc(double sum, double sum2, int64_t count, int64_t min_count, double *mean, double *unc) {
    *mean = *unc = 0;
    if (count < 1) return;
    *mean = sum / (double)count;
    double var = sum2 / (double)count - *mean * *mean;
    *unc = var > 0 && count > min_count && count > 1 ? sqrt(var / (double)(count - 1)) : 0;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// llama.cpp's percentile(): linear interpolation between the order statistics of sorted v (n).
static double quantile(const float *v, int64_t n, double f) {
    if (n < 1) return 0;
    if (f <= 0) return v[0];
    if (f >= 1) return v[n - 1];
    double p = f * (double)(n - 1);
    int64_t i = (int64_t)p;
    p -= (double)i;
    return (1 - p) * v[i] + p * v[i + 1 < n ? i + 1 : n - 1];
}

void llmq_eval_stats_result(struct llmq_eval_stats *s, struct llmq_eval_result *r) {
    memset(r, 0, sizeof(*r));
    r->count = s->count;
    if (s->count < 1) return;
    double n = (double)s->count;
    // ppl mode: the "Final estimate" arithmetic (any count >= 2); KLD mode: mean_and_uncertainty.
    mean_unc(s->sum_nll, s->sum_nll2, s->count, s->kld ? 10 : 1, &r->nll_mean, &r->nll_stderr);
    r->ppl = exp(r->nll_mean);
    r->ppl_unc = r->ppl * r->nll_stderr;
    if (!s->kld) return;
    r->kld = true;
    double nll_base_mean, nll_base_unc;
    mean_unc(s->sum_nll_base, s->sum_nll_base2, s->count, 10, &nll_base_mean, &nll_base_unc);
    r->ppl_base = exp(nll_base_mean);
    r->ppl_base_unc = r->ppl_base * nll_base_unc;
    double cov = s->count < 10 ? 0 : (s->sum_nll_nll_base / n - (s->sum_nll / n) * (s->sum_nll_base / n)) / (n - 1);
    double den = r->nll_stderr * nll_base_unc;
    r->log_ppl_cor = den > 0 ? cov / den : 0;
    r->log_ppl_ratio = r->nll_mean - nll_base_mean;
    double v = r->nll_stderr * r->nll_stderr + nll_base_unc * nll_base_unc - 2 * cov;
    r->log_ppl_ratio_unc = v > 0 ? sqrt(v) : 0;
    r->ppl_ratio = exp(r->log_ppl_ratio);
    r->ppl_ratio_unc = r->ppl_ratio * r->log_ppl_ratio_unc;
    r->ppl_diff = r->ppl - r->ppl_base;
    v = r->ppl_unc * r->ppl_unc + r->ppl_base_unc * r->ppl_base_unc - 2 * r->ppl * r->ppl_base * cov;
    r->ppl_diff_unc = v > 0 ? sqrt(v) : 0;

    mean_unc(s->sum_kld, s->sum_kld2, s->count, 10, &r->kld_mean, &r->kld_unc);
    mean_unc(s->sum_p_diff, s->sum_p_diff2, s->count, 10, &r->p_diff_mean, &r->p_diff_unc);
    double mse, mse_unc;
    mean_unc(s->sum_p_diff2, s->sum_p_diff4, s->count, 10, &mse, &mse_unc);
    r->p_diff_rms = sqrt(mse);
    r->p_diff_rms_unc = r->p_diff_rms > 0 ? 0.5 / r->p_diff_rms * mse_unc : 0;
    r->p_diff_max_abs = s->max_abs_p_diff;
    r->same_top = (double)s->n_same_top / n;
    r->same_top_unc = s->count > 1 ? sqrt(r->same_top * (1 - r->same_top) / (n - 1)) : 0;
    qsort(s->kld_values, (size_t)s->count, sizeof(float), cmp_float);
    qsort(s->p_diff_values, (size_t)s->count, sizeof(float), cmp_float);
    for (int i = 0; i < LLMQ_EVAL_N_QUANTILES; i++) {
        r->kld_q[i] = quantile(s->kld_values, s->count, llmq_eval_quantiles[i]);
        r->p_diff_q[i] = quantile(s->p_diff_values, s->count, llmq_eval_quantiles[i]);
    }
}

// ---- logits file ----------------------------------------------------------------------------------

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_i64(uint8_t *p, int64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static int64_t get_i64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return (int64_t)v;
}

// Checks a header (read or about to be written) and computes the data offset and the total size.
// what: the file path, for the message. Returns LLMQ_OK or the status of the first violation.
static enum llmq_status header_check(const char *what, const struct llmq_logits_header *h, enum llmq_status bad,
                                     uint64_t *data_off, uint64_t *total) {
    if (h->dtype != LLMQ_DTYPE_F32 && h->dtype != LLMQ_DTYPE_F16)
        return llmq_errorf(bad, "%s: logits dtype %s is not f32 or f16", what, llmq_dtype_name(h->dtype));
    if ((unsigned)h->protocol >= LLMQ_EVAL_PROTOCOL_COUNT)
        return llmq_errorf(bad, "%s: unknown protocol %d", what, (int)h->protocol);
    if (h->n_vocab < 1 || h->n_vocab > MAX_VOCAB)
        return llmq_errorf(bad, "%s: n_vocab %lld is out of range [1, %lld]", what, (long long)h->n_vocab,
                           (long long)MAX_VOCAB);
    if (h->n_ctx < 2 || h->n_ctx > MAX_CTX)
        return llmq_errorf(bad, "%s: n_ctx %lld is out of range [2, %lld]", what, (long long)h->n_ctx,
                           (long long)MAX_CTX);
    if (h->n_chunks < 1 || h->n_chunks > MAX_CHUNKS)
        return llmq_errorf(bad, "%s: n_chunks %lld is out of range [1, %lld]", what, (long long)h->n_chunks,
                           (long long)MAX_CHUNKS);
    int64_t first = h->protocol == LLMQ_EVAL_PROTOCOL_LLAMACPP ? h->n_ctx / 2 : 0;
    if (h->first != first)
        return llmq_errorf(bad, "%s: first scored position %lld, expected %lld for protocol %s and n_ctx %lld", what,
                           (long long)h->first, (long long)first, llmq_eval_protocol_name(h->protocol),
                           (long long)h->n_ctx);
    if (h->n_rows != h->n_ctx - 1 - h->first || h->n_rows < 1)
        return llmq_errorf(bad, "%s: n_rows %lld, expected n_ctx - 1 - first = %lld (at least 1)", what,
                           (long long)h->n_rows, (long long)(h->n_ctx - 1 - h->first));
    if (h->n_text_tokens < h->n_chunks * h->n_ctx) // both factors are bounded: no overflow
        return llmq_errorf(bad, "%s: n_text_tokens %lld is fewer than n_chunks * n_ctx = %lld", what,
                           (long long)h->n_text_tokens, (long long)(h->n_chunks * h->n_ctx));
    uint64_t esize = h->dtype == LLMQ_DTYPE_F32 ? 4 : 2;
    uint64_t tok_end = LLMQ_LOGITS_HEADER_SIZE + 4 * (uint64_t)h->n_chunks * (uint64_t)h->n_ctx; // < 2^47
    uint64_t off = (tok_end + 63) & ~(uint64_t)63;
    uint64_t chunk = (uint64_t)h->n_rows * (uint64_t)h->n_vocab * esize; // < 2^45
    if (chunk > (UINT64_MAX - off) / (uint64_t)h->n_chunks)
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: logits size overflows", what);
    *data_off = off;
    *total = off + chunk * (uint64_t)h->n_chunks;
    return LLMQ_OK;
}

struct llmq_logits_writer {
    struct llmq_afile af;
    struct llmq_logits_header h;
    int64_t n_written; // rows written
    uint16_t *half;    // (n_vocab) f16 conversion buffer
};

enum llmq_status llmq_logits_create(const char *path, const struct llmq_logits_header *h, const int32_t *tokens,
                                    struct llmq_logits_writer **out) {
    uint8_t hdr[LLMQ_LOGITS_HEADER_SIZE] = {0};
    uint64_t data_off, total;
    struct llmq_logits_writer *w = NULL;
    enum llmq_status st;
    *out = NULL;
    st = header_check(path, h, LLMQ_ERR_ARG, &data_off, &total);
    if (st) return st;
    int64_t n_tok = h->n_chunks * h->n_ctx;
    for (int64_t i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || tokens[i] >= h->n_vocab)
            return llmq_errorf(LLMQ_ERR_ARG, "%s: chunk token %lld = %d is outside the vocabulary of %lld", path,
                               (long long)i, tokens[i], (long long)h->n_vocab);
    w = calloc(1, sizeof(*w));
    if (!w) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    w->h = *h;
    if (h->dtype == LLMQ_DTYPE_F16 && !(w->half = malloc((size_t)h->n_vocab * sizeof(uint16_t)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    st = llmq_afile_open(&w->af, path);
    if (st) goto fail;
    memcpy(hdr, LLMQ_LOGITS_MAGIC, 8);
    put_u32(hdr + 8, LLMQ_LOGITS_VERSION);
    put_u32(hdr + 12, h->dtype == LLMQ_DTYPE_F32 ? 0 : 1);
    put_u32(hdr + 16, (uint32_t)h->protocol);
    put_u32(hdr + 20, 0);
    put_i64(hdr + 24, h->n_vocab);
    put_i64(hdr + 32, h->n_ctx);
    put_i64(hdr + 40, h->n_chunks);
    put_i64(hdr + 48, h->first);
    put_i64(hdr + 56, h->n_rows);
    put_i64(hdr + 64, h->n_text_tokens);
    memcpy(hdr + 72, h->text_sha256, 32);
    if ((st = llmq_afile_write(&w->af, hdr, sizeof(hdr)))) goto fail_file;
    for (int64_t i = 0; i < n_tok; i++) {
        uint8_t b[4];
        put_u32(b, (uint32_t)tokens[i]);
        if ((st = llmq_afile_write(&w->af, b, 4))) goto fail_file;
    }
    if ((st = llmq_afile_pad(&w->af, (size_t)(data_off - w->af.pos)))) goto fail_file;
    *out = w;
    return LLMQ_OK;
fail_file:
    llmq_afile_abort(&w->af);
fail:
    free(w->half);
    free(w);
    return st;
}

enum llmq_status llmq_logits_append(struct llmq_logits_writer *w, const float *logits, int64_t n) {
    const struct llmq_logits_header *h = &w->h;
    int64_t total = h->n_chunks * h->n_rows;
    if (n < 0 || n > total - w->n_written)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: %lld more rows would pass the %lld rows of the file", w->af.path,
                           (long long)n, (long long)total);
    for (int64_t r = 0; r < n; r++, w->n_written++) {
        const float *row = logits + r * h->n_vocab;
        enum llmq_status st;
        for (int64_t v = 0; v < h->n_vocab; v++)
            if (!isfinite(row[v]) || (h->dtype == LLMQ_DTYPE_F16 && fabsf(row[v]) > 65504.0f))
                return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: chunk %lld row %lld: logit %lld = %g cannot be stored as %s",
                                   w->af.path, (long long)(w->n_written / h->n_rows),
                                   (long long)(w->n_written % h->n_rows), (long long)v, (double)row[v],
                                   llmq_dtype_name(h->dtype));
        if (h->dtype == LLMQ_DTYPE_F16) {
            llmq_f32_to_f16_row(row, w->half, h->n_vocab);
            st = llmq_afile_write(&w->af, w->half, (size_t)h->n_vocab * sizeof(uint16_t));
        } else {
            st = llmq_afile_write(&w->af, row, (size_t)h->n_vocab * sizeof(float));
        }
        if (st) return st;
    }
    return LLMQ_OK;
}

enum llmq_status llmq_logits_commit(struct llmq_logits_writer *w) {
    enum llmq_status st;
    if (w->n_written != w->h.n_chunks * w->h.n_rows) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: %lld of %lld rows written: not committing", w->af.path,
                         (long long)w->n_written, (long long)(w->h.n_chunks * w->h.n_rows));
        llmq_afile_abort(&w->af);
    } else {
        st = llmq_afile_commit(&w->af);
    }
    free(w->half);
    free(w);
    return st;
}

void llmq_logits_abort(struct llmq_logits_writer *w) {
    if (!w) return;
    llmq_afile_abort(&w->af);
    free(w->half);
    free(w);
}

struct llmq_logits_file {
    char *path;
    int fd;
    struct llmq_logits_header h;
    int32_t *tokens;   // (n_chunks, n_ctx)
    uint64_t data_off; // D
    uint16_t *half;    // (n_vocab) read buffer for f16 rows
};

void llmq_logits_close(struct llmq_logits_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->tokens);
    free(f->half);
    free(f->path);
    free(f);
}

// Reads exactly n bytes at off; LLMQ_ERR_TRUNCATED at end of file.
static enum llmq_status read_at(const struct llmq_logits_file *f, void *dst, size_t n, uint64_t off, const char *what) {
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t got = pread(f->fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return llmq_errorf(LLMQ_ERR_IO, "%s: reading %s: %s", f->path, what, strerror(errno));
        if (got == 0)
            return llmq_errorf(LLMQ_ERR_TRUNCATED, "%s: %s at offset %llu is past the end of the file", f->path, what,
                               (unsigned long long)off);
        p += got, n -= (size_t)got, off += (uint64_t)got;
    }
    return LLMQ_OK;
}

enum llmq_status llmq_logits_open(const char *path, struct llmq_logits_file **out) {
    uint8_t hdr[LLMQ_LOGITS_HEADER_SIZE];
    enum llmq_status st;
    struct stat sb;
    uint64_t total;
    struct llmq_logits_file *f = calloc(1, sizeof(*f));
    *out = NULL;
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = llmq_errorf(LLMQ_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    if ((uint64_t)sb.st_size < 8 || (st = read_at(f, hdr, 8, 0, "magic"))) {
        if ((uint64_t)sb.st_size < 8)
            st = llmq_errorf(LLMQ_ERR_MAGIC, "%s: not an llmq logits file (%lld bytes)", path, (long long)sb.st_size);
        goto fail;
    }
    if (memcmp(hdr, LLMQ_LOGITS_MAGIC, 8) != 0) {
        st = llmq_errorf(LLMQ_ERR_MAGIC, "%s: not an llmq logits file (bad magic)", path);
        goto fail;
    }
    if ((uint64_t)sb.st_size < LLMQ_LOGITS_HEADER_SIZE) {
        st = llmq_errorf(LLMQ_ERR_TRUNCATED, "%s: %lld bytes, shorter than the %d-byte header", path,
                         (long long)sb.st_size, LLMQ_LOGITS_HEADER_SIZE);
        goto fail;
    }
    if ((st = read_at(f, hdr, sizeof(hdr), 0, "header"))) goto fail;
    uint32_t version = get_u32(hdr + 8), dtype = get_u32(hdr + 12), protocol = get_u32(hdr + 16);
    if (version != LLMQ_LOGITS_VERSION) {
        st = llmq_errorf(LLMQ_ERR_VERSION, "%s: logits file version %u, this llmq reads version %d", path, version,
                         LLMQ_LOGITS_VERSION);
        goto fail;
    }
    if (dtype > 1) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: unknown logits dtype code %u", path, dtype);
        goto fail;
    }
    if (protocol >= LLMQ_EVAL_PROTOCOL_COUNT) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: unknown protocol code %u", path, protocol);
        goto fail;
    }
    if (get_u32(hdr + 20) != 0) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: flags 0x%x, expected 0", path, get_u32(hdr + 20));
        goto fail;
    }
    for (int i = 104; i < LLMQ_LOGITS_HEADER_SIZE; i++)
        if (hdr[i]) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: reserved header byte %d is not zero", path, i);
            goto fail;
        }
    f->h.dtype = dtype == 0 ? LLMQ_DTYPE_F32 : LLMQ_DTYPE_F16;
    f->h.protocol = (enum llmq_eval_protocol)protocol;
    f->h.n_vocab = get_i64(hdr + 24);
    f->h.n_ctx = get_i64(hdr + 32);
    f->h.n_chunks = get_i64(hdr + 40);
    f->h.first = get_i64(hdr + 48);
    f->h.n_rows = get_i64(hdr + 56);
    f->h.n_text_tokens = get_i64(hdr + 64);
    memcpy(f->h.text_sha256, hdr + 72, 32);
    if ((st = header_check(path, &f->h, LLMQ_ERR_CORRUPT, &f->data_off, &total))) goto fail;
    if ((uint64_t)sb.st_size != total) {
        st = llmq_errorf((uint64_t)sb.st_size < total ? LLMQ_ERR_TRUNCATED : LLMQ_ERR_CORRUPT,
                         "%s: %lld bytes, the header describes %llu", path, (long long)sb.st_size,
                         (unsigned long long)total);
        goto fail;
    }
    size_t n_tok = (size_t)(f->h.n_chunks * f->h.n_ctx);
    f->tokens = malloc(n_tok * sizeof(int32_t));
    f->half = malloc((size_t)f->h.n_vocab * sizeof(uint16_t));
    if (!f->tokens || !f->half) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if ((st = read_at(f, f->tokens, n_tok * sizeof(int32_t), LLMQ_LOGITS_HEADER_SIZE, "tokens"))) goto fail;
    for (size_t i = 0; i < n_tok; i++) {
        f->tokens[i] = (int32_t)get_u32((const uint8_t *)&f->tokens[i]);
        if (f->tokens[i] < 0 || f->tokens[i] >= f->h.n_vocab) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: token %zu (chunk %lld) = %d is outside the vocabulary of %lld",
                             path, i, (long long)(i / (size_t)f->h.n_ctx), f->tokens[i], (long long)f->h.n_vocab);
            goto fail;
        }
    }
    *out = f;
    return LLMQ_OK;
fail:
    llmq_logits_close(f);
    return st;
}

const struct llmq_logits_header *llmq_logits_header(const struct llmq_logits_file *f) { return &f->h; }
const int32_t *llmq_logits_tokens(const struct llmq_logits_file *f) { return f->tokens; }

enum llmq_status llmq_logits_read(struct llmq_logits_file *f, int64_t k, int64_t r0, int64_t n, float *dst) {
    const struct llmq_logits_header *h = &f->h;
    if (k < 0 || k >= h->n_chunks || r0 < 0 || n < 0 || r0 > h->n_rows - n)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: chunk %lld rows [%lld, %lld) are out of range (%lld chunks of %lld rows)",
                           f->path, (long long)k, (long long)r0, (long long)(r0 + n), (long long)h->n_chunks,
                           (long long)h->n_rows);
    uint64_t esize = h->dtype == LLMQ_DTYPE_F32 ? 4 : 2, row_bytes = (uint64_t)h->n_vocab * esize;
    uint64_t off = f->data_off + ((uint64_t)k * (uint64_t)h->n_rows + (uint64_t)r0) * row_bytes;
    for (int64_t r = 0; r < n; r++, off += row_bytes) {
        float *row = dst + r * h->n_vocab;
        enum llmq_status st;
        if (h->dtype == LLMQ_DTYPE_F32) {
            st = read_at(f, row, (size_t)row_bytes, off, "logits");
        } else {
            st = read_at(f, f->half, (size_t)row_bytes, off, "logits");
            if (!st) llmq_f16_to_f32_row(f->half, row, h->n_vocab);
        }
        if (st) return st;
        for (int64_t v = 0; v < h->n_vocab; v++)
            if (!isfinite(row[v]))
                return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: chunk %lld row %lld: logit %lld is %g", f->path, (long long)k,
                                   (long long)(r0 + r), (long long)v, (double)row[v]);
    }
    return LLMQ_OK;
}
