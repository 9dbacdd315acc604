// tests/unit/test_backend.c — backend selection (with or without a device) and the status names.
#include "harness.h"

#include "common/status.h"
#include "kernels/backend.h"

int main(void) {
    enum llmq_backend b;
    CHECK(llmq_backend_select("cpu", &b) == LLMQ_OK && b == LLMQ_BACKEND_CPU);
    CHECK(llmq_backend_select("auto", &b) == LLMQ_OK);
    CHECK(llmq_backend_select("tpu", &b) == LLMQ_ERR_ARG);
    CHECK_CONTAINS(llmq_last_error(), "tpu");
    if (llmq_cuda_device_count(NULL) == 0) {
        CHECK(llmq_backend_select("cuda", &b) == LLMQ_ERR_DEVICE);
        CHECK_CONTAINS(llmq_last_error(), "--device cuda: no CUDA device");
    }
    for (int s = 0; s < LLMQ_STATUS_COUNT; s++) CHECK(strcmp(llmq_status_name((enum llmq_status)s), "unknown") != 0);
    CHECK(strcmp(llmq_status_name(LLMQ_ERR_TRUNCATED), "truncated") == 0);
    return 0;
}
