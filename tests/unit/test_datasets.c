// tests/unit/test_datasets.c — datasets/datasets.h: every dataset the repository ships loads from
// datasets/data with $LLMQ_DATA unset and matches its manifest sha256; aliases; split files; the
// upstream-layout fallback (data_file); sha256 mismatch, unknown name, missing file; a truncated or
// corrupted .gz is an error, never a shorter text (common/io.h llmq_read_file); a named calibration
// source records the manifest's sha256 of the decompressed text.
#include "calib/calib.h"
#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "datasets/datasets.h"
#include "harness.h"

#include <stdint.h>
#include <unistd.h>
#include <zlib.h>

static char tmpdir[] = "/tmp/llmq_test_datasets_XXXXXX";

static char *tpath(const char *name) { return test_path(tmpdir, name); }

static void write_gz(const char *path, const char *text) {
    gzFile gz = gzopen(path, "wb9");
    CHECK(gz);
    CHECK(gzwrite(gz, text, (unsigned)strlen(text)) == (int)strlen(text));
    CHECK(gzclose(gz) == Z_OK);
}

static void sha_hex(const void *d, size_t n, char hex[65]) {
    uint8_t dig[32];
    llmq_sha256(d, n, dig);
    llmq_sha256_hex(dig, hex);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    CHECK(b && fread(b, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

// A truncated .gz (the repository's wikitext-2-test cut at 100,000 of its bytes) and one with a flipped
// byte are errors, not a shorter text; two concatenated gzip members read as one text.
static void test_gz_reader(const char *src) {
    char full[1024], *buf = NULL;
    size_t n = 0, len = 0;
    snprintf(full, sizeof(full), "%s/datasets/data/wikitext-2-test.raw.gz", src);
    char *gz = slurp(full, &n);
    CHECK(n > 200000);
    CHECK(llmq_read_file(full, (size_t)1 << 30, &buf, &len) == LLMQ_OK);
    CHECK_EQ_INT(len, 1290590);
    free(buf);
    test_write_file(tpath("cut.raw.gz"), gz, 100000);
    CHECK(llmq_read_file(tpath("cut.raw.gz"), (size_t)1 << 30, &buf, &len) == LLMQ_ERR_TRUNCATED);
    CHECK_CONTAINS(llmq_last_error(), "cut.raw.gz");
    CHECK_CONTAINS(llmq_last_error(), "truncated");
    CHECK(buf == NULL);
    test_write_file(tpath("cut-header.raw.gz"), gz, 5); // not even a whole gzip header
    CHECK(llmq_read_file(tpath("cut-header.raw.gz"), (size_t)1 << 30, &buf, &len) != LLMQ_OK);
    gz[n / 2] ^= 0x55; // the deflate stream or the CRC no longer checks
    test_write_file(tpath("flip.raw.gz"), gz, n);
    CHECK(llmq_read_file(tpath("flip.raw.gz"), (size_t)1 << 30, &buf, &len) == LLMQ_ERR_CORRUPT);
    free(gz);
    write_gz(tpath("m1.gz"), "first member\n");
    write_gz(tpath("m2.gz"), "second member\n");
    char *a = slurp(tpath("m1.gz"), &n), *b = slurp(tpath("m2.gz"), &len);
    char *both = malloc(n + len);
    memcpy(both, a, n);
    memcpy(both + n, b, len);
    test_write_file(tpath("both.txt.gz"), both, n + len);
    CHECK(llmq_read_file(tpath("both.txt.gz"), 1 << 20, &buf, &len) == LLMQ_OK);
    CHECK(strcmp(buf, "first member\nsecond member\n") == 0);
    free(buf);
    free(a);
    free(b);
    free(both);
}

// The repository's own copies: found with no $LLMQ_DATA, every one verified by the loader.
static void test_shipped(const char *src) {
    unsetenv("LLMQ_DATA");
    unsetenv("LLMQ_MANIFEST");
    static const struct {
        const char *name;
        size_t bytes;
        int parts;
    } shipped[] = {
        {"wikitext-2-test", 1290590, 1}, {"wikitext-2-valid", 1146846, 1}, {"hellaswag", 7770677, 2},
        {"arc-easy", 949740, 1},         {"arc-challenge", 518693, 1},     {"piqa", 495929, 1},
        {"piqa-labels", 3676, 1},        {"winogrande", 312369, 1},        {"lambada", 1895241, 1},
    };
    char want_dir[1024];
    snprintf(want_dir, sizeof(want_dir), "%s/datasets/data/", src);
    for (size_t i = 0; i < sizeof(shipped) / sizeof(shipped[0]); i++) {
        struct llmq_dataset d;
        if (llmq_dataset_load(shipped[i].name, NULL, (size_t)1 << 30, &d) != LLMQ_OK) {
            fprintf(stderr, "%s: %s\n", shipped[i].name, llmq_last_error());
            CHECK(0);
        }
        CHECK(strcmp(d.name, shipped[i].name) == 0);
        CHECK_EQ_INT(d.len, shipped[i].bytes);
        CHECK_EQ_INT(d.n_parts, shipped[i].parts);
        CHECK(strncmp(d.path, want_dir, strlen(want_dir)) == 0);
        CHECK(d.data[d.len] == '\0');
        char hex[65];
        sha_hex(d.data, d.len, hex);
        CHECK(strcmp(hex, d.sha256) == 0);
        llmq_dataset_free(&d);
    }
    // the alias is the test split, in every caller (they all come here)
    CHECK(strcmp(llmq_dataset_canonical("wikitext-2"), "wikitext-2-test") == 0);
    CHECK(strcmp(llmq_dataset_canonical("wikitext-2-valid"), "wikitext-2-valid") == 0);
    struct llmq_dataset d;
    CHECK(llmq_dataset_load("wikitext-2", NULL, (size_t)1 << 30, &d) == LLMQ_OK);
    CHECK(strcmp(d.name, "wikitext-2-test") == 0);
    CHECK(strcmp(d.sha256, "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08") == 0);
    CHECK(strstr(d.path, "/datasets/data/wikitext-2-test.raw.gz"));
    llmq_dataset_free(&d);
    CHECK(llmq_dataset_load("wikitext-2-valid", NULL, 1000, &d) == LLMQ_ERR_OVERFLOW); // max_bytes holds
    CHECK(d.data == NULL && d.path == NULL);
    CHECK(llmq_dataset_load("wikitext-3", NULL, 1000, &d) == LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "wikitext-2-valid"); // the names are listed
    CHECK(llmq_dataset_load("/no/such/file.txt", NULL, 1000, &d) == LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "/no/such/file.txt: no such file");
}

// A manifest of our own: split parts, the data_file fallback under $LLMQ_DATA, mismatches, truncation.
static void test_own_manifest(void) {
    const char *p1 = "part one\n", *p2 = "part two\n";
    char sha12[65], shav[65] = "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7", man[4096];
    sha_hex("part one\npart two\n", 18, sha12);
    write_gz(tpath("p1.txt.gz"), p1);
    write_gz(tpath("p2.txt.gz"), p2);
    size_t n;
    char *gz = slurp(tpath("p2.txt.gz"), &n);
    test_write_file(tpath("p2cut.txt.gz"), gz, n - 6); // the CRC / length trailer cut off
    free(gz);
    snprintf(man, sizeof(man),
             "name\tfile\tsha256\tlicence\tsource\tdata_file\n"
             "# a comment line\n"
             "split\tp1.txt.gz+p2.txt.gz\t%s\tx\ty\t-\n"
             "splitcut\tp1.txt.gz+p2cut.txt.gz\t%s\tx\ty\n"
             "upstream\tdata/not-here.raw.gz\t%s\tx\ty\twikitext-2-raw/wiki.valid.raw\n"
             "bad\tdata/not-here.raw.gz\t%064d\tx\ty\twikitext-2-raw/wiki.valid.raw\n"
             "gone\tno/such/file.txt\t%064d\tx\ty\n",
             sha12, sha12, shav, 0, 0);
    test_write_file(tpath("manifest.tsv"), man, strlen(man));
    struct llmq_dataset d;
    CHECK(llmq_dataset_load("split", tpath("manifest.tsv"), 1 << 20, &d) == LLMQ_OK);
    CHECK_EQ_INT(d.n_parts, 2);
    CHECK(strcmp(d.data, "part one\npart two\n") == 0);
    CHECK(strcmp(d.path, tpath("p1.txt.gz")) == 0);
    CHECK(strcmp(d.manifest, tpath("manifest.tsv")) == 0);
    llmq_dataset_free(&d);
    llmq_dataset_free(&d); // zeroed: a no-op
    llmq_dataset_free(NULL);
    CHECK(llmq_dataset_load("splitcut", tpath("manifest.tsv"), 1 << 20, &d) == LLMQ_ERR_TRUNCATED);
    CHECK_CONTAINS(llmq_last_error(), "p2cut.txt.gz");
    setenv("LLMQ_DATA", test_data_dir(), 1);
    char probe[1024];
    snprintf(probe, sizeof(probe), "%s/wikitext-2-raw/wiki.valid.raw", test_data_dir());
    if (llmq_file_exists(probe)) { // the upstream layout is there (the shared datasets)
        CHECK(llmq_dataset_load("upstream", tpath("manifest.tsv"), (size_t)1 << 30, &d) == LLMQ_OK);
        CHECK(strstr(d.path, "wikitext-2-raw/wiki.valid.raw"));
        CHECK_EQ_INT(d.len, 1146846);
        llmq_dataset_free(&d);
        CHECK(llmq_dataset_load("bad", tpath("manifest.tsv"), (size_t)1 << 30, &d) == LLMQ_ERR_CORRUPT);
        CHECK_CONTAINS(llmq_last_error(), "sha256");
        CHECK_CONTAINS(llmq_last_error(), tpath("manifest.tsv"));
    } else {
        fprintf(stderr, "test_datasets: %s missing: the data_file fallback cases were not run\n", probe);
    }
    CHECK(llmq_dataset_load("gone", tpath("manifest.tsv"), 1 << 20, &d) == LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "no/such/file.txt");
    CHECK(llmq_dataset_load("nosuchname", tpath("manifest.tsv"), 1 << 20, &d) == LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "names: split, splitcut, upstream, bad, gone");
}

// A named calibration source: kind NAMED, the repository's file, the manifest's sha256 (of the text).
static void test_calib_named(void) {
    char model_path[512];
    test_stories260k(model_path, sizeof model_path, "tinyllamas-stories-260k-f32.gguf");
    if (!llmq_file_exists(model_path)) {
        fprintf(stderr, "test_datasets: %s missing: the calibration case was not run\n", model_path);
        return;
    }
    struct llmq_model *m;
    CHECK(llmq_model_load(model_path, &m) == LLMQ_OK);
    const char *src[] = {"wikitext-2-valid"};
    struct llmq_calib_opts co = {
        .sources = src, .n_sources = 1, .nsamples = 2, .seqlen = 16, .seed = 1, .n_threads = 1};
    struct llmq_calib_data cd;
    CHECK(llmq_calib_data_load(m, &co, &cd) == LLMQ_OK);
    CHECK(cd.src[0].kind == LLMQ_CALIB_NAMED);
    CHECK(strstr(cd.src[0].path, "/datasets/data/wikitext-2-valid.raw.gz"));
    CHECK(strcmp(cd.src[0].sha256, "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7") == 0);
    CHECK_EQ_INT(cd.src[0].n_texts, 1);
    CHECK(cd.src[0].n_tokens > 100000);
    llmq_calib_data_free(&cd);
    llmq_model_free(m);
}

int main(void) {
    const char *src = getenv("LLMQ_SRC");
    CHECK(src && *src);
    CHECK(mkdtemp(tmpdir));
    test_gz_reader(src);
    test_own_manifest();
    test_calib_named();
    test_shipped(src); // last: it unsets LLMQ_DATA
    test_remove_tree(tmpdir);
    printf("test_datasets: ok\n");
    return 0;
}
