// tests/unit/test_gate.c — quality-gate expressions (calib/eval/gate.h): parsing, refusals, verdicts.
#include "harness.h"

#include "calib/eval/gate.h"

#include <math.h>

static struct llmq_gate parse_ok(const char *expr) {
    struct llmq_gate g;
    char err[256];
    enum llmq_status st = llmq_gate_parse(expr, &g, err, sizeof(err));
    if (st) fprintf(stderr, "%s\n", err);
    CHECK(st == LLMQ_OK);
    return g;
}

// A refused expression: LLMQ_ERR_ARG, the message names the expression and holds `why`.
static void parse_bad(const char *expr, const char *why) {
    struct llmq_gate g;
    char err[512];
    CHECK(llmq_gate_parse(expr, &g, err, sizeof(err)) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(err, expr);
    CHECK_CONTAINS(err, why);
}

static void test_parse(void) {
    struct llmq_gate g = parse_ok("ppl_increase>2%");
    CHECK(g.metric == LLMQ_GATE_PPL_INCREASE && g.op == LLMQ_GATE_OP_GT && g.threshold == 2 && !g.task[0]);
    CHECK(strcmp(g.expr, "ppl_increase>2%") == 0);
    g = parse_ok(" kld >= 0.05 ");
    CHECK(g.metric == LLMQ_GATE_KLD && g.op == LLMQ_GATE_OP_GE && g.threshold == 0.05);
    g = parse_ok("kld_p99>0.5");
    CHECK(g.metric == LLMQ_GATE_KLD_P99 && g.threshold == 0.5);
    g = parse_ok("top1<90 %");
    CHECK(g.metric == LLMQ_GATE_TOP1 && g.op == LLMQ_GATE_OP_LT && g.threshold == 90);
    g = parse_ok("ppl<=1e2");
    CHECK(g.metric == LLMQ_GATE_PPL && g.op == LLMQ_GATE_OP_LE && g.threshold == 100);
    g = parse_ok("hellaswag.acc_drop>1.0");
    CHECK(g.metric == LLMQ_GATE_TASK_ACC_DROP && strcmp(g.task, "hellaswag") == 0 && g.threshold == 1.0);
    CHECK(llmq_gate_needs(&g) == (LLMQ_GATE_NEEDS_TASK | LLMQ_GATE_NEEDS_BASE));
    g = parse_ok("arc-challenge.acc<30%"); // points take the '%' or not
    CHECK(g.metric == LLMQ_GATE_TASK_ACC && strcmp(g.task, "arc-challenge") == 0 && g.threshold == 30);
    char name[64];
    llmq_gate_metric_name(&g, name, sizeof(name));
    CHECK(strcmp(name, "arc-challenge.acc") == 0);
    g = parse_ok("ppl>3");
    CHECK(llmq_gate_needs(&g) == 0);
    g = parse_ok("top1<99%");
    CHECK(llmq_gate_needs(&g) == LLMQ_GATE_NEEDS_KLD);
}

static void test_refusals(void) {
    parse_bad("perplexity>3", "unknown metric 'perplexity'");
    parse_bad("perplexity>3", "ppl_increase"); // the known names are listed
    parse_bad("hellaswag.accuracy>3", "unknown metric 'hellaswag.accuracy'");
    parse_bad("mmlu.acc<30", "unknown task 'mmlu'");
    parse_bad(".acc<30", "task name");
    parse_bad("ppl", "expected METRIC<VALUE");
    parse_bad("ppl=3", "expected METRIC<VALUE");
    parse_bad(">3", "expected");
    parse_bad("ppl>", "not a finite number");
    parse_bad("ppl>inf", "not a finite number");
    parse_bad("ppl>nan", "not a finite number");
    parse_bad("ppl>3x", "unexpected 'x'");
    parse_bad("ppl>3%%", "unexpected '%'");
    parse_bad("top1<0.9", "is a percentage"); // would silently mean 0.9 %
    parse_bad("ppl_increase>2", "is a percentage");
    parse_bad("kld>5%", "not a percentage");
    char longexpr[300];
    memset(longexpr, 'a', sizeof(longexpr) - 1);
    longexpr[sizeof(longexpr) - 1] = '\0';
    struct llmq_gate g;
    char err[256];
    CHECK(llmq_gate_parse(longexpr, &g, err, sizeof(err)) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(err, "longer than");
}

static void test_verdicts(void) {
    struct llmq_gate_values v;
    llmq_gate_values_init(&v);
    struct llmq_gate gt = parse_ok("ppl_increase>5%"), le = parse_ok("top1<=90%"), acc = parse_ok("piqa.acc_drop>1");
    double x;
    CHECK(llmq_gate_eval(&gt, &v, &x) == LLMQ_GATE_UNMEASURED && isnan(x));
    v.core[LLMQ_GATE_PPL_INCREASE] = 5.0; // equal: not more than 5 %
    CHECK(llmq_gate_eval(&gt, &v, &x) == LLMQ_GATE_PASS && x == 5.0);
    v.core[LLMQ_GATE_PPL_INCREASE] = 5.0001;
    CHECK(llmq_gate_eval(&gt, &v, NULL) == LLMQ_GATE_FAIL);
    v.core[LLMQ_GATE_PPL_INCREASE] = INFINITY; // a model whose PPL diverged fails an upper bound
    CHECK(llmq_gate_eval(&gt, &v, NULL) == LLMQ_GATE_FAIL);
    v.core[LLMQ_GATE_TOP1] = 90.0;
    CHECK(llmq_gate_eval(&le, &v, NULL) == LLMQ_GATE_FAIL);
    v.core[LLMQ_GATE_TOP1] = 90.5;
    CHECK(llmq_gate_eval(&le, &v, NULL) == LLMQ_GATE_PASS);
    CHECK(llmq_gate_eval(&acc, &v, NULL) == LLMQ_GATE_UNMEASURED); // no task rows
    struct llmq_gate_task_values t[2] = {{"hellaswag", 40, 50, 3, 3}, {"piqa", 60, 61, 0.5, NAN}};
    v.tasks = t;
    v.n_tasks = 2;
    CHECK(llmq_gate_eval(&acc, &v, &x) == LLMQ_GATE_PASS && x == 0.5);
    t[1].acc_drop = 1.5;
    CHECK(llmq_gate_eval(&acc, &v, &x) == LLMQ_GATE_FAIL && x == 1.5);
    struct llmq_gate norm = parse_ok("piqa.acc_norm_drop>1"), kld = parse_ok("kld>0.05");
    CHECK(llmq_gate_eval(&norm, &v, NULL) == LLMQ_GATE_UNMEASURED);
    char buf[64];
    llmq_gate_format_value(&gt, 38.2141, buf, sizeof(buf));
    CHECK(strcmp(buf, "38.214%") == 0);
    llmq_gate_format_value(&kld, 0.0523114, buf, sizeof(buf));
    CHECK(strcmp(buf, "0.0523114") == 0);
    CHECK(strcmp(llmq_gate_verdict_name(LLMQ_GATE_FAIL), "fail") == 0);
}

int main(void) {
    test_parse();
    test_refusals();
    test_verdicts();
    printf("test_gate: ok\n");
    return 0;
}
