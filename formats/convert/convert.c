// formats/convert/convert.c — `llmq convert`: GGUF <-> Hugging Face directory, GGUF -> GGUF at f32/f16/bf16.
// Contracts in formats/convert/convert.h. Mirrors llama.cpp's convert_hf_to_gguf.py (LlamaModel / Qwen2Model:
// the keys written, the q/k permute, the llama3 rope_freqs tensor) and its inverse; the tokenizer
// half lives in formats/convert/vocab.c.
//
// Every direction runs in two phases: plan (open the input, read every hyper-parameter, map and
// check every tensor, build the vocabulary and the JSON files) and write (create the temporary
// output, stream the tensors one chunk of rows at a time, publish). Errors in the plan phase leave
// nothing behind.
//
// Legend: R rows (outermost dims), C the innermost dim, Dh head_dim, H / Hkv heads.
#include "formats/convert/convert.h"

#include "common/io.h"
#include "common/log.h"
#include "formats/convert/vocab.h"
#include "formats/ggml/quants.h"
#include "formats/gguf.h"
#include "formats/llama/arch.h"
#include "formats/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_FLOATS (1 << 20)      // rows are converted in chunks of about 4 MiB of f32
#define RAW_CHUNK_BYTES (16u << 20) // same-dtype copies go out in pieces of this size
#define N_CTX_ABSENT 2048           // context_length / max_position_embeddings absent: written as 2048

struct llmq_convert_opts llmq_convert_default_opts(void) {
    return (struct llmq_convert_opts){.to = LLMQ_CONVERT_TO_AUTO,
                                      .dtype = LLMQ_DTYPE_F32,
                                      .max_shard_bytes = 5000000000ull,
                                      .force = false,
                                      .progress = false};
}

// ============================================================================ tensor names ====
// The table of formats/llama/arch.h: entry e = enum llmq_tensor_role.

#define N_NAMES LLMQ_T_COUNT

// Maps a tensor name to the other format. Returns the table index (out gets the new name, *layer
// the block or -1), or -1 if the name is not in the table or its block is >= n_layer.
static int map_name(const char *name, bool to_hf, int64_t n_layer, char *out, size_t out_size, int64_t *layer) {
    int e = llmq_tensor_role_of(name, !to_hf, n_layer, layer);
    if (e >= 0) llmq_tensor_full_name(e, *layer, to_hf, out, out_size);
    return e;
}

// Rows permuted between the formats for table entry e (q/k weights and biases of llama): its heads, else 0.
static int64_t qk_heads(const struct llmq_hparams *hp, int e) {
    const struct llmq_tensor_name *t = llmq_tensor_name_of(e);
    if (!llmq_arch_qk_permuted(hp->arch) || !t->qk_rows) return 0;
    return t->linear == LLMQ_LIN_Q ? hp->n_head : hp->n_head_kv;
}

// ============================================================================ jobs ====
// One output tensor: where its values come from and what it becomes.

struct job {
    const struct llmq_tensor_view *src; // input view, or NULL for a generated tensor
    const float *gen;                   // generated f32 values (rope_freqs) when src is NULL
    char name[128];                     // output name
    enum llmq_dtype dtype;              // output dtype (F32 / F16 / BF16)
    int n_dims;
    int64_t shape[LLMQ_MAX_DIMS]; // outermost first (== the input's)
    int64_t perm_heads;           // q/k permutation with this many heads; 0 = rows in order
    bool to_gguf;                 // direction of the permutation
};

struct plan {
    struct job *jobs; // (n)
    int64_t n, cap;
    float *rope_freqs; // (Dh/2) generated llama3 factors, owned
};

static void plan_free(struct plan *p) {
    free(p->jobs);
    free(p->rope_freqs);
    memset(p, 0, sizeof(*p));
}

static struct job *plan_add(struct plan *p) {
    if (p->n == p->cap) {
        int64_t cap = p->cap ? 2 * p->cap : 64;
        struct job *j = realloc(p->jobs, (size_t)cap * sizeof(*j));
        if (!j) return NULL;
        p->jobs = j;
        p->cap = cap;
    }
    memset(&p->jobs[p->n], 0, sizeof(struct job));
    return &p->jobs[p->n++];
}

static int64_t job_nelements(const struct job *j) {
    int64_t n = 1;
    for (int d = 0; d < j->n_dims; d++) n *= j->shape[d];
    return n;
}

// Rows and columns the job is processed in: the innermost dim is a row, except for a permuted tensor
// whose first dim is permuted (a 1-D bias is then R values of one element each).
static void job_rc(const struct job *j, int64_t *R, int64_t *C) {
    int64_t n = job_nelements(j);
    if (j->perm_heads)
        *R = j->shape[0];
    else
        *R = j->n_dims > 0 && j->shape[j->n_dims - 1] > 0 ? n / j->shape[j->n_dims - 1] : (j->n_dims ? 0 : 1);
    *C = *R > 0 ? n / *R : 0;
}

// Checks that a job can run: a decodable input dtype, rows that fit the block size, a permutable
// shape. Fills name / dtype / shape from src.
static enum llmq_status job_check(const char *path, struct job *j) {
    const struct llmq_dtype_traits *tr = j->src ? llmq_dtype_traits(j->src->dtype) : NULL;
    int64_t R, C;
    size_t row_bytes;
    if (j->src && (!tr || !tr->can_dequant))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s cannot be converted", path, j->src->name,
                           llmq_dtype_name(j->src->dtype));
    job_rc(j, &R, &C);
    if (j->src && !llmq_dtype_nbytes(j->src->dtype, C, &row_bytes))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s: rows of %lld elements do not fit dtype %s", path,
                           j->src->name, (long long)C, llmq_dtype_name(j->src->dtype));
    if (j->perm_heads && (j->shape[0] % (2 * j->perm_heads) != 0 || (j->src && tr->blck != 1 && j->n_dims < 2)))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s: %lld rows cannot be split into %lld heads of pairs", path,
                           j->src ? j->src->name : j->name, (long long)j->shape[0], (long long)j->perm_heads);
    return LLMQ_OK;
}

