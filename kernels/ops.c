// kernels/ops.c — the dispatch of kernels/ops.h (argument checks, buffers) and the CPU reference of each op,
// written as calib/model/forward.c computes the same step (same operations in the same order, same sgemm
// shapes, same compile flags), so that both give the same bits. The device half is kernels/ops_cuda.cu.
#include "kernels/ops.h"

#include "kernels/gptq_grid.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct llmq_ops {
    enum llmq_backend be;
    struct llmq_ops_cuda *cuda; // CUDA: the device half's state; NULL on the CPU
    float *scores;              // CPU: (LLMQ_OPS_ATTN_RB, n_scores / RB) attention scores of one tile
    int64_t n_scores;           // floats in scores
};

enum llmq_status llmq_ops_init(enum llmq_backend be, struct llmq_ops **out) {
    *out = NULL;
    if (be != LLMQ_BACKEND_CPU && be != LLMQ_BACKEND_CUDA)
        return llmq_errorf(LLMQ_ERR_ARG, "ops: unknown backend %d", (int)be);
    struct llmq_ops *ops = calloc(1, sizeof *ops);
    if (!ops) return llmq_errorf(LLMQ_ERR_NOMEM, "ops: out of memory");
    ops->be = be;
    if (be == LLMQ_BACKEND_CUDA) {
        enum llmq_status st = llmq_ops_cuda_init(&ops->cuda);
        if (st) {
            free(ops);
            return st;
        }
    }
    *out = ops;
    return LLMQ_OK;
}

void llmq_ops_free(struct llmq_ops *ops) {
    if (!ops) return;
    llmq_ops_cuda_free(ops->cuda);
    free(ops->scores);
    free(ops);
}

enum llmq_backend llmq_ops_backend(const struct llmq_ops *ops) { return ops->be; }

void *llmq_ops_stream(const struct llmq_ops *ops) {
    return ops->be == LLMQ_BACKEND_CUDA ? llmq_ops_cuda_stream(ops->cuda) : NULL;
}

