// cli/main.c — the llmq executable: dispatch to subcommands. Only cli/ calls exit().
#include "cli/commands.h"
#include "common/io.h"

#include <stdio.h>
#include <string.h>

char *openblas_get_config(void);
char *openblas_get_corename(void);

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct command commands[] = {
    {"inspect", cmd_inspect, "show architecture, metadata and tensors of a GGUF / safetensors / HF model"},
    {"quantize", cmd_quantize, "quantize a model (RTN / GPTQ / AWQ) to AWQ, GPTQ or fake-quant safetensors"},
    {"calib", cmd_calib, "gather calibration statistics (Hessians, imatrix) and save them"},
    {"eval", cmd_eval, "perplexity and KL divergence of a model on a text file"},
    {"compare", cmd_compare, "perplexity / KLD of several quantized artifacts against their base, in one table"},
    {"generate", cmd_generate, "greedy text generation (a sanity tool)"},
    {"convert", cmd_convert, "convert between GGUF and Hugging Face safetensors (f32/f16/bf16)"},
    {"devices", cmd_devices, "list the CUDA devices llmq can use"},
};
static const int n_commands = (int)(sizeof(commands) / sizeof(commands[0]));

static void print_help(FILE *out) {
    fprintf(out, "llmq %s — offline post-training quantization for large language models\n\n", LLMQ_VERSION);
    fprintf(out, "usage: llmq COMMAND [flags]\n\ncommands:\n");
    for (int i = 0; i < n_commands; i++) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'llmq COMMAND --help' lists every flag of a command with its default.\n");
    fprintf(out, "  --help     print this help\n  --version  print the version and the OpenBLAS kernels in use\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_help(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        print_help(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("llmq %s\n", LLMQ_VERSION);
        // the CPU kernels in use decide float32 summation order, so they belong to a run's description
        printf("%s; kernels in use: %s (OPENBLAS_CORETYPE chooses others)\n", openblas_get_config(),
               openblas_get_corename());
        return 0;
    }
    llmq_guard_begin_run(); // inputs recorded, SIGINT / SIGTERM remove the temporary outputs (common/io.h)
    for (int i = 0; i < n_commands; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "llmq: unknown command '%s' (run 'llmq --help' for the list)\n", argv[1]);
    return 2;
}
