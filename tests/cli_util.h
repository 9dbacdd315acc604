/*
 * tests/cli_util.h — for the C tests that drive the llmq binary ($LLMQ_BIN) end to end (tests/gpu/test_gemm_cli.c,
 * tests/gpu/test_eval_cuda.c, tests/gpu/test_calib_cuda.c): find their model, run a shell command, read back the
 * --json report it wrote.
 */
#ifndef LLMQ_TEST_CLI_UTIL_H
#define LLMQ_TEST_CLI_UTIL_H

#include "harness.h"

#include <jansson.h>
#include <stdarg.h>
#include <unistd.h>

// $LLMQ_BIN, once it, the model and the text are there to read; otherwise the test is skipped (exit 77, saying what
// is missing).
static inline const char *test_need_llmq_inputs(const char *model, const char *text) {
    const char *bin = getenv("LLMQ_BIN");
    if (!bin || access(bin, X_OK) != 0 || access(model, R_OK) != 0 || access(text, R_OK) != 0) {
        fprintf(stderr, "skipped: needs $LLMQ_BIN, %s and %s\n", model, text);
        exit(TEST_SKIP);
    }
    return bin;
}

// The SmolLM2 model of the gpu tests: $LLMQ_EVAL_GPU_MODEL (tests/gpu/run.sh points it at the bundle's SmolLM2 cut
// to its first 4 blocks), else $LLMQ_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf ($LLMQ_CACHE defaults to ~/.cache/llmq).
static inline void test_smollm2_gpu_model(char *buf, size_t n) {
    const char *m = getenv("LLMQ_EVAL_GPU_MODEL"), *c = getenv("LLMQ_CACHE"), *h = getenv("HOME");
    if (m && *m)
        snprintf(buf, n, "%s", m);
    else if (c && *c)
        snprintf(buf, n, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", c);
    else
        snprintf(buf, n, "%s/.cache/llmq/SmolLM2-135M-Instruct.Q4_1.gguf", h ? h : ".");
}

// The inputs of a SmolLM2 gpu test: a CUDA device, the model (test_smollm2_gpu_model) into model, the text
// $LLMQ_DATA/wikitext-2-raw/raw into text, and $LLMQ_BIN (returned); with any missing the test is skipped (exit 77).
// Then makes the temporary directory tmp (a mkdtemp template).
static inline const char *test_smollm2_gpu_inputs(const char *raw, char *model, size_t nm, char *text, size_t nt,
                                                  char *tmp) {
    test_need_cuda();
    test_smollm2_gpu_model(model, nm);
    snprintf(text, nt, "%s/wikitext-2-raw/%s", test_data_dir(), raw);
    const char *bin = test_need_llmq_inputs(model, text);
    CHECK(mkdtemp(tmp));
    return bin;
}

// Runs the shell command made by printf(fmt, ...) with system(), echoed first on stderr as "$ command"; returns
// system()'s status (0: the command exited 0). The command is cut at 4095 bytes.
static inline int test_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int test_run(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    fprintf(stderr, "$ %s\n", cmd);
    return system(cmd);
}

// The JSON document dir/name (a new reference, json_decref it); a missing or malformed file is a failed check.
static inline json_t *test_load_json(const char *dir, const char *name) {
    json_error_t e;
    json_t *j = json_load_file(test_path(dir, name), 0, &e);
    if (!j) fprintf(stderr, "%s/%s: %s\n", dir, name, e.text);
    CHECK(j);
    return j;
}

#endif // LLMQ_TEST_CLI_UTIL_H
