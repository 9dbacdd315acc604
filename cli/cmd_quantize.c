/*
 * cli/cmd_quantize.c — `llmq quantize`: RTN / GPTQ / AWQ / AWQ+GPTQ, written as an AWQ, GPTQ or
 * fake-quant directory (quant/quantize.h has the pipeline, quant/export.h the formats).
 *
 *   llmq quantize --model M --method rtn|gptq|awq|awq+gptq --bits N --group-size G [--sym|--asym]
 *                 [--act-order] [--static-groups] [--damp 0.01] --format awq|gptq|fake --out DIR
 *                 [--calib SRC]... [--nsamples N] [--seqlen L] [--seed S] [--threads N] [--json FILE]
 *                 [--force] [--fallback rtn-per-channel] [--dry-run] [--expert-names hub|gptqmodel]
 *
 *   llmq quantize --model M --format gguf --gguf-type Q4_K_M --out OUT.gguf [--method rtn|gptq|awq|awq+gptq]
 *                 [--imatrix FILE.lcs|FILE.gguf|FILE.dat] [--calib SRC]... [--tensor-type REGEX=TYPE]...
 *                 [--output-type T] [--embedding-type T] [--pure] [--dry-run] [--no-provenance]
 *                 [--allow-requantize]   (--output-tensor-type / --token-embedding-type: llama-quantize's names)
 *                 [--mix llama|quality | --target-bpw X | --target-size BYTES] [--mix-exclude T,...]
 *
 * stderr: one line per linear (per tensor for gguf) and an ETA, totals at the end; stdout: the output
 * path and totals (--dry-run: the plan table of a gguf output, then the preflight plan of any format: sizes,
 * RAM, disk, time; quant/plan.h); --json FILE: settings, calibration provenance and the
 * per-layer / per-tensor table (atomic write). Every method and format is one call of
 * llmq_quantize_run (quant/quantize.h); this file parses the flags, refuses the combinations that are
 * wrong whatever the model (exit 2; llmq_quantize_check refuses the rest, also exit 2), and prints.
 */
#include "calib/model/model.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/spill.h"
#include "quant/checkpoint.h"
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
#define MAX_LEVELS 16

// After a usage error found against the model (its line is out): the hint, and exit status 2.
static int usage_exit(void) {
    fprintf(stderr, "run 'llmq quantize --help' for the flags and their defaults\n");
    return 2;
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

#define MOE_CALIB_DEFAULT "all"
#define MOE_FLOOR_DEFAULT "32" // LLMQ_MOE_TOKEN_FLOOR_DEFAULT
#define MOE_FLOOR_HELP                                                                                                 \
    "mixture of experts, --moe-calib routed: an expert the router sends fewer calibration tokens is rounded (RTN) "    \
    "instead of solved by GPTQ (gptq, awq+gptq), with a log line and \"fallback\" in --json (under all: no "           \
    "fallback). Default 32 (a judgement, not a measurement: below it an expert's Hessian has rank < 32 and GPTQ "      \
    "fits its few tokens)"
#define MOE_CALIB_HELP                                                                                                 \
    "mixture of experts: which calibration tokens each expert's statistics see: routed (the ones the router "          \
    "sends it) or all (every token through every expert for the statistics only, the block output still "              \
    "from the real routing: llm-compressor's calibrate_all_experts). Default all: on the random qwen3_moe / "          \
    "mixtral test models its KL divergence after GPTQ was lower in 7 of 8 runs (2 to 6 % lower with 4 x 64 "           \
    "calibration tokens, bench/moe_calib.sh, bench/README.md); it costs E / K times the experts' products in "         \
    "the calibration passes"

// Every flag as parsed (LONG_MIN / NAN / NULL: not given).
struct qargs {
    const char *model, *method, *format, *out, *json, *fallback, *gguf_type, *imatrix, *tt_dummy, *output_type,
        *embedding_type, *device, *bits_arg, *mix, *target_size, *mix_exclude, *grid, *sensitivity, *moe_calib,
        *expert_names;
    long bits, group, sens_windows, sens_seqlen, moe_floor;
    double damp, target_bpw, gptaq_alpha;
    bool gptaq;
    bool sym, asym, act_order, static_groups, group_aware, force, no_tseq, pure, dry_run, no_prov, allow_requant,
        resume, no_ckpt;
    struct cli_calib_args ca;
    const char *tts[MAX_TENSOR_TYPES]; // every --tensor-type, in order
    int n_tts;
    // a sweep: the levels of a comma list in --gguf-type or --bits (one level: no sweep), in one buffer
    char *levels[MAX_LEVELS], level_buf[256];
    int n_levels;
    const char *out_tmpl, *json_tmpl; // --out / --json as given: "{}" stands for the level in a sweep
    bool compare;
    long compare_chunks;
};

// Splits a sweep list ("Q6_K,Q4_K_M" / "8,4,3") into q->levels; NULL, or the usage message.
static const char *split_levels(struct qargs *q, const char *list, const char *flag, char *buf, size_t size) {
    if (snprintf(q->level_buf, sizeof(q->level_buf), "%s", list) >= (int)sizeof(q->level_buf)) {
        snprintf(buf, size, "%s: the list is too long", flag);
        return buf;
    }
    q->n_levels = 0;
    for (char *save = NULL, *t = strtok_r(q->level_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (q->n_levels == MAX_LEVELS) {
            snprintf(buf, size, "%s: at most %d levels", flag, MAX_LEVELS);
            return buf;
        }
        q->levels[q->n_levels++] = t;
    }
    if (q->n_levels == 0) {
        snprintf(buf, size, "%s '%s': no level in the list", flag, list);
        return buf;
    }
    return NULL;
}

// --bits N (or the first level of N,N,...) into q->bits; NULL, or the usage message.
static const char *parse_bits(const char *s, long *bits) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end) return "--bits must be an integer between 2 and 8, or a comma list such as 8,4,3";
    *bits = v;
    return NULL;
}

