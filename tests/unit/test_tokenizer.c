// tests/unit/test_tokenizer.c — calib/tokenizer/tokenizer.h on stories260K (SentencePiece BPE, v1 and v3 GGUF):
// encodes checked against llama.cpp's ids (taken from llama-cpp-python once), decode of the greedy
// reference output, the API contracts (buffers too small, NULL / out-of-range arguments), and corrupt
// tokenizer inputs: GGUF metadata written with llmq's writer and tokenizer.json files, each of which
// must fail with the right status and a message naming the file and the problem.
// The live comparisons with llama.cpp are in tests/py/test_tokenizer_oracle.py.
#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "common/status.h"
#include "formats/gguf.h"
#include "harness.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static struct llmq_tokenizer *load_stories(const char *name, struct llmq_gguf **g) {
    char path[1024];
    test_stories260k(path, sizeof path, name);
    if (!llmq_file_exists(path)) {
        fprintf(stderr, "skip: %s missing\n", path);
        exit(TEST_SKIP);
    }
    struct llmq_tokenizer *t = NULL;
    CHECK(llmq_gguf_open(path, g) == LLMQ_OK);
    CHECK(llmq_tokenizer_load_gguf(*g, &t) == LLMQ_OK);
    return t;
}

static void check_ids(const struct llmq_tokenizer *t, const char *text, size_t len, bool add, bool parse,
                      const int32_t *want, int64_t n_want) {
    int32_t *ids = NULL;
    int64_t n = -1;
    CHECK(llmq_tokenize(t, text, len, add, parse, &ids, &n) == LLMQ_OK);
    CHECK(ids != NULL);
    if (n != n_want)
        fprintf(stderr, "text \"%.*s\": %lld ids, want %lld\n", (int)len, text, (long long)n, (long long)n_want);
    CHECK_EQ_INT(n, n_want);
    for (int64_t i = 0; i < n; i++) CHECK_EQ_INT(ids[i], want[i]);
    free(ids);
}

static void test_encode(const struct llmq_tokenizer *t) {
    CHECK_EQ_INT(llmq_tokenizer_n_vocab(t), 512);
    CHECK_EQ_INT(llmq_tokenizer_bos(t), 1);
    CHECK_EQ_INT(llmq_tokenizer_eos(t), 2);
    CHECK(llmq_tokenizer_add_bos(t));
    CHECK(llmq_tokenizer_kind(t) == LLMQ_TOKENIZER_SPM);
    CHECK(llmq_tokenizer_pre(t) == NULL);
    const char *s1 = "Once upon a time, there was a little girl named Lily.";
    const int32_t w1[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};
    check_ids(t, s1, strlen(s1), true, false, w1, 16);
    const int32_t w2[] = {346, 306, 414, 263, 304, 341};
    check_ids(t, "Hello world", 11, false, false, w2, 6);
    const char *s3 = "  two  spaces\n\nnew";
    const int32_t w3[] = {1, 410, 410, 259, 424, 414, 410, 262, 427, 412, 331, 419, 13, 13, 416, 411, 424};
    check_ids(t, s3, strlen(s3), true, false, w3, 17);
    const int32_t w4[] = {1, 1, 410, 444, 2}; // control texts parsed; the text after a special gets the space prefix
    check_ids(t, "<s>x</s>", 8, true, true, w4, 5);
    const int32_t w5[] = {1, 410, 504, 419, 505, 444, 504, 492, 419, 505};
    check_ids(t, "<s>x</s>", 8, true, false, w5, 10);
    const char *s6 = "caf\xc3\xa9 \xf0\x9f\xa6\x99"; // byte fallback for the llama emoji
    const int32_t w6[] = {280, 412, 431, 485, 410, 243, 162, 169, 156};
    check_ids(t, s6, strlen(s6), false, false, w6, 9);
    const int32_t w7[] = {1};
    check_ids(t, "", 0, true, false, w7, 1);
    check_ids(t, NULL, 0, false, false, NULL, 0);
}

