/*
 * tests/tensor_specs.h — how the round-trip tests declare the tensors they write (name, dtype, shape),
 * and st_demo_specs(), the safetensors set that both tests/unit/test_safetensors.c (writer -> reader in
 * C) and tests/tools/st_write_demo.c (writer -> the `safetensors` package, tests/py/test_safetensors_oracle.py,
 * whose DEMO list is this table again, in the same order) write.
 */
#ifndef LLMQ_TEST_TENSOR_SPECS_H
#define LLMQ_TEST_TENSOR_SPECS_H
#include "common/dtype.h"

#include <stdint.h>

struct test_tensor_spec {
    const char *name;
    enum llmq_dtype dtype;
    int n_dims;       // 0 (a scalar) .. 4
    int64_t shape[4]; // shape[0 .. n_dims-1]
};

// Elements of s (1 for a scalar, 0 when a dimension is 0).
static inline int64_t test_spec_numel(const struct test_tensor_spec *s) {
    int64_t n = 1;
    for (int d = 0; d < s->n_dims; d++) n *= s->shape[d];
    return n;
}

// Every safetensors dtype, a scalar, zero-size tensors, 1..4 dims, odd sizes, two UTF-8 names (one with a
// space), and "big" last: larger than any shard limit the tests use, so it ends up in a shard of its own,
// the last. *n receives the count.
static inline const struct test_tensor_spec *st_demo_specs(int *n) {
    static const struct test_tensor_spec SPECS[] = {
        {"model.embed_tokens.weight", LLMQ_DTYPE_F32, 2, {7, 5}},
        {"f64", LLMQ_DTYPE_F64, 1, {3}},
        {"f16", LLMQ_DTYPE_F16, 3, {2, 3, 4}},
        {"bf16", LLMQ_DTYPE_BF16, 2, {4, 4}},
        {"i64", LLMQ_DTYPE_I64, 1, {5}},
        {"i32", LLMQ_DTYPE_I32, 4, {1, 1, 1, 3}},
        {"scalar", LLMQ_DTYPE_F32, 0, {0}},
        {"i16", LLMQ_DTYPE_I16, 1, {6}},
        {"empty", LLMQ_DTYPE_F16, 2, {0, 4}},
        {"i8", LLMQ_DTYPE_I8, 1, {9}},
        {"u8", LLMQ_DTYPE_U8, 1, {10}},
        {"empty2", LLMQ_DTYPE_I64, 1, {0}},
        {"bool", LLMQ_DTYPE_BOOL, 1, {11}},
        {"na\xc3\xafve.\xc3\xbc", LLMQ_DTYPE_U8, 1, {2}},
        {"layers.0.na\xc3\xafve \xe2\x9c\x93", LLMQ_DTYPE_BF16, 1, {2}},
        {"big", LLMQ_DTYPE_F32, 2, {64, 33}},
    };
    *n = (int)(sizeof(SPECS) / sizeof(SPECS[0]));
    return SPECS;
}
#endif