// The text of s up to its first ',' into buf (n bytes); returns buf.
static const char *first_level(const char *s, char *buf, size_t n) {
    snprintf(buf, n, "%.*s", (int)strcspn(s, ","), s);
    return buf;
}

// The sweep's flags: the list (from --gguf-type or --bits), the "{}" in --out / --json. NULL or the message.
static const char *sweep_flags(struct qargs *q, bool gguf, char *buf, size_t size) {
    const char *list = gguf ? q->gguf_type : q->bits_arg, *usage;
    q->out_tmpl = q->out;
    q->json_tmpl = q->json;
    q->n_levels = 1;
    if (!list) return q->compare ? "--compare needs a list of levels: --gguf-type A,B,... or --bits A,B,..." : NULL;
    if ((usage = split_levels(q, list, gguf ? "--gguf-type" : "--bits", buf, size))) return usage;
    for (int i = 0; !gguf && i < q->n_levels; i++) { // every level is checked as --bits N would be
        long b;
        if ((usage = parse_bits(q->levels[i], &b))) return usage;
        if (b < 2 || b > 8) return "--bits must be between 2 and 8 (every level of the list)";
    }
    if (!gguf) parse_bits(q->levels[0], &q->bits);
    if (gguf) q->gguf_type = q->levels[0];
    if (q->n_levels == 1) return q->compare ? "--compare needs at least two levels" : NULL;
    if (q->dry_run) return "--dry-run takes one level (one --gguf-type or --bits)";
    if (!q->out || !strstr(q->out, "{}") || (q->json && !strstr(q->json, "{}")))
        return "a sweep writes one output per level: --out (and --json) must hold {}, which becomes the level "
               "(e.g. --out model-{}.gguf)";
    return NULL;
}

// The path of template t for one level ("{}" replaced by it), into buf.
static const char *level_path(const char *t, const char *level, char *buf, size_t size) {
    const char *p = t ? strstr(t, "{}") : NULL;
    if (!p) return t;
    snprintf(buf, size, "%.*s%s%s", (int)(p - t), t, level, p + 2);
    return buf;
}