enum llmq_status llmq_ops_sync(struct llmq_ops *ops) {
    return ops->be == LLMQ_BACKEND_CUDA ? llmq_ops_cuda_sync(ops->cuda) : LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------------

enum llmq_status llmq_ops_buf_alloc(struct llmq_ops *ops, int64_t n, struct llmq_ops_buf *out) {
    memset(out, 0, sizeof *out);
    if (n < 1 || (uint64_t)n > SIZE_MAX / sizeof(float))
        return llmq_errorf(LLMQ_ERR_ARG, "ops: buffer of %lld floats", (long long)n);
    void *p = NULL;
    if (ops->be == LLMQ_BACKEND_CUDA) {
        enum llmq_status st = llmq_ops_cuda_alloc((size_t)n * sizeof(float), &p);
        if (st) return st;
    } else if (!(p = malloc((size_t)n * sizeof(float)))) {
        return llmq_errorf(LLMQ_ERR_NOMEM, "ops: out of memory for a buffer of %lld floats", (long long)n);
    }
    *out = (struct llmq_ops_buf){.data = p, .n = n, .be = ops->be, .owned = true};
    return LLMQ_OK;
}

void llmq_ops_buf_free(struct llmq_ops_buf *b) {
    if (!b) return;
    if (b->owned && b->be == LLMQ_BACKEND_CUDA) llmq_ops_cuda_buf_free(b->data);
    if (b->owned && b->be == LLMQ_BACKEND_CPU) free(b->data);
    memset(b, 0, sizeof *b);
}

struct llmq_ops_buf llmq_ops_buf_view(const struct llmq_ops_buf *b, int64_t off, int64_t n) {
    LLMQ_ASSERT(off >= 0 && n >= 0 && off <= b->n && n <= b->n - off);
    return (struct llmq_ops_buf){.data = b->data + off, .n = n, .be = b->be, .owned = false};
}

struct llmq_ops_buf llmq_ops_buf_host(float *data, int64_t n) {
    LLMQ_ASSERT(n >= 0 && (data || n == 0));
    return (struct llmq_ops_buf){.data = data, .n = n, .be = LLMQ_BACKEND_CPU, .owned = false};
}

// The buffer b (named `what` in messages) is on ops' backend and holds at least `need` floats.
static enum llmq_status check_buf(const struct llmq_ops *ops, const char *op, const char *what,
                                  const struct llmq_ops_buf *b, int64_t need) {
    if (!b || !b->data) return llmq_errorf(LLMQ_ERR_ARG, "ops %s: buffer %s is empty", op, what);
    if (b->be != ops->be)
        return llmq_errorf(LLMQ_ERR_ARG, "ops %s: buffer %s is on %s, the context on %s", op, what,
                           llmq_backend_name(b->be), llmq_backend_name(ops->be));
    if (b->n < need)
        return llmq_errorf(LLMQ_ERR_ARG, "ops %s: buffer %s holds %lld floats, the shape needs %lld", op, what,
                           (long long)b->n, (long long)need);
    return LLMQ_OK;
}

// n >= 0 and the byte count of n floats fits.
static bool count_ok(int64_t n) { return n >= 0 && (uint64_t)n <= SIZE_MAX / sizeof(float); }

static enum llmq_status copy_args(struct llmq_ops *ops, const char *op, const void *host, const struct llmq_ops_buf *b,
                                  int64_t off, int64_t n) {
    if (!count_ok(n) || off < 0 || (n > 0 && !host))
        return llmq_errorf(LLMQ_ERR_ARG, "ops %s: offset %lld, %lld floats", op, (long long)off, (long long)n);
    if (off > INT64_MAX - n)
        return llmq_errorf(LLMQ_ERR_ARG, "ops %s: offset %lld + %lld floats overflows", op, (long long)off,
                           (long long)n);
    return n == 0 ? LLMQ_OK : check_buf(ops, op, "(device side)", b, off + n);
}

enum llmq_status llmq_ops_upload(struct llmq_ops *ops, const struct llmq_ops_buf *dst, int64_t off, const float *src,
                                 int64_t n) {
    enum llmq_status st = copy_args(ops, "upload", src, dst, off, n);
    if (st || n == 0) return st;
    if (ops->be == LLMQ_BACKEND_CUDA)
        return llmq_ops_cuda_copy(ops->cuda, dst->data + off, src, (size_t)n * sizeof(float), true);
    memmove(dst->data + off, src, (size_t)n * sizeof(float));
    return LLMQ_OK;
}

enum llmq_status llmq_ops_pin(struct llmq_ops *ops, void *p, size_t bytes, bool *pinned) {
    *pinned = ops->be == LLMQ_BACKEND_CUDA && p && bytes > 0 && llmq_ops_cuda_pin(p, bytes);
    return LLMQ_OK;
}

void llmq_ops_unpin(struct llmq_ops *ops, void *p) {
    if (p && ops->be == LLMQ_BACKEND_CUDA) llmq_ops_cuda_unpin(p);
}

enum llmq_status llmq_ops_download(struct llmq_ops *ops, float *dst, const struct llmq_ops_buf *src, int64_t off,
                                   int64_t n) {
    enum llmq_status st = copy_args(ops, "download", dst, src, off, n);
    if (st) return st;
    if (ops->be == LLMQ_BACKEND_CUDA)
        return n == 0 ? llmq_ops_cuda_sync(ops->cuda)
                      : llmq_ops_cuda_copy(ops->cuda, dst, src->data + off, (size_t)n * sizeof(float), false);
    if (n > 0) memmove(dst, src->data + off, (size_t)n * sizeof(float));
    return LLMQ_OK;
}

// a · b without overflow into *out (both >= 0).
static bool mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0 || (a > 0 && b > INT64_MAX / a)) return false;
    *out = a * b;
    return true;
}

