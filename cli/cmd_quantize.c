/*
 * cli/cmd_quantize.c — `llmq quantize`: RTN / GPTQ / AWQ / AWQ+GPTQ, written as an AWQ, GPTQ or
 * fake-quant directory (quant/quantize.h has the pipeline, quant/export.h the formats).
 *
 *   llmq quantize --model M --method rtn|gptq|awq|awq+gptq --bits N --group-size G [--sym|--asym]
 *                 [--act-order] [--static-groups] [--damp 0.01] --format awq|gptq|fake --out DIR
 *                 [--calib SRC]... [--nsamples N] [--seqlen L] [--seed S] [--threads N] [--json FILE]
 *                 [--force] [--fallback rtn-per-channel]
 *
 *   llmq quantize --model M --format gguf --gguf-type Q4_K_M --out OUT.gguf [--method rtn|gptq|awq|awq+gptq]
 *                 [--imatrix FILE.lcs|FILE.gguf|FILE.dat] [--calib SRC]... [--tensor-type REGEX=TYPE]...
 *                 [--output-type T] [--embedding-type T] [--pure] [--dry-run] [--no-provenance]
 *                 [--allow-requantize]   (--output-tensor-type / --token-embedding-type: llama-quantize's names)
 *
 * stderr: one line per linear (per tensor for gguf) and an ETA, totals at the end; stdout: the output
 * path and totals (--dry-run: the plan table); --json FILE: settings, calibration provenance and the
 * per-layer / per-tensor table (atomic write). --format gguf with --method rtn is quant/gguf_export.h
 * alone (importance from --imatrix, or gathered from --calib); other methods go through
 * quant/quantize.h with to_gguf.
 */
#include "calib/model/model.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/spill.h"
#include "quant/gguf_export.h"
#include "quant/gguf_mix.h"
#include "quant/quantize.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void openblas_set_num_threads(int n);

#define MAX_TENSOR_TYPES 64

// --imatrix: llmq statistics (.lcs, magic "LLMQCALS") or a llama.cpp imatrix (GGUF or legacy .dat, told
// apart by llmq_calib_imatrix_load).
static enum llmq_status load_imatrix(const char *path, const struct llmq_model *m, struct llmq_calib_stats *s,
                                     json_t *prov) {
    char magic[8] = {0}, sha[65];
    FILE *f = fopen(path, "rb");
    if (!f) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: cannot open the imatrix", path);
    size_t n = fread(magic, 1, 8, f);
    fclose(f);
    bool lcs = n == 8 && memcmp(magic, "LLMQCALS", 8) == 0;
    enum llmq_status st = lcs ? llmq_calib_stats_load(path, s) : llmq_calib_imatrix_load(path, m, s);
    if (st) return st;
    json_t *j = json_object();
    json_object_set_new(j, "path", json_string(path));
    bool gguf = n >= 4 && memcmp(magic, "GGUF", 4) == 0;
    json_object_set_new(j, "format",
                        json_string(lcs    ? "llmq-stats"
                                    : gguf ? "llama.cpp-imatrix-gguf"
                                           : "llama.cpp-imatrix-dat"));
    if (!llmq_file_sha256(path, sha)) json_object_set_new(j, "sha256", json_string(sha));
    json_object_set_new(prov, "imatrix", j);
    return LLMQ_OK;
}

static json_t *calib_provenance(const struct llmq_calib_data *d, uint64_t seed) {
    json_t *c = json_object(), *srcs = json_array();
    for (int i = 0; i < d->n_src; i++) {
        json_t *j = json_object();
        json_object_set_new(j, "source", json_string(d->src[i].arg));
        if (d->src[i].sha256[0]) json_object_set_new(j, "sha256", json_string(d->src[i].sha256));
        json_object_set_new(j, "tokens", json_integer(d->src[i].n_tokens));
        json_array_append_new(srcs, j);
    }
    json_object_set_new(c, "sources", srcs);
    json_object_set_new(c, "nsamples", json_integer(d->n_seq));
    json_object_set_new(c, "seqlen", json_integer(d->seqlen));
    json_object_set_new(c, "seed", json_integer((json_int_t)seed));
    json_object_set_new(c, "tokens_sha256", json_string(d->tokens_sha256));
    return c;
}

