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
    const char *why = NULL;
    if (llmq_cuda_device_count(&why) == 0) {
        CHECK(llmq_backend_select("cuda", &b) == LLMQ_ERR_DEVICE);
        CHECK_CONTAINS(llmq_last_error(), "--device cuda: no CUDA device found: ");
        // the reason says what the machine lacks, not the runtime's "driver version is insufficient" alone
        CHECK(why && strncmp(why, "CUDA driver version", 19) != 0);
        if (llmq_backend_cuda_compiled())
            CHECK(strstr(why, "NVIDIA driver") || strstr(why, "cudaGetDeviceCount"));
        else
            CHECK_CONTAINS(why, "built without CUDA");
    }
    for (int s = 0; s < LLMQ_STATUS_COUNT; s++) CHECK(strcmp(llmq_status_name((enum llmq_status)s), "unknown") != 0);
    CHECK(strcmp(llmq_status_name(LLMQ_ERR_TRUNCATED), "truncated") == 0);
    return 0;
}
