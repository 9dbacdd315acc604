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
#define MAX_CONFIG_BYTES (16u << 20)
#define MAX_LAYERS 4096

struct llmq_convert_opts llmq_convert_default_opts(void) {
    return (struct llmq_convert_opts){.to = LLMQ_CONVERT_TO_AUTO,
                                      .dtype = LLMQ_DTYPE_F32,
                                      .max_shard_bytes = 5000000000ull,
                                      .force = false,
                                      .progress = false};
}

// ============================================================================ hyper-parameters ====

enum arch { ARCH_LLAMA, ARCH_QWEN2 }; // GGUF architectures (HF mistral is written as llama)
enum rope_scale { SCALE_NONE, SCALE_LINEAR, SCALE_LLAMA3 };

struct hp {
    enum arch arch;
    const char *hf_type; // HF model_type of the input ("llama", "mistral", "qwen2"), or NULL (GGUF input)
    int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_ctx;
    float rms_eps, rope_theta;
    bool tied, attn_bias;
    enum rope_scale scale;
    float factor, low_freq_factor, high_freq_factor; // SCALE_LINEAR: factor; SCALE_LLAMA3: all
    int64_t orig_ctx;                                // SCALE_LLAMA3
};

static const char *arch_name(enum arch a) { return a == ARCH_QWEN2 ? "qwen2" : "llama"; }

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
static int64_t qk_heads(const struct hp *hp, int e) {
    const struct llmq_tensor_name *t = llmq_tensor_name_of(e);
    if (hp->arch != ARCH_LLAMA || !t->qk_rows) return 0;
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

static enum llmq_status write_json(const char *dir, const char *name, const json_t *j) {
    char *path = llmq_path_join(dir, name);
    if (!path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    enum llmq_status st = llmq_write_json(path, j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    free(path);
    return st;
}

static enum llmq_status load_config(const char *dir, json_t **out) {
    char *path = llmq_path_join(dir, "config.json");
    enum llmq_status st;
    *out = NULL;
    if (!path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    if (!llmq_file_exists(path))
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing: not a Hugging Face model directory", path);
    else
        st = llmq_read_json_object(path, MAX_CONFIG_BYTES, out);
    free(path);
    return st;
}

// config.json integer key: required (NOT_FOUND if absent), or def when absent / null.
static enum llmq_status cfg_int(const char *path, const json_t *cfg, const char *key, bool required, int64_t def,
                                int64_t *out) {
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (required) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing key %s", path, key);
        *out = def;
        return LLMQ_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1LL << 40))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s is not a non-negative integer", path, key);
    *out = json_integer_value(v);
    return LLMQ_OK;
}

static enum llmq_status cfg_num(const char *path, const json_t *cfg, const char *key, bool required, double def,
                                float *out) {
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (required) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing key %s", path, key);
        *out = (float)def;
        return LLMQ_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s is not a number", path, key);
    *out = (float)json_number_value(v);
    return LLMQ_OK;
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

static enum llmq_status gguf_key_i64(const struct llmq_gguf *g, const char *arch, const char *suffix, bool required,
                                     int64_t def, int64_t *out) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    if (!llmq_gguf_find_kv(g, key) && !required) {
        *out = def;
        return LLMQ_OK;
    }
    enum llmq_status st = llmq_gguf_get_i64(g, key, out);
    if (!st && (*out < 0 || *out > (1LL << 40)))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s = %lld is out of range", llmq_gguf_path(g), key, (long long)*out);
    return st;
}

static enum llmq_status gguf_key_f32(const struct llmq_gguf *g, const char *arch, const char *suffix, bool required,
                                     float def, float *out) {
    char key[128];
    double d;
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, key);
    if (!kv && !required) {
        *out = def;
        return LLMQ_OK;
    }
    if (kv && kv->type == LLMQ_GGUF_TYPE_FLOAT32) { // keep the exact bits
        memcpy(out, kv->data, 4);
        return LLMQ_OK;
    }
    enum llmq_status st = llmq_gguf_get_f64(g, key, &d);
    if (!st) *out = (float)d;
    return st;
}

// Recovers llama3 rope-scaling parameters from a rope_freqs.weight tensor (low_freq_factor fixed to
// 1, the rest fitted), accepted only when calib/model/model.h regenerates the tensor from them.
static enum llmq_status fit_llama3(const char *path, const struct llmq_tensor_view *t, struct hp *hp) {
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
        hp->scale = SCALE_NONE;
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
    struct llmq_hparams mh = {.head_dim = hp->head_dim, .rope_theta = hp->rope_theta};
    mh.rope_llama3.enabled = true;
    mh.rope_llama3.factor = factor;
    mh.rope_llama3.low_freq_factor = 1.0f;
    double a = 0, b = 0;
    if (n >= 2 && n * sxx - sx * sx != 0) {
        a = (n * sxy - sx * sy) / (n * sxx - sx * sx);
        b = -(sy - a * sx) / n;
    }
    if (a > 0 && b > 0) {
        mh.rope_llama3.high_freq_factor = (float)(round((1.0 + 1.0 / b) * 1000.0) / 1000.0);
        mh.rope_llama3.original_max_pos = (int64_t)llround(a / b);
    } else { // too few band points to fit: Llama 3.1's values
        mh.rope_llama3.high_freq_factor = 4.0f;
        mh.rope_llama3.original_max_pos = 8192;
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
    hp->scale = SCALE_LLAMA3;
    hp->factor = factor;
    hp->low_freq_factor = 1.0f;
    hp->high_freq_factor = mh.rope_llama3.high_freq_factor;
    hp->orig_ctx = mh.rope_llama3.original_max_pos;
done:
    free(ff);
    free(re);
    return st;
}

static enum llmq_status hp_from_gguf(const struct llmq_gguf *g, struct hp *hp) {
    const char *path = llmq_gguf_path(g), *arch = NULL;
    enum llmq_status st;
    memset(hp, 0, sizeof(*hp));
    if ((st = llmq_gguf_get_str(g, "general.architecture", &arch))) return st;
    if (strcmp(arch, "llama") == 0)
        hp->arch = ARCH_LLAMA;
    else if (strcmp(arch, "qwen2") == 0)
        hp->arch = ARCH_QWEN2;
    else
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not supported (llama, qwen2)", path, arch);
    if ((st = gguf_key_i64(g, arch, "embedding_length", true, 0, &hp->n_embd)) ||
        (st = gguf_key_i64(g, arch, "feed_forward_length", true, 0, &hp->n_ff)) ||
        (st = gguf_key_i64(g, arch, "block_count", true, 0, &hp->n_layer)) ||
        (st = gguf_key_i64(g, arch, "attention.head_count", true, 0, &hp->n_head)) ||
        (st = gguf_key_i64(g, arch, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv)) ||
        (st = gguf_key_i64(g, arch, "context_length", false, 2048, &hp->n_ctx)) ||
        (st = gguf_key_f32(g, arch, "attention.layer_norm_rms_epsilon", true, 0, &hp->rms_eps)) ||
        (st = gguf_key_f32(g, arch, "rope.freq_base", false, 10000.0f, &hp->rope_theta)))
        return st;
    if (hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_layer > MAX_LAYERS ||
        hp->n_head % hp->n_head_kv != 0)
        return llmq_errorf(
            LLMQ_ERR_CORRUPT, "%s: inconsistent hyper-parameters (embd %lld, layers %lld, heads %lld / %lld)", path,
            (long long)hp->n_embd, (long long)hp->n_layer, (long long)hp->n_head, (long long)hp->n_head_kv);
    int64_t vlen, rdim;
    if ((st = gguf_key_i64(g, arch, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim)) ||
        (st = gguf_key_i64(g, arch, "attention.value_length", false, hp->head_dim, &vlen)) ||
        (st = gguf_key_i64(g, arch, "rope.dimension_count", false, hp->head_dim, &rdim)))
        return st;
    if (vlen != hp->head_dim || rdim != hp->head_dim || hp->head_dim <= 0 || hp->head_dim % 2)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: head dims key %lld / value %lld / rope %lld: HF %s needs them equal and even", path,
                           (long long)hp->head_dim, (long long)vlen, (long long)rdim, arch);
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, key);
    const char *stype = kv ? llmq_gguf_kv_as_str(kv, NULL) : NULL;
    if (stype && strcmp(stype, "linear") == 0) {
        hp->scale = SCALE_LINEAR;
        if ((st = gguf_key_f32(g, arch, "rope.scaling.factor", true, 1.0f, &hp->factor))) return st;
    } else if (stype && strcmp(stype, "none") != 0) {
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: %s \"%s\" is not supported (none, linear, llama3)", path, key,
                           stype);
    } else if (kv && !stype) {
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s is not a string", path, key);
    }
    const struct llmq_gguf_tensor *te = llmq_gguf_find_tensor(g, "token_embd.weight");
    if (!te) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor token_embd.weight", path);
    if (te->view.n_dims != 2 || te->view.shape[1] != hp->n_embd)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: token_embd.weight is not (n_vocab, %lld)", path,
                           (long long)hp->n_embd);
    hp->n_vocab = te->view.shape[0];
    hp->tied = llmq_gguf_find_tensor(g, "output.weight") == NULL;
    hp->attn_bias = hp->arch == ARCH_LLAMA && llmq_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    const struct llmq_gguf_tensor *rf = llmq_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) {
        if (hp->scale != SCALE_NONE)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: rope_freqs.weight together with %s", path, key);
        if ((st = fit_llama3(path, &rf->view, hp))) return st;
    }
    return LLMQ_OK;
}

