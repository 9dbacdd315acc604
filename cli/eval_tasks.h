/*
 * cli/eval_tasks.h — the `llmq eval --tasks` part of cli/cmd_eval.c: runs calib/eval/tasks.h on a loaded
 * model, prints one line per task on stdout (progress with ETA on stderr), and builds the "tasks" JSON.
 */
#ifndef LLMQ_CLI_EVAL_TASKS_H
#define LLMQ_CLI_EVAL_TASKS_H

#include "calib/eval/tasks.h"

#include <stdbool.h>

struct json_t;
struct llmq_model;

// The --tasks flags of `llmq eval` (a: a struct with const char *tasks; long limit, seed; bool json_items,
// no_prefix_reuse).
#define EVAL_TASK_FLAGS(a)                                                                                             \
    {"tasks", CLI_STR, &(a)->tasks, NULL,                                                                              \
     "zero-shot accuracy on these tasks: all, or a comma list of hellaswag, arc-easy, arc-challenge, piqa, "           \
     "winogrande, lambada (datasets/manifest.tsv); NAME=FILE reads that file instead (piqa=FILE@LABELS)"},             \
        {"limit", CLI_INT, &(a)->limit, "-1 (all)",                                                                    \
         "--tasks: N items per task: the first N (lm-eval), the N llama-perplexity picks (llamacpp), or with --seed "  \
         "a seeded sample"},                                                                                           \
        {"seed", CLI_INT, &(a)->seed, "none", "--tasks: draw the --limit items at random with this seed"},             \
        {"llamacpp-parallel", CLI_INT, &(a)->lc_parallel, "4",                                                         \
         "--tasks --protocol llamacpp --emulate llamacpp-cpu: the -np of the llama-perplexity run to match (which "    \
         "items share its batches; a ubatch under 64 tokens takes flash attention's f16 vector path)"},                \
        {"no-prefix-reuse", CLI_BOOL, &(a)->no_prefix_reuse, "off (reuse)",                                            \
         "--tasks: run every choice from position 0 instead of the item's shared prefix once (the same scores up to "  \
         "float rounding; slower)"},                                                                                   \
    {                                                                                                                  \
        "json-items", CLI_BOOL, &(a)->json_items, "off",                                                               \
            "--tasks: also write every item's choice, gold and per-choice scores into --json"                          \
    }

// The --tasks paragraph of `llmq eval --help`.
#define EVAL_TASKS_HELP                                                                                                \
    "Task protocols (--tasks; calib/eval/tasks.h):\n"                                                                  \
    "  lm-eval   lm-evaluation-harness 0.4.13: its prompts, log-likelihood of each continuation given\n"               \
    "            the context; acc by the sum, acc_norm by the sum per character of the choice.\n"                      \
    "  llamacpp  llama-perplexity --hellaswag / --winogrande / --multiple-choice: each choice tokenized\n"             \
    "            whole, mean log-prob after the common prefix; --limit N = its --*-tasks N selection.\n"

struct eval_tasks_args {
    const char *list; // --tasks
    enum llmq_task_protocol protocol;
    long limit;           // --limit (-1: all)
    long seed;            // --seed (-1: not given)
    bool json_items;      // --json-items
    bool no_prefix_reuse; // --no-prefix-reuse
    int lc_parallel;      // --llamacpp-parallel
    int n_threads;
    enum llmq_backend backend;
    enum llmq_emulate emulate;
};

// Whether list is a --tasks list llmq_tasks_parse_list accepts (the error was logged when not).
bool eval_tasks_list_ok(const char *list);

// Runs the tasks, prints the table, and when js is non-NULL sets js["tasks"] (and "task_protocol").
// tv (LLMQ_TASK_COUNT rows) receives the task gate values (cli/commands.h cli_gate_task_values), *n_tv
// their count (0 on failure). Returns the status of the run (the error was logged); a bad list is
// LLMQ_ERR_ARG.
struct llmq_gate_task_values;
enum llmq_status eval_tasks_run(const struct llmq_model *m, const struct eval_tasks_args *a, struct json_t *js,
                                struct llmq_gate_task_values *tv, int *n_tv);

#endif // LLMQ_CLI_EVAL_TASKS_H
