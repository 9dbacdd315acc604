// tests/unit/test_safetensors.c — formats/safetensors: writer -> reader round trips (single file and
// sharded, all 10 dtypes, scalar and zero-size tensors), the name index, writer failure paths that
// must leave nothing behind, and one handcrafted file per validation check of the reader.
#include "harness.h"
#include "tensor_specs.h"

#include "common/dtype.h"
#include "common/io.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/safetensors.h"

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

// ------------------------------------------------------------------------------------ helpers ----

// A safetensors file: le64 length of `header`, the header, then data_len pattern bytes.
static void write_st(const char *path, const char *header, size_t data_len) {
    size_t hn = strlen(header);
    uint8_t *buf = malloc(8 + hn + data_len + 1);
    CHECK(buf != NULL);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    memcpy(buf + 8, header, hn);
    for (size_t i = 0; i < data_len; i++) buf[8 + hn + i] = (uint8_t)(i * 7 + 3);
    test_write_file(path, buf, 8 + hn + data_len);
    free(buf);
}

static void write_text(const char *path, const char *text) { test_write_file(path, text, strlen(text)); }

static char *join(const char *dir, const char *name) {
    char *p = llmq_path_join(dir, name);
    CHECK(p != NULL);
    return p;
}

static char *make_dir(const char *tag) {
    char tmpl[128];
    snprintf(tmpl, sizeof(tmpl), "/tmp/llmq_st_%s_XXXXXX", tag);
    char *d = mkdtemp(tmpl);
    CHECK(d != NULL);
    char *copy = strdup(d);
    CHECK(copy != NULL);
    return copy;
}

// Removes the files of a flat directory and the directory itself.
static void remove_dir(char *dir) {
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = join(dir, de->d_name);
        CHECK(unlink(p) == 0);
        free(p);
    }
    closedir(d);
    CHECK(rmdir(dir) == 0);
    free(dir);
}

// Opening `path` fails with status `st`; the message names `file` and contains `word`. `what` names the case.
static void expect_fail_at(const char *path, enum llmq_status st, const char *file, const char *word,
                           const char *what) {
    struct llmq_st_model *m = (struct llmq_st_model *)&m; // must be reset to NULL
    llmq_clear_error();
    enum llmq_status got = llmq_st_open(path, &m);
    if (got != st) fprintf(stderr, "%s: %s: got %s (%s)\n", what, path, llmq_status_name(got), llmq_last_error());
    CHECK_EQ_INT(got, st);
    CHECK(m == NULL);
    CHECK_EQ_INT(llmq_last_status(), st);
    CHECK_CONTAINS(llmq_last_error(), file);
    CHECK_CONTAINS(llmq_last_error(), word);
}
#define LINE_STR_(x) #x
#define LINE_STR(x) LINE_STR_(x)
#define EXPECT_FAIL(path, st, word) expect_fail_at(path, st, path, word, "line " LINE_STR(__LINE__))
#define EXPECT_FAIL_FILE(path, st, file, word) expect_fail_at(path, st, file, word, "line " LINE_STR(__LINE__))

static struct llmq_st_model *open_ok(const char *path) {
    struct llmq_st_model *m = NULL;
    enum llmq_status st = llmq_st_open(path, &m);
    if (st) fprintf(stderr, "%s: %s\n", path, llmq_last_error());
    CHECK_EQ_INT(st, LLMQ_OK);
    CHECK(m != NULL);
    return m;
}

// ------------------------------------------------------------------------ the round-trip set ----

// The set every round trip writes and checks: tests/tensor_specs.h (main sets these).
static const struct test_tensor_spec *SPECS;
static int N_SPECS;

static size_t spec_nbytes(const struct test_tensor_spec *s) {
    return (size_t)test_spec_numel(s) * llmq_dtype_traits(s->dtype)->size;
}