// The destination of the converted bytes: a GGUF writer or a safetensors writer.
struct sink {
    struct llmq_gguf_writer *gw;
    struct llmq_st_writer *sw;
};

static enum llmq_status sink_write(struct sink *s, const void *data, size_t n) {
    return s->gw ? llmq_gguf_writer_write_tensor(s->gw, data, n) : llmq_st_writer_write(s->sw, data, n);
}

struct work {
    float *f;    // (cap) f32 rows
    uint16_t *h; // (cap) f16 / bf16 rows
    int64_t cap;
};

// Hands the pages of a finished input tensor back to the kernel: the input is a read-only file
// mapping, so they are re-read from the file if ever touched again. Keeps the resident set at a
// few tensors instead of the whole input file (what /usr/bin/time reports as peak memory).
static void drop_pages(const void *data, size_t nbytes) {
    long page = sysconf(_SC_PAGESIZE);
    if (!data || page <= 0 || nbytes == 0) return;
    uintptr_t b = (uintptr_t)data & ~(uintptr_t)(page - 1), e = (uintptr_t)data + nbytes;
    madvise((void *)b, e - b, MADV_DONTNEED);
}

// Streams one job into the sink: rows decoded to f32 a chunk at a time (gathered through the q/k
// permutation when there is one), then rounded to the output dtype.
static enum llmq_status run_job(const struct job *j, struct sink *s, struct work *w) {
    int64_t R, C;
    size_t row_bytes = 0;
    enum llmq_dtype sd = j->src ? j->src->dtype : LLMQ_DTYPE_F32;
    const uint8_t *base = j->src ? (const uint8_t *)j->src->data : (const uint8_t *)j->gen;
    enum llmq_status st = LLMQ_OK;
    job_rc(j, &R, &C);
    if (R == 0 || C == 0) return LLMQ_OK;
    llmq_dtype_nbytes(sd, C, &row_bytes);   // checked by job_check
    if (!j->perm_heads && sd == j->dtype) { // same bytes: copy straight from the mapping
        size_t total = row_bytes * (size_t)R;
        for (size_t off = 0; off < total && !st; off += RAW_CHUNK_BYTES) {
            size_t n = total - off < RAW_CHUNK_BYTES ? total - off : RAW_CHUNK_BYTES;
            st = sink_write(s, base + off, n);
            if (j->src) drop_pages(base + off, n);
        }
        return st;
    }
    int64_t rows = w->cap / C;
    for (int64_t r0 = 0; r0 < R && !st; r0 += rows) {
        int64_t nr = R - r0 < rows ? R - r0 : rows;
        if (!j->perm_heads) {
            st = llmq_dequantize_row(sd, base + (size_t)r0 * row_bytes, w->f, nr * C);
            if (j->src) drop_pages(base + (size_t)r0 * row_bytes, (size_t)nr * row_bytes);
        } else {
            for (int64_t k = 0; k < nr && !st; k++) {
                int64_t src_r = llmq_arch_qk_src_row(r0 + k, R, j->perm_heads, j->to_gguf);
                st = llmq_dequantize_row(sd, base + (size_t)src_r * row_bytes, w->f + k * C, C);
            }
        }
        if (st) break;
        if (j->dtype == LLMQ_DTYPE_F32) {
            st = sink_write(s, w->f, (size_t)(nr * C) * 4);
        } else {
            if (j->dtype == LLMQ_DTYPE_F16)
                llmq_f32_to_f16_row(w->f, w->h, nr * C);
            else
                llmq_f32_to_bf16_row(w->f, w->h, nr * C);
            st = sink_write(s, w->h, (size_t)(nr * C) * 2);
        }
    }
    return st;
}