enum llmq_status llmq_ops_download_rows(struct llmq_ops *ops, float *dst, const struct llmq_ops_buf *src, int64_t off,
                                        int64_t width, int64_t stride, int64_t count) {
    int64_t span = 0; // floats from the first row's start to the last row's end
    if (width < 0 || stride < width || count < 0 || (count > 0 && !mul_ok(count - 1, stride, &span)) ||
        span > INT64_MAX - width)
        return llmq_errorf(LLMQ_ERR_ARG, "ops download_rows: %lld rows of %lld floats at a stride of %lld",
                           (long long)count, (long long)width, (long long)stride);
    enum llmq_status st =
        count == 0 || width == 0 ? LLMQ_OK : copy_args(ops, "download_rows", dst, src, off, span + width);
    if (st || count == 0 || width == 0) return st;
    if (ops->be == LLMQ_BACKEND_CUDA)
        return llmq_ops_cuda_download_2d(ops->cuda, dst, src->data + off, width, stride, count);
    for (int64_t i = 0; i < count; i++)
        memmove(dst + i * width, src->data + off + i * stride, (size_t)width * sizeof(float));
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm
// ---------------------------------------------------------------------------------------------

// forward.c rms_worker, row by row.
static void rmsnorm_cpu(const float *x, const float *w, float *y, int64_t n, int64_t D, float eps, bool one_plus_w) {
    for (int64_t t = 0; t < n; t++) {
        const float *xr = x + t * D;
        float *yr = y + t * D;
        double sum = 0.0;
        for (int64_t i = 0; i < D; i++) sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)D);
        const float scale = 1.0f / sqrtf(mean + eps);
        if (one_plus_w)
            for (int64_t i = 0; i < D; i++) yr[i] = (xr[i] * scale) * (1.0f + w[i]);
        else
            for (int64_t i = 0; i < D; i++) yr[i] = (xr[i] * scale) * w[i];
    }
}

