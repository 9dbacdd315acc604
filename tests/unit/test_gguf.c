// tests/unit/test_gguf.c — formats/gguf: writer -> reader round trips (every value type, several
// dtypes incl. quant types, custom alignment), stories260K v1 == v3, handcrafted corrupt files
// (one per reader check, exact status + path + a distinctive word of the message), every-prefix
// truncation and random byte flips (run under ASan in build-gguf-asan), and writer misuse / abort.
#include "harness.h"
#include "tensor_specs.h"

#include "common/io.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/gguf.h"

#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- a byte builder for handcrafted files -------------------------------------------------------

struct bb {
    uint8_t *p;
    size_t n, cap;
    int v1; // LEN fields are u32 (GGUF version 1)
};

static void bb_put(struct bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        CHECK(b->p);
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void bb_u8(struct bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(struct bb *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(struct bb *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_len(struct bb *b, uint64_t v) {
    if (b->v1)
        bb_u32(b, (uint32_t)v);
    else
        bb_u64(b, v);
}
static void bb_strn(struct bb *b, const char *s, size_t n) {
    bb_len(b, n);
    bb_put(b, s, n);
}
static void bb_str(struct bb *b, const char *s) { bb_strn(b, s, strlen(s)); }
static void bb_zeros(struct bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_u8(b, 0);
}
static void bb_align(struct bb *b, size_t a) { bb_zeros(b, (a - b->n % a) % a); }

static void bb_header(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    b->v1 = version == 1;
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_len(b, n_tensors);
    bb_len(b, n_kv);
}
static void bb_kv_u32(struct bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, LLMQ_GGUF_TYPE_UINT32);
    bb_u32(b, v);
}
static void bb_kv_str(struct bb *b, const char *key, const char *v) {
    bb_str(b, key);
    bb_u32(b, LLMQ_GGUF_TYPE_STRING);
    bb_str(b, v);
}
// A tensor info; ne in ggml order (fastest first).
static void bb_ti(struct bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t k = 0; k < n_dims; k++) bb_len(b, ne[k]);
    bb_u32(b, type);
    bb_u64(b, off);
}

static char *tmp_path(const char *name) {
    char *p = malloc(256);
    CHECK(p);
    snprintf(p, 256, "/tmp/llmq_test_gguf_%ld_%s.gguf", (long)getpid(), name);
    return p;
}

static char *bb_save(const struct bb *b, const char *name) {
    char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    CHECK(f);
    CHECK(b->n == 0 || fwrite(b->p, 1, b->n, f) == b->n);
    CHECK(fclose(f) == 0);
    return path;
}

static int n_corrupt_cases;

// Saves b as name, opens it, expects status st and a message naming the file and containing word.
static void expect_fail(const struct bb *b, const char *name, enum llmq_status st, const char *word) {
    char *path = bb_save(b, name);
    struct llmq_gguf *g = (struct llmq_gguf *)(uintptr_t)1;
    llmq_clear_error();
    enum llmq_status got = llmq_gguf_open(path, &g);
    if (got != st)
        fprintf(stderr, "case %s: got status %s, want %s\n", name, llmq_status_name(got), llmq_status_name(st));
    CHECK_EQ_INT(got, st);
    CHECK(g == NULL);
    CHECK_CONTAINS(llmq_last_error(), path);
    CHECK_CONTAINS(llmq_last_error(), word);
    unlink(path);
    free(path);
    n_corrupt_cases++;
}

static struct llmq_gguf *expect_ok(const struct bb *b, const char *name) {
    char *path = bb_save(b, name);
    struct llmq_gguf *g = NULL;
    CHECK_EQ_INT(llmq_gguf_open(path, &g), LLMQ_OK);
    unlink(path); // the mapping stays valid
    free(path);
    return g;
}

// ---- handcrafted corrupt files ------------------------------------------------------------------

static void test_corrupt(void) {
    struct bb b = {0};
    uint64_t ne2[2] = {32, 2}, ne1[1] = {8};

    // a valid baseline: one KV, one f32 tensor of 8 elements
    bb_header(&b, 3, 1, 1);
    bb_kv_str(&b, "general.name", "ok");
    bb_ti(&b, "w", 1, ne1, 0, 0);
    bb_align(&b, 32);
    bb_zeros(&b, 32);
    llmq_gguf_free(expect_ok(&b, "baseline"));

    // magic, version
    bb_header(&b, 3, 0, 0);
    memcpy(b.p, "GGUX", 4);
    expect_fail(&b, "magic", LLMQ_ERR_MAGIC, "magic");
    b.n = 0;
    bb_put(&b, "PK\x03", 3);
    expect_fail(&b, "magic_short", LLMQ_ERR_MAGIC, "magic");
    b.n = 0;
    expect_fail(&b, "empty", LLMQ_ERR_TRUNCATED, "offset 0");
    bb_header(&b, 0, 0, 0);
    expect_fail(&b, "version0", LLMQ_ERR_VERSION, "version 0");
    bb_header(&b, 4, 0, 0);
    expect_fail(&b, "version4", LLMQ_ERR_VERSION, "version 4");
    bb_header(&b, 0x03000000u, 0, 0);
    expect_fail(&b, "version_be", LLMQ_ERR_VERSION, "big-endian");

    // truncated counts; counts that cannot fit in the file
    bb_header(&b, 3, 0, 0);
    b.n = 12;
    expect_fail(&b, "trunc_counts", LLMQ_ERR_TRUNCATED, "n_tensors of the file header needs 8 bytes at offset 8");
    bb_header(&b, 3, 0, 1ull << 60);
    bb_zeros(&b, 64);
    expect_fail(&b, "huge_n_kv", LLMQ_ERR_TRUNCATED, "n_kv");
    bb_header(&b, 3, 1ull << 62, 0);
    bb_zeros(&b, 64);
    expect_fail(&b, "huge_n_tensors", LLMQ_ERR_TRUNCATED, "n_tensors");
    bb_header(&b, 3, UINT64_MAX, UINT64_MAX);
    expect_fail(&b, "max_counts", LLMQ_ERR_TRUNCATED, "n_kv");

    // keys
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1000);
    bb_put(&b, "abcdefghijklm", 13);
    expect_fail(&b, "key_len", LLMQ_ERR_TRUNCATED, "name of key #0 at offset 24 has length 1000");
    bb_header(&b, 3, 0, 1);
    bb_strn(&b, "a\xff\xfe", 3);
    bb_u32(&b, LLMQ_GGUF_TYPE_UINT8);
    bb_u8(&b, 1);
    expect_fail(&b, "key_utf8", LLMQ_ERR_CORRUPT, "not valid UTF-8");
    bb_header(&b, 3, 0, 1);
    bb_strn(&b, "a\0b", 3);
    bb_u32(&b, LLMQ_GGUF_TYPE_UINT8);
    bb_u8(&b, 1);
    expect_fail(&b, "key_nul", LLMQ_ERR_CORRUPT, "NUL");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "");
    bb_u32(&b, LLMQ_GGUF_TYPE_UINT8);
    bb_u8(&b, 1);
    bb_zeros(&b, 16);
    expect_fail(&b, "key_empty", LLMQ_ERR_CORRUPT, "empty");
    bb_header(&b, 3, 0, 2);
    bb_kv_u32(&b, "a.b", 1);
    bb_kv_u32(&b, "a.b", 2);
    expect_fail(&b, "dup_key", LLMQ_ERR_DUPLICATE, "duplicate key 'a.b'");

    // values
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, 13);
    bb_u32(&b, 0);
    expect_fail(&b, "value_type", LLMQ_ERR_CORRUPT, "unknown value type 13 of key 'k'");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, LLMQ_GGUF_TYPE_UINT64);
    bb_u32(&b, 7);
    expect_fail(&b, "value_short", LLMQ_ERR_TRUNCATED, "value of key 'k' needs 8 bytes");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, LLMQ_GGUF_TYPE_STRING);
    bb_u64(&b, 1ull << 40);
    bb_put(&b, "xyz", 3);
    expect_fail(&b, "str_len", LLMQ_ERR_TRUNCATED, "string value of key 'k'");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, LLMQ_GGUF_TYPE_ARRAY);
    bb_u32(&b, LLMQ_GGUF_TYPE_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, LLMQ_GGUF_TYPE_UINT8);
    bb_u64(&b, 1);
    bb_u8(&b, 1);
    expect_fail(&b, "nested", LLMQ_ERR_UNSUPPORTED, "nested arrays");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, LLMQ_GGUF_TYPE_ARRAY);
    bb_u32(&b, 99);
    bb_u64(&b, 0);
    expect_fail(&b, "arr_elem_type", LLMQ_ERR_CORRUPT, "unknown array element type 99");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, LLMQ_GGUF_TYPE_ARRAY);
    bb_u32(&b, LLMQ_GGUF_TYPE_UINT32);
    bb_u64(&b, (1ull << 62) + 1); // x 4 bytes would wrap around 2^64
    bb_zeros(&b, 16);
    expect_fail(&b, "arr_count", LLMQ_ERR_TRUNCATED, "array of key 'k'");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, LLMQ_GGUF_TYPE_ARRAY);
    bb_u32(&b, LLMQ_GGUF_TYPE_STRING);
    bb_u64(&b, UINT64_MAX / 2);
    bb_zeros(&b, 16);
    expect_fail(&b, "arr_str_count", LLMQ_ERR_TRUNCATED, "strings");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "tok");
    bb_u32(&b, LLMQ_GGUF_TYPE_ARRAY);
    bb_u32(&b, LLMQ_GGUF_TYPE_STRING);
    bb_u64(&b, 3);
    bb_str(&b, "a");
    bb_u64(&b, 5000); // element 1 runs past the end
    bb_put(&b, "bcdefghijklmnopqrstuvwxyz", 25);
    expect_fail(&b, "arr_str_len", LLMQ_ERR_TRUNCATED, "string 1 of the array of key 'tok'");

    // general.alignment
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0);
    expect_fail(&b, "align0", LLMQ_ERR_CORRUPT, "alignment 0");
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    expect_fail(&b, "align48", LLMQ_ERR_CORRUPT, "alignment 48");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, LLMQ_GGUF_TYPE_UINT64);
    bb_u64(&b, 64);
    expect_fail(&b, "align_type", LLMQ_ERR_CORRUPT, "alignment must be a u32");

    // tensor infos
    bb_header(&b, 3, 1, 0);
    bb_str(&b, "w");
    bb_u32(&b, 4);
    bb_u64(&b, 8);
    bb_u64(&b, 1); // dims 2 and 3 missing
    expect_fail(&b, "ti_trunc", LLMQ_ERR_TRUNCATED, "dimension of tensor 'w' needs 8 bytes at offset 53");
    bb_header(&b, 3, 1, 0);
    {
        uint64_t ne5[5] = {1, 1, 1, 1, 1};
        bb_ti(&b, "blk.0.w5", 5, ne5, 0, 0);
    }
    bb_zeros(&b, 64);
    expect_fail(&b, "ndims5", LLMQ_ERR_UNSUPPORTED, "tensor 'blk.0.w5' at offset 40 has 5 dimensions");
    bb_header(&b, 3, 1, 0);
    {
        uint64_t neg[2] = {32, (uint64_t)-3};
        bb_ti(&b, "neg", 2, neg, 0, 0);
    }
    bb_zeros(&b, 64);
    expect_fail(&b, "negdim", LLMQ_ERR_CORRUPT, "tensor 'neg' has a negative dimension ne[1] = -3");
    bb_header(&b, 3, 1, 0);
    bb_ti(&b, "q42", 2, ne2, 4, 0); // 4 was Q4_2, removed from ggml
    bb_zeros(&b, 64);
    expect_fail(&b, "ggml_type4", LLMQ_ERR_UNSUPPORTED, "tensor 'q42' has unknown ggml type id 4");
    bb_header(&b, 3, 1, 0);
    bb_ti(&b, "t1000", 2, ne2, 1000, 0);
    bb_zeros(&b, 64);
    expect_fail(&b, "ggml_type1000", LLMQ_ERR_UNSUPPORTED, "unknown ggml type id 1000");
    bb_header(&b, 3, 1, 0);
    {
        uint64_t big[3] = {1ull << 32, 1ull << 32, 1};
        bb_ti(&b, "huge", 3, big, 0, 0);
    }
    bb_zeros(&b, 64);
    expect_fail(&b, "nel_overflow", LLMQ_ERR_OVERFLOW, "element count of tensor 'huge' overflows");
    bb_header(&b, 3, 1, 0);
    {
        uint64_t big[1] = {1ull << 62};
        bb_ti(&b, "bytes", 1, big, 0, 0);
    }
    bb_zeros(&b, 64);
    expect_fail(&b, "nbytes_overflow", LLMQ_ERR_OVERFLOW, "byte size of tensor 'bytes'");
    bb_header(&b, 3, 1, 0);
    {
        uint64_t ne33[2] = {33, 2};
        bb_ti(&b, "q40", 2, ne33, 2, 0); // Q4_0 rows must be multiples of 32
    }
    bb_zeros(&b, 64);
    expect_fail(&b, "block", LLMQ_ERR_CORRUPT, "not a multiple of the q4_0 block size 32");
    bb_header(&b, 3, 1, 0);
    bb_ti(&b, "w", 1, ne1, 0, 0);
    bb_align(&b, 32);
    bb_zeros(&b, 31); // 32 needed
    expect_fail(&b, "past_end", LLMQ_ERR_TRUNCATED, "tensor 'w' data (32 bytes");
    bb_header(&b, 3, 1, 0);
    bb_ti(&b, "w", 1, ne1, 0, 0); // header ends before the aligned data start
    expect_fail(&b, "no_data", LLMQ_ERR_TRUNCATED, "past the end");
    bb_header(&b, 3, 1, 0);
    bb_ti(&b, "far", 1, ne1, 0, UINT64_MAX - 31); // offset + data start wraps
    bb_align(&b, 32);
    bb_zeros(&b, 32);
    expect_fail(&b, "offset_wrap", LLMQ_ERR_TRUNCATED, "tensor 'far'");
    bb_header(&b, 3, 1, 0);
    bb_ti(&b, "mis", 1, ne1, 0, 4);
    bb_align(&b, 32);
    bb_zeros(&b, 64);
    expect_fail(&b, "misaligned", LLMQ_ERR_CORRUPT, "tensor 'mis' data offset 4 is misaligned");
    bb_header(&b, 3, 2, 0);
    {
        uint64_t ne16[1] = {16};
        bb_ti(&b, "a", 1, ne16, 0, 0); // [0, 64)
        bb_ti(&b, "b", 1, ne1, 0, 32); // [32, 64): inside a
    }
    bb_align(&b, 32);
    bb_zeros(&b, 64);
    expect_fail(&b, "overlap", LLMQ_ERR_CORRUPT, "overlap");
    bb_header(&b, 3, 2, 0);
    bb_ti(&b, "same", 1, ne1, 0, 0);
    bb_ti(&b, "same", 1, ne1, 0, 32);
    bb_align(&b, 32);
    bb_zeros(&b, 64);
    expect_fail(&b, "dup_tensor", LLMQ_ERR_DUPLICATE, "duplicate tensor name 'same'");
    bb_header(&b, 3, 1, 0);
    bb_ti(&b, "bad\xc3", 1, ne1, 0, 0);
    bb_align(&b, 32);
    bb_zeros(&b, 32);
    expect_fail(&b, "name_utf8", LLMQ_ERR_CORRUPT, "name of tensor #0 at offset 24 is not valid UTF-8");

    // version 1: u32 lengths and dims
    bb_header(&b, 1, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, LLMQ_GGUF_TYPE_STRING);
    bb_u32(&b, 1000);
    bb_put(&b, "abc", 3);
    expect_fail(&b, "v1_str_len", LLMQ_ERR_TRUNCATED, "string value of key 'k' at offset 25 has length 1000");
    bb_header(&b, 1, 1, 0);
    bb_ti(&b, "w", 1, ne1, 0, 0);
    bb_align(&b, 32);
    bb_zeros(&b, 32);
    {
        struct llmq_gguf *g = expect_ok(&b, "v1_ok");
        CHECK_EQ_INT(llmq_gguf_version(g), 1);
        CHECK_EQ_INT(llmq_gguf_tensor_at(g, 0)->view.shape[0], 8);
        CHECK_EQ_INT(llmq_gguf_data_offset(g), 64); // 41 header bytes, aligned up
        llmq_gguf_free(g);
    }

    // ne = 0 is an empty tensor (as in ggml); two empty tensors at one offset do not overlap
    bb_header(&b, 2, 2, 0);
    {
        uint64_t ne0[2] = {0, 4};
        bb_ti(&b, "e0", 2, ne0, 0, 0);
        bb_ti(&b, "e1", 2, ne0, 0, 0);
    }
    bb_align(&b, 32);
    {
        struct llmq_gguf *g = expect_ok(&b, "empty_tensor");
        CHECK_EQ_INT(llmq_gguf_tensor_at(g, 1)->view.nbytes, 0);
        CHECK_EQ_INT(llmq_gguf_tensor_at(g, 1)->view.shape[0], 4);
        CHECK_EQ_INT(llmq_gguf_tensor_at(g, 1)->view.shape[1], 0);
        llmq_gguf_free(g);
    }
    free(b.p);
    CHECK(n_corrupt_cases >= 20);
    fprintf(stderr, "test_gguf: %d corrupt-file cases\n", n_corrupt_cases);
}