// Runs every job of the plan in order, one progress line per tensor.
static enum llmq_status run_plan(const struct plan *p, struct sink *s, bool progress,
                                 struct llmq_convert_stats *stats) {
    struct work w = {0};
    enum llmq_status st = LLMQ_OK;
    uint64_t total = 0; // output bytes of the whole plan, for the ETA
    double start = llmq_now_s();
    int width = snprintf(NULL, 0, "%lld", (long long)p->n);
    for (int64_t i = 0; i < p->n; i++) {
        int64_t R, C;
        job_rc(&p->jobs[i], &R, &C);
        if (C > w.cap) w.cap = C;
        total += (uint64_t)job_nelements(&p->jobs[i]) * (p->jobs[i].dtype == LLMQ_DTYPE_F32 ? 4 : 2);
    }
    if (w.cap < CHUNK_FLOATS) w.cap = CHUNK_FLOATS;
    w.f = malloc((size_t)w.cap * sizeof(float));
    w.h = malloc((size_t)w.cap * sizeof(uint16_t));
    if (!w.f || !w.h) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "convert: work buffer of %lld floats: out of memory", (long long)w.cap);
        goto done;
    }
    for (int64_t i = 0; i < p->n; i++) {
        const struct job *j = &p->jobs[i];
        double t0 = llmq_now_s();
        if ((st = run_job(j, s, &w))) {
            llmq_errorf(st, "convert: tensor %s failed: %s", j->name, llmq_status_name(st));
            goto done;
        }
        if (j->src) drop_pages(j->src->data, j->src->nbytes);
        int64_t n = job_nelements(j);
        size_t out_bytes = (size_t)n * (j->dtype == LLMQ_DTYPE_F32 ? 4 : 2);
        stats->n_params += n;
        stats->bytes_out += out_bytes;
        stats->n_tensors++;
        if (progress) {
            char shape[64];
            struct llmq_tensor_view v = {.n_dims = j->n_dims};
            memcpy(v.shape, j->shape, sizeof(v.shape));
            llmq_tensor_shape_str(&v, shape, sizeof(shape));
            const char *src_name = j->src ? j->src->name : "(generated)";
            bool renamed = strcmp(src_name, j->name) != 0;
            double done_s = llmq_now_s() - start,
                   eta = stats->bytes_out ? done_s * (double)(total - stats->bytes_out) / (double)stats->bytes_out : 0;
            llmq_info("[%*lld/%lld] %s%s%s: %s -> %s %s, %.2f MiB%s, %.0f ms, ETA %.0f s", width, (long long)i + 1,
                      (long long)p->n, src_name, renamed ? " -> " : "", renamed ? j->name : "",
                      j->src ? llmq_dtype_name(j->src->dtype) : "f32", llmq_dtype_name(j->dtype), shape,
                      (double)out_bytes / 1048576.0,
                      j->perm_heads ? (j->to_gguf ? ", q/k rows permuted" : ", q/k rows un-permuted") : "",
                      1e3 * (llmq_now_s() - t0), eta);
        }
    }
done:
    free(w.f);
    free(w.h);
    return st;
}

// ============================================================================ JSON helpers ====

static enum llmq_status write_json(const char *dir, const char *name, const json_t *j) {
    char *path = llmq_path_join(dir, name);
    if (!path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    enum llmq_status st = llmq_write_json(path, j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    free(path);
    return st;
}

// ============================================================================ output paths ====

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(p); // keep going: remove as much as possible
    return 0;
}

static void remove_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static bool dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    struct dirent *e;
    bool empty = d != NULL;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    if (d) closedir(d);
    return empty;
}

// Refuses an existing output unless force, and with force anything but a file (GGUF) or a model
// directory (HF); refuses out == in.
static enum llmq_status check_output(const char *in, const char *out, bool to_hf, bool force, bool *exists) {
    struct stat so, si;
    *exists = false;
    if (lstat(out, &so) != 0) {
        if (errno == ENOENT) return LLMQ_OK;
        return llmq_errorf(LLMQ_ERR_IO, "%s: %s", out, strerror(errno));
    }
    *exists = true;
    if (stat(in, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: the output is the input", out);
    if (!force) return llmq_errorf(LLMQ_ERR_ARG, "%s: exists (use --force to replace it)", out);
    if (!to_hf && !S_ISREG(so.st_mode))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: exists and is not a regular file: not replaced", out);
    if (to_hf) {
        char *cfg = llmq_path_join(out, "config.json");
        bool ok = S_ISDIR(so.st_mode) && cfg && (llmq_file_exists(cfg) || dir_is_empty(out));
        free(cfg);
        if (!ok)
            return llmq_errorf(LLMQ_ERR_ARG,
                               "%s: exists and is neither a model directory (config.json) nor empty: not "
                               "replaced",
                               out);
    }
    return LLMQ_OK;
}

// Renames the finished temporary directory onto out (moving an old out aside first and removing it
// after), then syncs the parent directory.
static enum llmq_status publish_dir(const char *tmp, const char *out, bool replace) {
    size_t n = strlen(out) + 32;
    char *old = malloc(n), *parent = strdup(out);
    enum llmq_status st = LLMQ_OK;
    if (!old || !parent) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out);
        goto done;
    }
    snprintf(old, n, "%s.old.%ld", out, (long)getpid());
    if (replace && rename(out, old) != 0) {
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot move aside: %s", out, strerror(errno));
        goto done;
    }
    if (rename(tmp, out) != 0) {
        int e = errno;
        if (replace) rename(old, out);
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot rename %s into place: %s", out, tmp, strerror(e));
        goto done;
    }
    if (replace) remove_tree(old);
    char *slash = strrchr(parent, '/');
    if (slash == parent)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    FILE *d = fopen(slash ? parent : ".", "r");
    if (d) {
        fsync(fileno(d));
        fclose(d);
    }
done:
    free(old);
    free(parent);
    return st;
}

// ============================================================================ GGUF input ====

