// tests/gpu/test_gptq_cuda.c — GPTQ on CUDA (kernels/gptq_cuda.h) against the CPU code (kernels/gptq.c, quant/gptq.c),
// label gpu; exits 77 (skipped) when llmq was built without CUDA or no device is present.
//
//   1. the group-params kernel and the in-block kernel are BIT-EXACT against llmq_quant_params_gptq /
//      llmq_gptq_block_row on the same host inputs (random, and dyadic inputs that hit .5 ties of rint);
//   2. the whole solve, CPU vs CUDA, on a correlated H: codes agree on >= 99%, |loss ratio - 1| < 1e-2,
//      dequantized W within 5% relative (Frobenius), Hinv within 1e-4 relative (fp32 vs fp64 is ~1e-6 on these H).
//      These are not bit-exact and cannot be: cuSOLVER's potrf/potri and cuBLAS's sgemm sum in another order than
//      OpenBLAS, so Hinv and the lazy updates differ in the last fp32 bits; a weight that sits at a rounding boundary
//      of the grid then flips one code, and the flip propagates along the rest of its row (rows are
//      independent). Everything that does not depend on that rounding (g_idx, the per-row and static
//      grids, W_out == dequant(out)) is checked exactly, and a CUDA rerun must be bit-identical;
//   3. the damping retry (indefinite H) warns and ends at the same percdamp on both; NaN in H is
//      rejected before anything runs on the device.
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "harness.h"
#include "kernels/backend.h"
#include "kernels/gptq.h"
#include "kernels/gptq_cuda.h"
#include "quant/gptq.h"
#include "quant/quantizer.h"

static uint64_t rng_state = 0x853c49e6748fea9bull;
static float frand(void) { return test_frand(&rng_state); } // uniform [-1, 1)
static int irand(int n) { return (int)((frand() + 1.0f) * 0.5f * (float)n) % n; }

// ---- 1. bit-exact hooks

static void test_params_hook(void) {
    const int64_t R = 41, ldw = 300;
    float *W = malloc((size_t)(R * ldw) * sizeof *W);
    float s_gpu[41], z_gpu[41];
    CHECK(W);
    for (int64_t i = 0; i < R * ldw; i++) W[i] = frand() * (i % 7 == 0 ? 3.0f : 0.1f);
    for (int64_t c = 0; c < ldw; c++) W[0 * ldw + c] = 0.0f;                  // all zero -> [-1, 1]
    for (int64_t c = 0; c < ldw; c++) W[1 * ldw + c] = fabsf(W[1 * ldw + c]); // xmin == 0 (sym quirk)
    for (int64_t c = 0; c < ldw; c++) W[2 * ldw + c] = -fabsf(W[2 * ldw + c]);
    for (int64_t c = 0; c < ldw; c++) W[3 * ldw + c] = c % 2 ? -0.0f : 0.0f; // signed zeros
    for (int64_t c = 0; c < ldw; c++) W[4 * ldw + c] = c % 3 ? -0.0f : 0.25f;
    const int64_t ns[] = {1, 7, 32, 33, 128, 300};
    const int bits_list[] = {2, 3, 4, 8};
    for (int ni = 0; ni < 6; ni++)
        for (int bi = 0; bi < 4; bi++)
            for (int sym = 0; sym < 2; sym++) {
                CHECK_EQ_INT(llmq_cuda_gptq_params_test(W, R, ldw, ns[ni], bits_list[bi], sym, s_gpu, z_gpu), LLMQ_OK);
                for (int64_t r = 0; r < R; r++) {
                    float s, z;
                    llmq_quant_params_gptq(W + r * ldw, ns[ni], 1, bits_list[bi], sym, &s, &z);
                    if (memcmp(&s, &s_gpu[r], 4) || memcmp(&z, &z_gpu[r], 4)) {
                        fprintf(stderr, "params n %lld bits %d sym %d row %lld: cpu (%a, %a) gpu (%a, %a)\n",
                                (long long)ns[ni], bits_list[bi], sym, (long long)r, s, z, s_gpu[r], z_gpu[r]);
                        CHECK(0);
                    }
                }
            }
    free(W);
}

