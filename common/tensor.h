/*
 * common/tensor.h — a non-owning view of one tensor inside a mapped file.
 *
 * Shapes are stored outermost-first, as numpy, safetensors and PyTorch write them: a linear
 * weight W[out, in] has shape {R, C} with C the contiguous (fastest) dimension. GGUF stores its
 * dims fastest-first (ne0 = C); formats/gguf reverses them on load so every module sees one order.
 */
#ifndef LLMQ_TENSOR_H
#define LLMQ_TENSOR_H

#include "common/dtype.h"

#include <stdbool.h>

#define LLMQ_MAX_DIMS 4

struct llmq_tensor_view {
    const char *name; // owned by the file object the view came from
    enum llmq_dtype dtype;
    int n_dims;                   // 0..LLMQ_MAX_DIMS (0: a scalar, one element)
    int64_t shape[LLMQ_MAX_DIMS]; // outermost first; unused entries are 1
    const void *data;             // read-only mapping, valid while the file object lives
    size_t nbytes;                // bytes of data
    uint64_t file_offset;         // absolute offset of data in its file (for messages)
};

// Number of elements (product of the shape; 1 for a scalar). The file readers guarantee that it
// does not overflow for every view they hand out.
int64_t llmq_tensor_nelements(const struct llmq_tensor_view *t);

// *dst = an owned copy of v: v's header (name still v's pointer) on a malloc'd copy of its nbytes of data; v NULL:
// *dst zeroed (data NULL). Release with llmq_tensor_copy_free. false when out of memory (*dst zeroed).
bool llmq_tensor_copy(const struct llmq_tensor_view *v, struct llmq_tensor_view *dst);
// Frees the data of a copy made by llmq_tensor_copy and zeroes *t (a zeroed view: no-op).
void llmq_tensor_copy_free(struct llmq_tensor_view *t);

// Writes "[576, 49152]" style text into buf (always NUL-terminated). Returns buf.
char *llmq_tensor_shape_str(const struct llmq_tensor_view *t, char *buf, size_t bufsize);

#endif // LLMQ_TENSOR_H