// Recovers llama3 rope-scaling parameters from a rope_freqs.weight tensor (low_freq_factor fixed to
// 1, the rest fitted), accepted only when calib/model/model.h regenerates the tensor from them.
static enum llmq_status fit_llama3(const char *path, const struct llmq_tensor_view *t, struct llmq_hparams *hp) {
    int64_t half = hp->head_dim / 2;
    enum llmq_status st = LLMQ_OK;
    float *ff = malloc((size_t)half * sizeof(float)), *re = malloc((size_t)half * sizeof(float));
    if (!ff || !re) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (llmq_tensor_nelements(t) != half || !llmq_dtype_traits(t->dtype)->can_dequant ||
        (st = llmq_dequantize_row(t->dtype, t->data, ff, half))) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rope_freqs.weight: expected %lld decodable values", path,
                         (long long)half);
        goto done;
    }
    float factor = 1.0f;
    for (int64_t i = 0; i < half; i++) factor = ff[i] > factor ? ff[i] : factor;
    if (factor == 1.0f) { // all ones: no scaling at all
        hp->rope_scaling.type = LLMQ_ROPE_SCALING_NONE;
        goto done;
    }
    // band points: 1 < ff < factor, s = (1/ff - 1/factor) / (1 - 1/factor) = L / ((hi - 1) wavelen) - 1 / (hi - 1)
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n = 0;
    for (int64_t i = 0; i < half; i++) {
        if (!(ff[i] > 1.0f && ff[i] < factor)) continue;
        double freq = 1.0 / pow(hp->rope_theta, (double)(2 * i) / (double)hp->head_dim);
        double x = freq / (2.0 * M_PI), y = (1.0 / ff[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
        sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
    }
    struct llmq_hparams mh = *hp;
    mh.rope_scaling.type = LLMQ_ROPE_SCALING_LLAMA3;
    mh.rope_scaling.factor = factor;
    mh.rope_scaling.low_freq_factor = 1.0f;
    double a = 0, b = 0;
    if (n >= 2 && n * sxx - sx * sx != 0) {
        a = (n * sxy - sx * sy) / (n * sxx - sx * sx);
        b = -(sy - a * sx) / n;
    }
    if (a > 0 && b > 0) {
        mh.rope_scaling.high_freq_factor = (float)(round((1.0 + 1.0 / b) * 1000.0) / 1000.0);
        mh.rope_scaling.original_max_pos = (int64_t)llround(a / b);
    } else { // too few band points to fit: Llama 3.1's values
        mh.rope_scaling.high_freq_factor = 4.0f;
        mh.rope_scaling.original_max_pos = 8192;
    }
    llmq_rope_llama3_factors(&mh, re);
    for (int64_t i = 0; i < half; i++)
        if (fabsf(re[i] - ff[i]) > 1e-6f * fabsf(ff[i])) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                             "%s: rope_freqs.weight does not follow llama3 rope scaling (value %lld: %g, fitted %g): "
                             "config.json cannot express it",
                             path, (long long)i, (double)ff[i], (double)re[i]);
            goto done;
        }
    hp->rope_scaling = mh.rope_scaling;
done:
    free(ff);
    free(re);
    return st;
}

// The converter's reading of a GGUF (formats/llama/arch.h llmq_hparams_from_gguf): context_length
// absent means 2048; general.architecture "mistral" is refused (llama.cpp writes mistral models as
// "llama"); a rope_freqs.weight tensor becomes llama3 rope_scaling (fit_llama3).
static enum llmq_status hp_from_gguf(const struct llmq_gguf *g, struct llmq_hparams *hp) {
    const char *path = llmq_gguf_path(g);
    enum llmq_status st = llmq_hparams_from_gguf(g, N_CTX_ABSENT, hp);
    if (st) return st;
    if (hp->arch == LLMQ_ARCH_MISTRAL)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not supported (llama, qwen2)", path,
                           llmq_arch_name(hp->arch));
    const struct llmq_gguf_tensor *rf = llmq_gguf_find_tensor(g, LLMQ_GGUF_ROPE_FREQS);
    if (!rf) return LLMQ_OK;
    if (hp->rope_scaling.type != LLMQ_ROPE_SCALING_NONE)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: rope_freqs.weight together with %s.rope.scaling.type", path,
                           llmq_arch_name(hp->arch));
    return fit_llama3(path, &rf->view, hp);
}

// Expected shape (outermost first) of table entry i, for the checks of both directions. Returns
// n_dims, 0 for an entry that does not belong to hp (a bias the architecture lacks).
static int expected_shape(const struct llmq_hparams *hp, int i, int64_t *shape) {
    int64_t D = hp->n_embd, F = hp->n_ff, q = hp->n_head * hp->head_dim, kv = hp->n_head_kv * hp->head_dim;
    // (out, in) of each linear; a bias is (out)
    const int64_t lin[LLMQ_LIN_COUNT][2] = {{q, D}, {kv, D}, {kv, D}, {D, q}, {F, D}, {F, D}, {D, F}};
    switch (i) {
    case LLMQ_T_TOK_EMBD:
    case LLMQ_T_OUTPUT: return shape[0] = hp->n_vocab, shape[1] = D, 2;
    case LLMQ_T_OUTPUT_NORM:
    case LLMQ_T_ATTN_NORM:
    case LLMQ_T_FFN_NORM: return shape[0] = D, 1;
    case LLMQ_T_BIAS_Q:
    case LLMQ_T_BIAS_K:
    case LLMQ_T_BIAS_V:
    case LLMQ_T_BIAS_O: {
        bool has = hp->qkv_bias ? i != LLMQ_T_BIAS_O : hp->attn_bias;
        return has ? (shape[0] = lin[i - LLMQ_T_BIAS_Q][0], 1) : 0;
    }
    default:
        if (i >= LLMQ_T_LINEAR_0 && i < LLMQ_T_LINEAR_0 + LLMQ_LIN_COUNT)
            return shape[0] = lin[i - LLMQ_T_LINEAR_0][0], shape[1] = lin[i - LLMQ_T_LINEAR_0][1], 2;
        return 0;
    }
}

static enum llmq_status check_shape(const char *path, const struct llmq_tensor_view *v, const struct llmq_hparams *hp,
                                    int i) {
    int64_t shape[LLMQ_MAX_DIMS];
    int nd = expected_shape(hp, i, shape);
    char got[64];
    if (nd == 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s does not belong to a %s model", path, v->name,
                           llmq_arch_name(hp->arch));
    bool ok = v->n_dims == nd;
    for (int d = 0; ok && d < nd; d++) ok = v->shape[d] == shape[d];
    if (!ok) {
        struct llmq_tensor_view e = {.n_dims = nd};
        char want[64];
        memcpy(e.shape, shape, sizeof(int64_t) * (size_t)nd);
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s has shape %s, the hyper-parameters say %s", path, v->name,
                           llmq_tensor_shape_str(v, got, sizeof(got)), llmq_tensor_shape_str(&e, want, sizeof(want)));
    }
    return LLMQ_OK;
}

