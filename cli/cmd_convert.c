/*
 * cli/cmd_convert.c — `llmq convert`: GGUF <-> Hugging Face directory, and GGUF -> GGUF at
 * f32 / f16 / bf16 (dequantizing a quantized model). The work is formats/convert/convert.h; this file parses
 * the flags, prints the summary on stdout and maps statuses to exit codes.
 */
#include "cli/args.h"
#include "cli/commands.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/convert/convert.h"
#include "formats/llama/arch.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// "5GB" (10^9, Hugging Face's convention), "500MiB" (2^20), "123" bytes; "0" = no sharding.
static bool parse_size(const char *s, uint64_t *out) {
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
                 {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return false;
    while (isspace((unsigned char)*end)) end++;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcasecmp(end, units[i].unit) == 0 && v * units[i].mult < 1.8e19) {
            *out = (uint64_t)(v * units[i].mult);
            return true;
        }
    return false;
}

int cmd_convert(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *to = "auto", *dtype = "f32", *shard = "5GB";
    bool force = false;
    const struct cli_flag flags[] = {
        {"model", CLI_STR, &model, NULL, "input: a GGUF file or a Hugging Face model directory (required)"},
        {"out", CLI_STR, &out, NULL, "output: a GGUF file or a directory to create (required)"},
        {"to", CLI_STR, &to, "auto",
         "output kind: gguf, hf, or auto (gguf if --out ends in .gguf, else the other format)"},
        {"dtype", CLI_STR, &dtype, "f32", "tensor type of the output: f32, f16 or bf16 (GGUF keeps 1-D tensors f32)"},
        {"max-shard-size", CLI_STR, &shard, "5GB",
         "HF output: bytes per safetensors file (GB = 1e9, GiB = 2^30; 0: one file)"},
        {"force", CLI_BOOL, &force, "off",
         "replace an existing output (a GGUF file, or a directory llmq wrote); never an input"},
    };
    const struct cli_cmd cmd = {
        "convert",
        "--model IN --out OUT [flags]",
        "Convert a LLaMA-family model (" LLMQ_ARCH_NAMES ") between GGUF and a Hugging Face directory\n"
        "(config.json, tokenizer.json, model.safetensors), or a GGUF to f32 / f16 / bf16 (dequantizing it).\n"
        "  GGUF -> HF:   --to hf     q/k rows un-permuted, tokenizer.json rebuilt from the GGUF vocabulary\n"
        "  HF -> GGUF:   --to gguf   llama.cpp's metadata, tokenizer and q/k permutation\n"
        "  GGUF -> GGUF: --to gguf   every key copied, quantized tensors dequantized bit-exactly",
        "The output appears only when complete (written under OUT.tmp.<pid>, then renamed); an existing\n"
        "OUT is refused without --force. GGUF -> HF -> GGUF at f32 reproduces every tensor and the tokenizer\n"
        "arrays. One line per tensor on stderr; a summary on stdout.\n"
        "Exit status: 0 ok, 1 conversion failed (the message names the file and tensor / key), 2 usage.",
        flags,
        (int)(sizeof(flags) / sizeof(flags[0])),
        0,
        0};
    const char *pos[1];
    int n_pos, rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;

    struct llmq_convert_opts o = llmq_convert_default_opts();
    if (!model || !out) {
        fprintf(stderr, "llmq convert: --model and --out are required\nrun 'llmq convert --help' for the flags\n");
        return 2;
    }
    if (!strcmp(to, "auto"))
        o.to = LLMQ_CONVERT_TO_AUTO;
    else if (!strcmp(to, "gguf"))
        o.to = LLMQ_CONVERT_TO_GGUF;
    else if (!strcmp(to, "hf"))
        o.to = LLMQ_CONVERT_TO_HF;
    else {
        fprintf(stderr, "llmq convert: --to must be gguf, hf or auto, not '%s'\n", to);
        return 2;
    }
    o.dtype = llmq_dtype_from_name(dtype);
    if (o.dtype != LLMQ_DTYPE_F32 && o.dtype != LLMQ_DTYPE_F16 && o.dtype != LLMQ_DTYPE_BF16) {
        fprintf(stderr, "llmq convert: --dtype must be f32, f16 or bf16, not '%s'\n", dtype);
        return 2;
    }
    if (!parse_size(shard, &o.max_shard_bytes)) {
        fprintf(stderr, "llmq convert: --max-shard-size '%s' is not a size like 5GB, 500MiB or 0\n", shard);
        return 2;
    }
    o.force = force;
    o.progress = llmq_log_get_level() <= LLMQ_LOG_INFO; // --quiet: no per-tensor lines

    struct llmq_convert_stats s;
    if (llmq_convert(model, out, &o, &s) != LLMQ_OK) return 1;
    printf("converted %s -> %s: %lld tensors, %lld parameters, %.2f MiB of %s tensor data in %d file(s), %.2f s\n",
           model, out, (long long)s.n_tensors, (long long)s.n_params, (double)s.bytes_out / 1048576.0,
           llmq_dtype_name(o.dtype), s.n_shards, s.seconds);
    return 0;
}
