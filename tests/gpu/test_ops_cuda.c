/*
 * tests/gpu/test_ops_cuda.c — kernels/ops.h on CUDA against the CPU reference (label gpu; exits 77 = skipped
 * without CUDA or a device). Seeded inputs, odd sizes, the first mismatches printed, exit 1 on any.
 *
 * Tolerances, per element (FLT_EPSILON = 2^-23 = 2u):
 *   RoPE, add: bit for bit. Both sides do the same IEEE f32 operations in the same order (the device with
 *     __f*_rn intrinsics, never fused; the C code without FP contraction); the tables come from the host.
 *   RMSNorm: |gpu - cpu| <= 5 FLT_EPSILON |cpu| + 1e-37. The sum of squares is exact to D·2^-53 relative in
 *     either double order, so the f32 mean is the same float (then every later operation is the same: the same
 *     bits) or its neighbour, 2u apart. Each later operation is correctly rounded on both sides, so it passes
 *     the relative difference of its inputs on times its condition number and adds at most 2u: mean + eps
 *     (condition <= 1) 4u, sqrt (1/2) 4u, 1 / x 6u, x · scale 8u, · w 10u = 5 FLT_EPSILON. The absolute
 *     term covers subnormal outputs.
 *   SwiGLU: |gpu - cpu| <= 6 FLT_EPSILON |cpu| + 1e-36 |up| + 1e-44. expf is within 2 ulp on CUDA and 1 ulp in
 *     glibc (at most 6u apart); then, as above, 1 + e (condition <= 1) 8u, the division 10u, the product 12u.
 *     Near x = -88.7 one side's exp may overflow to inf (result -0) and the other not (|result| <=
 *     89 / FLT_MAX · |up| < 1e-36 |up|); 1e-44 covers subnormal rounding.
 *   Attention: tests/ops_tolerance.h (the bound of two FP32 attentions summing in different orders), against
 *     the CPU reference; reruns on the device must give the same bits.
 */
#include "harness.h"
#include "ops_tolerance.h"

#include "common/log.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

#include <cblas.h>
#include <float.h>
#include <math.h>

static uint64_t rng = 0x13198A2E03707344ull;
static struct llmq_ops *cpu, *gpu;
static int failures;

static float *host(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    CHECK(p);
    return p;
}

static struct llmq_ops_buf dev_from(const float *src, int64_t n) { // a device buffer holding src (n)
    struct llmq_ops_buf b;
    CHECK_OK(llmq_ops_buf_alloc(gpu, n, &b));
    CHECK_OK(llmq_ops_upload(gpu, &b, 0, src, n));
    return b;
}

static float *download(const struct llmq_ops_buf *b, int64_t n) { // caller frees
    float *p = host(n);
    CHECK_OK(llmq_ops_download(gpu, p, b, 0, n));
    return p;
}

// Counts elements of gpu (n) outside rel |cpu| + abs_up |up_i| + abs of cpu; rel = abs = 0: bit for bit.
static void compare(const char *label, const float *g, const float *c, int64_t n, double rel, const float *up,
                    double abs_up, double abs) {
    int64_t bad = 0, same = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const bool eq = memcmp(&g[i], &c[i], sizeof(float)) == 0;
        same += eq;
        const double e = fabs((double)g[i] - (double)c[i]);
        const double tol = rel * fabs((double)c[i]) + (up ? abs_up * fabs((double)up[i]) : 0.0) + abs;
        const bool ok = rel == 0.0 && abs == 0.0 ? eq : e <= tol;
        if (tol > 0.0 && e / tol > worst) worst = e / tol;
        if (!ok && bad++ < 5)
            fprintf(stderr, "%s: element %lld: gpu %.9g cpu %.9g (|diff| %.3g, tol %.3g)\n", label, (long long)i, g[i],
                    c[i], e, tol);
    }
    printf("%-60s %s: %lld of %lld bit-identical, max |diff| / tol %.3g\n", label, bad ? "FAIL" : "ok", (long long)same,
           (long long)n, worst);
    if (bad) failures++;
}