static uint8_t *spec_data(int k) { // deterministic bytes of tensor k (BOOL stays 0/1)
    size_t n = spec_nbytes(&SPECS[k]);
    uint8_t *p = malloc(n + 1);
    CHECK(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = SPECS[k].dtype == LLMQ_DTYPE_BOOL ? (uint8_t)(i % 3 == 0) : (uint8_t)(i * 31 + (size_t)k * 7 + 1);
    return p;
}

// Writes SPECS into dir; odd tensors except "big" go through write_tensor, even ones and "big" in 5-byte
// pieces.
static void write_specs(const char *dir, uint64_t limit, int *n_shards) {
    struct llmq_st_writer *w = NULL;
    CHECK_EQ_INT(llmq_st_writer_init(dir, limit, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_set_metadata(w, "format", "pt"), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_set_metadata(w, "llmq.n\xc3\xb6te", "h\xc3\xa9llo \xe2\x9c\x93"), LLMQ_OK);
    for (int k = 0; k < N_SPECS; k++)
        CHECK_EQ_INT(llmq_st_writer_add_tensor(w, SPECS[k].name, SPECS[k].dtype, SPECS[k].n_dims, SPECS[k].shape),
                     LLMQ_OK);
    *n_shards = llmq_st_writer_n_shards(w);
    for (int k = 0; k < N_SPECS; k++) {
        uint8_t *p = spec_data(k);
        size_t n = spec_nbytes(&SPECS[k]);
        if (k % 2 && strcmp(SPECS[k].name, "big")) {
            CHECK_EQ_INT(llmq_st_writer_write_tensor(w, SPECS[k].name, p, n), LLMQ_OK);
        } else {
            for (size_t off = 0; off < n; off += 5)
                CHECK_EQ_INT(llmq_st_writer_write(w, p + off, n - off < 5 ? n - off : 5), LLMQ_OK);
        }
        free(p);
    }
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_OK);
}

static void check_specs(const struct llmq_st_model *m) {
    CHECK_EQ_INT(llmq_st_n_tensors(m), N_SPECS);
    uint64_t total = 0;
    for (int k = 0; k < N_SPECS; k++) {
        const struct llmq_tensor_view *t = llmq_st_tensor(m, k); // file order == declared order
        CHECK(t != NULL);
        CHECK(strcmp(t->name, SPECS[k].name) == 0);
        CHECK(llmq_st_get(m, SPECS[k].name) == t);
        CHECK_EQ_INT(llmq_st_find(m, SPECS[k].name), k);
        CHECK_EQ_INT(t->dtype, SPECS[k].dtype);
        CHECK_EQ_INT(t->n_dims, SPECS[k].n_dims);
        for (int d = 0; d < 4; d++) CHECK_EQ_INT(t->shape[d], d < SPECS[k].n_dims ? SPECS[k].shape[d] : 1);
        CHECK_EQ_INT(t->nbytes, spec_nbytes(&SPECS[k]));
        uint8_t *p = spec_data(k);
        CHECK(t->nbytes == 0 || memcmp(t->data, p, t->nbytes) == 0);
        free(p);
        const struct llmq_st_shard_info *sh = llmq_st_shard(m, llmq_st_tensor_shard(m, k));
        CHECK(sh != NULL);
        CHECK(t->file_offset >= sh->data_start && t->file_offset + t->nbytes <= sh->file_size);
        total += t->nbytes;
    }
    CHECK(llmq_st_tensor(m, N_SPECS) == NULL && llmq_st_tensor(m, -1) == NULL);
    CHECK(llmq_st_get(m, "missing") == NULL && llmq_st_find(m, "missing") == -1);
    CHECK_EQ_INT(llmq_st_total_bytes(m), total);
    CHECK_EQ_INT(llmq_st_n_metadata(m), 2);
    CHECK(strcmp(llmq_st_metadata_key(m, 0), "format") == 0 && strcmp(llmq_st_metadata_value(m, 0), "pt") == 0);
    CHECK(strcmp(llmq_st_metadata_get(m, "llmq.n\xc3\xb6te"), "h\xc3\xa9llo \xe2\x9c\x93") == 0);
    CHECK(llmq_st_metadata_get(m, "nope") == NULL && llmq_st_metadata_key(m, 2) == NULL);
    for (int s = 0; s < llmq_st_n_shards(m); s++) CHECK_EQ_INT(llmq_st_shard(m, s)->data_start % 8, 0);
}

static void test_roundtrip_single(void) {
    char *dir = make_dir("single");
    int n_shards = 0;
    write_specs(dir, 0, &n_shards);
    CHECK_EQ_INT(n_shards, 1);
    CHECK_EQ_INT(test_count_entries(dir), 1); // model.safetensors only: no index, no temporaries
    char *file = join(dir, LLMQ_ST_SINGLE_NAME);
    struct llmq_st_model *m = open_ok(file);
    check_specs(m);
    CHECK_EQ_INT(llmq_st_n_shards(m), 1);
    CHECK(llmq_st_index_path(m) == NULL && strcmp(llmq_st_path(m), file) == 0);
    const struct llmq_st_shard_info *sh = llmq_st_shard(m, 0);
    CHECK(strcmp(sh->file_name, LLMQ_ST_SINGLE_NAME) == 0 && sh->n_tensors == N_SPECS);
    CHECK(llmq_st_shard(m, 1) == NULL && llmq_st_tensor_shard(m, N_SPECS) == -1);
    // the header is padded with spaces to a multiple of 8
    const char *hdr = (const char *)llmq_st_tensor(m, 0)->data - llmq_st_tensor(m, 0)->file_offset + 8;
    CHECK_EQ_INT(sh->header_len % 8, 0);
    CHECK(hdr[0] == '{' && (hdr[sh->header_len - 1] == ' ' || hdr[sh->header_len - 1] == '}'));
    llmq_st_free(m);
    m = open_ok(dir); // the directory resolves to model.safetensors
    check_specs(m);
    llmq_st_free(m);
    llmq_st_free(NULL);
    free(file);
    remove_dir(dir);
}

static void test_roundtrip_sharded(void) {
    char *dir = make_dir("sharded");
    int n_shards = 0;
    write_specs(dir, 100, &n_shards); // "big" (8448 bytes) exceeds the limit: a shard of its own
    CHECK(n_shards >= 4);
    CHECK_EQ_INT(test_count_entries(dir), n_shards + 1);
    char *index = join(dir, LLMQ_ST_INDEX_NAME);
    struct llmq_st_model *m = open_ok(index);
    check_specs(m);
    CHECK_EQ_INT(llmq_st_n_shards(m), n_shards);
    CHECK(strcmp(llmq_st_index_path(m), index) == 0);
    int64_t sum = 0;
    for (int s = 0; s < n_shards; s++) {
        const struct llmq_st_shard_info *sh = llmq_st_shard(m, s);
        char want[64];
        snprintf(want, sizeof(want), "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        CHECK(strcmp(sh->file_name, want) == 0);
        sum += sh->n_tensors;
        uint64_t data = 0;
        for (int64_t i = 0; i < llmq_st_n_tensors(m); i++)
            if (llmq_st_tensor_shard(m, i) == s) data += llmq_st_tensor(m, i)->nbytes;
        CHECK(data <= 100 || llmq_st_tensor_shard(m, llmq_st_find(m, "big")) == s ||
              llmq_st_tensor_shard(m, 0) == s); // over the limit only for a single oversized tensor
        CHECK_EQ_INT(sh->file_size, sh->data_start + data);
    }
    CHECK_EQ_INT(sum, N_SPECS);
    // tensors keep declared order across shards: shard numbers never decrease
    for (int k = 1; k < N_SPECS; k++) CHECK(llmq_st_tensor_shard(m, k) >= llmq_st_tensor_shard(m, k - 1));
    CHECK_EQ_INT(llmq_st_tensor_shard(m, llmq_st_find(m, "big")), n_shards - 1);
    llmq_st_free(m);
    m = open_ok(dir); // the directory resolves to the index
    check_specs(m);
    llmq_st_free(m);
    // the index JSON carries total_size
    char *text = NULL;
    CHECK_EQ_INT(llmq_read_file(index, 1 << 20, &text, NULL), LLMQ_OK);
    CHECK_CONTAINS(text, "\"total_size\"");
    CHECK_CONTAINS(text, "\"big\": \"model-");
    free(text);
    free(index);
    remove_dir(dir);
}

// Many tensors: every name is found through the hash, in file order, and lookups of absent names fail.
static void test_many_tensors(void) {
    char *dir = make_dir("many");
    struct llmq_st_writer *w = NULL;
    const int n = 5000;
    char name[64];
    CHECK_EQ_INT(llmq_st_writer_init(dir, 4096, &w), LLMQ_OK);
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "layers.%d.w", i);
        int64_t shape[1] = {i % 3};
        CHECK_EQ_INT(llmq_st_writer_add_tensor(w, name, LLMQ_DTYPE_I32, 1, shape), LLMQ_OK);
    }
    for (int i = 0; i < n; i++) {
        int32_t v[2] = {i, -i};
        snprintf(name, sizeof(name), "layers.%d.w", i);
        CHECK_EQ_INT(llmq_st_writer_write_tensor(w, name, v, (size_t)(i % 3) * 4), LLMQ_OK);
    }
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_OK);
    struct llmq_st_model *m = open_ok(dir);
    CHECK_EQ_INT(llmq_st_n_tensors(m), n);
    CHECK(llmq_st_n_shards(m) > 1);
    for (int i = n - 1; i >= 0; i--) {
        snprintf(name, sizeof(name), "layers.%d.w", i);
        CHECK_EQ_INT(llmq_st_find(m, name), i);
        const struct llmq_tensor_view *t = llmq_st_tensor(m, i);
        if (i % 3 >= 1) CHECK_EQ_INT(((const int32_t *)t->data)[0], i); // aligned: data starts at 8k, offsets 4k
        snprintf(name, sizeof(name), "layers.%d.x", i);
        CHECK_EQ_INT(llmq_st_find(m, name), -1);
    }
    llmq_st_free(m);
    remove_dir(dir);
}