enum llmq_status llmq_ops_rmsnorm(struct llmq_ops *ops, const struct llmq_ops_buf *x, const struct llmq_ops_buf *w,
                                  const struct llmq_ops_buf *y, int64_t n, int64_t D, float eps, bool one_plus_w) {
    int64_t nd = 0;
    if (n < 0 || D < 1 || !mul_ok(n, D, &nd) || !(eps >= 0.0f))
        return llmq_errorf(LLMQ_ERR_ARG, "ops rmsnorm: n %lld D %lld eps %g", (long long)n, (long long)D, eps);
    enum llmq_status st;
    if ((st = check_buf(ops, "rmsnorm", "x", x, nd)) || (st = check_buf(ops, "rmsnorm", "w", w, D)) ||
        (st = check_buf(ops, "rmsnorm", "y", y, nd)) || n == 0)
        return st;
    if (ops->be == LLMQ_BACKEND_CUDA)
        return llmq_ops_cuda_rmsnorm(ops->cuda, x->data, w->data, y->data, n, D, eps, one_plus_w);
    rmsnorm_cpu(x->data, w->data, y->data, n, D, eps, one_plus_w);
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------------------

void llmq_ops_rope_table(float base, int64_t head_dim, const float *ff, float div, int64_t n_pos, float *cos,
                         float *sin) {
    const int64_t half = head_dim / 2;
    const float theta_scale = powf(base, -2.0f / (float)head_dim);
    for (int64_t p = 0; p < n_pos; p++) {
        float theta = (float)p;
        for (int64_t i = 0; i < half; i++) {
            float th = theta / ff[i];
            if (div != 1.0f) th /= div;
            cos[p * half + i] = cosf(th);
            sin[p * half + i] = sinf(th);
            theta *= theta_scale;
        }
    }
}

// forward.c rope_rows for every token.
static void rope_cpu(float *x, int64_t T, int64_t seqlen, int64_t n_heads, int64_t Dh, bool neox, const float *cos,
                     const float *sin) {
    const int64_t half = Dh / 2;
    for (int64_t t = 0; t < T; t++) {
        const int64_t pos = t % seqlen;
        const float *cs = cos + pos * half, *sn = sin + pos * half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *xh = x + (t * n_heads + h) * Dh;
            for (int64_t i = 0; i < half; i++) {
                float *a = neox ? &xh[i] : &xh[2 * i];
                float *b = neox ? &xh[i + half] : &xh[2 * i + 1];
                const float x0 = *a, x1 = *b;
                *a = x0 * cs[i] - x1 * sn[i];
                *b = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

enum llmq_status llmq_ops_rope(struct llmq_ops *ops, const struct llmq_ops_buf *x, int64_t n_seq, int64_t seqlen,
                               int64_t n_heads, int64_t head_dim, bool neox, const struct llmq_ops_buf *cos,
                               const struct llmq_ops_buf *sin) {
    int64_t T = 0, row = 0, nx = 0, ntab = 0;
    if (n_seq < 1 || seqlen < 1 || n_heads < 1 || head_dim < 2 || head_dim % 2 || !mul_ok(n_seq, seqlen, &T) ||
        !mul_ok(n_heads, head_dim, &row) || !mul_ok(T, row, &nx) || !mul_ok(seqlen, head_dim / 2, &ntab))
        return llmq_errorf(LLMQ_ERR_ARG, "ops rope: n_seq %lld seqlen %lld heads %lld head_dim %lld (even, >= 2)",
                           (long long)n_seq, (long long)seqlen, (long long)n_heads, (long long)head_dim);
    enum llmq_status st;
    if ((st = check_buf(ops, "rope", "x", x, nx)) || (st = check_buf(ops, "rope", "cos", cos, ntab)) ||
        (st = check_buf(ops, "rope", "sin", sin, ntab)))
        return st;
    if (ops->be == LLMQ_BACKEND_CUDA)
        return llmq_ops_cuda_rope(ops->cuda, x->data, n_seq, seqlen, n_heads, head_dim, neox, cos->data, sin->data);
    rope_cpu(x->data, T, seqlen, n_heads, head_dim, neox, cos->data, sin->data);
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

// forward.c attn_worker's task: rows [t0, t1) of head h of sequence s, t0 = rb · RB. S: (RB, seqlen) scratch.
static void attn_tile(const struct llmq_ops_attn *a, const float *q, const float *k, const float *v, float *o,
                      int64_t s, int64_t h, int64_t rb, float *S) {
    const int64_t RB = LLMQ_OPS_ATTN_RB, seqlen = a->seqlen, Dh = a->head_dim;
    const int64_t Dq = a->n_head * Dh, Dkv = a->n_head_kv * Dh, hk = h / (a->n_head / a->n_head_kv);
    const int64_t t0 = rb * RB, t1 = t0 + RB < seqlen ? t0 + RB : seqlen, nk = t1, m = t1 - t0;
    const float scale = a->scale, cap = a->softcap;
    const float *Q = q + (s * seqlen + t0) * Dq + h * Dh; // (m, Dh), ld Dq
    const float *K = k + s * seqlen * Dkv + hk * Dh;      // (nk, Dh), ld Dkv
    const float *V = v + s * seqlen * Dkv + hk * Dh;      // (nk, Dh), ld Dkv
    float *O = o + (s * seqlen + t0) * Dq + h * Dh;       // (m, Dh), ld Dq
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nk, (int)Dh, 1.0f, Q, (int)Dq, K, (int)Dkv, 0.0f,
                S, (int)nk);
    for (int64_t i = 0; i < m; i++) {
        float *row = S + i * nk;
        const int64_t nv = t0 + i + 1; // keys j0 .. t0 + i are visible
        const int64_t j0 = a->window > 0 && nv > a->window ? nv - a->window : 0;
        float mx = -INFINITY;
        for (int64_t j = j0; j < nv; j++) {
            row[j] *= scale;
            if (cap > 0.0f) row[j] = tanhf(row[j] / cap) * cap;
            if (row[j] > mx) mx = row[j];
        }
        double sum = 0.0;
        for (int64_t j = j0; j < nv; j++) {
            row[j] = expf(row[j] - mx);
            sum += (double)row[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = j0; j < nv; j++) row[j] *= inv;
        for (int64_t j = 0; j < j0; j++) row[j] = 0.0f;
        for (int64_t j = nv; j < nk; j++) row[j] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)Dh, (int)nk, 1.0f, S, (int)nk, V, (int)Dkv,
                0.0f, O, (int)Dq);
}

// Checks a and sets the element counts of q / o (*nq) and k / v (*nkv).
static enum llmq_status check_attn(const struct llmq_ops_attn *a, int64_t *nq, int64_t *nkv) {
    int64_t T = 0, Dq = 0, Dkv = 0;
    const bool ok = a && a->n_seq >= 1 && a->seqlen >= 1 && a->n_head >= 1 && a->n_head_kv >= 1 &&
                    a->n_head % a->n_head_kv == 0 && a->head_dim >= 1 && a->window >= 0 && isfinite(a->scale) &&
                    a->softcap >= 0.0f && isfinite(a->softcap) && mul_ok(a->n_seq, a->seqlen, &T) &&
                    mul_ok(a->n_head, a->head_dim, &Dq) && mul_ok(a->n_head_kv, a->head_dim, &Dkv) &&
                    mul_ok(T, Dq, nq) && mul_ok(T, Dkv, nkv) && a->seqlen <= INT32_MAX && Dq <= INT32_MAX;
    if (!ok)
        return a ? llmq_errorf(LLMQ_ERR_ARG,
                               "ops attention: n_seq %lld seqlen %lld heads %lld / %lld head_dim %lld window %lld "
                               "scale %g softcap %g",
                               (long long)a->n_seq, (long long)a->seqlen, (long long)a->n_head, (long long)a->n_head_kv,
                               (long long)a->head_dim, (long long)a->window, a->scale, a->softcap)
                 : llmq_errorf(LLMQ_ERR_ARG, "ops attention: no parameters");
    return LLMQ_OK;
}

enum llmq_status llmq_ops_attention(struct llmq_ops *ops, const struct llmq_ops_attn *a, const struct llmq_ops_buf *q,
                                    const struct llmq_ops_buf *k, const struct llmq_ops_buf *v,
                                    const struct llmq_ops_buf *o) {
    int64_t nq = 0, nkv = 0;
    enum llmq_status st = check_attn(a, &nq, &nkv);
    if (st || (st = check_buf(ops, "attention", "q", q, nq)) || (st = check_buf(ops, "attention", "k", k, nkv)) ||
        (st = check_buf(ops, "attention", "v", v, nkv)) || (st = check_buf(ops, "attention", "o", o, nq)))
        return st;
    if (ops->be == LLMQ_BACKEND_CUDA) {
        if (a->head_dim > LLMQ_OPS_CUDA_MAX_HEAD)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "ops attention on cuda: head_dim %lld > %d",
                               (long long)a->head_dim, LLMQ_OPS_CUDA_MAX_HEAD);
        return llmq_ops_cuda_attention(ops->cuda, a, q->data, k->data, v->data, o->data);
    }
    const int64_t need = LLMQ_OPS_ATTN_RB * a->seqlen;
    if (ops->n_scores < need) {
        float *p = realloc(ops->scores, (size_t)need * sizeof(float));
        if (!p)
            return llmq_errorf(LLMQ_ERR_NOMEM, "ops attention: out of memory for sequences of %lld tokens",
                               (long long)a->seqlen);
        ops->scores = p;
        ops->n_scores = need;
    }
    const int64_t n_rb = (a->seqlen + LLMQ_OPS_ATTN_RB - 1) / LLMQ_OPS_ATTN_RB;
    for (int64_t s = 0; s < a->n_seq; s++)
        for (int64_t h = 0; h < a->n_head; h++)
            for (int64_t rb = 0; rb < n_rb; rb++)
                attn_tile(a, q->data, k->data, v->data, o->data, s, h, rb, ops->scores);
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// SwiGLU, residual add
// ---------------------------------------------------------------------------------------------

// Checks the buffers of an element-wise op on n floats.
static enum llmq_status check_elementwise(const struct llmq_ops *ops, const char *op, int64_t n,
                                          const struct llmq_ops_buf *a, const struct llmq_ops_buf *b,
                                          const struct llmq_ops_buf *c) {
    if (!count_ok(n)) return llmq_errorf(LLMQ_ERR_ARG, "ops %s: %lld elements", op, (long long)n);
    enum llmq_status st;
    if ((st = check_buf(ops, op, "in", a, n)) || (st = check_buf(ops, op, "in", b, n)) ||
        (c && (st = check_buf(ops, op, "out", c, n))))
        return st;
    return LLMQ_OK;
}

enum llmq_status llmq_ops_swiglu(struct llmq_ops *ops, const struct llmq_ops_buf *gate, const struct llmq_ops_buf *up,
                                 const struct llmq_ops_buf *out, int64_t n) {
    enum llmq_status st = check_elementwise(ops, "swiglu", n, gate, up, out);
    if (st || n == 0) return st;
    if (ops->be == LLMQ_BACKEND_CUDA) return llmq_ops_cuda_swiglu(ops->cuda, gate->data, up->data, out->data, n);
    const float *g = gate->data, *u = up->data;
    float *y = out->data;
    for (int64_t i = 0; i < n; i++) { // forward.c swiglu_worker (SiLU)
        const float x = g[i];
        y[i] = (x / (1.0f + expf(-x))) * u[i];
    }
    return LLMQ_OK;
}

enum llmq_status llmq_ops_add(struct llmq_ops *ops, const struct llmq_ops_buf *x, const struct llmq_ops_buf *y,
                              int64_t n) {
    enum llmq_status st = check_elementwise(ops, "add", n, x, y, NULL);
    if (st || n == 0) return st;
    if (ops->be == LLMQ_BACKEND_CUDA) return llmq_ops_cuda_add(ops->cuda, x->data, y->data, n);
    float *a = x->data;
    const float *b = y->data;
    for (int64_t i = 0; i < n; i++) a[i] += b[i]; // forward.c add_inplace
    return LLMQ_OK;
}

enum llmq_status llmq_ops_dot_f64(struct llmq_ops *ops, const struct llmq_ops_buf *a, const struct llmq_ops_buf *b,
                                  int64_t n, double *acc) {
    enum llmq_status st = check_elementwise(ops, "dot", n, a, b, NULL);
    if (st || n == 0) return st;
    if (ops->be == LLMQ_BACKEND_CUDA) {
        double part[LLMQ_OPS_DOT_BLOCKS];
        if ((st = llmq_ops_cuda_dot(ops->cuda, a->data, b->data, n, part))) return st;
        for (int i = 0; i < LLMQ_OPS_DOT_BLOCKS; i++) *acc += part[i];
        return LLMQ_OK;
    }
    double s = *acc;
    for (int64_t i = 0; i < n; i++) s += (double)a->data[i] * (double)b->data[i];
    *acc = s;
    return LLMQ_OK;
}

enum llmq_status llmq_ops_copy(struct llmq_ops *ops, const struct llmq_ops_buf *dst, const struct llmq_ops_buf *src,
                               int64_t n) {
    enum llmq_status st = check_elementwise(ops, "copy", n, src, src, dst);
    if (st || n == 0) return st;
    if (ops->be == LLMQ_BACKEND_CUDA) return llmq_ops_cuda_copy_d2d(ops->cuda, dst->data, src->data, n);
    memcpy(dst->data, src->data, (size_t)n * sizeof(float));
    return LLMQ_OK;
}

enum llmq_status llmq_ops_sqdiff_f64(struct llmq_ops *ops, const struct llmq_ops_buf *a, const struct llmq_ops_buf *b,
                                     int64_t n, double *acc) {
    enum llmq_status st = check_elementwise(ops, "sqdiff", n, a, b, NULL);
    if (st || n == 0) return st;
    if (ops->be == LLMQ_BACKEND_CUDA) {
        double part[LLMQ_OPS_DOT_BLOCKS];
        if ((st = llmq_ops_cuda_sqdiff(ops->cuda, a->data, b->data, n, part))) return st;
        for (int i = 0; i < LLMQ_OPS_DOT_BLOCKS; i++) *acc += part[i];
        return LLMQ_OK;
    }
    double s = *acc;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a->data[i] - (double)b->data[i];
        s += d * d;
    }
    *acc = s;
    return LLMQ_OK;
}

void llmq_ops_awq_candidate_cpu(const float *W, const float *s, int64_t R, int64_t C, int64_t G, int bits, bool minus_w,
                                float *out) {
    const int maxq = (1 << bits) - 1;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c0 = 0; c0 < C; c0 += G) {
            const float *w = W + r * C + c0;
            float *o = out + r * C + c0;
            float mn = w[0] * s[c0], mx = mn;
            for (int64_t j = 0; j < G; j++) {
                o[j] = w[j] * s[c0 + j];
                if (o[j] < mn) mn = o[j];
                if (o[j] > mx) mx = o[j];
            }
            float scale, zero;
            llmq_awq_grid_params(mn, mx, bits, &scale, &zero);
            for (int64_t j = 0; j < G; j++) {
                const float q = ((float)llmq_gptq_grid_code(o[j], scale, zero, maxq) - zero) * scale;
                o[j] = minus_w ? q / s[c0 + j] - w[j] : q / s[c0 + j];
            }
        }
}

enum llmq_status llmq_ops_awq_candidate(struct llmq_ops *ops, const struct llmq_ops_buf *W,
                                        const struct llmq_ops_buf *s, int64_t R, int64_t C, int64_t G, int bits,
                                        bool minus_w, const struct llmq_ops_buf *out) {
    int64_t n = 0;
    if (R < 1 || C < 1 || G < 1 || C % G || bits < 2 || bits > 8 || !mul_ok(R, C, &n) || !count_ok(n))
        return llmq_errorf(LLMQ_ERR_ARG, "ops awq_candidate: R %lld C %lld G %lld bits %d", (long long)R, (long long)C,
                           (long long)G, bits);
    enum llmq_status st;
    if ((st = check_buf(ops, "awq_candidate", "W", W, n)) || (st = check_buf(ops, "awq_candidate", "s", s, C)) ||
        (st = check_buf(ops, "awq_candidate", "out", out, n)))
        return st;
    if (ops->be == LLMQ_BACKEND_CUDA)
        return llmq_ops_cuda_awq_candidate(ops->cuda, W->data, s->data, R, C, G, bits, minus_w, out->data);
    llmq_ops_awq_candidate_cpu(W->data, s->data, R, C, G, bits, minus_w, out->data);
    return LLMQ_OK;
}

enum llmq_status llmq_ops_repeat_rows(struct llmq_ops *ops, const struct llmq_ops_buf *row,
                                      const struct llmq_ops_buf *y, int64_t n, int64_t C) {
    int64_t nc = 0;
    if (n < 0 || C < 1 || !mul_ok(n, C, &nc) || !count_ok(nc))
        return llmq_errorf(LLMQ_ERR_ARG, "ops repeat_rows: n %lld C %lld", (long long)n, (long long)C);
    enum llmq_status st;
    if ((st = check_buf(ops, "repeat_rows", "row", row, C)) || (st = check_buf(ops, "repeat_rows", "y", y, nc)) ||
        n == 0)
        return st;
    if (ops->be == LLMQ_BACKEND_CUDA) return llmq_ops_cuda_repeat_rows(ops->cuda, row->data, y->data, n, C);
    for (int64_t t = 0; t < n; t++) memcpy(y->data + t * C, row->data, (size_t)C * sizeof(float));
    return LLMQ_OK;
}