static void test_rmsnorm(int64_t n, int64_t D, bool one_plus_w, bool in_place) {
    float *x = host(n * D), *w = host(D), *y = host(n * D);
    for (int64_t i = 0; i < n * D; i++) x[i] = 4.0f * test_frand(&rng);
    for (int64_t i = 0; i < D; i++) w[i] = 1.0f + 0.3f * test_frand(&rng);
    struct llmq_ops_buf xc = llmq_ops_buf_host(x, n * D), wc = llmq_ops_buf_host(w, D),
                        yc = llmq_ops_buf_host(y, n * D);
    struct llmq_ops_buf xg = dev_from(x, n * D), wg = dev_from(w, D), yg = dev_from(y, n * D);
    CHECK_OK(llmq_ops_rmsnorm(cpu, &xc, &wc, &yc, n, D, 1e-6f, one_plus_w));
    CHECK_OK(llmq_ops_rmsnorm(gpu, &xg, &wg, in_place ? &xg : &yg, n, D, 1e-6f, one_plus_w));
    float *g = download(in_place ? &xg : &yg, n * D);
    char label[128];
    snprintf(label, sizeof label, "rmsnorm n %lld D %lld%s%s", (long long)n, (long long)D, one_plus_w ? " 1+w" : "",
             in_place ? " in place" : "");
    compare(label, g, y, n * D, 5.0 * FLT_EPSILON, NULL, 0.0, 1e-37);
    free(x), free(w), free(y), free(g);
    llmq_ops_buf_free(&xg), llmq_ops_buf_free(&wg), llmq_ops_buf_free(&yg);
}

static void test_rope(int64_t n_seq, int64_t S, int64_t heads, int64_t Dh, bool neox, float base) {
    const int64_t n = n_seq * S * heads * Dh, half = Dh / 2;
    float *x = host(n), *ff = host(half), *cs = host(S * half), *sn = host(S * half);
    for (int64_t i = 0; i < n; i++) x[i] = 3.0f * test_frand(&rng);
    for (int64_t i = 0; i < half; i++) ff[i] = i % 3 == 0 ? 1.0f : 1.0f + 3.5f * (1.0f + test_frand(&rng)); // [1, 8)
    llmq_ops_rope_table(base, Dh, ff, 1.0f, S, cs, sn);
    struct llmq_ops_buf xg = dev_from(x, n), cg = dev_from(cs, S * half), sg = dev_from(sn, S * half);
    struct llmq_ops_buf xc = llmq_ops_buf_host(x, n), cc = llmq_ops_buf_host(cs, S * half);
    struct llmq_ops_buf sc = llmq_ops_buf_host(sn, S * half);
    CHECK_OK(llmq_ops_rope(cpu, &xc, n_seq, S, heads, Dh, neox, &cc, &sc));
    CHECK_OK(llmq_ops_rope(gpu, &xg, n_seq, S, heads, Dh, neox, &cg, &sg));
    float *g = download(&xg, n);
    char label[128];
    snprintf(label, sizeof label, "rope %s %lldx%lld heads %lld Dh %lld base %g", neox ? "neox" : "norm",
             (long long)n_seq, (long long)S, (long long)heads, (long long)Dh, base);
    compare(label, g, x, n, 0.0, NULL, 0.0, 0.0);
    free(x), free(ff), free(cs), free(sn), free(g);
    llmq_ops_buf_free(&xg), llmq_ops_buf_free(&cg), llmq_ops_buf_free(&sg);
}