// ---- writer -> reader round trip ---------------------------------------------------------------

static const struct test_tensor_spec round_tensors[] = {
    {"token_embd.weight", LLMQ_DTYPE_F32, 2, {5, 3}},
    {"blk.0.attn_q.weight", LLMQ_DTYPE_Q4_0, 2, {2, 64}},
    {"blk.0.ffn_down.weight", LLMQ_DTYPE_Q4_K, 1, {256}},
    {"blk.0.attn_norm.weight", LLMQ_DTYPE_F16, 3, {2, 3, 4}},
    {"empty", LLMQ_DTYPE_F32, 2, {0, 7}},
    {"blk.0.ffn_up.weight", LLMQ_DTYPE_Q8_0, 4, {1, 2, 1, 32}},
    {"scalar", LLMQ_DTYPE_F32, 0, {0}},
    {"ids", LLMQ_DTYPE_I32, 1, {3}},
    {"output.weight", LLMQ_DTYPE_BF16, 2, {3, 7}},
    {"blk.1.ffn_down.weight", LLMQ_DTYPE_Q6_K, 2, {3, 512}},
};
#define N_ROUND (int)(sizeof(round_tensors) / sizeof(round_tensors[0]))

static uint8_t pattern(int t, size_t i) { return (uint8_t)(i * 31 + (size_t)t * 7 + (i >> 8)); }

