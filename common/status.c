// common/status.c — status names, last-error record, logging.
#include "common/status.h"
#include "common/log.h"

#include <string.h>
#include <time.h>

static const char *status_names[LLMQ_STATUS_COUNT] = {
    [LLMQ_OK] = "ok",
    [LLMQ_ERR_IO] = "io",
    [LLMQ_ERR_NOMEM] = "nomem",
    [LLMQ_ERR_ARG] = "arg",
    [LLMQ_ERR_MAGIC] = "magic",
    [LLMQ_ERR_VERSION] = "version",
    [LLMQ_ERR_TRUNCATED] = "truncated",
    [LLMQ_ERR_CORRUPT] = "corrupt",
    [LLMQ_ERR_OVERFLOW] = "overflow",
    [LLMQ_ERR_DUPLICATE] = "duplicate",
    [LLMQ_ERR_UNSUPPORTED] = "unsupported",
    [LLMQ_ERR_NOT_FOUND] = "not_found",
    [LLMQ_ERR_NUMERIC] = "numeric",
    [LLMQ_ERR_DEVICE] = "device",
};

static _Thread_local char last_msg[1024];
static _Thread_local enum llmq_status last_st;
static enum llmq_log_level log_level = LLMQ_LOG_INFO;

const char *llmq_status_name(enum llmq_status st) {
    if ((int)st < 0 || st >= LLMQ_STATUS_COUNT) return "unknown";
    return status_names[st];
}

enum llmq_status llmq_errorf(enum llmq_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
    va_end(ap);
    last_st = st;
    if (log_level <= LLMQ_LOG_ERROR) fprintf(stderr, "error: %s\n", last_msg);
    return st;
}

const char *llmq_last_error(void) { return last_msg; }
enum llmq_status llmq_last_status(void) { return last_st; }
void llmq_clear_error(void) {
    last_msg[0] = '\0';
    last_st = LLMQ_OK;
}

void llmq_log_set_level(enum llmq_log_level level) { log_level = level; }
enum llmq_log_level llmq_log_get_level(void) { return log_level; }

void llmq_log(enum llmq_log_level level, const char *fmt, ...) {
    static const char *prefix[] = {"debug: ", "", "warning: ", "error: ", ""};
    if (level < log_level || level >= LLMQ_LOG_SILENT) return;
    va_list ap;
    va_start(ap, fmt);
    fputs(prefix[level], stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double llmq_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