static void test_attention(struct llmq_ops_attn a) {
    const int64_t T = a.n_seq * a.seqlen, Dq = a.n_head * a.head_dim, Dkv = a.n_head_kv * a.head_dim;
    float *q = host(T * Dq), *k = host(T * Dkv), *v = host(T * Dkv), *o = host(T * Dq);
    double *ex = malloc((size_t)(T * Dq) * sizeof(double)), *bd = malloc((size_t)(T * Dq) * sizeof(double));
    CHECK(ex && bd);
    for (int64_t i = 0; i < T * Dq; i++) q[i] = 2.0f * test_frand(&rng);
    for (int64_t i = 0; i < T * Dkv; i++) k[i] = 2.0f * test_frand(&rng), v[i] = test_frand(&rng);
    struct llmq_ops_buf qc = llmq_ops_buf_host(q, T * Dq), kc = llmq_ops_buf_host(k, T * Dkv);
    struct llmq_ops_buf vc = llmq_ops_buf_host(v, T * Dkv), oc = llmq_ops_buf_host(o, T * Dq);
    struct llmq_ops_buf qg = dev_from(q, T * Dq), kg = dev_from(k, T * Dkv), vg = dev_from(v, T * Dkv);
    struct llmq_ops_buf og = dev_from(o, T * Dq);
    CHECK_OK(llmq_ops_attention(cpu, &a, &qc, &kc, &vc, &oc));
    CHECK_OK(llmq_ops_attention(gpu, &a, &qg, &kg, &vg, &og));
    float *g = download(&og, T * Dq);
    CHECK_OK(llmq_ops_attention(gpu, &a, &qg, &kg, &vg, &og));
    float *g2 = download(&og, T * Dq);
    CHECK(ops_attn_exact(&a, q, k, v, ex, bd) == 0);
    for (int64_t i = 0; i < T * Dq; i++) ex[i] = o[i]; // the oracle is the CPU reference; the bound stays
    char label[160];
    snprintf(label, sizeof label, "attention %lldx%lld H %lld/%lld Dh %lld window %lld cap %g", (long long)a.n_seq,
             (long long)a.seqlen, (long long)a.n_head, (long long)a.n_head_kv, (long long)a.head_dim,
             (long long)a.window, a.softcap);
    double worst = 0.0;
    const int64_t bad = ops_count_outside(label, g, ex, bd, T * Dq, &worst);
    const bool rerun_same = memcmp(g, g2, (size_t)(T * Dq) * sizeof(float)) == 0;
    printf("%-60s %s: max |gpu - cpu| / bound %.3g, %lld outside, rerun %s\n", label,
           bad || !rerun_same ? "FAIL" : "ok", worst, (long long)bad, rerun_same ? "bit-identical" : "DIFFERS");
    if (bad || !rerun_same) failures++;
    free(q), free(k), free(v), free(o), free(g), free(g2), free(ex), free(bd);
    llmq_ops_buf_free(&qg), llmq_ops_buf_free(&kg), llmq_ops_buf_free(&vg), llmq_ops_buf_free(&og);
}

static void test_swiglu_add(int64_t n) {
    float *gt = host(n), *up = host(n), *y = host(n), *x = host(n);
    static const float extreme[] = {0.0f, -0.0f, 88.5f, -88.5f, -88.8f, -89.0f, 100.0f, -100.0f, 1e-30f, -1e-30f};
    for (int64_t i = 0; i < n; i++) {
        gt[i] = i < 10 && n >= 10 ? extreme[i] : 20.0f * test_frand(&rng);
        up[i] = 4.0f * test_frand(&rng);
        x[i] = 8.0f * test_frand(&rng);
    }
    struct llmq_ops_buf gc = llmq_ops_buf_host(gt, n), uc = llmq_ops_buf_host(up, n), yc = llmq_ops_buf_host(y, n);
    struct llmq_ops_buf gg = dev_from(gt, n), ug = dev_from(up, n), xg = dev_from(x, n);
    CHECK_OK(llmq_ops_swiglu(cpu, &gc, &uc, &yc, n));
    CHECK_OK(llmq_ops_swiglu(gpu, &gg, &ug, &gg, n)); // out = gate, in place
    float *g = download(&gg, n);
    char label[128];
    snprintf(label, sizeof label, "swiglu n %lld", (long long)n);
    compare(label, g, y, n, 6.0 * FLT_EPSILON, up, 1e-36, 1e-44);
    free(g);
    // the add: x += up on both sides, then x += x (y may be x)
    struct llmq_ops_buf xc = llmq_ops_buf_host(x, n);
    CHECK_OK(llmq_ops_add(cpu, &xc, &uc, n));
    CHECK_OK(llmq_ops_add(cpu, &xc, &xc, n));
    CHECK_OK(llmq_ops_add(gpu, &xg, &ug, n));
    CHECK_OK(llmq_ops_add(gpu, &xg, &xg, n));
    g = download(&xg, n);
    snprintf(label, sizeof label, "add n %lld", (long long)n);
    compare(label, g, x, n, 0.0, NULL, 0.0, 0.0);
    free(gt), free(up), free(y), free(x), free(g);
    llmq_ops_buf_free(&gg), llmq_ops_buf_free(&ug), llmq_ops_buf_free(&xg);
}