static void test_decode(const struct llmq_tokenizer *t) {
    char path[1024], buf[64];
    CHECK_EQ_INT(llmq_token_to_piece(t, 403, buf, sizeof(buf), false), 5); // "▁Once"
    CHECK(memcmp(buf, " Once", 5) == 0);
    CHECK_EQ_INT(llmq_token_to_piece(t, 403, buf, 3, false), -5);         // too small: -(needed)
    CHECK_EQ_INT(llmq_token_to_piece(t, 13, buf, sizeof(buf), false), 1); // <0x0A>
    CHECK_EQ_INT(buf[0], '\n');
    CHECK_EQ_INT(llmq_token_to_piece(t, 1, buf, sizeof(buf), false), 0); // <s> is CONTROL
    CHECK_EQ_INT(llmq_token_to_piece(t, 1, buf, sizeof(buf), true), 3);
    CHECK(memcmp(buf, "<s>", 3) == 0);
    CHECK_EQ_INT(llmq_token_to_piece(t, 0, buf, sizeof(buf), true), 5); // <unk>, UNKNOWN
    CHECK_EQ_INT(llmq_token_to_piece(t, 512, buf, sizeof(buf), true), 0);
    CHECK_EQ_INT(llmq_token_to_piece(t, -1, buf, sizeof(buf), true), 0);

    // the greedy reference output, decoded from its ids
    char *ids_txt = NULL, *want = NULL;
    size_t n_ids_txt, n_want;
    test_stories260k(path, sizeof path, "expected_greedy_ids.txt");
    CHECK(llmq_read_file(path, 1 << 20, &ids_txt, &n_ids_txt) == LLMQ_OK);
    test_stories260k(path, sizeof path, "expected_greedy.txt");
    CHECK(llmq_read_file(path, 1 << 20, &want, &n_want) == LLMQ_OK);
    char *out = malloc(1 << 16);
    size_t n_out = 0;
    int n_tok = 0;
    for (char *p = ids_txt, *end;; p = end) {
        long id = strtol(p, &end, 10);
        if (end == p) break;
        int k = llmq_token_to_piece(t, (int32_t)id, out + n_out, (1 << 16) - (int)n_out, false);
        CHECK(k >= 0);
        n_out += (size_t)k;
        n_tok++;
    }
    CHECK_EQ_INT(n_tok, 256);
    while (n_want > 0 && want[n_want - 1] == '\n') n_want--;
    CHECK(n_out == n_want + 1 && out[0] == ' '); // " Once upon ..." (llama2.c drops the first space)
    CHECK(memcmp(out + 1, want, n_want) == 0);
    // and the text tokenizes back to the same ids, after BOS
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK(llmq_tokenize(t, want, n_want, true, false, &ids, &n) == LLMQ_OK);
    CHECK_EQ_INT(ids[0], 1);
    CHECK(n >= 2 && ids[1] == 403);
    free(ids);
    free(out);
    free(ids_txt);
    free(want);
}

static void test_args(const struct llmq_tokenizer *t) {
    int32_t *ids = (int32_t *)1;
    int64_t n = 7;
    CHECK(llmq_tokenize(NULL, "x", 1, true, false, &ids, &n) == LLMQ_ERR_ARG);
    CHECK(ids == NULL && n == 0);
    CHECK(llmq_tokenize(t, NULL, 3, true, false, &ids, &n) == LLMQ_ERR_ARG);
    CHECK(llmq_tokenize(t, "x", (size_t)INT32_MAX + 1, true, false, &ids, &n) == LLMQ_ERR_ARG);
    CHECK(llmq_tokenize(t, "x", 1, true, false, NULL, &n) == LLMQ_ERR_ARG);
    CHECK_EQ_INT(llmq_tokenizer_n_vocab(NULL), 0);
    CHECK_EQ_INT(llmq_tokenizer_bos(NULL), -1);
    llmq_tokenizer_free(NULL);
}

// ---- corrupt GGUF metadata (written with llmq's writer)

enum mutation {
    M_NO_MODEL,
    M_BERT,
    M_BAD_PRE,
    M_NO_TOKENS,
    M_SHORT_SCORES,
    M_SCORES_STR,
    M_TYPES_U8,
    M_NO_MERGES,
    M_BOS_NO_ID,
    M_MODEL_INT,
    M_EMPTY_TOKENS,
    M_COUNT
};