// Writes one U8 tensor of n bytes (value b) into dir.
static void write_u8(const char *dir, uint64_t limit, int n_tensors, int64_t n, uint8_t b) {
    struct llmq_st_writer *w = NULL;
    uint8_t buf[64];
    char name[32];
    CHECK(n <= 64);
    memset(buf, b, sizeof(buf));
    CHECK_EQ_INT(llmq_st_writer_init(dir, limit, &w), LLMQ_OK);
    for (int k = 0; k < n_tensors; k++) {
        snprintf(name, sizeof(name), "t%d", k);
        CHECK_EQ_INT(llmq_st_writer_add_tensor(w, name, LLMQ_DTYPE_U8, 1, &n), LLMQ_OK);
    }
    for (int k = 0; k < n_tensors; k++) CHECK_EQ_INT(llmq_st_writer_write(w, buf, (size_t)n), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_OK);
}

// A new save replaces the checkpoint files of an earlier one and nothing else.
static void test_rewrite_removes_stale(void) {
    char *dir = make_dir("stale");
    char *other = join(dir, "config.json"), *lookalike = join(dir, "model-1-of-2.safetensors");
    write_text(other, "{}");
    write_text(lookalike, "x");
    write_u8(dir, 16, 5, 10, 1); // 5 shards + index
    CHECK_EQ_INT(test_count_entries(dir), 2 + 6);
    write_u8(dir, 32, 4, 10, 2); // 2 shards: the old 5-shard files go
    CHECK_EQ_INT(test_count_entries(dir), 2 + 3);
    struct llmq_st_model *m = open_ok(dir);
    CHECK_EQ_INT(llmq_st_n_tensors(m), 4);
    CHECK_EQ_INT(*(const uint8_t *)llmq_st_tensor(m, 3)->data, 2);
    llmq_st_free(m);
    write_u8(dir, 0, 3, 10, 3); // one file: the shards and the index go
    CHECK_EQ_INT(test_count_entries(dir), 2 + 1);
    m = open_ok(dir);
    CHECK_EQ_INT(llmq_st_n_tensors(m), 3);
    llmq_st_free(m);
    write_u8(dir, 10, 2, 10, 4); // sharded again: model.safetensors goes
    CHECK_EQ_INT(test_count_entries(dir), 2 + 3);
    m = open_ok(dir);
    CHECK_EQ_INT(llmq_st_n_shards(m), 2);
    llmq_st_free(m);
    CHECK(llmq_file_exists(other) && llmq_file_exists(lookalike));
    free(other);
    free(lookalike);
    remove_dir(dir);
}