// The GGUF output: checked options in, exit status out.
struct gguf_args {
    const char *model, *method, *out, *json, *imatrix;
    const char *device; // "cuda:0 NAME (N SMs)" or "cpu ..." for the report
    struct llmq_gguf_export_opts eo;
    struct llmq_quantize_opts qo; // gptq / awq (to_gguf)
    json_t *settings;
    bool dry_run;
};

// After a usage error found against the model (its line is out): the hint, and exit status 2.
static int usage_exit(void) {
    fprintf(stderr, "run 'llmq quantize --help' for the flags and their defaults\n");
    return 2;
}

static int run_gguf(struct gguf_args *a) {
    struct llmq_model *m = NULL;
    struct llmq_calib_stats s = {0};
    struct llmq_calib_data d = {0};
    json_t *rep = NULL;
    bool rtn = a->qo.method == LLMQ_QMETHOD_RTN;
    enum llmq_status st = llmq_model_load(a->model, &m);
    if (st) goto done;
    a->qo.to_gguf = true;
    if (!rtn && llmq_quantize_check(m, &a->qo)) { // the options do not fit this model: a usage error
        llmq_model_free(m);
        return usage_exit();
    }
    if (a->imatrix) {
        if ((st = load_imatrix(a->imatrix, m, &s, a->settings))) goto done;
        a->eo.imatrix = &s;
    } else if (rtn && a->qo.calib.n_sources > 0) { // gather the importance on the fly
        if (a->dry_run)
            a->eo.mix.have_imatrix = true;
        else {
            struct llmq_calib_opts co = a->qo.calib;
            co.n_threads = a->qo.n_threads;
            co.backend = a->qo.backend;
            openblas_set_num_threads(a->qo.n_threads);
            if ((st = llmq_calib_data_load(m, &co, &d)) || (st = llmq_calib_stats_init(m, false, 0, m->hp.n_layer, &s)))
                goto done;
            s.backend = a->qo.backend;
            if ((st = llmq_calib_run(m, &d, a->qo.n_threads, a->qo.micro_batch, &s))) goto done;
            json_object_set_new(a->settings, "calibration", calib_provenance(&d, co.seed));
            a->eo.imatrix = &s;
        }
    } else if (!rtn) {
        // GPTQ / AWQ gather calibration statistics and weight the encoders with them: the file gets the
        // imatrix mix (llama-quantize's Q4_0 / Q5_0 / IQ4_* ffn_down choices with --imatrix), so it has the
        // same size as llama-quantize --imatrix of the same type.
        a->eo.mix.have_imatrix = true;
    }
    a->eo.provenance = a->settings;
    a->eo.report = &rep;
    if (a->dry_run) {
        struct llmq_gguf_export *e = NULL;
        if ((st = llmq_gguf_export_begin(m, a->out, &a->eo, &e))) goto done;
        llmq_gguf_export_print_plan(e, stdout);
        fflush(stdout);
        if ((st = llmq_gguf_export_finish(e))) goto done;
    } else if (rtn) {
        if ((st = llmq_gguf_export_rtn(m, a->out, &a->eo))) goto done;
    } else {
        a->qo.gguf = a->eo;
        a->qo.out_dir = a->out;
        if ((st = llmq_quantize_run(m, &a->qo, &rep))) goto done;
    }
    if (rep && !a->dry_run) {
        json_t *t = json_object_get(rep, "totals");
        printf("output:    %s (gguf %s, %s%s)\n", a->out, llmq_gguf_ftype_name(a->eo.mix.ftype), a->method,
               a->eo.imatrix ? ", with importance" : "");
        if (t)
            printf("tensors:   %lld, %.2f MiB of tensor data, %.4f bits per weight, %lld fallback(s)\n",
                   (long long)json_integer_value(json_object_get(t, "tensors")),
                   (double)json_integer_value(json_object_get(t, "bytes")) / 1048576.0,
                   json_real_value(json_object_get(t, "bits_per_weight")),
                   (long long)json_integer_value(json_object_get(t, "fallbacks")));
        fflush(stdout);
    }
    if (a->json && rep) {
        if (!json_object_get(rep, "settings")) json_object_set(rep, "settings", a->settings);
        json_object_set_new(rep, "device", json_string(a->device));
        st = llmq_write_json(a->json, rep, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    }
done:
    json_decref(rep);
    llmq_calib_stats_free(&s);
    llmq_calib_data_free(&d);
    llmq_model_free(m);
    return st ? 1 : 0;
}

// --format when not given: gguf for a GGUF output, else the method's packed format where it holds the
// bits and groups (awq: 4 bits with a group size; gptq: 2, 3, 4, 8 bits; rtn's integer codes pack as
// gptq), else fake; fake also for --fallback rtn-per-channel, which only fake can hold.
static const char *default_format(const char *method, bool gguf_out, long bits, long group, const char *fallback) {
    if (gguf_out) return "gguf";
    if (bits == LONG_MIN) bits = 4;
    if (fallback && strcmp(fallback, "rtn-per-channel") == 0) return "fake";
    if (strcmp(method, "awq") == 0 && bits == 4 && group != -1) return "awq";
    return bits == 2 || bits == 3 || bits == 4 || bits == 8 ? "gptq" : "fake";
}

int cmd_quantize(int argc, char **argv) {
    const char *model_path = NULL, *method = "rtn", *format = NULL, *out = NULL, *json_path = NULL, *fallback = NULL,
               *gguf_type = NULL, *imatrix = NULL, *tt_dummy = NULL, *output_type = NULL, *embedding_type = NULL,
               *device = "auto";
    long bits = LONG_MIN, group = LONG_MIN;
    double damp = NAN; // not given: 0.01 (cli_parse refuses non-finite numbers)
    bool sym = false, asym = false, act_order = false, static_groups = false, group_aware = false, force = false,
         no_tseq = false, pure = false, dry_run = false, no_prov = false, allow_requant = false;
    struct cli_calib_args ca;
    cli_calib_args_init(&ca);
    const char *tts[MAX_TENSOR_TYPES];
    int n_tts = 0;
    int rc = cli_calib_take_sources(&ca, &argc, argv);
    if (!rc) rc = cli_take_repeated("tensor-type", &argc, argv, tts, MAX_TENSOR_TYPES, &n_tts);
    if (rc) return rc;
    const struct cli_flag flags[] = {
        {"model", CLI_STR, &model_path, NULL, "the model: GGUF file or Hugging Face directory (required)"},
        {"method", CLI_STR, &method, "rtn", "rtn | gptq | awq | awq+gptq"},
        {"bits", CLI_INT, &bits, "4", "bits per weight code, 2..8 (awq format: 4; gptq format: 2, 3, 4, 8; not gguf)"},
        {"group-size", CLI_INT, &group, "128",
         "input columns per (scale, zero) group; -1 = one per output row (not gguf: its blocks are fixed)"},
        {"sym", CLI_BOOL, &sym, "off", "symmetric grid (zero fixed at 2^(bits-1))"},
        {"asym", CLI_BOOL, &asym, "on (unless --sym)", "asymmetric grid with a zero point"},
        {"act-order", CLI_BOOL, &act_order, "off",
         "GPTQ: columns in order of decreasing Hessian diagonal (gguf: every block's grid fixed first from the "
         "original weights)"},
        {"static-groups", CLI_BOOL, &static_groups, "off", "GPTQ: group parameters from the original weights"},
        {"act-group-aware", CLI_BOOL, &group_aware, "off",
         "GPTQ: GPTQModel's act_group_aware order (GAR): whole groups by decreasing max Hessian diagonal, the "
         "columns of a group likewise; groups stay contiguous, so g_idx is plain and --format awq holds it "
         "(not gguf; excludes --act-order, --static-groups)"},
        {"no-true-sequential", CLI_BOOL, &no_tseq, "off",
         "GPTQ: collect all Hessians of a block in one pass instead of [qkv] -> [o] -> [gate,up] -> [down]"},
        {"damp", CLI_FLOAT, &damp, "0.01", "GPTQ: damping, a fraction of the mean Hessian diagonal"},
        {"format", CLI_STR, &format,
         "the method's packed format: awq for --method awq (4 bits with a group size), else gptq (2, 3, 4, 8 "
         "bits), else fake; fake with --fallback rtn-per-channel; gguf when --gguf-type is given or --out ends "
         "in .gguf",
         "awq | gptq (packed integer codes) | fake (dequantized weights in the model's dtype) | gguf"},
        {"out", CLI_STR, &out, NULL,
         "output directory, or the .gguf file (required, except with --dry-run; refused if it exists unless --force)"},
        {"calib", CLI_STR, &ca.calib_help_dummy, "none",
         CLI_CALIB_SOURCE_HELP ". Required except for rtn; with rtn into gguf it gathers the importance matrix"},
        CLI_CALIB_FLAGS(&ca),
        {"threads", CLI_INT, &ca.threads, "the number of CPUs", "threads (forward pass, OpenBLAS, GGUF encoders)"},
        {"device", CLI_STR, &device, "auto", CLI_DEVICE_HELP " (the GPTQ solver and the GGUF encoders run on the CPU)"},
        {"json", CLI_STR, &json_path, NULL, "write settings, calibration provenance and the per-layer table here"},
        {"force", CLI_BOOL, &force, "off",
         "replace an existing output (a directory holding config.json, or a .gguf file)"},
        {"fallback", CLI_STR, &fallback, "none",
         "none: refuse a layer whose in-features the group size does not tile; rtn-per-channel: round that "
         "layer per output channel instead (only --format fake can hold it; not gguf)"},
        {"gguf-type", CLI_STR, &gguf_type, NULL,
         "gguf: llama.cpp file type (the per-tensor mix of llama-quantize): Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_0, "
         "Q5_1, Q4_K_M, Q4_K_S, Q4_0, Q4_1, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K, IQ4_NL, IQ4_XS, F16, BF16, F32 (required)"},
        {"imatrix", CLI_STR, &imatrix, NULL,
         "gguf: importance matrix: llmq statistics (.lcs from llmq calib) or a llama-imatrix file (GGUF, or the "
         "legacy .dat; told apart by content)"},
        {"tensor-type", CLI_STR, &tt_dummy, "none",
         "gguf, repeatable: REGEX=TYPE, tensors whose name matches REGEX (POSIX extended, lower-cased) get TYPE"},
        {"output-type", CLI_STR, &output_type, "from the mix", "gguf: type of output.weight (token_embd when tied)"},
        {"embedding-type", CLI_STR, &embedding_type, "from the mix", "gguf: type of token_embd.weight"},
        {"output-tensor-type", CLI_ALIAS, NULL, "output-type", "llama-quantize's name for it"},
        {"token-embedding-type", CLI_ALIAS, NULL, "embedding-type", "llama-quantize's name for it"},
        {"allow-requantize", CLI_BOOL, &allow_requant, "off",
         "quantize tensors that are already quantized (e.g. a Q4_1 GGUF input) instead of refusing them, as "
         "llama-quantize --allow-requantize does: the result is worse than quantizing the f32 / f16 original"},
        {"pure", CLI_BOOL, &pure, "off", "gguf: no mix rules, the file type's default type for every tensor"},
        {"dry-run", CLI_BOOL, &dry_run, "off",
         "gguf: print every tensor's type, size and bits per weight, write nothing"},
        {"no-provenance", CLI_BOOL, &no_prov, "off",
         "gguf: write no llmq.* keys (then --method rtn gives llama-quantize's bytes)"},
    };
    const struct cli_cmd cmd = {
        "quantize",
        "--model M --method METHOD --out DIR|FILE.gguf [flags]",
        "Quantize the linear layers of a model with RTN, GPTQ, AWQ or AWQ+GPTQ, or write a GGUF quant.",
        "GPTQ takes each block's inputs from the already quantized model (true-sequential); AWQ from the\n"
        "full-precision model. Calibration windows: seeded random --seqlen windows of the concatenated\n"
        "tokenized sources. Identical inputs, --seed, --threads and --device give byte-identical outputs.\n"
        "\n"
        "What the columns of the per-linear lines on stderr mean:\n"
        "  quantize: blk.L.NAME  R x C  METHOD [TYPE]  err|werr E  [loss L  rtn_err E0]  S s  ETA T\n"
        "  R x C    rows (out_features) x columns (in_features) of the linear\n"
        "  METHOD   rtn | gptq | awq | awq+gptq; rtn-pc: the --fallback rtn-per-channel layer; gguf: convert\n"
        "           (f16/f32 type, no quantizer) and METHOD:rtn (GPTQ lost to the plain encoder, which was kept)\n"
        "  TYPE     gguf only: the block type the linear was written in\n"
        "  err      relative output error on the calibration tokens, ||(W-Q)X||^2 / ||WX||^2 (0 = exact)\n"
        "  werr     relative weight error ||W-Q||^2 / ||W||^2, instead of err when there is no calibration\n"
        "  loss     GPTQ's own objective, 1/2 sum (w-q)^2 / [H^-1]_ii^2 over the columns (the reference's\n"
        "           Losses); its scale follows the Hessian (the inputs' size): compare it on one linear only\n"
        "  rtn_err  err of plain RTN on the same grid and layer: err below rtn_err is what GPTQ gained\n"
        "  S s      seconds this linear took (AWQ: its search ran before, in the block's awq: lines)\n"
        "  ETA      time left: a work model (rows x cols x (tokens + cols) per linear, AWQ's tokens counted\n"
        "           1 + 20 times for its scale search) at the rate measured so far; ? until 1% is done\n"
        "gguf output: one line per tensor, [i/n] NAME SHAPE SRC -> TYPE MiB ms ETA and why the type differs\n"
        "from the mix's (a fallback when the row length does not tile the block, an override).\n"
        "\n"
        "GGUF output gets llama-quantize's per-tensor types (quant/gguf_mix.h); with --method rtn\n"
        "and --no-provenance the file equals llama.cpp's for the same input and importance.\n"
        "Exit status: 0 ok, 1 error, 2 usage.",
        flags,
        (int)(sizeof(flags) / sizeof(flags[0])),
        0,
        0};
    const char *pos[1];
    int n_pos;
    rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!format)
        format = default_format(method, gguf_type || (out && llmq_ends_with(out, ".gguf")), bits, group, fallback);
    bool gguf = strcmp(format, "gguf") == 0;

    struct llmq_quantize_opts o = llmq_quantize_default_opts();
    struct llmq_gguf_tensor_type tt[MAX_TENSOR_TYPES];
    int n_tt = 0;
    enum llmq_gguf_ftype ftype = LLMQ_GGUF_FTYPE_Q8_0;
    enum llmq_dtype otype = LLMQ_DTYPE_COUNT, etype = LLMQ_DTYPE_COUNT;
    static char usage_buf[512];
    const char *usage = NULL;
    if (!gguf && bits == LONG_MIN) bits = 4;
    if (!gguf && group == LONG_MIN) group = 128;
    if (!model_path)
        usage = "--model is required";
    else if (!out && !(gguf && dry_run))
        usage = gguf ? "--out FILE.gguf is required" : "--out DIR is required";
    else if (!llmq_qmethod_parse(method, &o.method))
        usage = "--method must be rtn, gptq, awq or awq+gptq";
    else if (!gguf && !llmq_export_format_parse(format, &o.out.format))
        usage = "--format must be awq, gptq, fake or gguf";
    else if (gguf && (bits != LONG_MIN || group != LONG_MIN))
        usage = "--bits and --group-size do not apply to --format gguf (its block types fix them: choose --gguf-type)";
    else if (!llmq_qmethod_uses_gptq(o.method) &&
             (act_order || static_groups || group_aware || no_tseq || !isnan(damp))) {
        // GPTQ's flags mean nothing to rtn and awq: refuse them rather than ignore them
        const char *f = act_order       ? "act-order"
                        : static_groups ? "static-groups"
                        : group_aware   ? "act-group-aware"
                        : no_tseq       ? "no-true-sequential"
                                        : "damp";
        snprintf(usage_buf, sizeof(usage_buf), "--%s needs --method gptq or awq+gptq (it is a GPTQ option)", f);
        usage = usage_buf;
    } else if (gguf && (sym || asym || static_groups || fallback))
        usage = "--sym, --asym, --static-groups and --fallback do not apply to --format gguf";
    else if (group_aware && gguf)
        usage = "--act-group-aware needs a directory format (awq, gptq, fake), not gguf";
    else if (group_aware && (act_order || static_groups))
        usage = "--act-group-aware excludes --act-order and --static-groups";
    else if (group_aware && group == -1)
        usage = "--act-group-aware needs a group size (not -1)";
    else if (gguf && !gguf_type)
        usage = "--format gguf needs --gguf-type (e.g. Q4_K_M)";
    else if (gguf && !llmq_gguf_ftype_parse(gguf_type, &ftype)) {
        snprintf(usage_buf, sizeof(usage_buf), "--gguf-type '%s' is unknown; one of %s", gguf_type,
                 llmq_gguf_ftype_list());
        usage = usage_buf;
    } else if (!gguf && (gguf_type || imatrix || n_tts || output_type || embedding_type || pure || dry_run || no_prov))
        usage = "--gguf-type, --imatrix, --tensor-type, --output-type, --embedding-type, --pure, --dry-run and "
                "--no-provenance need --format gguf";
    else if (gguf && imatrix && ca.n_sources > 0 && o.method == LLMQ_QMETHOD_RTN)
        usage = "--imatrix and --calib exclude each other with --method rtn (--calib gathers the importance)";
    else if (!gguf && (bits < 2 || bits > 8))
        usage = "--bits must be between 2 and 8";
    else if (!gguf && (group == 0 || group < -1 || group > (1 << 20)))
        usage = "--group-size must be -1 or >= 1";
    else if (sym && asym)
        usage = "--sym and --asym exclude each other";
    else if (!isnan(damp) && (damp < 0 || damp >= 1))
        usage = "--damp must be in [0, 1)";
    else if (fallback && strcmp(fallback, "none") && strcmp(fallback, "rtn-per-channel"))
        usage = "--fallback must be none or rtn-per-channel";
    else
        usage = cli_calib_args_check(&ca);
    if (!usage && gguf) {
        if (output_type && !llmq_gguf_mix_type_ok(otype = llmq_dtype_from_name(output_type))) {
            snprintf(usage_buf, sizeof(usage_buf), "--output-type '%s' is not a type llmq can write into a GGUF",
                     output_type);
            usage = usage_buf;
        } else if (embedding_type && !llmq_gguf_mix_type_ok(etype = llmq_dtype_from_name(embedding_type))) {
            snprintf(usage_buf, sizeof(usage_buf), "--embedding-type '%s' is not a type llmq can write into a GGUF",
                     embedding_type);
            usage = usage_buf;
        }
        for (int i = 0; !usage && i < n_tts; i++) {
            if (llmq_gguf_tensor_type_parse(tts[i], &tt[n_tt]))
                usage = ""; // the error line is out already
            else
                n_tt++;
        }
    }
    if (usage) {
        if (*usage) fprintf(stderr, "llmq quantize: %s\n", usage);
        fprintf(stderr, "run 'llmq quantize --help' for the flags and their defaults\n");
        for (int i = 0; i < n_tt; i++) free((char *)tt[i].regex);
        return 2;
    }
    char device_desc[320];
    if ((rc = cli_device(device, &o.backend, device_desc, sizeof(device_desc)))) return rc;
    llmq_spill_configure(ca.max_mem_bytes);
    o.calib.sources = ca.sources;
    o.calib.n_sources = ca.n_sources;
    o.calib.nsamples = ca.nsamples;
    o.calib.seqlen = ca.seqlen;
    o.calib.seed = (uint64_t)ca.seed;
    o.micro_batch = ca.micro;
    o.n_threads = (int)ca.threads;
    o.percdamp = isnan(damp) ? 0.01f : (float)damp;
    o.true_sequential = !no_tseq;
    o.act_order = act_order;

    if (gguf) {
        struct gguf_args a = {.model = model_path,
                              .method = method,
                              .out = out,
                              .json = json_path,
                              .imatrix = imatrix,
                              .qo = o,
                              .dry_run = dry_run,
                              .device = device_desc};
        a.eo = llmq_gguf_export_default_opts();
        a.eo.mix.ftype = ftype;
        a.eo.mix.output_type = otype;
        a.eo.mix.embedding_type = etype;
        a.eo.mix.pure = pure;
        a.eo.mix.n_overrides = n_tt;
        a.eo.mix.overrides = tt;
        a.eo.n_threads = (int)ca.threads;
        a.eo.force = force;
        a.eo.dry_run = dry_run;
        a.eo.no_provenance = no_prov;
        a.eo.allow_requantize = allow_requant;
        a.settings = json_object();
        json_t *ttj = json_array();
        for (int i = 0; i < n_tt; i++) {
            char buf[256];
            snprintf(buf, sizeof(buf), "%s=%s", tt[i].regex, llmq_dtype_name(tt[i].type));
            json_array_append_new(ttj, json_string(buf));
        }
        json_object_set_new(a.settings, "llmq_version", json_string(LLMQ_VERSION));
        json_object_set_new(a.settings, "method", json_string(llmq_qmethod_name(o.method)));
        json_object_set_new(a.settings, "format", json_string("gguf"));
        json_object_set_new(a.settings, "gguf_type", json_string(llmq_gguf_ftype_name(ftype)));
        json_object_set_new(a.settings, "output_type",
                            otype == LLMQ_DTYPE_COUNT ? json_null() : json_string(llmq_dtype_name(otype)));
        json_object_set_new(a.settings, "embedding_type",
                            etype == LLMQ_DTYPE_COUNT ? json_null() : json_string(llmq_dtype_name(etype)));
        json_object_set_new(a.settings, "pure", json_boolean(pure));
        json_object_set_new(a.settings, "tensor_types", ttj);
        if (llmq_qmethod_uses_gptq(o.method)) {
            json_object_set_new(a.settings, "damp", json_real(o.percdamp));
            json_object_set_new(a.settings, "act_order", json_boolean(o.act_order));
        }
        rc = run_gguf(&a);
        json_decref(a.settings);
        for (int i = 0; i < n_tt; i++) free((char *)tt[i].regex);
        return rc;
    }

    o.q = (struct llmq_qconfig){.bits = (int)bits, .group_size = (int)group, .sym = sym};
    o.static_groups = static_groups;
    o.group_aware = group_aware;
    o.fallback_rtn_per_channel = fallback && strcmp(fallback, "rtn-per-channel") == 0;
    o.out.force = force;
    o.out_dir = out;
    o.allow_requantize = allow_requant;

    struct llmq_model *m = NULL;
    json_t *rep = NULL;
    enum llmq_status st = llmq_model_load(model_path, &m);
    if (!st && llmq_quantize_check(m, &o)) { // the options do not fit this model: a usage error
        llmq_model_free(m);
        return usage_exit();
    }
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
        json_object_set_new(rep, "device", json_string(device_desc));
        if (json_path)
            st = llmq_write_json(json_path, rep, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    }
    json_decref(rep);
    llmq_model_free(m);
    return st ? 1 : 0;
}