// The dot (kernels/ops.h llmq_ops_dot_f64) of n floats: the device's fixed-tree partial sums against the CPU's running
// sum, |gpu - cpu| <= 2 n 2^-53 Σ|a_i b_i| + 1e-300 (two f64 summations of the same exact products in different
// orders, each within n 2^-53 Σ|a_i b_i|); the device twice: the same bits.
static void test_dot(int64_t n) {
    float *a = host(n), *b = host(n);
    double mag = 0;
    for (int64_t i = 0; i < n; i++) {
        a[i] = 4.0f * test_frand(&rng);
        b[i] = 4.0f * test_frand(&rng);
        mag += fabs((double)a[i] * (double)b[i]);
    }
    struct llmq_ops_buf ac = llmq_ops_buf_host(a, n), bc = llmq_ops_buf_host(b, n);
    struct llmq_ops_buf ag = dev_from(a, n), bg = dev_from(b, n);
    double c = 1.0, g = 1.0, g2 = 1.0;
    CHECK_OK(llmq_ops_dot_f64(cpu, &ac, &bc, n, &c));
    CHECK_OK(llmq_ops_dot_f64(gpu, &ag, &bg, n, &g));
    CHECK_OK(llmq_ops_dot_f64(gpu, &ag, &bg, n, &g2));
    const double tol = 2.0 * (double)n * 0x1p-53 * (mag + 1.0) + 1e-300;
    const bool ok = fabs(g - c) <= tol && memcmp(&g, &g2, sizeof g) == 0;
    printf("%-60s %s: |gpu - cpu| %.3g (bound %.3g), rerun %s\n", "dot", ok ? "ok" : "FAIL", fabs(g - c), tol,
           memcmp(&g, &g2, sizeof g) == 0 ? "bit-identical" : "DIFFERS");
    if (!ok) failures++;
    free(a), free(b);
    llmq_ops_buf_free(&ag), llmq_ops_buf_free(&bg);
}

// The squared difference (llmq_ops_sqdiff_f64) as the dot: |gpu - cpu| <= 2 n 2^-53 Σ (a_i - b_i)² + 1e-300 (the same
// exact squares of exact f64 differences summed in two orders), the device twice the same bits; the copy exact.
static void test_sqdiff_copy(int64_t n) {
    float *a = host(n), *b = host(n), *back = host(n);
    double mag = 0;
    for (int64_t i = 0; i < n; i++) {
        a[i] = 4.0f * test_frand(&rng);
        b[i] = a[i] + 0.01f * test_frand(&rng);
        mag += ((double)a[i] - (double)b[i]) * ((double)a[i] - (double)b[i]);
    }
    struct llmq_ops_buf ac = llmq_ops_buf_host(a, n), bc = llmq_ops_buf_host(b, n);
    struct llmq_ops_buf ag = dev_from(a, n), bg = dev_from(b, n);
    double c = 0.0, g = 0.0, g2 = 0.0;
    CHECK_OK(llmq_ops_sqdiff_f64(cpu, &ac, &bc, n, &c));
    CHECK_OK(llmq_ops_sqdiff_f64(gpu, &ag, &bg, n, &g));
    CHECK_OK(llmq_ops_sqdiff_f64(gpu, &ag, &bg, n, &g2));
    CHECK_OK(llmq_ops_copy(gpu, &bg, &ag, n));
    CHECK_OK(llmq_ops_download(gpu, back, &bg, 0, n));
    const double tol = 2.0 * (double)n * 0x1p-53 * mag + 1e-300;
    const bool copy_ok = memcmp(back, a, (size_t)n * sizeof(float)) == 0;
    const bool ok = fabs(g - c) <= tol && memcmp(&g, &g2, sizeof g) == 0 && copy_ok;
    char label[64];
    snprintf(label, sizeof label, "sqdiff, copy n %lld", (long long)n);
    printf("%-60s %s: |gpu - cpu| %.3g (bound %.3g), rerun %s, copy %s\n", label, ok ? "ok" : "FAIL", fabs(g - c), tol,
           memcmp(&g, &g2, sizeof g) == 0 ? "bit-identical" : "DIFFERS", copy_ok ? "exact" : "DIFFERS");
    if (!ok) failures++;
    free(a), free(b), free(back);
    llmq_ops_buf_free(&ag), llmq_ops_buf_free(&bg);
}