// A tensor past 4 GiB in a sparse file: 64-bit offsets and sizes, and opening reads only the header.
static void test_large_sparse(void) {
    char *dir = make_dir("sparse");
    char *p = join(dir, "big.safetensors");
    const uint64_t big = 5ull << 30;
    char hdr[256];
    snprintf(hdr, sizeof(hdr),
             "{\"small\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"huge\":{\"dtype\":\"BF16\",\"shape\":[1024,%llu],\"data_offsets\":[8,%llu]}}",
             (unsigned long long)(big / 2048), (unsigned long long)(big + 8));
    write_st(p, hdr, 8);
    FILE *f = fopen(p, "r+b");
    CHECK(f != NULL);
    int ok = ftruncate(fileno(f), (off_t)(8 + strlen(hdr) + 8 + big)) == 0;
    fclose(f);
    if (ok) { // some file systems refuse sparse files this large: then only the header is checked
        struct llmq_st_model *m = open_ok(p);
        const struct llmq_tensor_view *t = llmq_st_get(m, "huge");
        CHECK(t != NULL && t->nbytes == big && t->shape[1] == (int64_t)(big / 2048));
        CHECK_EQ_INT(t->file_offset, 8 + strlen(hdr) + 8);
        CHECK_EQ_INT(llmq_st_total_bytes(m), big + 8);
        llmq_st_free(m);
        CHECK(truncate(p, (off_t)(8 + strlen(hdr) + 8 + big - 1)) == 0); // one byte short
        EXPECT_FAIL(p, LLMQ_ERR_TRUNCATED, "'huge'");
    }
    free(p);
    remove_dir(dir);
}

// ------------------------------------------------------------------------- writer failures ----

