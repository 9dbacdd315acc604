// tests/unit/test_eval.c — calib/eval/eval.h on synthetic data: row joining, chunking, the per-position
// math against a long-double reference, the statistics against two-pass formulas, the logits file
// (round trip and every header check tripped by a corrupt file), and common/sha256.h.
#include "harness.h"

#include "calib/eval/eval.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/status.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { return (double)(test_xorshift64s(&rng) >> 11) / 9007199254740992.0; } // [0, 1)

#define CHECK_NEAR(a, b, tol)                                                                                          \
    do {                                                                                                               \
        double a__ = (a), b__ = (b);                                                                                   \
        if (!(fabs(a__ - b__) <= (tol))) {                                                                             \
            fprintf(stderr, "%s:%d: %s = %.17g, expected %s = %.17g (tol %g)\n", __FILE__, __LINE__, #a, a__, #b, b__, \
                    (double)(tol));                                                                                    \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static void test_sha256(void) {
    uint8_t d[32];
    char hex[65];
    llmq_sha256("abc", 3, d);
    llmq_sha256_hex(d, hex);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
    llmq_sha256("", 0, d);
    llmq_sha256_hex(d, hex);
    CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; // 56 bytes: padding spills
    llmq_sha256(two, strlen(two), d);
    llmq_sha256_hex(d, hex);
    CHECK(strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") == 0);
    // one million 'a' fed in uneven pieces
    static char a[1000000];
    memset(a, 'a', sizeof(a));
    struct llmq_sha256 s;
    llmq_sha256_init(&s);
    for (size_t off = 0, step = 1; off < sizeof(a); off += step, step = step * 3 % 1013 + 1)
        llmq_sha256_update(&s, a + off, off + step > sizeof(a) ? sizeof(a) - off : step);
    llmq_sha256_final(&s, d);
    llmq_sha256_hex(d, hex);
    CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
}

static void check_join(const char *in, const char *want) {
    char *out;
    size_t n;
    CHECK(llmq_eval_join_rows(in, strlen(in), &out, &n) == LLMQ_OK);
    if (n != strlen(want) || memcmp(out, want, n) != 0) {
        fprintf(stderr, "join(\"%s\") = \"%s\", expected \"%s\"\n", in, out, want);
        exit(1);
    }
    free(out);
}

static void test_join_rows(void) {
    check_join("", "");
    check_join("a\n", "a\n");
    check_join("x", "x");
    // wikitext: " \n = T = \n \n body \n" -> rows "", " = T = \n", "", " body \n"
    check_join(" \n = T = \n \n body \n", "\n\n = T = \n\n\n\n\n body \n");
    check_join("a\nb", "a\n\n\nb");
    check_join("a\n\t\r\n", "a\n\n\n");
    check_join("\n\n", "\n\n");
}

static void test_plan(void) {
    struct llmq_eval_plan p;
    enum llmq_eval_protocol pr;
    CHECK(llmq_eval_protocol_from_name("gptq", &pr) && pr == LLMQ_EVAL_PROTOCOL_GPTQ);
    CHECK(!llmq_eval_protocol_from_name("wikitext", &pr));
    CHECK(strcmp(llmq_eval_protocol_name(LLMQ_EVAL_PROTOCOL_LLAMACPP), "llamacpp") == 0);

    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 1100, 0, -1, 7, &p) == LLMQ_OK);
    CHECK_EQ_INT(p.n_ctx, 512);
    CHECK_EQ_INT(p.n_chunks_max, 2);
    CHECK_EQ_INT(p.n_chunks, 2);
    CHECK_EQ_INT(p.first, 256);
    CHECK_EQ_INT(p.n_rows, 255);
    CHECK_EQ_INT(p.bos, 7);
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 1100, 511, 1, -1, &p) == LLMQ_OK);
    CHECK_EQ_INT(p.first, 255);
    CHECK_EQ_INT(p.n_rows, 255);
    CHECK_EQ_INT(p.n_chunks, 1);
    CHECK_EQ_INT(p.bos, -1);
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_GPTQ, 4097, 0, 5, 7, &p) == LLMQ_OK);
    CHECK_EQ_INT(p.n_ctx, 2048);
    CHECK_EQ_INT(p.n_chunks, 2);
    CHECK_EQ_INT(p.first, 0);
    CHECK_EQ_INT(p.n_rows, 2047);
    CHECK_EQ_INT(p.bos, -1); // no BOS per window in the gptq protocol

    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 511, 512, -1, 1, &p) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "511 tokens");
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 100, 1, -1, 1, &p) == LLMQ_ERR_ARG);
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 100, 2, -1, 1, &p) == LLMQ_ERR_ARG); // nothing scored
    CHECK_CONTAINS(llmq_last_error(), "no position to score");
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 100, 3, -1, 1, &p) == LLMQ_OK && p.n_rows == 1);
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_GPTQ, 100, 2, -1, 1, &p) == LLMQ_OK && p.n_rows == 1);
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_GPTQ, 100, 10, 0, 1, &p) == LLMQ_ERR_ARG); // 0 chunks
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 1L << 30, (1L << 20) + 1, -1, 1, &p) == LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);

    // chunk tokens: consecutive, position 0 replaced by BOS (the replaced token is lost)
    int32_t toks[30], dst[10];
    for (int i = 0; i < 30; i++) toks[i] = 100 + i;
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_LLAMACPP, 30, 10, -1, 1, &p) == LLMQ_OK);
    CHECK_EQ_INT(p.n_chunks, 3);
    llmq_eval_chunk_tokens(&p, toks, 2, dst);
    CHECK_EQ_INT(dst[0], 1);
    for (int i = 1; i < 10; i++) CHECK_EQ_INT(dst[i], 120 + i);
    CHECK(llmq_eval_plan_init(LLMQ_EVAL_PROTOCOL_GPTQ, 30, 10, -1, 1, &p) == LLMQ_OK);
    llmq_eval_chunk_tokens(&p, toks, 1, dst);
    for (int i = 0; i < 10; i++) CHECK_EQ_INT(dst[i], 110 + i);
}

