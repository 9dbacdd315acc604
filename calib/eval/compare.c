// calib/eval/compare.c — sizes, the model hash, the cached base and the Pareto front of calib/eval/compare.h.
#include "calib/eval/compare.h"

#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ---- sizes ----------------------------------------------------------------------------------------------

static int64_t nel(const struct llmq_tensor_view *t) { return t ? llmq_tensor_nelements(t) : 0; }

void llmq_compare_model_size(const struct llmq_model *m, struct llmq_compare_size *out) {
    memset(out, 0, sizeof(*out));
    int64_t p = nel(m->tok_embd) + nel(m->output_norm) + nel(m->rope_freqs);
    if (m->output != m->tok_embd) p += nel(m->output);
    for (int64_t l = 0; l < m->hp.n_layer; l++) {
        const struct llmq_layer *L = &m->layers[l];
        p += nel(L->attn_norm) + nel(L->ffn_norm) + nel(L->bq) + nel(L->bk) + nel(L->bv) + nel(L->q_norm) +
             nel(L->k_norm);
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) p += nel(L->w[k]);
        p += nel(L->router) + nel(L->shexp_gate); // moe: the router (qwen2_moe: the shared expert's gate) and every
                                                  // expert's gate, up, down
        for (int64_t x = 0; L->exps && x < 3 * m->hp.n_expert; x++) p += nel(L->exps[x]);
    }
    out->n_params = p;
    if (m->gguf) {
        out->file_bytes = llmq_gguf_file_size(m->gguf);
        for (int64_t i = 0; i < llmq_gguf_n_tensors(m->gguf); i++)
            out->tensor_bytes += llmq_gguf_tensor_at(m->gguf, i)->view.nbytes;
    } else if (m->st) {
        for (int s = 0; s < llmq_st_n_shards(m->st); s++) out->file_bytes += llmq_st_shard(m->st, s)->file_size;
        for (int64_t i = 0; i < llmq_st_n_tensors(m->st); i++) out->tensor_bytes += llmq_st_tensor(m->st, i)->nbytes;
    }
    out->bpw = p > 0 ? 8.0 * (double)out->tensor_bytes / (double)p : NAN;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

enum llmq_status llmq_compare_model_sha256(const char *path, char hex[65]) {
    if (!llmq_is_dir(path)) return llmq_file_sha256(path, hex);
    DIR *d = opendir(path);
    if (!d) return llmq_errorf(LLMQ_ERR_IO, "%s: cannot open the directory: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    enum llmq_status st = LLMQ_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *full = llmq_path_join(path, e->d_name);
        struct stat sb;
        bool regular = full && stat(full, &sb) == 0 && S_ISREG(sb.st_mode);
        free(full);
        if (!regular) continue;
        if (n == cap) {
            char **g = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof(*names));
            if (!g) break;
            names = g;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    if (e) st = llmq_errorf(LLMQ_ERR_NOMEM, "out of memory listing %s", path);
    if (!st) qsort(names, n, sizeof(*names), cmp_str);
    struct llmq_sha256 h;
    llmq_sha256_init(&h);
    for (size_t i = 0; !st && i < n; i++) {
        char *full = llmq_path_join(path, names[i]), fh[65];
        st = full ? llmq_file_sha256(full, fh) : llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
        free(full);
        if (st) break;
        llmq_sha256_update(&h, names[i], strlen(names[i]) + 1);
        llmq_sha256_update(&h, fh, 64);
        llmq_sha256_update(&h, "\n", 1);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (st) return st;
    uint8_t dg[32];
    llmq_sha256_final(&h, dg);
    llmq_sha256_hex(dg, hex);
    return LLMQ_OK;
}

// ---- the cache ------------------------------------------------------------------------------------------

static enum llmq_status mkdir_p(const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof(buf), "%s", dir) >= (int)sizeof(buf))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return llmq_errorf(LLMQ_ERR_IO, "%s: cannot create the cache directory: %s", buf, strerror(errno));
        *p = c;
        if (!c) break;
    }
    if (!llmq_is_dir(dir)) return llmq_errorf(LLMQ_ERR_IO, "%s: not a directory (cache)", dir);
    return LLMQ_OK;
}