static const uint8_t u8s[] = {0, 1, 255};
static const int8_t i8s[] = {-128, 0, 127};
static const uint16_t u16s[] = {0, 1, 65535};
static const int16_t i16s[] = {-32768, 5, 32767};
static const uint32_t u32s[] = {0, 123456, 0xffffffffu};
static const int32_t i32s[] = {INT32_MIN, -1, INT32_MAX};
static const float f32s[] = {-1.5f, 0.0f, 3.25e-9f};
static const uint8_t bools[] = {1, 0, 1};
static const uint64_t u64s[] = {0, 1ull << 40, UINT64_MAX};
static const int64_t i64s[] = {INT64_MIN, -7, INT64_MAX};
static const double f64s[] = {-2.5, 1e-300, 3.141592653589793};
static const char *const strs[] = {"", "h\xc3\xa9llo \xe2\x96\x81", "\xf0\x9f\x98\x80", "plain"};

static void write_round_file(const char *path, uint32_t alignment) {
    struct llmq_gguf_writer *w = llmq_gguf_writer_init();
    bool existed = llmq_file_exists(path);
    CHECK(w);
    CHECK_EQ_INT(llmq_gguf_writer_set_str(w, "general.architecture", "llama"), LLMQ_OK);
    if (alignment) CHECK_EQ_INT(llmq_gguf_writer_set_u32(w, "general.alignment", alignment), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_u8(w, "t.u8", 255), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_i8(w, "t.i8", -128), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_u16(w, "t.u16", 65535), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_i16(w, "t.i16", -32768), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_u32(w, "t.u32", 7), LLMQ_OK); // replaced below
    CHECK_EQ_INT(llmq_gguf_writer_set_i32(w, "t.i32", INT32_MIN), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_f32(w, "t.f32", -1.5e-3f), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_bool(w, "t.bool", true), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_u64(w, "t.u64", UINT64_MAX), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_i64(w, "t.i64", INT64_MIN), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_f64(w, "t.f64", 3.141592653589793), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo \xf0\x9f\x98\x80"), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_strn(w, "t.strnul", "a\0b", 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_str(w, "t.empty", ""), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.u8", LLMQ_GGUF_TYPE_UINT8, u8s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.i8", LLMQ_GGUF_TYPE_INT8, i8s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.u16", LLMQ_GGUF_TYPE_UINT16, u16s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.i16", LLMQ_GGUF_TYPE_INT16, i16s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.u32", LLMQ_GGUF_TYPE_UINT32, u32s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.i32", LLMQ_GGUF_TYPE_INT32, i32s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.f32", LLMQ_GGUF_TYPE_FLOAT32, f32s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.bool", LLMQ_GGUF_TYPE_BOOL, bools, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.u64", LLMQ_GGUF_TYPE_UINT64, u64s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.i64", LLMQ_GGUF_TYPE_INT64, i64s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.f64", LLMQ_GGUF_TYPE_FLOAT64, f64s, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr_str(w, "a.str", strs, NULL, 4), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "a.empty", LLMQ_GGUF_TYPE_UINT32, NULL, 0), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_arr_str(w, "a.empty_str", NULL, NULL, 0), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_u32(w, "t.u32", 0xffffffffu), LLMQ_OK); // replaces, keeps the place
    CHECK_EQ_INT(llmq_gguf_writer_set_arr(w, "bad", LLMQ_GGUF_TYPE_STRING, strs, 1), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_set_u8(w, "", 1), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_set_u8(w, "bad\xff", 1), LLMQ_ERR_ARG);

    for (int t = 0; t < N_ROUND; t++) {
        const struct test_tensor_spec *tt = &round_tensors[t];
        CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, tt->name, tt->dtype, tt->n_dims, tt->shape), LLMQ_OK);
    }
    CHECK_EQ_INT(llmq_gguf_writer_n_tensors(w), N_ROUND);
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
    CHECK(llmq_file_exists(path) == existed); // the path is untouched before commit
    for (int t = 0; t < N_ROUND; t++) {
        size_t n = llmq_gguf_writer_tensor_nbytes(w, t);
        uint8_t *buf = malloc(n + 1);
        CHECK(buf);
        for (size_t i = 0; i < n; i++) buf[i] = pattern(t, i);
        // in uneven chunks, to exercise streaming
        for (size_t done = 0; done < n;) {
            size_t k = n - done < 13 ? n - done : 13 + done % 7;
            if (k > n - done) k = n - done;
            CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, buf + done, k), LLMQ_OK);
            done += k;
        }
        free(buf);
    }
    CHECK_EQ_INT(llmq_gguf_writer_commit(w), LLMQ_OK);
    llmq_gguf_writer_free(w);
    CHECK(llmq_file_exists(path));
}