// The flag combinations that are wrong whatever the model: NULL, or the usage message (in buf when built).
// Sets o->method and (directory formats) o->out.format as it parses them.
// What needs the model's shapes is llmq_quantize_check's.
static const char *check_flags(struct qargs *q, bool gguf, struct llmq_quantize_opts *o, char *buf, size_t size) {
    enum llmq_qmethod *method = &o->method;
    if (!q->model) return "--model is required";
    if (!q->out && !q->dry_run) return gguf ? "--out FILE.gguf is required" : "--out DIR is required";
    if (!llmq_qmethod_parse(q->method, method)) return "--method must be rtn, gptq, awq or awq+gptq";
    if (!gguf && !llmq_export_format_parse(q->format, &o->out.format))
        return "--format must be awq, gptq, fake or gguf";
    if (gguf && (q->bits != LONG_MIN || q->group != LONG_MIN))
        return "--bits and --group-size do not apply to --format gguf (its block types fix them: choose --gguf-type)";
    if (!llmq_qmethod_uses_gptq(*method) &&
        (q->act_order || q->static_groups || q->group_aware || q->no_tseq || !isnan(q->damp))) {
        // GPTQ's flags mean nothing to rtn and awq: refuse them rather than ignore them
        const char *name = q->act_order       ? "act-order"
                           : q->static_groups ? "static-groups"
                           : q->group_aware   ? "act-group-aware"
                           : q->no_tseq       ? "no-true-sequential"
                                              : "damp";
        snprintf(buf, size, "--%s needs --method gptq or awq+gptq (it is a GPTQ option)", name);
        return buf;
    }
    if ((q->gptaq || !isnan(q->gptaq_alpha)) && *method != LLMQ_QMETHOD_GPTQ)
        return "--gptaq needs --method gptq (awq+gptq's Hessians come from the full-precision model already)";
    if (!isnan(q->gptaq_alpha) && !q->gptaq) return "--gptaq-alpha needs --gptaq";
    if (!isnan(q->gptaq_alpha) && !(q->gptaq_alpha > 0)) return "--gptaq-alpha must be > 0";
    if (q->grid && strcmp(q->grid, "minmax") && strcmp(q->grid, "mse") && strcmp(q->grid, "hmse"))
        return "--grid must be minmax, mse or hmse";
    if (q->grid && strcmp(q->grid, "minmax") && (gguf || !llmq_qmethod_uses_gptq(*method)))
        return "--grid mse / hmse needs --method gptq or awq+gptq and a directory format (awq, gptq, fake)";
    if (gguf && (q->sym || q->asym || q->static_groups || q->fallback))
        return "--sym, --asym, --static-groups and --fallback do not apply to --format gguf";
    if (q->group_aware && gguf) return "--act-group-aware needs a directory format (awq, gptq, fake), not gguf";
    if (q->group_aware && (q->act_order || q->static_groups))
        return "--act-group-aware excludes --act-order and --static-groups";
    if (q->group_aware && q->group == -1) return "--act-group-aware needs a group size (not -1)";
    if (gguf && !q->gguf_type) return "--format gguf needs --gguf-type (e.g. Q4_K_M)";
    if (!gguf &&
        (q->gguf_type || q->imatrix || q->n_tts || q->output_type || q->embedding_type || q->pure || q->no_prov))
        return "--gguf-type, --imatrix, --tensor-type, --output-type, --embedding-type, --pure and --no-provenance "
               "need --format gguf";
    if (!gguf && (q->mix || !isnan(q->target_bpw) || q->target_size))
        return "--mix, --target-bpw and --target-size need --format gguf";
    if (q->mix && strcmp(q->mix, "llama") && strcmp(q->mix, "quality")) return "--mix must be llama or quality";
    if (!isnan(q->target_bpw) && q->target_size) return "--target-bpw and --target-size exclude each other";
    if (q->mix && !strcmp(q->mix, "quality") && (!isnan(q->target_bpw) || q->target_size))
        return "--mix quality excludes --target-bpw and --target-size (a size target chooses every type itself)";
    if (!isnan(q->target_bpw) && !(q->target_bpw > 0 && q->target_bpw <= 32))
        return "--target-bpw must be a number of bits per weight in (0, 32]";
    if (!gguf && (q->bits < 2 || q->bits > 8)) return "--bits must be between 2 and 8";
    if (!gguf && (q->group == 0 || q->group < -1 || q->group > (1 << 20))) return "--group-size must be -1 or >= 1";
    if (q->sym && q->asym) return "--sym and --asym exclude each other";
    if (q->resume && q->no_ckpt) return "--resume and --no-checkpoint exclude each other";
    if (strcmp(q->moe_calib, "routed") && strcmp(q->moe_calib, "all")) return "--moe-calib must be routed or all";
    if (gguf && q->expert_names)
        return "--expert-names applies to --format gptq and awq (a GGUF names its experts blk.N.ffn_*_exps)";
    if (!gguf && q->expert_names && !llmq_expert_names_parse(q->expert_names, &o->out.expert_names))
        return "--expert-names must be hub or gptqmodel";
    if (q->moe_floor < 0) return "--moe-token-floor must be >= 0";
    if (q->resume && q->n_levels > 1) return "--resume continues one output: not a sweep (resume each level alone)";
    if (q->json && q->out && strcmp(q->json, q->out) == 0) return "--json and --out name the same path";
    if (!isnan(q->damp) && (q->damp < 0 || q->damp >= 1)) return "--damp must be in [0, 1)";
    if (q->fallback && strcmp(q->fallback, "none") && strcmp(q->fallback, "rtn-per-channel"))
        return "--fallback must be none or rtn-per-channel";
    return cli_calib_args_check(&q->ca);
}

