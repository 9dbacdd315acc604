/*
 * common/log.h — leveled logging to stderr. stdout is reserved for what the user asked for
 *; everything here goes to stderr.
 */
#ifndef LLMQ_LOG_H
#define LLMQ_LOG_H

enum llmq_log_level {
    LLMQ_LOG_DEBUG = 0,
    LLMQ_LOG_INFO,
    LLMQ_LOG_WARN,
    LLMQ_LOG_ERROR,
    LLMQ_LOG_SILENT, // nothing is printed (errors are still recorded, see status.h)
};

void llmq_log_set_level(enum llmq_log_level level);
enum llmq_log_level llmq_log_get_level(void);
void llmq_log(enum llmq_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Monotonic wall-clock seconds (CLOCK_MONOTONIC), for progress lines, ETAs and reported timings.
double llmq_now_s(void);

#define llmq_debug(...) llmq_log(LLMQ_LOG_DEBUG, __VA_ARGS__)
#define llmq_info(...) llmq_log(LLMQ_LOG_INFO, __VA_ARGS__)
#define llmq_warn(...) llmq_log(LLMQ_LOG_WARN, __VA_ARGS__)

#endif // LLMQ_LOG_H
