// tests/unit/test_tasks.c — the task readers, request strings, selection and statistics of calib/eval/tasks.h
// (the scores themselves are checked against lm-eval and llama-perplexity in tests/py/test_tasks_oracle.py).
#include "harness.h"

#include "calib/eval/tasks.h"
#include "common/log.h"

#include <math.h>

static struct llmq_task_set parse(enum llmq_task_id id, enum llmq_task_protocol p, const char *text,
                                  const char *labels) {
    struct llmq_task_set s;
    CHECK_OK(llmq_task_set_parse(id, p, text, strlen(text), labels, labels ? strlen(labels) : 0, "t", &s));
    return s;
}

static void check_bad(enum llmq_task_id id, const char *text, const char *labels, const char *msg) {
    struct llmq_task_set s;
    enum llmq_status st = llmq_task_set_parse(id, LLMQ_TASK_PROTOCOL_LMEVAL, text, strlen(text), labels,
                                              labels ? strlen(labels) : 0, "bad.jsonl", &s);
    CHECK(st == LLMQ_ERR_CORRUPT);
    CHECK_CONTAINS(llmq_last_error(), "bad.jsonl:");
    CHECK_CONTAINS(llmq_last_error(), msg);
    CHECK(s.n_items == 0 && s.items == NULL);
}

// The prompts of lm-eval's YAMLs (arc "Question: ...\nAnswer:" + " choice"), labels 1-5, the gold by label.
static void test_arc(void) {
    const char *t = "{\"question\": {\"stem\": \"Why?\", \"choices\": [{\"text\": \"a\", \"label\": \"1\"}, "
                    "{\"text\": \"b\\u00e9\", \"label\": \"2\"}, {\"text\": \"c\", \"label\": \"3\"}]}, "
                    "\"answerKey\": \"2\"}\n\n";
    struct llmq_task_set s = parse(LLMQ_TASK_ARC_EASY, LLMQ_TASK_PROTOCOL_LMEVAL, t, NULL);
    CHECK_EQ_INT(s.n_items, 1);
    CHECK_EQ_INT(s.items[0].n_choices, 3);
    CHECK_EQ_INT(s.items[0].gold, 1);
    CHECK(strcmp(s.items[0].ch[1].ctx, "Question: Why?\nAnswer:") == 0);
    CHECK(strcmp(s.items[0].ch[1].cont, " b\xc3\xa9") == 0);
    CHECK_EQ_INT(s.items[0].ch[1].norm_len, 2); // code points, as Python's len(str)
    llmq_task_set_free(&s);
    check_bad(LLMQ_TASK_ARC_EASY, "{\"question\": {\"stem\": \"q\", \"choices\": []}, \"answerKey\": \"A\"}\n", NULL,
              "2 to 8 choices");
    check_bad(LLMQ_TASK_ARC_EASY,
              "{\"question\": {\"stem\": \"q\", \"choices\": [{\"text\": \"a\", \"label\": \"A\"}, {\"text\": \"b\", "
              "\"label\": \"B\"}]}, \"answerKey\": \"E\"}\n",
              NULL, "answerKey");
    check_bad(LLMQ_TASK_ARC_EASY, "{\"question\": 1}\nnot json\n", NULL, ":1:");
}

// lm-eval's hellaswag preprocess() under lm-eval; the lines as they are under llamacpp; 6 lines per item.
static void test_hellaswag(void) {
    const char *t = "Label: a [header] b  [title] c.  \n2\n e1 [step] x\ne2\ne3\ne4\n";
    struct llmq_task_set s = parse(LLMQ_TASK_HELLASWAG, LLMQ_TASK_PROTOCOL_LMEVAL, t, NULL);
    CHECK_EQ_INT(s.n_items, 1);
    CHECK_EQ_INT(s.items[0].gold, 2);
    // strip, " [title]" -> ". ", "[...]" removed, "  " -> " " once
    CHECK(strcmp(s.items[0].ch[0].ctx, "Label: a b . c.") == 0);
    CHECK(strcmp(s.items[0].ch[0].cont, " e1 x") == 0);
    CHECK_EQ_INT(s.items[0].ch[0].norm_len, 4);
    llmq_task_set_free(&s);
    s = parse(LLMQ_TASK_HELLASWAG, LLMQ_TASK_PROTOCOL_LLAMACPP, t, NULL);
    CHECK(strcmp(s.items[0].ch[0].ctx, "Label: a [header] b  [title] c.  ") == 0);
    CHECK(strcmp(s.items[0].ch[0].cont, "  e1 [step] x") == 0);
    llmq_task_set_free(&s);
    check_bad(LLMQ_TASK_HELLASWAG, "c\n1\na\nb\nc\nd\nc2\n", NULL, "multiple of 6");
    check_bad(LLMQ_TASK_HELLASWAG, "c\nx\na\nb\nc\nd\n", NULL, "gold ending");
    check_bad(LLMQ_TASK_HELLASWAG, "c\n4\na\nb\nc\nd\n", NULL, "not one of the choices");
}

