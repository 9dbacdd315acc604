// tests/tools/st_write_demo.c — writes a known checkpoint with formats/safetensors.h, for the pytest
// oracle tests/py/test_safetensors_oracle.py, which checks it with the `safetensors` PyPI package.
//
//   st_write_demo OUT_DIR MAX_SHARD_BYTES     (0: one model.safetensors; else sharded + index)
//
// The set: tests/tensor_specs.h st_demo_specs() (every safetensors dtype, a scalar, zero-size tensors,
// 1..4 dims, UTF-8 names), the one tests/unit/test_safetensors.c round-trips; its "big" is streamed in
// 100-byte pieces. Element i of tensor k has the integer value
//   v = (i * 37 + k * 11) % 97 - 48        (in [-48, 48])
// stored as: F64/F32/F16/BF16 v * 0.5 (exact in every float type), I64 v * 1000000007, I32 v * 100003,
// I16 v * 300, I8 v, U8 v + 148, BOOL v > 0. The oracle recomputes the same values with numpy.
// Exit status: 0 ok, 1 library error (message on stderr), 2 usage error.
#include "tensor_specs.h"

#include "common/dtype.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct test_tensor_spec *DEMO; // tests/tensor_specs.h st_demo_specs(), set by main
static int N_DEMO;

// Element i of tensor k, encoded little-endian (llmq targets little-endian hosts) into out.
static size_t encode(int k, int64_t i, uint8_t *out) {
    int64_t v = (i * 37 + k * 11) % 97 - 48;
    float f = (float)v * 0.5f;
    switch (DEMO[k].dtype) {
    case LLMQ_DTYPE_F64: {
        double x = (double)v * 0.5;
        memcpy(out, &x, 8);
        return 8;
    }
    case LLMQ_DTYPE_F32: memcpy(out, &f, 4); return 4;
    case LLMQ_DTYPE_F16: {
        uint16_t h = llmq_f32_to_f16(f);
        memcpy(out, &h, 2);
        return 2;
    }
    case LLMQ_DTYPE_BF16: {
        uint16_t h = llmq_f32_to_bf16(f);
        memcpy(out, &h, 2);
        return 2;
    }
    case LLMQ_DTYPE_I64: {
        int64_t x = v * 1000000007LL;
        memcpy(out, &x, 8);
        return 8;
    }
    case LLMQ_DTYPE_I32: {
        int32_t x = (int32_t)(v * 100003);
        memcpy(out, &x, 4);
        return 4;
    }
    case LLMQ_DTYPE_I16: {
        int16_t x = (int16_t)(v * 300);
        memcpy(out, &x, 2);
        return 2;
    }
    case LLMQ_DTYPE_I8: out[0] = (uint8_t)(int8_t)v; return 1;
    case LLMQ_DTYPE_U8: out[0] = (uint8_t)(v + 148); return 1;
    case LLMQ_DTYPE_BOOL: out[0] = v > 0; return 1;
    default: LLMQ_ASSERT(0 && "not a demo dtype"); return 0;
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: st_write_demo OUT_DIR MAX_SHARD_BYTES\n");
        return 2;
    }
    char *end;
    unsigned long long limit = strtoull(argv[2], &end, 10);
    if (*end || !*argv[2]) {
        fprintf(stderr, "st_write_demo: bad MAX_SHARD_BYTES '%s'\n", argv[2]);
        return 2;
    }
    DEMO = st_demo_specs(&N_DEMO);
    struct llmq_st_writer *w = NULL;
    uint8_t *buf = NULL;
    enum llmq_status st = llmq_st_writer_init(argv[1], limit, &w);
    if (st) goto fail;
    if ((st = llmq_st_writer_set_metadata(w, "format", "pt"))) goto fail;
    if ((st = llmq_st_writer_set_metadata(w, "llmq.demo", "h\xc3\xa9llo \xe2\x9c\x93"))) goto fail;
    for (int k = 0; k < N_DEMO; k++)
        if ((st = llmq_st_writer_add_tensor(w, DEMO[k].name, DEMO[k].dtype, DEMO[k].n_dims, DEMO[k].shape))) goto fail;
    for (int k = 0; k < N_DEMO; k++) {
        int64_t n = test_spec_numel(&DEMO[k]);
        size_t esize = llmq_dtype_traits(DEMO[k].dtype)->size, nbytes = (size_t)n * esize;
        free(buf);
        if (!(buf = malloc(nbytes + 8))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "st_write_demo: out of memory");
            goto fail;
        }
        for (int64_t i = 0; i < n; i++) encode(k, i, buf + (size_t)i * esize);
        if (strcmp(DEMO[k].name, "big") == 0) { // streamed in pieces that cut through elements
            for (size_t off = 0; off < nbytes; off += 100)
                if ((st = llmq_st_writer_write(w, buf + off, nbytes - off < 100 ? nbytes - off : 100))) goto fail;
        } else if ((st = llmq_st_writer_write_tensor(w, DEMO[k].name, buf, nbytes))) {
            goto fail;
        }
    }
    free(buf);
    buf = NULL;
    st = llmq_st_writer_finish(w);
    w = NULL;
    if (st) goto fail;
    return 0;
fail:
    free(buf);
    llmq_st_writer_abort(w);
    fprintf(stderr, "st_write_demo: %s\n", llmq_status_name(st));
    return 1;
}