// long-double references
static long double ref_logz(const float *x, int64_t n) {
    long double m = x[0], s = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > m) m = x[i];
    for (int64_t i = 0; i < n; i++) s += expl((long double)x[i] - m);
    return m + logl(s);
}
static long double ref_kld(const float *b, const float *q, int64_t n) {
    long double zb = ref_logz(b, n), zq = ref_logz(q, n), k = 0;
    for (int64_t i = 0; i < n; i++) {
        long double lb = b[i] - zb, lq = q[i] - zq;
        k += expl(lb) * (lb - lq);
    }
    return k;
}

static void fill(float *x, int64_t n, double scale, double offset) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(offset + scale * (2 * urand() - 1));
}

static void test_row_math(void) {
    enum { V = 5000 };
    static float b[V], q[V];
    for (int trial = 0; trial < 20; trial++) {
        double scale = trial % 2 ? 30 : 3, offset = trial % 3 ? 1000 : -7;
        fill(b, V, scale, offset);
        for (int i = 0; i < V; i++) q[i] = b[i] + (float)(0.3 * (2 * urand() - 1));
        int32_t t = (int32_t)(urand() * V), top;
        double nll = llmq_eval_nll(b, V, t, &top);
        CHECK_NEAR(nll, (double)(ref_logz(b, V) - b[t]), 1e-6 + 1e-7 * nll);
        for (int i = 0; i < V; i++) CHECK(b[i] <= b[top]);
        struct llmq_eval_row r;
        llmq_eval_kld_row(b, q, V, t, &r);
        long double kref = ref_kld(b, q, V);
        CHECK(r.kld >= 0);
        CHECK_NEAR(r.kld, (double)kref, 1e-9 + 1e-6 * (double)kref);
        CHECK_NEAR(r.nll_base, nll, 1e-12);
        CHECK_NEAR(r.nll, (double)(ref_logz(q, V) - q[t]), 1e-6);
        // identical rows: exactly zero; a constant shift: zero up to float rounding of the shift
        llmq_eval_kld_row(b, b, V, t, &r);
        CHECK(r.kld == 0.0 && r.top == r.top_base);
        for (int i = 0; i < V; i++) q[i] = b[i] + 5.0f;
        llmq_eval_kld_row(b, q, V, t, &r);
        CHECK(fabs(r.kld) < 1e-10);
        CHECK_NEAR(r.nll, r.nll_base, 1e-4);
    }
    // argmax ties: the first maximum
    float tie[4] = {1, 3, 3, 2};
    int32_t top;
    llmq_eval_nll(tie, 4, 0, &top);
    CHECK_EQ_INT(top, 1);
    // one-hot extremes: no overflow, nll of the winner ~ 0
    float hot[3] = {-1e30f, 80.0f, -80.0f};
    CHECK_NEAR(llmq_eval_nll(hot, 3, 1, NULL), 0.0, 1e-30);
    CHECK_NEAR(llmq_eval_nll(hot, 3, 2, NULL), 160.0, 1e-4);
}

