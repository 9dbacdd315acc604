/*
 * kernels/gptq_cuda.cu — GPTQ steps 5-7 on CUDA (see gptq_cuda.h; steps as in quant/gptq.h).
 * Legend: R rows/out, C cols/in, G group size, NG groups per row, B blocksize.
 *
 * Layout: everything stays row-major as on the host. cuSOLVER / cuBLAS are column-major, so as in
 * kernels/gptq.c "row-major lower" is "column-major upper": spotrf(UPPER) = cholesky (L in our lower),
 * spotri(UPPER) = cholesky_inverse (in our lower), mirror lower -> upper, spotrf(LOWER) =
 * cholesky(upper=True) (U in our upper). The lazy update W[:, i2:] -= Err1 · Hinv[i1:i2, i2:] is, in
 * column-major terms, Wᵀ[i2:, :] -= Hinv[i1:i2, i2:]ᵀ · Err1ᵀ: one cublasSgemm(N, N) on the same pointers.
 *
 * Bit-exactness with the C loops: built with -fmad=false (CMakeLists.txt) AND every fp32 operation
 * written as an explicit __f*_rn intrinsic, in the order of kernels/gptq.c (the grid: kernels/gptq_grid.h,
 * shared with the C code); min / max are exact in any order (and the strict comparisons from +0 keep the
 * same zero sign as the C loop).
 */
extern "C" {
#include "kernels/gptq_cuda.h"
}
#include "kernels/cuda_common.h"
#include "kernels/gptq_grid.h"

#include <cublas_v2.h>
#include <cusolverDn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

