// tests/unit/test_compare.c — calib/eval/compare.h without a model: the Pareto front, the CSV and HTML writers
// (quoting, escaping, one point per row, no external reference), the directory hash.
#include "harness.h"

#include "calib/eval/compare.h"
#include "common/sha256.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_pareto(void) {
    // (size, loss): b dominates c (smaller and better), d ties a on size with a larger loss, e is unmeasured
    const double x[] = {1, 2, 3, 1, 0.5, NAN}, y[] = {5, 3, 4, 6, 9, 1};
    bool f[6];
    llmq_compare_pareto(x, y, 6, f);
    CHECK(f[0] && f[1] && !f[2] && !f[3] && f[4] && !f[5]);
    const double x2[] = {1, 1}, y2[] = {2, 2}; // equal points do not dominate each other
    llmq_compare_pareto(x2, y2, 2, f);
    CHECK(f[0] && f[1]);
}

static struct llmq_compare_row row(const char *label, bool base, double mib, double ppl, double kld) {
    struct llmq_compare_row r = {.label = label,
                                 .path = label,
                                 .is_base = base,
                                 .ppl = ppl,
                                 .ppl_unc = 0.1,
                                 .ppl_delta_pct = base ? 0 : 10,
                                 .kld_mean = kld,
                                 .kld_unc = NAN,
                                 .kld_p99 = kld * 4,
                                 .kld_max = kld * 9,
                                 .top1_pct = 90,
                                 .top1_unc_pct = 1,
                                 .seconds = 1};
    r.size.file_bytes = (uint64_t)(mib * 1048576);
    r.size.tensor_bytes = r.size.file_bytes;
    r.size.n_params = 1000;
    r.size.bpw = 8.0 * (double)r.size.tensor_bytes / 1000;
    return r;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_writers(const char *dir) {
    struct llmq_compare_row rows[3] = {row("base.gguf", true, 500, 10, 0), row("q\"4<b>", false, 100, 11, 0.05),
                                       row("q2", false, 60, 20, 0.4)};
    char *csv = test_path(dir, "t.csv"), *html = test_path(dir, "t.html"), *text;
    size_t n;
    CHECK_OK(llmq_compare_write_csv(csv, rows, 3));
    CHECK_OK(llmq_read_file(csv, 1 << 20, &text, &n));
    CHECK(count(text, "\n") == 4);
    CHECK_CONTAINS(text, "\"q\"\"4<b>\",\"q\"\"4<b>\",0,104857600,"); // RFC 4180 quotes doubled
    CHECK_CONTAINS(text, ",,");                                       // NaN: an empty field
    free(text);
    CHECK_OK(llmq_compare_write_html(html, rows, 3, "text <x> & co"));
    CHECK_OK(llmq_read_file(html, 1 << 22, &text, &n));
    CHECK_CONTAINS(text, "text &lt;x&gt; &amp; co");
    CHECK_CONTAINS(text, ">q&quot;4&lt;b&gt;</text>");
    CHECK(!strstr(text, "<b>"));
    CHECK(count(text, "<svg ") == 2 && count(text, "<circle class=\"pt") == 4 &&
          count(text, "<rect class=\"pt base\"") == 2);
    CHECK(count(text, "<polyline class=\"front\"") == 2);
    CHECK(!strstr(text, "http") && !strstr(text, "src=") && !strstr(text, "href=") && !strstr(text, "<script"));
    free(text);
    // without KLD figures the second plot says so
    for (int i = 0; i < 3; i++) rows[i].kld_mean = NAN;
    CHECK_OK(llmq_compare_write_html(html, rows, 3, "t"));
    CHECK_OK(llmq_read_file(html, 1 << 22, &text, &n));
    CHECK(count(text, "<svg ") == 1 && count(text, "<circle class=\"pt") + count(text, "<rect class=\"pt") == 3);
    CHECK_CONTAINS(text, "not measured (run with --kld)");
    free(text);
}

// A directory's hash: sha256 of "NAME\0HEX\n" per regular file, sorted by name (sub-directories ignored).
static void test_dir_sha256(const char *dir) {
    char d[256];
    snprintf(d, sizeof(d), "%s/m", dir);
    CHECK(mkdir(d, 0777) == 0 && mkdir(test_path(d, "sub"), 0777) == 0);
    test_write_file(test_path(d, "b.json"), "{}", 2);
    test_write_file(test_path(d, "a.safetensors"), "xyz", 3);
    char got[65], ha[65], hb[65], want[65];
    CHECK_OK(llmq_compare_model_sha256(d, got));
    uint8_t dg[32];
    llmq_sha256("xyz", 3, dg);
    llmq_sha256_hex(dg, ha);
    llmq_sha256("{}", 2, dg);
    llmq_sha256_hex(dg, hb);
    char buf[512];
    int k = snprintf(buf, sizeof(buf), "a.safetensors%c%s\nb.json%c%s\n", 0, ha, 0, hb);
    llmq_sha256(buf, (size_t)k, dg);
    llmq_sha256_hex(dg, want);
    CHECK(strcmp(got, want) == 0);
    CHECK(llmq_compare_model_sha256(test_path(dir, "absent"), got) == LLMQ_ERR_IO);
}

int main(void) {
    char dir[] = "/tmp/llmq_test_compare_XXXXXX";
    CHECK(mkdtemp(dir));
    test_pareto();
    test_writers(dir);
    test_dir_sha256(dir);
    llmq_remove_tree(dir);
    printf("test_compare: ok\n");
    return 0;
}