// Expected shape (outermost first) of table entry i, for the checks of both directions. Returns
// n_dims, 0 for an entry that does not belong to hp (a bias the architecture lacks).
static int expected_shape(const struct hp *hp, int i, int64_t *shape) {
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
        bool has = hp->arch == ARCH_QWEN2 ? i != LLMQ_T_BIAS_O : hp->attn_bias;
        return has ? (shape[0] = lin[i - LLMQ_T_BIAS_Q][0], 1) : 0;
    }
    default:
        if (i >= LLMQ_T_LINEAR_0 && i < LLMQ_T_LINEAR_0 + LLMQ_LIN_COUNT)
            return shape[0] = lin[i - LLMQ_T_LINEAR_0][0], shape[1] = lin[i - LLMQ_T_LINEAR_0][1], 2;
        return 0;
    }
}

static enum llmq_status check_shape(const char *path, const struct llmq_tensor_view *v, const struct hp *hp, int i) {
    int64_t shape[LLMQ_MAX_DIMS];
    int nd = expected_shape(hp, i, shape);
    char got[64];
    if (nd == 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s does not belong to a %s model", path, v->name,
                           hp->hf_type ? hp->hf_type : arch_name(hp->arch));
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
static enum llmq_status check_complete(const char *path, const struct hp *hp, const bool *seen, bool to_hf) {
    for (int i = 0; i < N_NAMES; i++) {
        int64_t shape[LLMQ_MAX_DIMS];
        if (!expected_shape(hp, i, shape)) continue;
        if (i == LLMQ_T_OUTPUT && hp->tied) continue;
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

static json_t *hf_config_json(const struct hp *hp, const struct cv_vocab *v, enum llmq_dtype dtype) {
    bool qwen = hp->arch == ARCH_QWEN2;
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    json_object_set_new(c, "model_type", json_string(qwen ? "qwen2" : "llama"));
    if (!qwen) json_object_set_new(c, "attention_bias", json_boolean(hp->attn_bias));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    if (v->special[CV_BOS] >= 0) json_object_set_new(c, "bos_token_id", json_integer(v->special[CV_BOS]));
    if (v->special[CV_EOS] >= 0) json_object_set_new(c, "eos_token_id", json_integer(v->special[CV_EOS]));
    json_object_set_new(c, "head_dim", json_integer(hp->head_dim));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(hp->n_embd));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(hp->n_ff));
    json_object_set_new(c, "max_position_embeddings", json_integer(hp->n_ctx));
    if (qwen) json_object_set_new(c, "max_window_layers", json_integer(hp->n_layer));
    if (!qwen) json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "num_attention_heads", json_integer(hp->n_head));
    json_object_set_new(c, "num_hidden_layers", json_integer(hp->n_layer));
    json_object_set_new(c, "num_key_value_heads", json_integer(hp->n_head_kv));
    if (v->special[CV_PAD] >= 0) json_object_set_new(c, "pad_token_id", json_integer(v->special[CV_PAD]));
    if (!qwen) json_object_set_new(c, "pretraining_tp", json_integer(1));
    json_object_set_new(c, "rms_norm_eps", json_f32(hp->rms_eps));
    if (hp->scale == SCALE_LINEAR)
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s, s:o}", "rope_type", "linear", "factor", json_f32(hp->factor)));
    else if (hp->scale == SCALE_LLAMA3)
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:o, s:o, s:o, s:I, s:s}", "factor", json_f32(hp->factor), "high_freq_factor",
                                      json_f32(hp->high_freq_factor), "low_freq_factor", json_f32(hp->low_freq_factor),
                                      "original_max_position_embeddings", (json_int_t)hp->orig_ctx, "rope_type",
                                      "llama3"));
    else
        json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "rope_theta", json_f32(hp->rope_theta));
    if (qwen) json_object_set_new(c, "sliding_window", json_null());
    json_object_set_new(c, "tie_word_embeddings", json_boolean(hp->tied));
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype(dtype)));
    json_object_set_new(c, "use_cache", json_true());
    if (qwen) json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "vocab_size", json_integer(hp->n_vocab));
    return c;
}