// cuBLAS / cuSOLVER failures: same tier and message shape as CUDA_CHECK (kernels/cuda_common.h).
#define LIB_CHECK(stmt, ok)                                                                                            \
    do {                                                                                                               \
        int st_ = (int)(stmt);                                                                                         \
        if (st_ != (int)(ok)) {                                                                                        \
            int dev_ = -1;                                                                                             \
            cudaGetDevice(&dev_);                                                                                      \
            fprintf(stderr, "llmq: status %d in `%s` at %s:%d on device %d\n", st_, #stmt, __FILE__, __LINE__, dev_);  \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)
#define CUBLAS_CHECK(stmt) LIB_CHECK(stmt, CUBLAS_STATUS_SUCCESS)
#define CUSOLVER_CHECK(stmt) LIB_CHECK(stmt, CUSOLVER_STATUS_SUCCESS)

#define WARPS_PER_BLOCK 8 // rows per thread block (one warp per row)
#define FULL_MASK 0xffffffffu

enum { LLMQ_GPTQ_BUFS = 12 };

struct llmq_cuda_gptq {
    int64_t R, C, NG, B;
    cudaStream_t stream;
    cublasHandle_t blas;
    cusolverDnHandle_t solver;
    float *W;          // (R, C) processing order
    float *H;          // (C, C) H, then Hinv (upper)
    float *Err1;       // (R, B)
    float *scales;     // (R, NG)
    float *zeros;      // (R, NG)
    uint8_t *q;        // (R, C) codes, original column order
    int32_t *gcol;     // (C)
    int32_t *perm;     // (C)
    double *loss_rows; // (nblocks, R)
    float *work;       // cuSOLVER workspace (lwork floats)
    int lwork;
    int *info; // (1) cuSOLVER devInfo
    int *bad;  // (1) set by finish_hinv when a diagonal of the factor is not > 0 / not finite
    size_t
        cap[LLMQ_GPTQ_BUFS]; // bytes allocated for each buffer of buf_list's order (a reused state keeps its largest)
};

// ---- device math, the C code's operations one by one

// llmq_quant_params_gptq for each row r (one warp per row) over x = W[r * ldw + 0 .. n).
__global__ void params_kernel(const float *W, int64_t ldw, int64_t R, int64_t n, int bits, bool sym, float *scales,
                              float *zeros, int64_t lds) {
    const int64_t r = (int64_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= R) return; // the whole warp leaves together
    const float *x = W + r * ldw;
    float xmin = 0.0f, xmax = 0.0f; // the range always includes 0
    for (int64_t k = lane; k < n; k += 32) {
        float v = x[k];
        if (v < xmin) xmin = v;
        if (v > xmax) xmax = v;
    }
    for (int off = 16; off > 0; off >>= 1) {
        float a = __shfl_xor_sync(FULL_MASK, xmin, off), b = __shfl_xor_sync(FULL_MASK, xmax, off);
        if (a < xmin) xmin = a;
        if (b > xmax) xmax = b;
    }
    if (lane != 0) return;
    llmq_gptq_grid_params(xmin, xmax, bits, sym, &scales[r * lds], &zeros[r * lds]);
}

// The in-block loop (llmq_gptq_block_row), one warp per row. Lane l owns the block columns k ≡ l (mod
// 32): it alone reads and writes W1[k], so no cross-lane memory ordering is needed; w = W1[i] reaches
// the other lanes by shuffle. Every lane computes the same code / q / e (identical operations).
//   W1 (R, ldw) block columns 0..count of each row, in place -> Q1; Err1 (R, count); codes written to
//   codes[r * ldq + qcol[i]]; Hinv1 (count, ldh); scales / zeros (R, NG); gcol (count); rloss (R).
__global__ void block_kernel(float *W1, int64_t ldw, float *Err1, uint8_t *codes, int64_t ldq, const int32_t *qcol,
                             const float *Hinv1, int64_t ldh, const float *scales, const float *zeros, int64_t NG,
                             const int32_t *gcol, int64_t R, int count, int maxq, double *rloss) {
    const int64_t r = (int64_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= R) return;
    float *w1 = W1 + r * ldw;                              // (count)
    float *err1 = Err1 + r * count;                        // (count)
    const float *s = scales + r * NG, *z = zeros + r * NG; // (NG)
    double acc = 0.0;
    for (int i = 0; i < count; i++) {
        const int owner = i & 31;
        const float w = __shfl_sync(FULL_MASK, lane == owner ? w1[i] : 0.0f, owner);
        const int g = gcol[i];
        const float scale = s[g], zero = z[g], d = Hinv1[i * ldh + i];
        const uint8_t code = llmq_gptq_grid_code(w, scale, zero, maxq);
        const float q = __fmul_rn(scale, __fsub_rn((float)code, zero)); // Q1[:, i]
        const float wq = __fsub_rn(w, q);
        const float e = __fdiv_rn(wq, d); // err1
        acc = __dadd_rn(acc, (double)__fdiv_rn(__fmul_rn(wq, wq), __fmul_rn(d, d)));
        const float *hrow = Hinv1 + i * ldh; // Hinv1[i, :]
        for (int k = lane; k < count; k += 32)
            if (k > i) w1[k] = __fsub_rn(w1[k], __fmul_rn(e, hrow[k]));
        if (lane == owner) {
            err1[i] = e;
            w1[i] = q;
            codes[r * ldq + qcol[i]] = code;
        }
    }
    if (lane == 0) rloss[r] = acc;
}

__global__ void add_diag_kernel(float *H, int64_t C, float damp) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < C) H[i * C + i] = __fadd_rn(H[i * C + i], damp);
}

// H[j, i] = H[i, j] for j < i (row-major lower -> upper); one thread per element of the lower part
__global__ void mirror_kernel(float *H, int64_t C) {
    int64_t i = blockIdx.y, j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < C; i += gridDim.y)
        if (j < i) H[j * C + i] = H[i * C + j];
}

// diagonal check (step 4 of the chain) and strict lower = 0
__global__ void finish_hinv_kernel(float *H, int64_t C, int *bad) {
    int64_t i = blockIdx.y, j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < C; i += gridDim.y) {
        if (j < i) H[i * C + j] = 0.0f;
        if (j == i) {
            float d = H[i * C + i];
            if (!(d > 0.0f) || !isfinite(d)) *bad = 1;
        }
    }
}

