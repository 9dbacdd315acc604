// formats/convert/convert.c — `llmq convert`: GGUF <-> Hugging Face directory, GGUF -> GGUF at f32/f16/bf16.
// Contracts in formats/convert/convert.h. Mirrors llama.cpp's convert_hf_to_gguf.py (LlamaModel / Qwen2Model:
// the keys written, the q/k permute, the llama3 rope_freqs tensor) and its inverse; the tokenizer
// half lives in formats/hf/vocab.c, the HF directory's non-tensor files and staging in formats/hf/hfdir.c.
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
#include "formats/ggml/quants.h"
#include "formats/gguf.h"
#include "formats/hf/hfdir.h"
#include "formats/hf/vocab.h"
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
static int map_name(const struct llmq_hparams *hp, const char *name, bool to_hf, char *out, size_t out_size,
                    int64_t *layer) {
    int e = llmq_tensor_role_of(hp->arch, name, !to_hf, hp->n_layer, layer);
    if (e >= 0) llmq_tensor_full_name(hp->arch, e, *layer, to_hf, out, out_size);
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
    float shift;                  // added to every value in f32 (gemma norms: +1 to GGUF, -1 to HF), else 0
    int64_t perm_heads;           // q/k permutation with this many heads; 0 = rows in order
    bool to_gguf;                 // direction of the permutation
    // HF -> GGUF moe: a stacked (E, R, C) expert tensor whose rows come from n_parts (= E) 2-D (R, C) inputs in
    // order (src NULL); parts owned by the job, the views not
    const struct llmq_tensor_view **parts;
    int64_t n_parts;
};

struct plan {
    struct job *jobs; // (n)
    int64_t n, cap;
    float *rope_freqs;               // (n_rot/2) generated llama3 factors, owned
    struct llmq_tensor_view *slices; // (n_layer, 3, E) GGUF -> HF moe: each expert's rows of a stacked tensor
    int64_t *exp_job;                // (n_layer, 3) HF -> GGUF moe: the job of each stacked tensor, -1 before
};

static void plan_free(struct plan *p) {
    for (int64_t i = 0; i < p->n; i++) free(p->jobs[i].parts);
    free(p->jobs);
    free(p->rope_freqs);
    free(p->slices);
    free(p->exp_job);
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

// Part x of a stacked job: a job of its own over the (R, C) input parts[x].
static struct job part_job(const struct job *j, int64_t x) {
    struct job s = *j;
    s.src = j->parts[x];
    s.parts = NULL;
    s.n_parts = 0;
    s.n_dims = 2;
    s.shape[0] = j->shape[1];
    s.shape[1] = j->shape[2];
    s.shape[2] = 1;
    return s;
}

// Checks that a job can run: a decodable input dtype, rows that fit the block size, a permutable
// shape (every part of a stacked job).
static enum llmq_status job_check(const char *path, struct job *j) {
    enum llmq_status st = LLMQ_OK;
    for (int64_t x = 0; x < j->n_parts && !st; x++) {
        struct job s = part_job(j, x);
        st = job_check(path, &s);
    }
    if (j->n_parts) return st;
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
    for (int64_t x = 0; x < j->n_parts && !st; x++) { // a stacked tensor: its parts' rows one after the other
        struct job pj = part_job(j, x);
        if (!(st = run_job(&pj, s, w))) drop_pages(pj.src->data, pj.src->nbytes);
    }
    if (j->n_parts) return st;
    job_rc(j, &R, &C);
    if (R == 0 || C == 0) return LLMQ_OK;
    llmq_dtype_nbytes(sd, C, &row_bytes);                       // checked by job_check
    if (!j->perm_heads && sd == j->dtype && j->shift == 0.0f) { // same bytes: copy straight from the mapping
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
        if (j->shift != 0.0f)
            for (int64_t i = 0; i < nr * C; i++) w->f[i] += j->shift;
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
            const char *src_name = j->src ? j->src->name : j->n_parts ? j->parts[0]->name : "(generated)";
            bool renamed = strcmp(src_name, j->name) != 0;
            char stacked[48] = "";
            if (j->n_parts) snprintf(stacked, sizeof stacked, ", %lld experts stacked", (long long)j->n_parts);
            double done_s = llmq_now_s() - start,
                   eta = stats->bytes_out ? done_s * (double)(total - stats->bytes_out) / (double)stats->bytes_out : 0;
            const struct llmq_tensor_view *sv = j->src ? j->src : j->n_parts ? j->parts[0] : NULL;
            llmq_info("[%*lld/%lld] %s%s%s: %s -> %s %s, %.2f MiB%s%s, %.0f ms, ETA %.0f s", width, (long long)i + 1,
                      (long long)p->n, src_name, renamed ? " -> " : "", renamed ? j->name : "",
                      sv ? llmq_dtype_name(sv->dtype) : "f32", llmq_dtype_name(j->dtype), shape,
                      (double)out_bytes / 1048576.0,
                      j->perm_heads ? (j->to_gguf ? ", q/k rows permuted" : ", q/k rows un-permuted") : "", stacked,
                      1e3 * (llmq_now_s() - t0), eta);
        }
    }
done:
    free(w.f);
    free(w.h);
    return st;
}