static void test_score(void) {
    enum { R = 37, V = 301 };
    static float q[R * V], b[R * V];
    int32_t t[R];
    struct llmq_eval_row r1[R], r4[R];
    fill(q, R * V, 8, 0);
    fill(b, R * V, 8, 0);
    for (int i = 0; i < R; i++) t[i] = (int32_t)(urand() * V);
    CHECK(llmq_eval_score(q, b, t, R, V, 1, r1) == LLMQ_OK);
    CHECK(llmq_eval_score(q, b, t, R, V, 4, r4) == LLMQ_OK);
    CHECK(memcmp(r1, r4, sizeof(r1)) == 0); // independent of the thread count
    for (int i = 0; i < R; i++) {
        struct llmq_eval_row one;
        llmq_eval_kld_row(b + i * V, q + i * V, V, t[i], &one);
        CHECK(one.kld == r1[i].kld && one.nll == r1[i].nll);
    }
    CHECK(llmq_eval_score(q, NULL, t, R, V, 3, r4) == LLMQ_OK);
    for (int i = 0; i < R; i++) CHECK(r4[i].nll == r1[i].nll && r4[i].top_base == -1 && r4[i].kld == 0);

    llmq_log_set_level(LLMQ_LOG_SILENT);
    q[5 * V + 7] = NAN;
    CHECK(llmq_eval_score(q, NULL, t, R, V, 3, r4) == LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "row 5");
    CHECK_CONTAINS(llmq_last_error(), "model");
    q[5 * V + 7] = 0;
    b[9 * V] = INFINITY;
    CHECK(llmq_eval_score(q, b, t, R, V, 2, r4) == LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "base");
    b[9 * V] = 0;
    t[3] = V;
    CHECK(llmq_eval_score(q, b, t, R, V, 2, r4) == LLMQ_ERR_ARG);
    llmq_log_set_level(LLMQ_LOG_INFO);
}