enum llmq_status llmq_compare_cache_dir(const char *given, char *buf, size_t n) {
    const char *c = getenv("LLMQ_CACHE"), *home = getenv("HOME");
    int k;
    if (given)
        k = snprintf(buf, n, "%s", given);
    else if (c && *c)
        k = snprintf(buf, n, "%s/compare", c);
    else if (home && *home)
        k = snprintf(buf, n, "%s/.cache/llmq/compare", home);
    else
        return llmq_errorf(LLMQ_ERR_ARG, "compare: no cache directory: set LLMQ_CACHE or give --cache-dir");
    if (k < 0 || (size_t)k >= n) return llmq_errorf(LLMQ_ERR_ARG, "compare: the cache directory path is too long");
    return mkdir_p(buf);
}

// The key text (see the header) into a malloc'd string.
static char *key_text(const struct llmq_compare_key *k) {
    char th[65], *s = NULL;
    llmq_sha256_hex(k->text_sha256, th);
    if (asprintf(&s,
                 "llmq-compare-cache 1\nmodel_sha256=%s\ntext_sha256=%s\nprotocol=%s\nctx=%lld\nchunks=%lld\n"
                 "logits_dtype=%s\nbackend=%s\nemulate=%s\nllmq_version=%s\n",
                 k->model_sha256, th, llmq_eval_protocol_name(k->protocol), (long long)k->n_ctx,
                 (long long)k->max_chunks, llmq_dtype_name(k->logits_dtype), llmq_backend_name(k->backend),
                 llmq_emulate_name(k->emulate), LLMQ_VERSION) < 0)
        return NULL;
    return s;
}

// A cached report, when <dir>/<entry>.json is one for this key; false (with a warning when it exists but
// does not fit) otherwise.
static bool read_report(const char *path, const char *key, int64_t n_vocab, struct llmq_eval_report *rep) {
    if (!llmq_file_exists(path)) return false;
    json_t *j = NULL;
    if (llmq_read_json_object(path, 1 << 20, &j)) {
        llmq_warn("compare: %s is not a cache entry; evaluating the base again", path);
        return false;
    }
    const char *k = json_string_value(json_object_get(j, "key"));
    json_t *ppl = json_object_get(j, "ppl"), *cnt = json_object_get(j, "tokens_scored");
    bool ok = k && strcmp(k, key) == 0 && json_is_number(ppl) && json_is_integer(cnt) &&
              json_integer_value(json_object_get(j, "n_vocab")) == n_vocab;
    if (ok) {
        rep->res.ppl = json_number_value(ppl);
        rep->res.ppl_unc = json_number_value(json_object_get(j, "ppl_uncertainty"));
        rep->res.nll_mean = json_number_value(json_object_get(j, "nll_mean"));
        rep->res.nll_stderr = json_number_value(json_object_get(j, "nll_stderr"));
        rep->res.count = json_integer_value(cnt);
        rep->plan.n_chunks = json_integer_value(json_object_get(j, "chunks"));
        rep->plan.n_ctx = json_integer_value(json_object_get(j, "ctx"));
    } else {
        llmq_warn("compare: %s was made for other inputs; evaluating the base again", path);
    }
    json_decref(j);
    return ok;
}