// ============================================================================ GGUF input ====

// Expected shape (outermost first) of table entry i, for the checks of both directions. Returns
// n_dims, 0 for an entry that does not belong to hp (a bias the architecture lacks).
static int expected_shape(const struct llmq_hparams *hp, int i, int64_t *shape) {
    int64_t D = hp->n_embd, F = hp->shexp ? hp->n_ff_shexp : hp->n_ff, q = hp->n_head * hp->head_dim;
    int64_t kv = hp->n_head_kv * hp->head_dim;
    // (out, in) of each linear; a bias is (out)
    const int64_t lin[LLMQ_LIN_COUNT][2] = {{q, D}, {kv, D}, {kv, D}, {D, q}, {F, D}, {F, D}, {D, F}};
    switch (i) {
    case LLMQ_T_TOK_EMBD:
    case LLMQ_T_OUTPUT: return shape[0] = hp->n_vocab, shape[1] = D, 2;
    case LLMQ_T_OUTPUT_NORM:
    case LLMQ_T_ATTN_NORM:
    case LLMQ_T_FFN_NORM: return shape[0] = D, 1;
    case LLMQ_T_ATTN_POST_NORM:
    case LLMQ_T_FFN_POST_NORM: return hp->gemma ? (shape[0] = D, 1) : 0;
    case LLMQ_T_BIAS_Q:
    case LLMQ_T_BIAS_K:
    case LLMQ_T_BIAS_V:
    case LLMQ_T_BIAS_O: {
        bool has = hp->qkv_bias ? i != LLMQ_T_BIAS_O : hp->attn_bias;
        return has ? (shape[0] = lin[i - LLMQ_T_BIAS_Q][0], 1) : 0;
    }
    case LLMQ_T_ATTN_Q_NORM:
    case LLMQ_T_ATTN_K_NORM: return hp->qk_norm ? (shape[0] = hp->head_dim, 1) : 0;
    case LLMQ_T_FFN_GATE_INP: return hp->moe ? (shape[0] = hp->n_expert, shape[1] = D, 2) : 0;
    case LLMQ_T_FFN_GATE_INP_SHEXP: return hp->shexp ? (shape[0] = 1, shape[1] = D, 2) : 0;
    case LLMQ_T_FFN_GATE_EXPS:
    case LLMQ_T_FFN_UP_EXPS:
    case LLMQ_T_FFN_DOWN_EXPS: {
        bool down = i == LLMQ_T_FFN_DOWN_EXPS;
        return hp->moe ? (shape[0] = hp->n_expert, shape[1] = down ? D : hp->n_ff_exp,
                          shape[2] = down ? hp->n_ff_exp : D, 3)
                       : 0;
    }
    default:
        if (i < LLMQ_T_LINEAR_0 || i >= LLMQ_T_LINEAR_0 + LLMQ_LIN_COUNT) return 0;
        if (hp->moe && !hp->shexp && i >= LLMQ_T_LINEAR_0 + LLMQ_LIN_GATE) return 0; // the experts replace it
        if (llmq_arch_info_of(hp->arch)->fused) { // phi3: q is q, k, v; up is gate, up; no k, v, gate of their own
            if (i == LLMQ_T_LINEAR_0 + LLMQ_LIN_Q) return shape[0] = q + 2 * kv, shape[1] = D, 2;
            if (i == LLMQ_T_LINEAR_0 + LLMQ_LIN_UP) return shape[0] = 2 * F, shape[1] = D, 2;
            if (i != LLMQ_T_LINEAR_0 + LLMQ_LIN_O && i != LLMQ_T_LINEAR_0 + LLMQ_LIN_DOWN) return 0;
        }
        return shape[0] = lin[i - LLMQ_T_LINEAR_0][0], shape[1] = lin[i - LLMQ_T_LINEAR_0][1], 2;
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
    if (i == LLMQ_T_FFN_GATE_INP_SHEXP && v->n_dims == 1 && v->shape[0] == hp->n_embd) ok = true; // llama-quantize's
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
                                   llmq_tensor_full_name(hp->arch, i, l, !to_hf, nm, sizeof nm));
            }
    }
    return LLMQ_OK;
}