static void test_stats(void) {
    enum { N = 1000 };
    static struct llmq_eval_row rows[N];
    double sum = 0, sum_b = 0;
    int same = 0;
    for (int i = 0; i < N; i++) {
        rows[i].nll = 2 + 3 * urand();
        rows[i].nll_base = rows[i].nll - 0.2 * urand();
        rows[i].kld = (double)i / (N - 1); // 0 .. 1, so quantile f is f
        rows[i].top = i % 4;
        rows[i].top_base = i % 4 == 0 ? 0 : 99;
        sum += rows[i].nll, sum_b += rows[i].nll_base, same += i % 4 == 0;
    }
    // plain ppl mode, added in two pieces
    struct llmq_eval_stats s = {0};
    struct llmq_eval_result r;
    CHECK(llmq_eval_stats_add(&s, rows, 300) == LLMQ_OK);
    CHECK(llmq_eval_stats_add(&s, rows + 300, N - 300) == LLMQ_OK);
    llmq_eval_stats_result(&s, &r);
    double mean = sum / N, var = 0;
    for (int i = 0; i < N; i++) var += (rows[i].nll - mean) * (rows[i].nll - mean);
    var /= N; // population variance: llama.cpp's nll2/count - mean^2
    CHECK_EQ_INT(r.count, N);
    CHECK_NEAR(r.nll_mean, mean, 1e-12);
    CHECK_NEAR(r.ppl, exp(mean), 1e-10);
    CHECK_NEAR(r.nll_stderr, sqrt(var / (N - 1)), 1e-12);
    CHECK_NEAR(r.ppl_unc, exp(mean) * sqrt(var / (N - 1)), 1e-10);
    CHECK(!r.kld && r.kld_mean == 0);
    llmq_eval_stats_free(&s);

    // KLD mode
    struct llmq_eval_stats k = {.kld = true};
    for (int i = 0; i < N; i += 7) CHECK(llmq_eval_stats_add(&k, rows + i, i + 7 <= N ? 7 : N - i) == LLMQ_OK);
    llmq_eval_stats_result(&k, &r);
    CHECK(r.kld);
    CHECK_NEAR(r.kld_mean, 0.5, 1e-12);
    CHECK_NEAR(r.ppl_base, exp(sum_b / N), 1e-10);
    CHECK_NEAR(r.same_top, (double)same / N, 1e-15);
    CHECK_NEAR(r.same_top_unc, sqrt(r.same_top * (1 - r.same_top) / (N - 1)), 1e-15);
    for (int i = 0; i < LLMQ_EVAL_N_QUANTILES; i++) CHECK_NEAR(r.kld_q[i], llmq_eval_quantiles[i], 1e-6);
    double pd = 0, pd2 = 0, pmax = 0, c = 0, mb = sum_b / N, vb = 0, lo = 1, hi = -1;
    for (int i = 0; i < N; i++) {
        double d = exp(-rows[i].nll) - exp(-rows[i].nll_base);
        pd += d, pd2 += d * d, pmax = fmax(pmax, fabs(d)), lo = fmin(lo, d), hi = fmax(hi, d);
        c += (rows[i].nll - mean) * (rows[i].nll_base - mb);
        vb += (rows[i].nll_base - mb) * (rows[i].nll_base - mb);
    }
    CHECK_NEAR(r.p_diff_mean, pd / N, 1e-14);
    CHECK_NEAR(r.p_diff_rms, sqrt(pd2 / N), 1e-14);
    CHECK_NEAR(r.p_diff_max_abs, pmax, 1e-15);
    CHECK_NEAR(r.p_diff_q[0], lo, 1e-7); // stored as float
    CHECK_NEAR(r.p_diff_q[12], hi, 1e-7);
    for (int i = 1; i < LLMQ_EVAL_N_QUANTILES; i++) CHECK(r.p_diff_q[i - 1] <= r.p_diff_q[i]);
    double cor = c / sqrt(var * N * vb); // Pearson correlation of nll and nll_base
    CHECK_NEAR(r.log_ppl_cor, cor, 1e-9);
    CHECK_NEAR(r.log_ppl_ratio, mean - mb, 1e-12);
    CHECK_NEAR(r.ppl_ratio, exp(mean - mb), 1e-12);
    CHECK_NEAR(r.ppl_diff, exp(mean) - exp(mb), 1e-10);
    llmq_eval_stats_free(&k);

    // few positions: llama.cpp reports 0 uncertainty in KLD mode below 11, empty stats are all zero
    struct llmq_eval_stats few = {.kld = true};
    CHECK(llmq_eval_stats_add(&few, rows, 5) == LLMQ_OK);
    llmq_eval_stats_result(&few, &r);
    CHECK(r.kld_unc == 0 && r.nll_stderr == 0 && r.count == 5);
    llmq_eval_stats_free(&few);
    struct llmq_eval_stats none = {0};
    llmq_eval_stats_result(&none, &r);
    CHECK(r.count == 0 && r.ppl == 0);
}

// ---- logits file ---------------------------------------------------------------------------------

static char tmpdir[] = "/tmp/llmq_test_eval_XXXXXX";

static void make_header(struct llmq_logits_header *h, enum llmq_dtype dt) {
    memset(h, 0, sizeof(*h));
    h->dtype = dt;
    h->protocol = LLMQ_EVAL_PROTOCOL_LLAMACPP;
    h->n_vocab = 50;
    h->n_ctx = 8;
    h->n_chunks = 3;
    h->first = 4;
    h->n_rows = 3;
    h->n_text_tokens = 30;
    for (int i = 0; i < 32; i++) h->text_sha256[i] = (uint8_t)i;
}