// One block-kernel case: R rows of `count` columns, groups of G (-1: one per row), `dyadic` = powers of
// two everywhere so that products are exact and w / scale lands on .5 often (rint ties to even).
static void block_case(int64_t R, int64_t count, int G, int bits, bool sym, bool dyadic) {
    const int64_t NG = G > 0 ? (count + G - 1) / G : 1;
    float *W1 = malloc((size_t)(R * count) * sizeof(float)), *Hinv1 = malloc((size_t)(count * count) * sizeof(float));
    float *S = malloc((size_t)(R * NG) * sizeof(float)), *Z = malloc((size_t)(R * NG) * sizeof(float));
    float *Qg = malloc((size_t)(R * count) * sizeof(float)), *Eg = malloc((size_t)(R * count) * sizeof(float));
    float *Qc = malloc((size_t)(R * count) * sizeof(float)), *Ec = malloc((size_t)count * sizeof(float));
    uint8_t *codes_g = malloc((size_t)(R * count)), *codes_c = malloc((size_t)count);
    int32_t *gcol = malloc((size_t)count * sizeof(int32_t));
    double *loss_g = malloc((size_t)R * sizeof(double));
    CHECK(W1 && Hinv1 && S && Z && Qg && Eg && Qc && Ec && codes_g && codes_c && gcol && loss_g);
    const int maxq = (1 << bits) - 1;
    for (int64_t i = 0; i < count; i++) gcol[i] = G > 0 ? (int32_t)(i / G) : 0;
    for (int64_t i = 0; i < count; i++)
        for (int64_t k = 0; k < count; k++)
            Hinv1[i * count + k] = dyadic ? (float)(irand(9) - 4) / 64.0f : 0.05f * frand(); // bounded growth
    for (int64_t i = 0; i < count; i++)
        Hinv1[i * count + i] = dyadic ? (irand(2) ? 1.0f : 2.0f) : 0.5f + 0.5f * (frand() + 1.0f);
    for (int64_t r = 0; r < R; r++)
        for (int64_t g = 0; g < NG; g++) {
            if (dyadic) { // scale 2^-e, zero an integer (or the symmetric one)
                S[r * NG + g] = ldexpf(1.0f, -(irand(4) + 2));
                Z[r * NG + g] = sym ? (float)((maxq + 1) / 2) : (float)irand(maxq + 1);
            } else {
                float x[3] = {frand(), frand(), frand()};
                llmq_quant_params_gptq(x, 3, 1, bits, sym, &S[r * NG + g], &Z[r * NG + g]);
            }
        }
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < count; i++) {
            const float s = S[r * NG + gcol[i]];
            W1[r * count + i] = dyadic ? s * (0.5f * (float)(irand(4 * maxq + 8) - 2 * maxq - 4)) : frand();
        }
    CHECK_EQ_INT(llmq_cuda_gptq_block_test(W1, R, count, Hinv1, S, Z, NG, gcol, bits, Qg, Eg, codes_g, loss_g),
                 LLMQ_OK);
    memcpy(Qc, W1, (size_t)(R * count) * sizeof(float));
    for (int64_t r = 0; r < R; r++) {
        double lc =
            llmq_gptq_block_row(Qc + r * count, Ec, codes_c, Hinv1, count, count, S + r * NG, Z + r * NG, gcol, maxq);
        for (int64_t i = 0; i < count; i++) {
            const int64_t x = r * count + i;
            if (memcmp(&Qc[x], &Qg[x], 4) || memcmp(&Ec[i], &Eg[x], 4) || codes_c[i] != codes_g[x]) {
                fprintf(stderr,
                        "block R %lld count %lld G %d bits %d sym %d dyadic %d: row %lld col %lld: "
                        "cpu (q %a, e %a, code %d) gpu (q %a, e %a, code %d)\n",
                        (long long)R, (long long)count, G, bits, sym, dyadic, (long long)r, (long long)i, Qc[x], Ec[i],
                        codes_c[i], Qg[x], Eg[x], codes_g[x]);
                CHECK(0);
            }
        }
        if (memcmp(&lc, &loss_g[r], sizeof lc)) {
            fprintf(stderr, "block row %lld loss cpu %a gpu %a\n", (long long)r, lc, loss_g[r]);
            CHECK(0);
        }
    }
    free(loss_g);
    free(gcol);
    free(codes_c);
    free(codes_g);
    free(Ec);
    free(Qc);
    free(Eg);
    free(Qg);
    free(Z);
    free(S);
    free(Hinv1);
    free(W1);
}

static void test_block_hook(void) {
    const int64_t counts[] = {1, 7, 33, 128};
    const int groups[] = {-1, 32, 128}, bits_list[] = {2, 3, 4, 8};
    for (int ci = 0; ci < 4; ci++)
        for (int gi = 0; gi < 3; gi++)
            for (int bi = 0; bi < 4; bi++)
                for (int sym = 0; sym < 2; sym++)
                    for (int dy = 0; dy < 2; dy++) block_case(45, counts[ci], groups[gi], bits_list[bi], sym, dy);
}

