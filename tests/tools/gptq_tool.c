/*
 * tests/tools/gptq_tool.c — runs llmq_gptq_quantize (or llmq_rtn_quantize) on raw fp32 files for the
 * pytest oracle tests/py/test_gptq_oracle.py.
 *
 *   gptq_tool --W FILE --H FILE --R R --C C --out PREFIX [--bits 4] [--group 128] [--sym]
 *             [--act-order | --group-aware] [--static-groups] [--percdamp 0.01] [--blocksize 128] [--rtn]
 *             [--grid minmax|mse|hmse] [--dxxt FILE [--alpha 0.25]]
 *
 * Inputs: W (R, C) and H (C, C) row-major little-endian f32 (H ignored with --rtn); --dxxt: GPTAQ's cross
 * term 2/n · ΔX X̃ᵀ (C, C) f32 (quant/gptq.h "GPTAQ"), --alpha its scale.
 * Outputs: PREFIX.q (R, C) u8 codes, PREFIX.scales / PREFIX.zeros (R, NG) f32, PREFIX.gidx (C) i32,
 * PREFIX.Q (R, C) f32 dequantized W, PREFIX.Hinv (C, C) f32 (GPTQ only: the upper factor used, in
 * processing order). stdout: one JSON line {"status", "percdamp", "loss", "n_groups"}; exit 0 on
 * success, 2 when the library returns an error (its status name is in the JSON), 1 on usage errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "quant/gptq.h"
#include "quant/quantizer.h"
#include "util.h"

static void *read_raw(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *p = malloc(n ? n : 1);
    if (p && fread(p, 1, n, f) != n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    return p;
}

int main(int argc, char **argv) {
    const char *wpath = NULL, *hpath = NULL, *prefix = NULL, *dpath = NULL;
    long long R = 0, C = 0;
    int rtn = 0;
    struct llmq_gptq_opts o = llmq_gptq_opts_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--sym"))
            o.q.sym = true;
        else if (!strcmp(a, "--act-order"))
            o.act_order = true;
        else if (!strcmp(a, "--static-groups"))
            o.static_groups = true;
        else if (!strcmp(a, "--group-aware"))
            o.group_aware = true;
        else if (!strcmp(a, "--rtn"))
            rtn = 1;
        else if (!v) {
            fprintf(stderr, "gptq_tool: %s needs a value\n", a);
            return 1;
        } else if (!strcmp(a, "--W"))
            wpath = argv[++i];
        else if (!strcmp(a, "--H"))
            hpath = argv[++i];
        else if (!strcmp(a, "--dxxt"))
            dpath = argv[++i];
        else if (!strcmp(a, "--alpha"))
            o.gptaq_alpha = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--out"))
            prefix = argv[++i];
        else if (!strcmp(a, "--R"))
            R = atoll(argv[++i]);
        else if (!strcmp(a, "--C"))
            C = atoll(argv[++i]);
        else if (!strcmp(a, "--bits"))
            o.q.bits = atoi(argv[++i]);
        else if (!strcmp(a, "--group"))
            o.q.group_size = atoi(argv[++i]);
        else if (!strcmp(a, "--percdamp"))
            o.percdamp = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--grid"))
            o.grid = !strcmp(argv[++i], "mse")  ? LLMQ_GPTQ_GRID_MSE
                     : !strcmp(argv[i], "hmse") ? LLMQ_GPTQ_GRID_HMSE
                                                : LLMQ_GPTQ_GRID_MINMAX;
        else if (!strcmp(a, "--blocksize"))
            o.blocksize = atoi(argv[++i]);
        else {
            fprintf(stderr, "gptq_tool: unknown flag %s\n", a);
            return 1;
        }
    }
    if (!wpath || !prefix || R <= 0 || C <= 0 || (!rtn && !hpath)) {
        fprintf(stderr, "usage: gptq_tool --W FILE --H FILE --R R --C C --out PREFIX [options]\n");
        return 1;
    }
    float *W = read_raw(wpath, (size_t)(R * C) * sizeof(float));
    float *H = rtn ? NULL : read_raw(hpath, (size_t)(C * C) * sizeof(float));
    float *Dx = dpath ? read_raw(dpath, (size_t)(C * C) * sizeof(float)) : NULL;
    o.dxxt = Dx;
    if (!W || (!rtn && !H) || (dpath && !Dx)) {
        fprintf(stderr, "gptq_tool: cannot read inputs\n");
        return 1;
    }
    struct llmq_qlinear ql;
    double loss = 0.0;
    float pd = o.percdamp;
    enum llmq_status st = rtn ? llmq_rtn_quantize("gptq_tool", W, R, C, &o.q, &ql)
                              : llmq_gptq_quantize("gptq_tool", W, H, R, C, &o, &ql, &loss, &pd);
    if (st) {
        printf("{\"status\": \"%s\"}\n", llmq_status_name(st));
        free(Dx);
        free(H);
        free(W);
        return 2;
    }
    if (rtn) llmq_qlinear_dequant(&ql, W);
    int bad = test_write_raw(prefix, "q", ql.q, (size_t)(R * C));
    bad |= test_write_raw(prefix, "scales", ql.scales, (size_t)(R * ql.n_groups) * sizeof(float));
    bad |= test_write_raw(prefix, "zeros", ql.zeros, (size_t)(R * ql.n_groups) * sizeof(float));
    bad |= test_write_raw(prefix, "gidx", ql.g_idx, (size_t)C * sizeof(int32_t));
    bad |= test_write_raw(prefix, "Q", W, (size_t)(R * C) * sizeof(float));
    if (!rtn) bad |= test_write_raw(prefix, "Hinv", H, (size_t)(C * C) * sizeof(float));
    if (bad) {
        fprintf(stderr, "gptq_tool: cannot write outputs under %s\n", prefix);
        return 1;
    }
    printf("{\"status\": \"ok\", \"percdamp\": %.9g, \"loss\": %.17g, \"n_groups\": %lld}\n", (double)pd, loss,
           (long long)ql.n_groups);
    llmq_qlinear_free(&ql);
    free(Dx);
    free(H);
    free(W);
    return 0;
}