// Every tensor the model needs must be there (tracked per table entry and block).
static enum llmq_status check_complete(const char *path, const struct llmq_hparams *hp, const bool *seen, bool to_hf) {
    for (int i = 0; i < N_NAMES; i++) {
        int64_t shape[LLMQ_MAX_DIMS];
        if (!expected_shape(hp, i, shape)) continue;
        if (i == LLMQ_T_OUTPUT && hp->tied_embeddings) continue;
        for (int64_t l = 0; l < (llmq_tensor_name_of(i)->per_block ? hp->n_layer : 1); l++)
            if (!seen[(size_t)l * N_NAMES + (size_t)i]) {
                char nm[128];
                return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s", path,
                                   llmq_tensor_full_name(i, l, !to_hf, nm, sizeof nm));
            }
    }
    return LLMQ_OK;
}

// ============================================================================ GGUF -> GGUF ====

static uint32_t file_type_of(enum llmq_dtype d) { return d == LLMQ_DTYPE_F16 ? 1 : d == LLMQ_DTYPE_BF16 ? 32 : 0; }

static enum llmq_status gguf_to_gguf(const char *in, const char *out, const struct llmq_convert_opts *o,
                                     struct llmq_convert_stats *stats) {
    struct llmq_gguf *g = NULL;
    struct llmq_gguf_writer *w = NULL;
    struct plan p = {0};
    enum llmq_status st;
    static const char *const except[] = {"general.quantization_version", NULL};
    if ((st = llmq_gguf_open(in, &g))) return st;
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *v = &llmq_gguf_tensor_at(g, i)->view;
        struct job *j = plan_add(&p);
        if (!j) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
            goto done;
        }
        j->src = v;
        snprintf(j->name, sizeof(j->name), "%s", v->name);
        j->dtype = v->n_dims <= 1 ? LLMQ_DTYPE_F32 : o->dtype; // llama.cpp keeps 1-D tensors in f32
        j->n_dims = v->n_dims;
        memcpy(j->shape, v->shape, sizeof(j->shape));
        if ((st = job_check(in, j))) goto done;
    }
    if (!(w = llmq_gguf_writer_init())) {
        st = LLMQ_ERR_NOMEM;
        goto done;
    }
    if ((st = llmq_gguf_writer_copy_kvs(w, g, except)) ||
        (st = llmq_gguf_writer_set_u32(w, "general.file_type", file_type_of(o->dtype))))
        goto done;
    for (int64_t i = 0; i < p.n; i++)
        if ((st = llmq_gguf_writer_add_tensor(w, p.jobs[i].name, p.jobs[i].dtype, p.jobs[i].n_dims, p.jobs[i].shape)))
            goto done;
    if ((st = llmq_gguf_writer_begin(w, out))) goto done;
    struct sink s = {.gw = w};
    if ((st = run_plan(&p, &s, o->progress, stats))) goto done;
    st = llmq_gguf_writer_commit(w);
    stats->n_shards = 1;
done:
    llmq_gguf_writer_free(w);
    plan_free(&p);
    llmq_gguf_free(g);
    return st;
}

// ============================================================================ GGUF -> HF ====

static const char *torch_dtype(enum llmq_dtype d) {
    return d == LLMQ_DTYPE_F16 ? "float16" : d == LLMQ_DTYPE_BF16 ? "bfloat16" : "float32";
}

static json_t *hf_config_json(const struct llmq_hparams *hp, const struct cv_vocab *v, enum llmq_dtype dtype) {
    return llmq_hparams_to_hf_config(hp, v->special[CV_BOS], v->special[CV_EOS], v->special[CV_PAD],
                                     torch_dtype(dtype));
}