static char *write_file(const char *name, enum llmq_dtype dt, float *logits /* (3, 3, 50) */, int32_t *toks) {
    static char path[256];
    struct llmq_logits_header h;
    struct llmq_logits_writer *w;
    make_header(&h, dt);
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    CHECK(llmq_logits_create(path, &h, toks, &w) == LLMQ_OK);
    // chunk 0 whole, then the rest in uneven slices
    CHECK(llmq_logits_append(w, logits, 3) == LLMQ_OK);
    CHECK(llmq_logits_append(w, logits + 150, 4) == LLMQ_OK);
    CHECK(llmq_logits_append(w, logits + 350, 2) == LLMQ_OK);
    CHECK(llmq_logits_commit(w) == LLMQ_OK);
    return path;
}

static size_t slurp(const char *path, uint8_t *buf, size_t cap) {
    FILE *fp = fopen(path, "rb");
    CHECK(fp);
    size_t n = fread(buf, 1, cap, fp);
    fclose(fp);
    return n;
}

static void spit(const char *path, const uint8_t *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(buf, 1, n, fp) == n);
    fclose(fp);
}

// Writes a copy of good with one patch and expects llmq_logits_open to fail with st and a message.
static void expect_corrupt(const uint8_t *good, size_t n, size_t off, const void *patch, size_t plen, size_t new_n,
                           enum llmq_status st, const char *msg) {
    static uint8_t buf[1 << 16];
    char path[256];
    struct llmq_logits_file *f;
    memcpy(buf, good, n);
    if (patch) memcpy(buf + off, patch, plen);
    snprintf(path, sizeof(path), "%s/bad.logits", tmpdir);
    spit(path, buf, new_n);
    llmq_clear_error();
    enum llmq_status got = llmq_logits_open(path, &f);
    if (got != st || !strstr(llmq_last_error(), msg)) {
        fprintf(stderr, "patch at %zu: got %s \"%s\", expected %s \"%s\"\n", off, llmq_status_name(got),
                llmq_last_error(), llmq_status_name(st), msg);
        exit(1);
    }
    CHECK(f == NULL);
}