// ---- 2. whole solve, CPU vs CUDA

// H = 2/k · (B·S)ᵀ(B·S) + ridge·S² (bench/gptq_speed.c's Hessian) with B (k, C) random, S = diag(s),
// s in [0.2, 3]; W (R, C) random. dead >= 0: that column / row of H is zero (a dead input).
static void make_problem(int64_t R, int64_t C, int64_t k, float ridge, int64_t dead, float *W, float *H) {
    float *B = malloc((size_t)(k * C) * sizeof *B), *s = malloc((size_t)C * sizeof *s);
    CHECK(B && s);
    for (int64_t c = 0; c < C; c++) s[c] = 1.6f + 1.4f * frand();
    for (int64_t i = 0; i < k * C; i++) B[i] = (frand() + frand() + frand()) * s[i % C];
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j <= i; j++) {
            double acc = 0;
            for (int64_t n = 0; n < k; n++) acc += (double)B[n * C + i] * B[n * C + j];
            H[i * C + j] = H[j * C + i] = (float)(2.0 * acc / (double)k);
        }
    for (int64_t c = 0; c < C; c++) H[c * C + c] += ridge * s[c] * s[c];
    if (dead >= 0)
        for (int64_t c = 0; c < C; c++) H[dead * C + c] = H[c * C + dead] = 0.0f;
    for (int64_t i = 0; i < R * C; i++) W[i] = 0.02f * (frand() + frand() + frand());
    free(s);
    free(B);
}

struct solved {
    struct llmq_qlinear ql;
    float *Q, *Hinv; // (R, C), (C, C)
    double loss;
    float percdamp;
};

static void solve(const float *W, const float *H, int64_t R, int64_t C, struct llmq_gptq_opts o, enum llmq_backend be,
                  struct solved *out) {
    out->Q = malloc((size_t)(R * C) * sizeof(float));
    out->Hinv = malloc((size_t)(C * C) * sizeof(float));
    CHECK(out->Q && out->Hinv);
    memcpy(out->Q, W, (size_t)(R * C) * sizeof(float));
    memcpy(out->Hinv, H, (size_t)(C * C) * sizeof(float));
    o.backend = be;
    CHECK_EQ_INT(llmq_gptq_quantize("t", out->Q, out->Hinv, R, C, &o, &out->ql, &out->loss, &out->percdamp), LLMQ_OK);
}

static void solved_free(struct solved *s) {
    llmq_qlinear_free(&s->ql);
    free(s->Hinv);
    free(s->Q);
}