// AWQ's scale candidate (llmq_ops_awq_candidate): the device's against the CPU's, bit for bit (every step an IEEE f32
// operation on both), with and without minus_w, a constant group among the rows.
static void test_awq_candidate(int64_t R, int64_t C, int64_t G, int bits) {
    float *W = host(R * C), *s = host(C), *c = host(R * C), *g = host(R * C);
    for (int64_t i = 0; i < R * C; i++) W[i] = 0.05f * test_frand(&rng);
    for (int64_t j = 0; j < G; j++) W[j] = 0.01f; // row 0's first group: constant (range below 1e-5)
    for (int64_t j = 0; j < C; j++) s[j] = 0.2f + 4.0f * fabsf(test_frand(&rng));
    struct llmq_ops_buf wc = llmq_ops_buf_host(W, R * C), sc = llmq_ops_buf_host(s, C),
                        oc = llmq_ops_buf_host(c, R * C);
    struct llmq_ops_buf wg = dev_from(W, R * C), sg = dev_from(s, C), og = dev_from(W, R * C);
    int64_t bad = 0;
    for (int minus = 0; minus < 2; minus++) {
        CHECK_OK(llmq_ops_awq_candidate(cpu, &wc, &sc, R, C, G, bits, minus, &oc));
        CHECK_OK(llmq_ops_awq_candidate(gpu, &wg, &sg, R, C, G, bits, minus, &og));
        free(g);
        g = download(&og, R * C);
        for (int64_t i = 0; i < R * C; i++) bad += memcmp(&g[i], &c[i], sizeof(float)) != 0;
    }
    char label[80];
    snprintf(label, sizeof label, "awq_candidate %lld x %lld G %lld bits %d", (long long)R, (long long)C, (long long)G,
             bits);
    printf("%-60s %s: %lld of %lld values differ from the CPU's (want 0)\n", label, bad ? "FAIL" : "ok", (long long)bad,
           (long long)(2 * R * C));
    if (bad) failures++;
    free(W), free(s), free(c), free(g);
    llmq_ops_buf_free(&wg), llmq_ops_buf_free(&sg), llmq_ops_buf_free(&og);
}

