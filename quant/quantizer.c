/*
 * quant/quantizer.c — the shared integer grid, struct llmq_qlinear and RTN (see quantizer.h).
 * Legend: R rows/out, C cols/in, G group size, NG groups per row.
 * Built with -ffp-contract=off (CMakeLists.txt): the grid must round exactly like the torch/numpy
 * reference (no fused multiply-adds).
 */
#include "quant/quantizer.h"

#include <math.h>
#include <string.h>

#include "common/log.h"

enum llmq_status llmq_qconfig_check(const struct llmq_qconfig *cfg, const char *what) {
    if (cfg->bits < LLMQ_QBITS_MIN || cfg->bits > LLMQ_QBITS_MAX)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: bits must be in %d..%d, got %d", what, LLMQ_QBITS_MIN, LLMQ_QBITS_MAX,
                           cfg->bits);
    if (cfg->group_size != -1 && cfg->group_size < 1)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: group size must be -1 or >= 1, got %d", what, cfg->group_size);
    return LLMQ_OK;
}

int64_t llmq_qconfig_n_groups(const struct llmq_qconfig *cfg, int64_t C) {
    if (cfg->group_size <= 0 || C <= 0) return 1;
    return (C + cfg->group_size - 1) / cfg->group_size;
}

enum llmq_status llmq_qlinear_init(int64_t R, int64_t C, const struct llmq_qconfig *cfg, struct llmq_qlinear *out) {
    memset(out, 0, sizeof *out);
    enum llmq_status st = llmq_qconfig_check(cfg, "qlinear");
    if (st) return st;
    if (R <= 0 || C <= 0 || R > ((int64_t)1 << 40) / C)
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "qlinear: bad shape (%lld, %lld)", (long long)R, (long long)C);
    int64_t NG = llmq_qconfig_n_groups(cfg, C);
    out->R = R;
    out->C = C;
    out->bits = cfg->bits;
    out->group_size = cfg->group_size;
    out->sym = cfg->sym;
    out->n_groups = NG;
    out->q = calloc((size_t)(R * C), 1);
    out->scales = calloc((size_t)(R * NG), sizeof(float));
    out->zeros = calloc((size_t)(R * NG), sizeof(float));
    out->g_idx = calloc((size_t)C, sizeof(int32_t));
    if (!out->q || !out->scales || !out->zeros || !out->g_idx) {
        llmq_qlinear_free(out);
        return llmq_errorf(LLMQ_ERR_NOMEM, "qlinear: out of memory for (%lld, %lld)", (long long)R, (long long)C);
    }
    for (int64_t c = 0; c < C; c++) out->g_idx[c] = cfg->group_size > 0 ? (int32_t)(c / cfg->group_size) : 0;
    return LLMQ_OK;
}

void llmq_qlinear_free(struct llmq_qlinear *ql) {
    if (!ql) return;
    free(ql->q);
    free(ql->scales);
    free(ql->zeros);
    free(ql->g_idx);
    memset(ql, 0, sizeof *ql);
}

void llmq_qlinear_dequant(const struct llmq_qlinear *ql, float *W_out) {
    const int64_t R = ql->R, C = ql->C, NG = ql->n_groups;
    for (int64_t r = 0; r < R; r++) {
        const uint8_t *q = ql->q + r * C;     // (C)
        const float *s = ql->scales + r * NG; // (NG)
        const float *z = ql->zeros + r * NG;  // (NG)
        float *w = W_out + r * C;             // (C)
        for (int64_t c = 0; c < C; c++) {
            int32_t g = ql->g_idx[c];
            w[c] = ((float)q[c] - z[g]) * s[g];
        }
    }
}

void llmq_quant_params_gptq(const float *x, int64_t n, int64_t stride, int bits, bool sym, float *scale, float *zero) {
    float xmin = 0.0f, xmax = 0.0f; // the range always includes 0
    for (int64_t i = 0; i < n; i++) {
        float v = x[i * stride];
        if (v < xmin) xmin = v;
        if (v > xmax) xmax = v;
    }
    llmq_gptq_grid_params(xmin, xmax, bits, sym, scale, zero);
}

void llmq_quant_params_gptq_mse(const float *x, int64_t n, int64_t stride, int bits, bool sym, const float *wt,
                                float norm, float *scale, float *zero) {
    float xmin = 0.0f, xmax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i * stride];
        if (v < xmin) xmin = v;
        if (v > xmax) xmax = v;
    }
    const int maxq = (1 << bits) - 1;
    double best = INFINITY;
    llmq_gptq_grid_params(xmin, xmax, bits, sym, scale, zero);
    for (int i = 0; i < 80; i++) { // int(maxshrink · grid) = 80 steps
        const float p = 1.0f - (float)i / 100.0f;
        float s, z;
        llmq_gptq_grid_params(p * xmin, p * xmax, bits, sym, &s, &z);
        double e = 0;
        for (int64_t k = 0; k < n; k++) {
            float v = x[k * stride], q = s * ((float)llmq_gptq_grid_code(v, s, z, maxq) - z);
            double d = fabsf(v - q);
            e += (wt ? (double)wt[k] : 1.0) * (norm == 2.0f ? d * d : pow(d, (double)norm));
        }
        if (e < best) {
            best = e;
            *scale = s;
            *zero = z;
        }
    }
}

void llmq_quant_params_awq(const float *x, int64_t n, int64_t stride, int bits, bool sym, float *scale, float *zero) {
    if (sym) {
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i * stride]));
        if (amax < 1e-5f) amax = 1e-5f;
        *scale = amax / (float)((1 << (bits - 1)) - 1);
        *zero = (float)(1 << (bits - 1));
        return;
    }
    float mn = x[0], mx = x[0];
    for (int64_t i = 1; i < n; i++) {
        float v = x[i * stride];
        if (v < mn) mn = v;
        if (v > mx) mx = v;
    }
    llmq_awq_grid_params(mn, mx, bits, scale, zero); // kernels/gptq_grid.h: the device's AWQ candidates too
}

enum llmq_status llmq_rtn_quantize(const char *name, const float *W, int64_t R, int64_t C,
                                   const struct llmq_qconfig *cfg, struct llmq_qlinear *out) {
    enum llmq_status st = llmq_qconfig_check(cfg, name);
    if (st) return st;
    for (int64_t i = 0; i < R * C; i++)
        if (!isfinite(W[i]))
            return llmq_errorf(LLMQ_ERR_NUMERIC, "%s: weight (%lld, %lld) is %f", name, (long long)(i / C),
                               (long long)(i % C), (double)W[i]);
    st = llmq_qlinear_init(R, C, cfg, out);
    if (st) return st;
    const int64_t NG = out->n_groups, G = cfg->group_size > 0 ? cfg->group_size : C;
    const int maxq = (1 << cfg->bits) - 1;
    for (int64_t r = 0; r < R; r++) {
        for (int64_t g = 0; g < NG; g++) {
            int64_t c0 = g * G, n = c0 + G <= C ? G : C - c0;
            float s, z;
            llmq_quant_params_gptq(W + r * C + c0, n, 1, cfg->bits, cfg->sym, &s, &z);
            out->scales[r * NG + g] = s;
            out->zeros[r * NG + g] = z;
            for (int64_t c = c0; c < c0 + n; c++) out->q[r * C + c] = llmq_quant_code(W[r * C + c], s, z, maxq);
        }
    }
    return LLMQ_OK;
}