static enum llmq_status gguf_to_hf(const char *in, const char *out, bool replace, const struct llmq_convert_opts *o,
                                   struct llmq_convert_stats *stats) {
    struct llmq_gguf *g = NULL;
    struct llmq_st_writer *sw = NULL;
    struct cv_vocab v = {0};
    struct plan p = {0};
    struct hp hp;
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
                             tv->name, arch_name(hp.arch));
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
    if ((st = cv_vocab_to_hf(&v, in, hp.n_ctx, &tok, &tok_cfg))) goto done;
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

static enum llmq_status hp_from_hf(const char *path, const json_t *cfg, struct hp *hp) {
    enum llmq_status st;
    memset(hp, 0, sizeof(*hp));
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    const char *a0 = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
    if (!mt && a0)
        mt = !strcmp(a0, "LlamaForCausalLM")     ? "llama"
             : !strcmp(a0, "MistralForCausalLM") ? "mistral"
             : !strcmp(a0, "Qwen2ForCausalLM")   ? "qwen2"
                                                 : a0;
    if (!mt) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing key model_type", path);
    if (!strcmp(mt, "llama") || !strcmp(mt, "mistral"))
        hp->arch = ARCH_LLAMA;
    else if (!strcmp(mt, "qwen2"))
        hp->arch = ARCH_QWEN2;
    else
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (llama, mistral, qwen2)", path,
                           mt);
    hp->hf_type = !strcmp(mt, "llama") ? "llama" : !strcmp(mt, "mistral") ? "mistral" : "qwen2";
    if ((st = cfg_int(path, cfg, "hidden_size", true, 0, &hp->n_embd)) ||
        (st = cfg_int(path, cfg, "intermediate_size", true, 0, &hp->n_ff)) ||
        (st = cfg_int(path, cfg, "num_hidden_layers", true, 0, &hp->n_layer)) ||
        (st = cfg_int(path, cfg, "num_attention_heads", true, 0, &hp->n_head)) ||
        (st = cfg_int(path, cfg, "num_key_value_heads", false, hp->n_head, &hp->n_head_kv)) ||
        (st = cfg_int(path, cfg, "vocab_size", true, 0, &hp->n_vocab)) ||
        (st = cfg_int(path, cfg, "max_position_embeddings", false, 2048, &hp->n_ctx)) ||
        (st = cfg_num(path, cfg, "rms_norm_eps", false, 1e-6, &hp->rms_eps)) || // transformers' default
        (st = cfg_num(path, cfg, "rope_theta", false, 10000.0, &hp->rope_theta)))
        return st;
    if (hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_layer > MAX_LAYERS ||
        hp->n_head % hp->n_head_kv != 0 || hp->n_vocab <= 0)
        return llmq_errorf(
            LLMQ_ERR_CORRUPT, "%s: inconsistent hyper-parameters (hidden %lld, layers %lld, heads %lld / %lld)", path,
            (long long)hp->n_embd, (long long)hp->n_layer, (long long)hp->n_head, (long long)hp->n_head_kv);
    if ((st = cfg_int(path, cfg, "head_dim", false, hp->n_embd / hp->n_head, &hp->head_dim))) return st;
    if (hp->head_dim <= 0 || hp->head_dim % 2)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: head_dim %lld is not a positive even number", path,
                           (long long)hp->head_dim);
    const json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    hp->tied = json_is_true(tie); // transformers' default for llama / mistral / qwen2 configs: false
    if (tie && !json_is_boolean(tie))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tie_word_embeddings is not a boolean", path);
    hp->attn_bias = hp->arch == ARCH_LLAMA && json_is_true(json_object_get(cfg, "attention_bias"));
    if (json_is_true(json_object_get(cfg, "mlp_bias")))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: mlp_bias is not supported", path);
    const json_t *rs = json_object_get(cfg, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rs, "type"));
        if (!json_is_object(rs) || !type)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rope_scaling has no rope_type", path);
        if (!strcmp(type, "linear")) {
            hp->scale = SCALE_LINEAR;
            if ((st = cfg_num(path, rs, "factor", true, 1.0, &hp->factor))) return st;
        } else if (!strcmp(type, "llama3")) {
            hp->scale = SCALE_LLAMA3;
            if ((st = cfg_num(path, rs, "factor", true, 0, &hp->factor)) ||
                (st = cfg_num(path, rs, "low_freq_factor", true, 0, &hp->low_freq_factor)) ||
                (st = cfg_num(path, rs, "high_freq_factor", true, 0, &hp->high_freq_factor)) ||
                (st = cfg_int(path, rs, "original_max_position_embeddings", true, 0, &hp->orig_ctx)))
                return st;
            if (!(hp->high_freq_factor > hp->low_freq_factor) || hp->low_freq_factor <= 0 || hp->orig_ctx <= 0)
                return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rope_scaling llama3 parameters out of range", path);
        } else if (strcmp(type, "default") != 0) {
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: rope_scaling type \"%s\" is not supported (linear, llama3)",
                               path, type);
        }
    }
    return LLMQ_OK;
}