static void test_solve(int64_t R, int64_t C, struct llmq_gptq_opts o) {
    float *W = malloc((size_t)(R * C) * sizeof *W), *H = malloc((size_t)(C * C) * sizeof *H);
    float *D = malloc((size_t)(R * C) * sizeof *D);
    CHECK(W && H && D);
    make_problem(R, C, 64, 0.05f, C / 3, W, H);
    const int G = o.q.group_size;
    struct solved cpu, gpu, gpu2;
    solve(W, H, R, C, o, LLMQ_BACKEND_CPU, &cpu);
    solve(W, H, R, C, o, LLMQ_BACKEND_CUDA, &gpu);
    solve(W, H, R, C, o, LLMQ_BACKEND_CUDA, &gpu2);

    int64_t same = 0;
    for (int64_t i = 0; i < R * C; i++) same += cpu.ql.q[i] == gpu.ql.q[i];
    double dq = 0, nq = 0, dh = 0, nh = 0;
    for (int64_t i = 0; i < R * C; i++) {
        dq += ((double)cpu.Q[i] - gpu.Q[i]) * ((double)cpu.Q[i] - gpu.Q[i]);
        nq += (double)cpu.Q[i] * cpu.Q[i];
    }
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) {
            float hc = cpu.Hinv[i * C + j], hg = gpu.Hinv[i * C + j];
            if (j < i) CHECK(hg == 0.0f); // strict lower zero (the contract on H)
            dh += ((double)hc - hg) * ((double)hc - hg);
            nh += (double)hc * hc;
        }
    const double agree = (double)same / (double)(R * C), rel_q = sqrt(dq / nq), rel_h = sqrt(dh / nh);
    printf("solve (%lld, %lld) bits %d G %d sym %d act %d static %d B %d: codes equal %.5f, loss cpu %.6g cuda "
           "%.6g, |dQ|/|Q| %.2e, |dHinv|/|Hinv| %.2e\n",
           (long long)R, (long long)C, o.q.bits, G, o.q.sym, o.act_order, o.static_groups, o.blocksize, agree, cpu.loss,
           gpu.loss, rel_q, rel_h);
    CHECK(agree >= 0.99);
    CHECK(fabs(gpu.loss / cpu.loss - 1.0) < 1e-2);
    CHECK(rel_q < 0.05);
    CHECK(rel_h < 1e-4);
    CHECK(gpu.percdamp == cpu.percdamp);
    // exact parts: g_idx, grids that do not depend on the solve, W out == dequant(out)
    CHECK(memcmp(cpu.ql.g_idx, gpu.ql.g_idx, (size_t)C * sizeof(int32_t)) == 0);
    if (G <= 0 || o.static_groups) {
        CHECK(memcmp(cpu.ql.scales, gpu.ql.scales, (size_t)(R * cpu.ql.n_groups) * sizeof(float)) == 0);
        CHECK(memcmp(cpu.ql.zeros, gpu.ql.zeros, (size_t)(R * cpu.ql.n_groups) * sizeof(float)) == 0);
    }
    llmq_qlinear_dequant(&gpu.ql, D);
    CHECK(memcmp(D, gpu.Q, (size_t)(R * C) * sizeof(float)) == 0);
    // rerun on the device: bit-identical
    CHECK(memcmp(gpu.Q, gpu2.Q, (size_t)(R * C) * sizeof(float)) == 0);
    CHECK(memcmp(gpu.ql.q, gpu2.ql.q, (size_t)(R * C)) == 0);
    CHECK(memcmp(gpu.Hinv, gpu2.Hinv, (size_t)(C * C) * sizeof(float)) == 0);
    CHECK(gpu.loss == gpu2.loss);
    solved_free(&gpu2);
    solved_free(&gpu);
    solved_free(&cpu);
    free(D);
    free(H);
    free(W);
}

// The spare state (kernels/gptq_cuda.h): a small solve on the buffers a larger one left gives the bits of the same
// solve on a fresh state.
static void test_spare(void) {
    const int64_t R = 48, C = 333, RB = 64, CB = 512;
    float *W = malloc((size_t)(R * C) * sizeof *W), *H = malloc((size_t)(C * C) * sizeof *H);
    float *WB = malloc((size_t)(RB * CB) * sizeof *WB), *HB = malloc((size_t)(CB * CB) * sizeof *HB);
    CHECK(W && H && WB && HB);
    make_problem(R, C, 64, 0.05f, -1, W, H);
    make_problem(RB, CB, 64, 0.05f, -1, WB, HB);
    struct llmq_gptq_opts o = llmq_gptq_opts_default();
    o.act_order = true;
    struct solved big, reused, fresh;
    llmq_gptq_release_device();
    solve(WB, HB, RB, CB, o, LLMQ_BACKEND_CUDA, &big); // leaves its state as the spare
    solve(W, H, R, C, o, LLMQ_BACKEND_CUDA, &reused);
    llmq_gptq_release_device();
    solve(W, H, R, C, o, LLMQ_BACKEND_CUDA, &fresh);
    CHECK(memcmp(reused.Q, fresh.Q, (size_t)(R * C) * sizeof(float)) == 0);
    CHECK(memcmp(reused.ql.q, fresh.ql.q, (size_t)(R * C)) == 0);
    CHECK(memcmp(reused.Hinv, fresh.Hinv, (size_t)(C * C) * sizeof(float)) == 0);
    CHECK(reused.loss == fresh.loss);
    llmq_gptq_release_device();
    llmq_gptq_release_device(); // no spare: a no-op
    printf("%-60s ok\n", "spare state: a (48, 333) solve after a (64, 512) one = fresh");
    solved_free(&fresh), solved_free(&reused), solved_free(&big);
    free(W), free(H), free(WB), free(HB);
}

// ---- 3. damping retry and bad input

// Runs f with stderr redirected to a file; returns what was written (static buffer).
static const char *capture_stderr(void (*f)(void *), void *arg) {
    static char buf[8192];
    char path[] = "/tmp/llmq_test_gptq_cuda_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    CHECK(saved >= 0 && dup2(fd, 2) >= 0);
    f(arg);
    fflush(stderr);
    CHECK(dup2(saved, 2) >= 0);
    close(saved);
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return buf;
}

struct retry_case {
    const float *W, *H;
    int64_t R, C;
    struct llmq_gptq_opts o;
    enum llmq_backend be;
    float percdamp;
};