static enum llmq_status load_mutated(enum mutation m) {
    char path[512];
    snprintf(path, sizeof(path), "%s/mut%d.gguf", tmpdir, (int)m);
    struct llmq_gguf_writer *w = llmq_gguf_writer_init();
    CHECK(w);
    bool bpe = m == M_BAD_PRE || m == M_NO_MERGES;
    if (m == M_MODEL_INT)
        CHECK(llmq_gguf_writer_set_u32(w, "tokenizer.ggml.model", 1) == LLMQ_OK);
    else if (m != M_NO_MODEL)
        CHECK(llmq_gguf_writer_set_str(w, "tokenizer.ggml.model",
                                       m == M_BERT ? "bert"
                                       : bpe       ? "gpt2"
                                                   : "llama") == LLMQ_OK);
    if (bpe) CHECK(llmq_gguf_writer_set_str(w, "tokenizer.ggml.pre", m == M_BAD_PRE ? "klingon" : "gpt-2") == LLMQ_OK);
    const char *toks[] = {"<unk>", "<s>", "</s>", "a", "b", "ab"};
    if (m == M_EMPTY_TOKENS)
        CHECK(llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 0) == LLMQ_OK);
    else if (m != M_NO_TOKENS)
        CHECK(llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 6) == LLMQ_OK);
    float scores[6] = {0, 0, 0, -1, -2, -3};
    if (m == M_SCORES_STR)
        CHECK(llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.scores", toks, NULL, 6) == LLMQ_OK);
    else
        CHECK(llmq_gguf_writer_set_arr(w, "tokenizer.ggml.scores", LLMQ_GGUF_TYPE_FLOAT32, scores,
                                       m == M_SHORT_SCORES ? 4 : 6) == LLMQ_OK);
    int32_t types[6] = {2, 3, 3, 1, 1, 1};
    uint8_t types8[6] = {2, 3, 3, 1, 1, 1};
    if (m == M_TYPES_U8)
        CHECK(llmq_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LLMQ_GGUF_TYPE_UINT8, types8, 6) == LLMQ_OK);
    else
        CHECK(llmq_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LLMQ_GGUF_TYPE_INT32, types, 6) == LLMQ_OK);
    if (m == M_BOS_NO_ID) { // a 2-token vocabulary: the default BOS id 1 is fine, so remove it: bos beyond
        CHECK(llmq_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true) == LLMQ_OK);
        CHECK(llmq_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 99) == LLMQ_OK); // out of range: kept 2
        CHECK(llmq_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 2) == LLMQ_OK); // eos 2 now invalid
    }
    CHECK(llmq_gguf_writer_begin(w, path) == LLMQ_OK);
    CHECK(llmq_gguf_writer_commit(w) == LLMQ_OK);
    llmq_gguf_writer_free(w);
    struct llmq_gguf *g = NULL;
    CHECK(llmq_gguf_open(path, &g) == LLMQ_OK);
    struct llmq_tokenizer *t = NULL;
    enum llmq_status st = llmq_tokenizer_load_gguf(g, &t);
    if (st != LLMQ_OK) {
        CHECK(t == NULL);
        CHECK_CONTAINS(llmq_last_error(), path);
    }
    llmq_tokenizer_free(t);
    llmq_gguf_free(g);
    unlink(path);
    return st;
}

