/*
 * cli/cmd_calib.c — `llmq calib`: run the calibration pass of calib/calib.h over a model and save the
 * statistics (.lcs, layout in calib/calib.h) and/or a llama.cpp imatrix (GGUF when the name ends in .gguf,
 * else the legacy .dat).
 *
 *   llmq calib --model M --calib SRC [--calib SRC]... [--nsamples N] [--seqlen L] [--seed S]
 *              [--out FILE] [--no-xtx] [--imatrix-out FILE] [--threads N]
 *   llmq calib --model M --imatrix-in FILE [--imatrix-out FILE]     (read an imatrix, print, rewrite)
 *   llmq calib --model M --stats-in FILE [--imatrix-out FILE]        (read a stats file, print, convert)
 *
 * With --device cuda the decoder blocks of a llama / mistral / qwen2 / qwen3 model run whole on the device with the
 * statistics summed there (calib/calib.h "Decoder blocks"; never run on a GPU yet).
 * stdout: a summary (sequences, tokens, per-block mean x² of each input); stderr: progress.
 */
#include "calib/calib.h"
#include "calib/model/model.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/io.h"
#include "common/log.h"
#include "common/spill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void openblas_set_num_threads(int n);

_Static_assert(CLI_CALIB_MAX_SOURCES == LLMQ_CALIB_MAX_SOURCES, "cli/args.h and calib/calib.h disagree");

static void print_summary(const struct llmq_calib_stats *s) {
    static const char *slot[LLMQ_CALIB_N_SLOTS] = {"attn_in", "attn_out", "ffn_in", "ffn_down_in"};
    printf("statistics: %lld layers, %lld sequences x %lld tokens%s\n", (long long)s->n_layer, (long long)s->n_seq,
           (long long)s->seqlen, s->with_xtx ? ", with XᵀX" : "");
    for (int64_t l = 0; l < s->n_layer; l++) {
        printf("blk.%lld", (long long)l);
        for (int k = 0; k < LLMQ_CALIB_N_SLOTS; k++) {
            const struct llmq_calib_input *in = &s->in[l * LLMQ_CALIB_N_SLOTS + k];
            double ms = 0;
            for (int64_t c = 0; in->sum_sq && c < in->n_in; c++) ms += in->sum_sq[c];
            ms = in->count > 0 ? ms / (double)(in->count * in->n_in) : 0;
            printf("  %s mean x² %.4g", slot[k], ms);
        }
        printf("\n");
    }
}