static void check_num_arr(const struct llmq_gguf_kv *kv, enum llmq_gguf_type et, const void *want, size_t n) {
    CHECK(kv);
    CHECK_EQ_INT(kv->type, LLMQ_GGUF_TYPE_ARRAY);
    CHECK_EQ_INT(kv->arr_type, et);
    CHECK_EQ_INT(kv->n, n);
    CHECK_EQ_INT(kv->nbytes, n * llmq_gguf_type_size(et));
    CHECK(n == 0 || memcmp(kv->data, want, kv->nbytes) == 0);
}

static void check_round_file(const char *path, uint32_t alignment) {
    struct llmq_gguf *g = NULL;
    int64_t i64;
    uint64_t u64;
    double f64;
    bool b;
    size_t len;
    const char *s;
    CHECK_EQ_INT(llmq_gguf_open(path, &g), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_version(g), 3);
    CHECK_EQ_INT(llmq_gguf_alignment(g), alignment ? alignment : 32);
    CHECK_EQ_INT(llmq_gguf_data_offset(g) % llmq_gguf_alignment(g), 0);
    CHECK_EQ_INT(llmq_gguf_file_size(g) % llmq_gguf_alignment(g), 0); // every tensor is padded

    // order of first setting, with t.u32 replaced in place
    const char *order[] = {"general.architecture", "t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32"};
    int off = alignment ? 1 : 0;
    if (alignment) CHECK(strcmp(llmq_gguf_kv_at(g, 1)->key, "general.alignment") == 0);
    CHECK(strcmp(llmq_gguf_kv_at(g, 0)->key, order[0]) == 0);
    for (int k = 1; k < 7; k++) CHECK(strcmp(llmq_gguf_kv_at(g, k + off)->key, order[k]) == 0);
    CHECK_EQ_INT(llmq_gguf_n_kv(g), 29 + off);
    CHECK(llmq_gguf_kv_at(g, -1) == NULL && llmq_gguf_kv_at(g, 29 + off) == NULL);

    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, "t.u8");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_UINT8 && llmq_gguf_kv_as_u64(kv, &u64) && u64 == 255);
    CHECK(llmq_gguf_kv_as_i64(kv, &i64) && i64 == 255);
    CHECK(!llmq_gguf_kv_as_bool(kv, &b) && !llmq_gguf_kv_as_str(kv, NULL));
    kv = llmq_gguf_find_kv(g, "t.i8");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_INT8 && llmq_gguf_kv_as_i64(kv, &i64) && i64 == -128);
    CHECK(!llmq_gguf_kv_as_u64(kv, &u64));
    CHECK(llmq_gguf_kv_as_f64(kv, &f64) && f64 == -128.0);
    CHECK_EQ_INT(llmq_gguf_get_u64(g, "t.i8", &u64), LLMQ_ERR_OVERFLOW);
    CHECK_CONTAINS(llmq_last_error(), "t.i8");
    kv = llmq_gguf_find_kv(g, "t.u16");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_UINT16 && llmq_gguf_kv_as_u64(kv, &u64) && u64 == 65535);
    kv = llmq_gguf_find_kv(g, "t.i16");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_INT16 && llmq_gguf_kv_as_i64(kv, &i64) && i64 == -32768);
    kv = llmq_gguf_find_kv(g, "t.u32");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_UINT32 && llmq_gguf_kv_as_u64(kv, &u64) && u64 == 0xffffffffu);
    kv = llmq_gguf_find_kv(g, "t.i32");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_INT32 && llmq_gguf_kv_as_i64(kv, &i64) && i64 == INT32_MIN);
    kv = llmq_gguf_find_kv(g, "t.f32");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_FLOAT32 && llmq_gguf_kv_as_f64(kv, &f64) && f64 == (double)-1.5e-3f);
    CHECK(!llmq_gguf_kv_as_i64(kv, &i64));
    kv = llmq_gguf_find_kv(g, "t.bool");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_BOOL && llmq_gguf_kv_as_bool(kv, &b) && b);
    CHECK(!llmq_gguf_kv_as_i64(kv, &i64));
    CHECK_EQ_INT(llmq_gguf_get_bool(g, "t.bool", &b), LLMQ_OK);
    kv = llmq_gguf_find_kv(g, "t.u64");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_UINT64 && llmq_gguf_kv_as_u64(kv, &u64) && u64 == UINT64_MAX);
    CHECK(!llmq_gguf_kv_as_i64(kv, &i64));
    CHECK_EQ_INT(llmq_gguf_get_i64(g, "t.u64", &i64), LLMQ_ERR_OVERFLOW);
    kv = llmq_gguf_find_kv(g, "t.i64");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_INT64 && llmq_gguf_kv_as_i64(kv, &i64) && i64 == INT64_MIN);
    kv = llmq_gguf_find_kv(g, "t.f64");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_FLOAT64 && llmq_gguf_kv_as_f64(kv, &f64) && f64 == 3.141592653589793);
    CHECK_EQ_INT(llmq_gguf_get_f64(g, "t.f64", &f64), LLMQ_OK);
    kv = llmq_gguf_find_kv(g, "t.str");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_STRING);
    s = llmq_gguf_kv_as_str(kv, &len);
    CHECK(s && len == 11 && strcmp(s, "h\xc3\xa9llo \xf0\x9f\x98\x80") == 0);
    CHECK(memcmp(kv->data, s, len) == 0);
    s = llmq_gguf_kv_as_str(llmq_gguf_find_kv(g, "t.strnul"), &len);
    CHECK(s && len == 3 && memcmp(s, "a\0b", 4) == 0);
    s = llmq_gguf_kv_as_str(llmq_gguf_find_kv(g, "t.empty"), &len);
    CHECK(s && len == 0 && s[0] == '\0');
    CHECK_EQ_INT(llmq_gguf_get_str(g, "general.architecture", &s), LLMQ_OK);
    CHECK(strcmp(s, "llama") == 0);
    CHECK_EQ_INT(llmq_gguf_get_str(g, "t.u8", &s), LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "expected string");
    CHECK_EQ_INT(llmq_gguf_get_u64(g, "no.such.key", &u64), LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "no.such.key");
    CHECK_CONTAINS(llmq_last_error(), path);
    CHECK(llmq_gguf_find_kv(g, "no.such.key") == NULL && llmq_gguf_find_kv_index(g, "t.u") == -1);

    check_num_arr(llmq_gguf_find_kv(g, "a.u8"), LLMQ_GGUF_TYPE_UINT8, u8s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.i8"), LLMQ_GGUF_TYPE_INT8, i8s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.u16"), LLMQ_GGUF_TYPE_UINT16, u16s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.i16"), LLMQ_GGUF_TYPE_INT16, i16s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.u32"), LLMQ_GGUF_TYPE_UINT32, u32s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.i32"), LLMQ_GGUF_TYPE_INT32, i32s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.f32"), LLMQ_GGUF_TYPE_FLOAT32, f32s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.bool"), LLMQ_GGUF_TYPE_BOOL, bools, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.u64"), LLMQ_GGUF_TYPE_UINT64, u64s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.i64"), LLMQ_GGUF_TYPE_INT64, i64s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.f64"), LLMQ_GGUF_TYPE_FLOAT64, f64s, 3);
    check_num_arr(llmq_gguf_find_kv(g, "a.empty"), LLMQ_GGUF_TYPE_UINT32, NULL, 0);
    // element accessors
    kv = llmq_gguf_find_kv(g, "a.i16");
    CHECK(llmq_gguf_kv_arr_i64(kv, 0, &i64) && i64 == -32768);
    CHECK(!llmq_gguf_kv_arr_u64(kv, 0, &u64) && llmq_gguf_kv_arr_u64(kv, 1, &u64) && u64 == 5);
    CHECK(!llmq_gguf_kv_arr_i64(kv, 3, &i64) && !llmq_gguf_kv_arr_str(kv, 0, &len));
    kv = llmq_gguf_find_kv(g, "a.u64");
    CHECK(llmq_gguf_kv_arr_u64(kv, 2, &u64) && u64 == UINT64_MAX && !llmq_gguf_kv_arr_i64(kv, 2, &i64));
    kv = llmq_gguf_find_kv(g, "a.f32");
    CHECK(llmq_gguf_kv_arr_f64(kv, 2, &f64) && f64 == (double)3.25e-9f);
    kv = llmq_gguf_find_kv(g, "a.f64");
    CHECK(llmq_gguf_kv_arr_f64(kv, 1, &f64) && f64 == 1e-300);
    kv = llmq_gguf_find_kv(g, "a.bool");
    CHECK(llmq_gguf_kv_arr_bool(kv, 0, &b) && b && llmq_gguf_kv_arr_bool(kv, 1, &b) && !b);
    CHECK(!llmq_gguf_kv_as_bool(kv, &b)); // arrays are not scalars
    kv = llmq_gguf_find_kv(g, "a.str");
    CHECK(kv && kv->type == LLMQ_GGUF_TYPE_ARRAY && kv->arr_type == LLMQ_GGUF_TYPE_STRING && kv->n == 4);
    for (int j = 0; j < 4; j++) {
        s = llmq_gguf_kv_arr_str(kv, (uint64_t)j, &len);
        CHECK(s && len == strlen(strs[j]) && memcmp(s, strs[j], len) == 0);
    }
    CHECK(llmq_gguf_kv_arr_str(kv, 4, &len) == NULL);
    kv = llmq_gguf_find_kv(g, "a.empty_str");
    CHECK(kv && kv->arr_type == LLMQ_GGUF_TYPE_STRING && kv->n == 0 && !llmq_gguf_kv_arr_str(kv, 0, &len));
    const struct llmq_gguf_kv *arr;
    CHECK_EQ_INT(llmq_gguf_get_arr(g, "a.str", LLMQ_GGUF_TYPE_STRING, &arr), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_get_arr(g, "a.str", LLMQ_GGUF_TYPE_COUNT, &arr), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_get_arr(g, "a.str", LLMQ_GGUF_TYPE_INT32, &arr), LLMQ_ERR_CORRUPT);
    CHECK_EQ_INT(llmq_gguf_get_arr(g, "t.u8", LLMQ_GGUF_TYPE_COUNT, &arr), LLMQ_ERR_CORRUPT);

    // tensors
    CHECK_EQ_INT(llmq_gguf_n_tensors(g), N_ROUND);
    for (int t = 0; t < N_ROUND; t++) {
        const struct test_tensor_spec *tt = &round_tensors[t];
        const struct llmq_gguf_tensor *gt = llmq_gguf_tensor_at(g, t);
        CHECK(gt == llmq_gguf_find_tensor(g, tt->name));
        CHECK_EQ_INT(llmq_gguf_find_tensor_index(g, tt->name), t);
        CHECK(strcmp(gt->view.name, tt->name) == 0);
        CHECK_EQ_INT(gt->view.dtype, tt->dtype);
        CHECK_EQ_INT(gt->ggml_type, llmq_dtype_traits(tt->dtype)->ggml_id);
        CHECK_EQ_INT(gt->view.n_dims, tt->n_dims);
        int64_t nel = 1;
        for (int k = 0; k < 4; k++) {
            int64_t want = k < tt->n_dims ? tt->shape[k] : 1;
            CHECK_EQ_INT(gt->view.shape[k], want);
            CHECK_EQ_INT(gt->ne[k], k < tt->n_dims ? tt->shape[tt->n_dims - 1 - k] : 1);
            nel *= want;
        }
        CHECK_EQ_INT(llmq_tensor_nelements(&gt->view), nel);
        size_t nbytes;
        CHECK(llmq_dtype_nbytes(tt->dtype, nel, &nbytes));
        CHECK_EQ_INT(gt->view.nbytes, nbytes);
        CHECK_EQ_INT(gt->offset % llmq_gguf_alignment(g), 0);
        CHECK_EQ_INT(gt->view.file_offset, llmq_gguf_data_offset(g) + gt->offset);
        const uint8_t *d = gt->view.data;
        for (size_t i = 0; i < nbytes; i++)
            if (d[i] != pattern(t, i)) CHECK(!"tensor bytes differ");
    }
    CHECK(llmq_gguf_find_tensor(g, "nope") == NULL && llmq_gguf_tensor_at(g, N_ROUND) == NULL);
    CHECK(llmq_gguf_find_tensor_index(g, "nope") == -1);

    // copy every KV except two, and check the copy
    struct llmq_gguf_writer *w = llmq_gguf_writer_init();
    const char *except[] = {"t.u8", "a.str", NULL};
    char *copy = tmp_path("roundcopy");
    CHECK_EQ_INT(llmq_gguf_writer_copy_kvs(w, g, except), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, copy), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_commit(w), LLMQ_OK);
    llmq_gguf_writer_free(w);
    struct llmq_gguf *c = NULL;
    CHECK_EQ_INT(llmq_gguf_open(copy, &c), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_n_kv(c), llmq_gguf_n_kv(g) - 2);
    CHECK_EQ_INT(llmq_gguf_n_tensors(c), 0);
    CHECK(!llmq_gguf_find_kv(c, "t.u8") && !llmq_gguf_find_kv(c, "a.str"));
    for (int64_t i = 0; i < llmq_gguf_n_kv(c); i++) {
        const struct llmq_gguf_kv *x = llmq_gguf_kv_at(c, i), *y = llmq_gguf_find_kv(g, x->key);
        CHECK(y && x->type == y->type && x->arr_type == y->arr_type && x->n == y->n && x->nbytes == y->nbytes);
        CHECK(memcmp(x->data, y->data, x->nbytes) == 0);
    }
    llmq_gguf_free(c);
    unlink(copy);
    free(copy);
    llmq_gguf_free(g);
}

