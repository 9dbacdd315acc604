// kernels/ops_cuda.cu — the device half of kernels/ops.h: RMSNorm, RoPE, causal GQA attention, SwiGLU and the
// residual add as own FP32 kernels on one stream per context (device 0). CUDA failures become an
// LLMQ_ERR_DEVICE status naming the call, the error and file:line (as kernels/gemm_cuda.cu: the caller cleans
// up and exits non-zero; no abort).
//
// Rounding: RoPE, the add and the element-wise parts of RMSNorm / SwiGLU are written with explicit
// round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...), which nvcc never contracts into an FMA, so they
// repeat the C reference's operations one by one (kernels/ops.c, built without FP contraction). The attention
// kernel uses FMAs (its tolerance is derived for any summation order).
//
// NOT YET RUN ON A GPU: compiled and linked only (see kernels/ops.h).
extern "C" {
#include "kernels/ops.h"

#include "kernels/gptq_grid.h"
}

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define DEVICE 0
#define THREADS 256 // threads per block of the row and element-wise kernels
#define FULL_MASK 0xffffffffu
#define ATT_BC 32                              // attention: keys per tile, one per lane
#define ATT_WARPS 8                            // attention: query rows per block, one warp per row
#define ATT_REGS (LLMQ_OPS_CUDA_MAX_HEAD / 32) // output values per lane (d = lane + 32 r)
#define MAX_GRID_YZ 65535                      // CUDA's limit on gridDim.y / gridDim.z
#define ROW_CHUNK (1 << 30)                    // rows per RMSNorm launch (gridDim.x < 2^31)

struct llmq_ops_cuda {
    cudaStream_t stream;
    double *dot; // (LLMQ_OPS_DOT_BLOCKS) llmq_ops_cuda_dot's partial sums, allocated once with the context
};

static enum llmq_status cuda_check(cudaError_t e, const char *stmt, const char *file, int line) {
    if (e == cudaSuccess) return LLMQ_OK;
    return llmq_errorf(e == cudaErrorMemoryAllocation ? LLMQ_ERR_NOMEM : LLMQ_ERR_DEVICE,
                       "cuda:%d: %s failed: %s (%s) at %s:%d", DEVICE, stmt, cudaGetErrorName(e), cudaGetErrorString(e),
                       file, line);
}
#define CU(stmt) cuda_check((stmt), #stmt, __FILE__, __LINE__)

// Blocks for a grid-stride loop over n items.
static unsigned blocks_for(int64_t n) {
    const int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < (1 << 20) ? b : (1 << 20));
}

// Bytes of dynamic shared memory of the attention kernel for head_dim Dh: K tile (BC, Dh + 1), V tile (BC, Dh),
// the block's query rows (WARPS, Dh).
static size_t attn_smem(int64_t Dh) {
    return (size_t)(ATT_BC * (Dh + 1) + ATT_BC * Dh + ATT_WARPS * Dh) * sizeof(float);
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

// The sum of v over the block (THREADS threads), returned to every thread; red: (THREADS / 32) doubles.
__device__ static double block_sum(double v, double *red) {
    for (int off = 16; off > 0; off >>= 1) v = __dadd_rn(v, __shfl_xor_sync(FULL_MASK, v, off));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < THREADS / 32 ? red[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) v = __dadd_rn(v, __shfl_xor_sync(FULL_MASK, v, off));
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    return red[0];
}

// Block b's partial sum of a_i · b_i (f64) over i = b·THREADS + t + k·DOT_BLOCKS·THREADS: a fixed stride per thread and
// a fixed tree per block (block_sum), so the same inputs give the same partials.
__global__ void dot_kernel(const float *a, const float *b, int64_t n, double *partial) {
    __shared__ double red[THREADS / 32];
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)LLMQ_OPS_DOT_BLOCKS * THREADS)
        s = __dadd_rn(s, __dmul_rn((double)a[i], (double)b[i]));
    s = block_sum(s, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block per row r of x (rows, D): kernels/ops.c rmsnorm_cpu with the double sum reduced as a tree.
__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t D, float eps, bool one_plus_w) {
    __shared__ double red[THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * D;
    float *yr = y + (int64_t)blockIdx.x * D;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < D; i += THREADS) sum = __dadd_rn(sum, (double)__fmul_rn(xr[i], xr[i]));
    sum = block_sum(sum, red); // every read of xr is done before any write of yr (y may be x)
    const float mean = __double2float_rn(__ddiv_rn(sum, (double)D));
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    for (int64_t i = threadIdx.x; i < D; i += THREADS) {
        const float f = one_plus_w ? __fadd_rn(1.0f, w[i]) : w[i];
        yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), f);
    }
}