static void test_logits_file(void) {
    static float logits[450], back[150];
    int32_t toks[24];
    struct llmq_logits_file *f;
    CHECK(mkdtemp(tmpdir));
    fill(logits, 450, 20, 0);
    for (int i = 0; i < 24; i++) toks[i] = (i * 7) % 50;

    // f32 round trip: exact
    char p32[256];
    snprintf(p32, sizeof(p32), "%s", write_file("a.logits", LLMQ_DTYPE_F32, logits, toks));
    CHECK(llmq_logits_open(p32, &f) == LLMQ_OK);
    const struct llmq_logits_header *h = llmq_logits_header(f);
    CHECK(h->dtype == LLMQ_DTYPE_F32 && h->n_vocab == 50 && h->n_ctx == 8 && h->n_chunks == 3 && h->first == 4);
    CHECK(h->n_rows == 3 && h->n_text_tokens == 30 && h->text_sha256[31] == 31);
    CHECK(memcmp(llmq_logits_tokens(f), toks, sizeof(toks)) == 0);
    for (int k = 2; k >= 0; k--) {
        CHECK(llmq_logits_read(f, k, 0, 3, back) == LLMQ_OK);
        CHECK(memcmp(back, logits + k * 150, sizeof(back)) == 0);
    }
    CHECK(llmq_logits_read(f, 1, 1, 2, back) == LLMQ_OK);
    CHECK(memcmp(back, logits + 200, 100 * sizeof(float)) == 0);
    CHECK(llmq_logits_read(f, 1, 3, 0, back) == LLMQ_OK);
    llmq_log_set_level(LLMQ_LOG_SILENT);
    CHECK(llmq_logits_read(f, 3, 0, 1, back) == LLMQ_ERR_ARG);
    CHECK(llmq_logits_read(f, 0, 2, 2, back) == LLMQ_ERR_ARG);
    CHECK(llmq_logits_read(f, 0, -1, 1, back) == LLMQ_ERR_ARG);
    llmq_logits_close(f);

    // f16 round trip: within half an f16 ulp (|x| < 32: 2^-6)
    char path16[256];
    snprintf(path16, sizeof(path16), "%s", write_file("b.logits", LLMQ_DTYPE_F16, logits, toks));
    CHECK(llmq_logits_open(path16, &f) == LLMQ_OK);
    CHECK(llmq_logits_read(f, 1, 0, 3, back) == LLMQ_OK);
    for (int i = 0; i < 150; i++) CHECK(fabsf(back[i] - logits[150 + i]) <= 0.0079f);
    llmq_logits_close(f);

    // the good f32 file is 128 + 4*24 = 224 -> D = 256, + 3*3*50*4 = 2056 bytes
    static uint8_t good[1 << 16];
    size_t n = slurp(p32, good, sizeof(good));
    CHECK_EQ_INT(n, 256 + 1800);
    uint32_t u;
    int64_t v;
    expect_corrupt(good, n, 0, "GGUF", 4, n, LLMQ_ERR_MAGIC, "bad magic");
    expect_corrupt(good, n, 0, NULL, 0, 5, LLMQ_ERR_MAGIC, "not an llmq logits file");
    expect_corrupt(good, n, 0, NULL, 0, 100, LLMQ_ERR_TRUNCATED, "header");
    u = 2, expect_corrupt(good, n, 8, &u, 4, n, LLMQ_ERR_VERSION, "version 2");
    u = 7, expect_corrupt(good, n, 12, &u, 4, n, LLMQ_ERR_CORRUPT, "dtype code 7");
    u = 9, expect_corrupt(good, n, 16, &u, 4, n, LLMQ_ERR_CORRUPT, "protocol code 9");
    u = 1, expect_corrupt(good, n, 20, &u, 4, n, LLMQ_ERR_CORRUPT, "flags");
    expect_corrupt(good, n, 110, "x", 1, n, LLMQ_ERR_CORRUPT, "reserved header byte 110");
    v = 0, expect_corrupt(good, n, 24, &v, 8, n, LLMQ_ERR_CORRUPT, "n_vocab 0");
    v = -5, expect_corrupt(good, n, 24, &v, 8, n, LLMQ_ERR_CORRUPT, "n_vocab -5");
    v = (int64_t)1 << 40, expect_corrupt(good, n, 32, &v, 8, n, LLMQ_ERR_CORRUPT, "n_ctx");
    v = 0, expect_corrupt(good, n, 40, &v, 8, n, LLMQ_ERR_CORRUPT, "n_chunks 0");
    v = INT64_MAX, expect_corrupt(good, n, 40, &v, 8, n, LLMQ_ERR_CORRUPT, "n_chunks");
    v = 0, expect_corrupt(good, n, 48, &v, 8, n, LLMQ_ERR_CORRUPT, "first scored position 0");
    u = 1, expect_corrupt(good, n, 16, &u, 4, n, LLMQ_ERR_CORRUPT, "protocol gptq"); // gptq needs first 0
    v = 4, expect_corrupt(good, n, 56, &v, 8, n, LLMQ_ERR_CORRUPT, "n_rows 4");
    { // llamacpp with n_ctx 2: first 1, no row to score (patched in place, then re-read)
        int64_t c2 = 2, f1 = 1, r0 = 0;
        memcpy(good + 32, &c2, 8);
        memcpy(good + 48, &f1, 8);
        memcpy(good + 56, &r0, 8);
        expect_corrupt(good, n, 0, NULL, 0, n, LLMQ_ERR_CORRUPT, "n_rows 0");
        CHECK(slurp(p32, good, sizeof(good)) == n);
    }
    v = 23, expect_corrupt(good, n, 64, &v, 8, n, LLMQ_ERR_CORRUPT, "n_text_tokens 23");
    v = 51, expect_corrupt(good, n, 24, &v, 8, n, LLMQ_ERR_TRUNCATED, "header describes 2092");
    expect_corrupt(good, n, 0, NULL, 0, n - 1, LLMQ_ERR_TRUNCATED, "header describes");
    good[n] = 0;
    expect_corrupt(good, n + 1, 0, NULL, 0, n + 1, LLMQ_ERR_CORRUPT, "header describes");
    u = 50, expect_corrupt(good, n, 128 + 4 * 13, &u, 4, n, LLMQ_ERR_CORRUPT, "token 13 (chunk 1) = 50");
    u = 0xffffffffu, expect_corrupt(good, n, 128, &u, 4, n, LLMQ_ERR_CORRUPT, "= -1");
    char dir[300];
    snprintf(dir, sizeof(dir), "%s", tmpdir);
    CHECK(llmq_logits_open(dir, &f) == LLMQ_ERR_IO);
    CHECK(llmq_logits_open("/nonexistent/x.logits", &f) == LLMQ_ERR_IO);

    // NaN in a chunk: opens fine, that chunk's read names the row
    float nan = NAN;
    char bad[300];
    snprintf(bad, sizeof(bad), "%s/nan.logits", tmpdir);
    memcpy(good + 256 + 4 * (150 + 50 + 3), &nan, 4); // chunk 1, row 1, value 3
    spit(bad, good, n);
    CHECK(llmq_logits_open(bad, &f) == LLMQ_OK);
    CHECK(llmq_logits_read(f, 0, 0, 3, back) == LLMQ_OK);
    CHECK(llmq_logits_read(f, 1, 2, 1, back) == LLMQ_OK);
    CHECK(llmq_logits_read(f, 1, 0, 3, back) == LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "chunk 1 row 1: logit 3");
    // the file shrinks after open: truncated read
    CHECK(truncate(bad, 300) == 0);
    CHECK(llmq_logits_read(f, 2, 0, 3, back) == LLMQ_ERR_TRUNCATED);
    llmq_logits_close(f);

    // writer refusals: bad header, out-of-vocabulary token, NaN and f16 overflow, missing chunks
    struct llmq_logits_header hh;
    struct llmq_logits_writer *w;
    char wp[300];
    snprintf(wp, sizeof(wp), "%s/w.logits", tmpdir);
    make_header(&hh, LLMQ_DTYPE_F32);
    hh.first = 3;
    CHECK(llmq_logits_create(wp, &hh, toks, &w) == LLMQ_ERR_ARG && w == NULL);
    make_header(&hh, LLMQ_DTYPE_BF16);
    CHECK(llmq_logits_create(wp, &hh, toks, &w) == LLMQ_ERR_ARG);
    make_header(&hh, LLMQ_DTYPE_F16);
    toks[5] = 50;
    CHECK(llmq_logits_create(wp, &hh, toks, &w) == LLMQ_ERR_ARG);
    toks[5] = 0;
    CHECK(llmq_logits_create(wp, &hh, toks, &w) == LLMQ_OK);
    CHECK(llmq_logits_append(w, logits, 3) == LLMQ_OK);
    logits[170] = 1e5f;
    CHECK(llmq_logits_append(w, logits + 150, 3) == LLMQ_ERR_NUMERIC);
    CHECK_CONTAINS(llmq_last_error(), "chunk 1 row 0: logit 20 = 100000");
    logits[170] = NAN;
    CHECK(llmq_logits_append(w, logits + 150, 1) == LLMQ_ERR_NUMERIC);
    logits[170] = 0;
    CHECK(llmq_logits_append(w, logits, 7) == LLMQ_ERR_ARG); // 3 + 7 > 9 rows
    CHECK(llmq_logits_commit(w) == LLMQ_ERR_ARG);            // 3 of 9 rows
    CHECK(access(wp, F_OK) != 0);
    CHECK(llmq_logits_create(wp, &hh, toks, &w) == LLMQ_OK);
    llmq_logits_abort(w);
    CHECK(access(wp, F_OK) != 0);
    llmq_logits_abort(NULL);
    llmq_logits_close(NULL);
    llmq_log_set_level(LLMQ_LOG_INFO);

    test_remove_tree(tmpdir);
}

int main(void) {
    test_sha256();
    test_join_rows();
    test_plan();
    test_row_math();
    test_score();
    test_stats();
    test_logits_file();
    printf("test_eval: ok\n");
    return 0;
}