static void test_round_trip(void) {
    char *path = tmp_path("round");
    write_round_file(path, 0);
    check_round_file(path, 0);
    write_round_file(path, 64); // honours general.alignment; overwrites the previous file atomically
    check_round_file(path, 64);
    unlink(path);
    free(path);
    llmq_gguf_free(NULL);
}

// ---- stories260K: version 1 and version 3 hold the same model -----------------------------------

static void test_stories_v1_v3(void) {
    char p1[1024], p3[1024];
    test_stories260k(p1, sizeof p1, "tinyllamas-stories-260k-f32.gguf");
    test_stories260k(p3, sizeof p3, "tinyllamas-stories-260k-f32.v3.gguf");
    struct llmq_gguf *a = NULL, *b = NULL;
    CHECK_EQ_INT(llmq_gguf_open(p1, &a), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_open(p3, &b), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_version(a), 1);
    CHECK_EQ_INT(llmq_gguf_version(b), 3);
    CHECK_EQ_INT(llmq_gguf_n_kv(a), llmq_gguf_n_kv(b));
    CHECK(llmq_gguf_n_kv(a) >= 15);
    for (int64_t i = 0; i < llmq_gguf_n_kv(a); i++) {
        const struct llmq_gguf_kv *x = llmq_gguf_kv_at(a, i), *y = llmq_gguf_kv_at(b, i);
        CHECK(strcmp(x->key, y->key) == 0);
        CHECK(x->type == y->type && x->arr_type == y->arr_type && x->n == y->n);
        if (x->type == LLMQ_GGUF_TYPE_ARRAY && x->arr_type == LLMQ_GGUF_TYPE_STRING) {
            for (uint64_t j = 0; j < x->n; j++) {
                size_t lx, ly;
                const char *sx = llmq_gguf_kv_arr_str(x, j, &lx), *sy = llmq_gguf_kv_arr_str(y, j, &ly);
                CHECK(sx && sy && lx == ly && memcmp(sx, sy, lx) == 0);
            }
            CHECK(x->nbytes + 4 * x->n == y->nbytes); // u32 vs u64 lengths
        } else {
            CHECK(x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0);
        }
    }
    const struct llmq_gguf_kv *tok;
    CHECK_EQ_INT(llmq_gguf_get_arr(a, "tokenizer.ggml.tokens", LLMQ_GGUF_TYPE_STRING, &tok), LLMQ_OK);
    CHECK_EQ_INT(tok->n, 512);
    int64_t n_layer;
    CHECK_EQ_INT(llmq_gguf_get_i64(a, "llama.block_count", &n_layer), LLMQ_OK);
    CHECK_EQ_INT(n_layer, 5);
    CHECK_EQ_INT(llmq_gguf_n_tensors(a), llmq_gguf_n_tensors(b));
    CHECK_EQ_INT(llmq_gguf_n_tensors(a), 48);
    for (int64_t i = 0; i < llmq_gguf_n_tensors(a); i++) {
        const struct llmq_tensor_view *x = &llmq_gguf_tensor_at(a, i)->view, *y = &llmq_gguf_tensor_at(b, i)->view;
        CHECK(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->n_dims == y->n_dims);
        CHECK(memcmp(x->shape, y->shape, sizeof(x->shape)) == 0);
        CHECK(x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0);
    }
    const struct llmq_gguf_tensor *emb = llmq_gguf_find_tensor(a, "token_embd.weight");
    CHECK(emb && emb->view.n_dims == 2 && emb->view.shape[0] == 512 && emb->view.shape[1] == 64);
    CHECK(emb->ne[0] == 64 && emb->ne[1] == 512 && emb->view.dtype == LLMQ_DTYPE_F32);
    llmq_gguf_free(a);
    llmq_gguf_free(b);
}