static enum llmq_status write_report(const char *path, const char *key, const struct llmq_model *base,
                                     const struct llmq_eval_report *rep) {
    json_t *j = json_object();
    json_object_set_new(j, "key", json_string(key));
    json_object_set_new(j, "model", json_string(base->path));
    json_object_set_new(j, "n_vocab", json_integer(base->hp.n_vocab));
    json_object_set_new(j, "ctx", json_integer(rep->plan.n_ctx));
    json_object_set_new(j, "chunks", json_integer(rep->plan.n_chunks));
    json_object_set_new(j, "tokens_scored", json_integer(rep->res.count));
    json_object_set_new(j, "ppl", json_real(rep->res.ppl));
    json_object_set_new(j, "ppl_uncertainty", json_real(rep->res.ppl_unc));
    json_object_set_new(j, "nll_mean", json_real(rep->res.nll_mean));
    json_object_set_new(j, "nll_stderr", json_real(rep->res.nll_stderr));
    json_object_set_new(j, "seconds", json_real(rep->seconds));
    enum llmq_status st = llmq_write_json(path, j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(j);
    return st;
}

// The cached logits file when it fits the plan; else NULL (a warning when it exists).
static struct llmq_logits_file *open_logits(const char *path, const struct llmq_compare_key *key,
                                            const struct llmq_eval_plan *plan, int64_t n_vocab) {
    struct llmq_logits_file *f = NULL;
    if (!llmq_file_exists(path)) return NULL;
    if (llmq_logits_open(path, &f)) {
        llmq_warn("compare: %s is unreadable; evaluating the base again", path);
        return NULL;
    }
    const struct llmq_logits_header *h = llmq_logits_header(f);
    if (h->protocol != plan->protocol || h->n_ctx != plan->n_ctx || h->n_chunks != plan->n_chunks ||
        h->n_vocab != n_vocab || h->dtype != key->logits_dtype || memcmp(h->text_sha256, key->text_sha256, 32)) {
        llmq_warn("compare: %s was made for other inputs; evaluating the base again", path);
        llmq_logits_close(f);
        return NULL;
    }
    return f;
}

enum llmq_status llmq_compare_base_get(const struct llmq_model *base, const int32_t *tokens, int64_t n_tokens,
                                       const struct llmq_eval_opts *opts, const struct llmq_compare_key *key,
                                       const char *dir, bool want_logits, struct llmq_compare_base *out) {
    memset(out, 0, sizeof(*out));
    enum llmq_status st = LLMQ_OK;
    char *key_s = key_text(key), *jpath = NULL, *lpath = NULL;
    uint8_t d[32];
    if (!key_s) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    llmq_sha256(key_s, strlen(key_s), d);
    llmq_sha256_hex(d, out->entry);
    if (asprintf(&jpath, "%s/%s.json", dir, out->entry) < 0 || asprintf(&lpath, "%s/%s.logits", dir, out->entry) < 0) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
        goto done;
    }
    int32_t bos = base->tok && llmq_tokenizer_add_bos(base->tok) ? llmq_tokenizer_bos(base->tok) : -1;
    if ((st = llmq_eval_plan_init(opts->protocol, n_tokens, opts->n_ctx, opts->max_chunks, bos, &out->rep.plan)))
        goto done;
    out->cached_report = read_report(jpath, key_s, base->hp.n_vocab, &out->rep);
    if (want_logits) out->lf = open_logits(lpath, key, &out->rep.plan, base->hp.n_vocab);
    out->cached_lf = out->lf != NULL;
    if (out->cached_report && (!want_logits || out->lf)) goto done;

    struct llmq_eval_opts o = *opts;
    o.save_logits = want_logits ? lpath : NULL;
    o.logits_dtype = key->logits_dtype;
    o.text_sha256 = key->text_sha256;
    llmq_logits_close(out->lf);
    out->lf = NULL;
    out->cached_lf = false;
    llmq_input_forget(jpath); // the cache's own entries, read above, are rewritten here (common/io.h)
    llmq_input_forget(lpath);
    if ((st = llmq_eval_ppl(base, tokens, n_tokens, &o, &out->rep))) goto done;
    if ((st = write_report(jpath, key_s, base, &out->rep))) goto done;
    out->cached_report = false;
    if (want_logits && (st = llmq_logits_open(lpath, &out->lf))) goto done;
done:
    free(key_s);
    free(jpath);
    free(lpath);
    return st;
}

// ---- the Pareto front and the CSV -----------------------------------------------------------------------

void llmq_compare_pareto(const double *x, const double *y, int n, bool *on_front) {
    for (int i = 0; i < n; i++) {
        on_front[i] = !isnan(x[i]) && !isnan(y[i]);
        for (int j = 0; j < n && on_front[i]; j++)
            if (j != i && !isnan(x[j]) && !isnan(y[j]) && x[j] <= x[i] && y[j] <= y[i] && (x[j] < x[i] || y[j] < y[i]))
                on_front[i] = false;
    }
}

static void csv_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, ",%.17g", v);
    else
        fputc(',', f);
}