static enum llmq_status gguf_hparams(struct llmq_gguf_writer *w, const struct hp *hp, const char *name,
                                     enum llmq_dtype dtype) {
    const char *a = arch_name(hp->arch);
    char k[128];
    enum llmq_status st;
#define KEY(suffix) (snprintf(k, sizeof(k), "%s.%s", a, suffix), k)
    if ((st = llmq_gguf_writer_set_str(w, "general.architecture", a)) ||
        (st = llmq_gguf_writer_set_str(w, "general.type", "model")) ||
        (st = llmq_gguf_writer_set_str(w, "general.name", name)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)hp->n_ctx)) ||
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
    if ((dtype != LLMQ_DTYPE_COUNT && (st = llmq_gguf_writer_set_u32(w, "general.file_type", file_type_of(dtype)))) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab)) ||
        (st = llmq_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->head_dim)))
        return st;
    if (hp->scale == SCALE_LINEAR && ((st = llmq_gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear")) ||
                                      (st = llmq_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), hp->factor))))
        return st;
#undef KEY
    return LLMQ_OK;
}

static enum llmq_status hf_to_gguf(const char *in, const char *out, const struct llmq_convert_opts *o,
                                   struct llmq_convert_stats *stats) {
    struct llmq_st_model *m = NULL;
    struct llmq_gguf_writer *w = NULL;
    struct cv_vocab v = {0};
    struct plan p = {0};
    struct hp hp;
    json_t *cfg = NULL;
    char *cfg_path = llmq_path_join(in, "config.json");
    bool *seen = NULL;
    enum llmq_status st;

    // ---- plan
    if (!cfg_path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
    if ((st = load_config(in, &cfg)) || (st = hp_from_hf(cfg_path, cfg, &hp))) goto done;
    if ((st = llmq_st_open(in, &m))) goto done;
    if ((st = cv_vocab_from_hf(in, cfg, hp.n_vocab, &v))) goto done;
    if (!(seen = calloc((size_t)hp.n_layer * N_NAMES, sizeof(bool)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        goto done;
    }
    if (hp.scale == SCALE_LLAMA3) { // convert_hf_to_gguf.py writes the factors as a tensor, first
        struct llmq_hparams mh = {.head_dim = hp.head_dim, .rope_theta = hp.rope_theta};
        struct job *j = plan_add(&p);
        mh.rope_llama3.enabled = true;
        mh.rope_llama3.factor = hp.factor;
        mh.rope_llama3.low_freq_factor = hp.low_freq_factor;
        mh.rope_llama3.high_freq_factor = hp.high_freq_factor;
        mh.rope_llama3.original_max_pos = hp.orig_ctx;
        if (!j || !(p.rope_freqs = malloc((size_t)(hp.head_dim / 2) * sizeof(float)))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
            goto done;
        }
        llmq_rope_llama3_factors(&mh, p.rope_freqs);
        j->gen = p.rope_freqs;
        snprintf(j->name, sizeof(j->name), "rope_freqs.weight");
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
                             hp.hf_type);
            goto done;
        }
        if (e == LLMQ_T_OUTPUT && hp.tied) continue; // tied: the embedding is the head
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
    char name[256]; // general.name: the directory's name
    size_t len = strlen(in);
    while (len > 1 && in[len - 1] == '/') len--;
    const char *base = in + len;
    while (base > in && base[-1] != '/') base--;
    snprintf(name, sizeof(name), "%.*s", (int)(in + len - base), base);
    if (!(w = llmq_gguf_writer_init())) {
        st = LLMQ_ERR_NOMEM;
        goto done;
    }
    if ((st = gguf_hparams(w, &hp, name, o->dtype)) || (st = cv_vocab_write_gguf(&v, w))) goto done;
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
    free(cfg_path);
    return st;
}

enum llmq_status llmq_convert_hf_gguf_kvs(const char *in, struct llmq_gguf_writer *w) {
    struct cv_vocab v = {0};
    struct hp hp;
    json_t *cfg = NULL;
    char *cfg_path = llmq_path_join(in, "config.json");
    char name[256]; // general.name: the directory's name, as hf_to_gguf writes it
    size_t len = strlen(in);
    enum llmq_status st;
    if (!cfg_path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
    while (len > 1 && in[len - 1] == '/') len--;
    const char *base = in + len;
    while (base > in && base[-1] != '/') base--;
    snprintf(name, sizeof(name), "%.*s", (int)(in + len - base), base);
    if (!(st = load_config(in, &cfg)) && !(st = hp_from_hf(cfg_path, cfg, &hp)) &&
        !(st = cv_vocab_from_hf(in, cfg, hp.n_vocab, &v)) && !(st = gguf_hparams(w, &hp, name, LLMQ_DTYPE_COUNT)))
        st = cv_vocab_write_gguf(&v, w);
    cv_vocab_free(&v);
    json_decref(cfg);
    free(cfg_path);
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
    struct hp hp;
    json_t *cfg = NULL, *gen = NULL, *tok = NULL, *tok_cfg = NULL;
    enum llmq_status st = LLMQ_OK;

    if (llmq_is_dir(in)) {
        if ((st = load_config(in, &cfg))) goto done;
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
        if ((st = cv_vocab_to_hf(&v, in, hp.n_ctx, &tok, &tok_cfg))) goto done;
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