// The GGUF options of the flags (--gguf-type, --output-type, --embedding-type, --tensor-type... into o->gguf.mix,
// tt holding the parsed overrides): NULL, or the usage message ("" when its line is out already).
static const char *gguf_flags(const struct qargs *q, struct llmq_quantize_opts *o, struct llmq_gguf_tensor_type *tt,
                              char *buf, size_t size) {
    struct llmq_gguf_mix_opts *mx = &o->gguf.mix;
    if (!llmq_gguf_ftype_parse(q->gguf_type, &mx->ftype)) {
        snprintf(buf, size, "--gguf-type '%s' is unknown; one of %s", q->gguf_type, llmq_gguf_ftype_list());
        return buf;
    }
    mx->output_type = mx->embedding_type = LLMQ_DTYPE_COUNT;
    if (q->output_type && !llmq_gguf_mix_type_ok(mx->output_type = llmq_dtype_from_name(q->output_type))) {
        snprintf(buf, size, "--output-type '%s' is not a type llmq can write into a GGUF", q->output_type);
        return buf;
    }
    if (q->embedding_type && !llmq_gguf_mix_type_ok(mx->embedding_type = llmq_dtype_from_name(q->embedding_type))) {
        snprintf(buf, size, "--embedding-type '%s' is not a type llmq can write into a GGUF", q->embedding_type);
        return buf;
    }
    mx->pure = q->pure;
    struct llmq_gguf_choose_opts *ch = &o->gguf.choose;
    if (q->target_size && (!llmq_parse_bytes(q->target_size, &ch->target_bytes) || !ch->target_bytes)) {
        snprintf(buf, size, "--target-size '%s' is not a size in bytes (e.g. 90000000, 85M)", q->target_size);
        return buf;
    }
    ch->mode = q->target_size || !isnan(q->target_bpw) ? LLMQ_GGUF_CHOICE_TARGET
               : q->mix && !strcmp(q->mix, "quality")  ? LLMQ_GGUF_CHOICE_QUALITY
                                                       : LLMQ_GGUF_CHOICE_MIX;
    o->gguf.target_bpw = isnan(q->target_bpw) ? 0 : q->target_bpw;
    if (q->mix_exclude && ch->mode == LLMQ_GGUF_CHOICE_MIX)
        return "--mix-exclude needs --mix quality, --target-bpw or --target-size";
    const char *sens = q->sensitivity ? q->sensitivity : "auto";
    if (strcmp(sens, "auto") && strcmp(sens, "uniform") && strcmp(sens, "measured"))
        return "--sensitivity must be auto, uniform or measured";
    if (q->sensitivity && strcmp(sens, "auto") && ch->mode == LLMQ_GGUF_CHOICE_MIX)
        return "--sensitivity needs --mix quality, --target-bpw or --target-size";
    if (!strcmp(sens, "measured") && q->ca.n_sources == 0)
        return "--sensitivity measured needs --calib (the windows the sensitivity is measured on)";
    // auto: measured for a size target when there are calibration windows (bench/README.md "gguf_choice")
    bool measured = !strcmp(sens, "measured") ||
                    (!strcmp(sens, "auto") && ch->mode == LLMQ_GGUF_CHOICE_TARGET && q->ca.n_sources > 0);
    ch->sensitivity = measured ? LLMQ_GGUF_SENS_MEASURED : LLMQ_GGUF_SENS_UNIFORM;
    if (q->sens_windows < 1 || q->sens_seqlen < 1) return "--sensitivity-windows and --sensitivity-seqlen must be >= 1";
    o->gguf.sens.n_windows = q->sens_windows;
    o->gguf.sens.seqlen = q->sens_seqlen;
    for (const char *p = q->mix_exclude; p && *p;) { // "q4_1,q8_0"
        char name[16];
        size_t n = strcspn(p, ",");
        snprintf(name, sizeof(name), "%.*s", (int)(n < sizeof(name) ? n : sizeof(name) - 1), p);
        enum llmq_dtype t = llmq_dtype_from_name(name);
        const struct llmq_dtype_traits *tr = llmq_dtype_traits(t);
        if (!tr || !tr->is_quant || !llmq_gguf_mix_type_ok(t) || t >= 64) {
            snprintf(buf, size, "--mix-exclude '%s': '%s' is not a block type llmq writes", q->mix_exclude, name);
            return buf;
        }
        ch->exclude |= 1ull << t;
        p += n + (p[n] == ',');
    }
    mx->overrides = tt;
    for (mx->n_overrides = 0; mx->n_overrides < q->n_tts; mx->n_overrides++)
        if (llmq_gguf_tensor_type_parse(q->tts[mx->n_overrides], &tt[mx->n_overrides])) return "";
    o->gguf.n_threads = (int)q->ca.threads;
    o->gguf.force = q->force;
    o->gguf.dry_run = q->dry_run;
    o->gguf.no_provenance = q->no_prov;
    o->gguf.allow_requantize = q->allow_requant;
    o->to_gguf = true;
    o->imatrix_path = q->imatrix;
    return NULL;
}

// The summary on stdout.
static void print_result(const struct qargs *q, const struct llmq_quantize_opts *o, json_t *rep) {
    json_t *t = json_object_get(rep, "totals");
    if (o->to_gguf) {
        bool imp = o->imatrix_path || (o->method == LLMQ_QMETHOD_RTN && o->calib.n_sources > 0);
        printf("output:    %s (gguf %s, %s%s)\n", q->out, llmq_gguf_ftype_name(o->gguf.mix.ftype), q->method,
               imp ? ", with importance" : "");
        if (t)
            printf("tensors:   %lld, %.2f MiB of tensor data, %.4f bits per weight, %lld fallback(s)\n",
                   (long long)json_integer_value(json_object_get(t, "tensors")),
                   (double)json_integer_value(json_object_get(t, "bytes")) / 1048576.0,
                   json_real_value(json_object_get(t, "bits_per_weight")),
                   (long long)json_integer_value(json_object_get(t, "fallbacks")));
    } else {
        printf("output:    %s (%s, %s %ld-bit, group %ld)\n", q->out, q->format, q->method, q->bits, q->group);
        printf("weights:   %lld in %lld linears, %.3f bits per weight, %lld bytes\n",
               (long long)json_integer_value(json_object_get(t, "weights")),
               (long long)json_integer_value(json_object_get(t, "linears")),
               json_real_value(json_object_get(t, "bits_per_weight")),
               (long long)json_integer_value(json_object_get(t, "output_bytes")));
    }
    fflush(stdout);
}

// Level i of a sweep into the options and q->out / q->json / q->bits (one level: nothing changes).
static void set_level(struct qargs *q, struct llmq_quantize_opts *o, int i, char (*paths)[2][4096]) {
    if (q->n_levels < 2) return;
    if (o->to_gguf)
        llmq_gguf_ftype_parse(q->levels[i], &o->gguf.mix.ftype); // checked by sweep_check
    else
        o->q.bits = (int)(q->bits = strtol(q->levels[i], NULL, 10));
    q->out = level_path(q->out_tmpl, q->levels[i], paths[i][0], sizeof(paths[i][0]));
    q->json = level_path(q->json_tmpl, q->levels[i], paths[i][1], sizeof(paths[i][1]));
    o->out_dir = q->out;
}