// PIQA labels from the labels file or inline; too few / too many labels are errors.
static void test_piqa(void) {
    const char *t = "{\"goal\": \"g\", \"sol1\": \"s1\", \"sol2\": \"s2\"}\n{\"goal\": \"h\", \"sol1\": \"x\", "
                    "\"sol2\": \"y\"}\n";
    struct llmq_task_set s = parse(LLMQ_TASK_PIQA, LLMQ_TASK_PROTOCOL_LMEVAL, t, "1\n0\n");
    CHECK_EQ_INT(s.n_items, 2);
    CHECK_EQ_INT(s.items[0].gold, 1);
    CHECK_EQ_INT(s.items[1].gold, 0);
    CHECK(strcmp(s.items[1].ch[0].ctx, "Question: h\nAnswer:") == 0 && strcmp(s.items[1].ch[1].cont, " y") == 0);
    llmq_task_set_free(&s);
    check_bad(LLMQ_TASK_PIQA, t, "1\n", "labels file is too short");
    check_bad(LLMQ_TASK_PIQA, t, "1\n0\n1\n", "more lines");
    s = parse(LLMQ_TASK_PIQA, LLMQ_TASK_PROTOCOL_LMEVAL,
              "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 1}", NULL);
    CHECK_EQ_INT(s.items[0].gold, 1);
    llmq_task_set_free(&s);
}

// Partial scoring: the llm-foundry form and the original schema give the same lm-eval requests; the
// llamacpp strings keep the sentence's own spacing ("_." has none).
static void test_winogrande(void) {
    const char *lf = "{\"context_options\": [\"A met B so A\", \"A met B so B\"], \"continuation\": \"left.\", "
                     "\"gold\": 1}\n{\"context_options\": [\"It was the x\", \"It was the y\"], \"continuation\": "
                     "\".\", \"gold\": 0}\n";
    const char *orig = "{\"sentence\": \"A met B so _ left.\", \"option1\": \"A\", \"option2\": \"B\", \"answer\": "
                       "\"2\"}\n{\"sentence\": \"It was the _.\", \"option1\": \"x\", \"option2\": \"y\", \"answer\": "
                       "\"1\"}\n";
    for (int p = 0; p < 2; p++) {
        struct llmq_task_set a = parse(LLMQ_TASK_WINOGRANDE, (enum llmq_task_protocol)p, lf, NULL);
        struct llmq_task_set b = parse(LLMQ_TASK_WINOGRANDE, (enum llmq_task_protocol)p, orig, NULL);
        CHECK_EQ_INT(a.n_items, 2);
        for (int i = 0; i < 2; i++) {
            CHECK_EQ_INT(a.items[i].gold, b.items[i].gold);
            for (int c = 0; c < 2; c++) {
                CHECK(strcmp(a.items[i].ch[c].ctx, b.items[i].ch[c].ctx) == 0);
                CHECK(strcmp(a.items[i].ch[c].cont, b.items[i].ch[c].cont) == 0);
            }
        }
        CHECK(strcmp(a.items[0].ch[1].ctx, "A met B so B") == 0 && strcmp(a.items[0].ch[1].cont, " left.") == 0);
        // lm-eval: " " + the stripped rest; llamacpp: the rest as written
        CHECK(strcmp(a.items[1].ch[0].cont, p == LLMQ_TASK_PROTOCOL_LMEVAL ? " ." : ".") == 0);
        llmq_task_set_free(&a);
        llmq_task_set_free(&b);
    }
    check_bad(LLMQ_TASK_WINOGRANDE,
              "{\"sentence\": \"no blank\", \"option1\": \"a\", \"option2\": \"b\", "
              "\"answer\": \"1\"}\n",
              NULL, "one '_'");
}

static void test_lambada(void) {
    struct llmq_task_set s =
        parse(LLMQ_TASK_LAMBADA, LLMQ_TASK_PROTOCOL_LMEVAL,
              "{\"context\": \"he said\", \"continuation\": \"hello\"}\n{\"text\": \"a b c\"}\n", NULL);
    CHECK_EQ_INT(s.n_items, 2);
    CHECK(strcmp(s.items[0].ch[0].ctx, "he said") == 0 && strcmp(s.items[0].ch[0].cont, " hello") == 0);
    CHECK(strcmp(s.items[1].ch[0].ctx, "a b") == 0 && strcmp(s.items[1].ch[0].cont, " c") == 0);
    llmq_task_set_free(&s);
    check_bad(LLMQ_TASK_LAMBADA, "{\"text\": \"oneword\"}\n", NULL, "no space");
}