// One thread per rotated pair (token t, head h, pair i) of x (T, n_heads, Dh).
__global__ void rope_kernel(float *x, int64_t n_pairs, int64_t seqlen, int64_t n_heads, int64_t Dh, bool neox,
                            const float *cos, const float *sin) {
    const int64_t half = Dh / 2;
    for (int64_t idx = (int64_t)blockIdx.x * THREADS + threadIdx.x; idx < n_pairs;
         idx += (int64_t)gridDim.x * THREADS) {
        const int64_t i = idx % half, th = idx / half, pos = (th / n_heads) % seqlen;
        float *xh = x + th * Dh;
        float *a = neox ? &xh[i] : &xh[2 * i];
        float *b = neox ? &xh[i + half] : &xh[2 * i + 1];
        const float c = cos[pos * half + i], s = sin[pos * half + i], x0 = *a, x1 = *b;
        *a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        *b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}

__global__ void swiglu_kernel(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS) {
        const float x = g[i];
        out[i] = __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, expf(-x))), u[i]);
    }
}

__global__ void add_kernel(float *x, const float *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS)
        x[i] = __fadd_rn(x[i], y[i]);
}

// Block b's partial sum of (a_i - b_i)² (f64) over dot_kernel's indices, in its order.
__global__ void sqdiff_kernel(const float *a, const float *b, int64_t n, double *partial) {
    __shared__ double red[THREADS / 32];
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)LLMQ_OPS_DOT_BLOCKS * THREADS) {
        const double d = __dsub_rn((double)a[i], (double)b[i]);
        s = __dadd_rn(s, __dmul_rn(d, d));
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One thread per (row, group of G columns) of W (R, C): kernels/ops.c llmq_ops_awq_candidate_cpu's operations.
__global__ void awq_candidate_kernel(const float *W, const float *s, int64_t n_groups, int64_t C, int64_t G, int bits,
                                     bool minus_w, float *out) {
    const int maxq = (1 << bits) - 1;
    for (int64_t idx = (int64_t)blockIdx.x * THREADS + threadIdx.x; idx < n_groups;
         idx += (int64_t)gridDim.x * THREADS) {
        const int64_t r = idx / (C / G), c0 = (idx % (C / G)) * G;
        const float *w = W + r * C + c0;
        float *o = out + r * C + c0;
        float mn = __fmul_rn(w[0], s[c0]), mx = mn;
        for (int64_t j = 0; j < G; j++) {
            const float v = __fmul_rn(w[j], s[c0 + j]);
            o[j] = v;
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        float scale, zero;
        llmq_awq_grid_params(mn, mx, bits, &scale, &zero);
        for (int64_t j = 0; j < G; j++) {
            const float q = __fmul_rn(__fsub_rn((float)llmq_gptq_grid_code(o[j], scale, zero, maxq), zero), scale);
            const float v = __fdiv_rn(q, s[c0 + j]);
            o[j] = minus_w ? __fsub_rn(v, w[j]) : v;
        }
    }
}

__global__ void repeat_rows_kernel(const float *row, float *y, int64_t n, int64_t C) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n * C; i += (int64_t)gridDim.x * THREADS)
        y[i] = row[i % C];
}

// The first key query position t sees.
__device__ static int64_t key_lo(int64_t t, int64_t window) {
    return window > 0 && t + 1 > window ? t + 1 - window : 0;
}