static void test_writer_failures(void) {
    char *dir = make_dir("wfail");
    struct llmq_st_writer *w = NULL;
    int64_t shape[2] = {2, 3};
    float buf[6] = {1, 2, 3, 4, 5, 6};

    // abort after some data: nothing remains, not even temporaries
    CHECK_EQ_INT(llmq_st_writer_init(dir, 16, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "b", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write_tensor(w, "a", buf, sizeof(buf)), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write(w, buf, 4), LLMQ_OK);
    CHECK(test_count_entries(dir) >= 1); // temporaries exist while writing...
    llmq_st_writer_abort(w);
    CHECK_EQ_INT(test_count_entries(dir), 0); // ...and are gone after abort
    llmq_st_writer_abort(NULL);

    // finish with a tensor incomplete: ARG, nothing left
    CHECK_EQ_INT(llmq_st_writer_init(dir, 0, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "b", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write_tensor(w, "a", buf, sizeof(buf)), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write(w, buf, 8), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "'b': only 8 of 24 bytes");
    CHECK_EQ_INT(test_count_entries(dir), 0);

    // declaration errors are rejected one by one and do not poison the writer
    CHECK_EQ_INT(llmq_st_writer_init(dir, 0, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F16, 1, shape), LLMQ_ERR_DUPLICATE);
    CHECK_CONTAINS(llmq_last_error(), "'a' declared twice");
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "q", LLMQ_DTYPE_Q4_0, 1, shape), LLMQ_ERR_UNSUPPORTED);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "", LLMQ_DTYPE_F32, 1, shape), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "__metadata__", LLMQ_DTYPE_F32, 1, shape), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "bad\xff", LLMQ_DTYPE_F32, 1, shape), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "five", LLMQ_DTYPE_F32, 5, shape), LLMQ_ERR_ARG);
    int64_t neg[1] = {-1}, huge[2] = {INT64_MAX / 2, 3}, wide[1] = {INT64_MAX / 2};
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "neg", LLMQ_DTYPE_F32, 1, neg), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "huge", LLMQ_DTYPE_F32, 2, huge), LLMQ_ERR_OVERFLOW);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "wide", LLMQ_DTYPE_F32, 1, wide), LLMQ_ERR_OVERFLOW);
    CHECK_EQ_INT(llmq_st_writer_set_metadata(w, "k", "v"), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_set_metadata(w, "k", "w"), LLMQ_ERR_DUPLICATE);
    CHECK_EQ_INT(llmq_st_writer_write_tensor(w, "a", buf, sizeof(buf)), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "late", LLMQ_DTYPE_F32, 1, shape), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_st_writer_set_metadata(w, "late", "v"), LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_OK);
    char *file = join(dir, LLMQ_ST_SINGLE_NAME);
    struct llmq_st_model *m = open_ok(file);
    CHECK_EQ_INT(llmq_st_n_tensors(m), 1);
    CHECK(strcmp(llmq_st_metadata_get(m, "k"), "v") == 0);
    llmq_st_free(m);
    CHECK(unlink(file) == 0);

    // data errors poison the writer; finish then fails and leaves nothing
    CHECK_EQ_INT(llmq_st_writer_init(dir, 0, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "b", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write_tensor(w, "b", buf, sizeof(buf)), LLMQ_ERR_ARG); // out of order
    CHECK_CONTAINS(llmq_last_error(), "'a' comes next");
    CHECK_EQ_INT(llmq_st_writer_write_tensor(w, "a", buf, sizeof(buf)), LLMQ_ERR_ARG); // poisoned
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_ERR_ARG);
    CHECK_EQ_INT(test_count_entries(dir), 0);

    CHECK_EQ_INT(llmq_st_writer_init(dir, 0, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write_tensor(w, "a", buf, 20), LLMQ_ERR_ARG); // wrong size
    CHECK_CONTAINS(llmq_last_error(), "20 bytes given, 24 declared");
    llmq_st_writer_abort(w);
    CHECK_EQ_INT(test_count_entries(dir), 0);

    CHECK_EQ_INT(llmq_st_writer_init(dir, 0, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write(w, buf, sizeof(buf)), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write(w, buf, 1), LLMQ_ERR_ARG); // past the last byte
    CHECK_CONTAINS(llmq_last_error(), "past the last declared tensor");
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_ERR_ARG);
    CHECK_EQ_INT(test_count_entries(dir), 0);

    // an existing checkpoint survives a failed rewrite untouched
    CHECK_EQ_INT(llmq_st_writer_init(dir, 0, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_OK); // zero tensors: a valid, empty checkpoint
    m = open_ok(dir);
    CHECK_EQ_INT(llmq_st_n_tensors(m), 0);
    llmq_st_free(m);
    struct stat before, after;
    CHECK(stat(file, &before) == 0);
    CHECK_EQ_INT(llmq_st_writer_init(dir, 0, &w), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_add_tensor(w, "a", LLMQ_DTYPE_F32, 2, shape), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_write(w, buf, 3), LLMQ_OK);
    CHECK_EQ_INT(llmq_st_writer_finish(w), LLMQ_ERR_ARG);
    CHECK(stat(file, &after) == 0 && after.st_size == before.st_size && after.st_ino == before.st_ino);
    CHECK_EQ_INT(test_count_entries(dir), 1);
    CHECK(unlink(file) == 0);

    // no such output directory
    char *missing = join(dir, "nope");
    CHECK_EQ_INT(llmq_st_writer_init(missing, 0, &w), LLMQ_ERR_IO);
    CHECK(w == NULL);
    CHECK_CONTAINS(llmq_last_error(), missing);
    free(missing);
    free(file);
    remove_dir(dir);
}

// ---------------------------------------------------------------------- handcrafted corrupt files ----

#define T_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void test_corrupt_files(void) {
    char *dir = make_dir("corrupt");
    char *p = join(dir, "x.safetensors");
    uint8_t raw[64] = {0};

    // --- the 8-byte length prefix
    test_write_file(p, raw, 0);
    EXPECT_FAIL(p, LLMQ_ERR_TRUNCATED, "shorter than the 8-byte");
    test_write_file(p, raw, 5);
    EXPECT_FAIL(p, LLMQ_ERR_TRUNCATED, "shorter than the 8-byte");
    uint64_t n = 100000001; // one past the limit
    for (int i = 0; i < 8; i++) raw[i] = (uint8_t)(n >> (8 * i));
    test_write_file(p, raw, 16);
    EXPECT_FAIL(p, LLMQ_ERR_OVERFLOW, "exceeds the limit");
    memset(raw, 0xff, 8); // 2^64 - 1: must not wrap 8 + N
    test_write_file(p, raw, 16);
    EXPECT_FAIL(p, LLMQ_ERR_OVERFLOW, "exceeds the limit");
    memset(raw, 0, 8);
    raw[0] = 100; // header length 100, but only 20 bytes follow
    memcpy(raw + 8, "{}                  ", 20);
    test_write_file(p, raw, 28);
    EXPECT_FAIL(p, LLMQ_ERR_TRUNCATED, "past the end of the file");

    {
        static const char nul_pad[] = "\x08\0\0\0\0\0\0\0{}\0\0\0\0\0\0"; // NUL is not padding
        test_write_file(p, nul_pad, 16);
        EXPECT_FAIL(p, LLMQ_ERR_CORRUPT, "not valid JSON");
    }

    // a header each: a file of it and data_len pattern bytes is refused with status st, the message holding word
    // (and word2 when set)
    static const struct {
        const char *header;
        size_t data_len;
        enum llmq_status st;
        const char *word, *word2;
    } bad[] = {
        // --- the header text
        {"{\"a\xff\":1}", 0, LLMQ_ERR_CORRUPT, "UTF-8", NULL},
        {"{\"\xed\xa0\x80\":1}", 0, LLMQ_ERR_CORRUPT, "UTF-8", NULL}, // an encoded surrogate
        {"", 0, LLMQ_ERR_CORRUPT, "does not start with '{'", NULL},
        {" {}", 0, LLMQ_ERR_CORRUPT, "does not start with '{'", NULL},
        {"[]", 0, LLMQ_ERR_CORRUPT, "does not start with '{'", NULL},
        {"{" T_A, 8, LLMQ_ERR_CORRUPT, "not valid JSON", NULL},
        {"{}x", 0, LLMQ_ERR_CORRUPT, "not valid JSON", NULL},
        {"{\"a\\u0000b\":{}}", 0, LLMQ_ERR_CORRUPT, "not valid JSON", NULL},
        {"{" T_A "," T_A "}", 16, LLMQ_ERR_DUPLICATE, "duplicate key", "'\"a\"'"},
        // --- __metadata__
        {"{\"__metadata__\":{\"k\":1}," T_A "}", 8, LLMQ_ERR_CORRUPT, "non-string value", NULL},
        {"{\"__metadata__\":[\"k\"]," T_A "}", 8, LLMQ_ERR_CORRUPT, "\"__metadata__\" is not a JSON object", NULL},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," T_A "}", 8, LLMQ_ERR_DUPLICATE, "duplicate key", NULL},
        // --- entry structure and types
        {"{\"a\":[1,2]}", 0, LLMQ_ERR_CORRUPT, "entry is not a JSON object", NULL},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_CORRUPT, "\"dtype\"", NULL},
        {"{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_CORRUPT, "\"dtype\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_CORRUPT, "\"shape\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_CORRUPT, "\"shape\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, LLMQ_ERR_CORRUPT, "\"data_offsets\"", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8, LLMQ_ERR_CORRUPT, "\"data_offsets\"",
         NULL},
        // --- shape
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_CORRUPT,
         "shape[0] is not a non-negative integer", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_CORRUPT,
         "shape[1] is not a non-negative integer", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_CORRUPT, "shape[0]", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_OVERFLOW,
         "element count overflows", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_OVERFLOW,
         "too large for int64", NULL},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_OVERFLOW,
         "overflow the byte size", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_UNSUPPORTED, "5 dims",
         NULL},
        // --- dtype
        {"{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_UNSUPPORTED,
         "unsupported dtype \"F8_E4M3\"", "'w'"},
        {"{\"w\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, LLMQ_ERR_UNSUPPORTED, "\"f32\"", NULL},
        // --- data_offsets
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, LLMQ_ERR_CORRUPT, "begin > end", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, LLMQ_ERR_CORRUPT,
         "not non-negative integers", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8, LLMQ_ERR_CORRUPT,
         "not non-negative integers", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12, LLMQ_ERR_CORRUPT, "size mismatch",
         NULL},
        {"{" T_A "}", 5, LLMQ_ERR_TRUNCATED, "past the end of the data section", "'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775800,9223372036854775807]}}", 8,
         LLMQ_ERR_CORRUPT, "size mismatch", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775799,9223372036854775807]}}", 8,
         LLMQ_ERR_TRUNCATED, "past the end of the data section", NULL},
        // --- coverage of the data section
        {"{" T_A ",\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, LLMQ_ERR_CORRUPT,
         "overlaps tensor 'a'", NULL},
        {"{" T_A ",\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, LLMQ_ERR_CORRUPT, "overlaps",
         NULL},
        {"{" T_A ",\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[12,16]}}", 16, LLMQ_ERR_CORRUPT,
         "gap of 4 unused bytes at data offset 8", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, LLMQ_ERR_CORRUPT,
         "gap of 4 unused bytes at data offset 0", NULL},
        {"{" T_A "}", 9, LLMQ_ERR_CORRUPT, "1 trailing byte(s)", NULL},
        {"{}", 1, LLMQ_ERR_CORRUPT, "trailing byte(s)", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_st(p, bad[i].header, bad[i].data_len);
        expect_fail_at(p, bad[i].st, p, bad[i].word, bad[i].header);
        if (bad[i].word2) CHECK_CONTAINS(llmq_last_error(), bad[i].word2);
    }

    struct llmq_st_model *m;
    // --- valid corner cases: padding, zero-size tensors sharing an offset, tensors out of data order
    write_st(p, "{" T_A "}        ", 8);
    m = open_ok(p);
    CHECK_EQ_INT(llmq_st_n_tensors(m), 1);
    llmq_st_free(m);
    write_st(p,
             "{\"z\":{\"dtype\":\"BOOL\",\"shape\":[0],\"data_offsets\":[8,8]},"
             "\"b\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[8,12]}," T_A
             ",\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[12,13]}}\n\t ",
             13);
    m = open_ok(p);
    CHECK_EQ_INT(llmq_st_n_tensors(m), 4);
    CHECK(strcmp(llmq_st_tensor(m, 0)->name, "z") == 0 && strcmp(llmq_st_tensor(m, 2)->name, "a") == 0);
    CHECK_EQ_INT(llmq_st_tensor(m, 3)->n_dims, 0);
    CHECK_EQ_INT(*(const uint8_t *)llmq_st_tensor(m, 3)->data, (uint8_t)(12 * 7 + 3));
    CHECK_EQ_INT(llmq_st_tensor(m, 1)->file_offset, llmq_st_shard(m, 0)->data_start + 8);
    llmq_st_free(m);

    free(p);
    remove_dir(dir);
}

