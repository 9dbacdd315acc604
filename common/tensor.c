// common/tensor.c — tensor view helpers.
#include "common/tensor.h"

#include <stdio.h>

int64_t llmq_tensor_nelements(const struct llmq_tensor_view *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

char *llmq_tensor_shape_str(const struct llmq_tensor_view *t, char *buf, size_t bufsize) {
    size_t off = 0;
    if (bufsize == 0) return buf;
    off += (size_t)snprintf(buf + off, bufsize - off, "[");
    for (int i = 0; i < t->n_dims && off < bufsize; i++)
        off += (size_t)snprintf(buf + off, bufsize - off, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (off < bufsize) snprintf(buf + off, bufsize - off, "]");
    return buf;
}