// What convert_hf_to_gguf.py always writes in f32: 1-D tensors (norms, biases), the moe router (ffn_gate_inp,
// which llama-quantize never quantizes either) and qwen2_moe's shared expert gate (ffn_gate_inp_shexp).
static bool keeps_f32(const char *gguf_name, int n_dims) {
    static const char *const f32[] = {"ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"};
    size_t n = strlen(gguf_name);
    for (size_t k = 0; k < sizeof f32 / sizeof f32[0]; k++) {
        size_t r = strlen(f32[k]);
        if (n >= r && strcmp(gguf_name + n - r, f32[k]) == 0) return true;
    }
    return n_dims <= 1;
}

// ============================================================================ experts ====
// The moe families' experts: one stacked tensor per block and role in GGUF ((E, Fe, D) gate / up, (E, D, Fe)
// down, as convert_hf_to_gguf.py's torch.stack of the experts in index order), E 2-D tensors in HF.

static bool role_is_exps(int e) { return e >= LLMQ_T_FFN_GATE_EXPS && e <= LLMQ_T_FFN_DOWN_EXPS; }

// HF -> GGUF: tv, expert x's slice of role e in block l, becomes part x of the stacked job of (l, e), which the
// first expert met creates (in dtype; marked in seen).
static enum llmq_status plan_expert_part(const char *in, const struct llmq_hparams *hp, struct plan *p,
                                         const struct llmq_tensor_view *tv, int e, int64_t l, int64_t x,
                                         enum llmq_dtype dtype, bool *seen) {
    int64_t shape[LLMQ_MAX_DIMS] = {1, 1, 1, 1}, *slot = &p->exp_job[l * 3 + (e - LLMQ_T_FFN_GATE_EXPS)];
    char got[64];
    expected_shape(hp, e, shape);
    if (tv->n_dims != 2 || tv->shape[0] != shape[1] || tv->shape[1] != shape[2])
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s has shape %s, the hyper-parameters say [%lld, %lld]", in,
                           tv->name, llmq_tensor_shape_str(tv, got, sizeof got), (long long)shape[1],
                           (long long)shape[2]);
    if (*slot < 0) {
        struct job *j = plan_add(p);
        if (!j || !(j->parts = calloc((size_t)hp->n_expert, sizeof *j->parts)))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        *slot = p->n - 1;
        j->n_parts = hp->n_expert;
        llmq_tensor_full_name(hp->arch, e, l, false, j->name, sizeof j->name);
        j->dtype = dtype;
        j->n_dims = 3;
        memcpy(j->shape, shape, sizeof j->shape);
        seen[(size_t)l * N_NAMES + (size_t)e] = true;
    }
    struct job *j = &p->jobs[*slot];
    if (j->parts[x]) return llmq_errorf(LLMQ_ERR_DUPLICATE, "%s: tensor %s given twice", in, tv->name);
    j->parts[x] = tv;
    return LLMQ_OK;
}