// ---------------------------------------------------------------- sharded sets and directories ----

static void write_shard(const char *dir, const char *name, const char *header, size_t data_len) {
    char *p = join(dir, name);
    write_st(p, header, data_len);
    free(p);
}

#define S1 "model-00001-of-00002.safetensors"
#define S2 "model-00002-of-00002.safetensors"
#define H_A "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"
#define H_B "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}"
#define H_AB "{" T_A ",\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}"

static void test_corrupt_index(void) {
    char *dir = make_dir("index");
    char *ix = join(dir, LLMQ_ST_INDEX_NAME);
    char *s1 = join(dir, S1), *s2 = join(dir, S2);
    write_shard(dir, S1, H_A, 8);
    write_shard(dir, S2, H_B, 3);

    // the good case first
    write_text(ix, "{\"metadata\":{\"total_size\":11},\"weight_map\":{\"b\":\"" S2 "\",\"a\":\"" S1 "\"}}");
    struct llmq_st_model *m = open_ok(ix);
    CHECK_EQ_INT(llmq_st_n_shards(m), 2);
    CHECK_EQ_INT(llmq_st_find(m, "a"), 0); // shards in file-name order
    CHECK_EQ_INT(llmq_st_tensor_shard(m, llmq_st_find(m, "b")), 1);
    CHECK_EQ_INT(llmq_st_total_bytes(m), 11);
    llmq_st_free(m);

    // an index text each, refused with status st, the message holding word
    static const struct {
        const char *index;
        enum llmq_status st;
        const char *word;
    } bad[] = {
        {"{\"weight_map\":{\"a\":\"" S1 "\",", LLMQ_ERR_CORRUPT, "not valid JSON"},
        {"[]", LLMQ_ERR_CORRUPT, "weight_map"},
        {"{\"metadata\":{}}", LLMQ_ERR_CORRUPT, "no \"weight_map\" object"},
        {"{\"weight_map\":[\"" S1 "\"]}", LLMQ_ERR_CORRUPT, "no \"weight_map\" object"},
        {"{\"weight_map\":{\"a\":1}}", LLMQ_ERR_CORRUPT, "not a string"},
        {"{\"weight_map\":{\"a\":\"" S1 "\",\"a\":\"" S2 "\"}}", LLMQ_ERR_DUPLICATE, "duplicate key"},
        {"{\"weight_map\":{\"a\":\"../" S1 "\"}}", LLMQ_ERR_CORRUPT, "not a plain file name"},
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", LLMQ_ERR_CORRUPT, "not a plain file name"},
        {"{\"weight_map\":{\"a\":\"sub/x.safetensors\"}}", LLMQ_ERR_CORRUPT, "not a plain file name"},
        {"{\"weight_map\":{\"a\":\"..\"}}", LLMQ_ERR_CORRUPT, "not a plain file name"},
        {"{\"weight_map\":{\"a\":\"\"}}", LLMQ_ERR_CORRUPT, "not a plain file name"},
        // a shard that does not exist
        {"{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"model-00003-of-00002.safetensors\"}}", LLMQ_ERR_NOT_FOUND,
         "model-00003-of-00002.safetensors listed in weight_map not found"},
        // a listed tensor missing from its shard
        {"{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" S2 "\",\"c\":\"" S2 "\"}}", LLMQ_ERR_NOT_FOUND,
         "tensor 'c' is listed in weight_map for " S2 " but not found"},
        // a tensor the index places in the other shard
        {"{\"weight_map\":{\"a\":\"" S2 "\",\"b\":\"" S1 "\"}}", LLMQ_ERR_NOT_FOUND, "(it is in " S1 ")"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(ix, bad[i].index);
        expect_fail_at(ix, bad[i].st, ix, bad[i].word, bad[i].index);
    }
    // a shard tensor the index does not list
    write_text(ix, "{\"weight_map\":{\"a\":\"" S1 "\"}}");
    write_shard(dir, S1, H_AB, 11);
    EXPECT_FAIL(ix, LLMQ_ERR_CORRUPT, "tensor 'b' of shard");
    CHECK_CONTAINS(llmq_last_error(), "not listed in weight_map");
    // the same tensor in two shards
    write_text(ix, "{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" S2 "\"}}");
    EXPECT_FAIL(ix, LLMQ_ERR_DUPLICATE, "tensor 'b' is in two shards");
    CHECK_CONTAINS(llmq_last_error(), s1);
    CHECK_CONTAINS(llmq_last_error(), s2);
    // a corrupt shard reached through the index: the message names the shard
    write_shard(dir, S1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4);
    EXPECT_FAIL_FILE(ix, LLMQ_ERR_TRUNCATED, s1, "past the end of the data section");
    write_shard(dir, S1, H_A, 8);
    // the directory resolves to the index (no model.safetensors in it)
    m = open_ok(dir);
    CHECK_EQ_INT(llmq_st_n_tensors(m), 2);
    llmq_st_free(m);
    // an index that is not readable at all
    char *missing = join(dir, "nope.index.json");
    EXPECT_FAIL(missing, LLMQ_ERR_NOT_FOUND, "cannot open");
    free(missing);
    CHECK(unlink(ix) == 0);

    // a directory with several *.safetensors and no index is ambiguous
    EXPECT_FAIL(dir, LLMQ_ERR_ARG, "2 *.safetensors files");
    CHECK(unlink(s2) == 0);
    m = open_ok(dir); // exactly one: accepted
    CHECK_EQ_INT(llmq_st_n_tensors(m), 1);
    CHECK(strcmp(llmq_st_shard(m, 0)->path, s1) == 0);
    llmq_st_free(m);
    CHECK(unlink(s1) == 0);
    EXPECT_FAIL(dir, LLMQ_ERR_NOT_FOUND, "no model.safetensors");

    free(s1);
    free(s2);
    free(ix);
    remove_dir(dir);
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT); // errors are still recorded for the checks
    SPECS = st_demo_specs(&N_SPECS);
    test_roundtrip_single();
    test_roundtrip_sharded();
    test_many_tensors();
    test_rewrite_removes_stale();
    test_large_sparse();
    test_writer_failures();
    test_corrupt_files();
    test_corrupt_index();
    printf("test_safetensors: ok\n");
    return 0;
}
