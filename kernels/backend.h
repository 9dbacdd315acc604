/*
 * kernels/backend.h — compute backend dispatch (cpu | cuda).
 *
 * Every operation in kernels/ has one dispatch signature taking an enum llmq_backend; the CPU
 * implementation is the reference and always present, the CUDA one exists when llmq was built with
 * CUDA (LLMQ_HAVE_CUDA) and a device is present at run time. kernels/ depends only on common/.
 */
#ifndef LLMQ_BACKEND_H
#define LLMQ_BACKEND_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>

enum llmq_backend {
    LLMQ_BACKEND_CPU = 0,
    LLMQ_BACKEND_CUDA,
};

struct llmq_device_info {
    int index;
    char name[256];
    size_t total_mem; // bytes
    size_t free_mem;  // bytes
    int cc_major, cc_minor;
    int sm_count;
};

// True if this binary contains the CUDA backend.
bool llmq_backend_cuda_compiled(void);

// Number of usable CUDA devices (0 when CUDA is not compiled in, no driver, or no device).
// *why (optional) receives a static string explaining a zero count in the machine's terms ("this llmq was
// built without CUDA ...", "no NVIDIA driver is loaded on this machine (cudaGetDeviceCount: ...)", "the
// NVIDIA driver sees no GPU ...", an older driver with both versions); valid until the next call.
int llmq_cuda_device_count(const char **why);
enum llmq_status llmq_cuda_device_info(int index, struct llmq_device_info *out);

// Parses "auto" | "cpu" | "cuda". "auto" picks cuda when a device is present. "cuda" without a
// device is an LLMQ_ERR_DEVICE error with the reason.
enum llmq_status llmq_backend_select(const char *name, enum llmq_backend *out);
const char *llmq_backend_name(enum llmq_backend b);

#endif // LLMQ_BACKEND_H