static enum llmq_status gguf_to_hf(const char *in, const char *out, bool replace, const struct llmq_convert_opts *o,
                                   struct llmq_convert_stats *stats) {
    struct llmq_gguf *g = NULL;
    struct llmq_st_writer *sw = NULL;
    struct cv_vocab v = {0};
    struct plan p = {0};
    struct llmq_hparams hp;
    json_t *cfg = NULL, *gen = NULL, *tok = NULL, *tok_cfg = NULL;
    char *tmp = NULL;
    bool *seen = NULL, tmp_made = false;
    enum llmq_status st;

    // ---- plan
    if ((st = llmq_gguf_open(in, &g)) || (st = hp_from_gguf(g, &hp))) goto done;
    if ((st = cv_vocab_from_gguf(g, &v))) goto done;
    if (v.n != hp.n_vocab) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %lld tokens but token_embd.weight has %lld rows", in, (long long)v.n,
                         (long long)hp.n_vocab);
        goto done;
    }
    if (!(seen = calloc((size_t)hp.n_layer * N_NAMES, sizeof(bool)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        goto done;
    }
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *tv = &llmq_gguf_tensor_at(g, i)->view;
        int64_t layer;
        struct job *j;
        if (!strcmp(tv->name, "rope_freqs.weight")) continue; // became config.json rope_scaling
        if (!(j = plan_add(&p))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
            goto done;
        }
        int e = map_name(tv->name, true, hp.n_layer, j->name, sizeof(j->name), &layer);
        if (e < 0) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s has no Hugging Face name (not a %s tensor)", in,
                             tv->name, llmq_arch_name(hp.arch));
            goto done;
        }
        if ((st = check_shape(in, tv, &hp, e))) goto done;
        seen[(size_t)(layer < 0 ? 0 : layer) * N_NAMES + (size_t)e] = true;
        j->src = tv;
        j->dtype = o->dtype;
        j->n_dims = tv->n_dims;
        memcpy(j->shape, tv->shape, sizeof(j->shape));
        j->perm_heads = qk_heads(&hp, e);
        if ((st = job_check(in, j))) goto done;
    }
    if ((st = check_complete(in, &hp, seen, true))) goto done;
    if ((st = cv_vocab_to_hf(&v, in, hp.n_ctx_train, &tok, &tok_cfg))) goto done;
    cfg = hf_config_json(&hp, &v, o->dtype);
    gen = json_pack("{s:b}", "_from_model_config", 1);
    if (v.special[CV_BOS] >= 0) json_object_set_new(gen, "bos_token_id", json_integer(v.special[CV_BOS]));
    if (v.special[CV_EOS] >= 0) json_object_set_new(gen, "eos_token_id", json_integer(v.special[CV_EOS]));
    if (v.special[CV_PAD] >= 0) json_object_set_new(gen, "pad_token_id", json_integer(v.special[CV_PAD]));

    // ---- write into <out>.tmp.<pid>/, then publish
    size_t tl = strlen(out) + 32;
    if (!(tmp = malloc(tl))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out);
        goto done;
    }
    snprintf(tmp, tl, "%s.tmp.%ld", out, (long)getpid());
    remove_tree(tmp); // a leftover of a crashed run with our pid
    if (mkdir(tmp, 0755) != 0) {
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    tmp_made = true;
    if ((st = write_json(tmp, "config.json", cfg)) || (st = write_json(tmp, "generation_config.json", gen)) ||
        (st = write_json(tmp, "tokenizer.json", tok)) || (st = write_json(tmp, "tokenizer_config.json", tok_cfg)))
        goto done;
    if ((st = llmq_st_writer_init(tmp, o->max_shard_bytes, &sw)) ||
        (st = llmq_st_writer_set_metadata(sw, "format", "pt")))
        goto done;
    for (int64_t i = 0; i < p.n; i++)
        if ((st = llmq_st_writer_add_tensor(sw, p.jobs[i].name, p.jobs[i].dtype, p.jobs[i].n_dims, p.jobs[i].shape)))
            goto done;
    stats->n_shards = llmq_st_writer_n_shards(sw);
    struct sink s = {.sw = sw};
    if ((st = run_plan(&p, &s, o->progress, stats))) goto done;
    st = llmq_st_writer_finish(sw);
    sw = NULL;
    if (st) goto done;
    if ((st = publish_dir(tmp, out, replace))) goto done;
    tmp_made = false;
done:
    llmq_st_writer_abort(sw);
    if (tmp_made) remove_tree(tmp);
    free(tmp);
    free(seen);
    json_decref(cfg);
    json_decref(gen);
    json_decref(tok);
    json_decref(tok_cfg);
    cv_vocab_free(&v);
    plan_free(&p);
    llmq_gguf_free(g);
    return st;
}

// ============================================================================ HF -> GGUF ====

// The converter's reading of an HF directory's config.json into *cfg (owned) and *hp
// (formats/llama/arch.h llmq_hparams_from_hf_config): max_position_embeddings absent means 2048, and
// vocab_size is required (the GGUF vocabulary is padded to it).
static enum llmq_status hp_from_hf(const char *dir, json_t **cfg, struct llmq_hparams *hp) {
    char *path = NULL;
    enum llmq_status st = llmq_hf_config_load(dir, cfg, &path);
    if (!st) st = llmq_hparams_from_hf_config(path, *cfg, N_CTX_ABSENT, hp);
    if (!st && hp->n_vocab == 0) st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing key \"vocab_size\"", path);
    free(path);
    return st;
}

// general.name of a GGUF made from HF directory in: the directory's name. Returns buf.
static const char *dir_name(const char *in, char *buf, size_t size) {
    size_t len = strlen(in);
    while (len > 1 && in[len - 1] == '/') len--;
    const char *base = in + len;
    while (base > in && base[-1] != '/') base--;
    snprintf(buf, size, "%.*s", (int)(in + len - base), base);
    return buf;
}