// ---- every prefix of a valid file, and random byte flips: clean errors, no crash ----------------

static void touch_everything(const struct llmq_gguf *g) {
    unsigned sum = 0;
    for (int64_t i = 0; i < llmq_gguf_n_kv(g); i++) {
        const struct llmq_gguf_kv *kv = llmq_gguf_kv_at(g, i);
        int64_t x;
        size_t len;
        for (uint64_t j = 0; kv->type == LLMQ_GGUF_TYPE_ARRAY && j < kv->n; j++) {
            const char *s = llmq_gguf_kv_arr_str(kv, j, &len);
            if (s && len) sum += (unsigned char)s[0] + (unsigned char)s[len - 1];
            if (llmq_gguf_kv_arr_i64(kv, j, &x)) sum += (unsigned)x;
        }
        if (kv->str) sum += (unsigned char)kv->str[kv->nbytes];
    }
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *v = &llmq_gguf_tensor_at(g, i)->view;
        if (v->nbytes) sum += ((const uint8_t *)v->data)[0] + ((const uint8_t *)v->data)[v->nbytes - 1];
    }
    (void)sum;
}

static void test_prefixes_and_flips(void) {
    char *src = tmp_path("fuzzsrc");
    write_round_file(src, 0);
    char *buf;
    size_t n;
    CHECK_EQ_INT(llmq_read_file(src, 1 << 20, &buf, &n), LLMQ_OK);
    struct llmq_gguf *g = NULL;
    CHECK_EQ_INT(llmq_gguf_open(src, &g), LLMQ_OK);
    uint64_t data_end = 0; // end of the last tensor's bytes (the padding after it is optional)
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_tensor_view *v = &llmq_gguf_tensor_at(g, i)->view;
        if (v->file_offset + v->nbytes > data_end) data_end = v->file_offset + v->nbytes;
    }
    llmq_gguf_free(g);
    unlink(src);

    struct bb b = {0};
    llmq_log_set_level(LLMQ_LOG_SILENT);
    for (size_t len = 0; len < n; len++) {
        b.n = 0;
        bb_put(&b, buf, len);
        char *path = bb_save(&b, "prefix");
        enum llmq_status st = llmq_gguf_open(path, &g);
        if (len >= data_end) {
            CHECK_EQ_INT(st, LLMQ_OK);
            llmq_gguf_free(g);
        } else {
            if (st != LLMQ_ERR_TRUNCATED) fprintf(stderr, "prefix %zu: %s\n", len, llmq_last_error());
            CHECK_EQ_INT(st, LLMQ_ERR_TRUNCATED);
            CHECK(g == NULL);
        }
        unlink(path);
        free(path);
    }
    // random byte flips in the header region (xorshift, fixed seed)
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    uint64_t header = data_end > 1200 ? 1200 : data_end;
    int n_ok = 0;
    for (int it = 0; it < 3000; it++) {
        b.n = 0;
        bb_put(&b, buf, n);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            test_xorshift64(&rng);
            size_t pos = (size_t)(rng % header);
            b.p[pos] ^= (uint8_t)(1u << ((rng >> 32) % 8));
        }
        char *path = bb_save(&b, "flip");
        enum llmq_status st = llmq_gguf_open(path, &g);
        if (st == LLMQ_OK) {
            touch_everything(g);
            llmq_gguf_free(g);
            n_ok++;
        } else {
            CHECK(g == NULL && st != LLMQ_ERR_NOMEM && st != LLMQ_ERR_IO);
            CHECK_CONTAINS(llmq_last_error(), path);
        }
        unlink(path);
        free(path);
    }
    llmq_log_set_level(LLMQ_LOG_INFO);
    fprintf(stderr, "test_gguf: %zu prefixes, 3000 flipped files (%d still valid)\n", n, n_ok);
    free(b.p);
    free(buf);
    free(src);
}