// Closes the memory stream f (open_memstream(buf, len)) and writes its bytes to path atomically; frees *buf.
static enum llmq_status commit_stream(FILE *f, char **buf, size_t *len, const char *path) {
    struct llmq_afile af;
    enum llmq_status st = fclose(f) != 0 ? llmq_errorf(LLMQ_ERR_NOMEM, "out of memory writing %s", path) : LLMQ_OK;
    if (!st) st = llmq_afile_open(&af, path);
    if (!st) {
        if ((st = llmq_afile_write(&af, *buf, *len)))
            llmq_afile_abort(&af);
        else
            st = llmq_afile_commit(&af);
    }
    free(*buf);
    *buf = NULL;
    return st;
}

enum llmq_status llmq_compare_write_csv(const char *path, const struct llmq_compare_row *rows, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    fputs("artifact,path,base,file_bytes,tensor_bytes,params,bpw,ppl,ppl_uncertainty,ppl_delta_percent,kld_mean,"
          "kld_uncertainty,kld_p99,kld_max,same_top1_percent,same_top1_uncertainty_percent,seconds",
          f);
    const struct llmq_compare_task *t0 = n ? rows[0].tasks : NULL;
    for (int t = 0; n && t < rows[0].n_tasks; t++)
        fprintf(f, ",%s_acc,%s_acc_stderr,%s_acc_norm,%s_acc_norm_stderr,%s_acc_delta_points", t0[t].name, t0[t].name,
                t0[t].name, t0[t].name, t0[t].name);
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        const struct llmq_compare_row *r = &rows[i];
        csv_str(f, r->label);
        fputc(',', f);
        csv_str(f, r->path);
        fprintf(f, ",%d,%llu,%llu,%lld", r->is_base, (unsigned long long)r->size.file_bytes,
                (unsigned long long)r->size.tensor_bytes, (long long)r->size.n_params);
        const double v[] = {r->size.bpw, r->ppl,     r->ppl_unc,  r->ppl_delta_pct, r->kld_mean, r->kld_unc,
                            r->kld_p99,  r->kld_max, r->top1_pct, r->top1_unc_pct,  r->seconds};
        for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) csv_num(f, v[k]);
        for (int t = 0; t < rows[0].n_tasks; t++) {
            const struct llmq_compare_task *x = t < r->n_tasks ? &r->tasks[t] : NULL;
            const double tv[] = {x ? x->acc : NAN, x ? x->acc_stderr : NAN, x ? x->acc_norm : NAN,
                                 x ? x->acc_norm_stderr : NAN, x ? x->acc_delta_pts : NAN};
            for (int k = 0; k < 5; k++) csv_num(f, tv[k]);
        }
        fputc('\n', f);
    }
    return commit_stream(f, &buf, &len, path);
}

// ---- the HTML page --------------------------------------------------------------------------------------

static void html_esc(FILE *f, const char *s) {
    for (; *s; s++) switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
}

// A step of 1, 2 or 5 times a power of ten giving about 5 ticks over span.
static double nice_step(double span) {
    double raw = span / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

enum { PW = 600, PH = 400, ML = 70, MR = 30, MT = 40, MB = 50 }; // plot size and margins (px)

// An axis: linear, or log10 (then lo / hi are log10 of the range) when its values span more than 5x.
struct axis {
    double lo, hi, step;
    bool log;
};

static struct axis axis_of(const double *v, int n, bool may_log) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
    if (!isfinite(lo)) lo = 0, hi = 1;
    struct axis a = {0};
    a.log = may_log && lo > 0 && hi / lo > 5;
    if (a.log) lo = log10(lo), hi = log10(hi);
    double pad = hi > lo ? 0.08 * (hi - lo) : fmax(fabs(lo) * 0.1, 1e-3);
    a.lo = lo - pad;
    a.hi = hi + pad;
    a.step = nice_step(a.hi - a.lo);
    return a;
}

static double pos(const struct axis *a, double v) { return ((a->log ? log10(v) : v) - a->lo) / (a->hi - a->lo); }
static double sx(const struct axis *a, double v) { return ML + pos(a, v) * (PW - ML - MR); }
static double sy(const struct axis *a, double v) { return PH - MB - pos(a, v) * (PH - MT - MB); }