// Every level of a sweep against the model before any work (the options, the output path): NULL, or the
// failing level's index as a status (the error line is out). usage: the failure is the options' (exit 2).
static enum llmq_status sweep_check(struct qargs *q, struct llmq_quantize_opts *o, const struct llmq_model *m,
                                    char (*paths)[2][4096], bool *usage) {
    for (int i = 0; i < q->n_levels; i++) {
        set_level(q, o, i, paths);
        if (o->to_gguf && q->n_levels > 1 && !llmq_gguf_ftype_parse(q->levels[i], &o->gguf.mix.ftype)) {
            *usage = true;
            return llmq_errorf(LLMQ_ERR_ARG, "quantize: --gguf-type '%s' is unknown; one of %s", q->levels[i],
                               llmq_gguf_ftype_list());
        }
        if (llmq_quantize_check(m, o)) {
            *usage = true;
            return LLMQ_ERR_ARG;
        }
        bool exists;
        enum llmq_status st = q->n_levels > 1 ? llmq_output_check(q->model, q->out, !o->to_gguf, q->force, &exists) : 0;
        if (st) return st;
    }
    return LLMQ_OK;
}

// After a sweep with --compare: `llmq compare --base MODEL LEVEL... --kld --chunks N`; its exit status.
static int run_compare(const struct qargs *q, char (*paths)[2][4096]) {
    char chunks[32], *argv[MAX_LEVELS + 8];
    int n = 0;
    snprintf(chunks, sizeof(chunks), "%ld", q->compare_chunks);
    argv[n++] = "--base";
    argv[n++] = (char *)q->model;
    for (int i = 0; i < q->n_levels; i++) argv[n++] = paths[i][0];
    argv[n++] = "--kld";
    argv[n++] = "--chunks";
    argv[n++] = chunks;
    argv[n] = NULL;
    fflush(stdout);
    return cmd_compare(n, argv);
}