static void run_retry(void *arg) {
    struct retry_case *c = arg;
    struct solved s;
    solve(c->W, c->H, c->R, c->C, c->o, c->be, &s);
    c->percdamp = s.percdamp;
    solved_free(&s);
}

static void test_retry_and_nan(void) {
    const int64_t R = 6, C = 40;
    float W[6 * 40], H[40 * 40];
    make_problem(R, C, 10, 0.0f, -1, W, H); // rank 10 < C: singular
    float mean = 0;
    for (int i = 0; i < C; i++) mean += H[i * C + i] / C;
    for (int i = 0; i < C; i++) H[i * C + i] -= 0.004f * mean; // indefinite until percdamp > 0.004
    struct retry_case cpu = {W, H, R, C, llmq_gptq_opts_default(), LLMQ_BACKEND_CPU, 0};
    cpu.o.q.group_size = -1;
    cpu.o.percdamp = 0.001f;
    struct retry_case gpu = cpu;
    gpu.be = LLMQ_BACKEND_CUDA;
    llmq_log_set_level(LLMQ_LOG_INFO);
    const char *log = capture_stderr(run_retry, &cpu);
    CHECK_CONTAINS(log, "retrying with percdamp");
    log = capture_stderr(run_retry, &gpu);
    CHECK_CONTAINS(log, "retrying with percdamp");
    printf("retry: percdamp cpu %.4f cuda %.4f\n", (double)cpu.percdamp, (double)gpu.percdamp);
    CHECK(cpu.percdamp > 0.004f && cpu.percdamp < 0.01f); // 0.001 -> 0.0035 -> 0.006
    CHECK(gpu.percdamp == cpu.percdamp);

    // NaN / Inf in H: rejected (naming the layer and "Hessian") before the device is touched
    llmq_log_set_level(LLMQ_LOG_SILENT);
    float W1[6 * 40], H1[40 * 40];
    memcpy(W1, W, sizeof W1);
    memcpy(H1, H, sizeof H1);
    H1[3 * C + 7] = NAN;
    struct llmq_gptq_opts o = gpu.o;
    o.backend = LLMQ_BACKEND_CUDA;
    struct llmq_qlinear ql;
    CHECK_EQ_INT(llmq_gptq_quantize("blk.4.ffn_up", W1, H1, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "blk.4.ffn_up");
    CHECK_CONTAINS(llmq_last_error(), "Hessian");
    CHECK(ql.q == NULL);
    // hopeless H (-I): LLMQ_ERR_NUMERIC after the retries, like the CPU
    for (int i = 0; i < C * C; i++) H1[i] = i % (C + 1) == 0 ? -1.0f : 0.0f;
    o.percdamp = 0.9f;
    memcpy(W1, W, sizeof W1);
    CHECK_EQ_INT(llmq_gptq_quantize("blk.4.ffn_up", W1, H1, R, C, &o, &ql, NULL, NULL), LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "not positive definite");
    llmq_log_set_level(LLMQ_LOG_INFO);
}

int main(void) {
    const char *why = NULL;
    if (llmq_cuda_device_count(&why) == 0) {
        fprintf(stderr, "skipped: no CUDA device (%s)\n", why ? why : "?");
        return TEST_SKIP;
    }
    test_params_hook();
    test_block_hook();
    const int64_t shapes[][2] = {{64, 200}, {48, 333}, {32, 512}};
    for (int si = 0; si < 3; si++)
        for (int gi = 0; gi < 2; gi++)
            for (int act = 0; act < 2; act++)
                for (int st = 0; st < 1 + gi; st++) { // static groups only mean something with G > 0
                    struct llmq_gptq_opts o = llmq_gptq_opts_default();
                    o.q.group_size = gi ? 128 : -1;
                    o.act_order = act;
                    o.static_groups = st;
                    test_solve(shapes[si][0], shapes[si][1], o);
                }
    // groups longer than a block (the dynamic grid reads columns the lazy update has not reached yet),
    // small groups, 3-bit symmetric, a block that does not tile C
    struct llmq_gptq_opts o = llmq_gptq_opts_default();
    o.blocksize = 48;
    o.act_order = true;
    test_solve(40, 333, o);
    o.q.bits = 3;
    o.q.sym = true;
    o.q.group_size = 32;
    o.blocksize = 128;
    test_solve(40, 333, o);
    test_spare();
    test_retry_and_nan();
    printf("test_gptq_cuda: ok\n");
    return 0;
}