// Flash-style causal GQA attention (online softmax, FP32): block (x, h, z) computes query rows
// [8x, 8x + 8) of head h of sequence s0 + z, one warp per row, walking the keys the block can see in tiles of 32
// (one key per lane for the scores; for p · v the lane owns output values d = lane + 32 r). Per tile and row:
// m' = max(m, max_j s_j), alpha = exp(m - m'), p_j = exp(s_j - m'), l = l · alpha + Σ p_j,
// acc = acc · alpha + Σ p_j v_j; at the end o = acc / l. Nothing of size (T, T) exists anywhere.
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attn_kernel(const float *q, const float *k, const float *v, float *o, int64_t seqlen, int n_head, int n_head_kv,
                int Dh, float scale, float softcap, int64_t window, int64_t s0) {
    extern __shared__ float smem[];
    float *Ks = smem;                   // (BC, Dh + 1): the pad makes lane j's row reads conflict-free
    float *Vs = Ks + ATT_BC * (Dh + 1); // (BC, Dh)
    float *Qs = Vs + ATT_BC * Dh;       // (WARPS, Dh)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y, hk = h / (n_head / n_head_kv);
    const int64_t s = s0 + blockIdx.z, r0 = (int64_t)blockIdx.x * ATT_WARPS, t = r0 + warp;
    const int64_t Dq = (int64_t)n_head * Dh, Dkv = (int64_t)n_head_kv * Dh;
    const bool row_ok = t < seqlen;
    for (int d = lane; d < Dh; d += 32) Qs[warp * Dh + d] = row_ok ? q[(s * seqlen + t) * Dq + h * Dh + d] : 0.0f;
    const int64_t lo = row_ok ? key_lo(t, window) : 0;
    const int64_t k_begin = key_lo(r0, window), k_end = r0 + ATT_WARPS < seqlen ? r0 + ATT_WARPS : seqlen;
    const float *kbase = k + s * seqlen * Dkv + hk * Dh, *vbase = v + s * seqlen * Dkv + hk * Dh;
    float m = -INFINITY, l = 0.0f, acc[ATT_REGS];
#pragma unroll
    for (int r = 0; r < ATT_REGS; r++) acc[r] = 0.0f;
    for (int64_t kb = k_begin; kb < k_end; kb += ATT_BC) { // the same trip count for every thread of the block
        __syncthreads();                                   // the previous tile is consumed (and Qs is written)
        for (int idx = threadIdx.x; idx < ATT_BC * Dh; idx += ATT_WARPS * 32) {
            const int j = idx / Dh, d = idx - j * Dh;
            const bool in = kb + j < k_end;
            Ks[j * (Dh + 1) + d] = in ? kbase[(kb + j) * Dkv + d] : 0.0f;
            Vs[j * Dh + d] = in ? vbase[(kb + j) * Dkv + d] : 0.0f;
        }
        __syncthreads();
        if (!row_ok) continue; // warp-uniform from here on: the whole warp has the same row
        const int64_t key = kb + lane;
        float sc = -INFINITY;
        if (key >= lo && key <= t) {
            const float *kr = Ks + lane * (Dh + 1), *qr = Qs + warp * Dh;
            float dot = 0.0f;
            for (int d = 0; d < Dh; d++) dot = fmaf(qr[d], kr[d], dot);
            sc = dot * scale;
            if (softcap > 0.0f) sc = tanhf(sc / softcap) * softcap;
        }
        float tmax = sc;
        for (int off = 16; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, off));
        if (tmax == -INFINITY) continue; // no key of this tile is visible to this row
        const float m_new = fmaxf(m, tmax), alpha = expf(m - m_new);
        const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
        float psum = p;
        for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(FULL_MASK, psum, off);
        l = l * alpha + psum;
#pragma unroll
        for (int r = 0; r < ATT_REGS; r++) acc[r] *= alpha;
        for (int jj = 0; jj < ATT_BC; jj++) {
            const float pj = __shfl_sync(FULL_MASK, p, jj);
            if (pj == 0.0f) continue; // the same value on every lane
#pragma unroll
            for (int r = 0; r < ATT_REGS; r++) {
                const int d = lane + 32 * r;
                if (d < Dh) acc[r] = fmaf(pj, Vs[jj * Dh + d], acc[r]);
            }
        }
        m = m_new;
    }
    if (!row_ok) return;
    float *orow = o + (s * seqlen + t) * Dq + h * Dh;
#pragma unroll
    for (int r = 0; r < ATT_REGS; r++) {
        const int d = lane + 32 * r;
        if (d < Dh) orow[d] = acc[r] / l;
    }
}

// ---------------------------------------------------------------------------------------------
// Context, buffers, copies
// ---------------------------------------------------------------------------------------------