// ---- writer misuse and atomicity ---------------------------------------------------------------

static bool tmp_exists(const char *path) {
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    return access(tmp, F_OK) == 0;
}

static struct llmq_gguf_writer *small_writer(void) {
    struct llmq_gguf_writer *w = llmq_gguf_writer_init();
    int64_t shape[2] = {2, 8};
    CHECK(w);
    CHECK_EQ_INT(llmq_gguf_writer_set_str(w, "general.name", "x"), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "b", LLMQ_DTYPE_F16, 2, shape), LLMQ_OK);
    return w;
}

static void test_writer_errors(void) {
    char *path = tmp_path("writer");
    float data[16] = {0};
    unlink(path);

    // abort: nothing at the path, no temporary left
    struct llmq_gguf_writer *w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
    CHECK(tmp_exists(path));
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 64), LLMQ_OK);
    llmq_gguf_writer_abort(w);
    CHECK(!llmq_file_exists(path) && !tmp_exists(path));
    CHECK_EQ_INT(llmq_gguf_writer_commit(w), LLMQ_ERR_ARG);
    CHECK(!llmq_file_exists(path));
    llmq_gguf_writer_free(w);

    // free of an uncommitted writer aborts too
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
    llmq_gguf_writer_free(w);
    CHECK(!llmq_file_exists(path) && !tmp_exists(path));

    // an existing file survives an aborted rewrite
    {
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite("old", 1, 3, f) == 3 && fclose(f) == 0);
        w = small_writer();
        CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
        llmq_gguf_writer_abort(w);
        llmq_gguf_writer_free(w);
        char *txt;
        size_t n;
        CHECK_EQ_INT(llmq_read_file(path, 100, &txt, &n), LLMQ_OK);
        CHECK(n == 3 && memcmp(txt, "old", 3) == 0);
        free(txt);
        unlink(path);
    }

    // a write crossing a tensor's end fails and removes the temporary
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 60), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 8), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "crosses the end of tensor 'a'");
    CHECK(!tmp_exists(path));
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 4), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_commit(w), LLMQ_ERR_ARG);
    CHECK(!llmq_file_exists(path));
    llmq_gguf_writer_free(w);

    // commit before every tensor was written
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 64), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 10), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_commit(w), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "tensor 'b' has 10 of 32 bytes");
    CHECK(!llmq_file_exists(path) && !tmp_exists(path));
    llmq_gguf_writer_free(w);

    // too much data after the last tensor; set/add after begin
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_set_u32(w, "late", 1), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "late", LLMQ_DTYPE_F32, 0, NULL), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 64), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 32), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, data, 1), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "after the last tensor");
    CHECK(!llmq_file_exists(path) && !tmp_exists(path));
    llmq_gguf_writer_free(w);

    // declaration errors
    w = small_writer();
    int64_t s1[1] = {8}, s33[1] = {33}, sneg[2] = {-1, 4}, sbig[2] = {INT64_MAX, 2};
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 1, s1), LLMQ_ERR_DUPLICATE);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "u8", LLMQ_DTYPE_U8, 1, s1), LLMQ_ERR_UNSUPPORTED);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "q", LLMQ_DTYPE_Q4_0, 1, s33), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "neg", LLMQ_DTYPE_F32, 2, sneg), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "big", LLMQ_DTYPE_F32, 2, sbig), LLMQ_ERR_OVERFLOW);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "d5", LLMQ_DTYPE_F32, 5, s1), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "", LLMQ_DTYPE_F32, 1, s1), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_add_tensor(w, "x\xff", LLMQ_DTYPE_F32, 1, s1), LLMQ_ERR_ARG);
    CHECK_EQ_INT(
        llmq_gguf_writer_add_tensor(w, "blk.0.a-name-that-is-far-too-long-for-llama.cpp-which-allows-only-63-bytes",
                                    LLMQ_DTYPE_F32, 1, s1),
        LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_gguf_writer_set_u32(w, "general.alignment", 48), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "general.alignment");
    CHECK(!llmq_file_exists(path) && !tmp_exists(path));
    llmq_gguf_writer_free(w);
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, "/nonexistent-dir/x.gguf"), LLMQ_ERR_IO);
    llmq_gguf_writer_free(w);
    llmq_gguf_writer_free(NULL);
    free(path);
}

