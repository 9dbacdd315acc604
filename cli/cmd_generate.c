/*
 * cli/cmd_generate.c — `llmq generate --model M --prompt TEXT -n N`: greedy decoding, a sanity tool
 * for the model loader, the tokenizer and the forward pass (calib/model/model.h, calib/tokenizer/tokenizer.h,
 * calib/model/forward.h).
 *
 * The prompt is tokenized with the model's BOS rule (llama.cpp add_special; --no-bos turns it off)
 * and control-token texts such as "<|im_start|>" parsed as tokens; an empty prompt starts from BOS.
 * Each step re-runs the prefill over the whole sequence and takes the argmax of the last logits
 * (no KV cache: correctness over speed); generation stops after N tokens or at EOS.
 * stdout: the prompt text followed by the decoded continuation (piece by piece, as llama.cpp's
 * token_to_piece renders it; control tokens are not printed), then a newline. For an empty prompt
 * the space that SentencePiece puts before the first word is dropped, as llama.cpp's detokenizer
 * does. stderr: the token counts and speed.
 */
#include "calib/model/forward.h"
#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/log.h"
#include "common/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = "";
    long n_predict = 64, threads = 0;
    bool no_bos = false, ignore_eos = false;
    const struct cli_flag flags[] = {
        {"model", CLI_STR, &model_path, "(required)", "GGUF file or Hugging Face model directory"},
        {"prompt", CLI_STR, &prompt, "\"\"", "text to continue (\"\" starts from BOS)"},
        {"n-predict", CLI_INT, &n_predict, "64", "tokens to generate (short form: -n N)"},
        {"threads", CLI_INT, &threads, "0", "CPU threads (0: all online cores)"},
        {"no-bos", CLI_BOOL, &no_bos, "false", "do not add BOS / EOS to the prompt by the model's rules"},
        {"ignore-eos", CLI_BOOL, &ignore_eos, "false", "keep generating after the EOS token"},
    };
    const struct cli_cmd cmd = {
        .name = "generate",
        .usage = "--model M [--prompt TEXT] [-n N] [flags]",
        .summary = "greedy text generation (a sanity tool)",
        .details = "Greedy (argmax) decoding on the CPU. Each step re-runs the whole sequence (no KV cache).\n"
                   "-n N is short for --n-predict N.",
        .flags = flags,
        .n_flags = (int)(sizeof flags / sizeof flags[0]),
        .min_pos = 0,
        .max_pos = 0,
    };
    // "-n N" / "-n=N" -> "--n-predict ..." (the flag parser takes long names only)
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    char *n_eq = NULL;
    if (!args) {
        fprintf(stderr, "llmq generate: out of memory\n");
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        args[i] = argv[i];
        if (strcmp(argv[i], "-n") == 0)
            args[i] = "--n-predict";
        else if (strncmp(argv[i], "-n=", 3) == 0 && !n_eq && (n_eq = malloc(strlen(argv[i]) + 16))) {
            snprintf(n_eq, strlen(argv[i]) + 16, "--n-predict=%s", argv[i] + 3);
            args[i] = n_eq;
        }
    }
    int pr = cli_parse(&cmd, argc, args, NULL, &(int){0});
    free(args);
    free(n_eq);
    if (pr == 1) return 0;
    if (pr == 2) return 2;
    if (!model_path) {
        fprintf(stderr, "llmq generate: --model is required\n");
        cli_print_help(&cmd, stderr);
        return 2;
    }
    if (n_predict < 0 || n_predict > (1L << 20)) {
        fprintf(stderr, "llmq generate: --n-predict %ld is out of range [0, 1048576]\n", n_predict);
        return 2;
    }
    if (threads <= 0) threads = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;

    int rc = 1;
    struct llmq_model *m = NULL;
    struct llmq_forward *f = NULL;
    int32_t *ids = NULL, *seq = NULL;
    float *logits = NULL;
    int64_t n_ids = 0;
    if (llmq_model_load(model_path, &m) != LLMQ_OK) goto done;
    if (!m->tok) {
        llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: the model has no tokenizer: generate needs one", model_path);
        goto done;
    }
    if (llmq_tokenize(m->tok, prompt, strlen(prompt), !no_bos, true, &ids, &n_ids) != LLMQ_OK) goto done;
    int32_t bos = llmq_tokenizer_bos(m->tok), eos = llmq_tokenizer_eos(m->tok);
    bool empty_prompt = n_ids == 0 || (n_ids == 1 && ids[0] == bos && prompt[0] == '\0');
    if (n_ids == 0) {
        if (bos < 0) {
            llmq_errorf(LLMQ_ERR_ARG, "%s: empty prompt and the model has no BOS token", model_path);
            goto done;
        }
        free(ids);
        ids = malloc(sizeof(int32_t));
        if (!ids) goto done;
        ids[0] = bos;
        n_ids = 1;
    }
    const int64_t total = n_ids + n_predict, V = m->hp.n_vocab;
    if (m->hp.n_ctx_train > 0 && total > m->hp.n_ctx_train)
        llmq_warn("%s: %lld tokens exceed the training context of %lld", model_path, (long long)total,
                  (long long)m->hp.n_ctx_train);
    seq = malloc((size_t)total * sizeof(int32_t));
    logits = malloc((size_t)V * sizeof(float));
    if (!seq || !logits) {
        llmq_errorf(LLMQ_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    memcpy(seq, ids, (size_t)n_ids * sizeof(int32_t));
    if (llmq_forward_init(m, total, (int)threads, &f) != LLMQ_OK) goto done;

    fputs(prompt, stdout);
    fflush(stdout);
    int64_t n = n_ids, n_gen = 0;
    char piece[256];
    double t0 = llmq_now_s();
    for (; n_gen < n_predict; n_gen++) {
        if (llmq_forward_logits(f, seq, n, n - 1, logits) != LLMQ_OK) goto done;
        int32_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = (int32_t)v;
        seq[n++] = best;
        if (best == eos && !ignore_eos) {
            n_gen++;
            break;
        }
        int len = llmq_token_to_piece(m->tok, best, piece, (int)sizeof piece, false);
        if (len < 0) len = 0; // a piece longer than 256 bytes does not occur in real vocabularies
        const char *p = piece;
        if (empty_prompt && n_gen == 0 && len > 0 && piece[0] == ' ' && llmq_tokenizer_add_space_prefix(m->tok)) {
            p++;
            len--;
        }
        fwrite(p, 1, (size_t)len, stdout);
        fflush(stdout);
    }
    double dt = llmq_now_s() - t0;
    fputc('\n', stdout);
    llmq_info("generate: prompt %lld tokens, generated %lld tokens in %.2f s (%.1f tokens/s, %ld threads)",
              (long long)n_ids, (long long)n_gen, dt, dt > 0 ? (double)n_gen / dt : 0.0, threads);
    rc = 0;
done:
    free(ids);
    free(seq);
    free(logits);
    llmq_forward_free(f);
    llmq_model_free(m);
    return rc;
}