static unsigned row_blocks(int64_t R) { return (unsigned)((R + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK); }

static dim3 tri_grid(int64_t C) { return dim3((unsigned)((C + 255) / 256), (unsigned)(C < 65535 ? C : 65535)); }

// ---- host side

static enum llmq_status dev_alloc(void **p, size_t bytes, const char *name, const char *what) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaSuccess) return LLMQ_OK;
    cudaGetLastError();
    *p = NULL;
    return llmq_errorf(e == cudaErrorMemoryAllocation ? LLMQ_ERR_NOMEM : LLMQ_ERR_DEVICE,
                       "%s: GPTQ on CUDA: cannot allocate %s (%.1f MiB): %s", name, what, (double)bytes / (1 << 20),
                       cudaGetErrorString(e));
}

// The device buffers in one order, each with the bytes a (R, C, NG, B) solve needs of it.
static void buf_list(struct llmq_cuda_gptq *g, void **p[LLMQ_GPTQ_BUFS], size_t bytes[LLMQ_GPTQ_BUFS],
                     const char *what[LLMQ_GPTQ_BUFS]) {
    const int64_t R = g->R, C = g->C, NG = g->NG, B = g->B, nblocks = (C + B - 1) / B;
    void **const ps[LLMQ_GPTQ_BUFS] = {(void **)&g->W,      (void **)&g->H,     (void **)&g->Err1,
                                       (void **)&g->scales, (void **)&g->zeros, (void **)&g->q,
                                       (void **)&g->gcol,   (void **)&g->perm,  (void **)&g->loss_rows,
                                       (void **)&g->info,   (void **)&g->bad,   (void **)&g->work};
    const size_t bs[LLMQ_GPTQ_BUFS] = {(size_t)(R * C) * sizeof(float),
                                       (size_t)(C * C) * sizeof(float),
                                       (size_t)(R * B) * sizeof(float),
                                       (size_t)(R * NG) * sizeof(float),
                                       (size_t)(R * NG) * sizeof(float),
                                       (size_t)(R * C),
                                       (size_t)C * sizeof(int32_t),
                                       (size_t)C * sizeof(int32_t),
                                       (size_t)(nblocks * R) * sizeof(double),
                                       sizeof(int),
                                       sizeof(int),
                                       (size_t)g->lwork * sizeof(float)};
    static const char *const ws[LLMQ_GPTQ_BUFS] = {"W",     "H",    "Err1",   "scales", "zeros", "codes",
                                                   "g_idx", "perm", "losses", "info",   "flag",  "cuSOLVER workspace"};
    for (int i = 0; i < LLMQ_GPTQ_BUFS; i++) p[i] = ps[i], bytes[i] = bs[i], what[i] = ws[i];
}

// Every buffer at least its size for g's shape: only the ones too small are freed and allocated again.
static enum llmq_status grow_bufs(struct llmq_cuda_gptq *g, const char *name) {
    void **p[LLMQ_GPTQ_BUFS];
    size_t bytes[LLMQ_GPTQ_BUFS];
    const char *what[LLMQ_GPTQ_BUFS];
    buf_list(g, p, bytes, what);
    for (int i = 0; i < LLMQ_GPTQ_BUFS; i++) {
        if (*p[i] && g->cap[i] >= bytes[i]) continue;
        cudaFree(*p[i]);
        *p[i] = NULL, g->cap[i] = 0;
        enum llmq_status st = dev_alloc(p[i], bytes[i], name, what[i]);
        if (st) return st;
        g->cap[i] = bytes[i];
    }
    return LLMQ_OK;
}

static void destroy(struct llmq_cuda_gptq *g) {
    if (g->solver) cusolverDnDestroy(g->solver);
    if (g->blas) cublasDestroy(g->blas);
    if (g->stream) cudaStreamDestroy(g->stream);
    void **p[LLMQ_GPTQ_BUFS];
    size_t bytes[LLMQ_GPTQ_BUFS];
    const char *what[LLMQ_GPTQ_BUFS];
    buf_list(g, p, bytes, what);
    for (int i = 0; i < LLMQ_GPTQ_BUFS; i++) cudaFree(*p[i]);
    free(g);
}

// One spare state kept between solves: a stream, the cuBLAS and cuSOLVER handles (each takes milliseconds to create)
// and a dozen cudaMalloc'd buffers per linear add up over the hundreds of linears of an 8B model. init takes the spare
// when there is one and grows only the buffers that are too small; free hands it back (a second freed state while the
// spare is held is destroyed). llmq_cuda_gptq_release_spare frees it; otherwise it lives until the process ends.
static pthread_mutex_t g_spare_mu = PTHREAD_MUTEX_INITIALIZER;
static struct llmq_cuda_gptq *g_spare;

