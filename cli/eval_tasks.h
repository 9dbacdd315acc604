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

struct eval_tasks_args {
    const char *list; // --tasks
    enum llmq_task_protocol protocol;
    long limit;      // --limit (-1: all)
    long seed;       // --seed (-1: not given)
    bool json_items; // --json-items
    int n_threads;
    enum llmq_backend backend;
    enum llmq_emulate emulate;
};

// Runs the tasks, prints the table, and when js is non-NULL sets js["tasks"] (and "task_protocol").
// Returns the status of the run (the error was logged); a bad list is LLMQ_ERR_ARG.
enum llmq_status eval_tasks_run(const struct llmq_model *m, const struct eval_tasks_args *a, struct json_t *js);

#endif // LLMQ_CLI_EVAL_TASKS_H