// Loads the model once, checks the options (every level's) against it (exit 2), runs the pipeline per level,
// prints, writes --json; a sweep's levels share what does not depend on the level (quant/quantize.h "Sweeps").
static int run(struct qargs *q, struct llmq_quantize_opts *o, const char *device_desc) {
    struct llmq_model *m = NULL;
    json_t *rep = NULL;
    struct llmq_quantize_shared shared = {0};
    static char paths[MAX_LEVELS][2][4096];
    bool usage = false;
    const char *inputs[2 + CLI_CALIB_MAX_SOURCES] = {q->model, q->imatrix},
                           *outputs[1] = {q->json && !strstr(q->json, "{}") ? q->json : NULL};
    for (int i = 0; i < q->ca.n_sources; i++) inputs[2 + i] = q->ca.sources[i];
    if (cli_guard(inputs, 2 + q->ca.n_sources, outputs, outputs[0] ? 1 : 0, q->force)) return 1;
    // a checkpoint left by an interrupted run is refused before any work unless --resume or --force
    if (o->checkpoint && !o->dry_run && q->n_levels == 1 && llmq_ckpt_check(q->out, q->resume, q->force)) return 1;
    enum llmq_status st = llmq_model_load(q->model, &m);
    if (!st) st = sweep_check(q, o, m, paths, &usage);
    if (usage) { // the options do not fit this model: a usage error
        llmq_model_free(m);
        return usage_exit();
    }
    o->shared = q->n_levels > 1 ? &shared : NULL;
    for (int i = 0; !st && i < q->n_levels; i++) {
        set_level(q, o, i, paths);
        if (q->n_levels > 1)
            llmq_info("quantize: sweep level %d/%d: %s -> %s", i + 1, q->n_levels, q->levels[i], q->out);
        st = llmq_quantize_run(m, o, &rep);
        if (!st && rep && !q->dry_run) print_result(q, o, rep);
        if (!st && rep && q->json) {
            json_object_set_new(rep, "device", json_string(device_desc));
            st = llmq_write_json(q->json, rep, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        }
        json_decref(rep);
        rep = NULL;
    }
    llmq_quantize_shared_free(&shared);
    llmq_model_free(m);
    if (st) return 1;
    return q->compare ? run_compare(q, paths) : 0;
}

// The parsed flags into the pipeline's options (after every check).
static void fill_opts(const struct qargs *q, bool gguf, struct llmq_quantize_opts *o) {
    llmq_spill_configure(q->ca.max_mem_bytes);
    o->calib.sources = q->ca.sources;
    o->calib.n_sources = q->ca.n_sources;
    o->calib.nsamples = q->ca.nsamples;
    o->calib.seqlen = q->ca.seqlen;
    o->calib.seed = (uint64_t)q->ca.seed;
    o->micro_batch = q->ca.micro;
    o->max_vram = q->ca.max_vram_bytes;
    o->n_threads = (int)q->ca.threads;
    o->percdamp = isnan(q->damp) ? 0.01f : (float)q->damp;
    o->true_sequential = !q->no_tseq;
    o->act_order = q->act_order;
    o->gptaq = q->gptaq;
    if (!isnan(q->gptaq_alpha)) o->gptaq_alpha = (float)q->gptaq_alpha;
    o->out_dir = q->out;
    o->checkpoint = !q->no_ckpt; // a dry run writes none; its plan counts the one the run would keep
    o->moe_calib_all = strcmp(q->moe_calib, "all") == 0;
    o->moe_token_floor = q->moe_floor;
    o->resume = q->resume;
    o->dry_run = q->dry_run;
    if (!gguf) {
        o->q = (struct llmq_qconfig){.bits = (int)q->bits, .group_size = (int)q->group, .sym = q->sym};
        o->static_groups = q->static_groups;
        o->group_aware = q->group_aware;
        o->gptq_grid = !q->grid || !strcmp(q->grid, "minmax") ? LLMQ_GPTQ_GRID_MINMAX
                       : !strcmp(q->grid, "mse")              ? LLMQ_GPTQ_GRID_MSE
                                                              : LLMQ_GPTQ_GRID_HMSE;
        o->fallback_rtn_per_channel = q->fallback && strcmp(q->fallback, "rtn-per-channel") == 0;
        o->out.force = q->force;
        o->allow_requantize = q->allow_requant;
    }
}

// Quantize's flag table, help text and parsing into *q: cli_parse's status (0: go on, 1: --help printed, 2: usage).
// The long help of `llmq quantize --help` after the flags (the columns of its per-linear lines).
static const char QUANTIZE_HELP[] =
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
    "Exit status: 0 ok, 1 error, 2 usage.";

static int parse_flags(int argc, char **argv, struct qargs *q) {
    const struct cli_flag flags[] = {
        {"model", CLI_STR, &q->model, NULL, "the model: GGUF file or Hugging Face directory (required)"},
        {"method", CLI_STR, &q->method, "rtn", "rtn | gptq | awq | awq+gptq"},
        {"bits", CLI_STR, &q->bits_arg, "4",
         "bits per weight code, 2..8 (awq format: 4; gptq format: 2, 3, 4, 8; not gguf); a comma list (8,4,3) "
         "sweeps: one output per level"},
        {"group-size", CLI_INT, &q->group, "128",
         "input columns per (scale, zero) group; -1 = one per output row (not gguf: its blocks are fixed)"},
        {"sym", CLI_BOOL, &q->sym, "off", "symmetric grid (zero fixed at 2^(bits-1))"},
        {"asym", CLI_BOOL, &q->asym, "on (unless --sym)", "asymmetric grid with a zero point"},
        {"act-order", CLI_BOOL, &q->act_order, "off",
         "GPTQ: columns in order of decreasing Hessian diagonal (gguf: every block's grid fixed first from the "
         "original weights)"},
        {"static-groups", CLI_BOOL, &q->static_groups, "off", "GPTQ: group parameters from the original weights"},
        {"act-group-aware", CLI_BOOL, &q->group_aware, "off",
         "GPTQ: GPTQModel's act_group_aware order (GAR): whole groups by decreasing max Hessian diagonal, the "
         "columns of a group likewise; groups stay contiguous, so g_idx is plain and --format awq holds it "
         "(not gguf; excludes --act-order, --static-groups)"},
        {"grid", CLI_STR, &q->grid, "minmax",
         "GPTQ into awq / gptq / fake: each group's (scale, zero): minmax (the reference), mse (the reference's "
         "mse search: shrink grid 1..0.21, min sum |w-q|^2.4), hmse (the same grid, min sum diag(H)(w-q)^2)"},
        {"gptaq", CLI_BOOL, &q->gptaq, "off",
         "GPTQ (any format, GGUF too): GPTAQ (Li et al. 2025): each linear's target is the full-precision model's "
         "output on its full-precision input, ||W X_fp - Q X_q||^2, instead of ||(W - Q) X_q||^2. Cost: a second "
         "activation stream (N x n_embd f32), one block's fp linear inputs (N x (3 n_embd + n_ff) f32 on a llama "
         "block; both under --max-memory), one more block pass per block, 2 C^3 flops more per linear; steps 5-7 "
         "on the CPU. Resumable (the checkpoint holds both streams). Into GGUF the encoder-alone fallback "
         "(gptq:rtn) is off with it"},
        {"gptaq-alpha", CLI_FLOAT, &q->gptaq_alpha, "0.25",
         "GPTAQ: scale of the asymmetric term (upstream's 0.25; 1 = the plain closed form)"},
        {"no-true-sequential", CLI_BOOL, &q->no_tseq, "off",
         "GPTQ: collect all Hessians of a block in one pass instead of [qkv] -> [o] -> [gate,up] -> [down]"},
        {"damp", CLI_FLOAT, &q->damp, "0.01", "GPTQ: damping, a fraction of the mean Hessian diagonal"},
        {"moe-calib", CLI_STR, &q->moe_calib, MOE_CALIB_DEFAULT, MOE_CALIB_HELP},
        {"moe-token-floor", CLI_INT, &q->moe_floor, MOE_FLOOR_DEFAULT, MOE_FLOOR_HELP},
        {"expert-names", CLI_STR, &q->expert_names, "hub",
         "mixture of experts into --format gptq / awq: the names of the router and experts. hub: the family's "
         "checkpoint names (mixtral model.layers.N.block_sparse_moe.experts.E.w1 / w3 / w2, as the Hub's GPTQ / "
         "AWQ Mixtrals and vLLM's loader have them); gptqmodel: GPTQModel 7.7's (mixtral mlp.gate and "
         "mlp.experts.E.gate_proj / up_proj / down_proj: GPTQModel.load refuses or, for awq, silently drops the "
         "hub names). qwen3_moe / qwen2_moe: the same names either way. Not for a dense model, fake or gguf"},
        {"format", CLI_STR, &q->format,
         "the method's packed format: awq for --method awq (4 bits with a group size), else gptq (2, 3, 4, 8 "
         "bits), else fake; fake with --fallback rtn-per-channel; gguf when --gguf-type is given or --out ends "
         "in .gguf",
         "awq | gptq (packed integer codes) | fake (dequantized weights in the model's dtype) | gguf"},
        {"out", CLI_STR, &q->out, NULL,
         "output directory, or the .gguf file (required, except with --dry-run; refused if it exists unless --force)"},
        {"calib", CLI_STR, &q->ca.calib_help_dummy, "none",
         CLI_CALIB_SOURCE_HELP ". Required except for rtn; with rtn into gguf it gathers the importance matrix"},
        CLI_CALIB_FLAGS(&q->ca),
        {"threads", CLI_INT, &q->ca.threads, "the number of CPUs", "threads (forward pass, OpenBLAS, GGUF encoders)"},
        {"device", CLI_STR, &q->device, "auto",
         CLI_DEVICE_HELP " (forward passes, statistics, AWQ's search and the GPTQ solve into awq / gptq / fake; the "
                         "GGUF encoders and the GPTQ solve into gguf run on the CPU)"},
        {"json", CLI_STR, &q->json, NULL, "write settings, calibration provenance and the per-layer table here"},
        {"force", CLI_BOOL, &q->force, "off",
         "replace existing outputs (--out: a directory llmq wrote, or a .gguf file; --json); never an input"},
        {"resume", CLI_BOOL, &q->resume, "off",
         "continue an interrupted run from its checkpoint OUT.partial (the same command otherwise; a checkpoint "
         "of other inputs or options is refused naming what differs); without one, start at the beginning"},
        {"no-checkpoint", CLI_BOOL, &q->no_ckpt, "off",
         "keep no checkpoint (by default OUT.partial holds every finished block and the next block's inputs, "
         "written after each block, removed on success; rtn into gguf: the output itself as it streams, committed "
         "every 16 MiB)"},
        {"fallback", CLI_STR, &q->fallback, "none",
         "none: refuse a layer whose in-features the group size does not tile; rtn-per-channel: round that "
         "layer per output channel instead (only --format fake can hold it; not gguf)"},
        {"gguf-type", CLI_STR, &q->gguf_type, NULL,
         "gguf: llama.cpp file type (the per-tensor mix of llama-quantize): Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_0, "
         "Q5_1, Q4_K_M, Q4_K_S, Q4_0, Q4_1, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K, IQ4_NL, IQ4_XS, F16, BF16, F32 (required); "
         "a comma list (Q6_K,Q4_K_M,Q3_K_M) sweeps: one file per level, rtn's importance gathered once"},
        {"compare", CLI_BOOL, &q->compare, "off",
         "after a sweep, run `llmq compare --kld` of the model against every level written"},
        {"compare-chunks", CLI_INT, &q->compare_chunks, "20", "--chunks of that comparison"},
        {"imatrix", CLI_STR, &q->imatrix, NULL,
         "gguf: importance matrix: llmq statistics (.lcs from llmq calib) or a llama-imatrix file (GGUF, or the "
         "legacy .dat; told apart by content); a mixture of experts: a llama-imatrix file (per-expert rows), with "
         "--method rtn"},
        {"tensor-type", CLI_STR, &q->tt_dummy, "none",
         "gguf, repeatable: REGEX=TYPE, tensors whose name matches REGEX (POSIX extended, lower-cased) get TYPE"},
        {"output-type", CLI_STR, &q->output_type, "from the mix", "gguf: type of output.weight (token_embd when tied)"},
        {"embedding-type", CLI_STR, &q->embedding_type, "from the mix", "gguf: type of token_embd.weight"},
        {"output-tensor-type", CLI_ALIAS, NULL, "output-type", "llama-quantize's name for it"},
        {"token-embedding-type", CLI_ALIAS, NULL, "embedding-type", "llama-quantize's name for it"},
        {"allow-requantize", CLI_BOOL, &q->allow_requant, "off",
         "quantize tensors that are already quantized (e.g. a Q4_1 GGUF input) instead of refusing them, as "
         "llama-quantize --allow-requantize does: the result is worse than quantizing the f32 / f16 original"},
        {"pure", CLI_BOOL, &q->pure, "off", "gguf: no mix rules, the file type's default type for every tensor"},
        {"mix", CLI_STR, &q->mix, "llama",
         "gguf: llama: llama-quantize's per-tensor types; quality: per tensor, the block type of no larger size "
         "with the lowest importance-weighted error on that tensor (quant/gguf_choose.h)"},
        {"target-bpw", CLI_FLOAT, &q->target_bpw, "none",
         "gguf: one type per block linear (a mixture of experts: per stacked expert tensor) minimising the summed "
         "importance-weighted error under this budget of tensor data bits per weight (token_embd / output: --mix "
         "quality of the --gguf-type mix)"},
        {"target-size", CLI_STR, &q->target_size, "none",
         "gguf: the same budget as a tensor data size in bytes (K, M, G suffixes: powers of 1024)"},
        {"sensitivity", CLI_STR, &q->sensitivity, "auto",
         "gguf, --mix quality / --target-*: uniform: every block linear's error counts alike; measured: each "
         "linear's error scaled to KLD units by the KLD of the model's output with that linear alone quantized in "
         "the mix's type, measured on the first calibration windows (needs --calib; quant/gguf_choose.h; not for a "
         "mixture of experts); auto: measured for --target-* with --calib, else uniform"},
        {"sensitivity-windows", CLI_INT, &q->sens_windows, "4",
         "gguf, --sensitivity measured: calibration windows it is measured on (at most --nsamples)"},
        {"sensitivity-seqlen", CLI_INT, &q->sens_seqlen, "256",
         "gguf, --sensitivity measured: tokens of each window (at most --seqlen)"},
        {"mix-exclude", CLI_STR, &q->mix_exclude, "none",
         "gguf: block types --mix quality / --target-* may not choose, comma separated (e.g. q4_1 for a model "
         "dequantized from Q4_1, which that type reproduces exactly)"},
        {"dry-run", CLI_BOOL, &q->dry_run, "off",
         "write nothing; print the preflight plan: output size, peak RAM, VRAM (--device cuda), spill and "
         "checkpoint disk with the free space there, and an estimated time per stage from rates measured on this "
         "machine (quant/plan.h; --json: the same as \"preflight\"); gguf also every tensor's type, size and bits "
         "per weight"},
        {"no-provenance", CLI_BOOL, &q->no_prov, "off",
         "gguf: write no llmq.* keys (then --method rtn gives llama-quantize's bytes)"},
    };
    const struct cli_cmd cmd = {
        "quantize",
        "--model M --method METHOD --out DIR|FILE.gguf [flags]",
        "Quantize the linear layers of a model with RTN, GPTQ, AWQ or AWQ+GPTQ, or write a GGUF quant.",
        QUANTIZE_HELP,
        flags,
        (int)(sizeof(flags) / sizeof(flags[0])),
        0,
        0};
    const char *pos[1];
    int n_pos;
    return cli_parse(&cmd, argc, argv, pos, &n_pos);
}

int cmd_quantize(int argc, char **argv) {
    struct qargs q = {.method = "rtn",
                      .device = "auto",
                      .bits = LONG_MIN,
                      .group = LONG_MIN,
                      .damp = NAN,
                      .gptaq_alpha = NAN,
                      .compare_chunks = 20,
                      .target_bpw = NAN,
                      .sens_windows = 4,
                      .sens_seqlen = 256,
                      .moe_calib = MOE_CALIB_DEFAULT,
                      .moe_floor = LLMQ_MOE_TOKEN_FLOOR_DEFAULT};
    cli_calib_args_init(&q.ca);
    int rc = cli_calib_take_sources(&q.ca, &argc, argv);
    if (!rc) rc = cli_take_repeated("tensor-type", &argc, argv, q.tts, MAX_TENSOR_TYPES, &q.n_tts);
    if (rc) return rc;
    rc = parse_flags(argc, argv, &q);
    if (rc) return rc == 1 ? 0 : rc;
    static char usage_buf[512];
    // the first level decides the default format; sweep_flags checks every level
    const char *usage = q.bits_arg ? parse_bits(first_level(q.bits_arg, usage_buf, sizeof(usage_buf)), &q.bits) : NULL;
    if (usage) {
        fprintf(stderr, "llmq quantize: %s\n", usage);
        return usage_exit();
    }
    if (!q.format)
        q.format = default_format(q.method, q.gguf_type || (q.out && llmq_ends_with(q.out, ".gguf")), q.bits, q.group,
                                  q.fallback);
    bool gguf = strcmp(q.format, "gguf") == 0;
    if (!gguf && q.bits == LONG_MIN) q.bits = 4;
    if (!gguf && q.group == LONG_MIN) q.group = 128;

    struct llmq_quantize_opts o = llmq_quantize_default_opts();
    struct llmq_gguf_tensor_type tt[MAX_TENSOR_TYPES];
    usage = sweep_flags(&q, gguf, usage_buf, sizeof(usage_buf));
    if (!usage) usage = check_flags(&q, gguf, &o, usage_buf, sizeof(usage_buf));
    if (!usage && gguf) usage = gguf_flags(&q, &o, tt, usage_buf, sizeof(usage_buf));
    char device_desc[320];
    if (usage) {
        if (*usage) fprintf(stderr, "llmq quantize: %s\n", usage);
        rc = usage_exit();
    } else if (!(rc = cli_device(q.device, &o.backend, device_desc, sizeof(device_desc)))) {
        fill_opts(&q, gguf, &o);
        rc = run(&q, &o, device_desc);
    }
    for (int i = 0; gguf && i < o.gguf.mix.n_overrides; i++) free((char *)tt[i].regex);
    return rc;
}