// std::mt19937(1) (the C++ standard fixes its output: 10000th value of the default seed 5489 is 4123659995),
// the selections, lm-eval's stderr, the task list.
static void test_select_and_stats(void) {
    struct llmq_mt19937 r;
    llmq_mt19937_seed(&r, 5489);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++) v = llmq_mt19937_next(&r);
    CHECK(v == 4123659995u);
    llmq_mt19937_seed(&r, 1);
    CHECK(llmq_mt19937_next(&r) == 1791095845u);

    char text[4096] = "";
    for (int i = 0; i < 50; i++) {
        char line[128];
        snprintf(line, sizeof(line), "{\"context\": \"c%d x\", \"continuation\": \"w\"}\n", i);
        strcat(text, line);
    }
    for (int p = 0; p < 2; p++) {
        struct llmq_task_set s = parse(LLMQ_TASK_LAMBADA, (enum llmq_task_protocol)p, text, NULL);
        llmq_task_set_select(&s, 7, false, 0); // lambada: the first N under both protocols
        CHECK_EQ_INT(s.n_items, 7);
        CHECK_EQ_INT(s.n_file_items, 50);
        for (int i = 0; i < 7; i++) CHECK_EQ_INT(s.items[i].index, i);
        llmq_task_set_free(&s);
        s = parse(LLMQ_TASK_LAMBADA, (enum llmq_task_protocol)p, text, NULL);
        llmq_task_set_select(&s, 10, true, 42); // seeded: distinct, in file order, not the first 10
        bool first10 = true;
        for (int i = 0; i < 10; i++) {
            if (i) CHECK(s.items[i].index > s.items[i - 1].index);
            first10 = first10 && s.items[i].index == i;
        }
        CHECK(!first10);
        llmq_task_set_free(&s);
    }
    // llamacpp selection of arc: a permutation prefix (distinct indices), deterministic
    char arc[8192] = "";
    for (int i = 0; i < 30; i++)
        strcat(arc, "{\"question\": {\"stem\": \"q\", \"choices\": [{\"text\": \"a\", \"label\": \"A\"}, {\"text\": "
                    "\"b\", \"label\": \"B\"}]}, \"answerKey\": \"A\"}\n");
    struct llmq_task_set a = parse(LLMQ_TASK_ARC_EASY, LLMQ_TASK_PROTOCOL_LLAMACPP, arc, NULL);
    struct llmq_task_set b = parse(LLMQ_TASK_HELLASWAG, LLMQ_TASK_PROTOCOL_LLAMACPP,
                                   "c\n0\na\nb\nc\nd\nc\n1\na\nb\nc\nd\nc\n2\na\nb\nc\nd\n", NULL);
    llmq_task_set_select(&a, 30, false, 0); // all: file order
    CHECK_EQ_INT(a.items[29].index, 29);
    llmq_task_set_select(&a, 12, false, 0);
    bool seen[30] = {0};
    for (int i = 0; i < 12; i++) {
        CHECK(!seen[a.items[i].index]);
        seen[a.items[i].index] = true;
    }
    llmq_task_set_select(&b, 2, false, 0);
    CHECK_EQ_INT(b.n_items, 2);
    CHECK(b.items[0].index != b.items[1].index);
    llmq_task_set_free(&a);
    llmq_task_set_free(&b);

    // mean_stderr of 0/1 values: sqrt(p(1-p) n / (n-1)) / sqrt(n)
    CHECK(fabs(llmq_tasks_stderr01(3, 10) - sqrt(0.3 * 0.7 * 10.0 / 9.0) / sqrt(10.0)) < 1e-15);
    CHECK(llmq_tasks_stderr01(1, 1) == 0);

    enum llmq_task_id ids[LLMQ_TASK_COUNT];
    const char *paths[LLMQ_TASK_COUNT];
    char *buf;
    int n;
    CHECK_OK(llmq_tasks_parse_list("all", ids, &n, paths, &buf));
    CHECK_EQ_INT(n, LLMQ_TASK_COUNT);
    free(buf);
    CHECK_OK(llmq_tasks_parse_list("piqa=a.jsonl@l.lst,lambada", ids, &n, paths, &buf));
    CHECK_EQ_INT(n, 2);
    CHECK(ids[0] == LLMQ_TASK_PIQA && strcmp(paths[LLMQ_TASK_PIQA], "a.jsonl@l.lst") == 0);
    CHECK(paths[LLMQ_TASK_LAMBADA] == NULL);
    free(buf);
    CHECK(llmq_tasks_parse_list("piqa,mmlu", ids, &n, paths, &buf) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "'mmlu'");
    free(buf);
    CHECK(llmq_tasks_parse_list("piqa,piqa", ids, &n, paths, &buf) == LLMQ_ERR_ARG);
    free(buf);
}

int main(void) {
    llmq_log_set_level(LLMQ_LOG_SILENT);
    test_arc();
    test_hellaswag();
    test_piqa();
    test_winogrande();
    test_lambada();
    test_select_and_stats();
    return 0;
}