int cmd_calib(int argc, char **argv) {
    const char *model_path = NULL, *out = NULL, *imat_out = NULL, *imat_in = NULL, *stats_in = NULL, *device = "auto";
    bool no_xtx = false, force = false;
    struct cli_calib_args ca;
    cli_calib_args_init(&ca);
    int rc = cli_calib_take_sources(&ca, &argc, argv);
    if (rc) return rc;
    const struct cli_flag flags[] = {
        {"model", CLI_STR, &model_path, NULL, "the model: GGUF file or Hugging Face directory (required)"},
        {"calib", CLI_STR, &ca.calib_help_dummy, "none", CLI_CALIB_SOURCE_HELP},
        CLI_CALIB_FLAGS(&ca),
        {"threads", CLI_INT, &ca.threads, "the number of CPUs", "threads"},
        {"device", CLI_STR, &device, "auto", CLI_DEVICE_HELP},
        {"out", CLI_STR, &out, NULL, "write the statistics file (.lcs) here"},
        {"no-xtx", CLI_BOOL, &no_xtx, "off", "do not gather/save XᵀX (only mean |x|, Σx², counts)"},
        {"imatrix-out", CLI_STR, &imat_out, NULL,
         "also write a llama.cpp imatrix here: GGUF (llama-imatrix's default) if the name ends in .gguf, else the "
         "legacy .dat (a mixture of experts: per-expert rows of routed tokens, as llama-imatrix writes them)"},
        {"imatrix-in", CLI_STR, &imat_in, NULL,
         "read a llama.cpp imatrix (GGUF or .dat, told apart by content) instead of running calibration"},
        {"stats-in", CLI_STR, &stats_in, NULL, "read a statistics file instead of running calibration"},
        {"force", CLI_BOOL, &force, "off", "replace existing --out / --imatrix-out files (never an input)"},
    };
    const struct cli_cmd cmd = {
        "calib",
        "--model M --calib SRC [flags]",
        "Gather per-linear input statistics (XᵀX, mean |x|, Σx², counts) block by block and save them.",
        "XᵀX is summed in f64 over micro-batches of 256 rows (an f32 SYRK per micro-batch, on --device); GPTQ's\n"
        "H = 2/n_seq · XᵀX. The .lcs layout is documented in calib/calib.h. Exit: 0 ok, 1 error, 2 usage.",
        flags,
        (int)(sizeof(flags) / sizeof(flags[0])),
        0,
        0};
    const char *pos[1];
    int n_pos;
    rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    const char *usage = NULL;
    int n_sources = ca.n_sources, n_inputs = (n_sources > 0) + (imat_in != NULL) + (stats_in != NULL);
    const char *const *sources = ca.sources;
    if (!model_path)
        usage = "--model is required";
    else if (n_inputs != 1)
        usage = "exactly one of --calib, --imatrix-in, --stats-in is needed";
    else if (!out && !imat_out && n_sources > 0)
        usage = "--out or --imatrix-out is needed";
    else
        usage = cli_calib_args_check(&ca);
    if (usage) {
        fprintf(stderr, "llmq calib: %s\nrun 'llmq calib --help' for the flags and their defaults\n", usage);
        return 2;
    }
    const char *inputs[3 + CLI_CALIB_MAX_SOURCES] = {model_path, imat_in, stats_in}, *outputs[2] = {out, imat_out};
    for (int i = 0; i < n_sources; i++) inputs[3 + i] = sources[i];
    if (cli_guard(inputs, 3 + n_sources, outputs, 2, force)) return 1;
    enum llmq_backend backend = LLMQ_BACKEND_CPU;
    char device_desc[320];
    if (n_sources > 0 && (rc = cli_device(device, &backend, device_desc, sizeof(device_desc)))) return rc;
    openblas_set_num_threads((int)ca.threads);
    llmq_spill_configure(ca.max_mem_bytes);
    struct llmq_model *m = NULL;
    struct llmq_calib_data d = {0};
    struct llmq_calib_stats s = {0};
    enum llmq_status st = llmq_model_load(model_path, &m);
    if (st) goto done;
    if (imat_in)
        st = llmq_calib_imatrix_load(imat_in, m, &s);
    else if (stats_in)
        st = llmq_calib_stats_load(stats_in, &s);
    else {
        struct llmq_calib_opts co = {.sources = sources,
                                     .n_sources = n_sources,
                                     .nsamples = ca.nsamples,
                                     .seqlen = ca.seqlen,
                                     .seed = (uint64_t)ca.seed,
                                     .n_threads = (int)ca.threads,
                                     .backend = backend};
        if (!(st = llmq_calib_data_load(m, &co, &d)) &&
            !(st = llmq_calib_stats_init(m, !no_xtx, 0, m->hp.n_layer, &s))) {
            s.backend = backend;
            s.max_vram = ca.max_vram_bytes;
            st = llmq_calib_run(m, &d, (int)ca.threads, ca.micro, &s);
        }
        if (!st)
            printf("calibration: %lld x %lld tokens, tokens sha256 %s\n", (long long)d.n_seq, (long long)d.seqlen,
                   d.tokens_sha256);
        for (int i = 0; !st && i < d.n_src; i++)
            printf("source:      %s (%s) sha256 %s, %lld tokens\n", d.src[i].arg,
                   d.src[i].path ? d.src[i].path : "model", d.src[i].sha256[0] ? d.src[i].sha256 : "-",
                   (long long)d.src[i].n_tokens);
    }
    if (st) goto done;
    if (s.n_layer != m->hp.n_layer) {
        st = llmq_errorf(LLMQ_ERR_ARG, "calib: the statistics have %lld layers, %s has %lld", (long long)s.n_layer,
                         m->path, (long long)m->hp.n_layer);
        goto done;
    }
    print_summary(&s);
    if (out && (st = llmq_calib_stats_save(&s, out))) goto done;
    if (out) printf("stats:       %s\n", out);
    if (imat_out) {
        // the dataset: the first --calib source, or the one the imatrix read names
        const char *ds = n_sources ? sources[0] : s.dataset ? s.dataset : "";
        size_t n = strlen(imat_out);
        bool gguf = n >= 5 && strcmp(imat_out + n - 5, ".gguf") == 0;
        if ((st = gguf ? llmq_calib_imatrix_save_gguf(&s, imat_out, ds) : llmq_calib_imatrix_save(&s, imat_out, ds)))
            goto done;
    }
    if (imat_out) printf("imatrix:     %s\n", imat_out);
done:
    llmq_calib_stats_free(&s);
    llmq_calib_data_free(&d);
    llmq_model_free(m);
    return st ? 1 : 0;
}