// Buffers on the device: offsets, views, the wrong backend, an unsupported head_dim.
static void test_buffers(void) {
    struct llmq_ops_buf b;
    CHECK_OK(llmq_ops_buf_alloc(gpu, 4097, &b));
    CHECK(b.be == LLMQ_BACKEND_CUDA && b.owned);
    float *src = host(4097), *dst = host(4097);
    for (int i = 0; i < 4097; i++) src[i] = (float)i;
    CHECK_OK(llmq_ops_upload(gpu, &b, 0, src, 4097));
    CHECK_OK(llmq_ops_upload(gpu, &b, 100, src, 7)); // b[100..107) = 0..6
    struct llmq_ops_buf view = llmq_ops_buf_view(&b, 99, 10);
    CHECK_OK(llmq_ops_download(gpu, dst, &view, 0, 10));
    CHECK(dst[0] == 99.0f && dst[1] == 0.0f && dst[7] == 6.0f && dst[8] == 107.0f);
    CHECK_OK(llmq_ops_sync(gpu));
    // strided rows (cudaMemcpy2D): 5 rows of 96 every 700 floats from 300, equal to the CPU's row loop
    struct llmq_ops_buf hsrc = llmq_ops_buf_host(src, 4097);
    float *want = host(5 * 96);
    CHECK_OK(llmq_ops_download_rows(cpu, want, &hsrc, 300, 96, 700, 5));
    CHECK_OK(llmq_ops_upload(gpu, &b, 0, src, 4097));
    CHECK_OK(llmq_ops_download_rows(gpu, dst, &b, 300, 96, 700, 5));
    CHECK(memcmp(dst, want, 5 * 96 * sizeof(float)) == 0 && dst[96] == 1000.0f);
    free(want);
    llmq_log_set_level(LLMQ_LOG_SILENT);
    struct llmq_ops_buf hb = llmq_ops_buf_host(src, 4097);
    CHECK(llmq_ops_add(gpu, &b, &hb, 10) == LLMQ_ERR_ARG); // a host buffer given to the device
    const struct llmq_ops_attn big = {1, 4, 1, 1, 300, 1.0f, 0.0f, 0};
    CHECK(llmq_ops_attention(gpu, &big, &b, &b, &b, &b) == LLMQ_ERR_UNSUPPORTED);
    llmq_log_set_level(LLMQ_LOG_INFO);
    llmq_ops_buf_free(&b);
    free(src), free(dst);
    printf("%-60s ok\n", "device buffers: offsets, views, strided rows, wrong backend, head_dim 300");
}

int main(void) {
    test_need_cuda();
    openblas_set_num_threads(1);
    CHECK_OK(llmq_ops_init(LLMQ_BACKEND_CPU, &cpu));
    CHECK_OK(llmq_ops_init(LLMQ_BACKEND_CUDA, &gpu));
    test_buffers();
    const int64_t norm_shapes[][2] = {{1, 1}, {7, 7}, {33, 64}, {3, 4097}, {2048, 128}, {5, 8192}};
    for (size_t i = 0; i < sizeof norm_shapes / sizeof norm_shapes[0]; i++) {
        test_rmsnorm(norm_shapes[i][0], norm_shapes[i][1], false, false);
        test_rmsnorm(norm_shapes[i][0], norm_shapes[i][1], true, i % 2 == 1);
    }
    test_rope(1, 1, 1, 2, false, 10000.0f);
    test_rope(2, 37, 3, 8, true, 10000.0f);
    test_rope(1, 300, 32, 64, false, 500000.0f);
    test_rope(3, 65, 4, 128, true, 1000000.0f);
    test_rope(1, 33, 2, 256, false, 10000.0f);
    const struct llmq_ops_attn cases[] = {
        {1, 1, 1, 1, 8, 0.35355339f, 0.0f, 0},      {2, 37, 8, 4, 8, 0.35355339f, 0.0f, 0},
        {1, 300, 4, 1, 64, 0.125f, 0.0f, 0},        {1, 129, 2, 2, 128, 0.08838835f, 0.0f, 17},
        {1, 200, 2, 1, 128, 0.08838835f, 5.0f, 0},  {1, 70, 2, 1, 256, 0.0625f, 50.0f, 33},
        {3, 65, 6, 3, 80, 0.1118034f, 0.0f, 1},     {2, 100, 3, 1, 96, 0.10206207f, 0.0f, 0},
        {1, 2048, 2, 1, 128, 0.08838835f, 0.0f, 0}, {1, 1000, 2, 2, 64, 0.125f, 0.0f, 256},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention(cases[i]);
    test_swiglu_add(1);
    test_swiglu_add(7);
    test_swiglu_add(4097);
    test_swiglu_add(1 << 20);
    test_dot(1);
    test_dot(4097);
    test_dot(3 << 20);
    test_sqdiff_copy(1);
    test_sqdiff_copy(3 << 20);
    test_awq_candidate(3, 64, 64, 4);
    test_awq_candidate(257, 512, 128, 4);
    test_awq_candidate(4096, 1024, 128, 3);
    test_awq_candidate(64, 96, 32, 8);
    llmq_ops_free(gpu);
    llmq_ops_free(cpu);
    if (failures) fprintf(stderr, "%d checks failed\n", failures);
    return failures ? 1 : 0;
}
