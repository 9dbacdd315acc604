// tests/tools/gguf_copy.c — reads a GGUF (version 1, 2 or 3) with llmq's reader and writes it out
// with llmq's writer as version 3: every KV in order, every tensor with its type, shape and bytes.
// tests/py/test_gguf_oracle.py checks the copy with gguf-py; it also turns v1 files into v3.
//
//   gguf_copy IN.gguf OUT.gguf        exit 0 on success, 1 on any error (logged on stderr)
#include "common/status.h"
#include "formats/gguf.h"

#include <stdio.h>

int main(int argc, char **argv) {
    struct llmq_gguf *g = NULL;
    struct llmq_gguf_writer *w = NULL;
    enum llmq_status st;
    if (argc != 3) {
        fprintf(stderr, "usage: gguf_copy IN.gguf OUT.gguf\n");
        return 2;
    }
    if ((st = llmq_gguf_open(argv[1], &g))) goto done;
    if (!(w = llmq_gguf_writer_init())) {
        st = LLMQ_ERR_NOMEM;
        goto done;
    }
    if ((st = llmq_gguf_writer_copy_kvs(w, g, NULL))) goto done;
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *v = &llmq_gguf_tensor_at(g, i)->view;
        if ((st = llmq_gguf_writer_add_tensor(w, v->name, v->dtype, v->n_dims, v->shape))) goto done;
    }
    if ((st = llmq_gguf_writer_begin(w, argv[2]))) goto done;
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *v = &llmq_gguf_tensor_at(g, i)->view;
        if ((st = llmq_gguf_writer_write_tensor(w, v->data, v->nbytes))) goto done;
    }
    st = llmq_gguf_writer_commit(w);
done:
    llmq_gguf_writer_free(w); // removes the temporary output unless committed
    llmq_gguf_free(g);
    if (st) fprintf(stderr, "gguf_copy: %s\n", llmq_status_name(st));
    return st ? 1 : 0;
}