// HF -> GGUF: every expert of every stacked tensor is there, and every part can be converted.
static enum llmq_status check_experts(const char *in, const struct llmq_hparams *hp, struct plan *p) {
    char nm[160];
    enum llmq_status st;
    for (int64_t l = 0; hp->moe && l < hp->n_layer; l++)
        for (int k = 0; k < 3; k++) {
            int64_t slot = p->exp_job[l * 3 + k];
            for (int64_t x = 0; x < hp->n_expert; x++)
                if (slot < 0 || !p->jobs[slot].parts[x])
                    return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s", in,
                                       llmq_tensor_expert_hf_name(hp->arch, LLMQ_EXPERT_NAMES_HUB,
                                                                  LLMQ_T_FFN_GATE_EXPS + k, l, x, nm, sizeof nm));
            if ((st = job_check(in, &p->jobs[slot]))) return st;
        }
    return LLMQ_OK;
}

// GGUF -> HF: the stacked tensor tv of role e in block l (its shape checked) becomes E jobs in dtype, one per expert,
// over views of its rows (p->slices).
static enum llmq_status plan_expert_split(const char *in, const struct llmq_hparams *hp, struct plan *p,
                                          const struct llmq_tensor_view *tv, int e, int64_t l, enum llmq_dtype dtype) {
    const int64_t E = hp->n_expert, R = tv->shape[1], C = tv->shape[2];
    size_t row_bytes = 0;
    enum llmq_status st;
    if (!llmq_dtype_nbytes(tv->dtype, C, &row_bytes))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s: rows of %lld elements do not fit dtype %s", in, tv->name,
                           (long long)C, llmq_dtype_name(tv->dtype));
    for (int64_t x = 0; x < E; x++) {
        struct llmq_tensor_view *v = &p->slices[(l * 3 + (e - LLMQ_T_FFN_GATE_EXPS)) * E + x];
        struct job *j = plan_add(p);
        if (!j) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        size_t off = (size_t)x * (size_t)R * row_bytes;
        *v = *tv;
        v->n_dims = 2;
        v->shape[0] = R;
        v->shape[1] = C;
        v->shape[2] = 1;
        v->data = (const uint8_t *)tv->data + off;
        v->nbytes = (size_t)R * row_bytes;
        v->file_offset = tv->file_offset + off;
        j->src = v;
        llmq_tensor_expert_hf_name(hp->arch, LLMQ_EXPERT_NAMES_HUB, e, l, x, j->name, sizeof j->name);
        j->dtype = dtype;
        j->n_dims = 2;
        memcpy(j->shape, v->shape, sizeof j->shape);
        if ((st = job_check(in, j))) return st;
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
        j->dtype = keeps_f32(v->name, v->n_dims) ? LLMQ_DTYPE_F32 : o->dtype;
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

static enum llmq_status gguf_to_hf(const char *in, const char *out, bool replace, const struct llmq_convert_opts *o,
                                   struct llmq_convert_stats *stats) {
    struct llmq_gguf *g = NULL;
    struct llmq_st_writer *sw = NULL;
    struct llmq_hf_files files = {0};
    struct plan p = {0};
    struct llmq_hparams hp;
    char *tmp = NULL;
    bool *seen = NULL, tmp_made = false;
    enum llmq_status st;

    // ---- plan
    if ((st = llmq_gguf_open(in, &g)) || (st = llmq_hf_hparams_from_gguf(g, &hp)) ||
        (st = llmq_hf_files_from_gguf(g, &hp, o->dtype, &files)))
        goto done;
    if (!(seen = calloc((size_t)hp.n_layer * N_NAMES, sizeof(bool))) ||
        (hp.moe && !(p.slices = calloc((size_t)(hp.n_layer * 3 * hp.n_expert), sizeof *p.slices)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        goto done;
    }
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *tv = &llmq_gguf_tensor_at(g, i)->view;
        int64_t layer;
        char hname[128];
        if (!strcmp(tv->name, LLMQ_GGUF_ROPE_FREQS) || !strcmp(tv->name, LLMQ_GGUF_ROPE_LONG) ||
            !strcmp(tv->name, LLMQ_GGUF_ROPE_SHORT))
            continue; // became config.json rope_scaling
        int e = map_name(&hp, tv->name, true, hname, sizeof(hname), &layer);
        if (e < 0) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s has no Hugging Face name (not a %s tensor)", in,
                             tv->name, llmq_arch_name(hp.arch));
            goto done;
        }
        if ((st = check_shape(in, tv, &hp, e))) goto done;
        seen[(size_t)(layer < 0 ? 0 : layer) * N_NAMES + (size_t)e] = true;
        if (role_is_exps(e)) { // one HF tensor per expert
            if ((st = plan_expert_split(in, &hp, &p, tv, e, layer, o->dtype))) goto done;
            continue;
        }
        struct job *j = plan_add(&p);
        if (!j) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
            goto done;
        }
        snprintf(j->name, sizeof(j->name), "%s", hname);
        j->src = tv;
        j->dtype = o->dtype;
        j->n_dims = tv->n_dims;
        memcpy(j->shape, tv->shape, sizeof(j->shape));
        if (e == LLMQ_T_FFN_GATE_INP_SHEXP) { // nn.Linear(hidden, 1): (1, D) in HF whatever the GGUF holds
            j->n_dims = 2;
            j->shape[0] = 1;
            j->shape[1] = hp.n_embd;
        }
        j->perm_heads = qk_heads(&hp, e);
        j->shift = llmq_tensor_norm_shifted(hp.arch, e) ? -1.0f : 0.0f;
        if ((st = job_check(in, j))) goto done;
    }
    if ((st = check_complete(in, &hp, seen, true))) goto done;

    // ---- write into <out>.tmp.<pid>/, then publish
    if ((st = llmq_hf_stage_create(out, &tmp))) goto done;
    tmp_made = true;
    if ((st = llmq_hf_files_write(&files, tmp, true))) goto done;
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
    if ((st = llmq_hf_stage_publish(tmp, out, replace))) goto done;
    tmp_made = false;