static enum llmq_status hf_to_gguf(const char *in, const char *out, const struct llmq_convert_opts *o,
                                   struct llmq_convert_stats *stats) {
    struct llmq_st_model *m = NULL;
    struct llmq_gguf_writer *w = NULL;
    struct cv_vocab v = {0};
    struct plan p = {0};
    struct llmq_hparams hp;
    json_t *cfg = NULL;
    bool *seen = NULL;
    enum llmq_status st;

    // ---- plan
    if ((st = hp_from_hf(in, &cfg, &hp))) goto done;
    if ((st = llmq_st_open(in, &m))) goto done;
    if ((st = cv_vocab_from_hf(in, cfg, hp.n_vocab, &v))) goto done;
    if (!(seen = calloc((size_t)hp.n_layer * N_NAMES, sizeof(bool)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        goto done;
    }
    if (hp.rope_scaling.type == LLMQ_ROPE_SCALING_LLAMA3) { // convert_hf_to_gguf.py writes the factors as a tensor
        struct job *j = plan_add(&p);
        if (!j || !(p.rope_freqs = malloc((size_t)(hp.head_dim / 2) * sizeof(float)))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
            goto done;
        }
        llmq_rope_llama3_factors(&hp, p.rope_freqs);
        j->gen = p.rope_freqs;
        snprintf(j->name, sizeof(j->name), "%s", LLMQ_GGUF_ROPE_FREQS);
        j->dtype = LLMQ_DTYPE_F32;
        j->n_dims = 1;
        j->shape[0] = hp.head_dim / 2;
    }
    for (int64_t i = 0; i < llmq_st_n_tensors(m); i++) {
        const struct llmq_tensor_view *tv = llmq_st_tensor(m, i);
        int64_t layer;
        char gname[128];
        const char *dot = strrchr(tv->name, '.');
        if (dot && !strcmp(dot, ".inv_freq")) continue; // rotary buffers of old checkpoints
        int e = map_name(tv->name, false, hp.n_layer, gname, sizeof(gname), &layer);
        if (e < 0) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s has no GGUF name (not a %s tensor)", in, tv->name,
                             llmq_arch_name(hp.arch));
            goto done;
        }
        if (e == LLMQ_T_OUTPUT && hp.tied_embeddings) continue; // tied: the embedding is the head
        if ((st = check_shape(in, tv, &hp, e))) goto done;
        if (seen[(size_t)(layer < 0 ? 0 : layer) * N_NAMES + (size_t)e]) {
            st = llmq_errorf(LLMQ_ERR_DUPLICATE, "%s: tensor %s given twice", in, tv->name);
            goto done;
        }
        seen[(size_t)(layer < 0 ? 0 : layer) * N_NAMES + (size_t)e] = true;
        struct job *j = plan_add(&p);
        if (!j) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
            goto done;
        }
        j->src = tv;
        snprintf(j->name, sizeof(j->name), "%s", gname);
        j->dtype = tv->n_dims <= 1 ? LLMQ_DTYPE_F32 : o->dtype;
        j->n_dims = tv->n_dims;
        memcpy(j->shape, tv->shape, sizeof(j->shape));
        if (qk_heads(&hp, e)) {
            j->perm_heads = qk_heads(&hp, e);
            j->to_gguf = true;
        }
        if ((st = job_check(in, j))) goto done;
    }
    if ((st = check_complete(in, &hp, seen, false))) goto done;

    // ---- write
    char name[256];
    if (!(w = llmq_gguf_writer_init())) {
        st = LLMQ_ERR_NOMEM;
        goto done;
    }
    if ((st = llmq_hparams_to_gguf(w, &hp, dir_name(in, name, sizeof name), file_type_of(o->dtype))) ||
        (st = cv_vocab_write_gguf(&v, w)))
        goto done;
    for (int64_t i = 0; i < p.n; i++)
        if ((st = llmq_gguf_writer_add_tensor(w, p.jobs[i].name, p.jobs[i].dtype, p.jobs[i].n_dims, p.jobs[i].shape)))
            goto done;
    if ((st = llmq_gguf_writer_begin(w, out))) goto done;
    struct sink s = {.gw = w};
    if ((st = run_plan(&p, &s, o->progress, stats))) goto done;
    st = llmq_gguf_writer_commit(w);
    stats->n_shards = 1;
done:
    llmq_gguf_writer_free(w);
    plan_free(&p);
    cv_vocab_free(&v);
    free(seen);
    llmq_st_free(m);
    json_decref(cfg);
    return st;
}

enum llmq_status llmq_convert_hf_gguf_kvs(const char *in, struct llmq_gguf_writer *w) {
    struct cv_vocab v = {0};
    struct llmq_hparams hp;
    json_t *cfg = NULL;
    char name[256];
    enum llmq_status st;
    if (!(st = hp_from_hf(in, &cfg, &hp)) && !(st = cv_vocab_from_hf(in, cfg, hp.n_vocab, &v)) &&
        !(st = llmq_hparams_to_gguf(w, &hp, dir_name(in, name, sizeof name), -1)))
        st = cv_vocab_write_gguf(&v, w);
    cv_vocab_free(&v);
    json_decref(cfg);
    return st;
}

// ============================================================================ entry point ====

static bool has_gguf_magic(const char *path) {
    char magic[4] = {0};
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    size_t n = fread(magic, 1, 4, fp);
    fclose(fp);
    return n == 4 && memcmp(magic, LLMQ_GGUF_MAGIC, 4) == 0;
}

enum llmq_status llmq_convert(const char *in, const char *out, const struct llmq_convert_opts *opts,
                              struct llmq_convert_stats *stats) {
    struct llmq_convert_stats dummy;
    struct stat si;
    bool exists = false;
    enum llmq_status st;
    double t0 = llmq_now_s();
    if (!stats) stats = &dummy;
    memset(stats, 0, sizeof(*stats));
    if (!in || !out || !opts) return llmq_errorf(LLMQ_ERR_ARG, "convert: missing input, output or options");
    if (opts->dtype != LLMQ_DTYPE_F32 && opts->dtype != LLMQ_DTYPE_F16 && opts->dtype != LLMQ_DTYPE_BF16)
        return llmq_errorf(LLMQ_ERR_ARG, "convert: dtype %s is not f32, f16 or bf16", llmq_dtype_name(opts->dtype));
    if (stat(in, &si) != 0) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: %s", in, strerror(errno));
    bool in_hf = S_ISDIR(si.st_mode);
    if (!in_hf && !has_gguf_magic(in))
        return llmq_errorf(LLMQ_ERR_MAGIC, "%s: neither a GGUF file nor a Hugging Face model directory", in);
    enum llmq_convert_to to = opts->to;
    if (to == LLMQ_CONVERT_TO_AUTO) {
        // an output named *.gguf is a GGUF file whatever the input; otherwise the other format
        size_t n = strlen(out);
        bool out_gguf = n >= 5 && strcmp(out + n - 5, ".gguf") == 0;
        to = in_hf || out_gguf ? LLMQ_CONVERT_TO_GGUF : LLMQ_CONVERT_TO_HF;
    }
    if (in_hf && to == LLMQ_CONVERT_TO_HF)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: HF -> HF conversion is not supported (convert to GGUF)", in);
    if ((st = check_output(in, out, to == LLMQ_CONVERT_TO_HF, opts->force, &exists))) return st;
    if (in_hf)
        st = hf_to_gguf(in, out, opts, stats);
    else if (to == LLMQ_CONVERT_TO_GGUF)
        st = gguf_to_gguf(in, out, opts, stats);
    else
        st = gguf_to_hf(in, out, exists, opts, stats);
    stats->seconds = llmq_now_s() - t0;
    return st;
}

