/*
 * cli/cmd_quantize.c — `llmq quantize`: RTN / GPTQ / AWQ / AWQ+GPTQ, written as an AWQ, GPTQ or
 * fake-quant directory (quant/quantize.h has the pipeline, quant/export.h the formats).
 *
 *   llmq quantize --model M --method rtn|gptq|awq|awq+gptq --bits N --group-size G [--sym|--asym]
 *                 [--act-order] [--static-groups] [--damp 0.01] --format awq|gptq|fake --out DIR
 *                 [--calib SRC]... [--nsamples N] [--seqlen L] [--seed S] [--threads N] [--json FILE]
 *                 [--force] [--fallback rtn-per-channel]
 *
 * stderr: one line per linear and an ETA, totals at the end; stdout: the output path and totals;
 * --json FILE: settings, calibration provenance and the per-layer table (atomic write).
 */
#include "calib/model.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/io.h"
#include "common/log.h"
#include "quant/quantize.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// --calib is repeatable, cli_parse keeps one value: collect every occurrence and drop them from argv.
int cli_take_repeated(const char *name, int *argc, char **argv, const char **vals, int max_vals, int *n_vals);
int cli_take_repeated(const char *name, int *argc, char **argv, const char **vals, int max_vals, int *n_vals) {
    size_t nl = strlen(name);
    int w = 0;
    *n_vals = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strncmp(a, "--", 2) == 0 && strncmp(a + 2, name, nl) == 0 && a[2 + nl] == '=') v = a + 3 + nl;
        else if (strncmp(a, "--", 2) == 0 && strcmp(a + 2, name) == 0) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "llmq: --%s needs a value\n", name);
                return 2;
            }
            v = argv[++i];
        }
        if (v) {
            if (*n_vals >= max_vals) {
                fprintf(stderr, "llmq: at most %d --%s flags\n", max_vals, name);
                return 2;
            }
            vals[(*n_vals)++] = v;
        } else {
            argv[w++] = argv[i];
        }
    }
    *argc = w;
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    const char *model_path = NULL, *method = "rtn", *format = "fake", *out = NULL, *json_path = NULL,
               *fallback = "none", *calib_dummy = NULL;
    long bits = 4, group = 128, nsamples = 128, seqlen = 512, seed = 0, micro = 8;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    double damp = 0.01;
    bool sym = false, asym = false, act_order = false, static_groups = false, force = false, no_tseq = false;
    if (threads < 1) threads = 1;
    const char *sources[LLMQ_CALIB_MAX_SOURCES];
    int n_sources = 0;
    int rc = cli_take_repeated("calib", &argc, argv, sources, LLMQ_CALIB_MAX_SOURCES, &n_sources);
    if (rc) return rc;
    const struct cli_flag flags[] = {
        {"model", CLI_STR, &model_path, NULL, "the model: GGUF file or Hugging Face directory (required)"},
        {"method", CLI_STR, &method, "rtn", "rtn | gptq | awq | awq+gptq"},
        {"bits", CLI_INT, &bits, "4", "bits per weight code, 2..8 (awq format: 4; gptq format: 2, 3, 4, 8)"},
        {"group-size", CLI_INT, &group, "128", "input columns per (scale, zero) group; -1 = one per output row"},
        {"sym", CLI_BOOL, &sym, "off", "symmetric grid (zero fixed at 2^(bits-1))"},
        {"asym", CLI_BOOL, &asym, "on (unless --sym)", "asymmetric grid with a zero point"},
        {"act-order", CLI_BOOL, &act_order, "off", "GPTQ: columns in order of decreasing Hessian diagonal"},
        {"static-groups", CLI_BOOL, &static_groups, "off", "GPTQ: group parameters from the original weights"},
        {"no-true-sequential", CLI_BOOL, &no_tseq, "off",
         "GPTQ: collect all Hessians of a block in one pass instead of [qkv] -> [o] -> [gate,up] -> [down]"},
        {"damp", CLI_FLOAT, &damp, "0.01", "GPTQ: damping, a fraction of the mean Hessian diagonal"},
        {"format", CLI_STR, &format, "fake", "awq | gptq | fake (dequantized weights)"},
        {"out", CLI_STR, &out, NULL, "output directory (required; refused if it exists unless --force)"},
        {"calib", CLI_STR, &calib_dummy, "none",
         "calibration source, repeatable: a .txt/.raw/.jsonl[.gz] file, a datasets/manifest.tsv name "
         "(wikitext-2-valid, ...), or self (sampled from the model). Required except for rtn"},
        {"nsamples", CLI_INT, &nsamples, "128", "calibration sequences"},
        {"seqlen", CLI_INT, &seqlen, "512", "tokens per calibration sequence"},
        {"seed", CLI_INT, &seed, "0", "seed of the window sampling (and of --calib self)"},
        {"micro-batch", CLI_INT, &micro, "8", "sequences per forward call of the calibration passes"},
        {"threads", CLI_INT, &threads, "the number of CPUs", "threads (forward pass and OpenBLAS)"},
        {"json", CLI_STR, &json_path, NULL, "write settings, calibration provenance and the per-layer table here"},
        {"force", CLI_BOOL, &force, "off", "replace an existing output directory (one holding config.json)"},
        {"fallback", CLI_STR, &fallback, "none",
         "none: refuse a layer whose in-features the group size does not tile; rtn-per-channel: round that "
         "layer per output channel instead (only --format fake can hold it)"},
    };
    const struct cli_cmd cmd = {
        "quantize", "--model M --method METHOD --out DIR [flags]",
        "Quantize the linear layers of a model with RTN, GPTQ, AWQ or AWQ+GPTQ.",
        "GPTQ takes each block's inputs from the already quantized model (true-sequential); AWQ from the\n"
        "full-precision model. Calibration windows: seeded random --seqlen windows of the concatenated\n"
        "tokenized sources. Identical inputs, --seed and --threads give byte-identical outputs.\n"
        "stderr: one line per linear (name, shape, method, ‖WX-QX‖²/‖WX‖², seconds) and ETA.\n"
        "Exit status: 0 ok, 1 error, 2 usage.",
        flags, (int)(sizeof(flags) / sizeof(flags[0])), 0, 0};
    const char *pos[1];
    int n_pos;
    rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;

    struct llmq_quantize_opts o = llmq_quantize_default_opts();
    const char *usage = NULL;
    if (!model_path) usage = "--model is required";
    else if (!out) usage = "--out DIR is required";
    else if (!llmq_qmethod_parse(method, &o.method)) usage = "--method must be rtn, gptq, awq or awq+gptq";
    else if (!llmq_export_format_parse(format, &o.out.format)) usage = "--format must be awq, gptq or fake";
    else if (bits < 2 || bits > 8) usage = "--bits must be between 2 and 8";
    else if (group == 0 || group < -1 || group > (1 << 20)) usage = "--group-size must be -1 or >= 1";
    else if (sym && asym) usage = "--sym and --asym exclude each other";
    else if (damp < 0 || damp >= 1) usage = "--damp must be in [0, 1)";
    else if (nsamples < 1 || nsamples > (1 << 20)) usage = "--nsamples must be >= 1";
    else if (seqlen < 2 || seqlen > (1 << 20)) usage = "--seqlen must be >= 2";
    else if (micro < 1) usage = "--micro-batch must be >= 1";
    else if (threads < 1 || threads > 256) usage = "--threads must be between 1 and 256";
    else if (strcmp(fallback, "none") && strcmp(fallback, "rtn-per-channel")) usage = "--fallback must be none or rtn-per-channel";
    else if (seed < 0) usage = "--seed must be >= 0";
    if (usage) {
        fprintf(stderr, "llmq quantize: %s\nrun 'llmq quantize --help' for the flags and their defaults\n", usage);
        return 2;
    }
    o.q = (struct llmq_qconfig){.bits = (int)bits, .group_size = (int)group, .sym = sym};
    o.percdamp = (float)damp;
    o.act_order = act_order;
    o.static_groups = static_groups;
    o.true_sequential = !no_tseq;
    o.fallback_rtn_per_channel = strcmp(fallback, "rtn-per-channel") == 0;
    o.calib.sources = sources;
    o.calib.n_sources = n_sources;
    o.calib.nsamples = nsamples;
    o.calib.seqlen = seqlen;
    o.calib.seed = (uint64_t)seed;
    o.micro_batch = micro;
    o.n_threads = (int)threads;
    o.out.force = force;
    o.out_dir = out;

    struct llmq_model *m = NULL;
    json_t *rep = NULL;
    enum llmq_status st = llmq_model_load(model_path, &m);
    if (!st) st = llmq_quantize_run(m, &o, &rep);
    if (!st) {
        json_t *t = json_object_get(rep, "totals");
        printf("output:    %s (%s, %s %ld-bit, group %ld)\n", out, format, method, bits, group);
        printf("weights:   %lld in %lld linears, %.3f bits per weight, %lld bytes\n",
               (long long)json_integer_value(json_object_get(t, "weights")),
               (long long)json_integer_value(json_object_get(t, "linears")),
               json_real_value(json_object_get(t, "bits_per_weight")),
               (long long)json_integer_value(json_object_get(t, "output_bytes")));
        fflush(stdout);
        if (json_path) st = llmq_write_json(json_path, rep, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    }
    json_decref(rep);
    llmq_model_free(m);
    return st ? 1 : 0;
}
