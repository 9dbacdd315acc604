// common/tensor.c — tensor view helpers.
#include "common/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

bool llmq_tensor_copy(const struct llmq_tensor_view *v, struct llmq_tensor_view *dst) {
    memset(dst, 0, sizeof(*dst));
    if (!v) return true;
    void *data = malloc(v->nbytes ? v->nbytes : 1);
    if (!data) return false;
    memcpy(data, v->data, v->nbytes);
    *dst = *v;
    dst->data = data;
    return true;
}

void llmq_tensor_copy_free(struct llmq_tensor_view *t) {
    free((void *)t->data);
    memset(t, 0, sizeof(*t));
}
