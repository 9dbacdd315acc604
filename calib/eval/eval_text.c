// calib/eval/eval_text.c — the text of an evaluation, loaded and tokenized as calib/eval/eval.h describes.
#include "calib/eval/eval.h"

#include "calib/model/model.h"
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "datasets/datasets.h"

#include <stdlib.h>
#include <string.h>

enum llmq_status llmq_eval_text_load(const char *arg, enum llmq_eval_protocol protocol, bool join,
                                     struct llmq_eval_text *t) {
    char *raw = NULL;
    size_t n = 0;
    enum llmq_status st;
    if (llmq_is_dir(arg))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: is a directory: --ppl takes a text file or a dataset name", arg);
    if (llmq_file_exists(arg)) {
        if (!(t->path = strdup(arg))) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
        if ((st = llmq_eval_read_text(t->path, &raw, &n))) return st;
    } else {
        struct llmq_dataset ds;
        if ((st = llmq_dataset_load(arg, NULL, (size_t)4 << 30, &ds))) return st;
        t->path = ds.path; // canonical: the path printed and recorded in --json
        t->dataset = strdup(ds.name);
        ds.path = NULL;
        raw = ds.data;
        n = ds.len;
        ds.data = NULL;
        llmq_dataset_free(&ds);
        if (!t->path || !t->dataset) {
            free(raw);
            return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
        }
    }
    if (join) {
        st = llmq_eval_join_rows(raw, n, &t->data, &t->len);
        free(raw);
        if (st) return st;
    } else {
        t->data = raw;
        t->len = n;
    }
    if (protocol == LLMQ_EVAL_PROTOCOL_LLAMACPP && t->len > 0 && t->data[t->len - 1] == '\n') t->data[--t->len] = '\0';
    t->rows_joined = join;
    llmq_sha256(t->data, t->len, t->sha);
    return LLMQ_OK;
}

void llmq_eval_text_free(struct llmq_eval_text *t) {
    free(t->data);
    free(t->path);
    free(t->dataset);
    memset(t, 0, sizeof(*t));
}

enum llmq_status llmq_eval_text_tokenize(const struct llmq_model *m, const struct llmq_eval_text *t, int32_t **ids,
                                         int64_t *n) {
    if (!m->tok) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: the model has no tokenizer", m->path);
    double t0 = llmq_now_s();
    enum llmq_status st = llmq_tokenize(m->tok, t->data, t->len, true, false, ids, n);
    if (st) return st;
    if (*n > 0 && llmq_tokenizer_add_eos(m->tok) && (*ids)[*n - 1] == llmq_tokenizer_eos(m->tok)) {
        llmq_warn("eval: %s adds EOS; the EOS after the text is dropped (llama.cpp refuses such models)", m->path);
        (*n)--;
    }
    llmq_info("eval: %s: %zu bytes -> %lld tokens in %.1f s", t->path, t->len, (long long)*n, llmq_now_s() - t0);
    return LLMQ_OK;
}