extern "C" void llmq_cuda_gptq_free(struct llmq_cuda_gptq *g) {
    if (!g) return;
    pthread_mutex_lock(&g_spare_mu);
    const bool keep = !g_spare && cudaStreamSynchronize(g->stream) == cudaSuccess;
    if (keep) g_spare = g;
    pthread_mutex_unlock(&g_spare_mu);
    if (!keep) destroy(g);
}

extern "C" void llmq_cuda_gptq_release_spare(void) {
    pthread_mutex_lock(&g_spare_mu);
    struct llmq_cuda_gptq *g = g_spare;
    g_spare = NULL;
    pthread_mutex_unlock(&g_spare_mu);
    if (g) destroy(g);
}

// The handles of a new state (its buffers come from grow_bufs).
static enum llmq_status create_handles(struct llmq_cuda_gptq *g) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&g->blas));
    CUBLAS_CHECK(cublasSetStream(g->blas, g->stream));
    CUBLAS_CHECK(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH)); // plain FP32, no TF32 tensor ops
    CUSOLVER_CHECK(cusolverDnCreate(&g->solver));
    CUSOLVER_CHECK(cusolverDnSetStream(g->solver, g->stream));
    return LLMQ_OK;
}

extern "C" enum llmq_status llmq_cuda_gptq_init(const char *name, int64_t R, int64_t C, int64_t NG, int64_t B,
                                                struct llmq_cuda_gptq **out) {
    *out = NULL;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        return llmq_errorf(LLMQ_ERR_DEVICE, "%s: GPTQ on CUDA: no CUDA device (%s)", name,
                           e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
    }
    if (C > INT32_MAX / 2 || R > INT32_MAX / 2 || B > INT32_MAX / 2)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: GPTQ on CUDA: shape (%lld, %lld) too large for cuBLAS / cuSOLVER", name,
                           (long long)R, (long long)C);
    CUDA_CHECK(cudaSetDevice(0));
    pthread_mutex_lock(&g_spare_mu);
    struct llmq_cuda_gptq *g = g_spare;
    g_spare = NULL;
    pthread_mutex_unlock(&g_spare_mu);
    enum llmq_status st = LLMQ_OK;
    if (!g) {
        if (!(g = (struct llmq_cuda_gptq *)calloc(1, sizeof *g)))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", name);
        if ((st = create_handles(g))) goto fail;
    }
    g->R = R, g->C = C, g->NG = NG, g->B = B;
    if ((st = grow_bufs(g, name))) goto fail; // H first: the workspace queries below take it
    {
        int n = (int)C, l1 = 0, l2 = 0, l3 = 0;
        CUSOLVER_CHECK(cusolverDnSpotrf_bufferSize(g->solver, CUBLAS_FILL_MODE_UPPER, n, g->H, n, &l1));
        CUSOLVER_CHECK(cusolverDnSpotri_bufferSize(g->solver, CUBLAS_FILL_MODE_UPPER, n, g->H, n, &l2));
        CUSOLVER_CHECK(cusolverDnSpotrf_bufferSize(g->solver, CUBLAS_FILL_MODE_LOWER, n, g->H, n, &l3));
        g->lwork = l1 > l2 ? l1 : l2;
        if (l3 > g->lwork) g->lwork = l3;
    }
    if ((st = grow_bufs(g, name))) goto fail; // the workspace, if this shape needs more
    *out = g;
    return LLMQ_OK;
fail:
    destroy(g);
    return st;
}