// ===================================================== pieces for other HF writers (export) ====

void llmq_convert_remove_tree(const char *path) { remove_tree(path); }

enum llmq_status llmq_convert_write_json(const char *dir, const char *name, const json_t *j) {
    return write_json(dir, name, j);
}

enum llmq_status llmq_convert_hf_publish(const char *tmp, const char *out, bool replace) {
    return publish_dir(tmp, out, replace);
}

enum llmq_status llmq_convert_hf_prepare(const char *in, const char *out, bool force, char **tmp, bool *replace) {
    enum llmq_status st;
    *tmp = NULL;
    *replace = false;
    if ((st = check_output(in, out, true, force, replace))) return st;
    size_t tl = strlen(out) + 32;
    char *t = malloc(tl);
    if (!t) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out);
    snprintf(t, tl, "%s.tmp.%ld", out, (long)getpid());
    remove_tree(t); // a leftover of a crashed run with our pid
    if (mkdir(t, 0755) != 0) {
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot create: %s", t, strerror(errno));
        free(t);
        return st;
    }
    *tmp = t;
    return LLMQ_OK;
}

// Copies in_dir/name to out_dir/name when it exists (atomically).
static enum llmq_status copy_side_file(const char *in_dir, const char *out_dir, const char *name) {
    char *src = llmq_path_join(in_dir, name), *dst = llmq_path_join(out_dir, name), *data = NULL;
    struct llmq_afile f = {0};
    size_t n = 0;
    enum llmq_status st = LLMQ_OK;
    if (!src || !dst) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in_dir);
        goto done;
    }
    if (!llmq_file_exists(src)) goto done;
    if ((st = llmq_read_file(src, 1u << 30, &data, &n))) goto done;
    if ((st = llmq_afile_open(&f, dst))) goto done;
    if ((st = llmq_afile_write(&f, data, n))) {
        llmq_afile_abort(&f);
        goto done;
    }
    st = llmq_afile_commit(&f);
done:
    free(data);
    free(src);
    free(dst);
    return st;
}

enum llmq_status llmq_convert_hf_side(const char *in, const char *dir, enum llmq_dtype dtype,
                                      const json_t *config_extra) {
    static const char *copied[] = {"generation_config.json",
                                   "tokenizer.json",
                                   "tokenizer_config.json",
                                   "special_tokens_map.json",
                                   "added_tokens.json",
                                   "tokenizer.model",
                                   "vocab.json",
                                   "merges.txt",
                                   "chat_template.jinja",
                                   "chat_template.json"};
    struct llmq_gguf *g = NULL;
    struct cv_vocab v = {0};
    struct llmq_hparams hp;
    json_t *cfg = NULL, *gen = NULL, *tok = NULL, *tok_cfg = NULL;
    enum llmq_status st = LLMQ_OK;

    if (llmq_is_dir(in)) {
        if ((st = llmq_hf_config_load(in, &cfg, NULL))) goto done;
        for (size_t i = 0; i < sizeof copied / sizeof copied[0]; i++)
            if ((st = copy_side_file(in, dir, copied[i]))) goto done;
        json_object_del(cfg, "quantization_config");
        json_object_set_new(cfg, "torch_dtype", json_string(torch_dtype(dtype)));
    } else {
        if ((st = llmq_gguf_open(in, &g)) || (st = hp_from_gguf(g, &hp)) || (st = cv_vocab_from_gguf(g, &v))) goto done;
        if (v.n != hp.n_vocab) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %lld tokens but token_embd.weight has %lld rows", in,
                             (long long)v.n, (long long)hp.n_vocab);
            goto done;
        }
        if ((st = cv_vocab_to_hf(&v, in, hp.n_ctx_train, &tok, &tok_cfg))) goto done;
        cfg = hf_config_json(&hp, &v, dtype);
        gen = json_pack("{s:b}", "_from_model_config", 1);
        if (v.special[CV_BOS] >= 0) json_object_set_new(gen, "bos_token_id", json_integer(v.special[CV_BOS]));
        if (v.special[CV_EOS] >= 0) json_object_set_new(gen, "eos_token_id", json_integer(v.special[CV_EOS]));
        if (v.special[CV_PAD] >= 0) json_object_set_new(gen, "pad_token_id", json_integer(v.special[CV_PAD]));
        if ((st = write_json(dir, "generation_config.json", gen)) || (st = write_json(dir, "tokenizer.json", tok)) ||
            (st = write_json(dir, "tokenizer_config.json", tok_cfg)))
            goto done;
    }
    if (config_extra && json_object_update(cfg, (json_t *)config_extra) != 0) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: config.json additions are not a JSON object", dir);
        goto done;
    }
    st = write_json(dir, "config.json", cfg);
done:
    json_decref(cfg);
    json_decref(gen);
    json_decref(tok);
    json_decref(tok_cfg);
    cv_vocab_free(&v);
    llmq_gguf_free(g);
    return st;
}