extern "C" enum llmq_status llmq_ops_cuda_init(struct llmq_ops_cuda **out) {
    *out = NULL;
    const char *why = NULL;
    if (llmq_cuda_device_count(&why) == 0)
        return llmq_errorf(LLMQ_ERR_DEVICE, "ops on cuda: no CUDA device: %s", why ? why : "?");
    struct llmq_ops_cuda *c = (struct llmq_ops_cuda *)calloc(1, sizeof *c);
    if (!c) return llmq_errorf(LLMQ_ERR_NOMEM, "ops on cuda: out of memory");
    enum llmq_status st = CU(cudaSetDevice(DEVICE));
    if (!st) st = CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (st) {
        free(c);
        return st;
    }
    st = CU(cudaMalloc((void **)&c->dot, LLMQ_OPS_DOT_BLOCKS * sizeof(double)));
    if (st) {
        cudaStreamDestroy(c->stream);
        free(c);
        return st;
    }
    // Above 48 KiB of dynamic shared memory a kernel must opt in (Dh 256: 72 KiB).
    st = CU(cudaFuncSetAttribute(attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)attn_smem(LLMQ_OPS_CUDA_MAX_HEAD)));
    if (st) {
        cudaFree(c->dot);
        cudaStreamDestroy(c->stream);
        free(c);
        return st;
    }
    *out = c;
    return LLMQ_OK;
}

extern "C" void llmq_ops_cuda_free(struct llmq_ops_cuda *c) {
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    cudaFree(c->dot);
    cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" enum llmq_status llmq_ops_cuda_alloc(size_t bytes, void **out) {
    *out = NULL;
    enum llmq_status st = CU(cudaMalloc(out, bytes));
    if (st) *out = NULL;
    return st;
}

extern "C" void llmq_ops_cuda_buf_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" enum llmq_status llmq_ops_cuda_copy(struct llmq_ops_cuda *c, void *dst, const void *src, size_t bytes,
                                               bool to_device) {
    enum llmq_status st =
        CU(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, c->stream));
    if (!st && !to_device) st = CU(cudaStreamSynchronize(c->stream));
    return st;
}

extern "C" enum llmq_status llmq_ops_cuda_download_2d(struct llmq_ops_cuda *c, float *dst, const float *src,
                                                      int64_t width, int64_t stride, int64_t count) {
    const size_t w = (size_t)width * sizeof(float);
    enum llmq_status st = CU(cudaMemcpy2DAsync(dst, w, src, (size_t)stride * sizeof(float), w, (size_t)count,
                                               cudaMemcpyDeviceToHost, c->stream));
    return st ? st : CU(cudaStreamSynchronize(c->stream));
}

extern "C" bool llmq_ops_cuda_pin(void *p, size_t bytes) {
    if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return true;
    (void)cudaGetLastError(); // a refused range is not a sticky error: the copies stay pageable
    return false;
}

extern "C" void llmq_ops_cuda_unpin(void *p) {
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" enum llmq_status llmq_ops_cuda_sync(struct llmq_ops_cuda *c) { return CU(cudaStreamSynchronize(c->stream)); }

// ---------------------------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------------------------

extern "C" enum llmq_status llmq_ops_cuda_rmsnorm(struct llmq_ops_cuda *c, const float *x, const float *w, float *y,
                                                  int64_t n, int64_t D, float eps, bool one_plus_w) {
    for (int64_t r0 = 0; r0 < n; r0 += ROW_CHUNK) {
        const int64_t rows = n - r0 < ROW_CHUNK ? n - r0 : ROW_CHUNK;
        rmsnorm_kernel<<<(unsigned)rows, THREADS, 0, c->stream>>>(x + r0 * D, w, y + r0 * D, D, eps, one_plus_w);
        enum llmq_status st = CU(cudaGetLastError());
        if (st) return st;
    }
    return LLMQ_OK;
}

extern "C" enum llmq_status llmq_ops_cuda_rope(struct llmq_ops_cuda *c, float *x, int64_t n_seq, int64_t seqlen,
                                               int64_t n_heads, int64_t head_dim, bool neox, const float *cos,
                                               const float *sin) {
    const int64_t n_pairs = n_seq * seqlen * n_heads * (head_dim / 2);
    rope_kernel<<<blocks_for(n_pairs), THREADS, 0, c->stream>>>(x, n_pairs, seqlen, n_heads, head_dim, neox, cos, sin);
    return CU(cudaGetLastError());
}

extern "C" enum llmq_status llmq_ops_cuda_attention(struct llmq_ops_cuda *c, const struct llmq_ops_attn *a,
                                                    const float *q, const float *k, const float *v, float *o) {
    if (a->n_head > MAX_GRID_YZ)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "ops attention on cuda: %lld heads > %d", (long long)a->n_head,
                           MAX_GRID_YZ);
    const int64_t rblocks = (a->seqlen + ATT_WARPS - 1) / ATT_WARPS; // seqlen <= INT32_MAX (checked by ops.c)
    for (int64_t s0 = 0; s0 < a->n_seq; s0 += MAX_GRID_YZ) {
        const int64_t ns = a->n_seq - s0 < MAX_GRID_YZ ? a->n_seq - s0 : MAX_GRID_YZ;
        const dim3 grid((unsigned)rblocks, (unsigned)a->n_head, (unsigned)ns);
        attn_kernel<<<grid, ATT_WARPS * 32, attn_smem(a->head_dim), c->stream>>>(q, k, v, o, a->seqlen, (int)a->n_head,
                                                                                 (int)a->n_head_kv, (int)a->head_dim,
                                                                                 a->scale, a->softcap, a->window, s0);
        enum llmq_status st = CU(cudaGetLastError());
        if (st) return st;
    }
    return LLMQ_OK;
}