static void test_corrupt_gguf(void) {
    CHECK(load_mutated(M_NO_MODEL) == LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "tokenizer.ggml.model");
    CHECK(load_mutated(M_MODEL_INT) == LLMQ_ERR_CORRUPT);
    CHECK(load_mutated(M_BERT) == LLMQ_ERR_UNSUPPORTED);
    CHECK_CONTAINS(llmq_last_error(), "'bert'");
    CHECK(load_mutated(M_BAD_PRE) == LLMQ_ERR_UNSUPPORTED);
    CHECK_CONTAINS(llmq_last_error(), "klingon");
    CHECK(load_mutated(M_NO_TOKENS) == LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "tokenizer.ggml.tokens");
    CHECK(load_mutated(M_EMPTY_TOKENS) == LLMQ_ERR_CORRUPT);
    CHECK(load_mutated(M_SHORT_SCORES) == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "tokenizer.ggml.scores");
    CHECK(load_mutated(M_SCORES_STR) == LLMQ_ERR_CORRUPT);
    CHECK(load_mutated(M_TYPES_U8) == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "tokenizer.ggml.token_type");
    CHECK(load_mutated(M_NO_MERGES) == LLMQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(llmq_last_error(), "tokenizer.ggml.merges");
    CHECK(load_mutated(M_BOS_NO_ID) == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "EOS");
}

// ---- tokenizer.json

static const char *GOOD_BPE =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<|endoftext|>\", \"special\": true}],"
    " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"<|endoftext|>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3, \"\\u0120\": 4,"
    " \"\\u0120ab\": 5}, \"merges\": [\"a b\", [\"\\u0120\", \"ab\"]]}}";

// Writes dir/tokenizer.json with json (and tokenizer_config.json if cfg), loads it.
static enum llmq_status load_hf_text(const char *json, const char *cfg, struct llmq_tokenizer **t) {
    char dir[512], path[600];
    static int k;
    snprintf(dir, sizeof(dir), "%s/hf%d", tmpdir, k++);
    mkdir(dir, 0700);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (json) {
        FILE *f = fopen(path, "wb");
        CHECK(f);
        fputs(json, f);
        fclose(f);
    }
    if (cfg) {
        char cpath[600];
        snprintf(cpath, sizeof(cpath), "%s/tokenizer_config.json", dir);
        FILE *f = fopen(cpath, "wb");
        CHECK(f);
        fputs(cfg, f);
        fclose(f);
    }
    enum llmq_status st = llmq_tokenizer_load_hf(dir, t);
    if (st != LLMQ_OK) {
        CHECK(*t == NULL);
        CHECK_CONTAINS(llmq_last_error(), dir);
    }
    return st;
}

static void expect_hf_error(const char *json, enum llmq_status want, const char *words) {
    struct llmq_tokenizer *t = NULL;
    enum llmq_status st = load_hf_text(json, NULL, &t);
    if (st != want)
        fprintf(stderr, "tokenizer.json %.80s...: status %s, want %s\n", json ? json : "(none)", llmq_status_name(st),
                llmq_status_name(want));
    CHECK(st == want);
    CHECK_CONTAINS(llmq_last_error(), words);
    llmq_tokenizer_free(t);
}

static void test_hf(void) {
    struct llmq_tokenizer *t = NULL;
    CHECK(load_hf_text(GOOD_BPE, "{\"eos_token\": \"<|endoftext|>\"}", &t) == LLMQ_OK);
    CHECK(llmq_tokenizer_kind(t) == LLMQ_TOKENIZER_BPE);
    CHECK(strcmp(llmq_tokenizer_pre(t), "gpt-2") == 0);
    CHECK_EQ_INT(llmq_tokenizer_n_vocab(t), 6);
    CHECK_EQ_INT(llmq_tokenizer_eos(t), 0);
    CHECK(!llmq_tokenizer_add_bos(t));
    CHECK(llmq_tokenizer_token_type(t, 0) == LLMQ_TOKEN_TYPE_CONTROL);
    CHECK_EQ_INT(llmq_tokenizer_n_merges(t), 2);
    size_t len;
    const char *m1 = llmq_tokenizer_merge(t, 1, &len);
    CHECK(len == 5 && memcmp(m1, "\xc4\xa0 ab", 5) == 0);
    const int32_t want[] = {3, 5, 0, 1};
    check_ids(t, "ab ab<|endoftext|>a", 19, true, true, want, 4);
    llmq_tokenizer_free(t);
    t = NULL;

    expect_hf_error(NULL, LLMQ_ERR_IO, "tokenizer.json");
    expect_hf_error("{\"model\": ", LLMQ_ERR_CORRUPT, "bad JSON at line 1");
    expect_hf_error("[1, 2]", LLMQ_ERR_CORRUPT, "not a JSON object");
    expect_hf_error("{\"version\": \"1.0\"}", LLMQ_ERR_CORRUPT, "no \"model\"");
    expect_hf_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", LLMQ_ERR_UNSUPPORTED, "\"Unigram\"");
    expect_hf_error("{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", LLMQ_ERR_CORRUPT, "model.vocab");
    expect_hf_error(
        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, "
        "\"merges\": []}}",
        LLMQ_ERR_CORRUPT, "model.vocab[\"a\"]");
    expect_hf_error(
        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
        "\"merges\": [\"a\"]}}",
        LLMQ_ERR_CORRUPT, "model.merges[0]");
    expect_hf_error(
        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
        "\"merges\": [[\"a\"]]}}",
        LLMQ_ERR_CORRUPT, "model.merges[0]");
    expect_hf_error(
        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
        "\"merges\": 5}}",
        LLMQ_ERR_CORRUPT, "model.merges");
    expect_hf_error("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [{\"id\": 3}], \"model\": "
                    "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                    LLMQ_ERR_CORRUPT, "added_tokens[0]");
    expect_hf_error(
        "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
        "\"merges\": []}}",
        LLMQ_ERR_UNSUPPORTED, "neither a byte-level BPE");
    expect_hf_error(
        "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}, "
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        LLMQ_ERR_UNSUPPORTED, "pre_tokenizer {\"type\":\"Sequence\"");
    expect_hf_error(
        "{\"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": "
        "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        LLMQ_ERR_UNSUPPORTED, "Lowercase");
    expect_hf_error(
        "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, "
        "\"b\": 0}, \"merges\": []}}",
        LLMQ_ERR_CORRUPT, "appears twice");
    // SentencePiece-style: byte fallback, Prepend + Replace normalizer, scores from the merges
    const char *spm =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, \"content\": \"<s>\","
        " \"special\": true}, {\"id\": 2, \"content\": \"</s>\", \"special\": true}],"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
        " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}, \"pre_tokenizer\": "
        "null,"
        " \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0,"
        " \"<s>\": 1, \"</s>\": 2, \"<0x0A>\": 3, \"\\u2581\": 4, \"a\": 5, \"b\": 6, \"\\u2581a\": 7, \"ab\": 8,"
        " \"\\u2581ab\": 9}, \"merges\": [\"\\u2581 a\", \"a b\", \"\\u2581a b\", \"\\u2581 ab\"]}}";
    CHECK(load_hf_text(spm, "{\"add_bos_token\": true, \"bos_token\": {\"content\": \"<s>\"}}", &t) == LLMQ_OK);
    CHECK(llmq_tokenizer_kind(t) == LLMQ_TOKENIZER_SPM);
    CHECK(llmq_tokenizer_add_space_prefix(t) && llmq_tokenizer_add_bos(t));
    CHECK_EQ_INT(llmq_tokenizer_unk(t), 0);
    CHECK(llmq_tokenizer_token_type(t, 3) == LLMQ_TOKEN_TYPE_BYTE);
    CHECK(llmq_tokenizer_token_type(t, 0) == LLMQ_TOKEN_TYPE_UNKNOWN);
    CHECK(llmq_tokenizer_token_score(t, 7) > llmq_tokenizer_token_score(t, 9));
    CHECK_EQ_INT(llmq_tokenizer_n_merges(t), 0);
    const int32_t want2[] = {1, 9, 7, 3}; // "\u2581ab" "\u2581a" <0x0A>
    check_ids(t, "ab a\n", 5, true, false, want2, 4);
    llmq_tokenizer_free(t);
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/llmq_test_tokenizer.%d", (int)getpid());
    mkdir(tmpdir, 0700);
    struct llmq_gguf *g1 = NULL, *g3 = NULL;
    struct llmq_tokenizer *t1 = load_stories("tinyllamas-stories-260k-f32.gguf", &g1);
    struct llmq_tokenizer *t3 = load_stories("tinyllamas-stories-260k-f32.v3.gguf", &g3);
    llmq_gguf_free(g1); // the tokenizer owns copies of what it needs
    llmq_gguf_free(g3);
    test_encode(t1);
    test_encode(t3);
    test_decode(t1);
    test_args(t1);
    llmq_tokenizer_free(t1);
    llmq_tokenizer_free(t3);
    test_corrupt_gguf();
    test_hf();
    test_remove_tree(tmpdir);
    printf("test_tokenizer: ok\n");
    return 0;
}
