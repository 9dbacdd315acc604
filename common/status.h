/*
 * common/status.h — status codes and error reporting shared by every llmq module.
 *
 * Three error tiers, never mixed:
 *   1. Bad input or environment: a function logs ONE line naming the file / tensor / offset with
 *      llmq_errorf(), which also records it as the thread's last error, and returns an
 *      enum llmq_status (or NULL).
 *   2. Broken internal invariants: LLMQ_ASSERT (prints file:line and aborts).
 *   3. CUDA / cuBLAS / cuSOLVER failures: CUDA_CHECK in kernels/cuda_common.h.
 * Only cli/ calls exit().
 */
#ifndef LLMQ_STATUS_H
#define LLMQ_STATUS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

enum llmq_status {
    LLMQ_OK = 0,
    LLMQ_ERR_IO,          // open/read/write/mmap/rename failed (errno text in the message)
    LLMQ_ERR_NOMEM,       // allocation failed
    LLMQ_ERR_ARG,         // bad argument from the caller / user (flag, path kind, value)
    LLMQ_ERR_MAGIC,       // the file is not of the expected format at all
    LLMQ_ERR_VERSION,     // a version of the format we do not read
    LLMQ_ERR_TRUNCATED,   // a count, length or offset points past the end of the file
    LLMQ_ERR_CORRUPT,     // malformed structure: bad JSON, bad UTF-8, bad alignment, overlap, gaps
    LLMQ_ERR_OVERFLOW,    // a shape / size product or a count overflows or exceeds a hard limit
    LLMQ_ERR_DUPLICATE,   // duplicate tensor name or metadata key
    LLMQ_ERR_UNSUPPORTED, // well-formed but not supported: unknown dtype/type, n_dims > 4, arch
    LLMQ_ERR_NOT_FOUND,   // a named tensor / key / file that should exist does not
    LLMQ_ERR_NUMERIC,     // NaN / Inf or a failed factorisation in the numbers
    LLMQ_ERR_DEVICE,      // no usable compute device for the requested backend
    LLMQ_STATUS_COUNT
};

// Stable lower-case name of a status ("truncated", "corrupt", ...), for logs, tests and --json.
const char *llmq_status_name(enum llmq_status st);

// Log "error: <message>" on stderr (unless silenced) and store the message as this thread's last
// error. Returns st, so that `return llmq_errorf(LLMQ_ERR_IO, "%s: ...", path);` reads naturally.
enum llmq_status llmq_errorf(enum llmq_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// The last message recorded by llmq_errorf on this thread ("" if none) and its status.
const char *llmq_last_error(void);
enum llmq_status llmq_last_status(void);
void llmq_clear_error(void);

#define LLMQ_ASSERT(x)                                                                                                 \
    do {                                                                                                               \
        if (!(x)) {                                                                                                    \
            fprintf(stderr, "llmq: %s:%d: assertion failed: %s\n", __FILE__, __LINE__, #x);                            \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

#endif // LLMQ_STATUS_H