extern "C" enum llmq_status llmq_ops_cuda_swiglu(struct llmq_ops_cuda *c, const float *gate, const float *up,
                                                 float *out, int64_t n) {
    swiglu_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(gate, up, out, n);
    return CU(cudaGetLastError());
}

extern "C" enum llmq_status llmq_ops_cuda_add(struct llmq_ops_cuda *c, float *x, const float *y, int64_t n) {
    add_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(x, y, n);
    return CU(cudaGetLastError());
}

extern "C" enum llmq_status llmq_ops_cuda_dot(struct llmq_ops_cuda *c, const float *a, const float *b, int64_t n,
                                              double partial[LLMQ_OPS_DOT_BLOCKS]) {
    dot_kernel<<<LLMQ_OPS_DOT_BLOCKS, THREADS, 0, c->stream>>>(a, b, n, c->dot);
    enum llmq_status st = CU(cudaGetLastError());
    if (!st)
        st = CU(
            cudaMemcpyAsync(partial, c->dot, LLMQ_OPS_DOT_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    return st ? st : CU(cudaStreamSynchronize(c->stream));
}

extern "C" enum llmq_status llmq_ops_cuda_repeat_rows(struct llmq_ops_cuda *c, const float *row, float *y, int64_t n,
                                                      int64_t C) {
    repeat_rows_kernel<<<blocks_for(n * C), THREADS, 0, c->stream>>>(row, y, n, C);
    return CU(cudaGetLastError());
}

extern "C" void *llmq_ops_cuda_stream(struct llmq_ops_cuda *c) { return (void *)c->stream; }

extern "C" enum llmq_status llmq_ops_cuda_copy_d2d(struct llmq_ops_cuda *c, float *dst, const float *src, int64_t n) {
    return CU(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
}

extern "C" enum llmq_status llmq_ops_cuda_sqdiff(struct llmq_ops_cuda *c, const float *a, const float *b, int64_t n,
                                                 double partial[LLMQ_OPS_DOT_BLOCKS]) {
    sqdiff_kernel<<<LLMQ_OPS_DOT_BLOCKS, THREADS, 0, c->stream>>>(a, b, n, c->dot);
    enum llmq_status st = CU(cudaGetLastError());
    if (!st)
        st = CU(
            cudaMemcpyAsync(partial, c->dot, LLMQ_OPS_DOT_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    return st ? st : CU(cudaStreamSynchronize(c->stream));
}

extern "C" enum llmq_status llmq_ops_cuda_awq_candidate(struct llmq_ops_cuda *c, const float *W, const float *s,
                                                        int64_t R, int64_t C, int64_t G, int bits, bool minus_w,
                                                        float *out) {
    const int64_t n_groups = R * (C / G);
    awq_candidate_kernel<<<blocks_for(n_groups), THREADS, 0, c->stream>>>(W, s, n_groups, C, G, bits, minus_w, out);
    return CU(cudaGetLastError());
}