// The whole file at path (n bytes), malloc'd.
static uint8_t *slurp(const char *path, size_t *n) {
    char *txt = NULL;
    CHECK_EQ_INT(llmq_read_file(path, 1 << 20, &txt, n), LLMQ_OK);
    return (uint8_t *)txt;
}

// begin_part / sync: an output written into a file of the caller's, interrupted after a sync (more bytes after it,
// as a killed run leaves them) and continued, has the bytes of one written in one go; the part survives abort.
static void test_writer_part(void) {
    char *path = tmp_path("whole"), *out = tmp_path("resumed"), *part = tmp_path("resumed.part"),
         *other = tmp_path("other");
    float a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = (float)i, b[i] = (float)-i;
    unlink(path), unlink(out), unlink(part);
    struct llmq_gguf_writer *w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin(w, path), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, a, 64), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, b, 32), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_commit(w), LLMQ_OK);
    llmq_gguf_writer_free(w);

    int64_t done = -1;
    uint64_t off = 0;
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin_part(w, out, part, 0, 0), LLMQ_OK);
    CHECK(!tmp_exists(out) && llmq_file_exists(part));
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, a, 64), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_sync(w, &done, &off), LLMQ_OK);
    CHECK(done == 1 && off > 64);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, b, 10), LLMQ_OK); // a part of tensor b after the sync
    CHECK_EQ_INT(llmq_gguf_writer_sync(w, &done, &off), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "outside a tensor boundary");
    llmq_gguf_writer_free(w); // the failure aborted it: part stays, nothing at out
    CHECK(llmq_file_exists(part) && !llmq_file_exists(out));

    // a resume at another offset, or with fewer bytes in part than recorded, is refused and changes nothing
    struct stat sb;
    CHECK(stat(part, &sb) == 0);
    off_t len = sb.st_size;
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin_part(w, out, part, 1, off + 32), LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "not where this file's tensors end");
    llmq_gguf_writer_free(w);
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin_part(w, out, part, 3, off), LLMQ_ERR_CORRUPT); // more tensors than declared
    llmq_gguf_writer_free(w);
    CHECK(stat(part, &sb) == 0 && sb.st_size == len);

    // continued after tensor a: the bytes after the sync are cut, tensor b written again
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin_part(w, out, part, 1, off), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_write_tensor(w, b, 32), LLMQ_OK);
    CHECK_EQ_INT(llmq_gguf_writer_commit(w), LLMQ_OK);
    llmq_gguf_writer_free(w);
    CHECK(!llmq_file_exists(part));
    size_t n1, n2;
    uint8_t *x = slurp(path, &n1), *y = slurp(out, &n2);
    CHECK(n1 == n2 && memcmp(x, y, n1) == 0);
    free(x);
    free(y);

    // a part shorter than its recorded offset (or missing) is refused
    test_write_file(part, "GGUF", 4);
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin_part(w, other, part, 1, off), LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "fewer than the");
    llmq_gguf_writer_free(w);
    unlink(part);
    w = small_writer();
    CHECK_EQ_INT(llmq_gguf_writer_begin_part(w, other, part, 1, off), LLMQ_ERR_CORRUPT);
    llmq_gguf_writer_free(w);
    CHECK(!llmq_file_exists(other));
    unlink(path), unlink(out);
    free(path);
    free(out);
    free(part);
    free(other);
}

int main(void) {
    test_corrupt();
    test_round_trip();
    test_stories_v1_v3();
    test_prefixes_and_flips();
    test_writer_errors();
    test_writer_part();
    fprintf(stderr, "test_gguf: ok\n");
    return 0;
}