// The tick values of an axis into t (at most 32): multiples of the step (linear), or 1, 2, 5 x 10^k (log).
static int ticks(const struct axis *a, double *t) {
    int n = 0;
    if (a->log) {
        for (int e = (int)floor(a->lo); e <= (int)ceil(a->hi) && n < 30; e++)
            for (int k = 0; k < 3; k++) {
                double v = (k == 0 ? 1 : k == 1 ? 2 : 5) * pow(10, e);
                if (log10(v) >= a->lo && log10(v) <= a->hi) t[n++] = v;
            }
        return n;
    }
    for (double i = ceil(a->lo / a->step); i * a->step <= a->hi && n < 32; i++) t[n++] = i == 0 ? 0 : i * a->step;
    return n;
}

static void plot_axes(FILE *f, const struct axis *ax, const struct axis *ay, const char *title, const char *ylabel) {
    double t[32];
    fprintf(f, "<text x=\"%d\" y=\"24\" class=\"title\">", ML);
    html_esc(f, title);
    fputs("</text>\n", f);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"frame\"/>\n", ML, MT, PW - ML - MR,
            PH - MT - MB);
    for (int i = 0, n = ticks(ax, t); i < n; i++)
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/><text x=\"%.1f\" y=\"%d\" "
                "class=\"tick\" text-anchor=\"middle\">%g</text>\n",
                sx(ax, t[i]), MT, sx(ax, t[i]), PH - MB, sx(ax, t[i]), PH - MB + 16, t[i]);
    for (int i = 0, n = ticks(ay, t); i < n; i++)
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/><text x=\"%d\" y=\"%.1f\" "
                "class=\"tick\" text-anchor=\"end\">%g</text>\n",
                ML, sy(ay, t[i]), PW - MR, sy(ay, t[i]), ML - 6, sy(ay, t[i]) + 4, t[i]);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"label\" text-anchor=\"middle\">file size (MiB%s)</text>\n",
            (ML + PW - MR) / 2, PH - 12, ax->log ? ", log scale" : "");
    fprintf(f, "<text x=\"16\" y=\"%d\" class=\"label\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">",
            (MT + PH - MB) / 2, (MT + PH - MB) / 2);
    html_esc(f, ylabel);
    fprintf(f, "%s</text>\n", ay->log ? " (log scale)" : "");
}

struct box {
    double x0, y0, x1, y1;
};

static bool overlaps(const struct box *a, const struct box *b) {
    return a->x0 < b->x1 && b->x0 < a->x1 && a->y0 < b->y1 && b->y0 < a->y1;
}

// Where the label of the point at (px, py) goes: the first place, right or left of it, at its height, then
// rows further above and below, whose box (11 px text, ~6.2 px per byte) overlaps no placed box and stays inside
// the plot (none: right of it, overlapping). The box is added to placed (*n_placed). *anchor_end: the text ends
// at *lx (a label left of its point).
static void place_label(double px, double py, size_t len, struct box *placed, int *n_placed, double *lx, double *ly,
                        bool *anchor_end) {
    const double w = 6.2 * (double)len, h = 12;
    struct box b = {0};
    for (int k = 0; k <= 24; k++) {
        int side = k % 2, row = (k / 2 + 1) / 2 * ((k / 2) % 2 ? -1 : 1); // rows 0, -1, 1, -2, 2, ...
        if (k == 24) side = 0, row = 0;                                   // nothing free: the first place
        *anchor_end = side == 1;
        *lx = side ? px - 9 : px + 9;
        *ly = py + 4 + 13.0 * row;
        b = (struct box){side ? *lx - w : *lx, *ly - h + 2, side ? *lx : *lx + w, *ly + 2};
        bool ok = b.x0 >= ML && b.x1 <= PW - MR && b.y0 >= MT && b.y1 <= PH - MB;
        for (int j = 0; ok && j < *n_placed; j++) ok = !overlaps(&b, &placed[j]);
        if (ok) break;
    }
    placed[(*n_placed)++] = b;
}

