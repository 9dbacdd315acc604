// tests/tools/tokenize_tool.c — exposes calib/tokenizer/tokenizer.h on the command line for the pytest oracles
// (tests/py/test_tokenizer_oracle.py) and for timing.
//
//   tokenize_tool MODEL.gguf|HF_DIR FILE [--no-special] [--parse-special] [--decode] [--render-special]
//                 [--info] [--hex-lines]
//
// FILE is read whole ("-" = stdin). Default: tokenize it with add_special (BOS / EOS by the model's
// rules; --no-special turns that off) and print the ids on one line, separated by spaces.
// --parse-special matches control-token texts in FILE. --decode: FILE holds ids (whitespace
// separated); print the bytes of their pieces (llmq_token_to_piece; --render-special shows control
// tokens). --info: print the tokenizer's properties as JSON instead. --hex-lines: every line of FILE
// is one text written in hex (any bytes); print one line of ids per text. --decode --hex-lines:
// print each id's piece in hex on its own line.
// stderr: one line "tokenize_tool: N tokens from B bytes in S s (T tokens/s)" (tokenize time only).
// Errors: the library's message and exit status 1.
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *read_all(const char *path, size_t *n) {
    if (strcmp(path, "-") != 0) {
        char *buf = NULL;
        return llmq_read_file(path, (size_t)1 << 31, &buf, n) == LLMQ_OK ? buf : NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len, stdin)) > 0;) {
        len += got;
        if (len == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[len] = 0;
    *n = len;
    return buf;
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    bool add_special = true, parse_special = false, decode = false, render = false, info = false, hex = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-special"))
            add_special = false;
        else if (!strcmp(argv[i], "--parse-special"))
            parse_special = true;
        else if (!strcmp(argv[i], "--decode"))
            decode = true;
        else if (!strcmp(argv[i], "--render-special"))
            render = true;
        else if (!strcmp(argv[i], "--info"))
            info = true;
        else if (!strcmp(argv[i], "--hex-lines"))
            hex = true;
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "tokenize_tool: unknown flag %s\n", argv[i]);
            return 2;
        } else if (!model)
            model = argv[i];
        else if (!file)
            file = argv[i];
        else {
            fprintf(stderr, "tokenize_tool: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!model || (!file && !info)) {
        fprintf(stderr, "usage: tokenize_tool MODEL.gguf|HF_DIR FILE [--no-special] [--parse-special] [--decode] "
                        "[--render-special] [--info]\n");
        return 2;
    }
    int rc = 1;
    struct llmq_gguf *g = NULL;
    struct llmq_tokenizer *t = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (llmq_is_dir(model)) {
        if (llmq_tokenizer_load_hf(model, &t) != LLMQ_OK) goto done;
    } else if (llmq_gguf_open(model, &g) != LLMQ_OK || llmq_tokenizer_load_gguf(g, &t) != LLMQ_OK) {
        goto done;
    }
    if (info) {
        const char *pre = llmq_tokenizer_pre(t);
        printf(
            "{\"kind\": \"%s\", \"pre\": \"%s\", \"n_vocab\": %d, \"bos\": %d, \"eos\": %d, \"unk\": %d, \"pad\": %d, "
            "\"add_bos\": %s, \"add_eos\": %s, \"add_space_prefix\": %s, \"n_merges\": %lld}\n",
            llmq_tokenizer_kind(t) == LLMQ_TOKENIZER_SPM ? "spm" : "bpe", pre ? pre : "", llmq_tokenizer_n_vocab(t),
            llmq_tokenizer_bos(t), llmq_tokenizer_eos(t), llmq_tokenizer_unk(t), llmq_tokenizer_pad(t),
            llmq_tokenizer_add_bos(t) ? "true" : "false", llmq_tokenizer_add_eos(t) ? "true" : "false",
            llmq_tokenizer_add_space_prefix(t) ? "true" : "false", (long long)llmq_tokenizer_n_merges(t));
        rc = 0;
        goto done;
    }
    text = read_all(file, &n);
    if (!text) {
        fprintf(stderr, "tokenize_tool: cannot read %s\n", file);
        goto done;
    }
    if (decode) {
        char *p = text, *end;
        char buf[4096];
        for (;;) {
            errno = 0;
            long id = strtol(p, &end, 10);
            if (end == p) break;
            p = end;
            int k = llmq_token_to_piece(t, (int32_t)id, buf, (int)sizeof(buf), render);
            char *piece = buf, *big = NULL;
            if (k < 0) {
                big = malloc((size_t)-k);
                if (!big) goto done;
                k = llmq_token_to_piece(t, (int32_t)id, big, -k, render);
                piece = big;
            }
            if (hex) {
                for (int j = 0; j < k; j++) printf("%02x", (unsigned char)piece[j]);
                printf("\n");
            } else {
                fwrite(piece, 1, (size_t)k, stdout);
            }
            free(big);
        }
        rc = 0;
        goto done;
    }
    if (hex) {
        for (char *line = text; line < text + n;) {
            char *eol = memchr(line, '\n', (size_t)(text + n - line));
            if (!eol) eol = text + n;
            size_t m = (size_t)(eol - line) / 2;
            char *bytes = malloc(m + 1);
            if (!bytes) goto done;
            for (size_t k = 0; k < m; k++) {
                char h[3] = {line[2 * k], line[2 * k + 1], 0};
                bytes[k] = (char)strtol(h, NULL, 16);
            }
            int32_t *v = NULL;
            int64_t nv = 0;
            enum llmq_status st = llmq_tokenize(t, bytes, m, add_special, parse_special, &v, &nv);
            free(bytes);
            if (st != LLMQ_OK) goto done;
            for (int64_t k = 0; k < nv; k++) printf(k ? " %d" : "%d", v[k]);
            printf("\n");
            free(v);
            line = eol + 1;
        }
        rc = 0;
        goto done;
    }
    int64_t n_ids = 0;
    double t0 = llmq_now_s();
    if (llmq_tokenize(t, text, n, add_special, parse_special, &ids, &n_ids) != LLMQ_OK) goto done;
    double dt = llmq_now_s() - t0;
    fprintf(stderr, "tokenize_tool: %lld tokens from %zu bytes in %.3f s (%.0f tokens/s)\n", (long long)n_ids, n, dt,
            dt > 0 ? (double)n_ids / dt : 0.0);
    for (int64_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    rc = 0;
done:
    if (rc) fprintf(stderr, "tokenize_tool: failed: %s\n", llmq_last_error());
    free(ids);
    free(text);
    llmq_tokenizer_free(t);
    llmq_gguf_free(g);
    return rc;
}