static int read_info(struct llmq_cuda_gptq *g) {
    int info = 0;
    CUDA_CHECK(cudaMemcpyAsync(&info, g->info, sizeof info, cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return info;
}

extern "C" int llmq_cuda_gptq_hinv_attempt(struct llmq_cuda_gptq *g, const float *H, float damp) {
    const int64_t C = g->C;
    const int n = (int)C;
    CUDA_CHECK(cudaMemcpyAsync(g->H, H, (size_t)(C * C) * sizeof(float), cudaMemcpyHostToDevice, g->stream));
    add_diag_kernel<<<(unsigned)((C + 255) / 256), 256, 0, g->stream>>>(g->H, C, damp);
    CUDA_CHECK(cudaGetLastError());
    CUSOLVER_CHECK(cusolverDnSpotrf(g->solver, CUBLAS_FILL_MODE_UPPER, n, g->H, n, g->work, g->lwork, g->info));
    if (read_info(g) != 0) return 1;
    CUSOLVER_CHECK(cusolverDnSpotri(g->solver, CUBLAS_FILL_MODE_UPPER, n, g->H, n, g->work, g->lwork, g->info));
    if (read_info(g) != 0) return 2;
    mirror_kernel<<<tri_grid(C), 256, 0, g->stream>>>(g->H, C);
    CUDA_CHECK(cudaGetLastError());
    CUSOLVER_CHECK(cusolverDnSpotrf(g->solver, CUBLAS_FILL_MODE_LOWER, n, g->H, n, g->work, g->lwork, g->info));
    if (read_info(g) != 0) return 3;
    int bad = 0;
    CUDA_CHECK(cudaMemsetAsync(g->bad, 0, sizeof(int), g->stream));
    finish_hinv_kernel<<<tri_grid(C), 256, 0, g->stream>>>(g->H, C, g->bad);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(&bad, g->bad, sizeof bad, cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return bad ? 4 : 0;
}

extern "C" enum llmq_status llmq_cuda_gptq_blocks(struct llmq_cuda_gptq *g, float *W, const int32_t *gcol,
                                                  const int32_t *perm, int64_t G_dyn, int bits, bool sym, float *scales,
                                                  float *zeros, uint8_t *q, double *loss_rows, float *Hinv) {
    const int64_t R = g->R, C = g->C, NG = g->NG, B = g->B, nblocks = (C + B - 1) / B;
    const int maxq = (1 << bits) - 1;
    cudaStream_t s = g->stream;
    CUDA_CHECK(cudaMemcpyAsync(g->W, W, (size_t)(R * C) * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(g->gcol, gcol, (size_t)C * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(g->perm, perm, (size_t)C * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    if (G_dyn <= 0) {
        CUDA_CHECK(cudaMemcpyAsync(g->scales, scales, (size_t)(R * NG) * sizeof(float), cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaMemcpyAsync(g->zeros, zeros, (size_t)(R * NG) * sizeof(float), cudaMemcpyHostToDevice, s));
    }
    const float minus_one = -1.0f, one = 1.0f;
    for (int64_t i1 = 0, blk = 0; i1 < C; i1 += B, blk++) {
        const int64_t i2 = i1 + B < C ? i1 + B : C, count = i2 - i1;
        // dynamic groups starting in this block: grid of W[:, c:c+G] as W is now (gptq.c step 7)
        if (G_dyn > 0)
            for (int64_t c = ((i1 + G_dyn - 1) / G_dyn) * G_dyn; c < i2; c += G_dyn) {
                int64_t n = c + G_dyn <= C ? G_dyn : C - c;
                params_kernel<<<row_blocks(R), 32 * WARPS_PER_BLOCK, 0, s>>>(
                    g->W + c, C, R, n, bits, sym, g->scales + c / G_dyn, g->zeros + c / G_dyn, NG);
                CUDA_CHECK(cudaGetLastError());
            }
        block_kernel<<<row_blocks(R), 32 * WARPS_PER_BLOCK, 0, s>>>(
            g->W + i1, C, g->Err1, g->q, C, g->perm + i1, g->H + i1 * C + i1, C, g->scales, g->zeros, NG, g->gcol + i1,
            R, (int)count, maxq, g->loss_rows + blk * R);
        CUDA_CHECK(cudaGetLastError());
        // W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]  (column-major: Wᵀ[i2:, :] -= Hinv_blkᵀ · Err1ᵀ)
        if (i2 < C)
            CUBLAS_CHECK(cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)(C - i2), (int)R, (int)count, &minus_one,
                                     g->H + i1 * C + i2, (int)C, g->Err1, (int)count, &one, g->W + i2, (int)C));
    }
    CUDA_CHECK(cudaMemcpyAsync(W, g->W, (size_t)(R * C) * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(q, g->q, (size_t)(R * C), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(scales, g->scales, (size_t)(R * NG) * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(zeros, g->zeros, (size_t)(R * NG) * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(
        cudaMemcpyAsync(loss_rows, g->loss_rows, (size_t)(nblocks * R) * sizeof(double), cudaMemcpyDeviceToHost, s));
    if (Hinv) CUDA_CHECK(cudaMemcpyAsync(Hinv, g->H, (size_t)(C * C) * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return LLMQ_OK;
}

// ---- test hooks

static enum llmq_status have_device(const char *what) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return llmq_errorf(LLMQ_ERR_DEVICE, "%s: no CUDA device", what);
    }
    CUDA_CHECK(cudaSetDevice(0));
    return LLMQ_OK;
}

template <typename T> static T *upload(const T *h, size_t n) {
    T *d = NULL;
    CUDA_CHECK(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(T)));
    if (h) CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T> static void download(T *h, T *d, size_t n) {
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d));
}

extern "C" enum llmq_status llmq_cuda_gptq_block_test(const float *W1, int64_t R, int64_t count, const float *Hinv1,
                                                      const float *scales, const float *zeros, int64_t NG,
                                                      const int32_t *gcol, int bits, float *Q1, float *Err1,
                                                      uint8_t *codes, double *rloss) {
    enum llmq_status st = have_device("gptq block test");
    if (st) return st;
    int32_t *qcol = (int32_t *)malloc((size_t)count * sizeof(int32_t));
    if (!qcol) return llmq_errorf(LLMQ_ERR_NOMEM, "gptq block test: out of memory");
    for (int64_t i = 0; i < count; i++) qcol[i] = (int32_t)i;
    float *dW = upload(W1, (size_t)(R * count)), *dE = upload<float>(NULL, (size_t)(R * count));
    float *dH = upload(Hinv1, (size_t)(count * count));
    float *dS = upload(scales, (size_t)(R * NG)), *dZ = upload(zeros, (size_t)(R * NG));
    int32_t *dG = upload(gcol, (size_t)count), *dQc = upload(qcol, (size_t)count);
    uint8_t *dC = upload<uint8_t>(NULL, (size_t)(R * count));
    double *dL = upload<double>(NULL, (size_t)R);
    block_kernel<<<row_blocks(R), 32 * WARPS_PER_BLOCK>>>(dW, count, dE, dC, count, dQc, dH, count, dS, dZ, NG, dG, R,
                                                          (int)count, (1 << bits) - 1, dL);
    CUDA_CHECK(cudaGetLastError());
    download(Q1, dW, (size_t)(R * count));
    download(Err1, dE, (size_t)(R * count));
    download(codes, dC, (size_t)(R * count));
    download(rloss, dL, (size_t)R);
    CUDA_CHECK(cudaFree(dQc));
    CUDA_CHECK(cudaFree(dG));
    CUDA_CHECK(cudaFree(dZ));
    CUDA_CHECK(cudaFree(dS));
    CUDA_CHECK(cudaFree(dH));
    free(qcol);
    return LLMQ_OK;
}

extern "C" enum llmq_status llmq_cuda_gptq_params_test(const float *W, int64_t R, int64_t ldw, int64_t n, int bits,
                                                       bool sym, float *scales, float *zeros) {
    enum llmq_status st = have_device("gptq params test");
    if (st) return st;
    float *dW = upload(W, (size_t)(R * ldw)), *dS = upload<float>(NULL, (size_t)R),
          *dZ = upload<float>(NULL, (size_t)R);
    params_kernel<<<row_blocks(R), 32 * WARPS_PER_BLOCK>>>(dW, ldw, R, n, bits, sym, dS, dZ, 1);
    CUDA_CHECK(cudaGetLastError());
    download(scales, dS, (size_t)R);
    download(zeros, dZ, (size_t)R);
    CUDA_CHECK(cudaFree(dW));
    return LLMQ_OK;
}