// Bytes of the prefix every label shares, cut after its last '-', '_' or '.' (so "smollm2-Q8_0.gguf" and
// "smollm2-awq4" share "smollm2-"); 0 when that would leave a label empty or there is one label.
static size_t common_prefix(const struct llmq_compare_row *rows, int n) {
    if (n < 2) return 0;
    size_t k = strlen(rows[0].label);
    for (int i = 1; i < n; i++) {
        size_t j = 0;
        while (j < k && rows[i].label[j] == rows[0].label[j]) j++;
        k = j;
    }
    while (k > 0 && !strchr("-_.", rows[0].label[k - 1])) k--;
    for (int i = 0; i < n; i++)
        if (rows[i].label[k] == '\0') return 0;
    return k;
}

// One plot of y against the rows' file sizes, with the Pareto front.
static void plot(FILE *f, const struct llmq_compare_row *rows, int n, const double *y, const char *title,
                 const char *ylabel, const char *id) {
    double *x = malloc((size_t)n * sizeof(double));
    bool *front = malloc((size_t)n * sizeof(bool));
    int *order = malloc((size_t)n * sizeof(int)), n_placed = 0;
    struct box *placed = malloc((size_t)(2 * n + 1) * sizeof(struct box));
    fprintf(f, "<svg id=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n", id, PW, PH, PW, PH);
    if (!x || !front || !order || !placed) goto done;
    for (int i = 0; i < n; i++) x[i] = (double)rows[i].size.file_bytes / 1048576.0;
    struct axis ax = axis_of(x, n, true), ay = axis_of(y, n, true);
    size_t cut = common_prefix(rows, n);
    char full_title[256];
    snprintf(full_title, sizeof(full_title), "%s%s%.*s%s", title, cut ? " (labels without \"" : "", (int)cut,
             rows[0].label, cut ? "\")" : "");
    plot_axes(f, &ax, &ay, full_title, ylabel);
    llmq_compare_pareto(x, y, n, front);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (front[i]) order[m++] = i;
    for (int a = 1; a < m; a++) // by size: the front's line from left to right
        for (int b = a; b > 0 && x[order[b]] < x[order[b - 1]]; b--) {
            int t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    fputs("<polyline class=\"front\" points=\"", f);
    for (int k = 0; k < m; k++) fprintf(f, "%s%.1f,%.1f", k ? " " : "", sx(&ax, x[order[k]]), sy(&ay, y[order[k]]));
    fputs("\"/>\n", f);
    for (int i = 0; i < n; i++) // the points first, so that no label covers one
        if (isfinite(y[i]))
            placed[n_placed++] =
                (struct box){sx(&ax, x[i]) - 6, sy(&ay, y[i]) - 6, sx(&ax, x[i]) + 6, sy(&ay, y[i]) + 6};
    for (int i = 0; i < n; i++) {
        if (!isfinite(y[i])) continue;
        double px = sx(&ax, x[i]), py = sy(&ay, y[i]);
        if (rows[i].is_base)
            fprintf(f, "<rect class=\"pt base\" x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\"><title>", px - 4.5,
                    py - 4.5);
        else
            fprintf(f, "<circle class=\"pt%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\"><title>", front[i] ? " onfront" : "", px,
                    py);
        html_esc(f, rows[i].label);
        fprintf(f, ": %.2f MiB, %.6g</title></%s>\n", x[i], y[i], rows[i].is_base ? "rect" : "circle");
        double lx, ly;
        bool end;
        place_label(px, py, strlen(rows[i].label + cut), placed, &n_placed, &lx, &ly, &end);
        if (fabs(ly - 4 - py) > 8) // moved off its row: a leader line to its point
            fprintf(f, "<line class=\"leader\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", px, py,
                    lx + (end ? -2 : 2), ly - 4);
        fprintf(f, "<text class=\"ptlabel\" x=\"%.1f\" y=\"%.1f\"%s>", lx, ly, end ? " text-anchor=\"end\"" : "");
        html_esc(f, rows[i].label + cut);
        fputs("</text>\n", f);
    }
done:
    fputs("</svg>\n", f);
    free(x);
    free(front);
    free(order);
    free(placed);
}

static void html_num(FILE *f, const char *fmt, double v) {
    fputs("<td>", f);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("&ndash;", f);
    fputs("</td>", f);
}

static void html_table(FILE *f, const struct llmq_compare_row *rows, int n) {
    fputs("<table>\n<tr><th>artifact</th><th>size (MiB)</th><th>bpw</th><th>PPL</th><th>&plusmn;</th>"
          "<th>&Delta;PPL</th><th>mean KLD</th><th>KLD p99</th><th>same top-1</th>",
          f);
    for (int t = 0; n && t < rows[0].n_tasks; t++) {
        fputs("<th>", f);
        html_esc(f, rows[0].tasks[t].name);
        fputs(" acc</th><th>&Delta; pts</th>", f);
    }
    fputs("</tr>\n", f);
    for (int i = 0; i < n; i++) {
        const struct llmq_compare_row *r = &rows[i];
        fprintf(f, "<tr%s><td title=\"", r->is_base ? " class=\"base\"" : "");
        html_esc(f, r->path);
        fputs("\">", f);
        html_esc(f, r->label);
        fprintf(f, "%s</td>", r->is_base ? " (base)" : "");
        html_num(f, "%.2f", (double)r->size.file_bytes / 1048576.0);
        html_num(f, "%.3f", r->size.bpw);
        html_num(f, "%.4f", r->ppl);
        html_num(f, "%.4f", r->ppl_unc);
        if (r->is_base)
            fputs("<td>base</td>", f);
        else
            html_num(f, "%+.2f%%", r->ppl_delta_pct);
        html_num(f, "%.6f", r->kld_mean);
        html_num(f, "%.5f", r->kld_p99);
        html_num(f, "%.2f%%", r->top1_pct);
        for (int t = 0; t < rows[0].n_tasks; t++) {
            const struct llmq_compare_task *x = t < r->n_tasks ? &r->tasks[t] : NULL;
            html_num(f, "%.2f", x ? 100 * x->acc : NAN);
            html_num(f, "%+.2f", x ? x->acc_delta_pts : NAN);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

enum llmq_status llmq_compare_write_html(const char *path, const struct llmq_compare_row *rows, int n,
                                         const char *title) {
    char *buf = NULL;
    size_t len = 0;
    double *ppl = malloc((size_t)(n ? n : 1) * sizeof(double)), *kld = malloc((size_t)(n ? n : 1) * sizeof(double));
    FILE *f = ppl && kld ? open_memstream(&buf, &len) : NULL;
    if (!f) {
        free(ppl);
        free(kld);
        return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    }
    bool any_kld = false;
    for (int i = 0; i < n; i++) {
        ppl[i] = rows[i].ppl;
        kld[i] = rows[i].kld_mean;
        any_kld |= !rows[i].is_base && isfinite(kld[i]);
    }
    fputs(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>llmq compare</title>\n<style>\n"
        "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}\n"
        "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}\n"
        "tr.base{background:#eef}svg{border:1px solid #ddd;margin:8px 8px 0 0}.frame{fill:none;stroke:#888}\n"
        ".grid{stroke:#eee}.tick{font-size:11px;fill:#555}.label{font-size:12px}.title{font-size:14px;"
        "font-weight:bold}\n.pt{fill:#1f6fd1}.pt.onfront{fill:#d1491f}.pt.base{fill:#222}.ptlabel{font-size:11px}\n"
        ".leader{stroke:#999;stroke-width:0.7}\n"
        ".front{fill:none;stroke:#d1491f;stroke-width:1.5;stroke-dasharray:5 3}\n</style></head>\n<body>\n"
        "<h1>llmq compare</h1>\n<p>",
        f);
    html_esc(f, title);
    fputs("</p>\n", f);
    html_table(f, rows, n);
    fputs("<p>Pareto front (dashed, red points): no other artifact is both smaller and better.</p>\n<div>\n", f);
    plot(f, rows, n, ppl, "size vs perplexity", "PPL", "plot-ppl");
    if (any_kld)
        plot(f, rows, n, kld, "size vs mean KLD", "mean KLD vs base", "plot-kld");
    else
        fputs("<p id=\"plot-kld\">size vs KLD: not measured (run with --kld)</p>\n", f);
    fputs("</div>\n</body></html>\n", f);
    free(ppl);
    free(kld);
    return commit_stream(f, &buf, &len, path);
}