done:
    llmq_st_writer_abort(sw);
    if (tmp_made) llmq_outdir_discard(tmp);
    free(tmp);
    free(seen);
    llmq_hf_files_free(&files);
    plan_free(&p);
    llmq_gguf_free(g);
    return st;
}

// ============================================================================ HF -> GGUF ====

// A planned f32 tensor (n) of generated values (owned by the caller, alive until the plan is written); false when
// out of memory.
static bool plan_gen(struct plan *p, const char *name, const float *values, int64_t n) {
    struct job *j = plan_add(p);
    if (!j) return false;
    j->gen = values;
    snprintf(j->name, sizeof(j->name), "%s", name);
    j->dtype = LLMQ_DTYPE_F32;
    j->n_dims = 1;
    j->shape[0] = n;
    return true;
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
    if ((st = llmq_hf_hparams_from_dir(in, &cfg, &hp)) || (st = llmq_hparams_check_gguf(&hp, in))) goto done;
    if ((st = llmq_st_open(in, &m))) goto done;
    if ((st = cv_vocab_from_hf(in, cfg, hp.n_vocab, &v))) goto done;
    if (!(seen = calloc((size_t)hp.n_layer * N_NAMES, sizeof(bool))) ||
        (hp.moe && !(p.exp_job = malloc((size_t)(hp.n_layer * 3) * sizeof *p.exp_job)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        goto done;
    }
    for (int64_t i = 0; hp.moe && i < hp.n_layer * 3; i++) p.exp_job[i] = -1;
    if (hp.rope_scaling.type == LLMQ_ROPE_SCALING_LLAMA3) { // convert_hf_to_gguf.py writes the factors as a tensor
        if ((p.rope_freqs = malloc((size_t)(hp.n_rot / 2) * sizeof(float))))
            llmq_rope_llama3_factors(&hp, p.rope_freqs);
        if (!p.rope_freqs || !plan_gen(&p, LLMQ_GGUF_ROPE_FREQS, p.rope_freqs, hp.n_rot / 2)) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
            goto done;
        }
    }
    if (hp.rope_scaling.type == LLMQ_ROPE_SCALING_LONGROPE && // Phi3MiniModel.generate_extra_tensors: long, short
        (!plan_gen(&p, LLMQ_GGUF_ROPE_LONG, hp.rope_scaling.long_factor, hp.n_rot / 2) ||
         !plan_gen(&p, LLMQ_GGUF_ROPE_SHORT, hp.rope_scaling.short_factor, hp.n_rot / 2))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in);
        goto done;
    }
    for (int64_t i = 0; i < llmq_st_n_tensors(m); i++) {
        const struct llmq_tensor_view *tv = llmq_st_tensor(m, i);
        int64_t layer;
        char gname[128];
        const char *dot = strrchr(tv->name, '.');
        if (dot && !strcmp(dot, ".inv_freq")) continue; // rotary buffers of old checkpoints
        int e = map_name(&hp, tv->name, false, gname, sizeof(gname), &layer);
        int64_t x = -1;
        if (e < 0 && hp.moe) e = llmq_tensor_expert_role_of(hp.arch, tv->name, hp.n_layer, hp.n_expert, &layer, &x);
        if (e < 0) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s has no GGUF name (not a %s tensor)", in, tv->name,
                             llmq_arch_name(hp.arch));
            goto done;
        }
        if (x >= 0) { // an expert's slice: part of its stacked tensor
            if ((st = plan_expert_part(in, &hp, &p, tv, e, layer, x, o->dtype, seen))) goto done;
            continue;
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
        j->dtype = keeps_f32(gname, tv->n_dims) ? LLMQ_DTYPE_F32 : o->dtype;
        j->n_dims = tv->n_dims;
        memcpy(j->shape, tv->shape, sizeof(j->shape));
        if (qk_heads(&hp, e)) {
            j->perm_heads = qk_heads(&hp, e);
            j->to_gguf = true;
        }
        j->shift = llmq_tensor_norm_shifted(hp.arch, e) ? 1.0f : 0.0f; // conversion/gemma.py: norm weights + 1
        if ((st = job_check(in, j))) goto done;
    }
    if ((st = check_experts(in, &hp, &p)) || (st = check_complete(in, &hp, seen, false))) goto done;

    // ---- write
    char name[256];
    if (!(w = llmq_gguf_writer_init())) {
        st = LLMQ_ERR_NOMEM;
        goto done;
    }
    if ((st = llmq_hparams_to_gguf(w, &hp, llmq_hf_model_name(in, name, sizeof name), file_type_of(o->dtype))) ||
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
    if ((st = llmq_output_check(in, out, to == LLMQ_CONVERT_TO_HF, opts->force, &exists))) return st;
    if (in_hf)
        st = hf_to_gguf(in, out, opts, stats);
    else if (to == LLMQ_CONVERT_TO_GGUF)
        st = gguf_to_gguf(in, out, opts, stats);
    else
        st = gguf_to_hf(in, out, exists, opts, stats);
    stats->seconds = llmq_now_s() - t0;
    return st;
}
